/* runtime/cpu/kernels_attn.c — rotary position embedding and causal GQA
 * attention on the CPU (forward and backward).
 *
 * RoPE is the Hugging Face Llama form (rotate_half): the pair (i, i + D/2)
 * of a head at position p turns by p * theta^(-2i/D). A call first builds
 * a cos/sin table of its S positions x D/2 frequencies, then rotates every
 * (batch, position, head) row from it. The table is formed in double: at
 * position 10^4 a float angle would already be off by ~1e-3 rad. Calling
 * cos and sin for every entry cost more than the rotation itself, so each
 * block of XM_K_ROPE_ANCHOR positions starts from one exact cos/sin pair per
 * frequency and walks on by complex multiplication with the one-position
 * step (error ~1e-16 per step in double, ~1e-14 after a block: far below a
 * float ulp). Anchors sit at fixed multiples, so the table does not depend
 * on S or on the thread count. The backward pass is the inverse rotation.
 * The inverse frequencies and the table live in the caller's workspace
 * (xm_ws_rope of runtime/abi/workspace.h; kernels never allocate).
 *
 * Attention is exact (not online-softmax): per (batch, query head) the
 * query rows are cut into tiles of XM_K_ATTN_TILE rows; for the tile [i0,
 * i1) only keys [0, i1) are causal, so the tile's scores P = scale q k^T
 * are one GEMM of tile x i1 (the masked upper triangle outside the diagonal
 * tiles is never formed: about half of the S x S flops saved). The stable
 * softmax runs in place over each row's first i+1 columns and zeroes the
 * rest, then out = P v is a second GEMM. Rows of one head sit Hq*D floats
 * apart in q, so the GEMMs read q, k, v and write out in place through
 * their leading dimensions; nothing is transposed or copied.
 * The backward pass recomputes P (the memory planner keeps only q, k, v)
 * and uses
 *   dP = dout v^T,  dS = P * (dP - rowsum(P * dP)),
 *   dq = scale dS k,  dk += scale dS^T q,  dv += P^T dout
 * (rowsum(P * dP) equals rowsum(dout * out), which the interface does not
 * pass). It splits over (batch, kv head): all query heads of a GQA group add
 * into the same dk/dv rows, and giving the whole group to one thread keeps
 * those sums free of races and of atomics.
 *
 * Threads: the (batch, head) units run in an OpenMP team and every GEMM
 * runs single-threaded inside it. Each thread computes its tiles in its own
 * slot of the caller's workspace (a tile x S probability buffer forward,
 * two backward); the slots are fixed by the shapes (xm_ws_attention_slots,
 * xm_ws_attention_grad_slots of runtime/abi/workspace.h: at most
 * XM_WS_ATTN_SLOTS, never more than the units), so the compiler can size
 * the workspace, and the team is capped at that many threads. A unit is
 * computed the same way in any slot and its scratch is written before it
 * is read, so the results do not depend on the team size.
 *
 * The Debian OpenBLAS is the pthread flavour, which cannot tell that it is
 * called from an OpenMP team: a GEMM it decides to thread then fights the
 * team for the cores (measured: 64 x
 * 129 x 32 GEMMs from 2 OpenMP threads drop from 48 to 7 GFLOP/s with
 * OPENBLAS_NUM_THREADS=2). It stays on the calling thread when M*N*K <=
 * 65536 * GEMM_MULTITHREAD_THRESHOLD (4 by default) = 2^18, so gemm_st
 * cuts larger GEMMs into pieces of at most that size (out/train runs
 * OpenBLAS single-threaded anyway; the cut protects other programs and the
 * tests, and costs a few extra calls). The other design,
 * one (batch, head) at a time with OpenBLAS threading each GEMM, measured
 * slower: these GEMMs are too small to split well over threads, and the
 * softmax between them would run on one core (docs/benchmarks.md,
 * "Attention kernels").
 */
#include "runtime/cpu/kernels.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "runtime/abi/workspace.h"
#include "support/status.h"

