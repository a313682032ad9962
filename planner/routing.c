/* planner/routing.c — reading a measured routing (a histogram or a training
 * log) and answering what it means for a layout (planner/routing.h).
 *
 * Loading validates everything and reports every problem with its place:
 * a histogram is one JSON document (places are JSON pointers, syntax errors
 * line:column); a log is JSON lines (places are "line N", with a pointer in
 * the message). After loading, the shares are normalised rows with prefix
 * sums, so a block's share is two lookups, and the answers for the
 * divisors of the expert count (the EP degrees and node counts the planner
 * tries) are computed once into a small table.
 *
 * The formulas are in docs/cost-model.md ("Measured routing"); the file
 * formats in docs/plan-json.md ("Measured routing").
 */
#include "planner/routing.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "planner/cost.h"
#include "support/strbuf.h"

#define MAX_EXPERTS ((int64_t)1 << 20)
#define MAX_LAYERS 100000
#define SUM_TOLERANCE 1e-3 /* expert_load rows must sum to 1 within this */
#define COPIES_SLACK 0.05  /* relative slack on a logged ratio's bounds */
#define MAX_LOG_ERRORS 20  /* per log file; the rest are counted */

const char *xm_routing_kind_name(xm_routing_kind_t k) {
  return k == XM_ROUTING_HISTOGRAM ? "histogram" : k == XM_ROUTING_LOG ? "log" : "?";
}

void xm_routing_free(xm_routing_t *r) {
  if (!r) return;
  free(r->source);
  free(r->load);
  free(r->cdf);
  free(r);
}

