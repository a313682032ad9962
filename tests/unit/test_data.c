/* tests/unit/test_data.c — the data loaders (runtime/io/data.h): raw text,
 * token files (u16, u32), Megatron indexed datasets written here byte by
 * byte; exact window contents, the evaluation split, and every malformed
 * variant with its path and byte offset. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/io/data.h"
#include "support/strbuf.h"

static char *g_dir;

static int rm_cb(const char *p, const struct stat *s, int f, struct FTW *w) {
  (void)s, (void)f, (void)w;
  return remove(p);
}

static int setup_dir(void **state) {
  (void)state;
  const char *base = getenv("TMPDIR");
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  xm_strbuf_printf(&b, "%s/xm-data-XXXXXX", base && *base ? base : "/tmp");
  g_dir = xm_strbuf_take(&b);
  return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown_dir(void **state) {
  (void)state;
  nftw(g_dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
  free(g_dir);
  return 0;
}

/* A path in the test directory; static storage, 4 live at once. */
static const char *tpath(const char *name) {
  static char buf[4][500];
  static int k;
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
  return buf[k];
}

static void write_bytes(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  if (n) assert_int_equal(fwrite(data, 1, n, f), n);
  fclose(f);
}

/* Opens and expects failure with `status`, an error naming `file` and,
 * when place is not NULL, that place; the message must contain `needle`. */
static void expect_error(const char *path, int64_t vocab, int64_t S, xm_status_t status,
                         const char *file, const char *place, const char *needle) {
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_rt_data_t *d = (xm_rt_data_t *)1;
  xm_status_t st = xm_rt_data_open(path, vocab, S, 0.1, &diag, &d);
  if (st != status || diag.errors != 1) xm_diag_print(&diag, stderr);
  assert_int_equal(st, status);
  assert_null(d);
  assert_int_equal(diag.errors, 1);
  const xm_diag_entry_t *e = &diag.entries[0];
  assert_string_equal(e->file, file);
  if (place) {
    assert_non_null(e->place);
    assert_string_equal(e->place, place);
  }
  if (!strstr(e->message, needle)) fprintf(stderr, "message: %s\n", e->message);
  assert_non_null(strstr(e->message, needle));
  xm_diag_free(&diag);
}

static xm_rt_data_t *open_ok(const char *path, int64_t vocab, int64_t S, double frac,
                             xm_diag_t *diag) {
  xm_rt_data_t *d = NULL;
  xm_status_t st = xm_rt_data_open(path, vocab, S, frac, diag, &d);
  if (st != XM_OK) xm_diag_print(diag, stderr);
  assert_int_equal(st, XM_OK);
  assert_non_null(d);
  return d;
}

/* A window that must succeed. */
static void window_ok(xm_rt_data_t *d, int eval, int64_t j, int32_t *tok, int32_t *lab) {
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_status_t st = xm_rt_data_window(d, eval, j, tok, lab, &diag);
  if (st != XM_OK) xm_diag_print(&diag, stderr);
  assert_int_equal(st, XM_OK);
  xm_diag_free(&diag);
}

/* Window j of a split must be stream[g*S .. g*S+S] with g the global index. */
static void check_window(xm_rt_data_t *d, int eval, int64_t j, int64_t g, int64_t S,
                         const int32_t *stream) {
  int32_t tok[64], lab[64];
  assert_true(S <= 64);
  window_ok(d, eval, j, tok, lab);
  for (int64_t i = 0; i < S; i++) {
    assert_int_equal(tok[i], stream[g * S + i]);
    assert_int_equal(lab[i], stream[g * S + i + 1]);
  }
}

/* ---- raw text -------------------------------------------------------------- */

