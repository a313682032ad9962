/* runtime/comm/comm.c — parallel groups, collectives and the failure agreement.
 *
 * Every group is described by a (color, key) pair per world rank: ranks of
 * one color form a group, ordered by key. The same function gives both the
 * MPI_Comm_split arguments and the member lists, so the MPI communicator and
 * the members the traffic counters use cannot disagree (create checks it).
 *
 * Counts: MPI counts are C ints. The all-to-all moves rows through a
 * contiguous datatype of `width` elements, so its counts and displacements
 * are rows, not elements; all-reduce is chunked below INT_MAX elements;
 * all-gather and reduce-scatter above 2^31 - 1 elements per rank (8 GiB of
 * floats) are refused as a caller bug. The row datatype is cached in the
 * communicator because consecutive all-to-alls of one layer share a width.
 *
 * The bound check of the all-to-all costs one 16-byte all-reduce (MAXLOC)
 * after the count exchange. It is what turns "a rank would overflow" into
 * the same error on every member instead of one rank leaving the exchange
 * while the others block in MPI_Alltoallv. The combine, whose counts are
 * the mirror of the dispatch's, skips both through the _known variant.
 *
 * The traffic of each collective is one function of the byte models
 * (comm.h, xm_rt_comm_model_*), called here and by every transport that
 * moves the same bytes without MPI, so the counters do not depend on the
 * transport; _counts is the all-to-all without its row transfer, for the
 * same reason.
 */
#include "runtime/comm/comm.h"

#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* The names come from runtime/abi/groups.def, as the compiler's do. */
const char *xm_rt_group_name(xm_rt_group_kind_t kind) { return xm_rt_group_kind_name(kind); }

const char *xm_rt_phase_name(xm_rt_phase_t phase) { return xm_rt_phase_kind_name(phase); }

/* ---- layout ---- */

xm_status_t xm_rt_comm_layout_validate(const xm_rt_comm_layout_t *l, xm_diag_t *diag) {
  int errors = 0;
  const struct {
    int value;
    const char *name, *place;
  } degrees[3] = {
      {l->dp, "dp", "/parallel/dp"}, {l->tp, "tp", "/parallel/tp"}, {l->ep, "ep", "/parallel/ep"}};
  for (int i = 0; i < 3; i++) {
    if (degrees[i].value >= 1) continue;
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, degrees[i].place, "%s is %d; it must be at least 1",
                degrees[i].name, degrees[i].value);
    errors++;
  }
  if (l->world < 1) {
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL, "the world size is %d; it must be at least 1",
                l->world);
    return XM_ERR_INVALID_INPUT;
  }
  if (l->ranks_per_node < 1 || l->world % l->ranks_per_node != 0) {
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL,
                "%d ranks per node does not divide the world size %d (XM_RANKS_PER_NODE)",
                l->ranks_per_node, l->world);
    errors++;
  }
  if (errors) return XM_ERR_INVALID_INPUT;
  int64_t token_ranks = (int64_t)l->dp * l->tp;
  if (token_ranks != l->world) {
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, "/parallel",
                "dp %d * tp %d = %lld ranks, but the program runs on %d (mpirun -np)", l->dp, l->tp,
                (long long)token_ranks, l->world);
    errors++;
  }
  if (token_ranks % l->ep != 0) {
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, "/parallel/ep",
                "ep %d does not divide the %lld token-parallel ranks (dp * tp)", l->ep,
                (long long)token_ranks);
    errors++;
  }
  return errors ? XM_ERR_INVALID_INPUT : XM_OK;
}

