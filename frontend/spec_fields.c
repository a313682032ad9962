/* frontend/spec_fields.c — the field table of the xmoec model JSON and the
 * generic reader that walks it.
 *
 * Every key of every section is one line below: where it is stored, its
 * default, its limits, its meaning. Limits are chosen so that every product
 * the counting code forms (vocab*hidden, experts*hidden*expert_ffn*layers,
 * FLOPs per token times tokens) stays far inside int64 and double precision;
 * docs/spec.md states them. The reader never stops at the first problem:
 * each key is checked on its own and a bad value leaves the default, so one
 * pass reports everything wrong with a document.
 */
#include "frontend/spec_fields.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "support/strbuf.h"

static const char *const kAttention[] = {"mha", "gqa", "mla", NULL};
static const char *const kQkNorm[] = {"none", "head", "full", NULL};
static const char *const kActivation[] = {"swiglu", "gelu", NULL};
static const char *const kScoring[] = {"softmax", "sigmoid", NULL};
static const char *const kDtype[] = {"fp32", "bf16", "fp16", NULL};
static const char *const kSchedule[] = {"cosine", "constant", "linear", NULL};
static const char *const kRecompute[] = {"none", "selective", "full", NULL};
static const char *const kTopology[] = {"fat-tree", "dragonfly", "torus", "fat-tree-oversubscribed",
                                        "regional-ocs", NULL};
static const char *const kOcsReconfig[] = {"iteration", "layer", NULL};

#define P2(n) ((double)(1LL << (n)))
#define MEMBER_SIZE(m) sizeof(((xm_spec_t *)0)->m)
#define FIELD(sec, grp, key, kind, def, lo, hi, fl, names, doc)                                    \
  {                                                                                                \
    sec, #key, kind, offsetof(xm_spec_t, grp.key), MEMBER_SIZE(grp.key), 0, def, lo, hi, fl,       \
        names, doc                                                                                 \
  }
#define INT(sec, grp, key, def, lo, hi, fl, doc)                                                   \
  FIELD(sec, grp, key, XM_FIELD_INT, def, lo, hi, fl, NULL, doc)
#define FLT(sec, grp, key, def, lo, hi, fl, doc)                                                   \
  FIELD(sec, grp, key, XM_FIELD_FLOAT, def, lo, hi, fl, NULL, doc)
#define BOOL(sec, grp, key, def, doc) FIELD(sec, grp, key, XM_FIELD_BOOL, def, 0, 1, 0, NULL, doc)
#define ENUM(sec, grp, key, def, names, fl, doc)                                                   \
  FIELD(sec, grp, key, XM_FIELD_ENUM, def, 0, 0, fl, names, doc)

#define M XM_SECTION_MODEL
#define E XM_SECTION_MOE
#define T XM_SECTION_TRAINING
#define C XM_SECTION_CLUSTER
#define L XM_SECTION_PARALLEL
#define REQ XM_FIELD_REQUIRED
#define GT XM_FIELD_MIN_EXCL
#define LT XM_FIELD_MAX_EXCL
#define DER XM_FIELD_DERIVED

