/* tools/calibrate/calibrate.h — xmoec-calibrate: the figures a cost model of
 * training needs about one machine, measured with what out/train runs: the
 * CPU backend's kernels and thread policy (runtime/cpu) and the runtime
 * communicator (runtime/comm).
 *
 * Every section runs on all ranks at once, a barrier before each timed
 * repetition, so the figures include the contention of that many ranks
 * sharing the machine: a profile holds for runs with as many ranks per
 * machine as the calibration had. The sections live in calibrate_bench.c
 * (GEMMs, memory bandwidth, per-call overhead) and calibrate_comm.c (the
 * collectives and their latency + bandwidth fits); calibrate.c parses the
 * command line, sets the process up as out/train does and writes the
 * profile.
 */
#ifndef XM_TOOLS_CALIBRATE_H
#define XM_TOOLS_CALIBRATE_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/abi/backend.h"
#include "runtime/comm/comm.h"

#define CAL_PROG "xmoec-calibrate"

/* One GEMM shape: y[m,n] = x[m,k] w[n,k]^T and its two gradients. */
typedef struct {
  int64_t m, n, k;
} cal_shape_t;

/* The three GEMM kernels of a linear layer (runtime/cpu/kernels.h). */
enum { CAL_OP_FWD, CAL_OP_DX, CAL_OP_DW, CAL_OP_COUNT };

/* The collectives, in the order the profile lists them. */
enum { CAL_ALL_REDUCE, CAL_ALL_GATHER, CAL_REDUCE_SCATTER, CAL_ALL_TO_ALL, CAL_KIND_COUNT };

typedef struct {
  int op;
  cal_shape_t shape;
  double gflops; /* mean over ranks of each rank's median */
} cal_gemm_t;

typedef struct {
  int kind;
  int group;      /* members per group */
  int inter_node; /* some group of this measurement spans more than one node */
  int64_t bytes;  /* per rank: the buffer a member holds whole (see calibrate_comm.c) */
  double seconds; /* median over repetitions of the slowest rank's time */
} cal_coll_t;

typedef struct {
  int kind;
  int inter_node;
  int points;
  double latency_us;
  double bandwidth_gbps; /* 10^9 bytes per second */
} cal_fit_t;

/* The process as the sections see it. */
typedef struct {
  xm_rt_context_t ctx;
  xm_rt_backend_t *be; /* the CPU backend, initialised with out/train's policy */
  MPI_Comm machine;    /* the ranks on this rank's machine (shared memory) */
  int threads;         /* OpenMP threads of this rank */
  int quick;           /* smaller sizes and shorter timings */
  int tty;             /* rank 0's stderr is a terminal: progress updates in place */
  char cluster[64];    /* --cluster: the cluster's name; "" without one */
} cal_t;

/* What one repetition's time is. */
typedef enum {
  CAL_TIME_OWN,     /* each rank's own */
  CAL_TIME_SLOWEST, /* the slowest rank's: a collective ends when its last member does */
  /* From the first rank's start to the last one's end on each machine (its
   * ranks share a clock), the longest over the machines: the time the
   * machine took to do every rank's work, also where ranks that share a
   * core did not run side by side. */
  CAL_TIME_SPAN,
} cal_time_mode_t;

/* How long to time one measurement: at least min_reps repetitions adding up
 * to at least min_seconds (on every rank), at most max_reps. */
typedef struct {
  double min_seconds;
  int min_reps;
  int max_reps;
  cal_time_mode_t mode;
} cal_timing_t;

/* One warm-up call, then timed calls of fn(arg), a world barrier before
 * each; returns the median in seconds. Collective: every rank calls it with
 * the same timing and they agree on the number of repetitions. */
double cal_time(const cal_t *c, const cal_timing_t *t, void (*fn)(void *), void *arg);

/* Prints "xmoec: rank R: xmoec-calibrate: error: <message>" in one write
 * and ends every rank with exit code 1 (xm_rt_abort once the context
 * exists). Never returns. */
void cal_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* The context cal_fatal aborts (set once it exists). */
void cal_set_context(const xm_rt_context_t *ctx);

/* Zeroed backend memory of `bytes` (the allocator the arenas of out/train
 * come from), or cal_fatal naming `what`. Freed with c->be->free. */
void *cal_alloc(const cal_t *c, size_t bytes, const char *what);

/* Rank 0's progress line for a section: updated in place on a terminal,
 * printed once when done == total otherwise. `started` is MPI_Wtime() at
 * the start of the section. */
void cal_progress(const cal_t *c, const char *section, int done, int total, double started);

const char *cal_op_name(int op);
const char *cal_kind_name(int kind);

/* ---- the sections (collective over the world) ---- */

/* Three entries per shape (fwd, dx, dw, in that order); the caller frees. */
cal_gemm_t *cal_run_gemm(const cal_t *c, const cal_shape_t *shapes, int count);
/* STREAM triad on all ranks at once: GB/s of one rank and of all of them,
 * each pass timed as CAL_TIME_SPAN. */
void cal_run_memory(const cal_t *c, double *per_rank_gbps, double *total_gbps);
/* Microseconds of one call of a tiny kernel (mean over ranks). */
double cal_run_overhead(const cal_t *c);
/* Every measured point; the caller frees. None with one rank. */
cal_coll_t *cal_run_collectives(const cal_t *c, int *out_count);
/* A latency + bandwidth line per (kind, inter_node) with at least two
 * sizes among the points; `out` has room for 2 * CAL_KIND_COUNT. Returns
 * how many it wrote. */
int cal_fit(const cal_coll_t *points, int count, cal_fit_t *out);

#endif /* XM_TOOLS_CALIBRATE_H */
