/* runtime/io/shard_io.c — pieces of tensors across ranks: coordinates, piece
 * math, the full view, sliced initialisation, gather/scatter and the
 * layout-independent checkpoints built on them (runtime/io/shard_io.h).
 *
 * Piece geometry. A split of dim k of a tensor with full dims D into P equal
 * slices leaves every rank a tensor whose flattened elements come in runs:
 * for each of the prod(D[0..k)) "outer" indices, one contiguous run of
 * block = D[k]/P * prod(D[k+1..)) elements, which in the full tensor starts
 * at outer * full_block + index * block (full_block = D[k] * prod(D[k+1..))).
 * A ZeRO-1 chunk is a contiguous range [lo, hi) of the local slice's
 * flattened elements, so the same runs, cut at lo and hi, place it. Every
 * copy below is therefore a loop of memcpy over at most outer + 1 runs.
 *
 * Gather protocol (save). Every rank walks the stored tensors in table
 * order and computes, from the layout alone, which rank is the designated
 * sender of each distinct piece (the lowest world rank holding it: pieces
 * are keyed by (slice index, chunk index), and replicas are identical).
 * Designated ranks other than 0 send their piece to rank 0 with blocking
 * sends; rank 0 receives them in the same (tensor, rank) order. Both sides
 * follow one order and MPI does not overtake messages between a pair, so
 * one tag suffices and no send can wait on a receive that is not next.
 * Messages over 1 GiB go in 1 GiB parts (MPI counts are ints).
 *
 * Load reads the whole checkpoint on every rank into a temporary full arena
 * (the files are memory-mapped by runtime/io/safetensors.c) and copies the
 * rank's pieces out: no communication, and each rank's read is checked by
 * runtime/io/checkpoint.c before anything is copied. The cost is one full
 * arena per rank for the duration of the load.
 */
#include "runtime/io/shard_io.h"

#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/io/rng.h"
#include "runtime/comm/spmd.h"
#include "support/strbuf.h"

/* ---- coordinates ------------------------------------------------------------ */

xm_status_t xm_rt_rank_coords(const xm_rt_comm_layout_t *layout, int world_rank,
                              xm_rt_rank_coords_t *out) {
  for (int k = 0; k < XM_RT_GROUP_COUNT; k++) {
    out->index[k] = 0;
    out->size[k] = 1;
  }
  if (!layout) return XM_OK;
  if (layout->world < 1 || world_rank < 0 || world_rank >= layout->world ||
      layout->ranks_per_node < 1 || layout->dp < 1 || layout->tp < 1 || layout->ep < 1)
    return XM_ERR_INVALID_INPUT;
  int *members = malloc((size_t)layout->world * sizeof *members);
  if (!members) return XM_ERR_NO_MEMORY;
  for (int k = 0; k < XM_RT_GROUP_COUNT; k++)
    out->size[k] =
        xm_rt_comm_layout_group(layout, (xm_rt_group_kind_t)k, world_rank, members, &out->index[k]);
  free(members);
  return XM_OK;
}

int xm_rt_program_is_sharded(const xm_rt_program_t *p) {
  for (int i = 0; i < p->num_tensors; i++)
    if (p->tensors[i].split_group || p->tensors[i].chunk_group) return 1;
  return 0;
}

/* The tensors a checkpoint stores (runtime/io/checkpoint.c): params and
 * optimizer states, all persistent. */
static int is_stored(const xm_rt_tensor_t *t) {
  return t->persistent && (t->category == XM_RT_CAT_WEIGHTS || t->category == XM_RT_CAT_OPTIMIZER);
}

/* ---- pieces ------------------------------------------------------------------- */

static xm_status_t bad_entry(xm_diag_t *diag, const xm_rt_program_t *p, int ti, const char *what) {
  const char *name =
      ti >= 0 && ti < p->num_tensors && p->tensors[ti].name ? p->tensors[ti].name : "?";
  if (diag)
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, name,
                "internal error: tensor %d of the program table: %s", ti, what);
  return XM_ERR_INTERNAL;
}

/* The local slice geometry of table tensor `ti` as split by its own
 * split_group: n, block, parts, index. */
