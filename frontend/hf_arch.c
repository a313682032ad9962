/* frontend/hf_arch.c — which Hugging Face architecture a spec is, its
 * tensor names, and the comparison of two specs by their HF keys.
 *
 * Matching asks whether transformers' modeling file of a model_type
 * (modeling_mixtral.py, modeling_qwen2_moe.py, modeling_qwen3_moe.py,
 * modeling_olmoe.py, modeling_deepseek_v3.py) computes what xmoec trains
 * from tensors of the same shapes. The decision goes by the features only
 * one family has: MLA is DeepSeek-V3's; without MLA a norm over the whole
 * q/k projections is OLMoE's, a per-head one Qwen3-MoE's, a gated shared
 * expert with q/k/v biases Qwen2-MoE's, and what is left Mixtral's. Then
 * every rule of that family must hold; the first that fails is the reason
 * the spec keeps model_type "xmoec" (xmoec's own names and config.json).
 * Rules shared by all (SwiGLU experts, dropless routing, MoE layers) come
 * first so the reason names the feature, not a family.
 *
 * Tensor names are DeepSeek-V3's, which Qwen3-MoE and OLMoE share; Mixtral
 * calls its MoE block block_sparse_moe and its experts' matrices w1 (gate),
 * w3 (up) and w2 (down); Qwen2-MoE has one shared_expert (singular) beside
 * its shared_expert_gate. The map rewrites the part after
 * "model.layers.<i>." and leaves every other name alone.
 *
 * xm_hf_spec_diff compares the fields that decide the weights and the
 * function (docs/checkpoints.md lists them), each reported at the key that
 * holds it in that architecture's config.json, so a user reads the key of
 * the file they have.
 */
#include "frontend/hf_arch.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "support/status.h"

static const char *const k_model_type[XM_HF_ARCH_COUNT_] = {
    [XM_HF_ARCH_XMOEC] = "xmoec",         [XM_HF_ARCH_DEEPSEEK_V3] = "deepseek_v3",
    [XM_HF_ARCH_QWEN3_MOE] = "qwen3_moe", [XM_HF_ARCH_QWEN2_MOE] = "qwen2_moe",
    [XM_HF_ARCH_MIXTRAL] = "mixtral",     [XM_HF_ARCH_OLMOE] = "olmoe",
};

static const char *const k_class[XM_HF_ARCH_COUNT_] = {
    [XM_HF_ARCH_XMOEC] = "XmoecForCausalLM",
    [XM_HF_ARCH_DEEPSEEK_V3] = "DeepseekV3ForCausalLM",
    [XM_HF_ARCH_QWEN3_MOE] = "Qwen3MoeForCausalLM",
    [XM_HF_ARCH_QWEN2_MOE] = "Qwen2MoeForCausalLM",
    [XM_HF_ARCH_MIXTRAL] = "MixtralForCausalLM",
    [XM_HF_ARCH_OLMOE] = "OlmoeForCausalLM",
};

const char *xm_hf_arch_model_type(xm_hf_arch_t arch) {
  return arch >= 0 && arch < XM_HF_ARCH_COUNT_ ? k_model_type[arch] : "xmoec";
}

const char *xm_hf_arch_class(xm_hf_arch_t arch) {
  return arch >= 0 && arch < XM_HF_ARCH_COUNT_ ? k_class[arch] : "XmoecForCausalLM";
}

int xm_hf_arch_from_model_type(const char *model_type) {
  for (int a = 0; model_type && a < XM_HF_ARCH_COUNT_; a++)
    if (strcmp(model_type, k_model_type[a]) == 0) return a;
  return -1;
}

/* ---- matching -------------------------------------------------------------- */

/* Group-limited routing that masks anything: with topk_group == n_group
 * every group is kept and the routing is plain top-k. */
static bool groups_limit(const xm_moe_spec_t *e) {
  return e->n_group > 1 && e->topk_group < e->n_group;
}

typedef struct {
  char *why;
  size_t n;
} why_t;

/* Records the reason and returns false, so rules read `return no(w, ...)`. */
static bool no(why_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool no(why_t *w, const char *fmt, ...) {
  if (w->why && w->n) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->why, w->n, fmt, ap);
    va_end(ap);
  }
  return false;
}

