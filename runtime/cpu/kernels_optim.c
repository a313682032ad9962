/* runtime/cpu/kernels_optim.c — training state and the optimizer (fp32).
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
#include <string.h>

#include "runtime/cpu/kernels.h"
#include "runtime/abi/program.h"

/* `omp simd` asks for vectorisation; where the compiler cannot give it
 * (Clang with sanitizers), the scalar loop is just as right, so that is
 * not an error. */
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

/* Below this many elements a kernel stays on the calling thread. */
#define XM_K_PAR_MIN 65536
/* Elements per chunk handed to a thread. */
#define XM_K_CHUNK 8192

/* The loops are marked `simd`: at -O2 GCC vectorises only such loops, and
 * vector sums in double (sum_sq) are still exact to rounding of the few
 * partial sums. AdamW is written on 4-float vectors because its sqrt would
 * otherwise stay scalar (sqrtf may set errno, so the compiler keeps a call
 * per element); every lane does exactly the scalar operations, so results
 * are bitwise those of the scalar loop. */
typedef float v4f __attribute__((vector_size(16)));

void xm_k_accumulate(float *acc, const float *x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : n > XM_K_PAR_MIN)
  for (int64_t i = 0; i < n; i++)
    acc[i] += x[i];
}

void xm_k_accumulate_i32(int32_t *acc, const int32_t *x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : n > XM_K_PAR_MIN)
  for (int64_t i = 0; i < n; i++)
    acc[i] += x[i];
}

double xm_k_sum_sq(const float *x, int64_t n) {
  double s = 0.0;
#pragma omp parallel for simd schedule(static) reduction(+ : s) if (parallel : n > XM_K_PAR_MIN)
  for (int64_t i = 0; i < n; i++)
    s += (double)x[i] * (double)x[i];
  return s;
}

void xm_k_sum_sq_acc(const float *x, int64_t n, double *acc, float *out) {
  *acc += xm_k_sum_sq(x, n);
  *out = (float)*acc;
}

typedef struct {
  float beta2, eps, bc2_sqrt, step_size, decay, one_m_b1, one_m_b2, grad_scale;
} adamw_t;

static inline float adamw_sqrt(float x) { return sqrtf(x); }

/* sqrt of four lanes: SSE's sqrtps where there is one, else lane by lane. */
static inline v4f sqrt4(v4f x) {
#if defined(__SSE__)
  return __builtin_ia32_sqrtps(x);
#else
  v4f r = {adamw_sqrt(x[0]), adamw_sqrt(x[1]), adamw_sqrt(x[2]), adamw_sqrt(x[3])};
  return r;
#endif
}

/* Elements [i0, i1) of one tensor; i1 - i0 a multiple of 4 except at the end. */
static void adamw_span(float *p, const float *g, float *m, float *v, int64_t i0, int64_t i1,
                       const adamw_t *c) {
  int64_t i = i0;
  for (; i + 4 <= i1; i += 4) {
    v4f gi, pi, mi, vi;
    memcpy(&gi, g + i, sizeof gi);
    memcpy(&pi, p + i, sizeof pi);
    memcpy(&mi, m + i, sizeof mi);
    memcpy(&vi, v + i, sizeof vi);
    gi = gi * c->grad_scale;
    pi = pi * c->decay;
    mi = mi + c->one_m_b1 * (gi - mi);
    vi = vi * c->beta2 + c->one_m_b2 * gi * gi;
    v4f denom = sqrt4(vi) / c->bc2_sqrt + c->eps;
    pi = pi - c->step_size * (mi / denom);
    memcpy(p + i, &pi, sizeof pi);
    memcpy(m + i, &mi, sizeof mi);
    memcpy(v + i, &vi, sizeof vi);
  }
  for (; i < i1; i++) {
    float gi = g[i] * c->grad_scale;
    float pi = p[i] * c->decay;
    float mi = m[i] + c->one_m_b1 * (gi - m[i]);
    float vi = v[i] * c->beta2 + c->one_m_b2 * gi * gi;
    float denom = adamw_sqrt(vi) / c->bc2_sqrt + c->eps;
    p[i] = pi - c->step_size * (mi / denom);
    m[i] = mi;
    v[i] = vi;
  }
}

void xm_k_adamw(float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1,
                float beta2, float eps, float weight_decay, int64_t step, float grad_scale) {
  double t = (double)(step > 0 ? step : 1);
  adamw_t c = {.beta2 = beta2,
               .eps = eps,
               .bc2_sqrt = (float)sqrt(1.0 - pow((double)beta2, t)),
               .step_size = (float)((double)lr / (1.0 - pow((double)beta1, t))),
               .decay = 1.0f - lr * weight_decay,
               .one_m_b1 = 1.0f - beta1,
               .one_m_b2 = 1.0f - beta2,
               .grad_scale = grad_scale};
  int64_t chunks = (n + XM_K_CHUNK - 1) / XM_K_CHUNK;
#pragma omp parallel for schedule(static) if (n > XM_K_PAR_MIN)
  for (int64_t k = 0; k < chunks; k++) {
    int64_t i0 = k * XM_K_CHUNK, i1 = i0 + XM_K_CHUNK < n ? i0 + XM_K_CHUNK : n;
    adamw_span(p, g, m, v, i0, i1, &c);
  }
}

/* One fork of the thread team for every tensor: each thread walks the same
 * list and takes its static share of each tensor's chunks (no barrier
 * between tensors), so the per-element arithmetic, and the result, are
 * those of xm_k_adamw on each tensor alone. */
void xm_k_adamw_multi(const xm_rt_adamw_tensor_t *tensors, int64_t count, float lr, float beta1,
                      float beta2, float eps, float weight_decay, int64_t step, float grad_scale) {
  double t = (double)(step > 0 ? step : 1);
  const adamw_t base = {.beta2 = beta2,
                        .eps = eps,
                        .bc2_sqrt = (float)sqrt(1.0 - pow((double)beta2, t)),
                        .step_size = (float)((double)lr / (1.0 - pow((double)beta1, t))),
                        .decay = 1.0f,
                        .one_m_b1 = 1.0f - beta1,
                        .one_m_b2 = 1.0f - beta2,
                        .grad_scale = grad_scale};
  const float decay = 1.0f - lr * weight_decay;
  int64_t total = 0;
  for (int64_t i = 0; i < count; i++)
    total += tensors[i].n > 0 ? tensors[i].n : 0;
#pragma omp parallel if (total > XM_K_PAR_MIN)
  for (int64_t i = 0; i < count; i++) {
    const xm_rt_adamw_tensor_t *d = &tensors[i];
    if (d->n <= 0) continue;
    adamw_t c = base;
    if (d->decay) c.decay = decay;
    int64_t chunks = (d->n + XM_K_CHUNK - 1) / XM_K_CHUNK;
#pragma omp for schedule(static) nowait
    for (int64_t k = 0; k < chunks; k++) {
      int64_t i0 = k * XM_K_CHUNK, i1 = i0 + XM_K_CHUNK < d->n ? i0 + XM_K_CHUNK : d->n;
      adamw_span(d->p, d->g, d->m, d->v, i0, i1, &c);
    }
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
