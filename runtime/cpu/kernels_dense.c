/* runtime/cpu/kernels_dense.c — the dense CPU kernels: GEMMs, elementwise ops,
 * activations, RMSNorm, embedding and cross-entropy (forward and backward).
 *
 * These are the numerical reference of xmoec: every other backend is
 * compared against them, so they favour accuracy where it is cheap. GEMMs
 * go to CBLAS (OpenBLAS; see docs/benchmarks.md for the choice of kernel
 * core). out/train runs OpenBLAS single-threaded and the GEMMs here cut
 * themselves into row (or column) slices over the OpenMP team, so that one
 * thread pool owns the cores (docs/benchmarks.md, "Training step
 * profile"); when OpenBLAS has threads of its own (a test harness, an
 * embedding program), each GEMM is one call and OpenBLAS threads it.
 * Everything else is loops marked `simd` (at -O2 GCC vectorises no other)
 * or written on 4-float vectors, split over OpenMP threads only when a
 * call moves enough elements: tiny calls (the tests, small models) would
 * spend more on waking the thread team than on the work. Reductions that
 * sum many terms (row statistics, column sums over the batch, the loss)
 * accumulate in double so that the result does not depend on the thread
 * count beyond rounding of the final value.
 *
 * Column sums (reduce_to, the RMSNorm weight gradient) are computed by
 * column blocks: each thread owns a block of columns and walks all rows, so
 * no thread writes another's output and no atomics or per-thread copies of
 * the result are needed; row sums (reduce_rows) by rows, for the same
 * reason. The attention and RoPE kernels live in
 * runtime/cpu/kernels_attn.c.
 */
#include "runtime/cpu/kernels.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/abi/bf16.h"
#include "support/status.h"

/* `omp simd` asks for vectorisation; where the compiler cannot give it
 * (Clang with sanitizers), the scalar loop is just as right, so that is
 * not an error. */
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

/* Below this many elements a kernel stays on the calling thread: waking
 * the OpenMP team costs some microseconds, as much as a vectorised pass
 * over ~10^5 floats; heavy kernels (an exp per element, or RMSNorm's
 * several passes in double) pay sooner. */
#define XM_K_PAR_MIN ((int64_t)1 << 17)
#define XM_K_PAR_MIN_HEAVY ((int64_t)1 << 14)
/* Elements per chunk of the flat elementwise loops. */
#define XM_K_CHUNK 4096
/* Columns per block of the column sums: a block is one thread's work, so
 * it is narrow enough that a hidden size of a few hundred still gives
 * every thread some; its doubles stay in L1. */
#define XM_K_COL_BLOCK 64
/* Below this many multiply-adds a GEMM stays on the calling thread. */
#define XM_K_GEMM_PAR_MIN ((int64_t)1 << 18)

/* ---- GEMMs ------------------------------------------------------------- */

/* OpenBLAS 0.3.21 in Debian is built with 32-bit blasint. The planner keeps
 * every per-rank GEMM dimension far below 2^31, so a larger one is a bug. */
static int blas_dim(int64_t d) {
  XM_ASSERT(d >= 0 && d <= INT_MAX);
  return (int)d;
}

/* Threads to split one GEMM over: the OpenMP team when OpenBLAS itself runs
 * single-threaded (out/train sets it so), the call is not already inside a
 * team and the GEMM is big enough to pay for waking the team. */
static int gemm_threads(int64_t M, int64_t N, int64_t K) {
  if (M * N * K < XM_K_GEMM_PAR_MIN || omp_in_parallel() || openblas_get_num_threads() > 1)
    return 1;
  return omp_get_max_threads();
}

/* C[M,N] = alpha op(A) op(B) + beta C, row-major, cut into equal slices
 * of M (or of N when N is the longer side) over the OpenMP team, each
 * slice one single-threaded cblas_sgemm. Slice edges are multiples of 16,
 * the register-tile height of the sgemm kernels, so no slice ends in a
 * ragged tile that a single call would not have had. */
static void gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                 int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  int nt = gemm_threads(M, N, K);
  int split_m = M >= N;
  int64_t len = split_m ? M : N, units = (len + 15) / 16;
  if (nt > units) nt = (int)units;
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    int id = omp_get_thread_num(), n = omp_get_num_threads();
    int64_t u0 = units * id / n, u1 = units * (id + 1) / n;
    int64_t i0 = u0 * 16, i1 = u1 * 16 < len ? u1 * 16 : len;
    if (i1 > i0) {
      int64_t m = split_m ? i1 - i0 : M, nn = split_m ? N : i1 - i0;
      const float *a = A, *b = B;
      float *c = C;
      if (split_m) {
        a += ta ? i0 : i0 * lda;
        c += i0 * ldc;
      } else {
        b += tb ? i0 * ldb : i0;
        c += i0;
      }
      cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                  blas_dim(m), blas_dim(nn), blas_dim(K), alpha, a, blas_dim(lda), b, blas_dim(ldb),
                  beta, c, blas_dim(ldc));
    }
  }
}

