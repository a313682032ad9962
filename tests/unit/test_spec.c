/* tests/unit/test_spec.c — malformed model specs: every check of
 * frontend/spec.c and frontend/spec_fields.c must fail with
 * XM_ERR_INVALID_INPUT and name the JSON pointer of the field at fault.
 * Valid specs, samples and defaults are in test_spec_valid.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "frontend/spec.h"

/* Fragments of a valid spec: cases replace one of them. */
#define MODEL "\"model\":{\"vocab\":256,\"hidden\":128,\"layers\":2,\"heads\":4,\"dense_ffn\":256}"
#define TRAIN "\"training\":{\"seq_len\":16}"
#define MOE "\"moe\":{\"experts\":8,\"top_k\":2,\"expert_ffn\":64}"
#define M(...)                                                                                     \
  "\"model\":{\"vocab\":256,\"hidden\":128,\"layers\":2,\"heads\":4,\"dense_ffn\":"                \
  "256," __VA_ARGS__ "}"
#define E(...) "\"moe\":{\"experts\":8,\"top_k\":2,\"expert_ffn\":64," __VA_ARGS__ "}"
#define T(...) "\"training\":{\"seq_len\":16," __VA_ARGS__ "}"
#define P(...) "\"parallel\":{" __VA_ARGS__ "}"
#define CL(...)                                                                                    \
  "\"cluster\":{\"nodes\":1,\"ranks_per_node\":4,\"device_memory_gib\":64,"                        \
  "\"peak_tflops\":100" __VA_ARGS__ "}"

typedef struct {
  const char *json;
  const char *pointer; /* must appear among the diagnostics */
  const char *text;    /* must appear in that diagnostic's message */
} bad_case_t;

