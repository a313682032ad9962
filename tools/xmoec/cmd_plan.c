/* tools/xmoec/cmd_plan.c — `xmoec plan`: the best parallel layout of a
 * model on a cluster, what it costs, and how the baselines compare.
 *
 *   xmoec plan MODEL.json [--cluster FILE] [--json] [--top N]
 *              [--policy P|all] [--max-model] [--global-batch N]
 *              [--routing FILE [--routing-nodes N]] [--dispatch-bound B]
 *
 * One policy (default xmoec): the search of planner/plan.c, printed as the
 * chosen configuration (layout, micro-batch, recompute), its memory per
 * rank by category, its time per step by phase, throughput and MFU, then
 * the N runners-up in a table, the counts of configurations enumerated /
 * legal / fitting and the most common reasons for rejection. --policy all
 * puts every policy's best side by side; --max-model sizes the model
 * family (planner/plan.h) for each policy (all of them unless --policy
 * names one). --json prints one document instead (docs/plan-json.md).
 *
 * The cluster comes from --cluster or the spec's own "cluster" section;
 * without either there is nothing to plan for (exit 2). --global-batch
 * overrides /training/global_batch, which a Hugging Face config never has
 * (it would default to one sequence). The spec's "parallel" section, when
 * present, is ignored by the search: planning is choosing it.
 *
 * --routing FILE replaces the uniform routing the cost model assumes by a
 * measured one (planner/routing.h): a routing histogram, or the --log of
 * an RBD run with --routing-nodes, the nodes that run's EP group spanned.
 * The output says which routing was assumed and, per candidate, the
 * imbalance and RBD copies it implied (docs/plan-json.md).
 *
 * Bad flags and files exit 2 with the place; a model every configuration
 * of which fails to fit is an answer, not an error (exit 0, "fits": false).
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "args.h"
#include "frontend/count.h"
#include "frontend/spec.h"
#include "planner/plan.h"
#include "planner/routing.h"
#include "fabric/topology.h"
#include "planner/simulate.h"
#include "support/diag.h"
#include "support/status.h"
#include "support/strbuf.h"
#include "tools/xmoec/commands.h"
#include "tools/xmoec/json_out.h"

#define GIB (1024.0 * 1024.0 * 1024.0)
#define PLAN_DEFAULT_TOP 5
#define PLAN_TEXT_REASONS 5

typedef struct {
  const char *spec_path;
  const char *cluster_path;
  bool json, help, max_model;
  bool all_policies, policy_given;
  xm_policy_t policy;
  int64_t top;
  int64_t global_batch; /* 0: the spec's */
  const char *routing_path;
  int64_t routing_nodes;  /* 0: not given */
  int64_t dispatch_bound; /* 0: searched (xmoec compile's --dispatch-bound) */
  bool simulate;          /* --simulate: the chosen plan on the cluster's topology */
} plan_args_t;

/* What the output functions need besides a candidate: the spec planned,
 * its cluster's network, and the measured routing (NULL: uniform). */
typedef struct {
  const xm_spec_t *spec;
  xm_net_t net;
  const xm_routing_t *routing;
  const plan_args_t *args; /* for the compile command of the chosen plan; NULL: none */
} plan_ctx_t;

static void plan_usage(FILE *out) {
  fprintf(out,
          "usage: xmoec plan MODEL.json [--cluster FILE] [--json] [--top N]\n"
          "                  [--policy P|all] [--max-model] [--global-batch N]\n"
          "                  [--routing FILE [--routing-nodes N]] [--dispatch-bound B]\n"
          "                  [--simulate]\n"
          "\n"
          "Searches every legal (dp, tp, ep, ssmb, rbd, zero, recompute, micro_batch)\n"
          "for the cluster's ranks, rejects what does not fit (and says why), ranks\n"
          "the rest by predicted step time and prints the best with its memory per\n"
          "rank and time per phase, and the runners-up (docs/cost-model.md,\n"
          "docs/plan-json.md).\n"
          "\n"
          "  --cluster FILE      the cluster (else the spec's \"cluster\" section)\n"
          "  --json              one JSON document on stdout (docs/plan-json.md)\n"
          "  --top N             runners-up to list (default %d; 0: every candidate)\n"
          "  --policy P          xmoec (default), x-moe, deepspeed-moe, tutel,\n"
          "                      deepspeed-ted: what that system can express; all:\n"
          "                      every policy side by side\n"
          "  --simulate          time the chosen plan on the cluster's topology with the\n"
          "                      flow-level network simulation (docs/fabric.md)\n"
          "  --max-model         the largest member of the model family each policy\n"
          "                      can train on the cluster (every policy unless\n"
          "                      --policy names one)\n"
          "  --global-batch N    sequences per optimizer step (overrides the spec's)\n"
          "  --routing FILE      a measured routing instead of the uniform one: a routing\n"
          "                      histogram (JSON), or the out/train --log of an RBD run\n"
          "                      (docs/plan-json.md, \"Measured routing\")\n"
          "  --routing-nodes N   with a --log: the nodes that run's EP group spanned\n"
          "  --dispatch-bound B  xmoec's expert receive buffers hold min(ep, B) times the\n"
          "                      rows a rank sends, as xmoec compile --dispatch-bound B\n"
          "                      (default: the search tries 4 and 2)\n"
          "  --help              show this help\n",
          PLAN_DEFAULT_TOP);
}

/* ---- arguments -------------------------------------------------------------- */

/* Returns 0 to go on, else the exit code (after a message). */
static const xm_flag_t k_plan_flags[] = {{"--json", false},
                                         {"--max-model", false},
                                         {"--cluster", true},
                                         {"--top", true},
                                         {"--global-batch", true},
                                         {"--dispatch-bound", true},
                                         {"--routing-nodes", true},
                                         {"--routing", true},
                                         {"--policy", true},
                                         {"--simulate", false},
                                         {NULL, false}};

