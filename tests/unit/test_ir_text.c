/* tests/unit/test_ir_text.c — the IR text printer and parser (ir/text.h).
 *
 * Printing is checked against exact text; parsing against the structure it
 * builds; the two together against byte-for-byte round trips; malformed
 * input against the exact "line:col" and message of the first error; and a
 * small deterministic fuzz loop checks that no prefix or mutation crashes.
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

#include "ir/ir.h"
#include "ir/text.h"
#include "support/diag.h"
#include "support/strbuf.h"

/* ---- helpers ----------------------------------------------------------- */

static char *print_module(const xm_ir_module_t *m) {
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  xm_ir_print(m, &b);
  return xm_strbuf_take(&b);
}

static xm_ir_module_t *parse_ok(const char *text) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_ir_module_t *m = NULL;
  xm_status_t st = xm_ir_parse(text, strlen(text), "test.xir", &d, &m);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  assert_non_null(m);
  assert_int_equal(xm_diag_error_count(&d), 0);
  xm_diag_free(&d);
  return m;
}

/* Parses, prints and checks the text equals `want` (NULL: the input). */
static void assert_reprints(const char *text, const char *want) {
  xm_ir_module_t *m = parse_ok(text);
  char *s = print_module(m);
  assert_string_equal(s, want ? want : text);
  xm_ir_module_t *again = parse_ok(s);
  char *s2 = print_module(again);
  assert_string_equal(s2, s);
  free(s2);
  free(s);
  xm_ir_module_destroy(again);
  xm_ir_module_destroy(m);
}

/* Parsing must fail with the first error at `place` mentioning `part`. */
static void assert_parse_error(const char *text, const char *place, const char *part) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_ir_module_t *m = (xm_ir_module_t *)(uintptr_t)1;
  xm_status_t st = xm_ir_parse(text, strlen(text), "bad.xir", &d, &m);
  if (st == XM_OK || d.count == 0 || strcmp(d.entries[0].place, place) != 0 ||
      !strstr(d.entries[0].message, part)) {
    fprintf(stderr, "input: %s\nwant %s: ...%s...\n", text, place, part);
    xm_diag_print(&d, stderr);
  }
  assert_int_equal(st, XM_ERR_INVALID_INPUT);
  assert_null(m);
  assert_true(d.count >= 1);
  assert_string_equal(d.entries[0].file, "bad.xir");
  assert_string_equal(d.entries[0].place, place);
  assert_non_null(strstr(d.entries[0].message, part));
  xm_diag_free(&d);
}

static xm_ir_type_t ty(xm_dtype_t dt, int rank, int64_t d0, int64_t d1, int64_t d2) {
  int64_t dims[3] = {d0, d1, d2};
  return xm_ir_type_make(dt, rank, dims);
}

/* The example of docs/ir.md, built through the API. */
static xm_ir_module_t *build_example(void) {
  xm_ir_module_t *m = NULL;
  assert_int_equal(xm_ir_module_create("tiny", &m), XM_OK);
  xm_ir_attr_t ma = {.key = "seq_len", .kind = XM_ATTR_INT, .i = 64};
  xm_ir_module_set_attr(m, &ma);
  xm_ir_attr_t mb = {.key = "model_type", .kind = XM_ATTR_STRING, .s = "xmoec"};
  xm_ir_module_set_attr(m, &mb);

  xm_ir_value_t *tok =
      xm_ir_build1(m, XM_OP_INPUT, 0, NULL, ty(XM_DT_I32, 2, 2, 64, 0), "/training/seq_len");
  xm_ir_op_set_string(m, tok->def, "name", "tokens");
  xm_ir_value_t *w =
      xm_ir_build1(m, XM_OP_PARAM, 0, NULL, ty(XM_DT_F32, 2, 256, 64, 0), "/model/vocab");
  xm_ir_op_set_string(m, w->def, "name", "model.embed_tokens.weight");
  xm_ir_op_set_float(m, w->def, "std", 0.02);
  xm_ir_op_set_string(m, w->def, "init", "normal");
  xm_ir_value_t *ops2[2] = {tok, w};
  xm_ir_value_t *h =
      xm_ir_build1(m, XM_OP_EMBEDDING, 2, ops2, ty(XM_DT_F32, 3, 2, 64, 64), "/model/hidden");

  xm_ir_type_t rt[3] = {ty(XM_DT_I32, 2, 128, 2, 0), ty(XM_DT_F32, 2, 128, 2, 0)};
  xm_ir_value_t *sc = xm_ir_build1(m, XM_OP_PARAM, 0, NULL, ty(XM_DT_F32, 2, 128, 8, 0), NULL);
  xm_ir_value_t *bias = xm_ir_build1(m, XM_OP_PARAM, 0, NULL, ty(XM_DT_F32, 1, 8, 0, 0), NULL);
  xm_ir_value_t *ops3[2] = {sc, bias};
  xm_ir_op_t *route = xm_ir_op_append(m, XM_OP_TOPK_ROUTE, 2, ops3, 2, rt, "/moe/top_k");
  xm_ir_op_set_int(m, route, "k", 2);
  xm_ir_op_set_bool(m, route, "norm_topk_prob", true);
  xm_ir_op_set_string(m, route, "scoring", "softmax");

  rt[0] = ty(XM_DT_I32, 1, 256, 0, 0);
  rt[0].dynamic[0] = true;
  rt[1] = rt[0];
  rt[2] = ty(XM_DT_I32, 1, 8, 0, 0);
  xm_ir_op_t *perm =
      xm_ir_op_append(m, XM_OP_PERMUTE, 2, route->results, 3, rt, "/moe/capacity_factor");
  xm_ir_op_set_int(m, perm, "num_experts", 8);
  xm_ir_op_set_int(m, perm, "capacity", 160);

  xm_ir_type_t a2a = ty(XM_DT_F32, 2, 512, 64, 0);
  a2a.dynamic[0] = true;
  a2a.shard[0] = XM_AXIS_EP;
  xm_ir_value_t *ops4[3] = {h, perm->results[2], perm->results[2]};
  xm_ir_value_t *x = xm_ir_build1(m, XM_OP_ALL_TO_ALL, 3, ops4, a2a, "");
  xm_ir_op_set_string(m, x->def, "group", "ep");
  xm_ir_op_set_int(m, x->def, "group_size", 4);
  xm_ir_op_set_string(m, x->def, "traffic", "dispatch");
  xm_ir_op_append(m, XM_OP_RETURN, 1, &h, 0, NULL, NULL);
  return m;
}