static void test_text(void **state) {
  (void)state;
  const char *text = "the quick brown fox jumps over the lazy dog"; /* 43 bytes */
  const char *path = tpath("corpus.txt");
  write_bytes(path, text, strlen(text));
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_rt_data_t *d = open_ok(path, 300, 4, 0.25, &diag);
  assert_int_equal(diag.count, 0);
  assert_int_equal(xm_rt_data_format(d), XM_RT_DATA_TEXT);
  assert_int_equal(xm_rt_data_num_tokens(d), 43);
  /* (43 - 1) / 4 = 10 windows; 25% -> 2 for evaluation */
  assert_int_equal(xm_rt_data_train_windows(d), 8);
  assert_int_equal(xm_rt_data_eval_windows(d), 2);
  int32_t stream[43];
  for (int i = 0; i < 43; i++)
    stream[i] = (unsigned char)text[i];
  for (int j = 0; j < 8; j++)
    check_window(d, 0, j, j, 4, stream);
  check_window(d, 1, 0, 8, 4, stream);
  check_window(d, 1, 1, 9, 4, stream);
  int32_t tok[4], lab[4];
  window_ok(d, 0, 1, tok, lab); /* "quic" -> "uick" */
  assert_int_equal(tok[0], 'q');
  assert_int_equal(lab[3], 'k');
  xm_rt_data_close(d);
  xm_diag_free(&diag);
}

static void test_text_small_vocab(void **state) {
  (void)state;
  const char *path = tpath("small.txt");
  write_bytes(path, "abcdefgh", 8);
  expect_error(path, 128, 2, XM_ERR_INVALID_INPUT, path, NULL, "byte-level");
}

static void test_missing_file(void **state) {
  (void)state;
  const char *path = tpath("does-not-exist.txt");
  expect_error(path, 300, 2, XM_ERR_IO, path, NULL, "cannot open");
}

static void test_too_few_tokens(void **state) {
  (void)state;
  const char *path = tpath("short.txt");
  write_bytes(path, "abcd", 4);
  expect_error(path, 256, 4, XM_ERR_INVALID_INPUT, path, "offset 4", "too few tokens");
  const char *empty = tpath("empty.txt");
  write_bytes(empty, "", 0);
  expect_error(empty, 256, 1, XM_ERR_INVALID_INPUT, empty, "offset 0", "too few tokens");
}

static void test_one_window_warns(void **state) {
  (void)state;
  const char *path = tpath("one.txt");
  write_bytes(path, "abcdef", 6); /* S=4: (6-1)/4 = 1 window */
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_rt_data_t *d = open_ok(path, 256, 4, 0.05, &diag);
  assert_int_equal(diag.errors, 0);
  assert_int_equal(diag.count, 1);
  assert_int_equal(diag.entries[0].level, XM_DIAG_WARNING);
  assert_non_null(strstr(diag.entries[0].message, "share"));
  assert_int_equal(xm_rt_data_train_windows(d), 1);
  assert_int_equal(xm_rt_data_eval_windows(d), 1);
  int32_t a[4], b[4], c[4], e[4];
  window_ok(d, 0, 0, a, b);
  window_ok(d, 1, 0, c, e);
  assert_memory_equal(a, c, sizeof a);
  assert_memory_equal(b, e, sizeof b);
  assert_int_equal(a[0], 'a');
  assert_int_equal(b[3], 'e');
  xm_rt_data_close(d);
  xm_diag_free(&diag);
}

/* ---- token files ------------------------------------------------------------- */

static void token_file_roundtrip(int bpt, uint32_t scale) {
  enum { N = 101 };
  uint32_t tokens[N];
  int32_t stream[N];
  for (int i = 0; i < N; i++) {
    tokens[i] = (uint32_t)(i * 7 % 50) * scale;
    stream[i] = (int32_t)tokens[i];
  }
  const char *path = tpath(bpt == 2 ? "t16.bin" : "t32.bin");
  xm_diag_t diag;
  xm_diag_init(&diag);
  assert_int_equal(xm_rt_data_write_tokens(path, tokens, N, bpt, &diag), XM_OK);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  assert_int_equal(ftell(f), 16 + N * bpt);
  fclose(f);
  int64_t vocab = 50 * (int64_t)scale;
  xm_rt_data_t *d = open_ok(path, vocab, 10, 0.2, &diag);
  assert_int_equal(xm_rt_data_format(d), XM_RT_DATA_TOKENS);
  assert_int_equal(xm_rt_data_num_tokens(d), N);
  assert_int_equal(xm_rt_data_train_windows(d), 8); /* 10 windows, 2 held out */
  assert_int_equal(xm_rt_data_eval_windows(d), 2);
  for (int j = 0; j < 8; j++)
    check_window(d, 0, j, j, 10, stream);
  for (int j = 0; j < 2; j++)
    check_window(d, 1, j, 8 + j, 10, stream);
  xm_rt_data_close(d);
  xm_diag_free(&diag);
}

