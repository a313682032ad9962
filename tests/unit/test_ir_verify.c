/* tests/unit/test_ir_verify.c — the verifier and the per-op type rules.
 *
 * Every test builds a small module through the ir.h API. Valid graphs
 * check the inferred types exactly (dims, dynamic flags, dtypes); invalid
 * ones check that the verifier fails and names the op ("op N (name) at
 * LOC") with a message that says what is wrong.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "ir/verify.h"
#include "support/diag.h"

/* ---- helpers ----------------------------------------------------------- */

typedef struct {
  xm_ir_module_t *m;
  xm_diag_t diag;
  bool verified; /* the verifier ran once; later checks read its diag */
  xm_status_t status;
} fx_t;

static int setup(void **state) {
  fx_t *f = calloc(1, sizeof *f);
  if (!f || xm_ir_module_create("t", &f->m) != XM_OK) return -1;
  xm_diag_init(&f->diag);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fx_t *f = *state;
  xm_ir_module_destroy(f->m);
  xm_diag_free(&f->diag);
  free(f);
  return 0;
}

static xm_ir_type_t mk_type(xm_dtype_t dt, int rank, const int64_t *dims) {
  return xm_ir_type_make(dt, rank, dims);
}
#define TY(dt, ...)                                                                                \
  mk_type(dt, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__})
#define SCALAR(dt) xm_ir_type_make(dt, 0, NULL)

static xm_ir_type_t dyn(xm_ir_type_t t, int i) {
  t.dynamic[i] = true;
  return t;
}

static xm_ir_value_t *input(fx_t *f, xm_ir_type_t t, const char *name) {
  xm_ir_value_t *v = xm_ir_build1(f->m, XM_OP_INPUT, 0, NULL, t, "/training");
  xm_ir_op_set_string(f->m, v->def, "name", name);
  return v;
}

static xm_ir_value_t *param(fx_t *f, xm_ir_type_t t, const char *name) {
  xm_ir_value_t *v = xm_ir_build1(f->m, XM_OP_PARAM, 0, NULL, t, "/model");
  xm_ir_op_set_string(f->m, v->def, "name", name);
  xm_ir_op_set_string(f->m, v->def, "init", "normal");
  xm_ir_op_set_float(f->m, v->def, "std", 0.02);
  return v;
}

static xm_ir_op_t *op_n(fx_t *f, xm_ir_opcode_t code, int nops, xm_ir_value_t *const *ops,
                        xm_ir_type_t t, const char *loc) {
  return xm_ir_build1(f->m, code, nops, ops, t, loc)->def;
}
#define OP(f, code, t, loc, ...)                                                                   \
  op_n(f, code, (int)(sizeof((xm_ir_value_t *[]){__VA_ARGS__}) / sizeof(xm_ir_value_t *)),         \
       (xm_ir_value_t *[]){__VA_ARGS__}, t, loc)

static void print_diag(const fx_t *f) { xm_diag_print(&f->diag, stderr); }

static void expect_ok(fx_t *f) {
  xm_status_t s = xm_ir_verify(f->m, &f->diag);
  if (s != XM_OK) print_diag(f);
  assert_int_equal(s, XM_OK);
  assert_int_equal(xm_diag_error_count(&f->diag), 0);
}

/* The verifier fails with an error at `place` whose message holds `text`.
 * It runs once per test, so error counts stay exact. */
static void expect_error(fx_t *f, const char *place, const char *text) {
  if (!f->verified) f->status = xm_ir_verify(f->m, &f->diag), f->verified = true;
  assert_int_equal(f->status, XM_ERR_INVALID_INPUT);
  for (int i = 0; i < f->diag.count; i++) {
    const xm_diag_entry_t *e = &f->diag.entries[i];
    if (e->level == XM_DIAG_ERROR && e->place && strcmp(e->place, place) == 0 &&
        strstr(e->message, text))
      return;
  }
  print_diag(f);
  fail_msg("no error at '%s' containing '%s'", place, text);
}

/* Infers the types of `op` and compares each with `want` exactly,
 * sharding included. */
static void expect_infer(fx_t *f, const xm_ir_op_t *op, int n, const xm_ir_type_t *want) {
  xm_ir_type_t got[4];
  xm_status_t s = xm_ir_infer_types(op, &f->diag, got);
  if (s != XM_OK) print_diag(f);
  assert_int_equal(s, XM_OK);
  for (int i = 0; i < n; i++) {
    assert_int_equal(got[i].dtype, want[i].dtype);
    assert_int_equal(got[i].rank, want[i].rank);
    for (int d = 0; d < want[i].rank; d++) {
      assert_int_equal(got[i].dims[d], want[i].dims[d]);
      assert_int_equal(got[i].dynamic[d], want[i].dynamic[d]);
      assert_int_equal(got[i].shard[d], want[i].shard[d]);
    }
  }
}

static void set_group(fx_t *f, xm_ir_op_t *op, const char *group, int64_t size) {
  xm_ir_op_set_string(f->m, op, "group", group);
  xm_ir_op_set_int(f->m, op, "group_size", size);
}

static xm_ir_op_t *topk(fx_t *f, xm_ir_value_t *scores, xm_ir_value_t *bias, int64_t t, int64_t k,
                        int64_t n_group, int64_t topk_group) {
  xm_ir_type_t rt[2] = {TY(XM_DT_I32, t, k), TY(XM_DT_F32, t, k)};
  xm_ir_op_t *op = xm_ir_op_append(f->m, XM_OP_TOPK_ROUTE, 2, (xm_ir_value_t *[]){scores, bias}, 2,
                                   rt, "/moe/top_k");
  xm_ir_op_set_int(f->m, op, "k", k);
  xm_ir_op_set_int(f->m, op, "n_group", n_group);
  xm_ir_op_set_int(f->m, op, "topk_group", topk_group);
  xm_ir_op_set_bool(f->m, op, "norm_topk_prob", true);
  xm_ir_op_set_float(f->m, op, "routed_scaling", 2.5);
  xm_ir_op_set_string(f->m, op, "scoring", "sigmoid");
  return op;
}

static xm_ir_op_t *permute(fx_t *f, xm_ir_value_t *ex, xm_ir_value_t *w, xm_ir_type_t n_type,
                           int64_t num_experts, int64_t capacity) {
  xm_ir_type_t rt[3] = {n_type, n_type, TY(XM_DT_I32, num_experts)};
  xm_ir_op_t *op =
      xm_ir_op_append(f->m, XM_OP_PERMUTE, 2, (xm_ir_value_t *[]){ex, w}, 3, rt, "/moe");
  xm_ir_op_set_int(f->m, op, "num_experts", num_experts);
  xm_ir_op_set_int(f->m, op, "capacity", capacity);
  return op;
}

/* ---- valid graphs, one per op family ----------------------------------- */

static void test_elementwise_ok(void **state) {
  fx_t *f = *state;
  xm_ir_type_t at = TY(XM_DT_BF16, 2, 4, 8);
  at.shard[0] = XM_AXIS_DP;
  xm_ir_value_t *a = input(f, at, "a");
  xm_ir_value_t *b = param(f, TY(XM_DT_BF16, 8), "b");
  xm_ir_op_t *add = OP(f, XM_OP_ADD, TY(XM_DT_BF16, 2, 4, 8), "/x", a, b);
  xm_ir_op_t *mul = OP(f, XM_OP_MUL, TY(XM_DT_BF16, 2, 4, 8), "", add->results[0], a);
  xm_ir_op_t *sc = OP(f, XM_OP_SCALE, TY(XM_DT_BF16, 2, 4, 8), "", mul->results[0]);
  xm_ir_op_set_float(f->m, sc, "factor", 0.5);
  xm_ir_op_t *si = OP(f, XM_OP_SILU, TY(XM_DT_BF16, 2, 4, 8), "", sc->results[0]);
  xm_ir_op_t *ge = OP(f, XM_OP_GELU, TY(XM_DT_BF16, 2, 4, 8), "", si->results[0]);
  xm_ir_op_t *sg = OP(f, XM_OP_SIGMOID, TY(XM_DT_BF16, 2, 4, 8), "", ge->results[0]);
  OP(f, XM_OP_SWIGLU, TY(XM_DT_BF16, 2, 4, 8), "", sg->results[0], si->results[0]);
  expect_ok(f);
  /* The elementwise rule carries the first operand's sharding. */
  expect_infer(f, add, 1, &at);
  xm_ir_type_t want_sg = TY(XM_DT_BF16, 2, 4, 8);
  expect_infer(f, sg, 1, &want_sg);
}

static void test_reshape(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *x = input(f, TY(XM_DT_F32, 2, 4, 8), "x");
  xm_ir_op_t *r = OP(f, XM_OP_RESHAPE, TY(XM_DT_F32, 8, 8), "", x);
  expect_ok(f);
  xm_ir_type_t want = TY(XM_DT_F32, 8, 8);
  expect_infer(f, r, 1, &want);
  OP(f, XM_OP_RESHAPE, TY(XM_DT_F32, 8, 9), "/r", x);
  OP(f, XM_OP_RESHAPE, TY(XM_DT_BF16, 64), "", x);
  expect_error(f, "op 2 (reshape) at /r", "has 72 elements but operand 0 f32[2, 4, 8] has 64");
  expect_error(f, "op 3 (reshape)", "another dtype");
}

