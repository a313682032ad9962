/* ir/model.c — the forward training graph of a whole model (docs/design.md, Model semantics).
 *
 * The builder walks the spec once, layer by layer, appending ops in
 * topological order with global shapes: B = micro_batch, S = seq_len,
 * T = B*S tokens. Every value is f32 except token ids, labels and the
 * routing integers (i32); the training dtype is applied by a later pass so
 * that this graph stays the numerical reference.
 *
 * Parameters are param ops named by their Hugging Face tensor names, so a
 * checkpoint maps onto the graph without a translation table, and each
 * carries attr role (ir/roles.def): how a parallel layout places it, which
 * the builder knows from what it builds and the shard pass reads, so no
 * later stage decides anything by matching names. Routed
 * experts are stacked along dim 0 into one tensor per projection whose
 * name carries a literal "{e}" (the checkpoint writer expands it); this is
 * the layout grouped GEMMs and expert parallelism want. The MoE block is
 * the padding-free pipeline of docs/design.md, Padding-free token permutation (router, top-k,
 * permute, gather, grouped GEMMs, scatter-combine) on the [T,H] token matrix.
 *
 * Every op of layer i carries the int attribute layer = i (params too), so
 * later passes (recompute, pipeline stages, reports) can group ops without
 * parsing names. Each op's location is the JSON pointer of the spec field
 * that shaped it, which is what a user should edit when that op is a
 * problem (too much memory, too slow, rejected by a pass). The params whose
 * dim 0 is indexed by expert slot (the stacked experts, the router's weight
 * rows and correction bias) carry attr expert_slots, which an expert
 * placement (docs/placement.md) permutes at the checkpoint edges.
 *
 * Every spec the validator accepts is built; a feature training could not
 * do would be refused here with XM_ERR_UNSUPPORTED before any module
 * exists, so that callers never see a half-built graph (none is today: the
 * last, Qwen2-MoE's shared-expert gate, trains).
 */
#include "ir/model.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "frontend/hf_arch.h"

typedef struct {
  xm_ir_module_t *m;
  const xm_spec_t *spec;
  xm_hf_arch_t arch;   /* the checkpoint names' architecture */
  int64_t layer;       /* current layer, -1 outside the layers */
  int64_t B, S, T;     /* micro-batch, sequence length, tokens */
  int64_t H, D;        /* hidden size, head dim */
  double out_std;      /* init std of output projections (Megatron scaling) */
  xm_ir_value_t **aux; /* aux losses of the MoE layers so far (arena) */
  int64_t num_aux;
} builder_t;

#define LOC_VOCAB "/model/vocab"
#define LOC_HEADS "/model/heads"
#define LOC_ROPE "/model/rope_theta"
#define LOC_ROPE_DIM "/model/qk_rope_head_dim"
#define LOC_Q_LORA "/model/q_lora_rank"
#define LOC_KV_LORA "/model/kv_lora_rank"
#define LOC_NORM "/model/norm_eps"
#define LOC_ATTN_BIAS "/model/attention_bias"
#define LOC_DENSE "/model/dense_ffn"
#define LOC_EXPERTS "/moe/experts"
#define LOC_TOPK "/moe/top_k"
#define LOC_CAPACITY "/moe/capacity_factor"
#define LOC_EXPERT_FFN "/moe/expert_ffn"
#define LOC_SHARED "/moe/shared_experts"
#define LOC_SHARED_GATE "/moe/shared_expert_gate"
#define LOC_AUX "/moe/aux_alpha"
#define LOC_AUX_FREE "/moe/aux_free_gamma"
#define LOC_INPUTS "/training/seq_len"
#define LOC_MTP "/model/mtp_layers"
#define LOC_MTP_WEIGHT "/training/mtp_loss_weight"

/* ---- small helpers ----------------------------------------------------- */

static xm_ir_type_t make_type(xm_dtype_t dt, const int64_t *dims, int rank) {
  return xm_ir_type_make(dt, rank, dims);
}

#define NDIMS(...) ((int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
#define F32(...) make_type(XM_DT_F32, (int64_t[]){__VA_ARGS__}, NDIMS(__VA_ARGS__))
#define I32(...) make_type(XM_DT_I32, (int64_t[]){__VA_ARGS__}, NDIMS(__VA_ARGS__))

static xm_ir_type_t scalar_f32(void) { return xm_ir_type_make(XM_DT_F32, 0, NULL); }

/* `t` with its last dim replaced by n: the result of x w^T. */
static xm_ir_type_t with_last(xm_ir_type_t t, int64_t n) {
  XM_ASSERT(t.rank > 0);
  t.dims[t.rank - 1] = n;
  t.dynamic[t.rank - 1] = false;
  return t;
}

/* Appends an op and tags it with the current layer. */
static xm_ir_op_t *emit(builder_t *b, xm_ir_opcode_t code, int nops, xm_ir_value_t *const *ops,
                        int nres, const xm_ir_type_t *types, const char *loc) {
  xm_ir_op_t *op = xm_ir_op_append(b->m, code, nops, ops, nres, types, loc);
  XM_ASSERT(op != NULL);
  if (b->layer >= 0) xm_ir_op_set_int(b->m, op, "layer", b->layer);
  return op;
}

static xm_ir_op_t *emit1(builder_t *b, xm_ir_opcode_t code, int nops, xm_ir_value_t *const *ops,
                         xm_ir_type_t type, const char *loc) {
  return emit(b, code, nops, ops, 1, &type, loc);
}

#define OPS(...)                                                                                   \
  (xm_ir_value_t *[]) { __VA_ARGS__ }
