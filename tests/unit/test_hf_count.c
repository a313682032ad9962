/* tests/unit/test_hf_count.c — Hugging Face config import and parameter /
 * FLOP counting.
 *
 * The totals asserted here are exact sums over the tensors of the public
 * checkpoints (multi-token-prediction layers excluded), so any drift in the
 * importer's mapping or in the counting formulas shows up as a mismatch in
 * the last digit. Malformed configs are built by editing a valid one, and
 * each case asserts the JSON pointer of the reported problem.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "frontend/count.h"
#include "frontend/hf_config.h"
#include "support/diag.h"
#include "support/strbuf.h"

/* Parses a repo file; the test fails if it cannot be read. */
static cJSON *load_json(const char *rel) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", XM_SOURCE_DIR, rel);
  char *text = NULL;
  size_t len = 0;
  assert_int_equal(xm_read_file(path, &text, &len), 0);
  cJSON *root = cJSON_ParseWithLength(text, len);
  free(text);
  assert_non_null(root);
  return root;
}

/* Imports `root` into a fresh spec; returns the diagnostics in `d`. */
static void import(const cJSON *root, xm_diag_t *d, xm_spec_t *spec) {
  xm_diag_init(d);
  xm_spec_set_defaults(spec);
  spec->training.seq_len = 4096;
  assert_true(xm_hf_config_detect(root));
  xm_hf_config_import(root, "test.json", d, spec);
}

/* Imports a repo file that must load without errors or warnings. */
static void import_file(const char *rel, xm_spec_t *spec, xm_count_t *count) {
  cJSON *root = load_json(rel);
  xm_diag_t d;
  import(root, &d, spec);
  if (d.count) xm_diag_print(&d, stderr);
  assert_int_equal(d.count, 0);
  xm_diag_free(&d);
  cJSON_Delete(root);
  xm_count_params(spec, count);
}

static void test_mixtral(void **state) {
  (void)state;
  xm_spec_t s;
  xm_count_t c;
  import_file("samples/hf/mixtral-8x7b.json", &s, &c);
  assert_string_equal(s.name, "mistralai/Mixtral-8x7B-v0.1");
  assert_string_equal(s.model_type, "mixtral");
  assert_int_equal(s.model.attention, XM_ATTN_GQA);
  assert_int_equal(s.model.kv_heads, 8);
  assert_int_equal(s.model.head_dim, 128);
  assert_int_equal(s.model.first_k_dense, 0);
  assert_int_equal(s.moe.expert_ffn, 14336);
  assert_true(s.moe.norm_topk_prob);
  assert_true(s.model.rope_theta == 1e6);
  assert_true(s.model.norm_eps == 1e-5);
  assert_true(s.moe.aux_alpha == 0.02);
  assert_int_equal(c.total, 46702792704LL);
  assert_int_equal(c.active, 12879925248LL);
  assert_int_equal(c.embeddings, 2LL * 32000 * 4096);
  assert_int_equal(c.final_norm, 4096);
  assert_int_equal(c.dense_layer.total, 0);
  assert_int_equal(c.moe_layer.router, 8 * 4096);
  assert_int_equal(c.moe_layer.routed_experts, 8LL * 3 * 4096 * 14336);
  assert_int_equal(c.moe_layer.attention, 2LL * 4096 * 4096 + 2LL * 4096 * 1024);
}

/* FLOPs by hand: every matrix a token meets is the active count minus the
 * input embedding table and the norm weights; attention adds QK^T and AV
 * over the causal average context (4096+1)/2 in each of the 32 layers. */
static void test_mixtral_flops(void **state) {
  (void)state;
  xm_spec_t s;
  xm_count_t c;
  import_file("samples/hf/mixtral-8x7b.json", &s, &c);
  double matmul = 12879925248.0 - 32000.0 * 4096 - 32.0 * 2 * 4096 - 4096;
  double attn = 32.0 * 2 * 32 * (128 + 128) * (4097.0 / 2);
  double want = 2 * matmul + attn;
  assert_true(fabs(c.flops_per_token_fwd - want) <= 0.01 * want);
  assert_true(c.flops_per_token_fwd == want); /* and in fact exact */
  assert_true(c.flops_per_token_fwdbwd == 3 * c.flops_per_token_fwd);
  /* A longer sequence only grows the attention term. */
  s.training.seq_len = 8191;
  xm_count_t c2;
  xm_count_params(&s, &c2);
  assert_true(c2.flops_per_token_fwd - c.flops_per_token_fwd ==
              32.0 * 2 * 32 * 256 * (4096.0 - 2048.5));
  assert_int_equal(c2.total, c.total);
}

