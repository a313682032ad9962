/* passes/recompute.c — the "recompute" pass: activation recomputation
 * (docs/cost-model.md, Recompute policies; docs/ir.md, Passes).
 *
 * After autodiff every forward value that the backward reads stays alive
 * from its forward op to its last backward reader; that is the activation
 * memory. This pass trades compute for it, per layer (attr layer): the
 * forward ops of layer L whose results the backward of layer L reads are
 * cloned (phase "bwd", attr recompute = true) just before the first
 * backward op of the layer that reads one of them, and those backward ops
 * read the clones. The forward originals then die after their last forward
 * use, and only one layer's rebuilt values are alive at a time. Option
 * policy:
 *
 *   none       nothing changes (the default, as the spec's);
 *   selective  (alias moe, the planner's name) the expert FFN
 *              intermediates: the first expert GEMMs (gate and up, fused
 *              with the gather or not) and everything between them and
 *              the down GEMM (the activation and, under bf16, the casts).
 *              The expert input rows, the expert output, the routing and
 *              the dispatch are kept, which is exactly the `ffn` term that
 *              planner/cost.c's "moe" policy drops;
 *   full       every op of the layer but its input (the residual stream
 *              value entering it, which belongs to the layer before or to
 *              the embedding): attention, norms, router, permutation,
 *              dispatch, experts. Only what the backward needs is cloned,
 *              so a combine whose result the backward never reads is not
 *              run again.
 *
 * What may be cloned: forward ops with results that are not roots. Those
 * are pure functions of their operands, collectives included, so a clone
 * computes the forward's values bit for bit and every rank, running the
 * same module, issues the same collectives in the same order:
 *   - all_to_all, exchange_counts, all_gather, narrow, replicate,
 *     all_reduce: run again in the backward (full only; the traffic log
 *     counts them again, as the cost model's "full recompute repeats the
 *     forward movements" does);
 *   - rbd_dispatch keeps a routing record in the runtime under its attr
 *     slot (runtime/moe/rbd_exec.h), which its combine and both gradients
 *     read. The clone keeps the slot: dispatching a slot again replaces the
 *     record with the same one (the same tokens, expert ids and weights),
 *     so the backward's rbd_combine_grad and rbd_dispatch_grad read what
 *     they would have read. The clone counts its pilot rows again in the
 *     RBD statistics;
 *   - the fused ops of fuse-permute-gemm clone with their scratch result
 *     (a fresh value the plan places; nothing reads it), an op's attr
 *     workspace (kernel scratch, placed by plan-memory) is copied, and the routing
 *     bias read by topk_route changes only in the step, so a rebuilt
 *     routing is the forward's.
 * Never cloned, their results kept: params and states (persistent), roots
 * (the aux-free load accumulate, host reads), the head (no layer attr,
 * so the fused loss keeps its stats) and anything of another layer. The
 * aux-free load accumulate is a backward op of its layer (autodiff puts it
 * at the end of the backward) and reads the rebuilt tokens_per_expert like
 * any other backward reader. A backward op of another layer that reads a
 * value of layer L (the next layer reading its input) keeps the original.
 *
 * Where it runs: after autodiff (it needs the backward) and mixed-precision
 * (it clones the casts with the ops they serve, so the bf16 values are the
 * forward's), before canonicalize (whose dead-op sweep then drops forward
 * ops the forward itself never needed), host-reads (a rebuilt permute needs
 * its own read of the routed row count), routed-rows, overlap-moe-comm
 * (rebuilt exchanges get their independent work like any exchange) and
 * plan-memory; it refuses a module that has host reads or a memory plan,
 * one that is not differentiated, and a second run. The module records
 * attrs recompute (the policy) and recomputed_ops (clones made).
 */
#include <stdlib.h>
#include <string.h>

#include "passes/pass.h"

typedef enum { POLICY_NONE, POLICY_SELECTIVE, POLICY_FULL } policy_t;

