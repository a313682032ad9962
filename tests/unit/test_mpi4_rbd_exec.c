/* tests/unit/test_mpi4_rbd_exec.c — redundancy-bypassing dispatch executed
 * over MPI (runtime/moe/rbd_exec.h) on 4 ranks as 2 emulated nodes of 2 (ctest
 * runs test_mpi4_* so, XM_RANKS_PER_NODE=2).
 *
 * Every rank can compute every rank's inputs: the routing, the weights, the
 * token rows and the output gradients are hashes of (seed, world rank,
 * token, ...). Column 0 of a token row is its identity src * T + t, so an
 * expert rank can tell which (source, token) each of its rows belongs to
 * and check the row against the formula, not against another MPI call.
 * Fake experts f_e(x) = (e + 1) x + e. All values are small multiples of
 * powers of two, so the sums are nearly exact; the checks use 1e-5
 * relative tolerance.
 *
 * Per layout (dp 4, tp 1; ep 4, 2, 1 on 2 ranks per node, and ep 4 / 2 on
 * emulated 1 and 4 ranks per node through a copy of the context: one rank
 * per node, and one node holding two EP groups whose replicas travel over
 * the EP group) and per trial (k = 2..4, E = 8, T = 0, 1 or 13, H = 3 or
 * 8; some tokens with all experts on one node, some slots dropped, a token
 * with no slot, one trial where no token picks the experts of the last EP
 * rank so that it gets zero rows):
 *   dispatch   M and tpe against a count over every source's routing; every
 *              row is a real (source, token, expert) triple, each exactly
 *              once, in expert-major order; nothing written past `bound`
 *              (bound = the largest M of the group, so one rank is exactly
 *              at it); inter-node pilot rows and flat rows (stats) against
 *              the own routing; DISPATCH bytes to other nodes = pilots x (H
 *              + 2k) x 4;
 *   combine    out[t] = sum_j w_j f_{e_j}(x_t); COMBINE bytes across nodes
 *              summed over ranks = the pilots crossing nodes x H x 4;
 *   gradients  drows[m] = w * dout[t], dweights[t,j] = dot(dout[t], y),
 *              dx[t] = sum_j drows2[m(t,j)] for a drows2 that depends on e;
 *              their traffic by the same byte model.
 * Two slots are dispatched before either is combined (records are kept per
 * slot), and a one-rank run (x->comm NULL) checks the local path on every
 * rank.
 *
 * With XM_RBD_TEST_MODE set the binary plays one failure for
 * tests/e2e/rbd_bound.sh instead: "bound" (rank 1 would hold more rows than
 * the bound) and "badid" (rank 2 routes to expert 8 of 8). Every rank must
 * end non-zero.
 */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_check.h"
#include "runtime/comm/comm.h"
#include "runtime/moe/rbd_exec.h"

/* |got - want| <= 1e-5 (1 + |scale|), scale the sum of the magnitudes. */
static int close_enough(double got, double want, double scale) {
  return fabs(got - want) <= 1e-5 * (1.0 + fabs(scale));
}

/* ---- the deterministic inputs ---- */

typedef struct {
  int ep, rpn;  /* EP group size, ranks per (emulated) node */
  int first;    /* world rank of EP index 0 */
  int ep_index; /* this rank's EP index */
  int rank;     /* this rank's world rank */
  int64_t T, k, H, E, L;
  uint32_t seed;
  int avoid; /* EP index whose experts no token picks; -1 none */
  const char *name;
} setup_t;

static uint32_t mix4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  uint32_t h = a * 0x9E3779B1u ^ (b + 0x7F4A7C15u) * 0x85EBCA77u ^ (c + 0x165667B1u) * 0xC2B2AE3Du ^
               (d + 0x27D4EB2Fu) * 0x9E3779B9u;
  h ^= h >> 15;
  h *= 0x2C1B3C6Du;
  h ^= h >> 12;
  h *= 0x297A2D39u;
  h ^= h >> 15;
  return h;
}

static int node_of_rank(const setup_t *s, int world_rank) { return world_rank / s->rpn; }
static int node_of_expert(const setup_t *s, int e) {
  return node_of_rank(s, s->first + (int)(e / s->L));
}

