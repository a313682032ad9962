/* tools/calibrate/calibrate_bench.c — the timing loop and the compute
 * sections of xmoec-calibrate: GEMM throughput through the kernels
 * out/train calls, memory bandwidth (a STREAM triad) and the cost of one
 * tiny kernel call.
 *
 * The GEMM buffers come from the backend's allocator and are filled on the
 * calling thread, as out/train's arenas are; the triad's arrays are first
 * touched by the thread team with the schedule of the timed loop, as STREAM
 * does, so that the figure is the bandwidth the team can draw, not that of
 * one memory node.
 */
#include <math.h>
#include <mpi.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/cpu/kernels.h"
#include "tools/calibrate/calibrate.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* A clock all processes of a machine share, unlike a per-process timer. */
static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double cal_time(const cal_t *c, const cal_timing_t *t, void (*fn)(void *), void *arg) {
  MPI_Comm world = c->ctx.world_comm;
  double *times = malloc(sizeof(double) * (size_t)t->max_reps);
  if (!times) cal_fatal("out of memory for %d timings", t->max_reps);
  /* The first call pays for what happens once: page faults, the start of
   * the thread team, lazy set-up inside BLAS and MPI. */
  MPI_Barrier(world);
  fn(arg);
  double total = 0.0;
  int n = 0;
  for (;;) {
    MPI_Barrier(world);
    double t0 = now();
    fn(arg);
    double t1 = now(), dt = t1 - t0;
    if (t->mode == CAL_TIME_SPAN) {
      double ends[2] = {-t0, t1}, span[2];
      MPI_Allreduce(ends, span, 2, MPI_DOUBLE, MPI_MAX, c->machine);
      dt = span[0] + span[1];
    }
    /* One reduction gives both the slowest rank's time and (negated) the
     * smallest running total, so that every rank takes the same decision
     * to stop and the ranks keep running side by side. */
    double mine[2] = {dt, -(total + dt)}, all[2];
    MPI_Allreduce(mine, all, 2, MPI_DOUBLE, MPI_MAX, world);
    int common = t->mode != CAL_TIME_OWN;
    double rec = common ? all[0] : dt;
    times[n++] = rec;
    total += rec;
    double least = common ? total : -all[1];
    if (n >= t->max_reps || (n >= t->min_reps && least >= t->min_seconds)) break;
  }
  qsort(times, (size_t)n, sizeof times[0], cmp_double);
  double median = n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
  free(times);
  return median;
}

/* The mean over the world of one value per rank. */
static double world_mean(const cal_t *c, double v) {
  double sum = 0.0;
  MPI_Allreduce(&v, &sum, 1, MPI_DOUBLE, MPI_SUM, c->ctx.world_comm);
  return sum / c->ctx.world;
}

/* ---- GEMMs ----------------------------------------------------------------- */

typedef struct {
  int op;
  cal_shape_t s;
  const float *x, *w, *dy;
  float *out;
} gemm_call_t;

static void gemm_once(void *p) {
  const gemm_call_t *g = p;
  switch (g->op) {
  case CAL_OP_FWD: xm_k_matmul(g->x, g->w, g->out, g->s.m, g->s.k, g->s.n); break;
  case CAL_OP_DX: xm_k_matmul_dx(g->dy, g->w, g->out, g->s.m, g->s.k, g->s.n); break;
  default: xm_k_matmul_dw(g->dy, g->x, g->out, g->s.m, g->s.k, g->s.n); break;
  }
}

/* Values in [-1, 1] that differ from element to element: no denormals, no
 * overflow over the repetitions, nothing a kernel could shortcut. */
static void fill_pattern(float *p, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; i++) {
    uint32_t h = ((uint32_t)i + seed) * 2654435761u;
    p[i] = (float)((h >> 8) % 2001u) / 1000.0f - 1.0f;
  }
}

static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }

