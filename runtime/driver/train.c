/* runtime/driver/train.c — the training driver that out/train runs
 * (runtime/driver/train.h; the user guide is docs/train.md).
 *
 * The generated program knows the model (tensor table, micro and step
 * functions); this file knows the run: flags, data, arenas, parameter
 * initialisation, the learning-rate schedule, checkpoints, progress and
 * evaluation. The order of work is chosen so that cheap mistakes fail
 * cheaply: flags, the program table, the data files and the checkpoint path
 * are all checked before MPI starts, and every later failure is agreed on by
 * all ranks (an all-reduce of the status) so that no rank is left waiting in
 * a collective for one that gave up.
 *
 * Determinism: parameters come from named RNG streams (runtime/io/rng.h), the
 * data windows from a position counter, and both are saved in checkpoints
 * with the optimizer state, so a run resumed from step k reproduces the
 * uninterrupted run bit for bit. --init-from is the other start: the
 * weights of a checkpoint (a Hugging Face one of the same architecture, or
 * ours) and everything else fresh (step 0, data position 0, the seed's
 * stream, zero optimizer states).
 *
 * Ranks. The program says which layout it was compiled for (dp, tp, ep,
 * ZeRO-1, ranks per node) and which of its tensors are slices or ZeRO-1
 * chunks; the driver refuses any other world size, builds the
 * communicator (runtime/comm/comm.h) the generated collectives use, and keeps
 * everything a user sees layout-independent: the data position counts
 * global windows (DP group d reads its share of each step's windows, the
 * TP ranks of a group the same ones), parameters get the values a 1-rank
 * run gives the same elements, and checkpoints hold whole tensors
 * (runtime/io/shard_io.h), so a run saved under one layout resumes under any
 * other. Reported losses are averaged over ranks; per-step traffic comes
 * from the communicator's counters.
 *
 * Tracing (--trace FILE, --trace-steps N[:M]): during the traced steps
 * x->trace points at a recorder (runtime/driver/trace.h) that the op hooks of the
 * generated code fill; outside them it is NULL and the hooks cost a branch.
 * After the last step the ranks' events are gathered to rank 0, which
 * writes the Chrome/Perfetto JSON that `xmoec inspect --format trace`
 * predicts (docs/inspect.md).
 */
#include "runtime/driver/train.h"

#include <errno.h>
#include <time.h>
#include <pthread.h>
#include <signal.h>
#include <fcntl.h>
#include <limits.h>
#include <inttypes.h>
#include <math.h>
#include <omp.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/io/checkpoint.h"
#include "runtime/comm/comm.h"
#include "runtime/io/data.h"
#include "runtime/driver/progress.h"
#include "runtime/driver/blas_core.h"
#include "runtime/moe/rbd_exec.h"
#include "runtime/moe/routing_stats.h"
#include "runtime/io/rng.h"
#include "runtime/io/shard_io.h"
#include "runtime/comm/transport.h"
#include "runtime/driver/trace.h"
#include "runtime/driver/train_flags.h"
#include "support/strbuf.h"

typedef struct {
  const xm_rt_program_t *p;
  xm_rt_train_opts_t o;
  const char *prog; /* basename of argv[0], for messages */
  xm_rt_context_t ctx;
  int have_ctx;
  xm_rt_exec_t x;
  xm_rt_data_t *data;
  xm_diag_t warnings;   /* printed by rank 0 once MPI is up */
  char *resume_path;    /* the resolved step directory; owned */
  char *init_path;      /* --init-from's directory, resolved; owned */
  xm_rt_backend_t *be;  /* the linked backend (xm_rt_backend_default) */
  int32_t *inputs_host; /* staging of tokens then labels for fill_inputs; owned */
  xm_rt_rng_t rng;      /* run stream, saved in checkpoints */
  int64_t step;         /* optimizer steps completed */
  int64_t data_pos;     /* next training window (before wrapping) */
  double last_loss, last_ce, last_mtp;
  int64_t last_saved; /* step of the last checkpoint written, or -1 */
  char *last_ckpt;    /* its directory; owned */
  double elapsed, tokens_per_s;
  double eval_loss;
  int64_t eval_batches;
  /* the parallel layout (program values, 0 read as 1) */
  int dp, tp, ep;
  int dp_index;               /* this rank's DP group index: rank / tp */
  xm_rt_comm_t *comm;         /* owned; NULL until MPI is up */
  xm_rt_rank_coords_t coords; /* this rank's place in every group */
  xm_rt_full_view_t view;     /* whole tensors, when sharded */
  int sharded;                /* the program has split or chunked tensors */
  char *last_traffic;         /* owned: the last step's "traffic":{...} member */
  xm_rt_trace_t *trace;       /* owned: the --trace recorder, or NULL */
  /* The watchdog (--timeout): the time of the last sign of progress, in
   * milliseconds of xm_rt_now, and where the run was then. */
  _Atomic long long beat_ms, beat_step, beat_micro;
  _Atomic int watch_stop;
  pthread_t watchdog;
  int watching;
} trainer_t;

/* A sign of progress for the watchdog: step s, micro-batch m (-1: the
 * optimizer step, -2: a checkpoint, -3: evaluation). */
static void beat(trainer_t *t, int64_t s, int64_t m) {
  t->beat_step = s;
  t->beat_micro = m;
  t->beat_ms = (long long)(xm_rt_now() * 1000.0);
}

/* ---- before MPI ----------------------------------------------------------- */

/* libgomp reads its wait policy once, when it loads. Its default (spin
 * ~300000 pauses, 7 ms on Zen 4, after each parallel region) is ruinous
 * when the cores are shared: a thread spins away its time slice while the
 * one it waits for is not running (measured: 30 steps of samples/tiny.json
 * took 44 s instead of 4 s next to other jobs). Passive waiting (sleep at
 * once) costs a futex wake-up per region, and a training step has hundreds
 * of short regions now that every GEMM is split over the team. A short
 * spin, GOMP_SPINCOUNT=1000 (~25 us), keeps the team awake across the
 * back-to-back regions of a step and gives the cores up soon when they are
 * wanted elsewhere (docs/benchmarks.md, "Training step profile"). OpenBLAS
 * too reads its kernel core once, and Debian's 0.3.21 takes the Intel
 * Xeons of family 6 model 207 for "Prescott" (SSE3 kernels: SGEMM 55
 * instead of 300 GFLOP/s on 2 threads). xm_rt_reexec_once
 * (runtime/driver/blas_core.h) sets both, unless the user chose them, and
 * execs the program once before anything else. */

static int64_t tensor_numel(const xm_rt_tensor_t *t) {
  int64_t n = 1;
  for (int i = 0; i < t->rank; i++)
    n *= t->dims[i];
  return n;
}

static int tensor_ok(const xm_rt_program_t *p, int i, int dtype, int64_t min_bytes) {
  if (i < 0 || i >= p->num_tensors) return 0;
  const xm_rt_tensor_t *t = &p->tensors[i];
  return t->dtype == dtype && t->bytes >= min_bytes;
}

/* The generated table is trusted by the kernels; check what the driver
 * itself relies on so that a code generator bug is a message, not a crash. */
static xm_status_t check_program(const xm_rt_program_t *p, const char *prog, FILE *err) {
  const char *why = NULL;
  int64_t in_bytes = p->micro_batch * p->seq_len * 4;
  if (p->vocab <= 0 || p->seq_len <= 0 || p->micro_batch <= 0 || p->grad_accum <= 0)
    why = "non-positive vocab, seq_len, micro_batch or grad_accum";
  else if (!p->micro || !p->step)
    why = "missing micro or step function";
  else if (p->dp < 0 || p->tp < 0 || p->ep < 0 || p->ranks_per_node < 0)
    why = "negative parallel degree (dp, tp, ep or ranks_per_node)";
  else if (p->num_tensors < 0 || (p->num_tensors > 0 && !p->tensors))
    why = "no tensor table";
  else if (!tensor_ok(p, p->tokens, XM_RT_I32, in_bytes) ||
           !tensor_ok(p, p->labels, XM_RT_I32, in_bytes))
    why = "tokens/labels are not i32[micro_batch, seq_len] tensors";
  else if (!tensor_ok(p, p->loss, XM_RT_F32, 4) || !tensor_ok(p, p->ce_loss, XM_RT_F32, 4) ||
           (p->has_mtp && !tensor_ok(p, p->mtp_loss, XM_RT_F32, 4)))
    why = "loss/ce_loss/mtp_loss are not f32 tensors";
  for (int i = 0; !why && i < p->num_tensors; i++) {
    const xm_rt_tensor_t *t = &p->tensors[i];
    int64_t arena = t->persistent ? p->persistent_bytes : p->activation_bytes;
    int64_t numel = tensor_numel(t);
    if (t->rank < 0 || t->rank > 6 || t->offset < 0 || t->bytes < 0 ||
        t->offset > arena - t->bytes || numel < 0 || numel > t->bytes / 4) {
      fprintf(err, "%s: internal error: tensor %d '%s' does not fit its arena\n", prog, i,
              t->name ? t->name : "?");
      return XM_ERR_INTERNAL;
    }
  }
  if (why) {
    fprintf(err, "%s: internal error: the program's tensor table is inconsistent: %s\n", prog, why);
    return XM_ERR_INTERNAL;
  }
  return XM_OK;
}

