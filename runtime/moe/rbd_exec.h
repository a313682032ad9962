/* runtime/moe/rbd_exec.h — redundancy-bypassing dispatch (RBD;
 * docs/design.md, Redundancy-bypassing dispatch)
 * executed over MPI for the generated program: the run-time side of the IR
 * ops rbd_dispatch, rbd_combine, rbd_combine_grad and rbd_dispatch_grad.
 *
 * The plans come from runtime/moe/rbd.h (pure functions, pilot rule
 * XM_RT_RBD_PILOT_FIRST); this layer moves the rows with the communicator of
 * x->comm (runtime/comm/comm.h) over the EP group (XM_RT_GROUP_EP) and, for the
 * replicas, over the EP ranks of this node (the NODE group when every node
 * lies inside one EP group, else the EP group with zero counts to the ranks
 * of other nodes). Nodes are the comm layout's ranks_per_node. With x->comm
 * NULL (one rank) all E experts are on this rank and nothing moves.
 *
 * Every call is SPMD over the EP group: every member makes the same calls in
 * the same order with the same T, k, H and E (the program's static shapes).
 * Failures (an expert id >= E, E not divisible by ep, more rows than
 * `bound`, a call for a slot that was never dispatched, exhausted memory)
 * end every rank through xm_rt_fail (runtime/abi/program.h); nothing here
 * returns an error. Traffic goes to the comm counters with the caller's
 * layer: phase DISPATCH for the dispatch (rows, weights and expert ids) and
 * for rbd_combine_grad's dout rows, phase COMBINE for the combine,
 * rbd_dispatch_grad and the dweights rows (byte model in docs/traffic.md).
 *
 * Routing records: rbd_dispatch keeps what the three later calls need (the
 * plans, the counts of every exchange, the routing weights of the received
 * rows; not the rows themselves) in a record indexed by `slot`, in x->rbd,
 * which this layer allocates on first use and xm_rt_rbd_exec_free releases.
 * Dispatching a slot again replaces its record.
 */
#ifndef XM_RUNTIME_RBD_EXEC_H
#define XM_RUNTIME_RBD_EXEC_H

#include <stdint.h>

#include "runtime/abi/program.h"

/* Dispatches T tokens (tokens[T,H]) routed to experts[T,k] (int32 ids,
 * negative = dropped slot) with routing weights weights[T,k], for E routed
 * experts spread contiguously over the EP group (L = E / ep per rank).
 * Writes rows[m] (m < M) = the token row of this rank's m-th (row, slot)
 * pair in expert-major order and tpe[L] = rows per local expert; returns
 * M. rows holds `bound` rows: when some member of the EP group would hold
 * more, every member fails with the observed size (nothing is written past
 * rows). The caller owns every buffer; the record of `slot` is kept in x. */
int64_t xm_rt_rbd_dispatch(xm_rt_exec_t *x, int slot, int layer, const float *tokens,
                           const int32_t *experts, const float *weights, int64_t T, int64_t k,
                           int64_t H, int64_t E, float *rows, int32_t *tpe, int64_t bound);

/* out[t] = sum over t's kept slots j of w[t,j] * rows[m(t,j)] (rows[M,H]
 * the expert outputs in the dispatch's order, out[T,H]); tokens without a
 * kept slot get 0. */
void xm_rt_rbd_combine(xm_rt_exec_t *x, int slot, int layer, const float *rows, float *out);

/* The backward of rbd_combine: drows[m] = w(slot m) * dout[token of m] and
 * dweights[t,j] = dot(dout[t], rows[m(t,j)]) (0 for a dropped slot).
 * dout[T,H], rows[M,H] (the combine's input), drows[M,H], dweights[T,k]. */
void xm_rt_rbd_combine_grad(xm_rt_exec_t *x, int slot, int layer, const float *dout,
                            const float *rows, float *drows, float *dweights);

/* The backward of rbd_dispatch: dx[t] = sum over t's kept slots of
 * drows[m(t,j)] (drows[M,H], dx[T,H]). */
void xm_rt_rbd_dispatch_grad(xm_rt_exec_t *x, int slot, int layer, const float *drows, float *dx);

/* Rows this rank's rbd_dispatch calls sent to ranks of other nodes (pilots
 * crossing nodes) since the last reset, and the rows a flat dispatch of the
 * same routing would have sent across nodes (xm_rt_rbd_flat_counts), summed
 * over every dispatch. reset != 0 zeroes both after reading. Either out
 * pointer may be NULL. */
void xm_rt_rbd_stats(xm_rt_exec_t *x, int64_t *out_rbd_inter_rows, int64_t *out_flat_inter_rows,
                     int reset);

/* Frees every routing record and x->rbd (sets it to NULL). Safe to call
 * twice or when nothing was dispatched. */
void xm_rt_rbd_exec_free(xm_rt_exec_t *x);

#endif /* XM_RUNTIME_RBD_EXEC_H */
