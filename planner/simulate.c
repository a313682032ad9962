/* planner/simulate.c — a plan's step on a topology (planner/simulate.h). */
#include "planner/simulate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fabric/analytic.h"
#include "fabric/collective.h"
#include "fabric/flow.h"
#include "fabric/ocs.h"
#include "fabric/sim.h"
#include "fabric/traffic.h"
#include "frontend/layout.h"

const char *xm_sim_engine_name(xm_sim_engine_t e) {
  return e == XM_SIM_ANALYTIC ? "analytic" : "simgrid";
}

static xm_fab_coll_t fab_kind(xm_net_coll_t k) {
  switch (k) {
  case XM_NET_ALL_REDUCE: return XM_FAB_ALL_REDUCE;
  case XM_NET_ALL_GATHER: return XM_FAB_ALL_GATHER;
  case XM_NET_REDUCE_SCATTER: return XM_FAB_REDUCE_SCATTER;
  case XM_NET_ZERO_REDUCE_SCATTER: return XM_FAB_ZERO_REDUCE_SCATTER;
  case XM_NET_ZERO_ALL_GATHER: return XM_FAB_ZERO_ALL_GATHER;
  }
  return XM_FAB_ALL_REDUCE;
}

/* An all-to-all over g in which every member sends `intra` bytes spread
 * evenly over the peers of its server and `inter` over the others. */
static xm_status_t a2a_split(xm_fab_phase_t *p, xm_fab_group_t g, int64_t rpn, double intra,
                             double inter) {
  for (int64_t i = 0; i < g.size; i++) {
    int64_t r = xm_fab_group_member(g, i), same = 0;
    for (int64_t j = 0; j < g.size; j++)
      same += j != i && xm_fab_group_member(g, j) / rpn == r / rpn;
    int64_t other = g.size - 1 - same;
    for (int64_t j = 0; j < g.size; j++) {
      if (j == i) continue;
      int64_t q = xm_fab_group_member(g, j);
      bool near = q / rpn == r / rpn;
      double b = near ? (same ? intra / (double)same : 0) : (other ? inter / (double)other : 0);
      XM_RETURN_IF_ERROR(xm_fab_phase_add(p, r, q, b));
    }
  }
  /* One message per peer (planner/network.h counts an all-to-all so). */
  if (p->num_flows > 0 && p->latency_steps < (double)(g.size - 1))
    p->latency_steps = (double)(g.size - 1);
  return XM_OK;
}

/* The phase of one recorded collective: every group of it at once. */
static xm_status_t build_phase(const xm_cost_coll_t *x, int64_t rpn, xm_fab_phase_t *p) {
  /* The layers' collectives carry layer 0 (all layers alike), the step's -1. */
  bool step = x->category == XM_COST_COMM_REDUCE || x->category == XM_COST_COMM_GATHER;
  xm_fab_phase_init(p, x->phase, step ? -1 : 0);
  for (int64_t j = 0; j < x->outer_n; j++)
    for (int64_t i = 0; i < x->inner_n; i++) {
      xm_fab_group_t g = {
          .first = i * x->inner_step + j * x->outer_step, .stride = x->stride, .size = x->size};
      xm_status_t st = x->all_to_all ? a2a_split(p, g, rpn, x->intra, x->inter)
                                     : xm_fab_ring(p, fab_kind(x->kind), g, x->bytes);
      if (st != XM_OK) return st;
    }
  return XM_OK;
}

/* The phases of one step, each with its calls per step and the cost
 * model's category. */
typedef struct {
  xm_fab_phase_t *ph;
  double *calls;
  xm_cost_comm_t *cat;
  int64_t n, cap;
} steplist_t;

static xm_fab_phase_t *steplist_add(steplist_t *l, double calls, xm_cost_comm_t cat) {
  if (l->n == l->cap) {
    int64_t cap = l->cap ? 2 * l->cap : 32;
    xm_fab_phase_t *ph = realloc(l->ph, (size_t)cap * sizeof *ph);
    if (ph) l->ph = ph;
    double *c = realloc(l->calls, (size_t)cap * sizeof *c);
    if (c) l->calls = c;
    xm_cost_comm_t *k = realloc(l->cat, (size_t)cap * sizeof *k);
    if (k) l->cat = k;
    if (!ph || !c || !k) return NULL;
    l->cap = cap;
  }
  l->calls[l->n] = calls;
  l->cat[l->n] = cat;
  memset(&l->ph[l->n], 0, sizeof l->ph[l->n]);
  return &l->ph[l->n++];
}