static const xm_spec_field_t kFields[] = {
    /* Top level. */
    {XM_SECTION_ROOT, "name", XM_FIELD_STRING, offsetof(xm_spec_t, name), MEMBER_SIZE(name), 0, 0,
     0, 0, 0, NULL, "model name used in outputs"},
    {XM_SECTION_ROOT, "description", XM_FIELD_STRING, 0, 0, 0, 0, 0, 0, XM_FIELD_NO_STORE, NULL,
     "free text, ignored"},
    {XM_SECTION_ROOT, "$schema", XM_FIELD_STRING, 0, 0, 0, 0, 0, 0, XM_FIELD_NO_STORE, NULL,
     "schema reference for editors, ignored"},

    /* model */
    INT(M, model, vocab, 0, 1, P2(24), REQ, "vocabulary size V"),
    INT(M, model, hidden, 0, 1, P2(17), REQ, "hidden size H"),
    INT(M, model, layers, 0, 1, 1024, REQ, "decoder layers L"),
    INT(M, model, heads, 0, 1, 1024, REQ, "query heads"),
    INT(M, model, kv_heads, 0, 1, 1024, DER, "key/value heads; default heads"),
    INT(M, model, head_dim, 0, 1, 2048, DER, "per-head dim; default hidden/heads"),
    FLT(M, model, rope_theta, 10000, 0, 1e9, GT, "RoPE base"),
    FLT(M, model, norm_eps, 1e-6, 0, 0.1, GT, "RMSNorm epsilon"),
    BOOL(M, model, tied_embeddings, 0, "lm_head shares embed_tokens"),
    INT(M, model, first_k_dense, 0, 0, 1024, 0, "leading layers with a dense FFN"),
    INT(M, model, dense_ffn, 0, 0, P2(18), 0, "dense SwiGLU width"),
    ENUM(M, model, attention, XM_ATTN_MHA, kAttention, DER,
         "attention kind; default gqa if kv_heads < heads else mha"),
    BOOL(M, model, attention_bias, 0, "q/k/v projection biases"),
    ENUM(M, model, qk_norm, XM_QK_NORM_NONE, kQkNorm, 0, "RMSNorm of q and k"),
    INT(M, model, q_lora_rank, 0, 0, P2(16), 0, "MLA q compression rank; 0 = none"),
    INT(M, model, kv_lora_rank, 0, 0, P2(16), 0, "MLA kv compression rank"),
    INT(M, model, qk_nope_head_dim, 0, 0, 2048, 0, "MLA non-rotary qk head dim"),
    INT(M, model, qk_rope_head_dim, 0, 0, 2048, 0, "MLA rotary qk head dim"),
    INT(M, model, v_head_dim, 0, 0, 2048, 0, "MLA value head dim"),
    BOOL(M, model, rope_interleave, 0, "RoPE pairs (2i, 2i+1) (DeepSeek's rope_interleave)"),
    FLT(M, model, yarn_factor, 1, 1, 1e4, 0, "YaRN context extension factor; 1 = off"),
    INT(M, model, yarn_original_max_position, 0, 0, P2(24), 0,
        "YaRN pre-extension context length; needed when yarn_factor > 1"),
    FLT(M, model, yarn_beta_fast, 32, 0, 1e4, GT, "YaRN beta_fast (rotations)"),
    FLT(M, model, yarn_beta_slow, 1, 0, 1e4, GT, "YaRN beta_slow (rotations)"),
    FLT(M, model, yarn_mscale, 0, 0, 100, 0, "YaRN mscale; 0 = absent"),
    FLT(M, model, yarn_mscale_all_dim, 0, 0, 100, 0, "YaRN mscale_all_dim; 0 = absent"),
    FLT(M, model, yarn_attention_factor, 0, 0, 100, 0,
        "YaRN factor on cos and sin; 0 = derived from the mscales"),
    BOOL(M, model, yarn_truncate, 1, "YaRN rounds its correction range to whole dims"),
    INT(M, model, mtp_layers, 0, 0, 16, 0, "multi-token prediction modules; 0 = none"),

    /* moe */
    INT(E, moe, experts, 0, 0, 4096, REQ, "routed experts E"),
    INT(E, moe, shared_experts, 0, 0, 64, 0, "shared experts"),
    INT(E, moe, shared_ffn, 0, 0, P2(22), DER,
        "total shared width; default shared_experts*expert_ffn"),
    BOOL(E, moe, shared_expert_gate, 0, "sigmoid gate on the shared output"),
    INT(E, moe, top_k, 1, 1, 64, REQ, "experts chosen per token k"),
    INT(E, moe, expert_ffn, 0, 0, P2(18), REQ, "width of one routed expert"),
    ENUM(E, moe, activation, XM_ACT_SWIGLU, kActivation, 0, "expert activation"),
    ENUM(E, moe, scoring, XM_SCORING_SOFTMAX, kScoring, 0, "router score function"),
    BOOL(E, moe, norm_topk_prob, 1, "renormalise the top-k weights"),
    FLT(E, moe, routed_scaling, 1, 0, 1000, GT, "factor on routed weights"),
    INT(E, moe, n_group, 1, 1, 4096, 0, "expert groups; 1 = no group limit"),
    INT(E, moe, topk_group, 1, 1, 4096, DER, "groups kept; default n_group"),
    FLT(E, moe, aux_alpha, 0, 0, 10, 0, "aux load-balancing loss weight"),
    FLT(E, moe, aux_free_gamma, 0, 0, 1, 0, "aux-free bias update speed"),
    {E, "capacity_factor", XM_FIELD_NULLABLE_FLOAT, offsetof(xm_spec_t, moe.capacity_factor),
     MEMBER_SIZE(moe.capacity_factor), offsetof(xm_spec_t, moe.has_capacity), 0, 0, 1000, GT, NULL,
     "expert capacity factor; null = dropless"},

    /* training */
    INT(T, training, seq_len, 0, 1, P2(22), REQ, "tokens per sequence"),
    INT(T, training, micro_batch, 1, 1, P2(16), 0, "sequences per rank per micro-step"),
    INT(T, training, global_batch, 1, 1, P2(24), DER,
        "sequences per optimizer step; default micro_batch*dp"),
    ENUM(T, training, dtype, XM_DTYPE_BF16, kDtype, 0, "training data type"),
    FLT(T, training, lr, 3e-4, 0, 10, GT, "peak learning rate"),
    FLT(T, training, min_lr, 3e-5, 0, 10, DER, "final learning rate; default lr/10"),
    INT(T, training, warmup_steps, 0, 0, 1e12, 0, "linear warmup steps"),
    ENUM(T, training, lr_schedule, XM_LR_COSINE, kSchedule, 0, "decay after warmup"),
    INT(T, training, train_steps, 1000, 1, 1e12, 0, "steps the schedule spans"),
    FLT(T, training, weight_decay, 0.1, 0, 10, 0, "AdamW decoupled decay"),
    FLT(T, training, beta1, 0.9, 0, 1, LT, "AdamW beta1"),
    FLT(T, training, beta2, 0.95, 0, 1, LT, "AdamW beta2"),
    FLT(T, training, adam_eps, 1e-8, 0, 1, GT, "AdamW epsilon"),
    FLT(T, training, grad_clip, 1.0, 0, 1e6, 0, "global-norm clip; 0 = off"),
    INT(T, training, seed, 1234, 0, P2(53), 0, "random seed"),
    INT(T, training, zero_stage, 0, 0, 1, 0, "ZeRO stage (0 or 1)"),
    ENUM(T, training, recompute, XM_RECOMPUTE_NONE, kRecompute, 0, "activation recomputation"),
    FLT(T, training, mtp_loss_weight, 0.3, 0, 100, 0, "weight of the MTP losses (their mean)"),

    /* cluster (also the top level of a cluster file) */
    {C, "name", XM_FIELD_STRING, offsetof(xm_spec_t, cluster.name), MEMBER_SIZE(cluster.name), 0, 0,
     0, 0, 0, NULL, "cluster name"},
    INT(C, cluster, nodes, 1, 1, P2(20), REQ, "nodes"),
    INT(C, cluster, ranks_per_node, 1, 1, 1024, REQ, "ranks (devices) per node"),
    FLT(C, cluster, device_memory_gib, 0, 0.0625, 1e5, REQ, "memory per device, GiB"),
    FLT(C, cluster, peak_tflops, 0, 0.001, 1e6, REQ, "dense peak per device, TFLOP/s"),
    FLT(C, cluster, gemm_efficiency, 0.5, 0.01, 1, 0, "fraction of peak GEMMs reach"),
    FLT(C, cluster, intra_bw_gbps, 100, 0.001, 1e6, 0, "GB/s per rank inside a node"),
    FLT(C, cluster, intra_latency_us, 2, 0, 1e6, 0, "latency inside a node, us"),
    FLT(C, cluster, inter_bw_gbps, 12.5, 0.001, 1e6, 0, "GB/s per rank across nodes"),
    FLT(C, cluster, inter_latency_us, 5, 0, 1e6, 0, "latency across nodes, us"),
    ENUM(C, cluster, topology, XM_TOPO_FAT_TREE, kTopology, 0, "inter-node network"),
    INT(C, cluster, nic_ports, 0, 0, 1024, 0, "NIC ports per node; 0 = ranks_per_node"),
    FLT(C, cluster, link_gbps, 0, 0, 1e5, 0, "Gb/s per NIC port; 0 = from inter_bw_gbps"),
    INT(C, cluster, switch_radix, 64, 4, 4096, 0, "ports of an electrical switch"),
    FLT(C, cluster, oversubscription, 2, 1, 64, 0, "fat-tree-oversubscribed: leaf down:up"),
    INT(C, cluster, dragonfly_servers_per_router, 0, 0, 1024, 0, "dragonfly: nodes per router"),
    INT(C, cluster, dragonfly_routers_per_group, 0, 0, 1024, 0, "dragonfly: routers per group"),
    INT(C, cluster, dragonfly_global_links, 0, 0, 1024, 0, "dragonfly: global links per router"),
    INT(C, cluster, ocs_region_servers, 0, 0, P2(20), 0, "regional-ocs: nodes per region"),
    INT(C, cluster, ocs_ports, 0, 0, 1024, 0, "regional-ocs: NIC ports per node on the OCS"),
    INT(C, cluster, ocs_switch_ports, 0, 0, P2(20), 0, "regional-ocs: ports of one OCS"),
    FLT(C, cluster, ocs_reconfig_ms, 10, 0, 1e6, 0, "regional-ocs: reconfiguration delay, ms"),
    ENUM(C, cluster, ocs_reconfig, XM_OCS_PER_ITERATION, kOcsReconfig, 0,
         "regional-ocs: reconfigure per iteration or per layer"),
    {C, "gpu_arch", XM_FIELD_STRING, offsetof(xm_spec_t, cluster.gpu_arch),
     MEMBER_SIZE(cluster.gpu_arch), 0, 0, 0, 0, 0, NULL,
     "GPU architecture of compiled kernels (gfx90a, sm_90, ...)"},

    /* parallel */
    INT(L, parallel, dp, 1, 1, P2(24), 0, "data-parallel degree"),
    INT(L, parallel, tp, 1, 1, 1024, 0, "tensor-parallel degree"),
    INT(L, parallel, ep, 1, 1, 4096, 0, "expert-parallel degree"),
    BOOL(L, parallel, ssmb, 0, "sequence-sharded MoE blocks"),
    BOOL(L, parallel, rbd, 0, "redundancy-bypassing dispatch"),
    INT(L, parallel, zero, 0, 0, 1, DER, "ZeRO stage; default training.zero_stage"),
};

