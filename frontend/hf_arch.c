/* frontend/hf_arch.c — see frontend/hf_arch.h. */
#include "frontend/hf_arch.h"

#include <stdio.h>

xm_hf_arch_t xm_hf_arch_of(const xm_spec_t *spec) {
  (void)spec;
  return XM_HF_ARCH_XMOEC;
}

void xm_hf_param_name(xm_hf_arch_t arch, const char *canonical, char *buf, size_t n) {
  (void)arch;
  snprintf(buf, n, "%s", canonical);
}
