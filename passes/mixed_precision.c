/* passes/mixed_precision.c — bf16 mixed precision (docs/design.md, Mixed
 * precision), after autodiff, on the whole forward + backward graph.
 *
 * Option dtype=f32 (the default) leaves the module as it is; dtype=bf16
 * gives every GEMM bf16 operands and f32 accumulation, as Megatron-LM and
 * DeepSpeed train in bf16 with fp32 master weights:
 *
 *   - each float operand of a dense or grouped GEMM (forward, input
 *     gradient, weight gradient) is read in bf16: a cast to bf16 is placed
 *     before the first GEMM that reads the value, and every GEMM reading it
 *     shares that cast. A weight is cast once per micro-batch (its bf16
 *     copy lives from the forward GEMM to the last backward GEMM that
 *     reads it); an activation kept for its weight gradient is kept in
 *     bf16 only, which is where the activation memory goes;
 *   - forward and input-gradient GEMMs write bf16; where their result
 *     feeds anything other than a GEMM (norms, activations, attention,
 *     the router, residual adds, collectives, the loss), a cast back to f32
 *     follows the GEMM, so those ops compute in f32 on bf16-rounded values;
 *   - weight-gradient GEMMs write f32 (ir/ops.def), so the accumulation
 *     into the f32 gradient states, their reduction over ranks, the
 *     gradient norm and AdamW on the f32 master weights and states all
 *     stay f32.
 *
 *   - the fused MoE ops (fuse-permute-gemm) read their token, row and
 *     weight operands in bf16 the same way; their results stay f32, as
 *     their epilogues accumulate in f32 (the combine's weighted sum, the
 *     input gradient's sum over a token's rows). So does the fused loss
 *     (fuse-lm-head): the hidden state and the head's weight in bf16, the
 *     loss, stats and both gradients f32.
 *
 * Every bf16 GEMM gets attr workspace (bytes) for its operands widened in
 * tiles (runtime/abi/bf16.h), which plan-memory places. The module records
 * compute_dtype ("f32" or "bf16") and mixed_casts (casts inserted).
 */
#include <stdlib.h>
#include <string.h>

#include "passes/pass.h"
#include "runtime/abi/bf16.h"

typedef struct {
  xm_ir_module_t *m;
  xm_ir_value_t **cast_of; /* value id -> its bf16 cast (ids of the input module) */
  int num_values;          /* ids below this have a cast_of entry */
  int casts;
} mixed_t;

/* GEMMs whose operands 0 and 1 are the multiplied matrices. */
static bool is_gemm(xm_ir_opcode_t code) {
  switch (code) {
  case XM_OP_MATMUL:
  case XM_OP_MATMUL_DX:
  case XM_OP_MATMUL_DW:
  case XM_OP_GROUPED_MATMUL:
  case XM_OP_GROUPED_MATMUL_DX:
  case XM_OP_GROUPED_MATMUL_DW: return true;
  default: return false;
  }
}

static bool is_weight_grad(xm_ir_opcode_t code) {
  return code == XM_OP_MATMUL_DW || code == XM_OP_GROUPED_MATMUL_DW;
}

/* The fused MoE ops: which operands are multiplied (read in bf16; the
 * routing weights, indices and counts are not), and whether the op has an
 * expert weight the kernel widens. Their results stay f32 (ir/ops.def). */
static int fused_operands(xm_ir_opcode_t code, int *out, bool *widen_w) {
  *widen_w = true;
  switch (code) {
  case XM_OP_GATHER_GROUPED_MATMUL: out[0] = 0, out[1] = 3; return 2;       /* x, w */
  case XM_OP_GROUPED_MATMUL_COMBINE: out[0] = 0, out[1] = 1; return 2;      /* h, w */
  case XM_OP_GATHER_GROUPED_MATMUL_DX: out[0] = 0, out[1] = 1; return 2;    /* dy, w */
  case XM_OP_GROUPED_MATMUL_COMBINE_GRAD: out[0] = 0, out[1] = 1, out[2] = 2; return 3;
  case XM_OP_GATHER_GROUPED_MATMUL_DW: *widen_w = false, out[0] = 0, out[1] = 1; return 2;
  case XM_OP_GROUPED_MATMUL_COMBINE_DW: *widen_w = false, out[0] = 0, out[1] = 1; return 2;
  case XM_OP_LM_HEAD_CE: out[0] = 0, out[1] = 1; return 2;      /* x, w */
  case XM_OP_LM_HEAD_CE_GRAD: out[0] = 1, out[1] = 2; return 2; /* x, w */
  default: return 0;
  }
}

