/* tests/unit/test_kernels_threads.c — the paths of the CPU kernels that
 * out/train takes for speed (runtime/cpu/kernels_dense.c, kernels_moe.c,
 * kernels_optim.c), checked against plain double-precision references.
 *
 * out/train runs OpenBLAS single-threaded and splits GEMMs over its OpenMP
 * team itself; the tests set up the same (openblas_set_num_threads(1),
 * two OpenMP threads, which works on one core too) and pick sizes above
 * the kernels' parallel thresholds, with row counts that are not multiples
 * of the 16-row slices, so that every slice edge and the serial tails are
 * exercised: dense GEMMs split by rows and by columns, the *_dw_acc forms
 * that add into an accumulator, grouped GEMMs with empty experts and one
 * expert big enough to be cut into several jobs. GEMM tolerance: 1e-4
 * relative to the sum of |terms| of each dot product.
 *
 * The activations use a vectorised exp (<= 1 ulp); they are compared with
 * double formulas at 2e-6 relative (+1e-7 absolute), with odd lengths (the
 * zero-padded last vector), saturated inputs (exactly 0 and 1, no NaN)
 * and NaN propagation. The vectorised AdamW must equal its scalar formula
 * bit for bit. Grouped GEMMs must give the same bits on two threads as on
 * three, attention on one as on two; attention must stay inside its workspace of
 * runtime/abi/workspace.h (one slot per thread, slots fixed by the shapes)
 * even when it has fewer slots than threads.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cpu/kernels.h"

static int setup(void **state) {
  (void)state;
  openblas_set_num_threads(1);
  omp_set_num_threads(2);
  return 0;
}

/* Deterministic values in [-1, 1). */
static float *rand_buf(int64_t n, uint32_t seed) {
  float *p = malloc((size_t)n * sizeof *p);
  assert_non_null(p);
  uint32_t s = seed * 2654435761u + 1u;
  for (int64_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    p[i] = (float)(s >> 8) / (float)(1u << 23) - 1.0f;
  }
  return p;
}

static void check(const float *got, const double *want, const double *mag, int64_t n, double rtol,
                  const char *what) {
  for (int64_t i = 0; i < n; i++)
    if (!(fabs(got[i] - want[i]) <= rtol * mag[i] + 1e-7))
      fail_msg("%s[%lld]: got %.9g, want %.9g", what, (long long)i, got[i], want[i]);
}

/* C[m,n] = sum_k a(m,k) b(k,n) with element accessors as strides; mag gets
 * the sum of |terms|. */
static void ref_gemm(const float *A, int64_t sam, int64_t sak, const float *B, int64_t sbk,
                     int64_t sbn, int64_t M, int64_t N, int64_t K, double *C, double *mag) {
  for (int64_t m = 0; m < M; m++)
    for (int64_t n = 0; n < N; n++) {
      double s = 0.0, a = 0.0;
      for (int64_t k = 0; k < K; k++) {
        double t = (double)A[m * sam + k * sak] * (double)B[k * sbk + n * sbn];
        s += t;
        a += fabs(t);
      }
      C[m * N + n] = s;
      mag[m * N + n] = a;
    }
}

static void dense_case(int64_t M, int64_t K, int64_t N) {
  float *x = rand_buf(M * K, 1), *w = rand_buf(N * K, 2), *dy = rand_buf(M * N, 3);
  float *y = malloc(sizeof(float) * (size_t)(M * N)), *dx = malloc(sizeof(float) * (size_t)(M * K));
  float *dw = rand_buf(N * K, 4), *acc = rand_buf(N * K, 5), *acc0 = rand_buf(N * K, 5);
  int64_t big = M * N > N * K ? (M * N > M * K ? M * N : M * K) : (N * K > M * K ? N * K : M * K);
  double *want = malloc(sizeof(double) * (size_t)big), *mag = malloc(sizeof(double) * (size_t)big);
  assert_true(y && dx && want && mag);

  xm_k_matmul(x, w, y, M, K, N); /* y = x w^T */
  ref_gemm(x, K, 1, w, 1, K, M, N, K, want, mag);
  check(y, want, mag, M * N, 1e-4, "matmul");

  xm_k_matmul_dx(dy, w, dx, M, K, N); /* dx = dy w */
  ref_gemm(dy, N, 1, w, K, 1, M, K, N, want, mag);
  check(dx, want, mag, M * K, 1e-4, "matmul_dx");

  xm_k_matmul_dw(dy, x, dw, M, K, N); /* dw = dy^T x */
  ref_gemm(dy, 1, N, x, K, 1, N, K, M, want, mag);
  check(dw, want, mag, N * K, 1e-4, "matmul_dw");

  xm_k_matmul_dw_acc(dy, x, acc, M, K, N); /* acc += dy^T x */
  for (int64_t i = 0; i < N * K; i++) {
    want[i] += acc0[i];
    mag[i] += fabs(acc0[i]);
  }
  check(acc, want, mag, N * K, 1e-4, "matmul_dw_acc");
  free(x), free(w), free(dy), free(y), free(dx), free(dw), free(acc), free(acc0), free(want),
      free(mag);
}

