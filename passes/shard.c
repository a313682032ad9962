/* passes/shard.c — the "shard" pass: the global forward graph becomes the
 * graph one rank runs (SPMD), with the collectives of its parallel layout
 * (docs/design.md; docs/parallelism.md has the groups and the rules).
 *
 * Options: dp, tp, ep (integers), ssmb, rbd, zero (0|1 or true|false),
 * ranks-per-node (0 = unknown), dispatch-bound (integer >= 1, default 4). The layout must be legal for the model
 * (frontend/layout.c decides that before compile lowers anything); the pass
 * checks what it relies on and refuses the rest.
 *
 * It runs on the forward graph, before autodiff, and only inserts forward
 * collectives; autodiff knows the adjoint of each (replicate <-> all_reduce,
 * narrow <-> all_gather, all_to_all mirrored, sort_chunks <-> unsort_chunks,
 * rbd_dispatch/rbd_combine and their gradients), so the backward graph comes
 * out sharded by construction. What it does, in one walk over the ops:
 *
 *  - Data parallelism needs no rewrite of the graph: every rank's graph is a
 *    micro-batch of micro_batch sequences; the module records par_dp so
 *    autodiff seeds dloss = 1/(grad_accum*dp) and sums gradients over dp.
 *  - Tensor parallelism (Megatron): q/k/v projections (and their biases),
 *    dense gate/up projections and, without SSMB, the shared experts' gate/up
 *    (roles tp_column, shared_column) are split by output rows
 *    (column-parallel: the input goes through replicate, Megatron's f);
 *    o_proj and the down projections (tp_row, shared_row) by input columns
 *    (row-parallel: the partial product goes through all_reduce, Megatron's
 *    g). Attention runs on heads/tp local heads. MLA's low-rank projections
 *    and their norms are replicated; its q_b_proj and kv_b_proj are
 *    column-parallel, and the rotary key shared by all heads enters the
 *    local heads' concat through replicate. Shapes between
 *    the two are derived again from the operands; a reshape maps the split
 *    dim by matching the unsplit leading product.
 *  - SSMB: the router runs on all T tokens of the TP group (it is a
 *    [T,H]x[H,E] product; running it whole keeps the aux loss and the
 *    aux-free load exactly the 1-rank values), then the tokens, expert ids
 *    and weights are narrowed to this rank's T/tp slice, the dispatch,
 *    experts, shared experts (and their gate) and combine run on the slice,
 *    and the block's output is all_gathered back before it leaves the
 *    block.
 *  - The shared-expert gate (role shared_gate, Qwen2-MoE) is whole on
 *    every rank. Without SSMB it reads the replicated tokens directly (no
 *    replicate: every TP rank computes the same gate and the same input
 *    gradient) and multiplies the shared output after its row-parallel
 *    all_reduce, so it gates the fully reduced sum.
 *  - Expert parallelism: expert weights [E,...] become [E/ep,...]
 *    (expert e on EP rank e / (E/ep)). After the padding-free gather, the
 *    per-expert counts are exchanged (exchange_counts), the rows go through a
 *    padding-free all_to_all and are regrouped by local expert
 *    (sort_chunks); the grouped GEMMs use the local counts; the way back is
 *    unsort_chunks and the mirrored all_to_all before the weighted combine.
 *    The receive buffers hold min(ep, dispatch-bound) times the rows a rank
 *    sends (option dispatch-bound, default 4): exact up to ep 4; beyond, a
 *    rank receiving more than that stops every rank with the observed size.
 *  - RBD, when the EP group spans nodes: the gather / all_to_all pair
 *    is replaced by rbd_dispatch (pilot rows per (token, node), replicas in
 *    the node) and the combine by rbd_combine (pre-reduced per rank and per
 *    node); both run in the runtime (runtime/moe/rbd_exec.h).
 *
 * Which of these a param gets is its attr role (ir/roles.def), set by the
 * model builder; the pass never looks at a param's name, and a param
 * without a known role is refused at its location: placing it by guess
 * could train something other than the one-rank graph. Every param gets
 * attrs for the later stages: split_group/split_dim when it is a slice;
 * reduce, the groups its gradient is summed over (dense: dp;
 * slice-computed but replicated params such as shared experts and their
 * gate under SSMB and q/k head norms under TP: dp,tp; experts: edp);
 * zero_group with ZeRO-1 (dp, or edp for experts). The module gets par_*
 * ints and load_reduce (the groups the aux-free load counts are summed
 * over). Group names are those of runtime/abi/groups.def
 * (xm_group_kind_name).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/layout.h"
#include "ir/verify.h"
#include "passes/pass.h"
#include "runtime/abi/groups.h"

typedef struct {
  xm_ir_value_t *sc, *rc, *ltpe; /* send / recv counts [P,L], local tokens per expert */
  xm_ir_value_t *weights;        /* the (narrowed) routing weights */
  xm_ir_type_t rows;             /* type of the gathered rows [N,H] */
} moe_t;

