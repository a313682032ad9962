/* runtime/driver/trace.c — recording and writing the measured step timeline
 * (runtime/driver/trace.h; the format is in docs/inspect.md).
 *
 * Recording is a growable array of fixed records appended from the op
 * hooks; the clock is CLOCK_MONOTONIC, read once per hook (an event ends
 * where the next begins). Nothing here talks to MPI until the trace is
 * written: then every rank packs its records as doubles, rank 0 gathers
 * them (MPI_Gatherv over the world) and streams the JSON. Op names travel
 * as the string literals of rank 0's own program: every rank runs the same
 * generated code, so rank 0 has seen every op index it receives.
 */
#include "runtime/driver/trace.h"

#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
  int64_t step;
  double start, end;
  const char *name;
  int op, micro, layer, flags;
} record_t;

struct xm_rt_trace {
  record_t *rec;
  int64_t count, cap;
  int open;      /* the last record has no end yet */
  int truncated; /* an append failed: later events were dropped */
  int64_t step;
  int micro;
};

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

xm_rt_trace_t *xm_rt_trace_create(void) {
  xm_rt_trace_t *t = calloc(1, sizeof *t);
  if (t) t->micro = -1;
  return t;
}

void xm_rt_trace_destroy(xm_rt_trace_t *t) {
  if (!t) return;
  free(t->rec);
  free(t);
}

void xm_rt_trace_set(xm_rt_trace_t *t, int64_t step, int micro) {
  t->step = step;
  t->micro = micro;
}

int64_t xm_rt_trace_count(const xm_rt_trace_t *t) { return t->count; }
int xm_rt_trace_truncated(const xm_rt_trace_t *t) { return t->truncated; }

void xm_rt_trace_event(const xm_rt_trace_t *t, int64_t i, int *op, int *micro, int *layer,
                       int *flags, int64_t *step, double *start, double *end) {
  const record_t *r = &t->rec[i];
  *op = r->op, *micro = r->micro, *layer = r->layer, *flags = r->flags;
  *step = r->step, *start = r->start, *end = r->end;
}

static void close_open(xm_rt_trace_t *t, double when) {
  if (t->open) t->rec[t->count - 1].end = when;
  t->open = 0;
}

void xm_rt_trace_op(xm_rt_exec_t *x, int op, const char *name, int layer, int flags) {
  xm_rt_trace_t *t = x->trace;
  double when = now();
  close_open(t, when);
  if (t->truncated) return;
  if (t->count == t->cap) {
    int64_t cap = t->cap ? t->cap * 2 : 4096;
    record_t *r = cap < INT64_MAX / 2 ? realloc(t->rec, (size_t)cap * sizeof *r) : NULL;
    if (!r) {
      t->truncated = 1;
      return;
    }
    t->rec = r;
    t->cap = cap;
  }
  t->rec[t->count++] = (record_t){.step = t->step,
                                  .start = when,
                                  .end = when,
                                  .name = name,
                                  .op = op,
                                  .micro = t->micro,
                                  .layer = layer,
                                  .flags = flags};
  t->open = 1;
}

void xm_rt_trace_done(xm_rt_exec_t *x) { close_open(x->trace, now()); }

/* ---- writing ----------------------------------------------------------- */

enum { FIELDS = 7 }; /* op, micro, layer, flags, step, start, end */

static void pack(const xm_rt_trace_t *t, int64_t n, double *out) {
  for (int64_t i = 0; i < n; i++) {
    const record_t *r = &t->rec[i];
    double *o = out + i * FIELDS;
    o[0] = r->op, o[1] = r->micro, o[2] = r->layer, o[3] = r->flags;
    o[4] = (double)r->step, o[5] = r->start, o[6] = r->end;
  }
}

static void put_name(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\')
      fprintf(f, "\\%c", *p);
    else if (*p < 0x20)
      fprintf(f, "\\u%04x", *p);
    else
      fputc(*p, f);
  }
  fputc('"', f);
}

static const char *const k_phase[] = {"fwd", "bwd", "step", "fwd"};

