/* tools/xmoec/cmd_fabric.c — `xmoec fabric`: what a network topology costs
 * and gains for a model (docs/fabric.md, "The fabric command").
 *
 *   xmoec fabric --model MODEL --cluster FILE [--topology T]... [--link-gbps G]
 *                [--engine simgrid|analytic] [--prices FILE] [--json]
 *   xmoec fabric --collective KIND --bytes B --cluster FILE --topology T
 *                [--link-gbps G] [--engine simgrid|analytic] [--json]
 *
 * The first form times one training step of the model's plan (the spec's
 * parallel section, else the layout `xmoec plan` chooses) on each topology
 * (planner/simulate.h), prices each network (fabric/price.h) and reports
 * the performance per unit of cost relative to the non-blocking fat-tree.
 * The second times one collective over every rank of the cluster.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "fabric/analytic.h"
#include "fabric/collective.h"
#include "fabric/ocs.h"
#include "fabric/price.h"
#include "fabric/sim.h"
#include "fabric/topology.h"
#include "fabric/traffic.h"
#include "frontend/layout.h"
#include "frontend/spec.h"
#include "planner/plan.h"
#include "planner/simulate.h"
#include "support/diag.h"
#include "tools/xmoec/args.h"
#include "tools/xmoec/commands.h"
#include "tools/xmoec/json_out.h"

#define CMD "xmoec fabric"

typedef enum { COLL_NONE = -1, COLL_A2A = XM_FAB_COLL_COUNT_ } coll_sel_t;

typedef struct {
  const char *model, *cluster, *prices, *traffic;
  xm_fab_kind_t kinds[XM_FAB_KIND_COUNT_];
  int nkinds;
  double link_gbps; /* 0: the cluster's */
  xm_sim_engine_t engine;
  int coll; /* COLL_NONE, COLL_A2A or an xm_fab_coll_t */
  double bytes;
  bool json, help;
  int64_t global_batch; /* 0: the spec's */
  bool synth;           /* a routing statistic was given: synthetic expert traffic */
  xm_sim_routing_t routing;
} fabric_args_t;

static void usage(FILE *out) {
  fprintf(out,
          "usage: xmoec fabric --model MODEL --cluster FILE [--topology T]... [--link-gbps G]\n"
          "                    [--engine simgrid|analytic] [--prices FILE] [--traffic FILE]\n"
          "                    [--zipf A] [--locality L] [--source-affinity S]\n"
          "                    [--affinity-experts N] [--scattered] [--seed N]\n"
          "                    [--global-batch N] [--json]\n"
          "       xmoec fabric --collective KIND --bytes B --cluster FILE --topology T\n"
          "                    [--link-gbps G] [--engine simgrid|analytic] [--json]\n"
          "\n"
          "Times one training step of MODEL's plan (its \"parallel\" section, else the layout\n"
          "`xmoec plan` chooses) on each network topology, split into compute and the\n"
          "communication phases, prices each network and gives its performance per unit of\n"
          "cost relative to the non-blocking fat-tree. With --collective, the time of one\n"
          "collective over every rank of the cluster. docs/fabric.md has the models.\n"
          "\n"
          "  --model MODEL       model spec or Hugging Face config.json\n"
          "  --cluster FILE      the cluster (nodes, ranks, bandwidths, network fields)\n"
          "  --topology T        fat-tree, fat-tree-oversubscribed, dragonfly or regional-ocs;\n"
          "                      repeat it for several (default: all four)\n"
          "  --link-gbps G       NIC port speed in Gb/s instead of the cluster's\n"
          "  --engine E          simgrid (flow-level simulation, the default) or analytic\n"
          "                      (the closed forms the planner's search uses)\n"
          "  --prices FILE       a price file over the built-in table (docs/fabric-prices.md)\n"
          "  --traffic FILE      a run's out/train --traffic file: its last step's matrices\n"
          "                      are the communication instead of the cost model's\n"
          "  --zipf A            synthetic expert routing instead of uniform: popularity skew\n"
          "  --locality L        share of tokens routed inside one affinity group of experts\n"
          "  --source-affinity S of those, the share to their node's home group\n"
          "  --affinity-experts N  experts per affinity group (default: one node's)\n"
          "  --scattered         affinity groups of scattered expert ids\n"
          "  --seed N            seed of the synthetic routing (default 0)\n"
          "  --global-batch N    sequences per optimizer step (overrides the spec's)\n"
          "  --collective KIND   all_to_all, all_reduce, all_gather or reduce_scatter\n"
          "  --bytes B           all_to_all: what each rank sends in all (spread evenly over\n"
          "                      the others); all_reduce: the buffer; all_gather: what each\n"
          "                      rank contributes; reduce_scatter: the slice each rank keeps\n"
          "  --json              one JSON document on stdout (docs/fabric.md)\n");
}

