/* tests/unit/test_mlir_bridge.c — export to MLIR and import back.
 *
 * Modules built through the ir.h API cover every attribute kind, every
 * dtype, dynamic dims with bounds, sharding, awkward locations, module
 * attributes, multi-result and zero-result ops. Each is exported, checked
 * for the generic-form pieces MLIR must print, imported back and compared
 * with the original op by op (and as IR text once the printer exists).
 * Malformed MLIR must be rejected with XM_ERR_INVALID_INPUT and a message.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frontend/spec.h"
#include "ir/mlir_bridge.h"
#include "ir/model.h"
#include "ir/text.h"

/* ---- structural comparison ---------------------------------------------- */

static int op_position(const xm_ir_module_t *m, const xm_ir_op_t *op) {
  for (int i = 0; i < xm_ir_module_num_ops(m); i++)
    if (xm_ir_module_op(m, i) == op) return i;
  return -1;
}

static void assert_attr_equal(const xm_ir_attr_t *a, const xm_ir_attr_t *b) {
  assert_string_equal(a->key, b->key);
  assert_int_equal(a->kind, b->kind);
  switch (a->kind) {
  case XM_ATTR_INT:
  case XM_ATTR_BOOL: assert_int_equal(a->i, b->i); break;
  case XM_ATTR_FLOAT: assert_memory_equal(&a->f, &b->f, sizeof a->f); break;
  case XM_ATTR_STRING: assert_string_equal(a->s, b->s); break;
  case XM_ATTR_INTS:
    assert_int_equal(a->n, b->n);
    for (int i = 0; i < a->n; i++)
      assert_int_equal(a->ints[i], b->ints[i]);
    break;
  case XM_ATTR_FLOATS:
    assert_int_equal(a->n, b->n);
    for (int i = 0; i < a->n; i++)
      assert_memory_equal(&a->floats[i], &b->floats[i], sizeof(double));
    break;
  }
}

static void assert_type_same(const xm_ir_type_t *a, const xm_ir_type_t *b) {
  assert_int_equal(a->dtype, b->dtype);
  assert_int_equal(a->rank, b->rank);
  for (int d = 0; d < a->rank; d++) {
    assert_int_equal(a->dims[d], b->dims[d]);
    assert_int_equal(a->dynamic[d], b->dynamic[d]);
    assert_int_equal(a->shard[d], b->shard[d]);
  }
}

static void assert_op_equal(const xm_ir_module_t *ma, const xm_ir_op_t *a, const xm_ir_module_t *mb,
                            const xm_ir_op_t *b) {
  assert_int_equal(a->code, b->code);
  assert_string_equal(a->loc, b->loc);
  assert_int_equal(a->num_operands, b->num_operands);
  for (int j = 0; j < a->num_operands; j++) {
    assert_int_equal(op_position(ma, a->operands[j]->def), op_position(mb, b->operands[j]->def));
    assert_int_equal(a->operands[j]->index, b->operands[j]->index);
  }
  assert_int_equal(a->num_results, b->num_results);
  for (int j = 0; j < a->num_results; j++)
    assert_type_same(&a->results[j]->type, &b->results[j]->type);
  assert_int_equal(a->num_attrs, b->num_attrs);
  for (int j = 0; j < a->num_attrs; j++)
    assert_attr_equal(&a->attrs[j], &b->attrs[j]);
}

static void assert_modules_equal(const xm_ir_module_t *a, const xm_ir_module_t *b) {
  assert_string_equal(xm_ir_module_name(a), xm_ir_module_name(b));
  assert_int_equal(xm_ir_module_num_attrs(a), xm_ir_module_num_attrs(b));
  for (int i = 0; i < xm_ir_module_num_attrs(a); i++)
    assert_attr_equal(xm_ir_module_attr(a, i), xm_ir_module_attr(b, i));
  assert_int_equal(xm_ir_module_num_ops(a), xm_ir_module_num_ops(b));
  for (int i = 0; i < xm_ir_module_num_ops(a); i++)
    assert_op_equal(a, xm_ir_module_op(a, i), b, xm_ir_module_op(b, i));
  /* The text form too, byte for byte. */
  xm_strbuf_t ta, tb;
  xm_strbuf_init(&ta);
  xm_strbuf_init(&tb);
  xm_ir_print(a, &ta);
  xm_ir_print(b, &tb);
  assert_true(ta.len > 0);
  assert_string_equal(xm_strbuf_cstr(&ta), xm_strbuf_cstr(&tb));
  xm_strbuf_free(&ta);
  xm_strbuf_free(&tb);
}

