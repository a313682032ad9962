/* planner/plan.c — the plan-parallelism search and the model-family sizing.
 *
 * The search is exhaustive over a small space: for a world of W = nodes *
 * ranks_per_node ranks it walks tp over the divisors of ranks_per_node (TP
 * stays inside a node), dp = W / tp, ep over the divisors of both W and the
 * routed experts, ssmb (only with tp > 1), rbd (only when some EP group
 * spans nodes, where it does something), zero 0/1 (1 only when a DP group
 * has more than one rank), the recompute policies, and micro-batches that
 * divide global_batch / dp up to XM_PLAN_MAX_MICRO_BATCH. Variants the
 * layout check would only warn about (rbd inside a node, zero with nothing
 * to shard, ssmb without TP) are skipped: each duplicates another
 * candidate. A policy (xm_plan_policy_allows) removes what that system
 * cannot express before anything is costed.
 *
 * Legality is xm_layout_check's (frontend/layout.h) with a scratch
 * diagnostic list; its first error is kept as the candidate's reason. It
 * depends on the layout and the micro-batch but not on zero or recompute,
 * so it runs once per (tp, ep, ssmb, rbd, micro_batch) and is shared by
 * the rest. Legal points are costed (planner/cost.h); those that do not fit
 * keep "needs X GiB, device has Y GiB" as their reason.
 *
 * Two refusals of the layout check are handled here rather than inherited:
 * MLA attention is refused by the check for every layout (this version
 * cannot train it) although the cost model counts it, so an MLA spec is
 * checked as if its attention were MHA and the result says it is not
 * trainable; and DeepSpeed-TED's expert tensor parallelism (ep with tp,
 * duplicate tokens dropped across TP, no SSMB) is what the check refuses as
 * "ep with tp needs ssmb", so TED layouts are checked with ssmb set (the
 * same token split, the same divisibility) and costed without it.
 *
 * Ranking: candidates that fit by predicted step time (then total memory,
 * then enumeration order, so the result is deterministic); then legal
 * ones that do not fit by shortfall; then the illegal ones in enumeration
 * order.
 *
 * The model family (xm_plan_family_member) and the largest trainable
 * member (xm_plan_max_model) are at the end; docs/plan-json.md states the
 * scaling rule.
 */
#include "planner/plan.h"

#include "planner/routing.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/count.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

/* ---- policies ------------------------------------------------------------ */

/* The recompute policies each system offers. xmoec: what its recompute
 * pass builds (passes/recompute.c), which is every policy under every
 * layout: the pass clones a layer's forward ops whatever they are,
 * collectives included, so no layout rules one out (tests/e2e/recompute.sh
 * trains each under the layouts that exercise every collective), and
 * "moe" (the expert FFN alone) is xmoec's own. The DeepSpeed/Megatron-based
 * systems checkpoint whole layers or nothing. */
static unsigned policy_recompute_mask(xm_policy_t p) {
  unsigned all = (1u << XM_RECOMPUTE_NONE) | (1u << XM_RECOMPUTE_MOE) | (1u << XM_RECOMPUTE_FULL);
  return p == XM_POLICY_XMOEC ? all : (1u << XM_RECOMPUTE_NONE) | (1u << XM_RECOMPUTE_FULL);
}

bool xm_plan_policy_allows(xm_policy_t policy, int64_t experts, const xm_cost_point_t *point) {
  const xm_layout_t *l = &point->layout;
  if ((int)point->recompute < 0 || (int)point->recompute >= XM_RECOMPUTE_COUNT) return false;
  if (!(policy_recompute_mask(policy) & (1u << point->recompute))) return false;
  switch (policy) {
  case XM_POLICY_XMOEC: return true;
  case XM_POLICY_XMOE:
    /* The reference RBD handles one local expert and no SSMB. */
    return !l->rbd || (!l->ssmb && l->ep > 0 && experts / l->ep == 1);
  case XM_POLICY_DEEPSPEED_MOE:
  case XM_POLICY_TUTEL:
  case XM_POLICY_DEEPSPEED_TED: return !l->ssmb && !l->rbd;
  case XM_POLICY_COUNT: break;
  }
  return false;
}

/* ---- enumeration ----------------------------------------------------------- */

