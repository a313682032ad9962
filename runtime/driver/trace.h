/* runtime/driver/trace.h — the measured step timeline of `out/train --trace FILE`.
 *
 * The generated program (codegen/c_program.c) puts one hook on the comment
 * line of every op that runs code (every op of the micro and step functions
 * except input and return):
 *
 *   / * op 17 matmul @/model/heads layer 0 * / XM_TRACE_OP(x, 17, "matmul", 0, XM_RT_TRACE_FWD);
 *
 * and XM_TRACE_DONE(x) at the end of each function. With tracing off
 * (x->trace NULL, always outside the traced steps) a hook is one load and
 * one predictable branch. With tracing on it reads a monotonic clock once:
 * an op's event runs from its hook to the next hook (or the function's
 * end), so the few statements that emit no code (declarations, aliased
 * reshapes) are charged to the op before them and no time of a function
 * goes missing.
 *
 * The recorder keeps, per event: the optimizer step, the micro-batch index
 * (-1 for the step function), the op index (its position in OUT/model.xir,
 * the same index `xmoec inspect --format trace` gives the predicted event),
 * the layer (-1 for none), the flags and start and end times. Writing is
 * collective: every rank sends its events to rank 0, which writes one Chrome
 * / Perfetto trace JSON (docs/inspect.md): pid = world rank, tid 0 compute,
 * tid 1 collectives, ts and dur in microseconds from the earliest event of
 * any rank.
 */
#ifndef XM_RUNTIME_TRACE_H
#define XM_RUNTIME_TRACE_H

#include <stdint.h>
#include <stdio.h>

#include "runtime/comm/context.h"
#include "runtime/abi/program.h"
#include "support/status.h"

/* Hook flags: the phase (one of the first three) | XM_RT_TRACE_COMM for a
 * collective. */
enum {
  XM_RT_TRACE_FWD = 0,
  XM_RT_TRACE_BWD = 1,
  XM_RT_TRACE_STEP = 2,
  XM_RT_TRACE_PHASE_MASK = 3,
  XM_RT_TRACE_COMM = 4,
};

typedef struct xm_rt_trace xm_rt_trace_t;

/* The hooks of generated code. `name` must outlive the recorder (the
 * generated code passes string literals). */
void xm_rt_trace_op(xm_rt_exec_t *x, int op, const char *name, int layer, int flags);
void xm_rt_trace_done(xm_rt_exec_t *x);

#define XM_TRACE_OP(x, op, name, layer, flags)                                                     \
  do {                                                                                             \
    if (__builtin_expect((x)->trace != NULL, 0))                                                   \
      xm_rt_trace_op((x), (op), (name), (layer), (flags));                                         \
  } while (0)
#define XM_TRACE_DONE(x)                                                                           \
  do {                                                                                             \
    if (__builtin_expect((x)->trace != NULL, 0)) xm_rt_trace_done(x);                              \
  } while (0)

/* An empty recorder; the caller owns it (xm_rt_trace_destroy). NULL when
 * out of memory. */
xm_rt_trace_t *xm_rt_trace_create(void);
void xm_rt_trace_destroy(xm_rt_trace_t *t);

/* What the following events belong to: optimizer step `step`, micro-batch
 * `micro` (-1: the step function). Set by the driver before each call. */
void xm_rt_trace_set(xm_rt_trace_t *t, int64_t step, int micro);

/* Events recorded so far, and whether some were lost (out of memory). */
int64_t xm_rt_trace_count(const xm_rt_trace_t *t);
int xm_rt_trace_truncated(const xm_rt_trace_t *t);

/* Copies event i out (for tests): op, micro, layer, flags, step, and the
 * start and end in seconds of the monotonic clock. */
void xm_rt_trace_event(const xm_rt_trace_t *t, int64_t i, int *op, int *micro, int *layer,
                       int *flags, int64_t *step, double *start, double *end);

/* Collective over ctx->world_comm: rank 0 gathers every rank's events and
 * writes the trace JSON to `f` (rank 0's stream; other ranks pass NULL).
 * `model` names the program in the trace's metadata. Returns the agreed
 * status: XM_ERR_IO when rank 0 cannot write, XM_ERR_NO_MEMORY when it
 * cannot hold the events. */
xm_status_t xm_rt_trace_write(xm_rt_trace_t *t, const xm_rt_context_t *ctx, const char *model,
                              FILE *f);

#endif /* XM_RUNTIME_TRACE_H */
