/* runtime/abi/host_backend.h — the table functions of a backend whose device
 * memory is host memory and whose streams run each call where it is made:
 * the CPU backend (runtime/cpu/backend.c) and the emulated GPU
 * (runtime/emu/backend.c) fill their tables (runtime/abi/backend.h) with
 * these, so the two differ only where they mean to (name, host_visible,
 * alignment, init, kernels).
 *
 * alloc puts a header of be->alignment bytes before each block, which keeps
 * the block's size for allocated_bytes and keeps the block aligned; every
 * stream and event is one static object, since nothing is ever pending.
 * The includer defines _GNU_SOURCE first (sched_getaffinity).
 */
#ifndef XM_RUNTIME_ABI_HOST_BACKEND_H
#define XM_RUNTIME_ABI_HOST_BACKEND_H

#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/abi/backend.h"

struct xm_rt_stream {
  int unused;
};
struct xm_rt_event {
  int unused;
};
static struct xm_rt_stream xm_host_stream_obj;
static struct xm_rt_event xm_host_event_obj;

/* The cores of this machine divided among its `local_ranks` ranks, bounded
 * by the cores the launcher bound this process to; at least 1. */
static inline int xm_host_cores(int local_ranks) {
  cpu_set_t set;
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  int avail = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : (int)online;
  int n = (int)(online / (local_ranks > 0 ? local_ranks : 1));
  if (avail < n) n = avail;
  return n < 1 ? 1 : n;
}

/* Zeroed memory of `bytes` rounded up to be->alignment; alloc(0) gets a
 * block of its own. */
static inline void *xm_host_alloc(xm_rt_backend_t *be, size_t bytes) {
  size_t a = be->alignment;
  size_t size = (bytes + a - 1) / a * a;
  if (size < bytes || size > SIZE_MAX - 2 * a) return NULL;
  unsigned char *b = aligned_alloc(a, a + (size ? size : a));
  if (!b) return NULL;
  memset(b, 0, a + (size ? size : a));
  memcpy(b, &size, sizeof size);
  be->allocated_bytes += (int64_t)size;
  return b + a;
}

static inline void xm_host_free(xm_rt_backend_t *be, void *p) {
  if (!p) return;
  unsigned char *b = (unsigned char *)p - be->alignment;
  size_t size;
  memcpy(&size, b, sizeof size);
  be->allocated_bytes -= (int64_t)size;
  free(b);
}

static inline void xm_host_copy(xm_rt_backend_t *be, void *dst, const void *src, size_t bytes,
                                xm_rt_stream_t *s) {
  (void)be;
  (void)s;
  if (bytes && dst != src) memmove(dst, src, bytes);
}

static inline void xm_host_fill32(xm_rt_backend_t *be, void *dst, uint32_t pattern, size_t n,
                                  xm_rt_stream_t *s) {
  (void)be;
  (void)s;
  if (pattern == 0) {
    memset(dst, 0, n * sizeof(uint32_t));
    return;
  }
  uint32_t *d = dst;
  for (size_t i = 0; i < n; i++)
    d[i] = pattern;
}

static inline void xm_host_read(xm_rt_backend_t *be, void *dst, const void *src, size_t bytes,
                                xm_rt_stream_t *s) {
  be->reads++;
  xm_host_copy(be, dst, src, bytes, s);
}

static inline xm_rt_stream_t *xm_host_stream_create(xm_rt_backend_t *be) {
  (void)be;
  return &xm_host_stream_obj;
}
static inline void xm_host_stream_destroy(xm_rt_backend_t *be, xm_rt_stream_t *s) {
  (void)be;
  (void)s;
}
static inline xm_rt_event_t *xm_host_event_create(xm_rt_backend_t *be) {
  (void)be;
  return &xm_host_event_obj;
}
static inline void xm_host_event_destroy(xm_rt_backend_t *be, xm_rt_event_t *e) {
  (void)be;
  (void)e;
}
static inline void xm_host_event_record(xm_rt_backend_t *be, xm_rt_event_t *e,
                                        xm_rt_stream_t *s) {
  (void)be;
  (void)e;
  (void)s;
}
static inline void xm_host_stream_wait(xm_rt_backend_t *be, xm_rt_stream_t *s,
                                       xm_rt_event_t *e) {
  (void)be;
  (void)s;
  (void)e;
}
static inline void xm_host_event_sync(xm_rt_backend_t *be, xm_rt_event_t *e) {
  (void)be;
  (void)e;
}
static inline void xm_host_sync(xm_rt_backend_t *be, xm_rt_stream_t *s) {
  (void)be;
  (void)s;
}

/* The table entries above, for a designated initializer of a backend. */
#define XM_HOST_BACKEND_CALLS                                                                      \
  .alloc = xm_host_alloc, .free = xm_host_free, .copy_h2d = xm_host_copy,                         \
  .copy_d2h = xm_host_copy, .copy_d2d = xm_host_copy, .fill32 = xm_host_fill32,                   \
  .read = xm_host_read, .stream_create = xm_host_stream_create,                                   \
  .stream_destroy = xm_host_stream_destroy, .event_create = xm_host_event_create,                 \
  .event_destroy = xm_host_event_destroy, .event_record = xm_host_event_record,                   \
  .stream_wait = xm_host_stream_wait, .event_sync = xm_host_event_sync, .sync = xm_host_sync

#endif /* XM_RUNTIME_ABI_HOST_BACKEND_H */
