/* tools/calibrate/calibrate_comm.c — the collectives of xmoec-calibrate,
 * through the runtime communicator (runtime/comm/comm.h) that out/train's
 * schedule calls, and their latency + bandwidth fits.
 *
 * Groups: the layout dp = P, tp = 1, ep = P makes the DP and the EP group
 * the whole world (the reductions run over DP, the all-to-all over EP, as
 * in training); when P >= 4 is even, the layout tp = 2 adds groups of 2
 * (TP), which on emulated or real nodes of 2 or more ranks stay inside a
 * node. All groups of a layout run at the same time, as they do in a step.
 *
 * Bytes per rank are the buffer a member holds whole, the convention of
 * the NCCL tests: the all-reduce buffer; the all-gather's result (each
 * member contributes bytes / G); the reduce-scatter's input (each member
 * keeps bytes / G); the all-to-all's send buffer (bytes / G to each member,
 * itself included, in rows of at most 256 floats, a small hidden size).
 * So a collective and its mirror (all-gather and reduce-scatter) are
 * measured on the same tensor size, and bytes / seconds is the bandwidth
 * a cost model divides a tensor's size by. Sizes that do not divide
 * evenly are rounded down, and the bytes recorded are those moved.
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/diag.h"
#include "tools/calibrate/calibrate.h"

enum { CAL_A2A_WIDTH = 256 };

typedef struct {
  xm_rt_comm_t *comm;
  xm_rt_group_kind_t group;
  int kind;
  int size;      /* members of the group */
  int64_t n;     /* floats of the call, or rows per member for the all-to-all */
  int64_t width; /* floats per all-to-all row */
  float *send, *recv;
  int64_t *send_counts, *recv_counts;
  xm_diag_t *diag;
} coll_call_t;

static void coll_once(void *p) {
  coll_call_t *k = p;
  xm_status_t st = XM_OK;
  switch (k->kind) {
  case CAL_ALL_REDUCE: st = xm_rt_comm_all_reduce(k->comm, k->group, k->send, k->n); break;
  case CAL_ALL_GATHER: st = xm_rt_comm_all_gather(k->comm, k->group, k->send, k->n, k->recv); break;
  case CAL_REDUCE_SCATTER:
    st = xm_rt_comm_reduce_scatter(k->comm, k->group, k->send, k->n, k->recv);
    break;
  default: {
    xm_rt_a2a_t rows = {XM_RT_PHASE_DISPATCH, -1, k->width};
    int64_t got = 0;
    st = xm_rt_comm_all_to_all_v(k->comm, k->group, rows, k->send, k->send_counts, k->recv,
                                 (int64_t)k->size * k->n, k->diag, k->recv_counts, NULL, &got);
    break;
  }
  }
  if (st != XM_OK)
    cal_fatal("%s over %d ranks failed: %s%s%s", cal_kind_name(k->kind), k->size,
              xm_status_name(st), k->diag->count ? ": " : "",
              k->diag->count ? k->diag->entries[0].message : "");
}

/* Whether any group of `kind` has members on more than one node: the
 * slowest group sets the time of a measurement, so one spanning group
 * makes the whole measurement an inter-node one. Members ascend and nodes
 * are consecutive blocks of ranks, so the ends of a group tell. */
static int spans_nodes(const xm_rt_comm_t *comm, xm_rt_group_kind_t kind, MPI_Comm world) {
  const xm_rt_comm_group_t *g = xm_rt_comm_group(comm, kind);
  int mine =
      xm_rt_comm_node_of(comm, g->members[0]) != xm_rt_comm_node_of(comm, g->members[g->size - 1]);
  int any = 0;
  MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, world);
  return any;
}

/* The sizes of the profile: 4 KiB to 64 MiB by factors of 4, or three of
 * them with --quick. Returns how many. */