typedef struct {
  const xm_spec_t *spec;
  xm_spec_t check_spec; /* the spec the layout check sees (its micro-batch per candidate) */
  xm_policy_t policy;
  unsigned recompute_mask;
  const xm_cost_routing_t *routing;
  int64_t dispatch_bound; /* xm_cost_point_t's (0: default) */
  xm_net_t net;
  double device_bytes, peak_flops, gemm_eff;
  xm_diag_t scratch;
  xm_plan_candidate_t *cands;
  int64_t num, cap;
} search_t;

static xm_status_t push(search_t *s, const xm_plan_candidate_t *c) {
  if (s->num == s->cap) {
    int64_t cap = s->cap ? s->cap * 2 : 256;
    if ((size_t)cap > SIZE_MAX / sizeof *s->cands) return XM_ERR_NO_MEMORY;
    xm_plan_candidate_t *p = realloc(s->cands, (size_t)cap * sizeof *p);
    if (!p) return XM_ERR_NO_MEMORY;
    s->cands = p;
    s->cap = cap;
  }
  s->cands[s->num++] = *c;
  return XM_OK;
}

static void scratch_reset(search_t *s) {
  if (s->scratch.count == 0) return;
  xm_diag_free(&s->scratch);
  xm_diag_init(&s->scratch);
}

/* "place: message" of the first error in the scratch list, or `dflt`. */
static void first_error(const xm_diag_t *d, const char *dflt, char *out, size_t cap) {
  for (int i = 0; i < d->count; i++) {
    const xm_diag_entry_t *e = &d->entries[i];
    if (e->level != XM_DIAG_ERROR) continue;
    if (e->place)
      snprintf(out, cap, "%s: %s", e->place, e->message);
    else
      snprintf(out, cap, "%s", e->message);
    return;
  }
  snprintf(out, cap, "%s", dflt);
}

/* Legality of a layout at micro-batch mb; "" or the reason. */
static bool check_legal(search_t *s, const xm_layout_t *l, int64_t mb, char *reason, size_t cap) {
  xm_layout_t checked = *l;
  /* TED splits the experts over TP and drops the duplicate tokens of a TP
   * group: to the check that is SSMB's token split. */
  if (s->policy == XM_POLICY_DEEPSPEED_TED && l->tp > 1 && l->ep > 1) checked.ssmb = true;
  s->check_spec.training.micro_batch = mb;
  scratch_reset(s);
  xm_status_t st =
      xm_layout_check(&s->check_spec, &checked, XM_LAYOUT_FROM_FLAGS, NULL, &s->scratch);
  reason[0] = '\0';
  if (st == XM_OK) return true;
  first_error(&s->scratch, "illegal layout", reason, cap);
  return false;
}

/* Costs one legal point and appends it. */
static xm_status_t cost_point(search_t *s, const xm_cost_point_t *p) {
  xm_plan_candidate_t c;
  memset(&c, 0, sizeof c);
  c.point = *p;
  c.legal = true;
  xm_spec_t spec = *s->spec;
  spec.training.micro_batch = p->micro_batch;
  spec.training.recompute = p->recompute;
  scratch_reset(s);
  xm_status_t st = xm_cost_evaluate(&spec, &s->net, s->device_bytes, s->peak_flops, s->gemm_eff, p,
                                    s->routing, &s->scratch, &c.cost);
  if (st == XM_ERR_NO_MEMORY) return st;
  if (st != XM_OK) {
    c.legal = false;
    char msg[160];
    first_error(&s->scratch, xm_status_name(st), msg, sizeof msg);
    snprintf(c.reason, sizeof c.reason, "%s", msg); /* already "cost model: ..." */
  } else if (!c.cost.fits) {
    snprintf(c.reason, sizeof c.reason,
             "does not fit: needs %.1f GiB per rank, the device has %.1f GiB (short by %.1f GiB)",
             c.cost.total / GIB, c.cost.device / GIB, c.cost.shortfall / GIB);
  }
  return push(s, &c);
}

static xm_status_t add_illegal(search_t *s, const xm_cost_point_t *p, const char *reason) {
  xm_plan_candidate_t c;
  memset(&c, 0, sizeof c);
  c.point = *p;
  c.legal = false;
  snprintf(c.reason, sizeof c.reason, "%s", reason);
  return push(s, &c);
}

