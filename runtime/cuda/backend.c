/* runtime/cuda/backend.c — the CUDA backend (runtime/abi/backend.h) for
 * NVIDIA GPUs, over the CUDA runtime API. The logic is
 * runtime/gpu/backend_gpu.h, shared with the HIP backend; this file maps its
 * macros onto CUDA. The runtime API has no 32-bit memset, so fill32 of a
 * pattern that is no repeated byte runs the fill kernel of
 * runtime/cuda/table.cu (its XM_CUDA_FILL_ONLY object); the kernel table is
 * the other object of that file, when linked.
 */
#include <cuda_runtime_api.h>

#include "runtime/abi/backend.h"

/* runtime/cuda/table.cu: n words of `pattern` at dst, queued on s; the
 * launch's error. */
cudaError_t xm_rt_cuda_fill32(void *dst, uint32_t pattern, size_t n, cudaStream_t s);

#define XM_GPU_NAME "cuda"
#define XM_GPU_LABEL "CUDA"
#define XM_GPU_API(x) cuda##x
#define XM_GPU_ERROR_OOM cudaErrorMemoryAllocation
#define XM_GPU_FILL32(dst, pattern, n, s) xm_rt_cuda_fill32((dst), (pattern), (n), (s))
#define XM_GPU_FILL32_CALL "the fill32 kernel launch"
#define XM_GPU_KERNEL_TABLE xm_rt_cuda_kernel_table
#include "runtime/gpu/backend_gpu.h"

xm_rt_backend_t *xm_rt_cuda_backend(void) { return gpu_backend(); }

xm_rt_backend_t *xm_rt_backend_default(void) { return xm_rt_cuda_backend(); }
