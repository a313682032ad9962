/* tests/backend/reference.h — a naive reference of every kernel of
 * runtime/abi/kernels.def, for the backend conformance suite.
 *
 * Written from the documented meaning of each kernel (runtime/cpu/kernels.h,
 * docs/design.md, Model semantics and Padding-free token permutation), not
 * from the CPU kernels: plain loops in the obvious order, every sum and every
 * transcendental in double, one rounding to float at the end. It is meant to
 * be obviously right rather than fast; the suite only runs it on small
 * shapes. Each xm_ref_<name> takes host pointers and the arguments of the
 * kernel of the same name, in the same order. The fused kernels take no
 * scratch, tile_rows or slots: how a backend tiles its work must not change
 * what it computes.
 */
#ifndef XM_TESTS_BACKEND_REFERENCE_H
#define XM_TESTS_BACKEND_REFERENCE_H

#include <stdint.h>

#include "runtime/abi/kernels.h" /* xm_bf16_t */

/* ---- dense ---- */
void xm_ref_matmul(const float *x, const float *w, float *y, int64_t M, int64_t K, int64_t N);
void xm_ref_matmul_dx(const float *dy, const float *w, float *dx, int64_t M, int64_t K, int64_t N);
void xm_ref_matmul_dw(const float *dy, const float *x, float *dw, int64_t M, int64_t K, int64_t N);
void xm_ref_matmul_dw_acc(const float *dy, const float *x, float *dw, int64_t M, int64_t K,
                          int64_t N);
void xm_ref_add(const float *a, const float *b, float *y, int64_t na, int64_t nb);
void xm_ref_mul(const float *a, const float *b, float *y, int64_t na, int64_t nb);
void xm_ref_mul_rows(const float *a, const float *b, float *y, int64_t rows, int64_t H);
void xm_ref_scale(const float *x, float *y, int64_t n, float factor);
void xm_ref_reduce_to(const float *x, float *y, int64_t nx, int64_t ny);
void xm_ref_reduce_rows(const float *x, float *y, int64_t rows, int64_t H);
void xm_ref_fill(float *y, int64_t n, float value);
void xm_ref_copy(const float *x, float *y, int64_t n);
void xm_ref_silu(const float *x, float *y, int64_t n);
void xm_ref_silu_grad(const float *dy, const float *x, float *dx, int64_t n);
void xm_ref_gelu(const float *x, float *y, int64_t n);
void xm_ref_gelu_grad(const float *dy, const float *x, float *dx, int64_t n);
void xm_ref_sigmoid(const float *x, float *y, int64_t n);
void xm_ref_sigmoid_grad(const float *dy, const float *y, float *dx, int64_t n);
void xm_ref_swiglu(const float *g, const float *u, float *y, int64_t n);
void xm_ref_swiglu_grad(const float *dy, const float *g, const float *u, float *dg, float *du,
                        int64_t n);
void xm_ref_rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t H, float eps);
void xm_ref_rmsnorm_grad(const float *dy, const float *x, const float *w, float *dx, float *dw,
                         int64_t rows, int64_t H, float eps);
void xm_ref_rope(const float *x, float *y, int64_t B, int64_t S, int64_t nh, int64_t D, int64_t off,
                 int64_t rd, float theta, float factor, float ramp_lo, float ramp_hi, float mscale,
                 int interleave);
void xm_ref_rope_grad(const float *dy, float *dx, int64_t B, int64_t S, int64_t nh, int64_t D,
                      int64_t off, int64_t rd, float theta, float factor, float ramp_lo,
                      float ramp_hi, float mscale, int interleave);
void xm_ref_concat(const float *a, const float *b, float *y, int64_t R, int64_t H, int64_t Hb,
                   int64_t Da, int64_t Db);
void xm_ref_split(const float *x, float *a, float *b, int64_t R, int64_t H, int64_t Hb, int64_t Da,
                  int64_t Db);
void xm_ref_attention(const float *q, const float *k, const float *v, float *out, int64_t B,
                      int64_t S, int64_t Hq, int64_t Hkv, int64_t D, int64_t Dv, float scale);
void xm_ref_attention_grad(const float *dout, const float *q, const float *k, const float *v,
                           float *dq, float *dk, float *dv, int64_t B, int64_t S, int64_t Hq,
                           int64_t Hkv, int64_t D, int64_t Dv, float scale);
