/* tests/unit/comm_checks.h — checks of the runtime communicator
 * (runtime/comm/comm.h) shared by the 2-rank and the 4-rank tests.
 *
 * Every rank can compute every other rank's inputs: the floats of a
 * collective come from value_of(world rank, element) and the rows of an
 * all-to-all from a_count(seed, source world rank, destination index) and
 * row_value(...), so each result is compared against a reference computed
 * locally, not against another MPI call. All values are small multiples of
 * 1/2, so sums of a few of them are exact in fp32 and compared with ==.
 *
 * The tests are plain main() programs (MPI starts once per process); a
 * failed check is counted and printed with its rank, and every rank keeps
 * calling the same collectives so a failure never turns into a hang.
 */
#ifndef XM_TESTS_COMM_CHECKS_H
#define XM_TESTS_COMM_CHECKS_H

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_check.h"
#include "runtime/comm/comm.h"

static const xm_rt_group_kind_t k_all_groups[XM_RT_GROUP_COUNT] = {
    XM_RT_GROUP_WORLD, XM_RT_GROUP_DP,  XM_RT_GROUP_TP,
    XM_RT_GROUP_EP,    XM_RT_GROUP_EDP, XM_RT_GROUP_NODE};

static float value_of(int rank, int64_t i) { return (float)(rank * 7 + (int)(i % 13)) * 0.5f; }

static uint32_t mix3(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t h = a * 0x9E3779B1u ^ (b + 0x7F4A7C15u) * 0x85EBCA77u ^ (c + 0x165667B1u) * 0xC2B2AE3Du;
  h ^= h >> 15;
  h *= 0x2C1B3C6Du;
  h ^= h >> 12;
  return h;
}

/* Rows rank `src` sends to group index `dst` (0..4, zeros included). */
static int64_t a_count(uint32_t seed, int src, int dst) {
  return (int64_t)(mix3(seed, (uint32_t)src, (uint32_t)dst) % 5u);
}

static float row_value(int src, int dst, int64_t row, int64_t e) {
  return (float)(src * 10000 + dst * 1000 + (int)row * 10 + (int)e);
}

/* Layout-independent truths about a group, against MPI itself. */
static void check_group_mpi(const xm_rt_comm_t *c, xm_rt_group_kind_t kind) {
  const xm_rt_comm_group_t *g = xm_rt_comm_group(c, kind);
  const char *name = xm_rt_group_name(kind);
  int size = -1, index = -1;
  MPI_Comm_size(g->comm, &size);
  MPI_Comm_rank(g->comm, &index);
  CHECK(size == g->size && index == g->index, "%s: MPI says %d/%d, group says %d/%d", name, index,
        size, g->index, g->size);
  int *ranks = calloc((size_t)size, sizeof(int));
  MPI_Allgather(&c->ctx->rank, 1, MPI_INT, ranks, 1, MPI_INT, g->comm);
  for (int j = 0; j < size && j < g->size; j++)
    CHECK(ranks[j] == g->members[j], "%s member %d: MPI has world rank %d, group %d", name, j,
          ranks[j], g->members[j]);
  free(ranks);
  int *m = calloc((size_t)c->layout.world, sizeof(int));
  int idx = -1, n = xm_rt_comm_layout_group(&c->layout, kind, c->ctx->rank, m, &idx);
  CHECK(n == g->size && idx == g->index, "%s: layout_group gives %d/%d", name, idx, n);
  for (int j = 0; j < n && j < g->size; j++)
    CHECK(m[j] == g->members[j], "%s: layout_group member %d is %d", name, j, m[j]);
  for (int j = 1; j < g->size; j++)
    CHECK(g->members[j] > g->members[j - 1], "%s: members not ascending", name);
  free(m);
}

/* Members as "a,b,c" for comparison with a table. */
static void members_text(const xm_rt_comm_group_t *g, char *buf, size_t size) {
  size_t len = 0;
  buf[0] = '\0';
  for (int j = 0; j < g->size && len < size; j++)
    len += (size_t)snprintf(buf + len, size - len, "%s%d", j ? "," : "", g->members[j]);
}

/* ---- the ring model of docs/traffic.md, for the expected counters ---- */

