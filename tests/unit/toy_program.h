/* tests/unit/toy_program.h — the small hand-built program whose checkpoints
 * tests/unit/test_checkpoint.c and tests/fuzz/fuzz_checkpoint.c save and
 * load: an embedding [5,4], three stacked experts [3,2,4], a router bias,
 * a norm, their grads and AdamW moments, an i32 load accumulator and one
 * activation. Included once per test program (static storage). */
#ifndef XM_TESTS_TOY_PROGRAM_H
#define XM_TESTS_TOY_PROGRAM_H

#include <stdint.h>
#include <string.h>

#include "runtime/abi/program.h"
#include "runtime/comm/context.h"

enum { V = 5, H = 4, E = 3, F = 2 };
#define EXPERT "model.layers.0.mlp.experts.{e}.gate_proj.weight"
#define BIAS "model.layers.0.mlp.gate.e_score_correction_bias"

#define W_ XM_RT_CAT_WEIGHTS
#define G_ XM_RT_CAT_GRADS
#define O_ XM_RT_CAT_OPTIMIZER
#define T_(n, c, d, p, r, ...)                                                                     \
  {                                                                                                \
    .name = n, .category = c, .dtype = d, .rank = r, .dims = {__VA_ARGS__}, .persistent = 1,       \
    .trainable = 1, .param = p                                                                     \
  }

/* clang-format off */
static xm_rt_tensor_t g_tensors[] = {
    T_("model.embed_tokens.weight",            W_, XM_RT_F32, -1, 2, V, H),
    T_(EXPERT,                                 W_, XM_RT_F32, -1, 3, E, F, H),
    T_(BIAS,                                   W_, XM_RT_F32, -1, 1, E),
    T_("model.norm.weight",                    W_, XM_RT_F32, -1, 1, H),
    T_("model.embed_tokens.weight.grad",       G_, XM_RT_F32, 0, 2, V, H),
    T_(EXPERT ".grad",                         G_, XM_RT_F32, 1, 3, E, F, H),
    T_("model.embed_tokens.weight.exp_avg",    O_, XM_RT_F32, 0, 2, V, H),
    T_("model.embed_tokens.weight.exp_avg_sq", O_, XM_RT_F32, 0, 2, V, H),
    T_(EXPERT ".exp_avg",                      O_, XM_RT_F32, 1, 3, E, F, H),
    T_(EXPERT ".exp_avg_sq",                   O_, XM_RT_F32, 1, 3, E, F, H),
    T_("model.norm.weight.exp_avg",            O_, XM_RT_F32, 3, 1, H),
    T_("model.norm.weight.exp_avg_sq",         O_, XM_RT_F32, 3, 1, H),
    T_("model.layers.0.mlp.gate.load",         O_, XM_RT_I32, 2, 1, E),
    {.name = "%17", .category = XM_RT_CAT_ACTIVATIONS, .rank = 2, .dims = {2, H}, .param = -1},
};
/* clang-format on */
enum { NT = sizeof g_tensors / sizeof g_tensors[0] };

static const char k_config[] = "{\"hidden_size\": 4, \"n_routed_experts\": 3}\n";
static const char k_spec[] = "{\"model\": {\"name\": \"toy\"}}\n";

static xm_rt_program_t g_program;
static xm_rt_context_t g_ctx;

/* Places the tensors (64-byte aligned, persistent and activation arenas
 * apart) and fills g_program and a one-rank g_ctx. */
static void program_init(void) {
  int64_t persist = 0, act = 0;
  for (int i = 0; i < NT; i++) {
    xm_rt_tensor_t *t = &g_tensors[i];
    int64_t n = 4;
    for (int d = 0; d < t->rank; d++)
      n *= t->dims[d];
    t->bytes = n;
    int64_t *top = t->persistent ? &persist : &act;
    t->offset = *top;
    *top += (n + 63) / 64 * 64;
  }
  memset(&g_program, 0, sizeof g_program);
  g_program.model_name = "toy";
  g_program.config_json = k_config;
  g_program.spec_json = k_spec;
  g_program.vocab = V, g_program.seq_len = 8, g_program.micro_batch = 2, g_program.grad_accum = 1;
  g_program.lr = 3e-4, g_program.min_lr = 3e-5, g_program.weight_decay = 0.1;
  g_program.beta1 = 0.9, g_program.beta2 = 0.95, g_program.adam_eps = 1e-8;
  g_program.grad_clip = 1.0, g_program.warmup_steps = 10, g_program.train_steps = 100;
  g_program.seed = 0xfedcba9876543210ull;
  g_program.persistent_bytes = persist;
  g_program.activation_bytes = act;
  g_program.num_tensors = NT;
  g_program.tensors = g_tensors;
  g_program.tokens = g_program.labels = g_program.loss = g_program.ce_loss = -1;
  memset(&g_ctx, 0, sizeof g_ctx);
  g_ctx.world = 1;
  g_ctx.ranks_per_node = 1;
  g_ctx.num_nodes = 1;
}

#endif
