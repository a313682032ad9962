/* runtime/comm/spmd.c — the collectives of a generated multi-rank schedule
 * (runtime/comm/spmd.h) on top of the communicator (runtime/comm/comm.h).
 *
 * The generated program knows group kinds, element counts and arena
 * pointers; the communicator knows MPI. This file is the adapter: it maps
 * the program's view (send counts per (member, local expert), ZeRO-1 chunks
 * of a flattened tensor, a narrow of the leading dim) onto the
 * communicator's collectives, and turns every failure into xm_rt_fail, so
 * generated code never checks a status. Without a communicator (x->comm
 * NULL: a single-rank run, the gradient-check harness) every group has one
 * member with index 0 and each collective is a copy, which keeps the same
 * generated code valid on one rank.
 *
 * Failures. Arguments that are wrong on one rank (a group that does not
 * exist, negative counts, sizes past MPI's int counts) end every rank
 * through xm_rt_fail (MPI_Abort underneath), as the communicator does for
 * its own caller bugs, so no peer is left blocked in a collective. The
 * all-to-all's receive bound is agreed on by the whole group inside the
 * communicator; every member then fails with the same message. Rows that
 * arrive in numbers other than the exchanged receive counts say that the
 * count exchange and the data exchange disagree: a bug, also fatal.
 *
 * Traffic (docs/traffic.md). The float collectives are accounted by the
 * communicator. What this file moves with MPI itself is accounted here with
 * the same ring model: the int32 all-reduce of the load counters as
 * all_reduce, the uneven ZeRO-1 reduce-scatter and gather as
 * reduce_scatter and all_gather with their real chunk sizes. The count
 * exchange of the expert all-to-all (exchange_counts: L int32 to every
 * other member) is accounted as `other`, attributed to its layer, so the
 * dispatch and combine phases hold only rows. The communicator's own
 * reductions take no layer, so all_reduce / all_gather traffic is never
 * attributed to a layer (the matrix file's `null` layer), whatever the
 * generated code passes.
 */
#include "runtime/comm/spmd.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm/comm.h"
#include "runtime/comm/stage.h"

/* ---- groups ---------------------------------------------------------------- */

static xm_rt_comm_t *comm_of(const xm_rt_exec_t *x) { return (xm_rt_comm_t *)x->comm; }

/* The group, or NULL on a run without a communicator (one member). */
static const xm_rt_comm_group_t *group_of(const xm_rt_exec_t *x, int group, const char *what) {
  if (group < 0 || group >= XM_RT_GROUP_COUNT)
    xm_rt_fail(x, "%s: %d is not a communication group", what, group);
  const xm_rt_comm_t *c = comm_of(x);
  return c ? xm_rt_comm_group(c, (xm_rt_group_kind_t)group) : NULL;
}

int64_t xm_rt_group_index(const xm_rt_exec_t *x, int group) {
  const xm_rt_comm_group_t *g = group_of(x, group, "group_index");
  return g ? g->index : 0;
}

int64_t xm_rt_group_size(const xm_rt_exec_t *x, int group) {
  const xm_rt_comm_group_t *g = group_of(x, group, "group_size");
  return g ? g->size : 1;
}

static void *alloc_or_fail(const xm_rt_exec_t *x, int64_t n, size_t size, const char *what) {
  void *p = n > 0 ? calloc((size_t)n, size) : NULL;
  if (n > 0 && !p) xm_rt_fail(x, "%s: out of memory for %lld entries", what, (long long)n);
  return p;
}

/* ---- staging through host memory (runtime/comm/stage.h) ------------------- */
static int staged(const xm_rt_exec_t *x) { return xm_rt_staged(x); }

static void *h_get(xm_rt_exec_t *x, const void *dev, size_t bytes, const char *what) {
  return xm_rt_stage_in(x, dev, (int64_t)bytes, 1, what);
}

static void h_put(xm_rt_exec_t *x, void *dev, const void *h, size_t bytes) {
  xm_rt_stage_out(x, dev, h, (int64_t)bytes, 1);
}

/* ---- the ring model of docs/traffic.md for what this file moves ----------- */

/* bytes of member g->index split over its two ring neighbours (half each
 * way; a group of 2 has one neighbour); the zero to self marks the call for
 * the per-layer matrix, as the communicator does. */