static xm_status_t slice_geometry(const xm_rt_program_t *p, int ti, const xm_rt_rank_coords_t *rc,
                                  xm_diag_t *diag, xm_rt_piece_t *g) {
  const xm_rt_tensor_t *t = &p->tensors[ti];
  if (t->rank < 0 || t->rank > 6) return bad_entry(diag, p, ti, "rank outside 0..6");
  if (t->dtype != XM_RT_F32 && t->dtype != XM_RT_I32)
    return bad_entry(diag, p, ti, "dtype is neither f32 nor i32");
  int64_t n = 1;
  for (int d = 0; d < t->rank; d++)
    if (t->dims[d] < 0 || __builtin_mul_overflow(n, t->dims[d], &n))
      return bad_entry(diag, p, ti, "negative dim or element count overflow");
  g->n = n;
  g->parts = 1;
  g->index = 0;
  g->block = n;
  if (t->split_group < 0 || t->split_group > XM_RT_GROUP_COUNT)
    return bad_entry(diag, p, ti, "unknown split group");
  if (t->split_group == 0) {
    g->full_block = n;
    g->full_elems = n;
    return XM_OK;
  }
  if (t->split_dim < 0 || t->split_dim >= t->rank)
    return bad_entry(diag, p, ti, "split dim outside the tensor's rank");
  int kind = t->split_group - 1;
  g->parts = rc->size[kind];
  g->index = rc->index[kind];
  if (g->parts < 1 || g->index < 0 || g->index >= g->parts)
    return bad_entry(diag, p, ti, "group index outside the group");
  int64_t block = 1;
  for (int d = t->split_dim; d < t->rank; d++)
    block *= t->dims[d]; /* <= n: no overflow */
  g->block = block;
  if (__builtin_mul_overflow(block, g->parts, &g->full_block) ||
      __builtin_mul_overflow(n, g->parts, &g->full_elems))
    return bad_entry(diag, p, ti, "full tensor size overflows");
  return XM_OK;
}

xm_status_t xm_rt_piece_of(const xm_rt_program_t *p, int ti, const xm_rt_rank_coords_t *rc,
                           xm_diag_t *diag, xm_rt_piece_t *out) {
  memset(out, 0, sizeof *out);
  if (ti < 0 || ti >= p->num_tensors) return bad_entry(diag, p, ti, "no such table entry");
  const xm_rt_tensor_t *t = &p->tensors[ti];
  if (t->chunk_group < 0 || t->chunk_group > XM_RT_GROUP_COUNT)
    return bad_entry(diag, p, ti, "unknown chunk group");
  out->chunk_parts = 1;
  if (t->chunk_group == 0) {
    XM_RETURN_IF_ERROR(slice_geometry(p, ti, rc, diag, out));
    out->lo = 0;
    out->hi = out->n;
    out->buffer_elems = out->n;
    return XM_OK;
  }
  /* A ZeRO-1 chunk of the (local slice of the) param it belongs to. */
  if (t->param < 0 || t->param >= p->num_tensors || t->param == ti ||
      p->tensors[t->param].chunk_group != 0)
    return bad_entry(diag, p, ti, "a ZeRO-1 chunk without a valid param");
  XM_RETURN_IF_ERROR(slice_geometry(p, t->param, rc, diag, out));
  int kind = t->chunk_group - 1;
  int64_t P = rc->size[kind], i = rc->index[kind];
  if (P < 1 || i < 0 || i >= P) return bad_entry(diag, p, ti, "chunk index outside the group");
  int64_t c = xm_rt_chunk(out->n, P);
  int64_t numel = 1;
  for (int d = 0; d < t->rank && t->rank <= 6; d++)
    if (t->dims[d] < 0 || __builtin_mul_overflow(numel, t->dims[d], &numel)) numel = -1;
  if (t->rank < 0 || t->rank > 6 || numel != c) {
    xm_strbuf_t b;
    xm_strbuf_init(&b);
    xm_strbuf_printf(&b,
                     "a ZeRO-1 chunk over %lld ranks of %lld elements must have %lld elements, "
                     "not %lld",
                     (long long)P, (long long)out->n, (long long)c, (long long)numel);
    xm_status_t s = bad_entry(diag, p, ti, xm_strbuf_cstr(&b));
    xm_strbuf_free(&b);
    return s;
  }
  out->chunk_index = i;
  out->chunk_parts = P;
  out->lo = i * c < out->n ? i * c : out->n;
  out->hi = (i + 1) * c < out->n ? (i + 1) * c : out->n;
  out->buffer_elems = c;
  return XM_OK;
}

int64_t xm_rt_piece_full_offset(const xm_rt_piece_t *pc, int64_t e) {
  if (pc->block <= 0) return e;
  return (e / pc->block) * pc->full_block + pc->index * pc->block + e % pc->block;
}

/* Calls fn for each maximal run of [lo, hi) that is contiguous in both the
 * buffer and the full tensor. */
#define FOR_EACH_RUN(pc, body)                                                                     \
  for (int64_t e_ = (pc)->lo; e_ < (pc)->hi;) {                                                    \
    int64_t end_ = (pc)->block > 0 ? (e_ / (pc)->block + 1) * (pc)->block : (pc)->hi;              \
    if (end_ > (pc)->hi) end_ = (pc)->hi;                                                          \
    int64_t buf_at = e_ - (pc)->lo, full_at = xm_rt_piece_full_offset((pc), e_), run = end_ - e_;  \
    body;                                                                                          \
    e_ = end_;                                                                                     \
  }

void xm_rt_piece_to_full(const xm_rt_piece_t *pc, const void *buffer, void *full,
                         size_t elem_size) {
  const unsigned char *src = buffer;
  unsigned char *dst = full;
  FOR_EACH_RUN(pc, memcpy(dst + (size_t)full_at * elem_size, src + (size_t)buf_at * elem_size,
                          (size_t)run * elem_size));
}

