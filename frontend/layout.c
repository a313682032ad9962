/* frontend/layout.c — layout legality and the rank-group formulas.
 *
 * The checks run in the order a reader would fix them: the degrees
 * themselves (positive, world size bounded), then what each degree must
 * divide (experts and world for ep; heads, kv_heads, dense_ffn and the
 * shared-expert width for tp, since those are split over the TP group),
 * then the techniques (ssmb, rbd, zero) and the batch. Every failing
 * condition is reported, not only the first, so one run of `xmoec plan`
 * shows everything that is wrong with a layout. A refusal is placed at
 * the knob that was asked for (the user can change the layout, not the
 * model); its message names the conflicting spec field by JSON pointer.
 * Some refusals are limits of this version rather than of the layout
 * (qk_norm "full" under tp > 1; rbd with a capacity factor): when
 * they are the only errors the status is XM_ERR_UNSUPPORTED.
 *
 * The spec loader (frontend/spec.c) runs similar checks on the "parallel"
 * section as it reads it; this file is the one the compiler and planner ask
 * about any layout, including ones that come from flags or a search, and it
 * knows the node layout (RBD and TP warnings) and what cannot train yet.
 *
 * Rank order (docs/parallelism.md): world rank r = d * tp + t with t the TP
 * rank and d the DP rank, so TP groups are consecutive ranks (kept inside a
 * node whenever tp divides ranks_per_node). EP groups are the consecutive
 * blocks of ep ranks; expert-DP groups take every ep-th rank. Nodes are the
 * consecutive blocks of ranks_per_node ranks (runtime/comm/context.h).
 */
#include "frontend/layout.h"

#include <stdio.h>
#include <string.h>

#include "runtime/abi/groups.h"

#define ERR(place, ...) xm_diag_add(diag, XM_DIAG_ERROR, source, place, __VA_ARGS__)
#define WARN(place, ...) xm_diag_add(diag, XM_DIAG_WARNING, source, place, __VA_ARGS__)

static const int64_t world_max = XM_LAYOUT_WORLD_MAX;

const char *xm_layout_place(xm_layout_origin_t origin, xm_layout_knob_t knob) {
  static const char *const spec_places[] = {
      "/parallel/dp",
      "/parallel/tp",
      "/parallel/ep",
      "/parallel/ssmb",
      "/parallel/rbd",
      "/parallel/zero",
      "/cluster/ranks_per_node",
  };
  static const char *const flag_places[] = {
      "--dp", "--tp", "--ep", "--ssmb", "--rbd", "--zero", "--ranks-per-node",
  };
  XM_ASSERT(knob >= XM_LAYOUT_DP && knob <= XM_LAYOUT_RANKS_PER_NODE);
  return origin == XM_LAYOUT_FROM_FLAGS ? flag_places[knob] : spec_places[knob];
}

void xm_layout_from_spec(const xm_spec_t *spec, xm_layout_t *out) {
  memset(out, 0, sizeof *out);
  out->dp = out->tp = out->ep = 1;
  out->zero = spec->training.zero_stage;
  if (spec->parallel.present) {
    out->dp = spec->parallel.dp;
    out->tp = spec->parallel.tp;
    out->ep = spec->parallel.ep;
    out->ssmb = spec->parallel.ssmb;
    out->rbd = spec->parallel.rbd;
    out->zero = spec->parallel.zero;
  }
  if (spec->cluster.present) out->ranks_per_node = spec->cluster.ranks_per_node;
}

char *xm_layout_format(const xm_layout_t *l, char *buf, size_t cap) {
  if (cap == 0) return buf;
  snprintf(buf, cap, "dp%lld tp%lld ep%lld%s%s%s", (long long)l->dp, (long long)l->tp,
           (long long)l->ep, l->ssmb ? " ssmb" : "", l->rbd ? " rbd" : "",
           l->zero == 1 ? " zero1" : "");
  return buf;
}

int64_t xm_layout_node_size(const xm_layout_t *l) {
  return l->ranks_per_node > 0 ? l->ranks_per_node : xm_layout_world(l);
}

int64_t xm_layout_num_nodes(const xm_layout_t *l) {
  return xm_layout_world(l) / xm_layout_node_size(l);
}

