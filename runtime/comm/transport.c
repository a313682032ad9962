/* runtime/comm/transport.c — the choice of the collectives' transport at start-up,
 * the NCCL communicators, and the transport's buffers (runtime/comm/transport.h).
 *
 * Every decision is agreed on by the world before it is acted on: a
 * library found on some ranks only, or a communicator that fails on one,
 * must not leave some ranks on NCCL and others on MPI (their collectives
 * would never meet). The agreement carries the lowest failing rank's
 * reason, so every rank prints and returns the same message.
 *
 * Communicators: one per group kind, created kind by kind in the order of
 * runtime/abi/groups.def on every rank. Each rank is in exactly one group
 * of each kind, so at each kind every rank takes part in exactly one
 * initialisation, and the groups of a kind are disjoint: the blocking
 * ncclCommInitRank calls of different groups never wait for each other.
 * Member 0 of each group makes the unique id and broadcasts it over the
 * group's MPI communicator with the result of making it, so a failure
 * there skips the group's initialisation on every member alike. (The
 * tests' NCCL double, tests/comm/nccl_shim.c, relies on this order.)
 */
#include "runtime/comm/transport.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Open MPI declares its GPU-awareness queries in <mpi-ext.h>; other MPIs
 * have no such header, and are then taken not to be GPU-aware. */
#if defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif
#endif

static const char *const k_modes[XM_RT_COMM_MODE_COUNT_] = {"auto", "nccl", "mpi", "host"};

const char *xm_rt_comm_mode_name(xm_rt_comm_mode_t mode) {
  return (unsigned)mode < XM_RT_COMM_MODE_COUNT_ ? k_modes[mode] : NULL;
}

const char *xm_rt_nccl_default_library(const char *be_name) {
  if (!be_name) return NULL;
  if (strcmp(be_name, "cuda") == 0) return "libnccl.so.2";
  if (strcmp(be_name, "hip") == 0) return "librccl.so.1";
  return NULL;
}

static int is_emulated(const xm_rt_backend_t *be) { return strcmp(be->name, "emu") == 0; }

/* ---- agreement ---------------------------------------------------------- */

/* Every rank passes ok and, when not ok, why; returns 1 when all are ok,
 * else 0 with the lowest failing rank's reason in why on every rank, with
 * "rank R: " in front unless every rank failed. */
static int agree(const xm_rt_comm_t *c, int ok, char *why, size_t why_len) {
  int failed = !ok, failures = 0;
  MPI_Allreduce(&failed, &failures, 1, MPI_INT, MPI_SUM, c->ctx->world_comm);
  if (failures == 0) return 1;
  char text[1100];
  xm_rt_comm_agree(c->ctx, ok ? XM_OK : XM_ERR_UNSUPPORTED, ok ? NULL : why, text, sizeof text);
  /* xm_rt_comm_agree writes "rank R: <why>". */
  int r = -1, skip = 0;
  if (sscanf(text, "rank %d: %n", &r, &skip) < 1 || skip <= 0) skip = 0;
  const char *src = failures == c->ctx->world ? text + skip : text;
  size_t n = strlen(src);
  if (n >= why_len) n = why_len - 1; /* truncated: the start says enough */
  memcpy(why, src, n);
  why[n] = '\0';
  return 0;
}

/* ---- NCCL ----------------------------------------------------------------- */

static void nccl_teardown(xm_rt_transport_t *t) {
  for (int k = 0; k < XM_RT_GROUP_COUNT; k++) {
    if (t->nccl_comm[k] && t->nccl.comm_destroy) t->nccl.comm_destroy(t->nccl_comm[k]);
    t->nccl_comm[k] = NULL;
  }
  xm_nccl_close(&t->nccl);
}

/* Loads the library and builds every communicator; 1 on every rank, or 0
 * on every rank with the reason in why and nothing left set up. */
