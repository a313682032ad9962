/* ir/ir.c — construction and mutation of IR modules.
 *
 * Memory: a module owns a chain of arena blocks; ops, values, attribute
 * arrays and strings are carved from it and never freed one by one. The op
 * array itself is a malloc'd vector because passes reorder and shrink it.
 * Attribute arrays are small and re-carved on insert (the old copy is left
 * in the arena), which keeps keys sorted without a separate index.
 */
#include "ir/ir.h"

#include <stdlib.h>
#include <string.h>

/* ---- op table ---------------------------------------------------------- */

static const xm_ir_opinfo_t k_opinfo[XM_OP_COUNT_] = {
#define XM_IR_OP(e, name, nops, nres, flags, doc) {name, nops, nres, flags, doc},
#include "ir/ops.def"
#undef XM_IR_OP
};

const xm_ir_opinfo_t *xm_ir_opinfo(xm_ir_opcode_t code) {
  XM_ASSERT((int)code >= 0 && code < XM_OP_COUNT_);
  return &k_opinfo[code];
}

bool xm_ir_opcode_from_name(const char *name, xm_ir_opcode_t *out_code) {
  for (int i = 0; i < XM_OP_COUNT_; i++) {
    if (strcmp(k_opinfo[i].name, name) == 0) {
      *out_code = (xm_ir_opcode_t)i;
      return true;
    }
  }
  return false;
}

/* ---- dtypes and axes --------------------------------------------------- */

static const char *const k_dtype_names[XM_DT_COUNT_] = {"f32", "bf16", "f16",
                                                       "i32", "i64", "i1"};
static const size_t k_dtype_sizes[XM_DT_COUNT_] = {4, 2, 2, 4, 8, 1};

const char *xm_dtype_name(xm_dtype_t dt) {
  XM_ASSERT((int)dt >= 0 && dt < XM_DT_COUNT_);
  return k_dtype_names[dt];
}

bool xm_dtype_from_name(const char *name, xm_dtype_t *out) {
  for (int i = 0; i < XM_DT_COUNT_; i++) {
    if (strcmp(k_dtype_names[i], name) == 0) {
      *out = (xm_dtype_t)i;
      return true;
    }
  }
  return false;
}

size_t xm_dtype_size(xm_dtype_t dt) {
  XM_ASSERT((int)dt >= 0 && dt < XM_DT_COUNT_);
  return k_dtype_sizes[dt];
}

static const char *const k_axis_names[XM_AXIS_COUNT_] = {
    "_", "dp", "tp", "ep", "edp", "sp", "node"};

const char *xm_mesh_axis_name(xm_mesh_axis_t a) {
  XM_ASSERT((int)a >= 0 && a < XM_AXIS_COUNT_);
  return k_axis_names[a];
}

bool xm_mesh_axis_from_name(const char *name, xm_mesh_axis_t *out) {
  for (int i = 0; i < XM_AXIS_COUNT_; i++) {
    if (strcmp(k_axis_names[i], name) == 0) {
      *out = (xm_mesh_axis_t)i;
      return true;
    }
  }
  return false;
}

/* ---- types ------------------------------------------------------------- */

xm_ir_type_t xm_ir_type_make(xm_dtype_t dt, int rank, const int64_t *dims) {
  XM_ASSERT(rank >= 0 && rank <= XM_IR_MAX_RANK);
  xm_ir_type_t t;
  memset(&t, 0, sizeof t);
  t.dtype = dt;
  t.rank = rank;
  for (int i = 0; i < rank; i++) t.dims[i] = dims[i];
  return t;
}

bool xm_ir_type_equal(const xm_ir_type_t *a, const xm_ir_type_t *b) {
  if (a->dtype != b->dtype || a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; i++)
    if (a->dims[i] != b->dims[i] || a->dynamic[i] != b->dynamic[i]) return false;
  return true;
}

bool xm_ir_type_identical(const xm_ir_type_t *a, const xm_ir_type_t *b) {
  if (!xm_ir_type_equal(a, b)) return false;
  for (int i = 0; i < a->rank; i++)
    if (a->shard[i] != b->shard[i]) return false;
  return true;
}

int64_t xm_ir_type_numel(const xm_ir_type_t *t) {
  int64_t n = 1;
  for (int i = 0; i < t->rank; i++) {
    if (t->dims[i] < 0) return -1;
    if (t->dims[i] != 0 && n > INT64_MAX / t->dims[i]) return -1;
    n *= t->dims[i];
  }
  return n;
}

