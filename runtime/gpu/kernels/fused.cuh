/* runtime/gpu/kernels/fused.cuh — the fused gather / combine grouped GEMMs
 * of the padding-free MoE block (runtime/cpu/kernels.h, "fused gather /
 * combine grouped GEMMs"), f32 and bf16 operands, f32 results.
 *
 * Every GEMM here is gemm.cuh's core; this file adds operand addressing
 * and epilogues. indices and tpe come from permute: routed row i belongs to
 * slot indices[i], token indices[i] / k, and the rows of expert e are
 * consecutive (tpe[e] of them, n = sum(tpe) read on the device).
 *   - gather_grouped_matmul: a rows GEMM whose A rows are token rows read
 *     through the slot index (xm_fused_tok), y[i] = x[t_i] w[e]^T;
 *   - gather_grouped_matmul_dw, grouped_matmul_combine_dw: weight-gradient
 *     GEMMs (tiles (expert, M tile, K tile), the reduction over the
 *     expert's rows) with the gathered operand on the reduction side; the
 *     combine's dout rows are scaled by the slot's routing weight as they
 *     are staged. The bf16 combine_dw runs the f32 SIMT core on widened
 *     operands: its A operand (weight x dout) is no bf16 value, and
 *     rounding it for the MMA would cost the f32 tolerance;
 *   - grouped_matmul_combine_grad: g = dout[t_i] w[e] (a rows GEMM with the
 *     gathered A) written into dh, then a warp per row takes dot(g, h[i])
 *     in double and scales dh by the routing weight; dropped slots' dweights
 *     are zeros;
 *   - grouped_matmul_combine and gather_grouped_matmul_dx add rows into
 *     tokens. Deterministically and without float atomics: out is zeroed,
 *     then the routed rows go in chunks of C = tile_rows * slots rows (the
 *     caller's scratch holds C rows of W floats): the chunk's GEMM writes
 *     each row's result (times its routing weight for the combine) into
 *     scratch, then a warp per chunk row adds: the warp of a token's first
 *     row in the chunk sums all the token's rows of the chunk, in row order,
 *     into out (the others exit); it finds them by a binary search in each
 *     expert's rows (slot-sorted, so a token's rows in one expert are one
 *     run). A token thus receives its rows in routed-row order, as the CPU
 *     kernels add them. The host launches ceil(T*k / C) chunks (chunks past
 *     n exit at once).
 * Rows past n are never read or written; tokens without rows get exact
 * zeros; the bf16 workspace `ws` is not needed.
 */
#ifndef XM_RUNTIME_GPU_KERNELS_FUSED_CUH
#define XM_RUNTIME_GPU_KERNELS_FUSED_CUH

#include "runtime/gpu/kernels/common.cuh"
#include "runtime/gpu/kernels/gemm.cuh"

/* Columns per lane of the add kernel's warp (a block covers
 * XM_WARP * COLS columns of XM_TILE_THREADS / XM_WARP rows). */
#if defined(XM_TARGET_AMD)
#define XM_TILE_FUSED_COLS 4
#else
#define XM_TILE_FUSED_COLS 4
#endif

/* Warps (rows) per block of the row-wise kernels. */
#define XM_FUSED_WPB (XM_TILE_THREADS / XM_WARP)

/* ---- operands and epilogues ---------------------------------------------- */

/* Token rows read through the slot: problem row r (routed row row0 + r)
 * reads row indices[row0 + r] / k of p (ld elements per row), scaled by
 * wts[indices[row0 + r]] when SCALED. RED as in xm_gemm_rows. */
template <class T, bool RED, bool SCALED> struct xm_fused_tok {
  typedef T type;
  static constexpr bool kRed = RED, kScaled = SCALED;
  const T *p;
  const int32_t *idx;
  const float *wts;
  int64_t ld, k;
};
template <class T, bool R, bool SC>
XM_DEV const T *xm_gemm_row(const xm_fused_tok<T, R, SC> &o, const xm_gemm_tile &t, int64_t r) {
  return o.p + (int64_t)(o.idx[t.row0 + r] / o.k) * o.ld;
}
template <class T, bool R, bool SC>
XM_DEV float xm_gemm_scale(const xm_fused_tok<T, R, SC> &o, const xm_gemm_tile &t, int64_t r) {
  return o.wts[o.idx[t.row0 + r]];
}
template <class T, bool R, bool SC> XM_DEV bool xm_gemm_vec(const xm_fused_tok<T, R, SC> &o) {
  return xm_gemm_aligned(o.p, o.ld);
}

/* A chunk's row results: routed row row0 + m goes to scratch row
 * row0 + m - c0 (ld floats), times its routing weight when wts is set. */