/* Ranks of one color form a group, in key order (docs/design.md, Parallel layout). */
static void group_coords(const xm_rt_comm_layout_t *l, xm_rt_group_kind_t kind, int r,
                         int *out_color, int *out_key) {
  int color = 0, key = r;
  switch (kind) {
  case XM_RT_GROUP_WORLD: break;
  case XM_RT_GROUP_DP: color = r % l->tp, key = r / l->tp; break;
  case XM_RT_GROUP_TP: color = r / l->tp, key = r % l->tp; break;
  case XM_RT_GROUP_EP: color = r / l->ep, key = r % l->ep; break;
  case XM_RT_GROUP_EDP: color = r % l->ep, key = r / l->ep; break;
  case XM_RT_GROUP_NODE: color = r / l->ranks_per_node, key = r % l->ranks_per_node; break;
  case XM_RT_GROUP_COUNT: XM_ASSERT(0 && "not a group kind");
  }
  *out_color = color;
  *out_key = key;
}

int xm_rt_comm_layout_group(const xm_rt_comm_layout_t *l, xm_rt_group_kind_t kind, int world_rank,
                            int *out_members, int *out_index) {
  int color, key, size = 0;
  group_coords(l, kind, world_rank, &color, &key);
  for (int q = 0; q < l->world; q++) {
    int qc, qk;
    group_coords(l, kind, q, &qc, &qk);
    if (qc != color) continue;
    out_members[qk] = q;
    size++;
  }
  *out_index = key;
  return size;
}

/* ---- create / destroy ---- */

static xm_status_t resolve_layout(const xm_rt_context_t *ctx, const xm_rt_comm_layout_t *in,
                                  xm_diag_t *diag, xm_rt_comm_layout_t *out) {
  *out = *in;
  if (out->world == 0) out->world = ctx->world;
  if (out->ranks_per_node == 0) out->ranks_per_node = ctx->ranks_per_node;
  if (out->world != ctx->world) {
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL,
                "the layout is for %d ranks, but the program runs on %d (mpirun -np)", out->world,
                ctx->world);
    return XM_ERR_INVALID_INPUT;
  }
  if (out->ranks_per_node != ctx->ranks_per_node) {
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL,
                "the program was compiled for %d ranks per node, but runs with %d "
                "(--ranks-per-node or XM_RANKS_PER_NODE)",
                out->ranks_per_node, ctx->ranks_per_node);
    return XM_ERR_INVALID_INPUT;
  }
  return xm_rt_comm_layout_validate(out, diag);
}

static void *alloc_or_abort(const xm_rt_context_t *ctx, size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size);
  if (!p) xm_rt_abort(ctx, 1, "out of memory in the communicator (%zu x %zu bytes)", n, size);
  return p;
}

static void build_group(xm_rt_comm_t *c, xm_rt_group_kind_t kind) {
  const xm_rt_context_t *ctx = c->ctx;
  xm_rt_comm_group_t *g = &c->groups[kind];
  int color, key;
  group_coords(&c->layout, kind, ctx->rank, &color, &key);
  g->kind = kind;
  g->members = alloc_or_abort(ctx, (size_t)c->layout.world, sizeof(int));
  g->size = xm_rt_comm_layout_group(&c->layout, kind, ctx->rank, g->members, &g->index);
  MPI_Comm_split(ctx->world_comm, color, key, &g->comm);
  int mpi_size = -1, mpi_rank = -1;
  MPI_Comm_size(g->comm, &mpi_size);
  MPI_Comm_rank(g->comm, &mpi_rank);
  XM_ASSERT(mpi_size == g->size && mpi_rank == g->index);
  XM_ASSERT(g->members[g->index] == ctx->rank);
}

xm_status_t xm_rt_comm_create(const xm_rt_context_t *ctx, const xm_rt_comm_layout_t *layout,
                              xm_diag_t *diag, xm_rt_comm_t **out) {
  *out = NULL;
  xm_rt_comm_layout_t l;
  XM_RETURN_IF_ERROR(resolve_layout(ctx, layout, diag, &l));
  xm_rt_comm_t *c = alloc_or_abort(ctx, 1, sizeof *c);
  c->ctx = ctx;
  c->layout = l;
  for (int k = 0; k < XM_RT_GROUP_COUNT; k++)
    build_group(c, (xm_rt_group_kind_t)k);
  c->traffic.world = l.world;
  c->traffic.sent =
      alloc_or_abort(ctx, (size_t)XM_RT_PHASE_COUNT * (size_t)l.world, sizeof(int64_t));
  c->row_type = MPI_DATATYPE_NULL;
  c->row_base = MPI_DATATYPE_NULL;
  *out = c;
  return XM_OK;
}