static void test_qwen3(void **state) {
  (void)state;
  xm_spec_t s;
  xm_count_t c;
  import_file("tests/data/hf/qwen3-30b-a3b.json", &s, &c);
  assert_int_equal(s.model.qk_norm, XM_QK_NORM_HEAD);
  assert_int_equal(s.model.head_dim, 128);
  assert_int_equal(s.model.kv_heads, 4);
  assert_false(s.model.attention_bias);
  assert_int_equal(s.moe.experts, 128);
  assert_int_equal(s.moe.expert_ffn, 768);
  assert_int_equal(s.moe.shared_experts, 0);
  assert_true(s.moe.norm_topk_prob);
  assert_int_equal(c.total, 30532122624LL);
  assert_int_equal(c.active, 3353032704LL);
  assert_int_equal(c.moe_layer.attention,
                   2048LL * 4096 + 2 * 2048LL * 512 + 4096LL * 2048 + 2 * 128);
}

static void test_olmoe(void **state) {
  (void)state;
  xm_spec_t s;
  xm_count_t c;
  import_file("tests/data/hf/olmoe-1b-7b-0924.json", &s, &c);
  assert_int_equal(s.model.qk_norm, XM_QK_NORM_FULL);
  assert_int_equal(s.model.attention, XM_ATTN_MHA);
  assert_false(s.moe.norm_topk_prob);
  assert_int_equal(s.moe.expert_ffn, 1024);
  assert_int_equal(c.total, 6919161856LL);
  assert_int_equal(c.active, 1282017280LL);
}

static void test_deepseek_moe(void **state) {
  (void)state;
  xm_spec_t s;
  xm_count_t c;
  import_file("tests/data/hf/deepseek-moe-16b.json", &s, &c);
  assert_int_equal(s.model.first_k_dense, 1);
  assert_int_equal(s.model.dense_ffn, 10944);
  assert_int_equal(s.moe.shared_experts, 2);
  assert_int_equal(s.moe.shared_ffn, 2 * 1408);
  assert_int_equal(s.moe.scoring, XM_SCORING_SOFTMAX);
  assert_true(s.moe.aux_alpha == 0.001);
  assert_int_equal(c.total, 16375728128LL);
  assert_int_equal(c.active, 2828650496LL);
  assert_int_equal(c.dense_layer.dense_ffn, 3LL * 2048 * 10944);
  assert_int_equal(c.dense_layer.active, c.dense_layer.total);
  assert_int_equal(c.moe_layer.shared_experts, 3LL * 2048 * 2816);
}

static void test_deepseek_v3(void **state) {
  (void)state;
  xm_spec_t s;
  xm_count_t c;
  import_file("samples/hf/deepseek-v3.json", &s, &c);
  assert_string_equal(s.name, "deepseek-ai/DeepSeek-V3");
  assert_int_equal(s.model.attention, XM_ATTN_MLA);
  assert_int_equal(s.model.q_lora_rank, 1536);
  assert_int_equal(s.model.kv_lora_rank, 512);
  assert_int_equal(s.model.head_dim, 192);
  assert_int_equal(s.moe.scoring, XM_SCORING_SIGMOID);
  assert_int_equal(s.moe.n_group, 8);
  assert_int_equal(s.moe.topk_group, 4);
  assert_true(s.moe.routed_scaling == 2.5);
  assert_true(s.moe.aux_free_gamma > 0);
  assert_true(s.moe.norm_topk_prob);
  /* rope_scaling (YaRN) and the interleaved pairs, DeepseekV3Config's default */
  assert_true(s.model.rope_interleave);
  assert_true(s.model.yarn_factor == 40);
  assert_int_equal(s.model.yarn_original_max_position, 4096);
  assert_true(s.model.yarn_beta_fast == 32 && s.model.yarn_beta_slow == 1);
  assert_true(s.model.yarn_mscale == 1 && s.model.yarn_mscale_all_dim == 1);
  assert_true(s.model.yarn_attention_factor == 0 && s.model.yarn_truncate);
  assert_int_equal(c.total, 671026419200LL);
  assert_int_equal(c.active, 37552297472LL);
  /* num_nextn_predict_layers 1: one MoE layer + eh_proj [H, 2H] + 3 norms,
   * outside the total. */
  assert_int_equal(s.model.mtp_layers, 1);
  assert_int_equal(c.mtp_total, c.moe_layer.total + 2LL * 7168 * 7168 + 3 * 7168);
  assert_int_equal(c.mtp_total, 11610068224LL);
  assert_int_equal(c.moe_layer.router, 256LL * 7168 + 256); /* + e_score_correction_bias */
  int64_t attn = 7168LL * 1536 + 1536 + 1536LL * 128 * 192 + 7168LL * 576 + 512 +
                 512LL * 128 * 256 + 128LL * 128 * 7168;
  assert_int_equal(c.moe_layer.attention, attn);
  assert_int_equal(c.dense_layer.attention, attn);
  /* MLA FLOPs are dominated by the matrices: between 2x and 2.4x active. */
  assert_true(c.flops_per_token_fwd > 2.0 * 37.4e9 && c.flops_per_token_fwd < 2.4 * 37.6e9);
}

