/* runtime/emu/backend.c — the emulated GPU backend: what the HIP and CUDA
 * backends do, on host memory, with the kernels of runtime/gpu/ run by the
 * emulator (runtime/emu/emu.h).
 *
 * It says its memory is not host-visible (host_visible 0), so the training
 * driver and the generated schedule take the GPU paths: host images of the
 * persistent arena moved with copy_h2d / copy_d2h at the edges, and every
 * value the host needs fetched with read. Streams run in order where they
 * are called, like the CPU backend's (runtime/abi/host_backend.h: the same
 * memory, copy and stream functions), since an emulated launch returns when
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

#include "runtime/abi/host_backend.h"
#include "runtime/abi/kernels.h"

/* Defined by runtime/emu/table.cpp, when linked. */
const xm_rt_kernels_t *xm_rt_emu_kernel_table(void) __attribute__((weak));

enum { EMU_ALIGN = 256 }; /* what hipMalloc and cudaMalloc guarantee */

/* Blocks of a launch are shared among the cores this rank gets (as the CPU
 * backend divides them), OMP_NUM_THREADS winning when set. */
static int emu_init(xm_rt_backend_t *be, int local_rank, int local_ranks, int *threads,
                    char *err, size_t err_len) {
  (void)be;
  (void)local_rank;
  (void)err;
  (void)err_len;
  if (!getenv("OMP_NUM_THREADS")) omp_set_num_threads(xm_host_cores(local_ranks));
  if (threads) *threads = omp_get_max_threads();
  return 0;
}

static xm_rt_backend_t k_emu = {
    .name = "emu",
    .host_visible = 0,
    .alignment = EMU_ALIGN,
    .init = emu_init,
    XM_HOST_BACKEND_CALLS,
    .kernels = NULL,
};

xm_rt_backend_t *xm_rt_emu_backend(void) {
  if (!k_emu.kernels && xm_rt_emu_kernel_table) k_emu.kernels = xm_rt_emu_kernel_table();
  return &k_emu;
}

xm_rt_backend_t *xm_rt_backend_default(void) { return xm_rt_emu_backend(); }