static int plan_parse_args(int argc, char **argv, plan_args_t *a) {
  if (xm_args_check("plan", argc, argv, k_plan_flags)) return 2;
  memset(a, 0, sizeof *a);
  a->top = PLAN_DEFAULT_TOP;
  a->policy = XM_POLICY_XMOEC;
  for (int i = 0; i < argc; i++) {
    bool missing = false;
    const char *v;
    const char *arg = argv[i];
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
      a->help = true;
      return 0;
    } else if (strcmp(arg, "--json") == 0) {
      a->json = true;
    } else if (strcmp(arg, "--max-model") == 0) {
      a->max_model = true;
    } else if (strcmp(arg, "--simulate") == 0) {
      a->simulate = true;
    } else if ((v = xm_arg_value(argc, argv, &i, "--cluster", &missing))) {
      if (!v[0]) {
        fprintf(stderr, "xmoec plan: error: --cluster needs a file\n");
        return 2;
      }
      a->cluster_path = v;
    } else if ((v = xm_arg_value(argc, argv, &i, "--top", &missing))) {
      if (!xm_arg_int(v, 0, INT32_MAX, &a->top)) {
        fprintf(stderr, "xmoec plan: error: --top needs an integer >= 0, got '%s'\n", v);
        return 2;
      }
    } else if ((v = xm_arg_value(argc, argv, &i, "--global-batch", &missing))) {
      if (!xm_arg_int(v, 1, (int64_t)1 << 24, &a->global_batch)) {
        fprintf(stderr,
                "xmoec plan: error: --global-batch needs an integer in [1, 2^24], got "
                "'%s'\n",
                v);
        return 2;
      }
    } else if ((v = xm_arg_value(argc, argv, &i, "--dispatch-bound", &missing))) {
      if (!xm_arg_int(v, 1, (int64_t)1 << 24, &a->dispatch_bound)) {
        fprintf(stderr,
                "xmoec plan: error: --dispatch-bound needs an integer in [1, 2^24], got '%s'\n", v);
        return 2;
      }
    } else if ((v = xm_arg_value(argc, argv, &i, "--routing-nodes", &missing))) {
      if (!xm_arg_int(v, 2, (int64_t)1 << 20, &a->routing_nodes)) {
        fprintf(stderr,
                "xmoec plan: error: --routing-nodes needs an integer in [2, 2^20], got '%s'\n", v);
        return 2;
      }
    } else if ((v = xm_arg_value(argc, argv, &i, "--routing", &missing))) {
      if (!v[0]) {
        fprintf(stderr, "xmoec plan: error: --routing needs a file\n");
        return 2;
      }
      a->routing_path = v;
    } else if ((v = xm_arg_value(argc, argv, &i, "--policy", &missing))) {
      a->policy_given = true;
      if (strcmp(v, "all") == 0) {
        a->all_policies = true;
      } else if (!xm_policy_from_name(v, &a->policy)) {
        fprintf(stderr,
                "xmoec plan: error: --policy: unknown policy '%s'; expected xmoec, x-moe, "
                "deepspeed-moe, tutel, deepspeed-ted or all\n",
                v);
        return 2;
      }
    } else if (missing) {
      fprintf(stderr, "xmoec plan: error: %s needs a value\n", arg);
      return 2;
    } else if (arg[0] == '-' && arg[1] != '\0') {
      fprintf(stderr, "xmoec plan: error: unknown option '%s'\n", arg);
      plan_usage(stderr);
      return 2;
    } else if (a->spec_path) {
      fprintf(stderr, "xmoec plan: error: more than one model file ('%s' and '%s')\n", a->spec_path,
              arg);
      return 2;
    } else {
      a->spec_path = arg;
    }
  }
  if (!a->spec_path) {
    fprintf(stderr, "xmoec plan: error: missing model file\n");
    plan_usage(stderr);
    return 2;
  }
  if (a->routing_nodes && !a->routing_path) {
    fprintf(stderr, "xmoec plan: error: --routing-nodes needs --routing FILE (a --log)\n");
    return 2;
  }
  if (a->routing_path && a->max_model) {
    fprintf(stderr, "xmoec plan: error: --routing does not apply to --max-model (the family's "
                    "members change the experts the routing was measured on)\n");
    return 2;
  }
  if (a->max_model && !a->policy_given) a->all_policies = true;
  if (a->simulate && (a->max_model || a->all_policies)) {
    fprintf(stderr, "xmoec plan: error: --simulate times one chosen plan: not with --max-model or "
                    "--policy all\n");
    return 2;
  }
  return 0;
}

/* ---- rejection reasons ------------------------------------------------------- */

typedef struct {
  char key[sizeof((xm_plan_candidate_t *)0)->reason];
  const char *example;
  int64_t count;
} reason_t;

/* The reason with every number replaced by '#', so that "ep (512) must
 * divide ..." and "ep (1024) must divide ..." count as one reason. */
static void reason_key(const char *reason, char *out, size_t cap) {
  size_t k = 0;
  for (const char *p = reason; *p && k + 1 < cap;) {
    if (isdigit((unsigned char)*p)) {
      while (isdigit((unsigned char)*p) || (*p == '.' && isdigit((unsigned char)p[1])))
        p++;
      out[k++] = '#';
    } else {
      out[k++] = *p++;
    }
  }
  out[k] = '\0';
}

static int reason_cmp(const void *pa, const void *pb) {
  const reason_t *a = pa, *b = pb;
  if (a->count != b->count) return a->count > b->count ? -1 : 1;
  return strcmp(a->key, b->key);
}

/* The distinct rejection reasons of a result, most common first; *n_out
 * of them in an owned array (NULL when none or out of memory). */
static reason_t *collect_reasons(const xm_plan_result_t *r, int64_t *n_out) {
  *n_out = 0;
  reason_t *rs = NULL;
  int64_t n = 0, cap = 0;
  for (int64_t i = 0; i < r->num; i++) {
    const xm_plan_candidate_t *c = &r->cands[i];
    if (c->legal && c->cost.fits) continue;
    char key[sizeof c->reason];
    reason_key(c->reason, key, sizeof key);
    int64_t j = 0;
    while (j < n && strcmp(rs[j].key, key) != 0)
      j++;
    if (j == n) {
      if (n == cap) {
        cap = cap ? cap * 2 : 16;
        reason_t *p = realloc(rs, (size_t)cap * sizeof *p);
        if (!p) {
          free(rs);
          return NULL;
        }
        rs = p;
      }
      memcpy(rs[n].key, key, sizeof key);
      rs[n].example = c->reason;
      rs[n].count = 0;
      n++;
    }
    rs[j].count++;
  }
  if (n > 1) qsort(rs, (size_t)n, sizeof *rs, reason_cmp);
  *n_out = n;
  return rs;
}

/* ---- routing ---------------------------------------------------------------- */

/* What the assumed routing meant for one candidate, as the cost model
 * applied it (planner/cost.c): the busiest EP rank's imbalance (padding-free
 * policies only; the padded ones send whole buffers) and, under RBD, the
 * distinct nodes per token against the uniform expectation. */
typedef struct {
  double imbalance, imbalance_worst;
  bool rbd; /* RBD active: the copies below apply */
  int64_t rbd_nodes;
  double copies, copies_uniform;
} cand_routing_t;

