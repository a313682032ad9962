/* fabric/analytic.h — closed-form time of phases on each topology, the
 * fast path of the planner's search (docs/fabric.md).
 *
 * The network is the flow engine's (fabric/sim.h, fabric/platform.h):
 * inside a node every rank has its own link of intra_bw to the node's
 * switch; between nodes a server's flows leave and enter through its
 * electrical NIC capacity (nic_ports link_bw, less the OCS ports on
 * regional-ocs) and cross the topology's own links. A phase's time is its
 * most loaded resource's bytes over that resource's capacity, with every
 * resource busy from the start to the end of the phase:
 *
 *   inside a node            every rank's egress and ingress to ranks of
 *                            its own server, over intra_bw;
 *   every server             its egress and ingress to other servers over
 *                            its electrical NIC capacity;
 *   fat-tree                 nothing more (full bisection);
 *   fat-tree-oversubscribed  every leaf's uplinks, each way: the bytes
 *                            leaving (entering) its servers for other
 *                            leaves over the leaf's uplink capacity;
 *   dragonfly                inside a group, the local link between two
 *                            routers, each way; between groups, every
 *                            ordered pair of groups: its bytes over the
 *                            global links that join the two (minimal
 *                            routing takes a direct one). A bound: the
 *                            engine's platform bundles the global links
 *                            per router pair and routes a router's flows
 *                            to another group over one bundle, through the
 *                            local link to the router that holds it, which
 *                            the closed form does not load;
 *   regional-ocs             a server pair with c circuits sends the share
 *                            c L / (c L + E) of its bytes on them (L =
 *                            link_bw, E the electrical NIC capacity) and
 *                            the rest through the NICs, as the engine
 *                            splits it; the circuits of a pair carry c L
 *                            each way.
 *
 * The intra-node and inter-node parts overlap (the time is their max):
 * they are different links and the flows of a phase start together, as in
 * the engine. On regional-ocs a phase with `reconfigure` set pauses, for
 * reconfig_s, the inter-node flows inside every region whose circuits
 * differ from the previous phase's (the engine's rule: flows between two
 * regions and inside a node go on); a resource carrying L bytes of which
 * L_p paused then ends at max(L / C, reconfig_s + L_p / C). Last, the
 * phase adds latency_steps rounds of link_lat when some flow leaves its
 * server, of intra_lat otherwise (none when nothing moves).
 *
 * Where the most loaded resource stays saturated to the end under the
 * engine's max-min fair sharing (uniform all-to-alls, rings, incast, a
 * pair with its circuits, patterns whose busiest resource sees no tighter
 * one) this is the engine's time exactly; elsewhere it is a lower bound.
 * The cost is O(flows + circuits log circuits) per phase after an
 * O(ranks + servers) set-up per call (and the group pairs of a dragonfly).
 *
 * Ownership: nothing is kept; out_* arrays are the caller's.
 */
#ifndef XM_FABRIC_ANALYTIC_H
#define XM_FABRIC_ANALYTIC_H

#include <stdint.h>

#include "fabric/flow.h"
#include "fabric/topology.h"
#include "support/status.h"

/* The parts of one phase's time, seconds. */
typedef struct {
  double seconds;   /* max(intra_s, inter_s) + latency_s */
  double intra_s;   /* the busiest rank link inside a node */
  double inter_s;   /* the busiest NIC, leaf uplink, global link or circuit, pause included */
  double latency_s; /* latency_steps rounds */
  double pause_s;   /* reconfig_s when some region pauses, else 0 */
  double intra_bytes, inter_bytes; /* the phase's bytes inside and between servers */
  int64_t paused_regions;          /* regions that reconfigure before the phase */
} xm_fab_phase_time_t;

/* The time of phase p after phase `prev` (NULL: p is the first, after no
 * circuits). XM_ERR_INVALID_INPUT for a topology without servers, ranks
 * or bandwidths, a flow with a rank outside the servers or bytes negative
 * or not finite, or circuits the engine refuses (two nodes of different
 * regions, a count below 1, more circuits at a node than its ocs_ports);
 * XM_ERR_NO_MEMORY. Traffic without a path (no electrical port and no
 * circuit) takes +infinity. */
xm_status_t xm_fab_analytic_phase(const xm_fab_topo_t *t, const xm_fab_phase_t *p,
                                  const xm_fab_phase_t *prev, xm_fab_phase_time_t *out);

/* The phases one after the other, as xm_fab_simulate runs them:
 * out_seconds[i] (may be NULL) gets phase i's time and out_total their
 * sum. Errors as xm_fab_analytic_phase. */
xm_status_t xm_fab_analytic(const xm_fab_topo_t *t, const xm_fab_phase_t *phases,
                            int64_t num_phases, double *out_seconds, double *out_total);

#endif /* XM_FABRIC_ANALYTIC_H */