void xm_rt_comm_destroy(xm_rt_comm_t *c) {
  if (!c) return;
  /* The transport first: its NCCL communicators span these groups (and
   * the tests' NCCL double frees MPI communicators of its own). */
  xm_rt_transport_destroy(c->transport);
  c->transport = NULL;
  for (int k = 0; k < XM_RT_GROUP_COUNT; k++) {
    if (c->groups[k].comm != MPI_COMM_NULL && c->groups[k].comm) MPI_Comm_free(&c->groups[k].comm);
    free(c->groups[k].members);
  }
  if (c->row_type != MPI_DATATYPE_NULL) MPI_Type_free(&c->row_type);
  free(c->traffic.sent);
  free(c->traffic.layer_sent);
  free(c->traffic.used);
  free(c);
}

const xm_rt_comm_group_t *xm_rt_comm_group(const xm_rt_comm_t *c, xm_rt_group_kind_t kind) {
  XM_ASSERT((unsigned)kind < XM_RT_GROUP_COUNT);
  return &c->groups[kind];
}

/* ---- argument checks: a caller bug on one rank must not hang the others ---- */

static void require(const xm_rt_comm_t *c, int cond, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void require(const xm_rt_comm_t *c, int cond, const char *fmt, ...) {
  if (cond) return;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  xm_rt_abort(c->ctx, 1, "communicator: %s", msg);
}

static const xm_rt_comm_group_t *group_for(const xm_rt_comm_t *c, xm_rt_group_kind_t kind,
                                           const char *what) {
  require(c, (unsigned)kind < XM_RT_GROUP_COUNT, "%s: %d is not a group", what, (int)kind);
  return &c->groups[kind];
}

/* ---- the byte models (docs/traffic.md; comm.h) ---- */

/* A ring over the group in index order, half the bytes each way (rings in
 * both directions, as NCCL/RCCL run them); a group of 2 has one neighbour. */
static void add_ring(xm_rt_comm_t *c, const xm_rt_comm_group_t *g, xm_rt_phase_t phase,
                     int64_t bytes) {
  /* The zero to self marks the call for the matrix even when nothing moves. */
  xm_rt_comm_traffic_add(c, phase, -1, g->members[g->index], 0);
  if (g->size < 2 || bytes == 0) return;
  int succ = g->members[(g->index + 1) % g->size];
  int pred = g->members[(g->index + g->size - 1) % g->size];
  if (succ == pred) {
    xm_rt_comm_traffic_add(c, phase, -1, succ, bytes);
    return;
  }
  xm_rt_comm_traffic_add(c, phase, -1, succ, bytes / 2);
  xm_rt_comm_traffic_add(c, phase, -1, pred, bytes - bytes / 2);
}

/* Ring all-reduce of n elements split into P chunks (chunk j has n/P
 * elements, one more for j < n%P): member i sends every chunk but its own
 * in the reduce-scatter half and every chunk but chunk i+1 in the
 * all-gather half. */
static int64_t ring_all_reduce_elems(int64_t n, int P, int i) {
  if (P < 2) return 0;
  int64_t own = n / P + (i < n % P), next = n / P + ((i + 1) % P < n % P);
  return (n - own) + (n - next);
}

void xm_rt_comm_model_ring(xm_rt_comm_t *c, xm_rt_group_kind_t kind, xm_rt_phase_t phase,
                           int64_t bytes) {
  add_ring(c, group_for(c, kind, "traffic"), phase, bytes);
}

void xm_rt_comm_model_all_reduce(xm_rt_comm_t *c, xm_rt_group_kind_t kind, int64_t n,
                                 int64_t elem_bytes) {
  const xm_rt_comm_group_t *g = group_for(c, kind, "all_reduce");
  add_ring(c, g, XM_RT_PHASE_ALL_REDUCE, ring_all_reduce_elems(n, g->size, g->index) * elem_bytes);
}

void xm_rt_comm_model_all_gather(xm_rt_comm_t *c, xm_rt_group_kind_t kind, int64_t n) {
  const xm_rt_comm_group_t *g = group_for(c, kind, "all_gather");
  add_ring(c, g, XM_RT_PHASE_ALL_GATHER, (int64_t)(g->size - 1) * n * (int64_t)sizeof(float));
}

void xm_rt_comm_model_reduce_scatter(xm_rt_comm_t *c, xm_rt_group_kind_t kind, int64_t n) {
  const xm_rt_comm_group_t *g = group_for(c, kind, "reduce_scatter");
  add_ring(c, g, XM_RT_PHASE_REDUCE_SCATTER, (int64_t)(g->size - 1) * n * (int64_t)sizeof(float));
}

/* ---- float collectives ---- */

xm_status_t xm_rt_comm_all_reduce(xm_rt_comm_t *c, xm_rt_group_kind_t kind, float *buf, int64_t n) {
  const xm_rt_comm_group_t *g = group_for(c, kind, "all_reduce");
  require(c, n >= 0 && (n == 0 || buf), "all_reduce over %s: %lld elements at %p",
          xm_rt_group_name(kind), (long long)n, (void *)buf);
  xm_rt_comm_model_all_reduce(c, kind, n, (int64_t)sizeof(float));
  if (n == 0 || g->size == 1) return XM_OK;
  for (int64_t off = 0; off < n; off += INT_MAX) {
    int chunk = (int)(n - off < INT_MAX ? n - off : INT_MAX);
    MPI_Allreduce(MPI_IN_PLACE, buf + off, chunk, MPI_FLOAT, MPI_SUM, g->comm);
  }
  return XM_OK;
}

xm_status_t xm_rt_comm_all_gather(xm_rt_comm_t *c, xm_rt_group_kind_t kind, const float *send,
                                  int64_t n, float *out_recv) {
  const xm_rt_comm_group_t *g = group_for(c, kind, "all_gather");
  require(c, n >= 0 && n <= INT_MAX && (n == 0 || (send && out_recv)),
          "all_gather over %s: %lld elements per rank (at most %d)", xm_rt_group_name(kind),
          (long long)n, INT_MAX);
  xm_rt_comm_model_all_gather(c, kind, n);
  if (n == 0) return XM_OK;
  float *own = out_recv + (int64_t)g->index * n;
  if (g->size == 1) {
    if (own != send) memmove(own, send, (size_t)n * sizeof(float));
    return XM_OK;
  }
  const void *src = send == own ? MPI_IN_PLACE : (const void *)send;
  MPI_Allgather(src, (int)n, MPI_FLOAT, out_recv, (int)n, MPI_FLOAT, g->comm);
  return XM_OK;
}

xm_status_t xm_rt_comm_reduce_scatter(xm_rt_comm_t *c, xm_rt_group_kind_t kind, const float *send,
                                      int64_t n, float *out_recv) {
  const xm_rt_comm_group_t *g = group_for(c, kind, "reduce_scatter");
  require(c, n >= 0 && n <= INT_MAX && (n == 0 || (send && out_recv)),
          "reduce_scatter over %s: %lld elements per rank (at most %d)", xm_rt_group_name(kind),
          (long long)n, INT_MAX);
  xm_rt_comm_model_reduce_scatter(c, kind, n);
  if (n == 0) return XM_OK;
  if (g->size == 1) {
    if (out_recv != send) memmove(out_recv, send, (size_t)n * sizeof(float));
    return XM_OK;
  }
  MPI_Reduce_scatter_block(send, out_recv, (int)n, MPI_FLOAT, MPI_SUM, g->comm);
  return XM_OK;
}

/* ---- all-to-all of rows ---- */

static MPI_Datatype row_type(xm_rt_comm_t *c, MPI_Datatype base, int64_t width) {
  if (c->row_type != MPI_DATATYPE_NULL && c->row_base == base && c->row_width == width)
    return c->row_type;
  if (c->row_type != MPI_DATATYPE_NULL) MPI_Type_free(&c->row_type);
  MPI_Type_contiguous((int)width, base, &c->row_type);
  MPI_Type_commit(&c->row_type);
  c->row_base = base;
  c->row_width = width;
  return c->row_type;
}

typedef struct {
  const xm_rt_comm_group_t *g;
  xm_rt_a2a_t rows;
  const char *what;                           /* "all_to_all_v" or "all_to_all_v_i32" */
  int *scounts, *sdispls, *rcounts, *rdispls; /* [4][P], one allocation */
} a2a_call_t;

/* Send counts and displacements as MPI ints, checked (caller bugs abort). */
static void a2a_send_side(xm_rt_comm_t *c, a2a_call_t *a, const void *send,
                          const int64_t *send_counts) {
  int P = a->g->size;
  require(c, send_counts != NULL, "%s: no send counts", a->what);
  int64_t off = 0;
  for (int j = 0; j < P; j++) {
    require(c, send_counts[j] >= 0 && send_counts[j] <= INT_MAX && off <= INT_MAX,
            "%s over %s: send count %lld to member %d (offset %lld) is out of range", a->what,
            xm_rt_group_name(a->g->kind), (long long)send_counts[j], j, (long long)off);
    a->scounts[j] = (int)send_counts[j];
    a->sdispls[j] = (int)off;
    off += send_counts[j];
  }
  require(c, off == 0 || send != NULL, "%s: %lld rows to send from a null buffer", a->what,
          (long long)off);
}

/* Exchanges the counts and agrees on the bound; fills rcounts. */
static xm_status_t a2a_exchange_counts(xm_rt_comm_t *c, a2a_call_t *a, int64_t capacity,
                                       xm_diag_t *diag, int64_t *out_total) {
  const xm_rt_comm_group_t *g = a->g;
  MPI_Alltoall(a->scounts, 1, MPI_INT, a->rcounts, 1, MPI_INT, g->comm);
  int64_t total = 0;
  for (int j = 0; j < g->size; j++)
    total += a->rcounts[j];
  *out_total = total;
  int over = total > capacity || total > INT_MAX;
  struct {
    long value;
    int index;
  } mine = {over ? (long)total : -1L, g->index}, worst;
  MPI_Allreduce(&mine, &worst, 1, MPI_LONG_INT, MPI_MAXLOC, g->comm);
  if (worst.value < 0) return XM_OK;
  if (diag) {
    char layer[32] = "";
    if (a->rows.layer >= 0) snprintf(layer, sizeof layer, ", layer %d", a->rows.layer);
    if (worst.index == g->index)
      xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL,
                  "%s (%s%s) over the %s group: rank %d would receive %lld rows of %lld "
                  "elements, but its receive buffer holds %lld rows",
                  a->what, xm_rt_phase_name(a->rows.phase), layer, xm_rt_group_name(g->kind),
                  c->ctx->rank, (long long)total, (long long)a->rows.width, (long long)capacity);
    else
      xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL,
                  "%s (%s%s) over the %s group: rank %d would receive %ld rows, more than its "
                  "receive buffer holds",
                  a->what, xm_rt_phase_name(a->rows.phase), layer, xm_rt_group_name(g->kind),
                  g->members[worst.index], worst.value);
  }
  return XM_ERR_NO_MEMORY;
}

