/* passes/schedule.c — the "schedule" pass: the linear order in which the
 * generated program runs the ops, checked and recorded.
 *
 * A training program has two functions (runtime/abi/program.h): micro (forward
 * and backward of one micro-batch, attr phase "fwd"/"bwd"; an op without a
 * phase counts as "fwd") and step (the optimizer, phase "step"). The code
 * generator emits ops in module order, so the module order must be: every
 * micro op, then every step op, with the return last. Params and states are
 * declarations, not code: they live in the persistent arena and may sit
 * anywhere. Visibility follows from the two functions: a micro op may read
 * persistent values, inputs and earlier micro temporaries; a step op may
 * read persistent values and earlier step temporaries only (the micro
 * function's buffers are dead, and reused, by the time step runs), and the
 * results of a collective that overlap-grad-reduce moved into the last
 * micro-batch (attr last_micro: ZeRO-1's reduce-scatter chunk, which the
 * memory plan keeps alive from there into the step).
 *
 * When the phases are interleaved the pass moves the step ops after the
 * micro ops, keeping the relative order inside each group (a stable
 * partition), and the return to the end. Such a move changes liveness, so
 * it is refused once a memory plan exists (module attr
 * mem_activation_bytes): the plan would no longer match the order. The
 * module attrs schedule_micro_ops and schedule_step_ops record how many
 * ops each function runs (declarations excluded; input and return count
 * as micro) and tell the code generator that the order was checked.
 *
 * Multi-rank scheduling (a communication stream beside the compute stream)
 * will extend this pass; the single-rank program has one stream.
 */
#include <stdlib.h>
#include <string.h>

#include "passes/pass.h"

enum { GROUP_DECL = 0, GROUP_MICRO = 1, GROUP_STEP = 2, GROUP_RETURN = 3 };

static int group_of(const xm_ir_op_t *op) {
  if (xm_ir_op_is_declaration(op)) return GROUP_DECL;
  if (op->code == XM_OP_RETURN) return GROUP_RETURN;
  const char *phase = xm_ir_op_get_string(op, "phase", "fwd");
  return strcmp(phase, "step") == 0 ? GROUP_STEP : GROUP_MICRO;
}

static bool module_has_attr(const xm_ir_module_t *m, const char *key) {
  for (int i = 0; i < xm_ir_module_num_attrs(m); i++)
    if (strcmp(xm_ir_module_attr(m, i)->key, key) == 0) return true;
  return false;
}

static void report(xm_diag_t *diag, const xm_ir_op_t *op, int index, const char *fmt,
                   const char *a, const char *b) {
  char place[32];
  snprintf(place, sizeof place, "op %d", index);
  xm_diag_add(diag, XM_DIAG_ERROR, op->loc[0] ? op->loc : NULL, place, fmt, a, b);
}

/* True when the order is micro ops, then step ops, then the return (the
 * declarations anywhere). */
static bool in_order(const xm_ir_module_t *m) {
  int last = GROUP_MICRO;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    int gr = group_of(xm_ir_module_op(m, i));
    if (gr == GROUP_DECL) continue;
    if (gr < last) return false;
    last = gr;
  }
  return true;
}

/* Stable partition: declarations and micro ops keep their places relative
 * to each other, then the step ops, then the return. */
static xm_status_t reorder(xm_ir_module_t *m) {
  int n = xm_ir_module_num_ops(m), pos = 0;
  for (int want = GROUP_MICRO; want <= GROUP_RETURN; want++) {
    for (int i = pos; i < n; i++) {
      int gr = group_of(xm_ir_module_op(m, i));
      bool take = gr == want || (want == GROUP_MICRO && gr == GROUP_DECL);
      if (!take) continue;
      if (i != pos) xm_ir_module_move_op(m, i, pos);
      pos++;
    }
  }
  return pos == n ? XM_OK : XM_ERR_INTERNAL;
}

/* Every operand must be defined earlier and be visible in the reader's
 * function; counts the ops of each function. */
static xm_status_t check_visibility(const xm_ir_module_t *m, xm_diag_t *diag, int64_t *out_micro,
                                    int64_t *out_step) {
  int nv = xm_ir_module_num_values(m);
  int *defined = calloc((size_t)nv + 1, sizeof(int)); /* group + 1 of the def, 0 = not yet */
  if (!defined) return XM_ERR_NO_MEMORY;
  xm_status_t st = XM_OK;
  *out_micro = *out_step = 0;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    int gr = group_of(op);
    for (int j = 0; j < op->num_operands; j++) {
      const xm_ir_value_t *v = op->operands[j];
      int def = defined[v->id] - 1;
      const char *name = xm_ir_opinfo(op->code)->name;
      if (def < 0) {
        report(diag, op, i, "%s reads a value that is not defined before it%s", name, "");
        st = XM_ERR_INTERNAL;
      } else if (def != GROUP_DECL && gr == GROUP_STEP && def != GROUP_STEP &&
                 !(v->def && xm_ir_op_get_bool(v->def, "last_micro", false))) {
        report(diag, op, i, "%s (step) reads %s value of the micro-batch function", name, "a");
        st = XM_ERR_INTERNAL;
      } else if (def == GROUP_STEP && gr != GROUP_STEP) {
        report(diag, op, i, "%s reads %s value computed by the optimizer step", name, "a");
        st = XM_ERR_INTERNAL;
      }
    }
    for (int j = 0; j < op->num_results; j++)
      defined[op->results[j]->id] = gr + 1;
    if (gr == GROUP_MICRO || gr == GROUP_RETURN) (*out_micro)++;
    if (gr == GROUP_STEP) (*out_step)++;
  }
  free(defined);
  return st;
}

static void set_int(xm_ir_module_t *m, const char *key, int64_t v) {
  xm_ir_attr_t a = {.key = key, .kind = XM_ATTR_INT, .i = v};
  xm_ir_module_set_attr(m, &a);
}

static xm_status_t schedule_run(xm_ir_module_t *m, const xm_pass_options_t *options,
                                xm_diag_t *diag, bool *out_changed) {
  (void)options;
  int returns = 0;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++)
    returns += xm_ir_module_op(m, i)->code == XM_OP_RETURN;
  if (returns > 1) {
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL, "schedule: the module has %d return ops",
                returns);
    return XM_ERR_INVALID_INPUT;
  }
  if (!in_order(m)) {
    if (module_has_attr(m, "mem_activation_bytes")) {
      xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL,
                  "schedule: micro-batch and step ops are interleaved, and the module already "
                  "has a memory plan for that order; run schedule before plan-memory");
      return XM_ERR_INVALID_INPUT;
    }
    XM_RETURN_IF_ERROR(reorder(m));
    *out_changed = true;
  }
  int64_t micro = 0, step = 0;
  xm_status_t st = check_visibility(m, diag, &micro, &step);
  if (st != XM_OK) return st == XM_ERR_INTERNAL ? XM_ERR_INVALID_INPUT : st;
  set_int(m, "schedule_micro_ops", micro);
  set_int(m, "schedule_step_ops", step);
  return XM_OK;
}

const xm_pass_info_t xm_pass_schedule = {
    .name = "schedule",
    .summary = "check and record the op order of the micro-batch and optimizer-step functions",
    .option_names = NULL,
    .run = schedule_run,
};