void xm_k_matmul(const float *x, const float *w, float *y, int64_t M, int64_t K, int64_t N) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    xm_k_fill(y, M * N, 0.0f);
    return;
  }
  gemm(0, 1, M, N, K, 1.0f, x, K, w, K, 0.0f, y, N);
}

void xm_k_matmul_dx(const float *dy, const float *w, float *dx, int64_t M, int64_t K, int64_t N) {
  if (M == 0 || K == 0) return;
  if (N == 0) {
    xm_k_fill(dx, M * K, 0.0f);
    return;
  }
  gemm(0, 0, M, K, N, 1.0f, dy, N, w, K, 0.0f, dx, K);
}

void xm_k_matmul_dw(const float *dy, const float *x, float *dw, int64_t M, int64_t K, int64_t N) {
  if (N == 0 || K == 0) return;
  if (M == 0) { /* no rows this micro-batch: the gradient is zero, not stale */
    xm_k_fill(dw, N * K, 0.0f);
    return;
  }
  gemm(1, 0, N, K, M, 1.0f, dy, N, x, K, 0.0f, dw, K);
}

void xm_k_matmul_dw_acc(const float *dy, const float *x, float *dw, int64_t M, int64_t K,
                        int64_t N) {
  if (N == 0 || K == 0 || M == 0) return;
  gemm(1, 0, N, K, M, 1.0f, dy, N, x, K, 1.0f, dw, K);
}

/* ---- elementwise ------------------------------------------------------- */

/* The activation kernels are written on 4-float vectors (GCC/Clang vector
 * extensions: SSE2 on x86-64, NEON on ARM, no intrinsics): glibc's expf is
 * one call per element, and the compilers do not vectorise loops that call
 * it (nor, at -O2, most loops at all), so these kernels ran scalar. */
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));

static inline v4f ld4(const float *p) {
  v4f v;
  memcpy(&v, p, sizeof v);
  return v;
}

static inline void st4(float *p, v4f v) { memcpy(p, &v, sizeof v); }

/* m ? a : b per lane (m: all ones or all zeros) */
static inline v4f sel4(v4i m, v4f a, v4f b) { return (v4f)((m & (v4i)a) | (~m & (v4i)b)); }

/* e^x: Cody-Waite reduction x = k ln2 + r, the Cephes degree-6 polynomial
 * for e^r, and 2^k applied as two factors so that the result underflows
 * gradually and overflows to inf as expf does. Measured error <= 0.99 ulp
 * over every float in [-104, 88.7] (glibc expf: 0.5 ulp); NaN propagates. */
static inline v4f exp4(v4f x) {
  const v4f zero = {0.0f, 0.0f, 0.0f, 0.0f};
  v4f xc = sel4(x != x, zero, x); /* NaN would make the int conversion undefined */
  xc = sel4(xc < -104.0f, zero - 104.0f, xc);
  xc = sel4(xc > 88.75f, zero + 88.75f, xc);
  /* adding 1.5 * 2^23 rounds to an integer (round to nearest even) */
  v4f kf = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  v4f r = xc - kf * 0.693359375f;
  r = r - kf * -2.12194440e-4f;
  v4f p = zero + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  v4f y = p * (r * r) + r + 1.0f;
  v4i k = __builtin_convertvector(kf, v4i), k1 = k >> 1, k2 = k - k1;
  y = y * (v4f)((k1 + 127) << 23) * (v4f)((k2 + 127) << 23);
  return sel4(x != x, x, y);
}

/* 1/(1+e^-x) is stable in float: for very negative x the exponent
 * overflows to inf and the quotient is exactly 0, never NaN. */
static inline v4f sigmoid4(v4f x) { return 1.0f / (1.0f + exp4(-x)); }

/* One elementwise kernel call: up to three inputs, two outputs, a factor.
 * A span function handles [i0, i0 + n) with n a multiple of 4; for_spans
 * cuts [0, total) into spans, over the OpenMP team when total >= par_min,
 * and runs the last partial vector on zero-padded copies. Each vector is
 * loaded whole before its results are stored, so an output may be one of
 * the inputs (the planner may reuse a buffer in place). */
typedef struct {
  const float *in[3];
  float *out[2];
} ew_t;

typedef void (*ew_span_fn)(const ew_t *a, int64_t i0, int64_t n);

