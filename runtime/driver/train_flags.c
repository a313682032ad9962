/* runtime/driver/train_flags.c — strict parsing of out/train's flags, and the
 * learning-rate schedule they configure.
 *
 * Flags are one table (name, value kind, help line): the parser, the
 * "did you mean" suggestion and --help all read it, so a flag cannot be
 * parsed but undocumented. Both "--flag value" and "--flag=value" work.
 * Numbers must be complete and in range ("--steps 10k" is an error, not 10).
 * Cross-flag rules (eval needs a checkpoint, --save-every needs --ckpt-dir,
 * training flags make no sense with --eval) are checked after the scan so
 * that the order of flags does not matter.
 */
#include "runtime/driver/train_flags.h"

#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "support/strbuf.h"

typedef enum {
  F_DATA,
  F_STEPS,
  F_LR,
  F_WARMUP,
  F_SCHEDULE,
  F_WD,
  F_CLIP,
  F_SEED,
  F_CKPT_DIR,
  F_SAVE_EVERY,
  F_RESUME,
  F_CKPT,
  F_INIT_FROM,
  F_EVAL,
  F_BATCHES,
  F_JSON,
  F_LOG,
  F_TRAFFIC,
  F_ROUTING_STATS,
  F_ROUTING_SAMPLES,
  F_TRACE,
  F_TRACE_STEPS,
  F_EVAL_FRACTION,
  F_PROGRESS,
  F_COMM,
  F_RANKS_PER_NODE,
  F_TIMEOUT,
  F_QUIET,
  F_HELP,
  F_COUNT_
} flag_id_t;

typedef struct {
  const char *name;
  int takes_value;
  const char *value; /* metavariable for --help */
  const char *help;
} flag_info_t;

static const flag_info_t k_flags[F_COUNT_] = {
    [F_DATA] = {"--data", 1, "PATH",
                "training data: token file, Megatron PATH(.bin/.idx) or raw text"},
    [F_STEPS] = {"--steps", 1, "N",
                 "train until optimizer step N (default: the spec's train_steps; 0 with --ckpt-dir "
                 "saves the initial checkpoint)"},
    [F_LR] = {"--lr", 1, "X", "peak learning rate"},
    [F_WARMUP] = {"--warmup", 1, "N", "linear warmup steps"},
    [F_SCHEDULE] = {"--schedule", 1, "S", "cosine, constant or linear (decay after warmup)"},
    [F_WD] = {"--weight-decay", 1, "X", "AdamW decoupled weight decay (matrices only)"},
    [F_CLIP] = {"--clip", 1, "X", "global gradient-norm clipping threshold (0: off)"},
    [F_SEED] = {"--seed", 1, "S", "seed of parameter initialisation (unsigned 64-bit)"},
    [F_CKPT_DIR] = {"--ckpt-dir", 1, "DIR", "write checkpoints to DIR/step-NNNNNN and DIR/latest"},
    [F_SAVE_EVERY] = {"--save-every", 1, "N", "checkpoint every N steps (and always at the end)"},
    [F_RESUME] = {"--resume", 1, "DIR", "continue from a checkpoint (a --ckpt-dir or a step dir)"},
    [F_CKPT] = {"--ckpt", 1, "DIR", "same as --resume (reads better with --eval)"},
    [F_INIT_FROM] = {"--init-from", 1, "DIR",
                     "start from the weights of a checkpoint: a Hugging Face model directory "
                     "(config.json, safetensors in F32/BF16/F16) or one out/train saved; optimizer "
                     "fresh, step 0, data from the start"},
    [F_EVAL] = {"--eval", 0, NULL,
                "evaluate the checkpoint of --resume/--ckpt (or --init-from); no training"},
    [F_BATCHES] = {"--batches", 1, "N", "evaluation batches (with --eval; else after training)"},
    [F_JSON] = {"--json", 0, NULL, "print one JSON summary on stdout"},
    [F_LOG] = {"--log", 1, "FILE",
               "one JSON object per step to FILE (truncated; appended to with --resume)"},
    [F_TRAFFIC] =
        {"--traffic", 1, "FILE",
         "write each step's rank-to-rank traffic per layer and phase to FILE (JSON lines)"},
    [F_ROUTING_STATS] = {"--routing-stats", 1, "FILE",
                         "write the run's routing per MoE layer (expert loads, co-selected "
                         "pairs, sampled tokens) to FILE for `xmoec place` (docs/placement.md)"},
    [F_ROUTING_SAMPLES] = {"--routing-samples", 1, "N",
                           "tokens per layer --routing-stats keeps as a sample (default 65536)"},
    [F_TRACE] = {"--trace", 1, "FILE",
                 "write the measured op timeline of the traced steps to FILE (Chrome/Perfetto "
                 "trace JSON)"},
    [F_TRACE_STEPS] = {"--trace-steps", 1, "N[:M]",
                       "steps --trace records: step N, or N to M (default: the last step)"},
    [F_EVAL_FRACTION] = {"--eval-fraction", 1, "X",
                         "share of windows held out for evaluation (0.05)"},
    [F_PROGRESS] = {"--progress", 1, "WHEN", "auto, always or never: live progress line"},
    [F_COMM] = {"--comm", 1, "HOW",
                "how collectives move GPU memory: auto, nccl, mpi or host (docs/train.md)"},
    [F_RANKS_PER_NODE] = {"--ranks-per-node", 1, "N",
                          "treat every N consecutive ranks as one node (emulated nodes on one "
                          "machine; default: the machines MPI reports, or XM_RANKS_PER_NODE)"},
    [F_TIMEOUT] = {"--timeout", 1, "S",
                   "end the run when a rank shows no progress for S seconds (a stopped rank, a "
                   "stuck collective; default 1800, 0: never)"},
    [F_QUIET] = {"--quiet", 0, NULL, "no progress and no text summary (errors still print)"},
    [F_HELP] = {"--help", 0, NULL, "print this help and exit"},
};