/* A block of `size` consecutive ranks starting at a multiple of `size`
 * crosses a node boundary for some block unless the blocks nest inside
 * nodes, i.e. size divides the node size. */
static bool blocks_span_nodes(int64_t size, int64_t node) {
  return size > node || node % size != 0;
}

bool xm_layout_ep_spans_nodes(const xm_layout_t *l) {
  return l->ep > 1 && blocks_span_nodes(l->ep, xm_layout_node_size(l));
}

bool xm_layout_rbd_active(const xm_layout_t *l) { return l->rbd && xm_layout_ep_spans_nodes(l); }

/* ---- checks ------------------------------------------------------------ */

typedef struct {
  const xm_spec_t *spec;
  const xm_layout_t *l;
  xm_layout_origin_t origin;
  const char *source;
  xm_diag_t *diag;
  int *not_yet; /* errors for what this version cannot train (XM_ERR_UNSUPPORTED) */
} check_t;

#define PLACE(knob) xm_layout_place(c->origin, knob)

/* Degrees must be positive and the world bounded before anything divides. */
static bool check_degrees(const check_t *c) {
  const char *source = c->source;
  xm_diag_t *diag = c->diag;
  const xm_layout_t *l = c->l;
  bool ok = true;
  const struct {
    xm_layout_knob_t knob;
    const char *name;
    int64_t v;
  } degrees[] = {
      {XM_LAYOUT_DP, "dp", l->dp}, {XM_LAYOUT_TP, "tp", l->tp}, {XM_LAYOUT_EP, "ep", l->ep}};
  for (size_t i = 0; i < sizeof degrees / sizeof degrees[0]; i++) {
    if (degrees[i].v < 1 || degrees[i].v > world_max) {
      ERR(PLACE(degrees[i].knob), "%s must be in [1, %lld], got %lld", degrees[i].name,
          (long long)world_max, (long long)degrees[i].v);
      ok = false;
    }
  }
  if (l->ranks_per_node < 0 || l->ranks_per_node > world_max) {
    ERR(PLACE(XM_LAYOUT_RANKS_PER_NODE),
        "ranks_per_node must be in [1, %lld] (0: unknown), got %lld", (long long)world_max,
        (long long)l->ranks_per_node);
    ok = false;
  }
  if (l->zero != 0 && l->zero != 1)
    ERR(PLACE(XM_LAYOUT_ZERO), "zero must be 0 or 1 (ZeRO-1 shards optimizer states), got %d",
        l->zero);
  if (ok && l->dp * l->tp > world_max) {
    ERR(PLACE(XM_LAYOUT_DP), "dp*tp = %lld ranks exceeds %lld", (long long)(l->dp * l->tp),
        (long long)world_max);
    ok = false;
  }
  return ok;
}

static void check_ep(const check_t *c) {
  const char *source = c->source;
  xm_diag_t *diag = c->diag;
  const xm_layout_t *l = c->l;
  int64_t experts = c->spec->moe.experts;
  const char *place = PLACE(XM_LAYOUT_EP);
  if (experts == 0 && l->ep > 1)
    ERR(place, "ep (%lld) > 1 needs routed experts; the model is dense (/moe/experts is 0)",
        (long long)l->ep);
  else if (experts > 0 && experts % l->ep != 0)
    ERR(place,
        "ep (%lld) must divide the routed experts (%lld, /moe/experts): expert e lives on EP "
        "rank e / (experts/ep)",
        (long long)l->ep, (long long)experts);
  int64_t world = xm_layout_world(l);
  if (world % l->ep != 0)
    ERR(place, "ep (%lld) must divide dp*tp (%lld): EP groups are consecutive blocks of ranks",
        (long long)l->ep, (long long)world);
  /* Without SSMB the tp ranks of a TP group carry the same tokens into the
   * MoE block; each would dispatch all of them over the EP group. */
  if (experts > 0 && l->ep > 1 && l->tp > 1 && !l->ssmb)
    ERR(place,
        "ep (%lld) with tp (%lld) needs ssmb (%s): without it the ranks of a TP group hold the "
        "same tokens and would send every token tp times",
        (long long)l->ep, (long long)l->tp, PLACE(XM_LAYOUT_SSMB));
}

