/* planner/cost.h — the per-rank cost model of one training configuration:
 * memory by category, time per step by phase, bytes on the wire.
 *
 * A configuration is a parallel layout (frontend/layout.h) plus the knobs
 * the planner searches (recompute policy, micro-batch) and the dispatch
 * mechanism of a policy, so the same model can be costed the way xmoec,
 * X-MoE, DeepSpeed-MoE, Tutel or DeepSpeed-TED would run it. Everything is
 * analytic (no graph is built), fast enough to evaluate every candidate of
 * a 1024-rank search in well under a second. The formulas, the overlap
 * assumptions and the fixed overhead are in docs/cost-model.md; the network
 * part is planner/network.h.
 */
#ifndef XM_PLANNER_COST_H
#define XM_PLANNER_COST_H

#include <stdbool.h>
#include <stdint.h>

#include "support/rbd_copies.h"
#include "frontend/layout.h"
#include "frontend/spec.h"
#include "planner/network.h"
#include "support/status.h"

typedef enum {
  XM_POLICY_XMOEC,         /* everything xmoec has: PFT, RBD, SSMB, ZeRO-1, any mix */
  XM_POLICY_XMOE,          /* X-MoE: PFT + RBD + SSMB (no RBD with several local experts) */
  XM_POLICY_DEEPSPEED_MOE, /* capacity-padded dispatch with [T,E,C] masks + einsum, flat a2a */
  XM_POLICY_TUTEL,         /* capacity-padded buffers without the masks, flat a2a */
  XM_POLICY_DEEPSPEED_TED, /* expert tensor parallelism; duplicate tokens dropped across TP */
  XM_POLICY_COUNT
} xm_policy_t;

/* "xmoec", "x-moe", "deepspeed-moe", "tutel", "deepspeed-ted". */
const char *xm_policy_name(xm_policy_t p);
bool xm_policy_from_name(const char *name, xm_policy_t *out);

/* The recompute policy is the spec's xm_recompute_t (frontend/spec.h,
 * /training/recompute): a second enum of the same name would not compile
 * next to it. The planner's names for its values:
 *   XM_RECOMPUTE_NONE  every activation the backward needs is kept;
 *   XM_RECOMPUTE_MOE   the expert FFN's intermediate activations are
 *                      recomputed (the spec's "selective");
 *   XM_RECOMPUTE_FULL  only each layer's input is kept; the layer is
 *                      recomputed in the backward. */
#define XM_RECOMPUTE_MOE XM_RECOMPUTE_SELECTIVE
#define XM_RECOMPUTE_COUNT 3

const char *xm_recompute_name(xm_recompute_t r); /* "none", "moe", "full" */

/* The routing the communication cost assumes. */
typedef struct {
  bool given; /* false: uniform routing (expected values) */
  /* When given, per MoE layer and micro-batch, summed over the EP group's
   * ranks: slots whose expert lives on another rank of the same node /
   * on another node, and (RBD) pilot rows that cross nodes. */
  double slots_intra, slots_inter, pilots_inter;
  /* RBD rows that stay inside a node (pilots to another rank of the
   * source's node, and replicas), same units; 0 or less: unknown, the
   * expected value under uniform routing is used. The capacity-padded policies send
   * their whole buffers whatever the routing. */
  double rbd_rows_intra;
  /* A measured routing that carries over to every layout (planner/routing.h:
   * a histogram or an out/train --log of an RBD run); NULL: none. It scales
   * the padding-free dispatch's time and the expert compute by the busiest
   * EP rank's imbalance, refuses an xmoec point whose receive buffers
   * cannot hold it, and replaces the uniform RBD copies (unless `given`
   * fixes the rows); docs/cost-model.md, "Measured routing". */
  const struct xm_routing *measured;
} xm_cost_routing_t;

typedef struct {
  xm_layout_t layout;
  xm_recompute_t recompute;
  int64_t micro_batch; /* sequences per rank per micro-step */
  xm_policy_t policy;
  /* xmoec: the expert all-to-all receive buffers hold min(ep, this) times
   * the rows a rank sends (xmoec compile --dispatch-bound); 0 means the
   * default, 4. */
  int64_t dispatch_bound;
} xm_cost_point_t;

