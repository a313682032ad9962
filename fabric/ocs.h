/* fabric/ocs.h — mFabric's regional controller: which server pairs get
 * optical circuits, and when a region reconfigures (docs/fabric.md).
 *
 * A regional-ocs topology (fabric/topology.h) cuts the servers into
 * consecutive regions of region_servers (the last one may be shorter);
 * every server has ocs_ports ports on its region's optical circuit
 * switching, and a circuit joins one port of each of two servers of one
 * region and carries link_bw in each direction. Circuits are planned from
 * a server demand matrix (fabric/collective.h, xm_fab_server_demand),
 * region by region, with one greedy rule:
 *
 *   every pair a < b of a region weighs w = d(a,b) + d(b,a); the next
 *   circuit goes to the pair whose demand per circuit, counting the new
 *   one, w / (c + 1) with c the circuits it has, is the largest, as long
 *   as both ends have a free OCS port; ties go to the smaller (a, b). A
 *   pair may so get several circuits when its demand is several times that
 *   of the next pair; a pair with no demand gets none. It stops when no
 *   pair with demand has two free ends.
 *
 * The ports of a region are taken to form one circuit switch that can join
 * any two of them (ocs_switch_ports sizes and prices the switches, it does
 * not restrict the pairs), so the only budget is ocs_ports per server.
 *
 * Ownership: arrays returned through out_* are the caller's (free()); the
 * circuits a plan puts in a phase are the phase's (xm_fab_phase_free).
 */
#ifndef XM_FABRIC_OCS_H
#define XM_FABRIC_OCS_H

#include <stdbool.h>
#include <stdint.h>

#include "fabric/flow.h"
#include "fabric/topology.h"
#include "support/status.h"

/* Region of server s (s / region_servers). */
static inline int64_t xm_fab_ocs_region(const xm_fab_topo_t *t, int64_t s) {
  return s / t->region_servers;
}

/* The circuits of `demand` (t->servers x t->servers, row-major, bytes
 * server s sends server d at [s * servers + d]; the diagonal is ignored)
 * by the rule above, sorted by (a, b), a < b, count >= 1. XM_ERR_INVALID_INPUT
 * when t is not a regional-ocs topology with servers, region_servers >= 1
 * and 0 <= ocs_ports <= nic_ports, or demand has a negative or non-finite
 * entry; XM_ERR_NO_MEMORY. */
xm_status_t xm_fab_ocs_assign(const xm_fab_topo_t *t, const double *demand,
                              xm_fab_circuit_t **out_circuits, int64_t *out_num);

/* Whether region `region` has different circuits in the two sets (each
 * sorted by (a, b) as xm_fab_ocs_assign returns them). */
bool xm_fab_ocs_region_changed(const xm_fab_topo_t *t, const xm_fab_circuit_t *x, int64_t nx,
                               const xm_fab_circuit_t *y, int64_t ny, int64_t region);

/* Plans the circuits of a sequence of phases (one training iteration in
 * order) and sets each phase's circuits and reconfigure flag:
 *
 *   t->reconfig_per_layer false: one assignment from the demand of all the
 *     phases together, in force for every phase;
 *   t->reconfig_per_layer true: one assignment per layer value, from the
 *     demand of the phases of that layer (forward and backward alike, whose
 *     symmetric demand is the same); the phases of no layer (-1: gradient
 *     reductions, ZeRO gathers) share one assignment from theirs.
 *
 * A phase reconfigures when its set differs from the one in force before
 * it: the previous phase's, or for the first phase `before` (num_before
 * circuits, sorted; NULL and 0 for no circuits; not an array one of the
 * phases owns, which the plan replaces). Passing the last phase's
 * set of the previous iteration gives the steady state of a loop of equal
 * iterations. Any circuits the phases had are replaced. For a topology of
 * another kind every phase is left with no circuits and no reconfiguration.
 * Errors as xm_fab_ocs_assign, and XM_ERR_INVALID_INPUT for a flow outside
 * the servers. */
xm_status_t xm_fab_ocs_plan(const xm_fab_topo_t *t, xm_fab_phase_t *phases, int64_t num_phases,
                            const xm_fab_circuit_t *before, int64_t num_before);

#endif /* XM_FABRIC_OCS_H */
