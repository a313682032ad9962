/* runtime/io/data.c — token streams from text, token files and Megatron
 * indexed datasets (runtime/io/data.h).
 *
 * Files are memory-mapped, never read whole: a corpus may be far larger
 * than memory and only the windows in use need to be resident. Whatever the
 * format, a data set is one logical stream of tokens with an accessor for
 * the token at stream index k; token files and text are flat arrays, a
 * Megatron data set is a list of sequences at arbitrary byte offsets of the
 * .bin, found by binary search over the prefix sums of their sizes.
 *
 * Everything is validated when opening: the file's kind (a regular file,
 * opened without blocking, so a FIFO is refused rather than waited on),
 * headers, index sizes against file lengths, pointers in range and in
 * order, every token id against the vocabulary, and for raw text that it
 * is text (valid UTF-8 without control characters other than tab, line
 * and page breaks; a compressed file or a Megatron .bin without its .idx
 * is named as such). Messages carry the path and the byte offset of the
 * offending field ("corpus.idx: error: offset 34: ..."), and the first
 * problem of a file is reported (later fields are usually meaningless once
 * one is wrong).
 *
 * A file may still change under the program. Each window checks first
 * that no mapped file changed size or modification time since it was
 * opened, and checks every id it copies against the vocabulary (the ids
 * the embedding gets are those of this copy), so a rewritten file ends the
 * run with a message, never with out-of-range ids. A file truncated while
 * a window reads it raises SIGBUS on the mapping; a handler installed with
 * the first mapping recognises the address as one of ours and ends the
 * process with a message naming the file and exit code 1 (any other
 * SIGBUS gets the default action).
 */
#include "runtime/io/data.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "support/strbuf.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the data loader reads little-endian files with native loads"
#endif

/* Element kinds of a token array. */
typedef enum { EL_U8, EL_I8, EL_U16, EL_I16, EL_U32, EL_I32, EL_I64 } elem_kind_t;

typedef struct {
  unsigned char *ptr; /* NULL for an empty file */
  size_t len;
  int fd;                   /* kept open to see whether the file changes; -1 for none */
  struct timespec mtime;    /* at opening */
  int guard;                /* the SIGBUS guard's slot, -1 for none */
} mapping_t;

struct xm_rt_data {
  xm_rt_data_format_t format;
  char *path; /* the token array's file (text, token file or .bin) */
  int64_t vocab, seq_len;
  mapping_t main, idx;
  const unsigned char *tokens; /* first token byte (flat formats) */
  elem_kind_t kind;
  int elsize;
  /* Megatron: sequence s holds stream tokens [cum[s], cum[s+1]) and starts
   * at byte ptrs[s] of the .bin. */
  int64_t num_seqs;
  int64_t *cum;
  const int64_t *ptrs; /* borrowed from the index mapping (unaligned-safe copy) */
  int64_t *ptrs_owned;
  int64_t num_tokens, windows, train_windows, eval_windows;
};

static const char k_tokens_magic[8] = {'X', 'M', 'T', 'O', 'K', 'E', 'N', 'S'};
static const char k_idx_magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
enum { TOKENS_HEADER = 16, IDX_HEADER = 9 + 8 + 1 + 8 + 8 };

/* ---- small helpers ------------------------------------------------------ */

