/* frontend/hf_config.c — PLACEHOLDER: replaced by the real implementation. */
#include "frontend/hf_config.h"

bool xm_hf_config_detect(const cJSON *root) { (void)root; return false; }
void xm_hf_config_import(const cJSON *root, const char *source, xm_diag_t *diag, xm_spec_t *spec) {
  (void)root; (void)source; (void)diag; (void)spec; }
