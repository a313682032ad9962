/* runtime/gpu/kernels/gemm.cuh — the dense and grouped GEMMs, f32 and bf16,
 * and the GEMM core every GEMM kernel of the GPU path instantiates
 * (fused.cuh adds only operand addressing and epilogues to it).
 *
 * Layouts (runtime/cpu/kernels.h): weights are [out, in]; matmul y[M,N] =
 * x[M,K] w[N,K]^T, dx = dy w, dw[N,K] = dy^T x; the grouped GEMMs run the
 * routed rows of expert e (consecutive, tpe[e] of them, n = sum(tpe) read
 * on the device) against w[e] of [M,K].
 *
 * The core. A block of XM_GEMM_THREADS threads (XM_TILE_GEMM_WARPS warps)
 * computes one BM x BN tile of C = A B over a reduction of `red`, staging
 * BK-deep slices of A and B in shared memory, double-buffered: the global
 * loads of slice s+1 go to registers while slice s is multiplied, one
 * barrier per slice. A shared tile keeps the operand's orientation in
 * memory (rows of contiguous elements, 16-byte loads and stores wherever
 * alignment allows, scalar at the edges, zeros past them), so an operand
 * read "transposed" (dx reads w, dw reads dy and x the other way round)
 * costs nothing at staging; the inner loop reads each orientation with the
 * matching strides. An operand (xm_gemm_rows, xm_gemm_weight, and the
 * gathered token rows of fused.cuh) says where its row r starts: A's rows
 * go through a row map (the expert's first row, or a gather through the
 * slot index), and an operand may scale its rows (fused.cuh). An epilogue
 * (xm_gemm_put overloads) stores each result: f32 or bf16 (rounded to
 * nearest even), or dw = beta dw + product.
 *   f32 operands: a SIMT loop, each thread a TM x 4 micro-tile of true f32
 *     FMAs (a TF32 or bf16 path would fail the tolerances by design);
 *   bf16 operands: the warp MMA of xm_gpu.h, f32 accumulation; the warps
 *     form a XM_TILE_GEMM_WARPS_M x (WARPS / WARPS_M) grid, each warp a
 *     (BM / WARPS_M) x (BN / WARPS_N) tile of MI x NJ MMA tiles, the
 *     counts written in XM_MMA_M/N/K only (16 x 16 on AMD, 16 x 8 on
 *     NVIDIA).
 *
 * Work to blocks. A launch gets a 1-D grid and every block loops over tile
 * numbers bid, bid + grid, ... (a block that runs out exits at once):
 *   - rows GEMMs (forward, dx): tile numbers run over the experts in order,
 *     each expert's row tiles times the column tiles, swizzled in groups of
 *     XM_TILE_GEMM_GROUP row tiles (a group's A rows stay in L2 across its
 *     column tiles). A block builds the experts' prefix over tpe once, in
 *     shared memory (a block-wide scan, E in chunks of its threads), and
 *     finds each tile's expert there by binary search (past
 *     XM_TILE_GEMM_PREFIX_E experts it scans tpe for every tile). The
 *     host never reads n: where the signature bounds the rows (dense M, T*k in
 *     fused.cuh) the grid is that bound's tile count, else
 *     XM_TILE_GEMM_GRID blocks loop;
 *   - weight gradients (dw = dy^T x per expert): a variable-reduction GEMM
 *     over the expert's rows, tiles over (expert, M tile, K tile); an
 *     expert without rows gets zeros (beta 0) or is left bit for bit
 *     (beta 1).
 * Everything is deterministic: each output element is one thread's sum in
 * a fixed order; no atomics.
 */
#ifndef XM_RUNTIME_GPU_KERNELS_GEMM_CUH
#define XM_RUNTIME_GPU_KERNELS_GEMM_CUH

#include "runtime/gpu/kernels/common.cuh"

/* Tiling of this file (the block tile itself is tiles.h's):
 *   WARPS_M  warps along M in a bf16 block (WARPS / WARPS_M along N);
 *   GROUP    row tiles per swizzle group of a rows GEMM;
 *   GRID     blocks of a launch whose tile count the host cannot bound
 *            (the grouped GEMMs without T); they loop over the tiles;
 *   MAX_GRID most blocks of any other GEMM launch (blocks loop past it);
 *   PREFIX_E most experts whose prefix over tpe a block keeps in shared
 *            memory (built once per block; above it every tile scans tpe).
 * The emulator runs blocks on the CPU: small grids and prefix there, so
 * that the blocks' tile loops and both expert lookups are what the
 * conformance cases exercise. */
#if defined(XM_GPU_EMU)
#define XM_TILE_GEMM_WARPS_M 2
#define XM_TILE_GEMM_GROUP 8
#define XM_TILE_GEMM_GRID 4
#define XM_TILE_GEMM_MAX_GRID 4
#define XM_TILE_GEMM_PREFIX_E 4
#elif defined(XM_TARGET_AMD)
#define XM_TILE_GEMM_WARPS_M 2
#define XM_TILE_GEMM_GROUP 8
#define XM_TILE_GEMM_GRID 4096
#define XM_TILE_GEMM_MAX_GRID 65535
#define XM_TILE_GEMM_PREFIX_E 1024
#else
#define XM_TILE_GEMM_WARPS_M 2
#define XM_TILE_GEMM_GROUP 8
#define XM_TILE_GEMM_GRID 4096
#define XM_TILE_GEMM_MAX_GRID 65535
#define XM_TILE_GEMM_PREFIX_E 1024
#endif

/* Threads of a GEMM block. */
#define XM_GEMM_THREADS (XM_TILE_GEMM_WARPS * XM_WARP)

#define XM_GEMM_BM XM_TILE_GEMM_BM
#define XM_GEMM_BN XM_TILE_GEMM_BN
#define XM_GEMM_BK XM_TILE_GEMM_BK

/* Full unrolling of the loops over a thread's fixed-size register tiles
 * (the accumulators must stay in registers); nothing on the emulator. */
#if defined(XM_GPU_EMU)
#define XM_GEMM_UNROLL
#else
#define XM_GEMM_UNROLL _Pragma("unroll")
#endif

/* ---- small helpers ------------------------------------------------------ */

/* 16 bytes, the unit of the vector loads and stores. */
struct alignas(16) xm_gemm_v16 {
  uint32_t w[4];
};

XM_DEV xm_gemm_v16 xm_gemm_ld16(const void *p) {
#if defined(XM_GPU_EMU)
  xm_gemm_v16 v;
  memcpy(&v, p, 16);
  return v;
#else
  return *(const xm_gemm_v16 *)p;
#endif
}

XM_DEV void xm_gemm_st16(void *p, const xm_gemm_v16 &v) {
#if defined(XM_GPU_EMU)
  memcpy(p, &v, 16);
#else
  *(xm_gemm_v16 *)p = v;
#endif
}

/* Rows of `ld` elements from a 16-byte aligned base: 16-byte loads work. */
template <class T> XM_DEV bool xm_gemm_aligned(const T *p, int64_t ld) {
  return ((uintptr_t)p % 16) == 0 && ld % (int64_t)(16 / sizeof(T)) == 0;
}

/* Element conversion at staging: bf16 kept as bits, or widened to f32. */
XM_DEV void xm_gemm_cvt(float s, float *d) { *d = s; }
XM_DEV void xm_gemm_cvt(xm_bf16 s, xm_bf16 *d) { *d = s; }
XM_DEV void xm_gemm_cvt(xm_bf16 s, float *d) { *d = xm_bf2f(s); }

