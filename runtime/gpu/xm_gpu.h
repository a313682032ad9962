/* runtime/gpu/xm_gpu.h — the portability header of the GPU kernels.
 *
 * One kernel text (runtime/gpu/kernels/ and the out/kernels.hip the code
 * generator writes) is compiled three ways, and this header is the only
 * place that knows which (docs/design.md, The GPU path):
 *   - by hipcc for AMD (__HIPCC__): wavefront 64, MFMA matrix instructions;
 *   - by nvcc for NVIDIA (__CUDACC__): warp 32, mma.sync;
 *   - by a plain C++ compiler for the CPU emulation of the GPU execution
 *     model (runtime/emu/emu.h): blocks on OS threads, one fiber per GPU
 *     thread switched at barriers. XM_EMU_AMD=1 emulates the AMD target
 *     (wavefront 64, the MFMA fragment layouts), otherwise the NVIDIA one.
 *
 * Kernel text uses only what is defined here: thread and block indices,
 * the block barrier, warp collectives of the full warp (shuffle, sum, max),
 * shared memory through XM_SHARED, bf16 as raw 16-bit words with the
 * conversions of runtime/abi/bf16.h, atomics on integers, the warp matrix
 * multiply through fragments whose per-lane layout only this header knows,
 * and xm_launch. Never warpSize, raw shuffles or vendor intrinsics.
 */
#ifndef XM_RUNTIME_GPU_XM_GPU_H
#define XM_RUNTIME_GPU_XM_GPU_H

#include <stdint.h>
#include <string.h>

#if defined(__HIPCC__)
#define XM_GPU_HIP 1
#include <hip/hip_runtime.h>
#elif defined(__CUDACC__)
#define XM_GPU_CUDA 1
#include <cuda_runtime.h>
#else
#define XM_GPU_EMU 1
#include "runtime/emu/emu.h"
#endif

/* ---- the target: warp width and the matrix instruction ---------------- */
#if defined(XM_GPU_HIP) || (defined(XM_GPU_EMU) && defined(XM_EMU_AMD) && XM_EMU_AMD)
#define XM_TARGET_AMD 1
#define XM_WARP 64
#else
#define XM_TARGET_NV 1
#define XM_WARP 32
#endif

#if defined(XM_GPU_EMU)
#define XM_DEV static inline
#define XM_HOSTDEV static inline
#define XM_GLOBAL(threads) void
#define XM_SHARED(type, name, n) alignas(16) static thread_local type name[n]
typedef void *xm_stream_t;
#else
#define XM_DEV static __device__ __forceinline__
#define XM_HOSTDEV static __host__ __device__ __forceinline__
#define XM_GLOBAL(threads) __global__ void __launch_bounds__(threads)
#define XM_SHARED(type, name, n) __shared__ __align__(16) type name[n]
#if defined(XM_GPU_HIP)
typedef hipStream_t xm_stream_t;
#else
typedef cudaStream_t xm_stream_t;
#endif
#endif

/* ---- indices (1-D blocks, 3-D grids) ----------------------------------- */
#if defined(XM_GPU_EMU)
XM_DEV int xm_tid(void) { return xm_emu_self()->tid; }
XM_DEV int xm_ntid(void) { return xm_emu_block()->threads; }
XM_DEV int xm_bid_x(void) { return (int)xm_emu_block()->bx; }
XM_DEV int xm_bid_y(void) { return (int)xm_emu_block()->by; }
XM_DEV int xm_bid_z(void) { return (int)xm_emu_block()->bz; }
XM_DEV int xm_nbid_x(void) { return (int)xm_emu_block()->gx; }
XM_DEV int xm_nbid_y(void) { return (int)xm_emu_block()->gy; }
XM_DEV int xm_nbid_z(void) { return (int)xm_emu_block()->gz; }
/* A macro, so the emulator tells the barriers of a kernel apart by their
 * place in the source (threads at different ones: a divergent barrier).
 * The place survives whatever copies of the call the optimiser makes; two
 * barriers of one helper function called from two places share theirs, so
 * such a divergence goes unseen, never the other way round. */
