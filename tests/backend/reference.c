/* tests/backend/reference.c — the naive reference kernels (reference.h).
 *
 * Every function is the formula of its kernel's comment in
 * runtime/cpu/kernels.h (and docs/design.md, Model semantics) typed out as
 * loops: sums and transcendentals in double, outputs rounded to float once.
 * Nothing here is shared with the CPU kernels, so that a mistake in one is
 * not a mistake in both; where the documentation leaves a choice open, the
 * comment at the function says which reading this file takes.
 */
#include "tests/backend/reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Scoring numbers of runtime/cpu/kernels.h (frontend xm_scoring_t). */
enum { REF_SOFTMAX = 0, REF_SIGMOID = 1 };

static double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }

/* A zeroed double buffer of n elements (at least one, so n == 0 is fine);
 * the suite's shapes are small, so an allocation failure is fatal. */
static double *dzeros(int64_t n) {
  double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
  if (!p) abort();
  return p;
}

/* Row offsets of the experts' runs: off[e] = sum of tpe[0..e), off[E] = n. */
static int64_t *run_offsets(const int32_t *tpe, int64_t E) {
  int64_t *off = malloc(sizeof(int64_t) * (size_t)(E + 1));
  if (!off) abort();
  off[0] = 0;
  for (int64_t e = 0; e < E; e++)
    off[e + 1] = off[e] + tpe[e];
  return off;
}

/* ---- dense ---------------------------------------------------------------- */

void xm_ref_matmul(const float *x, const float *w, float *y, int64_t M, int64_t K, int64_t N) {
  for (int64_t m = 0; m < M; m++)
    for (int64_t n = 0; n < N; n++) {
      double s = 0.0;
      for (int64_t k = 0; k < K; k++)
        s += (double)x[m * K + k] * w[n * K + k];
      y[m * N + n] = (float)s;
    }
}

void xm_ref_matmul_dx(const float *dy, const float *w, float *dx, int64_t M, int64_t K, int64_t N) {
  for (int64_t m = 0; m < M; m++)
    for (int64_t k = 0; k < K; k++) {
      double s = 0.0;
      for (int64_t n = 0; n < N; n++)
        s += (double)dy[m * N + n] * w[n * K + k];
      dx[m * K + k] = (float)s;
    }
}

static void matmul_dw(const float *dy, const float *x, float *dw, int64_t M, int64_t K, int64_t N,
                      int acc) {
  for (int64_t n = 0; n < N; n++)
    for (int64_t k = 0; k < K; k++) {
      double s = acc ? (double)dw[n * K + k] : 0.0;
      for (int64_t m = 0; m < M; m++)
        s += (double)dy[m * N + n] * x[m * K + k];
      dw[n * K + k] = (float)s;
    }
}

void xm_ref_matmul_dw(const float *dy, const float *x, float *dw, int64_t M, int64_t K, int64_t N) {
  matmul_dw(dy, x, dw, M, K, N, 0);
}

void xm_ref_matmul_dw_acc(const float *dy, const float *x, float *dw, int64_t M, int64_t K,
                          int64_t N) {
  matmul_dw(dy, x, dw, M, K, N, 1);
}

void xm_ref_add(const float *a, const float *b, float *y, int64_t na, int64_t nb) {
  for (int64_t i = 0; i < na; i++)
    y[i] = (float)((double)a[i] + b[i % nb]);
}

void xm_ref_mul(const float *a, const float *b, float *y, int64_t na, int64_t nb) {
  for (int64_t i = 0; i < na; i++)
    y[i] = (float)((double)a[i] * b[i % nb]);
}

/* y[r,h] = a[r,h] * b[r]: one factor per row. */
void xm_ref_mul_rows(const float *a, const float *b, float *y, int64_t rows, int64_t H) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t h = 0; h < H; h++)
      y[r * H + h] = (float)((double)a[r * H + h] * b[r]);
}

void xm_ref_scale(const float *x, float *y, int64_t n, float factor) {
  for (int64_t i = 0; i < n; i++)
    y[i] = (float)((double)x[i] * factor);
}

void xm_ref_reduce_to(const float *x, float *y, int64_t nx, int64_t ny) {
  for (int64_t j = 0; j < ny; j++) {
    double s = 0.0;
    for (int64_t i = 0; i < nx / ny; i++)
      s += x[i * ny + j];
    y[j] = (float)s;
  }
}

/* y[r] = the sum of row r of x[rows, H]. */
void xm_ref_reduce_rows(const float *x, float *y, int64_t rows, int64_t H) {
  for (int64_t r = 0; r < rows; r++) {
    double s = 0.0;
    for (int64_t h = 0; h < H; h++)
      s += x[r * H + h];
    y[r] = (float)s;
  }
}

void xm_ref_fill(float *y, int64_t n, float value) {
  for (int64_t i = 0; i < n; i++)
    y[i] = value;
}

void xm_ref_copy(const float *x, float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    y[i] = x[i];
}

void xm_ref_silu(const float *x, float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    y[i] = (float)(x[i] * sigm(x[i]));
}

/* d/dx x s(x) = s + x s (1 - s). */
void xm_ref_silu_grad(const float *dy, const float *x, float *dx, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    double s = sigm(x[i]);
    dx[i] = (float)(dy[i] * (s + x[i] * s * (1.0 - s)));
  }
}

/* The tanh form: 0.5 x (1 + tanh(u)), u = c (x + 0.044715 x^3), c =
 * sqrt(2/pi), written with 1 + tanh(u) = 2 sigmoid(2u) and 1 - tanh(u)^2 =
 * 4 s (1 - s), so that the far negative tail does not cancel to 0. */
static const double k_gelu_c = 0.7978845608028654;
static const double k_gelu_a = 0.044715;

void xm_ref_gelu(const float *x, float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    double v = x[i];
    y[i] = (float)(v * sigm(2.0 * k_gelu_c * (v + k_gelu_a * v * v * v)));
  }
}

/* d/dx = s + x * 2 s (1 - s) * u', s = sigmoid(2u), u' = c (1 + 3 a x^2). */
void xm_ref_gelu_grad(const float *dy, const float *x, float *dx, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    double v = x[i];
    double s = sigm(2.0 * k_gelu_c * (v + k_gelu_a * v * v * v));
    double d = s + v * 2.0 * s * (1.0 - s) * k_gelu_c * (1.0 + 3.0 * k_gelu_a * v * v);
    dx[i] = (float)(dy[i] * d);
  }
}