#undef M
#undef E
#undef T
#undef C
#undef L

int xm_spec_field_count(void) { return (int)(sizeof kFields / sizeof kFields[0]); }

const xm_spec_field_t *xm_spec_field_get(int i) {
  XM_ASSERT(i >= 0 && i < xm_spec_field_count());
  return &kFields[i];
}

int xm_spec_field_find(xm_spec_section_t section, const char *key) {
  for (int i = 0; i < xm_spec_field_count(); i++)
    if (kFields[i].section == section && strcmp(kFields[i].key, key) == 0) return i;
  return -1;
}

const char *xm_spec_section_name(xm_spec_section_t section) {
  static const char *const names[] = {"", "model", "moe", "training", "cluster", "parallel"};
  XM_ASSERT(section >= 0 && section < XM_SECTION_COUNT_);
  return names[section];
}

/* Stores an integral value into an int/int64/uint64 member. */
static void store_int(const xm_spec_field_t *f, xm_spec_t *spec, int64_t v) {
  char *p = (char *)spec + f->offset;
  if (f->size == sizeof(int)) {
    int x = (int)v;
    memcpy(p, &x, sizeof x);
  } else {
    XM_ASSERT(f->size == sizeof(int64_t));
    memcpy(p, &v, sizeof v);
  }
}