/* ---- values -------------------------------------------------------------- */

/* Numbers are decimal, with nothing around them: no blanks, no sign where
 * none is meant, no octal or hex by accident ("010" is ten, "0x10" an
 * error). */
static int is_digit(char c) { return c >= '0' && c <= '9'; }

static int parse_int(const char *s, int64_t min, int64_t *out) {
  if (!is_digit(s[0]) && !(min < 0 && s[0] == '-' && is_digit(s[1]))) return 0;
  errno = 0;
  char *end = NULL;
  long long v = strtoll(s, &end, 10);
  if (errno || *end || v < min) return 0;
  *out = v;
  return 1;
}

static int parse_u64(const char *s, uint64_t *out) {
  if (!is_digit(s[0])) return 0;
  errno = 0;
  char *end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end) return 0;
  *out = v;
  return 1;
}

/* A finite number >= min (> min when strict). */
static int parse_double(const char *s, double min, int strict, double *out) {
  if (!is_digit(s[0]) && !(s[0] == '.' && is_digit(s[1])) &&
      !(min < 0 && s[0] == '-' && (is_digit(s[1]) || s[1] == '.')))
    return 0;
  if (s[strspn(s, "0123456789.eE+-")] != '\0') return 0; /* no hex floats, inf or nan */
  errno = 0;
  char *end = NULL;
  double v = strtod(s, &end);
  if (errno || *end || !isfinite(v) || v < min || (strict && v == min)) return 0;
  *out = v;
  return 1;
}

/* "N" or "N:M" with 1 <= N <= M. */
static int parse_step_range(const char *s, int64_t *first, int64_t *last) {
  const char *colon = strchr(s, ':');
  if (!colon) {
    if (!parse_int(s, 1, first)) return 0;
    *last = *first;
    return 1;
  }
  char head[32];
  size_t n = (size_t)(colon - s);
  if (n == 0 || n >= sizeof head) return 0;
  memcpy(head, s, n);
  head[n] = '\0';
  return parse_int(head, 1, first) && parse_int(colon + 1, 1, last) && *first <= *last;
}

