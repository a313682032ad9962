/* frontend/hf_arch.h — the Hugging Face architecture a spec's checkpoints
 * are written as, and the tensor names of that architecture.
 *
 * The model builder (ir/model.c) names every parameter by its canonical
 * (DeepSeek-style) Hugging Face name and passes it through
 * xm_hf_param_name, so the program's tensor table, its checkpoints and
 * `--init-from` all use the names of the architecture the spec matches.
 * codegen/hf_config_json.c writes that architecture's config.json.
 *
 * A spec matches an architecture when transformers' modeling code of that
 * model_type computes exactly the function xmoec trains (docs/design.md,
 * Model semantics) from tensors of exactly the shapes xmoec has: the rules
 * are in hf_arch.c, each with the reason a spec fails it, and the list is
 * in docs/checkpoints.md. A spec that matches none keeps model_type
 * "xmoec" and xmoec's own DeepSeek-style names.
 */
#ifndef XM_FRONTEND_HF_ARCH_H
#define XM_FRONTEND_HF_ARCH_H

#include <stdbool.h>
#include <stddef.h>

#include "frontend/spec.h"
#include "support/diag.h"

typedef enum {
  XM_HF_ARCH_XMOEC, /* matches none: model_type "xmoec" */
  XM_HF_ARCH_DEEPSEEK_V3,
  XM_HF_ARCH_QWEN3_MOE,
  XM_HF_ARCH_QWEN2_MOE,
  XM_HF_ARCH_MIXTRAL,
  XM_HF_ARCH_OLMOE,
  XM_HF_ARCH_COUNT_
} xm_hf_arch_t;

/* The architecture `spec` matches. */
xm_hf_arch_t xm_hf_arch_of(const xm_spec_t *spec);

/* The same, and when it is XM_HF_ARCH_XMOEC the reason in `why` (the spec
 * field that decides, with its JSON pointer, and what the architectures
 * have instead); "" when it matches. `why` may be NULL. */
xm_hf_arch_t xm_hf_arch_match(const xm_spec_t *spec, char *why, size_t n);

/* "mixtral", ..., "xmoec". */
const char *xm_hf_arch_model_type(xm_hf_arch_t arch);
/* architectures[0] of its config.json: "MixtralForCausalLM", ...,
 * "XmoecForCausalLM". */
const char *xm_hf_arch_class(xm_hf_arch_t arch);
/* The architecture of a model_type, or -1 when it is none of these. */
int xm_hf_arch_from_model_type(const char *model_type);

/* The name under `arch` of the parameter whose canonical name is
 * `canonical` (written to buf, always NUL-terminated). A "{e}" (the
 * stacked expert index) is kept where the expert index goes. */
void xm_hf_param_name(xm_hf_arch_t arch, const char *canonical, char *buf, size_t n);

/* The inverse: the canonical name of `name` under `arch` (identity for a
 * name the map does not change). */
void xm_hf_canonical_name(xm_hf_arch_t arch, const char *name, char *buf, size_t n);

/* Compares what decides the weights and the function of two specs of
 * architecture `arch` (sizes, attention, norms, RoPE and YaRN, routing,
 * experts; not the name, the training section, the aux-loss weight or the
 * aux-free speed, which are training settings), as a config.json of
 * `arch` states them. Each difference is an error in `diag` at the HF key
 * that holds the field (`/num_experts_per_tok: is 3 in <source>, 2 in the
 * compiled program`); `want` is the program's spec, `got` the other.
 * Returns the number of differences. */
int xm_hf_spec_diff(xm_hf_arch_t arch, const xm_spec_t *want, const xm_spec_t *got,
                    const char *source, xm_diag_t *diag);

#endif /* XM_FRONTEND_HF_ARCH_H */