struct xm_fused_out_scratch {
  float *s;
  const int32_t *idx;
  const float *wts;
  int64_t ld, c0;
};
XM_DEV void xm_gemm_put(const xm_fused_out_scratch &o, const xm_gemm_tile &t, int64_t m, int64_t n,
                        float v) {
  const int64_t row = t.row0 + m;
  o.s[(row - o.c0) * o.ld + n] = o.wts ? o.wts[o.idx[row]] * v : v;
}

/* ---- helpers ------------------------------------------------------------- */

/* Bit l set: lane l's p (XM_WARP <= 64). */
XM_DEV uint64_t xm_fused_ballot(bool p) {
  const int lane = xm_lane();
  uint64_t m = (uint32_t)xm_warp_sum_i(p && lane < 32 ? (int)(1u << lane) : 0);
  if (XM_WARP > 32)
    m |= (uint64_t)(uint32_t)xm_warp_sum_i(p && lane >= 32 ? (int)(1u << (lane - 32)) : 0) << 32;
  return m;
}

/* Sum of v over the warp, every lane the same bits (butterfly on the two
 * halves of the double). */
XM_DEV double xm_fused_warp_sum_d(double v) {
  for (int m = XM_WARP / 2; m > 0; m >>= 1) {
    uint64_t u;
    memcpy(&u, &v, 8);
    const int lo = xm_shfl_xor_i((int)(uint32_t)u, m),
              hi = xm_shfl_xor_i((int)(uint32_t)(u >> 32), m);
    const uint64_t o = (uint64_t)(uint32_t)lo | ((uint64_t)(uint32_t)hi << 32);
    double d;
    memcpy(&d, &o, 8);
    v += d;
  }
  return v;
}

/* n = sum(tpe), to every lane of the warp. */
XM_DEV int64_t xm_fused_warp_rows(const int32_t *tpe, int64_t E) {
  int part = 0;
  for (int64_t e = xm_lane(); e < E; e += XM_WARP)
    part += tpe[e];
  return xm_warp_sum_i(part);
}

/* First i in [lo, hi) with v[i] >= key (v increasing), hi if none. */
XM_DEV int64_t xm_fused_lower_bound(const int32_t *v, int64_t lo, int64_t hi, int64_t key) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (v[mid] < key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* p[0, n) = 0 */
template <class S> XM_GLOBAL(XM_TILE_THREADS) k_xm_fused_zero(float *p, int64_t n) {
  XM_FOR_GRID(i, n) p[i] = 0.0f;
}

/* The add of a chunk [c0, c0 + C) of routed rows whose results are in s
 * (row i at s[(i - c0) * W]): a warp per row i; the warp of the first row
 * of its token in the chunk adds all the token's rows of the chunk, in row
 * order, to out[token] (W floats), XM_WARP * COLS columns per block
 * column. The experts go in chunks of XM_WARP lanes: a lane finds its
 * expert's first routed row by a warp prefix over tpe and the token's run
 * in it by binary search; the runs are taken in lane (expert) order. */
template <class S>
XM_GLOBAL(XM_TILE_THREADS)
k_xm_fused_add(const float *s, const int32_t *indices, const int32_t *tpe, float *out, int64_t E_,
               int64_t k_, int64_t W, int64_t c0, int64_t C) {
  const int64_t E = XM_DIM(S, E, E_), k = XM_DIM(S, k, k_);
  const int lane = xm_lane();
  const int64_t i = c0 + (int64_t)xm_bid_x() * XM_FUSED_WPB + xm_warp_id();
  if (i >= c0 + C) return;
  const int64_t n = xm_fused_warp_rows(tpe, E);
  if (i >= n) return;
  const int64_t c1 = c0 + C < n ? c0 + C : n;
  const int64_t tok = indices[i] / k, key = tok * k;
  const int64_t col0 = (int64_t)xm_bid_y() * XM_WARP * XM_TILE_FUSED_COLS + lane;
  float acc[XM_TILE_FUSED_COLS];
  bool started = false;
  int64_t carry = 0; /* routed rows of the experts before this lane chunk */
  for (int64_t base = 0; base < E && carry < c1; base += XM_WARP) {
    const int64_t e = base + lane;
    const int r = e < E ? tpe[e] : 0;
    const int incl = xm_gemm_warp_scan_i(r);
    const int64_t R = carry + incl - r;
    const int64_t lo = R > c0 ? R : c0, hi = R + r < c1 ? R + r : c1;
    int a = 0, b = 0; /* the token's rows of this expert in the chunk */
    if (lo < hi) {
      int64_t x = xm_fused_lower_bound(indices, lo, hi, key), y = x;
      while (y < hi && indices[y] < key + k)
        y++;
      a = (int)x;
      b = (int)y;
    }
    const uint64_t mask = xm_fused_ballot(b > a);
    for (int l = 0; l < XM_WARP; l++) {
      if (!((mask >> l) & 1u)) continue;
      const int64_t al = xm_shfl_i(a, l), bl = xm_shfl_i(b, l);
      if (!started) {
        if (al != i) return; /* an earlier row of the token adds it */
        started = true;
        for (int j = 0; j < XM_TILE_FUSED_COLS; j++) {
          const int64_t c = col0 + j * XM_WARP;
          acc[j] = c < W ? out[tok * W + c] : 0.0f;
        }
      }
      for (int64_t rr = al; rr < bl; rr++) {
        const float *src = s + (rr - c0) * W;
        for (int j = 0; j < XM_TILE_FUSED_COLS; j++) {
          const int64_t c = col0 + j * XM_WARP;
          if (c < W) acc[j] += src[c];
        }
      }
    }
    carry += xm_shfl_i(incl, XM_WARP - 1);
  }
  if (!started) return;
  for (int j = 0; j < XM_TILE_FUSED_COLS; j++) {
    const int64_t c = col0 + j * XM_WARP;
    if (c < W) out[tok * W + c] = acc[j];
  }
}

/* combine_grad's second pass, a warp per routed row i < n: dh[i] holds
 * g = dout[t_i] w[e]; dweights[slot] = dot(g, h[i]) (double), dh[i] =
 * weight * g. */
template <class S, class Tv>
XM_GLOBAL(XM_TILE_THREADS)
k_xm_fused_grad_rows(const Tv *h, const int32_t *tpe, const int32_t *indices, const float *weights,
                     float *dh, float *dweights, int64_t E_, int64_t K_) {
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_);
  const int64_t i = (int64_t)xm_bid_x() * XM_FUSED_WPB + xm_warp_id();
  const int64_t n = xm_fused_warp_rows(tpe, E);
  if (i >= n) return;
  const int32_t slot = indices[i];
  const float wt = weights[slot];
  double dot = 0.0;
  for (int64_t c = xm_lane(); c < K; c += XM_WARP) {
    const float g = dh[i * K + c];
    dot += (double)g * (double)xm_ld(h, i * K + c);
    dh[i * K + c] = wt * g;
  }
  dot = xm_fused_warp_sum_d(dot);
  if (xm_lane() == 0) dweights[slot] = (float)dot;
}