typedef struct {
  xm_ir_module_t *m;
  xm_diag_t *diag;
  int64_t dp, tp, ep, rpn, zero;
  int64_t dispatch_bound; /* receive buffers hold min(ep, this) x the rows sent */
  bool ssmb, rbd;
  int orig_values;        /* values with ids below existed before the pass */
  int *tp_dim;            /* value id -> dim split over tp, or -1 */
  bool *sp;               /* value id -> dim 0 is this rank's SSMB token slice */
  xm_ir_value_t **repl;   /* value id -> its replicate over tp */
  moe_t *moe;             /* value id of a permute's indices -> the layer's EP plumbing */
  int cap;                /* room of the arrays above */
  int slot;               /* next RBD routing-record slot */
  xm_ir_op_t **dead;      /* ops RBD replaced: removed after the walk */
  int num_dead;
  xm_status_t st;
} sh_t;

/* ---- small helpers ------------------------------------------------------- */

static bool grow(sh_t *s) {
  int need = xm_ir_module_num_values(s->m) + 1;
  if (need <= s->cap) return true;
  int cap = need * 2;
  int *td = realloc(s->tp_dim, (size_t)cap * sizeof *td);
  if (td) s->tp_dim = td;
  bool *sp = realloc(s->sp, (size_t)cap * sizeof *sp);
  if (sp) s->sp = sp;
  xm_ir_value_t **r = realloc(s->repl, (size_t)cap * sizeof *r);
  if (r) s->repl = r;
  moe_t *mo = realloc(s->moe, (size_t)cap * sizeof *mo);
  if (mo) s->moe = mo;
  if (!td || !sp || !r || !mo) return false;
  for (int i = s->cap; i < cap; i++) {
    s->tp_dim[i] = -1;
    s->sp[i] = false;
    s->repl[i] = NULL;
    memset(&s->moe[i], 0, sizeof s->moe[i]);
  }
  s->cap = cap;
  return true;
}

static int64_t group_size(const sh_t *s, xm_group_kind_t g) {
  xm_layout_t l = {.dp = s->dp, .tp = s->tp, .ep = s->ep, .ranks_per_node = s->rpn};
  return xm_layout_group_size(&l, g);
}

static void set_group(sh_t *s, xm_ir_op_t *op, xm_group_kind_t g) {
  xm_ir_op_set_string(s->m, op, "group", xm_group_kind_name(g));
  xm_ir_op_set_int(s->m, op, "group_size", group_size(s, g));
}

/* The attr traffic of an all_to_all: the phase its bytes count in. */
static void set_traffic(sh_t *s, xm_ir_op_t *op, xm_rt_phase_t phase) {
  xm_ir_op_set_string(s->m, op, "traffic", xm_rt_phase_kind_name(phase));
}

/* Appends an op like `near` (loc, layer) and moves it to position pos. */
static xm_ir_op_t *insert_at(sh_t *s, int pos, const xm_ir_op_t *near, xm_ir_opcode_t code,
                             int nops, xm_ir_value_t *const *ops, int nres,
                             const xm_ir_type_t *types) {
  xm_ir_op_t *op = xm_ir_op_append(s->m, code, nops, ops, nres, types, near->loc);
  XM_ASSERT(op != NULL);
  const xm_ir_attr_t *layer = xm_ir_op_attr(near, "layer");
  if (layer) xm_ir_op_set_attr(s->m, op, layer);
  xm_ir_module_move_op(s->m, xm_ir_module_num_ops(s->m) - 1, pos);
  if (!grow(s)) s->st = XM_ERR_NO_MEMORY;
  return op;
}

#define OPS(...)                                                                                   \
  (xm_ir_value_t *[]) { __VA_ARGS__ }
#define NOPS(...) ((int)(sizeof(OPS(__VA_ARGS__)) / sizeof(xm_ir_value_t *)))
#define INSERT1(s, pos, near, code, type, ...)                                                     \
  insert_at(s, pos, near, code, NOPS(__VA_ARGS__), OPS(__VA_ARGS__), 1, (xm_ir_type_t[]){type})

/* Points every use of `from` in ops at positions >= pos to `to`, except
 * the uses by `except` (NULL: none) and, when only_code >= 0, uses by ops
 * of other kinds. */
