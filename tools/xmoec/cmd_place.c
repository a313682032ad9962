/* tools/xmoec/cmd_place.c — `xmoec place`: a topology-aware expert
 * placement from a run's routing statistics (docs/placement.md).
 *
 *   xmoec place --model MODEL --stats FILE [--nodes N] [--max-imbalance X]
 *               [--passes N] [-o placement.json] [--json]
 *
 * Reads the statistics `out/train --routing-stats FILE` wrote, checks that
 * they are the model's (routed experts, top-k, MoE layers), places each
 * layer's experts over the node blocks (planner/place.c) so that experts
 * chosen together share a node, under a load-balance bound, and prints what
 * RBD's inter-node pilot rows and a flat dispatch's inter-node rows become,
 * predicted from the sampled tokens. -o writes the placement file that
 * `xmoec compile --placement FILE` applies; it is checked against the model
 * first, so a written placement always compiles.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "frontend/spec.h"
#include "planner/placement.h"
#include "support/diag.h"
#include "tools/xmoec/args.h"
#include "tools/xmoec/commands.h"
#include "tools/xmoec/json_out.h"

#define CMD "xmoec place"

typedef struct {
  const char *model, *stats, *out;
  int64_t nodes; /* 0: the statistics' */
  double max_imbalance;
  int64_t passes;
  bool json, help;
} place_args_t;

static void usage(FILE *out) {
  fprintf(out,
          "usage: xmoec place --model MODEL --stats FILE [--nodes N] [--max-imbalance X]\n"
          "                   [--passes N] [-o placement.json] [--json]\n"
          "\n"
          "Places each MoE layer's experts over the node blocks of expert parallelism so\n"
          "that experts chosen together share a node, from the routing statistics of a run\n"
          "(out/train --routing-stats FILE), and predicts RBD's inter-node pilot rows and a\n"
          "flat dispatch's inter-node rows before and after. `xmoec compile --placement FILE`\n"
          "applies the written placement; checkpoints keep the Hugging Face expert numbering.\n"
          "docs/placement.md has the formats and the algorithm.\n"
          "\n"
          "  --model MODEL        model spec or Hugging Face config.json the run trained\n"
          "  --stats FILE         the run's routing statistics\n"
          "  --nodes N            node blocks to place over (default: the nodes the run's\n"
          "                       expert-parallel group spanned)\n"
          "  --max-imbalance X    a node block receives at most (1 + X) x the mean routed\n"
          "                       load (default 0.1)\n"
          "  --passes N           local search passes at most (default 20)\n"
          "  -o FILE              write the placement file\n"
          "  --json               one JSON document on stdout (docs/placement.md)\n");
}

static const xm_flag_t k_flags[] = {
    {"--model", true},  {"--stats", true}, {"--nodes", true}, {"--max-imbalance", true},
    {"--passes", true}, {"-o", true},      {"--json", false}, {NULL, false}};

static int parse_args(int argc, char **argv, place_args_t *a) {
  if (xm_args_check("place", argc, argv, k_flags)) return 2;
  memset(a, 0, sizeof *a);
  a->max_imbalance = 0.1;
  a->passes = 20;
  for (int i = 0; i < argc; i++) {
    bool missing = false;
    const char *v;
    const char *arg = argv[i];
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
      a->help = true;
      return 0;
    } else if (strcmp(arg, "--json") == 0) {
      a->json = true;
    } else if ((v = xm_arg_value(argc, argv, &i, "--model", &missing))) {
      a->model = v;
    } else if ((v = xm_arg_value(argc, argv, &i, "--stats", &missing))) {
      a->stats = v;
    } else if ((v = xm_arg_value(argc, argv, &i, "-o", &missing))) {
      a->out = v;
    } else if ((v = xm_arg_value(argc, argv, &i, "--nodes", &missing))) {
      if (!xm_arg_int(v, 2, 1 << 20, &a->nodes)) {
        fprintf(stderr, CMD ": error: --nodes needs an integer in [2, 1048576], got '%s'\n", v);
        return 2;
      }
    } else if ((v = xm_arg_value(argc, argv, &i, "--passes", &missing))) {
      if (!xm_arg_int(v, 0, 1 << 20, &a->passes)) {
        fprintf(stderr, CMD ": error: --passes needs an integer in [0, 1048576], got '%s'\n", v);
        return 2;
      }
    } else if ((v = xm_arg_value(argc, argv, &i, "--max-imbalance", &missing))) {
      char *end = NULL;
      double x = v[0] ? strtod(v, &end) : NAN;
      if (!end || *end || !isfinite(x) || x < 0 || x > 1e6) {
        fprintf(stderr, CMD ": error: --max-imbalance needs a number in [0, 1e6], got '%s'\n", v);
        return 2;
      }
      a->max_imbalance = x;
    } else if (missing) {
      fprintf(stderr, CMD ": error: %s needs a value\n", arg);
      return 2;
    } else {
      fprintf(stderr, CMD ": error: unexpected argument '%s' (see xmoec place --help)\n", arg);
      return 2;
    }
  }
  if (!a->model || !a->stats) {
    fprintf(stderr, CMD ": error: %s is required (see xmoec place --help)\n",
            !a->model ? "--model" : "--stats");
    return 2;
  }
  return 0;
}

