/* passes/canonicalize.c — the "canonicalize" pass: local rewrites plus
 * dead-op elimination, repeated until nothing changes.
 *
 * Rewrites (each one removes work or a level of indirection, never adds):
 *   reshape(x) to x's exact type          -> x
 *   reshape(reshape(x))                   -> reshape(x)
 *   scale(x) {factor = 1.0}               -> x
 *   scale(scale(x) {a}) {b}               -> scale(x) {a * b}
 *   add(x, constant 0.0), add(0.0, x)     -> x, when x's type is exactly the
 *                                            result type (a broadcast zero
 *                                            still changes the shape)
 *   narrow(all_reduce(x)) {same group}    -> reduce_scatter(x), when the sum
 *                                            has no other use
 * A rewrite either forwards the uses of an op's result to an existing value
 * or re-points an operand; the op left without users goes in the DCE sweep
 * that ends every round. One forward sweep sees chains in definition order,
 * so scale(scale(scale(x))) folds in one round; the outer loop only catches
 * rewrites that a DCE enables. Option dce-only=true skips the rewrites.
 */
#include <stdbool.h>
#include <string.h>

#include "passes/pass.h"
#include "passes/rewrite.h"

/* Replaces all uses of op's single result by `v`; true when something
 * changed. Types must be identical so that no user sees another type. */
static bool forward_to(xm_ir_module_t *m, xm_ir_op_t *op, xm_ir_value_t *v) {
  xm_ir_value_t *r = op->results[0];
  if (r == v || r->num_uses == 0) return false;
  if (!xm_ir_type_identical(&r->type, &v->type)) return false;
  xm_ir_value_replace_uses(m, r, v);
  return true;
}

static bool is_zero_constant(const xm_ir_value_t *v) {
  const xm_ir_op_t *d = v->def;
  if (!d || d->code != XM_OP_CONSTANT) return false;
  const xm_ir_attr_t *a = xm_ir_op_attr(d, "value");
  if (!a) return false;
  if (a->kind == XM_ATTR_FLOAT) return a->f == 0.0;
  if (a->kind == XM_ATTR_INT) return a->i == 0;
  return false;
}

static bool rewrite_reshape(xm_ir_module_t *m, xm_ir_op_t *op) {
  xm_ir_value_t *x = op->operands[0];
  bool changed = false;
  if (x->def && x->def->code == XM_OP_RESHAPE) {
    xm_ir_op_set_operand(op, 0, x->def->operands[0]);
    x = op->operands[0];
    changed = true;
  }
  return forward_to(m, op, x) || changed;
}

static bool rewrite_scale(xm_ir_module_t *m, xm_ir_op_t *op) {
  const xm_ir_attr_t *fa = xm_ir_op_attr(op, "factor");
  if (!fa || fa->kind != XM_ATTR_FLOAT) return false;
  double factor = fa->f;
  xm_ir_value_t *x = op->operands[0];
  bool changed = false;
  const xm_ir_op_t *inner = x->def;
  if (inner && inner->code == XM_OP_SCALE) {
    const xm_ir_attr_t *ia = xm_ir_op_attr(inner, "factor");
    if (ia && ia->kind == XM_ATTR_FLOAT &&
        xm_ir_type_identical(&inner->operands[0]->type, &x->type)) {
      factor *= ia->f;
      xm_ir_op_set_float(m, op, "factor", factor);
      xm_ir_op_set_operand(op, 0, inner->operands[0]);
      x = op->operands[0];
      changed = true;
    }
  }
  if (factor == 1.0) changed = forward_to(m, op, x) || changed;
  return changed;
}

static bool rewrite_add(xm_ir_module_t *m, xm_ir_op_t *op) {
  if (is_zero_constant(op->operands[1]) && forward_to(m, op, op->operands[0])) return true;
  if (is_zero_constant(op->operands[0]) && forward_to(m, op, op->operands[1])) return true;
  return false;
}

/* narrow(all_reduce(x)) over one group, the sum used nowhere else: each
 * member keeps only its slice of the sum, which is a reduce_scatter (half
 * the bytes of the all-reduce, docs/design.md, Sequence-sharded MoE blocks). The narrow becomes the
 * reduce_scatter in place (same attrs group, group_size, dim; same result
 * type); the all-reduce dies in the DCE sweep. */
static bool rewrite_narrow(xm_ir_module_t *m, xm_ir_op_t *op) {
  (void)m;
  xm_ir_value_t *x = op->operands[0];
  const xm_ir_op_t *ar = x->def;
  if (!ar || ar->code != XM_OP_ALL_REDUCE || x->num_uses != 1) return false;
  const char *g1 = xm_ir_op_get_string(op, "group", NULL);
  const char *g2 = xm_ir_op_get_string(ar, "group", NULL);
  if (!g1 || !g2 || strcmp(g1, g2) != 0 ||
      xm_ir_op_get_int(op, "group_size", 0) != xm_ir_op_get_int(ar, "group_size", -1))
    return false;
  op->code = XM_OP_REDUCE_SCATTER;
  xm_ir_op_set_operand(op, 0, ar->operands[0]);
  return true;
}

static bool rewrite_round(xm_ir_module_t *m) {
  bool changed = false;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    xm_ir_op_t *op = xm_ir_module_op(m, i);
    /* Unverified input (opt --no-verify) may break the arity the rules
     * index by; such ops are left for the verifier to report. */
    if (op->num_results != 1 || op->results[0]->num_uses == 0 ||
        op->num_operands != xm_ir_opinfo(op->code)->num_operands)
      continue;
    switch (op->code) {
    case XM_OP_RESHAPE: changed |= rewrite_reshape(m, op); break;
    case XM_OP_SCALE: changed |= rewrite_scale(m, op); break;
    case XM_OP_ADD: changed |= rewrite_add(m, op); break;
    case XM_OP_NARROW: changed |= rewrite_narrow(m, op); break;
    default: break;
    }
  }
  return changed;
}

static xm_status_t canonicalize_run(xm_ir_module_t *m, const xm_pass_options_t *options,
                                    xm_diag_t *diag, bool *out_changed) {
  bool dce_only = false;
  XM_RETURN_IF_ERROR(xm_pass_option_bool(options, "dce-only", false, diag, &dce_only));
  /* Each round strictly shrinks the op count or the number of foldable
   * links, so the bound is only a guard against a bug in a rule. */
  for (int round = 0; round < 1000; round++) {
    bool changed = !dce_only && rewrite_round(m);
    bool removed = false;
    XM_RETURN_IF_ERROR(xm_rewrite_dce(m, &removed));
    if (changed || removed) *out_changed = true;
    if (!changed) return XM_OK;
  }
  xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL, "rewrites did not reach a fixed point");
  return XM_ERR_INTERNAL;
}

static const char *const k_options[] = {"dce-only", NULL};

const xm_pass_info_t xm_pass_canonicalize = {
    .name = "canonicalize",
    .summary = "fold reshapes, unit and nested scales, additions of zero, narrowed all-reduces; remove dead ops",
    .option_names = k_options,
    .run = canonicalize_run,
};
