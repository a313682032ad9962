/* ir/mlir_bridge.c — export of IR modules to MLIR and import back, through
 * the MLIR C API.
 *
 * The mapping (ir/mlir_bridge.h) is chosen so that import is the exact
 * inverse of export: every op becomes one unregistered "xmoe.<name>" op in
 * generic form inside the body of a builtin.module, every IR type a ranked
 * tensor type, every attribute kind one builtin attribute kind. What the IR
 * keeps beside the plain MLIR shape — upper bounds of dynamic dims and
 * sharding — rides along in places MLIR already preserves: the tensor
 * encoding (an array of i64 bounds, "tensor<?x64xf32, [256, 64]>") and a
 * string array attribute. The encoding is an ArrayAttr, not the denser
 * array<i64: ...>, because MLIR 19's tensor type parser only accepts
 * encodings that start with a few token kinds and "array" is not one of
 * them: mlir-opt would print such a type but fail to read it back. Both
 * directions use a fresh MlirContext per call: contexts are cheap next to
 * printing or parsing a model, and nothing leaks between calls.
 *
 * Import must accept any text without crashing. MLIR's own parser does the
 * lexing and reports syntax errors through a diagnostic handler that this
 * file turns into xm_diag entries; after that, every structural property the
 * IR cannot hold (regions, block arguments, unranked tensors, foreign element
 * types or attributes, operands defined after their use) is checked
 * explicitly and reported with the op's location.
 */
#include "ir/mlir_bridge.h"

#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/Diagnostics.h>
#include <mlir-c/IR.h>
#include <mlir-c/Support.h>

#define XM_MLIR_PREFIX "xmoe."
#define XM_MLIR_SHARD_ATTR "xmoe.shard"

static MlirStringRef sref(const char *s) { return mlirStringRefCreate(s, strlen(s)); }

static void append_to_strbuf(MlirStringRef s, void *user) {
  xm_strbuf_append((xm_strbuf_t *)user, s.data, s.length);
}

/* ======================================================================== */
/* Export                                                                    */
/* ======================================================================== */

static MlirType element_type(MlirContext ctx, xm_dtype_t dt) {
  switch (dt) {
  case XM_DT_F32: return mlirF32TypeGet(ctx);
  case XM_DT_BF16: return mlirBF16TypeGet(ctx);
  case XM_DT_F16: return mlirF16TypeGet(ctx);
  case XM_DT_I32: return mlirIntegerTypeGet(ctx, 32);
  case XM_DT_I64: return mlirIntegerTypeGet(ctx, 64);
  case XM_DT_BOOL: return mlirIntegerTypeGet(ctx, 1);
  default: break;
  }
  MlirType none = {NULL};
  return none;
}

/* A ranked tensor type; the bounds of dynamic dims go to the encoding so
 * that MLIR keeps them through any tool that does not know the dialect. */
static xm_status_t export_type(MlirContext ctx, const xm_ir_type_t *t, MlirType *out_type) {
  if (t->rank < 0 || t->rank > XM_IR_MAX_RANK) return XM_ERR_INVALID_INPUT;
  MlirType elt = element_type(ctx, t->dtype);
  if (mlirTypeIsNull(elt)) return XM_ERR_INVALID_INPUT;
  int64_t shape[XM_IR_MAX_RANK];
  bool any_dynamic = false;
  for (int i = 0; i < t->rank; i++) {
    if (t->dynamic[i]) {
      shape[i] = mlirShapedTypeGetDynamicSize();
      any_dynamic = true;
    } else {
      if (t->dims[i] < 0) return XM_ERR_INVALID_INPUT;
      shape[i] = t->dims[i];
    }
  }
  MlirAttribute enc = mlirAttributeGetNull();
  if (any_dynamic) {
    /* An array of i64 rather than array<i64: ...>: MLIR 19 prints a dense
     * array encoding but its type parser cannot read one back. */
    MlirAttribute bounds[XM_IR_MAX_RANK];
    for (int i = 0; i < t->rank; i++)
      bounds[i] = mlirIntegerAttrGet(mlirIntegerTypeGet(ctx, 64), t->dims[i]);
    enc = mlirArrayAttrGet(ctx, t->rank, bounds);
  }
  *out_type = mlirRankedTensorTypeGet(t->rank, shape, elt, enc);
  return XM_OK;
}

static MlirAttribute export_attr(MlirContext ctx, const xm_ir_attr_t *a) {
  switch (a->kind) {
  case XM_ATTR_INT: return mlirIntegerAttrGet(mlirIntegerTypeGet(ctx, 64), a->i);
  case XM_ATTR_FLOAT: return mlirFloatAttrDoubleGet(ctx, mlirF64TypeGet(ctx), a->f);
  case XM_ATTR_BOOL: return mlirBoolAttrGet(ctx, a->i != 0);
  case XM_ATTR_STRING: return mlirStringAttrGet(ctx, sref(a->s ? a->s : ""));
  case XM_ATTR_INTS: return mlirDenseI64ArrayGet(ctx, a->n, a->ints);
  case XM_ATTR_FLOATS: return mlirDenseF64ArrayGet(ctx, a->n, a->floats);
  }
  return mlirAttributeGetNull();
}