/* ---- the kernels' bodies, shared by f32 and bf16 operands ------------------ */

/* y[i] = x[t_i] w[e]^T, i < n */
template <class Ts, class Tv>
XM_DEV void xm_fused_fwd(const Tv *x, const int32_t *indices, const int32_t *tpe, const Tv *w,
                         float *y, int64_t E, int64_t K, int64_t M, int64_t k) {
  const xm_fused_tok<Tv, false, false> a = {x, indices, nullptr, K, k};
  const xm_gemm_weight<Tv, false> b = {w, K, M * K};
  const xm_gemm_out_rows<float> o = {y, M};
  xm_gemm_run_rows<Ts>(tpe, E, 0, 0, INT64_MAX, M, K, a, b, o);
}

/* scratch[i - c0] = weights[slot_i] * h[i] w[e]^T for the chunk's rows */
template <class Ts, class Tv>
XM_DEV void xm_fused_combine_chunk(const Tv *h, const Tv *w, const int32_t *tpe,
                                   const int32_t *indices, const float *weights, float *scratch,
                                   int64_t E, int64_t K, int64_t M, int64_t c0, int64_t C) {
  const xm_gemm_rows<Tv, false> a = {h, K};
  const xm_gemm_weight<Tv, false> b = {w, K, M * K};
  const xm_fused_out_scratch o = {scratch, indices, weights, M, c0};
  xm_gemm_run_rows<Ts>(tpe, E, 0, c0, c0 + C, M, K, a, b, o);
}

/* scratch[i - c0] = dy[i] w[e] for the chunk's rows */
template <class Ts, class Tv>
XM_DEV void xm_fused_dx_chunk(const Tv *dy, const Tv *w, const int32_t *tpe, const int32_t *indices,
                              float *scratch, int64_t E, int64_t K, int64_t M, int64_t c0,
                              int64_t C) {
  const xm_gemm_rows<Tv, false> a = {dy, M};
  const xm_gemm_weight<Tv, true> b = {w, K, M * K};
  const xm_fused_out_scratch o = {scratch, indices, nullptr, K, c0};
  xm_gemm_run_rows<Ts>(tpe, E, 0, c0, c0 + C, K, M, a, b, o);
}

