/* fabric/platform.h — internal to fabric/: the shapes that the topology,
 * its bill of materials and the SimGrid platform of the flow engine share
 * (docs/fabric.md), and the platform writer.
 *
 * Hosts of the platform are numbered: world ranks [0, P) ("r<i>", for
 * flows inside a node), servers [P, P+N) ("s<j>", the electrical network)
 * and, for regional-ocs, the servers' optical sides [P+N, P+2N) ("o<j>",
 * the circuits). Circuit links are numbered by the caller, one per server
 * pair that holds a circuit in some phase ("c<k>"); their bandwidth is set
 * per phase.
 */
#ifndef XM_FABRIC_PLATFORM_H
#define XM_FABRIC_PLATFORM_H

#include <stdint.h>
#include <stdio.h>

#include "fabric/topology.h"
#include "support/status.h"

/* fat-tree-oversubscribed: servers under one leaf switch. */
int64_t xm_fab_leaf_servers(const xm_fab_topo_t *t);
/* fat-tree-oversubscribed: uplink capacity of one leaf, bytes/s. */
double xm_fab_leaf_uplink_bw(const xm_fab_topo_t *t);
/* dragonfly: global links between two groups (0 with one group). */
int64_t xm_fab_df_pair_links(const xm_fab_topo_t *t);
/* regional-ocs: the region of a server. */
static inline int64_t xm_fab_region_of(const xm_fab_topo_t *t, int64_t server) {
  return t->region_servers > 0 ? server / t->region_servers : 0;
}
/* Electrical NIC capacity of one server, bytes/s. */
double xm_fab_server_elec_bw(const xm_fab_topo_t *t);

/* Writes the SimGrid platform XML of `t` to `f`: circuit link k joins
 * servers circ_a[k] and circ_b[k] (of one region). XM_ERR_IO when the
 * stream fails, XM_ERR_NO_MEMORY. */
xm_status_t xm_fab_platform_write(FILE *f, const xm_fab_topo_t *t, const int64_t *circ_a,
                                  const int64_t *circ_b, int64_t num_circ);

#endif /* XM_FABRIC_PLATFORM_H */