static double load_number(const xm_spec_field_t *f, const xm_spec_t *spec) {
  const char *p = (const char *)spec + f->offset;
  switch (f->kind) {
  case XM_FIELD_INT:
    if (f->size == sizeof(int)) {
      int x;
      memcpy(&x, p, sizeof x);
      return x;
    } else {
      int64_t x;
      memcpy(&x, p, sizeof x);
      return (double)x;
    }
  case XM_FIELD_FLOAT:
  case XM_FIELD_NULLABLE_FLOAT: {
    double x;
    memcpy(&x, p, sizeof x);
    return x;
  }
  default: return 0;
  }
}

static void store_value(const xm_spec_field_t *f, xm_spec_t *spec, double v) {
  char *p = (char *)spec + f->offset;
  switch (f->kind) {
  case XM_FIELD_INT: store_int(f, spec, (int64_t)v); break;
  case XM_FIELD_FLOAT: memcpy(p, &v, sizeof v); break;
  case XM_FIELD_NULLABLE_FLOAT:
    memcpy(p, &v, sizeof v);
    *((bool *)((char *)spec + f->flag_offset)) = true;
    break;
  case XM_FIELD_BOOL: *(bool *)p = v != 0; break;
  case XM_FIELD_ENUM: {
    int x = (int)v;
    memcpy(p, &x, sizeof x);
    break;
  }
  case XM_FIELD_STRING: break;
  }
}

