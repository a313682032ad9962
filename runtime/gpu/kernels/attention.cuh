/* runtime/gpu/kernels/attention.cuh — causal GQA attention and its gradient
 * as flash-style GPU templates (semantics: runtime/cpu/kernels.h and
 * runtime/cpu/kernels_attn.c): q[B,S,Hq,D], k[B,S,Hkv,D], v[B,S,Hkv,Dv] ->
 * out[B,S,Hq,Dv], query head h reads kv head h / (Hq/Hkv), all f32. The
 * S x S score matrix is never formed: work goes in tiles of T =
 * XM_TILE_ATTN_T query rows by T keys.
 *
 * Threads (blocks of XM_TILE_THREADS): thread (g, c) = (tid / T, tid % T)
 * owns the tile rows g + G*i (G = threads / T row groups, i < RPT) and the
 * tile column c; its output columns are c + T*j of the current output
 * chunk of XM_TILE_ATTN_DO columns (j < OPT). A row's T columns are the T
 * lanes of one row group, which lies inside one warp (T divides the warp
 * on both targets), so row maxima and sums are xor butterflies over the
 * group. Dot products run over the head dimension in chunks of
 * XM_TILE_ATTN_DC staged in shared memory (the row side is staged once
 * when the dimension fits one chunk); output columns beyond one chunk of
 * XM_TILE_ATTN_DO take further passes that recompute the scores, so any
 * D, Dv fit the same fixed shared memory (about 37-45 KB).
 *
 *   - attention: a block per (query tile, batch, query head), the last
 *     (longest) tiles first. It loops over the key tiles up to the causal
 *     limit: scores = scale q k^T, online softmax (running max and sum per
 *     row), out += P v accumulated in registers, normalised at the end.
 *     The workspace is not used.
 *   - attention_grad: the softmax statistics are recomputed, never read.
 *     (1) dq kernel, a block per (query tile, (batch, query head) pair):
 *     a first pass over the causal key tiles gives per row the log-sum-exp
 *     and Dst_i = sum_j P_ij dP_ij (dP = dout v^T) online; a second pass
 *     forms dS = P (dP - Dst) and dq = scale dS k. It also writes the two
 *     statistics per row into ws. (2) dk/dv kernel, a block per (key tile,
 *     (batch, kv head) group): it walks the query heads of the group, then
 *     the query tiles from the diagonal on, in that fixed order, recomputes
 *     P and dS from the statistics in ws and accumulates dv = P^T dout and
 *     dk = scale dS^T q in registers. No atomics: every output element has
 *     one owner thread. ws holds 2 S floats per (batch, query head) pair;
 *     when xm_ws_attention_grad's size holds fewer pairs than B*Hq, the
 *     pairs go in batches (ordered by pair = b*Hq + h, so a group's heads
 *     are consecutive): dq then dk/dv per batch, and a group split across
 *     batches carries its partial dk/dv through the outputs (the same sums
 *     in the same order as in one batch).
 *
 * New constants (this file only): XM_TILE_ATTN_T, XM_TILE_ATTN_DC,
 * XM_TILE_ATTN_DO.
 */
#ifndef XM_RUNTIME_GPU_KERNELS_ATTENTION_CUH
#define XM_RUNTIME_GPU_KERNELS_ATTENTION_CUH

#include "runtime/gpu/kernels/common.cuh"

#include "runtime/abi/workspace.h"

#if defined(XM_TARGET_AMD)
/* Query rows and keys per tile (a power of two dividing the warp). */
#define XM_TILE_ATTN_T 32
/* Head-dimension chunk of the staged dot-product operands. */
#define XM_TILE_ATTN_DC 64
/* Output columns a block accumulates per pass. */
#define XM_TILE_ATTN_DO 128
#else
#define XM_TILE_ATTN_T 32
#define XM_TILE_ATTN_DC 64
#define XM_TILE_ATTN_DO 128
#endif

#define XM_ATTN_T XM_TILE_ATTN_T
#define XM_ATTN_DC XM_TILE_ATTN_DC
#define XM_ATTN_DO XM_TILE_ATTN_DO
/* Row groups of a block, tile rows and output columns per thread. */
#define XM_ATTN_G (XM_TILE_THREADS / XM_ATTN_T)
#define XM_ATTN_RPT (XM_ATTN_T / XM_ATTN_G)
#define XM_ATTN_OPT (XM_ATTN_DO / XM_ATTN_T)
/* Shared floats of the key-side staging buffer (dot chunks and output
 * operands take turns in it). */
