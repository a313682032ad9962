/* tests/unit/test_fabric_sim.c — the flow engine (fabric/sim.c) and the
 * topologies (fabric/topology.c) against closed forms (docs/fabric.md,
 * "Closed forms"): every time below is written out by hand from the
 * bottleneck it names, and compared at 1e-6 relative (the engine's sharing
 * is exact max-min; SimGrid's sizes are whole bytes). Phases are built by
 * hand with xm_fab_phase_add.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fabric/flow.h"
#include "fabric/sim.h"
#include "fabric/topology.h"

#define REL 1e-6

static void assert_rel(double got, double want) {
  if (!(fabs(got - want) <= REL * fabs(want))) {
    fprintf(stderr, "got %.12g, want %.12g (rel %.3g)\n", got, want, got / want - 1);
    fail();
  }
}

/* A cluster of `nodes` x `rpn` with the spec's default speeds. */
static xm_cluster_spec_t cluster(int64_t nodes, int64_t rpn) {
  xm_cluster_spec_t c;
  memset(&c, 0, sizeof c);
  c.present = true;
  c.nodes = nodes;
  c.ranks_per_node = rpn;
  c.intra_bw_gbps = 100;
  c.intra_latency_us = 2;
  c.inter_bw_gbps = 12.5;
  c.inter_latency_us = 5;
  c.switch_radix = 64;
  c.oversubscription = 2;
  c.ocs_reconfig_ms = 10;
  return c;
}

static xm_fab_topo_t topo(const xm_cluster_spec_t *c, xm_fab_kind_t kind, double link_gbps) {
  xm_fab_topo_t t;
  xm_diag_t d;
  xm_diag_init(&d);
  xm_status_t st = xm_fab_topo_from_cluster(c, kind, link_gbps, &t, &d);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  xm_diag_free(&d);
  return t;
}

static void add(xm_fab_phase_t *p, int64_t src, int64_t dst, double bytes) {
  assert_int_equal(xm_fab_phase_add(p, src, dst, bytes), XM_OK);
}

static void set_circuits(xm_fab_phase_t *p, const xm_fab_circuit_t *c, int64_t n, bool reconf) {
  free(p->circuits);
  p->circuits = n ? malloc((size_t)n * sizeof *c) : NULL;
  if (n) memcpy(p->circuits, c, (size_t)n * sizeof *c);
  p->num_circuits = n;
  p->reconfigure = reconf;
}

static void simulate(const xm_fab_topo_t *t, const xm_fab_phase_t *ph, int64_t n, double *out) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_status_t st = xm_fab_simulate(t, ph, n, out, &d);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  xm_diag_free(&d);
}

static double sim1(const xm_fab_topo_t *t, const xm_fab_phase_t *ph) {
  double s;
  simulate(t, ph, 1, &s);
  return s;
}

/* ---- (a) uniform all-to-all on a non-blocking fat-tree ---------------------- */

/* P = S R ranks, every rank sends b to every other. A server's NIC
 * (nic_ports link_bw) sends R (P - R) b to the other servers, every
 * server at once, and nothing else limits it (full bisection): inter =
 * R (P - R) b / (nic_ports link_bw). Inside a node a rank sends (R - 1) b
 * on its own link: intra = (R - 1) b / intra_bw. The phase takes
 * max(inter, intra) + latency_steps * inter-node latency. */
static void test_alltoall_fat_tree(void **state) {
  (void)state;
  const int64_t S = 4, R = 4, P = S * R;
  const double b = 1e7;
  for (int slow_intra = 0; slow_intra < 2; slow_intra++) {
    xm_cluster_spec_t c = cluster(S, R);
    if (slow_intra) c.intra_bw_gbps = 1;
    xm_fab_topo_t t = topo(&c, XM_FAB_FAT_TREE, 0);
    assert_int_equal(t.nic_ports, R);
    assert_rel(t.link_bw, 12.5e9); /* inter_bw per rank, ranks = ports */
    xm_fab_phase_t ph;
    xm_fab_phase_init(&ph, "dispatch", 0);
    ph.latency_steps = 1;
    for (int64_t i = 0; i < P; i++)
      for (int64_t j = 0; j < P; j++)
        add(&ph, i, j, b);
    double inter = (double)(R * (P - R)) * b / ((double)t.nic_ports * t.link_bw);
    double intra = (double)(R - 1) * b / t.intra_bw;
    double want = (inter > intra ? inter : intra) + 5e-6;
    assert_rel(sim1(&t, &ph), want);
    xm_fab_phase_free(&ph);
  }
}

