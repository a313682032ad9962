/* tests/comm/test_nccl_loader.c — the NCCL loader (runtime/comm/nccl.h) on its own.
 *
 *   test_nccl_loader shim PATH   the tests' double (tests/comm/nccl_shim.c):
 *                                every entry point resolves, the version is
 *                                the one it reports; a missing file and a
 *                                library without the symbols fail with a
 *                                message that says so; version codes decode
 *                                in both of NCCL's encodings.
 *   test_nccl_loader system      the machine's real library, if it has one
 *                                (XM_NCCL_LIBRARY, else libnccl.so.2 as the
 *                                cuda backend would open it): it loads and
 *                                ncclGetVersion gives a sane 2.x release.
 *                                No collective is run (that needs a GPU).
 *                                Exit code 77 (skipped) with the reason when
 *                                there is no such library.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm/nccl.h"
#include "runtime/comm/transport.h"

static int g_failures;

#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "%s:%d: check '%s' failed: ", __FILE__, __LINE__, #cond);                    \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fprintf(stderr, "\n");                                                                       \
      g_failures++;                                                                                \
    }                                                                                              \
  } while (0)

static void check_decode(void) {
  int M = -1, m = -1, p = -1;
  CHECK(xm_nccl_decode_version(22809, &M, &m, &p) && M == 2 && m == 28 && p == 9,
        "22809 -> %d.%d.%d", M, m, p);
  CHECK(xm_nccl_decode_version(2804, &M, &m, &p) && M == 2 && m == 8 && p == 4,
        "2804 (the encoding before 2.9) -> %d.%d.%d", M, m, p);
  CHECK(xm_nccl_decode_version(20900, &M, &m, &p) && M == 2 && m == 9 && p == 0,
        "20900 -> %d.%d.%d", M, m, p);
  CHECK(!xm_nccl_decode_version(-1, &M, &m, &p), "a negative code is refused");
}

static int check_shim(const char *path) {
  check_decode();
  xm_nccl_lib_t lib;
  char err[512] = "";
  int rc = xm_nccl_open(path, &lib, err, sizeof err);
  CHECK(rc == 0, "%s: %s", path, err);
  if (rc == 0) {
    CHECK(lib.major == 2 && lib.minor == 30 && lib.patch == 1 && lib.version == 23001,
          "shim version %d (%d.%d.%d)", lib.version, lib.major, lib.minor, lib.patch);
    CHECK(strcmp(lib.path, path) == 0, "path %s", lib.path);
    void *const fns[] = {(void *)lib.get_unique_id,
                         (void *)lib.comm_init_rank,
                         (void *)lib.comm_destroy,
                         (void *)lib.all_reduce,
                         (void *)lib.all_gather,
                         (void *)lib.reduce_scatter,
                         (void *)lib.send,
                         (void *)lib.recv,
                         (void *)lib.group_start,
                         (void *)lib.group_end,
                         (void *)lib.get_error_string,
                         (void *)lib.get_version};
    for (size_t i = 0; i < sizeof fns / sizeof *fns; i++)
      CHECK(fns[i] != NULL, "entry point %zu is null", i);
    CHECK(strstr(xm_nccl_error(&lib, 5), "invalid usage") != NULL, "error string: %s",
          xm_nccl_error(&lib, 5));
    xm_nccl_close(&lib);
    CHECK(lib.handle == NULL && lib.get_version == NULL, "close clears the table");
    xm_nccl_close(&lib); /* twice is a no-op */
  }
  CHECK(strcmp(xm_nccl_error(NULL, 3), "NCCL error 3") == 0, "no library: %s",
        xm_nccl_error(NULL, 3));

  rc = xm_nccl_open("/nonexistent/libnccl.so.2", &lib, err, sizeof err);
  CHECK(rc == -1 && strstr(err, "/nonexistent/libnccl.so.2 not found (dlopen: ") == err,
        "missing file: rc %d, %s", rc, err);
  CHECK(lib.handle == NULL, "nothing is left open after a failure");
  /* A library that is not NCCL at all: libc has none of the symbols. */
  rc = xm_nccl_open("libc.so.6", &lib, err, sizeof err);
  CHECK(rc == -1 && strstr(err, "has no ncclGetVersion") != NULL, "libc: rc %d, %s", rc, err);
  rc = xm_nccl_open("", &lib, err, sizeof err);
  CHECK(rc == -1, "an empty name is refused");

  CHECK(strcmp(xm_rt_nccl_default_library("cuda"), "libnccl.so.2") == 0, "cuda library");
  CHECK(strcmp(xm_rt_nccl_default_library("hip"), "librccl.so.1") == 0, "hip library");
  CHECK(xm_rt_nccl_default_library("emu") == NULL, "the emulated backend has none");
  printf("test_nccl_loader shim: %d failed checks\n", g_failures);
  return g_failures ? 1 : 0;
}

static int check_system(void) {
  const char *env = getenv("XM_NCCL_LIBRARY");
  const char *name = env && *env ? env : xm_rt_nccl_default_library("cuda");
  xm_nccl_lib_t lib;
  char err[512] = "";
  if (xm_nccl_open(name, &lib, err, sizeof err) != 0) {
    if (strstr(err, "not found (dlopen")) {
      printf("test_nccl_loader system: SKIPPED: no NCCL library here (%s)\n", err);
      return 77;
    }
    CHECK(0, "%s is there but does not load as NCCL: %s", name, err);
    return 1;
  }
  printf("test_nccl_loader system: %s is NCCL %d.%d.%d (ncclGetVersion %d)\n", lib.path, lib.major,
         lib.minor, lib.patch, lib.version);
  CHECK(lib.major == 2 && lib.minor >= XM_NCCL_MIN_MINOR && lib.minor < 100 && lib.patch < 100,
        "version %d.%d.%d", lib.major, lib.minor, lib.patch);
  /* Its own error strings, without a device. */
  const char *s = xm_nccl_error(&lib, 0);
  CHECK(s && *s && strncmp(s, "NCCL error", 10) != 0, "ncclGetErrorString(ncclSuccess): %s", s);
  xm_nccl_close(&lib);
  printf("test_nccl_loader system: %d failed checks\n", g_failures);
  return g_failures ? 1 : 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "shim") == 0) return check_shim(argv[2]);
  if (argc == 2 && strcmp(argv[1], "system") == 0) return check_system();
  fprintf(stderr, "usage: %s shim PATH | system\n", argv[0]);
  return 2;
}
