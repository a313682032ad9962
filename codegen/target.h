/* codegen/target.h — the code generation targets.
 *
 * A target turns a scheduled, memory-planned module into the sources of a
 * training program: the schedule (out/program.c: the tensor table and the
 * micro and step functions), the entry point (out/main.c) and, for a GPU
 * target, the kernel source it launches. Every target prints its kernel
 * calls or launches from the one signature table (runtime/abi/kernels.def)
 * and links the runtime backend of the same name (runtime/<name>/).
 *
 * `xmoec compile --target NAME` picks one; "cpu" is the default. "hip" and
 * "cuda" write the same out/program.c schedule with launches instead of
 * calls (codegen/c_program.h, xm_codegen_program_gpu), plus out/kernels.h
 * and out/kernels.hip; the build compiles that kernel text with hipcc,
 * nvcc, or, with --emulate, a C++ compiler against the CPU emulation of
 * the GPU (docs/design.md, The GPU path).
 */
#ifndef XM_CODEGEN_TARGET_H
#define XM_CODEGEN_TARGET_H

#include <stdbool.h>

#include "codegen/c_program.h"

typedef struct {
  const char *name;         /* "cpu", "hip", "cuda" */
  bool gpu;                 /* kernels generated into out/kernels.hip */
  const char *about;        /* one line for --help and errors */
  const char *default_arch; /* GPU targets: the architecture when the cluster names none */
} xm_codegen_target_t;

/* Whether `arch` is an architecture name of target `t`: "gfx" and hex
 * digits for hip (gfx90a, gfx942), "sm_" and digits with an optional "a"
 * for cuda (sm_90, sm_90a). */
bool xm_codegen_target_arch_ok(const xm_codegen_target_t *t, const char *arch);

/* The target of that name, or NULL when there is none. */
const xm_codegen_target_t *xm_codegen_target_find(const char *name);

/* Every known target, in a fixed order; *count set. */
const xm_codegen_target_t *xm_codegen_targets(int *count);

#endif /* XM_CODEGEN_TARGET_H */