/* Below this many multiply-adds a kernel stays on the calling thread. */
#define XM_K_ATTN_PAR_MIN ((int64_t)1 << 15)
/* Query rows per tile: smaller tiles waste less of the diagonal block (a
 * tile computes tile^2/2 masked scores), larger ones make better GEMMs.
 * The workspace formulas size the tiles' buffers with the same constant. */
#define XM_K_ATTN_TILE XM_WS_ATTN_TILE
/* Largest M*N*K that OpenBLAS runs on the calling thread (see above). */
#define XM_K_ATTN_GEMM_MAX ((int64_t)1 << 18)
/* Positions per exactly computed RoPE anchor. */
#define XM_K_ROPE_ANCHOR 64

/* ---- RoPE ------------------------------------------------------------------ */

/* cs[s*half + i] = m cos(s * w_i), sn[...] = dir * m sin(s * w_i) for
 * positions [s0, s1). */
static void rope_table_block(const double *inv_freq, int64_t half, int64_t s0, int64_t s1,
                             double m, float dir, float *cs, float *sn) {
  for (int64_t i = 0; i < half; i++) {
    double c = cos((double)s0 * inv_freq[i]), s = sin((double)s0 * inv_freq[i]);
    double dc = cos(inv_freq[i]), ds = sin(inv_freq[i]);
    for (int64_t p = s0; p < s1; p++) {
      cs[p * half + i] = (float)(m * c);
      sn[p * half + i] = dir * (float)(m * s);
      double cn = c * dc - s * ds;
      s = s * dc + c * ds;
      c = cn;
    }
  }
}

/* Inverse frequency i of rd rotary dims, with YaRN's blend when factor != 1
 * (runtime/cpu/kernels.h). */
static double rope_inv_freq(int64_t i, int64_t rd, double theta, double factor, double lo,
                            double hi) {
  double f = pow(theta, -2.0 * (double)i / (double)rd);
  if (factor == 1.0) return f;
  if (hi == lo) hi += 0.001;
  double r = ((double)i - lo) / (hi - lo);
  r = r < 0 ? 0 : r > 1 ? 1 : r;
  return f / factor * r + f * (1.0 - r);
}

/* dir = +1 rotates forward, -1 applies the transposed rotation (the
 * gradient). ws (xm_ws_rope(S, rd) bytes): inv_freq double[half], then cos
 * [S,half], then sin [S,half] as floats; 8-byte aligned, since half
 * doubles come first. */
static void rope_apply(const float *x, float *y, int64_t B, int64_t S, int64_t nh, int64_t D,
                       int64_t off, int64_t rd, float theta, float factor, float lo, float hi,
                       float mscale, int interleave, float dir, float *ws) {
  XM_ASSERT(rd % 2 == 0 && off >= 0 && off + rd <= D);
  int64_t half = rd / 2;
  if (B <= 0 || S <= 0 || nh <= 0 || D <= 0) return;
  if (half > 0) XM_ASSERT(ws != NULL);
  double *inv_freq = (double *)(void *)ws;
  float *cs = half > 0 ? (float *)(void *)(inv_freq + half) : NULL;
  float *sn = cs ? cs + S * half : NULL;
  for (int64_t i = 0; i < half; i++)
    inv_freq[i] = rope_inv_freq(i, rd, theta, factor, lo, hi);
  int64_t nblk = half > 0 ? (S + XM_K_ROPE_ANCHOR - 1) / XM_K_ROPE_ANCHOR : 0;
  /* forward reads the pair at (a, b) and writes (i, i+half); the gradient
   * the other way round */
  int64_t sa = interleave ? 2 : 1, sb = interleave ? 2 : 1, ob = interleave ? 1 : half;
#pragma omp parallel if (B * S * nh * D >= XM_K_ATTN_PAR_MIN)
  {
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < nblk; blk++) {
      int64_t s0 = blk * XM_K_ROPE_ANCHOR;
      int64_t s1 = s0 + XM_K_ROPE_ANCHOR < S ? s0 + XM_K_ROPE_ANCHOR : S;
      rope_table_block(inv_freq, half, s0, s1, (double)mscale, dir, cs, sn);
    }
#pragma omp for schedule(static)
    for (int64_t bs = 0; bs < B * S; bs++) {
      const float *c = cs ? cs + (bs % S) * half : NULL, *sv = sn ? sn + (bs % S) * half : NULL;
      for (int64_t h = 0; h < nh; h++) {
        const float *xr = x + (bs * nh + h) * D;
        float *yr = y + (bs * nh + h) * D;
        for (int64_t i = 0; i < off; i++)
          yr[i] = xr[i];
        for (int64_t i = off + rd; i < D; i++)
          yr[i] = xr[i];
        const float *xa = xr + off;
        float *ya = yr + off;
        if (dir > 0) {
          for (int64_t i = 0; i < half; i++) {
            float x1 = xa[i * sa], x2 = xa[i * sb + ob];
            ya[i] = x1 * c[i] - x2 * sv[i];
            ya[i + half] = x2 * c[i] + x1 * sv[i];
          }
        } else { /* sv holds -sin: the same formulas give the transpose */
          for (int64_t i = 0; i < half; i++) {
            float g1 = xa[i], g2 = xa[i + half];
            ya[i * sa] = g1 * c[i] - g2 * sv[i];
            ya[i * sb + ob] = g2 * c[i] + g1 * sv[i];
          }
        }
      }
    }
  }
}

