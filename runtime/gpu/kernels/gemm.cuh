/* runtime/gpu/kernels/gemm.cuh — (being written) */
#ifndef XM_RUNTIME_GPU_KERNELS_GEMM_CUH
#define XM_RUNTIME_GPU_KERNELS_GEMM_CUH

#include "runtime/gpu/kernels/common.cuh"

#endif
