/* tests/unit/test_autodiff.c — the autodiff pass (passes/autodiff.c) and
 * the verifier rules of the training ops (ir/verify_train.c).
 *
 * Models come from xm_ir_build_model with specs filled here (every field
 * the builder reads set explicitly), small modules are built by hand with
 * the ir.h API where a property needs a graph the builder never makes
 * (pruning, a value used twice, a broadcast mul). Each test asserts the
 * structure the runtime relies on: one accumulate per trainable param, an
 * AdamW per trainable param with decay exactly on matrices, phases in
 * order, the seed value, the backward op kinds a model needs, and that the
 * result verifies. Numerical correctness of the rules is checked end to end
 * elsewhere (finite differences through the compiled program).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/spec.h"
#include "ir_fixtures.h"
#include "ir/ir.h"
#include "ir/model.h"
#include "ir/verify.h"
#include "passes/pass.h"
#include "support/diag.h"

/* ---- helpers ----------------------------------------------------------- */

static xm_ir_module_t *build(const xm_spec_t *s) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_ir_module_t *m = NULL;
  xm_status_t st = xm_ir_build_model(s, "test.json", &d, &m);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  xm_diag_free(&d);
  return m;
}

/* Runs a pipeline (the pass manager verifies after it) and verifies
 * again; returns the status, printing diagnostics on failure when `loud`. */
static xm_status_t run(xm_ir_module_t *m, const char *pipeline, bool loud, xm_diag_t *d) {
  xm_status_t st = xm_pass_pipeline_run(m, pipeline, NULL, d);
  if (st == XM_OK) st = xm_ir_verify(m, d);
  if (st != XM_OK && loud) xm_diag_print(d, stderr);
  return st;
}

static void run_ok(xm_ir_module_t *m, const char *pipeline) {
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(run(m, pipeline, true, &d), XM_OK);
  assert_int_equal(xm_diag_error_count(&d), 0);
  xm_diag_free(&d);
}

/* Runs a pipeline that must fail with INVALID_INPUT and a message that
 * contains `text`. */
static void run_bad(xm_ir_module_t *m, const char *pipeline, const char *text) {
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(xm_pass_pipeline_run(m, pipeline, NULL, &d), XM_ERR_INVALID_INPUT);
  bool found = false;
  for (int i = 0; i < d.count; i++)
    found = found || strstr(d.entries[i].message, text) != NULL;
  if (!found) xm_diag_print(&d, stderr);
  assert_true(found);
  xm_diag_free(&d);
}

static const char *str(const xm_ir_op_t *op, const char *key) {
  return xm_ir_op_get_string(op, key, "");
}

static bool is_trainable(const xm_ir_op_t *op) {
  return op->code == XM_OP_PARAM && xm_ir_op_get_bool(op, "trainable", true);
}

static xm_ir_op_t *find_param(const xm_ir_module_t *m, const char *name) {
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->code == XM_OP_PARAM && strcmp(str(op, "name"), name) == 0) return op;
  }
  return NULL;
}

/* States of a kind belonging to `of` ("" kind: any). */
static int count_states(const xm_ir_module_t *m, const char *kind, const char *of) {
  int n = 0;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->code == XM_OP_STATE && (!kind[0] || strcmp(str(op, "kind"), kind) == 0) &&
        strcmp(str(op, "of"), of) == 0)
      n++;
  }
  return n;
}

/* Accumulates whose target is the grad state of `name`. */
static int count_accumulates_of(const xm_ir_module_t *m, const char *name) {
  int n = 0;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->code != XM_OP_ACCUMULATE) continue;
    const xm_ir_op_t *st = op->operands[0]->def;
    if (strcmp(str(st, "of"), name) == 0 && strcmp(str(st, "kind"), "grad") == 0) n++;
  }
  return n;
}

static int phase_rank(const xm_ir_op_t *op) {
  const char *p = str(op, "phase");
  if (strcmp(p, "fwd") == 0) return 0;
  if (strcmp(p, "bwd") == 0) return 1;
  if (strcmp(p, "step") == 0) return 2;
  return -1;
}

/* Every op has a phase; fwd*, bwd*, step*, then the return (fwd) last. */
static void expect_phase_order(const xm_ir_module_t *m) {
  int n = xm_ir_module_num_ops(m), last = 0;
  for (int i = 0; i < n - 1; i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    int r = phase_rank(op);
    assert_true(r >= 0);
    assert_true(r >= last);
    assert_int_not_equal(op->code, XM_OP_RETURN);
    last = r;
  }
  const xm_ir_op_t *ret = xm_ir_module_op(m, n - 1);
  assert_int_equal(ret->code, XM_OP_RETURN);
  assert_string_equal(str(ret, "phase"), "fwd");
  assert_int_equal(ret->num_operands, 2);
}

/* The invariants every differentiated model has. Returns the number of
 * trainable params. */
static int expect_training_structure(const xm_ir_module_t *m) {
  int trainable = 0;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->code != XM_OP_PARAM) continue;
    const char *name = str(op, "name");
    int want = is_trainable(op) ? 1 : 0;
    trainable += want;
    if (count_accumulates_of(m, name) != want) fprintf(stderr, "param %s\n", name);
    assert_int_equal(count_accumulates_of(m, name), want);
    assert_int_equal(count_states(m, "grad", name), want);
    assert_int_equal(count_states(m, "adam_m", name), want);
    assert_int_equal(count_states(m, "adam_v", name), want);
  }
  assert_int_equal(count_ops(m, XM_OP_ADAMW), trainable);
  for (int i = 0; i < count_ops(m, XM_OP_ADAMW); i++) {
    const xm_ir_op_t *ad = nth_op(m, XM_OP_ADAMW, i);
    assert_int_equal(ad->operands[0]->def->code, XM_OP_PARAM);
    assert_true(is_trainable(ad->operands[0]->def));
    assert_int_equal(xm_ir_op_get_bool(ad, "decay", false), ad->operands[0]->type.rank >= 2);
    assert_non_null(xm_ir_op_attr(ad, "decay"));
    assert_string_equal(str(ad->operands[2]->def, "kind"), "adam_m");
    assert_string_equal(str(ad->operands[3]->def, "kind"), "adam_v");
  }
  assert_int_equal(count_ops(m, XM_OP_GRAD_NORM_SQ), 1);
  assert_int_equal(nth_op(m, XM_OP_GRAD_NORM_SQ, 0)->num_operands, trainable);
  expect_phase_order(m);
  return trainable;
}

