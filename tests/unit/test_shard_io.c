/* tests/unit/test_shard_io.c — the pure parts of runtime/io/shard_io.h: rank
 * coordinates from a layout, the full view of a hand-written sharded table
 * (dims, offsets, sizes, categories), piece geometry of TP slices, EP
 * expert slices, slices inside experts and ZeRO-1 chunks (with padding),
 * bad table entries reported by name, and sliced initialisation equal to
 * the slice of the 1-rank initialisation for every rank of two layouts.
 * No MPI: coordinates come from xm_rt_comm_layout_group.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/io/rng.h"
#include "runtime/io/shard_io.h"

/* ---- the table: local shapes for dp2 tp2 ep2 on 4 ranks ------------------------ */

#define Q_NAME "model.layers.0.self_attn.q_proj.weight"
#define UP_NAME "model.layers.0.mlp.experts.{e}.up_proj.weight"
#define DOWN_NAME "model.layers.0.mlp.experts.{e}.down_proj.weight"
#define NORM_NAME "model.norm.weight"
#define EMB_NAME "model.embed_tokens.weight"

enum {
  T_EMB,    /* whole [8, 4] */
  T_Q,      /* TP split dim 1: local [4, 3], full [4, 6] */
  T_UP,     /* EP split dim 0: local [2, 3, 2], full [4, 3, 2] */
  T_DOWN,   /* stacked, TP split dim 2: local [4, 3, 1], full [4, 3, 2] */
  T_NORM,   /* whole [5], ones */
  T_G_Q,    /* grad of Q, split like Q: not stored */
  T_M_Q,    /* ZeRO-1 chunk of Q's 12 local elements over DP (2): {6} */
  T_M_NORM, /* ZeRO-1 chunk of 5 elements over DP: {3}, rank 1 padded */
  T_V_UP,   /* unchunked, split like UP */
  T_M_UP,   /* ZeRO-1 chunk of UP's 12 local elements over EDP (2): {6} */
  T_LOAD,   /* i32 [4] whole optimizer state */
  T_TOKENS, /* input, not stored */
  T_COUNT
};

#define GRP(k) ((k) + 1)
#define P(name_, cat_, dt_, rank_, d0, d1, d2, off_, init_, std_, param_, sg_, sd_, cg_)           \
  {                                                                                                \
    .name = name_, .category = cat_, .dtype = dt_, .rank = rank_, .dims = {d0, d1, d2},            \
    .persistent = 1, .offset = off_, .bytes = 256, .init = init_, .init_std = std_,                \
    .trainable = 1, .param = param_, .split_group = sg_, .split_dim = sd_, .chunk_group = cg_      \
  }