/* Token t of world rank src: k expert ids (-1 dropped) and k weights.
 * Every 7th token (t % 7 == 3) has no slot; every 5th (t % 5 == 1) picks
 * its experts from one node only (as many as the node has); other slots
 * are distinct uniform picks, each dropped with probability 1/11. */
static void route(const setup_t *s, int src, int64_t t, int32_t *ids, float *w) {
  int32_t cand[64];
  int n = 0;
  for (int e = 0; e < s->E; e++)
    if (s->avoid < 0 || e / s->L != s->avoid) cand[n++] = e;
  uint32_t tt = (uint32_t)t;
  if (t % 5 == 1 && n > 0) {
    int node = node_of_expert(s, cand[mix4(s->seed, (uint32_t)src, tt, 99) % (uint32_t)n]), m = 0;
    for (int i = 0; i < n; i++)
      if (node_of_expert(s, cand[i]) == node) cand[m++] = cand[i];
    n = m;
  }
  for (int64_t j = 0; j < s->k; j++) {
    w[j] = (float)(1 + mix4(s->seed, (uint32_t)src, tt, 200 + (uint32_t)j) % 15) / 16.0f;
    ids[j] = -1;
    if (j >= n) continue;
    int pick = (int)j +
               (int)(mix4(s->seed, (uint32_t)src, tt, 100 + (uint32_t)j) % (uint32_t)(n - (int)j));
    int32_t tmp = cand[j];
    cand[j] = cand[pick];
    cand[pick] = tmp;
    ids[j] = cand[j];
    if (t % 5 != 1 && mix4(s->seed, (uint32_t)src, tt, 300 + (uint32_t)j) % 11 == 0) ids[j] = -1;
  }
  if (t % 7 == 3)
    for (int64_t j = 0; j < s->k; j++)
      ids[j] = -1;
}

/* Column 0 is the identity src * T + t; the others multiples of 1/8. */
static float x_val(const setup_t *s, int src, int64_t t, int64_t c) {
  if (c == 0) return (float)(src * s->T + t);
  return ((float)(mix4(s->seed ^ 0x55u, (uint32_t)src, (uint32_t)t, (uint32_t)c) % 17) - 8.0f) /
         8.0f;
}

static float dout_val(const setup_t *s, int src, int64_t t, int64_t c) {
  return ((float)(mix4(s->seed ^ 0xAAu, (uint32_t)src, (uint32_t)t, (uint32_t)c) % 9) - 4.0f) /
         4.0f;
}

static float f_expert(int e, float x) { return (float)(e + 1) * x + (float)e; }

/* drows2 of dispatch_grad: depends on the expert and the column. */
static float g_expert(int e, float x, int64_t c) { return (float)(e + 2) * x + 0.5f * (float)c; }

/* Slot of token (src, t) holding expert e, or -1. */
static int slot_of(const setup_t *s, int src, int64_t t, int e, float *out_w) {
  int32_t ids[64];
  float w[64];
  route(s, src, t, ids, w);
  for (int64_t j = 0; j < s->k; j++)
    if (ids[j] == e) {
      if (out_w) *out_w = w[j];
      return (int)j;
    }
  return -1;
}

/* ---- one trial ---- */

typedef struct {
  setup_t s;
  int slot, layer;
  int32_t *ids;     /* [T*k] own routing */
  float *w, *x;     /* [T*k], [T*H] */
  int64_t bound, M; /* bound = the largest M of the group */
  int64_t want_M;
  int64_t *want_tpe; /* [L] */
  float *rows;       /* [(bound + 1) * H]: the last row is a canary */
  int32_t *tpe;      /* [L] */
  float *y;          /* [M*H] expert outputs */
} trial_t;

static const float k_canary = 12345.5f;

