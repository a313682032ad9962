/* ir/ir.h — the xmoec graph IR: modules, ops, values, types, attributes.
 *
 * A module is a flat array of ops in topological order (ggml style): an op's
 * operands are results of earlier ops. Everything an op or value points to
 * lives in the module's arena and dies with the module; passes that drop ops
 * simply remove them from the array. Values are SSA: one defining op, a use
 * count kept up to date by the mutation functions below.
 *
 * Types carry a dtype, a shape whose dims may be dynamic with an upper bound
 * (token counts after routing are data-dependent), and a sharding annotation
 * per dim (which mesh axis splits it). Attributes are typed and kept sorted
 * by key, so the text form and the MLIR form (whose attribute dictionaries
 * are sorted) agree without extra bookkeeping. Every op has a location: the
 * JSON pointer of the spec field it came from, optionally "file:pointer".
 */
#ifndef XM_IR_IR_H
#define XM_IR_IR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "support/status.h"

/* ---- op table ---------------------------------------------------------- */

enum { XM_OPF_ROOT = 1, XM_OPF_COMM = 2 };

typedef enum {
#define XM_IR_OP(e, name, nops, nres, flags, doc) XM_OP_##e,
#include "ir/ops.def"
#undef XM_IR_OP
  XM_OP_COUNT_
} xm_ir_opcode_t;

typedef struct {
  const char *name;
  int num_operands; /* -1: variadic */
  int num_results;  /* -1: variadic */
  int flags;
  const char *doc;
} xm_ir_opinfo_t;

const xm_ir_opinfo_t *xm_ir_opinfo(xm_ir_opcode_t code);
/* Looks up an op by its text name; returns false if unknown. */
bool xm_ir_opcode_from_name(const char *name, xm_ir_opcode_t *out_code);

/* ---- parameter roles (ir/roles.def) ------------------------------------ */

/* The attr role of a param op: how a parallel layout places it. */
typedef enum {
#define XM_IR_ROLE(e, name, doc) XM_ROLE_##e,
#include "ir/roles.def"
#undef XM_IR_ROLE
  XM_ROLE_COUNT_
} xm_ir_role_t;

/* The text name of a role ("tp_column"); "?" for a value that is no role. */
static inline const char *xm_ir_role_name(xm_ir_role_t role) {
  switch (role) {
#define XM_IR_ROLE(e, name, doc)                                                                   \
  case XM_ROLE_##e: return name;
#include "ir/roles.def"
#undef XM_IR_ROLE
  default: return "?";
  }
}

/* Looks up a role by its text name; returns false if unknown (NULL too). */
static inline bool xm_ir_role_from_name(const char *name, xm_ir_role_t *out_role) {
  for (int i = 0; name && i < XM_ROLE_COUNT_; i++) {
    if (strcmp(xm_ir_role_name((xm_ir_role_t)i), name) == 0) {
      *out_role = (xm_ir_role_t)i;
      return true;
    }
  }
  return false;
}

/* ---- types ------------------------------------------------------------- */

typedef enum {
  XM_DT_F32,
  XM_DT_BF16,
  XM_DT_F16,
  XM_DT_I32,
  XM_DT_I64,
  XM_DT_BOOL,
  XM_DT_COUNT_
} xm_dtype_t;

const char *xm_dtype_name(xm_dtype_t dt); /* "f32", "bf16", ... */
bool xm_dtype_from_name(const char *name, xm_dtype_t *out);
size_t xm_dtype_size(xm_dtype_t dt);

/* Mesh axes a dim can be split over (docs/design.md, Parallel layout). */
typedef enum {
  XM_AXIS_NONE = 0,
  XM_AXIS_DP,   /* data parallel */
  XM_AXIS_TP,   /* tensor parallel */
  XM_AXIS_EP,   /* expert parallel */
  XM_AXIS_EDP,  /* expert data parallel (strided by EP) */
  XM_AXIS_SP,   /* sequence shard of SSMB (the TP group's tokens) */
  XM_AXIS_NODE, /* ranks of one node (RBD's intra-node stage) */
  XM_AXIS_COUNT_
} xm_mesh_axis_t;

const char *xm_mesh_axis_name(xm_mesh_axis_t a); /* "dp", "tp", ... */
bool xm_mesh_axis_from_name(const char *name, xm_mesh_axis_t *out);

