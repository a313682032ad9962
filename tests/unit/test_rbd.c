/* tests/unit/test_rbd.c — redundancy-bypassing dispatch plans (runtime/moe/rbd.c).
 *
 * Hand-built routings pin the pilot/replica structure (all experts of a
 * token on one node, spread over every node, several local experts per
 * rank, single-node EP). Random routings check the counts against a direct
 * count of distinct (token, node) pairs and the flat dispatch against the
 * (token, expert) pairs that cross nodes, and the pilot count per token
 * against the closed form N * (1 - C(E - E/N, k) / C(E, k)) by Monte-Carlo.
 * Finally every rank of an EP group is simulated in one process: dispatch,
 * replication, a fake expert y = x * (e + 1), pre-reduced combine, and the
 * result is compared with sum_j w_j f_{e_j}(x_t) for every token, also with
 * SSMB token slices whose TP groups and EP groups come from
 * frontend/layout.h.
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

#include "frontend/layout.h"
#include "runtime/moe/rbd.h"

static xm_rt_rbd_config_t config(int64_t experts, int64_t k, int ep, int ep_rank, int rpn) {
  xm_rt_rbd_config_t c = {.experts = experts,
                          .top_k = k,
                          .ep = ep,
                          .ep_rank = ep_rank,
                          .ep_first_rank = 0,
                          .ranks_per_node = rpn,
                          .rule = XM_RT_RBD_PILOT_FIRST,
                          .seed = 7,
                          .step = 1};
  return c;
}

/* A small deterministic generator (xorshift64*) for routings and data. */
static uint64_t rng_next(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 0x2545f4914f6cdd1dull;
}
static double rng_unit(uint64_t *s) { return (double)(rng_next(s) >> 11) / 9007199254740992.0; }

/* k distinct experts per token, uniformly; each slot dropped with
 * probability `drop`. */
static void random_routing(uint64_t *s, int64_t tokens, int64_t experts, int64_t k, double drop,
                           int32_t *ids) {
  int32_t *perm = malloc((size_t)experts * sizeof *perm);
  for (int64_t t = 0; t < tokens; t++) {
    for (int64_t e = 0; e < experts; e++)
      perm[e] = (int32_t)e;
    for (int64_t j = 0; j < k; j++) {
      int64_t pick = j + (int64_t)(rng_next(s) % (uint64_t)(experts - j));
      int32_t tmp = perm[j];
      perm[j] = perm[pick];
      perm[pick] = tmp;
      ids[t * k + j] = rng_unit(s) < drop ? -1 : perm[j];
    }
  }
  free(perm);
}

static void test_config_check(void **state) {
  (void)state;
  xm_rt_rbd_config_t c = config(16, 4, 4, 0, 2);
  assert_int_equal(xm_rt_rbd_config_check(&c), XM_OK);
  c.ep = 3;
  assert_int_equal(xm_rt_rbd_config_check(&c), XM_ERR_INVALID_INPUT);
  c = config(16, 17, 4, 0, 2);
  assert_int_equal(xm_rt_rbd_config_check(&c), XM_ERR_INVALID_INPUT);
  c = config(16, 4, 4, 4, 2);
  assert_int_equal(xm_rt_rbd_config_check(&c), XM_ERR_INVALID_INPUT);
  c = config(16, 4, 4, 0, 0);
  assert_int_equal(xm_rt_rbd_config_check(&c), XM_ERR_INVALID_INPUT);
  /* An expert id out of range is refused, not read past. */
  c = config(16, 2, 4, 0, 2);
  int32_t ids[2] = {3, 16};
  xm_rt_rbd_send_plan_t p;
  assert_int_equal(xm_rt_rbd_plan_send(&c, ids, 1, &p), XM_ERR_INVALID_INPUT);
  assert_null(p.send_counts);
  /* A received row with no expert on the receiving rank is refused. */
  int32_t meta[2] = {12, 13};
  xm_rt_rbd_recv_plan_t r;
  assert_int_equal(xm_rt_rbd_plan_replicate(&c, meta, 1, &r), XM_ERR_INVALID_INPUT);
  xm_rt_rbd_local_plan_t l;
  assert_int_equal(xm_rt_rbd_plan_local(&c, meta, 1, &l), XM_ERR_INVALID_INPUT);
}

static void test_node_geometry(void **state) {
  (void)state;
  xm_rt_rbd_config_t c = config(6, 2, 3, 0, 2);
  c.ep_first_rank = 3; /* world ranks 3,4,5 on nodes 1,2,2 */
  assert_int_equal(xm_rt_rbd_num_nodes(&c), 2);
  assert_int_equal(xm_rt_rbd_node_of(&c, 0), 0);
  assert_int_equal(xm_rt_rbd_node_of(&c, 1), 1);
  assert_int_equal(xm_rt_rbd_node_of(&c, 2), 1);
  int first, count;
  xm_rt_rbd_node_ranks(&c, 0, &first, &count);
  assert_int_equal(first, 0);
  assert_int_equal(count, 1);
  xm_rt_rbd_node_ranks(&c, 1, &first, &count);
  assert_int_equal(first, 1);
  assert_int_equal(count, 2);
  assert_int_equal(xm_rt_rbd_owner(&c, 5), 2);
}

