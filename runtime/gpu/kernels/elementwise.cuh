/* runtime/gpu/kernels/elementwise.cuh — (being written) */
#ifndef XM_RUNTIME_GPU_KERNELS_ELEMENTWISE_CUH
#define XM_RUNTIME_GPU_KERNELS_ELEMENTWISE_CUH

#include "runtime/gpu/kernels/common.cuh"

#endif
