/* passes/strip_locations.c — the "strip-locations" pass: every op's
 * location becomes "".
 *
 * Locations tie ops to spec fields (JSON pointers); tests that compare IR
 * built from different sources, and users who want short dumps, drop them.
 * It is also the smallest complete example of a pass: a run function, no
 * options, and an entry in passes/registry.c.
 */
#include "passes/pass.h"

static xm_status_t strip_run(xm_ir_module_t *m, const xm_pass_options_t *options, xm_diag_t *diag,
                             bool *out_changed) {
  (void)options;
  (void)diag;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->loc[0]) {
      op->loc = ""; /* a static empty string: locs are never freed one by one */
      *out_changed = true;
    }
  }
  return XM_OK;
}

const xm_pass_info_t xm_pass_strip_locations = {
    .name = "strip-locations",
    .summary = "set every op location to \"\"",
    .option_names = NULL,
    .run = strip_run,
};