/* One token whose k = 4 experts all sit on node 1 (ranks 4..7, one expert
 * each): 1 pilot to the first slot's rank, k - 1 replicas from there. */
static void test_all_on_one_node(void **state) {
  (void)state;
  xm_rt_rbd_config_t c = config(8, 4, 8, 1, 4);
  int32_t ids[4] = {6, 4, 7, 5};
  xm_rt_rbd_send_plan_t p;
  assert_int_equal(xm_rt_rbd_plan_send(&c, ids, 1, &p), XM_OK);
  assert_int_equal(p.num_pilots, 1);
  assert_int_equal(p.pilot_dest[0], 6);
  assert_int_equal(p.send_counts[6], 1);
  assert_int_equal(p.send_offsets[8], 1);
  assert_int_equal(p.inter_node_rows, 1);
  for (int j = 0; j < 4; j++)
    assert_int_equal(p.slot_pilot[j], 0);
  int64_t flat[8], flat_inter;
  assert_int_equal(xm_rt_rbd_flat_counts(&c, ids, 1, flat, &flat_inter), XM_OK);
  assert_int_equal(flat_inter, 4);
  for (int q = 4; q < 8; q++)
    assert_int_equal(flat[q], 1);
  xm_rt_rbd_send_plan_free(&p);

  /* On rank 6: one local slot, replicas to 4, 5, 7 in rank order. */
  xm_rt_rbd_config_t r6 = config(8, 4, 8, 6, 4);
  xm_rt_rbd_recv_plan_t r;
  assert_int_equal(xm_rt_rbd_plan_replicate(&r6, ids, 1, &r), XM_OK);
  assert_int_equal(r.node_first, 4);
  assert_int_equal(r.node_ranks, 4);
  assert_int_equal(r.num_replicas, 3);
  assert_int_equal(r.local_slots, 1);
  assert_int_equal(r.replica_slots, 3);
  const int32_t want_dest[3] = {4, 5, 7};
  const int64_t want_counts[4] = {1, 1, 0, 1};
  for (int i = 0; i < 3; i++) {
    assert_int_equal(r.replica_dest[i], want_dest[i]);
    assert_int_equal(r.replica_src_row[i], 0);
  }
  for (int i = 0; i < 4; i++)
    assert_int_equal(r.intra_send_counts[i], want_counts[i]);
  xm_rt_rbd_recv_plan_free(&r);
}

/* Several local experts per rank: E = 16 over ep 4 (4 each), 2 nodes of 2
 * ranks. A token on experts {8, 12, 9, 13} (ranks 2, 3, 2, 3) sends one
 * pilot to rank 2; rank 2 computes 2 slots and sends one replica row to
 * rank 3, which serves 2 slots. */
static void test_several_local_experts(void **state) {
  (void)state;
  xm_rt_rbd_config_t c = config(16, 4, 4, 0, 2);
  int32_t ids[8] = {8, 12, 9, 13, /* token 1: */ 1, 5, 2, 14};
  xm_rt_rbd_send_plan_t p;
  assert_int_equal(xm_rt_rbd_plan_send(&c, ids, 2, &p), XM_OK);
  /* token 0: node 1 via rank 2; token 1: node 0 via rank 0 (expert 1),
   * node 1 via rank 3 (expert 14). Rows ordered by destination. */
  assert_int_equal(p.num_pilots, 3);
  const int64_t want_counts[4] = {1, 0, 1, 1};
  for (int q = 0; q < 4; q++)
    assert_int_equal(p.send_counts[q], want_counts[q]);
  assert_int_equal(p.pilot_token[0], 1);
  assert_int_equal(p.pilot_token[1], 0);
  assert_int_equal(p.pilot_token[2], 1);
  assert_int_equal(p.inter_node_rows, 2);
  const int64_t want_slot_pilot[8] = {1, 1, 1, 1, 0, 0, 0, 2};
  for (int s = 0; s < 8; s++)
    assert_int_equal(p.slot_pilot[s], want_slot_pilot[s]);
  xm_rt_rbd_send_plan_free(&p);

  xm_rt_rbd_config_t c2 = config(16, 4, 4, 2, 2);
  xm_rt_rbd_recv_plan_t r;
  assert_int_equal(xm_rt_rbd_plan_replicate(&c2, ids, 1, &r), XM_OK);
  assert_int_equal(r.num_replicas, 1);
  assert_int_equal(r.replica_dest[0], 3);
  assert_int_equal(r.local_slots, 2);
  assert_int_equal(r.replica_slots, 2);
  xm_rt_rbd_recv_plan_free(&r);
  xm_rt_rbd_local_plan_t l;
  assert_int_equal(xm_rt_rbd_plan_local(&c2, ids, 1, &l), XM_OK);
  assert_int_equal(l.num_slots, 2);
  assert_int_equal(l.tpe[0], 1); /* expert 8 */
  assert_int_equal(l.tpe[1], 1); /* expert 9 */
  assert_int_equal(l.slot_index[0], 0);
  assert_int_equal(l.slot_index[1], 2);
  xm_rt_rbd_local_plan_free(&l);
}