static const bad_case_t kBad[] = {
    /* Types, integers and ranges. */
    {"{\"model\":{\"vocab\":256,\"hidden\":128,\"layers\":2.5,\"heads\":4,\"dense_ffn\":8}," TRAIN
     "}",
     "/model/layers", "must be an integer"},
    {"{\"model\":{\"vocab\":256,\"hidden\":128,\"layers\":1e30,\"heads\":4,\"dense_ffn\":8}," TRAIN
     "}",
     "/model/layers", "out of range [1, 1024]"},
    {"{\"model\":{\"vocab\":256,\"hidden\":\"128\",\"layers\":2,\"heads\":4,\"dense_ffn\":8}," TRAIN
     "}",
     "/model/hidden", "got a string; write the number without quotes"},
    {"{\"model\":{\"vocab\":256,\"hidden\":128,\"layers\":true,\"heads\":4,\"dense_ffn\":8}," TRAIN
     "}",
     "/model/layers", "got a boolean"},
    {"{\"model\":{\"vocab\":0,\"hidden\":128,\"layers\":2,\"heads\":4,\"dense_ffn\":8}," TRAIN "}",
     "/model/vocab", "out of range"},
    {"{\"model\":{\"vocab\":16777217,\"hidden\":128,\"layers\":2,\"heads\":4,\"dense_ffn\":8}"
     "," TRAIN "}",
     "/model/vocab", "out of range [1, 16777216]"},
    {"{\"model\":{\"vocab\":256,\"hidden\":128,\"layers\":2,\"heads\":-4,\"dense_ffn\":8}," TRAIN
     "}",
     "/model/heads", "-4"},
    {"{\"model\":{\"vocab\":256,\"hidden\":262144,\"layers\":2,\"heads\":4,\"dense_ffn\":8}," TRAIN
     "}",
     "/model/hidden", "out of range [1, 131072]"},
    {"{" M("\"rope_theta\":0") "," TRAIN "}", "/model/rope_theta", "(0, 1000000000]"},
    {"{" M("\"norm_eps\":-1") "," TRAIN "}", "/model/norm_eps", "out of range"},
    {"{" M("\"tied_embeddings\":\"yes\"") "," TRAIN "}", "/model/tied_embeddings",
     "expected true or false"},
    {"{" M("\"attention\":\"foo\"") "," TRAIN "}", "/model/attention",
     "unknown value \"foo\"; expected one of \"mha\", \"gqa\", \"mla\""},
    {"{" M("\"qk_norm\":\"rms\"") "," TRAIN "}", "/model/qk_norm", "\"none\", \"head\", \"full\""},
    /* Missing things and document shape. */
    {"{\"model\":{\"hidden\":128,\"layers\":2,\"heads\":4,\"dense_ffn\":8}," TRAIN "}",
     "/model/vocab", "missing required field \"vocab\""},
    {"{" MODEL ",\"training\":{\"micro_batch\":2}}", "/training/seq_len", "missing required"},
    {"{" TRAIN "}", "/model", "missing required section \"model\""},
    {"{" MODEL "}", "/training", "missing required section"},
    {"{\"model\":[1,2]," TRAIN "}", "/model", "must be an object"},
    {"{" MODEL "," TRAIN ",\"moe\":{\"experts\":8,\"top_k\":2}}", "/moe/expert_ffn",
     "missing required field"},
    {"{" MODEL "," TRAIN ",\"name\":\""
     "0123456789012345678901234567890123456789"
     "0123456789012345678901234\"}",
     "/name", "too long"},
    {"{" MODEL "," TRAIN ",\"name\":7}", "/name", "expected a string"},
    {"{\"model\":{\"vocab\":256,\"hidden\":128,\"hidden\":64,\"layers\":2,\"heads\":4,\"dense_"
     "ffn\":8}," TRAIN "}",
     "/model/hidden", "duplicate key"},
    /* Unknown keys. */
    {"{" M("\"hiden\":64") "," TRAIN "}", "/model/hiden", "did you mean \"hidden\"?"},
    {"{" MODEL "," TRAIN "," E("\"topk\":2") "}", "/moe/topk",
     "unknown key \"topk\"; did you mean \"top_k\"?"},
    {"{" MODEL ",\"trainig\":{\"seq_len\":16}}", "/trainig", "did you mean \"training\"?"},
    {"{" M("\"top_k\":2") "," TRAIN "}", "/model/top_k", "belongs in the \"moe\" section"},
    {"{" M("\"a/b~c\":1") "," TRAIN "}", "/model/a~1b~0c", "unknown key \"a/b~c\""},
    /* Attention. */
    {"{\"model\":{\"vocab\":256,\"hidden\":128,\"layers\":2,\"heads\":8,\"kv_heads\":3,"
     "\"dense_ffn\":8}," TRAIN "}",
     "/model/kv_heads", "multiple of kv_heads"},
    {"{" M("\"kv_heads\":8") "," TRAIN "}", "/model/kv_heads", "must not exceed heads"},
    {"{" M("\"kv_heads\":2,\"attention\":\"mha\"") "," TRAIN "}", "/model/attention",
     "use \"gqa\""},
    {"{\"model\":{\"vocab\":256,\"hidden\":128,\"layers\":2,\"heads\":1024,\"head_dim\":2048,"
     "\"dense_ffn\":8}," TRAIN "}",
     "/model/head_dim", "exceeds 262144"},
    {"{" M("\"head_dim\":33") "," TRAIN "}", "/model/head_dim", "must be even"},
    {"{" M("\"attention\":\"mla\",\"kv_lora_rank\":0,\"qk_nope_head_dim\":32,"
           "\"qk_rope_head_dim\":16,\"v_head_dim\":32") "," TRAIN "}",
     "/model/kv_lora_rank", "when attention is \"mla\""},
    {"{" M("\"attention\":\"mla\",\"kv_lora_rank\":64,\"qk_nope_head_dim\":32,"
           "\"qk_rope_head_dim\":16") "," TRAIN "}",
     "/model/v_head_dim", "v_head_dim must be > 0"},
    {"{" M("\"attention\":\"mla\",\"kv_lora_rank\":64,\"qk_nope_head_dim\":32,"
           "\"qk_rope_head_dim\":16,\"v_head_dim\":32,\"qk_norm\":\"head\"") "," TRAIN "}",
     "/model/qk_norm", "must be \"none\" with attention \"mla\""},
    {"{" M("\"attention\":\"mla\",\"kv_lora_rank\":64,\"qk_nope_head_dim\":32,"
           "\"qk_rope_head_dim\":16,\"v_head_dim\":32,\"attention_bias\":true") "," TRAIN "}",
     "/model/attention_bias", "not modelled for attention \"mla\""},
    /* YaRN. */
    {"{" M("\"yarn_factor\":4") "," TRAIN "}", "/model/yarn_original_max_position",
     "yarn_factor 4 needs yarn_original_max_position"},
    {"{" M("\"yarn_factor\":0.5") "," TRAIN "}", "/model/yarn_factor", ""},
    {"{" M("\"yarn_factor\":4,\"yarn_original_max_position\":64,\"yarn_beta_fast\":0.5")
     "," TRAIN "}", "/model/yarn_beta_fast", "must be >= yarn_beta_slow"},
    /* Layers. */
    {"{" M("\"first_k_dense\":5") "," TRAIN "," MOE "}", "/model/first_k_dense",
     "exceeds layers (2)"},
    {"{\"model\":{\"vocab\":256,\"hidden\":128,\"layers\":2,\"heads\":4}," TRAIN "}",
     "/model/dense_ffn", "no experts"},
    /* MoE. */
    {"{" MODEL "," TRAIN ",\"moe\":{\"experts\":8,\"top_k\":9,\"expert_ffn\":64}}", "/moe/top_k",
     "top_k (9) exceeds experts (8)"},
    {"{" MODEL "," TRAIN ",\"moe\":{\"experts\":128,\"top_k\":65,\"expert_ffn\":64}}", "/moe/top_k",
     "out of range [1, 64]"},
    {"{" MODEL "," TRAIN ",\"moe\":{\"experts\":8,\"top_k\":2,\"expert_ffn\":0}}",
     "/moe/expert_ffn", "must be > 0"},
    {"{" MODEL "," TRAIN "," E("\"n_group\":3") "}", "/moe/n_group", "multiple of n_group"},
    {"{" MODEL "," TRAIN "," E("\"n_group\":4,\"topk_group\":5") "}", "/moe/topk_group",
     "exceeds n_group"},
    {"{" MODEL "," TRAIN ",\"moe\":{\"experts\":8,\"top_k\":3,\"expert_ffn\":64,\"n_group\":4,"
     "\"topk_group\":1}}",
     "/moe/top_k", "kept groups"},
    {"{" MODEL "," TRAIN "," E("\"n_group\":8,\"scoring\":\"sigmoid\"") "}", "/moe/n_group",
     "at least 2 experts per group"},
    {"{" MODEL "," TRAIN "," E("\"capacity_factor\":0") "}", "/moe/capacity_factor",
     "out of range (0, 1000]"},
    {"{" MODEL "," TRAIN "," E("\"capacity_factor\":\"auto\"") "}", "/moe/capacity_factor",
     "expected a number or null"},
    {"{" MODEL "," TRAIN "," E("\"scoring\":\"relu\"") "}", "/moe/scoring",
     "\"softmax\", \"sigmoid\""},
    {"{" MODEL "," TRAIN "," E("\"activation\":\"silu\"") "}", "/moe/activation",
     "\"swiglu\", \"gelu\""},
    {"{" MODEL "," TRAIN "," E("\"shared_expert_gate\":true") "}", "/moe/shared_expert_gate",
     "needs shared_experts"},
    {"{" MODEL "," TRAIN ",\"moe\":{\"experts\":8,\"top_k\":2,\"shared_experts\":64,"
     "\"expert_ffn\":262144}}",
     "/moe/shared_ffn", "out of range"},
    {"{" MODEL "," TRAIN ",\"moe\":[]}", "/moe", "must be an object"},
    /* Training. */
    {"{" MODEL "," T("\"micro_batch\":4,\"global_batch\":10") "}", "/training/global_batch",
     "multiple of micro_batch (4)"},
    {"{" MODEL "," T("\"micro_batch\":2,\"global_batch\":6") "," P("\"dp\":2") "}",
     "/training/global_batch", "micro_batch*dp (4)"},
    {"{" MODEL "," T("\"zero_stage\":2") "}", "/training/zero_stage", "[0, 1]"},
    {"{" MODEL "," T("\"dtype\":\"fp8\"") "}", "/training/dtype", "\"fp32\", \"bf16\", \"fp16\""},
    {"{" MODEL "," T("\"beta2\":1.0") "}", "/training/beta2", "[0, 1)"},
    {"{" MODEL "," T("\"lr\":1e-4,\"min_lr\":1e-3") "}", "/training/min_lr", "exceeds lr"},
    {"{" MODEL "," T("\"warmup_steps\":2000,\"train_steps\":1000") "}", "/training/warmup_steps",
     "exceeds train_steps"},
    {"{" MODEL ",\"training\":{\"seq_len\":4194305}}", "/training/seq_len", "out of range"},
    {"{" MODEL "," T("\"seed\":-1") "}", "/training/seed", "out of range"},
    {"{" MODEL "," T("\"recompute\":\"some\"") "}", "/training/recompute", "\"selective\""},
    /* Parallel layout. */
    {"{" MODEL "," TRAIN "," P("\"dp\":0") "}", "/parallel/dp", "out of range"},
    {"{" MODEL "," TRAIN "," P("\"dp\":1.5") "}", "/parallel/dp", "must be an integer"},
    {"{" MODEL "," TRAIN "," MOE "," P("\"dp\":3,\"ep\":3") "}", "/parallel/ep",
     "must divide experts (8)"},
    {"{" MODEL "," TRAIN "," MOE "," P("\"dp\":2,\"ep\":4") "}", "/parallel/ep",
     "must divide dp*tp (2)"},
    {"{" MODEL "," TRAIN "," P("\"ep\":2,\"dp\":2") "}", "/parallel/ep", "the model is dense"},
    {"{" MODEL "," TRAIN "," P("\"tp\":3") "}", "/parallel/tp", "must divide heads (4)"},
    {"{" M("\"kv_heads\":2") "," TRAIN "," P("\"tp\":4") "}", "/parallel/tp",
     "must divide kv_heads (2)"},
    {"{" MODEL "," TRAIN "," MOE "," P("\"ssmb\":true") "}", "/parallel/ssmb", "needs tp > 1"},
    {"{" MODEL ",\"training\":{\"seq_len\":15}," MOE "," P("\"tp\":2,\"ssmb\":true") "}",
     "/parallel/ssmb", "divisible by tp (2)"},
    {"{" MODEL "," TRAIN "," MOE "," P("\"rbd\":true") "}", "/parallel/rbd", "needs ep > 1"},
    {"{" MODEL "," TRAIN "," P("\"zero\":1") "}", "/parallel/zero", "differs from"},
    {"{" MODEL "," TRAIN "," P("\"dp\":1,\"pp\":2") "}", "/parallel/pp", "unknown key \"pp\""},
    /* Inline cluster. */
    {"{" MODEL "," TRAIN "," P("\"dp\":2") "," CL() "}", "/parallel/dp",
     "must equal nodes*ranks_per_node (4)"},
    {"{" MODEL "," TRAIN "," CL(",\"gemm_efficiency\":1.5") "}", "/cluster/gemm_efficiency",
     "[0.01, 1]"},
    {"{" MODEL "," TRAIN "," CL(",\"topology\":\"mesh\"") "}", "/cluster/topology",
     "\"fat-tree\", \"dragonfly\", \"torus\""},
    {"{" MODEL "," TRAIN
     ",\"cluster\":{\"nodes\":1,\"ranks_per_node\":4,\"device_memory_gib\":64}}",
     "/cluster/peak_tflops", "missing required"},
    {"{" MODEL "," TRAIN "," CL(",\"nodes\":0") "}", "/cluster/nodes", "duplicate key"},
    {"{" MODEL "," TRAIN ",\"cluster\":{\"nodes\":65536,\"ranks_per_node\":1024,"
     "\"device_memory_gib\":64,\"peak_tflops\":100}}",
     "/cluster/nodes", "exceeds 16777216"},
    /* Document level. */
    {"[1, 2]", "", "must be an object"},
    {"42", "", "must be an object"},
    {"", "", "empty"},
    {"  \n\t ", "", "empty"},
};

