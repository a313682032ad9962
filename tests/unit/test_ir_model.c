/* tests/unit/test_ir_model.c — the forward graph built from a spec
 * (ir/model.c): op counts, parameter names and shapes against the Hugging
 * Face layout, parameter totals computed by hand, the parameters' roles,
 * routing variants, capacity's dynamic dims, locations, the shared-expert
 * gate, and the verifier's verdict.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/count.h"
#include "frontend/spec.h"
#include "ir_fixtures.h"
#include "ir/ir.h"
#include "ir/model.h"
#include "ir/verify.h"

/* ---- helpers ----------------------------------------------------------- */

/* Every field the builder reads, set explicitly (the defaults may not be
 * implemented yet). Hand counts of this spec are in test_tiny_params. */

static int64_t param_elements(const xm_ir_module_t *m);

/* Builds, asserts success and (once the verifier exists) a clean verify. */
static xm_ir_module_t *build_ok(const xm_spec_t *s) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_ir_module_t *m = NULL;
  xm_status_t st = xm_ir_build_model(s, "test.json", &d, &m);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  assert_non_null(m);
  assert_int_equal(xm_diag_error_count(&d), 0);
  st = xm_ir_verify(m, &d);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  assert_int_equal(xm_diag_error_count(&d), 0);
  xm_diag_free(&d);
  /* The graph holds exactly the tensors `xmoec check` counts (the MTP
   * modules apart). */
  {
    xm_count_t c;
    xm_count_params(s, &c);
    assert_int_equal(param_elements(m), c.total + c.mtp_total);
  }
  return m;
}

static xm_ir_op_t *find_param(const xm_ir_module_t *m, const char *name) {
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->code == XM_OP_PARAM && strcmp(xm_ir_op_get_string(op, "name", ""), name) == 0)
      return op;
  }
  return NULL;
}

/* Asserts a param exists with exactly these dims (static, f32). */
static xm_ir_op_t *expect_param(const xm_ir_module_t *m, const char *name, int rank, int64_t d0,
                                int64_t d1, int64_t d2) {
  xm_ir_op_t *op = find_param(m, name);
  if (!op) fprintf(stderr, "missing param %s\n", name);
  assert_non_null(op);
  const xm_ir_type_t *t = &op->results[0]->type;
  int64_t want[3] = {d0, d1, d2};
  assert_int_equal(t->dtype, XM_DT_F32);
  assert_int_equal(t->rank, rank);
  for (int i = 0; i < rank; i++) {
    assert_int_equal(t->dims[i], want[i]);
    assert_false(t->dynamic[i]);
  }
  return op;
}

static int64_t param_elements(const xm_ir_module_t *m) {
  int64_t total = 0;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->code == XM_OP_PARAM) total += xm_ir_type_numel(&op->results[0]->type);
  }
  return total;
}

static int64_t module_int(const xm_ir_module_t *m, const char *key) {
  for (int i = 0; i < xm_ir_module_num_attrs(m); i++) {
    const xm_ir_attr_t *a = xm_ir_module_attr(m, i);
    if (strcmp(a->key, key) == 0) return a->i;
  }
  fail_msg("module attr %s missing", key);
  return -1;
}

/* ---- the tiny spec ----------------------------------------------------- */

static void test_tiny_op_counts(void **state) {
  (void)state;
  xm_spec_t s = tiny_spec();
  xm_ir_module_t *m = build_ok(&s);
  /* 1 dense layer + 2 MoE layers; see the per-layer tally in the comments. */
  assert_int_equal(count_ops(m, XM_OP_INPUT), 2);
  assert_int_equal(count_ops(m, XM_OP_PARAM), 38);
  assert_int_equal(count_ops(m, XM_OP_EMBEDDING), 1);
  assert_int_equal(count_ops(m, XM_OP_ATTENTION), 3);
  assert_int_equal(count_ops(m, XM_OP_ROPE), 6);
  assert_int_equal(count_ops(m, XM_OP_RMSNORM), 7); /* 2 per layer + final */
  assert_int_equal(count_ops(m, XM_OP_MATMUL),
                   24); /* 12 attn, 3 dense, 2x(router+3 shared), head */
  assert_int_equal(count_ops(m, XM_OP_RESHAPE), 16); /* 4 per layer, 2 per MoE layer */
  assert_int_equal(count_ops(m, XM_OP_ADD), 10);     /* 2 residuals/layer, shared, 2 losses */
  assert_int_equal(count_ops(m, XM_OP_SWIGLU), 5);
  assert_int_equal(count_ops(m, XM_OP_GROUPED_MATMUL), 3 * 2);
  assert_int_equal(count_ops(m, XM_OP_ROUTER_SCORE), 2);
  assert_int_equal(count_ops(m, XM_OP_TOPK_ROUTE), 2);
  assert_int_equal(count_ops(m, XM_OP_PERMUTE), 2);
  assert_int_equal(count_ops(m, XM_OP_GATHER_ROWS), 2);
  assert_int_equal(count_ops(m, XM_OP_SCATTER_COMBINE), 2);
  assert_int_equal(count_ops(m, XM_OP_CONSTANT), 2); /* zero routing bias */
  assert_int_equal(count_ops(m, XM_OP_AUX_LOSS), 2);
  assert_int_equal(count_ops(m, XM_OP_CROSS_ENTROPY), 1);
  assert_int_equal(count_ops(m, XM_OP_RETURN), 1);
  assert_int_equal(count_ops(m, XM_OP_GELU), 0);
  assert_int_equal(xm_ir_module_num_ops(m),
                   2 + 38 + 1 + 3 + 6 + 7 + 24 + 16 + 10 + 5 + 6 + 2 * 6 + 2 + 1 + 1);
  xm_ir_module_destroy(m);
}

