/* passes/kernel_workspace.c — the scratch of the f32 CPU kernels in the
 * memory plan (docs/design.md, Backends: kernels do not allocate).
 *
 * Every op whose kernel takes a workspace gets attr workspace (bytes) from
 * that kernel's formula in runtime/abi/workspace.h, evaluated on the size
 * arguments the code generator passes the kernel, read here from the op's
 * operand types in the same way:
 *
 *   rope, rope_grad     x / dy [B,S,nh,D]             xm_ws_rope(S, D)
 *   attention           q [B,S,Hq,D], k, v            xm_ws_attention(B, S, Hq)
 *   attention_grad      dout, q [B,S,Hq,D], k [B,S,Hkv,D], v
 *                                                     xm_ws_attention_grad(B, S, Hkv)
 *   rmsnorm_grad        dy, x [...,H], w              xm_ws_rmsnorm_grad(rows, H),
 *                       rows = elements of x / H (the bound when x has routed rows)
 *
 * plan-memory then places each workspace in the activation arena, live
 * during its op only (attr ws), and codegen hands it to the kernel as its
 * last argument. An op that already asks for a larger workspace (another
 * pass chose a kernel that needs more) keeps it: a buffer large enough for
 * both kernels serves either. The pass changes nothing else, so it may run
 * anywhere after autodiff (which makes the gradient ops) and before
 * plan-memory; running it twice is the same as once. (The grouped GEMMs
 * need no scratch, and the bf16 GEMMs and the fused MoE kernels get theirs
 * from the passes that choose them.)
 */
#include "passes/pass.h"
#include "runtime/abi/workspace.h"

static int64_t dim(const xm_ir_value_t *v, int i) {
  return i < 0 ? v->type.dims[v->type.rank + i] : v->type.dims[i];
}

/* Whether operand i has rank r (the verifier's shapes; anything else is a
 * module the pass cannot size). */
static bool has_rank(const xm_ir_op_t *op, int i, int r) {
  return i < op->num_operands && op->operands[i]->type.rank == r;
}

/* The workspace the op's kernel needs: bytes >= 0, or -1 when the op has
 * no scratch kernel, -2 when its operands do not have the shapes of
 * ir/ops.def. */
static int64_t kernel_bytes(const xm_ir_op_t *op) {
  switch (op->code) {
  case XM_OP_ROPE:
  case XM_OP_ROPE_GRAD: {
    if (!has_rank(op, 0, 4)) return -2;
    const xm_ir_value_t *x = op->operands[0];
    int64_t off, rd;
    xm_ir_rope_span(op, dim(x, 3), &off, &rd);
    return xm_ws_rope(dim(x, 1), rd);
  }
  case XM_OP_ATTENTION: {
    if (!has_rank(op, 0, 4)) return -2;
    const xm_ir_value_t *q = op->operands[0];
    return xm_ws_attention(dim(q, 0), dim(q, 1), dim(q, 2));
  }
  case XM_OP_ATTENTION_GRAD: {
    if (!has_rank(op, 1, 4) || !has_rank(op, 2, 4)) return -2;
    const xm_ir_value_t *q = op->operands[1], *k = op->operands[2];
    return xm_ws_attention_grad(dim(q, 0), dim(q, 1), dim(k, 2));
  }
  case XM_OP_GRAD_NORM_SQ: return xm_ws_norm_sq();
  case XM_OP_RMSNORM_GRAD: {
    if (op->num_operands < 2 || op->operands[1]->type.rank < 1) return -2;
    const xm_ir_value_t *x = op->operands[1];
    int64_t H = dim(x, -1);
    return xm_ws_rmsnorm_grad(H > 0 ? xm_ir_type_numel(&x->type) / H : 0, H);
  }
  default: return -1;
  }
}

static xm_status_t workspace_run(xm_ir_module_t *m, const xm_pass_options_t *options,
                                 xm_diag_t *diag, bool *out_changed) {
  (void)options;
  bool changed = false;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    xm_ir_op_t *op = xm_ir_module_op(m, i);
    int64_t bytes = kernel_bytes(op);
    if (bytes == -1) continue;
    if (bytes < 0) {
      xm_diag_add(diag, XM_DIAG_ERROR, op->loc[0] ? op->loc : NULL, NULL,
                  "kernel-workspace: op %d %s: operands without the shapes of ir/ops.def", i,
                  xm_ir_opinfo(op->code)->name);
      return XM_ERR_INTERNAL;
    }
    if (bytes == 0 || xm_ir_op_get_int(op, "workspace", 0) >= bytes) continue;
    xm_ir_op_set_int(m, op, "workspace", bytes);
    changed = true;
  }
  *out_changed = changed;
  return XM_OK;
}

const xm_pass_info_t xm_pass_kernel_workspace = {
    .name = "kernel-workspace",
    .summary = "attr workspace (bytes) on rope, rope_grad, attention, attention_grad, "
               "rmsnorm_grad and grad_norm_sq, whose kernels need scratch",
    .option_names = NULL,
    .run = workspace_run,
};