/* ---- (b) ring all-reduce ---------------------------------------------------- */

/* B bytes over P ranks, one per server: 2 (P - 1) steps, each rank sends
 * B/P to its successor per step, every step bounded by one NIC:
 * 2 (P - 1)/P B / link_bw + 2 (P - 1) latencies. As one phase (each rank
 * sends its whole 2 (P - 1)/P B) and as 2 (P - 1) phases of B/P. */
static void test_ring_allreduce(void **state) {
  (void)state;
  const int64_t P = 8;
  const double B = 64e6;
  xm_cluster_spec_t c = cluster(P, 1);
  xm_fab_topo_t t = topo(&c, XM_FAB_FAT_TREE, 0);
  double want = 2.0 * (double)(P - 1) / (double)P * B / t.link_bw + 2.0 * (double)(P - 1) * 5e-6;

  xm_fab_phase_t one;
  xm_fab_phase_init(&one, "all_reduce", -1);
  one.latency_steps = 2.0 * (double)(P - 1);
  for (int64_t i = 0; i < P; i++)
    add(&one, i, (i + 1) % P, 2.0 * (double)(P - 1) / P * B);
  assert_rel(sim1(&t, &one), want);

  enum { STEPS = 14 };
  xm_fab_phase_t steps[STEPS];
  for (int s = 0; s < STEPS; s++) {
    xm_fab_phase_init(&steps[s], "all_reduce", -1);
    steps[s].latency_steps = 1;
    for (int64_t i = 0; i < P; i++)
      add(&steps[s], i, (i + 1) % P, B / (double)P);
  }
  double out[STEPS], sum = 0;
  simulate(&t, steps, STEPS, out);
  for (int s = 0; s < STEPS; s++) {
    assert_rel(out[s], B / (double)P / t.link_bw + 5e-6);
    sum += out[s];
  }
  assert_rel(sum, want);
  for (int s = 0; s < STEPS; s++)
    xm_fab_phase_free(&steps[s]);
  xm_fab_phase_free(&one);
}

/* ---- (c) one bottleneck shared by n flows ----------------------------------- */

/* n servers each send b to server 0: its NIC (nic_ports link_bw, here 2
 * ports of --link-gbps 100 = 12.5e9 B/s) carries n b: n b / (2 link_bw);
 * intra-node only phase: latency is the intra-node one. */
static void test_incast(void **state) {
  (void)state;
  const int64_t n = 4;
  const double b = 5e7;
  xm_cluster_spec_t c = cluster(n + 1, 1);
  c.nic_ports = 2;
  xm_fab_topo_t t = topo(&c, XM_FAB_FAT_TREE, 100);
  assert_rel(t.link_bw, 12.5e9);
  xm_fab_phase_t ph[2];
  xm_fab_phase_init(&ph[0], "incast", -1);
  ph[0].latency_steps = 1;
  for (int64_t s = 1; s <= n; s++)
    add(&ph[0], s, 0, b);
  /* 2 ranks in one node, 3 flows into rank 0 over its own link */
  xm_cluster_spec_t c2 = cluster(1, 4);
  xm_fab_topo_t t2 = topo(&c2, XM_FAB_FAT_TREE, 0);
  xm_fab_phase_init(&ph[1], "intra", -1);
  ph[1].latency_steps = 3;
  for (int64_t r = 1; r < 4; r++)
    add(&ph[1], r, 0, b);
  assert_rel(sim1(&t, &ph[0]), (double)n * b / (2 * t.link_bw) + 5e-6);
  assert_rel(sim1(&t2, &ph[1]), 3 * b / t2.intra_bw + 3 * 2e-6);
  xm_fab_phase_free(&ph[0]);
  xm_fab_phase_free(&ph[1]);
}