static int finish(xm_diag_t *d, xm_status_t st) {
  xm_diag_print(d, stderr);
  xm_diag_free(d);
  return xm_status_exit_code(st);
}

/* The statistics are the model's: experts, top-k; the layers are checked
 * with the placement (xm_placement_check). */
static xm_status_t check_stats(const xm_spec_t *spec, const xm_routing_stats_t *s,
                               const char *model, xm_diag_t *d) {
  if (spec->moe.experts <= 0) {
    xm_diag_add(d, XM_DIAG_ERROR, model, "/moe",
                "the model has no routed experts: there is nothing to place");
    return XM_ERR_INVALID_INPUT;
  }
  xm_status_t st = XM_OK;
  if (s->experts != spec->moe.experts) {
    xm_diag_add(d, XM_DIAG_ERROR, s->source, "/experts",
                "the statistics are of %lld routed experts, the model %s has %lld: give the "
                "model the run trained",
                (long long)s->experts, model, (long long)spec->moe.experts);
    st = XM_ERR_INVALID_INPUT;
  }
  if (s->top_k != spec->moe.top_k) {
    xm_diag_add(d, XM_DIAG_ERROR, s->source, "/top_k",
                "the statistics are of top-%lld routing, the model %s routes top-%lld",
                (long long)s->top_k, model, (long long)spec->moe.top_k);
    st = XM_ERR_INVALID_INPUT;
  }
  if (st == XM_OK && s->model && s->model[0] && strcmp(s->model, spec->name) != 0)
    xm_diag_add(d, XM_DIAG_WARNING, s->source, "/model",
                "the statistics name the model '%s', the spec '%s'", s->model, spec->name);
  return st;
}

static void progress(void *ctx, int64_t i, int64_t count, int64_t layer) {
  (void)ctx;
  if (count >= 4)
    fprintf(stderr, "place: layer %lld (%lld of %lld)\n", (long long)layer, (long long)(i + 1),
            (long long)count);
}

static void print_rows(const char *what, bool known, double a, double b) {
  if (!known) {
    printf("  %-9s       unknown (no sampled tokens)\n", what);
    return;
  }
  printf("  %-9s %14.0f -> %14.0f  (%+.1f%%)\n", what, a, b, a > 0 ? 100.0 * (b - a) / a : 0.0);
}

static void print_text(const xm_place_result_t *r, const xm_routing_stats_t *s, const char *model) {
  printf("placement of %s over %lld node blocks of %lld experts (statistics %s: %lld steps, "
         "%s), load bound (1 + %.3g) x the mean\n",
         model, (long long)r->nodes, (long long)(s->experts / r->nodes), s->source,
         (long long)s->steps,
         r->sources ? "the sampled tokens' source nodes" : "a uniform source node (expectation)",
         r->max_imbalance);
  printf("%6s %9s %9s %12s %12s %7s %12s %12s %9s %10s %6s\n", "layer", "tokens", "samples",
         "rbd_ident", "rbd_placed", "drop", "flat_ident", "flat_placed", "imb_ident", "imb_placed",
         "swaps");
  for (int64_t i = 0; i < r->num_layers; i++) {
    const xm_place_layer_t *l = &r->layers[i];
    printf("%6lld %9lld %9lld ", (long long)l->layer, (long long)l->tokens, (long long)l->samples);
    double a = l->identity.rbd_inter_rows, b = l->placed.rbd_inter_rows;
    if (l->predicted)
      printf("%12.0f %12.0f %6.1f%% %12.0f %12.0f ", a, b, a > 0 ? 100.0 * (1 - b / a) : 0.0,
             l->identity.flat_inter_rows, l->placed.flat_inter_rows);
    else
      printf("%12s %12s %7s %12s %12s ", "-", "-", "-", "-", "-");
    printf("%9.3f %10.3f %6lld%s\n", l->identity.imbalance, l->placed.imbalance,
           (long long)l->swaps, l->changed ? "" : "  (identity kept)");
  }
  bool any = r->unpredicted < r->num_layers;
  printf("inter-node rows over the run, identity -> placed:\n");
  print_rows("rbd", any, r->total_identity.rbd_inter_rows, r->total_placed.rbd_inter_rows);
  print_rows("flat", any, r->total_identity.flat_inter_rows, r->total_placed.flat_inter_rows);
  printf("  imbalance (worst layer) %.3f -> %.3f\n", r->total_identity.imbalance,
         r->total_placed.imbalance);
  if (r->unpredicted)
    printf("%lld layer(s) without sampled tokens are placed by co-selection counts and left "
           "out of the totals\n",
           (long long)r->unpredicted);
}

