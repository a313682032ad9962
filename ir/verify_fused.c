/* ir/verify_fused.c — result-type rules of the fused padding-free MoE ops
 * (ir/ops.def, "fused padding-free MoE"), forward and backward.
 *
 * The fused ops read token rows through the slot index (gather side) or add
 * expert rows into token rows (combine side), so their rules tie three
 * kinds of dims together: token rows T (x, dout, the weights' dim 0), routed
 * rows N (indices, y, h, dy; dynamic when capacity drops slots) and the
 * expert weights [E, M, K]. Every op ends with its scratch result, whose
 * type follows from attrs tile_rows and slots and the staged row width;
 * the rule computes it like any other result, so a scratch of the wrong
 * size is a verifier error, not a kernel overrun. The results are f32
 * whatever the float dtype of the operands: the epilogues accumulate in
 * f32, and under bf16 mixed precision the operands are bf16 and the
 * results stay f32.
 *
 * The LM head fused with the cross-entropy (lm_head_ce and its gradient,
 * the fuse-lm-head pass) is here too: x[..., H] against w[V, H] with one
 * label per row of x, a [T, 2] stats value between the two ops, and a
 * scratch of xm_lm_ce_scratch_floats(T, chunk) floats (one chunk of
 * logits and the per-row state), so the scratch is checked the same way.
 */
#include <stdint.h>

#include "ir/verify_internal.h"
#include "runtime/abi/workspace.h"

#define TT(t) (xm_ir_type_text(t).s)


static const xm_ir_type_t *in(const xm_ir_rule_ctx_t *c, int i) {
  return &c->op->operands[i]->type;
}

static void copy_type(const xm_ir_type_t *t, xm_ir_type_t *out) {
  xm_ir_rule_set_result(out, t->dtype, t->rank, t->dims, t->dynamic);
}

/* The scratch result: f32[slots * tile_rows, width], static. */
static void set_scratch(xm_ir_rule_ctx_t *c, int64_t width, xm_ir_type_t *out) {
  int64_t tile = 0, slots = 0;
  bool ok = xm_ir_rule_attr_int(c, "tile_rows", 1, XM_IR_FUSED_MAX_TILE_ROWS, &tile);
  ok = xm_ir_rule_attr_int(c, "slots", 1, XM_IR_FUSED_MAX_SLOTS, &slots) && ok;
  if (!ok) return;
  int64_t dims[2] = {tile * slots, width};
  bool dyn[2] = {false, false};
  xm_ir_rule_set_result(out, XM_DT_F32, 2, dims, dyn);
}

/* Operand i is i32[N] (indices) or i32[E] (tokens per expert). */
static bool need_i32_vector(xm_ir_rule_ctx_t *c, int i) {
  bool ok = xm_ir_rule_need_rank(c, i, 1);
  return xm_ir_rule_need_dtype(c, i, XM_DT_I32) && ok;
}

/* Operand i is a float matrix. */
static bool need_matrix(xm_ir_rule_ctx_t *c, int i) {
  bool ok = xm_ir_rule_need_rank(c, i, 2);
  return xm_ir_rule_need_float(c, i) && ok;
}

/* Operand i is a float [E, M, K] weight. */
static bool need_weight(xm_ir_rule_ctx_t *c, int i) {
  bool ok = xm_ir_rule_need_rank(c, i, 3);
  return xm_ir_rule_need_float(c, i) && ok;
}

/* Routing weights f32[T, k] at operand i whose dim 0 matches dim `tdim` of
 * operand `tok` (the token rows); the slot count T*k must hold the routed
 * rows of operand `rows`. */
static void need_routing_weights(xm_ir_rule_ctx_t *c, int i, int tok, int tdim, int rows) {
  if (!xm_ir_rule_need_rank(c, i, 2) || !xm_ir_rule_need_dtype(c, i, XM_DT_F32)) return;
  xm_ir_rule_need_dim_eq(c, "token count", i, 0, tok, tdim);
  const xm_ir_type_t *w = in(c, i), *r = in(c, rows);
  int64_t slots;
  if (!__builtin_mul_overflow(w->dims[0], w->dims[1], &slots) && r->dims[0] > slots)
    xm_ir_rule_error(c, "operand %d has %lld rows but operand %d %s has only %lld token slots",
                     rows, (long long)r->dims[0], i, TT(w), (long long)slots);
}

