/* tests/unit/test_codegen.c — the C code generator of training programs
 * (codegen/c_program.h), the config.json writer, the schedule pass and the
 * SHA-256 of the manifests.
 *
 * The generated text is checked on the tiny sample run through the real
 * pipeline (autodiff, canonicalize, plan-memory, schedule): one commented
 * kernel call per op, pointers that are the memory plan's offsets, the
 * permute bound check, the tensor table, determinism. The multi-rank ops
 * (collectives, the expert all-to-all with its run-time row count, chunk
 * sorts, ZeRO-1 reduce-scatter / chunked adamw / gather, the clip from a
 * norm summed over groups, sharding columns and the layout) are checked on
 * a module written as IR text and run through plan-memory and schedule, as
 * are the four calls of redundancy-bypassing dispatch.
 * Error paths use small modules written as IR text. Whether the generated program computes
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

#define PIPELINE                                                                                   \
  "autodiff{grad-accum=2},canonicalize,fold-accumulate,host-reads,kernel-workspace,routed-rows,"  \
  "plan-memory,schedule"

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
   * each followed by the host read of its row counts and their bound
   * check; the norm and the two losses read once each. */
  int64_t micro = module_int(m, "schedule_micro_ops"), step = module_int(m, "schedule_step_ops");
  assert_true(micro > 0 && step > 0);
  assert_int_equal(count_substr(text, "/* op "), micro + step);
  assert_int_equal(count_substr(text, "(void)xm_k_permute("), 3);
  assert_int_equal(count_substr(text, "xm_rt_fail(x, \"op "), 3);
  assert_int_equal(count_substr(text, "xm_rt_read(x, tpe, "), 3);
  assert_int_equal(count_substr(text, "xm_rt_read(x, &h_"), 1);
  assert_int_equal(count_substr(text, "xm_rt_read(x, &x->host_loss, "), 1);
  assert_int_equal(count_substr(text, "xm_rt_read(x, &x->host_ce_loss, "), 1);
  /* The optimizer: one adamw_multi over a table with a row per trained
   * tensor (one per gradient), the others say where they went. */
  assert_int_equal(count_substr(text, "xm_k_adamw_multi(t, "), 1);
  assert_int_equal(count_substr(text, "xm_k_adamw("), 0);
  int64_t grads = count_substr(text, "XM_RT_CAT_GRADS,");
  assert_int_equal(count_substr(text, "/* batched: updated by the adamw_multi of op "), grads - 1);
  char want_call[96];
  snprintf(want_call, sizeof want_call, "xm_rt_adamw_tensor_t t[%d] = {", (int)grads);
  assert_int_equal(count_substr(text, want_call), 1);
  /* Clipping: grad_norm_sq only stores its sum; the launch reads it. */
  assert_int_equal(count_substr(text, "x->grad_scale = xm_rt_clip_coef(*"), 1);
  assert_int_equal(count_substr(text, "x->grad_norm = sqrt((double)*"), 1);
  assert_null(strstr(text, "sqrt(norm_sq)"));
  assert_non_null(strstr(text, "#include \"runtime/comm/spmd.h\"\n"));
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
  assert_non_null(strstr(text, "XM_RT_INIT_ONES, 0.0f, 1, -1, 0, 0, 0, 0, 0},"));
  assert_non_null(strstr(text, "{\"model.layers.3.mlp.experts.{e}.down_proj.weight\", "
                               "XM_RT_CAT_WEIGHTS, XM_RT_F32, 3, {16, 128, 128}, 1, "));
  /* The embedding is table row 2 (after tokens and labels): its grad and
   * Adam states point back at it. */
  assert_non_null(strstr(text, "{\"model.embed_tokens.weight.grad\", XM_RT_CAT_GRADS, "));
  const char *row = strstr(text, "{\"model.embed_tokens.weight.exp_avg_sq\", ");
  assert_non_null(row);
  assert_non_null(strstr(row, "XM_RT_INIT_ZEROS, 0.0f, 0, 2, 0, 0, 0, 0, 0},"));
  assert_true(strstr(row, "XM_RT_INIT_ZEROS, 0.0f, 0, 2, 0, 0, 0, 0, 0},") < strchr(row, '\n'));
  /* A single-rank module: the default layout. */
  assert_non_null(strstr(text, ".dp = 1, .tp = 1, .ep = 1, .ssmb = 0, .rbd = 0, .zero = 0, "
                               ".ranks_per_node = 0,"));
  xm_strbuf_free(&a);
  xm_diag_free(&d);
  xm_ir_module_destroy(m);
}

/* An expert placement (module attrs of xmoec compile --placement): the
 * params with attr expert_slots of the placed layer, and their states, get
 * that placement row in the table's last column; the rows become the
 * program's placement arrays; every forward top-k routing is followed by
 * the routing-statistics hook, and no recomputed or backward op is. */
