/* tests/unit/test_mpi_context.c — the runtime process context under
 * `mpirun -np 2` (ctest starts it that way because of the test_mpi_ name).
 *
 * MPI can be initialised only once per process, so this is a plain main()
 * rather than a CMocka group: the first context initialises MPI and stays
 * alive while later contexts (which then do not own MPI) try the node-layout
 * variants of XM_RANKS_PER_NODE; destroying the first one finalises MPI.
 * Every rank runs the same sequence, so the collectives inside create and
 * destroy always match even when a check fails. Failures are counted and
 * the process exits non-zero; the counts of both ranks are combined so that
 * mpirun reports the failure whichever rank saw it.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "runtime/comm/context.h"

static int g_failures;
static int g_rank = -1;

#define CHECK_INT(what, got, want)                                             \
  do {                                                                         \
    long got_ = (long)(got), want_ = (long)(want);                             \
    if (got_ != want_) {                                                       \
      fprintf(stderr, "rank %d: %s:%d: %s: got %ld, want %ld\n", g_rank,      \
              __FILE__, __LINE__, what, got_, want_);                          \
      g_failures++;                                                            \
    }                                                                          \
  } while (0)

static int comm_size(MPI_Comm c) {
  int n = -1;
  MPI_Comm_size(c, &n);
  return n;
}

/* The fields that do not depend on the layout. */
static void check_world(const xm_rt_context_t *ctx) {
  CHECK_INT("world", ctx->world, 2);
  CHECK_INT("rank in range", ctx->rank == 0 || ctx->rank == 1, 1);
  CHECK_INT("world_comm size", comm_size(ctx->world_comm), 2);
  int world_rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  CHECK_INT("rank matches MPI_COMM_WORLD", ctx->rank, world_rank);
  /* The context's communicator must be usable: ranks 0 + 1 sum to 1. */
  int sum = -1;
  MPI_Allreduce(&ctx->rank, &sum, 1, MPI_INT, MPI_SUM, ctx->world_comm);
  CHECK_INT("allreduce of ranks", sum, 1);
}

/* The node layout for `rpn` ranks per node out of 2. */
static void check_layout(const xm_rt_context_t *ctx, int rpn) {
  CHECK_INT("ranks_per_node", ctx->ranks_per_node, rpn);
  CHECK_INT("num_nodes", ctx->num_nodes, 2 / rpn);
  CHECK_INT("node", ctx->node, ctx->rank / rpn);
  CHECK_INT("local_rank", ctx->local_rank, ctx->rank % rpn);
  CHECK_INT("node_comm size", comm_size(ctx->node_comm), rpn);
  int node_rank = -1;
  MPI_Comm_rank(ctx->node_comm, &node_rank);
  CHECK_INT("rank in node_comm", node_rank, ctx->local_rank);
  /* A sum over the node only sees that node's ranks. */
  int one = 1, count = -1;
  MPI_Allreduce(&one, &count, 1, MPI_INT, MPI_SUM, ctx->node_comm);
  CHECK_INT("allreduce over node_comm", count, rpn);
}

/* A second context while MPI is up: does not own MPI, layout from `env`. */
static void check_nested(const char *env, int want_rpn) {
  if (env) setenv("XM_RANKS_PER_NODE", env, 1);
  else unsetenv("XM_RANKS_PER_NODE");
  xm_rt_context_t ctx;
  xm_status_t st = xm_rt_context_create(NULL, NULL, &ctx);
  CHECK_INT(env ? env : "(default layout) status", st, XM_OK);
  if (st != XM_OK) return;
  CHECK_INT("nested context owns MPI", ctx.owns_mpi, 0);
  check_world(&ctx);
  check_layout(&ctx, want_rpn);
  xm_rt_context_destroy(&ctx);
  int finalized = 1;
  MPI_Finalized(&finalized);
  CHECK_INT("MPI still up after a non-owning destroy", finalized, 0);
}

/* Malformed values are bad input, reported on every rank, not a hang. */
static void check_rejected(const char *env) {
  setenv("XM_RANKS_PER_NODE", env, 1);
  xm_rt_context_t ctx;
  xm_status_t st = xm_rt_context_create(NULL, NULL, &ctx);
  CHECK_INT("status for a bad XM_RANKS_PER_NODE", st, XM_ERR_INVALID_INPUT);
  if (st == XM_OK) xm_rt_context_destroy(&ctx);
}

int main(int argc, char **argv) {
  setenv("XM_RANKS_PER_NODE", "1", 1);
  xm_rt_context_t outer;
  xm_status_t st = xm_rt_context_create(&argc, &argv, &outer);
  if (st != XM_OK) {
    fprintf(stderr, "xm_rt_context_create failed: %s\n", xm_status_name(st));
    return 1;
  }
  g_rank = outer.rank;
  CHECK_INT("first context owns MPI", outer.owns_mpi, 1);
  check_world(&outer);
  check_layout(&outer, 1); /* one rank per node: two emulated nodes */

  check_nested("2", 2);
  check_nested(NULL, 2); /* both ranks share this machine */
  check_nested("", 2);
  check_rejected("3");
  check_rejected("0");
  check_rejected("-1");
  check_rejected("1x");
  check_rejected("abc");

  int total = 0;
  MPI_Allreduce(&g_failures, &total, 1, MPI_INT, MPI_SUM, outer.world_comm);
  int counted = g_failures;
  xm_rt_context_destroy(&outer);
  int finalized = 0;
  MPI_Finalized(&finalized);
  CHECK_INT("MPI finalised by the owning context", finalized, 1);
  total += g_failures - counted; /* after MPI is gone: this rank's own */
  if (g_rank == 0 || total)
    printf("rank %d: test_mpi_context: %s (%d failed checks)\n", g_rank,
           total ? "FAILED" : "ok", total);
  return total ? 1 : 0;
}
