/* runtime/emu/backend.c — the emulated GPU backend: what the HIP and CUDA
 * backends do, on host memory, with the kernels of runtime/gpu/ run by the
 * emulator (runtime/emu/emu.h).
 *
 * It says its memory is not host-visible (host_visible 0), so the training
 * driver and the generated schedule take the GPU paths: host images of the
 * persistent arena moved with copy_h2d / copy_d2h at the edges, and every
 * value the host needs fetched with read. Streams run in order where they
 * are called, like the CPU backend's, since an emulated launch returns when
 * its grid has finished. The kernel table (for the conformance suite) is
 * the one of runtime/emu/table.cpp when the program links it, else NULL:
 * a generated program launches its own specialised kernels.
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "runtime/abi/backend.h"

#include <omp.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/abi/kernels.h"

/* Defined by runtime/emu/table.cpp, when linked. */
const xm_rt_kernels_t *xm_rt_emu_kernel_table(void) __attribute__((weak));

struct xm_rt_stream {
  int unused;
};
struct xm_rt_event {
  int unused;
};
static struct xm_rt_stream k_stream;
static struct xm_rt_event k_event;

enum { EMU_ALIGN = 256 }; /* what hipMalloc and cudaMalloc guarantee */

/* Blocks of a launch are shared among the cores this rank gets (as the CPU
 * backend divides them), OMP_NUM_THREADS winning when set. */
static int emu_init(xm_rt_backend_t *be, int local_rank, int local_ranks, int *threads,
                    char *err, size_t err_len) {
  (void)be;
  (void)local_rank;
  (void)err;
  (void)err_len;
  cpu_set_t set;
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  int avail = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : (int)online;
  int n = (int)(online / (local_ranks > 0 ? local_ranks : 1));
  if (avail < n) n = avail;
  if (n < 1) n = 1;
  if (!getenv("OMP_NUM_THREADS")) omp_set_num_threads(n);
  if (threads) *threads = omp_get_max_threads();
  return 0;
}

typedef struct {
  size_t bytes;
  unsigned char pad[EMU_ALIGN - sizeof(size_t)];
} block_t;

static void *emu_alloc(xm_rt_backend_t *be, size_t bytes) {
  size_t size = (bytes + EMU_ALIGN - 1) / EMU_ALIGN * EMU_ALIGN;
  if (size < bytes || size > SIZE_MAX - sizeof(block_t)) return NULL;
  block_t *b = aligned_alloc(EMU_ALIGN, sizeof(block_t) + (size ? size : EMU_ALIGN));
  if (!b) return NULL;
  memset(b, 0, sizeof(block_t) + (size ? size : EMU_ALIGN));
  b->bytes = size;
  be->allocated_bytes += (int64_t)size;
  return b + 1;
}

static void emu_free(xm_rt_backend_t *be, void *p) {
  if (!p) return;
  block_t *b = (block_t *)p - 1;
  be->allocated_bytes -= (int64_t)b->bytes;
  free(b);
}

static void emu_copy(xm_rt_backend_t *be, void *dst, const void *src, size_t bytes,
                     xm_rt_stream_t *s) {
  (void)be;
  (void)s;
  if (bytes && dst != src) memmove(dst, src, bytes);
}

static void emu_fill32(xm_rt_backend_t *be, void *dst, uint32_t pattern, size_t n,
                       xm_rt_stream_t *s) {
  (void)be;
  (void)s;
  uint32_t *d = dst;
  for (size_t i = 0; i < n; i++)
    d[i] = pattern;
}

static void emu_read(xm_rt_backend_t *be, void *dst, const void *src, size_t bytes,
                     xm_rt_stream_t *s) {
  be->reads++;
  emu_copy(be, dst, src, bytes, s);
}

static xm_rt_stream_t *emu_stream_create(xm_rt_backend_t *be) {
  (void)be;
  return &k_stream;
}
static void emu_stream_destroy(xm_rt_backend_t *be, xm_rt_stream_t *s) {
  (void)be;
  (void)s;
}
static xm_rt_event_t *emu_event_create(xm_rt_backend_t *be) {
  (void)be;
  return &k_event;
}
static void emu_event_destroy(xm_rt_backend_t *be, xm_rt_event_t *e) {
  (void)be;
  (void)e;
}
static void emu_event_record(xm_rt_backend_t *be, xm_rt_event_t *e, xm_rt_stream_t *s) {
  (void)be;
  (void)e;
  (void)s;
}
static void emu_stream_wait(xm_rt_backend_t *be, xm_rt_stream_t *s, xm_rt_event_t *e) {
  (void)be;
  (void)s;
  (void)e;
}
static void emu_event_sync(xm_rt_backend_t *be, xm_rt_event_t *e) {
  (void)be;
  (void)e;
}
static void emu_sync(xm_rt_backend_t *be, xm_rt_stream_t *s) {
  (void)be;
  (void)s;
}

static xm_rt_backend_t k_emu = {
    .name = "emu",
    .host_visible = 0,
    .alignment = EMU_ALIGN,
    .init = emu_init,
    .alloc = emu_alloc,
    .free = emu_free,
    .copy_h2d = emu_copy,
    .copy_d2h = emu_copy,
    .copy_d2d = emu_copy,
    .fill32 = emu_fill32,
    .read = emu_read,
    .stream_create = emu_stream_create,
    .stream_destroy = emu_stream_destroy,
    .event_create = emu_event_create,
    .event_destroy = emu_event_destroy,
    .event_record = emu_event_record,
    .stream_wait = emu_stream_wait,
    .event_sync = emu_event_sync,
    .sync = emu_sync,
    .kernels = NULL,
};

xm_rt_backend_t *xm_rt_emu_backend(void) {
  if (!k_emu.kernels && xm_rt_emu_kernel_table) k_emu.kernels = xm_rt_emu_kernel_table();
  return &k_emu;
}

xm_rt_backend_t *xm_rt_backend_default(void) { return xm_rt_emu_backend(); }