/* k = 4 experts on 4 different nodes: one pilot per node, no replicas. */
static void test_spread_over_all_nodes(void **state) {
  (void)state;
  xm_rt_rbd_config_t c = config(8, 4, 8, 0, 2);
  int32_t ids[4] = {6, 0, 2, 4};
  xm_rt_rbd_send_plan_t p;
  assert_int_equal(xm_rt_rbd_plan_send(&c, ids, 1, &p), XM_OK);
  assert_int_equal(p.num_pilots, 4);
  assert_int_equal(p.inter_node_rows, 3);
  for (int q = 0; q < 8; q++)
    assert_int_equal(p.send_counts[q], q % 2 == 0 ? 1 : 0);
  const int64_t want_slot_pilot[4] = {3, 0, 1, 2};
  for (int s = 0; s < 4; s++)
    assert_int_equal(p.slot_pilot[s], want_slot_pilot[s]);
  xm_rt_rbd_send_plan_free(&p);
  for (int q = 0; q < 8; q += 2) {
    xm_rt_rbd_config_t cq = config(8, 4, 8, q, 2);
    xm_rt_rbd_recv_plan_t r;
    assert_int_equal(xm_rt_rbd_plan_replicate(&cq, ids, 1, &r), XM_OK);
    assert_int_equal(r.num_replicas, 0);
    assert_int_equal(r.local_slots, 1);
    xm_rt_rbd_recv_plan_free(&r);
  }
}

/* Distinct (token, node) pairs and flat crossings, counted directly. */
static void direct_counts(const xm_rt_rbd_config_t *c, const int32_t *ids, int64_t tokens,
                          int64_t *pairs, int64_t *pairs_remote, int64_t *slots_remote) {
  int own = xm_rt_rbd_node_of(c, c->ep_rank), nodes = xm_rt_rbd_num_nodes(c);
  *pairs = *pairs_remote = *slots_remote = 0;
  for (int64_t t = 0; t < tokens; t++) {
    for (int n = 0; n < nodes; n++) {
      int hit = 0;
      for (int64_t j = 0; j < c->top_k; j++) {
        int32_t e = ids[t * c->top_k + j];
        if (e >= 0 && xm_rt_rbd_node_of(c, xm_rt_rbd_owner(c, e)) == n) hit = 1;
      }
      *pairs += hit;
      if (n != own) *pairs_remote += hit;
    }
    for (int64_t j = 0; j < c->top_k; j++) {
      int32_t e = ids[t * c->top_k + j];
      if (e >= 0 && xm_rt_rbd_node_of(c, xm_rt_rbd_owner(c, e)) != own) (*slots_remote)++;
    }
  }
}

/* Structural invariants of a send plan over any routing. */
static void check_send_plan(const xm_rt_rbd_config_t *c, const int32_t *ids, int64_t tokens,
                            const xm_rt_rbd_send_plan_t *p) {
  int64_t pairs, pairs_remote, slots_remote;
  direct_counts(c, ids, tokens, &pairs, &pairs_remote, &slots_remote);
  assert_int_equal(p->num_pilots, pairs);
  assert_int_equal(p->inter_node_rows, pairs_remote);
  int64_t flat[64], flat_inter;
  assert_int_equal(xm_rt_rbd_flat_counts(c, ids, tokens, flat, &flat_inter), XM_OK);
  assert_int_equal(flat_inter, slots_remote);
  int64_t flat_total = 0;
  for (int q = 0; q < c->ep; q++)
    flat_total += flat[q];
  assert_int_equal(flat_total, p->slots);
  for (int q = 0; q < c->ep; q++) {
    assert_int_equal(p->send_offsets[q + 1] - p->send_offsets[q], p->send_counts[q]);
    for (int64_t i = p->send_offsets[q]; i < p->send_offsets[q + 1]; i++) {
      assert_int_equal(p->pilot_dest[i], q);
      if (i > p->send_offsets[q]) assert_true(p->pilot_token[i] > p->pilot_token[i - 1]);
    }
  }
  for (int64_t s = 0; s < tokens * c->top_k; s++) {
    int64_t row = p->slot_pilot[s];
    if (ids[s] < 0) {
      assert_int_equal(row, -1);
      continue;
    }
    assert_true(row >= 0 && row < p->num_pilots);
    assert_int_equal(p->pilot_token[row], s / c->top_k);
    /* The pilot lands on the slot's node, on a rank holding one of the
     * token's experts there. */
    int dest = p->pilot_dest[row];
    assert_int_equal(xm_rt_rbd_node_of(c, dest), xm_rt_rbd_node_of(c, xm_rt_rbd_owner(c, ids[s])));
    int holds = 0;
    int64_t t = s / c->top_k;
    for (int64_t j = 0; j < c->top_k; j++)
      holds |= ids[t * c->top_k + j] >= 0 && xm_rt_rbd_owner(c, ids[t * c->top_k + j]) == dest;
    assert_true(holds);
  }
}

