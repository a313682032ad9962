/* runtime/comm/context.h — the process context of a generated training program.
 *
 * The runtime always starts under MPI (a single process is world size 1), so
 * nothing above it assumes one rank. The context knows the rank, the world
 * size and the node layout. Node layout: by default the ranks that share a
 * machine (MPI_COMM_TYPE_SHARED); XM_RANKS_PER_NODE=n in the environment
 * overrides it so that a 2-core box can emulate 2 nodes of 2 ranks, which is
 * how the multi-node techniques (RBD) are tested here. Errors on any rank
 * end every rank (xm_rt_abort) instead of hanging the others.
 */
#ifndef XM_RUNTIME_CONTEXT_H
#define XM_RUNTIME_CONTEXT_H

#include <mpi.h>

#include "support/status.h"

struct xm_rt_context {
  int rank;
  int world;
  int ranks_per_node;
  int node;          /* rank / ranks_per_node */
  int local_rank;    /* rank % ranks_per_node */
  int num_nodes;
  MPI_Comm world_comm; /* a duplicate of MPI_COMM_WORLD owned by the context */
  MPI_Comm node_comm;  /* ranks of this node */
  int owns_mpi;        /* MPI_Init was called by xm_rt_context_create */
  int rpn_from_env;    /* ranks_per_node came from XM_RANKS_PER_NODE */
};
/* Also declared by runtime/abi/program.h (C11 allows the repetition). */
typedef struct xm_rt_context xm_rt_context_t;

/* Initialises MPI (unless already initialised) and fills `ctx`. Returns
 * XM_ERR_INVALID_INPUT when XM_RANKS_PER_NODE is malformed or does not
 * divide the world size. */
xm_status_t xm_rt_context_create(int *argc, char ***argv, xm_rt_context_t *ctx);
/* Makes every n consecutive ranks one node (node, local_rank, num_nodes,
 * node_comm); collective over the world. XM_ERR_INVALID_INPUT when n does
 * not divide the world size. */
xm_status_t xm_rt_context_set_ranks_per_node(xm_rt_context_t *ctx, int n);
/* Frees the communicators and finalises MPI if the context initialised it. */
void xm_rt_context_destroy(xm_rt_context_t *ctx);

/* Prints "xmoec: rank R: <message>" to stderr and ends every rank with
 * `exit_code` (MPI_Abort). Never returns. */
void xm_rt_abort(const xm_rt_context_t *ctx, int exit_code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));

#endif /* XM_RUNTIME_CONTEXT_H */
