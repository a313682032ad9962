/* tests/unit/test_spec_valid.c — specs that must load: the samples with
 * their exact values, the documented defaults (derived ones included), the
 * cluster samples, and docs/spec.md covering every key of the field table. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/spec.h"
#include "frontend/spec_fields.h"
#include "support/strbuf.h"

static void load_ok(const char *json, const char *source, xm_spec_t *spec) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_status_t st = xm_spec_load_text(json, strlen(json), source, &d, spec);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  assert_int_equal(d.errors, 0);
  xm_diag_free(&d);
}

static void load_sample(const char *rel, xm_spec_t *spec) {
  char path[512];
  snprintf(path, sizeof path, "%s/samples/%s", XM_SOURCE_DIR, rel);
  xm_diag_t d;
  xm_diag_init(&d);
  xm_status_t st = xm_spec_load_file(path, &d, spec);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  assert_int_equal(d.count, 0);
  xm_diag_free(&d);
}

static void test_tiny_sample(void **state) {
  (void)state;
  xm_spec_t s;
  load_sample("tiny.json", &s);
  assert_string_equal(s.name, "tiny");
  assert_string_equal(s.model_type, "xmoec");
  assert_int_equal(s.model.vocab, 256);
  assert_int_equal(s.model.hidden, 128);
  assert_int_equal(s.model.layers, 4);
  assert_int_equal(s.model.heads, 4);
  assert_int_equal(s.model.kv_heads, 2);
  assert_int_equal(s.model.head_dim, 32);
  assert_int_equal(s.model.attention, XM_ATTN_GQA); /* derived: kv_heads < heads */
  assert_int_equal(s.model.first_k_dense, 1);
  assert_int_equal(s.model.dense_ffn, 384);
  assert_int_equal(s.moe.experts, 16);
  assert_int_equal(s.moe.shared_experts, 1);
  assert_int_equal(s.moe.shared_ffn, 128); /* derived: 1 * expert_ffn */
  assert_int_equal(s.moe.top_k, 2);
  assert_int_equal(s.moe.expert_ffn, 128);
  assert_int_equal(s.moe.scoring, XM_SCORING_SOFTMAX);
  assert_int_equal(s.moe.activation, XM_ACT_SWIGLU);
  assert_true(s.moe.norm_topk_prob);
  assert_true(s.moe.aux_alpha == 0.01);
  assert_false(s.moe.has_capacity);
  assert_int_equal(s.training.seq_len, 128);
  assert_int_equal(s.training.micro_batch, 4);
  assert_int_equal(s.training.global_batch, 8);
  assert_int_equal(s.training.dtype, XM_DTYPE_FP32);
  assert_true(s.training.lr == 3e-3);
  assert_true(s.training.min_lr == 3e-3 / 10);
  assert_int_equal(s.training.warmup_steps, 20);
  assert_int_equal(s.training.train_steps, 300);
  assert_false(s.parallel.present);
  assert_false(s.cluster.present);
  assert_false(xm_spec_layer_is_moe(&s, 0));
  assert_true(xm_spec_layer_is_moe(&s, 1));
}