static int parse_choice(const char *s, const char *const *names, int n, int *out) {
  for (int i = 0; i < n; i++)
    if (strcmp(s, names[i]) == 0) {
      *out = i;
      return 1;
    }
  return 0;
}

/* Stores the value of flag `id`; returns 0 and a description of what was
 * expected when the value is bad. */
static int set_value(xm_rt_train_opts_t *o, flag_id_t id, const char *v, const char **expected) {
  static const char *const schedules[] = {"cosine", "constant", "linear"};
  static const char *const progress[] = {"auto", "always", "never"};
  /* The order of xm_rt_comm_mode_t (runtime/comm/transport.h). */
  static const char *const comm[] = {"auto", "nccl", "mpi", "host"};
  switch (id) {
  case F_DATA:
    *expected = "a path";
    o->data = v;
    return *v != '\0';
  /* --steps 0 trains nothing: with --ckpt-dir it writes the initial
   * checkpoint (what an independent implementation can start from). */
  case F_STEPS: *expected = "a non-negative integer"; return parse_int(v, 0, &o->steps);
  case F_LR: *expected = "a positive number"; return parse_double(v, 0.0, 1, &o->lr);
  case F_WARMUP: *expected = "an integer >= 0"; return parse_int(v, 0, &o->warmup);
  case F_SCHEDULE:
    *expected = "cosine, constant or linear";
    return parse_choice(v, schedules, 3, &o->schedule);
  case F_WD: *expected = "a number >= 0"; return parse_double(v, 0.0, 0, &o->weight_decay);
  case F_CLIP:
    *expected = "a number >= 0 (0 turns clipping off)";
    return parse_double(v, 0.0, 0, &o->clip);
  case F_SEED: *expected = "an unsigned 64-bit integer"; return parse_u64(v, &o->seed);
  case F_CKPT_DIR:
    *expected = "a directory";
    o->ckpt_dir = v;
    return *v != '\0';
  case F_SAVE_EVERY: *expected = "a positive integer"; return parse_int(v, 1, &o->save_every);
  case F_RESUME:
  case F_CKPT:
    *expected = "a directory";
    o->resume = v;
    return *v != '\0';
  case F_INIT_FROM:
    *expected = "a directory";
    o->init_from = v;
    return *v != '\0';
  case F_BATCHES: *expected = "a positive integer"; return parse_int(v, 1, &o->batches);
  case F_LOG:
    *expected = "a file name";
    o->log = v;
    return *v != '\0';
  case F_TRAFFIC:
    *expected = "a file name";
    o->traffic = v;
    return *v != '\0';
  case F_ROUTING_STATS:
    *expected = "a file name";
    o->routing_stats = v;
    return *v != '\0';
  case F_ROUTING_SAMPLES:
    *expected = "an integer >= 0";
    return parse_int(v, 0, &o->routing_samples);
  case F_TRACE:
    *expected = "a file name";
    o->trace = v;
    return *v != '\0';
  case F_TRACE_STEPS:
    *expected = "a step N >= 1 or a range N:M with 1 <= N <= M";
    return parse_step_range(v, &o->trace_first, &o->trace_last);
  case F_EVAL_FRACTION:
    *expected = "a number in [0, 1)";
    return parse_double(v, 0.0, 0, &o->eval_fraction) && o->eval_fraction < 1.0;
  case F_PROGRESS:
    *expected = "auto, always or never";
    return parse_choice(v, progress, 3, &o->progress);
  case F_COMM: *expected = "auto, nccl, mpi or host"; return parse_choice(v, comm, 4, &o->comm);
  case F_TIMEOUT: *expected = "a number of seconds >= 0"; return parse_int(v, 0, &o->timeout);
  case F_RANKS_PER_NODE:
    *expected = "a positive integer that divides the number of ranks";
    return parse_int(v, 1, &o->ranks_per_node);
  default: return 0;
  }
}