static int coll_sizes(const cal_t *c, int64_t *out) {
  if (c->quick) {
    out[0] = (int64_t)4 << 10;
    out[1] = (int64_t)256 << 10;
    out[2] = (int64_t)4 << 20;
    return 3;
  }
  int n = 0;
  for (int64_t b = (int64_t)4 << 10; b <= (int64_t)64 << 20; b *= 4)
    out[n++] = b;
  return n;
}

/* Fills in the call's counts for `bytes` per rank; returns the bytes the
 * call really moves (see the top of the file). */
static int64_t coll_setup(coll_call_t *k, int64_t bytes) {
  int64_t floats = bytes / (int64_t)sizeof(float);
  int64_t per = floats / k->size > 0 ? floats / k->size : 1;
  switch (k->kind) {
  case CAL_ALL_REDUCE: k->n = floats; return floats * (int64_t)sizeof(float);
  case CAL_ALL_GATHER:
  case CAL_REDUCE_SCATTER: k->n = per; return per * k->size * (int64_t)sizeof(float);
  default:
    k->width = per < CAL_A2A_WIDTH ? per : CAL_A2A_WIDTH;
    k->n = per / k->width;
    for (int j = 0; j < k->size; j++)
      k->send_counts[j] = k->n;
    return k->n * k->width * k->size * (int64_t)sizeof(float);
  }
}

typedef struct {
  xm_rt_comm_layout_t layout;
  xm_rt_group_kind_t reduce_group, a2a_group;
} coll_layout_t;

cal_coll_t *cal_run_collectives(const cal_t *c, int *out_count) {
  *out_count = 0;
  const int P = c->ctx.world;
  if (P < 2) {
    /* Nothing to measure between ranks; the section still reports. */
    cal_progress(c, "collectives", 0, 0, MPI_Wtime());
    return NULL;
  }
  coll_layout_t layouts[2] = {
      {{P, 1, P, 0, 0}, XM_RT_GROUP_DP, XM_RT_GROUP_EP},
      {{P / 2, 2, 2, 0, 0}, XM_RT_GROUP_TP, XM_RT_GROUP_TP},
  };
  int nlayouts = P >= 4 && P % 2 == 0 ? 2 : 1;
  int64_t sizes[16];
  int nsizes = coll_sizes(c, sizes);
  int total = nlayouts * CAL_KIND_COUNT * nsizes, done = 0;
  cal_coll_t *res = calloc((size_t)total, sizeof *res);
  if (!res) cal_fatal("out of memory for %d collective results", total);

  int64_t biggest = sizes[nsizes - 1];
  float *send = cal_alloc(c, (size_t)biggest, "the collective send buffer");
  float *recv = cal_alloc(c, (size_t)biggest, "the collective receive buffer");
  int64_t *counts = calloc(2 * (size_t)P, sizeof *counts);
  if (!counts) cal_fatal("out of memory for the all-to-all counts");
  xm_diag_t diag;
  xm_diag_init(&diag);
  /* Each repetition is a barrier, the call and a reduction of the times,
   * so the smallest sizes (some microseconds) need many of them. */
  const cal_timing_t timing = {0.020, 5, 20000, CAL_TIME_SLOWEST};
  double started = MPI_Wtime();

  for (int l = 0; l < nlayouts; l++) {
    xm_rt_comm_t *comm = NULL;
    xm_status_t st = xm_rt_comm_create(&c->ctx, &layouts[l].layout, &diag, &comm);
    if (st != XM_OK)
      cal_fatal("cannot build the groups of dp %d tp %d ep %d: %s", layouts[l].layout.dp,
                layouts[l].layout.tp, layouts[l].layout.ep,
                diag.count ? diag.entries[0].message : xm_status_name(st));
    for (int kind = 0; kind < CAL_KIND_COUNT; kind++) {
      xm_rt_group_kind_t g =
          kind == CAL_ALL_TO_ALL ? layouts[l].a2a_group : layouts[l].reduce_group;
      int inter = spans_nodes(comm, g, c->ctx.world_comm);
      for (int s = 0; s < nsizes; s++) {
        coll_call_t call = {comm,   g,          kind, xm_rt_comm_group(comm, g)->size,
                            0,      1,          send, recv,
                            counts, counts + P, &diag};
        int64_t bytes = coll_setup(&call, sizes[s]);
        cal_coll_t *r = &res[done];
        r->kind = kind;
        r->group = call.size;
        r->inter_node = inter;
        r->bytes = bytes;
        r->seconds = cal_time(c, &timing, coll_once, &call);
        /* Every call adds to the traffic counters, as in training, where
         * they start from zero at each step: so they do here at each size. */
        xm_rt_comm_traffic_reset(comm);
        cal_progress(c, "collectives", ++done, total, started);
      }
    }
    xm_rt_comm_destroy(comm);
  }
  xm_diag_free(&diag);
  free(counts);
  c->be->free(c->be, send);
  c->be->free(c->be, recv);
  *out_count = done;
  return res;
}

