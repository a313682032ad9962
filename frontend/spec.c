/* frontend/spec.c — loading and checking an xm_spec_t.
 *
 * Loading runs in stages, each of which reports every problem it sees and
 * keeps going: JSON syntax (line:column), shape of the document (sections
 * are objects), per-field type and range checks (frontend/spec_fields.c),
 * defaults that depend on other fields (head_dim = hidden/heads, ...), and
 * finally the semantic checks between fields (this file). A bad value keeps
 * its default, so the later stages still run on something sane; checks that
 * divide or compare guard against values that are zero because a required
 * field was missing, so one mistake yields one message, not a cascade.
 *
 * A document with a top-level "model_type" string is a Hugging Face
 * config.json and goes to frontend/hf_config.c instead of the field table;
 * the same defaults and semantic checks then apply to what it produced.
 */
#include "frontend/spec.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "frontend/hf_config.h"
#include "frontend/spec_fields.h"
#include "support/strbuf.h"

/* One message per place: a field that already has an error (a missing
 * required field, say) is not reported again by a later check. */
__attribute__((format(printf, 4, 5))) static void
report_once(xm_diag_t *diag, const char *source, const char *ptr, const char *fmt, ...) {
  for (int i = 0; i < diag->count; i++) {
    const xm_diag_entry_t *e = &diag->entries[i];
    if (e->level == XM_DIAG_ERROR && e->place && strcmp(e->place, ptr) == 0 &&
        (e->file == source || (e->file && source && strcmp(e->file, source) == 0)))
      return;
  }
  va_list ap;
  va_start(ap, fmt);
  xm_diag_addv(diag, XM_DIAG_ERROR, source, ptr, fmt, ap);
  va_end(ap);
}

#define ERR(ptr, ...) report_once(diag, source, ptr, __VA_ARGS__)
#define WARN(ptr, ...) xm_diag_add(diag, XM_DIAG_WARNING, source, ptr, __VA_ARGS__)

/* ---- defaults -------------------------------------------------------- */

/* Fills the fields whose default depends on others. `given` says which
 * fields the document set (NULL after a Hugging Face import: then a zero
 * value means "not set"). */
static void resolve_derived(xm_spec_t *s, const bool *given) {
#define GIVEN(sec, key) (given && given[xm_spec_field_find(sec, key)])
  xm_model_spec_t *m = &s->model;
  if (!GIVEN(XM_SECTION_MODEL, "kv_heads") && (given || m->kv_heads == 0)) m->kv_heads = m->heads;
  if (!GIVEN(XM_SECTION_MODEL, "head_dim") && (given || m->head_dim == 0) && m->heads > 0)
    m->head_dim = m->hidden / m->heads;
  if (!GIVEN(XM_SECTION_MODEL, "attention") && (given || m->attention == XM_ATTN_MHA))
    m->attention = m->kv_heads < m->heads ? XM_ATTN_GQA : XM_ATTN_MHA;
  xm_moe_spec_t *e = &s->moe;
  if (!GIVEN(XM_SECTION_MOE, "shared_ffn") && (given || e->shared_ffn == 0))
    e->shared_ffn = e->shared_experts * e->expert_ffn;
  if (!GIVEN(XM_SECTION_MOE, "topk_group") && (given || e->topk_group == 0))
    e->topk_group = e->n_group;
  xm_training_spec_t *t = &s->training;
  if (!GIVEN(XM_SECTION_TRAINING, "min_lr") && given) t->min_lr = t->lr / 10;
  if (!GIVEN(XM_SECTION_TRAINING, "global_batch") && given)
    t->global_batch = t->micro_batch * s->parallel.dp;
  if (!GIVEN(XM_SECTION_PARALLEL, "zero") && given) s->parallel.zero = t->zero_stage;
#undef GIVEN
}

void xm_spec_set_defaults(xm_spec_t *spec) {
  xm_spec_fields_set_defaults(spec);
  snprintf(spec->name, sizeof spec->name, "model");
  snprintf(spec->model_type, sizeof spec->model_type, "xmoec");
  bool none[256] = {false};
  XM_ASSERT(xm_spec_field_count() <= 256);
  resolve_derived(spec, none);
}

