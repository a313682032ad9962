/* planner/simulate.h — one training step of a plan on a network topology:
 * the cost model's compute time, and its collectives (xm_cost_collectives)
 * timed by the network layer (fabric/) instead of the cost model's own
 * hierarchical formulas (docs/fabric.md, "A plan on a topology").
 *
 * Each collective the cost model counts becomes one phase of flows over
 * all the groups that run it side by side (every EP group's all-to-all,
 * every DP group's ring), timed once and counted as many times as the
 * step makes it. On regional-ocs the circuits are planned from the step's
 * demand (fabric/ocs.h): per iteration, one assignment from the whole
 * step's server demand, and one reconfiguration charged per step (the
 * controller follows the traffic as it drifts between steps); per layer,
 * one assignment from the layers' collectives and one from the step's
 * gradient reductions, and a reconfiguration before each MoE layer's
 * forward and backward all-to-alls of every micro-batch and one before the
 * reductions; none when no pair gets a circuit.
 *
 * The step time keeps the cost model's overlap rule: compute, then every
 * communication phase exposed, except the gradient reduction, which hides
 * behind the last micro-batch's backward up to t_overlap_window.
 */
#ifndef XM_PLANNER_SIMULATE_H
#define XM_PLANNER_SIMULATE_H

#include <stdint.h>

#include "fabric/flow.h"
#include "fabric/topology.h"
#include "fabric/traffic.h"
#include "planner/cost.h"
#include "support/diag.h"
#include "support/status.h"

typedef enum {
  XM_SIM_SIMGRID,  /* the flow-level engine (fabric/sim.h) */
  XM_SIM_ANALYTIC, /* the closed forms (fabric/analytic.h) */
} xm_sim_engine_t;

/* "simgrid" or "analytic". */
const char *xm_sim_engine_name(xm_sim_engine_t e);

/* Synthetic routing for the expert all-to-alls (fabric/traffic.h's
 * generative model: docs/traffic.md, "Synthetic traffic"): in place of the
 * cost model's uniform spread, each MoE layer's movements take the
 * pattern of one of up to 8 seeded layer patterns (layer i the pattern
 * i mod 8), with the cost model's bytes. */
typedef struct {
  double zipf;              /* expert popularity skew, >= 0 */
  double locality;          /* share of tokens routed inside one affinity group, [0, 1] */
  double source_affinity;   /* of those, the share to their server's home group, [0, 1] */
  int64_t affinity_experts; /* experts per affinity group; 0: one server's of an EP group */
  bool affinity_scattered;  /* groups of scattered expert ids */
  uint64_t seed;
} xm_sim_routing_t;

typedef struct {
  double compute_s;  /* t_compute + t_optimizer of the cost model */
  double dispatch_s; /* expert all-to-alls, per step */
  double tp_s;       /* tensor-parallel and SSMB / TED collectives */
  double reduce_s;   /* gradient reduction, before the overlap */
  double reduce_exposed_s;
  double gather_s;   /* ZeRO-1 gathers */
  double reconfig_s; /* regional-ocs: reconfiguration pauses */
  double comm_s;     /* dispatch + tp + reduce_exposed + gather + reconfig */
  double iteration_s;
  int64_t reconfigurations, circuits, phases;
  /* the same parts as the cost model gives them (planner/network.h) */
  double model_dispatch_s, model_tp_s, model_dp_s, model_step_s;
  /* bytes of the step between servers and inside them, all ranks */
  double inter_bytes, intra_bytes;
  /* How local the step's forward dispatch traffic is (fabric/traffic.h;
   * worlds up to XM_FAB_MATRIX_MAX ranks, else locality_ranks 0): shares
   * inside a server and a region, of the heaviest 5% of server pairs, and
   * the mean total-variation distance between consecutive layer patterns
   * (0 for the uniform spread). */
  int64_t locality_ranks;
  xm_fab_locality_t locality;
  double top5_pairs_share, layer_tvd;
} xm_sim_result_t;

/* Times one step of `point` for `spec` (its cluster gives the compute
 * side) on topology `t`, whose servers and ranks must be the cluster's.
 * `routing` may be NULL (uniform); `synth` NULL keeps the cost model's
 * uniform all-to-alls (xmoec's policy only otherwise). XM_ERR_INVALID_INPUT for a point the
 * cost model refuses or a topology that does not match; XM_ERR_INTERNAL
 * when the engine fails (the diag says why); XM_ERR_NO_MEMORY. */
xm_status_t xm_plan_simulate(const xm_spec_t *spec, const xm_cost_point_t *point,
                             const xm_cost_routing_t *routing, const xm_sim_routing_t *synth,
                             const xm_fab_topo_t *t, xm_sim_engine_t engine, xm_diag_t *diag,
                             xm_sim_result_t *out);

/* The same step with a run's measured traffic (`xmoec fabric --traffic`)
 * instead of the cost model's collectives: `phases` (world ranks of the
 * cluster) are timed one after the other, once each, in order; dispatch,
 * combine and other phases count as dispatch_s, the ring collectives as
 * tp_s (a traffic file does not tell a tensor-parallel all-reduce from a
 * gradient reduction, so nothing is overlapped). On regional-ocs the
 * circuits are planned over the phases (fabric/ocs.h, per iteration or
 * per layer as the topology says; the phases' circuits are replaced) and
 * the engine charges each reconfiguration in the phase it precedes. */
xm_status_t xm_plan_simulate_phases(const xm_spec_t *spec, const xm_cost_point_t *point,
                                    const xm_fab_topo_t *t, xm_sim_engine_t engine,
                                    xm_fab_phase_t *phases, int64_t n, xm_diag_t *diag,
                                    xm_sim_result_t *out);

#endif /* XM_PLANNER_SIMULATE_H */