/* What every architecture has: MoE layers of SwiGLU experts, dropless. */
static bool common_rules(const xm_spec_t *s, why_t *w) {
  const xm_moe_spec_t *e = &s->moe;
  if (e->experts == 0)
    return no(w, "a dense model (/moe/experts is 0): the architectures are MoE models");
  if (e->activation != XM_ACT_SWIGLU)
    return no(w, "GeLU experts (/moe/activation): every Hugging Face MoE architecture has "
                 "SwiGLU experts (gate_proj, up_proj, down_proj)");
  if (e->has_capacity)
    return no(w, "a capacity factor (/moe/capacity_factor): the Hugging Face MoE models are "
                 "dropless");
  return true;
}

/* modeling_deepseek_v3.py: DeepseekV3TopkRouter always scores by sigmoid
 * plus e_score_correction_bias and groups by the sum of a group's two best
 * experts; the shared experts are one MLP of n_shared_experts *
 * moe_intermediate_size, ungated. */
static bool deepseek_v3_rules(const xm_spec_t *s, why_t *w) {
  const xm_moe_spec_t *e = &s->moe;
  if (e->scoring != XM_SCORING_SIGMOID)
    return no(w, "softmax routing with MLA (/moe/scoring): transformers' DeepseekV3 routes by "
                 "sigmoid (DeepSeek-V2's softmax routing is not an export target)");
  if (e->shared_expert_gate)
    return no(w, "a gated shared expert with MLA (/moe/shared_expert_gate): DeepSeek-V3's "
                 "shared experts have no gate");
  if (e->shared_experts > 0 && e->shared_ffn != e->shared_experts * e->expert_ffn)
    return no(w,
              "/moe/shared_ffn %" PRId64 " is not shared_experts x expert_ffn = %" PRId64
              ": DeepSeek-V3's shared experts are n_shared_experts x moe_intermediate_size wide",
              e->shared_ffn, e->shared_experts * e->expert_ffn);
  if (e->experts / e->n_group < 2)
    return no(w, "/moe/n_group: DeepSeek-V3 scores a group by the sum of its two best experts, "
                 "so every group needs at least 2 experts");
  return true;
}

/* Without MLA: what only DeepSeek-V3 has, and what none of the others has. */
static bool gqa_rules(const xm_spec_t *s, why_t *w) {
  const xm_model_spec_t *m = &s->model;
  const xm_moe_spec_t *e = &s->moe;
  if (m->mtp_layers > 0)
    return no(w, "multi-token prediction (/model/mtp_layers) without MLA: only DeepSeek-V3 has "
                 "it");
  if (e->scoring == XM_SCORING_SIGMOID)
    return no(w, "sigmoid routing (/moe/scoring) without MLA: only DeepSeek-V3 routes by "
                 "sigmoid, and its attention is MLA");
  if (e->routed_scaling != 1.0)
    return no(w,
              "/moe/routed_scaling %g without MLA: only DeepSeek-V3 scales the routed "
              "weights (routed_scaling_factor)",
              e->routed_scaling);
  if (groups_limit(e))
    return no(w, "group-limited routing (/moe/n_group, /moe/topk_group) without MLA: only "
                 "DeepSeek-V3 has it");
  if (e->aux_free_gamma > 0)
    return no(w, "aux-free balancing (/moe/aux_free_gamma) with softmax routing: its "
                 "correction bias (mlp.gate.e_score_correction_bias) is a tensor only "
                 "DeepSeek-V3 has");
  if (m->rope_interleave)
    return no(w, "interleaved RoPE (/model/rope_interleave) without MLA: Mixtral, Qwen-MoE and "
                 "OLMoE rotate halves (rotate_half)");
  if (m->first_k_dense > 0)
    return no(w, "dense first layers (/model/first_k_dense) without MLA: Mixtral and OLMoE "
                 "have none, and Qwen-MoE's mlp_only_layers are not read by xmoec's config "
                 "importer yet");
  return true;
}

static bool head_dim_is_hidden_split(const xm_model_spec_t *m) {
  return m->head_dim * m->heads == m->hidden;
}

/* modeling_olmoe.py: q_norm over hidden_size, k_norm over
 * hidden_size / heads * kv_heads, attention_bias on q, k, v and o. */