/* clang-format off */
static const xm_rt_tensor_t k_tensors[T_COUNT] = {
  [T_EMB]    = P(EMB_NAME, XM_RT_CAT_WEIGHTS, XM_RT_F32, 2, 8, 4, 0, 0, XM_RT_INIT_NORMAL, 0.5f, -1, 0, 0, 0),
  [T_Q]      = P(Q_NAME, XM_RT_CAT_WEIGHTS, XM_RT_F32, 2, 4, 3, 0, 256, XM_RT_INIT_NORMAL, 1.0f, -1, GRP(XM_RT_GROUP_TP), 1, 0),
  [T_UP]     = P(UP_NAME, XM_RT_CAT_WEIGHTS, XM_RT_F32, 3, 2, 3, 2, 512, XM_RT_INIT_NORMAL, 1.0f, -1, GRP(XM_RT_GROUP_EP), 0, 0),
  [T_DOWN]   = P(DOWN_NAME, XM_RT_CAT_WEIGHTS, XM_RT_F32, 3, 4, 3, 1, 768, XM_RT_INIT_NORMAL, 2.0f, -1, GRP(XM_RT_GROUP_TP), 2, 0),
  [T_NORM]   = P(NORM_NAME, XM_RT_CAT_WEIGHTS, XM_RT_F32, 1, 5, 0, 0, 1024, XM_RT_INIT_ONES, 0.0f, -1, 0, 0, 0),
  [T_G_Q]    = P(Q_NAME ".grad", XM_RT_CAT_GRADS, XM_RT_F32, 2, 4, 3, 0, 1280, 0, 0.0f, T_Q, GRP(XM_RT_GROUP_TP), 1, 0),
  [T_M_Q]    = P(Q_NAME ".exp_avg", XM_RT_CAT_OPTIMIZER, XM_RT_F32, 1, 6, 0, 0, 1536, 0, 0.0f, T_Q, 0, 0, GRP(XM_RT_GROUP_DP)),
  [T_M_NORM] = P(NORM_NAME ".exp_avg", XM_RT_CAT_OPTIMIZER, XM_RT_F32, 1, 3, 0, 0, 1792, 0, 0.0f, T_NORM, 0, 0, GRP(XM_RT_GROUP_DP)),
  [T_V_UP]   = P(UP_NAME ".exp_avg_sq", XM_RT_CAT_OPTIMIZER, XM_RT_F32, 3, 2, 3, 2, 2048, 0, 0.0f, T_UP, GRP(XM_RT_GROUP_EP), 0, 0),
  [T_M_UP]   = P(UP_NAME ".exp_avg", XM_RT_CAT_OPTIMIZER, XM_RT_F32, 1, 6, 0, 0, 2304, 0, 0.0f, T_UP, 0, 0, GRP(XM_RT_GROUP_EDP)),
  [T_LOAD]   = P("model.layers.0.mlp.gate.load", XM_RT_CAT_OPTIMIZER, XM_RT_I32, 1, 4, 0, 0, 2560, 0, 0.0f, -1, 0, 0, 0),
  [T_TOKENS] = {.name = "tokens", .category = XM_RT_CAT_INPUTS, .dtype = XM_RT_I32, .rank = 2,
                .dims = {2, 8}, .offset = 0, .bytes = 64, .param = -1},
};
/* clang-format on */

static xm_rt_program_t make_program(const xm_rt_tensor_t *tensors) {
  xm_rt_program_t p = {0};
  p.model_name = "shard-test";
  p.vocab = 8;
  p.seq_len = 8;
  p.micro_batch = 2;
  p.grad_accum = 1;
  p.dp = 2, p.tp = 2, p.ep = 2, p.zero = 1, p.ranks_per_node = 2;
  p.persistent_bytes = 2816;
  p.activation_bytes = 64;
  p.num_tensors = T_COUNT;
  p.tensors = tensors;
  return p;
}

static const xm_rt_comm_layout_t k_dp2tp2ep2 = {2, 2, 2, 4, 2};

static xm_rt_rank_coords_t coords(const xm_rt_comm_layout_t *l, int rank) {
  xm_rt_rank_coords_t rc;
  assert_int_equal(xm_rt_rank_coords(l, rank, &rc), XM_OK);
  return rc;
}

/* ---- coordinates ------------------------------------------------------------------ */