static const char k_example[] =
    "module @tiny attributes {model_type = \"xmoec\", seq_len = 64} {\n"
    "  %0 = input() {name = \"tokens\"} : i32[2, 64] loc(\"/training/seq_len\")\n"
    "  %1 = param() {init = \"normal\", name = \"model.embed_tokens.weight\", std = 0.02} : "
    "f32[256, 64] loc(\"/model/vocab\")\n"
    "  %2 = embedding(%0, %1) : f32[2, 64, 64] loc(\"/model/hidden\")\n"
    "  %3 = param() : f32[128, 8]\n"
    "  %4 = param() : f32[8]\n"
    "  %5, %6 = topk_route(%3, %4) {k = 2, norm_topk_prob = true, scoring = \"softmax\"} : "
    "i32[128, 2], f32[128, 2] loc(\"/moe/top_k\")\n"
    "  %7, %8, %9 = permute(%5, %6) {capacity = 160, num_experts = 8} : i32[?256], i32[?256], "
    "i32[8] loc(\"/moe/capacity_factor\")\n"
    "  %10 = all_to_all(%2, %9, %9) {group = \"ep\", group_size = 4, traffic = \"dispatch\"} : "
    "f32[?512/ep, 64]\n"
    "  return(%2)\n"
    "}\n";

/* ---- printer ----------------------------------------------------------- */

static void test_print_example(void **state) {
  (void)state;
  xm_ir_module_t *m = build_example();
  char *s = print_module(m);
  assert_string_equal(s, k_example);
  free(s);
  xm_ir_module_destroy(m);
}

static void test_print_types(void **state) {
  (void)state;
  struct {
    xm_ir_type_t t;
    const char *want;
  } cases[4];
  cases[0].t = ty(XM_DT_F32, 0, 0, 0, 0);
  cases[0].want = "f32[]";
  cases[1].t = ty(XM_DT_BOOL, 2, 256, 3, 0);
  cases[1].t.dynamic[0] = true;
  cases[1].t.shard[0] = XM_AXIS_EP;
  cases[1].t.shard[1] = XM_AXIS_TP;
  cases[1].want = "i1[?256/ep, 3/tp]";
  cases[2].t = ty(XM_DT_BF16, 3, 0, 1, 9007199254740993LL);
  cases[2].t.shard[2] = XM_AXIS_NODE;
  cases[2].want = "bf16[0, 1, 9007199254740993/node]";
  cases[3].t = ty(XM_DT_I64, 1, 7, 0, 0);
  cases[3].t.shard[0] = XM_AXIS_EDP;
  cases[3].t.dynamic[0] = true;
  cases[3].want = "i64[?7/edp]";
  for (size_t i = 0; i < 4; i++) {
    xm_strbuf_t b;
    xm_strbuf_init(&b);
    xm_ir_print_type(&cases[i].t, &b);
    assert_string_equal(xm_strbuf_cstr(&b), cases[i].want);
    xm_strbuf_free(&b);
  }
}