static char *path_join(const char *dir, const char *name) {
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  xm_strbuf_printf(&b, "%s/%s", dir, name);
  return xm_strbuf_take(&b);
}

static int is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* DIR/latest names the newest step directory; without it DIR is taken to
 * be a step directory itself (and must be one). */
static xm_status_t resolve_checkpoint(const char *dir, const char *prog, FILE *err, char **out) {
  *out = NULL;
  char *latest = path_join(dir, "latest");
  char *text = NULL;
  size_t len = 0;
  int rc = xm_read_file(latest, &text, &len);
  if (rc != 0 && rc != ENOENT) {
    char why[160];
    fprintf(err, "%s: error: %s: cannot read: %s\n", prog, latest,
            xm_read_error(rc, XM_READ_LIMIT_TEXT, why, sizeof why));
    free(latest);
    return XM_ERR_IO;
  }
  free(latest);
  if (rc == 0) {
    while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' '))
      text[--len] = '\0';
    if (len == 0 || strchr(text, '/')) {
      fprintf(err, "%s: error: %s/latest: expected the name of a step directory, got '%s'\n", prog,
              dir, text);
      free(text);
      return XM_ERR_INVALID_INPUT;
    }
    *out = path_join(dir, text);
    free(text);
  } else {
    *out = strdup(dir);
  }
  if (!*out) return XM_ERR_NO_MEMORY;
  /* A step directory that `latest` names may be missing after a save was
   * killed between its two renames: the loader then reads the complete
   * copy the save left beside it (docs/checkpoints.md), or says that there
   * is none. */
  if (rc != 0 && !is_dir(*out)) {
    fprintf(err,
            "%s: error: %s: not a checkpoint directory (no 'latest' file, and not a "
            "directory)\n",
            prog, *out);
    free(*out);
    *out = NULL;
    return XM_ERR_IO;
  }
  return XM_OK;
}

/* Flags, program table, data and checkpoint path: everything that can be
 * wrong with the input, checked without MPI. Messages go to `err`. */
static xm_status_t prepare(trainer_t *t, int argc, char **argv, FILE *err) {
  XM_RETURN_IF_ERROR(xm_rt_train_parse_flags(argc, argv, t->p, err, &t->o));
  if (t->o.help) return XM_OK;
  XM_RETURN_IF_ERROR(check_program(t->p, t->prog, err));
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_status_t st =
      xm_rt_data_open(t->o.data, t->p->vocab, t->p->seq_len, t->o.eval_fraction, &diag, &t->data);
  if (st != XM_OK) xm_diag_print(&diag, err);
  for (int i = 0; st == XM_OK && i < diag.count; i++) {
    const xm_diag_entry_t *e = &diag.entries[i];
    xm_diag_add(&t->warnings, e->level, e->file, e->place, "%s", e->message);
  }
  xm_diag_free(&diag);
  XM_RETURN_IF_ERROR(st);
  if (t->o.resume)
    XM_RETURN_IF_ERROR(resolve_checkpoint(t->o.resume, t->prog, err, &t->resume_path));
  if (t->o.init_from)
    XM_RETURN_IF_ERROR(resolve_checkpoint(t->o.init_from, t->prog, err, &t->init_path));
  return XM_OK;
}

/* ---- MPI-side set-up ------------------------------------------------------- */

/* Every rank learns whether any rank failed; the worst status wins. */
static xm_status_t agree(const trainer_t *t, xm_status_t st) {
  int local = (int)st, global = local;
  MPI_Allreduce(&local, &global, 1, MPI_INT, MPI_MAX, t->ctx.world_comm);
  return (xm_status_t)global;
}

/* This rank's index among the ranks of its machine, and their number. */
static void local_ranks(const trainer_t *t, int *index, int *count) {
  MPI_Comm shared;
  *index = 0;
  *count = 1;
  if (MPI_Comm_split_type(t->ctx.world_comm, MPI_COMM_TYPE_SHARED, t->ctx.rank, MPI_INFO_NULL,
                          &shared) == MPI_SUCCESS) {
    MPI_Comm_rank(shared, index);
    MPI_Comm_size(shared, count);
    MPI_Comm_free(&shared);
  }
}

/* The backend the program was linked with, prepared for this rank (the
 * CPU backend's thread policy, a GPU backend's device choice). */
static xm_status_t setup_backend(trainer_t *t, int *threads) {
  int index, count;
  local_ranks(t, &index, &count);
  t->be = xm_rt_backend_default();
  char err[256] = "";
  *threads = 1;
  if (t->be->init && t->be->init(t->be, index, count, threads, err, sizeof err) != 0) {
    fprintf(stderr, "%s: rank %d: error: the %s backend cannot start: %s\n", t->prog, t->ctx.rank,
            t->be->name, err[0] ? err : "no reason given");
    return XM_ERR_INTERNAL; /* exit 1: the machine, not the input */
  }
  return XM_OK;
}

/* Device address of tensor i (runtime/abi/backend.h: never dereferenced
 * here; copies and fills go through the backend). */
static unsigned char *tensor_ptr(const trainer_t *t, int i) {
  const xm_rt_tensor_t *d = &t->p->tensors[i];
  return (d->persistent ? t->x.persist : t->x.act) + d->offset;
}

/* The host image of the persistent arena to the device and back: after
 * initialisation and loads, before saves. Nothing to move when the image
 * is the arena (a host-visible backend). */
static void persist_upload(trainer_t *t) {
  xm_rt_exec_t *x = &t->x;
  if (x->persist_host != x->persist)
    x->be->copy_h2d(x->be, x->persist, x->persist_host, (size_t)t->p->persistent_bytes, x->stream);
  x->be->sync(x->be, x->stream);
}

static void persist_download(trainer_t *t) {
  xm_rt_exec_t *x = &t->x;
  if (x->persist_host != x->persist)
    x->be->read(x->be, x->persist_host, x->persist, (size_t)t->p->persistent_bytes, x->stream);
}

static xm_status_t setup_exec(trainer_t *t) {
  const xm_rt_program_t *p = t->p;
  xm_rt_exec_t *x = &t->x;
  memset(x, 0, sizeof *x);
  x->program = p;
  x->ctx = &t->ctx;
  x->be = t->be;
  x->stream = x->be->stream_create(x->be);
  /* The streams of the overlapped collectives, one per lane: without one
   * (a backend that cannot make a second stream or its events) that lane's
   * collectives run in order on the compute stream, which is correct, only
   * slower. */
  for (int i = 0; i < XM_RT_LANES; i++) {
    xm_rt_lane_t *l = &x->lane[i];
    l->stream = x->be->stream_create(x->be);
    l->fork = l->stream ? x->be->event_create(x->be) : NULL;
    l->done = l->fork ? x->be->event_create(x->be) : NULL;
    if (!l->done) {
      if (l->fork) x->be->event_destroy(x->be, l->fork);
      if (l->stream) x->be->stream_destroy(x->be, l->stream);
      *l = (xm_rt_lane_t){0};
    }
  }
  x->persist = x->be->alloc(x->be, (size_t)p->persistent_bytes);
  x->act = x->be->alloc(x->be, (size_t)p->activation_bytes);
  x->persist_host = x->be->host_visible ? x->persist : calloc(1, (size_t)p->persistent_bytes + 1);
  t->inputs_host = calloc((size_t)(2 * p->micro_batch * p->seq_len) + 1, sizeof(int32_t));
  if (!x->stream || !x->persist || !x->act || !x->persist_host || !t->inputs_host) {
    fprintf(stderr, "%s: rank %d: cannot allocate the arenas (%" PRId64 " + %" PRId64 " bytes)\n",
            t->prog, t->ctx.rank, p->persistent_bytes, p->activation_bytes);
    return XM_ERR_NO_MEMORY;
  }
  x->beta1 = (float)p->beta1;
  x->beta2 = (float)p->beta2;
  x->adam_eps = (float)p->adam_eps;
  x->weight_decay = (float)t->o.weight_decay;
  x->grad_clip = (float)t->o.clip;
  x->grad_scale = 1.0f;
  return XM_OK;
}

