/* passes/overlap_moe_comm.c — the expert all-to-alls of a MoE layer run
 * beside the layer's other work (docs/design.md, Overlap).
 *
 * An expert-parallel MoE block waits on its dispatch, then on its combine;
 * the shared experts, the router's backward and the aux loss need neither.
 * This pass gives each expert exchange (all_to_all over ep, rbd_dispatch,
 * rbd_combine and their gradients) the work of its layer that is
 * independent of it, so that work runs on the compute stream while the
 * exchange runs on the MoE communication stream (DeepSeek-V3's and
 * Megatron's shared-expert overlap, found here by dataflow rather than
 * named).
 *
 * For an exchange C, in the micro function, among the ops of C's layer and
 * phase:
 *
 *   before  the ops before C that C does not need (the shared experts'
 *           backward before the combine's gradient, for example) move to
 *           just before C;
 *   after   the ops after C that need neither C nor anything left behind
 *           (the shared experts after the dispatch, the aux loss, the
 *           router's backward) move there too, with the declarations they
 *           read.
 *
 * "Needs" is the dataflow of the IR plus two orders it does not show: a
 * host_read of a value comes before every op that reads the value (the
 * host uses its copy), and ops touching the same training state keep their
 * order (a GEMM folded into its accumulate touches that accumulate's
 * state). Never moved: host_reads, collectives other than the gradient
 * reductions of overlap-grad-reduce, earlier exchanges and their work.
 * Every move keeps each op after what it needs and before what needs it,
 * so the program computes exactly the values it computed before, bit for
 * bit, in every order the streams may take.
 *
 * The decision is recorded in the IR:
 *
 *   async = true, overlap_ops = n   on C: it runs on the MoE stream, with
 *       n ops (declarations not counted) beside it;
 *   beside = true                   on each moved op: the run of them just
 *       before C. Codegen records the fork event before the run
 *       (xm_rt_overlap_fork), queues C on the MoE stream
 *       (xm_rt_overlap_begin / _end) and makes the compute stream wait
 *       (xm_rt_overlap_join) before the first op that reads a result of C.
 *
 * An exchange with nothing beside it is left alone. The memory plan keeps
 * C's operands alive up to that first reader and C's results and workspace
 * from the start of the run, so nothing beside C shares bytes with it. The
 * pass must therefore run before plan-memory (it refuses a planned module)
 * and after host-reads. The module records the exchanges given work (attr
 * overlapped_exchanges) and the ops moved beside them (overlapped_ops).
 */
#include <stdlib.h>
#include <string.h>

#include "passes/pass.h"

enum { MAX_STATES = 4 };

static const char *phase_of(const xm_ir_op_t *op) {
  return xm_ir_op_get_string(op, "phase", "fwd");
}

static bool is_micro(const xm_ir_op_t *op) {
  const char *ph = phase_of(op);
  return strcmp(ph, "fwd") == 0 || strcmp(ph, "bwd") == 0;
}

/* An expert exchange this pass can run beside other work. */
static bool is_exchange(const xm_ir_op_t *op) {
  switch (op->code) {
  case XM_OP_ALL_TO_ALL:
  case XM_OP_RBD_DISPATCH:
  case XM_OP_RBD_COMBINE:
  case XM_OP_RBD_COMBINE_GRAD:
  case XM_OP_RBD_DISPATCH_GRAD: break;
  default: return false;
  }
  return is_micro(op) && !xm_ir_op_get_bool(op, "last_micro", false) &&
         !xm_ir_op_get_bool(op, "async", false) && xm_ir_op_attr(op, "layer") != NULL;
}

/* Whether the op may change place at all. */
static bool movable(const xm_ir_op_t *op) {
  if (op->code == XM_OP_HOST_READ || op->code == XM_OP_INPUT || op->code == XM_OP_RETURN)
    return false;
  if (xm_ir_op_get_bool(op, "async", false) || xm_ir_op_get_bool(op, "beside", false)) return false;
  if (xm_ir_opinfo(op->code)->flags & XM_OPF_COMM)
    return xm_ir_op_get_bool(op, "last_micro", false); /* a reduction of overlap-grad-reduce */
  return true;
}

/* The training states an op reads or writes: its state operands, and for a
 * GEMM folded into an accumulate (attr accumulate) that accumulate's state. */