/* "xmoe.shard": one string per result ("_,ep"), present only when some
 * result dim is split, so unsharded graphs stay free of noise. */
static MlirAttribute export_shard(MlirContext ctx, const xm_ir_op_t *op) {
  bool any = false;
  for (int r = 0; r < op->num_results && !any; r++) {
    const xm_ir_type_t *t = &op->results[r]->type;
    for (int d = 0; d < t->rank; d++)
      if (t->shard[d] != XM_AXIS_NONE) any = true;
  }
  if (!any) return mlirAttributeGetNull();
  MlirAttribute *elems = calloc((size_t)op->num_results, sizeof *elems);
  XM_ASSERT(elems != NULL);
  xm_strbuf_t sb;
  xm_strbuf_init(&sb);
  for (int r = 0; r < op->num_results; r++) {
    const xm_ir_type_t *t = &op->results[r]->type;
    xm_strbuf_clear(&sb);
    for (int d = 0; d < t->rank; d++) {
      int axis = t->shard[d] < XM_AXIS_COUNT_ ? t->shard[d] : XM_AXIS_NONE;
      xm_strbuf_printf(&sb, "%s%s", d ? "," : "", xm_mesh_axis_name((xm_mesh_axis_t)axis));
    }
    elems[r] = mlirStringAttrGet(ctx, sref(xm_strbuf_cstr(&sb)));
  }
  MlirAttribute arr = mlirArrayAttrGet(ctx, op->num_results, elems);
  xm_strbuf_free(&sb);
  free(elems);
  return arr;
}

static MlirLocation export_loc(MlirContext ctx, const char *loc) {
  MlirLocation unknown = mlirLocationUnknownGet(ctx);
  if (!loc || !*loc) return unknown;
  return mlirLocationNameGet(ctx, sref(loc), unknown);
}

typedef struct {
  MlirContext ctx;
  MlirBlock body;
  MlirValue *values; /* indexed by value id; ptr NULL until defined */
  int num_values;
} exporter_t;

static xm_status_t export_operands(exporter_t *ex, const xm_ir_op_t *op, MlirValue *out_operands) {
  for (int i = 0; i < op->num_operands; i++) {
    const xm_ir_value_t *v = op->operands[i];
    /* An operand not defined by an earlier op breaks the IR's invariant. */
    if (!v || v->id < 0 || v->id >= ex->num_values || mlirValueIsNull(ex->values[v->id]))
      return XM_ERR_INTERNAL;
    out_operands[i] = ex->values[v->id];
  }
  return XM_OK;
}

static xm_status_t export_attrs(exporter_t *ex, const xm_ir_op_t *op, MlirNamedAttribute *out_attrs,
                                int *out_n) {
  int n = 0;
  for (int i = 0; i < op->num_attrs; i++) {
    const xm_ir_attr_t *a = &op->attrs[i];
    /* The key is reserved for sharding; an IR attribute of that name could
     * not come back as what it was. */
    if (strcmp(a->key, XM_MLIR_SHARD_ATTR) == 0) return XM_ERR_UNSUPPORTED;
    MlirAttribute v = export_attr(ex->ctx, a);
    if (mlirAttributeIsNull(v)) return XM_ERR_INTERNAL;
    out_attrs[n++] = mlirNamedAttributeGet(mlirIdentifierGet(ex->ctx, sref(a->key)), v);
  }
  MlirAttribute shard = export_shard(ex->ctx, op);
  if (!mlirAttributeIsNull(shard))
    out_attrs[n++] =
        mlirNamedAttributeGet(mlirIdentifierGet(ex->ctx, sref(XM_MLIR_SHARD_ATTR)), shard);
  *out_n = n;
  return XM_OK;
}

static xm_status_t export_op_parts(exporter_t *ex, const xm_ir_op_t *op, MlirValue *operands,
                                   MlirType *types, MlirNamedAttribute *attrs, int *num_attrs) {
  XM_RETURN_IF_ERROR(export_operands(ex, op, operands));
  for (int i = 0; i < op->num_results; i++)
    XM_RETURN_IF_ERROR(export_type(ex->ctx, &op->results[i]->type, &types[i]));
  return export_attrs(ex, op, attrs, num_attrs);
}

static xm_status_t export_op(exporter_t *ex, const xm_ir_op_t *op) {
  if ((int)op->code < 0 || op->code >= XM_OP_COUNT_) return XM_ERR_INTERNAL;
  char name[96];
  snprintf(name, sizeof name, XM_MLIR_PREFIX "%s", xm_ir_opinfo(op->code)->name);
  size_t nops = (size_t)op->num_operands + 1, nres = (size_t)op->num_results + 1;
  MlirValue *operands = calloc(nops, sizeof *operands);
  MlirType *types = calloc(nres, sizeof *types);
  MlirNamedAttribute *attrs = calloc((size_t)op->num_attrs + 1, sizeof *attrs);
  if (!operands || !types || !attrs) {
    free(operands), free(types), free(attrs);
    return XM_ERR_NO_MEMORY;
  }
  int num_attrs = 0;
  xm_status_t st = export_op_parts(ex, op, operands, types, attrs, &num_attrs);
  if (st == XM_OK) {
    MlirOperationState state = mlirOperationStateGet(sref(name), export_loc(ex->ctx, op->loc));
    mlirOperationStateAddOperands(&state, op->num_operands, operands);
    mlirOperationStateAddResults(&state, op->num_results, types);
    mlirOperationStateAddAttributes(&state, num_attrs, attrs);
    MlirOperation mop = mlirOperationCreate(&state);
    if (mlirOperationIsNull(mop)) {
      st = XM_ERR_INTERNAL;
    } else {
      mlirBlockAppendOwnedOperation(ex->body, mop);
      for (int i = 0; i < op->num_results; i++) {
        const xm_ir_value_t *v = op->results[i];
        if (v->id >= 0 && v->id < ex->num_values)
          ex->values[v->id] = mlirOperationGetResult(mop, i);
      }
    }
  }
  free(operands), free(types), free(attrs);
  return st;
}