static xm_status_t choose_ranks_per_node(trainer_t *t);

/* The layout the program was compiled for against the world it runs on,
 * then the communicator and, for a sharded program, the full view that
 * checkpoints read and write. Every check here gives the same answer on
 * every rank (same program, same world), so ranks fail together. */
static xm_status_t setup_comm(trainer_t *t) {
  const xm_rt_program_t *p = t->p;
  t->dp = p->dp > 0 ? p->dp : 1;
  t->tp = p->tp > 0 ? p->tp : 1;
  t->ep = p->ep > 0 ? p->ep : 1;
  int64_t need = (int64_t)t->dp * t->tp;
  if (need != t->ctx.world) {
    if (t->ctx.rank == 0)
      fprintf(stderr,
              "%s: error: the program was compiled for dp %d x tp %d = %" PRId64
              " ranks, but it runs on %d rank%s (mpirun -np %" PRId64 ", or compile for %d)\n",
              t->prog, t->dp, t->tp, need, t->ctx.world, t->ctx.world == 1 ? "" : "s", need,
              t->ctx.world);
    return XM_ERR_INVALID_INPUT;
  }
  if (choose_ranks_per_node(t) != XM_OK) return XM_ERR_INVALID_INPUT; /* the same on every rank */
  xm_rt_comm_layout_t layout = {t->dp, t->tp, t->ep, t->ctx.world,
                                p->ranks_per_node > 0 ? p->ranks_per_node : 0};
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_status_t st = xm_rt_comm_create(&t->ctx, &layout, &diag, &t->comm);
  if (st == XM_OK) st = xm_rt_rank_coords(&t->comm->layout, t->ctx.rank, &t->coords);
  if (st == XM_OK) {
    t->dp_index = xm_rt_comm_group(t->comm, XM_RT_GROUP_DP)->index;
    t->sharded = xm_rt_program_is_sharded(p);
    if (t->sharded) st = xm_rt_full_view_create(p, &t->coords, &diag, &t->view);
  }
  if (st != XM_OK && t->ctx.rank == 0) {
    for (int i = 0; i < diag.count; i++)
      fprintf(stderr, "%s: error: %s%s%s\n", t->prog,
              diag.entries[i].place ? diag.entries[i].place : "", diag.entries[i].place ? ": " : "",
              diag.entries[i].message);
  }
  xm_diag_free(&diag);
  return agree(t, st);
}

/* The node size the ranks run with: --ranks-per-node, else
 * XM_RANKS_PER_NODE, else what MPI reports; except that a program
 * compiled for R ranks per node whose ranks all run on one machine
 * emulates nodes of R there (what the command `xmoec compile` prints does
 * on one machine), saying so. A real node size other than the compiled one
 * is an error with the ways out. The same answer on every rank (MPI's
 * node sizes are agreed on first). */
static xm_status_t choose_ranks_per_node(trainer_t *t) {
  const int want = t->p->ranks_per_node, world = t->ctx.world;
  int flag = (int)t->o.ranks_per_node;
  if (flag > 0) {
    if (world % flag != 0) {
      if (t->ctx.rank == 0)
        fprintf(stderr, "%s: error: --ranks-per-node %d does not divide the %d ranks\n", t->prog,
                flag, world);
      return XM_ERR_INVALID_INPUT;
    }
    return xm_rt_context_set_ranks_per_node(&t->ctx, flag);
  }
  if (t->ctx.rpn_from_env || want <= 0) return XM_OK;
  int lo = t->ctx.ranks_per_node, hi = lo;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_INT, MPI_MIN, t->ctx.world_comm);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_INT, MPI_MAX, t->ctx.world_comm);
  if (lo == want && hi == want) return XM_OK;
  if (lo == world && world % want == 0) {
    if (t->ctx.rank == 0 && !t->o.quiet)
      fprintf(stderr,
              "%s: note: all %d ranks run on one machine: emulating the compiled layout's %d "
              "nodes of %d ranks (as --ranks-per-node %d)\n",
              t->prog, world, world / want, want, want);
    return xm_rt_context_set_ranks_per_node(&t->ctx, want);
  }
  char placed[32];
  if (lo == hi)
    snprintf(placed, sizeof placed, "%d", lo);
  else
    snprintf(placed, sizeof placed, "%d to %d", lo, hi);
  if (t->ctx.rank == 0)
    fprintf(stderr,
            "%s: error: the program was compiled for %d ranks per node, but MPI places %s per "
            "node: start %d per node (Open MPI: mpirun --map-by ppr:%d:node; Slurm: srun "
            "--ntasks-per-node=%d), or pass --ranks-per-node %d to treat every %d consecutive "
            "ranks as a node, or compile for the machines' layout (xmoec compile "
            "--ranks-per-node)\n",
            t->prog, want, placed, want, want, want, want, want);
  return XM_ERR_INVALID_INPUT;
}

/* --comm: the transport of the collectives (runtime/comm/transport.h), for
 * the backend set up before. Collective; an explicit choice that cannot be
 * honoured gives the same message on every rank, printed by rank 0. */
static xm_status_t setup_transport(trainer_t *t) {
  _Static_assert(XM_RT_COMM_AUTO == 0 && XM_RT_COMM_NCCL == 1 && XM_RT_COMM_MPI == 2 &&
                     XM_RT_COMM_HOST == 3,
                 "train_flags.c lists the --comm values in xm_rt_comm_mode_t order");
  char err[1024] = "";
  xm_status_t st =
      xm_rt_transport_create(t->comm, t->be, (xm_rt_comm_mode_t)t->o.comm, err, sizeof err);
  if (st != XM_OK && t->ctx.rank == 0) fprintf(stderr, "%s: error: %s\n", t->prog, err);
  return agree(t, st);
}

/* ---- parameter initialisation ---------------------------------------------- */

/* The values a 1-rank run gives the full tensors, sliced to this rank's
 * pieces (runtime/io/shard_io.h); then the run's own stream. */
static xm_status_t init_params(trainer_t *t) {
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_status_t st = xm_rt_shard_init_params(t->p, &t->coords, t->o.seed, t->x.persist_host, &diag);
  if (st == XM_OK) persist_upload(t);
  if (st != XM_OK) xm_diag_print(&diag, stderr);
  xm_diag_free(&diag);
  xm_rt_rng_seed_named(&t->rng, t->o.seed, "train");
  return agree(t, st);
}

/* Elements of all params: of the full model when the program is sharded. */
static int64_t count_params(const trainer_t *t) {
  const xm_rt_program_t *p = t->sharded ? &t->view.program : t->p;
  int64_t n = 0;
  for (int i = 0; i < p->num_tensors; i++)
    if (p->tensors[i].category == XM_RT_CAT_WEIGHTS) n += tensor_numel(&p->tensors[i]);
  return n;
}

/* ---- checkpoints ----------------------------------------------------------- */

static xm_status_t mkdir_p(const char *path, const char *prog) {
  char *buf = strdup(path);
  if (!buf) return XM_ERR_NO_MEMORY;
  for (char *s = buf + 1;; s++) {
    if (*s != '/' && *s != '\0') continue;
    char saved = *s;
    *s = '\0';
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
      fprintf(stderr, "%s: error: %s: cannot create the directory: %s\n", prog, buf,
              strerror(errno));
      free(buf);
      return XM_ERR_IO;
    }
    *s = saved;
    if (!saved) break;
  }
  free(buf);
  if (!is_dir(path)) {
    fprintf(stderr, "%s: error: %s: not a directory\n", prog, path);
    return XM_ERR_IO;
  }
  return XM_OK;
}

/* --ckpt-dir before the first step: created if missing, and a file made
 * and removed in it, so that a run never trains for hours to fail at its
 * first save. Rank 0 checks; the answer is agreed on. */
