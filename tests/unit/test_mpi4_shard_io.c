/* tests/unit/test_mpi4_shard_io.c — whole tensors from per-rank pieces on
 * 4 ranks as 2 emulated nodes of 2 (runtime/io/shard_io.h).
 *
 * The program tables are written here for a small model under three
 * layouts: a TP-split matrix (split dim 1), an EP-split stacked expert
 * tensor ("{e}", split dim 0), two whole params, an i32 load state, and
 * AdamW moments that are ZeRO-1 chunks (over DP, over EDP for the experts)
 * or split like their param. Every piece is filled with a value derived
 * from its element's global index, so each check compares against a
 * formula, not against another MPI call:
 *
 *  - gather to rank 0 (params and optimizer states, then params only):
 *    every element of the full arena;
 *  - scatter back (the load path) into zeroed local arenas: equal to the
 *    pieces that were gathered, chunk padding zero;
 *  - sliced initialisation equals the slice of the 1-rank initialisation,
 *    checked per rank and again after gathering;
 *  - a checkpoint saved under dp2 tp2 ep2 zero1 holds the same
 *    model.safetensors and optimizer.safetensors bytes as a 1-rank program
 *    of the full model saving the same values, and loads under dp4 ep4
 *    without ZeRO and dp4 ep2 zero1 with every element in place;
 *  - the training driver (runtime/driver/train.h) run in-process on a toy
 *    multi-rank program (a data-parallel bigram model with a TP-split and
 *    an EP-split param in an auxiliary loss, its collectives made through
 *    runtime/comm/comm.h) under dp2 tp2 ep2, dp4 ep4 and tp4 ep2 with the same
 *    global batch: the windows each rank reads, equal losses across
 *    layouts, a run saved under one layout and resumed under another
 *    matching the straight run, equal evaluation losses, the world-size
 *    check, the layout banner, the traffic member of the log and the
 *    --traffic matrix file.
 *
 * A plain main() (MPI starts once per process); failed checks are counted
 * and printed with the rank, and every rank keeps making the same
 * collective calls so a failure never turns into a hang.
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpi_check.h"
#include "runtime/io/data.h"
#include "runtime/cpu/kernels.h"
#include "runtime/io/rng.h"
#include "runtime/io/shard_io.h"
#include "runtime/driver/train.h"
#include "support/strbuf.h"

/* ---- the model and its tables ---------------------------------------------------- */

enum { EMB, Q, UP, NORM, BIAS, NPARAM };
enum { G0 = NPARAM, M0 = G0 + 4, LOAD = M0 + 8, NT };
#define M_OF(j) (M0 + 2 * (j))
#define V_OF(j) (M0 + 2 * (j) + 1)

#define Q_NAME "model.layers.0.self_attn.q_proj.weight"
#define UP_NAME "model.layers.0.mlp.experts.{e}.up_proj.weight"
#define GROUP(k) ((k) + 1)

static const struct {
  const char *name;
  int rank;
  int64_t dims[3]; /* full */
  int init;
  float std;
  int split_group, split_dim, chunk_group; /* chunk_group: of its moments under ZeRO-1 */
} k_params[NPARAM] = {
    {"model.embed_tokens.weight",
     2,
     {8, 4, 0},
     XM_RT_INIT_NORMAL,
     0.5f,
     0,
     0,
     GROUP(XM_RT_GROUP_DP)},
    {Q_NAME,
     2,
     {4, 8, 0},
     XM_RT_INIT_NORMAL,
     1.0f,
     GROUP(XM_RT_GROUP_TP),
     1,
     GROUP(XM_RT_GROUP_DP)},
    {UP_NAME,
     3,
     {4, 3, 2},
     XM_RT_INIT_NORMAL,
     1.0f,
     GROUP(XM_RT_GROUP_EP),
     0,
     GROUP(XM_RT_GROUP_EDP)},
    {"model.norm.weight", 1, {5, 0, 0}, XM_RT_INIT_ONES, 0.0f, 0, 0, GROUP(XM_RT_GROUP_DP)},
    {"model.layers.0.mlp.gate.e_score_correction_bias",
     1,
     {4, 0, 0},
     XM_RT_INIT_ZEROS,
     0.0f,
     0,
     0,
     0},
};

typedef struct {
  int dp, tp, ep, zero;
} lay_t;

typedef struct {
  lay_t lay;
  char names[NT][128];
  xm_rt_tensor_t t[NT];
  xm_rt_program_t p;
} table_t;

static int64_t numel(const xm_rt_tensor_t *t) {
  int64_t n = 1;
  for (int d = 0; d < t->rank; d++)
    n *= t->dims[d];
  return n;
}

static void place(table_t *T, int i, int64_t *offset) {
  T->t[i].persistent = 1;
  T->t[i].offset = *offset;
  T->t[i].bytes = numel(&T->t[i]) * 4;
  *offset += (T->t[i].bytes + 63) / 64 * 64;
}

