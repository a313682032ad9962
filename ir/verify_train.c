/* ir/verify_train.c — result-type rules of the training ops: the backward
 * ops, the persistent state and the optimizer step (ir/ops.def, second
 * half).
 *
 * A backward op's shapes are those of the forward op it differentiates, so
 * each rule here restates the forward op's constraints from the operands it
 * receives (dy stands in for the forward result) and gives the gradients the
 * types of the forward operands. The rules only need what the op itself
 * carries; the autodiff pass is not trusted to have wired them right.
 *
 * State and optimizer ops are different: their meaning depends on where
 * their operands come from (an accumulate must write into a state buffer,
 * adamw must update a param), so those rules look at the defining op of an
 * operand. The verifier has already checked that every operand is a value
 * of the module; the rules still tolerate a missing definition (a module
 * built by hand) and report it instead of crashing.
 *
 * The collectives that act on states and params (reduce_state, ZeRO-1's
 * zero_reduce_scatter and zero_gather) live here for the same reason, and
 * so does adamw's ZeRO-1 form: with attrs group and group_size its grad,
 * m and v are this member's chunk f32[ceil(n/P)] of the flattened param.
 */
#include <string.h>

#include "ir/verify_internal.h"

#define TT(t) (xm_ir_type_text(t).s)

static const xm_ir_type_t *in(const xm_ir_rule_ctx_t *c, int i) {
  return &c->op->operands[i]->type;
}

static void copy_type(const xm_ir_type_t *t, xm_ir_type_t *out) {
  xm_ir_rule_set_result(out, t->dtype, t->rank, t->dims, t->dynamic);
}

/* Operand i must have exactly the type of operand j (sharding ignored). */
static bool need_same_type(xm_ir_rule_ctx_t *c, int i, int j) {
  if (xm_ir_type_equal(in(c, i), in(c, j))) return true;
  xm_ir_rule_error(c, "operand %d has type %s but operand %d has %s (must be equal)", i,
                   TT(in(c, i)), j, TT(in(c, j)));
  return false;
}

static bool need_scalar_f32(xm_ir_rule_ctx_t *c, int i) {
  if (in(c, i)->rank == 0 && in(c, i)->dtype == XM_DT_F32) return true;
  xm_ir_rule_error(c, "operand %d must be f32[] but has type %s", i, TT(in(c, i)));
  return false;
}

/* The op defining operand i must have code `code`. */
static const xm_ir_op_t *need_def(xm_ir_rule_ctx_t *c, int i, xm_ir_opcode_t code) {
  const xm_ir_op_t *def = c->op->operands[i]->def;
  if (def && def->code == code) return def;
  const char *got = def && (int)def->code >= 0 && def->code < XM_OP_COUNT_
                        ? xm_ir_opinfo(def->code)->name
                        : "nothing";
  xm_ir_rule_error(c, "operand %d must be the result of a %s op but comes from %s", i,
                   xm_ir_opinfo(code)->name, got);
  return NULL;
}

/* ---- dense backward ---------------------------------------------------- */

/* dy[...,N], w[N,K] -> dx[...,K] */
static void rule_matmul_dx(xm_ir_rule_ctx_t *c, xm_ir_type_t *out) {
  int e0 = c->errors;
  xm_ir_rule_need_rank(c, 0, -1);
  xm_ir_rule_need_float(c, 0);
  xm_ir_rule_need_rank(c, 1, 2);
  xm_ir_rule_need_float(c, 1);
  if (c->errors > e0) return;
  const xm_ir_type_t *dy = in(c, 0), *w = in(c, 1);
  if (!xm_ir_rule_need_dim_eq(c, "output dim", 0, dy->rank - 1, 1, 0)) return;
  int64_t dims[XM_IR_MAX_RANK];
  bool dyn[XM_IR_MAX_RANK];
  for (int i = 0; i < dy->rank; i++)
    dims[i] = dy->dims[i], dyn[i] = dy->dynamic[i];
  dims[dy->rank - 1] = w->dims[1];
  dyn[dy->rank - 1] = w->dynamic[1];
  xm_ir_rule_set_result(out, dy->dtype, dy->rank, dims, dyn);
}