/* TP splits attention heads and the dense and shared-expert FFN widths. */
static void check_tp(const check_t *c) {
  const char *source = c->source;
  xm_diag_t *diag = c->diag;
  int64_t tp = c->l->tp;
  const xm_model_spec_t *m = &c->spec->model;
  const xm_moe_spec_t *e = &c->spec->moe;
  const char *place = PLACE(XM_LAYOUT_TP);
  if (tp == 1) return;
  if (m->heads % tp != 0)
    ERR(place, "tp (%lld) must divide heads (%lld, /model/heads)", (long long)tp,
        (long long)m->heads);
  if (m->attention != XM_ATTN_MLA && m->kv_heads % tp != 0) /* MLA: every head reads the latent */
    ERR(place, "tp (%lld) must divide kv_heads (%lld, /model/kv_heads)", (long long)tp,
        (long long)m->kv_heads);
  bool has_dense = e->experts == 0 || m->first_k_dense > 0;
  if (has_dense && m->dense_ffn % tp != 0)
    ERR(place, "tp (%lld) must divide dense_ffn (%lld, /model/dense_ffn)", (long long)tp,
        (long long)m->dense_ffn);
  if (e->experts > 0 && e->shared_experts > 0 && e->shared_ffn % tp != 0)
    ERR(place, "tp (%lld) must divide the shared-expert width (%lld, /moe/shared_ffn)",
        (long long)tp, (long long)e->shared_ffn);
  /* OLMoE's norm reduces over all heads of q and k, which TP splits. */
  if (m->qk_norm == XM_QK_NORM_FULL) {
    ERR(place,
        "tp (%lld) cannot split qk_norm \"full\" (/model/qk_norm) yet: the norm runs over the "
        "whole q and k projections, which tensor parallelism splits by heads; use tp 1",
        (long long)tp);
    (*c->not_yet)++;
  }
}

static void check_ssmb(const check_t *c) {
  const char *source = c->source;
  xm_diag_t *diag = c->diag;
  const xm_layout_t *l = c->l;
  if (!l->ssmb) return;
  const char *place = PLACE(XM_LAYOUT_SSMB);
  if (c->spec->moe.experts == 0)
    ERR(place, "ssmb shards MoE blocks but the model is dense (/moe/experts is 0)");
  int64_t tokens = c->spec->training.micro_batch * c->spec->training.seq_len;
  if (l->tp < 2)
    ERR(place,
        "ssmb splits the tokens of an MoE block over the TP group and needs tp > 1 "
        "(tp is %lld)",
        (long long)l->tp);
  else if (tokens % l->tp != 0)
    ERR(place,
        "ssmb needs micro_batch*seq_len (%lld, /training/micro_batch * /training/seq_len) "
        "divisible by tp (%lld)",
        (long long)tokens, (long long)l->tp);
  else /* MTP module k runs its MoE block on the S-k positions that have a target */
    for (int64_t k = 1; k <= c->spec->model.mtp_layers; k++)
      if (c->spec->training.micro_batch * (c->spec->training.seq_len - k) % l->tp != 0) {
        ERR(place,
            "ssmb needs the tokens of MTP module %lld, micro_batch*(seq_len-%lld) = %lld "
            "(/model/mtp_layers), divisible by tp (%lld)",
            (long long)k, (long long)k,
            (long long)(c->spec->training.micro_batch * (c->spec->training.seq_len - k)),
            (long long)l->tp);
        break;
      }
}

/* The node layout: ranks_per_node must tile the world; rbd and TP groups
 * are judged against it. */