typedef struct {
  xm_ir_module_t *m;
  policy_t policy;
  int nv;                /* value ids are below this (those of the input module) */
  bool *region;          /* value id -> its forward op may be rebuilt */
  bool *need;            /* value id -> the layer's backward reads it (or a clone does) */
  xm_ir_value_t **clone; /* value id -> its clone in the current layer */
  int64_t made;          /* clones made */
} rc_t;

static const char *phase_of(const xm_ir_op_t *op) {
  return xm_ir_op_get_string(op, "phase", "fwd");
}

static bool is_fwd(const xm_ir_op_t *op) { return strcmp(phase_of(op), "fwd") == 0; }
static bool is_bwd(const xm_ir_op_t *op) { return strcmp(phase_of(op), "bwd") == 0; }
static int64_t layer_of(const xm_ir_op_t *op) { return xm_ir_op_get_int(op, "layer", -1); }

static bool known(const rc_t *r, const xm_ir_value_t *v) { return v->id >= 0 && v->id < r->nv; }

/* A forward op of a layer that computes values from its operands only. */
static bool cloneable(const xm_ir_op_t *op) {
  return is_fwd(op) && layer_of(op) >= 0 && op->num_results > 0 &&
         !(xm_ir_opinfo(op->code)->flags & XM_OPF_ROOT) && !xm_ir_op_is_declaration(op);
}

static bool is_expert_gemm(xm_ir_opcode_t code) {
  return code == XM_OP_GROUPED_MATMUL || code == XM_OP_GATHER_GROUPED_MATMUL ||
         code == XM_OP_GROUPED_MATMUL_COMBINE;
}

/* ---- the region: which forward values the policy rebuilds ------------- */

static void mark_results(rc_t *r, const xm_ir_op_t *op) {
  for (int k = 0; k < op->num_results; k++)
    if (known(r, op->results[k])) r->region[op->results[k]->id] = true;
}

/* selective: an expert GEMM whose rows (operand 0) do not come from
 * another expert GEMM is a first one (gate, up); every op reading what a
 * first GEMM made, up to the GEMM that reads it as rows (down), is an
 * intermediate. region[] doubles as "computed from a first GEMM". */
static void mark_selective(rc_t *r) {
  for (int i = 0; i < xm_ir_module_num_ops(r->m); i++) {
    xm_ir_op_t *op = xm_ir_module_op(r->m, i);
    if (!cloneable(op)) continue;
    bool inside = false;
    for (int k = 0; k < op->num_operands && !inside; k++)
      inside = known(r, op->operands[k]) && r->region[op->operands[k]->id];
    if (is_expert_gemm(op->code)) {
      if (op->num_operands > 0 && known(r, op->operands[0]) && r->region[op->operands[0]->id])
        continue; /* the down GEMM: its output is kept */
      inside = true;
    }
    if (inside) mark_results(r, op);
  }
}