static void ew_tail(ew_span_fn fn, const ew_t *a, int64_t i0, int64_t m) {
  float buf[5][4] = {{0.0f}};
  ew_t t = {{NULL, NULL, NULL}, {NULL, NULL}};
  for (int k = 0; k < 3; k++)
    if (a->in[k]) {
      memcpy(buf[k], a->in[k] + i0, (size_t)m * sizeof(float));
      t.in[k] = buf[k];
    }
  for (int k = 0; k < 2; k++)
    if (a->out[k]) t.out[k] = buf[3 + k];
  fn(&t, 0, 4);
  for (int k = 0; k < 2; k++)
    if (a->out[k]) memcpy(a->out[k] + i0, buf[3 + k], (size_t)m * sizeof(float));
}

static void for_spans(ew_span_fn fn, const ew_t *a, int64_t total, int64_t par_min) {
  int64_t full = total / 4 * 4, chunks = (full + XM_K_CHUNK - 1) / XM_K_CHUNK;
#pragma omp parallel for if (total >= par_min) schedule(static)
  for (int64_t c = 0; c < chunks; c++) {
    int64_t i0 = c * XM_K_CHUNK;
    fn(a, i0, full - i0 < XM_K_CHUNK ? full - i0 : XM_K_CHUNK);
  }
  if (full < total) ew_tail(fn, a, full, total - full);
}

/* The broadcast operand repeats every nb elements; the result is walked in
 * rows of nb (no modulo in the inner loop) cut into chunks, so that one
 * long row (no broadcast, the common case) still splits over the threads. */
static void add_mul(const float *a, const float *b, float *y, int64_t na, int64_t nb, int mul) {
  if (na == 0 && nb == 0) return; /* no routed rows arrived on this rank */
  XM_ASSERT(nb > 0 && na % nb == 0);
  int64_t rows = na / nb, chunks = (nb + XM_K_CHUNK - 1) / XM_K_CHUNK;
#pragma omp parallel for collapse(2) if (na >= XM_K_PAR_MIN) schedule(static)
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < chunks; c++) {
      const float *ar = a + r * nb;
      float *yr = y + r * nb;
      int64_t j1 = (c + 1) * XM_K_CHUNK < nb ? (c + 1) * XM_K_CHUNK : nb;
      if (mul) {
#pragma omp simd
        for (int64_t j = c * XM_K_CHUNK; j < j1; j++)
          yr[j] = ar[j] * b[j];
      } else {
#pragma omp simd
        for (int64_t j = c * XM_K_CHUNK; j < j1; j++)
          yr[j] = ar[j] + b[j];
      }
    }
}

void xm_k_add(const float *a, const float *b, float *y, int64_t na, int64_t nb) {
  add_mul(a, b, y, na, nb, 0);
}

void xm_k_mul(const float *a, const float *b, float *y, int64_t na, int64_t nb) {
  add_mul(a, b, y, na, nb, 1);
}

void xm_k_mul_rows(const float *a, const float *b, float *y, int64_t rows, int64_t H) {
#pragma omp parallel for if (rows * H >= XM_K_PAR_MIN) schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    const float *ar = a + r * H;
    float *yr = y + r * H;
    const float f = b[r];
#pragma omp simd
    for (int64_t h = 0; h < H; h++)
      yr[h] = ar[h] * f;
  }
}

void xm_k_scale(const float *x, float *y, int64_t n, float factor) {
#pragma omp parallel for simd if (parallel : n >= XM_K_PAR_MIN) schedule(static)
  for (int64_t i = 0; i < n; i++)
    y[i] = x[i] * factor;
}

/* y[j] = sum_r x[r,j], accumulated in double per column block. */
static void column_sums(const float *x, float *y, int64_t rows, int64_t cols) {
  int64_t nblocks = (cols + XM_K_COL_BLOCK - 1) / XM_K_COL_BLOCK;
#pragma omp parallel for if (rows * cols >= XM_K_PAR_MIN) schedule(static)
  for (int64_t blk = 0; blk < nblocks; blk++) {
    int64_t j0 = blk * XM_K_COL_BLOCK;
    int64_t nj = cols - j0 < XM_K_COL_BLOCK ? cols - j0 : XM_K_COL_BLOCK;
    double acc[XM_K_COL_BLOCK];
    for (int64_t j = 0; j < nj; j++)
      acc[j] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
      const float *xr = x + r * cols + j0;
#pragma omp simd
      for (int64_t j = 0; j < nj; j++)
        acc[j] += (double)xr[j];
    }
    for (int64_t j = 0; j < nj; j++)
      y[j0 + j] = (float)acc[j];
  }
}

void xm_k_reduce_to(const float *x, float *y, int64_t nx, int64_t ny) {
  XM_ASSERT(ny > 0 && nx % ny == 0);
  column_sums(x, y, nx / ny, ny);
}

/* One row per thread at a time: each sum is a row's own, in order, so the
 * result does not depend on the thread count. */
void xm_k_reduce_rows(const float *x, float *y, int64_t rows, int64_t H) {
#pragma omp parallel for if (rows * H >= XM_K_PAR_MIN) schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * H;
    double acc = 0.0;
    for (int64_t h = 0; h < H; h++)
      acc += (double)xr[h];
    y[r] = (float)acc;
  }
}