static int states_of(const xm_ir_op_t *op, const xm_ir_value_t **out) {
  int n = 0;
  for (int k = 0; k < op->num_operands && n < MAX_STATES; k++) {
    const xm_ir_value_t *v = op->operands[k];
    if (v->def && v->def->code == XM_OP_STATE) out[n++] = v;
  }
  return n;
}

typedef struct {
  xm_ir_module_t *m;
  int nv;
  /* Per value id: the state a folded GEMM result is accumulated into. */
  const xm_ir_value_t **acc_state;
} ctx_t;

static int all_states(const ctx_t *c, const xm_ir_op_t *op, const xm_ir_value_t **out) {
  int n = states_of(op, out);
  if (xm_ir_op_get_bool(op, "accumulate", false) && op->num_results > 0 && n < MAX_STATES) {
    const xm_ir_value_t *s = c->acc_state[op->results[0]->id];
    if (s) out[n++] = s;
  }
  return n;
}

/* Whether b (after a in the order) must stay after a. */
static bool needs(const ctx_t *c, const xm_ir_op_t *a, const xm_ir_op_t *b) {
  for (int k = 0; k < b->num_operands; k++) {
    const xm_ir_value_t *v = b->operands[k];
    if (v->def == a) return true;
    if (a->code == XM_OP_HOST_READ && a->num_operands == 1 && a->operands[0] == v) return true;
  }
  const xm_ir_value_t *sa[MAX_STATES + 1], *sb[MAX_STATES + 1];
  int na = all_states(c, a, sa), nb = all_states(c, b, sb);
  for (int i = 0; i < na; i++)
    for (int j = 0; j < nb; j++)
      if (sa[i] == sb[j]) return true;
  return false;
}

static bool same_region(const xm_ir_op_t *a, const xm_ir_op_t *b) {
  if (xm_ir_op_is_declaration(a)) return true; /* declarations carry no code: not a boundary */
  if (strcmp(phase_of(a), phase_of(b)) != 0) return false;
  return xm_ir_op_get_int(a, "layer", -1) == xm_ir_op_get_int(b, "layer", -2);
}

/* Puts the ops at positions [lo, hi] in the order `order` (a permutation of
 * the ops there). */
static void reorder(xm_ir_module_t *m, int lo, int hi, xm_ir_op_t **order) {
  for (int p = lo; p <= hi; p++) {
    int at = p;
    while (xm_ir_module_op(m, at) != order[p - lo])
      at++;
    if (at != p) xm_ir_module_move_op(m, at, p);
  }
}

/* Gives the exchange at position c its work; returns C's new position, or
 * -1 when nothing could move (then nothing did). *moved counts the code ops
 * beside it. */