void xm_rt_piece_from_full(const xm_rt_piece_t *pc, const void *full, void *buffer,
                           size_t elem_size) {
  const unsigned char *src = full;
  unsigned char *dst = buffer;
  FOR_EACH_RUN(pc, memcpy(dst + (size_t)buf_at * elem_size, src + (size_t)full_at * elem_size,
                          (size_t)run * elem_size));
  int64_t held = pc->hi - pc->lo;
  if (pc->buffer_elems > held)
    memset(dst + (size_t)held * elem_size, 0, (size_t)(pc->buffer_elems - held) * elem_size);
}

/* ---- the full view ---------------------------------------------------------------- */

/* The full dims of stored tensor `ti` (a chunk: its param's). */
static void full_dims(const xm_rt_program_t *p, int ti, const xm_rt_piece_t *pc,
                      xm_rt_tensor_t *out) {
  const xm_rt_tensor_t *t = &p->tensors[ti];
  const xm_rt_tensor_t *shape = t->chunk_group ? &p->tensors[t->param] : t;
  out->rank = shape->rank;
  memset(out->dims, 0, sizeof out->dims);
  for (int d = 0; d < shape->rank; d++)
    out->dims[d] = shape->dims[d];
  if (shape->split_group) out->dims[shape->split_dim] *= pc->parts;
}

void xm_rt_full_view_destroy(xm_rt_full_view_t *v) {
  if (!v) return;
  free(v->tensors);
  memset(v, 0, sizeof *v);
}

xm_status_t xm_rt_full_view_create(const xm_rt_program_t *local, const xm_rt_rank_coords_t *rc,
                                   xm_diag_t *diag, xm_rt_full_view_t *out) {
  memset(out, 0, sizeof *out);
  if (local->num_tensors < 0 || (local->num_tensors > 0 && !local->tensors))
    return bad_entry(diag, local, -1, "no tensor table");
  size_t count = local->num_tensors > 0 ? (size_t)local->num_tensors : 1;
  xm_rt_tensor_t *ts = calloc(count, sizeof *ts);
  if (!ts) return XM_ERR_NO_MEMORY;
  int64_t offset = 0, stored = 0, cat[XM_RT_CAT_COUNT_] = {0};
  xm_status_t s = XM_OK;
  for (int i = 0; i < local->num_tensors && s == XM_OK; i++) {
    const xm_rt_tensor_t *t = &local->tensors[i];
    xm_rt_tensor_t *f = &ts[i];
    *f = *t;
    f->split_group = 0;
    f->split_dim = 0;
    f->chunk_group = 0;
    if (!is_stored(t)) {
      f->persistent = 0;
      f->offset = 0;
      f->bytes = 0;
      continue;
    }
    xm_rt_piece_t pc;
    s = xm_rt_piece_of(local, i, rc, diag, &pc);
    if (s != XM_OK) break;
    full_dims(local, i, &pc, f);
    int64_t bytes = 0, padded = 0;
    if (__builtin_mul_overflow(pc.full_elems, (int64_t)4, &bytes) ||
        __builtin_add_overflow(bytes, (int64_t)63, &padded) ||
        __builtin_add_overflow(offset, padded / 64 * 64, &padded)) {
      s = bad_entry(diag, local, i, "the full arena size overflows");
      break;
    }
    f->offset = offset;
    f->bytes = bytes;
    offset = padded; /* the next tensor starts 64-byte aligned */
    cat[t->category] += bytes;
    stored++;
  }
  if (s != XM_OK) {
    free(ts);
    return s;
  }
  out->program = *local;
  out->program.tensors = ts;
  out->program.persistent_bytes = offset;
  out->program.activation_bytes = 0;
  for (int k = 0; k < XM_RT_CAT_COUNT_; k++)
    out->program.category_bytes[k] = cat[k];
  out->tensors = ts;
  out->stored = stored;
  return XM_OK;
}

/* ---- expert placement -------------------------------------------------------------- */

/* The Hugging Face expert of each slot of placement row `placed` - 1. */
static const int32_t *placement_row(const xm_rt_program_t *p, int placed) {
  if (placed <= 0 || placed > p->placement_rows || !p->placement) return NULL;
  return p->placement + (int64_t)(placed - 1) * p->placement_experts;
}

/* Reorders the E rows of `row_bytes` bytes at base: to_hf, row p moves to
 * row map[p] (slot order to the Hugging Face numbering); else row p takes
 * row map[p] (back to slot order). In place, one row of scratch, following
 * the permutation's cycles. Returns 0, or 1 when memory is short. */
