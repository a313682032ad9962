/* runtime/comm/transport.h — how the collectives of runtime/comm/spmd.c move
 * device memory, chosen once at start-up (out/train --comm, docs/train.md).
 *
 * Four ways, by what the backend's memory is and what the machine has:
 *
 *   host     the backend's memory is host memory (the CPU backend): MPI
 *            works on the buffers themselves; nothing to choose.
 *   staged   device memory is copied to host buffers, MPI runs there, the
 *            results are copied back (runtime/comm/stage.h): always works.
 *   mpi      device pointers go to MPI directly (a GPU-aware MPI, after the
 *            stream is synchronised); the small count arrays of the expert
 *            all-to-all are still staged.
 *   nccl     NCCL (CUDA) or RCCL (HIP), loaded with dlopen
 *            (runtime/comm/nccl.h): one communicator per group, every call
 *            queued on the exec's stream; only the all-to-all's counts come
 *            to the host (they say how many rows go where).
 *
 * --comm auto takes nccl when the backend's memory is not host memory, the
 * library loads on every rank and every communicator initialises; else mpi
 * when MPI says it is GPU-aware for this backend (Open MPI's
 * MPIX_Query_cuda_support / MPIX_Query_rocm_support); else staged. The
 * emulated GPU backend (host memory that says it is not) stays staged under
 * auto, so that the emulated runs keep testing the path that always works;
 * --comm nccl (with XM_NCCL_LIBRARY naming a library that works on host
 * memory, such as the tests' double) and --comm mpi (its memory is MPI's)
 * exercise the other two there. An explicit choice that cannot be honoured
 * is an error (exit code 2) that says why, never a quiet fallback. On the
 * CPU backend auto, host and mpi are all `host` (MPI on host memory is what
 * host means there) and nccl is refused.
 *
 * The traffic counters (docs/traffic.md) are the same whichever way the
 * bytes move: the NCCL path accounts with the communicator's byte models
 * (runtime/comm/comm.h, xm_rt_comm_model_*), the others through the same
 * host code.
 */
#ifndef XM_RUNTIME_COMM_TRANSPORT_H
#define XM_RUNTIME_COMM_TRANSPORT_H

#include <stddef.h>

#include "runtime/abi/backend.h"
#include "runtime/comm/comm.h"
#include "runtime/comm/nccl.h"
#include "runtime/comm/stage.h"
#include "support/status.h"

/* --comm: the order of the names "auto", "nccl", "mpi", "host". */
typedef enum {
  XM_RT_COMM_AUTO = 0,
  XM_RT_COMM_NCCL,
  XM_RT_COMM_MPI,
  XM_RT_COMM_HOST,
  XM_RT_COMM_MODE_COUNT_
} xm_rt_comm_mode_t;

typedef enum {
  XM_RT_XPORT_HOST = 0, /* host memory: no staging */
  XM_RT_XPORT_STAGED,
  XM_RT_XPORT_MPI,
  XM_RT_XPORT_NCCL
} xm_rt_xport_kind_t;

struct xm_rt_transport {
  xm_rt_xport_kind_t kind;
  xm_rt_backend_t *be;                         /* borrowed: the run's backend */
  xm_nccl_lib_t nccl;                          /* kind NCCL: the loaded library */
  xm_nccl_comm_t nccl_comm[XM_RT_GROUP_COUNT]; /* kind NCCL: one per group kind */
  xm_rt_stage_t stage;                         /* host staging buffers, grow-only */
  void *scratch;                               /* device memory (ZeRO-1 padding), grow-only */
  size_t scratch_cap;
  char line[640]; /* "comm: ...": what rank 0 prints at start-up */
};
typedef struct xm_rt_transport xm_rt_transport_t;

/* "auto", "nccl", "mpi", "host"; NULL past the end. */
const char *xm_rt_comm_mode_name(xm_rt_comm_mode_t mode);

/* The library --comm nccl opens for backend `be_name` when XM_NCCL_LIBRARY
 * is not set: "libnccl.so.2" for cuda, "librccl.so.1" for hip, NULL for
 * others (the emulated backend needs XM_NCCL_LIBRARY). */
const char *xm_rt_nccl_default_library(const char *be_name);

/* Chooses and sets up the transport of communicator c for backend be
 * (collective over c->ctx->world_comm: every rank passes the same mode).
 * On success c->transport is set (the communicator owns it; see
 * xm_rt_comm_destroy) and its `line` says what was chosen and why. An
 * explicit mode that cannot be honoured is XM_ERR_INVALID_INPUT on every
 * rank with the reason in err ("--comm nccl: ..."), the same on every rank
 * (the lowest failing rank's); nothing is left set up. */
xm_status_t xm_rt_transport_create(xm_rt_comm_t *c, xm_rt_backend_t *be, xm_rt_comm_mode_t mode,
                                   char *err, size_t err_len);

/* The transport's staging slots, or NULL without one. */
xm_rt_stage_t *xm_rt_transport_stage(xm_rt_comm_t *c);

/* Device memory of at least `bytes` owned by the transport (grow-only;
 * every stream of the device is synchronised before an older, smaller one
 * is freed: the overlapped collectives use it from a second stream);
 * NULL when the backend has none. */
void *xm_rt_transport_scratch(xm_rt_transport_t *t, void *stream, size_t bytes);

#endif /* XM_RUNTIME_COMM_TRANSPORT_H */
