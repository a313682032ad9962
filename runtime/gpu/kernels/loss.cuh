/* runtime/gpu/kernels/loss.cuh — the LM head fused with the cross-entropy
 * on the GPU: lm_head_ce, lm_head_ce_grad and their bf16 variants
 * (runtime/abi/kernels.def; semantics and numerics of runtime/cpu's
 * xm_k_lm_head_ce, runtime/cpu/kernels.h).
 *
 * The [rows, V] logits never exist: the host launcher walks the vocabulary
 * in chunks of `chunk` columns (runtime/abi/workspace.h) and, per chunk,
 * launches a few kernels on the one chunk of logits in the scratch:
 *   forward   the GEMM core of gemm.cuh writes the chunk's logits (f32,
 *             from f32 or bf16 operands); a block per row then folds the
 *             chunk into the row's running maximum and softmax denominator
 *             (a double) and picks up the label's logit when it lies in
 *             the chunk; after the last chunk one block writes stats and
 *             the mean loss (per-warp double totals summed in warp order,
 *             as cross_entropy does);
 *   backward  the chunk's logits again, a block per row turns them into
 *             g (softmax - onehot) from the saved stats (in place in f32,
 *             or into bf16 in ws for the bf16 GEMMs), then two GEMMs: dx
 *             accumulates dlogits_c w_c (the first chunk writes, later ones
 *             add, so dx sums the chunks in chunk order) and dw's rows of
 *             the chunk get beta dw + dlogits_c^T x.
 * Launches per step: 2 per chunk + 1 forward, 4 per chunk backward. All
 * reductions are fixed orders: the same bits on every run.
 */
#ifndef XM_RUNTIME_GPU_KERNELS_LOSS_CUH
#define XM_RUNTIME_GPU_KERNELS_LOSS_CUH

#include "runtime/gpu/kernels/gemm.cuh"
#include "runtime/gpu/kernels/norm.cuh"

/* dx rows accumulated over the chunks: beta 0 writes, else adds. */
struct xm_lmce_out_acc {
  float *p;
  int64_t ld;
  float beta;
};
XM_DEV void xm_gemm_put(const xm_lmce_out_acc &o, const xm_gemm_tile &t, int64_t m, int64_t n,
                        float v) {
  float *d = o.p + (t.row0 + m) * o.ld + n;
  *d = o.beta == 0.0f ? v : *d + v;
}

/* The scratch: running denominators (double), maxima, label logits, then
 * one chunk of logits (runtime/abi/workspace.h, xm_lm_ce_scratch_floats). */
XM_DEV double *xm_lmce_sum(float *scratch) { return (double *)scratch; }
XM_DEV float *xm_lmce_max(float *scratch, int64_t rows) { return scratch + 2 * rows; }
XM_DEV float *xm_lmce_tgt(float *scratch, int64_t rows) { return scratch + 3 * rows; }
static inline float *xm_lmce_logits(float *scratch, int64_t rows) { return scratch + 4 * rows; }

/* lg[rows, n] = x[rows, H] w_c[n, H]^T */
template <class S, class T>
XM_GLOBAL(XM_GEMM_THREADS)
k_lmce_logits(const T *x, const T *wc, float *lg, int64_t rows_, int64_t H_, int64_t n) {
  const int64_t rows = XM_DIM(S, rows, rows_), H = XM_DIM(S, H, H_);
  xm_gemm_dense_fwd<T>(x, wc, lg, rows, H, n);
}

/* One chunk [c0, c0 + n) folded into each row's running state. */
template <class S>
XM_GLOBAL(XM_TILE_THREADS)
k_lmce_update(const float *lg, const int32_t *labels, float *scratch, int64_t rows_, int64_t n,
              int64_t c0) {
  const int64_t rows = XM_DIM(S, rows, rows_);
  XM_SHARED(float, redf, XM_MAX_WARPS);
  XM_SHARED(double, redd, XM_MAX_WARPS);
  double *S_ = xm_lmce_sum(scratch);
  float *M = xm_lmce_max(scratch, rows), *tgt = xm_lmce_tgt(scratch, rows);
  for (int64_t r = xm_bid_x(); r < rows; r += xm_nbid_x()) {
    const float *lr = lg + r * n;
    float m;
    double sum;
    xm_norm_row_softmax_stats(lr, n, redf, redd, &m, &sum);
    if (xm_tid() == 0) {
      if (c0 == 0) {
        M[r] = m, S_[r] = sum;
      } else if (m > M[r]) {
        S_[r] = S_[r] * exp((double)M[r] - (double)m) + sum;
        M[r] = m;
      } else {
        S_[r] += sum * exp((double)m - (double)M[r]);
      }
      const int32_t lab = labels[r];
      if (lab >= c0 && lab < c0 + n) tgt[r] = lr[lab - c0];
    }
    xm_sync(); /* the shared reductions are reused by the next row */
  }
}

