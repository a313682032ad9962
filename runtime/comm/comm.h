/* runtime/comm/comm.h — the communicator of a generated program: parallel groups,
 * collectives on float rows, padding-free all-to-all, traffic accounting and
 * the one way ranks agree on a failure.
 *
 * Layout (docs/design.md, Parallel layout): world = dp * tp. TP groups are consecutive ranks
 * (rank r has tp index r % tp and dp index r / tp); a DP group holds the
 * ranks with the same tp index (dense-parameter gradients are reduced over
 * it). The MoE blocks run on all dp*tp ranks as token-parallel ranks (SSMB);
 * EP groups are consecutive blocks of `ep` ranks of them and the
 * expert-data-parallel (EDP) groups are strided by ep (expert-parameter
 * gradients are reduced over them). Node groups are the consecutive
 * `ranks_per_node` ranks of one (possibly emulated) node. Every group is an
 * MPI sub-communicator built with MPI_Comm_split whose MPI rank order is the
 * group index order, and knows the world rank of each member, so traffic can
 * be attributed to peers and to intra- or inter-node links.
 *
 * Collectives are SPMD: every member of the group calls them with matching
 * arguments. Arguments that are wrong on one rank only (negative counts, a
 * null buffer with rows to send) are caller bugs: they end every rank
 * through xm_rt_abort instead of leaving the peers blocked inside MPI. The
 * one data-dependent failure, an all-to-all delivering more rows than a
 * rank's receive buffer holds (the memory plan bounds it at compile time,
 * routing decides it at run time), is agreed on by the whole group before
 * any row moves: every member returns XM_ERR_NO_MEMORY with the same
 * message and nothing is written past any buffer.
 *
 * Traffic: each collective adds the bytes this rank puts on the wire to each
 * peer (world rank) into per-phase counters, split intra/inter node by the
 * node of the peer; the byte model of each collective and the output formats
 * are documented in docs/traffic.md. Counters are per step
 * (xm_rt_comm_traffic_reset) and are reduced to rank 0 by
 * xm_rt_comm_traffic_report.
 */
#ifndef XM_RUNTIME_COMM_H
#define XM_RUNTIME_COMM_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "runtime/comm/context.h"
#include "runtime/abi/groups.h"
#include "support/diag.h"
#include "support/status.h"
#include "support/strbuf.h"

/* xm_rt_group_kind_t and xm_rt_phase_t live in runtime/abi/groups.h (no MPI). */

/* The parallel layout. world and ranks_per_node may be 0 in the argument of
 * xm_rt_comm_create: they are then taken from the context. */
typedef struct {
  int dp, tp, ep;
  int world;
  int ranks_per_node;
} xm_rt_comm_layout_t;

typedef struct {
  xm_rt_group_kind_t kind;
  MPI_Comm comm; /* owned by the xm_rt_comm_t; MPI rank == group index */
  int size;
  int index;    /* this rank's index in the group */
  int *members; /* owned: world rank of each group index, ascending */
} xm_rt_comm_group_t;

/* Per-step byte counters of one rank (docs/traffic.md). Layer slots: slot 0
 * collects traffic without a layer, slot l + 1 that of layer l. */
typedef struct {
  int world;
  int64_t *sent;       /* owned: [XM_RT_PHASE_COUNT][world] bytes to each world rank */
  int64_t *layer_sent; /* owned: [layer_slots][XM_RT_PHASE_COUNT][world] */
  unsigned char *used; /* owned: [layer_slots][XM_RT_PHASE_COUNT] a call was made */
  int layer_slots;     /* slots in use this step */
  int layer_cap;       /* slots allocated */
} xm_rt_traffic_t;

typedef struct {
  const xm_rt_context_t *ctx; /* borrowed; outlives the communicator */
  xm_rt_comm_layout_t layout; /* world and ranks_per_node filled in */
  xm_rt_comm_group_t groups[XM_RT_GROUP_COUNT];
  xm_rt_traffic_t traffic;
  MPI_Datatype row_type; /* cached contiguous row type of row_width elements */
  MPI_Datatype row_base; /* element type of row_type */
  int64_t row_width;
  /* How the collectives of runtime/comm/spmd.c move device memory
   * (runtime/comm/transport.h); owned, NULL until the driver chooses one
   * (then they work on host memory, staged where the backend's is not). */
  struct xm_rt_transport *transport;
} xm_rt_comm_t;

/* Summed traffic of one step over all ranks (rank 0 of a report). */
typedef struct {
  int64_t intra[XM_RT_PHASE_COUNT];
  int64_t inter[XM_RT_PHASE_COUNT];
  int64_t intra_total, inter_total;
} xm_rt_traffic_totals_t;

/* "world", "dp", "tp", "ep", "edp", "node". */
const char *xm_rt_group_name(xm_rt_group_kind_t kind);
/* "dispatch", "combine", "all_reduce", "all_gather", "reduce_scatter", "other". */
const char *xm_rt_phase_name(xm_rt_phase_t phase);

/* Checks a complete layout (world and ranks_per_node > 0); every problem is
 * added to `diag` with its place (/parallel/dp, /parallel/tp, /parallel/ep,
 * or no place for the world and node sizes). XM_ERR_INVALID_INPUT if any. */
