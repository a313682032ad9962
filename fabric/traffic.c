/* fabric/traffic.c — measured and synthetic traffic matrices and their
 * locality (fabric/traffic.h; formats and the generative model in
 * docs/traffic.md, "Reading and synthesising traffic").
 *
 * Reading: both runtime files are JSON lines; every line is parsed alone
 * and checked completely, errors collected (at most MAX_ERRORS shown) at
 * "FILE:LINE" with a JSON pointer. Records are kept in file order; a key
 * written twice (a resumed run rewrites steps) keeps its last line, found
 * by one sort at the end rather than a search per line.
 *
 * Synthesis: expected values, computed per EP group from set-avoidance
 * probabilities of the conditional Poisson draw: with e_k(C) the k-th
 * elementary symmetric polynomial of the weights of C, a token drawing k
 * experts from C misses the experts X with probability
 * e_k(C \ X) / e_k(C). Every set asked about (an EP rank's experts, a
 * server's experts, one expert) is a range of expert ids, so prefix and
 * suffix tables of e_j over C give any e_k(C \ X) in O(k). The flat
 * matrix and the RBD pilot rows follow exactly; how a server's rows are
 * split between its ranks under skew is the one approximation (pilot in
 * proportion to each rank's chance of holding one of the token's experts).
 *
 * Locality: shares are sums over blocks; the heaviest server pairs come
 * from a quickselect under a total order (bytes, then index), so ties
 * never make two runs disagree.
 */
#include "fabric/traffic.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "frontend/layout.h"
#include "support/strbuf.h"

#define MAX_ERRORS 20                /* per file; the rest are counted */
#define MAX_WHOLE 9007199254740992.0 /* 2^53: integers exact in a double */
#define FIT_ITERATIONS 5000
#define FIT_TOLERANCE 1e-9 /* on each expert's inclusion probability */

/* ---- matrices ------------------------------------------------------------------ */

xm_status_t xm_fab_matrix_init(xm_fab_matrix_t *m, int64_t n) {
  m->n = 0;
  m->v = NULL;
  if (n < 1 || n > XM_FAB_MATRIX_MAX) return XM_ERR_INVALID_INPUT;
  m->v = calloc((size_t)(n * n), sizeof *m->v);
  if (!m->v) return XM_ERR_NO_MEMORY;
  m->n = n;
  return XM_OK;
}

void xm_fab_matrix_free(xm_fab_matrix_t *m) {
  if (!m) return;
  free(m->v);
  m->v = NULL;
  m->n = 0;
}

double xm_fab_matrix_total(const xm_fab_matrix_t *m) {
  double s = 0;
  for (int64_t i = 0; i < m->n * m->n; i++)
    s += m->v[i];
  return s;
}

xm_status_t xm_fab_matrix_transpose(const xm_fab_matrix_t *m, xm_fab_matrix_t *out) {
  XM_RETURN_IF_ERROR(xm_fab_matrix_init(out, m->n));
  for (int64_t i = 0; i < m->n; i++)
    for (int64_t j = 0; j < m->n; j++)
      out->v[j * m->n + i] = m->v[i * m->n + j];
  return XM_OK;
}

xm_status_t xm_fab_matrix_to_servers(const xm_fab_matrix_t *m, int64_t ranks_per_server,
                                     xm_fab_matrix_t *out) {
  out->n = 0;
  out->v = NULL;
  if (ranks_per_server < 1 || m->n % ranks_per_server != 0) return XM_ERR_INVALID_INPUT;
  int64_t s = m->n / ranks_per_server;
  XM_RETURN_IF_ERROR(xm_fab_matrix_init(out, s));
  for (int64_t i = 0; i < m->n; i++)
    for (int64_t j = 0; j < m->n; j++)
      out->v[(i / ranks_per_server) * s + j / ranks_per_server] += m->v[i * m->n + j];
  return XM_OK;
}

void xm_fab_matrix_split(const xm_fab_matrix_t *m, int64_t ranks_per_server, double *intra,
                         double *inter) {
  double a = 0, b = 0;
  int64_t r = ranks_per_server < 1 ? 1 : ranks_per_server;
  for (int64_t i = 0; i < m->n; i++)
    for (int64_t j = 0; j < m->n; j++) {
      if (i / r == j / r)
        a += m->v[i * m->n + j];
      else
        b += m->v[i * m->n + j];
    }
  *intra = a;
  *inter = b;
}

/* ---- reading: shared ------------------------------------------------------------ */

typedef struct {
  const char *source;
  int64_t line;
  xm_diag_t *diag;
  int errors; /* over the whole file */
} reader_t;

static void lerr(reader_t *r, const char *pointer, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void lerr(reader_t *r, const char *pointer, const char *fmt, ...) {
  if (r->errors++ >= MAX_ERRORS) return;
  char file[1200];
  if (r->line > 0)
    snprintf(file, sizeof file, "%.1000s:%lld", r->source, (long long)r->line);
  else
    snprintf(file, sizeof file, "%.1000s", r->source);
  va_list ap;
  va_start(ap, fmt);
  xm_diag_addv(r->diag, XM_DIAG_ERROR, file, pointer, fmt, ap);
  va_end(ap);
}

static void finish_errors(reader_t *r) {
  if (r->errors > MAX_ERRORS)
    xm_diag_add(r->diag, XM_DIAG_ERROR, r->source, NULL, "%d more errors not shown",
                r->errors - MAX_ERRORS);
}

/* A whole number in [0, 2^53]. */
static bool get_whole(const cJSON *v, double *out) {
  if (!cJSON_IsNumber(v)) return false;
  double d = v->valuedouble;
  if (!isfinite(d) || d != floor(d) || d < 0 || d > MAX_WHOLE) return false;
  *out = d;
  return true;
}

static const char *value_kind(const cJSON *v) {
  if (!v) return "missing";
  if (cJSON_IsNumber(v)) {
    double d = v->valuedouble;
    return d < 0 ? "negative" : d != floor(d) ? "not a whole number" : "too large";
  }
  return cJSON_IsString(v)   ? "a string"
         : cJSON_IsArray(v)  ? "an array"
         : cJSON_IsObject(v) ? "an object"
         : cJSON_IsNull(v)   ? "null"
         : cJSON_IsBool(v)   ? "a boolean"
                             : "not a number";
}

static bool phase_parse(const char *name, xm_rt_phase_t *out) {
  for (int p = 0; p < XM_RT_PHASE_COUNT; p++)
    if (name && strcmp(name, xm_rt_phase_kind_name((xm_rt_phase_t)p)) == 0) {
      *out = (xm_rt_phase_t)p;
      return true;
    }
  return false;
}

/* Members of object o outside `known` are errors at prefix/<key>. */
static void check_keys(reader_t *r, const cJSON *o, const char *prefix, const char *const *known,
                       int nknown, const char *what) {
  for (const cJSON *m = o->child; m; m = m->next) {
    int i = 0;
    while (i < nknown && strcmp(m->string, known[i]) != 0)
      i++;
    if (i == nknown) {
      char p[320];
      snprintf(p, sizeof p, "%.200s/%.100s", prefix, m->string);
      lerr(r, p, "unknown member (%s)", what);
    }
  }
}

/* Reads a world x world matrix of whole bytes with a zero diagonal at
 * `pointer`; reports the first bad entry only. */
static bool read_matrix(reader_t *r, const cJSON *v, int64_t world, const char *pointer,
                        xm_fab_matrix_t *out) {
  if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != world) {
    lerr(r, pointer, "must be an array of %lld rows (world), each of %lld byte counts",
         (long long)world, (long long)world);
    return false;
  }
  if (xm_fab_matrix_init(out, world) != XM_OK) {
    lerr(r, pointer, "cannot hold a %lld x %lld matrix", (long long)world, (long long)world);
    return false;
  }
  int64_t i = 0;
  for (const cJSON *row = v->child; row; row = row->next, i++) {
    char rp[160];
    snprintf(rp, sizeof rp, "%s/%lld", pointer, (long long)i);
    if (!cJSON_IsArray(row) || cJSON_GetArraySize(row) != world) {
      lerr(r, rp, "must be a row of %lld byte counts (the matrix is world x world, not square)",
           (long long)world);
      xm_fab_matrix_free(out);
      return false;
    }
    int64_t j = 0;
    for (const cJSON *x = row->child; x; x = x->next, j++) {
      double b;
      if (!get_whole(x, &b)) {
        char ep[192];
        snprintf(ep, sizeof ep, "%s/%lld", rp, (long long)j);
        lerr(r, ep, "must be a whole number of bytes >= 0 (is %s)", value_kind(x));
        xm_fab_matrix_free(out);
        return false;
      }
      if (i == j && b != 0) {
        char ep[192];
        snprintf(ep, sizeof ep, "%s/%lld", rp, (long long)j);
        lerr(r, ep, "is %.0f: a rank never counts bytes to itself, the diagonal is 0", b);
        xm_fab_matrix_free(out);
        return false;
      }
      out->v[i * world + j] = b;
    }
  }
  return true;
}