static void test_dense_gemm_split(void **state) {
  (void)state;
  dense_case(301, 70, 50); /* more rows than columns: row slices */
  dense_case(37, 64, 600); /* more columns: column slices */
  dense_case(5, 9, 7);     /* below the threshold: one call */
}

/* One grouped GEMM kind against the per-expert reference. */
static void test_grouped_threads(void **state) {
  (void)state;
  enum { E = 6, K = 48, M = 40 };
  const int32_t tpe[E] = {0, 700, 3, 0, 41, 17};
  int64_t n = 0;
  for (int e = 0; e < E; e++)
    n += tpe[e];
  float *x = rand_buf(n * K, 11), *w = rand_buf(E * M * K, 12), *dy = rand_buf(n * M, 13);
  float *y = malloc(sizeof(float) * (size_t)(n * M)), *dx = malloc(sizeof(float) * (size_t)(n * K));
  float *dw = rand_buf(E * M * K, 14), *acc = rand_buf(E * M * K, 15),
        *acc0 = rand_buf(E * M * K, 15);
  double *want = calloc((size_t)(E * M * K + n * (M + K)), sizeof(double));
  double *mag = calloc((size_t)(E * M * K + n * (M + K)), sizeof(double));
  assert_true(y && dx && want && mag);

  xm_k_grouped_matmul(x, w, tpe, y, E, K, M);
  xm_k_grouped_matmul_dx(dy, w, tpe, dx, E, K, M);
  xm_k_grouped_matmul_dw(dy, x, tpe, dw, E, K, M);
  xm_k_grouped_matmul_dw_acc(dy, x, tpe, acc, E, K, M);
  int64_t row = 0;
  for (int e = 0; e < E; e++) {
    int64_t r = tpe[e];
    const float *we = w + (int64_t)e * M * K;
    ref_gemm(x + row * K, K, 1, we, 1, K, r, M, K, want, mag);
    check(y + row * M, want, mag, r * M, 1e-4, "grouped_matmul");
    ref_gemm(dy + row * M, M, 1, we, K, 1, r, K, M, want, mag);
    check(dx + row * K, want, mag, r * K, 1e-4, "grouped_matmul_dx");
    ref_gemm(dy + row * M, 1, M, x + row * K, K, 1, M, K, r, want, mag);
    check(dw + (int64_t)e * M * K, want, mag, M * K, 1e-4, "grouped_matmul_dw");
    for (int64_t i = 0; i < M * K; i++) {
      want[i] += acc0[(int64_t)e * M * K + i];
      mag[i] += fabs(acc0[(int64_t)e * M * K + i]);
    }
    /* an expert without rows gets zeros from dw and is left alone by dw_acc */
    check(acc + (int64_t)e * M * K, want, mag, M * K, 1e-4, "grouped_matmul_dw_acc");
    row += r;
  }
  /* every job is the same GEMM whichever thread takes it, so another team
   * size gives the same bits (one thread takes the serial path, whose
   * whole-expert GEMMs may round differently) */
  float *y1 = malloc(sizeof(float) * (size_t)(n * M)),
        *dx1 = malloc(sizeof(float) * (size_t)(n * K));
  float *dw1 = malloc(sizeof(float) * (size_t)(E * M * K));
  assert_true(y1 && dx1 && dw1);
  omp_set_num_threads(3);
  xm_k_grouped_matmul(x, w, tpe, y1, E, K, M);
  xm_k_grouped_matmul_dx(dy, w, tpe, dx1, E, K, M);
  xm_k_grouped_matmul_dw(dy, x, tpe, dw1, E, K, M);
  omp_set_num_threads(2);
  assert_memory_equal(y, y1, sizeof(float) * (size_t)(n * M));
  assert_memory_equal(dx, dx1, sizeof(float) * (size_t)(n * K));
  assert_memory_equal(dw, dw1, sizeof(float) * (size_t)(E * M * K));
  free(x), free(w), free(dy), free(y), free(dx), free(dw), free(acc), free(acc0), free(want),
      free(mag), free(y1), free(dx1), free(dw1);
}