/* The local table of layout `lay` (world 4 unless all degrees are 1). */
static void build_table(table_t *T, lay_t lay) {
  memset(T, 0, sizeof *T);
  T->lay = lay;
  int64_t offset = 0;
  int world = lay.dp * lay.tp;
  for (int j = 0; j < NPARAM; j++) {
    xm_rt_tensor_t *t = &T->t[j];
    snprintf(T->names[j], sizeof T->names[j], "%s", k_params[j].name);
    t->name = T->names[j];
    t->category = XM_RT_CAT_WEIGHTS;
    t->dtype = XM_RT_F32;
    t->rank = k_params[j].rank;
    memcpy(t->dims, k_params[j].dims, sizeof k_params[j].dims);
    t->init = k_params[j].init;
    t->init_std = k_params[j].std;
    t->trainable = j != BIAS;
    t->param = -1;
    t->split_group = k_params[j].split_group;
    t->split_dim = k_params[j].split_dim;
    if (t->split_group == GROUP(XM_RT_GROUP_TP)) t->dims[t->split_dim] /= lay.tp;
    if (t->split_group == GROUP(XM_RT_GROUP_EP)) t->dims[t->split_dim] /= lay.ep;
    place(T, j, &offset);
  }
  for (int j = 0; j < 4; j++) { /* grads, split like their param */
    xm_rt_tensor_t *g = &T->t[G0 + j];
    *g = T->t[j];
    snprintf(T->names[G0 + j], sizeof T->names[0], "%s.grad", k_params[j].name);
    g->name = T->names[G0 + j];
    g->category = XM_RT_CAT_GRADS;
    g->init = XM_RT_INIT_ZEROS;
    g->param = j;
    place(T, G0 + j, &offset);
  }
  for (int j = 0; j < 4; j++) {
    for (int k = 0; k < 2; k++) {
      int i = k ? V_OF(j) : M_OF(j);
      xm_rt_tensor_t *m = &T->t[i];
      *m = T->t[j];
      snprintf(T->names[i], sizeof T->names[0], "%s.%s", k_params[j].name,
               k ? "exp_avg_sq" : "exp_avg");
      m->name = T->names[i];
      m->category = XM_RT_CAT_OPTIMIZER;
      m->init = XM_RT_INIT_ZEROS;
      m->param = j;
      if (lay.zero) {
        int cg = k_params[j].chunk_group;
        int P = cg == GROUP(XM_RT_GROUP_EDP) ? world / lay.ep : lay.dp;
        m->split_group = 0;
        m->split_dim = 0;
        m->chunk_group = cg;
        m->rank = 1;
        memset(m->dims, 0, sizeof m->dims);
        m->dims[0] = (numel(&T->t[j]) + P - 1) / P;
      }
      place(T, i, &offset);
    }
  }
  xm_rt_tensor_t *ld = &T->t[LOAD];
  snprintf(T->names[LOAD], sizeof T->names[0], "model.layers.0.mlp.gate.load");
  ld->name = T->names[LOAD];
  ld->accumulator = 1;
  ld->category = XM_RT_CAT_OPTIMIZER;
  ld->dtype = XM_RT_I32;
  ld->rank = 1;
  ld->dims[0] = 4;
  ld->param = BIAS;
  place(T, LOAD, &offset);
  xm_rt_program_t *p = &T->p;
  p->model_name = "shard-io-test";
  p->config_json = "{\"hidden_size\": 4}\n";
  p->spec_json = "{}\n";
  p->vocab = 8, p->seq_len = 4, p->micro_batch = 1, p->grad_accum = 1;
  p->lr = 1e-3, p->beta1 = 0.9, p->beta2 = 0.95, p->adam_eps = 1e-8;
  p->seed = 7;
  p->dp = lay.dp, p->tp = lay.tp, p->ep = lay.ep, p->zero = lay.zero, p->ranks_per_node = 2;
  p->persistent_bytes = offset;
  p->num_tensors = NT;
  p->tensors = T->t;
  p->tokens = p->labels = p->loss = p->ce_loss = -1;
}

static int stored(const xm_rt_tensor_t *t) {
  return t->category == XM_RT_CAT_WEIGHTS || t->category == XM_RT_CAT_OPTIMIZER;
}

/* The value of element `at` of full tensor `ti`: exact in fp32. */
static float value_of(int ti, int64_t at) { return (float)(ti * 1000 + at); }

/* Fills this rank's pieces with value_of (padding zero); grads with -7. */
static void fill_pieces(const table_t *T, const xm_rt_rank_coords_t *rc, unsigned char *arena) {
  for (int i = 0; i < NT; i++) {
    const xm_rt_tensor_t *t = &T->t[i];
    if (t->category == XM_RT_CAT_GRADS) {
      for (int64_t k = 0; k < numel(t); k++)
        ((float *)(arena + t->offset))[k] = -7.0f;
      continue;
    }
    xm_rt_piece_t pc;
    CHECK(xm_rt_piece_of(&T->p, i, rc, NULL, &pc) == XM_OK, "piece of %s", t->name);
    for (int64_t k = 0; k < pc.buffer_elems; k++) {
      int64_t e = pc.lo + k;
      float v = e < pc.hi ? value_of(i, xm_rt_piece_full_offset(&pc, e)) : 0.0f;
      if (t->dtype == XM_RT_I32)
        ((int32_t *)(arena + t->offset))[k] = (int32_t)v;
      else
        ((float *)(arena + t->offset))[k] = v;
    }
  }
}

/* Every element of this rank's pieces against value_of. */
static void check_pieces(const table_t *T, const xm_rt_rank_coords_t *rc,
                         const unsigned char *arena, const char *what) {
  int bad = 0;
  for (int i = 0; i < NT; i++) {
    const xm_rt_tensor_t *t = &T->t[i];
    if (!stored(t)) continue;
    xm_rt_piece_t pc;
    if (xm_rt_piece_of(&T->p, i, rc, NULL, &pc) != XM_OK) {
      bad++;
      continue;
    }
    for (int64_t k = 0; k < pc.buffer_elems; k++) {
      int64_t e = pc.lo + k;
      float want = e < pc.hi ? value_of(i, xm_rt_piece_full_offset(&pc, e)) : 0.0f;
      float got = t->dtype == XM_RT_I32 ? (float)((const int32_t *)(arena + t->offset))[k]
                                        : ((const float *)(arena + t->offset))[k];
      if (got != want && bad++ < 5)
        fprintf(stderr, "rank %d: %s: %s[%lld] = %g, want %g\n", g_rank, what, t->name,
                (long long)k, got, want);
    }
  }
  CHECK(bad == 0, "%s: %d wrong elements", what, bad);
}

/* Every element of a full arena against value_of (optimizer states zero
 * when not with_optimizer). */
static void check_full(const xm_rt_full_view_t *v, const unsigned char *full, int with_optimizer,
                       const char *what) {
  int bad = 0;
  for (int i = 0; i < NT; i++) {
    const xm_rt_tensor_t *f = &v->tensors[i];
    if (!stored(f)) continue;
    int zero = f->category == XM_RT_CAT_OPTIMIZER && !with_optimizer;
    for (int64_t k = 0; k < numel(f); k++) {
      float want = zero ? 0.0f : value_of(i, k);
      float got = f->dtype == XM_RT_I32 ? (float)((const int32_t *)(full + f->offset))[k]
                                        : ((const float *)(full + f->offset))[k];
      if (got != want && bad++ < 5)
        fprintf(stderr, "rank %d: %s: %s[%lld] = %g, want %g\n", g_rank, what, f->name,
                (long long)k, got, want);
    }
  }
  CHECK(bad == 0, "%s: %d wrong elements", what, bad);
}

/* ---- a layout on the running world ------------------------------------------------------ */

typedef struct {
  table_t T;
  xm_rt_comm_t *comm;
  xm_rt_rank_coords_t rc;
  xm_rt_full_view_t view;
  unsigned char *arena;
  xm_rt_exec_t x;
} run_t;

