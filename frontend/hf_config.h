/* frontend/hf_config.h — import of a Hugging Face config.json.
 *
 * Recognised model_type values: mixtral, qwen2_moe, qwen3_moe, olmoe,
 * deepseek (DeepSeek-MoE v1), deepseek_v2, deepseek_v3. Fields map onto
 * xm_spec_t (docs/spec.md has the table); fields that change the
 * architecture in ways xmoec does not model are reported with their JSON
 * pointer, and unknown model_type values list the supported ones. Training
 * fields keep their defaults (an HF config has none).
 */
#ifndef XM_FRONTEND_HF_CONFIG_H
#define XM_FRONTEND_HF_CONFIG_H

#include <cjson/cJSON.h>

#include "frontend/spec.h"

/* True when `root` looks like an HF config (has a "model_type" key). */
bool xm_hf_config_detect(const cJSON *root);

/* Fills `spec` (already holding defaults) from an HF config object. Problems
 * go to `diag` with JSON pointers relative to the document root. */
void xm_hf_config_import(const cJSON *root, const char *source, xm_diag_t *diag,
                         xm_spec_t *spec);

#endif /* XM_FRONTEND_HF_CONFIG_H */