#define XM_ATTN_BX                                                                                 \
  (XM_ATTN_T * (XM_ATTN_DC + 1) > XM_ATTN_T * XM_ATTN_DO ? XM_ATTN_T * (XM_ATTN_DC + 1)          \
                                                          : XM_ATTN_T * XM_ATTN_DO)
/* Row stride of the T x T weight tile (padded: no bank conflicts). */
#define XM_ATTN_WLD (XM_ATTN_T + 1)

static_assert((XM_ATTN_T & (XM_ATTN_T - 1)) == 0 && XM_WARP % XM_ATTN_T == 0,
              "XM_TILE_ATTN_T: a power of two dividing the warp");
static_assert(XM_TILE_THREADS % XM_ATTN_T == 0 && XM_ATTN_T % XM_ATTN_G == 0,
              "the block's row groups must cover the tile rows evenly");
static_assert(XM_ATTN_DO % XM_ATTN_T == 0, "XM_TILE_ATTN_DO: a multiple of XM_TILE_ATTN_T");

/* Xs[r * LD + d] = X[r * ldx + col0 + d] for the T x COLS tile, 0 where
 * r >= nrows or col0 + d >= ncols. Consecutive threads take consecutive
 * columns. No barrier. */
template <int COLS, int LD>
XM_DEV void attn_stage(float *Xs, const float *X, int64_t ldx, int64_t nrows, int64_t col0,
                       int64_t ncols) {
  for (int idx = xm_tid(); idx < XM_ATTN_T * COLS; idx += xm_ntid()) {
    const int r = idx / COLS, d = idx % COLS;
    float x = 0.0f;
    if (r < nrows && col0 + d < ncols) x = X[(int64_t)r * ldx + col0 + d];
    Xs[r * LD + d] = x;
  }
}

/* acc[i] += A[r_i] . Bm[c] over dim: A is the tile's row side (na valid
 * rows of stride lda), Bm its column side (nb valid rows of stride ldb).
 * A is staged through As chunk by chunk, or, when a_staged (dim fits one
 * chunk), was staged by the caller once; Bm goes through Bs. Barriers
 * inside: every thread calls. */
XM_DEV void attn_dots(float *acc, const float *A, int64_t lda, int64_t na, bool a_staged,
                      const float *Bm, int64_t ldb, int64_t nb, int64_t dim, float *As,
                      float *Bs) {
  const int g = xm_tid() / XM_ATTN_T, c = xm_tid() % XM_ATTN_T;
  for (int64_t d0 = 0; d0 < dim; d0 += XM_ATTN_DC) {
    if (!a_staged) attn_stage<XM_ATTN_DC, XM_ATTN_DC>(As, A, lda, na, d0, dim);
    attn_stage<XM_ATTN_DC, XM_ATTN_DC + 1>(Bs, Bm, ldb, nb, d0, dim);
    xm_sync();
    const int nd = dim - d0 < XM_ATTN_DC ? (int)(dim - d0) : XM_ATTN_DC;
    for (int d = 0; d < nd; d++) {
      const float b = Bs[c * (XM_ATTN_DC + 1) + d];
      for (int i = 0; i < XM_ATTN_RPT; i++) acc[i] += As[(g + XM_ATTN_G * i) * XM_ATTN_DC + d] * b;
    }
    xm_sync();
  }
}

/* acc[i][j] += sum_k W[r_i][k] X[k][o0 + c + T*j]: W is the T x T weight
 * tile in shared memory (written before the call), X the tile's nx valid
 * rows of stride ldx, columns [o0, o0 + DO) of ncols staged through Xs.
 * Barriers inside: every thread calls. */