/* ---- module and arena -------------------------------------------------- */

typedef struct arena_block {
  struct arena_block *next;
  size_t used, size;
  _Alignas(16) unsigned char data[];
} arena_block_t;

struct xm_ir_module {
  arena_block_t *arena;
  const char *name;
  xm_ir_op_t **ops; /* malloc'd */
  int num_ops, cap_ops;
  int num_values;
  int num_attrs;
  xm_ir_attr_t *attrs;
};

void *xm_ir_alloc(xm_ir_module_t *m, size_t size) {
  if (size > ((size_t)1 << 40)) return NULL;
  size = (size + 15) & ~(size_t)15;
  arena_block_t *b = m->arena;
  if (!b || b->used + size > b->size) {
    size_t bsize = size > 65536 ? size : 65536;
    arena_block_t *nb = malloc(sizeof *nb + bsize);
    if (!nb) return NULL;
    nb->next = b;
    nb->used = 0;
    nb->size = bsize;
    m->arena = nb;
    b = nb;
  }
  void *p = b->data + b->used;
  b->used += size;
  memset(p, 0, size);
  return p;
}

static void *alloc_or_die(xm_ir_module_t *m, size_t size) {
  void *p = xm_ir_alloc(m, size);
  XM_ASSERT(p != NULL);
  return p;
}

const char *xm_ir_strdup(xm_ir_module_t *m, const char *s) {
  if (!s) s = "";
  size_t n = strlen(s);
  char *d = alloc_or_die(m, n + 1);
  memcpy(d, s, n + 1);
  return d;
}

xm_status_t xm_ir_module_create(const char *name, xm_ir_module_t **out_module) {
  xm_ir_module_t *m = calloc(1, sizeof *m);
  if (!m) return XM_ERR_NO_MEMORY;
  m->name = xm_ir_strdup(m, name ? name : "module");
  *out_module = m;
  return XM_OK;
}

void xm_ir_module_destroy(xm_ir_module_t *m) {
  if (!m) return;
  arena_block_t *b = m->arena;
  while (b) {
    arena_block_t *n = b->next;
    free(b);
    b = n;
  }
  free(m->ops);
  free(m);
}

const char *xm_ir_module_name(const xm_ir_module_t *m) { return m->name; }
int xm_ir_module_num_ops(const xm_ir_module_t *m) { return m->num_ops; }
xm_ir_op_t *xm_ir_module_op(const xm_ir_module_t *m, int i) {
  XM_ASSERT(i >= 0 && i < m->num_ops);
  return m->ops[i];
}
int xm_ir_module_num_values(const xm_ir_module_t *m) { return m->num_values; }
int xm_ir_module_num_attrs(const xm_ir_module_t *m) { return m->num_attrs; }
const xm_ir_attr_t *xm_ir_module_attr(const xm_ir_module_t *m, int i) {
  XM_ASSERT(i >= 0 && i < m->num_attrs);
  return &m->attrs[i];
}

/* ---- ops --------------------------------------------------------------- */

xm_ir_op_t *xm_ir_op_append(xm_ir_module_t *m, xm_ir_opcode_t code,
                            int num_operands, xm_ir_value_t *const *operands,
                            int num_results, const xm_ir_type_t *result_types,
                            const char *loc) {
  XM_ASSERT(num_operands >= 0 && num_results >= 0);
  if (m->num_ops == m->cap_ops) {
    int cap = m->cap_ops ? m->cap_ops * 2 : 256;
    xm_ir_op_t **ops = realloc(m->ops, (size_t)cap * sizeof *ops);
    if (!ops) return NULL;
    m->ops = ops;
    m->cap_ops = cap;
  }
  xm_ir_op_t *op = xm_ir_alloc(m, sizeof *op);
  if (!op) return NULL;
  op->code = code;
  op->loc = xm_ir_strdup(m, loc ? loc : "");
  op->num_operands = num_operands;
  op->operands = alloc_or_die(m, sizeof(xm_ir_value_t *) * (size_t)(num_operands + 1));
  for (int i = 0; i < num_operands; i++) {
    XM_ASSERT(operands[i] != NULL);
    op->operands[i] = operands[i];
    operands[i]->num_uses++;
  }
  op->num_results = num_results;
  op->results = alloc_or_die(m, sizeof(xm_ir_value_t *) * (size_t)(num_results + 1));
  for (int i = 0; i < num_results; i++) {
    xm_ir_value_t *v = alloc_or_die(m, sizeof *v);
    v->id = m->num_values++;
    v->type = result_types[i];
    v->def = op;
    v->index = i;
    op->results[i] = v;
  }
  m->ops[m->num_ops++] = op;
  return op;
}

