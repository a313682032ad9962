/* codegen/hf_config_json.c — the Hugging Face config.json of a model.
 *
 * A spec that matches a Hugging Face architecture (frontend/hf_arch.h)
 * gets that architecture's config.json: its model_type and architectures,
 * and the keys its transformers config class saves, with the values that
 * class expects (Mixtral's num_local_experts and intermediate_size = the
 * expert width, Qwen-MoE's decoder_sparse_step and mlp_only_layers,
 * OLMoE's clip_qkv null, DeepSeek-V3's n_group, topk_group and
 * num_nextn_predict_layers, ...), sorted by key as save_pretrained sorts
 * them. Keys that state what xmoec does not do say so (sliding_window
 * null, attention_dropout 0); keys that are not the model's (token ids)
 * are left out, transformers fills its defaults. A few DeepSeek-V3 keys
 * are not transformers': topk_method, scoring_func, moe_layer_freq and
 * aux_loss_alpha are DeepSeek's own config.json keys (its remote code reads
 * them), and aux_free_bias_update_speed records xmoec's aux-free speed,
 * which Hugging Face configs do not carry.
 *
 * Every other spec keeps model_type "xmoec" with the DeepSeek-V3 field
 * names (docs/design.md, Interfaces): the family differs in details such as
 * GQA instead of MLA and the optional GeLU experts, and claiming a
 * transformers type would make transformers build the wrong model; the
 * extras say what DeepSeek's names cannot (qk-norm, attention bias,
 * capacity, aux-free balancing, expert activation). Keys are inserted in a
 * fixed order and cJSON prints them in insertion order, so the text is
 * deterministic either way.
 */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/c_program.h"
#include "frontend/hf_arch.h"

static const char *qk_norm_name(xm_qk_norm_t q) {
  switch (q) {
  case XM_QK_NORM_HEAD: return "head";
  case XM_QK_NORM_FULL: return "full";
  default: return "none";
  }
}

/* HF names the activation of the FFNs; "silu" means SwiGLU there. */
static const char *hidden_act(xm_activation_t a) {
  return a == XM_ACT_GELU ? "gelu_pytorch_tanh" : "silu";
}

static void add_int(cJSON *o, const char *key, int64_t v) {
  cJSON_AddItemToObject(o, key, cJSON_CreateNumber((double)v));
}

static void add_model_fields(cJSON *o, const xm_spec_t *s) {
  const xm_model_spec_t *m = &s->model;
  cJSON *arch = cJSON_AddArrayToObject(o, "architectures");
  cJSON_AddItemToArray(arch, cJSON_CreateString("XmoecForCausalLM"));
  cJSON_AddStringToObject(o, "model_type", "xmoec");
  cJSON_AddStringToObject(o, "name", s->name);
  add_int(o, "vocab_size", m->vocab);
  add_int(o, "hidden_size", m->hidden);
  add_int(o, "num_hidden_layers", m->layers);
  add_int(o, "num_attention_heads", m->heads);
  add_int(o, "num_key_value_heads", m->kv_heads);
  add_int(o, "head_dim", m->head_dim);
  add_int(o, "intermediate_size", m->dense_ffn);
  add_int(o, "first_k_dense_replace", m->first_k_dense);
  cJSON_AddNumberToObject(o, "rope_theta", m->rope_theta);
  cJSON_AddNumberToObject(o, "rms_norm_eps", m->norm_eps);
  cJSON_AddBoolToObject(o, "tie_word_embeddings", m->tied_embeddings);
  cJSON_AddBoolToObject(o, "attention_bias", m->attention_bias);
  cJSON_AddStringToObject(o, "qk_norm", qk_norm_name(m->qk_norm));
  add_int(o, "max_position_embeddings", s->training.seq_len);
  if (m->attention == XM_ATTN_MLA) { /* DeepSeek-V3's names; q_lora_rank null = q_proj */
    if (m->q_lora_rank > 0)
      add_int(o, "q_lora_rank", m->q_lora_rank);
    else
      cJSON_AddNullToObject(o, "q_lora_rank");
    add_int(o, "kv_lora_rank", m->kv_lora_rank);
    add_int(o, "qk_nope_head_dim", m->qk_nope_head_dim);
    add_int(o, "qk_rope_head_dim", m->qk_rope_head_dim);
    add_int(o, "v_head_dim", m->v_head_dim);
  }
  cJSON_AddBoolToObject(o, "rope_interleave", m->rope_interleave);
  if (m->yarn_factor > 1) { /* transformers' rope_scaling of type yarn; 0 = absent */
    cJSON *rs = cJSON_AddObjectToObject(o, "rope_scaling");
    cJSON_AddStringToObject(rs, "type", "yarn");
    cJSON_AddNumberToObject(rs, "factor", m->yarn_factor);
    add_int(rs, "original_max_position_embeddings", m->yarn_original_max_position);
    cJSON_AddNumberToObject(rs, "beta_fast", m->yarn_beta_fast);
    cJSON_AddNumberToObject(rs, "beta_slow", m->yarn_beta_slow);
    if (m->yarn_mscale > 0) cJSON_AddNumberToObject(rs, "mscale", m->yarn_mscale);
    if (m->yarn_mscale_all_dim > 0)
      cJSON_AddNumberToObject(rs, "mscale_all_dim", m->yarn_mscale_all_dim);
    if (m->yarn_attention_factor > 0)
      cJSON_AddNumberToObject(rs, "attention_factor", m->yarn_attention_factor);
    cJSON_AddBoolToObject(rs, "truncate", m->yarn_truncate);
  } else {
    cJSON_AddNullToObject(o, "rope_scaling");
  }
}