/* x[T,K], indices i32[N], tpe i32[E], w[E,M,K] -> y[N,M], scratch[., K] */
static void rule_gather_grouped_matmul(xm_ir_rule_ctx_t *c, xm_ir_type_t *out) {
  int64_t k = 0;
  int e0 = c->errors;
  xm_ir_rule_attr_int(c, "k", 1, INT64_MAX, &k);
  need_matrix(c, 0);
  need_i32_vector(c, 1);
  need_i32_vector(c, 2);
  need_weight(c, 3);
  if (c->errors > e0) return;
  xm_ir_rule_need_dim_eq(c, "inner dim", 3, 2, 0, 1);
  xm_ir_rule_need_dim_eq(c, "expert count", 2, 0, 3, 0);
  if (c->errors > e0) return;
  const xm_ir_type_t *x = in(c, 0), *idx = in(c, 1), *w = in(c, 3);
  int64_t dims[2] = {idx->dims[0], w->dims[1]};
  bool dyn[2] = {idx->dynamic[0], w->dynamic[1]};
  xm_ir_rule_set_result(&out[0], XM_DT_F32, 2, dims, dyn);
  set_scratch(c, x->dims[1], &out[1]);
}

/* h[N,K], w[E,M,K], tpe i32[E], indices i32[N], weights f32[T,k] ->
 * out[T,M], scratch[., M] */
static void rule_grouped_matmul_combine(xm_ir_rule_ctx_t *c, xm_ir_type_t *out) {
  int e0 = c->errors;
  need_matrix(c, 0);
  need_weight(c, 1);
  need_i32_vector(c, 2);
  need_i32_vector(c, 3);
  if (c->errors > e0) return;
  xm_ir_rule_need_dim_eq(c, "inner dim", 1, 2, 0, 1);
  xm_ir_rule_need_dim_eq(c, "expert count", 2, 0, 1, 0);
  xm_ir_rule_need_dim_eq(c, "row count", 3, 0, 0, 0);
  need_routing_weights(c, 4, 4, 0, 0);
  if (c->errors > e0) return;
  const xm_ir_type_t *w = in(c, 1), *rw = in(c, 4);
  int64_t dims[2] = {rw->dims[0], w->dims[1]};
  bool dyn[2] = {rw->dynamic[0], w->dynamic[1]};
  xm_ir_rule_set_result(&out[0], XM_DT_F32, 2, dims, dyn);
  set_scratch(c, w->dims[1], &out[1]);
}

/* dy[N,M], w[E,M,K], tpe, indices -> dx[T,K], scratch[., K]; attrs k, tokens */
static void rule_gather_grouped_matmul_dx(xm_ir_rule_ctx_t *c, xm_ir_type_t *out) {
  int64_t k = 0, T = 0;
  int e0 = c->errors;
  xm_ir_rule_attr_int(c, "k", 1, INT64_MAX, &k);
  xm_ir_rule_attr_int(c, "tokens", 1, INT64_MAX, &T);
  need_matrix(c, 0);
  need_weight(c, 1);
  need_i32_vector(c, 2);
  need_i32_vector(c, 3);
  if (c->errors > e0) return;
  xm_ir_rule_need_dim_eq(c, "output dim", 1, 1, 0, 1);
  xm_ir_rule_need_dim_eq(c, "expert count", 2, 0, 1, 0);
  xm_ir_rule_need_dim_eq(c, "row count", 3, 0, 0, 0);
  if (c->errors > e0) return;
  const xm_ir_type_t *dy = in(c, 0), *w = in(c, 1);
  int64_t slots;
  if (!__builtin_mul_overflow(T, k, &slots) && dy->dims[0] > slots)
    xm_ir_rule_error(c, "operand 0 has %lld rows but tokens*k is only %lld",
                     (long long)dy->dims[0], (long long)slots);
  int64_t dims[2] = {T, w->dims[2]};
  bool dyn[2] = {false, w->dynamic[2]};
  xm_ir_rule_set_result(&out[0], XM_DT_F32, 2, dims, dyn);
  set_scratch(c, w->dims[2], &out[1]);
}