/* The seed: the first bwd op, constant f32[] of value v. */
static void expect_seed(const xm_ir_module_t *m, double v) {
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (phase_rank(op) != 1) continue;
    assert_int_equal(op->code, XM_OP_CONSTANT);
    assert_int_equal(op->results[0]->type.rank, 0);
    assert_float_equal(xm_ir_op_get_float(op, "value", -1), v, 1e-12);
    return;
  }
  fail_msg("no bwd op");
}

static int64_t module_int(const xm_ir_module_t *m, const char *key) {
  for (int i = 0; i < xm_ir_module_num_attrs(m); i++)
    if (strcmp(xm_ir_module_attr(m, i)->key, key) == 0) return xm_ir_module_attr(m, i)->i;
  return -1;
}

/* ---- models ------------------------------------------------------------ */

static void test_tiny(void **state) {
  (void)state;
  xm_spec_t s = tiny_spec();
  xm_ir_module_t *m = build(&s);
  run_ok(m, "autodiff");
  int trainable = expect_training_structure(m);
  assert_true(trainable > 20);
  expect_seed(m, 1.0);
  assert_int_equal(module_int(m, "grad_accum"), 1);
  static const xm_ir_opcode_t kinds[] = {
      XM_OP_MATMUL_DX,         XM_OP_MATMUL_DW,          XM_OP_RMSNORM_GRAD,
      XM_OP_ROPE_GRAD,         XM_OP_ATTENTION_GRAD,     XM_OP_EMBEDDING_GRAD,
      XM_OP_SWIGLU_GRAD,       XM_OP_CROSS_ENTROPY_GRAD, XM_OP_AUX_LOSS_GRAD,
      XM_OP_ROUTER_SCORE_GRAD, XM_OP_TOPK_ROUTE_GRAD,    XM_OP_GATHER_ROWS_GRAD,
      XM_OP_GROUPED_MATMUL_DX, XM_OP_GROUPED_MATMUL_DW,  XM_OP_SCATTER_COMBINE_GRAD};
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
    if (count_ops(m, kinds[i]) == 0) fprintf(stderr, "missing %s\n", xm_ir_opinfo(kinds[i])->name);
    assert_true(count_ops(m, kinds[i]) > 0);
  }
  /* One per forward op of the kind (the model's graph needs them all). */
  assert_int_equal(count_ops(m, XM_OP_ATTENTION_GRAD), 3);
  assert_int_equal(count_ops(m, XM_OP_RMSNORM_GRAD), count_ops(m, XM_OP_RMSNORM) - 0);
  assert_int_equal(count_ops(m, XM_OP_AUX_LOSS_GRAD), 2);
  assert_int_equal(count_ops(m, XM_OP_TOPK_ROUTE_GRAD), 2);
  /* rope on q and k of every layer */
  assert_int_equal(count_ops(m, XM_OP_ROPE_GRAD), 6);
  /* the embedding's input is tokens: no gradient flows there; the first
   * layer's input gets none beyond the table's */
  assert_int_equal(count_ops(m, XM_OP_EMBEDDING_GRAD), 1);
  /* no broadcast in this model, no reduce */
  assert_int_equal(count_ops(m, XM_OP_REDUCE_TO), 0);
  /* the routed experts of 2 MoE layers: gate, up, down */
  assert_int_equal(count_ops(m, XM_OP_GROUPED_MATMUL_DW), 6);
  assert_int_equal(count_ops(m, XM_OP_ZERO), trainable);
  assert_int_equal(count_ops(m, XM_OP_AUX_FREE_UPDATE), 0);
  xm_ir_module_destroy(m);
}

/* Backward ops carry the forward op's loc and layer; the first real one is
 * the loss gradient (reverse topological order). */