/* dy[...,N], x[...,K] -> dw[N,K] */
static void rule_matmul_dw(xm_ir_rule_ctx_t *c, xm_ir_type_t *out) {
  int e0 = c->errors;
  xm_ir_rule_need_rank(c, 0, -1);
  xm_ir_rule_need_float(c, 0);
  xm_ir_rule_need_rank(c, 1, -1);
  xm_ir_rule_need_float(c, 1);
  if (c->errors > e0) return;
  const xm_ir_type_t *dy = in(c, 0), *x = in(c, 1);
  if (dy->rank != x->rank) {
    xm_ir_rule_error(c, "operands 0 %s and 1 %s must have the same rank", TT(dy), TT(x));
    return;
  }
  for (int i = 0; i + 1 < dy->rank; i++)
    xm_ir_rule_need_dim_eq(c, "leading dim", 0, i, 1, i);
  if (c->errors > e0) return;
  int64_t dims[2] = {dy->dims[dy->rank - 1], x->dims[x->rank - 1]};
  bool dyn[2] = {dy->dynamic[dy->rank - 1], x->dynamic[x->rank - 1]};
  /* Weight gradients are f32 whatever the operands (bf16 mixed precision
   * accumulates and reduces them in f32). */
  xm_ir_rule_set_result(out, XM_DT_F32, 2, dims, dyn);
}

/* The result type is the op's own: a trailing suffix of the operand's
 * (the sum over the leading dims), or the operand's shape with the last
 * dim 1 (the sum of each row: the gradient of mul's per-row factor). */
static void rule_reduce_to(xm_ir_rule_ctx_t *c, xm_ir_type_t *out) {
  const xm_ir_type_t *x = in(c, 0);
  if (out->dtype != x->dtype)
    xm_ir_rule_error(c, "result type %s has another dtype than operand 0 %s", TT(out), TT(x));
  bool suffix = out->rank <= x->rank;
  for (int i = 0; suffix && i < out->rank; i++) {
    int j = x->rank - out->rank + i;
    suffix = out->dims[i] == x->dims[j] && out->dynamic[i] == x->dynamic[j];
  }
  bool rows = x->rank >= 1 && out->rank == x->rank && out->dims[out->rank - 1] == 1 &&
              !out->dynamic[out->rank - 1];
  for (int i = 0; rows && i < x->rank - 1; i++)
    rows = out->dims[i] == x->dims[i] && out->dynamic[i] == x->dynamic[i];
  if (!suffix && !rows)
    xm_ir_rule_error(c,
                     "result type %s is not a trailing suffix of operand 0 %s nor its shape "
                     "with the last dim 1",
                     TT(out), TT(x));
}

/* dy[...,H], x[...,H], w[H] -> dx (x's type), dw (w's type) */
static void rule_rmsnorm_grad(xm_ir_rule_ctx_t *c, xm_ir_type_t *out) {
  xm_ir_rule_attr_float(c, "eps", true);
  int e0 = c->errors;
  xm_ir_rule_need_rank(c, 1, -1);
  xm_ir_rule_need_float(c, 1);
  xm_ir_rule_need_rank(c, 2, 1);
  xm_ir_rule_need_float(c, 2);
  if (c->errors > e0) return;
  need_same_type(c, 0, 1);
  xm_ir_rule_need_dim_eq(c, "size", 2, 0, 1, in(c, 1)->rank - 1);
  if (c->errors > e0) return;
  copy_type(in(c, 1), &out[0]);
  copy_type(in(c, 2), &out[1]);
}

