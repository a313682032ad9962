/* support/strbuf.h — a growable, always NUL-terminated byte string.
 *
 * Used by every text producer (IR printer, MLIR bridge, codegen emitter,
 * JSON output). Allocation failure aborts: text output has no sensible
 * partial result and the sizes involved are small.
 */
#ifndef XM_SUPPORT_STRBUF_H
#define XM_SUPPORT_STRBUF_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <time.h>

typedef struct {
  char *data; /* owned; NUL-terminated; NULL until the first append */
  size_t len;
  size_t cap;
} xm_strbuf_t;

void xm_strbuf_init(xm_strbuf_t *b);
void xm_strbuf_free(xm_strbuf_t *b);
void xm_strbuf_clear(xm_strbuf_t *b);
void xm_strbuf_append(xm_strbuf_t *b, const char *s, size_t n);
void xm_strbuf_puts(xm_strbuf_t *b, const char *s);
void xm_strbuf_printf(xm_strbuf_t *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void xm_strbuf_vprintf(xm_strbuf_t *b, const char *fmt, va_list ap);
/* Returns the string ("" when empty); the buffer keeps ownership. */
const char *xm_strbuf_cstr(const xm_strbuf_t *b);
/* Detaches the string; the caller frees it; the buffer is left empty. */
char *xm_strbuf_take(xm_strbuf_t *b);

/* Appends `s` as a JSON/IR string literal with quotes and escapes. */
void xm_strbuf_put_quoted(xm_strbuf_t *b, const char *s);

/* Formats a double with the fewest digits that read back to the same value,
 * always with a '.' or an exponent so it never reads as an integer
 * ("1.0", "1e-06", "0.1"). inf/nan print as "inf", "-inf", "nan". */
void xm_strbuf_put_double(xm_strbuf_t *b, double v);

/* The 1-based line and column of byte `off` of `text` (for the place of
 * a JSON syntax error). */
void xm_text_line_col(const char *text, size_t off, int *line, int *col);

/* The size limits of the files read whole (docs/spec.md, Errors). */
#define XM_READ_LIMIT_TEXT ((size_t)64 << 20)  /* specs, clusters, HF configs, manifests, JSON */
#define XM_READ_LIMIT_IR ((size_t)1 << 30)     /* IR and MLIR text */

/* Errors of xm_read_file beside errno values. */
enum {
  XM_READ_NOT_REGULAR = 100000, /* a FIFO, a device or a socket */
  XM_READ_TOO_LARGE = 100001,   /* over the limit */
};

/* Reads a whole regular file of at most `limit` bytes into a
 * NUL-terminated malloc'd buffer. The file is opened without blocking (a
 * FIFO is refused, never waited on) and its kind checked before anything
 * is read: a directory gives EISDIR, any other non-regular file
 * XM_READ_NOT_REGULAR, more than `limit` bytes (also when the file grows
 * while it is read) XM_READ_TOO_LARGE. Returns 0 on success, else that
 * code or errno. */
int xm_read_file_limit(const char *path, size_t limit, char **out_data, size_t *out_len);
/* The open and the checks of kind and size that every reader of a file
 * makes (the whole-file reads above, the mapped data and safetensors
 * files): opened read-only with O_NONBLOCK (a FIFO opens at once, to be
 * refused), then fstat: a directory is EISDIR, anything but a regular file
 * XM_READ_NOT_REGULAR, more than `limit` bytes XM_READ_TOO_LARGE (SIZE_MAX:
 * no limit). Returns 0 with *out_fd open and *out_size its size, else the
 * error (nothing left open). */
int xm_open_regular(const char *path, size_t limit, int *out_fd, size_t *out_size,
                    struct timespec *out_mtime);
/* xm_read_file_limit with XM_READ_LIMIT_TEXT. */
int xm_read_file(const char *path, char **out_data, size_t *out_len);
/* The same from an open stream (stdin), bounded the same way. */
int xm_read_stream_limit(FILE *f, size_t limit, char **out_data, size_t *out_len);
/* What an error of the readers above means, for a message ("cannot read:
 * <this>"); the limit is the one the read was given. Returns buf. */
const char *xm_read_error(int err, size_t limit, char *buf, size_t n);
/* The whole message for an error of xm_open_regular on a file of `kind`
 * ("data file", "safetensors file"): "is a directory, not a <kind>", the
 * kind or size refusal as above, or "cannot open: <reason>". Returns buf. */
const char *xm_open_error(int err, size_t limit, const char *kind, char *buf, size_t n);

/* The offset of the first byte of p[0..n) that is not valid UTF-8 (an
 * invalid or overlong sequence, a surrogate, a code point past U+10FFFF, a
 * sequence cut by the end) or is a control character (below 0x20, or 0x7f)
 * missing from `allowed` ("" allows none, NULL allows every one); -1 when
 * there is none. */
long long xm_utf8_bad_at(const char *p, size_t n, const char *allowed);

/* Levenshtein edit distance, for "did you mean" suggestions. */
int xm_edit_distance(const char *a, const char *b);

#endif /* XM_SUPPORT_STRBUF_H */