static bool olmoe_rules(const xm_spec_t *s, why_t *w) {
  const xm_model_spec_t *m = &s->model;
  if (m->attention_bias)
    return no(w, "/model/attention_bias with qk_norm full: OLMoE's attention_bias would bias "
                 "o_proj too, xmoec's only q, k and v");
  if (s->moe.shared_experts > 0)
    return no(w, "shared experts (/moe/shared_experts) with qk_norm full: OLMoE has none");
  if (!head_dim_is_hidden_split(m))
    return no(w,
              "/model/head_dim %" PRId64 " with qk_norm full: OLMoE's head dim is "
              "hidden_size / num_attention_heads (its q_norm spans hidden_size)",
              m->head_dim);
  return true;
}

/* modeling_qwen3_moe.py: per-head q_norm / k_norm of head_dim, any
 * head_dim, attention_bias on q, k, v and o, no shared expert. */
static bool qwen3_rules(const xm_spec_t *s, why_t *w) {
  if (s->model.attention_bias)
    return no(w, "/model/attention_bias with qk_norm head: Qwen3-MoE's attention_bias would "
                 "bias o_proj too, xmoec's only q, k and v");
  if (s->moe.shared_experts > 0)
    return no(w, "shared experts (/moe/shared_experts) with qk_norm head: Qwen3-MoE has none");
  return true;
}

/* modeling_qwen2_moe.py: q/k/v biases always, one shared_expert of
 * shared_expert_intermediate_size under a sigmoid shared_expert_gate,
 * head_dim = hidden_size / num_attention_heads. */
static bool qwen2_rules(const xm_spec_t *s, why_t *w) {
  const xm_model_spec_t *m = &s->model;
  const xm_moe_spec_t *e = &s->moe;
  if (!m->attention_bias)
    return no(w, "shared experts without q/k/v biases (/model/attention_bias): the one "
                 "architecture with a shared expert and no MLA is Qwen2-MoE, whose q, k and v "
                 "projections have biases");
  if (e->shared_experts == 0)
    return no(w, "q/k/v biases (/model/attention_bias) without a shared expert: Qwen2-MoE, the "
                 "one architecture with these biases, always has a gated shared expert");
  if (!e->shared_expert_gate)
    return no(w, "a shared expert without its sigmoid gate (/moe/shared_expert_gate): "
                 "Qwen2-MoE's shared expert is gated (DeepSeek's ungated one needs MLA)");
  if (!head_dim_is_hidden_split(m))
    return no(w,
              "/model/head_dim %" PRId64 ": Qwen2-MoE's head dim is hidden_size / "
              "num_attention_heads",
              m->head_dim);
  return true;
}

/* modeling_mixtral.py: softmax over the experts, top-k, always
 * renormalised (MixtralSparseMoeBlock divides by the sum). */
static bool mixtral_rules(const xm_spec_t *s, why_t *w) {
  if (!s->moe.norm_topk_prob)
    return no(w, "top-k weights not renormalised (/moe/norm_topk_prob false) without q/k "
                 "norms: Mixtral always renormalises, and Qwen3-MoE and OLMoE, which need "
                 "not, have q/k norms");
  return true;
}

xm_hf_arch_t xm_hf_arch_match(const xm_spec_t *spec, char *why, size_t n) {
  why_t w = {why, n};
  if (why && n) why[0] = '\0';
  if (!common_rules(spec, &w)) return XM_HF_ARCH_XMOEC;
  const xm_model_spec_t *m = &spec->model;
  if (m->attention == XM_ATTN_MLA)
    return deepseek_v3_rules(spec, &w) ? XM_HF_ARCH_DEEPSEEK_V3 : XM_HF_ARCH_XMOEC;
  if (!gqa_rules(spec, &w)) return XM_HF_ARCH_XMOEC;
  if (m->qk_norm == XM_QK_NORM_FULL)
    return olmoe_rules(spec, &w) ? XM_HF_ARCH_OLMOE : XM_HF_ARCH_XMOEC;
  if (m->qk_norm == XM_QK_NORM_HEAD)
    return qwen3_rules(spec, &w) ? XM_HF_ARCH_QWEN3_MOE : XM_HF_ARCH_XMOEC;
  if (m->attention_bias || spec->moe.shared_experts > 0)
    return qwen2_rules(spec, &w) ? XM_HF_ARCH_QWEN2_MOE : XM_HF_ARCH_XMOEC;
  return mixtral_rules(spec, &w) ? XM_HF_ARCH_MIXTRAL : XM_HF_ARCH_XMOEC;
}

xm_hf_arch_t xm_hf_arch_of(const xm_spec_t *spec) { return xm_hf_arch_match(spec, NULL, 0); }

/* ---- tensor names ------------------------------------------------------------ */

