/* tests/unit/test_layout.c — layout legality (frontend/layout.c), the
 * rank-group formulas of docs/parallelism.md, and the group table
 * (runtime/abi/groups.def) against the enums and names built from it.
 *
 * Legality is table-driven: each case is a small spec (the tiny sample with
 * a field changed), a layout, where it came from, and the exact diagnostics
 * expected (level, place, message) in order, plus the status. Groups are
 * checked by explicit member lists for small worlds and by properties
 * (colors partition the world, members carry their index) for many.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/layout.h"
#include "frontend/spec.h"
#include "runtime/abi/groups.h"
#include "runtime/comm/comm.h"

typedef enum {
  BASE_TINY,
  BASE_DENSE,
  BASE_MLA,
  BASE_ODD_TOKENS,
  BASE_ODD_FFN,
  BASE_QK_FULL,  /* OLMoE-style qk_norm over the whole projection */
  BASE_QK_HEAD,  /* Qwen3-style per-head qk_norm */
  BASE_CAPACITY, /* capacity_factor 1.25: dropped tokens */
  BASE_MLA_QK_FULL,
} base_t;

static void load_base(base_t base, xm_spec_t *s) {
  char path[512];
  snprintf(path, sizeof path, "%s/samples/tiny.json", XM_SOURCE_DIR);
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(xm_spec_load_file(path, &d, s), XM_OK);
  xm_diag_free(&d);
  /* tiny: heads 4, kv_heads 2, dense_ffn 384, experts 16, shared_ffn 128,
   * seq_len 128, micro_batch 4; global_batch raised to 96 so that dp up to
   * 6 divides it. */
  s->training.global_batch = 96;
  switch (base) {
  case BASE_DENSE:
    s->moe.experts = 0;
    s->moe.shared_experts = 0;
    s->moe.shared_ffn = 0;
    s->model.first_k_dense = 0;
    break;
  case BASE_MLA: s->model.attention = XM_ATTN_MLA; break;
  case BASE_ODD_FFN: s->model.dense_ffn = 385; break;
  case BASE_ODD_TOKENS:
    s->training.micro_batch = 1;
    s->training.seq_len = 127;
    break;
  case BASE_QK_FULL: s->model.qk_norm = XM_QK_NORM_FULL; break;
  case BASE_QK_HEAD: s->model.qk_norm = XM_QK_NORM_HEAD; break;
  case BASE_CAPACITY:
    s->moe.has_capacity = true;
    s->moe.capacity_factor = 1.25;
    break;
  case BASE_MLA_QK_FULL:
    s->model.attention = XM_ATTN_MLA;
    s->model.qk_norm = XM_QK_NORM_FULL;
    break;
  default: break;
  }
}

typedef struct {
  xm_diag_level_t level;
  const char *place;
  const char *message;
} want_t;

typedef struct {
  const char *name;
  base_t base;
  xm_layout_t layout;
  xm_layout_origin_t origin;
  xm_status_t status;
  want_t want[4]; /* ended by a NULL place */
} layout_case_t;

#define E XM_DIAG_ERROR
#define W XM_DIAG_WARNING
#define SPEC XM_LAYOUT_FROM_SPEC
#define FLAGS XM_LAYOUT_FROM_FLAGS

