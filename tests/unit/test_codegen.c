/* tests/unit/test_codegen.c — the C code generator of training programs
 * (codegen/c_program.h), the config.json writer, the schedule pass and the
 * SHA-256 of the manifests.
 *
 * The generated text is checked on the tiny sample run through the real
 * pipeline (autodiff, canonicalize, plan-memory, schedule): one commented
 * kernel call per op, pointers that are the memory plan's offsets, the
 * permute bound check, the tensor table, determinism. Error paths use
 * small modules written as IR text. Whether the generated program computes
 * the right numbers is tests/e2e/gradcheck.sh's job.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/c_program.h"
#include "frontend/spec.h"
#include "ir/model.h"
#include "ir/text.h"
#include "passes/pass.h"
#include "passes/plan_memory.h"
#include "support/sha256.h"
#include "support/strbuf.h"

#define PIPELINE "autodiff{grad-accum=2},canonicalize,plan-memory,schedule"

/* ---- helpers ------------------------------------------------------------ */

static int count_substr(const char *s, const char *needle) {
  int n = 0;
  for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle)) n++;
  return n;
}

static int64_t module_int(const xm_ir_module_t *m, const char *key) {
  for (int i = 0; i < xm_ir_module_num_attrs(m); i++)
    if (strcmp(xm_ir_module_attr(m, i)->key, key) == 0) return xm_ir_module_attr(m, i)->i;
  return -1;
}

static void load_spec_text(const char *text, xm_spec_t *spec) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_status_t st = xm_spec_load_text(text, strlen(text), "test.json", &d, spec);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  xm_diag_free(&d);
}

static void load_tiny(xm_spec_t *spec) {
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(xm_spec_load_file(XM_SOURCE_DIR "/samples/tiny.json", &d, spec), XM_OK);
  xm_diag_free(&d);
}

/* The tiny model through the whole pipeline. */
static xm_ir_module_t *lowered(const xm_spec_t *spec) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_ir_module_t *m = NULL;
  assert_int_equal(xm_ir_build_model(spec, "tiny.json", &d, &m), XM_OK);
  xm_pass_manager_options_t po;
  xm_pass_manager_options_default(&po);
  xm_status_t st = xm_pass_pipeline_run(m, PIPELINE, &po, &d);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  xm_diag_free(&d);
  return m;
}

static xm_status_t generate(const xm_ir_module_t *m, const xm_spec_t *spec, xm_diag_t *d,
                            xm_strbuf_t *out) {
  xm_codegen_inputs_t in = {.spec_path = "samples/tiny.json",
                            .spec_text = "{\"name\": \"tiny\"}\n",
                            .config_json = "{}\n",
                            .pipeline = PIPELINE};
  return xm_codegen_program_c(m, spec, &in, d, out);
}

static xm_ir_module_t *parse(const char *text) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_ir_module_t *m = NULL;
  xm_status_t st = xm_ir_parse(text, strlen(text), "test.xir", &d, &m);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  xm_diag_free(&d);
  return m;
}

/* ---- SHA-256 and C strings ----------------------------------------------- */

