/* tests/backend/test_emu_backend.c — the conformance suite on the emulated
 * GPU backend (runtime/emu/backend.c): every GPU kernel template of
 * runtime/gpu/kernels, compiled for the CPU emulation, against the CPU
 * reference. Built once per emulated target (ctest backend_emu_amd:
 * wavefront 64 and the MFMA layouts; backend_emu_nv: warp 32 and the
 * mma.sync layouts). An optional argument runs only the named entries. */
#include <stdio.h>

#include "runtime/abi/backend.h"
#include "runtime/abi/kernels.h"
#include "tests/backend/conformance.h"

/* runtime/emu/table.cpp; named here so that the linker takes it from its
 * archive (the backend refers to it weakly: programs do without). */
const xm_rt_kernels_t *xm_rt_emu_kernel_table(void);

int main(int argc, char **argv) {
  const char *only = argc > 1 && argv[1][0] ? argv[1] : NULL;
  xm_rt_backend_t *be = xm_rt_emu_backend();
  be->kernels = xm_rt_emu_kernel_table();
  return xm_conformance_run(be, only, stdout) != 0;
}