static int run(const place_args_t *a) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_spec_t spec;
  xm_routing_stats_t s;
  memset(&s, 0, sizeof s);
  xm_status_t st = xm_spec_load_file(a->model, &d, &spec);
  if (st == XM_OK && xm_diag_error_count(&d) > 0) st = XM_ERR_INVALID_INPUT;
  if (st != XM_OK) return finish(&d, st);
  st = xm_routing_stats_load(a->stats, &d, &s);
  if (st == XM_OK) st = check_stats(&spec, &s, a->model, &d);
  int64_t nodes = a->nodes;
  if (st == XM_OK && nodes == 0) {
    nodes = s.nodes;
    if (nodes < 2) {
      xm_diag_add(&d, XM_DIAG_ERROR, "--nodes", NULL,
                  "the run's expert-parallel group was on one node: give the node blocks to "
                  "place over with --nodes N");
      st = XM_ERR_INVALID_INPUT;
    }
  }
  if (st == XM_OK && s.nodes >= 2 && nodes != s.nodes)
    xm_diag_add(&d, XM_DIAG_NOTE, "--nodes", NULL,
                "the run spanned %lld nodes, placing over %lld: the prediction assumes a "
                "uniform source node",
                (long long)s.nodes, (long long)nodes);
  xm_place_options_t o = {.nodes = nodes,
                          .max_imbalance = a->max_imbalance,
                          .passes = a->passes,
                          .n_group = spec.moe.n_group,
                          .progress = a->json ? NULL : progress};
  xm_place_result_t r;
  memset(&r, 0, sizeof r);
  if (st == XM_OK) st = xm_place_run(&s, &o, &d, &r);
  /* What is written must compile: the same check as xmoec compile --placement. */
  if (st == XM_OK) {
    int from = d.count;
    st = xm_placement_check(&r.placement, &spec, &d);
    if (st != XM_OK) xm_diag_name_file(&d, from, a->stats);
  }
  cJSON *root = st == XM_OK ? xm_place_result_json(&r, &s) : NULL;
  if (st == XM_OK && !root) st = XM_ERR_NO_MEMORY;
  if (st == XM_OK && a->out) {
    char *pred = cJSON_PrintUnformatted(root);
    if (!pred)
      st = XM_ERR_NO_MEMORY;
    else
      st = xm_placement_write(a->out, &r.placement, pred, &d);
    cJSON_free(pred);
  }
  if (st != XM_OK) {
    cJSON_Delete(root);
    xm_place_result_free(&r);
    xm_routing_stats_free(&s);
    return finish(&d, st);
  }
  xm_diag_print(&d, stderr);
  xm_diag_free(&d);
  int rc = 0;
  if (a->json) {
    rc = xm_print_json("place", root);
  } else {
    cJSON_Delete(root);
    print_text(&r, &s, a->model);
    if (a->out) printf("wrote %s (xmoec compile --placement %s)\n", a->out, a->out);
  }
  xm_place_result_free(&r);
  xm_routing_stats_free(&s);
  return rc;
}

int xm_cmd_place(int argc, char **argv) {
  place_args_t a;
  int rc = parse_args(argc, argv, &a);
  if (rc) return rc;
  if (a.help) {
    usage(stdout);
    return 0;
  }
  return run(&a);
}