static void test_xmoe_samples(void **state) {
  (void)state;
  static const struct {
    const char *file;
    int64_t hidden, ffn, experts, top_k, layers, heads, seq, global_batch;
  } want[] = {
      {"xmoe-small.json", 2048, 1408, 64, 6, 28, 16, 2048, 1024},
      {"xmoe-medium.json", 5120, 1536, 128, 6, 28, 40, 4096, 1024},
      {"xmoe-large.json", 7168, 2048, 256, 8, 28, 56, 4096, 2048},
      {"xmoe-super.json", 7168, 2560, 256, 8, 61, 56, 4096, 2048},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    xm_spec_t s;
    load_sample(want[i].file, &s);
    assert_int_equal(s.model.vocab, 50257);
    assert_int_equal(s.model.hidden, want[i].hidden);
    assert_int_equal(s.model.layers, want[i].layers);
    assert_int_equal(s.model.heads, want[i].heads);
    assert_int_equal(s.model.kv_heads, want[i].heads);
    assert_int_equal(s.model.head_dim, 128);
    assert_int_equal(s.model.attention, XM_ATTN_MHA);
    assert_int_equal(s.model.first_k_dense, 0);
    assert_int_equal(s.moe.experts, want[i].experts);
    assert_int_equal(s.moe.top_k, want[i].top_k);
    assert_int_equal(s.moe.expert_ffn, want[i].ffn);
    assert_int_equal(s.moe.shared_experts, 0);
    assert_int_equal(s.moe.shared_ffn, 0);
    assert_int_equal(s.moe.activation, XM_ACT_GELU);
    assert_int_equal(s.moe.scoring, XM_SCORING_SOFTMAX);
    assert_false(s.moe.has_capacity);
    assert_int_equal(s.training.seq_len, want[i].seq);
    assert_int_equal(s.training.micro_batch, 1);
    assert_int_equal(s.training.global_batch, want[i].global_batch);
    assert_int_equal(s.training.dtype, XM_DTYPE_BF16);
    /* The paper's parameter count L*(4h^2 + E*2h*H_ffn + h*E); its table
     * gives it in units of 2^30. */
    double h = (double)s.model.hidden, e = (double)s.moe.experts;
    double params =
        (double)s.model.layers * (4 * h * h + e * 2 * h * (double)s.moe.expert_ffn + h * e);
    static const double paper[] = {10.1e9, 55.2e9, 201.4e9, 545e9};
    double units = params / (1 << 30);
    assert_true(units > paper[i] * 0.995e-9 && units < paper[i] * 1.005e-9);
  }
}

static void test_cluster_samples(void **state) {
  (void)state;
  xm_spec_t s;
  load_sample("xmoe-small.json", &s);
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(
      xm_spec_load_cluster_file(XM_SOURCE_DIR "/samples/clusters/frontier-1024.json", &d, &s),
      XM_OK);
  assert_true(s.cluster.present);
  assert_string_equal(s.cluster.name, "frontier-1024");
  assert_int_equal(s.cluster.nodes, 128);
  assert_int_equal(s.cluster.ranks_per_node, 8);
  assert_true(s.cluster.device_memory_gib == 64);
  assert_true(s.cluster.peak_tflops == 191.5);
  assert_true(s.cluster.gemm_efficiency == 0.6);
  assert_true(s.cluster.intra_bw_gbps == 100);
  assert_true(s.cluster.inter_bw_gbps == 12.5);
  assert_true(s.cluster.inter_latency_us == 3);
  assert_int_equal(s.cluster.topology, XM_TOPO_DRAGONFLY);
  assert_int_equal(xm_spec_load_cluster_file(XM_SOURCE_DIR "/samples/clusters/h200-8.json", &d, &s),
                   XM_OK);
  assert_string_equal(s.cluster.name, "h200-8");
  assert_int_equal(s.cluster.nodes, 1);
  assert_true(s.cluster.device_memory_gib == 141);
  assert_true(s.cluster.peak_tflops == 989);
  assert_true(s.cluster.gemm_efficiency == 0.7);
  assert_true(s.cluster.intra_bw_gbps == 450);
  assert_true(s.cluster.intra_latency_us == 1);
  assert_true(s.cluster.inter_bw_gbps == 50);
  assert_int_equal(s.cluster.topology, XM_TOPO_FAT_TREE);
  assert_int_equal(d.count, 0);
  xm_diag_free(&d);
}

#define BASE_MODEL                                                                                 \
  "\"model\":{\"vocab\":256,\"hidden\":128,\"layers\":2,\"heads\":4,\"dense_ffn\":256}"