static void test_print_attr_values(void **state) {
  (void)state;
  int64_t ints[3] = {1, -2, 9223372036854775807LL};
  double floats[2] = {1.0, 2.5};
  xm_ir_attr_t cases[] = {
      {.kind = XM_ATTR_INT, .i = -3},
      {.kind = XM_ATTR_FLOAT, .f = 0.02},
      {.kind = XM_ATTR_FLOAT, .f = 1e-6},
      {.kind = XM_ATTR_FLOAT, .f = 1.0},
      {.kind = XM_ATTR_FLOAT, .f = INFINITY},
      {.kind = XM_ATTR_FLOAT, .f = -INFINITY},
      {.kind = XM_ATTR_FLOAT, .f = NAN},
      {.kind = XM_ATTR_BOOL, .i = 1},
      {.kind = XM_ATTR_BOOL, .i = 0},
      {.kind = XM_ATTR_STRING, .s = "a\"b\\c\n\t\x01"},
      {.kind = XM_ATTR_INTS, .n = 3, .ints = ints},
      {.kind = XM_ATTR_FLOATS, .n = 2, .floats = floats},
      {.kind = XM_ATTR_FLOATS, .n = 0, .floats = floats},
      {.kind = XM_ATTR_INTS, .n = 0, .ints = ints},
  };
  const char *want[] = {"-3",
                        "0.02",
                        "1e-06",
                        "1.0",
                        "inf",
                        "-inf",
                        "nan",
                        "true",
                        "false",
                        "\"a\\\"b\\\\c\\n\\t\\u0001\"",
                        "[1, -2, 9223372036854775807]",
                        "[1.0, 2.5]",
                        "[]",
                        "[]"};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    xm_strbuf_t b;
    xm_strbuf_init(&b);
    xm_ir_print_attr_value(&cases[i], &b);
    assert_string_equal(xm_strbuf_cstr(&b), want[i]);
    xm_strbuf_free(&b);
  }
}

static void test_print_empty_and_variadic(void **state) {
  (void)state;
  xm_ir_module_t *m = NULL;
  assert_int_equal(xm_ir_module_create("needs quoting!", &m), XM_OK);
  char *s = print_module(m);
  assert_string_equal(s, "module @\"needs quoting!\" {\n}\n");
  free(s);
  xm_ir_value_t *v[3];
  for (int i = 0; i < 3; i++)
    v[i] = xm_ir_build1(m, XM_OP_CONSTANT, 0, NULL, ty(XM_DT_F32, 0, 0, 0, 0), NULL);
  xm_ir_op_set_float(m, v[1]->def, "value", -0.5);
  xm_ir_op_set_string(m, v[1]->def, "weird key", "x");
  xm_ir_op_append(m, XM_OP_RETURN, 3, v, 0, NULL, "/out");
  xm_ir_op_append(m, XM_OP_RETURN, 0, NULL, 0, NULL, NULL);
  s = print_module(m);
  assert_string_equal(s, "module @\"needs quoting!\" {\n"
                         "  %0 = constant() : f32[]\n"
                         "  %1 = constant() {value = -0.5, \"weird key\" = \"x\"} : f32[]\n"
                         "  %2 = constant() : f32[]\n"
                         "  return(%0, %1, %2) loc(\"/out\")\n"
                         "  return()\n"
                         "}\n");
  assert_reprints(s, NULL);
  free(s);
  xm_ir_module_destroy(m);
}

/* Ids keep holes after ops are removed; printed numbers do not. */
static void test_print_renumbers(void **state) {
  (void)state;
  xm_ir_module_t *m = NULL;
  assert_int_equal(xm_ir_module_create("m", &m), XM_OK);
  xm_ir_value_t *a = xm_ir_build1(m, XM_OP_INPUT, 0, NULL, ty(XM_DT_F32, 1, 4, 0, 0), NULL);
  xm_ir_build1(m, XM_OP_SILU, 1, &a, ty(XM_DT_F32, 1, 4, 0, 0), NULL);
  xm_ir_value_t *c = xm_ir_build1(m, XM_OP_GELU, 1, &a, ty(XM_DT_F32, 1, 4, 0, 0), NULL);
  xm_ir_op_append(m, XM_OP_RETURN, 1, &c, 0, NULL, NULL);
  bool remove[4] = {false, true, false, false};
  xm_ir_module_remove_ops(m, remove);
  assert_int_equal(c->id, 2);
  char *s = print_module(m);
  assert_string_equal(s, "module @m {\n"
                         "  %0 = input() : f32[4]\n"
                         "  %1 = gelu(%0) : f32[4]\n"
                         "  return(%1)\n"
                         "}\n");
  free(s);
  xm_ir_module_destroy(m);
}

