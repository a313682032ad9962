/* tests/unit/test_fabric_collective.c — the flows of the runtime's
 * collectives (fabric/collective.c) against the byte model the runtime
 * counts (docs/traffic.md) and the planner's network layer
 * (planner/network.h): what each ring member sends, how that splits
 * between its node and the network, and the same for all-to-alls, the
 * groups of a layout and the server demand matrix.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fabric/collective.h"
#include "planner/network.h"

#define assert_near(a, b, tol) assert_true(fabs((double)(a) - (double)(b)) <= (tol))

static xm_fab_group_t grp(int64_t first, int64_t stride, int64_t size) {
  return (xm_fab_group_t){.first = first, .stride = stride, .size = size};
}

static xm_net_t net(int64_t nodes, int64_t rpn) {
  return (xm_net_t){.nodes = nodes,
                    .ranks_per_node = rpn,
                    .intra_bw = 100e9,
                    .inter_bw = 10e9,
                    .intra_lat = 2e-6,
                    .inter_lat = 5e-6};
}

/* Bytes of the flows from `src` to `dst` in p. */
static double flow_bytes(const xm_fab_phase_t *p, int64_t src, int64_t dst) {
  double b = 0;
  for (int64_t k = 0; k < p->num_flows; k++)
    if (p->flows[k].src == src && p->flows[k].dst == dst) b += p->flows[k].bytes;
  return b;
}

/* ---- hand-computed ------------------------------------------------------- */

/* 5 fp32 over 4 members: chunks 2,1,1,1, member i sends 28, 32, 32, 28
 * bytes, half (floor) to its successor and the rest to its predecessor. */
static void test_ring_all_reduce_uneven(void **state) {
  (void)state;
  xm_fab_phase_t p;
  xm_fab_phase_init(&p, "all_reduce", -1);
  assert_int_equal(xm_fab_ring(&p, XM_FAB_ALL_REDUCE, grp(0, 1, 4), 20), XM_OK);
  assert_int_equal(p.num_flows, 8);
  assert_near(p.latency_steps, 6, 0);
  double sent[4] = {28, 32, 32, 28};
  for (int64_t i = 0; i < 4; i++) {
    assert_near(flow_bytes(&p, i, (i + 1) % 4), floor(sent[i] / 2), 0);
    assert_near(flow_bytes(&p, i, (i + 3) % 4), sent[i] - floor(sent[i] / 2), 0);
  }
  xm_fab_phase_free(&p);

  /* 13 bytes (not a multiple of 4: 1-byte elements) over 3 members of a
   * strided group: chunks 5,4,4; member i sends (13 - c_i) + (13 - c_{i+1}). */
  xm_fab_phase_init(&p, "all_reduce", -1);
  assert_int_equal(xm_fab_ring(&p, XM_FAB_ALL_REDUCE, grp(1, 3, 3), 13), XM_OK);
  assert_near(xm_fab_ring_member_bytes(XM_FAB_ALL_REDUCE, 3, 13, 0), 8 + 9, 0);
  assert_near(xm_fab_ring_member_bytes(XM_FAB_ALL_REDUCE, 3, 13, 1), 9 + 9, 0);
  assert_near(xm_fab_ring_member_bytes(XM_FAB_ALL_REDUCE, 3, 13, 2), 9 + 8, 0);
  assert_near(flow_bytes(&p, 1, 4), 8, 0); /* 17: 8 to the successor */
  assert_near(flow_bytes(&p, 1, 7), 9, 0); /* and 9 to the predecessor */
  assert_near(flow_bytes(&p, 4, 7), 9, 0);
  assert_near(flow_bytes(&p, 4, 1), 9, 0);
  assert_near(p.latency_steps, 4, 0);
  xm_fab_phase_free(&p);
}