typedef struct {
  /* memory per rank, bytes */
  double weights, grads, optimizer, activations, buffers, overhead, total;
  double device; /* device memory, bytes */
  bool fits;
  double shortfall; /* total - device when it does not fit, else 0 */
  /* time per optimizer step, seconds (docs/cost-model.md says what overlaps) */
  double t_compute;   /* forward + backward (+ recompute) GEMMs and attention */
  double t_dispatch;  /* expert all-to-alls: dispatch and combine, forward and backward */
  double t_tp;        /* tensor-parallel and SSMB collectives */
  double t_dp;        /* gradient reduction, ZeRO-1 gathers */
  double t_optimizer; /* the optimizer step (memory bound) */
  double t_step;
  /* The last micro-batch's backward: the gradient reduction hides behind
   * it up to this long (t_dp holds what is left of it, and the gathers). */
  double t_overlap_window;
  /* throughput */
  int64_t grad_accum; /* micro-steps per optimizer step */
  double tokens_per_step;
  double flops_per_device;  /* model FLOPs per step per device (no recompute) */
  double tflops_per_device; /* flops_per_device / t_step / 1e12 */
  double mfu;               /* tflops_per_device / peak */
  /* bytes on the wire per optimizer step, all ranks together */
  double bytes_dispatch_intra, bytes_dispatch_inter; /* dispatch + combine, fwd + bwd */
  double bytes_all_reduce_intra, bytes_all_reduce_inter;
  double bytes_all_gather_intra, bytes_all_gather_inter;
  double bytes_reduce_scatter_intra, bytes_reduce_scatter_inter;
} xm_cost_t;

/* The fixed memory per device the model adds to what the memory plan holds:
 * runtime context, kernels, BLAS and collective-library workspaces
 * (docs/cost-model.md, Constants). `xmoec compile` adds the same when it
 * checks a program against the device. */
#define XM_COST_FIXED_OVERHEAD_BYTES (1024.0 * 1024.0 * 1024.0)

/* Costs one configuration of a spec on a cluster. The layout must be legal
 * for the spec (xm_layout_check) and its world must fit the cluster; the
 * cost model itself only refuses what it cannot cost (XM_ERR_INVALID_INPUT
 * with a message). `routing` may be NULL (uniform). */
xm_status_t xm_cost_evaluate(const xm_spec_t *spec, const xm_net_t *net, double device_bytes,
                             double peak_flops, double gemm_efficiency,
                             const xm_cost_point_t *point, const xm_cost_routing_t *routing,
                             xm_diag_t *diag, xm_cost_t *out);

/* Every collective of one optimizer step as the cost model counts it, for
 * the network layer (fabric/) to time on a topology. */
typedef enum {
  XM_COST_COMM_DISPATCH, /* t_dispatch: the expert all-to-alls */
  XM_COST_COMM_TP,       /* t_tp: tensor-parallel and SSMB / TED collectives */
  XM_COST_COMM_REDUCE,   /* t_dp: gradient reduction (hidden up to t_overlap_window) */
  XM_COST_COMM_GATHER,   /* t_dp: ZeRO-1 parameter gathers (exposed) */
  XM_COST_COMM_COUNT_
} xm_cost_comm_t;

typedef struct {
  xm_cost_comm_t category;
  const char *phase; /* the docs/traffic.md phase its bytes count in */
  bool all_to_all;   /* else a ring collective of `kind` */
  xm_net_coll_t kind;
  /* The groups it runs on, all at once: group (i, j) has the first rank
   * i * inner_step + j * outer_step (i < inner_n, j < outer_n) and `size`
   * members `stride` apart. */
  int64_t stride, size, inner_step, inner_n, outer_step, outer_n;
  double bytes;        /* ring: the bytes xm_net_ring takes */
  double intra, inter; /* all-to-all: per member, to peers of its node / of other nodes, evenly */
  double calls;        /* per optimizer step */
  double seconds;      /* the cost model's time of one call */
} xm_cost_coll_t;

typedef struct {
  xm_cost_coll_t *v;
  int64_t n, cap;
  bool oom;
} xm_cost_colls_t;

/* xm_cost_evaluate, and the collectives appended to `colls` (zeroed by the
 * caller; xm_cost_colls_free). Their calls x seconds add up to t_dispatch
 * and t_tp, and to t_dp before the overlap with the backward. */
xm_status_t xm_cost_collectives(const xm_spec_t *spec, const xm_net_t *net, double device_bytes,
                                double peak_flops, double gemm_efficiency,
                                const xm_cost_point_t *point, const xm_cost_routing_t *routing,
                                xm_diag_t *diag, xm_cost_t *out, xm_cost_colls_t *colls);
void xm_cost_colls_free(xm_cost_colls_t *colls);

/* Expected distinct nodes a token's k experts land on when they are k
 * distinct experts chosen uniformly from E spread evenly over `nodes`:
 * nodes * (1 - C(E - E/nodes, k) / C(E, k)) (docs/design.md, Redundancy-bypassing dispatch; the
 * runtime's support/rbd_copies.h, shared with the runtime). RBD sends one pilot row per such node
 * instead of k rows. */
static inline double xm_cost_rbd_expected_copies(int64_t experts, int64_t top_k, int64_t nodes) {
  return xm_rbd_expected_copies(experts, top_k, nodes);
}

/* The cluster's numbers for xm_cost_evaluate: net, device memory (bytes),
 * peak FLOP/s per device, GEMM efficiency. */
void xm_cost_cluster(const xm_cluster_spec_t *c, xm_net_t *net, double *device_bytes,
                     double *peak_flops, double *gemm_efficiency);

#endif /* XM_PLANNER_COST_H */
