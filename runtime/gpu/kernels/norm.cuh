/* runtime/gpu/kernels/norm.cuh — row-wise normalisation, RoPE and the
 * cross-entropy loss on the GPU: rmsnorm, rmsnorm_grad, rope, rope_grad,
 * cross_entropy, cross_entropy_grad (runtime/abi/kernels.def; semantics and
 * numerics of runtime/cpu/kernels_dense.c and kernels_attn.c).
 *
 * Work mapping (XM_TILE_THREADS threads per block everywhere):
 *   rmsnorm          a block per row (grid-stride over rows): strided sum
 *                    of squares in double, block reduction, scaled write.
 *   rmsnorm_grad     row pass as rmsnorm (two sums in one reduction), dx
 *                    written and the row's inverse RMS kept in ws; then a
 *                    column pass, one thread per column summing its rows
 *                    in order (deterministic, no atomics).
 *   rope, rope_grad  one thread per (position, frequency) fills the cos/sin
 *                    table in ws (inverse frequencies, YaRN blend, angles
 *                    and the mscale products in double, as the CPU), then
 *                    one thread per output element: a copy outside the
 *                    rotated range [off, off+rd), else its pair rotated;
 *                    the grad is the same with the sine negated and the
 *                    pair layouts swapped (interleave: read interleaved,
 *                    write halves; its transpose the other way round).
 *   cross_entropy    a single block (deterministic without scratch): warp w
 *                    takes rows w, w + nwarps, ...; per row a warp max and a
 *                    warp sum of exp in double; per-warp loss totals summed
 *                    in warp order by thread 0, which writes the mean.
 *   cross_entropy_grad  a block per row (grid-stride over rows).
 * Sums that the CPU keeps in double (sums of squares, dot products, the
 * softmax denominators, the loss total) are kept in double here too; the
 * reductions are fixed butterflies and fixed orders, so every run gives
 * the same bits.
 */
#ifndef XM_RUNTIME_GPU_KERNELS_NORM_CUH
#define XM_RUNTIME_GPU_KERNELS_NORM_CUH

#include "runtime/gpu/kernels/common.cuh"

/* ---- double reductions ----------------------------------------------------- */

/* xm_shfl_xor of a double, as its two 32-bit halves. */
XM_DEV double xm_norm_shfl_xor_d(double v, int mask) {
  uint64_t u;
  memcpy(&u, &v, 8);
  uint32_t lo = (uint32_t)xm_shfl_xor_i((int)(uint32_t)u, mask);
  uint32_t hi = (uint32_t)xm_shfl_xor_i((int)(uint32_t)(u >> 32), mask);
  u = ((uint64_t)hi << 32) | lo;
  memcpy(&v, &u, 8);
  return v;
}

/* Butterfly sum over the warp; every lane gets the same bits. */
XM_DEV double xm_norm_warp_sum_d(double v) {
  for (int m = XM_WARP / 2; m > 0; m >>= 1) v += xm_norm_shfl_xor_d(v, m);
  return v;
}

/* Block sums of a and b (in place, every thread gets them): warp
 * butterflies, then the warps' sums in warp order. red: shared, at least
 * 2 * XM_MAX_WARPS doubles. Contains barriers: every thread calls it. */
XM_DEV void xm_norm_block_sum2_d(double *a, double *b, double *red) {
  double va = xm_norm_warp_sum_d(*a), vb = xm_norm_warp_sum_d(*b);
  int w = xm_warp_id(), nw = xm_nwarps();
  xm_sync();
  if (xm_lane() == 0) {
    red[w] = va;
    red[XM_MAX_WARPS + w] = vb;
  }
  xm_sync();
  double sa = 0.0, sb = 0.0;
  for (int i = 0; i < nw; i++) {
    sa += red[i];
    sb += red[XM_MAX_WARPS + i];
  }
  *a = sa;
  *b = sb;
}

/* The block sum of one double (red: XM_MAX_WARPS doubles), as above. */
XM_DEV double xm_norm_block_sum_d(double v, double *red) {
  v = xm_norm_warp_sum_d(v);
  int w = xm_warp_id(), nw = xm_nwarps();
  xm_sync();
  if (xm_lane() == 0) red[w] = v;
  xm_sync();
  double s = 0.0;
  for (int i = 0; i < nw; i++) s += red[i];
  return s;
}

/* ---- RMSNorm ------------------------------------------------------------------ */

/* y[r,:] = x[r,:] * inv_r * w, inv_r = 1/sqrt(mean(x[r,:]^2) + eps) with the
 * mean in double. A block per row, threads strided over H. */
