/* tests/unit/test_kernels_optim.c — training state and optimizer kernels
 * (runtime/cpu/kernels_optim.c).
 *
 * AdamW is compared over three steps with a hand-written double-precision
 * reference of torch.optim.AdamW (decoupled decay before the update, bias
 * corrections with the 1-based step, eps outside the sqrt), with and without
 * weight decay and with a grad_scale (the clip coefficient); tolerance
 * 2e-6 relative to the parameter size. The first step is also checked
 * against its closed form p (1 - lr wd) - lr g / (|g| + eps'). The clip
 * coefficient follows clip_grad_norm_: clip / (norm + 1e-6), at most 1.
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

#include "runtime/cpu/kernels.h"
#include "runtime/abi/program.h"

static void assert_close(double got, double want, double tol, const char *what, int64_t i) {
  if (!(fabs(got - want) <= tol))
    fail_msg("%s[%lld]: got %.9g, want %.9g (tol %.3g)", what, (long long)i, got, want, tol);
}

static void test_accumulate(void **state) {
  (void)state;
  float acc[5] = {1.0f, -2.0f, 0.5f, 0.0f, 3.0f};
  const float x[5] = {0.25f, 2.0f, -0.5f, 7.0f, -1.0f};
  xm_k_accumulate(acc, x, 5);
  xm_k_accumulate(acc, x, 5);
  const float want[5] = {1.5f, 2.0f, -0.5f, 14.0f, 1.0f};
  for (int i = 0; i < 5; i++)
    assert_true(acc[i] == want[i]);

  int32_t ia[3] = {1, -4, 100};
  const int32_t ix[3] = {2, 4, -101};
  xm_k_accumulate_i32(ia, ix, 3);
  assert_int_equal(ia[0], 3);
  assert_int_equal(ia[1], 0);
  assert_int_equal(ia[2], -1);

  /* Large n runs the OpenMP path. */
  int64_t n = 100003;
  float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
  for (int64_t i = 0; i < n; i++) {
    a[i] = (float)(i % 11);
    b[i] = (float)(i % 5) - 2.0f;
  }
  xm_k_accumulate(a, b, n);
  for (int64_t i = 0; i < n; i++)
    assert_true(a[i] == (float)(i % 11) + (float)(i % 5) - 2.0f);
  free(a);
  free(b);
}

static void test_sum_sq(void **state) {
  (void)state;
  const float x[4] = {3.0f, -4.0f, 0.5f, 0.0f};
  assert_true(xm_k_sum_sq(x, 4) == 25.25);
  assert_true(xm_k_sum_sq(x, 0) == 0.0);
  /* Past 2^24 ones an fp32 sum stops growing; double counts every one. */
  int64_t n = (1 << 24) + 3;
  float *o = malloc(sizeof(float) * n);
  for (int64_t i = 0; i < n; i++)
    o[i] = 1.0f;
  o[0] = 0.5f;
  assert_true(xm_k_sum_sq(o, n) == (double)(n - 1) + 0.25);
  free(o);
}

/* torch.optim.AdamW, single-tensor path, in double. */
static void adamw_ref(double *p, const double *g, double *m, double *v, int64_t n, double lr,
                      double b1, double b2, double eps, double wd, int64_t step,
                      double grad_scale) {
  double bc1 = 1.0 - pow(b1, (double)step), bc2 = 1.0 - pow(b2, (double)step);
  for (int64_t i = 0; i < n; i++) {
    double gi = g[i] * grad_scale;
    p[i] *= 1.0 - lr * wd;
    m[i] = b1 * m[i] + (1.0 - b1) * gi;
    v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
    p[i] -= lr / bc1 * m[i] / (sqrt(v[i]) / sqrt(bc2) + eps);
  }
}

static void run_adamw_case(double wd, double grad_scale, double eps) {
  enum { N = 6 };
  const double lr = 1e-2, b1 = 0.9, b2 = 0.95;
  const double p0[N] = {0.5, -1.25, 2.0, 0.0, 1e-3, -0.75};
  const double grads[3][N] = {{0.1, -0.2, 0.0, 1.5, -3.0, 0.01},
                              {-0.3, -0.1, 0.2, 0.5, 2.0, 0.02},
                              {0.05, 0.4, -0.2, -1.0, 0.0, 0.03}};
  double rp[N], rm[N] = {0}, rv[N] = {0};
  float p[N], g[N], m[N], v[N];
  for (int i = 0; i < N; i++) {
    rp[i] = p0[i];
    p[i] = (float)p0[i];
    m[i] = v[i] = 0.0f;
  }
  for (int64_t step = 1; step <= 3; step++) {
    for (int i = 0; i < N; i++)
      g[i] = (float)grads[step - 1][i];
    xm_k_adamw(p, g, m, v, N, (float)lr, (float)b1, (float)b2, (float)eps, (float)wd, step,
               (float)grad_scale);
    adamw_ref(rp, grads[step - 1], rm, rv, N, lr, b1, b2, eps, wd, step, grad_scale);
    for (int i = 0; i < N; i++) {
      assert_close(p[i], rp[i], 2e-6 * (1.0 + fabs(rp[i])), "p", step * 10 + i);
      assert_close(m[i], rm[i], 1e-6 * (1.0 + fabs(rm[i])), "m", step * 10 + i);
      assert_close(v[i], rv[i], 1e-6 * (1.0 + fabs(rv[i])), "v", step * 10 + i);
    }
    if (step == 1) {
      /* m^ = g', v^ = g'^2: the step is lr * g' / (|g'| + eps). */
      for (int i = 0; i < N; i++) {
        double gi = grads[0][i] * grad_scale;
        double want = p0[i] * (1.0 - lr * wd) - lr * gi / (fabs(gi) + eps);
        assert_close(p[i], want, 2e-6, "first step", i);
      }
    }
  }
}

