/* passes/fuse_lm_head.c — the LM head and the cross-entropy as one op whose
 * logits exist one chunk of the vocabulary at a time (docs/design.md, The
 * chunked loss).
 *
 * On the forward graph, after shard and before autodiff:
 *
 *   cross_entropy(matmul(x, w), labels)
 *       becomes lm_head_ce(x, w, labels) when the logits have no other use.
 *
 * The [tokens, vocab] logits are the largest activation of a model with a
 * large vocabulary (DeepSeek-V3: 129280 columns, 16 times its hidden
 * width), and the unfused backward holds their gradient as well. The fused
 * op makes them chunk by chunk into its scratch, keeping per row the
 * running maximum and softmax denominator, and saves only those two floats
 * per row for the backward, which recomputes each chunk's logits (one more
 * GEMM of the head's size) and turns them into their gradient in place.
 * Running before autodiff, the backward comes out fused too (the autodiff
 * rule of lm_head_ce emits lm_head_ce_grad).
 *
 * Option chunk=N: vocabulary columns per chunk (default xm_lm_ce_chunk of
 * runtime/abi/workspace.h, the hidden width rounded up to 64; clamped to
 * the vocabulary). The module records fused_losses (how many were folded)
 * and lm_ce_chunk (the chunk of the last one).
 */
#include <stdlib.h>

#include "passes/pass.h"
#include "runtime/abi/workspace.h"

static bool has_backward(const xm_ir_module_t *m) {
  for (int i = 0; i < xm_ir_module_num_ops(m); i++)
    if (xm_ir_op_attr(xm_ir_module_op(m, i), "phase")) return true;
  return false;
}

/* cross_entropy at position i whose logits come from a matmul used only
 * here: replaced in place; the two old ops are removed by the caller (not
 * by a general DCE: ops without a use in the forward graph, such as the
 * routing an aux-free load count reads, are autodiff's to keep). */
static bool fuse_loss(xm_ir_module_t *m, int i, xm_ir_op_t *ce, int64_t option,
                      int64_t *out_chunk) {
  xm_ir_value_t *logits = ce->operands[0], *labels = ce->operands[1];
  const xm_ir_op_t *mm = logits->def;
  if (!mm || mm->code != XM_OP_MATMUL || mm->num_operands != 2 || logits->num_uses != 1)
    return false;
  xm_ir_value_t *x = mm->operands[0], *w = mm->operands[1];
  if (w->type.rank != 2 || x->type.rank < 1) return false;
  int64_t V = w->type.dims[0], H = w->type.dims[1];
  int64_t T = xm_ir_type_numel(&labels->type);
  int64_t chunk = option > 0 ? option : xm_lm_ce_chunk(V, H);
  if (chunk > V) chunk = V;
  xm_ir_type_t types[3] = {
      ce->results[0]->type,
      xm_ir_type_make(XM_DT_F32, 2, (int64_t[]){T, 2}),
      xm_ir_type_make(XM_DT_F32, 1, (int64_t[]){xm_lm_ce_scratch_floats(T, chunk)}),
  };
  xm_ir_op_t *op = xm_ir_op_append(m, XM_OP_LM_HEAD_CE, 3, (xm_ir_value_t *[]){x, w, labels}, 3,
                                   types, ce->loc);
  XM_ASSERT(op != NULL); /* arena exhaustion, as in the model builder */
  for (int a = 0; a < ce->num_attrs; a++)
    xm_ir_op_set_attr(m, op, &ce->attrs[a]);
  xm_ir_op_set_int(m, op, "chunk", chunk);
  xm_ir_module_move_op(m, xm_ir_module_num_ops(m) - 1, i);
  xm_ir_value_replace_uses(m, ce->results[0], op->results[0]);
  *out_chunk = chunk;
  return true;
}

static xm_status_t fuse_run(xm_ir_module_t *m, const xm_pass_options_t *options, xm_diag_t *diag,
                            bool *out_changed) {
  int64_t option = 0;
  const char *v = xm_pass_option(options, "chunk");
  if (v) {
    char *end = NULL;
    long long n = strtoll(v, &end, 10);
    if (!*v || *end || n < 1 || v[0] == '+' || v[0] == ' ') {
      xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL,
                  "fuse-lm-head: option chunk must be a positive integer (vocabulary columns "
                  "per chunk), got '%s'",
                  v);
      return XM_ERR_INVALID_INPUT;
    }
    option = n;
  }
  if (has_backward(m)) {
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL,
                "fuse-lm-head runs on the forward graph (before autodiff); this module already "
                "has a backward");
    return XM_ERR_INVALID_INPUT;
  }
  int64_t fused = 0, chunk = 0;
  int n = xm_ir_module_num_ops(m);
  for (int i = 0; i < n; i++) {
    xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->code != XM_OP_CROSS_ENTROPY || op->num_operands != 2) continue;
    if (fuse_loss(m, i, op, option, &chunk)) {
      fused++;
      n = xm_ir_module_num_ops(m);
      i++; /* the old cross_entropy moved one place down */
    }
  }
  if (fused) {
    /* The replaced cross_entropy ops have no uses left, nor then do their
     * matmuls (the logits had one use): remove exactly those. */
    bool *remove = calloc((size_t)n + 1, sizeof *remove);
    if (!remove) return XM_ERR_NO_MEMORY;
    for (int i = 0; i < n; i++) {
      const xm_ir_op_t *op = xm_ir_module_op(m, i);
      if (op->code == XM_OP_CROSS_ENTROPY && op->results[0]->num_uses == 0 &&
          op->operands[0]->num_uses == 1) {
        remove[i] = true;
        for (int j = 0; j < i; j++)
          if (xm_ir_module_op(m, j) == op->operands[0]->def) remove[j] = true;
      }
    }
    xm_ir_module_remove_ops(m, remove);
    free(remove);
    *out_changed = true;
  }
  xm_ir_module_set_int(m, "fused_losses", fused);
  if (fused) xm_ir_module_set_int(m, "lm_ce_chunk", chunk);
  return XM_OK;
}

static const char *const k_options[] = {"chunk", NULL};

const xm_pass_info_t xm_pass_fuse_lm_head = {
    .name = "fuse-lm-head",
    .summary = "the LM head's GEMM and the cross-entropy as one op over the vocabulary in chunks "
               "(the [tokens, vocab] logits never exist whole)",
    .option_names = k_options,
    .run = fuse_run,
};
