/* tests/unit/ir_fixtures.h — what the IR-level tests share: the small spec
 * they build graphs from (3 layers, the first dense; 8 experts top-2 with a
 * shared expert; GQA; aux loss; 2 sequences of 8 tokens; values set
 * directly, no loader, so a test sees exactly these fields and zero
 * elsewhere) and op lookups. */
#ifndef XM_TESTS_IR_FIXTURES_H
#define XM_TESTS_IR_FIXTURES_H

#include <string.h>

#include "frontend/spec.h"
#include "ir/ir.h"

static inline xm_spec_t tiny_spec(void) {
  xm_spec_t s;
  memset(&s, 0, sizeof s);
  strcpy(s.name, "tiny");
  strcpy(s.model_type, "xmoec");
  s.model.vocab = 64;
  s.model.hidden = 32;
  s.model.layers = 3;
  s.model.heads = 4;
  s.model.kv_heads = 2;
  s.model.head_dim = 8;
  s.model.rope_theta = 10000.0;
  s.model.norm_eps = 1e-6;
  s.model.first_k_dense = 1;
  s.model.dense_ffn = 48;
  s.model.attention = XM_ATTN_GQA;
  s.model.qk_norm = XM_QK_NORM_NONE;
  s.moe.experts = 8;
  s.moe.shared_experts = 1;
  s.moe.shared_ffn = 16;
  s.moe.top_k = 2;
  s.moe.expert_ffn = 16;
  s.moe.activation = XM_ACT_SWIGLU;
  s.moe.scoring = XM_SCORING_SOFTMAX;
  s.moe.norm_topk_prob = true;
  s.moe.routed_scaling = 1.0;
  s.moe.n_group = 1;
  s.moe.topk_group = 1;
  s.moe.aux_alpha = 0.01;
  s.training.seq_len = 8;
  s.training.micro_batch = 2;
  s.training.global_batch = 2;
  return s;
}

static inline int count_ops(const xm_ir_module_t *m, xm_ir_opcode_t code) {
  int n = 0;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++)
    if (xm_ir_module_op(m, i)->code == code) n++;
  return n;
}

/* The n-th op (0-based) of a kind, or NULL. */
static inline xm_ir_op_t *nth_op(const xm_ir_module_t *m, xm_ir_opcode_t code, int nth) {
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->code == code && nth-- == 0) return op;
  }
  return NULL;
}

#endif /* XM_TESTS_IR_FIXTURES_H */