/* dy[N,M], x[T,K], indices, tpe -> dw[E,M,K], scratch[., K]; attr k */
static void rule_gather_grouped_matmul_dw(xm_ir_rule_ctx_t *c, xm_ir_type_t *out) {
  int64_t k = 0;
  int e0 = c->errors;
  xm_ir_rule_attr_int(c, "k", 1, INT64_MAX, &k);
  need_matrix(c, 0);
  need_matrix(c, 1);
  need_i32_vector(c, 2);
  need_i32_vector(c, 3);
  if (c->errors > e0) return;
  xm_ir_rule_need_dim_eq(c, "row count", 2, 0, 0, 0);
  if (c->errors > e0) return;
  const xm_ir_type_t *dy = in(c, 0), *x = in(c, 1), *tpe = in(c, 3);
  int64_t dims[3] = {tpe->dims[0], dy->dims[1], x->dims[1]};
  bool dyn[3] = {tpe->dynamic[0], dy->dynamic[1], x->dynamic[1]};
  xm_ir_rule_set_result(&out[0], XM_DT_F32, 3, dims, dyn);
  set_scratch(c, x->dims[1], &out[1]);
}

/* dout[T,M], h[N,K], w[E,M,K], tpe, indices, weights f32[T,k] ->
 * dh[N,K], dweights f32[T,k], scratch[., M] */
static void rule_grouped_matmul_combine_grad(xm_ir_rule_ctx_t *c, xm_ir_type_t *out) {
  int e0 = c->errors;
  need_matrix(c, 0);
  need_matrix(c, 1);
  need_weight(c, 2);
  need_i32_vector(c, 3);
  need_i32_vector(c, 4);
  if (c->errors > e0) return;
  xm_ir_rule_need_dim_eq(c, "output dim", 2, 1, 0, 1);
  xm_ir_rule_need_dim_eq(c, "inner dim", 2, 2, 1, 1);
  xm_ir_rule_need_dim_eq(c, "expert count", 3, 0, 2, 0);
  xm_ir_rule_need_dim_eq(c, "row count", 4, 0, 1, 0);
  need_routing_weights(c, 5, 0, 0, 1);
  if (c->errors > e0) return;
  const xm_ir_type_t *h = in(c, 1);
  xm_ir_rule_set_result(&out[0], XM_DT_F32, h->rank, h->dims, h->dynamic);
  copy_type(in(c, 5), &out[1]);
  set_scratch(c, in(c, 0)->dims[1], &out[2]);
}

/* dout[T,M], h[N,K], indices, weights f32[T,k], tpe -> dw[E,M,K], scratch[., M] */
static void rule_grouped_matmul_combine_dw(xm_ir_rule_ctx_t *c, xm_ir_type_t *out) {
  int e0 = c->errors;
  need_matrix(c, 0);
  need_matrix(c, 1);
  need_i32_vector(c, 2);
  need_i32_vector(c, 4);
  if (c->errors > e0) return;
  xm_ir_rule_need_dim_eq(c, "row count", 2, 0, 1, 0);
  need_routing_weights(c, 3, 0, 0, 1);
  if (c->errors > e0) return;
  const xm_ir_type_t *dout = in(c, 0), *h = in(c, 1), *tpe = in(c, 4);
  int64_t dims[3] = {tpe->dims[0], dout->dims[1], h->dims[1]};
  bool dyn[3] = {tpe->dynamic[0], dout->dynamic[1], h->dynamic[1]};
  xm_ir_rule_set_result(&out[0], XM_DT_F32, 3, dims, dyn);
  set_scratch(c, dout->dims[1], &out[1]);
}

/* ---- the LM head fused with the cross-entropy -------------------------------- */

/* x[..., H] (operand ix), w[V, H] (iw), labels i32[...] (il) with x's
 * leading dims, all static; attr chunk. Sets *T (rows) and *chunk. */
static bool need_lm_head(xm_ir_rule_ctx_t *c, int ix, int iw, int il, int64_t *T,
                         int64_t *chunk) {
  int e0 = c->errors;
  xm_ir_rule_attr_int(c, "chunk", 1, INT64_MAX, chunk);
  xm_ir_rule_need_rank(c, ix, -1);
  xm_ir_rule_need_float(c, ix);
  need_matrix(c, iw);
  xm_ir_rule_need_index(c, il);
  if (c->errors > e0) return false;
  const xm_ir_type_t *x = in(c, ix), *lb = in(c, il);
  if (x->rank < 1) {
    xm_ir_rule_error(c, "operand %d %s must have a hidden dim", ix, TT(x));
    return false;
  }
  xm_ir_rule_need_dim_eq(c, "hidden dim", iw, 1, ix, x->rank - 1);
  bool ok = lb->rank == x->rank - 1;
  for (int i = 0; ok && i < lb->rank; i++)
    ok = lb->dims[i] == x->dims[i] && lb->dynamic[i] == x->dynamic[i];
  if (!ok)
    xm_ir_rule_error(c, "operand %d shape %s must equal the leading dims of operand %d shape %s",
                     il, TT(lb), ix, TT(x));
  xm_ir_rule_need_static(c, ix);
  xm_ir_rule_need_static(c, iw);
  if (c->errors > e0) return false;
  *T = xm_ir_type_numel(lb);
  return true;
}