/* Limits of the fused MoE ops' attrs tile_rows and slots, checked by the
 * verifier and the fuse-permute-gemm pass's options: their product, times
 * any legal row width, stays far inside int64. */
#define XM_IR_FUSED_MAX_TILE_ROWS 65536
#define XM_IR_FUSED_MAX_SLOTS 1024

/* = XM_RT_MAX_RANK of the runtime ABI (runtime/abi/program.h; codegen
 * checks they agree). */
#define XM_IR_MAX_RANK 6

typedef struct {
  xm_dtype_t dtype;
  int rank;                          /* 0 for a scalar */
  int64_t dims[XM_IR_MAX_RANK];      /* size, or upper bound when dynamic */
  bool dynamic[XM_IR_MAX_RANK];      /* size known only at run time */
  uint8_t shard[XM_IR_MAX_RANK];     /* xm_mesh_axis_t splitting the dim */
} xm_ir_type_t;

/* A static type without sharding. */
xm_ir_type_t xm_ir_type_make(xm_dtype_t dt, int rank, const int64_t *dims);
/* Equal dtype, rank, dims and dynamic flags (sharding ignored). */
bool xm_ir_type_equal(const xm_ir_type_t *a, const xm_ir_type_t *b);
/* Equal including sharding. */
bool xm_ir_type_identical(const xm_ir_type_t *a, const xm_ir_type_t *b);
/* Number of elements (upper bound when dynamic); -1 on overflow. */
int64_t xm_ir_type_numel(const xm_ir_type_t *t);

/* ---- attributes -------------------------------------------------------- */

typedef enum {
  XM_ATTR_INT,
  XM_ATTR_FLOAT,
  XM_ATTR_BOOL,
  XM_ATTR_STRING,
  XM_ATTR_INTS,
  XM_ATTR_FLOATS,
} xm_attr_kind_t;

typedef struct {
  const char *key; /* arena */
  xm_attr_kind_t kind;
  int64_t i;       /* INT, BOOL (0/1) */
  double f;        /* FLOAT */
  const char *s;   /* STRING (arena) */
  int n;           /* INTS / FLOATS length */
  int64_t *ints;   /* arena */
  double *floats;  /* arena */
} xm_ir_attr_t;

/* ---- values, ops, modules ---------------------------------------------- */

typedef struct xm_ir_op xm_ir_op_t;

typedef struct {
  int id;          /* unique in the module, creation order */
  xm_ir_type_t type;
  xm_ir_op_t *def; /* defining op */
  int index;       /* result index in def */
  int num_uses;    /* operand slots that refer to this value */
} xm_ir_value_t;

struct xm_ir_op {
  xm_ir_opcode_t code;
  int num_operands;
  xm_ir_value_t **operands; /* arena */
  int num_results;
  xm_ir_value_t **results;  /* arena */
  int num_attrs;
  xm_ir_attr_t *attrs;      /* arena; sorted by key; reallocated on insert */
  const char *loc;          /* arena; never NULL ("" when unknown) */
};

typedef struct xm_ir_module xm_ir_module_t;

/* Creates an empty module; the caller owns it (xm_ir_module_destroy). */
xm_status_t xm_ir_module_create(const char *name, xm_ir_module_t **out_module);
void xm_ir_module_destroy(xm_ir_module_t *m);

const char *xm_ir_module_name(const xm_ir_module_t *m);
int xm_ir_module_num_ops(const xm_ir_module_t *m);
/* Borrowed; valid until the op is removed or the module destroyed. */
xm_ir_op_t *xm_ir_module_op(const xm_ir_module_t *m, int i);
int xm_ir_module_num_values(const xm_ir_module_t *m); /* ids are < this */

/* Module-level attributes (model name, plan, ...), sorted by key. */
int xm_ir_module_num_attrs(const xm_ir_module_t *m);
const xm_ir_attr_t *xm_ir_module_attr(const xm_ir_module_t *m, int i);
/* Module attribute getters by key (borrowed; `dflt` when absent or of
 * another kind), and the setter of an int. */
const xm_ir_attr_t *xm_ir_module_find_attr(const xm_ir_module_t *m, const char *key);
int64_t xm_ir_module_get_int(const xm_ir_module_t *m, const char *key, int64_t dflt);
void xm_ir_module_set_int(xm_ir_module_t *m, const char *key, int64_t v);

/* Copies a string into the module arena. */
const char *xm_ir_strdup(xm_ir_module_t *m, const char *s);
/* Zeroed arena memory; NULL only on overflow or out of memory. */
void *xm_ir_alloc(xm_ir_module_t *m, size_t size);

