/* passes/autodiff.c — the "autodiff" pass: reverse-mode differentiation of
 * the forward graph plus the optimizer step, as IR (docs/design.md, Layers and Model semantics).
 *
 * Input: the forward graph of ir/model.c (or any module in its op set)
 * ending in return(loss, ...). Output, in this order: the forward ops
 * (phase "fwd"), the backward ops in reverse topological order (phase
 * "bwd"), the optimizer step (phase "step"), and the return last (phase
 * "fwd"). The runtime runs fwd+bwd once per micro-batch and the step once
 * per optimizer step, so everything a micro-batch contributes goes through
 * persistent state: gradients are summed into grad states by accumulate,
 * and the seed dloss = 1/grad_accum makes that sum the mean over the
 * micro-batches.
 *
 * The walk is the textbook one over a flat topologically ordered array:
 * visit the forward ops from last to first; when an op is reached every
 * user of its results has been visited, so each result's gradient is
 * complete. Contributions to a value used several times are summed with add
 * ops as they arrive. Two masks prune the work: a value "needs" a gradient
 * only if it is a float that depends on a trainable param (so nothing is
 * computed towards inputs, constants or the frozen routing bias), and an op
 * is differentiated only if some result received a gradient (so nothing is
 * computed for values that do not lead to the loss). Discrete results
 * (routing indices, permutation) never carry gradients: the top-k choice is
 * piecewise constant and its derivative is zero almost everywhere.
 *
 * Each backward op copies the location and the layer attribute of the
 * forward op it differentiates, so reports and later passes (recompute,
 * memory plans) can group forward and backward work of one layer, and an
 * error in the backward graph points at the spec field that shaped it.
 * Gradients get exactly the types of the values they differentiate,
 * sharding included, which is what the verifier's rules derive.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/layout.h"
#include "ir/verify.h"
#include "passes/pass.h"
#include "runtime/abi/groups.h"

#define LOC_STEP "/training/grad_clip"
#define BIAS_SUFFIX "e_score_correction_bias"

typedef struct {
  xm_ir_module_t *m;
  xm_diag_t *diag;
  int num_fwd;           /* forward ops: positions [0, num_fwd) */
  int num_vals;          /* forward value ids are < num_vals */
  bool *needs;           /* id -> float value depending on a trainable param */
  xm_ir_value_t **grad;  /* id -> gradient summed so far (NULL: none) */
  xm_ir_value_t **state; /* id of a param's value -> its grad state */
  const xm_ir_op_t *src; /* op whose loc and layer new ops take (NULL: step) */
  const char *phase;     /* phase of new ops */
  int64_t dp, tp, ep;    /* layout of a sharded module (module attrs par_*; 1 when absent) */
  int64_t rpn;           /* its ranks per node (par_rpn; 0 when absent: unknown) */
} ad_t;

/* ---- emitting ---------------------------------------------------------- */

static xm_ir_op_t *emit(ad_t *a, xm_ir_opcode_t code, int nops, xm_ir_value_t *const *ops, int nres,
                        const xm_ir_type_t *types) {
  const char *loc = a->src ? a->src->loc : LOC_STEP;
  xm_ir_op_t *op = xm_ir_op_append(a->m, code, nops, ops, nres, types, loc);
  XM_ASSERT(op != NULL); /* arena exhaustion, as in the model builder */
  const xm_ir_attr_t *layer = a->src ? xm_ir_op_attr(a->src, "layer") : NULL;
  if (layer) xm_ir_op_set_attr(a->m, op, layer);
  xm_ir_op_set_string(a->m, op, "phase", a->phase);
  return op;
}

static xm_ir_value_t *emit1(ad_t *a, xm_ir_opcode_t code, int nops, xm_ir_value_t *const *ops,
                            xm_ir_type_t type) {
  return emit(a, code, nops, ops, 1, &type)->results[0];
}

#define OPS(...)                                                                                   \
  (xm_ir_value_t *[]) { __VA_ARGS__ }
#define NOPS(...) ((int)(sizeof(OPS(__VA_ARGS__)) / sizeof(xm_ir_value_t *)))
/* One-result op; returns the op (for attributes). */
#define OP1(a, code, type, ...)                                                                    \
  emit(a, code, NOPS(__VA_ARGS__), OPS(__VA_ARGS__), 1, (xm_ir_type_t[]){type})

/* Copies attribute `key` of the differentiated op onto `op`. */
static void copy_attr(ad_t *a, xm_ir_op_t *op, const char *key) {
  const xm_ir_attr_t *attr = xm_ir_op_attr(a->src, key);
  if (attr) xm_ir_op_set_attr(a->m, op, attr);
}

/* ---- gradient bookkeeping ---------------------------------------------- */

static bool needs(const ad_t *a, const xm_ir_value_t *v) {
  return v->id >= 0 && v->id < a->num_vals && a->needs[v->id];
}

static xm_ir_value_t *grad_of(const ad_t *a, const xm_ir_value_t *v) {
  return v->id >= 0 && v->id < a->num_vals ? a->grad[v->id] : NULL;
}

/* Adds `g` to the gradient of `v` (ignored when v needs none). */
static void contribute(ad_t *a, xm_ir_value_t *v, xm_ir_value_t *g) {
  if (!needs(a, v)) return;
  XM_ASSERT(xm_ir_type_equal(&v->type, &g->type));
  xm_ir_value_t *old = a->grad[v->id];
  a->grad[v->id] = old ? emit1(a, XM_OP_ADD, 2, OPS(old, g), v->type) : g;
}

/* The gradient of a broadcast operand: dy summed down to `to`, over the
 * leading dims (a trailing suffix) or over each row (mul's per-row factor,
 * `to` of dy's shape with the last dim 1): both are reduce_to. */
static xm_ir_value_t *unbroadcast(ad_t *a, xm_ir_value_t *dy, const xm_ir_type_t *to) {
  if (xm_ir_type_equal(&dy->type, to)) return dy;
  return emit1(a, XM_OP_REDUCE_TO, 1, OPS(dy), *to);
}