void xm_spec_fields_set_defaults(xm_spec_t *spec) {
  memset(spec, 0, sizeof *spec);
  for (int i = 0; i < xm_spec_field_count(); i++) {
    const xm_spec_field_t *f = &kFields[i];
    if ((f->flags & XM_FIELD_NO_STORE) || f->kind == XM_FIELD_STRING) continue;
    if (f->kind == XM_FIELD_NULLABLE_FLOAT) continue; /* null: no value */
    store_value(f, spec, f->def);
  }
}

/* Shortest text of a number as the user would have written it. */
static void format_number(char *buf, size_t cap, double v) {
  snprintf(buf, cap, "%.15g", v);
  if (strtod(buf, NULL) != v) snprintf(buf, cap, "%.17g", v);
}

/* "[1, 1024]", "(0, 1]" and so on, for range messages. */
static void format_range(char *buf, size_t cap, const xm_spec_field_t *f) {
  char lo[40], hi[40];
  format_number(lo, sizeof lo, f->min);
  format_number(hi, sizeof hi, f->max);
  snprintf(buf, cap, "%c%s, %s%c", (f->flags & XM_FIELD_MIN_EXCL) ? '(' : '[', lo, hi,
           (f->flags & XM_FIELD_MAX_EXCL) ? ')' : ']');
}

/* Checks a number against the field's kind and limits; reports and returns
 * false when it does not fit. */
static bool check_number(const xm_spec_field_t *f, double v, const char *ptr, const char *source,
                         xm_diag_t *diag) {
  char vs[40], range[100];
  format_number(vs, sizeof vs, v);
  format_range(range, sizeof range, f);
  if (!isfinite(v)) {
    xm_diag_add(diag, XM_DIAG_ERROR, source, ptr, "%s is not a finite number", vs);
    return false;
  }
  bool is_int = f->kind == XM_FIELD_INT;
  if (is_int && v != floor(v)) {
    xm_diag_add(diag, XM_DIAG_ERROR, source, ptr, "must be an integer in %s, got %s", range, vs);
    return false;
  }
  bool low = (f->flags & XM_FIELD_MIN_EXCL) ? !(v > f->min) : !(v >= f->min);
  bool high = (f->flags & XM_FIELD_MAX_EXCL) ? !(v < f->max) : !(v <= f->max);
  if (low || high) {
    xm_diag_add(diag, XM_DIAG_ERROR, source, ptr, "%s %s is out of range %s",
                is_int ? "integer" : "value", vs, range);
    return false;
  }
  return true;
}

