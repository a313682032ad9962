/* tests/unit/test_mpi4_spmd.c — the collectives of generated multi-rank
 * programs (runtime/comm/spmd.h) on 4 ranks as 2 emulated nodes of 2.
 *
 * Each check builds an exec whose comm is a real communicator of one layout
 * and calls the spmd functions as the generated code does. Inputs are
 * functions of (world rank, position), so every rank computes the expected
 * result locally (as in comm_checks.h). Covered, on every group of several
 * layouts: group index and size; all_reduce copying and in place;
 * all_reduce_i32 and its ring traffic; all_gather; narrow; exchange_counts
 * (recv counts and tokens per local expert); the expert all-to-all with
 * zero rows from one member and zero-count blocks, its exact row order and
 * dispatch bytes, the chunk sort into expert-major order and back, and the
 * mirror combine returning every row; ZeRO-1 reduce-scatter and gather
 * with n not divisible by P (short and empty last chunks, zeroed tails)
 * and their ring traffic. The same functions without a communicator act
 * as one-member copies.
 */
/* The shared checks bring helpers this test does not call. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include "comm_checks.h"
#pragma GCC diagnostic pop

#include "runtime/cpu/kernels.h"
#include "runtime/comm/spmd.h"

/* ---- without a communicator ---- */

static void check_no_comm(const xm_rt_context_t *ctx) {
  xm_rt_exec_t x;
  memset(&x, 0, sizeof x);
  x.ctx = ctx;
  for (int k = 0; k < XM_RT_GROUP_COUNT; k++) {
    CHECK_I64("size without comm", xm_rt_group_size(&x, k), 1);
    CHECK_I64("index without comm", xm_rt_group_index(&x, k), 0);
  }
  float a[5] = {1, 2, 3, 4, 5}, b[5] = {0};
  xm_rt_all_reduce(&x, XM_RT_GROUP_DP, -1, a, b, 5);
  CHECK(memcmp(a, b, sizeof a) == 0, "all_reduce without comm is a copy");
  memset(b, 0, sizeof b);
  xm_rt_all_gather(&x, XM_RT_GROUP_TP, -1, a, b, 5);
  CHECK(memcmp(a, b, sizeof a) == 0, "all_gather without comm is a copy");
  int32_t send[3] = {2, 0, 1}, recv[3] = {-1, -1, -1}, tpe[3] = {-1, -1, -1};
  xm_rt_exchange_counts(&x, XM_RT_GROUP_EP, 0, send, recv, tpe, 3);
  CHECK(recv[0] == 2 && recv[1] == 0 && recv[2] == 1 && tpe[0] == 2 && tpe[1] == 0 && tpe[2] == 1,
        "exchange_counts without comm: %d %d %d / %d %d %d", recv[0], recv[1], recv[2], tpe[0],
        tpe[1], tpe[2]);
  float rows[6] = {1, 2, 3, 4, 5, 6}, got[8] = {0};
  int64_t n =
      xm_rt_all_to_all(&x, XM_RT_GROUP_EP, XM_RT_PHASE_DISPATCH, 0, rows, send, recv, 3, 2, got, 4);
  CHECK_I64("all_to_all rows without comm", n, 3);
  CHECK(memcmp(rows, got, sizeof rows) == 0, "all_to_all without comm is a copy");
  float grad[5] = {1, 2, 3, 4, 5}, chunk[5] = {0};
  xm_rt_zero_reduce_scatter(&x, XM_RT_GROUP_DP, grad, 5, chunk);
  CHECK(memcmp(grad, chunk, sizeof grad) == 0, "zero_reduce_scatter without comm is a copy");
  xm_rt_zero_gather(&x, XM_RT_GROUP_DP, grad, 5);
  CHECK(grad[4] == 5.0f, "zero_gather without comm leaves the param");
  int32_t nar_in[6] = {1, 2, 3, 4, 5, 6}, nar_out[6] = {0};
  xm_rt_narrow(&x, XM_RT_GROUP_TP, nar_in, nar_out, 6, 4);
  CHECK(memcmp(nar_in, nar_out, sizeof nar_in) == 0, "narrow without comm is a copy");
}