static void set_switch(xm_rt_train_opts_t *o, flag_id_t id) {
  if (id == F_EVAL) o->eval = 1;
  if (id == F_JSON) o->json = 1;
  if (id == F_QUIET) o->quiet = 1;
  if (id == F_HELP) o->help = 1;
}

/* ---- the scan -------------------------------------------------------------- */

static const char *prog_name(char **argv) {
  const char *p = argv && argv[0] ? argv[0] : "train";
  const char *slash = strrchr(p, '/');
  return slash ? slash + 1 : p;
}

static void flag_error(FILE *err, const char *prog, const char *flag, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void flag_error(FILE *err, const char *prog, const char *flag, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(err, "%s: error: %s: ", prog, flag);
  vfprintf(err, fmt, ap);
  fputc('\n', err);
  va_end(ap);
}

static int find_flag(const char *name, size_t len) {
  for (int i = 0; i < F_COUNT_; i++)
    if (strlen(k_flags[i].name) == len && strncmp(k_flags[i].name, name, len) == 0) return i;
  return -1;
}

static const char *closest_flag(const char *name) {
  const char *best = NULL;
  int best_d = 4; /* suggest only close misspellings */
  for (int i = 0; i < F_COUNT_; i++) {
    int d = xm_edit_distance(name, k_flags[i].name);
    if (d < best_d && (size_t)d * 3 <= strlen(name)) { /* as xmoec's commands do */
      best_d = d;
      best = k_flags[i].name;
    }
  }
  return best;
}

static void set_defaults(const xm_rt_program_t *p, xm_rt_train_opts_t *o) {
  memset(o, 0, sizeof *o);
  o->steps = p->train_steps;
  o->lr = p->lr;
  o->min_lr = p->min_lr;
  o->warmup = p->warmup_steps;
  o->schedule_steps = p->train_steps;
  o->schedule = p->lr_schedule;
  o->weight_decay = p->weight_decay;
  o->clip = p->grad_clip;
  o->routing_samples = 65536; /* XM_RT_ROUTING_SAMPLE_CAP (runtime/moe/routing_stats.h) */
  o->seed = p->seed;
  o->eval_fraction = 0.05;
  o->timeout = 1800;
}

/* One argument (and maybe its value); returns the number of problems. */
static int scan_one(int argc, char **argv, int *i, const char *prog, xm_rt_train_opts_t *o,
                    int seen[F_COUNT_], FILE *err) {
  const char *arg = argv[*i];
  const char *eq = strchr(arg, '=');
  size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
  int id = strncmp(arg, "--", 2) == 0 ? find_flag(arg, len) : -1;
  if (id < 0) {
    const char *hint = closest_flag(arg);
    if (hint)
      flag_error(err, prog, arg, "unknown flag; did you mean %s?", hint);
    else
      flag_error(err, prog, arg, "unknown flag (see --help)");
    return 1;
  }
  const flag_info_t *f = &k_flags[id];
  int problems = 0;
  if (seen[id]++) {
    flag_error(err, prog, f->name, "given more than once");
    problems++;
  }
  if (!f->takes_value) {
    if (eq) {
      flag_error(err, prog, f->name, "takes no value");
      return problems + 1;
    }
    set_switch(o, (flag_id_t)id);
    return problems;
  }
  const char *value = eq ? eq + 1 : NULL;
  if (!value) {
    if (*i + 1 >= argc) {
      flag_error(err, prog, f->name, "missing value (%s)", f->value);
      return problems + 1;
    }
    value = argv[++*i];
  }
  const char *expected = "a value";
  if (!set_value(o, (flag_id_t)id, value, &expected)) {
    flag_error(err, prog, f->name, "expected %s, got '%s'", expected, value);
    problems++;
  }
  return problems;
}

/* Rules between flags, checked once all are known. */
static int check_combinations(const xm_rt_program_t *p, const char *prog, const int seen[F_COUNT_],
                              xm_rt_train_opts_t *o, FILE *err) {
  int problems = 0;
  if (!o->data) {
    flag_error(err, prog, "--data", "required: the training or evaluation data");
    problems++;
  }
  if (seen[F_RESUME] && seen[F_CKPT]) {
    flag_error(err, prog, "--ckpt", "--resume and --ckpt name the same thing; give one");
    problems++;
  }
  /* --init-from starts a new run from weights; --resume continues one
   * (weights, optimizer, step, data position): one or the other. */
  if (o->init_from && o->resume) {
    flag_error(err, prog, "--init-from",
               "cannot be combined with %s: --resume continues a run (optimizer, step, data "
               "position), --init-from starts a new one from weights only",
               seen[F_RESUME] ? "--resume" : "--ckpt");
    problems++;
  }
  if (o->eval && !o->resume && !o->init_from) {
    flag_error(err, prog, "--eval",
               "needs --resume DIR, --ckpt DIR or --init-from DIR (the checkpoint to evaluate)");
    problems++;
  }
  if (o->save_every && !o->ckpt_dir) {
    flag_error(err, prog, "--save-every", "needs --ckpt-dir DIR");
    problems++;
  }
  static const flag_id_t training_only[] = {F_STEPS,
                                            F_LR,
                                            F_WARMUP,
                                            F_SCHEDULE,
                                            F_WD,
                                            F_CLIP,
                                            F_CKPT_DIR,
                                            F_SAVE_EVERY,
                                            F_LOG,
                                            F_TRAFFIC,
                                            F_TRACE,
                                            F_TRACE_STEPS,
                                            F_ROUTING_STATS,
                                            F_ROUTING_SAMPLES};
  for (size_t k = 0; o->eval && k < sizeof training_only / sizeof *training_only; k++)
    if (seen[training_only[k]]) {
      flag_error(err, prog, k_flags[training_only[k]].name, "has no effect with --eval");
      problems++;
    }
  if (!seen[F_STEPS] && o->steps <= 0 && !o->eval) {
    flag_error(err, prog, "--steps", "required: the program has no train_steps");
    problems++;
  }
  if (seen[F_ROUTING_SAMPLES] && !o->routing_stats) {
    flag_error(err, prog, "--routing-samples", "needs --routing-stats FILE");
    problems++;
  }
  if (o->routing_stats && p->placement_experts <= 0) {
    flag_error(err, prog, "--routing-stats",
               "the model has no routed experts, so there is no routing to record");
    problems++;
  }
  if (seen[F_TRACE_STEPS] && !o->trace) {
    flag_error(err, prog, "--trace-steps", "needs --trace FILE");
    problems++;
  }
  if (o->trace && !seen[F_TRACE_STEPS]) o->trace_first = o->trace_last = o->steps;
  if (seen[F_LR] && o->min_lr > o->lr) o->min_lr = o->lr;
  if (o->schedule_steps <= 0) o->schedule_steps = o->steps;
  return problems;
}

xm_status_t xm_rt_train_parse_flags(int argc, char **argv, const xm_rt_program_t *program,
                                    FILE *err, xm_rt_train_opts_t *out) {
  const char *prog = prog_name(argv);
  set_defaults(program, out);
  int seen[F_COUNT_] = {0};
  int problems = 0;
  for (int i = 1; i < argc; i++)
    problems += scan_one(argc, argv, &i, prog, out, seen, err);
  if (out->help && problems == 0) return XM_OK;
  problems += check_combinations(program, prog, seen, out, err);
  if (problems) {
    fprintf(err, "%s: run with --help for the list of flags\n", prog);
    return XM_ERR_INVALID_INPUT;
  }
  return XM_OK;
}

void xm_rt_train_print_usage(FILE *out, const char *prog, const xm_rt_program_t *program) {
  fprintf(out, "usage: %s --data PATH [flags]\n", prog);
  fprintf(out,
          "Trains the model '%s' compiled by xmoec (vocab %" PRId64 ", sequence length %" PRId64
          ", micro-batch %" PRId64 ", gradient accumulation %" PRId64 ").\n\n",
          program->model_name ? program->model_name : "?", program->vocab, program->seq_len,
          program->micro_batch, program->grad_accum);
  for (int i = 0; i < F_COUNT_; i++) {
    char left[40];
    snprintf(left, sizeof left, "%s%s%s", k_flags[i].name, k_flags[i].value ? " " : "",
             k_flags[i].value ? k_flags[i].value : "");
    fprintf(out, "  %-22s %s\n", left, k_flags[i].help);
  }
  int64_t dp = program->dp > 0 ? program->dp : 1, tp = program->tp > 0 ? program->tp : 1;
  int64_t ep = program->ep > 0 ? program->ep : 1;
  fprintf(out,
          "\nCompiled for dp %" PRId64 " x tp %" PRId64 " = %" PRId64 " rank%s (ep %" PRId64
          "%s%s%s)",
          dp, tp, dp * tp, dp * tp == 1 ? "" : "s", ep, program->ssmb ? ", ssmb" : "",
          program->rbd ? ", rbd" : "", program->zero ? ", zero1" : "");
  if (program->ranks_per_node > 0) fprintf(out, ", %d per node", program->ranks_per_node);
  if (dp * tp > 1)
    fprintf(out, ": start it with mpirun -np %" PRId64 " (or srun -n %" PRId64 ")", dp * tp,
            dp * tp);
  fprintf(out,
          ".\n\nEnvironment:\n"
          "  XM_RANKS_PER_NODE=N    the same as --ranks-per-node N\n"
          "  XM_NCCL_LIBRARY=PATH   the NCCL/RCCL library --comm nccl loads (default "
          "libnccl.so.2 / librccl.so.1)\n"
          "  OMP_NUM_THREADS=N      threads per rank (default: the cores of the machine divided "
          "among its ranks)\n"
          "  OMP_WAIT_POLICY, GOMP_SPINCOUNT, KMP_BLOCKTIME  OpenMP's spin-wait (default: a "
          "short spin)\n"
          "  OPENBLAS_CORETYPE=T    OpenBLAS's kernels (default: OpenBLAS's detection, raised "
          "to the CPU's level\n"
          "                         when it chose less, e.g. SkylakeX for a Xeon it takes for "
          "Prescott)\n"
          "  XM_NO_REEXEC=1         do not re-execute to apply the two defaults above\n"
          "  XM_CKPT_SHARD_BYTES=N, XM_CKPT_RENAME_EXCHANGE=0  checkpoint shard size and the "
          "save's exchange step (docs/checkpoints.md)\n"
          "  XM_EMU_SCHEDULE, XM_FAULT, XM_BLAS_TEST_DETECTED  tests only (the emulated GPU, fault "
          "injection)\n");
  fprintf(out, "\nExit codes: 0 success, 1 runtime failure, 2 bad flags or data. "
               "See docs/train.md.\n");
}

double xm_rt_train_lr(const xm_rt_train_opts_t *o, int64_t s) {
  if (o->warmup > 0 && s <= o->warmup) return o->lr * (double)s / (double)o->warmup;
  if (o->schedule == 1) return o->lr;
  double span = (double)(o->schedule_steps - o->warmup);
  double p = span > 0 ? (double)(s - o->warmup) / span : 1.0;
  if (p > 1.0) p = 1.0;
  if (p < 0.0) p = 0.0;
  if (o->schedule == 2) return o->min_lr + (o->lr - o->min_lr) * (1.0 - p);
  return o->min_lr + 0.5 * (o->lr - o->min_lr) * (1.0 + cos(M_PI * p));
}