static void test_program_placement(void **state) {
  (void)state;
  xm_spec_t spec;
  load_tiny(&spec);
  xm_ir_module_t *m = lowered(&spec);
  int64_t layers[1] = {2}, slots[16];
  for (int p = 0; p < 16; p++)
    slots[p] = (p + 5) % 16;
  xm_ir_attr_t a = {.key = "placement_layers", .kind = XM_ATTR_INTS, .n = 1, .ints = layers};
  xm_ir_module_set_attr(m, &a);
  a = (xm_ir_attr_t){.key = "placement", .kind = XM_ATTR_INTS, .n = 16, .ints = slots};
  xm_ir_module_set_attr(m, &a);
  xm_ir_module_set_int(m, "placement_nodes", 2);
  xm_diag_t d;
  xm_diag_init(&d);
  xm_strbuf_t out;
  xm_strbuf_init(&out);
  assert_int_equal(generate(m, &spec, &d, &out), XM_OK);
  const char *text = xm_strbuf_cstr(&out);
  static const struct {
    const char *name;
    int placed;
  } rows[] = {
      {"model.layers.2.mlp.gate.weight", 1},
      {"model.layers.2.mlp.gate.weight.exp_avg", 1},
      {"model.layers.2.mlp.experts.{e}.up_proj.weight", 1},
      {"model.layers.2.mlp.experts.{e}.down_proj.weight.exp_avg_sq", 1},
      {"model.layers.2.mlp.experts.{e}.gate_proj.weight.grad", 1},
      {"model.layers.1.mlp.gate.weight", 0},
      {"model.layers.1.mlp.experts.{e}.up_proj.weight", 0},
      {"model.layers.2.mlp.shared_experts.up_proj.weight", 0},
      {"model.layers.2.post_attention_layernorm.weight", 0},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    char key[160], tail[16];
    snprintf(key, sizeof key, "{\"%s\", ", rows[i].name);
    const char *row = strstr(text, key);
    assert_non_null(row);
    const char *end = strchr(row, '\n');
    snprintf(tail, sizeof tail, ", %d},", rows[i].placed);
    if (end - row < (ptrdiff_t)strlen(tail) || strncmp(end - strlen(tail), tail, strlen(tail))) {
      fprintf(stderr, "row %.*s does not end in %s\n", (int)(end - row), row, tail);
      fail();
    }
  }
  assert_non_null(strstr(text, "static const int32_t k_placement_layers[] = {2};"));
  assert_non_null(strstr(text, "  5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4,\n"));
  assert_non_null(strstr(text, ".placement_rows = 1, .placement_experts = 16, .placement_nodes = 2, "
                               ".placement_layers = k_placement_layers, .placement = k_placement,"));
  /* one hook per MoE layer (1, 2, 3), after its forward routing only */
  assert_int_equal(count_substr(text, "if (x->routing_stats) xm_rt_routing_observe(x, "), 3);
  assert_non_null(strstr(text, "xm_rt_routing_observe(x, 3, "));
  xm_strbuf_free(&out);
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

  /* A gather along dim 1: unsupported, with the op's index and location. */
  xm_diag_free(&d);
  xm_diag_init(&d);
  snprintf(text, sizeof text,
           "module @m attributes {%s, schedule_micro_ops = 3, schedule_step_ops = 0} {\n"
           "  %%0 = constant() {mem = [1, 0, 64], value = 1.0} : f32[1, 1] loc(\"/c\")\n"
           "  %%1 = all_gather(%%0) {dim = 1, group = \"tp\", group_size = 2, "
           "mem = [1, 64, 64]} : f32[1, 2] loc(\"/ag\")\n"
           "  return(%%1) loc(\"/r\")\n"
           "}\n",
           planned_attrs);
  m = parse(text);
  xm_strbuf_clear(&out);
  assert_int_equal(generate(m, &spec, &d, &out), XM_ERR_UNSUPPORTED);
  int found = -1;
  for (int i = 0; i < d.count; i++)
    if (strstr(d.entries[i].message, "all_gather cannot run")) found = i;
  assert_true(found >= 0);
  assert_string_equal(d.entries[found].place, "op 1");
  assert_string_equal(d.entries[found].file, "/ag");
  xm_ir_module_destroy(m);

  /* A collective over a group the runtime does not know. */
  xm_diag_free(&d);
  xm_diag_init(&d);
  snprintf(text, sizeof text,
           "module @m attributes {%s, schedule_micro_ops = 3, schedule_step_ops = 0} {\n"
           "  %%0 = constant() {mem = [1, 0, 64], value = 1.0} : f32[] loc(\"/c\")\n"
           "  %%1 = all_reduce(%%0) {group = \"rack\", group_size = 2, mem = [1, 64, 64]} : "
           "f32[] loc(\"/ar\")\n"
           "  return(%%1) loc(\"/r\")\n"
           "}\n",
           planned_attrs);
  m = parse(text);
  xm_strbuf_clear(&out);
  assert_int_equal(generate(m, &spec, &d, &out), XM_ERR_INTERNAL);
  found = -1;
  for (int i = 0; i < d.count; i++)
    if (strstr(d.entries[i].message, "all_reduce has no known group attribute (\"rack\")"))
      found = i;
  assert_true(found >= 0);
  xm_ir_module_destroy(m);

  /* A ZeRO-1 adamw whose chunks do not match group_size: a compiler bug. */
  xm_diag_free(&d);
  xm_diag_init(&d);
  snprintf(text, sizeof text,
           "module @m attributes {%s, schedule_micro_ops = 1, schedule_step_ops = 1} {\n"
           "  %%0 = param() {mem = [0, 0, 64], name = \"w\"} : f32[10] loc(\"/w\")\n"
           "  %%1 = state() {kind = \"grad\", mem = [0, 64, 64], name = \"g\", of = \"w\"} : "
           "f32[5]\n"
           "  %%2 = constant() {mem = [1, 0, 64], value = 1.0} : f32[]\n"
           "  adamw(%%0, %%1, %%1, %%1, %%2) {group = \"dp\", group_size = 4, phase = \"step\"} "
           "loc(\"/opt\")\n"
           "  return(%%2)\n"
           "}\n",
           planned_attrs);
  m = parse(text);
  xm_strbuf_clear(&out);
  assert_int_equal(generate(m, &spec, &d, &out), XM_ERR_INTERNAL);
  found = -1;
  for (int i = 0; i < d.count; i++)
    if (strstr(d.entries[i].message, "adamw: the ZeRO-1 chunks")) found = i;
  assert_true(found >= 0);
  assert_string_equal(d.entries[found].file, "/opt");
  xm_ir_module_destroy(m);

  xm_strbuf_free(&out);
  xm_diag_free(&d);
}

