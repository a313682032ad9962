/* tests/unit/test_kernels_dense.c — the dense CPU kernels against naive
 * double-precision references (forward) and central finite differences
 * (backward).
 *
 * Forward tolerance: |got - ref| <= 1e-5 * (1 + |ref|) elementwise (2e-5 for
 * the transcendental ones and attention): the kernels are fp32 with
 * reductions of at most a few hundred terms, so their error is a few float
 * ulps (~1e-7 relative) times a small growth factor; 1e-5 leaves head room
 * yet catches any wrong index, sign or constant.
 *
 * Gradient checks: for a random dy and the scalar L(x) = <dy, f(x)>
 * (accumulated in double), fd_i = (L(x + h e_i) - L(x - h e_i)) / (2h) is
 * compared to the analytic dx_i. h = 1e-2 (the step actually taken is
 * recomputed from the rounded float inputs). Two errors compete: truncation
 * of the central difference, ~h^2 |f'''| / 6 ~ 2e-5 for the smooth
 * functions here, and float rounding of L, ~1e-7 * sum|dy*y| / (2h) ~ 1e-4
 * for our sizes. A smaller h grows the second; a larger one the first.
 * Hence |fd - g| <= 1e-2 * |g| + 1e-3 * max_i |g_i| + noise: a relative 1%,
 * an absolute floor scaled to the gradient for elements whose gradient
 * nearly cancels, and the rounding floor noise = 8 ulp * sum|dy*y| / (2h)
 * for functions whose whole gradient is ~0 (RMSNorm of one element). A wrong factor, sign,
 * transposition or missing term is far above that (checked by breaking kernels on purpose while
 * writing this test).
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

/* ---- helpers ----------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static double rng_unit(void) { /* [0, 1) */
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (double)(rng_state >> 11) / 9007199254740992.0;
}

static float *rand_buf(int64_t n, float lo, float hi) {
  float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
  assert_non_null(p);
  for (int64_t i = 0; i < n; i++)
    p[i] = (float)(lo + (hi - lo) * rng_unit());
  return p;
}

static float *zero_buf(int64_t n) {
  float *p = calloc((size_t)(n > 0 ? n : 1), sizeof *p);
  assert_non_null(p);
  return p;
}

/* A kernel workspace of the formula's bytes (runtime/abi/workspace.h),
 * dirty like the memory plan's, so a kernel that reads scratch it did not
 * write shows it. */
static float *ws_buf(int64_t bytes) {
  int64_t n = (bytes + (int64_t)sizeof(float) - 1) / (int64_t)sizeof(float);
  return rand_buf(n, 1e30f, 2e30f);
}

static double *dzero(int64_t n) {
  double *p = calloc((size_t)(n > 0 ? n : 1), sizeof *p);
  assert_non_null(p);
  return p;
}

static void expect_close(const char *what, const float *got, const double *ref, int64_t n,
                         double tol) {
  for (int64_t i = 0; i < n; i++) {
    double err = fabs((double)got[i] - ref[i]);
    if (!(err <= tol * (1.0 + fabs(ref[i])))) {
      print_error("%s[%lld]: got %.9g, reference %.9g (tol %g)\n", what, (long long)i,
                  (double)got[i], ref[i], tol);
      fail();
    }
  }
}

/* Evaluates the kernel under test on the current inputs of ctx. */
typedef void (*fwd_fn)(void *ctx, float *out);

static double dot_dy(const float *dy, const float *y, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; i++)
    s += (double)dy[i] * (double)y[i];
  return s;
}

/* Central-difference check of grad = d<dy, f>/dx over x[0..nx) (every
 * element when nx <= max_checks, else a random sample of max_checks). */