static void test_counts_random(void **state) {
  (void)state;
  uint64_t seed = 12345;
  const struct {
    int64_t experts, k;
    int ep, rpn, first;
    double drop;
  } shapes[] = {{16, 4, 4, 2, 0, 0.0}, {32, 6, 4, 2, 0, 0.1}, {64, 8, 16, 4, 0, 0.0},
                {8, 3, 8, 4, 0, 0.2},  {6, 2, 3, 2, 3, 0.0},  {16, 4, 4, 4, 0, 0.0},
                {16, 4, 4, 8, 0, 0.0}, {12, 5, 6, 4, 0, 0.1}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    for (int rule = 0; rule < 2; rule++) {
      for (int rank = 0; rank < shapes[i].ep; rank++) {
        xm_rt_rbd_config_t c =
            config(shapes[i].experts, shapes[i].k, shapes[i].ep, rank, shapes[i].rpn);
        c.ep_first_rank = shapes[i].first;
        c.rule = (xm_rt_rbd_pilot_rule_t)rule;
        int64_t tokens = 50;
        int32_t *ids = malloc((size_t)(tokens * c.top_k) * sizeof *ids);
        random_routing(&seed, tokens, c.experts, c.top_k, shapes[i].drop, ids);
        xm_rt_rbd_send_plan_t p;
        assert_int_equal(xm_rt_rbd_plan_send(&c, ids, tokens, &p), XM_OK);
        check_send_plan(&c, ids, tokens, &p);
        xm_rt_rbd_send_plan_free(&p);
        free(ids);
      }
    }
  }
}

/* EP inside one node: nothing crosses the network, one pilot per token. */
static void test_single_node_ep(void **state) {
  (void)state;
  uint64_t seed = 99;
  int64_t tokens = 40;
  int32_t ids[40 * 4];
  random_routing(&seed, tokens, 16, 4, 0.0, ids);
  for (int rank = 0; rank < 4; rank++) {
    xm_rt_rbd_config_t c = config(16, 4, 4, rank, 8);
    c.ep_first_rank = 4; /* world ranks 4..7 of an 8-rank node */
    assert_int_equal(xm_rt_rbd_num_nodes(&c), 1);
    xm_rt_rbd_send_plan_t p;
    assert_int_equal(xm_rt_rbd_plan_send(&c, ids, tokens, &p), XM_OK);
    assert_int_equal(p.num_pilots, tokens);
    assert_int_equal(p.inter_node_rows, 0);
    int64_t flat[4], flat_inter;
    assert_int_equal(xm_rt_rbd_flat_counts(&c, ids, tokens, flat, &flat_inter), XM_OK);
    assert_int_equal(flat_inter, 0);
    xm_rt_rbd_send_plan_free(&p);
  }
}

/* The random rule is deterministic, stays among the ranks holding the
 * token's experts (checked by check_send_plan), depends on the step and
 * spreads pilots over the candidates; the first rule takes the first slot. */
static void test_pilot_rules(void **state) {
  (void)state;
  /* Every token: experts 8 (rank 2) and 12 (rank 3), both on node 1. */
  int64_t tokens = 4000;
  int32_t *ids = malloc((size_t)tokens * 2 * sizeof *ids);
  for (int64_t t = 0; t < tokens; t++) {
    ids[2 * t] = 8;
    ids[2 * t + 1] = 12;
  }
  xm_rt_rbd_config_t c = config(16, 2, 4, 0, 2);
  xm_rt_rbd_send_plan_t first, a, b, other;
  assert_int_equal(xm_rt_rbd_plan_send(&c, ids, tokens, &first), XM_OK);
  assert_int_equal(first.send_counts[2], tokens);
  assert_int_equal(first.send_counts[3], 0);
  c.rule = XM_RT_RBD_PILOT_RANDOM;
  assert_int_equal(xm_rt_rbd_plan_send(&c, ids, tokens, &a), XM_OK);
  assert_int_equal(xm_rt_rbd_plan_send(&c, ids, tokens, &b), XM_OK);
  check_send_plan(&c, ids, tokens, &a);
  for (int q = 0; q < 4; q++)
    assert_int_equal(a.send_counts[q], b.send_counts[q]);
  for (int64_t s = 0; s < tokens * 2; s++)
    assert_int_equal(a.slot_pilot[s], b.slot_pilot[s]);
  /* Binomial(4000, 1/2): sd 31.6; 6 sd. */
  assert_true(llabs(a.send_counts[2] - tokens / 2) < 190);
  assert_int_equal(a.send_counts[2] + a.send_counts[3], tokens);
  c.step = 2;
  assert_int_equal(xm_rt_rbd_plan_send(&c, ids, tokens, &other), XM_OK);
  int64_t differ = 0;
  for (int64_t t = 0; t < tokens; t++)
    differ += a.pilot_dest[a.slot_pilot[2 * t]] != other.pilot_dest[other.slot_pilot[2 * t]];
  assert_true(differ > tokens / 4 && differ < 3 * tokens / 4);
  xm_rt_rbd_send_plan_free(&first);
  xm_rt_rbd_send_plan_free(&a);
  xm_rt_rbd_send_plan_free(&b);
  xm_rt_rbd_send_plan_free(&other);
  free(ids);
}