/* move 0: everything but the row transfer (xm_rt_comm_all_to_all_v_counts). */
static xm_status_t a2a_run(xm_rt_comm_t *c, xm_rt_group_kind_t kind, xm_rt_a2a_t rows,
                           MPI_Datatype base, size_t elem, const void *send,
                           const int64_t *send_counts, void *recv, int64_t capacity,
                           const int64_t *known_recv, xm_diag_t *diag, int64_t *out_recv_counts,
                           int64_t *out_recv_offsets, int64_t *out_recv_total, int move) {
  a2a_call_t a = {.g = group_for(c, kind, "all_to_all_v"), .rows = rows};
  a.what = base == MPI_INT32_T ? "all_to_all_v_i32" : "all_to_all_v";
  require(c,
          (unsigned)rows.phase < XM_RT_PHASE_COUNT && rows.layer >= -1 && rows.width >= 1 &&
              rows.width <= INT_MAX,
          "%s: phase %d, layer %d, width %lld", a.what, (int)rows.phase, rows.layer,
          (long long)rows.width);
  int P = a.g->size;
  a.scounts = alloc_or_abort(c->ctx, (size_t)P * 4, sizeof(int));
  a.sdispls = a.scounts + P, a.rcounts = a.scounts + 2 * P, a.rdispls = a.scounts + 3 * P;
  a2a_send_side(c, &a, send, send_counts);
  int64_t total = 0;
  xm_status_t st = XM_OK;
  if (known_recv) {
    for (int j = 0; j < P; j++) {
      require(c, known_recv[j] >= 0 && known_recv[j] <= INT_MAX - total,
              "%s: receive count %lld from member %d is out of range", a.what,
              (long long)known_recv[j], j);
      a.rcounts[j] = (int)known_recv[j];
      total += known_recv[j];
    }
  } else {
    st = a2a_exchange_counts(c, &a, capacity, diag, &total);
  }
  if (out_recv_total) *out_recv_total = total;
  if (st == XM_OK) {
    require(c, total == 0 || recv != NULL, "%s: %lld rows to receive into a null buffer", a.what,
            (long long)total);
    int64_t off = 0;
    for (int j = 0; j < P; j++) {
      a.rdispls[j] = (int)off;
      if (out_recv_counts) out_recv_counts[j] = a.rcounts[j];
      if (out_recv_offsets) out_recv_offsets[j] = off;
      off += a.rcounts[j];
    }
    if (move) {
      /* MPI wants valid pointers even for zero counts on some transports. */
      char dummy[16];
      MPI_Datatype t = row_type(c, base, rows.width);
      MPI_Alltoallv(send ? send : (const void *)dummy, a.scounts, a.sdispls, t,
                    recv ? recv : (void *)dummy, a.rcounts, a.rdispls, t, a.g->comm);
    }
    /* Rows to self never touch the wire; the zero still marks the call for
     * the per-layer matrix. */
    for (int j = 0; j < P; j++)
      xm_rt_comm_traffic_add(c, rows.phase, rows.layer, a.g->members[j],
                             j == a.g->index ? 0
                                             : (int64_t)a.scounts[j] * rows.width * (int64_t)elem);
  }
  free(a.scounts);
  return st;
}