#define NOPS(...) ((int)(sizeof(OPS(__VA_ARGS__)) / sizeof(xm_ir_value_t *)))
/* One-result op, returning the op (for attributes). */
#define OP(b, code, type, loc, ...) emit1(b, code, NOPS(__VA_ARGS__), OPS(__VA_ARGS__), type, loc)
/* One-result op without attributes, returning its value. */
#define VAL(b, code, type, loc, ...) (OP(b, code, type, loc, __VA_ARGS__)->results[0])

/* A parameter; `name` is the full canonical HF tensor name, stored as the
 * spec's architecture names it (frontend/hf_arch.h). std < 0: none. */
static xm_ir_value_t *param_named(builder_t *b, const char *name, xm_ir_role_t role,
                                  const char *init, double std, xm_ir_type_t type,
                                  const char *loc) {
  xm_ir_op_t *op = emit1(b, XM_OP_PARAM, 0, NULL, type, loc);
  char arch_name[256];
  xm_hf_param_name(b->arch, name, arch_name, sizeof arch_name);
  xm_ir_op_set_string(b->m, op, "name", arch_name);
  xm_ir_op_set_string(b->m, op, "role", xm_ir_role_name(role));
  xm_ir_op_set_string(b->m, op, "init", init);
  if (std >= 0) xm_ir_op_set_float(b->m, op, "std", std);
  return op->results[0];
}

/* A parameter of the current layer: model.layers.{i}.<suffix>. */
static xm_ir_value_t *layer_param(builder_t *b, const char *suffix, xm_ir_role_t role,
                                  const char *init, double std, xm_ir_type_t type,
                                  const char *loc) {
  char name[256];
  int n = snprintf(name, sizeof name, "model.layers.%" PRId64 ".%s", b->layer, suffix);
  XM_ASSERT(n > 0 && (size_t)n < sizeof name);
  return param_named(b, name, role, init, std, type, loc);
}

static xm_ir_value_t *matmul(builder_t *b, xm_ir_value_t *x, xm_ir_value_t *w, const char *loc) {
  return VAL(b, XM_OP_MATMUL, with_last(x->type, w->type.dims[0]), loc, x, w);
}

static xm_ir_value_t *rmsnorm(builder_t *b, xm_ir_value_t *x, xm_ir_value_t *w) {
  xm_ir_op_t *op = OP(b, XM_OP_RMSNORM, x->type, LOC_NORM, x, w);
  xm_ir_op_set_float(b->m, op, "eps", b->spec->model.norm_eps);
  return op->results[0];
}

/* RMSNorm of the current layer with a weight named <suffix> of width n. */
static xm_ir_value_t *layer_rmsnorm(builder_t *b, xm_ir_value_t *x, const char *suffix, int64_t n,
                                    xm_ir_role_t role) {
  xm_ir_value_t *w = layer_param(b, suffix, role, "ones", -1, F32(n), LOC_NORM);
  return rmsnorm(b, x, w);
}

static xm_ir_value_t *reshape(builder_t *b, xm_ir_value_t *x, xm_ir_type_t to, const char *loc) {
  return VAL(b, XM_OP_RESHAPE, to, loc, x);
}

/* ---- RoPE -------------------------------------------------------------- */

/* transformers' yarn_get_mscale. */
static double yarn_get_mscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

/* Dim index (of rd rotary dims) whose wavelength makes `rotations` turns
 * over the original context (YaRN's find_correction_dim). */
static double yarn_correction_dim(double rotations, int64_t rd, double theta, double orig) {
  return (double)rd * log(orig / (rotations * 2.0 * 3.14159265358979323846)) / (2.0 * log(theta));
}

/* RoPE over the rd elements from `off` of each row of x[B,S,nh,D], with
 * YaRN's schedule when the spec extends the context: the correction range
 * and the factor on cos/sin as transformers' _compute_yarn_parameters
 * derives them (the kernel blends the frequencies, runtime/cpu/kernels.h). */
static xm_ir_value_t *rope(builder_t *b, xm_ir_value_t *x, int64_t off, int64_t rd,
                           const char *loc) {
  const xm_model_spec_t *ms = &b->spec->model;
  xm_ir_op_t *op = OP(b, XM_OP_ROPE, x->type, loc, x);
  xm_ir_op_set_float(b->m, op, "theta", ms->rope_theta);
  int64_t D = x->type.dims[3];
  if (off != 0 || rd != D) {
    xm_ir_op_set_int(b->m, op, "rot_offset", off);
    xm_ir_op_set_int(b->m, op, "rot_dim", rd);
  }
  if (ms->rope_interleave) xm_ir_op_set_bool(b->m, op, "interleave", true);
  if (ms->yarn_factor > 1) {
    double f = ms->yarn_factor, orig = (double)ms->yarn_original_max_position;
    double lo = yarn_correction_dim(ms->yarn_beta_fast, rd, ms->rope_theta, orig);
    double hi = yarn_correction_dim(ms->yarn_beta_slow, rd, ms->rope_theta, orig);
    if (ms->yarn_truncate) lo = floor(lo), hi = ceil(hi);
    /* Clamped each on its own side as transformers does: for a tiny
     * original context hi ends below lo, and its ramp (i - lo) / (hi - lo)
     * then keeps every frequency (+ 0.0: no -0 in the IR text). */
    lo = (lo > 0 ? lo : 0) + 0.0;
    hi = (hi < (double)(rd - 1) ? hi : (double)(rd - 1)) + 0.0;
    double att = ms->yarn_attention_factor;
    if (att <= 0)
      att = ms->yarn_mscale > 0 && ms->yarn_mscale_all_dim > 0
                ? yarn_get_mscale(f, ms->yarn_mscale) / yarn_get_mscale(f, ms->yarn_mscale_all_dim)
                : yarn_get_mscale(f, 1.0);
    xm_ir_op_set_float(b->m, op, "yarn_factor", f);
    xm_ir_op_set_float(b->m, op, "yarn_low", lo);
    xm_ir_op_set_float(b->m, op, "yarn_high", hi);
    xm_ir_op_set_float(b->m, op, "mscale", att);
  }
  return op->results[0];
}

