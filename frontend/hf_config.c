/* frontend/hf_config.c — import of a Hugging Face config.json into xm_spec_t.
 *
 * One importer per model family (Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek
 * v1/v2/v3) reads the keys its transformers config class defines and maps
 * them onto the model and moe sections of the spec; training fields keep
 * their defaults. Every key an importer reads is recorded in the context, so
 * that after the import any key that was neither read nor on the allow-list
 * of harmless keys (dtype, token ids, rope scaling, ...) can be reported as
 * a warning with its pointer: a typo such as "num_expert_per_tok" must not
 * silently fall back to a default. Values of the wrong type or out of range
 * are errors; values that describe an architecture xmoec does not model
 * (moe_layer_freq 2, non-empty mlp_only_layers, biases on every projection,
 * activations other than silu) are errors that say "unsupported".
 *
 * Fields that transformers would default when absent default the same way
 * here (num_key_value_heads = heads, head_dim = hidden / heads, ...), except
 * the sizes that define the model (vocab, hidden, layers, heads, widths,
 * expert counts, top_k): a config without them is almost certainly not the
 * file the user meant, so their absence is an error.
 *
 * The importer also checks the relations between HF fields (top_k <=
 * experts, heads divisible by kv heads, ...) so that such errors point into
 * the document the user wrote rather than into xmoec's own section names.
 * Training fields keep their defaults, except seq_len, which an xmoec spec
 * must state and an HF config never does: it becomes 4096.
 */
#include "frontend/hf_config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "frontend/spec_fields.h"
#include "support/strbuf.h"

/* Largest size any single HF field may hold; products of a few such fields
 * still fit in int64. Spec validation applies the real, tighter bounds. */
#define HF_SIZE_MAX ((int64_t)1 << 30)
#define HF_MAX_USED 96

/* Aux-loss-free bias update speed used for topk_method noaux_tc; DeepSeek-V3
 * (arXiv 2412.19437, section 4.2) trains with gamma = 0.001. HF configs do
 * not carry it. */
#define HF_NOAUX_GAMMA 0.001

/* An HF config has no training section, but a spec needs a sequence length
 * (validation requires one, and FLOPs depend on it). 4096 is the pretraining
 * length of most of the supported families; the xmoec field default is 0
 * because an xmoec spec must state it. */
#define HF_DEFAULT_SEQ_LEN 4096

typedef struct {
  const cJSON *root;
  const char *source;
  xm_diag_t *diag;
  const char *model_type;
  const char *used[HF_MAX_USED];
  int n_used;
} hf_ctx_t;

/* Keys that carry no architecture xmoec models (or that it deliberately
 * ignores, such as DeepSeek-V3's multi-token-prediction layers, which are
 * excluded from the counts). Checked keys such as clip_qkv are listed too:
 * their importer reads them when it cares. */
static const char *const k_harmless[] = {
    "_name_or_path",
    "architectures",
    "model_type",
    "auto_map",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "max_position_embeddings",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "initializer_range",
    "use_cache",
    "sliding_window",
    "max_window_layers",
    "attention_dropout",
    "output_router_logits",
    "router_jitter_noise",
    "quantization_config",
    "pretraining_tp",
    "ep_size",
    "seq_aux",
    "return_dict",
    "output_hidden_states",
    "output_attentions",
    "use_return_dict",
    "tokenizer_class",
    "id2label",
    "label2id",
    "_attn_implementation",
    "is_decoder",
    "chunk_size_feed_forward",
    "hidden_dropout",
    "embd_pdrop",
    "resid_pdrop",
    "layer_types",
    "router_z_loss_coef",
    "use_qk_norm",
};

/* HF keys and the xmoec field whose upper limit (from the field table of
 * frontend/spec_fields.c) applies to them, so that an out-of-range value is
 * reported at the HF key rather than at the xmoec field it maps to. */
static const struct {
  const char *hf_key;
  xm_spec_section_t section;
  const char *field;
} k_limits[] = {
    {"vocab_size", XM_SECTION_MODEL, "vocab"},
    {"hidden_size", XM_SECTION_MODEL, "hidden"},
    {"num_hidden_layers", XM_SECTION_MODEL, "layers"},
    {"num_attention_heads", XM_SECTION_MODEL, "heads"},
    {"num_key_value_heads", XM_SECTION_MODEL, "kv_heads"},
    {"head_dim", XM_SECTION_MODEL, "head_dim"},
    {"intermediate_size", XM_SECTION_MODEL, "dense_ffn"},
    {"first_k_dense_replace", XM_SECTION_MODEL, "first_k_dense"},
    {"num_nextn_predict_layers", XM_SECTION_MODEL, "mtp_layers"},
    {"q_lora_rank", XM_SECTION_MODEL, "q_lora_rank"},
    {"kv_lora_rank", XM_SECTION_MODEL, "kv_lora_rank"},
    {"qk_nope_head_dim", XM_SECTION_MODEL, "qk_nope_head_dim"},
    {"qk_rope_head_dim", XM_SECTION_MODEL, "qk_rope_head_dim"},
    {"v_head_dim", XM_SECTION_MODEL, "v_head_dim"},
    {"rope_theta", XM_SECTION_MODEL, "rope_theta"},
    {"rms_norm_eps", XM_SECTION_MODEL, "norm_eps"},
    {"num_local_experts", XM_SECTION_MOE, "experts"},
    {"num_experts", XM_SECTION_MOE, "experts"},
    {"n_routed_experts", XM_SECTION_MOE, "experts"},
    {"num_experts_per_tok", XM_SECTION_MOE, "top_k"},
    {"moe_intermediate_size", XM_SECTION_MOE, "expert_ffn"},
    {"n_shared_experts", XM_SECTION_MOE, "shared_experts"},
    {"shared_expert_intermediate_size", XM_SECTION_MOE, "shared_ffn"},
    {"n_group", XM_SECTION_MOE, "n_group"},
    {"topk_group", XM_SECTION_MOE, "topk_group"},
    {"routed_scaling_factor", XM_SECTION_MOE, "routed_scaling"},
    {"aux_loss_alpha", XM_SECTION_MOE, "aux_alpha"},
    {"router_aux_loss_coef", XM_SECTION_MOE, "aux_alpha"},
    {"aux_free_bias_update_speed", XM_SECTION_MOE, "aux_free_gamma"},
};