static void test_token_file_u16(void **state) {
  (void)state;
  token_file_roundtrip(2, 1000); /* ids up to 49000: needs the full 16 bits */
}

static void test_token_file_u32(void **state) {
  (void)state;
  token_file_roundtrip(4, 3000); /* ids up to 147000: beyond 16 bits */
}

static void test_eval_split_sizes(void **state) {
  (void)state;
  enum { N = 41 }; /* S=4: 10 windows */
  uint32_t tokens[N];
  for (int i = 0; i < N; i++)
    tokens[i] = (uint32_t)i;
  const char *path = tpath("split.bin");
  xm_diag_t diag;
  xm_diag_init(&diag);
  assert_int_equal(xm_rt_data_write_tokens(path, tokens, N, 2, &diag), XM_OK);
  static const struct {
    double frac;
    int64_t train, eval;
  } cases[] = {{0.0, 9, 1}, {0.05, 9, 1}, {0.1, 9, 1}, {0.3, 7, 3}, {0.5, 5, 5}, {0.95, 1, 9}};
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    xm_rt_data_t *d = open_ok(path, 64, 4, cases[c].frac, &diag);
    assert_int_equal(xm_rt_data_train_windows(d), cases[c].train);
    assert_int_equal(xm_rt_data_eval_windows(d), cases[c].eval);
    int32_t tok[4], lab[4];
    window_ok(d, 1, 0, tok, lab); /* first eval window starts at train*S */
    assert_int_equal(tok[0], cases[c].train * 4);
    assert_int_equal(lab[3], cases[c].train * 4 + 4);
    xm_rt_data_close(d);
  }
  /* 2 windows: one each, no warning */
  xm_rt_data_t *d = open_ok(path, 64, 20, 0.05, &diag);
  assert_int_equal(xm_rt_data_train_windows(d), 1);
  assert_int_equal(xm_rt_data_eval_windows(d), 1);
  assert_int_equal(diag.count, 0);
  xm_rt_data_close(d);
  /* bad settings */
  assert_int_equal(xm_rt_data_open(path, 64, 4, 1.0, &diag, &d), XM_ERR_INVALID_INPUT);
  assert_int_equal(xm_rt_data_open(path, 64, 0, 0.1, &diag, &d), XM_ERR_INVALID_INPUT);
  xm_diag_free(&diag);
}

static void test_write_tokens_errors(void **state) {
  (void)state;
  uint32_t big[2] = {1, 70000};
  xm_diag_t diag;
  xm_diag_init(&diag);
  assert_int_equal(xm_rt_data_write_tokens(tpath("big.bin"), big, 2, 2, &diag),
                   XM_ERR_INVALID_INPUT);
  assert_int_equal(xm_rt_data_write_tokens(tpath("odd.bin"), big, 2, 3, &diag),
                   XM_ERR_INVALID_INPUT);
  assert_int_equal(xm_rt_data_write_tokens(tpath("no/such/dir.bin"), big, 2, 4, &diag), XM_ERR_IO);
  assert_int_equal(diag.errors, 3);
  xm_diag_free(&diag);
}

/* Header bytes of a token file with the given fields. */
static void token_header(unsigned char *h, uint32_t version, uint32_t bpt) {
  memcpy(h, "XMTOKENS", 8);
  memcpy(h + 8, &version, 4);
  memcpy(h + 12, &bpt, 4);
}