void xm_ref_sigmoid(const float *x, float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    y[i] = (float)sigm(x[i]);
}

void xm_ref_sigmoid_grad(const float *dy, const float *y, float *dx, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    dx[i] = (float)((double)dy[i] * y[i] * (1.0 - y[i]));
}

void xm_ref_swiglu(const float *g, const float *u, float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    y[i] = (float)(g[i] * sigm(g[i]) * u[i]);
}

void xm_ref_swiglu_grad(const float *dy, const float *g, const float *u, float *dg, float *du,
                        int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    double s = sigm(g[i]);
    dg[i] = (float)(dy[i] * u[i] * (s + g[i] * s * (1.0 - s)));
    du[i] = (float)(dy[i] * g[i] * s);
  }
}

static double rms_inv(const float *xr, int64_t H, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < H; i++)
    ss += (double)xr[i] * xr[i];
  return 1.0 / sqrt(ss / (double)H + eps);
}

void xm_ref_rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t H, float eps) {
  for (int64_t r = 0; r < rows; r++) {
    double inv = rms_inv(x + r * H, H, eps);
    for (int64_t i = 0; i < H; i++)
      y[r * H + i] = (float)(x[r * H + i] * inv * w[i]);
  }
}

/* y_i = x_i w_i q, q = (mean(x^2) + eps)^(-1/2), dq/dx_j = -q^3 x_j / H:
 * dx_j = q w_j dy_j - x_j q^3 / H * sum_i dy_i w_i x_i; dw_i = sum_r dy_i x_i q. */
void xm_ref_rmsnorm_grad(const float *dy, const float *x, const float *w, float *dx, float *dw,
                         int64_t rows, int64_t H, float eps) {
  double *dwd = dzeros(H);
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * H, *gr = dy + r * H;
    double q = rms_inv(xr, H, eps);
    double dot = 0.0;
    for (int64_t i = 0; i < H; i++)
      dot += (double)gr[i] * w[i] * xr[i];
    for (int64_t i = 0; i < H; i++) {
      dx[r * H + i] = (float)(q * w[i] * gr[i] - xr[i] * q * q * q / (double)H * dot);
      dwd[i] += (double)gr[i] * xr[i] * q;
    }
  }
  for (int64_t i = 0; i < H; i++)
    dw[i] = (float)dwd[i];
  free(dwd);
}

/* The rotation angle of pair k at position s: s * w_k, w_k = theta^(-2k/rd),
 * and with factor != 1 YaRN's blend, which moves w_k towards w_k / factor
 * by the ramp r = clamp((k - lo) / (hi - lo), 0, 1) (hi nudged by 0.001
 * when hi == lo): w_k (1 - r + r / factor). */
static double rope_angle(int64_t s, int64_t k, int64_t rd, double theta, double factor, double lo,
                         double hi) {
  double w = pow(theta, -2.0 * (double)k / (double)rd);
  if (factor != 1.0) {
    if (hi == lo) hi += 0.001;
    double r = fmin(1.0, fmax(0.0, ((double)k - lo) / (hi - lo)));
    w *= 1.0 - r + r / factor;
  }
  return (double)s * w;
}

/* rotate_half of the rd dims from off of each row, the rest copied: pair k
 * (of half = rd/2) is at (k, k + half) of the rotated dims, or at (2k, 2k +
 * 1) with interleave, and the forward always writes (k, k + half). The
 * rotation by a, scaled by m: (u, v) -> m (u cos a - v sin a, v cos a + u
 * sin a). The backward is its transpose, m (u cos a + v sin a, v cos a - u
 * sin a), reading (k, k + half) and writing where the forward read. */
static void rope_dir(const float *x, float *y, int64_t B, int64_t S, int64_t nh, int64_t D,
                     int64_t off, int64_t rd, float theta, float factor, float lo, float hi,
                     float mscale, int interleave, int grad) {
  int64_t half = rd / 2;
  for (int64_t b = 0; b < B; b++)
    for (int64_t s = 0; s < S; s++)
      for (int64_t h = 0; h < nh; h++) {
        const float *xr = x + ((b * S + s) * nh + h) * D;
        float *yr = y + ((b * S + s) * nh + h) * D;
        for (int64_t i = 0; i < D; i++)
          if (i < off || i >= off + rd) yr[i] = xr[i];
        for (int64_t k = 0; k < half; k++) {
          double a = rope_angle(s, k, rd, theta, factor, lo, hi);
          double c = mscale * cos(a), sn = mscale * sin(a);
          int64_t p = off + (interleave ? 2 * k : k), q = off + (interleave ? 2 * k + 1 : k + half);
          int64_t in0 = grad ? off + k : p, in1 = grad ? off + k + half : q;
          int64_t out0 = grad ? p : off + k, out1 = grad ? q : off + k + half;
          double u = xr[in0], v = xr[in1];
          if (grad) sn = -sn;
          yr[out0] = (float)(u * c - v * sn);
          yr[out1] = (float)(v * c + u * sn);
        }
      }
}

void xm_ref_rope(const float *x, float *y, int64_t B, int64_t S, int64_t nh, int64_t D, int64_t off,
                 int64_t rd, float theta, float factor, float ramp_lo, float ramp_hi, float mscale,
                 int interleave) {
  rope_dir(x, y, B, S, nh, D, off, rd, theta, factor, ramp_lo, ramp_hi, mscale, interleave, 0);
}

void xm_ref_rope_grad(const float *dy, float *dx, int64_t B, int64_t S, int64_t nh, int64_t D,
                      int64_t off, int64_t rd, float theta, float factor, float ramp_lo,
                      float ramp_hi, float mscale, int interleave) {
  rope_dir(dy, dx, B, S, nh, D, off, rd, theta, factor, ramp_lo, ramp_hi, mscale, interleave, 1);
}

/* y[r,h,:] = a[r,h,:] followed by b[r,h,:], or b[r,0,:] for every h when
 * Hb == 1. */
