/* ir/parse.c — PLACEHOLDER: replaced by the real implementation. */
#include "ir/text.h"

xm_status_t xm_ir_parse(const char *text, size_t len, const char *source, xm_diag_t *diag,
                        xm_ir_module_t **out_module) {
  (void)text; (void)len; (void)source; (void)diag; (void)out_module; return XM_ERR_UNSUPPORTED; }
