/* ir/verify_mixed.c — the result-type rule of cast, the op of bf16 mixed
 * precision (ir/ops.def; docs/design.md, Mixed precision).
 *
 * A cast keeps the shape and changes the float dtype: its result type is
 * the op's own (as a reshape's), checked against the operand.
 */
#include "ir/verify_internal.h"

#define TT(t) (xm_ir_type_text(t).s)

static bool castable(xm_dtype_t dt) { return dt == XM_DT_F32 || dt == XM_DT_BF16; }

void xm_ir_verify_mixed_rule(xm_ir_rule_ctx_t *c, xm_ir_type_t *out) {
  const xm_ir_type_t *x = &c->op->operands[0]->type;
  if (!castable(x->dtype) || !castable(out->dtype)) {
    xm_ir_rule_error(c, "casts between f32 and bf16 only, not %s to %s", TT(x), TT(out));
    return;
  }
  bool same = out->rank == x->rank;
  for (int i = 0; same && i < x->rank; i++)
    same = out->dims[i] == x->dims[i] && out->dynamic[i] == x->dynamic[i];
  if (!same)
    xm_ir_rule_error(c, "result type %s has another shape than operand 0 %s", TT(out), TT(x));
}