/* dout[B,S,Hq,Dv], q[B,S,Hq,D], k[B,S,Hkv,D], v[B,S,Hkv,Dv] -> dq, dk, dv */
static void rule_attention_grad(xm_ir_rule_ctx_t *c, xm_ir_type_t *out) {
  xm_ir_rule_attr_float(c, "scale", true);
  bool ok = true;
  for (int i = 0; i < 4; i++)
    ok = xm_ir_rule_need_rank(c, i, 4) && xm_ir_rule_need_float(c, i) && ok;
  if (!ok) return;
  int e0 = c->errors;
  for (int i = 0; i < 2; i++) {
    xm_ir_rule_need_dim_eq(c, i ? "sequence dim" : "batch dim", 2, i, 1, i);
    xm_ir_rule_need_dim_eq(c, i ? "sequence dim" : "batch dim", 3, i, 1, i);
    xm_ir_rule_need_dim_eq(c, i ? "sequence dim" : "batch dim", 0, i, 1, i);
  }
  xm_ir_rule_need_dim_eq(c, "kv head count", 3, 2, 2, 2);
  xm_ir_rule_need_dim_eq(c, "head dim", 2, 3, 1, 3);
  xm_ir_rule_need_dim_eq(c, "head count", 0, 2, 1, 2);
  xm_ir_rule_need_dim_eq(c, "value dim", 0, 3, 3, 3);
  if (c->errors > e0) return;
  if (in(c, 2)->dims[2] < 1 || in(c, 1)->dims[2] % in(c, 2)->dims[2] != 0) {
    xm_ir_rule_error(c, "query heads %lld are not a multiple of key/value heads %lld",
                     (long long)in(c, 1)->dims[2], (long long)in(c, 2)->dims[2]);
    return;
  }
  for (int i = 0; i < 3; i++)
    copy_type(in(c, i + 1), &out[i]);
}

/* Operand `s`'s shape must be operand `l`'s without its last dim (token
 * ids or labels against the rows they index). */
static bool need_leading_dims(xm_ir_rule_ctx_t *c, int s, int l) {
  const xm_ir_type_t *a = in(c, s), *b = in(c, l);
  bool ok = a->rank == b->rank - 1;
  for (int i = 0; ok && i < a->rank; i++)
    ok = a->dims[i] == b->dims[i] && a->dynamic[i] == b->dynamic[i];
  if (!ok)
    xm_ir_rule_error(c, "operand %d shape %s must equal the leading dims of operand %d shape %s", s,
                     TT(a), l, TT(b));
  return ok;
}

/* dy[...,H], tokens i32[...] -> dtable[vocab,H] */
static void rule_embedding_grad(xm_ir_rule_ctx_t *c, xm_ir_type_t *out) {
  int64_t vocab = 0;
  int e0 = c->errors;
  xm_ir_rule_attr_int(c, "vocab", 1, INT64_MAX, &vocab);
  xm_ir_rule_need_rank(c, 0, -2);
  xm_ir_rule_need_float(c, 0);
  xm_ir_rule_need_index(c, 1);
  if (c->errors > e0) return;
  if (!need_leading_dims(c, 1, 0)) return;
  const xm_ir_type_t *dy = in(c, 0);
  int64_t dims[2] = {vocab, dy->dims[dy->rank - 1]};
  bool dyn[2] = {false, dy->dynamic[dy->rank - 1]};
  xm_ir_rule_set_result(out, dy->dtype, 2, dims, dyn);
}

/* dy and every forward input share one float type; each gradient has it. */
static void rule_elementwise_grad(xm_ir_rule_ctx_t *c, xm_ir_type_t *out) {
  if (!xm_ir_rule_need_float(c, 0)) return;
  int e0 = c->errors;
  for (int i = 1; i < c->op->num_operands; i++)
    need_same_type(c, i, 0);
  if (c->errors > e0) return;
  for (int r = 0; r < c->op->num_results; r++)
    copy_type(in(c, 0), &out[r]);
}