static void ring_traffic(xm_rt_comm_t *c, const xm_rt_comm_group_t *g, xm_rt_phase_t phase,
                         int layer, int64_t bytes) {
  xm_rt_comm_traffic_add(c, phase, layer, g->members[g->index], 0);
  if (g->size < 2 || bytes == 0) return;
  int succ = g->members[(g->index + 1) % g->size];
  int pred = g->members[(g->index + g->size - 1) % g->size];
  if (succ == pred) {
    xm_rt_comm_traffic_add(c, phase, layer, succ, bytes);
    return;
  }
  xm_rt_comm_traffic_add(c, phase, layer, succ, bytes / 2);
  xm_rt_comm_traffic_add(c, phase, layer, pred, bytes - bytes / 2);
}

/* ---- reductions and gathers --------------------------------------------------- */

static void host_all_reduce(xm_rt_exec_t *x, int group, int layer, const float *in, float *out,
                      int64_t n) {
  (void)layer; /* the communicator's reductions carry no layer */
  const xm_rt_comm_group_t *g = group_of(x, group, "all_reduce");
  if (n < 0 || (n > 0 && (!in || !out)))
    xm_rt_fail(x, "all_reduce: %lld elements at %p -> %p", (long long)n, (const void *)in,
               (void *)out);
  if (n > 0 && in != out) memmove(out, in, (size_t)n * sizeof(float));
  if (!g) return;
  xm_status_t st = xm_rt_comm_all_reduce(comm_of(x), (xm_rt_group_kind_t)group, out, n);
  if (st != XM_OK)
    xm_rt_fail(x, "all_reduce over the %s group: %s", xm_rt_group_name(g->kind),
               xm_status_name(st));
}

/* Ring all-reduce of n elements split into P near-equal chunks (comm.c's
 * model): member i sends all but its own chunk, then all but chunk i+1. */
static int64_t ring_all_reduce_elems(int64_t n, int P, int i) {
  if (P < 2) return 0;
  int64_t own = n / P + (i < n % P), next = n / P + ((i + 1) % P < n % P);
  return (n - own) + (n - next);
}

static void host_all_reduce_i32(xm_rt_exec_t *x, int group, int layer, int32_t *buf, int64_t n) {
  (void)layer; /* reductions are accounted without a layer, like the float ones */
  const xm_rt_comm_group_t *g = group_of(x, group, "all_reduce_i32");
  if (n < 0 || (n > 0 && !buf))
    xm_rt_fail(x, "all_reduce_i32: %lld elements at %p", (long long)n, (void *)buf);
  if (!g) return;
  xm_rt_comm_t *c = comm_of(x);
  ring_traffic(c, g, XM_RT_PHASE_ALL_REDUCE, -1,
               ring_all_reduce_elems(n, g->size, g->index) * (int64_t)sizeof(int32_t));
  if (n == 0 || g->size == 1) return;
  for (int64_t off = 0; off < n; off += INT_MAX) {
    int chunk = (int)(n - off < INT_MAX ? n - off : INT_MAX);
    MPI_Allreduce(MPI_IN_PLACE, buf + off, chunk, MPI_INT32_T, MPI_SUM, g->comm);
  }
}

typedef xm_status_t (*gather_like_fn)(xm_rt_comm_t *, xm_rt_group_kind_t, const float *, int64_t,
                                      float *);

/* all_gather and reduce_scatter: n elements per member in or out; one
 * member (no communicator) is a copy. */
static void gather_like(xm_rt_exec_t *x, int group, const char *what, gather_like_fn fn,
                        const float *in, float *out, int64_t n) {
  const xm_rt_comm_group_t *g = group_of(x, group, what);
  if (n < 0 || (n > 0 && (!in || !out)))
    xm_rt_fail(x, "%s: %lld elements at %p -> %p", what, (long long)n, (const void *)in,
               (void *)out);
  if (!g) {
    if (n > 0 && in != out) memmove(out, in, (size_t)n * sizeof(float));
    return;
  }
  if (n > INT_MAX)
    xm_rt_fail(x, "%s over the %s group: %lld elements per rank (at most %d)", what,
               xm_rt_group_name(g->kind), (long long)n, INT_MAX);
  xm_status_t st = fn(comm_of(x), (xm_rt_group_kind_t)group, in, n, out);
  if (st != XM_OK)
    xm_rt_fail(x, "%s over the %s group: %s", what, xm_rt_group_name(g->kind),
               xm_status_name(st));
}

