/* bench/fabric_sim.c — how long the flow engine (fabric/sim.c) takes on
 * one training iteration's collectives of a 1024-GPU plan: 128 nodes of 8
 * ranks, L layers of four expert all-to-alls (dispatch and combine,
 * forward and backward, every rank to every rank) and one ring all-reduce
 * of the gradients, on each topology.
 *
 *   usage: fabric_sim [uniform|skewed] [layers] [topology]
 *
 * uniform: every rank sends the same bytes to every other rank, so the
 * layers' all-to-alls are equal and the engine simulates each distinct
 * phase once; skewed: each layer's bytes per pair vary (a fixed
 * pseudo-random factor in [0.5, 1.5)), every phase is distinct and is
 * simulated. Prints the wall time of xm_fab_simulate and the simulated
 * iteration time. Built and run by bench/fabric_sim.sh.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fabric/flow.h"
#include "fabric/sim.h"
#include "fabric/topology.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double factor(uint64_t layer, uint64_t src, uint64_t dst) {
  uint64_t h = (layer * 0x9E3779B97F4A7C15ull) ^ (src * 0xBF58476D1CE4E5B9ull) ^
               (dst * 0x94D049BB133111EBull);
  h ^= h >> 31;
  h *= 0xD6E8FEB86659FD93ull;
  h ^= h >> 32;
  return 0.5 + (double)(h % 1000000) / 1e6;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "uniform";
  int layers = argc > 2 ? atoi(argv[2]) : 28;
  const char *kind_name = argc > 3 ? argv[3] : "fat-tree";
  bool skewed = strcmp(mode, "skewed") == 0;
  xm_fab_kind_t kind;
  if (layers < 1 || !xm_fab_kind_parse(kind_name, &kind) || (!skewed && strcmp(mode, "uniform"))) {
    fprintf(stderr, "usage: fabric_sim [uniform|skewed] [layers] [topology]\n");
    return 2;
  }
  xm_cluster_spec_t c;
  memset(&c, 0, sizeof c);
  c.nodes = 128;
  c.ranks_per_node = 8;
  c.intra_bw_gbps = 100;
  c.intra_latency_us = 2;
  c.inter_bw_gbps = 25;
  c.inter_latency_us = 5;
  c.switch_radix = 64;
  c.oversubscription = 2;
  c.ocs_reconfig_ms = 10;
  xm_fab_topo_t t;
  xm_diag_t d;
  xm_diag_init(&d);
  if (xm_fab_topo_from_cluster(&c, kind, 0, &t, &d) != XM_OK) {
    xm_diag_print(&d, stderr);
    return 2;
  }
  const int64_t P = c.nodes * c.ranks_per_node;
  const double pair_bytes = 64e3; /* 64 MB per rank per all-to-all */
  int64_t n = 4 * (int64_t)layers + 1;
  xm_fab_phase_t *ph = calloc((size_t)n, sizeof *ph);
  static const char *names[4] = {"dispatch", "combine", "combine_bwd", "dispatch_bwd"};
  for (int l = 0; l < layers; l++)
    for (int k = 0; k < 4; k++) {
      xm_fab_phase_t *p = &ph[4 * l + k];
      xm_fab_phase_init(p, names[k], l);
      p->latency_steps = 1;
      for (int64_t s = 0; s < P; s++)
        for (int64_t r = 0; r < P; r++) {
          /* combine moves dispatch's bytes back */
          int64_t a = k == 1 || k == 2 ? r : s, b = k == 1 || k == 2 ? s : r;
          double bytes =
              skewed ? pair_bytes * factor((uint64_t)l, (uint64_t)a, (uint64_t)b) : pair_bytes;
          if (xm_fab_phase_add(p, s, r, bytes) != XM_OK) return 1;
        }
    }
  xm_fab_phase_t *ar = &ph[n - 1];
  xm_fab_phase_init(ar, "all_reduce", -1);
  const double grad = 2e9;
  ar->latency_steps = 2.0 * (double)(P - 1);
  for (int64_t s = 0; s < P; s++)
    if (xm_fab_phase_add(ar, s, (s + 1) % P, 2.0 * (double)(P - 1) / (double)P * grad) != XM_OK)
      return 1;
  double *out = calloc((size_t)n, sizeof *out);
  double t0 = now();
  xm_status_t st = xm_fab_simulate(&t, ph, n, out, &d);
  double wall = now() - t0;
  if (st != XM_OK) {
    xm_diag_print(&d, stderr);
    return 1;
  }
  double total = 0, a2a = 0;
  for (int64_t i = 0; i < n; i++)
    total += out[i];
  for (int64_t i = 0; i + 1 < n; i++)
    a2a += out[i];
  printf("%s %s %d layers: %lld phases, wall %.3f s, simulated %.6f s (all-to-alls %.6f s, "
         "all-reduce %.6f s)\n",
         kind_name, mode, layers, (long long)n, wall, total, a2a, out[n - 1]);
  for (int64_t i = 0; i < n; i++)
    xm_fab_phase_free(&ph[i]);
  free(ph);
  free(out);
  xm_diag_free(&d);
  return 0;
}