static const layout_case_t cases[] = {
    {"single rank", BASE_TINY, {1, 1, 1, false, false, 0, 0}, SPEC, XM_OK, {{0}}},
    {"everything on, 2 nodes", BASE_TINY, {2, 2, 4, true, true, 1, 2}, SPEC, XM_OK, {{0}}},
    {"ep 2 of 4 ranks in one node", BASE_TINY, {2, 2, 2, true, false, 0, 4}, FLAGS, XM_OK, {{0}}},
    {"tp 3 splits nothing evenly",
     BASE_TINY,
     {1, 3, 1, false, false, 0, 0},
     SPEC,
     XM_ERR_INVALID_INPUT,
     {{E, "/parallel/tp", "tp (3) must divide heads (4, /model/heads)"},
      {E, "/parallel/tp", "tp (3) must divide kv_heads (2, /model/kv_heads)"},
      {E, "/parallel/tp", "tp (3) must divide the shared-expert width (128, /moe/shared_ffn)"}}},
    {"tp 4 vs kv_heads 2",
     BASE_TINY,
     {1, 4, 1, false, false, 0, 4},
     FLAGS,
     XM_ERR_INVALID_INPUT,
     {{E, "--tp", "tp (4) must divide kv_heads (2, /model/kv_heads)"}}},
    {"tp vs dense_ffn",
     BASE_ODD_FFN,
     {1, 2, 1, false, false, 0, 0},
     SPEC,
     XM_ERR_INVALID_INPUT,
     {{E, "/parallel/tp", "tp (2) must divide dense_ffn (385, /model/dense_ffn)"}}},
    {"ep 3",
     BASE_TINY,
     {2, 1, 3, false, false, 0, 0},
     FLAGS,
     XM_ERR_INVALID_INPUT,
     {{E, "--ep",
       "ep (3) must divide the routed experts (16, /moe/experts): expert e lives on EP rank e "
       "/ (experts/ep)"},
      {E, "--ep", "ep (3) must divide dp*tp (2): EP groups are consecutive blocks of ranks"}}},
    {"ep on a dense model",
     BASE_DENSE,
     {2, 1, 2, false, false, 0, 0},
     SPEC,
     XM_ERR_INVALID_INPUT,
     {{E, "/parallel/ep",
       "ep (2) > 1 needs routed experts; the model is dense (/moe/experts is 0)"}}},
    {"ssmb without tp",
     BASE_TINY,
     {2, 1, 2, true, false, 0, 0},
     SPEC,
     XM_ERR_INVALID_INPUT,
     {{E, "/parallel/ssmb",
       "ssmb splits the tokens of an MoE block over the TP group and needs tp > 1 (tp is 1)"}}},
    {"ssmb with odd tokens",
     BASE_ODD_TOKENS,
     {1, 2, 2, true, false, 0, 0},
     FLAGS,
     XM_ERR_INVALID_INPUT,
     {{E, "--ssmb",
       "ssmb needs micro_batch*seq_len (127, /training/micro_batch * /training/seq_len) "
       "divisible by tp (2)"}}},
    {"ssmb on a dense model",
     BASE_DENSE,
     {1, 2, 1, true, false, 0, 0},
     SPEC,
     XM_ERR_INVALID_INPUT,
     {{E, "/parallel/ssmb", "ssmb shards MoE blocks but the model is dense (/moe/experts is 0)"}}},
    {"rbd without ep",
     BASE_TINY,
     {2, 1, 1, false, true, 0, 1},
     SPEC,
     XM_ERR_INVALID_INPUT,
     {{E, "/parallel/rbd",
       "rbd deduplicates the expert dispatch across the nodes of an EP group and needs ep > 1 "
       "(ep is 1)"}}},
    {"rbd inside one node",
     BASE_TINY,
     {2, 2, 2, true, true, 0, 2},
     SPEC,
     XM_OK,
     {{W, "/parallel/rbd",
       "rbd has no effect: every EP group (ep 2) lies inside one node (ranks_per_node 2); the "
       "dispatch stays flat"}}},
    {"rbd over 2 nodes", BASE_TINY, {2, 1, 2, false, true, 0, 1}, FLAGS, XM_OK, {{0}}},
    {"rbd, EP group straddles nodes", BASE_TINY, {6, 1, 2, false, true, 0, 3}, FLAGS, XM_OK, {{0}}},
    {"rbd and zero over 4 nodes", BASE_TINY, {8, 1, 8, false, true, 1, 2}, SPEC, XM_OK, {{0}}},
    {"ranks_per_node 3 of 4",
     BASE_TINY,
     {2, 2, 1, false, false, 0, 3},
     FLAGS,
     XM_ERR_INVALID_INPUT,
     {{E, "--ranks-per-node", "ranks_per_node (3) must divide the world size dp*tp (4)"}}},
    {"tp over nodes",
     BASE_TINY,
     {1, 2, 1, false, false, 0, 1},
     SPEC,
     XM_OK,
     {{W, "/parallel/tp",
       "TP groups (tp 2) span nodes (ranks_per_node 1): their collectives cross the network"}}},
    {"zero 2",
     BASE_TINY,
     {2, 1, 1, false, false, 2, 0},
     FLAGS,
     XM_ERR_INVALID_INPUT,
     {{E, "--zero", "zero must be 0 or 1 (ZeRO-1 shards optimizer states), got 2"}}},
    {"zero with nothing to shard",
     BASE_TINY,
     {1, 2, 2, true, false, 1, 0},
     SPEC,
     XM_OK,
     {{W, "/parallel/zero",
       "zero 1 has no effect: the data-parallel groups have one rank (dp 1, ep = dp*tp)"}}},
    {"global batch",
     BASE_TINY,
     {5, 1, 1, false, false, 0, 0},
     SPEC,
     XM_ERR_INVALID_INPUT,
     {{E, "/parallel/dp",
       "global_batch (96, /training/global_batch) must be a multiple of micro_batch*dp (4 * 5 = "
       "20)"}}},
    {"dp 0",
     BASE_TINY,
     {0, 1, 1, false, false, 0, 0},
     FLAGS,
     XM_ERR_INVALID_INPUT,
     {{E, "--dp", "dp must be in [1, 16777216], got 0"}}},
    {"world too large",
     BASE_TINY,
     {1 << 24, 2, 1, false, false, 0, 0},
     SPEC,
     XM_ERR_INVALID_INPUT,
     {{E, "/parallel/dp", "dp*tp = 33554432 ranks exceeds 16777216"}}},
    {"negative ranks_per_node",
     BASE_TINY,
     {1, 1, 1, false, false, 0, -2},
     FLAGS,
     XM_ERR_INVALID_INPUT,
     {{E, "--ranks-per-node", "ranks_per_node must be in [1, 16777216] (0: unknown), got -2"}}},
    /* MLA trains under every layout; tp splits its heads. */
    {"mla", BASE_MLA, {1, 1, 1, false, false, 0, 0}, SPEC, XM_OK, {{0}}},
    {"mla with tp and ssmb", BASE_MLA, {1, 4, 4, true, false, 0, 0}, FLAGS, XM_OK, {{0}}},
    {"mla and a bad layout",
     BASE_MLA,
     {1, 1, 1, false, true, 0, 0},
     SPEC,
     XM_ERR_INVALID_INPUT,
     {{E, "/parallel/rbd",
       "rbd deduplicates the expert dispatch across the nodes of an EP group and needs ep > 1 "
       "(ep is 1)"}}},
    /* ---- ep with tp needs ssmb ---- */
    {"ep and tp without ssmb, from flags",
     BASE_TINY,
     {2, 2, 2, false, false, 0, 0},
     FLAGS,
     XM_ERR_INVALID_INPUT,
     {{E, "--ep",
       "ep (2) with tp (2) needs ssmb (--ssmb): without it the ranks of a TP group hold the "
       "same tokens and would send every token tp times"}}},
    {"ep and tp without ssmb, from the spec",
     BASE_TINY,
     {1, 4, 4, false, false, 0, 0},
     SPEC,
     XM_ERR_INVALID_INPUT,
     {{E, "/parallel/ep",
       "ep (4) with tp (4) needs ssmb (/parallel/ssmb): without it the ranks of a TP group hold "
       "the same tokens and would send every token tp times"},
      {E, "/parallel/tp", "tp (4) must divide kv_heads (2, /model/kv_heads)"}}},
    {"ep with tp 1 needs no ssmb", BASE_TINY, {4, 1, 4, false, false, 0, 0}, FLAGS, XM_OK, {{0}}},
    {"tp without ep needs no ssmb", BASE_TINY, {2, 2, 1, false, false, 0, 0}, FLAGS, XM_OK, {{0}}},
    /* ---- qk_norm "full" cannot be split by TP ---- */
    {"qk_norm full with tp",
     BASE_QK_FULL,
     {1, 2, 1, false, false, 0, 0},
     FLAGS,
     XM_ERR_UNSUPPORTED,
     {{E, "--tp",
       "tp (2) cannot split qk_norm \"full\" (/model/qk_norm) yet: the norm runs over the whole "
       "q and k projections, which tensor parallelism splits by heads; use tp 1"}}},
    {"qk_norm full with tp and a layout error",
     BASE_QK_FULL,
     {1, 2, 1, false, false, 0, 3},
     SPEC,
     XM_ERR_INVALID_INPUT,
     {{E, "/parallel/tp",
       "tp (2) cannot split qk_norm \"full\" (/model/qk_norm) yet: the norm runs over the whole "
       "q and k projections, which tensor parallelism splits by heads; use tp 1"},
      {E, "/cluster/ranks_per_node", "ranks_per_node (3) must divide the world size dp*tp (2)"}}},
    {"qk_norm full without tp", BASE_QK_FULL, {2, 1, 2, false, false, 1, 0}, SPEC, XM_OK, {{0}}},
    {"qk_norm head with tp", BASE_QK_HEAD, {1, 2, 2, true, false, 0, 0}, FLAGS, XM_OK, {{0}}},
    {"mla and qk_norm full with tp: the norm is unsupported",
     BASE_MLA_QK_FULL,
     {1, 2, 1, false, false, 0, 0},
     SPEC,
     XM_ERR_UNSUPPORTED,
     {{E, "/parallel/tp",
       "tp (2) cannot split qk_norm \"full\" (/model/qk_norm) yet: the norm runs over the whole "
       "q and k projections, which tensor parallelism splits by heads; use tp 1"}}},
    /* ---- rbd with a capacity factor ---- */
    {"rbd with a capacity",
     BASE_CAPACITY,
     {2, 1, 2, false, true, 0, 1},
     FLAGS,
     XM_ERR_UNSUPPORTED,
     {{E, "--rbd",
       "rbd with a capacity factor (1.25, /moe/capacity_factor) is not supported yet: the "
       "deduplicated dispatch is dropless only; turn rbd off or make the model dropless "
       "(capacity_factor null)"}}},
    {"rbd with a capacity and without ep",
     BASE_CAPACITY,
     {2, 1, 1, false, true, 0, 0},
     SPEC,
     XM_ERR_INVALID_INPUT,
     {{E, "/parallel/rbd",
       "rbd deduplicates the expert dispatch across the nodes of an EP group and needs ep > 1 "
       "(ep is 1)"},
      {E, "/parallel/rbd",
       "rbd with a capacity factor (1.25, /moe/capacity_factor) is not supported yet: the "
       "deduplicated dispatch is dropless only; turn rbd off or make the model dropless "
       "(capacity_factor null)"}}},
    {"capacity without rbd", BASE_CAPACITY, {2, 1, 2, false, false, 0, 1}, FLAGS, XM_OK, {{0}}},
};