static void test_expected_copies_formula(void **state) {
  (void)state;
  assert_true(fabs(xm_rt_rbd_expected_copies(256, 8, 4) - 3.6142143) < 1e-6);
  assert_true(fabs(xm_rt_rbd_expected_copies(16, 4, 2) - 1.9230769) < 1e-6);
  assert_true(fabs(xm_rt_rbd_expected_copies(64, 6, 1) - 1.0) < 1e-12);
  assert_true(fabs(xm_rt_rbd_expected_copies(64, 1, 8) - 1.0) < 1e-12);
  /* k > E - E/N: every node is hit. */
  assert_true(fabs(xm_rt_rbd_expected_copies(8, 7, 2) - 2.0) < 1e-12);
  assert_true(xm_rt_rbd_expected_copies(8, 9, 2) == 0.0);
}

/* Monte-Carlo: mean pilots per token over uniform routings against the
 * closed form, within 5 standard errors of the sample. */
static void monte_carlo(int64_t experts, int64_t k, int ep, int rpn, int64_t tokens,
                        uint64_t seed) {
  xm_rt_rbd_config_t c = config(experts, k, ep, 0, rpn);
  int32_t *ids = malloc((size_t)(tokens * k) * sizeof *ids);
  random_routing(&seed, tokens, experts, k, 0.0, ids);
  xm_rt_rbd_send_plan_t p;
  assert_int_equal(xm_rt_rbd_plan_send(&c, ids, tokens, &p), XM_OK);
  int64_t *per_token = calloc((size_t)tokens, sizeof *per_token);
  for (int64_t i = 0; i < p.num_pilots; i++)
    per_token[p.pilot_token[i]]++;
  double mean = (double)p.num_pilots / (double)tokens, var = 0;
  for (int64_t t = 0; t < tokens; t++)
    var += (per_token[t] - mean) * (per_token[t] - mean);
  var /= (double)(tokens - 1);
  double want = xm_rt_rbd_expected_copies(experts, k, xm_rt_rbd_num_nodes(&c));
  double tol = 5.0 * sqrt(var / (double)tokens);
  if (fabs(mean - want) > tol)
    fprintf(stderr, "E=%lld k=%lld: mean %.4f, formula %.4f, tol %.4f\n", (long long)experts,
            (long long)k, mean, want, tol);
  assert_true(fabs(mean - want) <= tol);
  assert_true(tol < 0.05);
  assert_int_equal(p.slots, tokens * k); /* the flat dispatch sends k per token */
  free(per_token);
  xm_rt_rbd_send_plan_free(&p);
  free(ids);
}

static void test_expected_copies_monte_carlo(void **state) {
  (void)state;
  monte_carlo(256, 8, 32, 8, 20000, 1); /* 4 nodes: 3.61 instead of 8 */
  monte_carlo(64, 6, 8, 2, 20000, 2);   /* 4 nodes */
  monte_carlo(16, 4, 4, 2, 20000, 3);   /* 2 nodes */
}

/* ---- every rank of an EP group in one process ---------------------------- */

#define MAXR 16

typedef struct {
  int64_t tokens;
  const float *x;     /* [tokens, h] */
  const int32_t *ids; /* [tokens, k] */
  const float *w;     /* [tokens, k] */
  float *y;           /* [tokens, h]: the combined MoE output */
} sim_rank_t;

typedef struct {
  int64_t inter_dispatch, inter_combine; /* rows that crossed nodes, each way */
  int64_t intra_rows;                    /* replica rows (inside nodes) */
  int64_t plan_inter, flat_inter;        /* what the plans said */
} sim_stats_t;

/* A rank's buffer of rows with their metadata. */
typedef struct {
  int64_t n;
  float *x;
  int32_t *ids;
  float *w;
} rows_t;

static void rows_alloc(rows_t *r, int64_t n, int64_t h, int64_t k) {
  r->n = n;
  r->x = calloc((size_t)(n * h + 1), sizeof(float));
  r->ids = calloc((size_t)(n * k + 1), sizeof(int32_t));
  r->w = calloc((size_t)(n * k + 1), sizeof(float));
}
static void rows_free(rows_t *r) {
  free(r->x);
  free(r->ids);
  free(r->w);
}
/* dst rows [at, at+n) = src rows [from, from+n). */
static void rows_copy(rows_t *dst, int64_t at, const rows_t *src, int64_t from, int64_t n,
                      int64_t h, int64_t k) {
  memcpy(dst->x + at * h, src->x + from * h, (size_t)(n * h) * sizeof(float));
  memcpy(dst->ids + at * k, src->ids + from * k, (size_t)(n * k) * sizeof(int32_t));
  memcpy(dst->w + at * k, src->w + from * k, (size_t)(n * k) * sizeof(float));
}
/* out rows = src rows at index[i]. */
static void rows_gather(rows_t *out, const float *x, const int32_t *ids, const float *w,
                        const int64_t *index, int64_t n, int64_t h, int64_t k) {
  rows_alloc(out, n, h, k);
  xm_rt_rbd_gather(x, (size_t)h * sizeof(float), index, n, out->x);
  xm_rt_rbd_gather(ids, (size_t)k * sizeof(int32_t), index, n, out->ids);
  xm_rt_rbd_gather(w, (size_t)k * sizeof(float), index, n, out->w);
}