/* Appends an op with the given operands (which must be values of this
 * module) and result types, at the end of the module. `loc` is copied
 * (NULL means ""). The op is returned borrowed; NULL on allocation failure.
 * No verification happens here: run xm_ir_verify. */
xm_ir_op_t *xm_ir_op_append(xm_ir_module_t *m, xm_ir_opcode_t code,
                            int num_operands, xm_ir_value_t *const *operands,
                            int num_results, const xm_ir_type_t *result_types,
                            const char *loc);

/* Convenience for the common one-result case: returns the result value. */
xm_ir_value_t *xm_ir_build1(xm_ir_module_t *m, xm_ir_opcode_t code,
                            int num_operands, xm_ir_value_t *const *operands,
                            xm_ir_type_t result_type, const char *loc);

/* Setting an attribute replaces one with the same key. Strings and arrays
 * are copied into the arena. */
void xm_ir_op_set_int(xm_ir_module_t *m, xm_ir_op_t *op, const char *key, int64_t v);
void xm_ir_op_set_float(xm_ir_module_t *m, xm_ir_op_t *op, const char *key, double v);
void xm_ir_op_set_bool(xm_ir_module_t *m, xm_ir_op_t *op, const char *key, bool v);
void xm_ir_op_set_string(xm_ir_module_t *m, xm_ir_op_t *op, const char *key, const char *v);
void xm_ir_op_set_ints(xm_ir_module_t *m, xm_ir_op_t *op, const char *key, int n, const int64_t *v);
void xm_ir_op_set_floats(xm_ir_module_t *m, xm_ir_op_t *op, const char *key, int n, const double *v);
/* Copies an attribute record (any kind). */
void xm_ir_op_set_attr(xm_ir_module_t *m, xm_ir_op_t *op, const xm_ir_attr_t *a);
void xm_ir_module_set_attr(xm_ir_module_t *m, const xm_ir_attr_t *a);

/* Borrowed; NULL when absent. */
const xm_ir_attr_t *xm_ir_op_attr(const xm_ir_op_t *op, const char *key);
/* Typed getters with a default when absent or of another kind. */
int64_t xm_ir_op_get_int(const xm_ir_op_t *op, const char *key, int64_t dflt);
double xm_ir_op_get_float(const xm_ir_op_t *op, const char *key, double dflt);
bool xm_ir_op_get_bool(const xm_ir_op_t *op, const char *key, bool dflt);
const char *xm_ir_op_get_string(const xm_ir_op_t *op, const char *key, const char *dflt);

/* The rotated span of a rope / rope_grad over rows of width D (ir/ops.def):
 * attrs rot_offset (default 0) and rot_dim (default D - rot_offset); the
 * verifier checks that the span lies in the row. */
static inline void xm_ir_rope_span(const xm_ir_op_t *op, int64_t D, int64_t *off, int64_t *rd) {
  *off = xm_ir_op_get_int(op, "rot_offset", 0);
  *rd = xm_ir_op_get_int(op, "rot_dim", D - *off);
}

/* A param or state: a declaration of the persistent arena, run by neither
 * function of the program. */
static inline bool xm_ir_op_is_declaration(const xm_ir_op_t *op) {
  return op->code == XM_OP_PARAM || op->code == XM_OP_STATE;
}

/* An op of the optimizer-step function (attr phase "step"; "fwd" when
 * absent). */
bool xm_ir_op_in_step(const xm_ir_op_t *op);

/* Replaces every use of `from` by `to` (use counts updated). */
void xm_ir_value_replace_uses(xm_ir_module_t *m, xm_ir_value_t *from, xm_ir_value_t *to);
/* Sets operand i of op (use counts updated). */
void xm_ir_op_set_operand(xm_ir_op_t *op, int i, xm_ir_value_t *v);
/* Moves the op at position `from` to position `to`, shifting the ops in
 * between (used to insert a freshly appended op before its users). */
void xm_ir_module_move_op(xm_ir_module_t *m, int from, int to);
/* Removes the ops whose flag in `remove` (indexed by position) is set,
 * keeping the order of the rest; operand use counts are released. The
 * caller guarantees none of their results is still used. */
void xm_ir_module_remove_ops(xm_ir_module_t *m, const bool *remove);

#endif /* XM_IR_IR_H */
