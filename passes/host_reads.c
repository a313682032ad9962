/* passes/host_reads.c — every point where the host needs a device value,
 * made an op (docs/design.md, Backends).
 *
 * On a GPU the host can read a device value only by waiting for the stream
 * and copying it. The schedule needs few: the routed row count of each
 * permute (it sizes the kernels after it), the squared gradient norm (the
 * clip coefficient AdamW is given) and the losses the training driver
 * logs. This pass, after autodiff, inserts a host_read for each of them
 * (ir/ops.def), so the code generator knows every synchronisation point at
 * compile time and the host code reads nothing else from the arenas:
 *
 *   rows     right after each permute, of its tokens_per_expert;
 *   norm_sq  right after the op that makes adamw's norm operand (once per
 *            value, whatever the number of adamw ops reading it);
 *   loss, ce_loss  at the end of the micro-batch (the return's operands 0
 *            and 1 when they are f32 scalars, the loss read again as
 *            ce_loss when it has no second);
 *   mtp_loss the return's operand 2 when it is an f32 scalar (the MTP
 *            modules' mean cross-entropy, ir/model.c).
 *
 * A module that already has host_reads is left as it is (the pass is
 * idempotent). The module records the count (attr host_reads).
 */
#include <stdlib.h>
#include <string.h>

#include "passes/pass.h"

/* A host_read of `v` appended and moved to position `at`. */
static void read_at(xm_ir_module_t *m, xm_ir_value_t *v, const char *as, const char *phase,
                    int at) {
  xm_ir_op_t *op = xm_ir_op_append(m, XM_OP_HOST_READ, 1, &v, 0, NULL, v->def ? v->def->loc : "");
  XM_ASSERT(op != NULL); /* arena exhaustion, as in the model builder */
  xm_ir_op_set_string(m, op, "as", as);
  if (phase) xm_ir_op_set_string(m, op, "phase", phase);
  xm_ir_module_move_op(m, xm_ir_module_num_ops(m) - 1, at);
}

static bool is_scalar(const xm_ir_value_t *v) {
  return v->type.rank == 0 && v->type.dtype == XM_DT_F32;
}

static int index_of(const xm_ir_module_t *m, const xm_ir_op_t *op) {
  for (int i = 0; i < xm_ir_module_num_ops(m); i++)
    if (xm_ir_module_op(m, i) == op) return i;
  return -1;
}

/* Position after the last micro-batch op (fwd or bwd): where the losses
 * are final. */
static int micro_end(const xm_ir_module_t *m, const char **out_phase) {
  int end = 0;
  *out_phase = "fwd";
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    const char *ph = xm_ir_op_get_string(op, "phase", "fwd");
    if (strcmp(ph, "step") == 0 || op->code == XM_OP_RETURN) continue;
    end = i + 1;
    *out_phase = strcmp(ph, "bwd") == 0 ? "bwd" : *out_phase;
  }
  return end;
}

static xm_status_t host_reads_run(xm_ir_module_t *m, const xm_pass_options_t *options,
                                  xm_diag_t *diag, bool *out_changed) {
  (void)options;
  (void)diag;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++)
    if (xm_ir_module_op(m, i)->code == XM_OP_HOST_READ) return XM_OK;
  int64_t count = 0;
  int nv = xm_ir_module_num_values(m);
  bool *norm_read = calloc((size_t)nv + 1, sizeof *norm_read);
  if (!norm_read) return XM_ERR_NO_MEMORY;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->code == XM_OP_PERMUTE && op->num_results == 3) {
      read_at(m, op->results[2], "rows", xm_ir_op_get_string(op, "phase", NULL), i + 1);
      count++;
      i++;
    } else if (op->code == XM_OP_ADAMW && op->num_operands == 5) {
      xm_ir_value_t *norm = op->operands[4];
      if (norm->id >= nv || norm_read[norm->id] || !norm->def) continue;
      norm_read[norm->id] = true;
      int at = index_of(m, norm->def) + 1;
      read_at(m, norm, "norm_sq", xm_ir_op_get_string(norm->def, "phase", NULL), at);
      count++;
      i++; /* the read went in before this adamw */
    }
  }
  free(norm_read);
  const xm_ir_op_t *ret = NULL;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++)
    if (xm_ir_module_op(m, i)->code == XM_OP_RETURN) ret = xm_ir_module_op(m, i);
  if (ret && ret->num_operands >= 1 && is_scalar(ret->operands[0])) {
    const char *phase;
    int at = micro_end(m, &phase);
    xm_ir_value_t *loss = ret->operands[0];
    xm_ir_value_t *ce =
        ret->num_operands > 1 && is_scalar(ret->operands[1]) ? ret->operands[1] : loss;
    read_at(m, loss, "loss", xm_ir_op_attr(ret, "phase") ? phase : NULL, at);
    read_at(m, ce, "ce_loss", xm_ir_op_attr(ret, "phase") ? phase : NULL, at + 1);
    count += 2;
    if (ret->num_operands > 2 && is_scalar(ret->operands[2])) {
      read_at(m, ret->operands[2], "mtp_loss", xm_ir_op_attr(ret, "phase") ? phase : NULL,
              at + 2);
      count++;
    }
  }
  xm_ir_module_set_int(m, "host_reads", count);
  *out_changed = count > 0;
  return XM_OK;
}

const xm_pass_info_t xm_pass_host_reads = {
    .name = "host-reads",
    .summary = "a host_read op at every point the host needs a device value (routed row "
               "counts, the gradient norm, the losses)",
    .option_names = NULL,
    .run = host_reads_run,
};
