/* runtime/driver/blas_core.c — see blas_core.h. */
#define _GNU_SOURCE
#include "runtime/driver/blas_core.h"

#include <dlfcn.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* OpenBLAS 0.3.21's x86-64 core names (driver/others/dynamic.c's table)
 * by the widest vector ISA of their kernels. */
static const struct {
  const char *name;
  int level;
} cores[] = {
    {"unknown", XM_BLAS_LEVEL_BASE},      {"prescott", XM_BLAS_LEVEL_BASE},
    {"atom", XM_BLAS_LEVEL_BASE},         {"core2", XM_BLAS_LEVEL_BASE},
    {"penryn", XM_BLAS_LEVEL_BASE},       {"dunnington", XM_BLAS_LEVEL_BASE},
    {"nehalem", XM_BLAS_LEVEL_BASE},      {"athlon", XM_BLAS_LEVEL_BASE},
    {"opteron", XM_BLAS_LEVEL_BASE},      {"opteron_sse3", XM_BLAS_LEVEL_BASE},
    {"barcelona", XM_BLAS_LEVEL_BASE},    {"nano", XM_BLAS_LEVEL_BASE},
    {"sandybridge", XM_BLAS_LEVEL_AVX},   {"bulldozer", XM_BLAS_LEVEL_AVX},
    {"piledriver", XM_BLAS_LEVEL_AVX},    {"steamroller", XM_BLAS_LEVEL_AVX},
    {"haswell", XM_BLAS_LEVEL_AVX2},      {"excavator", XM_BLAS_LEVEL_AVX2},
    {"zen", XM_BLAS_LEVEL_AVX2},          {"skylakex", XM_BLAS_LEVEL_AVX512},
    {"cooperlake", XM_BLAS_LEVEL_AVX512}, {"sapphirerapids", XM_BLAS_LEVEL_AVX512},
};

int xm_blas_core_level(const char *corename) {
  if (!corename) return XM_BLAS_LEVEL_AVX512;
  for (size_t i = 0; i < sizeof cores / sizeof cores[0]; i++)
    if (strcasecmp(corename, cores[i].name) == 0) return cores[i].level;
  return XM_BLAS_LEVEL_AVX512;
}

int xm_blas_cpu_level(void) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return XM_BLAS_LEVEL_AVX512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return XM_BLAS_LEVEL_AVX2;
  if (__builtin_cpu_supports("avx")) return XM_BLAS_LEVEL_AVX;
#endif
  return XM_BLAS_LEVEL_BASE;
}

const char *xm_blas_core_pick(const char *detected, int cpu_level) {
  if (!detected || xm_blas_core_level(detected) >= cpu_level) return NULL;
  /* The oldest core of each family: its kernels need nothing beyond the
   * level (SkylakeX: F, BW, DQ, VL; Haswell: AVX2, FMA), so a CPU of that
   * level can always run them. */
  switch (cpu_level) {
  case XM_BLAS_LEVEL_AVX512: return "SkylakeX";
  case XM_BLAS_LEVEL_AVX2: return "Haswell";
  case XM_BLAS_LEVEL_AVX: return "Sandybridge";
  default: return NULL;
  }
}

typedef char *(*corename_fn)(void);

const char *xm_blas_core_running(void) {
  corename_fn f = (corename_fn)dlsym(RTLD_DEFAULT, "openblas_get_corename");
  return f ? f() : NULL;
}

static const char *level_name(int level) {
  switch (level) {
  case XM_BLAS_LEVEL_AVX512: return "AVX-512";
  case XM_BLAS_LEVEL_AVX2: return "AVX2";
  case XM_BLAS_LEVEL_AVX: return "AVX";
  default: return "SSE";
  }
}

void xm_blas_core_describe(char *buf, size_t cap) {
  if (!buf || cap == 0) return;
  buf[0] = '\0';
  const char *core = xm_blas_core_running();
  if (!core) return;
  /* "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Cooperlake MAX_THREADS=64":
   * the first two words name the library. */
  char lib[48] = "OpenBLAS";
  corename_fn cfg = (corename_fn)dlsym(RTLD_DEFAULT, "openblas_get_config");
  const char *c = cfg ? cfg() : NULL;
  if (c) {
    const char *sp = strchr(c, ' ');
    sp = sp ? strchr(sp + 1, ' ') : NULL;
    size_t n = sp ? (size_t)(sp - c) : strlen(c);
    if (n >= sizeof lib) n = sizeof lib - 1;
    memcpy(lib, c, n);
    lib[n] = '\0';
  }
  const char *detected = getenv(XM_BLAS_DETECTED_ENV);
  const char *user = getenv("OPENBLAS_CORETYPE");
  const char *pick =
      detected && *detected ? xm_blas_core_pick(detected, xm_blas_cpu_level()) : NULL;
  if (pick && user && strcasecmp(user, pick) == 0)
    snprintf(buf, cap,
             "%s kernels %s (chosen by the program: OpenBLAS detected %s on a CPU with %s; "
             "set OPENBLAS_CORETYPE to choose)",
             lib, core, detected, level_name(xm_blas_cpu_level()));
  else if (user && *user)
    snprintf(buf, cap, "%s kernels %s (OPENBLAS_CORETYPE=%s)", lib, core, user);
  else
    snprintf(buf, cap, "%s kernels %s (detected by OpenBLAS; the CPU has %s)", lib, core,
             level_name(xm_blas_cpu_level()));
}

/* What the tests' XM_BLAS_TEST_DETECTED or the library says it chose,
 * against the CPU: the core to force, with XM_BLAS_DETECTED set to what it
 * replaces, or NULL. */
static const char *want_blas_core(void) {
  if (getenv("OPENBLAS_CORETYPE")) return NULL;
  const char *detected = getenv("XM_BLAS_TEST_DETECTED");
  if (!detected || !*detected) detected = xm_blas_core_running();
  const char *pick = xm_blas_core_pick(detected, xm_blas_cpu_level());
  if (pick && setenv(XM_BLAS_DETECTED_ENV, detected, 1) != 0) return NULL;
  return pick;
}

void xm_rt_reexec_once(char **argv) {
  if (!argv || !argv[0] || getenv("XM_NO_REEXEC")) return;
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited) return;
  int omp = !getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT");
  const char *blas = want_blas_core();
  if (!omp && !blas) return;
  if (omp && setenv("GOMP_SPINCOUNT", "1000", 1) != 0) return;
  if (omp && !getenv("KMP_BLOCKTIME") && setenv("KMP_BLOCKTIME", "0", 1) != 0) return;
  if (blas && setenv("OPENBLAS_CORETYPE", blas, 1) != 0) return;
  execv("/proc/self/exe", argv);
  /* exec failed: go on with the default policy. */
}
