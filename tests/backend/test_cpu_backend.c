/* tests/backend/test_cpu_backend.c — the conformance suite on the CPU
 * backend (runtime/cpu/backend.c), ctest `backend_cpu`.
 *
 * This file is the whole instantiation: a new backend copies it, names its
 * own table instead of xm_rt_cpu_backend() and is declared next to this one
 * in tests/CMakeLists.txt (tests/backend/conformance.h). An optional
 * argument runs only the named entries, e.g. `backend_cpu permute,topk_route`.
 */
#include <stdio.h>

#include "runtime/abi/backend.h"
#include "tests/backend/conformance.h"

int main(int argc, char **argv) {
  const char *only = argc > 1 && argv[1][0] ? argv[1] : NULL;
  return xm_conformance_run(xm_rt_cpu_backend(), only, stdout) != 0;
}