xm_ir_value_t *xm_ir_build1(xm_ir_module_t *m, xm_ir_opcode_t code,
                            int num_operands, xm_ir_value_t *const *operands,
                            xm_ir_type_t result_type, const char *loc) {
  xm_ir_op_t *op = xm_ir_op_append(m, code, num_operands, operands, 1,
                                   &result_type, loc);
  XM_ASSERT(op != NULL);
  return op->results[0];
}

/* Inserts or replaces `a` in a sorted attribute array. */
static void attrs_put(xm_ir_module_t *m, xm_ir_attr_t **attrs, int *num,
                      const xm_ir_attr_t *a) {
  xm_ir_attr_t copy = *a;
  copy.key = xm_ir_strdup(m, a->key);
  if (a->kind == XM_ATTR_STRING) copy.s = xm_ir_strdup(m, a->s);
  if (a->kind == XM_ATTR_INTS) {
    copy.ints = alloc_or_die(m, sizeof(int64_t) * (size_t)(a->n + 1));
    if (a->n) memcpy(copy.ints, a->ints, sizeof(int64_t) * (size_t)a->n);
  }
  if (a->kind == XM_ATTR_FLOATS) {
    copy.floats = alloc_or_die(m, sizeof(double) * (size_t)(a->n + 1));
    if (a->n) memcpy(copy.floats, a->floats, sizeof(double) * (size_t)a->n);
  }
  int pos = 0;
  while (pos < *num && strcmp((*attrs)[pos].key, a->key) < 0) pos++;
  if (pos < *num && strcmp((*attrs)[pos].key, a->key) == 0) {
    (*attrs)[pos] = copy;
    return;
  }
  xm_ir_attr_t *na = alloc_or_die(m, sizeof *na * (size_t)(*num + 1));
  if (pos) memcpy(na, *attrs, sizeof *na * (size_t)pos);
  na[pos] = copy;
  if (*num > pos) memcpy(na + pos + 1, *attrs + pos, sizeof *na * (size_t)(*num - pos));
  *attrs = na;
  (*num)++;
}

void xm_ir_op_set_attr(xm_ir_module_t *m, xm_ir_op_t *op, const xm_ir_attr_t *a) {
  attrs_put(m, &op->attrs, &op->num_attrs, a);
}

void xm_ir_module_set_attr(xm_ir_module_t *m, const xm_ir_attr_t *a) {
  attrs_put(m, &m->attrs, &m->num_attrs, a);
}

const xm_ir_attr_t *xm_ir_module_find_attr(const xm_ir_module_t *m, const char *key) {
  for (int i = 0; i < m->num_attrs; i++)
    if (strcmp(m->attrs[i].key, key) == 0) return &m->attrs[i];
  return NULL;
}

int64_t xm_ir_module_get_int(const xm_ir_module_t *m, const char *key, int64_t dflt) {
  const xm_ir_attr_t *a = xm_ir_module_find_attr(m, key);
  return a && a->kind == XM_ATTR_INT ? a->i : dflt;
}

void xm_ir_module_set_int(xm_ir_module_t *m, const char *key, int64_t v) {
  xm_ir_attr_t a = {.key = key, .kind = XM_ATTR_INT, .i = v};
  xm_ir_module_set_attr(m, &a);
}

void xm_ir_op_set_int(xm_ir_module_t *m, xm_ir_op_t *op, const char *key, int64_t v) {
  xm_ir_attr_t a = {.key = key, .kind = XM_ATTR_INT, .i = v};
  xm_ir_op_set_attr(m, op, &a);
}

void xm_ir_op_set_float(xm_ir_module_t *m, xm_ir_op_t *op, const char *key, double v) {
  xm_ir_attr_t a = {.key = key, .kind = XM_ATTR_FLOAT, .f = v};
  xm_ir_op_set_attr(m, op, &a);
}

void xm_ir_op_set_bool(xm_ir_module_t *m, xm_ir_op_t *op, const char *key, bool v) {
  xm_ir_attr_t a = {.key = key, .kind = XM_ATTR_BOOL, .i = v ? 1 : 0};
  xm_ir_op_set_attr(m, op, &a);
}