static void run_open(run_t *r, const xm_rt_context_t *ctx, lay_t lay) {
  memset(r, 0, sizeof *r);
  build_table(&r->T, lay);
  xm_rt_comm_layout_t l = {lay.dp, lay.tp, lay.ep, 0, 0};
  xm_diag_t diag;
  xm_diag_init(&diag);
  CHECK(xm_rt_comm_create(ctx, &l, &diag, &r->comm) == XM_OK, "dp%d tp%d ep%d: create", lay.dp,
        lay.tp, lay.ep);
  CHECK(xm_rt_rank_coords(&r->comm->layout, ctx->rank, &r->rc) == XM_OK, "coords");
  /* the coordinates computed without MPI are the communicator's groups */
  for (int k = 0; k < XM_RT_GROUP_COUNT; k++) {
    const xm_rt_comm_group_t *g = xm_rt_comm_group(r->comm, (xm_rt_group_kind_t)k);
    CHECK(g->index == r->rc.index[k] && g->size == r->rc.size[k],
          "%s group: comm index %d size %d, coords %d %d", xm_rt_group_name(k), g->index, g->size,
          r->rc.index[k], r->rc.size[k]);
  }
  CHECK(xm_rt_program_is_sharded(&r->T.p), "table not sharded");
  CHECK(xm_rt_full_view_create(&r->T.p, &r->rc, &diag, &r->view) == XM_OK, "full view");
  if (diag.count) xm_diag_print(&diag, stderr);
  xm_diag_free(&diag);
  r->arena = calloc(1, (size_t)r->T.p.persistent_bytes);
  r->x.program = &r->T.p;
  r->x.ctx = ctx;
  r->x.persist = r->arena;
  r->x.persist_host = r->arena;
  r->x.comm = r->comm;
  r->x.lr = 1e-3f;
  r->x.beta1 = 0.9f, r->x.beta2 = 0.95f, r->x.adam_eps = 1e-8f;
}

static void run_close(run_t *r) {
  xm_rt_full_view_destroy(&r->view);
  xm_rt_comm_destroy(r->comm);
  free(r->arena);
}

static unsigned char *gather_full(run_t *r, int with_optimizer) {
  unsigned char *full = g_rank == 0 ? calloc(1, (size_t)r->view.program.persistent_bytes) : NULL;
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_status_t st = xm_rt_shard_gather(&r->x, r->comm, &r->view, with_optimizer, full, &diag);
  CHECK(st == XM_OK, "gather: %s", diag.count ? diag.entries[0].message : "?");
  xm_diag_free(&diag);
  return full;
}

/* ---- the checks --------------------------------------------------------------------- */

/* Gather to rank 0, check it, broadcast it, scatter into zeroed arenas. */
static void check_gather_scatter(const xm_rt_context_t *ctx, lay_t lay) {
  run_t r;
  run_open(&r, ctx, lay);
  fill_pieces(&r.T, &r.rc, r.arena);
  check_pieces(&r.T, &r.rc, r.arena, "fill");
  int64_t bytes = r.view.program.persistent_bytes;
  unsigned char *full = gather_full(&r, 1);
  if (g_rank == 0) check_full(&r.view, full, 1, "gather");
  unsigned char *weights_only = gather_full(&r, 0);
  if (g_rank == 0) check_full(&r.view, weights_only, 0, "gather without the optimizer");
  free(weights_only);
  if (g_rank != 0) full = calloc(1, (size_t)bytes);
  MPI_Bcast(full, (int)bytes, MPI_BYTE, 0, ctx->world_comm);
  unsigned char *before = malloc((size_t)r.T.p.persistent_bytes);
  memcpy(before, r.arena, (size_t)r.T.p.persistent_bytes);
  memset(r.arena, 0, (size_t)r.T.p.persistent_bytes);
  CHECK(xm_rt_shard_scatter(&r.x, &r.rc, &r.view, full, NULL) == XM_OK, "scatter");
  check_pieces(&r.T, &r.rc, r.arena, "scatter");
  for (int i = 0; i < NT; i++) {
    const xm_rt_tensor_t *t = &r.T.t[i];
    if (stored(t))
      CHECK(memcmp(before + t->offset, r.arena + t->offset, (size_t)t->bytes) == 0,
            "scatter: %s differs from the gathered piece", t->name);
  }
  free(before);
  free(full);
  run_close(&r);
}

/* Sliced init = the slice of the 1-rank init, per rank and gathered. */
static void check_sliced_init(const xm_rt_context_t *ctx, lay_t lay) {
  run_t r;
  run_open(&r, ctx, lay);
  CHECK(xm_rt_shard_init_params(&r.T.p, &r.rc, 99, r.arena, NULL) == XM_OK, "init");
  xm_rt_rank_coords_t one;
  xm_rt_rank_coords(NULL, 0, &one);
  unsigned char *ref = calloc(1, (size_t)r.view.program.persistent_bytes);
  CHECK(xm_rt_shard_init_params(&r.view.program, &one, 99, ref, NULL) == XM_OK, "full init");
  /* the full init is the named streams of a 1-rank run */
  float want[8];
  xm_rt_rng_t rng;
  xm_rt_rng_seed_named(&rng, 99, "model.layers.0.mlp.experts.2.up_proj.weight");
  xm_rt_rng_fill_normal(&rng, want, 6, 0.0, 1.0);
  CHECK(memcmp(want, ref + r.view.tensors[UP].offset + 2 * 6 * 4, 6 * 4) == 0,
        "expert 2 is not its named stream");
  for (int j = 0; j < NPARAM; j++) {
    xm_rt_piece_t pc;
    xm_rt_piece_of(&r.T.p, j, &r.rc, NULL, &pc);
    float slice[64];
    xm_rt_piece_from_full(&pc, ref + r.view.tensors[j].offset, slice, 4);
    CHECK(memcmp(slice, r.arena + r.T.t[j].offset, (size_t)pc.n * 4) == 0,
          "dp%d tp%d ep%d: %s is not the slice of the 1-rank init", lay.dp, lay.tp, lay.ep,
          r.T.t[j].name);
  }
  unsigned char *full = gather_full(&r, 0);
  if (g_rank == 0)
    for (int j = 0; j < NPARAM; j++)
      CHECK(memcmp(full + r.view.tensors[j].offset, ref + r.view.tensors[j].offset,
                   (size_t)r.view.tensors[j].bytes) == 0,
            "gathered init of %s differs from the 1-rank init", r.T.t[j].name);
  free(full);
  free(ref);
  run_close(&r);
}

static char g_dir[256];

static char *path_in(const char *a, const char *b) {
  xm_strbuf_t s;
  xm_strbuf_init(&s);
  xm_strbuf_printf(&s, "%s/%s%s%s", g_dir, a, b ? "/" : "", b ? b : "");
  return xm_strbuf_take(&s);
}

