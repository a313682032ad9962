/* tests/unit/test_hf_arch.c — the Hugging Face architectures of specs
 * (frontend/hf_arch.h): which spec is which architecture and why the others
 * are none, the tensor names, the config.json each gets
 * (codegen/hf_config_json.c), and out/train's check of a checkpoint's
 * config.json (runtime/io/checkpoint.h, xm_rt_hf_config_check) held to the
 * HF importer (frontend/hf_config.c): for every key of every exported
 * config, deleted, changed or of the wrong type, the runtime accepts the
 * file exactly when the importer reads it into a spec that computes the
 * same model (xm_hf_spec_diff finds nothing), and names the key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "codegen/c_program.h"
#include "frontend/hf_arch.h"
#include "frontend/spec.h"
#include "runtime/io/checkpoint.h"
#include "support/strbuf.h"

/* ---- specs ------------------------------------------------------------------ */

#define TRAIN "\"training\": {\"seq_len\": 16, \"dtype\": \"fp32\"}"

static const char k_mixtral[] =
    "{\"name\": \"mix\", \"model\": {\"vocab\": 256, \"hidden\": 32, \"layers\": 2, \"heads\": 4,"
    " \"kv_heads\": 2, \"rope_theta\": 1000000, \"norm_eps\": 1e-5},"
    " \"moe\": {\"experts\": 4, \"top_k\": 2, \"expert_ffn\": 48, \"aux_alpha\": 0.02}, " TRAIN "}";
static const char k_qwen3[] =
    "{\"name\": \"q3\", \"model\": {\"vocab\": 256, \"hidden\": 32, \"layers\": 2, \"heads\": 4,"
    " \"kv_heads\": 2, \"head_dim\": 16, \"qk_norm\": \"head\", \"tied_embeddings\": true,"
    " \"dense_ffn\": 64}, \"moe\": {\"experts\": 8, \"top_k\": 2, \"expert_ffn\": 24,"
    " \"norm_topk_prob\": false, \"aux_alpha\": 0.001}, " TRAIN "}";
static const char k_qwen2[] =
    "{\"name\": \"q2\", \"model\": {\"vocab\": 256, \"hidden\": 32, \"layers\": 2, \"heads\": 4,"
    " \"attention_bias\": true}, \"moe\": {\"experts\": 4, \"top_k\": 2, \"expert_ffn\": 16,"
    " \"shared_experts\": 1, \"shared_ffn\": 32, \"shared_expert_gate\": true,"
    " \"norm_topk_prob\": false, \"aux_alpha\": 0.001}, " TRAIN "}";
static const char k_olmoe[] =
    "{\"name\": \"ol\", \"model\": {\"vocab\": 256, \"hidden\": 32, \"layers\": 2, \"heads\": 4,"
    " \"norm_eps\": 1e-5, \"qk_norm\": \"full\", \"yarn_factor\": 2, "
    " \"yarn_original_max_position\": 8, \"yarn_mscale\": 0.8, \"yarn_truncate\": false},"
    " \"moe\": {\"experts\": 8, \"top_k\": 2, \"expert_ffn\": 32, \"norm_topk_prob\": false,"
    " \"aux_alpha\": 0.01}, " TRAIN "}";
static const char k_deepseek[] =
    "{\"name\": \"ds\", \"model\": {\"vocab\": 256, \"hidden\": 48, \"layers\": 2, \"heads\": 4,"
    " \"attention\": \"mla\", \"q_lora_rank\": 24, \"kv_lora_rank\": 16, \"qk_nope_head_dim\": 8,"
    " \"qk_rope_head_dim\": 8, \"v_head_dim\": 8, \"rope_interleave\": true, \"yarn_factor\": 4,"
    " \"yarn_original_max_position\": 8, \"yarn_mscale\": 1, \"yarn_mscale_all_dim\": 1,"
    " \"first_k_dense\": 1, \"dense_ffn\": 64, \"mtp_layers\": 1},"
    " \"moe\": {\"experts\": 8, \"top_k\": 2, \"expert_ffn\": 16, \"shared_experts\": 1,"
    " \"scoring\": \"sigmoid\", \"n_group\": 4, \"topk_group\": 2, \"routed_scaling\": 2.5,"
    " \"aux_alpha\": 0.001, \"aux_free_gamma\": 0.001}, " TRAIN "}";
