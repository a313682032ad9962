/* frontend/spec.h — the validated model, training, cluster and parallel
 * description (xm_spec_t) that every later stage reads.
 *
 * A spec comes from an xmoec model JSON (sections model, moe, training,
 * parallel, optionally cluster; docs/spec.md documents every field) or from a
 * Hugging Face config.json recognised by its model_type (frontend/hf_config.c).
 * Loading collects every problem into an xm_diag_t with a JSON pointer each;
 * a spec that loaded without errors satisfies all semantic checks, so later
 * stages may rely on: sizes positive and bounded, heads divisible, top_k <=
 * experts, and so on. All fields are plain values: an xm_spec_t can be copied
 * with '=' and needs no destructor.
 */
#ifndef XM_FRONTEND_SPEC_H
#define XM_FRONTEND_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "support/diag.h"
#include "support/status.h"

typedef enum { XM_ATTN_MHA, XM_ATTN_GQA, XM_ATTN_MLA } xm_attn_kind_t;
typedef enum { XM_ACT_SWIGLU, XM_ACT_GELU } xm_activation_t;
typedef enum { XM_SCORING_SOFTMAX, XM_SCORING_SIGMOID } xm_scoring_t;
/* Per-head RMSNorm of q and k (Qwen3: weight [head_dim]) or over the whole
 * projection (OLMoE: weights [heads*head_dim] and [kv_heads*head_dim]). */
typedef enum { XM_QK_NORM_NONE, XM_QK_NORM_HEAD, XM_QK_NORM_FULL } xm_qk_norm_t;
typedef enum { XM_DTYPE_FP32, XM_DTYPE_BF16, XM_DTYPE_FP16 } xm_train_dtype_t;
typedef enum { XM_LR_COSINE, XM_LR_CONSTANT, XM_LR_LINEAR } xm_lr_schedule_t;
typedef enum { XM_RECOMPUTE_NONE, XM_RECOMPUTE_SELECTIVE, XM_RECOMPUTE_FULL } xm_recompute_t;
/* In this order (the ordinals are stable): fabric/ models all but torus. */
typedef enum {
  XM_TOPO_FAT_TREE,
  XM_TOPO_DRAGONFLY,
  XM_TOPO_TORUS,
  XM_TOPO_FAT_TREE_OVERSUB,
  XM_TOPO_REGIONAL_OCS
} xm_topology_t;
typedef enum { XM_OCS_PER_ITERATION, XM_OCS_PER_LAYER } xm_ocs_reconfig_t;

#define XM_SPEC_NAME_MAX 64

typedef struct {
  int64_t vocab;             /* V */
  int64_t hidden;            /* H */
  int64_t layers;            /* L */
  int64_t heads;             /* query heads */
  int64_t kv_heads;          /* key/value heads (== heads for mha) */
  int64_t head_dim;          /* D (qk head dim for mha/gqa) */
  double rope_theta;
  double norm_eps;
  bool tied_embeddings;      /* lm_head shares embed_tokens */
  int64_t first_k_dense;     /* layers [0, first_k_dense) use a dense FFN */
  int64_t dense_ffn;         /* dense SwiGLU width (intermediate_size) */
  xm_attn_kind_t attention;
  bool attention_bias;       /* q/k/v projection biases (Qwen2-MoE) */
  xm_qk_norm_t qk_norm;
  /* MLA (attention == XM_ATTN_MLA): q_lora_rank 0 means q is projected
   * directly (DeepSeek-V2-Lite). */
  int64_t q_lora_rank;
  int64_t kv_lora_rank;
  int64_t qk_nope_head_dim;
  int64_t qk_rope_head_dim;
  int64_t v_head_dim;
  /* RoPE pairs (2i, 2i+1) instead of (i, i + D/2) (DeepSeek's
   * rope_interleave; HF's DeepseekV3 default). */
  bool rope_interleave;
  /* YaRN context extension (HF rope_scaling of type "yarn"): factor 1 = off.
   * mscale / mscale_all_dim / attention_factor 0 = absent (HF's None). */
  double yarn_factor;
  int64_t yarn_original_max_position;
  double yarn_beta_fast, yarn_beta_slow;
  double yarn_mscale, yarn_mscale_all_dim, yarn_attention_factor;
  bool yarn_truncate;
  /* DeepSeek-V3's multi-token prediction: modules k = 1..mtp_layers, each
   * predicting token i+k+1 from position i (HF num_nextn_predict_layers);
   * 0 = none. Counted apart from the model (frontend/count.h). */
  int64_t mtp_layers;
} xm_model_spec_t;

typedef struct {
  int64_t experts;           /* routed experts E; 0 = no MoE layers */
  int64_t shared_experts;    /* n_shared */
  int64_t shared_ffn;        /* total shared width; default n_shared*expert_ffn */
  bool shared_expert_gate;   /* sigmoid gate on the shared output (Qwen2-MoE) */
  int64_t top_k;
  int64_t expert_ffn;        /* H_ffn of one routed expert */
  xm_activation_t activation;
  xm_scoring_t scoring;
  bool norm_topk_prob;
  double routed_scaling;
  int64_t n_group;           /* 1 = no group-limited routing */
  int64_t topk_group;
  double aux_alpha;          /* aux load-balancing loss weight; 0 = off */
  double aux_free_gamma;     /* aux-free bias update speed; 0 = off */
  bool has_capacity;         /* false = dropless (capacity_factor null) */
  double capacity_factor;    /* meaningful only when has_capacity */
} xm_moe_spec_t;