static int same_file(const char *a, const char *b) {
  char *x = NULL, *y = NULL;
  size_t nx = 0, ny = 0;
  int ok = xm_read_file(a, &x, &nx) == 0 && xm_read_file(b, &y, &ny) == 0 && nx == ny &&
           memcmp(x, y, nx) == 0;
  free(x);
  free(y);
  return ok;
}

static void save(run_t *r, const char *name, int64_t step) {
  char *dir = path_in(name, NULL);
  xm_rt_train_state_t ts = {.step = step, .data_pos = 40 * step, .rng = {1, 2, 3, 4}};
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_status_t st = xm_rt_shard_checkpoint_save(&r->x, r->comm, &r->view, dir, &ts, true, &diag);
  CHECK(st == XM_OK, "save %s: %s", name, diag.count ? diag.entries[0].message : "(other rank)");
  xm_diag_free(&diag);
  free(dir);
}

static void load_and_check(const xm_rt_context_t *ctx, lay_t lay, const char *name, int64_t step) {
  run_t r;
  run_open(&r, ctx, lay);
  for (int64_t k = 0; k < r.T.p.persistent_bytes; k++)
    r.arena[k] = 0xA5; /* grads must come back zero, everything else loaded */
  char *dir = path_in(name, NULL);
  xm_rt_train_state_t ts;
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_status_t st = xm_rt_shard_checkpoint_load(&r.x, r.comm, &r.rc, &r.view, dir, true, &ts, &diag);
  CHECK(st == XM_OK, "load %s under dp%d tp%d ep%d zero%d: %s", name, lay.dp, lay.tp, lay.ep,
        lay.zero, diag.count ? diag.entries[0].message : "(other rank)");
  if (diag.count) xm_diag_print(&diag, stderr);
  xm_diag_free(&diag);
  CHECK(ts.step == step && ts.data_pos == 40 * step && ts.rng[3] == 4, "trainer state");
  char what[64];
  snprintf(what, sizeof what, "load %s as dp%d tp%d ep%d zero%d", name, lay.dp, lay.tp, lay.ep,
           lay.zero);
  check_pieces(&r.T, &r.rc, r.arena, what);
  for (int j = 0; j < 4; j++) {
    const xm_rt_tensor_t *g = &r.T.t[G0 + j];
    int zero = 1;
    for (int64_t k = 0; k < numel(g); k++)
      zero &= ((const float *)(r.arena + g->offset))[k] == 0.0f;
    CHECK(zero, "%s: %s not zeroed", what, g->name);
  }
  /* and it saves again to the same tensors */
  save(&r, "resaved", step);
  run_close(&r);
  free(dir);
}

/* Saves under layout A, compares the files with a 1-rank program's, loads
 * under two other layouts. */
static void check_checkpoints(const xm_rt_context_t *ctx) {
  lay_t a = {2, 2, 2, 1};
  run_t r;
  run_open(&r, ctx, a);
  fill_pieces(&r.T, &r.rc, r.arena);
  save(&r, "ck-a", 3);
  run_close(&r);
  /* the 1-rank program of the same model, the same values, saved by rank 0 */
  if (g_rank == 0) {
    table_t one;
    build_table(&one, (lay_t){1, 1, 1, 0});
    for (int i = 0; i < NT; i++) /* what a 1-rank compile emits: no marks */
      one.t[i].split_group = one.t[i].split_dim = 0;
    CHECK(!xm_rt_program_is_sharded(&one.p), "the 1-rank table is sharded");
    xm_rt_rank_coords_t rc;
    xm_rt_rank_coords(NULL, 0, &rc);
    unsigned char *arena = calloc(1, (size_t)one.p.persistent_bytes);
    fill_pieces(&one, &rc, arena);
    xm_rt_exec_t x = {.program = &one.p, .ctx = ctx, .persist = arena, .persist_host = arena,
                      .lr = 1e-3f};
    xm_rt_train_state_t ts = {.step = 3, .data_pos = 120, .rng = {1, 2, 3, 4}};
    xm_diag_t diag;
    xm_diag_init(&diag);
    char *dir = path_in("ck-one", NULL);
    CHECK(xm_rt_checkpoint_save(&x, dir, &ts, true, &diag) == XM_OK, "1-rank save");
    xm_diag_free(&diag);
    static const char *const files[] = {"model.safetensors", "optimizer.safetensors",
                                        "config.json"};
    for (int k = 0; k < 3; k++) {
      char *p1 = path_in("ck-one", files[k]), *p2 = path_in("ck-a", files[k]);
      CHECK(same_file(p1, p2), "%s differs from the 1-rank checkpoint's", files[k]);
      free(p1);
      free(p2);
    }
    free(dir);
    free(arena);
  }
  MPI_Barrier(ctx->world_comm);
  load_and_check(ctx, (lay_t){4, 1, 4, 0}, "ck-a", 3);
  load_and_check(ctx, (lay_t){4, 1, 2, 1}, "ck-a", 3);
  load_and_check(ctx, (lay_t){2, 2, 2, 1}, "resaved", 3);
  if (g_rank == 0) {
    char *p1 = path_in("ck-a", "model.safetensors"), *p2 = path_in("resaved", "model.safetensors");
    CHECK(same_file(p1, p2), "a resaved checkpoint differs");
    free(p1);
    free(p2);
  }
}

/* ---- the training driver on a toy multi-rank program ------------------------------- */

enum { DV = 16, DH = 8, DS = 8, DMB = 2, DN = DMB * DS };
#define DALPHA 0.01f
/* global windows per step: micro_batch * grad_accum * dp = 2 * 4 */
#define DGLOBAL_MB 4

enum {
  D_EMB,
  D_HEAD,
  D_X,
  D_UP,     /* params */
  D_G0 = 4, /* grads D_G0 + j */
  D_M0 = 8, /* moments: m = D_M0 + 2j, v = D_M0 + 2j + 1 */
  D_TOKENS = 16,
  D_LABELS,
  D_XS,
  D_LOGITS,
  D_LOSS,
  D_CE,
  D_DLOGITS,
  D_DX,
  D_TMP,
  D_COUNT
};

typedef struct {
  int dp, tp, ep;
  xm_rt_tensor_t t[D_COUNT];
  xm_rt_program_t p;
} dtable_t;

/* What the toy micro saw: the rows of each micro-batch of this rank. */
enum { REC_CAP = 4096 };
static int32_t g_rec[REC_CAP][DS];
static int g_nrec;

static float *DF(xm_rt_exec_t *x, int i) {
  const xm_rt_tensor_t *t = &x->program->tensors[i];
  return (float *)((t->persistent ? x->persist : x->act) + t->offset);
}