static xm_status_t check_ckpt_dir(trainer_t *t) {
  if (!t->o.ckpt_dir) return XM_OK;
  xm_status_t st = XM_OK;
  if (t->ctx.rank == 0) {
    st = mkdir_p(t->o.ckpt_dir, t->prog);
    if (st == XM_OK) {
      char *probe = path_join(t->o.ckpt_dir, ".xmoec-write-test");
      int fd = probe ? open(probe, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
      int bad = fd < 0 || write(fd, "x", 1) != 1;
      int err = bad ? errno : 0;
      if (fd >= 0 && close(fd) != 0 && !bad) bad = 1, err = errno;
      if (probe) unlink(probe);
      free(probe);
      if (bad) {
        fprintf(stderr, "%s: error: %s: cannot write checkpoints there: %s\n", t->prog,
                t->o.ckpt_dir, strerror(err ? err : EIO));
        st = XM_ERR_IO;
      }
    }
  }
  return agree(t, st);
}

static xm_status_t agree_on_input(trainer_t *t, xm_status_t st, const char *msgs);

/* Every rank read the same files, so their messages are alike: one copy,
 * from the lowest rank that failed (or rank 0's warnings and notes); the
 * status every rank returns is the agreed one. Frees `diag`. */
static xm_status_t settle_checkpoint_diag(trainer_t *t, xm_status_t st, xm_diag_t *diag) {
  char *msgs = NULL;
  size_t msgs_len = 0;
  FILE *f = open_memstream(&msgs, &msgs_len);
  xm_diag_print(diag, f ? f : stderr);
  if (f) fclose(f);
  xm_diag_free(diag);
  st = agree_on_input(t, st, msgs);
  if (st == XM_OK && t->ctx.rank == 0 && msgs) fputs(msgs, stderr);
  free(msgs);
  return st;
}

/* DIR/latest is replaced atomically (write a temporary file, sync, rename)
 * so a reader sees either the old or the new name, never half of one. */
static xm_status_t write_latest(const char *dir, const char *name, const char *prog) {
  char *tmp = path_join(dir, "latest.tmp");
  char *dst = path_join(dir, "latest");
  FILE *f = fopen(tmp, "w");
  int ok = f && fprintf(f, "%s\n", name) > 0 && fflush(f) == 0 && fsync(fileno(f)) == 0;
  if (f && fclose(f) != 0) ok = 0;
  if (ok) xm_rt_ckpt_crash_point("latest");
  if (ok && rename(tmp, dst) != 0) ok = 0;
  if (!ok) fprintf(stderr, "%s: error: %s: cannot write: %s\n", prog, dst, strerror(errno));
  free(tmp);
  free(dst);
  return ok ? XM_OK : XM_ERR_IO;
}

static void fill_train_state(const trainer_t *t, xm_rt_train_state_t *st) {
  memset(st, 0, sizeof *st);
  st->step = t->step;
  st->data_pos = t->data_pos;
  memcpy(st->rng, t->rng.s, sizeof st->rng);
  st->last_loss = t->last_loss;
}

static xm_status_t save_checkpoint(trainer_t *t) {
  beat(t, t->step, -2);
  const char *dir = t->o.ckpt_dir;
  xm_status_t st = t->ctx.rank == 0 ? mkdir_p(dir, t->prog) : XM_OK;
  XM_RETURN_IF_ERROR(agree(t, st));
  char name[40];
  snprintf(name, sizeof name, "step-%06" PRId64, t->step);
  char *path = path_join(dir, name);
  xm_rt_train_state_t ts;
  fill_train_state(t, &ts);
  xm_diag_t diag;
  xm_diag_init(&diag);
  /* Collective: whole tensors gathered to rank 0, which writes them. */
  persist_download(t);
  st = xm_rt_shard_checkpoint_save(&t->x, t->comm, t->sharded ? &t->view : NULL, path, &ts, true,
                                   &diag);
  if (diag.count) xm_diag_print(&diag, stderr);
  xm_diag_free(&diag);
  if (st == XM_OK && t->ctx.rank == 0) st = write_latest(dir, name, t->prog);
  st = agree(t, st);
  if (st == XM_OK) {
    free(t->last_ckpt);
    t->last_ckpt = path;
    t->last_saved = t->step;
  } else {
    free(path);
  }
  return st;
}

static xm_status_t agree_on_input(trainer_t *t, xm_status_t st, const char *msgs);

static xm_status_t load_checkpoint(trainer_t *t) {
  xm_rt_train_state_t ts;
  memset(&ts, 0, sizeof ts);
  xm_diag_t diag;
  xm_diag_init(&diag);
  /* Collective: every rank reads the whole tensors and keeps its pieces;
   * the status is the same on every rank. Rank 0 prints its warnings,
   * any rank its errors. */
  xm_status_t st =
      xm_rt_shard_checkpoint_load(&t->x, t->comm, &t->coords, t->sharded ? &t->view : NULL,
                                  t->resume_path, !t->o.eval, &ts, &diag);
  XM_RETURN_IF_ERROR(settle_checkpoint_diag(t, st, &diag));
  persist_upload(t);
  if (ts.step < 0 || ts.data_pos < 0) {
    fprintf(stderr,
            "%s: error: %s: bad trainer state (step %" PRId64 ", data position %" PRId64 ")\n",
            t->prog, t->resume_path, ts.step, ts.data_pos);
    return XM_ERR_INVALID_INPUT;
  }
  t->step = ts.step;
  t->data_pos = ts.data_pos;
  t->last_loss = t->last_ce = ts.last_loss;
  t->last_mtp = NAN;
  if (ts.rng[0] | ts.rng[1] | ts.rng[2] | ts.rng[3]) memcpy(t->rng.s, ts.rng, sizeof ts.rng);
  return XM_OK;
}

/* --init-from: the weights of a Hugging Face checkpoint (or one of ours),
 * checked against the model as a whole (runtime/io/checkpoint.h,
 * xm_rt_checkpoint_import) and cut into this rank's pieces; the run itself
 * starts fresh: step 0, data position 0, the seed's RNG stream, zero
 * optimizer states. */
static xm_status_t import_checkpoint(trainer_t *t) {
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_status_t st = xm_rt_shard_checkpoint_import(&t->x, t->comm, &t->coords,
                                                 t->sharded ? &t->view : NULL, t->init_path, &diag);
  XM_RETURN_IF_ERROR(settle_checkpoint_diag(t, st, &diag));
  persist_upload(t);
  return XM_OK;
}

/* ---- micro-batches ---------------------------------------------------------- */

/* The ranks of a TP group compute on the same tokens (SSMB splits them
 * after they are read), so each reads the same windows of its own --data.
 * Files that differ between nodes would train without a symptom; every
 * micro-batch the group compares a 64-bit hash of its tokens and labels
 * (one MPI_MAX of {h, ~h}: both come back unchanged only when every member
 * holds h). A difference ends the run: the group's first rank says so,
 * once, and the others wait for its abort. */
static void check_tp_inputs(trainer_t *t, const int32_t *inputs, int64_t n, int eval,
                            int64_t first) {
  const xm_rt_comm_group_t *g = t->comm ? xm_rt_comm_group(t->comm, XM_RT_GROUP_TP) : NULL;
  if (!g || g->size < 2) return;
  uint64_t h = 1469598103934665603ull; /* FNV-1a over the bytes */
  const unsigned char *b = (const unsigned char *)inputs;
  for (int64_t i = 0; i < n * (int64_t)sizeof *inputs; i++)
    h = (h ^ b[i]) * 1099511628211ull;
  uint64_t v[2] = {h, ~h};
  MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_UINT64_T, MPI_MAX, g->comm);
  if (v[0] == h && v[1] == ~h) return;
  if (g->index == 0)
    xm_rt_abort(&t->ctx, 1,
                "the %s windows from %" PRId64 " differ between the ranks of tensor-parallel "
                "group %d..%d, which must read the same data: is --data %s the same file on "
                "every node?",
                eval ? "evaluation" : "training", first, g->members[0], g->members[g->size - 1],
                t->o.data);
  struct timespec ts = {3, 0};
  nanosleep(&ts, NULL);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Row b of the micro-batch gets window first + b (modulo the split). */
/* The windows are cut on the host, then copied to the input tensors. */
static void fill_inputs(trainer_t *t, int eval, int64_t first) {
  const xm_rt_program_t *p = t->p;
  int64_t n = p->micro_batch * p->seq_len;
  int32_t *tok = t->inputs_host, *lab = t->inputs_host + n;
  int64_t avail = eval ? xm_rt_data_eval_windows(t->data) : xm_rt_data_train_windows(t->data);
  for (int64_t b = 0; b < p->micro_batch; b++) {
    xm_diag_t diag;
    xm_diag_init(&diag);
    if (xm_rt_data_window(t->data, eval, (first + b) % avail, tok + b * p->seq_len,
                          lab + b * p->seq_len, &diag) != XM_OK) {
      /* One line: the data's own message (path and offset). */
      char msg[900] = "the data set changed during training";
      if (diag.count > 0) {
        const xm_diag_entry_t *e = &diag.entries[0];
        snprintf(msg, sizeof msg, "%s%s%s%s%s", e->file ? e->file : "", e->file ? ": " : "",
                 e->place ? e->place : "", e->place ? ": " : "", e->message);
      }
      xm_diag_free(&diag);
      xm_rt_fail(&t->x, "%s", msg);
    }
    xm_diag_free(&diag);
  }
  check_tp_inputs(t, t->inputs_host, 2 * n, eval, first);
  xm_rt_exec_t *x = &t->x;
  x->be->copy_h2d(x->be, tensor_ptr(t, p->tokens), tok, (size_t)n * sizeof *tok, x->stream);
  x->be->copy_h2d(x->be, tensor_ptr(t, p->labels), lab, (size_t)n * sizeof *lab, x->stream);
}

/* Gradient and load accumulators: what micro writes into the persistent
 * arena. Evaluation runs micro (forward and backward) but never step, so it
 * clears them to leave no trace. */
static void zero_accumulators(trainer_t *t) {
  const xm_rt_program_t *p = t->p;
  for (int i = 0; i < p->num_tensors; i++) {
    const xm_rt_tensor_t *d = &p->tensors[i];
    int acc = d->category == XM_RT_CAT_GRADS || d->accumulator;
    if (acc && d->persistent) xm_rt_zero(&t->x, tensor_ptr(t, i), d->bytes);
  }
}

static void reduce_mean(const trainer_t *t, double *v, int n) {
  if (t->ctx.world == 1) return;
  MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_SUM, t->ctx.world_comm);
  for (int i = 0; i < n; i++)
    v[i] /= t->ctx.world;
}