/* Attention's scratch is one slot per thread of a workspace sized from the
 * shapes alone (runtime/abi/workspace.h). The workspace is exactly the
 * formula's size, dirty, with a canary after it: a kernel that ran more
 * threads than slots would write into the canary. The results must be
 * bitwise the same on one thread and on two. */
#define CANARY 0x7fc5a5a5u

static float *ws_with_canary(int64_t bytes, int64_t canary_floats) {
  int64_t n = bytes / (int64_t)sizeof(float);
  float *p = rand_buf(n + canary_floats, 31);
  for (int64_t i = n; i < n + canary_floats; i++)
    memcpy(p + i, &(uint32_t){CANARY}, sizeof(uint32_t));
  return p;
}

static void canary_intact(const float *p, int64_t bytes, int64_t canary_floats) {
  int64_t n = bytes / (int64_t)sizeof(float);
  for (int64_t i = n; i < n + canary_floats; i++) {
    uint32_t u;
    memcpy(&u, p + i, sizeof u);
    if (u != CANARY) fail_msg("workspace canary %lld overwritten", (long long)(i - n));
  }
}

static void attention_threads_case(int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t D) {
  int64_t nq = B * S * Hq * D, nk = B * S * Hkv * D, no = nq;
  float *q = rand_buf(nq, 51), *k = rand_buf(nk, 52), *v = rand_buf(nk, 53), *g = rand_buf(no, 54);
  float *out[2], *dq[2], *dk[2], *dv[2];
  int64_t fb = xm_ws_attention(B, S, Hq), gb = xm_ws_attention_grad(B, S, Hkv);
  /* a second slot's worth of canary: the first write past the formula */
  int64_t rows = xm_ws_attn_rows(S), fc = rows * S, gc = 2 * rows * S;
  float scale = 1.0f / sqrtf((float)D);
  for (int t = 0; t < 2; t++) {
    omp_set_num_threads(t + 1);
    out[t] = malloc(sizeof(float) * (size_t)no), dq[t] = malloc(sizeof(float) * (size_t)nq);
    dk[t] = malloc(sizeof(float) * (size_t)nk), dv[t] = malloc(sizeof(float) * (size_t)nk);
    assert_true(out[t] && dq[t] && dk[t] && dv[t]);
    float *fws = ws_with_canary(fb, fc), *gws = ws_with_canary(gb, gc);
    xm_k_attention(q, k, v, out[t], B, S, Hq, Hkv, D, D, scale, fws);
    xm_k_attention_grad(g, q, k, v, dq[t], dk[t], dv[t], B, S, Hq, Hkv, D, D, scale, gws);
    canary_intact(fws, fb, fc);
    canary_intact(gws, gb, gc);
    free(fws), free(gws);
  }
  omp_set_num_threads(2);
  assert_memory_equal(out[0], out[1], sizeof(float) * (size_t)no);
  assert_memory_equal(dq[0], dq[1], sizeof(float) * (size_t)nq);
  assert_memory_equal(dk[0], dk[1], sizeof(float) * (size_t)nk);
  assert_memory_equal(dv[0], dv[1], sizeof(float) * (size_t)nk);
  for (int t = 0; t < 2; t++)
    free(out[t]), free(dq[t]), free(dk[t]), free(dv[t]);
  free(q), free(k), free(v), free(g);
}