static void run_case(const layout_case_t *c) {
  xm_spec_t s;
  load_base(c->base, &s);
  xm_diag_t d;
  xm_diag_init(&d);
  xm_status_t st = xm_layout_check(&s, &c->layout, c->origin, "m.json", &d);
  int n = 0;
  while (n < 4 && c->want[n].place)
    n++;
  if (st != c->status || d.count != n) {
    fprintf(stderr, "case \"%s\": status %d, diagnostics:\n", c->name, (int)st);
    xm_diag_print(&d, stderr);
  }
  assert_int_equal(st, c->status);
  assert_int_equal(d.count, n);
  for (int i = 0; i < n; i++) {
    assert_int_equal(d.entries[i].level, c->want[i].level);
    assert_string_equal(d.entries[i].place, c->want[i].place);
    assert_string_equal(d.entries[i].message, c->want[i].message);
    assert_string_equal(d.entries[i].file, "m.json");
  }
  xm_diag_free(&d);
}

static void test_legality_table(void **state) {
  (void)state;
  assert_true(sizeof cases / sizeof cases[0] >= 15);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    run_case(&cases[i]);
}

static void test_from_spec(void **state) {
  (void)state;
  xm_spec_t s;
  load_base(BASE_TINY, &s);
  xm_layout_t l;
  xm_layout_from_spec(&s, &l);
  assert_int_equal(l.dp, 1);
  assert_int_equal(l.tp, 1);
  assert_int_equal(l.ep, 1);
  assert_int_equal(l.ranks_per_node, 0);
  s.parallel = (xm_parallel_spec_t){true, 2, 2, 4, true, true, 1};
  s.cluster.present = true;
  s.cluster.ranks_per_node = 2;
  xm_layout_from_spec(&s, &l);
  assert_int_equal(l.dp, 2);
  assert_int_equal(l.tp, 2);
  assert_int_equal(l.ep, 4);
  assert_true(l.ssmb && l.rbd);
  assert_int_equal(l.zero, 1);
  assert_int_equal(l.ranks_per_node, 2);
  char buf[64];
  assert_string_equal(xm_layout_format(&l, buf, sizeof buf), "dp2 tp2 ep4 ssmb rbd zero1");
  assert_true(xm_layout_rbd_active(&l));
  l.ranks_per_node = 4;
  assert_false(xm_layout_rbd_active(&l));
  l.ep = 2;
  l.ranks_per_node = 3; /* [0,1] [2,3]: the second block straddles nodes {0,1,2} {3,...} */
  assert_true(xm_layout_ep_spans_nodes(&l));
  assert_string_equal(xm_layout_place(FLAGS, XM_LAYOUT_RANKS_PER_NODE), "--ranks-per-node");
  assert_string_equal(xm_layout_place(SPEC, XM_LAYOUT_SSMB), "/parallel/ssmb");
}