static void test_qwen2_moe(void **state) {
  (void)state;
  xm_spec_t s;
  xm_count_t c;
  import_file("tests/data/hf/qwen1.5-moe-a2.7b.json", &s, &c);
  assert_true(s.model.attention_bias);
  assert_true(s.moe.shared_expert_gate);
  assert_int_equal(s.moe.shared_experts, 1);
  assert_int_equal(s.moe.shared_ffn, 5632);
  assert_int_equal(c.moe_layer.shared_experts, 3LL * 2048 * 5632 + 2048);
  assert_true(fabs((double)c.total - 14.3e9) <= 0.01 * 14.3e9);
  assert_true(fabs((double)c.active - 2.7e9) <= 0.01 * 2.7e9);
}

static void test_deepseek_v2_lite(void **state) {
  (void)state;
  xm_spec_t s;
  xm_count_t c;
  import_file("tests/data/hf/deepseek-v2-lite.json", &s, &c);
  assert_int_equal(s.model.attention, XM_ATTN_MLA);
  assert_int_equal(s.model.q_lora_rank, 0);
  assert_true(s.model.rope_interleave); /* V2's complex-number RoPE: the same pairs */
  assert_int_equal(s.moe.n_group, 1);
  assert_int_equal(s.moe.scoring, XM_SCORING_SOFTMAX);
  assert_true(s.moe.aux_free_gamma == 0);
  assert_int_equal(c.moe_layer.router, 64LL * 2048); /* no bias */
  assert_true(fabs((double)c.total - 15.7e9) <= 0.01 * 15.7e9);
}

/* Tied embeddings are stored once but the LM head still costs FLOPs. */
static void test_tied_embeddings(void **state) {
  (void)state;
  cJSON *root = load_json("samples/hf/mixtral-8x7b.json");
  cJSON_ReplaceItemInObject(root, "tie_word_embeddings", cJSON_CreateTrue());
  xm_spec_t s;
  xm_diag_t d;
  import(root, &d, &s);
  assert_int_equal(xm_diag_error_count(&d), 0);
  xm_count_t c;
  xm_count_params(&s, &c);
  assert_int_equal(c.total, 46702792704LL - 32000LL * 4096);
  assert_int_equal(c.embeddings, 32000LL * 4096);
  s.model.tied_embeddings = false;
  xm_count_t c2;
  xm_count_params(&s, &c2);
  assert_true(c.flops_per_token_fwd == c2.flops_per_token_fwd);
  xm_diag_free(&d);
  cJSON_Delete(root);
}

/* ---- malformed configs ------------------------------------------------ */

typedef struct {
  const char *file;    /* valid config to start from */
  const char *key;     /* key to replace (or delete when json is NULL) */
  const char *json;    /* new value as JSON text */
  const char *pointer; /* where the error must be reported */
} bad_case_t;