static void test_attention_threads(void **state) {
  (void)state;
  attention_threads_case(2, 130, 4, 2, 16); /* several tiles and kv heads per thread */
  /* one unit each way: one slot, so the second thread must stay idle */
  assert_int_equal(xm_ws_attention_slots(1, 64, 1), 1);
  assert_int_equal(xm_ws_attention_grad_slots(1, 64, 1), 1);
  attention_threads_case(1, 64, 1, 1, 32);
}

static double sig(double v) { return 1.0 / (1.0 + exp(-v)); }

/* Inputs over [-20, 20) plus saturating values at the start. */
static float *act_inputs(int64_t n) {
  float *g = rand_buf(n, 21);
  for (int64_t i = 0; i < n; i++)
    g[i] *= 20.0f;
  const float special[6] = {-200.0f, -90.0f, 0.0f, 90.0f, 200.0f, -1e-30f};
  for (int i = 0; i < 6 && i < n; i++)
    g[i] = special[i];
  return g;
}

static void activations_case(int64_t n) {
  float *g = act_inputs(n), *u = rand_buf(n, 22), *dy = rand_buf(n, 23);
  float *y = malloc(sizeof(float) * (size_t)n), *dg = malloc(sizeof(float) * (size_t)n);
  float *du = malloc(sizeof(float) * (size_t)n);
  double *want = malloc(sizeof(double) * (size_t)n), *mag = malloc(sizeof(double) * (size_t)n);
  assert_true(y && dg && du && want && mag);
  const double rt = 2e-6;

  xm_k_sigmoid(g, y, n);
  for (int64_t i = 0; i < n; i++)
    want[i] = sig(g[i]), mag[i] = fabs(want[i]);
  check(y, want, mag, n, rt, "sigmoid");
  assert_true(y[0] == 0.0f && y[4] == 1.0f); /* saturated exactly, no NaN */

  xm_k_silu(g, y, n);
  for (int64_t i = 0; i < n; i++)
    want[i] = g[i] * sig(g[i]), mag[i] = fabs(want[i]);
  check(y, want, mag, n, rt, "silu");

  xm_k_silu_grad(dy, g, y, n);
  for (int64_t i = 0; i < n; i++) {
    double s = sig(g[i]);
    want[i] = dy[i] * s * (1.0 + g[i] * (1.0 - s));
    mag[i] = fabs(dy[i]) * s * (1.0 + fabs(g[i]) * (1.0 - s));
  }
  check(y, want, mag, n, rt, "silu_grad");

  xm_k_gelu(g, y, n);
  for (int64_t i = 0; i < n; i++) {
    double v = g[i], z = 0.7978845608028654 * (v + 0.044715 * v * v * v);
    want[i] = 0.5 * v * (1.0 + tanh(z));
    mag[i] = fabs(want[i]);
  }
  check(y, want, mag, n, rt, "gelu");

  xm_k_gelu_grad(dy, g, y, n);
  for (int64_t i = 0; i < n; i++) {
    double v = g[i], z = 0.7978845608028654 * (v + 0.044715 * v * v * v), t = tanh(z);
    double dz = 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * v * v);
    double a = 0.5 * (1.0 + t), b = 0.5 * v * (1.0 - t * t) * dz;
    want[i] = dy[i] * (a + b);
    mag[i] = fabs(dy[i]) * (fabs(a) + fabs(b));
  }
  check(y, want, mag, n, rt, "gelu_grad");

  xm_k_swiglu(g, u, y, n);
  for (int64_t i = 0; i < n; i++)
    want[i] = g[i] * sig(g[i]) * u[i], mag[i] = fabs(want[i]);
  check(y, want, mag, n, rt, "swiglu");

  /* du written over u, as the memory planner may arrange */
  float *uu = malloc(sizeof(float) * (size_t)n);
  assert_non_null(uu);
  memcpy(uu, u, sizeof(float) * (size_t)n);
  xm_k_swiglu_grad(dy, g, uu, dg, uu, n);
  for (int64_t i = 0; i < n; i++) {
    double s = sig(g[i]);
    want[i] = dy[i] * u[i] * s * (1.0 + g[i] * (1.0 - s));
    mag[i] = fabs(dy[i] * u[i]) * s * (1.0 + fabs(g[i]) * (1.0 - s));
  }
  check(dg, want, mag, n, rt, "swiglu_grad dg");
  for (int64_t i = 0; i < n; i++)
    want[i] = dy[i] * g[i] * sig(g[i]), mag[i] = fabs(want[i]);
  check(uu, want, mag, n, rt, "swiglu_grad du");

  g[n - 1] = NAN;
  xm_k_silu(g, y, n);
  assert_true(isnan(y[n - 1]));
  free(g), free(u), free(dy), free(y), free(dg), free(du), free(uu), free(want), free(mag);
}