/* dloss f32[], logits[...,V], labels[...] -> dlogits */
static void rule_cross_entropy_grad(xm_ir_rule_ctx_t *c, xm_ir_type_t *out) {
  int e0 = c->errors;
  need_scalar_f32(c, 0);
  xm_ir_rule_need_rank(c, 1, -1);
  xm_ir_rule_need_float(c, 1);
  xm_ir_rule_need_index(c, 2);
  if (c->errors > e0) return;
  if (!need_leading_dims(c, 2, 1)) return;
  copy_type(in(c, 1), out);
}

/* ---- router and MoE backward ------------------------------------------- */

static const char *const k_scoring_choices[] = {"softmax", "sigmoid", NULL};

/* Operand i is f32[T,E]. */
static bool need_scores(xm_ir_rule_ctx_t *c, int i) {
  return xm_ir_rule_need_rank(c, i, 2) && xm_ir_rule_need_dtype(c, i, XM_DT_F32);
}

/* dloss f32[], scores f32[T,E], experts i32[T,k] -> dscores f32[T,E] */
static void rule_aux_loss_grad(xm_ir_rule_ctx_t *c, xm_ir_type_t *out) {
  xm_ir_rule_attr_float(c, "alpha", true);
  int e0 = c->errors;
  need_scalar_f32(c, 0);
  need_scores(c, 1);
  xm_ir_rule_need_rank(c, 2, 2);
  xm_ir_rule_need_dtype(c, 2, XM_DT_I32);
  if (c->errors > e0) return;
  if (!xm_ir_rule_need_dim_eq(c, "token count", 2, 0, 1, 0)) return;
  copy_type(in(c, 1), out);
}

/* dscores f32[T,E], scores f32[T,E] -> dlogits f32[T,E] */
static void rule_router_score_grad(xm_ir_rule_ctx_t *c, xm_ir_type_t *out) {
  xm_ir_rule_attr_choice(c, "scoring", k_scoring_choices, true);
  int e0 = c->errors;
  need_scores(c, 0);
  if (c->errors > e0) return;
  if (!need_same_type(c, 1, 0)) return;
  copy_type(in(c, 0), out);
}

/* dweights f32[T,k], scores f32[T,E], experts i32[T,k] -> dscores f32[T,E] */
static void rule_topk_route_grad(xm_ir_rule_ctx_t *c, xm_ir_type_t *out) {
  int e0 = c->errors;
  xm_ir_rule_need_rank(c, 0, 2);
  xm_ir_rule_need_dtype(c, 0, XM_DT_F32);
  need_scores(c, 1);
  xm_ir_rule_need_rank(c, 2, 2);
  xm_ir_rule_need_dtype(c, 2, XM_DT_I32);
  xm_ir_rule_attr_bool(c, "norm_topk_prob", true);
  xm_ir_rule_attr_float(c, "routed_scaling", true);
  if (c->errors > e0) return;
  int64_t k = 0;
  if (!xm_ir_rule_attr_int(c, "k", 1, in(c, 1)->dims[1], &k)) return;
  xm_ir_rule_need_dim_eq(c, "token count", 0, 0, 1, 0);
  xm_ir_rule_need_dim_eq(c, "token count", 2, 0, 1, 0);
  xm_ir_rule_need_dim_eq(c, "slots per token", 2, 1, 0, 1);
  if (c->errors > e0) return;
  if (in(c, 0)->dims[1] != k)
    xm_ir_rule_error(c, "operand 0 %s must have k = %lld slots per token", TT(in(c, 0)),
                     (long long)k);
  if (c->errors > e0) return;
  copy_type(in(c, 1), out);
}

