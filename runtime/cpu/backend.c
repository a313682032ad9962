/* runtime/cpu/backend.c — the CPU backend: host memory and one in-order
 * stream that runs each call where it is made (runtime/abi/backend.h).
 *
 * Streams and events exist so that code written for a GPU backend runs here
 * unchanged: every queued call has finished when it returns, so recording,
 * waiting and synchronising have nothing to wait for (the memory, copy and
 * stream functions are runtime/abi/host_backend.h's). The kernel table
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

#include "runtime/abi/host_backend.h"
#include "runtime/abi/kernels.h"
#include "runtime/cpu/kernels.h"

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
  if (!getenv("OMP_NUM_THREADS")) omp_set_num_threads(xm_host_cores(local_ranks));
  openblas_set_num_threads(1);
  if (threads) *threads = omp_get_max_threads();
  return 0;
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
    XM_HOST_BACKEND_CALLS,
    .kernels = &k_cpu_kernels,
};

xm_rt_backend_t *xm_rt_cpu_backend(void) { return &k_cpu; }

xm_rt_backend_t *xm_rt_backend_default(void) { return &k_cpu; }