/* Calls fn for every non-blank line, with r->line set; returns the lines seen. */
typedef void (*line_fn)(reader_t *r, cJSON *o, void *ctx);
static int64_t for_each_line(reader_t *r, const char *text, size_t len, line_fn fn, void *ctx) {
  int64_t no = 0, seen = 0;
  for (size_t at = 0; at < len;) {
    const char *nl = memchr(text + at, '\n', len - at);
    size_t n = nl ? (size_t)(nl - (text + at)) : len - at;
    no++;
    size_t i = 0;
    while (i < n && strchr(" \t\r", text[at + i]))
      i++;
    if (i < n) {
      r->line = no;
      seen++;
      const char *end = NULL;
      cJSON *o = cJSON_ParseWithLengthOpts(text + at, n, &end, 0);
      size_t tail = o && end ? (size_t)(end - (text + at)) : 0;
      while (o && tail < n && strchr(" \t\r", text[at + tail]))
        tail++;
      if (!o || tail < n) {
        size_t col = o ? tail + 1 : end ? (size_t)(end - (text + at)) + 1 : 1;
        lerr(r, "", "JSON syntax error at column %zu (one JSON object per line)", col);
      } else if (!cJSON_IsObject(o)) {
        lerr(r, "", "must be a JSON object");
      } else {
        fn(r, o, ctx);
      }
      cJSON_Delete(o);
    }
    at += n + 1;
  }
  r->line = 0;
  return seen;
}

static xm_status_t read_whole_file(const char *path, const char *kind, xm_diag_t *diag, char **text,
                                   size_t *len) {
  int e = xm_read_file(path, text, len);
  if (e == 0) return XM_OK;
  char why[160];
  xm_diag_add(diag, XM_DIAG_ERROR, path, NULL, "cannot read the %s: %s", kind,
              xm_read_error(e, XM_READ_LIMIT_TEXT, why, sizeof why));
  return XM_ERR_IO;
}

/* ---- the --traffic file ----------------------------------------------------- */

typedef struct {
  xm_fab_traffic_t *t;
  int64_t cap;
  int64_t world_line; /* the line that fixed t->world */
} traffic_ctx_t;

static void traffic_line(reader_t *r, cJSON *o, void *vctx) {
  traffic_ctx_t *c = vctx;
  static const char *const known[] = {"step", "layer", "phase", "world", "bytes"};
  int before = r->errors;
  check_keys(r, o, "", known, 5, "a --traffic line has step, layer, phase, world, bytes");
  xm_fab_traffic_record_t rec;
  memset(&rec, 0, sizeof rec);
  rec.line = r->line;
  double d;
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "step");
  if (!get_whole(v, &d))
    lerr(r, "/step", "must be a whole number >= 0 (is %s)", value_kind(v));
  else
    rec.step = (int64_t)d;
  v = cJSON_GetObjectItemCaseSensitive(o, "layer");
  if (cJSON_IsNull(v))
    rec.layer = -1;
  else if (!get_whole(v, &d))
    lerr(r, "/layer", "must be a whole number >= 0 or null (is %s)", value_kind(v));
  else
    rec.layer = (int64_t)d;
  v = cJSON_GetObjectItemCaseSensitive(o, "phase");
  if (!cJSON_IsString(v) || !phase_parse(v->valuestring, &rec.phase))
    lerr(r, "/phase",
         "must be one of \"dispatch\", \"combine\", \"all_reduce\", \"all_gather\", "
         "\"reduce_scatter\", \"other\"%s%.60s%s",
         cJSON_IsString(v) ? " (is \"" : "", cJSON_IsString(v) ? v->valuestring : "",
         cJSON_IsString(v) ? "\")" : "");
  v = cJSON_GetObjectItemCaseSensitive(o, "world");
  int64_t world = 0;
  if (!get_whole(v, &d) || d < 1 || d > XM_FAB_MATRIX_MAX) {
    lerr(r, "/world", "must be a whole number in [1, %d] (the ranks)", XM_FAB_MATRIX_MAX);
  } else {
    world = (int64_t)d;
    if (c->t->world == 0) {
      c->t->world = world;
      c->world_line = r->line;
    } else if (world != c->t->world) {
      lerr(r, "/world", "is %lld, but line %lld has %lld: one file holds one program's ranks",
           (long long)world, (long long)c->world_line, (long long)c->t->world);
      world = 0;
    }
  }
  if (world > 0) {
    v = cJSON_GetObjectItemCaseSensitive(o, "bytes");
    if (!v)
      lerr(r, "/bytes", "missing: the world x world matrix of bytes");
    else
      read_matrix(r, v, world, "/bytes", &rec.bytes);
  }
  if (r->errors > before) {
    xm_fab_matrix_free(&rec.bytes);
    return;
  }
  if (c->t->num_records == c->cap) {
    int64_t cap = c->cap ? 2 * c->cap : 64;
    void *p = realloc(c->t->records, (size_t)cap * sizeof *c->t->records);
    if (!p) {
      lerr(r, NULL, "out of memory");
      xm_fab_matrix_free(&rec.bytes);
      return;
    }
    c->t->records = p;
    c->cap = cap;
  }
  c->t->records[c->t->num_records++] = rec;
}

static int cmp_record_key(const void *a, const void *b) {
  const xm_fab_traffic_record_t *x = a, *y = b;
  if (x->step != y->step) return x->step < y->step ? -1 : 1;
  if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
  if (x->phase != y->phase) return x->phase < y->phase ? -1 : 1;
  return x->line < y->line ? -1 : x->line > y->line;
}

static int cmp_record_line(const void *a, const void *b) {
  const xm_fab_traffic_record_t *x = a, *y = b;
  return x->line < y->line ? -1 : x->line > y->line;
}

/* Keeps the last line of each (step, layer, phase). */
static void dedupe_records(xm_fab_traffic_t *t) {
  if (t->num_records < 2) return;
  qsort(t->records, (size_t)t->num_records, sizeof *t->records, cmp_record_key);
  int64_t w = 0;
  for (int64_t i = 0; i < t->num_records; i++) {
    bool superseded = i + 1 < t->num_records && t->records[i + 1].step == t->records[i].step &&
                      t->records[i + 1].layer == t->records[i].layer &&
                      t->records[i + 1].phase == t->records[i].phase;
    if (superseded)
      xm_fab_matrix_free(&t->records[i].bytes);
    else
      t->records[w++] = t->records[i];
  }
  t->num_records = w;
  qsort(t->records, (size_t)t->num_records, sizeof *t->records, cmp_record_line);
}