static void add_moe_fields(cJSON *o, const xm_spec_t *s) {
  const xm_moe_spec_t *e = &s->moe;
  add_int(o, "n_routed_experts", e->experts);
  add_int(o, "n_shared_experts", e->shared_experts);
  add_int(o, "moe_intermediate_size", e->expert_ffn);
  add_int(o, "shared_expert_intermediate_size", e->shared_experts > 0 ? e->shared_ffn : 0);
  add_int(o, "num_experts_per_tok", e->top_k);
  cJSON_AddStringToObject(o, "scoring_func", xm_scoring_name(e->scoring));
  cJSON_AddBoolToObject(o, "norm_topk_prob", e->norm_topk_prob);
  cJSON_AddNumberToObject(o, "routed_scaling_factor", e->routed_scaling);
  add_int(o, "n_group", e->n_group);
  add_int(o, "topk_group", e->topk_group);
  cJSON_AddStringToObject(o, "hidden_act", hidden_act(e->activation));
  cJSON_AddNumberToObject(o, "aux_loss_alpha", e->aux_alpha);
  cJSON_AddNumberToObject(o, "aux_free_bias_update_speed", e->aux_free_gamma);
  if (e->has_capacity)
    cJSON_AddNumberToObject(o, "capacity_factor", e->capacity_factor);
  else
    cJSON_AddNullToObject(o, "capacity_factor");
  cJSON_AddStringToObject(o, "torch_dtype", "float32");
}

/* ---- Hugging Face architectures ------------------------------------------ */

/* rope_scaling as transformers reads it: null, or YaRN with the keys of
 * _compute_yarn_parameters (truncate only when it is not the default). */
static void add_rope_scaling(cJSON *o, const xm_model_spec_t *m) {
  if (m->yarn_factor <= 1) {
    cJSON_AddNullToObject(o, "rope_scaling");
    return;
  }
  cJSON *rs = cJSON_AddObjectToObject(o, "rope_scaling");
  cJSON_AddStringToObject(rs, "rope_type", "yarn");
  cJSON_AddNumberToObject(rs, "factor", m->yarn_factor);
  add_int(rs, "original_max_position_embeddings", m->yarn_original_max_position);
  cJSON_AddNumberToObject(rs, "beta_fast", m->yarn_beta_fast);
  cJSON_AddNumberToObject(rs, "beta_slow", m->yarn_beta_slow);
  if (m->yarn_mscale > 0) cJSON_AddNumberToObject(rs, "mscale", m->yarn_mscale);
  if (m->yarn_mscale_all_dim > 0)
    cJSON_AddNumberToObject(rs, "mscale_all_dim", m->yarn_mscale_all_dim);
  if (m->yarn_attention_factor > 0)
    cJSON_AddNumberToObject(rs, "attention_factor", m->yarn_attention_factor);
  if (!m->yarn_truncate) cJSON_AddFalseToObject(rs, "truncate");
}