static xm_status_t export_module_attrs(MlirContext ctx, MlirOperation mod,
                                       const xm_ir_module_t *m) {
  mlirOperationSetAttributeByName(mod, sref("sym_name"),
                                  mlirStringAttrGet(ctx, sref(xm_ir_module_name(m))));
  xm_strbuf_t key;
  xm_strbuf_init(&key);
  for (int i = 0; i < xm_ir_module_num_attrs(m); i++) {
    const xm_ir_attr_t *a = xm_ir_module_attr(m, i);
    MlirAttribute v = export_attr(ctx, a);
    if (mlirAttributeIsNull(v)) {
      xm_strbuf_free(&key);
      return XM_ERR_INTERNAL;
    }
    xm_strbuf_clear(&key);
    xm_strbuf_printf(&key, XM_MLIR_PREFIX "%s", a->key);
    mlirOperationSetAttributeByName(mod, sref(xm_strbuf_cstr(&key)), v);
  }
  xm_strbuf_free(&key);
  return XM_OK;
}

static xm_status_t export_into(MlirContext ctx, const xm_ir_module_t *m, MlirModule module,
                               xm_strbuf_t *out) {
  MlirOperation mod = mlirModuleGetOperation(module);
  XM_RETURN_IF_ERROR(export_module_attrs(ctx, mod, m));
  exporter_t ex = {.ctx = ctx, .body = mlirModuleGetBody(module)};
  ex.num_values = xm_ir_module_num_values(m);
  ex.values = calloc((size_t)ex.num_values + 1, sizeof *ex.values);
  if (!ex.values) return XM_ERR_NO_MEMORY;
  xm_status_t st = XM_OK;
  for (int i = 0; i < xm_ir_module_num_ops(m) && st == XM_OK; i++)
    st = export_op(&ex, xm_ir_module_op(m, i));
  free(ex.values);
  XM_RETURN_IF_ERROR(st);
  if (!mlirOperationVerify(mod)) return XM_ERR_INTERNAL;

  MlirOpPrintingFlags flags = mlirOpPrintingFlagsCreate();
  mlirOpPrintingFlagsPrintGenericOpForm(flags);
  mlirOpPrintingFlagsEnableDebugInfo(flags, true, /*prettyForm=*/false);
  mlirOperationPrintWithFlags(mod, flags, append_to_strbuf, out);
  mlirOpPrintingFlagsDestroy(flags);
  if (out->len == 0 || out->data[out->len - 1] != '\n') xm_strbuf_puts(out, "\n");
  return XM_OK;
}

xm_status_t xm_mlir_export(const xm_ir_module_t *m, xm_strbuf_t *out) {
  MlirContext ctx = mlirContextCreate();
  mlirContextSetAllowUnregisteredDialects(ctx, true);
  MlirModule module = mlirModuleCreateEmpty(mlirLocationUnknownGet(ctx));
  xm_status_t st = export_into(ctx, m, module, out);
  mlirModuleDestroy(module);
  mlirContextDestroy(ctx);
  return st;
}

/* ======================================================================== */
/* Import                                                                    */
/* ======================================================================== */

/* What a printed location is, as far as the IR cares. */
typedef enum { LOC_UNKNOWN, LOC_NAME, LOC_FILE, LOC_OTHER } loc_kind_t;

/* Reads an MLIR string literal starting at the opening quote, undoing the
 * printer's escapes (\\, \" and two hex digits for anything unprintable);
 * returns the position after the closing quote, or NULL. */
static const char *read_mlir_string(const char *p, xm_strbuf_t *out) {
  if (*p != '"') return NULL;
  for (p++; *p && *p != '"'; p++) {
    if (*p != '\\') {
      xm_strbuf_append(out, p, 1);
      continue;
    }
    p++;
    char c = *p;
    if (c == '\\' || c == '"')
      xm_strbuf_append(out, &c, 1);
    else if (c == 'n')
      xm_strbuf_puts(out, "\n");
    else if (c == 't')
      xm_strbuf_puts(out, "\t");
    else if (isxdigit((unsigned char)c) && isxdigit((unsigned char)p[1])) {
      char hex[3] = {c, p[1], 0};
      char byte = (char)strtol(hex, NULL, 16);
      xm_strbuf_append(out, &byte, 1);
      p++;
    } else {
      return NULL;
    }
  }
  return *p == '"' ? p + 1 : NULL;
}