void xm_ref_concat(const float *a, const float *b, float *y, int64_t R, int64_t H, int64_t Hb,
                   int64_t Da, int64_t Db) {
  for (int64_t r = 0; r < R; r++)
    for (int64_t h = 0; h < H; h++) {
      float *yr = y + (r * H + h) * (Da + Db);
      for (int64_t j = 0; j < Da; j++)
        yr[j] = a[(r * H + h) * Da + j];
      for (int64_t j = 0; j < Db; j++)
        yr[Da + j] = b[(r * Hb + (Hb == 1 ? 0 : h)) * Db + j];
    }
}

/* The adjoint of concat: a and b are the two parts of each row, except that
 * a broadcast b (Hb == 1, H > 1 or not) gets the sum over the heads. */
void xm_ref_split(const float *x, float *a, float *b, int64_t R, int64_t H, int64_t Hb, int64_t Da,
                  int64_t Db) {
  double *acc = dzeros(Db);
  for (int64_t r = 0; r < R; r++) {
    for (int64_t j = 0; j < Db; j++)
      acc[j] = 0.0;
    for (int64_t h = 0; h < H; h++) {
      const float *xr = x + (r * H + h) * (Da + Db);
      for (int64_t j = 0; j < Da; j++)
        a[(r * H + h) * Da + j] = xr[j];
      for (int64_t j = 0; j < Db; j++) {
        if (Hb == 1)
          acc[j] += xr[Da + j];
        else
          b[(r * H + h) * Db + j] = xr[Da + j];
      }
    }
    if (Hb == 1)
      for (int64_t j = 0; j < Db; j++)
        b[r * Db + j] = (float)acc[j];
  }
  free(acc);
}

/* Causal softmax probabilities p[0..i] of query i of head h in batch b. */
static void attn_probs(const float *q, const float *k, int64_t b, int64_t i, int64_t h, int64_t S,
                       int64_t Hq, int64_t Hkv, int64_t D, float scale, double *p) {
  int64_t kvh = h / (Hq / Hkv);
  const float *qr = q + ((b * S + i) * Hq + h) * D;
  double mx = -INFINITY;
  for (int64_t j = 0; j <= i; j++) {
    const float *kr = k + ((b * S + j) * Hkv + kvh) * D;
    double s = 0.0;
    for (int64_t d = 0; d < D; d++)
      s += (double)qr[d] * kr[d];
    p[j] = s * scale;
    if (p[j] > mx) mx = p[j];
  }
  double sum = 0.0;
  for (int64_t j = 0; j <= i; j++) {
    p[j] = exp(p[j] - mx);
    sum += p[j];
  }
  for (int64_t j = 0; j <= i; j++)
    p[j] /= sum;
}

void xm_ref_attention(const float *q, const float *k, const float *v, float *out, int64_t B,
                      int64_t S, int64_t Hq, int64_t Hkv, int64_t D, int64_t Dv, float scale) {
  double *p = dzeros(S);
  for (int64_t b = 0; b < B; b++)
    for (int64_t i = 0; i < S; i++)
      for (int64_t h = 0; h < Hq; h++) {
        int64_t kvh = h / (Hq / Hkv);
        attn_probs(q, k, b, i, h, S, Hq, Hkv, D, scale, p);
        for (int64_t d = 0; d < Dv; d++) {
          double o = 0.0;
          for (int64_t j = 0; j <= i; j++)
            o += p[j] * v[((b * S + j) * Hkv + kvh) * Dv + d];
          out[((b * S + i) * Hq + h) * Dv + d] = (float)o;
        }
      }
  free(p);
}

/* With P the causal softmax of z = scale q k^T: dv_j += p_ij dout_i,
 * dp_ij = dout_i . v_j, dz_ij = p_ij (dp_ij - sum_l p_il dp_il),
 * dq_i = scale sum_j dz_ij k_j, dk_j += scale dz_ij q_i (summed over the
 * query heads that share the kv head). */
void xm_ref_attention_grad(const float *dout, const float *q, const float *k, const float *v,
                           float *dq, float *dk, float *dv, int64_t B, int64_t S, int64_t Hq,
                           int64_t Hkv, int64_t D, int64_t Dv, float scale) {
  double *p = dzeros(S), *dp = dzeros(S);
  double *dqd = dzeros(B * S * Hq * D), *dkd = dzeros(B * S * Hkv * D);
  double *dvd = dzeros(B * S * Hkv * Dv);
  for (int64_t b = 0; b < B; b++)
    for (int64_t i = 0; i < S; i++)
      for (int64_t h = 0; h < Hq; h++) {
        int64_t kvh = h / (Hq / Hkv);
        const float *go = dout + ((b * S + i) * Hq + h) * Dv;
        const float *qr = q + ((b * S + i) * Hq + h) * D;
        attn_probs(q, k, b, i, h, S, Hq, Hkv, D, scale, p);
        double pdp = 0.0;
        for (int64_t j = 0; j <= i; j++) {
          const float *vr = v + ((b * S + j) * Hkv + kvh) * Dv;
          double s = 0.0;
          for (int64_t d = 0; d < Dv; d++) {
            s += (double)go[d] * vr[d];
            dvd[((b * S + j) * Hkv + kvh) * Dv + d] += p[j] * go[d];
          }
          dp[j] = s;
          pdp += p[j] * s;
        }
        for (int64_t j = 0; j <= i; j++) {
          double dz = p[j] * (dp[j] - pdp) * scale;
          const float *kr = k + ((b * S + j) * Hkv + kvh) * D;
          for (int64_t d = 0; d < D; d++) {
            dqd[((b * S + i) * Hq + h) * D + d] += dz * kr[d];
            dkd[((b * S + j) * Hkv + kvh) * D + d] += dz * qr[d];
          }
        }
      }
  for (int64_t i = 0; i < B * S * Hq * D; i++)
    dq[i] = (float)dqd[i];
  for (int64_t i = 0; i < B * S * Hkv * D; i++)
    dk[i] = (float)dkd[i];
  for (int64_t i = 0; i < B * S * Hkv * Dv; i++)
    dv[i] = (float)dvd[i];
  free(p);
  free(dp);
  free(dqd);
  free(dkd);
  free(dvd);
}

void xm_ref_embedding(const int32_t *tok, const float *table, float *y, int64_t n_tok, int64_t H) {
  for (int64_t i = 0; i < n_tok; i++)
    for (int64_t h = 0; h < H; h++)
      y[i * H + h] = table[(int64_t)tok[i] * H + h];
}