/* DeepSeek-V2-Lite-style q_proj (q_lora_rank null), no groups, no YaRN. */
static const char k_deepseek_q[] =
    "{\"name\": \"dsq\", \"model\": {\"vocab\": 256, \"hidden\": 32, \"layers\": 1, \"heads\": 2,"
    " \"attention\": \"mla\", \"kv_lora_rank\": 8, \"qk_nope_head_dim\": 6,"
    " \"qk_rope_head_dim\": 4, \"v_head_dim\": 8}, \"moe\": {\"experts\": 4, \"top_k\": 2,"
    " \"expert_ffn\": 16, \"scoring\": \"sigmoid\", \"aux_free_gamma\": 0.001}, " TRAIN "}";

static const struct {
  const char *text;
  xm_hf_arch_t arch;
} k_samples[] = {
    {k_mixtral, XM_HF_ARCH_MIXTRAL},      {k_qwen3, XM_HF_ARCH_QWEN3_MOE},
    {k_qwen2, XM_HF_ARCH_QWEN2_MOE},      {k_olmoe, XM_HF_ARCH_OLMOE},
    {k_deepseek, XM_HF_ARCH_DEEPSEEK_V3}, {k_deepseek_q, XM_HF_ARCH_DEEPSEEK_V3},
};
enum { NSAMPLES = sizeof k_samples / sizeof k_samples[0] };

static bool try_load(const char *text, size_t len, xm_spec_t *spec, xm_diag_t *d) {
  return xm_spec_load_text(text, len, "config.json", d, spec) == XM_OK;
}

static void load(const char *text, xm_spec_t *spec) {
  xm_diag_t d;
  xm_diag_init(&d);
  bool ok = try_load(text, strlen(text), spec, &d);
  if (!ok) xm_diag_print(&d, stderr);
  assert_true(ok);
  xm_diag_free(&d);
}

/* `text` with one replacement of `from` by `to` (which must be there). */
static char *edited(const char *text, const char *from, const char *to) {
  const char *at = strstr(text, from);
  if (!at) fail_msg("\"%s\" not in %s", from, text);
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  xm_strbuf_append(&b, text, (size_t)(at - text));
  xm_strbuf_puts(&b, to);
  xm_strbuf_puts(&b, at + strlen(from));
  return xm_strbuf_take(&b);
}

static char *config_of(const xm_spec_t *spec) {
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  assert_int_equal(xm_codegen_config_json(spec, &b), XM_OK);
  return xm_strbuf_take(&b);
}

/* ---- matching ---------------------------------------------------------------- */

static void expect_arch(const char *text, xm_hf_arch_t want, const char *why) {
  xm_spec_t s;
  load(text, &s);
  char reason[400];
  xm_hf_arch_t got = xm_hf_arch_match(&s, reason, sizeof reason);
  if (got != want || (why && !strstr(reason, why)) || (!why && reason[0]))
    fail_msg("%s: %s (%s), expected %s with \"%s\"", text, xm_hf_arch_model_type(got), reason,
             xm_hf_arch_model_type(want), why ? why : "");
  assert_int_equal(xm_hf_arch_of(&s), want);
}

