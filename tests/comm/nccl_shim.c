/* tests/comm/nccl_shim.c — a test double of the NCCL library: the API subset the
 * device transport uses (runtime/comm/nccl.h), implemented over MPI on host
 * memory, built as a shared library that out/train loads through
 * XM_NCCL_LIBRARY. It lets a machine without a GPU run the NCCL path of
 * runtime/comm/spmd.c with the emulated GPU backend, whose device memory is
 * host memory.
 *
 * Every call runs synchronously when it is made (a group's point-to-point
 * calls at ncclGroupEnd) and ignores the stream: the emulated backend's
 * streams have finished their work when a call returns, so nothing is
 * reordered. Only ncclFloat32 / ncclInt32 and ncclSum exist here.
 *
 * Communicators. A unique id carries the world rank of the member that
 * made it; ncclCommInitRank splits MPI_COMM_WORLD with that rank as the
 * colour and the NCCL rank as the key. MPI_Comm_split is collective over
 * the whole world, so this works only because the runtime creates its
 * communicators group kind by group kind in the same order on every rank,
 * and every rank is in exactly one group of each kind
 * (runtime/comm/transport.c): at each kind every world rank makes exactly
 * one ncclCommInitRank call, the groups of that kind have distinct member
 * 0s, and so distinct colours. The id also carries a sequence number of
 * the maker's ids; the new communicator checks that its size is the
 * nranks asked for and that all members hold the same id, so a rank out of
 * step fails with ncclInvalidUsage instead of joining the wrong group.
 */
#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm/nccl.h"

/* The entry points are defined with the very types runtime/comm/nccl.h
 * calls them through (a call through a function pointer of another type is
 * undefined behaviour, and UBSan's function check reports it). */
typedef xm_nccl_result_t shim_result_t;
enum {
  SHIM_SUCCESS = 0,
  SHIM_SYSTEM_ERROR = 2,
  SHIM_INTERNAL_ERROR = 3,
  SHIM_INVALID_ARGUMENT = 4,
  SHIM_INVALID_USAGE = 5
};
enum { SHIM_INT32 = 2, SHIM_FLOAT32 = 7, SHIM_SUM = 0 };
enum { SHIM_ID_BYTES = 128 };

typedef xm_nccl_unique_id_t shim_id_t;
_Static_assert(sizeof(shim_id_t) == SHIM_ID_BYTES, "an NCCL unique id is 128 bytes");

/* What the id holds (the rest is zero). */
typedef struct {
  char magic[8];
  int32_t maker; /* world rank of the member that made it */
  int32_t seq;   /* ids the maker made before it */
} shim_id_body_t;

struct xm_nccl_comm {
  MPI_Comm comm;
  int rank, size;
};
typedef struct xm_nccl_comm shim_comm_t;

/* Point-to-point calls between ncclGroupStart and ncclGroupEnd. */
typedef struct {
  int is_send;
  void *buf;
  size_t count;
  MPI_Datatype type;
  int peer;
  MPI_Comm comm;
} shim_p2p_t;

static int g_depth;
static shim_p2p_t *g_ops;
static int g_nops, g_cap;
static int32_t g_seq;

static const char k_magic[8] = "xmshim1";

/* The version a real NCCL 2.30.1 would report (major*10000 + minor*100 +
 * patch): recent enough for the loader, and recognisable in the start-up
 * line. */
shim_result_t ncclGetVersion(int *version) {
  if (!version) return SHIM_INVALID_ARGUMENT;
  *version = 2 * 10000 + 30 * 100 + 1;
  return SHIM_SUCCESS;
}

const char *ncclGetErrorString(shim_result_t r) {
  switch (r) {
  case SHIM_SUCCESS: return "no error (shim)";
  case SHIM_SYSTEM_ERROR: return "system error (shim: out of memory)";
  case SHIM_INTERNAL_ERROR: return "internal error (shim: an MPI call failed)";
  case SHIM_INVALID_ARGUMENT: return "invalid argument (shim)";
  case SHIM_INVALID_USAGE: return "invalid usage (shim)";
  default: return "unknown result (shim)";
  }
}

static int mpi_ok(int rc) { return rc == MPI_SUCCESS; }