static void test_locations_and_order(void **state) {
  (void)state;
  xm_spec_t s = tiny_spec();
  xm_ir_module_t *m = build(&s);
  run_ok(m, "autodiff");
  const xm_ir_op_t *ag = nth_op(m, XM_OP_ATTENTION_GRAD, 0);
  assert_string_equal(ag->loc, "/model/heads");
  assert_string_equal(str(ag, "phase"), "bwd");
  /* reverse order: the first attention_grad belongs to the last layer */
  assert_int_equal(xm_ir_op_get_int(ag, "layer", -1), 2);
  assert_int_equal(xm_ir_op_get_int(nth_op(m, XM_OP_ATTENTION_GRAD, 2), "layer", -1), 0);
  const xm_ir_op_t *ce = nth_op(m, XM_OP_CROSS_ENTROPY_GRAD, 0);
  assert_string_equal(ce->loc, "/model/vocab");
  assert_null(xm_ir_op_attr(ce, "layer"));
  /* the seed, then cross_entropy_grad directly: the loss sum needs no op */
  int pos = -1;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++)
    if (xm_ir_module_op(m, i) == ce) pos = i;
  assert_int_equal(xm_ir_module_op(m, pos - 1)->code, XM_OP_CONSTANT);
  assert_string_equal(str(xm_ir_module_op(m, pos - 1), "phase"), "bwd");
  /* every backward op of a layer param names the layer */
  const xm_ir_op_t *rs = nth_op(m, XM_OP_ROUTER_SCORE_GRAD, 0);
  assert_string_equal(str(rs, "scoring"), "softmax");
  assert_int_equal(xm_ir_op_get_int(rs, "layer", -1), 2);
  const xm_ir_op_t *gr = nth_op(m, XM_OP_GATHER_ROWS_GRAD, 0);
  assert_int_equal(xm_ir_op_get_int(gr, "k", -1), 2);
  assert_int_equal(xm_ir_op_get_int(gr, "tokens", -1), 16);
  const xm_ir_op_t *tk = nth_op(m, XM_OP_TOPK_ROUTE_GRAD, 0);
  assert_int_equal(xm_ir_op_get_int(tk, "k", -1), 2);
  assert_true(xm_ir_op_get_bool(tk, "norm_topk_prob", false));
  assert_float_equal(xm_ir_op_get_float(tk, "routed_scaling", 0), 1.0, 0);
  /* state names */
  const xm_ir_op_t *g0 = nth_op(m, XM_OP_STATE, 0);
  char want[256];
  snprintf(want, sizeof want, "%s.grad", str(g0, "of"));
  assert_string_equal(str(g0, "name"), want);
  assert_non_null(find_param(m, str(g0, "of")));
  xm_ir_module_destroy(m);
}

static void test_grad_accum(void **state) {
  (void)state;
  xm_spec_t s = tiny_spec();
  xm_ir_module_t *m = build(&s);
  run_ok(m, "autodiff{grad-accum=4}");
  expect_seed(m, 0.25);
  assert_int_equal(module_int(m, "grad_accum"), 4);
  xm_ir_module_destroy(m);

  /* the module attribute is the default */
  m = build(&s);
  xm_ir_attr_t a = {.key = "grad_accum", .kind = XM_ATTR_INT, .i = 3};
  xm_ir_module_set_attr(m, &a);
  run_ok(m, "autodiff");
  expect_seed(m, 1.0 / 3.0);
  assert_int_equal(module_int(m, "grad_accum"), 3);
  xm_ir_module_destroy(m);
}

static void test_gelu(void **state) {
  (void)state;
  xm_spec_t s = tiny_spec();
  s.moe.activation = XM_ACT_GELU;
  xm_ir_module_t *m = build(&s);
  run_ok(m, "autodiff");
  expect_training_structure(m);
  assert_int_equal(count_ops(m, XM_OP_GELU_GRAD), 2);
  /* the dense layer and the shared experts keep SwiGLU */
  assert_int_equal(count_ops(m, XM_OP_SWIGLU_GRAD), 3);
  assert_int_equal(count_ops(m, XM_OP_GROUPED_MATMUL_DW), 4);
  xm_ir_module_destroy(m);
}

/* Sigmoid routing has a frozen correction bias: no gradient, no state. */
static void test_sigmoid_groups(void **state) {
  (void)state;
  xm_spec_t s = tiny_spec();
  s.moe.scoring = XM_SCORING_SIGMOID;
  s.moe.n_group = 2;
  s.moe.topk_group = 1;
  xm_ir_module_t *m = build(&s);
  run_ok(m, "autodiff");
  expect_training_structure(m);
  const char *bias = "model.layers.1.mlp.gate.e_score_correction_bias";
  assert_non_null(find_param(m, bias));
  assert_false(is_trainable(find_param(m, bias)));
  assert_int_equal(count_states(m, "", bias), 0);
  assert_int_equal(count_accumulates_of(m, bias), 0);
  assert_string_equal(str(nth_op(m, XM_OP_ROUTER_SCORE_GRAD, 0), "scoring"), "sigmoid");
  assert_int_equal(count_ops(m, XM_OP_AUX_FREE_UPDATE), 0);
  xm_ir_module_destroy(m);
}

/* Tied embeddings: the table's two gradients are summed, then one
 * accumulate. */
static void test_tied(void **state) {
  (void)state;
  xm_spec_t s = tiny_spec();
  s.model.tied_embeddings = true;
  xm_ir_module_t *m = build(&s);
  run_ok(m, "autodiff");
  expect_training_structure(m);
  assert_null(find_param(m, "lm_head.weight"));
  const char *name = "model.embed_tokens.weight";
  assert_int_equal(count_accumulates_of(m, name), 1);
  const xm_ir_op_t *acc = NULL;
  for (int i = 0; i < count_ops(m, XM_OP_ACCUMULATE); i++) {
    const xm_ir_op_t *op = nth_op(m, XM_OP_ACCUMULATE, i);
    if (strcmp(str(op->operands[0]->def, "of"), name) == 0) acc = op;
  }
  assert_non_null(acc);
  const xm_ir_op_t *sum = acc->operands[1]->def;
  assert_int_equal(sum->code, XM_OP_ADD);
  xm_ir_opcode_t a = sum->operands[0]->def->code, b = sum->operands[1]->def->code;
  assert_true((a == XM_OP_MATMUL_DW && b == XM_OP_EMBEDDING_GRAD) ||
              (a == XM_OP_EMBEDDING_GRAD && b == XM_OP_MATMUL_DW));
  xm_ir_module_destroy(m);
}