/* Renames of the part after "model.layers.<i>.": `canon` and `arch`
 * spellings, where "*" stands for the expert index ("{e}" or digits). */
typedef struct {
  xm_hf_arch_t arch;
  const char *canon;
  const char *name;
} rename_t;

static const rename_t k_renames[] = {
    {XM_HF_ARCH_MIXTRAL, "mlp.gate.weight", "block_sparse_moe.gate.weight"},
    {XM_HF_ARCH_MIXTRAL, "mlp.experts.*.gate_proj.weight", "block_sparse_moe.experts.*.w1.weight"},
    {XM_HF_ARCH_MIXTRAL, "mlp.experts.*.up_proj.weight", "block_sparse_moe.experts.*.w3.weight"},
    {XM_HF_ARCH_MIXTRAL, "mlp.experts.*.down_proj.weight", "block_sparse_moe.experts.*.w2.weight"},
    {XM_HF_ARCH_QWEN2_MOE, "mlp.shared_experts.gate_proj.weight",
     "mlp.shared_expert.gate_proj.weight"},
    {XM_HF_ARCH_QWEN2_MOE, "mlp.shared_experts.up_proj.weight", "mlp.shared_expert.up_proj.weight"},
    {XM_HF_ARCH_QWEN2_MOE, "mlp.shared_experts.down_proj.weight",
     "mlp.shared_expert.down_proj.weight"},
};

/* Length of an expert index at s: "{e}" or one or more digits; 0 if none. */
static size_t expert_index_len(const char *s) {
  if (strncmp(s, "{e}", 3) == 0) return 3;
  size_t k = 0;
  while (s[k] >= '0' && s[k] <= '9')
    k++;
  return k;
}

/* Matches `s` against pattern `pat` ("*" = an expert index); on success
 * *star / *star_len hold the index text. */
static bool match_pattern(const char *s, const char *pat, const char **star, size_t *star_len) {
  *star = NULL;
  *star_len = 0;
  while (*pat) {
    if (*pat == '*') {
      size_t k = expert_index_len(s);
      if (k == 0) return false;
      *star = s;
      *star_len = k;
      s += k;
      pat++;
      continue;
    }
    if (*s != *pat) return false;
    s++, pat++;
  }
  return *s == '\0';
}

/* Length of "model.layers.<digits>." at the start of `name`, or 0. */
static size_t layer_prefix_len(const char *name) {
  static const char head[] = "model.layers.";
  size_t k = sizeof head - 1;
  if (strncmp(name, head, k) != 0) return 0;
  size_t d = 0;
  while (name[k + d] >= '0' && name[k + d] <= '9')
    d++;
  if (d == 0 || name[k + d] != '.') return 0;
  return k + d + 1;
}

static void rename_by(xm_hf_arch_t arch, const char *from, bool to_arch, char *buf, size_t n) {
  XM_ASSERT(buf && n > 0);
  size_t pre = layer_prefix_len(from);
  for (size_t i = 0; pre && i < sizeof k_renames / sizeof k_renames[0]; i++) {
    const rename_t *r = &k_renames[i];
    if (r->arch != arch) continue;
    const char *pat = to_arch ? r->canon : r->name, *out = to_arch ? r->name : r->canon;
    const char *star;
    size_t star_len;
    if (!match_pattern(from + pre, pat, &star, &star_len)) continue;
    const char *at = strchr(out, '*');
    int len;
    if (at)
      len = snprintf(buf, n, "%.*s%.*s%.*s%s", (int)pre, from, (int)(at - out), out, (int)star_len,
                     star, at + 1);
    else
      len = snprintf(buf, n, "%.*s%s", (int)pre, from, out);
    XM_ASSERT(len >= 0 && (size_t)len < n);
    return;
  }
  int len = snprintf(buf, n, "%s", from);
  XM_ASSERT(len >= 0 && (size_t)len < n);
}

void xm_hf_param_name(xm_hf_arch_t arch, const char *canonical, char *buf, size_t n) {
  rename_by(arch, canonical, true, buf, n);
}

void xm_hf_canonical_name(xm_hf_arch_t arch, const char *name, char *buf, size_t n) {
  rename_by(arch, name, false, buf, n);
}

/* ---- comparison ------------------------------------------------------------ */

typedef struct {
  xm_hf_arch_t arch;
  const char *source;
  xm_diag_t *diag;
  int count;
} diff_t;