/* Exports, imports and compares; returns the exported text (caller frees). */
static char *round_trip(const xm_ir_module_t *m) {
  xm_strbuf_t text;
  xm_strbuf_init(&text);
  assert_int_equal(xm_mlir_export(m, &text), XM_OK);
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_ir_module_t *back = NULL;
  xm_status_t st = xm_mlir_import(text.data, text.len, "rt.mlir", &diag, &back);
  if (st != XM_OK) {
    xm_diag_print(&diag, stderr);
    fprintf(stderr, "%s", xm_strbuf_cstr(&text));
  }
  assert_int_equal(st, XM_OK);
  assert_int_equal(xm_diag_error_count(&diag), 0);
  assert_modules_equal(m, back);
  xm_ir_module_destroy(back);
  xm_diag_free(&diag);
  return xm_strbuf_take(&text);
}

/* ---- a module with every feature ------------------------------------------ */

static xm_ir_type_t ty(xm_dtype_t dt, int rank, int64_t d0, int64_t d1, int64_t d2) {
  int64_t dims[3] = {d0, d1, d2};
  return xm_ir_type_make(dt, rank, dims);
}

static void add_module_attrs(xm_ir_module_t *m) {
  int64_t ints[3] = {1, -2, INT64_MAX};
  double floats[2] = {0.1, -1e-300};
  xm_ir_attr_t attrs[] = {
      {.key = "model", .kind = XM_ATTR_STRING, .s = "tiny \"moe\""},
      {.key = "layers", .kind = XM_ATTR_INT, .i = 2},
      {.key = "eps", .kind = XM_ATTR_FLOAT, .f = 1e-6},
      {.key = "ssmb", .kind = XM_ATTR_BOOL, .i = 1},
      {.key = "mesh", .kind = XM_ATTR_INTS, .n = 3, .ints = ints},
      {.key = "lrs", .kind = XM_ATTR_FLOATS, .n = 2, .floats = floats},
  };
  for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++)
    xm_ir_module_set_attr(m, &attrs[i]);
}