template <class T> struct xm_gemm_is_f32 { static constexpr bool v = false; };
template <> struct xm_gemm_is_f32<float> { static constexpr bool v = true; };

/* Inclusive prefix sum over the warp (lane order). */
XM_DEV int xm_gemm_warp_scan_i(int v) {
  const int lane = xm_lane();
  for (int d = 1; d < XM_WARP; d <<= 1) {
    int o = xm_shfl_i(v, lane >= d ? lane - d : lane);
    if (lane >= d) v += o;
  }
  return v;
}

/* Exclusive prefix sum of v over the block (thread order) and the block's
 * total. Barriers inside: every thread calls it. sh: XM_MAX_WARPS ints of
 * shared memory owned by the caller. */
XM_DEV int xm_gemm_block_scan(int v, int *total, int *sh) {
  const int lane = xm_lane(), w = xm_warp_id(), nw = xm_nwarps();
  const int x = xm_gemm_warp_scan_i(v);
  xm_sync();
  if (lane == XM_WARP - 1) sh[w] = x;
  xm_sync();
  int before = 0, tot = 0;
  for (int i = 0; i < nw; i++) {
    const int s = sh[i];
    before += i < w ? s : 0;
    tot += s;
  }
  *total = tot;
  return before + x - v;
}

/* ---- the tile, operands and epilogues ----------------------------------- */

/* One output tile: rows [m0, m0 + BM) of mext, columns [n0, n0 + BN) of
 * next, reduction over red. e is the expert (0 when dense). row0: the
 * routed row of problem row 0 (rows GEMMs: output row m is routed row
 * row0 + m; dw: reduction index i is routed row row0 + i). */
struct xm_gemm_tile {
  int64_t e, row0, m0, n0, mext, next, red;
};

/* Rows of a matrix of ld elements; problem row r is row row0 + r. RED: the
 * rows are the reduction index (dw), else they are the output rows. */
template <class T, bool RED> struct xm_gemm_rows {
  typedef T type;
  static constexpr bool kRed = RED, kScaled = false;
  const T *p;
  int64_t ld;
};
template <class T, bool R>
XM_DEV const T *xm_gemm_row(const xm_gemm_rows<T, R> &o, const xm_gemm_tile &t, int64_t r) {
  return o.p + (t.row0 + r) * o.ld;
}
template <class T, bool R>
XM_DEV float xm_gemm_scale(const xm_gemm_rows<T, R> &, const xm_gemm_tile &, int64_t) {
  return 1.0f;
}
template <class T, bool R> XM_DEV bool xm_gemm_vec(const xm_gemm_rows<T, R> &o) {
  return xm_gemm_aligned(o.p, o.ld);
}

/* The weight of the tile's expert, p + e * es, rows of ld elements (dense:
 * es = 0). RED: row r is reduction index r (dx reads w[N,K] as B[N][K]
 * with N the reduction), else output column r (forward: B = w^T). */
template <class T, bool RED> struct xm_gemm_weight {
  typedef T type;
  static constexpr bool kRed = RED, kScaled = false;
  const T *p;
  int64_t ld, es;
};
template <class T, bool R>
XM_DEV const T *xm_gemm_row(const xm_gemm_weight<T, R> &o, const xm_gemm_tile &t, int64_t r) {
  return o.p + t.e * o.es + r * o.ld;
}
template <class T, bool R>
XM_DEV float xm_gemm_scale(const xm_gemm_weight<T, R> &, const xm_gemm_tile &, int64_t) {
  return 1.0f;
}
template <class T, bool R> XM_DEV bool xm_gemm_vec(const xm_gemm_weight<T, R> &o) {
  return xm_gemm_aligned(o.p, o.ld) && o.es % (int64_t)(16 / sizeof(T)) == 0;
}

/* Output rows: element (m, n) at p[(row0 + m) * ld + n], f32 or bf16. */
template <class TO> struct xm_gemm_out_rows {
  TO *p;
  int64_t ld;
};
template <class TO>
XM_DEV void xm_gemm_put(const xm_gemm_out_rows<TO> &o, const xm_gemm_tile &t, int64_t m, int64_t n,
                        float v) {
  xm_st(o.p, (t.row0 + m) * o.ld + n, v);
}

/* Weight gradient: dw[e][m][n] = beta * dw + v (beta 0: dw is not read). */
struct xm_gemm_out_dw {
  float *p;
  int64_t ld, es;
  float beta;
};
XM_DEV void xm_gemm_put(const xm_gemm_out_dw &o, const xm_gemm_tile &t, int64_t m, int64_t n,
                        float v) {
  float *d = o.p + t.e * o.es + m * o.ld + n;
  *d = o.beta == 0.0f ? v : o.beta * *d + v;
}

/* ---- staging ------------------------------------------------------------- */

/* Shared-tile padding (elements) of a row of the reduction-contiguous (RC)
 * and the row-contiguous (MC) orientation. f32: RC rows of BK + 1 (odd:
 * the SIMT loop reads down columns without bank conflicts; scalar stores),
 * MC rows a multiple of 4 (16-byte stores). bf16: 16 bytes, so 16-byte
 * stores stay aligned and the fragment loads' lanes fall in distinct
 * banks. */
template <class T> struct xm_gemm_pad;
template <> struct xm_gemm_pad<float> { static constexpr int RC = 1, MC = 4; };
template <> struct xm_gemm_pad<xm_bf16> { static constexpr int RC = 8, MC = 8; };

/* A thread's share of an R x C tile (C contiguous in memory): PER chunks
 * of V elements (16 bytes of the operand), consecutive threads on
 * consecutive chunks of a row. FIXED: the tile's rows stay the same over
 * the reduction (output rows or columns), so their start pointers (and
 * scales) are looked up once per tile. */
template <class Ts, class O, int R, int C, bool FIXED> struct xm_gemm_stage {
  typedef typename O::type Tg;
  static constexpr int V = 16 / (int)sizeof(Tg);
  static constexpr int CPR = C / V;
  static constexpr int PER = R * CPR / XM_GEMM_THREADS;
  static_assert(C % V == 0 && (R * CPR) % XM_GEMM_THREADS == 0 && PER > 0,
                "gemm staging: the tile's chunks split evenly over the threads");
  Ts v[PER][V];
  const Tg *rp[FIXED ? PER : 1];
  float sc[(FIXED && O::kScaled) ? PER : 1];
};

template <class Ts, class O, int R, int C, bool F>
XM_DEV void xm_gemm_stage_rows(xm_gemm_stage<Ts, O, R, C, F> &st, const O &o, const xm_gemm_tile &t,
                               int64_t r0, int64_t rlim) {
  typedef xm_gemm_stage<Ts, O, R, C, F> St;
  XM_GEMM_UNROLL
  for (int p = 0; p < St::PER; p++) {
    const int64_t r = r0 + (xm_tid() + p * XM_GEMM_THREADS) / St::CPR;
    st.rp[p] = r < rlim ? xm_gemm_row(o, t, r) : nullptr;
    if constexpr (O::kScaled) st.sc[p] = r < rlim ? xm_gemm_scale(o, t, r) : 0.0f;
  }
}

/* Rows [r0, r0 + R) (below rlim) and columns [c0, c0 + C) (below clim)
 * into registers; zeros outside. */