/* ---- reductions, gathers, narrow ---- */

static void check_reductions(xm_rt_exec_t *x, xm_rt_comm_t *c, xm_rt_group_kind_t kind) {
  const xm_rt_comm_group_t *g = xm_rt_comm_group(c, kind);
  const char *name = xm_rt_group_name(kind);
  const int64_t n = 11;
  int P = g->size, r = c->ctx->rank;
  CHECK_I64("group size", xm_rt_group_size(x, kind), P);
  CHECK_I64("group index", xm_rt_group_index(x, kind), g->index);
  float *a = calloc((size_t)(P * n), sizeof(float)), *b = calloc((size_t)(P * n), sizeof(float));

  /* all_reduce into another buffer: the input stays. */
  for (int64_t i = 0; i < n; i++)
    a[i] = value_of(r, i);
  xm_rt_all_reduce(x, kind, 3, a, b, n);
  int bad = 0;
  for (int64_t i = 0; i < n; i++) {
    float want = 0;
    for (int j = 0; j < P; j++)
      want += value_of(g->members[j], i);
    bad += b[i] != want || a[i] != value_of(r, i);
  }
  CHECK(bad == 0, "all_reduce over %s: %d wrong", name, bad);
  xm_rt_all_reduce(x, kind, -1, a, a, n); /* in place */
  bad = 0;
  for (int64_t i = 0; i < n; i++)
    bad += a[i] != b[i];
  CHECK(bad == 0, "in-place all_reduce over %s: %d wrong", name, bad);

  /* int32 load counters, with the ring traffic of docs/traffic.md. */
  int32_t load[11];
  for (int64_t i = 0; i < n; i++)
    load[i] = r * 100 + (int32_t)i;
  xm_rt_comm_traffic_reset(c);
  xm_rt_all_reduce_i32(x, kind, 1, load, n);
  bad = 0;
  for (int64_t i = 0; i < n; i++) {
    int32_t want = 0;
    for (int j = 0; j < P; j++)
      want += g->members[j] * 100 + (int32_t)i;
    bad += load[i] != want;
  }
  CHECK(bad == 0, "all_reduce_i32 over %s: %d wrong", name, bad);
  for (int q = 0; q < c->layout.world; q++)
    CHECK_I64("all_reduce_i32 bytes", xm_rt_comm_traffic_sent(c, XM_RT_PHASE_ALL_REDUCE, q),
              ring_expect(&c->layout, kind, XM_RT_PHASE_ALL_REDUCE, n, r, q));

  /* all_gather: member order. */
  for (int64_t i = 0; i < n; i++)
    a[i] = value_of(r, i + 5);
  xm_rt_all_gather(x, kind, 2, a, b, n);
  bad = 0;
  for (int j = 0; j < P; j++)
    for (int64_t i = 0; i < n; i++)
      bad += b[j * n + i] != value_of(g->members[j], i + 5);
  CHECK(bad == 0, "all_gather over %s: %d wrong", name, bad);

  /* narrow: this member's slice of the leading dim, f32 and i32. */
  for (int64_t k = 0; k < P * n; k++)
    a[k] = (float)k;
  float slice[11];
  xm_rt_narrow(x, kind, a, slice, n, 4);
  bad = 0;
  for (int64_t i = 0; i < n; i++)
    bad += slice[i] != (float)(g->index * n + i);
  CHECK(bad == 0, "narrow over %s: %d wrong", name, bad);
  int32_t ints[8] = {0, 1, 2, 3, 4, 5, 6, 7}, two[2] = {-1, -1};
  if (P * 2 <= 8) {
    xm_rt_narrow(x, kind, ints, two, 2, 4);
    CHECK(two[0] == 2 * g->index && two[1] == 2 * g->index + 1, "narrow i32 over %s: %d %d", name,
          two[0], two[1]);
  }
  /* reduce_scatter: this member's slice of the sum (the canonicalized
   * narrow(all_reduce)). */
  for (int64_t k = 0; k < P * n; k++)
    a[k] = value_of(r, k);
  xm_rt_reduce_scatter(x, kind, -1, a, slice, n);
  bad = 0;
  for (int64_t i = 0; i < n; i++) {
    float want = 0;
    for (int j = 0; j < P; j++)
      want += value_of(g->members[j], g->index * n + i);
    bad += slice[i] != want;
  }
  CHECK(bad == 0, "reduce_scatter over %s: %d wrong", name, bad);
  xm_rt_comm_traffic_reset(c);
  free(a);
  free(b);
}