static void host_all_gather(xm_rt_exec_t *x, int group, int layer, const float *in, float *out,
                      int64_t n) {
  (void)layer;
  gather_like(x, group, "all_gather", xm_rt_comm_all_gather, in, out, n);
}

static void host_reduce_scatter(xm_rt_exec_t *x, int group, int layer, const float *in, float *out,
                          int64_t n) {
  (void)layer;
  gather_like(x, group, "reduce_scatter", xm_rt_comm_reduce_scatter, in, out, n);
}

static void host_narrow(xm_rt_exec_t *x, int group, const void *in, void *out, int64_t n,
                  int64_t elem_bytes) {
  int64_t index = xm_rt_group_index(x, group);
  if (n < 0 || elem_bytes <= 0 || (n > 0 && (!in || !out)))
    xm_rt_fail(x, "narrow: %lld elements of %lld bytes at %p -> %p", (long long)n,
               (long long)elem_bytes, in, out);
  if (n == 0) return;
  const unsigned char *src = (const unsigned char *)in + index * n * elem_bytes;
  memmove(out, src, (size_t)(n * elem_bytes));
}

/* ---- the expert all-to-all ------------------------------------------------------ */

static void host_exchange_counts(xm_rt_exec_t *x, int group, int layer, const int32_t *send,
                           int32_t *recv, int32_t *tpe, int64_t L) {
  const xm_rt_comm_group_t *g = group_of(x, group, "exchange_counts");
  int64_t P = g ? g->size : 1;
  if (L < 1 || P * L > INT_MAX || !send || !recv || !tpe)
    xm_rt_fail(x, "exchange_counts: %lld local experts over %lld members", (long long)L,
               (long long)P);
  for (int64_t i = 0; i < P * L; i++)
    if (send[i] < 0)
      xm_rt_fail(x, "exchange_counts (layer %d): send count %d for member %lld, expert %lld", layer,
                 send[i], (long long)(i / L), (long long)(i % L));
  if (!g) {
    memmove(recv, send, (size_t)L * sizeof(int32_t));
  } else {
    xm_rt_comm_t *c = comm_of(x);
    MPI_Alltoall(send, (int)L, MPI_INT32_T, recv, (int)L, MPI_INT32_T, g->comm);
    for (int j = 0; j < g->size; j++)
      xm_rt_comm_traffic_add(c, XM_RT_PHASE_OTHER, layer, g->members[j],
                             j == g->index ? 0 : L * (int64_t)sizeof(int32_t));
  }
  for (int64_t l = 0; l < L; l++) {
    int64_t sum = 0;
    for (int64_t p = 0; p < P; p++)
      sum += recv[p * L + l];
    if (sum > INT32_MAX)
      xm_rt_fail(x, "exchange_counts (layer %d): %lld rows for local expert %lld", layer,
                 (long long)sum, (long long)l);
    tpe[l] = (int32_t)sum;
  }
}

/* Rows per member: the sums of each row of a [P, L] count matrix. */
static int64_t row_sums(const xm_rt_exec_t *x, const int32_t *counts, int64_t P, int64_t L,
                        int64_t *out, const char *what, int layer) {
  int64_t total = 0;
  for (int64_t p = 0; p < P; p++) {
    int64_t s = 0;
    for (int64_t l = 0; l < L; l++) {
      if (counts[p * L + l] < 0)
        xm_rt_fail(x, "all_to_all (layer %d): %s count %d for member %lld, expert %lld", layer,
                   what, counts[p * L + l], (long long)p, (long long)l);
      s += counts[p * L + l];
    }
    out[p] = s;
    total += s;
  }
  return total;
}