static int64_t dnumel(const xm_rt_exec_t *x, int i) { return numel(&x->program->tensors[i]); }

static void all_reduce(xm_rt_exec_t *x, xm_rt_group_kind_t kind, float *buf, int64_t n) {
  if (xm_rt_comm_all_reduce(x->comm, kind, buf, n) != XM_OK)
    xm_rt_abort(x->ctx, 1, "toy: all-reduce failed");
}

/* sum of squares of a split tensor over its group */
static double group_sum_sq(xm_rt_exec_t *x, xm_rt_group_kind_t kind, int i) {
  float v = (float)xm_k_sum_sq(DF(x, i), dnumel(x, i));
  all_reduce(x, kind, &v, 1);
  return v;
}

static void dtoy_micro(xm_rt_exec_t *x) {
  int32_t *tok = (int32_t *)DF(x, D_TOKENS), *lab = (int32_t *)DF(x, D_LABELS);
  for (int b = 0; b < DMB && g_nrec < REC_CAP; b++)
    memcpy(g_rec[g_nrec++], tok + b * DS, sizeof g_rec[0]);
  float *xs = DF(x, D_XS), *logits = DF(x, D_LOGITS), *dl = DF(x, D_DLOGITS), *tmp = DF(x, D_TMP);
  xm_k_embedding(tok, DF(x, D_EMB), xs, DN, DH);
  xm_k_matmul(xs, DF(x, D_HEAD), logits, DN, DH, DV);
  xm_k_cross_entropy(logits, lab, DF(x, D_CE), DN, DV);
  double aux = group_sum_sq(x, XM_RT_GROUP_TP, D_X) + group_sum_sq(x, XM_RT_GROUP_EP, D_UP);
  *DF(x, D_LOSS) = *DF(x, D_CE) + DALPHA * (float)aux;
  float one = 1.0f;
  xm_k_cross_entropy_grad(&one, logits, lab, dl, DN, DV);
  xm_k_matmul_dw(dl, xs, tmp, DN, DH, DV);
  xm_k_accumulate(DF(x, D_G0 + D_HEAD), tmp, DV * DH);
  xm_k_matmul_dx(dl, DF(x, D_HEAD), DF(x, D_DX), DN, DH, DV);
  xm_k_embedding_grad(DF(x, D_DX), tok, tmp, DN, DV, DH);
  xm_k_accumulate(DF(x, D_G0 + D_EMB), tmp, DV * DH);
  for (int j = D_X; j <= D_UP; j++) {
    xm_k_scale(DF(x, j), tmp, dnumel(x, j), 2.0f * DALPHA);
    xm_k_accumulate(DF(x, D_G0 + j), tmp, dnumel(x, j));
  }
  /* What a generated micro's host_read ops do: hand the driver the losses. */
  xm_rt_read(x, &x->host_loss, DF(x, D_LOSS), 4);
  xm_rt_read(x, &x->host_ce_loss, DF(x, D_CE), 4);
}

/* Gradients summed over the DP groups (the aux gradient of the experts is
 * the same in every group: summed over EDP and rescaled to dp copies),
 * global norm, clipping, AdamW. */
static void dtoy_step(xm_rt_exec_t *x) {
  const xm_rt_program_t *p = x->program;
  for (int j = D_EMB; j <= D_X; j++)
    all_reduce(x, XM_RT_GROUP_DP, DF(x, D_G0 + j), dnumel(x, D_G0 + j));
  all_reduce(x, XM_RT_GROUP_EDP, DF(x, D_G0 + D_UP), dnumel(x, D_G0 + D_UP));
  float edp = (float)xm_rt_comm_group(x->comm, XM_RT_GROUP_EDP)->size;
  xm_k_scale(DF(x, D_G0 + D_UP), DF(x, D_G0 + D_UP), dnumel(x, D_G0 + D_UP), (float)p->dp / edp);
  double norm_sq =
      xm_k_sum_sq(DF(x, D_G0 + D_EMB), DV * DH) + xm_k_sum_sq(DF(x, D_G0 + D_HEAD), DV * DH) +
      group_sum_sq(x, XM_RT_GROUP_TP, D_G0 + D_X) + group_sum_sq(x, XM_RT_GROUP_EP, D_G0 + D_UP);
  x->grad_norm = sqrt(norm_sq);
  x->grad_scale = xm_rt_clip_coef((float)norm_sq, x->grad_clip);
  for (int j = D_EMB; j <= D_UP; j++) {
    int64_t n = dnumel(x, j);
    xm_k_adamw(DF(x, j), DF(x, D_G0 + j), DF(x, D_M0 + 2 * j), DF(x, D_M0 + 2 * j + 1), n, x->lr,
               x->beta1, x->beta2, x->adam_eps, x->weight_decay, x->step, x->grad_scale);
    memset(DF(x, D_G0 + j), 0, (size_t)n * 4);
  }
}

static void dplace(dtable_t *T, int i, int persistent, int64_t *offset) {
  xm_rt_tensor_t *t = &T->t[i];
  t->persistent = persistent;
  t->offset = *offset;
  t->bytes = numel(t) * 4;
  *offset += (t->bytes + 63) / 64 * 64;
}

static void dtensor(dtable_t *T, int i, const char *name, int cat, int dt, int rank, int64_t d0,
                    int64_t d1, int64_t d2) {
  xm_rt_tensor_t *t = &T->t[i];
  memset(t, 0, sizeof *t);
  t->name = name;
  t->category = cat;
  t->dtype = dt;
  t->rank = rank;
  t->dims[0] = d0, t->dims[1] = d1, t->dims[2] = d2;
  t->param = -1;
}

/* The toy for layout dp x tp (ep experts groups); grad_accum keeps the
 * global batch at DGLOBAL_MB micro-batches. */