static void test_match(void **state) {
  (void)state;
  for (int i = 0; i < NSAMPLES; i++)
    expect_arch(k_samples[i].text, k_samples[i].arch, NULL);
  const xm_hf_arch_t X = XM_HF_ARCH_XMOEC, MIX = XM_HF_ARCH_MIXTRAL;
  /* What no architecture has. */
  expect_arch("{\"model\": {\"vocab\": 64, \"hidden\": 16, \"layers\": 1, \"heads\": 2,"
              " \"dense_ffn\": 32}, " TRAIN "}",
              X, "a dense model (/moe/experts");
  char *t = edited(k_mixtral, "\"aux_alpha\"", "\"activation\": \"gelu\", \"aux_alpha\"");
  expect_arch(t, X, "GeLU experts (/moe/activation)");
  free(t);
  t = edited(k_mixtral, "\"aux_alpha\"", "\"capacity_factor\": 1.25, \"aux_alpha\"");
  expect_arch(t, X, "a capacity factor (/moe/capacity_factor)");
  free(t);
  /* DeepSeek-V3's features without MLA. */
  static const struct {
    const char *add, *why;
  } gqa[] = {
      {"\"scoring\": \"sigmoid\"", "sigmoid routing (/moe/scoring) without MLA"},
      {"\"routed_scaling\": 2", "/moe/routed_scaling 2 without MLA"},
      {"\"n_group\": 2, \"topk_group\": 1", "group-limited routing"},
      {"\"aux_free_gamma\": 0.001", "aux-free balancing (/moe/aux_free_gamma) with softmax"},
      {"\"norm_topk_prob\": false", "Mixtral always renormalises"},
      {"\"shared_experts\": 1", "shared experts without q/k/v biases"},
  };
  for (size_t i = 0; i < sizeof gqa / sizeof gqa[0]; i++) {
    char add[128];
    snprintf(add, sizeof add, "%s, \"aux_alpha\"", gqa[i].add);
    t = edited(k_mixtral, "\"aux_alpha\"", add);
    expect_arch(t, X, gqa[i].why);
    free(t);
  }
  t = edited(k_mixtral, "\"aux_alpha\"", "\"n_group\": 2, \"topk_group\": 2, \"aux_alpha\"");
  expect_arch(t, MIX, NULL); /* every group kept: plain top-k */
  free(t);
  t = edited(k_mixtral, "\"norm_eps\"", "\"tied_embeddings\": true, \"norm_eps\"");
  expect_arch(t, MIX, NULL);
  free(t);
  static const struct {
    const char *add, *why;
  } model[] = {
      {"\"rope_interleave\": true", "interleaved RoPE (/model/rope_interleave) without MLA"},
      {"\"first_k_dense\": 1, \"dense_ffn\": 64", "dense first layers (/model/first_k_dense)"},
      {"\"mtp_layers\": 1", "multi-token prediction (/model/mtp_layers) without MLA"},
      {"\"attention_bias\": true", "q/k/v biases (/model/attention_bias) without a shared"},
      {"\"qk_norm\": \"full\", \"head_dim\": 16", "OLMoE's head dim is hidden_size"},
      {"\"qk_norm\": \"full\", \"attention_bias\": true", "OLMoE's attention_bias would bias"},
      {"\"qk_norm\": \"head\", \"attention_bias\": true", "Qwen3-MoE's attention_bias would"},
  };
  for (size_t i = 0; i < sizeof model / sizeof model[0]; i++) {
    char add[128];
    snprintf(add, sizeof add, "%s, \"norm_eps\"", model[i].add);
    t = edited(k_mixtral, "\"norm_eps\"", add);
    expect_arch(t, X, model[i].why);
    free(t);
  }
  t = edited(k_qwen3, "\"aux_alpha\"", "\"shared_experts\": 1, \"aux_alpha\"");
  expect_arch(t, X, "shared experts (/moe/shared_experts) with qk_norm head");
  free(t);
  t = edited(k_qwen2, "\"shared_expert_gate\": true", "\"shared_expert_gate\": false");
  expect_arch(t, X, "a shared expert without its sigmoid gate (/moe/shared_expert_gate)");
  free(t);
  t = edited(k_qwen2, "\"attention_bias\"", "\"head_dim\": 16, \"attention_bias\"");
  expect_arch(t, X, "/model/head_dim 16: Qwen2-MoE's head dim");
  free(t);
  /* MLA that is not DeepSeek-V3. */
  char *u = edited(k_deepseek, "\"scoring\": \"sigmoid\", \"n_group\": 4, \"topk_group\": 2,", "");
  t = edited(u, "\"aux_free_gamma\": 0.001", "\"aux_free_gamma\": 0");
  expect_arch(t, X, "softmax routing with MLA (/moe/scoring)");
  free(t), free(u);
  t = edited(k_deepseek, "\"shared_experts\": 1,", "\"shared_experts\": 1, \"shared_ffn\": 24,");
  expect_arch(t, X, "/moe/shared_ffn 24 is not shared_experts x expert_ffn = 16");
  free(t);
  t = edited(k_deepseek, "\"shared_experts\": 1,",
             "\"shared_experts\": 1, \"shared_expert_gate\": true,");
  expect_arch(t, X, "a gated shared expert with MLA");
  free(t);
  t = edited(k_deepseek_q, "\"experts\": 4, \"top_k\": 2", "\"experts\": 1, \"top_k\": 1");
  expect_arch(t, X, "every group needs at least 2 experts");
  free(t);
}

