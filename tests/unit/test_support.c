/* tests/unit/test_support.c — strings, numbers and diagnostics. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "support/diag.h"
#include "support/strbuf.h"

static void test_double_shortest(void **state) {
  (void)state;
  struct { double v; const char *s; } cases[] = {
      {1.0, "1.0"}, {0.1, "0.1"}, {1e-6, "1e-06"}, {10000.0, "10000.0"},
      {2.5e-5, "2.5e-05"}, {-3.0, "-3.0"}, {1e300, "1e+300"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    xm_strbuf_t b;
    xm_strbuf_init(&b);
    xm_strbuf_put_double(&b, cases[i].v);
    assert_string_equal(xm_strbuf_cstr(&b), cases[i].s);
    assert_true(strtod(xm_strbuf_cstr(&b), NULL) == cases[i].v);
    xm_strbuf_free(&b);
  }
}

static void test_quoted(void **state) {
  (void)state;
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  xm_strbuf_put_quoted(&b, "a\"b\\c\n\x01");
  assert_string_equal(xm_strbuf_cstr(&b), "\"a\\\"b\\\\c\\n\\u0001\"");
  xm_strbuf_free(&b);
}

static void test_edit_distance(void **state) {
  (void)state;
  assert_int_equal(xm_edit_distance("top_k", "topk"), 1);
  assert_int_equal(xm_edit_distance("hidden", "hiden"), 1);
  assert_int_equal(xm_edit_distance("", "abc"), 3);
  assert_int_equal(xm_edit_distance("experts", "experts"), 0);
}

static void test_diag_collects(void **state) {
  (void)state;
  xm_diag_t d;
  xm_diag_init(&d);
  xm_diag_add(&d, XM_DIAG_ERROR, "m.json", "/moe/top_k", "must be <= %d", 8);
  xm_diag_add(&d, XM_DIAG_WARNING, "m.json", "/model/x", "unused");
  xm_diag_add(&d, XM_DIAG_ERROR, NULL, "/a", "b");
  assert_int_equal(xm_diag_error_count(&d), 2);
  assert_int_equal(xm_diag_find(&d, "/moe/top_k"), 0);
  assert_int_equal(xm_diag_find(&d, "/nope"), -1);
  assert_string_equal(d.entries[0].message, "must be <= 8");
  xm_diag_free(&d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_double_shortest),
      cmocka_unit_test(test_quoted),
      cmocka_unit_test(test_edit_distance),
      cmocka_unit_test(test_diag_collects),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