cal_gemm_t *cal_run_gemm(const cal_t *c, const cal_shape_t *shapes, int count) {
  size_t mk = 0, nk = 0, mn = 0;
  for (int i = 0; i < count; i++) {
    const cal_shape_t *s = &shapes[i];
    mk = max_size(mk, (size_t)(s->m * s->k));
    nk = max_size(nk, (size_t)(s->n * s->k));
    mn = max_size(mn, (size_t)(s->m * s->n));
  }
  size_t outn = max_size(mk, max_size(nk, mn));
  float *x = cal_alloc(c, mk * sizeof(float), "the GEMM input x");
  float *w = cal_alloc(c, nk * sizeof(float), "the GEMM weight w");
  float *dy = cal_alloc(c, mn * sizeof(float), "the GEMM gradient dy");
  float *out = cal_alloc(c, outn * sizeof(float), "the GEMM output");
  fill_pattern(x, mk, 1);
  fill_pattern(w, nk, 2);
  fill_pattern(dy, mn, 3);
  cal_gemm_t *res = calloc((size_t)count * CAL_OP_COUNT, sizeof *res);
  if (!res) cal_fatal("out of memory for %d GEMM results", count * CAL_OP_COUNT);
  /* At least 3 repetitions: a median of fewer says little, and the
   * largest default shapes take a few hundred milliseconds each. */
  /* Timed from the first rank's start to the last rank's end on each
   * machine (CAL_TIME_SPAN): with more ranks than cores the ranks take
   * turns, and a rank's own time would miss the turns of the others; a
   * training step waits for all of them. */
  const cal_timing_t timing = {c->quick ? 0.005 : 0.020, 3, 1000, CAL_TIME_SPAN};
  double started = MPI_Wtime();
  int total = count * CAL_OP_COUNT, done = 0;
  for (int i = 0; i < count; i++) {
    for (int op = 0; op < CAL_OP_COUNT; op++) {
      gemm_call_t call = {op, shapes[i], x, w, dy, out};
      double sec = cal_time(c, &timing, gemm_once, &call);
      const cal_shape_t *s = &shapes[i];
      double flops = 2.0 * (double)s->m * (double)s->n * (double)s->k;
      cal_gemm_t *r = &res[done];
      r->op = op;
      r->shape = *s;
      r->gflops = world_mean(c, flops / sec / 1e9);
      cal_progress(c, "gemm", ++done, total, started);
    }
  }
  c->be->free(c->be, x);
  c->be->free(c->be, w);
  c->be->free(c->be, dy);
  c->be->free(c->be, out);
  return res;
}

/* ---- memory bandwidth ------------------------------------------------------ */

typedef struct {
  double *a;
  const double *b, *c;
  int64_t n;
  double s;
} triad_t;

static void triad_once(void *p) {
  const triad_t *t = p;
  double *restrict a = t->a;
  const double *restrict b = t->b, *restrict cc = t->c;
  const double s = t->s;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < t->n; i++)
    a[i] = b[i] + s * cc[i];
}

void cal_run_memory(const cal_t *c, double *per_rank_gbps, double *total_gbps) {
  const size_t bytes = (size_t)(c->quick ? 8 : 32) << 20;
  const int64_t n = (int64_t)(bytes / sizeof(double));
  double started = MPI_Wtime();
  double *a = aligned_alloc(64, bytes), *b = aligned_alloc(64, bytes);
  double *cc = aligned_alloc(64, bytes);
  if (!a || !b || !cc) cal_fatal("out of memory for the triad's 3 arrays of %zu bytes", bytes);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) {
    a[i] = 0.0;
    b[i] = 1.0;
    cc[i] = 2.0;
  }
  triad_t t = {a, b, cc, n, 3.0};
  /* The ranks share the memory system, and the machine has moved all
   * their bytes only when the last one is done: so each pass counts from
   * the first start to the last end, and the total is what the machine
   * sustains, also where ranks had to take turns on a core. */
  const cal_timing_t timing = {c->quick ? 0.005 : 0.020, 5, 1000, CAL_TIME_SPAN};
  double sec = cal_time(c, &timing, triad_once, &t);
  /* STREAM's count: two arrays read and one written per pass (the
   * write-allocate read of a is not counted). */
  *per_rank_gbps = 3.0 * (double)bytes / sec / 1e9;
  *total_gbps = *per_rank_gbps * c->ctx.world;
  free(a);
  free(b);
  free(cc);
  cal_progress(c, "memory", 1, 1, started);
}

/* ---- per-call overhead ------------------------------------------------------ */

enum { CAL_CALLS = 10000, CAL_TINY = 16 };

typedef struct {
  const float *a, *b;
  float *y;
} tiny_t;

/* A kernel call as the schedule makes it, on too few elements for any
 * work to show: what is left is the call and whatever the kernel does
 * before it looks at the size (its OpenMP region, if it opens one). */
static void tiny_batch(void *p) {
  const tiny_t *t = p;
  for (int i = 0; i < CAL_CALLS; i++)
    xm_k_add(t->a, t->b, t->y, CAL_TINY, CAL_TINY);
}

double cal_run_overhead(const cal_t *c) {
  double started = MPI_Wtime();
  float *buf = cal_alloc(c, 3 * CAL_TINY * sizeof(float), "the overhead buffers");
  fill_pattern(buf, 2 * CAL_TINY, 4);
  tiny_t t = {buf, buf + CAL_TINY, buf + 2 * CAL_TINY};
  const cal_timing_t timing = {0.005, 5, 1000, CAL_TIME_OWN};
  double sec = cal_time(c, &timing, tiny_batch, &t);
  c->be->free(c->be, buf);
  double us = world_mean(c, sec / CAL_CALLS * 1e6);
  cal_progress(c, "overhead", 1, 1, started);
  return us;
}