static void steplist_free(steplist_t *l) {
  for (int64_t k = 0; k < l->n; k++)
    xm_fab_phase_free(&l->ph[k]);
  free(l->ph);
  free(l->calls);
  free(l->cat);
  memset(l, 0, sizeof *l);
}

/* regional-ocs: the circuits of each phase (the rules in
 * planner/simulate.h). Classes of phases share one assignment, planned
 * from their demand weighted by their calls: every phase (per iteration),
 * or the phases of one layer value (per layer; -1 the step's). */
static xm_status_t plan_circuits(const xm_fab_topo_t *t, steplist_t *l, int64_t lmoe, int64_t G,
                                 xm_sim_result_t *out) {
  bool per_layer = t->reconfig_per_layer;
  int64_t S = t->servers;
  double *d = calloc((size_t)(S * S), sizeof *d), *one = calloc((size_t)(S * S), sizeof *one);
  bool *done = calloc((size_t)(l->n ? l->n : 1), sizeof *done);
  xm_status_t st = d && one && done ? XM_OK : XM_ERR_NO_MEMORY;
  for (int64_t k0 = 0; st == XM_OK && k0 < l->n; k0++) {
    if (done[k0]) continue;
    int64_t layer = l->ph[k0].layer;
    memset(d, 0, (size_t)(S * S) * sizeof *d);
    for (int64_t k = k0; st == XM_OK && k < l->n; k++) {
      if (per_layer && l->ph[k].layer != layer) continue;
      memset(one, 0, (size_t)(S * S) * sizeof *one);
      st = xm_fab_server_demand(&l->ph[k], S, t->ranks_per_server, one);
      for (int64_t e = 0; st == XM_OK && e < S * S; e++)
        d[e] += l->calls[k] * one[e];
    }
    xm_fab_circuit_t *set = NULL;
    int64_t nset = 0;
    if (st == XM_OK) st = xm_fab_ocs_assign(t, d, &set, &nset);
    for (int64_t k = k0; st == XM_OK && k < l->n; k++) {
      if (per_layer && l->ph[k].layer != layer) continue;
      done[k] = true;
      if (nset == 0) continue;
      l->ph[k].circuits = malloc((size_t)nset * sizeof *set);
      if (!l->ph[k].circuits) {
        st = XM_ERR_NO_MEMORY;
        break;
      }
      memcpy(l->ph[k].circuits, set, (size_t)nset * sizeof *set);
      l->ph[k].num_circuits = nset;
    }
    out->circuits += nset;
    free(set);
  }
  free(d);
  free(one);
  free(done);
  /* Nothing to reconfigure without circuits (a step with no inter-node
   * demand inside a region). */
  if (st == XM_OK && out->circuits > 0) {
    out->reconfigurations = per_layer ? 2 * lmoe * G + 1 : 1;
    out->reconfig_s = (double)out->reconfigurations * t->reconfig_s;
  }
  return st;
}

static int64_t moe_layers(const xm_spec_t *s) {
  int64_t n = 0;
  for (int64_t i = 0; i < s->model.layers + s->model.mtp_layers; i++)
    n += xm_spec_layer_is_moe(s, i < s->model.layers ? i : s->model.layers - 1);
  return n;
}

static xm_status_t check_topology(const xm_cluster_spec_t *c, const xm_fab_topo_t *t,
                                  xm_diag_t *diag) {
  if (t->servers == c->nodes && t->ranks_per_server == c->ranks_per_node) return XM_OK;
  xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL,
              "the topology has %lld servers of %lld ranks, the cluster %lld nodes of %lld",
              (long long)t->servers, (long long)t->ranks_per_server, (long long)c->nodes,
              (long long)c->ranks_per_node);
  return XM_ERR_INVALID_INPUT;
}