static int permute_rows(unsigned char *base, int64_t E, int64_t row_bytes, const int32_t *map,
                        int to_hf) {
  if (E <= 1 || row_bytes <= 0) return 0;
  unsigned char *tmp = malloc((size_t)row_bytes);
  unsigned char *done = calloc((size_t)E, 1);
  int32_t *from = malloc((size_t)E * sizeof *from); /* new row q takes old row from[q] */
  if (!tmp || !done || !from) {
    free(tmp);
    free(done);
    free(from);
    return 1;
  }
  for (int64_t q = 0; q < E; q++)
    if (to_hf)
      from[map[q]] = (int32_t)q;
    else
      from[q] = map[q];
  for (int64_t start = 0; start < E; start++) {
    if (done[start] || from[start] == start) continue;
    memcpy(tmp, base + start * row_bytes, (size_t)row_bytes);
    int64_t q = start;
    for (;;) {
      done[q] = 1;
      int64_t src = from[q];
      if (src == start) {
        memcpy(base + q * row_bytes, tmp, (size_t)row_bytes);
        break;
      }
      memcpy(base + q * row_bytes, base + src * row_bytes, (size_t)row_bytes);
      q = src;
    }
  }
  free(tmp);
  free(done);
  free(from);
  return 0;
}

int xm_rt_program_is_placed(const xm_rt_program_t *p) {
  if (p->placement_rows <= 0) return 0;
  for (int i = 0; i < p->num_tensors; i++)
    if (p->tensors[i].placed) return 1;
  return 0;
}

xm_status_t xm_rt_placement_permute(const xm_rt_program_t *p, unsigned char *arena, int to_hf,
                                    xm_diag_t *diag) {
  for (int i = 0; i < p->num_tensors; i++) {
    const xm_rt_tensor_t *t = &p->tensors[i];
    if (!t->placed || !is_stored(t) || t->bytes == 0) continue;
    const int32_t *map = placement_row(p, t->placed);
    int64_t E = p->placement_experts, elems = 1;
    int ok = map && t->rank >= 1 && t->dims[0] == E && !t->split_group && !t->chunk_group &&
             (t->dtype == XM_RT_F32 || t->dtype == XM_RT_I32);
    for (int d = 0; ok && d < t->rank; d++)
      ok = t->dims[d] >= 0 && !__builtin_mul_overflow(elems, t->dims[d], &elems);
    if (!ok || elems * 4 > t->bytes)
      return bad_entry(diag, p, i, "is placed but is not a whole tensor with the experts on dim 0");
    if (permute_rows(arena + t->offset, E, elems / E * 4, map, to_hf)) {
      if (diag)
        xm_diag_add(diag, XM_DIAG_ERROR, NULL, t->name, "out of memory reordering the experts");
      return XM_ERR_NO_MEMORY;
    }
  }
  return XM_OK;
}

/* ---- initialisation ---------------------------------------------------------------- */

/* One stream: a whole param, or one expert of a stacked "{e}" param. The
 * stream yields full_n values; the rank keeps the elements its piece
 * geometry (block, full_block, index) selects, n of them, at ptr. */
typedef struct {
  float *ptr;
  int64_t n, full_n;
  int64_t block, full_block, index;
  char *name; /* owned: the stream name */
  int init;
  float std;
} init_unit_t;

/* `name` with every "{e}" replaced by the expert index. */
static char *expert_name(const char *name, int64_t e) {
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  for (const char *s = name; *s;) {
    if (strncmp(s, "{e}", 3) == 0) {
      xm_strbuf_printf(&b, "%lld", (long long)e);
      s += 3;
    } else {
      xm_strbuf_append(&b, s++, 1);
    }
  }
  return xm_strbuf_take(&b);
}

typedef struct {
  init_unit_t *u;
  int64_t n, cap;
} unit_list_t;

static init_unit_t *push_unit(unit_list_t *l) {
  if (l->n == l->cap) {
    int64_t cap = l->cap ? 2 * l->cap : 64;
    init_unit_t *grown = realloc(l->u, (size_t)cap * sizeof *grown);
    if (!grown) return NULL;
    l->u = grown;
    l->cap = cap;
  }
  init_unit_t *u = &l->u[l->n++];
  memset(u, 0, sizeof *u);
  return u;
}

static void free_units(unit_list_t *l) {
  for (int64_t k = 0; k < l->n; k++)
    free(l->u[k].name);
  free(l->u);
}

/* The units of param `ti`. A stacked param yields one unit per local
 * expert: split on dim 0 the rank's experts are global experts
 * index * L + l, whole per expert; split on a later dim each expert is a
 * full expert cut like the tensor. */