static void test_coords(void **state) {
  (void)state;
  /* dp2 tp2 ep2: rank 3 has tp index 1, dp index 1, ep index 1, edp index 1 */
  xm_rt_rank_coords_t rc = coords(&k_dp2tp2ep2, 3);
  assert_int_equal(rc.index[XM_RT_GROUP_TP], 1);
  assert_int_equal(rc.index[XM_RT_GROUP_DP], 1);
  assert_int_equal(rc.index[XM_RT_GROUP_EP], 1);
  assert_int_equal(rc.index[XM_RT_GROUP_EDP], 1);
  assert_int_equal(rc.index[XM_RT_GROUP_WORLD], 3);
  assert_int_equal(rc.size[XM_RT_GROUP_WORLD], 4);
  for (int k = XM_RT_GROUP_DP; k < XM_RT_GROUP_COUNT; k++)
    assert_int_equal(rc.size[k], 2);
  rc = coords(&k_dp2tp2ep2, 2); /* tp 0, dp 1, ep 0, edp 1 */
  assert_int_equal(rc.index[XM_RT_GROUP_TP], 0);
  assert_int_equal(rc.index[XM_RT_GROUP_DP], 1);
  assert_int_equal(rc.index[XM_RT_GROUP_EP], 0);
  assert_int_equal(rc.index[XM_RT_GROUP_EDP], 1);
  /* dp4 ep4: the EP group is the world, EDP groups are single ranks */
  xm_rt_comm_layout_t l = {4, 1, 4, 4, 2};
  rc = coords(&l, 2);
  assert_int_equal(rc.index[XM_RT_GROUP_EP], 2);
  assert_int_equal(rc.size[XM_RT_GROUP_EP], 4);
  assert_int_equal(rc.size[XM_RT_GROUP_EDP], 1);
  assert_int_equal(rc.size[XM_RT_GROUP_TP], 1);
  /* one rank */
  assert_int_equal(xm_rt_rank_coords(NULL, 0, &rc), XM_OK);
  for (int k = 0; k < XM_RT_GROUP_COUNT; k++) {
    assert_int_equal(rc.size[k], 1);
    assert_int_equal(rc.index[k], 0);
  }
  assert_int_equal(xm_rt_rank_coords(&k_dp2tp2ep2, 4, &rc), XM_ERR_INVALID_INPUT);
}

/* ---- the full view -------------------------------------------------------------- */

static void test_full_view(void **state) {
  (void)state;
  xm_rt_program_t p = make_program(k_tensors);
  assert_true(xm_rt_program_is_sharded(&p));
  xm_rt_rank_coords_t rc = coords(&k_dp2tp2ep2, 1);
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_rt_full_view_t v;
  assert_int_equal(xm_rt_full_view_create(&p, &rc, &diag, &v), XM_OK);
  assert_int_equal(diag.count, 0);
  const xm_rt_tensor_t *t = v.program.tensors;
  assert_int_equal(v.program.num_tensors, T_COUNT);
  assert_string_equal(t[T_Q].name, Q_NAME);
  /* expected full dims and element counts, in table order */
  static const struct {
    int ti, rank;
    int64_t d[3], elems;
  } want[] = {
      {T_EMB, 2, {8, 4, 0}, 32},   {T_Q, 2, {4, 6, 0}, 24},    {T_UP, 3, {4, 3, 2}, 24},
      {T_DOWN, 3, {4, 3, 2}, 24},  {T_NORM, 1, {5, 0, 0}, 5},  {T_M_Q, 2, {4, 6, 0}, 24},
      {T_M_NORM, 1, {5, 0, 0}, 5}, {T_V_UP, 3, {4, 3, 2}, 24}, {T_M_UP, 3, {4, 3, 2}, 24},
      {T_LOAD, 1, {4, 0, 0}, 4},
  };
  int64_t offset = 0, weights = 0, optim = 0;
  for (size_t k = 0; k < sizeof want / sizeof *want; k++) {
    const xm_rt_tensor_t *f = &t[want[k].ti];
    assert_int_equal(f->rank, want[k].rank);
    for (int d = 0; d < want[k].rank; d++)
      assert_int_equal(f->dims[d], want[k].d[d]);
    assert_int_equal(f->bytes, want[k].elems * 4);
    assert_int_equal(f->offset, offset); /* packed in table order, 64-byte aligned */
    assert_int_equal(f->persistent, 1);
    assert_int_equal(f->split_group, 0);
    assert_int_equal(f->chunk_group, 0);
    offset += (want[k].elems * 4 + 63) / 64 * 64;
    if (f->category == XM_RT_CAT_WEIGHTS)
      weights += f->bytes;
    else
      optim += f->bytes;
  }
  assert_int_equal(v.stored, 10);
  assert_int_equal(v.program.persistent_bytes, offset);
  assert_int_equal(v.program.activation_bytes, 0);
  assert_int_equal(v.program.category_bytes[XM_RT_CAT_WEIGHTS], weights);
  assert_int_equal(v.program.category_bytes[XM_RT_CAT_OPTIMIZER], optim);
  /* gradients and inputs are left out of the arenas */
  assert_int_equal(t[T_G_Q].bytes, 0);
  assert_int_equal(t[T_G_Q].persistent, 0);
  assert_int_equal(t[T_TOKENS].bytes, 0);
  /* the rest of the program is the local one */
  assert_int_equal(v.program.dp, 2);
  assert_int_equal(v.program.micro_batch, 2);
  assert_string_equal(v.program.model_name, "shard-test");
  assert_int_equal(t[T_M_Q].param, T_Q);
  assert_int_equal(t[T_LOAD].dtype, XM_RT_I32);
  xm_rt_full_view_destroy(&v);
  assert_null(v.tensors);
  xm_diag_free(&diag);
}