/* ---- (d) oversubscribed fat-tree -------------------------------------------- */

/* switch_radix 8, oversubscription 3, one port per server: a leaf has
 * floor(8 * 3/4) = 6 server ports and an uplink of 6 link_bw / 3. Each of
 * the 6 servers of leaf 0 sends b to its partner in leaf 1: 6 b / (2
 * link_bw) = 3 b / link_bw, three times the non-blocking b / link_bw;
 * traffic inside a leaf is not slowed. */
static void test_oversubscribed(void **state) {
  (void)state;
  const double b = 2.5e7;
  xm_cluster_spec_t c = cluster(12, 1);
  c.switch_radix = 8;
  c.oversubscription = 3;
  xm_fab_topo_t over = topo(&c, XM_FAB_FAT_TREE_OVERSUB, 0);
  xm_fab_topo_t full = topo(&c, XM_FAB_FAT_TREE, 0);
  xm_fab_phase_t ph[2];
  xm_fab_phase_init(&ph[0], "cross", -1);
  for (int64_t s = 0; s < 6; s++)
    add(&ph[0], s, s + 6, b);
  xm_fab_phase_init(&ph[1], "inside", -1);
  for (int64_t s = 0; s < 6; s++)
    add(&ph[1], s, (s + 1) % 6, b);
  double o[2], f[2];
  simulate(&over, ph, 2, o);
  simulate(&full, ph, 2, f);
  assert_rel(f[0], b / full.link_bw);
  assert_rel(o[0], 3 * b / over.link_bw);
  assert_rel(o[0] / f[0], c.oversubscription);
  assert_rel(o[1], b / over.link_bw);
  xm_fab_phase_free(&ph[0]);
  xm_fab_phase_free(&ph[1]);
}

/* ---- (e) dragonfly ---------------------------------------------------------- */

/* 4 servers, one per router, 2 routers per group, 1 global link per
 * router: 2 groups joined by 2 global links (router 0 to router 0, 1 to
 * 1). Group 0 sends b to every server of group 1: 4 b over 2 global links
 * of link_bw, 2 b / link_bw, although each NIC (2 ports) could take them
 * in b / link_bw. One server sending to both servers of group 1 uses its
 * router's one global link: 2 b / link_bw again, not the NIC's b /
 * link_bw. Inside a group the local link is the limit: b / link_bw. */
static void test_dragonfly(void **state) {
  (void)state;
  const double b = 1e7;
  xm_cluster_spec_t c = cluster(4, 1);
  c.nic_ports = 2;
  c.switch_radix = 4;
  c.dragonfly_servers_per_router = 1;
  c.dragonfly_routers_per_group = 2;
  c.dragonfly_global_links = 1;
  xm_fab_topo_t t = topo(&c, XM_FAB_DRAGONFLY, 100);
  assert_int_equal(t.df_groups, 2);
  xm_fab_phase_t ph[3];
  xm_fab_phase_init(&ph[0], "bisection", -1);
  for (int64_t s = 0; s < 2; s++)
    for (int64_t d = 2; d < 4; d++)
      add(&ph[0], s, d, b);
  xm_fab_phase_init(&ph[1], "one", -1);
  add(&ph[1], 0, 2, b);
  add(&ph[1], 0, 3, b);
  xm_fab_phase_init(&ph[2], "local", -1);
  add(&ph[2], 0, 1, b);
  add(&ph[2], 2, 3, b);
  double out[3];
  simulate(&t, ph, 3, out);
  assert_rel(out[0], 2 * b / t.link_bw);
  assert_rel(out[1], 2 * b / t.link_bw);
  assert_rel(out[2], b / t.link_bw);
  for (int i = 0; i < 3; i++)
    xm_fab_phase_free(&ph[i]);

  /* The Frontier-like default: 64-port routers, 8 ports per node: 2
   * nodes per router (16 ports), 32 routers per group (31 local), 17
   * global; 128 nodes fill 2 groups joined by 32 * 17 links. */
  xm_cluster_spec_t f = cluster(128, 8);
  xm_fab_topo_t ft = topo(&f, XM_FAB_DRAGONFLY, 0);
  assert_int_equal(ft.df_servers_per_router, 2);
  assert_int_equal(ft.df_routers_per_group, 32);
  assert_int_equal(ft.df_global_links, 17);
  assert_int_equal(ft.df_groups, 2);
}