/* Micro-batches for dp: divisors of global_batch/dp up to the bound; when
 * dp does not divide the global batch, the spec's own micro-batch alone
 * (every layout with that dp is then refused with the batch rule). */
static int micro_batches(const xm_spec_t *spec, int64_t dp, int64_t *out, int cap) {
  int n = 0;
  int64_t gb = spec->training.global_batch;
  if (gb % dp != 0) {
    out[n++] = spec->training.micro_batch;
    return n;
  }
  int64_t per = gb / dp;
  for (int64_t mb = 1; mb <= per && mb <= XM_PLAN_MAX_MICRO_BATCH && n < cap; mb++)
    if (per % mb == 0) out[n++] = mb;
  return n;
}

/* Every (zero, recompute) of one legal-or-not (layout, micro_batch). */
static xm_status_t expand(search_t *s, xm_layout_t l, int64_t mb) {
  xm_cost_point_t p = {
      .layout = l, .micro_batch = mb, .policy = s->policy, .dispatch_bound = s->dispatch_bound};
  bool legal = false, checked = false;
  char reason[sizeof((xm_plan_candidate_t *)0)->reason];
  int64_t world = xm_layout_world(&l);
  int64_t experts = s->spec->moe.experts;
  /* ZeRO-1 does something when a DP group (dense or expert) has ranks. */
  bool can_shard = l.dp > 1 || (experts > 0 && world / l.ep > 1);
  for (int zero = 0; zero <= (can_shard ? 1 : 0); zero++) {
    p.layout.zero = zero;
    for (int r = 0; r < XM_RECOMPUTE_COUNT; r++) {
      if (!(s->recompute_mask & (1u << r))) continue;
      p.recompute = (xm_recompute_t)r;
      if (!xm_plan_policy_allows(s->policy, experts, &p)) continue;
      if (!checked) {
        legal = check_legal(s, &p.layout, mb, reason, sizeof reason);
        checked = true;
      }
      /* xmoec's static receive buffers: unless the user fixed the bound,
       * try the default (4: exact up to ep 4) and 2 (twice a rank's fair
       * share; a routing beyond it stops the run with the observed size). */
      bool two = s->policy == XM_POLICY_XMOEC && s->dispatch_bound == 0 && l.ep > 2 && legal;
      /* A measured routing whose busiest EP rank needs more than 4x: also
       * the smallest bound that holds its worst layer. */
      int64_t need = 0;
      if (two && s->routing && s->routing->measured) {
        double f = xm_routing_imbalance(s->routing->measured, l.ep, true);
        need = (int64_t)ceil(f - 1e-9);
        if (need <= 4 || need >= l.ep) need = 0;
      }
      int nb = two ? (need ? 3 : 2) : 1;
      for (int b = 0; b < nb; b++) {
        p.dispatch_bound = b == 0 ? s->dispatch_bound : b == 1 ? 2 : need;
        xm_status_t st = legal ? cost_point(s, &p) : add_illegal(s, &p, reason);
        if (st != XM_OK) return st;
      }
    }
  }
  return XM_OK;
}

static xm_status_t enumerate(search_t *s) {
  const xm_spec_t *spec = s->spec;
  int64_t rpn = spec->cluster.ranks_per_node;
  int64_t world = spec->cluster.nodes * rpn;
  int64_t experts = spec->moe.experts;
  int64_t mbs[XM_PLAN_MAX_MICRO_BATCH];
  for (int64_t tp = 1; tp <= rpn; tp++) {
    if (rpn % tp != 0) continue;
    int64_t dp = world / tp;
    int nmb = micro_batches(spec, dp, mbs, XM_PLAN_MAX_MICRO_BATCH);
    for (int64_t ep = 1; ep <= (experts > 0 ? experts : 1); ep++) {
      if (world % ep != 0 || (experts > 0 && experts % ep != 0)) continue;
      xm_layout_t l = {.dp = dp, .tp = tp, .ep = ep, .ranks_per_node = rpn};
      bool spans = xm_layout_ep_spans_nodes(&l);
      for (int ssmb = 0; ssmb <= (tp > 1 && experts > 0 ? 1 : 0); ssmb++) {
        for (int rbd = 0; rbd <= (spans ? 1 : 0); rbd++) {
          l.ssmb = ssmb != 0;
          l.rbd = rbd != 0;
          for (int i = 0; i < nmb; i++)
            XM_RETURN_IF_ERROR(expand(s, l, mbs[i]));
        }
      }
    }
  }
  return XM_OK;
}

