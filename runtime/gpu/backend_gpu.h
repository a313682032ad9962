/* runtime/gpu/backend_gpu.h — the logic of the HIP and CUDA backends
 * (runtime/abi/backend.h), written once against the vendor's runtime C API
 * through a few macros (as ggml's vendors/hip.h maps one API onto the
 * other). Included once, by runtime/hip/backend.c or runtime/cuda/backend.c,
 * which first include the vendor's runtime API header and define:
 *
 *   XM_GPU_NAME            "hip" / "cuda": the backend's name and the prefix
 *                          of the runtime calls in error messages
 *   XM_GPU_LABEL           "HIP" / "CUDA", for messages
 *   XM_GPU_API(x)          hip##x / cuda##x: every runtime function, type and
 *                          constant used here (Malloc, Error_t, Success, ...)
 *   XM_GPU_ERROR_OOM       the out-of-memory error of Malloc
 *   XM_GPU_FILL32(d,p,n,s) queues n 32-bit words of pattern p at d on stream
 *                          s and returns the runtime's error code
 *   XM_GPU_FILL32_CALL     what XM_GPU_FILL32 calls, for its error message
 *   XM_GPU_KERNEL_TABLE    the accessor of the backend's kernel table file
 *                          (runtime/hip/table.hip, runtime/cuda/table.cu)
 *
 * Device memory is not host-visible. The backend owns one non-blocking
 * stream, the default stream: every call given a NULL stream queues there,
 * and so do the kernel table's launches (xm_g_table_stream). Non-blocking
 * streams do not synchronise with the runtime's legacy NULL stream, so
 * nothing here ever uses that one for work: zeroing at alloc and every copy
 * go on a stream of ours.
 *
 * Errors: init reports a missing device or runtime as -1 with a message.
 * After init, a failing runtime call (a bad launch seen at a sync, a copy
 * to a freed pointer) is fatal: gpu_fail prints
 * "xmoec: <backend>: <op>: <call>: <error string>" and exits with code 1;
 * running on with a device in an unknown state would only move the failure
 * elsewhere. The two expected failures are not errors: Malloc out of
 * memory (alloc returns NULL) and a stream or event the runtime cannot make
 * (stream_create / event_create return NULL).
 *
 * Calls come from one host thread, as for the other backends (the table of
 * live allocations below is not locked).
 */
#ifndef XM_RUNTIME_GPU_BACKEND_GPU_H
#define XM_RUNTIME_GPU_BACKEND_GPU_H

#if !defined(XM_GPU_NAME) || !defined(XM_GPU_LABEL) || !defined(XM_GPU_API) ||                     \
    !defined(XM_GPU_ERROR_OOM) || !defined(XM_GPU_FILL32) || !defined(XM_GPU_FILL32_CALL) ||       \
    !defined(XM_GPU_KERNEL_TABLE)
#error "runtime/gpu/backend_gpu.h: the including backend.c defines the XM_GPU_* macros first"
#endif

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/abi/backend.h"
#include "runtime/abi/kernels.h"

typedef XM_GPU_API(Error_t) gpu_err_t;
typedef XM_GPU_API(Stream_t) gpu_stream_t;
typedef XM_GPU_API(Event_t) gpu_event_t;

/* The kernel table file, when the program links it (the conformance suite
 * does; a generated program launches its own specialised kernels), and the
 * stream its entries launch on (runtime/gpu/table.cuh: an xm_stream_t, the
 * vendor's stream handle, which C sees as a pointer). */
const xm_rt_kernels_t *XM_GPU_KERNEL_TABLE(void) __attribute__((weak));
extern void *xm_g_table_stream __attribute__((weak));

enum { GPU_ALIGN = 256 }; /* what hipMalloc and cudaMalloc guarantee */

static gpu_stream_t g_stream; /* the default stream; NULL before init */
static int g_device = -1;     /* the device init selected */

/* ---- errors --------------------------------------------------------------- */