static void test_sha256_vectors(void **state) {
  (void)state;
  char hex[65];
  xm_sha256_hex("", 0, hex);
  assert_string_equal(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  xm_sha256_hex("abc", 3, hex);
  assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  xm_sha256_hex(two, strlen(two), hex);
  assert_string_equal(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  /* Streaming in odd pieces equals one call (block boundaries inside). */
  char big[1000];
  memset(big, 'a', sizeof big);
  xm_sha256_t c;
  uint8_t d1[32], d2[32];
  xm_sha256_init(&c);
  for (size_t off = 0; off < sizeof big; off += 37)
    xm_sha256_update(&c, big + off, sizeof big - off < 37 ? sizeof big - off : 37);
  xm_sha256_final(&c, d1);
  xm_sha256_init(&c);
  xm_sha256_update(&c, big, sizeof big);
  xm_sha256_final(&c, d2);
  assert_memory_equal(d1, d2, 32);
  xm_sha256_hex(big, sizeof big, hex);
  assert_string_equal(hex, "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");
}

static void test_c_string(void **state) {
  (void)state;
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  xm_codegen_c_string(&b, "a\"b\\c\td", 0);
  assert_string_equal(xm_strbuf_cstr(&b), "\"a\\\"b\\\\c\\td\"");
  xm_strbuf_clear(&b);
  /* Lines become adjacent literals; no empty literal after the last one. */
  xm_codegen_c_string(&b, "{\n  x\n}\n", 2);
  assert_string_equal(xm_strbuf_cstr(&b), "\"{\\n\"\n  \"  x\\n\"\n  \"}\\n\"");
  xm_strbuf_clear(&b);
  /* Non-ASCII bytes and trigraph starts are octal escapes. */
  xm_codegen_c_string(&b, "\xe2\x80\x94?\?=\x01", 0);
  assert_string_equal(xm_strbuf_cstr(&b), "\"\\342\\200\\224\\077?=\\001\"");
  xm_strbuf_clear(&b);
  xm_codegen_c_string(&b, "", 0);
  assert_string_equal(xm_strbuf_cstr(&b), "\"\"");
  xm_strbuf_free(&b);
}

/* ---- config.json --------------------------------------------------------- */

static void test_config_json(void **state) {
  (void)state;
  xm_spec_t spec;
  load_tiny(&spec);
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  assert_int_equal(xm_codegen_config_json(&spec, &b), XM_OK);
  cJSON *o = cJSON_Parse(xm_strbuf_cstr(&b));
  assert_non_null(o);
  assert_string_equal(cJSON_GetObjectItem(o, "model_type")->valuestring, "xmoec");
  assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "architectures"), 0)->valuestring,
                      "XmoecForCausalLM");
  assert_int_equal(cJSON_GetObjectItem(o, "hidden_size")->valueint, 128);
  assert_int_equal(cJSON_GetObjectItem(o, "num_hidden_layers")->valueint, 4);
  assert_int_equal(cJSON_GetObjectItem(o, "num_key_value_heads")->valueint, 2);
  assert_int_equal(cJSON_GetObjectItem(o, "intermediate_size")->valueint, 384);
  assert_int_equal(cJSON_GetObjectItem(o, "moe_intermediate_size")->valueint, 128);
  assert_int_equal(cJSON_GetObjectItem(o, "n_routed_experts")->valueint, 16);
  assert_int_equal(cJSON_GetObjectItem(o, "num_experts_per_tok")->valueint, 2);
  assert_int_equal(cJSON_GetObjectItem(o, "first_k_dense_replace")->valueint, 1);
  assert_int_equal(cJSON_GetObjectItem(o, "max_position_embeddings")->valueint, 128);
  assert_string_equal(cJSON_GetObjectItem(o, "hidden_act")->valuestring, "silu");
  assert_string_equal(cJSON_GetObjectItem(o, "scoring_func")->valuestring, "softmax");
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(o, "norm_topk_prob")));
  assert_true(cJSON_IsFalse(cJSON_GetObjectItem(o, "tie_word_embeddings")));
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(o, "capacity_factor")));
  assert_float_equal(cJSON_GetObjectItem(o, "rms_norm_eps")->valuedouble, 1e-6, 1e-12);
  assert_float_equal(cJSON_GetObjectItem(o, "aux_loss_alpha")->valuedouble, 0.01, 1e-12);
  assert_string_equal(cJSON_GetObjectItem(o, "torch_dtype")->valuestring, "float32");
  /* Keys in the fixed order, the first ones. */
  assert_string_equal(o->child->string, "architectures");
  assert_string_equal(o->child->next->string, "model_type");
  cJSON_Delete(o);

  /* GeLU experts, capacity, sigmoid groups, tied embeddings. */
  load_spec_text("{\"model\": {\"vocab\": 64, \"hidden\": 16, \"layers\": 2, \"heads\": 2,"
                 " \"tied_embeddings\": true},"
                 " \"moe\": {\"experts\": 8, \"top_k\": 2, \"expert_ffn\": 8,"
                 " \"activation\": \"gelu\", \"scoring\": \"sigmoid\", \"n_group\": 4,"
                 " \"topk_group\": 2, \"capacity_factor\": 1.25},"
                 " \"training\": {\"seq_len\": 16}}",
                 &spec);
  xm_strbuf_clear(&b);
  assert_int_equal(xm_codegen_config_json(&spec, &b), XM_OK);
  o = cJSON_Parse(xm_strbuf_cstr(&b));
  assert_non_null(o);
  assert_string_equal(cJSON_GetObjectItem(o, "hidden_act")->valuestring, "gelu_pytorch_tanh");
  assert_string_equal(cJSON_GetObjectItem(o, "scoring_func")->valuestring, "sigmoid");
  assert_int_equal(cJSON_GetObjectItem(o, "n_group")->valueint, 4);
  assert_int_equal(cJSON_GetObjectItem(o, "topk_group")->valueint, 2);
  assert_float_equal(cJSON_GetObjectItem(o, "capacity_factor")->valuedouble, 1.25, 1e-12);
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(o, "tie_word_embeddings")));
  cJSON_Delete(o);
  xm_strbuf_free(&b);
}