/* dy[N,H], indices i32[N] -> dx[tokens,H] */
static void rule_gather_rows_grad(xm_ir_rule_ctx_t *c, xm_ir_type_t *out) {
  int64_t k = 0, tokens = 0;
  int e0 = c->errors;
  xm_ir_rule_attr_int(c, "k", 1, INT64_MAX, &k);
  xm_ir_rule_attr_int(c, "tokens", 1, INT64_MAX, &tokens);
  xm_ir_rule_need_rank(c, 0, 2);
  xm_ir_rule_need_float(c, 0);
  xm_ir_rule_need_rank(c, 1, 1);
  xm_ir_rule_need_dtype(c, 1, XM_DT_I32);
  if (c->errors > e0) return;
  if (!xm_ir_rule_need_dim_eq(c, "row count", 1, 0, 0, 0)) return;
  int64_t slots;
  if (__builtin_mul_overflow(tokens, k, &slots) || in(c, 0)->dims[0] > slots) {
    xm_ir_rule_error(c, "operand 0 %s has more rows than tokens * k = %lld * %lld", TT(in(c, 0)),
                     (long long)tokens, (long long)k);
    return;
  }
  int64_t dims[2] = {tokens, in(c, 0)->dims[1]};
  bool dyn[2] = {false, in(c, 0)->dynamic[1]};
  xm_ir_rule_set_result(out, in(c, 0)->dtype, 2, dims, dyn);
}

/* Operand i is the i32[E] row count per expert, E = dim 0 of operand j. */
static bool need_tpe(xm_ir_rule_ctx_t *c, int i, int j) {
  return xm_ir_rule_need_rank(c, i, 1) && xm_ir_rule_need_dtype(c, i, XM_DT_I32) &&
         xm_ir_rule_need_dim_eq(c, "expert count", i, 0, j, 0);
}

/* dy[N,M], w[E,M,K], tpe i32[E] -> dx[N,K] */
static void rule_grouped_matmul_dx(xm_ir_rule_ctx_t *c, xm_ir_type_t *out) {
  int e0 = c->errors;
  xm_ir_rule_need_rank(c, 0, 2);
  xm_ir_rule_need_float(c, 0);
  xm_ir_rule_need_rank(c, 1, 3);
  xm_ir_rule_need_float(c, 1);
  if (c->errors > e0) return;
  need_tpe(c, 2, 1);
  xm_ir_rule_need_dim_eq(c, "output dim", 0, 1, 1, 1);
  if (c->errors > e0) return;
  const xm_ir_type_t *dy = in(c, 0), *w = in(c, 1);
  int64_t dims[2] = {dy->dims[0], w->dims[2]};
  bool dyn[2] = {dy->dynamic[0], w->dynamic[2]};
  xm_ir_rule_set_result(out, dy->dtype, 2, dims, dyn);
}

/* dy[N,M], x[N,K], tpe i32[E] -> dw[E,M,K] */
static void rule_grouped_matmul_dw(xm_ir_rule_ctx_t *c, xm_ir_type_t *out) {
  int e0 = c->errors;
  xm_ir_rule_need_rank(c, 0, 2);
  xm_ir_rule_need_float(c, 0);
  xm_ir_rule_need_rank(c, 1, 2);
  xm_ir_rule_need_float(c, 1);
  xm_ir_rule_need_rank(c, 2, 1);
  xm_ir_rule_need_dtype(c, 2, XM_DT_I32);
  if (c->errors > e0) return;
  if (!xm_ir_rule_need_dim_eq(c, "row count", 1, 0, 0, 0)) return;
  const xm_ir_type_t *dy = in(c, 0), *x = in(c, 1), *tpe = in(c, 2);
  int64_t dims[3] = {tpe->dims[0], dy->dims[1], x->dims[1]};
  bool dyn[3] = {tpe->dynamic[0], dy->dynamic[1], x->dynamic[1]};
  xm_ir_rule_set_result(out, XM_DT_F32, 3, dims, dyn); /* f32 as matmul_dw's */
}