/* ---- the expert all-to-all ---- */

enum { L = 3, W = 2 };

/* Rows world rank `src` sends to local expert l of group member p: zero
 * from member 1 altogether, zero for some blocks elsewhere. */
static int32_t ecount(const xm_rt_comm_group_t *g, int src, int p, int l) {
  if (g->size > 1 && src == g->members[1]) return 0;
  return (int32_t)((src * 7 + p * 3 + l * 5) % 4);
}

/* Row r of block (src, p, l): values say where it came from. */
static float erow(int src, int p, int l, int r, int e) {
  return (float)(src * 10000 + p * 1000 + l * 100 + r * 10 + e);
}

static void check_expert_exchange(xm_rt_exec_t *x, xm_rt_comm_t *c, xm_rt_group_kind_t kind) {
  const xm_rt_comm_group_t *g = xm_rt_comm_group(c, kind);
  const char *name = xm_rt_group_name(kind);
  int P = g->size, r = c->ctx->rank, me = g->index;
  int32_t send_counts[64], recv_counts[64], tpe[L];
  int64_t sent = 0, bytes_to[64] = {0};
  for (int p = 0; p < P; p++)
    for (int l = 0; l < L; l++) {
      send_counts[p * L + l] = ecount(g, r, p, l);
      sent += send_counts[p * L + l];
      bytes_to[p] += send_counts[p * L + l] * W * 4;
    }
  float *send = malloc(sizeof(float) * (size_t)(sent * W + 1));
  int64_t off = 0;
  for (int p = 0; p < P; p++)
    for (int l = 0; l < L; l++)
      for (int row = 0; row < send_counts[p * L + l]; row++, off++)
        for (int e = 0; e < W; e++)
          send[off * W + e] = erow(r, p, l, row, e);

  xm_rt_comm_traffic_reset(c);
  xm_rt_exchange_counts(x, kind, 4, send_counts, recv_counts, tpe, L);
  int64_t want_rows = 0;
  int bad = 0;
  for (int p = 0; p < P; p++)
    for (int l = 0; l < L; l++) {
      bad += recv_counts[p * L + l] != ecount(g, g->members[p], me, l);
      want_rows += recv_counts[p * L + l];
    }
  CHECK(bad == 0, "exchange_counts over %s: %d wrong counts", name, bad);
  for (int l = 0; l < L; l++) {
    int32_t want = 0;
    for (int p = 0; p < P; p++)
      want += ecount(g, g->members[p], me, l);
    CHECK(tpe[l] == want, "tokens of local expert %d over %s: %d, want %d", l, name, tpe[l], want);
  }
  for (int p = 0; p < P; p++)
    CHECK_I64("count exchange bytes (other)",
              xm_rt_comm_traffic_sent(c, XM_RT_PHASE_OTHER, g->members[p]), p == me ? 0 : L * 4);

  /* Dispatch with a bound of exactly the rows (plus a guard row that must
   * stay untouched). */
  xm_rt_comm_traffic_reset(c);
  float *recv = malloc(sizeof(float) * (size_t)((want_rows + 1) * W));
  for (int64_t k = 0; k < (want_rows + 1) * W; k++)
    recv[k] = -5.0f;
  int64_t got = xm_rt_all_to_all(x, kind, XM_RT_PHASE_DISPATCH, 4, send, send_counts, recv_counts,
                                 L, W, recv, want_rows);
  CHECK_I64("dispatch rows", got, want_rows);
  CHECK(recv[want_rows * W] == -5.0f, "dispatch over %s wrote past its rows", name);
  off = 0;
  bad = 0;
  for (int p = 0; p < P; p++)
    for (int l = 0; l < L; l++)
      for (int row = 0; row < recv_counts[p * L + l]; row++, off++)
        for (int e = 0; e < W; e++)
          bad += recv[off * W + e] != erow(g->members[p], me, l, row, e);
  CHECK(bad == 0, "dispatch over %s: %d wrong elements (member-major order)", name, bad);
  for (int p = 0; p < P; p++)
    CHECK_I64("dispatch bytes", xm_rt_comm_traffic_sent(c, XM_RT_PHASE_DISPATCH, g->members[p]),
              p == me ? 0 : bytes_to[p]);

  /* Expert-major for the GEMMs, and back. */
  float *sorted = malloc(sizeof(float) * (size_t)((want_rows + 1) * W));
  float *unsorted = malloc(sizeof(float) * (size_t)((want_rows + 1) * W));
  xm_k_sort_chunks(recv, recv_counts, P, L, W, sorted);
  off = 0;
  bad = 0;
  for (int l = 0; l < L; l++)
    for (int p = 0; p < P; p++)
      for (int row = 0; row < recv_counts[p * L + l]; row++, off++)
        for (int e = 0; e < W; e++)
          bad += sorted[off * W + e] != erow(g->members[p], me, l, row, e);
  CHECK(bad == 0, "sorted rows over %s: %d wrong (expert-major order)", name, bad);
  xm_k_unsort_chunks(sorted, recv_counts, P, L, W, unsorted);
  CHECK(want_rows == 0 || memcmp(unsorted, recv, sizeof(float) * (size_t)(want_rows * W)) == 0,
        "unsort over %s did not restore the received order", name);

  /* Combine: the mirror exchange returns every row to its sender. */
  float *back = malloc(sizeof(float) * (size_t)(sent * W + 1));
  int64_t returned = xm_rt_all_to_all(x, kind, XM_RT_PHASE_COMBINE, 4, unsorted, recv_counts,
                                      send_counts, L, W, back, sent);
  CHECK_I64("combine rows", returned, sent);
  CHECK(sent == 0 || memcmp(back, send, sizeof(float) * (size_t)(sent * W)) == 0,
        "combine over %s did not return the rows", name);
  for (int p = 0; p < P; p++) {
    int64_t want = 0;
    for (int l = 0; l < L; l++)
      want += recv_counts[p * L + l] * W * 4;
    CHECK_I64("combine bytes", xm_rt_comm_traffic_sent(c, XM_RT_PHASE_COMBINE, g->members[p]),
              p == me ? 0 : want);
  }
  xm_rt_comm_traffic_reset(c);
  free(back);
  free(unsorted);
  free(sorted);
  free(recv);
  free(send);
}