static cand_routing_t candidate_routing(const plan_ctx_t *x, const xm_plan_candidate_t *c) {
  cand_routing_t o = {1.0, 1.0, false, 0, 0, 0};
  const xm_cost_point_t *p = &c->point;
  bool pft = p->policy == XM_POLICY_XMOEC || p->policy == XM_POLICY_XMOE;
  int64_t E = x->spec->moe.experts, k = x->spec->moe.top_k;
  if (!pft || E < 1 || p->layout.ep < 2) return o;
  o.imbalance = xm_routing_imbalance(x->routing, p->layout.ep, false);
  o.imbalance_worst = xm_routing_imbalance(x->routing, p->layout.ep, true);
  xm_layout_t l = p->layout;
  l.ranks_per_node = x->net.ranks_per_node;
  if (l.rbd && xm_layout_rbd_active(&l)) {
    /* xmoec's and X-MoE's EP groups are consecutive ranks. */
    xm_net_group_t g = {.first = 0, .stride = 1, .size = p->layout.ep};
    o.rbd = true;
    o.rbd_nodes = xm_net_group_nodes(&x->net, g);
    o.copies = xm_routing_rbd_copies(x->routing, E, k, o.rbd_nodes);
    o.copies_uniform = xm_cost_rbd_expected_copies(E, k, o.rbd_nodes);
  }
  return o;
}

static void print_routing_header(const xm_routing_t *r) {
  if (!r) return;
  if (r->kind == XM_ROUTING_HISTOGRAM) {
    printf("routing: histogram %s: %" PRId64 " experts, top_k %" PRId64 ", %" PRId64 " load row%s",
           r->source, r->experts, r->top_k, r->layers, r->layers == 1 ? "" : "s");
    if (r->rbd_measured)
      printf("; RBD measured: %.4g nodes per token at %" PRId64 " nodes (x%.4f uniform)\n",
             r->rbd_copies, r->rbd_nodes, r->rbd_dedup);
    else
      printf("; RBD copies estimated from the loads\n");
  } else {
    printf("routing: log %s: %" PRId64 " line%s, %" PRId64 " with rbd rows: %.0f pilot rows "
           "across nodes for %.0f flat slots,\n"
           "  %.4g nodes per token at %" PRId64 " nodes (x%.4f uniform); loads uniform\n",
           r->source, r->log_lines, r->log_lines == 1 ? "" : "s", r->log_rbd_lines, r->inter_rows,
           r->flat_inter_rows, r->rbd_copies, r->rbd_nodes, r->rbd_dedup);
  }
}

static void print_routing_candidate(const plan_ctx_t *x, const xm_plan_candidate_t *c) {
  if (!x->routing) return;
  cand_routing_t o = candidate_routing(x, c);
  printf("  routing: busiest EP rank %.3fx the mean (worst layer %.3fx)", o.imbalance,
         o.imbalance_worst);
  if (o.rbd)
    printf("; RBD %.4g nodes per token of %" PRId64 " (uniform %.4g)", o.copies, o.rbd_nodes,
           o.copies_uniform);
  printf("\n");
}

/* ---- text ------------------------------------------------------------------ */

static void fmt_layout(const xm_cost_point_t *p, char *buf, size_t cap) {
  xm_layout_format(&p->layout, buf, cap);
}

/* "545.03B" */
static void fmt_count(double v, char *out, size_t cap) {
  if (v >= 1e12)
    snprintf(out, cap, "%.2fT", v / 1e12);
  else if (v >= 1e9)
    snprintf(out, cap, "%.2fB", v / 1e9);
  else if (v >= 1e6)
    snprintf(out, cap, "%.2fM", v / 1e6);
  else
    snprintf(out, cap, "%.0f", v);
}

/* "1.23 TiB" style bytes. */
static void fmt_bytes(double v, char *out, size_t cap) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    u++;
  }
  snprintf(out, cap, u ? "%.2f %s" : "%.0f %s", v, units[u]);
}

static void print_header(const xm_spec_t *s) {
  const xm_cluster_spec_t *cl = &s->cluster;
  xm_count_t c;
  xm_count_params(s, &c);
  char params[32];
  fmt_count((double)c.total, params, sizeof params);
  printf("plan: %s on %s: %" PRId64 " node%s x %" PRId64 " ranks = %" PRId64 " ranks, %.1f GiB "
         "each\n",
         s->name, cl->name[0] ? cl->name : "the cluster", cl->nodes, cl->nodes == 1 ? "" : "s",
         cl->ranks_per_node, cl->nodes * cl->ranks_per_node, cl->device_memory_gib);
  printf("model: %s parameters, seq %" PRId64 ", global batch %" PRId64 " sequences\n", params,
         s->training.seq_len, s->training.global_batch);
  if (!xm_spec_trainable(s))
    printf("note: this version cannot train this model; the plan is a prediction\n");
}

static void print_chosen(const plan_ctx_t *x, const xm_plan_candidate_t *c, bool fits) {
  const xm_cost_t *k = &c->cost;
  char layout[96];
  fmt_layout(&c->point, layout, sizeof layout);
  printf("%s: %s, micro-batch %" PRId64 ", recompute %s, %" PRId64
         " micro-step%s per optimizer step\n",
         fits ? "chosen" : "closest (does not fit)", layout, c->point.micro_batch,
         xm_recompute_name(c->point.recompute), k->grad_accum, k->grad_accum == 1 ? "" : "s");
  if (c->point.policy == XM_POLICY_XMOEC && c->point.layout.ep > 1)
    printf("  expert receive buffers: min(ep, %" PRId64 ") x the rows a rank sends "
           "(xmoec compile --dispatch-bound %" PRId64 ")\n",
           c->point.dispatch_bound > 0 ? c->point.dispatch_bound : 4,
           c->point.dispatch_bound > 0 ? c->point.dispatch_bound : 4);
  printf("  memory per rank (GiB): weights %.2f, grads %.2f, optimizer %.2f, activations %.2f,\n"
         "    buffers %.2f, overhead %.2f; total %.2f of %.2f (%.0f%%)\n",
         k->weights / GIB, k->grads / GIB, k->optimizer / GIB, k->activations / GIB,
         k->buffers / GIB, k->overhead / GIB, k->total / GIB, k->device / GIB,
         k->device > 0 ? 100.0 * k->total / k->device : 0.0);
  if (!fits) printf("  short by %.2f GiB per rank\n", k->shortfall / GIB);
  print_routing_candidate(x, c);
  printf("  time per step (s): compute %.3f, expert all-to-all %.3f, tp/ssmb collectives %.3f,\n"
         "    dp gradient reduction %.3f, optimizer %.3f; step %.3f (overlap: "
         "docs/cost-model.md)\n",
         k->t_compute, k->t_dispatch, k->t_tp, k->t_dp, k->t_optimizer, k->t_step);
  printf("  throughput: %.4g TFLOP/s per device, MFU %.1f%%, %.0f tokens per step\n",
         k->tflops_per_device, 100.0 * k->mfu, k->tokens_per_step);
  char di[32], de[32], ar[32], ag[32], rs[32];
  fmt_bytes(k->bytes_dispatch_intra, di, sizeof di);
  fmt_bytes(k->bytes_dispatch_inter, de, sizeof de);
  fmt_bytes(k->bytes_all_reduce_intra + k->bytes_all_reduce_inter, ar, sizeof ar);
  fmt_bytes(k->bytes_all_gather_intra + k->bytes_all_gather_inter, ag, sizeof ag);
  fmt_bytes(k->bytes_reduce_scatter_intra + k->bytes_reduce_scatter_inter, rs, sizeof rs);
  printf("  bytes on the wire per step (all ranks): all-to-all %s intra-node + %s inter-node,\n"
         "    all-reduce %s, all-gather %s, reduce-scatter %s\n",
         di, de, ar, ag, rs);
}