static void test_tiny_params(void **state) {
  (void)state;
  xm_spec_t s = tiny_spec();
  xm_ir_module_t *m = build_ok(&s);
  expect_param(m, "model.embed_tokens.weight", 2, 64, 32, 0);
  expect_param(m, "model.layers.0.input_layernorm.weight", 1, 32, 0, 0);
  expect_param(m, "model.layers.0.self_attn.q_proj.weight", 2, 32, 32, 0);
  expect_param(m, "model.layers.0.self_attn.k_proj.weight", 2, 16, 32, 0);
  expect_param(m, "model.layers.0.self_attn.v_proj.weight", 2, 16, 32, 0);
  expect_param(m, "model.layers.2.self_attn.o_proj.weight", 2, 32, 32, 0);
  expect_param(m, "model.layers.1.post_attention_layernorm.weight", 1, 32, 0, 0);
  expect_param(m, "model.layers.0.mlp.gate_proj.weight", 2, 48, 32, 0);
  expect_param(m, "model.layers.0.mlp.up_proj.weight", 2, 48, 32, 0);
  expect_param(m, "model.layers.0.mlp.down_proj.weight", 2, 32, 48, 0);
  expect_param(m, "model.layers.1.mlp.gate.weight", 2, 8, 32, 0);
  expect_param(m, "model.layers.1.mlp.experts.{e}.gate_proj.weight", 3, 8, 16, 32);
  expect_param(m, "model.layers.2.mlp.experts.{e}.up_proj.weight", 3, 8, 16, 32);
  expect_param(m, "model.layers.2.mlp.experts.{e}.down_proj.weight", 3, 8, 32, 16);
  expect_param(m, "model.layers.2.mlp.shared_experts.gate_proj.weight", 2, 16, 32, 0);
  expect_param(m, "model.layers.2.mlp.shared_experts.down_proj.weight", 2, 32, 16, 0);
  expect_param(m, "model.norm.weight", 1, 32, 0, 0);
  expect_param(m, "lm_head.weight", 2, 64, 32, 0);
  /* Dense layers have no router, MoE layers no dense FFN, softmax without
   * aux-free balancing no correction bias, GQA without bias no biases. */
  assert_null(find_param(m, "model.layers.0.mlp.gate.weight"));
  assert_null(find_param(m, "model.layers.1.mlp.gate_proj.weight"));
  assert_null(find_param(m, "model.layers.1.mlp.gate.e_score_correction_bias"));
  assert_null(find_param(m, "model.layers.0.self_attn.q_proj.bias"));
  assert_null(find_param(m, "model.layers.3.input_layernorm.weight"));

  /* By hand: embed 64*32 = 2048; attention per layer 1024+512+512+1024 =
   * 3072 plus norms 64, x3 = 9408; dense FFN 3*48*32 = 4608; per MoE layer
   * router 256 + experts 3*8*16*32 = 12288 + shared 3*16*32 = 1536, x2 =
   * 28160; final norm 32; lm_head 2048. */
  assert_int_equal(param_elements(m), 2048 + 9408 + 4608 + 28160 + 32 + 2048);
  assert_int_equal(param_elements(m), 46304);
  {
    xm_count_t c;
    xm_count_params(&s, &c);
    assert_int_equal(c.total, 46304);
  }

  /* Init rules: normal 0.02, output projections scaled by 1/sqrt(2L). */
  xm_ir_op_t *q = find_param(m, "model.layers.0.self_attn.q_proj.weight");
  assert_string_equal(xm_ir_op_get_string(q, "init", ""), "normal");
  assert_true(fabs(xm_ir_op_get_float(q, "std", 0) - 0.02) < 1e-15);
  xm_ir_op_t *o = find_param(m, "model.layers.0.self_attn.o_proj.weight");
  assert_true(fabs(xm_ir_op_get_float(o, "std", 0) - 0.02 / sqrt(6.0)) < 1e-15);
  xm_ir_op_t *dd = find_param(m, "model.layers.0.mlp.down_proj.weight");
  assert_true(fabs(xm_ir_op_get_float(dd, "std", 0) - 0.02 / sqrt(6.0)) < 1e-15);
  xm_ir_op_t *n = find_param(m, "model.norm.weight");
  assert_string_equal(xm_ir_op_get_string(n, "init", ""), "ones");
  assert_null(xm_ir_op_attr(n, "std"));
  xm_ir_module_destroy(m);
}

static void test_tiny_layers_and_module(void **state) {
  (void)state;
  xm_spec_t s = tiny_spec();
  xm_ir_module_t *m = build_ok(&s);
  assert_string_equal(xm_ir_module_name(m), "tiny");
  assert_int_equal(module_int(m, "layers"), 3);
  assert_int_equal(module_int(m, "experts"), 8);
  assert_int_equal(module_int(m, "top_k"), 2);
  assert_int_equal(module_int(m, "micro_batch"), 2);
  assert_int_equal(module_int(m, "seq_len"), 8);

  /* Params of a layer carry its index; global params none. */
  assert_int_equal(xm_ir_op_get_int(find_param(m, "model.layers.2.mlp.gate.weight"), "layer", -1),
                   2);
  assert_int_equal(
      xm_ir_op_get_int(find_param(m, "model.layers.0.input_layernorm.weight"), "layer", -1), 0);
  assert_null(xm_ir_op_attr(find_param(m, "model.embed_tokens.weight"), "layer"));
  assert_null(xm_ir_op_attr(find_param(m, "lm_head.weight"), "layer"));
  for (int i = 0; i < 3; i++)
    assert_int_equal(xm_ir_op_get_int(nth_op(m, XM_OP_ATTENTION, i), "layer", -1), i);
  assert_int_equal(xm_ir_op_get_int(nth_op(m, XM_OP_AUX_LOSS, 1), "layer", -1), 2);
  assert_null(xm_ir_op_attr(nth_op(m, XM_OP_CROSS_ENTROPY, 0), "layer"));
  /* Layers are contiguous: the layer attr never decreases along the ops. */
  int64_t last = -1;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    int64_t l = xm_ir_op_get_int(xm_ir_module_op(m, i), "layer", -1);
    if (l >= 0) {
      assert_true(l >= last);
      last = l;
    }
  }
  assert_int_equal(last, 2);

  /* Shapes along the path. */
  xm_ir_op_t *emb = nth_op(m, XM_OP_EMBEDDING, 0);
  assert_int_equal(emb->results[0]->type.rank, 3);
  assert_int_equal(emb->results[0]->type.dims[2], 32);
  xm_ir_op_t *att = nth_op(m, XM_OP_ATTENTION, 0);
  assert_int_equal(att->operands[0]->type.dims[2], 4);
  assert_int_equal(att->operands[1]->type.dims[2], 2);
  assert_int_equal(att->operands[1]->type.dims[3], 8);
  assert_true(fabs(xm_ir_op_get_float(att, "scale", 0) - 1.0 / sqrt(8.0)) < 1e-15);
  assert_true(xm_ir_op_get_float(nth_op(m, XM_OP_ROPE, 0), "theta", 0) == 10000.0);
  assert_true(xm_ir_op_get_float(nth_op(m, XM_OP_RMSNORM, 0), "eps", 0) == 1e-6);
  xm_ir_op_t *tk = nth_op(m, XM_OP_TOPK_ROUTE, 0);
  assert_int_equal(tk->results[0]->type.dtype, XM_DT_I32);
  assert_int_equal(tk->results[0]->type.dims[0], 16);
  assert_int_equal(tk->results[0]->type.dims[1], 2);
  assert_int_equal(xm_ir_op_get_int(tk, "k", 0), 2);
  assert_string_equal(xm_ir_op_get_string(tk, "scoring", ""), "softmax");
  xm_ir_op_t *pm = nth_op(m, XM_OP_PERMUTE, 0);
  assert_int_equal(xm_ir_op_get_int(pm, "capacity", -1), 0);
  assert_int_equal(xm_ir_op_get_int(pm, "num_experts", -1), 8);
  assert_int_equal(pm->results[0]->type.dims[0], 32);
  assert_false(pm->results[0]->type.dynamic[0]);
  assert_int_equal(pm->results[2]->type.dims[0], 8);
  xm_ir_op_t *lm = nth_op(m, XM_OP_MATMUL, 23);
  assert_ptr_equal(lm->operands[1], find_param(m, "lm_head.weight")->results[0]);
  assert_int_equal(lm->results[0]->type.dims[2], 64);
  xm_ir_module_destroy(m);
}

