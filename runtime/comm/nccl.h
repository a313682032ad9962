/* runtime/comm/nccl.h — the part of the NCCL API (RCCL has the same one) that the
 * device transport of the collectives uses (runtime/comm/transport.h), loaded
 * at run time with dlopen.
 *
 * Nothing links against NCCL: a program built here runs where the library
 * is absent, and picks it up where it is (libnccl.so.2 next to CUDA,
 * librccl.so.1 next to ROCm, or the path in XM_NCCL_LIBRARY). The types
 * are ours, declared from NVIDIA's public API documentation so that no
 * vendor header is needed to build: a communicator is an opaque pointer,
 * the unique id 128 bytes passed by value, results and the data type and
 * reduction enums are C ints (the library's enums are int-sized), a stream
 * is the native stream handle (cudaStream_t / hipStream_t: a pointer).
 * NCCL 2.7 is the oldest release with everything used here (grouped
 * point-to-point calls); older ones are refused when the library loads.
 */
#ifndef XM_RUNTIME_COMM_NCCL_H
#define XM_RUNTIME_COMM_NCCL_H

#include <stddef.h>

typedef int xm_nccl_result_t;                /* ncclResult_t */
typedef struct xm_nccl_comm *xm_nccl_comm_t; /* ncclComm_t */

enum { XM_NCCL_UNIQUE_ID_BYTES = 128 };
typedef struct {
  char internal[XM_NCCL_UNIQUE_ID_BYTES];
} xm_nccl_unique_id_t; /* ncclUniqueId */

/* The values of ncclSuccess, ncclInt32, ncclFloat32 and ncclSum. */
enum { XM_NCCL_SUCCESS = 0 };
enum { XM_NCCL_INT32 = 2, XM_NCCL_FLOAT32 = 7 };
enum { XM_NCCL_SUM = 0 };

/* The oldest release accepted (grouped ncclSend/ncclRecv arrived in 2.7). */
enum { XM_NCCL_MIN_MAJOR = 2, XM_NCCL_MIN_MINOR = 7 };

/* A loaded library: its entry points, what was opened and its version. */
typedef struct {
  void *handle;
  char path[512]; /* the name given to dlopen (XM_NCCL_LIBRARY or the default) */
  int version;    /* ncclGetVersion's code */
  int major, minor, patch;
  xm_nccl_result_t (*get_unique_id)(xm_nccl_unique_id_t *id);
  xm_nccl_result_t (*comm_init_rank)(xm_nccl_comm_t *comm, int nranks, xm_nccl_unique_id_t id,
                                     int rank);
  xm_nccl_result_t (*comm_destroy)(xm_nccl_comm_t comm);
  xm_nccl_result_t (*all_reduce)(const void *send, void *recv, size_t count, int dtype, int op,
                                 xm_nccl_comm_t comm, void *stream);
  xm_nccl_result_t (*all_gather)(const void *send, void *recv, size_t send_count, int dtype,
                                 xm_nccl_comm_t comm, void *stream);
  xm_nccl_result_t (*reduce_scatter)(const void *send, void *recv, size_t recv_count, int dtype,
                                     int op, xm_nccl_comm_t comm, void *stream);
  xm_nccl_result_t (*send)(const void *buf, size_t count, int dtype, int peer, xm_nccl_comm_t comm,
                           void *stream);
  xm_nccl_result_t (*recv)(void *buf, size_t count, int dtype, int peer, xm_nccl_comm_t comm,
                           void *stream);
  xm_nccl_result_t (*group_start)(void);
  xm_nccl_result_t (*group_end)(void);
  const char *(*get_error_string)(xm_nccl_result_t result);
  xm_nccl_result_t (*get_version)(int *version);
} xm_nccl_lib_t;

/* Splits ncclGetVersion's code: major * 10000 + minor * 100 + patch since
 * 2.9, major * 1000 + minor * 100 + patch before. 0 for a code that is
 * neither (negative), else 1. */
int xm_nccl_decode_version(int code, int *major, int *minor, int *patch);

/* Opens `name` (a file name dlopen searches for, or a path) and resolves
 * every entry point, then checks the version. Returns 0, or -1 with the
 * reason in err (the file is not there, a symbol is missing, the release
 * is older than 2.7, ncclGetVersion failed); *out is then cleared. */
int xm_nccl_open(const char *name, xm_nccl_lib_t *out, char *err, size_t err_len);

/* Releases the handle (the library stays mapped until exit: it is opened
 * RTLD_NODELETE, as unloading a library that started device threads can
 * crash at exit). A closed or cleared *lib is a no-op. */
void xm_nccl_close(xm_nccl_lib_t *lib);

/* The library's message for a result, or "NCCL error <n>". */
const char *xm_nccl_error(const xm_nccl_lib_t *lib, xm_nccl_result_t result);

#endif /* XM_RUNTIME_COMM_NCCL_H */