XM_DEV void attn_accum(float (*acc)[XM_ATTN_OPT], const float *Ws, const float *X, int64_t ldx,
                       int64_t nx, int64_t o0, int64_t ncols, float *Xs) {
  const int g = xm_tid() / XM_ATTN_T, c = xm_tid() % XM_ATTN_T;
  attn_stage<XM_ATTN_DO, XM_ATTN_DO>(Xs, X, ldx, nx, o0, ncols);
  xm_sync();
  for (int kk = 0; kk < XM_ATTN_T; kk++) {
    float w[XM_ATTN_RPT];
    for (int i = 0; i < XM_ATTN_RPT; i++) w[i] = Ws[(g + XM_ATTN_G * i) * XM_ATTN_WLD + kk];
    for (int j = 0; j < XM_ATTN_OPT; j++) {
      const float x = Xs[kk * XM_ATTN_DO + c + XM_ATTN_T * j];
      for (int i = 0; i < XM_ATTN_RPT; i++) acc[i][j] += w[i] * x;
    }
  }
  xm_sync();
}

/* Maximum and sum over the T lanes of a row group (all lanes get it). */
XM_DEV float attn_row_max(float v) {
  for (int m = XM_ATTN_T / 2; m > 0; m >>= 1) {
    const float o = xm_shfl_xor(v, m);
    v = o > v ? o : v;
  }
  return v;
}
XM_DEV float attn_row_sum(float v) {
  for (int m = XM_ATTN_T / 2; m > 0; m >>= 1) v += xm_shfl_xor(v, m);
  return v;
}