template <class S>
XM_GLOBAL(XM_TILE_THREADS)
k_rmsnorm(const float *x, const float *w, float *y, int64_t rows_, int64_t H_, float eps) {
  const int64_t rows = XM_DIM(S, rows, rows_), H = XM_DIM(S, H, H_);
  XM_SHARED(double, red, XM_MAX_WARPS);
  for (int64_t r = xm_bid_x(); r < rows; r += xm_nbid_x()) {
    const float *xr = x + r * H;
    float *yr = y + r * H;
    double ss = 0.0;
    for (int64_t j = xm_tid(); j < H; j += xm_ntid()) ss += (double)xr[j] * (double)xr[j];
    ss = xm_norm_block_sum_d(ss, red);
    float inv = (float)(1.0 / sqrt(ss / (double)H + (double)eps));
    for (int64_t j = xm_tid(); j < H; j += xm_ntid()) yr[j] = xr[j] * inv * w[j];
  }
}

template <class S>
void xm_g_rmsnorm(xm_stream_t s, const float *x, const float *w, float *y, int64_t rows_,
                  int64_t H_, float eps) {
  const int64_t rows = XM_DIM(S, rows, rows_), H = XM_DIM(S, H, H_);
  if (H <= 0) return;
  xm_launch("rmsnorm", xm_grid_1d(rows, 1), 1, 1, XM_TILE_THREADS, s, &k_rmsnorm<S>, x, w, y,
            rows_, H_, eps);
}
XM_G_TABLE(rmsnorm)

/* Row pass of the backward: with inv = the row's inverse RMS,
 * dx = inv * (w*dy - x * c), c = (float)(mean(dy*w*x)) * inv^2 (dot in
 * double); inv goes to ws[r] for the column pass. A block per row. */
template <class S>
XM_GLOBAL(XM_TILE_THREADS)
k_rmsnorm_grad_rows(const float *dy, const float *x, const float *w, float *dx, int64_t rows_,
                    int64_t H_, float eps, float *inv) {
  const int64_t rows = XM_DIM(S, rows, rows_), H = XM_DIM(S, H, H_);
  XM_SHARED(double, red, 2 * XM_MAX_WARPS);
  for (int64_t r = xm_bid_x(); r < rows; r += xm_nbid_x()) {
    const float *xr = x + r * H, *dyr = dy + r * H;
    float *dxr = dx + r * H;
    double ss = 0.0, dot = 0.0;
    for (int64_t j = xm_tid(); j < H; j += xm_ntid()) {
      double xv = (double)xr[j];
      ss += xv * xv;
      dot += (double)dyr[j] * (double)w[j] * xv;
    }
    xm_norm_block_sum2_d(&ss, &dot, red);
    float iv = (float)(1.0 / sqrt(ss / (double)H + (double)eps));
    float c = (float)(dot / (double)H) * iv * iv;
    if (xm_tid() == 0) inv[r] = iv;
    for (int64_t j = xm_tid(); j < H; j += xm_ntid()) dxr[j] = iv * (w[j] * dyr[j] - xr[j] * c);
  }
}

/* Column pass: dw[h] = sum over rows, in row order, of dy*x*inv (each
 * product in float, the sum in double). A thread per column; consecutive
 * threads read consecutive columns of a row. With few columns this leaves
 * much of the device idle, but splitting the rows would need scratch for
 * partial sums that the workspace (one float per row) does not give. */
template <class S>
XM_GLOBAL(XM_TILE_THREADS)
k_rmsnorm_grad_cols(const float *dy, const float *x, float *dw, int64_t rows_, int64_t H_,
                    const float *inv) {
  const int64_t rows = XM_DIM(S, rows, rows_), H = XM_DIM(S, H, H_);
  XM_FOR_GRID(j, H) {
    double acc = 0.0;
    for (int64_t r = 0; r < rows; r++) acc += (double)(dy[r * H + j] * x[r * H + j] * inv[r]);
    dw[j] = (float)acc;
  }
}

template <class S>
void xm_g_rmsnorm_grad(xm_stream_t s, const float *dy, const float *x, const float *w, float *dx,
                       float *dw, int64_t rows_, int64_t H_, float eps, float *ws) {
  const int64_t rows = XM_DIM(S, rows, rows_), H = XM_DIM(S, H, H_);
  if (H <= 0) return; /* nothing to write; ws is 0 bytes */
  /* rows <= 0: the column pass alone writes dw = 0 and reads no ws. */
  xm_launch("rmsnorm_grad", xm_grid_1d(rows, 1), 1, 1, XM_TILE_THREADS, s,
            &k_rmsnorm_grad_rows<S>, dy, x, w, dx, rows_, H_, eps, ws);
  xm_launch("rmsnorm_grad", xm_grid_1d(H, XM_TILE_THREADS), 1, 1, XM_TILE_THREADS, s,
            &k_rmsnorm_grad_cols<S>, dy, x, dw, rows_, H_, (const float *)ws);
}
XM_G_TABLE(rmsnorm_grad)