void xm_k_rope(const float *x, float *y, int64_t B, int64_t S, int64_t nh, int64_t D, int64_t off,
               int64_t rd, float theta, float factor, float ramp_lo, float ramp_hi, float mscale,
               int interleave, float *ws) {
  rope_apply(x, y, B, S, nh, D, off, rd, theta, factor, ramp_lo, ramp_hi, mscale, interleave,
             1.0f, ws);
}

void xm_k_rope_grad(const float *dy, float *dx, int64_t B, int64_t S, int64_t nh, int64_t D,
                    int64_t off, int64_t rd, float theta, float factor, float ramp_lo,
                    float ramp_hi, float mscale, int interleave, float *ws) {
  rope_apply(dy, dx, B, S, nh, D, off, rd, theta, factor, ramp_lo, ramp_hi, mscale, interleave,
             -1.0f, ws);
}

/* ---- single-threaded GEMM pieces ------------------------------------------ */

static int blas_dim(int64_t d) {
  XM_ASSERT(d >= 0 && d <= INT_MAX);
  return (int)d;
}

/* Row-major C[M,N] = alpha op(A)[M,K] op(B)[K,N] + beta C, cut into pieces
 * of at most XM_K_ATTN_GEMM_MAX multiply-adds so that OpenBLAS runs each on
 * the calling thread. Pieces along K accumulate into C (beta = 1 after the
 * first), which changes only the summation order. */
static void gemm_st(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                    int64_t lda, const float *Bm, int64_t ldb, float beta, float *C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) { /* C = beta C; beta 0 must also clear NaN garbage */
    for (int64_t m = 0; m < M; m++)
      for (int64_t n = 0; n < N; n++)
        C[m * ldc + n] = beta == 0.0f ? 0.0f : beta * C[m * ldc + n];
    return;
  }
  int64_t mc = M, nc = N, kc = K;
  while (mc * nc * kc > XM_K_ATTN_GEMM_MAX) { /* halve the largest extent */
    if (kc >= mc && kc >= nc) kc = (kc + 1) / 2;
    else if (mc >= nc) mc = (mc + 1) / 2;
    else nc = (nc + 1) / 2;
  }
  for (int64_t m0 = 0; m0 < M; m0 += mc)
    for (int64_t n0 = 0; n0 < N; n0 += nc)
      for (int64_t k0 = 0; k0 < K; k0 += kc) {
        int64_t m = M - m0 < mc ? M - m0 : mc, n = N - n0 < nc ? N - n0 : nc;
        int64_t k = K - k0 < kc ? K - k0 : kc;
        const float *a = ta ? A + k0 * lda + m0 : A + m0 * lda + k0;
        const float *b = tb ? Bm + n0 * ldb + k0 : Bm + k0 * ldb + n0;
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    blas_dim(m), blas_dim(n), blas_dim(k), alpha, a, blas_dim(lda), b,
                    blas_dim(ldb), k0 == 0 ? beta : 1.0f, C + m0 * ldc + n0, blas_dim(ldc));
      }
}