static void mark_region(rc_t *r) {
  if (r->policy == POLICY_SELECTIVE) {
    mark_selective(r);
    return;
  }
  for (int i = 0; i < xm_ir_module_num_ops(r->m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(r->m, i);
    if (cloneable(op)) mark_results(r, op);
  }
}

/* A value of layer L the policy rebuilds. */
static bool rebuilt(const rc_t *r, const xm_ir_value_t *v, int64_t layer) {
  return known(r, v) && r->region[v->id] && v->def && layer_of(v->def) == layer;
}

/* ---- one layer ---------------------------------------------------------- */

/* Marks what layer L's backward reads and, through the clones' operands,
 * everything it takes to rebuild that; returns the position of the first
 * backward reader (-1: nothing to rebuild). */
static int mark_needed(rc_t *r, int64_t layer) {
  int n = xm_ir_module_num_ops(r->m), first = -1;
  for (int i = 0; i < n; i++) {
    const xm_ir_op_t *op = xm_ir_module_op(r->m, i);
    if (!is_bwd(op) || layer_of(op) != layer) continue;
    for (int k = 0; k < op->num_operands; k++) {
      const xm_ir_value_t *v = op->operands[k];
      if (!rebuilt(r, v, layer)) continue;
      r->need[v->id] = true;
      if (first < 0) first = i;
    }
  }
  /* Operands precede their users: one walk from the back closes the set. */
  for (int i = first < 0 ? -1 : first - 1; i >= 0; i--) {
    const xm_ir_op_t *op = xm_ir_module_op(r->m, i);
    if (!cloneable(op) || layer_of(op) != layer) continue;
    bool any = false;
    for (int k = 0; k < op->num_results && !any; k++)
      any = known(r, op->results[k]) && r->need[op->results[k]->id];
    if (!any) continue;
    for (int k = 0; k < op->num_operands; k++)
      if (rebuilt(r, op->operands[k], layer)) r->need[op->operands[k]->id] = true;
  }
  return first;
}

/* Appends a copy of `op` reading the clones of its operands where there
 * are some, moves it to position `at` and records its results' clones. */
static xm_status_t clone_at(rc_t *r, const xm_ir_op_t *op, int at) {
  xm_ir_value_t *ops[16], **operands = op->num_operands <= 16 ? ops : NULL;
  xm_ir_type_t tys[8], *types = op->num_results <= 8 ? tys : NULL;
  if (!operands) operands = malloc(sizeof *operands * (size_t)op->num_operands);
  if (!types) types = malloc(sizeof *types * (size_t)op->num_results);
  xm_status_t st = operands && types ? XM_OK : XM_ERR_NO_MEMORY;
  xm_ir_op_t *c = NULL;
  if (st == XM_OK) {
    for (int k = 0; k < op->num_operands; k++) {
      xm_ir_value_t *v = op->operands[k];
      operands[k] = known(r, v) && r->clone[v->id] ? r->clone[v->id] : v;
    }
    for (int k = 0; k < op->num_results; k++)
      types[k] = op->results[k]->type;
    c = xm_ir_op_append(r->m, op->code, op->num_operands, operands, op->num_results, types,
                        op->loc);
    if (!c) st = XM_ERR_NO_MEMORY;
  }
  if (c) {
    for (int a = 0; a < op->num_attrs; a++)
      xm_ir_op_set_attr(r->m, c, &op->attrs[a]);
    xm_ir_op_set_string(r->m, c, "phase", "bwd");
    xm_ir_op_set_bool(r->m, c, "recompute", true);
    for (int k = 0; k < op->num_results; k++)
      if (known(r, op->results[k])) r->clone[op->results[k]->id] = c->results[k];
    xm_ir_module_move_op(r->m, xm_ir_module_num_ops(r->m) - 1, at);
    r->made++;
  }
  if (operands != ops) free(operands);
  if (types != tys) free(types);
  return st;
}

/* Layer L: clones before its first backward reader, then every backward
 * op of the layer reads them. */
static xm_status_t rebuild_layer(rc_t *r, int64_t layer) {
  memset(r->need, 0, sizeof *r->need * (size_t)r->nv);
  memset(r->clone, 0, sizeof *r->clone * (size_t)r->nv);
  int first = mark_needed(r, layer);
  if (first < 0) return XM_OK;
  int at = first;
  for (int i = 0; i < first; i++) {
    const xm_ir_op_t *op = xm_ir_module_op(r->m, i);
    if (!cloneable(op) || layer_of(op) != layer) continue;
    bool any = false;
    for (int k = 0; k < op->num_results && !any; k++)
      any = known(r, op->results[k]) && r->need[op->results[k]->id];
    if (!any) continue;
    XM_RETURN_IF_ERROR(clone_at(r, op, at++));
  }
  for (int i = at; i < xm_ir_module_num_ops(r->m); i++) {
    xm_ir_op_t *op = xm_ir_module_op(r->m, i);
    if (!is_bwd(op) || layer_of(op) != layer || xm_ir_op_get_bool(op, "recompute", false)) continue;
    for (int k = 0; k < op->num_operands; k++) {
      xm_ir_value_t *v = op->operands[k];
      if (known(r, v) && r->clone[v->id]) xm_ir_op_set_operand(op, k, r->clone[v->id]);
    }
  }
  return XM_OK;
}

/* ---- checks, options, entry ------------------------------------------- */

/* What must (not) have happened before: autodiff yes; host-reads,
 * plan-memory and this pass no. */
static xm_status_t check_input(xm_ir_module_t *m, xm_diag_t *diag, int64_t *out_layers) {
  const char *why = NULL;
  bool bwd = false;
  int64_t layers = 0;
  for (int i = 0; i < xm_ir_module_num_ops(m) && !why; i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    bwd = bwd || is_bwd(op);
    if (layer_of(op) + 1 > layers) layers = layer_of(op) + 1;
    if (op->code == XM_OP_HOST_READ) why = "has host reads; run recompute before host-reads";
  }
  if (!why && xm_ir_module_find_attr(m, "mem_activation_bytes"))
    why = "has a memory plan; run recompute before plan-memory";
  if (!why && xm_ir_module_find_attr(m, "recompute"))
    why = "was given a recompute policy already (the pass runs once)";
  if (!why && !bwd) why = "has no backward; run recompute after autodiff";
  if (why) {
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL, "the module %s", why);
    return XM_ERR_INVALID_INPUT;
  }
  *out_layers = layers;
  return XM_OK;
}

