/* runtime/gpu/kernels/common.cuh — what every GPU kernel template shares.
 *
 * Shapes. Each kernel of runtime/abi/kernels.def has a host launcher
 *   template <class S> void xm_g_<name>(xm_stream_t s, <its kernels.def arguments>)
 * whose shape type S has one `static constexpr int64_t` member per XM_I64
 * argument of its line, named as there: a value >= 0 is the size the code
 * generator knows at compile time (out/kernels.hip specialises every call
 * of the schedule this way), -1 a size read from the argument at run time
 * (the backends' kernel tables, runtime/gpu/table.cuh, use all -1). Kernel
 * text reads every size through XM_DIM, so a known size is a constant the
 * GPU compiler folds, and the same text serves both.
 *
 * Tiles come from runtime/gpu/tiles.h, per target.
 */
#ifndef XM_RUNTIME_GPU_KERNELS_COMMON_CUH
#define XM_RUNTIME_GPU_KERNELS_COMMON_CUH

#include <math.h>
#include <stdint.h>

#include "runtime/gpu/tiles.h"
#include "runtime/gpu/xm_gpu.h"

/* The size `f` of shape S: its constant, or the run-time value `rt`. */
#define XM_DIM(S, f, rt) ((S::f) >= 0 ? (int64_t)(S::f) : (int64_t)(rt))

/* Members of a shape type. */
#define XM_SHAPE_CONST(f, v) static constexpr int64_t f = (v);
#define XM_SHAPE_DYN(f) static constexpr int64_t f = -1;

/* Every size run-time: the shape of the backends' kernel tables. It names
 * every XM_I64 argument of runtime/abi/kernels.def (a kernel that reads a
 * size not listed here does not compile in the table). */
struct xm_shape_dyn {
  XM_SHAPE_DYN(M) XM_SHAPE_DYN(K) XM_SHAPE_DYN(N) XM_SHAPE_DYN(na) XM_SHAPE_DYN(nb)
  XM_SHAPE_DYN(n) XM_SHAPE_DYN(nx) XM_SHAPE_DYN(ny) XM_SHAPE_DYN(rows) XM_SHAPE_DYN(H)
  XM_SHAPE_DYN(B) XM_SHAPE_DYN(S) XM_SHAPE_DYN(nh) XM_SHAPE_DYN(D) XM_SHAPE_DYN(Hq)
  XM_SHAPE_DYN(Hkv) XM_SHAPE_DYN(Dv) XM_SHAPE_DYN(n_tok) XM_SHAPE_DYN(V) XM_SHAPE_DYN(T)
  XM_SHAPE_DYN(E) XM_SHAPE_DYN(k) XM_SHAPE_DYN(n_group) XM_SHAPE_DYN(topk_group)
  XM_SHAPE_DYN(capacity) XM_SHAPE_DYN(P) XM_SHAPE_DYN(L) XM_SHAPE_DYN(width)
  XM_SHAPE_DYN(tile_rows) XM_SHAPE_DYN(slots) XM_SHAPE_DYN(step) XM_SHAPE_DYN(chunk)
  XM_SHAPE_DYN(count) XM_SHAPE_DYN(off) XM_SHAPE_DYN(rd) XM_SHAPE_DYN(R) XM_SHAPE_DYN(Hb)
  XM_SHAPE_DYN(Da) XM_SHAPE_DYN(Db)
};

/* A kernel file ends each launcher with XM_G_TABLE(name): in a backend's
 * table file (runtime/gpu/table.cuh) it registers the launcher, elsewhere
 * (out/kernels.hip) it is nothing. */
#ifndef XM_G_BUILD_TABLE
#define XM_G_TABLE(name)
#endif

/* Sum of v over the block, returned to every thread; `red` is shared
 * memory of at least XM_MAX_WARPS floats. Deterministic: warp butterflies,
 * then the warps' sums in warp order. Contains barriers: every thread of
 * the block calls it. */
#define XM_MAX_WARPS 32
XM_DEV float xm_block_sum(float v, float *red) {
  v = xm_warp_sum(v);
  int w = xm_warp_id(), nw = xm_nwarps();
  xm_sync();
  if (xm_lane() == 0) red[w] = v;
  xm_sync();
  float s = 0.0f;
  for (int i = 0; i < nw; i++) s += red[i];
  return s;
}

/* Maximum of v over the block, as xm_block_sum. */
XM_DEV float xm_block_max(float v, float *red) {
  v = xm_warp_max(v);
  int w = xm_warp_id(), nw = xm_nwarps();
  xm_sync();
  if (xm_lane() == 0) red[w] = v;
  xm_sync();
  float s = red[0];
  for (int i = 1; i < nw; i++) s = red[i] > s ? red[i] : s;
  return s;
}

/* A grid-stride loop over [0, n) for 1-D elementwise kernels. */
#define XM_FOR_GRID(i, n)                                                                          \
  for (int64_t i = (int64_t)xm_bid_x() * xm_ntid() + xm_tid(); i < (n);                           \
       i += (int64_t)xm_nbid_x() * xm_ntid())

/* Blocks for an elementwise launch of n items: enough to fill the device,
 * never more than the items need. */
static inline int64_t xm_grid_1d(int64_t n, int threads) {
  int64_t b = xm_cdiv(n, threads);
  return b < XM_TILE_MAX_GRID_1D ? b : XM_TILE_MAX_GRID_1D;
}

#endif /* XM_RUNTIME_GPU_KERNELS_COMMON_CUH */