static void test_tiny_return_and_locations(void **state) {
  (void)state;
  xm_spec_t s = tiny_spec();
  xm_ir_module_t *m = build_ok(&s);
  xm_ir_op_t *ret = xm_ir_module_op(m, xm_ir_module_num_ops(m) - 1);
  assert_int_equal(ret->code, XM_OP_RETURN);
  assert_int_equal(ret->num_operands, 2);
  xm_ir_op_t *ce = nth_op(m, XM_OP_CROSS_ENTROPY, 0);
  assert_ptr_equal(ret->operands[1], ce->results[0]);
  assert_int_equal(ret->operands[1]->type.rank, 0);
  /* loss = (ce + aux_1) + aux_2 */
  xm_ir_op_t *sum2 = ret->operands[0]->def;
  assert_int_equal(sum2->code, XM_OP_ADD);
  assert_ptr_equal(sum2->operands[1], nth_op(m, XM_OP_AUX_LOSS, 1)->results[0]);
  xm_ir_op_t *sum1 = sum2->operands[0]->def;
  assert_int_equal(sum1->code, XM_OP_ADD);
  assert_ptr_equal(sum1->operands[0], ce->results[0]);
  assert_ptr_equal(sum1->operands[1], nth_op(m, XM_OP_AUX_LOSS, 0)->results[0]);
  assert_true(xm_ir_op_get_float(nth_op(m, XM_OP_AUX_LOSS, 0), "alpha", 0) == 0.01);

  assert_string_equal(nth_op(m, XM_OP_INPUT, 0)->loc, "/training/seq_len");
  assert_string_equal(xm_ir_op_get_string(nth_op(m, XM_OP_INPUT, 1), "name", ""), "labels");
  assert_string_equal(nth_op(m, XM_OP_EMBEDDING, 0)->loc, "/model/vocab");
  assert_string_equal(nth_op(m, XM_OP_ATTENTION, 0)->loc, "/model/heads");
  assert_string_equal(nth_op(m, XM_OP_ROPE, 0)->loc, "/model/rope_theta");
  assert_string_equal(nth_op(m, XM_OP_RMSNORM, 0)->loc, "/model/norm_eps");
  assert_string_equal(nth_op(m, XM_OP_ROUTER_SCORE, 0)->loc, "/moe/experts");
  assert_string_equal(nth_op(m, XM_OP_TOPK_ROUTE, 0)->loc, "/moe/top_k");
  assert_string_equal(nth_op(m, XM_OP_PERMUTE, 0)->loc, "/moe/experts");
  assert_string_equal(nth_op(m, XM_OP_GROUPED_MATMUL, 0)->loc, "/moe/expert_ffn");
  assert_string_equal(nth_op(m, XM_OP_AUX_LOSS, 0)->loc, "/moe/aux_alpha");
  assert_string_equal(ce->loc, "/model/vocab");
  assert_string_equal(find_param(m, "model.layers.0.mlp.up_proj.weight")->loc, "/model/dense_ffn");
  assert_string_equal(find_param(m, "model.layers.1.mlp.shared_experts.up_proj.weight")->loc,
                      "/moe/shared_experts");
  xm_ir_module_destroy(m);
}

/* ---- variants ---------------------------------------------------------- */

static void test_no_aux_loss(void **state) {
  (void)state;
  xm_spec_t s = tiny_spec();
  s.moe.aux_alpha = 0;
  xm_ir_module_t *m = build_ok(&s);
  assert_int_equal(count_ops(m, XM_OP_AUX_LOSS), 0);
  assert_int_equal(count_ops(m, XM_OP_ADD), 8);
  xm_ir_op_t *ret = nth_op(m, XM_OP_RETURN, 0);
  xm_ir_value_t *ce = nth_op(m, XM_OP_CROSS_ENTROPY, 0)->results[0];
  assert_ptr_equal(ret->operands[0], ce);
  assert_ptr_equal(ret->operands[1], ce);
  xm_ir_module_destroy(m);
}

static void test_gelu_experts(void **state) {
  (void)state;
  xm_spec_t s = tiny_spec();
  s.moe.activation = XM_ACT_GELU;
  xm_ir_module_t *m = build_ok(&s);
  assert_null(find_param(m, "model.layers.1.mlp.experts.{e}.gate_proj.weight"));
  expect_param(m, "model.layers.1.mlp.experts.{e}.up_proj.weight", 3, 8, 16, 32);
  expect_param(m, "model.layers.1.mlp.experts.{e}.down_proj.weight", 3, 8, 32, 16);
  /* Shared experts and the dense layer stay SwiGLU. */
  expect_param(m, "model.layers.1.mlp.shared_experts.gate_proj.weight", 2, 16, 32, 0);
  assert_int_equal(count_ops(m, XM_OP_PARAM), 36);
  assert_int_equal(count_ops(m, XM_OP_GROUPED_MATMUL), 4);
  assert_int_equal(count_ops(m, XM_OP_GELU), 2);
  assert_int_equal(count_ops(m, XM_OP_SWIGLU), 3);
  assert_int_equal(param_elements(m), 46304 - 2 * 8 * 16 * 32);
  xm_ir_op_t *g = nth_op(m, XM_OP_GELU, 0);
  assert_int_equal(g->operands[0]->def->code, XM_OP_GROUPED_MATMUL);
  assert_int_equal(g->results[0]->type.dims[1], 16);
  xm_ir_module_destroy(m);
}