/* A group of 2 sends everything to the one peer; a group of 1 nothing. */
static void test_ring_small_groups(void **state) {
  (void)state;
  xm_fab_phase_t p;
  xm_fab_phase_init(&p, "all_reduce", -1);
  assert_int_equal(xm_fab_ring(&p, XM_FAB_ALL_REDUCE, grp(3, 5, 2), 4), XM_OK);
  /* one element: member 0 owns chunk 0, each member sends 4 bytes */
  assert_int_equal(p.num_flows, 2);
  assert_near(flow_bytes(&p, 3, 8), 4, 0);
  assert_near(flow_bytes(&p, 8, 3), 4, 0);
  assert_near(p.latency_steps, 2, 0);
  assert_int_equal(xm_fab_ring(&p, XM_FAB_ALL_GATHER, grp(5, 1, 1), 1000), XM_OK);
  assert_int_equal(xm_fab_ring(&p, XM_FAB_ZERO_REDUCE_SCATTER, grp(5, 0, 1), 1000), XM_OK);
  assert_int_equal(p.num_flows, 2);
  assert_near(p.latency_steps, 2, 0);
  assert_near(xm_fab_ring_steps(XM_FAB_ALL_REDUCE, 1), 0, 0);
  xm_fab_phase_free(&p);
}

/* ZeRO-1's chunks of ceil(n/P): 10 elements over 4 are 3,3,3,1. */
static void test_ring_zero_chunks(void **state) {
  (void)state;
  double rs[4] = {28, 28, 28, 36}, ag[4] = {28, 28, 36, 28};
  for (int64_t i = 0; i < 4; i++) {
    assert_near(xm_fab_ring_member_bytes(XM_FAB_ZERO_REDUCE_SCATTER, 4, 40, i), rs[i], 0);
    assert_near(xm_fab_ring_member_bytes(XM_FAB_ZERO_ALL_GATHER, 4, 40, i), ag[i], 0);
  }
  /* 2 elements over 4: chunks 1,1,0,0 */
  assert_near(xm_fab_ring_member_bytes(XM_FAB_ZERO_REDUCE_SCATTER, 4, 8, 3), 8, 0);
  assert_near(xm_fab_ring_member_bytes(XM_FAB_ZERO_REDUCE_SCATTER, 4, 8, 0), 4, 0);
  xm_fab_phase_t p;
  xm_fab_phase_init(&p, "reduce_scatter", -1);
  assert_int_equal(xm_fab_ring(&p, XM_FAB_ZERO_REDUCE_SCATTER, grp(0, 1, 4), 40), XM_OK);
  assert_near(p.latency_steps, 3, 0);
  assert_near(flow_bytes(&p, 3, 0), 18, 0);
  assert_near(flow_bytes(&p, 3, 2), 18, 0);
  xm_fab_phase_free(&p);
  assert_string_equal(xm_fab_coll_phase_name(XM_FAB_ZERO_REDUCE_SCATTER), "reduce_scatter");
  assert_string_equal(xm_fab_coll_phase_name(XM_FAB_ZERO_ALL_GATHER), "all_gather");
  assert_string_equal(xm_fab_coll_phase_name(XM_FAB_ALL_REDUCE), "all_reduce");
}

/* Sizes that are not a whole number of bytes: the continuous figures. */
static void test_ring_continuous(void **state) {
  (void)state;
  assert_near(xm_fab_ring_member_bytes(XM_FAB_ALL_REDUCE, 4, 10.5, 2), 1.5 * 10.5, 1e-12);
  assert_near(xm_fab_ring_member_bytes(XM_FAB_ALL_GATHER, 4, 10.5, 2), 3 * 10.5, 1e-12);
  assert_near(xm_fab_ring_member_bytes(XM_FAB_ZERO_ALL_GATHER, 4, 10.5, 0), 0.75 * 10.5, 1e-12);
  xm_fab_phase_t p;
  xm_fab_phase_init(&p, "all_reduce", -1);
  assert_int_equal(xm_fab_ring(&p, XM_FAB_ALL_REDUCE, grp(0, 1, 4), 10.5), XM_OK);
  assert_near(flow_bytes(&p, 0, 1), 1.5 * 10.5 / 2, 1e-12);
  assert_near(flow_bytes(&p, 0, 3), 1.5 * 10.5 / 2, 1e-12);
  xm_fab_phase_free(&p);
}