/* Upper limit for an HF key: its xmoec field's, else `fallback`. */
static double hf_limit(const char *key, double fallback) {
  for (size_t i = 0; i < sizeof k_limits / sizeof k_limits[0]; i++) {
    if (strcmp(k_limits[i].hf_key, key) != 0) continue;
    int f = xm_spec_field_find(k_limits[i].section, k_limits[i].field);
    return f >= 0 ? xm_spec_field_get(f)->max : fallback;
  }
  return fallback;
}

/* ---- reading helpers ---------------------------------------------------- */

/* JSON pointer of a top-level key ('~' and '/' escaped per RFC 6901). */
static void hf_pointer(const char *key, char *out, size_t cap) {
  size_t n = 0;
  if (cap < 2) return;
  out[n++] = '/';
  for (const char *p = key; *p && n + 3 < cap; p++) {
    if (*p == '~' || *p == '/') {
      out[n++] = '~';
      out[n++] = *p == '~' ? '0' : '1';
    } else {
      out[n++] = *p;
    }
  }
  out[n] = '\0';
}

static void hf_error(hf_ctx_t *c, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void hf_error(hf_ctx_t *c, const char *key, const char *fmt, ...) {
  char place[128];
  hf_pointer(key, place, sizeof place);
  va_list ap;
  va_start(ap, fmt);
  xm_diag_addv(c->diag, XM_DIAG_ERROR, c->source, place, fmt, ap);
  va_end(ap);
}

static const char *hf_type_name(const cJSON *v) {
  if (cJSON_IsNumber(v)) return "a number";
  if (cJSON_IsString(v)) return "a string";
  if (cJSON_IsBool(v)) return "a boolean";
  if (cJSON_IsArray(v)) return "an array";
  if (cJSON_IsObject(v)) return "an object";
  if (cJSON_IsNull(v)) return "null";
  return "an unknown value";
}

/* Marks `key` as read and returns its value, or NULL when absent or null
 * (transformers treats an explicit null like an absent key). */
static const cJSON *hf_get(hf_ctx_t *c, const char *key) {
  if (c->n_used < HF_MAX_USED) c->used[c->n_used++] = key;
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->root, key);
  return cJSON_IsNull(v) ? NULL : v;
}

/* Integer field in [min, HF_SIZE_MAX]. A missing required field is an error;
 * a missing optional one yields `dflt`. */
static int64_t hf_int(hf_ctx_t *c, const char *key, bool required, int64_t min, int64_t dflt) {
  const cJSON *v = hf_get(c, key);
  if (!v) {
    if (required)
      hf_error(c, key, "missing required field \"%s\" (model_type %s)", key, c->model_type);
    return dflt;
  }
  if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble)) {
    hf_error(c, key, "expected an integer, got %s%s",
             cJSON_IsNumber(v) ? "a fraction" : hf_type_name(v), xm_spec_quoted_hint(v, false));
    return dflt;
  }
  double d = v->valuedouble, max = hf_limit(key, (double)HF_SIZE_MAX);
  if (max > (double)HF_SIZE_MAX) max = (double)HF_SIZE_MAX;
  if (d < (double)min || d > max) {
    hf_error(c, key, "must be in [%lld, %lld], got %.17g", (long long)min, (long long)max, d);
    return dflt;
  }
  return (int64_t)d;
}

/* Real field; `positive` rejects zero and negative values. */
static double hf_real(hf_ctx_t *c, const char *key, bool positive, double dflt) {
  const cJSON *v = hf_get(c, key);
  if (!v) return dflt;
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
    hf_error(c, key, "expected a number, got %s%s", hf_type_name(v), xm_spec_quoted_hint(v, false));
    return dflt;
  }
  if (positive ? v->valuedouble <= 0 : v->valuedouble < 0) {
    hf_error(c, key, "must be %s, got %.17g", positive ? "> 0" : ">= 0", v->valuedouble);
    return dflt;
  }
  double max = hf_limit(key, HUGE_VAL);
  if (v->valuedouble > max) {
    hf_error(c, key, "must be <= %g, got %.17g", max, v->valuedouble);
    return dflt;
  }
  return v->valuedouble;
}