static xm_ir_module_t *build_rich_module(void) {
  xm_ir_module_t *m = NULL;
  assert_int_equal(xm_ir_module_create("unit", &m), XM_OK);
  add_module_attrs(m);
  xm_ir_value_t *tok =
      xm_ir_build1(m, XM_OP_INPUT, 0, NULL, ty(XM_DT_I32, 2, 2, 8, 0), "/training/seq_len");
  xm_ir_op_set_string(m, tok->def, "name", "tokens");
  xm_ir_value_t *emb =
      xm_ir_build1(m, XM_OP_PARAM, 0, NULL, ty(XM_DT_BF16, 2, 64, 32, 0), "/model/vocab");
  xm_ir_op_set_string(m, emb->def, "name", "model.embed_tokens.weight");
  xm_ir_op_set_float(m, emb->def, "std", 0.02);
  xm_ir_op_set_bool(m, emb->def, "trainable", false);
  xm_ir_value_t *ops2[2] = {tok, emb};
  xm_ir_value_t *x = xm_ir_build1(m, XM_OP_EMBEDDING, 2, ops2, ty(XM_DT_BF16, 3, 2, 8, 32),
                                  "file \"a\\b\".json:/model/hidden\t\x01");
  /* Dynamic rows with a bound, sharded over the sequence axis. */
  xm_ir_type_t dyn = ty(XM_DT_F16, 2, 16, 32, 0);
  dyn.dynamic[0] = true;
  dyn.shard[0] = XM_AXIS_SP;
  xm_ir_value_t *r = xm_ir_build1(m, XM_OP_RESHAPE, 1, &x, dyn, "");
  int64_t ints[4] = {0, -1, INT64_MIN, 7};
  double floats[5] = {0.1, 1e-6, -0.0, 1e300, 3.0};
  xm_ir_op_set_ints(m, r->def, "perm", 4, ints);
  xm_ir_op_set_floats(m, r->def, "coeffs", 5, floats);
  xm_ir_op_set_ints(m, r->def, "empty_ints", 0, NULL);
  xm_ir_op_set_floats(m, r->def, "empty_floats", 0, NULL);
  xm_ir_op_set_int(m, r->def, "big", INT64_MIN);
  xm_ir_op_set_float(m, r->def, "inf", INFINITY);
  xm_ir_op_set_string(m, r->def, "empty", "");
  /* Two results, the second sharded; an i64 and an i1 result further on. */
  xm_ir_type_t rt[2] = {ty(XM_DT_I32, 2, 16, 2, 0), ty(XM_DT_F32, 2, 16, 2, 0)};
  rt[1].shard[0] = XM_AXIS_EP;
  rt[1].shard[1] = XM_AXIS_NODE;
  xm_ir_value_t *ops_tr[2] = {r, r};
  xm_ir_op_t *route = xm_ir_op_append(m, XM_OP_TOPK_ROUTE, 2, ops_tr, 2, rt, "/moe/top_k");
  xm_ir_op_set_int(m, route, "k", 2);
  xm_ir_type_t pt[3] = {ty(XM_DT_I64, 1, 32, 0, 0), ty(XM_DT_BOOL, 1, 32, 0, 0),
                        ty(XM_DT_I32, 0, 0, 0, 0)};
  pt[0].dynamic[0] = true;
  xm_ir_value_t *ops_p[2] = {route->results[0], route->results[1]};
  xm_ir_op_t *perm = xm_ir_op_append(m, XM_OP_PERMUTE, 2, ops_p, 3, pt, "/moe/experts");
  xm_ir_value_t *loss = xm_ir_build1(m, XM_OP_AUX_LOSS, 2, ops_p, ty(XM_DT_F32, 0, 0, 0, 0),
                                     "/moe/aux_loss_alpha/\xc3\xa9");
  xm_ir_value_t *rets[3] = {loss, perm->results[2], perm->results[0]};
  xm_ir_op_append(m, XM_OP_RETURN, 3, rets, 0, NULL, "");
  return m;
}

static void test_export_generic_form(void **state) {
  (void)state;
  xm_ir_module_t *m = build_rich_module();
  xm_strbuf_t text;
  xm_strbuf_init(&text);
  assert_int_equal(xm_mlir_export(m, &text), XM_OK);
  const char *s = xm_strbuf_cstr(&text);
  const char *pieces[] = {
      "\"builtin.module\"()",
      "sym_name = \"unit\"",
      "xmoe.layers = 2 : i64",
      "xmoe.ssmb = true",
      "xmoe.mesh = array<i64: 1, -2, 9223372036854775807>",
      "xmoe.model = \"tiny \\22moe\\22\"",
      "\"xmoe.input\"() {name = \"tokens\"} : () -> tensor<2x8xi32>",
      "\"xmoe.embedding\"(",
      "tensor<64x32xbf16>",
      "trainable = false",
      "tensor<?x32xf16, [16, 32]>",
      "xmoe.shard = [\"sp,_\"]",
      "xmoe.shard = [\"_,_\", \"ep,node\"]",
      "tensor<?xi64, [32]>",
      "tensor<32xi1>",
      "tensor<i32>",
      "empty_ints = array<i64>",
      "empty_floats = array<f64>",
      "\"xmoe.return\"(",
      "xmoe.eps = 9.9999999999999995E-7 : f64",
      "inf = 0x7FF0000000000000 : f64",
      "= loc(\"/moe/top_k\")",
      "= loc(\"file \\22a\\\\b\\22.json:/model/hidden\\09\\01\")",
      "= loc(unknown)",
  };
  for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++) {
    if (!strstr(s, pieces[i])) fprintf(stderr, "missing %s in:\n%s", pieces[i], s);
    assert_non_null(strstr(s, pieces[i]));
  }
  xm_strbuf_free(&text);
  xm_ir_module_destroy(m);
}

static void test_round_trip_rich(void **state) {
  (void)state;
  xm_ir_module_t *m = build_rich_module();
  free(round_trip(m));
  xm_ir_module_destroy(m);
}