template <class Ts, class O, int R, int C, bool F>
XM_DEV void xm_gemm_stage_load(xm_gemm_stage<Ts, O, R, C, F> &st, const O &o, const xm_gemm_tile &t,
                               int64_t r0, int64_t rlim, int64_t c0, int64_t clim, bool vec) {
  typedef xm_gemm_stage<Ts, O, R, C, F> St;
  typedef typename O::type Tg;
  static_assert(!O::kScaled || xm_gemm_is_f32<Ts>::v, "gemm staging: scaled rows need f32 tiles");
  XM_GEMM_UNROLL
  for (int p = 0; p < St::PER; p++) {
    const int ch = xm_tid() + p * XM_GEMM_THREADS;
    const int64_t c = c0 + (ch % St::CPR) * St::V;
    const Tg *src;
    float sc = 1.0f;
    if constexpr (F) {
      src = st.rp[p];
      if constexpr (O::kScaled) sc = st.sc[p];
    } else {
      const int64_t r = r0 + ch / St::CPR;
      src = r < rlim ? xm_gemm_row(o, t, r) : nullptr;
      if constexpr (O::kScaled) sc = r < rlim ? xm_gemm_scale(o, t, r) : 0.0f;
    }
    if (src && vec && c + St::V <= clim) {
      Tg tmp[St::V];
      const xm_gemm_v16 raw = xm_gemm_ld16(src + c);
      memcpy(tmp, &raw, 16);
      XM_GEMM_UNROLL
      for (int e = 0; e < St::V; e++)
        xm_gemm_cvt(tmp[e], &st.v[p][e]);
    } else {
      XM_GEMM_UNROLL
      for (int e = 0; e < St::V; e++) {
        if (src && c + e < clim)
          xm_gemm_cvt(src[c + e], &st.v[p][e]);
        else
          st.v[p][e] = (Ts)0;
      }
    }
    if constexpr (O::kScaled) {
      XM_GEMM_UNROLL
      for (int e = 0; e < St::V; e++)
        st.v[p][e] = sc * st.v[p][e];
    }
  }
}

/* The registers into buffer `buf` (of SZ elements, rows of LD) of the
 * shared tile sm. 16-byte stores index sm as 16-byte units, so that the
 * compiler sees their alignment. */
template <int LD, int SZ, class Ts, class O, int R, int C, bool F>
XM_DEV void xm_gemm_stage_store(const xm_gemm_stage<Ts, O, R, C, F> &st, Ts *sm, int buf) {
  typedef xm_gemm_stage<Ts, O, R, C, F> St;
  constexpr int PV = 16 / (int)sizeof(Ts); /* elements of Ts per 16 bytes */
  XM_GEMM_UNROLL
  for (int p = 0; p < St::PER; p++) {
    const int ch = xm_tid() + p * XM_GEMM_THREADS;
    const int off = buf * SZ + (ch / St::CPR) * LD + (ch % St::CPR) * St::V;
    if constexpr (LD % PV == 0 && SZ % PV == 0 && St::V % PV == 0) {
      xm_gemm_v16 *d = (xm_gemm_v16 *)sm + off / PV;
      XM_GEMM_UNROLL
      for (int q = 0; q < St::V / PV; q++) {
        xm_gemm_v16 w;
        memcpy(&w, &st.v[p][q * PV], 16);
        xm_gemm_st16(d + q, w);
      }
    } else {
      XM_GEMM_UNROLL
      for (int e = 0; e < St::V; e++)
        sm[off + e] = st.v[p][e];
    }
  }
}

/* ---- the inner loops ------------------------------------------------------ */

template <class Ts> struct xm_gemm_acc;

/* f32: thread (ty, tx) owns rows ty + i*TY and columns tx + j*TX. */
#define XM_GEMM_TN 4
#define XM_GEMM_TX (XM_GEMM_BN / XM_GEMM_TN)
#define XM_GEMM_TY (XM_GEMM_THREADS / XM_GEMM_TX)
#define XM_GEMM_TM (XM_GEMM_BM / XM_GEMM_TY)
static_assert(XM_GEMM_BN % XM_GEMM_TN == 0 && XM_GEMM_THREADS % XM_GEMM_TX == 0 &&
                  XM_GEMM_BM % XM_GEMM_TY == 0,
              "gemm: the f32 micro-tiles cover the block tile");

template <> struct xm_gemm_acc<float> { float c[XM_GEMM_TM][XM_GEMM_TN]; };

XM_DEV void xm_gemm_zero(xm_gemm_acc<float> &a) {
  XM_GEMM_UNROLL
  for (int i = 0; i < XM_GEMM_TM; i++)
    XM_GEMM_UNROLL
  for (int j = 0; j < XM_GEMM_TN; j++)
    a.c[i][j] = 0.0f;
}

/* A(m, kk) at sa[kk*LDA + m] (AR) or sa[m*LDA + kk]; B(kk, n) at
 * sb[kk*LDB + n] (BR) or sb[n*LDB + kk]. */
template <bool AR, bool BR, int LDA, int LDB>
XM_DEV void xm_gemm_compute(xm_gemm_acc<float> &acc, const float *sa, const float *sb) {
  const int tx = xm_tid() % XM_GEMM_TX, ty = xm_tid() / XM_GEMM_TX;
  XM_GEMM_UNROLL
  for (int kk = 0; kk < XM_GEMM_BK; kk++) {
    float av[XM_GEMM_TM], bv[XM_GEMM_TN];
    XM_GEMM_UNROLL
    for (int i = 0; i < XM_GEMM_TM; i++) {
      const int m = ty + i * XM_GEMM_TY;
      av[i] = AR ? sa[kk * LDA + m] : sa[m * LDA + kk];
    }
    XM_GEMM_UNROLL
    for (int j = 0; j < XM_GEMM_TN; j++) {
      const int n = tx + j * XM_GEMM_TX;
      bv[j] = BR ? sb[kk * LDB + n] : sb[n * LDB + kk];
    }
    XM_GEMM_UNROLL
    for (int i = 0; i < XM_GEMM_TM; i++)
      XM_GEMM_UNROLL
    for (int j = 0; j < XM_GEMM_TN; j++)
      acc.c[i][j] += av[i] * bv[j];
  }
}

template <class EP>
XM_DEV void xm_gemm_epilogue(const xm_gemm_acc<float> &acc, const xm_gemm_tile &t, const EP &ep) {
  const int tx = xm_tid() % XM_GEMM_TX, ty = xm_tid() / XM_GEMM_TX;
  XM_GEMM_UNROLL
  for (int i = 0; i < XM_GEMM_TM; i++) {
    const int64_t m = t.m0 + ty + i * XM_GEMM_TY;
    if (m >= t.mext) continue;
    XM_GEMM_UNROLL
    for (int j = 0; j < XM_GEMM_TN; j++) {
      const int64_t n = t.n0 + tx + j * XM_GEMM_TX;
      if (n < t.next) xm_gemm_put(ep, t, m, n, acc.c[i][j]);
    }
  }
}

/* bf16: warp (wm, wn) of the WARPS_M x WARPS_N grid owns a WTM x WTN tile
 * of MI x NJ MMA tiles. */