/* Bytes rank `r`'s ring step of `phase` puts on the wire to `peer`. */
static int64_t ring_expect(const xm_rt_comm_layout_t *l, xm_rt_group_kind_t kind,
                           xm_rt_phase_t phase, int64_t n, int r, int peer) {
  int m[64], i = 0, P = xm_rt_comm_layout_group(l, kind, r, m, &i);
  if (P < 2) return 0;
  int64_t total;
  if (phase == XM_RT_PHASE_ALL_REDUCE) {
    int64_t own = n / P + (i < n % P ? 1 : 0), next = n / P + ((i + 1) % P < n % P ? 1 : 0);
    total = 4 * ((n - own) + (n - next));
  } else {
    total = 4 * (int64_t)(P - 1) * n;
  }
  int succ = m[(i + 1) % P], pred = m[(i + P - 1) % P];
  if (succ == pred) return peer == succ ? total : 0;
  if (peer == succ) return total / 2;
  if (peer == pred) return total - total / 2;
  return 0;
}

static void check_ring_traffic(xm_rt_comm_t *c, xm_rt_group_kind_t kind, xm_rt_phase_t phase,
                               int64_t n, int64_t wire_total) {
  int64_t mine = 0, all = 0;
  for (int q = 0; q < c->layout.world; q++) {
    int64_t got = xm_rt_comm_traffic_sent(c, phase, q);
    int64_t want = ring_expect(&c->layout, kind, phase, n, c->ctx->rank, q);
    CHECK(got == want, "%s over %s: %lld bytes to rank %d, want %lld", xm_rt_phase_name(phase),
          xm_rt_group_name(kind), (long long)got, q, (long long)want);
    mine += got;
  }
  /* Over a whole group the ring moves wire_total bytes per group; summed
   * over the world that is (world / P) groups' worth. */
  MPI_Allreduce(&mine, &all, 1, MPI_INT64_T, MPI_SUM, c->ctx->world_comm);
  int P = xm_rt_comm_group(c, kind)->size;
  CHECK_I64("world total of the ring", all, wire_total * (c->layout.world / P));
}

/* all_reduce, all_gather (copy and in place), reduce_scatter on one group. */
static void check_collectives(xm_rt_comm_t *c, xm_rt_group_kind_t kind) {
  const xm_rt_comm_group_t *g = xm_rt_comm_group(c, kind);
  const char *name = xm_rt_group_name(kind);
  const int64_t n = 37;
  int P = g->size, r = c->ctx->rank;
  float *a = calloc((size_t)(P * n), sizeof(float));
  float *b = calloc((size_t)(P * n), sizeof(float));

  xm_rt_comm_traffic_reset(c);
  for (int64_t i = 0; i < n; i++)
    a[i] = value_of(r, i);
  CHECK(xm_rt_comm_all_reduce(c, kind, a, n) == XM_OK, "all_reduce over %s", name);
  int bad = 0;
  for (int64_t i = 0; i < n; i++) {
    float want = 0;
    for (int j = 0; j < P; j++)
      want += value_of(g->members[j], i);
    bad += a[i] != want;
  }
  CHECK(bad == 0, "all_reduce over %s: %d wrong elements", name, bad);
  check_ring_traffic(c, kind, XM_RT_PHASE_ALL_REDUCE, n, 2 * (int64_t)(P - 1) * n * 4);

  xm_rt_comm_traffic_reset(c);
  for (int64_t i = 0; i < n; i++)
    a[i] = value_of(r, i);
  CHECK(xm_rt_comm_all_gather(c, kind, a, n, b) == XM_OK, "all_gather over %s", name);
  bad = 0;
  for (int j = 0; j < P; j++)
    for (int64_t i = 0; i < n; i++)
      bad += b[j * n + i] != value_of(g->members[j], i);
  CHECK(bad == 0, "all_gather over %s: %d wrong elements", name, bad);
  check_ring_traffic(c, kind, XM_RT_PHASE_ALL_GATHER, n, (int64_t)P * (P - 1) * n * 4);
  memset(b, 0, (size_t)(P * n) * sizeof(float));
  for (int64_t i = 0; i < n; i++)
    b[g->index * n + i] = value_of(r, i);
  CHECK(xm_rt_comm_all_gather(c, kind, b + g->index * n, n, b) == XM_OK, "in place");
  bad = 0;
  for (int j = 0; j < P; j++)
    for (int64_t i = 0; i < n; i++)
      bad += b[j * n + i] != value_of(g->members[j], i);
  CHECK(bad == 0, "in-place all_gather over %s: %d wrong elements", name, bad);

  xm_rt_comm_traffic_reset(c);
  for (int64_t k = 0; k < P * n; k++)
    a[k] = value_of(r, k);
  CHECK(xm_rt_comm_reduce_scatter(c, kind, a, n, b) == XM_OK, "reduce_scatter over %s", name);
  bad = 0;
  for (int64_t i = 0; i < n; i++) {
    float want = 0;
    for (int j = 0; j < P; j++)
      want += value_of(g->members[j], g->index * n + i);
    bad += b[i] != want;
  }
  CHECK(bad == 0, "reduce_scatter over %s: %d wrong elements", name, bad);
  check_ring_traffic(c, kind, XM_RT_PHASE_REDUCE_SCATTER, n, (int64_t)P * (P - 1) * n * 4);
  xm_rt_comm_traffic_reset(c);
  free(a);
  free(b);
}