xm_status_t xm_rt_comm_layout_validate(const xm_rt_comm_layout_t *layout, xm_diag_t *diag);

/* The members of the group of `kind` that contains `world_rank` in a valid
 * layout, without MPI: writes the world ranks in group order to
 * out_members (room for layout->world entries) and this rank's index to
 * *out_index; returns the group size. */
int xm_rt_comm_layout_group(const xm_rt_comm_layout_t *layout, xm_rt_group_kind_t kind,
                            int world_rank, int *out_members, int *out_index);

/* Builds every group (collective over ctx->world_comm; every rank must call
 * it with the same layout). A layout that does not fit the world is bad
 * input (XM_ERR_INVALID_INPUT, reported in `diag` on every rank). The
 * caller owns *out (xm_rt_comm_destroy) and keeps ctx alive until then. */
xm_status_t xm_rt_comm_create(const xm_rt_context_t *ctx, const xm_rt_comm_layout_t *layout,
                              xm_diag_t *diag, xm_rt_comm_t **out);
/* Frees the groups and the transport (collective, like MPI_Comm_free). NULL
 * is a no-op. */
void xm_rt_comm_destroy(xm_rt_comm_t *c);
/* Frees a transport (runtime/comm/transport.c); NULL is a no-op. */
void xm_rt_transport_destroy(struct xm_rt_transport *t);

/* Borrowed; valid until xm_rt_comm_destroy. */
const xm_rt_comm_group_t *xm_rt_comm_group(const xm_rt_comm_t *c, xm_rt_group_kind_t kind);
/* Node of a world rank. */
static inline int xm_rt_comm_node_of(const xm_rt_comm_t *c, int world_rank) {
  return world_rank / c->layout.ranks_per_node;
}

/* ---- collectives on floats (phase in the name; sum reductions) ---- */

/* buf[n] = sum over the group of every member's buf[n], in place. */
xm_status_t xm_rt_comm_all_reduce(xm_rt_comm_t *c, xm_rt_group_kind_t kind, float *buf, int64_t n);
/* out_recv[size * n] = concatenation of every member's send[n] in group
 * order (the leading dim grows by the group size). */
xm_status_t xm_rt_comm_all_gather(xm_rt_comm_t *c, xm_rt_group_kind_t kind, const float *send,
                                  int64_t n, float *out_recv);
/* Sums send[size * n] over the group and keeps this rank's slice: out_recv[i]
 * = sum over members m of send_m[index * n + i]. */
xm_status_t xm_rt_comm_reduce_scatter(xm_rt_comm_t *c, xm_rt_group_kind_t kind, const float *send,
                                      int64_t n, float *out_recv);

/* ---- the byte models of the collectives (docs/traffic.md) ----
 * What each collective adds to the traffic counters, written once: the
 * collectives here and in runtime/comm/spmd.c call them, and so does a
 * transport that moves the same bytes without MPI (the NCCL path of
 * spmd.c), so the counters do not depend on what moved the bytes. The
 * reductions carry no layer. */

/* `bytes` of this member over its two ring neighbours (half each way, as
 * NCCL/RCCL run rings in both directions; a group of 2 has one
 * neighbour), and the zero to self that marks the call for the matrix. */
void xm_rt_comm_model_ring(xm_rt_comm_t *c, xm_rt_group_kind_t kind, xm_rt_phase_t phase,
                           int64_t bytes);
/* Ring all-reduce of n elements of elem_bytes each. */
void xm_rt_comm_model_all_reduce(xm_rt_comm_t *c, xm_rt_group_kind_t kind, int64_t n,
                                 int64_t elem_bytes);
/* All-gather / reduce-scatter of n floats per member. */
void xm_rt_comm_model_all_gather(xm_rt_comm_t *c, xm_rt_group_kind_t kind, int64_t n);
void xm_rt_comm_model_reduce_scatter(xm_rt_comm_t *c, xm_rt_group_kind_t kind, int64_t n);

/* ---- padding-free all-to-all of rows ---- */

/* The rows of an all-to-all: `width` elements each; send rows are laid out
 * by destination in group order, send_counts[size] rows to each member. */
typedef struct {
  xm_rt_phase_t phase; /* what the bytes are accounted as */
  int layer;           /* model layer for the per-layer matrix, or -1 */
  int64_t width;       /* elements per row, >= 1 */
} xm_rt_a2a_t;

/* Exchanges the row counts (MPI_Alltoall of ints), checks them against
 * recv_capacity (rows) on every member, then moves the rows
 * (MPI_Alltoallv): rows from member j land at out_recv_offsets[j] (rows),
 * out_recv_counts[j] of them, in group order. out_recv_offsets may be NULL.
 * *out_recv_total gets the rows received (also on overflow: the observed
 * size; then every member returns XM_ERR_NO_MEMORY with a message naming
 * the overflowing rank and nothing is received). Zero rows anywhere are
 * fine; buffers may then be NULL. */