static int world_node(const xm_rt_rbd_config_t *c, int ep_rank) {
  return (c->ep_first_rank + ep_rank) / c->ranks_per_node;
}

static void simulate(const xm_rt_rbd_config_t *base, sim_rank_t *rk, int64_t h, sim_stats_t *st) {
  const int ep = base->ep;
  const int64_t k = base->top_k;
  assert_true(ep <= MAXR);
  xm_rt_rbd_config_t cfg[MAXR];
  xm_rt_rbd_send_plan_t sp[MAXR];
  xm_rt_rbd_recv_plan_t rp[MAXR];
  xm_rt_rbd_local_plan_t lp[MAXR];
  rows_t packed[MAXR], recv[MAXR], reps[MAXR], input[MAXR];
  int64_t recv_off[MAXR][MAXR], intra_off[MAXR][MAXR];
  float *partial[MAXR], *back[MAXR], *ret[MAXR];
  memset(st, 0, sizeof *st);
  /* Stage 1: plan and pack pilots, all-to-all over the EP group. */
  for (int s = 0; s < ep; s++) {
    cfg[s] = *base;
    cfg[s].ep_rank = s;
    assert_int_equal(xm_rt_rbd_plan_send(&cfg[s], rk[s].ids, rk[s].tokens, &sp[s]), XM_OK);
    rows_gather(&packed[s], rk[s].x, rk[s].ids, rk[s].w, sp[s].pilot_token, sp[s].num_pilots, h, k);
    st->plan_inter += sp[s].inter_node_rows;
    int64_t flat[MAXR], flat_inter;
    assert_int_equal(xm_rt_rbd_flat_counts(&cfg[s], rk[s].ids, rk[s].tokens, flat, &flat_inter),
                     XM_OK);
    st->flat_inter += flat_inter;
  }
  for (int q = 0; q < ep; q++) {
    int64_t n = 0;
    for (int s = 0; s < ep; s++)
      recv_off[q][s] = n, n += sp[s].send_counts[q];
    rows_alloc(&recv[q], n, h, k);
    for (int s = 0; s < ep; s++) {
      rows_copy(&recv[q], recv_off[q][s], &packed[s], sp[s].send_offsets[q], sp[s].send_counts[q],
                h, k);
      if (world_node(base, s) != world_node(base, q)) st->inter_dispatch += sp[s].send_counts[q];
    }
  }
  /* Stage 2: replicas inside each node. */
  for (int q = 0; q < ep; q++) {
    assert_int_equal(xm_rt_rbd_plan_replicate(&cfg[q], recv[q].ids, recv[q].n, &rp[q]), XM_OK);
    rows_gather(&reps[q], recv[q].x, recv[q].ids, recv[q].w, rp[q].replica_src_row,
                rp[q].num_replicas, h, k);
    for (int64_t i = 0; i < rp[q].num_replicas; i++)
      assert_int_equal(world_node(base, rp[q].replica_dest[i]), world_node(base, q));
    st->intra_rows += rp[q].num_replicas;
  }
  for (int d = 0; d < ep; d++) {
    const xm_rt_rbd_recv_plan_t *mine = &rp[d];
    int64_t n = recv[d].n;
    for (int q = mine->node_first; q < mine->node_first + mine->node_ranks; q++)
      intra_off[d][q] = n, n += rp[q].intra_send_counts[d - rp[q].node_first];
    rows_alloc(&input[d], n, h, k);
    rows_copy(&input[d], 0, &recv[d], 0, recv[d].n, h, k);
    for (int q = mine->node_first; q < mine->node_first + mine->node_ranks; q++) {
      int slot = d - rp[q].node_first;
      rows_copy(&input[d], intra_off[d][q], &reps[q], rp[q].intra_send_offsets[slot],
                rp[q].intra_send_counts[slot], h, k);
    }
  }
  /* Stage 3: the fake experts f_e(x) = (e + 1) x, in the plan's sorted
   * order as a grouped GEMM would see them; rank-level pre-reduction. */
  for (int d = 0; d < ep; d++) {
    assert_int_equal(xm_rt_rbd_plan_local(&cfg[d], input[d].ids, input[d].n, &lp[d]), XM_OK);
    float *out = calloc((size_t)(lp[d].num_slots * h + 1), sizeof(float));
    int64_t lo = d * (base->experts / ep);
    for (int64_t m = 0, e = 0, left = 0; m < lp[d].num_slots; m++, left--) {
      while (left == 0)
        left = lp[d].tpe[e++]; /* expert of row m from the bins */
      int64_t slot = lp[d].slot_index[m];
      assert_int_equal(input[d].ids[slot], lo + e - 1);
      for (int64_t c = 0; c < h; c++)
        out[m * h + c] = (float)(lo + e) * input[d].x[(slot / k) * h + c];
    }
    partial[d] = calloc((size_t)(input[d].n * h + 1), sizeof(float));
    xm_rt_rbd_reduce_local(&lp[d], k, out, input[d].w, h, partial[d]);
    free(out);
  }
  /* Combine, intra-node: replica partials back to their pilot rank. */
  for (int q = 0; q < ep; q++) {
    back[q] = calloc((size_t)(rp[q].num_replicas * h + 1), sizeof(float));
    for (int d = rp[q].node_first; d < rp[q].node_first + rp[q].node_ranks; d++) {
      int slot = d - rp[q].node_first;
      memcpy(back[q] + rp[q].intra_send_offsets[slot] * h, partial[d] + intra_off[d][q] * h,
             (size_t)(rp[q].intra_send_counts[slot] * h) * sizeof(float));
    }
    /* Node-level pre-reduction into the pilot rows (partial[q]'s first rows). */
    xm_rt_rbd_scatter_add(back[q], h, rp[q].replica_src_row, rp[q].num_replicas, partial[q]);
  }
  /* Combine, inter-node: one row per (token, node) back to its source. */
  for (int s = 0; s < ep; s++) {
    ret[s] = calloc((size_t)(sp[s].num_pilots * h + 1), sizeof(float));
    for (int q = 0; q < ep; q++) {
      memcpy(ret[s] + sp[s].send_offsets[q] * h, partial[q] + recv_off[q][s] * h,
             (size_t)(sp[s].send_counts[q] * h) * sizeof(float));
      if (world_node(base, s) != world_node(base, q)) st->inter_combine += sp[s].send_counts[q];
    }
    memset(rk[s].y, 0, (size_t)(rk[s].tokens * h) * sizeof(float));
    xm_rt_rbd_scatter_add(ret[s], h, sp[s].pilot_token, sp[s].num_pilots, rk[s].y);
  }
  for (int r = 0; r < ep; r++) {
    xm_rt_rbd_send_plan_free(&sp[r]);
    xm_rt_rbd_recv_plan_free(&rp[r]);
    xm_rt_rbd_local_plan_free(&lp[r]);
    rows_free(&packed[r]);
    rows_free(&recv[r]);
    rows_free(&reps[r]);
    rows_free(&input[r]);
    free(partial[r]);
    free(back[r]);
    free(ret[r]);
  }
}