void xm_ir_op_set_string(xm_ir_module_t *m, xm_ir_op_t *op, const char *key, const char *v) {
  xm_ir_attr_t a = {.key = key, .kind = XM_ATTR_STRING, .s = v};
  xm_ir_op_set_attr(m, op, &a);
}

void xm_ir_op_set_ints(xm_ir_module_t *m, xm_ir_op_t *op, const char *key, int n,
                       const int64_t *v) {
  xm_ir_attr_t a = {.key = key, .kind = XM_ATTR_INTS, .n = n, .ints = (int64_t *)v};
  xm_ir_op_set_attr(m, op, &a);
}

void xm_ir_op_set_floats(xm_ir_module_t *m, xm_ir_op_t *op, const char *key, int n,
                         const double *v) {
  xm_ir_attr_t a = {.key = key, .kind = XM_ATTR_FLOATS, .n = n, .floats = (double *)v};
  xm_ir_op_set_attr(m, op, &a);
}

const xm_ir_attr_t *xm_ir_op_attr(const xm_ir_op_t *op, const char *key) {
  for (int i = 0; i < op->num_attrs; i++)
    if (strcmp(op->attrs[i].key, key) == 0) return &op->attrs[i];
  return NULL;
}

int64_t xm_ir_op_get_int(const xm_ir_op_t *op, const char *key, int64_t dflt) {
  const xm_ir_attr_t *a = xm_ir_op_attr(op, key);
  return a && (a->kind == XM_ATTR_INT || a->kind == XM_ATTR_BOOL) ? a->i : dflt;
}

double xm_ir_op_get_float(const xm_ir_op_t *op, const char *key, double dflt) {
  const xm_ir_attr_t *a = xm_ir_op_attr(op, key);
  if (!a) return dflt;
  if (a->kind == XM_ATTR_FLOAT) return a->f;
  if (a->kind == XM_ATTR_INT) return (double)a->i;
  return dflt;
}

bool xm_ir_op_get_bool(const xm_ir_op_t *op, const char *key, bool dflt) {
  const xm_ir_attr_t *a = xm_ir_op_attr(op, key);
  return a && a->kind == XM_ATTR_BOOL ? a->i != 0 : dflt;
}

const char *xm_ir_op_get_string(const xm_ir_op_t *op, const char *key, const char *dflt) {
  const xm_ir_attr_t *a = xm_ir_op_attr(op, key);
  return a && a->kind == XM_ATTR_STRING ? a->s : dflt;
}

/* ---- mutation ---------------------------------------------------------- */

void xm_ir_op_set_operand(xm_ir_op_t *op, int i, xm_ir_value_t *v) {
  XM_ASSERT(i >= 0 && i < op->num_operands && v != NULL);
  op->operands[i]->num_uses--;
  op->operands[i] = v;
  v->num_uses++;
}

void xm_ir_value_replace_uses(xm_ir_module_t *m, xm_ir_value_t *from, xm_ir_value_t *to) {
  if (from == to) return;
  for (int i = 0; i < m->num_ops; i++) {
    xm_ir_op_t *op = m->ops[i];
    for (int j = 0; j < op->num_operands; j++)
      if (op->operands[j] == from) xm_ir_op_set_operand(op, j, to);
  }
}

void xm_ir_module_remove_ops(xm_ir_module_t *m, const bool *remove) {
  int w = 0;
  for (int i = 0; i < m->num_ops; i++) {
    xm_ir_op_t *op = m->ops[i];
    if (remove[i]) {
      for (int j = 0; j < op->num_operands; j++) op->operands[j]->num_uses--;
      continue;
    }
    m->ops[w++] = op;
  }
  m->num_ops = w;
}

void xm_ir_module_move_op(xm_ir_module_t *m, int from, int to) {
  XM_ASSERT(from >= 0 && from < m->num_ops && to >= 0 && to < m->num_ops);
  xm_ir_op_t *op = m->ops[from];
  if (from < to)
    memmove(m->ops + from, m->ops + from + 1, sizeof *m->ops * (size_t)(to - from));
  else if (from > to)
    memmove(m->ops + to + 1, m->ops + to, sizeof *m->ops * (size_t)(from - to));
  m->ops[to] = op;
}

bool xm_ir_op_in_step(const xm_ir_op_t *op) {
  return strcmp(xm_ir_op_get_string(op, "phase", "fwd"), "step") == 0;
}
