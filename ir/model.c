/* ir/model.c — PLACEHOLDER: replaced by the real implementation. */
#include "ir/model.h"

xm_status_t xm_ir_build_model(const xm_spec_t *spec, const char *source, xm_diag_t *diag,
                              xm_ir_module_t **out_module) {
  (void)spec; (void)source; (void)diag; (void)out_module; return XM_ERR_UNSUPPORTED; }
