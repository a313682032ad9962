/* planner/placement.c — reading, checking and writing placement files, and
 * reading routing statistics files (planner/placement.h; formats in
 * docs/placement.md).
 *
 * Both files are read with a small JSON reader of their own rather than
 * cJSON: a statistics file of 61 layers of 65536 sampled tokens of k = 8
 * holds ~36 million numbers (~150 MB of text), which cJSON would hold as
 * 64-byte nodes each. This reader keeps an array of numbers packed (int32,
 * int64 or double, whichever its values need) and every other value as a
 * tree, and reports a syntax error with its offset (line:column).
 */
#include "planner/placement.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_EXPERTS ((int64_t)1 << 20)
#define MAX_LAYER ((int64_t)1 << 20) /* the largest layer index read */
#define MAX_DEPTH 256                /* JSON nesting */
#define MAX_SHOWN 20                 /* problems reported per file; the rest are counted */
#define BIG ((int64_t)1 << 53)       /* counts above this are not exact in a double */

/* ---- a JSON reader with packed number arrays ------------------------------------ */

typedef enum { JV_NULL, JV_BOOL, JV_NUM, JV_STR, JV_ARR, JV_OBJ, JV_NUMS } jv_kind_t;
typedef enum { NUMS_I32, NUMS_I64, NUMS_F64 } nums_mode_t;

typedef struct jv jv_t;

typedef struct {
  char *key;
  size_t key_len;
  jv_t *val;
} jv_member_t;

struct jv {
  jv_kind_t kind;
  bool b;
  double num;       /* JV_NUM */
  bool is_int;      /* JV_NUM: integral and exact in `inum` */
  int64_t inum;
  char *str;        /* JV_STR (NUL-terminated; may hold NULs before len) */
  size_t len;
  jv_t **items;     /* JV_ARR */
  jv_member_t *mem; /* JV_OBJ */
  int64_t n;        /* items, members or packed numbers */
  nums_mode_t mode; /* JV_NUMS */
  void *nums;       /* JV_NUMS: int32_t, int64_t or double [n] */
};

typedef struct {
  const char *base, *p, *end;
  const char *err_at;
  const char *err_msg;
  bool oom;
  int depth;
} jp_t;

static void jv_free(jv_t *v) {
  if (!v) return;
  if (v->kind == JV_ARR)
    for (int64_t i = 0; i < v->n; i++)
      jv_free(v->items[i]);
  if (v->kind == JV_OBJ)
    for (int64_t i = 0; i < v->n; i++) {
      free(v->mem[i].key);
      jv_free(v->mem[i].val);
    }
  free(v->items);
  free(v->mem);
  free(v->str);
  free(v->nums);
  free(v);
}

static jv_t *jp_fail(jp_t *j, const char *at, const char *msg) {
  if (!j->err_msg) {
    j->err_at = at;
    j->err_msg = msg;
  }
  return NULL;
}

static jv_t *jv_new(jp_t *j, jv_kind_t kind) {
  jv_t *v = calloc(1, sizeof *v);
  if (!v) {
    j->oom = true;
    return jp_fail(j, j->p, "out of memory");
  }
  v->kind = kind;
  return v;
}