static void test_tied_embeddings(void **state) {
  (void)state;
  xm_spec_t s = tiny_spec();
  s.model.tied_embeddings = true;
  xm_ir_module_t *m = build_ok(&s);
  assert_null(find_param(m, "lm_head.weight"));
  assert_int_equal(count_ops(m, XM_OP_PARAM), 37);
  assert_int_equal(param_elements(m), 46304 - 2048);
  xm_ir_op_t *lm = nth_op(m, XM_OP_MATMUL, 23);
  assert_ptr_equal(lm->operands[1], find_param(m, "model.embed_tokens.weight")->results[0]);
  assert_int_equal(lm->operands[1]->num_uses, 2);
  xm_ir_module_destroy(m);
}

static void expect_capacity(double cf, int64_t want) {
  xm_spec_t s = tiny_spec();
  s.moe.has_capacity = true;
  s.moe.capacity_factor = cf;
  xm_ir_module_t *m = build_ok(&s);
  xm_ir_op_t *pm = nth_op(m, XM_OP_PERMUTE, 1);
  assert_int_equal(xm_ir_op_get_int(pm, "capacity", -1), want);
  assert_string_equal(pm->loc, "/moe/capacity_factor");
  for (int r = 0; r < 2; r++) {
    assert_true(pm->results[r]->type.dynamic[0]);
    assert_int_equal(pm->results[r]->type.dims[0], 32); /* bound T*k */
  }
  assert_false(pm->results[2]->type.dynamic[0]);
  xm_ir_op_t *ga = nth_op(m, XM_OP_GATHER_ROWS, 1);
  assert_true(ga->results[0]->type.dynamic[0]);
  assert_int_equal(ga->results[0]->type.dims[0], 32);
  assert_false(ga->results[0]->type.dynamic[1]);
  for (int i = 0; i < 6; i++) {
    xm_ir_op_t *gm = nth_op(m, XM_OP_GROUPED_MATMUL, i);
    assert_true(gm->results[0]->type.dynamic[0]);
    assert_int_equal(gm->results[0]->type.dims[0], 32);
  }
  xm_ir_op_t *sc = nth_op(m, XM_OP_SCATTER_COMBINE, 1);
  assert_false(sc->results[0]->type.dynamic[0]);
  assert_int_equal(sc->results[0]->type.dims[0], 16);
  xm_ir_module_destroy(m);
}

static void test_capacity_dynamic_dims(void **state) {
  (void)state;
  /* T = 16, k = 2, E = 8: C = ceil(cf * 32 / 8). */
  expect_capacity(1.25, 5);
  expect_capacity(1.0, 4);
  expect_capacity(1.1, 5); /* 4.4 */
  expect_capacity(0.3, 2); /* 1.2 */
}

static void test_sigmoid_group_limited(void **state) {
  (void)state;
  xm_spec_t s = tiny_spec();
  s.moe.scoring = XM_SCORING_SIGMOID;
  s.moe.n_group = 4;
  s.moe.topk_group = 2;
  s.moe.routed_scaling = 2.5;
  s.moe.norm_topk_prob = false;
  xm_ir_module_t *m = build_ok(&s);
  xm_ir_op_t *b = expect_param(m, "model.layers.1.mlp.gate.e_score_correction_bias", 1, 8, 0, 0);
  assert_false(xm_ir_op_get_bool(b, "trainable", true));
  assert_string_equal(xm_ir_op_get_string(b, "init", ""), "zeros");
  assert_string_equal(b->loc, "/moe/experts");
  assert_int_equal(count_ops(m, XM_OP_CONSTANT), 0);
  assert_int_equal(count_ops(m, XM_OP_PARAM), 40);
  assert_int_equal(param_elements(m), 46304 + 2 * 8);
  assert_true(
      xm_ir_op_get_bool(find_param(m, "model.layers.1.mlp.gate.weight"), "trainable", true));
  xm_ir_op_t *tk = nth_op(m, XM_OP_TOPK_ROUTE, 0);
  assert_ptr_equal(tk->operands[1], b->results[0]);
  assert_int_equal(xm_ir_op_get_int(tk, "n_group", 0), 4);
  assert_int_equal(xm_ir_op_get_int(tk, "topk_group", 0), 2);
  assert_false(xm_ir_op_get_bool(tk, "norm_topk_prob", true));
  assert_true(xm_ir_op_get_float(tk, "routed_scaling", 0) == 2.5);
  assert_string_equal(xm_ir_op_get_string(tk, "scoring", ""), "sigmoid");
  assert_string_equal(xm_ir_op_get_string(nth_op(m, XM_OP_ROUTER_SCORE, 1), "scoring", ""),
                      "sigmoid");
  xm_ir_module_destroy(m);
}

static void test_aux_free_bias(void **state) {
  (void)state;
  xm_spec_t s = tiny_spec();
  s.moe.aux_free_gamma = 0.001;
  s.moe.aux_alpha = 0;
  xm_ir_module_t *m = build_ok(&s);
  xm_ir_op_t *b = expect_param(m, "model.layers.2.mlp.gate.e_score_correction_bias", 1, 8, 0, 0);
  assert_false(xm_ir_op_get_bool(b, "trainable", true));
  assert_string_equal(b->loc, "/moe/aux_free_gamma");
  assert_int_equal(count_ops(m, XM_OP_CONSTANT), 0);
  assert_int_equal(count_ops(m, XM_OP_AUX_LOSS), 0);
  xm_ir_module_destroy(m);
}

static void test_zero_bias_constant(void **state) {
  (void)state;
  xm_spec_t s = tiny_spec();
  xm_ir_module_t *m = build_ok(&s);
  xm_ir_op_t *c = nth_op(m, XM_OP_CONSTANT, 0);
  assert_int_equal(c->results[0]->type.rank, 1);
  assert_int_equal(c->results[0]->type.dims[0], 8);
  assert_true(xm_ir_op_get_float(c, "value", 1.0) == 0.0);
  assert_ptr_equal(nth_op(m, XM_OP_TOPK_ROUTE, 0)->operands[1], c->results[0]);
  xm_ir_module_destroy(m);
}

static void test_qk_norm_head(void **state) {
  (void)state;
  xm_spec_t s = tiny_spec();
  s.model.qk_norm = XM_QK_NORM_HEAD;
  xm_ir_module_t *m = build_ok(&s);
  expect_param(m, "model.layers.0.self_attn.q_norm.weight", 1, 8, 0, 0);
  expect_param(m, "model.layers.2.self_attn.k_norm.weight", 1, 8, 0, 0);
  assert_null(find_param(m, "model.layers.0.self_attn.v_norm.weight"));
  assert_int_equal(count_ops(m, XM_OP_RMSNORM), 7 + 6);
  assert_int_equal(param_elements(m), 46304 + 3 * 16);
  /* Per-head norm sits between the reshape and RoPE. */
  xm_ir_op_t *qn = nth_op(m, XM_OP_RMSNORM, 1);
  assert_int_equal(qn->operands[0]->type.rank, 4);
  assert_int_equal(qn->operands[0]->def->code, XM_OP_RESHAPE);
  assert_int_equal(nth_op(m, XM_OP_ROPE, 0)->operands[0]->def->code, XM_OP_RMSNORM);
  xm_ir_module_destroy(m);
}

