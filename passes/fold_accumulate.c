/* passes/fold_accumulate.c — the weight gradient added into its grad state
 * by the GEMM that computes it (docs/design.md, Training: from the forward
 * graph to out/train).
 *
 * After autodiff a weight gradient is a GEMM result followed by
 * `accumulate(state, dw)`. When that accumulate is the result's only use,
 * the GEMM can add its product into the state itself (beta = 1, Megatron's
 * gradient-accumulation fusion), and the [dw] buffer is never written. The
 * pass records the decision in the IR, so that the code generator only
 * prints it and `xmoec inspect` and plan-memory read the same attributes:
 *
 *   the GEMM gets attr accumulate = true: its result is added into the
 *       state of the one accumulate that uses it;
 *   that accumulate gets attr folded = true: it emits no code.
 *
 * Candidates: matmul_dw, grouped_matmul_dw, the fused gather / combine
 * weight-gradient GEMMs and the fused loss's gradient (its dw, result 0), in the micro-batch (not the step), with a static
 * f32 result of the state's size, accumulating into an f32 state. The
 * module records how many it folded (attr folded_accumulates).
 */
#include "passes/pass.h"

static bool is_weight_grad(xm_ir_opcode_t code) {
  return code == XM_OP_MATMUL_DW || code == XM_OP_GROUPED_MATMUL_DW ||
         code == XM_OP_GATHER_GROUPED_MATMUL_DW || code == XM_OP_GROUPED_MATMUL_COMBINE_DW ||
         code == XM_OP_LM_HEAD_CE_GRAD;
}

/* The accumulate `op` folds into the GEMM that makes its operand 1. */
static bool foldable(const xm_ir_op_t *op) {
  if (op->code != XM_OP_ACCUMULATE || op->num_operands != 2) return false;
  const char *phase = xm_ir_op_get_string(op, "phase", "");
  if (phase[0] == '\0' || phase[0] == 's') return false; /* "step", or no phase */
  const xm_ir_value_t *acc = op->operands[0], *dw = op->operands[1];
  const xm_ir_op_t *def = dw->def;
  if (!def || !is_weight_grad(def->code) || dw->index != 0 || dw->num_uses != 1) return false;
  if (!acc->def || acc->def->code != XM_OP_STATE) return false;
  if (acc->type.dtype != XM_DT_F32 || dw->type.dtype != XM_DT_F32) return false;
  int64_t n = xm_ir_type_numel(&dw->type);
  if (n <= 0 || n != xm_ir_type_numel(&acc->type)) return false;
  for (int d = 0; d < dw->type.rank; d++)
    if (dw->type.dynamic[d]) return false;
  return true;
}

static xm_status_t fold_run(xm_ir_module_t *m, const xm_pass_options_t *options,
                            xm_diag_t *diag, bool *out_changed) {
  (void)options;
  (void)diag;
  int64_t folded = 0;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (xm_ir_op_get_bool(op, "folded", false) || !foldable(op)) continue;
    xm_ir_op_set_bool(m, op, "folded", true);
    xm_ir_op_set_bool(m, op->operands[1]->def, "accumulate", true);
    folded++;
  }
  xm_ir_module_set_int(m, "folded_accumulates",
                       xm_ir_module_get_int(m, "folded_accumulates", 0) + folded);
  *out_changed = folded > 0;
  return XM_OK;
}

const xm_pass_info_t xm_pass_fold_accumulate = {
    .name = "fold-accumulate",
    .summary = "weight-gradient GEMMs add into their grad states (beta = 1) where the "
               "accumulate is their only use",
    .option_names = NULL,
    .run = fold_run,
};
