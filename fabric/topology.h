/* fabric/topology.h — the networks a plan can run on (docs/fabric.md).
 *
 * A cluster is `servers` nodes of `ranks_per_server` devices. Inside a
 * node every rank has its own link to the node's switch (NVLink, Infinity
 * Fabric); between nodes each server has `nic_ports` NIC ports of
 * `link_bw`, wired into one of four networks:
 *
 *   fat-tree                  a non-blocking folded Clos of switches of
 *                             `switch_radix` ports: full bisection;
 *   fat-tree-oversubscribed   the same with leaf switches whose downlinks
 *                             carry `oversubscription` times their uplinks;
 *   dragonfly                 groups of routers (Frontier-like): all-to-all
 *                             local links inside a group, global links
 *                             between groups, minimal routing;
 *   regional-ocs              mFabric: consecutive regions of
 *                             `region_servers` nodes; each node spends
 *                             `ocs_ports` of its ports on its region's
 *                             optical circuit switch(es), the rest on an
 *                             electrical fat-tree. Circuits (one port at
 *                             each end) are given per iteration or per
 *                             layer to the heaviest server pairs; while a
 *                             region reconfigures (`reconfig_s`) its flows
 *                             pause.
 *
 * Bandwidths are bytes per second in one direction (links are full
 * duplex); latencies seconds.
 */
#ifndef XM_FABRIC_TOPOLOGY_H
#define XM_FABRIC_TOPOLOGY_H

#include <stdbool.h>
#include <stdint.h>

#include "frontend/spec.h"
#include "support/diag.h"
#include "support/status.h"

typedef enum {
  XM_FAB_FAT_TREE,
  XM_FAB_FAT_TREE_OVERSUB,
  XM_FAB_DRAGONFLY,
  XM_FAB_REGIONAL_OCS,
  XM_FAB_KIND_COUNT_
} xm_fab_kind_t;

/* "fat-tree", "fat-tree-oversubscribed", "dragonfly", "regional-ocs". */
const char *xm_fab_kind_name(xm_fab_kind_t k);
/* The kind of a name above; false for any other string. */
bool xm_fab_kind_parse(const char *name, xm_fab_kind_t *out);

typedef struct {
  xm_fab_kind_t kind;
  int64_t servers, ranks_per_server;
  /* inside a node, per rank */
  double intra_bw, intra_lat;
  /* server NICs and the electrical switches */
  int64_t nic_ports;
  double link_bw;  /* per port */
  double link_lat; /* per inter-node message, end to end */
  int64_t switch_radix;
  /* fat-tree-oversubscribed */
  double oversubscription;
  /* dragonfly */
  int64_t df_servers_per_router, df_routers_per_group, df_groups, df_global_links;
  /* regional-ocs */
  int64_t region_servers, ocs_ports, ocs_switch_ports;
  double reconfig_s;
  bool reconfig_per_layer;
} xm_fab_topo_t;

/* The topology of `kind` for cluster `c` (its nodes, ranks, bandwidths and
 * the network fields of docs/spec.md, 0 meaning the derived default that
 * docs/fabric.md gives). link_gbps > 0 replaces the cluster's port speed
 * (`--link-gbps`). A parameter set that cannot be built (a region larger
 * than the cluster, more OCS ports than NIC ports, a dragonfly that does
 * not hold the nodes, ...) is XM_ERR_INVALID_INPUT with a message naming
 * the cluster key. */
xm_status_t xm_fab_topo_from_cluster(const xm_cluster_spec_t *c, xm_fab_kind_t kind,
                                     double link_gbps, xm_fab_topo_t *out, xm_diag_t *diag);

/* What a topology is built of, for its price (fabric/price.h): counts over
 * the whole cluster. An optical link has a transceiver at each end and one
 * fibre; copper links inside a rack (server to leaf) have neither. */
typedef struct {
  double link_gbps;       /* speed of every port below */
  double nic_ports;       /* server NIC ports */
  double switch_ports;    /* electrical packet-switch ports in use */
  double switches;        /* electrical switches (of switch_radix ports) */
  double ocs_ports;       /* optical circuit-switch ports in use */
  double ocs_switches;    /* optical circuit switches */
  double transceivers;    /* optical transceivers */
  double fibres;          /* optical fibres / cables */
  double copper_cables;   /* direct-attach copper cables */
} xm_fab_bom_t;

void xm_fab_bom(const xm_fab_topo_t *t, xm_fab_bom_t *out);

#endif /* XM_FABRIC_TOPOLOGY_H */