/* ---- attention --------------------------------------------------------- */

/* One of q/k/v: projection, optional bias, optional OLMoE-style norm over
 * the whole projection, then split into heads, optional Qwen3-style norm
 * per head. `which` is "q", "k" or "v"; `heads` the number of its heads. */
static xm_ir_value_t *attn_project(builder_t *b, xm_ir_value_t *hn, const char *which,
                                   int64_t heads) {
  const xm_model_spec_t *ms = &b->spec->model;
  int64_t width = heads * b->D;
  bool is_qk = which[0] != 'v';
  char suffix[64];

  snprintf(suffix, sizeof suffix, "self_attn.%s_proj.weight", which);
  xm_ir_value_t *w =
      layer_param(b, suffix, XM_ROLE_TP_COLUMN, "normal", 0.02, F32(width, b->H), LOC_HEADS);
  xm_ir_value_t *y = matmul(b, hn, w, LOC_HEADS);
  if (ms->attention_bias) {
    snprintf(suffix, sizeof suffix, "self_attn.%s_proj.bias", which);
    xm_ir_value_t *bias =
        layer_param(b, suffix, XM_ROLE_TP_COLUMN, "zeros", -1, F32(width), LOC_ATTN_BIAS);
    y = VAL(b, XM_OP_ADD, y->type, LOC_ATTN_BIAS, y, bias);
  }
  snprintf(suffix, sizeof suffix, "self_attn.%s_norm.weight", which);
  /* Either norm weight meets only this rank's heads under TP (the full
   * norm is refused with tp > 1 by frontend/layout.c). */
  if (is_qk && ms->qk_norm == XM_QK_NORM_FULL)
    y = layer_rmsnorm(b, y, suffix, width, XM_ROLE_TP_PARTIAL);
  y = reshape(b, y, F32(b->B, b->S, heads, b->D), LOC_HEADS);
  if (is_qk && ms->qk_norm == XM_QK_NORM_HEAD)
    y = layer_rmsnorm(b, y, suffix, b->D, XM_ROLE_TP_PARTIAL);
  if (is_qk) y = rope(b, y, 0, b->D, LOC_ROPE);
  return y;
}

/* ---- multi-head latent attention (DeepSeek-V2/V3) ---------------------- */

/* RMSNorm of the current layer with its own eps (MLA's low-rank norms use
 * transformers' DeepseekV3RMSNorm default 1e-6, not rms_norm_eps). */
static xm_ir_value_t *layer_rmsnorm_eps(builder_t *b, xm_ir_value_t *x, const char *suffix,
                                        int64_t n, double eps, const char *loc) {
  xm_ir_value_t *w = layer_param(b, suffix, XM_ROLE_REPLICATED, "ones", -1, F32(n), loc);
  xm_ir_op_t *op = OP(b, XM_OP_RMSNORM, x->type, loc, x, w);
  xm_ir_op_set_float(b->m, op, "eps", eps);
  return op->results[0];
}

/* Splits x[..., da+db] into its first da and last db elements. */
static void split_last(builder_t *b, xm_ir_value_t *x, int64_t da, xm_ir_value_t **pa,
                       xm_ir_value_t **pb, const char *loc) {
  xm_ir_type_t t[2] = {x->type, x->type};
  t[0].dims[t[0].rank - 1] = da;
  t[1].dims[t[1].rank - 1] = x->type.dims[x->type.rank - 1] - da;
  xm_ir_op_t *op = emit(b, XM_OP_SPLIT, 1, OPS(x), 2, t, loc);
  *pa = op->results[0];
  *pb = op->results[1];
}

/* h = x + MLA(RMSNorm(x)), transformers' DeepseekV3Attention:
 *   q = q_b_proj(q_a_layernorm(q_a_proj(hn))) (q_proj(hn) when q_lora_rank
 *       is 0), per head [qk_nope | qk_rope], RoPE on the rope part;
 *   [latent | k_rope] = kv_a_proj_with_mqa(hn); k_rope (one head, shared
 *       by all) gets RoPE; kv_b_proj(kv_a_layernorm(latent)) gives per head
 *       [k_nope | v]; k = [k_nope | k_rope];
 *   softmax scale (qk_nope + qk_rope)^-0.5, times YaRN's mscale_all_dim
 *       factor squared when the rope is YaRN-scaled. */
