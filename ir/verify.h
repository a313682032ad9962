/* ir/verify.h — structural and type checks of a module, and the per-op
 * result-type rules (shape inference) that the verifier and the shape
 * inference pass share.
 *
 * The verifier checks: operand and result counts against ir/ops.def,
 * def-before-use (every operand defined by an earlier op of this module),
 * use counts, required attributes and their kinds, and that every result
 * type equals what xm_ir_infer_types derives from the operands and
 * attributes. Every problem goes to `diag` with the op's location and its
 * position ("op 12 (matmul)").
 */
#ifndef XM_IR_VERIFY_H
#define XM_IR_VERIFY_H

#include "ir/ir.h"
#include "support/diag.h"

xm_status_t xm_ir_verify(const xm_ir_module_t *m, xm_diag_t *diag);

/* Derives the result types of `op` from its operands' types and its
 * attributes. Ops whose result type is free (input, param, constant,
 * reshape) return their current result types. Sharding annotations are
 * carried from operands where the rule is obvious (elementwise), else left
 * as the op has them. On a rule violation (shape mismatch, missing
 * attribute) a message goes to `diag` and XM_ERR_INVALID_INPUT is returned.
 * `out_types` has room for op->num_results entries. */
xm_status_t xm_ir_infer_types(const xm_ir_op_t *op, xm_diag_t *diag,
                              xm_ir_type_t *out_types);

#endif /* XM_IR_VERIFY_H */