static void test_embedding_rmsnorm_matmul_ok(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *tok = input(f, TY(XM_DT_I32, 2, 16), "tokens");
  xm_ir_value_t *tab = param(f, TY(XM_DT_BF16, 100, 32), "model.embed_tokens.weight");
  xm_ir_op_t *emb = OP(f, XM_OP_EMBEDDING, TY(XM_DT_BF16, 2, 16, 32), "/model/hidden", tok, tab);
  xm_ir_value_t *w = param(f, TY(XM_DT_F32, 32), "model.norm.weight");
  xm_ir_op_t *nrm = OP(f, XM_OP_RMSNORM, TY(XM_DT_BF16, 2, 16, 32), "", emb->results[0], w);
  xm_ir_op_set_float(f->m, nrm, "eps", 1e-6);
  xm_ir_value_t *wq = param(f, TY(XM_DT_BF16, 64, 32), "q");
  xm_ir_op_t *mm = OP(f, XM_OP_MATMUL, TY(XM_DT_BF16, 2, 16, 64), "", nrm->results[0], wq);
  expect_ok(f);
  xm_ir_type_t we = TY(XM_DT_BF16, 2, 16, 32), wm = TY(XM_DT_BF16, 2, 16, 64);
  expect_infer(f, emb, 1, &we);
  expect_infer(f, nrm, 1, &we);
  expect_infer(f, mm, 1, &wm);
}

static void test_rope_attention_ok(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *q = input(f, TY(XM_DT_BF16, 2, 16, 8, 64), "q");
  xm_ir_value_t *k = input(f, TY(XM_DT_BF16, 2, 16, 2, 64), "k");
  xm_ir_value_t *v = input(f, TY(XM_DT_BF16, 2, 16, 2, 32), "v");
  xm_ir_op_t *rq = OP(f, XM_OP_ROPE, TY(XM_DT_BF16, 2, 16, 8, 64), "", q);
  xm_ir_op_set_float(f->m, rq, "theta", 10000.0);
  xm_ir_op_t *at = OP(f, XM_OP_ATTENTION, TY(XM_DT_BF16, 2, 16, 8, 32), "", rq->results[0], k, v);
  xm_ir_op_set_float(f->m, at, "scale", 0.125);
  expect_ok(f);
  xm_ir_type_t want = TY(XM_DT_BF16, 2, 16, 8, 32);
  expect_infer(f, at, 1, &want);
}

static void test_attention_gqa_mismatch(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *q = input(f, TY(XM_DT_BF16, 2, 16, 8, 64), "q");
  xm_ir_value_t *k = input(f, TY(XM_DT_BF16, 2, 16, 3, 64), "k");
  xm_ir_value_t *v = input(f, TY(XM_DT_BF16, 2, 16, 3, 64), "v");
  xm_ir_op_t *at =
      OP(f, XM_OP_ATTENTION, TY(XM_DT_BF16, 2, 16, 8, 64), "/model/n_kv_heads", q, k, v);
  xm_ir_op_set_float(f->m, at, "scale", 0.125);
  expect_error(f, "op 3 (attention) at /model/n_kv_heads",
               "query heads 8 are not a multiple of key/value heads 3");
}

static void test_router_topk_ok(void **state) {
  fx_t *f = *state;
  xm_ir_type_t st = dyn(TY(XM_DT_F32, 32, 16), 0);
  xm_ir_value_t *lg = input(f, st, "logits");
  xm_ir_op_t *rs = OP(f, XM_OP_ROUTER_SCORE, st, "/moe/scoring", lg);
  xm_ir_op_set_string(f->m, rs, "scoring", "sigmoid");
  xm_ir_value_t *bias = param(f, TY(XM_DT_F32, 16), "bias");
  xm_ir_type_t rt[2] = {dyn(TY(XM_DT_I32, 32, 4), 0), dyn(TY(XM_DT_F32, 32, 4), 0)};
  xm_ir_op_t *tk = xm_ir_op_append(f->m, XM_OP_TOPK_ROUTE, 2,
                                   (xm_ir_value_t *[]){rs->results[0], bias}, 2, rt, "");
  xm_ir_op_set_int(f->m, tk, "k", 4);
  xm_ir_op_set_int(f->m, tk, "n_group", 4);
  xm_ir_op_set_int(f->m, tk, "topk_group", 2);
  xm_ir_op_set_bool(f->m, tk, "norm_topk_prob", false);
  xm_ir_op_set_float(f->m, tk, "routed_scaling", 1.0);
  xm_ir_op_set_string(f->m, tk, "scoring", "sigmoid");
  expect_ok(f);
  expect_infer(f, rs, 1, &st);
  expect_infer(f, tk, 2, rt); /* T's dynamic flag is carried */
}

static void test_permute_bounds(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *ex = input(f, TY(XM_DT_I32, 8, 2), "e");
  xm_ir_value_t *w = input(f, TY(XM_DT_F32, 8, 2), "w");
  xm_ir_op_t *p0 = permute(f, ex, w, TY(XM_DT_I32, 16), 4, 0);         /* dropless */
  xm_ir_op_t *p1 = permute(f, ex, w, dyn(TY(XM_DT_I32, 16), 0), 4, 5); /* capacity */
  xm_ir_value_t *exd = input(f, dyn(TY(XM_DT_I32, 8, 2), 0), "ed");
  xm_ir_value_t *wd = input(f, dyn(TY(XM_DT_F32, 8, 2), 0), "wd");
  xm_ir_op_t *p2 = permute(f, exd, wd, dyn(TY(XM_DT_I32, 16), 0), 4, 0); /* dynamic T */
  expect_ok(f);
  xm_ir_type_t w0[3] = {TY(XM_DT_I32, 16), TY(XM_DT_I32, 16), TY(XM_DT_I32, 4)};
  xm_ir_type_t w1[3] = {dyn(TY(XM_DT_I32, 16), 0), dyn(TY(XM_DT_I32, 16), 0), TY(XM_DT_I32, 4)};
  expect_infer(f, p0, 3, w0);
  expect_infer(f, p1, 3, w1);
  expect_infer(f, p2, 3, w1);
  /* A static N for a capacity-limited permute is a wrong result type. */
  permute(f, ex, w, TY(XM_DT_I32, 16), 4, 5);
  expect_error(f, "op 7 (permute) at /moe",
               "result 0 has type i32[16] but its operands give i32[?16]");
}

static void test_moe_dispatch_dynamic_chain(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *x = input(f, TY(XM_DT_BF16, 8, 32), "x");
  xm_ir_value_t *ex = input(f, TY(XM_DT_I32, 8, 2), "e");
  xm_ir_value_t *w = input(f, TY(XM_DT_F32, 8, 2), "w");
  xm_ir_op_t *p = permute(f, ex, w, dyn(TY(XM_DT_I32, 16), 0), 4, 3);
  xm_ir_op_t *g = OP(f, XM_OP_GATHER_ROWS, dyn(TY(XM_DT_BF16, 16, 32), 0), "", x, p->results[0]);
  xm_ir_op_set_int(f->m, g, "k", 2);
  xm_ir_value_t *we = param(f, TY(XM_DT_BF16, 4, 48, 32), "experts.{e}.up_proj.weight");
  xm_ir_op_t *gm = OP(f, XM_OP_GROUPED_MATMUL, dyn(TY(XM_DT_BF16, 16, 48), 0), "", g->results[0],
                      we, p->results[2]);
  xm_ir_value_t *wd = param(f, TY(XM_DT_BF16, 4, 32, 48), "experts.{e}.down_proj.weight");
  xm_ir_op_t *gd = OP(f, XM_OP_GROUPED_MATMUL, dyn(TY(XM_DT_BF16, 16, 32), 0), "", gm->results[0],
                      wd, p->results[2]);
  xm_ir_op_t *sc =
      OP(f, XM_OP_SCATTER_COMBINE, TY(XM_DT_BF16, 8, 32), "", gd->results[0], p->results[0], w);
  expect_ok(f);
  xm_ir_type_t wg = dyn(TY(XM_DT_BF16, 16, 32), 0), wgm = dyn(TY(XM_DT_BF16, 16, 48), 0);
  xm_ir_type_t wsc = TY(XM_DT_BF16, 8, 32);
  expect_infer(f, g, 1, &wg);
  expect_infer(f, gm, 1, &wgm);
  expect_infer(f, sc, 1, &wsc);
}