/* Why `c` loses to `ref` (the chosen or the best plan), in a few words:
 * for one that fits, the phase whose time grew the most ("all-to-all
 * +1.23 s"); for one that does not, its shortfall and the memory category
 * that exceeds the reference's the most ("short 9.93 GiB; activations
 * +12.40 GiB"). */
static void explain(const xm_plan_candidate_t *c, const xm_plan_candidate_t *ref, char *buf,
                    size_t cap) {
  const xm_cost_t *a = &c->cost, *b = &ref->cost;
  if (!a->fits) {
    const char *names[] = {"weights", "grads", "optimizer", "activations", "buffers"};
    double d[] = {a->weights - b->weights, a->grads - b->grads, a->optimizer - b->optimizer,
                  a->activations - b->activations, a->buffers - b->buffers};
    int k = 0;
    for (int i = 1; i < 5; i++)
      if (d[i] > d[k]) k = i;
    if (d[k] > 0)
      snprintf(buf, cap, "short %.2f GiB; %s %+.2f GiB", a->shortfall / GIB, names[k], d[k] / GIB);
    else
      snprintf(buf, cap, "short %.2f GiB", a->shortfall / GIB);
    return;
  }
  const char *names[] = {"compute", "all-to-all", "tp", "dp", "optimizer"};
  double d[] = {a->t_compute - b->t_compute, a->t_dispatch - b->t_dispatch, a->t_tp - b->t_tp,
                a->t_dp - b->t_dp, a->t_optimizer - b->t_optimizer};
  int k = 0;
  for (int i = 1; i < 5; i++)
    if (d[i] > d[k]) k = i;
  if (a->t_step <= b->t_step || d[k] <= 0)
    snprintf(buf, cap, "-");
  else
    snprintf(buf, cap, "%s %+.3g s", names[k], d[k]);
}

/* The exact `xmoec compile` command that builds candidate `c` (xmoec
 * only; false otherwise), with OUT for the output folder. */
static bool compile_command(const plan_ctx_t *x, const xm_plan_candidate_t *c, xm_strbuf_t *out) {
  const plan_args_t *a = x->args;
  if (!a || c->point.policy != XM_POLICY_XMOEC) return false;
  const xm_layout_t *l = &c->point.layout;
  const xm_recompute_t r = c->point.recompute;
  xm_strbuf_printf(out,
                   "xmoec compile %s%s%s -o OUT --dp %" PRId64 " --tp %" PRId64 " --ep %" PRId64
                   "%s%s --zero %d --micro-batch %" PRId64 " --recompute %s",
                   a->spec_path, a->cluster_path ? " --cluster " : "",
                   a->cluster_path ? a->cluster_path : "", l->dp, l->tp, l->ep,
                   l->ssmb ? " --ssmb" : "", l->rbd ? " --rbd" : "", l->zero, c->point.micro_batch,
                   r == XM_RECOMPUTE_FULL        ? "full"
                   : r == XM_RECOMPUTE_SELECTIVE ? "selective"
                                                 : "none");
  if (l->ep > 1)
    xm_strbuf_printf(out, " --dispatch-bound %" PRId64,
                     c->point.dispatch_bound > 0 ? c->point.dispatch_bound : 4);
  if (a->global_batch > 0) xm_strbuf_printf(out, " --global-batch %" PRId64, a->global_batch);
  return true;
}

static void print_compile_command(const plan_ctx_t *x, const xm_plan_candidate_t *c) {
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  if (compile_command(x, c, &b)) printf("  compile it: %s\n", xm_strbuf_cstr(&b));
  xm_strbuf_free(&b);
}

static void print_table_head(void) {
  printf("  %4s  %-30s %4s  %-9s %3s %9s %8s %8s %8s %6s  %s\n", "#", "layout", "mb", "recompute",
         "B", "step s", "vs best", "mem GiB", "TFLOP/s", "MFU", "slower in");
}

static void print_table_row(int64_t i, const xm_plan_candidate_t *c,
                            const xm_plan_candidate_t *ref) {
  double best = ref->cost.t_step;
  char why[96];
  explain(c, ref, why, sizeof why);
  char layout[96];
  fmt_layout(&c->point, layout, sizeof layout);
  /* B: xmoec's dispatch bound, where it applies (ep > 1). */
  char bound[24] = "-";
  if (c->point.policy == XM_POLICY_XMOEC && c->point.layout.ep > 1)
    snprintf(bound, sizeof bound, "%" PRId64,
             c->point.dispatch_bound > 0 ? c->point.dispatch_bound : 4);
  printf("  %4" PRId64 "  %-30s %4" PRId64 "  %-9s %3s %9.3f %+7.1f%% %8.2f %8.1f %5.1f%%  %s\n",
         i + 1, layout, c->point.micro_batch, xm_recompute_name(c->point.recompute), bound,
         c->cost.t_step, best > 0 ? 100.0 * (c->cost.t_step / best - 1.0) : 0.0,
         c->cost.total / GIB, c->cost.tflops_per_device, 100.0 * c->cost.mfu, why);
}

static void print_reasons(const xm_plan_result_t *r) {
  int64_t n = 0;
  reason_t *rs = collect_reasons(r, &n);
  int64_t rejected = r->num - r->num_fit;
  if (rejected == 0) return;
  printf("\nrejected: %" PRId64 " configuration%s; the most common reasons (one example "
         "each):\n",
         rejected, rejected == 1 ? "" : "s");
  for (int64_t i = 0; i < n && i < PLAN_TEXT_REASONS; i++)
    printf("  %6" PRId64 "  %s\n", rs[i].count, rs[i].example);
  if (n > PLAN_TEXT_REASONS)
    printf("  (and %" PRId64 " other reasons; --json lists all)\n", n - PLAN_TEXT_REASONS);
  free(rs);
}