/* ---- the program --------------------------------------------------------- */

/* The line after the comment of op `index` ("  xm_k_...;"), copied. */
static char *line_after_op(const char *text, int index) {
  char key[64];
  snprintf(key, sizeof key, "/* op %d ", index);
  const char *p = strstr(text, key);
  if (!p) return NULL;
  p = strchr(p, '\n');
  if (!p) return NULL;
  p++;
  const char *e = strchr(p, '\n');
  return strndup(p, e ? (size_t)(e - p) : strlen(p));
}

static void test_program_tiny(void **state) {
  (void)state;
  xm_spec_t spec;
  load_tiny(&spec);
  xm_ir_module_t *m = lowered(&spec);
  xm_diag_t d;
  xm_diag_init(&d);
  xm_strbuf_t a, b;
  xm_strbuf_init(&a);
  xm_strbuf_init(&b);
  assert_int_equal(generate(m, &spec, &d, &a), XM_OK);
  assert_int_equal(generate(m, &spec, &d, &b), XM_OK);
  const char *text = xm_strbuf_cstr(&a);
  assert_string_equal(text, xm_strbuf_cstr(&b)); /* deterministic */
  const char *header = "// generated by xmoec \xe2\x80\x94 do not edit\n";
  assert_int_equal(strncmp(text, header, strlen(header)), 0);
  assert_non_null(strstr(text, "// input: samples/tiny.json\n"));

  /* One comment per op of the two functions; one permute per MoE layer,
   * each followed by its bound check. */
  int64_t micro = module_int(m, "schedule_micro_ops"), step = module_int(m, "schedule_step_ops");
  assert_true(micro > 0 && step > 0);
  assert_int_equal(count_substr(text, "/* op "), micro + step);
  assert_int_equal(count_substr(text, "= xm_k_permute("), 3);
  assert_int_equal(count_substr(text, "xm_rt_fail(x, \"op "), 3);
  assert_int_equal(count_substr(text, "xm_k_adamw("), count_substr(text, "XM_RT_CAT_GRADS,"));
  assert_int_equal(count_substr(text, "static void micro(xm_rt_exec_t *x) {"), 1);
  assert_int_equal(count_substr(text, "static void step(xm_rt_exec_t *x) {"), 1);
  assert_non_null(strstr(text, ".grad_accum = 2,"));
  assert_non_null(strstr(text, ".micro_batch = 4,"));

  /* Every kernel pointer is the memory plan's place: check the embedding
   * and an rmsnorm against the "mem" attrs. */
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->code != XM_OP_EMBEDDING && op->code != XM_OP_RMSNORM) continue;
    char *line = line_after_op(text, i);
    assert_non_null(line);
    xm_mem_place_t in0, in1, out;
    assert_true(xm_plan_memory_place(op->operands[0]->def, op->operands[0]->index, &in0));
    assert_true(xm_plan_memory_place(op->operands[1]->def, op->operands[1]->index, &in1));
    assert_true(xm_plan_memory_place(op, 0, &out));
    char want[256];
    snprintf(want, sizeof want,
             "(%s *)(x->act + %" PRId64 "), (float *)(x->persist + %" PRId64
             "), (float *)(x->act + %" PRId64 "), 512, 128",
             op->code == XM_OP_EMBEDDING ? "int32_t" : "float", in0.offset, in1.offset,
             out.offset);
    assert_non_null(strstr(line, want));
    free(line);
  }
  xm_strbuf_free(&a);
  xm_strbuf_free(&b);
  xm_diag_free(&d);
  xm_ir_module_destroy(m);
}