static void test_losses_and_return_ok(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *lg = input(f, TY(XM_DT_BF16, 2, 16, 100), "logits");
  xm_ir_value_t *lb = input(f, TY(XM_DT_I32, 2, 16), "labels");
  xm_ir_op_t *ce = OP(f, XM_OP_CROSS_ENTROPY, SCALAR(XM_DT_F32), "", lg, lb);
  xm_ir_value_t *s = input(f, TY(XM_DT_F32, 32, 16), "scores");
  xm_ir_value_t *e = input(f, TY(XM_DT_I32, 32, 4), "experts");
  xm_ir_op_t *aux = OP(f, XM_OP_AUX_LOSS, SCALAR(XM_DT_F32), "", s, e);
  xm_ir_op_set_float(f->m, aux, "alpha", 0.001);
  xm_ir_op_t *tot = OP(f, XM_OP_ADD, SCALAR(XM_DT_F32), "", ce->results[0], aux->results[0]);
  xm_ir_op_append(f->m, XM_OP_RETURN, 2, (xm_ir_value_t *[]){tot->results[0], ce->results[0]}, 0,
                  NULL, "");
  expect_ok(f);
  xm_ir_type_t want = SCALAR(XM_DT_F32);
  expect_infer(f, ce, 1, &want);
  expect_infer(f, aux, 1, &want);
}

static void test_collectives_ok(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *x = input(f, TY(XM_DT_BF16, 8, 32), "x");
  xm_ir_op_t *ar = OP(f, XM_OP_ALL_REDUCE, TY(XM_DT_BF16, 8, 32), "", x);
  set_group(f, ar, "tp", 4);
  xm_ir_op_t *ag = OP(f, XM_OP_ALL_GATHER, TY(XM_DT_BF16, 32, 32), "", ar->results[0]);
  set_group(f, ag, "sp", 4);
  xm_ir_op_set_int(f->m, ag, "dim", 0);
  xm_ir_op_t *rs = OP(f, XM_OP_REDUCE_SCATTER, TY(XM_DT_BF16, 32, 8), "", ag->results[0]);
  set_group(f, rs, "dp", 4);
  xm_ir_op_set_int(f->m, rs, "dim", 1);
  xm_ir_op_t *na = OP(f, XM_OP_NARROW, TY(XM_DT_BF16, 16, 8), "", rs->results[0]);
  set_group(f, na, "world", 2);
  xm_ir_op_set_int(f->m, na, "dim", 0);
  xm_ir_value_t *send = input(f, TY(XM_DT_I32, 4, 2), "send");
  xm_ir_value_t *recv = input(f, TY(XM_DT_I32, 4, 2), "recv");
  xm_ir_op_t *a2a =
      OP(f, XM_OP_ALL_TO_ALL, dyn(TY(XM_DT_BF16, 64, 8), 0), "", na->results[0], send, recv);
  set_group(f, a2a, "ep", 4);
  xm_ir_op_set_string(f->m, a2a, "traffic", "dispatch");
  expect_ok(f);
  xm_ir_type_t wag = TY(XM_DT_BF16, 32, 32), wrs = TY(XM_DT_BF16, 32, 8),
               wna = TY(XM_DT_BF16, 16, 8), wa2a = dyn(TY(XM_DT_BF16, 64, 8), 0);
  expect_infer(f, ag, 1, &wag);
  expect_infer(f, rs, 1, &wrs);
  expect_infer(f, na, 1, &wna);
  expect_infer(f, a2a, 1, &wa2a);
}

/* A whole MoE layer as the model builder lays it out, ending in return. */
static void test_small_moe_graph_ok(void **state) {
  fx_t *f = *state;
  const int64_t B = 2, S = 4, T = 8, H = 16, V = 50, E = 8, K = 2, F = 24;
  xm_ir_value_t *tok = input(f, TY(XM_DT_I32, B, S), "tokens");
  xm_ir_value_t *lab = input(f, TY(XM_DT_I32, B, S), "labels");
  xm_ir_value_t *x =
      OP(f, XM_OP_EMBEDDING, TY(XM_DT_F32, B, S, H), "", tok, param(f, TY(XM_DT_F32, V, H), "emb"))
          ->results[0];
  xm_ir_value_t *xt = OP(f, XM_OP_RESHAPE, TY(XM_DT_F32, T, H), "", x)->results[0];
  xm_ir_value_t *lg =
      OP(f, XM_OP_MATMUL, TY(XM_DT_F32, T, E), "", xt, param(f, TY(XM_DT_F32, E, H), "gate"))
          ->results[0];
  xm_ir_op_t *rs = OP(f, XM_OP_ROUTER_SCORE, TY(XM_DT_F32, T, E), "", lg);
  xm_ir_op_set_string(f->m, rs, "scoring", "softmax");
  xm_ir_op_t *tk = topk(f, rs->results[0], param(f, TY(XM_DT_F32, E), "bias"), T, K, 1, 1);
  xm_ir_op_t *p = permute(f, tk->results[0], tk->results[1], TY(XM_DT_I32, T * K), E, 0);
  xm_ir_op_t *g = OP(f, XM_OP_GATHER_ROWS, TY(XM_DT_F32, T * K, H), "", xt, p->results[0]);
  xm_ir_op_set_int(f->m, g, "k", K);
  xm_ir_value_t *gate = OP(f, XM_OP_GROUPED_MATMUL, TY(XM_DT_F32, T * K, F), "", g->results[0],
                           param(f, TY(XM_DT_F32, E, F, H), "g"), p->results[2])
                            ->results[0];
  xm_ir_value_t *up = OP(f, XM_OP_GROUPED_MATMUL, TY(XM_DT_F32, T * K, F), "", g->results[0],
                         param(f, TY(XM_DT_F32, E, F, H), "u"), p->results[2])
                          ->results[0];
  xm_ir_value_t *act = OP(f, XM_OP_SWIGLU, TY(XM_DT_F32, T * K, F), "", gate, up)->results[0];
  xm_ir_value_t *dn = OP(f, XM_OP_GROUPED_MATMUL, TY(XM_DT_F32, T * K, H), "", act,
                         param(f, TY(XM_DT_F32, E, H, F), "d"), p->results[2])
                          ->results[0];
  xm_ir_value_t *y =
      OP(f, XM_OP_SCATTER_COMBINE, TY(XM_DT_F32, T, H), "", dn, p->results[0], tk->results[1])
          ->results[0];
  xm_ir_value_t *h = OP(f, XM_OP_ADD, TY(XM_DT_F32, T, H), "", xt, y)->results[0];
  xm_ir_value_t *h3 = OP(f, XM_OP_RESHAPE, TY(XM_DT_F32, B, S, H), "", h)->results[0];
  xm_ir_value_t *lo =
      OP(f, XM_OP_MATMUL, TY(XM_DT_F32, B, S, V), "", h3, param(f, TY(XM_DT_F32, V, H), "lm_head"))
          ->results[0];
  xm_ir_value_t *ce = OP(f, XM_OP_CROSS_ENTROPY, SCALAR(XM_DT_F32), "", lo, lab)->results[0];
  xm_ir_op_t *aux = OP(f, XM_OP_AUX_LOSS, SCALAR(XM_DT_F32), "", rs->results[0], tk->results[0]);
  xm_ir_op_set_float(f->m, aux, "alpha", 0.01);
  xm_ir_value_t *tot = OP(f, XM_OP_ADD, SCALAR(XM_DT_F32), "", ce, aux->results[0])->results[0];
  xm_ir_op_append(f->m, XM_OP_RETURN, 2, (xm_ir_value_t *[]){tot, ce}, 0, NULL, "");
  expect_ok(f);
}

/* ---- invalid graphs ---------------------------------------------------- */

static void test_wrong_arity(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *x = input(f, TY(XM_DT_F32, 4, 8), "x");
  OP(f, XM_OP_MATMUL, TY(XM_DT_F32, 4, 8), "/m", x);
  xm_ir_op_append(f->m, XM_OP_TOPK_ROUTE, 1, &x, 1, (xm_ir_type_t[]){TY(XM_DT_I32, 4, 2)}, "");
  xm_ir_op_append(f->m, XM_OP_RETURN, 0, NULL, 0, NULL, "");
  expect_error(f, "op 1 (matmul) at /m", "has 1 operands but matmul takes 2");
  expect_error(f, "op 2 (topk_route)", "has 1 results but topk_route gives 2");
  expect_error(f, "op 3 (return)", "at least one operand");
}

static void test_matmul_inner_mismatch(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *x = input(f, TY(XM_DT_BF16, 4, 128), "x");
  xm_ir_value_t *w = param(f, TY(XM_DT_BF16, 32, 64), "w");
  OP(f, XM_OP_MATMUL, TY(XM_DT_BF16, 4, 32), "/moe/experts", x, w);
  expect_error(f, "op 2 (matmul) at /moe/experts",
               "operand 1 has inner dim 64 but operand 0 has 128");
  assert_int_equal(xm_diag_error_count(&f->diag), 1);
}