/* ---- parser ------------------------------------------------------------ */

static void test_parse_structure(void **state) {
  (void)state;
  xm_ir_module_t *m = parse_ok(k_example);
  assert_string_equal(xm_ir_module_name(m), "tiny");
  assert_int_equal(xm_ir_module_num_attrs(m), 2);
  assert_string_equal(xm_ir_module_attr(m, 0)->key, "model_type");
  assert_string_equal(xm_ir_module_attr(m, 0)->s, "xmoec");
  assert_int_equal(xm_ir_module_attr(m, 1)->kind, XM_ATTR_INT);
  assert_int_equal(xm_ir_module_attr(m, 1)->i, 64);
  assert_int_equal(xm_ir_module_num_ops(m), 9);
  assert_int_equal(xm_ir_module_num_values(m), 11);

  xm_ir_op_t *in = xm_ir_module_op(m, 0);
  assert_int_equal(in->code, XM_OP_INPUT);
  assert_string_equal(in->loc, "/training/seq_len");
  assert_string_equal(xm_ir_op_get_string(in, "name", ""), "tokens");
  assert_int_equal(in->results[0]->type.dtype, XM_DT_I32);
  assert_int_equal(in->results[0]->num_uses, 1);

  xm_ir_op_t *param = xm_ir_module_op(m, 1);
  assert_int_equal(xm_ir_op_attr(param, "std")->kind, XM_ATTR_FLOAT);
  assert_true(xm_ir_op_get_float(param, "std", 0) == 0.02);

  xm_ir_op_t *emb = xm_ir_module_op(m, 2);
  assert_int_equal(emb->code, XM_OP_EMBEDDING);
  assert_ptr_equal(emb->operands[0], in->results[0]);
  assert_ptr_equal(emb->operands[1], param->results[0]);
  assert_int_equal(emb->results[0]->num_uses, 2); /* all_to_all and return */

  xm_ir_op_t *route = xm_ir_module_op(m, 5);
  assert_int_equal(route->code, XM_OP_TOPK_ROUTE);
  assert_int_equal(route->num_results, 2);
  assert_true(xm_ir_op_get_bool(route, "norm_topk_prob", false));
  assert_int_equal(xm_ir_op_get_int(route, "k", 0), 2);

  xm_ir_op_t *perm = xm_ir_module_op(m, 6);
  assert_int_equal(perm->num_results, 3);
  assert_true(perm->results[0]->type.dynamic[0]);
  assert_int_equal(perm->results[0]->type.dims[0], 256);
  assert_false(perm->results[2]->type.dynamic[0]);
  assert_int_equal(perm->results[0]->num_uses, 0);
  assert_int_equal(perm->results[2]->num_uses, 2); /* send and recv counts */

  xm_ir_op_t *a2a = xm_ir_module_op(m, 7);
  const xm_ir_type_t *t = &a2a->results[0]->type;
  assert_int_equal(t->rank, 2);
  assert_true(t->dynamic[0]);
  assert_int_equal(t->dims[0], 512);
  assert_int_equal(t->shard[0], XM_AXIS_EP);
  assert_int_equal(t->shard[1], XM_AXIS_NONE);
  assert_string_equal(a2a->loc, "");

  xm_ir_op_t *ret = xm_ir_module_op(m, 8);
  assert_int_equal(ret->code, XM_OP_RETURN);
  assert_int_equal(ret->num_results, 0);
  assert_ptr_equal(ret->operands[0], emb->results[0]);
  xm_ir_module_destroy(m);
}