static void test_ring_invalid(void **state) {
  (void)state;
  xm_fab_phase_t p;
  xm_fab_phase_init(&p, "x", -1);
  assert_int_equal(xm_fab_ring(&p, XM_FAB_ALL_REDUCE, grp(0, 0, 4), 8), XM_ERR_INVALID_INPUT);
  assert_int_equal(xm_fab_ring(&p, XM_FAB_ALL_REDUCE, grp(-1, 1, 4), 8), XM_ERR_INVALID_INPUT);
  assert_int_equal(xm_fab_ring(&p, XM_FAB_ALL_REDUCE, grp(0, 1, 0), 8), XM_ERR_INVALID_INPUT);
  assert_int_equal(xm_fab_ring(&p, XM_FAB_ALL_REDUCE, grp(0, 1, 4), -8), XM_ERR_INVALID_INPUT);
  assert_int_equal(xm_fab_ring(&p, XM_FAB_ALL_REDUCE, grp(0, 1, 4), INFINITY),
                   XM_ERR_INVALID_INPUT);
  double m[4] = {0, 1, -1, 0};
  assert_int_equal(xm_fab_all_to_all(&p, grp(0, 1, 2), m), XM_ERR_INVALID_INPUT);
  assert_int_equal(p.num_flows, 0);
  xm_fab_phase_free(&p);
}

/* ---- against planner/network.h --------------------------------------------- */

/* For many group shapes, node sizes and buffers: what each member sends to
 * its node and to other nodes equals xm_net_ring_member, and the group's
 * totals equal xm_net_ring's intra/inter split. */
static void test_ring_matches_planner(void **state) {
  (void)state;
  const xm_fab_coll_t kinds[] = {XM_FAB_ALL_REDUCE, XM_FAB_ALL_GATHER, XM_FAB_REDUCE_SCATTER,
                                 XM_FAB_ZERO_REDUCE_SCATTER, XM_FAB_ZERO_ALL_GATHER};
  const xm_net_coll_t net_kinds[] = {XM_NET_ALL_REDUCE, XM_NET_ALL_GATHER, XM_NET_REDUCE_SCATTER,
                                     XM_NET_ZERO_REDUCE_SCATTER, XM_NET_ZERO_ALL_GATHER};
  const double sizes[] = {4, 12, 13, 20, 40, 4096, 4100, 9999, 1 << 20, 3 * 7 * 11 * 4 + 4};
  const int64_t rpns[] = {1, 2, 3, 4, 8};
  int64_t checked = 0;
  for (size_t ki = 0; ki < 5; ki++)
    for (int64_t P = 1; P <= 9; P++)
      for (int64_t stride = 1; stride <= 5; stride += 2)
        for (int64_t first = 0; first <= 3; first++)
          for (size_t ri = 0; ri < 5; ri++)
            for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
              int64_t rpn = rpns[ri];
              xm_net_t n = net(64, rpn);
              xm_fab_group_t g = grp(first, stride, P);
              xm_net_group_t ng = {.first = first, .stride = stride, .size = P};
              xm_fab_phase_t p;
              xm_fab_phase_init(&p, "ring", -1);
              assert_int_equal(xm_fab_ring(&p, kinds[ki], g, sizes[si]), XM_OK);
              assert_near(p.latency_steps, P < 2 ? 0 : (ki == 0 ? 2 * (P - 1) : P - 1), 0);
              double tot_in = 0, tot_out = 0;
              for (int64_t i = 0; i < P; i++) {
                int64_t me = first + i * stride;
                double in = 0, out = 0;
                for (int64_t k = 0; k < p.num_flows; k++) {
                  if (p.flows[k].src != me) continue;
                  *(p.flows[k].dst / rpn == me / rpn ? &in : &out) += p.flows[k].bytes;
                }
                double ref_in, ref_out;
                xm_net_ring_member(&n, net_kinds[ki], ng, sizes[si], i, &ref_in, &ref_out);
                assert_near(in, ref_in, 0);
                assert_near(out, ref_out, 0);
                assert_near(in + out, xm_fab_ring_member_bytes(kinds[ki], P, sizes[si], i), 0);
                tot_in += in;
                tot_out += out;
                checked++;
              }
              xm_net_cost_t c = xm_net_ring(&n, net_kinds[ki], ng, sizes[si]);
              assert_near(tot_in, c.intra_bytes, 0);
              assert_near(tot_out, c.inter_bytes, 0);
              xm_fab_phase_free(&p);
            }
  assert_true(checked > 10000);
}

