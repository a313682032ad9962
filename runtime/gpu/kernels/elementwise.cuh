/* runtime/gpu/kernels/elementwise.cuh — the elementwise, reduction, cast,
 * concat/split, optimizer and embedding kernels of runtime/abi/kernels.def
 * as GPU templates (semantics: runtime/cpu/kernels.h and
 * runtime/cpu/kernels_*.c).
 *
 * How work maps to threads (blocks of XM_TILE_THREADS threads):
 *   - add, mul, mul_rows, scale, fill, copy, the activations and their
 *     gradients, the casts, accumulate, accumulate_i32, adamw: one
 *     grid-stride loop over the elements (XM_FOR_GRID, xm_grid_1d blocks),
 *     one element per thread per step, consecutive threads on consecutive
 *     elements; one launch.
 *   - concat, split (along the last dim): one thread per output element
 *     (split: a's elements, then b's); for split's broadcast b (Hb == 1)
 *     that thread sums its column over the heads in head order in double.
 *   - adamw_multi: one launch per XM_TILE_ADAMW_TENSORS tensors, their table
 *     in the launch's arguments; a block owns XM_TILE_ADAMW_BLOCK_ELEMS
 *     consecutive elements of one tensor.
 *   - reduce_to (column sums of an [nx/ny, ny] matrix): a block owns a tile
 *     of XM_TILE_ELEMENTWISE_RED_COLS columns (fewer when ny is smaller) and
 *     splits the rows among the rest of its threads (row groups); each
 *     thread sums its rows in order in double, then the row groups are added
 *     in a fixed tree in shared memory: deterministic, coalesced along rows.
 *   - reduce_rows (row sums of a [rows, H] matrix): a block per row (grid
 *     stride over the rows); its threads sum the columns t, t + threads, ...
 *     in double and the block adds them in the fixed tree of
 *     xm_ew_block_sum_d: deterministic, coalesced along the row.
 *   - sum_sq_acc: a single block (the accumulator is one double and there is
 *     no scratch for per-block partials, so a multi-block sum would need
 *     float atomics or a second buffer): per-thread double partials, a fixed
 *     tree in shared doubles, thread 0 adds into *acc and writes *out.
 *   - aux_free_update: a single block (E is the expert count): the mean of
 *     the loads in double (integers: exact in any order), then one thread
 *     per expert.
 *   - embedding: grid y over tokens (folded), x over column tiles.
 *   - embedding_grad: block (x, y) owns the columns of tile x of the rows
 *     v with v % P == y (P = min(V, XM_TILE_ELEMENTWISE_EMB_PARTS)): it zeroes
 *     them, then walks all tokens in order (ids staged through shared
 *     memory) adding the dy rows of its own ids. Each (row, column) has one
 *     owner thread, which adds in token order: deterministic, no atomics,
 *     and the same order as the CPU.
 *
 * New constants (this file only): XM_TILE_ELEMENTWISE_RED_COLS,
 * XM_TILE_ELEMENTWISE_EMB_PARTS.
 */
#ifndef XM_RUNTIME_GPU_KERNELS_ELEMENTWISE_CUH
#define XM_RUNTIME_GPU_KERNELS_ELEMENTWISE_CUH

#include "runtime/abi/kernels.h" /* xm_rt_adamw_tensor_t */
#include "runtime/gpu/kernels/common.cuh"

#if defined(XM_TARGET_AMD)
/* Columns of a reduce_to block (a power of two dividing XM_TILE_THREADS). */
#define XM_TILE_ELEMENTWISE_RED_COLS 32
/* Most vocabulary partitions (grid y) of embedding_grad. */
#define XM_TILE_ELEMENTWISE_EMB_PARTS 128
#else
#define XM_TILE_ELEMENTWISE_RED_COLS 32
#define XM_TILE_ELEMENTWISE_EMB_PARTS 128
#endif

/* The tree reductions below halve the block: it must be a power of two. */
static_assert((XM_TILE_THREADS & (XM_TILE_THREADS - 1)) == 0, "XM_TILE_THREADS: a power of two");
static_assert(XM_TILE_THREADS % XM_TILE_ELEMENTWISE_RED_COLS == 0, "RED_COLS divides the block");

/* Sum of v over the block in double, in a fixed tree order, returned to
 * every thread; red: XM_TILE_THREADS shared doubles. All threads call it. */
XM_DEV double xm_ew_block_sum_d(double v, double *red) {
  const int t = xm_tid();
  red[t] = v;
  xm_sync();
  for (int s = xm_ntid() / 2; s > 0; s >>= 1) {
    if (t < s) red[t] += red[t + s];
    xm_sync();
  }
  return red[0];
}

/* 1 / (1 + e^-x): for very negative x the exponent overflows to inf and
 * the quotient is exactly 0, never NaN. */