static const xm_flag_t k_flags[] = {{"--model", true},
                                    {"--cluster", true},
                                    {"--topology", true},
                                    {"--link-gbps", true},
                                    {"--engine", true},
                                    {"--prices", true},
                                    {"--collective", true},
                                    {"--bytes", true},
                                    {"--json", false},
                                    {"--traffic", true},
                                    {"--zipf", true},
                                    {"--locality", true},
                                    {"--source-affinity", true},
                                    {"--affinity-experts", true},
                                    {"--scattered", false},
                                    {"--seed", true},
                                    {"--global-batch", true},
                                    {NULL, false}};
static const char *const k_repeatable[] = {"--topology", NULL};

static bool parse_number(const char *s, double lo, double hi, double *out) {
  char *end = NULL;
  double v = s && s[0] ? strtod(s, &end) : NAN;
  if (!end || *end || !isfinite(v) || v < lo || v > hi) return false;
  *out = v;
  return true;
}

static int parse_args(int argc, char **argv, fabric_args_t *a) {
  if (xm_args_check_repeat("fabric", argc, argv, k_flags, k_repeatable)) return 2;
  memset(a, 0, sizeof *a);
  a->coll = COLL_NONE;
  a->engine = XM_SIM_SIMGRID;
  for (int i = 0; i < argc; i++) {
    bool missing = false;
    const char *v;
    const char *arg = argv[i];
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
      a->help = true;
      return 0;
    } else if (strcmp(arg, "--json") == 0) {
      a->json = true;
    } else if (strcmp(arg, "--scattered") == 0) {
      a->routing.affinity_scattered = a->synth = true;
    } else if ((v = xm_arg_value(argc, argv, &i, "--zipf", &missing))) {
      if (!parse_number(v, 0, 16, &a->routing.zipf)) {
        fprintf(stderr, CMD ": error: --zipf needs a number in [0, 16], got '%s'\n", v);
        return 2;
      }
      a->synth = true;
    } else if ((v = xm_arg_value(argc, argv, &i, "--locality", &missing))) {
      if (!parse_number(v, 0, 1, &a->routing.locality)) {
        fprintf(stderr, CMD ": error: --locality needs a number in [0, 1], got '%s'\n", v);
        return 2;
      }
      a->synth = true;
    } else if ((v = xm_arg_value(argc, argv, &i, "--source-affinity", &missing))) {
      if (!parse_number(v, 0, 1, &a->routing.source_affinity)) {
        fprintf(stderr, CMD ": error: --source-affinity needs a number in [0, 1], got '%s'\n", v);
        return 2;
      }
      a->synth = true;
    } else if ((v = xm_arg_value(argc, argv, &i, "--affinity-experts", &missing))) {
      if (!xm_arg_int(v, 1, 1 << 14, &a->routing.affinity_experts)) {
        fprintf(stderr,
                CMD ": error: --affinity-experts needs an integer in [1, 16384], got '%s'\n", v);
        return 2;
      }
      a->synth = true;
    } else if ((v = xm_arg_value(argc, argv, &i, "--global-batch", &missing))) {
      if (!xm_arg_int(v, 1, (int64_t)1 << 24, &a->global_batch)) {
        fprintf(stderr, CMD ": error: --global-batch needs an integer in [1, 2^24], got '%s'\n", v);
        return 2;
      }
    } else if ((v = xm_arg_value(argc, argv, &i, "--seed", &missing))) {
      int64_t seed;
      if (!xm_arg_int(v, 0, INT64_MAX, &seed)) {
        fprintf(stderr, CMD ": error: --seed needs an integer >= 0, got '%s'\n", v);
        return 2;
      }
      a->routing.seed = (uint64_t)seed;
    } else if ((v = xm_arg_value(argc, argv, &i, "--model", &missing))) {
      a->model = v;
    } else if ((v = xm_arg_value(argc, argv, &i, "--cluster", &missing))) {
      a->cluster = v;
    } else if ((v = xm_arg_value(argc, argv, &i, "--prices", &missing))) {
      a->prices = v;
    } else if ((v = xm_arg_value(argc, argv, &i, "--traffic", &missing))) {
      a->traffic = v;
    } else if ((v = xm_arg_value(argc, argv, &i, "--topology", &missing))) {
      xm_fab_kind_t k;
      if (!xm_fab_kind_parse(v, &k)) {
        fprintf(stderr,
                CMD ": error: --topology: unknown topology '%s'; expected fat-tree, "
                    "fat-tree-oversubscribed, dragonfly or regional-ocs\n",
                v);
        return 2;
      }
      for (int j = 0; j < a->nkinds; j++)
        if (a->kinds[j] == k) {
          fprintf(stderr, CMD ": error: --topology %s given twice\n", v);
          return 2;
        }
      a->kinds[a->nkinds++] = k;
    } else if ((v = xm_arg_value(argc, argv, &i, "--link-gbps", &missing))) {
      if (!parse_number(v, 1e-3, 1e5, &a->link_gbps)) {
        fprintf(stderr, CMD ": error: --link-gbps needs a number in [0.001, 1e5], got '%s'\n", v);
        return 2;
      }
    } else if ((v = xm_arg_value(argc, argv, &i, "--engine", &missing))) {
      if (strcmp(v, "simgrid") == 0)
        a->engine = XM_SIM_SIMGRID;
      else if (strcmp(v, "analytic") == 0)
        a->engine = XM_SIM_ANALYTIC;
      else {
        fprintf(stderr, CMD ": error: --engine: expected simgrid or analytic, got '%s'\n", v);
        return 2;
      }
    } else if ((v = xm_arg_value(argc, argv, &i, "--collective", &missing))) {
      if (strcmp(v, "all_to_all") == 0)
        a->coll = COLL_A2A;
      else if (strcmp(v, "all_reduce") == 0)
        a->coll = XM_FAB_ALL_REDUCE;
      else if (strcmp(v, "all_gather") == 0)
        a->coll = XM_FAB_ALL_GATHER;
      else if (strcmp(v, "reduce_scatter") == 0)
        a->coll = XM_FAB_REDUCE_SCATTER;
      else {
        fprintf(stderr,
                CMD ": error: --collective: expected all_to_all, all_reduce, all_gather or "
                    "reduce_scatter, got '%s'\n",
                v);
        return 2;
      }
    } else if ((v = xm_arg_value(argc, argv, &i, "--bytes", &missing))) {
      if (!parse_number(v, 0, 1e18, &a->bytes)) {
        fprintf(stderr, CMD ": error: --bytes needs a number in [0, 1e18], got '%s'\n", v);
        return 2;
      }
    } else if (missing) {
      fprintf(stderr, CMD ": error: %s needs a value\n", arg);
      return 2;
    } else {
      fprintf(stderr, CMD ": error: unexpected argument '%s' (the model is given with --model)\n",
              arg);
      return 2;
    }
  }
  bool coll = a->coll != COLL_NONE;
  const char *why = NULL;
  if (!a->cluster)
    why = "missing --cluster FILE";
  else if (coll && a->model)
    why = "--collective and --model are two different questions; give one";
  else if (!coll && !a->model)
    why = "missing --model MODEL (or --collective KIND --bytes B)";
  else if (coll && a->nkinds != 1)
    why = "--collective needs exactly one --topology";
  else if (coll && a->global_batch)
    why = "--global-batch goes with --model";
  else if (!coll && a->bytes > 0)
    why = "--bytes goes with --collective";
  else if (coll && a->prices)
    why = "--prices goes with --model";
  else if (coll && a->traffic)
    why = "--traffic goes with --model";
  else if (a->synth && (coll || a->traffic))
    why = "--zipf, --locality, --source-affinity, --affinity-experts and --scattered shape the "
          "model's expert traffic: not with --collective or --traffic";
  if (why) {
    fprintf(stderr, CMD ": error: %s\n", why);
    usage(stderr);
    return 2;
  }
  if (!coll && a->nkinds == 0)
    for (int k = 0; k < XM_FAB_KIND_COUNT_; k++)
      a->kinds[a->nkinds++] = (xm_fab_kind_t)k;
  return 0;
}