static void err_at(xm_diag_t *diag, const char *path, int64_t offset, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void err_at(xm_diag_t *diag, const char *path, int64_t offset, const char *fmt, ...) {
  char place[48];
  snprintf(place, sizeof place, "offset %" PRId64, offset);
  va_list ap;
  va_start(ap, fmt);
  xm_diag_addv(diag, XM_DIAG_ERROR, path, offset >= 0 ? place : NULL, fmt, ap);
  va_end(ap);
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

static char *concat(const char *a, const char *b) {
  size_t n = strlen(a), m = strlen(b);
  char *s = malloc(n + m + 1);
  if (!s) return NULL;
  memcpy(s, a, n);
  memcpy(s + n, b, m + 1);
  return s;
}

static int is_regular_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* ---- the SIGBUS guard of the mappings ------------------------------------ */

enum { GUARDS = 16 };
static struct {
  const unsigned char *volatile lo, *volatile hi;
  char msg[600];
  size_t len;
} g_guard[GUARDS];
static int g_guard_installed;

static void on_sigbus(int sig, siginfo_t *si, void *ctx) {
  (void)ctx;
  /* Only a fault the kernel raised carries an address (si_code > 0); a
   * SIGBUS sent by kill or raise is never ours. */
  const unsigned char *a = si && si->si_code > 0 ? (const unsigned char *)si->si_addr : NULL;
  for (int i = 0; a && i < GUARDS; i++)
    if (g_guard[i].lo && a >= g_guard[i].lo && a < g_guard[i].hi) {
      ssize_t w = write(2, g_guard[i].msg, g_guard[i].len);
      (void)w;
      _exit(1);
    }
  signal(sig, SIG_DFL); /* not ours: the default action */
  raise(sig);
}

static int guard_add(const unsigned char *p, size_t len, const char *path) {
  if (!g_guard_installed) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, NULL) != 0) return -1;
    g_guard_installed = 1;
  }
  for (int i = 0; i < GUARDS; i++)
    if (!g_guard[i].lo) {
      int n = snprintf(g_guard[i].msg, sizeof g_guard[i].msg,
                       "error: %s: the data file shrank while the program was reading it (it "
                       "must not change during training)\n",
                       path);
      g_guard[i].len = n < 0 ? 0 : (size_t)n < sizeof g_guard[i].msg ? (size_t)n
                                                                       : sizeof g_guard[i].msg - 1;
      g_guard[i].hi = p + len;
      g_guard[i].lo = p;
      return i;
    }
  return -1; /* more mappings than slots: such a one gets the default action */
}

static void guard_remove(int i) {
  if (i < 0) return;
  g_guard[i].lo = NULL;
  g_guard[i].hi = NULL;
}

static xm_status_t map_file(const char *path, xm_diag_t *diag, mapping_t *out) {
  out->ptr = NULL;
  out->len = 0;
  out->fd = -1;
  out->guard = -1;
  int fd;
  size_t size = 0;
  struct timespec mtime;
  int err = xm_open_regular(path, SIZE_MAX, &fd, &size, &mtime);
  if (err) {
    char why[200];
    xm_diag_add(diag, XM_DIAG_ERROR, path, NULL, "%s",
                xm_open_error(err, SIZE_MAX, "data file", why, sizeof why));
    return XM_ERR_IO;
  }
  if (size > 0) {
    void *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      xm_diag_add(diag, XM_DIAG_ERROR, path, NULL, "cannot map: %s", strerror(errno));
      close(fd);
      return XM_ERR_IO;
    }
    out->ptr = p;
    out->len = size;
    out->guard = guard_add(out->ptr, out->len, path);
  }
  out->fd = fd;
  out->mtime = mtime;
  return XM_OK;
}

static void unmap(mapping_t *m) {
  guard_remove(m->guard);
  if (m->ptr) munmap(m->ptr, m->len);
  if (m->fd >= 0) close(m->fd);
  m->ptr = NULL;
  m->len = 0;
  m->fd = -1;
  m->guard = -1;
}

/* Whether the file of a mapping is as it was when it was opened. */
static bool unchanged(const mapping_t *m) {
  if (m->fd < 0) return true;
  struct stat st;
  return fstat(m->fd, &st) == 0 && (size_t)st.st_size == m->len &&
         st.st_mtim.tv_sec == m->mtime.tv_sec && st.st_mtim.tv_nsec == m->mtime.tv_nsec;
}