/* y_t = sum_j w_j (e_j + 1) x_t, the MoE output computed directly. */
static void check_direct(int64_t tokens, const float *x, const int32_t *ids, const float *w,
                         const float *y, int64_t h, int64_t k) {
  for (int64_t t = 0; t < tokens; t++) {
    for (int64_t c = 0; c < h; c++) {
      double want = 0;
      for (int64_t j = 0; j < k; j++)
        if (ids[t * k + j] >= 0)
          want += (double)w[t * k + j] * (double)(ids[t * k + j] + 1) * x[t * h + c];
      if (fabs(y[t * h + c] - want) > 1e-4 * (1.0 + fabs(want)))
        fprintf(stderr, "token %lld col %lld: got %g want %g\n", (long long)t, (long long)c,
                y[t * h + c], want);
      assert_true(fabs(y[t * h + c] - want) <= 1e-4 * (1.0 + fabs(want)));
    }
  }
}

typedef struct {
  int64_t tokens;
  float *x, *w, *y;
  int32_t *ids;
} token_data_t;

static void token_data(token_data_t *d, uint64_t *seed, int64_t tokens, int64_t experts, int64_t k,
                       int64_t h, double drop) {
  d->tokens = tokens;
  d->x = malloc((size_t)(tokens * h + 1) * sizeof(float));
  d->y = malloc((size_t)(tokens * h + 1) * sizeof(float));
  d->w = malloc((size_t)(tokens * k + 1) * sizeof(float));
  d->ids = malloc((size_t)(tokens * k + 1) * sizeof(int32_t));
  for (int64_t i = 0; i < tokens * h; i++)
    d->x[i] = (float)(2.0 * rng_unit(seed) - 1.0);
  for (int64_t i = 0; i < tokens * k; i++)
    d->w[i] = (float)rng_unit(seed);
  random_routing(seed, tokens, experts, k, drop, d->ids);
}
static void token_data_free(token_data_t *d) {
  free(d->x);
  free(d->y);
  free(d->w);
  free(d->ids);
}

static void simulate_shape(int64_t experts, int64_t k, int ep, int rpn, int first,
                           xm_rt_rbd_pilot_rule_t rule, double drop, uint64_t seed) {
  const int64_t h = 5;
  xm_rt_rbd_config_t c = config(experts, k, ep, 0, rpn);
  c.ep_first_rank = first;
  c.rule = rule;
  token_data_t data[MAXR];
  sim_rank_t rk[MAXR];
  for (int r = 0; r < ep; r++) {
    int64_t tokens = r == 1 ? 0 : 3 + (int64_t)(rng_next(&seed) % 12); /* rank 1 has none */
    token_data(&data[r], &seed, tokens, experts, k, h, drop);
    rk[r] = (sim_rank_t){tokens, data[r].x, data[r].ids, data[r].w, data[r].y};
  }
  sim_stats_t st;
  simulate(&c, rk, h, &st);
  for (int r = 0; r < ep; r++) {
    check_direct(rk[r].tokens, rk[r].x, rk[r].ids, rk[r].w, rk[r].y, h, k);
    token_data_free(&data[r]);
  }
  assert_int_equal(st.inter_dispatch, st.plan_inter);
  assert_int_equal(st.inter_combine, st.plan_inter);
  assert_true(st.inter_dispatch <= st.flat_inter);
  if (xm_rt_rbd_num_nodes(&c) == 1) assert_int_equal(st.inter_dispatch, 0);
}

