/* ir/verify.c — the IR verifier and the per-op result-type rules.
 *
 * The two live together because the verifier's main check is "every result
 * type is what the rules derive", and both speak about an op the same way:
 * a place "op N (name) at LOC" and messages that name the operands and
 * their shapes. xm_ir_infer_types has no module and therefore no position,
 * so its places read "op (name) at LOC"; the verifier runs the same body
 * (infer_at) with the numbered place.
 *
 * The rules follow the "meaning" column of ir/ops.def, which is the
 * contract with the model builder and the passes. A dim is compared with
 * its dynamic flag: a dynamic dim of bound 64 ("?64") is not the static 64.
 * Attributes are checked inside the rules (they shape the results), so a
 * caller of xm_ir_infer_types gets the same attribute errors as the
 * verifier. Float attributes also accept an int (the getter in ir.h reads
 * both the same way); ints, bools and strings must have their own kind.
 *
 * Sharding: elementwise ops take the first operand's annotation; every
 * other op keeps whatever its result already carries (the shard pass owns
 * it and the verifier compares with xm_ir_type_equal, which ignores it).
 *
 * Nothing here trusts the module: counts, pointers, ranks and dtypes are
 * checked before they are used to index, so a broken module (parsed text,
 * a buggy pass) gives messages, never a crash.
 *
 * Collectives (the shard pass's ops, RBD) carry attrs group (a name of
 * runtime/abi/groups.def) and group_size and are typed per rank. Where a
 * row count is data-dependent (all_to_all, rbd_dispatch) the result's dim 0
 * is dynamic and its bound is the op's own, like a reshape's type: the rule
 * reads it, never derives it. Count tables i32[P,L] are static with
 * P = group_size.
 *
 * The training ops (backward, state, optimizer) have their rules in
 * ir/verify_train.c, reached from apply_rule; the helpers they share with
 * this file are exported through ir/verify_internal.h. The attribute
 * phase ("fwd" | "bwd" | "step", set by autodiff) is checked on every op
 * when present and never required.
 */
#include "ir/verify.h"
#include "ir/verify_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/abi/groups.h"

/* ---- formatting -------------------------------------------------------- */

/* Room for "bf16[" + 6 dims of "?" + 19 digits + "/node" + ", " + "]". */
typedef xm_ir_type_text_t type_text_t;

static bool dtype_ok(xm_dtype_t dt) { return (int)dt >= 0 && dt < XM_DT_COUNT_; }

/* Safe on malformed types: it is used to report them. */
static type_text_t type_text(const xm_ir_type_t *t) {
  type_text_t r;
  size_t n = 0;
  n += (size_t)snprintf(r.s + n, sizeof r.s - n, "%s[",
                        dtype_ok(t->dtype) ? xm_dtype_name(t->dtype) : "<bad dtype>");
  int rank = t->rank < 0 ? 0 : t->rank > XM_IR_MAX_RANK ? XM_IR_MAX_RANK : t->rank;
  for (int i = 0; i < rank && n < sizeof r.s; i++) {
    n += (size_t)snprintf(r.s + n, sizeof r.s - n, "%s%s%lld", i ? ", " : "",
                          t->dynamic[i] ? "?" : "", (long long)t->dims[i]);
    if (t->shard[i] != XM_AXIS_NONE && n < sizeof r.s)
      n += (size_t)snprintf(r.s + n, sizeof r.s - n, "/%s",
                            t->shard[i] < XM_AXIS_COUNT_ ? xm_mesh_axis_name(t->shard[i]) : "?");
  }
  if (n < sizeof r.s) snprintf(r.s + n, sizeof r.s - n, "]");
  return r;
}

typedef struct {
  char s[32];
} dim_text_t;

static dim_text_t dim_text(const xm_ir_type_t *t, int i) {
  dim_text_t r;
  snprintf(r.s, sizeof r.s, "%s%lld", t->dynamic[i] ? "?" : "", (long long)t->dims[i]);
  return r;
}

/* ---- rule context ------------------------------------------------------ */

typedef xm_ir_rule_ctx_t rule_ctx_t;