/* ---- all-to-all ---------------------------------------------------------------- */

static void test_all_to_all_matrix(void **state) {
  (void)state;
  /* members 2, 4, 6 */
  const double m[9] = {5,  10, 20, /* member 0 keeps 5 */
                       30, 0,  0,  /* member 1 sends only to member 0 */
                       1,  2,  3};
  xm_fab_phase_t p;
  xm_fab_phase_init(&p, "dispatch", 3);
  assert_int_equal(xm_fab_all_to_all(&p, grp(2, 2, 3), m), XM_OK);
  assert_int_equal(p.num_flows, 5);
  assert_near(flow_bytes(&p, 2, 4), 10, 0);
  assert_near(flow_bytes(&p, 2, 6), 20, 0);
  assert_near(flow_bytes(&p, 4, 2), 30, 0);
  assert_near(flow_bytes(&p, 4, 6), 0, 0);
  assert_near(flow_bytes(&p, 6, 2), 1, 0);
  assert_near(flow_bytes(&p, 6, 4), 2, 0);
  assert_near(p.latency_steps, 2, 0); /* P - 1 messages */
  assert_int_equal(p.layer, 3);
  xm_fab_phase_free(&p);

  /* nothing moves: no latency round */
  const double z[4] = {7, 0, 0, 7};
  xm_fab_phase_init(&p, "dispatch", 0);
  assert_int_equal(xm_fab_all_to_all(&p, grp(0, 1, 2), z), XM_OK);
  assert_int_equal(p.num_flows, 0);
  assert_near(p.latency_steps, 0, 0);
  xm_fab_phase_free(&p);
}

/* Uniform: P (P-1) flows of b; on nodes of 4 each member of an 8-rank group
 * sends 3 b inside its node and 4 b outside, as xm_net_all_to_all counts. */
static void test_all_to_all_uniform(void **state) {
  (void)state;
  xm_fab_phase_t p;
  xm_fab_phase_init(&p, "dispatch", 0);
  assert_int_equal(xm_fab_all_to_all_uniform(&p, grp(0, 1, 8), 100), XM_OK);
  assert_int_equal(p.num_flows, 56);
  double in = 0, out = 0;
  for (int64_t k = 0; k < p.num_flows; k++) {
    assert_near(p.flows[k].bytes, 100, 0);
    assert_true(p.flows[k].src != p.flows[k].dst);
    *(p.flows[k].src / 4 == p.flows[k].dst / 4 ? &in : &out) += p.flows[k].bytes;
  }
  xm_net_t n = net(2, 4);
  xm_net_cost_t c = xm_net_all_to_all(&n, (xm_net_group_t){0, 1, 8}, 300, 400);
  assert_near(in, c.intra_bytes, 0);
  assert_near(out, c.inter_bytes, 0);
  assert_near(p.latency_steps, 7, 0);
  xm_fab_phase_free(&p);
}

/* ---- the groups of a layout ---------------------------------------------------- */

