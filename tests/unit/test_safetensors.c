/* tests/unit/test_safetensors.c — the safetensors writer and reader: exact
 * bytes of a small file, round trips through disk, every malformed variant
 * with its message and place, and a mutation sweep (truncations, byte flips,
 * random edits) that must never crash and never accept out-of-range data. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/io/safetensors.h"
#include "support/strbuf.h"

static bool diag_has(const xm_diag_t *d, const char *needle) {
  for (int i = 0; i < d->count; i++)
    if (d->entries[i].level == XM_DIAG_ERROR && strstr(d->entries[i].message, needle)) return true;
  return false;
}

static void dump_diag(const xm_diag_t *d) { xm_diag_print(d, stderr); }

static int rm_cb(const char *p, const struct stat *s, int f, struct FTW *w) {
  (void)s, (void)f, (void)w;
  return remove(p);
}

static char *make_tmpdir(void) {
  const char *base = getenv("TMPDIR");
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  xm_strbuf_printf(&b, "%s/xm-st-XXXXXX", base && *base ? base : "/tmp");
  char *dir = xm_strbuf_take(&b);
  assert_non_null(mkdtemp(dir));
  return dir;
}

/* A file image from header text and `data_len` data bytes (0x11 each). */
static unsigned char *image(const char *header, uint64_t declared_len, size_t data_len,
                            size_t *out_size) {
  size_t hl = strlen(header);
  *out_size = 8 + hl + data_len;
  unsigned char *b = malloc(*out_size);
  for (int i = 0; i < 8; i++)
    b[i] = (unsigned char)(declared_len >> (8 * i));
  memcpy(b + 8, header, hl);
  memset(b + 8 + hl, 0x11, data_len);
  return b;
}

static void test_exact_bytes(void **state) {
  (void)state;
  float fv[2] = {1.0f, -2.0f};
  int32_t iv = 7;
  xm_st_entry_t e[2] = {
      {.name = "b", .dtype = XM_ST_F32, .rank = 1, .dims = {2}, .data = fv},
      {.name = "a", .dtype = XM_ST_I32, .rank = 0, .data = &iv},
  };
  xm_diag_t d;
  xm_diag_init(&d);
  unsigned char *bytes = NULL;
  size_t size = 0;
  assert_int_equal(xm_st_serialize(e, 2, NULL, 0, &d, &bytes, &size), XM_OK);
  const char *want = "{\"__metadata__\":{\"format\":\"pt\"},"
                     "\"a\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[0,4]},"
                     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}";
  size_t wl = strlen(want), hl = (wl + 7) / 8 * 8;
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--)
    n = (n << 8) | bytes[i];
  assert_int_equal(n, hl);
  assert_int_equal(size, 8 + hl + 12);
  assert_memory_equal(bytes + 8, want, wl);
  for (size_t i = wl; i < hl; i++)
    assert_int_equal(bytes[8 + i], ' ');
  static const unsigned char data[12] = {7, 0, 0, 0, 0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0};
  assert_memory_equal(bytes + 8 + hl, data, 12);
  free(bytes);
  xm_diag_free(&d);
}