void xm_ref_embedding_grad(const float *dy, const int32_t *tok, float *dtable, int64_t n_tok,
                           int64_t V, int64_t H) {
  double *acc = dzeros(V * H);
  for (int64_t i = 0; i < n_tok; i++)
    for (int64_t h = 0; h < H; h++)
      acc[(int64_t)tok[i] * H + h] += dy[i * H + h];
  for (int64_t i = 0; i < V * H; i++)
    dtable[i] = (float)acc[i];
  free(acc);
}

/* log sum_v exp(row[v]), shifted by the max. */
static double log_sum_exp(const float *row, int64_t V) {
  double mx = row[0];
  for (int64_t v = 1; v < V; v++)
    if (row[v] > mx) mx = row[v];
  double s = 0.0;
  for (int64_t v = 0; v < V; v++)
    s += exp(row[v] - mx);
  return mx + log(s);
}

void xm_ref_cross_entropy(const float *logits, const int32_t *labels, float *loss, int64_t rows,
                          int64_t V) {
  double s = 0.0;
  for (int64_t r = 0; r < rows; r++)
    s += log_sum_exp(logits + r * V, V) - logits[r * V + labels[r]];
  *loss = (float)(s / (double)rows);
}

void xm_ref_cross_entropy_grad(const float *dloss, const float *logits, const int32_t *labels,
                               float *dlogits, int64_t rows, int64_t V) {
  for (int64_t r = 0; r < rows; r++) {
    double lse = log_sum_exp(logits + r * V, V);
    for (int64_t v = 0; v < V; v++) {
      double p = exp(logits[r * V + v] - lse) - (v == labels[r] ? 1.0 : 0.0);
      dlogits[r * V + v] = (float)(*dloss * p / (double)rows);
    }
  }
}

static void lm_logits(const float *x, const float *w, double *l, int64_t r, int64_t H,
                      int64_t V) {
  for (int64_t v = 0; v < V; v++) {
    double d = 0.0;
    for (int64_t h = 0; h < H; h++)
      d += (double)x[r * H + h] * (double)w[v * H + h];
    l[v] = d;
  }
}

void xm_ref_lm_head_ce(const float *x, const float *w, const int32_t *labels, float *loss,
                       float *stats, int64_t rows, int64_t H, int64_t V) {
  double *l = malloc(sizeof(double) * (size_t)(V > 0 ? V : 1)), total = 0.0;
  for (int64_t r = 0; r < rows; r++) {
    lm_logits(x, w, l, r, H, V);
    double mx = l[0], s = 0.0;
    for (int64_t v = 1; v < V; v++)
      mx = l[v] > mx ? l[v] : mx;
    for (int64_t v = 0; v < V; v++)
      s += exp(l[v] - mx);
    stats[2 * r] = (float)mx;
    stats[2 * r + 1] = (float)s;
    if (labels[r] >= 0 && labels[r] < V) total += mx + log(s) - l[labels[r]];
  }
  *loss = rows > 0 ? (float)(total / (double)rows) : 0.0f;
  free(l);
}

void xm_ref_lm_head_ce_grad(const float *dloss, const float *x, const float *w,
                            const int32_t *labels, const float *stats, float *dw, float *dx,
                            int64_t rows, int64_t H, int64_t V, float beta, int round_bf16) {
  double *l = malloc(sizeof(double) * (size_t)(V > 0 ? V : 1));
  float *g = calloc((size_t)(rows * V > 0 ? rows * V : 1), sizeof(float));
  double scale = rows > 0 ? (double)*dloss / (double)rows : 0.0;
  for (int64_t r = 0; r < rows; r++) {
    if (labels[r] < 0 || labels[r] >= V) continue;
    lm_logits(x, w, l, r, H, V);
    for (int64_t v = 0; v < V; v++) {
      double p = exp(l[v] - (double)stats[2 * r]) / (double)stats[2 * r + 1];
      float d = (float)(scale * (p - (v == labels[r] ? 1.0 : 0.0)));
      g[r * V + v] = round_bf16 ? xm_ref_bf16_widen(xm_ref_bf16(d)) : d;
    }
  }
  for (int64_t r = 0; r < rows; r++)
    for (int64_t h = 0; h < H; h++) {
      double d = 0.0;
      for (int64_t v = 0; v < V; v++)
        d += (double)g[r * V + v] * (double)w[v * H + h];
      dx[r * H + h] = (float)d;
    }
  for (int64_t v = 0; v < V; v++)
    for (int64_t h = 0; h < H; h++) {
      double d = beta == 0.0f ? 0.0 : (double)beta * (double)dw[v * H + h];
      for (int64_t r = 0; r < rows; r++)
        d += (double)g[r * V + v] * (double)x[r * H + h];
      dw[v * H + h] = (float)d;
    }
  free(g);
  free(l);
}

/* ---- router and padding-free MoE ------------------------------------------- */

void xm_ref_router_score(const float *logits, float *scores, int64_t T, int64_t E, int scoring) {
  for (int64_t t = 0; t < T; t++) {
    const float *l = logits + t * E;
    if (scoring == REF_SIGMOID) {
      for (int64_t e = 0; e < E; e++)
        scores[t * E + e] = (float)sigm(l[e]);
      continue;
    }
    double lse = log_sum_exp(l, E);
    for (int64_t e = 0; e < E; e++)
      scores[t * E + e] = (float)exp(l[e] - lse);
  }
}

/* softmax: dl = s (ds - sum ds s); sigmoid: dl = ds s (1 - s). */
void xm_ref_router_score_grad(const float *dscores, const float *scores, float *dlogits, int64_t T,
                              int64_t E, int scoring) {
  for (int64_t t = 0; t < T; t++) {
    const float *s = scores + t * E, *g = dscores + t * E;
    double dot = 0.0;
    for (int64_t e = 0; e < E; e++)
      dot += (double)g[e] * s[e];
    for (int64_t e = 0; e < E; e++)
      dlogits[t * E + e] = scoring == REF_SIGMOID ? (float)((double)g[e] * s[e] * (1.0 - s[e]))
                                                  : (float)(s[e] * ((double)g[e] - dot));
  }
}

