/* planner/plan.h — the parallelism planner: every legal configuration of
 * a spec on a cluster, costed (planner/cost.h), the ones that do not fit
 * rejected with the reason, the rest ranked by predicted step time; and the
 * largest model of a family each policy can train.
 *
 * A policy restricts the search to what that system can express
 * (DeepSpeed-MoE: no SSMB, no RBD, capacity-padded dispatch; X-MoE: no RBD
 * with several local experts ...; docs/plan-json.md has the table), so
 * `xmoec plan --policy` compares systems on the same model and machines.
 * Output formats: `xmoec plan` (tools/xmoec/cmd_plan.c), --json documented
 * in docs/plan-json.md.
 */
#ifndef XM_PLANNER_PLAN_H
#define XM_PLANNER_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "planner/cost.h"
#include "support/diag.h"

typedef struct {
  xm_cost_point_t point;
  xm_cost_t cost;
  bool legal;       /* the layout is legal for the spec */
  char reason[192]; /* why it was rejected (illegal or does not fit); "" */
} xm_plan_candidate_t;

typedef struct {
  xm_plan_candidate_t *cands; /* owned; legal ones that fit first, by step time */
  int64_t num, num_legal, num_fit;
  int64_t chosen; /* index of the best candidate that fits; -1 if none fits
                     (then cands[0] is the one with the smallest shortfall) */
  xm_policy_t policy;
  int64_t world;  /* nodes * ranks_per_node */
  bool trainable; /* false: the compiler cannot build the model whatever the
                     layout (xm_spec_trainable; no such model today); the plan
                     is then a prediction */
} xm_plan_result_t;

/* The micro-batches the search tries for data-parallel degree dp: the
 * divisors of global_batch / dp up to this bound (docs/plan-json.md). */
#define XM_PLAN_MAX_MICRO_BATCH 64

/* What one search covers (xm_plan_search uses the defaults). */
typedef struct {
  xm_policy_t policy;
  unsigned recompute_mask;          /* bit 1u << r per recompute policy allowed;
                                       0: every one the policy has */
  const xm_cost_routing_t *routing; /* NULL: uniform routing */
  int64_t dispatch_bound;           /* xm_cost_point_t's; 0: the default (4) */
} xm_plan_options_t;

/* Enumerates (dp, tp, ep, ssmb, rbd, zero, recompute, micro_batch) for the
 * world size of the cluster (nodes * ranks_per_node) under `policy`. A spec
 * without a cluster is XM_ERR_INVALID_INPUT (reported at /cluster). On
 * success `out` owns its candidates (xm_plan_result_free). */
xm_status_t xm_plan_search(const xm_spec_t *spec, xm_policy_t policy, xm_diag_t *diag,
                           xm_plan_result_t *out);
xm_status_t xm_plan_search_with(const xm_spec_t *spec, const xm_plan_options_t *opts,
                                xm_diag_t *diag, xm_plan_result_t *out);
void xm_plan_result_free(xm_plan_result_t *r);

/* Whether `policy` can express the point's layout and recompute policy
 * (the table in docs/plan-json.md); experts is the spec's routed experts. */
bool xm_plan_policy_allows(xm_policy_t policy, int64_t experts, const xm_cost_point_t *point);

/* The model family of a spec: hidden, layers and experts scaled together
 * by a documented rule (docs/plan-json.md, "Model family"): with r =
 * cbrt(scale) the attention heads (hence hidden), the MoE layers and the
 * routed experts each grow by r, rounded to legal multiples, so the
 * parameter count grows about like `scale`; scale 1 is the spec itself.
 * XM_ERR_INVALID_INPUT for scale <= 0 or a member that fails validation. */
xm_status_t xm_plan_family_member(const xm_spec_t *base, double scale, xm_spec_t *out);

typedef struct {
  xm_policy_t policy;
  double scale;   /* largest trainable member of the family */
  int64_t params; /* its parameter count */
  xm_plan_candidate_t best;
  /* What stops it: the smallest member tried that does not fit (its scale
   * and parameters, 0 when every member up to the bound fits) and that
   * member's closest candidate (the smallest shortfall). */
  double limit_scale;
  int64_t limit_params;
  xm_plan_candidate_t limit;
} xm_plan_max_t;

/* The largest member of the family that some configuration of `policy`
 * fits on the cluster (doubling, then bisection over log(scale) to 1%).
 * scale 0 (params 0) when not even scale 2^-12 fits; then `best` is that
 * member's candidate with the smallest shortfall. */
xm_status_t xm_plan_max_model(const xm_spec_t *spec, xm_policy_t policy, xm_diag_t *diag,
                              xm_plan_max_t *out);

#endif /* XM_PLANNER_PLAN_H */