/* Members of rank r's group of `kind`, as world ranks. */
static void members(const xm_layout_t *l, xm_group_kind_t kind, int64_t r, int64_t *out,
                    int64_t *n) {
  xm_group_t g = xm_layout_group(l, kind, r);
  for (int64_t i = 0; i < g.size; i++)
    out[i] = xm_group_member(&g, i);
  *n = g.size;
}

static void expect_members(const xm_layout_t *l, xm_group_kind_t kind, int64_t r,
                           const int64_t *want, int64_t n_want) {
  int64_t got[64], n;
  members(l, kind, r, got, &n);
  if (n != n_want)
    fprintf(stderr, "%s group of rank %lld\n", xm_group_kind_name(kind), (long long)r);
  assert_int_equal(n, n_want);
  for (int64_t i = 0; i < n; i++)
    assert_int_equal(got[i], want[i]);
}

#define EXPECT(l, kind, r, ...)                                                                    \
  do {                                                                                             \
    const int64_t want_[] = {__VA_ARGS__};                                                         \
    expect_members(l, kind, r, want_, (int64_t)(sizeof want_ / sizeof want_[0]));                  \
  } while (0)

static void test_groups_dp4_tp2_ep2(void **state) {
  (void)state;
  /* 8 ranks, 2 nodes of 4: r = d*2 + t. */
  xm_layout_t l = {4, 2, 2, true, true, 0, 4};
  EXPECT(&l, XM_GROUP_TP, 5, 4, 5);
  EXPECT(&l, XM_GROUP_DP, 5, 1, 3, 5, 7);
  EXPECT(&l, XM_GROUP_DP, 2, 0, 2, 4, 6);
  EXPECT(&l, XM_GROUP_EP, 5, 4, 5);
  EXPECT(&l, XM_GROUP_EDP, 5, 1, 3, 5, 7);
  EXPECT(&l, XM_GROUP_EDP, 6, 0, 2, 4, 6);
  EXPECT(&l, XM_GROUP_NODE, 5, 4, 5, 6, 7);
  EXPECT(&l, XM_GROUP_EP_NODE, 5, 4, 5);
  xm_group_t g = xm_layout_group(&l, XM_GROUP_DP, 5);
  assert_int_equal(g.index, 2);
  assert_int_equal(g.color, 1);
  g = xm_layout_group(&l, XM_GROUP_EDP, 7);
  assert_int_equal(g.index, 3);
  assert_int_equal(g.color, 1);
}