/* The samples and the Hugging Face configs of the repository. */
static void test_files(void **state) {
  (void)state;
  static const struct {
    const char *path;
    xm_hf_arch_t arch;
    const char *why;
  } files[] = {
      {"samples/tiny.json", XM_HF_ARCH_XMOEC, "dense first layers"},
      {"samples/xmoe-small.json", XM_HF_ARCH_XMOEC, "GeLU experts"},
      {"samples/deepseek-v3-mini.json", XM_HF_ARCH_DEEPSEEK_V3, NULL},
      {"samples/hf/mixtral-8x7b.json", XM_HF_ARCH_MIXTRAL, NULL},
      {"samples/hf/deepseek-v3.json", XM_HF_ARCH_DEEPSEEK_V3, NULL},
      {"tests/data/hf/qwen3-30b-a3b.json", XM_HF_ARCH_QWEN3_MOE, NULL},
      {"tests/data/hf/qwen1.5-moe-a2.7b.json", XM_HF_ARCH_QWEN2_MOE, NULL},
      {"tests/data/hf/olmoe-1b-7b-0924.json", XM_HF_ARCH_OLMOE, NULL},
      {"tests/data/hf/deepseek-moe-16b.json", XM_HF_ARCH_XMOEC, "dense first layers"},
      {"tests/data/hf/deepseek-v2-lite.json", XM_HF_ARCH_XMOEC, "softmax routing with MLA"},
  };
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", XM_SOURCE_DIR, files[i].path);
    xm_spec_t s;
    xm_diag_t d;
    xm_diag_init(&d);
    assert_int_equal(xm_spec_load_file(path, &d, &s), XM_OK);
    xm_diag_free(&d);
    char why[400];
    xm_hf_arch_t got = xm_hf_arch_match(&s, why, sizeof why);
    if (got != files[i].arch || (files[i].why && !strstr(why, files[i].why)))
      fail_msg("%s: %s (%s)", files[i].path, xm_hf_arch_model_type(got), why);
    /* A real Hugging Face config and the one xmoec writes for it describe
     * the same model, by out/train's own check. */
    if (strstr(files[i].path, "/hf/") && got != XM_HF_ARCH_XMOEC) {
      char *mine = config_of(&s), *text = NULL;
      size_t len = 0;
      assert_int_equal(xm_read_file(path, &text, &len), 0);
      xm_diag_init(&d);
      xm_status_t st = xm_rt_hf_config_check(mine, text, len, path, &d);
      if (st) xm_diag_print(&d, stderr);
      assert_int_equal(st, XM_OK);
      xm_diag_free(&d);
      free(mine), free(text);
    }
  }
}

/* ---- names ------------------------------------------------------------------- */

static void expect_name(xm_hf_arch_t arch, const char *canonical, const char *name) {
  char buf[256];
  xm_hf_param_name(arch, canonical, buf, sizeof buf);
  assert_string_equal(buf, name);
  xm_hf_canonical_name(arch, name, buf, sizeof buf);
  assert_string_equal(buf, canonical);
}

