/* fabric/collective.h — the flows of one collective, as the runtime sends
 * and counts them (docs/traffic.md, "Byte model per collective").
 *
 * A builder appends the flows of one collective over one group to a phase
 * (fabric/flow.h) and raises the phase's latency_steps to the collective's
 * rounds, so that the collectives of the groups that run side by side (all
 * the DP groups of a layout, every EP group's all-to-all) can share one
 * phase: their flows contend and the phase waits for the slowest.
 *
 * Groups are arithmetic progressions of world ranks {first, first + stride,
 * ...} (size members), the groups of frontend/layout.h and planner/network.h.
 * Ring collectives follow the runtime's byte model to the byte: two rings
 * in opposite directions by group index, member i sends floor(bytes_i / 2)
 * to its successor and the rest to its predecessor, everything to the one
 * peer of a group of 2, nothing in a group of 1; bytes_i is what
 * planner/network.h's xm_net_ring_member gives.
 *
 * Ownership: the phase owns what is appended (xm_fab_phase_free); arrays
 * returned through out_* pointers belong to the caller (free()).
 */
#ifndef XM_FABRIC_COLLECTIVE_H
#define XM_FABRIC_COLLECTIVE_H

#include <stdint.h>

#include "fabric/flow.h"
#include "frontend/layout.h"
#include "support/status.h"

/* first, first + stride, ..., first + (size - 1) stride. */
typedef struct {
  int64_t first, stride, size;
} xm_fab_group_t;

/* The ring collectives; `bytes` means what planner/network.h's
 * xm_net_coll_t says for the kind of the same name. */
typedef enum {
  XM_FAB_ALL_REDUCE,          /* bytes: the buffer every member holds */
  XM_FAB_ALL_GATHER,          /* bytes: what each member contributes */
  XM_FAB_REDUCE_SCATTER,      /* bytes: the slice each member keeps */
  XM_FAB_ZERO_REDUCE_SCATTER, /* ZeRO-1, chunks of ceil(n/P); bytes: the whole buffer */
  XM_FAB_ZERO_ALL_GATHER,     /* ZeRO-1's gather of the chunks; bytes: the whole buffer */
  XM_FAB_COLL_COUNT_
} xm_fab_coll_t;

/* The docs/traffic.md phase a kind is counted in: "all_reduce",
 * "all_gather" (both gathers) or "reduce_scatter" (both scatters). */
const char *xm_fab_coll_phase_name(xm_fab_coll_t kind);

/* Message rounds of the ring on its critical path: 2 (P-1) for the
 * all-reduce, P-1 for the others, 0 for P < 2. */
double xm_fab_ring_steps(xm_fab_coll_t kind, int64_t P);

/* Bytes member i (0 <= i < P) of a ring of P members sends in the whole
 * collective over a buffer of `bytes`. Exact, with the runtime's chunks
 * (4-byte elements when `bytes` is a multiple of 4, bytes otherwise), for a
 * whole number of bytes below 2^52; otherwise the continuous figure (every
 * member the same: 2 (P-1)/P bytes for the all-reduce, (P-1) bytes for the
 * all-gather and reduce-scatter, (P-1)/P bytes for the ZeRO kinds). */
double xm_fab_ring_member_bytes(xm_fab_coll_t kind, int64_t P, double bytes, int64_t i);

/* World rank of member i of g. */
static inline int64_t xm_fab_group_member(xm_fab_group_t g, int64_t i) {
  return g.first + i * g.stride;
}

/* Appends the ring collective `kind` over g (2 P flows at most; with the
 * non-integral sizes of xm_fab_ring_member_bytes each member splits its
 * bytes in two exact halves) and raises p->latency_steps to its rounds.
 * XM_ERR_INVALID_INPUT for a malformed group (size < 1, first < 0,
 * stride < 1 with size > 1) or a negative or non-finite size;
 * XM_ERR_NO_MEMORY. */
xm_status_t xm_fab_ring(xm_fab_phase_t *p, xm_fab_coll_t kind, xm_fab_group_t g, double bytes);

/* A direct all-to-all(v) over g: member i sends matrix[i * P + j] bytes to
 * member j (P = g.size, row-major; the diagonal, what a member keeps, is
 * not sent). Raises latency_steps to P - 1 when some byte moves (one
 * message per peer, as the planner counts an all-to-all's latency). Errors as
 * xm_fab_ring (a negative or non-finite entry is invalid). */
xm_status_t xm_fab_all_to_all(xm_fab_phase_t *p, xm_fab_group_t g, const double *matrix);

/* The all-to-all in which every member sends `bytes` to every other one. */
xm_status_t xm_fab_all_to_all_uniform(xm_fab_phase_t *p, xm_fab_group_t g, double bytes);

/* ---- the groups of a layout --------------------------------------------- */

/* The groups of `kind` under layout l, in the order of their member 0's
 * world rank: the tiles of the world that frontend/layout.h's
 * xm_layout_group gives (every DP group {r, r + tp, ...} for r < tp, every
 * EP block, ...). The array is the caller's (free()). XM_ERR_INVALID_INPUT
 * when l cannot give groups (dp, tp or ep below 1, ep or the node size not
 * dividing the world, a world above XM_LAYOUT_WORLD_MAX); XM_ERR_NO_MEMORY. */
xm_status_t xm_fab_layout_groups(const xm_layout_t *l, xm_group_kind_t kind,
                                 xm_fab_group_t **out_groups, int64_t *out_num);

/* xm_fab_ring over every group of `kind` (all in the one phase). */
xm_status_t xm_fab_ring_layout(xm_fab_phase_t *p, const xm_layout_t *l, xm_group_kind_t kind,
                               xm_fab_coll_t coll, double bytes);

/* xm_fab_all_to_all_uniform over every group of `kind`. */
xm_status_t xm_fab_all_to_all_uniform_layout(xm_fab_phase_t *p, const xm_layout_t *l,
                                             xm_group_kind_t kind, double bytes);

/* ---- servers -------------------------------------------------------------- */

/* Adds the bytes of p's flows between different servers to `demand`
 * (servers x servers, row-major: demand[s * servers + d] is what server s
 * sends server d; rank r lives on server r / ranks_per_server). Flows
 * inside a server are left out, so the diagonal stays as it was. Summing
 * the phases of an iteration (or of one layer) into one matrix gives the
 * demand fabric/ocs.h plans circuits for. XM_ERR_INVALID_INPUT when
 * ranks_per_server < 1 or a flow's rank lies outside the servers. */
xm_status_t xm_fab_server_demand(const xm_fab_phase_t *p, int64_t servers, int64_t ranks_per_server,
                                 double *demand);

/* The same into a fresh zeroed matrix (the caller's, free()); checks that
 * servers^2 doubles can be allocated. */
xm_status_t xm_fab_server_demand_create(const xm_fab_phase_t *phases, int64_t num_phases,
                                        int64_t servers, int64_t ranks_per_server,
                                        double **out_demand);

#endif /* XM_FABRIC_COLLECTIVE_H */