static void test_simulated_dispatch(void **state) {
  (void)state;
  for (int rule = 0; rule < 2; rule++) {
    xm_rt_rbd_pilot_rule_t r = (xm_rt_rbd_pilot_rule_t)rule;
    simulate_shape(16, 4, 4, 2, 0, r, 0.1, 11);  /* 2 nodes, 4 experts per rank */
    simulate_shape(8, 3, 8, 4, 0, r, 0.0, 12);   /* 2 nodes, 1 expert per rank */
    simulate_shape(6, 2, 3, 2, 3, r, 0.0, 13);   /* EP group straddling nodes */
    simulate_shape(16, 4, 4, 4, 0, r, 0.0, 14);  /* one node: nothing crosses */
    simulate_shape(64, 8, 8, 2, 0, r, 0.05, 15); /* 4 nodes, 8 experts per rank */
    simulate_shape(16, 16, 2, 1, 0, r, 0.0, 16); /* k = E */
  }
}

/* SSMB: each DP replica has T tokens; TP rank t of it runs the MoE block on
 * tokens [t*T/tp, (t+1)*T/tp) over its EP group; the TP group's all-gather
 * rebuilds the replica's output. Groups come from frontend/layout.h. */
static void simulate_ssmb(const xm_layout_t *l, int64_t experts, int64_t k, int64_t tokens,
                          uint64_t seed) {
  const int64_t h = 4, world = xm_layout_world(l), slice = tokens / l->tp;
  assert_int_equal(tokens % l->tp, 0);
  token_data_t replica[MAXR];
  for (int64_t d = 0; d < l->dp; d++)
    token_data(&replica[d], &seed, tokens, experts, k, h, 0.0);
  for (int64_t r = 0; r < world; r += l->ep) { /* one EP group at a time */
    xm_group_t g = xm_layout_group(l, XM_GROUP_EP, r);
    sim_rank_t rk[MAXR];
    for (int64_t i = 0; i < g.size; i++) {
      int64_t w = xm_group_member(&g, i);
      int64_t d = xm_layout_group(l, XM_GROUP_DP, w).index;
      int64_t t = xm_layout_group(l, XM_GROUP_TP, w).index;
      token_data_t *rep = &replica[d];
      rk[i] = (sim_rank_t){slice, rep->x + t * slice * h, rep->ids + t * slice * k,
                           rep->w + t * slice * k, rep->y + t * slice * h};
    }
    xm_rt_rbd_config_t c = config(experts, k, (int)l->ep, 0, (int)xm_layout_node_size(l));
    c.ep_first_rank = (int)g.first;
    c.rule = XM_RT_RBD_PILOT_RANDOM;
    sim_stats_t st;
    simulate(&c, rk, h, &st);
    assert_int_equal(st.inter_dispatch, st.plan_inter);
  }
  /* Each replica's y was written slice by slice by its TP ranks: that is
   * the all-gather of the MoE exit. */
  for (int64_t d = 0; d < l->dp; d++) {
    check_direct(tokens, replica[d].x, replica[d].ids, replica[d].w, replica[d].y, h, k);
    token_data_free(&replica[d]);
  }
}

static void test_simulated_ssmb(void **state) {
  (void)state;
  const xm_layout_t layouts[] = {
      {2, 2, 4, true, true, 0, 2}, /* 4 ranks, 2 nodes, one EP group over both */
      {4, 2, 4, true, true, 0, 2}, /* 8 ranks, 2 EP groups of 2 nodes each */
      {2, 2, 2, true, true, 0, 1}, /* EP group = TP group, one rank per node */
      {2, 4, 8, true, true, 0, 4}, /* tp 4 inside a node, EP over 2 nodes */
  };
  for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++)
    simulate_ssmb(&layouts[i], 16, 4, 12, 100 + i);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config_check),
      cmocka_unit_test(test_node_geometry),
      cmocka_unit_test(test_all_on_one_node),
      cmocka_unit_test(test_several_local_experts),
      cmocka_unit_test(test_spread_over_all_nodes),
      cmocka_unit_test(test_counts_random),
      cmocka_unit_test(test_single_node_ep),
      cmocka_unit_test(test_pilot_rules),
      cmocka_unit_test(test_expected_copies_formula),
      cmocka_unit_test(test_expected_copies_monte_carlo),
      cmocka_unit_test(test_simulated_dispatch),
      cmocka_unit_test(test_simulated_ssmb),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
