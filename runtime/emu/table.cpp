/* runtime/emu/table.cpp — the emulated GPU's kernel table: every kernel
 * template of runtime/gpu/kernels/ compiled for the CPU emulation
 * (runtime/gpu/table.cuh). Built once per emulated target: XM_EMU_AMD=1
 * (wavefront 64, MFMA layouts) or 0 (warp 32, mma.sync layouts). */
#define XM_G_BUILD_TABLE 1
#include "runtime/gpu/table.cuh"

xm_stream_t xm_g_table_stream;
xm_rt_kernels_t xm_g_table;

extern "C" const xm_rt_kernels_t *xm_rt_emu_kernel_table(void) { return &xm_g_table; }