xm_status_t xm_rt_comm_all_to_all_v(xm_rt_comm_t *c, xm_rt_group_kind_t kind, xm_rt_a2a_t rows,
                                    const float *send, const int64_t *send_counts, float *recv,
                                    int64_t recv_capacity, xm_diag_t *diag,
                                    int64_t *out_recv_counts, int64_t *out_recv_offsets,
                                    int64_t *out_recv_total);
/* The same for int32 rows (token indices, expert ids, RBD metadata). */
xm_status_t xm_rt_comm_all_to_all_v_i32(xm_rt_comm_t *c, xm_rt_group_kind_t kind, xm_rt_a2a_t rows,
                                        const int32_t *send, const int64_t *send_counts,
                                        int32_t *recv, int64_t recv_capacity, xm_diag_t *diag,
                                        int64_t *out_recv_counts, int64_t *out_recv_offsets,
                                        int64_t *out_recv_total);
/* xm_rt_comm_all_to_all_v without moving the rows, for a transport that
 * moves them itself (the NCCL path of runtime/comm/spmd.c): the counts are
 * exchanged, the bound agreed on (the same XM_ERR_NO_MEMORY and message on
 * every member) and the traffic accounted exactly as there; send and recv
 * are checked against the counts but never touched, so they may be device
 * addresses. out_recv_counts and out_recv_offsets (rows, may be NULL) say
 * where each member's rows belong. */
xm_status_t xm_rt_comm_all_to_all_v_counts(xm_rt_comm_t *c, xm_rt_group_kind_t kind,
                                           xm_rt_a2a_t rows, const float *send,
                                           const int64_t *send_counts, float *recv,
                                           int64_t recv_capacity, xm_diag_t *diag,
                                           int64_t *out_recv_counts, int64_t *out_recv_offsets,
                                           int64_t *out_recv_total);
/* The mirror exchange when both sides already know the counts (combine
 * after dispatch: the send counts are the dispatch's received counts, the
 * receive counts its send counts): no count exchange, no bound check —
 * the caller sized recv from recv_counts. */
xm_status_t xm_rt_comm_all_to_all_v_known(xm_rt_comm_t *c, xm_rt_group_kind_t kind,
                                          xm_rt_a2a_t rows, const float *send,
                                          const int64_t *send_counts, float *recv,
                                          const int64_t *recv_counts);

/* ---- traffic ---- */

/* Zeroes this rank's counters (at the start of a step). */
void xm_rt_comm_traffic_reset(xm_rt_comm_t *c);
/* Bytes this rank sent to `peer` (world rank) in `phase` since the reset. */
int64_t xm_rt_comm_traffic_sent(const xm_rt_comm_t *c, xm_rt_phase_t phase, int peer);
/* This rank's own totals (not reduced). */
void xm_rt_comm_traffic_local(const xm_rt_comm_t *c, xm_rt_traffic_totals_t *out);

/* Adds `bytes` sent by this rank to `peer` (world rank) in `phase` and, for
 * the per-layer matrix, to `layer` (-1: none). The collectives call it;
 * exposed for point-to-point transfers a schedule makes itself. */
void xm_rt_comm_traffic_add(xm_rt_comm_t *c, xm_rt_phase_t phase, int layer, int peer,
                            int64_t bytes);

/* Worlds up to this size also log the per-peer bytes of each step (the
 * "peers" member of docs/traffic.md). */
#define XM_RT_TRAFFIC_PEERS_MAX 16

/* Collective over the world. Sums the counters over ranks to rank 0, which
 * gets them in *out_totals (if not NULL) and appends the step-log member
 * `"traffic":{...}` (docs/traffic.md; no surrounding braces, no comma) to
 * out_json (if not NULL). With write_matrix (the same on every rank) rank 0
 * also appends one JSON line per (layer, phase) with traffic to `matrix`
 * (only rank 0's is used). A write error on rank 0 is XM_ERR_IO on every
 * rank, with the message in rank 0's diag. Does not reset the counters. */
xm_status_t xm_rt_comm_traffic_report(xm_rt_comm_t *c, int64_t step, int write_matrix, FILE *matrix,
                                      xm_diag_t *diag, xm_rt_traffic_totals_t *out_totals,
                                      xm_strbuf_t *out_json);

/* ---- failure ---- */

/* A safe point (collective over ctx->world_comm): every rank passes its own
 * status and message (NULL when OK). Returns XM_OK when all are OK;
 * otherwise every rank returns the status of the lowest failing rank and
 * gets "rank R: <its message>" in out_msg (truncated to out_size). */
xm_status_t xm_rt_comm_agree(const xm_rt_context_t *ctx, xm_status_t st, const char *msg,
                             char *out_msg, size_t out_size);
/* xm_rt_comm_agree, and when some rank failed: rank 0 prints
 * "xmoec: rank R: <message>" to stderr, every rank destroys `comm` (may be
 * NULL) and the context, finalises MPI and exits with xm_status_exit_code
 * of the failing status. Returns only when every rank passed XM_OK. */
void xm_rt_comm_exit_on_error(xm_rt_context_t *ctx, xm_rt_comm_t *comm, xm_status_t st,
                              const char *msg);

#endif /* XM_RUNTIME_COMM_H */
