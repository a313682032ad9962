/* bench/attention.c — how fast are libxmrt's attention and RoPE kernels?
 *
 * Times xm_k_attention, xm_k_attention_grad and xm_k_rope on one layer's
 * tensors of a given shape (defaults: the cpu-medium benchmark model,
 * B=4 S=256 Hq=8 Hkv=4 D=32) and prints the best time of each over the
 * repeats, with GFLOP/s counted as causal attention (2 GEMMs of S^2/2 x D
 * forward; the backward does 5 with the recomputed scores, counted as 2.5x
 * the forward). Link it against a libxm_rt_cpu.a to compare two builds of
 * the kernels on the same inputs; the printed checksum must agree. Built by
 * hand (see docs/benchmarks.md, "Attention kernels"); not part of the CMake
 * build:
 *
 *   gcc -O2 -fopenmp -I. bench/attention.c build/libxm_rt_cpu.a \
 *       build/libxm_support.a $(pkg-config --libs openblas) -lm -o attention
 *   OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 OMP_WAIT_POLICY=passive \
 *       ./attention [B S Hq Hkv D [repeats]]
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "runtime/abi/workspace.h"
#include "runtime/cpu/kernels.h"

/* Deterministic inputs in [-0.5, 0.5): equal for every build compared. */
static float *filled(int64_t n, uint32_t seed) {
  float *p = malloc((size_t)n * sizeof *p);
  if (!p) {
    fprintf(stderr, "attention: out of memory\n");
    exit(2);
  }
  for (int64_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    p[i] = (float)(seed >> 8) / 16777216.0f - 0.5f;
  }
  return p;
}

int main(int argc, char **argv) {
  int64_t dims[5] = {4, 256, 8, 4, 32};
  for (int i = 0; i < 5 && i + 1 < argc; i++)
    dims[i] = atoll(argv[i + 1]);
  int reps = argc > 6 ? atoi(argv[6]) : 20;
  int64_t B = dims[0], S = dims[1], Hq = dims[2], Hkv = dims[3], D = dims[4];
  if (B < 1 || S < 1 || Hkv < 1 || Hq % Hkv != 0 || D < 2 || D % 2 || reps < 1) {
    fprintf(stderr, "usage: attention [B S Hq Hkv D [repeats]] (Hq a multiple of Hkv, D even)\n");
    return 2;
  }
  int64_t nq = B * S * Hq * D, nk = B * S * Hkv * D;
  float *q = filled(nq, 1), *k = filled(nk, 2), *v = filled(nk, 3), *dout = filled(nq, 4);
  float *out = filled(nq, 5), *dq = filled(nq, 6), *dk = filled(nk, 7), *dv = filled(nk, 8);
  /* The kernels' scratch, as the memory plan sizes it (runtime/abi/workspace.h). */
  float *ws_f = malloc((size_t)xm_ws_attention(B, S, Hq));
  float *ws_b = malloc((size_t)xm_ws_attention_grad(B, S, Hkv));
  float *ws_r = malloc((size_t)xm_ws_rope(S, D));
  float scale = 1.0f / sqrtf((float)D);
  double best[3] = {1e30, 1e30, 1e30};
  for (int r = 0; r < reps; r++) {
    double t0 = omp_get_wtime();
    xm_k_attention(q, k, v, out, B, S, Hq, Hkv, D, D, scale, ws_f);
    double t1 = omp_get_wtime();
    xm_k_attention_grad(dout, q, k, v, dq, dk, dv, B, S, Hq, Hkv, D, D, scale, ws_b);
    double t2 = omp_get_wtime();
    /* plain RoPE on the whole head: the Llama layout of the defaults */
    xm_k_rope(q, dq, B, S, Hq, D, 0, D, 10000.0f, 1.0f, 0.0f, 0.0f, 1.0f, 0, ws_r);
    double t3 = omp_get_wtime();
    double t[3] = {t1 - t0, t2 - t1, t3 - t2};
    for (int i = 0; i < 3; i++)
      best[i] = t[i] < best[i] ? t[i] : best[i];
  }
  xm_k_attention_grad(dout, q, k, v, dq, dk, dv, B, S, Hq, Hkv, D, D, scale, ws_b);
  double sum = 0.0;
  for (int64_t i = 0; i < nq; i++)
    sum += (double)out[i] + (double)dq[i];
  for (int64_t i = 0; i < nk; i++)
    sum += (double)dk[i] + (double)dv[i];
  double flops = 2.0 * (double)(B * Hq) * (double)S * (double)S * (double)D;
  printf("B=%lld S=%lld Hq=%lld Hkv=%lld D=%lld, %d threads: attention %.3f ms (%.1f GFLOP/s), "
         "grad %.3f ms (%.1f GFLOP/s), rope %.3f ms; checksum %.6g\n",
         (long long)B, (long long)S, (long long)Hq, (long long)Hkv, (long long)D,
         omp_get_max_threads(), best[0] * 1e3, flops / best[0] / 1e9, best[1] * 1e3,
         2.5 * flops / best[1] / 1e9, best[2] * 1e3, sum);
  free(q), free(k), free(v), free(dout), free(out), free(dq), free(dk), free(dv);
  return 0;
}