static void build_dtable(dtable_t *T, int dp, int tp, int ep) {
  static const char *const names[4][4] = {
      {"model.embed_tokens.weight", "model.embed_tokens.weight.grad",
       "model.embed_tokens.weight.exp_avg", "model.embed_tokens.weight.exp_avg_sq"},
      {"lm_head.weight", "lm_head.weight.grad", "lm_head.weight.exp_avg",
       "lm_head.weight.exp_avg_sq"},
      {"model.layers.0.self_attn.o_proj.weight", "model.layers.0.self_attn.o_proj.weight.grad",
       "model.layers.0.self_attn.o_proj.weight.exp_avg",
       "model.layers.0.self_attn.o_proj.weight.exp_avg_sq"},
      {"model.layers.0.mlp.experts.{e}.up_proj.weight",
       "model.layers.0.mlp.experts.{e}.up_proj.weight.grad",
       "model.layers.0.mlp.experts.{e}.up_proj.weight.exp_avg",
       "model.layers.0.mlp.experts.{e}.up_proj.weight.exp_avg_sq"}};
  memset(T, 0, sizeof *T);
  T->dp = dp, T->tp = tp, T->ep = ep;
  int64_t po = 0, ao = 0;
  for (int j = 0; j < 4; j++) {
    int64_t d0 = j < 2 ? DV : 4, d1 = j < 2 ? DH : (j == 2 ? 8 / tp : 3), d2 = j == 3 ? 2 : 0;
    if (j == 3) d0 = 4 / ep;
    int rank = j == 3 ? 3 : 2;
    int sg = j == 2 ? GROUP(XM_RT_GROUP_TP) : j == 3 ? GROUP(XM_RT_GROUP_EP) : 0;
    int sd = j == 2 ? 1 : 0;
    int idx[4] = {j, D_G0 + j, D_M0 + 2 * j, D_M0 + 2 * j + 1};
    int cat[4] = {XM_RT_CAT_WEIGHTS, XM_RT_CAT_GRADS, XM_RT_CAT_OPTIMIZER, XM_RT_CAT_OPTIMIZER};
    for (int k = 0; k < 4; k++) {
      dtensor(T, idx[k], names[j][k], cat[k], XM_RT_F32, rank, d0, d1, d2);
      T->t[idx[k]].split_group = sg;
      T->t[idx[k]].split_dim = sd;
      T->t[idx[k]].param = k ? j : -1;
    }
    T->t[j].init = XM_RT_INIT_NORMAL;
    T->t[j].init_std = j < 2 ? 0.5f : 1.0f;
    T->t[j].trainable = 1;
  }
  for (int i = 0; i < 16; i++)
    dplace(T, i, 1, &po);
  dtensor(T, D_TOKENS, "tokens", XM_RT_CAT_INPUTS, XM_RT_I32, 2, DMB, DS, 0);
  dtensor(T, D_LABELS, "labels", XM_RT_CAT_INPUTS, XM_RT_I32, 2, DMB, DS, 0);
  dtensor(T, D_XS, "x", XM_RT_CAT_ACTIVATIONS, XM_RT_F32, 2, DN, DH, 0);
  dtensor(T, D_LOGITS, "logits", XM_RT_CAT_ACTIVATIONS, XM_RT_F32, 2, DN, DV, 0);
  dtensor(T, D_LOSS, "loss", XM_RT_CAT_ACTIVATIONS, XM_RT_F32, 0, 0, 0, 0);
  dtensor(T, D_CE, "ce_loss", XM_RT_CAT_ACTIVATIONS, XM_RT_F32, 0, 0, 0, 0);
  dtensor(T, D_DLOGITS, "dlogits", XM_RT_CAT_WORKSPACE, XM_RT_F32, 2, DN, DV, 0);
  dtensor(T, D_DX, "dx", XM_RT_CAT_WORKSPACE, XM_RT_F32, 2, DN, DH, 0);
  dtensor(T, D_TMP, "dw", XM_RT_CAT_WORKSPACE, XM_RT_F32, 2, DV, DH, 0);
  for (int i = D_TOKENS; i < D_COUNT; i++)
    dplace(T, i, 0, &ao);
  xm_rt_program_t *p = &T->p;
  p->model_name = "toy-spmd";
  p->config_json = "{\"vocab_size\": 16, \"hidden_size\": 8}\n";
  p->spec_json = "{}\n";
  p->vocab = DV, p->seq_len = DS, p->micro_batch = DMB, p->grad_accum = DGLOBAL_MB / dp;
  p->lr = 0.05, p->min_lr = 0.005, p->beta1 = 0.9, p->beta2 = 0.95, p->adam_eps = 1e-8;
  p->grad_clip = 1.0, p->warmup_steps = 2, p->train_steps = 6, p->seed = 1234;
  p->dp = dp, p->tp = tp, p->ep = ep, p->ranks_per_node = 0;
  p->persistent_bytes = po;
  p->activation_bytes = ao;
  p->num_tensors = D_COUNT;
  p->tensors = T->t;
  p->tokens = D_TOKENS, p->labels = D_LABELS, p->loss = D_LOSS, p->ce_loss = D_CE;
  p->micro = dtoy_micro;
  p->step = dtoy_step;
}

static char *slurp(const char *path) {
  char *text = NULL;
  size_t len = 0;
  if (xm_read_file(path, &text, &len) != 0) return strdup("");
  return text;
}

/* Runs the driver on every rank with argv {"train", args...}; stdout and
 * stderr of this rank captured into *out / *err (owned; may be NULL). */
static int drive(const dtable_t *T, const char *const *args, char **out, char **err) {
  char *argv[48];
  int argc = 0;
  argv[argc++] = (char *)"train";
  for (; args[argc - 1]; argc++)
    argv[argc] = (char *)args[argc - 1];
  argv[argc] = NULL;
  char op[300], ep[300];
  snprintf(op, sizeof op, "%s/out-%d.txt", g_dir, g_rank);
  snprintf(ep, sizeof ep, "%s/err-%d.txt", g_dir, g_rank);
  fflush(stdout);
  fflush(stderr);
  int so = dup(1), se = dup(2);
  int fo = open(op, O_WRONLY | O_CREAT | O_TRUNC, 0644),
      fe = open(ep, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  dup2(fo, 1);
  dup2(fe, 2);
  close(fo);
  close(fe);
  g_nrec = 0;
  int rc = xm_rt_train_main(argc, argv, &T->p);
  fflush(stdout);
  fflush(stderr);
  dup2(so, 1);
  dup2(se, 2);
  close(so);
  close(se);
  char *o = slurp(op), *e = slurp(ep);
  if (rc != 0 && e[0]) fprintf(stderr, "rank %d: train exited %d:\n%s", g_rank, rc, e);
  if (out)
    *out = o;
  else
    free(o);
  if (err)
    *err = e;
  else
    free(e);
  return rc;
}

/* The bigram stream of the data file (the recurrence of test_train_driver). */
enum { DTOKENS = 2001 };
static uint32_t g_stream[DTOKENS];

static void make_stream(void) {
  g_stream[0] = 0;
  for (int i = 1; i < DTOKENS; i++)
    g_stream[i] = (3 * g_stream[i - 1] + 1 + (uint32_t)(i % 7 == 0)) % DV;
}

/* Each micro-batch row this rank saw in steps first..last is the window
 * the driver's rule gives: data_pos + (d * GA + a) * MB + b. */
static void check_windows(const dtable_t *T, int64_t first, int64_t last, int64_t train_windows) {
  int dpi = g_rank / T->tp, ga = (int)T->p.grad_accum, k = 0, bad = 0;
  for (int64_t s = first; s <= last; s++) {
    int64_t pos = (s - 1) * DGLOBAL_MB * DMB;
    for (int a = 0; a < ga; a++)
      for (int b = 0; b < DMB; b++, k++) {
        int64_t w = (pos + ((int64_t)dpi * ga + a) * DMB + b) % train_windows;
        for (int i = 0; i < DS && k < g_nrec; i++)
          bad += g_rec[k][i] != (int32_t)g_stream[w * DS + i];
      }
  }
  CHECK(k == g_nrec && bad == 0, "dp%d tp%d: %d micro-batch rows, %d recorded, %d wrong tokens",
        T->dp, T->tp, k, g_nrec, bad);
}

static cJSON *read_lines(const char *path, int *out_n) {
  char *text = slurp(path);
  cJSON *arr = cJSON_CreateArray();
  char *save = NULL;
  int n = 0;
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save), n++) {
    cJSON *obj = cJSON_Parse(line);
    CHECK(obj != NULL, "%s: unparsable line %s", path, line);
    if (obj) cJSON_AddItemToArray(arr, obj);
  }
  free(text);
  *out_n = n;
  return arr;
}

