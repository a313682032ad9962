/* runtime/kernels_attn.c — rotary position embedding and causal GQA
 * attention on the CPU (forward and backward).
 *
 * RoPE is the Hugging Face Llama form (rotate_half): the pair (i, i + D/2)
 * of a head at position p turns by p * theta^(-2i/D). The angles are formed
 * and turned into cos/sin in double once per position and shared by every
 * batch row and head; at position 10^4 a float angle would already be off
 * by ~1e-3 rad. The backward pass is the inverse rotation.
 *
 * Attention is exact (not blocked/online): for each query row the causal
 * scores are formed in a per-thread scratch row, softmaxed with the row
 * maximum subtracted, and used to mix the values. The backward pass
 * recomputes that softmax instead of storing the [S,S] probabilities (the
 * memory planner keeps only q, k, v), then uses
 *   dP = dout v^T,  dS = P * (dP - rowsum(dout * out)),
 *   dq = scale dS k,  dk = scale dS^T q,  dv = P^T dout.
 * Threads split the forward over (batch, query head). The backward splits
 * over (batch, kv head) instead: all query heads of a GQA group add into the
 * same dk/dv rows, and giving the whole group to one thread keeps those
 * sums free of races and of atomics. Plain loops, not CBLAS: the per-row
 * shapes are tiny and the OpenBLAS pthread build must not be entered from
 * inside an OpenMP team.
 */
#include "runtime/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "support/status.h"

/* Below this many multiply-adds a kernel stays on the calling thread. */
#define XM_K_ATTN_PAR_MIN ((int64_t)1 << 15)

/* ---- RoPE ------------------------------------------------------------------ */

/* dir = +1 rotates forward, -1 applies the inverse rotation (the gradient). */
static void rope_apply(const float *x, float *y, int64_t B, int64_t S, int64_t nh, int64_t D,
                       float theta, float dir) {
  XM_ASSERT(D % 2 == 0);
  int64_t half = D / 2;
  if (B <= 0 || S <= 0 || nh <= 0 || half == 0) return;
  double *inv_freq = malloc((size_t)half * sizeof *inv_freq);
  XM_ASSERT(inv_freq != NULL);
  for (int64_t i = 0; i < half; i++)
    inv_freq[i] = pow((double)theta, -2.0 * (double)i / (double)D);
#pragma omp parallel if (B * S * nh * D >= XM_K_ATTN_PAR_MIN)
  {
    float *cs = malloc((size_t)D * sizeof *cs); /* cos in [0,half), sin after */
    XM_ASSERT(cs != NULL);
    float *sn = cs + half;
#pragma omp for schedule(static)
    for (int64_t s = 0; s < S; s++) {
      for (int64_t i = 0; i < half; i++) {
        double a = (double)s * inv_freq[i];
        cs[i] = (float)cos(a);
        sn[i] = dir * (float)sin(a);
      }
      for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < nh; h++) {
          int64_t off = ((b * S + s) * nh + h) * D;
          const float *xr = x + off;
          float *yr = y + off;
          for (int64_t i = 0; i < half; i++) {
            float x1 = xr[i], x2 = xr[i + half];
            yr[i] = x1 * cs[i] - x2 * sn[i];
            yr[i + half] = x2 * cs[i] + x1 * sn[i];
          }
        }
      }
    }
    free(cs);
  }
  free(inv_freq);
}

void xm_k_rope(const float *x, float *y, int64_t B, int64_t S, int64_t nh, int64_t D, float theta) {
  rope_apply(x, y, B, S, nh, D, theta, 1.0f);
}

void xm_k_rope_grad(const float *dy, float *dx, int64_t B, int64_t S, int64_t nh, int64_t D,
                    float theta) {
  rope_apply(dy, dx, B, S, nh, D, theta, -1.0f);
}

/* ---- attention ------------------------------------------------------------- */

typedef struct {
  int64_t B, S, Hq, Hkv, D, Dv;
  float scale;
} attn_dims_t;

static inline float dotf(const float *a, const float *b, int64_t n) {
  float s = 0.0f;
  for (int64_t d = 0; d < n; d++)
    s += a[d] * b[d];
  return s;
}

/* p[0..i] = softmax over keys 0..i of query row qi (causal), scores scaled.
 * kh points at key 0 of the head; keys are strided by Hkv*D. Returns
 * nothing: p sums to one. */
static void causal_softmax_row(const float *qi, const float *kh, int64_t i, const attn_dims_t *a,
                               float *p) {
  int64_t kstride = a->Hkv * a->D;
  float m = -INFINITY;
  for (int64_t j = 0; j <= i; j++) {
    p[j] = a->scale * dotf(qi, kh + j * kstride, a->D);
    m = p[j] > m ? p[j] : m;
  }
  double sum = 0.0;
  for (int64_t j = 0; j <= i; j++) {
    p[j] = expf(p[j] - m);
    sum += p[j];
  }
  float inv = (float)(1.0 / sum);
  for (int64_t j = 0; j <= i; j++)
    p[j] *= inv;
}