static void redirect(sh_t *s, int pos, xm_ir_value_t *from, xm_ir_value_t *to,
                     const xm_ir_op_t *except, int only_code) {
  for (int i = pos; i < xm_ir_module_num_ops(s->m); i++) {
    xm_ir_op_t *op = xm_ir_module_op(s->m, i);
    if (op == except || (only_code >= 0 && (int)op->code != only_code)) continue;
    for (int j = 0; j < op->num_operands; j++)
      if (op->operands[j] == from) xm_ir_op_set_operand(op, j, to);
  }
}

/* ---- parameters ---------------------------------------------------------- */

/* Splits a param's dim `dim` over group g (tp or ep) of `parts` members. */
static void split_param(sh_t *s, xm_ir_op_t *op, xm_group_kind_t g, int dim, int64_t parts) {
  xm_ir_value_t *v = op->results[0];
  if (parts <= 1) return;
  if (dim >= v->type.rank || v->type.dims[dim] % parts != 0) {
    xm_diag_add(s->diag, XM_DIAG_ERROR, NULL, op->loc[0] ? op->loc : NULL,
                "param %s: dim %d (%lld) cannot be split %lld ways over %s",
                xm_ir_op_get_string(op, "name", "?"), dim,
                (long long)(dim < v->type.rank ? v->type.dims[dim] : 0), (long long)parts,
                xm_group_kind_name(g));
    s->st = XM_ERR_INVALID_INPUT;
    return;
  }
  v->type.dims[dim] /= parts;
  v->type.shard[dim] = g == XM_GROUP_TP ? XM_AXIS_TP : XM_AXIS_EP;
  xm_ir_op_set_string(s->m, op, "split_group", xm_group_kind_name(g));
  xm_ir_op_set_int(s->m, op, "split_dim", dim);
  if (g == XM_GROUP_TP) s->tp_dim[v->id] = dim;
}

/* "dp,tp" without the groups of size 1. */
static void reduce_list(const sh_t *s, const xm_group_kind_t *groups, int n, char *buf,
                        size_t cap) {
  buf[0] = '\0';
  for (int i = 0; i < n; i++) {
    if (group_size(s, groups[i]) <= 1) continue;
    size_t len = strlen(buf);
    snprintf(buf + len, cap - len, "%s%s", len ? "," : "", xm_group_kind_name(groups[i]));
  }
}

/* Every param has a known attr role, or each one that has not is reported
 * at its location (before anything is rewritten). */
static bool check_roles(const xm_ir_module_t *m, xm_diag_t *diag) {
  bool ok = true;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    xm_ir_role_t role;
    if (op->code != XM_OP_PARAM) continue;
    const char *role_name = xm_ir_op_get_string(op, "role", NULL);
    if (xm_ir_role_from_name(role_name, &role)) continue;
    const char *name = xm_ir_op_get_string(op, "name", "?");
    const char *loc = op->loc[0] ? op->loc : NULL;
    if (role_name) {
      char known[160] = "";
      for (int r = 0; r < XM_ROLE_COUNT_; r++) {
        size_t len = strlen(known);
        snprintf(known + len, sizeof known - len, "%s%s", r ? ", " : "",
                 xm_ir_role_name((xm_ir_role_t)r));
      }
      xm_diag_add(diag, XM_DIAG_ERROR, NULL, loc,
                  "shard: op %d (param %s) has role \"%s\", which is none of %s (ir/roles.def)",
                  i, name, role_name, known);
    } else {
      xm_diag_add(diag, XM_DIAG_ERROR, NULL, loc,
                  "shard: op %d (param %s) has no attr role: the pass places every param by "
                  "its role (ir/roles.def), which the model builder sets",
                  i, name);
    }
    ok = false;
  }
  return ok;
}

