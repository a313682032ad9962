/* tests/unit/test_net.c — the network layer of the cost model
 * (planner/network.c): bytes per link class and time of ring collectives
 * and all-to-alls on a hierarchical topology.
 *
 * Hand-computed cases for groups inside one node, across two nodes,
 * strided groups, groups of two and uneven chunks; then a property test
 * against a brute-force reference that walks every member the way the
 * runtime's counters do (docs/traffic.md: member i sends floor(b_i/2) to its
 * successor, the rest to its predecessor, all of it in a group of 2),
 * over many group shapes, node sizes and buffer sizes.
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

#include "planner/network.h"

static xm_net_t net(int64_t nodes, int64_t rpn) {
  return (xm_net_t){.nodes = nodes,
                    .ranks_per_node = rpn,
                    .intra_bw = 100e9,
                    .inter_bw = 10e9,
                    .intra_lat = 2e-6,
                    .inter_lat = 5e-6};
}

static xm_net_group_t grp(int64_t first, int64_t stride, int64_t size) {
  return (xm_net_group_t){.first = first, .stride = stride, .size = size};
}

#define assert_near(a, b, tol) assert_true(fabs((double)(a) - (double)(b)) <= (tol))

/* ---- hand-computed ------------------------------------------------------- */

static void test_from_cluster(void **state) {
  (void)state;
  xm_cluster_spec_t c = {.nodes = 128,
                         .ranks_per_node = 8,
                         .intra_bw_gbps = 100,
                         .inter_bw_gbps = 12.5,
                         .intra_latency_us = 2,
                         .inter_latency_us = 3};
  xm_net_t n;
  xm_net_from_cluster(&c, &n);
  assert_int_equal(n.nodes, 128);
  assert_int_equal(n.ranks_per_node, 8);
  assert_near(n.intra_bw, 100e9, 1);
  assert_near(n.inter_bw, 12.5e9, 1);
  assert_near(n.intra_lat, 2e-6, 1e-15);
  assert_near(n.inter_lat, 3e-6, 1e-15);
}

/* All-reduce of 8 fp32 over 4 ranks of one node: chunks of 2, every member
 * sends 4 * (6 + 6) = 48 bytes, nothing leaves the node. */
static void test_ring_inside_node(void **state) {
  (void)state;
  xm_net_t n = net(2, 4);
  xm_net_cost_t c = xm_net_ring(&n, XM_NET_ALL_REDUCE, grp(0, 1, 4), 32);
  assert_near(c.intra_bytes, 192, 0);
  assert_near(c.inter_bytes, 0, 0);
  /* 48 bytes at intra_bw plus 2 (P-1) = 6 steps of intra latency */
  assert_near(c.seconds, 48 / 100e9 + 6 * 2e-6, 1e-15);
  /* the second node's group: the same */
  xm_net_cost_t d = xm_net_ring(&n, XM_NET_ALL_REDUCE, grp(4, 1, 4), 32);
  assert_near(d.intra_bytes, 192, 0);
  assert_near(d.seconds, c.seconds, 1e-18);
}

/* The same over 2 nodes of 2: edges 0-1 and 2-3 stay, 1-2 and 3-0 cross;
 * every member has one neighbour on each side, so half its bytes cross. */
static void test_ring_two_nodes(void **state) {
  (void)state;
  xm_net_t n = net(2, 2);
  xm_net_cost_t c = xm_net_ring(&n, XM_NET_ALL_REDUCE, grp(0, 1, 4), 32);
  assert_near(c.intra_bytes, 96, 0);
  assert_near(c.inter_bytes, 96, 0);
  assert_near(c.seconds, 24 / 100e9 + 24 / 10e9 + 6 * 5e-6, 1e-15);
  /* crossing nodes costs more than staying inside one */
  xm_net_t one = net(1, 4);
  assert_true(c.seconds > xm_net_ring(&one, XM_NET_ALL_REDUCE, grp(0, 1, 4), 32).seconds);
}

/* Uneven all-reduce chunks: 5 elements over 4 members are 2,1,1,1; member
 * i sends 4 ((5 - c_i) + (5 - c_{i+1})) = 28, 32, 32, 28 bytes. Edge 1-2
 * carries 16 + 16, edge 3-0 carries 14 + 14. */
