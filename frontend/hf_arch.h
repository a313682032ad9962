/* frontend/hf_arch.h — the Hugging Face architecture a spec's checkpoints
 * are written as, and the tensor names of that architecture.
 *
 * The model builder (ir/model.c) names every parameter by its canonical
 * (DeepSeek-style) Hugging Face name and passes it through
 * xm_hf_param_name, so the program's tensor table, its checkpoints and
 * `--init-from` all use the names of the architecture the spec matches.
 */
#ifndef XM_FRONTEND_HF_ARCH_H
#define XM_FRONTEND_HF_ARCH_H

#include <stddef.h>

#include "frontend/spec.h"

typedef enum {
  XM_HF_ARCH_XMOEC, /* matches none: model_type "xmoec" */
  XM_HF_ARCH_DEEPSEEK_V3,
  XM_HF_ARCH_QWEN3_MOE,
  XM_HF_ARCH_QWEN2_MOE,
  XM_HF_ARCH_MIXTRAL,
  XM_HF_ARCH_OLMOE,
} xm_hf_arch_t;

/* The architecture `spec` matches (every spec matches "xmoec" for now). */
xm_hf_arch_t xm_hf_arch_of(const xm_spec_t *spec);

/* The name under `arch` of the parameter whose canonical name is
 * `canonical` (written to buf, always NUL-terminated). */
void xm_hf_param_name(xm_hf_arch_t arch, const char *canonical, char *buf, size_t n);

#endif /* XM_FRONTEND_HF_ARCH_H */
