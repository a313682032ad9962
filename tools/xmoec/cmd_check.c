/* tools/xmoec/cmd_check.c — `xmoec check`: validate a model spec (xmoec JSON
 * or Hugging Face config.json) and print its parameter and FLOP counts.
 *
 * The command is the first thing a user runs on a new model, so every
 * problem the loader finds is printed (warnings included) before anything
 * else, and bad input of any kind — flags, files, spec values — exits with 2.
 * The text report puts the numbers users compare against published figures
 * first (total and active parameters) and shows them both rounded and exact;
 * the per-layer table lets them see where the parameters go. With --json the
 * same numbers come out as one JSON document built with cJSON, so that
 * scripts never parse the text form.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "frontend/count.h"
#include "frontend/hf_arch.h"
#include "frontend/spec.h"
#include "support/diag.h"
#include "support/status.h"
#include "tools/xmoec/args.h"
#include "tools/xmoec/commands.h"
#include "tools/xmoec/json_out.h"

/* Sequence length used for the attention FLOPs when the spec has none (a
 * Hugging Face config carries no training section). */
#define CHECK_DEFAULT_SEQ_LEN 4096

typedef struct {
  const char *spec_path;
  const char *cluster_path;
  bool json;
  bool help;
} check_args_t;

static void check_usage(FILE *out) {
  fprintf(out, "usage: xmoec check FILE [--cluster FILE] [--json]\n\n"
               "Validates a model spec (xmoec model JSON or Hugging Face config.json) and\n"
               "prints its parameter counts (total, active per token, per layer) and\n"
               "FLOPs per token.\n\n"
               "  --cluster FILE  also load and check a cluster description\n"
               "  --json          print one JSON document on stdout instead of text\n"
               "  --help          show this help\n");
}

/* Returns false (after a message) on bad flags. */
static const xm_flag_t k_check_flags[] = {
    {"--json", false},
    {"--cluster", true},
    {NULL, false}};

static bool check_parse_args(int argc, char **argv, check_args_t *out) {
  memset(out, 0, sizeof *out);
  if (xm_args_check("check", argc, argv, k_check_flags)) return false;
  memset(out, 0, sizeof *out);
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      out->help = true;
    } else if (strcmp(a, "--json") == 0) {
      out->json = true;
    } else if (strcmp(a, "--cluster") == 0) {
      if (i + 1 >= argc) {
        fprintf(stderr, "xmoec check: error: --cluster needs a file argument\n");
        return false;
      }
      out->cluster_path = argv[++i];
    } else if (strncmp(a, "--cluster=", 10) == 0) {
      out->cluster_path = a + 10;
    } else if (a[0] == '-' && a[1] != '\0') {
      fprintf(stderr, "xmoec check: error: unknown option '%s'\n", a);
      return false;
    } else if (out->spec_path) {
      fprintf(stderr, "xmoec check: error: more than one model file ('%s' and '%s')\n", out->spec_path, a);
      return false;
    } else {
      out->spec_path = a;
    }
  }
  if (!out->help && !out->spec_path) {
    fprintf(stderr, "xmoec check: error: missing model file\n");
    return false;
  }
  if (out->cluster_path && !out->cluster_path[0]) {
    fprintf(stderr, "xmoec check: error: --cluster needs a file argument\n");
    return false;
  }
  return true;
}

/* ---- number formatting --------------------------------------------------- */

/* "46,702,792,704" from a non-negative integer value. */
static void fmt_grouped(double v, char *out, size_t cap) {
  char digits[64];
  snprintf(digits, sizeof digits, "%.0f", v < 0 ? 0 : v);
  size_t n = strlen(digits), k = 0;
  for (size_t i = 0; i < n && k + 2 < cap; i++) {
    if (i > 0 && (n - i) % 3 == 0) out[k++] = ',';
    out[k++] = digits[i];
  }
  out[k] = '\0';
}

/* "46.70B (46,702,792,704)"; `unit` follows the scaled value ("" for
 * parameter counts, " GFLOP"-style suffixes for FLOPs). */
