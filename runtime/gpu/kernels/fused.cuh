/* runtime/gpu/kernels/fused.cuh — (being written) */
#ifndef XM_RUNTIME_GPU_KERNELS_FUSED_CUH
#define XM_RUNTIME_GPU_KERNELS_FUSED_CUH

#include "runtime/gpu/kernels/common.cuh"

#endif