static void test_layout_groups(void **state) {
  (void)state;
  xm_layout_t l = {.dp = 4, .tp = 2, .ep = 4, .ranks_per_node = 4};
  xm_fab_group_t *gs;
  int64_t n;
  assert_int_equal(xm_fab_layout_groups(&l, XM_GROUP_DP, &gs, &n), XM_OK);
  assert_int_equal(n, 2); /* {0,2,4,6}, {1,3,5,7} */
  assert_int_equal(gs[0].first, 0);
  assert_int_equal(gs[0].stride, 2);
  assert_int_equal(gs[0].size, 4);
  assert_int_equal(gs[1].first, 1);
  assert_int_equal(gs[1].stride, 2);
  free(gs);
  assert_int_equal(xm_fab_layout_groups(&l, XM_GROUP_TP, &gs, &n), XM_OK);
  assert_int_equal(n, 4);
  for (int64_t k = 0; k < 4; k++) {
    assert_int_equal(gs[k].first, 2 * k);
    assert_int_equal(gs[k].stride, 1);
    assert_int_equal(gs[k].size, 2);
  }
  free(gs);
  assert_int_equal(xm_fab_layout_groups(&l, XM_GROUP_EDP, &gs, &n), XM_OK);
  assert_int_equal(n, 4); /* {r, r + 4}, r < 4 */
  assert_int_equal(gs[3].first, 3);
  assert_int_equal(gs[3].stride, 4);
  assert_int_equal(gs[3].size, 2);
  free(gs);
  assert_int_equal(xm_fab_layout_groups(&l, XM_GROUP_WORLD, &gs, &n), XM_OK);
  assert_int_equal(n, 1);
  assert_int_equal(gs[0].size, 8);
  free(gs);
  /* tp = 1: DP groups of 1 member stride... every rank one DP group of 8 */
  xm_layout_t single = {.dp = 1, .tp = 8, .ep = 1, .ranks_per_node = 8};
  assert_int_equal(xm_fab_layout_groups(&single, XM_GROUP_DP, &gs, &n), XM_OK);
  assert_int_equal(n, 8);
  assert_int_equal(gs[5].first, 5);
  assert_int_equal(gs[5].size, 1);
  free(gs);
  xm_layout_t bad = {.dp = 3, .tp = 1, .ep = 2, .ranks_per_node = 3};
  assert_int_equal(xm_fab_layout_groups(&bad, XM_GROUP_EP, &gs, &n), XM_ERR_INVALID_INPUT);
  assert_null(gs);
}

/* The DP all-reduce of a dp 4 x tp 2 layout: both DP groups' rings in one
 * phase, bytes equal to the sum of xm_net_ring over the two groups. */
static void test_ring_layout(void **state) {
  (void)state;
  xm_layout_t l = {.dp = 4, .tp = 2, .ep = 2, .ranks_per_node = 4};
  xm_fab_phase_t p;
  xm_fab_phase_init(&p, "all_reduce", -1);
  assert_int_equal(xm_fab_ring_layout(&p, &l, XM_GROUP_DP, XM_FAB_ALL_REDUCE, 20), XM_OK);
  assert_int_equal(p.num_flows, 16);
  assert_near(p.latency_steps, 6, 0);
  xm_net_t n = net(2, 4);
  double ref_out = 0, ref_in = 0, in = 0, out = 0;
  for (int64_t r = 0; r < 2; r++) {
    xm_net_cost_t c = xm_net_ring(&n, XM_NET_ALL_REDUCE, (xm_net_group_t){r, 2, 4}, 20);
    ref_in += c.intra_bytes;
    ref_out += c.inter_bytes;
  }
  for (int64_t k = 0; k < p.num_flows; k++) {
    assert_true(p.flows[k].src % 2 == p.flows[k].dst % 2); /* inside its DP group */
    *(p.flows[k].src / 4 == p.flows[k].dst / 4 ? &in : &out) += p.flows[k].bytes;
  }
  assert_near(in, ref_in, 0);
  assert_near(out, ref_out, 0);
  xm_fab_phase_free(&p);

  xm_fab_phase_init(&p, "dispatch", 0);
  assert_int_equal(xm_fab_all_to_all_uniform_layout(&p, &l, XM_GROUP_EP, 64), XM_OK);
  assert_int_equal(p.num_flows, 8); /* 4 groups of 2, 2 flows each */
  for (int64_t k = 0; k < p.num_flows; k++)
    assert_int_equal(p.flows[k].src / 2, p.flows[k].dst / 2);
  xm_fab_phase_free(&p);
}