static xm_status_t run_engine(const xm_fab_topo_t *t, const xm_fab_phase_t *ph, int64_t n,
                              xm_sim_engine_t engine, double *secs, xm_diag_t *diag) {
  if (n == 0) return XM_OK;
  if (engine == XM_SIM_SIMGRID) return xm_fab_simulate(t, ph, n, secs, diag);
  double total;
  xm_status_t st = xm_fab_analytic(t, ph, n, secs, &total);
  if (st != XM_OK)
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL, "the closed forms refused the step's phases");
  return st;
}

static void add_bytes(const xm_fab_phase_t *p, int64_t rpn, double calls, xm_sim_result_t *out) {
  for (int64_t f = 0; f < p->num_flows; f++) {
    const xm_fab_flow_t *w = &p->flows[f];
    bool inter = w->src / rpn != w->dst / rpn;
    *(inter ? &out->inter_bytes : &out->intra_bytes) += calls * w->bytes;
  }
}

/* The cost model's step of `point` on the cluster (and its collectives
 * when `colls` is given), after checking that t is the cluster's. */
static xm_status_t cost_step(const xm_spec_t *spec, const xm_cost_point_t *point,
                             const xm_cost_routing_t *routing, const xm_fab_topo_t *t,
                             xm_cost_t *cost, xm_cost_colls_t *colls, xm_diag_t *diag) {
  XM_RETURN_IF_ERROR(check_topology(&spec->cluster, t, diag));
  xm_net_t net;
  double dev, peak, eff;
  xm_cost_cluster(&spec->cluster, &net, &dev, &peak, &eff);
  return xm_cost_collectives(spec, &net, dev, peak, eff, point, routing, diag, cost, colls);
}

/* The cost model's own figures and the compute side of the step. */
static void fill_model(const xm_cost_t *cost, xm_sim_result_t *out) {
  out->compute_s = cost->t_compute + cost->t_optimizer;
  out->model_dispatch_s = cost->t_dispatch;
  out->model_tp_s = cost->t_tp;
  out->model_dp_s = cost->t_dp;
  out->model_step_s = cost->t_step;
}

xm_status_t xm_plan_simulate_phases(const xm_spec_t *spec, const xm_cost_point_t *point,
                                    const xm_fab_topo_t *t, xm_sim_engine_t engine,
                                    xm_fab_phase_t *phases, int64_t n, xm_diag_t *diag,
                                    xm_sim_result_t *out) {
  memset(out, 0, sizeof *out);
  const xm_cluster_spec_t *c = &spec->cluster;
  xm_cost_t cost;
  XM_RETURN_IF_ERROR(cost_step(spec, point, NULL, t, &cost, NULL, diag));
  if (t->kind == XM_FAB_REGIONAL_OCS) XM_RETURN_IF_ERROR(xm_fab_ocs_plan(t, phases, n, NULL, 0));
  double *secs = calloc((size_t)(n ? n : 1), sizeof *secs);
  if (!secs) return XM_ERR_NO_MEMORY;
  xm_status_t st = run_engine(t, phases, n, engine, secs, diag);
  for (int64_t k = 0; st == XM_OK && k < n; k++) {
    const char *ph = phases[k].name;
    bool a2a = !strcmp(ph, "dispatch") || !strcmp(ph, "combine") || !strcmp(ph, "other");
    *(a2a ? &out->dispatch_s : &out->tp_s) += secs[k];
    if (phases[k].reconfigure) out->reconfigurations++;
    add_bytes(&phases[k], c->ranks_per_node, 1, out);
    if (phases[k].num_circuits > out->circuits) out->circuits = phases[k].num_circuits;
  }
  free(secs);
  if (st != XM_OK) return st;
  out->phases = n;
  out->reconfig_s = (double)out->reconfigurations * t->reconfig_s; /* inside the phases' times */
  fill_model(&cost, out);
  out->comm_s = out->dispatch_s + out->tp_s;
  out->iteration_s = out->compute_s + out->comm_s;
  return XM_OK;
}

/* Distinct synthetic layer patterns: each stands for its share of the MoE
 * layers (docs/fabric.md, "A plan on a topology"). */
#define SYNTH_PATTERNS 8

/* The expert all-to-all record x as `np` phases of synthetic routing, one
 * per layer pattern, each carrying the record's bytes per call in the
 * pattern of its forward dispatch matrix (or of its transpose, for the
 * movements along the combine path). */
