/* ir/print.c — the canonical text form of a module (grammar: docs/ir.md).
 *
 * The printer is the reference the parser (ir/parse.c) is tested against:
 * parse(print(m)) must print byte for byte as print(m). That is why every
 * choice here is canonical rather than pretty: values are renumbered %0, %1,
 * ... in definition order (their ids are creation order and passes leave
 * holes), attributes come out in the module's sorted order, floats use the
 * shortest text that reads back to the same double, names that are not plain
 * identifiers are quoted, and optional parts (attribute dict, result types,
 * loc) are omitted exactly when they are empty. The printer never fails and
 * never modifies the module; a module that breaks the IR invariants (an
 * operand defined nowhere before its use) still prints, with the operand
 * spelled %u<id> so the text points at the problem instead of crashing.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "ir/text.h"

/* ---- names ------------------------------------------------------------- */

/* Module names may be bare when they use [A-Za-z0-9_.-]+ only. */
static bool is_bare_module_name(const char *s) {
  if (!*s) return false;
  for (; *s; s++) {
    char c = *s;
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

/* Attribute keys may be bare when they are [A-Za-z_][A-Za-z0-9_.]*. */
static bool is_bare_key(const char *s) {
  char c = *s;
  if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_')) return false;
  for (s++; *s; s++) {
    c = *s;
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.';
    if (!ok) return false;
  }
  return true;
}

/* ---- types and attribute values ---------------------------------------- */

void xm_ir_print_type(const xm_ir_type_t *t, xm_strbuf_t *out) {
  xm_strbuf_puts(out, xm_dtype_name(t->dtype));
  xm_strbuf_puts(out, "[");
  for (int i = 0; i < t->rank; i++) {
    if (i) xm_strbuf_puts(out, ", ");
    if (t->dynamic[i]) xm_strbuf_puts(out, "?");
    xm_strbuf_printf(out, "%" PRId64, t->dims[i]);
    if (t->shard[i] != XM_AXIS_NONE) {
      xm_strbuf_puts(out, "/");
      xm_strbuf_puts(out, xm_mesh_axis_name((xm_mesh_axis_t)t->shard[i]));
    }
  }
  xm_strbuf_puts(out, "]");
}

void xm_ir_print_attr_value(const xm_ir_attr_t *a, xm_strbuf_t *out) {
  switch (a->kind) {
  case XM_ATTR_INT: xm_strbuf_printf(out, "%" PRId64, a->i); break;
  case XM_ATTR_FLOAT: xm_strbuf_put_double(out, a->f); break;
  case XM_ATTR_BOOL: xm_strbuf_puts(out, a->i ? "true" : "false"); break;
  case XM_ATTR_STRING: xm_strbuf_put_quoted(out, a->s ? a->s : ""); break;
  case XM_ATTR_INTS:
    xm_strbuf_puts(out, "[");
    for (int i = 0; i < a->n; i++)
      xm_strbuf_printf(out, "%s%" PRId64, i ? ", " : "", a->ints[i]);
    xm_strbuf_puts(out, "]");
    break;
  case XM_ATTR_FLOATS:
    /* An empty float array prints as "[]" and reads back as an empty int
     * array; both print the same, so the text stays canonical. */
    xm_strbuf_puts(out, "[");
    for (int i = 0; i < a->n; i++) {
      if (i) xm_strbuf_puts(out, ", ");
      xm_strbuf_put_double(out, a->floats[i]);
    }
    xm_strbuf_puts(out, "]");
    break;
  }
}

/* "{k = v, ...}" with a leading space; nothing when there are none. */
static void print_attr_dict(const xm_ir_attr_t *attrs, int n, xm_strbuf_t *out) {
  if (n == 0) return;
  xm_strbuf_puts(out, " {");
  for (int i = 0; i < n; i++) {
    if (i) xm_strbuf_puts(out, ", ");
    if (is_bare_key(attrs[i].key))
      xm_strbuf_puts(out, attrs[i].key);
    else
      xm_strbuf_put_quoted(out, attrs[i].key);
    xm_strbuf_puts(out, " = ");
    xm_ir_print_attr_value(&attrs[i], out);
  }
  xm_strbuf_puts(out, "}");
}

/* ---- ops and modules --------------------------------------------------- */

/* numbers[id] is the printed number of value id, or -1 before its definition. */
static void print_value(const xm_ir_value_t *v, const int *numbers, int num_values,
                        xm_strbuf_t *out) {
  if (v->id >= 0 && v->id < num_values && numbers[v->id] >= 0)
    xm_strbuf_printf(out, "%%%d", numbers[v->id]);
  else
    xm_strbuf_printf(out, "%%u%d", v->id);
}

static void print_op(const xm_ir_op_t *op, int *numbers, int num_values, int *next_number,
                     xm_strbuf_t *out) {
  xm_strbuf_puts(out, "  ");
  /* Results are numbered before operands print: a valid op never uses its
   * own results, and an invalid one then shows the cycle plainly. */
  for (int i = 0; i < op->num_results; i++) {
    const xm_ir_value_t *r = op->results[i];
    if (r->id >= 0 && r->id < num_values) numbers[r->id] = (*next_number)++;
    if (i) xm_strbuf_puts(out, ", ");
    print_value(r, numbers, num_values, out);
  }
  if (op->num_results) xm_strbuf_puts(out, " = ");
  xm_strbuf_puts(out, xm_ir_opinfo(op->code)->name);
  xm_strbuf_puts(out, "(");
  for (int i = 0; i < op->num_operands; i++) {
    if (i) xm_strbuf_puts(out, ", ");
    print_value(op->operands[i], numbers, num_values, out);
  }
  xm_strbuf_puts(out, ")");
  print_attr_dict(op->attrs, op->num_attrs, out);
  for (int i = 0; i < op->num_results; i++) {
    xm_strbuf_puts(out, i ? ", " : " : ");
    xm_ir_print_type(&op->results[i]->type, out);
  }
  if (op->loc && op->loc[0]) {
    xm_strbuf_puts(out, " loc(");
    xm_strbuf_put_quoted(out, op->loc);
    xm_strbuf_puts(out, ")");
  }
  xm_strbuf_puts(out, "\n");
}

void xm_ir_print(const xm_ir_module_t *m, xm_strbuf_t *out) {
  const char *name = xm_ir_module_name(m);
  xm_strbuf_puts(out, "module @");
  if (is_bare_module_name(name))
    xm_strbuf_puts(out, name);
  else
    xm_strbuf_put_quoted(out, name);

  int nattrs = xm_ir_module_num_attrs(m);
  if (nattrs > 0) {
    xm_strbuf_puts(out, " attributes");
    print_attr_dict(xm_ir_module_attr(m, 0), nattrs, out);
  }
  xm_strbuf_puts(out, " {\n");

  int num_values = xm_ir_module_num_values(m);
  int *numbers = malloc(sizeof(int) * (size_t)(num_values + 1));
  XM_ASSERT(numbers != NULL);
  for (int i = 0; i < num_values; i++)
    numbers[i] = -1;
  int next_number = 0;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++)
    print_op(xm_ir_module_op(m, i), numbers, num_values, &next_number, out);
  free(numbers);
  xm_strbuf_puts(out, "}\n");
}