/* ---- (f) regional-ocs ------------------------------------------------------- */

/* 8 nodes in regions of 4, 4 ports of link_bw each, 2 on the OCS: the
 * electrical path is 2 link_bw. Node 0 sends b to node 1: b / (2 link_bw)
 * without a circuit; with 2 circuits (2 link_bw more) b / (4 link_bw),
 * faster by (2 + 2)/2. A phase that reconfigures region 0 delays its
 * flows by exactly reconfig_s; one that keeps the circuits, or flows of
 * the other region and between regions, are not delayed. */
static void test_regional_ocs(void **state) {
  (void)state;
  const double b = 1e7;
  xm_cluster_spec_t c = cluster(8, 1);
  c.nic_ports = 4;
  c.ocs_ports = 2;
  c.ocs_region_servers = 4;
  c.ocs_reconfig_ms = 10;
  xm_fab_topo_t t = topo(&c, XM_FAB_REGIONAL_OCS, 100);
  assert_rel(t.reconfig_s, 0.01);
  double bw = t.link_bw;
  enum { N = 6 };
  xm_fab_phase_t ph[N];
  for (int i = 0; i < N; i++) {
    xm_fab_phase_init(&ph[i], "dispatch", i);
    add(&ph[i], 0, 1, b);
  }
  const xm_fab_circuit_t two[] = {{0, 1, 2}};
  const xm_fab_circuit_t other[] = {{1, 0, 1}, {2, 3, 1}};
  set_circuits(&ph[1], two, 1, false);
  set_circuits(&ph[2], two, 1, true); /* same circuits: no pause */
  set_circuits(&ph[3], other, 2, true);
  /* region 1 and inter-region flows in a reconfiguring phase */
  set_circuits(&ph[4], two, 1, true);
  add(&ph[4], 4, 5, b);
  add(&ph[4], 0, 6, b);
  set_circuits(&ph[5], two, 1, true);
  ph[5].num_flows = 0;
  add(&ph[5], 4, 5, b);
  add(&ph[5], 2, 6, b);
  double out[N];
  simulate(&t, ph, N, out);
  assert_rel(out[0], b / (2 * bw));
  assert_rel(out[1], b / (4 * bw));
  assert_rel(out[0] / out[1], (2 * bw + 2 * bw) / (2 * bw));
  assert_rel(out[2], b / (4 * bw));
  assert_rel(out[3], t.reconfig_s + b / (3 * bw));
  /* phase 4: 0 -> 1 paused (region 0 changed back); 0 -> 6 runs at once
   * on node 0's electrical ports and is done long before the pause ends */
  assert_rel(out[4], t.reconfig_s + b / (4 * bw));
  /* phase 5: circuits as in phase 4, so nothing pauses */
  assert_rel(out[5], b / (2 * bw));
  for (int i = 0; i < N; i++)
    xm_fab_phase_free(&ph[i]);
}

/* ---- (g) bad parameters ----------------------------------------------------- */

static void expect_bad(const xm_cluster_spec_t *c, xm_fab_kind_t kind, const char *key) {
  xm_fab_topo_t t;
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(xm_fab_topo_from_cluster(c, kind, 0, &t, &d), XM_ERR_INVALID_INPUT);
  if (xm_diag_find(&d, key) < 0) xm_diag_print(&d, stderr);
  assert_true(xm_diag_find(&d, key) >= 0);
  assert_true(strlen(d.entries[0].message) > 10);
  xm_diag_free(&d);
}

