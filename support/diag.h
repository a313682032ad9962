/* support/diag.h — a list of diagnostics (errors and warnings) with places.
 *
 * Validation reports every problem it finds, not only the first, so callers
 * pass an xm_diag_t* down and check xm_diag_error_count() at the end. Each
 * entry carries a place: a JSON pointer (/moe/top_k) for specs, file:line:col
 * for IR text, path:offset for data files. Messages are printed as
 *   <file>: error: <place>: <message>
 * The list owns copies of all strings it is given.
 */
#ifndef XM_SUPPORT_DIAG_H
#define XM_SUPPORT_DIAG_H

#include <stdarg.h>
#include <stdio.h>

typedef enum { XM_DIAG_ERROR, XM_DIAG_WARNING, XM_DIAG_NOTE } xm_diag_level_t;

typedef struct {
  xm_diag_level_t level;
  char *file;    /* owned; may be NULL */
  char *place;   /* owned; JSON pointer or line:col; may be NULL */
  char *message; /* owned */
} xm_diag_entry_t;

typedef struct {
  xm_diag_entry_t *entries; /* owned array */
  int count;
  int capacity;
  int errors;
} xm_diag_t;

void xm_diag_init(xm_diag_t *d);
void xm_diag_free(xm_diag_t *d);

/* Appends an entry; file and place may be NULL. Never fails (an allocation
 * failure aborts: diagnostics are how failures are reported). */
void xm_diag_add(xm_diag_t *d, xm_diag_level_t level, const char *file,
                 const char *place, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
void xm_diag_addv(xm_diag_t *d, xm_diag_level_t level, const char *file,
                  const char *place, const char *fmt, va_list ap);

static inline int xm_diag_error_count(const xm_diag_t *d) { return d->errors; }

/* Index of the first entry whose place equals `place`, or -1. For tests. */
int xm_diag_find(const xm_diag_t *d, const char *place);

/* Gives the entries from index `from` on that name no file `file` (for
 * checks that know the place in a document but not the document). */
void xm_diag_name_file(xm_diag_t *d, int from, const char *file);

/* Prints every entry, one per line. */
void xm_diag_print(const xm_diag_t *d, FILE *out);

#endif /* XM_SUPPORT_DIAG_H */