/* docs/design.md, Model semantics: c = s + bias chooses; a group scores the
 * max of its c (softmax) or the sum of its two largest (sigmoid; a group of
 * one expert scores that one); the topk_group best groups stay, ties to the
 * lower group; the k largest unmasked c in descending order, ties to the
 * lower expert; w_j = r s[e_j], divided by the sum of the picked s when
 * norm_topk_prob. */
void xm_ref_topk_route(const float *scores, const float *bias, int32_t *experts, float *weights,
                       int64_t T, int64_t E, int64_t k, int64_t n_group, int64_t topk_group,
                       int norm_topk_prob, float routed_scaling, int scoring) {
  double *c = dzeros(E), *gscore = dzeros(n_group > 0 ? n_group : 1);
  char *masked = calloc((size_t)E + 1, 1), *gkeep = calloc((size_t)n_group + 1, 1);
  if (!masked || !gkeep) abort();
  for (int64_t t = 0; t < T; t++) {
    const float *s = scores + t * E;
    for (int64_t e = 0; e < E; e++) {
      c[e] = (float)(s[e] + bias[e]); /* c is an fp32 tensor: its ties are fp32 ties */
      masked[e] = 0;
    }
    if (n_group > 1 && topk_group < n_group) {
      int64_t G = E / n_group;
      for (int64_t g = 0; g < n_group; g++) {
        double best = -INFINITY, second = -INFINITY;
        for (int64_t e = g * G; e < (g + 1) * G; e++) {
          if (c[e] > best) {
            second = best;
            best = c[e];
          } else if (c[e] > second) {
            second = c[e];
          }
        }
        gscore[g] = scoring == REF_SIGMOID && G > 1 ? best + second : best;
        gkeep[g] = 0;
      }
      for (int64_t pick = 0; pick < topk_group; pick++) {
        int64_t arg = -1;
        for (int64_t g = 0; g < n_group; g++)
          if (!gkeep[g] && (arg < 0 || gscore[g] > gscore[arg])) arg = g;
        gkeep[arg] = 1;
      }
      for (int64_t e = 0; e < E; e++)
        masked[e] = !gkeep[e / G];
    }
    double sum = 0.0;
    for (int64_t j = 0; j < k; j++) {
      int64_t arg = -1;
      for (int64_t e = 0; e < E; e++)
        if (!masked[e] && (arg < 0 || c[e] > c[arg])) arg = e;
      masked[arg] = 1;
      experts[t * k + j] = (int32_t)arg;
      sum += s[arg];
    }
    for (int64_t j = 0; j < k; j++) {
      double w = (double)routed_scaling * s[experts[t * k + j]];
      weights[t * k + j] = (float)(norm_topk_prob ? w / sum : w);
    }
  }
  free(c);
  free(gscore);
  free(masked);
  free(gkeep);
}

/* Unnormalised: w_j = r s_j, ds_j = r dw_j. Normalised: w_j = r s_j / S,
 * S = sum of the picked s; ds_i = r/S (dw_i - sum_j dw_j s_j / S). Experts
 * not picked get 0 (the choice itself has no gradient). */
void xm_ref_topk_route_grad(const float *dweights, const float *scores, const int32_t *experts,
                            float *dscores, int64_t T, int64_t E, int64_t k, int norm_topk_prob,
                            float routed_scaling) {
  for (int64_t t = 0; t < T; t++) {
    const float *s = scores + t * E;
    const float *g = dweights + t * k;
    const int32_t *ex = experts + t * k;
    for (int64_t e = 0; e < E; e++)
      dscores[t * E + e] = 0.0f;
    double sum = 0.0, dot = 0.0;
    for (int64_t j = 0; j < k; j++) {
      sum += s[ex[j]];
      dot += (double)g[j] * s[ex[j]];
    }
    for (int64_t j = 0; j < k; j++) {
      double d = norm_topk_prob ? routed_scaling / sum * (g[j] - dot / sum)
                                : (double)routed_scaling * g[j];
      dscores[t * E + ex[j]] = (float)d;
    }
  }
}

/* A slot of expert e is kept when fewer than `capacity` other slots of e
 * beat it (higher weight, or equal weight and a lower slot index). Kept
 * slots are listed expert by expert, in slot order within an expert. */
int64_t xm_ref_permute(const int32_t *experts, const float *weights, int32_t *indices,
                       int32_t *bin_ids, int32_t *tpe, int64_t T, int64_t k, int64_t E,
                       int64_t capacity) {
  int64_t N = T * k, n = 0;
  for (int64_t e = 0; e < E; e++) {
    tpe[e] = 0;
    for (int64_t s = 0; s < N; s++) {
      if (experts[s] != e) continue;
      if (capacity > 0) {
        int64_t beaten = 0;
        for (int64_t o = 0; o < N; o++)
          if (o != s && experts[o] == e &&
              (weights[o] > weights[s] || (weights[o] == weights[s] && o < s)))
            beaten++;
        if (beaten >= capacity) continue;
      }
      indices[n] = (int32_t)s;
      bin_ids[n] = (int32_t)e;
      tpe[e]++;
      n++;
    }
  }
  return n;
}

void xm_ref_gather_rows(const float *x, const int32_t *indices, float *y, int64_t n, int64_t H,
                        int64_t k) {
  for (int64_t i = 0; i < n; i++)
    for (int64_t h = 0; h < H; h++)
      y[i * H + h] = x[(indices[i] / k) * H + h];
}

void xm_ref_gather_rows_grad(const float *dy, const int32_t *indices, float *dx, int64_t n,
                             int64_t T, int64_t H, int64_t k) {
  double *acc = dzeros(T * H);
  for (int64_t i = 0; i < n; i++)
    for (int64_t h = 0; h < H; h++)
      acc[(indices[i] / k) * H + h] += dy[i * H + h];
  for (int64_t i = 0; i < T * H; i++)
    dx[i] = (float)acc[i];
  free(acc);
}

void xm_ref_grouped_matmul(const float *x, const float *w, const int32_t *tpe, float *y, int64_t E,
                           int64_t K, int64_t M) {
  int64_t *off = run_offsets(tpe, E);
  for (int64_t e = 0; e < E; e++)
    for (int64_t i = off[e]; i < off[e + 1]; i++)
      for (int64_t m = 0; m < M; m++) {
        double s = 0.0;
        for (int64_t kk = 0; kk < K; kk++)
          s += (double)x[i * K + kk] * w[(e * M + m) * K + kk];
        y[i * M + m] = (float)s;
      }
  free(off);
}