XM_DEV int64_t attn_min(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---- attention ------------------------------------------------------------ */

/* One block per (query tile, batch, query head), tiles from the last. */
template <class Sh>
XM_GLOBAL(XM_TILE_THREADS)
k_attention(const float *q, const float *k, const float *v, float *out, int64_t B_, int64_t S_,
            int64_t Hq_, int64_t Hkv_, int64_t D_, int64_t Dv_, float scale) {
  const int64_t B = XM_DIM(Sh, B, B_), S = XM_DIM(Sh, S, S_), Hq = XM_DIM(Sh, Hq, Hq_);
  const int64_t Hkv = XM_DIM(Sh, Hkv, Hkv_), D = XM_DIM(Sh, D, D_), Dv = XM_DIM(Sh, Dv, Dv_);
  XM_SHARED(float, As, XM_ATTN_T * XM_ATTN_DC);
  XM_SHARED(float, BXs, XM_ATTN_BX);
  XM_SHARED(float, Ws, XM_ATTN_T * XM_ATTN_WLD);
  const int g = xm_tid() / XM_ATTN_T, c = xm_tid() % XM_ATTN_T;
  const int64_t ntile = xm_cdiv(S, XM_ATTN_T), bid = xm_bid_x();
  const int64_t bh = bid % (B * Hq), t = ntile - 1 - bid / (B * Hq);
  const int64_t b = bh / Hq, h = bh % Hq, hk = h / (Hq / Hkv);
  const int64_t i0 = t * XM_ATTN_T, nq = attn_min(XM_ATTN_T, S - i0), kend = i0 + nq;
  const int64_t ldq = Hq * D, ldk = Hkv * D, ldv = Hkv * Dv, ldo = Hq * Dv;
  const float *qt = q + ((b * S + i0) * Hq + h) * D;
  const float *kb = k + (b * S * Hkv + hk) * D, *vb = v + (b * S * Hkv + hk) * Dv;
  float *ot = out + ((b * S + i0) * Hq + h) * Dv;
  const bool q_staged = D <= XM_ATTN_DC;
  if (q_staged) attn_stage<XM_ATTN_DC, XM_ATTN_DC>(As, qt, ldq, nq, 0, D);
  for (int64_t o0 = 0; o0 < Dv; o0 += XM_ATTN_DO) {
    float m[XM_ATTN_RPT], l[XM_ATTN_RPT], acc[XM_ATTN_RPT][XM_ATTN_OPT];
    for (int i = 0; i < XM_ATTN_RPT; i++) {
      m[i] = -INFINITY;
      l[i] = 0.0f;
      for (int j = 0; j < XM_ATTN_OPT; j++) acc[i][j] = 0.0f;
    }
    for (int64_t j0 = 0; j0 < kend; j0 += XM_ATTN_T) {
      const int64_t nk = attn_min(XM_ATTN_T, S - j0), j = j0 + c;
      float sc[XM_ATTN_RPT] = {};
      attn_dots(sc, qt, ldq, nq, q_staged, kb + j0 * ldk, ldk, nk, D, As, BXs);
      for (int i = 0; i < XM_ATTN_RPT; i++) {
        const int r = g + XM_ATTN_G * i;
        /* rows past S mask like row S-1: key 0 keeps every row finite */
        const bool valid = j <= attn_min(i0 + r, S - 1);
        const float z = valid ? sc[i] * scale : -INFINITY;
        const float mn = fmaxf(m[i], attn_row_max(z));
        const float p = valid ? expf(z - mn) : 0.0f;
        const float alpha = expf(m[i] - mn); /* 0 on the first tile */
        l[i] = l[i] * alpha + attn_row_sum(p);
        m[i] = mn;
        for (int jj = 0; jj < XM_ATTN_OPT; jj++) acc[i][jj] *= alpha;
        Ws[r * XM_ATTN_WLD + c] = p;
      }
      attn_accum(acc, Ws, vb + j0 * ldv, ldv, nk, o0, Dv, BXs);
    }
    for (int i = 0; i < XM_ATTN_RPT; i++) {
      const int r = g + XM_ATTN_G * i;
      if (r >= nq) continue;
      const float inv = 1.0f / l[i];
      for (int jj = 0; jj < XM_ATTN_OPT; jj++) {
        const int64_t col = o0 + c + XM_ATTN_T * jj;
        if (col < Dv) ot[r * ldo + col] = acc[i][jj] * inv;
      }
    }
  }
}

template <class Sh>
void xm_g_attention(xm_stream_t s, const float *q, const float *k, const float *v, float *out,
                    int64_t B_, int64_t S_, int64_t Hq_, int64_t Hkv_, int64_t D_, int64_t Dv_,
                    float scale, float *ws) {
  const int64_t B = XM_DIM(Sh, B, B_), S = XM_DIM(Sh, S, S_), Hq = XM_DIM(Sh, Hq, Hq_);
  const int64_t Hkv = XM_DIM(Sh, Hkv, Hkv_), D = XM_DIM(Sh, D, D_), Dv = XM_DIM(Sh, Dv, Dv_);
  (void)ws;
  if (B <= 0 || S <= 0 || Hq <= 0 || Hkv <= 0) return;
  xm_launch("attention", xm_cdiv(S, XM_ATTN_T) * B * Hq, 1, 1, XM_TILE_THREADS, s,
            &k_attention<Sh>, q, k, v, out, B, S, Hq, Hkv, D, Dv, scale);
}
XM_G_TABLE(attention)

/* ---- attention_grad ------------------------------------------------------- */

/* dq of the pairs [p0, p0 + np) (pair = b*Hq + h): a block per (query tile,
 * pair), tiles from the last. Pass 1 recomputes each row's log-sum-exp and
 * Dst = sum_j P dP online and stores them at ws + (pair - p0) * 2S (lse
 * at [i], Dst at [S + i]); pass 2 accumulates dq = scale dS k. */
template <class Sh>
XM_GLOBAL(XM_TILE_THREADS)
k_attention_grad_dq(const float *dout, const float *q, const float *k, const float *v, float *dq,
                    float *ws, int64_t B_, int64_t S_, int64_t Hq_, int64_t Hkv_, int64_t D_,
                    int64_t Dv_, float scale, int64_t p0, int64_t np) {
  const int64_t S = XM_DIM(Sh, S, S_), Hq = XM_DIM(Sh, Hq, Hq_);
  const int64_t Hkv = XM_DIM(Sh, Hkv, Hkv_), D = XM_DIM(Sh, D, D_), Dv = XM_DIM(Sh, Dv, Dv_);
  (void)B_;
  XM_SHARED(float, Aq, XM_ATTN_T * XM_ATTN_DC);
  XM_SHARED(float, Ado, XM_ATTN_T * XM_ATTN_DC);
  XM_SHARED(float, BXs, XM_ATTN_BX);
  XM_SHARED(float, Ws, XM_ATTN_T * XM_ATTN_WLD);
  const int g = xm_tid() / XM_ATTN_T, c = xm_tid() % XM_ATTN_T;
  const int64_t ntile = xm_cdiv(S, XM_ATTN_T), bid = xm_bid_x();
  const int64_t t = ntile - 1 - bid / np, pr = p0 + bid % np;
  const int64_t b = pr / Hq, h = pr % Hq, hk = h / (Hq / Hkv);
  const int64_t i0 = t * XM_ATTN_T, nq = attn_min(XM_ATTN_T, S - i0), kend = i0 + nq;
  const int64_t ldq = Hq * D, ldk = Hkv * D, ldv = Hkv * Dv, ldo = Hq * Dv;
  const float *qt = q + ((b * S + i0) * Hq + h) * D;
  const float *dot = dout + ((b * S + i0) * Hq + h) * Dv;
  const float *kb = k + (b * S * Hkv + hk) * D, *vb = v + (b * S * Hkv + hk) * Dv;
  float *dqt = dq + ((b * S + i0) * Hq + h) * D;
  float *st = ws + (pr - p0) * 2 * S;
  const bool q_staged = D <= XM_ATTN_DC, do_staged = Dv <= XM_ATTN_DC;
  if (q_staged) attn_stage<XM_ATTN_DC, XM_ATTN_DC>(Aq, qt, ldq, nq, 0, D);
  if (do_staged) attn_stage<XM_ATTN_DC, XM_ATTN_DC>(Ado, dot, ldo, nq, 0, Dv);

  /* pass 1: running max m, sum l and sum of p dP (both scaled by e^-m) */
  float m[XM_ATTN_RPT], l[XM_ATTN_RPT], pd[XM_ATTN_RPT];
  for (int i = 0; i < XM_ATTN_RPT; i++) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
    pd[i] = 0.0f;
  }
  for (int64_t j0 = 0; j0 < kend; j0 += XM_ATTN_T) {
    const int64_t nk = attn_min(XM_ATTN_T, S - j0), j = j0 + c;
    float sc[XM_ATTN_RPT] = {}, dp[XM_ATTN_RPT] = {};
    attn_dots(sc, qt, ldq, nq, q_staged, kb + j0 * ldk, ldk, nk, D, Aq, BXs);
    attn_dots(dp, dot, ldo, nq, do_staged, vb + j0 * ldv, ldv, nk, Dv, Ado, BXs);
    for (int i = 0; i < XM_ATTN_RPT; i++) {
      const bool valid = j <= attn_min(i0 + g + XM_ATTN_G * i, S - 1);
      const float z = valid ? sc[i] * scale : -INFINITY;
      const float mn = fmaxf(m[i], attn_row_max(z));
      const float p = valid ? expf(z - mn) : 0.0f;
      const float alpha = expf(m[i] - mn);
      l[i] = l[i] * alpha + attn_row_sum(p);
      pd[i] = pd[i] * alpha + attn_row_sum(p * dp[i]);
      m[i] = mn;
    }
  }
  float lse[XM_ATTN_RPT], dst[XM_ATTN_RPT];
  for (int i = 0; i < XM_ATTN_RPT; i++) {
    const int64_t r = g + XM_ATTN_G * i;
    lse[i] = m[i] + logf(l[i]);
    dst[i] = pd[i] / l[i];
    if (c == 0 && r < nq) {
      st[i0 + r] = lse[i];
      st[S + i0 + r] = dst[i];
    }
  }

  /* pass 2: dS = P (dP - Dst), dq = scale dS k, per chunk of D columns */
  for (int64_t o0 = 0; o0 < D; o0 += XM_ATTN_DO) {
    float acc[XM_ATTN_RPT][XM_ATTN_OPT] = {};
    for (int64_t j0 = 0; j0 < kend; j0 += XM_ATTN_T) {
      const int64_t nk = attn_min(XM_ATTN_T, S - j0), j = j0 + c;
      float sc[XM_ATTN_RPT] = {}, dp[XM_ATTN_RPT] = {};
      attn_dots(sc, qt, ldq, nq, q_staged, kb + j0 * ldk, ldk, nk, D, Aq, BXs);
      attn_dots(dp, dot, ldo, nq, do_staged, vb + j0 * ldv, ldv, nk, Dv, Ado, BXs);
      for (int i = 0; i < XM_ATTN_RPT; i++) {
        const int r = g + XM_ATTN_G * i;
        const bool valid = j <= attn_min(i0 + r, S - 1);
        const float p = valid ? expf(sc[i] * scale - lse[i]) : 0.0f;
        Ws[r * XM_ATTN_WLD + c] = p * (dp[i] - dst[i]);
      }
      attn_accum(acc, Ws, kb + j0 * ldk, ldk, nk, o0, D, BXs);
    }
    for (int i = 0; i < XM_ATTN_RPT; i++) {
      const int r = g + XM_ATTN_G * i;
      if (r >= nq) continue;
      for (int jj = 0; jj < XM_ATTN_OPT; jj++) {
        const int64_t col = o0 + c + XM_ATTN_T * jj;
        if (col < D) dqt[r * ldq + col] = scale * acc[i][jj];
      }
    }
  }
}