static void err(xm_diag_t *d, const char *source, const char *place, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void err(xm_diag_t *d, const char *source, const char *place, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  xm_diag_addv(d, XM_DIAG_ERROR, source, place, fmt, ap);
  va_end(ap);
}

/* ---- queries ------------------------------------------------------------------ */

/* Share of the slots of layer l on expert positions [0, x), x in [0, E]
 * (a histogram row read as a density over the expert index). */
static double cdf_at(const xm_routing_t *r, int64_t l, double x) {
  const double *c = r->cdf + l * (r->experts + 1);
  if (x <= 0) return 0.0;
  if (x >= (double)r->experts) return c[r->experts];
  int64_t i = (int64_t)floor(x);
  return c[i] + (x - (double)i) * r->load[l * r->experts + i];
}

/* Share of block i of `parts` in layer l. */
static double block_share(const xm_routing_t *r, int64_t l, int64_t i, int64_t parts) {
  double E = (double)r->experts;
  return cdf_at(r, l, E * (double)(i + 1) / (double)parts) -
         cdf_at(r, l, E * (double)i / (double)parts);
}

static void compute_imbalance(const xm_routing_t *r, int64_t parts, double *mean, double *worst) {
  *mean = *worst = 1.0;
  if (parts <= 1 || r->layers == 0) return;
  double sum = 0, mx = 0;
  for (int64_t l = 0; l < r->layers; l++) {
    double top = 0;
    for (int64_t i = 0; i < parts; i++) {
      double s = block_share(r, l, i, parts);
      if (s > top) top = s;
    }
    double f = top * (double)parts;
    sum += f;
    if (f > mx) mx = f;
  }
  *mean = sum / (double)r->layers;
  *worst = mx;
}

/* The ratio of the expected distinct blocks under the loads to that under
 * uniform loads, both with independent slots (docs/cost-model.md). */
static double compute_dedup(const xm_routing_t *r, int64_t top_k, int64_t parts) {
  if (r->rbd_measured) return r->rbd_dedup;
  if (parts <= 1 || r->layers == 0 || top_k < 1) return 1.0;
  double k = (double)top_k, p = (double)parts;
  double uniform = p * (1.0 - pow(1.0 - 1.0 / p, k));
  double sum = 0;
  for (int64_t l = 0; l < r->layers; l++) {
    double c = 0;
    for (int64_t i = 0; i < parts; i++) {
      double s = block_share(r, l, i, parts);
      if (s > 1) s = 1;
      if (s > 0) c += 1.0 - pow(1.0 - s, k);
    }
    sum += c / uniform;
  }
  return sum / (double)r->layers;
}

static int cache_find(const xm_routing_t *r, int64_t parts) {
  for (int i = 0; i < r->ncache; i++)
    if (r->cache[i].parts == parts) return i;
  return -1;
}

double xm_routing_imbalance(const xm_routing_t *r, int64_t parts, bool worst) {
  if (!r || parts <= 1 || r->layers == 0) return 1.0;
  int i = cache_find(r, parts);
  if (i >= 0) return worst ? r->cache[i].imb_worst : r->cache[i].imb_mean;
  double mean, mx;
  compute_imbalance(r, parts, &mean, &mx);
  return worst ? mx : mean;
}

double xm_routing_dedup(const xm_routing_t *r, int64_t top_k, int64_t parts) {
  if (!r) return 1.0;
  if (r->rbd_measured) return r->rbd_dedup;
  int i = top_k == r->top_k ? cache_find(r, parts) : -1;
  if (i >= 0) return r->cache[i].dedup;
  return compute_dedup(r, top_k, parts);
}

double xm_routing_rbd_copies(const xm_routing_t *r, int64_t experts, int64_t top_k, int64_t parts) {
  double u = xm_cost_rbd_expected_copies(experts, top_k, parts);
  if (!r || parts < 2 || experts <= parts || !(u > 0)) return u;
  double c = u * xm_routing_dedup(r, top_k, parts);
  double hi = (double)(top_k < parts ? top_k : parts);
  if (c > hi) c = hi;
  if (c < 1.0) c = 1.0;
  return c;
}

static void prepare(xm_routing_t *r) {
  r->ncache = 0;
  for (int64_t p = 1; p <= r->experts && r->ncache < XM_ROUTING_CACHE; p++) {
    if (r->experts % p != 0) continue;
    double mean, mx;
    compute_imbalance(r, p, &mean, &mx);
    r->cache[r->ncache].parts = p;
    r->cache[r->ncache].imb_mean = mean;
    r->cache[r->ncache].imb_worst = mx;
    r->cache[r->ncache].dedup = compute_dedup(r, r->top_k, p);
    r->ncache++;
  }
}

/* ---- JSON helpers ------------------------------------------------------------- */

/* Parses one JSON document of `len` bytes (no NUL inside); NULL and
 * *out_off = the offset of the syntax error when it is not one. */
static cJSON *parse_doc(const char *text, size_t len, size_t *out_off) {
  char *buf = malloc(len + 1);
  if (!buf) return NULL;
  memcpy(buf, text, len);
  buf[len] = '\0';
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(buf, len + 1, &end, 1);
  *out_off = end && end >= buf && end <= buf + len ? (size_t)(end - buf) : len;
  free(buf);
  return root;
}

/* A whole number in [min, max]; false otherwise. */
static bool get_int(const cJSON *v, int64_t min, int64_t max, int64_t *out) {
  if (!cJSON_IsNumber(v)) return false;
  double d = v->valuedouble;
  if (!isfinite(d) || d != floor(d) || d < (double)min || d > (double)max) return false;
  *out = (int64_t)d;
  return true;
}

static bool get_nonneg(const cJSON *v, double *out) {
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0) return false;
  *out = v->valuedouble;
  return true;
}

/* ---- histogram ------------------------------------------------------------------ */