static void test_ring_uneven_chunks(void **state) {
  (void)state;
  xm_net_t n = net(2, 2);
  xm_net_cost_t c = xm_net_ring(&n, XM_NET_ALL_REDUCE, grp(0, 1, 4), 20);
  assert_near(c.intra_bytes + c.inter_bytes, 120, 0);
  assert_near(c.inter_bytes, 60, 0);
  /* one node of 3 and one of 1 (ranks 1,2,3 at rpn 2: nodes {1}, {2,3}... ):
   * group {1,2,3}: member 0 (rank 1) is alone on node 0 */
  xm_net_cost_t d = xm_net_ring(&n, XM_NET_ALL_REDUCE, grp(1, 1, 3), 12);
  /* 3 elements, chunks 1,1,1: each member sends 4 (2 + 2) = 16 bytes;
   * edges 0-1 (ranks 1-2) and 2-0 (ranks 3-1) cross: 8 + 8 each */
  assert_near(d.intra_bytes + d.inter_bytes, 48, 0);
  assert_near(d.inter_bytes, 32, 0);
  /* the isolated member sends everything across: 16 bytes at inter_bw */
  assert_near(d.seconds, 16 / 10e9 + 4 * 5e-6, 1e-15);
}

/* A DP group strided by tp = 2 over 8 ranks, 4 per node: ranks 0,2,4,6 on
 * nodes 0,0,1,1; and stride 4 = one member per node: everything crosses. */
static void test_ring_strided(void **state) {
  (void)state;
  xm_net_t n = net(4, 4);
  xm_net_cost_t c = xm_net_ring(&n, XM_NET_ALL_REDUCE, grp(0, 2, 4), 32);
  assert_near(c.intra_bytes, 96, 0);
  assert_near(c.inter_bytes, 96, 0);
  xm_net_cost_t o = xm_net_ring(&n, XM_NET_ALL_REDUCE, grp(1, 2, 4), 32);
  assert_near(o.inter_bytes, 96, 0);
  xm_net_cost_t s = xm_net_ring(&n, XM_NET_ALL_REDUCE, grp(3, 4, 4), 32);
  assert_near(s.intra_bytes, 0, 0);
  assert_near(s.inter_bytes, 192, 0);
  assert_near(s.seconds, 48 / 10e9 + 6 * 5e-6, 1e-15);
}

/* A group of 2 has one peer, who gets all of each member's bytes. */
static void test_ring_pair(void **state) {
  (void)state;
  xm_net_t n = net(2, 2);
  xm_net_cost_t in = xm_net_ring(&n, XM_NET_ALL_REDUCE, grp(0, 1, 2), 4);
  /* 1 element: member 0 owns it; each sends 4 bytes (one half each) */
  assert_near(in.intra_bytes, 8, 0);
  assert_near(in.inter_bytes, 0, 0);
  xm_net_cost_t out = xm_net_ring(&n, XM_NET_ALL_REDUCE, grp(1, 1, 2), 4);
  assert_near(out.inter_bytes, 8, 0);
  assert_near(out.intra_bytes, 0, 0);
}

/* All-gather of B bytes per member and reduce-scatter to B per member:
 * (P-1) B per member; ZeRO-1's halves with chunks of ceil(n/P). */
static void test_gather_scatter_zero(void **state) {
  (void)state;
  xm_net_t n = net(2, 4);
  xm_net_cost_t ag = xm_net_ring(&n, XM_NET_ALL_GATHER, grp(0, 1, 4), 100);
  assert_near(ag.intra_bytes, 4 * 3 * 100, 0);
  assert_near(ag.seconds, 300 / 100e9 + 3 * 2e-6, 1e-15);
  xm_net_cost_t rs = xm_net_ring(&n, XM_NET_REDUCE_SCATTER, grp(2, 1, 4), 100);
  assert_near(rs.intra_bytes + rs.inter_bytes, 1200, 0);
  assert_near(rs.inter_bytes, 600, 0); /* ranks 2,3 | 4,5: two edges cross */
  /* 10 elements over 4: chunks 3,3,3,1; RS member i sends 4 (10 - len_i)
   * = 28,28,28,36; AG member i sends 4 (10 - len_{i+1}) = 28,28,36,28 */
  xm_net_t two = net(2, 2);
  xm_net_cost_t zrs = xm_net_ring(&two, XM_NET_ZERO_REDUCE_SCATTER, grp(0, 1, 4), 40);
  assert_near(zrs.intra_bytes + zrs.inter_bytes, 120, 0);
  /* edge 1-2: 14 + 14; edge 3-0: 18 + 14 */
  assert_near(zrs.inter_bytes, 60, 0);
  xm_net_cost_t zag = xm_net_ring(&two, XM_NET_ZERO_ALL_GATHER, grp(0, 1, 4), 40);
  assert_near(zag.intra_bytes + zag.inter_bytes, 120, 0);
  /* edge 1-2: 14 + 18; edge 3-0: 14 + 14 */
  assert_near(zag.inter_bytes, 60, 0);
}