static int finish(xm_diag_t *d, xm_status_t st) {
  xm_diag_print(d, stderr);
  xm_diag_free(d);
  return xm_status_exit_code(st);
}

/* ---- one collective --------------------------------------------------------- */

static int run_collective(const fabric_args_t *a) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_spec_t spec;
  memset(&spec, 0, sizeof spec);
  xm_status_t st = xm_spec_load_cluster_file(a->cluster, &d, &spec);
  if (st == XM_OK && xm_diag_error_count(&d) > 0) st = XM_ERR_INVALID_INPUT;
  xm_fab_topo_t t;
  int from = d.count;
  if (st == XM_OK) st = xm_fab_topo_from_cluster(&spec.cluster, a->kinds[0], a->link_gbps, &t, &d);
  xm_diag_name_file(&d, from, a->cluster);
  if (st != XM_OK) return finish(&d, st);
  int64_t P = t.servers * t.ranks_per_server;
  xm_fab_group_t g = {.first = 0, .stride = 1, .size = P};
  xm_fab_phase_t ph;
  const char *name = a->coll == COLL_A2A ? "all_to_all" : xm_fab_coll_phase_name(a->coll);
  xm_fab_phase_init(&ph, name, -1);
  if (a->coll == COLL_A2A)
    st = xm_fab_all_to_all_uniform(&ph, g, P > 1 ? a->bytes / (double)(P - 1) : 0);
  else
    st = xm_fab_ring(&ph, (xm_fab_coll_t)a->coll, g, a->bytes);
  double secs = 0, total = 0;
  if (st == XM_OK && t.kind == XM_FAB_REGIONAL_OCS) st = xm_fab_ocs_plan(&t, &ph, 1, NULL, 0);
  ph.reconfigure = false; /* one collective: the circuits are in place */
  if (st == XM_OK) {
    if (a->engine == XM_SIM_ANALYTIC)
      st = xm_fab_analytic(&t, &ph, 1, &secs, &total);
    else
      st = xm_fab_simulate(&t, &ph, 1, &secs, &d);
  }
  xm_fab_phase_free(&ph);
  if (st != XM_OK) return finish(&d, st);
  xm_diag_print(&d, stderr);
  xm_diag_free(&d);
  if (!a->json) {
    printf("%s of %.17g bytes over %" PRId64 " ranks (%" PRId64 " nodes of %" PRId64
           ") on %s, %g Gb/s ports: %.6g s (%s)\n",
           name, a->bytes, P, t.servers, t.ranks_per_server, xm_fab_kind_name(t.kind),
           t.link_bw * 8 / 1e9, secs, xm_sim_engine_name(a->engine));
    return 0;
  }
  cJSON *root = cJSON_CreateObject();
  cJSON_AddNumberToObject(root, "time_s", secs);
  cJSON_AddStringToObject(root, "collective", name);
  cJSON_AddNumberToObject(root, "bytes", a->bytes);
  cJSON_AddNumberToObject(root, "ranks", (double)P);
  cJSON_AddStringToObject(root, "topology", xm_fab_kind_name(t.kind));
  cJSON_AddNumberToObject(root, "link_gbps", t.link_bw * 8 / 1e9);
  cJSON_AddStringToObject(root, "engine", xm_sim_engine_name(a->engine));
  return xm_print_json("fabric", root);
}