/* The table: every param with its init, every state with its param. */
static void test_program_table(void **state) {
  (void)state;
  xm_spec_t spec;
  load_tiny(&spec);
  xm_ir_module_t *m = lowered(&spec);
  xm_diag_t d;
  xm_diag_init(&d);
  xm_strbuf_t a;
  xm_strbuf_init(&a);
  assert_int_equal(generate(m, &spec, &d, &a), XM_OK);
  const char *text = xm_strbuf_cstr(&a);
  int params = 0, states = 0;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    params += op->code == XM_OP_PARAM;
    states += op->code == XM_OP_STATE;
  }
  assert_int_equal(count_substr(text, "XM_RT_CAT_WEIGHTS,"), params);
  assert_int_equal(count_substr(text, "XM_RT_CAT_GRADS,") + count_substr(text, "XM_RT_CAT_OPTIMIZER,"),
                   states);
  char want[64];
  snprintf(want, sizeof want, ".num_tensors = %d,", params + states + 4);
  assert_non_null(strstr(text, want));
  assert_non_null(strstr(text, "{\"model.norm.weight\", XM_RT_CAT_WEIGHTS, XM_RT_F32, 1, {128}, 1, "));
  assert_non_null(strstr(text, "XM_RT_INIT_ONES, 0.0f, 1, -1},"));
  assert_non_null(strstr(text, "{\"model.layers.3.mlp.experts.{e}.down_proj.weight\", "
                               "XM_RT_CAT_WEIGHTS, XM_RT_F32, 3, {16, 128, 128}, 1, "));
  /* The embedding is table row 2 (after tokens and labels): its grad and
   * Adam states point back at it. */
  assert_non_null(strstr(text, "{\"model.embed_tokens.weight.grad\", XM_RT_CAT_GRADS, "));
  const char *row = strstr(text, "{\"model.embed_tokens.weight.exp_avg_sq\", ");
  assert_non_null(row);
  assert_non_null(strstr(row, "XM_RT_INIT_ZEROS, 0.0f, 0, 2},"));
  assert_true(strstr(row, "XM_RT_INIT_ZEROS, 0.0f, 0, 2},") < strchr(row, '\n'));
  xm_strbuf_free(&a);
  xm_diag_free(&d);
  xm_ir_module_destroy(m);
}

/* Codegen refuses modules that were not planned or not scheduled, and ops
 * it cannot run, naming the op. */