void xm_fab_traffic_free(xm_fab_traffic_t *t) {
  if (!t) return;
  for (int64_t i = 0; i < t->num_records; i++)
    xm_fab_matrix_free(&t->records[i].bytes);
  free(t->records);
  free(t->source);
  free(t);
}

xm_status_t xm_fab_traffic_load_text(const char *text, size_t len, const char *source,
                                     xm_diag_t *diag, xm_fab_traffic_t **out) {
  *out = NULL;
  source = source ? source : "traffic";
  xm_fab_traffic_t *t = calloc(1, sizeof *t);
  if (!t || !(t->source = strdup(source))) {
    free(t);
    return XM_ERR_NO_MEMORY;
  }
  reader_t r = {.source = source, .diag = diag};
  traffic_ctx_t c = {.t = t};
  if (text && memchr(text, '\0', len))
    lerr(&r, NULL, "not a text file (contains a NUL byte)");
  else if (for_each_line(&r, text ? text : "", text ? len : 0, traffic_line, &c) == 0)
    lerr(&r, NULL, "no records: a --traffic file has one JSON line per (step, layer, phase)");
  finish_errors(&r);
  if (r.errors) {
    xm_fab_traffic_free(t);
    return XM_ERR_INVALID_INPUT;
  }
  dedupe_records(t);
  *out = t;
  return XM_OK;
}

xm_status_t xm_fab_traffic_load_file(const char *path, xm_diag_t *diag, xm_fab_traffic_t **out) {
  *out = NULL;
  char *text = NULL;
  size_t len = 0;
  XM_RETURN_IF_ERROR(read_whole_file(path, "--traffic file", diag, &text, &len));
  xm_status_t st = xm_fab_traffic_load_text(text, len, path, diag, out);
  free(text);
  return st;
}

const xm_fab_traffic_record_t *xm_fab_traffic_find(const xm_fab_traffic_t *t, int64_t step,
                                                   int64_t layer, xm_rt_phase_t phase) {
  for (int64_t i = 0; t && i < t->num_records; i++) {
    const xm_fab_traffic_record_t *r = &t->records[i];
    if (r->step == step && r->layer == layer && r->phase == phase) return r;
  }
  return NULL;
}

xm_status_t xm_fab_traffic_sum(const xm_fab_traffic_t *t, int64_t step, int64_t layer,
                               xm_rt_phase_t phase, xm_fab_matrix_t *out) {
  XM_RETURN_IF_ERROR(xm_fab_matrix_init(out, t->world));
  for (int64_t i = 0; i < t->num_records; i++) {
    const xm_fab_traffic_record_t *r = &t->records[i];
    if ((step >= 0 && r->step != step) || (layer >= -1 && r->layer != layer) ||
        (phase != XM_RT_PHASE_COUNT && r->phase != phase))
      continue;
    for (int64_t k = 0; k < t->world * t->world; k++)
      out->v[k] += r->bytes.v[k];
  }
  return XM_OK;
}

/* ---- the step log ------------------------------------------------------------ */

typedef struct {
  xm_fab_step_log_t *l;
  int64_t cap;
} step_ctx_t;

static void free_step(xm_fab_step_traffic_t *s) {
  for (int p = 0; p < XM_RT_PHASE_COUNT; p++)
    xm_fab_matrix_free(&s->sent[p]);
}

static void read_peers(reader_t *r, const cJSON *peers, xm_fab_step_traffic_t *s) {
  if (!cJSON_IsObject(peers)) {
    lerr(r, "/traffic/peers", "must be an object {\"world\": P, \"sent\": {...}}");
    return;
  }
  static const char *const known[] = {"world", "sent"};
  check_keys(r, peers, "/traffic/peers", known, 2, "peers has world and sent");
  const cJSON *wv = cJSON_GetObjectItemCaseSensitive(peers, "world");
  double d;
  if (!get_whole(wv, &d) || d < 1 || d > XM_FAB_MATRIX_MAX) {
    lerr(r, "/traffic/peers/world", "must be a whole number in [1, %d] (the ranks)",
         XM_FAB_MATRIX_MAX);
    return;
  }
  s->world = (int64_t)d;
  const cJSON *sent = cJSON_GetObjectItemCaseSensitive(peers, "sent");
  if (!cJSON_IsObject(sent)) {
    lerr(r, "/traffic/peers/sent", "must be an object with one matrix per phase");
    return;
  }
  for (const cJSON *m = sent->child; m; m = m->next) {
    xm_rt_phase_t p;
    char ptr[192];
    snprintf(ptr, sizeof ptr, "/traffic/peers/sent/%.60s", m->string);
    if (!phase_parse(m->string, &p))
      lerr(r, ptr,
           "unknown phase (dispatch, combine, all_reduce, all_gather, reduce_scatter, "
           "other)");
    else
      read_matrix(r, m, s->world, ptr, &s->sent[p]);
  }
  for (int p = 0; p < XM_RT_PHASE_COUNT; p++)
    if (!cJSON_GetObjectItemCaseSensitive(sent, xm_rt_phase_kind_name((xm_rt_phase_t)p))) {
      char ptr[192];
      snprintf(ptr, sizeof ptr, "/traffic/peers/sent/%s", xm_rt_phase_kind_name((xm_rt_phase_t)p));
      lerr(r, ptr, "missing: peers gives all six phases");
    }
}

static void read_by_phase(reader_t *r, const cJSON *bp, xm_fab_step_traffic_t *s) {
  if (!cJSON_IsObject(bp)) {
    lerr(r, "/traffic/by_phase", "must be an object of the six phases");
    return;
  }
  for (const cJSON *m = bp->child; m; m = m->next) {
    xm_rt_phase_t p;
    char ptr[192];
    snprintf(ptr, sizeof ptr, "/traffic/by_phase/%.60s", m->string);
    if (!phase_parse(m->string, &p)) {
      lerr(r, ptr,
           "unknown phase (dispatch, combine, all_reduce, all_gather, reduce_scatter, "
           "other)");
      continue;
    }
    if (!cJSON_IsObject(m)) {
      lerr(r, ptr, "must be an object {\"intra\": bytes, \"inter\": bytes}");
      continue;
    }
    static const char *const known[] = {"intra", "inter"};
    check_keys(r, m, ptr, known, 2, "a phase has intra and inter");
    const char *const names[2] = {"intra", "inter"};
    double *dst[2] = {&s->intra[p], &s->inter[p]};
    for (int k = 0; k < 2; k++) {
      const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, names[k]);
      if (!get_whole(v, dst[k])) {
        char vp[224];
        snprintf(vp, sizeof vp, "%s/%s", ptr, names[k]);
        lerr(r, vp, "must be a whole number of bytes >= 0 (is %s)", value_kind(v));
      }
    }
  }
  for (int p = 0; p < XM_RT_PHASE_COUNT; p++)
    if (!cJSON_GetObjectItemCaseSensitive(bp, xm_rt_phase_kind_name((xm_rt_phase_t)p))) {
      char ptr[192];
      snprintf(ptr, sizeof ptr, "/traffic/by_phase/%s", xm_rt_phase_kind_name((xm_rt_phase_t)p));
      lerr(r, ptr, "missing: by_phase gives all six phases");
    }
}