static bool hf_bool(hf_ctx_t *c, const char *key, bool dflt) {
  const cJSON *v = hf_get(c, key);
  if (!v) return dflt;
  if (!cJSON_IsBool(v)) {
    hf_error(c, key, "expected true or false, got %s", hf_type_name(v));
    return dflt;
  }
  return cJSON_IsTrue(v);
}

static const char *hf_string(hf_ctx_t *c, const char *key, const char *dflt) {
  const cJSON *v = hf_get(c, key);
  if (!v) return dflt;
  if (!cJSON_IsString(v)) {
    hf_error(c, key, "expected a string, got %s", hf_type_name(v));
    return dflt;
  }
  return v->valuestring;
}

/* A boolean that xmoec supports only with one value. */
static void hf_require_bool(hf_ctx_t *c, const char *key, bool want, const char *why) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->root, key);
  bool got = hf_bool(c, key, want);
  if (v && cJSON_IsBool(v) && got != want)
    hf_error(c, key, "unsupported: %s must be %s for xmoec (%s)", key, want ? "true" : "false",
             why);
}

/* ---- shared parts of every family --------------------------------------- */

/* An error at /<key>/<sub>. */
static void hf_sub_error(hf_ctx_t *c, const char *key, const char *sub, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void hf_sub_error(hf_ctx_t *c, const char *key, const char *sub, const char *fmt, ...) {
  char a[96], b[96], place[200];
  hf_pointer(key, a, sizeof a);
  hf_pointer(sub, b, sizeof b);
  snprintf(place, sizeof place, "%s%s", a, b);
  va_list ap;
  va_start(ap, fmt);
  xm_diag_addv(c->diag, XM_DIAG_ERROR, c->source, place, fmt, ap);
  va_end(ap);
}

/* A number of rope_scaling in [lo, hi]; `dflt` when absent or null. */
static double hf_scaling_real(hf_ctx_t *c, const cJSON *rs, const char *sub, double lo, double hi,
                              double dflt) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(rs, sub);
  if (!v || cJSON_IsNull(v)) return dflt;
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
    hf_sub_error(c, "rope_scaling", sub, "expected a number, got %s%s", hf_type_name(v),
                 xm_spec_quoted_hint(v, false));
    return dflt;
  }
  if (v->valuedouble < lo || v->valuedouble > hi) {
    hf_sub_error(c, "rope_scaling", sub, "must be in [%g, %g], got %.17g", lo, hi,
                 v->valuedouble);
    return dflt;
  }
  return v->valuedouble;
}

/* rope_scaling: null, or YaRN as transformers' _compute_yarn_parameters
 * reads it (its keys, defaults and the fallback of
 * original_max_position_embeddings to max_position_embeddings). Other
 * scaling types are refused: training them as plain RoPE would train
 * another model. */
static void hf_import_rope_scaling(hf_ctx_t *c, xm_spec_t *spec) {
  static const char *const keys[] = {
      "type",      "rope_type", "factor",         "original_max_position_embeddings",
      "beta_fast", "beta_slow", "mscale",         "mscale_all_dim",
      "attention_factor",       "truncate",       NULL};
  const cJSON *rs = hf_get(c, "rope_scaling");
  if (!rs) return;
  if (!cJSON_IsObject(rs)) {
    hf_error(c, "rope_scaling", "expected an object or null, got %s", hf_type_name(rs));
    return;
  }
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
  const char *tk = "rope_type";
  if (!t) t = cJSON_GetObjectItemCaseSensitive(rs, "type"), tk = "type";
  if (!t) {
    hf_sub_error(c, "rope_scaling", tk, "missing: the scaling type (\"type\" or \"rope_type\", "
                 "\"yarn\" for YaRN)");
    return;
  }
  if (!cJSON_IsString(t)) {
    hf_sub_error(c, "rope_scaling", tk, "expected the scaling type as a string (\"yarn\"), got %s",
                 hf_type_name(t));
    return;
  }
  if (strcmp(t->valuestring, "default") == 0) return;
  if (strcmp(t->valuestring, "yarn") != 0) {
    hf_sub_error(c, "rope_scaling", tk,
                 "unsupported: rope scaling \"%s\"; xmoec applies YaRN (\"yarn\") only",
                 t->valuestring);
    return;
  }
  for (const cJSON *it = rs->child; it; it = it->next) {
    bool known = false;
    for (int i = 0; keys[i] && !known; i++)
      known = strcmp(keys[i], it->string) == 0;
    if (!known)
      hf_sub_error(c, "rope_scaling", it->string,
                   "unknown YaRN key (known: factor, original_max_position_embeddings, "
                   "beta_fast, beta_slow, mscale, mscale_all_dim, attention_factor, truncate)");
  }
  xm_model_spec_t *m = &spec->model;
  const cJSON *fv = cJSON_GetObjectItemCaseSensitive(rs, "factor");
  if (!fv || cJSON_IsNull(fv)) /* a present one is checked just below */
    hf_sub_error(c, "rope_scaling", "factor", "YaRN needs its factor (a number >= 1)");
  m->yarn_factor = hf_scaling_real(c, rs, "factor", 1, 1e4, 1);
  double orig = hf_scaling_real(c, rs, "original_max_position_embeddings", 1, 16777216, 0);
  if (orig == 0) {
    const cJSON *mp = cJSON_GetObjectItemCaseSensitive(c->root, "max_position_embeddings");
    if (cJSON_IsNumber(mp) && mp->valuedouble >= 1 && mp->valuedouble <= 16777216)
      orig = mp->valuedouble;
  }
  if (orig != floor(orig))
    hf_sub_error(c, "rope_scaling", "original_max_position_embeddings", "expected an integer");
  m->yarn_original_max_position = (int64_t)orig;
  if (orig == 0)
    hf_sub_error(c, "rope_scaling", "original_max_position_embeddings",
                 "YaRN needs the context length before the extension (here or as "
                 "max_position_embeddings)");
  m->yarn_beta_fast = hf_scaling_real(c, rs, "beta_fast", 1e-9, 1e4, 32);
  m->yarn_beta_slow = hf_scaling_real(c, rs, "beta_slow", 1e-9, 1e4, 1);
  m->yarn_mscale = hf_scaling_real(c, rs, "mscale", 0, 100, 0);
  m->yarn_mscale_all_dim = hf_scaling_real(c, rs, "mscale_all_dim", 0, 100, 0);
  m->yarn_attention_factor = hf_scaling_real(c, rs, "attention_factor", 0, 100, 0);
  const cJSON *tr = cJSON_GetObjectItemCaseSensitive(rs, "truncate");
  if (tr && !cJSON_IsNull(tr) && !cJSON_IsBool(tr))
    hf_sub_error(c, "rope_scaling", "truncate", "expected true or false, got %s",
                 hf_type_name(tr));
  m->yarn_truncate = !cJSON_IsFalse(tr);
}

