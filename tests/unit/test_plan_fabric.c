/* tests/unit/test_plan_fabric.c — one network model: the planner's
 * communication times are the network layer's closed forms on the
 * non-blocking fat-tree (planner/network.h, fabric/analytic.h), collective
 * by collective, for every kind of layout; the flow engine agrees with
 * both where the closed form is exact; and a plan's step timed on a
 * topology (planner/simulate.h) adds up. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "fabric/topology.h"
#include "planner/cost.h"
#include "planner/simulate.h"

static void load(const char *rel, const char *cluster, xm_spec_t *s) {
  char path[1024], cpath[1024];
  snprintf(path, sizeof path, "%s/%s", XM_SOURCE_DIR, rel);
  snprintf(cpath, sizeof cpath, "%s/samples/clusters/%s", XM_SOURCE_DIR, cluster);
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(xm_spec_load_file(path, &d, s), XM_OK);
  assert_int_equal(xm_spec_load_cluster_file(cpath, &d, s), XM_OK);
  xm_diag_free(&d);
}

static xm_cost_point_t point(int64_t dp, int64_t tp, int64_t ep, bool ssmb, bool rbd, int zero,
                             int64_t rpn, int64_t mb, xm_policy_t pol, xm_recompute_t rc) {
  xm_cost_point_t p;
  memset(&p, 0, sizeof p);
  p.layout = (xm_layout_t){
      .dp = dp, .tp = tp, .ep = ep, .ssmb = ssmb, .rbd = rbd, .zero = zero, .ranks_per_node = rpn};
  p.micro_batch = mb;
  p.policy = pol;
  p.recompute = rc;
  return p;
}

static bool near(double a, double b, double rel) {
  return fabs(a - b) <= rel * (fabs(a) > fabs(b) ? fabs(a) : fabs(b)) + 1e-15;
}

typedef struct {
  const char *spec, *cluster;
  int64_t dp, tp, ep;
  bool ssmb, rbd;
  int zero;
  xm_policy_t pol;
  xm_recompute_t rc;
} pcase_t;

static const pcase_t k_cases[] = {
    {"samples/xmoe-small.json", "frontier-1024.json", 1024, 1, 64, 0, 0, 0, XM_POLICY_XMOEC,
     XM_RECOMPUTE_NONE},
    {"samples/xmoe-small.json", "frontier-1024.json", 512, 2, 16, 1, 1, 1, XM_POLICY_XMOEC,
     XM_RECOMPUTE_FULL},
    {"samples/xmoe-small.json", "frontier-1024.json", 256, 4, 32, 1, 0, 1, XM_POLICY_XMOEC,
     XM_RECOMPUTE_MOE},
    {"samples/xmoe-small.json", "frontier-1024.json", 512, 2, 32, 0, 0, 1, XM_POLICY_DEEPSPEED_TED,
     XM_RECOMPUTE_NONE},
    {"samples/xmoe-small.json", "frontier-1024.json", 1024, 1, 64, 0, 0, 0, XM_POLICY_DEEPSPEED_MOE,
     XM_RECOMPUTE_NONE},
    {"samples/hf/deepseek-v3.json", "h200-128.json", 64, 2, 64, 1, 1, 1, XM_POLICY_XMOEC,
     XM_RECOMPUTE_FULL},
    {"samples/hf/deepseek-v3.json", "h200-128.json", 128, 1, 32, 0, 1, 0, XM_POLICY_XMOEC,
     XM_RECOMPUTE_NONE},
    {"samples/xmoe-medium.json", "h200-128.json", 32, 4, 8, 1, 0, 1, XM_POLICY_XMOEC,
     XM_RECOMPUTE_MOE},
    {"samples/deepseek-v3-mini.json", "h200-8.json", 4, 2, 4, 1, 0, 1, XM_POLICY_XMOEC,
     XM_RECOMPUTE_NONE},
};

/* Case c's step on the fat-tree of its cluster, by `engine`. */
static void run_case(const pcase_t *c, xm_sim_engine_t engine, xm_sim_result_t *r) {
  xm_spec_t s;
  load(c->spec, c->cluster, &s);
  s.training.global_batch = 1024;
  xm_cost_point_t pt = point(c->dp, c->tp, c->ep, c->ssmb, c->rbd, c->zero,
                             s.cluster.ranks_per_node, 1, c->pol, c->rc);
  xm_diag_t d;
  xm_diag_init(&d);
  xm_fab_topo_t t;
  assert_int_equal(xm_fab_topo_from_cluster(&s.cluster, XM_FAB_FAT_TREE, 0, &t, &d), XM_OK);
  xm_status_t st = xm_plan_simulate(&s, &pt, NULL, NULL, &t, engine, &d, r);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  xm_diag_free(&d);
}

