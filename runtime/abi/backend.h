/* runtime/abi/backend.h — the device seam: one table of functions per
 * backend that owns device memory and execution (docs/design.md, Backends).
 *
 * The training driver and the generated schedule never touch an arena with
 * memcpy or memset: they allocate, copy, fill, order and read through this
 * table, so that a backend whose memory the host cannot address (HIP, CUDA)
 * is one more implementation of it, in its own folder, and nothing above
 * changes. The CPU backend (runtime/cpu/backend.c) is the reference: its
 * memory is host memory, its streams run in order on the calling thread.
 *
 * Pointers the table hands out are device addresses. Only a backend whose
 * `host_visible` is 1 lets the host dereference them; the driver keeps host
 * images of what it must read or write (the persistent arena for
 * initialisation and checkpoints) and moves them with copy_h2d / copy_d2h
 * at the edges, which costs nothing where the image is the arena itself.
 *
 * Copies and fills are ordered on a stream like kernels: they are queued
 * and complete in stream order. `read` is the one call that makes the host
 * wait for a device value: the schedule uses it only where the IR has a
 * host_read op (the loss, the squared gradient norm, routed row counts), so
 * a GPU schedule knows at compile time every point where it synchronises.
 *
 * Modelled on ggml's backend interface (buffers, streams, events) and
 * IREE's HAL (a vtable per device object, one folder per driver).
 */
#ifndef XM_RUNTIME_BACKEND_H
#define XM_RUNTIME_BACKEND_H

#include <stddef.h>
#include <stdint.h>

typedef struct xm_rt_backend xm_rt_backend_t;
typedef struct xm_rt_stream xm_rt_stream_t; /* opaque, backend-defined */
typedef struct xm_rt_event xm_rt_event_t;   /* opaque, backend-defined */
struct xm_rt_kernels;                       /* runtime/abi/kernels.h */

struct xm_rt_backend {
  const char *name;   /* "cpu", "hip", "cuda" */
  int host_visible;   /* 1: device addresses are host addresses */
  size_t alignment;   /* of every allocation, a power of two >= 64 */

  /* Prepares the device for this process: `local_rank` of `local_ranks`
   * processes on this machine (the CPU backend divides the cores among
   * them; a GPU backend picks device local_rank). Returns 0, or -1 with a
   * message in err (for example: no device). Called once, before alloc;
   * `threads` gets the worker threads per rank (1 where not meaningful). */
  int (*init)(xm_rt_backend_t *be, int local_rank, int local_ranks, int *threads, char *err,
              size_t err_len);

  /* ---- memory ----
   * alloc: zeroed device memory of `bytes` (0 allowed: a valid, unique
   * pointer), or NULL when the device has no room. free accepts NULL. */
  void *(*alloc)(xm_rt_backend_t *be, size_t bytes);
  void (*free)(xm_rt_backend_t *be, void *p);

  /* ---- copies and fills, queued on `s` (NULL: the default stream) ----
   * The host buffer of copy_h2d must stay valid and unchanged until the
   * stream reaches the copy (sync, or an event after it); that of
   * copy_d2h is written when the stream gets there. fill32 writes n 32-bit
   * words of `pattern` (0 for zeros, a float's bits for a float fill). */
  void (*copy_h2d)(xm_rt_backend_t *be, void *dst, const void *src, size_t bytes,
                   xm_rt_stream_t *s);
  void (*copy_d2h)(xm_rt_backend_t *be, void *dst, const void *src, size_t bytes,
                   xm_rt_stream_t *s);
  void (*copy_d2d)(xm_rt_backend_t *be, void *dst, const void *src, size_t bytes,
                   xm_rt_stream_t *s);
  void (*fill32)(xm_rt_backend_t *be, void *dst, uint32_t pattern, size_t n, xm_rt_stream_t *s);

  /* ---- the explicit host read: waits until the stream has done all it was
   * given, then copies `bytes` from device `src` to host `dst`. */
  void (*read)(xm_rt_backend_t *be, void *dst, const void *src, size_t bytes,
               xm_rt_stream_t *s);

  /* ---- streams and events ----
   * stream_create: a new in-order queue, NULL on failure. event_record
   * marks the point the stream has reached; stream_wait makes a stream wait
   * for an event recorded on another; event_sync blocks the host until the
   * event's point is reached; sync blocks the host until the stream (NULL:
   * every stream of the device) has finished. */
  xm_rt_stream_t *(*stream_create)(xm_rt_backend_t *be);
  void (*stream_destroy)(xm_rt_backend_t *be, xm_rt_stream_t *s);
  xm_rt_event_t *(*event_create)(xm_rt_backend_t *be);
  void (*event_destroy)(xm_rt_backend_t *be, xm_rt_event_t *e);
  void (*event_record)(xm_rt_backend_t *be, xm_rt_event_t *e, xm_rt_stream_t *s);
  void (*stream_wait)(xm_rt_backend_t *be, xm_rt_stream_t *s, xm_rt_event_t *e);
  void (*event_sync)(xm_rt_backend_t *be, xm_rt_event_t *e);
  void (*sync)(xm_rt_backend_t *be, xm_rt_stream_t *s);

  /* The kernels (runtime/abi/kernels.h): one entry per line of
   * runtime/abi/kernels.def, every pointer argument a device address. */
  const struct xm_rt_kernels *kernels;

  /* Counters the tests read (the CPU backend keeps them; others may). */
  int64_t allocated_bytes; /* live bytes from alloc */
  int64_t reads;           /* calls of read: host synchronisation points */

  void *impl; /* the backend's own state */
};

/* The CPU backend: host memory, one in-order stream that runs where it is
 * called (runtime/cpu/backend.c). Never fails to initialise. */
xm_rt_backend_t *xm_rt_cpu_backend(void);

/* The emulated GPU backend: host memory presented as device memory, the
 * GPU kernels run by the CPU emulator (runtime/emu/backend.c). */
xm_rt_backend_t *xm_rt_emu_backend(void);
xm_rt_backend_t *xm_rt_hip_backend(void), *xm_rt_cuda_backend(void); /* runtime/{hip,cuda} */

/* The backend of the program: every backend archive defines it, and a
 * generated program links exactly one (the CPU backend's returns
 * xm_rt_cpu_backend()). */
xm_rt_backend_t *xm_rt_backend_default(void);

#endif /* XM_RUNTIME_BACKEND_H */