static void trial_init(trial_t *tr, const setup_t *s, int slot, int layer) {
  memset(tr, 0, sizeof *tr);
  tr->s = *s;
  tr->slot = slot, tr->layer = layer;
  int64_t T = s->T, k = s->k, H = s->H;
  tr->ids = calloc((size_t)(T * k + 1), sizeof(int32_t));
  tr->w = calloc((size_t)(T * k + 1), sizeof(float));
  tr->x = calloc((size_t)(T * H + 1), sizeof(float));
  for (int64_t t = 0; t < T; t++) {
    route(s, s->rank, t, tr->ids + t * k, tr->w + t * k);
    for (int64_t c = 0; c < H; c++)
      tr->x[t * H + c] = x_val(s, s->rank, t, c);
  }
  /* Rows per EP rank over every source of the group. */
  int64_t *per_rank = calloc((size_t)s->ep, sizeof(int64_t));
  tr->want_tpe = calloc((size_t)s->L, sizeof(int64_t));
  int32_t ids[64];
  float w[64];
  for (int src = s->first; src < s->first + s->ep; src++)
    for (int64_t t = 0; t < T; t++) {
      route(s, src, t, ids, w);
      for (int64_t j = 0; j < k; j++) {
        if (ids[j] < 0) continue;
        int q = (int)(ids[j] / s->L);
        per_rank[q]++;
        if (q == s->ep_index) tr->want_tpe[ids[j] - q * s->L]++;
      }
    }
  tr->want_M = per_rank[s->ep_index];
  for (int q = 0; q < s->ep; q++)
    if (per_rank[q] > tr->bound) tr->bound = per_rank[q];
  free(per_rank);
  tr->rows = malloc((size_t)((tr->bound + 1) * H) * sizeof(float));
  for (int64_t i = 0; i < (tr->bound + 1) * H; i++)
    tr->rows[i] = k_canary;
  tr->tpe = calloc((size_t)s->L, sizeof(int32_t));
}

static void trial_free(trial_t *tr) {
  free(tr->ids);
  free(tr->w);
  free(tr->x);
  free(tr->want_tpe);
  free(tr->rows);
  free(tr->tpe);
  free(tr->y);
}

/* Bytes this rank sent in `phase` to ranks of other nodes. */
static int64_t inter_bytes(const xm_rt_comm_t *c, const setup_t *s, xm_rt_phase_t phase) {
  int64_t b = 0;
  for (int q = 0; q < c->layout.world; q++)
    if (node_of_rank(s, q) != node_of_rank(s, s->rank)) b += xm_rt_comm_traffic_sent(c, phase, q);
  return b;
}

/* Pilot rows this rank sends across nodes, and flat rows across nodes. */
static void want_inter(const trial_t *tr, int64_t *out_pilots, int64_t *out_flat) {
  const setup_t *s = &tr->s;
  int own = node_of_rank(s, s->rank);
  *out_pilots = *out_flat = 0;
  for (int64_t t = 0; t < s->T; t++) {
    int nodes[64], n = 0;
    for (int64_t j = 0; j < s->k; j++) {
      int32_t e = tr->ids[t * s->k + j];
      if (e < 0) continue;
      int node = node_of_expert(s, e);
      if (node == own) continue;
      (*out_flat)++;
      int seen = 0;
      for (int i = 0; i < n; i++)
        seen |= nodes[i] == node;
      if (!seen) nodes[n++] = node;
    }
    *out_pilots += n;
  }
}