static void step_line(reader_t *r, cJSON *o, void *vctx) {
  step_ctx_t *c = vctx;
  int before = r->errors;
  xm_fab_step_traffic_t s;
  memset(&s, 0, sizeof s);
  s.line = r->line;
  double d;
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "step");
  if (!get_whole(v, &d))
    lerr(r, "/step", "must be a whole number >= 0 (is %s)", value_kind(v));
  else
    s.step = (int64_t)d;
  const cJSON *tr = cJSON_GetObjectItemCaseSensitive(o, "traffic");
  if (!cJSON_IsObject(tr)) {
    lerr(r, "/traffic", "%s: a step log line has a traffic object (docs/traffic.md)",
         tr ? "must be an object" : "missing");
    return;
  }
  static const char *const known[] = {"intra_bytes", "inter_bytes", "by_phase", "peers"};
  check_keys(r, tr, "/traffic", known, 4, "traffic has intra_bytes, inter_bytes, by_phase, peers");
  v = cJSON_GetObjectItemCaseSensitive(tr, "intra_bytes");
  if (!get_whole(v, &s.intra_bytes))
    lerr(r, "/traffic/intra_bytes", "must be a whole number of bytes >= 0 (is %s)", value_kind(v));
  v = cJSON_GetObjectItemCaseSensitive(tr, "inter_bytes");
  if (!get_whole(v, &s.inter_bytes))
    lerr(r, "/traffic/inter_bytes", "must be a whole number of bytes >= 0 (is %s)", value_kind(v));
  const cJSON *bp = cJSON_GetObjectItemCaseSensitive(tr, "by_phase");
  if (!bp)
    lerr(r, "/traffic/by_phase", "missing: the bytes of each phase");
  else
    read_by_phase(r, bp, &s);
  const cJSON *peers = cJSON_GetObjectItemCaseSensitive(tr, "peers");
  if (peers) read_peers(r, peers, &s);
  if (r->errors == before) {
    double sum = 0;
    for (int p = 0; p < XM_RT_PHASE_COUNT; p++)
      sum += s.intra[p] + s.inter[p];
    if (sum != s.intra_bytes + s.inter_bytes)
      lerr(r, "/traffic", "intra_bytes + inter_bytes = %.0f, but the phases sum to %.0f",
           s.intra_bytes + s.inter_bytes, sum);
  }
  if (r->errors > before) {
    free_step(&s);
    return;
  }
  xm_fab_step_log_t *l = c->l;
  for (int64_t i = 0; i < l->num_steps; i++)
    if (l->steps[i].step == s.step) { /* a resumed run logs the step again: the last wins */
      free_step(&l->steps[i]);
      l->steps[i] = s;
      return;
    }
  if (l->num_steps == c->cap) {
    int64_t cap = c->cap ? 2 * c->cap : 64;
    void *p = realloc(l->steps, (size_t)cap * sizeof *l->steps);
    if (!p) {
      lerr(r, NULL, "out of memory");
      free_step(&s);
      return;
    }
    l->steps = p;
    c->cap = cap;
  }
  l->steps[l->num_steps++] = s;
}

void xm_fab_step_log_free(xm_fab_step_log_t *l) {
  if (!l) return;
  for (int64_t i = 0; i < l->num_steps; i++)
    free_step(&l->steps[i]);
  free(l->steps);
  free(l->source);
  free(l);
}

xm_status_t xm_fab_step_log_load_text(const char *text, size_t len, const char *source,
                                      xm_diag_t *diag, xm_fab_step_log_t **out) {
  *out = NULL;
  source = source ? source : "log";
  xm_fab_step_log_t *l = calloc(1, sizeof *l);
  if (!l || !(l->source = strdup(source))) {
    free(l);
    return XM_ERR_NO_MEMORY;
  }
  reader_t r = {.source = source, .diag = diag};
  step_ctx_t c = {.l = l};
  if (text && memchr(text, '\0', len))
    lerr(&r, NULL, "not a text file (contains a NUL byte)");
  else if (for_each_line(&r, text ? text : "", text ? len : 0, step_line, &c) == 0)
    lerr(&r, NULL, "no steps: a --log file has one JSON line per step");
  finish_errors(&r);
  if (r.errors) {
    xm_fab_step_log_free(l);
    return XM_ERR_INVALID_INPUT;
  }
  *out = l;
  return XM_OK;
}

xm_status_t xm_fab_step_log_load_file(const char *path, xm_diag_t *diag, xm_fab_step_log_t **out) {
  *out = NULL;
  char *text = NULL;
  size_t len = 0;
  XM_RETURN_IF_ERROR(read_whole_file(path, "step log", diag, &text, &len));
  xm_status_t st = xm_fab_step_log_load_text(text, len, path, diag, out);
  free(text);
  return st;
}

/* ---- synthesis: the conditional Poisson draw -------------------------------- */

/* The experts a token may draw from (all of them, or one affinity group),
 * ids ascending, with prefix and suffix tables of the elementary symmetric
 * polynomials of their weights (scaled to mean 1: the draw does not see
 * the scale, and the tables stay far from overflow). */
typedef struct {
  int64_t n, k;
  int64_t *ids;      /* owned, n ascending */
  double *pre, *suf; /* owned, (n + 1) x (k + 1) */
  double ek;         /* e_k of all n */
} draw_t;

static void draw_free(draw_t *d) {
  free(d->ids);
  free(d->pre);
  free(d->suf);
  memset(d, 0, sizeof *d);
}

/* Builds the tables for ids[0..n) (taken) with weights w[id]. */
static xm_status_t draw_init(draw_t *d, int64_t *ids, int64_t n, int64_t k, const double *w) {
  memset(d, 0, sizeof *d);
  d->ids = ids;
  d->n = n;
  d->k = k;
  d->pre = calloc((size_t)((n + 1) * (k + 1)), sizeof *d->pre);
  d->suf = calloc((size_t)((n + 1) * (k + 1)), sizeof *d->suf);
  if (!d->pre || !d->suf) {
    draw_free(d);
    return XM_ERR_NO_MEMORY;
  }
  double sum = 0;
  for (int64_t i = 0; i < n; i++)
    sum += w[ids[i]];
  double scale = sum > 0 ? (double)n / sum : 1.0;
  int64_t K = k + 1;
  d->pre[0] = 1;
  for (int64_t i = 0; i < n; i++) {
    double x = w[ids[i]] * scale;
    const double *a = d->pre + i * K;
    double *b = d->pre + (i + 1) * K;
    b[0] = a[0];
    for (int64_t j = 1; j <= k; j++)
      b[j] = a[j] + x * a[j - 1];
  }
  d->suf[n * K] = 1;
  for (int64_t i = n - 1; i >= 0; i--) {
    double x = w[ids[i]] * scale;
    const double *a = d->suf + (i + 1) * K;
    double *b = d->suf + i * K;
    b[0] = a[0];
    for (int64_t j = 1; j <= k; j++)
      b[j] = a[j] + x * a[j - 1];
  }
  d->ek = d->pre[n * K + k];
  return XM_OK;
}

/* P(the draw takes at least one of members [a, b)). */
static double draw_touch(const draw_t *d, int64_t a, int64_t b) {
  if (a >= b || !(d->ek > 0)) return 0;
  int64_t K = d->k + 1;
  double avoid = 0;
  for (int64_t j = 0; j <= d->k; j++)
    avoid += d->pre[a * K + j] * d->suf[b * K + d->k - j];
  double t = 1.0 - avoid / d->ek;
  return t < 0 ? 0 : t > 1 ? 1 : t;
}

