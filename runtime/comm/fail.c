/* runtime/comm/fail.c — the one way generated code stops the program.
 *
 * A generated schedule checks what the memory plan could only bound at
 * compile time (the number of routed rows after permute, later the rows an
 * all-to-all delivers); when a check fails nothing sensible can continue on
 * any rank, so the message goes out with the rank and every rank ends
 * through xm_rt_abort (exit code 1: a runtime failure, not bad input).
 * Harnesses that run a program without a context (the gradient check)
 * still get the message and the exit code.
 *
 * xm_rt_fault is the fault-injection hook of the failure tests
 * (tests/e2e/train_failure.sh): XM_FAULT=nan:1:3 makes rank 1's loss NaN at
 * step 3, XM_FAULT=arena:1:3 gives rank 1's all-to-all receive buffers a
 * bound of 0 rows at step 3 (a memory plan too small for the routing).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/abi/program.h"
#include "runtime/comm/context.h"

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

/* XM_FAULT=KIND:RANK:STEP (tests only): true on world rank RANK while
 * optimizer step STEP runs, for the fault KIND asked about. Parsed once. */
int xm_rt_fault(const xm_rt_exec_t *x, const char *kind) {
  static int parsed = 0;
  static char want[16];
  static long rank = -1, step = -1;
  if (!parsed) {
    parsed = 1;
    const char *v = getenv("XM_FAULT");
    if (v && sscanf(v, "%15[a-z]:%ld:%ld", want, &rank, &step) != 3) rank = -1;
  }
  if (rank < 0 || !x || !x->ctx) return 0;
  return x->ctx->rank == rank && x->step == step && strcmp(want, kind) == 0;
}
