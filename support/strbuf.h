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

/* Reads a whole file into a NUL-terminated malloc'd buffer. Returns 0 on
 * success, or errno on failure. */
int xm_read_file(const char *path, char **out_data, size_t *out_len);

/* Levenshtein edit distance, for "did you mean" suggestions. */
int xm_edit_distance(const char *a, const char *b);

#endif /* XM_SUPPORT_STRBUF_H */