/* ---- pieces --------------------------------------------------------------------- */

static xm_rt_piece_t piece(const xm_rt_program_t *p, int ti, int rank) {
  xm_rt_rank_coords_t rc = coords(&k_dp2tp2ep2, rank);
  xm_rt_piece_t pc;
  xm_diag_t diag;
  xm_diag_init(&diag);
  assert_int_equal(xm_rt_piece_of(p, ti, &rc, &diag, &pc), XM_OK);
  xm_diag_free(&diag);
  return pc;
}

static void test_piece_math(void **state) {
  (void)state;
  xm_rt_program_t p = make_program(k_tensors);
  /* Q on rank 1 (tp 1): local [4, 3] is columns 3..5 of [4, 6] */
  xm_rt_piece_t q = piece(&p, T_Q, 1);
  assert_int_equal(q.n, 12);
  assert_int_equal(q.parts, 2);
  assert_int_equal(q.index, 1);
  assert_int_equal(q.block, 3);
  assert_int_equal(q.full_block, 6);
  assert_int_equal(q.lo, 0);
  assert_int_equal(q.hi, 12);
  for (int a = 0; a < 4; a++)
    for (int j = 0; j < 3; j++)
      assert_int_equal(xm_rt_piece_full_offset(&q, a * 3 + j), a * 6 + 3 + j);
  /* UP on rank 3 (ep 1): experts 2, 3 = elements 12..23 */
  xm_rt_piece_t up = piece(&p, T_UP, 3);
  for (int e = 0; e < 12; e++)
    assert_int_equal(xm_rt_piece_full_offset(&up, e), 12 + e);
  /* DOWN on rank 1: [4, 3, 1] is the odd elements of [4, 3, 2] */
  xm_rt_piece_t down = piece(&p, T_DOWN, 1);
  for (int e = 0; e < 12; e++)
    assert_int_equal(xm_rt_piece_full_offset(&down, e), 2 * e + 1);
  /* M_Q on rank 3 (tp 1, dp 1): chunk 1 of Q's slice, elements 6..11 of
   * the slice = rows 2, 3 of the right half */
  xm_rt_piece_t mq = piece(&p, T_M_Q, 3);
  assert_int_equal(mq.chunk_index, 1);
  assert_int_equal(mq.chunk_parts, 2);
  assert_int_equal(mq.lo, 6);
  assert_int_equal(mq.hi, 12);
  assert_int_equal(mq.buffer_elems, 6);
  assert_int_equal(xm_rt_piece_full_offset(&mq, 6), 2 * 6 + 3);
  assert_int_equal(xm_rt_piece_full_offset(&mq, 11), 3 * 6 + 5);
  /* M_NORM: 5 elements in chunks of 3; dp index 1 holds 3..4 plus padding */
  xm_rt_piece_t mn0 = piece(&p, T_M_NORM, 0), mn1 = piece(&p, T_M_NORM, 2);
  assert_int_equal(mn0.lo, 0);
  assert_int_equal(mn0.hi, 3);
  assert_int_equal(mn1.lo, 3);
  assert_int_equal(mn1.hi, 5);
  assert_int_equal(mn1.buffer_elems, 3);
  /* M_UP on rank 2 (ep 0, edp 1): chunk 1 of experts 0, 1 */
  xm_rt_piece_t mu = piece(&p, T_M_UP, 2);
  assert_int_equal(mu.lo, 6);
  assert_int_equal(mu.hi, 12);
  assert_int_equal(xm_rt_piece_full_offset(&mu, 6), 6);
  /* the load state is whole everywhere */
  xm_rt_piece_t ld = piece(&p, T_LOAD, 3);
  assert_int_equal(ld.parts, 1);
  assert_int_equal(ld.lo, 0);
  assert_int_equal(ld.hi, 4);
  assert_int_equal(xm_rt_piece_full_offset(&ld, 3), 3);
}