static void hf_import_activation(hf_ctx_t *c, xm_spec_t *spec) {
  const char *act = hf_string(c, "hidden_act", "silu");
  if (strcmp(act, "silu") != 0)
    hf_error(c, "hidden_act",
             "unsupported: hidden_act \"%s\"; xmoec imports SwiGLU (\"silu\") "
             "experts only",
             act);
  spec->moe.activation = XM_ACT_SWIGLU;
}

/* RoPE rotates pairs of dims, so the rotated head dim must be even; the
 * dim is reported at `key`, the HF key it came from. */
static void hf_check_head_dim(hf_ctx_t *c, int64_t dim, const char *key) {
  double max = hf_limit("head_dim", (double)HF_SIZE_MAX);
  if (dim > max)
    hf_error(c, key, "gives a head dim of %lld, above the limit %.0f", (long long)dim, max);
  else if (dim > 0 && dim % 2 != 0)
    hf_error(c, key, "gives an odd head dim %lld; rotary embeddings need an even one",
             (long long)dim);
}

/* Sizes and attention of a Llama-style decoder (every family but MLA). */
static void hf_import_base(hf_ctx_t *c, xm_spec_t *spec, double rope_dflt, double eps_dflt) {
  xm_model_spec_t *m = &spec->model;
  m->vocab = hf_int(c, "vocab_size", true, 1, 0);
  m->hidden = hf_int(c, "hidden_size", true, 1, 0);
  m->layers = hf_int(c, "num_hidden_layers", true, 1, 0);
  m->heads = hf_int(c, "num_attention_heads", true, 1, 0);
  m->kv_heads = hf_int(c, "num_key_value_heads", false, 1, m->heads);
  int64_t hd_dflt = m->heads > 0 ? m->hidden / m->heads : 0;
  m->head_dim = hf_int(c, "head_dim", false, 1, hd_dflt);
  if (!cJSON_GetObjectItemCaseSensitive(c->root, "head_dim") && m->heads > 0 &&
      m->hidden % m->heads != 0)
    hf_error(c, "hidden_size",
             "hidden_size %lld is not divisible by num_attention_heads %lld "
             "and no head_dim is given",
             (long long)m->hidden, (long long)m->heads);
  hf_check_head_dim(c, m->head_dim,
                    cJSON_GetObjectItemCaseSensitive(c->root, "head_dim") ? "head_dim"
                                                                          : "hidden_size");
  if (m->kv_heads > 0 && m->heads % m->kv_heads != 0)
    hf_error(c, "num_key_value_heads",
             "num_attention_heads %lld must be a multiple of "
             "num_key_value_heads %lld",
             (long long)m->heads, (long long)m->kv_heads);
  m->rope_theta = hf_real(c, "rope_theta", true, rope_dflt);
  hf_import_rope_scaling(c, spec);
  m->norm_eps = hf_real(c, "rms_norm_eps", true, eps_dflt);
  m->tied_embeddings = hf_bool(c, "tie_word_embeddings", false);
  m->attention = m->kv_heads == m->heads ? XM_ATTN_MHA : XM_ATTN_GQA;
  m->attention_bias = false;
  m->qk_norm = XM_QK_NORM_NONE;
  m->first_k_dense = 0;
  m->dense_ffn = 0;
  m->q_lora_rank = m->kv_lora_rank = 0;
  m->qk_nope_head_dim = m->qk_rope_head_dim = m->v_head_dim = 0;
  hf_import_activation(c, spec);
}