/* ---- ZeRO-1 ---- */

static void check_zero(xm_rt_exec_t *x, xm_rt_comm_t *c, xm_rt_group_kind_t kind, int64_t n) {
  const xm_rt_comm_group_t *g = xm_rt_comm_group(c, kind);
  const char *name = xm_rt_group_name(kind);
  int P = g->size, r = c->ctx->rank, me = g->index;
  int64_t cs = xm_rt_chunk(n, P), lo = me * cs, own = n - lo < cs ? n - lo : cs;
  if (own < 0) own = 0;
  float *grad = malloc(sizeof(float) * (size_t)n), *chunk = malloc(sizeof(float) * (size_t)cs);
  for (int64_t i = 0; i < n; i++)
    grad[i] = value_of(r, i);
  for (int64_t i = 0; i < cs; i++)
    chunk[i] = -9.0f;
  xm_rt_comm_traffic_reset(c);
  xm_rt_zero_reduce_scatter(x, kind, grad, n, chunk);
  int bad = 0;
  for (int64_t i = 0; i < cs; i++) {
    float want = 0;
    if (i < own)
      for (int j = 0; j < P; j++)
        want += value_of(g->members[j], lo + i);
    bad += chunk[i] != want;
  }
  CHECK(bad == 0, "zero_reduce_scatter of %lld over %s: %d wrong (chunk %lld, own %lld)",
        (long long)n, name, bad, (long long)cs, (long long)own);
  /* The reduce-scatter half of the ring: every chunk but its own. */
  int64_t rs_bytes = P > 1 ? (n - own) * 4 : 0, mine = 0;
  for (int q = 0; q < c->layout.world; q++)
    mine += xm_rt_comm_traffic_sent(c, XM_RT_PHASE_REDUCE_SCATTER, q);
  CHECK_I64("zero_reduce_scatter bytes", mine, rs_bytes);

  /* Gather: each member fills only its own range; everyone ends whole. */
  float *param = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++)
    param[i] = (i >= lo && i < lo + own) ? value_of(100, i) : -3.0f;
  xm_rt_comm_traffic_reset(c);
  xm_rt_zero_gather(x, kind, param, n);
  bad = 0;
  for (int64_t i = 0; i < n; i++)
    bad += param[i] != value_of(100, i);
  CHECK(bad == 0, "zero_gather of %lld over %s: %d wrong", (long long)n, name, bad);
  int64_t next_lo = ((me + 1) % P) * cs, next = n - next_lo < cs ? n - next_lo : cs;
  if (next < 0) next = 0;
  mine = 0;
  for (int q = 0; q < c->layout.world; q++)
    mine += xm_rt_comm_traffic_sent(c, XM_RT_PHASE_ALL_GATHER, q);
  CHECK_I64("zero_gather bytes", mine, P > 1 ? (n - next) * 4 : 0);
  xm_rt_comm_traffic_reset(c);
  free(param);
  free(grad);
  free(chunk);
}