static const bad_case_t k_bad[] = {
    /* MTP modules are bounded as model.mtp_layers */
    {"samples/hf/deepseek-v3.json", "num_nextn_predict_layers", "17", "/num_nextn_predict_layers"},
    /* rope_scaling: only YaRN (or "default"), its keys typed and bounded */
    {"samples/hf/deepseek-v3.json", "rope_scaling", "{\"type\": \"linear\", \"factor\": 2.0}",
     "/rope_scaling/type"},
    {"samples/hf/deepseek-v3.json", "rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8}",
     "/rope_scaling/rope_type"},
    {"samples/hf/deepseek-v3.json", "rope_scaling", "{\"factor\": 4}", "/rope_scaling/type"},
    {"samples/hf/deepseek-v3.json", "rope_scaling", "{\"type\": \"yarn\"}", "/rope_scaling/factor"},
    {"samples/hf/deepseek-v3.json", "rope_scaling", "{\"type\": \"yarn\", \"factor\": 0.5}",
     "/rope_scaling/factor"},
    {"samples/hf/deepseek-v3.json", "rope_scaling",
     "{\"type\": \"yarn\", \"factor\": 4, \"beta_fast\": \"32\"}", "/rope_scaling/beta_fast"},
    {"samples/hf/deepseek-v3.json", "rope_scaling",
     "{\"type\": \"yarn\", \"factor\": 4, \"extrapolate\": true}", "/rope_scaling/extrapolate"},
    {"samples/hf/deepseek-v3.json", "rope_scaling", "[1]", "/rope_scaling"},
    {"samples/hf/deepseek-v3.json", "rope_interleave", "1", "/rope_interleave"},
    {"samples/hf/mixtral-8x7b.json", "num_experts_per_tok", "\"two\"", "/num_experts_per_tok"},
    {"samples/hf/mixtral-8x7b.json", "num_experts_per_tok", "9", "/num_experts_per_tok"},
    {"samples/hf/mixtral-8x7b.json", "num_experts_per_tok", "0", "/num_experts_per_tok"},
    {"samples/hf/mixtral-8x7b.json", "model_type", "\"llama\"", "/model_type"},
    {"samples/hf/mixtral-8x7b.json", "hidden_size", NULL, "/hidden_size"},
    {"samples/hf/mixtral-8x7b.json", "hidden_size", "4096.5", "/hidden_size"},
    {"samples/hf/mixtral-8x7b.json", "hidden_size", "null", "/hidden_size"},
    {"samples/hf/mixtral-8x7b.json", "vocab_size", "-3", "/vocab_size"},
    {"samples/hf/mixtral-8x7b.json", "vocab_size", "1e300", "/vocab_size"},
    {"samples/hf/mixtral-8x7b.json", "hidden_size", "1048576", "/hidden_size"},
    {"samples/hf/mixtral-8x7b.json", "rms_norm_eps", "0.5", "/rms_norm_eps"},
    {"samples/hf/mixtral-8x7b.json", "num_local_experts", "100000", "/num_local_experts"},
    {"samples/hf/mixtral-8x7b.json", "head_dim", "127", "/head_dim"},
    {"samples/hf/mixtral-8x7b.json", "hidden_size", "131072", "/hidden_size"}, /* head 4096 */
    {"samples/hf/deepseek-v3.json", "qk_rope_head_dim", "63", "/qk_rope_head_dim"},
    {"samples/hf/mixtral-8x7b.json", "num_key_value_heads", "5", "/num_key_value_heads"},
    {"samples/hf/mixtral-8x7b.json", "hidden_act", "\"gelu\"", "/hidden_act"},
    {"samples/hf/mixtral-8x7b.json", "tie_word_embeddings", "\"no\"", "/tie_word_embeddings"},
    {"samples/hf/mixtral-8x7b.json", "rms_norm_eps", "0", "/rms_norm_eps"},
    {"samples/hf/mixtral-8x7b.json", "rope_theta", "[1]", "/rope_theta"},
    {"samples/hf/mixtral-8x7b.json", "num_local_experts", NULL, "/num_local_experts"},
    {"tests/data/hf/deepseek-moe-16b.json", "moe_layer_freq", "2", "/moe_layer_freq"},
    {"tests/data/hf/deepseek-moe-16b.json", "scoring_func", "\"sigmoid\"", "/scoring_func"},
    {"tests/data/hf/deepseek-moe-16b.json", "first_k_dense_replace", "100",
     "/first_k_dense_replace"},
    {"tests/data/hf/deepseek-moe-16b.json", "attention_bias", "true", "/attention_bias"},
    {"tests/data/hf/qwen3-30b-a3b.json", "mlp_only_layers", "[0, 1]", "/mlp_only_layers"},
    {"tests/data/hf/qwen3-30b-a3b.json", "mlp_only_layers", "7", "/mlp_only_layers"},
    {"tests/data/hf/qwen3-30b-a3b.json", "decoder_sparse_step", "2", "/decoder_sparse_step"},
    {"tests/data/hf/qwen3-30b-a3b.json", "use_sliding_window", "true", "/use_sliding_window"},
    {"tests/data/hf/olmoe-1b-7b-0924.json", "clip_qkv", "8.0", "/clip_qkv"},
    {"samples/hf/deepseek-v3.json", "topk_method", "\"best\"", "/topk_method"},
    {"samples/hf/deepseek-v3.json", "n_group", "7", "/n_group"},
    {"samples/hf/deepseek-v3.json", "topk_group", "9", "/topk_group"},
    {"samples/hf/deepseek-v3.json", "scoring_func", "\"softmax\"", "/topk_method"},
    {"samples/hf/deepseek-v3.json", "kv_lora_rank", NULL, "/kv_lora_rank"},
    {"samples/hf/deepseek-v3.json", "routed_scaling_factor", "-1", "/routed_scaling_factor"},
    {"tests/data/hf/deepseek-v2-lite.json", "q_lora_rank", "\"none\"", "/q_lora_rank"},
};