static xm_status_t param_units(const xm_rt_program_t *p, int ti, const xm_rt_rank_coords_t *rc,
                               unsigned char *persist, xm_diag_t *diag, unit_list_t *l) {
  const xm_rt_tensor_t *d = &p->tensors[ti];
  xm_rt_piece_t g;
  XM_RETURN_IF_ERROR(xm_rt_piece_of(p, ti, rc, diag, &g));
  if (d->offset < 0 || d->bytes / 4 < g.n || d->offset > p->persistent_bytes - d->bytes)
    return bad_entry(diag, p, ti, "does not fit the persistent arena");
  int stacked = strstr(d->name, "{e}") != NULL && d->rank >= 1 && d->dims[0] > 0;
  int64_t experts = stacked ? d->dims[0] : 1, per = g.n / experts;
  int split_experts = stacked && d->split_group && d->split_dim == 0;
  /* Under a placement slot s draws the stream of Hugging Face expert map[s]. */
  const int32_t *map = stacked ? placement_row(p, d->placed) : NULL;
  for (int64_t e = 0; e < experts; e++) {
    int64_t slot = split_experts ? g.index * experts + e : e;
    int64_t hf = map ? map[slot] : slot;
    init_unit_t *u = push_unit(l);
    if (!u) return XM_ERR_NO_MEMORY;
    u->ptr = (float *)(persist + d->offset) + e * per;
    u->n = per;
    u->init = d->init;
    u->std = d->init_std;
    if (!stacked) {
      u->name = strdup(d->name);
      u->full_n = g.full_elems;
      u->block = g.block;
      u->full_block = g.full_block;
      u->index = g.index;
    } else if (split_experts || !d->split_group) {
      u->name = expert_name(d->name, hf);
      u->full_n = per;
      u->block = per;
      u->full_block = per;
      u->index = 0;
    } else {
      /* A split inside each expert: the same runs, per expert. */
      u->name = expert_name(d->name, hf);
      u->full_n = per * g.parts;
      u->block = g.block;
      u->full_block = g.full_block;
      u->index = g.index;
    }
    if (!u->name) return XM_ERR_NO_MEMORY;
  }
  return XM_OK;
}

/* Fills one unit; returns 0, or 1 when the scratch buffer is missing. */
static int fill_unit(const init_unit_t *u, uint64_t seed) {
  if (u->init != XM_RT_INIT_NORMAL) {
    float v = u->init == XM_RT_INIT_ONES ? 1.0f : 0.0f;
    for (int64_t i = 0; i < u->n; i++)
      u->ptr[i] = v;
    return 0;
  }
  xm_rt_rng_t r;
  xm_rt_rng_seed_named(&r, seed, u->name);
  if (u->full_n == u->n) {
    xm_rt_rng_fill_normal(&r, u->ptr, u->n, 0.0, u->std);
    return 0;
  }
  float *full = malloc((size_t)(u->full_n > 0 ? u->full_n : 1) * sizeof *full);
  if (!full) return 1;
  xm_rt_rng_fill_normal(&r, full, u->full_n, 0.0, u->std);
  xm_rt_piece_t pc = {.n = u->n,
                      .block = u->block,
                      .full_block = u->full_block,
                      .index = u->index,
                      .lo = 0,
                      .hi = u->n,
                      .buffer_elems = u->n};
  xm_rt_piece_from_full(&pc, full, u->ptr, sizeof(float));
  free(full);
  return 0;
}

xm_status_t xm_rt_shard_init_params(const xm_rt_program_t *p, const xm_rt_rank_coords_t *rc,
                                    uint64_t seed, unsigned char *persist, xm_diag_t *diag) {
  unit_list_t l = {0};
  xm_status_t s = XM_OK;
  for (int i = 0; i < p->num_tensors && s == XM_OK; i++) {
    const xm_rt_tensor_t *d = &p->tensors[i];
    if (d->category != XM_RT_CAT_WEIGHTS || d->dtype != XM_RT_F32 || !d->name || !d->persistent)
      continue;
    s = param_units(p, i, rc, persist, diag, &l);
  }
  int missing = 0;
  if (s == XM_OK) {
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : missing)
    for (int64_t k = 0; k < l.n; k++)
      missing += fill_unit(&l.u[k], seed);
  }
  free_units(&l);
  /* The placed tensors that are not stacked (the router's rows, its bias)
   * were drawn whole in the Hugging Face order: into slot order. */
  for (int i = 0; i < p->num_tensors && s == XM_OK && !missing; i++) {
    const xm_rt_tensor_t *d = &p->tensors[i];
    if (d->category != XM_RT_CAT_WEIGHTS || !d->persistent || !d->placed ||
        strstr(d->name, "{e}"))
      continue;
    const int32_t *map = placement_row(p, d->placed);
    int64_t E = p->placement_experts, elems = 1;
    int ok = map && !d->split_group && d->rank >= 1 && d->dims[0] == E;
    for (int k = 0; ok && k < d->rank; k++)
      ok = d->dims[k] >= 0 && !__builtin_mul_overflow(elems, d->dims[k], &elems);
    if (!ok || elems * 4 > d->bytes)
      s = bad_entry(diag, p, i, "is placed but is not a whole tensor with the experts on dim 0");
    else
      missing += permute_rows(persist + d->offset, E, elems / E * 4, map, 0);
  }
  if (s == XM_OK && missing) {
    if (diag)
      xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL,
                  "out of memory for the scratch buffers of sliced initialisation");
    s = XM_ERR_NO_MEMORY;
  }
  return s;
}