/* stats and the mean loss: a single block, warp w takes rows w, w + nw, ... */
template <class S>
XM_GLOBAL(XM_TILE_THREADS)
k_lmce_finish(const int32_t *labels, float *scratch, float *stats, float *loss, int64_t rows_,
              int64_t V_) {
  const int64_t rows = XM_DIM(S, rows, rows_), V = XM_DIM(S, V, V_);
  XM_SHARED(double, part, XM_MAX_WARPS);
  const double *S_ = xm_lmce_sum(scratch);
  const float *M = xm_lmce_max(scratch, rows), *tgt = xm_lmce_tgt(scratch, rows);
  const int lane = xm_lane(), wid = xm_warp_id(), nw = xm_nwarps();
  double total = 0.0;
  for (int64_t r = (int64_t)wid * XM_WARP + lane; r < rows; r += (int64_t)nw * XM_WARP) {
    stats[2 * r] = M[r];
    stats[2 * r + 1] = (float)S_[r];
    const int32_t lab = labels[r];
    if (lab >= 0 && lab < V) total += (double)M[r] + log(S_[r]) - (double)tgt[r];
  }
  total = xm_norm_warp_sum_d(total);
  if (lane == 0) part[wid] = total;
  xm_sync();
  if (xm_tid() == 0) {
    double t = 0.0;
    for (int i = 0; i < nw; i++) t += part[i];
    *loss = rows > 0 ? (float)(t / (double)rows) : 0.0f;
  }
}

/* The chunk's logit gradient: g (softmax - onehot), g = *dloss / rows, as
 * cross_entropy_grad computes it, into out (f32 in place, or bf16). A row
 * whose label lies outside [0, V) gets zeros. A block per row. */
template <class S, class TD>
XM_GLOBAL(XM_TILE_THREADS)
k_lmce_dlogits(const float *dloss, const float *lg, const int32_t *labels, const float *stats,
               TD *out, int64_t rows_, int64_t V_, int64_t n, int64_t c0) {
  const int64_t rows = XM_DIM(S, rows, rows_), V = XM_DIM(S, V, V_);
  const double g = (double)dloss[0] / (double)rows;
  for (int64_t r = xm_bid_x(); r < rows; r += xm_nbid_x()) {
    const float *lr = lg + r * n;
    TD *dr = out + r * n;
    const int32_t lab = labels[r];
    if (lab < 0 || lab >= V) { /* block-uniform */
      for (int64_t j = xm_tid(); j < n; j += xm_ntid()) xm_st(dr, j, 0.0f);
      continue;
    }
    const float m = stats[2 * r];
    const double sum = (double)stats[2 * r + 1];
    const float c = (float)(g / sum);
    for (int64_t j = xm_tid(); j < n; j += xm_ntid())
      xm_st(dr, j, xm_norm_dlogit(lr[j], m, sum, c, g, c0 + j == lab));
  }
}

/* dx[rows, H] (+)= dl[rows, n] w_c[n, H] */
template <class S, class T>
XM_GLOBAL(XM_GEMM_THREADS)
k_lmce_dx(const T *dl, const T *wc, float *dx, int64_t rows_, int64_t H_, int64_t n, float beta) {
  const int64_t rows = XM_DIM(S, rows, rows_), H = XM_DIM(S, H, H_);
  const xm_gemm_rows<T, false> a = {dl, n};
  const xm_gemm_weight<T, true> b = {wc, H, 0};
  const xm_lmce_out_acc o = {dx, H, beta};
  xm_gemm_run_rows<T>(nullptr, 1, rows, 0, INT64_MAX, H, n, a, b, o);
}

/* dw_c[n, H] = beta dw_c + dl[rows, n]^T x[rows, H] */
template <class S, class T>
XM_GLOBAL(XM_GEMM_THREADS)
k_lmce_dw(const T *dl, const T *x, float *dwc, int64_t rows_, int64_t H_, int64_t n, float beta) {
  const int64_t rows = XM_DIM(S, rows, rows_), H = XM_DIM(S, H, H_);
  xm_gemm_dense_dw<T>(dl, x, dwc, rows, H, n, beta);
}

static inline int64_t xm_lmce_cols(int64_t V, int64_t chunk, int64_t c0) {
  return V - c0 < chunk ? V - c0 : chunk;
}

/* The sizes every launcher reads: rows, H, V and the chunk (at least 1). */
#define XM_LMCE_SIZES                                                                              \
  const int64_t rows = XM_DIM(S, rows, rows_), H = XM_DIM(S, H, H_), V = XM_DIM(S, V, V_);        \
  const int64_t chunk = XM_DIM(S, chunk, chunk_) < 1 ? 1 : XM_DIM(S, chunk, chunk_);             \
  float *lg = xm_lmce_logits(scratch, rows)