#define XM_GEMM_WARPS_N (XM_TILE_GEMM_WARPS / XM_TILE_GEMM_WARPS_M)
#define XM_GEMM_WTM (XM_GEMM_BM / XM_TILE_GEMM_WARPS_M)
#define XM_GEMM_WTN (XM_GEMM_BN / XM_GEMM_WARPS_N)
#define XM_GEMM_MI (XM_GEMM_WTM / XM_MMA_M)
#define XM_GEMM_NJ (XM_GEMM_WTN / XM_MMA_N)
static_assert(XM_TILE_GEMM_WARPS % XM_TILE_GEMM_WARPS_M == 0 &&
                  XM_GEMM_BM % (XM_TILE_GEMM_WARPS_M * XM_MMA_M) == 0 &&
                  XM_GEMM_BN % (XM_GEMM_WARPS_N * XM_MMA_N) == 0 && XM_GEMM_BK % XM_MMA_K == 0,
              "gemm: the warp tiles are whole MMA tiles");

template <> struct xm_gemm_acc<xm_bf16> { xm_frag_c c[XM_GEMM_MI][XM_GEMM_NJ]; };

XM_DEV void xm_gemm_zero(xm_gemm_acc<xm_bf16> &a) {
  XM_GEMM_UNROLL
  for (int i = 0; i < XM_GEMM_MI; i++)
    XM_GEMM_UNROLL
  for (int j = 0; j < XM_GEMM_NJ; j++)
    xm_frag_zero(&a.c[i][j]);
}

template <bool AR, bool BR, int LDA, int LDB>
XM_DEV void xm_gemm_compute(xm_gemm_acc<xm_bf16> &acc, const xm_bf16 *sa, const xm_bf16 *sb) {
  const int w = xm_warp_id(), wm = w / XM_GEMM_WARPS_N, wn = w % XM_GEMM_WARPS_N;
  XM_GEMM_UNROLL
  for (int ks = 0; ks < XM_GEMM_BK; ks += XM_MMA_K) {
    xm_frag_a fa[XM_GEMM_MI];
    xm_frag_b fb[XM_GEMM_NJ];
    XM_GEMM_UNROLL
    for (int i = 0; i < XM_GEMM_MI; i++) {
      const int m = wm * XM_GEMM_WTM + i * XM_MMA_M;
      if (AR)
        xm_frag_load_a(&fa[i], sa + ks * LDA + m, 1, LDA);
      else
        xm_frag_load_a(&fa[i], sa + m * LDA + ks, LDA, 1);
    }
    XM_GEMM_UNROLL
    for (int j = 0; j < XM_GEMM_NJ; j++) {
      const int n = wn * XM_GEMM_WTN + j * XM_MMA_N;
      if (BR)
        xm_frag_load_b(&fb[j], sb + ks * LDB + n, LDB, 1);
      else
        xm_frag_load_b(&fb[j], sb + n * LDB + ks, 1, LDB);
    }
    XM_GEMM_UNROLL
    for (int i = 0; i < XM_GEMM_MI; i++)
      XM_GEMM_UNROLL
    for (int j = 0; j < XM_GEMM_NJ; j++)
      xm_mma(&acc.c[i][j], &fa[i], &fb[j]);
  }
}

template <class EP>
XM_DEV void xm_gemm_epilogue(const xm_gemm_acc<xm_bf16> &acc, const xm_gemm_tile &t, const EP &ep) {
  const int lane = xm_lane(), w = xm_warp_id(), wm = w / XM_GEMM_WARPS_N, wn = w % XM_GEMM_WARPS_N;
  XM_GEMM_UNROLL
  for (int i = 0; i < XM_GEMM_MI; i++)
    XM_GEMM_UNROLL
  for (int j = 0; j < XM_GEMM_NJ; j++)
    XM_GEMM_UNROLL
  for (int q = 0; q < XM_FRAG_C_N; q++) {
    int r, c;
    xm_frag_c_coord(lane, q, &r, &c);
    const int64_t m = t.m0 + wm * XM_GEMM_WTM + i * XM_MMA_M + r;
    const int64_t n = t.n0 + wn * XM_GEMM_WTN + j * XM_MMA_N + c;
    if (m < t.mext && n < t.next) xm_gemm_put(ep, t, m, n, acc.c[i][j].e[q]);
  }
}

/* ---- one tile ---------------------------------------------------------------
 * Ts: the shared-tile and arithmetic type (float: SIMT; xm_bf16: MMA).
 * Every thread of the block calls it with the same tile. */
template <class Ts, class OA, class OB, class EP>
XM_DEV void xm_gemm_tile_run(const xm_gemm_tile &t, const OA &a, const OB &b, const EP &ep) {
  constexpr int BM = XM_GEMM_BM, BN = XM_GEMM_BN, BK = XM_GEMM_BK;
  constexpr bool AR = OA::kRed, BR = OB::kRed;
  constexpr int LDA = AR ? BM + xm_gemm_pad<Ts>::MC : BK + xm_gemm_pad<Ts>::RC;
  constexpr int SZA = AR ? BK * LDA : BM * LDA;
  constexpr int LDB = BR ? BN + xm_gemm_pad<Ts>::MC : BK + xm_gemm_pad<Ts>::RC;
  constexpr int SZB = BR ? BK * LDB : BN * LDB;
  static_assert(2 * (SZA + SZB) * sizeof(Ts) + 2 * (XM_TILE_GEMM_PREFIX_E + 1) * sizeof(int) +
                        512 <=
                    48 * 1024,
                "gemm: the shared tiles and the expert prefixes within 48 KB");
  XM_SHARED(Ts, sa, 2 * SZA);
  XM_SHARED(Ts, sb, 2 * SZB);
  /* A: output rows x reduction (AR: reduction x output rows); B: output
   * columns x reduction (BR: reduction x output columns). */
  xm_gemm_stage<Ts, OA, AR ? BK : BM, AR ? BM : BK, !AR> la;
  xm_gemm_stage<Ts, OB, BR ? BK : BN, BR ? BN : BK, !BR> lb;
  const bool va = xm_gemm_vec(a), vb = xm_gemm_vec(b);
  if constexpr (!AR) xm_gemm_stage_rows(la, a, t, t.m0, t.mext);
  if constexpr (!BR) xm_gemm_stage_rows(lb, b, t, t.n0, t.next);
  xm_gemm_acc<Ts> acc;
  xm_gemm_zero(acc);
  const int64_t steps = xm_cdiv(t.red, BK);
  for (int64_t s = 0; s <= steps; s++) {
    /* s < steps: slice s goes into buffer s & 1 (registers, then shared,
     * after slice s - 1 was multiplied); s > 0: slice s - 1 is multiplied
     * while slice s is in flight. */
    if (s < steps) {
      const int64_t k0 = s * BK;
      if (AR)
        xm_gemm_stage_load(la, a, t, k0, t.red, t.m0, t.mext, va);
      else
        xm_gemm_stage_load(la, a, t, 0, 0, k0, t.red, va);
      if (BR)
        xm_gemm_stage_load(lb, b, t, k0, t.red, t.n0, t.next, vb);
      else
        xm_gemm_stage_load(lb, b, t, 0, 0, k0, t.red, vb);
    }
    if (s > 0)
      xm_gemm_compute<AR, BR, LDA, LDB>(acc, sa + ((s - 1) & 1) * SZA, sb + ((s - 1) & 1) * SZB);
    if (s < steps) {
      xm_gemm_stage_store<LDA, SZA>(la, sa, (int)(s & 1));
      xm_gemm_stage_store<LDB, SZB>(lb, sb, (int)(s & 1));
    }
    xm_sync();
  }
  xm_gemm_epilogue(acc, t, ep);
}

