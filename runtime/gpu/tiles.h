/* runtime/gpu/tiles.h — the per-target tile table of the GPU kernels.
 *
 * Block sizes and GEMM tiles differ between the AMD target (wavefront 64,
 * MFMA 16x16x16, 64 KB of LDS) and the NVIDIA one (warp 32, mma.sync
 * m16n8k16, up to 227 KB of shared memory); kernel text reads them from
 * here and never spells a number of its own (docs/design.md, The GPU path).
 * The emulator compiles the same table for the target it emulates.
 */
#ifndef XM_RUNTIME_GPU_TILES_H
#define XM_RUNTIME_GPU_TILES_H

#include "runtime/gpu/xm_gpu.h"

/* Threads of an elementwise or row-wise block (a whole number of warps). */
#define XM_TILE_THREADS 256
/* Most blocks of a grid-stride elementwise launch. */
#define XM_TILE_MAX_GRID_1D 65535
/* Multi-tensor AdamW: tensors per launch (their table travels in the
 * launch's arguments, which both vendors cap at 4 KB) and the elements one
 * block updates. */
#define XM_TILE_ADAMW_TENSORS 48
#define XM_TILE_ADAMW_BLOCK_ELEMS (XM_TILE_THREADS * 16)

#if defined(XM_TARGET_AMD)
/* GEMM block tile (rows x cols) and its K step, warps per block. */
#define XM_TILE_GEMM_BM 64
#define XM_TILE_GEMM_BN 64
#define XM_TILE_GEMM_BK 32
#define XM_TILE_GEMM_WARPS 4
#else
#define XM_TILE_GEMM_BM 64
#define XM_TILE_GEMM_BN 64
#define XM_TILE_GEMM_BK 32
#define XM_TILE_GEMM_WARPS 4
#endif

#endif /* XM_RUNTIME_GPU_TILES_H */