/* Least squares of seconds = latency + bytes / bandwidth over the points of
 * one (kind, inter_node), on the seconds themselves: the largest messages,
 * which take most of a step's communication time, weigh the most, so the
 * bandwidth is theirs. The points are rarely on one line (small messages
 * stay in the caches and MPI changes protocol with the size), and then the
 * intercept is no start-up cost: negative, or more than the fastest call
 * took. In that case the latency is the smallest time measured, all of it
 * counted as start-up, and the bandwidth the least-squares slope with the
 * latency held there; where the times do not grow with the bytes at all,
 * the bandwidth is that of the largest point alone. */
static int fit_line(const double *x, const double *y, int n, double *lat, double *slope) {
  double mx = 0, my = 0, min_y = INFINITY, max_x = 0, y_at_max = 0;
  for (int i = 0; i < n; i++) {
    mx += x[i] / n;
    my += y[i] / n;
    if (y[i] < min_y) min_y = y[i];
    if (x[i] >= max_x) {
      max_x = x[i];
      y_at_max = y[i];
    }
  }
  double sxx = 0, sxy = 0;
  for (int i = 0; i < n; i++) {
    sxx += (x[i] - mx) * (x[i] - mx);
    sxy += (x[i] - mx) * (y[i] - my);
  }
  if (!(sxx > 0)) return 0; /* one size only: no line */
  double b = sxy / sxx, a = my - b * mx;
  if (!(a > 0 && a <= min_y) || !(b > 0)) {
    a = min_y;
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
      num += x[i] * (y[i] - a);
      den += x[i] * x[i];
    }
    b = num / den;
  }
  if (!(b > 0) || !isfinite(b)) b = y_at_max / max_x;
  *lat = a;
  *slope = b;
  return 1;
}

int cal_fit(const cal_coll_t *points, int count, cal_fit_t *out) {
  double *x = malloc(sizeof(double) * (size_t)(count > 0 ? count : 1));
  double *y = malloc(sizeof(double) * (size_t)(count > 0 ? count : 1));
  if (!x || !y) cal_fatal("out of memory for the fits of %d points", count);
  int nfit = 0;
  for (int kind = 0; kind < CAL_KIND_COUNT; kind++) {
    for (int inter = 0; inter <= 1; inter++) {
      int n = 0;
      for (int i = 0; i < count; i++) {
        const cal_coll_t *p = &points[i];
        if (p->kind != kind || p->inter_node != inter || !(p->seconds > 0)) continue;
        x[n] = (double)p->bytes;
        y[n] = p->seconds;
        n++;
      }
      double lat = 0, slope = 0;
      if (n < 2 || !fit_line(x, y, n, &lat, &slope)) continue;
      cal_fit_t *f = &out[nfit++];
      f->kind = kind;
      f->inter_node = inter;
      f->points = n;
      f->latency_us = lat * 1e6;
      f->bandwidth_gbps = 1.0 / slope / 1e9;
    }
  }
  free(x);
  free(y);
  return nfit;
}