static void test_qk_norm_full(void **state) {
  (void)state;
  xm_spec_t s = tiny_spec();
  s.model.qk_norm = XM_QK_NORM_FULL;
  xm_ir_module_t *m = build_ok(&s);
  expect_param(m, "model.layers.1.self_attn.q_norm.weight", 1, 32, 0, 0);
  expect_param(m, "model.layers.1.self_attn.k_norm.weight", 1, 16, 0, 0);
  assert_int_equal(param_elements(m), 46304 + 3 * 48);
  /* Whole-projection norm sits between the matmul and the reshape. */
  xm_ir_op_t *qn = nth_op(m, XM_OP_RMSNORM, 1);
  assert_int_equal(qn->operands[0]->type.rank, 3);
  assert_int_equal(qn->operands[0]->def->code, XM_OP_MATMUL);
  assert_int_equal(nth_op(m, XM_OP_ROPE, 0)->operands[0]->def->code, XM_OP_RESHAPE);
  xm_ir_module_destroy(m);
}

static void test_attention_bias(void **state) {
  (void)state;
  xm_spec_t s = tiny_spec();
  s.model.attention_bias = true;
  xm_ir_module_t *m = build_ok(&s);
  xm_ir_op_t *qb = expect_param(m, "model.layers.0.self_attn.q_proj.bias", 1, 32, 0, 0);
  assert_string_equal(xm_ir_op_get_string(qb, "init", ""), "zeros");
  expect_param(m, "model.layers.0.self_attn.k_proj.bias", 1, 16, 0, 0);
  expect_param(m, "model.layers.2.self_attn.v_proj.bias", 1, 16, 0, 0);
  assert_null(find_param(m, "model.layers.0.self_attn.o_proj.bias"));
  assert_int_equal(count_ops(m, XM_OP_PARAM), 38 + 9);
  assert_int_equal(count_ops(m, XM_OP_ADD), 10 + 9);
  assert_int_equal(param_elements(m), 46304 + 3 * 64);
  xm_ir_module_destroy(m);
}

static void test_dense_only(void **state) {
  (void)state;
  xm_spec_t s = tiny_spec();
  s.moe.experts = 0;
  s.moe.top_k = 0;
  s.moe.shared_experts = 0;
  s.moe.shared_ffn = 0;
  s.moe.expert_ffn = 0;
  s.model.first_k_dense = 0;
  xm_ir_module_t *m = build_ok(&s);
  assert_int_equal(count_ops(m, XM_OP_TOPK_ROUTE), 0);
  assert_int_equal(count_ops(m, XM_OP_GROUPED_MATMUL), 0);
  assert_int_equal(count_ops(m, XM_OP_AUX_LOSS), 0);
  assert_int_equal(count_ops(m, XM_OP_PARAM), 1 + 3 * 9 + 2);
  for (int i = 0; i < 3; i++) {
    char name[80];
    snprintf(name, sizeof name, "model.layers.%d.mlp.down_proj.weight", i);
    expect_param(m, name, 2, 32, 48, 0);
  }
  assert_int_equal(param_elements(m), 2048 + 9408 + 3 * 4608 + 32 + 2048);
  assert_int_equal(module_int(m, "experts"), 0);
  xm_ir_module_destroy(m);
}

static void test_unnamed_and_single_layer(void **state) {
  (void)state;
  xm_spec_t s = tiny_spec();
  s.name[0] = '\0';
  s.model.layers = 1;
  s.model.first_k_dense = 0;
  xm_ir_module_t *m = build_ok(&s);
  assert_string_equal(xm_ir_module_name(m), "model");
  assert_int_equal(count_ops(m, XM_OP_GROUPED_MATMUL), 3);
  xm_ir_op_t *o = find_param(m, "model.layers.0.mlp.experts.{e}.down_proj.weight");
  assert_true(fabs(xm_ir_op_get_float(o, "std", 0) - 0.02 / sqrt(2.0)) < 1e-15);
  xm_ir_module_destroy(m);
}

/* The role of param `name` (ir/roles.def), failing when it has none. */
static const char *role_of(const xm_ir_module_t *m, const char *name) {
  xm_ir_op_t *op = find_param(m, name);
  if (!op) fprintf(stderr, "missing param %s\n", name);
  assert_non_null(op);
  const char *role = xm_ir_op_get_string(op, "role", NULL);
  if (!role) fprintf(stderr, "param %s has no role\n", name);
  assert_non_null(role);
  return role;
}

/* Every param of m carries a role of ir/roles.def. */
static void expect_all_roles(const xm_ir_module_t *m) {
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->code != XM_OP_PARAM) continue;
    xm_ir_role_t r = XM_ROLE_COUNT_;
    const char *role = xm_ir_op_get_string(op, "role", NULL);
    if (!xm_ir_role_from_name(role, &r))
      fprintf(stderr, "param %s: role %s\n", xm_ir_op_get_string(op, "name", "?"),
              role ? role : "(none)");
    assert_true(xm_ir_role_from_name(role, &r));
    assert_string_equal(xm_ir_role_name(r), role);
  }
}

/* The builder says how each param is placed (the shard pass reads only
 * this): the roles of ir/roles.def for every kind of param it builds. */