static void skip_ws(jp_t *j) {
  while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
    j->p++;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

/* A JSON number at j->p: its value, and whether it is an integer exactly
 * representable as int64 (written without fraction or exponent, or an
 * integral double below 2^63). */
static bool scan_number(jp_t *j, double *d, int64_t *iv, bool *is_int) {
  const char *s = j->p, *q = s, *e = j->end;
  bool neg = false;
  if (q < e && *q == '-') neg = true, q++;
  if (q >= e || !is_digit(*q)) return jp_fail(j, q, "invalid number"), false;
  if (*q == '0')
    q++;
  else
    while (q < e && is_digit(*q))
      q++;
  const char *int_end = q;
  bool plain = true;
  if (q < e && *q == '.') {
    plain = false;
    q++;
    if (q >= e || !is_digit(*q)) return jp_fail(j, q, "invalid number: a digit must follow '.'"), false;
    while (q < e && is_digit(*q))
      q++;
  }
  if (q < e && (*q == 'e' || *q == 'E')) {
    plain = false;
    q++;
    if (q < e && (*q == '+' || *q == '-')) q++;
    if (q >= e || !is_digit(*q))
      return jp_fail(j, q, "invalid number: a digit must follow the exponent"), false;
    while (q < e && is_digit(*q))
      q++;
  }
  *is_int = false;
  if (plain) {
    uint64_t u = 0;
    bool ok = true;
    for (const char *c = s + neg; c < int_end && ok; c++) {
      unsigned dg = (unsigned)(*c - '0');
      if (u > (UINT64_MAX - dg) / 10) ok = false;
      else u = u * 10 + dg;
    }
    if (ok && u <= (uint64_t)INT64_MAX) {
      *iv = neg ? -(int64_t)u : (int64_t)u;
      *d = (double)*iv;
      *is_int = true;
    }
  }
  if (!*is_int) {
    size_t n = (size_t)(q - s);
    char small[64], *buf = n < sizeof small ? small : malloc(n + 1);
    if (!buf) {
      j->oom = true;
      return jp_fail(j, s, "out of memory"), false;
    }
    memcpy(buf, s, n);
    buf[n] = '\0';
    *d = strtod(buf, NULL);
    if (buf != small) free(buf);
    if (isfinite(*d) && *d == floor(*d) && fabs(*d) < 9.2e18) {
      *iv = (int64_t)*d;
      *is_int = true;
    }
  }
  j->p = q;
  return true;
}

static int hex4(const char *p) {
  int v = 0;
  for (int i = 0; i < 4; i++) {
    char c = p[i];
    int h = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (h < 0) return -1;
    v = v * 16 + h;
  }
  return v;
}

static size_t put_utf8(char *o, unsigned cp) {
  if (cp < 0x80) {
    o[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (char)(0xc0 | (cp >> 6));
    o[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (char)(0xe0 | (cp >> 12));
    o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[2] = (char)(0x80 | (cp & 0x3f));
    return 3;
  }
  o[0] = (char)(0xf0 | (cp >> 18));
  o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
  o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
  o[3] = (char)(0x80 | (cp & 0x3f));
  return 4;
}

/* A string at j->p (its opening quote): the decoded bytes, NUL-terminated. */
static char *scan_string(jp_t *j, size_t *out_len) {
  const char *q = j->p + 1, *e = j->end;
  const char *close = q;
  while (close < e && *close != '"') {
    if (*close == '\\') close++;
    close++;
  }
  if (close >= e) return jp_fail(j, j->p, "unterminated string"), NULL;
  char *out = malloc((size_t)(close - q) + 1);
  if (!out) {
    j->oom = true;
    return jp_fail(j, j->p, "out of memory"), NULL;
  }
  size_t n = 0;
  while (q < close) {
    unsigned char c = (unsigned char)*q;
    if (c < 0x20) {
      free(out);
      return jp_fail(j, q, "control character in a string (escape it)"), NULL;
    }
    if (c != '\\') {
      out[n++] = (char)c;
      q++;
      continue;
    }
    q++;
    char x = *q++;
    switch (x) {
    case '"': out[n++] = '"'; break;
    case '\\': out[n++] = '\\'; break;
    case '/': out[n++] = '/'; break;
    case 'b': out[n++] = '\b'; break;
    case 'f': out[n++] = '\f'; break;
    case 'n': out[n++] = '\n'; break;
    case 'r': out[n++] = '\r'; break;
    case 't': out[n++] = '\t'; break;
    case 'u': {
      int hi = close - q >= 4 ? hex4(q) : -1;
      if (hi < 0) {
        free(out);
        return jp_fail(j, q - 2, "invalid \\u escape"), NULL;
      }
      q += 4;
      unsigned cp = (unsigned)hi;
      if (cp >= 0xd800 && cp <= 0xdbff) {
        int lo = close - q >= 6 && q[0] == '\\' && q[1] == 'u' ? hex4(q + 2) : -1;
        if (lo < 0xdc00 || lo > 0xdfff) {
          free(out);
          return jp_fail(j, q - 6, "invalid \\u escape: a high surrogate without its low half"),
                 NULL;
        }
        q += 6;
        cp = 0x10000 + ((cp - 0xd800) << 10) + ((unsigned)lo - 0xdc00);
      } else if (cp >= 0xdc00 && cp <= 0xdfff) {
        free(out);
        return jp_fail(j, q - 6, "invalid \\u escape: a lone low surrogate"), NULL;
      }
      n += put_utf8(out + n, cp); /* never longer than its escape */
      break;
    }
    default: free(out); return jp_fail(j, q - 2, "invalid escape in a string"), NULL;
    }
  }
  out[n] = '\0';
  *out_len = n;
  j->p = close + 1;
  return out;
}

static jv_t *parse_value(jp_t *j);

static jv_t *parse_object(jp_t *j) {
  jv_t *v = jv_new(j, JV_OBJ);
  if (!v) return NULL;
  int64_t cap = 0;
  j->p++;
  skip_ws(j);
  if (j->p < j->end && *j->p == '}') {
    j->p++;
    return v;
  }
  for (;;) {
    skip_ws(j);
    if (j->p >= j->end) return jv_free(v), jp_fail(j, j->p, "unexpected end in an object");
    if (*j->p != '"') return jv_free(v), jp_fail(j, j->p, "expected a member name (a string)");
    size_t klen = 0;
    char *key = scan_string(j, &klen);
    if (!key) return jv_free(v), NULL;
    skip_ws(j);
    if (j->p >= j->end || *j->p != ':') {
      free(key);
      return jv_free(v), jp_fail(j, j->p, "expected ':' after a member name");
    }
    j->p++;
    jv_t *val = parse_value(j);
    if (!val) {
      free(key);
      return jv_free(v), NULL;
    }
    if (v->n == cap) {
      int64_t nc = cap ? 2 * cap : 8;
      jv_member_t *g = realloc(v->mem, (size_t)nc * sizeof *g);
      if (!g) {
        free(key);
        jv_free(val);
        j->oom = true;
        return jv_free(v), jp_fail(j, j->p, "out of memory");
      }
      v->mem = g;
      cap = nc;
    }
    v->mem[v->n++] = (jv_member_t){key, klen, val};
    skip_ws(j);
    if (j->p < j->end && *j->p == ',') {
      j->p++;
      continue;
    }
    if (j->p < j->end && *j->p == '}') {
      j->p++;
      return v;
    }
    return jv_free(v), jp_fail(j, j->p, j->p >= j->end ? "unexpected end in an object"
                                                     : "expected ',' or '}' in an object");
  }
}

static bool push_item(jp_t *j, jv_t *arr, int64_t *cap, jv_t *item) {
  if (arr->n == *cap) {
    int64_t nc = *cap ? 2 * *cap : 8;
    jv_t **g = realloc(arr->items, (size_t)nc * sizeof *g);
    if (!g) {
      j->oom = true;
      jp_fail(j, j->p, "out of memory");
      return false;
    }
    arr->items = g;
    *cap = nc;
  }
  arr->items[arr->n++] = item;
  return true;
}

/* Widens a packed array to `mode`. */
static bool nums_widen(jv_t *v, nums_mode_t mode, int64_t cap) {
  size_t sz = mode == NUMS_I32 ? 4 : 8;
  void *w = malloc((size_t)(cap > 0 ? cap : 1) * sz);
  if (!w) return false;
  for (int64_t i = 0; i < v->n; i++) {
    if (mode == NUMS_I64)
      ((int64_t *)w)[i] = ((int32_t *)v->nums)[i];
    else if (v->mode == NUMS_I32)
      ((double *)w)[i] = ((int32_t *)v->nums)[i];
    else
      ((double *)w)[i] = (double)((int64_t *)v->nums)[i];
  }
  free(v->nums);
  v->nums = w;
  v->mode = mode;
  return true;
}

static bool nums_push(jp_t *j, jv_t *v, int64_t *cap, double d, int64_t iv, bool is_int) {
  nums_mode_t need = !is_int                             ? NUMS_F64
                     : iv >= INT32_MIN && iv <= INT32_MAX ? NUMS_I32
                                                          : NUMS_I64;
  if (need > v->mode && v->mode != NUMS_F64) {
    if (!nums_widen(v, need, *cap)) goto oom;
  }
  if (v->n == *cap) {
    int64_t nc = *cap ? 2 * *cap : 64;
    size_t sz = v->mode == NUMS_I32 ? 4 : 8;
    void *g = realloc(v->nums, (size_t)nc * sz);
    if (!g) goto oom;
    v->nums = g;
    *cap = nc;
  }
  if (v->mode == NUMS_I32)
    ((int32_t *)v->nums)[v->n++] = (int32_t)iv;
  else if (v->mode == NUMS_I64)
    ((int64_t *)v->nums)[v->n++] = iv;
  else
    ((double *)v->nums)[v->n++] = is_int ? (double)iv : d;
  return true;
oom:
  j->oom = true;
  jp_fail(j, j->p, "out of memory");
  return false;
}

/* A packed array turned into a tree (an element that is not a number came). */
static bool nums_unpack(jp_t *j, jv_t *v, int64_t *cap) {
  int64_t n = v->n;
  void *nums = v->nums;
  nums_mode_t mode = v->mode;
  v->kind = JV_ARR;
  v->nums = NULL;
  v->n = 0;
  *cap = 0;
  bool ok = true;
  for (int64_t i = 0; i < n && ok; i++) {
    jv_t *x = jv_new(j, JV_NUM);
    if (!x) {
      ok = false;
      break;
    }
    if (mode == NUMS_F64) {
      x->num = ((double *)nums)[i];
    } else {
      x->inum = mode == NUMS_I32 ? ((int32_t *)nums)[i] : ((int64_t *)nums)[i];
      x->num = (double)x->inum;
      x->is_int = true;
    }
    if (!push_item(j, v, cap, x)) {
      jv_free(x);
      ok = false;
    }
  }
  free(nums);
  return ok;
}

static jv_t *parse_array(jp_t *j) {
  jv_t *v = jv_new(j, JV_ARR);
  if (!v) return NULL;
  int64_t cap = 0;
  j->p++;
  skip_ws(j);
  if (j->p < j->end && *j->p == ']') {
    j->p++;
    return v;
  }
  if (j->p < j->end && (*j->p == '-' || is_digit(*j->p))) {
    v->kind = JV_NUMS;
    v->mode = NUMS_I32;
  }
  for (;;) {
    skip_ws(j);
    if (j->p >= j->end) return jv_free(v), jp_fail(j, j->p, "unexpected end in an array");
    bool num = *j->p == '-' || is_digit(*j->p);
    if (v->kind == JV_NUMS && !num && !nums_unpack(j, v, &cap)) return jv_free(v), NULL;
    if (v->kind == JV_NUMS) {
      double d = 0;
      int64_t iv = 0;
      bool is_int = false;
      if (!scan_number(j, &d, &iv, &is_int) || !nums_push(j, v, &cap, d, iv, is_int))
        return jv_free(v), NULL;
    } else {
      jv_t *x = parse_value(j);
      if (!x) return jv_free(v), NULL;
      if (!push_item(j, v, &cap, x)) return jv_free(x), jv_free(v), NULL;
    }
    skip_ws(j);
    if (j->p < j->end && *j->p == ',') {
      j->p++;
      continue;
    }
    if (j->p < j->end && *j->p == ']') {
      j->p++;
      return v;
    }
    return jv_free(v), jp_fail(j, j->p, j->p >= j->end ? "unexpected end in an array"
                                                     : "expected ',' or ']' in an array");
  }
}

static jv_t *parse_literal(jp_t *j, const char *word, jv_kind_t kind, bool b) {
  size_t n = strlen(word);
  if ((size_t)(j->end - j->p) < n || memcmp(j->p, word, n) != 0)
    return jp_fail(j, j->p, "invalid literal (expected a value)");
  jv_t *v = jv_new(j, kind);
  if (!v) return NULL;
  v->b = b;
  j->p += n;
  return v;
}

static jv_t *parse_value(jp_t *j) {
  skip_ws(j);
  if (j->p >= j->end) return jp_fail(j, j->p, "unexpected end: expected a value");
  if (j->depth >= MAX_DEPTH) return jp_fail(j, j->p, "nested too deeply");
  char c = *j->p;
  jv_t *v = NULL;
  j->depth++;
  if (c == '{') {
    v = parse_object(j);
  } else if (c == '[') {
    v = parse_array(j);
  } else if (c == '"') {
    v = jv_new(j, JV_STR);
    if (v && !(v->str = scan_string(j, &v->len))) {
      jv_free(v);
      v = NULL;
    }
  } else if (c == 't') {
    v = parse_literal(j, "true", JV_BOOL, true);
  } else if (c == 'f') {
    v = parse_literal(j, "false", JV_BOOL, false);
  } else if (c == 'n') {
    v = parse_literal(j, "null", JV_NULL, false);
  } else if (c == '-' || is_digit(c)) {
    v = jv_new(j, JV_NUM);
    if (v && !scan_number(j, &v->num, &v->inum, &v->is_int)) {
      jv_free(v);
      v = NULL;
    }
  } else {
    v = jp_fail(j, j->p, "unexpected character: expected a value");
  }
  j->depth--;
  return v;
}

/* The document of text[0, len), or NULL after an error reported to diag
 * (a syntax error at line:column; out of memory without place). */
static jv_t *parse_doc(const char *text, size_t len, const char *source, xm_diag_t *d,
                       bool *oom) {
  jp_t j = {.base = text, .p = text, .end = text + len};
  jv_t *v = parse_value(&j);
  if (v) {
    skip_ws(&j);
    if (j.p < j.end) {
      jv_free(v);
      v = jp_fail(&j, j.p, "unexpected text after the document");
    }
  }
  if (!v) {
    *oom = j.oom;
    if (j.oom) {
      xm_diag_add(d, XM_DIAG_ERROR, source, NULL, "out of memory reading the file");
      return NULL;
    }
    size_t off = j.err_at ? (size_t)(j.err_at - text) : len;
    int line, col;
    xm_text_line_col(text, off, &line, &col);
    char place[48];
    snprintf(place, sizeof place, "%d:%d", line, col);
    xm_diag_add(d, XM_DIAG_ERROR, source, place, "JSON syntax error: %s", j.err_msg);
  }
  return v;
}

/* ---- validation helpers ---------------------------------------------------------- */

typedef struct {
  xm_diag_t *d;
  const char *src;
  int shown, hidden;
} rd_t;

static void rerr(rd_t *r, const char *place, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void rerr(rd_t *r, const char *place, const char *fmt, ...) {
  if (r->shown >= MAX_SHOWN) {
    r->hidden++;
    return;
  }
  r->shown++;
  va_list ap;
  va_start(ap, fmt);
  xm_diag_addv(r->d, XM_DIAG_ERROR, r->src, place, fmt, ap);
  va_end(ap);
}

static void rd_finish(rd_t *r) {
  if (r->hidden > 0)
    xm_diag_add(r->d, XM_DIAG_ERROR, r->src, NULL, "%d more problem%s not shown", r->hidden,
                r->hidden == 1 ? "" : "s");
}

/* Appends "/" and a member name escaped as a JSON pointer token (~0, ~1),
 * its control bytes as '?', cut at 80 bytes. */
static void ptr_member(char *out, size_t cap, const char *base, const char *key, size_t klen) {
  size_t n = (size_t)snprintf(out, cap, "%s/", base);
  for (size_t i = 0; i < klen && i < 80 && n + 3 < cap; i++) {
    unsigned char c = (unsigned char)key[i];
    if (c == '~') out[n++] = '~', out[n++] = '0';
    else if (c == '/') out[n++] = '~', out[n++] = '1';
    else out[n++] = c < 0x20 || c == 0x7f ? '?' : (char)c;
  }
  out[n < cap ? n : cap - 1] = '\0';
}

static const char *kind_name(const jv_t *v) {
  switch (v->kind) {
  case JV_NULL: return "null";
  case JV_BOOL: return "a boolean";
  case JV_NUM: return "a number";
  case JV_STR: return "a string";
  case JV_ARR:
  case JV_NUMS: return "an array";
  case JV_OBJ: return "an object";
  }
  return "?";
}

/* Members of `o` (an object) not named in `known` are errors; a known one
 * given twice too. got[i] is the value of known[i] or NULL. */
static void members(rd_t *r, const jv_t *o, const char *at, const char *const *known, int nknown,
                    const jv_t **got, const char *what) {
  for (int i = 0; i < nknown; i++)
    got[i] = NULL;
  for (int64_t m = 0; m < o->n; m++) {
    const jv_member_t *mb = &o->mem[m];
    int i = 0;
    while (i < nknown && !(strlen(known[i]) == mb->key_len && !memcmp(known[i], mb->key, mb->key_len)))
      i++;
    char p[192];
    ptr_member(p, sizeof p, at, mb->key, mb->key_len);
    if (i == nknown) {
      char list[256] = "";
      size_t n = 0;
      for (int k = 0; k < nknown && n < sizeof list; k++)
        n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", k ? ", " : "", known[k]);
      rerr(r, p, "unknown member (%s has %s)", what, list);
    } else if (got[i]) {
      rerr(r, p, "given twice");
    } else {
      got[i] = mb->val;
    }
  }
}

/* A whole number in [lo, hi]. */
static bool int_value(const jv_t *v, int64_t lo, int64_t hi, int64_t *out) {
  if (!v || v->kind != JV_NUM || !v->is_int || v->inum < lo || v->inum > hi) return false;
  *out = v->inum;
  return true;
}

/* Element i of an array as a whole number; false when it is not one. */
static bool elem_int(const jv_t *a, int64_t i, int64_t *out) {
  if (a->kind == JV_NUMS) {
    if (a->mode == NUMS_I32) *out = ((int32_t *)a->nums)[i];
    else if (a->mode == NUMS_I64) *out = ((int64_t *)a->nums)[i];
    else {
      double d = ((double *)a->nums)[i];
      if (!isfinite(d) || d != floor(d) || fabs(d) > 9.2e18) return false;
      *out = (int64_t)d;
    }
    return true;
  }
  const jv_t *x = a->items[i];
  if (x->kind != JV_NUM || !x->is_int) return false;
  *out = x->inum;
  return true;
}

static bool is_array(const jv_t *v) { return v && (v->kind == JV_ARR || v->kind == JV_NUMS); }

/* An array of exactly `n` whole numbers in [lo, hi] into out (int64 or
 * int32 when out32). Problems reported at at/j, the first few of them. */
static bool int_array(rd_t *r, const jv_t *v, const char *at, int64_t n, int64_t lo, int64_t hi,
                      const char *what, int64_t *out64, int32_t *out32) {
  if (!is_array(v)) {
    rerr(r, at, "must be an array of %lld %s", (long long)n, what);
    return false;
  }
  if (v->n != n) {
    rerr(r, at, "has %lld values, expected %lld (%s)", (long long)v->n, (long long)n, what);
    return false;
  }
  bool ok = true;
  int bad = 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t x = 0;
    if (!elem_int(v, i, &x) || x < lo || x > hi) {
      ok = false;
      if (bad++ < 3) {
        char p[192];
        snprintf(p, sizeof p, "%s/%lld", at, (long long)i);
        rerr(r, p, "must be a whole number in [%lld, %lld]", (long long)lo, (long long)hi);
      }
      continue;
    }
    if (out64) out64[i] = x;
    if (out32) out32[i] = (int32_t)x;
  }
  if (bad > 3) rerr(r, at, "%d more values out of range", bad - 3);
  return ok;
}

/* "format" and "version" of either file. */
static void check_format(rd_t *r, const jv_t *fv, const jv_t *vv, const char *format,
                         const char *what) {
  if (!fv)
    rerr(r, "/format", "missing: \"%s\" (%s)", format, what);
  else if (fv->kind != JV_STR || strlen(format) != fv->len || memcmp(fv->str, format, fv->len))
    rerr(r, "/format", "must be \"%s\" (%s)", format, what);
  int64_t ver = 0;
  if (!vv)
    rerr(r, "/version", "missing: 1");
  else if (!int_value(vv, 1, 1, &ver))
    rerr(r, "/version", "unsupported version: this xmoec reads version 1");
}

static void *xcalloc(size_t n, size_t sz) { return calloc(n > 0 ? n : 1, sz); }

static char *dup_str(const char *s) {
  size_t n = strlen(s);
  char *o = malloc(n + 1);
  if (o) memcpy(o, s, n + 1);
  return o;
}

/* Reads a whole file for a parser; XM_ERR_IO reported to diag. */
static xm_status_t read_whole(const char *path, size_t limit, const char *kind, xm_diag_t *d,
                              char **text, size_t *len) {
  int e = xm_read_file_limit(path, limit, text, len);
  if (e != 0) {
    char why[160];
    xm_diag_add(d, XM_DIAG_ERROR, path, NULL, "cannot read the %s: %s", kind,
                xm_read_error(e, limit, why, sizeof why));
    return XM_ERR_IO;
  }
  return XM_OK;
}

/* ---- placement files ---------------------------------------------------------------- */

void xm_placement_free(xm_placement_t *p) {
  if (!p) return;
  free(p->source);
  free(p->layer);
  free(p->slots);
  memset(p, 0, sizeof *p);
}

bool xm_placement_row_is_identity(const xm_placement_t *p, int64_t r) {
  if (!p || r < 0 || r >= p->rows) return true;
  const int32_t *s = p->slots + r * p->experts;
  for (int64_t i = 0; i < p->experts; i++)
    if (s[i] != i) return false;
  return true;
}

typedef struct {
  int64_t layer, index;
} row_key_t;

static int cmp_row_key(const void *a, const void *b) {
  const row_key_t *x = a, *y = b;
  if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
  return x->index < y->index ? -1 : x->index > y->index;
}

/* One placement row: a permutation of 0..E-1. */
static void read_row(rd_t *r, const jv_t *sv, const char *at, int64_t E, int32_t *row,
                     int32_t *seen) {
  if (!int_array(r, sv, at, E, 0, E - 1, "one expert per slot, a permutation of 0..experts-1",
                 NULL, row))
    return;
  for (int64_t e = 0; e < E; e++)
    seen[e] = -1;
  int64_t dup_at = -1, missing = -1;
  for (int64_t p = 0; p < E; p++) {
    if (seen[row[p]] >= 0 && dup_at < 0) dup_at = p;
    if (seen[row[p]] < 0) seen[row[p]] = (int32_t)p;
  }
  if (dup_at < 0) return;
  for (int64_t e = 0; e < E && missing < 0; e++)
    if (seen[e] < 0) missing = e;
  char p[192];
  snprintf(p, sizeof p, "%s/%lld", at, (long long)dup_at);
  rerr(r, p,
       "expert %d is given twice (also at slot %d) and expert %lld is missing: a row must be "
       "a permutation of 0..%lld",
       row[dup_at], seen[row[dup_at]], (long long)missing, (long long)(E - 1));
}

static void read_placement(rd_t *r, const jv_t *root, xm_placement_t *out) {
  if (root->kind != JV_OBJ) {
    rerr(r, "", "must be a JSON object (a placement file: docs/placement.md)");
    return;
  }
  static const char *const known[] = {"format", "version",   "experts", "nodes",
                                      "layers", "predicted", "comment"};
  const jv_t *g[7];
  members(r, root, "", known, 7, g, "a placement file");
  check_format(r, g[0], g[1], "xmoec-placement", "a placement file");
  int64_t E = 0, nodes = 0;
  if (!g[2])
    rerr(r, "/experts", "missing: the routed experts E");
  else if (!int_value(g[2], 1, MAX_EXPERTS, &E))
    rerr(r, "/experts", "must be a whole number in [1, %lld]", (long long)MAX_EXPERTS);
  if (g[3] && !int_value(g[3], 1, E > 0 ? E : MAX_EXPERTS, &nodes))
    rerr(r, "/nodes", "must be a whole number in [1, %lld] (the node blocks it was made for)",
         (long long)(E > 0 ? E : MAX_EXPERTS));
  if (g[5] && g[5]->kind != JV_OBJ)
    rerr(r, "/predicted", "must be an object (what xmoec place predicted; not read)");
  if (g[6] && g[6]->kind != JV_STR) rerr(r, "/comment", "must be a string");
  const jv_t *lv = g[4];
  if (!lv) {
    rerr(r, "/layers", "missing: one {\"layer\": L, \"slots\": [...]} per placed MoE layer");
    return;
  }
  if (lv->kind != JV_ARR) {
    rerr(r, "/layers", "must be an array of {\"layer\": L, \"slots\": [...]} objects");
    return;
  }
  if (E < 1) return;
  int64_t n = lv->kind == JV_ARR ? lv->n : 0;
  if (n > 0 && E > (((int64_t)1 << 31) - 1) / n) {
    rerr(r, "/layers", "%lld rows of %lld experts are more than this reader takes", (long long)n,
         (long long)E);
    return;
  }
  int32_t *slots = xcalloc((size_t)(n * E), sizeof *slots);
  int64_t *lay = xcalloc((size_t)n, sizeof *lay);
  int32_t *seen = xcalloc((size_t)E, sizeof *seen);
  row_key_t *keys = xcalloc((size_t)n, sizeof *keys);
  XM_ASSERT(slots && lay && seen && keys);
  int before = xm_diag_error_count(r->d) + r->hidden;
  for (int64_t i = 0; i < n; i++) {
    const jv_t *o = lv->items[i];
    char at[64];
    snprintf(at, sizeof at, "/layers/%lld", (long long)i);
    keys[i] = (row_key_t){-1, i};
    if (o->kind != JV_OBJ) {
      rerr(r, at, "must be an object {\"layer\": L, \"slots\": [...]}, not %s", kind_name(o));
      continue;
    }
    static const char *const lk[] = {"layer", "slots"};
    const jv_t *m[2];
    members(r, o, at, lk, 2, m, "a layer");
    char p[96];
    snprintf(p, sizeof p, "%s/layer", at);
    if (!m[0])
      rerr(r, p, "missing: the Hugging Face index of the MoE layer");
    else if (!int_value(m[0], 0, MAX_LAYER, &keys[i].layer))
      rerr(r, p, "must be a whole number in [0, %lld]", (long long)MAX_LAYER);
    snprintf(p, sizeof p, "%s/slots", at);
    if (!m[1])
      rerr(r, p, "missing: the expert each of the %lld slots holds", (long long)E);
    else
      read_row(r, m[1], p, E, slots + i * E, seen);
  }
  /* A layer given twice: named at its second place. */
  qsort(keys, (size_t)n, sizeof *keys, cmp_row_key);
  for (int64_t i = 1; i < n; i++)
    if (keys[i].layer >= 0 && keys[i].layer == keys[i - 1].layer) {
      char p[96];
      snprintf(p, sizeof p, "/layers/%lld/layer", (long long)keys[i].index);
      rerr(r, p, "layer %lld is given twice (also at /layers/%lld)", (long long)keys[i].layer,
           (long long)keys[i - 1].index);
    }
  if (xm_diag_error_count(r->d) + r->hidden == before) {
    out->experts = E;
    out->nodes = nodes;
    out->rows = n;
    out->layer = lay;
    out->slots = xcalloc((size_t)(n * E), sizeof *out->slots);
    XM_ASSERT(out->slots);
    for (int64_t i = 0; i < n; i++) {
      lay[i] = keys[i].layer;
      memcpy(out->slots + i * E, slots + keys[i].index * E, (size_t)E * sizeof *slots);
    }
    lay = NULL;
  }
  free(slots);
  free(lay);
  free(seen);
  free(keys);
}

xm_status_t xm_placement_parse(const char *text, size_t len, const char *source, xm_diag_t *diag,
                               xm_placement_t *out) {
  memset(out, 0, sizeof *out);
  source = source ? source : "placement";
  int before = xm_diag_error_count(diag);
  bool oom = false;
  jv_t *root = parse_doc(text ? text : "", text ? len : 0, source, diag, &oom);
  if (!root) return oom ? XM_ERR_NO_MEMORY : XM_ERR_INVALID_INPUT;
  rd_t r = {.d = diag, .src = source};
  read_placement(&r, root, out);
  rd_finish(&r);
  jv_free(root);
  if (xm_diag_error_count(diag) > before) {
    xm_placement_free(out);
    return XM_ERR_INVALID_INPUT;
  }
  out->source = dup_str(source);
  if (!out->source) {
    xm_placement_free(out);
    return XM_ERR_NO_MEMORY;
  }
  return XM_OK;
}

xm_status_t xm_placement_load(const char *path, xm_diag_t *diag, xm_placement_t *out) {
  memset(out, 0, sizeof *out);
  char *text = NULL;
  size_t len = 0;
  XM_RETURN_IF_ERROR(read_whole(path, XM_READ_LIMIT_TEXT, "placement file", diag, &text, &len));
  xm_status_t st = xm_placement_parse(text, len, path, diag, out);
  free(text);
  return st;
}

xm_status_t xm_placement_check(const xm_placement_t *p, const xm_spec_t *spec, xm_diag_t *diag) {
  int before = xm_diag_error_count(diag);
  const char *src = p->source ? p->source : "placement";
  int64_t E = spec->moe.experts, L = spec->model.layers, D = spec->model.mtp_layers;
  if (E == 0) {
    xm_diag_add(diag, XM_DIAG_ERROR, src, NULL,
                "the model is dense (no routed experts): a placement does not apply");
    return XM_ERR_INVALID_INPUT;
  }
  if (p->experts != E) {
    xm_diag_add(diag, XM_DIAG_ERROR, src, "/experts",
                "the placement is for %lld routed experts, the model has %lld",
                (long long)p->experts, (long long)E);
    return XM_ERR_INVALID_INPUT;
  }
  int64_t G = spec->moe.n_group > 1 && E % spec->moe.n_group == 0 ? spec->moe.n_group : 1;
  int64_t gs = E / G;
  int shown = 0;
  for (int64_t r = 0; r < p->rows; r++) {
    int64_t l = p->layer[r];
    /* The MTP modules' layers L + j are built as whole decoder layers
     * (ir/model.c, build_mtp): MoE exactly when the model has experts. */
    bool moe = l >= 0 && l < L + D && xm_spec_layer_is_moe(spec, l);
    if (!moe) {
      if (l >= L + D)
        xm_diag_add(diag, XM_DIAG_ERROR, src, "/layers",
                    "layer %lld: the model has %lld layers%s (0..%lld)", (long long)l,
                    (long long)L, D > 0 ? " and MTP modules" : "", (long long)(L + D - 1));
      else
        xm_diag_add(diag, XM_DIAG_ERROR, src, "/layers",
                    "layer %lld is a dense layer of the model (first_k_dense %lld): only MoE "
                    "layers have experts to place",
                    (long long)l, (long long)spec->model.first_k_dense);
      continue;
    }
    if (G <= 1) continue;
    const int32_t *row = p->slots + r * E;
    for (int64_t g = 0; g < G; g++) {
      int64_t h = row[g * gs] / gs;
      int64_t bad = -1;
      for (int64_t i = 0; i < gs && bad < 0; i++)
        if (row[g * gs + i] / gs != h) bad = g * gs + i;
      if (bad < 0) continue;
      if (shown++ < MAX_SHOWN)
        xm_diag_add(diag, XM_DIAG_ERROR, src, "/layers",
                    "layer %lld: slot group %lld (slots %lld..%lld) holds expert %d of expert "
                    "group %lld and expert %d of group %lld: with group-limited routing "
                    "(n_group %lld) a slot group must hold exactly one expert group "
                    "(experts h*%lld .. h*%lld+%lld), since routing picks whole groups",
                    (long long)l, (long long)g, (long long)(g * gs), (long long)(g * gs + gs - 1),
                    row[g * gs], (long long)h, row[bad], (long long)(row[bad] / gs),
                    (long long)G, (long long)gs, (long long)gs, (long long)(gs - 1));
    }
  }
  if (shown > MAX_SHOWN)
    xm_diag_add(diag, XM_DIAG_ERROR, src, "/layers", "%d more slot groups break the expert groups",
                shown - MAX_SHOWN);
  return xm_diag_error_count(diag) > before ? XM_ERR_INVALID_INPUT : XM_OK;
}

void xm_placement_format(const xm_placement_t *p, const char *predicted, xm_strbuf_t *out) {
  xm_strbuf_printf(out,
                   "{\n  \"format\": \"xmoec-placement\",\n  \"version\": 1,\n  \"experts\": %lld,\n",
                   (long long)p->experts);
  if (p->nodes > 0) xm_strbuf_printf(out, "  \"nodes\": %lld,\n", (long long)p->nodes);
  xm_strbuf_puts(out, "  \"layers\": [");
  for (int64_t r = 0; r < p->rows; r++) {
    xm_strbuf_printf(out, "%s\n    {\"layer\": %lld, \"slots\": [", r ? "," : "",
                     (long long)p->layer[r]);
    for (int64_t i = 0; i < p->experts; i++)
      xm_strbuf_printf(out, "%s%d", i ? ", " : "", p->slots[r * p->experts + i]);
    xm_strbuf_puts(out, "]}");
  }
  xm_strbuf_puts(out, p->rows ? "\n  ]" : "]");
  if (predicted) {
    xm_strbuf_puts(out, ",\n  \"predicted\": ");
    for (const char *c = predicted; *c; c++) {
      if (*c == '\n' && c[1] == '\0') break;
      xm_strbuf_append(out, c, 1);
      if (*c == '\n') xm_strbuf_puts(out, "  ");
    }
  }
  xm_strbuf_puts(out, "\n}\n");
}

xm_status_t xm_placement_write(const char *path, const xm_placement_t *p, const char *predicted,
                               xm_diag_t *diag) {
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  xm_placement_format(p, predicted, &b);
  xm_strbuf_t tmp;
  xm_strbuf_init(&tmp);
  xm_strbuf_printf(&tmp, "%s.tmp-%ld", path, (long)getpid());
  const char *t = xm_strbuf_cstr(&tmp);
  FILE *f = fopen(t, "w");
  int err = f ? 0 : errno;
  if (f) {
    if (fwrite(b.data, 1, b.len, f) != b.len) err = errno ? errno : EIO;
    if (fclose(f) != 0 && !err) err = errno ? errno : EIO;
    if (!err && rename(t, path) != 0) err = errno;
    if (err) unlink(t);
  }
  if (err)
    xm_diag_add(diag, XM_DIAG_ERROR, path, NULL, "cannot write the placement file: %s",
                strerror(err));
  xm_strbuf_free(&tmp);
  xm_strbuf_free(&b);
  return err ? XM_ERR_IO : XM_OK;
}

/* ---- routing statistics files --------------------------------------------------------- */

void xm_routing_stats_free(xm_routing_stats_t *s) {
  if (!s) return;
  for (int64_t i = 0; s->layers && i < s->num_layers; i++) {
    xm_routing_stats_layer_t *l = &s->layers[i];
    free(l->load);
    free(l->coselect);
    free(l->sample_node);
    free(l->sample_experts);
  }
  free(s->layers);
  free(s->source);
  free(s->model);
  memset(s, 0, sizeof *s);
}

static void read_layout(rd_t *r, const jv_t *v, xm_routing_stats_t *s) {
  if (!v) {
    rerr(r, "/layout",
         "missing: {\"world\": W, \"ep\": EP, \"ranks_per_node\": R, \"nodes\": N} of the run");
    return;
  }
  if (v->kind != JV_OBJ) {
    rerr(r, "/layout", "must be an object {\"world\", \"ep\", \"ranks_per_node\", \"nodes\"}");
    return;
  }
  static const char *const known[] = {"world", "ep", "ranks_per_node", "nodes"};
  const jv_t *g[4];
  members(r, v, "/layout", known, 4, g, "the layout");
  int64_t *dst[4] = {&s->world, &s->ep, &s->ranks_per_node, &s->nodes};
  for (int i = 0; i < 4; i++) {
    char p[64];
    snprintf(p, sizeof p, "/layout/%s", known[i]);
    if (!g[i])
      rerr(r, p, "missing");
    else if (!int_value(g[i], 1, 1 << 24, dst[i]))
      rerr(r, p, "must be a whole number in [1, 2^24]");
  }
  if (s->ep > 0 && s->world > 0 && s->ep > s->world)
    rerr(r, "/layout/ep", "(%lld) exceeds /layout/world (%lld)", (long long)s->ep,
         (long long)s->world);
  if (s->nodes > 0 && s->ep > 0 && s->nodes > s->ep)
    rerr(r, "/layout/nodes", "(%lld) exceeds /layout/ep (%lld): an EP group spans at most one "
         "node per rank", (long long)s->nodes, (long long)s->ep);
}

/* One element of "layers". Returns false when it could not be read whole. */
static bool read_stats_layer(rd_t *r, const jv_t *o, int64_t i, const xm_routing_stats_t *s,
                             xm_routing_stats_layer_t *l, int64_t *scratch) {
  char at[64], p[128];
  snprintf(at, sizeof at, "/layers/%lld", (long long)i);
  l->index = i;
  l->layer = -1;
  if (o->kind != JV_OBJ) {
    rerr(r, at, "must be an object (one MoE layer's statistics), not %s", kind_name(o));
    return false;
  }
  static const char *const known[] = {"layer",   "tokens",      "load",          "coselect",
                                      "samples", "sample_node", "sample_experts"};
  const jv_t *g[7];
  members(r, o, at, known, 7, g, "a layer");
  bool ok = true;
  for (int k = 0; k < 7; k++)
    if (!g[k]) {
      snprintf(p, sizeof p, "%s/%s", at, known[k]);
      rerr(r, p, "missing");
      ok = false;
    }
  if (!ok) return false;
  snprintf(p, sizeof p, "%s/layer", at);
  if (!int_value(g[0], 0, MAX_LAYER, &l->layer)) {
    rerr(r, p, "must be a whole number in [0, %lld]", (long long)MAX_LAYER);
    ok = false;
  }
  snprintf(p, sizeof p, "%s/tokens", at);
  if (!int_value(g[1], 0, BIG, &l->tokens)) {
    rerr(r, p, "must be a whole number >= 0 (distinct tokens routed)");
    ok = false;
  }
  snprintf(p, sizeof p, "%s/samples", at);
  if (!int_value(g[4], 0, BIG, &l->samples)) {
    rerr(r, p, "must be a whole number >= 0 (sampled tokens)");
    ok = false;
  } else if (ok && l->samples > l->tokens) {
    rerr(r, p, "(%lld) exceeds tokens (%lld): the sample is some of the routed tokens",
         (long long)l->samples, (long long)l->tokens);
    ok = false;
  } else if (s->sample_cap >= 0 && l->samples > s->sample_cap) {
    rerr(r, p, "(%lld) exceeds /sample_cap (%lld)", (long long)l->samples,
         (long long)s->sample_cap);
    ok = false;
  }
  int64_t E = s->experts, k = s->top_k;
  if (E < 1 || k < 1) return false;
  if (!ok) return false;
  if (l->samples > (int64_t)INT32_MAX / k) {
    snprintf(p, sizeof p, "%s/samples", at);
    rerr(r, p, "%lld sampled tokens of %lld experts are more than this reader takes",
         (long long)l->samples, (long long)k);
    return false;
  }
  /* The sizes first, so that nothing is allocated beyond what the file holds. */
  const char *names[4] = {"load", "coselect", "sample_node", "sample_experts"};
  const jv_t *arrs[4] = {g[2], g[3], g[5], g[6]};
  int64_t want[4] = {E, E * E, l->samples, l->samples * k};
  const char *what[4] = {"slots per expert: one per expert",
                         "co-selection counts: experts x experts, row-major",
                         "the node of each sampled token: one per sample",
                         "the sampled tokens' experts: top_k per sample"};
  for (int a = 0; a < 4; a++) {
    snprintf(p, sizeof p, "%s/%s", at, names[a]);
    if (!is_array(arrs[a])) {
      rerr(r, p, "must be an array of %lld numbers (%s)", (long long)want[a], what[a]);
      ok = false;
    } else if (arrs[a]->n != want[a]) {
      rerr(r, p, "has %lld values, expected %lld (%s)", (long long)arrs[a]->n,
           (long long)want[a], what[a]);
      ok = false;
    }
  }
  if (!ok) return false;
  l->load = xcalloc((size_t)E, sizeof *l->load);
  l->coselect = xcalloc((size_t)(E * E), sizeof *l->coselect);
  l->sample_node = xcalloc((size_t)l->samples, sizeof *l->sample_node);
  l->sample_experts = xcalloc((size_t)(l->samples * k), sizeof *l->sample_experts);
  if (!l->load || !l->coselect || !l->sample_node || !l->sample_experts) {
    rerr(r, at, "out of memory");
    return false;
  }
  snprintf(p, sizeof p, "%s/load", at);
  ok &= int_array(r, g[2], p, E, 0, BIG, "slots per expert", l->load, NULL);
  snprintf(p, sizeof p, "%s/coselect", at);
  bool cok = int_array(r, g[3], p, E * E, 0, BIG, "experts x experts co-selection counts",
                       l->coselect, NULL);
  ok &= cok;
  snprintf(p, sizeof p, "%s/sample_node", at);
  ok &= int_array(r, g[5], p, l->samples, 0, s->nodes > 0 ? s->nodes - 1 : 0,
                  "one node of the EP group per sampled token (below /layout/nodes)", NULL,
                  l->sample_node);
  snprintf(p, sizeof p, "%s/sample_experts", at);
  ok &= int_array(r, g[6], p, l->samples * k, -1, E - 1,
                  "top_k expert ids per sampled token, -1 a dropped slot", NULL,
                  l->sample_experts);
  if (!ok) return false;
  /* What the counts allow. */
  int64_t slots = 0;
  for (int64_t e = 0; e < E; e++) {
    slots += l->load[e];
    if (l->load[e] > l->tokens) {
      snprintf(p, sizeof p, "%s/load/%lld", at, (long long)e);
      rerr(r, p, "(%lld) exceeds tokens (%lld): a token picks an expert once",
           (long long)l->load[e], (long long)l->tokens);
      ok = false;
    }
  }
  if (ok && slots > l->tokens * k) {
    snprintf(p, sizeof p, "%s/load", at);
    rerr(r, p, "sums to %lld slots, more than tokens x top_k = %lld", (long long)slots,
         (long long)(l->tokens * k));
    ok = false;
  }
  int bad = 0;
  for (int64_t a = 0; a < E && bad < 3; a++) {
    int64_t row = 0;
    for (int64_t b = 0; b < E && bad < 3; b++) {
      int64_t c = l->coselect[a * E + b];
      row += c;
      const char *why = NULL;
      char msg[160];
      if (a == b && c != 0) {
        why = "must be 0: the diagonal counts no pair";
      } else if (b > a && c != l->coselect[b * E + a]) {
        snprintf(msg, sizeof msg, "(%lld) differs from [%lld] (%lld): the counts are symmetric",
                 (long long)c, (long long)(b * E + a), (long long)l->coselect[b * E + a]);
        why = msg;
      } else if (c > l->load[a] || c > l->load[b]) {
        snprintf(msg, sizeof msg,
                 "(%lld) exceeds the load of expert %lld or %lld: a pair is chosen at most as "
                 "often as either expert",
                 (long long)c, (long long)a, (long long)b);
        why = msg;
      }
      if (why) {
        snprintf(p, sizeof p, "%s/coselect/%lld", at, (long long)(a * E + b));
        rerr(r, p, "%s", why);
        bad++;
      }
    }
    if (!bad && row > l->load[a] * (k - 1)) {
      snprintf(p, sizeof p, "%s/coselect", at);
      rerr(r, p,
           "row %lld sums to %lld, more than load x (top_k - 1) = %lld: expert %lld has at most "
           "top_k - 1 partners per token",
           (long long)a, (long long)row, (long long)(l->load[a] * (k - 1)), (long long)a);
      bad++;
    }
  }
  if (bad) return false;
  /* The sampled tokens: distinct experts, counts within the totals. */
  int64_t *cnt = scratch, *stamp = scratch + E;
  for (int64_t e = 0; e < E; e++)
    cnt[e] = 0, stamp[e] = -1;
  for (int64_t t = 0; t < l->samples && bad < 3; t++) {
    const int32_t *ids = l->sample_experts + t * k;
    for (int64_t j = 0; j < k; j++) {
      int32_t e = ids[j];
      if (e < 0) continue;
      if (stamp[e] == t) {
        snprintf(p, sizeof p, "%s/sample_experts/%lld", at, (long long)(t * k + j));
        rerr(r, p, "sampled token %lld picks expert %d twice: a token's experts are distinct",
             (long long)t, e);
        bad++;
        break;
      }
      stamp[e] = t;
      cnt[e]++;
    }
  }
  for (int64_t e = 0; e < E && !bad; e++)
    if (cnt[e] > l->load[e]) {
      snprintf(p, sizeof p, "%s/sample_experts", at);
      rerr(r, p, "the sampled tokens pick expert %lld %lld times, more than its load %lld",
           (long long)e, (long long)cnt[e], (long long)l->load[e]);
      bad++;
    }
  return bad == 0;
}

static int cmp_stats_layer(const void *a, const void *b) {
  const xm_routing_stats_layer_t *x = a, *y = b;
  if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
  return x->index < y->index ? -1 : x->index > y->index;
}

static void read_stats(rd_t *r, const jv_t *root, xm_routing_stats_t *s) {
  if (root->kind != JV_OBJ) {
    rerr(r, "", "must be a JSON object (routing statistics: docs/placement.md)");
    return;
  }
  static const char *const known[] = {"format", "version",    "model",  "experts",
                                      "top_k",  "layout",     "placed", "steps",
                                      "sample_cap", "layers", "comment"};
  const jv_t *g[11];
  members(r, root, "", known, 11, g, "a routing statistics file");
  check_format(r, g[0], g[1], "xmoec-routing-stats", "out/train --routing-stats");
  if (g[2] && g[2]->kind != JV_STR) rerr(r, "/model", "must be a string (the run's model)");
  s->model = dup_str(g[2] && g[2]->kind == JV_STR ? g[2]->str : "");
  XM_ASSERT(s->model);
  if (!g[3])
    rerr(r, "/experts", "missing: the routed experts E");
  else if (!int_value(g[3], 1, MAX_EXPERTS, &s->experts))
    rerr(r, "/experts", "must be a whole number in [1, %lld]", (long long)MAX_EXPERTS);
  if (!g[4])
    rerr(r, "/top_k", "missing: the experts each token picks");
  else if (s->experts > 0 && !int_value(g[4], 1, s->experts, &s->top_k))
    rerr(r, "/top_k", "must be a whole number in [1, %lld] (/experts)", (long long)s->experts);
  read_layout(r, g[5], s);
  if (g[6] && g[6]->kind != JV_BOOL)
    rerr(r, "/placed", "must be true or false");
  else if (g[6])
    s->placed = g[6]->b;
  s->steps = s->sample_cap = -1;
  if (g[7] && !int_value(g[7], 0, BIG, &s->steps))
    rerr(r, "/steps", "must be a whole number >= 0");
  if (g[8] && !int_value(g[8], 0, BIG, &s->sample_cap))
    rerr(r, "/sample_cap", "must be a whole number >= 0");
  if (g[10] && g[10]->kind != JV_STR) rerr(r, "/comment", "must be a string");
  const jv_t *lv = g[9];
  if (!lv) {
    rerr(r, "/layers", "missing: the statistics of each MoE layer");
    return;
  }
  if (lv->kind != JV_ARR || lv->n == 0) {
    rerr(r, "/layers", "must be a non-empty array of layer objects (no MoE layer was recorded?)");
    return;
  }
  if (s->experts < 1 || s->top_k < 1 || s->nodes < 1) return;
  if (s->experts > (int64_t)1 << 15) {
    rerr(r, "/experts", "%lld experts: the co-selection matrix of E x E counts is too large",
         (long long)s->experts);
    return;
  }
  int64_t n = lv->n;
  s->layers = xcalloc((size_t)n, sizeof *s->layers);
  int64_t *scratch = xcalloc((size_t)(2 * s->experts), sizeof *scratch);
  XM_ASSERT(s->layers && scratch);
  s->num_layers = n;
  for (int64_t i = 0; i < n; i++)
    read_stats_layer(r, lv->items[i], i, s, &s->layers[i], scratch);
  free(scratch);
  qsort(s->layers, (size_t)n, sizeof *s->layers, cmp_stats_layer);
  for (int64_t i = 1; i < n; i++)
    if (s->layers[i].layer >= 0 && s->layers[i].layer == s->layers[i - 1].layer) {
      char p[96];
      snprintf(p, sizeof p, "/layers/%lld/layer", (long long)s->layers[i].index);
      rerr(r, p, "layer %lld is given twice (also at /layers/%lld)", (long long)s->layers[i].layer,
           (long long)s->layers[i - 1].index);
    }
}

xm_status_t xm_routing_stats_parse(const char *text, size_t len, const char *source,
                                   xm_diag_t *diag, xm_routing_stats_t *out) {
  memset(out, 0, sizeof *out);
  source = source ? source : "routing statistics";
  int before = xm_diag_error_count(diag);
  bool oom = false;
  jv_t *root = parse_doc(text ? text : "", text ? len : 0, source, diag, &oom);
  if (!root) return oom ? XM_ERR_NO_MEMORY : XM_ERR_INVALID_INPUT;
  rd_t r = {.d = diag, .src = source};
  read_stats(&r, root, out);
  rd_finish(&r);
  jv_free(root);
  out->source = dup_str(source);
  if (xm_diag_error_count(diag) > before || !out->source) {
    bool mem = !out->source && xm_diag_error_count(diag) == before;
    xm_routing_stats_free(out);
    return mem ? XM_ERR_NO_MEMORY : XM_ERR_INVALID_INPUT;
  }
  return XM_OK;
}

xm_status_t xm_routing_stats_load(const char *path, xm_diag_t *diag, xm_routing_stats_t *out) {
  memset(out, 0, sizeof *out);
  char *text = NULL;
  size_t len = 0;
  XM_RETURN_IF_ERROR(read_whole(path, XM_ROUTING_STATS_READ_LIMIT, "routing statistics", diag,
                                &text, &len));
  xm_status_t st = xm_routing_stats_parse(text, len, path, diag, out);
  free(text);
  return st;
}