static xm_ir_value_t *build_mla(builder_t *b, xm_ir_value_t *hn) {
  const xm_model_spec_t *ms = &b->spec->model;
  int64_t nh = ms->heads, dn = ms->qk_nope_head_dim, dr = ms->qk_rope_head_dim;
  int64_t dv = ms->v_head_dim, qk = dn + dr, kvr = ms->kv_lora_rank, qr = ms->q_lora_rank;
  xm_ir_value_t *q;
  if (qr > 0) {
    xm_ir_value_t *wa = layer_param(b, "self_attn.q_a_proj.weight", XM_ROLE_REPLICATED, "normal",
                                    0.02, F32(qr, b->H), LOC_Q_LORA);
    xm_ir_value_t *qa = matmul(b, hn, wa, LOC_Q_LORA);
    qa = layer_rmsnorm_eps(b, qa, "self_attn.q_a_layernorm.weight", qr, 1e-6, LOC_Q_LORA);
    xm_ir_value_t *wb = layer_param(b, "self_attn.q_b_proj.weight", XM_ROLE_TP_COLUMN, "normal",
                                    0.02, F32(nh * qk, qr), LOC_Q_LORA);
    q = matmul(b, qa, wb, LOC_Q_LORA);
  } else {
    xm_ir_value_t *w = layer_param(b, "self_attn.q_proj.weight", XM_ROLE_TP_COLUMN, "normal",
                                   0.02, F32(nh * qk, b->H), LOC_HEADS);
    q = matmul(b, hn, w, LOC_HEADS);
  }
  q = reshape(b, q, F32(b->B, b->S, nh, qk), LOC_HEADS);
  q = rope(b, q, dn, dr, LOC_ROPE_DIM);

  xm_ir_value_t *wkva = layer_param(b, "self_attn.kv_a_proj_with_mqa.weight", XM_ROLE_REPLICATED,
                                    "normal", 0.02, F32(kvr + dr, b->H), LOC_KV_LORA);
  xm_ir_value_t *ckv = matmul(b, hn, wkva, LOC_KV_LORA), *lat, *kr;
  split_last(b, ckv, kvr, &lat, &kr, LOC_KV_LORA);
  lat = layer_rmsnorm_eps(b, lat, "self_attn.kv_a_layernorm.weight", kvr, 1e-6, LOC_KV_LORA);
  xm_ir_value_t *wkvb = layer_param(b, "self_attn.kv_b_proj.weight", XM_ROLE_TP_COLUMN, "normal",
                                    0.02, F32(nh * (dn + dv), kvr), LOC_KV_LORA);
  xm_ir_value_t *kv = matmul(b, lat, wkvb, LOC_KV_LORA), *kn, *v;
  kv = reshape(b, kv, F32(b->B, b->S, nh, dn + dv), LOC_KV_LORA);
  split_last(b, kv, dn, &kn, &v, LOC_KV_LORA);
  kr = reshape(b, kr, F32(b->B, b->S, 1, dr), LOC_ROPE_DIM);
  kr = rope(b, kr, 0, dr, LOC_ROPE_DIM);
  xm_ir_value_t *k = VAL(b, XM_OP_CONCAT, F32(b->B, b->S, nh, qk), LOC_ROPE_DIM, kn, kr);

  double scale = 1.0 / sqrt((double)qk);
  if (ms->yarn_factor > 1 && ms->yarn_mscale_all_dim > 0) {
    double m = yarn_get_mscale(ms->yarn_factor, ms->yarn_mscale_all_dim);
    scale *= m * m;
  }
  xm_ir_op_t *att = OP(b, XM_OP_ATTENTION, F32(b->B, b->S, nh, dv), LOC_HEADS, q, k, v);
  xm_ir_op_set_float(b->m, att, "scale", scale);
  xm_ir_value_t *a = reshape(b, att->results[0], F32(b->B, b->S, nh * dv), LOC_HEADS);
  xm_ir_value_t *wo = layer_param(b, "self_attn.o_proj.weight", XM_ROLE_TP_ROW, "normal",
                                  b->out_std, F32(b->H, nh * dv), LOC_HEADS);
  return matmul(b, a, wo, LOC_HEADS);
}

/* h = x + Attn(RMSNorm(x)). */
static xm_ir_value_t *build_attention(builder_t *b, xm_ir_value_t *x) {
  const xm_model_spec_t *ms = &b->spec->model;
  xm_ir_value_t *hn = layer_rmsnorm(b, x, "input_layernorm.weight", b->H, XM_ROLE_REPLICATED);
  if (ms->attention == XM_ATTN_MLA)
    return VAL(b, XM_OP_ADD, x->type, LOC_HEADS, x, build_mla(b, hn));
  xm_ir_value_t *q = attn_project(b, hn, "q", ms->heads);
  xm_ir_value_t *k = attn_project(b, hn, "k", ms->kv_heads);
  xm_ir_value_t *v = attn_project(b, hn, "v", ms->kv_heads);

  xm_ir_op_t *att = OP(b, XM_OP_ATTENTION, q->type, LOC_HEADS, q, k, v);
  xm_ir_op_set_float(b->m, att, "scale", 1.0 / sqrt((double)b->D));
  int64_t width = ms->heads * b->D;
  xm_ir_value_t *a = reshape(b, att->results[0], F32(b->B, b->S, width), LOC_HEADS);
  xm_ir_value_t *wo = layer_param(b, "self_attn.o_proj.weight", XM_ROLE_TP_ROW, "normal",
                                  b->out_std, F32(b->H, width), LOC_HEADS);
  xm_ir_value_t *o = matmul(b, a, wo, LOC_HEADS);
  return VAL(b, XM_OP_ADD, x->type, LOC_HEADS, x, o);
}

/* ---- feed-forward ------------------------------------------------------ */

/* W_down (silu(W_gate x) * (W_up x)) with weights <prefix>.{gate,up,down}_proj
 * of width `ffn`, over x of any leading shape. `shared`: the MoE block's
 * shared experts, which SSMB runs on this rank's token slice instead of
 * splitting them over TP. */