static void test_capacity(void **state) {
  (void)state;
  xm_spec_t s = tiny_spec();
  s.moe.has_capacity = true;
  s.moe.capacity_factor = 1.25;
  xm_ir_module_t *m = build(&s);
  run_ok(m, "autodiff");
  expect_training_structure(m);
  const xm_ir_op_t *sc = nth_op(m, XM_OP_SCATTER_COMBINE_GRAD, 0);
  assert_true(sc->results[0]->type.dynamic[0]);  /* dy over the kept rows */
  assert_false(sc->results[1]->type.dynamic[0]); /* dweights [T,k] */
  const xm_ir_op_t *gr = nth_op(m, XM_OP_GATHER_ROWS_GRAD, 0);
  assert_false(gr->results[0]->type.dynamic[0]); /* dx [T,H] */
  assert_true(gr->operands[0]->type.dynamic[0]);
  xm_ir_module_destroy(m);
}

static void test_qk_norm(void **state) {
  (void)state;
  for (int mode = XM_QK_NORM_HEAD; mode <= XM_QK_NORM_FULL; mode++) {
    xm_spec_t s = tiny_spec();
    s.model.qk_norm = (xm_qk_norm_t)mode;
    xm_ir_module_t *m = build(&s);
    int fwd_norms = count_ops(m, XM_OP_RMSNORM);
    run_ok(m, "autodiff");
    expect_training_structure(m);
    assert_int_equal(count_ops(m, XM_OP_RMSNORM_GRAD), fwd_norms);
    assert_int_equal(count_accumulates_of(m, "model.layers.0.self_attn.q_norm.weight"), 1);
    assert_int_equal(count_accumulates_of(m, "model.layers.2.self_attn.k_norm.weight"), 1);
    xm_ir_module_destroy(m);
  }
}

/* q/k/v biases broadcast over [B,S]: their gradients are reduce_to. */
static void test_attention_bias(void **state) {
  (void)state;
  xm_spec_t s = tiny_spec();
  s.model.attention_bias = true;
  xm_ir_module_t *m = build(&s);
  run_ok(m, "autodiff");
  expect_training_structure(m);
  assert_int_equal(count_ops(m, XM_OP_REDUCE_TO), 9);
  const xm_ir_op_t *r = nth_op(m, XM_OP_REDUCE_TO, 0);
  assert_int_equal(r->results[0]->type.rank, 1);
  assert_int_equal(r->operands[0]->type.rank, 3);
  assert_string_equal(r->loc, "/model/attention_bias");
  const xm_ir_op_t *ad = NULL;
  for (int i = 0; i < count_ops(m, XM_OP_ADAMW); i++)
    if (strcmp(str(nth_op(m, XM_OP_ADAMW, i)->operands[0]->def, "name"),
               "model.layers.1.self_attn.k_proj.bias") == 0)
      ad = nth_op(m, XM_OP_ADAMW, i);
  assert_non_null(ad);
  assert_false(xm_ir_op_get_bool(ad, "decay", true));
  xm_ir_module_destroy(m);
}

/* The shared-expert gate: mul's per-row broadcast, differentiated by the
 * rule for mul. For each MoE layer: d(shared) = dy * gate (per row),
 * d(gate) = the row sums of dy * shared (reduce_to to [T,1]), then the
 * sigmoid's gradient and the gate weight's matmul_dw; the weight is a
 * decayed matrix with one accumulate. Under the layouts the gate is placed
 * by its role: whole, its gradient summed over dp, and over tp too when
 * SSMB runs it on the rank's token slice; without SSMB it multiplies the
 * TP-reduced shared output. */