static void shard_param(sh_t *s, xm_ir_op_t *op) {
  xm_ir_role_t role = XM_ROLE_REPLICATED;
  bool known = xm_ir_role_from_name(xm_ir_op_get_string(op, "role", NULL), &role);
  XM_ASSERT(known); /* check_roles ran */
  xm_group_kind_t groups[2] = {XM_GROUP_DP, XM_GROUP_DP};
  int ng = 1;
  xm_group_kind_t zero = XM_GROUP_DP;

  switch (role) {
  case XM_ROLE_REPLICATED: break;
  case XM_ROLE_TP_COLUMN: split_param(s, op, XM_GROUP_TP, 0, s->tp); break;
  case XM_ROLE_TP_ROW: split_param(s, op, XM_GROUP_TP, 1, s->tp); break;
  case XM_ROLE_TP_PARTIAL:
    groups[ng++] = XM_GROUP_TP; /* applied to this rank's heads only: partial gradient */
    break;
  case XM_ROLE_EXPERT:
    split_param(s, op, XM_GROUP_EP, 0, s->ep);
    if (s->ssmb || s->tp == 1) {
      groups[0] = XM_GROUP_EDP; /* token-parallel ranks with the same experts */
      zero = XM_GROUP_EDP;
    }
    break;
  case XM_ROLE_SHARED_COLUMN:
  case XM_ROLE_SHARED_ROW:
    if (s->ssmb) /* runs whole on this rank's token slice */
      groups[ng++] = XM_GROUP_TP;
    else
      split_param(s, op, XM_GROUP_TP, role == XM_ROLE_SHARED_COLUMN ? 0 : 1, s->tp);
    break;
  case XM_ROLE_SHARED_GATE:
    /* Never split: its one row reads the whole hidden state. Without SSMB
     * every TP rank gates all T tokens (the same gradient on each); with
     * SSMB it gates the rank's slice, so its gradient is a partial sum. */
    if (s->ssmb) groups[ng++] = XM_GROUP_TP;
    break;
  default: XM_ASSERT(!"role without a placement"); break;
  }
  char buf[64];
  reduce_list(s, groups, ng, buf, sizeof buf);
  if (buf[0]) xm_ir_op_set_string(s->m, op, "reduce", buf);
  if (s->zero && group_size(s, zero) > 1 && xm_ir_op_get_bool(op, "trainable", true))
    xm_ir_op_set_string(s->m, op, "zero_group", xm_group_kind_name(zero));
}

/* ---- types --------------------------------------------------------------- */

/* The result type of a reshape whose input lost a factor tp on dim d. */
static bool reshape_type(sh_t *s, xm_ir_op_t *op) {
  xm_ir_value_t *x = op->operands[0], *y = op->results[0];
  int64_t want = xm_ir_type_numel(&x->type), have = xm_ir_type_numel(&y->type);
  int d = s->tp_dim[x->id];
  if (want == have) {
    /* Same count: keep the split where the leading product matches. */
    if (d < 0) return true;
  } else if (d < 0 || have != want * s->tp) {
    return false;
  }
  int64_t prefix = 1;
  for (int i = 0; i < d; i++)
    prefix *= x->type.dims[i];
  int64_t p = 1;
  for (int j = 0; j < y->type.rank; j++) {
    if (p == prefix) {
      if (want != have) {
        if (y->type.dims[j] % s->tp != 0) return false;
        y->type.dims[j] /= s->tp;
      }
      y->type.shard[j] = XM_AXIS_TP;
      s->tp_dim[y->id] = j;
      return true;
    }
    p *= y->type.dims[j];
  }
  return false;
}

/* Derives the op's result types again from its (possibly sharded)
 * operands, and carries the tp / sp marks. */
static void retype(sh_t *s, xm_ir_op_t *op) {
  if (op->num_results == 0 || op->code == XM_OP_PARAM || op->code == XM_OP_INPUT ||
      op->code == XM_OP_CONSTANT)
    return;
  if (op->code == XM_OP_RESHAPE) {
    if (!reshape_type(s, op)) {
      xm_diag_add(s->diag, XM_DIAG_ERROR, NULL, op->loc[0] ? op->loc : NULL,
                  "reshape %%%d: cannot map the tensor-parallel split of its operand",
                  op->results[0]->id);
      s->st = XM_ERR_UNSUPPORTED;
    }
    return;
  }
  xm_ir_type_t out[4];
  XM_ASSERT(op->num_results <= 4);
  for (int r = 0; r < op->num_results; r++)
    out[r] = op->results[r]->type;
  if (xm_ir_infer_types(op, s->diag, out) != XM_OK) {
    s->st = XM_ERR_INVALID_INPUT;
    return;
  }
  xm_ir_value_t *x0 = op->num_operands > 0 ? op->operands[0] : NULL;
  for (int r = 0; r < op->num_results; r++) {
    xm_ir_value_t *v = op->results[r];
    for (int i = 0; i < out[r].rank; i++)
      out[r].shard[i] = XM_AXIS_NONE;
    /* bounds of routed rows follow the operands; keep a larger own bound */
    v->type = out[r];
    int d = -1;
    if (op->code == XM_OP_MATMUL) {
      if (s->tp_dim[op->operands[1]->id] == 0) d = v->type.rank - 1;
    } else if (x0 && s->tp_dim[x0->id] >= 0 && v->type.rank == x0->type.rank) {
      int dx = s->tp_dim[x0->id];
      if (v->type.dims[dx] == x0->type.dims[dx]) d = dx;
    }
    s->tp_dim[v->id] = d;
    if (d >= 0) v->type.shard[d] = XM_AXIS_TP;
    bool sp = false;
    bool moves_rows = op->code == XM_OP_GATHER_ROWS || op->code == XM_OP_PERMUTE ||
                      op->code == XM_OP_ALL_TO_ALL || op->code == XM_OP_RBD_DISPATCH;
    for (int j = 0; j < op->num_operands && !moves_rows && !sp; j++) {
      xm_ir_value_t *o = op->operands[j];
      sp = s->sp[o->id] && v->type.rank > 0 && o->type.rank > 0 &&
           v->type.dims[0] == o->type.dims[0];
    }
    s->sp[v->id] = sp;
    if (sp) v->type.shard[0] = XM_AXIS_SP;
  }
}