/* ---- evaluation -------------------------------------------------------------- */

/* Mean cross-entropy over `requested` batches of the evaluation split (0:
 * all of it). Batches never overlap; when the split is smaller than asked,
 * all of it is used and rank 0 says so. DP group d takes batches d, d + dp,
 * d + 2 dp, ... (its TP ranks the same ones); every rank runs the same
 * number of micro-batches, because the schedule's collectives need every
 * member, and a group short of batches repeats one without counting it.
 * The loss is the sum over counted batches divided by their number, each
 * batch having the same tokens: the 1-rank loss over the same windows. */
static xm_status_t run_eval(trainer_t *t, int64_t requested) {
  const xm_rt_program_t *p = t->p;
  int64_t avail = xm_rt_data_eval_windows(t->data), mb = p->micro_batch;
  int64_t whole = avail / mb;
  if (whole < 1) {
    if (t->ctx.rank == 0)
      fprintf(stderr,
              "%s: warning: the evaluation split has %" PRId64 " windows, fewer than one "
              "micro-batch of %" PRId64 "; windows repeat within the batch\n",
              t->prog, avail, mb);
    whole = 1;
  }
  int64_t n = requested ? requested : whole;
  if (n > whole) {
    if (t->ctx.rank == 0)
      fprintf(stderr,
              "%s: warning: --batches %" PRId64 ": the evaluation split holds %" PRId64
              " windows = %" PRId64 " batches of %" PRId64 "; using all of them\n",
              t->prog, n, avail, whole, mb);
    n = whole;
  }
  t->x.step = t->step > 0 ? t->step : 1;
  t->x.lr = 0.0f;
  double sums[2] = {0.0, 0.0}; /* ce over counted batches, counted batches */
  int64_t rounds = (n + t->dp - 1) / t->dp;
  for (int64_t r = 0; r < rounds; r++) {
    int64_t b = r * t->dp + t->dp_index;
    fill_inputs(t, 1, (b < n ? b : b % n) * mb);
    beat(t, t->step, -3);
    p->micro(&t->x);
    if (b < n) {
      sums[0] += t->x.host_ce_loss; /* the micro function's host_read */
      sums[1] += 1.0;
    }
    zero_accumulators(t);
  }
  if (t->ctx.world > 1)
    MPI_Allreduce(MPI_IN_PLACE, sums, 2, MPI_DOUBLE, MPI_SUM, t->ctx.world_comm);
  double ce = sums[1] > 0 ? sums[0] / sums[1] : NAN;
  if (!isfinite(ce)) {
    fprintf(stderr, "%s: rank %d: error: the evaluation loss is %g (not finite)\n", t->prog,
            t->ctx.rank, ce);
    return XM_ERR_INTERNAL;
  }
  t->eval_loss = ce;
  t->eval_batches = n;
  return XM_OK;
}

static void print_eval(const trainer_t *t) {
  if (t->ctx.rank != 0) return;
  int64_t tokens = t->eval_batches * t->p->micro_batch * t->p->seq_len;
  if (t->o.json) {
    xm_strbuf_t b;
    xm_strbuf_init(&b);
    xm_strbuf_puts(&b, "{\"loss\":");
    xm_rt_put_json_number(&b, t->eval_loss);
    xm_strbuf_printf(
        &b, ",\"tokens\":%" PRId64 ",\"batches\":%" PRId64 ",\"step\":%" PRId64 ",\"checkpoint\":",
        tokens, t->eval_batches, t->step);
    xm_strbuf_put_quoted(&b, t->resume_path ? t->resume_path : t->init_path);
    xm_strbuf_puts(&b, "}\n");
    fputs(xm_strbuf_cstr(&b), stdout);
    xm_strbuf_free(&b);
  } else if (!t->o.quiet) {
    printf("eval: loss %.6f over %" PRId64 " batches (%" PRId64
           " tokens), checkpoint %s (step %" PRId64 ")\n",
           t->eval_loss, t->eval_batches, tokens, t->resume_path ? t->resume_path : t->init_path,
           t->step);
  }
  fflush(stdout);
}

/* ---- training ------------------------------------------------------------------ */

/* One optimizer step: grad_accum micro-batches, then the program's step.
 * The step consumes micro_batch * grad_accum * dp consecutive windows from
 * data_pos (a global position): DP group d takes micro-batches
 * d * grad_accum .. (d + 1) * grad_accum - 1 of them, its TP ranks alike.
 * With dp 1 this is the 1-rank order. Returns the mean losses of this rank. */
static void train_step(trainer_t *t, int64_t s, double lr, double *loss, double *ce, double *mtp) {
  const xm_rt_program_t *p = t->p;
  t->x.lr = (float)lr;
  t->x.step = s;
  double sum = 0.0, sum_ce = 0.0, sum_mtp = 0.0;
  int64_t mine = t->data_pos + (int64_t)t->dp_index * p->grad_accum * p->micro_batch;
  for (int64_t m = 0; m < p->grad_accum; m++) {
    beat(t, s, m);
    fill_inputs(t, 0, mine + m * p->micro_batch);
    if (t->x.trace) xm_rt_trace_set(t->x.trace, s, (int)m);
    t->x.last_micro = m == p->grad_accum - 1; /* the overlapped reductions run then */
    p->micro(&t->x);
    t->x.last_micro = 0;
    sum += t->x.host_loss; /* read by the micro function's host_read ops */
    sum_ce += t->x.host_ce_loss;
    sum_mtp += t->x.host_mtp_loss; /* 0 without MTP */
  }
  t->data_pos += p->micro_batch * p->grad_accum * t->dp;
  *loss = sum / (double)p->grad_accum;
  *ce = sum_ce / (double)p->grad_accum;
  *mtp = sum_mtp / (double)p->grad_accum;
  if (xm_rt_fault(&t->x, "nan")) *loss = NAN; /* tests: runtime/comm/fail.c */
  if (!isfinite(*loss))
    xm_rt_abort(&t->ctx, 1,
                "step %" PRId64 ": the loss is %g (not finite); try a lower --lr or "
                "--clip, or check the data",
                s, *loss);
  t->x.lr = (float)lr;
  t->x.step = s;
  t->x.weight_decay = (float)t->o.weight_decay;
  t->x.grad_clip = (float)t->o.clip;
  if (t->x.trace) xm_rt_trace_set(t->x.trace, s, -1);
  beat(t, s, -1);
  p->step(&t->x);
  beat(t, s, -1);
}

/* Opens the --traffic file on rank 0 (appended to when resuming, like the
 * log); the status is agreed on. */
