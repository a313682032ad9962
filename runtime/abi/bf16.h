/* runtime/abi/bf16.h — bfloat16 conversions and the bf16 GEMM workspace
 * formula, shared by the compiler (which sizes the workspace in the memory
 * plan), the kernels and the tests.
 *
 * bf16 is the upper 16 bits of an IEEE f32: the same exponent range, 8
 * significant bits. f32 -> bf16 rounds to nearest, ties to even (as
 * PyTorch's .to(torch.bfloat16) does); NaN stays a quiet NaN; bf16 -> f32
 * is exact.
 */
#ifndef XM_RUNTIME_ABI_BF16_H
#define XM_RUNTIME_ABI_BF16_H

#include <stdint.h>
#include <string.h>

#include "runtime/abi/kernels.h"

static inline xm_bf16_t xm_bf16_from_f32(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (xm_bf16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (xm_bf16_t)(u >> 16);
}

static inline float xm_bf16_to_f32(xm_bf16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Rows per tile of the CPU bf16 GEMMs: operands are widened to f32 one
 * tile of rows at a time, so the workspace does not grow with the tokens. */
#define XM_BF16_TILE_ROWS 256

/* Workspace of a CPU bf16 GEMM in floats: `rows` rows (the bound) of K
 * inputs and N outputs per tile, plus the weight [N,K] widened once when
 * `widen_w` (forward and input-gradient GEMMs; a grouped GEMM widens one
 * expert's [N,K] at a time). The weight-gradient GEMMs widen no weight. */
static inline int64_t xm_bf16_gemm_ws_floats(int64_t rows, int64_t K, int64_t N, int widen_w) {
  int64_t r = rows < XM_BF16_TILE_ROWS ? rows : XM_BF16_TILE_ROWS;
  if (r < 1) r = 1;
  return (widen_w ? N * K : 0) + r * (K + N);
}

/* Workspace of a fused MoE kernel on bf16 operands, in floats: per thread
 * slot (at most `slots`), one expert weight [M,K] widened (`widen_w`: the
 * kernels with a weight operand) and a tile of up to max(K, M) floats per
 * row of the expert-sorted operand widened. */
static inline int64_t xm_bf16_fused_ws_floats(int64_t tile_rows, int64_t slots, int64_t K,
                                              int64_t M, int widen_w) {
  int64_t wide = K > M ? K : M;
  return slots * ((widen_w ? M * K : 0) + tile_rows * wide);
}

/* Workspace of lm_head_ce_bf16 / lm_head_ce_grad_bf16 in floats. The CPU
 * widens x (rows x H) once and one chunk of w (chunk x H) at a time; a GPU
 * multiplies the bf16 operands directly, and its backward writes each
 * chunk's logit gradient in bf16 (rows x chunk halves) for the two GEMMs
 * that read it. The formula is the larger of the two needs. */
static inline int64_t xm_bf16_lm_ce_ws_floats(int64_t rows, int64_t H, int64_t chunk, int grad) {
  int64_t cpu = (rows + chunk) * H, gpu = grad ? (rows * chunk + 1) / 2 + 4 : 0;
  return cpu > gpu ? cpu : gpu;
}

#endif /* XM_RUNTIME_ABI_BF16_H */