static void test_activations(void **state) {
  (void)state;
  activations_case(7);     /* one vector and a padded tail */
  activations_case(40003); /* over the team, odd tail */
}

/* The scalar AdamW formula of runtime/cpu/kernels_optim.c, in float. */
static void adamw_ref(float *p, const float *g, float *m, float *v, int64_t n, float lr, float b1,
                      float b2, float eps, float wd, int64_t step, float scale) {
  double t = (double)step;
  float bc2 = (float)sqrt(1.0 - pow((double)b2, t));
  float ss = (float)((double)lr / (1.0 - pow((double)b1, t)));
  float decay = 1.0f - lr * wd;
  for (int64_t i = 0; i < n; i++) {
    float gi = g[i] * scale, pi = p[i] * decay;
    float mi = m[i] + (1.0f - b1) * (gi - m[i]);
    float vi = v[i] * b2 + (1.0f - b2) * gi * gi;
    float denom = sqrtf(vi) / bc2 + eps;
    p[i] = pi - ss * (mi / denom);
    m[i] = mi;
    v[i] = vi;
  }
}

static void test_adamw_bitwise(void **state) {
  (void)state;
  const int64_t n = 100003;
  float *p = rand_buf(n, 31), *g = rand_buf(n, 32), *m = rand_buf(n, 33), *v = rand_buf(n, 34);
  float *p2 = rand_buf(n, 31), *m2 = rand_buf(n, 33), *v2 = rand_buf(n, 34);
  for (int64_t i = 0; i < n; i++)
    v[i] = v2[i] = fabsf(v[i]) * 1e-3f;
  for (int64_t s = 1; s <= 3; s++) {
    xm_k_adamw(p, g, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, s, 0.5f);
    adamw_ref(p2, g, m2, v2, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, s, 0.5f);
  }
  assert_memory_equal(p, p2, sizeof(float) * (size_t)n);
  assert_memory_equal(m, m2, sizeof(float) * (size_t)n);
  assert_memory_equal(v, v2, sizeof(float) * (size_t)n);
  free(p), free(g), free(m), free(v), free(p2), free(m2), free(v2);
}

/* Residual adds without broadcast are one long row: still right when cut
 * into chunks over the team; and in place. */
static void test_add_mul_chunks(void **state) {
  (void)state;
  const int64_t n = 300001, nb = 1000;
  float *a = rand_buf(n - 1, 41), *b = rand_buf(n - 1, 42), *y = malloc(sizeof(float) * (size_t)n);
  assert_non_null(y);
  xm_k_add(a, b, y, n - 1, n - 1);
  for (int64_t i = 0; i < n - 1; i++)
    assert_true(y[i] == a[i] + b[i]);
  xm_k_mul(a, b, y, n - 1, nb); /* broadcast of the first nb elements */
  for (int64_t i = 0; i < n - 1; i++)
    assert_true(y[i] == a[i] * b[i % nb]);
  memcpy(y, a, sizeof(float) * (size_t)(n - 1));
  xm_k_add(y, b, y, n - 1, n - 1);
  for (int64_t i = 0; i < n - 1; i++)
    assert_true(y[i] == a[i] + b[i]);
  free(a), free(b), free(y);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dense_gemm_split), cmocka_unit_test(test_grouped_threads),
      cmocka_unit_test(test_activations),      cmocka_unit_test(test_adamw_bitwise),
      cmocka_unit_test(test_add_mul_chunks),   cmocka_unit_test(test_attention_threads),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
