/* runtime/gpu/kernels/moe.cuh — (being written) */
#ifndef XM_RUNTIME_GPU_KERNELS_MOE_CUH
#define XM_RUNTIME_GPU_KERNELS_MOE_CUH

#include "runtime/gpu/kernels/common.cuh"

#endif
