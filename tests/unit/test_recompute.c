/* tests/unit/test_recompute.c — the recompute pass on the graphs the model
 * builder makes (passes/recompute.c): selective rebuilds exactly the expert
 * FFN intermediates (the first expert GEMMs and the activation, with their
 * bf16 casts) and the backward reads nothing else of them from the forward;
 * full leaves the backward of a layer reading no forward value of that
 * layer but its params; clones sit right before their first backward
 * reader, carry the original's attrs with phase bwd, and include the
 * collectives (all_to_all, exchange_counts, the TP all_reduce, rbd_dispatch
 * with its slot) but not what the backward never reads (RBD's combine, the
 * SSMB block's exit all_gather); the aux-free load accumulate reads the
 * rebuilt counts; policy none changes nothing and moe means selective.
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
#include "ir/verify.h"
#include "passes/pass.h"
#include "support/diag.h"
#include "support/strbuf.h"

#define LAYOUTS "tests/e2e/inputs/layouts.json"

static void load(const char *rel, xm_spec_t *s) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", XM_SOURCE_DIR, rel);
  xm_diag_t d;
  xm_diag_init(&d);
  xm_status_t st = xm_spec_load_file(path, &d, s);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  xm_diag_free(&d);
}

/* The model of `s` through `pipeline`; NULL with the status in *st when a
 * pass refuses. */
static xm_ir_module_t *run(const xm_spec_t *s, const char *pipeline, xm_status_t *st) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_ir_module_t *m = NULL;
  assert_int_equal(xm_ir_build_model(s, "spec", &d, &m), XM_OK);
  xm_pass_manager_options_t o;
  xm_pass_manager_options_default(&o);
  *st = xm_pass_pipeline_run(m, pipeline, &o, &d);
  xm_diag_free(&d);
  if (*st != XM_OK) {
    xm_ir_module_destroy(m);
    return NULL;
  }
  return m;
}

static xm_ir_module_t *run_ok(const xm_spec_t *s, const char *pipeline) {
  xm_status_t st;
  xm_ir_module_t *m = run(s, pipeline, &st);
  assert_int_equal(st, XM_OK);
  return m;
}

/* The layouts spec: one dense layer (0) and one MoE layer (1), 4 micro-batches. */
#define AD "autodiff{grad-accum=4 aux-free-gamma=0.001}"
#define FUSED "fuse-permute-gemm,fuse-lm-head," AD
#define EP2                                                                                        \
  "shard{dp=2 ep=2 ranks-per-node=2},fuse-permute-gemm,fuse-lm-head,autodiff{grad-accum=2 "        \
  "aux-free-gamma=0.001}"
#define RBD4                                                                                       \
  "shard{dp=2 tp=2 ep=4 ssmb=1 rbd=1 zero=1 ranks-per-node=2},fuse-permute-gemm,fuse-lm-head,"     \
  "autodiff{grad-accum=2 aux-free-gamma=0.001}"

static const char *phase(const xm_ir_op_t *op) { return xm_ir_op_get_string(op, "phase", "fwd"); }
static bool is_fwd(const xm_ir_op_t *op) { return strcmp(phase(op), "fwd") == 0; }
static bool is_bwd(const xm_ir_op_t *op) { return strcmp(phase(op), "bwd") == 0; }
static int64_t layer(const xm_ir_op_t *op) { return xm_ir_op_get_int(op, "layer", -1); }
static bool is_clone(const xm_ir_op_t *op) { return xm_ir_op_get_bool(op, "recompute", false); }

/* Clones of `code` in layer `l` (any code: XM_OP_COUNT_). */
static int clones(const xm_ir_module_t *m, xm_ir_opcode_t code, int64_t l) {
  int n = 0;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (is_clone(op) && layer(op) == l && (code == XM_OP_COUNT_ || op->code == code)) n++;
  }
  return n;
}