/* ---- RoPE -------------------------------------------------------------------- */

/* Inverse frequency i of rd rotary dims, in double: theta^(-2i/rd), blended
 * YaRN-style when factor != 1 (the formula of runtime/cpu/kernels.h). */
XM_DEV double xm_norm_rope_inv_freq(int64_t i, int64_t rd, double theta, double factor, double lo,
                                    double hi) {
  const double f = pow(theta, -2.0 * (double)i / (double)rd);
  if (factor == 1.0) return f;
  if (hi == lo) hi += 0.001; /* HF's guard against a zero-width ramp */
  double r = ((double)i - lo) / (hi - lo);
  r = r < 0.0 ? 0.0 : r > 1.0 ? 1.0 : r;
  return f / factor * r + f * (1.0 - r);
}

/* The table of xm_ws_rope(S, rd), laid out as the CPU kernel's: inv_freq
 * double[half], then m cos [S, half] and dir * m sin [S, half] as floats
 * (m = mscale), the angle s * inv_freq[i] and its product with m in
 * double, rounded to float once. A thread per entry; shared by rope (dir
 * 1) and rope_grad (dir -1: the transposed rotation). */
template <class S>
XM_GLOBAL(XM_TILE_THREADS)
k_rope_table(int64_t S_, int64_t rd_, float theta, float factor, float ramp_lo, float ramp_hi,
             float mscale, float dir, float *ws) {
  const int64_t Sq = XM_DIM(S, S, S_), rd = XM_DIM(S, rd, rd_);
  /* hd: a divisor; with rd a compile-time 0 the loop is empty, but the
   * compilers would still warn about dividing by it */
  const int64_t half = rd / 2, hd = half > 0 ? half : 1;
  double *inv_freq = (double *)(void *)ws;
  float *cs = (float *)(void *)(inv_freq + half);
  float *sn = cs + Sq * half;
  XM_FOR_GRID(e, Sq * half) {
    int64_t p = e / hd, i = e % hd;
    double f = xm_norm_rope_inv_freq(i, rd, theta, factor, ramp_lo, ramp_hi);
    if (p == 0) inv_freq[i] = f;
    double a = (double)p * f, m = (double)mscale;
    cs[e] = (float)(m * cos(a));
    sn[e] = dir * (float)(m * sin(a));
  }
}

/* One output element per thread of every (batch, position, head) row of
 * [B,S,nh,D]: elements outside [off, off+rd) are copied; a rotated one
 * belongs to pair k (frequency k) as its first or second member and is
 * first ? a c - b sv : b c + a sv, (a, b) the pair of x. A pair sits at
 * (k, k+half), or with `il` at (2k, 2k+1); in_il says how x holds it,
 * out_il how y does: the forward reads interleave's layout and writes the
 * halves, the gradient (sv = -m sin) the other way round, which with the
 * same formula is the transposed rotation. A thread per output rather than
 * per pair, so the copied elements need no second pass and consecutive
 * threads write consecutive elements; x and y must not overlap. */
template <class S>
XM_GLOBAL(XM_TILE_THREADS)
k_rope_apply(const float *x, float *y, int64_t B_, int64_t S_, int64_t nh_, int64_t D_,
             int64_t off_, int64_t rd_, int in_il, int out_il, const float *ws) {
  const int64_t B = XM_DIM(S, B, B_), Sq = XM_DIM(S, S, S_), nh = XM_DIM(S, nh, nh_),
                D = XM_DIM(S, D, D_), off = XM_DIM(S, off, off_), rd = XM_DIM(S, rd, rd_);
  const int64_t half = rd / 2;
  const float *cs = (const float *)(const void *)((const double *)(const void *)ws + half);
  const float *sn = cs + Sq * half;
  XM_FOR_GRID(e, B * Sq * nh * D) {
    const int64_t row = e / D, j = e % D - off;
    if (j < 0 || j >= rd) {
      y[e] = x[e];
      continue;
    }
    bool second;
    int64_t k;
    if (out_il) {
      second = (j & 1) != 0;
      k = j >> 1;
    } else {
      second = j >= half;
      k = second ? j - half : j;
    }
    const float *xa = x + row * D + off;
    const float a = in_il ? xa[2 * k] : xa[k], b = in_il ? xa[2 * k + 1] : xa[k + half];
    const int64_t t = ((row / nh) % Sq) * half + k;
    const float c = cs[t], sv = sn[t];
    y[e] = second ? b * c + a * sv : a * c - b * sv;
  }
}