/* ---- backward rules ---------------------------------------------------- */

static void grad_add_mul(ad_t *a, xm_ir_op_t *op, xm_ir_value_t *dy) {
  xm_ir_value_t *x = op->operands[0], *y = op->operands[1];
  if (op->code == XM_OP_ADD) {
    contribute(a, x, dy);
    if (needs(a, y)) contribute(a, y, unbroadcast(a, dy, &y->type));
    return;
  }
  /* mul: y broadcasts over x's leading dims or along x's rows (the
   * shared-expert gate [T,1] times [T,H]), and so it does over dy's; y's
   * gradient is then dy * x summed back to y's shape. */
  if (needs(a, x)) contribute(a, x, emit1(a, XM_OP_MUL, 2, OPS(dy, y), x->type));
  if (needs(a, y)) {
    xm_ir_value_t *t = emit1(a, XM_OP_MUL, 2, OPS(dy, x), x->type);
    contribute(a, y, unbroadcast(a, t, &y->type));
  }
}

/* silu, gelu, sigmoid, scale: one operand, elementwise. */
static void grad_unary(ad_t *a, xm_ir_op_t *op, xm_ir_value_t *dy) {
  xm_ir_value_t *x = op->operands[0];
  if (!needs(a, x)) return;
  xm_ir_value_t *g;
  switch (op->code) {
  case XM_OP_SCALE: {
    xm_ir_op_t *s = OP1(a, XM_OP_SCALE, x->type, dy);
    copy_attr(a, s, "factor");
    g = s->results[0];
    break;
  }
  case XM_OP_SILU: g = emit1(a, XM_OP_SILU_GRAD, 2, OPS(dy, x), x->type); break;
  case XM_OP_GELU: g = emit1(a, XM_OP_GELU_GRAD, 2, OPS(dy, x), x->type); break;
  /* sigmoid' = y (1 - y): the forward output is what the kernel wants. */
  case XM_OP_SIGMOID: g = emit1(a, XM_OP_SIGMOID_GRAD, 2, OPS(dy, op->results[0]), x->type); break;
  case XM_OP_RESHAPE: g = emit1(a, XM_OP_RESHAPE, 1, OPS(dy), x->type); break;
  case XM_OP_ROPE: {
    static const char *const keys[] = {"theta",      "rot_offset", "rot_dim", "interleave",
                                       "yarn_factor", "yarn_low",  "yarn_high", "mscale"};
    xm_ir_op_t *r = OP1(a, XM_OP_ROPE_GRAD, x->type, dy);
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
      copy_attr(a, r, keys[k]);
    g = r->results[0];
    break;
  }
  default: XM_ASSERT(!"not a unary op"); return;
  }
  contribute(a, x, g);
}

/* Ops whose backward gives every float operand's gradient at once. */
static void grad_multi(ad_t *a, xm_ir_op_t *op, xm_ir_value_t *dy) {
  xm_ir_value_t **x = op->operands;
  xm_ir_op_t *b;
  switch (op->code) {
  case XM_OP_SWIGLU:
    b = emit(a, XM_OP_SWIGLU_GRAD, 3, OPS(dy, x[0], x[1]), 2,
             (xm_ir_type_t[]){x[0]->type, x[1]->type});
    contribute(a, x[0], b->results[0]);
    contribute(a, x[1], b->results[1]);
    break;
  case XM_OP_RMSNORM:
    b = emit(a, XM_OP_RMSNORM_GRAD, 3, OPS(dy, x[0], x[1]), 2,
             (xm_ir_type_t[]){x[0]->type, x[1]->type});
    copy_attr(a, b, "eps");
    contribute(a, x[0], b->results[0]);
    contribute(a, x[1], b->results[1]);
    break;
  case XM_OP_ATTENTION:
    b = emit(a, XM_OP_ATTENTION_GRAD, 4, OPS(dy, x[0], x[1], x[2]), 3,
             (xm_ir_type_t[]){x[0]->type, x[1]->type, x[2]->type});
    copy_attr(a, b, "scale");
    for (int i = 0; i < 3; i++)
      contribute(a, x[i], b->results[i]);
    break;
  case XM_OP_CONCAT: /* the parts of dy; a broadcast part's heads summed */
    b = emit(a, XM_OP_SPLIT, 1, OPS(dy), 2, (xm_ir_type_t[]){x[0]->type, x[1]->type});
    contribute(a, x[0], b->results[0]);
    contribute(a, x[1], b->results[1]);
    break;
  case XM_OP_SCATTER_COMBINE: /* y, indices, weights */
    b = emit(a, XM_OP_SCATTER_COMBINE_GRAD, 4, OPS(dy, x[0], x[1], x[2]), 2,
             (xm_ir_type_t[]){x[0]->type, x[2]->type});
    contribute(a, x[0], b->results[0]);
    contribute(a, x[2], b->results[1]);
    break;
  default: XM_ASSERT(!"not a multi-gradient op"); break;
  }
}

/* matmul and grouped_matmul: dx and dw are separate ops, each emitted only
 * when its operand needs it (a frozen weight costs no dw GEMM). */
static void grad_gemm(ad_t *a, xm_ir_op_t *op, xm_ir_value_t *dy) {
  xm_ir_value_t *x = op->operands[0], *w = op->operands[1];
  if (op->code == XM_OP_MATMUL) {
    if (needs(a, x)) contribute(a, x, emit1(a, XM_OP_MATMUL_DX, 2, OPS(dy, w), x->type));
    if (needs(a, w)) contribute(a, w, emit1(a, XM_OP_MATMUL_DW, 2, OPS(dy, x), w->type));
    return;
  }
  xm_ir_value_t *tpe = op->operands[2];
  if (needs(a, x)) contribute(a, x, emit1(a, XM_OP_GROUPED_MATMUL_DX, 3, OPS(dy, w, tpe), x->type));
  if (needs(a, w)) contribute(a, w, emit1(a, XM_OP_GROUPED_MATMUL_DW, 3, OPS(dy, x, tpe), w->type));
}

