/* runtime/cpu/kernels_bf16.c — the bf16 kernels of the CPU backend: casts
 * and the GEMMs of bf16 mixed precision (docs/design.md, Mixed precision).
 *
 * A bf16 GEMM reads bf16 operands, multiplies and accumulates in f32, and
 * writes a bf16 result (rounded once, at the end) or, for weight
 * gradients, an f32 result that can add into the f32 gradient state. The
 * product of two bf16 values is exact in f32, so widening the operands to
 * f32 and calling the f32 GEMM gives exactly what a bf16 GEMM with f32
 * accumulation computes; the CPU has no faster bf16 GEMM in Debian's
 * OpenBLAS (built without its sbgemm). The widened tiles live in the
 * workspace the memory plan gives the op (xm_bf16_gemm_ws_floats), rows
 * in tiles of XM_BF16_TILE_ROWS so it stays small.
 */
#include <omp.h>

#include "runtime/abi/bf16.h"
#include "runtime/cpu/kernels.h"

#define XM_K_CAST_PAR_MIN ((int64_t)1 << 16)

void xm_k_cast_f32_bf16(const float *x, xm_bf16_t *y, int64_t n) {
#pragma omp parallel for simd if (parallel : n >= XM_K_CAST_PAR_MIN) schedule(static)
  for (int64_t i = 0; i < n; i++)
    y[i] = xm_bf16_from_f32(x[i]);
}

void xm_k_cast_bf16_f32(const xm_bf16_t *x, float *y, int64_t n) {
#pragma omp parallel for simd if (parallel : n >= XM_K_CAST_PAR_MIN) schedule(static)
  for (int64_t i = 0; i < n; i++)
    y[i] = xm_bf16_to_f32(x[i]);
}

static int64_t tile_rows(int64_t rows) {
  int64_t r = rows < XM_BF16_TILE_ROWS ? rows : XM_BF16_TILE_ROWS;
  return r < 1 ? 1 : r;
}

/* The f32 kernels the forward and input-gradient GEMMs run on widened
 * tiles: y[M,N] = x w^T (xm_k_matmul) and dx[M,K] = dy w (xm_k_matmul_dx),
 * both (a, w, out, M, K, N). */
typedef void (*gemm_f32_t)(const float *, const float *, float *, int64_t, int64_t, int64_t);

/* out = gemm(a, w) over M rows in tiles: a has `aw` floats per row, out
 * `ow` (forward: K and N; input gradient: N and K); w already widened;
 * at and ot the tile buffers. */
static void tiled_rows(gemm_f32_t gemm, const xm_bf16_t *a, int64_t aw, const float *wf,
                       xm_bf16_t *out, int64_t ow, int64_t M, int64_t K, int64_t N, float *at,
                       float *ot) {
  int64_t R = tile_rows(M);
  for (int64_t m0 = 0; m0 < M; m0 += R) {
    int64_t r = M - m0 < R ? M - m0 : R;
    xm_k_cast_bf16_f32(a + m0 * aw, at, r * aw);
    gemm(at, wf, ot, r, K, N);
    xm_k_cast_f32_bf16(ot, out + m0 * ow, r * ow);
  }
}

/* dw[N,K] = beta dw + dy^T x over M rows, tile by tile in f32. */
static void dw_rows(const xm_bf16_t *dy, const xm_bf16_t *x, float *dw, int64_t M, int64_t K,
                    int64_t N, float beta, float *dyt, float *xt) {
  if (M == 0) {
    if (beta == 0.0f) xm_k_fill(dw, N * K, 0.0f);
    return;
  }
  int64_t R = tile_rows(M);
  for (int64_t m0 = 0; m0 < M; m0 += R) {
    int64_t r = M - m0 < R ? M - m0 : R;
    xm_k_cast_bf16_f32(dy + m0 * N, dyt, r * N);
    xm_k_cast_bf16_f32(x + m0 * K, xt, r * K);
    if (m0 == 0 && beta == 0.0f)
      xm_k_matmul_dw(dyt, xt, dw, r, K, N);
    else
      xm_k_matmul_dw_acc(dyt, xt, dw, r, K, N);
  }
}