/* Routing fields common to the families without groups or shared experts. */
static void hf_moe_plain(xm_spec_t *spec) {
  xm_moe_spec_t *e = &spec->moe;
  e->shared_experts = 0;
  e->shared_ffn = 0;
  e->shared_expert_gate = false;
  e->scoring = XM_SCORING_SOFTMAX;
  e->routed_scaling = 1.0;
  e->n_group = 1;
  e->topk_group = 1;
  e->aux_free_gamma = 0.0;
  e->has_capacity = false;
  e->capacity_factor = 0.0;
}

static void hf_check_top_k(hf_ctx_t *c, const xm_spec_t *spec, const char *experts_key) {
  if (spec->moe.top_k > 0 && spec->moe.experts > 0 && spec->moe.top_k > spec->moe.experts)
    hf_error(c, "num_experts_per_tok", "num_experts_per_tok %lld exceeds %s %lld",
             (long long)spec->moe.top_k, experts_key, (long long)spec->moe.experts);
}

/* ---- families ----------------------------------------------------------- */

/* Mixtral: intermediate_size is the width of each expert; every layer is
 * MoE; routing is softmax over the top-k logits, i.e. renormalised top-k. */
static void hf_import_mixtral(hf_ctx_t *c, xm_spec_t *spec) {
  hf_import_base(c, spec, 1e6, 1e-5);
  hf_moe_plain(spec);
  xm_moe_spec_t *e = &spec->moe;
  e->experts = hf_int(c, "num_local_experts", true, 1, 0);
  e->top_k = hf_int(c, "num_experts_per_tok", true, 1, 0);
  e->expert_ffn = hf_int(c, "intermediate_size", true, 1, 0);
  e->norm_topk_prob = true;
  e->aux_alpha = hf_real(c, "router_aux_loss_coef", false, 0.02);
  hf_check_top_k(c, spec, "num_local_experts");
}

/* Qwen2-MoE / Qwen3-MoE: MoE every decoder_sparse_step layers except
 * mlp_only_layers; xmoec needs every layer MoE. */
static void hf_import_qwen_sparsity(hf_ctx_t *c) {
  int64_t step = hf_int(c, "decoder_sparse_step", false, 1, 1);
  if (step != 1)
    hf_error(c, "decoder_sparse_step",
             "unsupported: decoder_sparse_step %lld; xmoec needs "
             "every layer to be MoE (decoder_sparse_step 1)",
             (long long)step);
  const cJSON *v = hf_get(c, "mlp_only_layers");
  if (v && !cJSON_IsArray(v))
    hf_error(c, "mlp_only_layers", "expected an array, got %s", hf_type_name(v));
  else if (v && cJSON_GetArraySize(v) > 0)
    hf_error(c, "mlp_only_layers",
             "unsupported: mlp_only_layers must be empty; xmoec puts "
             "dense layers only before the MoE layers");
  const cJSON *sw = cJSON_GetObjectItemCaseSensitive(c->root, "use_sliding_window");
  hf_get(c, "use_sliding_window");
  if (sw && !cJSON_IsNull(sw) && !cJSON_IsBool(sw))
    hf_error(c, "use_sliding_window", "expected true or false, got %s", hf_type_name(sw));
  else if (cJSON_IsTrue(sw))
    hf_error(c, "use_sliding_window", "unsupported: sliding-window attention");
}

static void hf_import_qwen_moe(hf_ctx_t *c, xm_spec_t *spec, bool qwen3) {
  hf_import_base(c, spec, 10000.0, 1e-6);
  hf_moe_plain(spec);
  xm_model_spec_t *m = &spec->model;
  xm_moe_spec_t *e = &spec->moe;
  /* intermediate_size is the dense width used only by mlp_only_layers. */
  m->dense_ffn = hf_int(c, "intermediate_size", false, 1, 0);
  e->experts = hf_int(c, "num_experts", true, 1, 0);
  e->top_k = hf_int(c, "num_experts_per_tok", true, 1, 0);
  e->expert_ffn = hf_int(c, "moe_intermediate_size", true, 1, 0);
  e->norm_topk_prob = hf_bool(c, "norm_topk_prob", false);
  e->aux_alpha = hf_real(c, "router_aux_loss_coef", false, 0.001);
  hf_import_qwen_sparsity(c);
  if (qwen3) {
    m->qk_norm = XM_QK_NORM_HEAD;
    hf_require_bool(c, "attention_bias", false, "only Qwen2-MoE's q/k/v biases are modelled");
  } else {
    /* Qwen2-MoE always has q/k/v biases and one gated shared expert. */
    m->attention_bias = true;
    e->shared_ffn = hf_int(c, "shared_expert_intermediate_size", true, 0, 0);
    e->shared_experts = e->shared_ffn > 0 ? 1 : 0;
    e->shared_expert_gate = e->shared_ffn > 0;
  }
  hf_check_top_k(c, spec, "num_experts");
}

/* OLMoE: intermediate_size is the expert width; q/k norms span the whole
 * projection; clip_qkv would clamp activations, which xmoec does not do. */