static void test_names(void **state) {
  (void)state;
  const xm_hf_arch_t M = XM_HF_ARCH_MIXTRAL, Q2 = XM_HF_ARCH_QWEN2_MOE;
  expect_name(M, "model.layers.3.mlp.gate.weight", "model.layers.3.block_sparse_moe.gate.weight");
  expect_name(M, "model.layers.3.mlp.experts.{e}.gate_proj.weight",
              "model.layers.3.block_sparse_moe.experts.{e}.w1.weight");
  expect_name(M, "model.layers.10.mlp.experts.{e}.up_proj.weight",
              "model.layers.10.block_sparse_moe.experts.{e}.w3.weight");
  expect_name(M, "model.layers.0.mlp.experts.17.down_proj.weight",
              "model.layers.0.block_sparse_moe.experts.17.w2.weight");
  /* Only the MoE block is renamed. */
  const char *same[] = {"model.embed_tokens.weight",
                        "lm_head.weight",
                        "model.norm.weight",
                        "model.layers.1.self_attn.q_proj.weight",
                        "model.layers.1.input_layernorm.weight",
                        "model.layers.1.mlp.gate_proj.weight",
                        "model.layers.1.mlp.gate.e_score_correction_bias",
                        "model.layers.1.mlp.shared_experts.up_proj.weight",
                        "model.layers.1.mlp.shared_expert_gate.weight",
                        "model.layers.x.mlp.gate.weight",
                        "mlp.gate.weight"};
  for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
    for (int a = 0; a < XM_HF_ARCH_COUNT_; a++)
      if (!(a == Q2 && strstr(same[i], "shared_experts")))
        expect_name((xm_hf_arch_t)a, same[i], same[i]);
  }
  expect_name(Q2, "model.layers.1.mlp.shared_experts.gate_proj.weight",
              "model.layers.1.mlp.shared_expert.gate_proj.weight");
  expect_name(Q2, "model.layers.1.mlp.shared_experts.down_proj.weight",
              "model.layers.1.mlp.shared_expert.down_proj.weight");
  expect_name(Q2, "model.layers.1.mlp.shared_expert_gate.weight",
              "model.layers.1.mlp.shared_expert_gate.weight");
  assert_string_equal(xm_hf_arch_class(M), "MixtralForCausalLM");
  assert_string_equal(xm_hf_arch_class(XM_HF_ARCH_DEEPSEEK_V3), "DeepseekV3ForCausalLM");
  assert_int_equal(xm_hf_arch_from_model_type("olmoe"), XM_HF_ARCH_OLMOE);
  assert_int_equal(xm_hf_arch_from_model_type("deepseek_v2"), -1);
}

/* ---- config.json ------------------------------------------------------------- */

static const cJSON *key(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  if (!v) fail_msg("no key %s", k);
  return v;
}