static xm_status_t open_traffic(trainer_t *t, FILE **out) {
  *out = NULL;
  xm_status_t st = XM_OK;
  if (t->o.traffic && t->ctx.rank == 0) {
    *out = fopen(t->o.traffic, t->o.resume ? "a" : "w");
    if (!*out) {
      fprintf(stderr, "%s: error: %s: cannot open the traffic file: %s\n", t->prog, t->o.traffic,
              strerror(errno));
      st = XM_ERR_IO;
    }
  }
  return agree(t, st);
}

/* Collective: the step's traffic summed to rank 0, which keeps its JSON
 * member for the log and the summary and writes the matrix lines. */
static xm_status_t report_traffic(trainer_t *t, int64_t s, FILE *matrix) {
  xm_strbuf_t json;
  xm_strbuf_init(&json);
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_status_t st =
      xm_rt_comm_traffic_report(t->comm, s, t->o.traffic != NULL, matrix, &diag, NULL, &json);
  if (st != XM_OK && t->ctx.rank == 0) {
    fprintf(stderr, "%s: error: %s: ", t->prog, t->o.traffic ? t->o.traffic : "traffic");
    for (int i = 0; i < diag.count; i++)
      fprintf(stderr, "%s%s", i ? "; " : "", diag.entries[i].message);
    fprintf(stderr, "\n");
  }
  xm_diag_free(&diag);
  if (st == XM_OK && t->p->rbd) {
    /* The step's inter-node dispatch rows: sent by RBD (one per (token,
     * node)) and what a flat dispatch of the same routing would send (one
     * per (token, expert) on another node), summed over the ranks. */
    int64_t v[2] = {0, 0};
    xm_rt_rbd_stats(&t->x, &v[0], &v[1], 1);
    MPI_Reduce(t->ctx.rank == 0 ? MPI_IN_PLACE : v, v, 2, MPI_INT64_T, MPI_SUM, 0,
               t->ctx.world_comm);
    if (t->ctx.rank == 0 && json.len)
      xm_strbuf_printf(&json,
                       ",\"rbd\":{\"inter_rows\":%" PRId64 ",\"flat_inter_rows\":%" PRId64 "}",
                       v[0], v[1]);
  }
  free(t->last_traffic);
  t->last_traffic = t->ctx.rank == 0 && json.len ? xm_strbuf_take(&json) : NULL;
  xm_strbuf_free(&json);
  return st;
}

/* --trace: the steps must overlap the run's (first..steps); rank 0 opens
 * the file now so that a bad path fails before training; every rank gets a
 * recorder. The checks give the same answer on every rank. */
static xm_status_t open_trace(trainer_t *t, int64_t first, FILE **out) {
  *out = NULL;
  if (!t->o.trace) return XM_OK;
  if (t->o.trace_last < first || t->o.trace_first > t->o.steps) {
    if (t->ctx.rank == 0)
      fprintf(stderr,
              "%s: error: --trace-steps: steps %" PRId64 "..%" PRId64
              " are not trained by this run (steps %" PRId64 "..%" PRId64 ")\n",
              t->prog, t->o.trace_first, t->o.trace_last, first, t->o.steps);
    return XM_ERR_INVALID_INPUT;
  }
  xm_status_t st = XM_OK;
  if (t->ctx.rank == 0) {
    *out = fopen(t->o.trace, "w");
    if (!*out) {
      fprintf(stderr, "%s: error: %s: cannot open the trace file: %s\n", t->prog, t->o.trace,
              strerror(errno));
      st = XM_ERR_IO;
    }
  }
  t->trace = xm_rt_trace_create();
  if (!t->trace && st == XM_OK) st = XM_ERR_NO_MEMORY;
  return agree(t, st);
}

/* Collective: every rank's events to rank 0, which writes and closes the
 * file. */
static xm_status_t finish_trace(trainer_t *t, FILE *f) {
  xm_status_t st = xm_rt_trace_write(t->trace, &t->ctx, t->p->model_name, f);
  if (f && fclose(f) != 0 && st == XM_OK) st = XM_ERR_IO;
  st = agree(t, st);
  if (t->ctx.rank == 0) {
    if (st != XM_OK)
      fprintf(stderr, "%s: error: %s: cannot write the trace (%s)\n", t->prog, t->o.trace,
              st == XM_ERR_NO_MEMORY ? "out of memory" : "write error");
    else if (xm_rt_trace_truncated(t->trace))
      fprintf(stderr, "%s: warning: %s: out of memory while tracing; later events are missing\n",
              t->prog, t->o.trace);
  }
  return st;
}

static xm_status_t train_loop(trainer_t *t) {
  const xm_rt_program_t *p = t->p;
  /* tokens of one optimizer step over all DP groups */
  int64_t per_step = p->grad_accum * p->micro_batch * p->seq_len * t->dp, first = t->step + 1;
  xm_rt_progress_t pr;
  xm_rt_progress_init(&pr, t->ctx.rank, t->o.progress, t->o.quiet, first, t->o.steps, stderr);
  xm_status_t st = XM_OK;
  if (t->o.log && t->ctx.rank == 0) {
    xm_diag_t diag;
    xm_diag_init(&diag);
    st = xm_rt_progress_open_log(&pr, t->o.log, t->o.resume != NULL, &diag);
    xm_diag_print(&diag, stderr);
    xm_diag_free(&diag);
  }
  XM_RETURN_IF_ERROR(agree(t, st));
  XM_RETURN_IF_ERROR(check_ckpt_dir(t));
  FILE *matrix = NULL, *trace = NULL;
  st = open_traffic(t, &matrix);
  if (st == XM_OK) st = open_trace(t, first, &trace);
  if (st != XM_OK) {
    xm_rt_progress_finish(&pr);
    if (matrix) fclose(matrix);
    if (trace) fclose(trace);
    return st;
  }
  xm_rt_routing_stats_t *routing = NULL;
  if (t->o.routing_stats) {
    xm_diag_t diag;
    xm_diag_init(&diag);
    st = agree(t, xm_rt_routing_stats_create(p, t->comm, t->o.routing_samples, &diag, &routing));
    if (st != XM_OK && t->ctx.rank == 0) {
      fprintf(stderr, "%s: error: %s: cannot record the routing statistics\n", t->prog,
              t->o.routing_stats);
      xm_diag_print(&diag, stderr);
    }
    xm_diag_free(&diag);
    t->x.routing_stats = routing;
  }
  double t0 = xm_rt_now();
  for (int64_t s = first; s <= t->o.steps && st == XM_OK; s++) {
    double lr = xm_rt_train_lr(&t->o, s), v[3];
    xm_rt_comm_traffic_reset(t->comm);
    int traced = t->trace && s >= t->o.trace_first && s <= t->o.trace_last;
    t->x.trace = traced ? t->trace : NULL;
    train_step(t, s, lr, &v[0], &v[1], &v[2]);
    t->x.trace = NULL;
    reduce_mean(t, v, 3);
    st = report_traffic(t, s, matrix);
    t->step = s;
    t->last_loss = v[0];
    t->last_ce = v[1];
    t->last_mtp = v[2];
    t->elapsed = xm_rt_now() - t0;
    t->tokens_per_s = t->elapsed > 0 ? (double)((s - first + 1) * per_step) / t->elapsed : 0.0;
    xm_rt_step_report_t r = {.step = s,
                             .loss = v[0],
                             .ce_loss = v[1],
                             .has_mtp = p->has_mtp,
                             .mtp_loss = v[2],
                             .mtp_weight = p->mtp_loss_weight,
                             .lr = lr,
                             .grad_norm = t->x.grad_norm,
                             .tokens = s * per_step,
                             .tokens_per_s = t->tokens_per_s,
                             .elapsed_s = t->elapsed,
                             .traffic = t->last_traffic};
    int werr = xm_rt_progress_step(&pr, &r);
    if (werr)
      fprintf(stderr, "%s: error: %s: cannot write the log: %s\n", t->prog, t->o.log,
              strerror(werr));
    int merr = matrix && (fflush(matrix) != 0 || ferror(matrix)) ? (errno ? errno : EIO) : 0;
    if (merr)
      fprintf(stderr, "%s: error: %s: cannot write the traffic file: %s\n", t->prog, t->o.traffic,
              strerror(merr));
    xm_status_t wst = agree(t, werr || merr ? XM_ERR_IO : XM_OK); /* rank 0 writes them */
    if (st == XM_OK) st = wst;
    if (st == XM_OK && t->o.save_every && s % t->o.save_every == 0) st = save_checkpoint(t);
  }
  if (st == XM_OK && t->o.ckpt_dir && t->last_saved != t->step) st = save_checkpoint(t);
  t->x.routing_stats = NULL; /* evaluations after training are not recorded */
  if (st == XM_OK && routing) {
    xm_diag_t diag;
    xm_diag_init(&diag);
    st =
        xm_rt_routing_stats_write(routing, t->comm, t->o.routing_stats, t->step - first + 1, &diag);
    if (t->ctx.rank == 0) xm_diag_print(&diag, stderr);
    xm_diag_free(&diag);
  }
  xm_rt_routing_stats_free(routing);
  int ferr = xm_rt_progress_finish(&pr);
  if (ferr)
    fprintf(stderr, "%s: error: %s: cannot write the log: %s\n", t->prog, t->o.log, strerror(ferr));
  xm_status_t fst = agree(t, ferr ? XM_ERR_IO : XM_OK);
  if (st == XM_OK) st = fst;
  if (st == XM_OK && t->trace) {
    st = finish_trace(t, trace);
    trace = NULL;
  }
  if (trace) fclose(trace);
  xm_status_t closed = XM_OK;
  if (matrix && fclose(matrix) != 0) {
    fprintf(stderr, "%s: error: %s: cannot write the traffic file: %s\n", t->prog, t->o.traffic,
            strerror(errno));
    closed = XM_ERR_IO;
  }
  closed = agree(t, closed);
  return st != XM_OK ? st : closed;
}