static void test_adamw(void **state) {
  (void)state;
  run_adamw_case(0.0, 1.0, 1e-8);
  run_adamw_case(0.1, 1.0, 1e-8);
  run_adamw_case(0.1, 0.5, 1e-8);
  /* A large eps makes its place (outside the sqrt) visible. */
  run_adamw_case(0.05, 0.25, 1e-2);
}

/* Values that tell the decay's place and the bias correction apart: with a
 * zero gradient the update is pure decay; mis-ordered decay or a missing
 * correction changes step 2 by far more than the tolerance. */
static void test_adamw_decay_only(void **state) {
  (void)state;
  float p[2] = {2.0f, -4.0f}, g[2] = {0.0f, 0.0f}, m[2] = {0}, v[2] = {0};
  xm_k_adamw(p, g, m, v, 2, 0.1f, 0.9f, 0.999f, 1e-8f, 0.5f, 1, 1.0f);
  assert_close(p[0], 2.0 * 0.95, 1e-6, "decay", 0);
  assert_close(p[1], -4.0 * 0.95, 1e-6, "decay", 1);
  /* Step 2 with g = 1 after m = v = 0: m = 0.1, v = 0.001;
   * m^ = 0.1 / 0.19, v^ = 0.001 / (1 - 0.999^2). */
  float g1[2] = {1.0f, 1.0f};
  xm_k_adamw(p, g1, m, v, 2, 0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, 2, 1.0f);
  double mh = 0.1 / (1.0 - 0.81), vh = 0.001 / (1.0 - 0.999 * 0.999);
  assert_close(p[0], 1.9 - 0.1 * mh / (sqrt(vh) + 1e-8), 1e-5, "corrected", 0);
}

static void test_aux_free_update(void **state) {
  (void)state;
  float bias[4] = {0.0f, 0.5f, -0.25f, 1.0f};
  const int32_t load[4] = {3, 1, 2, 2}; /* mean 2 */
  xm_k_aux_free_update(bias, load, 4, 0.125f);
  assert_true(bias[0] == -0.125f);
  assert_true(bias[1] == 0.625f);
  assert_true(bias[2] == -0.25f); /* sign(0) = 0 */
  assert_true(bias[3] == 1.0f);
  /* Non-integer mean: load 0, 0, 1 has mean 1/3. */
  float b2[3] = {0};
  const int32_t l2[3] = {0, 0, 1};
  xm_k_aux_free_update(b2, l2, 3, 1.0f);
  assert_true(b2[0] == 1.0f && b2[1] == 1.0f && b2[2] == -1.0f);
}

static void test_clip_coef(void **state) {
  (void)state;
  assert_close(xm_rt_clip_coef(16.0f, 1.0f), 1.0 / (4.0 + 1e-6), 1e-7, "clip", 0);
  assert_true(xm_rt_clip_coef(0.25f, 1.0f) == 1.0f);
  assert_true(xm_rt_clip_coef(0.0f, 1.0f) == 1.0f);
  assert_true(xm_rt_clip_coef(100.0f, 0.0f) == 1.0f);
  assert_true(xm_rt_clip_coef(100.0f, -1.0f) == 1.0f);
  /* At the boundary the 1e-6 keeps the coefficient just under 1. */
  float c = xm_rt_clip_coef(4.0f, 2.0f);
  assert_true(c < 1.0f);
  assert_close(c, 2.0 / (2.0 + 1e-6), 1e-7, "clip", 1);
  assert_close(xm_rt_clip_coef(1e6f, 0.5f), 0.5 / (1000.0 + 1e-6), 1e-9, "clip", 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_accumulate),      cmocka_unit_test(test_sum_sq),
      cmocka_unit_test(test_adamw),           cmocka_unit_test(test_adamw_decay_only),
      cmocka_unit_test(test_aux_free_update), cmocka_unit_test(test_clip_coef),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