/* ---- tile schedules ------------------------------------------------------- */

/* The experts' prefixes over tpe, once per block: R[e] routed rows before
 * expert e and (P not NULL) P[e] row tiles before e of the experts' rows
 * inside the window [w0, w1), for e <= E (E <= XM_TILE_GEMM_PREFIX_E;
 * shared memory). Barriers inside: every thread calls it. */
XM_DEV void xm_gemm_prefix(const int32_t *tpe, int64_t E, int64_t w0, int64_t w1, int *R, int *P) {
  XM_SHARED(int, sh, XM_MAX_WARPS);
  int64_t carry_r = 0, carry_t = 0;
  for (int64_t base = 0; base < E; base += xm_ntid()) {
    const int64_t ee = base + xm_tid();
    const int r = ee < E ? tpe[ee] : 0;
    int tot_r, tot_t;
    const int64_t Re = carry_r + xm_gemm_block_scan(r, &tot_r, sh);
    const int64_t l = Re > w0 ? Re : w0, h = Re + r < w1 ? Re + r : w1;
    const int rt = h > l ? (int)xm_cdiv(h - l, XM_GEMM_BM) : 0;
    const int64_t Pe = carry_t + xm_gemm_block_scan(rt, &tot_t, sh);
    if (ee < E) {
      R[ee] = (int)Re;
      if (P) P[ee] = (int)Pe;
    }
    carry_r += tot_r;
    carry_t += tot_t;
  }
  if (xm_tid() == 0) {
    R[E] = (int)carry_r;
    if (P) P[E] = (int)carry_t;
  }
  xm_sync();
}

/* Expert of row tile g (among all experts' windowed row tiles) from the
 * shared prefixes: the e with P[e] <= g < P[e + 1]; its window rows
 * [*lo, *lo + *re) and its first row tile *tb. False past the last. */
XM_DEV bool xm_gemm_lookup(const int *R, const int *P, int64_t E, int64_t w0, int64_t w1, int64_t g,
                           int64_t *e, int64_t *lo, int64_t *re, int64_t *tb) {
  if (g >= P[E]) return false;
  int64_t a = 0, b = E;
  while (b - a > 1) {
    const int64_t mid = (a + b) / 2;
    if (P[mid] <= g)
      a = mid;
    else
      b = mid;
  }
  const int64_t l = R[a] > w0 ? R[a] : w0, h = R[a + 1] < w1 ? R[a + 1] : w1;
  *e = a;
  *lo = l;
  *re = h - l;
  *tb = P[a];
  return true;
}

/* The same without the shared prefixes (E above XM_TILE_GEMM_PREFIX_E):
 * a block-wide scan over tpe for this tile. Barriers inside. */
XM_DEV bool xm_gemm_scan(const int32_t *tpe, int64_t E, int64_t w0, int64_t w1, int64_t g,
                         int64_t *e, int64_t *lo, int64_t *re, int64_t *tb) {
  XM_SHARED(int64_t, res, 4);
  XM_SHARED(int, sh, XM_MAX_WARPS);
  if (xm_tid() == 0) res[0] = -1;
  xm_sync();
  int64_t carry_r = 0, carry_t = 0;
  for (int64_t base = 0; base < E && carry_r < w1; base += xm_ntid()) {
    const int64_t ee = base + xm_tid();
    const int r = ee < E ? tpe[ee] : 0;
    int tot_r, tot_t;
    const int64_t Re = carry_r + xm_gemm_block_scan(r, &tot_r, sh);
    const int64_t l = Re > w0 ? Re : w0, h = Re + r < w1 ? Re + r : w1;
    const int rt = h > l ? (int)xm_cdiv(h - l, XM_GEMM_BM) : 0;
    const int64_t T0 = carry_t + xm_gemm_block_scan(rt, &tot_t, sh);
    if (rt > 0 && g >= T0 && g < T0 + rt) {
      res[0] = ee;
      res[1] = l;
      res[2] = h - l;
      res[3] = T0;
    }
    xm_sync();
    if (res[0] >= 0) break;
    carry_r += tot_r;
    carry_t += tot_t;
  }
  *e = res[0];
  *lo = res[1];
  *re = res[2];
  *tb = res[3];
  xm_sync(); /* res is read before the next call resets it */
  return *e >= 0;
}

/* Expert e's first routed row, sum of tpe[0..e), without the shared
 * prefixes. Barriers inside. */
XM_DEV int64_t xm_gemm_expert_row0(const int32_t *tpe, int64_t e) {
  XM_SHARED(int, sh, XM_MAX_WARPS);
  int64_t sum = 0;
  for (int64_t base = 0; base < e; base += xm_ntid()) {
    const int64_t ee = base + xm_tid();
    int tot;
    xm_gemm_block_scan(ee < e ? tpe[ee] : 0, &tot, sh);
    sum += tot;
  }
  return sum;
}

/* Tile `local` of an output of rt row tiles x ct column tiles, swizzled:
 * groups of GROUP row tiles, the group's column tiles one after the other,
 * row tiles fastest (a group's A rows stay in L2 over its columns). */
XM_DEV void xm_gemm_swizzle(int64_t local, int64_t rt, int64_t ct, xm_gemm_tile *t) {
  const int64_t G = XM_TILE_GEMM_GROUP, grp = local / (G * ct), first = grp * G;
  const int64_t gs = rt - first < G ? rt - first : G, in = local - grp * G * ct;
  t->m0 = (first + in % gs) * XM_GEMM_BM;
  t->n0 = (in / gs) * XM_GEMM_BN;
}

/* A rows GEMM: output rows = each expert's routed rows inside the window
 * [w0, w1) (tpe NULL: `rows` dense rows), N columns, reduction red. Tile
 * numbers run over the experts, each expert's row tiles times the column
 * tiles; the block takes numbers bid, bid + grid, ... */
template <class Ts, class OA, class OB, class EP>
XM_DEV void xm_gemm_run_rows(const int32_t *tpe, int64_t E, int64_t rows, int64_t w0, int64_t w1,
                             int64_t N, int64_t red, const OA &a, const OB &b, const EP &ep) {
  XM_SHARED(int, R, XM_TILE_GEMM_PREFIX_E + 1);
  XM_SHARED(int, P, XM_TILE_GEMM_PREFIX_E + 1);
  const int64_t nct = xm_cdiv(N, XM_GEMM_BN);
  if (nct <= 0) return;
  const bool cached = tpe && E <= XM_TILE_GEMM_PREFIX_E;
  if (cached) xm_gemm_prefix(tpe, E, w0, w1, R, P);
  for (int64_t id = xm_bid_x();; id += xm_nbid_x()) {
    int64_t e = 0, lo = 0, re = rows, tb = 0;
    bool ok;
    if (!tpe)
      ok = id < xm_cdiv(rows, XM_GEMM_BM) * nct;
    else if (cached)
      ok = xm_gemm_lookup(R, P, E, w0, w1, id / nct, &e, &lo, &re, &tb);
    else
      ok = xm_gemm_scan(tpe, E, w0, w1, id / nct, &e, &lo, &re, &tb);
    if (!ok) return;
    xm_gemm_tile t;
    xm_gemm_swizzle(id - tb * nct, xm_cdiv(re, XM_GEMM_BM), nct, &t);
    t.e = e;
    t.row0 = lo;
    t.mext = re;
    t.next = N;
    t.red = red;
    xm_gemm_tile_run<Ts>(t, a, b, ep);
  }
}