/* ---- attention ------------------------------------------------------------- */

typedef struct {
  int64_t B, S, Hq, Hkv, D, Dv;
  float scale;
} attn_dims_t;

/* Pointers to the first row of one head: rows of a head are ld floats
 * apart (all heads of a position are adjacent). */
typedef struct {
  const float *q, *k, *v; /* q of query head h; k, v of its kv head */
  int64_t ldq, ldk, ldv;
} attn_head_t;

static attn_head_t attn_head(const float *q, const float *k, const float *v, int64_t b, int64_t h,
                             const attn_dims_t *a) {
  int64_t hk = h / (a->Hq / a->Hkv);
  attn_head_t r = {q + (b * a->S * a->Hq + h) * a->D, k + (b * a->S * a->Hkv + hk) * a->D,
                   v + (b * a->S * a->Hkv + hk) * a->Dv, a->Hq * a->D, a->Hkv * a->D,
                   a->Hkv * a->Dv};
  return r;
}

/* ---- softmax rows -----------------------------------------------------------
 *
 * The softmax and its gradient were half of the attention time once the
 * GEMMs went to OpenBLAS: libm's expf is a call per element, and the
 * compilers vectorize neither a call nor (under the default
 * -ftrapping-math, or with UBSan's checks) the selects of a clamped
 * exponential; `omp simd` on such loops is a hard error under Clang's
 * UBSan. So these loops are written on GCC/Clang vector types of 4 floats
 * (a vector cast is a bit reinterpretation). Measured on one layer of
 * cpu-medium (bench/attention.c), 16-byte vectors are the best compromise:
 * 8-float vectors were 15% faster in the AVX2 copy below but 2x slower
 * than these on baseline x86-64, where GCC lowers them through the stack.
 * The helpers pass vectors through pointers; always inlined, they cost
 * nothing. */
typedef float xm_v4f_t __attribute__((vector_size(16)));
typedef uint32_t xm_v4u_t __attribute__((vector_size(16)));
typedef double xm_v2d_t __attribute__((vector_size(16)));
#define XM_INLINE static inline __attribute__((always_inline))
/* The row loops get a second copy for x86-64-v3 (AVX2 + FMA), chosen at
 * load time by the CPU (the resolver checks the OS's AVX state too): the
 * attention kernels ran 12-20% faster with it here. FMA contraction there
 * makes results differ from the baseline copy in the last bits only. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define XM_AVX2_CLONE __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define XM_AVX2_CLONE
#endif

/* *v = the 4 floats at x, of which the first cnt are read, the rest pad.
 * Whole vectors take the plain path: filling a vector in memory piecewise
 * and loading it back stalls on store forwarding. */
XM_INLINE void load4(xm_v4f_t *v, const float *x, int64_t cnt, float pad) {
  if (cnt >= 4) {
    memcpy(v, x, sizeof *v);
    return;
  }
  float t[4];
  for (int l = 0; l < 4; l++)
    t[l] = l < cnt ? x[l] : pad;
  memcpy(v, t, sizeof *v);
}

XM_INLINE void store4(float *x, const xm_v4f_t *v, int64_t cnt) {
  if (cnt >= 4) {
    memcpy(x, v, sizeof *v);
    return;
  }
  for (int l = 0; l < cnt; l++)
    x[l] = (*v)[l];
}

