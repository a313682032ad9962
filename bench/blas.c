/* bench/blas.c — how fast is the CBLAS that libxmrt links?
 *
 * Times cblas_sgemm on square fp32 matrices (2048^3 by default, the size
 * class of the dense and expert GEMMs of a small model on the CPU) and
 * prints GFLOP/s with the kernel core OpenBLAS chose at load time, so that
 * the effect of OPENBLAS_NUM_THREADS and OPENBLAS_CORETYPE can be read off
 * one line per setting. Built by hand (see docs/benchmarks.md, "BLAS
 * choice"); not part of the CMake build.
 *
 * With a third argument "mix", each timed step is one sgemm followed by an
 * OpenMP elementwise pass over C (as the training schedule alternates GEMMs
 * with libxmrt's OpenMP kernels): this shows what the OpenBLAS pthread pool
 * and the OpenMP team cost each other when both spin-wait on few cores.
 * Build with -fopenmp for that mode.
 *
 *   usage: blas [n] [repeats] [mix]
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* OpenBLAS extensions, repeated here so that the program also builds
 * against another CBLAS with -DNO_OPENBLAS (it then prints no core name). */
#ifndef NO_OPENBLAS
char *openblas_get_corename(void);
char *openblas_get_config(void);
int openblas_get_num_threads(void);
#endif

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2048;
  int reps = argc > 2 ? atoi(argv[2]) : 5;
  int mix = argc > 3 && strcmp(argv[3], "mix") == 0;
  if (n <= 0 || reps <= 0 || reps > 100) {
    fprintf(stderr, "usage: blas [n > 0] [repeats 1..100]\n");
    return 2;
  }
  size_t nn = (size_t)n * (size_t)n;
  float *a = malloc(nn * sizeof *a), *b = malloc(nn * sizeof *b), *c = malloc(nn * sizeof *c);
  if (!a || !b || !c) {
    fprintf(stderr, "blas: out of memory for n=%d\n", n);
    return 1;
  }
  for (size_t i = 0; i < nn; i++) {
    a[i] = (float)((i * 7919u) % 1000u) * 1e-3f - 0.5f;
    b[i] = (float)((i * 104729u) % 1000u) * 1e-3f - 0.5f;
  }
  /* one untimed call: thread start-up and page faults of c */
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
  double t[100];
  for (int r = 0; r < reps; r++) {
    double t0 = now_s();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    if (mix) {
      for (int pass = 0; pass < 8; pass++) {
#pragma omp parallel for schedule(static)
        for (long i = 0; i < (long)nn; i++)
          c[i] = c[i] * 0.5f + a[i];
      }
    }
    t[r] = now_s() - t0;
  }
  qsort(t, (size_t)reps, sizeof t[0], cmp_double);
  double flop = 2.0 * (double)n * (double)n * (double)n;
#ifndef NO_OPENBLAS
  printf("core=%s threads=%d ", openblas_get_corename(), openblas_get_num_threads());
#endif
  printf("n=%d%s best=%.1f median=%.1f GFLOP/s (best %.1f ms; c[0]=%g)\n", n, mix ? " mix" : "",
         flop / t[0] * 1e-9, flop / t[reps / 2] * 1e-9, t[0] * 1e3, (double)c[0]);
  free(a), free(b), free(c);
  return 0;
}