static xm_status_t synth_phases(const xm_cost_coll_t *x, const xm_fab_matrix_t *pat, int64_t np,
                                const double *share, steplist_t *l) {
  int64_t W = x->inner_n * x->outer_n * x->size;
  double per_call = (double)W * (x->intra + x->inter);
  bool back = strcmp(x->phase, "combine") == 0;
  for (int64_t p = 0; p < np; p++) {
    double total = xm_fab_matrix_total(&pat[p]);
    xm_fab_phase_t *ph = steplist_add(l, x->calls * share[p], x->category);
    if (!ph) return XM_ERR_NO_MEMORY;
    xm_fab_phase_init(ph, x->phase, p);
    if (!(total > 0)) continue;
    double scale = per_call / total;
    for (int64_t i = 0; i < W; i++)
      for (int64_t j = 0; j < W; j++) {
        double b = back ? pat[p].v[j * W + i] : pat[p].v[i * W + j];
        XM_RETURN_IF_ERROR(xm_fab_phase_add(ph, i, j, b * scale));
      }
    ph->latency_steps = (double)(x->size - 1);
  }
  return XM_OK;
}

/* The forward dispatch pattern of `np` layer patterns of the routing r. */
static xm_status_t synth_patterns(const xm_spec_t *spec, const xm_cost_point_t *pt,
                                  const xm_sim_routing_t *r, xm_fab_matrix_t *pat, int64_t np,
                                  xm_diag_t *diag) {
  const xm_cluster_spec_t *c = &spec->cluster;
  for (int64_t p = 0; p < np; p++) {
    xm_fab_synth_t s = {.world = c->nodes * c->ranks_per_node,
                        .ranks_per_server = c->ranks_per_node,
                        .ep = pt->layout.ep,
                        .experts = spec->moe.experts,
                        .top_k = spec->moe.top_k,
                        .hidden = spec->model.hidden,
                        .tokens = 1024, /* the pattern only: scaled to the cost model's bytes */
                        .bytes_per_element = 4,
                        .rbd = xm_layout_rbd_active(&pt->layout),
                        .zipf = r->zipf,
                        .locality = r->locality,
                        .affinity_experts = r->affinity_experts,
                        .affinity_scattered = r->affinity_scattered,
                        .source_affinity = r->source_affinity,
                        .seed = r->seed,
                        .layer = p};
    xm_fab_synth_result_t res;
    memset(&res, 0, sizeof res);
    XM_RETURN_IF_ERROR(xm_fab_synth(&s, &res, diag));
    pat[p] = res.dispatch;
    memset(&res.dispatch, 0, sizeof res.dispatch);
    xm_fab_synth_result_free(&res);
  }
  return XM_OK;
}

/* How local the step's expert traffic is: its dispatch-path phases summed
 * (weighted by their calls) into one rank matrix; and how much the layer
 * patterns differ from one to the next. */
static xm_status_t step_locality(const xm_fab_topo_t *t, const steplist_t *l,
                                 const xm_fab_matrix_t *pat, int64_t np, xm_sim_result_t *out) {
  int64_t W = t->servers * t->ranks_per_server;
  if (W > XM_FAB_MATRIX_MAX) return XM_OK; /* left out: out->locality_ranks stays 0 */
  xm_fab_matrix_t m;
  XM_RETURN_IF_ERROR(xm_fab_matrix_init(&m, W));
  for (int64_t k = 0; k < l->n; k++) {
    if (l->cat[k] != XM_COST_COMM_DISPATCH || strcmp(l->ph[k].name, "dispatch") != 0) continue;
    for (int64_t f = 0; f < l->ph[k].num_flows; f++) {
      const xm_fab_flow_t *w = &l->ph[k].flows[f];
      m.v[w->src * W + w->dst] += l->calls[k] * w->bytes;
    }
  }
  int64_t region = t->region_servers > 0 ? t->region_servers : 0;
  xm_status_t st = xm_fab_locality(&m, t->ranks_per_server, region, &out->locality);
  if (st == XM_OK) {
    out->locality_ranks = W;
    out->top5_pairs_share = xm_fab_top_pairs_share(&m, t->ranks_per_server,
                                                   xm_fab_pairs_for_fraction(t->servers, 0.05));
    double tvd = 0;
    for (int64_t p = 1; p < np; p++)
      tvd += xm_fab_matrix_tvd(&pat[p - 1], &pat[p]);
    out->layer_tvd = np > 1 ? tvd / (double)(np - 1) : 0;
  }
  xm_fab_matrix_free(&m);
  return st;
}

