/* runtime/io/shard_io.h — how the tensors a rank holds fit the whole tensors of
 * the model: sliced initialisation, and checkpoints that always hold whole
 * tensors whatever the parallel layout (internal to the training driver).
 *
 * A multi-rank program's tensor table (runtime/abi/program.h) describes this
 * rank's buffers: a split tensor (split_group) holds slice `index` of dim
 * split_dim of the full tensor, `index` being the rank's index in that
 * group; a ZeRO-1 optimizer state (chunk_group) holds chunk `index` of the
 * flattened (slice of the) param it belongs to. Everything here is derived
 * from the table and the layout (runtime/comm/comm.h) alone:
 *
 *  - rank coordinates: any rank's index in, and the size of, every group,
 *    computed without MPI, so rank 0 can tell where each rank's piece goes;
 *  - pieces: where each element of one rank's buffer sits in the full tensor;
 *  - the full view: a program table with the same tensor names and indices
 *    whose params and optimizer states have their full dims, packed into one
 *    persistent arena. runtime/io/checkpoint.c reads and writes that view, so a
 *    checkpoint saved under one layout loads under any other;
 *  - sliced init: every rank's params get exactly the values a 1-rank run
 *    gives the same elements of the full tensor;
 *  - gather (save) and scatter (load) of the pieces between the local arena
 *    and a full arena.
 *
 * A program without split or chunked tensors (every 1-rank program, and
 * plain data parallelism) needs none of this: its own table is its full
 * view, and the checkpoint wrappers below then call runtime/io/checkpoint.c on
 * the local exec directly.
 */
#ifndef XM_RUNTIME_SHARD_IO_H
#define XM_RUNTIME_SHARD_IO_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/io/checkpoint.h"
#include "runtime/comm/comm.h"
#include "runtime/abi/program.h"
#include "support/diag.h"
#include "support/status.h"

/* ---- coordinates ---------------------------------------------------------- */

/* One rank's index in, and the size of, the group of each kind. */
typedef struct {
  int index[XM_RT_GROUP_COUNT];
  int size[XM_RT_GROUP_COUNT];
} xm_rt_rank_coords_t;

/* The coordinates of `world_rank` in a complete, valid layout (world and
 * ranks_per_node filled in: xm_rt_comm_t.layout). NULL layout: one rank,
 * every index 0 and every size 1. No MPI. */
xm_status_t xm_rt_rank_coords(const xm_rt_comm_layout_t *layout, int world_rank,
                              xm_rt_rank_coords_t *out);

/* 1 when some tensor of the table is split or chunked. */
int xm_rt_program_is_sharded(const xm_rt_program_t *p);

/* ---- pieces ------------------------------------------------------------------ */

/* Where one rank's buffer of a table tensor sits in the full tensor. The
 * "local slice" is the tensor (or, for a ZeRO-1 chunk, the param it
 * belongs to) as this rank holds it: n elements. Its element e is element
 *   (e / block) * full_block + index * block + e % block
 * of the flattened full tensor (block = the product of the local dims from
 * the split dim on, full_block = block * parts; a whole tensor has parts 1,
 * index 0 and block n). The buffer holds elements [lo, hi) of the local
 * slice at buffer offsets 0 .. hi-lo; a chunk's buffer has buffer_elems
 * >= hi - lo elements, the rest zero padding. */
typedef struct {
  int64_t n;            /* elements of the local slice */
  int64_t block;        /* local slice elements per outer index */
  int64_t full_block;   /* block * parts */
  int64_t parts;        /* size of the split group (1: whole) */
  int64_t index;        /* slice number (0: whole) */
  int64_t lo, hi;       /* the local slice elements held */
  int64_t chunk_index;  /* ZeRO-1 chunk number (0 when not chunked) */
  int64_t chunk_parts;  /* size of the chunk group (1 when not chunked) */
  int64_t buffer_elems; /* elements of this rank's buffer */
  int64_t full_elems;   /* elements of the full tensor: n * parts */
} xm_rt_piece_t;