/* Classifies a location by its printed form and extracts what the IR keeps:
 * the name of a name location, "line:col" of a file location, the raw text
 * otherwise. The C API of MLIR 19 has no accessors for location contents,
 * so the printed text is the only portable way in. */
static loc_kind_t location_text(MlirLocation loc, xm_strbuf_t *out) {
  xm_strbuf_t raw;
  xm_strbuf_init(&raw);
  mlirLocationPrint(loc, append_to_strbuf, &raw);
  const char *p = xm_strbuf_cstr(&raw);
  loc_kind_t kind = LOC_OTHER;
  if (strncmp(p, "loc(", 4) == 0) p += 4;
  if (strncmp(p, "unknown", 7) == 0) {
    kind = LOC_UNKNOWN;
  } else if (*p == '"') {
    xm_strbuf_t s;
    xm_strbuf_init(&s);
    const char *q = read_mlir_string(p, &s);
    if (q && (*q == ')' || *q == '(')) {
      kind = LOC_NAME;
      xm_strbuf_append(out, s.data ? s.data : "", s.len);
    } else if (q && *q == ':') {
      kind = LOC_FILE;
      size_t n = strcspn(q + 1, ")");
      xm_strbuf_append(out, q + 1, n);
    }
    xm_strbuf_free(&s);
  }
  if (kind == LOC_OTHER) xm_strbuf_puts(out, xm_strbuf_cstr(&raw));
  xm_strbuf_free(&raw);
  return kind;
}

typedef struct {
  xm_diag_t *diag;
  const char *source;
} diag_sink_t;

static MlirLogicalResult on_mlir_diagnostic(MlirDiagnostic d, void *user) {
  diag_sink_t *sink = user;
  xm_strbuf_t place, msg;
  xm_strbuf_init(&place);
  xm_strbuf_init(&msg);
  location_text(mlirDiagnosticGetLocation(d), &place);
  mlirDiagnosticPrint(d, append_to_strbuf, &msg);
  while (msg.len && isspace((unsigned char)msg.data[msg.len - 1]))
    msg.data[--msg.len] = 0;
  xm_diag_level_t level = XM_DIAG_NOTE;
  switch (mlirDiagnosticGetSeverity(d)) {
  case MlirDiagnosticError: level = XM_DIAG_ERROR; break;
  case MlirDiagnosticWarning: level = XM_DIAG_WARNING; break;
  default: break;
  }
  xm_diag_add(sink->diag, level, sink->source, place.len ? xm_strbuf_cstr(&place) : NULL, "%s",
              xm_strbuf_cstr(&msg));
  xm_strbuf_free(&place);
  xm_strbuf_free(&msg);
  return mlirLogicalResultSuccess();
}

/* Op pointer -> IR op, open addressing; the key is the MlirOperation's
 * opaque pointer, stable while the MLIR module lives. */
typedef struct {
  const void **keys;
  xm_ir_op_t **vals;
  size_t cap; /* power of two */
} op_map_t;

static size_t ptr_hash(const void *p) {
  uint64_t x = (uint64_t)(uintptr_t)p;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return (size_t)x;
}

static xm_status_t op_map_init(op_map_t *map, size_t n) {
  map->cap = 16;
  while (map->cap < 2 * n + 1)
    map->cap *= 2;
  map->keys = calloc(map->cap, sizeof *map->keys);
  map->vals = calloc(map->cap, sizeof *map->vals);
  return map->keys && map->vals ? XM_OK : XM_ERR_NO_MEMORY;
}

static void op_map_free(op_map_t *map) {
  free(map->keys);
  free(map->vals);
}

static void op_map_put(op_map_t *map, const void *key, xm_ir_op_t *op) {
  size_t i = ptr_hash(key) & (map->cap - 1);
  while (map->keys[i] && map->keys[i] != key)
    i = (i + 1) & (map->cap - 1);
  map->keys[i] = key;
  map->vals[i] = op;
}

static xm_ir_op_t *op_map_get(const op_map_t *map, const void *key) {
  size_t i = ptr_hash(key) & (map->cap - 1);
  while (map->keys[i]) {
    if (map->keys[i] == key) return map->vals[i];
    i = (i + 1) & (map->cap - 1);
  }
  return NULL;
}

typedef struct {
  MlirContext ctx;
  xm_diag_t *diag;
  const char *source;
  xm_ir_module_t *m;
  op_map_t map;
  xm_strbuf_t place; /* location of the op being imported */
} importer_t;