/* Rank 0: the JSON of every rank's packed events. */
static int write_json(FILE *f, const xm_rt_trace_t *own, const char *model, int world,
                      const double *all, const int *counts, int truncated) {
  /* op index -> name, from rank 0's own records */
  int max_op = -1;
  for (int64_t i = 0; i < own->count; i++)
    if (own->rec[i].op > max_op) max_op = own->rec[i].op;
  const char **names = calloc((size_t)max_op + 2, sizeof *names);
  if (!names) return 0;
  for (int64_t i = 0; i < own->count; i++)
    if (own->rec[i].op >= 0) names[own->rec[i].op] = own->rec[i].name;
  int64_t total = 0;
  for (int r = 0; r < world; r++)
    total += counts[r] / FIELDS;
  double origin = 0.0;
  int64_t first_step = 0, last_step = 0;
  for (int64_t i = 0; i < total; i++) {
    const double *e = all + i * FIELDS;
    if (i == 0 || e[5] < origin) origin = e[5];
    if (i == 0 || e[4] < first_step) first_step = (int64_t)e[4];
    if (i == 0 || e[4] > last_step) last_step = (int64_t)e[4];
  }
  fprintf(f, "{\"traceEvents\":[\n");
  for (int r = 0; r < world; r++) {
    fprintf(f,
            "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
            "\"args\":{\"name\":\"rank %d (measured)\"}},\n",
            r, r);
    fprintf(f,
            "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
            "\"args\":{\"name\":\"compute\"}},\n",
            r);
    fprintf(f,
            "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":1,"
            "\"args\":{\"name\":\"collectives\"}},\n",
            r);
  }
  const double *e = all;
  int64_t written = 0;
  for (int r = 0; r < world; r++) {
    for (int i = 0; i < counts[r] / FIELDS; i++, e += FIELDS) {
      int op = (int)e[0], flags = (int)e[3];
      const char *name = op >= 0 && op <= max_op && names[op] ? names[op] : "op";
      fprintf(f, "%s{\"name\":", written++ ? ",\n" : "");
      put_name(f, name);
      fprintf(f,
              ",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%d,"
              "\"args\":{\"op\":%d,\"micro\":%d,\"step\":%lld,\"layer\":%d}}",
              k_phase[flags & XM_RT_TRACE_PHASE_MASK], (e[5] - origin) * 1e6, (e[6] - e[5]) * 1e6,
              r, (flags & XM_RT_TRACE_COMM) ? 1 : 0, op, (int)e[1], (long long)e[4], (int)e[2]);
    }
  }
  fprintf(f, "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"source\":\"out/train --trace\","
             "\"kind\":\"measured\",\"model\":");
  put_name(f, model ? model : "?");
  fprintf(f,
          ",\"world\":%d,\"first_step\":%lld,\"last_step\":%lld,\"events\":%lld,"
          "\"truncated\":%s}}\n",
          world, (long long)first_step, (long long)last_step, (long long)total,
          truncated ? "true" : "false");
  free(names);
  return !ferror(f);
}

xm_status_t xm_rt_trace_write(xm_rt_trace_t *t, const xm_rt_context_t *ctx, const char *model,
                              FILE *f) {
  MPI_Comm world = ctx->world_comm;
  int rank = ctx->rank, size = ctx->world;
  close_open(t, now());
  /* At most INT_MAX doubles in all go through MPI_Gatherv. */
  int64_t n = t->count;
  if (n > INT_MAX / FIELDS / size) {
    n = INT_MAX / FIELDS / size;
    t->truncated = 1;
  }
  double *mine = malloc((size_t)(n ? n : 1) * FIELDS * sizeof *mine);
  if (!mine) {
    n = 0;
    t->truncated = 1;
  } else {
    pack(t, n, mine);
  }
  int count = (int)(n * FIELDS), truncated = t->truncated;
  int *counts = NULL, *displs = NULL;
  if (rank == 0) {
    counts = calloc((size_t)size, sizeof *counts);
    displs = calloc((size_t)size, sizeof *displs);
    if (!counts || !displs) xm_rt_abort(ctx, 1, "out of memory writing the trace");
  }
  int any_truncated = truncated;
  MPI_Reduce(&truncated, &any_truncated, 1, MPI_INT, MPI_MAX, 0, world);
  MPI_Gather(&count, 1, MPI_INT, counts, 1, MPI_INT, 0, world);
  double *all = NULL;
  xm_status_t st = XM_OK;
  if (rank == 0) {
    int64_t total = 0;
    for (int r = 0; r < size; r++) {
      displs[r] = (int)total;
      total += counts[r];
    }
    all = malloc((size_t)(total ? total : 1) * sizeof *all);
    if (!all) {
      /* Take part in the gather, receiving nothing. */
      for (int r = 0; r < size; r++)
        counts[r] = displs[r] = 0;
      st = XM_ERR_NO_MEMORY;
    }
  }
  MPI_Gatherv(mine, count, MPI_DOUBLE, all, counts, displs, MPI_DOUBLE, 0, world);
  if (rank == 0 && st == XM_OK) {
    if (!f || !write_json(f, t, model, size, all, counts, any_truncated) || fflush(f) != 0)
      st = XM_ERR_IO;
  }
  free(mine);
  free(all);
  free(counts);
  free(displs);
  int local = (int)st, agreed = local;
  MPI_Allreduce(&local, &agreed, 1, MPI_INT, MPI_MAX, world);
  return (xm_status_t)agreed;
}