static void test_bad_specs(void **state) {
  (void)state;
  size_t n = sizeof kBad / sizeof kBad[0];
  assert_true(n >= 45);
  for (size_t i = 0; i < n; i++) {
    xm_diag_t d;
    xm_diag_init(&d);
    xm_spec_t spec;
    xm_status_t st = xm_spec_load_text(kBad[i].json, strlen(kBad[i].json), "bad.json", &d, &spec);
    int at = xm_diag_find(&d, kBad[i].pointer);
    bool ok = st == XM_ERR_INVALID_INPUT && at >= 0 && d.entries[at].level == XM_DIAG_ERROR &&
              strstr(d.entries[at].message, kBad[i].text) != NULL &&
              strcmp(d.entries[at].file, "bad.json") == 0;
    if (!ok) {
      print_error("case %zu (%s) expected '%s' at '%s'; status %d, got:\n", i, kBad[i].json,
                  kBad[i].text, kBad[i].pointer, (int)st);
      xm_diag_print(&d, stderr);
    }
    xm_diag_free(&d);
    assert_true(ok);
  }
}

/* Loads `json` and returns the diagnostics (caller frees). */
static xm_status_t load(const char *json, xm_diag_t *d, xm_spec_t *spec) {
  xm_diag_init(d);
  return xm_spec_load_text(json, strlen(json), "t.json", d, spec);
}