xm_status_t xm_rt_comm_all_to_all_v(xm_rt_comm_t *c, xm_rt_group_kind_t kind, xm_rt_a2a_t rows,
                                    const float *send, const int64_t *send_counts, float *recv,
                                    int64_t recv_capacity, xm_diag_t *diag,
                                    int64_t *out_recv_counts, int64_t *out_recv_offsets,
                                    int64_t *out_recv_total) {
  return a2a_run(c, kind, rows, MPI_FLOAT, sizeof(float), send, send_counts, recv, recv_capacity,
                 NULL, diag, out_recv_counts, out_recv_offsets, out_recv_total, 1);
}

xm_status_t xm_rt_comm_all_to_all_v_counts(xm_rt_comm_t *c, xm_rt_group_kind_t kind,
                                           xm_rt_a2a_t rows, const float *send,
                                           const int64_t *send_counts, float *recv,
                                           int64_t recv_capacity, xm_diag_t *diag,
                                           int64_t *out_recv_counts, int64_t *out_recv_offsets,
                                           int64_t *out_recv_total) {
  return a2a_run(c, kind, rows, MPI_FLOAT, sizeof(float), send, send_counts, recv, recv_capacity,
                 NULL, diag, out_recv_counts, out_recv_offsets, out_recv_total, 0);
}