static void print_text_one(const plan_ctx_t *x, const xm_plan_result_t *r, int64_t top) {
  const xm_spec_t *s = x->spec;
  print_header(s);
  print_routing_header(x->routing);
  printf("policy: %s; searched %" PRId64 " configurations: %" PRId64 " legal, %" PRId64 " fit\n\n",
         xm_policy_name(r->policy), r->num, r->num_legal, r->num_fit);
  if (r->num == 0 || !r->cands[0].legal) {
    printf("no legal configuration for %" PRId64 " ranks under policy %s\n", r->world,
           xm_policy_name(r->policy));
  } else {
    print_chosen(x, &r->cands[0], r->chosen >= 0);
    if (r->chosen >= 0) print_compile_command(x, &r->cands[0]);
    if (r->chosen < 0) printf("no configuration fits; the one above has the smallest shortfall\n");
  }
  if (r->chosen >= 0 && r->num_fit > 1 && top != 1) {
    int64_t last = top == 0 ? r->num_fit : (top + 1 < r->num_fit ? top + 1 : r->num_fit);
    printf("\nrunners-up:\n");
    print_table_head();
    for (int64_t i = 1; i < last; i++)
      print_table_row(i, &r->cands[i], &r->cands[0]);
  }
  print_reasons(r);
}

static void print_text_policies(const plan_ctx_t *x, xm_plan_result_t *rs, int n) {
  const xm_spec_t *s = x->spec;
  print_header(s);
  print_routing_header(x->routing);
  double best = 0;
  const xm_plan_candidate_t *ref = NULL; /* the fastest plan of all policies */
  for (int i = 0; i < n; i++)
    if (rs[i].chosen >= 0 && (best == 0 || rs[i].cands[0].cost.t_step < best)) {
      best = rs[i].cands[0].cost.t_step;
      ref = &rs[i].cands[0];
    }
  printf("\n  %-14s %-30s %4s  %-9s %9s %8s %8s %8s %6s  %-18s  %s\n", "policy", "best layout",
         "mb", "recompute", "step s", "vs best", "mem GiB", "TFLOP/s", "MFU", "fit/legal/searched",
         "why it loses");
  for (int i = 0; i < n; i++) {
    const xm_plan_result_t *r = &rs[i];
    if (r->num == 0 || !r->cands[0].legal) {
      printf("  %-14s no legal configuration (%" PRId64 " searched)\n", xm_policy_name(r->policy),
             r->num);
      continue;
    }
    const xm_plan_candidate_t *c = &r->cands[0];
    char layout[96], counts[64], why[96] = "-";
    fmt_layout(&c->point, layout, sizeof layout);
    snprintf(counts, sizeof counts, "%" PRId64 "/%" PRId64 "/%" PRId64, r->num_fit, r->num_legal,
             r->num);
    if (ref && c != ref) explain(c, ref, why, sizeof why);
    if (r->chosen < 0) {
      char shortfall[48];
      snprintf(shortfall, sizeof shortfall, "short by %.2f GiB", c->cost.shortfall / GIB);
      printf("  %-14s %-30s %4" PRId64 "  %-9s %-45s %-18s  %s\n", xm_policy_name(r->policy),
             layout, c->point.micro_batch, xm_recompute_name(c->point.recompute), shortfall, counts,
             why);
      continue;
    }
    printf("  %-14s %-30s %4" PRId64 "  %-9s %9.3f %+7.1f%% %8.2f %8.1f %5.1f%%  %-18s  %s\n",
           xm_policy_name(r->policy), layout, c->point.micro_batch,
           xm_recompute_name(c->point.recompute), c->cost.t_step,
           best > 0 ? 100.0 * (c->cost.t_step / best - 1.0) : 0.0, c->cost.total / GIB,
           c->cost.tflops_per_device, 100.0 * c->cost.mfu, counts, c == ref ? "fastest" : why);
  }
}

static void print_text_max(const xm_spec_t *s, const xm_plan_max_t *ms, int n) {
  print_header(s);
  printf("model family: heads (hidden), MoE layers and experts scale by cbrt(scale) "
         "(docs/plan-json.md)\n\n");
  printf("  %-14s %8s %10s %7s %7s %8s  %-30s %9s %8s  %s\n", "policy", "scale", "params", "hidden",
         "layers", "experts", "best layout", "step s", "mem GiB", "what stops the next size");
  for (int i = 0; i < n; i++) {
    const xm_plan_max_t *m = &ms[i];
    if (m->scale <= 0) {
      printf("  %-14s nothing fits, not even scale 1/4096\n", xm_policy_name(m->policy));
      continue;
    }
    xm_spec_t member;
    xm_plan_family_member(s, m->scale, &member);
    char params[32], layout[96];
    fmt_count((double)m->params, params, sizeof params);
    fmt_layout(&m->best.point, layout, sizeof layout);
    /* What stops it: the next size's closest plan, short by so much, and
     * its memory by category (persistent: weights, grads, optimizer). */
    char limit[160] = "nothing up to scale 4096";
    if (m->limit_scale > 0) {
      const xm_cost_t *k = &m->limit.cost;
      char lp[32];
      fmt_count((double)m->limit_params, lp, sizeof lp);
      snprintf(limit, sizeof limit,
               "%s: short %.2f GiB (weights+grads+optimizer %.2f, activations %.2f, buffers "
               "%.2f GiB)",
               lp, k->shortfall / GIB, (k->weights + k->grads + k->optimizer) / GIB,
               k->activations / GIB, k->buffers / GIB);
    }
    printf("  %-14s %8.3f %10s %7" PRId64 " %7" PRId64 " %8" PRId64 "  %-30s %9.3f %8.2f  %s\n",
           xm_policy_name(m->policy), m->scale, params, member.model.hidden, member.model.layers,
           member.moe.experts, layout, m->best.cost.t_step, m->best.cost.total / GIB, limit);
  }
}

/* ---- JSON ------------------------------------------------------------------ */

