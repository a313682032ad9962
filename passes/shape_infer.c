/* passes/shape_infer.c — the "shape-infer" pass: result types recomputed
 * from operands with the verifier's own rules (xm_ir_infer_types).
 *
 * Passes that change a producer's shape (sharding a dim, a dynamic token
 * count after dispatch) can leave their users' result types stale; rather
 * than each pass patching every user, they run shape-infer after. One
 * forward sweep suffices because the op array is topologically ordered: an
 * op's operands already carry their final types when it is reached. The
 * comparison ignores sharding, and an update keeps the sharding annotation
 * the result already had (sharding is decided by the planner, not derived),
 * except when the rank changed and the old annotation no longer fits.
 * Option check=true turns the pass into an assertion: any difference is an
 * error naming the op and both types, and the module is left untouched.
 */
#include <stdlib.h>

#include "ir/text.h"
#include "ir/verify.h"
#include "passes/pass.h"
#include "passes/rewrite.h"
#include "support/strbuf.h"

static void report_mismatch(const xm_ir_op_t *op, int pos, int r, const xm_ir_type_t *have,
                            const xm_ir_type_t *want, xm_diag_t *diag) {
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  xm_strbuf_printf(&b, "op %d (%s) result %d has type ", pos, xm_ir_opinfo(op->code)->name, r);
  xm_ir_print_type(have, &b);
  xm_strbuf_puts(&b, " but its operands give ");
  xm_ir_print_type(want, &b);
  xm_diag_add(diag, XM_DIAG_ERROR, NULL, op->loc[0] ? op->loc : NULL, "%s", xm_strbuf_cstr(&b));
  xm_strbuf_free(&b);
}

/* New type of a result: inferred shape, old sharding where it still fits. */
static xm_ir_type_t merged_type(const xm_ir_type_t *old, const xm_ir_type_t *inferred) {
  xm_ir_type_t t = *inferred;
  if (old->rank == inferred->rank)
    for (int d = 0; d < t.rank; d++)
      if (old->shard[d] != XM_AXIS_NONE) t.shard[d] = old->shard[d];
  return t;
}

static xm_status_t shape_infer_run(xm_ir_module_t *m, const xm_pass_options_t *options,
                                   xm_diag_t *diag, bool *out_changed) {
  bool check = false;
  XM_RETURN_IF_ERROR(xm_pass_option_bool(options, "check", false, diag, &check));
  xm_ir_type_t *types = NULL;
  int cap = 0;
  xm_status_t st = XM_OK;
  int mismatches = 0;
  for (int i = 0; i < xm_ir_module_num_ops(m) && st == XM_OK; i++) {
    xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->num_results == 0) continue;
    if (op->num_results > cap) {
      cap = op->num_results;
      free(types);
      types = calloc((size_t)cap, sizeof *types);
      if (!types) return XM_ERR_NO_MEMORY;
    }
    const xm_ir_opinfo_t *info = xm_ir_opinfo(op->code);
    if ((info->num_operands >= 0 && op->num_operands != info->num_operands) ||
        (info->num_results >= 0 && op->num_results != info->num_results)) {
      xm_diag_add(diag, XM_DIAG_ERROR, NULL, op->loc[0] ? op->loc : NULL,
                  "op %d (%s) has %d operands and %d results; ir/ops.def says %d and %d", i,
                  info->name, op->num_operands, op->num_results, info->num_operands,
                  info->num_results);
      st = XM_ERR_INVALID_INPUT;
      break;
    }
    st = xm_ir_infer_types(op, diag, types);
    for (int r = 0; st == XM_OK && r < op->num_results; r++) {
      xm_ir_type_t *have = &op->results[r]->type;
      if (xm_ir_type_equal(have, &types[r])) continue;
      if (check) {
        report_mismatch(op, i, r, have, &types[r], diag);
        mismatches++;
        continue;
      }
      *have = merged_type(have, &types[r]);
      *out_changed = true;
    }
  }
  free(types);
  if (st == XM_OK && mismatches) st = XM_ERR_INVALID_INPUT;
  return st;
}

static const char *const k_options[] = {"check", NULL};

const xm_pass_info_t xm_pass_shape_infer = {
    .name = "shape-infer",
    .summary = "recompute result types from operands (check=true: fail on a difference)",
    .option_names = k_options,
    .run = shape_infer_run,
};