static void test_bad_broadcast(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *a = input(f, TY(XM_DT_F32, 2, 8), "a");
  xm_ir_value_t *b = input(f, TY(XM_DT_F32, 4), "b");
  xm_ir_value_t *c = input(f, TY(XM_DT_BF16, 8), "c");
  xm_ir_value_t *d = input(f, TY(XM_DT_F32, 3, 2, 8), "d");
  OP(f, XM_OP_ADD, TY(XM_DT_F32, 2, 8), "", a, b);
  OP(f, XM_OP_MUL, TY(XM_DT_F32, 2, 8), "", a, c);
  OP(f, XM_OP_ADD, TY(XM_DT_F32, 2, 8), "", a, d); /* b longer than a */
  expect_error(f, "op 4 (add)",
               "operand 1 shape f32[4] is not a trailing suffix of operand 0 shape f32[2, 8]");
  expect_error(f, "op 5 (mul)", "dtypes differ");
  expect_error(f, "op 6 (add)", "not a trailing suffix");
}

static void test_missing_attr(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *x = input(f, TY(XM_DT_F32, 4, 8), "x");
  xm_ir_value_t *w = param(f, TY(XM_DT_F32, 8), "w");
  OP(f, XM_OP_RMSNORM, TY(XM_DT_F32, 4, 8), "/model/rms_norm_eps", x, w);
  OP(f, XM_OP_SCALE, TY(XM_DT_F32, 4, 8), "", x);
  xm_ir_build1(f->m, XM_OP_INPUT, 0, NULL, TY(XM_DT_I32, 2), ""); /* no name */
  expect_error(f, "op 2 (rmsnorm) at /model/rms_norm_eps", "missing attribute 'eps' (float)");
  expect_error(f, "op 3 (scale)", "missing attribute 'factor'");
  expect_error(f, "op 4 (input)", "missing attribute 'name'");
}

static void test_wrong_attr_kind(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *x = input(f, TY(XM_DT_F32, 4, 8), "x");
  xm_ir_value_t *w = param(f, TY(XM_DT_F32, 8), "w");
  xm_ir_op_t *n = OP(f, XM_OP_RMSNORM, TY(XM_DT_F32, 4, 8), "", x, w);
  xm_ir_op_set_string(f->m, n, "eps", "1e-6");
  xm_ir_op_t *g =
      OP(f, XM_OP_GATHER_ROWS, TY(XM_DT_F32, 4, 8), "", x, input(f, TY(XM_DT_I32, 4), "i"));
  xm_ir_op_set_float(f->m, g, "k", 1.0);
  xm_ir_op_t *p = param(f, TY(XM_DT_F32, 3), "p")->def;
  xm_ir_op_set_string(f->m, p, "init", "uniform");
  xm_ir_op_set_int(f->m, p, "trainable", 1);
  expect_error(f, "op 2 (rmsnorm)", "attribute 'eps' must be float but is string");
  expect_error(f, "op 4 (gather_rows)", "attribute 'k' must be int but is float");
  expect_error(f, "op 5 (param) at /model",
               "attribute 'init' is \"uniform\" but must be one of normal, ones, zeros");
  expect_error(f, "op 5 (param) at /model", "attribute 'trainable' must be bool but is int");
}

static void test_topk_k_too_large(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *s = input(f, TY(XM_DT_F32, 32, 8), "s");
  xm_ir_value_t *b = param(f, TY(XM_DT_F32, 8), "b");
  topk(f, s, b, 32, 9, 1, 1);
  topk(f, s, b, 32, 0, 1, 1);
  expect_error(f, "op 2 (topk_route) at /moe/top_k", "attribute 'k' is 9 but must be in [1, 8]");
  expect_error(f, "op 3 (topk_route) at /moe/top_k", "attribute 'k' is 0 but must be in [1, 8]");
}

static void test_topk_groups(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *s = input(f, TY(XM_DT_F32, 32, 8), "s");
  xm_ir_value_t *b = param(f, TY(XM_DT_F32, 8), "b");
  topk(f, s, b, 32, 2, 3, 1); /* 3 does not divide 8 */
  topk(f, s, b, 32, 2, 4, 5); /* topk_group > n_group */
  topk(f, s, b, 32, 4, 4, 1); /* one kept group of 2 experts cannot give 4 */
  xm_ir_value_t *b7 = param(f, TY(XM_DT_F32, 7), "b7");
  topk(f, s, b7, 32, 2, 1, 1); /* bias length differs from E */
  expect_error(f, "op 2 (topk_route) at /moe/top_k",
               "'n_group' is 3 but must divide the expert count 8");
  expect_error(f, "op 3 (topk_route) at /moe/top_k", "'topk_group' is 5 but must be in [1, 4]");
  expect_error(f, "op 4 (topk_route) at /moe/top_k", "the 1 kept groups hold only 2 experts");
  expect_error(f, "op 6 (topk_route) at /moe/top_k",
               "operand 1 has expert count 7 but operand 0 has 8");
}

static void test_router_score_bad_scoring(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *lg = input(f, TY(XM_DT_F32, 4, 8), "l");
  xm_ir_op_t *rs = OP(f, XM_OP_ROUTER_SCORE, TY(XM_DT_F32, 4, 8), "/moe/scoring", lg);
  xm_ir_op_set_string(f->m, rs, "scoring", "relu");
  xm_ir_value_t *lb = input(f, TY(XM_DT_BF16, 4, 8), "lb");
  xm_ir_op_t *rb = OP(f, XM_OP_ROUTER_SCORE, TY(XM_DT_BF16, 4, 8), "", lb);
  xm_ir_op_set_string(f->m, rb, "scoring", "softmax");
  expect_error(f, "op 1 (router_score) at /moe/scoring", "must be one of softmax, sigmoid");
  expect_error(f, "op 3 (router_score)", "operand 0 must be f32 but has type bf16[4, 8]");
}

static void test_reduce_scatter_not_divisible(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *x = input(f, TY(XM_DT_F32, 6, 8), "x");
  xm_ir_op_t *rs = OP(f, XM_OP_REDUCE_SCATTER, TY(XM_DT_F32, 1, 8), "/plan/dp", x);
  set_group(f, rs, "dp", 4);
  xm_ir_op_set_int(f->m, rs, "dim", 0);
  xm_ir_op_t *na = OP(f, XM_OP_NARROW, TY(XM_DT_F32, 6, 8), "", x);
  set_group(f, na, "tp", 2);
  xm_ir_op_set_int(f->m, na, "dim", 2); /* out of range */
  xm_ir_op_t *ar = OP(f, XM_OP_ALL_REDUCE, TY(XM_DT_F32, 6, 8), "", x);
  set_group(f, ar, "rack", 0);
  expect_error(f, "op 1 (reduce_scatter) at /plan/dp",
               "dim 0 of operand 0 f32[6, 8] is 6, not divisible by group_size 4");
  expect_error(f, "op 2 (narrow)", "attribute 'dim' is 2 but must be in [0, 1]");
  expect_error(f, "op 3 (all_reduce)", "attribute 'group' is \"rack\"");
  expect_error(f, "op 3 (all_reduce)", "attribute 'group_size' is 0 but must be >= 1");
}