static void fmt_human(double v, bool flops, char *out, size_t cap) {
  static const struct {
    double scale;
    const char *count, *flop;
  } units[] = {
      {1e15, "P", " PFLOP"}, {1e12, "T", " TFLOP"}, {1e9, "B", " GFLOP"},
      {1e6, "M", " MFLOP"},  {1e3, "K", " KFLOP"},
  };
  char exact[64];
  fmt_grouped(v, exact, sizeof exact);
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
    if (v >= units[i].scale) {
      snprintf(out, cap, "%.2f%s (%s)", v / units[i].scale, flops ? units[i].flop : units[i].count,
               exact);
      return;
    }
  }
  snprintf(out, cap, "%s%s", exact, flops ? " FLOP" : "");
}

/* ---- text report ----------------------------------------------------------- */

/* Layers with a dense FFN (all of them in a model without experts). */
static int64_t dense_layers(const xm_spec_t *s) {
  if (s->moe.experts == 0) return s->model.layers;
  return s->model.first_k_dense < s->model.layers ? s->model.first_k_dense : s->model.layers;
}

static void print_summary(const xm_spec_t *s, const xm_count_t *c, int64_t dense, int64_t moe) {
  const xm_model_spec_t *m = &s->model;
  const xm_moe_spec_t *e = &s->moe;
  printf("model: %s (model_type %s)\n", s->name, s->model_type);
  char why[512];
  xm_hf_arch_t arch = xm_hf_arch_match(s, why, sizeof why);
  if (arch == XM_HF_ARCH_XMOEC)
    printf("checkpoints: model_type xmoec (no Hugging Face architecture: %s)\n", why);
  else
    printf("checkpoints: Hugging Face %s (%s)\n", xm_hf_arch_model_type(arch),
           xm_hf_arch_class(arch));
  printf("layers: %" PRId64 " (%" PRId64 " dense, %" PRId64 " MoE), hidden %" PRId64
         ", vocab %" PRId64 ", embeddings %s\n",
         c->num_layers, dense, moe, m->hidden, m->vocab, m->tied_embeddings ? "tied" : "untied");
  if (m->attention == XM_ATTN_MLA)
    printf("attention: mla, %" PRId64 " heads, q_lora_rank %" PRId64 ", kv_lora_rank %" PRId64
           ", qk_nope_head_dim %" PRId64 ", qk_rope_head_dim %" PRId64 ", v_head_dim %" PRId64 "\n",
           m->heads, m->q_lora_rank, m->kv_lora_rank, m->qk_nope_head_dim, m->qk_rope_head_dim,
           m->v_head_dim);
  else
    printf("attention: %s, %" PRId64 " heads, %" PRId64 " kv heads, head_dim %" PRId64 "%s%s\n",
           xm_attn_kind_name(m->attention), m->heads, m->kv_heads, m->head_dim,
           m->attention_bias ? ", q/k/v bias" : "",
           m->qk_norm == XM_QK_NORM_HEAD   ? ", per-head q/k norm"
           : m->qk_norm == XM_QK_NORM_FULL ? ", q/k norm"
                                           : "");
  if (m->rope_interleave || m->yarn_factor > 1) {
    printf("rope: theta %g%s", m->rope_theta, m->rope_interleave ? ", interleaved pairs" : "");
    if (m->yarn_factor > 1)
      printf(", yarn factor %g over %" PRId64 " positions", m->yarn_factor,
             m->yarn_original_max_position);
    printf("\n");
  }
  if (e->experts == 0) {
    printf("moe: none (dense model)\n");
    return;
  }
  printf("moe: %" PRId64 " experts, top_k %" PRId64 ", %" PRId64 " shared", e->experts, e->top_k,
         e->shared_experts);
  if (e->shared_experts > 0)
    printf(" (width %" PRId64 "%s)", e->shared_ffn, e->shared_expert_gate ? ", gated" : "");
  printf(", expert_ffn %" PRId64 ", %s, %s routing", e->expert_ffn,
         xm_activation_name(e->activation), xm_scoring_name(e->scoring));
  if (e->n_group > 1) printf(", %" PRId64 " of %" PRId64 " groups", e->topk_group, e->n_group);
  printf("\n");
}

