/* runtime/kernels_dense.c — the dense CPU kernels: GEMMs, elementwise ops,
 * activations, RMSNorm, embedding and cross-entropy (forward and backward).
 *
 * These are the numerical reference of xmoec: every other backend is
 * compared against them, so they favour accuracy where it is cheap. GEMMs
 * go to CBLAS (OpenBLAS; see docs/benchmarks.md for the choice of kernel
 * core). Everything else is plain C loops that the compiler vectorises,
 * split over OpenMP threads only when a call moves at least XM_K_PAR_MIN
 * elements: tiny calls (the tests, small models) would spend more on waking
 * the thread team than on the work. Reductions that sum many terms (row
 * statistics, column sums over the batch, the loss) accumulate in double so
 * that the result does not depend on the thread count beyond rounding of
 * the final value.
 *
 * Column sums (reduce_to, the RMSNorm weight gradient) are computed by
 * column blocks: each thread owns a block of columns and walks all rows, so
 * no thread writes another's output and no atomics or per-thread copies of
 * the result are needed. The attention and RoPE kernels live in
 * runtime/kernels_attn.c.
 */
#include "runtime/kernels.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "support/status.h"

/* Below this many elements a kernel stays on the calling thread. */
#define XM_K_PAR_MIN ((int64_t)1 << 15)
/* Columns per thread in column sums: 256 doubles stay in L1. */
#define XM_K_COL_BLOCK 256

/* ---- GEMMs ------------------------------------------------------------- */

/* OpenBLAS 0.3.21 in Debian is built with 32-bit blasint. The planner keeps
 * every per-rank GEMM dimension far below 2^31, so a larger one is a bug. */
static int blas_dim(int64_t d) {
  XM_ASSERT(d >= 0 && d <= INT_MAX);
  return (int)d;
}

void xm_k_matmul(const float *x, const float *w, float *y, int64_t M, int64_t K, int64_t N) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    xm_k_fill(y, M * N, 0.0f);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blas_dim(M), blas_dim(N), blas_dim(K), 1.0f,
              x, blas_dim(K), w, blas_dim(K), 0.0f, y, blas_dim(N));
}

void xm_k_matmul_dx(const float *dy, const float *w, float *dx, int64_t M, int64_t K, int64_t N) {
  if (M == 0 || K == 0) return;
  if (N == 0) {
    xm_k_fill(dx, M * K, 0.0f);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_dim(M), blas_dim(K), blas_dim(N),
              1.0f, dy, blas_dim(N), w, blas_dim(K), 0.0f, dx, blas_dim(K));
}

void xm_k_matmul_dw(const float *dy, const float *x, float *dw, int64_t M, int64_t K, int64_t N) {
  if (N == 0 || K == 0) return;
  if (M == 0) { /* no rows this micro-batch: the gradient is zero, not stale */
    xm_k_fill(dw, N * K, 0.0f);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, blas_dim(N), blas_dim(K), blas_dim(M), 1.0f,
              dy, blas_dim(N), x, blas_dim(K), 0.0f, dw, blas_dim(K));
}

/* ---- elementwise ------------------------------------------------------- */

/* The broadcast operand repeats every nb elements; walking the result in
 * blocks of nb keeps the inner loop free of the modulo. */
void xm_k_add(const float *a, const float *b, float *y, int64_t na, int64_t nb) {
  XM_ASSERT(nb > 0 && na % nb == 0);
  int64_t blocks = na / nb;
#pragma omp parallel for if (na >= XM_K_PAR_MIN) schedule(static)
  for (int64_t r = 0; r < blocks; r++) {
    const float *ar = a + r * nb;
    float *yr = y + r * nb;
    for (int64_t j = 0; j < nb; j++)
      yr[j] = ar[j] + b[j];
  }
}

void xm_k_mul(const float *a, const float *b, float *y, int64_t na, int64_t nb) {
  XM_ASSERT(nb > 0 && na % nb == 0);
  int64_t blocks = na / nb;
#pragma omp parallel for if (na >= XM_K_PAR_MIN) schedule(static)
  for (int64_t r = 0; r < blocks; r++) {
    const float *ar = a + r * nb;
    float *yr = y + r * nb;
    for (int64_t j = 0; j < nb; j++)
      yr[j] = ar[j] * b[j];
  }
}