/* ---- multi-rank ops ------------------------------------------------------- */

/* Expert, tensor and data parallel ops of a 4-rank layout (dp 2 x tp 2 for
 * the dense part, ep 2, ZeRO-1), as the shard pass and autodiff mark them:
 * experts.w is split over ep (dim 0) with ZeRO-1 chunks over edp (n 32 over
 * 2: c 16), norm.w is whole with chunks over dp (n 10 over 4: c 3, the last
 * member owns one element), dense.w is split over tp (dim 1) with whole Adam
 * moments. */
static const char *const k_spmd_module =
    "module @spmd attributes {par_dp = 2, par_ep = 2, par_rpn = 2, par_tp = 2, par_zero = 1} {\n"
    "  %tok = input() {name = \"tokens\"} : i32[2, 4] loc(\"/in\")\n"
    "  %lab = input() {name = \"labels\"} : i32[2, 4] loc(\"/in\")\n"
    "  %ew = param() {init = \"normal\", name = \"experts.w\", reduce = \"edp\", split_dim = 0, "
    "split_group = \"ep\", std = 0.02, zero_group = \"edp\"} : f32[2, 4, 4] loc(\"/e\")\n"
    "  %nw = param() {init = \"ones\", name = \"norm.w\", reduce = \"dp\", zero_group = \"dp\"} : "
    "f32[10] loc(\"/n\")\n"
    "  %dw = param() {init = \"normal\", name = \"dense.w\", reduce = \"dp\", split_dim = 1, "
    "split_group = \"tp\", std = 0.02} : f32[4, 2] loc(\"/d\")\n"
    "  %eg = state() {kind = \"grad\", name = \"experts.w.grad\", of = \"experts.w\"} : "
    "f32[2, 4, 4]\n"
    "  %em = state() {chunk_group = \"edp\", kind = \"adam_m\", name = \"experts.w.exp_avg\", "
    "of = \"experts.w\"} : f32[16]\n"
    "  %ev = state() {chunk_group = \"edp\", kind = \"adam_v\", name = \"experts.w.exp_avg_sq\", "
    "of = \"experts.w\"} : f32[16]\n"
    "  %ng = state() {kind = \"grad\", name = \"norm.w.grad\", of = \"norm.w\"} : f32[10]\n"
    "  %nm = state() {chunk_group = \"dp\", kind = \"adam_m\", name = \"norm.w.exp_avg\", "
    "of = \"norm.w\"} : f32[3]\n"
    "  %nv = state() {chunk_group = \"dp\", kind = \"adam_v\", name = \"norm.w.exp_avg_sq\", "
    "of = \"norm.w\"} : f32[3]\n"
    "  %dg = state() {kind = \"grad\", name = \"dense.w.grad\", of = \"dense.w\"} : f32[4, 2]\n"
    "  %dm = state() {kind = \"adam_m\", name = \"dense.w.exp_avg\", of = \"dense.w\"} : "
    "f32[4, 2]\n"
    "  %dv = state() {kind = \"adam_v\", name = \"dense.w.exp_avg_sq\", of = \"dense.w\"} : "
    "f32[4, 2]\n"
    "  %ld = state() {kind = \"load\", name = \"norm.w.load\", of = \"norm.w\"} : i32[10]\n"
    "  %x = constant() {value = 1.0} : f32[8, 4] loc(\"/x\")\n"
    "  %cnt = constant() {value = 1.0} : i32[2, 2] loc(\"/cnt\")\n"
    "  %rc, %tpe = exchange_counts(%cnt) {group = \"ep\", group_size = 2, layer = 1} : "
    "i32[2, 2], i32[2] loc(\"/moe\")\n"
    "  %a = all_to_all(%x, %cnt, %rc) {group = \"ep\", group_size = 2, layer = 1, "
    "traffic = \"dispatch\"} : f32[?16, 4] loc(\"/moe\")\n"
    "  %s = sort_chunks(%a, %rc) {layer = 1} : f32[?16, 4] loc(\"/moe\")\n"
    "  %h = silu(%s) {layer = 1} : f32[?16, 4] loc(\"/moe\")\n"
    "  %u = unsort_chunks(%h, %rc) {layer = 1} : f32[?16, 4] loc(\"/moe\")\n"
    "  %b = all_to_all(%u, %rc, %cnt) {group = \"ep\", group_size = 2, layer = 1, "
    "traffic = \"combine\"} : f32[?8, 4] loc(\"/moe\")\n"
    "  %y = scale(%b) {factor = 2.0} : f32[?8, 4] loc(\"/moe\")\n"
    "  %ar = all_reduce(%x) {group = \"tp\", group_size = 2} : f32[8, 4] loc(\"/tp\")\n"
    "  %ag = all_gather(%ar) {dim = 0, group = \"tp\", group_size = 2} : f32[16, 4] "
    "loc(\"/tp\")\n"
    "  %nr = narrow(%ag) {dim = 0, group = \"tp\", group_size = 2} : f32[8, 4] loc(\"/tp\")\n"
    "  %rp = replicate(%nr) {group = \"tp\", group_size = 2} : f32[8, 4] loc(\"/tp\")\n"
    "  %loss = constant() {value = 0.0} : f32[] loc(\"/loss\")\n"
    "  reduce_state(%dg) {group = \"dp\", group_size = 2, phase = \"step\"} loc(\"/opt\")\n"
    "  reduce_state(%ld) {group = \"world\", group_size = 4, phase = \"step\"} loc(\"/opt\")\n"
    "  %ec = zero_reduce_scatter(%eg) {group = \"edp\", group_size = 2, phase = \"step\"} : "
    "f32[16] loc(\"/opt\")\n"
    "  %nc = zero_reduce_scatter(%ng) {group = \"dp\", group_size = 4, phase = \"step\"} : "
    "f32[3] loc(\"/opt\")\n"
    "  %n1 = grad_norm_sq(%ec) {phase = \"step\"} : f32[] loc(\"/clip\")\n"
    "  %n2 = grad_norm_sq(%nc, %dg) {phase = \"step\"} : f32[] loc(\"/clip\")\n"
    "  %n3 = all_reduce(%n1) {group = \"edp\", group_size = 2, phase = \"step\"} : f32[] "
    "loc(\"/clip\")\n"
    "  %n4 = add(%n3, %n2) {phase = \"step\"} : f32[] loc(\"/clip\")\n"
    "  adamw(%ew, %ec, %em, %ev, %n4) {decay = true, group = \"edp\", group_size = 2, "
    "phase = \"step\"} loc(\"/opt\")\n"
    "  adamw(%nw, %nc, %nm, %nv, %n4) {decay = false, group = \"dp\", group_size = 4, "
    "phase = \"step\"} loc(\"/opt\")\n"
    "  adamw(%dw, %dg, %dm, %dv, %n4) {decay = true, phase = \"step\"} loc(\"/opt\")\n"
    "  zero_gather(%ew) {group = \"edp\", group_size = 2, phase = \"step\"} loc(\"/opt\")\n"
    "  zero_gather(%nw) {group = \"dp\", group_size = 4, phase = \"step\"} loc(\"/opt\")\n"
    "  zero(%eg) {phase = \"step\"} loc(\"/opt\")\n"
    "  zero(%ng) {phase = \"step\"} loc(\"/opt\")\n"
    "  zero(%dg) {phase = \"step\"} loc(\"/opt\")\n"
    "  return(%loss, %rp, %y) loc(\"/out\")\n"
    "}\n";