static void check_layout(const xm_rt_context_t *ctx, int dp, int tp, int ep) {
  xm_rt_comm_layout_t l = {dp, tp, ep, 0, 0};
  xm_rt_comm_t *c = NULL;
  xm_status_t st = xm_rt_comm_create(ctx, &l, NULL, &c);
  CHECK(st == XM_OK, "create dp%d tp%d ep%d", dp, tp, ep);
  if (st != XM_OK) return;
  xm_rt_exec_t x;
  memset(&x, 0, sizeof x);
  x.ctx = ctx;
  x.comm = c;
  for (int k = 0; k < XM_RT_GROUP_COUNT; k++) {
    check_reductions(&x, c, k_all_groups[k]);
    check_expert_exchange(&x, c, k_all_groups[k]);
    check_zero(&x, c, k_all_groups[k], 10); /* P = 4: chunks 3, 3, 3, 1 */
    check_zero(&x, c, k_all_groups[k], 5);  /* P = 4: chunks 2, 2, 1, 0 */
    check_zero(&x, c, k_all_groups[k], 1);  /* one element */
  }
  xm_rt_comm_destroy(c);
}

int main(int argc, char **argv) {
  xm_rt_context_t ctx;
  if (!start_checks(&argc, &argv, 4, 2, &ctx)) return 1;
  check_no_comm(&ctx);
  check_layout(&ctx, 4, 1, 4);
  check_layout(&ctx, 2, 2, 2);
  check_layout(&ctx, 4, 1, 2);
  check_layout(&ctx, 1, 4, 1);
  int failed = finish_checks(&ctx, "test_mpi4_spmd");
  xm_rt_context_destroy(&ctx);
  return failed ? 1 : 0;
}