void xm_ref_grouped_matmul_dx(const float *dy, const float *w, const int32_t *tpe, float *dx,
                              int64_t E, int64_t K, int64_t M) {
  int64_t *off = run_offsets(tpe, E);
  for (int64_t e = 0; e < E; e++)
    for (int64_t i = off[e]; i < off[e + 1]; i++)
      for (int64_t kk = 0; kk < K; kk++) {
        double s = 0.0;
        for (int64_t m = 0; m < M; m++)
          s += (double)dy[i * M + m] * w[(e * M + m) * K + kk];
        dx[i * K + kk] = (float)s;
      }
  free(off);
}

/* acc 0: dw[e] = the product (zeros for an expert without rows); acc 1:
 * dw[e] += it (an expert without rows keeps its dw). */
static void grouped_dw(const float *dy, const float *x, const int32_t *tpe, float *dw, int64_t E,
                       int64_t K, int64_t M, int acc) {
  int64_t *off = run_offsets(tpe, E);
  for (int64_t e = 0; e < E; e++)
    for (int64_t m = 0; m < M; m++)
      for (int64_t kk = 0; kk < K; kk++) {
        float *d = &dw[(e * M + m) * K + kk];
        double s = acc ? (double)*d : 0.0;
        for (int64_t i = off[e]; i < off[e + 1]; i++)
          s += (double)dy[i * M + m] * x[i * K + kk];
        *d = (float)s;
      }
  free(off);
}

void xm_ref_grouped_matmul_dw(const float *dy, const float *x, const int32_t *tpe, float *dw,
                              int64_t E, int64_t K, int64_t M) {
  grouped_dw(dy, x, tpe, dw, E, K, M, 0);
}

void xm_ref_grouped_matmul_dw_acc(const float *dy, const float *x, const int32_t *tpe, float *dw,
                                  int64_t E, int64_t K, int64_t M) {
  grouped_dw(dy, x, tpe, dw, E, K, M, 1);
}

void xm_ref_scatter_combine(const float *y, const int32_t *indices, const float *weights,
                            float *out, int64_t n, int64_t T, int64_t k, int64_t H) {
  double *acc = dzeros(T * H);
  for (int64_t i = 0; i < n; i++)
    for (int64_t h = 0; h < H; h++)
      acc[(indices[i] / k) * H + h] += (double)weights[indices[i]] * y[i * H + h];
  for (int64_t i = 0; i < T * H; i++)
    out[i] = (float)acc[i];
  free(acc);
}

void xm_ref_scatter_combine_grad(const float *dout, const float *y, const int32_t *indices,
                                 const float *weights, float *dy, float *dweights, int64_t n,
                                 int64_t T, int64_t k, int64_t H) {
  for (int64_t s = 0; s < T * k; s++)
    dweights[s] = 0.0f;
  for (int64_t i = 0; i < n; i++) {
    int64_t slot = indices[i], t = slot / k;
    double dot = 0.0;
    for (int64_t h = 0; h < H; h++) {
      dy[i * H + h] = (float)((double)weights[slot] * dout[t * H + h]);
      dot += (double)dout[t * H + h] * y[i * H + h];
    }
    dweights[slot] = (float)dot;
  }
}

/* Moves block (p, l) of counts[p*L + l] rows from its place in the `from`
 * order to its place in the `to` order (0: member-major (p, l), 1:
 * expert-major (l, p)). */
static int64_t block_offset(const int32_t *counts, int64_t P, int64_t L, int64_t p, int64_t l,
                            int expert_major) {
  int64_t off = 0;
  for (int64_t pp = 0; pp < P; pp++)
    for (int64_t ll = 0; ll < L; ll++) {
      int before = expert_major ? (ll < l || (ll == l && pp < p)) : (pp < p || (pp == p && ll < l));
      if (before) off += counts[pp * L + ll];
    }
  return off;
}

static void move_chunks(const float *x, const int32_t *counts, int64_t P, int64_t L, int64_t width,
                        float *y, int from_expert_major) {
  for (int64_t p = 0; p < P; p++)
    for (int64_t l = 0; l < L; l++) {
      int64_t src = block_offset(counts, P, L, p, l, from_expert_major);
      int64_t dst = block_offset(counts, P, L, p, l, !from_expert_major);
      for (int64_t r = 0; r < counts[p * L + l]; r++)
        for (int64_t c = 0; c < width; c++)
          y[(dst + r) * width + c] = x[(src + r) * width + c];
    }
}

void xm_ref_sort_chunks(const float *x, const int32_t *counts, int64_t P, int64_t L, int64_t width,
                        float *y) {
  move_chunks(x, counts, P, L, width, y, 0);
}

void xm_ref_unsort_chunks(const float *x, const int32_t *counts, int64_t P, int64_t L,
                          int64_t width, float *y) {
  move_chunks(x, counts, P, L, width, y, 1);
}

/* f_e = E/(k T) * (slots routed to e), P_e = mean_t s[t,e]. */
static double *aux_f(const int32_t *experts, int64_t T, int64_t E, int64_t k) {
  double *f = dzeros(E);
  for (int64_t s = 0; s < T * k; s++)
    f[experts[s]] += 1.0;
  for (int64_t e = 0; e < E; e++)
    f[e] *= (double)E / ((double)k * (double)T);
  return f;
}

void xm_ref_aux_loss(const float *scores, const int32_t *experts, float *loss, int64_t T, int64_t E,
                     int64_t k, float alpha) {
  double *f = aux_f(experts, T, E, k), l = 0.0;
  for (int64_t e = 0; e < E; e++) {
    double P = 0.0;
    for (int64_t t = 0; t < T; t++)
      P += scores[t * E + e];
    l += f[e] * P / (double)T;
  }
  *loss = (float)(alpha * l);
  free(f);
}

void xm_ref_aux_loss_grad(const float *dloss, const float *scores, const int32_t *experts,
                          float *dscores, int64_t T, int64_t E, int64_t k, float alpha) {
  (void)scores;
  double *f = aux_f(experts, T, E, k);
  for (int64_t t = 0; t < T; t++)
    for (int64_t e = 0; e < E; e++)
      dscores[t * E + e] = (float)((double)*dloss * alpha * f[e] / (double)T);
  free(f);
}