/* The nth op (0-based) with `code`. */
static const xm_ir_op_t *nth_op(const xm_ir_module_t *m, xm_ir_opcode_t code, int nth) {
  for (int i = 0; i < xm_ir_module_num_ops(m); i++)
    if (xm_ir_module_op(m, i)->code == code && nth-- == 0) return xm_ir_module_op(m, i);
  return NULL;
}

static int op_index(const xm_ir_module_t *m, const xm_ir_op_t *op) {
  for (int i = 0; i < xm_ir_module_num_ops(m); i++)
    if (xm_ir_module_op(m, i) == op) return i;
  return -1;
}

/* The generated pointer expression of a value. */
static void place_text(const xm_ir_value_t *v, char *buf, size_t size) {
  xm_mem_place_t p;
  assert_true(xm_plan_memory_place(v->def, v->index, &p));
  snprintf(buf, size, "(%s *)(x->%s + %" PRId64 ")",
           v->type.dtype == XM_DT_I32 ? "int32_t" : "float",
           p.arena == XM_MEM_ARENA_PERSISTENT ? "persist" : "act", p.offset);
}

/* The generated lines of op `op` (from its comment to the next op's), copied. */
static char *op_text(const char *text, const xm_ir_module_t *m, const xm_ir_op_t *op) {
  char key[64];
  snprintf(key, sizeof key, "/* op %d ", op_index(m, op));
  const char *p = strstr(text, key);
  assert_non_null(p);
  const char *e = strstr(p + 1, "/* op ");
  if (!e) e = p + strlen(p);
  return strndup(p, (size_t)(e - p));
}