static xm_status_t parse_policy(const xm_pass_options_t *o, xm_diag_t *diag, policy_t *out) {
  const char *v = xm_pass_option(o, "policy");
  *out = POLICY_NONE;
  if (!v || strcmp(v, "none") == 0) return XM_OK;
  if (strcmp(v, "selective") == 0 || strcmp(v, "moe") == 0) {
    *out = POLICY_SELECTIVE;
    return XM_OK;
  }
  if (strcmp(v, "full") == 0) {
    *out = POLICY_FULL;
    return XM_OK;
  }
  xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL,
              "option policy is \"%s\"; expected none, selective (or moe) or full", v);
  return XM_ERR_INVALID_INPUT;
}

static xm_status_t recompute_run(xm_ir_module_t *m, const xm_pass_options_t *options,
                                 xm_diag_t *diag, bool *out_changed) {
  policy_t policy;
  int64_t layers = 0;
  XM_RETURN_IF_ERROR(parse_policy(options, diag, &policy));
  XM_RETURN_IF_ERROR(check_input(m, diag, &layers));
  static const char *const names[] = {"none", "selective", "full"};
  xm_ir_attr_t a = {.key = "recompute", .kind = XM_ATTR_STRING, .s = names[policy]};
  xm_ir_module_set_attr(m, &a);
  rc_t r = {.m = m, .policy = policy, .nv = xm_ir_module_num_values(m)};
  xm_status_t st = XM_OK;
  if (policy != POLICY_NONE) {
    size_t nv = (size_t)r.nv + 1;
    r.region = calloc(nv, sizeof *r.region);
    r.need = calloc(nv, sizeof *r.need);
    r.clone = calloc(nv, sizeof *r.clone);
    st = r.region && r.need && r.clone ? XM_OK : XM_ERR_NO_MEMORY;
    if (st == XM_OK) mark_region(&r);
    for (int64_t l = 0; l < layers && st == XM_OK; l++)
      st = rebuild_layer(&r, l);
  }
  free(r.region);
  free(r.need);
  free(r.clone);
  xm_ir_module_set_int(m, "recomputed_ops", r.made);
  *out_changed = r.made > 0;
  return st;
}

static const char *const k_options[] = {"policy", NULL};

const xm_pass_info_t xm_pass_recompute = {
    .name = "recompute",
    .summary = "forward ops of each layer rebuilt before its backward, so their results need "
               "not be kept (policy none, selective or full)",
    .option_names = k_options,
    .run = recompute_run,
};
