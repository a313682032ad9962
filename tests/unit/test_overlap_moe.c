/* tests/unit/test_overlap_moe.c — the overlap-moe-comm pass on the tiny
 * sample, checked against the same pipeline without it, for four layouts
 * (EP over all-to-all, EP with TP and SSMB and RBD across two nodes, TP
 * and SSMB over all-to-all, EP 4 with ZeRO-1 and RBD).
 *
 * What is asserted, independently of how the pass decides:
 *   - some exchanges were given work, and the module attrs count them;
 *   - the program computes the same thing: the same ops with the same
 *     operands, every operand defined before its use, and for every
 *     training state the same sequence of ops touching it (a GEMM folded
 *     into an accumulate counts as touching the accumulate's state);
 *   - each async exchange is a collective preceded by a non-empty run of
 *     beside ops, none of which is a host_read or a collective other than a
 *     last-micro gradient reduction;
 *   - the memory plan keeps the exchange apart from what runs beside it:
 *     from the fork (the run's first op) to the join (the first reader of
 *     the exchange's results) no other op writes a byte the exchange reads
 *     or writes, nor reads a byte the exchange writes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/spec.h"
#include "ir/ir.h"
#include "ir/model.h"
#include "passes/pass.h"

#define TAIL                                                                                       \
  ",fuse-permute-gemm,fuse-lm-head,autodiff{grad-accum=2 aux-free-gamma=0.0},"                     \
  "canonicalize,fold-accumulate,overlap-grad-reduce,host-reads,kernel-workspace,"                  \
  "routed-rows"

static const char *const k_layouts[] = {
    "shard{dp=2 tp=1 ep=2 ssmb=0 rbd=0 zero=0 ranks-per-node=0 dispatch-bound=4}",
    "shard{dp=2 tp=2 ep=4 ssmb=1 rbd=1 zero=0 ranks-per-node=2 dispatch-bound=4}",
    "shard{dp=1 tp=2 ep=2 ssmb=1 rbd=0 zero=0 ranks-per-node=0 dispatch-bound=4}",
    "shard{dp=4 tp=1 ep=4 ssmb=0 rbd=1 zero=1 ranks-per-node=2 dispatch-bound=4}",
};

static xm_ir_module_t *lower(const char *layout, bool overlap) {
  xm_spec_t spec;
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(xm_spec_load_file(XM_SOURCE_DIR "/samples/tiny.json", &d, &spec), XM_OK);
  xm_ir_module_t *m = NULL;
  assert_int_equal(xm_ir_build_model(&spec, "tiny.json", &d, &m), XM_OK);
  char pipeline[1024];
  snprintf(pipeline, sizeof pipeline, "%s" TAIL "%s,plan-memory,schedule", layout,
           overlap ? ",overlap-moe-comm" : "");
  xm_pass_manager_options_t po;
  xm_pass_manager_options_default(&po);
  xm_status_t st = xm_pass_pipeline_run(m, pipeline, &po, &d);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  xm_diag_free(&d);
  return m;
}

static bool is_decl(const xm_ir_op_t *op) {
  return op->code == XM_OP_PARAM || op->code == XM_OP_STATE;
}

/* "code:operand ids>result ids", the identity of an op in both modules
 * (the pass makes no values, so ids agree). */
static void key_of(const xm_ir_op_t *op, char *out, size_t n) {
  int k = snprintf(out, n, "%d:", (int)op->code);
  for (int i = 0; i < op->num_operands && k < (int)n; i++)
    k += snprintf(out + k, n - (size_t)k, "%d,", op->operands[i]->id);
  if (k < (int)n) k += snprintf(out + k, n - (size_t)k, ">");
  for (int i = 0; i < op->num_results && k < (int)n; i++)
    k += snprintf(out + k, n - (size_t)k, "%d,", op->results[i]->id);
}

static int find_key(const xm_ir_module_t *m, const char *key) {
  char buf[512];
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    key_of(xm_ir_module_op(m, i), buf, sizeof buf);
    if (strcmp(buf, key) == 0) return i;
  }
  return -1;
}

/* The state (value id) an op touches, -1 for none: a state operand, or the
 * state of the folded accumulate that reads a GEMM's result. At most one
 * in these programs. */