static void test_parse_attr_kinds(void **state) {
  (void)state;
  xm_ir_module_t *m = parse_ok(
      "module @a {\n"
      "  %x = constant() {z = [], b = false, f = -1.5e3, fs = [0.5, -inf, nan], i = -7,\n"
      "                   is = [3, -4], s = \"caf\\u00e9\\/\", t = true, big = 1e300} : f32[]\n"
      "}\n");
  xm_ir_op_t *op = xm_ir_module_op(m, 0);
  assert_int_equal(op->num_attrs, 9);
  const char *order[] = {"b", "big", "f", "fs", "i", "is", "s", "t", "z"};
  for (int i = 0; i < 9; i++)
    assert_string_equal(op->attrs[i].key, order[i]);
  assert_int_equal(xm_ir_op_attr(op, "b")->kind, XM_ATTR_BOOL);
  assert_int_equal(xm_ir_op_attr(op, "b")->i, 0);
  assert_true(xm_ir_op_get_float(op, "f", 0) == -1500.0);
  assert_true(xm_ir_op_get_float(op, "big", 0) == 1e300);
  const xm_ir_attr_t *fs = xm_ir_op_attr(op, "fs");
  assert_int_equal(fs->kind, XM_ATTR_FLOATS);
  assert_int_equal(fs->n, 3);
  assert_true(fs->floats[0] == 0.5 && isinf(fs->floats[1]) && fs->floats[1] < 0);
  assert_true(isnan(fs->floats[2]));
  assert_int_equal(xm_ir_op_get_int(op, "i", 0), -7);
  const xm_ir_attr_t *is = xm_ir_op_attr(op, "is");
  assert_int_equal(is->kind, XM_ATTR_INTS);
  assert_int_equal(is->n, 2);
  assert_int_equal(is->ints[1], -4);
  assert_string_equal(xm_ir_op_get_string(op, "s", ""), "caf\xc3\xa9/");
  assert_true(xm_ir_op_get_bool(op, "t", false));
  assert_int_equal(xm_ir_op_attr(op, "z")->kind, XM_ATTR_INTS); /* [] reads as ints */
  assert_int_equal(xm_ir_op_attr(op, "z")->n, 0);
  char *s = print_module(m);
  assert_string_equal(s, "module @a {\n"
                         "  %0 = constant() {b = false, big = 1e+300, f = -1500.0, "
                         "fs = [0.5, -inf, nan], i = -7, is = [3, -4], s = \"caf\xc3\xa9/\", "
                         "t = true, z = []} : f32[]\n"
                         "}\n");
  free(s);
  xm_ir_module_destroy(m);
}

/* Names, spacing and comments do not matter; the reprint is canonical. */
static void test_parse_free_form(void **state) {
  (void)state;
  assert_reprints("// leading comment\n"
                  "module@\"m\"attributes{\"k\"=1}{// body\n"
                  "%tokens=input(){name=\"t\"}:i32[ 2 ,?8/dp ]loc(\"/a\")\n"
                  "  %h.1 ,%h.2 = topk_route ( %tokens , %tokens )\n"
                  "     : i32[2], f32[]\n"
                  "return(%h.2,%tokens , %h.1)   // done\n"
                  "}   // trailing\n",
                  "module @m attributes {k = 1} {\n"
                  "  %0 = input() {name = \"t\"} : i32[2, ?8/dp] loc(\"/a\")\n"
                  "  %1, %2 = topk_route(%0, %0) : i32[2], f32[]\n"
                  "  return(%2, %0, %1)\n"
                  "}\n");
}

/* A byte span that is not NUL-terminated is read only up to its length. */
static void test_parse_span(void **state) {
  (void)state;
  const char text[] = "module @s {\n}\nGARBAGE";
  xm_diag_t d;
  xm_diag_init(&d);
  xm_ir_module_t *m = NULL;
  assert_int_equal(xm_ir_parse(text, 14, "span", &d, &m), XM_OK);
  assert_string_equal(xm_ir_module_name(m), "s");
  xm_ir_module_destroy(m);
  assert_int_equal(xm_ir_parse(text, sizeof text - 1, "span", &d, &m), XM_ERR_INVALID_INPUT);
  assert_null(m);
  assert_string_equal(d.entries[0].place, "3:1");
  xm_diag_free(&d);
}

/* ---- round trips ------------------------------------------------------- */

static void test_round_trip_example(void **state) {
  (void)state;
  assert_reprints(k_example, NULL);
}

static void test_round_trip_floats(void **state) {
  (void)state;
  assert_reprints("module @f {\n"
                  "  %0 = constant() {a = 1e-06, b = 0.1, c = 1e+300, d = -0.0, e = inf, "
                  "f = -inf, g = nan, h = 5e-324, i = 1.7976931348623157e+308, "
                  "j = 0.30000000000000004, k = 123456789.0, l = 1e+16} : f32[]\n"
                  "  %1 = constant() {v = [1e-06, 0.1, -0.0, 2.5, 1e+300]} : bf16[3]\n"
                  "}\n",
                  NULL);
  xm_ir_module_t *m = parse_ok("module @f {\n  %0 = constant() {d = -0.0} : f32[]\n}\n");
  double d = xm_ir_op_get_float(xm_ir_module_op(m, 0), "d", 1.0);
  assert_true(d == 0.0 && signbit(d));
  xm_ir_module_destroy(m);
}

