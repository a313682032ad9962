/* bench/gpu_moe.cu — the fused MoE kernels of runtime/gpu/kernels/ on an
 * NVIDIA GPU at DeepSeek-like shapes, against cuBLAS on the same FLOPs.
 *
 *   nvcc -std=c++17 -O3 -arch=sm_90 -I. bench/gpu_moe.cu -lcublas -o gpu_moe
 *   ./gpu_moe OUT.json [BUDGET_S]        (bench/gpu_moe.sh does both)
 *
 * Measured per configuration (H = 7168, F = 2048, k = 8, bf16 operands,
 * f32 accumulation and f32 results; E in {8,16,32}, T in {4096,16384,32768};
 * routing uniform or Zipf-skewed):
 *   up      xm_g_gather_grouped_matmul_bf16, K = H, M = F: ONE of the two
 *           up-side GEMMs the compiler emits for a SwiGLU expert (ir/model.c
 *           builds gate and up as two grouped GEMMs of M = F each, and
 *           passes/fuse_permute_gemm.c fuses each with the gather), versus
 *           one dense cublasGemmEx of T*k rows x H x F (bf16 in, f32 out,
 *           CUBLAS_COMPUTE_32F) on already gathered rows;
 *   down    xm_g_grouped_matmul_combine_bf16, K = F, M = H (the weighted
 *           scatter-combine into the tokens included), versus one dense
 *           cublasGemmEx of T*k rows x F x H (f32 out, no combine);
 *   permute xm_g_permute (routing metadata);
 *   layer   the MoE layer forward + backward as the compiler schedules it
 *           with dtype=bf16 (see run_layer), GEMM FLOPs counted as
 *           3 GEMMs * 2*n*H*F forward and twice that backward.
 * Times: median of ITERS (default 10) cudaEvent-timed runs after warm-up.
 * A spot check first compares the fused gather GEMM and the fused combine on
 * a small shape against cuBLAS on explicitly gathered rows (+ a host
 * combine): PASS/FAIL, exit 1 on FAIL.
 * Environment: XM_BENCH_BUDGET_S (default 150), XM_BENCH_ITERS (10),
 * XM_BENCH_TILE_ROWS (128) and XM_BENCH_SLOTS (8): the fused kernels' chunk
 * of tile_rows*slots routed rows (the compiler's defaults,
 * passes/fuse_permute_gemm.c). Exit 3: no CUDA device.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "runtime/gpu/kernels/all.cuh"

typedef xm_shape_dyn D;

/* ---- error checks ---------------------------------------------------------- */

#define CK(call)                                                                                   \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "gpu_moe: %s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,                \
              cudaGetErrorString(e_));                                                             \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

#define CB(call)                                                                                   \
  do {                                                                                             \
    cublasStatus_t s_ = (call);                                                                    \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                             \
      fprintf(stderr, "gpu_moe: %s:%d: %s failed: cuBLAS status %d\n", __FILE__, __LINE__, #call, \
              (int)s_);                                                                            \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

/* After a sequence of kernel launches. */
#define CK_LAUNCH(what)                                                                            \
  do {                                                                                             \
    cudaError_t e_ = cudaGetLastError();                                                           \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "gpu_moe: launch of %s failed: %s\n", what, cudaGetErrorString(e_));       \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

static const int64_t kH = 7168, kF = 2048, kTopK = 8;

static double now_s(void) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

static int64_t env_int(const char *name, int64_t dflt) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt;
  char *end = NULL;
  long long n = strtoll(v, &end, 10);
  if (*end || n < 1) {
    fprintf(stderr, "gpu_moe: %s must be a positive integer, got '%s'\n", name, v);
    exit(1);
  }
  return (int64_t)n;
}

/* ---- device buffers ---------------------------------------------------------- */

static std::vector<void *> g_allocs;

template <class T> static T *dalloc(int64_t n) {
  void *p = NULL;
  size_t bytes = (size_t)(n > 0 ? n : 1) * sizeof(T);
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    fprintf(stderr, "gpu_moe: cudaMalloc of %.2f GiB failed: %s\n", bytes / 1073741824.0,
            cudaGetErrorString(e));
    exit(1);
  }
  g_allocs.push_back(p);
  return (T *)p;
}

static void dfree_all(void) {
  for (void *p : g_allocs)
    CK(cudaFree(p));
  g_allocs.clear();
}

