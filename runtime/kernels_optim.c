/* runtime/kernels_optim.c — training state and the optimizer (fp32).
 *
 * Gradient accumulation over micro-batches, the global gradient norm, PyTorch
 * AdamW, the aux-loss-free bias update of DeepSeek-V3 and the clip
 * coefficient of clip_grad_norm_. AdamW follows torch.optim.AdamW's
 * single-tensor path operation for operation (decoupled decay first, then
 * lerp of the first moment, bias corrections computed in double from the
 * 1-based step, eps added to sqrt(v)/sqrt(1-b2^t)), so a run can be checked
 * against a PyTorch one. Sums of squares are taken in double: the global norm
 * adds up every gradient element of the model.
 */
#include <math.h>

#include "runtime/kernels.h"
#include "runtime/program.h"

#define XM_K_PAR_MIN 32768

void xm_k_accumulate(float *acc, const float *x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > XM_K_PAR_MIN)
  for (int64_t i = 0; i < n; i++)
    acc[i] += x[i];
}

void xm_k_accumulate_i32(int32_t *acc, const int32_t *x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > XM_K_PAR_MIN)
  for (int64_t i = 0; i < n; i++)
    acc[i] += x[i];
}

double xm_k_sum_sq(const float *x, int64_t n) {
  double s = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : s) if (n > XM_K_PAR_MIN)
  for (int64_t i = 0; i < n; i++)
    s += (double)x[i] * (double)x[i];
  return s;
}

void xm_k_adamw(float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1,
                float beta2, float eps, float weight_decay, int64_t step, float grad_scale) {
  double t = (double)(step > 0 ? step : 1);
  float bc2_sqrt = (float)sqrt(1.0 - pow((double)beta2, t));
  float step_size = (float)((double)lr / (1.0 - pow((double)beta1, t)));
  float decay = 1.0f - lr * weight_decay;
  float one_m_b1 = 1.0f - beta1, one_m_b2 = 1.0f - beta2;
#pragma omp parallel for schedule(static) if (n > XM_K_PAR_MIN)
  for (int64_t i = 0; i < n; i++) {
    float gi = g[i] * grad_scale;
    float pi = p[i] * decay;
    float mi = m[i] + one_m_b1 * (gi - m[i]);
    float vi = v[i] * beta2 + one_m_b2 * gi * gi;
    float denom = sqrtf(vi) / bc2_sqrt + eps;
    p[i] = pi - step_size * (mi / denom);
    m[i] = mi;
    v[i] = vi;
  }
}

void xm_k_aux_free_update(float *bias, const int32_t *load, int64_t E, float gamma) {
  if (E <= 0) return;
  double mean = 0.0;
  for (int64_t e = 0; e < E; e++)
    mean += load[e];
  mean /= (double)E;
  for (int64_t e = 0; e < E; e++) {
    double d = mean - (double)load[e];
    float sign = d > 0.0 ? 1.0f : (d < 0.0 ? -1.0f : 0.0f);
    bias[e] += gamma * sign;
  }
}

float xm_rt_clip_coef(float norm_sq, float clip) {
  if (!(clip > 0.0f)) return 1.0f;
  double coef = (double)clip / (sqrt((double)norm_sq) + 1e-6);
  return coef < 1.0 ? (float)coef : 1.0f;
}