static void test_round_trip_strings_and_names(void **state) {
  (void)state;
  assert_reprints("module @\"a b\\\"c\" attributes {plan.tp = [1, 2, -9223372036854775808], "
                  "\"x y\" = \"\\t\\r\\n\\\\\\u0001\\u007f\"} {\n"
                  "  %0 = input() {\"\" = \"\", name = \"\\u001f\"} : i64[] loc(\"f.json:/a/0\")\n"
                  "  return(%0) loc(\"\\\"q\\\"\")\n"
                  "}\n",
                  NULL);
  assert_reprints("module @x-1.y_2 {\n}\n", NULL);
}

static void test_round_trip_types(void **state) {
  (void)state;
  assert_reprints("module @t {\n"
                  "  %0 = input() : f32[]\n"
                  "  %1 = input() : bf16[1, 2, 3, 4, 5, 6]\n"
                  "  %2 = input() : f16[?0/dp, 9223372036854775807/tp, ?3/ep, 4/edp, 5/sp, "
                  "?6/node]\n"
                  "  %3 = input() : i1[0]\n"
                  "  %4 = reshape(%1) : i64[?720/tp]\n"
                  "  return(%0, %1, %2, %3, %4)\n"
                  "}\n",
                  NULL);
}

/* The example built through the API, printed, parsed: identical structure. */
static void test_round_trip_built(void **state) {
  (void)state;
  xm_ir_module_t *m = build_example();
  char *s = print_module(m);
  xm_ir_module_t *again = parse_ok(s);
  assert_int_equal(xm_ir_module_num_ops(again), xm_ir_module_num_ops(m));
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    xm_ir_op_t *a = xm_ir_module_op(m, i), *b = xm_ir_module_op(again, i);
    assert_int_equal(a->code, b->code);
    assert_int_equal(a->num_attrs, b->num_attrs);
    assert_string_equal(a->loc, b->loc);
    for (int r = 0; r < a->num_results; r++) {
      assert_true(xm_ir_type_identical(&a->results[r]->type, &b->results[r]->type));
      assert_int_equal(a->results[r]->num_uses, b->results[r]->num_uses);
    }
  }
  free(s);
  xm_ir_module_destroy(again);
  xm_ir_module_destroy(m);
}

/* ---- errors ------------------------------------------------------------ */

#define H "module @m {\n"

static void test_errors_syntax(void **state) {
  (void)state;
  assert_parse_error("", "1:1", "expected 'module', found end of input");
  assert_parse_error("  // only a comment\n", "2:1", "expected 'module'");
  assert_parse_error("modul @m {}", "1:1", "expected 'module', found 'modul'");
  assert_parse_error("module m {}", "1:8", "expected '@' and a module name, found 'm'");
  assert_parse_error("module @ {}", "1:8", "expected a module name after '@'");
  assert_parse_error(H "  %0 = input() {name = \"abc\n}\n", "2:24", "unterminated string");
  assert_parse_error(H "  %0 = input() {name = \"a\\qb\"} : f32[]\n}\n", "2:26",
                     "invalid escape '\\q' in string");
  assert_parse_error(H "  %0 = input() {name = \"\\u12\"} : f32[]\n}\n", "2:25",
                     "'\\u' needs four hex digits");
  assert_parse_error(H "  %0 = input() {name = \"\\u0000\"} : f32[]\n}\n", "2:25",
                     "'\\u0000' is not allowed");
  assert_parse_error(H "  %0 = input() {name = \"a\x01\"} : f32[]\n}\n", "2:26",
                     "control character 0x01 in string");
  assert_parse_error("module @m {\n  %a = input() : f32[]\n", "3:1",
                     "missing '}' at the end of the module");
  assert_parse_error("module @m {\n}\nxyz", "3:1", "unexpected 'xyz' after the end of the module");
  assert_parse_error(H "  %a = input() : f32[12ab]\n}\n", "2:22", "malformed number");
  assert_parse_error(H "  %a = input() : f32[] $\n}\n", "2:24", "unexpected character '$'");
  assert_parse_error(H "  return(%a %b)\n}\n", "2:13",
                     "expected ')' to close the operands, found '%b'");
  assert_parse_error(H "  return() loc(5)\n}\n", "2:16", "expected a location string, found '5'");
  assert_parse_error(H "  %a = input() : 5\n}\n", "2:18", "expected a type, found '5'");
  assert_parse_error(H "  %a = input() : f32[2\n}\n", "3:1", "expected ']' to close the dims");
  assert_parse_error(H "  %a = input() : f32[?]\n}\n", "2:23", "expected a dim size, found ']'");
  assert_parse_error(H "  %a = input() {n = } : f32[]\n}\n", "2:21",
                     "expected an attribute value, found '}'");
  assert_parse_error(H "  %a = input() {n = [1, x]} : f32[]\n}\n", "2:25",
                     "expected a number in the array, found 'x'");
  assert_parse_error(H "  %a input()\n}\n", "2:6", "expected '=' after the result names");
  assert_parse_error(H "  % = input()\n}\n", "2:3", "expected a value name after '%'");
  assert_parse_error(H "  %a = \"input\"()\n}\n", "2:8", "expected an op name, found a string");
}