/* ---- fused gather / combine grouped GEMMs ----------------------------------- */

void xm_ref_gather_grouped_matmul(const float *x, const int32_t *indices, const int32_t *tpe,
                                  const float *w, float *y, int64_t E, int64_t K, int64_t M,
                                  int64_t k) {
  int64_t *off = run_offsets(tpe, E);
  for (int64_t e = 0; e < E; e++)
    for (int64_t i = off[e]; i < off[e + 1]; i++) {
      const float *xr = x + (indices[i] / k) * K;
      for (int64_t m = 0; m < M; m++) {
        double s = 0.0;
        for (int64_t kk = 0; kk < K; kk++)
          s += (double)xr[kk] * w[(e * M + m) * K + kk];
        y[i * M + m] = (float)s;
      }
    }
  free(off);
}

void xm_ref_grouped_matmul_combine(const float *h, const float *w, const int32_t *tpe,
                                   const int32_t *indices, const float *weights, float *out,
                                   int64_t E, int64_t K, int64_t M, int64_t T, int64_t k) {
  int64_t *off = run_offsets(tpe, E);
  double *acc = dzeros(T * M);
  for (int64_t e = 0; e < E; e++)
    for (int64_t i = off[e]; i < off[e + 1]; i++) {
      int64_t t = indices[i] / k;
      for (int64_t m = 0; m < M; m++) {
        double s = 0.0;
        for (int64_t kk = 0; kk < K; kk++)
          s += (double)h[i * K + kk] * w[(e * M + m) * K + kk];
        acc[t * M + m] += (double)weights[indices[i]] * s;
      }
    }
  for (int64_t i = 0; i < T * M; i++)
    out[i] = (float)acc[i];
  free(acc);
  free(off);
}

void xm_ref_gather_grouped_matmul_dx(const float *dy, const float *w, const int32_t *tpe,
                                     const int32_t *indices, float *dx, int64_t E, int64_t K,
                                     int64_t M, int64_t T, int64_t k) {
  int64_t *off = run_offsets(tpe, E);
  double *acc = dzeros(T * K);
  for (int64_t e = 0; e < E; e++)
    for (int64_t i = off[e]; i < off[e + 1]; i++) {
      int64_t t = indices[i] / k;
      for (int64_t kk = 0; kk < K; kk++) {
        double s = 0.0;
        for (int64_t m = 0; m < M; m++)
          s += (double)dy[i * M + m] * w[(e * M + m) * K + kk];
        acc[t * K + kk] += s;
      }
    }
  for (int64_t i = 0; i < T * K; i++)
    dx[i] = (float)acc[i];
  free(acc);
  free(off);
}

/* beta 0 overwrites (so a dirty dw of NaNs gives zeros, not 0 * NaN); 1 adds. */
void xm_ref_gather_grouped_matmul_dw(const float *dy, const float *x, const int32_t *indices,
                                     const int32_t *tpe, float *dw, int64_t E, int64_t K, int64_t M,
                                     int64_t k, float beta) {
  int64_t *off = run_offsets(tpe, E);
  for (int64_t e = 0; e < E; e++)
    for (int64_t m = 0; m < M; m++)
      for (int64_t kk = 0; kk < K; kk++) {
        float *d = &dw[(e * M + m) * K + kk];
        double s = beta != 0.0f ? (double)beta * *d : 0.0;
        for (int64_t i = off[e]; i < off[e + 1]; i++)
          s += (double)dy[i * M + m] * x[(indices[i] / k) * K + kk];
        *d = (float)s;
      }
  free(off);
}

void xm_ref_grouped_matmul_combine_grad(const float *dout, const float *h, const float *w,
                                        const int32_t *tpe, const int32_t *indices,
                                        const float *weights, float *dh, float *dweights, int64_t E,
                                        int64_t K, int64_t M, int64_t T, int64_t k) {
  int64_t *off = run_offsets(tpe, E);
  double *g = dzeros(K);
  for (int64_t s = 0; s < T * k; s++)
    dweights[s] = 0.0f;
  for (int64_t e = 0; e < E; e++)
    for (int64_t i = off[e]; i < off[e + 1]; i++) {
      int64_t slot = indices[i], t = slot / k;
      for (int64_t kk = 0; kk < K; kk++) {
        g[kk] = 0.0;
        for (int64_t m = 0; m < M; m++)
          g[kk] += (double)dout[t * M + m] * w[(e * M + m) * K + kk];
      }
      double dot = 0.0;
      for (int64_t kk = 0; kk < K; kk++) {
        dh[i * K + kk] = (float)(weights[slot] * g[kk]);
        dot += g[kk] * h[i * K + kk];
      }
      dweights[slot] = (float)dot;
    }
  free(g);
  free(off);
}

void xm_ref_grouped_matmul_combine_dw(const float *dout, const float *h, const int32_t *indices,
                                      const float *weights, const int32_t *tpe, float *dw,
                                      int64_t E, int64_t K, int64_t M, int64_t k, float beta) {
  int64_t *off = run_offsets(tpe, E);
  for (int64_t e = 0; e < E; e++)
    for (int64_t m = 0; m < M; m++)
      for (int64_t kk = 0; kk < K; kk++) {
        float *d = &dw[(e * M + m) * K + kk];
        double s = beta != 0.0f ? (double)beta * *d : 0.0;
        for (int64_t i = off[e]; i < off[e + 1]; i++)
          s += (double)weights[indices[i]] * dout[(indices[i] / k) * M + m] * h[i * K + kk];
        *d = (float)s;
      }
  free(off);
}

/* ---- bf16 mixed precision ----------------------------------------------------- */

/* Keep the upper 16 bits; round up when the dropped half is above half an
 * ulp, or exactly half and the kept part is odd. A carry out of the
 * mantissa moves to the next binade (or to infinity), which is right. */
xm_bf16_t xm_ref_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if (isnan(f)) return (xm_bf16_t)((u >> 16) | 0x0040u); /* quiet, sign kept */
  uint32_t kept = u >> 16, dropped = u & 0xffffu;
  if (dropped > 0x8000u || (dropped == 0x8000u && (kept & 1u))) kept++;
  return (xm_bf16_t)kept;
}