static void test_groups_dp2_tp2_ep2(void **state) {
  (void)state;
  xm_layout_t l = {2, 2, 2, true, false, 1, 2};
  EXPECT(&l, XM_GROUP_TP, 0, 0, 1);
  EXPECT(&l, XM_GROUP_DP, 0, 0, 2);
  EXPECT(&l, XM_GROUP_DP, 3, 1, 3);
  EXPECT(&l, XM_GROUP_EP, 3, 2, 3);
  EXPECT(&l, XM_GROUP_EDP, 3, 1, 3);
  EXPECT(&l, XM_GROUP_NODE, 1, 0, 1);
}

static void test_groups_ep4_on_4(void **state) {
  (void)state;
  xm_layout_t l = {4, 1, 4, false, true, 0, 2}; /* 2 nodes of 2 */
  for (int64_t r = 0; r < 4; r++) {
    EXPECT(&l, XM_GROUP_EP, r, 0, 1, 2, 3);
    EXPECT(&l, XM_GROUP_DP, r, 0, 1, 2, 3);
    EXPECT(&l, XM_GROUP_EDP, r, r);
    EXPECT(&l, XM_GROUP_TP, r, r);
  }
  EXPECT(&l, XM_GROUP_EP_NODE, 2, 2, 3);
  EXPECT(&l, XM_GROUP_EP_NODE, 1, 0, 1);
  assert_int_equal(xm_layout_group(&l, XM_GROUP_EP, 2).index, 2);
  assert_int_equal(xm_layout_group(&l, XM_GROUP_EP_NODE, 3).index, 1);
  assert_int_equal(xm_layout_group(&l, XM_GROUP_EP_NODE, 3).color, 1);
}