shim_result_t ncclGetUniqueId(shim_id_t *id) {
  if (!id) return SHIM_INVALID_ARGUMENT;
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) return SHIM_INVALID_USAGE;
  shim_id_body_t body;
  memset(&body, 0, sizeof body);
  memcpy(body.magic, k_magic, sizeof body.magic);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  body.maker = rank;
  body.seq = g_seq++;
  memset(id, 0, sizeof *id);
  memcpy(id->internal, &body, sizeof body);
  return SHIM_SUCCESS;
}

shim_result_t ncclCommInitRank(shim_comm_t **out, int nranks, shim_id_t id, int rank) {
  if (!out || nranks < 1 || rank < 0 || rank >= nranks) return SHIM_INVALID_ARGUMENT;
  *out = NULL;
  shim_id_body_t body;
  memcpy(&body, id.internal, sizeof body);
  if (memcmp(body.magic, k_magic, sizeof k_magic) != 0 || body.maker < 0)
    return SHIM_INVALID_ARGUMENT;
  shim_comm_t *c = calloc(1, sizeof *c);
  if (!c) return SHIM_SYSTEM_ERROR;
  if (!mpi_ok(MPI_Comm_split(MPI_COMM_WORLD, body.maker, rank, &c->comm))) {
    free(c);
    return SHIM_INTERNAL_ERROR;
  }
  MPI_Comm_rank(c->comm, &c->rank);
  MPI_Comm_size(c->comm, &c->size);
  /* Every member must hold the same id: compare (maker, seq) by min/max. */
  int mine[4] = {body.maker, body.seq, -body.maker, -body.seq}, ext[4];
  MPI_Allreduce(mine, ext, 4, MPI_INT, MPI_MAX, c->comm);
  int same = ext[0] == -ext[2] && ext[1] == -ext[3];
  if (c->size != nranks || c->rank != rank || !same) {
    MPI_Comm_free(&c->comm);
    free(c);
    return SHIM_INVALID_USAGE;
  }
  *out = c;
  return SHIM_SUCCESS;
}

shim_result_t ncclCommDestroy(shim_comm_t *c) {
  if (!c) return SHIM_SUCCESS;
  MPI_Comm_free(&c->comm);
  free(c);
  return SHIM_SUCCESS;
}

static int mpi_type(int dtype, MPI_Datatype *t, size_t *size) {
  if (dtype == SHIM_FLOAT32) {
    *t = MPI_FLOAT;
    *size = 4;
    return 1;
  }
  if (dtype == SHIM_INT32) {
    *t = MPI_INT32_T;
    *size = 4;
    return 1;
  }
  return 0;
}

shim_result_t ncclAllReduce(const void *send, void *recv, size_t count, int dtype, int op,
                            shim_comm_t *c, void *stream) {
  (void)stream;
  MPI_Datatype t;
  size_t es;
  if (!c || op != SHIM_SUM || !mpi_type(dtype, &t, &es)) return SHIM_INVALID_ARGUMENT;
  for (size_t off = 0; off < count; off += INT_MAX) {
    int n = (int)(count - off < INT_MAX ? count - off : INT_MAX);
    char *r = (char *)recv + off * es;
    const char *s = (const char *)send + off * es;
    if (!mpi_ok(MPI_Allreduce(s == r ? MPI_IN_PLACE : s, r, n, t, MPI_SUM, c->comm)))
      return SHIM_INTERNAL_ERROR;
  }
  return SHIM_SUCCESS;
}

/* In place when send is this rank's block of recv, as NCCL defines it. */
shim_result_t ncclAllGather(const void *send, void *recv, size_t count, int dtype, shim_comm_t *c,
                            void *stream) {
  (void)stream;
  MPI_Datatype t;
  size_t es;
  if (!c || !mpi_type(dtype, &t, &es) || count > INT_MAX) return SHIM_INVALID_ARGUMENT;
  if (count == 0) return SHIM_SUCCESS;
  const char *own = (const char *)recv + (size_t)c->rank * count * es;
  const void *src = (const char *)send == own ? MPI_IN_PLACE : send;
  return mpi_ok(MPI_Allgather(src, (int)count, t, recv, (int)count, t, c->comm))
             ? SHIM_SUCCESS
             : SHIM_INTERNAL_ERROR;
}