/* ---- tensor parallelism -------------------------------------------------- */

/* The replicate of x over tp, made once right after x is defined... or
 * right before the first user at position *pos. */
static xm_ir_value_t *replicated(sh_t *s, int *pos, xm_ir_op_t *user, xm_ir_value_t *x) {
  if (s->repl[x->id]) return s->repl[x->id];
  xm_ir_op_t *r = INSERT1(s, *pos, user, XM_OP_REPLICATE, x->type, x);
  set_group(s, r, XM_GROUP_TP);
  (*pos)++;
  s->repl[x->id] = r->results[0];
  s->tp_dim[r->results[0]->id] = -1;
  return r->results[0];
}

/* ---- SSMB ---------------------------------------------------------------- */

static xm_ir_value_t *narrow_after(sh_t *s, int pos, xm_ir_op_t *near, xm_ir_value_t *x) {
  xm_ir_type_t t = x->type;
  t.dims[0] /= s->tp;
  t.shard[0] = XM_AXIS_SP;
  xm_ir_op_t *n = INSERT1(s, pos, near, XM_OP_NARROW, t, x);
  set_group(s, n, XM_GROUP_TP);
  xm_ir_op_set_int(s->m, n, "dim", 0);
  s->sp[n->results[0]->id] = true;
  return n->results[0];
}

/* After a topk_route at *pos: this rank's slice of the tokens, expert ids
 * and weights; the rest of the block uses the slices. The router matmul
 * (before) and the aux loss keep the whole batch. */
static void ssmb_slice(sh_t *s, int *pos, xm_ir_op_t *topk) {
  xm_ir_value_t *scores = topk->operands[0];
  xm_ir_op_t *score_op = scores->def, *logits_op;
  if (!score_op || score_op->code != XM_OP_ROUTER_SCORE ||
      !(logits_op = score_op->operands[0]->def) || logits_op->code != XM_OP_MATMUL) {
    xm_diag_add(s->diag, XM_DIAG_ERROR, NULL, topk->loc[0] ? topk->loc : NULL,
                "ssmb: the router of this MoE block is not matmul -> router_score -> topk_route");
    s->st = XM_ERR_UNSUPPORTED;
    return;
  }
  xm_ir_value_t *t = logits_op->operands[0];
  if (t->def && t->def->code == XM_OP_REPLICATE) t = t->def->operands[0];
  int at = *pos + 1;
  xm_ir_value_t *tn = narrow_after(s, at++, topk, t);
  xm_ir_value_t *en = narrow_after(s, at++, topk, topk->results[0]);
  xm_ir_value_t *wn = narrow_after(s, at++, topk, topk->results[1]);
  redirect(s, at, t, tn, NULL, -1);
  redirect(s, at, topk->results[0], en, NULL, XM_OP_PERMUTE);
  redirect(s, at, topk->results[1], wn, NULL, XM_OP_PERMUTE);
  redirect(s, at, topk->results[1], wn, NULL, XM_OP_SCATTER_COMBINE);
  *pos = at - 1;
}

/* ---- expert parallelism ---------------------------------------------------- */

static xm_ir_type_t i32_type(int rank, const int64_t *dims) {
  return xm_ir_type_make(XM_DT_I32, rank, dims);
}

/* After the gather at *pos: counts exchange, all_to_all, regroup by local
 * expert; the experts use the received rows and the local counts. */
