/* tests/unit/test_blas_core.c — which OpenBLAS kernels out/train asks for
 * (runtime/driver/blas_core.h): the levels of OpenBLAS's core names, the
 * pick against the CPU's level, and that this process's OpenBLAS answers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cmocka.h>

#include "runtime/driver/blas_core.h"

/* OpenBLAS's own answer, declared here so that the test links the library
 * (cblas.h declares it too, but the check must not depend on that header). */
extern char *openblas_get_corename(void);

static void test_levels(void **state) {
  (void)state;
  assert_int_equal(xm_blas_core_level("prescott"), XM_BLAS_LEVEL_BASE);
  assert_int_equal(xm_blas_core_level("Prescott"), XM_BLAS_LEVEL_BASE);
  assert_int_equal(xm_blas_core_level("NEHALEM"), XM_BLAS_LEVEL_BASE);
  assert_int_equal(xm_blas_core_level("sandybridge"), XM_BLAS_LEVEL_AVX);
  assert_int_equal(xm_blas_core_level("haswell"), XM_BLAS_LEVEL_AVX2);
  assert_int_equal(xm_blas_core_level("zen"), XM_BLAS_LEVEL_AVX2);
  assert_int_equal(xm_blas_core_level("skylakex"), XM_BLAS_LEVEL_AVX512);
  assert_int_equal(xm_blas_core_level("cooperlake"), XM_BLAS_LEVEL_AVX512);
  assert_int_equal(xm_blas_core_level("sapphirerapids"), XM_BLAS_LEVEL_AVX512);
  /* Unknown names (a newer OpenBLAS, another library) are never replaced. */
  assert_int_equal(xm_blas_core_level("granite_rapids_2030"), XM_BLAS_LEVEL_AVX512);
  assert_int_equal(xm_blas_core_level(NULL), XM_BLAS_LEVEL_AVX512);
}

static void test_pick(void **state) {
  (void)state;
  /* The case that matters: a Xeon with AVX-512 taken for Prescott. */
  assert_string_equal(xm_blas_core_pick("Prescott", XM_BLAS_LEVEL_AVX512), "SkylakeX");
  assert_string_equal(xm_blas_core_pick("haswell", XM_BLAS_LEVEL_AVX512), "SkylakeX");
  assert_string_equal(xm_blas_core_pick("prescott", XM_BLAS_LEVEL_AVX2), "Haswell");
  assert_string_equal(xm_blas_core_pick("core2", XM_BLAS_LEVEL_AVX), "Sandybridge");
  /* What OpenBLAS chose is kept when it uses the CPU's level. */
  assert_null(xm_blas_core_pick("Cooperlake", XM_BLAS_LEVEL_AVX512));
  assert_null(xm_blas_core_pick("Zen", XM_BLAS_LEVEL_AVX2));
  assert_null(xm_blas_core_pick("SkylakeX", XM_BLAS_LEVEL_AVX2));
  assert_null(xm_blas_core_pick("prescott", XM_BLAS_LEVEL_BASE));
  assert_null(xm_blas_core_pick(NULL, XM_BLAS_LEVEL_AVX512));
}

/* The tests link OpenBLAS: it names its core, at least the CPU's level
 * when the test environment chose one (tests/CMakeLists.txt), and the
 * banner line names it. */
static void test_running(void **state) {
  (void)state;
  const char *core = xm_blas_core_running();
  assert_non_null(core);
  assert_string_equal(core, openblas_get_corename());
  int cpu = xm_blas_cpu_level();
  assert_true(cpu >= XM_BLAS_LEVEL_BASE && cpu <= XM_BLAS_LEVEL_AVX512);
  if (getenv("OPENBLAS_CORETYPE") && strcasecmp(getenv("OPENBLAS_CORETYPE"), "SkylakeX") == 0)
    assert_int_equal(xm_blas_core_level(core), XM_BLAS_LEVEL_AVX512);
  char line[256];
  xm_blas_core_describe(line, sizeof line);
  assert_non_null(strstr(line, "OpenBLAS"));
  assert_non_null(strstr(line, core));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_levels),
      cmocka_unit_test(test_pick),
      cmocka_unit_test(test_running),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
