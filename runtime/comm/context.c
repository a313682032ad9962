/* runtime/comm/context.c — MPI start-up, node layout and collective abort. */
#include "runtime/comm/context.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static xm_status_t ranks_per_node_from_env(int world, int shared_size, int *out) {
  const char *env = getenv("XM_RANKS_PER_NODE");
  if (!env || !*env) {
    *out = shared_size;
    return XM_OK;
  }
  char *end = NULL;
  long v = env[0] >= '1' && env[0] <= '9' ? strtol(env, &end, 10) : 0; /* decimal, nothing else */
  if (v <= 0 || *end != '\0' || v > world || world % v != 0) {
    fprintf(stderr,
            "xmoec: XM_RANKS_PER_NODE=%s: must be a positive divisor of the "
            "world size %d\n", env, world);
    return XM_ERR_INVALID_INPUT;
  }
  *out = (int)v;
  return XM_OK;
}

xm_status_t xm_rt_context_set_ranks_per_node(xm_rt_context_t *ctx, int n) {
  if (n <= 0 || ctx->world % n != 0) return XM_ERR_INVALID_INPUT;
  if (n == ctx->ranks_per_node) return XM_OK;
  if (ctx->node_comm != MPI_COMM_NULL && ctx->node_comm) MPI_Comm_free(&ctx->node_comm);
  ctx->ranks_per_node = n;
  ctx->node = ctx->rank / n;
  ctx->local_rank = ctx->rank % n;
  ctx->num_nodes = ctx->world / n;
  MPI_Comm_split(ctx->world_comm, ctx->node, ctx->local_rank, &ctx->node_comm);
  return XM_OK;
}

xm_status_t xm_rt_context_create(int *argc, char ***argv, xm_rt_context_t *ctx) {
  memset(ctx, 0, sizeof *ctx);
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    if (MPI_Init(argc, argv) != MPI_SUCCESS) return XM_ERR_INTERNAL;
    ctx->owns_mpi = 1;
  }
  MPI_Comm_dup(MPI_COMM_WORLD, &ctx->world_comm);
  MPI_Comm_rank(ctx->world_comm, &ctx->rank);
  MPI_Comm_size(ctx->world_comm, &ctx->world);
  MPI_Comm shared;
  MPI_Comm_split_type(ctx->world_comm, MPI_COMM_TYPE_SHARED, ctx->rank, MPI_INFO_NULL,
                      &shared);
  int shared_size = 1;
  MPI_Comm_size(shared, &shared_size);
  MPI_Comm_free(&shared);
  const char *env = getenv("XM_RANKS_PER_NODE");
  ctx->rpn_from_env = env && *env;
  xm_status_t st = ranks_per_node_from_env(ctx->world, shared_size, &ctx->ranks_per_node);
  if (st != XM_OK) {
    MPI_Comm_free(&ctx->world_comm);
    if (ctx->owns_mpi) MPI_Finalize();
    return st;
  }
  /* With the MPI-detected layout, ranks of one machine need not be
   * consecutive; node ids follow rank / ranks_per_node either way because
   * the launchers used here place ranks by slot (consecutive). */
  ctx->node = ctx->rank / ctx->ranks_per_node;
  ctx->local_rank = ctx->rank % ctx->ranks_per_node;
  ctx->num_nodes = ctx->world / ctx->ranks_per_node;
  MPI_Comm_split(ctx->world_comm, ctx->node, ctx->local_rank, &ctx->node_comm);
  return XM_OK;
}

void xm_rt_context_destroy(xm_rt_context_t *ctx) {
  if (ctx->node_comm != MPI_COMM_NULL && ctx->node_comm) MPI_Comm_free(&ctx->node_comm);
  if (ctx->world_comm != MPI_COMM_NULL && ctx->world_comm) MPI_Comm_free(&ctx->world_comm);
  if (ctx->owns_mpi) MPI_Finalize();
  memset(ctx, 0, sizeof *ctx);
}

/* The message goes out as one line in one write: mpirun forwards each
 * rank's stderr as it comes, and a line written in pieces could be split by
 * the abort banner it prints when MPI_Abort is called. */
void xm_rt_abort(const xm_rt_context_t *ctx, int exit_code, const char *fmt, ...) {
  char line[2048];
  int n = snprintf(line, sizeof line - 1, "xmoec: rank %d: ", ctx ? ctx->rank : -1);
  if (n < 0) n = 0;
  if ((size_t)n < sizeof line - 1) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - 1 - (size_t)n, fmt, ap);
    va_end(ap);
  }
  size_t len = strlen(line);
  line[len++] = '\n';
  fwrite(line, 1, len, stderr);
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  exit(exit_code); /* MPI_Abort does not return; keep the compiler sure. */
}