static double jnum(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  CHECK(cJSON_IsNumber(v), "field %s missing", key);
  return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* Losses of steps a..b of two logs agree to `tol` (relative). */
static void same_losses(const char *la, int from_a, const char *lb, int from_b, int count,
                        double tol, const char *what) {
  if (g_rank != 0) return;
  int na = 0, nb = 0;
  cJSON *a = read_lines(la, &na), *b = read_lines(lb, &nb);
  CHECK(na >= from_a + count && nb >= from_b + count, "%s: %d and %d log lines", what, na, nb);
  for (int k = 0; k < count && na >= from_a + count && nb >= from_b + count; k++) {
    const cJSON *x = cJSON_GetArrayItem(a, from_a + k), *y = cJSON_GetArrayItem(b, from_b + k);
    CHECK(jnum(x, "step") == jnum(y, "step"), "%s: steps differ", what);
    static const char *const keys[] = {"loss", "ce_loss", "grad_norm"};
    for (int q = 0; q < 3; q++) {
      double u = jnum(x, keys[q]), v = jnum(y, keys[q]);
      CHECK(fabs(u - v) <= tol * fabs(u), "%s: step %g %s %.9g vs %.9g", what, jnum(x, "step"),
            keys[q], u, v);
    }
  }
  cJSON_Delete(a);
  cJSON_Delete(b);
}

/* The step log's traffic member and the --traffic file of the same run. */
static void check_traffic(const char *log, const char *matrix) {
  if (g_rank != 0) return;
  int nl = 0, nm = 0;
  cJSON *l = read_lines(log, &nl), *m = read_lines(matrix, &nm);
  CHECK(nl == 2 && nm > 0, "%d log lines, %d matrix lines", nl, nm);
  for (int s = 0; s < nl; s++) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(l, s), "traffic");
    CHECK(cJSON_IsObject(t), "step %d: no traffic member", s + 1);
    if (!cJSON_IsObject(t)) continue;
    double total = jnum(t, "intra_bytes") + jnum(t, "inter_bytes");
    const cJSON *ar = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(t, "by_phase"), "all_reduce");
    CHECK(cJSON_IsObject(ar) && jnum(ar, "intra") + jnum(ar, "inter") == total && total > 0,
          "step %d: all-reduce bytes are not the total %g", s + 1, total);
    double sum = 0;
    for (int k = 0; k < cJSON_GetArraySize(m); k++) {
      const cJSON *line = cJSON_GetArrayItem(m, k);
      if (jnum(line, "step") != s + 1) continue;
      CHECK(jnum(line, "world") == 4, "matrix world");
      const cJSON *rows = cJSON_GetObjectItemCaseSensitive(line, "bytes");
      for (int i = 0; i < cJSON_GetArraySize(rows); i++)
        for (int j = 0; j < cJSON_GetArraySize(cJSON_GetArrayItem(rows, i)); j++)
          sum += cJSON_GetArrayItem(cJSON_GetArrayItem(rows, i), j)->valuedouble;
    }
    CHECK(sum == total, "step %d: the matrices sum to %g, the log says %g", s + 1, sum, total);
  }
  cJSON_Delete(l);
  cJSON_Delete(m);
}

static double eval_loss(const dtable_t *T, const char *data, const char *ckpt, int64_t *batches) {
  char *out = NULL;
  int rc = drive(
      T,
      (const char *[]){"--data", data, "--eval", "--ckpt", ckpt, "--batches", "5", "--json", NULL},
      &out, NULL);
  CHECK(rc == 0, "eval under dp%d tp%d: exit %d", T->dp, T->tp, rc);
  double loss = NAN;
  if (g_rank == 0) {
    cJSON *j = cJSON_Parse(out);
    CHECK(j != NULL, "eval output %s", out);
    loss = j ? jnum(j, "loss") : NAN;
    *batches = j ? (int64_t)jnum(j, "batches") : -1;
    cJSON_Delete(j);
  }
  free(out);
  return loss;
}