/* embedding, gather_rows: the gradient scatters rows back by index. */
static void grad_rows(ad_t *a, xm_ir_op_t *op, xm_ir_value_t *dy) {
  if (op->code == XM_OP_EMBEDDING) {
    xm_ir_value_t *tok = op->operands[0], *tab = op->operands[1];
    if (!needs(a, tab)) return;
    xm_ir_op_t *b = OP1(a, XM_OP_EMBEDDING_GRAD, tab->type, dy, tok);
    xm_ir_op_set_int(a->m, b, "vocab", tab->type.dims[0]);
    contribute(a, tab, b->results[0]);
    return;
  }
  xm_ir_value_t *x = op->operands[0], *idx = op->operands[1];
  if (!needs(a, x)) return;
  xm_ir_op_t *b = OP1(a, XM_OP_GATHER_ROWS_GRAD, x->type, dy, idx);
  copy_attr(a, b, "k");
  xm_ir_op_set_int(a->m, b, "tokens", x->type.dims[0]);
  contribute(a, x, b->results[0]);
}

/* The fused padding-free MoE ops (fuse-permute-gemm): their backward ops
 * read token rows through the same slot index, so no gathered copy exists
 * in backward either; each takes the forward op's tiling for its scratch. */
static xm_ir_type_t scratch_type(const xm_ir_op_t *op, int64_t width) {
  int64_t rows = xm_ir_op_get_int(op, "tile_rows", 1) * xm_ir_op_get_int(op, "slots", 1);
  return xm_ir_type_make(XM_DT_F32, 2, (int64_t[]){rows, width});
}

static void copy_tiling(ad_t *a, xm_ir_op_t *b) {
  copy_attr(a, b, "tile_rows");
  copy_attr(a, b, "slots");
}

static void grad_fused(ad_t *a, xm_ir_op_t *op, xm_ir_value_t *dy) {
  xm_ir_value_t **x = op->operands;
  xm_ir_op_t *b;
  if (op->code == XM_OP_GATHER_GROUPED_MATMUL) { /* tokens, indices, tpe, w */
    xm_ir_value_t *tok = x[0], *idx = x[1], *tpe = x[2], *w = x[3];
    xm_ir_type_t scratch = scratch_type(op, tok->type.dims[1]);
    if (needs(a, tok)) {
      b = emit(a, XM_OP_GATHER_GROUPED_MATMUL_DX, 4, OPS(dy, w, tpe, idx), 2,
               (xm_ir_type_t[]){tok->type, scratch});
      copy_attr(a, b, "k");
      xm_ir_op_set_int(a->m, b, "tokens", tok->type.dims[0]);
      copy_tiling(a, b);
      contribute(a, tok, b->results[0]);
    }
    if (needs(a, w)) {
      b = emit(a, XM_OP_GATHER_GROUPED_MATMUL_DW, 4, OPS(dy, tok, idx, tpe), 2,
               (xm_ir_type_t[]){w->type, scratch});
      copy_attr(a, b, "k");
      copy_tiling(a, b);
      contribute(a, w, b->results[0]);
    }
    return;
  }
  /* grouped_matmul_combine: h, w, tpe, indices, weights */
  xm_ir_value_t *h = x[0], *w = x[1], *tpe = x[2], *idx = x[3], *rw = x[4];
  xm_ir_type_t scratch = scratch_type(op, w->type.dims[1]);
  if (needs(a, h) || needs(a, rw)) {
    b = emit(a, XM_OP_GROUPED_MATMUL_COMBINE_GRAD, 6, OPS(dy, h, w, tpe, idx, rw), 3,
             (xm_ir_type_t[]){h->type, rw->type, scratch});
    copy_tiling(a, b);
    contribute(a, h, b->results[0]);
    contribute(a, rw, b->results[1]);
  }
  if (needs(a, w)) {
    b = emit(a, XM_OP_GROUPED_MATMUL_COMBINE_DW, 5, OPS(dy, h, idx, rw, tpe), 2,
             (xm_ir_type_t[]){w->type, scratch});
    copy_tiling(a, b);
    contribute(a, w, b->results[0]);
  }
}

/* lm_head_ce (fuse-lm-head): one backward op recomputes each chunk's
 * logits from x, w and the saved stats, and gives both gradients, dw first
 * (result 0, so fold-accumulate can add it into the grad state). */
static void grad_lm_head(ad_t *a, xm_ir_op_t *op, xm_ir_value_t *dy) {
  xm_ir_value_t **x = op->operands;
  if (!needs(a, x[0]) && !needs(a, x[1])) return;
  xm_ir_type_t dx = x[0]->type;
  dx.dtype = XM_DT_F32;
  xm_ir_op_t *b = emit(a, XM_OP_LM_HEAD_CE_GRAD, 5, OPS(dy, x[0], x[1], x[2], op->results[1]), 3,
                       (xm_ir_type_t[]){x[1]->type, dx, op->results[2]->type});
  copy_attr(a, b, "chunk");
  contribute(a, x[1], b->results[0]);
  contribute(a, x[0], b->results[1]);
}

/* Router, routing and the losses. */
static void grad_router_loss(ad_t *a, xm_ir_op_t *op, xm_ir_value_t *dy) {
  xm_ir_value_t **x = op->operands;
  if (!needs(a, x[0])) return;
  xm_ir_op_t *b = NULL;
  switch (op->code) {
  case XM_OP_ROUTER_SCORE:
    b = OP1(a, XM_OP_ROUTER_SCORE_GRAD, x[0]->type, dy, op->results[0]);
    copy_attr(a, b, "scoring");
    break;
  case XM_OP_TOPK_ROUTE: /* dy is dweights; nothing flows to the bias */
    b = OP1(a, XM_OP_TOPK_ROUTE_GRAD, x[0]->type, dy, x[0], op->results[0]);
    copy_attr(a, b, "k");
    copy_attr(a, b, "norm_topk_prob");
    copy_attr(a, b, "routed_scaling");
    break;
  case XM_OP_CROSS_ENTROPY: b = OP1(a, XM_OP_CROSS_ENTROPY_GRAD, x[0]->type, dy, x[0], x[1]); break;
  case XM_OP_AUX_LOSS: /* f_e counts discrete choices: only P_e carries a gradient */
    b = OP1(a, XM_OP_AUX_LOSS_GRAD, x[0]->type, dy, x[0], x[1]);
    copy_attr(a, b, "alpha");
    break;
  default: XM_ASSERT(!"not a router or loss op"); return;
  }
  contribute(a, x[0], b->results[0]);
}