static void check_grad(const char *what, fwd_fn f, void *ctx, float *x, int64_t nx, const float *dy,
                       int64_t ny, const float *grad, int64_t max_checks) {
  const float h = 1e-2f;
  float *y = zero_buf(ny);
  double gmax = 0.0;
  for (int64_t i = 0; i < nx; i++)
    gmax = fmax(gmax, fabs((double)grad[i]));
  /* rounding noise of the difference quotient: a few float ulps of the
   * terms of L, divided by the step (matters only where g is ~0 overall) */
  f(ctx, y);
  double mag = 0.0;
  for (int64_t i = 0; i < ny; i++)
    mag += fabs((double)dy[i] * (double)y[i]);
  double noise = 8.0 * 6e-8 * mag / (2.0 * (double)h);
  int64_t checks = nx <= max_checks ? nx : max_checks;
  for (int64_t c = 0; c < checks; c++) {
    int64_t i = nx <= max_checks ? c : (int64_t)(rng_unit() * (double)nx);
    float x0 = x[i];
    x[i] = x0 + h;
    float xp = x[i];
    f(ctx, y);
    double lp = dot_dy(dy, y, ny);
    x[i] = x0 - h;
    float xm = x[i];
    f(ctx, y);
    double lm = dot_dy(dy, y, ny);
    x[i] = x0;
    double fd = (lp - lm) / ((double)xp - (double)xm);
    double g = grad[i];
    if (!(fabs(fd - g) <= 1e-2 * fabs(g) + 1e-3 * gmax + noise)) {
      print_error("%s[%lld]: analytic %.7g, finite difference %.7g (max |g| %.4g)\n", what,
                  (long long)i, g, fd, gmax);
      fail();
    }
  }
  free(y);
}

/* ---- matmul ---------------------------------------------------------------- */

typedef struct {
  float *x, *w;
  int64_t M, K, N;
} mm_ctx_t;
static void mm_fwd(void *c, float *out) {
  mm_ctx_t *m = c;
  xm_k_matmul(m->x, m->w, out, m->M, m->K, m->N);
}

static void test_matmul(void **state) {
  (void)state;
  int64_t sizes[][3] = {{7, 5, 3}, {1, 1, 1}, {65, 33, 17}};
  for (size_t t = 0; t < 3; t++) {
    int64_t M = sizes[t][0], K = sizes[t][1], N = sizes[t][2];
    float *x = rand_buf(M * K, -1, 1), *w = rand_buf(N * K, -1, 1), *y = zero_buf(M * N);
    float *dy = rand_buf(M * N, -1, 1), *dx = zero_buf(M * K), *dw = zero_buf(N * K);
    double *ry = dzero(M * N), *rdx = dzero(M * K), *rdw = dzero(N * K);
    for (int64_t i = 0; i < M; i++)
      for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
          ry[i * N + n] += (double)x[i * K + k] * w[n * K + k];
          rdx[i * K + k] += (double)dy[i * N + n] * w[n * K + k];
          rdw[n * K + k] += (double)dy[i * N + n] * x[i * K + k];
        }
    xm_k_matmul(x, w, y, M, K, N);
    xm_k_matmul_dx(dy, w, dx, M, K, N);
    xm_k_matmul_dw(dy, x, dw, M, K, N);
    expect_close("matmul", y, ry, M * N, 1e-5);
    expect_close("matmul_dx", dx, rdx, M * K, 1e-5);
    expect_close("matmul_dw", dw, rdw, N * K, 1e-5);
    mm_ctx_t c = {x, w, M, K, N};
    check_grad("matmul dx", mm_fwd, &c, x, M * K, dy, M * N, dx, 300);
    check_grad("matmul dw", mm_fwd, &c, w, N * K, dy, M * N, dw, 300);
    free(x), free(w), free(y), free(dy), free(dx), free(dw), free(ry), free(rdx), free(rdw);
  }
}

/* ---- elementwise and broadcast --------------------------------------------- */

typedef struct {
  float *a, *b;
  int64_t na, nb;
  int mul;
} bc_ctx_t;
static void bc_fwd(void *c, float *out) {
  bc_ctx_t *m = c;
  if (m->mul)
    xm_k_mul(m->a, m->b, out, m->na, m->nb);
  else
    xm_k_add(m->a, m->b, out, m->na, m->nb);
}