#define xm_sync() xm_emu_sync_at(__FILE__, __LINE__)
#else
XM_DEV int xm_tid(void) { return (int)threadIdx.x; }
XM_DEV int xm_ntid(void) { return (int)blockDim.x; }
XM_DEV int xm_bid_x(void) { return (int)blockIdx.x; }
XM_DEV int xm_bid_y(void) { return (int)blockIdx.y; }
XM_DEV int xm_bid_z(void) { return (int)blockIdx.z; }
XM_DEV int xm_nbid_x(void) { return (int)gridDim.x; }
XM_DEV int xm_nbid_y(void) { return (int)gridDim.y; }
XM_DEV int xm_nbid_z(void) { return (int)gridDim.z; }
XM_DEV void xm_sync(void) { __syncthreads(); }
#endif
XM_DEV int xm_lane(void) { return xm_tid() % XM_WARP; }
XM_DEV int xm_warp_id(void) { return xm_tid() / XM_WARP; }
XM_DEV int xm_nwarps(void) { return (xm_ntid() + XM_WARP - 1) / XM_WARP; }

/* ---- warp collectives over the whole warp ------------------------------
 * Every lane of the warp must call them (blocks are whole warps). */
XM_DEV float xm_shfl_xor(float v, int mask) {
#if defined(XM_GPU_EMU)
  uint32_t u;
  memcpy(&u, &v, 4);
  u = xm_emu_shfl(u, xm_lane() ^ mask);
  memcpy(&v, &u, 4);
  return v;
#elif defined(XM_GPU_HIP)
  return __shfl_xor(v, mask, XM_WARP);
#else
  return __shfl_xor_sync(0xffffffffu, v, mask, XM_WARP);
#endif
}

XM_DEV int xm_shfl_xor_i(int v, int mask) {
#if defined(XM_GPU_EMU)
  return (int)xm_emu_shfl((uint32_t)v, xm_lane() ^ mask);
#elif defined(XM_GPU_HIP)
  return __shfl_xor(v, mask, XM_WARP);
#else
  return __shfl_xor_sync(0xffffffffu, v, mask, XM_WARP);
#endif
}

/* The value of lane `src` of the warp. */
XM_DEV float xm_shfl(float v, int src) {
#if defined(XM_GPU_EMU)
  uint32_t u;
  memcpy(&u, &v, 4);
  u = xm_emu_shfl(u, src);
  memcpy(&v, &u, 4);
  return v;
#elif defined(XM_GPU_HIP)
  return __shfl(v, src, XM_WARP);
#else
  return __shfl_sync(0xffffffffu, v, src, XM_WARP);
#endif
}

XM_DEV int xm_shfl_i(int v, int src) {
#if defined(XM_GPU_EMU)
  return (int)xm_emu_shfl((uint32_t)v, src);
#elif defined(XM_GPU_HIP)
  return __shfl(v, src, XM_WARP);
#else
  return __shfl_sync(0xffffffffu, v, src, XM_WARP);
#endif
}

/* Butterfly reductions: every lane gets the result, in the same order on
 * every lane (so the result is bitwise the same across the warp). */
XM_DEV float xm_warp_sum(float v) {
  for (int m = XM_WARP / 2; m > 0; m >>= 1) v += xm_shfl_xor(v, m);
  return v;
}
XM_DEV float xm_warp_max(float v) {
  for (int m = XM_WARP / 2; m > 0; m >>= 1) {
    float o = xm_shfl_xor(v, m);
    v = o > v ? o : v;
  }
  return v;
}
XM_DEV int xm_warp_sum_i(int v) {
  for (int m = XM_WARP / 2; m > 0; m >>= 1) v += xm_shfl_xor_i(v, m);
  return v;
}

/* ---- atomics (integers; kernels keep float sums deterministic) -------- */
XM_DEV int xm_atomic_add_i32(int *p, int v) {
#if defined(XM_GPU_EMU)
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
#else
  return atomicAdd(p, v);
#endif
}

/* ---- bf16: raw 16-bit words, the conversions of runtime/abi/bf16.h ---- */
typedef uint16_t xm_bf16;

XM_HOSTDEV float xm_bf2f(xm_bf16 h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

XM_HOSTDEV xm_bf16 xm_f2bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (xm_bf16)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (xm_bf16)(u >> 16);
}

/* Loads of an element as f32 whatever the storage (f32 or bf16), and the
 * store that rounds to the storage type: kernels written once for both. */
XM_HOSTDEV float xm_ld(const float *p, int64_t i) { return p[i]; }
XM_HOSTDEV float xm_ld(const xm_bf16 *p, int64_t i) { return xm_bf2f(p[i]); }
XM_HOSTDEV void xm_st(float *p, int64_t i, float v) { p[i] = v; }
XM_HOSTDEV void xm_st(xm_bf16 *p, int64_t i, float v) { p[i] = xm_f2bf(v); }