/* The piece of table tensor `ti` held by the rank with coordinates `rc`.
 * Checks the table entry (split dim in range, group kinds known, a chunk's
 * param valid and its dims {ceil(n / P)}, no size overflow): a bad entry is
 * XM_ERR_INTERNAL (a code generator bug) with a message naming the tensor. */
xm_status_t xm_rt_piece_of(const xm_rt_program_t *p, int ti, const xm_rt_rank_coords_t *rc,
                           xm_diag_t *diag, xm_rt_piece_t *out);
/* Full-tensor element of local slice element e (lo <= e < hi). */
int64_t xm_rt_piece_full_offset(const xm_rt_piece_t *pc, int64_t e);
/* Copies the buffer's hi - lo elements (elem_size bytes each) into their
 * places in `full`. */
void xm_rt_piece_to_full(const xm_rt_piece_t *pc, const void *buffer, void *full, size_t elem_size);
/* Fills the buffer from `full`: hi - lo elements, then zeros up to
 * buffer_elems. */
void xm_rt_piece_from_full(const xm_rt_piece_t *pc, const void *full, void *buffer,
                           size_t elem_size);

/* ---- the full view --------------------------------------------------------- */

/* A program table of whole tensors. Table indices, names (borrowed from the
 * local table), categories, dtypes, inits and param links are the local
 * table's. Persistent params and optimizer states (the tensors a
 * checkpoint stores) get the full tensor's dims (a ZeRO-1 chunk those of
 * its param's full tensor), no split or chunk marks, and offsets packed in
 * table order into one persistent arena of program.persistent_bytes.
 * Every other tensor (gradients, inputs, activations) is left out of the
 * arenas: persistent 0, offset 0, bytes 0 (gradients are zero at a step
 * boundary and never stored). The non-tensor fields are the local
 * program's, except activation_bytes 0 and category_bytes recomputed for
 * weights and optimizer states. */
typedef struct {
  xm_rt_program_t program;
  xm_rt_tensor_t *tensors; /* owned; program.tensors points here */
  int64_t stored;          /* tensors in the arena */
} xm_rt_full_view_t;

/* Builds the full view of `local` for the group sizes of `rc` (the same on
 * every rank). A bad table entry: XM_ERR_INTERNAL and a message (see
 * xm_rt_piece_of); *out is then empty. Destroy with xm_rt_full_view_destroy. */
xm_status_t xm_rt_full_view_create(const xm_rt_program_t *local, const xm_rt_rank_coords_t *rc,
                                   xm_diag_t *diag, xm_rt_full_view_t *out);
void xm_rt_full_view_destroy(xm_rt_full_view_t *v);

/* ---- expert placement ------------------------------------------------------ */

/* A program with an expert placement (runtime/abi/program.h, placed) keeps
 * the placed tensors in slot order; checkpoints hold them in the Hugging
 * Face numbering, so any checkpoint loads under any placement. The save and
 * load wrappers below reorder whole tensors at the edge (a copy of the
 * arena on save when the program is not sharded), initialisation draws
 * each slot as its Hugging Face expert. */

/* 1 when some tensor of the table is placed under a placement row. */
int xm_rt_program_is_placed(const xm_rt_program_t *p);

/* Reorders dim 0 of every stored placed tensor of `p` (a table of whole
 * tensors: a program that is not sharded, or a full view) in `arena`:
 * to_hf != 0 from slot order to the Hugging Face numbering, else back. A
 * placed entry that is not whole: XM_ERR_INTERNAL naming it. */
xm_status_t xm_rt_placement_permute(const xm_rt_program_t *p, unsigned char *arena, int to_hf,
                                    xm_diag_t *diag);

/* ---- initialisation -------------------------------------------------------- */