/* dw[e] = beta dw[e] + sum over the rows of e of dy[i]^T x[t_i] */
template <class Ts, class Tv>
XM_DEV void xm_fused_dw(const Tv *dy, const Tv *x, const int32_t *indices, const int32_t *tpe,
                        float *dw, int64_t E, int64_t K, int64_t M, int64_t k, float beta) {
  const xm_gemm_rows<Tv, true> a = {dy, M};
  const xm_fused_tok<Tv, true, false> b = {x, indices, nullptr, K, k};
  const xm_gemm_out_dw o = {dw, K, M * K, beta};
  xm_gemm_run_dw<Ts>(tpe, E, 0, M, K, a, b, o);
}

/* dh[i] = dout[t_i] w[e] (g; scaled by the row pass) */
template <class Ts, class Tv>
XM_DEV void xm_fused_grad(const Tv *dout, const Tv *w, const int32_t *tpe, const int32_t *indices,
                          float *dh, int64_t E, int64_t K, int64_t M, int64_t k) {
  const xm_fused_tok<Tv, false, false> a = {dout, indices, nullptr, M, k};
  const xm_gemm_weight<Tv, true> b = {w, K, M * K};
  const xm_gemm_out_rows<float> o = {dh, K};
  xm_gemm_run_rows<Ts>(tpe, E, 0, 0, INT64_MAX, K, M, a, b, o);
}

/* dw[e] = beta dw[e] + sum over the rows of e of (weight * dout[t_i])^T h[i]
 * (f32 tiles whatever the operands) */
template <class Tv>
XM_DEV void xm_fused_combine_dw(const Tv *dout, const Tv *h, const int32_t *indices,
                                const float *weights, const int32_t *tpe, float *dw, int64_t E,
                                int64_t K, int64_t M, int64_t k, float beta) {
  const xm_fused_tok<Tv, true, true> a = {dout, indices, weights, M, k};
  const xm_gemm_rows<Tv, true> b = {h, K};
  const xm_gemm_out_dw o = {dw, K, M * K, beta};
  xm_gemm_run_dw<float>(tpe, E, 0, M, K, a, b, o);
}

/* ---- launch sequences ------------------------------------------------------ */

/* Blocks of a chunk's rows GEMM: at most C/BM + min(E, C) row tiles. */
static inline int64_t xm_fused_chunk_grid(int64_t C, int64_t E, int64_t cols) {
  return xm_gemm_grid((xm_cdiv(C, XM_GEMM_BM) + (E < C ? E : C)) * xm_cdiv(cols, XM_GEMM_BN));
}

/* out[T, W] = 0, then per chunk of C routed rows the chunk GEMM `kg` (args
 * a..., c0, C) and the add. */
template <class S, class KG, class... A>
static inline void xm_fused_scatter(xm_stream_t s, const char *name, KG kg, float *out,
                                    const int32_t *indices, const int32_t *tpe, float *scratch,
                                    int64_t E_, int64_t k_, int64_t E, int64_t T, int64_t k,
                                    int64_t W, int64_t C, A... a) {
  if (T <= 0 || W <= 0) return;
  xm_launch("fused_zero", xm_grid_1d(T * W, XM_TILE_THREADS), 1, 1, XM_TILE_THREADS, s,
            &k_xm_fused_zero<S>, out, T * W);
  if (C <= 0) return;
  const int64_t gg = xm_fused_chunk_grid(C, E, W);
  const int64_t ax = xm_cdiv(C, XM_FUSED_WPB),
                ay = xm_cdiv(W, (int64_t)XM_WARP * XM_TILE_FUSED_COLS);
  for (int64_t c0 = 0; c0 < T * k; c0 += C) {
    xm_launch(name, gg, 1, 1, XM_GEMM_THREADS, s, kg, a..., c0, C);
    xm_launch("fused_add", ax, ay, 1, XM_TILE_THREADS, s, &k_xm_fused_add<S>,
              (const float *)scratch, indices, tpe, out, E_, k_, W, c0, C);
  }
}

