/* tests/backend/test_hip_backend.c — the conformance suite on the HIP
 * backend (runtime/hip/backend.c) and its kernel table
 * (runtime/hip/table.hip): every GPU kernel template compiled for the device,
 * against the CPU reference. The ctest backend_hip skips (exit code 77)
 * on a machine where init finds no HIP device. An optional argument runs
 * only the named entries. */
#include <stdio.h>

#include "runtime/abi/backend.h"
#include "runtime/abi/kernels.h"
#include "tests/backend/conformance.h"

/* runtime/hip/table.hip; named here so that the linker takes it from its
 * archive (the backend refers to it weakly: programs do without). */
const xm_rt_kernels_t *xm_rt_hip_kernel_table(void);

int main(int argc, char **argv) {
  const char *only = argc > 1 && argv[1][0] ? argv[1] : NULL;
  xm_rt_backend_t *be = xm_rt_hip_backend();
  /* Probe for a device first; the suite's own init then finds it again. */
  char err[512] = "";
  int threads = 0;
  if (be->init(be, 0, 1, &threads, err, sizeof err) != 0) {
    printf("skipped: no HIP device (%s)\n", err[0] ? err : "init failed");
    return 77;
  }
  be->kernels = xm_rt_hip_kernel_table();
  return xm_conformance_run(be, only, stdout) != 0;
}