static void print_row(const char *label, int64_t dense_v, int64_t moe_v, bool has_dense,
                      bool has_moe) {
  char a[64] = "-", b[64] = "-";
  if (has_dense) fmt_grouped((double)dense_v, a, sizeof a);
  if (has_moe) fmt_grouped((double)moe_v, b, sizeof b);
  printf("  %-16s %20s %20s\n", label, a, b);
}

static void print_layer_table(const xm_count_t *c, bool has_dense, bool has_moe) {
  const xm_layer_count_t *d = &c->dense_layer, *m = &c->moe_layer;
  printf("per layer:\n  %-16s %20s %20s\n", "", "dense layer", "MoE layer");
  print_row("attention", d->attention, m->attention, has_dense, has_moe);
  print_row("norms", d->norms, m->norms, has_dense, has_moe);
  print_row("dense ffn", d->dense_ffn, m->dense_ffn, has_dense, has_moe);
  print_row("routed experts", d->routed_experts, m->routed_experts, has_dense, has_moe);
  print_row("shared experts", d->shared_experts, m->shared_experts, has_dense, has_moe);
  print_row("router", d->router, m->router, has_dense, has_moe);
  print_row("total", d->total, m->total, has_dense, has_moe);
  print_row("active", d->active, m->active, has_dense, has_moe);
}

static void print_cluster(const xm_cluster_spec_t *cl) {
  printf("cluster: %s, %" PRId64 " node%s x %" PRId64 " ranks = %" PRId64
         " ranks, %.1f GiB and %.1f TFLOP/s per rank, %s\n",
         cl->name[0] ? cl->name : "(unnamed)", cl->nodes, cl->nodes == 1 ? "" : "s",
         cl->ranks_per_node, cl->nodes * cl->ranks_per_node, cl->device_memory_gib, cl->peak_tflops,
         xm_topology_name(cl->topology));
}

static void print_text(const xm_spec_t *s, const xm_count_t *c, int64_t seq_len,
                       bool seq_defaulted) {
  int64_t dense = dense_layers(s), moe = c->num_layers - dense;
  char buf[96];
  print_summary(s, c, dense, moe);
  printf("parameters:\n");
  fmt_human((double)c->total, false, buf, sizeof buf);
  printf("  total:        %s\n", buf);
  fmt_human((double)c->active, false, buf, sizeof buf);
  printf("  active:       %s per token\n", buf);
  fmt_human((double)c->embeddings, false, buf, sizeof buf);
  printf("  embeddings:   %s\n", buf);
  fmt_human((double)c->final_norm, false, buf, sizeof buf);
  printf("  final norm:   %s\n", buf);
  if (c->mtp_layers > 0) {
    fmt_human((double)c->mtp_total, false, buf, sizeof buf);
    printf("  mtp:          %s in %" PRId64 " module%s, not in the total (a layer, eh_proj and 3 "
           "norms each; embedding and head shared)\n",
           buf, c->mtp_layers, c->mtp_layers == 1 ? "" : "s");
  }
  print_layer_table(c, dense > 0, moe > 0);
  printf("flops per token (seq_len %" PRId64 "%s):\n", seq_len,
         seq_defaulted ? ", assumed: the spec sets none" : "");
  fmt_human(c->flops_per_token_fwd, true, buf, sizeof buf);
  printf("  forward:          %s\n", buf);
  fmt_human(c->flops_per_token_fwdbwd, true, buf, sizeof buf);
  printf("  forward+backward: %s\n", buf);
  if (c->mtp_layers > 0) {
    fmt_human(c->mtp_flops_per_token_fwd, true, buf, sizeof buf);
    printf("  mtp forward:      %s more (x3 with backward)\n", buf);
  }
  if (s->cluster.present) print_cluster(&s->cluster);
}