static void hf_import_olmoe(hf_ctx_t *c, xm_spec_t *spec) {
  hf_import_base(c, spec, 10000.0, 1e-5);
  hf_moe_plain(spec);
  xm_moe_spec_t *e = &spec->moe;
  spec->model.qk_norm = XM_QK_NORM_FULL;
  e->experts = hf_int(c, "num_experts", true, 1, 0);
  e->top_k = hf_int(c, "num_experts_per_tok", true, 1, 0);
  e->expert_ffn = hf_int(c, "intermediate_size", true, 1, 0);
  e->norm_topk_prob = hf_bool(c, "norm_topk_prob", false);
  e->aux_alpha = hf_real(c, "router_aux_loss_coef", false, 0.01);
  hf_require_bool(c, "attention_bias", false, "only Qwen2-MoE's q/k/v biases are modelled");
  if (hf_get(c, "clip_qkv"))
    hf_error(c, "clip_qkv", "unsupported: clip_qkv must be null; xmoec does not clamp q/k/v");
  hf_check_top_k(c, spec, "num_experts");
}

/* A key another one determines: absent, or equal to `want`. */
static void hf_check_derived(hf_ctx_t *c, const char *key, int64_t want, const char *from) {
  if (!hf_get(c, key)) return;
  int64_t v = hf_int(c, key, false, 1, want);
  if (v != want)
    hf_error(c, key, "%s %lld disagrees with %s = %lld (it is derived from it)", key,
             (long long)v, from, (long long)want);
}

/* DeepSeek MLA attention (V2, V3): q through an optional low-rank bottleneck,
 * k/v through a shared compressed latent plus a decoupled RoPE key. */
static void hf_import_mla(hf_ctx_t *c, xm_spec_t *spec) {
  xm_model_spec_t *m = &spec->model;
  m->vocab = hf_int(c, "vocab_size", true, 1, 0);
  m->hidden = hf_int(c, "hidden_size", true, 1, 0);
  m->layers = hf_int(c, "num_hidden_layers", true, 1, 0);
  m->heads = hf_int(c, "num_attention_heads", true, 1, 0);
  /* MLA has no kv-head grouping: every head reads the shared latent. */
  (void)hf_int(c, "num_key_value_heads", false, 1, m->heads);
  m->kv_heads = m->heads;
  m->q_lora_rank = hf_int(c, "q_lora_rank", false, 1, 0);
  m->kv_lora_rank = hf_int(c, "kv_lora_rank", true, 1, 0);
  m->qk_nope_head_dim = hf_int(c, "qk_nope_head_dim", true, 1, 0);
  m->qk_rope_head_dim = hf_int(c, "qk_rope_head_dim", true, 1, 0);
  m->v_head_dim = hf_int(c, "v_head_dim", true, 1, 0);
  m->head_dim = m->qk_nope_head_dim + m->qk_rope_head_dim;
  hf_check_head_dim(c, m->qk_rope_head_dim, "qk_rope_head_dim");
  /* transformers' DeepseekV3Config derives head_dim (the rotary part) and
   * qk_head_dim (nope + rope) and writes both into the configs it saves:
   * read back, they must agree with the fields they come from. */
  hf_check_derived(c, "head_dim", m->qk_rope_head_dim, "qk_rope_head_dim");
  hf_check_derived(c, "qk_head_dim", m->head_dim, "qk_nope_head_dim + qk_rope_head_dim");
  if (m->head_dim > hf_limit("head_dim", (double)HF_SIZE_MAX))
    hf_error(c, "qk_nope_head_dim",
             "qk_nope_head_dim + qk_rope_head_dim = %lld exceeds the "
             "head dim limit %.0f",
             (long long)m->head_dim, hf_limit("head_dim", 0));
  m->rope_theta = hf_real(c, "rope_theta", true, 10000.0);
  hf_import_rope_scaling(c, spec);
  /* V3 names the pair layout (default interleaved); V2's complex-number
   * RoPE rotates the pairs (2i, 2i+1) too. */
  m->rope_interleave = hf_bool(c, "rope_interleave", true);
  m->norm_eps = hf_real(c, "rms_norm_eps", true, 1e-6);
  m->tied_embeddings = hf_bool(c, "tie_word_embeddings", false);
  m->attention = XM_ATTN_MLA;
  m->attention_bias = false;
  m->qk_norm = XM_QK_NORM_NONE;
  hf_import_activation(c, spec);
}

/* topk_method of DeepSeek-V2/V3 and the group fields it uses. The group
 * score rule of docs/design.md, Model semantics (max for softmax, top-2 sum for sigmoid) matches
 * group_limited_greedy with softmax and noaux_tc with sigmoid only. */