static void test_defaults(void **state) {
  (void)state;
  xm_spec_t s;
  load_ok("{" BASE_MODEL ",\"training\":{\"seq_len\":16}}", "some/dir/my-model.json", &s);
  assert_string_equal(s.name, "my-model"); /* from the file name */
  assert_int_equal(s.model.kv_heads, 4);
  assert_int_equal(s.model.head_dim, 32);
  assert_int_equal(s.model.attention, XM_ATTN_MHA);
  assert_true(s.model.rope_theta == 10000);
  assert_true(s.model.norm_eps == 1e-6);
  assert_false(s.model.tied_embeddings);
  assert_int_equal(s.model.qk_norm, XM_QK_NORM_NONE);
  assert_int_equal(s.moe.experts, 0);
  assert_false(xm_spec_layer_is_moe(&s, 1));
  assert_int_equal(s.training.micro_batch, 1);
  assert_int_equal(s.training.global_batch, 1);
  assert_int_equal(s.training.dtype, XM_DTYPE_BF16);
  assert_true(s.training.lr == 3e-4);
  assert_true(s.training.min_lr == 3e-4 / 10);
  assert_int_equal(s.training.lr_schedule, XM_LR_COSINE);
  assert_int_equal(s.training.train_steps, 1000);
  assert_true(s.training.beta1 == 0.9 && s.training.beta2 == 0.95);
  assert_true(s.training.adam_eps == 1e-8);
  assert_true(s.training.weight_decay == 0.1);
  assert_true(s.training.grad_clip == 1.0);
  assert_int_equal(s.training.seed, 1234);
  assert_int_equal(s.training.zero_stage, 0);
  assert_int_equal(s.training.recompute, XM_RECOMPUTE_NONE);
  assert_false(s.parallel.present);
  assert_int_equal(s.parallel.dp, 1);
  assert_false(s.cluster.present);

  /* MoE and layout defaults, some derived from other fields. */
  load_ok("{\"name\":\"m\"," BASE_MODEL ",\"training\":{\"seq_len\":16,\"micro_batch\":2,"
          "\"zero_stage\":1},\"moe\":{\"experts\":16,\"top_k\":4,\"expert_ffn\":64,"
          "\"shared_experts\":2,\"n_group\":4,\"capacity_factor\":1.25},"
          "\"parallel\":{\"dp\":4,\"ep\":4}}",
          "x.json", &s);
  assert_string_equal(s.name, "m");
  assert_int_equal(s.moe.shared_ffn, 128);
  assert_int_equal(s.moe.topk_group, 4);
  assert_true(s.moe.routed_scaling == 1.0);
  assert_true(s.moe.norm_topk_prob);
  assert_true(s.moe.has_capacity);
  assert_true(s.moe.capacity_factor == 1.25);
  assert_true(s.parallel.present);
  assert_int_equal(s.training.global_batch, 8); /* micro_batch * dp */
  assert_int_equal(s.parallel.zero, 1);         /* training.zero_stage */
  assert_int_equal(s.parallel.tp, 1);
  assert_false(s.parallel.ssmb);

  /* null capacity_factor is dropless. */
  load_ok("{" BASE_MODEL ",\"training\":{\"seq_len\":16},\"moe\":{\"experts\":4,\"top_k\":1,"
          "\"expert_ffn\":64,\"capacity_factor\":null}}",
          "x.json", &s);
  assert_false(s.moe.has_capacity);
}

static void test_set_defaults(void **state) {
  (void)state;
  xm_spec_t s;
  memset(&s, 0xff, sizeof s);
  xm_spec_set_defaults(&s);
  assert_string_equal(s.model_type, "xmoec");
  assert_true(s.model.rope_theta == 10000);
  assert_int_equal(s.moe.top_k, 1);
  assert_int_equal(s.moe.n_group, 1);
  assert_int_equal(s.moe.topk_group, 1);
  assert_false(s.moe.has_capacity);
  assert_int_equal(s.training.micro_batch, 1);
  assert_true(s.training.min_lr == 3e-4 / 10);
  assert_true(s.cluster.gemm_efficiency == 0.5);
  assert_false(s.cluster.present);
  assert_false(s.parallel.present);
  assert_int_equal(s.parallel.ep, 1);
}