static xm_ir_value_t *build_swiglu(builder_t *b, xm_ir_value_t *x, const char *prefix, int64_t ffn,
                                   bool shared, const char *loc) {
  xm_ir_role_t column = shared ? XM_ROLE_SHARED_COLUMN : XM_ROLE_TP_COLUMN;
  xm_ir_role_t row = shared ? XM_ROLE_SHARED_ROW : XM_ROLE_TP_ROW;
  char suffix[96];
  snprintf(suffix, sizeof suffix, "%s.gate_proj.weight", prefix);
  xm_ir_value_t *wg = layer_param(b, suffix, column, "normal", 0.02, F32(ffn, b->H), loc);
  snprintf(suffix, sizeof suffix, "%s.up_proj.weight", prefix);
  xm_ir_value_t *wu = layer_param(b, suffix, column, "normal", 0.02, F32(ffn, b->H), loc);
  snprintf(suffix, sizeof suffix, "%s.down_proj.weight", prefix);
  xm_ir_value_t *wd = layer_param(b, suffix, row, "normal", b->out_std, F32(b->H, ffn), loc);
  xm_ir_value_t *g = matmul(b, x, wg, loc);
  xm_ir_value_t *u = matmul(b, x, wu, loc);
  xm_ir_value_t *s = VAL(b, XM_OP_SWIGLU, g->type, loc, g, u);
  return matmul(b, s, wd, loc);
}

/* ---- MoE block --------------------------------------------------------- */

/* C = ceil(cf * T * k / E). A product that lands within rounding error of
 * an integer is taken as that integer, so cf = 1.1 does not round 11.000001
 * up to 12 and disagree with the planner's arithmetic. */
static int64_t expert_capacity(double cf, int64_t slots, int64_t experts) {
  double c = cf * (double)slots / (double)experts;
  double r = nearbyint(c);
  int64_t cap = fabs(c - r) <= 1e-9 * (c > 1 ? c : 1) ? (int64_t)r : (int64_t)ceil(c);
  return cap < 1 ? 1 : cap;
}

/* Router: scores f32[T,E]; (experts, weights) out. */
static void build_router(builder_t *b, xm_ir_value_t *t, xm_ir_value_t **out_scores,
                         xm_ir_value_t **out_experts, xm_ir_value_t **out_weights) {
  const xm_moe_spec_t *moe = &b->spec->moe;
  int64_t E = moe->experts, k = moe->top_k;
  xm_ir_value_t *wg = layer_param(b, "mlp.gate.weight", XM_ROLE_REPLICATED, "normal", 0.02,
                                  F32(E, b->H), LOC_EXPERTS);
  xm_ir_op_set_bool(b->m, wg->def, "expert_slots", true);
  xm_ir_value_t *logits = matmul(b, t, wg, LOC_EXPERTS);
  xm_ir_op_t *sc = OP(b, XM_OP_ROUTER_SCORE, logits->type, LOC_EXPERTS, logits);
  xm_ir_op_set_string(b->m, sc, "scoring", xm_scoring_name(moe->scoring));
  xm_ir_value_t *scores = sc->results[0];

  /* The correction bias exists in checkpoints of sigmoid routers
   * (DeepSeek-V3) and whenever aux-free balancing updates it; it is moved
   * by the balancing rule, never by gradients. Otherwise a zero constant
   * keeps one topk_route signature. */
  xm_ir_value_t *bias;
  if (moe->aux_free_gamma > 0 || moe->scoring == XM_SCORING_SIGMOID) {
    const char *loc = moe->aux_free_gamma > 0 ? LOC_AUX_FREE : LOC_EXPERTS;
    bias = layer_param(b, "mlp.gate.e_score_correction_bias", XM_ROLE_REPLICATED, "zeros", -1,
                       F32(E), loc);
    xm_ir_op_set_bool(b->m, bias->def, "trainable", false);
    xm_ir_op_set_bool(b->m, bias->def, "expert_slots", true);
  } else {
    xm_ir_op_t *c = emit1(b, XM_OP_CONSTANT, 0, NULL, F32(E), LOC_EXPERTS);
    xm_ir_op_set_float(b->m, c, "value", 0.0);
    bias = c->results[0];
  }

  xm_ir_type_t rt[2] = {I32(b->T, k), F32(b->T, k)};
  xm_ir_op_t *tk = emit(b, XM_OP_TOPK_ROUTE, 2, OPS(scores, bias), 2, rt, LOC_TOPK);
  xm_ir_op_set_int(b->m, tk, "k", k);
  xm_ir_op_set_int(b->m, tk, "n_group", moe->n_group);
  xm_ir_op_set_int(b->m, tk, "topk_group", moe->topk_group);
  xm_ir_op_set_bool(b->m, tk, "norm_topk_prob", moe->norm_topk_prob);
  xm_ir_op_set_float(b->m, tk, "routed_scaling", moe->routed_scaling);
  xm_ir_op_set_string(b->m, tk, "scoring", xm_scoring_name(moe->scoring));
  *out_scores = scores;
  *out_experts = tk->results[0];
  *out_weights = tk->results[1];
}

/* Grouped GEMM of the routed experts with stacked weight
 * mlp.experts.{e}.<proj>_proj.weight of shape [E, out, in]. */
