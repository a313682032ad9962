/* runtime/comm/spmd.h — the collectives and data movement of a multi-rank
 * schedule, as the generated program (codegen/c_program.c) calls them.
 *
 * Every function takes the exec state; x->comm is the communicator the
 * training driver built from the program's layout (runtime/comm/comm.h). Group
 * arguments are xm_rt_group_kind_t values (runtime/abi/groups.h). Each call is
 * SPMD: every member of the group makes it with matching sizes. A failure
 * (an MPI error, a receive bound exceeded) ends every rank through
 * xm_rt_fail with a message naming the op; nothing here returns an error.
 * `layer` is the model layer for the per-layer traffic matrix, -1 for none.
 * Sizes are elements unless they say rows.
 */
#ifndef XM_RUNTIME_SPMD_H
#define XM_RUNTIME_SPMD_H

#include <stdint.h>

#include "runtime/abi/groups.h"
#include "runtime/abi/program.h"

/* This rank's index in group `group`, and the group's size. */
int64_t xm_rt_group_index(const xm_rt_exec_t *x, int group);
int64_t xm_rt_group_size(const xm_rt_exec_t *x, int group);

/* out[n] = sum over the group of every member's in[n]; in == out allowed. */
void xm_rt_all_reduce(xm_rt_exec_t *x, int group, int layer, const float *in, float *out,
                      int64_t n);
/* In place sum of an int32 buffer (load counters). */
void xm_rt_all_reduce_i32(xm_rt_exec_t *x, int group, int layer, int32_t *buf, int64_t n);
/* out[size*n] = concatenation of every member's in[n] in group order. */
void xm_rt_all_gather(xm_rt_exec_t *x, int group, int layer, const float *in, float *out,
                      int64_t n);
/* out[n] = this member's slice [index*n, index*n + n) of the sum over the
 * group of every member's in[size*n]. */
void xm_rt_reduce_scatter(xm_rt_exec_t *x, int group, int layer, const float *in, float *out,
                          int64_t n);
/* out[n] = in[index*n .. index*n + n) (narrow of the leading dim; no
 * communication); elem_bytes is 4 for f32 and i32. */
void xm_rt_narrow(xm_rt_exec_t *x, int group, const void *in, void *out, int64_t n,
                  int64_t elem_bytes);

/* exchange_counts: send[P*L] -> recv[P*L] (recv[p*L + l] = rows member p
 * sends to this rank's local expert l), tpe[L] = column sums of recv. */
void xm_rt_exchange_counts(xm_rt_exec_t *x, int group, int layer, const int32_t *send,
                           int32_t *recv, int32_t *tpe, int64_t L);
/* all_to_all: send rows (width floats each) grouped by destination member,
 * member p getting sum_l send_counts[p*L + l] rows; receives
 * sum_l recv_counts[p*L + l] rows from each member p, in member order,
 * into recv, which holds recv_bound rows. Returns the rows received. More
 * than recv_bound rows is agreed on by the group and fails every rank with
 * the observed size (never a write past the buffer). phase is
 * XM_RT_PHASE_DISPATCH or XM_RT_PHASE_COMBINE (traffic accounting). */
int64_t xm_rt_all_to_all(xm_rt_exec_t *x, int group, int phase, int layer, const float *send,
                         const int32_t *send_counts, const int32_t *recv_counts, int64_t L,
                         int64_t width, float *recv, int64_t recv_bound);

/* ZeRO-1. The flattened tensor of n elements is cut into chunks of
 * c = ceil(n / size) elements; member i owns [i*c, min(n, (i+1)*c)). */
static inline int64_t xm_rt_chunk(int64_t n, int64_t size) { return (n + size - 1) / size; }
/* chunk[c] = sum over the group of this member's chunk of grad[n]; the
 * elements of chunk past the owned range are set to 0. */
void xm_rt_zero_reduce_scatter(xm_rt_exec_t *x, int group, const float *grad, int64_t n,
                               float *chunk);
/* Gathers every member's owned range of param[n] into every member, in place. */
void xm_rt_zero_gather(xm_rt_exec_t *x, int group, float *param, int64_t n);

#endif /* XM_RUNTIME_SPMD_H */