static int nccl_setup(xm_rt_comm_t *c, xm_rt_transport_t *t, char *why, size_t why_len) {
  const char *env = getenv("XM_NCCL_LIBRARY");
  const char *name = env && *env ? env : xm_rt_nccl_default_library(t->be->name);
  int ok = 1;
  if (!name) {
    ok = 0;
    snprintf(why, why_len,
             "the %s backend has no NCCL library of its own (XM_NCCL_LIBRARY may name one "
             "that works on its memory)",
             t->be->name);
  } else if (xm_nccl_open(name, &t->nccl, why, why_len) != 0) {
    ok = 0;
  }
  if (!agree(c, ok, why, why_len)) {
    xm_nccl_close(&t->nccl);
    return 0;
  }
  ok = 1;
  for (int k = 0; k < XM_RT_GROUP_COUNT; k++) {
    const xm_rt_comm_group_t *g = xm_rt_comm_group(c, (xm_rt_group_kind_t)k);
    struct {
      int result;
      xm_nccl_unique_id_t id;
    } msg;
    memset(&msg, 0, sizeof msg);
    if (g->index == 0) msg.result = t->nccl.get_unique_id(&msg.id);
    MPI_Bcast(&msg, (int)sizeof msg, MPI_BYTE, 0, g->comm);
    xm_nccl_result_t r = msg.result;
    if (r == XM_NCCL_SUCCESS)
      r = t->nccl.comm_init_rank(&t->nccl_comm[k], g->size, msg.id, g->index);
    if (r != XM_NCCL_SUCCESS) {
      t->nccl_comm[k] = NULL;
      if (ok)
        snprintf(why, why_len, "%s: %s over the %s group: %s", t->nccl.path,
                 msg.result != XM_NCCL_SUCCESS ? "ncclGetUniqueId" : "ncclCommInitRank",
                 xm_rt_group_name((xm_rt_group_kind_t)k), xm_nccl_error(&t->nccl, r));
      ok = 0;
    }
  }
  if (!agree(c, ok, why, why_len)) {
    nccl_teardown(t);
    return 0;
  }
  return 1;
}

/* ---- GPU-aware MPI ------------------------------------------------------------ */

/* Whether MPI takes this backend's device pointers, on this rank; when
 * not, why says so. */
static int mpi_gpu_aware(const xm_rt_backend_t *be, char *why, size_t why_len) {
  if (is_emulated(be)) return 1; /* its device memory is host memory */
  if (strcmp(be->name, "cuda") == 0) {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
    if (MPIX_Query_cuda_support()) return 1;
    snprintf(why, why_len, "MPI not CUDA-aware at run time (MPIX_Query_cuda_support() is 0)");
#elif defined(MPIX_CUDA_AWARE_SUPPORT)
    snprintf(why, why_len, "MPI built without CUDA support (MPIX_CUDA_AWARE_SUPPORT is 0)");
#else
    snprintf(why, why_len, "MPI not known to be CUDA-aware (no MPIX_Query_cuda_support)");
#endif
    return 0;
  }
  if (strcmp(be->name, "hip") == 0) {
#if defined(MPIX_ROCM_AWARE_SUPPORT) && MPIX_ROCM_AWARE_SUPPORT
    if (MPIX_Query_rocm_support()) return 1;
    snprintf(why, why_len, "MPI not ROCm-aware at run time (MPIX_Query_rocm_support() is 0)");
#elif defined(MPIX_ROCM_AWARE_SUPPORT)
    snprintf(why, why_len, "MPI built without ROCm support (MPIX_ROCM_AWARE_SUPPORT is 0)");
#else
    snprintf(why, why_len, "MPI not known to be ROCm-aware (no MPIX_Query_rocm_support)");
#endif
    return 0;
  }
  snprintf(why, why_len, "MPI does not know the %s backend's memory", be->name);
  return 0;
}

/* ---- the choice ------------------------------------------------------------------ */

static xm_status_t refuse(xm_rt_transport_t *t, xm_rt_comm_mode_t mode, const char *why,
                          const char *hint, char *err, size_t err_len) {
  if (err && err_len)
    snprintf(err, err_len, "--comm %s: %s%s", xm_rt_comm_mode_name(mode), why, hint ? hint : "");
  free(t);
  return XM_ERR_INVALID_INPUT;
}