void xm_k_fill(float *y, int64_t n, float value) {
#pragma omp parallel for simd if (parallel : n >= XM_K_PAR_MIN) schedule(static)
  for (int64_t i = 0; i < n; i++)
    y[i] = value;
}

void xm_k_copy(const float *x, float *y, int64_t n) {
  if (n > 0 && x != y) memmove(y, x, (size_t)n * sizeof *y);
}

void xm_k_concat(const float *a, const float *b, float *y, int64_t R, int64_t H, int64_t Hb,
                 int64_t Da, int64_t Db) {
  XM_ASSERT(Hb == H || Hb == 1);
  int64_t D = Da + Db;
#pragma omp parallel for if (R * H * D >= XM_K_PAR_MIN) schedule(static)
  for (int64_t rh = 0; rh < R * H; rh++) {
    int64_t r = rh / H, h = rh % H;
    float *yr = y + rh * D;
    const float *br = b + (r * Hb + (Hb == 1 ? 0 : h)) * Db;
    if (Da > 0) memcpy(yr, a + rh * Da, (size_t)Da * sizeof *yr);
    if (Db > 0) memcpy(yr + Da, br, (size_t)Db * sizeof *yr);
  }
}

void xm_k_split(const float *x, float *a, float *b, int64_t R, int64_t H, int64_t Hb, int64_t Da,
                int64_t Db) {
  XM_ASSERT(Hb == H || Hb == 1);
  int64_t D = Da + Db;
#pragma omp parallel for if (R * H * D >= XM_K_PAR_MIN) schedule(static)
  for (int64_t r = 0; r < R; r++) {
    for (int64_t h = 0; h < H; h++)
      if (Da > 0) memcpy(a + (r * H + h) * Da, x + (r * H + h) * D, (size_t)Da * sizeof *a);
    if (Hb == H) {
      for (int64_t h = 0; h < H; h++)
        if (Db > 0) memcpy(b + (r * H + h) * Db, x + (r * H + h) * D + Da, (size_t)Db * sizeof *b);
      continue;
    }
    for (int64_t j = 0; j < Db; j++) { /* the gradient of a broadcast: heads summed in order */
      double acc = 0;
      for (int64_t h = 0; h < H; h++)
        acc += (double)x[(r * H + h) * D + Da + j];
      b[r * Db + j] = (float)acc;
    }
  }
}

void xm_k_split_i32(const int32_t *x, int32_t *a, int32_t *b, int64_t R, int64_t Da, int64_t Db) {
  for (int64_t r = 0; r < R; r++) {
    if (Da > 0) memcpy(a + r * Da, x + r * (Da + Db), (size_t)Da * sizeof *a);
    if (Db > 0) memcpy(b + r * Db, x + r * (Da + Db) + Da, (size_t)Db * sizeof *b);
  }
}

/* ---- activations -------------------------------------------------------- */

/* The tanh form of GeLU, 0.5 v (1 + tanh(z)), equals v sigmoid(2z)
 * exactly, and 1 - tanh(z)^2 = 4 s (1 - s) with s = sigmoid(2z): no tanh
 * (which has no vector form here) and no cancellation near z = 0. */
#define XM_GELU_C 0.7978845608028654f /* sqrt(2/pi) */
#define XM_GELU_A 0.044715f

static void silu_span(const ew_t *a, int64_t i0, int64_t n) {
  for (int64_t i = i0; i < i0 + n; i += 4) {
    v4f x = ld4(a->in[0] + i);
    st4(a->out[0] + i, x * sigmoid4(x));
  }
}

static void silu_grad_span(const ew_t *a, int64_t i0, int64_t n) {
  for (int64_t i = i0; i < i0 + n; i += 4) {
    v4f dy = ld4(a->in[0] + i), x = ld4(a->in[1] + i), s = sigmoid4(x);
    st4(a->out[0] + i, dy * s * (1.0f + x * (1.0f - s)));
  }
}

static inline v4f gelu_s4(v4f v) {
  return sigmoid4((2.0f * XM_GELU_C) * (v + XM_GELU_A * v * v * v));
}

static void gelu_span(const ew_t *a, int64_t i0, int64_t n) {
  for (int64_t i = i0; i < i0 + n; i += 4) {
    v4f v = ld4(a->in[0] + i);
    st4(a->out[0] + i, v * gelu_s4(v));
  }
}

static void gelu_grad_span(const ew_t *a, int64_t i0, int64_t n) {
  for (int64_t i = i0; i < i0 + n; i += 4) {
    v4f dy = ld4(a->in[0] + i), v = ld4(a->in[1] + i), s = gelu_s4(v);
    v4f du = XM_GELU_C * (1.0f + (3.0f * XM_GELU_A) * v * v);
    st4(a->out[0] + i, dy * (s + 2.0f * v * s * (1.0f - s) * du));
  }
}

