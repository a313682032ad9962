/* tests/emu/test_emu.cpp — the GPU emulator itself (runtime/emu/emu.h):
 * block barriers and block-private shared memory, warp shuffles and
 * reductions at the target's warp width, the warp matrix multiply through
 * the target's fragment layouts against a plain product, empty grids, and
 * the stops on a divergent barrier and on a warp collective after a lane
 * returned (exit 70, in child processes). Built once per
 * emulated target (ctest emu_amd: wavefront 64, MFMA layouts; emu_nv:
 * warp 32, mma.sync layouts). */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/gpu/kernels/common.cuh"

static int failures;
#define EXPECT(cond, ...)                                                                          \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      failures++;                                                                                  \
      printf("FAIL %s:%d: ", __FILE__, __LINE__);                                                  \
      printf(__VA_ARGS__);                                                                         \
      printf("\n");                                                                                \
    }                                                                                              \
  } while (0)

/* Each block reverses its slice through shared memory. */
XM_GLOBAL(128) k_reverse(const int *x, int *y) {
  XM_SHARED(int, s, 128);
  int t = xm_tid(), n = xm_ntid();
  int64_t base = (int64_t)xm_bid_x() * n;
  s[t] = x[base + t];
  xm_sync();
  y[base + t] = s[n - 1 - t];
}

XM_GLOBAL(256) k_sums(const float *x, float *warp_sums, float *block_sum, int *lanes) {
  XM_SHARED(float, red, XM_MAX_WARPS);
  int t = xm_tid();
  float v = x[t];
  float w = xm_warp_sum(v);
  if (xm_lane() == 0) warp_sums[xm_warp_id()] = w;
  float b = xm_block_sum(v, red);
  if (t == 0) block_sum[0] = b;
  lanes[t] = xm_shfl_i(t, (xm_lane() + 1) % XM_WARP) - t;
}

XM_GLOBAL(XM_WARP) k_mma(const xm_bf16 *a, const xm_bf16 *b, float *d, int transposed) {
  xm_frag_a fa;
  xm_frag_b fb;
  xm_frag_c fc;
  xm_frag_zero(&fc);
  /* A is [16 x 16] row-major (or column-major when transposed), B [16 x N]. */
  if (transposed)
    xm_frag_load_a(&fa, a, 1, XM_MMA_M);
  else
    xm_frag_load_a(&fa, a, XM_MMA_K, 1);
  xm_frag_load_b(&fb, b, XM_MMA_N, 1);
  xm_mma(&fc, &fa, &fb);
  xm_mma(&fc, &fa, &fb); /* accumulates: twice the product */
  for (int i = 0; i < XM_FRAG_C_N; i++) {
    int r, c;
    xm_frag_c_coord(xm_lane(), i, &r, &c);
    d[r * XM_MMA_N + c] = fc.e[i];
  }
}

XM_GLOBAL(XM_WARP) k_early_return(float *y) {
  if (xm_lane() == 3) return;
  y[xm_tid()] = xm_warp_sum(1.0f);
}

XM_GLOBAL(64) k_divergent(int *y) {
  if (xm_tid() < 3) xm_sync();
  y[xm_tid()] = 1;
  xm_sync();
}

int main(void) {
  /* barrier + shared memory, several blocks on several OS threads */
  enum { B = 7, T = 128 };
  static int x[B * T], y[B * T];
  for (int i = 0; i < B * T; i++) x[i] = i * 3 + 1;
  xm_launch("reverse", B, 1, 1, T, NULL, k_reverse, (const int *)x, y);
  int bad = 0;
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) bad += y[b * T + t] != x[b * T + T - 1 - t];
  EXPECT(bad == 0, "reverse: %d wrong", bad);

  /* warp and block sums, shuffles */
  static float v[256], ws[8], bs[1];
  static int lanes[256];
  double want = 0;
  for (int i = 0; i < 256; i++) {
    v[i] = (float)((i * 37) % 11) - 5.0f;
    want += v[i];
  }
  xm_launch("sums", 1, 1, 1, 256, NULL, k_sums, (const float *)v, ws, bs, lanes);
  EXPECT(bs[0] == (float)want, "block sum %g want %g", bs[0], want);
  for (int w = 0; w < 256 / XM_WARP; w++) {
    double s = 0;
    for (int l = 0; l < XM_WARP; l++) s += v[w * XM_WARP + l];
    EXPECT(ws[w] == (float)s, "warp %d sum %g want %g", w, ws[w], s);
  }
  bad = 0;
  for (int t = 0; t < 256; t++) bad += lanes[t] != (t % XM_WARP == XM_WARP - 1 ? 1 - XM_WARP : 1);
  EXPECT(bad == 0, "shuffle: %d wrong", bad);

  /* warp MMA through the fragment layouts */
  for (int tr = 0; tr < 2; tr++) {
    static xm_bf16 a[16 * 16], b[16 * XM_MMA_N];
    static float d[16 * XM_MMA_N];
    for (int i = 0; i < 16 * 16; i++) a[i] = xm_f2bf((float)((i * 7) % 13) / 4.0f - 1.0f);
    for (int i = 0; i < 16 * XM_MMA_N; i++) b[i] = xm_f2bf((float)((i * 5) % 9) / 2.0f - 2.0f);
    xm_launch("mma", 1, 1, 1, XM_WARP, NULL, k_mma, (const xm_bf16 *)a, (const xm_bf16 *)b, d, tr);
    bad = 0;
    for (int r = 0; r < 16; r++)
      for (int c = 0; c < XM_MMA_N; c++) {
        double s = 0;
        for (int k = 0; k < 16; k++)
          s += (double)xm_bf2f(tr ? a[k * 16 + r] : a[r * 16 + k]) * xm_bf2f(b[k * XM_MMA_N + c]);
        bad += d[r * XM_MMA_N + c] != (float)(2 * s);
      }
    EXPECT(bad == 0, "mma (A %s): %d of %d wrong", tr ? "transposed" : "row-major", bad,
           16 * XM_MMA_N);
  }

  /* an empty grid launches nothing */
  xm_emu_stats_t before = xm_emu_stats();
  xm_launch("reverse", 0, 1, 1, T, NULL, k_reverse, (const int *)x, y);
  EXPECT(xm_emu_stats().launches == before.launches, "an empty grid ran");

  /* a divergent barrier stops with exit 70 and a message */
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    static int z[64];
    freopen("/dev/null", "w", stderr);
    xm_launch("divergent", 1, 1, 1, 64, NULL, k_divergent, z);
    _exit(0);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 70, "divergent barrier: status %d", st);

  /* a warp collective after a lane of the warp returned stops too */
  fflush(stdout);
  pid = fork();
  if (pid == 0) {
    static float z[XM_WARP];
    freopen("/dev/null", "w", stderr);
    xm_launch("early_return", 1, 1, 1, XM_WARP, NULL, k_early_return, z);
    _exit(0);
  }
  waitpid(pid, &st, 0);
  EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 70, "warp collective after a return: status %d", st);

  printf("%s emulator (warp %d, MMA %dx%dx%d): %s\n", XM_WARP == 64 ? "AMD" : "NVIDIA", XM_WARP,
         XM_MMA_M, XM_MMA_N, XM_MMA_K, failures ? "FAIL" : "ok");
  return failures != 0;
}