static void test_round_trip_empty_and_nan(void **state) {
  (void)state;
  xm_ir_module_t *m = NULL;
  assert_int_equal(xm_ir_module_create("", &m), XM_OK);
  free(round_trip(m));
  xm_ir_value_t *c = xm_ir_build1(m, XM_OP_CONSTANT, 0, NULL, ty(XM_DT_F32, 1, 0, 0, 0), "x");
  double nan_inf[3] = {NAN, -INFINITY, 5e-324};
  xm_ir_op_set_floats(m, c->def, "special", 3, nan_inf);
  xm_ir_op_set_float(m, c->def, "value", -0.0);
  xm_ir_op_set_float(m, c->def, "tiny", 4.9406564584124654e-324);
  xm_ir_op_append(m, XM_OP_RETURN, 1, &c, 0, NULL, NULL);
  free(round_trip(m));
  xm_ir_module_destroy(m);
}

/* MLIR's own tool must read what we print, and what it prints back (generic
 * form, locations kept) must import to the same module. */
static void test_mlir_opt_round_trip(void **state) {
  (void)state;
  FILE *probe = popen("command -v mlir-opt-19 || command -v mlir-opt", "r");
  char tool[512] = "";
  /* mlir-opt is part of the required toolchain (scripts/setup.sh). */
  assert_non_null(probe);
  assert_non_null(fgets(tool, sizeof tool, probe));
  pclose(probe);
  tool[strcspn(tool, "\n")] = 0;
  xm_ir_module_t *m = build_rich_module();
  char *text = round_trip(m);
  char path[] = "/tmp/xm_mlir_bridge_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  char cmd[1200];
  snprintf(cmd, sizeof cmd,
           "%s --allow-unregistered-dialect --mlir-print-op-generic "
           "--mlir-print-debuginfo %s",
           tool, path);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  xm_strbuf_t out;
  xm_strbuf_init(&out);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0)
    xm_strbuf_append(&out, buf, n);
  assert_int_equal(pclose(p), 0);
  unlink(path);
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_ir_module_t *back = NULL;
  assert_int_equal(xm_mlir_import(out.data, out.len, "opt.mlir", &diag, &back), XM_OK);
  assert_modules_equal(m, back);
  xm_ir_module_destroy(back);
  xm_diag_free(&diag);
  xm_strbuf_free(&out);
  free(text);
  xm_ir_module_destroy(m);
}

/* Hand-written MLIR: no sym_name, file locations, i64 arrays as bounds. */
static void test_import_handwritten(void **state) {
  (void)state;
  const char *text =
      "module {\n"
      "  %0 = \"xmoe.input\"() {name = \"tokens\"} : () -> tensor<2x8xi32>\n"
      "  %1 = \"xmoe.narrow\"(%0) {dim = 1 : i32, group = \"tp\", xmoe.shard = [\"_,tp\"]}"
      " : (tensor<2x8xi32>) -> tensor<2x?xi32, [2, 4]> loc(\"/parallel/tp\")\n"
      "  \"xmoe.return\"(%1) : (tensor<2x?xi32, [2, 4]>) -> ()\n"
      "}\n";
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_ir_module_t *m = NULL;
  assert_int_equal(xm_mlir_import(text, strlen(text), "h.mlir", &diag, &m), XM_OK);
  assert_string_equal(xm_ir_module_name(m), "module");
  assert_int_equal(xm_ir_module_num_ops(m), 3);
  xm_ir_op_t *in = xm_ir_module_op(m, 0), *nar = xm_ir_module_op(m, 1);
  assert_string_equal(in->loc, "");
  assert_string_equal(xm_ir_op_get_string(in, "name", "?"), "tokens");
  assert_string_equal(nar->loc, "/parallel/tp");
  assert_int_equal(xm_ir_op_get_int(nar, "dim", -1), 1);
  assert_int_equal(nar->num_attrs, 2); /* the shard attribute is not kept as one */
  const xm_ir_type_t *t = &nar->results[0]->type;
  assert_int_equal(t->rank, 2);
  assert_true(t->dynamic[1]);
  assert_int_equal(t->dims[1], 4);
  assert_int_equal(t->shard[1], XM_AXIS_TP);
  assert_ptr_equal(xm_ir_module_op(m, 2)->operands[0], nar->results[0]);
  assert_int_equal(nar->results[0]->num_uses, 1);
  xm_ir_module_destroy(m);
  xm_diag_free(&diag);
}