static void test_all_to_all_counts(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *x = input(f, TY(XM_DT_F32, 16, 8), "x");
  xm_ir_value_t *c2 = input(f, TY(XM_DT_I32, 2, 3), "c2");
  xm_ir_value_t *c4 = input(f, TY(XM_DT_I32, 4, 3), "c4");
  xm_ir_value_t *c4b = input(f, TY(XM_DT_I32, 4, 2), "c4b");
  xm_ir_value_t *cdyn = input(f, dyn(TY(XM_DT_I32, 4, 3), 1), "cdyn");
  xm_ir_value_t *c1 = input(f, TY(XM_DT_I32, 4), "c1");
  /* op 6: P = 2 rows but group_size 4 */
  xm_ir_op_t *a = OP(f, XM_OP_ALL_TO_ALL, dyn(TY(XM_DT_F32, 32, 8), 0), "/a", x, c2, c2);
  set_group(f, a, "ep", 4);
  xm_ir_op_set_string(f->m, a, "traffic", "dispatch");
  /* op 7: recv counts of another shape than send counts */
  a = OP(f, XM_OP_ALL_TO_ALL, dyn(TY(XM_DT_F32, 32, 8), 0), "", x, c4, c4b);
  set_group(f, a, "ep", 4);
  xm_ir_op_set_string(f->m, a, "traffic", "combine");
  /* op 8: no traffic attr; op 9: a traffic that is neither */
  a = OP(f, XM_OP_ALL_TO_ALL, dyn(TY(XM_DT_F32, 32, 8), 0), "", x, c4, c4);
  set_group(f, a, "ep", 4);
  a = OP(f, XM_OP_ALL_TO_ALL, dyn(TY(XM_DT_F32, 32, 8), 0), "", x, c4, c4);
  set_group(f, a, "ep", 4);
  xm_ir_op_set_string(f->m, a, "traffic", "both");
  /* op 10: dynamic counts; op 11: rank-1 counts (the old form) */
  a = OP(f, XM_OP_ALL_TO_ALL, dyn(TY(XM_DT_F32, 32, 8), 0), "", x, cdyn, cdyn);
  set_group(f, a, "ep", 4);
  xm_ir_op_set_string(f->m, a, "traffic", "dispatch");
  a = OP(f, XM_OP_ALL_TO_ALL, dyn(TY(XM_DT_F32, 32, 8), 0), "", x, c1, c1);
  set_group(f, a, "ep", 4);
  xm_ir_op_set_string(f->m, a, "traffic", "dispatch");
  /* op 12: two operands (the old arity) */
  a = OP(f, XM_OP_ALL_TO_ALL, dyn(TY(XM_DT_F32, 32, 8), 0), "", x, c4);
  set_group(f, a, "ep", 4);
  xm_ir_op_set_string(f->m, a, "traffic", "dispatch");
  /* op 13: a static row count (a way back that returns the rows a dispatch
   * sent; legal, the runtime checks the count) */
  a = OP(f, XM_OP_ALL_TO_ALL, TY(XM_DT_F32, 32, 8), "", x, c4, c4);
  set_group(f, a, "ep", 4);
  xm_ir_op_set_string(f->m, a, "traffic", "dispatch");
  /* op 14: the hidden size changes */
  a = OP(f, XM_OP_ALL_TO_ALL, dyn(TY(XM_DT_F32, 32, 4), 0), "", x, c4, c4);
  set_group(f, a, "ep", 4);
  xm_ir_op_set_string(f->m, a, "traffic", "dispatch");
  /* op 15: a bound of 0 rows */
  a = OP(f, XM_OP_ALL_TO_ALL, TY(XM_DT_F32, 0, 8), "", x, c4, c4);
  set_group(f, a, "ep", 4);
  xm_ir_op_set_string(f->m, a, "traffic", "dispatch");
  expect_error(f, "op 6 (all_to_all) at /a",
               "operand 1 i32[2, 3] must hold one row of counts per member of the group "
               "(group_size 4)");
  expect_error(f, "op 6 (all_to_all) at /a", "operand 2 i32[2, 3] must hold one row of counts");
  expect_error(f, "op 7 (all_to_all)",
               "operand 2 (recv counts) i32[4, 2] must have the shape of operand 1 (send counts) "
               "i32[4, 3]");
  expect_error(f, "op 8 (all_to_all)", "missing attribute 'traffic' (string)");
  expect_error(f, "op 9 (all_to_all)",
               "attribute 'traffic' is \"both\" but must be one of dispatch, combine");
  expect_error(f, "op 10 (all_to_all)", "operand 1 must have static dims but has type i32[4, ?3]");
  expect_error(f, "op 11 (all_to_all)", "operand 1 must have rank 2 but has type i32[4]");
  expect_error(f, "op 12 (all_to_all)", "has 2 operands but all_to_all takes 3");
  expect_error(f, "op 14 (all_to_all)",
               "result 0 has type f32[?32, 4] but its operands give f32[?32, 8]");
  expect_error(f, "op 15 (all_to_all)", "needs a row bound >= 1 in dim 0");
}

static void test_use_before_def(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *x = input(f, TY(XM_DT_F32, 4), "x");
  OP(f, XM_OP_SILU, TY(XM_DT_F32, 4), "/act", x);
  xm_ir_module_move_op(f->m, 1, 0); /* silu now precedes its operand */
  expect_error(f, "op 0 (silu) at /act",
               "operand 0 is used before its definition (op 1 (input) comes later)");
}

static void test_value_from_other_module(void **state) {
  fx_t *f = *state;
  xm_ir_module_t *other;
  assert_int_equal(xm_ir_module_create("other", &other), XM_OK);
  xm_ir_value_t *foreign = xm_ir_build1(other, XM_OP_INPUT, 0, NULL, TY(XM_DT_F32, 4), "");
  input(f, TY(XM_DT_F32, 4), "x");
  OP(f, XM_OP_SILU, TY(XM_DT_F32, 4), "", foreign);
  expect_error(f, "op 1 (silu)", "operand 0 is not a value of this module");
  xm_ir_module_destroy(other);
}

static void test_return_position(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *l = input(f, SCALAR(XM_DT_F32), "loss");
  xm_ir_value_t *v = input(f, TY(XM_DT_F32, 3), "v");
  xm_ir_op_append(f->m, XM_OP_RETURN, 1, &l, 0, NULL, "");
  xm_ir_op_append(f->m, XM_OP_RETURN, 1, &v, 0, NULL, "/out");
  expect_error(f, "op 2 (return)", "return must be the last op, but 1 ops follow it");
  expect_error(f, "op 3 (return) at /out", "a second return (the first is op 2)");
  expect_error(f, "op 3 (return) at /out",
               "operand 0 (the loss) must be a scalar but has type f32[3]");
}

static void test_wrong_result_type(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *x = input(f, TY(XM_DT_F32, 2, 16, 32), "x");
  xm_ir_value_t *w = param(f, TY(XM_DT_F32, 64, 32), "w");
  OP(f, XM_OP_MATMUL, TY(XM_DT_F32, 2, 16, 63), "", x, w);
  OP(f, XM_OP_MATMUL, TY(XM_DT_BF16, 2, 16, 64), "", x, w);
  OP(f, XM_OP_MATMUL, dyn(TY(XM_DT_F32, 2, 16, 64), 0), "", x, w);
  expect_error(f, "op 2 (matmul)",
               "result 0 has type f32[2, 16, 63] but its operands give f32[2, 16, 64]");
  expect_error(f, "op 3 (matmul)",
               "result 0 has type bf16[2, 16, 64] but its operands give f32[2, 16, 64]");
  expect_error(f, "op 4 (matmul)",
               "result 0 has type f32[?2, 16, 64] but its operands give f32[2, 16, 64]");
  assert_int_equal(xm_diag_error_count(&f->diag), 3);
}

static void test_gather_scatter_dynamic_bounds(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *x = input(f, TY(XM_DT_F32, 8, 16), "x");
  xm_ir_value_t *idx = input(f, dyn(TY(XM_DT_I32, 12), 0), "idx");
  xm_ir_value_t *w = input(f, TY(XM_DT_F32, 8, 2), "w");
  xm_ir_op_t *g = OP(f, XM_OP_GATHER_ROWS, TY(XM_DT_F32, 12, 16), "/g", x, idx); /* static: wrong */
  xm_ir_op_set_int(f->m, g, "k", 2);
  xm_ir_value_t *y = input(f, dyn(TY(XM_DT_F32, 20, 16), 0), "y");
  xm_ir_value_t *idx20 = input(f, dyn(TY(XM_DT_I32, 20), 0), "i20");
  OP(f, XM_OP_SCATTER_COMBINE, TY(XM_DT_F32, 8, 16), "/s", y, idx20, w); /* 20 > 8*2 */
  OP(f, XM_OP_SCATTER_COMBINE, TY(XM_DT_F32, 8, 16), "", y, idx, w);     /* N differs */
  expect_error(f, "op 3 (gather_rows) at /g",
               "result 0 has type f32[12, 16] but its operands give f32[?12, 16]");
  expect_error(f, "op 6 (scatter_combine) at /s",
               "operand 0 has ?20 rows but operand 2 f32[8, 2] has only 16 token slots");
  expect_error(f, "op 7 (scatter_combine)", "operand 1 has slot count ?12 but operand 0 has ?20");
}

static void test_grouped_matmul_mismatch(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *x = input(f, TY(XM_DT_F32, 16, 32), "x");
  xm_ir_value_t *w = param(f, TY(XM_DT_F32, 4, 48, 32), "w");
  xm_ir_value_t *tpe = input(f, TY(XM_DT_I32, 8), "tpe");
  OP(f, XM_OP_GROUPED_MATMUL, TY(XM_DT_F32, 16, 48), "", x, w, tpe);
  expect_error(f, "op 3 (grouped_matmul)", "operand 2 has expert count 8 but operand 1 has 4");
}

static void test_cross_entropy_and_aux_errors(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *lg = input(f, TY(XM_DT_F32, 2, 16, 100), "lg");
  xm_ir_value_t *lb = input(f, TY(XM_DT_I32, 2, 15), "lb");
  OP(f, XM_OP_CROSS_ENTROPY, SCALAR(XM_DT_F32), "", lg, lb);
  xm_ir_value_t *s = input(f, TY(XM_DT_F32, 32, 8), "s");
  xm_ir_value_t *e = input(f, TY(XM_DT_I32, 16, 2), "e");
  OP(f, XM_OP_AUX_LOSS, SCALAR(XM_DT_F32), "", s, e);
  expect_error(
      f, "op 2 (cross_entropy)",
      "operand 1 shape i32[2, 15] must equal the leading dims of operand 0 shape f32[2, 16, 100]");
  expect_error(f, "op 5 (aux_loss)", "missing attribute 'alpha'");
  expect_error(f, "op 5 (aux_loss)", "operand 1 has token count 16 but operand 0 has 32");
}