/* Every rank's pieces cut from a reference full tensor and put back into
 * an empty one rebuild the reference exactly (the pieces cover it); chunk
 * padding reads as zero. */
static void test_piece_round_trip(void **state) {
  (void)state;
  xm_rt_program_t p = make_program(k_tensors);
  static const int stored[] = {T_EMB, T_Q, T_UP, T_DOWN, T_NORM, T_M_Q, T_M_NORM, T_V_UP, T_M_UP};
  for (size_t k = 0; k < sizeof stored / sizeof *stored; k++) {
    int ti = stored[k];
    xm_rt_piece_t p0 = piece(&p, ti, 0);
    int64_t full_n = p0.full_elems;
    float ref[64], rebuilt[64], buf[64];
    assert_true(full_n <= 64);
    for (int64_t i = 0; i < full_n; i++) {
      ref[i] = 0.25f * (float)(i + 1) + (float)ti;
      rebuilt[i] = -1.0f;
    }
    for (int r = 0; r < 4; r++) {
      xm_rt_piece_t pc = piece(&p, ti, r);
      assert_int_equal(pc.full_elems, full_n);
      for (int i = 0; i < 64; i++)
        buf[i] = 99.0f;
      xm_rt_piece_from_full(&pc, ref, buf, sizeof(float));
      for (int64_t e = pc.lo; e < pc.hi; e++)
        assert_true(buf[e - pc.lo] == ref[xm_rt_piece_full_offset(&pc, e)]);
      for (int64_t b = pc.hi - pc.lo; b < pc.buffer_elems; b++)
        assert_true(buf[b] == 0.0f);              /* padding */
      assert_true(buf[pc.buffer_elems] == 99.0f); /* nothing past the buffer */
      xm_rt_piece_to_full(&pc, buf, rebuilt, sizeof(float));
    }
    for (int64_t i = 0; i < full_n; i++)
      assert_true(rebuilt[i] == ref[i]);
  }
}

/* ---- bad tables ----------------------------------------------------------------- */

static void expect_bad(const xm_rt_tensor_t *tensors, int ti, const char *needle) {
  xm_rt_program_t p = make_program(tensors);
  xm_rt_rank_coords_t rc = coords(&k_dp2tp2ep2, 0);
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_rt_piece_t pc;
  assert_int_equal(xm_rt_piece_of(&p, ti, &rc, &diag, &pc), XM_ERR_INTERNAL);
  xm_rt_full_view_t v;
  assert_int_equal(xm_rt_full_view_create(&p, &rc, &diag, &v), XM_ERR_INTERNAL);
  assert_null(v.tensors);
  assert_true(diag.count >= 2);
  if (!strstr(diag.entries[0].message, needle))
    fprintf(stderr, "message '%s' lacks '%s'\n", diag.entries[0].message, needle);
  assert_non_null(strstr(diag.entries[0].message, needle));
  assert_string_equal(diag.entries[0].place, tensors[ti].name);
  xm_diag_free(&diag);
}