/* ---- servers ------------------------------------------------------------------- */

static void test_server_demand(void **state) {
  (void)state;
  /* 3 servers of 2 ranks; a uniform all-to-all of 10 bytes over ranks
   * 0..5: every ordered server pair carries 4 flows, 40 bytes. */
  xm_fab_phase_t ph[2];
  xm_fab_phase_init(&ph[0], "dispatch", 0);
  xm_fab_phase_init(&ph[1], "all_reduce", -1);
  assert_int_equal(xm_fab_all_to_all_uniform(&ph[0], grp(0, 1, 6), 10), XM_OK);
  /* and a pair all-reduce of 8 bytes between ranks 1 and 4 (servers 0, 2):
   * 8 bytes each way */
  assert_int_equal(xm_fab_ring(&ph[1], XM_FAB_ALL_REDUCE, grp(1, 3, 2), 8), XM_OK);
  double *d;
  assert_int_equal(xm_fab_server_demand_create(ph, 2, 3, 2, &d), XM_OK);
  for (int s = 0; s < 3; s++)
    for (int t = 0; t < 3; t++) {
      double want = s == t ? 0 : 40;
      if ((s == 0 && t == 2) || (s == 2 && t == 0)) want += 8;
      assert_near(d[s * 3 + t], want, 0);
    }
  /* adding again accumulates */
  assert_int_equal(xm_fab_server_demand(&ph[1], 3, 2, d), XM_OK);
  assert_near(d[0 * 3 + 2], 56, 0);
  assert_near(d[1 * 3 + 0], 40, 0);
  free(d);
  /* a rank outside the servers */
  assert_int_equal(xm_fab_server_demand_create(ph, 2, 2, 2, &d), XM_ERR_INVALID_INPUT);
  assert_null(d);
  xm_fab_phase_free(&ph[0]);
  xm_fab_phase_free(&ph[1]);
}

/* The server demand of a strided DP all-reduce equals the planner's
 * inter-node bytes. */
static void test_server_demand_matches_planner(void **state) {
  (void)state;
  xm_fab_phase_t p;
  xm_fab_phase_init(&p, "all_reduce", -1);
  xm_fab_group_t g = grp(1, 3, 7); /* ranks 1, 4, ..., 19 on nodes of 4 */
  assert_int_equal(xm_fab_ring(&p, XM_FAB_ALL_REDUCE, g, 4 * 1001), XM_OK);
  double *d;
  assert_int_equal(xm_fab_server_demand_create(&p, 1, 5, 4, &d), XM_OK);
  double sum = 0;
  for (int k = 0; k < 25; k++)
    sum += d[k];
  xm_net_t n = net(5, 4);
  xm_net_cost_t c = xm_net_ring(&n, XM_NET_ALL_REDUCE, (xm_net_group_t){1, 3, 7}, 4 * 1001);
  assert_near(sum, c.inter_bytes, 0);
  assert_true(sum > 0);
  free(d);
  xm_fab_phase_free(&p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ring_all_reduce_uneven),
      cmocka_unit_test(test_ring_small_groups),
      cmocka_unit_test(test_ring_zero_chunks),
      cmocka_unit_test(test_ring_continuous),
      cmocka_unit_test(test_ring_invalid),
      cmocka_unit_test(test_ring_matches_planner),
      cmocka_unit_test(test_all_to_all_matrix),
      cmocka_unit_test(test_all_to_all_uniform),
      cmocka_unit_test(test_layout_groups),
      cmocka_unit_test(test_ring_layout),
      cmocka_unit_test(test_server_demand),
      cmocka_unit_test(test_server_demand_matches_planner),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