/* ---- a model's step ---------------------------------------------------------- */

typedef struct {
  xm_fab_kind_t kind;
  xm_fab_topo_t topo;
  xm_sim_result_t r;
  xm_fab_bom_t bom;
  xm_fab_price_breakdown_t price;
  double perf_per_cost; /* relative to the fat-tree */
} row_t;

/* --traffic: the phases of the file's last step, one per (layer, phase)
 * record in file order, for a cluster of `world` ranks. */
/* How local a run's dispatch traffic is: its last step's (all layers), how
 * far it is from the step before, and how far consecutive layers of the
 * last step are from each other (total variation; 0 with one of them). */
typedef struct {
  bool valid;
  xm_fab_locality_t loc;
  double top5, layer_tvd, step_tvd;
  int64_t layers;
} measured_t;

static void measured_locality(const xm_fab_traffic_t *tr, int64_t last, int64_t rpn, int64_t region,
                              measured_t *out) {
  memset(out, 0, sizeof *out);
  xm_fab_matrix_t cur, prev;
  memset(&prev, 0, sizeof prev);
  if (xm_fab_traffic_sum(tr, last, -2, XM_RT_PHASE_DISPATCH, &cur) != XM_OK) return;
  if (xm_fab_locality(&cur, rpn, region, &out->loc) == XM_OK) {
    out->valid = true;
    int64_t servers = tr->world / rpn;
    out->top5 = xm_fab_top_pairs_share(&cur, rpn, xm_fab_pairs_for_fraction(servers, 0.05));
  }
  int64_t before = -1;
  for (int64_t i = 0; i < tr->num_records; i++)
    if (tr->records[i].step < last && tr->records[i].step > before) before = tr->records[i].step;
  if (before >= 0 && xm_fab_traffic_sum(tr, before, -2, XM_RT_PHASE_DISPATCH, &prev) == XM_OK)
    out->step_tvd = xm_fab_matrix_tvd(&prev, &cur);
  const xm_fab_matrix_t *pl = NULL;
  double tvd = 0;
  for (int64_t i = 0; i < tr->num_records; i++) {
    const xm_fab_traffic_record_t *r = &tr->records[i];
    if (r->step != last || r->phase != XM_RT_PHASE_DISPATCH || r->layer < 0) continue;
    if (pl) tvd += xm_fab_matrix_tvd(pl, &r->bytes);
    pl = &r->bytes;
    out->layers++;
  }
  out->layer_tvd = out->layers > 1 ? tvd / (double)(out->layers - 1) : 0;
  xm_fab_matrix_free(&cur);
  xm_fab_matrix_free(&prev);
}