/* A weight-gradient GEMM: dw[e] (Mo x Ko) = sum over the expert's routed
 * rows (tpe NULL: `rows` dense rows) of A^T B. Tiles (expert, M tile, K
 * tile); beta 1 leaves an expert without rows untouched. */
template <class Ts, class OA, class OB>
XM_DEV void xm_gemm_run_dw(const int32_t *tpe, int64_t E, int64_t rows, int64_t Mo, int64_t Ko,
                           const OA &a, const OB &b, const xm_gemm_out_dw &ep) {
  XM_SHARED(int, R, XM_TILE_GEMM_PREFIX_E + 1);
  const int64_t mt = xm_cdiv(Mo, XM_GEMM_BM), nt = xm_cdiv(Ko, XM_GEMM_BN), per = mt * nt;
  const int64_t total = E * per;
  if (total <= 0) return;
  const bool cached = tpe && E <= XM_TILE_GEMM_PREFIX_E;
  if (cached) xm_gemm_prefix(tpe, E, 0, INT64_MAX, R, nullptr);
  for (int64_t id = xm_bid_x(); id < total; id += xm_nbid_x()) {
    const int64_t e = id / per;
    xm_gemm_tile t;
    t.e = e;
    if (!tpe) {
      t.row0 = 0;
      t.red = rows;
    } else if (cached) {
      t.row0 = R[e];
      t.red = R[e + 1] - R[e];
    } else {
      t.row0 = xm_gemm_expert_row0(tpe, e);
      t.red = tpe[e];
    }
    if (t.red == 0 && ep.beta == 1.0f) continue; /* bit for bit as it was */
    xm_gemm_swizzle(id - e * per, mt, nt, &t);
    t.mext = Mo;
    t.next = Ko;
    xm_gemm_tile_run<Ts>(t, a, b, ep);
  }
}

/* Grid of a launch of `tiles` tiles (blocks loop past the cap). */
static inline int64_t xm_gemm_grid(int64_t tiles) {
  return tiles < XM_TILE_GEMM_MAX_GRID ? tiles : XM_TILE_GEMM_MAX_GRID;
}

/* ---- the kernels' bodies, shared by f32 and bf16 --------------------------- */

/* y[M,N] = x[M,K] w[N,K]^T */
template <class Ts, class T, class TO>
XM_DEV void xm_gemm_dense_fwd(const T *x, const T *w, TO *y, int64_t M, int64_t K, int64_t N) {
  const xm_gemm_rows<T, false> a = {x, K};
  const xm_gemm_weight<T, false> b = {w, K, 0};
  const xm_gemm_out_rows<TO> o = {y, N};
  xm_gemm_run_rows<Ts>(nullptr, 1, M, 0, INT64_MAX, N, K, a, b, o);
}

/* dx[M,K] = dy[M,N] w[N,K] */
template <class Ts, class T, class TO>
XM_DEV void xm_gemm_dense_dx(const T *dy, const T *w, TO *dx, int64_t M, int64_t K, int64_t N) {
  const xm_gemm_rows<T, false> a = {dy, N};
  const xm_gemm_weight<T, true> b = {w, K, 0};
  const xm_gemm_out_rows<TO> o = {dx, K};
  xm_gemm_run_rows<Ts>(nullptr, 1, M, 0, INT64_MAX, K, N, a, b, o);
}

/* dw[N,K] = beta dw + dy[M,N]^T x[M,K] */
template <class Ts, class T>
XM_DEV void xm_gemm_dense_dw(const T *dy, const T *x, float *dw, int64_t M, int64_t K, int64_t N,
                             float beta) {
  const xm_gemm_rows<T, true> a = {dy, N};
  const xm_gemm_rows<T, true> b = {x, K};
  const xm_gemm_out_dw o = {dw, K, 0, beta};
  xm_gemm_run_dw<Ts>(nullptr, 1, M, N, K, a, b, o);
}

/* y[n,M] = rows of expert e times w[e]^T: x[n,K], w[E,M,K] */
template <class Ts, class T, class TO>
XM_DEV void xm_gemm_grouped_fwd(const T *x, const T *w, const int32_t *tpe, TO *y, int64_t E,
                                int64_t K, int64_t M) {
  const xm_gemm_rows<T, false> a = {x, K};
  const xm_gemm_weight<T, false> b = {w, K, M * K};
  const xm_gemm_out_rows<TO> o = {y, M};
  xm_gemm_run_rows<Ts>(tpe, E, 0, 0, INT64_MAX, M, K, a, b, o);
}

/* dx[n,K] = rows of dy[n,M] times w[e] */
template <class Ts, class T, class TO>
XM_DEV void xm_gemm_grouped_dx(const T *dy, const T *w, const int32_t *tpe, TO *dx, int64_t E,
                               int64_t K, int64_t M) {
  const xm_gemm_rows<T, false> a = {dy, M};
  const xm_gemm_weight<T, true> b = {w, K, M * K};
  const xm_gemm_out_rows<TO> o = {dx, K};
  xm_gemm_run_rows<Ts>(tpe, E, 0, 0, INT64_MAX, K, M, a, b, o);
}

/* dw[e][M,K] = beta dw[e] + sum over the rows of e of dy^T x */
template <class Ts, class T>
XM_DEV void xm_gemm_grouped_dw(const T *dy, const T *x, const int32_t *tpe, float *dw, int64_t E,
                               int64_t K, int64_t M, float beta) {
  const xm_gemm_rows<T, true> a = {dy, M};
  const xm_gemm_rows<T, true> b = {x, K};
  const xm_gemm_out_dw o = {dw, K, M * K, beta};
  xm_gemm_run_dw<Ts>(tpe, E, 0, M, K, a, b, o);
}

/* Grids: dense rows GEMMs their tile count, dw GEMMs theirs, grouped rows
 * GEMMs (n unknown on the host) XM_TILE_GEMM_GRID looping blocks. */
static inline int64_t xm_gemm_grid_dense(int64_t rows, int64_t cols) {
  return xm_gemm_grid(xm_cdiv(rows, XM_GEMM_BM) * xm_cdiv(cols, XM_GEMM_BN));
}
static inline int64_t xm_gemm_grid_dw(int64_t E, int64_t Mo, int64_t Ko) {
  return xm_gemm_grid(E * xm_cdiv(Mo, XM_GEMM_BM) * xm_cdiv(Ko, XM_GEMM_BN));
}
static inline int64_t xm_gemm_grid_grouped(int64_t E, int64_t cols) {
  return E > 0 && cols > 0 ? XM_TILE_GEMM_GRID : 0;
}

/* ---- dense f32 ---------------------------------------------------------------
 * A grid of the output's tiles (capped; blocks loop). matmul_dw(_acc): dw
 * tiles over [N, K], the reduction over the M rows; M == 0 writes zeros
 * (dw) or leaves dw alone (_acc). */