static void differ(diff_t *d, const char *key, const char *got, const char *want) {
  char place[96];
  snprintf(place, sizeof place, "/%s", key);
  xm_diag_add(d->diag, XM_DIAG_ERROR, d->source, place, "is %s in %s, %s in the compiled program",
              got, d->source ? d->source : "the checkpoint", want);
  d->count++;
}

static void diff_int(diff_t *d, const char *key, int64_t got, int64_t want) {
  if (got == want) return;
  char a[32], b[32];
  snprintf(a, sizeof a, "%" PRId64, got);
  snprintf(b, sizeof b, "%" PRId64, want);
  differ(d, key, a, b);
}

static void diff_real(diff_t *d, const char *key, double got, double want) {
  if (got == want) return;
  char a[40], b[40];
  snprintf(a, sizeof a, "%.17g", got);
  snprintf(b, sizeof b, "%.17g", want);
  differ(d, key, a, b);
}

static void diff_bool(diff_t *d, const char *key, bool got, bool want) {
  if (got != want) differ(d, key, got ? "true" : "false", want ? "true" : "false");
}

static void diff_str(diff_t *d, const char *key, const char *got, const char *want) {
  if (strcmp(got, want) != 0) differ(d, key, got, want);
}

/* The key of the routed experts' count and width in each family. */
static const char *experts_key(xm_hf_arch_t a) {
  if (a == XM_HF_ARCH_MIXTRAL) return "num_local_experts";
  return a == XM_HF_ARCH_DEEPSEEK_V3 || a == XM_HF_ARCH_XMOEC ? "n_routed_experts" : "num_experts";
}

static const char *expert_ffn_key(xm_hf_arch_t a) {
  return a == XM_HF_ARCH_MIXTRAL || a == XM_HF_ARCH_OLMOE ? "intermediate_size"
                                                          : "moe_intermediate_size";
}

static bool is_qwen(xm_hf_arch_t a) {
  return a == XM_HF_ARCH_QWEN2_MOE || a == XM_HF_ARCH_QWEN3_MOE;
}

static void diff_yarn(diff_t *d, const xm_model_spec_t *g, const xm_model_spec_t *w) {
  bool gy = g->yarn_factor > 1, wy = w->yarn_factor > 1;
  if (!gy && !wy) return;
  if (gy != wy) {
    differ(d, "rope_scaling", gy ? "YaRN" : "null", wy ? "YaRN" : "null");
    return;
  }
  diff_real(d, "rope_scaling/factor", g->yarn_factor, w->yarn_factor);
  diff_int(d, "rope_scaling/original_max_position_embeddings", g->yarn_original_max_position,
           w->yarn_original_max_position);
  diff_real(d, "rope_scaling/beta_fast", g->yarn_beta_fast, w->yarn_beta_fast);
  diff_real(d, "rope_scaling/beta_slow", g->yarn_beta_slow, w->yarn_beta_slow);
  diff_real(d, "rope_scaling/mscale", g->yarn_mscale, w->yarn_mscale);
  diff_real(d, "rope_scaling/mscale_all_dim", g->yarn_mscale_all_dim, w->yarn_mscale_all_dim);
  diff_real(d, "rope_scaling/attention_factor", g->yarn_attention_factor, w->yarn_attention_factor);
  diff_bool(d, "rope_scaling/truncate", g->yarn_truncate, w->yarn_truncate);
}