static void test_config_fields(void **state) {
  (void)state;
  xm_spec_t s;
  load(k_mixtral, &s);
  char *text = config_of(&s);
  cJSON *o = cJSON_Parse(text);
  assert_string_equal(key(o, "model_type")->valuestring, "mixtral");
  assert_string_equal(cJSON_GetArrayItem(key(o, "architectures"), 0)->valuestring,
                      "MixtralForCausalLM");
  assert_int_equal(key(o, "num_local_experts")->valueint, 4);
  assert_int_equal(key(o, "intermediate_size")->valueint, 48); /* the expert width */
  assert_int_equal(key(o, "num_experts_per_tok")->valueint, 2);
  assert_true(key(o, "rope_theta")->valuedouble == 1e6);
  assert_true(key(o, "router_aux_loss_coef")->valuedouble == 0.02);
  assert_true(cJSON_IsNull(key(o, "sliding_window")));
  assert_null(cJSON_GetObjectItem(o, "n_routed_experts"));
  for (const cJSON *e = o->child; e && e->next; e = e->next) /* sorted as save_pretrained */
    assert_true(strcmp(e->string, e->next->string) < 0);
  cJSON_Delete(o), free(text);

  load(k_qwen3, &s);
  o = cJSON_Parse(text = config_of(&s));
  assert_string_equal(key(o, "model_type")->valuestring, "qwen3_moe");
  assert_int_equal(key(o, "num_experts")->valueint, 8);
  assert_int_equal(key(o, "moe_intermediate_size")->valueint, 24);
  assert_int_equal(key(o, "head_dim")->valueint, 16);
  assert_true(cJSON_IsFalse(key(o, "norm_topk_prob")));
  assert_int_equal(key(o, "decoder_sparse_step")->valueint, 1);
  assert_int_equal(cJSON_GetArraySize(key(o, "mlp_only_layers")), 0);
  assert_true(cJSON_IsFalse(key(o, "use_sliding_window")));
  assert_true(cJSON_IsTrue(key(o, "tie_word_embeddings")));
  cJSON_Delete(o), free(text);

  load(k_qwen2, &s);
  o = cJSON_Parse(text = config_of(&s));
  assert_string_equal(key(o, "model_type")->valuestring, "qwen2_moe");
  assert_int_equal(key(o, "shared_expert_intermediate_size")->valueint, 32);
  assert_null(cJSON_GetObjectItem(o, "intermediate_size")); /* no mlp_only_layers */
  cJSON_Delete(o), free(text);

  load(k_olmoe, &s);
  o = cJSON_Parse(text = config_of(&s));
  assert_string_equal(key(o, "model_type")->valuestring, "olmoe");
  assert_true(cJSON_IsNull(key(o, "clip_qkv")));
  assert_int_equal(key(o, "intermediate_size")->valueint, 32);
  const cJSON *rs = key(o, "rope_scaling");
  assert_string_equal(key(rs, "rope_type")->valuestring, "yarn");
  assert_true(key(rs, "factor")->valuedouble == 2);
  assert_true(key(rs, "mscale")->valuedouble == 0.8);
  assert_true(cJSON_IsFalse(key(rs, "truncate")));
  assert_null(cJSON_GetObjectItem(rs, "mscale_all_dim"));
  cJSON_Delete(o), free(text);

  load(k_deepseek, &s);
  o = cJSON_Parse(text = config_of(&s));
  assert_string_equal(key(o, "model_type")->valuestring, "deepseek_v3");
  assert_int_equal(key(o, "n_routed_experts")->valueint, 8);
  assert_int_equal(key(o, "n_group")->valueint, 4);
  assert_int_equal(key(o, "topk_group")->valueint, 2);
  assert_true(key(o, "routed_scaling_factor")->valuedouble == 2.5);
  assert_int_equal(key(o, "first_k_dense_replace")->valueint, 1);
  assert_int_equal(key(o, "intermediate_size")->valueint, 64);
  assert_int_equal(key(o, "num_nextn_predict_layers")->valueint, 1);
  assert_int_equal(key(o, "q_lora_rank")->valueint, 24);
  assert_int_equal(key(o, "head_dim")->valueint, 8);
  assert_string_equal(key(o, "scoring_func")->valuestring, "sigmoid");
  assert_string_equal(key(o, "topk_method")->valuestring, "noaux_tc");
  assert_true(key(o, "aux_free_bias_update_speed")->valuedouble == 0.001);
  assert_true(key(key(o, "rope_scaling"), "mscale_all_dim")->valuedouble == 1);
  cJSON_Delete(o), free(text);
  load(k_deepseek_q, &s);
  o = cJSON_Parse(text = config_of(&s));
  assert_true(cJSON_IsNull(key(o, "q_lora_rank")));
  cJSON_Delete(o), free(text);
}

/* Each exported config read back by the importer is the same model. */
static void test_round_trip(void **state) {
  (void)state;
  for (int i = 0; i < NSAMPLES; i++) {
    xm_spec_t s, back;
    load(k_samples[i].text, &s);
    char *text = config_of(&s);
    load(text, &back);
    xm_diag_t d;
    xm_diag_init(&d);
    int n = xm_hf_spec_diff(k_samples[i].arch, &s, &back, "config.json", &d);
    if (n) xm_diag_print(&d, stderr);
    assert_int_equal(n, 0);
    assert_int_equal(xm_hf_arch_of(&back), k_samples[i].arch);
    assert_string_equal(back.name, s.name);
    xm_diag_free(&d);
    free(text);
  }
}

/* ---- out/train's check against the importer ------------------------------------ */

/* One variant of `text`: key `k` (or sub-key `sub` of it) deleted
 * (value NULL) or set to `value` (JSON). */
static char *variant(const char *text, const char *k, const char *sub, const char *value) {
  cJSON *o = cJSON_Parse(text);
  cJSON *where = sub ? cJSON_GetObjectItemCaseSensitive(o, k) : o;
  const char *name = sub ? sub : k;
  if (value)
    cJSON_ReplaceItemInObjectCaseSensitive(where, name, cJSON_Parse(value));
  else
    cJSON_DeleteItemFromObjectCaseSensitive(where, name);
  char *out = cJSON_Print(o);
  cJSON_Delete(o);
  return out;
}