/* dweights = 0, dh = g by the GEMM `kg`, then the row pass. */
template <class S, class Tv, class KG>
static inline void xm_fused_grad_launch(xm_stream_t s, const char *name, KG kg, const Tv *dout,
                                        const Tv *h, const Tv *w, const int32_t *tpe,
                                        const int32_t *indices, const float *weights, float *dh,
                                        float *dweights, int64_t E_, int64_t K_, int64_t M_,
                                        int64_t T_, int64_t k_) {
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_), T = XM_DIM(S, T, T_),
                k = XM_DIM(S, k, k_);
  const int64_t slots = T * k;
  if (slots > 0)
    xm_launch("fused_zero", xm_grid_1d(slots, XM_TILE_THREADS), 1, 1, XM_TILE_THREADS, s,
              &k_xm_fused_zero<S>, dweights, slots);
  if (K <= 0 || E <= 0) return;
  xm_launch(name, xm_gemm_grid((xm_cdiv(slots, XM_GEMM_BM) + E) * xm_cdiv(K, XM_GEMM_BN)), 1, 1,
            XM_GEMM_THREADS, s, kg, dout, w, tpe, indices, dh, E_, K_, M_, k_);
  xm_launch("fused_grad_rows", xm_cdiv(slots, XM_FUSED_WPB), 1, 1, XM_TILE_THREADS, s,
            &k_xm_fused_grad_rows<S, Tv>, h, tpe, indices, weights, dh, dweights, E_, K_);
}

/* ---- f32 -------------------------------------------------------------------- */

template <class S>
XM_GLOBAL(XM_GEMM_THREADS)
k_gather_grouped_matmul(const float *x, const int32_t *indices, const int32_t *tpe, const float *w,
                        float *y, int64_t E_, int64_t K_, int64_t M_, int64_t k_) {
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_), M = XM_DIM(S, M, M_),
                k = XM_DIM(S, k, k_);
  xm_fused_fwd<float>(x, indices, tpe, w, y, E, K, M, k);
}
template <class S>
void xm_g_gather_grouped_matmul(xm_stream_t s, const float *x, const int32_t *indices,
                                const int32_t *tpe, const float *w, float *y, int64_t E_,
                                int64_t K_, int64_t M_, int64_t k_, float *scratch,
                                int64_t tile_rows_, int64_t slots_) {
  (void)scratch, (void)tile_rows_, (void)slots_;
  const int64_t E = XM_DIM(S, E, E_), M = XM_DIM(S, M, M_);
  xm_launch("gather_grouped_matmul", xm_gemm_grid_grouped(E, M), 1, 1, XM_GEMM_THREADS, s,
            &k_gather_grouped_matmul<S>, x, indices, tpe, w, y, E_, K_, M_, k_);
}
XM_G_TABLE(gather_grouped_matmul)

template <class S>
XM_GLOBAL(XM_GEMM_THREADS)
k_grouped_matmul_combine(const float *h, const float *w, const int32_t *tpe, const int32_t *indices,
                         const float *weights, float *scratch, int64_t E_, int64_t K_, int64_t M_,
                         int64_t c0, int64_t C) {
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_), M = XM_DIM(S, M, M_);
  xm_fused_combine_chunk<float>(h, w, tpe, indices, weights, scratch, E, K, M, c0, C);
}
template <class S>
void xm_g_grouped_matmul_combine(xm_stream_t s, const float *h, const float *w, const int32_t *tpe,
                                 const int32_t *indices, const float *weights, float *out,
                                 int64_t E_, int64_t K_, int64_t M_, int64_t T_, int64_t k_,
                                 float *scratch, int64_t tile_rows_, int64_t slots_) {
  const int64_t E = XM_DIM(S, E, E_), M = XM_DIM(S, M, M_), T = XM_DIM(S, T, T_),
                k = XM_DIM(S, k, k_);
  const int64_t C = XM_DIM(S, tile_rows, tile_rows_) * XM_DIM(S, slots, slots_);
  xm_fused_scatter<S>(s, "grouped_matmul_combine", &k_grouped_matmul_combine<S>, out, indices, tpe,
                      scratch, E_, k_, E, T, k, M, C, h, w, tpe, indices, weights, scratch, E_, K_,
                      M_);
}
XM_G_TABLE(grouped_matmul_combine)

template <class S>
XM_GLOBAL(XM_GEMM_THREADS)
k_gather_grouped_matmul_dx(const float *dy, const float *w, const int32_t *tpe,
                           const int32_t *indices, float *scratch, int64_t E_, int64_t K_,
                           int64_t M_, int64_t c0, int64_t C) {
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_), M = XM_DIM(S, M, M_);
  xm_fused_dx_chunk<float>(dy, w, tpe, indices, scratch, E, K, M, c0, C);
}
template <class S>
void xm_g_gather_grouped_matmul_dx(xm_stream_t s, const float *dy, const float *w,
                                   const int32_t *tpe, const int32_t *indices, float *dx,
                                   int64_t E_, int64_t K_, int64_t M_, int64_t T_, int64_t k_,
                                   float *scratch, int64_t tile_rows_, int64_t slots_) {
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_), T = XM_DIM(S, T, T_),
                k = XM_DIM(S, k, k_);
  const int64_t C = XM_DIM(S, tile_rows, tile_rows_) * XM_DIM(S, slots, slots_);
  xm_fused_scatter<S>(s, "gather_grouped_matmul_dx", &k_gather_grouped_matmul_dx<S>, dx, indices,
                      tpe, scratch, E_, k_, E, T, k, K, C, dy, w, tpe, indices, scratch, E_, K_,
                      M_);
}
XM_G_TABLE(gather_grouped_matmul_dx)