static void test_param_roles(void **state) {
  (void)state;
  xm_spec_t s = tiny_spec();
  s.model.attention_bias = true;
  s.model.qk_norm = XM_QK_NORM_HEAD;
  s.moe.aux_free_gamma = 0.001;
  xm_ir_module_t *m = build_ok(&s);
  expect_all_roles(m);
  const char *const replicated[] = {"model.embed_tokens.weight",
                                    "model.layers.0.input_layernorm.weight",
                                    "model.layers.1.post_attention_layernorm.weight",
                                    "model.layers.1.mlp.gate.weight",
                                    "model.layers.2.mlp.gate.e_score_correction_bias",
                                    "model.norm.weight",
                                    "lm_head.weight"};
  for (size_t i = 0; i < sizeof replicated / sizeof replicated[0]; i++)
    assert_string_equal(role_of(m, replicated[i]), "replicated");
  const char *const column[] = {"model.layers.0.self_attn.q_proj.weight",
                                "model.layers.0.self_attn.k_proj.weight",
                                "model.layers.2.self_attn.v_proj.weight",
                                "model.layers.0.self_attn.q_proj.bias",
                                "model.layers.1.self_attn.k_proj.bias",
                                "model.layers.2.self_attn.v_proj.bias",
                                "model.layers.0.mlp.gate_proj.weight",
                                "model.layers.0.mlp.up_proj.weight"};
  for (size_t i = 0; i < sizeof column / sizeof column[0]; i++)
    assert_string_equal(role_of(m, column[i]), "tp_column");
  assert_string_equal(role_of(m, "model.layers.1.self_attn.o_proj.weight"), "tp_row");
  assert_string_equal(role_of(m, "model.layers.0.mlp.down_proj.weight"), "tp_row");
  assert_string_equal(role_of(m, "model.layers.0.self_attn.q_norm.weight"), "tp_partial");
  assert_string_equal(role_of(m, "model.layers.2.self_attn.k_norm.weight"), "tp_partial");
  assert_string_equal(role_of(m, "model.layers.1.mlp.experts.{e}.gate_proj.weight"), "expert");
  assert_string_equal(role_of(m, "model.layers.1.mlp.experts.{e}.up_proj.weight"), "expert");
  assert_string_equal(role_of(m, "model.layers.2.mlp.experts.{e}.down_proj.weight"), "expert");
  assert_string_equal(role_of(m, "model.layers.1.mlp.shared_experts.gate_proj.weight"),
                      "shared_column");
  assert_string_equal(role_of(m, "model.layers.2.mlp.shared_experts.up_proj.weight"),
                      "shared_column");
  assert_string_equal(role_of(m, "model.layers.2.mlp.shared_experts.down_proj.weight"),
                      "shared_row");
  xm_ir_module_destroy(m);

  /* The other variants: full q/k norms, GELU experts, tied embeddings, a
   * dense model. */
  s = tiny_spec();
  s.model.qk_norm = XM_QK_NORM_FULL;
  s.moe.activation = XM_ACT_GELU;
  s.model.tied_embeddings = true;
  m = build_ok(&s);
  expect_all_roles(m);
  assert_string_equal(role_of(m, "model.layers.1.self_attn.q_norm.weight"), "tp_partial");
  assert_string_equal(role_of(m, "model.layers.1.mlp.experts.{e}.up_proj.weight"), "expert");
  xm_ir_module_destroy(m);
  s = tiny_spec();
  s.moe.experts = 0;
  s.moe.top_k = 0;
  s.moe.shared_experts = 0;
  s.moe.shared_ffn = 0;
  s.moe.expert_ffn = 0;
  s.model.first_k_dense = 0;
  m = build_ok(&s);
  expect_all_roles(m);
  assert_string_equal(role_of(m, "model.layers.2.mlp.gate_proj.weight"), "tp_column");
  assert_string_equal(role_of(m, "model.layers.2.mlp.down_proj.weight"), "tp_row");
  xm_ir_module_destroy(m);

  /* Names and values of the role table agree both ways. */
  for (int r = 0; r < XM_ROLE_COUNT_; r++) {
    xm_ir_role_t back;
    assert_true(xm_ir_role_from_name(xm_ir_role_name((xm_ir_role_t)r), &back));
    assert_int_equal(back, r);
  }
  xm_ir_role_t none;
  assert_false(xm_ir_role_from_name("tp_col", &none));
  assert_false(xm_ir_role_from_name(NULL, &none));
  assert_string_equal(xm_ir_role_name(XM_ROLE_COUNT_), "?");
}

/* transformers' DeepseekV3Attention in the graph: its tensors by name and
 * shape, RoPE on the rotary span only (interleaved, YaRN-scaled), the
 * rotary key split off the latent and joined to every head, the softmax
 * scale with YaRN's mscale_all_dim factor, and exactly the counted
 * parameters (build_ok). */
