/* passes/dce.c — the "dce" pass: dead-op elimination alone.
 *
 * An op is dead when it is not a root (inputs, params, return: XM_OPF_ROOT
 * in ir/ops.def) and none of its results is used; removing it can kill its
 * producers, and the shared sweep (passes/rewrite.c) follows that to the
 * fixed point in one backward pass over the flat op array. Collectives are
 * not roots: every rank runs the same rewritten program, so dropping a dead
 * collective everywhere keeps the ranks matched.
 */
#include "passes/pass.h"
#include "passes/rewrite.h"

static xm_status_t dce_run(xm_ir_module_t *m, const xm_pass_options_t *options, xm_diag_t *diag,
                           bool *out_changed) {
  (void)options;
  (void)diag;
  return xm_rewrite_dce(m, out_changed);
}

const xm_pass_info_t xm_pass_dce = {
    .name = "dce",
    .summary = "remove ops whose results are unused (inputs, params and return stay)",
    .option_names = NULL,
    .run = dce_run,
};