void xm_k_scale(const float *x, float *y, int64_t n, float factor) {
#pragma omp parallel for if (n >= XM_K_PAR_MIN) schedule(static)
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

void xm_k_fill(float *y, int64_t n, float value) {
#pragma omp parallel for if (n >= XM_K_PAR_MIN) schedule(static)
  for (int64_t i = 0; i < n; i++)
    y[i] = value;
}

void xm_k_copy(const float *x, float *y, int64_t n) {
  if (n > 0 && x != y) memmove(y, x, (size_t)n * sizeof *y);
}

/* ---- activations -------------------------------------------------------- */

/* 1/(1+e^-x) is already stable in float: for very negative x the exponent
 * overflows to inf and the quotient is exactly 0, never NaN. */
static inline float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

void xm_k_silu(const float *x, float *y, int64_t n) {
#pragma omp parallel for if (n >= XM_K_PAR_MIN) schedule(static)
  for (int64_t i = 0; i < n; i++)
    y[i] = x[i] * sigmoidf_(x[i]);
}

void xm_k_silu_grad(const float *dy, const float *x, float *dx, int64_t n) {
#pragma omp parallel for if (n >= XM_K_PAR_MIN) schedule(static)
  for (int64_t i = 0; i < n; i++) {
    float s = sigmoidf_(x[i]);
    dx[i] = dy[i] * s * (1.0f + x[i] * (1.0f - s));
  }
}

#define XM_GELU_C 0.7978845608028654f /* sqrt(2/pi) */
#define XM_GELU_A 0.044715f

void xm_k_gelu(const float *x, float *y, int64_t n) {
#pragma omp parallel for if (n >= XM_K_PAR_MIN) schedule(static)
  for (int64_t i = 0; i < n; i++) {
    float v = x[i];
    float t = tanhf(XM_GELU_C * (v + XM_GELU_A * v * v * v));
    y[i] = 0.5f * v * (1.0f + t);
  }
}

void xm_k_gelu_grad(const float *dy, const float *x, float *dx, int64_t n) {
#pragma omp parallel for if (n >= XM_K_PAR_MIN) schedule(static)
  for (int64_t i = 0; i < n; i++) {
    float v = x[i];
    float t = tanhf(XM_GELU_C * (v + XM_GELU_A * v * v * v));
    float du = XM_GELU_C * (1.0f + 3.0f * XM_GELU_A * v * v);
    dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
  }
}

void xm_k_sigmoid(const float *x, float *y, int64_t n) {
#pragma omp parallel for if (n >= XM_K_PAR_MIN) schedule(static)
  for (int64_t i = 0; i < n; i++)
    y[i] = sigmoidf_(x[i]);
}

void xm_k_sigmoid_grad(const float *dy, const float *y, float *dx, int64_t n) {
#pragma omp parallel for if (n >= XM_K_PAR_MIN) schedule(static)
  for (int64_t i = 0; i < n; i++)
    dx[i] = dy[i] * y[i] * (1.0f - y[i]);
}

void xm_k_swiglu(const float *g, const float *u, float *y, int64_t n) {
#pragma omp parallel for if (n >= XM_K_PAR_MIN) schedule(static)
  for (int64_t i = 0; i < n; i++)
    y[i] = g[i] * sigmoidf_(g[i]) * u[i];
}

void xm_k_swiglu_grad(const float *dy, const float *g, const float *u, float *dg, float *du,
                      int64_t n) {
#pragma omp parallel for if (n >= XM_K_PAR_MIN) schedule(static)
  for (int64_t i = 0; i < n; i++) {
    float s = sigmoidf_(g[i]);
    float silu = g[i] * s;
    float d = dy[i];
    /* read u before writing du: the planner may let du reuse u's buffer */
    float ui = u[i];
    du[i] = d * silu;
    dg[i] = d * ui * s * (1.0f + g[i] * (1.0f - s));
  }
}

/* ---- RMSNorm ------------------------------------------------------------ */

/* 1/sqrt(mean(x^2) + eps) of one row, the mean taken in double: H can be
 * several thousand and the squares span many orders of magnitude. */
static float rms_inv(const float *xr, int64_t H, float eps) {
  double ss = 0.0;
  for (int64_t j = 0; j < H; j++)
    ss += (double)xr[j] * (double)xr[j];
  return (float)(1.0 / sqrt(ss / (double)H + (double)eps));
}

void xm_k_rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t H, float eps) {
#pragma omp parallel for if (rows * H >= XM_K_PAR_MIN) schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * H;
    float *yr = y + r * H;
    float inv = rms_inv(xr, H, eps);
    for (int64_t j = 0; j < H; j++)
      yr[j] = xr[j] * inv * w[j];
  }
}