/* Copies the collective attributes (group, group_size, dim, slot) of the
 * differentiated op onto `op`. */
static void copy_comm_attrs(ad_t *a, xm_ir_op_t *op) {
  copy_attr(a, op, "group");
  copy_attr(a, op, "group_size");
  copy_attr(a, op, "dim");
  copy_attr(a, op, "slot");
}

/* The collectives the shard pass inserts into the forward graph. Each
 * gradient is the adjoint collective (Megatron's f/g pair, gather/narrow,
 * the mirrored all-to-all); docs/design.md, Sequence-sharded MoE blocks and docs/parallelism.md. */
static void grad_comm(ad_t *a, xm_ir_op_t *op, xm_ir_value_t *dy) {
  xm_ir_value_t **x = op->operands;
  xm_ir_op_t *b = NULL;
  switch (op->code) {
  case XM_OP_REPLICATE: /* identity forward: the replicas' partial gradients sum */
    if (!needs(a, x[0])) return;
    b = OP1(a, XM_OP_ALL_REDUCE, x[0]->type, dy);
    break;
  case XM_OP_ALL_REDUCE: /* the sum is replicated: each partial gets all of dy */
    contribute(a, x[0], dy);
    return;
  case XM_OP_NARROW: /* every member's slice gradient, concatenated */
    if (!needs(a, x[0])) return;
    b = OP1(a, XM_OP_ALL_GATHER, x[0]->type, dy);
    break;
  case XM_OP_REDUCE_SCATTER: /* this member's slice of a sum of replicas' partials */
    if (!needs(a, x[0])) return;
    b = OP1(a, XM_OP_ALL_GATHER, x[0]->type, dy);
    break;
  case XM_OP_ALL_GATHER: /* dy is replicated: this member's slice is its share */
    if (!needs(a, x[0])) return;
    b = OP1(a, XM_OP_NARROW, x[0]->type, dy);
    break;
  case XM_OP_ALL_TO_ALL: { /* rows travel back: counts swap roles */
    if (!needs(a, x[0])) return;
    b = OP1(a, XM_OP_ALL_TO_ALL, x[0]->type, dy, x[2], x[1]);
    const char *dispatch = xm_rt_phase_kind_name(XM_RT_PHASE_DISPATCH);
    const char *t = xm_ir_op_get_string(op, "traffic", dispatch);
    xm_ir_op_set_string(a->m, b, "traffic",
                        strcmp(t, dispatch) == 0 ? xm_rt_phase_kind_name(XM_RT_PHASE_COMBINE)
                                                 : dispatch);
    break;
  }
  case XM_OP_SORT_CHUNKS:
  case XM_OP_UNSORT_CHUNKS:
    if (!needs(a, x[0])) return;
    b = OP1(a, op->code == XM_OP_SORT_CHUNKS ? XM_OP_UNSORT_CHUNKS : XM_OP_SORT_CHUNKS,
            x[0]->type, dy, x[1]);
    break;
  case XM_OP_RBD_DISPATCH: /* rows are copies of token rows; weights ride along unused */
    if (!needs(a, x[0])) return;
    b = OP1(a, XM_OP_RBD_DISPATCH_GRAD, x[0]->type, dy, op->results[1]);
    break;
  case XM_OP_RBD_COMBINE: { /* y, weights, tpe */
    xm_ir_op_t *g = emit(a, XM_OP_RBD_COMBINE_GRAD, 4, OPS(dy, x[0], x[1], x[2]), 2,
                         (xm_ir_type_t[]){x[0]->type, x[1]->type});
    copy_comm_attrs(a, g);
    contribute(a, x[0], g->results[0]);
    contribute(a, x[1], g->results[1]);
    return;
  }
  default: XM_ASSERT(!"not a collective with a forward role"); return;
  }
  copy_comm_attrs(a, b);
  contribute(a, x[0], b->results[0]);
}

/* split: dx is the two parts' gradients joined; a part that received
 * none (it does not lead to the loss) joins as zeros. */
static void grad_split(ad_t *a, xm_ir_op_t *op) {
  xm_ir_value_t *x = op->operands[0];
  if (!needs(a, x)) return;
  xm_ir_value_t *d[2];
  for (int r = 0; r < 2; r++) {
    d[r] = grad_of(a, op->results[r]);
    if (d[r]) continue;
    xm_ir_op_t *z = OP1(a, XM_OP_CONSTANT, op->results[r]->type);
    xm_ir_op_set_float(a->m, z, "value", 0.0);
    d[r] = z->results[0];
  }
  contribute(a, x, emit1(a, XM_OP_CONCAT, 2, OPS(d[0], d[1]), x->type));
}

/* Differentiates one forward op whose result `r` carries gradient dy
 * (r is 1 for topk_route's weights, else 0). */