template <class S>
XM_GLOBAL(XM_GEMM_THREADS)
k_gather_grouped_matmul_dw(const float *dy, const float *x, const int32_t *indices,
                           const int32_t *tpe, float *dw, int64_t E_, int64_t K_, int64_t M_,
                           int64_t k_, float beta) {
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_), M = XM_DIM(S, M, M_),
                k = XM_DIM(S, k, k_);
  xm_fused_dw<float>(dy, x, indices, tpe, dw, E, K, M, k, beta);
}
template <class S>
void xm_g_gather_grouped_matmul_dw(xm_stream_t s, const float *dy, const float *x,
                                   const int32_t *indices, const int32_t *tpe, float *dw,
                                   int64_t E_, int64_t K_, int64_t M_, int64_t k_, float beta,
                                   float *scratch, int64_t tile_rows_, int64_t slots_) {
  (void)scratch, (void)tile_rows_, (void)slots_;
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_), M = XM_DIM(S, M, M_);
  xm_launch("gather_grouped_matmul_dw", xm_gemm_grid_dw(E, M, K), 1, 1, XM_GEMM_THREADS, s,
            &k_gather_grouped_matmul_dw<S>, dy, x, indices, tpe, dw, E_, K_, M_, k_, beta);
}
XM_G_TABLE(gather_grouped_matmul_dw)

template <class S>
XM_GLOBAL(XM_GEMM_THREADS)
k_grouped_matmul_combine_grad(const float *dout, const float *w, const int32_t *tpe,
                              const int32_t *indices, float *dh, int64_t E_, int64_t K_, int64_t M_,
                              int64_t k_) {
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_), M = XM_DIM(S, M, M_),
                k = XM_DIM(S, k, k_);
  xm_fused_grad<float>(dout, w, tpe, indices, dh, E, K, M, k);
}
template <class S>
void xm_g_grouped_matmul_combine_grad(xm_stream_t s, const float *dout, const float *h,
                                      const float *w, const int32_t *tpe, const int32_t *indices,
                                      const float *weights, float *dh, float *dweights, int64_t E_,
                                      int64_t K_, int64_t M_, int64_t T_, int64_t k_,
                                      float *scratch, int64_t tile_rows_, int64_t slots_) {
  (void)scratch, (void)tile_rows_, (void)slots_;
  xm_fused_grad_launch<S>(s, "grouped_matmul_combine_grad", &k_grouped_matmul_combine_grad<S>, dout,
                          h, w, tpe, indices, weights, dh, dweights, E_, K_, M_, T_, k_);
}
XM_G_TABLE(grouped_matmul_combine_grad)

template <class S>
XM_GLOBAL(XM_GEMM_THREADS)
k_grouped_matmul_combine_dw(const float *dout, const float *h, const int32_t *indices,
                            const float *weights, const int32_t *tpe, float *dw, int64_t E_,
                            int64_t K_, int64_t M_, int64_t k_, float beta) {
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_), M = XM_DIM(S, M, M_),
                k = XM_DIM(S, k, k_);
  xm_fused_combine_dw(dout, h, indices, weights, tpe, dw, E, K, M, k, beta);
}
template <class S>
void xm_g_grouped_matmul_combine_dw(xm_stream_t s, const float *dout, const float *h,
                                    const int32_t *indices, const float *weights,
                                    const int32_t *tpe, float *dw, int64_t E_, int64_t K_,
                                    int64_t M_, int64_t k_, float beta, float *scratch,
                                    int64_t tile_rows_, int64_t slots_) {
  (void)scratch, (void)tile_rows_, (void)slots_;
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_), M = XM_DIM(S, M, M_);
  xm_launch("grouped_matmul_combine_dw", xm_gemm_grid_dw(E, M, K), 1, 1, XM_GEMM_THREADS, s,
            &k_grouped_matmul_combine_dw<S>, dout, h, indices, weights, tpe, dw, E_, K_, M_, k_,
            beta);
}
XM_G_TABLE(grouped_matmul_combine_dw)

/* ---- bf16 operands (routing weights f32, results f32) ----------------------- */