static void check_nodes(const check_t *c) {
  const char *source = c->source;
  xm_diag_t *diag = c->diag;
  const xm_layout_t *l = c->l;
  int64_t world = xm_layout_world(l);
  int64_t rpn = l->ranks_per_node;
  if (l->rbd && l->ep < 2)
    ERR(PLACE(XM_LAYOUT_RBD),
        "rbd deduplicates the expert dispatch across the nodes of an EP group and needs ep > 1 "
        "(ep is %lld)",
        (long long)l->ep);
  if (l->rbd && c->spec->moe.experts > 0 && c->spec->moe.has_capacity) {
    ERR(PLACE(XM_LAYOUT_RBD),
        "rbd with a capacity factor (%g, /moe/capacity_factor) is not supported yet: the "
        "deduplicated dispatch is dropless only; turn rbd off or make the model dropless "
        "(capacity_factor null)",
        c->spec->moe.capacity_factor);
    (*c->not_yet)++;
  }
  if (rpn == 0) return;
  if (world % rpn != 0) {
    ERR(PLACE(XM_LAYOUT_RANKS_PER_NODE),
        "ranks_per_node (%lld) must divide the world size dp*tp (%lld)", (long long)rpn,
        (long long)world);
    return;
  }
  if (l->rbd && l->ep > 1 && world % l->ep == 0 && !xm_layout_ep_spans_nodes(l))
    WARN(PLACE(XM_LAYOUT_RBD),
         "rbd has no effect: every EP group (ep %lld) lies inside one node (ranks_per_node "
         "%lld); the dispatch stays flat",
         (long long)l->ep, (long long)rpn);
  if (l->tp > 1 && blocks_span_nodes(l->tp, rpn))
    WARN(PLACE(XM_LAYOUT_TP),
         "TP groups (tp %lld) span nodes (ranks_per_node %lld): their collectives cross the "
         "network",
         (long long)l->tp, (long long)rpn);
}

static void check_batch_and_zero(const check_t *c) {
  const char *source = c->source;
  xm_diag_t *diag = c->diag;
  const xm_layout_t *l = c->l;
  const xm_training_spec_t *t = &c->spec->training;
  int64_t per_step = t->micro_batch * l->dp;
  if (per_step > 0 && t->global_batch % per_step != 0)
    ERR(PLACE(XM_LAYOUT_DP),
        "global_batch (%lld, /training/global_batch) must be a multiple of micro_batch*dp "
        "(%lld * %lld = %lld)",
        (long long)t->global_batch, (long long)t->micro_batch, (long long)l->dp,
        (long long)per_step);
  int64_t edp = l->ep > 0 && xm_layout_world(l) % l->ep == 0 ? xm_layout_world(l) / l->ep : 0;
  if (l->zero == 1 && l->dp == 1 && (edp == 1 || c->spec->moe.experts == 0))
    WARN(PLACE(XM_LAYOUT_ZERO),
         "zero 1 has no effect: the data-parallel groups have one rank (dp 1%s)",
         c->spec->moe.experts > 0 ? ", ep = dp*tp" : "");
}

xm_status_t xm_layout_check(const xm_spec_t *spec, const xm_layout_t *layout,
                            xm_layout_origin_t origin, const char *source, xm_diag_t *diag) {
  int not_yet = 0;
  check_t c = {spec, layout, origin, source, diag, &not_yet};
  int before = xm_diag_error_count(diag);
  if (check_degrees(&c)) {
    check_ep(&c);
    check_tp(&c);
    check_ssmb(&c);
    check_nodes(&c);
    check_batch_and_zero(&c);
  }
  int added = xm_diag_error_count(diag) - before;
  if (added == 0) return XM_OK;
  return added == not_yet ? XM_ERR_UNSUPPORTED : XM_ERR_INVALID_INPUT;
}

/* ---- rank groups --------------------------------------------------------- */

/* The compiler's kinds and the runtime's are the same rows of one table,
 * so a kind converts to the XM_RT_GROUP_* constant of the same value (the
 * code generator and the aliases below rely on it); the kinds only the
 * compiler has come after all of them. */
