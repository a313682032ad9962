/* passes/pass_manager.c — pipeline strings, the run loop, dumps and timing.
 *
 * A pipeline runs in two phases. Parsing turns "a, b{k=v k2=\"v 2\"}, c" into
 * a list of (registered pass, options) and reports every unknown pass or
 * option, with the nearest registered name, before anything touches the
 * module: a typo at the end of a long pipeline must not cost a half-run.
 * Syntax errors stop the parse at the first one, since what follows a
 * broken brace is noise. Parsed keys and values are copied, NUL-terminated
 * and unquoted, into one storage block owned by the pipeline, so options
 * handed to passes stay valid for the whole run.
 *
 * Running gives each pass its own diagnostic list and forwards the entries
 * prefixed with the pass name, so a message says which pass raised it. The
 * verifier runs after every pass when asked (the default): a pass that
 * leaves broken IR is a compiler bug, reported as XM_ERR_INTERNAL with
 * "after pass 'X': ...". Times are wall-clock (CLOCK_MONOTONIC) and the
 * report has a fixed layout so that tests can match its lines.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ir/text.h"
#include "ir/verify.h"
#include "passes/pass.h"
#include "passes/pipeline.h"
#include "support/strbuf.h"

const char *xm_pass_option(const xm_pass_options_t *o, const char *key) {
  if (!o) return NULL;
  for (int i = 0; i < o->num; i++)
    if (strcmp(o->keys[i], key) == 0) return o->values[i];
  return NULL;
}

void xm_pass_manager_options_default(xm_pass_manager_options_t *o) {
  memset(o, 0, sizeof *o);
  o->verify_each = true;
}

/* ---- parsing ----------------------------------------------------------- */

typedef struct {
  const char *s; /* the pipeline text */
  size_t pos;
  char *store; /* next free byte of the storage block */
  xm_diag_t *diag;
  int errors;
} parser_t;