static void test_mla_graph(void **state) {
  (void)state;
  xm_spec_t s = tiny_spec();
  xm_model_spec_t *ms = &s.model;
  ms->attention = XM_ATTN_MLA;
  ms->kv_heads = ms->heads;
  ms->q_lora_rank = 24;
  ms->kv_lora_rank = 16;
  ms->qk_nope_head_dim = 8;
  ms->qk_rope_head_dim = 4;
  ms->v_head_dim = 6;
  ms->head_dim = 12;
  ms->rope_interleave = true;
  ms->yarn_factor = 40;
  ms->yarn_original_max_position = 4096;
  ms->yarn_mscale = 1;
  ms->yarn_mscale_all_dim = 1;
  ms->yarn_beta_fast = 32;
  ms->yarn_beta_slow = 1;
  ms->yarn_truncate = true;
  xm_ir_module_t *m = build_ok(&s);
  int64_t H = ms->hidden, nh = ms->heads, B = s.training.micro_batch, S = s.training.seq_len;
  expect_param(m, "model.layers.0.self_attn.q_a_proj.weight", 2, 24, H, 0);
  expect_param(m, "model.layers.0.self_attn.q_a_layernorm.weight", 1, 24, 0, 0);
  expect_param(m, "model.layers.0.self_attn.q_b_proj.weight", 2, nh * 12, 24, 0);
  expect_param(m, "model.layers.0.self_attn.kv_a_proj_with_mqa.weight", 2, 16 + 4, H, 0);
  expect_param(m, "model.layers.0.self_attn.kv_a_layernorm.weight", 1, 16, 0, 0);
  expect_param(m, "model.layers.0.self_attn.kv_b_proj.weight", 2, nh * (8 + 6), 16, 0);
  expect_param(m, "model.layers.0.self_attn.o_proj.weight", 2, H, nh * 6, 0);
  assert_null(find_param(m, "model.layers.0.self_attn.q_proj.weight"));
  assert_null(find_param(m, "model.layers.0.self_attn.k_proj.weight"));
  assert_int_equal(count_ops(m, XM_OP_SPLIT), 2 * ms->layers);
  assert_int_equal(count_ops(m, XM_OP_CONCAT), ms->layers);
  assert_int_equal(count_ops(m, XM_OP_ROPE), 2 * ms->layers);
  int ropes = 0;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->code == XM_OP_ROPE) {
      const xm_ir_type_t *t = &op->operands[0]->type;
      bool query = t->dims[2] == nh;
      assert_int_equal(t->dims[3], query ? 12 : 4);
      assert_int_equal(xm_ir_op_get_int(op, "rot_offset", 0), query ? 8 : 0);
      assert_int_equal(xm_ir_op_get_int(op, "rot_dim", t->dims[3]), 4);
      assert_true(xm_ir_op_get_bool(op, "interleave", false));
      /* YaRN over 4 dims: find_correction_dim(32) < 0 and (1) = 4 * ln(4096/2pi) / (2 ln
       * 10000) = 1.41 -> [0, 2] after truncation; attention factor 1 (mscale ==
       * mscale_all_dim). */
      assert_true(xm_ir_op_get_float(op, "yarn_factor", 0) == 40.0);
      assert_true(xm_ir_op_get_float(op, "yarn_low", -1) == 0.0);
      assert_true(xm_ir_op_get_float(op, "yarn_high", -1) == 2.0);
      assert_true(xm_ir_op_get_float(op, "mscale", 0) == 1.0);
      ropes++;
    } else if (op->code == XM_OP_ATTENTION) {
      const xm_ir_type_t *k = &op->operands[1]->type, *v = &op->operands[2]->type;
      assert_int_equal(k->dims[2], nh);
      assert_int_equal(k->dims[3], 12);
      assert_int_equal(v->dims[3], 6);
      assert_int_equal(op->results[0]->type.dims[0], B);
      assert_int_equal(op->results[0]->type.dims[1], S);
      double mall = 0.1 * log(40.0) + 1.0;
      assert_true(fabs(xm_ir_op_get_float(op, "scale", 0) - mall * mall / sqrt(12.0)) < 1e-12);
    } else if (op->code == XM_OP_CONCAT) {
      assert_int_equal(op->operands[1]->type.dims[2], 1); /* one rotary key for all heads */
    }
  }
  assert_int_equal(ropes, 2 * ms->layers);
  xm_ir_module_destroy(m);

  /* An original context of 1 over 4 rotary dims: transformers' range is
   * [max(floor(-2.6), 0), min(ceil(-0.40), 3)] = [0, 0] (no -0 in the IR);
   * over 64 dims with theta 10000 it is [0, ceil(-6.39)] = [0, -6], a range
   * that ends below its start and keeps every frequency: not clamped to
   * lo. */
  ms->yarn_original_max_position = 1;
  m = build_ok(&s);
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->code != XM_OP_ROPE) continue;
    assert_true(xm_ir_op_get_float(op, "yarn_low", -1) == 0.0);
    double hi = xm_ir_op_get_float(op, "yarn_high", -1);
    assert_true(hi == 0.0 && !signbit(hi));
  }
  xm_ir_module_destroy(m);
  ms->qk_rope_head_dim = 64;
  ms->head_dim = 8 + 64;
  m = build_ok(&s);
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->code != XM_OP_ROPE) continue;
    assert_true(xm_ir_op_get_float(op, "yarn_low", -1) == 0.0);
    assert_true(xm_ir_op_get_float(op, "yarn_high", 0) == -6.0);
  }
  xm_ir_module_destroy(m);
  ms->qk_rope_head_dim = 4;
  ms->head_dim = 12;
  ms->yarn_original_max_position = 4096;

  /* DeepSeek-V2-Lite's form: q_proj, no YaRN, no interleave. */
  ms->q_lora_rank = 0;
  ms->rope_interleave = false;
  ms->yarn_factor = 1;
  m = build_ok(&s);
  expect_param(m, "model.layers.0.self_attn.q_proj.weight", 2, nh * 12, H, 0);
  assert_null(find_param(m, "model.layers.0.self_attn.q_a_proj.weight"));
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->code != XM_OP_ROPE) continue;
    assert_null(xm_ir_op_attr(op, "interleave"));
    assert_null(xm_ir_op_attr(op, "yarn_factor"));
  }
  xm_ir_module_destroy(m);
}

/* Two MTP modules on the tiny spec (3 layers): model.layers.3 and .4 hold
 * each module's norms, eh_proj [H, 2H] and a whole MoE layer over S-k
 * positions; three cross-entropies (main, k = 1, 2), labels cut by i32
 * splits, and the modules' losses scaled by lambda / D into the total. */
static void test_mtp_graph(void **state) {
  (void)state;
  xm_spec_t s = tiny_spec();
  s.model.mtp_layers = 2;
  s.training.mtp_loss_weight = 0.4;
  xm_ir_module_t *m = build_ok(&s);
  int64_t H = s.model.hidden, B = s.training.micro_batch, S = s.training.seq_len;
  int64_t L = s.model.layers, E = s.moe.experts;
  for (int64_t k = 1; k <= 2; k++) {
    char name[128];
    const char *norms[] = {"enorm", "hnorm", "shared_head.norm"};
    for (int j = 0; j < 3; j++) {
      snprintf(name, sizeof name, "model.layers.%lld.%s.weight", (long long)(L + k - 1), norms[j]);
      expect_param(m, name, 1, H, 0, 0);
    }
    snprintf(name, sizeof name, "model.layers.%lld.eh_proj.weight", (long long)(L + k - 1));
    expect_param(m, name, 2, H, 2 * H, 0);
    snprintf(name, sizeof name, "model.layers.%lld.mlp.experts.{e}.up_proj.weight",
             (long long)(L + k - 1));
    expect_param(m, name, 3, E, s.moe.expert_ffn, H);
  }
  assert_null(find_param(m, "model.layers.5.eh_proj.weight"));
  assert_int_equal(count_ops(m, XM_OP_CROSS_ENTROPY), 3);
  assert_int_equal(count_ops(m, XM_OP_ATTENTION), 5);
  assert_int_equal(count_ops(m, XM_OP_AUX_LOSS), 4); /* 2 main MoE layers + 2 modules */
  int label_cuts = 0, attn = 0, scales = 0;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    int64_t layer = xm_ir_op_get_int(op, "layer", -1);
    if (op->code == XM_OP_SPLIT && op->operands[0]->type.dtype == XM_DT_I32) {
      int64_t k = layer - L + 1;
      assert_true(k == 1 || k == 2);
      assert_int_equal(op->results[0]->type.dims[1], k);
      assert_int_equal(op->results[1]->type.dims[0], B);
      assert_int_equal(op->results[1]->type.dims[1], S - k);
      label_cuts++;
    } else if (op->code == XM_OP_ATTENTION && layer >= L) {
      assert_int_equal(op->results[0]->type.dims[1], S - (layer - L + 1));
      attn++;
    } else if (op->code == XM_OP_SCALE) {
      /* the mean over the 2 modules, then the weight */
      double f = xm_ir_op_get_float(op, "factor", 0);
      assert_true(fabs(f - (scales == 0 ? 0.5 : 0.4)) < 1e-15);
      assert_string_equal(op->loc, "/training/mtp_loss_weight");
      scales++;
    } else if (op->code == XM_OP_CROSS_ENTROPY && layer >= L) {
      int64_t k = layer - L + 1;
      assert_int_equal(op->operands[0]->type.dims[1], S - k); /* logits [B, S-k, V] */
      assert_int_equal(op->operands[0]->type.dims[2], s.model.vocab);
    }
  }
  assert_int_equal(label_cuts, 2);
  assert_int_equal(attn, 2);
  assert_int_equal(scales, 2);
  /* return(loss, ce, mean MTP cross-entropy): the third is the first scale's */
  const xm_ir_op_t *ret = xm_ir_module_op(m, xm_ir_module_num_ops(m) - 1);
  assert_int_equal(ret->code, XM_OP_RETURN);
  assert_int_equal(ret->num_operands, 3);
  assert_int_equal(ret->operands[2]->def->code, XM_OP_SCALE);
  assert_true(fabs(xm_ir_op_get_float(ret->operands[2]->def, "factor", 0) - 0.5) < 1e-15);
  xm_ir_module_destroy(m);
}

