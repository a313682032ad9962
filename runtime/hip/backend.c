/* runtime/hip/backend.c — the HIP backend (runtime/abi/backend.h) for AMD
 * GPUs, over the HIP runtime C API. The logic is runtime/gpu/backend_gpu.h,
 * shared with the CUDA backend; this file maps its macros onto HIP. The
 * kernel table is runtime/hip/table.hip (compiled by hipcc), when linked.
 */
#ifndef __HIP_PLATFORM_AMD__
#define __HIP_PLATFORM_AMD__ 1
#endif
#include <hip/hip_runtime_api.h>

#include "runtime/abi/backend.h"

#define XM_GPU_NAME "hip"
#define XM_GPU_LABEL "HIP"
#define XM_GPU_API(x) hip##x
#define XM_GPU_ERROR_OOM hipErrorOutOfMemory
#define XM_GPU_FILL32(dst, pattern, n, s)                                                          \
  hipMemsetD32Async((hipDeviceptr_t)(dst), (int)(pattern), (n), (s))
#define XM_GPU_FILL32_CALL "hipMemsetD32Async"
#define XM_GPU_KERNEL_TABLE xm_rt_hip_kernel_table
#include "runtime/gpu/backend_gpu.h"

xm_rt_backend_t *xm_rt_hip_backend(void) { return gpu_backend(); }

xm_rt_backend_t *xm_rt_backend_default(void) { return xm_rt_hip_backend(); }
