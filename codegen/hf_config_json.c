/* codegen/hf_config_json.c — the Hugging Face style config.json of a model.
 *
 * Checkpoints carry a config.json with the DeepSeek-V3 field names
 * (docs/design.md, Interfaces) so that tools other than xmoec can read the architecture
 * without knowing our spec format. The model_type is "xmoec" (not
 * "deepseek_v3": the family differs in details such as GQA instead of MLA
 * and the optional GeLU experts, and claiming the DeepSeek type would make
 * transformers build the wrong model); the extras below say what DeepSeek's
 * names cannot (qk-norm, attention bias, capacity, aux-free balancing,
 * expert activation). Keys are inserted in a fixed order and cJSON prints
 * them in insertion order, so the text is deterministic.
 */
#include <cjson/cJSON.h>
#include <stdlib.h>

#include "codegen/c_program.h"

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

xm_status_t xm_codegen_config_json(const xm_spec_t *spec, xm_strbuf_t *out) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return XM_ERR_NO_MEMORY;
  add_model_fields(o, spec);
  add_moe_fields(o, spec);
  char *text = cJSON_Print(o);
  cJSON_Delete(o);
  if (!text) return XM_ERR_NO_MEMORY;
  xm_strbuf_puts(out, text);
  xm_strbuf_puts(out, "\n");
  cJSON_free(text);
  return XM_OK;
}