static void test_broadcast_and_reduce(void **state) {
  (void)state;
  /* the second size takes the OpenMP path (>= 2^15 elements) */
  int64_t sizes[][2] = {{21, 7}, {39 * 1030, 1030}, {5, 5}};
  for (size_t t = 0; t < 3; t++) {
    int64_t na = sizes[t][0], nb = sizes[t][1];
    float *a = rand_buf(na, -1, 1), *b = rand_buf(nb, -1, 1), *y = zero_buf(na);
    double *ref = dzero(na), *rsum = dzero(nb);
    xm_k_add(a, b, y, na, nb);
    for (int64_t i = 0; i < na; i++)
      ref[i] = (double)a[i] + b[i % nb];
    expect_close("add", y, ref, na, 1e-6);
    xm_k_mul(a, b, y, na, nb);
    for (int64_t i = 0; i < na; i++)
      ref[i] = (double)a[i] * b[i % nb];
    expect_close("mul", y, ref, na, 1e-6);
    float *rs = zero_buf(nb);
    xm_k_reduce_to(a, rs, na, nb);
    for (int64_t i = 0; i < na; i++)
      rsum[i % nb] += a[i];
    expect_close("reduce_to", rs, rsum, nb, 1e-5);
    free(a), free(b), free(y), free(ref), free(rsum), free(rs);
  }
  /* reduce_to is the gradient of the broadcast operand; for mul it is
   * reduce_to(dy * a) and the gradient of a is mul(dy, b). */
  int64_t na = 15, nb = 5;
  float *a = rand_buf(na, -1, 1), *b = rand_buf(nb, -1, 1), *dy = rand_buf(na, -1, 1);
  float *db = zero_buf(nb), *da = zero_buf(na), *tmp = zero_buf(na);
  bc_ctx_t c = {a, b, na, nb, 0};
  xm_k_reduce_to(dy, db, na, nb);
  check_grad("add db", bc_fwd, &c, b, nb, dy, na, db, 100);
  c.mul = 1;
  xm_k_mul(dy, a, tmp, na, na);
  xm_k_reduce_to(tmp, db, na, nb);
  xm_k_mul(dy, b, da, na, nb);
  check_grad("mul db", bc_fwd, &c, b, nb, dy, na, db, 100);
  check_grad("mul da", bc_fwd, &c, a, na, dy, na, da, 100);
  free(a), free(b), free(dy), free(db), free(da), free(tmp);
}

static void test_scale_fill_copy(void **state) {
  (void)state;
  int64_t n = 40000;
  float *x = rand_buf(n, -3, 3), *y = zero_buf(n);
  double *ref = dzero(n);
  xm_k_scale(x, y, n, -0.375f);
  for (int64_t i = 0; i < n; i++)
    ref[i] = -0.375 * x[i];
  expect_close("scale", y, ref, n, 1e-7);
  xm_k_fill(y, n, 2.5f);
  for (int64_t i = 0; i < n; i++)
    ref[i] = 2.5;
  expect_close("fill", y, ref, n, 0.0);
  xm_k_copy(x, y, 13);
  for (int64_t i = 0; i < 13; i++)
    ref[i] = x[i];
  expect_close("copy", y, ref, n, 0.0); /* the tail keeps 2.5 */
  free(x), free(y), free(ref);
}

/* ---- activations -------------------------------------------------------------- */

typedef struct {
  float *x;
  int64_t n;
  int kind;
} act_ctx_t;
enum { ACT_SILU, ACT_GELU, ACT_SIGMOID };
static void act_fwd(void *c, float *out) {
  act_ctx_t *a = c;
  if (a->kind == ACT_SILU)
    xm_k_silu(a->x, out, a->n);
  else if (a->kind == ACT_GELU)
    xm_k_gelu(a->x, out, a->n);
  else
    xm_k_sigmoid(a->x, out, a->n);
}