static xm_status_t differentiate(ad_t *a, xm_ir_op_t *op, int pos, xm_ir_value_t *dy) {
  a->src = op;
  switch (op->code) {
  case XM_OP_ADD:
  case XM_OP_MUL: grad_add_mul(a, op, dy); break;
  case XM_OP_SCALE:
  case XM_OP_SILU:
  case XM_OP_GELU:
  case XM_OP_SIGMOID:
  case XM_OP_RESHAPE:
  case XM_OP_ROPE: grad_unary(a, op, dy); break;
  case XM_OP_SWIGLU:
  case XM_OP_RMSNORM:
  case XM_OP_ATTENTION:
  case XM_OP_CONCAT:
  case XM_OP_SCATTER_COMBINE: grad_multi(a, op, dy); break;
  case XM_OP_SPLIT: grad_split(a, op); break;
  case XM_OP_MATMUL:
  case XM_OP_GROUPED_MATMUL: grad_gemm(a, op, dy); break;
  case XM_OP_EMBEDDING:
  case XM_OP_GATHER_ROWS: grad_rows(a, op, dy); break;
  case XM_OP_GATHER_GROUPED_MATMUL:
  case XM_OP_GROUPED_MATMUL_COMBINE: grad_fused(a, op, dy); break;
  case XM_OP_LM_HEAD_CE: grad_lm_head(a, op, dy); break;
  case XM_OP_ROUTER_SCORE:
  case XM_OP_TOPK_ROUTE:
  case XM_OP_CROSS_ENTROPY:
  case XM_OP_AUX_LOSS: grad_router_loss(a, op, dy); break;
  case XM_OP_REPLICATE:
  case XM_OP_ALL_REDUCE:
  case XM_OP_NARROW:
  case XM_OP_ALL_GATHER:
  case XM_OP_REDUCE_SCATTER:
  case XM_OP_ALL_TO_ALL:
  case XM_OP_SORT_CHUNKS:
  case XM_OP_UNSORT_CHUNKS:
  case XM_OP_RBD_DISPATCH:
  case XM_OP_RBD_COMBINE: grad_comm(a, op, dy); break;
  default:
    xm_diag_add(a->diag, XM_DIAG_ERROR, NULL, op->loc[0] ? op->loc : NULL,
                "op %d (%s) lies on the path to the loss but has no backward rule "
                "(autodiff runs on the forward graph, before sharding)",
                pos, xm_ir_opinfo(op->code)->name);
    return XM_ERR_UNSUPPORTED;
  }
  return XM_OK;
}

/* ---- the masks --------------------------------------------------------- */

static bool is_float(xm_dtype_t dt) {
  return dt == XM_DT_F32 || dt == XM_DT_BF16 || dt == XM_DT_F16;
}

static bool is_trainable_param(const xm_ir_op_t *op) {
  return op->code == XM_OP_PARAM && xm_ir_op_get_bool(op, "trainable", true);
}

/* needs[v]: v is a float and depends on a trainable param. Routing ints
 * are excluded by dtype, so discrete paths carry nothing. */
static void compute_needs(ad_t *a) {
  for (int i = 0; i < a->num_fwd; i++) {
    const xm_ir_op_t *op = xm_ir_module_op(a->m, i);
    bool dep = is_trainable_param(op);
    for (int j = 0; !dep && j < op->num_operands; j++)
      dep = needs(a, op->operands[j]);
    for (int r = 0; r < op->num_results; r++) {
      const xm_ir_value_t *v = op->results[r];
      if (v->id >= 0 && v->id < a->num_vals) a->needs[v->id] = dep && is_float(v->type.dtype);
    }
  }
}

/* ---- state and the step ------------------------------------------------ */

/* A persistent state buffer of `type` named "<of><suffix>". */
static xm_ir_value_t *emit_state(ad_t *a, const char *of, const char *suffix, const char *kind,
                                 xm_ir_type_t type) {
  char name[512];
  snprintf(name, sizeof name, "%s%s", of, suffix);
  xm_ir_op_t *st = emit(a, XM_OP_STATE, 0, NULL, 1, &type);
  xm_ir_op_set_string(a->m, st, "name", name);
  xm_ir_op_set_string(a->m, st, "kind", kind);
  xm_ir_op_set_string(a->m, st, "of", of);
  return st->results[0];
}

/* The param's gradient is complete: sum it into its grad state. */
static void finish_param(ad_t *a, xm_ir_op_t *param) {
  xm_ir_value_t *p = param->results[0], *g = grad_of(a, p);
  if (!g) return;
  a->src = param;
  const char *name = xm_ir_op_get_string(param, "name", "param");
  xm_ir_value_t *st = emit_state(a, name, ".grad", "grad", p->type);
  emit(a, XM_OP_ACCUMULATE, 2, OPS(st, g), 0, NULL);
  a->state[p->id] = st;
}

/* The backward walk, seeded with dloss = 1/grad_accum. */
static xm_status_t backward(ad_t *a, xm_ir_op_t *ret, int64_t grad_accum) {
  xm_ir_value_t *loss = ret->operands[0];
  if (!needs(a, loss)) return XM_OK; /* nothing trainable reaches the loss */
  a->src = ret;
  xm_ir_op_t *seed = OP1(a, XM_OP_CONSTANT, loss->type);
  xm_ir_op_set_float(a->m, seed, "value", 1.0 / ((double)grad_accum * (double)a->dp));
  a->grad[loss->id] = seed->results[0];
  for (int i = a->num_fwd - 1; i >= 0; i--) {
    xm_ir_op_t *op = xm_ir_module_op(a->m, i);
    if (op->code == XM_OP_PARAM) {
      finish_param(a, op);
      continue;
    }
    int r = op->code == XM_OP_TOPK_ROUTE ? 1 : 0;
    xm_ir_value_t *dy = op->num_results > r ? grad_of(a, op->results[r]) : NULL;
    if (!dy && op->code == XM_OP_SPLIT) dy = grad_of(a, op->results[1]); /* either part */
    if (dy) XM_RETURN_IF_ERROR(differentiate(a, op, i, dy));
  }
  return XM_OK;
}

/* The routing bias of a topk_route when it is a param (aux-free layers). */
static xm_ir_op_t *routing_bias(const xm_ir_op_t *op) {
  if (op->code != XM_OP_TOPK_ROUTE || op->num_operands != 2) return NULL;
  xm_ir_op_t *def = op->operands[1]->def;
  return def && def->code == XM_OP_PARAM ? def : NULL;
}