/* *v = e^*v for the x <= 0 of a max-subtracted softmax. Cody-Waite
 * reduction x = n ln2 + r, |r| <= ln2/2, then the degree-6 polynomial of
 * Cephes' expf, scaled by 2^n through the exponent bits: within 1 ulp of
 * glibc's expf on [-87.3, 0] (checked on 2e6 points). Below -87.3 the
 * result would be a denormal and is flushed to 0 (so is -inf). Range tests
 * compare bit patterns as unsigned integers: for x <= 0 they grow with
 * |x|, and +0 and NaN stay below the limit. Adding 1.5 * 2^23 rounds to an
 * integer whose value sits in the low mantissa bits, which gives 2^n
 * without a float-to-int conversion. */
XM_INLINE void exp4_nonpos(xm_v4f_t *v) {
  const uint32_t lim = 0xC2AE999Au; /* -87.3f */
  const float magic = 12582912.0f;  /* 1.5 * 2^23 */
  xm_v4u_t xb = (xm_v4u_t)*v;
  xm_v4u_t under = (xm_v4u_t)(xb > lim); /* all ones where x < -87.3 */
  xm_v4f_t xc = (xm_v4f_t)((xb & ~under) | (lim & under));
  xm_v4f_t t = xc * 1.44269504f + magic;
  xm_v4f_t n = t - magic;
  xm_v4f_t r = xc - n * 0.693359375f + n * 2.12194440e-4f;
  xm_v4f_t p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  xm_v4u_t two_n = ((xm_v4u_t)t + (127u - 0x4B400000u)) << 23;
  *v = (xm_v4f_t)((xm_v4u_t)(p * (xm_v4f_t)two_n) & ~under);
}

XM_INLINE void max4(xm_v4f_t *acc, const xm_v4f_t *b) {
  xm_v4u_t gt = (xm_v4u_t)(*b > *acc);
  *acc = (xm_v4f_t)(((xm_v4u_t)*b & gt) | ((xm_v4u_t)*acc & ~gt));
}

/* acc += the 4 lanes of *a, in double. Callers add 8 vectors in float
 * lanes first (8 terms per lane: a few ulps) and convert once per 32
 * elements; converting every vector cost more than the exponentials. */
XM_INLINE void acc4(xm_v2d_t acc[2], const xm_v4f_t *a) {
  acc[0] += __builtin_convertvector(__builtin_shufflevector(*a, *a, 0, 1), xm_v2d_t);
  acc[1] += __builtin_convertvector(__builtin_shufflevector(*a, *a, 2, 3), xm_v2d_t);
}

XM_INLINE double hsum(const xm_v2d_t acc[2]) {
  xm_v2d_t s = acc[0] + acc[1];
  return s[0] + s[1];
}

/* In place over rows [i0, i0+rows) of a tile whose row r holds the scaled
 * scores of query i0+r against keys [0, n): softmax over the causal keys
 * 0..i0+r with the row maximum subtracted, zero beyond. The row sum is
 * accumulated in double. */
XM_AVX2_CLONE static void
causal_softmax_tile(float *p, int64_t ldp, int64_t i0, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; r++) {
    float *pr = p + r * ldp;
    int64_t len = i0 + r + 1;
    xm_v4f_t mv, e;
    load4(&mv, pr, len, -INFINITY);
    for (int64_t j = 4; j < len; j += 4) {
      load4(&e, pr + j, len - j, -INFINITY);
      max4(&mv, &e);
    }
    float m = mv[0];
    for (int l = 1; l < 4; l++)
      m = mv[l] > m ? mv[l] : m;
    xm_v2d_t sum[2] = {{0, 0}, {0, 0}};
    for (int64_t jb = 0; jb < len; jb += 32) {
      xm_v4f_t part = {0, 0, 0, 0};
      for (int64_t j = jb; j < len && j < jb + 32; j += 4) {
        load4(&e, pr + j, len - j, -INFINITY);
        e -= m;
        exp4_nonpos(&e);
        part += e;
        store4(pr + j, &e, len - j);
      }
      acc4(sum, &part);
    }
    float inv = (float)(1.0 / hsum(sum));
    for (int64_t j = 0; j < len; j += 4) {
      load4(&e, pr + j, len - j, 0.0f);
      e *= inv;
      store4(pr + j, &e, len - j);
    }
    memset(pr + len, 0, (size_t)(n - len) * sizeof *pr);
  }
}