static void set_stats(int64_t T, xm_ir_type_t *out) {
  int64_t dims[2] = {T, 2};
  bool dyn[2] = {false, false};
  xm_ir_rule_set_result(out, XM_DT_F32, 2, dims, dyn);
}

static void set_lm_scratch(int64_t T, int64_t chunk, xm_ir_type_t *out) {
  int64_t n = xm_lm_ce_scratch_floats(T, chunk);
  bool dyn = false;
  xm_ir_rule_set_result(out, XM_DT_F32, 1, &n, &dyn);
}

/* x[...,H], w[V,H], labels -> loss f32[], stats f32[T,2], scratch */
static void rule_lm_head_ce(xm_ir_rule_ctx_t *c, xm_ir_type_t *out) {
  int64_t T = 0, chunk = 0;
  if (!need_lm_head(c, 0, 1, 2, &T, &chunk)) return;
  xm_ir_rule_set_result(&out[0], XM_DT_F32, 0, NULL, NULL);
  set_stats(T, &out[1]);
  set_lm_scratch(T, chunk, &out[2]);
}

/* dloss f32[], x, w, labels, stats f32[T,2] -> dw f32[V,H], dx f32[...,H], scratch */
static void rule_lm_head_ce_grad(xm_ir_rule_ctx_t *c, xm_ir_type_t *out) {
  int64_t T = 0, chunk = 0;
  const xm_ir_type_t *dl = in(c, 0);
  if (dl->rank != 0 || dl->dtype != XM_DT_F32)
    xm_ir_rule_error(c, "operand 0 must be f32[] but has type %s", TT(dl));
  if (!need_lm_head(c, 1, 2, 3, &T, &chunk)) return;
  const xm_ir_type_t *st = in(c, 4);
  if (st->dtype != XM_DT_F32 || st->rank != 2 || st->dims[0] != T || st->dims[1] != 2 ||
      st->dynamic[0] || st->dynamic[1])
    xm_ir_rule_error(c, "operand 4 %s must be f32[%lld, 2] (the forward's stats)", TT(st),
                     (long long)T);
  const xm_ir_type_t *w = in(c, 2), *x = in(c, 1);
  xm_ir_rule_set_result(&out[0], XM_DT_F32, 2, w->dims, w->dynamic);
  xm_ir_rule_set_result(&out[1], XM_DT_F32, x->rank, x->dims, x->dynamic);
  set_lm_scratch(T, chunk, &out[2]);
}

void xm_ir_verify_fused_rule(xm_ir_rule_ctx_t *c, xm_ir_type_t *out) {
  switch (c->op->code) {
  case XM_OP_GATHER_GROUPED_MATMUL: rule_gather_grouped_matmul(c, out); break;
  case XM_OP_GROUPED_MATMUL_COMBINE: rule_grouped_matmul_combine(c, out); break;
  case XM_OP_GATHER_GROUPED_MATMUL_DX: rule_gather_grouped_matmul_dx(c, out); break;
  case XM_OP_GATHER_GROUPED_MATMUL_DW: rule_gather_grouped_matmul_dw(c, out); break;
  case XM_OP_GROUPED_MATMUL_COMBINE_GRAD: rule_grouped_matmul_combine_grad(c, out); break;
  case XM_OP_GROUPED_MATMUL_COMBINE_DW: rule_grouped_matmul_combine_dw(c, out); break;
  case XM_OP_LM_HEAD_CE: rule_lm_head_ce(c, out); break;
  case XM_OP_LM_HEAD_CE_GRAD: rule_lm_head_ce_grad(c, out); break;
  default: xm_ir_rule_error(c, "not a fused MoE op"); break;
  }
}