static xm_ir_value_t *expert_gemm(builder_t *b, xm_ir_value_t *x, const char *proj, int64_t out,
                                  xm_ir_value_t *tpe, double std) {
  char suffix[64];
  snprintf(suffix, sizeof suffix, "mlp.experts.{e}.%s_proj.weight", proj);
  int64_t in = x->type.dims[x->type.rank - 1];
  xm_ir_value_t *w = layer_param(b, suffix, XM_ROLE_EXPERT, "normal", std,
                                 F32(b->spec->moe.experts, out, in), LOC_EXPERT_FFN);
  xm_ir_op_set_bool(b->m, w->def, "expert_slots", true);
  return VAL(b, XM_OP_GROUPED_MATMUL, with_last(x->type, out), LOC_EXPERT_FFN, x, w, tpe);
}

/* The routed experts over the expert-sorted rows xs [N,H] -> [N,H]. */
static xm_ir_value_t *build_experts(builder_t *b, xm_ir_value_t *xs, xm_ir_value_t *tpe) {
  const xm_moe_spec_t *moe = &b->spec->moe;
  int64_t F = moe->expert_ffn;
  xm_ir_value_t *s;
  if (moe->activation == XM_ACT_GELU) {
    xm_ir_value_t *u = expert_gemm(b, xs, "up", F, tpe, 0.02);
    s = VAL(b, XM_OP_GELU, u->type, LOC_EXPERT_FFN, u);
  } else {
    xm_ir_value_t *g = expert_gemm(b, xs, "gate", F, tpe, 0.02);
    xm_ir_value_t *u = expert_gemm(b, xs, "up", F, tpe, 0.02);
    s = VAL(b, XM_OP_SWIGLU, g->type, LOC_EXPERT_FFN, g, u);
  }
  return expert_gemm(b, s, "down", b->H, tpe, b->out_std);
}

/* Qwen2-MoE's gated shared expert (transformers' Qwen2MoeSparseMoeBlock):
 * sh * sigmoid(t W^T), W = mlp.shared_expert_gate.weight [1,H], no bias:
 * one gate per token scales its whole shared-expert row. The gate is [T,1]
 * and mul's per-row broadcast applies it (ir/ops.def), so autodiff's
 * rule for mul gives its gradient, reduce_to's per-row sum. Its role
 * makes the shard pass run it on the tokens the shared experts see (the
 * rank's slice under SSMB) and multiply the TP-reduced shared output. */
static xm_ir_value_t *shared_gate(builder_t *b, xm_ir_value_t *t, xm_ir_value_t *sh) {
  xm_ir_value_t *w = layer_param(b, "mlp.shared_expert_gate.weight", XM_ROLE_SHARED_GATE,
                                 "normal", 0.02, F32(1, b->H), LOC_SHARED_GATE);
  xm_ir_value_t *logit = matmul(b, t, w, LOC_SHARED_GATE);
  xm_ir_value_t *gate = VAL(b, XM_OP_SIGMOID, logit->type, LOC_SHARED_GATE, logit);
  return VAL(b, XM_OP_MUL, sh->type, LOC_SHARED_GATE, sh, gate);
}

/* MoE FFN over hn [B,S,H] -> [B,S,H]; records the layer's aux loss in
 * b->aux when enabled (summed into the loss after the head). */
static xm_ir_value_t *build_moe(builder_t *b, xm_ir_value_t *hn) {
  const xm_moe_spec_t *moe = &b->spec->moe;
  int64_t E = moe->experts, k = moe->top_k, N = b->T * k;
  xm_ir_value_t *t = reshape(b, hn, F32(b->T, b->H), LOC_EXPERTS);
  xm_ir_value_t *scores, *experts, *weights;
  build_router(b, t, &scores, &experts, &weights);

  /* With a capacity, dropped slots make the kept count data-dependent;
   * T*k bounds it (nothing is ever duplicated). */
  int64_t cap = moe->has_capacity ? expert_capacity(moe->capacity_factor, N, E) : 0;
  xm_ir_type_t slots = I32(N);
  slots.dynamic[0] = moe->has_capacity;
  xm_ir_type_t pt[3] = {slots, slots, I32(E)};
  xm_ir_op_t *perm = emit(b, XM_OP_PERMUTE, 2, OPS(experts, weights), 3, pt,
                          moe->has_capacity ? LOC_CAPACITY : LOC_EXPERTS);
  xm_ir_op_set_int(b->m, perm, "num_experts", E);
  xm_ir_op_set_int(b->m, perm, "capacity", cap);
  xm_ir_value_t *indices = perm->results[0], *tpe = perm->results[2];

  xm_ir_type_t rows = F32(N, b->H);
  rows.dynamic[0] = moe->has_capacity;
  xm_ir_op_t *ga = OP(b, XM_OP_GATHER_ROWS, rows, LOC_TOPK, t, indices);
  xm_ir_op_set_int(b->m, ga, "k", k);
  xm_ir_value_t *y = build_experts(b, ga->results[0], tpe);
  xm_ir_value_t *r = VAL(b, XM_OP_SCATTER_COMBINE, t->type, LOC_TOPK, y, indices, weights);

  if (moe->shared_experts > 0) {
    xm_ir_value_t *sh =
        build_swiglu(b, t, "mlp.shared_experts", moe->shared_ffn, true, LOC_SHARED);
    if (moe->shared_expert_gate) sh = shared_gate(b, t, sh);
    r = VAL(b, XM_OP_ADD, r->type, LOC_SHARED, r, sh);
  }
  if (moe->aux_alpha > 0) {
    xm_ir_op_t *aux = OP(b, XM_OP_AUX_LOSS, scalar_f32(), LOC_AUX, scores, experts);
    xm_ir_op_set_float(b->m, aux, "alpha", moe->aux_alpha);
    XM_ASSERT(b->num_aux < b->spec->model.layers + b->spec->model.mtp_layers);
    b->aux[b->num_aux++] = aux->results[0];
  }
  return reshape(b, r, hn->type, LOC_EXPERTS);
}