static double ref_act(int kind, double x) {
  double s = 1.0 / (1.0 + exp(-x));
  if (kind == ACT_SILU) return x * s;
  if (kind == ACT_SIGMOID) return s;
  return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

static void test_activations(void **state) {
  (void)state;
  const char *names[] = {"silu", "gelu", "sigmoid"};
  int64_t n = 257;
  for (int kind = 0; kind < 3; kind++) {
    float *x = rand_buf(n, -6, 6), *y = zero_buf(n), *dy = rand_buf(n, -1, 1), *dx = zero_buf(n);
    x[0] = -90.0f, x[1] = 90.0f, x[2] = 0.0f; /* saturated tails stay finite */
    double *ref = dzero(n);
    act_ctx_t c = {x, n, kind};
    act_fwd(&c, y);
    for (int64_t i = 0; i < n; i++)
      ref[i] = ref_act(kind, x[i]);
    expect_close(names[kind], y, ref, n, 2e-6);
    if (kind == ACT_SILU)
      xm_k_silu_grad(dy, x, dx, n);
    else if (kind == ACT_GELU)
      xm_k_gelu_grad(dy, x, dx, n);
    else
      xm_k_sigmoid_grad(dy, y, dx, n);
    for (int64_t i = 0; i < n; i++)
      assert_true(isfinite(dx[i]));
    check_grad(names[kind], act_fwd, &c, x, n, dy, n, dx, n);
    free(x), free(y), free(dy), free(dx), free(ref);
  }
}

typedef struct {
  float *g, *u;
  int64_t n;
} sw_ctx_t;
static void sw_fwd(void *c, float *out) {
  sw_ctx_t *s = c;
  xm_k_swiglu(s->g, s->u, out, s->n);
}

static void test_swiglu(void **state) {
  (void)state;
  int64_t n = 131;
  float *g = rand_buf(n, -5, 5), *u = rand_buf(n, -2, 2), *y = zero_buf(n);
  float *dy = rand_buf(n, -1, 1), *dg = zero_buf(n), *du = zero_buf(n);
  double *ref = dzero(n);
  xm_k_swiglu(g, u, y, n);
  for (int64_t i = 0; i < n; i++)
    ref[i] = ref_act(ACT_SILU, g[i]) * u[i];
  expect_close("swiglu", y, ref, n, 2e-6);
  xm_k_swiglu_grad(dy, g, u, dg, du, n);
  sw_ctx_t c = {g, u, n};
  check_grad("swiglu dg", sw_fwd, &c, g, n, dy, n, dg, n);
  check_grad("swiglu du", sw_fwd, &c, u, n, dy, n, du, n);
  free(g), free(u), free(y), free(dy), free(dg), free(du), free(ref);
}

/* ---- RMSNorm -------------------------------------------------------------------- */

typedef struct {
  float *x, *w;
  int64_t rows, H;
  float eps;
} rn_ctx_t;
static void rn_fwd(void *c, float *out) {
  rn_ctx_t *r = c;
  xm_k_rmsnorm(r->x, r->w, out, r->rows, r->H, r->eps);
}

static void rmsnorm_case(int64_t rows, int64_t H, int64_t max_checks) {
  float eps = 1e-6f;
  float *x = rand_buf(rows * H, -2, 2), *w = rand_buf(H, 0.5f, 1.5f), *y = zero_buf(rows * H);
  float *dy = rand_buf(rows * H, -1, 1), *dx = zero_buf(rows * H), *dw = rand_buf(H, 5, 6);
  double *ref = dzero(rows * H);
  xm_k_rmsnorm(x, w, y, rows, H, eps);
  for (int64_t r = 0; r < rows; r++) {
    double ss = 0;
    for (int64_t j = 0; j < H; j++)
      ss += (double)x[r * H + j] * x[r * H + j];
    double inv = 1.0 / sqrt(ss / H + eps);
    for (int64_t j = 0; j < H; j++)
      ref[r * H + j] = x[r * H + j] * inv * w[j];
  }
  expect_close("rmsnorm", y, ref, rows * H, 1e-5);
  /* dw starts dirty (rand_buf above): the kernel must overwrite it */
  float *ws = ws_buf(xm_ws_rmsnorm_grad(rows, H));
  xm_k_rmsnorm_grad(dy, x, w, dx, dw, rows, H, eps, ws);
  rn_ctx_t c = {x, w, rows, H, eps};
  check_grad("rmsnorm dx", rn_fwd, &c, x, rows * H, dy, rows * H, dx, max_checks);
  check_grad("rmsnorm dw", rn_fwd, &c, w, H, dy, rows * H, dw, max_checks);
  free(x), free(w), free(y), free(dy), free(dx), free(dw), free(ref), free(ws);
}

static void test_rmsnorm(void **state) {
  (void)state;
  rmsnorm_case(3, 7, 1000);
  rmsnorm_case(1, 1, 10);
  rmsnorm_case(301, 131, 60); /* OpenMP path, sampled */
}

/* ---- RoPE ------------------------------------------------------------------------ */

typedef struct {
  float *x;
  int64_t B, S, nh, D, off, rd;
  float theta, factor, lo, hi, mscale;
  int interleave;
  float *ws;
} rope_ctx_t;
static void rope_fwd(void *c, float *out) {
  rope_ctx_t *r = c;
  xm_k_rope(r->x, out, r->B, r->S, r->nh, r->D, r->off, r->rd, r->theta, r->factor, r->lo, r->hi,
            r->mscale, r->interleave, r->ws);
}

/* Plain RoPE: f = 1, the whole row, halves layout. */
#define PLAIN(D) 0, (D), theta, 1.0f, 0.0f, 0.0f, 1.0f, 0

static void test_rope(void **state) {
  (void)state;
  int64_t B = 2, S = 9, nh = 3, D = 8, n = B * S * nh * D;
  float theta = 10000.0f;
  float *x = rand_buf(n, -1, 1), *y = zero_buf(n), *back = zero_buf(n);
  float *dy = rand_buf(n, -1, 1), *dx = zero_buf(n);
  double *ref = dzero(n);
  for (int64_t b = 0; b < B; b++)
    for (int64_t s = 0; s < S; s++)
      for (int64_t h = 0; h < nh; h++)
        for (int64_t i = 0; i < D / 2; i++) {
          int64_t o = ((b * S + s) * nh + h) * D;
          double a = s * pow(theta, -2.0 * i / D);
          double x1 = x[o + i], x2 = x[o + i + D / 2];
          ref[o + i] = x1 * cos(a) - x2 * sin(a);
          ref[o + i + D / 2] = x2 * cos(a) + x1 * sin(a);
        }
  float *ws = ws_buf(xm_ws_rope(S, D));
  xm_k_rope(x, y, B, S, nh, D, PLAIN(D), ws);
  expect_close("rope", y, ref, n, 1e-6);
  /* position 0 is the identity */
  for (int64_t d = 0; d < D; d++)
    assert_true(y[d] == x[d]);
  /* the gradient is the inverse rotation: rope_grad(rope(x)) == x */
  xm_k_rope_grad(y, back, B, S, nh, D, PLAIN(D), ws);
  for (int64_t i = 0; i < n; i++)
    ref[i] = x[i];
  expect_close("rope_grad(rope)", back, ref, n, 1e-6);
  xm_k_rope_grad(dy, dx, B, S, nh, D, PLAIN(D), ws);
  rope_ctx_t c = {x, B, S, nh, D, 0, D, theta, 1.0f, 0.0f, 0.0f, 1.0f, 0, ws};
  check_grad("rope dx", rope_fwd, &c, x, n, dy, n, dx, n);
  free(x), free(y), free(back), free(dy), free(dx), free(ref), free(ws);
}

/* MLA's RoPE (transformers' DeepseekV3Attention): only the last rd elements
 * of a row [nope | rope] turn, the pairs read interleaved (2i, 2i+1) and
 * written as halves, with YaRN's blended frequencies and the factor on cos
 * and sin. The reference follows transformers' steps literally: the
 * permutation of apply_rotary_pos_emb_interleave, then rotate_half. */
static void test_rope_mla(void **state) {
  (void)state;
  int64_t B = 2, S = 7, nh = 3, off = 6, rd = 8, D = off + rd + 2, n = B * S * nh * D;
  float theta = 10000.0f, factor = 40.0f, lo = 1.0f, hi = 3.0f, mscale = 1.25f;
  float *x = rand_buf(n, -1, 1), *y = zero_buf(n), *dy = rand_buf(n, -1, 1), *dx = zero_buf(n);
  double *ref = dzero(n);
  int64_t half = rd / 2;
  for (int64_t row = 0; row < B * S * nh; row++) {
    int64_t s = (row / nh) % S;
    const float *xr = x + row * D;
    double *rr = ref + row * D;
    double perm[64];
    for (int64_t j = 0; j < half; j++) { /* view(d/2, 2).transpose: evens, then odds */
      perm[j] = xr[off + 2 * j];
      perm[half + j] = xr[off + 2 * j + 1];
    }
    for (int64_t d = 0; d < D; d++)
      rr[d] = xr[d];
    for (int64_t j = 0; j < rd; j++) {
      int64_t i = j % half;
      double f = pow(theta, -2.0 * i / rd), ramp = (i - lo) / (hi - lo);
      ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
      double inv = f / factor * ramp + f * (1 - ramp), a = s * inv;
      double rot = j < half ? -perm[j + half] : perm[j - half];
      rr[off + j] = perm[j] * cos(a) * mscale + rot * sin(a) * mscale;
    }
  }
  float *ws = ws_buf(xm_ws_rope(S, rd));
  xm_k_rope(x, y, B, S, nh, D, off, rd, theta, factor, lo, hi, mscale, 1, ws);
  expect_close("rope mla", y, ref, n, 1e-6);
  xm_k_rope_grad(dy, dx, B, S, nh, D, off, rd, theta, factor, lo, hi, mscale, 1, ws);
  rope_ctx_t c = {x, B, S, nh, D, off, rd, theta, factor, lo, hi, mscale, 1, ws};
  check_grad("rope mla dx", rope_fwd, &c, x, n, dy, n, dx, n);
  /* the halves layout with the same span and schedule */
  xm_k_rope_grad(dy, dx, B, S, nh, D, off, rd, theta, factor, lo, hi, mscale, 0, ws);
  c.interleave = 0;
  check_grad("rope span dx", rope_fwd, &c, x, n, dy, n, dx, n);
  free(x), free(y), free(dy), free(dx), free(ref), free(ws);
}

/* ---- concat / split --------------------------------------------------------------- */

typedef struct {
  const float *a, *b;
  int64_t R, H, Hb, Da, Db;
} concat_ctx_t;
static void concat_fwd_a(void *c, float *out) {
  concat_ctx_t *k = c;
  xm_k_concat(k->a, k->b, out, k->R, k->H, k->Hb, k->Da, k->Db);
}

/* concat against its definition, split as its exact adjoint (the head sum
 * of a broadcast part included): <concat(a, b), dy> = <a, da> + <b, db>. */
static void concat_case(int64_t R, int64_t H, int64_t Hb, int64_t Da, int64_t Db) {
  int64_t D = Da + Db, na = R * H * Da, nb = R * Hb * Db, ny = R * H * D;
  float *a = rand_buf(na, -1, 1), *b = rand_buf(nb, -1, 1), *y = zero_buf(ny);
  float *dy = rand_buf(ny, -1, 1), *da = zero_buf(na), *db = zero_buf(nb);
  xm_k_concat(a, b, y, R, H, Hb, Da, Db);
  for (int64_t r = 0; r < R; r++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t d = 0; d < D; d++) {
        float want = d < Da ? a[(r * H + h) * Da + d] : b[(r * Hb + (Hb == 1 ? 0 : h)) * Db + d - Da];
        assert_true(y[(r * H + h) * D + d] == want);
      }
  xm_k_split(dy, da, db, R, H, Hb, Da, Db);
  double lhs = 0, rhs = 0;
  for (int64_t i = 0; i < ny; i++)
    lhs += (double)y[i] * dy[i];
  for (int64_t i = 0; i < na; i++)
    rhs += (double)a[i] * da[i];
  for (int64_t i = 0; i < nb; i++)
    rhs += (double)b[i] * db[i];
  assert_true(fabs(lhs - rhs) <= 1e-5 * (1 + fabs(lhs)));
  concat_ctx_t c = {a, b, R, H, Hb, Da, Db};
  check_grad("concat da", concat_fwd_a, &c, a, na, dy, ny, da, na);
  free(a), free(b), free(y), free(dy), free(da), free(db);
}

static void test_concat_split(void **state) {
  (void)state;
  concat_case(3, 4, 4, 5, 3);  /* a split of equal heads */
  concat_case(3, 4, 1, 5, 3);  /* MLA's rotary key shared by the heads */
  concat_case(1, 1, 1, 1, 1);
  concat_case(40, 16, 1, 64, 32); /* OpenMP path */
}

/* Far positions: the kernel's cos/sin table walks from anchor positions by
 * angle addition; every position up to 5000 must match direct cos/sin. */
static void test_rope_long(void **state) {
  (void)state;
  int64_t S = 5000, D = 16, n = S * D;
  float theta = 500000.0f;
  float *x = rand_buf(n, -1, 1), *y = zero_buf(n);
  double *ref = dzero(n);
  for (int64_t s = 0; s < S; s++)
    for (int64_t i = 0; i < D / 2; i++) {
      double a = s * pow(theta, -2.0 * i / D), x1 = x[s * D + i], x2 = x[s * D + i + D / 2];
      ref[s * D + i] = x1 * cos(a) - x2 * sin(a);
      ref[s * D + i + D / 2] = x2 * cos(a) + x1 * sin(a);
    }
  float *ws = ws_buf(xm_ws_rope(S, D));
  xm_k_rope(x, y, 1, S, 1, D, PLAIN(D), ws);
  expect_close("rope far", y, ref, n, 1e-6);
  free(x), free(y), free(ref), free(ws);
}

/* ---- attention -------------------------------------------------------------------- */

typedef struct {
  float *q, *k, *v;
  int64_t B, S, Hq, Hkv, D, Dv;
  float scale;
  float *ws;
} at_ctx_t;
static void at_fwd(void *c, float *out) {
  at_ctx_t *a = c;
  xm_k_attention(a->q, a->k, a->v, out, a->B, a->S, a->Hq, a->Hkv, a->D, a->Dv, a->scale, a->ws);
}

static void ref_attention(const at_ctx_t *a, double *out) {
  int64_t S = a->S, D = a->D, Dv = a->Dv;
  double *p = dzero(S);
  for (int64_t b = 0; b < a->B; b++)
    for (int64_t h = 0; h < a->Hq; h++) {
      int64_t hk = h / (a->Hq / a->Hkv);
      for (int64_t i = 0; i < S; i++) {
        double m = -INFINITY, sum = 0;
        for (int64_t j = 0; j <= i; j++) {
          double s = 0;
          for (int64_t d = 0; d < D; d++)
            s += (double)a->q[((b * S + i) * a->Hq + h) * D + d] *
                 a->k[((b * S + j) * a->Hkv + hk) * D + d];
          p[j] = s * a->scale;
          m = fmax(m, p[j]);
        }
        for (int64_t j = 0; j <= i; j++)
          sum += (p[j] = exp(p[j] - m));
        for (int64_t d = 0; d < Dv; d++) {
          double o = 0;
          for (int64_t j = 0; j <= i; j++)
            o += p[j] / sum * a->v[((b * S + j) * a->Hkv + hk) * Dv + d];
          out[((b * S + i) * a->Hq + h) * Dv + d] = o;
        }
      }
    }
  free(p);
}

static void attention_case(int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t D, int64_t Dv,
                           float qscale, int64_t max_checks) {
  int64_t nq = B * S * Hq * D, nk = B * S * Hkv * D, nv = B * S * Hkv * Dv;
  int64_t no = B * S * Hq * Dv;
  at_ctx_t c = {
      rand_buf(nq, -qscale, qscale), rand_buf(nk, -1, 1), rand_buf(nv, -1, 1), B, S, Hq, Hkv, D, Dv,
      1.0f / sqrtf((float)D), ws_buf(xm_ws_attention(B, S, Hq))};
  float *gws = ws_buf(xm_ws_attention_grad(B, S, Hkv));
  float *out = zero_buf(no), *dout = rand_buf(no, -1, 1);
  /* dirty outputs: the kernel must overwrite, not accumulate */
  float *dq = rand_buf(nq, 3, 4), *dk = rand_buf(nk, 3, 4), *dv = rand_buf(nv, 3, 4);
  double *ref = dzero(no);
  at_fwd(&c, out);
  ref_attention(&c, ref);
  expect_close("attention", out, ref, no, 2e-5);
  /* causality: row 0 of every head is exactly its value row 0 */
  for (int64_t h = 0; h < Hq; h++)
    for (int64_t d = 0; d < Dv; d++)
      assert_float_equal(out[h * Dv + d], c.v[(h / (Hq / Hkv)) * Dv + d], 1e-6);
  xm_k_attention_grad(dout, c.q, c.k, c.v, dq, dk, dv, B, S, Hq, Hkv, D, Dv, c.scale, gws);
  check_grad("attention dq", at_fwd, &c, c.q, nq, dout, no, dq, max_checks);
  check_grad("attention dk", at_fwd, &c, c.k, nk, dout, no, dk, max_checks);
  check_grad("attention dv", at_fwd, &c, c.v, nv, dout, no, dv, max_checks);
  free(c.q), free(c.k), free(c.v), free(out), free(dout), free(dq), free(dk), free(dv);
  free(ref), free(c.ws), free(gws);
}

static void test_attention(void **state) {
  (void)state;
  attention_case(2, 5, 4, 2, 8, 8, 1.0f, 1000); /* GQA, every element */
  attention_case(1, 7, 3, 3, 8, 5, 2.0f, 1000); /* MHA, Dv != D, peakier softmax */
  attention_case(1, 3, 4, 1, 6, 6, 1.0f, 1000); /* MQA */
  attention_case(2, 64, 4, 2, 8, 8, 1.0f, 150); /* OpenMP path, sampled */
  /* several row tiles with a ragged last one, and GEMMs large enough to be
   * cut into single-threaded pieces (along N and along K) */
  attention_case(1, 150, 4, 2, 64, 48, 2.0f, 100);
}

/* ---- embedding ---------------------------------------------------------------------- */

typedef struct {
  const int32_t *tok;
  float *table;
  int64_t n, H;
} em_ctx_t;
static void em_fwd(void *c, float *out) {
  em_ctx_t *e = c;
  xm_k_embedding(e->tok, e->table, out, e->n, e->H);
}

static void test_embedding(void **state) {
  (void)state;
  int64_t V = 6, H = 5, n = 9;
  const int32_t tok[] = {3, 0, 5, 3, 3, 1, 0, 5, 2}; /* repeats; id 4 unused */
  float *table = rand_buf(V * H, -1, 1), *y = zero_buf(n * H), *dy = rand_buf(n * H, -1, 1);
  float *dt = rand_buf(V * H, 7, 8);
  double *ref = dzero(n * H), *rdt = dzero(V * H);
  xm_k_embedding(tok, table, y, n, H);
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < H; j++)
      ref[i * H + j] = table[tok[i] * H + j];
  expect_close("embedding", y, ref, n * H, 0.0);
  xm_k_embedding_grad(dy, tok, dt, n, V, H);
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < H; j++)
      rdt[tok[i] * H + j] += dy[i * H + j];
  expect_close("embedding_grad", dt, rdt, V * H, 1e-6); /* row 4 must be zeroed */
  em_ctx_t c = {tok, table, n, H};
  check_grad("embedding dtable", em_fwd, &c, table, V * H, dy, n * H, dt, V * H);
  free(table), free(y), free(dy), free(dt), free(ref), free(rdt);
}