static void test_token_file_malformed(void **state) {
  (void)state;
  unsigned char buf[64];
  const char *p = tpath("bad.bin");
  /* truncated header: magic and 2 more bytes */
  memcpy(buf, "XMTOKENS\x01\x00", 10);
  write_bytes(p, buf, 10);
  expect_error(p, 100, 2, XM_ERR_INVALID_INPUT, p, "offset 10", "truncated header");
  /* version */
  token_header(buf, 2, 2);
  memset(buf + 16, 0, 20);
  write_bytes(p, buf, 36);
  expect_error(p, 100, 2, XM_ERR_INVALID_INPUT, p, "offset 8", "version 2");
  /* bytes per token */
  token_header(buf, 1, 3);
  write_bytes(p, buf, 36);
  expect_error(p, 100, 2, XM_ERR_INVALID_INPUT, p, "offset 12", "bytes per token");
  /* a partial token at the end: 16 + 2*10 + 1 bytes */
  token_header(buf, 1, 2);
  write_bytes(p, buf, 37);
  expect_error(p, 100, 2, XM_ERR_INVALID_INPUT, p, "offset 36", "ends inside a token");
  /* token >= vocab: the 6th token (offset 16 + 5*4) */
  uint32_t toks[10] = {1, 2, 3, 4, 5, 100, 7, 500, 9, 10};
  xm_diag_t diag;
  xm_diag_init(&diag);
  assert_int_equal(xm_rt_data_write_tokens(p, toks, 10, 4, &diag), XM_OK);
  xm_diag_free(&diag);
  expect_error(p, 100, 2, XM_ERR_INVALID_INPUT, p, "offset 36", "token id 100");
  /* bad magic: not a token file, and not text either (the version's 0x01
   * at offset 8 is a control character) */
  const char *t = tpath("bad.txt");
  memcpy(buf, "XMTOKENZ", 8);
  write_bytes(t, buf, 36);
  expect_error(t, 100, 2, XM_ERR_INVALID_INPUT, t, "offset 8", "not text");
  /* the same named .bin: a Megatron .bin without its .idx */
  write_bytes(p, buf, 36);
  expect_error(p, 100, 2, XM_ERR_INVALID_INPUT, p, NULL, "without its .idx");
  /* text, with a vocabulary too small for bytes: that is the error, which
   * names no offset */
  write_bytes(t, "plain text, 32 bytes of it......", 32);
  expect_error(t, 100, 2, XM_ERR_INVALID_INPUT, t, NULL, "byte-level");
}

/* A file that changes after opening: the next window fails with a message
 * (size or time changed), and ids rewritten in place with the time put
 * back are caught by the window's own check; nothing out of range is ever
 * copied. */
static void test_window_after_change(void **state) {
  (void)state;
  const char *p = tpath("live.tok");
  uint32_t toks[40];
  for (int i = 0; i < 40; i++)
    toks[i] = (uint32_t)(i % 7);
  xm_diag_t diag;
  xm_diag_init(&diag);
  assert_int_equal(xm_rt_data_write_tokens(p, toks, 40, 2, &diag), XM_OK);
  xm_rt_data_t *d = open_ok(p, 100, 4, 0.1, &diag);
  int32_t tok[4], lab[4];
  window_ok(d, 0, 0, tok, lab);
  /* ids 0xffff in place, size and modification time kept */
  struct stat st;
  assert_int_equal(stat(p, &st), 0);
  FILE *f = fopen(p, "r+b");
  assert_non_null(f);
  assert_int_equal(fseek(f, 16, SEEK_SET), 0);
  unsigned char ff[80];
  memset(ff, 0xff, sizeof ff);
  assert_int_equal(fwrite(ff, 1, sizeof ff, f), sizeof ff);
  fclose(f);
  struct timespec times[2] = {st.st_atim, st.st_mtim};
  assert_int_equal(utimensat(AT_FDCWD, p, times, 0), 0);
  memset(tok, 0, sizeof tok);
  assert_int_equal(xm_rt_data_window(d, 0, 1, tok, lab, &diag), XM_ERR_IO);
  assert_int_equal(diag.errors, 1);
  assert_non_null(strstr(diag.entries[0].message, "outside the vocabulary"));
  assert_string_equal(diag.entries[0].place, "offset 24"); /* token 4: window 1 starts there */
  for (int i = 0; i < 4; i++)
    assert_true(tok[i] >= 0 && tok[i] < 100);
  xm_diag_free(&diag);
  /* one byte more: the size differs */
  f = fopen(p, "ab");
  assert_non_null(f);
  fputc(0, f);
  fclose(f);
  xm_diag_init(&diag);
  assert_int_equal(xm_rt_data_window(d, 0, 0, tok, lab, &diag), XM_ERR_IO);
  assert_int_equal(diag.errors, 1);
  assert_string_equal(diag.entries[0].file, p);
  assert_non_null(strstr(diag.entries[0].message, "changed while the program was reading it"));
  xm_diag_free(&diag);
  xm_rt_data_close(d);
}