static xm_status_t traffic_phases(const char *path, int64_t world, int64_t rpn, int64_t region,
                                  xm_diag_t *d, xm_fab_phase_t **out, int64_t *out_n,
                                  int64_t *out_step, measured_t *loc) {
  xm_fab_traffic_t *tr = NULL;
  XM_RETURN_IF_ERROR(xm_fab_traffic_load_file(path, d, &tr));
  xm_status_t st = XM_OK;
  if (tr->world != world) {
    xm_diag_add(d, XM_DIAG_ERROR, path, "/world",
                "the traffic is of %lld ranks, the cluster has %lld: give the cluster the run "
                "had",
                (long long)tr->world, (long long)world);
    st = XM_ERR_INVALID_INPUT;
  }
  int64_t last = -1, n = 0;
  for (int64_t i = 0; i < tr->num_records; i++)
    if (tr->records[i].step > last) last = tr->records[i].step;
  for (int64_t i = 0; i < tr->num_records; i++)
    n += tr->records[i].step == last;
  xm_fab_phase_t *ph = st == XM_OK ? calloc((size_t)(n ? n : 1), sizeof *ph) : NULL;
  if (st == XM_OK && !ph) st = XM_ERR_NO_MEMORY;
  int64_t k = 0;
  for (int64_t i = 0; st == XM_OK && i < tr->num_records; i++) {
    const xm_fab_traffic_record_t *r = &tr->records[i];
    if (r->step != last) continue;
    xm_fab_phase_t *p = &ph[k++];
    xm_fab_phase_init(p, xm_rt_phase_kind_name(r->phase), r->layer);
    for (int64_t s = 0; st == XM_OK && s < world; s++)
      for (int64_t t = 0; st == XM_OK && t < world; t++)
        st = xm_fab_phase_add(p, s, t, r->bytes.v[s * world + t]);
    /* An all-to-all: one message per peer, the most peers a rank sent to;
     * a ring record sums the step's calls: the rounds of one ring over the
     * world stand for them. */
    bool a2a = r->phase == XM_RT_PHASE_DISPATCH || r->phase == XM_RT_PHASE_COMBINE ||
               r->phase == XM_RT_PHASE_OTHER;
    int64_t peers = 0;
    for (int64_t s = 0; s < world; s++) {
      int64_t c = 0;
      for (int64_t t = 0; t < world; t++)
        c += r->bytes.v[s * world + t] > 0;
      if (c > peers) peers = c;
    }
    p->latency_steps = p->num_flows == 0 ? 0 : a2a ? (double)peers : (double)world - 1;
  }
  if (st == XM_OK) measured_locality(tr, last, rpn, region, loc);
  xm_fab_traffic_free(tr);
  if (st != XM_OK) {
    for (int64_t i = 0; ph && i < k; i++)
      xm_fab_phase_free(&ph[i]);
    free(ph);
    return st;
  }
  *out = ph;
  *out_n = n;
  *out_step = last;
  return XM_OK;
}

/* The point: the spec's parallel section, else the plan's choice. */
static xm_status_t choose_point(const xm_spec_t *spec, xm_cost_point_t *pt, bool *planned,
                                xm_diag_t *d) {
  memset(pt, 0, sizeof *pt);
  pt->policy = XM_POLICY_XMOEC;
  *planned = !spec->parallel.present;
  if (spec->parallel.present) {
    xm_layout_from_spec(spec, &pt->layout);
    XM_RETURN_IF_ERROR(xm_layout_check(spec, &pt->layout, XM_LAYOUT_FROM_SPEC, NULL, d));
    pt->recompute = spec->training.recompute;
    pt->micro_batch = spec->training.micro_batch;
    return XM_OK;
  }
  xm_plan_result_t r;
  XM_RETURN_IF_ERROR(xm_plan_search(spec, XM_POLICY_XMOEC, d, &r));
  if (r.chosen < 0) {
    xm_diag_add(d, XM_DIAG_ERROR, NULL, "/parallel",
                "no layout of the model fits the cluster (xmoec plan says why); give a "
                "\"parallel\" section to time one anyway");
    xm_plan_result_free(&r);
    return XM_ERR_INVALID_INPUT;
  }
  *pt = r.cands[r.chosen].point;
  xm_plan_result_free(&r);
  return XM_OK;
}