/* ---- JSON report ----------------------------------------------------------- */

static cJSON *json_layer(const xm_layer_count_t *l) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "attention", (double)l->attention);
  cJSON_AddNumberToObject(o, "norms", (double)l->norms);
  cJSON_AddNumberToObject(o, "dense_ffn", (double)l->dense_ffn);
  cJSON_AddNumberToObject(o, "routed_experts", (double)l->routed_experts);
  cJSON_AddNumberToObject(o, "shared_experts", (double)l->shared_experts);
  cJSON_AddNumberToObject(o, "router", (double)l->router);
  cJSON_AddNumberToObject(o, "total", (double)l->total);
  cJSON_AddNumberToObject(o, "active", (double)l->active);
  return o;
}

static cJSON *json_model(const xm_spec_t *s) {
  const xm_model_spec_t *m = &s->model;
  const xm_moe_spec_t *e = &s->moe;
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "name", s->name);
  cJSON_AddStringToObject(o, "model_type", s->model_type);
  cJSON_AddNumberToObject(o, "vocab", (double)m->vocab);
  cJSON_AddNumberToObject(o, "hidden", (double)m->hidden);
  cJSON_AddNumberToObject(o, "layers", (double)m->layers);
  cJSON_AddStringToObject(o, "attention", xm_attn_kind_name(m->attention));
  cJSON_AddNumberToObject(o, "heads", (double)m->heads);
  cJSON_AddNumberToObject(o, "kv_heads", (double)m->kv_heads);
  cJSON_AddNumberToObject(o, "head_dim", (double)m->head_dim);
  cJSON_AddBoolToObject(o, "tied_embeddings", m->tied_embeddings);
  cJSON_AddNumberToObject(o, "first_k_dense", (double)m->first_k_dense);
  cJSON_AddNumberToObject(o, "dense_ffn", (double)m->dense_ffn);
  cJSON_AddNumberToObject(o, "experts", (double)e->experts);
  cJSON_AddNumberToObject(o, "top_k", (double)e->top_k);
  cJSON_AddNumberToObject(o, "shared_experts", (double)e->shared_experts);
  cJSON_AddNumberToObject(o, "shared_ffn", (double)e->shared_ffn);
  cJSON_AddNumberToObject(o, "expert_ffn", (double)e->expert_ffn);
  cJSON_AddStringToObject(o, "activation", xm_activation_name(e->activation));
  cJSON_AddStringToObject(o, "scoring", xm_scoring_name(e->scoring));
  return o;
}

static cJSON *json_cluster(const xm_cluster_spec_t *cl) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "name", cl->name);
  cJSON_AddNumberToObject(o, "nodes", (double)cl->nodes);
  cJSON_AddNumberToObject(o, "ranks_per_node", (double)cl->ranks_per_node);
  cJSON_AddNumberToObject(o, "world", (double)(cl->nodes * cl->ranks_per_node));
  cJSON_AddNumberToObject(o, "device_memory_gib", cl->device_memory_gib);
  cJSON_AddNumberToObject(o, "peak_tflops", cl->peak_tflops);
  cJSON_AddStringToObject(o, "topology", xm_topology_name(cl->topology));
  return o;
}