static void write_summary(const trainer_t *t, int64_t first);

/* The summary on stdout (rank 0); a failed write (stdout a full disk, a
 * closed pipe) is an error, agreed on. */
static xm_status_t print_summary(const trainer_t *t, int64_t first) {
  xm_status_t st = XM_OK;
  if (t->ctx.rank == 0) write_summary(t, first);
  if (t->ctx.rank == 0 && (fflush(stdout) != 0 || ferror(stdout))) {
    fprintf(stderr, "%s: error: cannot write the summary to stdout: %s\n", t->prog,
            strerror(errno ? errno : EIO));
    st = XM_ERR_IO;
  }
  return agree(t, st);
}

static void write_summary(const trainer_t *t, int64_t first) {
  int64_t steps = t->step - first + 1;
  if (steps < 0) steps = 0;
  int64_t tokens = steps * t->p->grad_accum * t->p->micro_batch * t->p->seq_len * t->dp;
  const xm_rt_step_report_t last = {.loss = t->last_loss,
                                    .ce_loss = t->last_ce,
                                    .has_mtp = t->p->has_mtp,
                                    .mtp_loss = t->last_mtp,
                                    .mtp_weight = t->p->mtp_loss_weight};
  if (t->o.json) {
    xm_strbuf_t b;
    xm_strbuf_init(&b);
    xm_strbuf_printf(&b,
                     "{\"steps\":%" PRId64 ",\"first_step\":%" PRId64 ",\"last_step\":%" PRId64
                     ",\"final_loss\":",
                     steps, first, t->step);
    xm_rt_put_json_number(&b, t->last_loss);
    xm_strbuf_puts(&b, ",\"final_ce_loss\":");
    xm_rt_put_json_number(&b, t->last_ce);
    if (last.has_mtp) {
      xm_strbuf_puts(&b, ",\"final_mtp_loss\":");
      xm_rt_put_json_number(&b, t->last_mtp);
    }
    xm_strbuf_puts(&b, ",\"final_aux_loss\":");
    xm_rt_put_json_number(&b, xm_rt_aux_loss(&last));
    xm_strbuf_printf(&b, ",\"tokens\":%" PRId64 ",\"tokens_per_s\":", tokens);
    xm_rt_put_json_number(&b, t->tokens_per_s);
    xm_strbuf_puts(&b, ",\"elapsed_s\":");
    xm_rt_put_json_number(&b, t->elapsed);
    xm_strbuf_puts(&b, ",\"checkpoint\":");
    if (t->last_ckpt)
      xm_strbuf_put_quoted(&b, t->last_ckpt);
    else
      xm_strbuf_puts(&b, "null");
    if (t->eval_batches) {
      xm_strbuf_puts(&b, ",\"eval_loss\":");
      xm_rt_put_json_number(&b, t->eval_loss);
    }
    const char *core = xm_blas_core_running();
    if (core) {
      xm_strbuf_puts(&b, ",\"blas_core\":");
      xm_strbuf_put_quoted(&b, core);
    }
    if (t->last_traffic) xm_strbuf_printf(&b, ",%s", t->last_traffic); /* the last step's */
    xm_strbuf_puts(&b, "}\n");
    fputs(xm_strbuf_cstr(&b), stdout);
    xm_strbuf_free(&b);
  } else if (!t->o.quiet) {
    char el[32];
    xm_rt_format_duration(t->elapsed, el, sizeof el);
    if (steps == 0)
      printf("trained no step (at step %" PRId64 ")", t->step);
    else {
      char mtp[40] = "";
      if (last.has_mtp) snprintf(mtp, sizeof mtp, ", mtp %.6f", t->last_mtp);
      printf("trained %" PRId64 " step%s (to step %" PRId64 "): final loss %.6f (ce %.6f%s, aux "
             "%.6f), %.0f tokens/s, %s elapsed",
             steps, steps == 1 ? "" : "s", t->step, t->last_loss, t->last_ce, mtp,
             xm_rt_aux_loss(&last), t->tokens_per_s, el);
    }
    if (t->eval_batches) printf(", eval loss %.6f", t->eval_loss);
    if (t->last_ckpt) printf(", checkpoint %s", t->last_ckpt);
    printf("\n");
  }
  fflush(stdout);
}

/* ---- the driver ------------------------------------------------------------------ */

static void print_banner(const trainer_t *t, int threads) {
  if (t->ctx.rank != 0 || t->o.quiet) return;
  static const char *const formats[] = {"raw text", "token file", "Megatron dataset"};
  const xm_rt_program_t *p = t->p;
  fprintf(stderr,
          "%s: model %s: %.3gM params, arenas %.1f MiB persistent + %.1f MiB activations per rank; "
          "data %s (%s, %" PRId64 " tokens: %" PRId64 " training / %" PRId64
          " evaluation windows of %" PRId64 "); %d rank%s x %d threads\n",
          t->prog, p->model_name ? p->model_name : "?", (double)count_params(t) / 1e6,
          (double)p->persistent_bytes / 1048576.0, (double)p->activation_bytes / 1048576.0,
          t->o.data, formats[xm_rt_data_format(t->data)], xm_rt_data_num_tokens(t->data),
          xm_rt_data_train_windows(t->data), xm_rt_data_eval_windows(t->data), p->seq_len,
          t->ctx.world, t->ctx.world == 1 ? "" : "s", threads);
  const xm_rt_comm_layout_t *l = &t->comm->layout;
  fprintf(stderr, "%s: layout dp%d tp%d ep%d zero%d%s%s on %d rank%s (%d per node)\n", t->prog,
          l->dp, l->tp, l->ep, p->zero, p->ssmb ? " ssmb" : "", p->rbd ? " rbd" : "", l->world,
          l->world == 1 ? "" : "s", l->ranks_per_node);
  if (t->comm->transport) fprintf(stderr, "%s: %s\n", t->prog, t->comm->transport->line);
  char blas[256];
  xm_blas_core_describe(blas, sizeof blas);
  if (blas[0]) fprintf(stderr, "%s: BLAS: %s\n", t->prog, blas);
  if (t->resume_path)
    fprintf(stderr, "%s: resuming from %s at step %" PRId64 "\n", t->prog, t->resume_path, t->step);
  if (t->init_path)
    fprintf(stderr, "%s: weights from %s; optimizer fresh, from step 0\n", t->prog, t->init_path);
}

/* --timeout: a rank that stops responding (a stopped process, a hung
 * device, a collective some member never joins) would leave the others
 * waiting in a collective forever. The watchdog thread of every rank ends
 * the run when there has been no sign of progress (a micro-batch, an
 * optimizer step, a checkpoint, an evaluation batch) for that long, with
 * where the rank was; ranks wait a second more per rank index (up to 10)
 * so the lowest one that is alive speaks first and its exit ends the job. */