/* The permute that consumes a topk_route's experts (NULL if none). */
static xm_ir_op_t *permute_of(const ad_t *a, const xm_ir_op_t *topk) {
  for (int i = 0; i < a->num_fwd; i++) {
    xm_ir_op_t *op = xm_ir_module_op(a->m, i);
    if (op->code != XM_OP_PERMUTE) continue;
    const xm_ir_value_t *e = op->operands[0];
    if (e->def && e->def->code == XM_OP_NARROW) e = e->def->operands[0]; /* SSMB slice */
    if (e == topk->results[0]) return op;
  }
  return NULL;
}

/* "model.layers.3.mlp.gate.e_score_correction_bias" -> "...mlp.gate.load". */
static void load_name(const char *bias, char *buf, size_t n) {
  size_t len = strlen(bias), sl = strlen(BIAS_SUFFIX);
  if (len >= sl && strcmp(bias + len - sl, BIAS_SUFFIX) == 0)
    snprintf(buf, n, "%.*sload", (int)(len - sl), bias);
  else
    snprintf(buf, n, "%s.load", bias);
}

typedef struct {
  xm_ir_value_t *bias, *load;
  const xm_ir_op_t *src;
} aux_free_t;

/* Per micro-batch: load += tokens_per_expert, for each layer with a bias
 * param. Returns the number of layers (entries in out, room num_fwd). */
static int emit_loads(ad_t *a, aux_free_t *out) {
  int n = 0;
  for (int i = 0; i < a->num_fwd; i++) {
    xm_ir_op_t *op = xm_ir_module_op(a->m, i), *bias = routing_bias(op), *perm;
    if (!bias || !(perm = permute_of(a, op))) continue;
    char name[512];
    load_name(xm_ir_op_get_string(bias, "name", "bias"), name, sizeof name);
    a->src = perm;
    xm_ir_value_t *tpe = perm->results[2];
    xm_ir_op_t *st = emit(a, XM_OP_STATE, 0, NULL, 1, &tpe->type);
    xm_ir_op_set_string(a->m, st, "name", name);
    xm_ir_op_set_string(a->m, st, "kind", "load");
    xm_ir_op_set_string(a->m, st, "of", xm_ir_op_get_string(bias, "name", "bias"));
    emit(a, XM_OP_ACCUMULATE, 2, OPS(st->results[0], tpe), 0, NULL);
    out[n++] = (aux_free_t){bias->results[0], st->results[0], bias};
  }
  return n;
}

/* ---- the step of a sharded module ------------------------------------------ */

/* Size of a named group (runtime/abi/groups.def) under the module's
 * layout; 1 for a name the table does not have. */
static int64_t group_size(const ad_t *a, const char *g) {
  xm_group_kind_t kind;
  if (!xm_group_kind_from_name(g, &kind)) return 1;
  xm_layout_t l = {.dp = a->dp, .tp = a->tp, .ep = a->ep, .ranks_per_node = a->rpn};
  return xm_layout_group_size(&l, kind);
}

static void set_group(ad_t *a, xm_ir_op_t *op, const char *g) {
  xm_ir_op_set_string(a->m, op, "group", g);
  xm_ir_op_set_int(a->m, op, "group_size", group_size(a, g));
}

/* Calls fn(a, group, arg) for each name of a comma list ("dp,tp"). */
static void each_group(ad_t *a, const char *list, const char *skip,
                       void (*fn)(ad_t *, const char *, void *), void *arg) {
  char buf[64];
  for (const char *p = list; p && *p;) {
    const char *c = strchr(p, ',');
    size_t n = c ? (size_t)(c - p) : strlen(p);
    if (n > 0 && n < sizeof buf) {
      memcpy(buf, p, n);
      buf[n] = '\0';
      if (!skip || strcmp(buf, skip) != 0) fn(a, buf, arg);
    }
    p = c ? c + 1 : NULL;
  }
}

static void reduce_state_in(ad_t *a, const char *g, void *state) {
  xm_ir_op_t *r = emit(a, XM_OP_REDUCE_STATE, 1, OPS((xm_ir_value_t *)state), 0, NULL);
  set_group(a, r, g);
}

static void all_reduce_scalar(ad_t *a, const char *g, void *slot) {
  xm_ir_value_t **v = slot;
  xm_ir_op_t *r = OP1(a, XM_OP_ALL_REDUCE, (*v)->type, *v);
  set_group(a, r, g);
  *v = r->results[0];
}

/* One parameter's optimizer inputs after the gradient reduction. */
typedef struct {
  xm_ir_op_t *param;
  xm_ir_value_t *grad;  /* the grad state, or its ZeRO-1 chunk */
  const char *zero;     /* ZeRO-1 group, or NULL */
  char norm[64];        /* groups its squared norm is summed over */
} step_param_t;

/* Reduces a parameter's gradient over the groups its attr reduce names
 * (the ZeRO-1 group by reduce-scatter into a chunk, the others in place). */
static void reduce_grad(ad_t *a, xm_ir_op_t *op, xm_ir_value_t *g, step_param_t *out) {
  const char *reduce = xm_ir_op_get_string(op, "reduce", "");
  const char *zero = xm_ir_op_get_string(op, "zero_group", NULL);
  if (zero && group_size(a, zero) <= 1) zero = NULL;
  a->src = op;
  each_group(a, reduce, zero, reduce_state_in, g);
  out->param = op;
  out->grad = g;
  out->zero = zero;
  const char *split = xm_ir_op_get_string(op, "split_group", NULL);
  snprintf(out->norm, sizeof out->norm, "%s%s%s", split ? split : "", split && zero ? "," : "",
           zero ? zero : "");
  if (zero) {
    int64_t n = xm_ir_type_numel(&g->type), p = group_size(a, zero);
    xm_ir_type_t ct = xm_ir_type_make(XM_DT_F32, 1, (int64_t[]){(n + p - 1) / p});
    xm_ir_op_t *rs = OP1(a, XM_OP_ZERO_REDUCE_SCATTER, ct, g);
    set_group(a, rs, zero);
    out->grad = rs->results[0];
  }
}

