/* runtime/gpu/kernels/attention.cuh — (being written) */
#ifndef XM_RUNTIME_GPU_KERNELS_ATTENTION_CUH
#define XM_RUNTIME_GPU_KERNELS_ATTENTION_CUH

#include "runtime/gpu/kernels/common.cuh"

#endif
