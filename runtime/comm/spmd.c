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
 * Transports (runtime/comm/transport.h). Each collective checks its
 * arguments once, then moves the data one of four ways: on host memory
 * through MPI (a host-visible backend); staged through host buffers
 * (runtime/comm/stage.h) and then the same; through MPI on device memory
 * (GPU-aware MPI: the same host code with `dev` set, so its own copies and
 * fills go through the backend and the stream is synchronised before MPI
 * touches the buffers); or through NCCL/RCCL, queued on the exec's stream.
 * What needs the host (the count exchange of the expert all-to-all, the
 * bound agreement, the tokens-per-expert sums) stays on the host path with
 * the counts staged, whatever the transport.
 *
 * Failures. Arguments that are wrong on one rank (a group that does not
 * exist, negative counts, sizes past MPI's int counts) end every rank
 * through xm_rt_fail (MPI_Abort underneath), as the communicator does for
 * its own caller bugs, so no peer is left blocked in a collective. The
 * all-to-all's receive bound is agreed on by the whole group inside the
 * communicator; every member then fails with the same message. Rows that
 * arrive in numbers other than the exchanged receive counts say that the
 * count exchange and the data exchange disagree: a bug, also fatal. The
 * size limits are the same on every transport (an NCCL run refuses what an
 * MPI run would), so a program does not fail on one and pass on another.
 *
 * Traffic (docs/traffic.md). The float collectives are accounted by the
 * communicator. What this file moves with MPI itself is accounted here with
 * the communicator's byte models (xm_rt_comm_model_*): the int32 all-reduce
 * of the load counters as all_reduce, the uneven ZeRO-1 reduce-scatter and
 * gather as reduce_scatter and all_gather with their real chunk sizes. The
 * NCCL path calls the same models, so the counters do not depend on the
 * transport. The count exchange of the expert all-to-all (exchange_counts:
 * L int32 to every other member) is accounted as `other`, attributed to
 * its layer, so the dispatch and combine phases hold only rows. The
 * communicator's own reductions take no layer, so all_reduce / all_gather
 * traffic is never attributed to a layer (the matrix file's `null` layer),
 * whatever the generated code passes.
 */
#include "runtime/comm/spmd.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm/comm.h"
#include "runtime/comm/stage.h"
#include "runtime/comm/transport.h"

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

/* ---- the transport of this exec ------------------------------------------ */

typedef enum { PATH_HOST, PATH_STAGED, PATH_MPI, PATH_NCCL } path_t;

static xm_rt_transport_t *transport_of(const xm_rt_exec_t *x) {
  xm_rt_comm_t *c = comm_of(x);
  return c ? c->transport : NULL;
}

static path_t path_of(const xm_rt_exec_t *x) {
  if (!xm_rt_staged(x)) return PATH_HOST;
  const xm_rt_transport_t *t = transport_of(x);
  if (t && t->kind == XM_RT_XPORT_NCCL) return PATH_NCCL;
  if (t && t->kind == XM_RT_XPORT_MPI) return PATH_MPI;
  return PATH_STAGED;
}

/* ---- memory the host code touches: host (dev 0) or device (dev 1) --------- */

static void m_copy(xm_rt_exec_t *x, int dev, void *dst, const void *src, size_t bytes) {
  if (!bytes || dst == src) return;
  if (dev)
    x->be->copy_d2d(x->be, dst, src, bytes, x->stream);
  else
    memmove(dst, src, bytes);
}

static void m_zero(xm_rt_exec_t *x, int dev, void *dst, size_t bytes) {
  if (!bytes) return;
  if (dev)
    x->be->fill32(x->be, dst, 0u, bytes / 4u, x->stream);
  else
    memset(dst, 0, bytes);
}

/* Before MPI reads or writes device memory: the kernels and copies queued
 * before it are done. MPI's calls block, so what it writes is in place for
 * whatever the stream runs next. */
static void m_ready(xm_rt_exec_t *x, int dev) {
  if (dev) x->be->sync(x->be, x->stream);
}

/* ---- staging through host memory (runtime/comm/stage.h) ------------------- */

static void *h_get(xm_rt_exec_t *x, int slot, const void *dev, size_t bytes, const char *what) {
  return xm_rt_stage_get(x, xm_rt_transport_stage(comm_of(x)), slot, dev, bytes, what);
}

static void h_put(xm_rt_exec_t *x, void *dev, const void *h, size_t bytes) {
  xm_rt_stage_put(x, dev, h, bytes);
}

static void h_done(xm_rt_exec_t *x, void *h) {
  xm_rt_stage_done(xm_rt_transport_stage(comm_of(x)), h);
}

/* Two int32 count arrays of n entries to host, in slot 0: one buffer, two
 * copies, one synchronisation. */
static int32_t *counts_to_host(xm_rt_exec_t *x, const int32_t *a, const int32_t *b, int64_t n,
                               const char *what) {
  size_t bytes = (size_t)n * sizeof(int32_t);
  int32_t *h = h_get(x, 0, NULL, 2 * bytes, what);
  if (bytes) {
    x->be->copy_d2h(x->be, h, a, bytes, x->stream);
    x->be->copy_d2h(x->be, h + n, b, bytes, x->stream);
  }
  x->be->sync(x->be, x->stream);
  return h;
}

/* ---- NCCL ------------------------------------------------------------------ */

static const xm_nccl_lib_t *nccl_lib(const xm_rt_exec_t *x) { return &transport_of(x)->nccl; }

static xm_nccl_comm_t nccl_comm(const xm_rt_exec_t *x, const xm_rt_comm_group_t *g) {
  return transport_of(x)->nccl_comm[g->kind];
}

/* The native stream (runtime/gpu/backend_gpu.h): NCCL's work is ordered
 * with the schedule's kernels by being queued on the same stream. */
static void *nccl_stream(const xm_rt_exec_t *x, const char *what) {
  if (!x->stream) xm_rt_fail(x, "%s: the NCCL transport needs the exec's stream", what);
  return (void *)x->stream;
}

static void nccl_check(const xm_rt_exec_t *x, xm_nccl_result_t r, const char *what,
                       const xm_rt_comm_group_t *g, const char *call) {
  if (r != XM_NCCL_SUCCESS)
    xm_rt_fail(x, "%s over the %s group: %s: %s", what, xm_rt_group_name(g->kind), call,
               xm_nccl_error(nccl_lib(x), r));
}

/* ---- all_reduce ---------------------------------------------------------------- */

/* Host memory, or device memory for a GPU-aware MPI. */
static void mpi_all_reduce(xm_rt_exec_t *x, int dev, const xm_rt_comm_group_t *g, const float *in,
                           float *out, int64_t n) {
  m_copy(x, dev, out, in, (size_t)n * sizeof(float));
  if (!g) return;
  m_ready(x, dev);
  xm_status_t st = xm_rt_comm_all_reduce(comm_of(x), g->kind, out, n);
  if (st != XM_OK)
    xm_rt_fail(x, "all_reduce over the %s group: %s", xm_rt_group_name(g->kind),
               xm_status_name(st));
}

void xm_rt_all_reduce(xm_rt_exec_t *x, int group, int layer, const float *in, float *out,
                      int64_t n) {
  (void)layer; /* the communicator's reductions carry no layer */
  const xm_rt_comm_group_t *g = group_of(x, group, "all_reduce");
  if (n < 0 || (n > 0 && (!in || !out)))
    xm_rt_fail(x, "all_reduce: %lld elements at %p -> %p", (long long)n, (const void *)in,
               (void *)out);
  size_t b = (size_t)n * sizeof(float);
  switch (path_of(x)) {
  case PATH_HOST: mpi_all_reduce(x, 0, g, in, out, n); return;
  case PATH_MPI: mpi_all_reduce(x, 1, g, in, out, n); return;
  case PATH_NCCL:
    xm_rt_comm_model_all_reduce(comm_of(x), g->kind, n, (int64_t)sizeof(float));
    if (n == 0) return;
    if (g->size == 1) {
      m_copy(x, 1, out, in, b);
      return;
    }
    nccl_check(x,
               nccl_lib(x)->all_reduce(in, out, (size_t)n, XM_NCCL_FLOAT32, XM_NCCL_SUM,
                                       nccl_comm(x, g), nccl_stream(x, "all_reduce")),
               "all_reduce", g, "ncclAllReduce");
    return;
  case PATH_STAGED:
    if (n == 0) {
      mpi_all_reduce(x, 0, g, NULL, NULL, 0);
      return;
    }
    float *h = h_get(x, 0, in, b, "all_reduce");
    mpi_all_reduce(x, 0, g, h, h, n);
    h_put(x, out, h, b);
    h_done(x, h);
    return;
  }
}

static void mpi_all_reduce_i32(xm_rt_exec_t *x, int dev, const xm_rt_comm_group_t *g, int32_t *buf,
                               int64_t n) {
  if (!g) return;
  xm_rt_comm_model_all_reduce(comm_of(x), g->kind, n, (int64_t)sizeof(int32_t));
  if (n == 0 || g->size == 1) return;
  m_ready(x, dev);
  for (int64_t off = 0; off < n; off += INT_MAX) {
    int chunk = (int)(n - off < INT_MAX ? n - off : INT_MAX);
    MPI_Allreduce(MPI_IN_PLACE, buf + off, chunk, MPI_INT32_T, MPI_SUM, g->comm);
  }
}

void xm_rt_all_reduce_i32(xm_rt_exec_t *x, int group, int layer, int32_t *buf, int64_t n) {
  (void)layer; /* reductions are accounted without a layer, like the float ones */
  const xm_rt_comm_group_t *g = group_of(x, group, "all_reduce_i32");
  if (n < 0 || (n > 0 && !buf))
    xm_rt_fail(x, "all_reduce_i32: %lld elements at %p", (long long)n, (void *)buf);
  size_t b = (size_t)n * sizeof(int32_t);
  switch (path_of(x)) {
  case PATH_HOST: mpi_all_reduce_i32(x, 0, g, buf, n); return;
  case PATH_MPI: mpi_all_reduce_i32(x, 1, g, buf, n); return;
  case PATH_NCCL:
    xm_rt_comm_model_all_reduce(comm_of(x), g->kind, n, (int64_t)sizeof(int32_t));
    if (n == 0 || g->size == 1) return;
    nccl_check(x,
               nccl_lib(x)->all_reduce(buf, buf, (size_t)n, XM_NCCL_INT32, XM_NCCL_SUM,
                                       nccl_comm(x, g), nccl_stream(x, "all_reduce_i32")),
               "all_reduce_i32", g, "ncclAllReduce");
    return;
  case PATH_STAGED:
    if (n == 0) {
      mpi_all_reduce_i32(x, 0, g, NULL, 0);
      return;
    }
    int32_t *h = h_get(x, 0, buf, b, "all_reduce_i32");
    mpi_all_reduce_i32(x, 0, g, h, n);
    h_put(x, buf, h, b);
    h_done(x, h);
    return;
  }
}

/* ---- all_gather and reduce_scatter ------------------------------------------------ */

/* n elements per member in (all_gather) or out (reduce_scatter). */
typedef enum { GATHER, SCATTER } gather_kind_t;

static const char *gather_name(gather_kind_t k) {
  return k == GATHER ? "all_gather" : "reduce_scatter";
}

/* Host memory, or device memory for a GPU-aware MPI; one member (no
 * communicator) is a copy. */
static void mpi_gather_like(xm_rt_exec_t *x, int dev, gather_kind_t k, const xm_rt_comm_group_t *g,
                            const float *in, float *out, int64_t n) {
  if (!g) {
    m_copy(x, dev, out, in, (size_t)n * sizeof(float));
    return;
  }
  if (dev && g->size == 1) {
    /* The communicator copies a lone member's data with memmove; give it
     * the copy already made (in == out moves nothing). */
    m_copy(x, dev, out, in, (size_t)n * sizeof(float));
    in = out;
  }
  m_ready(x, dev);
  xm_status_t st = k == GATHER ? xm_rt_comm_all_gather(comm_of(x), g->kind, in, n, out)
                               : xm_rt_comm_reduce_scatter(comm_of(x), g->kind, in, n, out);
  if (st != XM_OK)
    xm_rt_fail(x, "%s over the %s group: %s", gather_name(k), xm_rt_group_name(g->kind),
               xm_status_name(st));
}

static void nccl_gather_like(xm_rt_exec_t *x, gather_kind_t k, const xm_rt_comm_group_t *g,
                             const float *in, float *out, int64_t n) {
  if (k == GATHER)
    xm_rt_comm_model_all_gather(comm_of(x), g->kind, n);
  else
    xm_rt_comm_model_reduce_scatter(comm_of(x), g->kind, n);
  if (n == 0) return;
  if (g->size == 1) {
    m_copy(x, 1, out, in, (size_t)n * sizeof(float));
    return;
  }
  const xm_nccl_lib_t *lib = nccl_lib(x);
  void *s = nccl_stream(x, gather_name(k));
  if (k == GATHER)
    nccl_check(x, lib->all_gather(in, out, (size_t)n, XM_NCCL_FLOAT32, nccl_comm(x, g), s),
               "all_gather", g, "ncclAllGather");
  else
    nccl_check(
        x,
        lib->reduce_scatter(in, out, (size_t)n, XM_NCCL_FLOAT32, XM_NCCL_SUM, nccl_comm(x, g), s),
        "reduce_scatter", g, "ncclReduceScatter");
}

static void gather_like(xm_rt_exec_t *x, int group, gather_kind_t k, const float *in, float *out,
                        int64_t n) {
  const char *what = gather_name(k);
  const xm_rt_comm_group_t *g = group_of(x, group, what);
  if (n < 0 || (n > 0 && (!in || !out)))
    xm_rt_fail(x, "%s: %lld elements at %p -> %p", what, (long long)n, (const void *)in,
               (void *)out);
  if (g && n > INT_MAX)
    xm_rt_fail(x, "%s over the %s group: %lld elements per rank (at most %d)", what,
               xm_rt_group_name(g->kind), (long long)n, INT_MAX);
  switch (path_of(x)) {
  case PATH_HOST: mpi_gather_like(x, 0, k, g, in, out, n); return;
  case PATH_MPI: mpi_gather_like(x, 1, k, g, in, out, n); return;
  case PATH_NCCL: nccl_gather_like(x, k, g, in, out, n); return;
  case PATH_STAGED:
    if (n == 0) {
      mpi_gather_like(x, 0, k, g, NULL, NULL, 0);
      return;
    }
    size_t b = (size_t)n * sizeof(float), P = (size_t)(g ? g->size : 1);
    size_t bi = k == GATHER ? b : b * P, bo = k == GATHER ? b * P : b;
    float *hi = h_get(x, 0, in, bi, what), *ho = h_get(x, 1, NULL, bo, what);
    mpi_gather_like(x, 0, k, g, hi, ho, n);
    h_put(x, out, ho, bo);
    h_done(x, hi);
    h_done(x, ho);
    return;
  }
}

void xm_rt_all_gather(xm_rt_exec_t *x, int group, int layer, const float *in, float *out,
                      int64_t n) {
  (void)layer;
  gather_like(x, group, GATHER, in, out, n);
}

void xm_rt_reduce_scatter(xm_rt_exec_t *x, int group, int layer, const float *in, float *out,
                          int64_t n) {
  (void)layer;
  gather_like(x, group, SCATTER, in, out, n);
}

/* ---- narrow: no communication ------------------------------------------------------- */

void xm_rt_narrow(xm_rt_exec_t *x, int group, const void *in, void *out, int64_t n,
                  int64_t elem_bytes) {
  int64_t index = xm_rt_group_index(x, group);
  if (n < 0 || elem_bytes <= 0 || (n > 0 && (!in || !out)))
    xm_rt_fail(x, "narrow: %lld elements of %lld bytes at %p -> %p", (long long)n,
               (long long)elem_bytes, in, out);
  if (n == 0) return;
  m_copy(x, path_of(x) != PATH_HOST, out, (const unsigned char *)in + index * n * elem_bytes,
         (size_t)(n * elem_bytes));
}

/* ---- the expert all-to-all ------------------------------------------------------ */

/* On host memory: every transport stages the counts for it. */
static void host_exchange_counts(xm_rt_exec_t *x, const xm_rt_comm_group_t *g, int layer,
                                 const int32_t *send, int32_t *recv, int32_t *tpe, int64_t L) {
  int64_t P = g ? g->size : 1;
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

void xm_rt_exchange_counts(xm_rt_exec_t *x, int group, int layer, const int32_t *send,
                           int32_t *recv, int32_t *tpe, int64_t L) {
  const xm_rt_comm_group_t *g = group_of(x, group, "exchange_counts");
  int64_t P = g ? g->size : 1;
  if (L < 1 || P * L > INT_MAX || !send || !recv || !tpe)
    xm_rt_fail(x, "exchange_counts: %lld local experts over %lld members", (long long)L,
               (long long)P);
  if (path_of(x) == PATH_HOST) {
    host_exchange_counts(x, g, layer, send, recv, tpe, L);
    return;
  }
  const char *what = "exchange_counts";
  size_t b = (size_t)(P * L) * sizeof(int32_t), bl = (size_t)L * sizeof(int32_t);
  int32_t *hs = h_get(x, 0, send, b, what), *hr = h_get(x, 1, NULL, b, what);
  int32_t *ht = h_get(x, 2, NULL, bl, what);
  host_exchange_counts(x, g, layer, hs, hr, ht, L);
  h_put(x, recv, hr, b);
  h_put(x, tpe, ht, bl);
  h_done(x, hs);
  h_done(x, hr);
  h_done(x, ht);
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

/* The rows of an all-to-all whose counts the communicator settled: grouped
 * ncclSend / ncclRecv to and from every other member, rows to self copied
 * on the stream. */
static void nccl_rows(xm_rt_exec_t *x, const xm_rt_comm_group_t *g, const float *send,
                      const int64_t *sc, float *recv, const int64_t *rc, const int64_t *roff,
                      int64_t width) {
  const xm_nccl_lib_t *lib = nccl_lib(x);
  xm_nccl_comm_t comm = nccl_comm(x, g);
  void *s = nccl_stream(x, "all_to_all");
  int64_t soff = 0;
  for (int j = 0; j < g->index; j++)
    soff += sc[j];
  m_copy(x, 1, recv + roff[g->index] * width, send + soff * width,
         (size_t)(sc[g->index] * width) * sizeof(float));
  nccl_check(x, lib->group_start(), "all_to_all", g, "ncclGroupStart");
  soff = 0;
  for (int j = 0; j < g->size; j++) {
    if (j != g->index && sc[j] > 0)
      nccl_check(
          x, lib->send(send + soff * width, (size_t)(sc[j] * width), XM_NCCL_FLOAT32, j, comm, s),
          "all_to_all", g, "ncclSend");
    if (j != g->index && rc[j] > 0)
      nccl_check(
          x,
          lib->recv(recv + roff[j] * width, (size_t)(rc[j] * width), XM_NCCL_FLOAT32, j, comm, s),
          "all_to_all", g, "ncclRecv");
    soff += sc[j];
  }
  nccl_check(x, lib->group_end(), "all_to_all", g, "ncclGroupEnd");
}

/* The counts are host memory; the rows are host memory (path HOST and
 * STAGED) or device memory (MPI, NCCL). */
static int64_t a2a_core(xm_rt_exec_t *x, path_t path, const xm_rt_comm_group_t *g, int phase,
                        int layer, const float *send, const int32_t *send_counts,
                        const int32_t *recv_counts, int64_t L, int64_t width, float *recv,
                        int64_t recv_bound) {
  int dev = path == PATH_MPI || path == PATH_NCCL;
  int64_t P = g ? g->size : 1;
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
    m_copy(x, dev, recv, send, (size_t)(sent * width) * sizeof(float));
    got = sent;
    if (got != expect)
      xm_rt_fail(x, "all_to_all (layer %d): %lld rows kept, but the receive counts say %lld", layer,
                 (long long)got, (long long)expect);
    free(sc);
    return got;
  }
  xm_rt_comm_t *c = comm_of(x);
  int64_t *rc = alloc_or_fail(x, 2 * P, sizeof(int64_t), "all_to_all");
  int64_t *roff = rc + P;
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_rt_a2a_t rows = {(xm_rt_phase_t)phase, layer, width};
  xm_status_t st;
  if (path == PATH_NCCL) {
    st = xm_rt_comm_all_to_all_v_counts(c, g->kind, rows, send, sc, recv, recv_bound, &diag, rc,
                                        roff, &got);
    if (st == XM_OK) nccl_rows(x, g, send, sc, recv, rc, roff, width);
  } else {
    m_ready(x, dev);
    st = xm_rt_comm_all_to_all_v(c, g->kind, rows, send, sc, recv, recv_bound, &diag, rc, NULL,
                                 &got);
  }
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

int64_t xm_rt_all_to_all(xm_rt_exec_t *x, int group, int phase, int layer, const float *send,
                         const int32_t *send_counts, const int32_t *recv_counts, int64_t L,
                         int64_t width, float *recv, int64_t recv_bound) {
  const xm_rt_comm_group_t *g = group_of(x, group, "all_to_all");
  int64_t P = g ? g->size : 1;
  if (xm_rt_fault(x, "arena")) recv_bound = 0; /* tests: a plan too small for the routing */
  if (L < 1 || width < 1 || recv_bound < 0 || (unsigned)phase >= XM_RT_PHASE_COUNT ||
      !send_counts || !recv_counts)
    xm_rt_fail(x, "all_to_all (layer %d): %lld local experts, rows of %lld, bound %lld, phase %d",
               layer, (long long)L, (long long)width, (long long)recv_bound, phase);
  path_t path = path_of(x);
  if (path == PATH_HOST)
    return a2a_core(x, path, g, phase, layer, send, send_counts, recv_counts, L, width, recv,
                    recv_bound);
  const char *what = "all_to_all";
  int32_t *hc = counts_to_host(x, send_counts, recv_counts, P * L, what);
  const int32_t *hsc = hc, *hrc = hc + P * L;
  if (path != PATH_STAGED) {
    int64_t got = a2a_core(x, path, g, phase, layer, send, hsc, hrc, L, width, recv, recv_bound);
    h_done(x, hc);
    return got;
  }
  int64_t sent = 0;
  for (int64_t i = 0; i < P * L; i++)
    sent += hsc[i] > 0 ? hsc[i] : 0;
  size_t bs = (size_t)(sent * width) * sizeof(float);
  size_t br = (size_t)(recv_bound * width) * sizeof(float);
  float *hs = h_get(x, 1, sent ? send : NULL, bs, what);
  float *hr = h_get(x, 2, NULL, br, what);
  int64_t got = a2a_core(x, path, g, phase, layer, hs, hsc, hrc, L, width, hr, recv_bound);
  h_put(x, recv, hr, (size_t)(got * width) * sizeof(float));
  h_done(x, hc);
  h_done(x, hs);
  h_done(x, hr);
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
  int *cnt = alloc_or_fail(x, 2 * P, sizeof(int), what);
  int64_t c = xm_rt_chunk(n, P);
  for (int64_t j = 0; j < P; j++) {
    cnt[j] = (int)chunk_len(n, c, j);
    cnt[P + j] = (int)(j * c < n ? j * c : n);
  }
  return cnt;
}

/* The padded copy NCCL's even chunks need when P * c > n: device scratch
 * of P * c elements. */
static float *zero_scratch(xm_rt_exec_t *x, int64_t elems, const char *what) {
  float *s = xm_rt_transport_scratch(transport_of(x), x->stream, (size_t)elems * sizeof(float));
  if (!s)
    xm_rt_fail(x, "%s: no device memory for %lld elements of padding", what, (long long)elems);
  return s;
}

/* Host memory, or device memory for a GPU-aware MPI. */
static void mpi_zero_reduce_scatter(xm_rt_exec_t *x, int dev, const xm_rt_comm_group_t *g,
                                    const float *grad, int64_t n, float *chunk) {
  int64_t P = g ? g->size : 1, i = g ? g->index : 0;
  int64_t c = xm_rt_chunk(n, P), own = chunk_len(n, c, i);
  if (!g || g->size == 1) {
    m_copy(x, dev, chunk, grad, (size_t)own * sizeof(float));
  } else {
    int *cnt = chunk_counts(x, n, P, "zero_reduce_scatter");
    /* The reduce-scatter half of the ring: every chunk but its own. */
    xm_rt_comm_model_ring(comm_of(x), g->kind, XM_RT_PHASE_REDUCE_SCATTER,
                          (n - own) * (int64_t)sizeof(float));
    float dummy = 0.0f;
    m_ready(x, dev);
    MPI_Reduce_scatter(n > 0 ? grad : &dummy, own > 0 ? chunk : &dummy, cnt, MPI_FLOAT, MPI_SUM,
                       g->comm);
    free(cnt);
  }
  if (c > own) m_zero(x, dev, chunk + own, (size_t)(c - own) * sizeof(float));
}

/* Even chunks of c: the grad as it is when P * c == n, else padded with
 * zeros to P * c, which also zeroes the owned chunk's tail. */
static void nccl_zero_reduce_scatter(xm_rt_exec_t *x, const xm_rt_comm_group_t *g,
                                     const float *grad, int64_t n, float *chunk) {
  int64_t P = g->size, c = xm_rt_chunk(n, P), own = chunk_len(n, c, g->index);
  if (P == 1) {
    m_copy(x, 1, chunk, grad, (size_t)own * sizeof(float));
    return;
  }
  xm_rt_comm_model_ring(comm_of(x), g->kind, XM_RT_PHASE_REDUCE_SCATTER,
                        (n - own) * (int64_t)sizeof(float));
  if (n == 0) return;
  const float *src = grad;
  if (P * c != n) {
    float *s = zero_scratch(x, P * c, "zero_reduce_scatter");
    m_copy(x, 1, s, grad, (size_t)n * sizeof(float));
    m_zero(x, 1, s + n, (size_t)(P * c - n) * sizeof(float));
    src = s;
  }
  nccl_check(x,
             nccl_lib(x)->reduce_scatter(src, chunk, (size_t)c, XM_NCCL_FLOAT32, XM_NCCL_SUM,
                                         nccl_comm(x, g), nccl_stream(x, "zero_reduce_scatter")),
             "zero_reduce_scatter", g, "ncclReduceScatter");
}

void xm_rt_zero_reduce_scatter(xm_rt_exec_t *x, int group, const float *grad, int64_t n,
                               float *chunk) {
  const xm_rt_comm_group_t *g = group_of(x, group, "zero_reduce_scatter");
  if (n < 0 || (n > 0 && (!grad || !chunk)) || (grad && grad == chunk))
    xm_rt_fail(x, "zero_reduce_scatter: %lld elements at %p -> %p", (long long)n,
               (const void *)grad, (void *)chunk);
  int64_t P = g ? g->size : 1;
  if (g && g->size > 1 && n > INT_MAX)
    xm_rt_fail(x, "zero_reduce_scatter: %lld elements (at most %d per tensor)", (long long)n,
               INT_MAX);
  switch (path_of(x)) {
  case PATH_HOST: mpi_zero_reduce_scatter(x, 0, g, grad, n, chunk); return;
  case PATH_MPI: mpi_zero_reduce_scatter(x, 1, g, grad, n, chunk); return;
  case PATH_NCCL: nccl_zero_reduce_scatter(x, g, grad, n, chunk); return;
  case PATH_STAGED:
    if (n == 0) {
      mpi_zero_reduce_scatter(x, 0, g, NULL, 0, NULL);
      return;
    }
    size_t bc = (size_t)xm_rt_chunk(n, P) * sizeof(float);
    float *hg = h_get(x, 0, grad, (size_t)n * sizeof(float), "zero_reduce_scatter");
    float *hc = h_get(x, 1, NULL, bc, "zero_reduce_scatter");
    mpi_zero_reduce_scatter(x, 0, g, hg, n, hc);
    h_put(x, chunk, hc, bc);
    h_done(x, hg);
    h_done(x, hc);
    return;
  }
}

/* Host memory, or device memory for a GPU-aware MPI. Groups of 2 or more. */
static void mpi_zero_gather(xm_rt_exec_t *x, int dev, const xm_rt_comm_group_t *g, float *param,
                            int64_t n) {
  int *cnt = chunk_counts(x, n, g->size, "zero_gather");
  float dummy = 0.0f;
  m_ready(x, dev);
  MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, n > 0 ? param : &dummy, cnt, cnt + g->size,
                 MPI_FLOAT, g->comm);
  free(cnt);
}

/* Even chunks of c, in place when P * c == n, else through padded scratch
 * (the chunks are contiguous from 0, so its first n elements are param). */
static void nccl_zero_gather(xm_rt_exec_t *x, const xm_rt_comm_group_t *g, float *param,
                             int64_t n) {
  int64_t P = g->size, c = xm_rt_chunk(n, P), i = g->index;
  if (n == 0) return;
  float *buf = param;
  if (P * c != n) {
    buf = zero_scratch(x, P * c, "zero_gather");
    m_copy(x, 1, buf + i * c, param + i * c, (size_t)chunk_len(n, c, i) * sizeof(float));
  }
  nccl_check(x,
             nccl_lib(x)->all_gather(buf + i * c, buf, (size_t)c, XM_NCCL_FLOAT32, nccl_comm(x, g),
                                     nccl_stream(x, "zero_gather")),
             "zero_gather", g, "ncclAllGather");
  if (buf != param) m_copy(x, 1, param, buf, (size_t)n * sizeof(float));
}

void xm_rt_zero_gather(xm_rt_exec_t *x, int group, float *param, int64_t n) {
  const xm_rt_comm_group_t *g = group_of(x, group, "zero_gather");
  if (n < 0 || (n > 0 && !param))
    xm_rt_fail(x, "zero_gather: %lld elements at %p", (long long)n, (void *)param);
  if (!g || g->size == 1) return;
  if (n > INT_MAX)
    xm_rt_fail(x, "zero_gather: %lld elements (at most %d per tensor)", (long long)n, INT_MAX);
  int64_t P = g->size, c = xm_rt_chunk(n, P);
  /* The all-gather half of the ring: every chunk but the successor's. */
  xm_rt_comm_model_ring(comm_of(x), g->kind, XM_RT_PHASE_ALL_GATHER,
                        (n - chunk_len(n, c, (g->index + 1) % P)) * (int64_t)sizeof(float));
  switch (path_of(x)) {
  case PATH_HOST: mpi_zero_gather(x, 0, g, param, n); return;
  case PATH_MPI: mpi_zero_gather(x, 1, g, param, n); return;
  case PATH_NCCL: nccl_zero_gather(x, g, param, n); return;
  case PATH_STAGED:
    if (n == 0) {
      mpi_zero_gather(x, 0, g, NULL, 0);
      return;
    }
    float *h = h_get(x, 0, param, (size_t)n * sizeof(float), "zero_gather");
    mpi_zero_gather(x, 0, g, h, n);
    h_put(x, param, h, (size_t)n * sizeof(float));
    h_done(x, h);
    return;
  }
}