xm_status_t xm_rt_comm_all_to_all_v_i32(xm_rt_comm_t *c, xm_rt_group_kind_t kind, xm_rt_a2a_t rows,
                                        const int32_t *send, const int64_t *send_counts,
                                        int32_t *recv, int64_t recv_capacity, xm_diag_t *diag,
                                        int64_t *out_recv_counts, int64_t *out_recv_offsets,
                                        int64_t *out_recv_total) {
  return a2a_run(c, kind, rows, MPI_INT32_T, sizeof(int32_t), send, send_counts, recv,
                 recv_capacity, NULL, diag, out_recv_counts, out_recv_offsets, out_recv_total, 1);
}

xm_status_t xm_rt_comm_all_to_all_v_known(xm_rt_comm_t *c, xm_rt_group_kind_t kind,
                                          xm_rt_a2a_t rows, const float *send,
                                          const int64_t *send_counts, float *recv,
                                          const int64_t *recv_counts) {
  const xm_rt_comm_group_t *g = group_for(c, kind, "all_to_all_v_known");
  require(c, recv_counts != NULL, "all_to_all_v_known over %s: no receive counts",
          xm_rt_group_name(g->kind));
  return a2a_run(c, kind, rows, MPI_FLOAT, sizeof(float), send, send_counts, recv, INT64_MAX,
                 recv_counts, NULL, NULL, NULL, NULL, 1);
}