xm_status_t xm_plan_simulate(const xm_spec_t *spec, const xm_cost_point_t *point,
                             const xm_cost_routing_t *routing, const xm_sim_routing_t *synth,
                             const xm_fab_topo_t *t, xm_sim_engine_t engine, xm_diag_t *diag,
                             xm_sim_result_t *out) {
  memset(out, 0, sizeof *out);
  const xm_cluster_spec_t *c = &spec->cluster;
  xm_cost_t cost;
  xm_cost_colls_t cl;
  memset(&cl, 0, sizeof cl);
  XM_RETURN_IF_ERROR(cost_step(spec, point, routing, t, &cost, &cl, diag));
  int64_t lmoe = moe_layers(spec);
  int64_t np = synth ? (lmoe < SYNTH_PATTERNS ? lmoe : SYNTH_PATTERNS) : 0;
  xm_fab_matrix_t pat[SYNTH_PATTERNS];
  double share[SYNTH_PATTERNS];
  memset(pat, 0, sizeof pat);
  xm_status_t st = XM_OK;
  if (synth && point->policy != XM_POLICY_XMOEC) {
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL,
                "synthetic routing is laid out on xmoec's EP groups (consecutive ranks); the "
                "point is %s's",
                xm_policy_name(point->policy));
    st = XM_ERR_INVALID_INPUT;
  }
  if (st == XM_OK && np > 0) st = synth_patterns(spec, point, synth, pat, np, diag);
  for (int64_t p = 0; p < np; p++) /* layer i takes pattern i mod np */
    share[p] = (double)((lmoe - p + np - 1) / np) / (double)lmoe;
  steplist_t l;
  memset(&l, 0, sizeof l);
  for (int64_t k = 0; st == XM_OK && k < cl.n; k++) {
    const xm_cost_coll_t *x = &cl.v[k];
    if (np > 0 && x->category == XM_COST_COMM_DISPATCH) {
      st = synth_phases(x, pat, np, share, &l);
      continue;
    }
    xm_fab_phase_t *ph = steplist_add(&l, x->calls, x->category);
    st = ph ? build_phase(x, c->ranks_per_node, ph) : XM_ERR_NO_MEMORY;
  }
  if (st == XM_OK && t->kind == XM_FAB_REGIONAL_OCS)
    st = plan_circuits(t, &l, lmoe, cost.grad_accum, out);
  double *secs = st == XM_OK ? calloc((size_t)(l.n ? l.n : 1), sizeof *secs) : NULL;
  if (st == XM_OK && !secs) st = XM_ERR_NO_MEMORY;
  if (st == XM_OK) st = run_engine(t, l.ph, l.n, engine, secs, diag);
  for (int64_t k = 0; st == XM_OK && k < l.n; k++) {
    double sec = l.calls[k] * secs[k];
    switch (l.cat[k]) {
    case XM_COST_COMM_DISPATCH: out->dispatch_s += sec; break;
    case XM_COST_COMM_TP: out->tp_s += sec; break;
    case XM_COST_COMM_REDUCE: out->reduce_s += sec; break;
    default: out->gather_s += sec; break;
    }
    add_bytes(&l.ph[k], c->ranks_per_node, l.calls[k], out);
  }
  if (st == XM_OK) st = step_locality(t, &l, pat, np, out);
  if (st == XM_OK) {
    out->phases = l.n;
    fill_model(&cost, out);
    out->reduce_exposed_s =
        out->reduce_s > cost.t_overlap_window ? out->reduce_s - cost.t_overlap_window : 0;
    out->comm_s =
        out->dispatch_s + out->tp_s + out->reduce_exposed_s + out->gather_s + out->reconfig_s;
    out->iteration_s = out->compute_s + out->comm_s;
  }
  for (int64_t p = 0; p < np; p++)
    xm_fab_matrix_free(&pat[p]);
  free(secs);
  steplist_free(&l);
  xm_cost_colls_free(&cl);
  return st;
}