static void diff_model(diff_t *d, const xm_spec_t *gs, const xm_spec_t *ws) {
  const xm_model_spec_t *g = &gs->model, *w = &ws->model;
  xm_hf_arch_t a = d->arch;
  diff_int(d, "vocab_size", g->vocab, w->vocab);
  diff_int(d, "hidden_size", g->hidden, w->hidden);
  diff_int(d, "num_hidden_layers", g->layers, w->layers);
  diff_int(d, "num_attention_heads", g->heads, w->heads);
  if (g->attention == XM_ATTN_MLA || w->attention == XM_ATTN_MLA) {
    diff_str(d, "kv_lora_rank", g->attention == XM_ATTN_MLA ? "MLA" : "none",
             w->attention == XM_ATTN_MLA ? "MLA" : "none");
    diff_int(d, "q_lora_rank", g->q_lora_rank, w->q_lora_rank);
    diff_int(d, "kv_lora_rank", g->kv_lora_rank, w->kv_lora_rank);
    diff_int(d, "qk_nope_head_dim", g->qk_nope_head_dim, w->qk_nope_head_dim);
    diff_int(d, "qk_rope_head_dim", g->qk_rope_head_dim, w->qk_rope_head_dim);
    diff_int(d, "v_head_dim", g->v_head_dim, w->v_head_dim);
  } else {
    diff_int(d, "num_key_value_heads", g->kv_heads, w->kv_heads);
    diff_int(d, "head_dim", g->head_dim, w->head_dim);
  }
  diff_real(d, "rope_theta", g->rope_theta, w->rope_theta);
  diff_real(d, "rms_norm_eps", g->norm_eps, w->norm_eps);
  diff_bool(d, "tie_word_embeddings", g->tied_embeddings, w->tied_embeddings);
  diff_bool(d, "attention_bias", g->attention_bias, w->attention_bias);
  if (g->qk_norm != w->qk_norm) {
    static const char *const names[] = {"none", "per head", "over the projection"};
    differ(d, "model_type", names[g->qk_norm], names[w->qk_norm]); /* the family decides */
  }
  diff_bool(d, "rope_interleave", g->rope_interleave, w->rope_interleave);
  diff_yarn(d, g, w);
  diff_int(d, "num_nextn_predict_layers", g->mtp_layers, w->mtp_layers);
  const char *dense_key = is_qwen(a) ? "mlp_only_layers" : "first_k_dense_replace";
  diff_int(d, dense_key, g->first_k_dense, w->first_k_dense);
  bool g_dense = g->first_k_dense > 0 || gs->moe.experts == 0;
  bool w_dense = w->first_k_dense > 0 || ws->moe.experts == 0;
  if (g_dense && w_dense) diff_int(d, "intermediate_size", g->dense_ffn, w->dense_ffn);
}

static void diff_moe(diff_t *d, const xm_moe_spec_t *g, const xm_moe_spec_t *w) {
  xm_hf_arch_t a = d->arch;
  diff_int(d, experts_key(a), g->experts, w->experts);
  if (g->experts == 0 || w->experts == 0) return;
  diff_int(d, "num_experts_per_tok", g->top_k, w->top_k);
  diff_int(d, expert_ffn_key(a), g->expert_ffn, w->expert_ffn);
  const char *shared_key =
      a == XM_HF_ARCH_QWEN2_MOE ? "shared_expert_intermediate_size" : "n_shared_experts";
  int64_t gs = g->shared_experts > 0 ? g->shared_ffn : 0;
  int64_t ws = w->shared_experts > 0 ? w->shared_ffn : 0;
  if (a == XM_HF_ARCH_QWEN2_MOE)
    diff_int(d, shared_key, gs, ws);
  else if (gs != ws)
    diff_int(d, shared_key, g->shared_experts, w->shared_experts);
  /* Qwen2-MoE's gate comes with its shared expert; elsewhere it does not exist. */
  diff_bool(d, shared_key, g->shared_expert_gate, w->shared_expert_gate);
  diff_str(d, "hidden_act", xm_activation_name(g->activation), xm_activation_name(w->activation));
  diff_str(d, "scoring_func", xm_scoring_name(g->scoring), xm_scoring_name(w->scoring));
  diff_bool(d, "norm_topk_prob", g->norm_topk_prob, w->norm_topk_prob);
  diff_real(d, "routed_scaling_factor", g->routed_scaling, w->routed_scaling);
  bool gl = groups_limit(g), wl = groups_limit(w);
  diff_int(d, "n_group", gl ? g->n_group : 1, wl ? w->n_group : 1);
  diff_int(d, "topk_group", gl ? g->topk_group : 1, wl ? w->topk_group : 1);
  if (g->has_capacity != w->has_capacity ||
      (g->has_capacity && g->capacity_factor != w->capacity_factor)) {
    char x[40] = "null", y[40] = "null";
    if (g->has_capacity) snprintf(x, sizeof x, "%.17g", g->capacity_factor);
    if (w->has_capacity) snprintf(y, sizeof y, "%.17g", w->capacity_factor);
    differ(d, "capacity_factor", x, y);
  }
}

int xm_hf_spec_diff(xm_hf_arch_t arch, const xm_spec_t *want, const xm_spec_t *got,
                    const char *source, xm_diag_t *diag) {
  diff_t d = {.arch = arch, .source = source, .diag = diag};
  diff_model(&d, got, want);
  diff_moe(&d, &got->moe, &want->moe);
  return d.count;
}