typedef struct {
  int64_t seq_len;
  int64_t micro_batch;       /* sequences per rank per micro-step */
  int64_t global_batch;      /* sequences per optimizer step, all ranks */
  xm_train_dtype_t dtype;
  double lr;
  double min_lr;
  int64_t warmup_steps;
  xm_lr_schedule_t lr_schedule;
  int64_t train_steps;       /* total steps the schedule spans */
  double weight_decay;
  double beta1, beta2, adam_eps;
  double grad_clip;          /* global-norm clip; 0 = off */
  uint64_t seed;
  int zero_stage;            /* 0 or 1 */
  xm_recompute_t recompute;
  double mtp_loss_weight;    /* lambda: loss += lambda/D * sum_k CE_k (DeepSeek-V3 0.3) */
} xm_training_spec_t;

typedef struct {
  bool present;              /* a cluster was given (file or inline) */
  char name[XM_SPEC_NAME_MAX];
  int64_t nodes;
  int64_t ranks_per_node;
  double device_memory_gib;
  double peak_tflops;        /* per device, training dtype, dense matrix */
  double gemm_efficiency;    /* fraction of peak GEMMs reach, (0, 1] */
  double intra_bw_gbps;      /* GB/s per rank, one direction, inside a node */
  double intra_latency_us;
  double inter_bw_gbps;      /* GB/s per rank, one direction, across nodes */
  double inter_latency_us;
  xm_topology_t topology;
  /* The network in detail (fabric/, docs/fabric.md); 0 = derived from the
   * fields above as docs/fabric.md says. */
  int64_t nic_ports;           /* NIC ports per node */
  double link_gbps;            /* Gb/s per NIC port and direction */
  int64_t switch_radix;        /* ports of one electrical switch */
  double oversubscription;     /* fat-tree-oversubscribed: leaf down:up */
  int64_t dragonfly_servers_per_router, dragonfly_routers_per_group, dragonfly_global_links;
  int64_t ocs_region_servers;  /* regional-ocs: servers per region */
  int64_t ocs_ports;           /* NIC ports per node on the region's OCS */
  int64_t ocs_switch_ports;    /* ports of one OCS */
  double ocs_reconfig_ms;      /* circuit reconfiguration delay */
  xm_ocs_reconfig_t ocs_reconfig;
  /* The GPU architecture code is generated for: "gfx90a" (MI250X, the
   * default of --target hip), "sm_90" (H100/H200, the default of --target
   * cuda), ...; "" = the target's default. */
  char gpu_arch[XM_SPEC_NAME_MAX];
} xm_cluster_spec_t;

typedef struct {
  bool present;              /* the spec fixes the layout */
  int64_t dp, tp, ep;
  bool ssmb, rbd;
  int zero;                  /* 0 or 1 */
} xm_parallel_spec_t;

typedef struct {
  char name[XM_SPEC_NAME_MAX];
  char model_type[XM_SPEC_NAME_MAX]; /* "xmoec" or the HF model_type */
  xm_model_spec_t model;
  xm_moe_spec_t moe;
  xm_training_spec_t training;
  xm_cluster_spec_t cluster;
  xm_parallel_spec_t parallel;
} xm_spec_t;

/* Fills every field with its documented default (docs/spec.md). */
void xm_spec_set_defaults(xm_spec_t *spec);

/* Loads a model spec from a file: an xmoec model JSON or a Hugging Face
 * config.json (recognised by a top-level "model_type"). Every problem goes to
 * `diag` with its JSON pointer; returns XM_ERR_INVALID_INPUT if any error was
 * reported, XM_ERR_IO if the file cannot be read. `out` is filled even on
 * failure (with whatever was read) but must not be used then. */
xm_status_t xm_spec_load_file(const char *path, xm_diag_t *diag, xm_spec_t *out);

/* Same from text in memory; `source` names it in messages. */
xm_status_t xm_spec_load_text(const char *text, size_t len, const char *source,
                              xm_diag_t *diag, xm_spec_t *out);

/* Loads a cluster description file (fields of the "cluster" section at the
 * top level) into spec->cluster, then re-runs the checks that involve the
 * cluster (parallel layout against world size). */
xm_status_t xm_spec_load_cluster_file(const char *path, xm_diag_t *diag,
                                      xm_spec_t *spec);
xm_status_t xm_spec_load_cluster_text(const char *text, size_t len,
                                      const char *source, xm_diag_t *diag,
                                      xm_spec_t *spec);

/* Semantic checks over a filled spec (also run by the loaders). */
void xm_spec_validate(const xm_spec_t *spec, const char *source, xm_diag_t *diag);

/* Layer i is an MoE layer (i >= first_k_dense and experts > 0). */
static inline bool xm_spec_layer_is_moe(const xm_spec_t *s, int64_t i) {
  return s->moe.experts > 0 && i >= s->model.first_k_dense;
}

/* The model builder (ir/model.c) can build the model whatever the layout:
 * false would be for what is counted and planned but refused there. Every
 * valid spec trains today (Qwen2-MoE's shared-expert gate, the last such
 * feature, is built), so check and plan report "trainable": true; the one
 * predicate stays so that a future refusal has one place to say so. */
static inline bool xm_spec_trainable(const xm_spec_t *s) {
  (void)s;
  return true;
}

const char *xm_activation_name(xm_activation_t a);
const char *xm_scoring_name(xm_scoring_t s);
const char *xm_attn_kind_name(xm_attn_kind_t a);
/* The cluster file's name of a topology ("fat-tree", ..., "regional-ocs"). */
const char *xm_topology_name(xm_topology_t t);

#endif /* XM_FRONTEND_SPEC_H */