static int64_t host_all_to_all(xm_rt_exec_t *x, int group, int phase, int layer, const float *send,
                         const int32_t *send_counts, const int32_t *recv_counts, int64_t L,
                         int64_t width, float *recv, int64_t recv_bound) {
  const xm_rt_comm_group_t *g = group_of(x, group, "all_to_all");
  int64_t P = g ? g->size : 1;
  if (xm_rt_fault(x, "arena")) recv_bound = 0; /* tests: a plan too small for the routing */
  if (L < 1 || width < 1 || recv_bound < 0 || (unsigned)phase >= XM_RT_PHASE_COUNT ||
      !send_counts || !recv_counts)
    xm_rt_fail(x, "all_to_all (layer %d): %lld local experts, rows of %lld, bound %lld, phase %d",
               layer, (long long)L, (long long)width, (long long)recv_bound, phase);
  int64_t *sc = alloc_or_fail(x, 2 * P, sizeof(int64_t), "all_to_all");
  int64_t *want = sc + P;
  int64_t sent = row_sums(x, send_counts, P, L, sc, "send", layer);
  int64_t expect = row_sums(x, recv_counts, P, L, want, "receive", layer);
  int64_t got = 0;
  if (!g) {
    /* One member: the rows stay; the bound and the counts still hold. */
    if (sent > recv_bound)
      xm_rt_fail(x, "all_to_all (%s, layer %d): %lld rows, but the receive buffer holds %lld",
                 xm_rt_phase_name((xm_rt_phase_t)phase), layer, (long long)sent,
                 (long long)recv_bound);
    if (sent > 0) memmove(recv, send, (size_t)(sent * width) * sizeof(float));
    got = sent;
    if (got != expect)
      xm_rt_fail(x, "all_to_all (layer %d): %lld rows kept, but the receive counts say %lld", layer,
                 (long long)got, (long long)expect);
    free(sc);
    return got;
  }
  xm_rt_comm_t *c = comm_of(x);
  int64_t *rc = alloc_or_fail(x, P, sizeof(int64_t), "all_to_all");
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_rt_a2a_t rows = {(xm_rt_phase_t)phase, layer, width};
  xm_status_t st = xm_rt_comm_all_to_all_v(c, (xm_rt_group_kind_t)group, rows, send, sc, recv,
                                           recv_bound, &diag, rc, NULL, &got);
  if (st != XM_OK) {
    char msg[768];
    snprintf(msg, sizeof msg, "%s", diag.count ? diag.entries[0].message : xm_status_name(st));
    xm_diag_free(&diag);
    free(rc);
    free(sc);
    xm_rt_fail(x, "%s%s", msg,
               st == XM_ERR_NO_MEMORY ? " (the memory plan reserves min(ep, B) times the rows a "
                                        "rank sends; recompile with a larger xmoec compile "
                                        "--dispatch-bound B)"
                                      : "");
  }
  xm_diag_free(&diag);
  for (int64_t p = 0; p < P; p++)
    if (rc[p] != want[p])
      xm_rt_fail(x,
                 "all_to_all (%s, layer %d) over the %s group: %lld rows arrived from member "
                 "%lld, but the exchanged counts say %lld",
                 xm_rt_phase_name((xm_rt_phase_t)phase), layer, xm_rt_group_name(g->kind),
                 (long long)rc[p], (long long)p, (long long)want[p]);
  if (got != expect)
    xm_rt_fail(x, "all_to_all (layer %d): %lld rows arrived, the receive counts sum to %lld", layer,
               (long long)got, (long long)expect);
  free(rc);
  free(sc);
  return got;
}

/* ---- ZeRO-1 chunks ---------------------------------------------------------------- */

/* Elements of member j's chunk of n: [j*c, min(n, (j+1)*c)), maybe empty. */
static int64_t chunk_len(int64_t n, int64_t c, int64_t j) {
  int64_t lo = j * c, hi = lo + c < n ? lo + c : n;
  return hi > lo ? hi - lo : 0;
}

/* MPI counts and displacements of the chunks of n over P members. */
static int *chunk_counts(const xm_rt_exec_t *x, int64_t n, int64_t P, const char *what) {
  if (n > INT_MAX)
    xm_rt_fail(x, "%s: %lld elements (at most %d per tensor)", what, (long long)n, INT_MAX);
  int *cnt = alloc_or_fail(x, 2 * P, sizeof(int), what);
  int64_t c = xm_rt_chunk(n, P);
  for (int64_t j = 0; j < P; j++) {
    cnt[j] = (int)chunk_len(n, c, j);
    cnt[P + j] = (int)(j * c < n ? j * c : n);
  }
  return cnt;
}