static cJSON *json_candidate(const plan_ctx_t *x, const xm_plan_candidate_t *c) {
  const xm_cost_point_t *p = &c->point;
  const xm_cost_t *k = &c->cost;
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "dp", (double)p->layout.dp);
  cJSON_AddNumberToObject(o, "tp", (double)p->layout.tp);
  cJSON_AddNumberToObject(o, "ep", (double)p->layout.ep);
  cJSON_AddBoolToObject(o, "ssmb", p->layout.ssmb);
  cJSON_AddBoolToObject(o, "rbd", p->layout.rbd);
  cJSON_AddNumberToObject(o, "zero", p->layout.zero);
  cJSON_AddStringToObject(o, "recompute", xm_recompute_name(p->recompute));
  cJSON_AddNumberToObject(o, "micro_batch", (double)p->micro_batch);
  cJSON_AddNumberToObject(o, "dispatch_bound",
                          (double)(p->dispatch_bound > 0 ? p->dispatch_bound : 4));
  cJSON_AddStringToObject(o, "policy", xm_policy_name(p->policy));
  cJSON_AddBoolToObject(o, "legal", c->legal);
  cJSON_AddBoolToObject(o, "fits", c->legal && k->fits);
  cJSON_AddStringToObject(o, "reason", c->reason);
  cJSON_AddNumberToObject(o, "grad_accum", (double)k->grad_accum);
  cJSON *m = cJSON_AddObjectToObject(o, "memory_bytes");
  const struct {
    const char *key;
    double v;
  } mem[] = {{"weights", k->weights},     {"grads", k->grads},
             {"optimizer", k->optimizer}, {"activations", k->activations},
             {"buffers", k->buffers},     {"overhead", k->overhead},
             {"total", k->total},         {"device", k->device}};
  for (size_t i = 0; i < sizeof mem / sizeof mem[0]; i++)
    cJSON_AddNumberToObject(m, mem[i].key, mem[i].v);
  cJSON_AddNumberToObject(o, "shortfall_bytes", k->shortfall);
  cJSON_AddNumberToObject(o, "step_time_s", k->t_step);
  cJSON *t = cJSON_AddObjectToObject(o, "time_s");
  cJSON_AddNumberToObject(t, "compute", k->t_compute);
  cJSON_AddNumberToObject(t, "dispatch", k->t_dispatch);
  cJSON_AddNumberToObject(t, "tp", k->t_tp);
  cJSON_AddNumberToObject(t, "dp", k->t_dp);
  cJSON_AddNumberToObject(t, "optimizer", k->t_optimizer);
  cJSON_AddNumberToObject(o, "tokens_per_step", k->tokens_per_step);
  cJSON_AddNumberToObject(o, "flops_per_device", k->flops_per_device);
  cJSON_AddNumberToObject(o, "tflops_per_device", k->tflops_per_device);
  cJSON_AddNumberToObject(o, "mfu", k->mfu);
  cJSON *w = cJSON_AddObjectToObject(o, "wire_bytes");
  const struct {
    const char *key;
    double v;
  } wire[] = {{"dispatch_intra", k->bytes_dispatch_intra},
              {"dispatch_inter", k->bytes_dispatch_inter},
              {"all_reduce_intra", k->bytes_all_reduce_intra},
              {"all_reduce_inter", k->bytes_all_reduce_inter},
              {"all_gather_intra", k->bytes_all_gather_intra},
              {"all_gather_inter", k->bytes_all_gather_inter},
              {"reduce_scatter_intra", k->bytes_reduce_scatter_intra},
              {"reduce_scatter_inter", k->bytes_reduce_scatter_inter}};
  for (size_t i = 0; i < sizeof wire / sizeof wire[0]; i++)
    cJSON_AddNumberToObject(w, wire[i].key, wire[i].v);
  cand_routing_t cr = candidate_routing(x, c);
  cJSON *rt = cJSON_AddObjectToObject(o, "routing");
  cJSON_AddNumberToObject(rt, "imbalance", cr.imbalance);
  cJSON_AddNumberToObject(rt, "imbalance_worst", cr.imbalance_worst);
  if (cr.rbd) {
    cJSON_AddNumberToObject(rt, "rbd_nodes", (double)cr.rbd_nodes);
    cJSON_AddNumberToObject(rt, "rbd_copies_per_token", cr.copies);
    cJSON_AddNumberToObject(rt, "rbd_copies_uniform", cr.copies_uniform);
  } else {
    cJSON_AddNullToObject(rt, "rbd_nodes");
    cJSON_AddNullToObject(rt, "rbd_copies_per_token");
    cJSON_AddNullToObject(rt, "rbd_copies_uniform");
  }
  return o;
}

/* The routing the plan assumed (docs/plan-json.md, "Measured routing"). */
static void json_routing(cJSON *root, const plan_ctx_t *x) {
  const xm_routing_t *r = x->routing;
  cJSON *o = cJSON_AddObjectToObject(root, "routing");
  cJSON_AddStringToObject(o, "source", r ? xm_routing_kind_name(r->kind) : "uniform");
  if (r)
    cJSON_AddStringToObject(o, "file", r->source);
  else
    cJSON_AddNullToObject(o, "file");
  cJSON_AddNumberToObject(o, "experts", (double)(r ? r->experts : x->spec->moe.experts));
  cJSON_AddNumberToObject(o, "top_k", (double)(r ? r->top_k : x->spec->moe.top_k));
  cJSON_AddNumberToObject(o, "load_layers", (double)(r ? r->layers : 0));
  cJSON_AddStringToObject(o, "rbd_from",
                          !r                ? "uniform"
                          : r->rbd_measured ? "measured"
                          : r->layers > 0   ? "loads"
                                            : "uniform");
  if (r && r->rbd_measured) {
    cJSON_AddNumberToObject(o, "rbd_nodes", (double)r->rbd_nodes);
    cJSON_AddNumberToObject(o, "rbd_copies_per_token", r->rbd_copies);
    cJSON_AddNumberToObject(o, "rbd_dedup", r->rbd_dedup);
  } else {
    cJSON_AddNullToObject(o, "rbd_nodes");
    cJSON_AddNullToObject(o, "rbd_copies_per_token");
    cJSON_AddNullToObject(o, "rbd_dedup");
  }
  if (r && r->kind == XM_ROUTING_LOG) {
    cJSON *l = cJSON_AddObjectToObject(o, "log");
    cJSON_AddNumberToObject(l, "lines", (double)r->log_lines);
    cJSON_AddNumberToObject(l, "rbd_lines", (double)r->log_rbd_lines);
    cJSON_AddNumberToObject(l, "inter_rows", r->inter_rows);
    cJSON_AddNumberToObject(l, "flat_inter_rows", r->flat_inter_rows);
  }
}