/* ---- all-to-all ---- */

typedef struct {
  int64_t counts[64]; /* send counts by destination index */
  int64_t total;
  float *rows;
} a2a_send_t;

static a2a_send_t make_send(const xm_rt_comm_group_t *g, int src, uint32_t seed, int64_t W,
                            int only_to /* -1: everyone */) {
  a2a_send_t s = {{0}, 0, NULL};
  for (int d = 0; d < g->size; d++) {
    s.counts[d] = only_to < 0 || d == only_to ? a_count(seed, src, d) + (only_to >= 0) : 0;
    if (seed == 0) s.counts[d] = 0;
    s.total += s.counts[d];
  }
  s.rows = s.total ? malloc((size_t)(s.total * W) * sizeof(float)) : NULL;
  int64_t off = 0;
  for (int d = 0; d < g->size; d++)
    for (int64_t row = 0; row < s.counts[d]; row++, off++)
      for (int64_t e = 0; e < W; e++)
        s.rows[off * W + e] = row_value(src, d, row, e);
  return s;
}

/* What this rank receives from member j under make_send's rule. */
static int64_t expect_count(const xm_rt_comm_group_t *g, int j, uint32_t seed, int only_to) {
  if (seed == 0) return 0;
  if (only_to >= 0) return g->index == only_to ? a_count(seed, g->members[j], only_to) + 1 : 0;
  return a_count(seed, g->members[j], g->index);
}

static void check_a2a_case(xm_rt_comm_t *c, xm_rt_group_kind_t kind, uint32_t seed, int only_to,
                           const char *label) {
  const xm_rt_comm_group_t *g = xm_rt_comm_group(c, kind);
  const int64_t W = 3;
  int r = c->ctx->rank, P = g->size;
  a2a_send_t s = make_send(g, r, seed, W, only_to);
  int64_t want_total = 0;
  for (int j = 0; j < P; j++)
    want_total += expect_count(g, j, seed, only_to);
  float *recv = want_total ? calloc((size_t)(want_total * W), sizeof(float)) : NULL;
  int64_t counts[64], offsets[64], total = -1;
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_rt_comm_traffic_reset(c);
  xm_rt_a2a_t rows = {XM_RT_PHASE_DISPATCH, 2, W};
  xm_status_t st = xm_rt_comm_all_to_all_v(c, kind, rows, s.rows, s.counts, recv, want_total, &diag,
                                           counts, offsets, &total);
  CHECK(st == XM_OK, "%s over %s: status %d", label, xm_rt_group_name(kind), (int)st);
  CHECK_I64(label, total, want_total);
  int64_t off = 0;
  int bad = 0;
  for (int j = 0; j < P && st == XM_OK; j++) {
    int64_t n = expect_count(g, j, seed, only_to);
    CHECK(counts[j] == n && offsets[j] == off, "%s: from member %d: %lld rows at %lld", label, j,
          (long long)counts[j], (long long)offsets[j]);
    int dst = only_to >= 0 ? only_to : g->index;
    for (int64_t row = 0; row < n; row++)
      for (int64_t e = 0; e < W; e++)
        bad += recv[(off + row) * W + e] != row_value(g->members[j], dst, row, e);
    off += n;
  }
  CHECK(bad == 0, "%s over %s: %d wrong elements", label, xm_rt_group_name(kind), bad);
  /* Exact bytes per peer; self excluded; nothing in other phases. */
  for (int j = 0; j < P; j++) {
    int64_t want = j == g->index ? 0 : s.counts[j] * W * 4;
    CHECK_I64("dispatch bytes to a peer",
              xm_rt_comm_traffic_sent(c, XM_RT_PHASE_DISPATCH, g->members[j]), want);
  }
  xm_rt_traffic_totals_t t;
  xm_rt_comm_traffic_local(c, &t);
  int64_t intra = 0, inter = 0;
  for (int j = 0; j < P; j++) {
    if (j == g->index) continue;
    if (xm_rt_comm_node_of(c, g->members[j]) == c->ctx->node)
      intra += s.counts[j] * W * 4;
    else
      inter += s.counts[j] * W * 4;
  }
  CHECK_I64("dispatch intra", t.intra[XM_RT_PHASE_DISPATCH], intra);
  CHECK_I64("dispatch inter", t.inter[XM_RT_PHASE_DISPATCH], inter);
  CHECK_I64("all intra", t.intra_total, intra);
  CHECK_I64("all inter", t.inter_total, inter);

  /* The combine: the mirror exchange returns every row to its sender. */
  if (st == XM_OK) {
    float *back = s.total ? calloc((size_t)(s.total * W), sizeof(float)) : NULL;
    xm_rt_a2a_t comb = {XM_RT_PHASE_COMBINE, 2, W};
    st = xm_rt_comm_all_to_all_v_known(c, kind, comb, recv, counts, back, s.counts);
    CHECK(st == XM_OK, "combine status");
    CHECK(s.total == 0 || memcmp(back, s.rows, (size_t)(s.total * W) * sizeof(float)) == 0,
          "%s: combine did not return the rows", label);
    for (int j = 0; j < P; j++)
      CHECK_I64("combine bytes", xm_rt_comm_traffic_sent(c, XM_RT_PHASE_COMBINE, g->members[j]),
                j == g->index ? 0 : counts[j] * W * 4);
    free(back);
  }
  xm_rt_comm_traffic_reset(c);
  xm_diag_free(&diag);
  free(recv);
  free(s.rows);
}