static void trial_dispatch(xm_rt_exec_t *x, trial_t *tr) {
  const setup_t *s = &tr->s;
  xm_rt_comm_t *c = x->comm;
  int64_t H = s->H, L = s->L;
  if (c) xm_rt_comm_traffic_reset(c);
  xm_rt_rbd_stats(x, NULL, NULL, 1);
  tr->M = xm_rt_rbd_dispatch(x, tr->slot, tr->layer, tr->x, tr->ids, tr->w, s->T, s->k, H, s->E,
                             tr->rows, tr->tpe, tr->bound);
  CHECK_I64(s->name, tr->M, tr->want_M);
  if (s->avoid == s->ep_index) CHECK_I64("rows of the avoided rank", tr->M, 0);
  int64_t sum = 0;
  for (int64_t l = 0; l < L; l++) {
    CHECK(tr->tpe[l] == tr->want_tpe[l], "%s: tpe[%lld] = %d, want %lld", s->name, (long long)l,
          tr->tpe[l], (long long)tr->want_tpe[l]);
    sum += tr->tpe[l];
  }
  CHECK_I64("sum of tpe", sum, tr->M);
  for (int64_t i = tr->bound * H; i < (tr->bound + 1) * H; i++)
    CHECK(tr->rows[i] == k_canary, "%s: row past the bound written", s->name);
  if (tr->M != tr->want_M || sum != tr->M) return;

  /* Every row: a real (source, token, expert) triple, once, expert-major. */
  unsigned char *seen = calloc((size_t)(s->ep * s->T * L + 1), 1);
  int64_t m = 0, bad = 0;
  for (int64_t l = 0; l < L; l++) {
    int e = (int)(s->ep_index * L + l);
    for (int32_t i = 0; i < tr->tpe[l]; i++, m++) {
      const float *row = tr->rows + m * H;
      int64_t id = (int64_t)row[0];
      int src = (int)(id / (s->T ? s->T : 1));
      int64_t t = id - (int64_t)src * s->T;
      int ok = (float)id == row[0] && src >= s->first && src < s->first + s->ep && t >= 0 &&
               t < s->T && slot_of(s, src, t, e, NULL) >= 0;
      for (int64_t col = 1; ok && col < H; col++)
        ok = row[col] == x_val(s, src, t, col);
      if (ok) {
        unsigned char *f = &seen[((int64_t)(src - s->first) * s->T + t) * L + l];
        ok = !*f;
        *f = 1;
      }
      if (!ok && bad++ < 5)
        CHECK(0, "%s: row %lld of expert %d (identity %g) is not a token routed there once",
              s->name, (long long)m, e, (double)row[0]);
    }
  }
  if (bad > 5) CHECK(0, "%s: %lld bad rows", s->name, (long long)bad);
  free(seen);

  int64_t pilots, flat, got_rbd, got_flat;
  want_inter(tr, &pilots, &flat);
  xm_rt_rbd_stats(x, &got_rbd, &got_flat, 0);
  CHECK_I64("pilot rows across nodes (stats)", got_rbd, pilots);
  CHECK_I64("flat rows across nodes (stats)", got_flat, flat);
  CHECK(got_rbd <= got_flat, "%s: rbd %lld > flat %lld", s->name, (long long)got_rbd,
        (long long)got_flat);
  if (c)
    CHECK_I64("dispatch bytes across nodes", inter_bytes(c, s, XM_RT_PHASE_DISPATCH),
              pilots * (H + 2 * s->k) * 4);
}

/* Summed over the world: bytes across nodes in `phase` == the pilots
 * crossing nodes x width x 4 (the mirror of the dispatch). */
static void check_mirror(const xm_rt_exec_t *x, const trial_t *tr, const xm_rt_context_t *ctx,
                         xm_rt_phase_t phase, int64_t width, const char *what) {
  xm_rt_comm_t *c = x->comm;
  if (!c) return;
  int64_t pilots, flat;
  want_inter(tr, &pilots, &flat);
  long long mine[2] = {(long long)inter_bytes(c, &tr->s, phase), (long long)(pilots * width * 4)};
  long long sum[2];
  MPI_Allreduce(mine, sum, 2, MPI_LONG_LONG, MPI_SUM, ctx->world_comm);
  CHECK(sum[0] == sum[1], "%s: %s bytes across nodes %lld, want %lld", tr->s.name, what, sum[0],
        sum[1]);
}

static void trial_combine(xm_rt_exec_t *x, trial_t *tr, const xm_rt_context_t *ctx) {
  const setup_t *s = &tr->s;
  int64_t H = s->H, k = s->k, T = s->T;
  tr->y = calloc((size_t)(tr->M * H + 1), sizeof(float));
  int64_t m = 0;
  for (int64_t l = 0; l < s->L; l++)
    for (int32_t i = 0; i < tr->tpe[l]; i++, m++)
      for (int64_t c = 0; c < H; c++)
        tr->y[m * H + c] = f_expert((int)(s->ep_index * s->L + l), tr->rows[m * H + c]);
  float *out = malloc((size_t)(T * H + 1) * sizeof(float));
  for (int64_t i = 0; i < T * H; i++)
    out[i] = NAN;
  if (x->comm) xm_rt_comm_traffic_reset(x->comm);
  xm_rt_rbd_combine(x, tr->slot, tr->layer, tr->y, out);
  int bad = 0;
  for (int64_t t = 0; t < T; t++)
    for (int64_t c = 0; c < H; c++) {
      double want = 0.0, scale = 0.0;
      for (int64_t j = 0; j < k; j++) {
        int32_t e = tr->ids[t * k + j];
        if (e < 0) continue;
        double v = (double)tr->w[t * k + j] * f_expert(e, tr->x[t * H + c]);
        want += v, scale += fabs(v);
      }
      float got = out[t * H + c];
      if (!close_enough(got, want, scale) && bad++ < 5)
        CHECK(0, "%s: out[%lld][%lld] = %g, want %g", s->name, (long long)t, (long long)c,
              (double)got, want);
    }
  free(out);
  check_mirror(x, tr, ctx, XM_RT_PHASE_COMBINE, H, "combine");
}