/* dk, dv of the groups (b*Hkv + hk) that the pairs [p0, p1) touch: a block
 * per (key tile, group). It adds the pairs of its group inside [p0, p1)
 * in head order, each over the query tiles from the diagonal on, reading
 * the statistics k_attention_grad_dq left in ws; a group whose earlier
 * heads belong to a previous batch starts from the dk/dv written then. */
template <class Sh>
XM_GLOBAL(XM_TILE_THREADS)
k_attention_grad_dkdv(const float *dout, const float *q, const float *k, const float *v,
                      float *dk, float *dv, const float *ws, int64_t B_, int64_t S_,
                      int64_t Hq_, int64_t Hkv_, int64_t D_, int64_t Dv_, float scale,
                      int64_t p0, int64_t p1) {
  const int64_t S = XM_DIM(Sh, S, S_), Hq = XM_DIM(Sh, Hq, Hq_);
  const int64_t Hkv = XM_DIM(Sh, Hkv, Hkv_), D = XM_DIM(Sh, D, D_), Dv = XM_DIM(Sh, Dv, Dv_);
  (void)B_;
  XM_SHARED(float, Ak, XM_ATTN_T * XM_ATTN_DC);
  XM_SHARED(float, Av, XM_ATTN_T * XM_ATTN_DC);
  XM_SHARED(float, BXs, XM_ATTN_BX);
  XM_SHARED(float, Ws, XM_ATTN_T * XM_ATTN_WLD);
  const int g = xm_tid() / XM_ATTN_T, c = xm_tid() % XM_ATTN_T;
  const int64_t G = Hq / Hkv, grp0 = p0 / G, ngrp = (p1 - 1) / G + 1 - grp0;
  const int64_t bid = xm_bid_x(), t = bid / ngrp, grp = grp0 + bid % ngrp;
  const int64_t b = grp / Hkv, hk = grp % Hkv;
  const int64_t ha = p0 > grp * G ? p0 : grp * G, hb = p1 < grp * G + G ? p1 : grp * G + G;
  const int64_t j0 = t * XM_ATTN_T, nk = attn_min(XM_ATTN_T, S - j0);
  const int64_t ldq = Hq * D, ldk = Hkv * D, ldv = Hkv * Dv, ldo = Hq * Dv;
  const float *kt = k + ((b * S + j0) * Hkv + hk) * D, *vt = v + ((b * S + j0) * Hkv + hk) * Dv;
  float *dkt = dk + ((b * S + j0) * Hkv + hk) * D, *dvt = dv + ((b * S + j0) * Hkv + hk) * Dv;
  const bool k_staged = D <= XM_ATTN_DC, v_staged = Dv <= XM_ATTN_DC;
  if (k_staged) attn_stage<XM_ATTN_DC, XM_ATTN_DC>(Ak, kt, ldk, nk, 0, D);
  if (v_staged) attn_stage<XM_ATTN_DC, XM_ATTN_DC>(Av, vt, ldv, nk, 0, Dv);
  const bool cont = ha > grp * G; /* earlier heads of the group already summed */
  const int64_t ncol = D > Dv ? D : Dv;
  for (int64_t o0 = 0; o0 < ncol; o0 += XM_ATTN_DO) {
    float ak[XM_ATTN_RPT][XM_ATTN_OPT], av[XM_ATTN_RPT][XM_ATTN_OPT];
    for (int i = 0; i < XM_ATTN_RPT; i++) {
      const int r = g + XM_ATTN_G * i;
      for (int jj = 0; jj < XM_ATTN_OPT; jj++) {
        const int64_t col = o0 + c + XM_ATTN_T * jj;
        ak[i][jj] = cont && r < nk && col < D ? dkt[r * ldk + col] : 0.0f;
        av[i][jj] = cont && r < nk && col < Dv ? dvt[r * ldv + col] : 0.0f;
      }
    }
    for (int64_t pr = ha; pr < hb; pr++) {
      const int64_t h = pr - b * Hq;
      const float *st = ws + (pr - p0) * 2 * S;
      const float *qb = q + (b * S * Hq + h) * D, *dob = dout + (b * S * Hq + h) * Dv;
      for (int64_t i0 = j0; i0 < S; i0 += XM_ATTN_T) {
        const int64_t nq = attn_min(XM_ATTN_T, S - i0), qi = i0 + c;
        float sc[XM_ATTN_RPT] = {}, dp[XM_ATTN_RPT] = {};
        attn_dots(sc, kt, ldk, nk, k_staged, qb + i0 * ldq, ldq, nq, D, Ak, BXs);
        attn_dots(dp, vt, ldv, nk, v_staged, dob + i0 * ldo, ldo, nq, Dv, Av, BXs);
        const bool qv = qi < S;
        const float lse = qv ? st[qi] : 0.0f, dst = qv ? st[S + qi] : 0.0f;
        float p[XM_ATTN_RPT];
        for (int i = 0; i < XM_ATTN_RPT; i++) {
          const int r = g + XM_ATTN_G * i;
          p[i] = qv && j0 + r <= qi ? expf(sc[i] * scale - lse) : 0.0f;
          Ws[r * XM_ATTN_WLD + c] = p[i];
        }
        if (o0 < Dv) attn_accum(av, Ws, dob + i0 * ldo, ldo, nq, o0, Dv, BXs);
        if (o0 < D) {
          /* attn_accum ended on a barrier: Ws is free again */
          for (int i = 0; i < XM_ATTN_RPT; i++)
            Ws[(g + XM_ATTN_G * i) * XM_ATTN_WLD + c] = scale * p[i] * (dp[i] - dst);
          attn_accum(ak, Ws, qb + i0 * ldq, ldq, nq, o0, D, BXs);
        }
      }
    }
    for (int i = 0; i < XM_ATTN_RPT; i++) {
      const int r = g + XM_ATTN_G * i;
      if (r >= nk) continue;
      for (int jj = 0; jj < XM_ATTN_OPT; jj++) {
        const int64_t col = o0 + c + XM_ATTN_T * jj;
        if (col < D) dkt[r * ldk + col] = ak[i][jj];
        if (col < Dv) dvt[r * ldv + col] = av[i][jj];
      }
    }
  }
}