static void sigmoid_span(const ew_t *a, int64_t i0, int64_t n) {
  for (int64_t i = i0; i < i0 + n; i += 4)
    st4(a->out[0] + i, sigmoid4(ld4(a->in[0] + i)));
}

static void swiglu_span(const ew_t *a, int64_t i0, int64_t n) {
  for (int64_t i = i0; i < i0 + n; i += 4) {
    v4f g = ld4(a->in[0] + i), u = ld4(a->in[1] + i);
    st4(a->out[0] + i, g * sigmoid4(g) * u);
  }
}

/* du may reuse u's buffer: both vectors are loaded before either store. */
static void swiglu_grad_span(const ew_t *a, int64_t i0, int64_t n) {
  for (int64_t i = i0; i < i0 + n; i += 4) {
    v4f dy = ld4(a->in[0] + i), g = ld4(a->in[1] + i), u = ld4(a->in[2] + i);
    v4f s = sigmoid4(g);
    st4(a->out[1] + i, dy * (g * s));
    st4(a->out[0] + i, dy * u * s * (1.0f + g * (1.0f - s)));
  }
}

void xm_k_silu(const float *x, float *y, int64_t n) {
  ew_t a = {{x, NULL, NULL}, {y, NULL}};
  for_spans(silu_span, &a, n, XM_K_PAR_MIN_HEAVY);
}

void xm_k_silu_grad(const float *dy, const float *x, float *dx, int64_t n) {
  ew_t a = {{dy, x, NULL}, {dx, NULL}};
  for_spans(silu_grad_span, &a, n, XM_K_PAR_MIN_HEAVY);
}

void xm_k_gelu(const float *x, float *y, int64_t n) {
  ew_t a = {{x, NULL, NULL}, {y, NULL}};
  for_spans(gelu_span, &a, n, XM_K_PAR_MIN_HEAVY);
}

void xm_k_gelu_grad(const float *dy, const float *x, float *dx, int64_t n) {
  ew_t a = {{dy, x, NULL}, {dx, NULL}};
  for_spans(gelu_grad_span, &a, n, XM_K_PAR_MIN_HEAVY);
}

void xm_k_sigmoid(const float *x, float *y, int64_t n) {
  ew_t a = {{x, NULL, NULL}, {y, NULL}};
  for_spans(sigmoid_span, &a, n, XM_K_PAR_MIN_HEAVY);
}

void xm_k_sigmoid_grad(const float *dy, const float *y, float *dx, int64_t n) {
#pragma omp parallel for simd if (parallel : n >= XM_K_PAR_MIN) schedule(static)
  for (int64_t i = 0; i < n; i++)
    dx[i] = dy[i] * y[i] * (1.0f - y[i]);
}

void xm_k_swiglu(const float *g, const float *u, float *y, int64_t n) {
  ew_t a = {{g, u, NULL}, {y, NULL}};
  for_spans(swiglu_span, &a, n, XM_K_PAR_MIN_HEAVY);
}

void xm_k_swiglu_grad(const float *dy, const float *g, const float *u, float *dg, float *du,
                      int64_t n) {
  ew_t a = {{dy, g, u}, {dg, du}};
  for_spans(swiglu_grad_span, &a, n, XM_K_PAR_MIN_HEAVY);
}

/* ---- RMSNorm ------------------------------------------------------------ */

/* 1/sqrt(mean(x^2) + eps) of one row, the mean taken in double: H can be
 * several thousand and the squares span many orders of magnitude. */
static float rms_inv(const float *xr, int64_t H, float eps) {
  double ss = 0.0;
#pragma omp simd reduction(+ : ss)
  for (int64_t j = 0; j < H; j++)
    ss += (double)xr[j] * (double)xr[j];
  return (float)(1.0 / sqrt(ss / (double)H + (double)eps));
}

void xm_k_rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t H, float eps) {
#pragma omp parallel for if (rows * H >= XM_K_PAR_MIN_HEAVY) schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * H;
    float *yr = y + r * H;
    float inv = rms_inv(xr, H, eps);
#pragma omp simd
    for (int64_t j = 0; j < H; j++)
      yr[j] = xr[j] * inv * w[j];
  }
}

/* With n = x * inv: dx = inv * (w*dy - x * inv^2 * mean(w*dy*x)); the
 * weight gradient is sum over rows of dy * n, a column sum weighted by each
 * row's inv, done after dx so that it can reuse the row factors. dx may not
 * alias x (the second pass reads x again). The row factors wait for that
 * pass in ws (xm_ws_rmsnorm_grad bytes, runtime/abi/workspace.h). */