static void trial_grads(xm_rt_exec_t *x, trial_t *tr, const xm_rt_context_t *ctx) {
  const setup_t *s = &tr->s;
  int64_t H = s->H, k = s->k, T = s->T, M = tr->M;
  float *dout = malloc((size_t)(T * H + 1) * sizeof(float));
  for (int64_t t = 0; t < T; t++)
    for (int64_t c = 0; c < H; c++)
      dout[t * H + c] = dout_val(s, s->rank, t, c);
  float *drows = malloc((size_t)(M * H + 1) * sizeof(float));
  float *dw = malloc((size_t)(T * k + 1) * sizeof(float));
  for (int64_t i = 0; i < T * k; i++)
    dw[i] = NAN;
  xm_rt_comm_t *c = x->comm;
  if (c) xm_rt_comm_traffic_reset(c);
  xm_rt_rbd_combine_grad(x, tr->slot, tr->layer, dout, tr->y, drows, dw);
  int64_t pilots, flat;
  want_inter(tr, &pilots, &flat);
  if (c)
    CHECK_I64("combine_grad dout bytes across nodes", inter_bytes(c, s, XM_RT_PHASE_DISPATCH),
              pilots * H * 4);
  check_mirror(x, tr, ctx, XM_RT_PHASE_COMBINE, k, "dweights");

  /* drows[m] = w * dout of the row's (source, token). */
  int bad = 0;
  int64_t m = 0;
  for (int64_t l = 0; l < s->L; l++) {
    int e = (int)(s->ep_index * s->L + l);
    for (int32_t i = 0; i < tr->tpe[l]; i++, m++) {
      int64_t id = (int64_t)tr->rows[m * H];
      int src = (int)(id / T);
      int64_t t = id - (int64_t)src * T;
      float w = 0.0f;
      slot_of(s, src, t, e, &w);
      for (int64_t col = 0; col < H; col++) {
        double want = (double)w * dout_val(s, src, t, col);
        if (!close_enough(drows[m * H + col], want, want) && bad++ < 5)
          CHECK(0, "%s: drows[%lld][%lld] = %g, want %g", s->name, (long long)m, (long long)col,
                (double)drows[m * H + col], want);
      }
    }
  }
  /* dweights[t,j] = dot(dout[t], f_{e_j}(x_t)), 0 for a dropped slot. */
  for (int64_t t = 0; t < T; t++)
    for (int64_t j = 0; j < k; j++) {
      int32_t e = tr->ids[t * k + j];
      double want = 0.0, scale = 0.0;
      for (int64_t col = 0; e >= 0 && col < H; col++) {
        double v = (double)dout[t * H + col] * f_expert(e, tr->x[t * H + col]);
        want += v, scale += fabs(v);
      }
      if (!close_enough(dw[t * k + j], want, scale) && bad++ < 5)
        CHECK(0, "%s: dweights[%lld][%lld] = %g, want %g", s->name, (long long)t, (long long)j,
              (double)dw[t * k + j], want);
    }

  /* dispatch_grad of drows2[m] = g_e(row): dx[t] = sum_j g_{e_j}(x_t). */
  m = 0;
  for (int64_t l = 0; l < s->L; l++)
    for (int32_t i = 0; i < tr->tpe[l]; i++, m++)
      for (int64_t col = 0; col < H; col++)
        drows[m * H + col] = g_expert((int)(s->ep_index * s->L + l), tr->rows[m * H + col], col);
  float *dx = malloc((size_t)(T * H + 1) * sizeof(float));
  for (int64_t i = 0; i < T * H; i++)
    dx[i] = NAN;
  if (c) xm_rt_comm_traffic_reset(c);
  xm_rt_rbd_dispatch_grad(x, tr->slot, tr->layer, drows, dx);
  for (int64_t t = 0; t < T; t++)
    for (int64_t col = 0; col < H; col++) {
      double want = 0.0, scale = 0.0;
      for (int64_t j = 0; j < k; j++) {
        int32_t e = tr->ids[t * k + j];
        if (e < 0) continue;
        double v = g_expert(e, tr->x[t * H + col], col);
        want += v, scale += fabs(v);
      }
      if (!close_enough(dx[t * H + col], want, scale) && bad++ < 5)
        CHECK(0, "%s: dx[%lld][%lld] = %g, want %g", s->name, (long long)t, (long long)col,
              (double)dx[t * H + col], want);
    }
  check_mirror(x, tr, ctx, XM_RT_PHASE_COMBINE, H, "dispatch_grad");
  free(dout);
  free(drows);
  free(dw);
  free(dx);
}