/* The one place a runtime error after init ends the process: `op` is the
 * backend call, `call` the runtime function that failed. */
static void gpu_fail(const char *op, const char *call, gpu_err_t e) {
  fflush(stdout);
  fprintf(stderr, "xmoec: %s: %s: %s: %s\n", XM_GPU_NAME, op, call, XM_GPU_API(GetErrorString)(e));
  exit(1);
}

/* GPU_CHECK(op, Call, (args)): calls XM_GPU_API(Call) args, fatal on error
 * (`Call` without its prefix; the message names the real function). */
#define GPU_CHECK(op, call, args)                                                                  \
  do {                                                                                             \
    gpu_err_t gpu_e_ = XM_GPU_API(call) args;                                                      \
    if (gpu_e_ != XM_GPU_API(Success)) gpu_fail(op, XM_GPU_NAME #call, gpu_e_);                    \
  } while (0)

/* A launch error the runtime keeps for the next GetLastError (kernel
 * launches through <<<>>> return nothing): checked at every point the host
 * waits, so a failed launch stops the program there. */
static void gpu_check_launches(const char *op) {
  gpu_err_t e = XM_GPU_API(GetLastError)();
  if (e != XM_GPU_API(Success)) gpu_fail(op, "a kernel launch (" XM_GPU_NAME "GetLastError)", e);
}

static gpu_stream_t gpu_s(xm_rt_stream_t *s) { return s ? (gpu_stream_t)s : g_stream; }

static void gpu_msg(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void gpu_msg(char *err, size_t err_len, const char *fmt, ...) {
  if (!err || !err_len) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, err_len, fmt, ap);
  va_end(ap);
}

/* ---- init ---------------------------------------------------------------- */

/* One rank per GPU: rank local_rank takes device local_rank % count. A
 * launcher that sets HIP_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES per rank
 * leaves each process a count of 1, so every rank takes its device 0;
 * more ranks than devices share them round-robin. Never aborts: no device,
 * no driver or a runtime that fails to start is -1 with the reason. A second
 * call (the conformance test probes for a device before the suite's own
 * init) selects the device again and keeps the stream. */
static int gpu_init(xm_rt_backend_t *be, int local_rank, int local_ranks, int *threads, char *err,
                    size_t err_len) {
  (void)local_ranks;
  int count = 0;
  gpu_err_t e = XM_GPU_API(GetDeviceCount)(&count);
  if (e != XM_GPU_API(Success) || count < 1) {
    (void)XM_GPU_API(GetLastError)();
    gpu_msg(err, err_len,
            "no " XM_GPU_LABEL " device visible to this process (" XM_GPU_NAME
            "GetDeviceCount: %s)",
            e != XM_GPU_API(Success) ? XM_GPU_API(GetErrorString)(e) : "0 devices");
    return -1;
  }
  int dev = (local_rank > 0 ? local_rank : 0) % count;
  e = XM_GPU_API(SetDevice)(dev);
  if (e != XM_GPU_API(Success)) {
    (void)XM_GPU_API(GetLastError)();
    gpu_msg(err, err_len,
            "cannot select " XM_GPU_LABEL " device %d of %d (" XM_GPU_NAME "SetDevice: %s)", dev,
            count, XM_GPU_API(GetErrorString)(e));
    return -1;
  }
  if (g_stream && g_device != dev) {
    (void)XM_GPU_API(StreamDestroy)(g_stream);
    g_stream = NULL;
  }
  if (!g_stream) {
    e = XM_GPU_API(StreamCreateWithFlags)(&g_stream, XM_GPU_API(StreamNonBlocking));
    if (e != XM_GPU_API(Success)) {
      (void)XM_GPU_API(GetLastError)();
      g_stream = NULL;
      gpu_msg(err, err_len,
              "cannot create a stream on " XM_GPU_LABEL " device %d (" XM_GPU_NAME
              "StreamCreateWithFlags: %s)",
              dev, XM_GPU_API(GetErrorString)(e));
      return -1;
    }
  }
  g_device = dev;
  if (&xm_g_table_stream) xm_g_table_stream = (void *)g_stream;
  if (!be->kernels && XM_GPU_KERNEL_TABLE) be->kernels = XM_GPU_KERNEL_TABLE();
  if (threads) *threads = 1;
  return 0;
}

/* ---- live allocations: device pointer -> bytes, for allocated_bytes ------
 * Open addressing with linear probing; device pointers are GPU_ALIGN-aligned,
 * so 0 marks an empty slot and 1 a freed one. */
typedef struct {
  uintptr_t p;
  size_t bytes;
} gpu_slot_t;
enum { SLOT_EMPTY = 0, SLOT_FREED = 1 };
static gpu_slot_t *g_slots;
static size_t g_cap, g_taken, g_live; /* slots; slots not empty; live ones */

static size_t gpu_hash(uintptr_t p, size_t cap) {
  uint64_t h = (uint64_t)p * 0x9e3779b97f4a7c15ull;
  return (size_t)(h >> 17) & (cap - 1);
}

/* Room for one more; 0 when the host has no memory for the table. A full
 * table is rebuilt without its freed slots, at least 4 slots per live one. */
static int gpu_slots_reserve(void) {
  if (2 * (g_taken + 1) <= g_cap) return 1;
  size_t cap = 64;
  while (cap < 4 * (g_live + 1)) cap *= 2;
  gpu_slot_t *n = calloc(cap, sizeof *n);
  if (!n) return 0;
  size_t taken = 0;
  for (size_t i = 0; i < g_cap; i++) {
    if (g_slots[i].p == SLOT_EMPTY || g_slots[i].p == SLOT_FREED) continue;
    size_t j = gpu_hash(g_slots[i].p, cap);
    while (n[j].p != SLOT_EMPTY)
      j = (j + 1) & (cap - 1);
    n[j] = g_slots[i];
    taken++;
  }
  free(g_slots);
  g_slots = n;
  g_cap = cap;
  g_taken = taken;
  return 1;
}

static void gpu_slots_put(uintptr_t p, size_t bytes) {
  size_t j = gpu_hash(p, g_cap);
  while (g_slots[j].p != SLOT_EMPTY)
    j = (j + 1) & (g_cap - 1);
  g_slots[j].p = p;
  g_slots[j].bytes = bytes;
  g_taken++;
  g_live++;
}

/* The bytes of live allocation p, which it forgets; 0 if p is unknown. */
static size_t gpu_slots_take(uintptr_t p) {
  if (!g_cap) return 0;
  for (size_t j = gpu_hash(p, g_cap); g_slots[j].p != SLOT_EMPTY; j = (j + 1) & (g_cap - 1))
    if (g_slots[j].p == p) {
      g_slots[j].p = SLOT_FREED;
      g_live--;
      return g_slots[j].bytes;
    }
  return 0;
}

/* ---- memory --------------------------------------------------------------- */

/* Zeroed device memory, whole GPU_ALIGN units (alloc(0) takes one, so the
 * pointer is valid and unique); NULL when the device (or the host, for the
 * bookkeeping) has no room. Zeroed on the default stream, which is then
 * waited for: the memory is zero for whichever stream uses it first. */
static void *gpu_alloc(xm_rt_backend_t *be, size_t bytes) {
  size_t size = bytes ? (bytes + GPU_ALIGN - 1) / GPU_ALIGN * GPU_ALIGN : GPU_ALIGN;
  if (size < bytes) return NULL;
  if (!gpu_slots_reserve()) return NULL;
  void *p = NULL;
  gpu_err_t e = XM_GPU_API(Malloc)(&p, size);
  if (e == XM_GPU_ERROR_OOM) {
    (void)XM_GPU_API(GetLastError)(); /* not a launch error for a later check */
    return NULL;
  }
  if (e != XM_GPU_API(Success)) gpu_fail("alloc", XM_GPU_NAME "Malloc", e);
  if (!p) return NULL;
  GPU_CHECK("alloc", MemsetAsync, (p, 0, size, g_stream));
  GPU_CHECK("alloc", StreamSynchronize, (g_stream));
  gpu_slots_put((uintptr_t)p, size);
  be->allocated_bytes += (int64_t)size;
  return p;
}

/* Free waits for the device's work on the memory (the runtime's Free
 * synchronises), so queued kernels never see it freed. */
static void gpu_free(xm_rt_backend_t *be, void *p) {
  if (!p) return;
  be->allocated_bytes -= (int64_t)gpu_slots_take((uintptr_t)p);
  GPU_CHECK("free", Free, (p));
}

/* ---- copies and fills ------------------------------------------------------
 * Asynchronous copies on the stream. Pageable host memory is allowed: the
 * runtime stages it, which meets backend.h's contract (the host buffer of
 * copy_h2d stays valid until the stream reaches the copy; copy_d2h's is
 * written when the stream gets there, possibly before the call returns).
 * Overlapping copy_d2d ranges are not supported (the runtime's memcpy). */
static void gpu_copy_h2d(xm_rt_backend_t *be, void *dst, const void *src, size_t bytes,
                         xm_rt_stream_t *s) {
  (void)be;
  if (!bytes) return;
  GPU_CHECK("copy_h2d", MemcpyAsync, (dst, src, bytes, XM_GPU_API(MemcpyHostToDevice), gpu_s(s)));
}

static void gpu_copy_d2h(xm_rt_backend_t *be, void *dst, const void *src, size_t bytes,
                         xm_rt_stream_t *s) {
  (void)be;
  if (!bytes) return;
  GPU_CHECK("copy_d2h", MemcpyAsync, (dst, src, bytes, XM_GPU_API(MemcpyDeviceToHost), gpu_s(s)));
}

static void gpu_copy_d2d(xm_rt_backend_t *be, void *dst, const void *src, size_t bytes,
                         xm_rt_stream_t *s) {
  (void)be;
  if (!bytes || dst == src) return;
  GPU_CHECK("copy_d2d", MemcpyAsync, (dst, src, bytes, XM_GPU_API(MemcpyDeviceToDevice), gpu_s(s)));
}

/* A pattern of four equal bytes (0 above all) is a byte memset; any other
 * goes to the backend's 32-bit fill. */
static void gpu_fill32(xm_rt_backend_t *be, void *dst, uint32_t pattern, size_t n,
                       xm_rt_stream_t *s) {
  (void)be;
  if (!n) return;
  uint32_t b = pattern & 0xffu;
  if (pattern == b * 0x01010101u && n <= SIZE_MAX / 4) {
    GPU_CHECK("fill32", MemsetAsync, (dst, (int)b, n * 4, gpu_s(s)));
    return;
  }
  gpu_err_t e = XM_GPU_FILL32(dst, pattern, n, gpu_s(s));
  if (e != XM_GPU_API(Success)) gpu_fail("fill32", XM_GPU_FILL32_CALL, e);
}

/* The host read: the copy is queued behind everything on the stream and the
 * stream is waited for, so when it returns the stream's earlier work is done
 * and dst holds the bytes. */
static void gpu_read(xm_rt_backend_t *be, void *dst, const void *src, size_t bytes,
                     xm_rt_stream_t *s) {
  be->reads++;
  gpu_stream_t st = gpu_s(s);
  if (bytes) GPU_CHECK("read", MemcpyAsync, (dst, src, bytes, XM_GPU_API(MemcpyDeviceToHost), st));
  GPU_CHECK("read", StreamSynchronize, (st));
  gpu_check_launches("read");
}

/* ---- streams and events ---------------------------------------------------
 * An xm_rt_stream_t * is the runtime's stream handle, an xm_rt_event_t * its
 * event handle (never NULL for a created one). */
static xm_rt_stream_t *gpu_stream_create(xm_rt_backend_t *be) {
  (void)be;
  gpu_stream_t s = NULL;
  if (XM_GPU_API(StreamCreateWithFlags)(&s, XM_GPU_API(StreamNonBlocking)) != XM_GPU_API(Success)) {
    (void)XM_GPU_API(GetLastError)();
    return NULL;
  }
  return (xm_rt_stream_t *)s;
}

static void gpu_stream_destroy(xm_rt_backend_t *be, xm_rt_stream_t *s) {
  (void)be;
  if (!s || (gpu_stream_t)s == g_stream) return; /* the default stream stays */
  GPU_CHECK("stream_destroy", StreamDestroy, ((gpu_stream_t)s));
}

static xm_rt_event_t *gpu_event_create(xm_rt_backend_t *be) {
  (void)be;
  gpu_event_t e = NULL;
  if (XM_GPU_API(EventCreateWithFlags)(&e, XM_GPU_API(EventDisableTiming)) != XM_GPU_API(Success)) {
    (void)XM_GPU_API(GetLastError)();
    return NULL;
  }
  return (xm_rt_event_t *)e;
}

static void gpu_event_destroy(xm_rt_backend_t *be, xm_rt_event_t *e) {
  (void)be;
  if (!e) return;
  GPU_CHECK("event_destroy", EventDestroy, ((gpu_event_t)e));
}

static void gpu_event_record(xm_rt_backend_t *be, xm_rt_event_t *e, xm_rt_stream_t *s) {
  (void)be;
  GPU_CHECK("event_record", EventRecord, ((gpu_event_t)e, gpu_s(s)));
}

static void gpu_stream_wait(xm_rt_backend_t *be, xm_rt_stream_t *s, xm_rt_event_t *e) {
  (void)be;
  GPU_CHECK("stream_wait", StreamWaitEvent, (gpu_s(s), (gpu_event_t)e, 0));
}

static void gpu_event_sync(xm_rt_backend_t *be, xm_rt_event_t *e) {
  (void)be;
  GPU_CHECK("event_sync", EventSynchronize, ((gpu_event_t)e));
  gpu_check_launches("event_sync");
}

/* NULL: every stream of the device (DeviceSynchronize). */
static void gpu_sync(xm_rt_backend_t *be, xm_rt_stream_t *s) {
  (void)be;
  if (s)
    GPU_CHECK("sync", StreamSynchronize, ((gpu_stream_t)s));
  else
    GPU_CHECK("sync", DeviceSynchronize, ());
  gpu_check_launches("sync");
}

static xm_rt_backend_t g_backend = {
    .name = XM_GPU_NAME,
    .host_visible = 0,
    .alignment = GPU_ALIGN,
    .init = gpu_init,
    .alloc = gpu_alloc,
    .free = gpu_free,
    .copy_h2d = gpu_copy_h2d,
    .copy_d2h = gpu_copy_d2h,
    .copy_d2d = gpu_copy_d2d,
    .fill32 = gpu_fill32,
    .read = gpu_read,
    .stream_create = gpu_stream_create,
    .stream_destroy = gpu_stream_destroy,
    .event_create = gpu_event_create,
    .event_destroy = gpu_event_destroy,
    .event_record = gpu_event_record,
    .stream_wait = gpu_stream_wait,
    .event_sync = gpu_event_sync,
    .sync = gpu_sync,
    .kernels = NULL,
};

/* The backend, its kernel table set when the table file is linked. */
static xm_rt_backend_t *gpu_backend(void) {
  if (!g_backend.kernels && XM_GPU_KERNEL_TABLE) g_backend.kernels = XM_GPU_KERNEL_TABLE();
  return &g_backend;
}

#endif /* XM_RUNTIME_GPU_BACKEND_GPU_H */