static void hf_import_ds_routing(hf_ctx_t *c, xm_spec_t *spec, int version) {
  xm_moe_spec_t *e = &spec->moe;
  const char *method = hf_string(c, "topk_method", version == 3 ? "noaux_tc" : "greedy");
  int64_t n_group = hf_int(c, "n_group", false, 1, version == 3 ? 8 : 1);
  int64_t topk_group = hf_int(c, "topk_group", false, 1, version == 3 ? 4 : 1);
  e->n_group = 1;
  e->topk_group = 1;
  if (strcmp(method, "greedy") == 0) return;
  if (strcmp(method, "group_limited_greedy") == 0) {
    if (e->scoring != XM_SCORING_SOFTMAX)
      hf_error(c, "topk_method", "unsupported: group_limited_greedy with scoring_func sigmoid");
  } else if (strcmp(method, "noaux_tc") == 0) {
    if (e->scoring != XM_SCORING_SIGMOID)
      hf_error(c, "topk_method", "unsupported: noaux_tc with scoring_func softmax");
    /* xmoec's exports record the speed they trained with (Hugging Face
     * configs carry none: then DeepSeek-V3's). */
    e->aux_free_gamma = hf_real(c, "aux_free_bias_update_speed", false, HF_NOAUX_GAMMA);
  } else {
    hf_error(c, "topk_method",
             "unknown topk_method \"%s\"; supported: greedy, "
             "group_limited_greedy, noaux_tc",
             method);
    return;
  }
  e->n_group = n_group;
  e->topk_group = topk_group;
  if (e->experts > 0 && e->experts % n_group != 0)
    hf_error(c, "n_group", "n_routed_experts %lld is not divisible by n_group %lld",
             (long long)e->experts, (long long)n_group);
  else if (topk_group > n_group)
    hf_error(c, "topk_group", "topk_group %lld exceeds n_group %lld", (long long)topk_group,
             (long long)n_group);
  else if (e->experts > 0 && e->top_k > topk_group * (e->experts / n_group))
    hf_error(c, "num_experts_per_tok",
             "num_experts_per_tok %lld exceeds the %lld experts "
             "of the topk_group %lld kept groups",
             (long long)e->top_k, (long long)(topk_group * (e->experts / n_group)),
             (long long)topk_group);
}

static void hf_import_ds_moe(hf_ctx_t *c, xm_spec_t *spec, int version) {
  xm_model_spec_t *m = &spec->model;
  xm_moe_spec_t *e = &spec->moe;
  hf_moe_plain(spec);
  m->dense_ffn = hf_int(c, "intermediate_size", true, 1, 0);
  m->first_k_dense = hf_int(c, "first_k_dense_replace", false, 0, 0);
  if (m->layers > 0 && m->first_k_dense > m->layers)
    hf_error(c, "first_k_dense_replace",
             "first_k_dense_replace %lld exceeds "
             "num_hidden_layers %lld",
             (long long)m->first_k_dense, (long long)m->layers);
  /* DeepSeek-V3's MTP modules (model.layers.{L..L+D-1} in its checkpoints). */
  if (version == 3) m->mtp_layers = hf_int(c, "num_nextn_predict_layers", false, 0, 0);
  int64_t freq = hf_int(c, "moe_layer_freq", false, 1, 1);
  if (freq != 1)
    hf_error(c, "moe_layer_freq",
             "unsupported: moe_layer_freq %lld; xmoec needs every layer "
             "after first_k_dense_replace to be MoE (moe_layer_freq 1)",
             (long long)freq);
  e->experts = hf_int(c, "n_routed_experts", true, 1, 0);
  e->top_k = hf_int(c, "num_experts_per_tok", true, 1, 0);
  e->expert_ffn = hf_int(c, "moe_intermediate_size", true, 1, 0);
  e->shared_experts = hf_int(c, "n_shared_experts", false, 0, 0);
  e->shared_ffn = e->shared_experts * e->expert_ffn;
  e->norm_topk_prob = hf_bool(c, "norm_topk_prob", version == 3);
  e->aux_alpha = hf_real(c, "aux_loss_alpha", false, 0.001);
  const char *scoring = hf_string(c, "scoring_func", version == 3 ? "sigmoid" : "softmax");
  if (strcmp(scoring, "softmax") == 0) {
    e->scoring = XM_SCORING_SOFTMAX;
  } else if (strcmp(scoring, "sigmoid") == 0 && version == 3) {
    e->scoring = XM_SCORING_SIGMOID;
  } else {
    hf_error(c, "scoring_func",
             "unsupported scoring_func \"%s\" for model_type %s; "
             "supported: %s",
             scoring, c->model_type, version == 3 ? "softmax, sigmoid" : "softmax");
  }
  hf_check_top_k(c, spec, "n_routed_experts");
  if (version >= 2) {
    e->routed_scaling = hf_real(c, "routed_scaling_factor", true, version == 3 ? 2.5 : 1.0);
    hf_import_ds_routing(c, spec, version);
  }
  hf_require_bool(c, "attention_bias", false, "only Qwen2-MoE's q/k/v biases are modelled");
}

static void hf_import_deepseek(hf_ctx_t *c, xm_spec_t *spec) {
  hf_import_base(c, spec, 10000.0, 1e-6);
  hf_import_ds_moe(c, spec, 1);
}
static void hf_import_deepseek_v2(hf_ctx_t *c, xm_spec_t *spec) {
  hf_import_mla(c, spec);
  hf_import_ds_moe(c, spec, 2);
}
static void hf_import_deepseek_v3(hf_ctx_t *c, xm_spec_t *spec) {
  hf_import_mla(c, spec);
  hf_import_ds_moe(c, spec, 3);
}
static void hf_import_qwen2_moe(hf_ctx_t *c, xm_spec_t *spec) {
  hf_import_qwen_moe(c, spec, false);
}
static void hf_import_qwen3_moe(hf_ctx_t *c, xm_spec_t *spec) { hf_import_qwen_moe(c, spec, true); }