static void test_bad_entries(void **state) {
  (void)state;
  xm_rt_tensor_t t[T_COUNT];
  memcpy(t, k_tensors, sizeof t);
  t[T_Q].split_dim = 2;
  expect_bad(t, T_Q, "split dim outside");
  memcpy(t, k_tensors, sizeof t);
  t[T_Q].split_group = 42;
  expect_bad(t, T_Q, "unknown split group");
  memcpy(t, k_tensors, sizeof t);
  t[T_M_Q].dims[0] = 5;
  expect_bad(t, T_M_Q, "must have 6 elements, not 5");
  memcpy(t, k_tensors, sizeof t);
  t[T_M_Q].param = -1;
  expect_bad(t, T_M_Q, "without a valid param");
  memcpy(t, k_tensors, sizeof t);
  t[T_EMB].dims[0] = INT64_MAX;
  t[T_EMB].dims[1] = 4;
  expect_bad(t, T_EMB, "overflow");
  memcpy(t, k_tensors, sizeof t);
  t[T_EMB].dims[0] = INT64_MAX / 2 + 1;
  t[T_EMB].dims[1] = 1;
  t[T_EMB].split_group = GRP(XM_RT_GROUP_DP);
  t[T_EMB].split_dim = 0;
  expect_bad(t, T_EMB, "overflows");
  /* init refuses a param that does not fit the arena */
  memcpy(t, k_tensors, sizeof t);
  t[T_Q].bytes = 8;
  xm_rt_program_t p = make_program(t);
  xm_rt_rank_coords_t rc = coords(&k_dp2tp2ep2, 0);
  unsigned char arena[2816];
  xm_diag_t diag;
  xm_diag_init(&diag);
  assert_int_equal(xm_rt_shard_init_params(&p, &rc, 1, arena, &diag), XM_ERR_INTERNAL);
  assert_non_null(strstr(diag.entries[0].message, "does not fit"));
  xm_diag_free(&diag);
}

/* ---- sliced initialisation ------------------------------------------------------- */

/* The persistent arena of `p` initialised for the rank with coordinates rc. */
static unsigned char *init_arena(const xm_rt_program_t *p, const xm_rt_rank_coords_t *rc,
                                 uint64_t seed) {
  unsigned char *a = calloc(1, (size_t)p->persistent_bytes + 64);
  xm_diag_t diag;
  xm_diag_init(&diag);
  assert_int_equal(xm_rt_shard_init_params(p, rc, seed, a, &diag), XM_OK);
  xm_diag_free(&diag);
  return a;
}

static void check_sliced_init(const xm_rt_tensor_t *tensors, const xm_rt_comm_layout_t *l) {
  xm_rt_program_t p = make_program(tensors);
  p.dp = l->dp, p.tp = l->tp, p.ep = l->ep;
  xm_rt_rank_coords_t rc0 = coords(l, 0), one;
  assert_int_equal(xm_rt_rank_coords(NULL, 0, &one), XM_OK);
  xm_rt_full_view_t v;
  assert_int_equal(xm_rt_full_view_create(&p, &rc0, NULL, &v), XM_OK);
  /* the 1-rank initialisation of the full model */
  unsigned char *full = init_arena(&v.program, &one, 4242);
  /* independent check of the full init: the named streams */
  float want[24];
  xm_rt_rng_t r;
  xm_rt_rng_seed_named(&r, 4242, "model.layers.0.mlp.experts.3.up_proj.weight");
  xm_rt_rng_fill_normal(&r, want, 6, 0.0, 1.0);
  assert_memory_equal(want, full + v.tensors[T_UP].offset + 3 * 6 * 4, 6 * 4);
  xm_rt_rng_seed_named(&r, 4242, Q_NAME);
  xm_rt_rng_fill_normal(&r, want, 24, 0.0, 1.0);
  assert_memory_equal(want, full + v.tensors[T_Q].offset, 24 * 4);
  for (int rank = 0; rank < l->world; rank++) {
    xm_rt_rank_coords_t rc = coords(l, rank);
    unsigned char *local = init_arena(&p, &rc, 4242);
    for (int ti = 0; ti < T_COUNT; ti++) {
      const xm_rt_tensor_t *t = &p.tensors[ti];
      if (t->category != XM_RT_CAT_WEIGHTS) continue;
      xm_rt_piece_t pc;
      assert_int_equal(xm_rt_piece_of(&p, ti, &rc, NULL, &pc), XM_OK);
      float expect[64];
      xm_rt_piece_from_full(&pc, full + v.tensors[ti].offset, expect, 4);
      if (memcmp(expect, local + t->offset, (size_t)pc.n * 4) != 0)
        fprintf(stderr, "rank %d: %s differs from the slice of the full init\n", rank, t->name);
      assert_memory_equal(expect, local + t->offset, (size_t)pc.n * 4);
    }
    free(local);
  }
  free(full);
  xm_rt_full_view_destroy(&v);
}