/* ---- the warp matrix multiply: D[M x N] += A[M x K] * B[K x N] ---------
 * bf16 operands, f32 accumulation, one warp. A fragment holds the lane's
 * share of A, B or the accumulator; which elements a lane holds is the
 * target's register layout, known only here:
 *   NVIDIA mma.sync.m16n8k16 (PTX ISA, Matrix Fragments), g = lane>>2,
 *   t = lane&3: A elem i (0..7) row g + 8*((i>>1)&1), col 2t + (i&1) +
 *   8*(i>=4); B elem i (0..3) k 2t + (i&1) + 8*(i>=2), n g; C elem i (0..3)
 *   row g + 8*(i>=2), col 2t + (i&1).
 *   AMD v_mfma_f32_16x16x16bf16_1k: A elem e (0..3) row lane%16, k
 *   4*(lane/16) + e; B elem e k 4*(lane/16) + e, n lane%16; D elem r
 *   (0..3) row 4*(lane/16) + r, col lane%16.
 * Kernels load fragments with xm_frag_load_a/b from any strided layout
 * (shared memory usually), call xm_mma, and find the row and column of
 * each accumulator element with xm_frag_c_coord for their epilogue. */
#define XM_MMA_M 16
#define XM_MMA_K 16
#if defined(XM_TARGET_AMD)
#define XM_MMA_N 16
#define XM_FRAG_A_N 4
#define XM_FRAG_B_N 4
#else
#define XM_MMA_N 8
#define XM_FRAG_A_N 8
#define XM_FRAG_B_N 4
#endif
#define XM_FRAG_C_N 4

typedef struct {
  xm_bf16 e[XM_FRAG_A_N];
} xm_frag_a;
typedef struct {
  xm_bf16 e[XM_FRAG_B_N];
} xm_frag_b;
typedef struct {
  float e[XM_FRAG_C_N];
} xm_frag_c;

/* Row (m) and column (k) of element i of this lane's A fragment. */
XM_DEV void xm_frag_a_coord(int lane, int i, int *row, int *col) {
#if defined(XM_TARGET_AMD)
  *row = lane % 16;
  *col = 4 * (lane / 16) + i;
#else
  int g = lane >> 2, t = lane & 3;
  *row = g + 8 * ((i >> 1) & 1);
  *col = 2 * t + (i & 1) + 8 * (i >= 4);
#endif
}

/* Row (k) and column (n) of element i of this lane's B fragment. */
XM_DEV void xm_frag_b_coord(int lane, int i, int *row, int *col) {
#if defined(XM_TARGET_AMD)
  *row = 4 * (lane / 16) + i;
  *col = lane % 16;
#else
  int g = lane >> 2, t = lane & 3;
  *row = 2 * t + (i & 1) + 8 * (i >= 2);
  *col = g;
#endif
}

/* Row (m) and column (n) of element i of this lane's accumulator. */
XM_DEV void xm_frag_c_coord(int lane, int i, int *row, int *col) {
#if defined(XM_TARGET_AMD)
  *row = 4 * (lane / 16) + i;
  *col = lane % 16;
#else
  int g = lane >> 2, t = lane & 3;
  *row = g + 8 * (i >= 2);
  *col = 2 * t + (i & 1);
#endif
}

/* A[r][c] = base[r * rs + c * cs] for the 16 x 16 tile at base. */
XM_DEV void xm_frag_load_a(xm_frag_a *f, const xm_bf16 *base, int rs, int cs) {
  int lane = xm_lane();
  for (int i = 0; i < XM_FRAG_A_N; i++) {
    int r, c;
    xm_frag_a_coord(lane, i, &r, &c);
    f->e[i] = base[r * rs + c * cs];
  }
}

/* B[k][n] = base[k * ks + n * ns] for the 16 x XM_MMA_N tile at base. */
XM_DEV void xm_frag_load_b(xm_frag_b *f, const xm_bf16 *base, int ks, int ns) {
  int lane = xm_lane();
  for (int i = 0; i < XM_FRAG_B_N; i++) {
    int r, c;
    xm_frag_b_coord(lane, i, &r, &c);
    f->e[i] = base[r * ks + c * ns];
  }
}

XM_DEV void xm_frag_zero(xm_frag_c *c) {
  for (int i = 0; i < XM_FRAG_C_N; i++) c->e[i] = 0.0f;
}