template <class S>
static void xm_g_rope_dir(xm_stream_t s, const float *x, float *y, int64_t B_, int64_t S_,
                          int64_t nh_, int64_t D_, int64_t off_, int64_t rd_, float theta,
                          float factor, float ramp_lo, float ramp_hi, float mscale, int interleave,
                          float dir, float *ws) {
  const int64_t B = XM_DIM(S, B, B_), Sq = XM_DIM(S, S, S_), nh = XM_DIM(S, nh, nh_),
                D = XM_DIM(S, D, D_), rd = XM_DIM(S, rd, rd_);
  if (B <= 0 || Sq <= 0 || nh <= 0 || D <= 0) return;
  /* the forward reads interleave's layout, the gradient writes it */
  const int il = interleave != 0, in_il = dir > 0 ? il : 0, out_il = dir > 0 ? 0 : il;
  if (rd / 2 > 0) /* rd == 0: a copy, and ws is 0 bytes */
    xm_launch("rope", xm_grid_1d(Sq * (rd / 2), XM_TILE_THREADS), 1, 1, XM_TILE_THREADS, s,
              &k_rope_table<S>, S_, rd_, theta, factor, ramp_lo, ramp_hi, mscale, dir, ws);
  xm_launch("rope", xm_grid_1d(B * Sq * nh * D, XM_TILE_THREADS), 1, 1, XM_TILE_THREADS, s,
            &k_rope_apply<S>, x, y, B_, S_, nh_, D_, off_, rd_, in_il, out_il, (const float *)ws);
}

template <class S>
void xm_g_rope(xm_stream_t s, const float *x, float *y, int64_t B_, int64_t S_, int64_t nh_,
               int64_t D_, int64_t off_, int64_t rd_, float theta, float factor, float ramp_lo,
               float ramp_hi, float mscale, int interleave, float *ws) {
  xm_g_rope_dir<S>(s, x, y, B_, S_, nh_, D_, off_, rd_, theta, factor, ramp_lo, ramp_hi, mscale,
                   interleave, 1.0f, ws);
}
XM_G_TABLE(rope)

template <class S>
void xm_g_rope_grad(xm_stream_t s, const float *dy, float *dx, int64_t B_, int64_t S_,
                    int64_t nh_, int64_t D_, int64_t off_, int64_t rd_, float theta, float factor,
                    float ramp_lo, float ramp_hi, float mscale, int interleave, float *ws) {
  xm_g_rope_dir<S>(s, dy, dx, B_, S_, nh_, D_, off_, rd_, theta, factor, ramp_lo, ramp_hi, mscale,
                   interleave, -1.0f, ws);
}
XM_G_TABLE(rope_grad)

/* ---- cross-entropy ------------------------------------------------------------ */

/* *loss = mean over rows of m + log(sum exp(l - m)) - l[label] (sum and
 * total in double); a row whose label is outside [0, V) adds 0 but still
 * counts in the mean; rows == 0 gives 0. One block: warp w does rows w,
 * w + nwarps, ... and keeps its total in row order; thread 0 adds the warps'
 * totals in warp order. A single block is slow for big rows x V; the
 * chunked, fused LM-head + loss kernel replaces this one for the model's
 * loss (a many-block version here would need scratch for partial sums). */
template <class S>
XM_GLOBAL(XM_TILE_THREADS)
k_cross_entropy(const float *logits, const int32_t *labels, float *loss, int64_t rows_,
                int64_t V_) {
  const int64_t rows = XM_DIM(S, rows, rows_), V = XM_DIM(S, V, V_);
  XM_SHARED(double, part, XM_MAX_WARPS);
  const int lane = xm_lane(), wid = xm_warp_id(), nw = xm_nwarps();
  double total = 0.0;
  for (int64_t r = wid; r < rows; r += nw) {
    int32_t lab = labels[r];
    if (lab < 0 || lab >= V) continue; /* warp-uniform */
    const float *lr = logits + r * V;
    float m = -INFINITY;
    for (int64_t j = lane; j < V; j += XM_WARP) m = lr[j] > m ? lr[j] : m;
    m = xm_warp_max(m);
    double sum = 0.0;
    for (int64_t j = lane; j < V; j += XM_WARP) sum += (double)expf(lr[j] - m);
    sum = xm_norm_warp_sum_d(sum);
    total += (double)m + log(sum) - (double)lr[lab];
  }
  if (lane == 0) part[wid] = total;
  xm_sync();
  if (xm_tid() == 0) {
    double t = 0.0;
    for (int i = 0; i < nw; i++) t += part[i];
    *loss = rows > 0 ? (float)(t / (double)rows) : 0.0f;
  }
}