/* Initialises every f32 param (category weights) of `p` in the persistent
 * arena `persist` for the rank with coordinates `rc`: the values are those
 * a 1-rank run gives the same elements of the full tensor. Each param (or
 * each expert of a stacked "{e}" param, under its global name) draws from
 * its own stream (runtime/io/rng.h) seeded from `seed` and the name (under
 * an expert placement, slot s of a stacked param draws the stream of the
 * Hugging Face expert it holds, and the router's rows are drawn in the
 * Hugging Face order and moved to slot order, so every placement starts
 * from the identity's weights). Experts
 * split over dim 0 are generated one by one (only the rank's own); other
 * splits generate the full tensor (or expert) in a scratch buffer and copy
 * the slice. Fails only on a bad table entry or when a scratch buffer
 * cannot be allocated (XM_ERR_NO_MEMORY). */
xm_status_t xm_rt_shard_init_params(const xm_rt_program_t *p, const xm_rt_rank_coords_t *rc,
                                    uint64_t seed, unsigned char *persist, xm_diag_t *diag);

/* ---- gather and scatter ------------------------------------------------------ */

/* Collective over the world of `c`. Sends every rank's piece of each stored
 * tensor (params; optimizer states too when with_optimizer) of x->program to
 * rank 0, which writes it into its place in `full` (the persistent arena of
 * `v`, allocated by rank 0's caller; ignored elsewhere). Each distinct piece
 * travels once, from the lowest rank that holds it (replicas are
 * identical). Rank 0 lacking `full` or a receive buffer is agreed on before
 * anything moves: every rank then returns the same error. */
xm_status_t xm_rt_shard_gather(const xm_rt_exec_t *x, const xm_rt_comm_t *c,
                               const xm_rt_full_view_t *v, bool with_optimizer, unsigned char *full,
                               xm_diag_t *diag);

/* Local (no MPI): copies this rank's piece of every stored tensor (params
 * and optimizer states) out of `full` (an arena of `v`) into x->persist,
 * zero padding the tails of chunks. */
xm_status_t xm_rt_shard_scatter(xm_rt_exec_t *x, const xm_rt_rank_coords_t *rc,
                                const xm_rt_full_view_t *v, const unsigned char *full,
                                xm_diag_t *diag);

/* ---- checkpoints ----------------------------------------------------------- */

/* Collective over the world of `c` (c may be NULL on a single rank). Writes
 * the checkpoint of whole tensors a 1-rank run of the full model writes:
 * for a sharded program (v not NULL) the pieces are gathered into a full
 * arena on rank 0, which saves it; otherwise rank 0 saves its own arena.
 * Returns the same status on every rank (the worst), the message in the
 * diag of the rank where it happened. */
xm_status_t xm_rt_shard_checkpoint_save(const xm_rt_exec_t *x, const xm_rt_comm_t *c,
                                        const xm_rt_full_view_t *v, const char *dir,
                                        const xm_rt_train_state_t *st, bool with_optimizer,
                                        xm_diag_t *diag);

/* Collective over the world of `c` (c may be NULL on a single rank). Every
 * rank reads the checkpoint (whole tensors) itself: a sharded program (v not
 * NULL) reads it into a temporary full arena and copies its own pieces out
 * (runtime/io/checkpoint.c checks names, shapes and dtypes against the full
 * view). Gradients are zeroed; optimizer states are zeroed when not
 * with_optimizer. Returns the same status on every rank; on failure the
 * local arena is unchanged. */
xm_status_t xm_rt_shard_checkpoint_load(xm_rt_exec_t *x, const xm_rt_comm_t *c,
                                        const xm_rt_rank_coords_t *rc, const xm_rt_full_view_t *v,
                                        const char *dir, bool with_optimizer,
                                        xm_rt_train_state_t *st, xm_diag_t *diag);

/* The same for --init-from (xm_rt_checkpoint_import): the weights alone,
 * under any layout; gradients and optimizer states are zeroed, nothing
 * else is read. Collective; the same status on every rank. */
xm_status_t xm_rt_shard_checkpoint_import(xm_rt_exec_t *x, const xm_rt_comm_t *c,
                                          const xm_rt_rank_coords_t *rc, const xm_rt_full_view_t *v,
                                          const char *dir, xm_diag_t *diag);

#endif /* XM_RUNTIME_SHARD_IO_H */