static int state_touched(const xm_ir_module_t *m, const xm_ir_op_t *op) {
  for (int k = 0; k < op->num_operands; k++)
    if (op->operands[k]->def && op->operands[k]->def->code == XM_OP_STATE)
      return op->operands[k]->id;
  if (!xm_ir_op_get_bool(op, "accumulate", false) || op->num_results < 1) return -1;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *a = xm_ir_module_op(m, i);
    if (a->code == XM_OP_ACCUMULATE && a->num_operands == 2 && a->operands[1] == op->results[0])
      return a->operands[0]->id;
  }
  return -1;
}

/* The sequence of op keys touching state `s`, joined. */
static void state_sequence(const xm_ir_module_t *m, int s, char *out, size_t n) {
  size_t k = 0;
  out[0] = 0;
  char buf[512];
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (state_touched(m, op) != s) continue;
    key_of(op, buf, sizeof buf);
    int w = snprintf(out + k, n - k, "%s;", buf);
    assert_true(w > 0 && (size_t)w < n - k);
    k += (size_t)w;
  }
}

typedef struct {
  int64_t lo, hi; /* [lo, hi) in the activation arena */
} range_t;

/* Activation-arena ranges of a value (its mem record) and of an op's
 * workspace (attr ws = [offset, bytes]). */
static int value_range(const xm_ir_value_t *v, range_t *out) {
  const xm_ir_attr_t *mem = xm_ir_op_attr(v->def, "mem");
  assert_non_null(mem);
  assert_true(mem->n >= 3 * (v->index + 1));
  const int64_t *r = mem->ints + 3 * v->index;
  if (r[0] != 1 || r[2] == 0) return 0; /* persistent, or no bytes */
  *out = (range_t){r[1], r[1] + r[2]};
  return 1;
}

static int ws_range(const xm_ir_op_t *op, range_t *out) {
  const xm_ir_attr_t *ws = xm_ir_op_attr(op, "ws");
  if (!ws || ws->n != 2 || ws->ints[1] == 0) return 0;
  *out = (range_t){ws->ints[0], ws->ints[0] + ws->ints[1]};
  return 1;
}

static bool overlap(range_t a, range_t b) { return a.lo < b.hi && b.lo < a.hi; }

static void check_layout(const char *layout) {
  xm_ir_module_t *m = lower(layout, true), *m0 = lower(layout, false);
  int n = xm_ir_module_num_ops(m);
  assert_int_equal(n, xm_ir_module_num_ops(m0));
  assert_int_equal(xm_ir_module_get_int(m0, "overlapped_exchanges", 0), 0);
  /* The same ops, operands defined first. */
  char key[512];
  for (int i = 0; i < n; i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    key_of(op, key, sizeof key);
    assert_true(find_key(m0, key) >= 0);
    for (int k = 0; k < op->num_operands; k++) {
      int at = -1;
      for (int j = 0; j < n && at < 0; j++)
        if (xm_ir_module_op(m, j) == op->operands[k]->def) at = j;
      assert_true(at >= 0 && at < i);
    }
  }
  /* Every state is touched in the same order. */
  static char seq[1 << 16], seq0[1 << 16];
  for (int i = 0; i < n; i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->code != XM_OP_STATE) continue;
    state_sequence(m, op->results[0]->id, seq, sizeof seq);
    state_sequence(m0, op->results[0]->id, seq0, sizeof seq0);
    assert_string_equal(seq, seq0);
  }
  /* The exchanges and what runs beside them. */
  int exchanges = 0, beside_ops = 0;
  for (int c = 0; c < n; c++) {
    const xm_ir_op_t *C = xm_ir_module_op(m, c);
    if (!xm_ir_op_get_bool(C, "async", false)) continue;
    exchanges++;
    assert_true(xm_ir_opinfo(C->code)->flags & XM_OPF_COMM);
    assert_false(xm_ir_op_get_bool(C, "last_micro", false));
    int f = c, code = 0;
    while (f > 0 && xm_ir_op_get_bool(xm_ir_module_op(m, f - 1), "beside", false)) {
      const xm_ir_op_t *b = xm_ir_module_op(m, f - 1);
      assert_int_not_equal(b->code, XM_OP_HOST_READ);
      if (xm_ir_opinfo(b->code)->flags & XM_OPF_COMM)
        assert_true(xm_ir_op_get_bool(b, "last_micro", false));
      code += !is_decl(b);
      f--;
    }
    assert_true(code > 0);
    assert_int_equal(code, xm_ir_op_get_int(C, "overlap_ops", -1));
    beside_ops += code;
    int join = n;
    for (int j = c + 1; j < n && join == n; j++) {
      const xm_ir_op_t *u = xm_ir_module_op(m, j);
      for (int k = 0; k < u->num_operands; k++)
        if (u->operands[k]->def == C) join = j;
    }
    assert_true(join < n); /* the exchange's results are read */
    range_t reads[8], writes[8], r;
    int nr = 0, nw = 0;
    for (int k = 0; k < C->num_operands && nr < 8; k++)
      if (value_range(C->operands[k], &r)) reads[nr++] = r;
    for (int k = 0; k < C->num_results && nw < 7; k++)
      if (value_range(C->results[k], &r)) writes[nw++] = r;
    if (ws_range(C, &r)) writes[nw++] = r;
    for (int j = f; j < join; j++) {
      const xm_ir_op_t *o = xm_ir_module_op(m, j);
      if (j == c || is_decl(o)) continue;
      range_t ow[8], orr[8];
      int now = 0, nor = 0;
      for (int k = 0; k < o->num_results && now < 7; k++)
        if (value_range(o->results[k], &r)) ow[now++] = r;
      if (ws_range(o, &r)) ow[now++] = r;
      for (int k = 0; k < o->num_operands && nor < 8; k++)
        if (value_range(o->operands[k], &r)) orr[nor++] = r;
      for (int a = 0; a < now; a++) {
        for (int b = 0; b < nr; b++)
          assert_false(overlap(ow[a], reads[b]));
        for (int b = 0; b < nw; b++)
          assert_false(overlap(ow[a], writes[b]));
      }
      for (int a = 0; a < nor; a++)
        for (int b = 0; b < nw; b++)
          assert_false(overlap(orr[a], writes[b]));
    }
  }
  assert_true(exchanges > 0);
  assert_int_equal(exchanges, xm_ir_module_get_int(m, "overlapped_exchanges", 0));
  assert_int_equal(beside_ops, xm_ir_module_get_int(m, "overlapped_ops", 0));
  xm_ir_module_destroy(m);
  xm_ir_module_destroy(m0);
}