/* The global squared gradient norm: one partial sum per set of norm
 * groups (slices and chunks are distinct across those groups, everything
 * else is replicated), all-reduced over them, then added. */
static xm_ir_value_t *global_norm_sq(ad_t *a, step_param_t *sp, int n) {
  xm_ir_value_t *total = NULL, **grads = calloc((size_t)n + 1, sizeof *grads);
  bool *done = calloc((size_t)n + 1, sizeof *done);
  XM_ASSERT(grads && done);
  xm_ir_type_t scalar = xm_ir_type_make(XM_DT_F32, 0, NULL);
  a->src = NULL;
  for (int i = 0; i < n; i++) {
    if (done[i]) continue;
    int ng = 0;
    for (int j = i; j < n; j++)
      if (!done[j] && strcmp(sp[j].norm, sp[i].norm) == 0) {
        grads[ng++] = sp[j].grad;
        done[j] = true;
      }
    xm_ir_value_t *part = emit1(a, XM_OP_GRAD_NORM_SQ, ng, grads, scalar);
    each_group(a, sp[i].norm, NULL, all_reduce_scalar, &part);
    total = total ? emit1(a, XM_OP_ADD, 2, OPS(total, part), scalar) : part;
  }
  free(grads);
  free(done);
  return total;
}

/* Gradient reduction, grad_norm_sq, AdamW per param (on its ZeRO-1 chunk),
 * then the all-gathers of the ZeRO-1 params, zero the grads; then the aux-free bias
 * updates on the loads summed over the token-parallel ranks. Params are
 * visited in forward order (deterministic output). */
static void emit_step(ad_t *a, const aux_free_t *af, int num_af, double gamma) {
  a->phase = "step";
  int ng = 0;
  step_param_t *sp = calloc((size_t)a->num_fwd + 1, sizeof *sp);
  XM_ASSERT(sp != NULL);
  for (int i = 0; i < a->num_fwd; i++) {
    xm_ir_op_t *op = xm_ir_module_op(a->m, i);
    if (op->code == XM_OP_PARAM && a->state[op->results[0]->id])
      reduce_grad(a, op, a->state[op->results[0]->id], &sp[ng++]);
  }
  if (ng > 0) {
    xm_ir_value_t *ns = global_norm_sq(a, sp, ng);
    for (int i = 0; i < ng; i++) {
      xm_ir_op_t *op = sp[i].param;
      xm_ir_value_t *p = op->results[0];
      a->src = op;
      const char *name = xm_ir_op_get_string(op, "name", "param");
      xm_ir_type_t st = sp[i].zero ? sp[i].grad->type : p->type;
      xm_ir_value_t *mo = emit_state(a, name, ".exp_avg", "adam_m", st);
      xm_ir_value_t *vo = emit_state(a, name, ".exp_avg_sq", "adam_v", st);
      if (sp[i].zero) {
        xm_ir_op_set_string(a->m, mo->def, "chunk_group", sp[i].zero);
        xm_ir_op_set_string(a->m, vo->def, "chunk_group", sp[i].zero);
      }
      xm_ir_op_t *ad = emit(a, XM_OP_ADAMW, 5, OPS(p, sp[i].grad, mo, vo, ns), 0, NULL);
      xm_ir_op_set_bool(a->m, ad, "decay", p->type.rank >= 2);
      if (sp[i].zero) set_group(a, ad, sp[i].zero);
    }
    /* The ZeRO-1 gathers after every update: the adamw ops stay one block,
     * which codegen runs as one multi-tensor launch. */
    for (int i = 0; i < ng; i++) {
      if (!sp[i].zero) continue;
      a->src = sp[i].param;
      xm_ir_op_t *ga = emit(a, XM_OP_ZERO_GATHER, 1, OPS(sp[i].param->results[0]), 0, NULL);
      set_group(a, ga, sp[i].zero);
    }
    for (int i = 0; i < ng; i++) {
      xm_ir_value_t *g = a->state[sp[i].param->results[0]->id];
      a->src = g->def;
      emit(a, XM_OP_ZERO, 1, OPS(g), 0, NULL);
    }
  }
  free(sp);
  const xm_ir_attr_t *lr = NULL;
  for (int i = 0; i < xm_ir_module_num_attrs(a->m); i++)
    if (strcmp(xm_ir_module_attr(a->m, i)->key, "load_reduce") == 0)
      lr = xm_ir_module_attr(a->m, i);
  for (int i = 0; i < num_af; i++) {
    a->src = af[i].src;
    if (lr && lr->kind == XM_ATTR_STRING) each_group(a, lr->s, NULL, reduce_state_in, af[i].load);
    xm_ir_op_t *up = emit(a, XM_OP_AUX_FREE_UPDATE, 2, OPS(af[i].bias, af[i].load), 0, NULL);
    xm_ir_op_set_float(a->m, up, "gamma", gamma);
    emit(a, XM_OP_ZERO, 1, OPS(af[i].load), 0, NULL);
  }
}

/* ---- options and entry ------------------------------------------------- */

static xm_status_t parse_int_option(const xm_pass_options_t *o, const char *key, int64_t dflt,
                                    xm_diag_t *diag, int64_t *out) {
  const char *v = xm_pass_option(o, key);
  *out = dflt;
  if (!v) return XM_OK;
  char *end = NULL;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (errno || end == v || *end || x < 1 || x > (1 << 24)) {
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL,
                "option '%s' must be an integer in [1, %d], not '%s'", key, 1 << 24, v);
    return XM_ERR_INVALID_INPUT;
  }
  *out = x;
  return XM_OK;
}

static xm_status_t parse_gamma_option(const xm_pass_options_t *o, double dflt, xm_diag_t *diag,
                                      double *out) {
  const char *v = xm_pass_option(o, "aux-free-gamma");
  *out = dflt;
  if (!v) return XM_OK;
  char *end = NULL;
  errno = 0;
  double x = strtod(v, &end);
  if (errno || end == v || *end || !isfinite(x) || x < 0) {
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL,
                "option 'aux-free-gamma' must be a finite number >= 0, not '%s'", v);
    return XM_ERR_INVALID_INPUT;
  }
  *out = x;
  return XM_OK;
}