/* The planner's step and the network layer's closed forms on the fat-tree
 * of the same cluster give the same communication, part by part: exactly
 * for the all-to-alls, to 1e-6 for the rings (the network layer counts
 * the runtime's chunks to the byte, the planner every member's mean). */
static void test_planner_is_the_fat_tree(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
    xm_sim_result_t r;
    run_case(&k_cases[i], XM_SIM_ANALYTIC, &r);
    fprintf(stderr, "case %zu: dispatch %.12g / %.12g, tp %.12g / %.12g, dp %.12g / %.12g\n", i,
            r.dispatch_s, r.model_dispatch_s, r.tp_s, r.model_tp_s, r.reduce_exposed_s + r.gather_s,
            r.model_dp_s);
    assert_true(r.dispatch_s > 0);
    assert_true(near(r.dispatch_s, r.model_dispatch_s, 1e-9));
    assert_true(near(r.tp_s, r.model_tp_s, 1e-6));
    assert_true(near(r.reduce_exposed_s + r.gather_s, r.model_dp_s, 1e-6));
    assert_true(near(r.iteration_s, r.model_step_s, 1e-6));
  }
}

/* The flow engine on the same step: within 1% of the closed form (exact
 * for balanced rings and uniform all-to-alls, which these are). */
static void test_engine_agrees(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i += 4) {
    xm_sim_result_t a, e;
    run_case(&k_cases[i], XM_SIM_ANALYTIC, &a);
    run_case(&k_cases[i], XM_SIM_SIMGRID, &e);
    fprintf(stderr, "case %zu: analytic comm %.9g, simgrid %.9g\n", i, a.comm_s, e.comm_s);
    assert_true(near(a.comm_s, e.comm_s, 1e-2));
    assert_true(near(a.compute_s, e.compute_s, 0));
  }
}

/* regional-ocs with synthetic routing: circuits planned per iteration (one
 * reconfiguration a step) or per layer (one before every MoE layer's
 * forward and backward all-to-all of each micro-batch, and one before the
 * reductions), each charged in the step; the bytes stay the cost model's. */
static void test_ocs_step(void **state) {
  (void)state;
  xm_spec_t s;
  load("samples/xmoe-small.json", "frontier-1024.json", &s);
  s.training.global_batch = 1024;
  xm_cost_point_t pt =
      point(1024, 1, 64, 0, 1, 0, s.cluster.ranks_per_node, 1, XM_POLICY_XMOEC, XM_RECOMPUTE_NONE);
  xm_sim_routing_t rt = {.locality = 0.8, .source_affinity = 0.9, .seed = 3};
  xm_sim_result_t it, ly, ft;
  for (int per_layer = 0; per_layer < 2; per_layer++) {
    s.cluster.ocs_reconfig = per_layer ? XM_OCS_PER_LAYER : XM_OCS_PER_ITERATION;
    xm_diag_t d;
    xm_diag_init(&d);
    xm_fab_topo_t t;
    assert_int_equal(xm_fab_topo_from_cluster(&s.cluster, XM_FAB_REGIONAL_OCS, 0, &t, &d), XM_OK);
    xm_status_t st =
        xm_plan_simulate(&s, &pt, NULL, &rt, &t, XM_SIM_ANALYTIC, &d, per_layer ? &ly : &it);
    if (st != XM_OK) xm_diag_print(&d, stderr);
    assert_int_equal(st, XM_OK);
    xm_fab_topo_t f;
    assert_int_equal(xm_fab_topo_from_cluster(&s.cluster, XM_FAB_FAT_TREE, 0, &f, &d), XM_OK);
    assert_int_equal(xm_plan_simulate(&s, &pt, NULL, &rt, &f, XM_SIM_ANALYTIC, &d, &ft), XM_OK);
    xm_diag_free(&d);
  }
  int64_t lmoe = s.model.layers - s.model.first_k_dense;
  int64_t G = s.training.global_batch / (pt.layout.dp * pt.micro_batch); /* micro-steps */
  assert_int_equal(it.reconfigurations, 1);
  assert_int_equal(ly.reconfigurations, 2 * lmoe * G + 1);
  assert_true(it.circuits > 0 && ly.circuits >= it.circuits);
  assert_true(fabs(it.reconfig_s - 0.01) < 1e-12);
  assert_true(fabs(ly.reconfig_s - (double)(2 * lmoe * G + 1) * 0.01) < 1e-9);
  assert_true(near(it.iteration_s, it.compute_s + it.comm_s, 1e-12));
  assert_true(it.comm_s >= it.reconfig_s);
  /* the same bytes whatever the topology; the synthetic layers differ */
  assert_true(near(it.inter_bytes + it.intra_bytes, ft.inter_bytes + ft.intra_bytes, 1e-9));
  assert_true(it.layer_tvd > 0 && it.locality_ranks == 1024);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_planner_is_the_fat_tree),
      cmocka_unit_test(test_engine_agrees),
      cmocka_unit_test(test_ocs_step),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