static const char *message_at(const xm_diag_t *d, const char *place) {
  int i = xm_diag_find(d, place);
  return i >= 0 ? d->entries[i].message : "";
}

static void test_syntax_errors(void **state) {
  (void)state;
  xm_diag_t d;
  xm_spec_t spec;
  assert_int_equal(load("{\n  \"model\": {\n    \"vocab\": tru\n", &d, &spec),
                   XM_ERR_INVALID_INPUT);
  assert_int_equal(d.errors, 1);
  assert_string_equal(d.entries[0].place, "3:14");
  assert_non_null(strstr(d.entries[0].message, "JSON syntax error near 'tru'"));
  xm_diag_free(&d);

  assert_int_equal(load("{\"model\": {}", &d, &spec), XM_ERR_INVALID_INPUT);
  assert_non_null(strstr(d.entries[0].message, "unexpected end"));
  assert_string_equal(d.entries[0].place, "1:13");
  xm_diag_free(&d);

  /* Trailing text after the object is an error too. */
  assert_int_equal(load("{}\n}", &d, &spec), XM_ERR_INVALID_INPUT);
  assert_string_equal(d.entries[0].place, "2:1");
  xm_diag_free(&d);

  static const char with_nul[] = "{\"a\":1}\0{}";
  xm_diag_init(&d);
  assert_int_equal(xm_spec_load_text(with_nul, sizeof with_nul - 1, "t.json", &d, &spec),
                   XM_ERR_INVALID_INPUT);
  assert_non_null(strstr(message_at(&d, ""), "NUL byte at offset 7"));
  xm_diag_free(&d);
}