static void test_ep_all_to_all(void **state) {
  (void)state;
  check_layout(k_layouts[0]);
}

static void test_ssmb_rbd(void **state) {
  (void)state;
  check_layout(k_layouts[1]);
}

static void test_tp_ssmb_all_to_all(void **state) {
  (void)state;
  check_layout(k_layouts[2]);
}

static void test_ep4_zero1_rbd(void **state) {
  (void)state;
  check_layout(k_layouts[3]);
}

/* The shared experts of the forward run beside the first exchange of
 * their layer: the dispatch. */
static void test_shared_experts_beside_dispatch(void **state) {
  (void)state;
  xm_ir_module_t *m = lower(k_layouts[0], true);
  int shared_beside = 0, shared = 0;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->code != XM_OP_MATMUL || strcmp(op->loc, "/moe/shared_experts") != 0) continue;
    shared++;
    if (!xm_ir_op_get_bool(op, "beside", false)) continue;
    shared_beside++;
    int c = i + 1;
    while (!xm_ir_op_get_bool(xm_ir_module_op(m, c), "async", false))
      c++;
    const xm_ir_op_t *C = xm_ir_module_op(m, c);
    assert_int_equal(C->code, XM_OP_ALL_TO_ALL);
    assert_string_equal(xm_ir_op_get_string(C, "traffic", ""), "dispatch");
  }
  assert_int_equal(shared, 9); /* three MoE layers, three GEMMs each */
  assert_int_equal(shared_beside, shared);
  xm_ir_module_destroy(m);
}

/* A planned module is refused: moving ops would invalidate the plan. */
static void test_refuses_planned_module(void **state) {
  (void)state;
  xm_ir_module_t *m = lower(k_layouts[0], false);
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(xm_pass_pipeline_run(m, "overlap-moe-comm", NULL, &d), XM_ERR_INVALID_INPUT);
  assert_true(xm_diag_error_count(&d) > 0);
  xm_diag_free(&d);
  xm_ir_module_destroy(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ep_all_to_all),
      cmocka_unit_test(test_ssmb_rbd),
      cmocka_unit_test(test_tp_ssmb_all_to_all),
      cmocka_unit_test(test_ep4_zero1_rbd),
      cmocka_unit_test(test_shared_experts_beside_dispatch),
      cmocka_unit_test(test_refuses_planned_module),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