static void test_use_count_mismatch(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *x = input(f, TY(XM_DT_F32, 4), "x");
  OP(f, XM_OP_SILU, TY(XM_DT_F32, 4), "", x);
  x->num_uses = 3;
  expect_error(f, "op 0 (input) at /training",
               "result 0 records 3 uses but 1 operands refer to it");
}

static void test_malformed_types_no_crash(void **state) {
  fx_t *f = *state;
  xm_ir_type_t neg = TY(XM_DT_F32, 4, 8);
  neg.dims[1] = -1;
  xm_ir_type_t zero_bound = dyn(TY(XM_DT_F32, 0, 8), 0);
  xm_ir_type_t big = TY(XM_DT_F32, 1);
  big.rank = 9;
  xm_ir_value_t *a = input(f, neg, "a");
  input(f, zero_bound, "b");
  xm_ir_value_t *c = input(f, big, "c");
  OP(f, XM_OP_ADD, TY(XM_DT_F32, 4, 8), "", a, c); /* operands already reported */
  expect_error(f, "op 0 (input) at /training", "result 0 has a negative dim");
  expect_error(f, "op 1 (input) at /training",
               "result 0 has a dynamic dim with an upper bound below 1");
  expect_error(f, "op 2 (input) at /training", "result 0 has a rank outside 0..6");
  assert_int_equal(xm_diag_error_count(&f->diag), 3);
}

static void test_infer_standalone_place(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *x = input(f, TY(XM_DT_F32, 4, 128), "x");
  xm_ir_value_t *w = param(f, TY(XM_DT_F32, 32, 64), "w");
  xm_ir_op_t *mm = OP(f, XM_OP_MATMUL, TY(XM_DT_F32, 4, 32), "/moe/experts", x, w);
  xm_ir_type_t out;
  assert_int_equal(xm_ir_infer_types(mm, &f->diag, &out), XM_ERR_INVALID_INPUT);
  assert_int_equal(xm_diag_find(&f->diag, "op (matmul) at /moe/experts"), 0);
  /* Sharding of a non-elementwise result is the op's own. */
  mm->results[0]->type.shard[1] = XM_AXIS_TP;
  xm_ir_op_t *ok =
      OP(f, XM_OP_MATMUL, TY(XM_DT_F32, 4, 32), "", x, param(f, TY(XM_DT_F32, 32, 128), "w2"));
  ok->results[0]->type.shard[1] = XM_AXIS_TP;
  xm_ir_type_t want = TY(XM_DT_F32, 4, 32);
  want.shard[1] = XM_AXIS_TP;
  expect_infer(f, ok, 1, &want);
}

static void test_errors_collected(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *x = input(f, TY(XM_DT_F32, 4, 8), "x");
  OP(f, XM_OP_SILU, TY(XM_DT_F32, 4, 9), "", x);
  OP(f, XM_OP_GELU, TY(XM_DT_I32, 4, 8), "", input(f, TY(XM_DT_I32, 4, 8), "i"));
  OP(f, XM_OP_ROPE, TY(XM_DT_F32, 4, 8), "", x);
  assert_int_equal(xm_ir_verify(f->m, &f->diag), XM_ERR_INVALID_INPUT);
  assert_true(xm_diag_find(&f->diag, "op 1 (silu)") >= 0);
  assert_true(xm_diag_find(&f->diag, "op 3 (gelu)") >= 0);
  assert_true(xm_diag_find(&f->diag, "op 4 (rope)") >= 0);
  /* rope: missing theta and wrong rank */
  assert_int_equal(xm_diag_error_count(&f->diag), 4);
}

/* ---- multi-rank ops (the shard pass's collectives, ZeRO-1, RBD) -------- */

static xm_ir_value_t *state_of(fx_t *f, xm_ir_type_t t, const char *kind, const char *of) {
  xm_ir_value_t *v = xm_ir_build1(f->m, XM_OP_STATE, 0, NULL, t, "");
  char name[64];
  snprintf(name, sizeof name, "%s.%s", of, kind);
  xm_ir_op_set_string(f->m, v->def, "name", name);
  xm_ir_op_set_string(f->m, v->def, "kind", kind);
  xm_ir_op_set_string(f->m, v->def, "of", of);
  return v;
}

/* An op without results (the in-place collectives and adamw). */
static xm_ir_op_t *op_void(fx_t *f, xm_ir_opcode_t code, int nops, xm_ir_value_t *const *ops) {
  return xm_ir_op_append(f->m, code, nops, ops, 0, NULL, "");
}

static void test_all_to_all_rows_any_dtype(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *ids = input(f, dyn(TY(XM_DT_I32, 40, 3), 0), "ids");
  xm_ir_value_t *cnt = input(f, TY(XM_DT_I32, 2, 4), "cnt");
  /* the bound is the op's own: 100 rows, whatever N is */
  xm_ir_op_t *a = OP(f, XM_OP_ALL_TO_ALL, dyn(TY(XM_DT_I32, 100, 3), 0), "", ids, cnt, cnt);
  set_group(f, a, "edp", 2);
  xm_ir_op_set_string(f->m, a, "traffic", "combine");
  xm_ir_value_t *x = input(f, TY(XM_DT_F32, 8, 16), "x");
  xm_ir_op_t *b = OP(f, XM_OP_ALL_TO_ALL, dyn(TY(XM_DT_F32, 7, 16), 0), "", x, cnt, cnt);
  set_group(f, b, "ep", 2);
  xm_ir_op_set_string(f->m, b, "traffic", "dispatch");
  expect_ok(f);
  xm_ir_type_t wa = dyn(TY(XM_DT_I32, 100, 3), 0), wb = dyn(TY(XM_DT_F32, 7, 16), 0);
  expect_infer(f, a, 1, &wa);
  expect_infer(f, b, 1, &wb);
}

static void test_narrow_gather_ids(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *ids = input(f, TY(XM_DT_I32, 16, 2), "experts");
  xm_ir_op_t *na = OP(f, XM_OP_NARROW, TY(XM_DT_I32, 4, 2), "", ids);
  set_group(f, na, "tp", 4);
  xm_ir_op_set_int(f->m, na, "dim", 0);
  xm_ir_op_t *ag = OP(f, XM_OP_ALL_GATHER, TY(XM_DT_I32, 16, 2), "", na->results[0]);
  set_group(f, ag, "tp", 4);
  xm_ir_op_set_int(f->m, ag, "dim", 0);
  xm_ir_op_t *bad = OP(f, XM_OP_NARROW, TY(XM_DT_I32, 5, 2), "", ids);
  set_group(f, bad, "tp", 4);
  xm_ir_op_set_int(f->m, bad, "dim", 0);
  xm_ir_type_t wn = TY(XM_DT_I32, 4, 2), wg = TY(XM_DT_I32, 16, 2);
  expect_infer(f, na, 1, &wn);
  expect_infer(f, ag, 1, &wg);
  expect_error(f, "op 3 (narrow)", "result 0 has type i32[5, 2] but its operands give i32[4, 2]");
  assert_int_equal(xm_diag_error_count(&f->diag), 1);
}

static void test_replicate(void **state) {
  fx_t *f = *state;
  xm_ir_type_t t = TY(XM_DT_BF16, 4, 8);
  t.shard[1] = XM_AXIS_TP;
  xm_ir_value_t *x = input(f, t, "x");
  xm_ir_op_t *r = OP(f, XM_OP_REPLICATE, t, "/tp", x);
  set_group(f, r, "tp", 2);
  xm_ir_op_t *nogroup = OP(f, XM_OP_REPLICATE, t, "", x);
  xm_ir_op_set_int(f->m, nogroup, "group_size", 2);
  xm_ir_op_t *other = OP(f, XM_OP_REPLICATE, TY(XM_DT_F32, 4, 8), "", x);
  set_group(f, other, "tp", 2);
  xm_ir_op_t *badsize = OP(f, XM_OP_REPLICATE, t, "", x);
  set_group(f, badsize, "tp", 0);
  expect_infer(f, r, 1, &t); /* the sharding comes along */
  expect_error(f, "op 2 (replicate)", "missing attribute 'group' (string)");
  expect_error(f, "op 3 (replicate)",
               "result 0 has type f32[4, 8] but its operands give bf16[4, 8/tp]");
  expect_error(f, "op 4 (replicate)", "attribute 'group_size' is 0 but must be >= 1");
  assert_int_equal(xm_diag_error_count(&f->diag), 3);
}

