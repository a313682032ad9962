/* support/status.h — the one error type of xmoec.
 *
 * Every fallible call returns an xm_status_t: 0 is success, anything else
 * names a failure class. The human-readable message travels separately in a
 * diagnostic list (support/diag.h) so that one call can report many problems
 * (spec validation collects all of them before failing). The process exit
 * codes of docs/design.md, Interfaces derive from the class: bad input exits 2,
 * everything else that fails exits 1.
 */
#ifndef XM_SUPPORT_STATUS_H
#define XM_SUPPORT_STATUS_H

#include <stdio.h>
#include <stdlib.h>

typedef enum {
  XM_OK = 0,
  XM_ERR_INVALID_INPUT = 1, /* bad spec, flag, data file or IR text: exit 2 */
  XM_ERR_IO = 2,            /* a file could not be read or written: exit 2 */
  XM_ERR_UNSUPPORTED = 3,   /* valid input that this version cannot do: exit 2 */
  XM_ERR_NO_MEMORY = 4,     /* allocation failed or a size overflowed: exit 1 */
  XM_ERR_INTERNAL = 5,      /* a pass or foreign library failed: exit 1 */
} xm_status_t;

/* Name of a status class, for messages. */
const char *xm_status_name(xm_status_t s);

/* Process exit code for a status (0, 1 or 2). */
int xm_status_exit_code(xm_status_t s);

#define XM_RETURN_IF_ERROR(expr)                                               \
  do {                                                                         \
    xm_status_t xm_status_tmp_ = (expr);                                       \
    if (xm_status_tmp_ != XM_OK) return xm_status_tmp_;                        \
  } while (0)

/* Broken internal invariant: a bug in xmoec, never a user error. */
#define XM_ASSERT(cond)                                                        \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "xmoec: internal error: %s:%d: assertion '%s' failed\n", \
              __FILE__, __LINE__, #cond);                                      \
      abort();                                                                 \
    }                                                                          \
  } while (0)

#endif /* XM_SUPPORT_STATUS_H */