static void ep_dispatch(sh_t *s, int *pos, xm_ir_op_t *gather) {
  xm_ir_value_t *xs = gather->results[0], *idx = gather->operands[1];
  xm_ir_op_t *perm = idx->def;
  XM_ASSERT(perm && perm->code == XM_OP_PERMUTE);
  xm_ir_value_t *tpe = perm->results[2];
  int64_t E = tpe->type.dims[0], P = s->ep, L = E / P;
  moe_t *mo = &s->moe[idx->id];
  mo->rows = xs->type;
  mo->weights = perm->operands[1];
  int at = *pos + 1;
  xm_ir_type_t rows = xs->type;
  /* Every member could send all its rows here: ep x the rows sent is the
   * exact worst case; the plan reserves min(ep, dispatch-bound) times them
   * and a routing beyond that stops every rank with the observed size. */
  rows.dims[0] *= P < s->dispatch_bound ? P : s->dispatch_bound;
  rows.dynamic[0] = true;

  if (s->rbd) {
    xm_ir_type_t rt[2] = {rows, i32_type(1, (int64_t[]){L})};
    xm_ir_op_t *d = insert_at(s, at++, gather, XM_OP_RBD_DISPATCH, 3,
                              OPS(gather->operands[0], perm->operands[0], perm->operands[1]), 2, rt);
    set_group(s, d, XM_GROUP_EP);
    xm_ir_op_set_int(s->m, d, "num_experts", E);
    xm_ir_op_set_int(s->m, d, "slot", s->slot++);
    mo->ltpe = d->results[1];
    redirect(s, at, xs, d->results[0], NULL, -1);
    redirect(s, at, tpe, mo->ltpe, NULL, XM_OP_GROUPED_MATMUL);
    s->dead[s->num_dead++] = gather;
    *pos = at - 1;
    return;
  }
  xm_ir_value_t *sc = INSERT1(s, at++, gather, XM_OP_RESHAPE, i32_type(2, (int64_t[]){P, L}), tpe)
                          ->results[0];
  xm_ir_type_t ct[2] = {i32_type(2, (int64_t[]){P, L}), i32_type(1, (int64_t[]){L})};
  xm_ir_op_t *ex = insert_at(s, at++, gather, XM_OP_EXCHANGE_COUNTS, 1, OPS(sc), 2, ct);
  set_group(s, ex, XM_GROUP_EP);
  xm_ir_value_t *rc = ex->results[0];
  xm_ir_op_t *a2a = INSERT1(s, at++, gather, XM_OP_ALL_TO_ALL, rows, xs, sc, rc);
  set_group(s, a2a, XM_GROUP_EP);
  set_traffic(s, a2a, XM_RT_PHASE_DISPATCH);
  xm_ir_op_t *so = INSERT1(s, at++, gather, XM_OP_SORT_CHUNKS, rows, a2a->results[0], rc);
  mo->sc = sc;
  mo->rc = rc;
  mo->ltpe = ex->results[1];
  redirect(s, at, xs, so->results[0], NULL, -1);
  redirect(s, at, tpe, mo->ltpe, NULL, XM_OP_GROUPED_MATMUL);
  *pos = at - 1;
}

/* Before the combine at *pos: back to the source ranks (or rbd_combine). */
static void ep_combine(sh_t *s, int *pos, xm_ir_op_t *comb) {
  xm_ir_value_t *ye = comb->operands[0], *idx = comb->operands[1];
  moe_t *mo = &s->moe[idx->id];
  if (!mo->ltpe) return;
  int at = *pos;
  if (s->rbd) {
    xm_ir_type_t ct = comb->results[0]->type; /* [T,H] of this rank's (sliced) tokens */
    ct.dims[0] = comb->operands[2]->type.dims[0];
    xm_ir_op_t *c = INSERT1(s, at++, comb, XM_OP_RBD_COMBINE, ct, ye, comb->operands[2], mo->ltpe);
    set_group(s, c, XM_GROUP_EP);
    xm_ir_op_t *d = mo->ltpe->def;
    xm_ir_op_set_int(s->m, c, "slot", xm_ir_op_get_int(d, "slot", 0));
    s->sp[c->results[0]->id] = s->sp[comb->operands[2]->id];
    if (s->sp[c->results[0]->id]) c->results[0]->type.shard[0] = XM_AXIS_SP;
    redirect(s, at + 1, comb->results[0], c->results[0], NULL, -1);
    s->dead[s->num_dead++] = comb; /* removed after the walk, with its gather */
    *pos = at;
    return;
  }
  xm_ir_op_t *un = INSERT1(s, at++, comb, XM_OP_UNSORT_CHUNKS, ye->type, ye, mo->rc);
  xm_ir_op_t *back = INSERT1(s, at++, comb, XM_OP_ALL_TO_ALL, mo->rows, un->results[0], mo->rc,
                             mo->sc);
  set_group(s, back, XM_GROUP_EP);
  set_traffic(s, back, XM_RT_PHASE_COMBINE);
  xm_ir_op_set_operand(comb, 0, back->results[0]);
  *pos = at;
}

/* ---- the walk -------------------------------------------------------------- */

static bool is_new(const sh_t *s, const xm_ir_op_t *op) {
  for (int r = 0; r < op->num_results; r++)
    if (op->results[r]->id < s->orig_values) return false;
  return op->num_results > 0;
}

