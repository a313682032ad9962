/* runtime/io/safetensors.c — writer and validating reader of safetensors files.
 *
 * The writer builds the JSON header with cJSON in a fixed order (metadata
 * first, then tensors sorted by name) so that the same tensors always give
 * the same bytes, and streams the tensor data straight from the caller's
 * buffers: a checkpoint never needs a second copy of the parameters.
 *
 * The reader trusts nothing. It works on the mapped bytes in four rounds —
 * framing (length prefix, header bounds), text (UTF-8, JSON, trailing
 * padding), entries (dtype, shape, offsets of each tensor) and layout (the
 * tensors tile the data section exactly, names unique) — and keeps going
 * after a problem inside a round so that one run reports all of them. The
 * header is copied into a NUL-terminated buffer before cJSON sees it so that
 * no parser path can read past the mapping.
 */
#define _GNU_SOURCE /* qsort_r */
#include "runtime/io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "support/strbuf.h"

/* Data are stored as they lie in memory; the format is little-endian. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "safetensors I/O assumes a little-endian host");

/* cJSON keeps numbers as doubles: integers above 2^53 would be rounded. */
#define XM_ST_MAX_JSON_INT 9007199254740992.0

static const struct {
  const char *name;
  int size;
} k_dtypes[XM_ST_DTYPE_COUNT_] = {
    [XM_ST_BOOL] = {"BOOL", 1},       [XM_ST_U8] = {"U8", 1},           [XM_ST_I8] = {"I8", 1},
    [XM_ST_F8_E5M2] = {"F8_E5M2", 1}, [XM_ST_F8_E4M3] = {"F8_E4M3", 1}, [XM_ST_I16] = {"I16", 2},
    [XM_ST_U16] = {"U16", 2},         [XM_ST_F16] = {"F16", 2},         [XM_ST_BF16] = {"BF16", 2},
    [XM_ST_I32] = {"I32", 4},         [XM_ST_U32] = {"U32", 4},         [XM_ST_F32] = {"F32", 4},
    [XM_ST_F64] = {"F64", 8},         [XM_ST_I64] = {"I64", 8},         [XM_ST_U64] = {"U64", 8},
};

const char *xm_st_dtype_name(xm_st_dtype_t dtype) {
  return (unsigned)dtype < XM_ST_DTYPE_COUNT_ ? k_dtypes[dtype].name : "?";
}

int xm_st_dtype_size(xm_st_dtype_t dtype) {
  return (unsigned)dtype < XM_ST_DTYPE_COUNT_ ? k_dtypes[dtype].size : 0;
}

int xm_st_dtype_parse(const char *name) {
  for (int i = 0; i < XM_ST_DTYPE_COUNT_; i++)
    if (strcmp(k_dtypes[i].name, name) == 0) return i;
  return -1;
}

/* ------------------------------------------------------------------ */
/* writer                                                               */
/* ------------------------------------------------------------------ */

int64_t xm_st_entry_bytes(const xm_st_entry_t *e) {
  int size = xm_st_dtype_size(e->dtype);
  if (size == 0 || e->rank < 0 || e->rank > XM_ST_MAX_RANK) return -1;
  int64_t n = size;
  for (int i = 0; i < e->rank; i++) {
    if (e->dims[i] < 0 || __builtin_mul_overflow(n, e->dims[i], &n)) return -1;
  }
  return n;
}

static int cmp_entry_index(const void *a, const void *b, void *ctx) {
  const xm_st_entry_t *entries = ctx;
  return strcmp(entries[*(const int *)a].name, entries[*(const int *)b].name);
}

/* Sorted order, checked names and shapes. The caller frees *out_order. */
static xm_status_t plan_entries(const char *path, const xm_st_entry_t *entries, int n,
                                xm_diag_t *diag, int **out_order) {
  int *order = malloc((size_t)(n > 0 ? n : 1) * sizeof *order);
  if (!order) return XM_ERR_NO_MEMORY;
  int errors = xm_diag_error_count(diag);
  for (int i = 0; i < n; i++) {
    order[i] = i;
    if (!entries[i].name || !entries[i].name[0] || strcmp(entries[i].name, "__metadata__") == 0)
      xm_diag_add(diag, XM_DIAG_ERROR, path, entries[i].name ? entries[i].name : "",
                  "invalid tensor name");
    else if (xm_st_entry_bytes(&entries[i]) < 0)
      xm_diag_add(diag, XM_DIAG_ERROR, path, entries[i].name, "invalid dtype or shape (rank %d)",
                  entries[i].rank);
  }
  if (xm_diag_error_count(diag) == errors) {
    qsort_r(order, (size_t)n, sizeof *order, cmp_entry_index, (void *)entries);
    for (int i = 1; i < n; i++)
      if (strcmp(entries[order[i]].name, entries[order[i - 1]].name) == 0)
        xm_diag_add(diag, XM_DIAG_ERROR, path, entries[order[i]].name, "duplicate tensor name");
  }
  if (xm_diag_error_count(diag) != errors) {
    free(order);
    return XM_ERR_INVALID_INPUT;
  }
  *out_order = order;
  return XM_OK;
}