XM_DEV void xm_mma(xm_frag_c *d, const xm_frag_a *a, const xm_frag_b *b) {
#if defined(XM_GPU_EMU)
  /* Every lane deposits its fragments; each rebuilds A and B from the
   * layouts above and computes its own accumulator elements in f32 (the
   * products of bf16 values are exact in f32). */
  uint32_t mine[XM_FRAG_A_N + XM_FRAG_B_N], all[XM_WARP * (XM_FRAG_A_N + XM_FRAG_B_N)];
  const int W = XM_FRAG_A_N + XM_FRAG_B_N;
  for (int i = 0; i < XM_FRAG_A_N; i++) mine[i] = a->e[i];
  for (int i = 0; i < XM_FRAG_B_N; i++) mine[XM_FRAG_A_N + i] = b->e[i];
  xm_emu_warp_exchange(mine, W, all);
  float A[XM_MMA_M][XM_MMA_K], B[XM_MMA_K][XM_MMA_N];
  for (int l = 0; l < XM_WARP; l++) {
    for (int i = 0; i < XM_FRAG_A_N; i++) {
      int r, c;
      xm_frag_a_coord(l, i, &r, &c);
      A[r][c] = xm_bf2f((xm_bf16)all[l * W + i]);
    }
    for (int i = 0; i < XM_FRAG_B_N; i++) {
      int r, c;
      xm_frag_b_coord(l, i, &r, &c);
      B[r][c] = xm_bf2f((xm_bf16)all[l * W + XM_FRAG_A_N + i]);
    }
  }
  int lane = xm_lane();
  for (int i = 0; i < XM_FRAG_C_N; i++) {
    int r, c;
    xm_frag_c_coord(lane, i, &r, &c);
    float s = 0.0f;
    for (int k = 0; k < XM_MMA_K; k++) s += A[r][k] * B[k][c];
    d->e[i] += s;
  }
#elif defined(XM_GPU_HIP)
  typedef short short4_t __attribute__((ext_vector_type(4)));
  typedef float float4_t __attribute__((ext_vector_type(4)));
  short4_t av, bv;
  float4_t cv;
  for (int i = 0; i < 4; i++) {
    av[i] = (short)a->e[i];
    bv[i] = (short)b->e[i];
    cv[i] = d->e[i];
  }
  cv = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(av, bv, cv, 0, 0, 0);
  for (int i = 0; i < 4; i++) d->e[i] = cv[i];
#else
  uint32_t a0 = a->e[0] | ((uint32_t)a->e[1] << 16), a1 = a->e[2] | ((uint32_t)a->e[3] << 16);
  uint32_t a2 = a->e[4] | ((uint32_t)a->e[5] << 16), a3 = a->e[6] | ((uint32_t)a->e[7] << 16);
  uint32_t b0 = b->e[0] | ((uint32_t)b->e[1] << 16), b1 = b->e[2] | ((uint32_t)b->e[3] << 16);
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d->e[0]), "+f"(d->e[1]), "+f"(d->e[2]), "+f"(d->e[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

/* ---- launches ---------------------------------------------------------
 * xm_launch(name, grid x, y, z, threads, stream, kernel, args...): a grid
 * with a zero dimension launches nothing (a GPU refuses it; an empty
 * expert list is a normal case). `name` is for the emulator's messages. */
#if defined(XM_GPU_EMU)
template <class... P, class... A>
static inline void xm_launch(const char *name, int64_t gx, int64_t gy, int64_t gz, int threads,
                             xm_stream_t s, void (*k)(P...), A... a) {
  (void)s;
  if (gx <= 0 || gy <= 0 || gz <= 0) return;
  xm_emu_launch(name, gx, gy, gz, threads, XM_WARP, [=]() { k(a...); });
}
#else
template <class... P, class... A>
static inline void xm_launch(const char *name, int64_t gx, int64_t gy, int64_t gz, int threads,
                             xm_stream_t s, void (*k)(P...), A... a) {
  (void)name;
  if (gx <= 0 || gy <= 0 || gz <= 0) return;
  k<<<dim3((unsigned)gx, (unsigned)gy, (unsigned)gz), dim3((unsigned)threads), 0, s>>>(a...);
}
#endif

/* Host side: wait for the stream, then copy device bytes to the host. */
static inline void xm_gpu_copy_d2h_sync(void *dst, const void *src, size_t bytes, xm_stream_t s) {
#if defined(XM_GPU_EMU)
  (void)s;
  if (bytes) memcpy(dst, src, bytes);
#elif defined(XM_GPU_HIP)
  (void)hipMemcpyAsync(dst, src, bytes, hipMemcpyDeviceToHost, s);
  (void)hipStreamSynchronize(s);
#else
  (void)cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s);
  (void)cudaStreamSynchronize(s);
#endif
}

/* Ceiling division for grid sizes. */
XM_HOSTDEV int64_t xm_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

#endif /* XM_RUNTIME_GPU_XM_GPU_H */
