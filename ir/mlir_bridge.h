/* ir/mlir_bridge.h — exchange of modules with MLIR through the MLIR C API.
 *
 * Export: one builtin.module (sym_name = module name) whose body holds one
 * generic-form op "xmoe.<name>" per IR op, builtin ranked tensor types
 * (dynamic dims as '?', the upper bounds of all dims in the tensor encoding
 * as an array of i64, "tensor<?x64xf32, [256, 64]>": MLIR 19 cannot parse
 * an array<i64: ...> encoding back), attributes as MLIR attributes (i64 integers, f64 floats,
 * bools, strings, dense i64/f64 arrays), sharding in the op attribute
 * "xmoe.shard" (one string per result, e.g. "_,ep"), module attributes as
 * attributes of the builtin.module with the prefix "xmoe.", and locations as
 * name locations. Import is the exact inverse: IR -> MLIR -> IR prints
 * identical text. The library is separate (xm_mlir) so that nothing else
 * links MLIR.
 */
#ifndef XM_IR_MLIR_BRIDGE_H
#define XM_IR_MLIR_BRIDGE_H

#include <stddef.h>

#include "ir/ir.h"
#include "support/diag.h"
#include "support/strbuf.h"

/* Appends the MLIR text (generic op form) of `m` to `out`; the exported
 * module is verified by MLIR first (XM_ERR_INTERNAL if it fails). */
xm_status_t xm_mlir_export(const xm_ir_module_t *m, xm_strbuf_t *out);

/* Parses MLIR text (as produced by xm_mlir_export or any equivalent
 * generic-form module) into an IR module owned by the caller. Unknown ops,
 * types or attributes are reported to `diag` with their MLIR location. */
xm_status_t xm_mlir_import(const char *text, size_t len, const char *source,
                           xm_diag_t *diag, xm_ir_module_t **out_module);

#endif /* XM_IR_MLIR_BRIDGE_H */
