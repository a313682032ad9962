/* codegen/c_program.h — the C source of a training program (out/program.c,
 * out/main.c) and the Hugging Face style config.json of a model.
 *
 * Input: a module after "autodiff,canonicalize,plan-memory,schedule" (ops in
 * execution order, attr phase on every op, attr "mem" on every op with
 * results, module attrs mem_*). Output: text only, byte-for-byte
 * deterministic for the same module and inputs; the caller writes files and
 * runs the compiler (tools/xmoec/cmd_compile.c). program.c defines the
 * xm_rt_program_t of runtime/abi/program.h named xm_program; its contract with
 * the runtime is documented there.
 */
#ifndef XM_CODEGEN_C_PROGRAM_H
#define XM_CODEGEN_C_PROGRAM_H

#include "frontend/spec.h"
#include "ir/ir.h"
#include "support/diag.h"
#include "support/status.h"
#include "support/strbuf.h"

/* What a generated file names as its inputs, and the texts it embeds. All
 * strings are borrowed. */
typedef struct {
  const char *spec_path;    /* as the user gave it (header, manifest) */
  const char *spec_text;    /* the spec file's text: xm_program.spec_json */
  const char *cluster_path; /* NULL when no cluster file was given */
  const char *config_json;  /* xm_codegen_config_json's text */
  const char *pipeline;     /* the pass pipeline that produced the module */
} xm_codegen_inputs_t;

/* Appends out/program.c for module `m` to `out`. An op the CPU schedule
 * cannot run (a collective in this single-rank milestone), a result without
 * a memory place or a module that was not scheduled is reported to `diag`
 * with the op's index and location: XM_ERR_UNSUPPORTED or XM_ERR_INTERNAL. */
xm_status_t xm_codegen_program_c(const xm_ir_module_t *m, const xm_spec_t *spec,
                                 const xm_codegen_inputs_t *in, xm_diag_t *diag,
                                 xm_strbuf_t *out);

/* The same schedule for a GPU target ("hip" or "cuda"): every kernel call
 * is a launch of a specialisation of the kernel templates of
 * runtime/gpu/kernels on the exec's stream. Appends out/program.c to `out`,
 * the launches' C declarations (out/kernels.h) to `kernels_h` and their
 * definitions (out/kernels.hip, one text for hipcc, nvcc and the
 * emulator) to `kernels_src`. */
xm_status_t xm_codegen_program_gpu(const xm_ir_module_t *m, const xm_spec_t *spec,
                                   const xm_codegen_inputs_t *in, const char *target,
                                   xm_diag_t *diag, xm_strbuf_t *out, xm_strbuf_t *kernels_h,
                                   xm_strbuf_t *kernels_src);

/* Appends out/main.c: main() hands the program to xm_rt_train_main. */
void xm_codegen_main_c(const xm_codegen_inputs_t *in, xm_strbuf_t *out);

/* Appends the config.json text (docs/design.md, Interfaces: DeepSeek-V3 field names, plus
 * the xmoec extras), keys in a fixed order, ending in a newline. */
xm_status_t xm_codegen_config_json(const xm_spec_t *spec, xm_strbuf_t *out);

/* Appends `s` as a C string literal: escapes quotes, backslashes and every
 * byte outside printable ASCII (octal, three digits), and breaks the literal
 * after each "\n" into adjacent literals on new lines indented by `indent`
 * spaces, so embedded JSON stays readable. */
void xm_codegen_c_string(xm_strbuf_t *out, const char *s, int indent);

#endif /* XM_CODEGEN_C_PROGRAM_H */