static void test_many_errors_collected(void **state) {
  (void)state;
  xm_diag_t d;
  xm_spec_t spec;
  const char *json =
      "{\"model\":{\"vocab\":256,\"hidden\":128,\"layers\":2.5,\"heads\":4,\"dense_ffn\":64},"
      "\"moe\":{\"experts\":8,\"topk\":2,\"expert_ffn\":64,\"scoring\":\"max\"},"
      "\"training\":{\"dtype\":\"fp8\",\"micro_batch\":4,\"global_batch\":6},"
      "\"parallel\":{\"ep\":3}}";
  assert_int_equal(load(json, &d, &spec), XM_ERR_INVALID_INPUT);
  assert_true(d.errors >= 7);
  assert_true(xm_diag_find(&d, "/model/layers") >= 0);
  assert_true(xm_diag_find(&d, "/moe/topk") >= 0);
  assert_true(xm_diag_find(&d, "/moe/scoring") >= 0);
  assert_true(xm_diag_find(&d, "/training/dtype") >= 0);
  assert_true(xm_diag_find(&d, "/training/seq_len") >= 0);
  assert_true(xm_diag_find(&d, "/training/global_batch") >= 0);
  assert_true(xm_diag_find(&d, "/parallel/ep") >= 0);
  /* top_k was misspelt, so the required top_k is reported missing too. */
  assert_non_null(strstr(message_at(&d, "/moe/top_k"), "missing required"));
  xm_diag_free(&d);
}