/* The padded header text (without the length prefix). */
static xm_status_t build_header(const char *path, const xm_st_entry_t *entries, int n,
                                const int *order, const xm_st_meta_t *meta, int num_meta,
                                xm_diag_t *diag, xm_strbuf_t *out_header,
                                uint64_t *out_data_bytes) {
  cJSON *root = cJSON_CreateObject();
  cJSON *md = cJSON_AddObjectToObject(root, "__metadata__");
  bool has_format = false;
  for (int i = 0; i < num_meta; i++)
    has_format |= strcmp(meta[i].key, "format") == 0;
  if (!has_format) cJSON_AddStringToObject(md, "format", "pt");
  for (int i = 0; i < num_meta; i++)
    cJSON_AddStringToObject(md, meta[i].key, meta[i].value);
  uint64_t offset = 0;
  for (int k = 0; k < n; k++) {
    const xm_st_entry_t *e = &entries[order[k]];
    uint64_t bytes = (uint64_t)xm_st_entry_bytes(e);
    if ((double)(offset + bytes) >= XM_ST_MAX_JSON_INT) {
      cJSON_Delete(root);
      xm_diag_add(diag, XM_DIAG_ERROR, path, e->name, "file would exceed 2^53 bytes");
      return XM_ERR_INVALID_INPUT;
    }
    cJSON *t = cJSON_AddObjectToObject(root, e->name);
    cJSON_AddStringToObject(t, "dtype", xm_st_dtype_name(e->dtype));
    cJSON *shape = cJSON_AddArrayToObject(t, "shape");
    for (int d = 0; d < e->rank; d++)
      cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)e->dims[d]));
    cJSON *offs = cJSON_AddArrayToObject(t, "data_offsets");
    cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)offset));
    cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(offset + bytes)));
    offset += bytes;
  }
  char *text = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  if (!text) return XM_ERR_NO_MEMORY;
  xm_strbuf_clear(out_header);
  xm_strbuf_puts(out_header, text);
  free(text);
  /* Spaces are JSON whitespace: readers ignore them, and the data section
   * starts 8-byte aligned (after the 8-byte length prefix). */
  while (out_header->len % 8 != 0)
    xm_strbuf_append(out_header, " ", 1);
  *out_data_bytes = offset;
  return XM_OK;
}

static void put_le64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_le64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = (v << 8) | p[i];
  return v;
}

static xm_status_t write_all(int fd, const char *path, const void *data, uint64_t n,
                             xm_diag_t *diag) {
  const unsigned char *p = data;
  while (n > 0) {
    size_t chunk = n > (1u << 30) ? (1u << 30) : (size_t)n;
    ssize_t w = write(fd, p, chunk);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      xm_diag_add(diag, XM_DIAG_ERROR, path, NULL, "write failed: %s",
                  w < 0 ? strerror(errno) : "no progress");
      return XM_ERR_IO;
    }
    p += w;
    n -= (uint64_t)w;
  }
  return XM_OK;
}

static xm_status_t write_body(int fd, const char *path, const xm_st_entry_t *entries, int n,
                              const int *order, const xm_strbuf_t *header, xm_diag_t *diag) {
  unsigned char prefix[8];
  put_le64(prefix, header->len);
  XM_RETURN_IF_ERROR(write_all(fd, path, prefix, 8, diag));
  XM_RETURN_IF_ERROR(write_all(fd, path, header->data, header->len, diag));
  for (int k = 0; k < n; k++) {
    const xm_st_entry_t *e = &entries[order[k]];
    XM_RETURN_IF_ERROR(write_all(fd, path, e->data, (uint64_t)xm_st_entry_bytes(e), diag));
  }
  if (fsync(fd) != 0) {
    xm_diag_add(diag, XM_DIAG_ERROR, path, NULL, "fsync failed: %s", strerror(errno));
    return XM_ERR_IO;
  }
  return XM_OK;
}

