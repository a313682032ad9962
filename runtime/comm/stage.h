/* runtime/comm/stage.h — staging through host memory, for the collectives
 * of runtime/comm/spmd.c and the RBD exchanges of runtime/moe/rbd_exec.c.
 *
 * They work on host memory. A backend whose memory the host cannot address
 * (host_visible 0: the HIP and CUDA backends, and the emulated one, which
 * says so to take this path) gets each call's buffers staged: the exec's
 * stream is synchronised, the inputs are copied to host buffers, the call
 * runs on them, and the outputs are copied back and waited for before the
 * host buffers go (docs/design.md, The GPU path).
 */
#ifndef XM_RUNTIME_COMM_STAGE_H
#define XM_RUNTIME_COMM_STAGE_H

#include <stdint.h>
#include <stdlib.h>

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

#endif /* XM_RUNTIME_COMM_STAGE_H */