static void test_shared_gate(void **state) {
  (void)state;
  xm_spec_t s = tiny_spec();
  s.moe.shared_expert_gate = true;
  const int64_t T = 16, H = 32;
  xm_ir_module_t *m = build(&s);
  run_ok(m, "autodiff");
  expect_training_structure(m);
  assert_int_equal(count_ops(m, XM_OP_SIGMOID_GRAD), 2);
  int row_sums = 0, row_muls = 0;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (strcmp(str(op, "phase"), "bwd") != 0) continue;
    if (op->code == XM_OP_REDUCE_TO) {
      const xm_ir_type_t *t = &op->results[0]->type;
      if (t->rank != 2 || t->dims[1] != 1) continue;
      row_sums++;
      assert_int_equal(t->dims[0], T);
      const xm_ir_op_t *prod = op->operands[0]->def; /* dy * shared, [T,H] */
      assert_int_equal(prod->code, XM_OP_MUL);
      assert_int_equal(prod->results[0]->type.dims[1], H);
      assert_int_equal(prod->operands[1]->def->code, XM_OP_MATMUL); /* the down projection */
      assert_string_equal(op->loc, "/moe/shared_expert_gate");
      /* the row sums feed the sigmoid's gradient, then the gate's weight */
      const xm_ir_value_t *r = op->results[0];
      assert_int_equal(r->num_uses, 1);
    } else if (op->code == XM_OP_MUL && op->operands[1]->type.rank == 2 &&
               op->operands[1]->type.dims[1] == 1 && op->operands[0]->type.dims[1] == H) {
      row_muls++; /* dy * gate: the shared output's gradient */
      assert_int_equal(op->operands[1]->def->code, XM_OP_SIGMOID);
    }
  }
  assert_int_equal(row_sums, 2);
  assert_int_equal(row_muls, 2);
  for (int l = 1; l <= 2; l++) {
    char name[96];
    snprintf(name, sizeof name, "model.layers.%d.mlp.shared_expert_gate.weight", l);
    assert_int_equal(count_accumulates_of(m, name), 1);
    const xm_ir_op_t *ad = NULL;
    for (int i = 0; i < count_ops(m, XM_OP_ADAMW); i++)
      if (strcmp(str(nth_op(m, XM_OP_ADAMW, i)->operands[0]->def, "name"), name) == 0)
        ad = nth_op(m, XM_OP_ADAMW, i);
    assert_non_null(ad);
    assert_true(xm_ir_op_get_bool(ad, "decay", false));
    /* its gradient: matmul_dw of the sigmoid's gradient [T,1] and the tokens */
    const xm_ir_op_t *acc = NULL;
    for (int i = 0; i < count_ops(m, XM_OP_ACCUMULATE); i++) {
      const xm_ir_op_t *a = nth_op(m, XM_OP_ACCUMULATE, i);
      if (strcmp(str(a->operands[0]->def, "of"), name) == 0) acc = a;
    }
    assert_non_null(acc);
    const xm_ir_op_t *dw = acc->operands[1]->def;
    assert_int_equal(dw->code, XM_OP_MATMUL_DW);
    assert_int_equal(dw->operands[0]->def->code, XM_OP_SIGMOID_GRAD);
    assert_int_equal(dw->operands[0]->def->operands[0]->def->code, XM_OP_REDUCE_TO);
  }
  xm_ir_module_destroy(m);

  /* tp 2 without SSMB: the gate reads the tokens without a replicate and
   * multiplies the all_reduce of the row-parallel down projection. */
  m = build(&s);
  run_ok(m, "shard{dp=2 tp=2},autodiff");
  const xm_ir_op_t *w = find_param(m, "model.layers.1.mlp.shared_expert_gate.weight");
  assert_string_equal(str(w, "reduce"), "dp");
  assert_null(xm_ir_op_attr(w, "split_group"));
  assert_int_equal(w->results[0]->type.dims[0], 1);
  assert_int_equal(w->results[0]->type.dims[1], H);
  int fwd_gates = 0;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->code != XM_OP_MUL || strcmp(str(op, "phase"), "fwd") != 0) continue;
    fwd_gates++;
    assert_int_equal(op->operands[0]->def->code, XM_OP_ALL_REDUCE);
    const xm_ir_op_t *logit = op->operands[1]->def->operands[0]->def;
    assert_int_equal(logit->code, XM_OP_MATMUL);
    assert_int_not_equal(logit->operands[0]->def->code, XM_OP_REPLICATE);
    assert_int_equal(op->results[0]->type.dims[0], T);
  }
  assert_int_equal(fwd_gates, 2);
  xm_ir_module_destroy(m);

  /* SSMB with EP and ZeRO-1: the gate runs on the rank's T/tp tokens and
   * its gradient is summed over dp and tp; its optimizer state over dp. */
  m = build(&s);
  run_ok(m, "shard{dp=2 tp=2 ep=2 ssmb=1 zero=1},autodiff");
  w = find_param(m, "model.layers.2.mlp.shared_expert_gate.weight");
  assert_string_equal(str(w, "reduce"), "dp,tp");
  assert_string_equal(str(w, "zero_group"), "dp");
  assert_null(xm_ir_op_attr(w, "split_group"));
  fwd_gates = 0;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->code != XM_OP_MUL || strcmp(str(op, "phase"), "fwd") != 0) continue;
    fwd_gates++;
    assert_int_equal(op->results[0]->type.dims[0], T / 2);
    assert_int_equal(op->operands[1]->type.dims[0], T / 2);
    assert_int_equal(op->operands[1]->type.dims[1], 1);
    const xm_ir_op_t *logit = op->operands[1]->def->operands[0]->def;
    assert_int_equal(logit->operands[0]->def->code, XM_OP_NARROW);
  }
  assert_int_equal(fwd_gates, 2);
  xm_ir_module_destroy(m);
}

static void test_aux_free(void **state) {
  (void)state;
  xm_spec_t s = tiny_spec();
  s.moe.aux_free_gamma = 0.001;
  xm_ir_module_t *m = build(&s);
  run_ok(m, "autodiff{aux-free-gamma=0.001}");
  expect_training_structure(m);
  assert_int_equal(count_ops(m, XM_OP_AUX_FREE_UPDATE), 2);
  assert_int_equal(count_ops(m, XM_OP_ZERO), count_ops(m, XM_OP_ADAMW) + 2);
  for (int l = 1; l <= 2; l++) {
    char bias[128], load[128];
    snprintf(bias, sizeof bias, "model.layers.%d.mlp.gate.e_score_correction_bias", l);
    snprintf(load, sizeof load, "model.layers.%d.mlp.gate.load", l);
    assert_int_equal(count_states(m, "load", bias), 1);
    assert_int_equal(count_states(m, "grad", bias), 0);
    const xm_ir_op_t *st = NULL;
    for (int i = 0; i < count_ops(m, XM_OP_STATE); i++)
      if (strcmp(str(nth_op(m, XM_OP_STATE, i), "name"), load) == 0) st = nth_op(m, XM_OP_STATE, i);
    assert_non_null(st);
    assert_int_equal(st->results[0]->type.dtype, XM_DT_I32);
    assert_int_equal(st->results[0]->type.dims[0], 8);
    assert_string_equal(str(st, "phase"), "bwd");
    /* accumulate (bwd), aux_free_update and zero (step) */
    assert_int_equal(st->results[0]->num_uses, 3);
  }
  const xm_ir_op_t *up = nth_op(m, XM_OP_AUX_FREE_UPDATE, 0);
  assert_float_equal(xm_ir_op_get_float(up, "gamma", 0), 0.001, 1e-15);
  assert_string_equal(str(up, "phase"), "step");
  assert_int_equal(up->operands[1]->def->code, XM_OP_STATE);
  xm_ir_module_destroy(m);

  /* gamma 0 (the default): the bias stays, nothing updates it */
  m = build(&s);
  run_ok(m, "autodiff");
  assert_int_equal(count_ops(m, XM_OP_AUX_FREE_UPDATE), 0);
  assert_int_equal(count_states(m, "load", "model.layers.1.mlp.gate.e_score_correction_bias"), 0);
  xm_ir_module_destroy(m);
}