static void test_round_trip_disk(void **state) {
  (void)state;
  char *dir = make_tmpdir();
  char *path = NULL;
  xm_strbuf_t pb;
  xm_strbuf_init(&pb);
  xm_strbuf_printf(&pb, "%s/t.safetensors", dir);
  path = xm_strbuf_take(&pb);
  float w[6] = {0.5f, -0.0f, 3.25f, 1e-40f, -7.0f, 2.0f};
  int32_t ids[3] = {-1, 0, 2147483647};
  xm_st_entry_t e[3] = {
      {.name = "z.weight", .dtype = XM_ST_F32, .rank = 2, .dims = {2, 3}, .data = w},
      {.name = "empty", .dtype = XM_ST_F32, .rank = 2, .dims = {0, 3}, .data = w},
      {.name = "m.ids", .dtype = XM_ST_I32, .rank = 1, .dims = {3}, .data = ids},
  };
  xm_st_meta_t meta[1] = {{"note", "hello \"world\""}};
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(xm_st_write(path, e, 3, meta, 1, &d), XM_OK);
  xm_st_file_t f;
  xm_status_t s = xm_st_open(path, &d, &f);
  if (s) dump_diag(&d);
  assert_int_equal(s, XM_OK);
  assert_int_equal(f.num_tensors, 3);
  assert_string_equal(f.tensors[0].name, "empty");
  assert_string_equal(f.tensors[1].name, "m.ids");
  assert_string_equal(f.tensors[2].name, "z.weight");
  assert_int_equal(f.data_start % 8, 0);
  const xm_st_tensor_t *t = xm_st_find(&f, "z.weight");
  assert_non_null(t);
  assert_int_equal(t->dtype, XM_ST_F32);
  assert_int_equal(t->rank, 2);
  assert_int_equal(t->dims[1], 3);
  assert_memory_equal(t->data, w, sizeof w);
  t = xm_st_find(&f, "m.ids");
  assert_memory_equal(t->data, ids, sizeof ids);
  assert_int_equal(xm_st_find(&f, "empty")->end - xm_st_find(&f, "empty")->begin, 0);
  assert_null(xm_st_find(&f, "nope"));
  assert_string_equal(xm_st_meta_get(&f, "format"), "pt");
  assert_string_equal(xm_st_meta_get(&f, "note"), "hello \"world\"");
  xm_st_close(&f);
  assert_int_equal(xm_diag_error_count(&d), 0);
  nftw(dir, rm_cb, 8, FTW_DEPTH | FTW_PHYS);
  free(path);
  free(dir);
  xm_diag_free(&d);
}

static void test_writer_rejects(void **state) {
  (void)state;
  float v[2] = {0};
  xm_st_entry_t dup[2] = {
      {.name = "a", .dtype = XM_ST_F32, .rank = 1, .dims = {1}, .data = v},
      {.name = "a", .dtype = XM_ST_F32, .rank = 1, .dims = {1}, .data = v + 1},
  };
  xm_diag_t d;
  xm_diag_init(&d);
  unsigned char *b = NULL;
  size_t n = 0;
  assert_int_equal(xm_st_serialize(dup, 2, NULL, 0, &d, &b, &n), XM_ERR_INVALID_INPUT);
  assert_true(diag_has(&d, "duplicate tensor name"));
  xm_diag_free(&d);
  xm_diag_init(&d);
  xm_st_entry_t bad = {.name = "x", .dtype = XM_ST_F32, .rank = 1, .dims = {-2}, .data = v};
  assert_int_equal(xm_st_serialize(&bad, 1, NULL, 0, &d, &b, &n), XM_ERR_INVALID_INPUT);
  assert_true(diag_has(&d, "invalid dtype or shape"));
  xm_diag_free(&d);
}

typedef struct {
  const char *header;
  int64_t declared; /* -1: the header's own length */
  size_t data_len;
  const char *message;
  const char *place; /* NULL: not checked */
  int nul_at;        /* > 0: a raw NUL replaces this header byte */
} bad_case_t;

#define T(dt, shape, b, e)                                                                         \
  "{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":[" b "," e "]}"