/* dout[T,H], y[N,H], indices i32[N], weights f32[T,k] -> dy[N,H], dweights */
static void rule_scatter_combine_grad(xm_ir_rule_ctx_t *c, xm_ir_type_t *out) {
  int e0 = c->errors;
  xm_ir_rule_need_rank(c, 0, 2);
  xm_ir_rule_need_float(c, 0);
  xm_ir_rule_need_rank(c, 1, 2);
  xm_ir_rule_need_float(c, 1);
  xm_ir_rule_need_rank(c, 2, 1);
  xm_ir_rule_need_dtype(c, 2, XM_DT_I32);
  xm_ir_rule_need_rank(c, 3, 2);
  xm_ir_rule_need_dtype(c, 3, XM_DT_F32);
  if (c->errors > e0) return;
  xm_ir_rule_need_dim_eq(c, "token count", 3, 0, 0, 0);
  xm_ir_rule_need_dim_eq(c, "hidden size", 1, 1, 0, 1);
  xm_ir_rule_need_dim_eq(c, "slot count", 2, 0, 1, 0);
  if (c->errors > e0) return;
  copy_type(in(c, 1), &out[0]);
  copy_type(in(c, 3), &out[1]);
}

/* ---- state and the optimizer step -------------------------------------- */

static const char *const k_state_kinds[] = {"grad", "adam_m", "adam_v", "load", NULL};

/* The type is free, like a param's. */
static void rule_state(xm_ir_rule_ctx_t *c) {
  xm_ir_rule_attr_choice(c, "name", NULL, true);
  xm_ir_rule_attr_choice(c, "kind", k_state_kinds, true);
  xm_ir_rule_attr_choice(c, "of", NULL, true);
}

static void rule_accumulate(xm_ir_rule_ctx_t *c) {
  const xm_ir_op_t *acc = need_def(c, 0, XM_OP_STATE);
  if (!need_same_type(c, 1, 0)) return;
  xm_dtype_t dt = in(c, 0)->dtype;
  bool is_load = acc && strcmp(xm_ir_op_get_string(acc, "kind", ""), "load") == 0;
  if (dt != XM_DT_F32 && !(dt == XM_DT_I32 && is_load))
    xm_ir_rule_error(c, "operand 0 %s must be f32 (i32 only for a load state)", TT(in(c, 0)));
}

static void rule_zero(xm_ir_rule_ctx_t *c) { need_def(c, 0, XM_OP_STATE); }

/* host_read: a scalar loss or norm, or a permute's row-count table. */
static const char *const k_host_read_choices[] = {"loss", "ce_loss", "mtp_loss", "norm_sq", "rows", NULL};

static void rule_host_read(xm_ir_rule_ctx_t *c) {
  const char *as = xm_ir_op_get_string(c->op, "as", NULL);
  bool known = false;
  for (int i = 0; as && k_host_read_choices[i]; i++)
    known = known || strcmp(as, k_host_read_choices[i]) == 0;
  if (!known) {
    xm_ir_rule_error(c, "attr as must be one of loss, ce_loss, mtp_loss, norm_sq, rows");
    return;
  }
  const xm_ir_type_t *t = in(c, 0);
  if (strcmp(as, "rows") == 0) {
    need_def(c, 0, XM_OP_PERMUTE);
    if (t->dtype != XM_DT_I32 || t->rank != 1 || t->dynamic[0])
      xm_ir_rule_error(c, "rows reads a static i32[E], not %s", TT(t));
  } else if (t->dtype != XM_DT_F32 || t->rank != 0) {
    xm_ir_rule_error(c, "%s reads an f32[] scalar, not %s", as, TT(t));
  }
}

static void rule_grad_norm_sq(xm_ir_rule_ctx_t *c, xm_ir_type_t *out) {
  xm_ir_rule_set_result(out, XM_DT_F32, 0, NULL, NULL);
  if (c->op->num_operands < 1) {
    xm_ir_rule_error(c, "grad_norm_sq needs at least one operand");
    return;
  }
  for (int i = 0; i < c->op->num_operands; i++)
    xm_ir_rule_need_float(c, i);
}

/* ceil(n / p): the ZeRO-1 chunk of n elements over p members (p >= 1). */
static int64_t zero_chunk(int64_t n, int64_t p) { return n / p + (n % p != 0); }

/* Under ZeRO-1 the gradient operand is this member's reduced chunk: the
 * result of zero_reduce_scatter, or a state holding it. */