static int print_json(const xm_spec_t *s, const xm_count_t *c, int64_t seq_len) {
  int64_t dense = dense_layers(s), moe = c->num_layers - dense;
  cJSON *root = cJSON_CreateObject();
  cJSON_AddItemToObject(root, "model", json_model(s));
  cJSON *layers = cJSON_AddObjectToObject(root, "layers");
  cJSON_AddNumberToObject(layers, "dense", (double)dense);
  cJSON_AddNumberToObject(layers, "moe", (double)moe);
  cJSON_AddNumberToObject(root, "params_total", (double)c->total);
  cJSON_AddNumberToObject(root, "params_active", (double)c->active);
  cJSON_AddNumberToObject(root, "params_embeddings", (double)c->embeddings);
  cJSON_AddNumberToObject(root, "params_final_norm", (double)c->final_norm);
  cJSON *per = cJSON_AddObjectToObject(root, "per_layer");
  cJSON_AddItemToObject(per, "dense", dense > 0 ? json_layer(&c->dense_layer) : cJSON_CreateNull());
  cJSON_AddItemToObject(per, "moe", moe > 0 ? json_layer(&c->moe_layer) : cJSON_CreateNull());
  cJSON_AddNumberToObject(root, "seq_len", (double)seq_len);
  cJSON_AddNumberToObject(root, "flops_per_token_fwd", c->flops_per_token_fwd);
  cJSON_AddNumberToObject(root, "flops_per_token_fwdbwd", c->flops_per_token_fwdbwd);
  cJSON *mtp = cJSON_AddObjectToObject(root, "mtp"); /* outside params_* and flops_* */
  cJSON_AddNumberToObject(mtp, "modules", (double)c->mtp_layers);
  cJSON_AddNumberToObject(mtp, "params_per_module", (double)c->mtp_module);
  cJSON_AddNumberToObject(mtp, "params_total", (double)c->mtp_total);
  cJSON_AddNumberToObject(mtp, "params_active", (double)c->mtp_active);
  cJSON_AddNumberToObject(mtp, "flops_per_token_fwd", c->mtp_flops_per_token_fwd);
  cJSON_AddBoolToObject(root, "trainable", xm_spec_trainable(s));
  char why[512];
  xm_hf_arch_t arch = xm_hf_arch_match(s, why, sizeof why);
  cJSON *ck = cJSON_AddObjectToObject(root, "checkpoint");
  cJSON_AddStringToObject(ck, "model_type", xm_hf_arch_model_type(arch));
  cJSON_AddStringToObject(ck, "architecture", xm_hf_arch_class(arch));
  if (arch == XM_HF_ARCH_XMOEC) cJSON_AddStringToObject(ck, "why", why);
  cJSON *tr = cJSON_AddObjectToObject(root, "training");
  cJSON_AddNumberToObject(tr, "seq_len", (double)s->training.seq_len);
  cJSON_AddNumberToObject(tr, "micro_batch", (double)s->training.micro_batch);
  cJSON_AddNumberToObject(tr, "global_batch", (double)s->training.global_batch);
  if (s->cluster.present) cJSON_AddItemToObject(root, "cluster", json_cluster(&s->cluster));
  return xm_print_json("check", root);
}

/* ---- entry ---------------------------------------------------------------- */

int xm_cmd_check(int argc, char **argv) {
  check_args_t args;
  if (!check_parse_args(argc, argv, &args)) {
    check_usage(stderr);
    return 2;
  }
  if (args.help) {
    check_usage(stdout);
    return 0;
  }
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_spec_t spec;
  xm_status_t st = xm_spec_load_file(args.spec_path, &diag, &spec);
  if (st == XM_OK && args.cluster_path)
    st = xm_spec_load_cluster_file(args.cluster_path, &diag, &spec);
  xm_diag_print(&diag, stderr);
  int errors = xm_diag_error_count(&diag);
  if (st == XM_OK && errors > 0) st = XM_ERR_INVALID_INPUT;
  xm_diag_free(&diag);
  if (st != XM_OK) {
    fprintf(stderr, "xmoec check: failed (%d error%s)\n", errors, errors == 1 ? "" : "s");
    return xm_status_exit_code(st);
  }
  bool seq_defaulted = spec.training.seq_len <= 0;
  if (seq_defaulted) spec.training.seq_len = CHECK_DEFAULT_SEQ_LEN;
  xm_count_t count;
  xm_count_params(&spec, &count);
  if (args.json) return print_json(&spec, &count, spec.training.seq_len);
  print_text(&spec, &count, spec.training.seq_len, seq_defaulted);
  return 0;
}
