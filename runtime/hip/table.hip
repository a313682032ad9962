/* runtime/hip/table.hip — the HIP backend's kernel table: every kernel
 * template of runtime/gpu/kernels/ compiled by hipcc for the AMD target
 * (runtime/gpu/table.cuh), its entries launched on the backend's default
 * stream, which runtime/gpu/backend_gpu.h stores in xm_g_table_stream at
 * init. runtime/gpu/gpu.cmake compiles it with --offload-arch=XM_HIP_ARCH. */
#define XM_G_BUILD_TABLE 1
#include "runtime/gpu/table.cuh"

xm_stream_t xm_g_table_stream;
xm_rt_kernels_t xm_g_table;

extern "C" const xm_rt_kernels_t *xm_rt_hip_kernel_table(void) { return &xm_g_table; }