/* Backward ops of layer l (clones excluded) reading a forward value of
 * layer l made by an op of `code` (any non-declaration op: XM_OP_COUNT_). */
static int bwd_reads_fwd(const xm_ir_module_t *m, xm_ir_opcode_t code, int64_t l) {
  int n = 0;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (!is_bwd(op) || is_clone(op) || layer(op) != l) continue;
    for (int k = 0; k < op->num_operands; k++) {
      const xm_ir_op_t *d = op->operands[k]->def;
      if (d && is_fwd(d) && layer(d) == l && !xm_ir_op_is_declaration(d) &&
          (code == XM_OP_COUNT_ || d->code == code))
        n++;
    }
  }
  return n;
}

/* A forward value between the expert input rows and the down GEMM: a gate
 * or up GEMM's output (its rows are not such a value) or what an
 * activation or cast makes of one. */
static bool ffn_intermediate(const xm_ir_op_t *d) {
  if (!d || !is_fwd(d)) return false;
  switch (d->code) {
  case XM_OP_GATHER_GROUPED_MATMUL: return true;
  case XM_OP_GROUPED_MATMUL: return !ffn_intermediate(d->operands[0]->def);
  case XM_OP_SWIGLU:
  case XM_OP_GELU:
  case XM_OP_CAST: return ffn_intermediate(d->operands[0]->def);
  default: return false;
  }
}

/* Backward reads (clones excluded) of forward FFN intermediates. */
static int bwd_reads_ffn(const xm_ir_module_t *m) {
  int n = 0;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (!is_bwd(op) || is_clone(op)) continue;
    for (int k = 0; k < op->num_operands; k++)
      n += ffn_intermediate(op->operands[k]->def);
  }
  return n;
}

/* Every clone is a copy of a forward op of its layer (same code, operands
 * that are clones or the forward's kept values, phase bwd); the clones of
 * a layer are one run that ends right before a backward op that reads one
 * of them, and nothing reads a clone before it is made. */
static void check_clones(const xm_ir_module_t *m) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_status_t st = xm_ir_verify(m, &d);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  xm_diag_free(&d);
  int n = xm_ir_module_num_ops(m);
  for (int i = 0; i < n; i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (!is_clone(op)) continue;
    assert_true(is_bwd(op));
    assert_true(layer(op) >= 0);
    for (int k = 0; k < op->num_operands; k++) {
      const xm_ir_op_t *d = op->operands[k]->def;
      assert_true(is_clone(d) || is_fwd(d)); /* never a backward value */
    }
    if (i + 1 < n && is_clone(xm_ir_module_op(m, i + 1))) continue;
    /* The end of a run: the next op is a backward op of the layer reading it. */
    assert_true(i + 1 < n);
    const xm_ir_op_t *next = xm_ir_module_op(m, i + 1);
    assert_true(is_bwd(next) && layer(next) == layer(op));
    bool reads = false;
    for (int k = 0; k < next->num_operands; k++)
      reads = reads || is_clone(next->operands[k]->def);
    assert_true(reads);
  }
}