static void test_errors_semantic(void **state) {
  (void)state;
  assert_parse_error(H "  %0 = matmull(%a, %b) : f32[]\n}\n", "2:8",
                     "unknown op 'matmull'; did you mean 'matmul'?");
  assert_parse_error(H "  frobnicate()\n}\n", "2:3", "unknown op 'frobnicate' (ir/ops.def");
  assert_parse_error(H "  %0 = input() : f31[2]\n}\n", "2:18",
                     "unknown dtype 'f31'; did you mean 'f32'?");
  assert_parse_error(H "  %0 = input() : f32[1, 2, 3, 4, 5, 6, 7]\n}\n", "2:40",
                     "a type has at most 6 dims");
  assert_parse_error(H "  %0 = input() : f32[99999999999999999999]\n}\n", "2:22",
                     "dim out of range");
  assert_parse_error(H "  %0 = input() : f32[-1]\n}\n", "2:22", "negative dim -1");
  assert_parse_error(H "  %a = input() : f32[4/xp]\n}\n", "2:24", "unknown mesh axis 'xp'");
  assert_parse_error(H "  %a = input() : f32[4/_]\n}\n", "2:24", "unknown mesh axis '_'");
  assert_parse_error(H "  return(%nope)\n}\n", "2:10", "use of undefined value %nope");
  assert_parse_error(H "  %a = input() : f32[]\n  %a = input() : f32[]\n}\n", "3:3",
                     "redefinition of value %a (first defined at 2:3)");
  assert_parse_error(H "  return(%a)\n  %a = input() : f32[]\n}\n", "2:10",
                     "value %a is used before its definition at 3:3");
  assert_parse_error(H "  %a = silu(%a) : f32[]\n}\n", "2:13",
                     "value %a is used before its definition at 2:3");
  assert_parse_error(H "  %a, %b = input() : f32[]\n}\n", "2:3",
                     "2 result names but 1 result type");
  assert_parse_error(H "  return() : f32[]\n}\n", "2:3", "0 result names but 1 result type");
  assert_parse_error(H "  %a = input()\n}\n", "2:3", "1 result name but 0 result types");
  assert_parse_error(H "  %a, %b = input() : f32[], f32[]\n}\n", "2:12",
                     "op 'input' has 1 result, not 2");
  assert_parse_error(H "  %a = input() : f32[]\n  %b = add(%a) : f32[]\n}\n", "3:8",
                     "op 'add' takes 2 operands, not 1");
  assert_parse_error(H "  %a = input() {n = 9223372036854775808} : f32[]\n}\n", "2:21",
                     "integer out of range");
  assert_parse_error(H "  %a = input() {n = 1e999} : f32[]\n}\n", "2:21",
                     "float literal out of range");
  assert_parse_error(H "  %a = input() {n = [1, 2.5]} : f32[]\n}\n", "2:25", "array mixes");
  assert_parse_error(H "  %a = input() {n = 1, n = 2} : f32[]\n}\n", "2:24",
                     "duplicate attribute 'n'");
}

/* Semantic errors do not stop the parse; a poisoned value does not cascade. */
static void test_errors_collected(void **state) {
  (void)state;
  const char *text = H "  %a = inptu() : f32[]\n"   /* unknown op: %a poisoned */
                       "  %b = silu(%a) : f32[]\n"  /* no error: %a already reported */
                       "  %c = gelu(%zz) : f32[]\n" /* undefined, reported at the end */
                       "  %b = input() : f32[]\n"   /* redefinition */
                       "  %d = input() : q8[]\n"    /* unknown dtype */
                       "}\n";
  xm_diag_t d;
  xm_diag_init(&d);
  xm_ir_module_t *m = NULL;
  assert_int_equal(xm_ir_parse(text, strlen(text), "many.xir", &d, &m), XM_ERR_INVALID_INPUT);
  assert_null(m);
  assert_int_equal(xm_diag_error_count(&d), 4);
  assert_string_equal(d.entries[0].place, "2:8");
  assert_non_null(strstr(d.entries[0].message, "did you mean 'input'?"));
  assert_string_equal(d.entries[1].place, "5:3");
  assert_non_null(strstr(d.entries[1].message, "redefinition of value %b"));
  assert_string_equal(d.entries[2].place, "6:18");
  assert_non_null(strstr(d.entries[2].message, "unknown dtype 'q8'"));
  assert_string_equal(d.entries[3].place, "4:13");
  assert_non_null(strstr(d.entries[3].message, "undefined value %zz"));
  xm_diag_free(&d);
}

