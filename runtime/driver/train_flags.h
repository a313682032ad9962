/* runtime/driver/train_flags.h — the command line of out/train (internal to the
 * training driver; runtime/driver/train.h documents the flags, docs/train.md the
 * details).
 *
 * Parsing is strict and happens before any MPI work, so that a typo costs
 * nothing on a cluster: an unknown flag, a missing or malformed value, or a
 * combination that makes no sense is reported with the flag's name and the
 * driver exits with code 2.
 */
#ifndef XM_RUNTIME_TRAIN_FLAGS_H
#define XM_RUNTIME_TRAIN_FLAGS_H

#include <stdint.h>
#include <stdio.h>

#include "runtime/abi/program.h"
#include "support/status.h"

typedef enum {
  XM_RT_PROGRESS_AUTO,
  XM_RT_PROGRESS_ALWAYS,
  XM_RT_PROGRESS_NEVER
} xm_rt_progress_mode_t;

/* Settings of one run: the program's defaults overridden by flags. Strings
 * point into argv (borrowed). */
typedef struct {
  const char *data;
  int64_t steps; /* the last step to take (total, not "more") */
  double lr, min_lr;
  int64_t warmup;
  int64_t schedule_steps; /* the step at which the decay reaches min_lr */
  int schedule;           /* 0 cosine, 1 constant, 2 linear */
  double weight_decay, clip;
  uint64_t seed;
  const char *ckpt_dir;
  int64_t save_every; /* 0: save only at the end (when ckpt_dir) */
  const char *resume; /* --resume or --ckpt */
  const char *init_from; /* --init-from: weights only, step 0 */
  int eval;
  int64_t batches; /* 0: not given */
  int json;
  const char *log;
  const char *traffic;             /* --traffic FILE: per-(layer, phase) matrices */
  const char *routing_stats;       /* --routing-stats FILE (runtime/moe/routing_stats.h) */
  int64_t routing_samples;         /* --routing-samples N; set_defaults: the default cap */
  const char *trace;               /* --trace FILE: the op timeline of the traced steps */
  int64_t trace_first, trace_last; /* --trace-steps N[:M]; default: the last step */
  double eval_fraction;
  int progress; /* xm_rt_progress_mode_t */
  int comm;     /* --comm: xm_rt_comm_mode_t (runtime/comm/transport.h), 0 auto */
  int64_t ranks_per_node; /* --ranks-per-node: emulated node size, 0 not given */
  int64_t timeout;        /* --timeout: seconds without progress before the run ends; 0 off */
  int quiet;
  int help;
} xm_rt_train_opts_t;

/* Fills *out from the program defaults and argv[1..argc-1]. Errors are
 * printed to `err` as "<prog>: error: --flag: message"; returns
 * XM_ERR_INVALID_INPUT for every problem. */
xm_status_t xm_rt_train_parse_flags(int argc, char **argv, const xm_rt_program_t *program,
                                    FILE *err, xm_rt_train_opts_t *out);

/* The usage text of --help. */
void xm_rt_train_print_usage(FILE *out, const char *prog, const xm_rt_program_t *program);

/* Learning rate of 1-based step s: linear warmup from 0, then cosine or
 * linear decay to min_lr at schedule_steps, or constant. */
double xm_rt_train_lr(const xm_rt_train_opts_t *o, int64_t s);

#endif /* XM_RUNTIME_TRAIN_FLAGS_H */