/* Asserts that op's code contains `want` (a printf format). */
static void assert_op_has(const char *text, const xm_ir_module_t *m, const xm_ir_op_t *op,
                          const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void assert_op_has(const char *text, const xm_ir_module_t *m, const xm_ir_op_t *op,
                          const char *fmt, ...) {
  char want[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(want, sizeof want, fmt, ap);
  va_end(ap);
  assert_non_null(op);
  char *code = op_text(text, m, op);
  if (!strstr(code, want)) fail_msg("op %d: no '%s' in:\n%s", op_index(m, op), want, code);
  free(code);
}

static void test_program_spmd(void **state) {
  (void)state;
  xm_spec_t spec;
  load_tiny(&spec);
  xm_ir_module_t *m = parse(k_spmd_module);
  xm_diag_t d;
  xm_diag_init(&d);
  xm_pass_manager_options_t po;
  xm_pass_manager_options_default(&po);
  xm_status_t st = xm_pass_pipeline_run(
      m, "host-reads,kernel-workspace,routed-rows,plan-memory,schedule", &po, &d);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  xm_strbuf_t a, b;
  xm_strbuf_init(&a);
  xm_strbuf_init(&b);
  st = generate(m, &spec, &d, &a);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  assert_int_equal(generate(m, &spec, &d, &b), XM_OK);
  const char *text = xm_strbuf_cstr(&a);
  assert_string_equal(text, xm_strbuf_cstr(&b));
  char p0[96], p1[96], p2[96], p3[96], r0[96], r1[96];

  /* Count exchange, dispatch: n_<id> of the received rows. */
  const xm_ir_op_t *ex = nth_op(m, XM_OP_EXCHANGE_COUNTS, 0);
  place_text(ex->operands[0], p0, sizeof p0);
  place_text(ex->results[0], r0, sizeof r0);
  place_text(ex->results[1], r1, sizeof r1);
  assert_op_has(text, m, ex, "xm_rt_exchange_counts(x, XM_RT_GROUP_EP, 1, %s, %s, %s, 2);", p0,
                r0, r1);
  const xm_ir_op_t *disp = nth_op(m, XM_OP_ALL_TO_ALL, 0);
  int nd = (int)xm_ir_op_get_int(disp, "rows_id", -1); /* routed-rows names the count */
  place_text(disp->operands[0], p0, sizeof p0);
  place_text(disp->operands[1], p1, sizeof p1);
  place_text(disp->operands[2], p2, sizeof p2);
  place_text(disp->results[0], r0, sizeof r0);
  assert_op_has(text, m, disp,
                "int64_t n_%d = xm_rt_all_to_all(x, XM_RT_GROUP_EP, XM_RT_PHASE_DISPATCH, 1, %s, "
                "%s, %s, 2, 4, %s, 16);",
                nd, p0, p1, p2, r0);
  /* The rows after it use n_<id>: the chunk sort takes the counts, the
   * elementwise kernel n times the row width. */
  const xm_ir_op_t *sort = nth_op(m, XM_OP_SORT_CHUNKS, 0);
  place_text(sort->operands[0], p0, sizeof p0);
  place_text(sort->operands[1], p1, sizeof p1);
  place_text(sort->results[0], r0, sizeof r0);
  assert_op_has(text, m, sort, "xm_k_sort_chunks(%s, %s, 2, 2, 4, %s);", p0, p1, r0);
  assert_op_has(text, m, nth_op(m, XM_OP_SILU, 0), ", n_%d * 4);", nd);
  assert_op_has(text, m, nth_op(m, XM_OP_UNSORT_CHUNKS, 0), "xm_k_unsort_chunks(");
  /* The combine: its own row count, which the scale over its rows uses. */
  const xm_ir_op_t *comb = nth_op(m, XM_OP_ALL_TO_ALL, 1);
  int nc = (int)xm_ir_op_get_int(comb, "rows_id", -1);
  assert_true(nc != nd);
  assert_op_has(text, m, comb,
                "int64_t n_%d = xm_rt_all_to_all(x, XM_RT_GROUP_EP, XM_RT_PHASE_COMBINE, 1, ", nc);
  assert_op_has(text, m, comb, ", 2, 4, ");
  assert_op_has(text, m, comb, ", 8);");
  assert_op_has(text, m, nth_op(m, XM_OP_SCALE, 0), ", n_%d * 4, 2.0);", nc);
  assert_int_equal(count_substr(text, "= xm_rt_all_to_all("), 2);
  /* Dynamic results need no static check. */
  assert_null(strstr(text, "rows arrived, the static shape"));

  /* Tensor-parallel movement. */
  const xm_ir_op_t *ar = nth_op(m, XM_OP_ALL_REDUCE, 0);
  place_text(ar->operands[0], p0, sizeof p0);
  place_text(ar->results[0], r0, sizeof r0);
  assert_op_has(text, m, ar, "xm_rt_all_reduce(x, XM_RT_GROUP_TP, -1, %s, %s, 32);", p0, r0);
  const xm_ir_op_t *ag = nth_op(m, XM_OP_ALL_GATHER, 0);
  place_text(ag->operands[0], p0, sizeof p0);
  place_text(ag->results[0], r0, sizeof r0);
  assert_op_has(text, m, ag, "xm_rt_all_gather(x, XM_RT_GROUP_TP, -1, %s, %s, 32);", p0, r0);
  const xm_ir_op_t *nr = nth_op(m, XM_OP_NARROW, 0);
  place_text(nr->operands[0], p0, sizeof p0);
  place_text(nr->results[0], r0, sizeof r0);
  assert_op_has(text, m, nr, "xm_rt_narrow(x, XM_RT_GROUP_TP, %s, %s, 32, 4);", p0, r0);
  const xm_ir_op_t *rp = nth_op(m, XM_OP_REPLICATE, 0);
  place_text(rp->operands[0], p0, sizeof p0);
  place_text(rp->results[0], r0, sizeof r0);
  if (strcmp(p0, r0) == 0)
    assert_op_has(text, m, rp, "/* aliased: no code */");
  else
    assert_op_has(text, m, rp, "xm_rt_copy(x, %s, %s, (int64_t)(32) * 4);", r0, p0);

  /* The step: state reductions, ZeRO-1 reduce-scatter, the norm from
   * partial sums, chunked and whole adamw, the gathers. */
  const xm_ir_op_t *rs = nth_op(m, XM_OP_REDUCE_STATE, 0);
  place_text(rs->operands[0], p0, sizeof p0);
  assert_op_has(text, m, rs, "xm_rt_all_reduce(x, XM_RT_GROUP_DP, -1, %s, %s, 8);", p0, p0);
  rs = nth_op(m, XM_OP_REDUCE_STATE, 1);
  place_text(rs->operands[0], p0, sizeof p0);
  assert_op_has(text, m, rs, "xm_rt_all_reduce_i32(x, XM_RT_GROUP_WORLD, -1, %s, 10);", p0);
  const xm_ir_op_t *zr = nth_op(m, XM_OP_ZERO_REDUCE_SCATTER, 0);
  place_text(zr->operands[0], p0, sizeof p0);
  place_text(zr->results[0], r0, sizeof r0);
  assert_op_has(text, m, zr, "xm_rt_zero_reduce_scatter(x, XM_RT_GROUP_EDP, %s, 32, %s);", p0,
                r0);
  assert_op_has(text, m, nth_op(m, XM_OP_ZERO_REDUCE_SCATTER, 1),
                "xm_rt_zero_reduce_scatter(x, XM_RT_GROUP_DP, ");
  const xm_ir_op_t *gn = nth_op(m, XM_OP_GRAD_NORM_SQ, 1);
  place_text(gn->results[0], r0, sizeof r0);
  /* Summed on the device into the op's workspace, the total in its result. */
  assert_op_has(text, m, gn, "xm_rt_zero(x, acc, 8);");
  assert_op_has(text, m, gn, ", 3, acc, %s);", r0); /* the chunk of norm.w */
  assert_op_has(text, m, gn, ", 8, acc, %s);", r0); /* dense.w's grad */
  assert_null(strstr(text, "sqrt(norm_sq)"));
  const xm_ir_op_t *ad = nth_op(m, XM_OP_ADAMW, 0);
  place_text(ad->operands[0], p0, sizeof p0);
  place_text(ad->operands[1], p1, sizeof p1);
  /* The norm reaches the host through its host_read: h_<value id>. */
  snprintf(p2, sizeof p2, "(&h_%d)", ad->operands[4]->id);
  assert_non_null(strstr(text, "xm_rt_read(x, &h_"));
  assert_op_has(text, m, ad, "x->grad_norm = sqrt((double)*%s);", p2);
  assert_op_has(text, m, ad, "x->grad_scale = xm_rt_clip_coef(*%s, x->grad_clip);", p2);
  /* The three adamw ops are one launch at the first: a table row per op
   * (the ZeRO-1 rows start empty and get this member's chunk), then the
   * call with the decay each row's flag. */
  place_text(ad->operands[2], p2, sizeof p2);
  place_text(ad->operands[3], p3, sizeof p3);
  assert_op_has(text, m, ad, "xm_rt_adamw_tensor_t t[3] = {");
  assert_op_has(text, m, ad, "{%s, %s, %s, %s, 0, 1, 0}, /* of op %d */", p0, p1, p2, p3,
                op_index(m, ad));
  assert_op_has(text, m, ad, "int64_t lo = xm_rt_group_index(x, XM_RT_GROUP_EDP) * 16;");
  assert_op_has(text, m, ad, "int64_t len = 32 - lo < 16 ? 32 - lo : 16;");
  assert_op_has(text, m, ad, "if (len > 0) {");
  assert_op_has(text, m, ad, "  t[0].p += lo;");
  assert_op_has(text, m, ad, "  t[0].n = len;");
  assert_op_has(text, m, ad, "int64_t lo = xm_rt_group_index(x, XM_RT_GROUP_DP) * 3;");
  assert_op_has(text, m, ad, "int64_t len = 10 - lo < 3 ? 10 - lo : 3;");
  assert_op_has(text, m, ad, "  t[1].n = len;");
  const xm_ir_op_t *ad2 = nth_op(m, XM_OP_ADAMW, 2);
  place_text(ad2->operands[0], p0, sizeof p0);
  place_text(ad2->operands[1], p1, sizeof p1);
  assert_op_has(text, m, ad, "{%s, %s, ", p0, p1);
  assert_op_has(text, m, ad, ", 8, 1, 0}, /* of op %d */", op_index(m, ad2));
  assert_op_has(text, m, ad, "xm_k_adamw_multi(t, 3, x->lr, x->beta1, x->beta2, x->adam_eps, "
                             "x->weight_decay, x->step, x->grad_scale);");
  assert_op_has(text, m, nth_op(m, XM_OP_ADAMW, 1),
                "/* batched: updated by the adamw_multi of op %d */", op_index(m, ad));
  assert_op_has(text, m, ad2, "/* batched: updated by the adamw_multi of op %d */",
                op_index(m, ad));
  const xm_ir_op_t *zg = nth_op(m, XM_OP_ZERO_GATHER, 0);
  place_text(zg->operands[0], p0, sizeof p0);
  assert_op_has(text, m, zg, "xm_rt_zero_gather(x, XM_RT_GROUP_EDP, %s, 32);", p0);
  assert_op_has(text, m, nth_op(m, XM_OP_ZERO_GATHER, 1),
                "xm_rt_zero_gather(x, XM_RT_GROUP_DP, ");

  /* Table: splits (group kind + 1: tp 3, ep 4), inherited by grads and
   * whole moments; ZeRO-1 chunks (dp 2, edp 5) are not split; gradients
   * and loads are the accumulators the driver clears after an evaluation. */
  assert_non_null(strstr(text, "{\"experts.w\", XM_RT_CAT_WEIGHTS, XM_RT_F32, 3, {2, 4, 4}, 1, "));
  struct {
    const char *name, *tail;
  } rows[] = {
      {"{\"experts.w\", ", ", 1, -1, 4, 0, 0, 0, 0},"},
      {"{\"experts.w.grad\", ", ", 0, 2, 4, 0, 0, 1, 0},"},
      {"{\"experts.w.exp_avg\", ", ", 0, 2, 0, 0, 5, 0, 0},"},
      {"{\"experts.w.exp_avg_sq\", ", ", 0, 2, 0, 0, 5, 0, 0},"},
      {"{\"norm.w\", ", ", 1, -1, 0, 0, 0, 0, 0},"},
      {"{\"norm.w.exp_avg\", ", ", 0, 3, 0, 0, 2, 0, 0},"},
      {"{\"norm.w.load\", ", ", 0, 3, 0, 0, 0, 1, 0},"},
      {"{\"dense.w\", ", ", 1, -1, 3, 1, 0, 0, 0},"},
      {"{\"dense.w.grad\", ", ", 0, 4, 3, 1, 0, 1, 0},"},
      {"{\"dense.w.exp_avg_sq\", ", ", 0, 4, 3, 1, 0, 0, 0},"},
      {"{\"tokens\", ", ", 0, -1, 0, 0, 0, 0, 0},"},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    const char *row = strstr(text, rows[i].name);
    assert_non_null(row);
    const char *tail = strstr(row, rows[i].tail);
    if (!tail || tail > strchr(row, '\n'))
      fail_msg("row %s does not end in %s", rows[i].name, rows[i].tail);
  }
  assert_non_null(strstr(text, ".dp = 2, .tp = 2, .ep = 2, .ssmb = 0, .rbd = 0, .zero = 1, "
                               ".ranks_per_node = 2,"));
  assert_non_null(strstr(text, "#include \"runtime/comm/spmd.h\"\n"));
  xm_strbuf_free(&a);
  xm_strbuf_free(&b);
  xm_diag_free(&d);
  xm_ir_module_destroy(m);
}

/* Redundancy-bypassing dispatch: the four calls with their slot and layer;
 * the dispatch's rows are n_<id> for the expert computation and the
 * combine gradient's rows. */
static void test_program_rbd(void **state) {
  (void)state;
  xm_spec_t spec;
  load_tiny(&spec);
  xm_ir_module_t *m = parse(
      "module @rbd attributes {par_dp = 4, par_ep = 4, par_rbd = 1, par_rpn = 2} {\n"
      "  %tok = input() {name = \"tokens\"} : i32[1, 4]\n"
      "  %lab = input() {name = \"labels\"} : i32[1, 4]\n"
      "  %x = constant() {value = 1.0} : f32[4, 8]\n"
      "  %e = constant() {value = 0.0} : i32[4, 2]\n"
      "  %w = constant() {value = 0.5} : f32[4, 2]\n"
      "  %rows, %tpe = rbd_dispatch(%x, %e, %w) {group = \"ep\", group_size = 4, layer = 2, "
      "num_experts = 8, slot = 3} : f32[?32, 8], i32[2] loc(\"/moe\")\n"
      "  %h = silu(%rows) {layer = 2} : f32[?32, 8]\n"
      "  %o = rbd_combine(%h, %w, %tpe) {group = \"ep\", group_size = 4, layer = 2, slot = 3} : "
      "f32[4, 8]\n"
      "  %dy, %dw = rbd_combine_grad(%o, %h, %w, %tpe) {group = \"ep\", group_size = 4, "
      "layer = 2, slot = 3} : f32[?32, 8], f32[4, 2]\n"
      "  %g = silu_grad(%dy, %rows) {layer = 2} : f32[?32, 8]\n"
      "  %dx = rbd_dispatch_grad(%g, %tpe) {group = \"ep\", group_size = 4, layer = 2, "
      "slot = 3} : f32[4, 8]\n"
      "  %loss = constant() {value = 0.0} : f32[]\n"
      "  return(%loss, %dx, %dw)\n"
      "}\n");
  xm_diag_t d;
  xm_diag_init(&d);
  xm_pass_manager_options_t po;
  xm_pass_manager_options_default(&po);
  xm_status_t st = xm_pass_pipeline_run(
      m, "host-reads,kernel-workspace,routed-rows,plan-memory,schedule", &po, &d);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  xm_strbuf_t out;
  xm_strbuf_init(&out);
  st = generate(m, &spec, &d, &out);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  const char *text = xm_strbuf_cstr(&out);
  char p0[96], p1[96], p2[96], r0[96], r1[96];
  const xm_ir_op_t *disp = nth_op(m, XM_OP_RBD_DISPATCH, 0);
  int n = (int)xm_ir_op_get_int(disp, "rows_id", -1);
  place_text(disp->operands[0], p0, sizeof p0);
  place_text(disp->operands[1], p1, sizeof p1);
  place_text(disp->operands[2], p2, sizeof p2);
  place_text(disp->results[0], r0, sizeof r0);
  place_text(disp->results[1], r1, sizeof r1);
  assert_op_has(text, m, disp,
                "int64_t n_%d = xm_rt_rbd_dispatch(x, 3, 2, %s, %s, %s, 4, 2, 8, 8, %s, %s, 32);",
                n, p0, p1, p2, r0, r1);
  assert_op_has(text, m, nth_op(m, XM_OP_SILU, 0), ", n_%d * 8);", n);
  const xm_ir_op_t *comb = nth_op(m, XM_OP_RBD_COMBINE, 0);
  place_text(comb->operands[0], p0, sizeof p0);
  place_text(comb->results[0], r0, sizeof r0);
  assert_op_has(text, m, comb, "xm_rt_rbd_combine(x, 3, 2, %s, %s);", p0, r0);
  const xm_ir_op_t *cg = nth_op(m, XM_OP_RBD_COMBINE_GRAD, 0);
  place_text(cg->operands[0], p0, sizeof p0);
  place_text(cg->operands[1], p1, sizeof p1);
  place_text(cg->results[0], r0, sizeof r0);
  place_text(cg->results[1], r1, sizeof r1);
  assert_op_has(text, m, cg, "xm_rt_rbd_combine_grad(x, 3, 2, %s, %s, %s, %s);", p0, p1, r0, r1);
  assert_op_has(text, m, nth_op(m, XM_OP_SILU_GRAD, 0), ", n_%d * 8);", n);
  const xm_ir_op_t *dg = nth_op(m, XM_OP_RBD_DISPATCH_GRAD, 0);
  place_text(dg->operands[0], p0, sizeof p0);
  place_text(dg->results[0], r0, sizeof r0);
  assert_op_has(text, m, dg, "xm_rt_rbd_dispatch_grad(x, 3, 2, %s, %s);", p0, r0);
  assert_non_null(strstr(text, "#include \"runtime/moe/rbd_exec.h\"\n"));
  assert_non_null(strstr(text, ".dp = 4, .tp = 1, .ep = 4, .ssmb = 0, .rbd = 1, .zero = 0, "
                               ".ranks_per_node = 2,"));
  xm_strbuf_free(&out);
  xm_diag_free(&d);
  xm_ir_module_destroy(m);
}

/* An all_to_all with a static result (not what the shard pass makes; the
 * verifier wants a bound) is checked against its shape at run time. The
 * module is planned by hand, as codegen reads only the plan. */
static void test_program_all_to_all_static(void **state) {
  (void)state;
  xm_spec_t spec;
  load_tiny(&spec);
  xm_ir_module_t *m = parse(
      "module @m attributes {mem_activation_bytes = 512, mem_activations = 256, mem_grads = 0, "
      "mem_inputs = 128, mem_optimizer = 0, mem_persistent_bytes = 0, mem_weights = 0, "
      "mem_workspace = 128, schedule_micro_ops = 7, schedule_step_ops = 0} {\n"
      "  %0 = input() {mem = [1, 0, 64], name = \"tokens\"} : i32[1, 2]\n"
      "  %1 = input() {mem = [1, 64, 64], name = \"labels\"} : i32[1, 2]\n"
      "  %2 = constant() {mem = [1, 128, 64], value = 1.0} : f32[4, 3]\n"
      "  %3 = constant() {mem = [1, 192, 64], value = 1.0} : i32[2, 1]\n"
      "  %4 = all_to_all(%2, %3, %3) {group = \"world\", group_size = 2, mem = [1, 256, 64], "
      "traffic = \"dispatch\"} : f32[4, 3]\n"
      "  %5 = constant() {mem = [1, 320, 64], value = 0.0} : f32[]\n"
      "  return(%5, %4)\n"
      "}\n");
  xm_diag_t d;
  xm_diag_init(&d);
  xm_strbuf_t out;
  xm_strbuf_init(&out);
  xm_status_t st = generate(m, &spec, &d, &out);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  const xm_ir_op_t *a2a = nth_op(m, XM_OP_ALL_TO_ALL, 0);
  int id = (int)xm_ir_op_get_int(a2a, "rows_id", -1);
  const char *text = xm_strbuf_cstr(&out);
  assert_op_has(text, m, a2a,
                "int64_t n_%d = xm_rt_all_to_all(x, XM_RT_GROUP_WORLD, XM_RT_PHASE_DISPATCH, -1, "
                "(float *)(x->act + 128), (int32_t *)(x->act + 192), (int32_t *)(x->act + 192), "
                "1, 3, (float *)(x->act + 256), 4);",
                id);
  assert_op_has(text, m, a2a, "if (n_%d != 4)", id);
  assert_op_has(text, m, a2a, "rows arrived, the static shape says 4\", (long long)n_%d);", id);
  xm_strbuf_free(&out);
  xm_diag_free(&d);
  xm_ir_module_destroy(m);
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
      cmocka_unit_test(test_program_table),
      cmocka_unit_test(test_program_placement),   cmocka_unit_test(test_program_errors),
      cmocka_unit_test(test_schedule_counts), cmocka_unit_test(test_program_spmd),
      cmocka_unit_test(test_program_all_to_all_static), cmocka_unit_test(test_program_rbd),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
