/* codegen/target.c — the table of code generation targets (codegen/target.h). */
#include "codegen/target.h"

#include <ctype.h>
#include <string.h>

static const xm_codegen_target_t k_targets[] = {
    {"cpu", false, "C schedule calling the CPU kernels (BLAS, OpenMP)", NULL},
    {"hip", true, "HIP kernels specialised to the plan, for AMD GPUs (hipcc)", "gfx90a"},
    {"cuda", true, "the same kernel text for NVIDIA GPUs (nvcc)", "sm_90"},
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

bool xm_codegen_target_arch_ok(const xm_codegen_target_t *t, const char *arch) {
  if (!t || !t->gpu || !arch) return false;
  const char *p;
  if (strcmp(t->name, "hip") == 0) {
    if (strncmp(arch, "gfx", 3) != 0 || !arch[3]) return false;
    for (p = arch + 3; *p; p++)
      if (!isxdigit((unsigned char)*p)) return false;
    return true;
  }
  if (strncmp(arch, "sm_", 3) != 0 || !isdigit((unsigned char)arch[3])) return false;
  for (p = arch + 3; isdigit((unsigned char)*p); p++) {
  }
  return *p == 0 || (p[0] == 'a' && p[1] == 0);
}