static void test_bad_parameters(void **state) {
  (void)state;
  xm_cluster_spec_t c = cluster(32, 8);
  c.ocs_ports = 8; /* all 8 NIC ports: no electrical one */
  expect_bad(&c, XM_FAB_REGIONAL_OCS, "/ocs_ports");
  c = cluster(8, 8);
  c.ocs_region_servers = 16;
  expect_bad(&c, XM_FAB_REGIONAL_OCS, "/ocs_region_servers");
  c = cluster(8, 1);
  expect_bad(&c, XM_FAB_REGIONAL_OCS, "/nic_ports"); /* one port cannot be split */
  c = cluster(16, 4);
  c.ocs_switch_ports = 8;
  expect_bad(&c, XM_FAB_REGIONAL_OCS, "/ocs_switch_ports");
  c = cluster(64, 1);
  c.switch_radix = 4;
  c.dragonfly_servers_per_router = 1;
  c.dragonfly_routers_per_group = 2;
  c.dragonfly_global_links = 1;
  expect_bad(&c, XM_FAB_DRAGONFLY, "/dragonfly_global_links");
  c.dragonfly_servers_per_router = 4;
  expect_bad(&c, XM_FAB_DRAGONFLY, "/switch_radix");
  c = cluster(8, 8);
  c.oversubscription = 0.5;
  expect_bad(&c, XM_FAB_FAT_TREE_OVERSUB, "/oversubscription");
  c = cluster(8, 64);
  c.switch_radix = 64; /* 64 ports per node, a leaf has 42 server ports */
  expect_bad(&c, XM_FAB_FAT_TREE_OVERSUB, "/switch_radix");

  /* phases: a rank outside the cluster, a circuit across regions, more
   * circuits than a node's OCS ports */
  c = cluster(8, 1);
  c.nic_ports = 4;
  c.ocs_region_servers = 4;
  xm_fab_topo_t t = topo(&c, XM_FAB_REGIONAL_OCS, 0);
  xm_fab_phase_t ph;
  xm_fab_phase_init(&ph, "bad", -1);
  add(&ph, 0, 8, 1e6);
  double s;
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(xm_fab_simulate(&t, &ph, 1, &s, &d), XM_ERR_INVALID_INPUT);
  assert_true(xm_diag_find(&d, "phase 0") >= 0);
  assert_non_null(strstr(d.entries[0].message, "rank 8"));
  xm_diag_free(&d);
  ph.num_flows = 0;
  add(&ph, 0, 1, 1e6);
  const xm_fab_circuit_t across[] = {{3, 4, 1}};
  set_circuits(&ph, across, 1, false);
  xm_diag_init(&d);
  assert_int_equal(xm_fab_simulate(&t, &ph, 1, &s, &d), XM_ERR_INVALID_INPUT);
  assert_true(xm_diag_find(&d, "phase 0") >= 0);
  xm_diag_free(&d);
  const xm_fab_circuit_t many[] = {{0, 1, 2}, {0, 2, 1}};
  set_circuits(&ph, many, 2, false);
  xm_diag_init(&d);
  assert_int_equal(xm_fab_simulate(&t, &ph, 1, &s, &d), XM_ERR_INVALID_INPUT);
  assert_non_null(strstr(d.entries[0].message, "more than its 2 OCS ports"));
  xm_diag_free(&d);
  xm_fab_phase_free(&ph);
}

/* A SimGrid that cannot be loaded is an internal error with its reason,
 * not a crash or a hang. */
static void test_child_failure(void **state) {
  (void)state;
  xm_cluster_spec_t c = cluster(2, 1);
  xm_fab_topo_t t = topo(&c, XM_FAB_FAT_TREE, 0);
  xm_fab_phase_t ph;
  xm_fab_phase_init(&ph, "x", -1);
  add(&ph, 0, 1, 1e6);
  setenv("XMOEC_SIMGRID", "/nonexistent/libsimgrid.so", 1);
  double s;
  xm_diag_t d;
  xm_diag_init(&d);
  xm_status_t st = xm_fab_simulate(&t, &ph, 1, &s, &d);
  unsetenv("XMOEC_SIMGRID");
  assert_int_equal(st, XM_ERR_INTERNAL);
  assert_true(d.errors == 1);
  assert_non_null(strstr(d.entries[0].message, "cannot load SimGrid"));
  xm_diag_free(&d);
  assert_rel(sim1(&t, &ph), 1e6 / t.link_bw); /* and the next call works */
  xm_fab_phase_free(&ph);
}