static const char *json_type_name(const cJSON *v) {
  if (cJSON_IsNull(v)) return "null";
  if (cJSON_IsBool(v)) return "a boolean";
  if (cJSON_IsNumber(v)) return "a number";
  if (cJSON_IsString(v)) return "a string";
  if (cJSON_IsArray(v)) return "an array";
  if (cJSON_IsObject(v)) return "an object";
  return "an invalid value";
}

static const char *kind_name(xm_field_kind_t k) {
  switch (k) {
  case XM_FIELD_INT: return "an integer";
  case XM_FIELD_FLOAT: return "a number";
  case XM_FIELD_BOOL: return "true or false";
  case XM_FIELD_ENUM: return "a string";
  case XM_FIELD_STRING: return "a string";
  case XM_FIELD_NULLABLE_FLOAT: return "a number or null";
  }
  return "?";
}

const char *xm_spec_quoted_hint(const cJSON *v, bool want_bool) {
  if (!cJSON_IsString(v) || !v->valuestring[0]) return "";
  if (want_bool)
    return strcmp(v->valuestring, "true") == 0 || strcmp(v->valuestring, "false") == 0
               ? "; write true or false without quotes"
               : "";
  char *end = NULL;
  (void)strtod(v->valuestring, &end);
  return end && !*end ? "; write the number without quotes" : "";
}

static bool read_enum(const xm_spec_field_t *f, const cJSON *v, const char *ptr, const char *source,
                      xm_diag_t *diag, xm_spec_t *spec) {
  for (int j = 0; f->enum_names[j]; j++)
    if (strcmp(v->valuestring, f->enum_names[j]) == 0) {
      store_value(f, spec, j);
      return true;
    }
  xm_strbuf_t allowed;
  xm_strbuf_init(&allowed);
  for (int j = 0; f->enum_names[j]; j++) {
    if (j) xm_strbuf_puts(&allowed, ", ");
    xm_strbuf_put_quoted(&allowed, f->enum_names[j]);
  }
  xm_strbuf_t got;
  xm_strbuf_init(&got);
  xm_strbuf_put_quoted(&got, v->valuestring);
  xm_diag_add(diag, XM_DIAG_ERROR, source, ptr, "unknown value %s; expected one of %s",
              xm_strbuf_cstr(&got), xm_strbuf_cstr(&allowed));
  xm_strbuf_free(&got);
  xm_strbuf_free(&allowed);
  return false;
}

static bool read_string(const xm_spec_field_t *f, const cJSON *v, const char *ptr,
                        const char *source, xm_diag_t *diag, xm_spec_t *spec) {
  size_t n = strlen(v->valuestring);
  /* Text without control characters (a description may have line breaks):
   * names end up in file names, config.json and messages. */
  const char *allowed = strcmp(f->key, "description") == 0 ? "\t\n\r" : "";
  long long bad = xm_utf8_bad_at(v->valuestring, n, allowed);
  if (bad >= 0) {
    xm_diag_add(diag, XM_DIAG_ERROR, source, ptr,
                "byte %lld (0x%02x) is a control character or not valid UTF-8: the value must be "
                "printable text",
                bad, (unsigned char)v->valuestring[bad]);
    return false;
  }
  if (f->flags & XM_FIELD_NO_STORE) return true;
  if (n >= f->size) {
    xm_diag_add(diag, XM_DIAG_ERROR, source, ptr, "string of %zu bytes is too long (at most %zu)",
                n, f->size - 1);
    return false;
  }
  memcpy((char *)spec + f->offset, v->valuestring, n + 1);
  return true;
}

/* Reads one JSON value into field f; reports and returns false on a wrong
 * type or value. */