/* ---- malformed input ------------------------------------------------------ */

typedef struct {
  const char *what;
  const char *text;
  const char *message; /* a piece of the expected message */
} bad_case_t;

static const bad_case_t k_bad[] = {
    {"syntax error", "module { %0 = \"xmoe.input\"( : }", "expected"},
    {"unknown op", "\"xmoe.frobnicate\"() : () -> () loc(\"/here\")",
     "unknown op 'xmoe.frobnicate'"},
    {"foreign dialect op", "\"arith.constant\"() {value = 1 : i32} : () -> i32", "unknown op"},
    {"unranked tensor", "%0 = \"xmoe.input\"() : () -> tensor<*xf32>", "not a ranked tensor"},
    {"not a tensor", "%0 = \"xmoe.input\"() : () -> f32", "not a ranked tensor"},
    {"wrong element type", "%0 = \"xmoe.input\"() : () -> tensor<4xf64>",
     "unsupported element type 'f64'"},
    {"signed element type", "%0 = \"xmoe.input\"() : () -> tensor<4xsi32>",
     "unsupported element type"},
    {"dynamic dim without bound", "%0 = \"xmoe.input\"() : () -> tensor<?x4xf32>",
     "without an upper bound"},
    {"bad encoding", "%0 = \"xmoe.input\"() : () -> tensor<?x4xf32, [4]>",
     "one upper bound per dim"},
    {"encoding not integers", "%0 = \"xmoe.input\"() : () -> tensor<?x4xf32, [4.0, 4]>",
     "not an integer"},
    {"encoding string", "%0 = \"xmoe.input\"() : () -> tensor<?x4xf32, \"b\">",
     "one upper bound per dim"},
    {"encoding mismatch", "%0 = \"xmoe.input\"() : () -> tensor<?x4xf32, [4, 5]>", "static dim"},
    {"negative bound", "%0 = \"xmoe.input\"() : () -> tensor<?x4xf32, [-4, 4]>",
     "negative upper bound"},
    {"rank above 6", "%0 = \"xmoe.input\"() : () -> tensor<1x1x1x1x1x1x1xf32>", "rank 7"},
    {"block argument operand",
     "\"builtin.module\"() ({\n^bb0(%a: tensor<4xf32>):\n  %0 = \"xmoe.silu\"(%a) : "
     "(tensor<4xf32>) -> tensor<4xf32>\n}) : () -> ()",
     "no arguments"},
    {"block argument in a region",
     "\"func.func\"() ({\n^bb0(%a: tensor<4xf32>):\n  %0 = \"xmoe.silu\"(%a) : (tensor<4xf32>) -> "
     "tensor<4xf32>\n}) : () -> ()",
     "unknown op 'func.func'"},
    {"func.func wrapper",
     "func.func @f() {\n  %0 = \"xmoe.input\"() : () -> tensor<4xf32>\n  return\n}",
     "Dialect `func' not found"},
    {"nested region",
     "\"xmoe.add\"() ({\n  %0 = \"xmoe.input\"() : () -> tensor<4xf32>\n}) : () -> ()", "regions"},
    {"use before definition",
     "%1 = \"xmoe.silu\"(%0) : (tensor<4xf32>) -> tensor<4xf32>\n%0 = \"xmoe.input\"() : () -> "
     "tensor<4xf32>",
     "earlier op"},
    {"unsupported attribute", "\"xmoe.return\"() {x = unit} : () -> ()", "unsupported kind"},
    {"dense i32 array", "\"xmoe.return\"() {x = array<i32: 1>} : () -> ()", "unsupported kind"},
    {"bad shard axis", "%0 = \"xmoe.input\"() {xmoe.shard = [\"zz\"]} : () -> tensor<4xf32>",
     "bad axis 'zz'"},
    {"shard rank mismatch", "%0 = \"xmoe.input\"() {xmoe.shard = [\"ep,_\"]} : () -> tensor<4xf32>",
     "rank 1"},
    {"shard count mismatch", "%0 = \"xmoe.input\"() {xmoe.shard = []} : () -> tensor<4xf32>",
     "one per result"},
    {"foreign module attribute", "module attributes {other.foo = 1} {}",
     "module attribute 'other.foo'"},
    {"module attribute without prefix", "module attributes {foo = 1} {}", "dialect-prefixed"},
    {"empty text", "", NULL},
    {"garbage", "\x01\x02\xff{{{{", NULL},
};