static void host_zero_reduce_scatter(xm_rt_exec_t *x, int group, const float *grad, int64_t n,
                               float *chunk) {
  const xm_rt_comm_group_t *g = group_of(x, group, "zero_reduce_scatter");
  int64_t P = g ? g->size : 1, i = g ? g->index : 0;
  if (n < 0 || (n > 0 && (!grad || !chunk)) || (grad && grad == chunk))
    xm_rt_fail(x, "zero_reduce_scatter: %lld elements at %p -> %p", (long long)n,
               (const void *)grad, (void *)chunk);
  int64_t c = xm_rt_chunk(n, P), own = chunk_len(n, c, i);
  if (!g || g->size == 1) {
    if (own > 0) memmove(chunk, grad, (size_t)own * sizeof(float));
  } else {
    int *cnt = chunk_counts(x, n, P, "zero_reduce_scatter");
    /* The reduce-scatter half of the ring: every chunk but its own. */
    ring_traffic(comm_of(x), g, XM_RT_PHASE_REDUCE_SCATTER, -1, (n - own) * (int64_t)sizeof(float));
    float dummy = 0.0f;
    MPI_Reduce_scatter(n > 0 ? grad : &dummy, own > 0 ? chunk : &dummy, cnt, MPI_FLOAT, MPI_SUM,
                       g->comm);
    free(cnt);
  }
  if (c > own) memset(chunk + own, 0, (size_t)(c - own) * sizeof(float));
}

static void host_zero_gather(xm_rt_exec_t *x, int group, float *param, int64_t n) {
  const xm_rt_comm_group_t *g = group_of(x, group, "zero_gather");
  if (n < 0 || (n > 0 && !param))
    xm_rt_fail(x, "zero_gather: %lld elements at %p", (long long)n, (void *)param);
  if (!g || g->size == 1) return;
  int64_t P = g->size, c = xm_rt_chunk(n, P);
  int *cnt = chunk_counts(x, n, P, "zero_gather");
  /* The all-gather half of the ring: every chunk but the successor's. */
  ring_traffic(comm_of(x), g, XM_RT_PHASE_ALL_GATHER, -1,
               (n - chunk_len(n, c, (g->index + 1) % P)) * (int64_t)sizeof(float));
  float dummy = 0.0f;
  MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, n > 0 ? param : &dummy, cnt, cnt + P,
                 MPI_FLOAT, g->comm);
  free(cnt);
}

/* ---- the entry points: host memory, or staged -------------------------------- */

static int64_t members(const xm_rt_exec_t *x, int group) { return xm_rt_group_size(x, group); }

void xm_rt_all_reduce(xm_rt_exec_t *x, int group, int layer, const float *in, float *out,
                      int64_t n) {
  if (!staged(x) || n <= 0) {
    if (staged(x)) host_all_reduce(x, group, layer, NULL, NULL, 0);
    else host_all_reduce(x, group, layer, in, out, n);
    return;
  }
  size_t b = (size_t)n * sizeof(float);
  float *h = h_get(x, in, b, "all_reduce");
  host_all_reduce(x, group, layer, h, h, n);
  h_put(x, out, h, b);
  free(h);
}

void xm_rt_all_reduce_i32(xm_rt_exec_t *x, int group, int layer, int32_t *buf, int64_t n) {
  if (!staged(x) || n <= 0) {
    host_all_reduce_i32(x, group, layer, staged(x) ? NULL : buf, staged(x) ? 0 : n);
    return;
  }
  size_t b = (size_t)n * sizeof(int32_t);
  int32_t *h = h_get(x, buf, b, "all_reduce_i32");
  host_all_reduce_i32(x, group, layer, h, n);
  h_put(x, buf, h, b);
  free(h);
}

void xm_rt_all_gather(xm_rt_exec_t *x, int group, int layer, const float *in, float *out,
                      int64_t n) {
  if (!staged(x) || n <= 0) {
    host_all_gather(x, group, layer, staged(x) ? NULL : in, staged(x) ? NULL : out,
                    staged(x) ? 0 : n);
    return;
  }
  size_t b = (size_t)n * sizeof(float), P = (size_t)members(x, group);
  float *hi = h_get(x, in, b, "all_gather"), *ho = h_get(x, NULL, b * P, "all_gather");
  host_all_gather(x, group, layer, hi, ho, n);
  h_put(x, out, ho, b * P);
  free(hi);
  free(ho);
}

void xm_rt_reduce_scatter(xm_rt_exec_t *x, int group, int layer, const float *in, float *out,
                          int64_t n) {
  if (!staged(x) || n <= 0) {
    host_reduce_scatter(x, group, layer, staged(x) ? NULL : in, staged(x) ? NULL : out,
                        staged(x) ? 0 : n);
    return;
  }
  size_t b = (size_t)n * sizeof(float), P = (size_t)members(x, group);
  float *hi = h_get(x, in, b * P, "reduce_scatter"), *ho = h_get(x, NULL, b, "reduce_scatter");
  host_reduce_scatter(x, group, layer, hi, ho, n);
  h_put(x, out, ho, b);
  free(hi);
  free(ho);
}