/* Qwen2-MoE's gated shared expert (transformers' Qwen2MoeSparseMoeBlock):
 * out = routed + sigmoid(t W^T) * shared(t), W = mlp.shared_expert_gate.weight
 * [1,H], one gate per token, in every MoE layer; the tensor is counted
 * (build_ok) and placed by its own role. */
static void test_shared_gate_graph(void **state) {
  (void)state;
  xm_spec_t s = tiny_spec();
  s.moe.shared_expert_gate = true;
  xm_ir_module_t *m = build_ok(&s);
  const int64_t T = 16, H = 32;
  assert_null(find_param(m, "model.layers.0.mlp.shared_expert_gate.weight")); /* dense */
  for (int layer = 1; layer <= 2; layer++) {
    char name[96];
    snprintf(name, sizeof name, "model.layers.%d.mlp.shared_expert_gate.weight", layer);
    xm_ir_op_t *w = expect_param(m, name, 2, 1, H, 0);
    assert_string_equal(role_of(m, name), "shared_gate");
    assert_string_equal(xm_ir_op_get_string(w, "init", ""), "normal");
    assert_true(fabs(xm_ir_op_get_float(w, "std", 0) - 0.02) < 1e-15);
    assert_true(xm_ir_op_get_bool(w, "trainable", true));
    assert_int_equal(xm_ir_op_get_int(w, "layer", -1), layer);
    assert_string_equal(w->loc, "/moe/shared_expert_gate");
  }
  /* The only sigmoids and muls of the graph are the two gates. */
  assert_int_equal(count_ops(m, XM_OP_SIGMOID), 2);
  assert_int_equal(count_ops(m, XM_OP_MUL), 2);
  assert_int_equal(count_ops(m, XM_OP_MATMUL), 24 + 2);
  assert_int_equal(count_ops(m, XM_OP_PARAM), 38 + 2);
  int gates = 0;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *mul = xm_ir_module_op(m, i);
    if (mul->code != XM_OP_MUL) continue;
    gates++;
    int64_t layer = xm_ir_op_get_int(mul, "layer", -1);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "model.layers.%" PRId64 ".mlp.", layer);
    /* a: the shared expert's down projection [T,H] */
    const xm_ir_op_t *down = mul->operands[0]->def;
    assert_int_equal(down->code, XM_OP_MATMUL);
    const char *dname = xm_ir_op_get_string(down->operands[1]->def, "name", "");
    assert_true(strncmp(dname, prefix, strlen(prefix)) == 0);
    assert_string_equal(dname + strlen(prefix), "shared_experts.down_proj.weight");
    /* b: sigmoid of the token matrix times the gate weight, [T,1] */
    const xm_ir_op_t *sig = mul->operands[1]->def;
    assert_int_equal(sig->code, XM_OP_SIGMOID);
    const xm_ir_op_t *logit = sig->operands[0]->def;
    assert_int_equal(logit->code, XM_OP_MATMUL);
    const char *gname = xm_ir_op_get_string(logit->operands[1]->def, "name", "");
    assert_string_equal(gname + strlen(prefix), "shared_expert_gate.weight");
    const xm_ir_type_t *gt = &sig->results[0]->type;
    assert_int_equal(gt->rank, 2);
    assert_int_equal(gt->dims[0], T);
    assert_int_equal(gt->dims[1], 1);
    assert_int_equal(mul->results[0]->type.dims[0], T);
    assert_int_equal(mul->results[0]->type.dims[1], H);
    /* the gate reads the tokens the shared experts read (the router's too) */
    const xm_ir_op_t *swiglu = down->operands[0]->def;
    assert_int_equal(swiglu->code, XM_OP_SWIGLU);
    assert_ptr_equal(logit->operands[0], swiglu->operands[0]->def->operands[0]);
    /* and the gated output is what is added to the routed experts' sum */
    int adds = 0;
    for (int j = i + 1; j < xm_ir_module_num_ops(m); j++) {
      const xm_ir_op_t *add = xm_ir_module_op(m, j);
      if (add->code != XM_OP_ADD || add->operands[1] != mul->results[0]) continue;
      assert_int_equal(add->operands[0]->def->code, XM_OP_SCATTER_COMBINE);
      adds++;
    }
    assert_int_equal(adds, 1);
    assert_string_equal(mul->loc, "/moe/shared_expert_gate");
  }
  assert_int_equal(gates, 2);
  xm_ir_module_destroy(m);

  /* Ungated shared experts (DeepSeek's) have no gate tensor or sigmoid. */
  s = tiny_spec();
  m = build_ok(&s);
  assert_int_equal(count_ops(m, XM_OP_SIGMOID), 0);
  assert_null(find_param(m, "model.layers.1.mlp.shared_expert_gate.weight"));
  xm_ir_module_destroy(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tiny_op_counts),
      cmocka_unit_test(test_tiny_params),
      cmocka_unit_test(test_tiny_layers_and_module),
      cmocka_unit_test(test_tiny_return_and_locations),
      cmocka_unit_test(test_no_aux_loss),
      cmocka_unit_test(test_gelu_experts),
      cmocka_unit_test(test_tied_embeddings),
      cmocka_unit_test(test_capacity_dynamic_dims),
      cmocka_unit_test(test_sigmoid_group_limited),
      cmocka_unit_test(test_aux_free_bias),
      cmocka_unit_test(test_zero_bias_constant),
      cmocka_unit_test(test_qk_norm_head),
      cmocka_unit_test(test_qk_norm_full),
      cmocka_unit_test(test_attention_bias),
      cmocka_unit_test(test_dense_only),
      cmocka_unit_test(test_unnamed_and_single_layer),
      cmocka_unit_test(test_param_roles),
      cmocka_unit_test(test_mla_graph),
      cmocka_unit_test(test_mtp_graph),
      cmocka_unit_test(test_shared_gate_graph),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