/* ---- hand-built graphs ------------------------------------------------- */

static xm_ir_type_t ty(xm_dtype_t dt, int rank, int64_t d0, int64_t d1) {
  int64_t dims[2] = {d0, d1};
  return xm_ir_type_make(dt, rank, dims);
}

static xm_ir_value_t *source(xm_ir_module_t *m, xm_ir_opcode_t code, const char *name,
                             xm_ir_type_t t) {
  xm_ir_value_t *v = xm_ir_build1(m, code, 0, NULL, t, "/src");
  xm_ir_op_set_string(m, v->def, "name", name);
  if (code == XM_OP_PARAM) xm_ir_op_set_string(m, v->def, "init", "normal");
  return v;
}

#define V(...) ((xm_ir_value_t *[]){__VA_ARGS__})

/* x, labels inputs; y = x w1^T; u = x w2^T (dead); z = y * g (broadcast);
 * s = z + y (y used twice); loss = cross_entropy(s, labels). */
static xm_ir_module_t *pruning_module(void) {
  xm_ir_module_t *m = NULL;
  assert_int_equal(xm_ir_module_create("p", &m), XM_OK);
  xm_ir_value_t *x = source(m, XM_OP_INPUT, "x", ty(XM_DT_F32, 2, 2, 4));
  xm_ir_value_t *lab = source(m, XM_OP_INPUT, "labels", ty(XM_DT_I32, 1, 2, 0));
  xm_ir_value_t *w1 = source(m, XM_OP_PARAM, "w1", ty(XM_DT_F32, 2, 4, 4));
  xm_ir_value_t *w2 = source(m, XM_OP_PARAM, "w2", ty(XM_DT_F32, 2, 4, 4));
  xm_ir_value_t *g = source(m, XM_OP_PARAM, "g", ty(XM_DT_F32, 1, 4, 0));
  xm_ir_value_t *y = xm_ir_build1(m, XM_OP_MATMUL, 2, V(x, w1), x->type, "/y");
  xm_ir_value_t *u = xm_ir_build1(m, XM_OP_MATMUL, 2, V(x, w2), x->type, "/u");
  xm_ir_value_t *z = xm_ir_build1(m, XM_OP_MUL, 2, V(y, g), x->type, "/z");
  xm_ir_value_t *s = xm_ir_build1(m, XM_OP_ADD, 2, V(z, y), x->type, "/s");
  xm_ir_value_t *l =
      xm_ir_build1(m, XM_OP_CROSS_ENTROPY, 2, V(s, lab), ty(XM_DT_F32, 0, 0, 0), "/loss");
  xm_ir_op_append(m, XM_OP_RETURN, 2, V(l, u), 0, NULL, "/ret");
  return m;
}

static void test_pruning_and_sums(void **state) {
  (void)state;
  xm_ir_module_t *m = pruning_module();
  run_ok(m, "autodiff");
  expect_phase_order(m);
  /* w2 feeds only a returned value that is not the loss: no gradient */
  assert_int_equal(count_states(m, "", "w2"), 0);
  assert_int_equal(count_accumulates_of(m, "w1"), 1);
  assert_int_equal(count_accumulates_of(m, "g"), 1);
  assert_int_equal(count_ops(m, XM_OP_ADAMW), 2);
  assert_int_equal(nth_op(m, XM_OP_GRAD_NORM_SQ, 0)->num_operands, 2);
  /* x is an input: no matmul_dx; one matmul_dw (w1) */
  assert_int_equal(count_ops(m, XM_OP_MATMUL_DX), 0);
  assert_int_equal(count_ops(m, XM_OP_MATMUL_DW), 1);
  /* mul: dy*g for y, dy*y (then reduce_to) for g */
  int bwd_mul = 0, bwd_add = 0;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (phase_rank(op) != 1) continue;
    bwd_mul += op->code == XM_OP_MUL;
    bwd_add += op->code == XM_OP_ADD;
  }
  assert_int_equal(bwd_mul, 2);
  assert_int_equal(count_ops(m, XM_OP_REDUCE_TO), 1);
  assert_int_equal(nth_op(m, XM_OP_REDUCE_TO, 0)->results[0]->type.rank, 1);
  /* y's two contributions are summed once */
  assert_int_equal(bwd_add, 1);
  /* the matmul_dw takes that sum */
  assert_int_equal(nth_op(m, XM_OP_MATMUL_DW, 0)->operands[0]->def->code, XM_OP_ADD);
  /* decay: w1 yes, g no */
  for (int i = 0; i < 2; i++) {
    const xm_ir_op_t *ad = nth_op(m, XM_OP_ADAMW, i);
    bool is_w1 = strcmp(str(ad->operands[0]->def, "name"), "w1") == 0;
    assert_int_equal(xm_ir_op_get_bool(ad, "decay", !is_w1), is_w1);
  }
  xm_ir_module_destroy(m);
}

/* A frozen param and nothing trainable reaching the loss: no backward. */
static void test_nothing_trainable(void **state) {
  (void)state;
  xm_ir_module_t *m = pruning_module();
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->code == XM_OP_PARAM) xm_ir_op_set_bool(m, op, "trainable", false);
  }
  run_ok(m, "autodiff");
  expect_phase_order(m);
  assert_int_equal(count_ops(m, XM_OP_STATE), 0);
  assert_int_equal(count_ops(m, XM_OP_ADAMW), 0);
  assert_int_equal(count_ops(m, XM_OP_GRAD_NORM_SQ), 0);
  xm_ir_module_destroy(m);
}