static void test_selective_is_the_expert_ffn(void **state) {
  (void)state;
  xm_spec_t s;
  load(LAYOUTS, &s);
  /* One rank: gate and up fused with the gather, then swiglu; the fused
   * down GEMM with the combine keeps its output (nothing reads it). */
  xm_ir_module_t *m = run_ok(&s, FUSED);
  assert_true(bwd_reads_ffn(m) > 0);
  xm_ir_module_destroy(m);
  m = run_ok(&s, FUSED ",recompute{policy=selective}");
  check_clones(m);
  assert_int_equal(clones(m, XM_OP_GATHER_GROUPED_MATMUL, 1), 2);
  assert_int_equal(clones(m, XM_OP_SWIGLU, 1), 1);
  assert_int_equal(clones(m, XM_OP_COUNT_, 1), 3);
  assert_int_equal(clones(m, XM_OP_COUNT_, 0), 0); /* the dense layer keeps everything */
  assert_int_equal(bwd_reads_ffn(m), 0);
  assert_true(bwd_reads_fwd(m, XM_OP_TOPK_ROUTE, 1) > 0); /* the routing is kept */
  assert_true(bwd_reads_fwd(m, XM_OP_SWIGLU, 1) > 0);     /* and the shared experts */
  assert_int_equal(xm_ir_module_get_int(m, "recomputed_ops", -1), 3);
  xm_ir_module_destroy(m);
  /* moe is the planner's name for it. */
  m = run_ok(&s, FUSED ",recompute{policy=moe}");
  assert_int_equal(clones(m, XM_OP_COUNT_, 1), 3);
  xm_ir_module_destroy(m);

  /* Expert parallelism: unfused grouped GEMMs on the received rows; the
   * rows (sort_chunks) and the expert output the return all_to_all
   * delivers (what the combine's backward reads) stay. */
  m = run_ok(&s, EP2 ",recompute{policy=selective}");
  check_clones(m);
  assert_int_equal(clones(m, XM_OP_GROUPED_MATMUL, 1), 2);
  assert_int_equal(clones(m, XM_OP_COUNT_, 1), 3);
  assert_int_equal(clones(m, XM_OP_ALL_TO_ALL, 1), 0);
  assert_int_equal(bwd_reads_ffn(m), 0);
  assert_true(bwd_reads_fwd(m, XM_OP_SORT_CHUNKS, 1) > 0);
  assert_true(bwd_reads_fwd(m, XM_OP_ALL_TO_ALL, 1) > 0); /* the expert output, returned */
  xm_ir_module_destroy(m);

  /* bf16: the cast of the activation to the down GEMM's bf16 operand too. */
  m = run_ok(&s, FUSED ",mixed-precision{dtype=bf16},recompute{policy=selective}");
  check_clones(m);
  assert_int_equal(clones(m, XM_OP_CAST, 1), 1);
  assert_int_equal(clones(m, XM_OP_COUNT_, 1), 4);
  assert_int_equal(bwd_reads_ffn(m), 0);
  xm_ir_module_destroy(m);

  /* GELU experts: up, then gelu. */
  xm_spec_t g = s;
  g.moe.activation = XM_ACT_GELU;
  m = run_ok(&g, EP2 ",recompute{policy=selective}");
  check_clones(m);
  assert_int_equal(clones(m, XM_OP_GROUPED_MATMUL, 1), 1);
  assert_int_equal(clones(m, XM_OP_GELU, 1), 1);
  assert_int_equal(clones(m, XM_OP_COUNT_, 1), 2);
  assert_int_equal(bwd_reads_ffn(m), 0);
  xm_ir_module_destroy(m);
}

static void test_full_keeps_the_layer_input(void **state) {
  (void)state;
  xm_spec_t s;
  load(LAYOUTS, &s);
  const char *pipelines[] = {FUSED ",recompute{policy=full}", EP2 ",recompute{policy=full}",
                             RBD4 ",recompute{policy=full}",
                             FUSED ",mixed-precision{dtype=bf16},recompute{policy=full}"};
  for (size_t p = 0; p < sizeof pipelines / sizeof pipelines[0]; p++) {
    xm_ir_module_t *m = run_ok(&s, pipelines[p]);
    check_clones(m);
    for (int64_t l = 0; l < 2; l++) {
      assert_true(clones(m, XM_OP_COUNT_, l) > 0);
      assert_int_equal(bwd_reads_fwd(m, XM_OP_COUNT_, l), 0);
    }
    assert_true(clones(m, XM_OP_RMSNORM, 0) == 2 && clones(m, XM_OP_ATTENTION, 0) == 1);
    assert_int_equal(clones(m, XM_OP_EMBEDDING, -1), 0);
    xm_ir_module_destroy(m);
  }
}

/* The layer's backward reads the rebuilt input rows, so their exchange runs
 * again; the rows returned (flat) are read by the combine's backward. */
