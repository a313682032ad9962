/* codegen/target.h — the code generation targets.
 *
 * A target turns a scheduled, memory-planned module into the sources of a
 * training program: the schedule (out/program.c: the tensor table and the
 * micro and step functions), the entry point (out/main.c) and, for a GPU
 * target, the kernel source it launches. Every target prints its kernel
 * calls or launches from the one signature table (runtime/abi/kernels.def)
 * and links the runtime backend of the same name (runtime/<name>/).
 *
 * `xmoec compile --target NAME` picks one; "cpu" is the default and the
 * only one built today. "hip" and "cuda" are known names whose code
 * generation is not built yet: asking for them is refused with exit 2, so
 * a script written for them fails loudly instead of getting a CPU program.
 */
#ifndef XM_CODEGEN_TARGET_H
#define XM_CODEGEN_TARGET_H

#include <stdbool.h>

#include "codegen/c_program.h"

typedef struct {
  const char *name;  /* "cpu", "hip", "cuda" */
  bool built;        /* false: known, but its code generation does not exist yet */
  const char *about; /* one line for --help and errors */
  /* out/program.c and out/main.c; NULL for a target that is not built. */
  xm_status_t (*program)(const xm_ir_module_t *m, const xm_spec_t *spec,
                         const xm_codegen_inputs_t *in, xm_diag_t *diag, xm_strbuf_t *out);
  void (*main_c)(const xm_codegen_inputs_t *in, xm_strbuf_t *out);
} xm_codegen_target_t;

/* The target of that name, or NULL when there is none. */
const xm_codegen_target_t *xm_codegen_target_find(const char *name);

/* Every known target, in a fixed order; *count set. */
const xm_codegen_target_t *xm_codegen_targets(int *count);

#endif /* XM_CODEGEN_TARGET_H */