static void test_malformed(void **state) {
  (void)state;
  const bad_case_t cases[] = {
      {"{}", (int64_t)1 << 40, 0, "exceeds the limit", "offset 0", 0},
      {"{}", 200, 10, "exceeds the 12 bytes after the length prefix", "offset 0", 0},
      {"[1]", -1, 0, "does not start with '{'", "offset 8", 0},
      {"{\"a\": }", -1, 0, "not valid JSON", "offset 14", 0},
      {"{}  x", -1, 0, "unexpected bytes after the JSON header", "offset 12", 0},
      {"{\"a\":" T("F33", "[1]", "0", "4") "}", -1, 4, "unknown or missing dtype \"F33\"", "a", 0},
      {"{\"a\":" T("F32", "[25]", "0", "100") "}", -1, 8, "out of range", "a", 0},
      {"{\"a\":" T("F32", "[3]", "0", "8") "}", -1, 8, "span 8", "a", 0},
      {"{\"a\":" T("F32", "[2]", "0", "8") ",\"b\":" T("F32", "[2]", "4", "12") "}", -1, 12,
       "overlaps tensor \"a\"", "b", 0},
      {"{\"a\":" T("F32", "[1]", "0", "4") ",\"b\":" T("F32", "[1]", "8", "12") "}", -1, 12,
       "leaving a gap", "b", 0},
      {"{\"a\":" T("F32", "[1]", "0", "4") "}", -1, 8, "the tensors cover 4", NULL, 0},
      {"{\"a\":" T("F32", "[1]", "0", "4") ",\"a\":" T("F32", "[1]", "4", "8") "}", -1, 8,
       "duplicate tensor name", "a", 0},
      {"{\"__metadata__\":{\"x\":1}}", -1, 0, "is not a string", "__metadata__", 0},
      {"{\"a\":" T("F32", "[-1]", "0", "0") "}", -1, 0, "shape[0]", "a", 0},
      {"{\"a\":" T("F32", "[1.5]", "0", "4") "}", -1, 4, "shape[0]", "a", 0},
      {"{\"a\":" T("F32", "[1]", "4", "0") "}", -1, 4, "out of range", "a", 0},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", -1, 4, "data_offsets must",
       "a", 0},
      {"{\"a\":7}", -1, 0, "not an object", "a", 0},
      {"{\"\xff\":1}", -1, 0, "UTF-8", "offset 10", 0},
      {"{\"a\":\"xx\"}", -1, 0, "UTF-8", "offset 14", 6},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const bad_case_t *c = &cases[i];
    size_t size;
    uint64_t declared = c->declared >= 0 ? (uint64_t)c->declared : strlen(c->header);
    unsigned char *b = image(c->header, declared, c->data_len, &size);
    if (c->nul_at > 0) b[8 + c->nul_at] = 0;
    xm_diag_t d;
    xm_diag_init(&d);
    xm_st_file_t f;
    xm_status_t s = xm_st_parse("bad.safetensors", b, size, &d, &f);
    if (s != XM_ERR_INVALID_INPUT || !diag_has(&d, c->message) ||
        (c->place && xm_diag_find(&d, c->place) < 0)) {
      fprintf(stderr, "case %zu (%s):\n", i, c->message);
      dump_diag(&d);
    }
    assert_int_equal(s, XM_ERR_INVALID_INPUT);
    assert_true(diag_has(&d, c->message));
    if (c->place) assert_true(xm_diag_find(&d, c->place) >= 0);
    assert_string_equal(d.entries[0].file, "bad.safetensors");
    assert_int_equal(f.num_tensors, 0); /* closed on failure */
    xm_st_close(&f);
    xm_diag_free(&d);
    free(b);
  }
}

static void test_short_and_missing_files(void **state) {
  (void)state;
  char *dir = make_tmpdir();
  xm_strbuf_t p;
  xm_strbuf_init(&p);
  xm_strbuf_printf(&p, "%s/empty.safetensors", dir);
  FILE *f = fopen(p.data, "wb");
  fclose(f);
  xm_diag_t d;
  xm_diag_init(&d);
  xm_st_file_t st;
  assert_int_equal(xm_st_open(p.data, &d, &st), XM_ERR_INVALID_INPUT);
  assert_true(diag_has(&d, "too short"));
  xm_st_close(&st);
  xm_strbuf_puts(&p, ".nope");
  assert_int_equal(xm_st_open(p.data, &d, &st), XM_ERR_IO);
  assert_true(diag_has(&d, "cannot open"));
  xm_diag_free(&d);
  xm_strbuf_free(&p);
  nftw(dir, rm_cb, 8, FTW_DEPTH | FTW_PHYS);
  free(dir);
}

