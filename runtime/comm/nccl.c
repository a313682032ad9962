/* runtime/comm/nccl.c — the NCCL / RCCL loader (runtime/comm/nccl.h): dlopen, one
 * dlsym per entry point, and the version check.
 *
 * Every symbol is required: a library that lacks one is not the library
 * the transport was written for, and saying so when it loads is better
 * than a null call in the middle of a step. The version is read first
 * among the checks because it explains a missing symbol best (an old
 * release has no ncclSend).
 */
#include "runtime/comm/nccl.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int xm_nccl_decode_version(int code, int *major, int *minor, int *patch) {
  if (code < 0) return 0;
  int base = code >= 10000 ? 10000 : 1000;
  *major = code / base;
  *minor = (code % base) / 100;
  *patch = code % 100;
  return 1;
}

/* Where each entry point goes: the field of xm_nccl_lib_t, by offset. */
static const struct {
  const char *name;
  size_t offset;
} k_symbols[] = {
    {"ncclGetVersion", offsetof(xm_nccl_lib_t, get_version)},
    {"ncclGetErrorString", offsetof(xm_nccl_lib_t, get_error_string)},
    {"ncclGetUniqueId", offsetof(xm_nccl_lib_t, get_unique_id)},
    {"ncclCommInitRank", offsetof(xm_nccl_lib_t, comm_init_rank)},
    {"ncclCommDestroy", offsetof(xm_nccl_lib_t, comm_destroy)},
    {"ncclAllReduce", offsetof(xm_nccl_lib_t, all_reduce)},
    {"ncclAllGather", offsetof(xm_nccl_lib_t, all_gather)},
    {"ncclReduceScatter", offsetof(xm_nccl_lib_t, reduce_scatter)},
    {"ncclSend", offsetof(xm_nccl_lib_t, send)},
    {"ncclRecv", offsetof(xm_nccl_lib_t, recv)},
    {"ncclGroupStart", offsetof(xm_nccl_lib_t, group_start)},
    {"ncclGroupEnd", offsetof(xm_nccl_lib_t, group_end)},
};

static int fail(xm_nccl_lib_t *lib, char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(xm_nccl_lib_t *lib, char *err, size_t err_len, const char *fmt, ...) {
  if (err && err_len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
  }
  if (lib->handle) dlclose(lib->handle);
  memset(lib, 0, sizeof *lib);
  return -1;
}

int xm_nccl_open(const char *name, xm_nccl_lib_t *out, char *err, size_t err_len) {
  memset(out, 0, sizeof *out);
  if (!name || !*name) return fail(out, err, err_len, "no library name");
  snprintf(out->path, sizeof out->path, "%s", name);
  /* RTLD_LOCAL: its symbols must not satisfy anyone else's (a test double
   * and the real library never meet). */
  out->handle = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!out->handle) {
    const char *why = dlerror();
    return fail(out, err, err_len, "%s not found (dlopen: %s)", name, why ? why : "no reason");
  }
  for (size_t i = 0; i < sizeof k_symbols / sizeof *k_symbols; i++) {
    dlerror();
    void *sym = dlsym(out->handle, k_symbols[i].name);
    if (!sym)
      return fail(out, err, err_len, "%s has no %s: not an NCCL 2.7+ or RCCL library", name,
                  k_symbols[i].name);
    /* POSIX guarantees a data pointer can hold a function's address. */
    memcpy((char *)out + k_symbols[i].offset, &sym, sizeof sym);
    if (i == 0) {
      /* The version first: it explains any symbol missing after it. */
      int code = -1;
      if (out->get_version(&code) != XM_NCCL_SUCCESS ||
          !xm_nccl_decode_version(code, &out->major, &out->minor, &out->patch))
        return fail(out, err, err_len, "%s: ncclGetVersion failed", name);
      out->version = code;
      if (out->major < XM_NCCL_MIN_MAJOR ||
          (out->major == XM_NCCL_MIN_MAJOR && out->minor < XM_NCCL_MIN_MINOR)) {
        return fail(out, err, err_len, "%s is NCCL %d.%d.%d; 2.7 or newer is needed", name,
                    out->major, out->minor, out->patch);
      }
    }
  }
  return 0;
}

void xm_nccl_close(xm_nccl_lib_t *lib) {
  if (!lib || !lib->handle) return;
  dlclose(lib->handle);
  memset(lib, 0, sizeof *lib);
}

const char *xm_nccl_error(const xm_nccl_lib_t *lib, xm_nccl_result_t result) {
  const char *s = lib && lib->get_error_string ? lib->get_error_string(result) : NULL;
  if (s && *s) return s;
  static _Thread_local char buf[32];
  snprintf(buf, sizeof buf, "NCCL error %d", result);
  return buf;
}