/* ---- ranking ------------------------------------------------------------- */

typedef struct {
  const xm_plan_candidate_t *c;
  int64_t order;
} rank_t;

static int rank_class(const xm_plan_candidate_t *c) {
  if (!c->legal) return 2;
  return c->cost.fits ? 0 : 1;
}

static int cmp_double(double a, double b) { return a < b ? -1 : a > b ? 1 : 0; }

static int rank_cmp(const void *pa, const void *pb) {
  const rank_t *a = pa, *b = pb;
  int ca = rank_class(a->c), cb = rank_class(b->c);
  if (ca != cb) return ca < cb ? -1 : 1;
  int r = 0;
  if (ca == 0) {
    r = cmp_double(a->c->cost.t_step, b->c->cost.t_step);
    if (!r) r = cmp_double(a->c->cost.total, b->c->cost.total);
  } else if (ca == 1) {
    r = cmp_double(a->c->cost.shortfall, b->c->cost.shortfall);
  }
  if (!r) r = a->order < b->order ? -1 : a->order > b->order ? 1 : 0;
  return r;
}

static xm_status_t rank(search_t *s, xm_plan_result_t *out) {
  out->num = s->num;
  out->num_legal = out->num_fit = 0;
  out->chosen = -1;
  if (s->num == 0) {
    out->cands = NULL;
    return XM_OK;
  }
  rank_t *order = malloc((size_t)s->num * sizeof *order);
  xm_plan_candidate_t *sorted = malloc((size_t)s->num * sizeof *sorted);
  if (!order || !sorted) {
    free(order);
    free(sorted);
    return XM_ERR_NO_MEMORY;
  }
  for (int64_t i = 0; i < s->num; i++)
    order[i] = (rank_t){&s->cands[i], i};
  qsort(order, (size_t)s->num, sizeof *order, rank_cmp);
  for (int64_t i = 0; i < s->num; i++) {
    sorted[i] = *order[i].c;
    if (sorted[i].legal) out->num_legal++;
    if (sorted[i].legal && sorted[i].cost.fits) out->num_fit++;
  }
  free(order);
  out->cands = sorted;
  if (out->num_fit > 0) out->chosen = 0;
  return XM_OK;
}

/* ---- search ---------------------------------------------------------------- */

xm_status_t xm_plan_search_with(const xm_spec_t *spec, const xm_plan_options_t *opts,
                                xm_diag_t *diag, xm_plan_result_t *out) {
  memset(out, 0, sizeof *out);
  out->chosen = -1;
  out->policy = opts->policy;
  out->trainable = true;
  if ((int)opts->policy < 0 || (int)opts->policy >= XM_POLICY_COUNT) {
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, "--policy", "unknown policy %d", (int)opts->policy);
    return XM_ERR_INVALID_INPUT;
  }
  const xm_cluster_spec_t *cl = &spec->cluster;
  if (!cl->present || cl->nodes < 1 || cl->ranks_per_node < 1) {
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, "/cluster",
                "planning needs a cluster (--cluster FILE or a \"cluster\" section) with "
                "nodes and ranks_per_node");
    return XM_ERR_INVALID_INPUT;
  }
  search_t *s = calloc(1, sizeof *s);
  if (!s) return XM_ERR_NO_MEMORY;
  s->spec = spec;
  s->check_spec = *spec;
  /* What the model builder refuses is counted and costed, and the plan
   * says so instead of promising a build. */
  out->trainable = xm_spec_trainable(spec);
  s->policy = opts->policy;
  s->recompute_mask =
      policy_recompute_mask(opts->policy) & (opts->recompute_mask ? opts->recompute_mask : ~0u);
  s->routing = opts->routing;
  s->dispatch_bound = opts->dispatch_bound;
  xm_cost_cluster(cl, &s->net, &s->device_bytes, &s->peak_flops, &s->gemm_eff);
  xm_diag_init(&s->scratch);
  out->world = cl->nodes * cl->ranks_per_node;
  xm_status_t st = enumerate(s);
  if (st == XM_OK) st = rank(s, out);
  if (st == XM_ERR_NO_MEMORY)
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL, "out of memory while planning");
  xm_diag_free(&s->scratch);
  free(s->cands);
  free(s);
  return st;
}

