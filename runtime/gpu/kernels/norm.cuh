/* runtime/gpu/kernels/norm.cuh — (being written) */
#ifndef XM_RUNTIME_GPU_KERNELS_NORM_CUH
#define XM_RUNTIME_GPU_KERNELS_NORM_CUH

#include "runtime/gpu/kernels/common.cuh"

#endif