/* Uniform values in [-scale, scale) from a hash of (seed, i). */
__device__ static float hash_unit(uint64_t seed, int64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + (uint64_t)i * 0xBF58476D1CE4E5B9ull + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (float)((z >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}
__global__ void k_fill_f32(float *p, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    p[i] = scale * hash_unit(seed, i);
}
__global__ void k_fill_bf16(xm_bf16 *p, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    p[i] = xm_f2bf(scale * hash_unit(seed, i));
}
static void fill_f32(cudaStream_t s, float *p, int64_t n, uint64_t seed, float scale) {
  k_fill_f32<<<2048, 256, 0, s>>>(p, n, seed, scale);
  CK_LAUNCH("fill_f32");
}
static void fill_bf16(cudaStream_t s, xm_bf16 *p, int64_t n, uint64_t seed, float scale) {
  k_fill_bf16<<<2048, 256, 0, s>>>(p, n, seed, scale);
  CK_LAUNCH("fill_bf16");
}

/* ---- routing ------------------------------------------------------------------ */

static uint64_t g_rng = 0x1234567887654321ull;
static double urand(void) { /* xorshift64*, [0, 1) */
  g_rng ^= g_rng >> 12;
  g_rng ^= g_rng << 25;
  g_rng ^= g_rng >> 27;
  return (double)((g_rng * 0x2545F4914F6CDD1Dull) >> 11) * (1.0 / 9007199254740992.0);
}

/* experts[T*k]: k distinct experts per token drawn without replacement
 * with probability proportional to pop[e]; weights[T*k] positive, summing
 * to 1 per token. skewed: pop[e] = 1 / (e+1)^1.2 (Zipf, exponent 1.2),
 * else uniform. */
static void make_routing(int64_t T, int64_t k, int64_t E, bool skewed, std::vector<int32_t> &ex,
                         std::vector<float> &wt) {
  ex.resize((size_t)(T * k));
  wt.resize((size_t)(T * k));
  std::vector<double> pop((size_t)E), p;
  for (int64_t e = 0; e < E; e++)
    pop[(size_t)e] = skewed ? 1.0 / pow((double)(e + 1), 1.2) : 1.0;
  for (int64_t t = 0; t < T; t++) {
    p = pop;
    double wsum = 0;
    for (int64_t j = 0; j < k; j++) {
      double tot = 0;
      for (double v : p)
        tot += v;
      double r = urand() * tot;
      int64_t e = 0;
      for (; e < E - 1; e++) {
        if (p[(size_t)e] > 0 && r < p[(size_t)e]) break;
        r -= p[(size_t)e];
      }
      while (p[(size_t)e] == 0)
        e--; /* rounding at the end of the list */
      p[(size_t)e] = 0;
      ex[(size_t)(t * k + j)] = (int32_t)e;
      float w = 0.05f + (float)urand();
      wt[(size_t)(t * k + j)] = w;
      wsum += w;
    }
    for (int64_t j = 0; j < k; j++)
      wt[(size_t)(t * k + j)] = (float)(wt[(size_t)(t * k + j)] / wsum);
  }
}

/* ---- timing ------------------------------------------------------------------- */

static int g_iters = 10;
static const int kWarm = 2;

/* Median ms of g_iters cudaEvent-timed runs of f() on s after kWarm. */
template <class Fn> static double time_ms(cudaStream_t s, const char *what, Fn f) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < kWarm; i++) {
    f();
    CK_LAUNCH(what);
  }
  CK(cudaStreamSynchronize(s));
  std::vector<double> t;
  for (int i = 0; i < g_iters; i++) {
    CK(cudaEventRecord(a, s));
    f();
    CK_LAUNCH(what);
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  size_t n = t.size();
  return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* Row-major y[rows, M] (f32) = x[rows, K] (bf16) w[M, K]^T (bf16). */
static void cublas_rows(cublasHandle_t h, const xm_bf16 *x, const xm_bf16 *w, float *y,
                        int64_t rows, int64_t K, int64_t M) {
  const float one = 1.0f, zero = 0.0f;
  CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)M, (int)rows, (int)K, &one, w, CUDA_R_16BF,
                  (int)K, x, CUDA_R_16BF, (int)K, &zero, y, CUDA_R_32F, (int)M, CUBLAS_COMPUTE_32F,
                  CUBLAS_GEMM_DEFAULT));
}

/* ---- the fused kernels' tiling ------------------------------------------------ */

static int64_t g_tile_rows = 128, g_slots = 8;

/* As passes/fuse_permute_gemm.c clamps them for `rows` routed rows. */
static void tiling(int64_t rows, int64_t *tile, int64_t *slots) {
  if (rows < 1) rows = 1;
  *tile = std::min(g_tile_rows, rows);
  *slots = std::min(g_slots, (rows + *tile - 1) / *tile);
}