static void test_malformed(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
    const bad_case_t *b = &k_bad[i];
    cJSON *root = load_json(b->file);
    if (b->json) {
      cJSON *v = cJSON_Parse(b->json);
      assert_non_null(v);
      if (cJSON_HasObjectItem(root, b->key))
        cJSON_ReplaceItemInObjectCaseSensitive(root, b->key, v);
      else
        cJSON_AddItemToObject(root, b->key, v);
    } else {
      cJSON_DeleteItemFromObjectCaseSensitive(root, b->key);
    }
    xm_spec_t s;
    xm_diag_t d;
    xm_diag_init(&d);
    xm_spec_set_defaults(&s);
    xm_hf_config_import(root, "bad.json", &d, &s);
    int at = xm_diag_find(&d, b->pointer);
    if (at < 0 || d.entries[at].level != XM_DIAG_ERROR) {
      fprintf(stderr, "case %zu (%s = %s): no error at %s; got:\n", i, b->key,
              b->json ? b->json : "<deleted>", b->pointer);
      xm_diag_print(&d, stderr);
      fail();
    }
    assert_string_equal(d.entries[at].file, "bad.json");
    xm_diag_free(&d);
    cJSON_Delete(root);
  }
}

/* The unsupported model_type message lists every supported one. */
static void test_not_an_hf_config(void **state) {
  (void)state;
  cJSON *root = cJSON_Parse("{\"model_type\": \"llama\", \"hidden_size\": 8}");
  xm_spec_t s;
  xm_diag_t d;
  xm_diag_init(&d);
  xm_spec_set_defaults(&s);
  xm_hf_config_import(root, "x.json", &d, &s);
  assert_int_equal(xm_diag_error_count(&d), 1);
  assert_non_null(strstr(d.entries[0].message, "mixtral, qwen2_moe, qwen3_moe, olmoe, "
                                               "deepseek, deepseek_v2, deepseek_v3"));
  cJSON_Delete(root);
  xm_diag_free(&d);
  /* A non-string model_type is still an HF config, reported at /model_type. */
  root = cJSON_Parse("{\"model_type\": 3}");
  assert_true(xm_hf_config_detect(root));
  xm_diag_init(&d);
  xm_hf_config_import(root, "x.json", &d, &s);
  assert_int_equal(xm_diag_error_count(&d), 1);
  assert_string_equal(d.entries[0].place, "/model_type");
  xm_diag_free(&d);
  cJSON_Delete(root);
  root = cJSON_Parse("[1]");
  assert_false(xm_hf_config_detect(root));
  cJSON_Delete(root);
}

/* Unknown keys are warnings with their (escaped) pointer and a suggestion;
 * a key that belongs to another family is unknown too. */
static void test_unknown_key_warns(void **state) {
  (void)state;
  cJSON *root = load_json("samples/hf/mixtral-8x7b.json");
  cJSON_AddNumberToObject(root, "num_expert_per_tok", 4);
  cJSON_AddNumberToObject(root, "a/b~c", 1);
  cJSON_AddNumberToObject(root, "n_shared_experts", 1);
  xm_spec_t s;
  xm_diag_t d;
  import(root, &d, &s);
  assert_int_equal(xm_diag_error_count(&d), 0);
  assert_int_equal(d.count, 3);
  int at = xm_diag_find(&d, "/num_expert_per_tok");
  assert_true(at >= 0);
  assert_int_equal(d.entries[at].level, XM_DIAG_WARNING);
  assert_non_null(strstr(d.entries[at].message, "did you mean \"num_experts_per_tok\""));
  assert_true(xm_diag_find(&d, "/a~1b~0c") >= 0);
  assert_true(xm_diag_find(&d, "/n_shared_experts") >= 0);
  assert_int_equal(s.moe.top_k, 2); /* the typo did not change anything */
  assert_int_equal(s.moe.shared_experts, 0);
  xm_diag_free(&d);
  cJSON_Delete(root);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mixtral),
      cmocka_unit_test(test_mixtral_flops),
      cmocka_unit_test(test_qwen3),
      cmocka_unit_test(test_olmoe),
      cmocka_unit_test(test_deepseek_moe),
      cmocka_unit_test(test_deepseek_v3),
      cmocka_unit_test(test_qwen2_moe),
      cmocka_unit_test(test_deepseek_v2_lite),
      cmocka_unit_test(test_tied_embeddings),
      cmocka_unit_test(test_malformed),
      cmocka_unit_test(test_unknown_key_warns),
      cmocka_unit_test(test_not_an_hf_config),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