static void test_exchange_counts(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *send = input(f, TY(XM_DT_I32, 4, 2), "send");
  xm_ir_type_t rt[2] = {TY(XM_DT_I32, 4, 2), TY(XM_DT_I32, 2)};
  xm_ir_op_t *ok = xm_ir_op_append(f->m, XM_OP_EXCHANGE_COUNTS, 1, &send, 2, rt, "/ep");
  set_group(f, ok, "ep", 4);
  expect_infer(f, ok, 2, rt);
  /* op 2: P = 4 but group_size 2; op 3: f32 counts; op 4: wrong tokens per expert */
  xm_ir_op_t *bad = xm_ir_op_append(f->m, XM_OP_EXCHANGE_COUNTS, 1, &send, 2, rt, "");
  set_group(f, bad, "ep", 2);
  xm_ir_value_t *fc = input(f, TY(XM_DT_F32, 4, 2), "fc");
  bad = xm_ir_op_append(f->m, XM_OP_EXCHANGE_COUNTS, 1, &fc, 2, rt, "");
  set_group(f, bad, "ep", 4);
  xm_ir_type_t rt2[2] = {TY(XM_DT_I32, 4, 2), TY(XM_DT_I32, 4)};
  bad = xm_ir_op_append(f->m, XM_OP_EXCHANGE_COUNTS, 1, &send, 2, rt2, "");
  set_group(f, bad, "ep", 4);
  expect_error(f, "op 2 (exchange_counts)",
               "operand 0 i32[4, 2] must hold one row of counts per member of the group "
               "(group_size 2)");
  expect_error(f, "op 4 (exchange_counts)", "operand 0 must be i32 but has type f32[4, 2]");
  expect_error(f, "op 5 (exchange_counts)",
               "result 1 has type i32[4] but its operands give i32[2]");
  assert_int_equal(xm_diag_error_count(&f->diag), 3);
}

static void test_sort_chunks(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *x = input(f, dyn(TY(XM_DT_F32, 64, 8), 0), "x");
  xm_ir_value_t *cnt = input(f, TY(XM_DT_I32, 4, 2), "cnt");
  xm_ir_op_t *s = OP(f, XM_OP_SORT_CHUNKS, dyn(TY(XM_DT_F32, 64, 8), 0), "", x, cnt);
  xm_ir_op_t *u = OP(f, XM_OP_UNSORT_CHUNKS, dyn(TY(XM_DT_F32, 64, 8), 0), "", s->results[0], cnt);
  xm_ir_type_t want = dyn(TY(XM_DT_F32, 64, 8), 0);
  expect_infer(f, s, 1, &want);
  expect_infer(f, u, 1, &want);
  xm_ir_value_t *c1 = input(f, TY(XM_DT_I32, 8), "c1");
  xm_ir_value_t *x3 = input(f, TY(XM_DT_F32, 2, 4, 8), "x3");
  OP(f, XM_OP_SORT_CHUNKS, dyn(TY(XM_DT_F32, 64, 8), 0), "", x, c1); /* op 6 */
  OP(f, XM_OP_UNSORT_CHUNKS, TY(XM_DT_F32, 2, 4, 8), "", x3, cnt);   /* op 7 */
  OP(f, XM_OP_SORT_CHUNKS, TY(XM_DT_F32, 64, 8), "", x, cnt);        /* op 8 */
  expect_error(f, "op 6 (sort_chunks)", "operand 1 must have rank 2 but has type i32[8]");
  expect_error(f, "op 7 (unsort_chunks)", "operand 0 must have rank 2 but has type f32[2, 4, 8]");
  expect_error(f, "op 8 (sort_chunks)",
               "result 0 has type f32[64, 8] but its operands give f32[?64, 8]");
  assert_int_equal(xm_diag_error_count(&f->diag), 3); /* no group attrs needed */
}

static void test_reduce_state(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *g = state_of(f, TY(XM_DT_F32, 4, 8), "grad", "w");
  xm_ir_value_t *load = state_of(f, TY(XM_DT_I32, 8), "load", "bias");
  set_group(f, op_void(f, XM_OP_REDUCE_STATE, 1, &g), "dp", 2);
  set_group(f, op_void(f, XM_OP_REDUCE_STATE, 1, &load), "world", 4);
  expect_ok(f);
  xm_ir_value_t *x = input(f, TY(XM_DT_F32, 4, 8), "x");
  xm_ir_value_t *ig = state_of(f, TY(XM_DT_I32, 8), "grad", "ids");
  set_group(f, op_void(f, XM_OP_REDUCE_STATE, 1, &x), "dp", 2);  /* op 6 */
  set_group(f, op_void(f, XM_OP_REDUCE_STATE, 1, &ig), "dp", 2); /* op 7 */
  xm_ir_op_t *nosize = op_void(f, XM_OP_REDUCE_STATE, 1, &g);    /* op 8 */
  xm_ir_op_set_string(f->m, nosize, "group", "edp");
  expect_error(f, "op 6 (reduce_state)",
               "operand 0 must be the result of a state op but comes from input");
  expect_error(f, "op 7 (reduce_state)",
               "operand 0 i32[8] must be f32 (i32 only for a load state)");
  expect_error(f, "op 8 (reduce_state)", "missing attribute 'group_size' (int)");
  assert_int_equal(xm_diag_error_count(&f->diag), 3);
}

static void test_zero_reduce_scatter_gather(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *w = param(f, TY(XM_DT_F32, 3, 5), "w");
  xm_ir_value_t *g = state_of(f, TY(XM_DT_F32, 3, 5), "grad", "w");
  /* 15 elements over 4 members: chunks of 4 (the last one 3); over 5: 3 */
  xm_ir_op_t *rs4 = OP(f, XM_OP_ZERO_REDUCE_SCATTER, TY(XM_DT_F32, 4), "", g);
  set_group(f, rs4, "dp", 4);
  xm_ir_op_t *rs5 = OP(f, XM_OP_ZERO_REDUCE_SCATTER, TY(XM_DT_F32, 3), "", g);
  set_group(f, rs5, "edp", 5);
  xm_ir_op_t *rs32 = OP(f, XM_OP_ZERO_REDUCE_SCATTER, TY(XM_DT_F32, 1), "", g);
  set_group(f, rs32, "dp", 32);
  set_group(f, op_void(f, XM_OP_ZERO_GATHER, 1, &w), "dp", 4);
  expect_ok(f);
  xm_ir_type_t w4 = TY(XM_DT_F32, 4), w5 = TY(XM_DT_F32, 3), w32 = TY(XM_DT_F32, 1);
  expect_infer(f, rs4, 1, &w4);
  expect_infer(f, rs5, 1, &w5);
  expect_infer(f, rs32, 1, &w32);

  xm_ir_value_t *ig = state_of(f, TY(XM_DT_I32, 8), "load", "b");
  xm_ir_value_t *dg = input(f, dyn(TY(XM_DT_F32, 8, 2), 0), "dg");
  xm_ir_value_t *ip = param(f, TY(XM_DT_I32, 8), "ip");
  set_group(f, OP(f, XM_OP_ZERO_REDUCE_SCATTER, TY(XM_DT_F32, 3), "", g), "dp", 4);  /* op 9 */
  set_group(f, OP(f, XM_OP_ZERO_REDUCE_SCATTER, TY(XM_DT_F32, 2), "", ig), "dp", 4); /* op 10 */
  set_group(f, OP(f, XM_OP_ZERO_REDUCE_SCATTER, TY(XM_DT_F32, 4), "", dg), "dp", 4); /* op 11 */
  set_group(f, op_void(f, XM_OP_ZERO_GATHER, 1, &g), "dp", 4);                       /* op 12 */
  set_group(f, op_void(f, XM_OP_ZERO_GATHER, 1, &ip), "dp", 4);                      /* op 13 */
  op_void(f, XM_OP_ZERO_GATHER, 1, &w);                                              /* op 14 */
  expect_error(f, "op 9 (zero_reduce_scatter)",
               "result 0 has type f32[3] but its operands give f32[4]");
  expect_error(f, "op 10 (zero_reduce_scatter)", "operand 0 must be f32 but has type i32[8]");
  expect_error(f, "op 11 (zero_reduce_scatter)",
               "operand 0 must have static dims but has type f32[?8, 2]");
  expect_error(f, "op 12 (zero_gather)",
               "operand 0 must be the result of a param op but comes from state");
  expect_error(f, "op 13 (zero_gather)", "operand 0 must be f32 but has type i32[8]");
  expect_error(f, "op 14 (zero_gather)", "missing attribute 'group' (string)");
  expect_error(f, "op 14 (zero_gather)", "missing attribute 'group_size' (int)");
  assert_int_equal(xm_diag_error_count(&f->diag), 7);
}

/* adamw(param, grad, m, v, norm_sq) with ZeRO-1 chunks and without. */
static xm_ir_op_t *adamw(fx_t *f, xm_ir_value_t *p, xm_ir_value_t *g, xm_ir_value_t *m,
                         xm_ir_value_t *v, xm_ir_value_t *ns) {
  xm_ir_op_t *op = op_void(f, XM_OP_ADAMW, 5, (xm_ir_value_t *[]){p, g, m, v, ns});
  xm_ir_op_set_bool(f->m, op, "decay", true);
  return op;
}