static void visit(sh_t *s, int *pos) {
  xm_ir_op_t *op = xm_ir_module_op(s->m, *pos);
  if (is_new(s, op)) return;
  switch (op->code) {
  case XM_OP_PARAM: shard_param(s, op); return;
  case XM_OP_MATMUL:
    if (s->tp > 1 && s->tp_dim[op->operands[1]->id] == 0)
      xm_ir_op_set_operand(op, 0, replicated(s, pos, op, op->operands[0]));
    break;
  case XM_OP_CONCAT:
    /* A whole operand joined to every local head (MLA's rotary key) enters
     * the tensor-parallel region: its gradient sums over the TP ranks. */
    if (s->tp > 1 && s->tp_dim[op->operands[0]->id] >= 0 && s->tp_dim[op->operands[1]->id] < 0)
      xm_ir_op_set_operand(op, 1, replicated(s, pos, op, op->operands[1]));
    break;
  case XM_OP_RESHAPE:
    if (s->sp[op->operands[0]->id] &&
        xm_ir_type_numel(&op->operands[0]->type) * s->tp ==
            xm_ir_type_numel(&op->results[0]->type)) {
      xm_ir_value_t *x = op->operands[0];
      xm_ir_type_t t = x->type;
      t.dims[0] *= s->tp;
      t.shard[0] = XM_AXIS_NONE;
      xm_ir_op_t *g = INSERT1(s, *pos, op, XM_OP_ALL_GATHER, t, x);
      set_group(s, g, XM_GROUP_TP);
      xm_ir_op_set_int(s->m, g, "dim", 0);
      (*pos)++;
      xm_ir_op_set_operand(op, 0, g->results[0]);
    }
    break;
  case XM_OP_SCATTER_COMBINE:
    if (s->ep > 1) ep_combine(s, pos, op);
    if (s->ep > 1 && s->rbd) return; /* replaced by rbd_combine */
    break;
  case XM_OP_PERMUTE: {
    int64_t cap = xm_ir_op_get_int(op, "capacity", 0);
    int64_t T_old = op->results[0]->type.dims[0];
    retype(s, op);
    /* capacity per expert scales with this rank's share of the tokens */
    int64_t T_new = op->results[0]->type.dims[0];
    if (cap > 0 && T_old > 0 && T_new != T_old)
      xm_ir_op_set_int(s->m, op, "capacity", (cap * T_new + T_old - 1) / T_old);
    return;
  }
  default: break;
  }
  retype(s, op);
  if (s->st != XM_OK) return;
  if (op->code == XM_OP_MATMUL && s->tp > 1 && s->tp_dim[op->operands[1]->id] == 1) {
    xm_ir_value_t *y = op->results[0];
    xm_ir_op_t *ar = INSERT1(s, *pos + 1, op, XM_OP_ALL_REDUCE, y->type, y);
    set_group(s, ar, XM_GROUP_TP);
    redirect(s, *pos + 2, y, ar->results[0], NULL, -1);
    (*pos)++;
  } else if (op->code == XM_OP_TOPK_ROUTE && s->ssmb && s->tp > 1) {
    ssmb_slice(s, pos, op);
  } else if (op->code == XM_OP_GATHER_ROWS && s->ep > 1) {
    ep_dispatch(s, pos, op);
  }
}

/* ---- options and entry ----------------------------------------------------- */

static xm_status_t int_option(const xm_pass_options_t *o, const char *key, int64_t lo, int64_t hi,
                              int64_t dflt, xm_diag_t *diag, int64_t *out) {
  const char *v = xm_pass_option(o, key);
  *out = dflt;
  if (!v) return XM_OK;
  if (strcmp(v, "true") == 0 && hi == 1) v = "1";
  if (strcmp(v, "false") == 0 && hi == 1) v = "0";
  char *end = NULL;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (errno || end == v || *end || x < lo || x > hi) {
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL,
                "shard: option '%s' must be an integer in [%lld, %lld], not '%s'", key,
                (long long)lo, (long long)hi, v);
    return XM_ERR_INVALID_INPUT;
  }
  *out = x;
  return XM_OK;
}

