/* ir/verify.c — PLACEHOLDER: replaced by the real implementation. */
#include "ir/verify.h"

xm_status_t xm_ir_verify(const xm_ir_module_t *m, xm_diag_t *diag) { (void)m; (void)diag; return XM_ERR_UNSUPPORTED; }
xm_status_t xm_ir_infer_types(const xm_ir_op_t *op, xm_diag_t *diag, xm_ir_type_t *out_types) {
  (void)op; (void)diag; (void)out_types; return XM_ERR_UNSUPPORTED; }