/* First member index whose id is >= id. */
static int64_t draw_lower(const draw_t *d, int64_t id) {
  int64_t lo = 0, hi = d->n;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (d->ids[mid] < id)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* P(the draw takes an expert with id in [lo, hi)). */
static double draw_touch_ids(const draw_t *d, int64_t lo, int64_t hi) {
  return draw_touch(d, draw_lower(d, lo), draw_lower(d, hi));
}

/* ---- synthesis: seeds -------------------------------------------------------- */

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* A seeded permutation of 0..n-1 (Fisher-Yates driven by mix64). */
static void permute(int64_t *p, int64_t n, uint64_t seed) {
  for (int64_t i = 0; i < n; i++)
    p[i] = i;
  uint64_t s = seed;
  for (int64_t i = n - 1; i > 0; i--) {
    s = mix64(s);
    int64_t j = (int64_t)(s % (uint64_t)(i + 1));
    int64_t t = p[i];
    p[i] = p[j];
    p[j] = t;
  }
}

enum { SEED_POPULARITY = 1, SEED_GROUPS = 2, SEED_HOME = 3 };

static uint64_t stream_seed(const xm_fab_synth_t *s, int which) {
  return mix64(mix64(s->seed ^ (uint64_t)which * 0x632be59bd9b4e019ull) ^ (uint64_t)s->layer);
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

/* ---- synthesis: checks and weights ------------------------------------------- */

static void serr(xm_diag_t *d, const char *place, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void serr(xm_diag_t *d, const char *place, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  xm_diag_addv(d, XM_DIAG_ERROR, NULL, place, fmt, ap);
  va_end(ap);
}

static bool in_range(double x, double lo, double hi) { return isfinite(x) && x >= lo && x <= hi; }

static void check_synth(const xm_fab_synth_t *s, xm_diag_t *d) {
  if (s->world < 1 || s->world > XM_FAB_SYNTH_WORLD_MAX)
    serr(d, "world", "must be in [1, %d] ranks", XM_FAB_SYNTH_WORLD_MAX);
  if (s->ranks_per_server < 1 || (s->world >= 1 && s->world % s->ranks_per_server != 0))
    serr(d, "ranks_per_server", "must be >= 1 and divide the world (%lld)", (long long)s->world);
  if (s->ep < 1 || (s->world >= 1 && s->world % s->ep != 0))
    serr(d, "ep", "must be >= 1 and divide the world (%lld): EP groups tile the ranks",
         (long long)s->world);
  if (s->experts < 1 || s->experts > XM_FAB_SYNTH_EXPERTS_MAX)
    serr(d, "experts", "must be in [1, %d]", XM_FAB_SYNTH_EXPERTS_MAX);
  else if (s->ep >= 1 && s->experts % s->ep != 0)
    serr(d, "experts", "%lld experts do not split evenly over ep = %lld ranks",
         (long long)s->experts, (long long)s->ep);
  if (s->top_k < 1 || s->top_k > XM_FAB_SYNTH_TOP_K_MAX || s->top_k > s->experts)
    serr(d, "top_k", "must be in [1, min(experts, %d)]", XM_FAB_SYNTH_TOP_K_MAX);
  if (s->hidden < 1) serr(d, "hidden", "must be >= 1");
  if (s->tokens < 0) serr(d, "tokens", "must be >= 0 (tokens per rank)");
  if (!in_range(s->bytes_per_element, 1e-9, 1e9))
    serr(d, "bytes_per_element", "must be a number > 0");
  if (!in_range(s->zipf, 0, 1e3)) serr(d, "zipf", "must be a number >= 0 (0: uniform)");
  if (!in_range(s->locality, 0, 1)) serr(d, "locality", "must be in [0, 1]");
  if (!in_range(s->source_affinity, 0, 1)) serr(d, "source_affinity", "must be in [0, 1]");
  if (s->fit_loads && !s->loads) serr(d, "fit_loads", "needs loads to fit");
  if (s->affinity_experts < 0) serr(d, "affinity_experts", "must be >= 0 (0: one server's)");
  int64_t servers = s->ranks_per_server >= 1 ? s->world / s->ranks_per_server : 0;
  int64_t n = s->by_server ? servers : s->world;
  if (n > XM_FAB_MATRIX_MAX)
    serr(d, s->by_server ? "by_server" : "world",
         "a %lld x %lld matrix is more than this model holds (%d); %s", (long long)n, (long long)n,
         XM_FAB_MATRIX_MAX,
         s->by_server ? "use fewer servers" : "ask for the server matrix (by_server)");
}

/* CP weights w whose global draw takes expert e with probability
 * k * share[e] (shares sum to 1, k * share <= 1): the fixed point
 * w_e <- w_e * target_e / pi_e(w). */
static xm_status_t fit_weights(const double *share, int64_t E, int64_t k, double *w,
                               xm_diag_t *diag) {
  double *pi = malloc((size_t)E * sizeof *pi);
  if (!pi) return XM_ERR_NO_MEMORY;
  for (int64_t e = 0; e < E; e++)
    w[e] = share[e];
  double worst = 0;
  int64_t worst_e = 0;
  xm_status_t st = XM_OK;
  for (int it = 0; it < FIT_ITERATIONS; it++) {
    draw_t d;
    int64_t *copy = malloc((size_t)E * sizeof *copy);
    if (!copy) {
      st = XM_ERR_NO_MEMORY;
      break;
    }
    for (int64_t e = 0; e < E; e++)
      copy[e] = e;
    st = draw_init(&d, copy, E, k, w);
    if (st != XM_OK) {
      free(copy);
      break;
    }
    worst = 0;
    for (int64_t e = 0; e < E; e++) {
      pi[e] = draw_touch(&d, e, e + 1);
      double err = fabs(pi[e] - (double)k * share[e]);
      if (err > worst) worst = err, worst_e = e;
    }
    draw_free(&d);
    if (worst <= FIT_TOLERANCE) break;
    for (int64_t e = 0; e < E; e++)
      if (pi[e] > 0) w[e] *= (double)k * share[e] / pi[e];
  }
  if (st == XM_OK && worst > FIT_TOLERANCE) {
    char place[48];
    snprintf(place, sizeof place, "loads/%lld", (long long)worst_e);
    serr(diag, place,
         "no draw of %lld distinct experts gives expert %lld its share %.6g of the slots "
         "(off by %.3g after %d rounds): a share near 1/top_k leaves the others no room",
         (long long)k, (long long)worst_e, share[worst_e], worst / (double)k, FIT_ITERATIONS);
    st = XM_ERR_INVALID_INPUT;
  }
  free(pi);
  return st;
}

/* The weights of the experts (w, E values) from loads or the Zipf law. */
static xm_status_t make_weights(const xm_fab_synth_t *s, double *w, xm_diag_t *diag) {
  int64_t E = s->experts, k = s->top_k;
  if (!s->loads) {
    int64_t *rank = malloc((size_t)E * sizeof *rank);
    if (!rank) return XM_ERR_NO_MEMORY;
    permute(rank, E, stream_seed(s, SEED_POPULARITY));
    for (int64_t e = 0; e < E; e++)
      w[e] = s->zipf > 0 ? pow((double)(rank[e] + 1), -s->zipf) : 1.0;
    free(rank);
    return XM_OK;
  }
  double sum = 0;
  int64_t positive = 0;
  bool ok = true;
  for (int64_t e = 0; e < E; e++) {
    double x = s->loads[e];
    if (!in_range(x, 0, 1e300)) {
      char place[48];
      snprintf(place, sizeof place, "loads/%lld", (long long)e);
      serr(diag, place, "must be a finite number >= 0");
      ok = false;
      continue;
    }
    sum += x;
    positive += x > 0;
  }
  if (!ok) return XM_ERR_INVALID_INPUT;
  if (positive < k) {
    serr(diag, "loads", "only %lld experts have a load > 0; a token needs top_k = %lld",
         (long long)positive, (long long)k);
    return XM_ERR_INVALID_INPUT;
  }
  for (int64_t e = 0; e < E; e++)
    w[e] = s->loads[e] / sum;
  if (!s->fit_loads) return XM_OK;
  for (int64_t e = 0; e < E; e++)
    if ((double)k * w[e] > 1.0 + 1e-12) {
      char place[48];
      snprintf(place, sizeof place, "loads/%lld", (long long)e);
      serr(diag, place,
           "a share of %.6g of the slots is more than 1/top_k = %.6g: an expert is "
           "chosen at most once per token",
           w[e], 1.0 / (double)k);
      return XM_ERR_INVALID_INPUT;
    }
  double *share = malloc((size_t)E * sizeof *share);
  if (!share) return XM_ERR_NO_MEMORY;
  memcpy(share, w, (size_t)E * sizeof *share);
  xm_status_t st = fit_weights(share, E, k, w, diag);
  free(share);
  return st;
}

/* ---- synthesis: expected rows ------------------------------------------------ */

typedef struct {
  int64_t rank; /* EP index */
  double touch, slots;
} hit_t;

typedef struct {
  const xm_fab_synth_t *s;
  int64_t E, k, ep, L, rps, m, A;
  double lam, sig;
  double *w;       /* E weights */
  draw_t global;   /* all experts */
  draw_t *groups;  /* m affinity groups (locality > 0) */
  double *gweight; /* m: a group's share of the weight */
  hit_t **ghits;   /* per group: the EP ranks it touches */
  int64_t *nghits;
  double *base_touch, *base_slots;   /* ep: the part of every token alike */
  double *extra_touch, *extra_slots; /* ep: the home group's part (scratch) */
  int64_t *home;                     /* per server */
  double row_dispatch, row_combine;  /* bytes per row */
  int64_t n;                         /* matrix size */
} synth_t;

static void synth_free(synth_t *y) {
  draw_free(&y->global);
  for (int64_t g = 0; y->groups && g < y->m; g++)
    draw_free(&y->groups[g]);
  for (int64_t g = 0; y->ghits && g < y->m; g++)
    free(y->ghits[g]);
  free(y->groups);
  free(y->ghits);
  free(y->nghits);
  free(y->gweight);
  free(y->w);
  free(y->base_touch);
  free(y->base_slots);
  free(y->extra_touch);
  free(y->extra_slots);
  free(y->home);
}

/* The affinity groups: member lists, draws, weights and the EP ranks each
 * touches. */
static xm_status_t build_groups(synth_t *y) {
  const xm_fab_synth_t *s = y->s;
  int64_t *order = malloc((size_t)y->E * sizeof *order);
  y->groups = calloc((size_t)y->m, sizeof *y->groups);
  y->ghits = calloc((size_t)y->m, sizeof *y->ghits);
  y->nghits = calloc((size_t)y->m, sizeof *y->nghits);
  y->gweight = calloc((size_t)y->m, sizeof *y->gweight);
  if (!order || !y->groups || !y->ghits || !y->nghits || !y->gweight) {
    free(order);
    return XM_ERR_NO_MEMORY;
  }
  if (s->affinity_scattered)
    permute(order, y->E, stream_seed(s, SEED_GROUPS));
  else
    for (int64_t e = 0; e < y->E; e++)
      order[e] = e;
  double total = 0;
  for (int64_t e = 0; e < y->E; e++)
    total += y->w[e];
  xm_status_t st = XM_OK;
  for (int64_t g = 0; g < y->m && st == XM_OK; g++) {
    int64_t *ids = malloc((size_t)y->A * sizeof *ids);
    if (!ids) {
      st = XM_ERR_NO_MEMORY;
      break;
    }
    memcpy(ids, order + g * y->A, (size_t)y->A * sizeof *ids);
    qsort(ids, (size_t)y->A, sizeof *ids, cmp_i64);
    double gw = 0;
    for (int64_t i = 0; i < y->A; i++)
      gw += y->w[ids[i]];
    y->gweight[g] = total > 0 ? gw / total : 0;
    st = draw_init(&y->groups[g], ids, y->A, y->k, y->w);
    if (st != XM_OK) break;
    /* the EP ranks the group's members live on: runs of ascending ids */
    const draw_t *d = &y->groups[g];
    y->ghits[g] = malloc((size_t)y->A * sizeof *y->ghits[g]);
    if (!y->ghits[g]) {
      st = XM_ERR_NO_MEMORY;
      break;
    }
    for (int64_t a = 0; a < y->A;) {
      int64_t rank = d->ids[a] / y->L, b = a;
      double slots = 0;
      while (b < y->A && d->ids[b] / y->L == rank)
        slots += draw_touch(d, b, b + 1), b++;
      y->ghits[g][y->nghits[g]++] = (hit_t){rank, draw_touch(d, a, b), slots};
      a = b;
    }
  }
  free(order);
  return st;
}

/* The part of the touch probability of expert ids [lo, hi) common to every
 * token: the global draw and the groups chosen by weight. */
static double base_range(const synth_t *y, int64_t lo, int64_t hi) {
  double t = (1 - y->lam) * draw_touch_ids(&y->global, lo, hi);
  if (y->lam > 0 && y->sig < 1)
    for (int64_t g = 0; g < y->m; g++) {
      const draw_t *d = &y->groups[g];
      if (d->ids[d->n - 1] < lo || d->ids[0] >= hi || !(y->gweight[g] > 0)) continue;
      t += y->lam * (1 - y->sig) * y->gweight[g] * draw_touch_ids(d, lo, hi);
    }
  return t;
}

static void add_rows(const synth_t *y, xm_fab_synth_result_t *out, int64_t i, int64_t j,
                     double rows) {
  if (i == j || !(rows > 0)) return;
  out->rows += rows;
  if (i / y->rps != j / y->rps) out->inter_rows += rows;
  int64_t a = y->s->by_server ? i / y->rps : i, b = y->s->by_server ? j / y->rps : j;
  out->dispatch.v[a * y->n + b] += rows * y->row_dispatch;
  out->combine.v[b * y->n + a] += rows * y->row_combine;
}

typedef struct {
  int64_t i0, i1; /* EP indices [i0, i1) on one server */
  double base;    /* base_range of their experts */
} block_t;

/* Rows of the tokens of one server's ranks [s0, s1) of EP group `first`
 * to the group's blocks, flat or RBD. */
static void server_rows(synth_t *y, int64_t first, const block_t *blocks, int64_t nb, int64_t s0,
                        int64_t s1, xm_fab_synth_result_t *out) {
  double T = (double)y->s->tokens, ls = y->lam * y->sig;
  int64_t h = ls > 0 ? y->home[(first + s0) / y->rps] : -1;
  if (h >= 0)
    for (int64_t x = 0; x < y->nghits[h]; x++) {
      y->extra_touch[y->ghits[h][x].rank] = y->ghits[h][x].touch;
      y->extra_slots[y->ghits[h][x].rank] = y->ghits[h][x].slots;
    }
  if (!out->rbd_active) {
    for (int64_t a = s0; a < s1; a++)
      for (int64_t b = 0; b < y->ep; b++)
        add_rows(y, out, first + a, first + b, T * (y->base_slots[b] + ls * y->extra_slots[b]));
  } else {
    double cnt = (double)(s1 - s0);
    for (int64_t x = 0; x < nb; x++) {
      const block_t *B = &blocks[x];
      double PB = B->base;
      if (h >= 0) PB += ls * draw_touch_ids(&y->groups[h], B->i0 * y->L, B->i1 * y->L);
      double sum_t = 0;
      for (int64_t q = B->i0; q < B->i1; q++)
        sum_t += y->base_touch[q] + ls * y->extra_touch[q];
      if (!(PB > 0) || !(sum_t > 0)) continue;
      for (int64_t q = B->i0; q < B->i1; q++) {
        double tq = y->base_touch[q] + ls * y->extra_touch[q];
        double pq = PB * tq / sum_t; /* the chance that q is the token's pilot there */
        for (int64_t a = s0; a < s1; a++)
          add_rows(y, out, first + a, first + q, T * pq);
        /* replicas from pilot q: each other rank q2 that holds one of the
         * token's experts but is not the pilot gets one, from one of the
         * pilots, split in proportion to their chances */
        for (int64_t q2 = B->i0; q2 < B->i1; q2++) {
          if (q2 == q) continue;
          double t2 = y->base_touch[q2] + ls * y->extra_touch[q2];
          double p2 = PB * t2 / sum_t, rest = PB - p2;
          if (!(rest > 0) || !(t2 - p2 > 0)) continue;
          add_rows(y, out, first + q, first + q2, cnt * T * (t2 - p2) * pq / rest);
        }
      }
    }
  }
  if (h >= 0)
    for (int64_t x = 0; x < y->nghits[h]; x++)
      y->extra_touch[y->ghits[h][x].rank] = y->extra_slots[y->ghits[h][x].rank] = 0;
}

/* The realised share of the slots of each expert, averaged over the
 * servers (each has its home group). */
static void expert_shares(const synth_t *y, int64_t servers, double *share) {
  double *home_share = calloc((size_t)(y->m > 0 ? y->m : 1), sizeof *home_share);
  XM_ASSERT(home_share);
  if (y->lam * y->sig > 0)
    for (int64_t v = 0; v < servers; v++)
      home_share[y->home[v]] += 1.0 / (double)servers;
  for (int64_t e = 0; e < y->E; e++)
    share[e] = (1 - y->lam) * draw_touch(&y->global, e, e + 1);
  for (int64_t g = 0; y->lam > 0 && g < y->m; g++) {
    const draw_t *d = &y->groups[g];
    double c = y->lam * ((1 - y->sig) * y->gweight[g] + y->sig * home_share[g]);
    for (int64_t i = 0; i < d->n; i++)
      share[d->ids[i]] += c * draw_touch(d, i, i + 1);
  }
  for (int64_t e = 0; e < y->E; e++)
    share[e] /= (double)y->k;
  free(home_share);
}

static xm_status_t synth_prepare(synth_t *y, xm_diag_t *diag) {
  const xm_fab_synth_t *s = y->s;
  y->E = s->experts;
  y->k = s->top_k;
  y->ep = s->ep;
  y->L = s->experts / s->ep;
  y->rps = s->ranks_per_server;
  y->lam = s->locality;
  y->sig = s->source_affinity;
  int64_t servers = s->world / y->rps;
  /* default affinity group: the experts of the first server of EP group 0 */
  int64_t first_block = y->ep < y->rps ? y->ep : y->rps;
  y->A = s->affinity_experts > 0 ? s->affinity_experts : first_block * y->L;
  if (y->E % y->A != 0) {
    serr(diag, "affinity_experts", "%lld does not divide the %lld experts", (long long)y->A,
         (long long)y->E);
    return XM_ERR_INVALID_INPUT;
  }
  if (y->lam > 0 && y->A < y->k) {
    serr(diag, "affinity_experts",
         "a group of %lld experts cannot hold a token's top_k = %lld distinct experts",
         (long long)y->A, (long long)y->k);
    return XM_ERR_INVALID_INPUT;
  }
  y->m = y->E / y->A;
  y->w = malloc((size_t)y->E * sizeof *y->w);
  y->base_touch = calloc((size_t)y->ep, sizeof *y->base_touch);
  y->base_slots = calloc((size_t)y->ep, sizeof *y->base_slots);
  y->extra_touch = calloc((size_t)y->ep, sizeof *y->extra_touch);
  y->extra_slots = calloc((size_t)y->ep, sizeof *y->extra_slots);
  y->home = calloc((size_t)servers, sizeof *y->home);
  int64_t *ids = malloc((size_t)y->E * sizeof *ids);
  if (!y->w || !y->base_touch || !y->base_slots || !y->extra_touch || !y->extra_slots || !y->home ||
      !ids) {
    free(ids);
    return XM_ERR_NO_MEMORY;
  }
  xm_status_t st = make_weights(s, y->w, diag);
  if (st != XM_OK) {
    free(ids);
    return st;
  }
  int64_t positive = 0;
  for (int64_t e = 0; e < y->E; e++)
    positive += y->w[e] > 0;
  if (positive < y->k) {
    free(ids);
    serr(diag, "zipf", "fewer than top_k experts have a weight > 0");
    return XM_ERR_INVALID_INPUT;
  }
  for (int64_t e = 0; e < y->E; e++)
    ids[e] = e;
  XM_RETURN_IF_ERROR(draw_init(&y->global, ids, y->E, y->k, y->w));
  if (y->lam > 0) {
    XM_RETURN_IF_ERROR(build_groups(y));
    for (int64_t g = 0; g < y->m; g++)
      if (!(y->groups[g].ek > 0)) {
        serr(diag, "affinity_experts",
             "affinity group %lld has fewer than top_k = %lld experts with a weight > 0",
             (long long)g, (long long)y->k);
        return XM_ERR_INVALID_INPUT;
      }
  }
  if (y->lam * y->sig > 0) {
    uint64_t hs = stream_seed(s, SEED_HOME);
    for (int64_t v = 0; v < servers; v++)
      y->home[v] = (int64_t)(mix64(hs ^ mix64((uint64_t)v)) % (uint64_t)y->m);
  }
  /* per EP rank: the base touch probability and expected slots */
  for (int64_t i = 0; i < y->ep; i++) {
    y->base_touch[i] = base_range(y, i * y->L, (i + 1) * y->L);
    double slots = 0;
    for (int64_t e = i * y->L; e < (i + 1) * y->L; e++)
      slots += draw_touch(&y->global, e, e + 1);
    y->base_slots[i] = (1 - y->lam) * slots;
  }
  if (y->lam > 0 && y->sig < 1)
    for (int64_t g = 0; g < y->m; g++)
      for (int64_t x = 0; x < y->nghits[g]; x++)
        y->base_slots[y->ghits[g][x].rank] +=
            y->lam * (1 - y->sig) * y->gweight[g] * y->ghits[g][x].slots;
  return XM_OK;
}

void xm_fab_synth_result_free(xm_fab_synth_result_t *r) {
  if (!r) return;
  xm_fab_matrix_free(&r->dispatch);
  xm_fab_matrix_free(&r->combine);
  free(r->expert_share);
  memset(r, 0, sizeof *r);
}

xm_status_t xm_fab_synth(const xm_fab_synth_t *s, xm_fab_synth_result_t *out, xm_diag_t *diag) {
  memset(out, 0, sizeof *out);
  int before = xm_diag_error_count(diag);
  check_synth(s, diag);
  if (xm_diag_error_count(diag) > before) return XM_ERR_INVALID_INPUT;
  xm_layout_t l = {
      .dp = s->world, .tp = 1, .ep = s->ep, .rbd = s->rbd, .ranks_per_node = s->ranks_per_server};
  out->rbd_active = xm_layout_rbd_active(&l);
  synth_t y;
  memset(&y, 0, sizeof y);
  y.s = s;
  y.n = s->by_server ? s->world / s->ranks_per_server : s->world;
  double row = (double)s->hidden * s->bytes_per_element;
  y.row_combine = row;
  y.row_dispatch = out->rbd_active ? row + 8.0 * (double)s->top_k : row;
  xm_status_t st = synth_prepare(&y, diag);
  block_t *blocks = st == XM_OK ? malloc((size_t)s->ep * sizeof *blocks) : NULL;
  out->expert_share = st == XM_OK ? malloc((size_t)s->experts * sizeof *out->expert_share) : NULL;
  if (st == XM_OK && (!blocks || !out->expert_share)) st = XM_ERR_NO_MEMORY;
  if (st == XM_OK) st = xm_fab_matrix_init(&out->dispatch, y.n);
  if (st == XM_OK) st = xm_fab_matrix_init(&out->combine, y.n);
  if (st == XM_OK) {
    out->experts = s->experts;
    expert_shares(&y, s->world / s->ranks_per_server, out->expert_share);
    for (int64_t first = 0; first < s->world; first += s->ep) {
      /* the group's blocks: its ranks on one server each */
      int64_t nb = 0;
      for (int64_t i = 0; i < s->ep;) {
        int64_t j = i;
        while (j < s->ep && (first + j) / y.rps == (first + i) / y.rps)
          j++;
        double base = j - i == 1 ? y.base_touch[i] : base_range(&y, i * y.L, j * y.L);
        blocks[nb++] = (block_t){i, j, base};
        i = j;
      }
      for (int64_t x = 0; x < nb; x++)
        server_rows(&y, first, blocks, nb, blocks[x].i0, blocks[x].i1, out);
    }
  }
  free(blocks);
  synth_free(&y);
  if (st != XM_OK) xm_fab_synth_result_free(out);
  return st;
}

/* ---- locality ------------------------------------------------------------------ */

/* Unordered server pairs a < b with the bytes both ways, index a * S + b
 * kept in .i. */
typedef struct {
  double w;
  int64_t i;
} pair_t;

static bool pair_before(pair_t a, pair_t b) { return a.w > b.w || (a.w == b.w && a.i < b.i); }

/* Server pair weights of m (owned array of *count pairs with bytes > 0 when
 * positive_only, else all pairs). */
static pair_t *server_pairs(const xm_fab_matrix_t *m, int64_t rps, bool positive_only,
                            int64_t *servers, int64_t *count) {
  *count = 0;
  *servers = 0;
  if (rps < 1 || m->n < 1 || m->n % rps != 0) return NULL;
  int64_t S = m->n / rps;
  double *sm = calloc((size_t)(S * S), sizeof *sm);
  pair_t *p = malloc((size_t)(S * (S - 1) / 2 + 1) * sizeof *p);
  if (!sm || !p) {
    free(sm);
    free(p);
    return NULL;
  }
  for (int64_t i = 0; i < m->n; i++)
    for (int64_t j = 0; j < m->n; j++)
      sm[(i / rps) * S + j / rps] += m->v[i * m->n + j];
  int64_t n = 0;
  for (int64_t a = 0; a < S; a++)
    for (int64_t b = a + 1; b < S; b++) {
      double w = sm[a * S + b] + sm[b * S + a];
      if (!positive_only || w > 0) p[n++] = (pair_t){w, a * S + b};
    }
  free(sm);
  *servers = S;
  *count = n;
  return p;
}

/* Reorders p so that p[0..k) are its k first pairs under pair_before. */
static void select_top(pair_t *p, int64_t n, int64_t k) {
  if (k <= 0 || k >= n) return;
  int64_t lo = 0, hi = n - 1, t = k - 1;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    /* median of three as the pivot, moved to hi */
    if (pair_before(p[hi], p[lo])) {
      pair_t x = p[hi];
      p[hi] = p[lo];
      p[lo] = x;
    }
    if (pair_before(p[mid], p[lo])) {
      pair_t x = p[mid];
      p[mid] = p[lo];
      p[lo] = x;
    }
    if (pair_before(p[hi], p[mid])) {
      pair_t x = p[hi];
      p[hi] = p[mid];
      p[mid] = x;
    }
    pair_t pivot = p[mid];
    p[mid] = p[hi];
    p[hi] = pivot;
    int64_t store = lo;
    for (int64_t i = lo; i < hi; i++)
      if (pair_before(p[i], pivot)) {
        pair_t x = p[i];
        p[i] = p[store];
        p[store++] = x;
      }
    p[hi] = p[store];
    p[store] = pivot;
    if (store == t) return;
    if (store < t)
      lo = store + 1;
    else
      hi = store - 1;
  }
}

xm_status_t xm_fab_locality(const xm_fab_matrix_t *m, int64_t ranks_per_server,
                            int64_t region_servers, xm_fab_locality_t *out) {
  memset(out, 0, sizeof *out);
  if (ranks_per_server < 1 || m->n < 1 || m->n % ranks_per_server != 0 || region_servers < 0)
    return XM_ERR_INVALID_INPUT;
  int64_t rps = ranks_per_server, S = m->n / rps, R = region_servers > 0 ? region_servers : 1;
  double total = 0, server = 0, region = 0;
  for (int64_t i = 0; i < m->n; i++)
    for (int64_t j = 0; j < m->n; j++) {
      double b = m->v[i * m->n + j];
      int64_t a = i / rps, c = j / rps;
      total += b;
      if (a == c) server += b;
      if (a / R == c / R) region += b;
    }
  out->total = total;
  out->intra_server = total > 0 ? server / total : 0;
  out->intra_region = total > 0 ? region / total : 0;
  out->inter_server = total - server;
  out->servers = S;
  out->pairs = S * (S - 1) / 2;
  int64_t servers = 0, count = 0;
  pair_t *p = server_pairs(m, rps, true, &servers, &count);
  if (!p && S > 1) return XM_ERR_NO_MEMORY;
  out->active_pairs = count;
  free(p);
  return XM_OK;
}

double xm_fab_top_pairs_share(const xm_fab_matrix_t *m, int64_t ranks_per_server, int64_t k) {
  int64_t S = 0, n = 0;
  pair_t *p = server_pairs(m, ranks_per_server, true, &S, &n);
  if (!p) return 0;
  double all = 0, top = 0;
  for (int64_t i = 0; i < n; i++)
    all += p[i].w;
  int64_t kk = k < n ? k : n;
  select_top(p, n, kk);
  for (int64_t i = 0; i < kk; i++)
    top += p[i].w;
  free(p);
  return all > 0 ? top / all : 0;
}

int64_t xm_fab_pairs_for_fraction(int64_t servers, double fraction) {
  double pairs = (double)servers * (double)(servers - 1) / 2.0;
  if (!(fraction > 0) || !(pairs > 0)) return 1;
  double k = ceil(fraction * pairs - 1e-9);
  return k < 1 ? 1 : k > pairs ? (int64_t)pairs : (int64_t)k;
}

double xm_fab_matrix_tvd(const xm_fab_matrix_t *a, const xm_fab_matrix_t *b) {
  if (a->n != b->n) return NAN;
  double A = xm_fab_matrix_total(a), B = xm_fab_matrix_total(b);
  if (!(A > 0) && !(B > 0)) return 0;
  if (!(A > 0) || !(B > 0)) return 1;
  double d = 0;
  for (int64_t i = 0; i < a->n * a->n; i++)
    d += fabs(a->v[i] / A - b->v[i] / B);
  return 0.5 * d;
}

double xm_fab_top_pairs_overlap(const xm_fab_matrix_t *a, const xm_fab_matrix_t *b,
                                int64_t ranks_per_server, int64_t k) {
  if (a->n != b->n) return NAN;
  int64_t S = 0, na = 0, nb = 0;
  pair_t *pa = server_pairs(a, ranks_per_server, true, &S, &na);
  pair_t *pb = server_pairs(b, ranks_per_server, true, &S, &nb);
  unsigned char *mark = S > 0 ? calloc((size_t)(S * S), 1) : NULL;
  double r = NAN;
  if (pa && pb && mark) {
    int64_t ka = k < na ? k : na, kb = k < nb ? k : nb;
    select_top(pa, na, ka);
    select_top(pb, nb, kb);
    for (int64_t i = 0; i < ka; i++)
      mark[pa[i].i] = 1;
    int64_t both = 0;
    for (int64_t i = 0; i < kb; i++)
      both += mark[pb[i].i];
    int64_t big = ka > kb ? ka : kb;
    r = big > 0 ? (double)both / (double)big : 1.0;
  }
  free(pa);
  free(pb);
  free(mark);
  return r;
}