/* ---- bill of materials ------------------------------------------------------ */

/* 128 nodes x 8 ports of radix-64 switches: 1024 ports need 2 tiers (2 *
 * 32^2 >= 1024): 1024/32 leaves + 1024/64 spines, ports 3 x 1024, 1024
 * copper server cables and 1024 optical leaf-spine links. regional-ocs with
 * 4 OCS ports: the electrical Clos of 512 ports and 8 regions of 16 x 4 =
 * 64 OCS ports, each one OCS of 64 ports. */
static void test_bom(void **state) {
  (void)state;
  xm_cluster_spec_t c = cluster(128, 8);
  c.link_gbps = 400;
  xm_fab_bom_t b;
  xm_fab_topo_t ft = topo(&c, XM_FAB_FAT_TREE, 0);
  xm_fab_bom(&ft, &b);
  assert_rel(b.link_gbps, 400);
  assert_rel(b.nic_ports, 1024);
  assert_rel(b.switches, 48);
  assert_rel(b.switch_ports, 3072);
  assert_rel(b.copper_cables, 1024);
  assert_rel(b.transceivers, 2048);
  assert_rel(b.fibres, 1024);
  assert_true(b.ocs_ports == 0 && b.ocs_switches == 0);

  xm_fab_topo_t ocs = topo(&c, XM_FAB_REGIONAL_OCS, 0);
  assert_int_equal(ocs.region_servers, 16);
  assert_int_equal(ocs.ocs_ports, 4);
  assert_int_equal(ocs.ocs_switch_ports, 64);
  xm_fab_bom(&ocs, &b);
  assert_rel(b.switches, 16 + 8);
  assert_rel(b.switch_ports, 1536);
  assert_rel(b.ocs_ports, 512);
  assert_rel(b.ocs_switches, 8);
  assert_rel(b.transceivers, 2 * 512 + 512);
  assert_rel(b.fibres, 512 + 512);
  assert_rel(b.copper_cables, 512);

  /* oversubscribed 2:1 on radix 64: leaves of 42 server ports hold 5 nodes
   * (40 ports) with 20 uplinks; 26 leaves, 520 uplinks into one spine
   * tier (the leaves are the Clos's bottom tier). */
  xm_fab_topo_t ov = topo(&c, XM_FAB_FAT_TREE_OVERSUB, 0);
  xm_fab_bom(&ov, &b);
  /* 26 leaves of 5 nodes (40 ports down, 20 up) and one spine tier of
   * ceil(520 / 64) switches: cheaper than the non-blocking tree's 48. */
  assert_rel(b.switches, 26 + 9);
  assert_rel(b.switch_ports, 1024 + 520 + 520);
  assert_rel(b.fibres, 520);
  assert_rel(b.transceivers, 2 * 520);
  assert_true(b.switch_ports < 3072);

  /* dragonfly default: 2 groups of 32 routers, 2 x 496 local links, 544
   * global ones */
  xm_fab_topo_t df = topo(&c, XM_FAB_DRAGONFLY, 0);
  xm_fab_bom(&df, &b);
  assert_rel(b.switches, 64);
  assert_rel(b.copper_cables, 1024 + 992);
  assert_rel(b.fibres, 544);
  assert_rel(b.switch_ports, 1024 + 2 * 992 + 2 * 544);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_alltoall_fat_tree),
      cmocka_unit_test(test_ring_allreduce),
      cmocka_unit_test(test_incast),
      cmocka_unit_test(test_oversubscribed),
      cmocka_unit_test(test_dragonfly),
      cmocka_unit_test(test_regional_ocs),
      cmocka_unit_test(test_bad_parameters),
      cmocka_unit_test(test_child_failure),
      cmocka_unit_test(test_bom),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