static void test_sliced_init(void **state) {
  (void)state;
  check_sliced_init(k_tensors, &k_dp2tp2ep2);
  /* dp4 ep4: TP groups of one (Q whole but still marked split), one
   * expert per rank, ZeRO-1 chunks over 4 DP ranks, EDP groups of one */
  xm_rt_tensor_t t[T_COUNT];
  memcpy(t, k_tensors, sizeof t);
  xm_rt_comm_layout_t l = {4, 1, 4, 4, 2};
  t[T_Q].dims[1] = 6;
  t[T_UP].dims[0] = 1; /* one expert per rank */
  t[T_V_UP].dims[0] = 1;
  t[T_M_UP].dims[0] = 6; /* EDP size 1: the chunk is all 6 elements */
  t[T_M_Q].dims[0] = 6;  /* Q's 24 elements over DP 4 */
  t[T_DOWN].dims[2] = 2;
  t[T_M_NORM].dims[0] = 2; /* 5 over 4: chunks of 2 */
  check_sliced_init(t, &l);
}

/* ---- expert placement ------------------------------------------------------------ */

#define PUP_NAME "model.layers.1.mlp.experts.{e}.up_proj.weight"
#define GATE_NAME "model.layers.1.mlp.gate.weight"
enum { PT_UP, PT_GATE, PT_M_GATE, PT_COUNT };
static const int32_t k_map[4] = {2, 0, 3, 1}; /* slot p holds Hugging Face expert k_map[p] */
static const int32_t k_map_layer[1] = {1};

/* A 1-rank table, or (ep2) one rank's of dp2 ep2: experts [4, 3, 2]
 * stacked (split over EP), the router's rows [4, 3] and one Adam moment of
 * them, all placed (row 1) when `placed`. */
static xm_rt_program_t placed_program(xm_rt_tensor_t *t, int placed, int ep2) {
  memset(t, 0, PT_COUNT * sizeof *t);
  t[PT_UP] = (xm_rt_tensor_t)P(PUP_NAME, XM_RT_CAT_WEIGHTS, XM_RT_F32, 3, ep2 ? 2 : 4, 3, 2, 0,
                               XM_RT_INIT_NORMAL, 1.0f, -1, ep2 ? GRP(XM_RT_GROUP_EP) : 0, 0, 0);
  t[PT_GATE] = (xm_rt_tensor_t)P(GATE_NAME, XM_RT_CAT_WEIGHTS, XM_RT_F32, 2, 4, 3, 0, 256,
                                 XM_RT_INIT_NORMAL, 1.0f, -1, 0, 0, 0);
  t[PT_M_GATE] = (xm_rt_tensor_t)P(GATE_NAME ".exp_avg", XM_RT_CAT_OPTIMIZER, XM_RT_F32, 2, 4, 3,
                                   0, 512, 0, 0.0f, PT_GATE, 0, 0, 0);
  for (int i = 0; i < PT_COUNT; i++)
    t[i].placed = placed;
  xm_rt_program_t p = {0};
  p.model_name = "placement-test";
  p.persistent_bytes = 768;
  p.num_tensors = PT_COUNT;
  p.tensors = t;
  p.placement_experts = 4;
  if (placed) {
    p.placement_rows = 1;
    p.placement_layers = k_map_layer;
    p.placement = k_map;
  }
  return p;
}