void xm_k_matmul_bf16(const xm_bf16_t *x, const xm_bf16_t *w, xm_bf16_t *y, int64_t M, int64_t K,
                      int64_t N, float *ws) {
  float *wf = ws, *xt = wf + N * K, *yt = xt + tile_rows(M) * K;
  xm_k_cast_bf16_f32(w, wf, N * K);
  tiled_rows(xm_k_matmul, x, K, wf, y, N, M, K, N, xt, yt);
}

void xm_k_matmul_dx_bf16(const xm_bf16_t *dy, const xm_bf16_t *w, xm_bf16_t *dx, int64_t M,
                         int64_t K, int64_t N, float *ws) {
  float *wf = ws, *dyt = wf + N * K, *dxt = dyt + tile_rows(M) * N;
  xm_k_cast_bf16_f32(w, wf, N * K);
  tiled_rows(xm_k_matmul_dx, dy, N, wf, dx, K, M, K, N, dyt, dxt);
}

void xm_k_matmul_dw_bf16(const xm_bf16_t *dy, const xm_bf16_t *x, float *dw, int64_t M,
                         int64_t K, int64_t N, float beta, float *ws) {
  float *dyt = ws, *xt = dyt + tile_rows(M) * N;
  dw_rows(dy, x, dw, M, K, N, beta, dyt, xt);
}

/* The grouped GEMMs: expert e owns rows [row0, row0 + tpe[e]) and weight
 * w[e] of [M,K]; the workspace is sized for the bound of all rows. */
static int64_t total_rows(const int32_t *tpe, int64_t E) {
  int64_t n = 0;
  for (int64_t e = 0; e < E; e++)
    n += tpe[e];
  return n;
}

/* Expert by expert: w[e] widened, then its rows (a: `aw` floats per row,
 * out: `ow`) in tiles. */
static void grouped_rows(gemm_f32_t gemm, const xm_bf16_t *a, int64_t aw, const xm_bf16_t *w,
                         const int32_t *tpe, xm_bf16_t *out, int64_t ow, int64_t E, int64_t K,
                         int64_t M, float *ws) {
  int64_t R = tile_rows(total_rows(tpe, E));
  float *wf = ws, *at = wf + M * K, *ot = at + R * aw;
  int64_t row = 0;
  for (int64_t e = 0; e < E; e++) {
    int64_t c = tpe[e];
    if (c == 0) continue;
    xm_k_cast_bf16_f32(w + e * M * K, wf, M * K);
    tiled_rows(gemm, a + row * aw, aw, wf, out + row * ow, ow, c, K, M, at, ot);
    row += c;
  }
}

void xm_k_grouped_matmul_bf16(const xm_bf16_t *x, const xm_bf16_t *w, const int32_t *tpe,
                              xm_bf16_t *y, int64_t E, int64_t K, int64_t M, float *ws) {
  grouped_rows(xm_k_matmul, x, K, w, tpe, y, M, E, K, M, ws);
}

void xm_k_grouped_matmul_dx_bf16(const xm_bf16_t *dy, const xm_bf16_t *w, const int32_t *tpe,
                                 xm_bf16_t *dx, int64_t E, int64_t K, int64_t M, float *ws) {
  grouped_rows(xm_k_matmul_dx, dy, M, w, tpe, dx, K, E, K, M, ws);
}

void xm_k_grouped_matmul_dw_bf16(const xm_bf16_t *dy, const xm_bf16_t *x, const int32_t *tpe,
                                 float *dw, int64_t E, int64_t K, int64_t M, float beta,
                                 float *ws) {
  int64_t R = tile_rows(total_rows(tpe, E));
  float *dyt = ws, *xt = dyt + R * M;
  int64_t row = 0;
  for (int64_t e = 0; e < E; e++) {
    int64_t c = tpe[e];
    dw_rows(dy + row * M, x + row * K, dw + e * M * K, c, K, M, beta, dyt, xt);
    row += c;
  }
}