static void check_driver(void) {
  setenv("XM_NO_REEXEC", "1", 1);
  make_stream();
  char data[300];
  snprintf(data, sizeof data, "%s/bigram.tok", g_dir);
  if (g_rank == 0) {
    xm_diag_t diag;
    xm_diag_init(&diag);
    CHECK(xm_rt_data_write_tokens(data, g_stream, DTOKENS, 2, &diag) == XM_OK, "data");
    xm_diag_free(&diag);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  /* 2000 / 8 = 250 windows, 12 held out */
  const int64_t train_windows = 238;
  static dtable_t A, B, C, W;
  build_dtable(&A, 2, 2, 2);
  build_dtable(&B, 4, 1, 4);
  build_dtable(&C, 1, 4, 2);
  build_dtable(&W, 2, 1, 2); /* for 2 ranks */
  char p[12][300];
  static const char *const names[12] = {"a.log",      "b.log",   "c.log",     "a-half.log",
                                        "b-rest.log", "ck-half", "ck-a",      "a.traffic",
                                        "short.log",  "ck-c",    "nowhere/x", "c-rest.log"};
  for (int i = 0; i < 12; i++)
    snprintf(p[i], sizeof p[i], "%s/%s", g_dir, names[i]);

  /* the world size must be dp * tp */
  char *err = NULL;
  int rc = drive(&W, (const char *[]){"--data", data, "--steps", "1", "--quiet", NULL}, NULL, &err);
  CHECK(rc == 2, "dp2 tp1 on 4 ranks: exit %d", rc);
  if (g_rank == 0)
    CHECK(strstr(err, "compiled for dp 2 x tp 1 = 2 ranks, but it runs on 4 ranks") != NULL,
          "world message: %s", err);
  free(err);

  /* straight runs under three layouts with the same global batch */
  rc = drive(&A,
             (const char *[]){"--data", data, "--steps", "6", "--log", p[0], "--ckpt-dir", p[6],
                              "--progress", "never", NULL},
             NULL, &err);
  CHECK(rc == 0, "dp2 tp2 ep2: exit %d", rc);
  check_windows(&A, 1, 6, train_windows);
  if (g_rank == 0)
    CHECK(strstr(err, "layout dp2 tp2 ep2 zero0 on 4 ranks (2 per node)") != NULL, "banner: %s",
          err);
  free(err);
  rc = drive(&B, (const char *[]){"--data", data, "--steps", "6", "--log", p[1], "--quiet", NULL},
             NULL, NULL);
  CHECK(rc == 0, "dp4 ep4: exit %d", rc);
  check_windows(&B, 1, 6, train_windows);
  rc = drive(&C,
             (const char *[]){"--data", data, "--steps", "6", "--log", p[2], "--ckpt-dir", p[9],
                              "--quiet", NULL},
             NULL, NULL);
  CHECK(rc == 0, "tp4 ep2: exit %d", rc);
  check_windows(&C, 1, 6, train_windows);
  same_losses(p[0], 0, p[1], 0, 6, 1e-5, "dp2 tp2 ep2 vs dp4 ep4");
  same_losses(p[0], 0, p[2], 0, 6, 1e-5, "dp2 tp2 ep2 vs tp4 ep2");
  if (g_rank == 0) { /* tokens count the global batch */
    int n = 0;
    cJSON *l = read_lines(p[0], &n);
    CHECK(n == 6 && jnum(cJSON_GetArrayItem(l, 5), "tokens") == 6 * DGLOBAL_MB * DMB * DS,
          "tokens of step 6");
    CHECK(jnum(cJSON_GetArrayItem(l, 5), "ce_loss") < jnum(cJSON_GetArrayItem(l, 0), "ce_loss"),
          "the loss does not fall");
    cJSON_Delete(l);
  }

  /* 3 steps under dp2 tp2 ep2, resumed under dp4 ep4 and under tp4 ep2 */
  rc = drive(&A,
             (const char *[]){"--data", data, "--steps", "3", "--log", p[3], "--ckpt-dir", p[5],
                              "--quiet", NULL},
             NULL, NULL);
  CHECK(rc == 0, "half run: exit %d", rc);
  rc = drive(&B,
             (const char *[]){"--data", data, "--steps", "6", "--resume", p[5], "--log", p[4],
                              "--quiet", NULL},
             NULL, NULL);
  CHECK(rc == 0, "resumed under dp4 ep4: exit %d", rc);
  check_windows(&B, 4, 6, train_windows);
  same_losses(p[0], 3, p[4], 0, 3, 1e-5, "straight vs resumed under dp4 ep4");
  rc = drive(&C,
             (const char *[]){"--data", data, "--steps", "6", "--resume", p[5], "--log", p[11],
                              "--quiet", NULL},
             NULL, NULL);
  CHECK(rc == 0, "resumed under tp4 ep2: exit %d", rc);
  same_losses(p[0], 3, p[11], 0, 3, 1e-5, "straight vs resumed under tp4 ep2");

  /* evaluation: the same loss whichever layout reads the checkpoint */
  int64_t ba = 0, bc = 0, bb = 0;
  double ea = eval_loss(&A, data, p[6], &ba), ec = eval_loss(&C, data, p[6], &bc),
         eb = eval_loss(&B, data, p[9], &bb);
  if (g_rank == 0) {
    CHECK(ba == 5 && bc == 5 && bb == 5, "batches %lld %lld %lld", (long long)ba, (long long)bc,
          (long long)bb);
    CHECK(fabs(ea - ec) <= 1e-6 * fabs(ea), "eval dp2 %.9g vs dp1 %.9g", ea, ec);
    CHECK(fabs(ea - eb) <= 1e-5 * fabs(ea), "eval of two layouts' checkpoints %.9g vs %.9g", ea,
          eb);
  }

  /* traffic: the log member and the matrix file */
  rc = drive(&A,
             (const char *[]){"--data", data, "--steps", "2", "--log", p[8], "--traffic", p[7],
                              "--json", "--quiet", NULL},
             NULL, NULL);
  CHECK(rc == 0, "traffic run: exit %d", rc);
  check_traffic(p[8], p[7]);
  rc = drive(&A,
             (const char *[]){"--data", data, "--steps", "1", "--traffic", p[10], "--quiet", NULL},
             NULL, &err);
  CHECK(rc == 2, "unwritable --traffic: exit %d", rc);
  if (g_rank == 0)
    CHECK(strstr(err, "cannot open the traffic file") != NULL, "traffic message: %s", err);
  free(err);
}

static int rm_cb(const char *p, const struct stat *s, int f, struct FTW *w) {
  (void)s, (void)f, (void)w;
  return remove(p);
}

int main(int argc, char **argv) {
  xm_rt_context_t ctx;
  if (!start_checks(&argc, &argv, 4, 2, &ctx)) return 1;
  if (ctx.rank == 0) {
    const char *base = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/xm-shard-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(g_dir)) g_dir[0] = '\0';
  }
  MPI_Bcast(g_dir, sizeof g_dir, MPI_CHAR, 0, ctx.world_comm);
  CHECK(g_dir[0] != '\0', "no temporary directory");

  static const lay_t layouts[] = {{2, 2, 2, 1}, {2, 2, 2, 0}, {4, 1, 4, 1},
                                  {4, 1, 2, 1}, {1, 4, 2, 1}, {1, 4, 4, 0}};
  for (size_t k = 0; k < sizeof layouts / sizeof *layouts; k++) {
    check_gather_scatter(&ctx, layouts[k]);
    check_sliced_init(&ctx, layouts[k]);
  }
  if (g_dir[0]) check_checkpoints(&ctx);
  if (g_dir[0]) check_driver();

  MPI_Barrier(ctx.world_comm);
  if (ctx.rank == 0 && g_dir[0]) nftw(g_dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
  int total = finish_checks(&ctx, "test_mpi4_shard_io");
  xm_rt_context_destroy(&ctx);
  return total ? 1 : 0;
}