template <class S, class T>
void xm_lmce_forward(const char *name, xm_stream_t s, const T *x, const T *w,
                     const int32_t *labels, float *loss, float *stats, int64_t rows_, int64_t H_,
                     int64_t V_, int64_t chunk_, float *scratch) {
  XM_LMCE_SIZES;
  for (int64_t c0 = 0; c0 < V; c0 += chunk) {
    const int64_t n = xm_lmce_cols(V, chunk, c0);
    xm_launch(name, xm_gemm_grid_dense(rows, n), 1, 1, XM_GEMM_THREADS, s, &k_lmce_logits<S, T>, x,
              w + c0 * H, lg, rows_, H_, n);
    xm_launch(name, xm_grid_1d(rows, 1), 1, 1, XM_TILE_THREADS, s, &k_lmce_update<S>, lg, labels,
              scratch, rows_, n, c0);
  }
  /* always one block: rows == 0 still writes the 0 loss */
  xm_launch(name, 1, 1, 1, XM_TILE_THREADS, s, &k_lmce_finish<S>, labels, scratch, stats, loss,
            rows_, V_);
}

/* dl: where the logit gradient goes (the f32 logits themselves, or bf16
 * in ws). */
template <class S, class T>
void xm_lmce_backward(const char *name, xm_stream_t s, const float *dloss, const T *x, const T *w,
                      const int32_t *labels, const float *stats, float *dw, float *dx,
                      int64_t rows_, int64_t H_, int64_t V_, int64_t chunk_, float beta,
                      float *scratch, T *dl) {
  XM_LMCE_SIZES;
  for (int64_t c0 = 0; c0 < V; c0 += chunk) {
    const int64_t n = xm_lmce_cols(V, chunk, c0);
    const T *wc = w + c0 * H;
    xm_launch(name, xm_gemm_grid_dense(rows, n), 1, 1, XM_GEMM_THREADS, s, &k_lmce_logits<S, T>, x,
              wc, lg, rows_, H_, n);
    xm_launch(name, xm_grid_1d(rows, 1), 1, 1, XM_TILE_THREADS, s, &k_lmce_dlogits<S, T>, dloss,
              (const float *)lg, labels, stats, dl, rows_, V_, n, c0);
    xm_launch(name, xm_gemm_grid_dense(rows, H), 1, 1, XM_GEMM_THREADS, s, &k_lmce_dx<S, T>,
              (const T *)dl, wc, dx, rows_, H_, n, c0 == 0 ? 0.0f : 1.0f);
    /* dw's rows of the chunk; with no rows, beta 0 still writes zeros */
    xm_launch(name, xm_gemm_grid_dw(1, n, H), 1, 1, XM_GEMM_THREADS, s, &k_lmce_dw<S, T>,
              (const T *)dl, x, dw + c0 * H, rows_, H_, n, beta);
  }
}

template <class S>
void xm_g_lm_head_ce(xm_stream_t s, const float *x, const float *w, const int32_t *labels,
                     float *loss, float *stats, int64_t rows_, int64_t H_, int64_t V_,
                     int64_t chunk_, float *scratch) {
  xm_lmce_forward<S, float>("lm_head_ce", s, x, w, labels, loss, stats, rows_, H_, V_, chunk_,
                            scratch);
}
XM_G_TABLE(lm_head_ce)

template <class S>
void xm_g_lm_head_ce_grad(xm_stream_t s, const float *dloss, const float *x, const float *w,
                          const int32_t *labels, const float *stats, float *dw, float *dx,
                          int64_t rows_, int64_t H_, int64_t V_, int64_t chunk_, float beta,
                          float *scratch) {
  const int64_t rows = XM_DIM(S, rows, rows_);
  xm_lmce_backward<S, float>("lm_head_ce_grad", s, dloss, x, w, labels, stats, dw, dx, rows_, H_,
                             V_, chunk_, beta, scratch, xm_lmce_logits(scratch, rows));
}
XM_G_TABLE(lm_head_ce_grad)

template <class S>
void xm_g_lm_head_ce_bf16(xm_stream_t s, const xm_bf16 *x, const xm_bf16 *w,
                          const int32_t *labels, float *loss, float *stats, int64_t rows_,
                          int64_t H_, int64_t V_, int64_t chunk_, float *scratch, float *ws) {
  (void)ws; /* the MMA reads bf16 directly */
  xm_lmce_forward<S, xm_bf16>("lm_head_ce_bf16", s, x, w, labels, loss, stats, rows_, H_, V_,
                              chunk_, scratch);
}
XM_G_TABLE(lm_head_ce_bf16)

template <class S>
void xm_g_lm_head_ce_grad_bf16(xm_stream_t s, const float *dloss, const xm_bf16 *x,
                               const xm_bf16 *w, const int32_t *labels, const float *stats,
                               float *dw, float *dx, int64_t rows_, int64_t H_, int64_t V_,
                               int64_t chunk_, float beta, float *scratch, float *ws) {
  xm_lmce_backward<S, xm_bf16>("lm_head_ce_grad_bf16", s, dloss, x, w, labels, stats, dw, dx,
                               rows_, H_, V_, chunk_, beta, scratch, (xm_bf16 *)ws);
}
XM_G_TABLE(lm_head_ce_grad_bf16)

#endif /* XM_RUNTIME_GPU_KERNELS_LOSS_CUH */