/* ---- layouts ---- */

static setup_t make_setup(const xm_rt_comm_t *c, const xm_rt_context_t *ctx, int64_t T, int64_t k,
                          int64_t H, uint32_t seed, int avoid, const char *name) {
  setup_t s = {.T = T, .k = k, .H = H, .E = 8, .seed = seed, .avoid = avoid, .name = name};
  s.rank = ctx->rank;
  if (c) {
    const xm_rt_comm_group_t *g = xm_rt_comm_group(c, XM_RT_GROUP_EP);
    s.ep = g->size, s.ep_index = g->index, s.first = g->members[0];
    s.rpn = c->layout.ranks_per_node;
  } else {
    s.ep = 1, s.ep_index = 0, s.first = ctx->rank, s.rpn = 1;
  }
  s.L = s.E / s.ep;
  if (s.avoid >= s.ep) s.avoid = -1;
  return s;
}

/* The trials of one layout: single slots with several shapes, then two
 * slots in flight at once. */
static void run_trials(xm_rt_exec_t *x, const xm_rt_context_t *ctx, const char *name) {
  xm_rt_comm_t *c = x->comm;
  int ep = c ? xm_rt_comm_group(c, XM_RT_GROUP_EP)->size : 1;
  const struct {
    int64_t T, k, H;
    int avoid;
  } shapes[] = {{13, 2, 3, -1}, {13, 3, 8, -1}, {13, 4, 5, -1}, {13, 4, 3, ep - 1},
                {1, 3, 4, -1},  {0, 2, 3, -1},  {40, 4, 8, -1}};
  char label[128];
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    snprintf(label, sizeof label, "%s T%lld k%lld H%lld%s", name, (long long)shapes[i].T,
             (long long)shapes[i].k, (long long)shapes[i].H, shapes[i].avoid >= 0 ? " avoid" : "");
    setup_t s = make_setup(c, ctx, shapes[i].T, shapes[i].k, shapes[i].H, 17u + (uint32_t)i,
                           ep > 1 ? shapes[i].avoid : -1, label);
    trial_t tr;
    trial_init(&tr, &s, (int)i % 2, (int)i);
    trial_dispatch(x, &tr);
    if (tr.M == tr.want_M) {
      trial_combine(x, &tr, ctx);
      trial_grads(x, &tr, ctx);
    }
    trial_free(&tr);
  }
  /* Two slots in flight (slot 6 grows the table), combined in reverse. */
  snprintf(label, sizeof label, "%s slot A", name);
  setup_t sa = make_setup(c, ctx, 11, 3, 4, 71u, -1, label);
  char label_b[128];
  snprintf(label_b, sizeof label_b, "%s slot B", name);
  setup_t sb = make_setup(c, ctx, 9, 4, 6, 72u, -1, label_b);
  trial_t a, b;
  trial_init(&a, &sa, 0, 0);
  trial_init(&b, &sb, 6, 1);
  trial_dispatch(x, &a);
  trial_dispatch(x, &b);
  if (a.M == a.want_M && b.M == b.want_M) {
    trial_combine(x, &b, ctx);
    trial_combine(x, &a, ctx);
    trial_grads(x, &a, ctx);
    trial_grads(x, &b, ctx);
  }
  trial_free(&a);
  trial_free(&b);
  /* Stats accumulate over dispatches until a reset. */
  int64_t r1, f1, r2, f2;
  xm_rt_rbd_stats(x, &r1, &f1, 1);
  xm_rt_rbd_stats(x, &r2, &f2, 0);
  CHECK(r2 == 0 && f2 == 0, "%s: stats not reset (%lld, %lld)", name, (long long)r2, (long long)f2);
  xm_rt_rbd_exec_free(x);
  CHECK(x->rbd == NULL, "%s: exec_free left the state", name);
  xm_rt_rbd_exec_free(x);
}