/* All-to-all over 8 ranks on 2 nodes of 4: each member sends 100 bytes to
 * its node, 200 to the other; 3 intra peers and 4 inter peers. */
static void test_all_to_all(void **state) {
  (void)state;
  xm_net_t n = net(2, 4);
  xm_net_cost_t a = xm_net_all_to_all(&n, grp(0, 1, 8), 100, 200);
  assert_near(a.intra_bytes, 800, 0);
  assert_near(a.inter_bytes, 1600, 0);
  assert_near(a.seconds, 100 / 100e9 + 200 / 10e9 + 3 * 2e-6 + 4 * 5e-6, 1e-15);
  assert_near(xm_net_group_same_node_pairs(&n, grp(0, 1, 8)), 2 * 4 * 3, 0);
  xm_net_cost_t one = xm_net_all_to_all(&n, grp(0, 1, 1), 100, 200);
  assert_near(one.seconds + one.intra_bytes + one.inter_bytes, 0, 0);
}

static void test_group_placement(void **state) {
  (void)state;
  xm_net_t n = net(4, 4);
  assert_int_equal(xm_net_group_members_per_node(&n, grp(1, 1, 6)), 3); /* ranks 1,2,3 */
  assert_int_equal(xm_net_group_nodes(&n, grp(1, 1, 6)), 2);
  assert_int_equal(xm_net_group_members_per_node(&n, grp(1, 3, 4)), 1); /* 1,4,7,10 */
  assert_int_equal(xm_net_group_nodes(&n, grp(1, 3, 4)), 3);
  assert_int_equal(xm_net_group_members_per_node(&n, grp(0, 2, 8)), 2);
  assert_int_equal(xm_net_group_nodes(&n, grp(0, 2, 8)), 4);
  assert_int_equal(xm_net_group_nodes(&n, grp(0, 4, 4)), 4);
  /* ranks 1,2,3 | 4,5,6: 3*2 pairs on each node */
  assert_near(xm_net_group_same_node_pairs(&n, grp(1, 1, 6)), 12, 0);
  assert_near(xm_net_group_same_node_pairs(&n, grp(1, 3, 4)), 2, 0); /* 4 and 7 */
  /* ranks_per_node 0: one node */
  xm_net_t u = net(1, 0);
  assert_int_equal(xm_net_group_nodes(&u, grp(0, 1, 64)), 1);
  assert_near(xm_net_ring(&u, XM_NET_ALL_REDUCE, grp(0, 1, 64), 4096).inter_bytes, 0, 0);
}

/* ---- against the brute-force reference ---------------------------------- */

static int64_t ref_chunk_ar(int64_t n, int64_t P, int64_t j) {
  return n / P + (j % P < n % P ? 1 : 0);
}

static int64_t ref_chunk_zero(int64_t n, int64_t P, int64_t j) {
  j %= P;
  int64_t c = (n + P - 1) / P, lo = j * c, hi = lo + c < n ? lo + c : n;
  return hi > lo ? hi - lo : 0;
}

/* Bytes member i sends, as the runtime computes them (runtime/comm/comm.c,
 * runtime/comm/spmd.c), for a buffer of n 4-byte elements. */
static int64_t ref_member(xm_net_coll_t k, int64_t n, int64_t P, int64_t i) {
  switch (k) {
  case XM_NET_ALL_REDUCE:
    return 4 * ((n - ref_chunk_ar(n, P, i)) + (n - ref_chunk_ar(n, P, i + 1)));
  case XM_NET_ALL_GATHER:
  case XM_NET_REDUCE_SCATTER: return 4 * (P - 1) * n;
  case XM_NET_ZERO_REDUCE_SCATTER: return 4 * (n - ref_chunk_zero(n, P, i));
  case XM_NET_ZERO_ALL_GATHER: return 4 * (n - ref_chunk_zero(n, P, i + 1));
  }
  return 0;
}

