/* frontend/count.h — parameter and FLOP counts of a spec (`xmoec check`).
 *
 * Counts follow the tensors a Hugging Face checkpoint of the model holds
 * (norm weights, router weights and biases included; DeepSeek-V3's
 * multi-token-prediction module excluded). Active parameters per token count
 * the embedding and LM head in full (as published figures do), attention
 * and norms of every layer, top_k
 * routed experts, all shared experts, routers and the LM head. FLOPs per
 * token: 2 per multiply-add of every matrix a token passes through (LM head
 * included, embedding lookup excluded) plus causal attention scores and
 * values at the spec's sequence length; backward is twice the forward.
 * docs/spec.md ("Counting") states the formulas.
 */
#ifndef XM_FRONTEND_COUNT_H
#define XM_FRONTEND_COUNT_H

#include <stdint.h>

#include "frontend/spec.h"

typedef struct {
  int64_t attention;       /* projections, attention biases, q/k norms, MLA norms */
  int64_t norms;           /* input_layernorm + post_attention_layernorm */
  int64_t dense_ffn;       /* dense SwiGLU (dense layers only) */
  int64_t routed_experts;  /* all routed experts of the layer */
  int64_t shared_experts;  /* shared experts (and their gate) */
  int64_t router;          /* gate weight + score-correction bias */
  int64_t total;
  int64_t active;          /* per token */
} xm_layer_count_t;

typedef struct {
  int64_t total;
  int64_t active;
  int64_t embeddings;      /* embed_tokens + lm_head (once if tied) */
  int64_t final_norm;
  int64_t num_layers;
  xm_layer_count_t dense_layer;  /* one dense layer (zero if none) */
  xm_layer_count_t moe_layer;    /* one MoE layer (zero if none) */
  double flops_per_token_fwd;
  double flops_per_token_fwdbwd;
  /* DeepSeek-V3's multi-token-prediction modules (spec model.mtp_layers),
   * outside every figure above as DeepSeek's own counts are: each is one
   * decoder layer (MoE unless every layer is dense) plus eh_proj [H,2H]
   * and its enorm, hnorm and shared_head.norm; the embedding and head are
   * the main model's. FLOPs per token of the modules' forward (their
   * layers, eh_proj, the LM head again, attention at seq_len). */
  int64_t mtp_layers;
  int64_t mtp_module;        /* parameters of one module */
  int64_t mtp_total;         /* all modules */
  int64_t mtp_active;        /* per token, all modules */
  double mtp_flops_per_token_fwd;
} xm_count_t;

/* Fills `out`. Sizes are bounded by validation, so no product overflows. */
void xm_count_params(const xm_spec_t *spec, xm_count_t *out);

#endif /* XM_FRONTEND_COUNT_H */
