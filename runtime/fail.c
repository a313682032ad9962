/* runtime/fail.c — the one way generated code stops the program.
 *
 * A generated schedule checks what the memory plan could only bound at
 * compile time (the number of routed rows after permute, later the rows an
 * all-to-all delivers); when a check fails nothing sensible can continue on
 * any rank, so the message goes out with the rank and every rank ends
 * through xm_rt_abort (exit code 1: a runtime failure, not bad input).
 * Harnesses that run a program without a context (the gradient check)
 * still get the message and the exit code.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "runtime/program.h"

void xm_rt_fail(const xm_rt_exec_t *x, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (x && x->ctx) xm_rt_abort(x->ctx, 1, "%s", msg);
  fprintf(stderr, "xmoec: rank 0: %s\n", msg);
  fflush(stderr);
  exit(1);
}