/* Reads the rows of /expert_load or /expert_counts into r->load (normalised). */
static void read_loads(xm_routing_t *r, const cJSON *arr, const char *key, bool counts,
                       xm_diag_t *d) {
  const char *src = r->source;
  char place[96];
  snprintf(place, sizeof place, "/%s", key);
  if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) == 0) {
    err(d, src, place, "must be a non-empty array: %s per expert, or one such array per MoE layer",
        counts ? "slot counts" : "shares summing to 1");
    return;
  }
  bool nested = cJSON_IsArray(arr->child);
  int64_t layers = nested ? cJSON_GetArraySize(arr) : 1;
  if (layers > MAX_LAYERS) {
    err(d, src, place, "has %lld layers, at most %d", (long long)layers, MAX_LAYERS);
    return;
  }
  if (r->experts < 1) return; /* reported at /experts */
  if (layers * r->experts > ((int64_t)1 << 26)) {
    err(d, src, place, "has %lld x %lld values, more than this reader takes (2^26)",
        (long long)layers, (long long)r->experts);
    return;
  }
  r->load = calloc((size_t)(layers * r->experts), sizeof *r->load);
  r->cdf = calloc((size_t)(layers * (r->experts + 1)), sizeof *r->cdf);
  XM_ASSERT(r->load && r->cdf);
  r->layers = layers;
  for (int64_t l = 0; l < layers; l++) {
    const cJSON *row = nested ? cJSON_GetArrayItem(arr, (int)l) : arr;
    char rp[96];
    if (nested)
      snprintf(rp, sizeof rp, "/%s/%lld", key, (long long)l);
    else
      snprintf(rp, sizeof rp, "/%s", key);
    if (!cJSON_IsArray(row)) {
      err(d, src, rp, "must be an array of %lld numbers like /%s/0 (one row per MoE layer)",
          (long long)r->experts, key);
      continue;
    }
    int64_t n = cJSON_GetArraySize(row);
    if (n != r->experts) {
      err(d, src, rp, "has %lld values, expected one per expert (/experts = %lld)", (long long)n,
          (long long)r->experts);
      continue;
    }
    double sum = 0;
    bool ok = true;
    int64_t e = 0;
    for (const cJSON *v = row->child; v; v = v->next, e++) {
      double x;
      if (!get_nonneg(v, &x)) {
        char vp[128];
        snprintf(vp, sizeof vp, "%s/%lld", rp, (long long)e);
        err(d, src, vp, "must be a finite number >= 0");
        ok = false;
        continue;
      }
      r->load[l * r->experts + e] = x;
      sum += x;
    }
    if (!ok) continue;
    if (!(sum > 0)) {
      err(d, src, rp, "is all zeros: no slot to measure");
      continue;
    }
    if (!counts && fabs(sum - 1.0) > SUM_TOLERANCE) {
      err(d, src, rp,
          "the shares sum to %.6g, expected 1 (within %g); give raw counts as "
          "/expert_counts",
          sum, SUM_TOLERANCE);
      continue;
    }
    double *c = r->cdf + l * (r->experts + 1);
    c[0] = 0;
    for (int64_t i = 0; i < r->experts; i++) {
      r->load[l * r->experts + i] /= sum;
      c[i + 1] = c[i] + r->load[l * r->experts + i];
    }
  }
}

static void read_rbd(xm_routing_t *r, const cJSON *o, xm_diag_t *d) {
  const char *src = r->source;
  if (!cJSON_IsObject(o)) {
    err(d, src, "/rbd",
        "must be an object: {\"nodes\": N, \"copies_per_token\": C} or {\"nodes\": N, "
        "\"inter_rows\": A, \"flat_inter_rows\": B}");
    return;
  }
  for (const cJSON *m = o->child; m; m = m->next) {
    if (strcmp(m->string, "nodes") && strcmp(m->string, "copies_per_token") &&
        strcmp(m->string, "inter_rows") && strcmp(m->string, "flat_inter_rows")) {
      char p[160];
      snprintf(p, sizeof p, "/rbd/%.100s", m->string);
      err(d, src, p,
          "unknown member (expected nodes, copies_per_token, inter_rows, "
          "flat_inter_rows)");
    }
  }
  int64_t n = 0;
  const cJSON *nv = cJSON_GetObjectItemCaseSensitive(o, "nodes");
  if (!nv)
    err(d, src, "/rbd/nodes", "missing: the nodes the measurement's EP group spanned (>= 2)");
  else if (!get_int(nv, 2, r->experts > 1 ? r->experts : 2, &n))
    err(d, src, "/rbd/nodes", "must be a whole number in [2, %lld] (the experts)",
        (long long)(r->experts > 1 ? r->experts : 2));
  const cJSON *cv = cJSON_GetObjectItemCaseSensitive(o, "copies_per_token");
  const cJSON *iv = cJSON_GetObjectItemCaseSensitive(o, "inter_rows");
  const cJSON *fv = cJSON_GetObjectItemCaseSensitive(o, "flat_inter_rows");
  if ((cv != NULL) == (iv != NULL || fv != NULL)) {
    err(d, src, "/rbd", "give either copies_per_token or both inter_rows and flat_inter_rows");
    return;
  }
  if (n < 2 || r->top_k < 1) return;
  double hi = (double)(r->top_k < n ? r->top_k : n), c = 0;
  if (cv) {
    if (!cJSON_IsNumber(cv) || !isfinite(cv->valuedouble) || cv->valuedouble < 1.0 ||
        cv->valuedouble > hi) {
      err(d, src, "/rbd/copies_per_token",
          "must be a number in [1, min(top_k, nodes)] = [1, %g]: the distinct nodes a "
          "token's experts land on",
          hi);
      return;
    }
    c = cv->valuedouble;
  } else {
    double a = 0, b = 0;
    bool ok = true;
    if (!iv || !get_nonneg(iv, &a)) {
      err(d, src, "/rbd/inter_rows", "must be a number >= 0 (RBD pilot rows across nodes)");
      ok = false;
    }
    if (!fv || !get_nonneg(fv, &b) || !(b > 0)) {
      err(d, src, "/rbd/flat_inter_rows",
          "must be a number > 0 (the slots a flat dispatch would send across nodes)");
      ok = false;
    }
    if (!ok) return;
    if (a > b) {
      err(d, src, "/rbd/inter_rows", "(%g) exceeds /rbd/flat_inter_rows (%g)", a, b);
      return;
    }
    c = a / b * (double)r->top_k;
    if (c < 1.0 - COPIES_SLACK || c > hi * (1 + COPIES_SLACK)) {
      err(d, src, "/rbd",
          "inter_rows / flat_inter_rows x top_k = %.4g distinct nodes per token, outside "
          "[1, min(top_k, nodes)] = [1, %g]",
          c, hi);
      return;
    }
    r->inter_rows = a;
    r->flat_inter_rows = b;
  }
  r->rbd_measured = true;
  r->rbd_nodes = n;
  r->rbd_copies = c < 1 ? 1 : c > hi ? hi : c;
  double u = xm_cost_rbd_expected_copies(r->experts, r->top_k, n);
  r->rbd_dedup = u > 0 ? r->rbd_copies / u : 1.0;
}

