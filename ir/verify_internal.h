/* ir/verify_internal.h — private to ir/verify.c and ir/verify_train.c.
 *
 * The result-type rules are split over two files: verify.c holds the rules
 * of the forward graph and the collectives, verify_train.c those of the
 * backward, state and optimizer ops that autodiff adds. Both speak through
 * the rule context below and the small helpers verify.c exports here, so a
 * message reads the same whichever file produced it. Nothing outside ir/
 * includes this header.
 */
#ifndef XM_IR_VERIFY_INTERNAL_H
#define XM_IR_VERIFY_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "ir/ir.h"
#include "support/diag.h"

/* One op being checked: where to report and how many errors so far. */
typedef struct {
  const xm_ir_op_t *op;
  xm_diag_t *diag;
  const char *place;
  int errors;
} xm_ir_rule_ctx_t;

/* A type as text ("f32[?64, 8/tp]"); safe on malformed types. */
typedef struct {
  char s[256];
} xm_ir_type_text_t;

xm_ir_type_text_t xm_ir_type_text(const xm_ir_type_t *t);

void xm_ir_rule_error(xm_ir_rule_ctx_t *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Operand checks: each reports and returns false on a violation.
 * need_rank: exactly `rank` dims, or at least -rank when rank < 0. */
bool xm_ir_rule_need_rank(xm_ir_rule_ctx_t *c, int i, int rank);
bool xm_ir_rule_need_float(xm_ir_rule_ctx_t *c, int i);
bool xm_ir_rule_need_dtype(xm_ir_rule_ctx_t *c, int i, xm_dtype_t dt);
bool xm_ir_rule_need_index(xm_ir_rule_ctx_t *c, int i);
/* Dim `di` of operand i equals dim `dj` of operand j (dynamic flag too). */
bool xm_ir_rule_need_dim_eq(xm_ir_rule_ctx_t *c, const char *what, int i, int di, int j, int dj);

/* Operand i has no dynamic dim. */
bool xm_ir_rule_need_static(xm_ir_rule_ctx_t *c, int i);

/* Attribute checks (required ones report when missing). */
bool xm_ir_rule_attr_int(xm_ir_rule_ctx_t *c, const char *key, int64_t lo, int64_t hi,
                         int64_t *out);
bool xm_ir_rule_attr_float(xm_ir_rule_ctx_t *c, const char *key, bool required);
bool xm_ir_rule_attr_bool(xm_ir_rule_ctx_t *c, const char *key, bool required);
/* `choices`: NULL-terminated list, or NULL for any string. */
const char *xm_ir_rule_attr_choice(xm_ir_rule_ctx_t *c, const char *key, const char *const *choices,
                                   bool required);

/* Attrs group (dp|tp|ep|edp|sp|node|world) and group_size (>= 1) of a
 * collective. required false: both may be absent, one alone is reported.
 * Returns group_size, or 0 when absent or invalid (already reported). */
int64_t xm_ir_rule_group(xm_ir_rule_ctx_t *c, bool required);

/* Overwrites everything but the sharding of *out. */
void xm_ir_rule_set_result(xm_ir_type_t *out, xm_dtype_t dt, int rank, const int64_t *dims,
                           const bool *dynamic);

/* The rules of the training ops (verify_train.c): backward ops, state and
 * optimizer ops, and the collectives on states and params (reduce_state,
 * zero_reduce_scatter, zero_gather). `out` has room for op->num_results
 * types, prefilled with the op's own result types. */
void xm_ir_verify_train_rule(xm_ir_rule_ctx_t *c, xm_ir_type_t *out);

/* The rules of the fused padding-free MoE ops (verify_fused.c), forward and
 * backward; `out` as for xm_ir_verify_train_rule. */
void xm_ir_verify_fused_rule(xm_ir_rule_ctx_t *c, xm_ir_type_t *out);
/* cast (ir/verify_mixed.c). */
void xm_ir_verify_mixed_rule(xm_ir_rule_ctx_t *c, xm_ir_type_t *out);

#endif /* XM_IR_VERIFY_INTERNAL_H */