template <class S>
XM_GLOBAL(XM_GEMM_THREADS)
k_gather_grouped_matmul_bf16(const xm_bf16 *x, const int32_t *indices, const int32_t *tpe,
                             const xm_bf16 *w, float *y, int64_t E_, int64_t K_, int64_t M_,
                             int64_t k_) {
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_), M = XM_DIM(S, M, M_),
                k = XM_DIM(S, k, k_);
  xm_fused_fwd<xm_bf16>(x, indices, tpe, w, y, E, K, M, k);
}
template <class S>
void xm_g_gather_grouped_matmul_bf16(xm_stream_t s, const xm_bf16 *x, const int32_t *indices,
                                     const int32_t *tpe, const xm_bf16 *w, float *y, int64_t E_,
                                     int64_t K_, int64_t M_, int64_t k_, float *scratch,
                                     int64_t tile_rows_, int64_t slots_, float *ws) {
  (void)scratch, (void)tile_rows_, (void)slots_, (void)ws;
  const int64_t E = XM_DIM(S, E, E_), M = XM_DIM(S, M, M_);
  xm_launch("gather_grouped_matmul_bf16", xm_gemm_grid_grouped(E, M), 1, 1, XM_GEMM_THREADS, s,
            &k_gather_grouped_matmul_bf16<S>, x, indices, tpe, w, y, E_, K_, M_, k_);
}
XM_G_TABLE(gather_grouped_matmul_bf16)

template <class S>
XM_GLOBAL(XM_GEMM_THREADS)
k_grouped_matmul_combine_bf16(const xm_bf16 *h, const xm_bf16 *w, const int32_t *tpe,
                              const int32_t *indices, const float *weights, float *scratch,
                              int64_t E_, int64_t K_, int64_t M_, int64_t c0, int64_t C) {
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_), M = XM_DIM(S, M, M_);
  xm_fused_combine_chunk<xm_bf16>(h, w, tpe, indices, weights, scratch, E, K, M, c0, C);
}
template <class S>
void xm_g_grouped_matmul_combine_bf16(xm_stream_t s, const xm_bf16 *h, const xm_bf16 *w,
                                      const int32_t *tpe, const int32_t *indices,
                                      const float *weights, float *out, int64_t E_, int64_t K_,
                                      int64_t M_, int64_t T_, int64_t k_, float *scratch,
                                      int64_t tile_rows_, int64_t slots_, float *ws) {
  (void)ws;
  const int64_t E = XM_DIM(S, E, E_), M = XM_DIM(S, M, M_), T = XM_DIM(S, T, T_),
                k = XM_DIM(S, k, k_);
  const int64_t C = XM_DIM(S, tile_rows, tile_rows_) * XM_DIM(S, slots, slots_);
  xm_fused_scatter<S>(s, "grouped_matmul_combine_bf16", &k_grouped_matmul_combine_bf16<S>, out,
                      indices, tpe, scratch, E_, k_, E, T, k, M, C, h, w, tpe, indices, weights,
                      scratch, E_, K_, M_);
}
XM_G_TABLE(grouped_matmul_combine_bf16)

template <class S>
XM_GLOBAL(XM_GEMM_THREADS)
k_gather_grouped_matmul_dx_bf16(const xm_bf16 *dy, const xm_bf16 *w, const int32_t *tpe,
                                const int32_t *indices, float *scratch, int64_t E_, int64_t K_,
                                int64_t M_, int64_t c0, int64_t C) {
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_), M = XM_DIM(S, M, M_);
  xm_fused_dx_chunk<xm_bf16>(dy, w, tpe, indices, scratch, E, K, M, c0, C);
}
template <class S>
void xm_g_gather_grouped_matmul_dx_bf16(xm_stream_t s, const xm_bf16 *dy, const xm_bf16 *w,
                                        const int32_t *tpe, const int32_t *indices, float *dx,
                                        int64_t E_, int64_t K_, int64_t M_, int64_t T_, int64_t k_,
                                        float *scratch, int64_t tile_rows_, int64_t slots_,
                                        float *ws) {
  (void)ws;
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_), T = XM_DIM(S, T, T_),
                k = XM_DIM(S, k, k_);
  const int64_t C = XM_DIM(S, tile_rows, tile_rows_) * XM_DIM(S, slots, slots_);
  xm_fused_scatter<S>(s, "gather_grouped_matmul_dx_bf16", &k_gather_grouped_matmul_dx_bf16<S>, dx,
                      indices, tpe, scratch, E_, k_, E, T, k, K, C, dy, w, tpe, indices, scratch,
                      E_, K_, M_);
}
XM_G_TABLE(gather_grouped_matmul_dx_bf16)