static void *watchdog_main(void *arg) {
  trainer_t *t = arg;
  long long limit_ms =
      (long long)t->o.timeout * 1000 + (t->ctx.rank < 10 ? t->ctx.rank : 10) * 1000;
  while (!t->watch_stop) {
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
    long long idle = (long long)(xm_rt_now() * 1000.0) - t->beat_ms;
    if (t->watch_stop || idle <= limit_ms) continue;
    char where[64];
    long long m = t->beat_micro;
    if (m >= 0)
      snprintf(where, sizeof where, "micro-batch %lld of step %lld", m + 1, t->beat_step + 0);
    else
      snprintf(where, sizeof where, "%s of step %lld",
               m == -1   ? "the optimizer"
               : m == -2 ? "the checkpoint"
                         : "the evaluation",
               t->beat_step + 0);
    char msg[400];
    int n = snprintf(msg, sizeof msg,
                     "xmoec: rank %d: no progress for %lld s in %s: another rank stopped "
                     "responding or a collective is stuck; ending the run (--timeout %lld)\n",
                     t->ctx.rank, idle / 1000, where, (long long)t->o.timeout);
    ssize_t w = write(2, msg, n > 0 && (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
    (void)w;
    _exit(1);
  }
  return NULL;
}

static void watchdog_start(trainer_t *t) {
  beat(t, t->step, -1);
  if (t->o.timeout <= 0 || t->ctx.world == 1) return; /* one rank waits for no one */
  t->watch_stop = 0;
  t->watching = pthread_create(&t->watchdog, NULL, watchdog_main, t) == 0;
}

static void watchdog_stop(trainer_t *t) {
  if (!t->watching) return;
  t->watch_stop = 1;
  pthread_join(t->watchdog, NULL);
  t->watching = 0;
}

static xm_status_t run(trainer_t *t) {
  int threads = 1;
  XM_RETURN_IF_ERROR(agree(t, setup_backend(t, &threads)));
  if (t->ctx.rank == 0) xm_diag_print(&t->warnings, stderr);
  XM_RETURN_IF_ERROR(setup_comm(t));
  XM_RETURN_IF_ERROR(setup_transport(t));
  XM_RETURN_IF_ERROR(agree(t, setup_exec(t)));
  t->x.comm = t->comm;
  XM_RETURN_IF_ERROR(init_params(t));
  if (t->resume_path) XM_RETURN_IF_ERROR(load_checkpoint(t));
  if (t->init_path) XM_RETURN_IF_ERROR(import_checkpoint(t));
  if (t->o.eval) {
    watchdog_start(t);
    xm_status_t est = run_eval(t, t->o.batches);
    watchdog_stop(t);
    XM_RETURN_IF_ERROR(est);
    print_eval(t);
    xm_status_t st = XM_OK;
    if (t->ctx.rank == 0 && (fflush(stdout) != 0 || ferror(stdout))) {
      fprintf(stderr, "%s: error: cannot write the evaluation to stdout: %s\n", t->prog,
              strerror(errno ? errno : EIO));
      st = XM_ERR_IO;
    }
    return agree(t, st);
  }
  print_banner(t, threads);
  int64_t first = t->step + 1;
  if (first > t->o.steps && t->ctx.rank == 0 && !t->o.quiet) {
    if (t->resume_path)
      fprintf(stderr,
              "%s: the checkpoint is at step %" PRId64 ", --steps is %" PRId64
              ": nothing to train\n",
              t->prog, t->step, t->o.steps);
    else
      fprintf(stderr, "%s: --steps is 0: nothing to train%s\n", t->prog,
              t->o.ckpt_dir ? "; the initial weights are saved" : "");
  }
  watchdog_start(t);
  xm_status_t st = train_loop(t);
  if (st == XM_OK && t->o.batches) st = run_eval(t, t->o.batches);
  watchdog_stop(t);
  XM_RETURN_IF_ERROR(st);
  return print_summary(t, first);
}

static void cleanup(trainer_t *t) {
  free(t->inputs_host);
  if (t->x.be) {
    t->x.be->sync(t->x.be, NULL); /* every stream, the lanes' too */
    if (t->x.persist_host != t->x.persist) free(t->x.persist_host);
    t->x.be->free(t->x.be, t->x.persist);
    t->x.be->free(t->x.be, t->x.act);
    if (t->x.stream) t->x.be->stream_destroy(t->x.be, t->x.stream);
    for (int i = 0; i < XM_RT_LANES; i++) {
      xm_rt_lane_t *l = &t->x.lane[i];
      if (!l->stream) continue;
      t->x.be->event_destroy(t->x.be, l->fork);
      t->x.be->event_destroy(t->x.be, l->done);
      t->x.be->stream_destroy(t->x.be, l->stream);
    }
  }
  xm_rt_data_close(t->data);
  xm_diag_free(&t->warnings);
  free(t->resume_path);
  free(t->init_path);
  free(t->last_ckpt);
  free(t->last_traffic);
  xm_rt_trace_destroy(t->trace);
  xm_rt_rbd_exec_free(&t->x);
  xm_rt_full_view_destroy(&t->view);
  if (t->comm) xm_rt_comm_destroy(t->comm); /* collective: every rank gets here */
  if (t->have_ctx) xm_rt_context_destroy(&t->ctx);
}

/* Whether a launcher (mpirun, srun with PMI/PMIx) started this process as
 * one rank of a job; false for a plain `out/train ...`. */
static bool launched_by_mpirun(void) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v) return true;
  }
  return false;
}

/* The input checks of every rank agreed on: the worst status wins, and the
 * lowest rank that failed prints its messages, each line prefixed with its
 * rank when there are several ranks. */
static xm_status_t agree_on_input(trainer_t *t, xm_status_t st, const char *msgs) {
  int mine = st != XM_OK ? t->ctx.rank : INT_MAX, first = mine;
  int worst = (int)st;
  if (t->ctx.world > 1) {
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, t->ctx.world_comm);
    MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_INT, MPI_MAX, t->ctx.world_comm);
  }
  if (first == INT_MAX) return XM_OK;
  if (t->ctx.rank == first && msgs) {
    if (t->ctx.world == 1) {
      fputs(msgs, stderr);
    } else {
      for (const char *line = msgs; *line;) {
        const char *nl = strchr(line, '\n');
        size_t n = nl ? (size_t)(nl - line) : strlen(line);
        fprintf(stderr, "[rank %d] %.*s\n", first, (int)n, line);
        line += n + (nl ? 1 : 0);
      }
    }
    fflush(stderr);
  }
  return (xm_status_t)worst;
}

int xm_rt_train_main(int argc, char **argv, const xm_rt_program_t *program) {
  /* A file-size limit (ulimit -f) makes writes fail with EFBIG, reported
   * like any write error, instead of killing the program with SIGXFSZ. */
  signal(SIGXFSZ, SIG_IGN);
  xm_rt_reexec_once(argv);
  trainer_t t;
  memset(&t, 0, sizeof t);
  t.p = program;
  const char *slash = argv && argv[0] ? strrchr(argv[0], '/') : NULL;
  t.prog = slash ? slash + 1 : (argv && argv[0] ? argv[0] : "train");
  t.last_saved = -1;
  t.last_loss = t.last_ce = t.last_mtp = NAN; /* no step yet: the summary's losses are null */
  xm_diag_init(&t.warnings);
  /* What is wrong with the input is the same on every rank as a rule: the
   * messages are kept, and once MPI runs, only the lowest rank that failed
   * prints them (one copy, not one per rank interleaved). */
  char *msgs = NULL;
  size_t msgs_len = 0;
  FILE *err = open_memstream(&msgs, &msgs_len);
  xm_status_t st = prepare(&t, argc, argv, err ? err : stderr);
  if (err) fclose(err);
  if (st == XM_OK && t.o.help) {
    xm_rt_train_print_usage(stdout, t.prog, program);
  } else if (st != XM_OK && !launched_by_mpirun()) {
    /* One process that no launcher started: nothing to agree with, so the
     * messages go out without the cost of starting MPI (about 0.3 s). */
    if (msgs_len) fputs(msgs, stderr);
  } else {
    xm_status_t cs = xm_rt_context_create(&argc, &argv, &t.ctx);
    t.have_ctx = cs == XM_OK;
    if (cs != XM_OK) {
      if (msgs_len) fputs(msgs, stderr);
      if (st == XM_OK) st = cs;
    } else {
      st = agree_on_input(&t, st, msgs);
      if (st == XM_OK) st = run(&t);
    }
  }
  free(msgs);
  cleanup(&t);
  return xm_status_exit_code(st);
}