template <class Sh>
void xm_g_attention_grad(xm_stream_t s, const float *dout, const float *q, const float *k,
                         const float *v, float *dq, float *dk, float *dv, int64_t B_, int64_t S_,
                         int64_t Hq_, int64_t Hkv_, int64_t D_, int64_t Dv_, float scale,
                         float *ws) {
  const int64_t B = XM_DIM(Sh, B, B_), S = XM_DIM(Sh, S, S_), Hq = XM_DIM(Sh, Hq, Hq_);
  const int64_t Hkv = XM_DIM(Sh, Hkv, Hkv_), D = XM_DIM(Sh, D, D_), Dv = XM_DIM(Sh, Dv, Dv_);
  if (B <= 0 || S <= 0 || Hq <= 0 || Hkv <= 0) return;
  const int64_t G = Hq / Hkv, npairs = B * Hq, ntile = xm_cdiv(S, XM_ATTN_T);
  /* pairs whose statistics (2 S floats each) fit the documented ws: at
   * least min(slots, B*Hkv) * min(S, XM_WS_ATTN_TILE) >= 1 */
  const int64_t cap = xm_ws_attention_grad(B, S, Hkv) / (int64_t)sizeof(float) / (2 * S);
  if (cap <= 0) return;
  for (int64_t p0 = 0; p0 < npairs; p0 += cap) {
    const int64_t p1 = p0 + cap < npairs ? p0 + cap : npairs;
    const int64_t ngrp = (p1 - 1) / G + 1 - p0 / G;
    xm_launch("attention_grad", ntile * (p1 - p0), 1, 1, XM_TILE_THREADS, s,
              &k_attention_grad_dq<Sh>, dout, q, k, v, dq, ws, B, S, Hq, Hkv, D, Dv, scale, p0,
              p1 - p0);
    xm_launch("attention_grad", ntile * ngrp, 1, 1, XM_TILE_THREADS, s,
              &k_attention_grad_dkdv<Sh>, dout, q, k, v, dk, dv, (const float *)ws, B, S, Hq,
              Hkv, D, Dv, scale, p0, p1);
  }
}
XM_G_TABLE(attention_grad)

#endif