template <class S>
XM_GLOBAL(XM_GEMM_THREADS)
k_matmul(const float *x, const float *w, float *y, int64_t M_, int64_t K_, int64_t N_) {
  const int64_t M = XM_DIM(S, M, M_), K = XM_DIM(S, K, K_), N = XM_DIM(S, N, N_);
  xm_gemm_dense_fwd<float>(x, w, y, M, K, N);
}
template <class S>
void xm_g_matmul(xm_stream_t s, const float *x, const float *w, float *y, int64_t M_, int64_t K_,
                 int64_t N_) {
  const int64_t M = XM_DIM(S, M, M_), N = XM_DIM(S, N, N_);
  xm_launch("matmul", xm_gemm_grid_dense(M, N), 1, 1, XM_GEMM_THREADS, s, &k_matmul<S>, x, w, y, M_,
            K_, N_);
}
XM_G_TABLE(matmul)

template <class S>
XM_GLOBAL(XM_GEMM_THREADS)
k_matmul_dx(const float *dy, const float *w, float *dx, int64_t M_, int64_t K_, int64_t N_) {
  const int64_t M = XM_DIM(S, M, M_), K = XM_DIM(S, K, K_), N = XM_DIM(S, N, N_);
  xm_gemm_dense_dx<float>(dy, w, dx, M, K, N);
}
template <class S>
void xm_g_matmul_dx(xm_stream_t s, const float *dy, const float *w, float *dx, int64_t M_,
                    int64_t K_, int64_t N_) {
  const int64_t M = XM_DIM(S, M, M_), K = XM_DIM(S, K, K_);
  xm_launch("matmul_dx", xm_gemm_grid_dense(M, K), 1, 1, XM_GEMM_THREADS, s, &k_matmul_dx<S>, dy, w,
            dx, M_, K_, N_);
}
XM_G_TABLE(matmul_dx)

template <class S>
XM_GLOBAL(XM_GEMM_THREADS)
k_matmul_dw(const float *dy, const float *x, float *dw, int64_t M_, int64_t K_, int64_t N_) {
  const int64_t M = XM_DIM(S, M, M_), K = XM_DIM(S, K, K_), N = XM_DIM(S, N, N_);
  xm_gemm_dense_dw<float>(dy, x, dw, M, K, N, 0.0f);
}
template <class S>
void xm_g_matmul_dw(xm_stream_t s, const float *dy, const float *x, float *dw, int64_t M_,
                    int64_t K_, int64_t N_) {
  const int64_t K = XM_DIM(S, K, K_), N = XM_DIM(S, N, N_);
  xm_launch("matmul_dw", xm_gemm_grid_dw(1, N, K), 1, 1, XM_GEMM_THREADS, s, &k_matmul_dw<S>, dy, x,
            dw, M_, K_, N_);
}
XM_G_TABLE(matmul_dw)

template <class S>
XM_GLOBAL(XM_GEMM_THREADS)
k_matmul_dw_acc(const float *dy, const float *x, float *dw, int64_t M_, int64_t K_, int64_t N_) {
  const int64_t M = XM_DIM(S, M, M_), K = XM_DIM(S, K, K_), N = XM_DIM(S, N, N_);
  xm_gemm_dense_dw<float>(dy, x, dw, M, K, N, 1.0f);
}
template <class S>
void xm_g_matmul_dw_acc(xm_stream_t s, const float *dy, const float *x, float *dw, int64_t M_,
                        int64_t K_, int64_t N_) {
  const int64_t M = XM_DIM(S, M, M_), K = XM_DIM(S, K, K_), N = XM_DIM(S, N, N_);
  if (M == 0) return;
  xm_launch("matmul_dw_acc", xm_gemm_grid_dw(1, N, K), 1, 1, XM_GEMM_THREADS, s,
            &k_matmul_dw_acc<S>, dy, x, dw, M_, K_, N_);
}
XM_G_TABLE(matmul_dw_acc)

/* ---- grouped f32 ---------------------------------------------------------------
 * Forward and dx: XM_TILE_GEMM_GRID blocks loop over (expert, row tile,
 * column tile); rows past n are never read or written. dw(_acc): tiles
 * (expert, M tile, K tile), the reduction over the expert's rows. */

template <class S>
XM_GLOBAL(XM_GEMM_THREADS)
k_grouped_matmul(const float *x, const float *w, const int32_t *tpe, float *y, int64_t E_,
                 int64_t K_, int64_t M_) {
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_), M = XM_DIM(S, M, M_);
  xm_gemm_grouped_fwd<float>(x, w, tpe, y, E, K, M);
}
template <class S>
void xm_g_grouped_matmul(xm_stream_t s, const float *x, const float *w, const int32_t *tpe,
                         float *y, int64_t E_, int64_t K_, int64_t M_) {
  const int64_t E = XM_DIM(S, E, E_), M = XM_DIM(S, M, M_);
  xm_launch("grouped_matmul", xm_gemm_grid_grouped(E, M), 1, 1, XM_GEMM_THREADS, s,
            &k_grouped_matmul<S>, x, w, tpe, y, E_, K_, M_);
}
XM_G_TABLE(grouped_matmul)

template <class S>
XM_GLOBAL(XM_GEMM_THREADS)
k_grouped_matmul_dx(const float *dy, const float *w, const int32_t *tpe, float *dx, int64_t E_,
                    int64_t K_, int64_t M_) {
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_), M = XM_DIM(S, M, M_);
  xm_gemm_grouped_dx<float>(dy, w, tpe, dx, E, K, M);
}
template <class S>
void xm_g_grouped_matmul_dx(xm_stream_t s, const float *dy, const float *w, const int32_t *tpe,
                            float *dx, int64_t E_, int64_t K_, int64_t M_) {
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_);
  xm_launch("grouped_matmul_dx", xm_gemm_grid_grouped(E, K), 1, 1, XM_GEMM_THREADS, s,
            &k_grouped_matmul_dx<S>, dy, w, tpe, dx, E_, K_, M_);
}
XM_G_TABLE(grouped_matmul_dx)

template <class S>
XM_GLOBAL(XM_GEMM_THREADS)
k_grouped_matmul_dw(const float *dy, const float *x, const int32_t *tpe, float *dw, int64_t E_,
                    int64_t K_, int64_t M_) {
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_), M = XM_DIM(S, M, M_);
  xm_gemm_grouped_dw<float>(dy, x, tpe, dw, E, K, M, 0.0f);
}
template <class S>
void xm_g_grouped_matmul_dw(xm_stream_t s, const float *dy, const float *x, const int32_t *tpe,
                            float *dw, int64_t E_, int64_t K_, int64_t M_) {
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_), M = XM_DIM(S, M, M_);
  xm_launch("grouped_matmul_dw", xm_gemm_grid_dw(E, M, K), 1, 1, XM_GEMM_THREADS, s,
            &k_grouped_matmul_dw<S>, dy, x, tpe, dw, E_, K_, M_);
}
XM_G_TABLE(grouped_matmul_dw)

template <class S>
XM_GLOBAL(XM_GEMM_THREADS)
k_grouped_matmul_dw_acc(const float *dy, const float *x, const int32_t *tpe, float *dw, int64_t E_,
                        int64_t K_, int64_t M_) {
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_), M = XM_DIM(S, M, M_);
  xm_gemm_grouped_dw<float>(dy, x, tpe, dw, E, K, M, 1.0f);
}
template <class S>
void xm_g_grouped_matmul_dw_acc(xm_stream_t s, const float *dy, const float *x, const int32_t *tpe,
                                float *dw, int64_t E_, int64_t K_, int64_t M_) {
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_), M = XM_DIM(S, M, M_);
  xm_launch("grouped_matmul_dw_acc", xm_gemm_grid_dw(E, M, K), 1, 1, XM_GEMM_THREADS, s,
            &k_grouped_matmul_dw_acc<S>, dy, x, tpe, dw, E_, K_, M_);
}
XM_G_TABLE(grouped_matmul_dw_acc)