/* Operand j of `op` is read in bf16 by a GEMM (dense, grouped or fused). */
static bool gemm_operand(const xm_ir_op_t *op, int j) {
  if (is_gemm(op->code)) return j < 2;
  int pos[3];
  bool w;
  int n = fused_operands(op->code, pos, &w);
  for (int i = 0; i < n; i++)
    if (pos[i] == j) return true;
  return false;
}

/* A cast of `v` to `dt` appended and moved to position `at`, with the
 * phase (and layer) of the op it serves. */
static xm_ir_value_t *cast_at(mixed_t *x, xm_ir_value_t *v, xm_dtype_t dt, int at,
                              const xm_ir_op_t *like) {
  xm_ir_type_t t = v->type;
  t.dtype = dt;
  xm_ir_op_t *op = xm_ir_op_append(x->m, XM_OP_CAST, 1, &v, 1, &t, like->loc);
  XM_ASSERT(op != NULL); /* arena exhaustion, as in the model builder */
  const char *keys[] = {"phase", "layer"};
  for (int k = 0; k < 2; k++) {
    const xm_ir_attr_t *a = xm_ir_op_attr(like, keys[k]);
    if (a) xm_ir_op_set_attr(x->m, op, a);
  }
  xm_ir_module_move_op(x->m, xm_ir_module_num_ops(x->m) - 1, at);
  x->casts++;
  return op->results[0];
}

static int64_t numel(const xm_ir_value_t *v) { return xm_ir_type_numel(&v->type); }

static int64_t last_dim(const xm_ir_value_t *v) { return v->type.dims[v->type.rank - 1]; }

/* Bytes of the op's widened tiles (xm_bf16_gemm_ws_floats). */
static int64_t workspace_bytes(const xm_ir_op_t *op) {
  const xm_ir_value_t *a = op->operands[0], *b = op->operands[1];
  int64_t rows = last_dim(a) > 0 ? numel(a) / last_dim(a) : 0, K, N;
  bool widen = !is_weight_grad(op->code);
  switch (op->code) {
  case XM_OP_MATMUL: K = last_dim(a), N = b->type.dims[0]; break;            /* x, w[N,K] */
  case XM_OP_MATMUL_DX: K = b->type.dims[1], N = b->type.dims[0]; break;     /* dy, w[N,K] */
  case XM_OP_MATMUL_DW: K = last_dim(b), N = last_dim(a); break;             /* dy, x */
  case XM_OP_GROUPED_MATMUL: K = last_dim(a), N = b->type.dims[1]; break;    /* x, w[E,M,K] */
  case XM_OP_GROUPED_MATMUL_DX: K = b->type.dims[2], N = b->type.dims[1]; break;
  default: K = last_dim(b), N = last_dim(a); break; /* grouped dw: dy[n,M], x[n,K] */
  }
  return 4 * xm_bf16_gemm_ws_floats(rows, K, N, widen);
}

/* Operand j of the op at position *i read through its bf16 cast (made
 * before the op unless an earlier GEMM made it); advances *i past it. */
static void cast_operand(mixed_t *x, int *i, xm_ir_op_t *op, int j) {
  xm_ir_value_t *v = op->operands[j];
  if (v->type.dtype != XM_DT_F32) return;
  xm_ir_value_t *c = v->id < x->num_values ? x->cast_of[v->id] : NULL;
  if (!c) {
    c = cast_at(x, v, XM_DT_BF16, *i, op);
    (*i)++;
    if (v->id < x->num_values) x->cast_of[v->id] = c;
  }
  xm_ir_op_set_operand(op, j, c);
}

/* A fused MoE op at position *i: bf16 operands, f32 results, and the
 * workspace its kernel widens them in. */