XM_DEV float xm_ew_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* GeLU, tanh form, as v * sigmoid(2z) with z = C (v + A v^3) (the CPU's). */
#define XM_EW_GELU_C 0.7978845608028654f /* sqrt(2/pi) */
#define XM_EW_GELU_A 0.044715f
XM_DEV float xm_ew_gelu_s(float v) {
  return xm_ew_sigmoid((2.0f * XM_EW_GELU_C) * (v + XM_EW_GELU_A * v * v * v));
}

/* ---- add, mul: y[i] = a[i] op b[i % nb] ----------------------------------- */

template <class S>
XM_GLOBAL(XM_TILE_THREADS) k_add(const float *a, const float *b, float *y, int64_t na_, int64_t nb_) {
  const int64_t na = XM_DIM(S, na, na_), nb = XM_DIM(S, nb, nb_);
  XM_FOR_GRID(i, na) y[i] = a[i] + b[nb == na ? i : i % nb];
}
template <class S>
void xm_g_add(xm_stream_t s, const float *a, const float *b, float *y, int64_t na_, int64_t nb_) {
  const int64_t na = XM_DIM(S, na, na_), nb = XM_DIM(S, nb, nb_);
  if (nb <= 0) return; /* na == 0 too: no routed rows */
  xm_launch("add", xm_grid_1d(na, XM_TILE_THREADS), 1, 1, XM_TILE_THREADS, s, &k_add<S>, a, b, y,
            na, nb);
}
XM_G_TABLE(add)

template <class S>
XM_GLOBAL(XM_TILE_THREADS) k_mul(const float *a, const float *b, float *y, int64_t na_, int64_t nb_) {
  const int64_t na = XM_DIM(S, na, na_), nb = XM_DIM(S, nb, nb_);
  XM_FOR_GRID(i, na) y[i] = a[i] * b[nb == na ? i : i % nb];
}
template <class S>
void xm_g_mul(xm_stream_t s, const float *a, const float *b, float *y, int64_t na_, int64_t nb_) {
  const int64_t na = XM_DIM(S, na, na_), nb = XM_DIM(S, nb, nb_);
  if (nb <= 0) return;
  xm_launch("mul", xm_grid_1d(na, XM_TILE_THREADS), 1, 1, XM_TILE_THREADS, s, &k_mul<S>, a, b, y,
            na, nb);
}
XM_G_TABLE(mul)

/* ---- mul_rows: y[r*H + h] = a[r*H + h] * b[r] (one factor per row) ----------- */

template <class S>
XM_GLOBAL(XM_TILE_THREADS)
k_mul_rows(const float *a, const float *b, float *y, int64_t rows_, int64_t H_) {
  const int64_t rows = XM_DIM(S, rows, rows_), H = XM_DIM(S, H, H_);
  const int64_t h = H > 0 ? H : 1; /* see k_split: no division by a constant 0 */
  XM_FOR_GRID(i, rows * H) y[i] = a[i] * b[i / h];
}
template <class S>
void xm_g_mul_rows(xm_stream_t s, const float *a, const float *b, float *y, int64_t rows_,
                   int64_t H_) {
  const int64_t rows = XM_DIM(S, rows, rows_), H = XM_DIM(S, H, H_);
  if (rows * H <= 0) return;
  xm_launch("mul_rows", xm_grid_1d(rows * H, XM_TILE_THREADS), 1, 1, XM_TILE_THREADS, s,
            &k_mul_rows<S>, a, b, y, rows, H);
}
XM_G_TABLE(mul_rows)

/* ---- scale, fill, copy ------------------------------------------------------ */

template <class S>
XM_GLOBAL(XM_TILE_THREADS) k_scale(const float *x, float *y, int64_t n_, float factor) {
  const int64_t n = XM_DIM(S, n, n_);
  XM_FOR_GRID(i, n) y[i] = x[i] * factor;
}
template <class S> void xm_g_scale(xm_stream_t s, const float *x, float *y, int64_t n_, float factor) {
  const int64_t n = XM_DIM(S, n, n_);
  xm_launch("scale", xm_grid_1d(n, XM_TILE_THREADS), 1, 1, XM_TILE_THREADS, s, &k_scale<S>, x, y, n,
            factor);
}
XM_G_TABLE(scale)

template <class S> XM_GLOBAL(XM_TILE_THREADS) k_fill(float *y, int64_t n_, float value) {
  const int64_t n = XM_DIM(S, n, n_);
  XM_FOR_GRID(i, n) y[i] = value;
}
template <class S> void xm_g_fill(xm_stream_t s, float *y, int64_t n_, float value) {
  const int64_t n = XM_DIM(S, n, n_);
  xm_launch("fill", xm_grid_1d(n, XM_TILE_THREADS), 1, 1, XM_TILE_THREADS, s, &k_fill<S>, y, n,
            value);
}
XM_G_TABLE(fill)

/* In place (x == y) is nothing to do; partially overlapping buffers are
 * not supported (the planner never makes them). */
template <class S> XM_GLOBAL(XM_TILE_THREADS) k_copy(const float *x, float *y, int64_t n_) {
  const int64_t n = XM_DIM(S, n, n_);
  XM_FOR_GRID(i, n) y[i] = x[i];
}
template <class S> void xm_g_copy(xm_stream_t s, const float *x, float *y, int64_t n_) {
  const int64_t n = XM_DIM(S, n, n_);
  if (x == y) return;
  xm_launch("copy", xm_grid_1d(n, XM_TILE_THREADS), 1, 1, XM_TILE_THREADS, s, &k_copy<S>, x, y, n);
}
XM_G_TABLE(copy)

/* ---- concat, split: along the last dim, b per head or broadcast ---------------
 * Hb == H: b has a row per (r, h); otherwise (Hb == 1) one row per r shared
 * by every head (runtime/cpu/kernels.h). */

/* y[r,h,:] = a[r,h,:] ++ b[r,h or 0,:]: a thread per output element. */
template <class S>
XM_GLOBAL(XM_TILE_THREADS)
k_concat(const float *a, const float *b, float *y, int64_t R_, int64_t H_, int64_t Hb_,
         int64_t Da_, int64_t Db_) {
  const int64_t R = XM_DIM(S, R, R_), H = XM_DIM(S, H, H_), Hb = XM_DIM(S, Hb, Hb_),
                Da = XM_DIM(S, Da, Da_), Db = XM_DIM(S, Db, Db_);
  const int64_t D = Da + Db;
  XM_FOR_GRID(e, R * H * D) {
    const int64_t rh = e / D, j = e % D;
    const int64_t brow = Hb == H ? rh : rh / H;
    y[e] = j < Da ? a[rh * Da + j] : b[brow * Db + (j - Da)];
  }
}
template <class S>
void xm_g_concat(xm_stream_t s, const float *a, const float *b, float *y, int64_t R_, int64_t H_,
                 int64_t Hb_, int64_t Da_, int64_t Db_) {
  const int64_t R = XM_DIM(S, R, R_), H = XM_DIM(S, H, H_), Da = XM_DIM(S, Da, Da_),
                Db = XM_DIM(S, Db, Db_);
  xm_launch("concat", xm_grid_1d(R * H * (Da + Db), XM_TILE_THREADS), 1, 1, XM_TILE_THREADS, s,
            &k_concat<S>, a, b, y, R_, H_, Hb_, Da_, Db_);
}
XM_G_TABLE(concat)

/* a = x[..., :Da], b = x[..., Da:] (Hb == H) or b[r,:] = the sum over h of
 * x[r,h,Da:] (Hb == 1): a thread per output element, a's R*H*Da first,
 * then b's. A broadcast b's thread adds its column of the R's heads in
 * head order in double, as the CPU: deterministic, no atomics, and the H
 * reads of a column are strided by Da + Db, which neighbouring threads
 * (neighbouring columns) share. */
template <class S>
XM_GLOBAL(XM_TILE_THREADS)
k_split(const float *x, float *a, float *b, int64_t R_, int64_t H_, int64_t Hb_, int64_t Da_,
        int64_t Db_) {
  const int64_t R = XM_DIM(S, R, R_), H = XM_DIM(S, H, H_), Hb = XM_DIM(S, Hb, Hb_),
                Da = XM_DIM(S, Da, Da_), Db = XM_DIM(S, Db, Db_);
  const int64_t D = Da + Db, na = R * H * Da, nb = R * (Hb == H ? H : 1) * Db;
  /* divisors: a part of compile-time width 0 has no elements, but the
   * compilers would still warn about dividing by its width */
  const int64_t da = Da > 0 ? Da : 1, db = Db > 0 ? Db : 1;
  XM_FOR_GRID(e, na + nb) {
    if (e < na) {
      a[e] = x[(e / da) * D + e % da];
      continue;
    }
    const int64_t f = e - na, row = f / db, j = f % db;
    if (Hb == H) {
      b[f] = x[row * D + Da + j];
      continue;
    }
    const float *xc = x + row * H * D + Da + j;
    double acc = 0.0;
    for (int64_t h = 0; h < H; h++) acc += (double)xc[h * D];
    b[f] = (float)acc;
  }
}
template <class S>
void xm_g_split(xm_stream_t s, const float *x, float *a, float *b, int64_t R_, int64_t H_,
                int64_t Hb_, int64_t Da_, int64_t Db_) {
  const int64_t R = XM_DIM(S, R, R_), H = XM_DIM(S, H, H_), Hb = XM_DIM(S, Hb, Hb_),
                Da = XM_DIM(S, Da, Da_), Db = XM_DIM(S, Db, Db_);
  const int64_t n = R * H * Da + R * (Hb == H ? H : 1) * Db;
  xm_launch("split", xm_grid_1d(n, XM_TILE_THREADS), 1, 1, XM_TILE_THREADS, s, &k_split<S>, x, a,
            b, R_, H_, Hb_, Da_, Db_);
}
XM_G_TABLE(split)

/* a = x[r, :Da], b = x[r, Da:] of int rows: a thread per output element. */
template <class S>
XM_GLOBAL(XM_TILE_THREADS)
k_split_i32(const int32_t *x, int32_t *a, int32_t *b, int64_t R_, int64_t Da_, int64_t Db_) {
  const int64_t R = XM_DIM(S, R, R_), Da = XM_DIM(S, Da, Da_), Db = XM_DIM(S, Db, Db_);
  const int64_t D = Da + Db, na = R * Da;
  const int64_t da = Da > 0 ? Da : 1, db = Db > 0 ? Db : 1; /* see k_split */
  XM_FOR_GRID(e, na + R * Db) {
    if (e < na)
      a[e] = x[(e / da) * D + e % da];
    else
      b[e - na] = x[((e - na) / db) * D + Da + (e - na) % db];
  }
}
template <class S>
void xm_g_split_i32(xm_stream_t s, const int32_t *x, int32_t *a, int32_t *b, int64_t R_,
                    int64_t Da_, int64_t Db_) {
  const int64_t R = XM_DIM(S, R, R_), Da = XM_DIM(S, Da, Da_), Db = XM_DIM(S, Db, Db_);
  xm_launch("split_i32", xm_grid_1d(R * (Da + Db), XM_TILE_THREADS), 1, 1, XM_TILE_THREADS, s,
            &k_split_i32<S>, x, a, b, R_, Da_, Db_);
}
XM_G_TABLE(split_i32)

/* ---- reduce_to: y[j] = sum_r x[r*ny + j] -------------------------------------
 * Block: cw columns (bid_x*cw + c) x (threads / cw) row groups g; group g
 * sums rows g, g + groups, ... in double; the groups are then added in a
 * fixed tree and group 0 writes the column. */
template <class S>
XM_GLOBAL(XM_TILE_THREADS) k_reduce_to(const float *x, float *y, int64_t nx_, int64_t ny_, int cw) {
  const int64_t nx = XM_DIM(S, nx, nx_), ny = XM_DIM(S, ny, ny_);
  XM_SHARED(double, red, XM_TILE_THREADS);
  const int t = xm_tid(), c = t % cw, g = t / cw, groups = xm_ntid() / cw;
  const int64_t j = (int64_t)xm_bid_x() * cw + c, rows = nx / ny;
  /* The same trip count on every thread (control flow before a barrier
   * stays uniform), the row and column bounds inside. */
  double acc = 0.0;
  for (int64_t r0 = 0; r0 < rows; r0 += groups) {
    const int64_t r = r0 + g;
    if (r < rows && j < ny) acc += (double)x[r * ny + j];
  }
  red[t] = acc;
  xm_sync();
  for (int s = groups / 2; s > 0; s >>= 1) {
    if (g < s) red[t] += red[t + s * cw];
    xm_sync();
  }
  if (g == 0 && j < ny) y[j] = (float)red[t];
}
template <class S>
void xm_g_reduce_to(xm_stream_t s, const float *x, float *y, int64_t nx_, int64_t ny_) {
  const int64_t nx = XM_DIM(S, nx, nx_), ny = XM_DIM(S, ny, ny_);
  if (ny <= 0) return;
  int cw = 1; /* the smallest power of two >= ny, at most RED_COLS */
  while (cw < XM_TILE_ELEMENTWISE_RED_COLS && cw < ny) cw *= 2;
  xm_launch("reduce_to", xm_cdiv(ny, cw), 1, 1, XM_TILE_THREADS, s, &k_reduce_to<S>, x, y, nx, ny,
            cw);
}
XM_G_TABLE(reduce_to)

/* ---- reduce_rows: y[r] = sum_h x[r*H + h] --------------------------------------
 * Block b sums rows b, b + blocks, ...: every thread of a block runs the
 * same rows (the loop bound is the block's), so the barriers inside stay
 * uniform. */
template <class S>
XM_GLOBAL(XM_TILE_THREADS) k_reduce_rows(const float *x, float *y, int64_t rows_, int64_t H_) {
  const int64_t rows = XM_DIM(S, rows, rows_), H = XM_DIM(S, H, H_);
  XM_SHARED(double, red, XM_TILE_THREADS);
  const int t = xm_tid();
  for (int64_t r = xm_bid_x(); r < rows; r += xm_nbid_x()) {
    const float *xr = x + r * H;
    double acc = 0.0;
    for (int64_t h = t; h < H; h += xm_ntid()) acc += (double)xr[h];
    const double sum = xm_ew_block_sum_d(acc, red);
    if (t == 0) y[r] = (float)sum;
    xm_sync(); /* every thread has read red[0] before the next row writes red */
  }
}
template <class S>
void xm_g_reduce_rows(xm_stream_t s, const float *x, float *y, int64_t rows_, int64_t H_) {
  const int64_t rows = XM_DIM(S, rows, rows_), H = XM_DIM(S, H, H_);
  if (rows <= 0) return;
  const int64_t blocks = rows < XM_TILE_MAX_GRID_1D ? rows : XM_TILE_MAX_GRID_1D;
  xm_launch("reduce_rows", blocks, 1, 1, XM_TILE_THREADS, s, &k_reduce_rows<S>, x, y, rows, H);
}
XM_G_TABLE(reduce_rows)

/* ---- activations (formulas and operation order of kernels_dense.c) --------- */

template <class S> XM_GLOBAL(XM_TILE_THREADS) k_silu(const float *x, float *y, int64_t n_) {
  const int64_t n = XM_DIM(S, n, n_);
  XM_FOR_GRID(i, n) {
    float v = x[i];
    y[i] = v * xm_ew_sigmoid(v);
  }
}
template <class S> void xm_g_silu(xm_stream_t s, const float *x, float *y, int64_t n_) {
  const int64_t n = XM_DIM(S, n, n_);
  xm_launch("silu", xm_grid_1d(n, XM_TILE_THREADS), 1, 1, XM_TILE_THREADS, s, &k_silu<S>, x, y, n);
}
XM_G_TABLE(silu)

template <class S>
XM_GLOBAL(XM_TILE_THREADS) k_silu_grad(const float *dy, const float *x, float *dx, int64_t n_) {
  const int64_t n = XM_DIM(S, n, n_);
  XM_FOR_GRID(i, n) {
    float d = dy[i], v = x[i], sg = xm_ew_sigmoid(v);
    dx[i] = d * sg * (1.0f + v * (1.0f - sg));
  }
}
template <class S>
void xm_g_silu_grad(xm_stream_t s, const float *dy, const float *x, float *dx, int64_t n_) {
  const int64_t n = XM_DIM(S, n, n_);
  xm_launch("silu_grad", xm_grid_1d(n, XM_TILE_THREADS), 1, 1, XM_TILE_THREADS, s, &k_silu_grad<S>,
            dy, x, dx, n);
}
XM_G_TABLE(silu_grad)

template <class S> XM_GLOBAL(XM_TILE_THREADS) k_gelu(const float *x, float *y, int64_t n_) {
  const int64_t n = XM_DIM(S, n, n_);
  XM_FOR_GRID(i, n) {
    float v = x[i];
    y[i] = v * xm_ew_gelu_s(v);
  }
}
template <class S> void xm_g_gelu(xm_stream_t s, const float *x, float *y, int64_t n_) {
  const int64_t n = XM_DIM(S, n, n_);
  xm_launch("gelu", xm_grid_1d(n, XM_TILE_THREADS), 1, 1, XM_TILE_THREADS, s, &k_gelu<S>, x, y, n);
}
XM_G_TABLE(gelu)

/* d/dv [v sigmoid(2z)] = s + 2 v s (1 - s) dz/dv, dz/dv = C (1 + 3 A v^2). */
template <class S>
XM_GLOBAL(XM_TILE_THREADS) k_gelu_grad(const float *dy, const float *x, float *dx, int64_t n_) {
  const int64_t n = XM_DIM(S, n, n_);
  XM_FOR_GRID(i, n) {
    float d = dy[i], v = x[i], sg = xm_ew_gelu_s(v);
    float du = XM_EW_GELU_C * (1.0f + (3.0f * XM_EW_GELU_A) * v * v);
    dx[i] = d * (sg + 2.0f * v * sg * (1.0f - sg) * du);
  }
}
template <class S>
void xm_g_gelu_grad(xm_stream_t s, const float *dy, const float *x, float *dx, int64_t n_) {
  const int64_t n = XM_DIM(S, n, n_);
  xm_launch("gelu_grad", xm_grid_1d(n, XM_TILE_THREADS), 1, 1, XM_TILE_THREADS, s, &k_gelu_grad<S>,
            dy, x, dx, n);
}
XM_G_TABLE(gelu_grad)

template <class S> XM_GLOBAL(XM_TILE_THREADS) k_sigmoid(const float *x, float *y, int64_t n_) {
  const int64_t n = XM_DIM(S, n, n_);
  XM_FOR_GRID(i, n) y[i] = xm_ew_sigmoid(x[i]);
}
template <class S> void xm_g_sigmoid(xm_stream_t s, const float *x, float *y, int64_t n_) {
  const int64_t n = XM_DIM(S, n, n_);
  xm_launch("sigmoid", xm_grid_1d(n, XM_TILE_THREADS), 1, 1, XM_TILE_THREADS, s, &k_sigmoid<S>, x,
            y, n);
}
XM_G_TABLE(sigmoid)

/* From the forward output y: dx = dy y (1 - y). */
template <class S>
XM_GLOBAL(XM_TILE_THREADS) k_sigmoid_grad(const float *dy, const float *y, float *dx, int64_t n_) {
  const int64_t n = XM_DIM(S, n, n_);
  XM_FOR_GRID(i, n) {
    float v = y[i];
    dx[i] = dy[i] * v * (1.0f - v);
  }
}
template <class S>
void xm_g_sigmoid_grad(xm_stream_t s, const float *dy, const float *y, float *dx, int64_t n_) {
  const int64_t n = XM_DIM(S, n, n_);
  xm_launch("sigmoid_grad", xm_grid_1d(n, XM_TILE_THREADS), 1, 1, XM_TILE_THREADS, s,
            &k_sigmoid_grad<S>, dy, y, dx, n);
}
XM_G_TABLE(sigmoid_grad)

/* y = silu(g) * u */
template <class S>
XM_GLOBAL(XM_TILE_THREADS) k_swiglu(const float *g, const float *u, float *y, int64_t n_) {
  const int64_t n = XM_DIM(S, n, n_);
  XM_FOR_GRID(i, n) {
    float gv = g[i];
    y[i] = gv * xm_ew_sigmoid(gv) * u[i];
  }
}
template <class S>
void xm_g_swiglu(xm_stream_t s, const float *g, const float *u, float *y, int64_t n_) {
  const int64_t n = XM_DIM(S, n, n_);
  xm_launch("swiglu", xm_grid_1d(n, XM_TILE_THREADS), 1, 1, XM_TILE_THREADS, s, &k_swiglu<S>, g, u,
            y, n);
}
XM_G_TABLE(swiglu)

/* dg = dy u s (1 + g (1 - s)), du = dy g s; every input is read before
 * either store, so du may be u's buffer (and dg g's). */
template <class S>
XM_GLOBAL(XM_TILE_THREADS) k_swiglu_grad(const float *dy, const float *g, const float *u,
                                         float *dg, float *du, int64_t n_) {
  const int64_t n = XM_DIM(S, n, n_);
  XM_FOR_GRID(i, n) {
    float d = dy[i], gv = g[i], uv = u[i], sg = xm_ew_sigmoid(gv);
    du[i] = d * (gv * sg);
    dg[i] = d * uv * sg * (1.0f + gv * (1.0f - sg));
  }
}
template <class S>
void xm_g_swiglu_grad(xm_stream_t s, const float *dy, const float *g, const float *u, float *dg,
                      float *du, int64_t n_) {
  const int64_t n = XM_DIM(S, n, n_);
  xm_launch("swiglu_grad", xm_grid_1d(n, XM_TILE_THREADS), 1, 1, XM_TILE_THREADS, s,
            &k_swiglu_grad<S>, dy, g, u, dg, du, n);
}
XM_G_TABLE(swiglu_grad)

/* ---- bf16 casts (bit-exact: round to nearest even, runtime/abi/bf16.h) ------ */

template <class S> XM_GLOBAL(XM_TILE_THREADS) k_cast_f32_bf16(const float *x, xm_bf16 *y, int64_t n_) {
  const int64_t n = XM_DIM(S, n, n_);
  XM_FOR_GRID(i, n) y[i] = xm_f2bf(x[i]);
}
template <class S> void xm_g_cast_f32_bf16(xm_stream_t s, const float *x, xm_bf16 *y, int64_t n_) {
  const int64_t n = XM_DIM(S, n, n_);
  xm_launch("cast_f32_bf16", xm_grid_1d(n, XM_TILE_THREADS), 1, 1, XM_TILE_THREADS, s,
            &k_cast_f32_bf16<S>, x, y, n);
}
XM_G_TABLE(cast_f32_bf16)

template <class S> XM_GLOBAL(XM_TILE_THREADS) k_cast_bf16_f32(const xm_bf16 *x, float *y, int64_t n_) {
  const int64_t n = XM_DIM(S, n, n_);
  XM_FOR_GRID(i, n) y[i] = xm_bf2f(x[i]);
}
template <class S> void xm_g_cast_bf16_f32(xm_stream_t s, const xm_bf16 *x, float *y, int64_t n_) {
  const int64_t n = XM_DIM(S, n, n_);
  xm_launch("cast_bf16_f32", xm_grid_1d(n, XM_TILE_THREADS), 1, 1, XM_TILE_THREADS, s,
            &k_cast_bf16_f32<S>, x, y, n);
}
XM_G_TABLE(cast_bf16_f32)

/* ---- accumulate, accumulate_i32: acc += x ------------------------------------ */

template <class S> XM_GLOBAL(XM_TILE_THREADS) k_accumulate(float *acc, const float *x, int64_t n_) {
  const int64_t n = XM_DIM(S, n, n_);
  XM_FOR_GRID(i, n) acc[i] += x[i];
}
template <class S> void xm_g_accumulate(xm_stream_t s, float *acc, const float *x, int64_t n_) {
  const int64_t n = XM_DIM(S, n, n_);
  xm_launch("accumulate", xm_grid_1d(n, XM_TILE_THREADS), 1, 1, XM_TILE_THREADS, s,
            &k_accumulate<S>, acc, x, n);
}
XM_G_TABLE(accumulate)

/* Wrapping two's-complement addition (defined, unlike signed overflow). */
template <class S>
XM_GLOBAL(XM_TILE_THREADS) k_accumulate_i32(int32_t *acc, const int32_t *x, int64_t n_) {
  const int64_t n = XM_DIM(S, n, n_);
  XM_FOR_GRID(i, n) acc[i] = (int32_t)((uint32_t)acc[i] + (uint32_t)x[i]);
}
template <class S>
void xm_g_accumulate_i32(xm_stream_t s, int32_t *acc, const int32_t *x, int64_t n_) {
  const int64_t n = XM_DIM(S, n, n_);
  xm_launch("accumulate_i32", xm_grid_1d(n, XM_TILE_THREADS), 1, 1, XM_TILE_THREADS, s,
            &k_accumulate_i32<S>, acc, x, n);
}
XM_G_TABLE(accumulate_i32)

/* ---- sum_sq_acc: *acc += sum x^2 (double); *out = (float)*acc ----------------
 * One block, always launched (n == 0 still writes out). Each thread keeps
 * four double partials, one per quarter of each 4 * threads chunk (four
 * loads in flight), adds them in a fixed order, and the block adds the threads in a
 * fixed tree; only thread 0 touches acc, after the tree, so consecutive
 * calls on the same acc (ordered on the stream) add up. */
template <class S>
XM_GLOBAL(XM_TILE_THREADS) k_sum_sq_acc(const float *x, int64_t n_, double *acc, float *out) {
  const int64_t n = XM_DIM(S, n, n_);
  XM_SHARED(double, red, XM_TILE_THREADS);
  const int64_t nt = xm_ntid();
  double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
  /* Trip counts are the same on every thread (uniform control flow before
   * the barriers); the ragged end is guarded element by element. */
  int64_t base = 0;
  for (; base + 4 * nt <= n; base += 4 * nt) {
    const int64_t i = base + xm_tid();
    double a = x[i], b = x[i + nt], c = x[i + 2 * nt], d = x[i + 3 * nt];
    s0 += a * a;
    s1 += b * b;
    s2 += c * c;
    s3 += d * d;
  }
  for (int64_t i = base + xm_tid(); base < n; base += nt, i += nt)
    if (i < n) {
      double a = x[i];
      s0 += a * a;
    }
  double tot = xm_ew_block_sum_d((s0 + s1) + (s2 + s3), red);
  if (xm_tid() == 0) {
    double v = *acc + tot;
    *acc = v;
    *out = (float)v;
  }
}
template <class S>
void xm_g_sum_sq_acc(xm_stream_t s, const float *x, int64_t n_, double *acc, float *out) {
  const int64_t n = XM_DIM(S, n, n_);
  xm_launch("sum_sq_acc", 1, 1, 1, XM_TILE_THREADS, s, &k_sum_sq_acc<S>, x, n, acc, out);
}
XM_G_TABLE(sum_sq_acc)

/* ---- adamw (torch.optim.AdamW, single-tensor path; kernels_optim.c) ----------
 * The per-call constants are computed on the host exactly as the CPU does
 * (bias corrections in double from the 1-based step); the kernel does the
 * CPU's float operations in the CPU's order. `step` changes every
 * optimizer step, so it is read at run time, never from S. */
/* The per-call constants, computed on the host once for both launchers
 * exactly as the CPU does, and one element of the update with them, shared
 * by adamw and adamw_multi so that both do the same float operations.
 * decay is 1 - lr * weight_decay (adamw_multi uses 1 for rows without it). */
struct xm_adamw_consts {
  float beta2, eps, bc2_sqrt, step_size, decay, one_m_b1, one_m_b2, grad_scale;
};
static inline xm_adamw_consts xm_adamw_consts_of(float lr, float beta1, float beta2, float eps,
                                                 float weight_decay, int64_t step,
                                                 float grad_scale) {
  const double t = (double)(step > 0 ? step : 1);
  xm_adamw_consts c;
  c.beta2 = beta2;
  c.eps = eps;
  c.bc2_sqrt = (float)sqrt(1.0 - pow((double)beta2, t));
  c.step_size = (float)((double)lr / (1.0 - pow((double)beta1, t)));
  c.decay = 1.0f - lr * weight_decay;
  c.one_m_b1 = 1.0f - beta1;
  c.one_m_b2 = 1.0f - beta2;
  c.grad_scale = grad_scale;
  return c;
}
XM_DEV void xm_adamw_elem(float *p, const float *g, float *m, float *v, int64_t i,
                          const xm_adamw_consts &c, float decay) {
  float gi = g[i] * c.grad_scale;
  float pi = p[i] * decay;
  float m0 = m[i];
  float mi = m0 + c.one_m_b1 * (gi - m0);
  float vi = v[i] * c.beta2 + c.one_m_b2 * gi * gi;
  float denom = sqrtf(vi) / c.bc2_sqrt + c.eps;
  p[i] = pi - c.step_size * (mi / denom);
  m[i] = mi;
  v[i] = vi;
}

template <class S>
XM_GLOBAL(XM_TILE_THREADS) k_adamw(float *p, const float *g, float *m, float *v, int64_t n_,
                                   xm_adamw_consts c) {
  const int64_t n = XM_DIM(S, n, n_);
  XM_FOR_GRID(i, n) { xm_adamw_elem(p, g, m, v, i, c, c.decay); }
}
template <class S>
void xm_g_adamw(xm_stream_t s, float *p, const float *g, float *m, float *v, int64_t n_, float lr,
                float beta1, float beta2, float eps, float weight_decay, int64_t step_,
                float grad_scale) {
  const int64_t n = XM_DIM(S, n, n_);
  const xm_adamw_consts c =
      xm_adamw_consts_of(lr, beta1, beta2, eps, weight_decay, step_, grad_scale);
  xm_launch("adamw", xm_grid_1d(n, XM_TILE_THREADS), 1, 1, XM_TILE_THREADS, s, &k_adamw<S>, p, g, m,
            v, n, c);
}
XM_G_TABLE(adamw)

/* ---- adamw_multi: AdamW over many tensors in few launches ----------------------
 * The tensors' table is a host array; the launcher packs up to
 * XM_TILE_ADAMW_TENSORS of them (skipping empty ones) into a struct passed
 * by value, the first block of each tensor beside it, and launches one grid
 * per pack: block b finds its tensor by binary search over the packed first
 * blocks and updates XM_TILE_ADAMW_BLOCK_ELEMS elements of it with
 * xm_adamw_elem, k_adamw's arithmetic, so the result is the per-tensor one. */
struct xm_adamw_pack {
  xm_rt_adamw_tensor_t t[XM_TILE_ADAMW_TENSORS];
  int64_t first[XM_TILE_ADAMW_TENSORS + 1]; /* first block of tensor i; [count]: all */
  int64_t count;
};
static_assert(sizeof(xm_adamw_pack) + sizeof(xm_adamw_consts) <= 4096,
              "adamw_multi's launch arguments exceed the 4 KB both vendors allow");

template <class S>
XM_GLOBAL(XM_TILE_THREADS) k_adamw_multi(xm_adamw_pack pk, xm_adamw_consts c) {
  const int64_t blk = xm_bid_x();
  int64_t lo = 0, hi = pk.count - 1; /* the last tensor whose first block <= blk */
  while (lo < hi) {
    int64_t mid = (lo + hi + 1) / 2;
    if (pk.first[mid] <= blk)
      lo = mid;
    else
      hi = mid - 1;
  }
  float *p = pk.t[lo].p, *m = pk.t[lo].m, *v = pk.t[lo].v;
  const float *g = pk.t[lo].g;
  const float dec = pk.t[lo].decay ? c.decay : 1.0f;
  const int64_t i0 = (blk - pk.first[lo]) * XM_TILE_ADAMW_BLOCK_ELEMS;
  const int64_t i1 =
      i0 + XM_TILE_ADAMW_BLOCK_ELEMS < pk.t[lo].n ? i0 + XM_TILE_ADAMW_BLOCK_ELEMS : pk.t[lo].n;
  for (int64_t i = i0 + xm_tid(); i < i1; i += xm_ntid())
    xm_adamw_elem(p, g, m, v, i, c, dec);
}
template <class S>
void xm_g_adamw_multi(xm_stream_t s, const xm_rt_adamw_tensor_t *tensors, int64_t count_,
                      float lr, float beta1, float beta2, float eps, float weight_decay,
                      int64_t step_, float grad_scale) {
  const int64_t count = XM_DIM(S, count, count_);
  const xm_adamw_consts c =
      xm_adamw_consts_of(lr, beta1, beta2, eps, weight_decay, step_, grad_scale);
  xm_adamw_pack pk;
  memset(&pk, 0, sizeof pk);
  int64_t blocks = 0, last = -1; /* the last tensor with elements */
  for (int64_t i = 0; i < count; i++)
    if (tensors[i].n > 0) last = i;
  for (int64_t i = 0; i <= last; i++) {
    if (tensors[i].n <= 0) continue;
    pk.first[pk.count] = blocks;
    pk.t[pk.count++] = tensors[i];
    blocks += xm_cdiv(tensors[i].n, XM_TILE_ADAMW_BLOCK_ELEMS);
    if (pk.count == XM_TILE_ADAMW_TENSORS || i == last) {
      pk.first[pk.count] = blocks;
      xm_launch("adamw_multi", blocks, 1, 1, XM_TILE_THREADS, s, &k_adamw_multi<S>, pk, c);
      memset(&pk, 0, sizeof pk);
      blocks = 0;
    }
  }
}
XM_G_TABLE(adamw_multi)

/* ---- aux_free_update: bias[e] += gamma * sign(mean(load) - load[e]) ----------
 * One block: the loads are integers, so their double sum is exact in any
 * order; at load == mean the sign is 0 and the bias keeps its value. */
template <class S>
XM_GLOBAL(XM_TILE_THREADS) k_aux_free_update(float *bias, const int32_t *load, int64_t E_,
                                             float gamma) {
  const int64_t E = XM_DIM(S, E, E_);
  XM_SHARED(double, red, XM_TILE_THREADS);
  double part = 0.0; /* (the same trip count on every thread before the barriers) */
  for (int64_t e0 = 0; e0 < E; e0 += xm_ntid())
    if (e0 + xm_tid() < E) part += (double)load[e0 + xm_tid()];
  const double mean = xm_ew_block_sum_d(part, red) / (double)E;
  for (int64_t e = xm_tid(); e < E; e += xm_ntid()) {
    double d = mean - (double)load[e];
    float sign = d > 0.0 ? 1.0f : (d < 0.0 ? -1.0f : 0.0f);
    bias[e] += gamma * sign;
  }
}
template <class S>
void xm_g_aux_free_update(xm_stream_t s, float *bias, const int32_t *load, int64_t E_, float gamma) {
  const int64_t E = XM_DIM(S, E, E_);
  if (E <= 0) return;
  xm_launch("aux_free_update", 1, 1, 1, XM_TILE_THREADS, s, &k_aux_free_update<S>, bias, load, E,
            gamma);
}
XM_G_TABLE(aux_free_update)

/* ---- embedding: y[t,:] = table[tok[t],:] (a zero row for a negative id) ------
 * Block (x, y): columns of tile x (stride over x tiles) of tokens y, y +
 * grid y, ... */
template <class S>
XM_GLOBAL(XM_TILE_THREADS) k_embedding(const int32_t *tok, const float *table, float *y,
                                       int64_t n_tok_, int64_t H_) {
  const int64_t n_tok = XM_DIM(S, n_tok, n_tok_), H = XM_DIM(S, H, H_);
  for (int64_t t = xm_bid_y(); t < n_tok; t += xm_nbid_y()) {
    const int32_t id = tok[t];
    float *yr = y + t * H;
    const float *tr = table + (int64_t)(id < 0 ? 0 : id) * H;
    for (int64_t h = (int64_t)xm_bid_x() * xm_ntid() + xm_tid(); h < H;
         h += (int64_t)xm_nbid_x() * xm_ntid())
      yr[h] = id < 0 ? 0.0f : tr[h];
  }
}
template <class S>
void xm_g_embedding(xm_stream_t s, const int32_t *tok, const float *table, float *y,
                    int64_t n_tok_, int64_t H_) {
  const int64_t n_tok = XM_DIM(S, n_tok, n_tok_), H = XM_DIM(S, H, H_);
  const int64_t gy = n_tok < 65535 ? n_tok : 65535;
  xm_launch("embedding", xm_grid_1d(H, XM_TILE_THREADS), gy, 1, XM_TILE_THREADS, s,
            &k_embedding<S>, tok, table, y, n_tok, H);
}
XM_G_TABLE(embedding)

/* ---- embedding_grad: dtable[v,:] = sum of dy[i,:] over tokens i with id v ----
 * Block (x, p) and its thread own column h = x*threads + tid of the rows
 * v = p, p + P, ...: it zeroes them, then adds, in token order, the dy rows
 * of the tokens whose id is one of them (ids outside [0, V) are skipped).
 * Ids go through shared memory a block's width at a time, each replaced by
 * -1 there unless it belongs to this partition. */
template <class S>
XM_GLOBAL(XM_TILE_THREADS) k_embedding_grad(const float *dy, const int32_t *tok, float *dtable,
                                            int64_t n_tok_, int64_t V_, int64_t H_) {
  const int64_t n_tok = XM_DIM(S, n_tok, n_tok_), V = XM_DIM(S, V, V_), H = XM_DIM(S, H, H_);
  XM_SHARED(int32_t, ids, XM_TILE_THREADS);
  const int64_t P = xm_nbid_y(), p = xm_bid_y(), nt = xm_ntid();
  const int64_t h = (int64_t)xm_bid_x() * nt + xm_tid();
  if (h < H)
    for (int64_t v = p; v < V; v += P) dtable[v * H + h] = 0.0f;
  for (int64_t i0 = 0; i0 < n_tok; i0 += nt) {
    const int64_t i = i0 + xm_tid();
    int32_t id = -1;
    if (i < n_tok) {
      const int32_t t = tok[i];
      if (t >= 0 && (int64_t)t < V && (int64_t)t % P == p) id = t;
    }
    xm_sync(); /* the previous chunk is read by everyone */
    ids[xm_tid()] = id;
    xm_sync();
    const int64_t cnt = n_tok - i0 < nt ? n_tok - i0 : nt;
    if (h < H)
      for (int64_t j = 0; j < cnt; j++) {
        const int32_t t = ids[j];
        if (t >= 0) dtable[(int64_t)t * H + h] += dy[(i0 + j) * H + h];
      }
  }
}
template <class S>
void xm_g_embedding_grad(xm_stream_t s, const float *dy, const int32_t *tok, float *dtable,
                         int64_t n_tok_, int64_t V_, int64_t H_) {
  const int64_t n_tok = XM_DIM(S, n_tok, n_tok_), V = XM_DIM(S, V, V_), H = XM_DIM(S, H, H_);
  const int64_t parts = V < XM_TILE_ELEMENTWISE_EMB_PARTS ? V : XM_TILE_ELEMENTWISE_EMB_PARTS;
  xm_launch("embedding_grad", xm_cdiv(H, XM_TILE_THREADS), parts, 1, XM_TILE_THREADS, s,
            &k_embedding_grad<S>, dy, tok, dtable, n_tok, V, H);
}
XM_G_TABLE(embedding_grad)

#endif /* XM_RUNTIME_GPU_KERNELS_ELEMENTWISE_CUH */