/* ---- gather and scatter ---------------------------------------------------------- */

enum { SHARD_TAG = 0x5348 };
#define SHARD_PART_BYTES ((int64_t)1 << 30)

static int stored_now(const xm_rt_tensor_t *t, bool with_optimizer) {
  return is_stored(t) && (t->category == XM_RT_CAT_WEIGHTS || with_optimizer);
}

static void send_bytes(const unsigned char *buf, int64_t bytes, MPI_Comm comm) {
  for (int64_t at = 0; at < bytes; at += SHARD_PART_BYTES) {
    int64_t n = bytes - at < SHARD_PART_BYTES ? bytes - at : SHARD_PART_BYTES;
    MPI_Send(buf + at, (int)n, MPI_BYTE, 0, SHARD_TAG, comm);
  }
}

static void recv_bytes(unsigned char *buf, int64_t bytes, int from, MPI_Comm comm) {
  for (int64_t at = 0; at < bytes; at += SHARD_PART_BYTES) {
    int64_t n = bytes - at < SHARD_PART_BYTES ? bytes - at : SHARD_PART_BYTES;
    MPI_Recv(buf + at, (int)n, MPI_BYTE, from, SHARD_TAG, comm, MPI_STATUS_IGNORE);
  }
}

/* Worst status over the world (the enum grows with severity only loosely,
 * but any non-zero is a failure and every rank gets the same value). */
static xm_status_t agree_status(MPI_Comm comm, xm_status_t st) {
  int local = (int)st, global = local;
  if (comm != MPI_COMM_NULL) MPI_Allreduce(&local, &global, 1, MPI_INT, MPI_MAX, comm);
  return (xm_status_t)global;
}

/* The world's coordinates, one entry per rank. */
static xm_rt_rank_coords_t *all_coords(const xm_rt_comm_t *c) {
  xm_rt_rank_coords_t *rc = calloc((size_t)c->layout.world, sizeof *rc);
  for (int r = 0; rc && r < c->layout.world; r++)
    if (xm_rt_rank_coords(&c->layout, r, &rc[r]) != XM_OK) {
      free(rc);
      return NULL;
    }
  return rc;
}

/* The designated sender of each rank's piece of tensor `ti`: sender[r] is
 * the lowest rank holding the same (slice, chunk) as r. Keys index a table
 * of parts * chunk_parts entries (at most world^2, in practice <= world). */
static xm_status_t designate(const xm_rt_program_t *p, int ti, const xm_rt_rank_coords_t *rc,
                             int world, xm_rt_piece_t *pieces, int *sender, xm_diag_t *diag) {
  for (int r = 0; r < world; r++)
    XM_RETURN_IF_ERROR(xm_rt_piece_of(p, ti, &rc[r], diag, &pieces[r]));
  int64_t keys = pieces[0].parts * pieces[0].chunk_parts;
  int *first = malloc((size_t)(keys > 0 ? keys : 1) * sizeof *first);
  if (!first) return XM_ERR_NO_MEMORY;
  for (int64_t k = 0; k < keys; k++)
    first[k] = -1;
  for (int r = 0; r < world; r++) {
    int64_t k = pieces[r].index * pieces[r].chunk_parts + pieces[r].chunk_index;
    XM_ASSERT(k >= 0 && k < keys);
    if (first[k] < 0) first[k] = r;
    sender[r] = first[k];
  }
  free(first);
  return XM_OK;
}