/* Member 1 (or 0 in a group of 1) gets a buffer one row too small: every
 * member fails alike, nothing lands past the capacity, and the group still
 * works afterwards. */
static void check_a2a_overflow(xm_rt_comm_t *c, xm_rt_group_kind_t kind) {
  const xm_rt_comm_group_t *g = xm_rt_comm_group(c, kind);
  const int64_t W = 2, guard = 8;
  int P = g->size, victim = P > 1 ? 1 : 0;
  int64_t send_counts[64];
  float *send = malloc((size_t)(2 * P * W) * sizeof(float));
  for (int j = 0; j < P; j++)
    send_counts[j] = 2;
  for (int64_t k = 0; k < 2 * P * W; k++)
    send[k] = 1.0f;
  int64_t incoming = 2 * (int64_t)P, cap = g->index == victim ? incoming - 1 : incoming;
  float *recv = malloc((size_t)((cap + guard) * W) * sizeof(float));
  for (int64_t k = 0; k < (cap + guard) * W; k++)
    recv[k] = -7.0f;
  xm_diag_t diag;
  xm_diag_init(&diag);
  int64_t counts[64], total = -1;
  xm_rt_a2a_t rows = {XM_RT_PHASE_DISPATCH, 0, W};
  xm_status_t st = xm_rt_comm_all_to_all_v(c, kind, rows, send, send_counts, recv, cap, &diag,
                                           counts, NULL, &total);
  CHECK(st == XM_ERR_NO_MEMORY, "overflow over %s: status %d", xm_rt_group_name(kind), (int)st);
  CHECK_I64("observed rows", total, incoming);
  int touched = 0;
  for (int64_t k = 0; k < (cap + guard) * W; k++)
    touched += recv[k] != -7.0f;
  CHECK(touched == 0, "overflow over %s: %d elements written", xm_rt_group_name(kind), touched);
  char want[128];
  snprintf(want, sizeof want, "rank %d would receive %lld rows", g->members[victim],
           (long long)incoming);
  CHECK(diag.count == 1 && strstr(diag.entries[0].message, want),
        "overflow message: %s (want '%s')", diag.count ? diag.entries[0].message : "(none)", want);
  char holds[96];
  snprintf(holds, sizeof holds, "its receive buffer holds %lld rows", (long long)cap);
  CHECK(g->index != victim || (diag.count == 1 && strstr(diag.entries[0].message, holds)),
        "the overflowing rank names its capacity: want '%s'", holds);
  xm_diag_free(&diag);
  /* The group is not left in a broken state: the same exchange with room. */
  float *room = malloc((size_t)(incoming * W) * sizeof(float));
  st = xm_rt_comm_all_to_all_v(c, kind, rows, send, send_counts, room, incoming, NULL, counts, NULL,
                               &total);
  CHECK(st == XM_OK && total == incoming, "exchange after an overflow: %d, %lld rows", (int)st,
        (long long)total);
  xm_rt_comm_traffic_reset(c);
  free(room);
  free(recv);
  free(send);
}