/* What every family's config class has: sizes, norms, RoPE, the head. */
static void add_hf_common(cJSON *o, const xm_spec_t *s, xm_hf_arch_t arch) {
  const xm_model_spec_t *m = &s->model;
  cJSON *classes = cJSON_AddArrayToObject(o, "architectures");
  cJSON_AddItemToArray(classes, cJSON_CreateString(xm_hf_arch_class(arch)));
  cJSON_AddStringToObject(o, "model_type", xm_hf_arch_model_type(arch));
  cJSON_AddStringToObject(o, "_name_or_path", s->name);
  add_int(o, "vocab_size", m->vocab);
  add_int(o, "hidden_size", m->hidden);
  add_int(o, "num_hidden_layers", m->layers);
  add_int(o, "num_attention_heads", m->heads);
  add_int(o, "num_key_value_heads", m->kv_heads);
  cJSON_AddNumberToObject(o, "rope_theta", m->rope_theta);
  add_rope_scaling(o, m);
  cJSON_AddNumberToObject(o, "rms_norm_eps", m->norm_eps);
  cJSON_AddBoolToObject(o, "tie_word_embeddings", m->tied_embeddings);
  cJSON_AddStringToObject(o, "hidden_act", "silu");
  /* The context xmoec trains at; the source config's value is not kept. */
  add_int(o, "max_position_embeddings", s->training.seq_len);
  /* xmoec draws weights from N(0, 0.02) (output projections scaled down). */
  cJSON_AddNumberToObject(o, "initializer_range", 0.02);
  cJSON_AddNumberToObject(o, "attention_dropout", 0.0);
  cJSON_AddBoolToObject(o, "use_cache", true);
  add_int(o, "num_experts_per_tok", s->moe.top_k);
  cJSON_AddStringToObject(o, "torch_dtype", "float32"); /* the checkpoint's f32 weights */
}

/* Mixtral-style routers: softmax top-k, the Switch aux loss of weight
 * router_aux_loss_coef. */
static void add_router_loss(cJSON *o, const xm_spec_t *s) {
  cJSON_AddBoolToObject(o, "output_router_logits", false);
  cJSON_AddNumberToObject(o, "router_aux_loss_coef", s->moe.aux_alpha);
}

static void add_mixtral(cJSON *o, const xm_spec_t *s) {
  add_int(o, "head_dim", s->model.head_dim);
  add_int(o, "num_local_experts", s->moe.experts);
  add_int(o, "intermediate_size", s->moe.expert_ffn); /* Mixtral's is the expert width */
  cJSON_AddNullToObject(o, "sliding_window");
  cJSON_AddNumberToObject(o, "router_jitter_noise", 0.0);
  add_router_loss(o, s);
}

/* Qwen2-MoE and Qwen3-MoE: every layer MoE (decoder_sparse_step 1) but the
 * mlp_only_layers, dense layers of intermediate_size; no sliding window. */
static void add_qwen(cJSON *o, const xm_spec_t *s, bool qwen3) {
  const xm_model_spec_t *m = &s->model;
  const xm_moe_spec_t *e = &s->moe;
  if (qwen3) {
    add_int(o, "head_dim", m->head_dim);
    cJSON_AddBoolToObject(o, "attention_bias", false);
  } else {
    add_int(o, "shared_expert_intermediate_size", e->shared_ffn);
  }
  add_int(o, "num_experts", e->experts);
  add_int(o, "moe_intermediate_size", e->expert_ffn);
  cJSON_AddBoolToObject(o, "norm_topk_prob", e->norm_topk_prob);
  add_int(o, "decoder_sparse_step", 1);
  cJSON *dense = cJSON_AddArrayToObject(o, "mlp_only_layers");
  for (int64_t i = 0; i < m->first_k_dense; i++)
    cJSON_AddItemToArray(dense, cJSON_CreateNumber((double)i));
  /* The width of the mlp_only_layers; without them the class default
   * stands (unused). */
  if (m->dense_ffn > 0) add_int(o, "intermediate_size", m->dense_ffn);
  cJSON_AddBoolToObject(o, "use_sliding_window", false);
  cJSON_AddNullToObject(o, "sliding_window");
  add_router_loss(o, s);
}

static void add_olmoe(cJSON *o, const xm_spec_t *s) {
  add_int(o, "num_experts", s->moe.experts);
  add_int(o, "intermediate_size", s->moe.expert_ffn); /* OLMoE's is the expert width */
  cJSON_AddBoolToObject(o, "norm_topk_prob", s->moe.norm_topk_prob);
  cJSON_AddBoolToObject(o, "attention_bias", false);
  cJSON_AddNullToObject(o, "clip_qkv");
  add_router_loss(o, s);
}