/* P[rows, i1] of the query rows [i0, i1) of one head: scores, then softmax
 * (p has row stride S). */
static void attn_probs(const attn_head_t *hd, const attn_dims_t *a, int64_t i0, int64_t i1,
                       float *p) {
  gemm_st(0, 1, i1 - i0, i1, a->D, a->scale, hd->q + i0 * hd->ldq, hd->ldq, hd->k, hd->ldk, 0.0f,
          p, a->S);
  causal_softmax_tile(p, a->S, i0, i1 - i0, i1);
}

/* Threads for `slots` slots: the team never outgrows the workspace. */
static int attn_team(int64_t slots) {
  int64_t nt = omp_get_max_threads();
  nt = nt < slots ? nt : slots;
  return nt > 1 ? (int)nt : 1;
}

void xm_k_attention(const float *q, const float *k, const float *v, float *out, int64_t B,
                    int64_t S, int64_t Hq, int64_t Hkv, int64_t D, int64_t Dv, float scale,
                    float *ws) {
  XM_ASSERT(Hkv > 0 && Hq % Hkv == 0);
  if (B <= 0 || S <= 0 || Hq <= 0) return;
  XM_ASSERT(ws != NULL);
  attn_dims_t a = {B, S, Hq, Hkv, D, Dv, scale};
  int64_t ntile = (S + XM_K_ATTN_TILE - 1) / XM_K_ATTN_TILE;
  int64_t work = B * Hq * S * S * (D + Dv) / 2;
  int64_t rows = xm_ws_attn_rows(S);
  int nt = attn_team(xm_ws_attention_slots(B, S, Hq));
#pragma omp parallel num_threads(nt) if (work >= XM_K_ATTN_PAR_MIN)
  {
    float *p = ws + (int64_t)omp_get_thread_num() * rows * S;
    /* the last tiles are the largest: hand them out first */
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < B * Hq * ntile; u++) {
      int64_t t = ntile - 1 - u / (B * Hq), bh = u % (B * Hq);
      int64_t i0 = t * XM_K_ATTN_TILE, i1 = i0 + XM_K_ATTN_TILE < S ? i0 + XM_K_ATTN_TILE : S;
      attn_head_t hd = attn_head(q, k, v, bh / Hq, bh % Hq, &a);
      attn_probs(&hd, &a, i0, i1, p);
      gemm_st(0, 0, i1 - i0, Dv, i1, 1.0f, p, S, hd.v, hd.ldv, 0.0f,
              out + ((bh / Hq * S + i0) * Hq + bh % Hq) * Dv, Hq * Dv);
    }
  }
}

/* dP -> dS in place over rows [i0, i0+rows): dS = P * (dP - rowsum(P*dP)),
 * zero beyond the causal keys (P is zero there already). */
XM_AVX2_CLONE static void
softmax_grad_tile(const float *p, float *dp, int64_t ldp, int64_t i0, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; r++) {
    const float *pr = p + r * ldp;
    float *dr = dp + r * ldp;
    int64_t len = i0 + r + 1;
    xm_v4f_t pv, dv;
    xm_v2d_t delta[2] = {{0, 0}, {0, 0}};
    for (int64_t jb = 0; jb < len; jb += 32) {
      xm_v4f_t part = {0, 0, 0, 0};
      for (int64_t j = jb; j < len && j < jb + 32; j += 4) {
        load4(&pv, pr + j, len - j, 0.0f);
        load4(&dv, dr + j, len - j, 0.0f);
        part += pv * dv;
      }
      acc4(delta, &part);
    }
    float dl = (float)hsum(delta);
    for (int64_t j = 0; j < len; j += 4) {
      load4(&pv, pr + j, len - j, 0.0f);
      load4(&dv, dr + j, len - j, 0.0f);
      dv = pv * (dv - dl);
      store4(dr + j, &dv, len - j);
    }
    memset(dr + len, 0, (size_t)(n - len) * sizeof *dr);
  }
}