static const char *kTinyModel =
    "{\"model\":{\"vocab\":256,\"hidden\":128,\"layers\":2,\"heads\":4,\"dense_ffn\":256},"
    "\"moe\":{\"experts\":8,\"top_k\":2,\"expert_ffn\":64},"
    "\"training\":{\"seq_len\":16,\"micro_batch\":1,\"global_batch\":16},"
    "\"parallel\":{\"dp\":16,\"ep\":8}}";

static void load_cluster(const char *cluster, xm_diag_t *d, xm_spec_t *spec, xm_status_t want) {
  xm_diag_init(d);
  assert_int_equal(xm_spec_load_text(kTinyModel, strlen(kTinyModel), "m.json", d, spec), XM_OK);
  assert_int_equal(xm_spec_load_cluster_text(cluster, strlen(cluster), "c.json", d, spec), want);
}

static void test_cluster_file_errors(void **state) {
  (void)state;
  xm_diag_t d;
  xm_spec_t spec;
  load_cluster("{\"nodes\":0,\"ranks_per_node\":8,\"device_memory_gib\":64,"
               "\"peak_tflops\":100,\"topology\":\"ring\",\"ranks_per_nodes\":2}",
               &d, &spec, XM_ERR_INVALID_INPUT);
  assert_non_null(strstr(message_at(&d, "/nodes"), "out of range"));
  assert_non_null(strstr(message_at(&d, "/topology"), "\"dragonfly\""));
  assert_non_null(strstr(message_at(&d, "/ranks_per_nodes"), "did you mean \"ranks_per_node\"?"));
  assert_string_equal(d.entries[xm_diag_find(&d, "/nodes")].file, "c.json");
  xm_diag_free(&d);

  load_cluster("{\"nodes\":2,\"ranks_per_node\":8,\"peak_tflops\":-1}", &d, &spec,
               XM_ERR_INVALID_INPUT);
  assert_non_null(strstr(message_at(&d, "/device_memory_gib"), "missing required"));
  assert_non_null(strstr(message_at(&d, "/peak_tflops"), "out of range"));
  xm_diag_free(&d);

  /* The model's layout needs 16 ranks; an 8-rank cluster does not fit it. */
  load_cluster("{\"nodes\":1,\"ranks_per_node\":8,\"device_memory_gib\":141,"
               "\"peak_tflops\":989}",
               &d, &spec, XM_ERR_INVALID_INPUT);
  assert_non_null(strstr(message_at(&d, "/nodes"), "needs dp*tp = 16"));
  xm_diag_free(&d);

  load_cluster("[]", &d, &spec, XM_ERR_INVALID_INPUT);
  assert_non_null(strstr(message_at(&d, ""), "must be an object"));
  xm_diag_free(&d);

  load_cluster("{\"nodes\":", &d, &spec, XM_ERR_INVALID_INPUT);
  assert_true(xm_diag_find(&d, "1:10") >= 0);
  xm_diag_free(&d);

  /* A fitting cluster loads, and replaces the previous one entirely. */
  load_cluster("{\"nodes\":2,\"ranks_per_node\":8,\"device_memory_gib\":64,"
               "\"peak_tflops\":100,\"name\":\"c2\"}",
               &d, &spec, XM_OK);
  assert_true(spec.cluster.present);
  assert_string_equal(spec.cluster.name, "c2");
  assert_int_equal(spec.cluster.nodes, 2);
  assert_true(spec.cluster.gemm_efficiency == 0.5);
  xm_diag_free(&d);
}