xm_status_t xm_plan_search(const xm_spec_t *spec, xm_policy_t policy, xm_diag_t *diag,
                           xm_plan_result_t *out) {
  xm_plan_options_t o = {.policy = policy};
  return xm_plan_search_with(spec, &o, diag, out);
}

void xm_plan_result_free(xm_plan_result_t *r) {
  if (!r) return;
  free(r->cands);
  r->cands = NULL;
  r->num = r->num_legal = r->num_fit = 0;
  r->chosen = -1;
}

/* ---- model family -------------------------------------------------------- */

/* Nearest positive multiple of q to v (at least q). */
static int64_t round_multiple(double v, int64_t q) {
  int64_t n = (int64_t)llround(v / (double)q);
  return (n < 1 ? 1 : n) * q;
}

static int64_t gcd64(int64_t a, int64_t b) {
  while (b) {
    int64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

xm_status_t xm_plan_family_member(const xm_spec_t *base, double scale, xm_spec_t *out) {
  *out = *base;
  if (!(scale > 0) || !isfinite(scale)) return XM_ERR_INVALID_INPUT;
  if (scale == 1.0) return XM_OK;
  out->parallel.present = false; /* the family is planned, not laid out */
  double r = cbrt(scale);
  xm_model_spec_t *m = &out->model;
  xm_moe_spec_t *e = &out->moe;
  const xm_model_spec_t *bm = &base->model;
  const xm_moe_spec_t *be = &base->moe;

  /* Heads grow by r in steps that keep the GQA ratio and (when the spec
   * has it) divisibility by 8, so TP inside an 8-rank node stays legal;
   * hidden keeps its ratio to heads. */
  int64_t group = bm->kv_heads > 0 && bm->heads % bm->kv_heads == 0 ? bm->heads / bm->kv_heads : 1;
  int64_t unit = bm->kv_heads % 8 == 0 ? 8 : (bm->kv_heads % 4 == 0 ? 4 : 1);
  m->heads = round_multiple((double)bm->heads * r, group * unit);
  m->kv_heads = m->heads / group;
  if (bm->hidden % bm->heads == 0)
    m->hidden = bm->hidden / bm->heads * m->heads;
  else
    m->hidden = round_multiple((double)bm->hidden * (double)m->heads / (double)bm->heads, 64);
  double h_ratio = (double)m->hidden / (double)bm->hidden;
  if (bm->dense_ffn > 0) m->dense_ffn = round_multiple((double)bm->dense_ffn * h_ratio, 128);

  /* MoE layers grow by r; the leading dense layers stay. */
  int64_t moe_layers = bm->layers - bm->first_k_dense;
  if (moe_layers > 0)
    m->layers = bm->first_k_dense + (int64_t)fmax(1.0, (double)llround((double)moe_layers * r));
  else
    m->layers = (int64_t)fmax(1.0, (double)llround((double)bm->layers * r));

  /* Routed experts grow by r, rounded to three significant bits (4, 5, 6
   * or 7 times a power of two), so that they keep a large power-of-two
   * factor and EP degrees up to a quarter of them still divide a
   * power-of-two world; and to a multiple of n_group. Each expert keeps its
   * width; top_k stays. */
  if (be->experts > 0) {
    double v = (double)be->experts * r;
    int64_t q = 1;
    while ((double)(q * 8) <= v)
      q *= 2;
    if (be->n_group > 1) q = q / gcd64(q, be->n_group) * be->n_group;
    int64_t experts = round_multiple(v, q);
    while (experts < be->top_k)
      experts += q;
    if (be->n_group > 1)
      while (be->top_k > be->topk_group * (experts / be->n_group))
        experts += q;
    e->experts = experts;
  }

  xm_diag_t d;
  xm_diag_init(&d);
  xm_spec_validate(out, NULL, &d);
  bool ok = xm_diag_error_count(&d) == 0;
  xm_diag_free(&d);
  return ok ? XM_OK : XM_ERR_INVALID_INPUT;
}

/* ---- largest model --------------------------------------------------------- */

/* Searches the member at `scale`; *fits says whether some candidate fits,
 * `best` gets the chosen (or smallest-shortfall) candidate. */
static xm_status_t try_scale(const xm_spec_t *spec, xm_policy_t policy, double scale,
                             xm_diag_t *diag, bool *fits, xm_plan_candidate_t *best,
                             xm_spec_t *member) {
  xm_status_t st = xm_plan_family_member(spec, scale, member);
  if (st != XM_OK) {
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL,
                "the member of the model family at scale %g is not a valid spec", scale);
    return st;
  }
  xm_plan_result_t r;
  XM_RETURN_IF_ERROR(xm_plan_search(member, policy, diag, &r));
  *fits = r.chosen >= 0;
  if (r.num > 0)
    *best = r.cands[0];
  else
    memset(best, 0, sizeof *best);
  xm_plan_result_free(&r);
  return XM_OK;
}

/* Members are the same model when the rounding gives the same shape. */
static bool same_member(const xm_spec_t *a, const xm_spec_t *b) {
  return a->model.hidden == b->model.hidden && a->model.layers == b->model.layers &&
         a->moe.experts == b->moe.experts && a->model.heads == b->model.heads;
}

xm_status_t xm_plan_max_model(const xm_spec_t *spec, xm_policy_t policy, xm_diag_t *diag,
                              xm_plan_max_t *out) {
  const double min_scale = 1.0 / 4096.0, max_scale = 4096.0;
  memset(out, 0, sizeof *out);
  out->policy = policy;
  xm_spec_t member, lo_member, hi_member;
  xm_plan_candidate_t cand, lo_best, hi_best;
  memset(&hi_best, 0, sizeof hi_best);
  bool fits = false;
  double lo = 1.0, hi = 1.0;
  XM_RETURN_IF_ERROR(try_scale(spec, policy, 1.0, diag, &fits, &cand, &member));
  if (fits) {
    /* Double until a member does not fit. */
    lo_best = cand;
    lo_member = member;
    for (hi = 2.0; hi <= max_scale; hi *= 2.0) {
      XM_RETURN_IF_ERROR(try_scale(spec, policy, hi, diag, &fits, &cand, &hi_member));
      if (!fits) {
        hi_best = cand;
        break;
      }
      lo = hi;
      lo_best = cand;
      lo_member = hi_member;
    }
    if (hi > max_scale) {
      /* Everything up to the bound fits: report the bound. */
      out->scale = lo;
      out->best = lo_best;
      xm_count_t c;
      xm_count_params(&lo_member, &c);
      out->params = c.total;
      return XM_OK;
    }
  } else {
    /* Halve until a member fits. */
    hi_member = member;
    hi_best = cand;
    for (lo = 0.5; lo >= min_scale; lo *= 0.5) {
      XM_RETURN_IF_ERROR(try_scale(spec, policy, lo, diag, &fits, &cand, &lo_member));
      if (fits) break;
      hi = lo;
      hi_member = lo_member;
      hi_best = cand;
    }
    if (!fits) {
      out->scale = 0;
      out->params = 0;
      out->best = cand;
      return XM_OK;
    }
    lo_best = cand;
  }
  /* Bisect log(scale) between lo (fits) and hi (does not) to 1%. */
  while (hi / lo > 1.01 && !same_member(&lo_member, &hi_member)) {
    double mid = sqrt(lo * hi);
    XM_RETURN_IF_ERROR(try_scale(spec, policy, mid, diag, &fits, &cand, &member));
    if (fits) {
      lo = mid;
      lo_best = cand;
      lo_member = member;
    } else {
      hi = mid;
      hi_member = member;
      hi_best = cand;
    }
  }
  out->scale = lo;
  out->best = lo_best;
  xm_count_t c;
  xm_count_params(&lo_member, &c);
  out->params = c.total;
  out->limit_scale = hi;
  out->limit = hi_best;
  xm_count_params(&hi_member, &c);
  out->limit_params = c.total;
  return XM_OK;
}