void xm_k_rmsnorm_grad(const float *dy, const float *x, const float *w, float *dx, float *dw,
                       int64_t rows, int64_t H, float eps, float *ws) {
  if (rows <= 0 || H <= 0) {
    if (H > 0) xm_k_fill(dw, H, 0.0f);
    return;
  }
  XM_ASSERT(ws != NULL);
  float *inv = ws;
#pragma omp parallel for if (rows * H >= XM_K_PAR_MIN_HEAVY) schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * H, *dyr = dy + r * H;
    float *dxr = dx + r * H;
    float iv = rms_inv(xr, H, eps);
    inv[r] = iv;
    double dot = 0.0;
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j < H; j++)
      dot += (double)dyr[j] * (double)w[j] * (double)xr[j];
    float c = (float)(dot / (double)H) * iv * iv;
#pragma omp simd
    for (int64_t j = 0; j < H; j++)
      dxr[j] = iv * (w[j] * dyr[j] - xr[j] * c);
  }
  /* dw[j] = sum_r dy[r,j] * x[r,j] * inv[r]: column sums of dy*x need the
   * product per element, so walk column blocks directly. */
  int64_t nblocks = (H + XM_K_COL_BLOCK - 1) / XM_K_COL_BLOCK;
#pragma omp parallel for if (rows * H >= XM_K_PAR_MIN_HEAVY) schedule(static)
  for (int64_t blk = 0; blk < nblocks; blk++) {
    int64_t j0 = blk * XM_K_COL_BLOCK;
    int64_t nj = H - j0 < XM_K_COL_BLOCK ? H - j0 : XM_K_COL_BLOCK;
    double acc[XM_K_COL_BLOCK];
    for (int64_t j = 0; j < nj; j++)
      acc[j] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
      const float *xr = x + r * H + j0, *dyr = dy + r * H + j0;
      float iv = inv[r];
#pragma omp simd
      for (int64_t j = 0; j < nj; j++)
        acc[j] += (double)(dyr[j] * xr[j] * iv);
    }
    for (int64_t j = 0; j < nj; j++)
      dw[j0 + j] = (float)acc[j];
  }
}

/* ---- embedding ------------------------------------------------------------ */

/* Ids are validated by the data loader (the forward kernel does not know V,
 * so only a negative id can be caught here: it yields a zero row; the
 * gradient skips any id outside [0, V)). */
void xm_k_embedding(const int32_t *tok, const float *table, float *y, int64_t n_tok, int64_t H) {
#pragma omp parallel for if (n_tok * H >= XM_K_PAR_MIN) schedule(static)
  for (int64_t i = 0; i < n_tok; i++) {
    if (tok[i] < 0) {
      memset(y + i * H, 0, (size_t)H * sizeof *y);
      continue;
    }
    memcpy(y + i * H, table + (int64_t)tok[i] * H, (size_t)H * sizeof *y);
  }
}

/* Rows with the same id must be summed, so threads split the hidden
 * dimension rather than the tokens: each owns a column block of dtable. */
void xm_k_embedding_grad(const float *dy, const int32_t *tok, float *dtable, int64_t n_tok,
                         int64_t V, int64_t H) {
  xm_k_fill(dtable, V * H, 0.0f);
  int64_t nblocks = (H + XM_K_COL_BLOCK - 1) / XM_K_COL_BLOCK;
#pragma omp parallel for if (n_tok * H >= XM_K_PAR_MIN) schedule(static)
  for (int64_t blk = 0; blk < nblocks; blk++) {
    int64_t j0 = blk * XM_K_COL_BLOCK;
    int64_t nj = H - j0 < XM_K_COL_BLOCK ? H - j0 : XM_K_COL_BLOCK;
    for (int64_t i = 0; i < n_tok; i++) {
      int32_t t = tok[i];
      if (t < 0 || t >= V) continue;
      float *dst = dtable + (int64_t)t * H + j0;
      const float *src = dy + i * H + j0;
      for (int64_t j = 0; j < nj; j++)
        dst[j] += src[j];
    }
  }
}

/* ---- cross-entropy ---------------------------------------------------------- */

/* e^x of one float through the vector form, so that a row's odd elements
 * get the same function as the others. */
static inline float exp1(float x) {
  v4f v = {x, x, x, x};
  return exp4(v)[0];
}

/* The stable log-sum-exp of one row: max and sum(exp(l - max)). Each term
 * lies in (0, 1] and is exact to an ulp in float; the sum of up to 10^5
 * terms is what loses precision, so it is kept in double. */