static void test_errors_bytes(void **state) {
  (void)state;
  const char text[] = "module @m {\n  \0 }";
  xm_diag_t d;
  xm_diag_init(&d);
  xm_ir_module_t *m = NULL;
  assert_int_equal(xm_ir_parse(text, sizeof text - 1, "nul", &d, &m), XM_ERR_INVALID_INPUT);
  assert_string_equal(d.entries[0].place, "2:3");
  assert_non_null(strstr(d.entries[0].message, "unexpected byte 0x00"));
  xm_diag_free(&d);
  assert_int_equal(xm_ir_parse(NULL, 0, "null", &d, &m), XM_ERR_INVALID_INPUT);
  assert_string_equal(d.entries[0].place, "1:1");
  xm_diag_free(&d);
}

/* ---- robustness -------------------------------------------------------- */

/* Parses `len` bytes of `text` (copied so reads past the span would be
 * caught by the sanitizers) and checks the outcome is consistent. */
static void parse_any(const char *text, size_t len) {
  char *copy = malloc(len ? len : 1);
  assert_non_null(copy);
  if (len) memcpy(copy, text, len);
  xm_diag_t d;
  xm_diag_init(&d);
  xm_ir_module_t *m = NULL;
  xm_status_t st = xm_ir_parse(copy, len, "fuzz", &d, &m);
  assert_true(st == XM_OK || st == XM_ERR_INVALID_INPUT);
  if (st == XM_OK) {
    assert_non_null(m);
    char *s = print_module(m);
    xm_ir_module_t *again = NULL;
    assert_int_equal(xm_ir_parse(s, strlen(s), "again", &d, &again), XM_OK);
    char *s2 = print_module(again);
    assert_string_equal(s, s2);
    free(s2);
    free(s);
    xm_ir_module_destroy(again);
    xm_ir_module_destroy(m);
  } else {
    assert_null(m);
    assert_true(xm_diag_error_count(&d) > 0);
  }
  xm_diag_free(&d);
  free(copy);
}

static void test_fuzz_prefixes_and_mutations(void **state) {
  (void)state;
  static const char extra[] = "module @q attributes {a = [1.5, -inf], b = \"\\u00e9\\n\"} {\n"
                              "  %x = constant() {value = -0.0} : f32[?3/tp, 4/ep]\n"
                              "  return(%x) loc(\"/q\")\n"
                              "}\n";
  const char *texts[2] = {k_example, extra};
  for (int t = 0; t < 2; t++) {
    size_t n = strlen(texts[t]);
    for (size_t len = 0; len <= n; len++)
      parse_any(texts[t], len);
  }
  static const char interesting[] = "%@\"\\{}[](),=:?/-.e0129 \n\x01\xff";
  uint64_t seed = 0x9E3779B97F4A7C15ull;
  size_t n = strlen(k_example);
  char *buf = malloc(n);
  assert_non_null(buf);
  for (int round = 0; round < 600; round++) {
    memcpy(buf, k_example, n);
    int edits = 1 + round % 4;
    for (int e = 0; e < edits; e++) {
      seed ^= seed << 13;
      seed ^= seed >> 7;
      seed ^= seed << 17;
      size_t pos = (size_t)(seed % n);
      unsigned r = (unsigned)(seed >> 32);
      buf[pos] = (r & 1) ? (char)(r >> 8) : interesting[(r >> 8) % (sizeof interesting - 1)];
    }
    parse_any(buf, n);
  }
  free(buf);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_print_example),
      cmocka_unit_test(test_print_types),
      cmocka_unit_test(test_print_attr_values),
      cmocka_unit_test(test_print_empty_and_variadic),
      cmocka_unit_test(test_print_renumbers),
      cmocka_unit_test(test_parse_structure),
      cmocka_unit_test(test_parse_attr_kinds),
      cmocka_unit_test(test_parse_free_form),
      cmocka_unit_test(test_parse_span),
      cmocka_unit_test(test_round_trip_example),
      cmocka_unit_test(test_round_trip_floats),
      cmocka_unit_test(test_round_trip_strings_and_names),
      cmocka_unit_test(test_round_trip_types),
      cmocka_unit_test(test_round_trip_built),
      cmocka_unit_test(test_errors_syntax),
      cmocka_unit_test(test_errors_semantic),
      cmocka_unit_test(test_errors_collected),
      cmocka_unit_test(test_errors_bytes),
      cmocka_unit_test(test_fuzz_prefixes_and_mutations),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