/* ---- cross-entropy -------------------------------------------------------------------- */

typedef struct {
  float *logits;
  const int32_t *labels;
  int64_t rows, V;
} ce_ctx_t;
static void ce_fwd(void *c, float *out) {
  ce_ctx_t *e = c;
  xm_k_cross_entropy(e->logits, e->labels, out, e->rows, e->V);
}

static double ref_ce(const float *l, const int32_t *lab, int64_t rows, int64_t V) {
  double total = 0;
  for (int64_t r = 0; r < rows; r++) {
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < V; j++)
      m = fmax(m, l[r * V + j]);
    for (int64_t j = 0; j < V; j++)
      s += exp(l[r * V + j] - m);
    total += m + log(s) - l[r * V + lab[r]];
  }
  return total / rows;
}

static void test_cross_entropy(void **state) {
  (void)state;
  int64_t rows = 15, V = 7;
  int32_t lab[15];
  for (int64_t r = 0; r < rows; r++)
    lab[r] = (int32_t)((r * 3) % V); /* every class, twice+ */
  float *l = rand_buf(rows * V, -4, 4), *dl = rand_buf(rows * V, 9, 10), loss = 0;
  xm_k_cross_entropy(l, lab, &loss, rows, V);
  double want = ref_ce(l, lab, rows, V);
  assert_true(fabs(loss - want) <= 1e-5 * (1 + want));
  float dloss = 0.7f;
  xm_k_cross_entropy_grad(&dloss, l, lab, dl, rows, V);
  /* each row of dlogits sums to zero (softmax minus one-hot) */
  for (int64_t r = 0; r < rows; r++) {
    double s = 0;
    for (int64_t j = 0; j < V; j++)
      s += dl[r * V + j];
    assert_true(fabs(s) < 1e-6);
  }
  ce_ctx_t c = {l, lab, rows, V};
  check_grad("cross_entropy dlogits", ce_fwd, &c, l, rows * V, &dloss, 1, dl, rows * V);

  /* stability: logits in the thousands (a naive exp overflows) */
  for (int64_t i = 0; i < rows * V; i++)
    l[i] = l[i] * 500.0f + 3000.0f;
  xm_k_cross_entropy(l, lab, &loss, rows, V);
  want = ref_ce(l, lab, rows, V);
  assert_true(isfinite(loss));
  assert_true(fabs(loss - want) <= 1e-5 * (1 + want));
  xm_k_cross_entropy_grad(&dloss, l, lab, dl, rows, V);
  for (int64_t i = 0; i < rows * V; i++)
    assert_true(isfinite(dl[i]));
  free(l), free(dl);
}

static void test_cross_entropy_large_vocab(void **state) {
  (void)state;
  /* OpenMP path; uniform logits give exactly log(V) */
  int64_t rows = 5, V = 50257;
  int32_t lab[5] = {0, 1, 50256, 777, 25000};
  float *l = zero_buf(rows * V), loss = 0;
  xm_k_fill(l, rows * V, 1.25f);
  xm_k_cross_entropy(l, lab, &loss, rows, V);
  assert_float_equal(loss, log((double)V), 1e-5);
  free(l);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matmul),
      cmocka_unit_test(test_broadcast_and_reduce),
      cmocka_unit_test(test_scale_fill_copy),
      cmocka_unit_test(test_activations),
      cmocka_unit_test(test_swiglu),
      cmocka_unit_test(test_rmsnorm),
      cmocka_unit_test(test_rope),
      cmocka_unit_test(test_rope_long),
      cmocka_unit_test(test_rope_mla),
      cmocka_unit_test(test_concat_split),
      cmocka_unit_test(test_attention),
      cmocka_unit_test(test_embedding),
      cmocka_unit_test(test_cross_entropy),
      cmocka_unit_test(test_cross_entropy_large_vocab),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