static void row_lse(const float *lr, int64_t V, float *out_max, double *out_sum) {
  v4f m4 = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
  int64_t j = 0;
  for (; j + 4 <= V; j += 4) {
    v4f l = ld4(lr + j);
    m4 = sel4(l > m4, l, m4);
  }
  float m = m4[0];
  for (int k = 1; k < 4; k++)
    m = m4[k] > m ? m4[k] : m;
  for (; j < V; j++)
    m = lr[j] > m ? lr[j] : m;
  double s = 0.0;
  j = 0;
  for (; j + 4 <= V; j += 4) {
    v4f e = exp4(ld4(lr + j) - m);
    s += ((double)e[0] + (double)e[1]) + ((double)e[2] + (double)e[3]);
  }
  for (; j < V; j++)
    s += (double)exp1(lr[j] - m);
  *out_max = m;
  *out_sum = s;
}

/* A label outside [0, V) (never produced by the loaders) counts as a row
 * with zero loss and zero gradient instead of reading out of bounds. */
void xm_k_cross_entropy(const float *logits, const int32_t *labels, float *loss, int64_t rows,
                        int64_t V) {
  double total = 0.0;
#pragma omp parallel for if (rows * V >= XM_K_PAR_MIN) schedule(static) reduction(+ : total)
  for (int64_t r = 0; r < rows; r++) {
    int32_t lab = labels[r];
    if (lab < 0 || lab >= V) continue;
    const float *lr = logits + r * V;
    float m;
    double sum;
    row_lse(lr, V, &m, &sum);
    total += (double)m + log(sum) - (double)lr[lab];
  }
  *loss = rows > 0 ? (float)(total / (double)rows) : 0.0f;
}

void xm_k_cross_entropy_grad(const float *dloss, const float *logits, const int32_t *labels,
                             float *dlogits, int64_t rows, int64_t V) {
  if (rows <= 0) return;
  double g = (double)*dloss / (double)rows;
#pragma omp parallel for if (rows * V >= XM_K_PAR_MIN) schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    const float *lr = logits + r * V;
    float *dr = dlogits + r * V;
    int32_t lab = labels[r];
    if (lab < 0 || lab >= V) {
      memset(dr, 0, (size_t)V * sizeof *dr);
      continue;
    }
    float m;
    double sum;
    row_lse(lr, V, &m, &sum);
    float c = (float)(g / sum); /* dloss/rows * softmax_j = c * exp(l_j - m) */
    int64_t j = 0;
    for (; j + 4 <= V; j += 4)
      st4(dr + j, c * exp4(ld4(lr + j) - m));
    for (; j < V; j++)
      dr[j] = c * exp1(lr[j] - m);
    dr[lab] = (float)(g * ((double)exp1(lr[lab] - m) / sum - 1.0));
  }
}

/* ---- the LM head fused with the cross-entropy ----------------------------
 * Chunk c covers vocabulary columns [c0, c0 + n) of w; its logits go to
 * the scratch after the per-row state (runtime/abi/workspace.h). The bf16
 * variants widen x once and each chunk of w as it comes (ws). */
typedef struct {
  const float *w;           /* f32 weight, or NULL */
  const xm_bf16_t *wb;      /* bf16 weight, widened chunk by chunk into wide */
  float *wide;              /* chunk x H floats */
  int64_t H;
} lmce_w_t;

static const float *lmce_chunk(const lmce_w_t *w, int64_t c0, int64_t n) {
  if (w->w) return w->w + c0 * w->H;
  const xm_bf16_t *src = w->wb + c0 * w->H;
  for (int64_t i = 0; i < n * w->H; i++)
    w->wide[i] = xm_bf16_to_f32(src[i]);
  return w->wide;
}

static int64_t lmce_cols(int64_t V, int64_t chunk, int64_t c0) {
  return V - c0 < chunk ? V - c0 : chunk;
}

static void lmce_fwd(const float *x, const lmce_w_t *w, const int32_t *labels, float *loss,
                     float *stats, int64_t rows, int64_t H, int64_t V, int64_t chunk,
                     float *scratch) {
  double *S = (double *)scratch;
  float *M = scratch + 2 * rows, *tgt = scratch + 3 * rows, *lg = scratch + 4 * rows;
  if (chunk < 1) chunk = 1;
  for (int64_t c0 = 0; c0 < V; c0 += chunk) {
    int64_t n = lmce_cols(V, chunk, c0);
    xm_k_matmul(x, lmce_chunk(w, c0, n), lg, rows, H, n);
#pragma omp parallel for if (rows * n >= XM_K_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
      const float *lr = lg + r * n;
      float m;
      double sum;
      row_lse(lr, n, &m, &sum);
      if (c0 == 0) {
        M[r] = m, S[r] = sum;
      } else if (m > M[r]) {
        S[r] = S[r] * exp((double)M[r] - (double)m) + sum;
        M[r] = m;
      } else {
        S[r] += sum * exp((double)m - (double)M[r]);
      }
      int32_t lab = labels[r];
      if (lab >= c0 && lab < c0 + n) tgt[r] = lr[lab - c0];
    }
  }
  double total = 0.0;
  for (int64_t r = 0; r < rows; r++) {
    stats[2 * r] = M[r];
    stats[2 * r + 1] = (float)S[r];
    int32_t lab = labels[r];
    if (lab >= 0 && lab < V) total += (double)M[r] + log(S[r]) - (double)tgt[r];
  }
  *loss = rows > 0 ? (float)(total / (double)rows) : 0.0f;
}