static void test_import_rejects(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
    xm_diag_t diag;
    xm_diag_init(&diag);
    xm_ir_module_t *m = (xm_ir_module_t *)&diag; /* must be reset to NULL */
    xm_status_t st = xm_mlir_import(k_bad[i].text, strlen(k_bad[i].text), "bad.mlir", &diag, &m);
    if (k_bad[i].message == NULL && st == XM_OK) {
      /* An empty module is valid MLIR: it imports as an empty module. */
      assert_int_equal(xm_ir_module_num_ops(m), 0);
      xm_ir_module_destroy(m);
      xm_diag_free(&diag);
      continue;
    }
    if (st != XM_ERR_INVALID_INPUT) fprintf(stderr, "case '%s' gave %d\n", k_bad[i].what, st);
    assert_int_equal(st, XM_ERR_INVALID_INPUT);
    assert_null(m);
    assert_true(xm_diag_error_count(&diag) > 0);
    bool found = k_bad[i].message == NULL;
    for (int e = 0; e < diag.count && !found; e++)
      found = strstr(diag.entries[e].message, k_bad[i].message) != NULL;
    if (!found) {
      fprintf(stderr, "case '%s': no message with '%s':\n", k_bad[i].what, k_bad[i].message);
      xm_diag_print(&diag, stderr);
    }
    assert_true(found);
    assert_string_equal(diag.entries[0].file, "bad.mlir");
    xm_diag_free(&diag);
  }
}

/* Errors carry the op's location as their place. */
static void test_import_error_places(void **state) {
  (void)state;
  const char *text = "\"xmoe.frobnicate\"() : () -> () loc(\"/moe/x\")";
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_ir_module_t *m = NULL;
  assert_int_equal(xm_mlir_import(text, strlen(text), "p.mlir", &diag, &m), XM_ERR_INVALID_INPUT);
  assert_int_equal(xm_diag_find(&diag, "/moe/x"), 0);
  xm_diag_free(&diag);
  xm_diag_init(&diag);
  const char *syntax = "module {\n  %0 = \"xmoe.input\"() : () -> tensor<4xf32\n}\n";
  assert_int_equal(xm_mlir_import(syntax, strlen(syntax), "p.mlir", &diag, &m),
                   XM_ERR_INVALID_INPUT);
  assert_true(diag.count > 0);
  assert_non_null(diag.entries[0].place);
  assert_true(strncmp(diag.entries[0].place, "2:", 2) == 0 ||
              strncmp(diag.entries[0].place, "3:", 2) == 0);
  xm_diag_free(&diag);
}

/* Export refuses what it cannot map back: an attribute using the reserved
 * shard key, a negative static dim. */
static void test_export_rejects(void **state) {
  (void)state;
  xm_ir_module_t *m = NULL;
  assert_int_equal(xm_ir_module_create("bad", &m), XM_OK);
  xm_ir_value_t *v = xm_ir_build1(m, XM_OP_INPUT, 0, NULL, ty(XM_DT_F32, 1, 4, 0, 0), "");
  xm_ir_op_set_string(m, v->def, "xmoe.shard", "ep");
  xm_strbuf_t text;
  xm_strbuf_init(&text);
  assert_int_equal(xm_mlir_export(m, &text), XM_ERR_UNSUPPORTED);
  xm_ir_module_destroy(m);
  assert_int_equal(xm_ir_module_create("bad", &m), XM_OK);
  xm_ir_build1(m, XM_OP_INPUT, 0, NULL, ty(XM_DT_F32, 2, 4, -3, 0), "");
  assert_int_equal(xm_mlir_export(m, &text), XM_ERR_INVALID_INPUT);
  xm_ir_module_destroy(m);
  xm_strbuf_free(&text);
}

/* Corrupted exports (truncated, bytes replaced) import cleanly or fail with
 * XM_ERR_INVALID_INPUT and a message; they never crash. */