xm_status_t xm_rt_shard_gather(const xm_rt_exec_t *x, const xm_rt_comm_t *c,
                               const xm_rt_full_view_t *v, bool with_optimizer, unsigned char *full,
                               xm_diag_t *diag) {
  const xm_rt_program_t *p = x->program;
  MPI_Comm comm = c->groups[XM_RT_GROUP_WORLD].comm;
  int world = c->layout.world, me = c->groups[XM_RT_GROUP_WORLD].index;
  xm_rt_rank_coords_t *rc = all_coords(c);
  xm_rt_piece_t *pieces = calloc((size_t)world, sizeof *pieces);
  int *sender = calloc((size_t)world, sizeof *sender);
  xm_status_t st = rc && pieces && sender ? XM_OK : XM_ERR_NO_MEMORY;
  /* Rank 0's receive buffer: the largest piece of any stored tensor. */
  int64_t max_bytes = 0;
  for (int i = 0; st == XM_OK && i < p->num_tensors; i++) {
    if (!stored_now(&p->tensors[i], with_optimizer)) continue;
    if (i >= v->program.num_tensors || v->tensors[i].bytes <= 0 ||
        v->tensors[i].dtype != p->tensors[i].dtype) {
      st = bad_entry(diag, p, i, "the full view does not match the program");
      break;
    }
    st = xm_rt_piece_of(p, i, &rc[me], diag, &pieces[0]);
    int64_t b = (pieces[0].hi - pieces[0].lo) * 4;
    if (b > max_bytes) max_bytes = b;
  }
  unsigned char *scratch = NULL;
  if (st == XM_OK && me == 0) {
    scratch = malloc((size_t)(max_bytes > 0 ? max_bytes : 1));
    if (!scratch || !full) st = XM_ERR_NO_MEMORY;
    if (st != XM_OK && diag)
      xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL,
                  "rank 0: no memory to gather the checkpoint (%lld bytes of whole tensors)",
                  (long long)v->program.persistent_bytes);
  }
  st = agree_status(comm, st);
  for (int i = 0; st == XM_OK && i < p->num_tensors; i++) {
    const xm_rt_tensor_t *t = &p->tensors[i];
    if (!stored_now(t, with_optimizer)) continue;
    /* The pieces were all checked above for this rank; the same table on
     * every rank makes the other ranks' pieces valid too. */
    st = designate(p, i, rc, world, pieces, sender, diag);
    if (st != XM_OK) xm_rt_abort(c->ctx, 1, "checkpoint gather: %s", xm_status_name(st));
    const unsigned char *mine = x->persist_host + t->offset;
    if (me != 0) {
      if (sender[me] == me) send_bytes(mine, (pieces[me].hi - pieces[me].lo) * 4, comm);
      continue;
    }
    unsigned char *dst = full + v->tensors[i].offset;
    for (int r = 0; r < world; r++) {
      if (sender[r] != r) continue;
      const unsigned char *src = mine;
      if (r != 0) {
        recv_bytes(scratch, (pieces[r].hi - pieces[r].lo) * 4, r, comm);
        src = scratch;
      }
      xm_rt_piece_to_full(&pieces[r], src, dst, 4);
    }
  }
  free(scratch);
  free(sender);
  free(pieces);
  free(rc);
  return st;
}

xm_status_t xm_rt_shard_scatter(xm_rt_exec_t *x, const xm_rt_rank_coords_t *rc,
                                const xm_rt_full_view_t *v, const unsigned char *full,
                                xm_diag_t *diag) {
  const xm_rt_program_t *p = x->program;
  for (int i = 0; i < p->num_tensors; i++) {
    const xm_rt_tensor_t *t = &p->tensors[i];
    if (!is_stored(t)) continue;
    xm_rt_piece_t pc;
    XM_RETURN_IF_ERROR(xm_rt_piece_of(p, i, rc, diag, &pc));
    if (i >= v->program.num_tensors || v->tensors[i].bytes < pc.full_elems * 4 ||
        t->bytes < pc.buffer_elems * 4)
      return bad_entry(diag, p, i, "the full view does not match the program");
  }
  for (int i = 0; i < p->num_tensors; i++) {
    const xm_rt_tensor_t *t = &p->tensors[i];
    if (!is_stored(t)) continue;
    xm_rt_piece_t pc;
    XM_RETURN_IF_ERROR(xm_rt_piece_of(p, i, rc, diag, &pc));
    xm_rt_piece_from_full(&pc, full + v->tensors[i].offset, x->persist_host + t->offset, 4);
  }
  return XM_OK;
}

/* ---- checkpoints ------------------------------------------------------------ */

static unsigned char *full_arena(int64_t bytes) {
  size_t size = (size_t)((bytes + 63) / 64 * 64);
  unsigned char *p = aligned_alloc(64, size ? size : 64);
  if (p) memset(p, 0, size ? size : 64);
  return p;
}

static MPI_Comm world_of(const xm_rt_comm_t *c) {
  return c ? c->groups[XM_RT_GROUP_WORLD].comm : MPI_COMM_NULL;
}

static int rank_of(const xm_rt_exec_t *x, const xm_rt_comm_t *c) {
  if (c) return c->groups[XM_RT_GROUP_WORLD].index;
  return x->ctx ? x->ctx->rank : 0;
}