/* ---- Megatron indexed datasets -------------------------------------------------- */

/* The reference pair: uint16 tokens, sequences of 5, 0 and 7 tokens; the
 * third starts 4 bytes after the first ends (a gap holding 0xffff, which
 * is outside every vocabulary and must never be read). */
enum { MG_NS = 3, MG_ND = 3, MG_IDX_LEN = 34 + 12 * MG_NS + 8 * MG_ND, MG_BIN_LEN = 28 };
static const int32_t k_mg_sizes[MG_NS] = {5, 0, 7};
static const int64_t k_mg_ptrs[MG_NS] = {0, 10, 14};
static const int64_t k_mg_docs[MG_ND] = {0, 1, 3};
static const int32_t k_mg_stream[12] = {11, 12, 13, 14, 15, 21, 22, 23, 24, 25, 26, 27};
enum { MG_SIZES_OFF = 34, MG_PTRS_OFF = 34 + 4 * MG_NS, MG_DOCS_OFF = MG_PTRS_OFF + 8 * MG_NS };

static void mg_idx(unsigned char *b, uint8_t dtype) {
  uint64_t version = 1, ns = MG_NS, nd = MG_ND;
  memcpy(b, "MMIDIDX\0\0", 9);
  memcpy(b + 9, &version, 8);
  b[17] = dtype;
  memcpy(b + 18, &ns, 8);
  memcpy(b + 26, &nd, 8);
  memcpy(b + MG_SIZES_OFF, k_mg_sizes, sizeof k_mg_sizes);
  memcpy(b + MG_PTRS_OFF, k_mg_ptrs, sizeof k_mg_ptrs);
  memcpy(b + MG_DOCS_OFF, k_mg_docs, sizeof k_mg_docs);
}

static void mg_bin(unsigned char *b) {
  uint16_t v[MG_BIN_LEN / 2];
  for (int i = 0; i < 5; i++)
    v[i] = (uint16_t)k_mg_stream[i];
  v[5] = v[6] = 0xffff; /* the gap */
  for (int i = 0; i < 7; i++)
    v[7 + i] = (uint16_t)k_mg_stream[5 + i];
  memcpy(b, v, sizeof v);
}

/* Writes prefix.idx (idx_len bytes of idx) and, when bin, prefix.bin. */
static void mg_write(const char prefix[512], const unsigned char *idx, size_t idx_len,
                     const unsigned char *bin, size_t bin_len) {
  char path[600];
  snprintf(path, sizeof path, "%s.idx", prefix);
  write_bytes(path, idx, idx_len);
  snprintf(path, sizeof path, "%s.bin", prefix);
  if (bin)
    write_bytes(path, bin, bin_len);
  else
    unlink(path);
}

static void test_megatron(void **state) {
  (void)state;
  unsigned char idx[MG_IDX_LEN], bin[MG_BIN_LEN];
  mg_idx(idx, 8);
  mg_bin(bin);
  char prefix[512], with_bin[600], with_idx[600];
  snprintf(prefix, sizeof prefix, "%s", tpath("mg"));
  snprintf(with_bin, sizeof with_bin, "%s.bin", prefix);
  snprintf(with_idx, sizeof with_idx, "%s.idx", prefix);
  mg_write(prefix, idx, sizeof idx, bin, sizeof bin);
  const char *names[3] = {prefix, with_bin, with_idx};
  for (int n = 0; n < 3; n++) {
    xm_diag_t diag;
    xm_diag_init(&diag);
    xm_rt_data_t *d = open_ok(names[n], 28, 3, 0.3, &diag);
    assert_int_equal(xm_rt_data_format(d), XM_RT_DATA_MEGATRON);
    assert_int_equal(xm_rt_data_num_tokens(d), 12);
    assert_int_equal(xm_rt_data_train_windows(d), 2); /* (12-1)/3 = 3 windows */
    assert_int_equal(xm_rt_data_eval_windows(d), 1);
    check_window(d, 0, 0, 0, 3, k_mg_stream);
    check_window(d, 0, 1, 1, 3, k_mg_stream); /* crosses the empty sequence and the gap */
    check_window(d, 1, 0, 2, 3, k_mg_stream);
    xm_rt_data_close(d);
    xm_diag_free(&diag);
  }
  /* the gap would be read if windows followed bytes instead of pointers:
   * a vocabulary of 28 would then reject 0xffff at open already */
}

