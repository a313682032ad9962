/* ir/parse.c — reads the text form of a module (grammar: docs/ir.md).
 *
 * A hand-written lexer with one token of lookahead feeds a recursive-descent
 * parser that never actually recurses: the grammar has no nesting beyond a
 * flat array inside an attribute dict, so the fuzzer cannot drive the stack.
 * The input is a byte span (not necessarily NUL-terminated) and every read is
 * bounds-checked against it; numbers go through strtoll/strtod with errno so
 * that overflow is an error rather than a wrap. Nothing is allocated from a
 * number in the text: dims and counts are stored, never used as sizes.
 *
 * Errors come in two kinds. A syntax error (unexpected token, bad string
 * escape, unterminated string) has no sensible recovery, so parsing stops at
 * the first one. A semantic error (unknown op or dtype, out-of-range number,
 * undefined or redefined value, counts that contradict ops.def) leaves the
 * token stream intact, so it is reported and parsing goes on, marking the op
 * as broken ("poisoned") so nothing is built from it; values it defines are
 * poisoned too and silently poison their users, which keeps one mistake from
 * producing a cascade of messages. Uses of names not yet defined are checked
 * at the end, to tell "used before its definition" from "undefined". Every
 * message carries the 1-based "line:col" of the offending token. The parser
 * does not check types: that is ir/verify.c's job.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/text.h"

/* Inputs above this are rejected up front, so that line and column numbers,
 * element counts and offsets all fit an int. */
#define XM_PARSE_MAX_INPUT ((size_t)1 << 30)
/* Attribute inserts copy the sorted array (ir.c), so a dict's cost grows with
 * the square of its size: bound it. Real ops carry fewer than ten. */
#define XM_PARSE_MAX_ATTRS 1024

/* ---- tokens ------------------------------------------------------------ */

typedef enum {
  TOK_EOF,
  TOK_IDENT,  /* [A-Za-z_][A-Za-z0-9_.]* */
  TOK_VALUE,  /* %name; span excludes the '%' */
  TOK_SYMBOL, /* @name (bare); span excludes the '@' */
  TOK_STRING, /* decoded into parser.str */
  TOK_INT,    /* -?[0-9]+ */
  TOK_FLOAT,  /* with '.', an exponent, or "-inf" */
  TOK_PUNCT,  /* one of ( ) { } [ ] , = : ? / @ */
} tok_kind_t;

typedef struct {
  tok_kind_t kind;
  size_t start, len; /* span in the text */
  int line, col;
} token_t;

typedef struct {
  char *name; /* owned */
  size_t len;
  xm_ir_value_t *value; /* NULL: poisoned (its op had an error) */
  int line, col;
} name_entry_t;

typedef struct {
  size_t start, len;
  int line, col;
} name_ref_t;

typedef struct {
  const char *text;
  size_t len, pos;
  int line, col;
  const char *source;
  xm_diag_t *diag;
  int errors;
  bool stopped; /* a syntax error happened */
  token_t tok;
  xm_strbuf_t str;     /* decoded text of the current string token */
  xm_strbuf_t scratch; /* NUL-terminated copy of an identifier */
  xm_ir_module_t *m;
  name_entry_t *names; /* open-addressing table, capacity a power of two */
  size_t names_cap, names_count;
  name_ref_t *pending; /* uses of names not yet defined */
  size_t pending_count, pending_cap;
} parser_t;