static void ref_ring(int64_t rpn, xm_net_coll_t k, xm_net_group_t g, int64_t n, int64_t *intra,
                     int64_t *inter) {
  *intra = *inter = 0;
  int64_t P = g.size;
  if (P < 2) return;
  for (int64_t i = 0; i < P; i++) {
    int64_t me = g.first + i * g.stride, b = ref_member(k, n, P, i);
    int64_t succ = g.first + ((i + 1) % P) * g.stride;
    int64_t pred = g.first + ((i + P - 1) % P) * g.stride;
    int64_t to[2] = {succ, pred}, part[2] = {b / 2, b - b / 2};
    if (succ == pred) to[1] = succ;
    for (int s = 0; s < 2; s++) {
      if (me / rpn == to[s] / rpn)
        *intra += part[s];
      else
        *inter += part[s];
    }
  }
}

static void test_ring_matches_reference(void **state) {
  (void)state;
  const xm_net_coll_t kinds[] = {XM_NET_ALL_REDUCE, XM_NET_ALL_GATHER, XM_NET_REDUCE_SCATTER,
                                 XM_NET_ZERO_REDUCE_SCATTER, XM_NET_ZERO_ALL_GATHER};
  const int64_t elems[] = {1, 3, 7, 64, 1000, 4099};
  srand(12345);
  int checked = 0;
  for (int64_t rpn = 1; rpn <= 8; rpn++)
    for (int trial = 0; trial < 60; trial++) {
      int64_t size = 1 + rand() % 12, stride = 1 + rand() % 9, first = rand() % 17;
      xm_net_t nt = net(64, rpn);
      xm_net_group_t g = grp(first, stride, size);
      for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (size_t e = 0; e < sizeof elems / sizeof elems[0]; e++) {
          int64_t intra, inter;
          ref_ring(rpn, kinds[k], g, elems[e], &intra, &inter);
          xm_net_cost_t c = xm_net_ring(&nt, kinds[k], g, 4.0 * (double)elems[e]);
          if (c.intra_bytes != (double)intra || c.inter_bytes != (double)inter)
            fail_msg("rpn %lld group {%lld,%lld,%lld} kind %d n %lld: got %.0f/%.0f, want "
                     "%lld/%lld",
                     (long long)rpn, (long long)first, (long long)stride, (long long)size,
                     (int)kinds[k], (long long)elems[e], c.intra_bytes, c.inter_bytes,
                     (long long)intra, (long long)inter);
          checked++;
        }
      /* placement helpers against counting members */
      int64_t on0 = 0, pairs = 0, nodes = 0, last_node = -1;
      for (int64_t i = 0; i < size; i++) {
        int64_t r = first + i * stride;
        if (r / rpn == first / rpn) on0++;
        if (r / rpn != last_node) nodes++, last_node = r / rpn;
        for (int64_t j = 0; j < size; j++)
          if (j != i && (first + j * stride) / rpn == r / rpn) pairs++;
      }
      assert_int_equal(xm_net_group_members_per_node(&nt, g), on0);
      assert_int_equal(xm_net_group_nodes(&nt, g), nodes);
      assert_near(xm_net_group_same_node_pairs(&nt, g), pairs, 0);
    }
  assert_true(checked > 10000);
}

/* Byte counts that are not whole numbers take the uniform model and still
 * add up; huge ones do not overflow. */
static void test_ring_fractional_and_huge(void **state) {
  (void)state;
  xm_net_t n = net(4, 2);
  xm_net_cost_t c = xm_net_ring(&n, XM_NET_ALL_REDUCE, grp(0, 1, 8), 1000.5);
  assert_near(c.intra_bytes + c.inter_bytes, 2 * 7 * 1000.5, 1e-6);
  assert_true(c.inter_bytes > 0 && c.intra_bytes > 0);
  xm_net_cost_t h = xm_net_ring(&n, XM_NET_ALL_REDUCE, grp(0, 1, 8), 1e18);
  assert_near((h.intra_bytes + h.inter_bytes) / (2 * 7 * 1e18), 1, 1e-12);
  assert_true(isfinite(h.seconds) && h.seconds > 0);
  xm_net_cost_t z = xm_net_ring(&n, XM_NET_ALL_REDUCE, grp(0, 1, 8), 0);
  assert_near(z.seconds + z.intra_bytes + z.inter_bytes, 0, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_from_cluster),
      cmocka_unit_test(test_ring_inside_node),
      cmocka_unit_test(test_ring_two_nodes),
      cmocka_unit_test(test_ring_uneven_chunks),
      cmocka_unit_test(test_ring_strided),
      cmocka_unit_test(test_ring_pair),
      cmocka_unit_test(test_gather_scatter_zero),
      cmocka_unit_test(test_all_to_all),
      cmocka_unit_test(test_group_placement),
      cmocka_unit_test(test_ring_matches_reference),
      cmocka_unit_test(test_ring_fractional_and_huge),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