static void need_chunk_grad_def(xm_ir_rule_ctx_t *c, int i) {
  const xm_ir_op_t *def = c->op->operands[i]->def;
  if (def && (def->code == XM_OP_STATE || def->code == XM_OP_ZERO_REDUCE_SCATTER)) return;
  const char *got = def && (int)def->code >= 0 && def->code < XM_OP_COUNT_
                        ? xm_ir_opinfo(def->code)->name
                        : "nothing";
  xm_ir_rule_error(c,
                   "operand %d must be the result of a state or zero_reduce_scatter op but "
                   "comes from %s",
                   i, got);
}

/* param, grad, m, v, norm_sq f32[]. With attrs group and group_size
 * (ZeRO-1) grad, m and v are this member's chunk f32[ceil(n/P)] of the
 * flattened param; without them they have the param's type. */
static void rule_adamw(xm_ir_rule_ctx_t *c) {
  xm_ir_rule_attr_bool(c, "decay", true);
  bool zero = xm_ir_op_attr(c->op, "group") || xm_ir_op_attr(c->op, "group_size");
  int64_t group_size = xm_ir_rule_group(c, false);
  need_def(c, 0, XM_OP_PARAM);
  xm_ir_rule_need_float(c, 0);
  need_scalar_f32(c, 4);
  if (!zero) {
    for (int i = 1; i < 4; i++) {
      need_def(c, i, XM_OP_STATE);
      need_same_type(c, i, 0);
    }
    return;
  }
  need_chunk_grad_def(c, 1);
  need_def(c, 2, XM_OP_STATE);
  need_def(c, 3, XM_OP_STATE);
  if (group_size < 1) return;
  int64_t n = xm_ir_type_numel(in(c, 0));
  if (n < 0) {
    xm_ir_rule_error(c, "operand 0 %s has too many elements", TT(in(c, 0)));
    return;
  }
  int64_t chunk = zero_chunk(n, group_size);
  xm_ir_type_t want = xm_ir_type_make(XM_DT_F32, 1, &chunk);
  for (int i = 1; i < 4; i++) {
    if (xm_ir_type_equal(in(c, i), &want)) continue;
    xm_ir_rule_error(c,
                     "operand %d has type %s but ZeRO-1 over group_size %lld needs the chunk "
                     "%s of operand 0 %s (ceil(%lld / %lld) elements)",
                     i, TT(in(c, i)), (long long)group_size, TT(&want), TT(in(c, 0)), (long long)n,
                     (long long)group_size);
  }
}

/* ---- collectives on states and params ---------------------------------- */

/* A state summed over the group in place: gradients (f32) and expert
 * loads (i32). */
static void rule_reduce_state(xm_ir_rule_ctx_t *c) {
  xm_ir_rule_group(c, true);
  const xm_ir_op_t *st = need_def(c, 0, XM_OP_STATE);
  xm_dtype_t dt = in(c, 0)->dtype;
  bool is_load = st && strcmp(xm_ir_op_get_string(st, "kind", ""), "load") == 0;
  if (dt != XM_DT_F32 && !(dt == XM_DT_I32 && is_load))
    xm_ir_rule_error(c, "operand 0 %s must be f32 (i32 only for a load state)", TT(in(c, 0)));
}

/* grad f32[...] (n elements) -> f32[ceil(n/P)] */
static void rule_zero_reduce_scatter(xm_ir_rule_ctx_t *c, xm_ir_type_t *out) {
  int64_t group_size = xm_ir_rule_group(c, true);
  int e0 = c->errors;
  xm_ir_rule_need_dtype(c, 0, XM_DT_F32);
  xm_ir_rule_need_static(c, 0);
  if (c->errors > e0 || group_size < 1) return;
  int64_t n = xm_ir_type_numel(in(c, 0));
  if (n < 0) {
    xm_ir_rule_error(c, "operand 0 %s has too many elements", TT(in(c, 0)));
    return;
  }
  int64_t chunk = zero_chunk(n, group_size);
  xm_ir_rule_set_result(out, XM_DT_F32, 1, &chunk, NULL);
}