/* A changed value of the same type; a value of another type. */
static void changed(const cJSON *v, char *buf, size_t n, bool other_type) {
  if (other_type) {
    snprintf(buf, n, "%s", cJSON_IsString(v) ? "1" : "\"x\"");
  } else if (cJSON_IsNumber(v)) {
    double x = v->valuedouble;
    if (x == floor(x) && fabs(x) < 1e15)
      snprintf(buf, n, "%.17g", x + 1);
    else
      snprintf(buf, n, "%.17g", x * 2);
  } else if (cJSON_IsBool(v)) {
    snprintf(buf, n, "%s", cJSON_IsTrue(v) ? "false" : "true");
  } else if (cJSON_IsString(v)) {
    snprintf(buf, n, "\"bogus\"");
  } else if (cJSON_IsArray(v)) {
    snprintf(buf, n, "%s", cJSON_GetArraySize(v) ? "[]" : "[0]");
  } else if (cJSON_IsObject(v)) {
    snprintf(buf, n, "null");
  } else { /* null: a YaRN for rope_scaling, a number elsewhere */
    snprintf(buf, n, "1");
  }
}

/* The runtime against the importer on one variant; returns 1 when they
 * agree. `stricter`: out/train refuses what the importer ignores. */
static int check_variant(const char *mine, const xm_spec_t *s, xm_hf_arch_t arch, const char *text,
                         const char *k, const char *what, bool stricter) {
  xm_diag_t dr, di;
  xm_diag_init(&dr), xm_diag_init(&di);
  bool runtime_ok = xm_rt_hf_config_check(mine, text, strlen(text), "ckpt", &dr) == XM_OK;
  xm_spec_t back;
  bool importer_ok = try_load(text, strlen(text), &back, &di) && xm_hf_arch_of(&back) == arch &&
                     xm_hf_spec_diff(arch, s, &back, "ckpt", &di) == 0;
  bool agree = stricter ? !runtime_ok && importer_ok : runtime_ok == importer_ok;
  char place[160];
  snprintf(place, sizeof place, "/%s", k);
  bool named = runtime_ok;
  for (int i = 0; !named && i < dr.count; i++) {
    const char *p = dr.entries[i].place;
    named = p && (strncmp(p, place, strlen(place)) == 0 ||
                  (strstr(k, "group") && strstr(p, "group"))); /* n_group / topk_group */
  }
  if (!agree || !named) {
    fprintf(stderr, "%s, %s %s: out/train %s, importer %s%s\n", xm_hf_arch_model_type(arch), k,
            what, runtime_ok ? "accepts" : "refuses", importer_ok ? "accepts" : "refuses",
            agree ? " (key not named)" : "");
    xm_diag_print(&dr, stderr);
    xm_diag_print(&di, stderr);
  }
  xm_diag_free(&dr), xm_diag_free(&di);
  return agree && named;
}

static void test_runtime_check_is_the_importer(void **state) {
  (void)state;
  int variants = 0, bad = 0;
  for (int i = 0; i < NSAMPLES; i++) {
    xm_spec_t s;
    load(k_samples[i].text, &s);
    xm_hf_arch_t arch = k_samples[i].arch;
    char *mine = config_of(&s);
    /* The program's own config passes. */
    xm_diag_t d;
    xm_diag_init(&d);
    assert_int_equal(xm_rt_hf_config_check(mine, mine, strlen(mine), "ckpt", &d), XM_OK);
    xm_diag_free(&d);
    cJSON *o = cJSON_Parse(mine);
    for (const cJSON *e = o->child; e; e = e->next) {
      /* Mixtral's sliding_window: the importer ignores it, out/train
       * refuses a window shorter than the sequence (the attention would
       * differ) and a non-number. */
      bool window = arch == XM_HF_ARCH_MIXTRAL && strcmp(e->string, "sliding_window") == 0;
      for (int kind = 0; kind < 3; kind++) {
        char value[160];
        char *t;
        if (kind == 0) {
          t = variant(mine, e->string, NULL, NULL);
        } else {
          changed(e, value, sizeof value, kind == 2);
          if (strcmp(e->string, "rope_scaling") == 0 && cJSON_IsNull(e) && kind == 1)
            snprintf(value, sizeof value,
                     "{\"rope_type\": \"yarn\", \"factor\": 2, "
                     "\"original_max_position_embeddings\": 8}");
          t = variant(mine, e->string, NULL, value);
        }
        const char *what = kind == 0 ? "deleted" : kind == 1 ? "changed" : "of another type";
        bad += !check_variant(mine, &s, arch, t, e->string, what, window && kind != 0);
        variants++;
        free(t);
      }
      if (!cJSON_IsObject(e)) continue;
      for (const cJSON *sub = e->child; sub; sub = sub->next) { /* rope_scaling's keys */
        char k[96], value[64];
        snprintf(k, sizeof k, "%s/%s", e->string, sub->string);
        for (int kind = 0; kind < 3; kind++) {
          if (kind) changed(sub, value, sizeof value, kind == 2);
          char *t = variant(mine, e->string, sub->string, kind ? value : NULL);
          /* The place names the whole rope_scaling when the type goes. */
          bool type = strstr(sub->string, "type") != NULL;
          bad += !check_variant(mine, &s, arch, t, type ? e->string : k,
                                kind == 0   ? "deleted"
                                : kind == 1 ? "changed"
                                            : "of another type",
                                false);
          variants++;
          free(t);
        }
      }
    }
    cJSON_Delete(o);
    free(mine);
  }
  if (bad) fail_msg("%d of %d variants: out/train and the importer disagree", bad, variants);
  assert_true(variants > 400);
}