/* Parses one mutated image: either a clean rejection with a message or a
 * file whose every tensor lies inside the image. */
static void parse_mutant(const unsigned char *b, size_t size) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_st_file_t f;
  xm_status_t s = xm_st_parse("m", b, size, &d, &f);
  if (s == XM_OK) {
    for (int i = 0; i < f.num_tensors; i++) {
      const xm_st_tensor_t *t = &f.tensors[i];
      assert_true(t->data >= b && t->data + (t->end - t->begin) <= b + size);
      uint64_t elems = 1;
      for (int k = 0; k < t->rank; k++)
        elems *= (uint64_t)t->dims[k];
      assert_int_equal(elems * (uint64_t)xm_st_dtype_size(t->dtype), t->end - t->begin);
    }
  } else {
    assert_int_equal(s, XM_ERR_INVALID_INPUT);
    assert_true(xm_diag_error_count(&d) > 0);
  }
  xm_st_close(&f);
  xm_diag_free(&d);
}

static void test_mutations_never_crash(void **state) {
  (void)state;
  float w[12];
  for (int i = 0; i < 12; i++)
    w[i] = (float)i * 0.5f;
  int32_t ids[2] = {1, 2};
  xm_st_entry_t e[3] = {
      {.name = "model.layers.0.mlp.experts.0.up_proj.weight",
       .dtype = XM_ST_F32,
       .rank = 2,
       .dims = {3, 4},
       .data = w},
      {.name = "ids", .dtype = XM_ST_I32, .rank = 1, .dims = {2}, .data = ids},
      {.name = "s", .dtype = XM_ST_F32, .rank = 0, .data = w},
  };
  xm_diag_t d;
  xm_diag_init(&d);
  unsigned char *good = NULL;
  size_t size = 0;
  assert_int_equal(xm_st_serialize(e, 3, NULL, 0, &d, &good, &size), XM_OK);
  parse_mutant(good, size);
  unsigned char *m = malloc(size);
  int rejected = 0;
  for (size_t n = 0; n < size; n++) { /* every truncation */
    memcpy(m, good, n);
    parse_mutant(m, n);
  }
  static const unsigned char masks[] = {0x01, 0x02, 0x10, 0x20, 0x80, 0xff};
  for (size_t i = 0; i < size; i++) {
    for (size_t k = 0; k < sizeof masks; k++) {
      memcpy(m, good, size);
      m[i] ^= masks[k];
      xm_diag_t dd;
      xm_diag_init(&dd);
      xm_st_file_t f;
      if (xm_st_parse("m", m, size, &dd, &f) != XM_OK) rejected++;
      xm_st_close(&f);
      xm_diag_free(&dd);
      parse_mutant(m, size);
    }
  }
  assert_true(rejected > 0);
  uint64_t rng = 0x9e3779b97f4a7c15ull;
  for (int it = 0; it < 4000; it++) {
    memcpy(m, good, size);
    int edits = 1 + (int)(rng % 4);
    for (int k = 0; k < edits; k++) {
      rng = rng * 6364136223846793005ull + 1442695040888963407ull;
      size_t at = (size_t)(rng >> 33) % size;
      static const char pool[] = "{}[]\",:0123456789-.eE \xff\x80";
      m[at] = (rng & 1) ? (unsigned char)pool[(rng >> 20) % (sizeof pool - 1)]
                        : (unsigned char)(rng >> 40);
    }
    parse_mutant(m, size - (size_t)((rng >> 50) % 3));
  }
  free(m);
  free(good);
  xm_diag_free(&d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exact_bytes),
      cmocka_unit_test(test_round_trip_disk),
      cmocka_unit_test(test_writer_rejects),
      cmocka_unit_test(test_malformed),
      cmocka_unit_test(test_short_and_missing_files),
      cmocka_unit_test(test_mutations_never_crash),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
