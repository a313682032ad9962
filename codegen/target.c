/* codegen/target.c — the table of code generation targets (codegen/target.h). */
#include "codegen/target.h"

#include <string.h>

static const xm_codegen_target_t k_targets[] = {
    {"cpu", true, "C schedule calling the CPU kernels (BLAS, OpenMP)", xm_codegen_program_c,
     xm_codegen_main_c},
    {"hip", false, "HIP kernels specialised to the plan, for AMD GPUs (not built yet)", NULL, NULL},
    {"cuda", false, "the same kernel text for NVIDIA GPUs (not built yet)", NULL, NULL},
};

const xm_codegen_target_t *xm_codegen_targets(int *count) {
  *count = (int)(sizeof k_targets / sizeof k_targets[0]);
  return k_targets;
}

const xm_codegen_target_t *xm_codegen_target_find(const char *name) {
  for (size_t i = 0; name && i < sizeof k_targets / sizeof k_targets[0]; i++)
    if (strcmp(k_targets[i].name, name) == 0) return &k_targets[i];
  return NULL;
}