static cJSON *json_row(const row_t *w) {
  cJSON *o = cJSON_CreateObject();
  const xm_sim_result_t *r = &w->r;
  cJSON_AddStringToObject(o, "name", xm_fab_kind_name(w->kind));
  cJSON_AddNumberToObject(o, "iteration_s", r->iteration_s);
  cJSON_AddNumberToObject(o, "compute_s", r->compute_s);
  cJSON_AddNumberToObject(o, "comm_s", r->comm_s);
  cJSON *p = cJSON_AddObjectToObject(o, "comm_by_phase");
  cJSON_AddNumberToObject(p, "dispatch_s", r->dispatch_s);
  cJSON_AddNumberToObject(p, "tp_s", r->tp_s);
  cJSON_AddNumberToObject(p, "grad_reduce_s", r->reduce_s);
  cJSON_AddNumberToObject(p, "grad_reduce_exposed_s", r->reduce_exposed_s);
  cJSON_AddNumberToObject(p, "zero_gather_s", r->gather_s);
  cJSON_AddNumberToObject(p, "reconfig_s", r->reconfig_s);
  cJSON_AddNumberToObject(o, "cost", w->price.total);
  cJSON *c = cJSON_AddObjectToObject(o, "cost_by_item");
  cJSON_AddNumberToObject(c, "nic_ports", w->price.nic_ports);
  cJSON_AddNumberToObject(c, "transceivers", w->price.transceivers);
  cJSON_AddNumberToObject(c, "switch_ports", w->price.switch_ports);
  cJSON_AddNumberToObject(c, "switches", w->price.switches);
  cJSON_AddNumberToObject(c, "ocs_ports", w->price.ocs_ports);
  cJSON_AddNumberToObject(c, "ocs_switches", w->price.ocs_switches);
  cJSON_AddNumberToObject(c, "fibres", w->price.fibres);
  cJSON_AddNumberToObject(c, "copper_cables", w->price.copper_cables);
  cJSON_AddNumberToObject(o, "perf_per_cost", w->perf_per_cost);
  cJSON_AddNumberToObject(o, "link_gbps", w->topo.link_bw * 8 / 1e9);
  cJSON_AddNumberToObject(o, "inter_node_bytes", r->inter_bytes);
  cJSON_AddNumberToObject(o, "intra_node_bytes", r->intra_bytes);
  if (w->kind == XM_FAB_REGIONAL_OCS) {
    cJSON *x = cJSON_AddObjectToObject(o, "ocs");
    cJSON_AddNumberToObject(x, "region_servers", (double)w->topo.region_servers);
    cJSON_AddNumberToObject(x, "ocs_ports", (double)w->topo.ocs_ports);
    cJSON_AddNumberToObject(x, "circuits", (double)r->circuits);
    cJSON_AddNumberToObject(x, "reconfigurations", (double)r->reconfigurations);
    cJSON_AddStringToObject(x, "reconfigure", w->topo.reconfig_per_layer ? "layer" : "iteration");
  }
  return o;
}

static void print_text(const xm_spec_t *s, const xm_cost_point_t *pt, bool planned,
                       const row_t *rows, int n, xm_sim_engine_t engine, const measured_t *mloc) {
  char lay[96];
  xm_layout_format(&pt->layout, lay, sizeof lay);
  const xm_cluster_spec_t *c = &s->cluster;
  printf("model: %s on %s (%" PRId64 " nodes x %" PRId64 " ranks), layout %s, recompute %s, "
         "micro-batch %" PRId64 " (%s)\n",
         s->name, c->name[0] ? c->name : "the cluster", c->nodes, c->ranks_per_node, lay,
         xm_recompute_name(pt->recompute), pt->micro_batch,
         planned ? "the plan's choice" : "the spec's parallel section");
  printf("engine: %s; the cost model's own step: %.4g s (communication %.4g s)\n",
         xm_sim_engine_name(engine), rows[0].r.model_step_s,
         rows[0].r.model_dispatch_s + rows[0].r.model_tp_s + rows[0].r.model_dp_s);
  printf("\n%-24s %10s %10s %10s %10s %10s %10s %12s %8s\n", "topology", "step s", "compute",
         "comm", "dispatch", "tp", "dp+zero", "cost $", "perf/$");
  for (int i = 0; i < n; i++) {
    const xm_sim_result_t *r = &rows[i].r;
    printf("%-24s %10.4g %10.4g %10.4g %10.4g %10.4g %10.4g %12.4g %8.3f\n",
           xm_fab_kind_name(rows[i].kind), r->iteration_s, r->compute_s, r->comm_s, r->dispatch_s,
           r->tp_s, r->reduce_exposed_s + r->gather_s, rows[i].price.total, rows[i].perf_per_cost);
    if (rows[i].kind == XM_FAB_REGIONAL_OCS)
      printf("%-24s regions of %" PRId64 " node%s, %" PRId64 " OCS port%s per node, %" PRId64
             " circuit%s, %" PRId64 " reconfiguration%s (%.4g s)\n",
             "", rows[i].topo.region_servers, rows[i].topo.region_servers == 1 ? "" : "s",
             rows[i].topo.ocs_ports, rows[i].topo.ocs_ports == 1 ? "" : "s", r->circuits,
             r->circuits == 1 ? "" : "s", r->reconfigurations, r->reconfigurations == 1 ? "" : "s",
             r->reconfig_s);
  }
  printf("\nperf/$: (1 / step time) / network cost, relative to the non-blocking fat-tree\n");
  const xm_sim_result_t *lr = &rows[0].r;
  for (int i = 0; i < n; i++)
    if (rows[i].kind == XM_FAB_REGIONAL_OCS) lr = &rows[i].r;
  if (mloc && mloc->valid)
    printf("measured expert traffic (dispatch, last step): %.1f%% inside a node, %.1f%% inside "
           "a region, %.1f%% of what crosses nodes on the heaviest 5%% of node pairs; layer to "
           "layer %.3f apart, step to step %.3f (total variation)\n",
           100 * mloc->loc.intra_server, 100 * mloc->loc.intra_region, 100 * mloc->top5,
           mloc->layer_tvd, mloc->step_tvd);
  else if (lr->locality_ranks > 0)
    printf("expert traffic (forward dispatch): %.1f%% inside a node, %.1f%% inside a region, "
           "%.1f%% of what crosses nodes on the heaviest 5%% of node pairs; layer to layer "
           "%.3f apart (total variation)\n",
           100 * lr->locality.intra_server, 100 * lr->locality.intra_region,
           100 * lr->top5_pairs_share, lr->layer_tvd);
}