/* int32 rows: (source, destination, row) triples of metadata. */
static void check_a2a_i32(xm_rt_comm_t *c, xm_rt_group_kind_t kind, uint32_t seed) {
  const xm_rt_comm_group_t *g = xm_rt_comm_group(c, kind);
  int P = g->size, r = c->ctx->rank;
  int64_t counts[64], total_send = 0, want_total = 0;
  for (int d = 0; d < P; d++)
    total_send += counts[d] = a_count(seed, r, d);
  for (int j = 0; j < P; j++)
    want_total += a_count(seed, g->members[j], g->index);
  int32_t *send = malloc((size_t)(total_send * 3 + 1) * sizeof(int32_t));
  int32_t *recv = malloc((size_t)(want_total * 3 + 1) * sizeof(int32_t));
  int64_t off = 0;
  for (int d = 0; d < P; d++)
    for (int64_t row = 0; row < counts[d]; row++, off++) {
      send[off * 3] = r, send[off * 3 + 1] = d, send[off * 3 + 2] = (int32_t)row;
    }
  int64_t rc[64], ro[64], total = -1;
  xm_rt_a2a_t rows = {XM_RT_PHASE_OTHER, -1, 3};
  xm_rt_comm_traffic_reset(c);
  xm_status_t st = xm_rt_comm_all_to_all_v_i32(c, kind, rows, send, counts, recv, want_total, NULL,
                                               rc, ro, &total);
  CHECK(st == XM_OK && total == want_total, "i32 over %s: %d, %lld rows", xm_rt_group_name(kind),
        (int)st, (long long)total);
  int bad = 0;
  for (int j = 0; j < P && st == XM_OK; j++)
    for (int64_t row = 0; row < rc[j]; row++) {
      const int32_t *x = recv + (ro[j] + row) * 3;
      bad += x[0] != g->members[j] || x[1] != g->index || x[2] != row;
    }
  CHECK(bad == 0, "i32 over %s: %d wrong rows", xm_rt_group_name(kind), bad);
  for (int j = 0; j < P; j++)
    CHECK_I64("i32 bytes", xm_rt_comm_traffic_sent(c, XM_RT_PHASE_OTHER, g->members[j]),
              j == g->index ? 0 : counts[j] * 12);
  xm_rt_comm_traffic_reset(c);
  free(send);
  free(recv);
}

static void check_all_a2a(xm_rt_comm_t *c, xm_rt_group_kind_t kind) {
  check_a2a_case(c, kind, 12345u, -1, "random counts");
  check_a2a_case(c, kind, 777u, -1, "random counts (second seed)");
  check_a2a_case(c, kind, 0u, -1, "all-zero counts");
  check_a2a_case(c, kind, 99u, 0, "everything to member 0");
  check_a2a_overflow(c, kind);
  check_a2a_i32(c, kind, 4242u);
}

/* Every check of one layout on every group. */
static void check_layout_all(const xm_rt_context_t *ctx, int dp, int tp, int ep) {
  xm_rt_comm_layout_t l = {dp, tp, ep, 0, 0};
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_rt_comm_t *c = NULL;
  xm_status_t st = xm_rt_comm_create(ctx, &l, &diag, &c);
  CHECK(st == XM_OK, "create dp%d tp%d ep%d: %s", dp, tp, ep,
        diag.count ? diag.entries[0].message : "");
  xm_diag_free(&diag);
  if (st != XM_OK) return;
  for (int k = 0; k < XM_RT_GROUP_COUNT; k++) {
    check_group_mpi(c, k_all_groups[k]);
    check_collectives(c, k_all_groups[k]);
    check_all_a2a(c, k_all_groups[k]);
  }
  xm_rt_comm_destroy(c);
}


#endif /* XM_TESTS_COMM_CHECKS_H */