/* A copy of the context that sees `rpn` ranks per node (the groups are
 * built from world_comm only). */
static xm_rt_context_t emulate(const xm_rt_context_t *ctx, int rpn) {
  xm_rt_context_t e = *ctx;
  e.ranks_per_node = rpn;
  e.node = ctx->rank / rpn;
  e.local_rank = ctx->rank % rpn;
  e.num_nodes = ctx->world / rpn;
  return e;
}

static void run_layout(const xm_rt_context_t *ctx, int ep, int rpn) {
  xm_rt_context_t emu = emulate(ctx, rpn);
  xm_rt_comm_layout_t l = {4, 1, ep, 0, 0};
  xm_rt_comm_t *c = NULL;
  xm_diag_t d;
  xm_diag_init(&d);
  xm_status_t st = xm_rt_comm_create(&emu, &l, &d, &c);
  CHECK(st == XM_OK, "ep %d, %d per node: create: %s", ep, rpn,
        d.count ? d.entries[0].message : "?");
  xm_diag_free(&d);
  if (st != XM_OK) return;
  xm_rt_exec_t x = {0};
  x.ctx = &emu;
  x.comm = c;
  char name[64];
  snprintf(name, sizeof name, "ep%d rpn%d", ep, rpn);
  run_trials(&x, &emu, name);
  xm_rt_comm_destroy(c);
}

/* ---- failure modes (tests/e2e/rbd_bound.sh) ---- */

static int play_failure(const xm_rt_context_t *ctx, const char *mode) {
  xm_rt_comm_layout_t l = {4, 1, 4, 0, 0};
  xm_rt_comm_t *c = NULL;
  if (xm_rt_comm_create(ctx, &l, NULL, &c) != XM_OK) return 3;
  xm_rt_exec_t x = {0};
  x.ctx = ctx;
  x.comm = c;
  enum { T = 8, K = 2, H = 4, E = 8 };
  int32_t ids[T * K], tpe[E];
  float tokens[T * H] = {0}, w[T * K], rows[16 * H];
  for (int i = 0; i < T * K; i++) {
    ids[i] = 2 + i % 2; /* every slot on EP rank 1: it would hold 4 * 8 * 2 = 64 rows */
    w[i] = 0.5f;
  }
  int64_t bound = 16;
  if (!strcmp(mode, "badid")) {
    for (int i = 0; i < T * K; i++)
      ids[i] = (int32_t)(i % E);
    if (ctx->rank == 2) ids[5] = E;
    bound = 16;
  }
  xm_rt_rbd_dispatch(&x, 1, 3, tokens, ids, w, T, K, H, E, rows, tpe, bound);
  printf("rank %d: NOT REACHED (mode %s)\n", ctx->rank, mode);
  fflush(stdout);
  xm_rt_rbd_exec_free(&x);
  xm_rt_comm_destroy(c);
  return 0;
}

int main(int argc, char **argv) {
  xm_rt_context_t ctx;
  if (!start_checks(&argc, &argv, 4, 2, &ctx)) return 1;
  const char *mode = getenv("XM_RBD_TEST_MODE");
  if (mode && *mode) {
    int rc = play_failure(&ctx, mode);
    xm_rt_context_destroy(&ctx);
    return rc;
  }
  /* (ep, ranks per node): 2 nodes of 2 (ep over both nodes, ep inside one
   * node, no EP), every rank its own node, one node of 4 (two EP groups on
   * a node: replicas over the EP group; one EP group filling the node). */
  const int layouts[][2] = {{4, 2}, {2, 2}, {1, 2}, {4, 1}, {2, 4}, {4, 4}};
  for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++)
    run_layout(&ctx, layouts[i][0], layouts[i][1]);
  /* One rank: x->comm NULL, all 8 experts here, on every rank alone. */
  xm_rt_exec_t x = {0};
  x.ctx = &ctx;
  run_trials(&x, &ctx, "local");

  int total = finish_checks(&ctx, "test_mpi4_rbd_exec");
  xm_rt_context_destroy(&ctx);
  return total ? 1 : 0;
}