static void test_groups_straddling_ep(void **state) {
  (void)state;
  /* ep 3 over 6 ranks with 2 per node: EP {0,1,2} {3,4,5}; nodes {0,1} {2,3} {4,5}. */
  xm_layout_t l = {6, 1, 3, false, true, 0, 2};
  EXPECT(&l, XM_GROUP_EP_NODE, 0, 0, 1);
  EXPECT(&l, XM_GROUP_EP_NODE, 2, 2);
  EXPECT(&l, XM_GROUP_EP_NODE, 3, 3);
  EXPECT(&l, XM_GROUP_EP_NODE, 5, 4, 5);
  EXPECT(&l, XM_GROUP_EDP, 4, 1, 4);
  assert_int_not_equal(xm_layout_group(&l, XM_GROUP_EP_NODE, 2).color,
                       xm_layout_group(&l, XM_GROUP_EP_NODE, 3).color);
}

/* For every kind: ranks of equal color form exactly the member list of
 * their group, each at its index; groups of one kind all have one size
 * (except ep_node, which is cut by node boundaries). */
static void check_partition(const xm_layout_t *l) {
  int64_t world = xm_layout_world(l);
  for (int kind = 0; kind < XM_GROUP_COUNT; kind++) {
    for (int64_t r = 0; r < world; r++) {
      xm_group_t g = xm_layout_group(l, kind, r);
      assert_int_equal(xm_group_member(&g, g.index), r);
      int64_t same = 0;
      for (int64_t q = 0; q < world; q++) {
        xm_group_t h = xm_layout_group(l, kind, q);
        if (h.color != g.color) continue;
        same++;
        assert_int_equal(h.first, g.first);
        assert_int_equal(h.size, g.size);
        assert_int_equal(h.stride, g.stride);
      }
      assert_int_equal(same, g.size);
    }
  }
  /* TP and DP tile the world as a dp x tp grid; EP and EDP as ep x world/ep. */
  for (int64_t r = 0; r < world; r++) {
    xm_group_t tp = xm_layout_group(l, XM_GROUP_TP, r), dp = xm_layout_group(l, XM_GROUP_DP, r);
    assert_int_equal(dp.index * l->tp + tp.index, r);
    xm_group_t ep = xm_layout_group(l, XM_GROUP_EP, r), edp = xm_layout_group(l, XM_GROUP_EDP, r);
    assert_int_equal(edp.index * l->ep + ep.index, r);
    assert_int_equal(ep.size, l->ep);
    assert_int_equal(edp.size, world / l->ep);
  }
}