void xm_ref_embedding(const int32_t *tok, const float *table, float *y, int64_t n_tok, int64_t H);
void xm_ref_embedding_grad(const float *dy, const int32_t *tok, float *dtable, int64_t n_tok,
                           int64_t V, int64_t H);
void xm_ref_cross_entropy(const float *logits, const int32_t *labels, float *loss, int64_t rows,
                          int64_t V);
void xm_ref_cross_entropy_grad(const float *dloss, const float *logits, const int32_t *labels,
                               float *dlogits, int64_t rows, int64_t V);
/* The fused LM head + cross-entropy on f32 x[rows,H], w[V,H] (bf16 inputs
 * widened by the caller): logits in double; stats[r] = {max, sum of
 * exp(l - max)}; labels outside [0, V) count as zero loss. The gradient
 * takes the stats given (as the kernel does), rounds each logit gradient
 * to bf16 when round_bf16, and sets dx = dlogits w, dw = beta dw +
 * dlogits^T x. */
void xm_ref_lm_head_ce(const float *x, const float *w, const int32_t *labels, float *loss,
                       float *stats, int64_t rows, int64_t H, int64_t V);
void xm_ref_lm_head_ce_grad(const float *dloss, const float *x, const float *w,
                            const int32_t *labels, const float *stats, float *dw, float *dx,
                            int64_t rows, int64_t H, int64_t V, float beta, int round_bf16);

/* ---- router and padding-free MoE ---- */
void xm_ref_router_score(const float *logits, float *scores, int64_t T, int64_t E, int scoring);
void xm_ref_router_score_grad(const float *dscores, const float *scores, float *dlogits, int64_t T,
                              int64_t E, int scoring);
void xm_ref_topk_route(const float *scores, const float *bias, int32_t *experts, float *weights,
                       int64_t T, int64_t E, int64_t k, int64_t n_group, int64_t topk_group,
                       int norm_topk_prob, float routed_scaling, int scoring);
void xm_ref_topk_route_grad(const float *dweights, const float *scores, const int32_t *experts,
                            float *dscores, int64_t T, int64_t E, int64_t k, int norm_topk_prob,
                            float routed_scaling);
int64_t xm_ref_permute(const int32_t *experts, const float *weights, int32_t *indices,
                       int32_t *bin_ids, int32_t *tpe, int64_t T, int64_t k, int64_t E,
                       int64_t capacity);
void xm_ref_gather_rows(const float *x, const int32_t *indices, float *y, int64_t n, int64_t H,
                        int64_t k);
void xm_ref_gather_rows_grad(const float *dy, const int32_t *indices, float *dx, int64_t n,
                             int64_t T, int64_t H, int64_t k);
void xm_ref_grouped_matmul(const float *x, const float *w, const int32_t *tpe, float *y, int64_t E,
                           int64_t K, int64_t M);
void xm_ref_grouped_matmul_dx(const float *dy, const float *w, const int32_t *tpe, float *dx,
                              int64_t E, int64_t K, int64_t M);
void xm_ref_grouped_matmul_dw(const float *dy, const float *x, const int32_t *tpe, float *dw,
                              int64_t E, int64_t K, int64_t M);
void xm_ref_grouped_matmul_dw_acc(const float *dy, const float *x, const int32_t *tpe, float *dw,
                                  int64_t E, int64_t K, int64_t M);
void xm_ref_scatter_combine(const float *y, const int32_t *indices, const float *weights,
                            float *out, int64_t n, int64_t T, int64_t k, int64_t H);
void xm_ref_scatter_combine_grad(const float *dout, const float *y, const int32_t *indices,
                                 const float *weights, float *dy, float *dweights, int64_t n,
                                 int64_t T, int64_t k, int64_t H);
void xm_ref_sort_chunks(const float *x, const int32_t *counts, int64_t P, int64_t L, int64_t width,
                        float *y);
void xm_ref_unsort_chunks(const float *x, const int32_t *counts, int64_t P, int64_t L,
                          int64_t width, float *y);
void xm_ref_aux_loss(const float *scores, const int32_t *experts, float *loss, int64_t T, int64_t E,
                     int64_t k, float alpha);