static void test_adamw_zero(void **state) {
  fx_t *f = *state;
  xm_ir_value_t *w = param(f, TY(XM_DT_F32, 3, 5), "w");
  xm_ir_value_t *g = state_of(f, TY(XM_DT_F32, 3, 5), "grad", "w");
  xm_ir_value_t *ns = OP(f, XM_OP_GRAD_NORM_SQ, SCALAR(XM_DT_F32), "", g)->results[0];
  xm_ir_op_t *rs = OP(f, XM_OP_ZERO_REDUCE_SCATTER, TY(XM_DT_F32, 4), "", g);
  set_group(f, rs, "dp", 4);
  xm_ir_value_t *m = state_of(f, TY(XM_DT_F32, 4), "adam_m", "w");
  xm_ir_value_t *v = state_of(f, TY(XM_DT_F32, 4), "adam_v", "w");
  set_group(f, adamw(f, w, rs->results[0], m, v, ns), "dp", 4);
  /* without the group attrs the states have the param's type */
  xm_ir_value_t *fm = state_of(f, TY(XM_DT_F32, 3, 5), "adam_m", "w");
  xm_ir_value_t *fv = state_of(f, TY(XM_DT_F32, 3, 5), "adam_v", "w");
  adamw(f, w, g, fm, fv, ns);
  /* a chunked grad state (accumulated after the reduce-scatter) is fine too */
  xm_ir_value_t *cg = state_of(f, TY(XM_DT_F32, 3), "grad", "w");
  xm_ir_value_t *m5 = state_of(f, TY(XM_DT_F32, 3), "adam_m", "w");
  xm_ir_value_t *v5 = state_of(f, TY(XM_DT_F32, 3), "adam_v", "w");
  set_group(f, adamw(f, w, cg, m5, v5, ns), "edp", 5);
  expect_ok(f);

  xm_ir_value_t *x = input(f, TY(XM_DT_F32, 4), "x");
  set_group(f, adamw(f, w, rs->results[0], fm, v, ns), "dp", 4); /* op 15: full m */
  set_group(f, adamw(f, w, x, m, v, ns), "dp", 4);               /* op 16: grad from input */
  adamw(f, w, rs->results[0], m, v, ns);                         /* op 17: chunks, no group */
  xm_ir_op_t *half = adamw(f, w, rs->results[0], m, v, ns);      /* op 18: size only */
  xm_ir_op_set_int(f->m, half, "group_size", 4);
  set_group(f, adamw(f, w, rs->results[0], m, v, ns), "dp", 2); /* op 19: chunk of 8 */
  expect_error(f, "op 15 (adamw)",
               "operand 2 has type f32[3, 5] but ZeRO-1 over group_size 4 needs the chunk f32[4] "
               "of operand 0 f32[3, 5] (ceil(15 / 4) elements)");
  expect_error(f, "op 16 (adamw)",
               "operand 1 must be the result of a state or zero_reduce_scatter op but comes from "
               "input");
  expect_error(f, "op 17 (adamw)", "operand 1 has type f32[4] but operand 0 has f32[3, 5]");
  expect_error(f, "op 17 (adamw)", "operand 1 must be the result of a state op");
  expect_error(f, "op 18 (adamw)", "missing attribute 'group' (string)");
  expect_error(f, "op 19 (adamw)", "operand 3 has type f32[4] but ZeRO-1 over group_size 2");
}

static void test_rbd_ops(void **state) {
  fx_t *f = *state;
  const int64_t T = 6, H = 8, K = 2, E = 8, P = 4, L = E / P;
  xm_ir_value_t *x = input(f, TY(XM_DT_F32, T, H), "x");
  xm_ir_value_t *ex = input(f, TY(XM_DT_I32, T, K), "experts");
  xm_ir_value_t *w = input(f, TY(XM_DT_F32, T, K), "weights");
  xm_ir_type_t rt[2] = {dyn(TY(XM_DT_F32, 48, H), 0), TY(XM_DT_I32, L)};
  xm_ir_op_t *d =
      xm_ir_op_append(f->m, XM_OP_RBD_DISPATCH, 3, (xm_ir_value_t *[]){x, ex, w}, 2, rt, "/rbd");
  set_group(f, d, "ep", P);
  xm_ir_op_set_int(f->m, d, "num_experts", E);
  xm_ir_op_set_int(f->m, d, "slot", 0);
  xm_ir_op_set_int(f->m, d, "layer", 1);
  xm_ir_value_t *rows = d->results[0], *tpe = d->results[1];
  xm_ir_op_t *c = OP(f, XM_OP_RBD_COMBINE, TY(XM_DT_F32, T, H), "", rows, w, tpe);
  set_group(f, c, "ep", P);
  xm_ir_op_set_int(f->m, c, "slot", 0);
  xm_ir_type_t gt[2] = {rt[0], TY(XM_DT_F32, T, K)};
  xm_ir_op_t *cg = xm_ir_op_append(f->m, XM_OP_RBD_COMBINE_GRAD, 4,
                                   (xm_ir_value_t *[]){c->results[0], rows, w, tpe}, 2, gt, "");
  set_group(f, cg, "ep", P);
  xm_ir_op_set_int(f->m, cg, "slot", 0);
  xm_ir_op_set_int(f->m, cg, "layer", 1);
  xm_ir_op_t *dg = OP(f, XM_OP_RBD_DISPATCH_GRAD, TY(XM_DT_F32, T, H), "", cg->results[0], tpe);
  set_group(f, dg, "ep", P);
  xm_ir_op_set_int(f->m, dg, "slot", 0);
  expect_ok(f);
  xm_ir_type_t wc = TY(XM_DT_F32, T, H);
  expect_infer(f, d, 2, rt);
  expect_infer(f, c, 1, &wc);
  expect_infer(f, cg, 2, gt);
  expect_infer(f, dg, 1, &wc);

  /* op 7: 8 experts over 3 members; op 8: weights for another token count */
  xm_ir_op_t *bad =
      xm_ir_op_append(f->m, XM_OP_RBD_DISPATCH, 3, (xm_ir_value_t *[]){x, ex, w}, 2, rt, "");
  set_group(f, bad, "ep", 3);
  xm_ir_op_set_int(f->m, bad, "num_experts", E);
  xm_ir_op_set_int(f->m, bad, "slot", 0);
  xm_ir_op_set_int(f->m, bad, "layer", 0);
  xm_ir_value_t *w5 = input(f, TY(XM_DT_F32, 5, K), "w5");
  bad = xm_ir_op_append(f->m, XM_OP_RBD_DISPATCH, 3, (xm_ir_value_t *[]){x, ex, w5}, 2, rt, "");
  set_group(f, bad, "ep", P);
  xm_ir_op_set_int(f->m, bad, "num_experts", E);
  xm_ir_op_set_int(f->m, bad, "slot", 0); /* and no layer */
  /* op 10: combine without slot */
  bad = OP(f, XM_OP_RBD_COMBINE, TY(XM_DT_F32, T, H), "", rows, w, tpe);
  set_group(f, bad, "ep", P);
  expect_error(f, "op 7 (rbd_dispatch)",
               "attribute 'num_experts' is 8 but must be a multiple of group_size 3");
  expect_error(f, "op 9 (rbd_dispatch)", "missing attribute 'layer' (int)");
  expect_error(f, "op 9 (rbd_dispatch)", "operand 2 has token count 5 but operand 0 has 6");
  expect_error(f, "op 10 (rbd_combine)", "missing attribute 'slot' (int)");
  assert_int_equal(xm_diag_error_count(&f->diag), 4);
}

int main(void) {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(test_elementwise_ok),
      T(test_reshape),
      T(test_embedding_rmsnorm_matmul_ok),
      T(test_rope_attention_ok),
      T(test_attention_gqa_mismatch),
      T(test_router_topk_ok),
      T(test_permute_bounds),
      T(test_moe_dispatch_dynamic_chain),
      T(test_losses_and_return_ok),
      T(test_collectives_ok),
      T(test_small_moe_graph_ok),
      T(test_wrong_arity),
      T(test_matmul_inner_mismatch),
      T(test_bad_broadcast),
      T(test_missing_attr),
      T(test_wrong_attr_kind),
      T(test_topk_k_too_large),
      T(test_topk_groups),
      T(test_router_score_bad_scoring),
      T(test_reduce_scatter_not_divisible),
      T(test_all_to_all_counts),
      T(test_use_before_def),
      T(test_value_from_other_module),
      T(test_return_position),
      T(test_wrong_result_type),
      T(test_gather_scatter_dynamic_bounds),
      T(test_grouped_matmul_mismatch),
      T(test_cross_entropy_and_aux_errors),
      T(test_use_count_mismatch),
      T(test_malformed_types_no_crash),
      T(test_infer_standalone_place),
      T(test_errors_collected),
      T(test_all_to_all_rows_any_dtype),
      T(test_narrow_gather_ids),
      T(test_replicate),
      T(test_exchange_counts),
      T(test_sort_chunks),
      T(test_reduce_state),
      T(test_zero_reduce_scatter_gather),
      T(test_adamw_zero),
      T(test_rbd_ops),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