#define XM_GROUP(e, name, rt, doc)                                                                 \
  _Static_assert((int)XM_GROUP_##e == (int)(rt), "XM_GROUP_" #e " differs from " #rt);
#define XM_GROUP_LAYOUT(e, name, doc)                                                              \
  _Static_assert((int)XM_GROUP_##e >= (int)XM_RT_GROUP_COUNT, "XM_GROUP_" #e " is not last");
#include "runtime/abi/groups.def"

static const char *const k_kind_names[XM_GROUP_COUNT] = {
#define XM_GROUP(e, name, rt, doc) [XM_GROUP_##e] = name,
#define XM_GROUP_LAYOUT(e, name, doc) [XM_GROUP_##e] = name,
#include "runtime/abi/groups.def"
};

const char *xm_group_kind_name(xm_group_kind_t kind) {
  XM_ASSERT(kind >= 0 && kind < XM_GROUP_COUNT);
  return k_kind_names[kind];
}

bool xm_group_kind_from_name(const char *name, xm_group_kind_t *out) {
  static const struct {
    const char *name;
    int kind; /* an XM_RT_GROUP_* value, the same as the XM_GROUP_* one */
  } k_aliases[] = {
#define XM_GROUP_ALIAS(e, name, rt, doc) {name, (int)(rt)},
#include "runtime/abi/groups.def"
  };
  if (!name) return false;
  for (int k = 0; k < XM_GROUP_COUNT; k++)
    if (strcmp(k_kind_names[k], name) == 0) {
      *out = (xm_group_kind_t)k;
      return true;
    }
  for (size_t i = 0; i < sizeof k_aliases / sizeof k_aliases[0]; i++)
    if (strcmp(k_aliases[i].name, name) == 0) {
      *out = (xm_group_kind_t)k_aliases[i].kind;
      return true;
    }
  return false;
}

int64_t xm_layout_group_size(const xm_layout_t *l, xm_group_kind_t kind) {
  int64_t world = xm_layout_world(l), node = xm_layout_node_size(l);
  switch (kind) {
  case XM_GROUP_WORLD: return world;
  case XM_GROUP_DP: return l->dp;
  case XM_GROUP_TP: return l->tp;
  case XM_GROUP_EP: return l->ep;
  case XM_GROUP_EDP: XM_ASSERT(l->ep >= 1); return world / l->ep;
  case XM_GROUP_NODE: return node;
  case XM_GROUP_EP_NODE: return l->ep < node ? l->ep : node;
  default: break;
  }
  XM_ASSERT(!"unknown group kind");
  return 1;
}

/* Consecutive blocks of `size` ranks. */
static xm_group_t block_group(int64_t rank, int64_t size) {
  xm_group_t g = {.first = rank / size * size,
                  .stride = 1,
                  .size = size,
                  .index = rank % size,
                  .color = rank / size};
  return g;
}

/* Every `stride`-th rank of the world, starting at rank % stride. */
static xm_group_t strided_group(int64_t rank, int64_t stride, int64_t world) {
  xm_group_t g = {.first = rank % stride,
                  .stride = stride,
                  .size = world / stride,
                  .index = rank / stride,
                  .color = rank % stride};
  return g;
}

/* The EP block and the node block intersect in a run of consecutive ranks;
 * the pair (EP group, node) names it. */
static xm_group_t ep_node_group(const xm_layout_t *l, int64_t rank) {
  int64_t rpn = xm_layout_node_size(l);
  xm_group_t ep = block_group(rank, l->ep), node = block_group(rank, rpn);
  int64_t lo = ep.first > node.first ? ep.first : node.first;
  int64_t ep_end = ep.first + ep.size, node_end = node.first + node.size;
  int64_t hi = ep_end < node_end ? ep_end : node_end;
  xm_group_t g = {.first = lo,
                  .stride = 1,
                  .size = hi - lo,
                  .index = rank - lo,
                  .color = ep.color * xm_layout_num_nodes(l) + node.color};
  return g;
}

xm_group_t xm_layout_group(const xm_layout_t *l, xm_group_kind_t kind, int64_t rank) {
  int64_t world = xm_layout_world(l);
  XM_ASSERT(rank >= 0 && rank < world);
  XM_ASSERT(l->tp >= 1 && l->ep >= 1 && world % l->ep == 0);
  XM_ASSERT(world % xm_layout_node_size(l) == 0);
  switch (kind) {
  case XM_GROUP_WORLD: return block_group(rank, world);
  case XM_GROUP_DP: return strided_group(rank, l->tp, world);
  case XM_GROUP_TP: return block_group(rank, l->tp);
  case XM_GROUP_EP: return block_group(rank, l->ep);
  case XM_GROUP_EDP: return strided_group(rank, l->ep, world);
  case XM_GROUP_NODE: return block_group(rank, xm_layout_node_size(l));
  case XM_GROUP_EP_NODE: return ep_node_group(l, rank);
  default: break;
  }
  XM_ASSERT(!"unknown group kind");
  return block_group(rank, 1);
}
