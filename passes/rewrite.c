/* passes/rewrite.c — dead-op elimination and option helpers for passes.
 *
 * The module is a flat array in topological order, so one backward sweep
 * finds every dead op: by the time the sweep reaches a producer, all of its
 * users have been visited and, if dead, have already given back their uses.
 * The sweep counts uses in a scratch array indexed by value id instead of
 * touching the values, because xm_ir_module_remove_ops releases the removed
 * ops' operand uses itself.
 */
#include "passes/rewrite.h"

#include <stdlib.h>
#include <string.h>

static bool op_is_dead(const xm_ir_op_t *op, const int *uses) {
  if (xm_ir_opinfo(op->code)->flags & XM_OPF_ROOT) return false;
  for (int r = 0; r < op->num_results; r++)
    if (uses[op->results[r]->id] > 0) return false;
  return true;
}

xm_status_t xm_rewrite_dce(xm_ir_module_t *m, bool *out_changed) {
  int n = xm_ir_module_num_ops(m);
  int nv = xm_ir_module_num_values(m);
  if (n == 0) return XM_OK;
  int *uses = calloc((size_t)(nv ? nv : 1), sizeof *uses);
  bool *remove = calloc((size_t)n, sizeof *remove);
  if (!uses || !remove) {
    free(uses);
    free(remove);
    return XM_ERR_NO_MEMORY;
  }
  for (int i = 0; i < n; i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    for (int r = 0; r < op->num_results; r++)
      uses[op->results[r]->id] = op->results[r]->num_uses;
  }
  int removed = 0;
  for (int i = n - 1; i >= 0; i--) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (!op_is_dead(op, uses)) continue;
    remove[i] = true;
    removed++;
    for (int j = 0; j < op->num_operands; j++)
      uses[op->operands[j]->id]--;
  }
  if (removed) {
    xm_ir_module_remove_ops(m, remove);
    *out_changed = true;
  }
  free(uses);
  free(remove);
  return XM_OK;
}

xm_status_t xm_pass_option_bool(const xm_pass_options_t *o, const char *key, bool dflt,
                                xm_diag_t *diag, bool *out_value) {
  const char *v = xm_pass_option(o, key);
  if (!v) {
    *out_value = dflt;
    return XM_OK;
  }
  if (strcmp(v, "true") == 0 || strcmp(v, "false") == 0) {
    *out_value = v[0] == 't';
    return XM_OK;
  }
  xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL, "option '%s' must be true or false, not '%s'", key,
              v);
  return XM_ERR_INVALID_INPUT;
}