static void rule_error(rule_ctx_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void rule_error(rule_ctx_t *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  xm_diag_addv(c->diag, XM_DIAG_ERROR, NULL, c->place, fmt, ap);
  va_end(ap);
  c->errors++;
}

static const xm_ir_type_t *in(const rule_ctx_t *c, int i) { return &c->op->operands[i]->type; }

static bool is_float(xm_dtype_t dt) {
  return dt == XM_DT_F32 || dt == XM_DT_BF16 || dt == XM_DT_F16;
}
static bool is_index(xm_dtype_t dt) { return dt == XM_DT_I32 || dt == XM_DT_I64; }

static bool dim_eq(const xm_ir_type_t *a, int i, const xm_ir_type_t *b, int j) {
  return a->dims[i] == b->dims[j] && a->dynamic[i] == b->dynamic[j];
}

/* Operand i must have exactly `rank` dims (rank < 0: at least -rank). */
static bool need_rank(rule_ctx_t *c, int i, int rank) {
  const xm_ir_type_t *t = in(c, i);
  if (rank >= 0 && t->rank != rank) {
    rule_error(c, "operand %d must have rank %d but has type %s", i, rank, type_text(t).s);
    return false;
  }
  if (rank < 0 && t->rank < -rank) {
    rule_error(c, "operand %d must have rank >= %d but has type %s", i, -rank, type_text(t).s);
    return false;
  }
  return true;
}

static bool need_float(rule_ctx_t *c, int i) {
  if (is_float(in(c, i)->dtype)) return true;
  rule_error(c, "operand %d must be a float tensor but has type %s", i, type_text(in(c, i)).s);
  return false;
}

static bool need_dtype(rule_ctx_t *c, int i, xm_dtype_t dt) {
  if (in(c, i)->dtype == dt) return true;
  rule_error(c, "operand %d must be %s but has type %s", i, xm_dtype_name(dt),
             type_text(in(c, i)).s);
  return false;
}

static bool need_index(rule_ctx_t *c, int i) {
  if (is_index(in(c, i)->dtype)) return true;
  rule_error(c, "operand %d must be i32 or i64 but has type %s", i, type_text(in(c, i)).s);
  return false;
}

/* Dim `di` of operand i must equal dim `dj` of operand j. */
static bool need_dim_eq(rule_ctx_t *c, const char *what, int i, int di, int j, int dj) {
  if (dim_eq(in(c, i), di, in(c, j), dj)) return true;
  rule_error(c, "operand %d has %s %s but operand %d has %s (types %s and %s)", i, what,
             dim_text(in(c, i), di).s, j, dim_text(in(c, j), dj).s, type_text(in(c, i)).s,
             type_text(in(c, j)).s);
  return false;
}

/* ---- attributes -------------------------------------------------------- */

static const char *const k_kind_names[] = {"int", "float", "bool", "string", "ints", "floats"};

static const xm_ir_attr_t *attr_of_kind(rule_ctx_t *c, const char *key, xm_attr_kind_t kind,
                                        bool required) {
  const xm_ir_attr_t *a = xm_ir_op_attr(c->op, key);
  if (!a) {
    if (required) rule_error(c, "missing attribute '%s' (%s)", key, k_kind_names[kind]);
    return NULL;
  }
  bool ok = a->kind == kind || (kind == XM_ATTR_FLOAT && a->kind == XM_ATTR_INT);
  if (!ok) {
    const char *got = (int)a->kind >= 0 && a->kind <= XM_ATTR_FLOATS ? k_kind_names[a->kind] : "?";
    rule_error(c, "attribute '%s' must be %s but is %s", key, k_kind_names[kind], got);
    return NULL;
  }
  return a;
}

static bool attr_int(rule_ctx_t *c, const char *key, int64_t lo, int64_t hi, int64_t *out) {
  const xm_ir_attr_t *a = attr_of_kind(c, key, XM_ATTR_INT, true);
  if (!a) return false;
  if (a->i < lo || a->i > hi) {
    if (hi == INT64_MAX)
      rule_error(c, "attribute '%s' is %lld but must be >= %lld", key, (long long)a->i,
                 (long long)lo);
    else
      rule_error(c, "attribute '%s' is %lld but must be in [%lld, %lld]", key, (long long)a->i,
                 (long long)lo, (long long)hi);
    return false;
  }
  *out = a->i;
  return true;
}

static bool attr_float(rule_ctx_t *c, const char *key, bool required) {
  return attr_of_kind(c, key, XM_ATTR_FLOAT, required) != NULL;
}

static bool attr_bool(rule_ctx_t *c, const char *key, bool required) {
  return attr_of_kind(c, key, XM_ATTR_BOOL, required) != NULL;
}

/* A string from a NULL-terminated list of choices (NULL: any string). */
static const char *attr_choice(rule_ctx_t *c, const char *key, const char *const *choices,
                               bool required) {
  const xm_ir_attr_t *a = attr_of_kind(c, key, XM_ATTR_STRING, required);
  if (!a) return NULL;
  const char *s = a->s ? a->s : "";
  if (!choices) return s;
  for (int i = 0; choices[i]; i++)
    if (strcmp(choices[i], s) == 0) return s;
  char list[128] = "";
  for (int i = 0; choices[i]; i++) {
    size_t n = strlen(list);
    snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", choices[i]);
  }
  rule_error(c, "attribute '%s' is \"%s\" but must be one of %s", key, s, list);
  return NULL;
}

/* ---- results ----------------------------------------------------------- */

/* Overwrites everything but the sharding of out[r] (kept from the op). */
static void set_result(xm_ir_type_t *out, xm_dtype_t dt, int rank, const int64_t *dims,
                       const bool *dynamic) {
  out->dtype = dt;
  out->rank = rank;
  for (int i = 0; i < XM_IR_MAX_RANK; i++) {
    out->dims[i] = i < rank ? dims[i] : 0;
    out->dynamic[i] = i < rank && dynamic ? dynamic[i] : false;
    if (i >= rank) out->shard[i] = XM_AXIS_NONE;
  }
}

static void set_scalar_f32(xm_ir_type_t *out) { set_result(out, XM_DT_F32, 0, NULL, NULL); }

/* Same type as operand i, sharding included (elementwise ops). */
static void same_as(rule_ctx_t *c, int i, xm_ir_type_t *out) { *out = *in(c, i); }

/* ---- helpers shared with verify_train.c (verify_internal.h) ------------ */

xm_ir_type_text_t xm_ir_type_text(const xm_ir_type_t *t) { return type_text(t); }

void xm_ir_rule_error(xm_ir_rule_ctx_t *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  xm_diag_addv(c->diag, XM_DIAG_ERROR, NULL, c->place, fmt, ap);
  va_end(ap);
  c->errors++;
}

bool xm_ir_rule_need_rank(xm_ir_rule_ctx_t *c, int i, int rank) { return need_rank(c, i, rank); }
bool xm_ir_rule_need_float(xm_ir_rule_ctx_t *c, int i) { return need_float(c, i); }
bool xm_ir_rule_need_dtype(xm_ir_rule_ctx_t *c, int i, xm_dtype_t dt) {
  return need_dtype(c, i, dt);
}
bool xm_ir_rule_need_index(xm_ir_rule_ctx_t *c, int i) { return need_index(c, i); }
bool xm_ir_rule_need_dim_eq(xm_ir_rule_ctx_t *c, const char *what, int i, int di, int j, int dj) {
  return need_dim_eq(c, what, i, di, j, dj);
}
bool xm_ir_rule_attr_int(xm_ir_rule_ctx_t *c, const char *key, int64_t lo, int64_t hi,
                         int64_t *out) {
  return attr_int(c, key, lo, hi, out);
}
bool xm_ir_rule_attr_float(xm_ir_rule_ctx_t *c, const char *key, bool required) {
  return attr_float(c, key, required);
}
bool xm_ir_rule_attr_bool(xm_ir_rule_ctx_t *c, const char *key, bool required) {
  return attr_bool(c, key, required);
}
const char *xm_ir_rule_attr_choice(xm_ir_rule_ctx_t *c, const char *key, const char *const *choices,
                                   bool required) {
  return attr_choice(c, key, choices, required);
}
void xm_ir_rule_set_result(xm_ir_type_t *out, xm_dtype_t dt, int rank, const int64_t *dims,
                           const bool *dynamic) {
  set_result(out, dt, rank, dims, dynamic);
}

/* ---- rules: elementwise and shape -------------------------------------- */

/* b has a's shape but for its last dim, which is 1: one factor per row of
 * a (mul only; the shared-expert gate [T,1] times the shared output
 * [T,H]). When a's last dim is 1 too this is the elementwise case. */
static bool per_row(const xm_ir_type_t *a, const xm_ir_type_t *b) {
  if (a->rank < 1 || b->rank != a->rank || b->dims[b->rank - 1] != 1 || b->dynamic[b->rank - 1])
    return false;
  for (int i = 0; i < a->rank - 1; i++)
    if (!dim_eq(b, i, a, i)) return false;
  return true;
}

static void rule_broadcast(rule_ctx_t *c, xm_ir_type_t *out) {
  const xm_ir_type_t *a = in(c, 0), *b = in(c, 1);
  if (a->dtype != b->dtype)
    rule_error(c, "operand 1 has type %s but operand 0 has %s (dtypes differ)", type_text(b).s,
               type_text(a).s);
  bool suffix = b->rank <= a->rank;
  for (int i = 0; suffix && i < b->rank; i++)
    suffix = dim_eq(b, i, a, a->rank - b->rank + i);
  bool rows = c->op->code == XM_OP_MUL && per_row(a, b);
  if (!suffix && !rows)
    rule_error(c, "operand 1 shape %s is not a trailing suffix of operand 0 shape %s%s",
               type_text(b).s, type_text(a).s,
               c->op->code == XM_OP_MUL ? " nor its shape with the last dim 1" : "");
  same_as(c, 0, out);
}

static void rule_unary_float(rule_ctx_t *c, xm_ir_type_t *out) {
  need_float(c, 0);
  if (c->op->code == XM_OP_SCALE) attr_float(c, "factor", true);
  same_as(c, 0, out);
}

static void rule_swiglu(rule_ctx_t *c, xm_ir_type_t *out) {
  if (need_float(c, 0) && !xm_ir_type_equal(in(c, 0), in(c, 1)))
    rule_error(c, "operand 1 has type %s but operand 0 has %s (must be equal)",
               type_text(in(c, 1)).s, type_text(in(c, 0)).s);
  same_as(c, 0, out);
}

/* The result type is the op's own; only the element count and dtype are
 * constrained (upper bounds stand in for dynamic dims). */
static void rule_reshape(rule_ctx_t *c, xm_ir_type_t *out) {
  const xm_ir_type_t *x = in(c, 0);
  if (out->dtype != x->dtype)
    rule_error(c, "result type %s has another dtype than operand 0 %s", type_text(out).s,
               type_text(x).s);
  int64_t nx = xm_ir_type_numel(x), nr = xm_ir_type_numel(out);
  if (nx < 0 || nr < 0 || nx != nr)
    rule_error(c, "result type %s has %lld elements but operand 0 %s has %lld", type_text(out).s,
               (long long)nr, type_text(x).s, (long long)nx);
}

static const char *const k_init_choices[] = {"normal", "ones", "zeros", NULL};

/* ir/roles.def: how a parallel layout places a param (optional here; the
 * shard pass requires it). */
static const char *const k_role_choices[] = {
#define XM_IR_ROLE(e, name, doc) name,
#include "ir/roles.def"
#undef XM_IR_ROLE
    NULL};

/* input, param, constant: the type is free; their attributes are not. */
static void rule_source(rule_ctx_t *c) {
  switch (c->op->code) {
  case XM_OP_INPUT: attr_choice(c, "name", NULL, true); break;
  case XM_OP_PARAM:
    attr_choice(c, "name", NULL, true);
    attr_choice(c, "init", k_init_choices, true);
    attr_choice(c, "role", k_role_choices, false);
    attr_float(c, "std", false);
    attr_bool(c, "trainable", false);
    break;
  case XM_OP_CONSTANT: attr_float(c, "value", true); break;
  default: break;
  }
}

static void rule_return(rule_ctx_t *c) {
  if (c->op->num_operands < 1) {
    rule_error(c, "return needs at least one operand (the loss)");
    return;
  }
  if (in(c, 0)->rank != 0)
    rule_error(c, "operand 0 (the loss) must be a scalar but has type %s", type_text(in(c, 0)).s);
}

/* ---- rules: transformer layers ----------------------------------------- */

static void rule_embedding(rule_ctx_t *c, xm_ir_type_t *out) {
  int e0 = c->errors;
  need_index(c, 0);
  need_rank(c, 0, -1);
  need_rank(c, 1, 2);
  need_float(c, 1);
  if (c->errors > e0) return;
  const xm_ir_type_t *tok = in(c, 0), *tab = in(c, 1);
  if (tok->rank + 1 > XM_IR_MAX_RANK) {
    rule_error(c, "operand 0 %s has too many dims for an embedding result", type_text(tok).s);
    return;
  }
  int64_t dims[XM_IR_MAX_RANK];
  bool dyn[XM_IR_MAX_RANK];
  for (int i = 0; i < tok->rank; i++)
    dims[i] = tok->dims[i], dyn[i] = tok->dynamic[i];
  dims[tok->rank] = tab->dims[1];
  dyn[tok->rank] = tab->dynamic[1];
  set_result(out, tab->dtype, tok->rank + 1, dims, dyn);
}

static void rule_rmsnorm(rule_ctx_t *c, xm_ir_type_t *out) {
  attr_float(c, "eps", true);
  int e0 = c->errors;
  need_rank(c, 0, -1);
  need_float(c, 0);
  need_rank(c, 1, 1);
  need_float(c, 1);
  if (c->errors > e0) return;
  need_dim_eq(c, "size", 1, 0, 0, in(c, 0)->rank - 1);
  set_result(out, in(c, 0)->dtype, in(c, 0)->rank, in(c, 0)->dims, in(c, 0)->dynamic);
}

static void rule_matmul(rule_ctx_t *c, xm_ir_type_t *out) {
  int e0 = c->errors;
  need_rank(c, 0, -1);
  need_float(c, 0);
  need_rank(c, 1, 2);
  need_float(c, 1);
  if (c->errors > e0) return;
  const xm_ir_type_t *x = in(c, 0), *w = in(c, 1);
  if (!dim_eq(w, 1, x, x->rank - 1)) {
    rule_error(c, "operand 1 has inner dim %s but operand 0 has %s (types %s and %s)",
               dim_text(w, 1).s, dim_text(x, x->rank - 1).s, type_text(w).s, type_text(x).s);
    return;
  }
  int64_t dims[XM_IR_MAX_RANK];
  bool dyn[XM_IR_MAX_RANK];
  for (int i = 0; i < x->rank; i++)
    dims[i] = x->dims[i], dyn[i] = x->dynamic[i];
  dims[x->rank - 1] = w->dims[0];
  dyn[x->rank - 1] = w->dynamic[0];
  set_result(out, x->dtype, x->rank, dims, dyn);
}

/* rope and rope_grad: x[B,S,nh,D] -> same; the rotated span lies in the
 * row and has an even width; the YaRN attrs are finite and the factor and
 * mscale positive (the correction range may end below its start, as
 * transformers computes it for a tiny original context). */
static void rule_rope(rule_ctx_t *c, xm_ir_type_t *out) {
  attr_float(c, "theta", true);
  attr_float(c, "yarn_factor", false);
  attr_float(c, "yarn_low", false);
  attr_float(c, "yarn_high", false);
  attr_float(c, "mscale", false);
  attr_bool(c, "interleave", false);
  int e0 = c->errors;
  need_rank(c, 0, 4);
  need_float(c, 0);
  if (c->errors > e0) return;
  const xm_ir_type_t *x = in(c, 0);
  int64_t D = x->dims[3], off = 0, rd = 0;
  if (xm_ir_op_attr(c->op, "rot_offset")) attr_int(c, "rot_offset", 0, D, &off);
  rd = D - off;
  if (xm_ir_op_attr(c->op, "rot_dim")) attr_int(c, "rot_dim", 0, D - off, &rd);
  if (rd % 2 != 0)
    rule_error(c, "rotates %lld elements of each row, which is odd (rotary pairs need an even "
               "count)", (long long)rd);
  double theta = xm_ir_op_get_float(c->op, "theta", 1);
  double f = xm_ir_op_get_float(c->op, "yarn_factor", 1);
  double m = xm_ir_op_get_float(c->op, "mscale", 1);
  double lo = xm_ir_op_get_float(c->op, "yarn_low", 0);
  double hi = xm_ir_op_get_float(c->op, "yarn_high", 0);
  if (!(theta > 0) || !isfinite(theta) || !(f > 0) || !isfinite(f) || !(m > 0) || !isfinite(m) ||
      !isfinite(lo) || !isfinite(hi))
    rule_error(c, "has theta %g, yarn_factor %g, mscale %g and the correction range [%g, %g]: "
               "theta, the factor and mscale must be finite and > 0, the range finite",
               theta, f, m, lo, hi);
  if (c->errors > e0) return;
  set_result(out, x->dtype, 4, x->dims, x->dynamic);
}

/* split: x[..., H, Da+Db] -> a[..., H, Da], b[..., Hb, Db] with Hb == H or
 * 1. The result types are the op's own (they carry Da, Db and Hb); they
 * are derived again from x but for those. */
static void rule_split(rule_ctx_t *c, xm_ir_type_t *out) {
  int e0 = c->errors;
  need_rank(c, 0, -2);
  /* i32 (MTP's shifted labels) is only cut, never summed over heads. */
  bool ints = in(c, 0)->dtype == XM_DT_I32;
  if (!ints) need_float(c, 0);
  if (c->errors > e0) return;
  const xm_ir_type_t *x = in(c, 0);
  int r = x->rank;
  int64_t da = out[0].rank == r ? out[0].dims[r - 1] : -1;
  int64_t db = out[1].rank == r ? out[1].dims[r - 1] : -1;
  /* b's dim -2 is 1 (a head sum) or the operand's (also after the shard
   * pass split the heads); a declared type that is neither mismatches. */
  int64_t hb = out[1].rank != r                               ? -1
               : out[1].dims[r - 2] == 1 && x->dims[r - 2] != 1 ? (ints ? -1 : 1)
                                                               : x->dims[r - 2];
  if (da < 1 || db < 1 || hb < 1 || da + db != x->dims[r - 1]) {
    rule_error(c, "results %s and %s do not split operand 0 %s along its last dim (each part "
               "at least 1 wide, the second's dim -2 equal to the operand's or 1)",
               type_text(&out[0]).s, type_text(&out[1]).s, type_text(x).s);
    return;
  }
  set_result(&out[0], x->dtype, r, x->dims, x->dynamic);
  out[0].dims[r - 1] = da;
  set_result(&out[1], x->dtype, r, x->dims, x->dynamic);
  out[1].dims[r - 1] = db;
  out[1].dims[r - 2] = hb;
  if (hb != x->dims[r - 2]) out[1].dynamic[r - 2] = false;
}

/* concat: a[..., H, Da], b[..., Hb, Db] -> [..., H, Da+Db], Hb == H or 1. */
static void rule_concat(rule_ctx_t *c, xm_ir_type_t *out) {
  int e0 = c->errors;
  need_rank(c, 0, -2);
  need_float(c, 0);
  need_float(c, 1);
  if (c->errors > e0) return;
  const xm_ir_type_t *a = in(c, 0), *b = in(c, 1);
  int r = a->rank;
  bool ok = b->rank == r && b->dtype == a->dtype;
  for (int i = 0; ok && i < r - 2; i++)
    ok = dim_eq(a, i, b, i);
  if (ok) ok = dim_eq(a, r - 2, b, r - 2) || (b->dims[r - 2] == 1 && !b->dynamic[r - 2]);
  if (!ok) {
    rule_error(c, "operand 1 %s cannot be joined to operand 0 %s along the last dim (same "
               "dtype and rank, equal leading dims, dim -2 equal or 1)",
               type_text(b).s, type_text(a).s);
    return;
  }
  set_result(out, a->dtype, r, a->dims, a->dynamic);
  out->dims[r - 1] = a->dims[r - 1] + b->dims[r - 1];
  out->dynamic[r - 1] = false;
}

static void rule_attention(rule_ctx_t *c, xm_ir_type_t *out) {
  attr_float(c, "scale", true);
  bool ok = true;
  for (int i = 0; i < 3; i++)
    ok = need_rank(c, i, 4) && need_float(c, i) && ok;
  if (!ok) return;
  int e0 = c->errors;
  need_dim_eq(c, "batch dim", 1, 0, 0, 0);
  need_dim_eq(c, "batch dim", 2, 0, 0, 0);
  need_dim_eq(c, "sequence dim", 1, 1, 0, 1);
  need_dim_eq(c, "sequence dim", 2, 1, 0, 1);
  need_dim_eq(c, "kv head count", 2, 2, 1, 2);
  need_dim_eq(c, "head dim", 1, 3, 0, 3);
  if (c->errors > e0) return;
  const xm_ir_type_t *q = in(c, 0), *k = in(c, 1), *v = in(c, 2);
  if (k->dims[2] < 1 || q->dims[2] % k->dims[2] != 0) {
    rule_error(c, "query heads %lld are not a multiple of key/value heads %lld",
               (long long)q->dims[2], (long long)k->dims[2]);
    return;
  }
  int64_t dims[4] = {q->dims[0], q->dims[1], q->dims[2], v->dims[3]};
  bool dyn[4] = {q->dynamic[0], q->dynamic[1], q->dynamic[2], v->dynamic[3]};
  set_result(out, q->dtype, 4, dims, dyn);
}

static void rule_cross_entropy(rule_ctx_t *c, xm_ir_type_t *out) {
  set_scalar_f32(out);
  int e0 = c->errors;
  need_rank(c, 0, -1);
  need_float(c, 0);
  need_index(c, 1);
  if (c->errors > e0) return;
  const xm_ir_type_t *lg = in(c, 0), *lb = in(c, 1);
  bool ok = lb->rank == lg->rank - 1;
  for (int i = 0; ok && i < lb->rank; i++)
    ok = dim_eq(lb, i, lg, i);
  if (!ok)
    rule_error(c, "operand 1 shape %s must equal the leading dims of operand 0 shape %s",
               type_text(lb).s, type_text(lg).s);
}

/* ---- rules: router and padding-free MoE -------------------------------- */

static const char *const k_scoring_choices[] = {"softmax", "sigmoid", NULL};

static void rule_router_score(rule_ctx_t *c, xm_ir_type_t *out) {
  attr_choice(c, "scoring", k_scoring_choices, true);
  int e0 = c->errors;
  need_rank(c, 0, 2);
  need_dtype(c, 0, XM_DT_F32);
  if (c->errors > e0) return;
  set_result(out, XM_DT_F32, 2, in(c, 0)->dims, in(c, 0)->dynamic);
}

/* The routing attributes constrain each other and the expert count E. */
static void check_topk_attrs(rule_ctx_t *c, int64_t num_experts, int64_t *out_k) {
  int64_t k = 0, n_group = 0, topk_group = 0;
  bool have_k = attr_int(c, "k", 1, num_experts, &k);
  bool have_groups = attr_int(c, "n_group", 1, INT64_MAX, &n_group);
  if (have_groups && num_experts % n_group != 0) {
    rule_error(c, "attribute 'n_group' is %lld but must divide the expert count %lld",
               (long long)n_group, (long long)num_experts);
    have_groups = false;
  }
  have_groups =
      attr_int(c, "topk_group", 1, n_group >= 1 ? n_group : INT64_MAX, &topk_group) && have_groups;
  /* Group-limited routing masks all but topk_group groups before the top-k. */
  if (have_k && have_groups && k > topk_group * (num_experts / n_group))
    rule_error(c, "attribute 'k' is %lld but the %lld kept groups hold only %lld experts",
               (long long)k, (long long)topk_group,
               (long long)(topk_group * (num_experts / n_group)));
  attr_bool(c, "norm_topk_prob", true);
  attr_float(c, "routed_scaling", true);
  attr_choice(c, "scoring", k_scoring_choices, true);
  *out_k = have_k ? k : 0;
}

static void rule_topk_route(rule_ctx_t *c, xm_ir_type_t *out) {
  int e0 = c->errors;
  need_rank(c, 0, 2);
  need_dtype(c, 0, XM_DT_F32);
  need_rank(c, 1, 1);
  need_dtype(c, 1, XM_DT_F32);
  if (c->errors > e0) return;
  const xm_ir_type_t *s = in(c, 0);
  need_dim_eq(c, "expert count", 1, 0, 0, 1);
  int64_t k = 0;
  check_topk_attrs(c, s->dims[1], &k);
  if (c->errors > e0) return;
  int64_t dims[2] = {s->dims[0], k};
  bool dyn[2] = {s->dynamic[0], false};
  set_result(&out[0], XM_DT_I32, 2, dims, dyn);
  set_result(&out[1], XM_DT_F32, 2, dims, dyn);
}

static void rule_permute(rule_ctx_t *c, xm_ir_type_t *out) {
  int64_t num_experts = 0, capacity = 0;
  int e0 = c->errors;
  attr_int(c, "num_experts", 1, INT64_MAX, &num_experts);
  attr_int(c, "capacity", 0, INT64_MAX, &capacity);
  need_rank(c, 0, 2);
  need_dtype(c, 0, XM_DT_I32);
  need_rank(c, 1, 2);
  need_dtype(c, 1, XM_DT_F32);
  if (c->errors > e0) return;
  need_dim_eq(c, "token count", 1, 0, 0, 0);
  need_dim_eq(c, "slots per token", 1, 1, 0, 1);
  if (c->errors > e0) return;
  const xm_ir_type_t *ex = in(c, 0);
  int64_t n;
  if (__builtin_mul_overflow(ex->dims[0], ex->dims[1], &n)) {
    rule_error(c, "slot count of operand 0 %s overflows", type_text(ex).s);
    return;
  }
  /* Dropping tokens at capacity makes the kept slot count data-dependent. */
  bool dyn = capacity > 0 || ex->dynamic[0] || ex->dynamic[1];
  set_result(&out[0], XM_DT_I32, 1, &n, &dyn);
  set_result(&out[1], XM_DT_I32, 1, &n, &dyn);
  set_result(&out[2], XM_DT_I32, 1, &num_experts, NULL);
}

static void rule_gather_rows(rule_ctx_t *c, xm_ir_type_t *out) {
  int64_t k = 0;
  int e0 = c->errors;
  attr_int(c, "k", 1, INT64_MAX, &k);
  need_rank(c, 0, 2);
  need_rank(c, 1, 1);
  need_dtype(c, 1, XM_DT_I32);
  if (c->errors > e0) return;
  const xm_ir_type_t *x = in(c, 0), *idx = in(c, 1);
  int64_t dims[2] = {idx->dims[0], x->dims[1]};
  bool dyn[2] = {idx->dynamic[0], x->dynamic[1]};
  set_result(out, x->dtype, 2, dims, dyn);
}

static void rule_grouped_matmul(rule_ctx_t *c, xm_ir_type_t *out) {
  int e0 = c->errors;
  need_rank(c, 0, 2);
  need_float(c, 0);
  need_rank(c, 1, 3);
  need_float(c, 1);
  need_rank(c, 2, 1);
  need_dtype(c, 2, XM_DT_I32);
  if (c->errors > e0) return;
  const xm_ir_type_t *x = in(c, 0), *w = in(c, 1);
  if (!dim_eq(w, 2, x, 1))
    rule_error(c, "operand 1 has inner dim %s but operand 0 has %s (types %s and %s)",
               dim_text(w, 2).s, dim_text(x, 1).s, type_text(w).s, type_text(x).s);
  need_dim_eq(c, "expert count", 2, 0, 1, 0);
  if (c->errors > e0) return;
  int64_t dims[2] = {x->dims[0], w->dims[1]};
  bool dyn[2] = {x->dynamic[0], w->dynamic[1]};
  set_result(out, x->dtype, 2, dims, dyn);
}

static void rule_scatter_combine(rule_ctx_t *c, xm_ir_type_t *out) {
  int e0 = c->errors;
  need_rank(c, 0, 2);
  need_rank(c, 1, 1);
  need_dtype(c, 1, XM_DT_I32);
  need_rank(c, 2, 2);
  need_dtype(c, 2, XM_DT_F32);
  if (c->errors > e0) return;
  const xm_ir_type_t *y = in(c, 0), *w = in(c, 2);
  need_dim_eq(c, "slot count", 1, 0, 0, 0);
  int64_t slots;
  if (!__builtin_mul_overflow(w->dims[0], w->dims[1], &slots) && y->dims[0] > slots)
    rule_error(c, "operand 0 has %s rows but operand 2 %s has only %lld token slots",
               dim_text(y, 0).s, type_text(w).s, (long long)slots);
  if (c->errors > e0) return;
  int64_t dims[2] = {w->dims[0], y->dims[1]};
  bool dyn[2] = {w->dynamic[0], y->dynamic[1]};
  set_result(out, y->dtype, 2, dims, dyn);
}

static void rule_aux_loss(rule_ctx_t *c, xm_ir_type_t *out) {
  set_scalar_f32(out);
  attr_float(c, "alpha", true);
  int e0 = c->errors;
  need_rank(c, 0, 2);
  need_dtype(c, 0, XM_DT_F32);
  need_rank(c, 1, 2);
  need_dtype(c, 1, XM_DT_I32);
  if (c->errors > e0) return;
  need_dim_eq(c, "token count", 1, 0, 0, 0);
}

/* ---- rules: collectives ------------------------------------------------ */

/* The group names of runtime/abi/groups.def: the groups the runtime has a
 * communicator for and the aliases naming their ranks ("sp"). */
static const char *const k_group_choices[] = {
#define XM_GROUP(e, name, rt, doc) name,
#define XM_GROUP_ALIAS(e, name, rt, doc) name,
#include "runtime/abi/groups.def"
    NULL};

/* Attributes group and group_size. `required` false: both may be absent
 * (adamw without ZeRO-1), but one without the other is reported. Returns
 * the group size, 0 when it is absent or invalid (callers then skip the
 * checks that depend on it; the error is already reported). */
static int64_t group_attrs(rule_ctx_t *c, bool required) {
  if (!required && !xm_ir_op_attr(c->op, "group") && !xm_ir_op_attr(c->op, "group_size")) return 0;
  int64_t size = 0;
  attr_choice(c, "group", k_group_choices, true);
  if (!attr_int(c, "group_size", 1, INT64_MAX, &size)) return 0;
  return size;
}

/* Count tables and persistent buffers have their sizes at compile time. */
static bool need_static(rule_ctx_t *c, int i) {
  const xm_ir_type_t *t = in(c, i);
  for (int d = 0; d < t->rank; d++) {
    if (!t->dynamic[d]) continue;
    rule_error(c, "operand %d must have static dims but has type %s", i, type_text(t).s);
    return false;
  }
  return true;
}

/* Operand i is a count table i32[P,L]: one row per member of the group
 * (checked when group_size >= 1), one column per local expert. */
static bool need_counts(rule_ctx_t *c, int i, int64_t group_size) {
  if (!need_rank(c, i, 2) || !need_dtype(c, i, XM_DT_I32) || !need_static(c, i)) return false;
  if (group_size >= 1 && in(c, i)->dims[0] != group_size) {
    rule_error(c,
               "operand %d %s must hold one row of counts per member of the group "
               "(group_size %lld)",
               i, type_text(in(c, i)).s, (long long)group_size);
    return false;
  }
  return true;
}

/* A data-dependent row count: dim 0 of result r is dynamic and its bound is
 * the op's own (what the memory plan reserves), so it is read, not derived. */
static bool row_bound(rule_ctx_t *c, const xm_ir_type_t *res, int r, int64_t *out) {
  if (res->rank < 1 || res->dims[0] < 1) {
    rule_error(c, "result %d has type %s but needs a row bound >= 1 in dim 0", r, type_text(res).s);
    return false;
  }
  *out = res->dims[0];
  return true;
}

/* all_gather grows `dim` by the group size; reduce_scatter and narrow keep
 * one equal slice of it. Any dtype: narrow also slices routing ids (i32). */
static void rule_resize_dim(rule_ctx_t *c, int64_t group_size, xm_ir_type_t *out) {
  const xm_ir_type_t *x = in(c, 0);
  if (x->rank == 0) {
    rule_error(c, "operand 0 is a scalar (%s) and has no dim to split or gather", type_text(x).s);
    return;
  }
  int64_t dim = 0;
  if (!attr_int(c, "dim", 0, x->rank - 1, &dim) || group_size < 1) return;
  int64_t dims[XM_IR_MAX_RANK];
  for (int i = 0; i < x->rank; i++)
    dims[i] = x->dims[i];
  if (c->op->code == XM_OP_ALL_GATHER) {
    if (__builtin_mul_overflow(x->dims[dim], group_size, &dims[dim])) {
      rule_error(c, "dim %lld of operand 0 %s times group_size %lld overflows", (long long)dim,
                 type_text(x).s, (long long)group_size);
      return;
    }
  } else if (x->dims[dim] % group_size != 0) {
    rule_error(c, "dim %lld of operand 0 %s is %s, not divisible by group_size %lld",
               (long long)dim, type_text(x).s, dim_text(x, (int)dim).s, (long long)group_size);
    return;
  } else {
    dims[dim] = x->dims[dim] / group_size;
  }
  set_result(out, x->dtype, x->rank, dims, x->dynamic);
}

/* rows x[N,H], send i32[P,L], recv i32[P,L] -> [?M,H], M bounded by the
 * result type. Rows may be of any dtype (ids travel too). */
static void rule_all_to_all(rule_ctx_t *c, int64_t group_size, xm_ir_type_t *out) {
  /* The stage of an MoE layer it carries: a traffic phase of
   * runtime/abi/groups.def that an all_to_all may name. */
  const char *const traffic[] = {xm_rt_phase_kind_name(XM_RT_PHASE_DISPATCH),
                                 xm_rt_phase_kind_name(XM_RT_PHASE_COMBINE), NULL};
  attr_choice(c, "traffic", traffic, true);
  int e0 = c->errors;
  need_rank(c, 0, 2);
  need_counts(c, 1, group_size);
  need_counts(c, 2, group_size);
  if (c->errors > e0) return;
  if (!xm_ir_type_equal(in(c, 2), in(c, 1))) {
    rule_error(c, "operand 2 (recv counts) %s must have the shape of operand 1 (send counts) %s",
               type_text(in(c, 2)).s, type_text(in(c, 1)).s);
    return;
  }
  int64_t bound = 0;
  if (!row_bound(c, out, 0, &bound)) return;
  int64_t dims[2] = {bound, in(c, 0)->dims[1]};
  /* Dim 0 is dynamic, except on a way back that returns exactly the rows
   * a dispatch sent (the result type says so; the runtime checks it). */
  bool dyn[2] = {out->dynamic[0], in(c, 0)->dynamic[1]};
  set_result(out, in(c, 0)->dtype, 2, dims, dyn);
}

/* send i32[P,L] -> recv i32[P,L], tokens per local expert i32[L] */
static void rule_exchange_counts(rule_ctx_t *c, int64_t group_size, xm_ir_type_t *out) {
  if (!need_counts(c, 0, group_size)) return;
  const xm_ir_type_t *s = in(c, 0);
  set_result(&out[0], XM_DT_I32, 2, s->dims, NULL);
  set_result(&out[1], XM_DT_I32, 1, &s->dims[1], NULL);
}

/* x[M,H], counts i32[P,L] -> x's type (rows regrouped, none added). */
static void rule_sort_chunks(rule_ctx_t *c, xm_ir_type_t *out) {
  int e0 = c->errors;
  need_rank(c, 0, 2);
  need_counts(c, 1, 0);
  if (c->errors > e0) return;
  set_result(out, in(c, 0)->dtype, 2, in(c, 0)->dims, in(c, 0)->dynamic);
}

/* ---- rules: redundancy-bypassing dispatch (docs/design.md, Redundancy-bypassing dispatch) */

/* The routing record lives in the runtime under attr slot; layer names the
 * MoE layer in the traffic counters (required on the dispatch, carried by
 * the others when the pass copies it). */
static void rbd_attrs(rule_ctx_t *c, bool layer_required) {
  int64_t v = 0;
  attr_int(c, "slot", 0, INT64_MAX, &v);
  if (layer_required || xm_ir_op_attr(c->op, "layer")) attr_int(c, "layer", 0, INT64_MAX, &v);
}

/* Operand i is f32[T,k] routing weights; operand j holds T in dim 0. */
static bool need_weights(rule_ctx_t *c, int i, int j, int dj) {
  return need_rank(c, i, 2) && need_dtype(c, i, XM_DT_F32) &&
         need_dim_eq(c, "token count", i, 0, j, dj);
}

/* Operand i is the i32[L] row count per local expert. */
static bool need_local_tpe(rule_ctx_t *c, int i) {
  return need_rank(c, i, 1) && need_dtype(c, i, XM_DT_I32);
}

/* x[T,H], experts i32[T,k], weights f32[T,k] -> rows [?M,H], tpe i32[L] */
static void rule_rbd_dispatch(rule_ctx_t *c, int64_t group_size, xm_ir_type_t *out) {
  int64_t num_experts = 0;
  rbd_attrs(c, true);
  bool have_e = attr_int(c, "num_experts", 1, INT64_MAX, &num_experts);
  int e0 = c->errors;
  need_rank(c, 0, 2);
  need_float(c, 0);
  need_rank(c, 1, 2);
  need_dtype(c, 1, XM_DT_I32);
  if (c->errors > e0) return;
  need_dim_eq(c, "token count", 1, 0, 0, 0);
  need_weights(c, 2, 0, 0);
  if (c->errors > e0) return;
  need_dim_eq(c, "slots per token", 2, 1, 1, 1);
  if (c->errors > e0 || !have_e || group_size < 1) return;
  if (num_experts % group_size != 0) {
    rule_error(c, "attribute 'num_experts' is %lld but must be a multiple of group_size %lld",
               (long long)num_experts, (long long)group_size);
    return;
  }
  int64_t bound = 0, local = num_experts / group_size;
  if (!row_bound(c, &out[0], 0, &bound)) return;
  int64_t dims[2] = {bound, in(c, 0)->dims[1]};
  bool dyn[2] = {true, in(c, 0)->dynamic[1]};
  set_result(&out[0], in(c, 0)->dtype, 2, dims, dyn);
  set_result(&out[1], XM_DT_I32, 1, &local, NULL);
}

/* y[M,H], weights f32[T,k], tpe i32[L] -> [T,H] */
static void rule_rbd_combine(rule_ctx_t *c, xm_ir_type_t *out) {
  rbd_attrs(c, false);
  int e0 = c->errors;
  need_rank(c, 0, 2);
  need_float(c, 0);
  need_rank(c, 1, 2);
  need_dtype(c, 1, XM_DT_F32);
  need_local_tpe(c, 2);
  if (c->errors > e0) return;
  int64_t dims[2] = {in(c, 1)->dims[0], in(c, 0)->dims[1]};
  bool dyn[2] = {in(c, 1)->dynamic[0], in(c, 0)->dynamic[1]};
  set_result(out, in(c, 0)->dtype, 2, dims, dyn);
}

/* dout[T,H], y[M,H], weights f32[T,k], tpe i32[L] -> dy (y's), dweights */
static void rule_rbd_combine_grad(rule_ctx_t *c, xm_ir_type_t *out) {
  rbd_attrs(c, false);
  int e0 = c->errors;
  need_rank(c, 0, 2);
  need_float(c, 0);
  need_rank(c, 1, 2);
  need_float(c, 1);
  need_local_tpe(c, 3);
  if (c->errors > e0) return;
  need_weights(c, 2, 0, 0);
  need_dim_eq(c, "hidden size", 1, 1, 0, 1);
  if (c->errors > e0) return;
  set_result(&out[0], in(c, 1)->dtype, 2, in(c, 1)->dims, in(c, 1)->dynamic);
  set_result(&out[1], XM_DT_F32, 2, in(c, 2)->dims, in(c, 2)->dynamic);
}

/* drows[M,H], tpe i32[L] -> dx[T,H]: T is not in the operands (the
 * dispatch's record holds it), so dim 0 of the result is the op's own. */
static void rule_rbd_dispatch_grad(rule_ctx_t *c, xm_ir_type_t *out) {
  rbd_attrs(c, false);
  int e0 = c->errors;
  need_rank(c, 0, 2);
  need_float(c, 0);
  need_local_tpe(c, 1);
  if (c->errors > e0) return;
  if (out->rank != 2) {
    rule_error(c, "result 0 has type %s but must be [T, %s] (the dispatch's tokens)",
               type_text(out).s, dim_text(in(c, 0), 1).s);
    return;
  }
  int64_t dims[2] = {out->dims[0], in(c, 0)->dims[1]};
  bool dyn[2] = {out->dynamic[0], in(c, 0)->dynamic[1]};
  set_result(out, in(c, 0)->dtype, 2, dims, dyn);
}

/* Exported to verify_train.c (ZeRO-1 and state collectives, adamw). */
int64_t xm_ir_rule_group(xm_ir_rule_ctx_t *c, bool required) { return group_attrs(c, required); }
bool xm_ir_rule_need_static(xm_ir_rule_ctx_t *c, int i) { return need_static(c, i); }

/* Every op with attrs group and group_size whose rule lives in this file. */
static void rule_collective(rule_ctx_t *c, xm_ir_type_t *out) {
  int64_t group_size = group_attrs(c, true);
  const xm_ir_type_t *x = in(c, 0);
  switch (c->op->code) {
  case XM_OP_ALL_REDUCE: set_result(out, x->dtype, x->rank, x->dims, x->dynamic); break;
  case XM_OP_REPLICATE: same_as(c, 0, out); break;
  case XM_OP_ALL_TO_ALL: rule_all_to_all(c, group_size, out); break;
  case XM_OP_EXCHANGE_COUNTS: rule_exchange_counts(c, group_size, out); break;
  case XM_OP_RBD_DISPATCH: rule_rbd_dispatch(c, group_size, out); break;
  case XM_OP_RBD_COMBINE: rule_rbd_combine(c, out); break;
  case XM_OP_RBD_COMBINE_GRAD: rule_rbd_combine_grad(c, out); break;
  case XM_OP_RBD_DISPATCH_GRAD: rule_rbd_dispatch_grad(c, out); break;
  default: rule_resize_dim(c, group_size, out); break;
  }
}

/* ---- inference entry --------------------------------------------------- */

/* Why a type cannot be used (NULL when it is well formed). */
static const char *type_problem(const xm_ir_type_t *t) {
  if (!dtype_ok(t->dtype)) return "an unknown dtype";
  if (t->rank < 0 || t->rank > XM_IR_MAX_RANK) return "a rank outside 0..6";
  for (int i = 0; i < t->rank; i++) {
    if (t->dims[i] < 0) return "a negative dim";
    if (t->dynamic[i] && t->dims[i] < 1) return "a dynamic dim with an upper bound below 1";
    if (t->shard[i] >= XM_AXIS_COUNT_) return "an unknown mesh axis";
  }
  return NULL;
}

/* Operand and result counts against ops.def; return needs one operand. */
static bool arity_ok(rule_ctx_t *c) {
  const xm_ir_opinfo_t *info = xm_ir_opinfo(c->op->code);
  bool ok = true;
  if (info->num_operands >= 0 && c->op->num_operands != info->num_operands) {
    rule_error(c, "has %d operands but %s takes %d", c->op->num_operands, info->name,
               info->num_operands);
    ok = false;
  } else if (c->op->code == XM_OP_RETURN && c->op->num_operands < 1) {
    rule_error(c, "return needs at least one operand (the loss)");
    ok = false;
  }
  if (info->num_results >= 0 && c->op->num_results != info->num_results) {
    rule_error(c, "has %d results but %s gives %d", c->op->num_results, info->name,
               info->num_results);
    ok = false;
  }
  return ok;
}

/* Set by autodiff on every op; the forward graph has none. */
static const char *const k_phase_choices[] = {"fwd", "bwd", "step", NULL};

static void apply_rule(rule_ctx_t *c, xm_ir_type_t *out) {
  switch (c->op->code) {
  case XM_OP_INPUT:
  case XM_OP_PARAM:
  case XM_OP_CONSTANT: rule_source(c); break;
  case XM_OP_RETURN: rule_return(c); break;
  case XM_OP_ADD:
  case XM_OP_MUL: rule_broadcast(c, out); break;
  case XM_OP_SCALE:
  case XM_OP_SILU:
  case XM_OP_GELU:
  case XM_OP_SIGMOID: rule_unary_float(c, out); break;
  case XM_OP_SWIGLU: rule_swiglu(c, out); break;
  case XM_OP_RESHAPE: rule_reshape(c, out); break;
  case XM_OP_EMBEDDING: rule_embedding(c, out); break;
  case XM_OP_RMSNORM: rule_rmsnorm(c, out); break;
  case XM_OP_MATMUL: rule_matmul(c, out); break;
  case XM_OP_ROPE:
  case XM_OP_ROPE_GRAD: rule_rope(c, out); break;
  case XM_OP_SPLIT: rule_split(c, out); break;
  case XM_OP_CONCAT: rule_concat(c, out); break;
  case XM_OP_ATTENTION: rule_attention(c, out); break;
  case XM_OP_ROUTER_SCORE: rule_router_score(c, out); break;
  case XM_OP_TOPK_ROUTE: rule_topk_route(c, out); break;
  case XM_OP_PERMUTE: rule_permute(c, out); break;
  case XM_OP_GATHER_ROWS: rule_gather_rows(c, out); break;
  case XM_OP_GROUPED_MATMUL: rule_grouped_matmul(c, out); break;
  case XM_OP_SCATTER_COMBINE: rule_scatter_combine(c, out); break;
  case XM_OP_CROSS_ENTROPY: rule_cross_entropy(c, out); break;
  case XM_OP_AUX_LOSS: rule_aux_loss(c, out); break;
  case XM_OP_ALL_REDUCE:
  case XM_OP_ALL_GATHER:
  case XM_OP_REDUCE_SCATTER:
  case XM_OP_ALL_TO_ALL:
  case XM_OP_NARROW:
  case XM_OP_REPLICATE:
  case XM_OP_EXCHANGE_COUNTS:
  case XM_OP_RBD_DISPATCH:
  case XM_OP_RBD_COMBINE:
  case XM_OP_RBD_COMBINE_GRAD:
  case XM_OP_RBD_DISPATCH_GRAD: rule_collective(c, out); break;
  case XM_OP_SORT_CHUNKS:
  case XM_OP_UNSORT_CHUNKS: rule_sort_chunks(c, out); break;
  case XM_OP_MATMUL_DX:
  case XM_OP_MATMUL_DW:
  case XM_OP_REDUCE_TO:
  case XM_OP_RMSNORM_GRAD:
  case XM_OP_ATTENTION_GRAD:
  case XM_OP_EMBEDDING_GRAD:
  case XM_OP_SWIGLU_GRAD:
  case XM_OP_SILU_GRAD:
  case XM_OP_GELU_GRAD:
  case XM_OP_SIGMOID_GRAD:
  case XM_OP_CROSS_ENTROPY_GRAD:
  case XM_OP_AUX_LOSS_GRAD:
  case XM_OP_ROUTER_SCORE_GRAD:
  case XM_OP_TOPK_ROUTE_GRAD:
  case XM_OP_GATHER_ROWS_GRAD:
  case XM_OP_GROUPED_MATMUL_DX:
  case XM_OP_GROUPED_MATMUL_DW:
  case XM_OP_SCATTER_COMBINE_GRAD:
  case XM_OP_STATE:
  case XM_OP_ACCUMULATE:
  case XM_OP_GRAD_NORM_SQ:
  case XM_OP_ADAMW:
  case XM_OP_AUX_FREE_UPDATE:
  case XM_OP_ZERO:
  case XM_OP_REDUCE_STATE:
  case XM_OP_ZERO_REDUCE_SCATTER:
  case XM_OP_ZERO_GATHER:
  case XM_OP_HOST_READ: xm_ir_verify_train_rule(c, out); break;
  case XM_OP_GATHER_GROUPED_MATMUL:
  case XM_OP_GROUPED_MATMUL_COMBINE:
  case XM_OP_GATHER_GROUPED_MATMUL_DX:
  case XM_OP_GATHER_GROUPED_MATMUL_DW:
  case XM_OP_GROUPED_MATMUL_COMBINE_GRAD:
  case XM_OP_GROUPED_MATMUL_COMBINE_DW:
  case XM_OP_LM_HEAD_CE:
  case XM_OP_LM_HEAD_CE_GRAD: xm_ir_verify_fused_rule(c, out); break;
  case XM_OP_CAST: xm_ir_verify_mixed_rule(c, out); break;
  case XM_OP_COUNT_: break;
  }
}

/* The shared body of xm_ir_infer_types: `place` names the op. */
static xm_status_t infer_at(const xm_ir_op_t *op, const char *place, xm_diag_t *diag,
                            xm_ir_type_t *out_types) {
  rule_ctx_t c = {op, diag, place, 0};
  if ((int)op->code < 0 || op->code >= XM_OP_COUNT_) {
    rule_error(&c, "unknown opcode %d", (int)op->code);
    return XM_ERR_INVALID_INPUT;
  }
  if (!arity_ok(&c)) return XM_ERR_INVALID_INPUT;
  for (int i = 0; i < op->num_operands; i++) {
    const xm_ir_value_t *v = op->operands ? op->operands[i] : NULL;
    const char *why = v ? type_problem(&v->type) : "no value";
    if (why) rule_error(&c, "operand %d has %s", i, why);
  }
  for (int i = 0; i < op->num_results; i++) {
    if (!op->results || !op->results[i]) {
      rule_error(&c, "result %d has no value", i);
      continue;
    }
    out_types[i] = op->results[i]->type;
    const char *why = type_problem(&out_types[i]);
    if (why) rule_error(&c, "result %d has %s", i, why);
  }
  if (c.errors) return XM_ERR_INVALID_INPUT;
  attr_choice(&c, "phase", k_phase_choices, false);
  apply_rule(&c, out_types);
  return c.errors ? XM_ERR_INVALID_INPUT : XM_OK;
}

static void format_place(const xm_ir_op_t *op, int pos, char *buf, size_t n) {
  const char *name =
      (int)op->code >= 0 && op->code < XM_OP_COUNT_ ? xm_ir_opinfo(op->code)->name : "?";
  int w = pos >= 0 ? snprintf(buf, n, "op %d (%s)", pos, name) : snprintf(buf, n, "op (%s)", name);
  if (op->loc && op->loc[0] && w >= 0 && (size_t)w < n)
    snprintf(buf + w, n - (size_t)w, " at %s", op->loc);
}

xm_status_t xm_ir_infer_types(const xm_ir_op_t *op, xm_diag_t *diag, xm_ir_type_t *out_types) {
  char place[512];
  format_place(op, -1, place, sizeof place);
  return infer_at(op, place, diag, out_types);
}

/* ---- the verifier ------------------------------------------------------ */

typedef struct {
  const xm_ir_module_t *m;
  xm_diag_t *diag;
  int num_values;
  int *def_pos; /* value id -> position of its defining op, -1 if none */
  int *uses;    /* value id -> operand slots of this module that name it */
} verifier_t;

/* Position of the op defining `v` in this module, or -1 when `v` is not
 * one of its values (another module's, or a removed op's). */
static int def_position(const verifier_t *vf, const xm_ir_value_t *v) {
  if (v->id < 0 || v->id >= vf->num_values) return -1;
  int pos = vf->def_pos[v->id];
  if (pos < 0) return -1;
  const xm_ir_op_t *def = xm_ir_module_op(vf->m, pos);
  if (v->index < 0 || v->index >= def->num_results || def->results[v->index] != v) return -1;
  return pos;
}

/* Records where each value is defined; ill-formed results are reported
 * later, in op order, by check_results. */
static void map_definitions(verifier_t *vf) {
  for (int i = 0; i < vf->num_values; i++)
    vf->def_pos[i] = -1;
  for (int i = 0; i < xm_ir_module_num_ops(vf->m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(vf->m, i);
    for (int j = 0; j < op->num_results && op->results; j++) {
      const xm_ir_value_t *v = op->results[j];
      if (v && v->id >= 0 && v->id < vf->num_values && vf->def_pos[v->id] < 0)
        vf->def_pos[v->id] = i;
    }
  }
}

/* Def-before-use; counts uses. Returns false when an operand's type cannot
 * be trusted for inference. */
static bool check_operands(verifier_t *vf, const xm_ir_op_t *op, int pos, const char *place) {
  bool usable = true;
  for (int j = 0; j < op->num_operands; j++) {
    const xm_ir_value_t *v = op->operands ? op->operands[j] : NULL;
    if (!v) {
      xm_diag_add(vf->diag, XM_DIAG_ERROR, NULL, place, "operand %d has no value", j);
      usable = false;
      continue;
    }
    int dp = def_position(vf, v);
    if (dp < 0) {
      xm_diag_add(vf->diag, XM_DIAG_ERROR, NULL, place, "operand %d is not a value of this module",
                  j);
    } else if (dp >= pos) {
      const xm_ir_op_t *def = xm_ir_module_op(vf->m, dp);
      xm_diag_add(vf->diag, XM_DIAG_ERROR, NULL, place,
                  "operand %d is used before its definition (op %d (%s) comes %s)", j, dp,
                  (int)def->code >= 0 && def->code < XM_OP_COUNT_ ? xm_ir_opinfo(def->code)->name
                                                                  : "?",
                  dp == pos ? "at the same place" : "later");
    }
    if (dp >= 0) vf->uses[v->id]++;
    if (type_problem(&v->type)) usable = false; /* reported at its definition */
  }
  return usable;
}

/* Each result must be this op's own value with a unique id. */
static bool check_results(verifier_t *vf, const xm_ir_op_t *op, int pos, const char *place) {
  bool ok = true;
  for (int j = 0; j < op->num_results; j++) {
    const xm_ir_value_t *v = op->results ? op->results[j] : NULL;
    const char *why = NULL;
    if (!v)
      why = "has no value";
    else if (v->def != op || v->index != j)
      why = "does not name this op as its definition";
    else if (v->id < 0 || v->id >= vf->num_values)
      why = "has an id outside the module's range";
    else if (vf->def_pos[v->id] != pos)
      why = "shares its id with another value";
    if (why) {
      xm_diag_add(vf->diag, XM_DIAG_ERROR, NULL, place, "result %d %s", j, why);
      ok = false;
    }
  }
  return ok;
}

/* The op's result types must be what the rules derive. */
static void check_types(verifier_t *vf, const xm_ir_op_t *op, const char *place) {
  xm_ir_type_t inferred[8];
  xm_ir_type_t *types =
      op->num_results <= 8 ? inferred : calloc((size_t)op->num_results, sizeof *types);
  XM_ASSERT(types != NULL);
  if (infer_at(op, place, vf->diag, types) == XM_OK) {
    for (int j = 0; j < op->num_results; j++) {
      if (xm_ir_type_equal(&op->results[j]->type, &types[j])) continue;
      xm_diag_add(vf->diag, XM_DIAG_ERROR, NULL, place,
                  "result %d has type %s but its operands give %s", j,
                  type_text(&op->results[j]->type).s, type_text(&types[j]).s);
    }
  }
  if (types != inferred) free(types);
}

static void check_uses(verifier_t *vf) {
  char place[512];
  for (int i = 0; i < xm_ir_module_num_ops(vf->m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(vf->m, i);
    for (int j = 0; j < op->num_results && op->results; j++) {
      const xm_ir_value_t *v = op->results[j];
      if (!v || v->id < 0 || v->id >= vf->num_values || vf->def_pos[v->id] != i) continue;
      if (v->num_uses == vf->uses[v->id]) continue;
      format_place(op, i, place, sizeof place);
      xm_diag_add(vf->diag, XM_DIAG_ERROR, NULL, place,
                  "result %d records %d uses but %d operands refer to it", j, v->num_uses,
                  vf->uses[v->id]);
    }
  }
}

xm_status_t xm_ir_verify(const xm_ir_module_t *m, xm_diag_t *diag) {
  int errors_before = xm_diag_error_count(diag);
  verifier_t vf = {m, diag, xm_ir_module_num_values(m), NULL, NULL};
  size_t nv = vf.num_values > 0 ? (size_t)vf.num_values : 1;
  vf.def_pos = malloc(nv * sizeof *vf.def_pos);
  vf.uses = calloc(nv, sizeof *vf.uses);
  if (!vf.def_pos || !vf.uses) {
    free(vf.def_pos);
    free(vf.uses);
    return XM_ERR_NO_MEMORY;
  }
  map_definitions(&vf);
  int num_ops = xm_ir_module_num_ops(m), first_return = -1;
  char place[512];
  for (int i = 0; i < num_ops; i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    format_place(op, i, place, sizeof place);
    bool usable = check_operands(&vf, op, i, place);
    usable = check_results(&vf, op, i, place) && usable;
    if (op->code == XM_OP_RETURN) {
      if (first_return >= 0)
        xm_diag_add(diag, XM_DIAG_ERROR, NULL, place, "a second return (the first is op %d)",
                    first_return);
      else if (i != num_ops - 1)
        xm_diag_add(diag, XM_DIAG_ERROR, NULL, place,
                    "return must be the last op, but %d ops follow it", num_ops - 1 - i);
      if (first_return < 0) first_return = i;
    }
    if (usable) check_types(&vf, op, place);
  }
  check_uses(&vf);
  free(vf.def_pos);
  free(vf.uses);
  return xm_diag_error_count(diag) > errors_before ? XM_ERR_INVALID_INPUT : XM_OK;
}