static bool read_value(const xm_spec_field_t *f, const cJSON *v, const char *ptr,
                       const char *source, xm_diag_t *diag, xm_spec_t *spec) {
  bool type_ok = false;
  switch (f->kind) {
  case XM_FIELD_INT:
  case XM_FIELD_FLOAT: type_ok = cJSON_IsNumber(v); break;
  case XM_FIELD_NULLABLE_FLOAT: type_ok = cJSON_IsNumber(v) || cJSON_IsNull(v); break;
  case XM_FIELD_BOOL: type_ok = cJSON_IsBool(v); break;
  case XM_FIELD_ENUM:
  case XM_FIELD_STRING: type_ok = cJSON_IsString(v) && v->valuestring; break;
  }
  if (!type_ok) {
    /* What the field is, and the fix when the value is merely quoted. */
    const char *hint = f->kind == XM_FIELD_INT || f->kind == XM_FIELD_FLOAT ||
                               f->kind == XM_FIELD_NULLABLE_FLOAT || f->kind == XM_FIELD_BOOL
                           ? xm_spec_quoted_hint(v, f->kind == XM_FIELD_BOOL)
                           : "";
    xm_diag_add(diag, XM_DIAG_ERROR, source, ptr, "expected %s (%s), got %s%s",
                f->kind == XM_FIELD_ENUM ? "one of the names below" : kind_name(f->kind),
                f->doc ? f->doc : f->key, json_type_name(v), hint);
    if (f->kind == XM_FIELD_ENUM) {
      xm_strbuf_t allowed;
      xm_strbuf_init(&allowed);
      for (int j = 0; f->enum_names[j]; j++) {
        if (j) xm_strbuf_puts(&allowed, ", ");
        xm_strbuf_put_quoted(&allowed, f->enum_names[j]);
      }
      xm_diag_add(diag, XM_DIAG_NOTE, source, ptr, "allowed: %s", xm_strbuf_cstr(&allowed));
      xm_strbuf_free(&allowed);
    }
    return false;
  }
  switch (f->kind) {
  case XM_FIELD_BOOL: store_value(f, spec, cJSON_IsTrue(v) ? 1 : 0); return true;
  case XM_FIELD_ENUM: return read_enum(f, v, ptr, source, diag, spec);
  case XM_FIELD_STRING: return read_string(f, v, ptr, source, diag, spec);
  case XM_FIELD_NULLABLE_FLOAT:
    if (cJSON_IsNull(v)) {
      *((bool *)((char *)spec + f->flag_offset)) = false;
      return true;
    }
    /* fall through */
  case XM_FIELD_INT:
  case XM_FIELD_FLOAT:
    if (!check_number(f, v->valuedouble, ptr, source, diag)) return false;
    store_value(f, spec, v->valuedouble);
    return true;
  }
  return false;
}

void xm_json_pointer_append(char *ptr, size_t cap, const char *key) {
  size_t n = strlen(ptr);
  if (n + 1 >= cap) return;
  ptr[n++] = '/';
  for (const char *k = key; *k && n + 3 < cap; k++) {
    if (*k == '~' || *k == '/') {
      ptr[n++] = '~';
      ptr[n++] = *k == '~' ? '0' : '1';
    } else {
      ptr[n++] = *k;
    }
  }
  ptr[n] = '\0';
}

/* Closest key of the section by edit distance, or NULL when nothing is close
 * enough to be a likely typo. */
static const char *nearest_key(xm_spec_section_t section, const char *key) {
  const char *best = NULL;
  int best_d = 1 << 30;
  for (int i = 0; i < xm_spec_field_count(); i++) {
    if (kFields[i].section != section) continue;
    int d = xm_edit_distance(key, kFields[i].key);
    if (d < best_d) best_d = d, best = kFields[i].key;
  }
  for (int s = XM_SECTION_MODEL; section == XM_SECTION_ROOT && s < XM_SECTION_COUNT_; s++) {
    const char *name = xm_spec_section_name((xm_spec_section_t)s);
    int d = xm_edit_distance(key, name);
    if (d < best_d) best_d = d, best = name;
  }
  int len = (int)strlen(key);
  int limit = len / 3 > 2 ? len / 3 : 2;
  return best_d <= limit ? best : NULL;
}