/* ---- layers, head, module ---------------------------------------------- */

static xm_ir_value_t *build_layer(builder_t *b, int64_t i, xm_ir_value_t *x) {
  b->layer = i;
  xm_ir_value_t *h = build_attention(b, x);
  xm_ir_value_t *hn =
      layer_rmsnorm(b, h, "post_attention_layernorm.weight", b->H, XM_ROLE_REPLICATED);
  xm_ir_value_t *f;
  const char *loc;
  if (xm_spec_layer_is_moe(b->spec, i)) {
    f = build_moe(b, hn);
    loc = LOC_EXPERTS;
  } else {
    f = build_swiglu(b, hn, "mlp", b->spec->model.dense_ffn, false, LOC_DENSE);
    loc = LOC_DENSE;
  }
  xm_ir_value_t *out = VAL(b, XM_OP_ADD, h->type, loc, h, f);
  b->layer = -1;
  return out;
}

static xm_ir_value_t *build_input(builder_t *b, const char *name) {
  xm_ir_op_t *op = emit1(b, XM_OP_INPUT, 0, NULL, I32(b->B, b->S), LOC_INPUTS);
  xm_ir_op_set_string(b->m, op, "name", name);
  return op->results[0];
}

/* ---- multi-token prediction (DeepSeek-V3) ------------------------------ */

/* x[B,S',H] -> the positions [from, from + n) of every sequence: a split of
 * the flattened rows (its unused part gets a zero gradient). */
static xm_ir_value_t *positions(builder_t *b, xm_ir_value_t *x, int64_t from, int64_t n) {
  int64_t Sx = x->type.dims[1];
  XM_ASSERT(from == 0 || from + n == Sx);
  xm_ir_value_t *flat = reshape(b, x, F32(b->B, Sx * b->H), LOC_MTP), *head, *tail;
  split_last(b, flat, (from == 0 ? n : from) * b->H, &head, &tail, LOC_MTP);
  return reshape(b, from == 0 ? head : tail, F32(b->B, n, b->H), LOC_MTP);
}

/* The MTP modules k = 1..D over the S-k positions i that have a token
 * i+k+1 to predict (docs/design.md, Model semantics):
 *   h'_k = eh_proj([enorm(emb(t_{i+k})), hnorm(h_{k-1}[i])]), embedding first as in
 *          DeepSeek-V3's released weights (the paper writes the other order);
 *   h_k  = shared_head.norm(Layer_{L+k-1}(h'_k)), h_0 the main model's
 *          normalised output; logits_k = h_k W_lm^T with the main LM head;
 *   loss += lambda / D * sum_k CE(logits_k, labels[:, k:]).
 * Each module's tensors are model.layers.{L+k-1}.* as in DeepSeek-V3's
 * checkpoints, and its ops carry that layer. Returns the weighted sum. */
static xm_ir_value_t *build_mtp(builder_t *b, xm_ir_value_t *x0, xm_ir_value_t *h0,
                                xm_ir_value_t *labels, xm_ir_value_t *head) {
  const xm_spec_t *spec = b->spec;
  int64_t L = spec->model.layers, D = spec->model.mtp_layers, S = b->S;
  xm_ir_value_t *h = h0, *sum = NULL;
  for (int64_t k = 1; k <= D; k++) {
    int64_t Sk = S - k, layer = L + k - 1;
    b->layer = layer;
    xm_ir_value_t *e = positions(b, x0, k, Sk);
    xm_ir_value_t *hp = positions(b, h, 0, Sk);
    e = layer_rmsnorm(b, e, "enorm.weight", b->H, XM_ROLE_REPLICATED);
    hp = layer_rmsnorm(b, hp, "hnorm.weight", b->H, XM_ROLE_REPLICATED);
    xm_ir_value_t *eh = VAL(b, XM_OP_CONCAT, F32(b->B, Sk, 2 * b->H), LOC_MTP, e, hp);
    xm_ir_value_t *w = layer_param(b, "eh_proj.weight", XM_ROLE_REPLICATED, "normal", 0.02,
                                   F32(b->H, 2 * b->H), LOC_MTP);
    xm_ir_value_t *y = matmul(b, eh, w, LOC_MTP);
    b->S = Sk;
    b->T = b->B * Sk;
    y = build_layer(b, layer, y);
    b->layer = layer;
    h = layer_rmsnorm(b, y, "shared_head.norm.weight", b->H, XM_ROLE_REPLICATED);
    xm_ir_value_t *logits = matmul(b, h, head, LOC_MTP);
    xm_ir_type_t lt[2] = {I32(b->B, k), I32(b->B, Sk)}; /* labels[:, k:] */
    xm_ir_value_t *lab = emit(b, XM_OP_SPLIT, 1, OPS(labels), 2, lt, LOC_MTP)->results[1];
    xm_ir_value_t *ce = VAL(b, XM_OP_CROSS_ENTROPY, scalar_f32(), LOC_MTP, logits, lab);
    sum = sum ? VAL(b, XM_OP_ADD, scalar_f32(), LOC_MTP, sum, ce) : ce;
  }
  b->S = S;
  b->T = b->B * S;
  xm_ir_op_t *mean = OP(b, XM_OP_SCALE, scalar_f32(), LOC_MTP_WEIGHT, sum);
  xm_ir_op_set_float(b->m, mean, "factor", 1.0 / (double)D);
  b->layer = -1;
  return mean->results[0];
}