template <class S>
void xm_g_cross_entropy(xm_stream_t s, const float *logits, const int32_t *labels, float *loss,
                        int64_t rows_, int64_t V_) {
  /* always one block: rows == 0 still writes the 0 loss */
  xm_launch("cross_entropy", 1, 1, 1, XM_TILE_THREADS, s, &k_cross_entropy<S>, logits, labels,
            loss, rows_, V_);
}
XM_G_TABLE(cross_entropy)

/* A row's largest value m and sum of exp(l - m) (in double) over the
 * block, every thread getting both; red_f / red_d as xm_block_max and
 * xm_norm_block_sum_d want them. Contains barriers: every thread calls it. */
XM_DEV void xm_norm_row_softmax_stats(const float *lr, int64_t n, float *red_f, double *red_d,
                                      float *out_m, double *out_sum) {
  float m = -INFINITY;
  for (int64_t j = xm_tid(); j < n; j += xm_ntid()) m = lr[j] > m ? lr[j] : m;
  m = xm_block_max(m, red_f);
  double sum = 0.0;
  for (int64_t j = xm_tid(); j < n; j += xm_ntid()) sum += (double)expf(lr[j] - m);
  *out_m = m;
  *out_sum = xm_norm_block_sum_d(sum, red_d);
}

/* The gradient of the mean cross-entropy at one logit l of a row whose
 * statistics are (m, sum): c exp(l - m), c = (float)(g / sum), and at the
 * label g (exp(l - m) / sum - 1) in double, as the CPU computes them. */
XM_DEV float xm_norm_dlogit(float l, float m, double sum, float c, double g, bool at_label) {
  const float e = expf(l - m);
  return at_label ? (float)(g * ((double)e / sum - 1.0)) : c * e;
}

/* dlogits[r,j] = g * (softmax_j - [j == label]), g = *dloss / rows (in
 * double): c * exp(l_j - m) with c = (float)(g / sum), and at the label
 * g * (exp(l - m) / sum - 1) in double, as the CPU. A row with a label
 * outside [0, V) gets zeros. A block per row (grid-stride over rows). */
template <class S>
XM_GLOBAL(XM_TILE_THREADS)
k_cross_entropy_grad(const float *dloss, const float *logits, const int32_t *labels,
                     float *dlogits, int64_t rows_, int64_t V_) {
  const int64_t rows = XM_DIM(S, rows, rows_), V = XM_DIM(S, V, V_);
  XM_SHARED(float, redf, XM_MAX_WARPS);
  XM_SHARED(double, redd, XM_MAX_WARPS);
  const double g = (double)dloss[0] / (double)rows;
  for (int64_t r = xm_bid_x(); r < rows; r += xm_nbid_x()) {
    const float *lr = logits + r * V;
    float *dr = dlogits + r * V;
    int32_t lab = labels[r];
    if (lab < 0 || lab >= V) { /* block-uniform */
      for (int64_t j = xm_tid(); j < V; j += xm_ntid()) dr[j] = 0.0f;
      continue;
    }
    float m;
    double sum;
    xm_norm_row_softmax_stats(lr, V, redf, redd, &m, &sum);
    const float c = (float)(g / sum);
    for (int64_t j = xm_tid(); j < V; j += xm_ntid())
      dr[j] = xm_norm_dlogit(lr[j], m, sum, c, g, j == lab);
  }
}

template <class S>
void xm_g_cross_entropy_grad(xm_stream_t s, const float *dloss, const float *logits,
                             const int32_t *labels, float *dlogits, int64_t rows_, int64_t V_) {
  const int64_t rows = XM_DIM(S, rows, rows_);
  xm_launch("cross_entropy_grad", xm_grid_1d(rows, 1), 1, 1, XM_TILE_THREADS, s,
            &k_cross_entropy_grad<S>, dloss, logits, labels, dlogits, rows_, V_);
}
XM_G_TABLE(cross_entropy_grad)

#endif /* XM_RUNTIME_GPU_KERNELS_NORM_CUH */