static void report_unknown_key(xm_spec_section_t section, const char *key, const char *ptr,
                               const char *source, xm_diag_t *diag) {
  const char *near = nearest_key(section, key);
  if (near) {
    xm_diag_add(diag, XM_DIAG_ERROR, source, ptr, "unknown key \"%s\"; did you mean \"%s\"?", key,
                near);
    return;
  }
  /* A key put in the wrong section is a common slip: say where it belongs. */
  for (int s = XM_SECTION_MODEL; s < XM_SECTION_COUNT_; s++) {
    if (s != (int)section && xm_spec_field_find((xm_spec_section_t)s, key) >= 0) {
      xm_diag_add(diag, XM_DIAG_ERROR, source, ptr,
                  "unknown key \"%s\"; it belongs in the \"%s\" section", key,
                  xm_spec_section_name((xm_spec_section_t)s));
      return;
    }
  }
  xm_diag_add(diag, XM_DIAG_ERROR, source, ptr, "unknown key \"%s\" (docs/spec.md lists the keys)",
              key);
}

static bool is_section_name(const char *key) {
  for (int s = XM_SECTION_MODEL; s < XM_SECTION_COUNT_; s++)
    if (strcmp(key, xm_spec_section_name((xm_spec_section_t)s)) == 0) return true;
  return false;
}

int xm_spec_fields_read(const cJSON *obj, xm_spec_section_t section, const char *prefix,
                        const char *source, xm_diag_t *diag, xm_spec_t *spec, bool *given) {
  int before = xm_diag_error_count(diag);
  char ptr[256];
  for (const cJSON *v = obj->child; v; v = v->next) {
    const char *key = v->string ? v->string : "";
    snprintf(ptr, sizeof ptr, "%s", prefix);
    xm_json_pointer_append(ptr, sizeof ptr, key);
    int i = xm_spec_field_find(section, key);
    if (i < 0) {
      /* Section objects of the root are read by the caller. */
      if (section == XM_SECTION_ROOT && is_section_name(key)) continue;
      report_unknown_key(section, key, ptr, source, diag);
      continue;
    }
    if (given[i]) {
      xm_diag_add(diag, XM_DIAG_ERROR, source, ptr, "duplicate key \"%s\"", key);
      continue;
    }
    given[i] = true;
    read_value(&kFields[i], v, ptr, source, diag, spec);
  }
  for (int i = 0; i < xm_spec_field_count(); i++) {
    const xm_spec_field_t *f = &kFields[i];
    if (f->section != section || !(f->flags & XM_FIELD_REQUIRED) || given[i]) continue;
    snprintf(ptr, sizeof ptr, "%s", prefix);
    xm_json_pointer_append(ptr, sizeof ptr, f->key);
    xm_diag_add(diag, XM_DIAG_ERROR, source, ptr, "missing required field \"%s\" (%s)", f->key,
                f->doc);
  }
  return xm_diag_error_count(diag) - before;
}

bool xm_spec_field_check_stored(int i, const xm_spec_t *spec, const char *pointer,
                                const char *source, xm_diag_t *diag) {
  const xm_spec_field_t *f = xm_spec_field_get(i);
  switch (f->kind) {
  case XM_FIELD_INT:
  case XM_FIELD_FLOAT: return check_number(f, load_number(f, spec), pointer, source, diag);
  case XM_FIELD_NULLABLE_FLOAT:
    if (!*((const bool *)((const char *)spec + f->flag_offset))) return true;
    return check_number(f, load_number(f, spec), pointer, source, diag);
  case XM_FIELD_ENUM: {
    int x;
    memcpy(&x, (const char *)spec + f->offset, sizeof x);
    int n = 0;
    while (f->enum_names[n])
      n++;
    if (x >= 0 && x < n) return true;
    xm_diag_add(diag, XM_DIAG_ERROR, source, pointer, "enum value %d is out of range", x);
    return false;
  }
  case XM_FIELD_BOOL:
  case XM_FIELD_STRING: return true;
  }
  return true;
}