xm_status_t xm_st_write(const char *path, const xm_st_entry_t *entries, int num_entries,
                        const xm_st_meta_t *meta, int num_meta, xm_diag_t *diag) {
  int *order = NULL;
  XM_RETURN_IF_ERROR(plan_entries(path, entries, num_entries, diag, &order));
  xm_strbuf_t header;
  xm_strbuf_init(&header);
  uint64_t data_bytes = 0;
  xm_status_t s =
      build_header(path, entries, num_entries, order, meta, num_meta, diag, &header, &data_bytes);
  if (s == XM_OK) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      xm_diag_add(diag, XM_DIAG_ERROR, path, NULL, "cannot create: %s", strerror(errno));
      s = XM_ERR_IO;
    } else {
      s = write_body(fd, path, entries, num_entries, order, &header, diag);
      if (close(fd) != 0 && s == XM_OK) {
        xm_diag_add(diag, XM_DIAG_ERROR, path, NULL, "close failed: %s", strerror(errno));
        s = XM_ERR_IO;
      }
    }
  }
  xm_strbuf_free(&header);
  free(order);
  return s;
}

xm_status_t xm_st_serialize(const xm_st_entry_t *entries, int num_entries, const xm_st_meta_t *meta,
                            int num_meta, xm_diag_t *diag, unsigned char **out_bytes,
                            size_t *out_size) {
  int *order = NULL;
  XM_RETURN_IF_ERROR(plan_entries("<memory>", entries, num_entries, diag, &order));
  xm_strbuf_t header;
  xm_strbuf_init(&header);
  uint64_t data_bytes = 0;
  xm_status_t s = build_header("<memory>", entries, num_entries, order, meta, num_meta, diag,
                               &header, &data_bytes);
  unsigned char *buf = NULL;
  size_t size = 8 + header.len + data_bytes;
  if (s == XM_OK && !(buf = malloc(size))) s = XM_ERR_NO_MEMORY;
  if (s == XM_OK) {
    put_le64(buf, header.len);
    memcpy(buf + 8, header.data, header.len);
    size_t at = 8 + header.len;
    for (int k = 0; k < num_entries; k++) {
      const xm_st_entry_t *e = &entries[order[k]];
      size_t bytes = (size_t)xm_st_entry_bytes(e);
      if (bytes) memcpy(buf + at, e->data, bytes);
      at += bytes;
    }
    *out_bytes = buf;
    *out_size = size;
  }
  xm_strbuf_free(&header);
  free(order);
  return s;
}

/* ------------------------------------------------------------------ */
/* reader                                                               */
/* ------------------------------------------------------------------ */

