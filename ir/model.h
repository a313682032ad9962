/* ir/model.h — builds the forward training graph of a whole model from a
 * validated spec (docs/design.md, Model semantics).
 *
 * The graph takes inputs "tokens" and "labels" (i32[micro_batch, seq_len]),
 * holds every parameter as a param op named by its Hugging Face tensor name
 * (routed experts stacked along dim 0 with "{e}" in the name), and returns
 * the total loss (cross-entropy plus every MoE layer's aux loss) first,
 * then the cross-entropy alone. Shapes are global (before sharding). Every
 * op's location is the JSON pointer of the spec field that shaped it.
 */
#ifndef XM_IR_MODEL_H
#define XM_IR_MODEL_H

#include "frontend/spec.h"
#include "ir/ir.h"
#include "support/diag.h"

/* On success the caller owns *out_module. A feature the spec can describe
 * but training cannot do would return XM_ERR_UNSUPPORTED with its place in
 * `source` and `diag`; every valid spec builds today. */
xm_status_t xm_ir_build_model(const xm_spec_t *spec, const char *source,
                              xm_diag_t *diag, xm_ir_module_t **out_module);

#endif /* XM_IR_MODEL_H */
