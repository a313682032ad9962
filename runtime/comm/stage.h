/* runtime/comm/stage.h — staging through host memory, for the collectives
 * of runtime/comm/spmd.c and the RBD exchanges of runtime/moe/rbd_exec.c.
 *
 * They work on host memory. A backend whose memory the host cannot address
 * (host_visible 0: the HIP and CUDA backends, and the emulated one, which
 * says so to take this path) gets each call's buffers staged: the exec's
 * stream is synchronised, the inputs are copied to host buffers, the call
 * runs on them, and the outputs are copied back and waited for before the
 * host buffers are used again (docs/design.md, The GPU path). Where the
 * device transport moves device memory itself (runtime/comm/transport.h:
 * NCCL, GPU-aware MPI), only the small count arrays still come this way.
 *
 * Host buffers. The collectives take theirs from an xm_rt_stage_t, a few
 * grow-only buffers (slots) that the communicator's transport keeps for
 * the whole run, so a step allocates nothing: one call uses each slot at
 * most once, and a slot only grows (the sizes of a schedule repeat every
 * step). Without a stage (a run without a communicator: the one-rank
 * harnesses) a slot is a fresh allocation that xm_rt_stage_done frees.
 * xm_rt_stage_in / xm_rt_stage_out are the per-call form that RBD uses.
 */
#ifndef XM_RUNTIME_COMM_STAGE_H
#define XM_RUNTIME_COMM_STAGE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/abi/program.h"

/* Whether the exec's buffers must be staged. */
static inline int xm_rt_staged(const xm_rt_exec_t *x) { return x->be && !x->be->host_visible; }

/* A host copy of n elements of `size` bytes of device memory (after the
 * stream is done), or zeroed host memory when dev is NULL; free() it. */
static inline void *xm_rt_stage_in(xm_rt_exec_t *x, const void *dev, int64_t n, size_t size,
                                   const char *what) {
  size_t bytes = (size_t)(n > 0 ? n : 0) * size;
  void *h = calloc(1, bytes ? bytes : 1);
  if (!h) xm_rt_fail(x, "%s: out of host memory for %zu bytes of staging", what, bytes);
  if (dev && bytes) x->be->copy_d2h(x->be, h, dev, bytes, x->stream);
  x->be->sync(x->be, x->stream);
  return h;
}

/* Copies n elements back to the device and waits for them. */
static inline void xm_rt_stage_out(xm_rt_exec_t *x, void *dev, const void *h, int64_t n,
                                   size_t size) {
  if (dev && n > 0) x->be->copy_h2d(x->be, dev, h, (size_t)n * size, x->stream);
  x->be->sync(x->be, x->stream);
}

/* ---- grow-only slots ---- */

enum { XM_RT_STAGE_SLOTS = 4 }; /* the most host buffers one collective stages */

typedef struct {
  void *buf[XM_RT_STAGE_SLOTS];
  size_t cap[XM_RT_STAGE_SLOTS];
} xm_rt_stage_t;

/* Host memory of `bytes` in slot `slot` of st (NULL: a fresh allocation):
 * a copy of dev once the stream is done, or, when dev is NULL, an output
 * buffer whose contents are unspecified (every caller writes what it
 * copies back). Valid until the slot is asked for again; hand it to
 * xm_rt_stage_done. */
static inline void *xm_rt_stage_get(xm_rt_exec_t *x, xm_rt_stage_t *st, int slot, const void *dev,
                                    size_t bytes, const char *what) {
  void *h;
  if (!st) {
    h = malloc(bytes ? bytes : 1);
  } else {
    if (slot < 0 || slot >= XM_RT_STAGE_SLOTS) xm_rt_fail(x, "%s: staging slot %d", what, slot);
    if (st->cap[slot] < bytes || !st->buf[slot]) {
      /* Rounded up to 64 KiB so that sizes creeping up do not regrow each
       * call; the old contents are not needed. */
      size_t cap = bytes < ((size_t)1 << 16) ? ((size_t)1 << 16) : bytes + ((size_t)1 << 16) - 1;
      cap &= ~(((size_t)1 << 16) - 1);
      free(st->buf[slot]);
      st->buf[slot] = malloc(cap);
      st->cap[slot] = st->buf[slot] ? cap : 0;
    }
    h = st->buf[slot];
  }
  if (!h) xm_rt_fail(x, "%s: out of host memory for %zu bytes of staging", what, bytes);
  if (dev && bytes) x->be->copy_d2h(x->be, h, dev, bytes, x->stream);
  x->be->sync(x->be, x->stream);
  return h;
}

/* Copies `bytes` of h back to dev and waits for them (the host buffer may
 * be reused at once). */
static inline void xm_rt_stage_put(xm_rt_exec_t *x, void *dev, const void *h, size_t bytes) {
  if (dev && bytes) x->be->copy_h2d(x->be, dev, h, bytes, x->stream);
  x->be->sync(x->be, x->stream);
}

/* The end of a buffer's use: frees it when it was not a slot. */
static inline void xm_rt_stage_done(xm_rt_stage_t *st, void *h) {
  if (!st) free(h);
}

/* Frees the slots (at exit). */
static inline void xm_rt_stage_free(xm_rt_stage_t *st) {
  if (!st) return;
  for (int i = 0; i < XM_RT_STAGE_SLOTS; i++)
    free(st->buf[i]);
  memset(st, 0, sizeof *st);
}

#endif /* XM_RUNTIME_COMM_STAGE_H */