/* ---- semantic checks ------------------------------------------------- */

static void check_attention(const xm_model_spec_t *m, const char *source, xm_diag_t *diag) {
  if (m->kv_heads > 0 && m->heads > 0) {
    if (m->kv_heads > m->heads)
      ERR("/model/kv_heads", "kv_heads (%lld) must not exceed heads (%lld)", (long long)m->kv_heads,
          (long long)m->heads);
    else if (m->heads % m->kv_heads != 0)
      ERR("/model/kv_heads", "heads (%lld) must be a multiple of kv_heads (%lld)",
          (long long)m->heads, (long long)m->kv_heads);
    else if (m->attention == XM_ATTN_MHA && m->kv_heads != m->heads)
      ERR("/model/attention", "\"mha\" needs kv_heads == heads (%lld != %lld); use \"gqa\"",
          (long long)m->kv_heads, (long long)m->heads);
  }
  /* heads*head_dim is the width of q; it need not equal hidden (Qwen3). */
  const int64_t width_max = (int64_t)1 << 18;
  if (m->heads * m->head_dim > width_max)
    ERR("/model/head_dim", "heads*head_dim = %lld exceeds %lld",
        (long long)(m->heads * m->head_dim), (long long)width_max);
  if (m->attention != XM_ATTN_MLA && m->head_dim % 2 != 0)
    ERR("/model/head_dim", "head_dim (%lld) must be even for rotary embeddings",
        (long long)m->head_dim);
  if (m->attention == XM_ATTN_MLA) {
    static const char *const keys[] = {"kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                       "v_head_dim"};
    const int64_t vals[] = {m->kv_lora_rank, m->qk_nope_head_dim, m->qk_rope_head_dim,
                            m->v_head_dim};
    for (int i = 0; i < 4; i++) {
      char ptr[64];
      snprintf(ptr, sizeof ptr, "/model/%s", keys[i]);
      if (vals[i] <= 0) ERR(ptr, "%s must be > 0 when attention is \"mla\"", keys[i]);
    }
    if (m->qk_rope_head_dim % 2 != 0)
      ERR("/model/qk_rope_head_dim", "qk_rope_head_dim (%lld) must be even",
          (long long)m->qk_rope_head_dim);
    /* MLA has neither: training without them would train another model. */
    if (m->qk_norm != XM_QK_NORM_NONE)
      ERR("/model/qk_norm", "qk_norm must be \"none\" with attention \"mla\" (its q and kv "
          "latents have their own norms, q_a_layernorm and kv_a_layernorm)");
    if (m->attention_bias)
      ERR("/model/attention_bias",
          "attention_bias is not modelled for attention \"mla\" (DeepSeek-V2/V3 have none)");
  }
  if (m->yarn_factor > 1 && m->yarn_original_max_position < 1)
    ERR("/model/yarn_original_max_position",
        "yarn_factor %g needs yarn_original_max_position, the context length before the "
        "extension (HF's rope_scaling.original_max_position_embeddings)",
        m->yarn_factor);
  if (m->yarn_beta_fast < m->yarn_beta_slow)
    ERR("/model/yarn_beta_fast", "yarn_beta_fast (%g) must be >= yarn_beta_slow (%g)",
        m->yarn_beta_fast, m->yarn_beta_slow);
}

static void check_layers(const xm_spec_t *s, const char *source, xm_diag_t *diag) {
  const xm_model_spec_t *m = &s->model;
  if (m->first_k_dense > m->layers)
    ERR("/model/first_k_dense", "first_k_dense (%lld) exceeds layers (%lld)",
        (long long)m->first_k_dense, (long long)m->layers);
  bool has_dense = s->moe.experts == 0 || m->first_k_dense > 0;
  if (has_dense && m->layers > 0 && m->dense_ffn <= 0)
    ERR("/model/dense_ffn", "dense_ffn must be > 0: the model has dense layers (%s)",
        s->moe.experts == 0 ? "no experts" : "first_k_dense > 0");
  if (s->moe.experts > 0 && m->layers > 0 && m->first_k_dense == m->layers)
    WARN("/model/first_k_dense", "every layer is dense; the experts are never used");
  if (m->mtp_layers > 0 && m->mtp_layers >= s->training.seq_len)
    ERR("/model/mtp_layers",
        "mtp_layers (%lld) must be below seq_len (%lld): module k predicts token i+k+1 of "
        "each sequence",
        (long long)m->mtp_layers, (long long)s->training.seq_len);
  if (m->mtp_layers > 0 && m->layers + m->mtp_layers > 1024)
    ERR("/model/mtp_layers", "layers + mtp_layers (%lld) exceeds 1024",
        (long long)(m->layers + m->mtp_layers));
}

static void check_routing(const xm_moe_spec_t *e, const char *source, xm_diag_t *diag) {
  if (e->top_k > e->experts) {
    ERR("/moe/top_k", "top_k (%lld) exceeds experts (%lld)", (long long)e->top_k,
        (long long)e->experts);
    return;
  }
  if (e->n_group <= 0 || e->topk_group <= 0) return;
  if (e->experts % e->n_group != 0) {
    ERR("/moe/n_group", "experts (%lld) must be a multiple of n_group (%lld)",
        (long long)e->experts, (long long)e->n_group);
    return;
  }
  if (e->topk_group > e->n_group) {
    ERR("/moe/topk_group", "topk_group (%lld) exceeds n_group (%lld)", (long long)e->topk_group,
        (long long)e->n_group);
    return;
  }
  int64_t per_group = e->experts / e->n_group;
  if (e->top_k > e->topk_group * per_group)
    ERR("/moe/top_k",
        "top_k (%lld) exceeds the experts of the kept groups (topk_group*experts/n_group"
        " = %lld)",
        (long long)e->top_k, (long long)(e->topk_group * per_group));
  /* Sigmoid group scores sum the two best experts of a group. */
  if (e->n_group > 1 && e->scoring == XM_SCORING_SIGMOID && per_group < 2)
    ERR("/moe/n_group", "sigmoid group routing needs at least 2 experts per group");
}

static void check_moe(const xm_moe_spec_t *e, const char *source, xm_diag_t *diag) {
  if (e->experts == 0) return;
  if (e->expert_ffn <= 0) ERR("/moe/expert_ffn", "expert_ffn must be > 0 when experts > 0");
  check_routing(e, source, diag);
  if (e->shared_experts > 0 && e->shared_ffn <= 0)
    ERR("/moe/shared_ffn", "shared_ffn must be > 0 when shared_experts > 0");
  if (e->shared_experts == 0 && e->shared_ffn > 0)
    ERR("/moe/shared_experts", "shared_ffn is %lld but shared_experts is 0",
        (long long)e->shared_ffn);
  if (e->shared_experts == 0 && e->shared_expert_gate)
    ERR("/moe/shared_expert_gate", "shared_expert_gate needs shared_experts > 0");
}

static void check_training(const xm_spec_t *s, const char *source, xm_diag_t *diag) {
  const xm_training_spec_t *t = &s->training;
  if (t->micro_batch > 0 && t->global_batch % t->micro_batch != 0)
    ERR("/training/global_batch", "global_batch (%lld) must be a multiple of micro_batch (%lld)",
        (long long)t->global_batch, (long long)t->micro_batch);
  else if (s->parallel.present && t->micro_batch > 0 && s->parallel.dp > 0 &&
           t->global_batch % (t->micro_batch * s->parallel.dp) != 0)
    ERR("/training/global_batch", "global_batch (%lld) must be a multiple of micro_batch*dp (%lld)",
        (long long)t->global_batch, (long long)(t->micro_batch * s->parallel.dp));
  const int64_t tokens_max = (int64_t)1 << 40;
  if (t->global_batch * t->seq_len > tokens_max)
    ERR("/training/global_batch", "global_batch*seq_len = %lld tokens exceeds %lld",
        (long long)(t->global_batch * t->seq_len), (long long)tokens_max);
  if (t->min_lr > t->lr) ERR("/training/min_lr", "min_lr (%g) exceeds lr (%g)", t->min_lr, t->lr);
  if (t->warmup_steps > t->train_steps)
    ERR("/training/warmup_steps", "warmup_steps (%lld) exceeds train_steps (%lld)",
        (long long)t->warmup_steps, (long long)t->train_steps);
}

static void check_parallel(const xm_spec_t *s, const char *source, xm_diag_t *diag) {
  const xm_parallel_spec_t *p = &s->parallel;
  const xm_model_spec_t *m = &s->model;
  if (!p->present || p->dp <= 0 || p->tp <= 0 || p->ep <= 0) return;
  int64_t experts = s->moe.experts;
  if (experts == 0 && p->ep > 1)
    ERR("/parallel/ep", "ep (%lld) > 1 needs experts; the model is dense", (long long)p->ep);
  else if (experts > 0 && experts % p->ep != 0)
    ERR("/parallel/ep", "ep (%lld) must divide experts (%lld)", (long long)p->ep,
        (long long)experts);
  if ((p->dp * p->tp) % p->ep != 0)
    ERR("/parallel/ep", "ep (%lld) must divide dp*tp (%lld)", (long long)p->ep,
        (long long)(p->dp * p->tp));
  if (m->heads > 0 && m->heads % p->tp != 0)
    ERR("/parallel/tp", "tp (%lld) must divide heads (%lld)", (long long)p->tp,
        (long long)m->heads);
  else if (m->kv_heads > 0 && m->kv_heads % p->tp != 0)
    ERR("/parallel/tp", "tp (%lld) must divide kv_heads (%lld)", (long long)p->tp,
        (long long)m->kv_heads);
  bool has_dense = experts == 0 || m->first_k_dense > 0;
  if (has_dense && m->dense_ffn > 0 && m->dense_ffn % p->tp != 0)
    ERR("/parallel/tp", "tp (%lld) must divide dense_ffn (%lld)", (long long)p->tp,
        (long long)m->dense_ffn);
  int64_t tokens = s->training.micro_batch * s->training.seq_len;
  if (p->ssmb && p->tp < 2)
    ERR("/parallel/ssmb", "ssmb shards MoE blocks over the TP group and needs tp > 1");
  else if (p->ssmb && tokens % p->tp != 0)
    ERR("/parallel/ssmb", "ssmb needs micro_batch*seq_len (%lld) divisible by tp (%lld)",
        (long long)tokens, (long long)p->tp);
  if (p->ssmb && experts == 0) ERR("/parallel/ssmb", "ssmb needs MoE layers; the model is dense");
  if (p->rbd && p->ep < 2)
    ERR("/parallel/rbd", "rbd deduplicates expert dispatch across EP ranks and needs ep > 1");
  if (p->zero != s->training.zero_stage)
    ERR("/parallel/zero", "zero (%d) differs from training.zero_stage (%d)", p->zero,
        s->training.zero_stage);
}

/* Checks that involve the cluster. `in_file` means the cluster came from
 * its own document: pointers then name that document's fields. */
static void check_cluster(const xm_spec_t *s, bool in_file, const char *source, xm_diag_t *diag) {
  const xm_cluster_spec_t *c = &s->cluster;
  const xm_parallel_spec_t *p = &s->parallel;
  if (!c->present || c->nodes <= 0 || c->ranks_per_node <= 0) return;
  const char *nodes_ptr = in_file ? "/nodes" : "/cluster/nodes";
  int64_t world = c->nodes * c->ranks_per_node;
  const int64_t world_max = (int64_t)1 << 24;
  if (world > world_max) {
    ERR(nodes_ptr, "nodes*ranks_per_node = %lld exceeds %lld", (long long)world,
        (long long)world_max);
    return;
  }
  if (!p->present || p->dp <= 0 || p->tp <= 0 || p->ep <= 0) return;
  if (p->dp * p->tp != world) {
    if (in_file)
      ERR(nodes_ptr,
          "the cluster has %lld ranks (nodes*ranks_per_node) but the model's "
          "/parallel layout needs dp*tp = %lld",
          (long long)world, (long long)(p->dp * p->tp));
    else
      ERR("/parallel/dp", "dp*tp (%lld) must equal nodes*ranks_per_node (%lld)",
          (long long)(p->dp * p->tp), (long long)world);
  }
  if (world % p->ep != 0)
    ERR(in_file ? nodes_ptr : "/parallel/ep", "ep (%lld) must divide the %lld ranks",
        (long long)p->ep, (long long)world);
  if (p->tp > c->ranks_per_node)
    WARN("/parallel/tp", "tp (%lld) spans nodes (ranks_per_node %lld): slow", (long long)p->tp,
         (long long)c->ranks_per_node);
  if (p->rbd && p->ep <= c->ranks_per_node)
    WARN("/parallel/rbd", "rbd has no effect when the EP group fits in one node");
}

/* Range checks of stored values; `only` limits them to the fields it marks
 * (NULL: every field of the sections that are present). */
static void check_ranges(const xm_spec_t *s, const bool *only, const char *source,
                         xm_diag_t *diag) {
  for (int i = 0; i < xm_spec_field_count(); i++) {
    const xm_spec_field_t *f = xm_spec_field_get(i);
    if (only && !only[i]) continue;
    if (f->flags & XM_FIELD_NO_STORE) continue;
    if (f->section == XM_SECTION_CLUSTER && !s->cluster.present) continue;
    if (f->section == XM_SECTION_MOE && s->moe.experts == 0 && strcmp(f->key, "experts") != 0)
      continue; /* a dense model's moe fields are never used */
    char ptr[96] = "";
    if (f->section != XM_SECTION_ROOT)
      snprintf(ptr, sizeof ptr, "/%s", xm_spec_section_name(f->section));
    xm_json_pointer_append(ptr, sizeof ptr, f->key);
    xm_spec_field_check_stored(i, s, ptr, source, diag);
  }
}

static void check_semantics(const xm_spec_t *spec, const char *source, xm_diag_t *diag) {
  check_attention(&spec->model, source, diag);
  check_layers(spec, source, diag);
  check_moe(&spec->moe, source, diag);
  check_training(spec, source, diag);
  check_parallel(spec, source, diag);
  check_cluster(spec, false, source, diag);
}

void xm_spec_validate(const xm_spec_t *spec, const char *source, xm_diag_t *diag) {
  check_ranges(spec, NULL, source, diag);
  check_semantics(spec, source, diag);
}

/* ---- parsing --------------------------------------------------------- */

/* Parses `text` into a cJSON tree; reports empty documents, NUL bytes and
 * syntax errors (with line:column) and returns NULL for them. */
static cJSON *parse_json(const char *text, size_t len, const char *source, xm_diag_t *diag) {
  size_t start = 0;
  while (start < len && strchr(" \t\r\n", text[start]) && text[start])
    start++;
  if (start == len) {
    ERR("", "the document is empty");
    return NULL;
  }
  const char *nul = memchr(text, '\0', len);
  if (nul) {
    ERR("", "the document contains a NUL byte at offset %zu", (size_t)(nul - text));
    return NULL;
  }
  /* JSON text is UTF-8 (RFC 8259): anything else would reach config.json
   * and the names of the outputs, which other tools then cannot read. */
  long long bad = xm_utf8_bad_at(text, len, NULL);
  if (bad >= 0) {
    int line = 1, col = 1;
    for (long long i = 0; i < bad; i++) {
      if (text[i] == '\n')
        line++, col = 1;
      else
        col++;
    }
    char place[48];
    snprintf(place, sizeof place, "%d:%d", line, col);
    ERR(place, "byte 0x%02x at offset %lld is not valid UTF-8 (a JSON document must be UTF-8)",
        (unsigned char)text[bad], bad);
    return NULL;
  }
  /* cJSON wants the terminator inside the length to check for trailing text. */
  char *buf = malloc(len + 1);
  XM_ASSERT(buf != NULL);
  memcpy(buf, text, len);
  buf[len] = '\0';
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(buf, len + 1, &end, 1);
  if (!root) {
    size_t off = end && end >= buf && end <= buf + len ? (size_t)(end - buf) : len;
    int line = 1, col = 1;
    for (size_t i = 0; i < off; i++) {
      if (buf[i] == '\n')
        line++, col = 1;
      else
        col++;
    }
    char place[48], near[24];
    snprintf(place, sizeof place, "%d:%d", line, col);
    size_t n = 0;
    for (size_t i = off; i < len && n < 16 && buf[i] != '\n'; i++)
      near[n++] = (buf[i] >= 32 && buf[i] < 127) ? buf[i] : '?';
    near[n] = '\0';
    if (off >= len)
      ERR(place, "JSON syntax error: unexpected end of document");
    else
      ERR(place, "JSON syntax error near '%s'", near);
  }
  free(buf);
  return root;
}

/* Reads the section `sec` of the root, if there; returns whether present. */
static bool read_section(const cJSON *root, xm_spec_section_t sec, const char *source,
                         xm_diag_t *diag, xm_spec_t *out, bool *given) {
  const char *name = xm_spec_section_name(sec);
  const cJSON *obj = NULL;
  char ptr[64];
  snprintf(ptr, sizeof ptr, "/%s", name);
  for (const cJSON *v = root->child; v; v = v->next) {
    if (!v->string || strcmp(v->string, name) != 0) continue;
    if (obj)
      ERR(ptr, "duplicate key \"%s\"", name);
    else
      obj = v;
  }
  if (!obj) return false;
  if (!cJSON_IsObject(obj)) {
    ERR(ptr, "section \"%s\" must be an object", name);
    return false;
  }
  xm_spec_fields_read(obj, sec, ptr, source, diag, out, given);
  return true;
}

/* Base name of `source` without its extension, as the default model name. */
static void default_name(const char *source, char *out, size_t cap) {
  const char *base = source ? strrchr(source, '/') : NULL;
  base = base ? base + 1 : source;
  if (!base || !*base) return;
  size_t n = strcspn(base, ".");
  if (n == 0 || n >= cap) return;
  memcpy(out, base, n);
  out[n] = '\0';
}

static void load_xmoec(const cJSON *root, const char *source, xm_diag_t *diag, xm_spec_t *out) {
  int before = xm_diag_error_count(diag);
  bool given[256] = {false};
  xm_spec_fields_read(root, XM_SECTION_ROOT, "", source, diag, out, given);
  if (!given[xm_spec_field_find(XM_SECTION_ROOT, "name")])
    default_name(source, out->name, sizeof out->name);
  static const xm_spec_section_t required[] = {XM_SECTION_MODEL, XM_SECTION_TRAINING};
  for (int i = 0; i < 2; i++)
    if (!read_section(root, required[i], source, diag, out, given)) {
      char ptr[32];
      snprintf(ptr, sizeof ptr, "/%s", xm_spec_section_name(required[i]));
      if (!cJSON_GetObjectItemCaseSensitive(root, xm_spec_section_name(required[i])))
        ERR(ptr, "missing required section \"%s\"", xm_spec_section_name(required[i]));
    }
  read_section(root, XM_SECTION_MOE, source, diag, out, given);
  out->parallel.present = read_section(root, XM_SECTION_PARALLEL, source, diag, out, given);
  out->cluster.present = read_section(root, XM_SECTION_CLUSTER, source, diag, out, given);
  resolve_derived(out, given);
  /* Derived values are checked only when their inputs were all valid; a
   * derived value that is bad because an input was bad says nothing new. */
  if (xm_diag_error_count(diag) == before) {
    bool derived[256] = {false};
    for (int i = 0; i < xm_spec_field_count(); i++)
      derived[i] = !given[i] && (xm_spec_field_get(i)->flags & XM_FIELD_DERIVED);
    check_ranges(out, derived, source, diag);
  }
  check_semantics(out, source, diag);
}

/* Every object of a Hugging Face config, at any depth, has distinct keys,
 * as our own specs must (the first and the later value would disagree on
 * what the model is). */
static void check_duplicate_keys(const cJSON *obj, const char *ptr, const char *source,
                                 xm_diag_t *diag) {
  for (const cJSON *a = obj->child; a; a = a->next) {
    char here[256];
    snprintf(here, sizeof here, "%s/%s", ptr, a->string ? a->string : "");
    if (cJSON_IsObject(obj) && a->string)
      for (const cJSON *b = obj->child; b != a; b = b->next)
        if (b->string && strcmp(a->string, b->string) == 0) {
          ERR(here, "duplicate key \"%s\"", a->string);
          break;
        }
    if (cJSON_IsObject(a) || cJSON_IsArray(a)) check_duplicate_keys(a, here, source, diag);
  }
}

static void load_hf(const cJSON *root, const char *source, xm_diag_t *diag, xm_spec_t *out) {
  int before = xm_diag_error_count(diag);
  check_duplicate_keys(root, "", source, diag);
  if (xm_diag_error_count(diag) != before) return;
  const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
  snprintf(out->model_type, sizeof out->model_type, "%s", mt->valuestring);
  default_name(source, out->name, sizeof out->name);
  xm_hf_config_import(root, source, diag, out);
  if (xm_diag_error_count(diag) != before) return; /* unsupported: values unset */
  resolve_derived(out, NULL);
  xm_spec_validate(out, source, diag);
}

xm_status_t xm_spec_load_text(const char *text, size_t len, const char *source, xm_diag_t *diag,
                              xm_spec_t *out) {
  xm_spec_set_defaults(out);
  int before = xm_diag_error_count(diag);
  cJSON *root = parse_json(text, len, source, diag);
  if (!root) return XM_ERR_INVALID_INPUT;
  if (!cJSON_IsObject(root)) {
    ERR("", "the top level must be an object, not %s",
        cJSON_IsArray(root) ? "an array" : "a scalar");
  } else if (xm_hf_config_detect(root)) {
    load_hf(root, source, diag, out);
  } else {
    load_xmoec(root, source, diag, out);
  }
  cJSON_Delete(root);
  return xm_diag_error_count(diag) == before ? XM_OK : XM_ERR_INVALID_INPUT;
}

/* Reads a whole file, reporting failure as XM_ERR_IO. */
static xm_status_t read_whole(const char *path, xm_diag_t *diag, char **out_text, size_t *out_len) {
  int err = xm_read_file(path, out_text, out_len);
  if (err != 0) {
    char why[160];
    xm_diag_add(diag, XM_DIAG_ERROR, path, NULL, "cannot read file: %s",
                xm_read_error(err, XM_READ_LIMIT_TEXT, why, sizeof why));
    return XM_ERR_IO;
  }
  return XM_OK;
}

xm_status_t xm_spec_load_file(const char *path, xm_diag_t *diag, xm_spec_t *out) {
  xm_spec_set_defaults(out);
  char *text = NULL;
  size_t len = 0;
  XM_RETURN_IF_ERROR(read_whole(path, diag, &text, &len));
  xm_status_t st = xm_spec_load_text(text, len, path, diag, out);
  free(text);
  return st;
}

/* ---- cluster files --------------------------------------------------- */

xm_status_t xm_spec_load_cluster_text(const char *text, size_t len, const char *source,
                                      xm_diag_t *diag, xm_spec_t *spec) {
  int before = xm_diag_error_count(diag);
  cJSON *root = parse_json(text, len, source, diag);
  if (!root) return XM_ERR_INVALID_INPUT;
  if (!cJSON_IsObject(root)) {
    ERR("", "the top level of a cluster file must be an object");
    cJSON_Delete(root);
    return XM_ERR_INVALID_INPUT;
  }
  /* Start the cluster from its defaults: nothing of a previous one stays. */
  xm_spec_t fresh;
  xm_spec_fields_set_defaults(&fresh);
  spec->cluster = fresh.cluster;
  bool given[256] = {false};
  xm_spec_fields_read(root, XM_SECTION_CLUSTER, "", source, diag, spec, given);
  cJSON_Delete(root);
  spec->cluster.present = true;
  check_cluster(spec, true, source, diag);
  return xm_diag_error_count(diag) == before ? XM_OK : XM_ERR_INVALID_INPUT;
}

xm_status_t xm_spec_load_cluster_file(const char *path, xm_diag_t *diag, xm_spec_t *spec) {
  char *text = NULL;
  size_t len = 0;
  XM_RETURN_IF_ERROR(read_whole(path, diag, &text, &len));
  xm_status_t st = xm_spec_load_cluster_text(text, len, path, diag, spec);
  free(text);
  return st;
}
