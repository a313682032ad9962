/* passes/pass_manager.c — PLACEHOLDER: replaced by the real implementation. */
#include "passes/pass.h"

const char *xm_pass_option(const xm_pass_options_t *o, const char *key) { (void)o; (void)key; return NULL; }
void xm_pass_manager_options_default(xm_pass_manager_options_t *o) { (void)o; }
xm_status_t xm_pass_pipeline_run(xm_ir_module_t *m, const char *pipeline,
                                 const xm_pass_manager_options_t *options, xm_diag_t *diag) {
  (void)m; (void)pipeline; (void)options; (void)diag; return XM_ERR_UNSUPPORTED; }