/* ---- bf16 ---------------------------------------------------------------------
 * The same work through the warp MMA: bf16 operands, f32 accumulation;
 * forward and dx round to bf16, dw is f32 = beta dw + product. The
 * workspace ws is not needed (operands are widened in the MMA itself). */

template <class S>
XM_GLOBAL(XM_GEMM_THREADS)
k_matmul_bf16(const xm_bf16 *x, const xm_bf16 *w, xm_bf16 *y, int64_t M_, int64_t K_, int64_t N_) {
  const int64_t M = XM_DIM(S, M, M_), K = XM_DIM(S, K, K_), N = XM_DIM(S, N, N_);
  xm_gemm_dense_fwd<xm_bf16>(x, w, y, M, K, N);
}
template <class S>
void xm_g_matmul_bf16(xm_stream_t s, const xm_bf16 *x, const xm_bf16 *w, xm_bf16 *y, int64_t M_,
                      int64_t K_, int64_t N_, float *ws) {
  (void)ws;
  const int64_t M = XM_DIM(S, M, M_), N = XM_DIM(S, N, N_);
  xm_launch("matmul_bf16", xm_gemm_grid_dense(M, N), 1, 1, XM_GEMM_THREADS, s, &k_matmul_bf16<S>, x,
            w, y, M_, K_, N_);
}
XM_G_TABLE(matmul_bf16)

template <class S>
XM_GLOBAL(XM_GEMM_THREADS)
k_matmul_dx_bf16(const xm_bf16 *dy, const xm_bf16 *w, xm_bf16 *dx, int64_t M_, int64_t K_,
                 int64_t N_) {
  const int64_t M = XM_DIM(S, M, M_), K = XM_DIM(S, K, K_), N = XM_DIM(S, N, N_);
  xm_gemm_dense_dx<xm_bf16>(dy, w, dx, M, K, N);
}
template <class S>
void xm_g_matmul_dx_bf16(xm_stream_t s, const xm_bf16 *dy, const xm_bf16 *w, xm_bf16 *dx,
                         int64_t M_, int64_t K_, int64_t N_, float *ws) {
  (void)ws;
  const int64_t M = XM_DIM(S, M, M_), K = XM_DIM(S, K, K_);
  xm_launch("matmul_dx_bf16", xm_gemm_grid_dense(M, K), 1, 1, XM_GEMM_THREADS, s,
            &k_matmul_dx_bf16<S>, dy, w, dx, M_, K_, N_);
}
XM_G_TABLE(matmul_dx_bf16)

template <class S>
XM_GLOBAL(XM_GEMM_THREADS)
k_matmul_dw_bf16(const xm_bf16 *dy, const xm_bf16 *x, float *dw, int64_t M_, int64_t K_, int64_t N_,
                 float beta) {
  const int64_t M = XM_DIM(S, M, M_), K = XM_DIM(S, K, K_), N = XM_DIM(S, N, N_);
  xm_gemm_dense_dw<xm_bf16>(dy, x, dw, M, K, N, beta);
}
template <class S>
void xm_g_matmul_dw_bf16(xm_stream_t s, const xm_bf16 *dy, const xm_bf16 *x, float *dw, int64_t M_,
                         int64_t K_, int64_t N_, float beta, float *ws) {
  (void)ws;
  const int64_t K = XM_DIM(S, K, K_), N = XM_DIM(S, N, N_);
  xm_launch("matmul_dw_bf16", xm_gemm_grid_dw(1, N, K), 1, 1, XM_GEMM_THREADS, s,
            &k_matmul_dw_bf16<S>, dy, x, dw, M_, K_, N_, beta);
}
XM_G_TABLE(matmul_dw_bf16)

template <class S>
XM_GLOBAL(XM_GEMM_THREADS)
k_grouped_matmul_bf16(const xm_bf16 *x, const xm_bf16 *w, const int32_t *tpe, xm_bf16 *y,
                      int64_t E_, int64_t K_, int64_t M_) {
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_), M = XM_DIM(S, M, M_);
  xm_gemm_grouped_fwd<xm_bf16>(x, w, tpe, y, E, K, M);
}
template <class S>
void xm_g_grouped_matmul_bf16(xm_stream_t s, const xm_bf16 *x, const xm_bf16 *w, const int32_t *tpe,
                              xm_bf16 *y, int64_t E_, int64_t K_, int64_t M_, float *ws) {
  (void)ws;
  const int64_t E = XM_DIM(S, E, E_), M = XM_DIM(S, M, M_);
  xm_launch("grouped_matmul_bf16", xm_gemm_grid_grouped(E, M), 1, 1, XM_GEMM_THREADS, s,
            &k_grouped_matmul_bf16<S>, x, w, tpe, y, E_, K_, M_);
}
XM_G_TABLE(grouped_matmul_bf16)

template <class S>
XM_GLOBAL(XM_GEMM_THREADS)
k_grouped_matmul_dx_bf16(const xm_bf16 *dy, const xm_bf16 *w, const int32_t *tpe, xm_bf16 *dx,
                         int64_t E_, int64_t K_, int64_t M_) {
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_), M = XM_DIM(S, M, M_);
  xm_gemm_grouped_dx<xm_bf16>(dy, w, tpe, dx, E, K, M);
}
template <class S>
void xm_g_grouped_matmul_dx_bf16(xm_stream_t s, const xm_bf16 *dy, const xm_bf16 *w,
                                 const int32_t *tpe, xm_bf16 *dx, int64_t E_, int64_t K_,
                                 int64_t M_, float *ws) {
  (void)ws;
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_);
  xm_launch("grouped_matmul_dx_bf16", xm_gemm_grid_grouped(E, K), 1, 1, XM_GEMM_THREADS, s,
            &k_grouped_matmul_dx_bf16<S>, dy, w, tpe, dx, E_, K_, M_);
}
XM_G_TABLE(grouped_matmul_dx_bf16)

template <class S>
XM_GLOBAL(XM_GEMM_THREADS)
k_grouped_matmul_dw_bf16(const xm_bf16 *dy, const xm_bf16 *x, const int32_t *tpe, float *dw,
                         int64_t E_, int64_t K_, int64_t M_, float beta) {
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_), M = XM_DIM(S, M, M_);
  xm_gemm_grouped_dw<xm_bf16>(dy, x, tpe, dw, E, K, M, beta);
}
template <class S>
void xm_g_grouped_matmul_dw_bf16(xm_stream_t s, const xm_bf16 *dy, const xm_bf16 *x,
                                 const int32_t *tpe, float *dw, int64_t E_, int64_t K_, int64_t M_,
                                 float beta, float *ws) {
  (void)ws;
  const int64_t E = XM_DIM(S, E, E_), K = XM_DIM(S, K, K_), M = XM_DIM(S, M, M_);
  xm_launch("grouped_matmul_dw_bf16", xm_gemm_grid_dw(E, M, K), 1, 1, XM_GEMM_THREADS, s,
            &k_grouped_matmul_dw_bf16<S>, dy, x, tpe, dw, E_, K_, M_, beta);
}
XM_G_TABLE(grouped_matmul_dw_bf16)

#endif /* XM_RUNTIME_GPU_KERNELS_GEMM_CUH */