static int overlap_one(ctx_t *c, int pos, int *moved, bool *no_memory) {
  xm_ir_module_t *m = c->m;
  int n = xm_ir_module_num_ops(m);
  xm_ir_op_t *C = xm_ir_module_op(m, pos);
  int lo = pos, hi = pos;
  while (lo > 0) {
    const xm_ir_op_t *op = xm_ir_module_op(m, lo - 1);
    if (!same_region(op, C) || xm_ir_op_get_bool(op, "async", false) ||
        xm_ir_op_get_bool(op, "beside", false))
      break;
    lo--;
  }
  while (hi + 1 < n && same_region(xm_ir_module_op(m, hi + 1), C))
    hi++;
  int w = hi - lo + 1;
  xm_ir_op_t **order = malloc(sizeof *order * (size_t)w);
  bool *stay = calloc((size_t)w, sizeof *stay);
  if (!order || !stay) {
    free(order), free(stay);
    *no_memory = true;
    return -1;
  }
  int c0 = pos - lo; /* C's slot in the window */
  stay[c0] = true;
  /* Before C: an op stays when it cannot move or a staying op after it
   * (up to C) needs it. */
  for (int i = c0 - 1; i >= 0; i--) {
    xm_ir_op_t *op = xm_ir_module_op(m, lo + i);
    if (xm_ir_op_is_declaration(op) || !movable(op)) {
      stay[i] = true;
      continue;
    }
    for (int j = i + 1; j <= c0 && !stay[i]; j++)
      if (stay[j] && needs(c, op, xm_ir_module_op(m, lo + j))) stay[i] = true;
  }
  /* After C: an op moves when it can and needs no staying op between C and
   * it; declarations are taken along only for the ops that move. */
  for (int i = c0 + 1; i < w; i++) {
    xm_ir_op_t *op = xm_ir_module_op(m, lo + i);
    if (xm_ir_op_is_declaration(op)) {
      stay[i] = true; /* for now: taken along below when a moving op reads it */
      continue;
    }
    if (!movable(op)) {
      stay[i] = true;
      continue;
    }
    for (int j = c0; j < i && !stay[i]; j++) {
      const xm_ir_op_t *s = xm_ir_module_op(m, lo + j);
      if (stay[j] && !xm_ir_op_is_declaration(s) && needs(c, s, op)) stay[i] = true;
    }
  }
  for (int i = c0 + 1; i < w; i++) {
    xm_ir_op_t *op = xm_ir_module_op(m, lo + i);
    if (stay[i] || xm_ir_op_is_declaration(op)) continue;
    for (int k = 0; k < op->num_operands; k++)
      for (int j = c0 + 1; j < i; j++)
        if (xm_ir_op_is_declaration(xm_ir_module_op(m, lo + j)) &&
            op->operands[k]->def == xm_ir_module_op(m, lo + j))
          stay[j] = false;
  }
  int code = 0;
  for (int i = 0; i < w; i++)
    if (!stay[i] && !xm_ir_op_is_declaration(xm_ir_module_op(m, lo + i))) code++;
  if (code == 0) {
    free(order), free(stay);
    return -1;
  }
  /* New order: what stays before C, the moved ops before C, the moved ops
   * after C, C, what stays after C. */
  int k = 0;
  for (int i = 0; i < c0; i++)
    if (stay[i]) order[k++] = xm_ir_module_op(m, lo + i);
  for (int i = 0; i < w; i++)
    if (!stay[i]) order[k++] = xm_ir_module_op(m, lo + i);
  int new_pos = lo + k;
  order[k++] = C;
  for (int i = c0 + 1; i < w; i++)
    if (stay[i]) order[k++] = xm_ir_module_op(m, lo + i);
  for (int i = 0; i < w; i++)
    if (!stay[i]) xm_ir_op_set_bool(m, xm_ir_module_op(m, lo + i), "beside", true);
  reorder(m, lo, hi, order);
  xm_ir_op_set_bool(m, C, "async", true);
  xm_ir_op_set_int(m, C, "overlap_ops", code);
  *moved = code;
  free(order), free(stay);
  return new_pos;
}

static bool module_has_attr(const xm_ir_module_t *m, const char *key) {
  return xm_ir_module_find_attr(m, key) != NULL;
}

static xm_status_t overlap_moe_run(xm_ir_module_t *m, const xm_pass_options_t *options,
                                   xm_diag_t *diag, bool *out_changed) {
  (void)options;
  *out_changed = false;
  if (module_has_attr(m, "mem_activation_bytes")) {
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, "overlap-moe-comm",
                "the module has a memory plan already; run this pass before plan-memory%s", "");
    return XM_ERR_INVALID_INPUT;
  }
  ctx_t c = {.m = m, .nv = xm_ir_module_num_values(m)};
  size_t nv = (size_t)(c.nv ? c.nv : 1);
  c.acc_state = calloc(nv, sizeof *c.acc_state);
  if (!c.acc_state) return XM_ERR_NO_MEMORY;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->code == XM_OP_ACCUMULATE && op->num_operands == 2 &&
        xm_ir_op_get_bool(op, "folded", false))
      c.acc_state[op->operands[1]->id] = op->operands[0];
  }
  int exchanges = 0, ops = 0;
  bool no_memory = false;
  for (int i = 0; i < xm_ir_module_num_ops(m) && !no_memory; i++) {
    if (!is_exchange(xm_ir_module_op(m, i))) continue;
    int moved = 0, at = overlap_one(&c, i, &moved, &no_memory);
    if (at < 0) continue;
    exchanges++;
    ops += moved;
    i = at;
  }
  free(c.acc_state);
  if (no_memory) return XM_ERR_NO_MEMORY;
  if (exchanges == 0) return XM_OK;
  xm_ir_module_set_int(m, "overlapped_exchanges", exchanges);
  xm_ir_module_set_int(m, "overlapped_ops", ops);
  *out_changed = true;
  return XM_OK;
}

const xm_pass_info_t xm_pass_overlap_moe_comm = {
    .name = "overlap-moe-comm",
    .summary = "each expert all-to-all runs on the MoE stream beside the work of its layer "
               "that does not need it (shared experts, aux loss, router backward)",
    .option_names = NULL,
    .run = overlap_moe_run,
};