static void json_header(cJSON *root, const xm_spec_t *s) {
  const xm_cluster_spec_t *cl = &s->cluster;
  xm_count_t c;
  xm_count_params(s, &c);
  cJSON_AddStringToObject(root, "model", s->name);
  cJSON_AddNumberToObject(root, "params", (double)c.total);
  cJSON_AddBoolToObject(root, "trainable", xm_spec_trainable(s));
  cJSON_AddNumberToObject(root, "seq_len", (double)s->training.seq_len);
  cJSON_AddNumberToObject(root, "global_batch", (double)s->training.global_batch);
  cJSON *k = cJSON_AddObjectToObject(root, "cluster");
  cJSON_AddStringToObject(k, "name", cl->name);
  cJSON_AddNumberToObject(k, "nodes", (double)cl->nodes);
  cJSON_AddNumberToObject(k, "ranks_per_node", (double)cl->ranks_per_node);
  cJSON_AddNumberToObject(k, "world", (double)(cl->nodes * cl->ranks_per_node));
  cJSON_AddNumberToObject(k, "device_memory_gib", cl->device_memory_gib);
}

/* The fields of one policy's plan into `o`. */
static void json_plan(cJSON *o, const plan_ctx_t *x, const xm_plan_result_t *r, int64_t top) {
  cJSON_AddStringToObject(o, "policy", xm_policy_name(r->policy));
  cJSON_AddNumberToObject(o, "enumerated", (double)r->num);
  cJSON_AddNumberToObject(o, "legal", (double)r->num_legal);
  cJSON_AddNumberToObject(o, "fit", (double)r->num_fit);
  cJSON_AddItemToObject(o, "chosen",
                        r->num > 0 ? json_candidate(x, &r->cands[0]) : cJSON_CreateNull());
  xm_strbuf_t cmd;
  xm_strbuf_init(&cmd);
  if (r->chosen >= 0 && compile_command(x, &r->cands[0], &cmd))
    cJSON_AddStringToObject(o, "compile_command", xm_strbuf_cstr(&cmd));
  else
    cJSON_AddNullToObject(o, "compile_command");
  xm_strbuf_free(&cmd);
  int64_t n = top == 0 ? r->num : (top + 1 < r->num ? top + 1 : r->num);
  cJSON *arr = cJSON_AddArrayToObject(o, "candidates");
  for (int64_t i = 0; i < n; i++)
    cJSON_AddItemToArray(arr, json_candidate(x, &r->cands[i]));
  int64_t nr = 0;
  reason_t *rs = collect_reasons(r, &nr);
  cJSON *rej = cJSON_AddArrayToObject(o, "rejections");
  for (int64_t i = 0; i < nr; i++) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "count", (double)rs[i].count);
    cJSON_AddStringToObject(e, "reason", rs[i].example);
    cJSON_AddItemToArray(rej, e);
  }
  free(rs);
}

/* ---- entry ---------------------------------------------------------------- */

static xm_status_t load(const plan_args_t *a, xm_diag_t *diag, xm_spec_t *spec,
                        xm_routing_t **out_routing) {
  *out_routing = NULL;
  xm_status_t st = xm_spec_load_file(a->spec_path, diag, spec);
  if (st == XM_OK && a->cluster_path) st = xm_spec_load_cluster_file(a->cluster_path, diag, spec);
  if (st == XM_OK && a->global_batch > 0) {
    spec->training.global_batch = a->global_batch;
    /* The search chooses the micro-batch; the spec's only has to divide. */
    if (a->global_batch % spec->training.micro_batch != 0) spec->training.micro_batch = 1;
    int before = xm_diag_error_count(diag);
    xm_spec_validate(spec, "--global-batch", diag);
    if (xm_diag_error_count(diag) > before) st = XM_ERR_INVALID_INPUT;
  }
  if (st == XM_OK && xm_diag_error_count(diag) > 0) st = XM_ERR_INVALID_INPUT;
  if (st == XM_OK && !spec->cluster.present) {
    xm_diag_add(diag, XM_DIAG_ERROR, a->spec_path, "/cluster",
                "no cluster to plan for: give --cluster FILE or a \"cluster\" section");
    st = XM_ERR_INVALID_INPUT;
  }
  if (st == XM_OK && a->routing_path) {
    if (spec->moe.experts < 1) {
      xm_diag_add(diag, XM_DIAG_ERROR, a->spec_path, "/moe/experts",
                  "--routing: the model has no routed experts, so no routing to measure");
      st = XM_ERR_INVALID_INPUT;
    } else {
      xm_routing_options_t ro = {
          .experts = spec->moe.experts, .top_k = spec->moe.top_k, .log_nodes = a->routing_nodes};
      st = xm_routing_load_file(a->routing_path, &ro, diag, out_routing);
    }
  }
  return st;
}

/* --simulate: the chosen point on the cluster's own topology, flow-level. */
static xm_status_t simulate_chosen(const xm_spec_t *spec, const char *cluster_path, bool file,
                                   const xm_cost_point_t *pt, const xm_cost_routing_t *rt,
                                   xm_fab_kind_t *kind, xm_sim_result_t *out, xm_diag_t *diag) {
  static const struct {
    xm_topology_t topo;
    xm_fab_kind_t kind;
  } k_map[] = {{XM_TOPO_FAT_TREE, XM_FAB_FAT_TREE},
               {XM_TOPO_FAT_TREE_OVERSUB, XM_FAB_FAT_TREE_OVERSUB},
               {XM_TOPO_DRAGONFLY, XM_FAB_DRAGONFLY},
               {XM_TOPO_REGIONAL_OCS, XM_FAB_REGIONAL_OCS}};
  bool found = false;
  for (size_t i = 0; i < sizeof k_map / sizeof k_map[0]; i++)
    if (k_map[i].topo == spec->cluster.topology) *kind = k_map[i].kind, found = true;
  if (!found) {
    xm_diag_add(diag, XM_DIAG_ERROR, cluster_path, file ? "/topology" : "/cluster/topology",
                "--simulate: the network layer does not model a %s (fat-tree, "
                "fat-tree-oversubscribed, dragonfly and regional-ocs it does)",
                xm_topology_name(spec->cluster.topology));
    return XM_ERR_UNSUPPORTED;
  }
  xm_fab_topo_t t;
  int from = diag->count;
  xm_status_t st = xm_fab_topo_from_cluster(&spec->cluster, *kind, 0, &t, diag);
  xm_diag_name_file(diag, from, cluster_path);
  if (st != XM_OK) return st;
  return xm_plan_simulate(spec, pt, rt, NULL, &t, XM_SIM_SIMGRID, diag, out);
}

static void print_simulated(xm_fab_kind_t kind, const xm_sim_result_t *r) {
  printf("\nsimulated (flow-level, %s): step %.4g s = compute %.4g + communication %.4g "
         "(dispatch %.4g, tp %.4g, dp %.4g); the cost model says %.4g s\n",
         xm_fab_kind_name(kind), r->iteration_s, r->compute_s, r->comm_s, r->dispatch_s, r->tp_s,
         r->reduce_exposed_s + r->gather_s + r->reconfig_s, r->model_step_s);
}