static void read_histogram(xm_routing_t *r, const cJSON *root, const xm_routing_options_t *o,
                           xm_diag_t *d) {
  const char *src = r->source;
  r->kind = XM_ROUTING_HISTOGRAM;
  static const char *const known[] = {"comment",     "experts",       "top_k",
                                      "expert_load", "expert_counts", "rbd"};
  for (const cJSON *m = root->child; m; m = m->next) {
    size_t i = 0;
    while (i < sizeof known / sizeof *known && strcmp(m->string, known[i]) != 0)
      i++;
    if (i == sizeof known / sizeof *known) {
      char p[128];
      snprintf(p, sizeof p, "/%.100s", m->string);
      err(d, src, p,
          "unknown member (a routing histogram has experts, top_k, expert_load or "
          "expert_counts, rbd, comment)");
    }
  }
  const cJSON *ev = cJSON_GetObjectItemCaseSensitive(root, "experts");
  if (!ev)
    err(d, src, "/experts", "missing: the routed experts the histogram covers");
  else if (!get_int(ev, 1, MAX_EXPERTS, &r->experts))
    err(d, src, "/experts", "must be a whole number in [1, %lld]", (long long)MAX_EXPERTS);
  const cJSON *kv = cJSON_GetObjectItemCaseSensitive(root, "top_k");
  if (!kv)
    err(d, src, "/top_k", "missing: the experts each token is routed to");
  else if (r->experts > 0 && !get_int(kv, 1, r->experts, &r->top_k))
    err(d, src, "/top_k", "must be a whole number in [1, %lld] (/experts)", (long long)r->experts);
  if (o && o->experts > 0 && r->experts > 0 && r->experts != o->experts)
    err(d, src, "/experts", "the histogram has %lld experts, the model %lld", (long long)r->experts,
        (long long)o->experts);
  if (o && o->top_k > 0 && r->top_k > 0 && r->top_k != o->top_k)
    err(d, src, "/top_k", "the histogram has top_k %lld, the model %lld", (long long)r->top_k,
        (long long)o->top_k);
  if (o && o->log_nodes != 0)
    err(d, "--routing-nodes", NULL,
        "applies to a training log; a histogram gives its node count at /rbd/nodes");
  const cJSON *lv = cJSON_GetObjectItemCaseSensitive(root, "expert_load");
  const cJSON *cv = cJSON_GetObjectItemCaseSensitive(root, "expert_counts");
  if (lv && cv)
    err(d, src, "/expert_counts", "give expert_load (shares) or expert_counts, not both");
  else if (!lv && !cv)
    err(d, src, "/expert_load",
        "missing: the share of the token slots each expert received (or /expert_counts)");
  else
    read_loads(r, lv ? lv : cv, lv ? "expert_load" : "expert_counts", cv != NULL, d);
  const cJSON *bv = cJSON_GetObjectItemCaseSensitive(root, "rbd");
  if (bv) read_rbd(r, bv, d);
}

/* ---- log --------------------------------------------------------------------- */