static bool is_ident_start(int c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static bool is_digit(int c) { return c >= '0' && c <= '9'; }
static bool is_ident_char(int c) { return is_ident_start(c) || is_digit(c) || c == '.'; }
static bool is_module_name_char(int c) { return is_ident_char(c) || c == '-'; }

/* Grows a malloc'd vector so that it holds `need` elements. Sizes are bounded
 * by the input length, so failure here is out of memory, not bad input. */
static void *grow(void *ptr, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return ptr;
  size_t ncap = *cap ? *cap : 8;
  while (ncap < need)
    ncap *= 2;
  XM_ASSERT(ncap <= SIZE_MAX / elem);
  void *np = realloc(ptr, ncap * elem);
  XM_ASSERT(np != NULL);
  *cap = ncap;
  return np;
}

/* ---- diagnostics ------------------------------------------------------- */

static void verror_at(parser_t *p, int line, int col, const char *fmt, va_list ap) {
  char place[32];
  snprintf(place, sizeof place, "%d:%d", line, col);
  xm_diag_addv(p->diag, XM_DIAG_ERROR, p->source, place, fmt, ap);
  p->errors++;
}

/* A semantic error: reported, parsing goes on. */
static void error_at(parser_t *p, int line, int col, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void error_at(parser_t *p, int line, int col, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  verror_at(p, line, col, fmt, ap);
  va_end(ap);
}

/* A syntax error: reported, parsing stops. Always returns false. */
static bool syntax_error(parser_t *p, int line, int col, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool syntax_error(parser_t *p, int line, int col, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  verror_at(p, line, col, fmt, ap);
  va_end(ap);
  p->stopped = true;
  return false;
}

/* A short printable description of the current token for messages. */
static const char *tok_desc(const parser_t *p, char *buf, size_t size) {
  const token_t *t = &p->tok;
  if (t->kind == TOK_EOF) return "end of input";
  if (t->kind == TOK_STRING) return "a string";
  size_t n = t->len < 24 ? t->len : 24;
  const char *prefix = t->kind == TOK_VALUE ? "%" : t->kind == TOK_SYMBOL ? "@" : "";
  snprintf(buf, size, "'%s%.*s%s'", prefix, (int)n, p->text + t->start, t->len > n ? "..." : "");
  return buf;
}

/* The nearest of `names` to `given`, or NULL when none is close. */
static const char *nearest(const char *given, const char *const *names, int n) {
  const char *best = NULL;
  int best_d = 3;
  for (int i = 0; i < n; i++) {
    int d = xm_edit_distance(given, names[i]);
    if (d < best_d && d < (int)strlen(names[i])) {
      best_d = d;
      best = names[i];
    }
  }
  return best;
}

/* ---- lexer ------------------------------------------------------------- */

static int peek_at(const parser_t *p, size_t off) {
  return p->pos + off < p->len ? (unsigned char)p->text[p->pos + off] : -1;
}

static void advance(parser_t *p) {
  if (p->text[p->pos] == '\n') {
    p->line++;
    p->col = 1;
  } else {
    p->col++;
  }
  p->pos++;
}

static void skip_space_and_comments(parser_t *p) {
  for (;;) {
    int c = peek_at(p, 0);
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
      advance(p);
    } else if (c == '/' && peek_at(p, 1) == '/') {
      while (p->pos < p->len && p->text[p->pos] != '\n')
        advance(p);
    } else {
      return;
    }
  }
}

static int hex_value(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Appends code point `u` (1..0xFFFF, not a surrogate) as UTF-8. */
static void put_utf8(xm_strbuf_t *b, unsigned u) {
  char out[3];
  if (u < 0x80) {
    out[0] = (char)u;
    xm_strbuf_append(b, out, 1);
  } else if (u < 0x800) {
    out[0] = (char)(0xC0 | (u >> 6));
    out[1] = (char)(0x80 | (u & 0x3F));
    xm_strbuf_append(b, out, 2);
  } else {
    out[0] = (char)(0xE0 | (u >> 12));
    out[1] = (char)(0x80 | ((u >> 6) & 0x3F));
    out[2] = (char)(0x80 | (u & 0x3F));
    xm_strbuf_append(b, out, 3);
  }
}

/* One escape after a backslash (the lexer stands on the backslash). */
static bool lex_escape(parser_t *p) {
  int line = p->line, col = p->col;
  int c = peek_at(p, 1);
  const char *simple = NULL;
  switch (c) {
  case '"': simple = "\""; break;
  case '\\': simple = "\\"; break;
  case '/': simple = "/"; break;
  case 'n': simple = "\n"; break;
  case 't': simple = "\t"; break;
  case 'r': simple = "\r"; break;
  default: break;
  }
  if (simple) {
    xm_strbuf_puts(&p->str, simple);
    advance(p);
    advance(p);
    return true;
  }
  if (c != 'u') {
    if (c >= 0x20 && c < 0x7f)
      return syntax_error(p, line, col, "invalid escape '\\%c' in string", c);
    return syntax_error(p, line, col, "invalid escape in string");
  }
  unsigned u = 0;
  for (size_t i = 0; i < 4; i++) {
    int h = hex_value(peek_at(p, 2 + i));
    if (h < 0) return syntax_error(p, line, col, "'\\u' needs four hex digits");
    u = u * 16 + (unsigned)h;
  }
  if (u == 0) return syntax_error(p, line, col, "'\\u0000' is not allowed in a string");
  if (u >= 0xD800 && u <= 0xDFFF)
    return syntax_error(p, line, col, "'\\u%04x' is a surrogate, not a character", u);
  put_utf8(&p->str, u);
  for (int i = 0; i < 6; i++)
    advance(p);
  return true;
}

static bool lex_string(parser_t *p) {
  xm_strbuf_clear(&p->str);
  xm_strbuf_append(&p->str, "", 0); /* data non-NULL even when empty */
  advance(p);                       /* opening quote */
  for (;;) {
    int c = peek_at(p, 0);
    if (c < 0 || c == '\n') return syntax_error(p, p->tok.line, p->tok.col, "unterminated string");
    if (c == '"') {
      advance(p);
      return true;
    }
    if (c == '\\') {
      if (!lex_escape(p)) return false;
      continue;
    }
    if (c < 0x20)
      return syntax_error(p, p->line, p->col,
                          "control character 0x%02x in string (write it as an escape)", c);
    char ch = (char)c;
    xm_strbuf_append(&p->str, &ch, 1);
    advance(p);
  }
}

static bool lex_number(parser_t *p) {
  bool is_float = false;
  if (peek_at(p, 0) == '-') advance(p);
  while (is_digit(peek_at(p, 0)))
    advance(p);
  if (peek_at(p, 0) == '.') {
    is_float = true;
    advance(p);
    while (is_digit(peek_at(p, 0)))
      advance(p);
  }
  int e = peek_at(p, 0);
  if (e == 'e' || e == 'E') {
    size_t k = 1;
    if (peek_at(p, 1) == '+' || peek_at(p, 1) == '-') k = 2;
    if (is_digit(peek_at(p, k))) {
      is_float = true;
      for (size_t i = 0; i < k; i++)
        advance(p);
      while (is_digit(peek_at(p, 0)))
        advance(p);
    }
  }
  if (is_ident_char(peek_at(p, 0)))
    return syntax_error(p, p->tok.line, p->tok.col, "malformed number");
  p->tok.kind = is_float ? TOK_FLOAT : TOK_INT;
  return true;
}

static bool lex_word(parser_t *p, tok_kind_t kind, bool (*ok_char)(int), const char *what) {
  advance(p); /* the '%' or '@' sigil */
  size_t start = p->pos;
  while (ok_char(peek_at(p, 0)))
    advance(p);
  if (p->pos == start) return syntax_error(p, p->tok.line, p->tok.col, "expected %s", what);
  p->tok.kind = kind;
  p->tok.start = start;
  return true;
}

static bool lex_other(parser_t *p, int c) {
  if (c != 0 && strchr("(){}[],=:?/@", c)) {
    advance(p);
    p->tok.kind = TOK_PUNCT;
    return true;
  }
  if (c >= 0x21 && c < 0x7f)
    return syntax_error(p, p->line, p->col, "unexpected character '%c'", c);
  return syntax_error(p, p->line, p->col, "unexpected byte 0x%02x", c);
}

/* Moves to the next token; false after a lexical (syntax) error. */
static bool next(parser_t *p) {
  if (p->stopped) return false;
  skip_space_and_comments(p);
  token_t *t = &p->tok;
  t->start = p->pos;
  t->line = p->line;
  t->col = p->col;
  int c = peek_at(p, 0);
  bool ok;
  if (c < 0) {
    t->kind = TOK_EOF;
    ok = true;
  } else if (is_ident_start(c)) {
    while (is_ident_char(peek_at(p, 0)))
      advance(p);
    t->kind = TOK_IDENT;
    ok = true;
  } else if (is_digit(c) || (c == '-' && is_digit(peek_at(p, 1)))) {
    ok = lex_number(p);
  } else if (c == '-' && peek_at(p, 1) == 'i' && peek_at(p, 2) == 'n' && peek_at(p, 3) == 'f' &&
             !is_ident_char(peek_at(p, 4))) {
    for (int i = 0; i < 4; i++)
      advance(p);
    t->kind = TOK_FLOAT;
    ok = true;
  } else if (c == '"') {
    t->kind = TOK_STRING;
    ok = lex_string(p);
  } else if (c == '%') {
    ok = lex_word(p, TOK_VALUE, is_ident_char, "a value name after '%'");
  } else if (c == '@' && peek_at(p, 1) != '"') {
    ok = lex_word(p, TOK_SYMBOL, is_module_name_char, "a module name after '@'");
  } else {
    ok = lex_other(p, c);
  }
  t->len = p->pos - t->start;
  return ok;
}

/* ---- token helpers ----------------------------------------------------- */

static bool at_punct(const parser_t *p, char c) {
  return p->tok.kind == TOK_PUNCT && p->text[p->tok.start] == c;
}

static bool at_word(const parser_t *p, const char *w) {
  size_t n = strlen(w);
  return p->tok.kind == TOK_IDENT && p->tok.len == n && memcmp(p->text + p->tok.start, w, n) == 0;
}

/* Consumes punctuation `c` or reports what was found instead. */
static bool expect(parser_t *p, char c, const char *context) {
  if (at_punct(p, c)) return next(p);
  char buf[48];
  return syntax_error(p, p->tok.line, p->tok.col, "expected '%c' %s, found %s", c, context,
                      tok_desc(p, buf, sizeof buf));
}

/* NUL-terminated copy of the current token's text, valid until the next call. */
static const char *tok_text(parser_t *p) {
  xm_strbuf_clear(&p->scratch);
  xm_strbuf_append(&p->scratch, p->text + p->tok.start, p->tok.len);
  return xm_strbuf_cstr(&p->scratch);
}

/* The integer value of an INT token; false (semantic error) when out of range. */
static bool tok_int(parser_t *p, const char *what, int64_t *out) {
  char buf[40];
  if (p->tok.len < sizeof buf) {
    memcpy(buf, p->text + p->tok.start, p->tok.len);
    buf[p->tok.len] = '\0';
    errno = 0;
    long long v = strtoll(buf, NULL, 10);
    if (errno == 0) {
      *out = (int64_t)v;
      return true;
    }
  }
  error_at(p, p->tok.line, p->tok.col, "%s out of range (64-bit signed integer)", what);
  return false;
}

/* The value of a FLOAT or INT token, or of "inf"/"nan"; false when it
 * overflows a double (underflow to a subnormal or zero is accepted, so that
 * every printed double reads back). */
static bool tok_double(parser_t *p, double *out) {
  const char *s = tok_text(p);
  errno = 0;
  double v = strtod(s, NULL);
  if (errno == ERANGE && isinf(v)) {
    error_at(p, p->tok.line, p->tok.col, "float literal out of range");
    return false;
  }
  *out = v;
  return true;
}

/* ---- value names ------------------------------------------------------- */

static uint64_t hash_name(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (size_t i = 0; i < n; i++)
    h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

/* The slot holding `name`, or the empty slot where it would go. */
static name_entry_t *name_slot(parser_t *p, const char *s, size_t n) {
  size_t mask = p->names_cap - 1;
  for (size_t i = (size_t)hash_name(s, n) & mask;; i = (i + 1) & mask) {
    name_entry_t *e = &p->names[i];
    if (!e->name || (e->len == n && memcmp(e->name, s, n) == 0)) return e;
  }
}

static name_entry_t *name_find(parser_t *p, const char *s, size_t n) {
  if (!p->names_cap) return NULL;
  name_entry_t *e = name_slot(p, s, n);
  return e->name ? e : NULL;
}

static void names_rehash(parser_t *p) {
  size_t old_cap = p->names_cap;
  name_entry_t *old = p->names;
  p->names_cap = old_cap ? old_cap * 2 : 64;
  XM_ASSERT(p->names_cap <= SIZE_MAX / sizeof *p->names);
  p->names = calloc(p->names_cap, sizeof *p->names);
  XM_ASSERT(p->names != NULL);
  for (size_t i = 0; i < old_cap; i++)
    if (old[i].name) *name_slot(p, old[i].name, old[i].len) = old[i];
  free(old);
}

/* Defines the name at `ref` as `v` (NULL: poisoned); reports redefinition. */
static void name_define(parser_t *p, const name_ref_t *ref, xm_ir_value_t *v) {
  const char *s = p->text + ref->start;
  name_entry_t *e = name_find(p, s, ref->len);
  if (e) {
    error_at(p, ref->line, ref->col, "redefinition of value %%%.*s (first defined at %d:%d)",
             (int)ref->len, s, e->line, e->col);
    return;
  }
  if ((p->names_count + 1) * 2 > p->names_cap) names_rehash(p);
  e = name_slot(p, s, ref->len);
  e->name = malloc(ref->len + 1);
  XM_ASSERT(e->name != NULL);
  memcpy(e->name, s, ref->len);
  e->name[ref->len] = '\0';
  e->len = ref->len;
  e->value = v;
  e->line = ref->line;
  e->col = ref->col;
  p->names_count++;
}

/* Resolves the current VALUE token. Returns NULL (the op is then not built)
 * when the name is poisoned or not defined yet; the latter is remembered and
 * reported at the end. */
static xm_ir_value_t *name_use(parser_t *p, bool *ok) {
  name_entry_t *e = name_find(p, p->text + p->tok.start, p->tok.len);
  if (e && e->value) return e->value;
  *ok = false;
  if (!e) {
    p->pending = grow(p->pending, &p->pending_cap, p->pending_count + 1, sizeof *p->pending);
    p->pending[p->pending_count++] =
        (name_ref_t){p->tok.start, p->tok.len, p->tok.line, p->tok.col};
  }
  return NULL;
}

static void report_pending(parser_t *p) {
  for (size_t i = 0; i < p->pending_count; i++) {
    const name_ref_t *r = &p->pending[i];
    const char *s = p->text + r->start;
    const name_entry_t *e = name_find(p, s, r->len);
    if (e)
      error_at(p, r->line, r->col, "value %%%.*s is used before its definition at %d:%d",
               (int)r->len, s, e->line, e->col);
    else
      error_at(p, r->line, r->col, "use of undefined value %%%.*s", (int)r->len, s);
  }
}

/* ---- types ------------------------------------------------------------- */

/* One dim: "?"? INT ("/" axis)?. Stores it when `rank` is still in range. */
static bool parse_dim(parser_t *p, xm_ir_type_t *t, int rank, bool *ok) {
  bool dynamic = false;
  if (at_punct(p, '?')) {
    dynamic = true;
    if (!next(p)) return false;
  }
  if (p->tok.kind != TOK_INT) {
    char buf[48];
    return syntax_error(p, p->tok.line, p->tok.col, "expected a dim size, found %s",
                        tok_desc(p, buf, sizeof buf));
  }
  int64_t size = 0;
  if (!tok_int(p, "dim", &size)) {
    *ok = false;
  } else if (size < 0) {
    error_at(p, p->tok.line, p->tok.col, "negative dim %" PRId64, size);
    *ok = false;
  }
  if (!next(p)) return false;
  xm_mesh_axis_t axis = XM_AXIS_NONE;
  if (at_punct(p, '/')) {
    if (!next(p)) return false;
    if (p->tok.kind != TOK_IDENT) {
      char buf[48];
      return syntax_error(p, p->tok.line, p->tok.col, "expected a mesh axis after '/', found %s",
                          tok_desc(p, buf, sizeof buf));
    }
    const char *name = tok_text(p);
    if (!xm_mesh_axis_from_name(name, &axis) || axis == XM_AXIS_NONE) {
      error_at(p, p->tok.line, p->tok.col,
               "unknown mesh axis '%s' (expected dp, tp, ep, edp, sp or node)", name);
      *ok = false;
    }
    if (!next(p)) return false;
  }
  if (rank < XM_IR_MAX_RANK) {
    t->dims[rank] = size;
    t->dynamic[rank] = dynamic;
    t->shard[rank] = (uint8_t)axis;
  }
  return true;
}

/* dtype "[" (dim ("," dim)*)? "]" */
static bool parse_type(parser_t *p, xm_ir_type_t *t, bool *ok) {
  memset(t, 0, sizeof *t);
  if (p->tok.kind != TOK_IDENT) {
    char buf[48];
    return syntax_error(p, p->tok.line, p->tok.col, "expected a type, found %s",
                        tok_desc(p, buf, sizeof buf));
  }
  const char *name = tok_text(p);
  if (!xm_dtype_from_name(name, &t->dtype)) {
    const char *dtypes[XM_DT_COUNT_];
    for (int i = 0; i < XM_DT_COUNT_; i++)
      dtypes[i] = xm_dtype_name((xm_dtype_t)i);
    const char *hint = nearest(name, dtypes, XM_DT_COUNT_);
    error_at(p, p->tok.line, p->tok.col, "unknown dtype '%s'%s%s%s", name,
             hint ? "; did you mean '" : " (expected f32, bf16, f16, i32, i64 or i1)",
             hint ? hint : "", hint ? "'?" : "");
    *ok = false;
  }
  if (!next(p) || !expect(p, '[', "after the dtype")) return false;
  int rank = 0;
  if (!at_punct(p, ']')) {
    for (;;) {
      if (rank == XM_IR_MAX_RANK) {
        error_at(p, p->tok.line, p->tok.col, "a type has at most %d dims", XM_IR_MAX_RANK);
        *ok = false;
      }
      if (!parse_dim(p, t, rank, ok)) return false;
      if (rank <= XM_IR_MAX_RANK) rank++;
      if (!at_punct(p, ',')) break;
      if (!next(p)) return false;
    }
  }
  t->rank = rank <= XM_IR_MAX_RANK ? rank : XM_IR_MAX_RANK;
  return expect(p, ']', "to close the dims");
}

/* ---- attributes -------------------------------------------------------- */

typedef struct {
  xm_ir_attr_t *items; /* keys, strings and arrays live in the module arena */
  size_t count, cap;
} attr_list_t;

/* One array element into `ints` or `floats`; the first element fixes the
 * kind. `kind` is -1 before the first element. */
static bool parse_array_elem(parser_t *p, int *kind, xm_strbuf_t *elems, bool *ok) {
  bool is_float = p->tok.kind == TOK_FLOAT || at_word(p, "inf") || at_word(p, "nan");
  if (p->tok.kind != TOK_INT && !is_float) {
    char buf[48];
    return syntax_error(p, p->tok.line, p->tok.col, "expected a number in the array, found %s",
                        tok_desc(p, buf, sizeof buf));
  }
  int k = is_float ? XM_ATTR_FLOATS : XM_ATTR_INTS;
  if (*kind < 0) *kind = k;
  if (k != *kind) {
    error_at(p, p->tok.line, p->tok.col,
             "array mixes integers and floats (write every element as a float)");
    *ok = false;
  } else if (k == XM_ATTR_INTS) {
    int64_t v = 0;
    if (!tok_int(p, "integer", &v)) *ok = false;
    xm_strbuf_append(elems, (const char *)&v, sizeof v);
  } else {
    double v = 0;
    if (!tok_double(p, &v)) *ok = false;
    xm_strbuf_append(elems, (const char *)&v, sizeof v);
  }
  return next(p);
}

/* "[" (number ("," number)*)? "]"; an empty array is an empty int array. */
static bool parse_array(parser_t *p, xm_ir_attr_t *a, bool *ok) {
  if (!next(p)) return false;
  int kind = -1;
  xm_strbuf_t elems; /* raw int64_t or double values */
  xm_strbuf_init(&elems);
  bool good = true;
  if (!at_punct(p, ']')) {
    for (;;) {
      good = parse_array_elem(p, &kind, &elems, ok);
      if (!good || !at_punct(p, ',')) break;
      if (!(good = next(p))) break;
    }
  }
  if (good) good = expect(p, ']', "to close the array");
  a->kind = kind == XM_ATTR_FLOATS ? XM_ATTR_FLOATS : XM_ATTR_INTS;
  a->n = (int)(elems.len / 8);
  if (good && a->n > 0) {
    void *data = xm_ir_alloc(p->m, elems.len);
    XM_ASSERT(data != NULL);
    memcpy(data, elems.data, elems.len);
    if (a->kind == XM_ATTR_INTS)
      a->ints = data;
    else
      a->floats = data;
  }
  xm_strbuf_free(&elems);
  return good;
}

static bool parse_attr_value(parser_t *p, xm_ir_attr_t *a, bool *ok) {
  const token_t *t = &p->tok;
  if (t->kind == TOK_INT) {
    a->kind = XM_ATTR_INT;
    if (!tok_int(p, "integer", &a->i)) *ok = false;
  } else if (t->kind == TOK_FLOAT || at_word(p, "inf") || at_word(p, "nan")) {
    a->kind = XM_ATTR_FLOAT;
    if (!tok_double(p, &a->f)) *ok = false;
  } else if (at_word(p, "true") || at_word(p, "false")) {
    a->kind = XM_ATTR_BOOL;
    a->i = at_word(p, "true");
  } else if (t->kind == TOK_STRING) {
    a->kind = XM_ATTR_STRING;
    a->s = xm_ir_strdup(p->m, xm_strbuf_cstr(&p->str));
  } else if (at_punct(p, '[')) {
    return parse_array(p, a, ok);
  } else {
    char buf[48];
    return syntax_error(p, t->line, t->col, "expected an attribute value, found %s",
                        tok_desc(p, buf, sizeof buf));
  }
  return next(p);
}

/* key "=" value, appended to `list` unless the key repeats. */
static bool parse_attr_entry(parser_t *p, attr_list_t *list, bool *ok) {
  xm_ir_attr_t a;
  memset(&a, 0, sizeof a);
  int line = p->tok.line, col = p->tok.col;
  if (p->tok.kind == TOK_IDENT) {
    a.key = xm_ir_strdup(p->m, tok_text(p));
  } else if (p->tok.kind == TOK_STRING) {
    a.key = xm_ir_strdup(p->m, xm_strbuf_cstr(&p->str));
  } else {
    char buf[48];
    return syntax_error(p, line, col, "expected an attribute name, found %s",
                        tok_desc(p, buf, sizeof buf));
  }
  if (!next(p) || !expect(p, '=', "after the attribute name")) return false;
  if (!parse_attr_value(p, &a, ok)) return false;
  for (size_t i = 0; i < list->count; i++) {
    if (strcmp(list->items[i].key, a.key) == 0) {
      error_at(p, line, col, "duplicate attribute '%s'", a.key);
      *ok = false;
      return true;
    }
  }
  if (list->count == XM_PARSE_MAX_ATTRS) {
    error_at(p, line, col, "more than %d attributes", XM_PARSE_MAX_ATTRS);
    *ok = false;
    return true;
  }
  list->items = grow(list->items, &list->cap, list->count + 1, sizeof *list->items);
  list->items[list->count++] = a;
  return true;
}

/* "{" (entry ("," entry)*)? "}" */
static bool parse_attr_dict(parser_t *p, attr_list_t *list, bool *ok) {
  list->count = 0;
  if (!next(p)) return false;
  if (!at_punct(p, '}')) {
    for (;;) {
      if (!parse_attr_entry(p, list, ok)) return false;
      if (!at_punct(p, ',')) break;
      if (!next(p)) return false;
    }
  }
  return expect(p, '}', "to close the attributes");
}

/* ---- ops --------------------------------------------------------------- */

/* Scratch vectors reused from op to op. */
typedef struct {
  name_ref_t *results;
  size_t num_results, cap_results;
  xm_ir_value_t **operands;
  size_t num_operands, cap_operands;
  xm_ir_type_t *types;
  size_t num_types, cap_types;
  attr_list_t attrs;
} op_scratch_t;

/* The op name: sets *code, or reports an unknown name with a suggestion. */
static void parse_op_name(parser_t *p, xm_ir_opcode_t *code, bool *ok) {
  const char *name = tok_text(p);
  if (xm_ir_opcode_from_name(name, code)) return;
  const char *names[XM_OP_COUNT_];
  for (int i = 0; i < XM_OP_COUNT_; i++)
    names[i] = xm_ir_opinfo((xm_ir_opcode_t)i)->name;
  const char *hint = nearest(name, names, XM_OP_COUNT_);
  if (hint)
    error_at(p, p->tok.line, p->tok.col, "unknown op '%s'; did you mean '%s'?", name, hint);
  else
    error_at(p, p->tok.line, p->tok.col, "unknown op '%s' (ir/ops.def lists the ops)", name);
  *ok = false;
}

/* "%a, %b =" before the op name, when present. */
static bool parse_result_names(parser_t *p, op_scratch_t *s) {
  s->num_results = 0;
  if (p->tok.kind != TOK_VALUE) return true;
  for (;;) {
    if (p->tok.kind != TOK_VALUE) {
      char buf[48];
      return syntax_error(p, p->tok.line, p->tok.col, "expected a result name, found %s",
                          tok_desc(p, buf, sizeof buf));
    }
    s->results = grow(s->results, &s->cap_results, s->num_results + 1, sizeof *s->results);
    s->results[s->num_results++] = (name_ref_t){p->tok.start, p->tok.len, p->tok.line, p->tok.col};
    if (!next(p)) return false;
    if (!at_punct(p, ',')) break;
    if (!next(p)) return false;
  }
  return expect(p, '=', "after the result names");
}

/* "(" (%v ("," %v)*)? ")" */
static bool parse_operands(parser_t *p, op_scratch_t *s, bool *ok) {
  s->num_operands = 0;
  if (!expect(p, '(', "after the op name")) return false;
  if (!at_punct(p, ')')) {
    for (;;) {
      if (p->tok.kind != TOK_VALUE) {
        char buf[48];
        return syntax_error(p, p->tok.line, p->tok.col, "expected an operand, found %s",
                            tok_desc(p, buf, sizeof buf));
      }
      s->operands = grow(s->operands, &s->cap_operands, s->num_operands + 1, sizeof *s->operands);
      s->operands[s->num_operands++] = name_use(p, ok);
      if (!next(p)) return false;
      if (!at_punct(p, ',')) break;
      if (!next(p)) return false;
    }
  }
  return expect(p, ')', "to close the operands");
}

/* (":" type ("," type)*)? ("loc" "(" string ")")? */
static bool parse_types_and_loc(parser_t *p, op_scratch_t *s, const char **loc, bool *ok) {
  s->num_types = 0;
  if (at_punct(p, ':')) {
    if (!next(p)) return false;
    for (;;) {
      s->types = grow(s->types, &s->cap_types, s->num_types + 1, sizeof *s->types);
      if (!parse_type(p, &s->types[s->num_types++], ok)) return false;
      if (!at_punct(p, ',')) break;
      if (!next(p)) return false;
    }
  }
  *loc = "";
  if (!at_word(p, "loc")) return true;
  if (!next(p) || !expect(p, '(', "after 'loc'")) return false;
  if (p->tok.kind != TOK_STRING) {
    char buf[48];
    return syntax_error(p, p->tok.line, p->tok.col, "expected a location string, found %s",
                        tok_desc(p, buf, sizeof buf));
  }
  *loc = xm_ir_strdup(p->m, xm_strbuf_cstr(&p->str));
  return next(p) && expect(p, ')', "to close the location");
}

/* Counts against each other and against ops.def; false when they disagree. */
static bool check_counts(parser_t *p, const op_scratch_t *s, xm_ir_opcode_t code, bool known,
                         int line, int col, int name_line, int name_col) {
  bool good = true;
  if (s->num_results != s->num_types) {
    error_at(p, line, col, "%zu result name%s but %zu result type%s", s->num_results,
             s->num_results == 1 ? "" : "s", s->num_types, s->num_types == 1 ? "" : "s");
    good = false;
  }
  if (!known) return false;
  const xm_ir_opinfo_t *info = xm_ir_opinfo(code);
  if (good && info->num_results >= 0 && (size_t)info->num_results != s->num_types) {
    error_at(p, name_line, name_col, "op '%s' has %d result%s, not %zu", info->name,
             info->num_results, info->num_results == 1 ? "" : "s", s->num_types);
    good = false;
  }
  if (info->num_operands >= 0 && (size_t)info->num_operands != s->num_operands) {
    error_at(p, name_line, name_col, "op '%s' takes %d operand%s, not %zu", info->name,
             info->num_operands, info->num_operands == 1 ? "" : "s", s->num_operands);
    good = false;
  }
  return good;
}

/* results? name operands attrs? types? loc? */
static bool parse_op(parser_t *p, op_scratch_t *s) {
  int line = p->tok.line, col = p->tok.col;
  bool ok = true;
  if (!parse_result_names(p, s)) return false;
  if (p->tok.kind != TOK_IDENT) {
    char buf[48];
    return syntax_error(p, p->tok.line, p->tok.col, "expected an op name, found %s",
                        tok_desc(p, buf, sizeof buf));
  }
  int name_line = p->tok.line, name_col = p->tok.col;
  xm_ir_opcode_t code = XM_OP_INPUT;
  bool known = true;
  parse_op_name(p, &code, &known);
  if (!next(p) || !parse_operands(p, s, &ok)) return false;
  s->attrs.count = 0;
  if (at_punct(p, '{') && !parse_attr_dict(p, &s->attrs, &ok)) return false;
  const char *loc = "";
  if (!parse_types_and_loc(p, s, &loc, &ok)) return false;
  if (!check_counts(p, s, code, known, line, col, name_line, name_col)) ok = false;

  xm_ir_op_t *op = NULL;
  if (ok) {
    op = xm_ir_op_append(p->m, code, (int)s->num_operands, s->operands, (int)s->num_types, s->types,
                         loc);
    XM_ASSERT(op != NULL);
    for (size_t i = 0; i < s->attrs.count; i++)
      xm_ir_op_set_attr(p->m, op, &s->attrs.items[i]);
  }
  for (size_t i = 0; i < s->num_results; i++)
    name_define(p, &s->results[i], op ? op->results[i] : NULL);
  return true;
}

/* ---- module ------------------------------------------------------------ */

/* "module" "@" name ("attributes" dict)? "{" */
static bool parse_header(parser_t *p, attr_list_t *attrs) {
  char buf[48];
  if (!next(p)) return false;
  if (!at_word(p, "module"))
    return syntax_error(p, p->tok.line, p->tok.col, "expected 'module', found %s",
                        tok_desc(p, buf, sizeof buf));
  if (!next(p)) return false;
  xm_strbuf_t name;
  xm_strbuf_init(&name);
  if (p->tok.kind == TOK_SYMBOL) {
    xm_strbuf_append(&name, p->text + p->tok.start, p->tok.len);
  } else if (at_punct(p, '@')) {
    if (!next(p)) return false;
    if (p->tok.kind != TOK_STRING)
      return syntax_error(p, p->tok.line, p->tok.col, "expected a module name, found %s",
                          tok_desc(p, buf, sizeof buf));
    xm_strbuf_append(&name, p->str.data, p->str.len);
  } else {
    return syntax_error(p, p->tok.line, p->tok.col, "expected '@' and a module name, found %s",
                        tok_desc(p, buf, sizeof buf));
  }
  xm_status_t st = xm_ir_module_create(xm_strbuf_cstr(&name), &p->m);
  xm_strbuf_free(&name);
  XM_ASSERT(st == XM_OK);
  if (!next(p)) return false;
  if (at_word(p, "attributes")) {
    bool ok = true;
    if (!next(p)) return false;
    if (!at_punct(p, '{'))
      return syntax_error(p, p->tok.line, p->tok.col, "expected '{' after 'attributes', found %s",
                          tok_desc(p, buf, sizeof buf));
    if (!parse_attr_dict(p, attrs, &ok)) return false;
    for (size_t i = 0; ok && i < attrs->count; i++)
      xm_ir_module_set_attr(p->m, &attrs->items[i]);
  }
  return expect(p, '{', "to open the module body");
}

/* The ops up to the closing "}", then the end of the input. */
static bool parse_body(parser_t *p, op_scratch_t *s) {
  while (!at_punct(p, '}')) {
    if (p->tok.kind == TOK_EOF)
      return syntax_error(p, p->tok.line, p->tok.col, "missing '}' at the end of the module");
    if (!parse_op(p, s)) return false;
  }
  if (!next(p)) return false;
  if (p->tok.kind != TOK_EOF) {
    char buf[48];
    return syntax_error(p, p->tok.line, p->tok.col, "unexpected %s after the end of the module",
                        tok_desc(p, buf, sizeof buf));
  }
  return true;
}

static void parser_free(parser_t *p) {
  for (size_t i = 0; i < p->names_cap; i++)
    free(p->names[i].name);
  free(p->names);
  free(p->pending);
  xm_strbuf_free(&p->str);
  xm_strbuf_free(&p->scratch);
}

xm_status_t xm_ir_parse(const char *text, size_t len, const char *source, xm_diag_t *diag,
                        xm_ir_module_t **out_module) {
  *out_module = NULL;
  parser_t p;
  memset(&p, 0, sizeof p);
  p.text = text ? text : "";
  p.len = text ? len : 0;
  p.line = 1;
  p.col = 1;
  p.source = source;
  p.diag = diag;
  if (p.len > XM_PARSE_MAX_INPUT) {
    error_at(&p, 1, 1, "input too large (%zu bytes; the limit is %zu)", p.len, XM_PARSE_MAX_INPUT);
    return XM_ERR_INVALID_INPUT;
  }
  op_scratch_t s;
  memset(&s, 0, sizeof s);
  attr_list_t module_attrs = {0};
  if (parse_header(&p, &module_attrs) && parse_body(&p, &s)) report_pending(&p);
  free(module_attrs.items);
  free(s.results);
  free(s.operands);
  free(s.types);
  free(s.attrs.items);
  parser_free(&p);
  if (p.errors > 0) {
    xm_ir_module_destroy(p.m);
    return XM_ERR_INVALID_INPUT;
  }
  *out_module = p.m;
  return XM_OK;
}