static xm_status_t read_options(sh_t *s, const xm_pass_options_t *o, xm_diag_t *diag) {
  int64_t ssmb = 0, rbd = 0;
  const int64_t big = 1 << 24;
  XM_RETURN_IF_ERROR(int_option(o, "dp", 1, big, 1, diag, &s->dp));
  XM_RETURN_IF_ERROR(int_option(o, "tp", 1, big, 1, diag, &s->tp));
  XM_RETURN_IF_ERROR(int_option(o, "ep", 1, big, 1, diag, &s->ep));
  XM_RETURN_IF_ERROR(int_option(o, "ssmb", 0, 1, 0, diag, &ssmb));
  XM_RETURN_IF_ERROR(int_option(o, "rbd", 0, 1, 0, diag, &rbd));
  XM_RETURN_IF_ERROR(int_option(o, "zero", 0, 1, 0, diag, &s->zero));
  XM_RETURN_IF_ERROR(int_option(o, "ranks-per-node", 0, big, 0, diag, &s->rpn));
  XM_RETURN_IF_ERROR(int_option(o, "dispatch-bound", 1, big, 4, diag, &s->dispatch_bound));
  s->ssmb = ssmb != 0;
  xm_layout_t l = {.dp = s->dp, .tp = s->tp, .ep = s->ep, .ssmb = s->ssmb, .rbd = rbd != 0,
                   .zero = (int)s->zero, .ranks_per_node = s->rpn};
  s->rbd = xm_layout_rbd_active(&l);
  const char *bad = NULL;
  if ((s->dp * s->tp) % s->ep != 0) bad = "ep must divide dp*tp";
  else if (s->ssmb && s->tp == 1) bad = "ssmb needs tp > 1";
  else if (s->ep > 1 && s->tp > 1 && !s->ssmb) bad = "ep > 1 with tp > 1 needs ssmb";
  if (bad) {
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL, "shard: illegal layout: %s", bad);
    return XM_ERR_INVALID_INPUT;
  }
  return XM_OK;
}

static xm_status_t shard_run(xm_ir_module_t *m, const xm_pass_options_t *options,
                             xm_diag_t *diag, bool *out_changed) {
  sh_t s = {.m = m, .diag = diag, .st = XM_OK};
  XM_RETURN_IF_ERROR(read_options(&s, options, diag));
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (xm_ir_op_attr(op, "phase") || op->code >= XM_OP_ALL_REDUCE) {
      xm_diag_add(diag, XM_DIAG_ERROR, NULL, op->loc[0] ? op->loc : NULL,
                  "shard: op %d (%s): the shard pass runs once, on the global forward graph "
                  "(before autodiff)",
                  i, xm_ir_opinfo(op->code)->name);
      return XM_ERR_INVALID_INPUT;
    }
  }
  if (!check_roles(m, diag)) return XM_ERR_INVALID_INPUT;
  s.orig_values = xm_ir_module_num_values(m);
  s.dead = calloc((size_t)xm_ir_module_num_ops(m) + 1, sizeof *s.dead);
  if (!grow(&s) || !s.dead) s.st = XM_ERR_NO_MEMORY;
  for (int i = 0; s.st == XM_OK && i < xm_ir_module_num_ops(m); i++)
    visit(&s, &i);
  if (s.st == XM_OK && s.num_dead > 0) {
    /* The gathers and combines RBD replaced: nothing uses their results.
     * (The permutes stay: the aux-free load counts read them.) */
    int n = xm_ir_module_num_ops(m);
    bool *remove = calloc((size_t)n, sizeof *remove);
    if (!remove) s.st = XM_ERR_NO_MEMORY;
    for (int i = 0; remove && i < n; i++)
      for (int d = 0; d < s.num_dead; d++)
        if (xm_ir_module_op(m, i) == s.dead[d]) remove[i] = true;
    if (remove) xm_ir_module_remove_ops(m, remove);
    free(remove);
  }
  free(s.dead);
  if (s.st == XM_OK) {
    xm_ir_module_set_int(m, "par_dp", s.dp);
    xm_ir_module_set_int(m, "par_tp", s.tp);
    xm_ir_module_set_int(m, "par_ep", s.ep);
    xm_ir_module_set_int(m, "par_ssmb", s.ssmb);
    xm_ir_module_set_int(m, "par_rbd", s.rbd);
    xm_ir_module_set_int(m, "par_zero", s.zero);
    xm_ir_module_set_int(m, "par_rpn", s.rpn);
    char buf[64];
    const xm_group_kind_t groups[2] = {XM_GROUP_DP, XM_GROUP_TP};
    reduce_list(&s, groups, s.ssmb ? 2 : 1, buf, sizeof buf);
    xm_ir_attr_t a = {.key = "load_reduce", .kind = XM_ATTR_STRING, .s = buf};
    xm_ir_module_set_attr(m, &a);
    *out_changed = true;
  }
  free(s.tp_dim);
  free(s.sp);
  free(s.repl);
  free(s.moe);
  return s.st;
}

static const char *const k_options[] = {"dp",   "tp",   "ep",
                                        "ssmb", "rbd",  "zero",
                                        "ranks-per-node", "dispatch-bound", NULL};

const xm_pass_info_t xm_pass_shard = {
    .name = "shard",
    .summary = "global forward graph -> per-rank SPMD graph with collectives (DP/TP/EP/SSMB/RBD)",
    .option_names = k_options,
    .run = shard_run,
};