static int elem_size(elem_kind_t k) {
  switch (k) {
  case EL_U8:
  case EL_I8: return 1;
  case EL_U16:
  case EL_I16: return 2;
  case EL_U32:
  case EL_I32: return 4;
  case EL_I64: return 8;
  }
  return 1;
}

static int64_t read_elem(const unsigned char *p, elem_kind_t k) {
  switch (k) {
  case EL_U8: return p[0];
  case EL_I8: return (int8_t)p[0];
  case EL_U16: {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
  }
  case EL_I16: {
    int16_t v;
    memcpy(&v, p, 2);
    return v;
  }
  case EL_U32: {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
  }
  case EL_I32: {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
  }
  case EL_I64: {
    int64_t v;
    memcpy(&v, p, 8);
    return v;
  }
  }
  return 0;
}

static uint64_t read_u64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

static uint32_t read_u32(const unsigned char *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

/* Checks n tokens at p (file offset `base_off`) against the vocabulary;
 * reports the first bad one. Sequential on purpose: the offset reported
 * must be the first in the file, and the scan runs at memory speed. */
static xm_status_t check_tokens(const char *path, const unsigned char *p, int64_t n,
                                elem_kind_t kind, int64_t vocab, int64_t base_off,
                                xm_diag_t *diag) {
  int es = elem_size(kind);
  for (int64_t i = 0; i < n; i++) {
    int64_t v = read_elem(p + i * es, kind);
    if (v < 0 || v >= vocab) {
      err_at(diag, path, base_off + i * es,
             "token id %" PRId64 " is outside the vocabulary [0, %" PRId64 ")", v, vocab);
      return XM_ERR_INVALID_INPUT;
    }
  }
  return XM_OK;
}

/* ---- the three formats -------------------------------------------------- */

/* What a file that is not text most likely is, from its first bytes; NULL
 * when nothing is recognised. */
static const char *binary_kind(const unsigned char *p, size_t n) {
  static const struct {
    const char *magic;
    size_t len;
    const char *what;
  } k[] = {
      {"\x1f\x8b", 2, "a gzip file (decompress it first)"},
      {"\x28\xb5\x2f\xfd", 4, "a zstd file (decompress it first)"},
      {"\xfd" "7zXZ\x00", 6, "an xz file (decompress it first)"},
      {"BZh", 3, "a bzip2 file (decompress it first)"},
      {"PK\x03\x04", 4, "a zip archive (extract it first)"},
      {"7z\xbc\xaf\x27\x1c", 6, "a 7z archive (extract it first)"},
      {"\x93NUMPY", 6, "a NumPy array (write it as an XMTOKENS token file, docs/train.md)"},
      {"PAR1", 4, "a Parquet file (tokenize it into a token file or Megatron dataset)"},
      {"\x89HDF", 4, "an HDF5 file (tokenize it into a token file or Megatron dataset)"},
  };
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
    if (n >= k[i].len && memcmp(p, k[i].magic, k[i].len) == 0) return k[i].what;
  return NULL;
}

/* The offset of the first byte that keeps p[0..n) from being text (valid
 * UTF-8, no control characters but tab, line feed, vertical tab, form feed
 * and carriage return), or -1 when it is text. */
static int64_t not_text_at(const unsigned char *p, size_t n) {
  return (int64_t)xm_utf8_bad_at((const char *)p, n, "\t\n\v\f\r");
}

static xm_status_t open_text(xm_rt_data_t *d, xm_diag_t *diag) {
  const char *kind = binary_kind(d->main.ptr, d->main.len);
  if (kind) {
    xm_diag_add(diag, XM_DIAG_ERROR, d->path, NULL,
                "not a data file xmoec reads: this is %s; the formats are raw text, a token "
                "file and a Megatron dataset (docs/train.md)",
                kind);
    return XM_ERR_INVALID_INPUT;
  }
  if (ends_with(d->path, ".bin")) {
    xm_diag_add(diag, XM_DIAG_ERROR, d->path, NULL,
                "a .bin without its .idx beside it: a Megatron dataset needs both (PATH.bin and "
                "PATH.idx); raw text must not be named .bin");
    return XM_ERR_INVALID_INPUT;
  }
  int64_t bad = not_text_at(d->main.ptr, d->main.len);
  if (bad >= 0) {
    err_at(diag, d->path, bad,
           "not text (byte 0x%02x is not valid UTF-8 text): raw text data must be UTF-8 without "
           "control characters; binary data goes in a token file or a Megatron dataset "
           "(docs/train.md)",
           d->main.ptr[bad]);
    return XM_ERR_INVALID_INPUT;
  }
  if (d->vocab < 256) {
    xm_diag_add(diag, XM_DIAG_ERROR, d->path, NULL,
                "raw text uses the byte-level tokenizer (256 ids) but the model's vocabulary "
                "is %" PRId64,
                d->vocab);
    return XM_ERR_INVALID_INPUT;
  }
  d->format = XM_RT_DATA_TEXT;
  d->kind = EL_U8;
  d->tokens = d->main.ptr;
  d->num_tokens = (int64_t)d->main.len;
  return XM_OK;
}

static xm_status_t open_token_file(xm_rt_data_t *d, xm_diag_t *diag) {
  const unsigned char *p = d->main.ptr;
  size_t len = d->main.len;
  d->format = XM_RT_DATA_TOKENS;
  if (len < TOKENS_HEADER) {
    err_at(diag, d->path, (int64_t)len, "truncated header: a token file starts with 16 bytes");
    return XM_ERR_INVALID_INPUT;
  }
  uint32_t version = read_u32(p + 8), bpt = read_u32(p + 12);
  if (version != 1) {
    err_at(diag, d->path, 8,
           "unsupported token file version %u (this xmoec reads version 1, docs/train.md)",
           version);
    return XM_ERR_INVALID_INPUT;
  }
  if (bpt != 2 && bpt != 4) {
    err_at(diag, d->path, 12, "bytes per token is %u (expected 2 or 4)", bpt);
    return XM_ERR_INVALID_INPUT;
  }
  if ((len - TOKENS_HEADER) % bpt != 0) {
    err_at(diag, d->path, (int64_t)(len - (len - TOKENS_HEADER) % bpt),
           "file ends inside a token (%u bytes per token)", bpt);
    return XM_ERR_INVALID_INPUT;
  }
  d->kind = bpt == 2 ? EL_U16 : EL_U32;
  d->tokens = p + TOKENS_HEADER;
  d->num_tokens = (int64_t)((len - TOKENS_HEADER) / bpt);
  return check_tokens(d->path, d->tokens, d->num_tokens, d->kind, d->vocab, TOKENS_HEADER, diag);
}

static xm_status_t megatron_dtype(const char *idx_path, int code, elem_kind_t *out,
                                  xm_diag_t *diag) {
  switch (code) {
  case 1: *out = EL_U8; return XM_OK;
  case 2: *out = EL_I8; return XM_OK;
  case 3: *out = EL_I16; return XM_OK;
  case 4: *out = EL_I32; return XM_OK;
  case 5: *out = EL_I64; return XM_OK;
  case 8: *out = EL_U16; return XM_OK;
  case 6:
  case 7:
    err_at(diag, idx_path, 17, "dtype code %d is a floating-point type; token ids must be integers",
           code);
    return XM_ERR_INVALID_INPUT;
  default:
    err_at(diag, idx_path, 17, "unknown dtype code %d (Megatron codes are 1-8)", code);
    return XM_ERR_INVALID_INPUT;
  }
}

/* Header of the .idx: magic, version, dtype, counts; checks that the file
 * is exactly as long as the arrays the counts announce. */
static xm_status_t megatron_header(const char *idx_path, const mapping_t *m, elem_kind_t *kind,
                                   int64_t *num_seqs, int64_t *num_docs, xm_diag_t *diag) {
  const unsigned char *p = m->ptr;
  if (m->len < sizeof k_idx_magic || memcmp(p, k_idx_magic, sizeof k_idx_magic) != 0) {
    err_at(diag, idx_path, 0, "bad magic: not a Megatron index (expected \"MMIDIDX\\0\\0\")");
    return XM_ERR_INVALID_INPUT;
  }
  if (m->len < IDX_HEADER) {
    err_at(diag, idx_path, (int64_t)m->len, "truncated header: the index header is %d bytes",
           IDX_HEADER);
    return XM_ERR_INVALID_INPUT;
  }
  uint64_t version = read_u64(p + 9);
  if (version != 1) {
    err_at(diag, idx_path, 9,
           "unsupported index version %" PRIu64
           " (Megatron's indexed datasets are version 1, the only one this xmoec reads)",
           version);
    return XM_ERR_INVALID_INPUT;
  }
  XM_RETURN_IF_ERROR(megatron_dtype(idx_path, p[17], kind, diag));
  uint64_t ns = read_u64(p + 18), nd = read_u64(p + 26);
  /* Bound the counts by the file length before multiplying, so the size
   * computation below cannot overflow. */
  uint64_t room = m->len - IDX_HEADER;
  if (ns > room / 12 || nd > room / 8 || ns * 12 + nd * 8 > room) {
    err_at(diag, idx_path, (int64_t)m->len,
           "truncated index: the header announces %" PRIu64 " sequences and %" PRIu64
           " documents, more than the %" PRIu64 " bytes after the header hold",
           ns, nd, room);
    return XM_ERR_INVALID_INPUT;
  }
  if (ns * 12 + nd * 8 != room) {
    err_at(diag, idx_path, (int64_t)(IDX_HEADER + ns * 12 + nd * 8),
           "%" PRIu64 " trailing bytes after the document index", room - ns * 12 - nd * 8);
    return XM_ERR_INVALID_INPUT;
  }
  *num_seqs = (int64_t)ns;
  *num_docs = (int64_t)nd;
  return XM_OK;
}

/* Sizes, pointers and document index: in range, in order, no overlaps. */
static xm_status_t megatron_arrays(xm_rt_data_t *d, const char *idx_path, int64_t num_docs,
                                   xm_diag_t *diag) {
  const unsigned char *p = d->idx.ptr;
  int64_t ns = d->num_seqs, es = d->elsize;
  int64_t sizes_off = IDX_HEADER, ptrs_off = sizes_off + 4 * ns, docs_off = ptrs_off + 8 * ns;
  int64_t bin_len = (int64_t)d->main.len;
  d->cum = malloc((size_t)(ns + 1) * sizeof *d->cum);
  d->ptrs_owned = malloc((size_t)(ns > 0 ? ns : 1) * sizeof *d->ptrs_owned);
  if (!d->cum || !d->ptrs_owned) return XM_ERR_NO_MEMORY;
  d->ptrs = d->ptrs_owned;
  d->cum[0] = 0;
  int64_t prev_end = 0;
  for (int64_t s = 0; s < ns; s++) {
    int32_t size;
    int64_t ptr;
    memcpy(&size, p + sizes_off + 4 * s, 4);
    memcpy(&ptr, p + ptrs_off + 8 * s, 8);
    if (size < 0) {
      err_at(diag, idx_path, sizes_off + 4 * s, "sequence %" PRId64 " has negative size %d", s,
             size);
      return XM_ERR_INVALID_INPUT;
    }
    if (ptr < prev_end || ptr > bin_len || (int64_t)size > (bin_len - ptr) / es) {
      err_at(diag, idx_path, ptrs_off + 8 * s,
             "sequence %" PRId64 " at byte %" PRId64 " with %d tokens is outside %s (%" PRId64
             " bytes) or overlaps the previous sequence (which ends at byte %" PRId64 ")",
             s, ptr, size, d->path, bin_len, prev_end);
      return XM_ERR_INVALID_INPUT;
    }
    prev_end = ptr + (int64_t)size * es;
    d->ptrs_owned[s] = ptr;
    d->cum[s + 1] = d->cum[s] + size;
  }
  int64_t prev_doc = 0;
  for (int64_t i = 0; i < num_docs; i++) {
    int64_t v;
    memcpy(&v, p + docs_off + 8 * i, 8);
    if (v < prev_doc || v > ns) {
      err_at(diag, idx_path, docs_off + 8 * i,
             "document index entry %" PRId64 " is %" PRId64 "; entries must be non-decreasing "
             "sequence numbers in [0, %" PRId64 "]",
             i, v, ns);
      return XM_ERR_INVALID_INPUT;
    }
    prev_doc = v;
  }
  d->num_tokens = d->cum[ns];
  return XM_OK;
}

static xm_status_t open_megatron(xm_rt_data_t *d, const char *prefix, xm_diag_t *diag) {
  d->format = XM_RT_DATA_MEGATRON;
  char *idx_path = concat(prefix, ".idx");
  d->path = concat(prefix, ".bin");
  if (!idx_path || !d->path) {
    free(idx_path);
    return XM_ERR_NO_MEMORY;
  }
  xm_status_t st = map_file(idx_path, diag, &d->idx);
  int64_t num_docs = 0;
  if (st == XM_OK) st = megatron_header(idx_path, &d->idx, &d->kind, &d->num_seqs, &num_docs, diag);
  if (st == XM_OK) st = map_file(d->path, diag, &d->main);
  if (st == XM_OK) {
    d->elsize = elem_size(d->kind);
    st = megatron_arrays(d, idx_path, num_docs, diag);
  }
  for (int64_t s = 0; st == XM_OK && s < d->num_seqs; s++)
    if (d->cum[s + 1] > d->cum[s])
      st = check_tokens(d->path, d->main.ptr + d->ptrs[s], d->cum[s + 1] - d->cum[s], d->kind,
                        d->vocab, d->ptrs[s], diag);
  free(idx_path);
  return st;
}

/* ---- opening, splitting, windows ---------------------------------------- */

/* PATH.idx, PATH.bin with PATH.idx beside it, or PATH with PATH.idx beside
 * it name a Megatron pair; returns the prefix (owned) or NULL. */
static char *megatron_prefix(const char *path) {
  if (ends_with(path, ".idx")) {
    char *prefix = strdup(path);
    if (prefix) prefix[strlen(prefix) - 4] = '\0';
    return prefix;
  }
  char *prefix = strdup(path);
  if (!prefix) return NULL;
  if (ends_with(path, ".bin")) prefix[strlen(prefix) - 4] = '\0';
  char *idx = concat(prefix, ".idx");
  int found = idx && is_regular_file(idx);
  free(idx);
  if (found && (ends_with(path, ".bin") || !is_regular_file(path))) return prefix;
  free(prefix);
  return NULL;
}

static xm_status_t open_any(xm_rt_data_t *d, const char *path, xm_diag_t *diag) {
  char *prefix = megatron_prefix(path);
  if (prefix) {
    xm_status_t st = open_megatron(d, prefix, diag);
    free(prefix);
    return st;
  }
  d->path = strdup(path);
  if (!d->path) return XM_ERR_NO_MEMORY;
  XM_RETURN_IF_ERROR(map_file(path, diag, &d->main));
  if (d->main.len >= sizeof k_tokens_magic &&
      memcmp(d->main.ptr, k_tokens_magic, sizeof k_tokens_magic) == 0)
    return open_token_file(d, diag);
  return open_text(d, diag);
}

/* Windows start every S tokens and need S+1; the last `eval_fraction` of
 * them (at least one) are the evaluation split. */
static xm_status_t split_windows(xm_rt_data_t *d, double eval_fraction, xm_diag_t *diag) {
  int64_t S = d->seq_len;
  if (d->num_tokens < S + 1) {
    err_at(diag, d->path, (int64_t)d->main.len,
           "too few tokens: %" PRId64 " tokens, one window of sequence length %" PRId64
           " needs %" PRId64,
           d->num_tokens, S, S + 1);
    return XM_ERR_INVALID_INPUT;
  }
  d->windows = (d->num_tokens - 1) / S;
  if (d->windows == 1) {
    d->train_windows = d->eval_windows = 1;
    xm_diag_add(diag, XM_DIAG_WARNING, d->path, NULL,
                "only one window of %" PRId64 " tokens: training and evaluation share it", S + 1);
    return XM_OK;
  }
  int64_t n_eval = (int64_t)((double)d->windows * eval_fraction);
  if (n_eval < 1) n_eval = 1;
  if (n_eval > d->windows - 1) n_eval = d->windows - 1;
  d->eval_windows = n_eval;
  d->train_windows = d->windows - n_eval;
  return XM_OK;
}

xm_status_t xm_rt_data_open(const char *path, int64_t vocab, int64_t seq_len, double eval_fraction,
                            xm_diag_t *diag, xm_rt_data_t **out) {
  *out = NULL;
  if (vocab <= 0 || seq_len <= 0 || !(eval_fraction >= 0.0 && eval_fraction < 1.0)) {
    xm_diag_add(diag, XM_DIAG_ERROR, path, NULL,
                "bad data settings: vocab %" PRId64 ", sequence length %" PRId64
                ", eval fraction %g",
                vocab, seq_len, eval_fraction);
    return XM_ERR_INVALID_INPUT;
  }
  xm_rt_data_t *d = calloc(1, sizeof *d);
  if (!d) return XM_ERR_NO_MEMORY;
  d->main.fd = d->idx.fd = -1;
  d->main.guard = d->idx.guard = -1;
  d->vocab = vocab;
  d->seq_len = seq_len;
  d->elsize = 1;
  xm_status_t st = open_any(d, path, diag);
  if (st == XM_OK) {
    d->elsize = elem_size(d->kind);
    st = split_windows(d, eval_fraction, diag);
  }
  if (st != XM_OK) {
    xm_rt_data_close(d);
    return st;
  }
  *out = d;
  return XM_OK;
}

void xm_rt_data_close(xm_rt_data_t *d) {
  if (!d) return;
  unmap(&d->main);
  unmap(&d->idx);
  free(d->cum);
  free(d->ptrs_owned);
  free(d->path);
  free(d);
}

xm_rt_data_format_t xm_rt_data_format(const xm_rt_data_t *d) { return d->format; }
int64_t xm_rt_data_num_tokens(const xm_rt_data_t *d) { return d->num_tokens; }
int64_t xm_rt_data_train_windows(const xm_rt_data_t *d) { return d->train_windows; }
int64_t xm_rt_data_eval_windows(const xm_rt_data_t *d) { return d->eval_windows; }

/* Index of the sequence holding stream token k: the last s with cum[s] <= k
 * among non-empty sequences. */
static int64_t find_seq(const xm_rt_data_t *d, int64_t k) {
  int64_t lo = 0, hi = d->num_seqs; /* cum[lo] <= k < cum[hi] */
  while (hi - lo > 1) {
    int64_t mid = lo + (hi - lo) / 2;
    if (d->cum[mid] <= k)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

/* Copies stream tokens [k0, k0 + n) into out, each checked against the
 * vocabulary; the file offset of the first id outside it, else -1. */
static int64_t read_stream(const xm_rt_data_t *d, int64_t k0, int64_t n, int32_t *out) {
  if (d->format != XM_RT_DATA_MEGATRON) {
    for (int64_t i = 0; i < n; i++) {
      const unsigned char *p = d->tokens + (k0 + i) * d->elsize;
      int64_t v = read_elem(p, d->kind);
      if (v < 0 || v >= d->vocab) return (int64_t)(p - d->main.ptr);
      out[i] = (int32_t)v;
    }
    return -1;
  }
  int64_t s = find_seq(d, k0), k = k0;
  for (int64_t i = 0; i < n; i++, k++) {
    while (k >= d->cum[s + 1])
      s++; /* skips empty sequences too */
    const unsigned char *p = d->main.ptr + d->ptrs[s] + (k - d->cum[s]) * d->elsize;
    int64_t v = read_elem(p, d->kind);
    if (v < 0 || v >= d->vocab) return (int64_t)(p - d->main.ptr);
    out[i] = (int32_t)v;
  }
  return -1;
}

xm_status_t xm_rt_data_window(const xm_rt_data_t *d, int eval, int64_t j, int32_t *tokens,
                              int32_t *labels, xm_diag_t *diag) {
  int64_t S = d->seq_len;
  XM_ASSERT(j >= 0 && j < (eval ? d->eval_windows : d->train_windows));
  if (!unchanged(&d->main) || !unchanged(&d->idx)) {
    xm_diag_add(diag, XM_DIAG_ERROR, d->path, NULL,
                "the data changed while the program was reading it (size or modification time "
                "differ from when it was opened); data files must not change during training");
    return XM_ERR_IO;
  }
  int64_t g = eval ? d->windows - d->eval_windows + j : j;
  /* Labels are the same stream shifted by one; read them rather than copy
   * tokens[1..] so the two buffers may alias nothing and each is complete. */
  int64_t bad = read_stream(d, g * S, S, tokens);
  if (bad < 0) bad = read_stream(d, g * S + 1, S, labels);
  if (bad >= 0) {
    err_at(diag, d->path, bad,
           "token id outside the vocabulary [0, %" PRId64 ") (the file changed after it was "
           "checked)",
           d->vocab);
    return XM_ERR_IO;
  }
  return XM_OK;
}

xm_status_t xm_rt_data_write_tokens(const char *path, const uint32_t *tokens, int64_t n,
                                    int bytes_per_token, xm_diag_t *diag) {
  if (bytes_per_token != 2 && bytes_per_token != 4) {
    xm_diag_add(diag, XM_DIAG_ERROR, path, NULL, "bytes per token must be 2 or 4, not %d",
                bytes_per_token);
    return XM_ERR_INVALID_INPUT;
  }
  for (int64_t i = 0; bytes_per_token == 2 && i < n; i++)
    if (tokens[i] > UINT16_MAX) {
      xm_diag_add(diag, XM_DIAG_ERROR, path, NULL,
                  "token %" PRId64 " is %u, which does not fit in 2 bytes", i, tokens[i]);
      return XM_ERR_INVALID_INPUT;
    }
  FILE *f = fopen(path, "wb");
  if (!f) {
    xm_diag_add(diag, XM_DIAG_ERROR, path, NULL, "cannot create: %s", strerror(errno));
    return XM_ERR_IO;
  }
  unsigned char header[TOKENS_HEADER];
  uint32_t version = 1, bpt = (uint32_t)bytes_per_token;
  memcpy(header, k_tokens_magic, 8);
  memcpy(header + 8, &version, 4);
  memcpy(header + 12, &bpt, 4);
  int ok = fwrite(header, 1, sizeof header, f) == sizeof header;
  for (int64_t i = 0; ok && i < n; i++) {
    uint16_t v16 = (uint16_t)tokens[i];
    ok = bytes_per_token == 2 ? fwrite(&v16, 2, 1, f) == 1 : fwrite(&tokens[i], 4, 1, f) == 1;
  }
  if (fclose(f) != 0) ok = 0;
  if (!ok) {
    xm_diag_add(diag, XM_DIAG_ERROR, path, NULL, "write failed: %s", strerror(errno));
    return XM_ERR_IO;
  }
  return XM_OK;
}
