/* runtime/gpu/kernels/all.cuh — every kernel template file, for the
 * backends' kernel tables (runtime/gpu/table.cuh) and for out/kernels.hip. */
#ifndef XM_RUNTIME_GPU_KERNELS_ALL_CUH
#define XM_RUNTIME_GPU_KERNELS_ALL_CUH

#include "runtime/gpu/kernels/elementwise.cuh"
#include "runtime/gpu/kernels/norm.cuh"
#include "runtime/gpu/kernels/attention.cuh"
#include "runtime/gpu/kernels/moe.cuh"
#include "runtime/gpu/kernels/gemm.cuh"
#include "runtime/gpu/kernels/fused.cuh"
#include "runtime/gpu/kernels/loss.cuh"

#endif /* XM_RUNTIME_GPU_KERNELS_ALL_CUH */
