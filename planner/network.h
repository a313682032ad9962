/* planner/network.h — the network layer of the cost model: a hierarchical
 * topology (nodes of ranks; one link class inside a node, one between
 * nodes) and the time and bytes of each collective on it.
 *
 * Time is the network layer's closed form for a non-blocking fat-tree
 * (fabric/analytic.h): the family functions below, which the cost model
 * uses, give what `xmoec fabric` gives on that topology; other topologies
 * (oversubscription, dragonfly, regional optical circuits) are timed by
 * fabric/ from the cost model's list of collectives. The byte
 * model of each collective is the one the runtime counts
 * (docs/traffic.md: ring all-reduce / all-gather / reduce-scatter in group
 * order, direct all-to-all), so predicted bytes on the wire can be
 * compared exactly with the traffic a run logs. Formulas: docs/cost-model.md.
 */
#ifndef XM_PLANNER_NETWORK_H
#define XM_PLANNER_NETWORK_H

#include <stdint.h>

#include "frontend/spec.h"

typedef struct {
  int64_t nodes, ranks_per_node;
  double intra_bw, inter_bw;   /* bytes/s per rank, one direction */
  double intra_lat, inter_lat; /* seconds per message */
} xm_net_t;

/* From a cluster spec (GB/s -> bytes/s, us -> s). */
void xm_net_from_cluster(const xm_cluster_spec_t *c, xm_net_t *out);

/* A group of world ranks: first, first + stride, ..., (size members);
 * the same progressions as frontend/layout.h's groups. */
typedef struct {
  int64_t first, stride, size;
} xm_net_group_t;

typedef enum {
  XM_NET_ALL_REDUCE,     /* bytes: the buffer every member holds */
  XM_NET_ALL_GATHER,     /* bytes: what each member contributes */
  XM_NET_REDUCE_SCATTER, /* bytes: the slice each member keeps */
  /* ZeRO-1's halves of the ring (runtime/comm/spmd.h), whose chunks are
   * ceil(n/P) elements (the last ones short or empty) instead of the
   * all-reduce's near-equal ones; bytes: the whole buffer (n elements). */
  XM_NET_ZERO_REDUCE_SCATTER, /* gradient -> this member's chunk */
  XM_NET_ZERO_ALL_GATHER,     /* every member's chunk -> the whole parameter */
} xm_net_coll_t;

/* Cost of one collective, seen from the slowest member. Bytes are exact
 * (equal to what the runtime's traffic counters log) when the byte count is
 * a whole number: 4-byte elements when it is a multiple of 4. */
typedef struct {
  double seconds;
  double intra_bytes; /* sent by all members together to peers on their node */
  double inter_bytes; /* sent by all members together to other nodes */
} xm_net_cost_t;

/* A ring collective over group g (ring neighbours by group index). */
xm_net_cost_t xm_net_ring(const xm_net_t *n, xm_net_coll_t kind, xm_net_group_t g, double bytes);

/* What member i of g sends in that ring collective, split by the node of
 * its two neighbours (half to the successor, the odd byte to the
 * predecessor; with two members all to the one peer), exactly as the
 * runtime counts it. Zero when the size is not an integral byte count. */
void xm_net_ring_member(const xm_net_t *n, xm_net_coll_t kind, xm_net_group_t g, double bytes,
                        int64_t i, double *out_intra, double *out_inter);

/* An all-to-all over g in which every member sends `intra` bytes in total
 * to the members on its node and `inter` bytes in total to members on
 * other nodes (an even spread over those peers). */
xm_net_cost_t xm_net_all_to_all(const xm_net_t *n, xm_net_group_t g, double intra, double inter);

/* Every group of one kind at once: group (i, j) has the first rank
 * i * inner_step + j * outer_step (i < inner_n, j < outer_n) and `size`
 * members `stride` apart; the groups tile the world. */
typedef struct {
  int64_t stride, size, inner_step, inner_n, outer_step, outer_n;
} xm_net_family_t;

/* The time of a collective that every group of family f runs at once, on
 * nodes that pool their NICs (ranks_per_node * inter_bw each way) behind a
 * non-blocking fabric: the busiest rank's bytes to and from peers of its
 * node over intra_bw, or the busiest node's bytes to and from other nodes
 * over its NICs, whichever is longer (different links carry them), plus
 * one latency per round (inter_lat when some group crosses nodes). This is
 * the non-blocking fat-tree's closed form of the network layer
 * (fabric/analytic.h), so that the planner and `xmoec fabric` give the
 * same time; tests/unit/test_plan_fabric.c holds them equal.
 *
 * Ring: every member sending the kind's mean bytes (2 (P-1)/P of the
 * buffer for an all-reduce, ...), half to each neighbour; the loads are
 * found member by member, O(ranks), once per family shape (a small cache
 * per thread), and scale with the bytes. The network layer counts the
 * runtime's exact chunks, so the two differ by a few bytes per member
 * (below 1e-6 of any buffer a plan reduces). All-to-all: every member
 * sends `intra` bytes spread evenly over the peers of its node and `inter`
 * over the others, P - 1 rounds. */
double xm_net_ring_family_seconds(const xm_net_t *n, xm_net_coll_t kind, const xm_net_family_t *f,
                                  double bytes);
double xm_net_a2a_family_seconds(const xm_net_t *n, const xm_net_family_t *f, double intra,
                                 double inter);

/* Members of g on the node of member 0, and the nodes g touches. */
int64_t xm_net_group_members_per_node(const xm_net_t *n, xm_net_group_t g);
int64_t xm_net_group_nodes(const xm_net_t *n, xm_net_group_t g);

/* Ordered pairs (i, j), i != j, of members of g on the same node: the
 * all-to-all peers that stay inside a node, summed over the members. */
double xm_net_group_same_node_pairs(const xm_net_t *n, xm_net_group_t g);

#endif /* XM_PLANNER_NETWORK_H */