static void test_bad_options_and_inputs(void **state) {
  (void)state;
  xm_ir_module_t *m = pruning_module();
  run_bad(m, "autodiff{grad-accum=0}", "grad-accum");
  run_bad(m, "autodiff{grad-accum=2x}", "grad-accum");
  run_bad(m, "autodiff{aux-free-gamma=-1}", "aux-free-gamma");
  run_bad(m, "autodiff{aux-free-gamma=nan}", "aux-free-gamma");
  /* the module was not touched by the refused runs */
  assert_int_equal(count_ops(m, XM_OP_STATE), 0);
  run_ok(m, "autodiff");
  run_bad(m, "autodiff", "already differentiated");
  xm_ir_module_destroy(m);

  assert_int_equal(xm_ir_module_create("noret", &m), XM_OK);
  source(m, XM_OP_PARAM, "w", ty(XM_DT_F32, 1, 4, 0));
  run_bad(m, "autodiff", "no return");
  xm_ir_module_destroy(m);
}

/* ---- verifier rules of the training ops -------------------------------- */

static void expect_verify_error(const xm_ir_module_t *m, const char *text) {
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(xm_ir_verify(m, &d), XM_ERR_INVALID_INPUT);
  bool found = false;
  for (int i = 0; i < d.count; i++)
    found = found || strstr(d.entries[i].message, text) != NULL;
  if (!found) xm_diag_print(&d, stderr);
  assert_true(found);
  xm_diag_free(&d);
}

static xm_ir_value_t *state_op(xm_ir_module_t *m, const char *kind, xm_ir_type_t t) {
  xm_ir_value_t *v = xm_ir_build1(m, XM_OP_STATE, 0, NULL, t, "/st");
  xm_ir_op_set_string(m, v->def, "name", "s");
  xm_ir_op_set_string(m, v->def, "kind", kind);
  xm_ir_op_set_string(m, v->def, "of", "w");
  return v;
}

static void test_verify_state_rules(void **state) {
  (void)state;
  xm_ir_module_t *m = NULL;
  assert_int_equal(xm_ir_module_create("v", &m), XM_OK);
  xm_ir_type_t t = ty(XM_DT_F32, 2, 4, 4);
  xm_ir_value_t *w = source(m, XM_OP_PARAM, "w", t);
  xm_ir_value_t *g = state_op(m, "grad", t);
  xm_ir_op_append(m, XM_OP_ACCUMULATE, 2, V(g, w), 0, NULL, "/acc");
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(xm_ir_verify(m, &d), XM_OK);
  xm_diag_free(&d);
  /* accumulate into a param (not a state) */
  xm_ir_op_append(m, XM_OP_ACCUMULATE, 2, V(w, g), 0, NULL, "/acc2");
  expect_verify_error(m, "must be the result of a state op");
  xm_ir_module_destroy(m);

  assert_int_equal(xm_ir_module_create("v2", &m), XM_OK);
  w = source(m, XM_OP_PARAM, "w", t);
  xm_ir_value_t *bad = state_op(m, "momentum", t);
  (void)bad;
  expect_verify_error(m, "attribute 'kind'");
  xm_ir_module_destroy(m);

  /* adamw with a grad of another type and a missing decay */
  assert_int_equal(xm_ir_module_create("v3", &m), XM_OK);
  w = source(m, XM_OP_PARAM, "w", t);
  g = state_op(m, "grad", ty(XM_DT_F32, 2, 4, 5));
  xm_ir_value_t *mo = state_op(m, "adam_m", t), *vo = state_op(m, "adam_v", t);
  xm_ir_value_t *ns = xm_ir_build1(m, XM_OP_GRAD_NORM_SQ, 1, V(g), ty(XM_DT_F32, 0, 0, 0), "/ns");
  xm_ir_op_append(m, XM_OP_ADAMW, 5, V(w, g, mo, vo, ns), 0, NULL, "/adamw");
  expect_verify_error(m, "operand 1 has type f32[4, 5]");
  expect_verify_error(m, "missing attribute 'decay'");
  xm_ir_module_destroy(m);

  /* i32 accumulate only into a load state */
  assert_int_equal(xm_ir_module_create("v4", &m), XM_OK);
  xm_ir_value_t *cnt = source(m, XM_OP_INPUT, "c", ty(XM_DT_I32, 1, 8, 0));
  xm_ir_value_t *ld = state_op(m, "grad", ty(XM_DT_I32, 1, 8, 0));
  xm_ir_op_append(m, XM_OP_ACCUMULATE, 2, V(ld, cnt), 0, NULL, "/acc");
  expect_verify_error(m, "i32 only for a load state");
  xm_ir_module_destroy(m);
}