/* Gradients of query head h of batch row b: writes its dq rows, adds into
 * the dk/dv rows of its kv head. p and dp are tile x S scratch. */
static void attn_grad_head(const float *dout, const float *q, const float *k, const float *v,
                           float *dq, float *dk, float *dv, int64_t b, int64_t h,
                           const attn_dims_t *a, float *p, float *dp) {
  int64_t S = a->S, hk = h / (a->Hq / a->Hkv);
  attn_head_t hd = attn_head(q, k, v, b, h, a);
  const float *doh = dout + (b * S * a->Hq + h) * a->Dv;
  float *dqh = dq + (b * S * a->Hq + h) * a->D;
  float *dkh = dk + (b * S * a->Hkv + hk) * a->D;
  float *dvh = dv + (b * S * a->Hkv + hk) * a->Dv;
  int64_t ldo = a->Hq * a->Dv;
  for (int64_t i0 = 0; i0 < S; i0 += XM_K_ATTN_TILE) {
    int64_t i1 = i0 + XM_K_ATTN_TILE < S ? i0 + XM_K_ATTN_TILE : S, rows = i1 - i0;
    attn_probs(&hd, a, i0, i1, p);
    gemm_st(0, 1, rows, i1, a->Dv, 1.0f, doh + i0 * ldo, ldo, hd.v, hd.ldv, 0.0f, dp, S);
    softmax_grad_tile(p, dp, S, i0, rows, i1);
    gemm_st(0, 0, rows, a->D, i1, a->scale, dp, S, hd.k, hd.ldk, 0.0f, dqh + i0 * hd.ldq, hd.ldq);
    gemm_st(1, 0, i1, a->D, rows, a->scale, dp, S, hd.q + i0 * hd.ldq, hd.ldq, 1.0f, dkh,
            hd.ldk);
    gemm_st(1, 0, i1, a->Dv, rows, 1.0f, p, S, doh + i0 * ldo, ldo, 1.0f, dvh, hd.ldv);
  }
}

void xm_k_attention_grad(const float *dout, const float *q, const float *k, const float *v,
                         float *dq, float *dk, float *dv, int64_t B, int64_t S, int64_t Hq,
                         int64_t Hkv, int64_t D, int64_t Dv, float scale, float *ws) {
  XM_ASSERT(Hkv > 0 && Hq % Hkv == 0);
  if (B <= 0 || S <= 0 || Hq <= 0) return;
  XM_ASSERT(ws != NULL);
  attn_dims_t a = {B, S, Hq, Hkv, D, Dv, scale};
  int64_t group = Hq / Hkv;
  int64_t work = B * Hq * S * S * (D + Dv);
  int64_t rows = xm_ws_attn_rows(S);
  int nt = attn_team(xm_ws_attention_grad_slots(B, S, Hkv));
#pragma omp parallel num_threads(nt) if (work >= XM_K_ATTN_PAR_MIN)
  {
    float *p = ws + (int64_t)omp_get_thread_num() * 2 * rows * S;
#pragma omp for schedule(dynamic, 1)
    for (int64_t bk = 0; bk < B * Hkv; bk++) {
      int64_t b = bk / Hkv, hk = bk % Hkv;
      /* dk/dv are overwritten, not accumulated across calls */
      for (int64_t s = 0; s < S; s++) {
        memset(dk + ((b * S + s) * Hkv + hk) * D, 0, (size_t)D * sizeof *dk);
        memset(dv + ((b * S + s) * Hkv + hk) * Dv, 0, (size_t)Dv * sizeof *dv);
      }
      for (int64_t h = hk * group; h < (hk + 1) * group; h++)
        attn_grad_head(dout, q, k, v, dq, dk, dv, b, h, &a, p, p + rows * S);
    }
  }
}
