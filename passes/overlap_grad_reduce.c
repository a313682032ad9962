/* passes/overlap_grad_reduce.c — the data-parallel gradient reductions
 * started during the last micro-batch's backward, beside the computation
 * (docs/design.md, Overlap).
 *
 * After autodiff every reduce_state of a gradient sits in the step, after
 * the last micro-batch: the whole backward waits, then every all-reduce
 * runs, then the optimizer. A gradient is final as soon as the last
 * micro-batch has added its last contribution, so its reduction can start
 * there, on the communication stream, while the backward of the layers
 * below goes on (the bucketed overlap of PyTorch DDP and Megatron's
 * overlap-grad-reduce, here per tensor and decided at compile time).
 *
 * The pass moves each reduce_state of a grad state from the step to just
 * after the last op of the micro-batch that uses that state (its
 * accumulate), and records the decision in the IR:
 *
 *   phase = "bwd", last_micro = true: the op is in the micro function,
 *       runs only in the last micro-batch of a step, on the communication
 *       stream (codegen: xm_rt_overlap_begin / _end); the step function
 *       first waits for that stream (xm_rt_overlap_join).
 *
 * Nothing in the micro function reads a grad state after its last
 * accumulate (the state is only ever added into), and the step reads it
 * only after the join, so the values are those of the unmoved program:
 * the reductions run in the same order on every rank, in the same order
 * relative to each other. Moved are the reductions of f32 grad states
 * whose state no earlier step op reads other than a reduction moved
 * before it: the all-reduces and ZeRO-1's reduce-scatter (after the TP
 * all-reduce of the same gradient, when there is one, in that order). The
 * expert-load reductions of the aux-free bias stay (consumed by the step's
 * update anyway). Reductions with the same anchor keep their relative
 * order. The module records how many it moved (attr overlapped_reductions).
 *
 * A reduce_state has no result and its operand is persistent; a moved
 * reduce-scatter's chunk is a micro value that the step reads, which the
 * memory plan keeps alive from the backward into the step (the last
 * micro-batch wrote it). So the pass must run before plan-memory.
 */
#include <stdlib.h>
#include <string.h>

#include "passes/pass.h"

/* A reduce_state or a ZeRO-1 reduce-scatter of the step on an f32 grad
 * state. */
static bool candidate(const xm_ir_op_t *op) {
  if ((op->code != XM_OP_REDUCE_STATE && op->code != XM_OP_ZERO_REDUCE_SCATTER) ||
      op->num_operands != 1 || !xm_ir_op_in_step(op))
    return false;
  const xm_ir_value_t *s = op->operands[0];
  return s->def && s->def->code == XM_OP_STATE && s->type.dtype == XM_DT_F32 &&
         strcmp(xm_ir_op_get_string(s->def, "kind", ""), "grad") == 0;
}

/* One pass over the ops finds, per value, the last micro op and the first
 * step op that use it; the moves are then applied in anchor order, the
 * current positions computed from what has moved already, so the pass is
 * linear in the ops plus quadratic in the moved ones only. */
static xm_status_t overlap_run(xm_ir_module_t *m, const xm_pass_options_t *options, xm_diag_t *diag,
                               bool *out_changed) {
  (void)options;
  (void)diag;
  *out_changed = false;
  int n = xm_ir_module_num_ops(m), nv = xm_ir_module_num_values(m);
  int *last_micro = malloc(sizeof(int) * (size_t)(nv ? nv : 1));
  int *first_step = malloc(sizeof(int) * (size_t)(nv ? nv : 1));
  int *moves = malloc(sizeof(int) * 2 * (size_t)(n ? n : 1)); /* (anchor, op index) pairs */
  if (!last_micro || !first_step || !moves) {
    free(last_micro), free(first_step), free(moves);
    return XM_ERR_NO_MEMORY;
  }
  for (int v = 0; v < nv; v++)
    last_micro[v] = -1, first_step[v] = n;
  int k = 0;
  for (int i = 0; i < n; i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (xm_ir_op_is_declaration(op)) continue;
    if (candidate(op)) {
      int id = op->operands[0]->id;
      if (last_micro[id] >= 0 && first_step[id] > i) { /* no earlier step op reads it */
        moves[2 * k] = last_micro[id];
        moves[2 * k + 1] = i;
        k++;
        continue; /* it reads the state in the micro function now */
      }
    }
    for (int j = 0; j < op->num_operands; j++) {
      int id = op->operands[j]->id;
      if (!xm_ir_op_in_step(op))
        last_micro[id] = i;
      else if (first_step[id] > i)
        first_step[id] = i;
    }
  }
  /* Stable by anchor (insertion sort: the moved ops are few and nearly in
   * order). Inserted after anchor a, with every earlier move at an anchor
   * <= a, op i lands at a + 1 + (moves done); it sits at i plus the moves
   * done from after it (a move from before it leaves it in place). */
  for (int x = 1; x < k; x++)
    for (int y = x; y > 0 && moves[2 * y - 2] > moves[2 * y]; y--) {
      int a = moves[2 * y - 2], o = moves[2 * y - 1];
      moves[2 * y - 2] = moves[2 * y], moves[2 * y - 1] = moves[2 * y + 1];
      moves[2 * y] = a, moves[2 * y + 1] = o;
    }
  for (int x = 0; x < k; x++) {
    int anchor = moves[2 * x], i = moves[2 * x + 1], from = i, to = anchor + 1 + x;
    for (int y = 0; y < x; y++) {
      from += moves[2 * y + 1] > i;
      to -= moves[2 * y + 1] < anchor; /* (step ops follow the micro ones: none) */
    }
    xm_ir_op_t *op = xm_ir_module_op(m, from);
    xm_ir_module_move_op(m, from, to);
    xm_ir_op_set_string(m, op, "phase", "bwd");
    xm_ir_op_set_bool(m, op, "last_micro", true);
  }
  free(last_micro);
  free(first_step);
  free(moves);
  if (k == 0) return XM_OK;
  xm_ir_module_set_int(m, "overlapped_reductions",
                       xm_ir_module_get_int(m, "overlapped_reductions", 0) + k);
  *out_changed = true;
  return XM_OK;
}

const xm_pass_info_t xm_pass_overlap_grad_reduce = {
    .name = "overlap-grad-reduce",
    .summary = "gradient all-reduces start in the last micro-batch's backward, on the "
               "communication stream, right after each gradient's last accumulate",
    .option_names = NULL,
    .run = overlap_run,
};