static void test_import_corrupted(void **state) {
  (void)state;
  xm_ir_module_t *m = build_rich_module();
  xm_strbuf_t text;
  xm_strbuf_init(&text);
  assert_int_equal(xm_mlir_export(m, &text), XM_OK);
  xm_ir_module_destroy(m);
  static const char k_bytes[] = {'"', '>', '<', '?', ',', '0', '}', '\\', '%', 'x', '\0'};
  uint32_t seed = 12345;
  int failures = 0;
  for (int iter = 0; iter < 150; iter++) {
    char *copy = malloc(text.len + 1);
    assert_non_null(copy);
    memcpy(copy, text.data, text.len + 1);
    seed = seed * 1103515245u + 12345u;
    size_t pos = (seed >> 8) % text.len;
    size_t len = text.len;
    if (iter % 3 == 0)
      len = pos; /* truncation */
    else
      copy[pos] = k_bytes[(seed >> 4) % sizeof k_bytes];
    xm_diag_t diag;
    xm_diag_init(&diag);
    xm_ir_module_t *back = NULL;
    xm_status_t st = xm_mlir_import(copy, len, "fuzz.mlir", &diag, &back);
    assert_true(st == XM_OK || st == XM_ERR_INVALID_INPUT);
    if (st == XM_OK)
      assert_non_null(back);
    else {
      failures++;
      assert_null(back);
      assert_true(xm_diag_error_count(&diag) > 0);
    }
    xm_ir_module_destroy(back);
    xm_diag_free(&diag);
    free(copy);
  }
  assert_true(failures > 50); /* the corruption did reach the importer */
  xm_strbuf_free(&text);
}

/* ---- whole model ---------------------------------------------------------- */

static void tiny_spec(xm_spec_t *s) {
  memset(s, 0, sizeof *s);
  xm_spec_set_defaults(s);
  snprintf(s->name, sizeof s->name, "tiny");
  snprintf(s->model_type, sizeof s->model_type, "xmoec");
  s->model.vocab = 64;
  s->model.hidden = 32;
  s->model.layers = 2;
  s->model.heads = 4;
  s->model.kv_heads = 2;
  s->model.head_dim = 8;
  s->model.first_k_dense = 1;
  s->model.dense_ffn = 48;
  s->model.attention = XM_ATTN_GQA;
  s->model.rope_theta = 10000.0;
  s->model.norm_eps = 1e-6;
  s->moe.experts = 8;
  s->moe.top_k = 2;
  s->moe.expert_ffn = 16;
  s->moe.shared_experts = 1;
  s->moe.shared_ffn = 16;
  s->moe.activation = XM_ACT_SWIGLU;
  s->moe.scoring = XM_SCORING_SOFTMAX;
  s->moe.norm_topk_prob = true;
  s->moe.routed_scaling = 1.0;
  s->moe.n_group = 1;
  s->moe.topk_group = 1;
  s->moe.aux_alpha = 0.01;
  s->training.micro_batch = 2;
  s->training.seq_len = 8;
  s->training.global_batch = 2;
  s->training.dtype = XM_DTYPE_FP32;
}

static void test_round_trip_model(void **state) {
  (void)state;
  xm_spec_t spec;
  tiny_spec(&spec);
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_ir_module_t *m = NULL;
  xm_status_t st = xm_ir_build_model(&spec, "tiny", &diag, &m);
  xm_diag_free(&diag);
  assert_int_equal(st, XM_OK);
  assert_true(xm_ir_module_num_ops(m) > 0);
  char *text = round_trip(m);
  assert_non_null(strstr(text, "\"xmoe.topk_route\""));
  assert_non_null(strstr(text, "\"xmoe.grouped_matmul\""));
  free(text);
  xm_ir_module_destroy(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_export_generic_form),      cmocka_unit_test(test_round_trip_rich),
      cmocka_unit_test(test_round_trip_empty_and_nan), cmocka_unit_test(test_mlir_opt_round_trip),
      cmocka_unit_test(test_import_handwritten),       cmocka_unit_test(test_import_rejects),
      cmocka_unit_test(test_import_error_places),      cmocka_unit_test(test_export_rejects),
      cmocka_unit_test(test_import_corrupted),         cmocka_unit_test(test_round_trip_model),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