static void lmce_bwd(const float *dloss, const float *x, const lmce_w_t *w,
                     const int32_t *labels, const float *stats, float *dw, float *dx,
                     int64_t rows, int64_t H, int64_t V, int64_t chunk, float beta, int round,
                     float *scratch) {
  if (rows <= 0) {
    if (beta == 0.0f) memset(dw, 0, (size_t)(V * H) * sizeof *dw);
    return;
  }
  if (chunk < 1) chunk = 1;
  float *lg = scratch + 4 * rows;
  double g = (double)*dloss / (double)rows;
  for (int64_t c0 = 0; c0 < V; c0 += chunk) {
    int64_t n = lmce_cols(V, chunk, c0);
    const float *wc = lmce_chunk(w, c0, n);
    xm_k_matmul(x, wc, lg, rows, H, n);
#pragma omp parallel for if (rows * n >= XM_K_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
      float *lr = lg + r * n;
      int32_t lab = labels[r];
      if (lab < 0 || lab >= V) {
        memset(lr, 0, (size_t)n * sizeof *lr);
        continue;
      }
      float m = stats[2 * r];
      double sum = (double)stats[2 * r + 1];
      float c = (float)(g / sum);
      float at = lab >= c0 && lab < c0 + n ? lr[lab - c0] : 0.0f;
      int64_t j = 0;
      for (; j + 4 <= n; j += 4)
        st4(lr + j, c * exp4(ld4(lr + j) - m));
      for (; j < n; j++)
        lr[j] = c * exp1(lr[j] - m);
      if (lab >= c0 && lab < c0 + n) lr[lab - c0] = (float)(g * ((double)exp1(at - m) / sum - 1.0));
      if (round)
        for (j = 0; j < n; j++)
          lr[j] = xm_bf16_to_f32(xm_bf16_from_f32(lr[j]));
    }
    /* through gemm(): sliced over the OpenMP team like every GEMM here */
    gemm(0, 0, rows, H, n, 1.0f, lg, n, wc, H, c0 == 0 ? 0.0f : 1.0f, dx, H);
    gemm(1, 0, n, H, rows, 1.0f, lg, n, x, H, beta, dw + c0 * H, H);
  }
}

void xm_k_lm_head_ce(const float *x, const float *w, const int32_t *labels, float *loss,
                     float *stats, int64_t rows, int64_t H, int64_t V, int64_t chunk,
                     float *scratch) {
  lmce_w_t wt = {w, NULL, NULL, H};
  lmce_fwd(x, &wt, labels, loss, stats, rows, H, V, chunk, scratch);
}

void xm_k_lm_head_ce_grad(const float *dloss, const float *x, const float *w,
                          const int32_t *labels, const float *stats, float *dw, float *dx,
                          int64_t rows, int64_t H, int64_t V, int64_t chunk, float beta,
                          float *scratch) {
  lmce_w_t wt = {w, NULL, NULL, H};
  lmce_bwd(dloss, x, &wt, labels, stats, dw, dx, rows, H, V, chunk, beta, 0, scratch);
}

/* x widened into ws, then w's chunks after it. */
static const float *lmce_widen_x(const xm_bf16_t *x, int64_t rows, int64_t H, float *ws) {
  for (int64_t i = 0; i < rows * H; i++)
    ws[i] = xm_bf16_to_f32(x[i]);
  return ws;
}

void xm_k_lm_head_ce_bf16(const xm_bf16_t *x, const xm_bf16_t *w, const int32_t *labels,
                          float *loss, float *stats, int64_t rows, int64_t H, int64_t V,
                          int64_t chunk, float *scratch, float *ws) {
  lmce_w_t wt = {NULL, w, ws + rows * H, H};
  lmce_fwd(lmce_widen_x(x, rows, H, ws), &wt, labels, loss, stats, rows, H, V, chunk, scratch);
}

void xm_k_lm_head_ce_grad_bf16(const float *dloss, const xm_bf16_t *x, const xm_bf16_t *w,
                               const int32_t *labels, const float *stats, float *dw, float *dx,
                               int64_t rows, int64_t H, int64_t V, int64_t chunk, float beta,
                               float *scratch, float *ws) {
  lmce_w_t wt = {NULL, w, ws + rows * H, H};
  lmce_bwd(dloss, lmce_widen_x(x, rows, H, ws), &wt, labels, stats, dw, dx, rows, H, V, chunk,
           beta, 1, scratch);
}