static void add_deepseek_v3(cJSON *o, const xm_spec_t *s) {
  const xm_model_spec_t *m = &s->model;
  const xm_moe_spec_t *e = &s->moe;
  if (m->q_lora_rank > 0)
    add_int(o, "q_lora_rank", m->q_lora_rank);
  else
    cJSON_AddNullToObject(o, "q_lora_rank");
  add_int(o, "kv_lora_rank", m->kv_lora_rank);
  add_int(o, "qk_nope_head_dim", m->qk_nope_head_dim);
  add_int(o, "qk_rope_head_dim", m->qk_rope_head_dim);
  add_int(o, "v_head_dim", m->v_head_dim);
  /* DeepseekV3Config derives and saves these two. */
  add_int(o, "head_dim", m->qk_rope_head_dim);
  add_int(o, "qk_head_dim", m->qk_nope_head_dim + m->qk_rope_head_dim);
  add_int(o, "pretraining_tp", 1);
  cJSON_AddBoolToObject(o, "rope_interleave", m->rope_interleave);
  cJSON_AddBoolToObject(o, "attention_bias", false);
  add_int(o, "first_k_dense_replace", m->first_k_dense);
  /* Required by the class; without dense layers it is unused and the
   * expert width stands in. */
  add_int(o, "intermediate_size", m->dense_ffn > 0 ? m->dense_ffn : e->expert_ffn);
  add_int(o, "n_routed_experts", e->experts);
  add_int(o, "n_shared_experts", e->shared_experts);
  add_int(o, "moe_intermediate_size", e->expert_ffn);
  cJSON_AddBoolToObject(o, "norm_topk_prob", e->norm_topk_prob);
  cJSON_AddNumberToObject(o, "routed_scaling_factor", e->routed_scaling);
  add_int(o, "n_group", e->n_group);
  add_int(o, "topk_group", e->topk_group);
  add_int(o, "num_nextn_predict_layers", m->mtp_layers);
  /* DeepSeek's own keys (its remote code reads them; transformers keeps
   * them as attributes), and xmoec's aux-free speed. */
  cJSON_AddStringToObject(o, "scoring_func", "sigmoid");
  cJSON_AddStringToObject(o, "topk_method", "noaux_tc");
  add_int(o, "moe_layer_freq", 1);
  cJSON_AddNumberToObject(o, "aux_loss_alpha", e->aux_alpha);
  cJSON_AddNumberToObject(o, "aux_free_bias_update_speed", e->aux_free_gamma);
}

/* save_pretrained writes the keys sorted (json.dumps(sort_keys=True)). */
static void sort_keys(cJSON *o) {
  cJSON *sorted = NULL;
  while (o->child) {
    cJSON *it = o->child;
    o->child = it->next;
    it->next = it->prev = NULL;
    cJSON **at = &sorted;
    while (*at && strcmp((*at)->string, it->string) <= 0)
      at = &(*at)->next;
    it->next = *at;
    *at = it;
  }
  /* cJSON's list: prev of the first item is the last one. */
  cJSON *last = NULL;
  for (cJSON *it = sorted; it; it = it->next) {
    it->prev = last;
    last = it;
  }
  if (sorted) sorted->prev = last;
  o->child = sorted;
}

static void add_hf_fields(cJSON *o, const xm_spec_t *s, xm_hf_arch_t arch) {
  add_hf_common(o, s, arch);
  switch (arch) {
  case XM_HF_ARCH_MIXTRAL: add_mixtral(o, s); break;
  case XM_HF_ARCH_QWEN2_MOE: add_qwen(o, s, false); break;
  case XM_HF_ARCH_QWEN3_MOE: add_qwen(o, s, true); break;
  case XM_HF_ARCH_OLMOE: add_olmoe(o, s); break;
  case XM_HF_ARCH_DEEPSEEK_V3: add_deepseek_v3(o, s); break;
  default: XM_ASSERT(!"not a Hugging Face architecture");
  }
  sort_keys(o);
}

xm_status_t xm_codegen_config_json(const xm_spec_t *spec, xm_strbuf_t *out) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return XM_ERR_NO_MEMORY;
  xm_hf_arch_t arch = xm_hf_arch_of(spec);
  if (arch == XM_HF_ARCH_XMOEC) {
    add_model_fields(o, spec);
    add_moe_fields(o, spec);
  } else {
    add_hf_fields(o, spec, arch);
  }
  char *text = cJSON_Print(o);
  cJSON_Delete(o);
  if (!text) return XM_ERR_NO_MEMORY;
  xm_strbuf_puts(out, text);
  xm_strbuf_puts(out, "\n");
  cJSON_free(text);
  return XM_OK;
}