static void test_placement(void **state) {
  (void)state;
  xm_rt_tensor_t ti[PT_COUNT], tp[PT_COUNT];
  xm_rt_program_t id = placed_program(ti, 0, 0), pl = placed_program(tp, 1, 0);
  assert_false(xm_rt_program_is_placed(&id));
  assert_true(xm_rt_program_is_placed(&pl));
  unsigned char *a = calloc(768, 1), *b = calloc(768, 1);
  assert_non_null(a);
  assert_non_null(b);
  xm_rt_rank_coords_t one = coords(NULL, 0);
  assert_int_equal(xm_rt_shard_init_params(&id, &one, 11, a, NULL), XM_OK);
  assert_int_equal(xm_rt_shard_init_params(&pl, &one, 11, b, NULL), XM_OK);
  const float *fa = (const float *)a, *fb = (const float *)b;
  /* slot p starts as Hugging Face expert k_map[p], the router row p as row k_map[p] */
  for (int p = 0; p < 4; p++) {
    for (int e = 0; e < 6; e++)
      assert_true(fb[p * 6 + e] == fa[k_map[p] * 6 + e]);
    for (int e = 0; e < 3; e++)
      assert_true(fb[64 + p * 3 + e] == fa[64 + k_map[p] * 3 + e]);
  }
  /* the moment gets distinct rows, then the arena goes to the HF order and back */
  float *mb = (float *)(b + 512);
  for (int i = 0; i < 12; i++)
    mb[i] = (float)i;
  unsigned char *c = malloc(768);
  assert_non_null(c);
  memcpy(c, b, 768);
  assert_int_equal(xm_rt_placement_permute(&pl, c, 1, NULL), XM_OK);
  const float *fc = (const float *)c;
  assert_memory_equal(c, a, 256 + 48); /* experts and router: the identity's */
  for (int p = 0; p < 4; p++)
    for (int e = 0; e < 3; e++)
      assert_true(fc[128 + k_map[p] * 3 + e] == (float)(p * 3 + e));
  assert_int_equal(xm_rt_placement_permute(&pl, c, 0, NULL), XM_OK);
  assert_memory_equal(c, b, 768);
  /* the identity table moves nothing */
  memcpy(c, a, 768);
  assert_int_equal(xm_rt_placement_permute(&id, c, 1, NULL), XM_OK);
  assert_memory_equal(c, a, 768);
  /* dp2 ep2: EP rank r holds slots 2r, 2r+1 and draws them as their experts */
  xm_rt_comm_layout_t l = {2, 1, 2, 2, 2};
  for (int r = 0; r < 2; r++) {
    xm_rt_tensor_t ts[PT_COUNT];
    xm_rt_program_t sp = placed_program(ts, 1, 1);
    xm_rt_rank_coords_t rc = coords(&l, r);
    memset(c, 0, 768);
    assert_int_equal(xm_rt_shard_init_params(&sp, &rc, 11, c, NULL), XM_OK);
    for (int s = 0; s < 2; s++)
      for (int e = 0; e < 6; e++)
        assert_true(fc[s * 6 + e] == fa[k_map[2 * r + s] * 6 + e]);
    assert_memory_equal(c + 256, b + 256, 48);
  }
  /* a placed entry whose dim 0 is not the experts is a bad entry */
  tp[PT_GATE].dims[0] = 3;
  xm_diag_t diag;
  xm_diag_init(&diag);
  assert_int_equal(xm_rt_placement_permute(&pl, c, 1, &diag), XM_ERR_INTERNAL);
  assert_non_null(strstr(diag.entries[0].message, "placed"));
  xm_diag_free(&diag);
  free(a);
  free(b);
  free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_coords),      cmocka_unit_test(test_full_view),
      cmocka_unit_test(test_piece_math),  cmocka_unit_test(test_piece_round_trip),
      cmocka_unit_test(test_bad_entries), cmocka_unit_test(test_sliced_init),
      cmocka_unit_test(test_placement),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