/* One line of a log: "step" required, "rbd" summed when present. */
static void read_log_line(xm_routing_t *r, const char *line, size_t len, int64_t no, int *errors,
                          xm_diag_t *d) {
  char place[48];
  snprintf(place, sizeof place, "line %lld", (long long)no);
  size_t off = 0;
  cJSON *o = parse_doc(line, len, &off);
  if (!o) {
    if ((*errors)++ < MAX_LOG_ERRORS)
      err(d, r->source, place,
          "column %zu: not valid JSON (a --log file has one JSON object "
          "per line)",
          off + 1);
    return;
  }
  r->log_lines++;
  const cJSON *step = cJSON_GetObjectItemCaseSensitive(o, "step");
  if (!cJSON_IsObject(o) || !cJSON_IsNumber(step)) {
    if ((*errors)++ < MAX_LOG_ERRORS)
      err(d, r->source, place, "/step: missing: not a step record of out/train --log");
    cJSON_Delete(o);
    return;
  }
  const cJSON *rbd = cJSON_GetObjectItemCaseSensitive(o, "rbd");
  if (rbd) {
    int64_t a = 0, b = 0;
    const int64_t big = (int64_t)1 << 53;
    if (!cJSON_IsObject(rbd) ||
        !get_int(cJSON_GetObjectItemCaseSensitive(rbd, "inter_rows"), 0, big, &a)) {
      if ((*errors)++ < MAX_LOG_ERRORS)
        err(d, r->source, place, "/rbd/inter_rows: must be a whole number >= 0");
    } else if (!get_int(cJSON_GetObjectItemCaseSensitive(rbd, "flat_inter_rows"), 0, big, &b)) {
      if ((*errors)++ < MAX_LOG_ERRORS)
        err(d, r->source, place, "/rbd/flat_inter_rows: must be a whole number >= 0");
    } else if (a > b) {
      if ((*errors)++ < MAX_LOG_ERRORS)
        err(d, r->source, place,
            "/rbd/inter_rows (%lld) exceeds /rbd/flat_inter_rows (%lld): RBD sends at most "
            "one row per (token, node)",
            (long long)a, (long long)b);
    } else {
      r->log_rbd_lines++;
      r->inter_rows += (double)a;
      r->flat_inter_rows += (double)b;
    }
  }
  cJSON_Delete(o);
}

static void read_log(xm_routing_t *r, const char *text, size_t len, const xm_routing_options_t *o,
                     xm_diag_t *d) {
  r->kind = XM_ROUTING_LOG;
  int errors = 0;
  int64_t no = 0;
  for (size_t at = 0; at < len;) {
    const char *nl = memchr(text + at, '\n', len - at);
    size_t n = nl ? (size_t)(nl - (text + at)) : len - at;
    no++;
    size_t i = 0;
    while (i < n && strchr(" \t\r", text[at + i]))
      i++;
    if (i < n) read_log_line(r, text + at, n, no, &errors, d);
    at += n + 1;
  }
  if (errors > MAX_LOG_ERRORS)
    err(d, r->source, NULL, "%d more bad lines not shown", errors - MAX_LOG_ERRORS);
  if (errors) return;
  int64_t E = o ? o->experts : 0, k = o ? o->top_k : 0, n = o ? o->log_nodes : 0;
  if (E < 1 || k < 1) {
    err(d, r->source, NULL,
        "a training log needs the model's experts and top_k (a dense model "
        "has no routing)");
    return;
  }
  r->experts = E;
  r->top_k = k;
  if (r->log_rbd_lines == 0) {
    err(d, r->source, NULL,
        "no line has an \"rbd\" member: only the log of an RBD run (--rbd, an EP group across "
        "nodes) measures how a token's experts share nodes; give a routing histogram instead");
    return;
  }
  if (!(r->flat_inter_rows > 0)) {
    err(d, r->source, NULL, "/rbd/flat_inter_rows is 0 on every line: no slot crossed nodes");
    return;
  }
  if (n < 2 || n > E) {
    err(d, "--routing-nodes", NULL,
        "%s needs the nodes the run's EP group spanned, a whole number in [2, %lld] (ep / "
        "ranks-per-node of the run: 2 for --ep 4 --ranks-per-node 2)",
        r->source, (long long)E);
    return;
  }
  double hi = (double)(k < n ? k : n);
  double c = r->inter_rows / r->flat_inter_rows * (double)k;
  if (c < 1.0 - COPIES_SLACK || c > hi * (1 + COPIES_SLACK)) {
    err(d, r->source, NULL,
        "inter_rows / flat_inter_rows x top_k = %.4g distinct nodes per token, outside [1, "
        "min(top_k, nodes)] = [1, %g]: is --routing-nodes %lld the nodes the run's EP group "
        "spanned, and top_k %lld the run's?",
        c, hi, (long long)n, (long long)k);
    return;
  }
  r->rbd_measured = true;
  r->rbd_nodes = n;
  r->rbd_copies = c < 1 ? 1 : c > hi ? hi : c;
  double u = xm_cost_rbd_expected_copies(E, k, n);
  r->rbd_dedup = u > 0 ? r->rbd_copies / u : 1.0;
}