static void test_io_errors(void **state) {
  (void)state;
  xm_diag_t d;
  xm_diag_init(&d);
  xm_spec_t spec;
  assert_int_equal(xm_spec_load_file("no/such/spec.json", &d, &spec), XM_ERR_IO);
  assert_int_equal(d.errors, 1);
  assert_string_equal(d.entries[0].file, "no/such/spec.json");
  assert_non_null(strstr(d.entries[0].message, "cannot read"));
  assert_int_equal(xm_spec_load_cluster_file("no/such/c.json", &d, &spec), XM_ERR_IO);
  assert_int_equal(d.errors, 2);
  /* A directory is not a readable spec either. */
  assert_int_not_equal(xm_spec_load_file(XM_SOURCE_DIR "/samples", &d, &spec), XM_OK);
  xm_diag_free(&d);
}

static void test_validate_after_import(void **state) {
  (void)state;
  /* xm_spec_validate also checks ranges of values no JSON reader checked
   * (a Hugging Face import fills the struct directly). */
  xm_spec_t spec;
  xm_diag_t d;
  assert_int_equal(load("{" MODEL "," TRAIN "," MOE "}", &d, &spec), XM_OK);
  xm_diag_free(&d);
  spec.model.vocab = (int64_t)1 << 40;
  spec.moe.top_k = 9;
  spec.training.zero_stage = 3;
  xm_diag_init(&d);
  xm_spec_validate(&spec, "hf.json", &d);
  assert_true(xm_diag_find(&d, "/model/vocab") >= 0);
  assert_true(xm_diag_find(&d, "/moe/top_k") >= 0);
  assert_true(xm_diag_find(&d, "/training/zero_stage") >= 0);
  assert_int_equal(d.errors, 3);
  xm_diag_free(&d);
}

static void test_one_message_per_field(void **state) {
  (void)state;
  /* A missing required field is not reported again by the check that
   * needs it to be positive. */
  xm_diag_t d;
  xm_spec_t spec;
  assert_int_equal(load("{" MODEL "," TRAIN ",\"moe\":{\"experts\":8,\"top_k\":2}}", &d, &spec),
                   XM_ERR_INVALID_INPUT);
  assert_int_equal(d.errors, 1);
  assert_non_null(strstr(message_at(&d, "/moe/expert_ffn"), "missing required"));
  xm_diag_free(&d);
  /* A missing section is one message, not one per field it would hold. */
  assert_int_equal(load("{" TRAIN "}", &d, &spec), XM_ERR_INVALID_INPUT);
  assert_int_equal(d.errors, 1);
  xm_diag_free(&d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_specs),
      cmocka_unit_test(test_syntax_errors),
      cmocka_unit_test(test_many_errors_collected),
      cmocka_unit_test(test_cluster_file_errors),
      cmocka_unit_test(test_io_errors),
      cmocka_unit_test(test_validate_after_import),
      cmocka_unit_test(test_one_message_per_field),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