static const struct {
  const char *model_type;
  void (*import)(hf_ctx_t *c, xm_spec_t *spec);
} k_families[] = {
    {"mixtral", hf_import_mixtral},         /* Mixtral-8x7B, 8x22B */
    {"qwen2_moe", hf_import_qwen2_moe},     /* Qwen1.5-MoE, Qwen2-57B-A14B */
    {"qwen3_moe", hf_import_qwen3_moe},     /* Qwen3-30B-A3B, 235B-A22B */
    {"olmoe", hf_import_olmoe},             /* OLMoE-1B-7B */
    {"deepseek", hf_import_deepseek},       /* DeepSeek-MoE-16B (v1) */
    {"deepseek_v2", hf_import_deepseek_v2}, /* DeepSeek-V2, V2-Lite */
    {"deepseek_v3", hf_import_deepseek_v3}, /* DeepSeek-V3, R1 */
};
#define HF_NUM_FAMILIES (sizeof k_families / sizeof k_families[0])

/* ---- entry points ------------------------------------------------------- */

/* Any "model_type" key marks an HF config, whatever its value: a non-string
 * one is then reported at /model_type instead of as dozens of unknown keys. */
bool xm_hf_config_detect(const cJSON *root) {
  return cJSON_IsObject(root) && cJSON_GetObjectItemCaseSensitive(root, "model_type") != NULL;
}

static void hf_copy_name(char *dst, const char *src) { snprintf(dst, XM_SPEC_NAME_MAX, "%s", src); }

/* _name_or_path, else architectures[0], else the model_type. */
static void hf_import_name(hf_ctx_t *c, xm_spec_t *spec) {
  const cJSON *path = cJSON_GetObjectItemCaseSensitive(c->root, "_name_or_path");
  const cJSON *arch = cJSON_GetObjectItemCaseSensitive(c->root, "architectures");
  const cJSON *arch0 = cJSON_IsArray(arch) ? cJSON_GetArrayItem(arch, 0) : NULL;
  if (cJSON_IsString(path) && path->valuestring[0])
    hf_copy_name(spec->name, path->valuestring);
  else if (cJSON_IsString(arch0) && arch0->valuestring[0])
    hf_copy_name(spec->name, arch0->valuestring);
  else
    hf_copy_name(spec->name, c->model_type);
  hf_copy_name(spec->model_type, c->model_type);
}

static bool hf_key_known(const hf_ctx_t *c, const char *key) {
  for (int i = 0; i < c->n_used; i++)
    if (strcmp(c->used[i], key) == 0) return true;
  for (size_t i = 0; i < sizeof k_harmless / sizeof k_harmless[0]; i++)
    if (strcmp(k_harmless[i], key) == 0) return true;
  return false;
}

/* Warns about keys nobody read, suggesting the nearest read key (typos). */
static void hf_warn_unknown_keys(hf_ctx_t *c) {
  const cJSON *item;
  cJSON_ArrayForEach(item, c->root) {
    const char *key = item->string ? item->string : "";
    if (hf_key_known(c, key)) continue;
    const char *best = NULL;
    int best_d = 3;
    for (int i = 0; i < c->n_used; i++) {
      int d = xm_edit_distance(key, c->used[i]);
      if (d < best_d) best_d = d, best = c->used[i];
    }
    char place[128];
    hf_pointer(key, place, sizeof place);
    if (best)
      xm_diag_add(c->diag, XM_DIAG_WARNING, c->source, place,
                  "unknown key for model_type %s, ignored (did you mean \"%s\"?)", c->model_type,
                  best);
    else
      xm_diag_add(c->diag, XM_DIAG_WARNING, c->source, place,
                  "unknown key for model_type %s, ignored", c->model_type);
  }
}

void xm_hf_config_import(const cJSON *root, const char *source, xm_diag_t *diag, xm_spec_t *spec) {
  hf_ctx_t c = {.root = root, .source = source, .diag = diag};
  if (!xm_hf_config_detect(root) ||
      !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(root, "model_type"))) {
    xm_diag_add(diag, XM_DIAG_ERROR, source, "/model_type",
                "a Hugging Face config needs a string \"model_type\"");
    return;
  }
  c.model_type = cJSON_GetObjectItemCaseSensitive(root, "model_type")->valuestring;
  for (size_t i = 0; i < HF_NUM_FAMILIES; i++) {
    if (strcmp(c.model_type, k_families[i].model_type) != 0) continue;
    hf_import_name(&c, spec);
    k_families[i].import(&c, spec);
    if (spec->training.seq_len <= 0) spec->training.seq_len = HF_DEFAULT_SEQ_LEN;
    hf_warn_unknown_keys(&c);
    return;
  }
  xm_strbuf_t list;
  xm_strbuf_init(&list);
  for (size_t i = 0; i < HF_NUM_FAMILIES; i++)
    xm_strbuf_printf(&list, "%s%s", i ? ", " : "", k_families[i].model_type);
  xm_diag_add(diag, XM_DIAG_ERROR, source, "/model_type",
              "unsupported model_type \"%s\"; supported: %s", c.model_type, xm_strbuf_cstr(&list));
  xm_strbuf_free(&list);
}