/* In place (recv is this rank's block of send) through a copy of the
 * input: MPI's in-place form puts the result elsewhere. */
shim_result_t ncclReduceScatter(const void *send, void *recv, size_t count, int dtype, int op,
                                shim_comm_t *c, void *stream) {
  (void)stream;
  MPI_Datatype t;
  size_t es;
  if (!c || op != SHIM_SUM || !mpi_type(dtype, &t, &es) || count > INT_MAX)
    return SHIM_INVALID_ARGUMENT;
  if (count == 0) return SHIM_SUCCESS;
  size_t total = (size_t)c->size * count * es;
  const char *s = send, *r = recv;
  void *copy = NULL;
  if (r < s + total && s < r + count * es) {
    copy = malloc(total);
    if (!copy) return SHIM_SYSTEM_ERROR;
    memcpy(copy, send, total);
    send = copy;
  }
  int rc = MPI_Reduce_scatter_block(send, recv, (int)count, t, MPI_SUM, c->comm);
  free(copy);
  return mpi_ok(rc) ? SHIM_SUCCESS : SHIM_INTERNAL_ERROR;
}

static shim_result_t run_ops(void) {
  MPI_Request *req = g_nops ? malloc((size_t)g_nops * sizeof *req) : NULL;
  if (g_nops && !req) return SHIM_SYSTEM_ERROR;
  int rc = MPI_SUCCESS;
  /* Receives first, so no send waits on a receive not yet posted. */
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < g_nops; i++) {
      shim_p2p_t *o = &g_ops[i];
      if (o->is_send != pass) continue;
      int r = o->is_send ? MPI_Isend(o->buf, (int)o->count, o->type, o->peer, 0, o->comm, &req[i])
                         : MPI_Irecv(o->buf, (int)o->count, o->type, o->peer, 0, o->comm, &req[i]);
      if (r != MPI_SUCCESS) rc = r;
    }
  if (rc == MPI_SUCCESS && g_nops) rc = MPI_Waitall(g_nops, req, MPI_STATUSES_IGNORE);
  free(req);
  g_nops = 0;
  return mpi_ok(rc) ? SHIM_SUCCESS : SHIM_INTERNAL_ERROR;
}

static shim_result_t p2p(int is_send, const void *buf, size_t count, int dtype, int peer,
                         shim_comm_t *c) {
  MPI_Datatype t;
  size_t es;
  if (!c || !mpi_type(dtype, &t, &es) || count > INT_MAX || peer < 0 || peer >= c->size)
    return SHIM_INVALID_ARGUMENT;
  if (g_nops == g_cap) {
    int cap = g_cap ? 2 * g_cap : 16;
    shim_p2p_t *ops = realloc(g_ops, (size_t)cap * sizeof *ops);
    if (!ops) return SHIM_SYSTEM_ERROR;
    g_ops = ops;
    g_cap = cap;
  }
  g_ops[g_nops++] = (shim_p2p_t){is_send, (void *)buf, count, t, peer, c->comm};
  /* Outside a group a call is a group of one. */
  return g_depth ? SHIM_SUCCESS : run_ops();
}

shim_result_t ncclSend(const void *buf, size_t count, int dtype, int peer, shim_comm_t *c,
                       void *stream) {
  (void)stream;
  return p2p(1, buf, count, dtype, peer, c);
}

shim_result_t ncclRecv(void *buf, size_t count, int dtype, int peer, shim_comm_t *c, void *stream) {
  (void)stream;
  return p2p(0, buf, count, dtype, peer, c);
}

shim_result_t ncclGroupStart(void) {
  g_depth++;
  return SHIM_SUCCESS;
}

shim_result_t ncclGroupEnd(void) {
  if (g_depth == 0) return SHIM_INVALID_USAGE;
  if (--g_depth > 0) return SHIM_SUCCESS;
  shim_result_t r = run_ops();
  if (g_cap > 64) { /* do not keep a large queue for the whole run */
    free(g_ops);
    g_ops = NULL;
    g_cap = 0;
  }
  return r;
}