static cJSON *json_simulated(xm_fab_kind_t kind, const xm_sim_result_t *r) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "topology", xm_fab_kind_name(kind));
  cJSON_AddStringToObject(o, "engine", "simgrid");
  cJSON_AddNumberToObject(o, "iteration_s", r->iteration_s);
  cJSON_AddNumberToObject(o, "compute_s", r->compute_s);
  cJSON_AddNumberToObject(o, "comm_s", r->comm_s);
  cJSON_AddNumberToObject(o, "dispatch_s", r->dispatch_s);
  cJSON_AddNumberToObject(o, "tp_s", r->tp_s);
  cJSON_AddNumberToObject(o, "dp_s", r->reduce_exposed_s + r->gather_s);
  cJSON_AddNumberToObject(o, "reconfig_s", r->reconfig_s);
  cJSON_AddNumberToObject(o, "cost_model_step_s", r->model_step_s);
  return o;
}

static int run_searches(const plan_args_t *a, const xm_spec_t *spec, const xm_routing_t *routing,
                        xm_diag_t *diag) {
  plan_ctx_t ctx = {.spec = spec, .routing = routing, .args = a};
  xm_net_from_cluster(&spec->cluster, &ctx.net);
  xm_policy_t first = a->all_policies ? 0 : a->policy;
  int n = a->all_policies ? XM_POLICY_COUNT : 1;
  if (a->max_model) {
    xm_plan_max_t ms[XM_POLICY_COUNT];
    for (int i = 0; i < n; i++) {
      xm_status_t st = xm_plan_max_model(spec, (xm_policy_t)(first + i), diag, &ms[i]);
      if (st != XM_OK) return xm_status_exit_code(st);
    }
    if (!a->json) {
      print_text_max(spec, ms, n);
      return 0;
    }
    cJSON *root = cJSON_CreateObject();
    json_header(root, spec);
    cJSON *arr = cJSON_AddArrayToObject(root, "max_model");
    for (int i = 0; i < n; i++) {
      xm_spec_t member;
      xm_plan_family_member(spec, ms[i].scale > 0 ? ms[i].scale : 1.0, &member);
      cJSON *o = cJSON_CreateObject();
      cJSON_AddStringToObject(o, "policy", xm_policy_name(ms[i].policy));
      cJSON_AddNumberToObject(o, "scale", ms[i].scale);
      cJSON_AddNumberToObject(o, "params", (double)ms[i].params);
      cJSON_AddBoolToObject(o, "fits", ms[i].scale > 0);
      cJSON_AddNumberToObject(o, "hidden", ms[i].scale > 0 ? (double)member.model.hidden : 0);
      cJSON_AddNumberToObject(o, "heads", ms[i].scale > 0 ? (double)member.model.heads : 0);
      cJSON_AddNumberToObject(o, "layers", ms[i].scale > 0 ? (double)member.model.layers : 0);
      cJSON_AddNumberToObject(o, "experts", ms[i].scale > 0 ? (double)member.moe.experts : 0);
      plan_ctx_t mctx = ctx;
      mctx.spec = &member; /* uniform: --routing does not apply here */
      cJSON_AddItemToObject(o, "best", json_candidate(&mctx, &ms[i].best));
      cJSON_AddItemToArray(arr, o);
    }
    return xm_print_json("plan", root);
  }
  xm_plan_result_t rs[XM_POLICY_COUNT];
  memset(rs, 0, sizeof rs);
  int rc = 0;
  xm_cost_routing_t cost_rt = {.measured = routing};
  for (int i = 0; i < n && !rc; i++) {
    xm_plan_options_t po = {.policy = (xm_policy_t)(first + i),
                            .routing = routing ? &cost_rt : NULL,
                            .dispatch_bound = a->dispatch_bound};
    xm_status_t st = xm_plan_search_with(spec, &po, diag, &rs[i]);
    if (st != XM_OK) rc = xm_status_exit_code(st);
  }
  xm_sim_result_t sim;
  xm_fab_kind_t sim_kind = XM_FAB_FAT_TREE;
  bool simulated = false;
  if (!rc && a->simulate && rs[0].chosen >= 0) {
    const char *where = a->cluster_path ? a->cluster_path : a->spec_path;
    xm_status_t st =
        simulate_chosen(spec, where, a->cluster_path != NULL, &rs[0].cands[rs[0].chosen].point,
                        routing ? &cost_rt : NULL, &sim_kind, &sim, diag);
    if (st != XM_OK) rc = xm_status_exit_code(st);
    simulated = st == XM_OK;
  }
  if (!rc && !a->json) {
    if (a->all_policies)
      print_text_policies(&ctx, rs, n);
    else
      print_text_one(&ctx, &rs[0], a->top);
    if (simulated) print_simulated(sim_kind, &sim);
  } else if (!rc) {
    cJSON *root = cJSON_CreateObject();
    json_header(root, spec);
    json_routing(root, &ctx);
    if (a->all_policies) {
      cJSON *arr = cJSON_AddArrayToObject(root, "policies");
      for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        json_plan(o, &ctx, &rs[i], a->top);
        cJSON_AddItemToArray(arr, o);
      }
    } else {
      json_plan(root, &ctx, &rs[0], a->top);
    }
    if (simulated) cJSON_AddItemToObject(root, "simulated", json_simulated(sim_kind, &sim));
    rc = xm_print_json("plan", root);
  }
  for (int i = 0; i < n; i++)
    xm_plan_result_free(&rs[i]);
  return rc;
}

int xm_cmd_plan(int argc, char **argv) {
  plan_args_t a;
  int rc = plan_parse_args(argc, argv, &a);
  if (rc) return rc;
  if (a.help) {
    plan_usage(stdout);
    return 0;
  }
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_spec_t spec;
  xm_routing_t *routing = NULL;
  xm_status_t st = load(&a, &diag, &spec, &routing);
  /* Warnings about the inputs come before the plan. */
  xm_diag_print(&diag, stderr);
  int errors = xm_diag_error_count(&diag);
  xm_diag_free(&diag);
  xm_diag_init(&diag);
  if (st == XM_OK) {
    fflush(stderr);
    rc = run_searches(&a, &spec, routing, &diag);
    xm_diag_print(&diag, stderr);
    errors += xm_diag_error_count(&diag);
  } else {
    rc = xm_status_exit_code(st);
  }
  xm_diag_free(&diag);
  xm_routing_free(routing);
  if (rc && errors)
    fprintf(stderr, "xmoec plan: failed (%d error%s)\n", errors, errors == 1 ? "" : "s");
  return rc;
}
