/* runtime/gpu/table.cuh — a GPU backend's kernel table (runtime/abi/kernels.h)
 * from the kernel templates, every size read at run time.
 *
 * Generated programs do not use it: they launch the specialisations of
 * out/kernels.hip. The table is what the conformance suite (tests/backend)
 * runs, so every kernel template is held against the CPU reference with
 * the same cases as the CPU backend. Included by exactly one translation
 * unit per backend (runtime/emu/table.cpp, and the HIP and CUDA backends'
 * own), which defines XM_G_BUILD_TABLE first: then each kernel file's
 * XM_G_TABLE(name) line instantiates its launcher with xm_shape_dyn and
 * registers it. A kernel without that line leaves its entry NULL, which
 * the suite reports as a failure. Entries launch on xm_g_table_stream and
 * return when the launch is queued; permute, whose row count the table's
 * signature returns, registers its own entry that synchronises to read it
 * (runtime/gpu/kernels/moe.cuh).
 */
#ifndef XM_RUNTIME_GPU_TABLE_CUH
#define XM_RUNTIME_GPU_TABLE_CUH

#ifndef XM_G_BUILD_TABLE
#error "runtime/gpu/table.cuh is included by a backend's table file only"
#endif

#include <type_traits>

#include "runtime/abi/kernels.h"
#include "runtime/gpu/kernels/common.cuh"

/* The stream the table's entries launch on (the backend sets it). */
extern xm_stream_t xm_g_table_stream;
/* The table, filled by the registrations below before main runs. */
extern xm_rt_kernels_t xm_g_table;

/* C function pointer type R(*)(A...) of an entry -> a function of that type
 * calling launcher L on the table's stream. */
template <class F> struct xm_g_wrap;
template <class R, class... A> struct xm_g_wrap<R (*)(A...)> {
  template <void (*L)(xm_stream_t, A...)> static R call(A... a) {
    L(xm_g_table_stream, a...);
    return R();
  }
};

#define XM_G_TABLE(name)                                                                           \
  static const int xm_g_reg_##name =                                                               \
      (xm_g_table.name = &xm_g_wrap<decltype(xm_rt_kernels_t::name)>::template call<               \
                             &xm_g_##name<xm_shape_dyn>>,                                          \
       0);

/* XM_G_ONLY "file": only that kernel file (tests/backend/emu_kernels.sh
 * builds one file's table that way while it is being written). */
#ifdef XM_G_ONLY
#include XM_G_ONLY
#else
#include "runtime/gpu/kernels/all.cuh"
#endif

#endif /* XM_RUNTIME_GPU_TABLE_CUH */