void xm_rt_narrow(xm_rt_exec_t *x, int group, const void *in, void *out, int64_t n,
                  int64_t elem_bytes) {
  if (!staged(x)) {
    host_narrow(x, group, in, out, n, elem_bytes);
    return;
  }
  int64_t index = xm_rt_group_index(x, group);
  if (n < 0 || elem_bytes <= 0 || (n > 0 && (!in || !out)))
    xm_rt_fail(x, "narrow: %lld elements of %lld bytes at %p -> %p", (long long)n,
               (long long)elem_bytes, in, out);
  if (n > 0)
    x->be->copy_d2d(x->be, out, (const unsigned char *)in + index * n * elem_bytes,
                    (size_t)(n * elem_bytes), x->stream);
}

void xm_rt_exchange_counts(xm_rt_exec_t *x, int group, int layer, const int32_t *send,
                           int32_t *recv, int32_t *tpe, int64_t L) {
  if (!staged(x) || L < 1 || !send || !recv || !tpe) {
    host_exchange_counts(x, group, layer, send, recv, tpe, L);
    return;
  }
  size_t b = (size_t)(members(x, group) * L) * sizeof(int32_t), bl = (size_t)L * sizeof(int32_t);
  int32_t *hs = h_get(x, send, b, "exchange_counts"), *hr = h_get(x, NULL, b, "exchange_counts");
  int32_t *ht = h_get(x, NULL, bl, "exchange_counts");
  host_exchange_counts(x, group, layer, hs, hr, ht, L);
  h_put(x, recv, hr, b);
  h_put(x, tpe, ht, bl);
  free(hs);
  free(hr);
  free(ht);
}

int64_t xm_rt_all_to_all(xm_rt_exec_t *x, int group, int phase, int layer, const float *send,
                         const int32_t *send_counts, const int32_t *recv_counts, int64_t L,
                         int64_t width, float *recv, int64_t recv_bound) {
  if (!staged(x) || L < 1 || width < 1 || recv_bound < 0 || !send_counts || !recv_counts)
    return host_all_to_all(x, group, phase, layer, send, send_counts, recv_counts, L, width, recv,
                           recv_bound);
  int64_t P = members(x, group);
  size_t bc = (size_t)(P * L) * sizeof(int32_t);
  int32_t *hsc = h_get(x, send_counts, bc, "all_to_all");
  int32_t *hrc = h_get(x, recv_counts, bc, "all_to_all");
  int64_t sent = 0;
  for (int64_t i = 0; i < P * L; i++) sent += hsc[i] > 0 ? hsc[i] : 0;
  size_t bs = (size_t)(sent * width) * sizeof(float), br = (size_t)(recv_bound * width) * sizeof(float);
  float *hs = h_get(x, sent ? send : NULL, bs, "all_to_all");
  float *hr = h_get(x, NULL, br, "all_to_all");
  int64_t got = host_all_to_all(x, group, phase, layer, hs, hsc, hrc, L, width, hr, recv_bound);
  h_put(x, recv, hr, (size_t)(got * width) * sizeof(float));
  free(hsc);
  free(hrc);
  free(hs);
  free(hr);
  return got;
}

void xm_rt_zero_reduce_scatter(xm_rt_exec_t *x, int group, const float *grad, int64_t n,
                               float *chunk) {
  if (!staged(x) || n <= 0 || !grad || !chunk || grad == chunk) {
    host_zero_reduce_scatter(x, group, grad, n, chunk);
    return;
  }
  int64_t c = xm_rt_chunk(n, members(x, group));
  float *hg = h_get(x, grad, (size_t)n * sizeof(float), "zero_reduce_scatter");
  float *hc = h_get(x, NULL, (size_t)c * sizeof(float), "zero_reduce_scatter");
  host_zero_reduce_scatter(x, group, hg, n, hc);
  h_put(x, chunk, hc, (size_t)c * sizeof(float));
  free(hg);
  free(hc);
}

void xm_rt_zero_gather(xm_rt_exec_t *x, int group, float *param, int64_t n) {
  if (!staged(x) || n <= 0 || !param) {
    host_zero_gather(x, group, param, n);
    return;
  }
  float *h = h_get(x, param, (size_t)n * sizeof(float), "zero_gather");
  host_zero_gather(x, group, h, n);
  h_put(x, param, h, (size_t)n * sizeof(float));
  free(h);
}