/* param f32: every member's updated chunk gathered into it in place. */
static void rule_zero_gather(xm_ir_rule_ctx_t *c) {
  xm_ir_rule_group(c, true);
  need_def(c, 0, XM_OP_PARAM);
  xm_ir_rule_need_dtype(c, 0, XM_DT_F32);
}

/* bias f32[E] (a param), load i32[E] (a state) */
static void rule_aux_free_update(xm_ir_rule_ctx_t *c) {
  xm_ir_rule_attr_float(c, "gamma", true);
  need_def(c, 0, XM_OP_PARAM);
  need_def(c, 1, XM_OP_STATE);
  int e0 = c->errors;
  xm_ir_rule_need_rank(c, 0, 1);
  xm_ir_rule_need_dtype(c, 0, XM_DT_F32);
  xm_ir_rule_need_rank(c, 1, 1);
  xm_ir_rule_need_dtype(c, 1, XM_DT_I32);
  if (c->errors > e0) return;
  xm_ir_rule_need_dim_eq(c, "expert count", 1, 0, 0, 0);
}

/* ---- dispatch ---------------------------------------------------------- */

void xm_ir_verify_train_rule(xm_ir_rule_ctx_t *c, xm_ir_type_t *out) {
  switch (c->op->code) {
  case XM_OP_MATMUL_DX: rule_matmul_dx(c, out); break;
  case XM_OP_MATMUL_DW: rule_matmul_dw(c, out); break;
  case XM_OP_REDUCE_TO: rule_reduce_to(c, out); break;
  case XM_OP_RMSNORM_GRAD: rule_rmsnorm_grad(c, out); break;
  case XM_OP_ATTENTION_GRAD: rule_attention_grad(c, out); break;
  case XM_OP_EMBEDDING_GRAD: rule_embedding_grad(c, out); break;
  case XM_OP_SWIGLU_GRAD:
  case XM_OP_SILU_GRAD:
  case XM_OP_GELU_GRAD:
  case XM_OP_SIGMOID_GRAD: rule_elementwise_grad(c, out); break;
  case XM_OP_CROSS_ENTROPY_GRAD: rule_cross_entropy_grad(c, out); break;
  case XM_OP_AUX_LOSS_GRAD: rule_aux_loss_grad(c, out); break;
  case XM_OP_ROUTER_SCORE_GRAD: rule_router_score_grad(c, out); break;
  case XM_OP_TOPK_ROUTE_GRAD: rule_topk_route_grad(c, out); break;
  case XM_OP_GATHER_ROWS_GRAD: rule_gather_rows_grad(c, out); break;
  case XM_OP_GROUPED_MATMUL_DX: rule_grouped_matmul_dx(c, out); break;
  case XM_OP_GROUPED_MATMUL_DW: rule_grouped_matmul_dw(c, out); break;
  case XM_OP_SCATTER_COMBINE_GRAD: rule_scatter_combine_grad(c, out); break;
  case XM_OP_STATE: rule_state(c); break;
  case XM_OP_ACCUMULATE: rule_accumulate(c); break;
  case XM_OP_ZERO: rule_zero(c); break;
  case XM_OP_HOST_READ: rule_host_read(c); break;
  case XM_OP_GRAD_NORM_SQ: rule_grad_norm_sq(c, out); break;
  case XM_OP_ADAMW: rule_adamw(c); break;
  case XM_OP_AUX_FREE_UPDATE: rule_aux_free_update(c); break;
  case XM_OP_REDUCE_STATE: rule_reduce_state(c); break;
  case XM_OP_ZERO_REDUCE_SCATTER: rule_zero_reduce_scatter(c, out); break;
  case XM_OP_ZERO_GATHER: rule_zero_gather(c); break;
  default: xm_ir_rule_error(c, "is not a training op (internal dispatch error)"); break;
  }
}
