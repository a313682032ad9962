/* frontend/count.c — parameter and FLOP counts of a validated spec.
 *
 * Counts are sums over the tensors a Hugging Face checkpoint of the model
 * holds, built per component so that `xmoec check` can show a breakdown and
 * the tests can compare against the exact published totals (Mixtral-8x7B,
 * Qwen3-30B-A3B, OLMoE, DeepSeek-MoE-16B, DeepSeek-V3). Every layer of one
 * kind has the same shape, so one dense and one MoE layer are counted and
 * multiplied. FLOPs count only the matrices a token is multiplied by (norm
 * weights, biases and the embedding lookup do no multiply-adds worth
 * counting) plus the causal attention score and value products; the formulas
 * are stated in docs/spec.md ("Counting") and must stay in sync with it.
 */
#include "frontend/count.h"

#include <string.h>

/* Parameters of one attention block: projections, biases and q/k norms
 * (`norm_out` receives the norm and bias part, which does no matmul). */
static int64_t count_attention(const xm_model_spec_t *m, int64_t *norm_out) {
  int64_t h = m->hidden, heads = m->heads;
  if (m->attention == XM_ATTN_MLA) {
    int64_t qk = m->qk_nope_head_dim + m->qk_rope_head_dim;
    int64_t q = m->q_lora_rank > 0 ? h * m->q_lora_rank + m->q_lora_rank * heads * qk /* q_a, q_b */
                                   : h * heads * qk;                                  /* q_proj */
    int64_t kv = h * (m->kv_lora_rank + m->qk_rope_head_dim) /* kv_a_proj_with_mqa */
                 + m->kv_lora_rank * heads * (m->qk_nope_head_dim + m->v_head_dim);
    int64_t o = heads * m->v_head_dim * h;
    int64_t norms = m->kv_lora_rank + (m->q_lora_rank > 0 ? m->q_lora_rank : 0);
    *norm_out = norms;
    return q + kv + o + norms;
  }
  int64_t hd = m->head_dim, kvd = m->kv_heads * hd, qd = heads * hd;
  int64_t mats = h * qd + 2 * h * kvd + qd * h;
  int64_t extra = 0;
  if (m->attention_bias) extra += qd + 2 * kvd;
  if (m->qk_norm == XM_QK_NORM_HEAD) extra += 2 * hd;
  if (m->qk_norm == XM_QK_NORM_FULL) extra += qd + kvd;
  *norm_out = extra;
  return mats + extra;
}

/* One routed expert's parameters: SwiGLU has gate, up and down; the
 * two-matrix GeLU expert has no gate. */
static int64_t count_expert(const xm_spec_t *s) {
  int64_t mats = s->moe.activation == XM_ACT_GELU ? 2 : 3;
  return mats * s->model.hidden * s->moe.expert_ffn;
}

/* The router carries a score-correction bias whenever the choice adds a
 * bias to the scores (aux-free balancing; DeepSeek-V3 stores it for its
 * sigmoid routing as e_score_correction_bias). */
static bool router_has_bias(const xm_spec_t *s) {
  return s->moe.aux_free_gamma > 0 || s->moe.scoring == XM_SCORING_SIGMOID;
}

/* Fills one layer's breakdown; `matmul_active` gets the active parameters
 * that a token is multiplied by (for FLOPs). */
static void count_layer(const xm_spec_t *s, bool moe, xm_layer_count_t *out,
                        int64_t *matmul_active) {
  int64_t h = s->model.hidden, attn_norms = 0;
  memset(out, 0, sizeof *out);
  out->attention = count_attention(&s->model, &attn_norms);
  out->norms = 2 * h;
  int64_t unused = 0, no_matmul = attn_norms + out->norms;
  if (!moe) {
    out->dense_ffn = 3 * h * s->model.dense_ffn;
  } else {
    int64_t e = s->moe.experts;
    out->routed_experts = e * count_expert(s);
    out->shared_experts = 3 * h * s->moe.shared_ffn + (s->moe.shared_expert_gate ? h : 0);
    out->router = e * h + (router_has_bias(s) ? e : 0);
    if (router_has_bias(s)) no_matmul += e;
    unused = (e - s->moe.top_k) * count_expert(s);
  }
  out->total = out->attention + out->norms + out->dense_ffn + out->routed_experts +
               out->shared_experts + out->router;
  out->active = out->total - unused;
  *matmul_active = out->active - no_matmul;
}

void xm_count_params(const xm_spec_t *spec, xm_count_t *out) {
  const xm_model_spec_t *m = &spec->model;
  memset(out, 0, sizeof *out);
  int64_t dense_layers = m->first_k_dense < m->layers ? m->first_k_dense : m->layers;
  if (spec->moe.experts == 0) dense_layers = m->layers;
  int64_t moe_layers = m->layers - dense_layers;
  int64_t dense_mm = 0, moe_mm = 0;
  if (dense_layers > 0) count_layer(spec, false, &out->dense_layer, &dense_mm);
  if (moe_layers > 0) count_layer(spec, true, &out->moe_layer, &moe_mm);

  int64_t table = m->vocab * m->hidden;
  out->num_layers = m->layers;
  out->embeddings = m->tied_embeddings ? table : 2 * table;
  out->final_norm = m->hidden;
  out->total = out->embeddings + out->final_norm + dense_layers * out->dense_layer.total +
               moe_layers * out->moe_layer.total;
  out->active = out->embeddings + out->final_norm + dense_layers * out->dense_layer.active +
                moe_layers * out->moe_layer.active;

  /* The LM head multiplies every token even when it shares the table. */
  double matmul =
      (double)table + (double)dense_layers * (double)dense_mm + (double)moe_layers * (double)moe_mm;
  int64_t qk_dim =
      m->attention == XM_ATTN_MLA ? m->qk_nope_head_dim + m->qk_rope_head_dim : m->head_dim;
  int64_t v_dim = m->attention == XM_ATTN_MLA ? m->v_head_dim : m->head_dim;
  /* Under a causal mask token t attends to t+1 keys: (S+1)/2 on average. */
  double ctx = spec->training.seq_len > 0 ? (double)(spec->training.seq_len + 1) / 2.0 : 0.0;
  double attn_layer = 2.0 * (double)m->heads * (double)(qk_dim + v_dim) * ctx;
  double attn = attn_layer * (double)m->layers;
  out->flops_per_token_fwd = 2.0 * matmul + attn;
  out->flops_per_token_fwdbwd = 3.0 * out->flops_per_token_fwd;

  if (m->mtp_layers > 0) {
    bool moe = spec->moe.experts > 0;
    const xm_layer_count_t *l = moe ? &out->moe_layer : &out->dense_layer;
    xm_layer_count_t lc = *l;
    int64_t lmm = moe ? moe_mm : dense_mm;
    if ((moe ? moe_layers : dense_layers) == 0) count_layer(spec, moe, &lc, &lmm);
    int64_t extra = 2 * m->hidden * m->hidden + 3 * m->hidden;
    out->mtp_layers = m->mtp_layers;
    out->mtp_module = lc.total + extra;
    out->mtp_total = m->mtp_layers * out->mtp_module;
    out->mtp_active = m->mtp_layers * (lc.active + extra);
    double per = 2.0 * ((double)lmm + 2.0 * (double)m->hidden * (double)m->hidden + (double)table) +
                 attn_layer;
    out->mtp_flops_per_token_fwd = (double)m->mtp_layers * per;
  }
}