static void test_full_rebuilds_collectives(void **state) {
  (void)state;
  xm_spec_t s;
  load(LAYOUTS, &s);
  xm_ir_module_t *m = run_ok(&s, EP2 ",recompute{policy=full}");
  assert_int_equal(clones(m, XM_OP_EXCHANGE_COUNTS, 1), 1);
  assert_int_equal(clones(m, XM_OP_ALL_TO_ALL, 1), 2); /* dispatch and the rows back */
  assert_int_equal(clones(m, XM_OP_PERMUTE, 1), 1);
  assert_int_equal(clones(m, XM_OP_TOPK_ROUTE, 1), 1);
  /* The aux-free load accumulate (end of the backward) reads the rebuilt counts. */
  int loads = 0;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->code != XM_OP_ACCUMULATE ||
        strcmp(xm_ir_op_get_string(op->operands[0]->def, "kind", ""), "load") != 0)
      continue;
    assert_true(is_clone(op->operands[1]->def));
    assert_int_equal(op->operands[1]->def->code, XM_OP_PERMUTE);
    loads++;
  }
  assert_int_equal(loads, 1);
  xm_ir_module_destroy(m);

  /* RBD with SSMB and TP: the dispatch again with its slot; not the combine
   * (its backward reads the expert-side rows), not the exit all_gather; the
   * attention's all_reduce again (h = x + attn feeds the next norm). */
  m = run_ok(&s, RBD4 ",recompute{policy=full}");
  int64_t slot = -1;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->code == XM_OP_RBD_DISPATCH && !is_clone(op)) slot = xm_ir_op_get_int(op, "slot", -2);
  }
  int found = 0;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->code != XM_OP_RBD_DISPATCH || !is_clone(op)) continue;
    assert_int_equal(xm_ir_op_get_int(op, "slot", -3), slot);
    found++;
  }
  assert_int_equal(found, 1);
  assert_int_equal(clones(m, XM_OP_RBD_COMBINE, 1), 0);
  assert_int_equal(clones(m, XM_OP_ALL_GATHER, 1), 0);
  assert_int_equal(clones(m, XM_OP_NARROW, 1) > 0, 1);
  assert_int_equal(clones(m, XM_OP_ALL_REDUCE, 0), 1);
  assert_int_equal(clones(m, XM_OP_ALL_REDUCE, 1), 1);
  xm_ir_module_destroy(m);
}

/* Policy none and the module's record; a second run and a run before
 * autodiff are refused. */
static void test_none_and_refusals(void **state) {
  (void)state;
  xm_spec_t s;
  load(LAYOUTS, &s);
  xm_ir_module_t *a = run_ok(&s, FUSED), *b = run_ok(&s, FUSED ",recompute{policy=none}");
  assert_int_equal(xm_ir_module_num_ops(a), xm_ir_module_num_ops(b));
  assert_int_equal(xm_ir_module_get_int(b, "recomputed_ops", -1), 0);
  const xm_ir_attr_t *p = xm_ir_module_find_attr(b, "recompute");
  assert_non_null(p);
  assert_string_equal(p->s, "none");
  xm_ir_module_destroy(a);
  xm_ir_module_destroy(b);
  xm_status_t st;
  assert_null(run(&s, "recompute{policy=full}", &st));
  assert_int_equal(st, XM_ERR_INVALID_INPUT);
  assert_null(run(&s, AD ",recompute{policy=full},recompute{policy=selective}", &st));
  assert_int_equal(st, XM_ERR_INVALID_INPUT);
  assert_null(run(&s, AD ",plan-memory,recompute{policy=full}", &st));
  assert_int_equal(st, XM_ERR_INVALID_INPUT);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_selective_is_the_expert_ffn),
      cmocka_unit_test(test_full_keeps_the_layer_input),
      cmocka_unit_test(test_full_rebuilds_collectives),
      cmocka_unit_test(test_none_and_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