/* Embedding, layers, final norm, LM head, losses, return. */
static void build_graph(builder_t *b) {
  const xm_model_spec_t *ms = &b->spec->model;
  xm_ir_value_t *tokens = build_input(b, "tokens");
  xm_ir_value_t *labels = build_input(b, "labels");
  xm_ir_value_t *embed = param_named(b, "model.embed_tokens.weight", XM_ROLE_REPLICATED, "normal",
                                     0.02, F32(ms->vocab, b->H), LOC_VOCAB);
  xm_ir_value_t *x0 = VAL(b, XM_OP_EMBEDDING, F32(b->B, b->S, b->H), LOC_VOCAB, tokens, embed);
  xm_ir_value_t *x = x0;
  for (int64_t i = 0; i < ms->layers; i++)
    x = build_layer(b, i, x);

  xm_ir_value_t *wn =
      param_named(b, "model.norm.weight", XM_ROLE_REPLICATED, "ones", -1, F32(b->H), LOC_NORM);
  xm_ir_value_t *xn = rmsnorm(b, x, wn);
  xm_ir_value_t *head =
      ms->tied_embeddings ? embed
                          : param_named(b, "lm_head.weight", XM_ROLE_REPLICATED, "normal", 0.02,
                                        F32(ms->vocab, b->H), LOC_VOCAB);
  xm_ir_value_t *logits = matmul(b, xn, head, LOC_VOCAB);
  xm_ir_value_t *ce = VAL(b, XM_OP_CROSS_ENTROPY, scalar_f32(), LOC_VOCAB, logits, labels);
  /* The MTP modules' mean cross-entropy, returned third so that the
   * driver logs it apart; the loss takes it times the weight. */
  xm_ir_value_t *mtp = ms->mtp_layers > 0 ? build_mtp(b, x0, xn, labels, head) : NULL;
  xm_ir_value_t *loss = ce;
  if (mtp) {
    xm_ir_op_t *w = OP(b, XM_OP_SCALE, scalar_f32(), LOC_MTP_WEIGHT, mtp);
    xm_ir_op_set_float(b->m, w, "factor", b->spec->training.mtp_loss_weight);
    loss = VAL(b, XM_OP_ADD, scalar_f32(), LOC_MTP_WEIGHT, loss, w->results[0]);
  }
  for (int64_t i = 0; i < b->num_aux; i++)
    loss = VAL(b, XM_OP_ADD, scalar_f32(), LOC_AUX, loss, b->aux[i]);
  if (mtp)
    emit(b, XM_OP_RETURN, 3, OPS(loss, ce, mtp), 0, NULL, LOC_VOCAB);
  else
    emit(b, XM_OP_RETURN, 2, OPS(loss, ce), 0, NULL, LOC_VOCAB);
}

static void set_module_attrs(xm_ir_module_t *m, const xm_spec_t *spec) {
  xm_ir_attr_t a = {.key = "model_type",
                    .kind = XM_ATTR_STRING,
                    .s = spec->model_type[0] ? spec->model_type : "xmoec"};
  xm_ir_module_set_attr(m, &a);
  xm_ir_module_set_int(m, "micro_batch", spec->training.micro_batch);
  xm_ir_module_set_int(m, "seq_len", spec->training.seq_len);
  xm_ir_module_set_int(m, "layers", spec->model.layers);
  xm_ir_module_set_int(m, "experts", spec->moe.experts);
  xm_ir_module_set_int(m, "top_k", spec->moe.top_k);
}

xm_status_t xm_ir_build_model(const xm_spec_t *spec, const char *source, xm_diag_t *diag,
                              xm_ir_module_t **out_module) {
  XM_ASSERT(spec && diag && out_module);
  *out_module = NULL;
  (void)source; /* the file a refusal would name (none is refused today) */
  /* A validated spec guarantees these; a violation is a caller bug. */
  const xm_model_spec_t *ms = &spec->model;
  XM_ASSERT(ms->layers >= 0 && ms->hidden > 0 && ms->heads > 0 && ms->head_dim > 0);
  XM_ASSERT(ms->kv_heads > 0 && ms->heads % ms->kv_heads == 0 && ms->vocab > 0);
  XM_ASSERT(spec->training.micro_batch > 0 && spec->training.seq_len > 0);
  XM_ASSERT(spec->moe.experts == 0 ||
            (spec->moe.top_k > 0 && spec->moe.top_k <= spec->moe.experts));

  xm_ir_module_t *m = NULL;
  XM_RETURN_IF_ERROR(xm_ir_module_create(spec->name[0] ? spec->name : "model", &m));
  builder_t b = {.m = m, .spec = spec, .arch = xm_hf_arch_of(spec), .layer = -1};
  b.B = spec->training.micro_batch;
  b.S = spec->training.seq_len;
  b.T = b.B * b.S;
  b.H = ms->hidden;
  b.D = ms->head_dim;
  b.out_std = 0.02 / sqrt(2.0 * (double)(ms->layers > 0 ? ms->layers : 1));
  if (ms->layers + ms->mtp_layers > 0) {
    b.aux = xm_ir_alloc(m, sizeof(xm_ir_value_t *) * (size_t)(ms->layers + ms->mtp_layers));
    if (!b.aux) {
      xm_ir_module_destroy(m);
      return XM_ERR_NO_MEMORY;
    }
  }
  set_module_attrs(m, spec);
  build_graph(&b);
  *out_module = m;
  return XM_OK;
}