static void test_full_layout(void **state) {
  (void)state;
  /* Every layout feature at once, with an inline cluster that fits it. */
  xm_spec_t s;
  load_ok(
      "{\"$schema\":\"x\",\"description\":\"d\",\"model\":{\"vocab\":1000,\"hidden\":256,"
      "\"layers\":4,\"heads\":8,\"kv_heads\":4,\"first_k_dense\":1,\"dense_ffn\":512,"
      "\"attention\":\"gqa\",\"qk_norm\":\"head\",\"attention_bias\":true},"
      "\"moe\":{\"experts\":32,\"top_k\":4,\"expert_ffn\":128,\"n_group\":8,\"topk_group\":4,"
      "\"scoring\":\"sigmoid\",\"routed_scaling\":2.5,\"aux_free_gamma\":0.001},"
      "\"training\":{\"seq_len\":64,\"micro_batch\":2,\"global_batch\":32,\"recompute\":\"full\"},"
      "\"parallel\":{\"dp\":8,\"tp\":2,\"ep\":16,\"ssmb\":true,\"rbd\":true},"
      "\"cluster\":{\"name\":\"c\",\"nodes\":2,\"ranks_per_node\":8,\"device_memory_gib\":80,"
      "\"peak_tflops\":400,\"topology\":\"torus\"}}",
      "full.json", &s);
  assert_int_equal(s.model.qk_norm, XM_QK_NORM_HEAD);
  assert_true(s.model.attention_bias);
  assert_int_equal(s.moe.scoring, XM_SCORING_SIGMOID);
  assert_true(s.moe.routed_scaling == 2.5);
  assert_int_equal(s.training.recompute, XM_RECOMPUTE_FULL);
  assert_int_equal(s.parallel.tp, 2);
  assert_int_equal(s.parallel.ep, 16);
  assert_true(s.parallel.ssmb && s.parallel.rbd);
  assert_true(s.cluster.present);
  assert_int_equal(s.cluster.topology, XM_TOPO_TORUS);
  assert_string_equal(s.cluster.name, "c");

  /* MLA with q projected directly (q_lora_rank 0). */
  load_ok("{\"model\":{\"vocab\":1000,\"hidden\":256,\"layers\":2,\"heads\":8,\"dense_ffn\":64,"
          "\"attention\":\"mla\",\"kv_lora_rank\":64,\"qk_nope_head_dim\":32,"
          "\"qk_rope_head_dim\":16,\"v_head_dim\":32},\"training\":{\"seq_len\":8}}",
          "mla.json", &s);
  assert_int_equal(s.model.attention, XM_ATTN_MLA);
  assert_int_equal(s.model.q_lora_rank, 0);
}

static void test_table_and_docs(void **state) {
  (void)state;
  char *docs = NULL;
  size_t len = 0;
  assert_int_equal(xm_read_file(XM_SOURCE_DIR "/docs/spec.md", &docs, &len), 0);
  int n = xm_spec_field_count();
  assert_true(n > 70);
  for (int i = 0; i < n; i++) {
    const xm_spec_field_t *f = xm_spec_field_get(i);
    assert_int_equal(xm_spec_field_find(f->section, f->key), i);
    char quoted[96];
    snprintf(quoted, sizeof quoted, "`%s`", f->key);
    if (!strstr(docs, quoted)) print_error("docs/spec.md lacks %s\n", quoted);
    assert_non_null(strstr(docs, quoted));
    for (int j = 0; f->kind == XM_FIELD_ENUM && f->enum_names[j]; j++) {
      snprintf(quoted, sizeof quoted, "`%s`", f->enum_names[j]);
      if (!strstr(docs, quoted)) print_error("docs/spec.md lacks %s\n", quoted);
      assert_non_null(strstr(docs, quoted));
    }
  }
  assert_non_null(strstr(docs, "## Hugging Face config.json"));
  assert_non_null(strstr(docs, "## Counting"));
  free(docs);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tiny_sample),     cmocka_unit_test(test_xmoe_samples),
      cmocka_unit_test(test_cluster_samples), cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_set_defaults),    cmocka_unit_test(test_full_layout),
      cmocka_unit_test(test_table_and_docs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
