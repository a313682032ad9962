/* runtime/cuda/table.cu — the CUDA backend's device code, compiled by nvcc
 * twice (runtime/gpu/gpu.cmake, -arch=sm_XM_CUDA_ARCH) into two objects of
 * the archive xm_rt_cuda:
 *   - the kernel table: every kernel template of runtime/gpu/kernels/
 *     (runtime/gpu/table.cuh), its entries launched on the backend's default
 *     stream, which runtime/gpu/backend_gpu.h stores in xm_g_table_stream at
 *     init; the backend refers to it weakly, so only a program that names it
 *     (the conformance suite) links it;
 *   - with XM_CUDA_FILL_ONLY, the backend's 32-bit fill (the CUDA runtime
 *     API has no 32-bit memset), which every program links.
 */
#ifndef XM_CUDA_FILL_ONLY

#define XM_G_BUILD_TABLE 1
#include "runtime/gpu/table.cuh"

xm_stream_t xm_g_table_stream;
xm_rt_kernels_t xm_g_table;

extern "C" const xm_rt_kernels_t *xm_rt_cuda_kernel_table(void) { return &xm_g_table; }

#else /* XM_CUDA_FILL_ONLY */

#include <cuda_runtime.h>
#include <stdint.h>

/* n words of v at d, a grid-stride loop. */
static __global__ void __launch_bounds__(256)
    xm_cuda_fill32_kernel(uint32_t *d, uint32_t v, size_t n) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    d[i] = v;
}

/* runtime/cuda/backend.c's fill32: queued on s, returns the launch's error
 * (errors of the kernel's execution show at the next synchronisation). */
extern "C" cudaError_t xm_rt_cuda_fill32(void *dst, uint32_t pattern, size_t n, cudaStream_t s) {
  if (!n) return cudaSuccess;
  const size_t threads = 256, max_blocks = 65535;
  size_t blocks = (n + threads - 1) / threads;
  if (blocks > max_blocks) blocks = max_blocks;
  xm_cuda_fill32_kernel<<<(unsigned)blocks, (unsigned)threads, 0, s>>>((uint32_t *)dst, pattern, n);
  return cudaGetLastError();
}

#endif /* XM_CUDA_FILL_ONLY */