template <class S>
XM_GLOBAL(XM_GEMM_THREADS)
k_gather_grouped_matmul_dw_bf16(const xm_bf16 *dy, const xm_bf16 *x, const int32_t *indices,
                                const int32_t *tpe, float *dw, int64_t E_, int64_t K_, int64_t M_,
                                int64_t k_, float beta) {
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_), M = XM_DIM(S, M, M_),
                k = XM_DIM(S, k, k_);
  xm_fused_dw<xm_bf16>(dy, x, indices, tpe, dw, E, K, M, k, beta);
}
template <class S>
void xm_g_gather_grouped_matmul_dw_bf16(xm_stream_t s, const xm_bf16 *dy, const xm_bf16 *x,
                                        const int32_t *indices, const int32_t *tpe, float *dw,
                                        int64_t E_, int64_t K_, int64_t M_, int64_t k_, float beta,
                                        float *scratch, int64_t tile_rows_, int64_t slots_,
                                        float *ws) {
  (void)scratch, (void)tile_rows_, (void)slots_, (void)ws;
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_), M = XM_DIM(S, M, M_);
  xm_launch("gather_grouped_matmul_dw_bf16", xm_gemm_grid_dw(E, M, K), 1, 1, XM_GEMM_THREADS, s,
            &k_gather_grouped_matmul_dw_bf16<S>, dy, x, indices, tpe, dw, E_, K_, M_, k_, beta);
}
XM_G_TABLE(gather_grouped_matmul_dw_bf16)

template <class S>
XM_GLOBAL(XM_GEMM_THREADS)
k_grouped_matmul_combine_grad_bf16(const xm_bf16 *dout, const xm_bf16 *w, const int32_t *tpe,
                                   const int32_t *indices, float *dh, int64_t E_, int64_t K_,
                                   int64_t M_, int64_t k_) {
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_), M = XM_DIM(S, M, M_),
                k = XM_DIM(S, k, k_);
  xm_fused_grad<xm_bf16>(dout, w, tpe, indices, dh, E, K, M, k);
}
template <class S>
void xm_g_grouped_matmul_combine_grad_bf16(xm_stream_t s, const xm_bf16 *dout, const xm_bf16 *h,
                                           const xm_bf16 *w, const int32_t *tpe,
                                           const int32_t *indices, const float *weights, float *dh,
                                           float *dweights, int64_t E_, int64_t K_, int64_t M_,
                                           int64_t T_, int64_t k_, float *scratch,
                                           int64_t tile_rows_, int64_t slots_, float *ws) {
  (void)scratch, (void)tile_rows_, (void)slots_, (void)ws;
  xm_fused_grad_launch<S>(s, "grouped_matmul_combine_grad_bf16",
                          &k_grouped_matmul_combine_grad_bf16<S>, dout, h, w, tpe, indices, weights,
                          dh, dweights, E_, K_, M_, T_, k_);
}
XM_G_TABLE(grouped_matmul_combine_grad_bf16)

template <class S>
XM_GLOBAL(XM_GEMM_THREADS)
k_grouped_matmul_combine_dw_bf16(const xm_bf16 *dout, const xm_bf16 *h, const int32_t *indices,
                                 const float *weights, const int32_t *tpe, float *dw, int64_t E_,
                                 int64_t K_, int64_t M_, int64_t k_, float beta) {
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_), M = XM_DIM(S, M, M_),
                k = XM_DIM(S, k, k_);
  xm_fused_combine_dw(dout, h, indices, weights, tpe, dw, E, K, M, k, beta);
}
template <class S>
void xm_g_grouped_matmul_combine_dw_bf16(xm_stream_t s, const xm_bf16 *dout, const xm_bf16 *h,
                                         const int32_t *indices, const float *weights,
                                         const int32_t *tpe, float *dw, int64_t E_, int64_t K_,
                                         int64_t M_, int64_t k_, float beta, float *scratch,
                                         int64_t tile_rows_, int64_t slots_, float *ws) {
  (void)scratch, (void)tile_rows_, (void)slots_, (void)ws;
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_), M = XM_DIM(S, M, M_);
  xm_launch("grouped_matmul_combine_dw_bf16", xm_gemm_grid_dw(E, M, K), 1, 1, XM_GEMM_THREADS, s,
            &k_grouped_matmul_combine_dw_bf16<S>, dout, h, indices, weights, tpe, dw, E_, K_, M_,
            k_, beta);
}
XM_G_TABLE(grouped_matmul_combine_dw_bf16)

#endif /* XM_RUNTIME_GPU_KERNELS_FUSED_CUH */