static int run_model(const fabric_args_t *a) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_spec_t spec;
  xm_status_t st = xm_spec_load_file(a->model, &d, &spec);
  if (st == XM_OK) st = xm_spec_load_cluster_file(a->cluster, &d, &spec);
  if (st == XM_OK && a->global_batch > 0) {
    /* As xmoec plan --global-batch: the plan chooses the micro-batch. */
    spec.training.global_batch = a->global_batch;
    if (a->global_batch % spec.training.micro_batch != 0) spec.training.micro_batch = 1;
    xm_spec_validate(&spec, "--global-batch", &d);
  }
  if (st == XM_OK && xm_diag_error_count(&d) > 0) st = XM_ERR_INVALID_INPUT;
  xm_fab_prices_t prices;
  xm_fab_prices_default(&prices);
  if (st == XM_OK && a->prices) st = xm_fab_prices_load_file(a->prices, &prices, &d);
  xm_cost_point_t pt;
  bool planned = false;
  if (st == XM_OK) st = choose_point(&spec, &pt, &planned, &d);
  xm_fab_phase_t *tph = NULL;
  int64_t ntph = 0, tstep = -1;
  measured_t mloc;
  memset(&mloc, 0, sizeof mloc);
  if (st == XM_OK && a->traffic) {
    /* Regions as regional-ocs would cut them (its default when not set). */
    int64_t region = spec.cluster.ocs_region_servers > 0 ? spec.cluster.ocs_region_servers
                     : spec.cluster.nodes < 16           ? spec.cluster.nodes
                                                         : 16;
    st = traffic_phases(a->traffic, spec.cluster.nodes * spec.cluster.ranks_per_node,
                        spec.cluster.ranks_per_node, region, &d, &tph, &ntph, &tstep, &mloc);
  }
  if (st != XM_OK) return finish(&d, st);
  /* The fat-tree is the reference of perf_per_cost: timed even when not asked. */
  row_t rows[XM_FAB_KIND_COUNT_ + 1], ref;
  int n = a->nkinds, ref_at = -1;
  for (int i = 0; i < n; i++) {
    rows[i].kind = a->kinds[i];
    if (a->kinds[i] == XM_FAB_FAT_TREE) ref_at = i;
  }
  if (ref_at < 0) rows[n].kind = XM_FAB_FAT_TREE;
  int total = n + (ref_at < 0);
  for (int i = 0; i < total && st == XM_OK; i++) {
    row_t *w = &rows[i];
    if (!a->json && !xm_diag_error_count(&d))
      fprintf(stderr, "fabric: %s ...\n", xm_fab_kind_name(w->kind));
    int from = d.count;
    st = xm_fab_topo_from_cluster(&spec.cluster, w->kind, a->link_gbps, &w->topo, &d);
    xm_diag_name_file(&d, from, a->cluster);
    if (st == XM_OK && tph)
      st = xm_plan_simulate_phases(&spec, &pt, &w->topo, a->engine, tph, ntph, &d, &w->r);
    else if (st == XM_OK)
      st = xm_plan_simulate(&spec, &pt, NULL, a->synth ? &a->routing : NULL, &w->topo, a->engine,
                            &d, &w->r);
    if (st == XM_OK) {
      xm_fab_bom(&w->topo, &w->bom);
      st = xm_fab_prices_check_speed(&prices, w->bom.link_gbps, "--link-gbps", &d);
    }
    if (st == XM_OK) xm_fab_price(&w->bom, &prices, &w->price);
  }
  for (int64_t i = 0; tph && i < ntph; i++)
    xm_fab_phase_free(&tph[i]);
  free(tph);
  if (st != XM_OK) return finish(&d, st);
  ref = rows[ref_at >= 0 ? ref_at : n];
  for (int i = 0; i < n; i++) {
    row_t *w = &rows[i];
    double mine = w->r.iteration_s * w->price.total, base = ref.r.iteration_s * ref.price.total;
    w->perf_per_cost = mine > 0 ? base / mine : 0;
  }
  xm_diag_print(&d, stderr);
  xm_diag_free(&d);
  if (!a->json) {
    print_text(&spec, &pt, planned, rows, n, a->engine, a->traffic ? &mloc : NULL);
    if (a->traffic)
      printf("communication: the %" PRId64 " (layer, phase) records of step %" PRId64
             " of %s, once each (no overlap)\n",
             ntph, tstep, a->traffic);
    return 0;
  }
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "model", spec.name);
  cJSON_AddStringToObject(root, "cluster", spec.cluster.name);
  cJSON_AddNumberToObject(root, "nodes", (double)spec.cluster.nodes);
  cJSON_AddNumberToObject(root, "ranks_per_node", (double)spec.cluster.ranks_per_node);
  char lay[96];
  xm_layout_format(&pt.layout, lay, sizeof lay);
  cJSON_AddStringToObject(root, "layout", lay);
  cJSON_AddStringToObject(root, "layout_from", planned ? "plan" : "spec");
  cJSON_AddStringToObject(root, "recompute", xm_recompute_name(pt.recompute));
  cJSON_AddNumberToObject(root, "micro_batch", (double)pt.micro_batch);
  cJSON_AddStringToObject(root, "engine", xm_sim_engine_name(a->engine));
  if (a->traffic) {
    cJSON *tr = cJSON_AddObjectToObject(root, "traffic");
    cJSON_AddStringToObject(tr, "file", a->traffic);
    cJSON_AddNumberToObject(tr, "step", (double)tstep);
    cJSON_AddNumberToObject(tr, "phases", (double)ntph);
  }
  cJSON *ro = cJSON_AddObjectToObject(root, "routing");
  cJSON_AddStringToObject(ro, "experts",
                          a->traffic ? "measured"
                          : a->synth ? "synthetic"
                                     : "uniform");
  if (a->synth) {
    cJSON_AddNumberToObject(ro, "zipf", a->routing.zipf);
    cJSON_AddNumberToObject(ro, "locality", a->routing.locality);
    cJSON_AddNumberToObject(ro, "source_affinity", a->routing.source_affinity);
    cJSON_AddNumberToObject(ro, "affinity_experts", (double)a->routing.affinity_experts);
    cJSON_AddBoolToObject(ro, "scattered", a->routing.affinity_scattered);
    cJSON_AddNumberToObject(ro, "seed", (double)a->routing.seed);
  }
  const xm_sim_result_t *lr = &ref.r;
  for (int i = 0; i < n; i++)
    if (rows[i].kind == XM_FAB_REGIONAL_OCS) lr = &rows[i].r; /* its regions */
  if (a->traffic && mloc.valid) {
    cJSON *lo = cJSON_AddObjectToObject(root, "locality");
    cJSON_AddNumberToObject(lo, "dispatch_bytes", mloc.loc.total);
    cJSON_AddNumberToObject(lo, "intra_server", mloc.loc.intra_server);
    cJSON_AddNumberToObject(lo, "intra_region", mloc.loc.intra_region);
    cJSON_AddNumberToObject(lo, "top5_pairs", mloc.top5);
    cJSON_AddNumberToObject(lo, "layer_tvd", mloc.layer_tvd);
    cJSON_AddNumberToObject(lo, "step_tvd", mloc.step_tvd);
  } else if (!a->traffic && lr->locality_ranks > 0) {
    cJSON *lo = cJSON_AddObjectToObject(root, "locality");
    cJSON_AddNumberToObject(lo, "dispatch_bytes", lr->locality.total);
    cJSON_AddNumberToObject(lo, "intra_server", lr->locality.intra_server);
    cJSON_AddNumberToObject(lo, "intra_region", lr->locality.intra_region);
    cJSON_AddNumberToObject(lo, "top5_pairs", lr->top5_pairs_share);
    cJSON_AddNumberToObject(lo, "layer_tvd", lr->layer_tvd);
  }
  cJSON *m = cJSON_AddObjectToObject(root, "cost_model");
  cJSON_AddNumberToObject(m, "step_s", ref.r.model_step_s);
  cJSON_AddNumberToObject(m, "dispatch_s", ref.r.model_dispatch_s);
  cJSON_AddNumberToObject(m, "tp_s", ref.r.model_tp_s);
  cJSON_AddNumberToObject(m, "dp_s", ref.r.model_dp_s);
  cJSON *arr = cJSON_AddArrayToObject(root, "topologies");
  for (int i = 0; i < n; i++)
    cJSON_AddItemToArray(arr, json_row(&rows[i]));
  return xm_print_json("fabric", root);
}

int xm_cmd_fabric(int argc, char **argv) {
  fabric_args_t a;
  int rc = parse_args(argc, argv, &a);
  if (rc) return rc;
  if (a.help) {
    usage(stdout);
    return 0;
  }
  return a.coll != COLL_NONE ? run_collective(&a) : run_model(&a);
}