static xm_status_t import_error(importer_t *im, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static xm_status_t import_error(importer_t *im, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  xm_diag_addv(im->diag, XM_DIAG_ERROR, im->source,
               im->place.len ? xm_strbuf_cstr(&im->place) : NULL, fmt, ap);
  va_end(ap);
  return XM_ERR_INVALID_INPUT;
}

/* Copies an MLIR string into a NUL-terminated buffer; the IR cannot hold
 * embedded NUL bytes. */
static bool string_ref_copy(MlirStringRef s, xm_strbuf_t *out) {
  xm_strbuf_clear(out);
  if (s.length == 0) return true;
  if (memchr(s.data, 0, s.length)) return false;
  xm_strbuf_append(out, s.data, s.length);
  return true;
}

static void print_type(MlirType t, xm_strbuf_t *out) { mlirTypePrint(t, append_to_strbuf, out); }

static xm_status_t import_dtype(importer_t *im, MlirType elt, xm_dtype_t *out) {
  if (mlirTypeIsAF32(elt))
    *out = XM_DT_F32;
  else if (mlirTypeIsABF16(elt))
    *out = XM_DT_BF16;
  else if (mlirTypeIsAF16(elt))
    *out = XM_DT_F16;
  else if (mlirTypeIsAInteger(elt) && mlirIntegerTypeIsSignless(elt) &&
           mlirIntegerTypeGetWidth(elt) == 32)
    *out = XM_DT_I32;
  else if (mlirTypeIsAInteger(elt) && mlirIntegerTypeIsSignless(elt) &&
           mlirIntegerTypeGetWidth(elt) == 64)
    *out = XM_DT_I64;
  else if (mlirTypeIsAInteger(elt) && mlirIntegerTypeIsSignless(elt) &&
           mlirIntegerTypeGetWidth(elt) == 1)
    *out = XM_DT_BOOL;
  else {
    xm_strbuf_t s;
    xm_strbuf_init(&s);
    print_type(elt, &s);
    xm_status_t st =
        import_error(im, "unsupported element type '%s' (expected f32, bf16, f16, i32, i64 or i1)",
                     xm_strbuf_cstr(&s));
    xm_strbuf_free(&s);
    return st;
  }
  return XM_OK;
}

/* Reads entry i of a bounds encoding: an array of integers (what export
 * writes) or a dense i64 array (what other producers may write). */
static bool bound_at(MlirAttribute enc, int i, int64_t *out) {
  if (mlirAttributeIsADenseI64Array(enc)) {
    *out = mlirDenseI64ArrayGetElement(enc, i);
    return true;
  }
  MlirAttribute e = mlirArrayAttrGetElement(enc, i);
  if (mlirAttributeIsABool(e) || !mlirAttributeIsAInteger(e)) return false;
  MlirType ty = mlirAttributeGetType(e);
  if (mlirTypeIsAInteger(ty) && mlirIntegerTypeGetWidth(ty) > 64) return false;
  *out = mlirIntegerAttrGetValueInt(e);
  return true;
}

/* The encoding, when present, must hold one bound per dim, static dims
 * repeating their size. */
static xm_status_t import_bounds(importer_t *im, MlirType t, int rank, xm_ir_type_t *out) {
  MlirAttribute enc = mlirRankedTensorTypeGetEncoding(t);
  bool any_dynamic = false;
  for (int i = 0; i < rank; i++)
    any_dynamic |= out->dynamic[i];
  if (mlirAttributeIsNull(enc)) {
    if (any_dynamic)
      return import_error(im, "dynamic dim without an upper bound (expected "
                              "the bounds as the tensor encoding [b0, b1, ...])");
    return XM_OK;
  }
  intptr_t n = -1;
  if (mlirAttributeIsADenseI64Array(enc))
    n = mlirDenseArrayGetNumElements(enc);
  else if (mlirAttributeIsAArray(enc))
    n = mlirArrayAttrGetNumElements(enc);
  if (n != rank)
    return import_error(im,
                        "tensor encoding must be an array of integers with "
                        "one upper bound per dim (%d)",
                        rank);
  for (int i = 0; i < rank; i++) {
    int64_t b;
    if (!bound_at(enc, i, &b))
      return import_error(im, "tensor encoding entry %d is not an integer", i);
    if (out->dynamic[i] && b < 0)
      return import_error(im, "negative upper bound %lld of dim %d", (long long)b, i);
    if (!out->dynamic[i] && b != out->dims[i])
      return import_error(im, "tensor encoding gives %lld for static dim %d of size %lld",
                          (long long)b, i, (long long)out->dims[i]);
    out->dims[i] = b;
  }
  return XM_OK;
}

static xm_status_t import_type(importer_t *im, MlirType t, xm_ir_type_t *out) {
  memset(out, 0, sizeof *out);
  if (!mlirTypeIsARankedTensor(t)) {
    xm_strbuf_t s;
    xm_strbuf_init(&s);
    print_type(t, &s);
    xm_status_t st = import_error(im, "type '%s' is not a ranked tensor type", xm_strbuf_cstr(&s));
    xm_strbuf_free(&s);
    return st;
  }
  int64_t rank = mlirShapedTypeGetRank(t);
  if (rank > XM_IR_MAX_RANK)
    return import_error(im, "tensor rank %lld exceeds the maximum %d", (long long)rank,
                        XM_IR_MAX_RANK);
  XM_RETURN_IF_ERROR(import_dtype(im, mlirShapedTypeGetElementType(t), &out->dtype));
  out->rank = (int)rank;
  for (int i = 0; i < out->rank; i++) {
    out->dynamic[i] = mlirShapedTypeIsDynamicDim(t, i);
    out->dims[i] = out->dynamic[i] ? 0 : mlirShapedTypeGetDimSize(t, i);
  }
  return import_bounds(im, t, out->rank, out);
}

static xm_status_t import_int_attr(importer_t *im, MlirAttribute v, xm_ir_attr_t *out) {
  MlirType ty = mlirAttributeGetType(v);
  if (mlirTypeIsAInteger(ty) && mlirIntegerTypeGetWidth(ty) > 64)
    return import_error(im,
                        "attribute '%s': integers wider than 64 bits are "
                        "not supported",
                        out->key);
  out->kind = XM_ATTR_INT;
  out->i = mlirIntegerAttrGetValueInt(v);
  return XM_OK;
}

static xm_status_t import_array_attr(importer_t *im, MlirAttribute v, xm_ir_attr_t *out) {
  intptr_t n = mlirDenseArrayGetNumElements(v);
  if (n > INT32_MAX / 16) return import_error(im, "attribute '%s': array too long", out->key);
  out->n = (int)n;
  if (mlirAttributeIsADenseI64Array(v)) {
    out->kind = XM_ATTR_INTS;
    out->ints = xm_ir_alloc(im->m, sizeof(int64_t) * (size_t)(n + 1));
    if (!out->ints) return XM_ERR_NO_MEMORY;
    for (intptr_t i = 0; i < n; i++)
      out->ints[i] = mlirDenseI64ArrayGetElement(v, i);
  } else {
    out->kind = XM_ATTR_FLOATS;
    out->floats = xm_ir_alloc(im->m, sizeof(double) * (size_t)(n + 1));
    if (!out->floats) return XM_ERR_NO_MEMORY;
    for (intptr_t i = 0; i < n; i++)
      out->floats[i] = mlirDenseF64ArrayGetElement(v, i);
  }
  return XM_OK;
}

/* Converts one attribute value; `out->key` is already set. Strings are
 * copied into the module arena. BoolAttr is an IntegerAttr of i1 in MLIR,
 * so it is tested first. */
static xm_status_t import_attr(importer_t *im, MlirAttribute v, xm_ir_attr_t *out) {
  if (mlirAttributeIsABool(v)) {
    out->kind = XM_ATTR_BOOL;
    out->i = mlirBoolAttrGetValue(v) ? 1 : 0;
    return XM_OK;
  }
  if (mlirAttributeIsAInteger(v)) return import_int_attr(im, v, out);
  if (mlirAttributeIsAFloat(v)) {
    out->kind = XM_ATTR_FLOAT;
    out->f = mlirFloatAttrGetValueDouble(v);
    return XM_OK;
  }
  if (mlirAttributeIsAString(v)) {
    xm_strbuf_t s;
    xm_strbuf_init(&s);
    bool ok = string_ref_copy(mlirStringAttrGetValue(v), &s);
    if (ok) {
      out->kind = XM_ATTR_STRING;
      out->s = xm_ir_strdup(im->m, xm_strbuf_cstr(&s));
    }
    xm_strbuf_free(&s);
    if (!ok) return import_error(im, "attribute '%s': string holds a NUL byte", out->key);
    return XM_OK;
  }
  if (mlirAttributeIsADenseI64Array(v) || mlirAttributeIsADenseF64Array(v))
    return import_array_attr(im, v, out);
  xm_strbuf_t s;
  xm_strbuf_init(&s);
  mlirAttributePrint(v, append_to_strbuf, &s);
  xm_status_t st =
      import_error(im,
                   "attribute '%s' = %s: unsupported kind (expected an integer, float, "
                   "bool, string, array<i64: ...> or array<f64: ...>)",
                   out->key, xm_strbuf_cstr(&s));
  xm_strbuf_free(&s);
  return st;
}

/* Parses "axis,axis,..." (one name per dim; "" for a scalar) into t. */
static xm_status_t apply_shard_text(importer_t *im, int r, char *text, xm_ir_type_t *t) {
  int count = *text ? 1 : 0;
  for (const char *c = text; *c; c++)
    count += *c == ',';
  if (count != t->rank)
    return import_error(im,
                        "'" XM_MLIR_SHARD_ATTR "' entry %d names %d dims, "
                        "the result has rank %d",
                        r, count, t->rank);
  char *tok = text;
  for (int d = 0; d < t->rank; d++) {
    char *comma = strchr(tok, ',');
    if (comma) *comma = 0;
    xm_mesh_axis_t axis;
    if (!xm_mesh_axis_from_name(tok, &axis))
      return import_error(im,
                          "'" XM_MLIR_SHARD_ATTR "' entry %d: bad axis '%s' "
                          "(expected one of _, dp, tp, ep, edp, sp, node)",
                          r, tok);
    t->shard[d] = (uint8_t)axis;
    tok = comma ? comma + 1 : tok + strlen(tok);
  }
  return XM_OK;
}

/* Applies "xmoe.shard" (one "axis,axis,..." string per result) to the
 * result types of `op`. */
static xm_status_t import_shard(importer_t *im, MlirAttribute v, xm_ir_op_t *op) {
  if (!mlirAttributeIsAArray(v) || mlirArrayAttrGetNumElements(v) != op->num_results)
    return import_error(im,
                        "'" XM_MLIR_SHARD_ATTR "' must be an array of %d "
                        "strings, one per result",
                        op->num_results);
  xm_strbuf_t s;
  xm_strbuf_init(&s);
  xm_status_t st = XM_OK;
  for (int r = 0; r < op->num_results && st == XM_OK; r++) {
    MlirAttribute e = mlirArrayAttrGetElement(v, r);
    xm_ir_type_t *t = &op->results[r]->type;
    if (!mlirAttributeIsAString(e) || !string_ref_copy(mlirStringAttrGetValue(e), &s)) {
      st = import_error(im, "'" XM_MLIR_SHARD_ATTR "' entry %d is not a string", r);
      break;
    }
    st = apply_shard_text(im, r, s.data ? s.data : (char *)"", t);
  }
  xm_strbuf_free(&s);
  return st;
}

static xm_status_t import_op_attrs(importer_t *im, MlirOperation mop, xm_ir_op_t *op) {
  xm_strbuf_t key;
  xm_strbuf_init(&key);
  xm_status_t st = XM_OK;
  intptr_t n = mlirOperationGetNumAttributes(mop);
  for (intptr_t i = 0; i < n && st == XM_OK; i++) {
    MlirNamedAttribute na = mlirOperationGetAttribute(mop, i);
    if (!string_ref_copy(mlirIdentifierStr(na.name), &key)) {
      st = import_error(im, "attribute name holds a NUL byte");
      break;
    }
    if (strcmp(xm_strbuf_cstr(&key), XM_MLIR_SHARD_ATTR) == 0) {
      st = import_shard(im, na.attribute, op);
      continue;
    }
    xm_ir_attr_t a = {.key = xm_strbuf_cstr(&key)};
    st = import_attr(im, na.attribute, &a);
    if (st == XM_OK) xm_ir_op_set_attr(im->m, op, &a);
  }
  xm_strbuf_free(&key);
  return st;
}

static xm_status_t import_operand(importer_t *im, MlirValue v, int i, xm_ir_value_t **out) {
  if (mlirValueIsABlockArgument(v))
    return import_error(im,
                        "operand %d is a block argument; only results of "
                        "earlier ops in the module body are supported",
                        i);
  if (!mlirValueIsAOpResult(v)) return import_error(im, "operand %d is not an op result", i);
  MlirOperation owner = mlirOpResultGetOwner(v);
  xm_ir_op_t *def = op_map_get(&im->map, owner.ptr);
  if (!def)
    return import_error(im,
                        "operand %d is not defined by an earlier op of the "
                        "module body (ops must be in topological order)",
                        i);
  intptr_t r = mlirOpResultGetResultNumber(v);
  if (r < 0 || r >= def->num_results) return XM_ERR_INTERNAL;
  *out = def->results[r];
  return XM_OK;
}

/* Checks what the IR cannot hold and finds the opcode. */
static xm_status_t import_op_kind(importer_t *im, MlirOperation mop, xm_ir_opcode_t *out_code) {
  xm_strbuf_t name;
  xm_strbuf_init(&name);
  bool ok = string_ref_copy(mlirIdentifierStr(mlirOperationGetName(mop)), &name);
  const char *s = xm_strbuf_cstr(&name);
  size_t plen = strlen(XM_MLIR_PREFIX);
  xm_status_t st = XM_OK;
  if (!ok || strncmp(s, XM_MLIR_PREFIX, plen) != 0 || !xm_ir_opcode_from_name(s + plen, out_code))
    st = import_error(im,
                      "unknown op '%s' (expected an op of the xmoe dialect, "
                      "e.g. \"xmoe.matmul\")",
                      s);
  else if (mlirOperationGetNumRegions(mop) > 0)
    st = import_error(im, "op '%s' has regions; nested regions are not supported", s);
  else if (mlirOperationGetNumSuccessors(mop) > 0)
    st = import_error(im, "op '%s' has successors; control flow is not supported", s);
  xm_strbuf_free(&name);
  return st;
}

static xm_status_t import_op_body(importer_t *im, MlirOperation mop, xm_ir_opcode_t code,
                                  xm_ir_value_t **operands, xm_ir_type_t *types, int nops,
                                  int nres) {
  for (int i = 0; i < nops; i++)
    XM_RETURN_IF_ERROR(import_operand(im, mlirOperationGetOperand(mop, i), i, &operands[i]));
  for (int i = 0; i < nres; i++)
    XM_RETURN_IF_ERROR(
        import_type(im, mlirValueGetType(mlirOperationGetResult(mop, i)), &types[i]));
  xm_strbuf_t loc;
  xm_strbuf_init(&loc);
  loc_kind_t kind = location_text(mlirOperationGetLocation(mop), &loc);
  xm_ir_op_t *op = xm_ir_op_append(im->m, code, nops, operands, nres, types,
                                   kind == LOC_NAME ? xm_strbuf_cstr(&loc) : "");
  xm_strbuf_free(&loc);
  if (!op) return XM_ERR_NO_MEMORY;
  op_map_put(&im->map, mop.ptr, op);
  return import_op_attrs(im, mop, op);
}

static xm_status_t import_op(importer_t *im, MlirOperation mop) {
  xm_strbuf_clear(&im->place);
  location_text(mlirOperationGetLocation(mop), &im->place);
  xm_ir_opcode_t code;
  XM_RETURN_IF_ERROR(import_op_kind(im, mop, &code));
  intptr_t nops = mlirOperationGetNumOperands(mop);
  intptr_t nres = mlirOperationGetNumResults(mop);
  if (nops > INT32_MAX / 16 || nres > INT32_MAX / 16) return XM_ERR_NO_MEMORY;
  xm_ir_value_t **operands = calloc((size_t)nops + 1, sizeof *operands);
  xm_ir_type_t *types = calloc((size_t)nres + 1, sizeof *types);
  xm_status_t st = XM_ERR_NO_MEMORY;
  if (operands && types) st = import_op_body(im, mop, code, operands, types, (int)nops, (int)nres);
  free(operands);
  free(types);
  return st;
}

static xm_status_t import_module_attrs(importer_t *im, MlirOperation mod) {
  xm_strbuf_clear(&im->place);
  location_text(mlirOperationGetLocation(mod), &im->place);
  xm_strbuf_t key;
  xm_strbuf_init(&key);
  xm_status_t st = XM_OK;
  size_t plen = strlen(XM_MLIR_PREFIX);
  intptr_t n = mlirOperationGetNumAttributes(mod);
  for (intptr_t i = 0; i < n && st == XM_OK; i++) {
    MlirNamedAttribute na = mlirOperationGetAttribute(mod, i);
    if (!string_ref_copy(mlirIdentifierStr(na.name), &key)) {
      st = import_error(im, "attribute name holds a NUL byte");
      break;
    }
    const char *k = xm_strbuf_cstr(&key);
    if (strcmp(k, "sym_name") == 0) continue; /* read at module creation */
    if (strncmp(k, XM_MLIR_PREFIX, plen) != 0 || !k[plen]) {
      st = import_error(im,
                        "module attribute '%s' is not supported (module "
                        "attributes take the prefix \"" XM_MLIR_PREFIX "\")",
                        k);
      break;
    }
    xm_ir_attr_t a = {.key = k + plen};
    st = import_attr(im, na.attribute, &a);
    if (st == XM_OK) xm_ir_module_set_attr(im->m, &a);
  }
  xm_strbuf_free(&key);
  return st;
}

static xm_status_t import_module_name(importer_t *im, MlirOperation mod) {
  MlirAttribute name = mlirOperationGetAttributeByName(mod, sref("sym_name"));
  xm_strbuf_t s;
  xm_strbuf_init(&s);
  const char *cname = NULL;
  if (!mlirAttributeIsNull(name) && mlirAttributeIsAString(name)) {
    if (!string_ref_copy(mlirStringAttrGetValue(name), &s)) {
      xm_strbuf_free(&s);
      return import_error(im, "module name holds a NUL byte");
    }
    cname = xm_strbuf_cstr(&s);
  }
  xm_status_t st = xm_ir_module_create(cname, &im->m);
  xm_strbuf_free(&s);
  return st;
}

static xm_status_t import_module(importer_t *im, MlirModule module) {
  MlirOperation mod = mlirModuleGetOperation(module);
  XM_RETURN_IF_ERROR(import_module_name(im, mod));
  XM_RETURN_IF_ERROR(import_module_attrs(im, mod));
  MlirBlock body = mlirModuleGetBody(module);
  size_t count = 0;
  for (MlirOperation op = mlirBlockGetFirstOperation(body); !mlirOperationIsNull(op);
       op = mlirOperationGetNextInBlock(op))
    count++;
  XM_RETURN_IF_ERROR(op_map_init(&im->map, count));
  for (MlirOperation op = mlirBlockGetFirstOperation(body); !mlirOperationIsNull(op);
       op = mlirOperationGetNextInBlock(op))
    XM_RETURN_IF_ERROR(import_op(im, op));
  return XM_OK;
}

xm_status_t xm_mlir_import(const char *text, size_t len, const char *source, xm_diag_t *diag,
                           xm_ir_module_t **out_module) {
  *out_module = NULL;
  if (!source) source = "<mlir>";
  MlirContext ctx = mlirContextCreate();
  mlirContextSetAllowUnregisteredDialects(ctx, true);
  diag_sink_t sink = {diag, source};
  mlirContextAttachDiagnosticHandler(ctx, on_mlir_diagnostic, &sink, NULL);

  /* MLIR's lexer reads the NUL after the buffer as its end marker. */
  char *copy = malloc(len + 1);
  if (!copy) {
    mlirContextDestroy(ctx);
    return XM_ERR_NO_MEMORY;
  }
  if (len) memcpy(copy, text, len);
  copy[len] = 0;
  int errors_before = xm_diag_error_count(diag);
  MlirModule module = mlirModuleCreateParse(ctx, mlirStringRefCreate(copy, len));
  free(copy);
  if (mlirModuleIsNull(module)) {
    if (xm_diag_error_count(diag) == errors_before)
      xm_diag_add(diag, XM_DIAG_ERROR, source, NULL, "cannot parse MLIR");
    mlirContextDestroy(ctx);
    return XM_ERR_INVALID_INPUT;
  }
  importer_t im = {.ctx = ctx, .diag = diag, .source = source};
  xm_strbuf_init(&im.place);
  xm_status_t st = import_module(&im, module);
  op_map_free(&im.map);
  xm_strbuf_free(&im.place);
  mlirModuleDestroy(module);
  mlirContextDestroy(ctx);
  if (st != XM_OK) {
    xm_ir_module_destroy(im.m);
    return st;
  }
  *out_module = im.m;
  return XM_OK;
}
