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
 * relative to each other. Moved are reductions of f32 grad states whose
 * state no earlier step op reads; the rest stays where it is: ZeRO-1's
 * reduce-scatter (its chunk is a step temporary), the expert-load
 * reductions of the aux-free bias (consumed by the step's update anyway).
 * Reductions with the same anchor keep their relative order. The module
 * records how many it moved (attr overlapped_reductions).
 *
 * The pass changes no value's lifetime in the activation arena (a
 * reduce_state has no result and its operand is persistent), so it may
 * run before or after plan-memory; the pipeline runs it before.
 */
#include <stdlib.h>
#include <string.h>

#include "passes/pass.h"

static bool is_step(const xm_ir_op_t *op) {
  return strcmp(xm_ir_op_get_string(op, "phase", "fwd"), "step") == 0;
}

static bool is_declaration(const xm_ir_op_t *op) {
  return op->code == XM_OP_PARAM || op->code == XM_OP_STATE;
}

static bool uses(const xm_ir_op_t *op, const xm_ir_value_t *v) {
  for (int j = 0; j < op->num_operands; j++)
    if (op->operands[j] == v) return true;
  return false;
}

/* A reduce_state of the step on an f32 grad state. */
static bool candidate(const xm_ir_op_t *op) {
  if (op->code != XM_OP_REDUCE_STATE || op->num_operands != 1 || !is_step(op)) return false;
  const xm_ir_value_t *s = op->operands[0];
  return s->def && s->def->code == XM_OP_STATE && s->type.dtype == XM_DT_F32 &&
         strcmp(xm_ir_op_get_string(s->def, "kind", ""), "grad") == 0;
}

static xm_status_t overlap_run(xm_ir_module_t *m, const xm_pass_options_t *options, xm_diag_t *diag,
                               bool *out_changed) {
  (void)options;
  (void)diag;
  int n = xm_ir_module_num_ops(m);
  /* anchor[i]: the module index of the micro op a moved op i goes after. */
  int *anchor = malloc(sizeof *anchor * (size_t)(n ? n : 1));
  if (!anchor) return XM_ERR_NO_MEMORY;
  int moved = 0;
  for (int i = 0; i < n; i++) {
    anchor[i] = -1;
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (!candidate(op)) continue;
    const xm_ir_value_t *s = op->operands[0];
    int last = -1;
    bool read_in_step = false;
    for (int j = 0; j < i; j++) {
      const xm_ir_op_t *o = xm_ir_module_op(m, j);
      if (is_declaration(o) || !uses(o, s)) continue;
      if (is_step(o))
        read_in_step = true;
      else
        last = j;
    }
    if (last < 0 || read_in_step) continue;
    anchor[i] = last;
    moved++;
  }
  if (moved == 0) {
    free(anchor);
    *out_changed = false;
    return XM_OK;
  }
  /* The new order: each moved op right after its anchor (several after one
   * anchor in their module order), everything else where it was. */
  xm_ir_op_t **old = malloc(sizeof *old * (size_t)n);
  if (!old) {
    free(anchor);
    return XM_ERR_NO_MEMORY;
  }
  for (int i = 0; i < n; i++)
    old[i] = xm_ir_module_op(m, i);
  int pos = 0;
  for (int i = 0; i < n; i++) {
    if (anchor[i] >= 0) continue; /* placed after its anchor */
    /* old[i] goes to pos: find it (it is at or after pos) and move it. */
    for (int k = pos; k < n; k++)
      if (xm_ir_module_op(m, k) == old[i]) {
        if (k != pos) xm_ir_module_move_op(m, k, pos);
        break;
      }
    pos++;
    for (int j = i + 1; j < n; j++) {
      if (anchor[j] != i) continue;
      for (int k = pos; k < n; k++)
        if (xm_ir_module_op(m, k) == old[j]) {
          if (k != pos) xm_ir_module_move_op(m, k, pos);
          break;
        }
      xm_ir_op_set_string(m, old[j], "phase", "bwd");
      xm_ir_op_set_bool(m, old[j], "last_micro", true);
      pos++;
    }
  }
  free(old);
  free(anchor);
  xm_ir_module_set_int(m, "overlapped_reductions",
                       xm_ir_module_get_int(m, "overlapped_reductions", 0) + moved);
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