void xm_k_attention(const float *q, const float *k, const float *v, float *out, int64_t B,
                    int64_t S, int64_t Hq, int64_t Hkv, int64_t D, int64_t Dv, float scale) {
  XM_ASSERT(Hkv > 0 && Hq % Hkv == 0);
  attn_dims_t a = {B, S, Hq, Hkv, D, Dv, scale};
  int64_t group = Hq / Hkv;
  int64_t work = B * Hq * S * S * (D + Dv) / 2;
  if (B <= 0 || S <= 0 || Hq <= 0) return;
#pragma omp parallel if (work >= XM_K_ATTN_PAR_MIN)
  {
    float *p = malloc((size_t)S * sizeof *p);
    XM_ASSERT(p != NULL);
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < B * Hq; bh++) {
      int64_t b = bh / Hq, h = bh % Hq, hk = h / group;
      const float *kh = k + (b * S * Hkv + hk) * D;
      const float *vh = v + (b * S * Hkv + hk) * Dv;
      for (int64_t i = 0; i < S; i++) {
        const float *qi = q + ((b * S + i) * Hq + h) * D;
        float *oi = out + ((b * S + i) * Hq + h) * Dv;
        causal_softmax_row(qi, kh, i, &a, p);
        for (int64_t d = 0; d < Dv; d++)
          oi[d] = 0.0f;
        for (int64_t j = 0; j <= i; j++) {
          const float *vj = vh + j * Hkv * Dv;
          float pj = p[j];
          for (int64_t d = 0; d < Dv; d++)
            oi[d] += pj * vj[d];
        }
      }
    }
    free(p);
  }
}

/* Gradients of one query head h (of kv head hk) in batch row b: writes its
 * dq rows, adds into dk/dv rows of hk. p and dp are scratch rows of S. */
static void attn_grad_head(const float *dout, const float *q, const float *k, const float *v,
                           float *dq, float *dk, float *dv, int64_t b, int64_t h, int64_t hk,
                           const attn_dims_t *a, float *p, float *dp) {
  int64_t S = a->S, D = a->D, Dv = a->Dv;
  int64_t kstride = a->Hkv * D, vstride = a->Hkv * Dv;
  const float *kh = k + (b * S * a->Hkv + hk) * D;
  const float *vh = v + (b * S * a->Hkv + hk) * Dv;
  float *dkh = dk + (b * S * a->Hkv + hk) * D;
  float *dvh = dv + (b * S * a->Hkv + hk) * Dv;
  for (int64_t i = 0; i < S; i++) {
    const float *qi = q + ((b * S + i) * a->Hq + h) * D;
    const float *doi = dout + ((b * S + i) * a->Hq + h) * Dv;
    float *dqi = dq + ((b * S + i) * a->Hq + h) * D;
    causal_softmax_row(qi, kh, i, a, p);
    /* rowsum(dout * out) = sum_j p_j (dout . v_j) */
    double delta = 0.0;
    for (int64_t j = 0; j <= i; j++) {
      dp[j] = dotf(doi, vh + j * vstride, Dv);
      delta += (double)p[j] * (double)dp[j];
    }
    for (int64_t d = 0; d < D; d++)
      dqi[d] = 0.0f;
    for (int64_t j = 0; j <= i; j++) {
      float ds = p[j] * (dp[j] - (float)delta) * a->scale;
      const float *kj = kh + j * kstride;
      float *dkj = dkh + j * kstride;
      float *dvj = dvh + j * vstride;
      for (int64_t d = 0; d < D; d++) {
        dqi[d] += ds * kj[d];
        dkj[d] += ds * qi[d];
      }
      for (int64_t d = 0; d < Dv; d++)
        dvj[d] += p[j] * doi[d];
    }
  }
}

void xm_k_attention_grad(const float *dout, const float *q, const float *k, const float *v,
                         float *dq, float *dk, float *dv, int64_t B, int64_t S, int64_t Hq,
                         int64_t Hkv, int64_t D, int64_t Dv, float scale) {
  XM_ASSERT(Hkv > 0 && Hq % Hkv == 0);
  attn_dims_t a = {B, S, Hq, Hkv, D, Dv, scale};
  int64_t group = Hq / Hkv;
  int64_t work = B * Hq * S * S * (D + Dv);
  if (B <= 0 || S <= 0 || Hq <= 0) return;
#pragma omp parallel if (work >= XM_K_ATTN_PAR_MIN)
  {
    float *p = malloc((size_t)2 * (size_t)S * sizeof *p);
    XM_ASSERT(p != NULL);
#pragma omp for schedule(dynamic, 1)
    for (int64_t bk = 0; bk < B * Hkv; bk++) {
      int64_t b = bk / Hkv, hk = bk % Hkv;
      /* dk/dv are overwritten, not accumulated across calls */
      for (int64_t s = 0; s < S; s++) {
        memset(dk + ((b * S + s) * Hkv + hk) * D, 0, (size_t)D * sizeof *dk);
        memset(dv + ((b * S + s) * Hkv + hk) * Dv, 0, (size_t)Dv * sizeof *dv);
      }
      for (int64_t h = hk * group; h < (hk + 1) * group; h++)
        attn_grad_head(dout, q, k, v, dq, dk, dv, b, h, hk, &a, p, p + S);
    }
    free(p);
  }
}