xm_status_t xm_rt_shard_checkpoint_save(const xm_rt_exec_t *x, const xm_rt_comm_t *c,
                                        const xm_rt_full_view_t *v, const char *dir,
                                        const xm_rt_train_state_t *st, bool with_optimizer,
                                        xm_diag_t *diag) {
  MPI_Comm comm = world_of(c);
  if (!v && !xm_rt_program_is_placed(x->program)) {
    xm_status_t s =
        rank_of(x, c) == 0 ? xm_rt_checkpoint_save(x, dir, st, with_optimizer, diag) : XM_OK;
    return agree_status(comm, s);
  }
  if (!v) {
    /* Whole tensors in slot order: a copy in the Hugging Face numbering. */
    xm_status_t s = XM_OK;
    if (rank_of(x, c) == 0) {
      unsigned char *copy = full_arena(x->program->persistent_bytes);
      if (!copy) {
        if (diag)
          xm_diag_add(diag, XM_DIAG_ERROR, dir, NULL,
                      "no memory to reorder the experts for the checkpoint (%lld bytes)",
                      (long long)x->program->persistent_bytes);
        s = XM_ERR_NO_MEMORY;
      } else {
        memcpy(copy, x->persist_host, (size_t)x->program->persistent_bytes);
        s = xm_rt_placement_permute(x->program, copy, 1, diag);
        xm_rt_exec_t fx = *x;
        fx.persist = copy;
        fx.persist_host = copy;
        fx.act = NULL;
        if (s == XM_OK) s = xm_rt_checkpoint_save(&fx, dir, st, with_optimizer, diag);
        free(copy);
      }
    }
    return agree_status(comm, s);
  }
  if (!c) return bad_entry(diag, x->program, -1, "a sharded program saved without a communicator");
  int me = rank_of(x, c);
  unsigned char *full = me == 0 ? full_arena(v->program.persistent_bytes) : NULL;
  xm_status_t s = xm_rt_shard_gather(x, c, v, with_optimizer, full, diag);
  if (s == XM_OK && me == 0) s = xm_rt_placement_permute(&v->program, full, 1, diag);
  if (s == XM_OK && me == 0) {
    xm_rt_exec_t fx = *x;
    fx.program = &v->program;
    fx.persist = full;
    fx.persist_host = full;
    fx.act = NULL;
    s = xm_rt_checkpoint_save(&fx, dir, st, with_optimizer, diag);
  }
  free(full);
  return agree_status(comm, s);
}

static void zero_grads(xm_rt_exec_t *x) {
  const xm_rt_program_t *p = x->program;
  for (int i = 0; i < p->num_tensors; i++) {
    const xm_rt_tensor_t *t = &p->tensors[i];
    if (t->persistent && t->category == XM_RT_CAT_GRADS && t->bytes > 0)
      memset(x->persist_host + t->offset, 0, (size_t)t->bytes);
  }
}

/* A resume (st != NULL: weights, optimizer states when with_optimizer,
 * trainer state) or an import (st NULL: weights alone, --init-from) of
 * whole tensors, cut into this rank's pieces when the program is sharded. */
static xm_status_t shard_load(xm_rt_exec_t *x, const xm_rt_comm_t *c, const xm_rt_rank_coords_t *rc,
                              const xm_rt_full_view_t *v, const char *dir, bool with_optimizer,
                              xm_rt_train_state_t *st, xm_diag_t *diag) {
  MPI_Comm comm = world_of(c);
  if (st) memset(st, 0, sizeof *st);
  if (!v) {
    xm_status_t s = st ? xm_rt_checkpoint_load(x, dir, with_optimizer, st, diag)
                       : xm_rt_checkpoint_import(x, dir, diag);
    /* Read in the Hugging Face numbering: into slot order. */
    if (s == XM_OK) s = xm_rt_placement_permute(x->program, x->persist_host, 0, diag);
    return agree_status(comm, s);
  }
  unsigned char *full = full_arena(v->program.persistent_bytes);
  xm_status_t s = XM_OK;
  if (!full) {
    if (diag)
      xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL,
                  "no memory to read the checkpoint (%lld bytes of whole tensors)",
                  (long long)v->program.persistent_bytes);
    s = XM_ERR_NO_MEMORY;
  }
  xm_rt_train_state_t loaded = {0};
  if (s == XM_OK) {
    xm_rt_exec_t fx = *x;
    fx.program = &v->program;
    fx.persist = full;
    fx.persist_host = full;
    fx.act = NULL;
    s = st ? xm_rt_checkpoint_load(&fx, dir, with_optimizer, &loaded, diag)
           : xm_rt_checkpoint_import(&fx, dir, diag);
  }
  if (s == XM_OK) s = xm_rt_placement_permute(&v->program, full, 0, diag);
  s = agree_status(comm, s);
  if (s == XM_OK) s = agree_status(comm, xm_rt_shard_scatter(x, rc, v, full, diag));
  if (s == XM_OK) {
    zero_grads(x);
    if (st) *st = loaded;
  }
  free(full);
  return s;
}

xm_status_t xm_rt_shard_checkpoint_load(xm_rt_exec_t *x, const xm_rt_comm_t *c,
                                        const xm_rt_rank_coords_t *rc, const xm_rt_full_view_t *v,
                                        const char *dir, bool with_optimizer,
                                        xm_rt_train_state_t *st, xm_diag_t *diag) {
  XM_ASSERT(st != NULL);
  return shard_load(x, c, rc, v, dir, with_optimizer, st, diag);
}

xm_status_t xm_rt_shard_checkpoint_import(xm_rt_exec_t *x, const xm_rt_comm_t *c,
                                          const xm_rt_rank_coords_t *rc, const xm_rt_full_view_t *v,
                                          const char *dir, xm_diag_t *diag) {
  /* The full arena starts zeroed, so the optimizer states scattered from
   * it are zero: a fresh AdamW. */
  return shard_load(x, c, rc, v, dir, false, NULL, diag);
}