static void err_at(xm_diag_t *diag, const char *path, uint64_t offset, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void err_at(xm_diag_t *diag, const char *path, uint64_t offset, const char *fmt, ...) {
  char place[48];
  snprintf(place, sizeof place, "offset %llu", (unsigned long long)offset);
  va_list ap;
  va_start(ap, fmt);
  xm_diag_addv(diag, XM_DIAG_ERROR, path, place, fmt, ap);
  va_end(ap);
}

/* Index of the first byte that breaks UTF-8 (or is NUL), or len when none. */
static size_t utf8_invalid_at(const unsigned char *s, size_t len) {
  size_t i = 0;
  while (i < len) {
    unsigned c = s[i];
    size_t n;
    uint32_t cp;
    if (c == 0) return i;
    if (c < 0x80) {
      i++;
      continue;
    }
    if (c >= 0xC2 && c <= 0xDF) {
      n = 1;
      cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 2;
      cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 3;
      cp = c & 0x07;
    } else
      return i;
    for (size_t k = 1; k <= n; k++) {
      if (i + k >= len || (s[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    /* Overlong forms, surrogates and values past U+10FFFF. */
    if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return i;
    i += n + 1;
  }
  return len;
}

/* A JSON number that is an exact non-negative integer below 2^53. */
static bool json_uint(const cJSON *j, uint64_t *out) {
  if (!cJSON_IsNumber(j)) return false;
  double v = j->valuedouble;
  if (!(v >= 0 && v < XM_ST_MAX_JSON_INT) || v != (double)(uint64_t)v) return false;
  *out = (uint64_t)v;
  return true;
}

static char *dup_str(const char *s) {
  char *r = strdup(s);
  XM_ASSERT(r != NULL);
  return r;
}

static void parse_metadata(xm_st_file_t *f, const cJSON *md, xm_diag_t *diag) {
  if (cJSON_IsNull(md)) return;
  if (f->meta_keys) { /* a second "__metadata__" (found by tests/fuzz/fuzz_safetensors.c) */
    xm_diag_add(diag, XM_DIAG_ERROR, f->path, "__metadata__", "given more than once");
    return;
  }
  if (!cJSON_IsObject(md)) {
    xm_diag_add(diag, XM_DIAG_ERROR, f->path, "__metadata__", "must be an object of strings");
    return;
  }
  int n = cJSON_GetArraySize(md);
  f->meta_keys = calloc((size_t)n + 1, sizeof(char *));
  f->meta_values = calloc((size_t)n + 1, sizeof(char *));
  XM_ASSERT(f->meta_keys && f->meta_values);
  for (const cJSON *v = md->child; v; v = v->next) {
    if (!cJSON_IsString(v)) {
      xm_diag_add(diag, XM_DIAG_ERROR, f->path, "__metadata__", "value of \"%s\" is not a string",
                  v->string);
      continue;
    }
    f->meta_keys[f->num_meta] = dup_str(v->string);
    f->meta_values[f->num_meta++] = dup_str(v->valuestring);
  }
}

/* Fills `t` from one header entry; returns false (with messages) when bad. */
static bool parse_tensor(const xm_st_file_t *f, const cJSON *j, uint64_t data_size, xm_diag_t *diag,
                         xm_st_tensor_t *t) {
  const char *name = j->string;
  const char *path = f->path;
  if (!cJSON_IsObject(j)) {
    xm_diag_add(diag, XM_DIAG_ERROR, path, name, "header entry is not an object");
    return false;
  }
  const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(j, "dtype");
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(j, "shape");
  const cJSON *offs = cJSON_GetObjectItemCaseSensitive(j, "data_offsets");
  bool ok = true;
  int dt = cJSON_IsString(dtype) ? xm_st_dtype_parse(dtype->valuestring) : -1;
  if (dt < 0) {
    xm_diag_add(diag, XM_DIAG_ERROR, path, name, "unknown or missing dtype %s%s%s",
                cJSON_IsString(dtype) ? "\"" : "", cJSON_IsString(dtype) ? dtype->valuestring : "",
                cJSON_IsString(dtype) ? "\"" : "");
    ok = false;
  }
  uint64_t count = 1;
  int rank = cJSON_IsArray(shape) ? cJSON_GetArraySize(shape) : -1;
  if (rank < 0 || rank > XM_ST_MAX_RANK) {
    xm_diag_add(diag, XM_DIAG_ERROR, path, name, "shape must be an array of at most %d dims",
                XM_ST_MAX_RANK);
    ok = false;
  } else {
    int d = 0;
    for (const cJSON *e = shape->child; e; e = e->next, d++) {
      uint64_t v;
      if (!json_uint(e, &v)) {
        xm_diag_add(diag, XM_DIAG_ERROR, path, name, "shape[%d] is not a non-negative integer", d);
        ok = false;
        continue;
      }
      t->dims[d] = (int64_t)v;
      if (__builtin_mul_overflow(count, v, &count) || count >= (uint64_t)1 << 53) {
        xm_diag_add(diag, XM_DIAG_ERROR, path, name, "shape has too many elements");
        ok = false;
        break;
      }
    }
    t->rank = rank;
  }
  uint64_t b = 0, e = 0;
  if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || !json_uint(offs->child, &b) ||
      !json_uint(offs->child->next, &e)) {
    xm_diag_add(diag, XM_DIAG_ERROR, path, name,
                "data_offsets must be [begin, end], two non-negative integers");
    return false;
  }
  if (b > e || e > data_size) {
    xm_diag_add(diag, XM_DIAG_ERROR, path, name,
                "data_offsets [%llu, %llu] out of range: the data section has %llu bytes",
                (unsigned long long)b, (unsigned long long)e, (unsigned long long)data_size);
    return false;
  }
  if (ok && count * (uint64_t)xm_st_dtype_size(dt) != e - b) {
    xm_diag_add(diag, XM_DIAG_ERROR, path, name,
                "shape holds %llu bytes of %s but data_offsets [%llu, %llu] span %llu",
                (unsigned long long)(count * (uint64_t)xm_st_dtype_size(dt)), xm_st_dtype_name(dt),
                (unsigned long long)b, (unsigned long long)e, (unsigned long long)(e - b));
    ok = false;
  }
  t->dtype = (xm_st_dtype_t)(dt < 0 ? 0 : dt);
  t->begin = b;
  t->end = e;
  return ok;
}

static int cmp_tensor_name(const void *a, const void *b) {
  return strcmp(((const xm_st_tensor_t *)a)->name, ((const xm_st_tensor_t *)b)->name);
}

static int cmp_tensor_begin(const void *a, const void *b, void *ctx) {
  const xm_st_tensor_t *tensors = ctx;
  const xm_st_tensor_t *x = &tensors[*(const int *)a];
  const xm_st_tensor_t *y = &tensors[*(const int *)b];
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* The tensors must tile [0, data size) in some order, as the reference
 * implementation demands; names must be unique. */
static void check_layout(xm_st_file_t *f, uint64_t data_size, xm_diag_t *diag) {
  int n = f->num_tensors;
  qsort(f->tensors, (size_t)n, sizeof *f->tensors, cmp_tensor_name);
  for (int i = 1; i < n; i++)
    if (strcmp(f->tensors[i].name, f->tensors[i - 1].name) == 0)
      xm_diag_add(diag, XM_DIAG_ERROR, f->path, f->tensors[i].name, "duplicate tensor name");
  int *by_begin = malloc((size_t)(n > 0 ? n : 1) * sizeof *by_begin);
  XM_ASSERT(by_begin != NULL);
  for (int i = 0; i < n; i++)
    by_begin[i] = i;
  qsort_r(by_begin, (size_t)n, sizeof *by_begin, cmp_tensor_begin, f->tensors);
  uint64_t expect = 0;
  const char *prev = NULL;
  for (int k = 0; k < n; k++) {
    const xm_st_tensor_t *t = &f->tensors[by_begin[k]];
    if (t->begin < expect)
      xm_diag_add(diag, XM_DIAG_ERROR, f->path, t->name, "data [%llu, %llu] overlaps tensor \"%s\"",
                  (unsigned long long)t->begin, (unsigned long long)t->end, prev);
    else if (t->begin > expect)
      xm_diag_add(diag, XM_DIAG_ERROR, f->path, t->name,
                  "data starts at %llu, leaving a gap after %llu", (unsigned long long)t->begin,
                  (unsigned long long)expect);
    if (t->end > expect) {
      expect = t->end;
      prev = t->name;
    }
  }
  if (expect != data_size)
    err_at(diag, f->path, f->data_start + expect,
           "the data section has %llu bytes but the tensors cover %llu",
           (unsigned long long)data_size, (unsigned long long)expect);
  free(by_begin);
}

static void parse_entries(xm_st_file_t *f, const cJSON *root, uint64_t data_size, xm_diag_t *diag) {
  int n = cJSON_GetArraySize(root);
  f->tensors = calloc((size_t)n + 1, sizeof *f->tensors);
  XM_ASSERT(f->tensors != NULL);
  bool all_ok = true;
  for (const cJSON *j = root->child; j; j = j->next) {
    if (strcmp(j->string, "__metadata__") == 0) {
      parse_metadata(f, j, diag);
      continue;
    }
    xm_st_tensor_t *t = &f->tensors[f->num_tensors];
    if (!j->string[0]) {
      xm_diag_add(diag, XM_DIAG_ERROR, f->path, "", "empty tensor name");
      all_ok = false;
      continue;
    }
    if (!parse_tensor(f, j, data_size, diag, t)) {
      all_ok = false;
      continue;
    }
    t->name = dup_str(j->string);
    f->num_tensors++;
  }
  /* Layout messages about a header that already failed would only echo it. */
  if (all_ok) check_layout(f, data_size, diag);
}

/* Framing and text: on success *out_root is the parsed header. */
static xm_status_t parse_header(xm_st_file_t *f, xm_diag_t *diag, cJSON **out_root) {
  const char *path = f->path;
  if (f->size < 8) {
    err_at(diag, path, 0, "file is %zu bytes, too short for the 8-byte header length", f->size);
    return XM_ERR_INVALID_INPUT;
  }
  uint64_t n = get_le64(f->bytes);
  if (n > XM_ST_MAX_HEADER_BYTES) {
    err_at(diag, path, 0, "header length %llu exceeds the limit of %llu bytes",
           (unsigned long long)n, XM_ST_MAX_HEADER_BYTES);
    return XM_ERR_INVALID_INPUT;
  }
  if (n > f->size - 8) {
    err_at(diag, path, 0, "header length %llu exceeds the %zu bytes after the length prefix",
           (unsigned long long)n, f->size - 8);
    return XM_ERR_INVALID_INPUT;
  }
  f->header_len = n;
  f->data_start = 8 + n;
  const unsigned char *h = f->bytes + 8;
  if (n == 0 || h[0] != '{') {
    err_at(diag, path, 8, "header does not start with '{'");
    return XM_ERR_INVALID_INPUT;
  }
  size_t bad = utf8_invalid_at(h, (size_t)n);
  if (bad < n) {
    err_at(diag, path, 8 + bad, "header is not valid UTF-8 text (byte 0x%02x)", h[bad]);
    return XM_ERR_INVALID_INPUT;
  }
  char *text = malloc((size_t)n + 1);
  if (!text) return XM_ERR_NO_MEMORY;
  memcpy(text, h, (size_t)n);
  text[n] = '\0';
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithOpts(text, &end, 0);
  uint64_t at = end ? (uint64_t)(end - text) : 0;
  if (!root) {
    err_at(diag, path, 8 + at, "header is not valid JSON");
    free(text);
    return XM_ERR_INVALID_INPUT;
  }
  while (at < n && strchr(" \t\r\n", text[at]))
    at++;
  free(text);
  if (at < n) {
    err_at(diag, path, 8 + at, "unexpected bytes after the JSON header");
    cJSON_Delete(root);
    return XM_ERR_INVALID_INPUT;
  }
  if (!cJSON_IsObject(root)) {
    err_at(diag, path, 8, "header is not a JSON object");
    cJSON_Delete(root);
    return XM_ERR_INVALID_INPUT;
  }
  *out_root = root;
  return XM_OK;
}

xm_status_t xm_st_parse(const char *path, const void *bytes, size_t size, xm_diag_t *diag,
                        xm_st_file_t *out_file) {
  xm_st_file_t *f = out_file;
  memset(f, 0, sizeof *f);
  f->path = dup_str(path);
  f->bytes = bytes;
  f->size = size;
  int errors = xm_diag_error_count(diag);
  cJSON *root = NULL;
  xm_status_t s = parse_header(f, diag, &root);
  if (s != XM_OK) {
    xm_st_close(f);
    return s;
  }
  parse_entries(f, root, (uint64_t)size - f->data_start, diag);
  cJSON_Delete(root);
  if (xm_diag_error_count(diag) != errors) {
    xm_st_close(f);
    return XM_ERR_INVALID_INPUT;
  }
  for (int i = 0; i < f->num_tensors; i++)
    f->tensors[i].data = f->bytes + f->data_start + f->tensors[i].begin;
  return XM_OK;
}

xm_status_t xm_st_open(const char *path, xm_diag_t *diag, xm_st_file_t *out_file) {
  memset(out_file, 0, sizeof *out_file);
  int fd;
  size_t size = 0;
  int err = xm_open_regular(path, SIZE_MAX, &fd, &size, NULL);
  if (err) {
    char why[200];
    xm_diag_add(diag, XM_DIAG_ERROR, path, NULL, "%s",
                xm_open_error(err, SIZE_MAX, "safetensors file", why, sizeof why));
    return XM_ERR_IO;
  }
  void *map = NULL;
  if (size > 0) {
    map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      xm_diag_add(diag, XM_DIAG_ERROR, path, NULL, "cannot map: %s", strerror(errno));
      close(fd);
      return XM_ERR_IO;
    }
  }
  close(fd);
  static const unsigned char empty[1] = {0};
  xm_status_t s = xm_st_parse(path, map ? map : empty, size, diag, out_file);
  if (s != XM_OK) {
    if (map) munmap(map, size);
    return s;
  }
  out_file->map = map;
  return XM_OK;
}

void xm_st_close(xm_st_file_t *f) {
  if (!f) return;
  for (int i = 0; i < f->num_tensors; i++)
    free(f->tensors[i].name);
  free(f->tensors);
  for (int i = 0; i < f->num_meta; i++) {
    free(f->meta_keys[i]);
    free(f->meta_values[i]);
  }
  free(f->meta_keys);
  free(f->meta_values);
  if (f->map) munmap(f->map, f->size);
  free(f->path);
  memset(f, 0, sizeof *f);
}

const xm_st_tensor_t *xm_st_find(const xm_st_file_t *f, const char *name) {
  xm_st_tensor_t key = {.name = (char *)name};
  return bsearch(&key, f->tensors, (size_t)f->num_tensors, sizeof key, cmp_tensor_name);
}

const char *xm_st_meta_get(const xm_st_file_t *f, const char *key) {
  for (int i = 0; i < f->num_meta; i++)
    if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
  return NULL;
}
