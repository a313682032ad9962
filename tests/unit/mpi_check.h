/* tests/unit/mpi_check.h — the check macros of the MPI tests (plain main()
 * programs: MPI starts once per process, so CMocka is not used).
 *
 * A failed check is counted and printed with its rank; every rank keeps
 * calling the same collectives, so a failure never turns into a hang.
 * start_checks creates the context and insists on the rank layout ctest
 * starts the test with; finish_checks sums the failures over the world
 * and prints the verdict (its result is the exit status to return).
 */
#ifndef XM_TESTS_MPI_CHECK_H
#define XM_TESTS_MPI_CHECK_H

#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>

#include "runtime/comm/context.h"
#include "support/status.h"

static int g_failures;
static int g_rank = -1;

#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "rank %d: %s:%d: check '%s' failed: ", g_rank, __FILE__, __LINE__, #cond);   \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fprintf(stderr, "\n");                                                                       \
      g_failures++;                                                                                \
    }                                                                                              \
  } while (0)

#define CHECK_I64(what, got, want)                                                                 \
  do {                                                                                             \
    long long got_ = (long long)(got), want_ = (long long)(want);                                  \
    CHECK(got_ == want_, "%s: got %lld, want %lld", what, got_, want_);                            \
  } while (0)

/* Creates the context; false (context destroyed, message printed) unless
 * the world has `world` ranks of `per_node` per node (0: any). */
static inline bool start_checks(int *argc, char ***argv, int world, int per_node,
                                xm_rt_context_t *ctx) {
  xm_status_t st = xm_rt_context_create(argc, argv, ctx);
  if (st != XM_OK) {
    fprintf(stderr, "xm_rt_context_create failed: %s\n", xm_status_name(st));
    return false;
  }
  g_rank = ctx->rank;
  if (ctx->world == world && (per_node == 0 || ctx->ranks_per_node == per_node)) return true;
  fprintf(stderr, "rank %d: run with %d ranks, XM_RANKS_PER_NODE=%d (world %d, %d per node)\n",
          ctx->rank, world, per_node, ctx->world, ctx->ranks_per_node);
  xm_rt_context_destroy(ctx);
  return false;
}

static inline int finish_checks(const xm_rt_context_t *ctx, const char *name) {
  int total = 0;
  MPI_Allreduce(&g_failures, &total, 1, MPI_INT, MPI_SUM, ctx->world_comm);
  if (ctx->rank == 0 || g_failures)
    printf("rank %d: %s: %s (%d failed checks, %d here)\n", ctx->rank, name,
           total ? "FAILED" : "ok", total, g_failures);
  return total;
}

#endif /* XM_TESTS_MPI_CHECK_H */