/* ---- the correctness spot check --------------------------------------------- */

static double max_rel(const std::vector<float> &got, const std::vector<double> &ref) {
  double md = 0, mr = 0;
  for (size_t i = 0; i < ref.size(); i++) {
    double d = fabs((double)got[i] - ref[i]);
    if (!(d <= md)) md = d; /* NaN propagates */
    mr = std::max(mr, fabs(ref[i]));
  }
  return md / (mr > 0 ? mr : 1.0);
}

/* Fused gather GEMM vs cuBLAS per expert on host-gathered rows, and the
 * fused combine vs cuBLAS per expert + a host combine. Error: max |ours -
 * ref| / max |ref|. */
static bool spot_check(cudaStream_t s, cublasHandle_t hb, double *err_gather,
                       double *err_combine, char *desc, size_t desc_n) {
  const int64_t T = 512, E = 16, k = kTopK, K = 1024, M = 512;
  snprintf(desc, desc_n, "T=%lld E=%lld k=%lld gather K=%lld M=%lld, combine K=%lld M=%lld, zipf",
           (long long)T, (long long)E, (long long)k, (long long)K, (long long)M, (long long)M,
           (long long)K);
  const int64_t N = T * k;
  std::vector<int32_t> ex;
  std::vector<float> wt;
  make_routing(T, k, E, true, ex, wt);
  int32_t *d_ex = dalloc<int32_t>(N), *d_idx = dalloc<int32_t>(N), *d_bin = dalloc<int32_t>(N),
          *d_tpe = dalloc<int32_t>(E);
  float *d_wt = dalloc<float>(N);
  CK(cudaMemcpy(d_ex, ex.data(), N * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_wt, wt.data(), N * 4, cudaMemcpyHostToDevice));
  xm_g_permute<D>(s, d_ex, d_wt, d_idx, d_bin, d_tpe, T, k, E, 0);
  CK_LAUNCH("permute");
  std::vector<int32_t> idx((size_t)N), tpe((size_t)E);
  CK(cudaStreamSynchronize(s));
  CK(cudaMemcpy(idx.data(), d_idx, N * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(tpe.data(), d_tpe, E * 4, cudaMemcpyDeviceToHost));
  bool ok = true;
  { /* permute: a stable sort of the slots by expert */
    int64_t n = 0, i = 0;
    std::vector<char> seen((size_t)N, 0);
    for (int64_t e = 0; e < E; e++) {
      n += tpe[(size_t)e];
      for (int32_t r = 0; r < tpe[(size_t)e]; r++, i++) {
        int32_t sl = idx[(size_t)i];
        if (sl < 0 || sl >= N || seen[(size_t)sl] || ex[(size_t)sl] != e ||
            (r > 0 && idx[(size_t)i - 1] >= sl))
          ok = false;
        else
          seen[(size_t)sl] = 1;
      }
    }
    if (n != N) ok = false;
    if (!ok) fprintf(stderr, "gpu_moe: spot check: permute metadata wrong\n");
  }
  int64_t tile, slots;
  tiling(N, &tile, &slots);
  const int64_t W = std::max(K, M);
  float *d_scr = dalloc<float>(tile * slots * W);

  /* gather: x[T,K], w[E,M,K] -> y[N,M] */
  xm_bf16 *d_x = dalloc<xm_bf16>(T * K), *d_w = dalloc<xm_bf16>(E * M * K),
          *d_xg = dalloc<xm_bf16>(N * K);
  float *d_y = dalloc<float>(N * M), *d_yr = dalloc<float>(N * M);
  fill_bf16(s, d_x, T * K, 11, 1.0f);
  fill_bf16(s, d_w, E * M * K, 12, 0.05f);
  xm_g_gather_grouped_matmul_bf16<D>(s, d_x, d_idx, d_tpe, d_w, d_y, E, K, M, k, d_scr, tile,
                                     slots, (float *)NULL);
  CK_LAUNCH("gather_grouped_matmul_bf16");
  std::vector<xm_bf16> x((size_t)(T * K)), xg((size_t)(N * K));
  CK(cudaStreamSynchronize(s));
  CK(cudaMemcpy(x.data(), d_x, T * K * 2, cudaMemcpyDeviceToHost));
  for (int64_t i = 0; i < N; i++)
    memcpy(&xg[(size_t)(i * K)], &x[(size_t)(idx[(size_t)i] / k * K)], (size_t)K * 2);
  CK(cudaMemcpy(d_xg, xg.data(), N * K * 2, cudaMemcpyHostToDevice));
  for (int64_t e = 0, r0 = 0; e < E; r0 += tpe[(size_t)e], e++)
    if (tpe[(size_t)e] > 0)
      cublas_rows(hb, d_xg + r0 * K, d_w + e * M * K, d_yr + r0 * M, tpe[(size_t)e], K, M);
  CK(cudaStreamSynchronize(s));
  std::vector<float> y((size_t)(N * M)), yr((size_t)(N * M));
  CK(cudaMemcpy(y.data(), d_y, N * M * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(yr.data(), d_yr, N * M * 4, cudaMemcpyDeviceToHost));
  *err_gather = max_rel(y, std::vector<double>(yr.begin(), yr.end()));

  /* combine: h[N,M] (K' = M), w2[E,K,M] -> out[T,K] */
  xm_bf16 *d_h = dalloc<xm_bf16>(N * M), *d_w2 = dalloc<xm_bf16>(E * K * M);
  float *d_out = dalloc<float>(T * K), *d_z = dalloc<float>(N * K);
  fill_bf16(s, d_h, N * M, 13, 1.0f);
  fill_bf16(s, d_w2, E * K * M, 14, 0.05f);
  xm_g_grouped_matmul_combine_bf16<D>(s, d_h, d_w2, d_tpe, d_idx, d_wt, d_out, E, M, K, T, k, d_scr,
                                      tile, slots, (float *)NULL);
  CK_LAUNCH("grouped_matmul_combine_bf16");
  for (int64_t e = 0, r0 = 0; e < E; r0 += tpe[(size_t)e], e++)
    if (tpe[(size_t)e] > 0)
      cublas_rows(hb, d_h + r0 * M, d_w2 + e * K * M, d_z + r0 * K, tpe[(size_t)e], M, K);
  CK(cudaStreamSynchronize(s));
  std::vector<float> out((size_t)(T * K)), z((size_t)(N * K));
  CK(cudaMemcpy(out.data(), d_out, T * K * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(z.data(), d_z, N * K * 4, cudaMemcpyDeviceToHost));
  std::vector<double> ref((size_t)(T * K), 0.0);
  for (int64_t i = 0; i < N; i++) {
    int32_t sl = idx[(size_t)i];
    for (int64_t c = 0; c < K; c++)
      ref[(size_t)(sl / k * K + c)] += (double)wt[(size_t)sl] * z[(size_t)(i * K + c)];
  }
  *err_combine = max_rel(out, ref);
  dfree_all();
  return ok && *err_gather < 2e-2 && *err_combine < 2e-2;
}

/* ---- one configuration ---------------------------------------------------------- */

struct gemm_fig {
  double ours_ms, cublas_ms, flops;
};

struct result {
  int64_t T, E;
  bool skewed;
  int64_t tpe_min, tpe_max, tile, slots;
  gemm_fig up, down;
  double permute_ms, fwd_ms, layer_ms, layer_flops, wall_s;
};

static double tflops(double flops, double ms) { return ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0; }

static result run_config(cudaStream_t s, cublasHandle_t hb, int64_t T, int64_t E, bool skewed) {
  const double t0 = now_s();
  const int64_t k = kTopK, N = T * k, H = kH, F = kF;
  result r;
  memset(&r, 0, sizeof r);
  r.T = T;
  r.E = E;
  r.skewed = skewed;
  std::vector<int32_t> ex;
  std::vector<float> wt;
  make_routing(T, k, E, skewed, ex, wt);
  int32_t *d_ex = dalloc<int32_t>(N), *d_idx = dalloc<int32_t>(N), *d_bin = dalloc<int32_t>(N),
          *d_tpe = dalloc<int32_t>(E);
  float *d_wt = dalloc<float>(N);
  CK(cudaMemcpy(d_ex, ex.data(), N * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_wt, wt.data(), N * 4, cudaMemcpyHostToDevice));
  xm_g_permute<D>(s, d_ex, d_wt, d_idx, d_bin, d_tpe, T, k, E, 0);
  CK_LAUNCH("permute");
  std::vector<int32_t> tpe((size_t)E);
  CK(cudaStreamSynchronize(s));
  CK(cudaMemcpy(tpe.data(), d_tpe, E * 4, cudaMemcpyDeviceToHost));
  r.tpe_min = *std::min_element(tpe.begin(), tpe.end());
  r.tpe_max = *std::max_element(tpe.begin(), tpe.end());
  tiling(N, &r.tile, &r.slots);
  const int64_t tile = r.tile, slots = r.slots;

  /* f32 master tensors and their bf16 casts, as the compiled step has them */
  float *x = dalloc<float>(T * H), *wg = dalloc<float>(E * F * H), *wu = dalloc<float>(E * F * H),
        *wd = dalloc<float>(E * H * F), *dout = dalloc<float>(T * H);
  xm_bf16 *xb = dalloc<xm_bf16>(T * H), *wgb = dalloc<xm_bf16>(E * F * H),
          *wub = dalloc<xm_bf16>(E * F * H), *wdb = dalloc<xm_bf16>(E * H * F),
          *doutb = dalloc<xm_bf16>(T * H);
  float *g = dalloc<float>(N * F), *u = dalloc<float>(N * F), *sw = dalloc<float>(N * F),
        *out = dalloc<float>(T * H);
  xm_bf16 *swb = dalloc<xm_bf16>(N * F);
  float *ds = dalloc<float>(N * F), *dwts = dalloc<float>(N), *dg = dalloc<float>(N * F),
        *du = dalloc<float>(N * F), *dx = dalloc<float>(T * H), *dx2 = dalloc<float>(T * H);
  xm_bf16 *dgb = dalloc<xm_bf16>(N * F), *dub = dalloc<xm_bf16>(N * F);
  float *dwg = dalloc<float>(E * F * H), *dwu = dalloc<float>(E * F * H),
        *dwd = dalloc<float>(E * H * F);
  float *scr = dalloc<float>(tile * slots * H); /* widest staged row: H (combine M, dx K) */
  fill_f32(s, x, T * H, 1, 1.0f);
  fill_f32(s, wg, E * F * H, 2, 0.02f);
  fill_f32(s, wu, E * F * H, 3, 0.02f);
  fill_f32(s, wd, E * H * F, 4, 0.02f);
  fill_f32(s, dout, T * H, 5, 1.0f);
  xm_g_cast_f32_bf16<D>(s, x, xb, T * H);
  xm_g_cast_f32_bf16<D>(s, wg, wgb, E * F * H);
  xm_g_cast_f32_bf16<D>(s, wu, wub, E * F * H);
  xm_g_cast_f32_bf16<D>(s, wd, wdb, E * H * F);
  xm_g_cast_f32_bf16<D>(s, dout, doutb, T * H);
  fill_bf16(s, swb, N * F, 6, 1.0f);
  CK_LAUNCH("casts");
  CK(cudaStreamSynchronize(s));

  r.permute_ms = time_ms(s, "permute", [&] {
    xm_g_permute<D>(s, d_ex, d_wt, d_idx, d_bin, d_tpe, T, k, E, 0);
  });

  /* up: one gather GEMM of M = F */
  r.up.flops = 2.0 * N * H * F;
  r.up.ours_ms = time_ms(s, "gather_grouped_matmul_bf16", [&] {
    xm_g_gather_grouped_matmul_bf16<D>(s, xb, d_idx, d_tpe, wub, u, E, H, F, k, scr, tile, slots,
                                       (float *)NULL);
  });
  /* down with the combine */
  r.down.flops = 2.0 * N * F * H;
  r.down.ours_ms = time_ms(s, "grouped_matmul_combine_bf16", [&] {
    xm_g_grouped_matmul_combine_bf16<D>(s, swb, wdb, d_tpe, d_idx, d_wt, out, E, F, H, T, k, scr,
                                        tile, slots, (float *)NULL);
  });

  /* cuBLAS on the same FLOPs: dense rows, random operands (freed after) */
  {
    const size_t mark = g_allocs.size();
    xm_bf16 *a = dalloc<xm_bf16>(N * H), *b = dalloc<xm_bf16>(F * H);
    float *c = dalloc<float>(N * H);
    fill_bf16(s, a, N * H, 7, 1.0f);
    fill_bf16(s, b, F * H, 8, 0.02f);
    CK(cudaStreamSynchronize(s));
    r.up.cublas_ms = time_ms(s, "cublas up", [&] { cublas_rows(hb, a, b, c, N, H, F); });
    r.down.cublas_ms = time_ms(s, "cublas down", [&] { cublas_rows(hb, a, b, c, N, F, H); });
    CK(cudaStreamSynchronize(s));
    for (size_t i = mark; i < g_allocs.size(); i++)
      CK(cudaFree(g_allocs[i]));
    g_allocs.resize(mark);
  }

  /* The layer as the compiler schedules it with fuse-permute-gemm and
   * dtype=bf16: per step the weights and the tokens are cast to bf16, the
   * fused GEMMs write f32, swiglu runs on f32, its result is cast for the
   * combine; backward in autodiff's (reverse) order, each input gradient
   * cast to bf16 before the GEMMs that read it; the two dx of the gate and
   * up GEMMs are added (the gradient contribution of x). */
  auto forward = [&] {
    xm_g_cast_f32_bf16<D>(s, wg, wgb, E * F * H);
    xm_g_cast_f32_bf16<D>(s, wu, wub, E * F * H);
    xm_g_cast_f32_bf16<D>(s, wd, wdb, E * H * F);
    xm_g_cast_f32_bf16<D>(s, x, xb, T * H);
    xm_g_permute<D>(s, d_ex, d_wt, d_idx, d_bin, d_tpe, T, k, E, 0);
    xm_g_gather_grouped_matmul_bf16<D>(s, xb, d_idx, d_tpe, wgb, g, E, H, F, k, scr, tile, slots,
                                       (float *)NULL);
    xm_g_gather_grouped_matmul_bf16<D>(s, xb, d_idx, d_tpe, wub, u, E, H, F, k, scr, tile, slots,
                                       (float *)NULL);
    xm_g_swiglu<D>(s, g, u, sw, N * F);
    xm_g_cast_f32_bf16<D>(s, sw, swb, N * F);
    xm_g_grouped_matmul_combine_bf16<D>(s, swb, wdb, d_tpe, d_idx, d_wt, out, E, F, H, T, k, scr,
                                        tile, slots, (float *)NULL);
  };
  auto backward = [&] {
    xm_g_cast_f32_bf16<D>(s, dout, doutb, T * H);
    xm_g_grouped_matmul_combine_grad_bf16<D>(s, doutb, swb, wdb, d_tpe, d_idx, d_wt, ds, dwts, E,
                                             F, H, T, k, scr, tile, slots, (float *)NULL);
    xm_g_grouped_matmul_combine_dw_bf16<D>(s, doutb, swb, d_idx, d_wt, d_tpe, dwd, E, F, H, k,
                                           0.0f, scr, tile, slots, (float *)NULL);
    xm_g_swiglu_grad<D>(s, ds, g, u, dg, du, N * F);
    xm_g_cast_f32_bf16<D>(s, du, dub, N * F);
    xm_g_gather_grouped_matmul_dx_bf16<D>(s, dub, wub, d_tpe, d_idx, dx, E, H, F, T, k, scr, tile,
                                          slots, (float *)NULL);
    xm_g_gather_grouped_matmul_dw_bf16<D>(s, dub, xb, d_idx, d_tpe, dwu, E, H, F, k, 0.0f, scr,
                                          tile, slots, (float *)NULL);
    xm_g_cast_f32_bf16<D>(s, dg, dgb, N * F);
    xm_g_gather_grouped_matmul_dx_bf16<D>(s, dgb, wgb, d_tpe, d_idx, dx2, E, H, F, T, k, scr,
                                          tile, slots, (float *)NULL);
    xm_g_gather_grouped_matmul_dw_bf16<D>(s, dgb, xb, d_idx, d_tpe, dwg, E, H, F, k, 0.0f, scr,
                                          tile, slots, (float *)NULL);
    xm_g_add<D>(s, dx, dx2, dx, T * H, T * H);
  };
  r.fwd_ms = time_ms(s, "layer forward", forward);
  r.layer_ms = time_ms(s, "layer forward+backward", [&] {
    forward();
    backward();
  });
  r.layer_flops = 3.0 * (3.0 * 2.0 * N * H * F);
  CK(cudaStreamSynchronize(s));
  dfree_all();
  r.wall_s = now_s() - t0;
  return r;
}

/* ---- output ----------------------------------------------------------------------- */

static void json_gemm(FILE *f, const char *name, const gemm_fig &g) {
  fprintf(f,
          "\"%s\": {\"flops\": %.6e, \"ours_ms\": %.6f, \"ours_tflops\": %.3f, \"cublas_ms\": "
          "%.6f, \"cublas_tflops\": %.3f, \"ratio\": %.4f}",
          name, g.flops, g.ours_ms, tflops(g.flops, g.ours_ms), g.cublas_ms,
          tflops(g.flops, g.cublas_ms), g.ours_ms > 0 ? g.cublas_ms / g.ours_ms : 0.0);
}

static const char *routing_name(bool skewed) { return skewed ? "zipf1.2" : "uniform"; }

int main(int argc, char **argv) {
  if (argc < 2 || argc > 3) {
    fprintf(stderr, "usage: %s OUT.json [BUDGET_S]\n", argv[0]);
    return 2;
  }
  const char *json_path = argv[1];
  double budget = (double)env_int("XM_BENCH_BUDGET_S", 150);
  if (argc == 3) budget = atof(argv[2]);
  g_iters = (int)std::max<int64_t>(10, env_int("XM_BENCH_ITERS", 10));
  g_tile_rows = env_int("XM_BENCH_TILE_ROWS", 128);
  g_slots = env_int("XM_BENCH_SLOTS", 8);
  const double start = now_s();

  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev == 0) {
    fprintf(stderr, "gpu_moe: no CUDA device (cudaGetDeviceCount: %s); nothing measured\n",
            e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 3;
  }
  CK(cudaSetDevice(0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  int clock_khz = 0, mem_clock_khz = 0;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  CK(cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, 0));
  char stamp[64];
  time_t wall = time(NULL);
  strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", gmtime(&wall));
  printf("device: %s (sm_%d%d, %d SMs, %.0f MHz peak SM clock, %.1f GiB), run at %s\n", prop.name,
         prop.major, prop.minor, prop.multiProcessorCount, clock_khz / 1000.0,
         prop.totalGlobalMem / 1073741824.0, stamp);
  printf("H=%lld F=%lld k=%lld bf16 operands, f32 accumulation and results; median of %d runs "
         "after %d warm-up; budget %.0f s; fused chunk tile_rows=%lld slots=%lld\n",
         (long long)kH, (long long)kF, (long long)kTopK, g_iters, kWarm, budget,
         (long long)g_tile_rows, (long long)g_slots);
  printf("routing: uniform, or zipf1.2 = experts drawn without replacement with popularity "
         "1/(e+1)^1.2; skewed == uniform when E == k, so E=8 is run uniform only\n");

  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cublasHandle_t hb;
  CB(cublasCreate(&hb));
  CB(cublasSetStream(hb, s));

  double eg = 0, ec = 0;
  char desc[160];
  bool pass = spot_check(s, hb, &eg, &ec, desc, sizeof desc);
  printf("spot check (%s): gather GEMM max rel err %.3e, combine %.3e (limit 2e-2): %s\n", desc, eg,
         ec, pass ? "PASS" : "FAIL");
  fflush(stdout);

  std::vector<result> res;
  std::vector<std::string> skipped;
  const int64_t Ts[] = {4096, 16384, 32768}, Es[] = {8, 16, 32};
  printf("\n%-6s %-3s %-8s %-11s | %-29s | %-29s | %-8s | %-18s\n", "T", "E", "routing",
         "tpe min/max", "up  ours/cuBLAS ms  TF/s  ratio", "down ours/cuBLAS ms TF/s ratio",
         "perm ms", "layer f+b ms TF/s");
  double last_wall = 0, last_flops = 0;
  for (int64_t T : Ts)
    for (int64_t E : Es)
      for (int sk = 0; sk < 2; sk++) {
        if (sk && E == kTopK) continue;
        char name[64];
        snprintf(name, sizeof name, "T=%lld E=%lld %s", (long long)T, (long long)E,
                 routing_name(sk));
        const double flops = 18.0 * T * kTopK * kH * kF;
        const double predicted = last_flops > 0 ? last_wall * flops / last_flops : 0;
        if (now_s() - start + predicted > budget) {
          printf("%-40s skipped: time budget (%.0f s) would run out (predicted %.1f s)\n", name,
                 budget, predicted);
          skipped.push_back(name);
          continue;
        }
        result r = run_config(s, hb, T, E, sk != 0);
        last_wall = r.wall_s;
        last_flops = flops;
        res.push_back(r);
        printf("%-6lld %-3lld %-8s %5lld/%-5lld | %7.3f/%7.3f %4.0f/%4.0f %4.2f | %7.3f/%7.3f "
               "%4.0f/%4.0f %4.2f | %8.3f | %8.3f %5.0f\n",
               (long long)T, (long long)E, routing_name(sk), (long long)r.tpe_min,
               (long long)r.tpe_max, r.up.ours_ms, r.up.cublas_ms, tflops(r.up.flops, r.up.ours_ms),
               tflops(r.up.flops, r.up.cublas_ms), r.up.cublas_ms / r.up.ours_ms, r.down.ours_ms,
               r.down.cublas_ms, tflops(r.down.flops, r.down.ours_ms),
               tflops(r.down.flops, r.down.cublas_ms), r.down.cublas_ms / r.down.ours_ms,
               r.permute_ms, r.layer_ms, tflops(r.layer_flops, r.layer_ms));
        fflush(stdout);
      }
  printf("ratio = cuBLAS time / ours time = ours TFLOP/s / cuBLAS TFLOP/s (target >= 0.70); up = "
         "one of the two gate/up gather GEMMs (M = F); layer = forward+backward, 18*T*k*H*F "
         "GEMM FLOPs\n");
  if (!skipped.empty()) printf("%zu configuration(s) skipped for the time budget\n", skipped.size());

  FILE *f = fopen(json_path, "w");
  if (!f) {
    fprintf(stderr, "gpu_moe: cannot write %s\n", json_path);
    return 1;
  }
  fprintf(f, "{\n\"bench\": \"gpu_moe\", \"device\": \"%s\", \"sm\": \"%d%d\", \"sms\": %d, "
             "\"sm_clock_peak_mhz\": %.0f, \"mem_clock_peak_mhz\": %.0f, \"run_utc\": \"%s\",\n",
          prop.name, prop.major, prop.minor, prop.multiProcessorCount, clock_khz / 1000.0,
          mem_clock_khz / 1000.0, stamp);
  fprintf(f, "\"H\": %lld, \"F\": %lld, \"k\": %lld, \"iters\": %d, \"warmup\": %d, "
             "\"budget_s\": %.1f, \"wall_s\": %.1f, \"tile_rows\": %lld, \"slots\": %lld,\n",
          (long long)kH, (long long)kF, (long long)kTopK, g_iters, kWarm, budget, now_s() - start,
          (long long)g_tile_rows, (long long)g_slots);
  fprintf(f, "\"notes\": \"times ms (median); up = one gather GEMM K=H M=F (the compiler emits two, "
             "gate and up); down = combine GEMM K=F M=H incl. the weighted scatter-combine; "
             "cuBLAS = one dense cublasGemmEx bf16->f32 of T*k rows; ratio = cublas_ms/ours_ms; "
             "layer = fwd+bwd incl. weight/token casts and permute, flops = 18*T*k*H*F; "
             "zipf1.2 = popularity 1/(e+1)^1.2, k distinct experts per token\",\n");
  fprintf(f, "\"spot_check\": {\"shape\": \"%s\", \"gather_max_rel_err\": %.6e, "
             "\"combine_max_rel_err\": %.6e, \"limit\": 2e-2, \"result\": \"%s\"},\n",
          desc, eg, ec, pass ? "PASS" : "FAIL");
  fprintf(f, "\"configs\": [\n");
  for (size_t i = 0; i < res.size(); i++) {
    const result &r = res[i];
    fprintf(f,
            "  {\"T\": %lld, \"E\": %lld, \"k\": %lld, \"routing\": \"%s\", \"rows\": %lld, "
            "\"tpe_min\": %lld, \"tpe_max\": %lld, \"tile_rows\": %lld, \"slots\": %lld, ",
            (long long)r.T, (long long)r.E, (long long)kTopK, routing_name(r.skewed),
            (long long)(r.T * kTopK), (long long)r.tpe_min, (long long)r.tpe_max,
            (long long)r.tile, (long long)r.slots);
    json_gemm(f, "up", r.up);
    fprintf(f, ", ");
    json_gemm(f, "down", r.down);
    fprintf(f,
            ", \"permute_ms\": %.6f, \"layer\": {\"fwd_ms\": %.6f, \"fwd_bwd_ms\": %.6f, "
            "\"flops\": %.6e, \"tflops\": %.3f}, \"wall_s\": %.2f}%s\n",
            r.permute_ms, r.fwd_ms, r.layer_ms, r.layer_flops, tflops(r.layer_flops, r.layer_ms),
            r.wall_s, i + 1 < res.size() ? "," : "");
  }
  fprintf(f, "],\n\"skipped\": [");
  for (size_t i = 0; i < skipped.size(); i++)
    fprintf(f, "%s\"%s\"", i ? ", " : "", skipped[i].c_str());
  fprintf(f, "]\n}\n");
  if (fclose(f) != 0) {
    fprintf(stderr, "gpu_moe: write of %s failed\n", json_path);
    return 1;
  }
  CB(cublasDestroy(hb));
  CK(cudaStreamDestroy(s));
  printf("wrote %s\n", json_path);
  return pass ? 0 : 1;
}
