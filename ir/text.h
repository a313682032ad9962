/* ir/text.h — the textual form of the IR: printer and parser.
 *
 * The printer is canonical: values are renumbered %0, %1, ... in definition
 * order, attributes come sorted, floats use the shortest text that reads back
 * to the same double. parse(print(m)) prints byte for byte as print(m). The
 * grammar is in docs/ir.md. Example:
 *
 *   module @tiny attributes {seq_len = 64} {
 *     %0 = input() {name = "tokens"} : i32[2, 64] loc("/training/seq_len")
 *     %1 = param() {init = "normal", name = "model.embed_tokens.weight", std = 0.02} : f32[256, 64] loc("/model/vocab")
 *     %2 = embedding(%0, %1) : f32[2, 64, 64] loc("/model/hidden")
 *     %5, %6 = topk_route(%3, %4) {k = 2} : i32[128, 2], f32[128, 2] loc("/moe/top_k")
 *     return(%9)
 *   }
 *
 * Types: dtype[d0, d1, ...]; a dynamic dim is "?" followed by its upper bound
 * ("?4096"); a dim split over a mesh axis has "/axis" ("4096/ep", "?4096/ep").
 */
#ifndef XM_IR_TEXT_H
#define XM_IR_TEXT_H

#include <stddef.h>

#include "ir/ir.h"
#include "support/diag.h"
#include "support/strbuf.h"

/* Appends the text of a module to `out`. */
void xm_ir_print(const xm_ir_module_t *m, xm_strbuf_t *out);
/* Appends the text of one type ("f32[2, ?64/ep]"). */
void xm_ir_print_type(const xm_ir_type_t *t, xm_strbuf_t *out);
/* Appends one attribute value (no key). */
void xm_ir_print_attr_value(const xm_ir_attr_t *a, xm_strbuf_t *out);

/* Parses module text. Errors go to `diag` as "source: error: line:col:
 * message"; returns XM_ERR_INVALID_INPUT on any error (no module then).
 * On success the caller owns *out_module. The parsed module is not verified:
 * call xm_ir_verify. */
xm_status_t xm_ir_parse(const char *text, size_t len, const char *source,
                        xm_diag_t *diag, xm_ir_module_t **out_module);

#endif /* XM_IR_TEXT_H */