static void test_group_properties(void **state) {
  (void)state;
  const int64_t shapes[][4] = {{1, 1, 1, 1}, {2, 1, 2, 1}, {4, 2, 8, 4}, {4, 2, 2, 2},
                               {3, 2, 3, 2}, {8, 1, 4, 2}, {2, 4, 8, 8}, {6, 1, 3, 2}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    xm_layout_t l = {shapes[i][0], shapes[i][1], shapes[i][2], false, false, 0, shapes[i][3]};
    check_partition(&l);
  }
}

/* The table's rows, the compiler's kinds, the runtime's kinds and every
 * name function agree: values, names both ways, aliases, counts. */
static void test_group_table(void **state) {
  (void)state;
  int groups = 0, layout_only = 0, phases = 0;
  xm_group_kind_t k;
#define XM_GROUP(e, name, rt, doc)                                                                 \
  do {                                                                                             \
    assert_int_equal(XM_GROUP_##e, groups);                                                        \
    assert_int_equal(XM_RT_GROUP_##e, groups);                                                     \
    assert_int_equal(rt, XM_RT_GROUP_##e);                                                         \
    assert_string_equal(xm_group_kind_name(XM_GROUP_##e), name);                                   \
    assert_string_equal(xm_rt_group_kind_name(rt), name);                                          \
    assert_string_equal(xm_rt_group_name(rt), name);                                               \
    assert_true(xm_group_kind_from_name(name, &k));                                                \
    assert_int_equal(k, XM_GROUP_##e);                                                             \
    assert_true(doc[0] != '\0');                                                                   \
    groups++;                                                                                      \
  } while (0);
#define XM_GROUP_ALIAS(e, name, rt, doc)                                                           \
  do {                                                                                             \
    assert_true(xm_group_kind_from_name(name, &k));                                                \
    assert_int_equal(k, rt);                                                                       \
    assert_string_not_equal(xm_group_kind_name(k), name);                                          \
    assert_true(doc[0] != '\0');                                                                   \
  } while (0);
#define XM_GROUP_LAYOUT(e, name, doc)                                                              \
  do {                                                                                             \
    assert_int_equal(XM_GROUP_##e, XM_RT_GROUP_COUNT + layout_only);                               \
    assert_string_equal(xm_group_kind_name(XM_GROUP_##e), name);                                   \
    assert_true(xm_group_kind_from_name(name, &k));                                                \
    assert_int_equal(k, XM_GROUP_##e);                                                             \
    assert_true(doc[0] != '\0');                                                                   \
    layout_only++;                                                                                 \
  } while (0);
#define XM_PHASE(e, name, doc)                                                                     \
  do {                                                                                             \
    assert_int_equal(XM_RT_PHASE_##e, phases);                                                     \
    assert_string_equal(xm_rt_phase_kind_name(XM_RT_PHASE_##e), name);                             \
    assert_string_equal(xm_rt_phase_name(XM_RT_PHASE_##e), name);                                  \
    assert_true(doc[0] != '\0');                                                                   \
    phases++;                                                                                      \
  } while (0);
#include "runtime/abi/groups.def"
  assert_int_equal(groups, XM_RT_GROUP_COUNT);
  assert_int_equal(groups + layout_only, XM_GROUP_COUNT);
  assert_int_equal(phases, XM_RT_PHASE_COUNT);
  /* "sp" is the IR's name for the TP group's ranks (an SSMB block's
   * sequence shard). */
  assert_true(xm_group_kind_from_name("sp", &k));
  assert_int_equal(k, XM_GROUP_TP);
  k = XM_GROUP_DP;
  assert_false(xm_group_kind_from_name("pp", &k));
  assert_false(xm_group_kind_from_name(NULL, &k));
  assert_int_equal(k, XM_GROUP_DP);
  assert_string_equal(xm_rt_group_kind_name(XM_RT_GROUP_COUNT), "?");
  assert_string_equal(xm_rt_phase_kind_name(XM_RT_PHASE_COUNT), "?");
}

/* xm_layout_group_size is the size of every group of a kind (the largest
 * for ep_node), and the world group is every rank. */
static void test_group_sizes(void **state) {
  (void)state;
  const int64_t shapes[][4] = {{1, 1, 1, 0}, {4, 2, 2, 4}, {6, 1, 3, 2}, {2, 4, 8, 8}, {3, 2, 3, 0}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    xm_layout_t l = {shapes[i][0], shapes[i][1], shapes[i][2], false, false, 0, shapes[i][3]};
    int64_t world = xm_layout_world(&l);
    for (int kind = 0; kind < XM_GROUP_COUNT; kind++) {
      int64_t largest = 0;
      for (int64_t r = 0; r < world; r++) {
        int64_t n = xm_layout_group(&l, kind, r).size;
        if (kind != XM_GROUP_EP_NODE) assert_int_equal(n, xm_layout_group_size(&l, kind));
        if (n > largest) largest = n;
      }
      assert_int_equal(largest, xm_layout_group_size(&l, kind));
    }
    for (int64_t r = 0; r < world; r++) {
      xm_group_t g = xm_layout_group(&l, XM_GROUP_WORLD, r);
      assert_int_equal(g.first, 0);
      assert_int_equal(g.stride, 1);
      assert_int_equal(g.size, world);
      assert_int_equal(g.index, r);
      assert_int_equal(g.color, 0);
    }
  }
  xm_layout_t l = {4, 2, 2, false, false, 0, 4};
  assert_int_equal(xm_layout_group_size(&l, XM_GROUP_DP), 4);
  assert_int_equal(xm_layout_group_size(&l, XM_GROUP_EDP), 4);
  assert_int_equal(xm_layout_group_size(&l, XM_GROUP_NODE), 4);
  l.ranks_per_node = 0; /* unknown: one node */
  assert_int_equal(xm_layout_group_size(&l, XM_GROUP_NODE), 8);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_legality_table),     cmocka_unit_test(test_from_spec),
      cmocka_unit_test(test_groups_dp4_tp2_ep2), cmocka_unit_test(test_groups_dp2_tp2_ep2),
      cmocka_unit_test(test_groups_ep4_on_4),    cmocka_unit_test(test_groups_straddling_ep),
      cmocka_unit_test(test_group_properties),   cmocka_unit_test(test_group_table),
      cmocka_unit_test(test_group_sizes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