/* With n = x * inv: dx = inv * (w*dy - x * inv^2 * mean(w*dy*x)); the
 * weight gradient is sum over rows of dy * n, a column sum weighted by each
 * row's inv, done after dx so that it can reuse the row factors. dx may not
 * alias x (the second pass reads x again). */
void xm_k_rmsnorm_grad(const float *dy, const float *x, const float *w, float *dx, float *dw,
                       int64_t rows, int64_t H, float eps) {
  if (rows <= 0 || H <= 0) {
    if (H > 0) xm_k_fill(dw, H, 0.0f);
    return;
  }
  float *inv = malloc((size_t)rows * sizeof *inv);
  XM_ASSERT(inv != NULL);
#pragma omp parallel for if (rows * H >= XM_K_PAR_MIN) schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * H, *dyr = dy + r * H;
    float *dxr = dx + r * H;
    float iv = rms_inv(xr, H, eps);
    inv[r] = iv;
    double dot = 0.0;
    for (int64_t j = 0; j < H; j++)
      dot += (double)dyr[j] * (double)w[j] * (double)xr[j];
    float c = (float)(dot / (double)H) * iv * iv;
    for (int64_t j = 0; j < H; j++)
      dxr[j] = iv * (w[j] * dyr[j] - xr[j] * c);
  }
  /* dw[j] = sum_r dy[r,j] * x[r,j] * inv[r]: column sums of dy*x need the
   * product per element, so walk column blocks directly. */
  int64_t nblocks = (H + XM_K_COL_BLOCK - 1) / XM_K_COL_BLOCK;
#pragma omp parallel for if (rows * H >= XM_K_PAR_MIN) schedule(static)
  for (int64_t blk = 0; blk < nblocks; blk++) {
    int64_t j0 = blk * XM_K_COL_BLOCK;
    int64_t nj = H - j0 < XM_K_COL_BLOCK ? H - j0 : XM_K_COL_BLOCK;
    double acc[XM_K_COL_BLOCK];
    for (int64_t j = 0; j < nj; j++)
      acc[j] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
      const float *xr = x + r * H + j0, *dyr = dy + r * H + j0;
      float iv = inv[r];
      for (int64_t j = 0; j < nj; j++)
        acc[j] += (double)(dyr[j] * xr[j] * iv);
    }
    for (int64_t j = 0; j < nj; j++)
      dw[j0 + j] = (float)acc[j];
  }
  free(inv);
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

/* The stable log-sum-exp of one row: max and sum(exp(l - max)). Each term
 * lies in (0, 1] and is exact to an ulp in float; the sum of up to 10^5
 * terms is what loses precision, so it is kept in double. */
static void row_lse(const float *lr, int64_t V, float *out_max, double *out_sum) {
  float m = -INFINITY;
  for (int64_t j = 0; j < V; j++)
    m = lr[j] > m ? lr[j] : m;
  double s = 0.0;
  for (int64_t j = 0; j < V; j++)
    s += (double)expf(lr[j] - m);
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
    for (int64_t j = 0; j < V; j++)
      dr[j] = c * expf(lr[j] - m);
    dr[lab] = (float)(g * ((double)expf(lr[lab] - m) / sum - 1.0));
  }
}