static void convert_fused(mixed_t *x, int *i) {
  xm_ir_op_t *op = xm_ir_module_op(x->m, *i);
  int pos[3];
  bool widen_w;
  int n = fused_operands(op->code, pos, &widen_w);
  for (int k = 0; k < n; k++)
    cast_operand(x, i, op, pos[k]);
  if (op->code == XM_OP_LM_HEAD_CE || op->code == XM_OP_LM_HEAD_CE_GRAD) {
    const xm_ir_value_t *w = op->operands[pos[1]];
    int64_t rows = xm_ir_type_numel(&op->operands[pos[0]]->type) / w->type.dims[1];
    int64_t ws = xm_bf16_lm_ce_ws_floats(rows, w->type.dims[1], xm_ir_op_get_int(op, "chunk", 1),
                                         op->code == XM_OP_LM_HEAD_CE_GRAD);
    xm_ir_op_set_int(x->m, op, "workspace", 4 * ws);
    return;
  }
  /* K and M: the widths of the rows on each side of the expert GEMM. */
  int64_t K, M;
  const xm_ir_type_t *a = &op->operands[0]->type, *b = &op->operands[1]->type;
  switch (op->code) {
  case XM_OP_GATHER_GROUPED_MATMUL: K = a->dims[1], M = op->operands[3]->type.dims[1]; break;
  case XM_OP_GROUPED_MATMUL_COMBINE: K = a->dims[1], M = b->dims[1]; break;
  case XM_OP_GATHER_GROUPED_MATMUL_DX: M = a->dims[1], K = b->dims[2]; break;
  default: M = a->dims[1], K = b->dims[1]; break; /* dw: dy, x; combine grad / dw: dout, h */
  }
  int64_t ws = xm_bf16_fused_ws_floats(xm_ir_op_get_int(op, "tile_rows", 1),
                                       xm_ir_op_get_int(op, "slots", 1), K, M, widen_w);
  xm_ir_op_set_int(x->m, op, "workspace", 4 * ws);
}

/* The GEMM at position *i: bf16 operands, then its result. Advances *i
 * past the casts it inserts before the op. */
static void convert_gemm(mixed_t *x, int *i) {
  xm_ir_op_t *op = xm_ir_module_op(x->m, *i);
  for (int j = 0; j < 2; j++)
    cast_operand(x, i, op, j);
  xm_ir_op_set_int(x->m, op, "workspace", workspace_bytes(op));
  if (is_weight_grad(op->code)) return;
  /* The result in bf16; the uses that are not a GEMM's matrix operands
   * read it back in f32 from one cast right after the op. */
  xm_ir_value_t *r = op->results[0];
  r->type.dtype = XM_DT_BF16;
  xm_ir_value_t *back = NULL;
  int n = xm_ir_module_num_ops(x->m);
  for (int u = *i + 1; u < n; u++) {
    xm_ir_op_t *user = xm_ir_module_op(x->m, u);
    if (user->code == XM_OP_CAST && user->operands[0] == r) continue;
    for (int j = 0; j < user->num_operands; j++) {
      if (user->operands[j] != r || gemm_operand(user, j)) continue;
      if (!back) { /* inserted at *i + 1: this user moves to u + 1 */
        back = cast_at(x, r, XM_DT_F32, *i + 1, op);
        n++;
        u++;
      }
      xm_ir_op_set_operand(user, j, back);
    }
  }
}

static xm_status_t mixed_run(xm_ir_module_t *m, const xm_pass_options_t *options,
                             xm_diag_t *diag, bool *out_changed) {
  const char *dtype = xm_pass_option(options, "dtype");
  if (dtype && strcmp(dtype, "f32") != 0 && strcmp(dtype, "bf16") != 0) {
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL,
                "mixed-precision: option dtype is \"%s\"; expected f32 or bf16", dtype);
    return XM_ERR_INVALID_INPUT;
  }
  bool bf16 = dtype && strcmp(dtype, "bf16") == 0;
  xm_ir_attr_t a = {.key = "compute_dtype", .kind = XM_ATTR_STRING, .s = bf16 ? "bf16" : "f32"};
  xm_ir_module_set_attr(m, &a);
  if (!bf16) {
    xm_ir_module_set_int(m, "mixed_casts", 0);
    return XM_OK;
  }
  mixed_t x = {m, NULL, xm_ir_module_num_values(m), 0};
  x.cast_of = calloc((size_t)x.num_values + 1, sizeof *x.cast_of);
  if (!x.cast_of) return XM_ERR_NO_MEMORY;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    xm_ir_opcode_t code = xm_ir_module_op(m, i)->code;
    int pos[3];
    bool w;
    if (is_gemm(code))
      convert_gemm(&x, &i);
    else if (fused_operands(code, pos, &w) > 0)
      convert_fused(&x, &i);
  }
  free(x.cast_of);
  xm_ir_module_set_int(m, "mixed_casts", x.casts);
  *out_changed = x.casts > 0;
  return XM_OK;
}

static const char *const k_options[] = {"dtype", NULL};

const xm_pass_info_t xm_pass_mixed_precision = {
    .name = "mixed-precision",
    .summary = "bf16 GEMM operands with f32 accumulation; f32 master weights, gradients and "
               "optimizer (dtype f32 or bf16)",
    .option_names = k_options,
    .run = mixed_run,
};
