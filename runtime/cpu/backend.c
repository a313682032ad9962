/* runtime/cpu/backend.c — the CPU backend: host memory and one in-order
 * stream that runs each call where it is made (runtime/abi/backend.h).
 *
 * Streams and events exist so that code written for a GPU backend runs here
 * unchanged: every queued call has finished when it returns, so recording,
 * waiting and synchronising have nothing to wait for. The kernel table
 * points at the xm_k_* functions of runtime/cpu/kernels.h.
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "runtime/abi/backend.h"

#include <cblas.h>
#include <omp.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/abi/kernels.h"
#include "runtime/cpu/kernels.h"

/* Every CPU stream and event is this one object: nothing is ever pending. */
struct xm_rt_stream {
  int unused;
};
struct xm_rt_event {
  int unused;
};
static struct xm_rt_stream k_stream;
static struct xm_rt_event k_event;

enum { CPU_ALIGN = 64 };

/* Default threads per rank: the cores of this machine divided among its
 * ranks, bounded by the cores the launcher bound the rank to; the user's
 * OMP_NUM_THREADS wins when set. That OpenMP team is the only thread pool:
 * the kernels cut every GEMM over it and run OpenBLAS single-threaded
 * inside (runtime/cpu/kernels_dense.c), whatever OPENBLAS_NUM_THREADS
 * says, because two pools on the same cores hand the cores back and forth
 * at every switch between a GEMM and an elementwise kernel
 * (docs/benchmarks.md, "Training step profile"). */
static int cpu_init(xm_rt_backend_t *be, int local_rank, int local_ranks, int *threads,
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
  openblas_set_num_threads(1);
  if (threads) *threads = omp_get_max_threads();
  return 0;
}

/* A header before each block keeps its size for the live-bytes counter. */
typedef struct {
  size_t bytes;
  unsigned char pad[CPU_ALIGN - sizeof(size_t)];
} block_t;

static void *cpu_alloc(xm_rt_backend_t *be, size_t bytes) {
  size_t size = (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
  if (size < bytes || size > SIZE_MAX - sizeof(block_t)) return NULL;
  block_t *b = aligned_alloc(CPU_ALIGN, sizeof(block_t) + (size ? size : CPU_ALIGN));
  if (!b) return NULL;
  memset(b, 0, sizeof(block_t) + (size ? size : CPU_ALIGN));
  b->bytes = size;
  be->allocated_bytes += (int64_t)size;
  return b + 1;
}

static void cpu_free(xm_rt_backend_t *be, void *p) {
  if (!p) return;
  block_t *b = (block_t *)p - 1;
  be->allocated_bytes -= (int64_t)b->bytes;
  free(b);
}

static void cpu_copy(xm_rt_backend_t *be, void *dst, const void *src, size_t bytes,
                     xm_rt_stream_t *s) {
  (void)be;
  (void)s;
  if (bytes && dst != src) memmove(dst, src, bytes);
}

static void cpu_fill32(xm_rt_backend_t *be, void *dst, uint32_t pattern, size_t n,
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

static void cpu_read(xm_rt_backend_t *be, void *dst, const void *src, size_t bytes,
                     xm_rt_stream_t *s) {
  be->reads++;
  cpu_copy(be, dst, src, bytes, s);
}

static xm_rt_stream_t *cpu_stream_create(xm_rt_backend_t *be) {
  (void)be;
  return &k_stream;
}
static void cpu_stream_destroy(xm_rt_backend_t *be, xm_rt_stream_t *s) {
  (void)be;
  (void)s;
}
static xm_rt_event_t *cpu_event_create(xm_rt_backend_t *be) {
  (void)be;
  return &k_event;
}
static void cpu_event_destroy(xm_rt_backend_t *be, xm_rt_event_t *e) {
  (void)be;
  (void)e;
}
static void cpu_event_record(xm_rt_backend_t *be, xm_rt_event_t *e, xm_rt_stream_t *s) {
  (void)be;
  (void)e;
  (void)s;
}
static void cpu_stream_wait(xm_rt_backend_t *be, xm_rt_stream_t *s, xm_rt_event_t *e) {
  (void)be;
  (void)s;
  (void)e;
}
static void cpu_event_sync(xm_rt_backend_t *be, xm_rt_event_t *e) {
  (void)be;
  (void)e;
}
static void cpu_sync(xm_rt_backend_t *be, xm_rt_stream_t *s) {
  (void)be;
  (void)s;
}

/* Every entry a CPU function; a kernel whose C signature differs from its
 * line in kernels.def does not compile here. */
static const xm_rt_kernels_t k_cpu_kernels = {
#define XM_KERNEL(name, ret, args) .name = xm_k_##name,
#include "runtime/abi/kernels.def"
#undef XM_KERNEL
};

static xm_rt_backend_t k_cpu = {
    .name = "cpu",
    .host_visible = 1,
    .alignment = CPU_ALIGN,
    .init = cpu_init,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy_h2d = cpu_copy,
    .copy_d2h = cpu_copy,
    .copy_d2d = cpu_copy,
    .fill32 = cpu_fill32,
    .read = cpu_read,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait = cpu_stream_wait,
    .event_sync = cpu_event_sync,
    .sync = cpu_sync,
    .kernels = &k_cpu_kernels,
};

xm_rt_backend_t *xm_rt_cpu_backend(void) { return &k_cpu; }

xm_rt_backend_t *xm_rt_backend_default(void) { return &k_cpu; }