/* ---- entry points --------------------------------------------------------------- */

/* The first non-blank line, as [*start, *start + *n). */
static bool first_line(const char *text, size_t len, size_t *start, size_t *n) {
  size_t at = 0;
  while (at < len) {
    const char *nl = memchr(text + at, '\n', len - at);
    size_t m = nl ? (size_t)(nl - (text + at)) : len - at;
    for (size_t i = 0; i < m; i++)
      if (!strchr(" \t\r", text[at + i])) {
        *start = at;
        *n = m;
        return true;
      }
    at += m + 1;
  }
  return false;
}

xm_status_t xm_routing_load_text(const char *text, size_t len, const char *source,
                                 const xm_routing_options_t *opts, xm_diag_t *diag,
                                 xm_routing_t **out) {
  *out = NULL;
  source = source ? source : "routing";
  size_t s0 = 0, n0 = 0;
  if (!text || !first_line(text, len, &s0, &n0)) {
    err(diag, source, NULL, "the routing file is empty");
    return XM_ERR_INVALID_INPUT;
  }
  const char *nul = memchr(text, '\0', len);
  if (nul) {
    err(diag, source, NULL, "contains a NUL byte at offset %zu", (size_t)(nul - text));
    return XM_ERR_INVALID_INPUT;
  }
  xm_routing_t *r = calloc(1, sizeof *r);
  if (!r) return XM_ERR_NO_MEMORY;
  r->source = strdup(source);
  if (!r->source) {
    free(r);
    return XM_ERR_NO_MEMORY;
  }
  int before = xm_diag_error_count(diag);
  size_t off = 0;
  cJSON *root = parse_doc(text, len, &off);
  bool is_log;
  if (root) {
    is_log = cJSON_IsObject(root) && cJSON_GetObjectItemCaseSensitive(root, "step");
  } else {
    size_t o1 = 0;
    cJSON *first = parse_doc(text + s0, n0, &o1);
    is_log = first && cJSON_IsObject(first) && cJSON_GetObjectItemCaseSensitive(first, "step");
    cJSON_Delete(first);
    if (!is_log) {
      int line, col;
      xm_text_line_col(text, off, &line, &col);
      char place[48];
      snprintf(place, sizeof place, "%d:%d", line, col);
      err(diag, source, place,
          "JSON syntax error: neither a routing histogram (one JSON object) nor an out/train "
          "--log file (one JSON object per line)");
    }
  }
  if (root && !is_log && !cJSON_IsObject(root)) {
    err(diag, source, "", "must be a JSON object (a routing histogram) or JSON lines (a --log)");
  } else if (root && !is_log) {
    read_histogram(r, root, opts, diag);
  } else if (is_log) {
    if (opts && opts->log_nodes != 0 && opts->log_nodes < 2)
      err(diag, "--routing-nodes", NULL, "must be at least 2");
    else
      read_log(r, text, len, opts, diag);
  }
  cJSON_Delete(root);
  if (xm_diag_error_count(diag) > before) {
    xm_routing_free(r);
    return XM_ERR_INVALID_INPUT;
  }
  prepare(r);
  *out = r;
  return XM_OK;
}

xm_status_t xm_routing_load_file(const char *path, const xm_routing_options_t *opts,
                                 xm_diag_t *diag, xm_routing_t **out) {
  *out = NULL;
  char *text = NULL;
  size_t len = 0;
  int e = xm_read_file(path, &text, &len);
  if (e != 0) {
    char why[160];
    xm_diag_add(diag, XM_DIAG_ERROR, path, NULL, "cannot read the routing file: %s",
                xm_read_error(e, XM_READ_LIMIT_TEXT, why, sizeof why));
    return XM_ERR_IO;
  }
  xm_status_t st = xm_routing_load_text(text, len, path, opts, diag, out);
  free(text);
  return st;
}