static void perr(parser_t *p, size_t at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void perr(parser_t *p, size_t at, const char *fmt, ...) {
  char place[48];
  snprintf(place, sizeof place, "pipeline:%zu", at + 1);
  va_list ap;
  va_start(ap, fmt);
  xm_diag_addv(p->diag, XM_DIAG_ERROR, NULL, place, fmt, ap);
  va_end(ap);
  p->errors++;
}

static void skip_ws(parser_t *p) {
  while (p->s[p->pos] && isspace((unsigned char)p->s[p->pos]))
    p->pos++;
}

static bool is_name_char(char c) {
  return isalnum((unsigned char)c) || c == '-' || c == '_' || c == '.';
}

/* Copies s[from, to) into the storage block; returns the copy. */
static const char *store(parser_t *p, size_t from, size_t to) {
  char *d = p->store;
  memcpy(d, p->s + from, to - from);
  d[to - from] = '\0';
  p->store += to - from + 1;
  return d;
}

/* Describes the character at the cursor for messages. */
static const char *here(const parser_t *p, char buf[8]) {
  char c = p->s[p->pos];
  if (!c) return "end of pipeline";
  snprintf(buf, 8, "'%c'", c);
  return buf;
}

static void list_passes(xm_strbuf_t *b) {
  for (int i = 0; i < xm_pass_count(); i++)
    xm_strbuf_printf(b, "%s%s", i ? ", " : "", xm_pass_get(i)->name);
}

static void report_unknown_pass(parser_t *p, size_t at, const char *name) {
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  const char *best = NULL;
  int best_d = 0;
  for (int i = 0; i < xm_pass_count(); i++) {
    int d = xm_edit_distance(name, xm_pass_get(i)->name);
    if (!best || d < best_d) best = xm_pass_get(i)->name, best_d = d;
  }
  /* Close enough to be a typo: at most half the name's letters differ. */
  int limit = ((int)strlen(name) + 1) / 2;
  if (best && best_d <= (limit < 1 ? 1 : limit)) xm_strbuf_printf(&b, "; did you mean '%s'?", best);
  xm_strbuf_puts(&b, " (registered passes: ");
  list_passes(&b);
  xm_strbuf_puts(&b, ")");
  perr(p, at, "unknown pass '%s'%s", name, xm_strbuf_cstr(&b));
  xm_strbuf_free(&b);
}

static bool pass_accepts(const xm_pass_info_t *info, const char *key) {
  for (const char *const *o = info->option_names; o && *o; o++)
    if (strcmp(*o, key) == 0) return true;
  return false;
}

static void report_unknown_option(parser_t *p, size_t at, const xm_pass_info_t *info,
                                  const char *key) {
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  for (const char *const *o = info->option_names; o && *o; o++)
    xm_strbuf_printf(&b, "%s%s", o == info->option_names ? "" : ", ", *o);
  if (b.len)
    perr(p, at, "pass '%s' has no option '%s' (options: %s)", info->name, key, xm_strbuf_cstr(&b));
  else
    perr(p, at, "pass '%s' has no option '%s' (it takes no options)", info->name, key);
  xm_strbuf_free(&b);
}

/* Parses a value after '=': "quoted with \" escapes" or a bare word. */
static const char *parse_value(parser_t *p, const char *key) {
  size_t start = p->pos;
  if (p->s[p->pos] == '"') {
    char *d = p->store;
    for (p->pos++; p->s[p->pos] && p->s[p->pos] != '"'; p->pos++) {
      if (p->s[p->pos] == '\\' && p->s[p->pos + 1]) p->pos++;
      *d++ = p->s[p->pos];
    }
    if (!p->s[p->pos]) {
      perr(p, start, "unterminated string in the value of option '%s'", key);
      return NULL;
    }
    p->pos++;
    *d++ = '\0';
    const char *v = p->store;
    p->store = d;
    return v;
  }
  while (p->s[p->pos] && !isspace((unsigned char)p->s[p->pos]) && !strchr(",{}=\"", p->s[p->pos]))
    p->pos++;
  if (p->pos == start) {
    char buf[8];
    perr(p, start, "expected a value for option '%s', found %s", key, here(p, buf));
    return NULL;
  }
  return store(p, start, p->pos);
}

/* Parses "{k=v k2=v2}" (commas between options also accepted); the cursor
 * is on '{'. Returns false on a syntax error. */
static bool parse_options(parser_t *p, xm_pass_pipeline_entry_t *e, const char *pass_name) {
  size_t open = p->pos++;
  for (;;) {
    while (p->s[p->pos] && (isspace((unsigned char)p->s[p->pos]) || p->s[p->pos] == ','))
      p->pos++;
    char c = p->s[p->pos];
    if (c == '}') {
      p->pos++;
      return true;
    }
    if (!c) {
      perr(p, open, "missing '}' closing the options of pass '%s'", pass_name);
      return false;
    }
    size_t kstart = p->pos;
    while (is_name_char(p->s[p->pos]))
      p->pos++;
    char buf[8];
    if (p->pos == kstart) {
      perr(p, kstart, "expected an option name, found %s", here(p, buf));
      return false;
    }
    const char *key = store(p, kstart, p->pos);
    skip_ws(p);
    if (p->s[p->pos] != '=') {
      perr(p, p->pos, "expected '=' after option '%s', found %s", key, here(p, buf));
      return false;
    }
    p->pos++;
    skip_ws(p);
    const char *value = parse_value(p, key);
    if (!value) return false;
    if (e->info && !pass_accepts(e->info, key)) {
      report_unknown_option(p, kstart, e->info, key);
    } else if (xm_pass_option(&e->options, key)) {
      perr(p, kstart, "option '%s' given twice for pass '%s'", key, pass_name);
    } else if (e->options.num == XM_PASS_MAX_OPTIONS) {
      perr(p, kstart, "pass '%s' is given more than %d options", pass_name, XM_PASS_MAX_OPTIONS);
    } else {
      e->options.keys[e->options.num] = key;
      e->options.values[e->options.num++] = value;
    }
  }
}

/* Parses one "name{options}" entry. Returns false on a syntax error. */
static bool parse_entry(parser_t *p, xm_pass_pipeline_entry_t *e) {
  char buf[8];
  skip_ws(p);
  size_t start = p->pos;
  while (is_name_char(p->s[p->pos]))
    p->pos++;
  if (p->pos == start) {
    if (!p->s[p->pos] || p->s[p->pos] == ',')
      perr(p, start, "empty pass name in the pipeline");
    else
      perr(p, start, "expected a pass name, found %s", here(p, buf));
    return false;
  }
  const char *name = store(p, start, p->pos);
  e->info = xm_pass_find(name);
  if (!e->info) report_unknown_pass(p, start, name);
  skip_ws(p);
  if (p->s[p->pos] == '{' && !parse_options(p, e, name)) return false;
  skip_ws(p);
  char c = p->s[p->pos];
  if (c && c != ',') {
    if (c == '}')
      perr(p, p->pos, "unbalanced '}' after pass '%s'", name);
    else
      perr(p, p->pos, "expected ',' or the end of the pipeline after pass '%s', found %s", name,
           here(p, buf));
    return false;
  }
  return true;
}

void xm_pass_pipeline_free(xm_pass_pipeline_t *p) {
  free(p->storage);
  free(p->entries);
  memset(p, 0, sizeof *p);
}

xm_status_t xm_pass_pipeline_parse(const char *text, xm_diag_t *diag, xm_pass_pipeline_t *out) {
  memset(out, 0, sizeof *out);
  if (!text) text = "";
  parser_t p = {.s = text, .diag = diag};
  skip_ws(&p);
  if (!text[p.pos]) return XM_OK;
  size_t len = strlen(text);
  int max_entries = 1;
  for (size_t i = 0; i < len; i++)
    max_entries += text[i] == ',';
  /* Every stored token is followed in the text by at least one delimiter or
   * the end, so len + 1 bytes hold all of them with their NULs. */
  out->storage = malloc(len + 2);
  out->entries = calloc((size_t)max_entries, sizeof *out->entries);
  if (!out->storage || !out->entries) {
    xm_pass_pipeline_free(out);
    return XM_ERR_NO_MEMORY;
  }
  p.store = out->storage;
  for (;;) {
    XM_ASSERT(out->num < max_entries);
    if (!parse_entry(&p, &out->entries[out->num++])) break;
    if (!text[p.pos]) break;
    p.pos++; /* the ',' */
  }
  if (p.errors) {
    xm_pass_pipeline_free(out);
    return XM_ERR_INVALID_INPUT;
  }
  return XM_OK;
}

/* ---- running ----------------------------------------------------------- */

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Moves the entries of `from` into `to`, each message prefixed. */
static void forward_diag(xm_diag_t *to, xm_diag_t *from, const char *prefix) {
  for (int i = 0; i < from->count; i++) {
    const xm_diag_entry_t *e = &from->entries[i];
    xm_diag_add(to, e->level, e->file, e->place, "%s%s", prefix, e->message);
  }
  xm_diag_free(from);
}

static void dump_ir(FILE *out, const char *pass_name, const xm_ir_module_t *m) {
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  xm_strbuf_printf(&b, "// -----// IR Dump After %s //----- //\n", pass_name);
  xm_ir_print(m, &b);
  if (b.len && b.data[b.len - 1] != '\n') xm_strbuf_puts(&b, "\n");
  fputs(xm_strbuf_cstr(&b), out);
  fflush(out);
  xm_strbuf_free(&b);
}

static void print_timing(FILE *out, const xm_pass_pipeline_t *p, int ran, const double *times,
                         double verify_time, bool verified) {
  double total = verify_time;
  for (int i = 0; i < ran; i++)
    total += times[i];
  double scale = total > 0 ? 100.0 / total : 0.0;
  fprintf(out, "===-------------------------------===\n");
  fprintf(out, "  ... Pass execution timing report ...\n");
  fprintf(out, "===-------------------------------===\n");
  fprintf(out, "  Total Execution Time: %.4f seconds\n\n", total);
  fprintf(out, "  ----Wall Time----  ----Name----\n");
  for (int i = 0; i < ran; i++)
    fprintf(out, "  %10.4f (%5.1f%%)  %s\n", times[i], times[i] * scale, p->entries[i].info->name);
  if (verified) fprintf(out, "  %10.4f (%5.1f%%)  verifier\n", verify_time, verify_time * scale);
  fprintf(out, "  %10.4f (100.0%%)  Total\n", total);
  fflush(out);
}

/* Runs entry i; returns its status with diagnostics forwarded. */
static xm_status_t run_one(xm_ir_module_t *m, const xm_pass_pipeline_entry_t *e, xm_diag_t *diag) {
  xm_diag_t local;
  xm_diag_init(&local);
  bool changed = false;
  xm_status_t st = e->info->run(m, &e->options, &local, &changed);
  int errors = local.errors;
  xm_strbuf_t prefix;
  xm_strbuf_init(&prefix);
  xm_strbuf_printf(&prefix, "pass '%s': ", e->info->name);
  forward_diag(diag, &local, xm_strbuf_cstr(&prefix));
  if (st != XM_OK && errors == 0)
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL, "pass '%s' failed: %s", e->info->name,
                xm_status_name(st));
  xm_strbuf_free(&prefix);
  return st;
}