/* A checkpoint of another family, and an xmoec program's exact check. */
static void test_runtime_check_messages(void **state) {
  (void)state;
  xm_spec_t s, q;
  load(k_mixtral, &s);
  load(k_qwen3, &q);
  char *mine = config_of(&s), *theirs = config_of(&q);
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(xm_rt_hf_config_check(mine, theirs, strlen(theirs), "c/config.json", &d),
                   XM_ERR_INVALID_INPUT);
  assert_int_equal(xm_diag_error_count(&d), 1); /* the family, not every key */
  int at = xm_diag_find(&d, "/model_type");
  assert_true(at >= 0);
  assert_non_null(strstr(d.entries[at].message, "is \"qwen3_moe\" in the checkpoint, \"mixtral\""));
  xm_diag_free(&d);
  char *t = edited(mine, "\"num_experts_per_tok\":\t2", "\"num_experts_per_tok\":\t3");
  xm_diag_init(&d);
  assert_int_equal(xm_rt_hf_config_check(mine, t, strlen(t), "c/config.json", &d),
                   XM_ERR_INVALID_INPUT);
  at = xm_diag_find(&d, "/num_experts_per_tok");
  assert_true(at >= 0);
  assert_string_equal(d.entries[at].message, "is 3 in the checkpoint, 2 in the compiled program");
  assert_string_equal(d.entries[at].file, "c/config.json");
  xm_diag_free(&d);
  free(t);
  /* The same check through xm_hf_spec_diff names the same key. */
  xm_spec_t s3 = s;
  s3.moe.top_k = 3;
  xm_diag_init(&d);
  assert_int_equal(xm_hf_spec_diff(XM_HF_ARCH_MIXTRAL, &s, &s3, "c/config.json", &d), 1);
  assert_true(xm_diag_find(&d, "/num_experts_per_tok") >= 0);
  xm_diag_free(&d);
  /* An xmoec program compares every key but name and torch_dtype. */
  const char *x = "{\"model_type\": \"xmoec\", \"name\": \"a\", \"hidden_size\": 4}";
  const char *y = "{\"model_type\": \"xmoec\", \"name\": \"b\", \"hidden_size\": 4, "
                  "\"qk_norm\": \"none\"}";
  xm_diag_init(&d);
  assert_int_equal(xm_rt_hf_config_check(x, y, strlen(y), "c", &d), XM_ERR_INVALID_INPUT);
  assert_true(xm_diag_find(&d, "/qk_norm") >= 0);
  xm_diag_free(&d);
  xm_diag_init(&d);
  assert_int_equal(xm_rt_hf_config_check(x, "[", 1, "c", &d), XM_ERR_INVALID_INPUT);
  xm_diag_free(&d);
  free(mine), free(theirs);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_match),
      cmocka_unit_test(test_files),
      cmocka_unit_test(test_names),
      cmocka_unit_test(test_config_fields),
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_runtime_check_is_the_importer),
      cmocka_unit_test(test_runtime_check_messages),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
