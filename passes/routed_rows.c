/* passes/routed_rows.c — which run-time row count each routed buffer has,
 * recorded in the IR (docs/design.md, Code generation targets).
 *
 * A buffer whose dim 0 is dynamic holds routed rows: the memory plan
 * reserves its bound, the kernels touch only the rows present. How many
 * there are is known at run time from one source: a permute (its indices
 * and bin_ids; the host learns the count from the host_read of its
 * tokens_per_expert), an all_to_all or an rbd_dispatch (the rows they
 * return). Every other op's dynamic result has the rows of its first
 * operand that has routed rows. The pass numbers the sources and writes:
 *
 *   attr rows_id = k   on each source op (permute, all_to_all, rbd_dispatch);
 *   attr rows_of = k   on every other op with a dynamic dim-0 result: those
 *                      results have the rows of source k.
 *
 * The code generator names the count n_<k> and `xmoec inspect` takes the
 * expected rows of a buffer from its source, both from these attributes,
 * so neither applies the propagation rule of its own. An op whose dynamic
 * result has no routed operand is an error (its count would be unknown).
 * The module records the number of sources (attr routed_sources).
 */
#include <stdlib.h>

#include "passes/pass.h"

static bool dyn0(const xm_ir_value_t *v) { return v->type.rank > 0 && v->type.dynamic[0]; }

static bool is_source(xm_ir_opcode_t code) {
  return code == XM_OP_PERMUTE || code == XM_OP_ALL_TO_ALL || code == XM_OP_RBD_DISPATCH;
}

static xm_status_t routed_rows_run(xm_ir_module_t *m, const xm_pass_options_t *options,
                                   xm_diag_t *diag, bool *out_changed) {
  (void)options;
  int nv = xm_ir_module_num_values(m);
  int *src = malloc(((size_t)nv + 1) * sizeof *src);
  if (!src) return XM_ERR_NO_MEMORY;
  for (int i = 0; i < nv; i++)
    src[i] = -1;
  int64_t k = 0;
  xm_status_t st = XM_OK;
  for (int i = 0; i < xm_ir_module_num_ops(m) && st == XM_OK; i++) {
    xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (is_source(op->code) && op->num_results > 0) {
      xm_ir_op_set_int(m, op, "rows_id", k);
      /* permute: indices and bin_ids; all_to_all, rbd_dispatch: the rows */
      int routed = op->code == XM_OP_PERMUTE ? 2 : 1;
      for (int r = 0; r < routed && r < op->num_results; r++)
        src[op->results[r]->id] = (int)k;
      k++;
      continue;
    }
    int from = -1;
    for (int j = 0; j < op->num_operands && from < 0; j++)
      if (dyn0(op->operands[j])) from = src[op->operands[j]->id];
    bool any = false;
    for (int r = 0; r < op->num_results; r++)
      if (dyn0(op->results[r])) {
        src[op->results[r]->id] = from;
        any = true;
      }
    if (!any) continue;
    if (from < 0) {
      xm_diag_add(diag, XM_DIAG_ERROR, op->loc[0] ? op->loc : NULL, NULL,
                  "routed-rows: op %d %s has a result with dynamic rows but no operand with "
                  "routed rows, so its row count is unknown at run time",
                  i, xm_ir_opinfo(op->code)->name);
      st = XM_ERR_INVALID_INPUT;
      break;
    }
    xm_ir_op_set_int(m, op, "rows_of", from);
  }
  free(src);
  if (st != XM_OK) return st;
  xm_ir_module_set_int(m, "routed_sources", k);
  *out_changed = k > 0;
  return XM_OK;
}

const xm_pass_info_t xm_pass_routed_rows = {
    .name = "routed-rows",
    .summary = "number the sources of run-time row counts (permute, all_to_all, rbd_dispatch) "
               "and record on every op with dynamic rows which one it has",
    .option_names = NULL,
    .run = routed_rows_run,
};