static xm_status_t verify_after(const xm_ir_module_t *m, const char *pass_name, xm_diag_t *diag) {
  xm_diag_t local;
  xm_diag_init(&local);
  xm_status_t st = xm_ir_verify(m, &local);
  if (st == XM_OK && local.errors == 0) {
    xm_diag_free(&local);
    return XM_OK;
  }
  int errors = local.errors;
  xm_strbuf_t prefix;
  xm_strbuf_init(&prefix);
  xm_strbuf_printf(&prefix, "after pass '%s': ", pass_name);
  forward_diag(diag, &local, xm_strbuf_cstr(&prefix));
  if (errors == 0)
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL, "after pass '%s': the IR does not verify",
                pass_name);
  xm_strbuf_free(&prefix);
  return XM_ERR_INTERNAL;
}

xm_status_t xm_pass_pipeline_execute(xm_ir_module_t *m, const xm_pass_pipeline_t *p,
                                     const xm_pass_manager_options_t *options, xm_diag_t *diag) {
  xm_pass_manager_options_t dflt;
  if (!options) {
    xm_pass_manager_options_default(&dflt);
    options = &dflt;
  }
  FILE *dump = options->dump ? options->dump : stderr;
  double *times = calloc((size_t)(p->num ? p->num : 1), sizeof *times);
  if (!times) return XM_ERR_NO_MEMORY;
  double verify_time = 0;
  xm_status_t st = XM_OK;
  int ran = 0;
  for (; ran < p->num && st == XM_OK; ran++) {
    const xm_pass_pipeline_entry_t *e = &p->entries[ran];
    double t0 = now_seconds();
    st = run_one(m, e, diag);
    times[ran] = now_seconds() - t0;
    if (st != XM_OK) continue;
    if (options->print_ir_after_all) dump_ir(dump, e->info->name, m);
    if (options->verify_each) {
      double v0 = now_seconds();
      st = verify_after(m, e->info->name, diag);
      verify_time += now_seconds() - v0;
    }
  }
  if (options->timing) print_timing(dump, p, ran, times, verify_time, options->verify_each);
  free(times);
  return st;
}

xm_status_t xm_pass_pipeline_run(xm_ir_module_t *m, const char *pipeline,
                                 const xm_pass_manager_options_t *options, xm_diag_t *diag) {
  xm_pass_pipeline_t p;
  XM_RETURN_IF_ERROR(xm_pass_pipeline_parse(pipeline, diag, &p));
  xm_status_t st = xm_pass_pipeline_execute(m, &p, options, diag);
  xm_pass_pipeline_free(&p);
  return st;
}