static void test_megatron_int32_contiguous(void **state) {
  (void)state;
  enum { NS = 2, LEN = 34 + 12 * NS + 8 * 3 };
  unsigned char idx[LEN];
  uint64_t version = 1, ns = NS, nd = 3;
  int32_t sizes[NS] = {4, 6};
  int64_t ptrs[NS] = {0, 16}, docs[3] = {0, 1, 2};
  memcpy(idx, "MMIDIDX\0\0", 9);
  memcpy(idx + 9, &version, 8);
  idx[17] = 4; /* int32 */
  memcpy(idx + 18, &ns, 8);
  memcpy(idx + 26, &nd, 8);
  memcpy(idx + 34, sizes, sizeof sizes);
  memcpy(idx + 34 + 4 * NS, ptrs, sizeof ptrs);
  memcpy(idx + 34 + 12 * NS, docs, sizeof docs);
  int32_t toks[10] = {100000, 1, 2, 3, 4, 5, 6, 7, 8, 99999};
  char prefix[512];
  snprintf(prefix, sizeof prefix, "%s", tpath("mg32"));
  mg_write(prefix, idx, sizeof idx, (const unsigned char *)toks, sizeof toks);
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_rt_data_t *d = open_ok(prefix, 100001, 4, 0.05, &diag);
  assert_int_equal(xm_rt_data_num_tokens(d), 10);
  assert_int_equal(xm_rt_data_train_windows(d), 1);
  assert_int_equal(xm_rt_data_eval_windows(d), 1);
  check_window(d, 0, 0, 0, 4, toks);
  check_window(d, 1, 0, 1, 4, toks);
  xm_rt_data_close(d);
  xm_diag_free(&diag);
  /* vocab 100000: the first token is out of range, at .bin offset 0 */
  char bin[600];
  snprintf(bin, sizeof bin, "%s.bin", prefix);
  expect_error(prefix, 100000, 4, XM_ERR_INVALID_INPUT, bin, "offset 0", "token id 100000");
}

/* One corrupted variant of the reference pair: mutate, write, expect. */
typedef struct {
  const char *what;
  size_t idx_len; /* bytes of the index written */
  int at;         /* byte to overwrite (-1: none) */
  const void *bytes;
  size_t n;
  int bin;       /* write the .bin */
  int bin_token; /* index of a bin u16 to set to 28 (-1: none) */
  xm_status_t status;
  int in_bin; /* the error names the .bin */
  const char *place;
  const char *needle;
} mg_case_t;