void xm_ref_aux_loss_grad(const float *dloss, const float *scores, const int32_t *experts,
                          float *dscores, int64_t T, int64_t E, int64_t k, float alpha);

/* ---- fused gather / combine grouped GEMMs (no scratch: see above) ---- */
void xm_ref_gather_grouped_matmul(const float *x, const int32_t *indices, const int32_t *tpe,
                                  const float *w, float *y, int64_t E, int64_t K, int64_t M,
                                  int64_t k);
void xm_ref_grouped_matmul_combine(const float *h, const float *w, const int32_t *tpe,
                                   const int32_t *indices, const float *weights, float *out,
                                   int64_t E, int64_t K, int64_t M, int64_t T, int64_t k);
void xm_ref_gather_grouped_matmul_dx(const float *dy, const float *w, const int32_t *tpe,
                                     const int32_t *indices, float *dx, int64_t E, int64_t K,
                                     int64_t M, int64_t T, int64_t k);
void xm_ref_gather_grouped_matmul_dw(const float *dy, const float *x, const int32_t *indices,
                                     const int32_t *tpe, float *dw, int64_t E, int64_t K, int64_t M,
                                     int64_t k, float beta);
void xm_ref_grouped_matmul_combine_grad(const float *dout, const float *h, const float *w,
                                        const int32_t *tpe, const int32_t *indices,
                                        const float *weights, float *dh, float *dweights, int64_t E,
                                        int64_t K, int64_t M, int64_t T, int64_t k);
void xm_ref_grouped_matmul_combine_dw(const float *dout, const float *h, const int32_t *indices,
                                      const float *weights, const int32_t *tpe, float *dw,
                                      int64_t E, int64_t K, int64_t M, int64_t k, float beta);

/* ---- bf16 mixed precision (no workspace: see above) ----
 * bf16 words widen exactly to f32; f32 -> bf16 rounds to nearest, ties to
 * even, and a NaN stays a quiet NaN. The GEMMs multiply the widened
 * operands exactly and sum in double; bf16 outputs are that sum rounded to
 * f32 and then to bf16, f32 dw outputs are beta * dw + the sum (beta 0
 * overwrites) as in the fused kernels. */
xm_bf16_t xm_ref_bf16(float f);
float xm_ref_bf16_widen(xm_bf16_t h);
void xm_ref_cast_f32_bf16(const float *x, xm_bf16_t *y, int64_t n);
void xm_ref_cast_bf16_f32(const xm_bf16_t *x, float *y, int64_t n);
void xm_ref_matmul_bf16(const xm_bf16_t *x, const xm_bf16_t *w, xm_bf16_t *y, int64_t M, int64_t K,
                        int64_t N);
void xm_ref_matmul_dx_bf16(const xm_bf16_t *dy, const xm_bf16_t *w, xm_bf16_t *dx, int64_t M,
                           int64_t K, int64_t N);
void xm_ref_matmul_dw_bf16(const xm_bf16_t *dy, const xm_bf16_t *x, float *dw, int64_t M, int64_t K,
                           int64_t N, float beta);
void xm_ref_grouped_matmul_bf16(const xm_bf16_t *x, const xm_bf16_t *w, const int32_t *tpe,
                                xm_bf16_t *y, int64_t E, int64_t K, int64_t M);
void xm_ref_grouped_matmul_dx_bf16(const xm_bf16_t *dy, const xm_bf16_t *w, const int32_t *tpe,
                                   xm_bf16_t *dx, int64_t E, int64_t K, int64_t M);
void xm_ref_grouped_matmul_dw_bf16(const xm_bf16_t *dy, const xm_bf16_t *x, const int32_t *tpe,
                                   float *dw, int64_t E, int64_t K, int64_t M, float beta);

/* ---- training state and the optimizer ---- */
void xm_ref_accumulate(float *acc, const float *x, int64_t n);
void xm_ref_accumulate_i32(int32_t *acc, const int32_t *x, int64_t n);
double xm_ref_sum_sq(const float *x, int64_t n);
void xm_ref_adamw(float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int64_t step, float grad_scale);
void xm_ref_aux_free_update(float *bias, const int32_t *load, int64_t E, float gamma);

#endif /* XM_TESTS_BACKEND_REFERENCE_H */