static void test_program_errors(void **state) {
  (void)state;
  xm_spec_t spec;
  load_tiny(&spec);
  xm_diag_t d;
  xm_diag_init(&d);
  xm_strbuf_t out;
  xm_strbuf_init(&out);

  xm_ir_module_t *m = parse("module @m {\n"
                            "  %0 = constant() {value = 1.0} : f32[] loc(\"/c\")\n"
                            "  return(%0) loc(\"/r\")\n"
                            "}\n");
  assert_int_not_equal(generate(m, &spec, &d, &out), XM_OK);
  assert_true(xm_diag_error_count(&d) > 0);
  xm_ir_module_destroy(m);

  /* Planned but not scheduled. */
  xm_diag_free(&d);
  xm_diag_init(&d);
  const char *planned_attrs =
      "mem_activation_bytes = 128, mem_activations = 64, mem_grads = 0, mem_inputs = 0, "
      "mem_optimizer = 0, mem_persistent_bytes = 0, mem_weights = 0, mem_workspace = 64";
  char text[2048];
  snprintf(text, sizeof text,
           "module @m attributes {%s} {\n"
           "  %%0 = constant() {mem = [1, 0, 64], value = 1.0} : f32[] loc(\"/c\")\n"
           "  return(%%0) loc(\"/r\")\n"
           "}\n",
           planned_attrs);
  m = parse(text);
  assert_int_equal(generate(m, &spec, &d, &out), XM_ERR_INTERNAL);
  assert_non_null(strstr(d.entries[0].message, "not scheduled"));
  xm_ir_module_destroy(m);

  /* A collective: unsupported, with the op's index and location. */
  xm_diag_free(&d);
  xm_diag_init(&d);
  snprintf(text, sizeof text,
           "module @m attributes {%s, schedule_micro_ops = 3, schedule_step_ops = 0} {\n"
           "  %%0 = constant() {mem = [1, 0, 64], value = 1.0} : f32[] loc(\"/c\")\n"
           "  %%1 = all_reduce(%%0) {group = \"dp\", mem = [1, 64, 64]} : f32[] loc(\"/ar\")\n"
           "  return(%%1) loc(\"/r\")\n"
           "}\n",
           planned_attrs);
  m = parse(text);
  xm_strbuf_clear(&out);
  assert_int_equal(generate(m, &spec, &d, &out), XM_ERR_UNSUPPORTED);
  int found = -1;
  for (int i = 0; i < d.count; i++)
    if (strstr(d.entries[i].message, "all_reduce cannot run")) found = i;
  assert_true(found >= 0);
  assert_string_equal(d.entries[found].place, "op 1");
  assert_string_equal(d.entries[found].file, "/ar");
  xm_ir_module_destroy(m);

  xm_strbuf_free(&out);
  xm_diag_free(&d);
}

/* The schedule pass on the tiny model: every op is a declaration, a micro
 * op or a step op; step ops come after all micro ops. */
static void test_schedule_counts(void **state) {
  (void)state;
  xm_spec_t spec;
  load_tiny(&spec);
  xm_ir_module_t *m = lowered(&spec);
  int decls = 0, last_micro = -1, first_step = -1;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->code == XM_OP_PARAM || op->code == XM_OP_STATE) {
      decls++;
      continue;
    }
    bool step = strcmp(xm_ir_op_get_string(op, "phase", "fwd"), "step") == 0;
    if (step && first_step < 0) first_step = i;
    if (!step && op->code != XM_OP_RETURN) last_micro = i;
  }
  assert_true(first_step > last_micro);
  assert_int_equal(xm_ir_module_op(m, xm_ir_module_num_ops(m) - 1)->code, XM_OP_RETURN);
  assert_int_equal(decls + module_int(m, "schedule_micro_ops") + module_int(m, "schedule_step_ops"),
                   xm_ir_module_num_ops(m));
  xm_ir_module_destroy(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sha256_vectors),  cmocka_unit_test(test_c_string),
      cmocka_unit_test(test_config_json),     cmocka_unit_test(test_program_tiny),
      cmocka_unit_test(test_program_table),   cmocka_unit_test(test_program_errors),
      cmocka_unit_test(test_schedule_counts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
