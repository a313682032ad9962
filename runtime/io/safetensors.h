/* runtime/io/safetensors.h — the safetensors file format, writer and reader.
 *
 * A safetensors file is: an unsigned 64-bit little-endian header length N,
 * N bytes of UTF-8 JSON, then the data section. The JSON object maps each
 * tensor name to {"dtype": "F32", "shape": [...], "data_offsets": [begin,
 * end]} with offsets relative to the start of the data section, plus an
 * optional "__metadata__" object of string values. The writer emits the
 * tensors sorted by name (byte order, as the Hugging Face tools do), packs
 * their data contiguously in that order, pads the header with spaces to a
 * multiple of 8 so that the data starts aligned, and always records
 * "format": "pt" in the metadata because transformers refuses files without
 * it. The reader maps the file and checks every rule the reference
 * implementation checks (header length within the file, a JSON object,
 * known dtypes, shape * dtype size == the offset span, offsets covering the
 * data section contiguously with no overlap, no duplicate names) and
 * reports every problem with the path and the byte offset or tensor name
 * (XM_ERR_INVALID_INPUT); no input makes it crash. Only little-endian hosts
 * are supported (the bytes are stored as they lie in memory).
 */
#ifndef XM_RUNTIME_SAFETENSORS_H
#define XM_RUNTIME_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "support/diag.h"
#include "support/status.h"

#define XM_ST_MAX_RANK 8
/* The reference implementation refuses larger headers (denial of service). */
#define XM_ST_MAX_HEADER_BYTES 100000000ull

/* Every dtype of the format; the runtime itself writes F32 and I32 only. */
typedef enum {
  XM_ST_BOOL = 0,
  XM_ST_U8,
  XM_ST_I8,
  XM_ST_F8_E5M2,
  XM_ST_F8_E4M3,
  XM_ST_I16,
  XM_ST_U16,
  XM_ST_F16,
  XM_ST_BF16,
  XM_ST_I32,
  XM_ST_U32,
  XM_ST_F32,
  XM_ST_F64,
  XM_ST_I64,
  XM_ST_U64,
  XM_ST_DTYPE_COUNT_
} xm_st_dtype_t;

/* "F32", ...; "?" when out of range. */
const char *xm_st_dtype_name(xm_st_dtype_t dtype);
/* Bytes per element; 0 when out of range. */
int xm_st_dtype_size(xm_st_dtype_t dtype);
/* Parses a dtype name; returns -1 when unknown. */
int xm_st_dtype_parse(const char *name);

/* ---- writer ---- */

/* One tensor to write. Everything is borrowed for the duration of the call;
 * `data` holds product(dims) * dtype size bytes (1 element when rank 0). */
typedef struct {
  const char *name;
  xm_st_dtype_t dtype;
  int rank;
  int64_t dims[XM_ST_MAX_RANK];
  const void *data;
} xm_st_entry_t;

typedef struct {
  const char *key;
  const char *value;
} xm_st_meta_t;

/* Bytes of one entry's data; -1 when the shape is invalid or overflows. */
int64_t xm_st_entry_bytes(const xm_st_entry_t *e);

/* Writes `path` (created or truncated) and fsyncs it. `meta` may be NULL;
 * "format": "pt" is added unless the caller gives a "format". Duplicate or
 * empty names and invalid shapes are XM_ERR_INVALID_INPUT, write failures
 * XM_ERR_IO, each with a message in `diag`. */
xm_status_t xm_st_write(const char *path, const xm_st_entry_t *entries, int num_entries,
                        const xm_st_meta_t *meta, int num_meta, xm_diag_t *diag);

/* The same file as one malloc'd buffer (for tests and small files); the
 * caller frees *out_bytes. */
xm_status_t xm_st_serialize(const xm_st_entry_t *entries, int num_entries, const xm_st_meta_t *meta,
                            int num_meta, xm_diag_t *diag, unsigned char **out_bytes,
                            size_t *out_size);

/* ---- reader ---- */

typedef struct {
  char *name; /* owned by the file */
  xm_st_dtype_t dtype;
  int rank;
  int64_t dims[XM_ST_MAX_RANK];
  uint64_t begin, end;       /* offsets relative to the data section */
  const unsigned char *data; /* into the file's bytes; not aligned in general */
} xm_st_tensor_t;

typedef struct {
  char *path;                 /* owned; used in messages */
  const unsigned char *bytes; /* the whole file */
  size_t size;
  void *map; /* owned mapping, or NULL when `bytes` is borrowed */
  uint64_t header_len;
  uint64_t data_start; /* 8 + header_len */
  int num_tensors;
  xm_st_tensor_t *tensors; /* owned; sorted by name */
  int num_meta;
  char **meta_keys;   /* owned */
  char **meta_values; /* owned */
} xm_st_file_t;

/* Maps `path` read-only and validates it. On failure every problem is in
 * `diag` and *out_file is left closed (safe to pass to xm_st_close). */
xm_status_t xm_st_open(const char *path, xm_diag_t *diag, xm_st_file_t *out_file);

/* Validates a file image in memory. `bytes` stays borrowed and must outlive
 * the file; `path` is only used in messages. */
xm_status_t xm_st_parse(const char *path, const void *bytes, size_t size, xm_diag_t *diag,
                        xm_st_file_t *out_file);

/* Frees the file (and unmaps it); a zeroed or already closed file is fine. */
void xm_st_close(xm_st_file_t *f);

/* The tensor named `name`, or NULL. Borrowed from the file. */
const xm_st_tensor_t *xm_st_find(const xm_st_file_t *f, const char *name);

/* The metadata value of `key`, or NULL. Borrowed from the file. */
const char *xm_st_meta_get(const xm_st_file_t *f, const char *key);

#endif /* XM_RUNTIME_SAFETENSORS_H */
