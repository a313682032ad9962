/* runtime/driver/blas_core.h — which OpenBLAS kernels a CPU program runs.
 *
 * OpenBLAS picks its kernel core once, when the library loads, from its
 * own CPUID tables; Debian's 0.3.21 does not know the Intel Xeons of family
 * 6 model 207 and falls back to "Prescott" (SSE3: SGEMM 55 instead of 300
 * GFLOP/s on 2 threads). out/train asks the loaded library which core it
 * chose, compares it with what the CPU and the OS support, and when the
 * library under-uses the CPU sets OPENBLAS_CORETYPE and re-executes itself
 * (runtime/driver/train.c, docs/train.md "Threads and OpenBLAS"). A value
 * the user set is never changed. */
#ifndef XM_RT_BLAS_CORE_H
#define XM_RT_BLAS_CORE_H

#include <stddef.h>

/* Vector levels, in the order of OpenBLAS's x86-64 kernel families. */
enum {
  XM_BLAS_LEVEL_BASE = 1,   /* SSE-class kernels (Prescott ... Nehalem) */
  XM_BLAS_LEVEL_AVX = 2,    /* AVX (Sandybridge, Bulldozer) */
  XM_BLAS_LEVEL_AVX2 = 3,   /* AVX2 + FMA (Haswell, Zen, Excavator) */
  XM_BLAS_LEVEL_AVX512 = 4, /* AVX-512 F/BW/DQ/VL (SkylakeX and later) */
};

/* The level of an OpenBLAS core name as openblas_get_corename() returns
 * it (any case). A name this table does not know (a newer OpenBLAS) is
 * taken as the highest level: never second-guess what we cannot rank. */
int xm_blas_core_level(const char *corename);

/* The highest level this CPU and OS support (CPUID and XGETBV, through
 * __builtin_cpu_supports); XM_BLAS_LEVEL_BASE off x86-64. */
int xm_blas_cpu_level(void);

/* The OPENBLAS_CORETYPE to force, or NULL to keep OpenBLAS's choice:
 * `detected` is the core the library chose (NULL: not OpenBLAS, keep),
 * `cpu_level` what the CPU supports. */
const char *xm_blas_core_pick(const char *detected, int cpu_level);

/* The core the loaded OpenBLAS runs ("SkylakeX", ...), or NULL when the
 * program has no OpenBLAS (GPU backends); looked up at run time so that
 * programs without BLAS link the same driver. */
const char *xm_blas_core_running(void);

/* One line for the banner: which kernels run and who chose them, e.g.
 * "OpenBLAS 0.3.21 kernels SkylakeX (chosen by out/train: OpenBLAS
 * detected Prescott on a CPU with AVX-512; set OPENBLAS_CORETYPE to
 * choose)". Empty when there is no OpenBLAS. */
void xm_blas_core_describe(char *buf, size_t cap);

/* The environment variable out/train sets before it re-executes, holding
 * the core OpenBLAS detected, so the banner can say what was replaced. */
#define XM_BLAS_DETECTED_ENV "XM_BLAS_DETECTED"

/* The one re-execution of a CPU program before anything else (out/train,
 * xmoec-calibrate): libgomp reads its wait policy and OpenBLAS its kernel
 * core once, when they load. Unless the user chose them, sets a short
 * OpenMP spin (GOMP_SPINCOUNT=1000, KMP_BLOCKTIME=0; docs/train.md,
 * "Threads and OpenBLAS") and, when the loaded OpenBLAS chose a core below
 * the CPU's level, OPENBLAS_CORETYPE (xm_blas_core_pick), then execs
 * /proc/self/exe with `argv`. Never once MPI has started (the test harness
 * and embedding programs run in-process); XM_NO_REEXEC=1 turns it off;
 * XM_BLAS_TEST_DETECTED stands in for the library's detection in tests.
 * Returns only when nothing was to be done or the exec failed. */
void xm_rt_reexec_once(char **argv);

#endif