static void test_megatron_malformed(void **state) {
  (void)state;
  static const uint64_t v2 = 2, huge = 1ull << 60;
  static const uint8_t f32 = 7, code9 = 9;
  static const int32_t neg = -1;
  static const int64_t far = 1000, overlap = 4, doc_back = 0;
  const mg_case_t cases[] = {
      {"bad magic", MG_IDX_LEN, 3, "X", 1, 1, -1, XM_ERR_INVALID_INPUT, 0, "offset 0", "bad magic"},
      {"short magic", 5, -1, NULL, 0, 1, -1, XM_ERR_INVALID_INPUT, 0, "offset 0", "bad magic"},
      {"truncated header", 20, -1, NULL, 0, 1, -1, XM_ERR_INVALID_INPUT, 0, "offset 20",
       "truncated header"},
      {"version", MG_IDX_LEN, 9, &v2, 8, 1, -1, XM_ERR_INVALID_INPUT, 0, "offset 9", "version 2"},
      {"float dtype", MG_IDX_LEN, 17, &f32, 1, 1, -1, XM_ERR_INVALID_INPUT, 0, "offset 17",
       "floating-point"},
      {"unknown dtype", MG_IDX_LEN, 17, &code9, 1, 1, -1, XM_ERR_INVALID_INPUT, 0, "offset 17",
       "unknown dtype"},
      {"truncated arrays", MG_IDX_LEN - 8, -1, NULL, 0, 1, -1, XM_ERR_INVALID_INPUT, 0, "offset 86",
       "truncated index"},
      {"huge count", MG_IDX_LEN, 18, &huge, 8, 1, -1, XM_ERR_INVALID_INPUT, 0, "offset 94",
       "truncated index"},
      {"negative size", MG_IDX_LEN, MG_SIZES_OFF, &neg, 4, 1, -1, XM_ERR_INVALID_INPUT, 0,
       "offset 34", "negative size"},
      {"pointer out of range", MG_IDX_LEN, MG_PTRS_OFF + 16, &far, 8, 1, -1, XM_ERR_INVALID_INPUT,
       0, "offset 62", "outside"},
      {"pointers overlap", MG_IDX_LEN, MG_PTRS_OFF + 16, &overlap, 8, 1, -1, XM_ERR_INVALID_INPUT,
       0, "offset 62", "overlaps"},
      {"document index", MG_IDX_LEN, MG_DOCS_OFF + 16, &doc_back, 8, 1, -1, XM_ERR_INVALID_INPUT, 0,
       "offset 86", "non-decreasing"},
      {"token >= vocab", MG_IDX_LEN, -1, NULL, 0, 1, 8, XM_ERR_INVALID_INPUT, 1, "offset 16",
       "token id 28"},
      {"missing bin", MG_IDX_LEN, -1, NULL, 0, 0, -1, XM_ERR_IO, 1, NULL, "cannot open"},
  };
  char prefix[512], idx_path[600], bin_path[600];
  snprintf(prefix, sizeof prefix, "%s", tpath("mgbad"));
  snprintf(idx_path, sizeof idx_path, "%s.idx", prefix);
  snprintf(bin_path, sizeof bin_path, "%s.bin", prefix);
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    const mg_case_t *k = &cases[c];
    unsigned char idx[MG_IDX_LEN + 8] = {0}, bin[MG_BIN_LEN];
    mg_idx(idx, 8);
    mg_bin(bin);
    if (k->at >= 0) memcpy(idx + k->at, k->bytes, k->n);
    if (k->bin_token >= 0) {
      uint16_t v = 28;
      memcpy(bin + 2 * k->bin_token, &v, 2);
    }
    mg_write(prefix, idx, k->idx_len, k->bin ? bin : NULL, sizeof bin);
    fprintf(stderr, "case: %s\n", k->what);
    expect_error(idx_path, 28, 3, k->status, k->in_bin ? bin_path : idx_path, k->place, k->needle);
  }
  /* trailing bytes after the document index */
  unsigned char idx[MG_IDX_LEN + 3] = {0}, bin[MG_BIN_LEN];
  mg_idx(idx, 8);
  mg_bin(bin);
  mg_write(prefix, idx, sizeof idx, bin, sizeof bin);
  expect_error(prefix, 28, 3, XM_ERR_INVALID_INPUT, idx_path, "offset 94", "trailing bytes");
  /* too few tokens for one window of 12 */
  mg_write(prefix, idx, MG_IDX_LEN, bin, sizeof bin);
  expect_error(prefix, 28, 12, XM_ERR_INVALID_INPUT, bin_path, "offset 28", "too few tokens");
  /* an .idx that does not exist */
  const char *none = tpath("none.idx");
  expect_error(none, 28, 3, XM_ERR_IO, none, NULL, "cannot open");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_text),
      cmocka_unit_test(test_text_small_vocab),
      cmocka_unit_test(test_missing_file),
      cmocka_unit_test(test_too_few_tokens),
      cmocka_unit_test(test_one_window_warns),
      cmocka_unit_test(test_token_file_u16),
      cmocka_unit_test(test_token_file_u32),
      cmocka_unit_test(test_eval_split_sizes),
      cmocka_unit_test(test_write_tokens_errors),
      cmocka_unit_test(test_token_file_malformed),
      cmocka_unit_test(test_window_after_change),
      cmocka_unit_test(test_megatron),
      cmocka_unit_test(test_megatron_int32_contiguous),
      cmocka_unit_test(test_megatron_malformed),
  };
  return cmocka_run_group_tests(tests, setup_dir, teardown_dir);
}