float xm_ref_bf16_widen(xm_bf16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

void xm_ref_cast_f32_bf16(const float *x, xm_bf16_t *y, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    y[i] = xm_ref_bf16(x[i]);
}

void xm_ref_cast_bf16_f32(const xm_bf16_t *x, float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    y[i] = xm_ref_bf16_widen(x[i]);
}

/* The bf16 GEMMs are the f32 references on widened operands (whose
 * products are exact), the output rounded to f32 and then to bf16 (y, dx),
 * as an f32-accumulating GEMM rounds it, or kept in f32 with beta (dw). */
static float *widen_all(const xm_bf16_t *x, int64_t n) {
  float *f = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  if (!f) abort();
  xm_ref_cast_bf16_f32(x, f, n);
  return f;
}

void xm_ref_matmul_bf16(const xm_bf16_t *x, const xm_bf16_t *w, xm_bf16_t *y, int64_t M, int64_t K,
                        int64_t N) {
  float *xf = widen_all(x, M * K), *wf = widen_all(w, N * K);
  float *yf = malloc(sizeof(float) * (size_t)(M * N > 0 ? M * N : 1));
  if (!yf) abort();
  xm_ref_matmul(xf, wf, yf, M, K, N);
  xm_ref_cast_f32_bf16(yf, y, M * N);
  free(xf);
  free(wf);
  free(yf);
}

void xm_ref_matmul_dx_bf16(const xm_bf16_t *dy, const xm_bf16_t *w, xm_bf16_t *dx, int64_t M,
                           int64_t K, int64_t N) {
  float *gf = widen_all(dy, M * N), *wf = widen_all(w, N * K);
  float *df = malloc(sizeof(float) * (size_t)(M * K > 0 ? M * K : 1));
  if (!df) abort();
  xm_ref_matmul_dx(gf, wf, df, M, K, N);
  xm_ref_cast_f32_bf16(df, dx, M * K);
  free(gf);
  free(wf);
  free(df);
}

void xm_ref_matmul_dw_bf16(const xm_bf16_t *dy, const xm_bf16_t *x, float *dw, int64_t M, int64_t K,
                           int64_t N, float beta) {
  float *gf = widen_all(dy, M * N), *xf = widen_all(x, M * K);
  matmul_dw(gf, xf, dw, M, K, N, beta != 0.0f);
  free(gf);
  free(xf);
}

static int64_t tpe_sum(const int32_t *tpe, int64_t E) {
  int64_t n = 0;
  for (int64_t e = 0; e < E; e++)
    n += tpe[e];
  return n;
}

void xm_ref_grouped_matmul_bf16(const xm_bf16_t *x, const xm_bf16_t *w, const int32_t *tpe,
                                xm_bf16_t *y, int64_t E, int64_t K, int64_t M) {
  int64_t n = tpe_sum(tpe, E);
  float *xf = widen_all(x, n * K), *wf = widen_all(w, E * M * K);
  float *yf = malloc(sizeof(float) * (size_t)(n * M > 0 ? n * M : 1));
  if (!yf) abort();
  xm_ref_grouped_matmul(xf, wf, tpe, yf, E, K, M);
  xm_ref_cast_f32_bf16(yf, y, n * M);
  free(xf);
  free(wf);
  free(yf);
}

void xm_ref_grouped_matmul_dx_bf16(const xm_bf16_t *dy, const xm_bf16_t *w, const int32_t *tpe,
                                   xm_bf16_t *dx, int64_t E, int64_t K, int64_t M) {
  int64_t n = tpe_sum(tpe, E);
  float *gf = widen_all(dy, n * M), *wf = widen_all(w, E * M * K);
  float *df = malloc(sizeof(float) * (size_t)(n * K > 0 ? n * K : 1));
  if (!df) abort();
  xm_ref_grouped_matmul_dx(gf, wf, tpe, df, E, K, M);
  xm_ref_cast_f32_bf16(df, dx, n * K);
  free(gf);
  free(wf);
  free(df);
}

void xm_ref_grouped_matmul_dw_bf16(const xm_bf16_t *dy, const xm_bf16_t *x, const int32_t *tpe,
                                   float *dw, int64_t E, int64_t K, int64_t M, float beta) {
  int64_t n = tpe_sum(tpe, E);
  float *gf = widen_all(dy, n * M), *xf = widen_all(x, n * K);
  grouped_dw(gf, xf, tpe, dw, E, K, M, beta != 0.0f);
  free(gf);
  free(xf);
}

/* ---- training state and the optimizer --------------------------------------- */

void xm_ref_accumulate(float *acc, const float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    acc[i] = (float)((double)acc[i] + x[i]);
}

void xm_ref_accumulate_i32(int32_t *acc, const int32_t *x, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    acc[i] = (int32_t)((int64_t)acc[i] + x[i]);
}

double xm_ref_sum_sq(const float *x, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; i++)
    s += (double)x[i] * x[i];
  return s;
}

void xm_ref_adamw(float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int64_t step, float grad_scale) {
  double bc1 = 1.0 - pow(beta1, (double)step), bc2 = 1.0 - pow(beta2, (double)step);
  for (int64_t i = 0; i < n; i++) {
    double gs = (double)g[i] * grad_scale;
    double mi = beta1 * (double)m[i] + (1.0 - beta1) * gs;
    double vi = beta2 * (double)v[i] + (1.0 - beta2) * gs * gs;
    double pi = p[i];
    pi -= (double)lr * weight_decay * pi;
    pi -= lr * (mi / bc1) / (sqrt(vi / bc2) + eps);
    m[i] = (float)mi;
    v[i] = (float)vi;
    p[i] = (float)pi;
  }
}

/* sign(0) = 0 (docs/design.md, Aux-free balancing). */
void xm_ref_aux_free_update(float *bias, const int32_t *load, int64_t E, float gamma) {
  double mean = 0.0;
  for (int64_t e = 0; e < E; e++)
    mean += load[e];
  mean /= (double)E;
  for (int64_t e = 0; e < E; e++) {
    double d = mean - load[e];
    double sg = d > 0.0 ? 1.0 : d < 0.0 ? -1.0 : 0.0;
    bias[e] = (float)((double)bias[e] + gamma * sg);
  }
}