/* ---- failure agreement ---- */

enum { AGREE_MSG = 1024 };

xm_status_t xm_rt_comm_agree(const xm_rt_context_t *ctx, xm_status_t st, const char *msg,
                             char *out_msg, size_t out_size) {
  int mine = st != XM_OK ? ctx->rank : INT_MAX, first = INT_MAX;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, ctx->world_comm);
  if (out_msg && out_size) out_msg[0] = '\0';
  if (first == INT_MAX) return XM_OK;
  struct {
    int status;
    char text[AGREE_MSG];
  } m;
  memset(&m, 0, sizeof m);
  if (ctx->rank == first) {
    m.status = (int)st;
    snprintf(m.text, sizeof m.text, "%s", msg && *msg ? msg : xm_status_name(st));
  }
  MPI_Bcast(&m, (int)sizeof m, MPI_BYTE, first, ctx->world_comm);
  if (out_msg && out_size) snprintf(out_msg, out_size, "rank %d: %s", first, m.text);
  return (xm_status_t)m.status;
}

/* Every rank got here through the agreement, so the collective frees in
 * the destroys match; releasing everything before exit keeps the sanitizer
 * build's leak check meaningful on the failure path too. */
void xm_rt_comm_exit_on_error(xm_rt_context_t *ctx, xm_rt_comm_t *comm, xm_status_t st,
                              const char *msg) {
  char text[AGREE_MSG + 32];
  xm_status_t agreed = xm_rt_comm_agree(ctx, st, msg, text, sizeof text);
  if (agreed == XM_OK) return;
  if (ctx->rank == 0) {
    fprintf(stderr, "xmoec: %s\n", text);
    fflush(stderr);
  }
  int code = xm_status_exit_code(agreed);
  xm_rt_comm_destroy(comm);
  xm_rt_context_destroy(ctx);
  int finalized = 1;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
  exit(code ? code : 1);
}
