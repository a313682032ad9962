/* ir/print.c — PLACEHOLDER: replaced by the real implementation. */
#include "ir/text.h"

void xm_ir_print(const xm_ir_module_t *m, xm_strbuf_t *out) { (void)m; (void)out; }
void xm_ir_print_type(const xm_ir_type_t *t, xm_strbuf_t *out) { (void)t; (void)out; }
void xm_ir_print_attr_value(const xm_ir_attr_t *a, xm_strbuf_t *out) { (void)a; (void)out; }