xm_status_t xm_rt_transport_create(xm_rt_comm_t *c, xm_rt_backend_t *be, xm_rt_comm_mode_t mode,
                                   char *err, size_t err_len) {
  if (err && err_len) err[0] = '\0';
  if ((unsigned)mode >= XM_RT_COMM_MODE_COUNT_) {
    if (err && err_len) snprintf(err, err_len, "--comm: mode %d is not a transport", (int)mode);
    return XM_ERR_INVALID_INPUT;
  }
  xm_rt_transport_t *t = calloc(1, sizeof *t);
  if (!t) {
    if (err && err_len) snprintf(err, err_len, "out of memory for the transport");
    return XM_ERR_NO_MEMORY;
  }
  t->be = be;
  const char *mname = xm_rt_comm_mode_name(mode);

  if (be->host_visible) {
    if (mode == XM_RT_COMM_NCCL)
      return refuse(t, mode,
                    "NCCL moves device memory, and the memory of the cpu backend is host memory",
                    "; use --comm auto, host or mpi", err, err_len);
    t->kind = XM_RT_XPORT_HOST;
    snprintf(t->line, sizeof t->line, "comm: MPI on host memory (the %s backend%s%s)", be->name,
             mode == XM_RT_COMM_AUTO ? "" : ", --comm ", mode == XM_RT_COMM_AUTO ? "" : mname);
    c->transport = t;
    return XM_OK;
  }

  char why_nccl[640] = "", why_mpi[256] = "";
  if (mode == XM_RT_COMM_HOST) {
    t->kind = XM_RT_XPORT_STAGED;
    snprintf(t->line, sizeof t->line, "comm: host staging (--comm host)");
  } else if (mode == XM_RT_COMM_AUTO && is_emulated(be)) {
    t->kind = XM_RT_XPORT_STAGED;
    snprintf(
        t->line, sizeof t->line,
        "comm: host staging (auto on the emulated backend; --comm nccl or mpi for the others)");
  } else if (mode != XM_RT_COMM_MPI && nccl_setup(c, t, why_nccl, sizeof why_nccl)) {
    t->kind = XM_RT_XPORT_NCCL;
    snprintf(t->line, sizeof t->line, "comm: %s %d.%d.%d (%s)%s",
             strcmp(be->name, "hip") == 0 ? "rccl" : "nccl", t->nccl.major, t->nccl.minor,
             t->nccl.patch, t->nccl.path, mode == XM_RT_COMM_NCCL ? ", --comm nccl" : "");
  } else if (mode == XM_RT_COMM_NCCL) {
    return refuse(t, mode, why_nccl,
                  is_emulated(be) ? "; use --comm auto, mpi or host"
                                  : "; set XM_NCCL_LIBRARY or use --comm auto",
                  err, err_len);
  } else {
    int aware = mpi_gpu_aware(be, why_mpi, sizeof why_mpi);
    if (agree(c, aware, why_mpi, sizeof why_mpi)) {
      t->kind = XM_RT_XPORT_MPI;
      if (mode == XM_RT_COMM_MPI && is_emulated(be))
        snprintf(t->line, sizeof t->line,
                 "comm: MPI on device memory (--comm mpi; the emulated device's memory is host "
                 "memory)");
      else if (mode == XM_RT_COMM_MPI)
        snprintf(t->line, sizeof t->line, "comm: GPU-aware MPI on device memory (--comm mpi)");
      else
        snprintf(t->line, sizeof t->line, "comm: GPU-aware MPI on device memory (no NCCL: %s)",
                 why_nccl);
    } else if (mode == XM_RT_COMM_MPI) {
      return refuse(t, mode, why_mpi, "; use --comm auto or host", err, err_len);
    } else {
      t->kind = XM_RT_XPORT_STAGED;
      snprintf(t->line, sizeof t->line, "comm: host staging (no NCCL: %s; %s)", why_nccl, why_mpi);
    }
  }
  c->transport = t;
  return XM_OK;
}

void xm_rt_transport_destroy(xm_rt_transport_t *t) {
  if (!t) return;
  nccl_teardown(t);
  if (t->scratch && t->be) t->be->free(t->be, t->scratch);
  xm_rt_stage_free(&t->stage);
  free(t);
}

xm_rt_stage_t *xm_rt_transport_stage(xm_rt_comm_t *c) {
  return c && c->transport ? &c->transport->stage : NULL;
}

void *xm_rt_transport_scratch(xm_rt_transport_t *t, void *stream, size_t bytes) {
  if (t->scratch && t->scratch_cap >= bytes) return t->scratch;
  if (t->scratch) {
    /* Queued work may still read the old one, on this stream or on
     * another (the overlap lanes' streams). */
    (void)stream;
    t->be->sync(t->be, NULL);
    t->be->free(t->be, t->scratch);
  }
  t->scratch = t->be->alloc(t->be, bytes);
  t->scratch_cap = t->scratch ? bytes : 0;
  return t->scratch;
}