static const xm_ir_attr_t *module_attr(const xm_ir_module_t *m, const char *key) {
  for (int i = 0; i < xm_ir_module_num_attrs(m); i++)
    if (strcmp(xm_ir_module_attr(m, i)->key, key) == 0) return xm_ir_module_attr(m, i);
  return NULL;
}

/* grad-accum: the option, else module attr "grad_accum", else 1;
 * aux-free-gamma: the option, else module attr "aux_free_gamma", else 0. */
static xm_status_t read_settings(const xm_ir_module_t *m, const xm_pass_options_t *o,
                                 xm_diag_t *diag, int64_t *out_accum, double *out_gamma) {
  int64_t accum = 1;
  const xm_ir_attr_t *ga = module_attr(m, "grad_accum");
  if (ga && (ga->kind != XM_ATTR_INT || ga->i < 1)) {
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL,
                "module attribute 'grad_accum' must be an integer >= 1");
    return XM_ERR_INVALID_INPUT;
  }
  if (ga) accum = ga->i;
  double gamma = 0;
  const xm_ir_attr_t *gm = module_attr(m, "aux_free_gamma");
  if (gm && gm->kind == XM_ATTR_FLOAT && isfinite(gm->f) && gm->f >= 0) gamma = gm->f;
  if (gm && gm->kind == XM_ATTR_INT && gm->i >= 0) gamma = (double)gm->i;
  XM_RETURN_IF_ERROR(parse_int_option(o, "grad-accum", accum, diag, out_accum));
  return parse_gamma_option(o, gamma, diag, out_gamma);
}

/* The input must be a verified forward graph ending in return(loss, ...). */
static xm_status_t check_input(xm_ir_module_t *m, xm_diag_t *diag) {
  XM_RETURN_IF_ERROR(xm_ir_verify(m, diag));
  int n = xm_ir_module_num_ops(m);
  const xm_ir_op_t *ret = n > 0 ? xm_ir_module_op(m, n - 1) : NULL;
  if (!ret || ret->code != XM_OP_RETURN) {
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL,
                "the module has no return op (it needs return(loss, ...))");
    return XM_ERR_INVALID_INPUT;
  }
  if (!is_float(ret->operands[0]->type.dtype)) {
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, ret->loc[0] ? ret->loc : NULL,
                "the loss (operand 0 of return) must be a float scalar");
    return XM_ERR_INVALID_INPUT;
  }
  for (int i = 0; i < n; i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    bool train_op = op->code >= XM_OP_MATMUL_DX && op->code <= XM_OP_ZERO;
    if (train_op || xm_ir_op_attr(op, "phase")) {
      xm_diag_add(diag, XM_DIAG_ERROR, NULL, op->loc[0] ? op->loc : NULL,
                  "op %d (%s) shows the module is already differentiated "
                  "(autodiff runs once, on the forward graph)",
                  i, xm_ir_opinfo(op->code)->name);
      return XM_ERR_INVALID_INPUT;
    }
  }
  return XM_OK;
}

static xm_status_t autodiff_run(xm_ir_module_t *m, const xm_pass_options_t *options,
                                xm_diag_t *diag, bool *out_changed) {
  int64_t grad_accum = 1;
  double gamma = 0;
  XM_RETURN_IF_ERROR(read_settings(m, options, diag, &grad_accum, &gamma));
  XM_RETURN_IF_ERROR(check_input(m, diag));
  int n = xm_ir_module_num_ops(m);
  ad_t a = {.m = m, .diag = diag, .num_fwd = n - 1, .num_vals = xm_ir_module_num_values(m)};
  const xm_ir_attr_t *pa;
  a.dp = (pa = module_attr(m, "par_dp")) && pa->kind == XM_ATTR_INT && pa->i > 0 ? pa->i : 1;
  a.tp = (pa = module_attr(m, "par_tp")) && pa->kind == XM_ATTR_INT && pa->i > 0 ? pa->i : 1;
  a.ep = (pa = module_attr(m, "par_ep")) && pa->kind == XM_ATTR_INT && pa->i > 0 ? pa->i : 1;
  a.rpn = (pa = module_attr(m, "par_rpn")) && pa->kind == XM_ATTR_INT && pa->i > 0 ? pa->i : 0;
  size_t nv = (size_t)a.num_vals + 1;
  a.needs = calloc(nv, sizeof *a.needs);
  a.grad = calloc(nv, sizeof *a.grad);
  a.state = calloc(nv, sizeof *a.state);
  aux_free_t *af = calloc((size_t)n, sizeof *af);
  xm_status_t st = a.needs && a.grad && a.state && af ? XM_OK : XM_ERR_NO_MEMORY;
  xm_ir_op_t *ret = xm_ir_module_op(m, n - 1);
  if (st == XM_OK) {
    for (int i = 0; i < n; i++)
      xm_ir_op_set_string(m, xm_ir_module_op(m, i), "phase", "fwd");
    compute_needs(&a);
    a.phase = "bwd";
    st = backward(&a, ret, grad_accum);
  }
  if (st == XM_OK) {
    int num_af = gamma > 0 ? emit_loads(&a, af) : 0;
    emit_step(&a, af, num_af, gamma);
    xm_ir_module_move_op(m, n - 1, xm_ir_module_num_ops(m) - 1);
    xm_ir_attr_t attr = {.key = "grad_accum", .kind = XM_ATTR_INT, .i = grad_accum};
    xm_ir_module_set_attr(m, &attr);
    *out_changed = true;
  }
  free(a.needs);
  free(a.grad);
  free(a.state);
  free(af);
  return st;
}

static const char *const k_options[] = {"grad-accum", "aux-free-gamma", NULL};

const xm_pass_info_t xm_pass_autodiff = {
    .name = "autodiff",
    .summary = "backward graph, gradient accumulation and the AdamW step",
    .option_names = k_options,
    .run = autodiff_run,
};