static void test_verify_backward_rules(void **state) {
  (void)state;
  xm_ir_module_t *m = NULL;
  assert_int_equal(xm_ir_module_create("b", &m), XM_OK);
  xm_ir_value_t *dy = source(m, XM_OP_INPUT, "dy", ty(XM_DT_F32, 2, 6, 4));
  xm_ir_value_t *w = source(m, XM_OP_PARAM, "w", ty(XM_DT_F32, 2, 4, 3));
  /* matmul_dx: dy[6,4] w[4,3] -> [6,3]; a wrong result type is caught */
  xm_ir_build1(m, XM_OP_MATMUL_DX, 2, V(dy, w), ty(XM_DT_F32, 2, 6, 3), "/dx");
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(xm_ir_verify(m, &d), XM_OK);
  xm_diag_free(&d);
  xm_ir_build1(m, XM_OP_MATMUL_DW, 2, V(dy, dy), ty(XM_DT_F32, 2, 4, 5), "/dw");
  expect_verify_error(m, "but its operands give f32[4, 4]");
  xm_ir_module_destroy(m);

  /* reduce_to must keep a trailing suffix, or the shape with the last dim
   * 1 (the row sums: the gradient of mul's per-row factor) */
  assert_int_equal(xm_ir_module_create("r", &m), XM_OK);
  dy = source(m, XM_OP_INPUT, "dy", ty(XM_DT_F32, 2, 6, 4));
  xm_ir_build1(m, XM_OP_REDUCE_TO, 1, V(dy), ty(XM_DT_F32, 1, 4, 0), "/ok");
  xm_ir_build1(m, XM_OP_REDUCE_TO, 1, V(dy), ty(XM_DT_F32, 2, 6, 1), "/rows");
  xm_diag_init(&d);
  assert_int_equal(xm_ir_verify(m, &d), XM_OK);
  xm_diag_free(&d);
  xm_ir_build1(m, XM_OP_REDUCE_TO, 1, V(dy), ty(XM_DT_F32, 2, 3, 1), "/bad_rows");
  expect_verify_error(m, "f32[3, 1] is not a trailing suffix of operand 0 f32[6, 4] nor its "
                         "shape with the last dim 1");
  xm_ir_module_destroy(m);
  assert_int_equal(xm_ir_module_create("r1", &m), XM_OK);
  dy = source(m, XM_OP_INPUT, "dy", ty(XM_DT_F32, 2, 6, 4));
  xm_ir_build1(m, XM_OP_REDUCE_TO, 1, V(dy), ty(XM_DT_F32, 1, 6, 0), "/bad");
  expect_verify_error(m, "not a trailing suffix");
  xm_ir_module_destroy(m);

  /* mul's per-row factor: b [6,1] times a [6,4]; add has no such form, and
   * a b of another width is neither form */
  assert_int_equal(xm_ir_module_create("m", &m), XM_OK);
  xm_ir_value_t *a = source(m, XM_OP_INPUT, "a", ty(XM_DT_F32, 2, 6, 4));
  xm_ir_value_t *g = source(m, XM_OP_INPUT, "g", ty(XM_DT_F32, 2, 6, 1));
  xm_ir_build1(m, XM_OP_MUL, 2, V(a, g), ty(XM_DT_F32, 2, 6, 4), "/gate");
  xm_diag_init(&d);
  assert_int_equal(xm_ir_verify(m, &d), XM_OK);
  xm_diag_free(&d);
  xm_ir_build1(m, XM_OP_ADD, 2, V(a, g), ty(XM_DT_F32, 2, 6, 4), "/add");
  expect_verify_error(m, "operand 1 shape f32[6, 1] is not a trailing suffix of operand 0 shape "
                         "f32[6, 4]");
  xm_ir_module_destroy(m);
  assert_int_equal(xm_ir_module_create("m2", &m), XM_OK);
  a = source(m, XM_OP_INPUT, "a", ty(XM_DT_F32, 2, 6, 4));
  g = source(m, XM_OP_INPUT, "g", ty(XM_DT_F32, 2, 6, 2));
  xm_ir_build1(m, XM_OP_MUL, 2, V(a, g), ty(XM_DT_F32, 2, 6, 4), "/two");
  expect_verify_error(m, "nor its shape with the last dim 1");
  xm_ir_module_destroy(m);
  assert_int_equal(xm_ir_module_create("m3", &m), XM_OK);
  a = source(m, XM_OP_INPUT, "a", ty(XM_DT_F32, 2, 6, 4));
  g = source(m, XM_OP_INPUT, "g", ty(XM_DT_F32, 2, 3, 1));
  xm_ir_build1(m, XM_OP_MUL, 2, V(a, g), ty(XM_DT_F32, 2, 6, 4), "/rows");
  expect_verify_error(m, "nor its shape with the last dim 1");
  xm_ir_module_destroy(m);

  /* a bad phase */
  assert_int_equal(xm_ir_module_create("p", &m), XM_OK);
  dy = source(m, XM_OP_INPUT, "dy", ty(XM_DT_F32, 2, 6, 4));
  xm_ir_op_set_string(m, dy->def, "phase", "later");
  expect_verify_error(m, "attribute 'phase'");
  xm_ir_module_destroy(m);

  /* gather_rows_grad needs tokens */
  assert_int_equal(xm_ir_module_create("g", &m), XM_OK);
  dy = source(m, XM_OP_INPUT, "dy", ty(XM_DT_F32, 2, 6, 4));
  xm_ir_value_t *idx = source(m, XM_OP_INPUT, "idx", ty(XM_DT_I32, 1, 6, 0));
  xm_ir_value_t *gr =
      xm_ir_build1(m, XM_OP_GATHER_ROWS_GRAD, 2, V(dy, idx), ty(XM_DT_F32, 2, 3, 4), "/g");
  xm_ir_op_set_int(m, gr->def, "k", 2);
  expect_verify_error(m, "missing attribute 'tokens'");
  xm_ir_op_set_int(m, gr->def, "tokens", 3);
  xm_diag_init(&d);
  assert_int_equal(xm_ir_verify(m, &d), XM_OK);
  xm_diag_free(&d);
  xm_ir_module_destroy(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tiny),
      cmocka_unit_test(test_locations_and_order),
      cmocka_unit_test(test_grad_accum),
      cmocka_unit_test(test_gelu),
      cmocka_unit_test(test_sigmoid_groups),
      cmocka_unit_test(test_tied),
      cmocka_unit_test(test_capacity),
      cmocka_unit_test(test_qk_norm),
      cmocka_unit_test(test_attention_bias),
      cmocka_unit_test(test_shared_gate),
      cmocka_unit_test(test_aux_free),
      cmocka_unit_test(test_pruning_and_sums),
      cmocka_unit_test(test_nothing_trainable),
      cmocka_unit_test(test_bad_options_and_inputs),
      cmocka_unit_test(test_verify_state_rules),
      cmocka_unit_test(test_verify_backward_rules),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
