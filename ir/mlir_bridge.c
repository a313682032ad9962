/* ir/mlir_bridge.c — placeholder to check the MLIR link. */
#include "ir/mlir_bridge.h"

#include <mlir-c/IR.h>

xm_status_t xm_mlir_export(const xm_ir_module_t *m, xm_strbuf_t *out) {
  (void)m;
  (void)out;
  MlirContext ctx = mlirContextCreate();
  mlirContextDestroy(ctx);
  return XM_ERR_UNSUPPORTED;
}

xm_status_t xm_mlir_import(const char *text, size_t len, const char *source,
                           xm_diag_t *diag, xm_ir_module_t **out_module) {
  (void)text; (void)len; (void)source; (void)diag; (void)out_module;
  return XM_ERR_UNSUPPORTED;
}
