/* runtime/cpu/kernels.h — the CPU kernels of libxmrt (fp32 math).
 *
 * One function per IR op (ir/ops.def), forward and backward. The generated
 * schedule calls them with pointers into the arenas and explicit sizes; the
 * kernels own no memory and keep no state. Layouts are row-major; weights
 * are [out, in] as in Hugging Face checkpoints. A kernel fully overwrites
 * its outputs (gradients are never accumulated into by a kernel, except
 * xm_k_accumulate and the *_dw_acc weight gradients, which add into the
 * grad state directly), so the memory planner may hand them dirty buffers.
 *
 * Scratch: a kernel that needs some takes it as its last argument `ws`,
 * sized by its formula in runtime/abi/workspace.h (bytes, from the
 * kernel's own size arguments; the compiler's kernel-workspace pass puts
 * it in the memory plan), 8-byte aligned and possibly dirty. Kernels never
 * allocate; a formula that gives 0 (empty shapes) means ws is not touched.
 *
 * Routed sizes: `n` is the number of token slots actually present in the
 * expert-sorted buffers (the value returned by xm_k_permute; T*k when
 * dropless); buffers are allocated for the bound, only the first n rows are
 * read or written. tokens_per_expert (tpe) gives each expert's row count in
 * expert order; sum(tpe) == n.
 *
 * GEMMs go through CBLAS. Elementwise and routing kernels use OpenMP where
 * the work is large enough to pay for it.
 */
#ifndef XM_RUNTIME_KERNELS_H
#define XM_RUNTIME_KERNELS_H

#include <stdint.h>

#include "runtime/abi/kernels.h"   /* xm_bf16_t */
#include "runtime/abi/workspace.h" /* the ws formulas */

/* Scoring functions: XM_K_SOFTMAX, XM_K_SIGMOID (runtime/abi/kernels.h). */

/* ---- dense ------------------------------------------------------------- */

/* y[M,N] = x[M,K] w[N,K]^T */
void xm_k_matmul(const float *x, const float *w, float *y, int64_t M, int64_t K, int64_t N);
/* dx[M,K] = dy[M,N] w[N,K] */
void xm_k_matmul_dx(const float *dy, const float *w, float *dx, int64_t M, int64_t K, int64_t N);
/* dw[N,K] = dy[M,N]^T x[M,K] */
void xm_k_matmul_dw(const float *dy, const float *x, float *dw, int64_t M, int64_t K, int64_t N);
/* dw[N,K] += dy[M,N]^T x[M,K]: matmul_dw followed by xm_k_accumulate in one
 * GEMM (beta = 1), for the generated code when dw's only use is that add. */
void xm_k_matmul_dw_acc(const float *dy, const float *x, float *dw, int64_t M, int64_t K,
                        int64_t N);

/* y[i] = a[i] + b[i % nb] (nb divides na); mul likewise. */
void xm_k_add(const float *a, const float *b, float *y, int64_t na, int64_t nb);
void xm_k_mul(const float *a, const float *b, float *y, int64_t na, int64_t nb);
/* y[r*H + h] = a[r*H + h] * b[r]: one factor per row (mul's per-row
 * broadcast, the shared-expert gate). */
void xm_k_mul_rows(const float *a, const float *b, float *y, int64_t rows, int64_t H);
void xm_k_scale(const float *x, float *y, int64_t n, float factor);
/* y[j] = sum_i x[i*ny + j], j < ny (nx divisible by ny). */
void xm_k_reduce_to(const float *x, float *y, int64_t nx, int64_t ny);
/* y[r] = sum_h x[r*H + h], in double (reduce_to's per-row form: the
 * gradient of mul_rows' factor). */
void xm_k_reduce_rows(const float *x, float *y, int64_t rows, int64_t H);
void xm_k_fill(float *y, int64_t n, float value);
void xm_k_copy(const float *x, float *y, int64_t n);

void xm_k_silu(const float *x, float *y, int64_t n);
void xm_k_silu_grad(const float *dy, const float *x, float *dx, int64_t n);
/* GeLU, tanh approximation. */
void xm_k_gelu(const float *x, float *y, int64_t n);
void xm_k_gelu_grad(const float *dy, const float *x, float *dx, int64_t n);
void xm_k_sigmoid(const float *x, float *y, int64_t n);
/* dx = dy * y * (1 - y), y the sigmoid output. */
void xm_k_sigmoid_grad(const float *dy, const float *y, float *dx, int64_t n);
/* y = silu(g) * u */
void xm_k_swiglu(const float *g, const float *u, float *y, int64_t n);
void xm_k_swiglu_grad(const float *dy, const float *g, const float *u, float *dg, float *du,
                      int64_t n);

/* y[r,:] = x[r,:] * rsqrt(mean(x[r,:]^2) + eps) * w, rows r < rows. */
void xm_k_rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t H, float eps);
/* dw is overwritten with the sum over rows. ws: xm_ws_rmsnorm_grad(rows,
 * H) bytes (one float per row), rows the bound of a routed buffer. */
void xm_k_rmsnorm_grad(const float *dy, const float *x, const float *w, float *dx, float *dw,
                       int64_t rows, int64_t H, float eps, float *ws);

/* HF RoPE (rotate_half) of x[B,S,nh,D] at positions 0..S-1, applied to
 * the rd elements [off, off+rd) of every row; the others are copied (MLA
 * rotates only the last qk_rope_head_dim of a query head). With half =
 * rd/2, frequency i < half is inv[i] = theta^(-2i/rd); when factor != 1
 * it is YaRN's blend inv[i]/factor * r + inv[i] * (1 - r), r = clamp((i -
 * ramp_lo) / (ramp_hi - ramp_lo), 0, 1) (ramp_hi += 0.001 when equal),
 * HF's _compute_yarn_parameters with the correction range precomputed.
 * The angle p * inv[i] is taken in double; cos and sin are multiplied by
 * mscale (YaRN's attention factor; 1 otherwise). The pair rotated by
 * frequency i is (x[off+i], x[off+half+i]), or with interleave (DeepSeek's
 * rope_interleave) (x[off+2i], x[off+2i+1]); the result is written to
 * (y[off+i], y[off+half+i]) in both layouts, as HF's
 * apply_rotary_pos_emb_interleave does. The gradient applies the
 * transposed rotation, reads dy at (off+i, off+half+i) and writes dx where
 * the forward read. ws: xm_ws_rope(S, rd) bytes (the inverse frequencies
 * and the cos/sin table), for both directions. */
void xm_k_rope(const float *x, float *y, int64_t B, int64_t S, int64_t nh, int64_t D, int64_t off,
               int64_t rd, float theta, float factor, float ramp_lo, float ramp_hi, float mscale,
               int interleave, float *ws);
void xm_k_rope_grad(const float *dy, float *dx, int64_t B, int64_t S, int64_t nh, int64_t D,
                    int64_t off, int64_t rd, float theta, float factor, float ramp_lo,
                    float ramp_hi, float mscale, int interleave, float *ws);

/* Concatenation along the last dim: a[R,H,Da], b[R,Hb,Db] -> y[R,H,Da+Db],
 * Hb == H or Hb == 1 (b broadcast over H: MLA's rotary key, shared by all
 * heads). split is its adjoint: x[R,H,Da+Db] -> a = x[..., :Da] and b =
 * x[..., Da:] (Hb == H) or b[r,0,:] = the sum over h of x[r,h,Da:] (Hb ==
 * 1, summed in double in head order). */
void xm_k_concat(const float *a, const float *b, float *y, int64_t R, int64_t H, int64_t Hb,
                 int64_t Da, int64_t Db);
void xm_k_split(const float *x, float *a, float *b, int64_t R, int64_t H, int64_t Hb, int64_t Da,
                int64_t Db);
/* The same cut of int rows x[R,Da+Db] -> a[R,Da], b[R,Db] (MTP's shifted
 * labels). */
void xm_k_split_i32(const int32_t *x, int32_t *a, int32_t *b, int64_t R, int64_t Da, int64_t Db);

/* Causal attention: q[B,S,Hq,D], k[B,S,Hkv,D], v[B,S,Hkv,Dv] ->
 * out[B,S,Hq,Dv]; query head h uses kv head h / (Hq/Hkv). ws: one
 * probability tile per thread slot, xm_ws_attention(B, S, Hq) bytes
 * forward and xm_ws_attention_grad(B, S, Hkv) backward; the slots are
 * fixed by the shapes (at most XM_WS_ATTN_SLOTS) and the kernels run at
 * most that many threads, with the same bits on any team size. */
void xm_k_attention(const float *q, const float *k, const float *v, float *out, int64_t B,
                    int64_t S, int64_t Hq, int64_t Hkv, int64_t D, int64_t Dv, float scale,
                    float *ws);
void xm_k_attention_grad(const float *dout, const float *q, const float *k, const float *v,
                         float *dq, float *dk, float *dv, int64_t B, int64_t S, int64_t Hq,
                         int64_t Hkv, int64_t D, int64_t Dv, float scale, float *ws);

/* y[i,:] = table[tok[i],:]; token ids are validated by the data loader. */
void xm_k_embedding(const int32_t *tok, const float *table, float *y, int64_t n_tok, int64_t H);
/* dtable[V,H] = sum of dy rows per token id. */
void xm_k_embedding_grad(const float *dy, const int32_t *tok, float *dtable, int64_t n_tok,
                         int64_t V, int64_t H);

/* *loss = mean over rows of -log softmax(logits[r])[labels[r]]. */
void xm_k_cross_entropy(const float *logits, const int32_t *labels, float *loss, int64_t rows,
                        int64_t V);
/* dlogits = *dloss * (softmax - onehot) / rows */
void xm_k_cross_entropy_grad(const float *dloss, const float *logits, const int32_t *labels,
                             float *dlogits, int64_t rows, int64_t V);

/* The LM head fused with the cross-entropy, over the vocabulary in chunks of
 * `chunk` columns (runtime/abi/workspace.h): *loss = cross_entropy(x w^T,
 * labels) with x[rows,H], w[V,H], and stats[r] = {max_j l_rj, sum_j
 * exp(l_rj - max)} for the backward; only one chunk of logits exists at a
 * time, in scratch (xm_lm_ce_scratch_floats floats). Chunk by chunk the
 * running maximum and denominator are rescaled (in double), so with one
 * chunk the loss is xm_k_cross_entropy's bit for bit. */
void xm_k_lm_head_ce(const float *x, const float *w, const int32_t *labels, float *loss,
                     float *stats, int64_t rows, int64_t H, int64_t V, int64_t chunk,
                     float *scratch);
/* Its gradient: per chunk the logits again, then g (softmax - onehot) with
 * g = *dloss / rows (xm_k_cross_entropy_grad's formula, from stats);
 * dx[rows,H] = the sum over the chunks of dlogits_c w_c in chunk order, and
 * dw[V,H] = beta dw + dlogits^T x, one chunk of rows at a time. */
void xm_k_lm_head_ce_grad(const float *dloss, const float *x, const float *w,
                          const int32_t *labels, const float *stats, float *dw, float *dx,
                          int64_t rows, int64_t H, int64_t V, int64_t chunk, float beta,
                          float *scratch);
/* The same on bf16 x and w (widened in ws, xm_bf16_lm_ce_ws_floats); the
 * backward rounds each chunk's logit gradient to bf16 before its GEMMs. */
void xm_k_lm_head_ce_bf16(const xm_bf16_t *x, const xm_bf16_t *w, const int32_t *labels,
                          float *loss, float *stats, int64_t rows, int64_t H, int64_t V,
                          int64_t chunk, float *scratch, float *ws);
void xm_k_lm_head_ce_grad_bf16(const float *dloss, const xm_bf16_t *x, const xm_bf16_t *w,
                               const int32_t *labels, const float *stats, float *dw, float *dx,
                               int64_t rows, int64_t H, int64_t V, int64_t chunk, float beta,
                               float *scratch, float *ws);

/* ---- router and padding-free MoE ---------------------------------------
 * (docs/design.md, Model semantics; Padding-free token permutation) */

void xm_k_router_score(const float *logits, float *scores, int64_t T, int64_t E, int scoring);
void xm_k_router_score_grad(const float *dscores, const float *scores, float *dlogits, int64_t T,
                            int64_t E, int scoring);
/* Group-limited top-k with the aux-free bias used for choosing only; ties
 * go to the lower expert index. */
void xm_k_topk_route(const float *scores, const float *bias, int32_t *experts, float *weights,
                     int64_t T, int64_t E, int64_t k, int64_t n_group, int64_t topk_group,
                     int norm_topk_prob, float routed_scaling, int scoring);
void xm_k_topk_route_grad(const float *dweights, const float *scores, const int32_t *experts,
                          float *dscores, int64_t T, int64_t E, int64_t k, int norm_topk_prob,
                          float routed_scaling);
/* Stable sort of the T*k slots by expert: indices[i] is the slot (t*k + j)
 * of row i, bin_ids[i] its expert, tpe[e] the rows of expert e. capacity 0
 * = dropless; otherwise each expert keeps its `capacity` slots of highest
 * weight (ties: lower slot index) and the rest are dropped. Returns n. */
int64_t xm_k_permute(const int32_t *experts, const float *weights, int32_t *indices,
                     int32_t *bin_ids, int32_t *tpe, int64_t T, int64_t k, int64_t E,
                     int64_t capacity);
/* y[i,:] = x[indices[i] / k, :], i < n */
void xm_k_gather_rows(const float *x, const int32_t *indices, float *y, int64_t n, int64_t H,
                      int64_t k);
/* dx[T,H] = 0; dx[indices[i]/k] += dy[i] */
void xm_k_gather_rows_grad(const float *dy, const int32_t *indices, float *dx, int64_t n,
                           int64_t T, int64_t H, int64_t k);
/* Rows of expert e (consecutive, tpe[e] of them) times w[e]^T:
 * x[n,K], w[E,M,K] -> y[n,M]. */
void xm_k_grouped_matmul(const float *x, const float *w, const int32_t *tpe, float *y, int64_t E,
                         int64_t K, int64_t M);
void xm_k_grouped_matmul_dx(const float *dy, const float *w, const int32_t *tpe, float *dx,
                            int64_t E, int64_t K, int64_t M);
/* dw[E,M,K]; experts with no rows get zeros. */
void xm_k_grouped_matmul_dw(const float *dy, const float *x, const int32_t *tpe, float *dw,
                            int64_t E, int64_t K, int64_t M);
/* dw[E,M,K] += the same product (experts with no rows are left as they are). */
void xm_k_grouped_matmul_dw_acc(const float *dy, const float *x, const int32_t *tpe, float *dw,
                                int64_t E, int64_t K, int64_t M);
/* out[T,H] = sum over kept slots of weights[slot] * y[row of slot]. */
void xm_k_scatter_combine(const float *y, const int32_t *indices, const float *weights,
                          float *out, int64_t n, int64_t T, int64_t k, int64_t H);
/* dy[i] = weights[slot_i] * dout[t_i]; dweights[slot_i] = dot(dout[t_i], y[i]);
 * dropped slots get dweights 0. */
void xm_k_scatter_combine_grad(const float *dout, const float *y, const int32_t *indices,
                               const float *weights, float *dy, float *dweights, int64_t n,
                               int64_t T, int64_t k, int64_t H);
/* Expert parallelism (docs/design.md, Padding-free token permutation): x holds rows in (member p,
 * local expert l) order, counts[p*L + l] rows per block, as an all-to-all delivers them;
 * sort_chunks writes them to y in (l, p) order (all rows of local expert 0 from member 0, then from
 * member 1, ..., then expert 1), the order the grouped GEMMs read; unsort_chunks is the inverse (x
 * in (l, p) order, y in (p, l) order). width floats per row; x and y must not overlap; only the
 * sum(counts) rows are touched. */
void xm_k_sort_chunks(const float *x, const int32_t *counts, int64_t P, int64_t L, int64_t width,
                      float *y);
void xm_k_unsort_chunks(const float *x, const int32_t *counts, int64_t P, int64_t L,
                        int64_t width, float *y);
/* *loss = alpha * sum_e f_e P_e, f_e = E/(k*T) * count_e, P_e = mean_t scores[t,e]. */
void xm_k_aux_loss(const float *scores, const int32_t *experts, float *loss, int64_t T,
                   int64_t E, int64_t k, float alpha);
void xm_k_aux_loss_grad(const float *dloss, const float *scores, const int32_t *experts,
                        float *dscores, int64_t T, int64_t E, int64_t k, float alpha);

/* ---- training state and the optimizer ---------------------------------- */

void xm_k_accumulate(float *acc, const float *x, int64_t n);
void xm_k_accumulate_i32(int32_t *acc, const int32_t *x, int64_t n);
/* Sum of squares in double precision, returned to the caller: a host-side
 * helper (tests, the driver's own checks), not a backend kernel; the
 * schedule uses xm_k_sum_sq_acc, whose result stays on the device. */
double xm_k_sum_sq(const float *x, int64_t n);
/* *acc += sum of squares of x (in double); *out = (float)*acc. acc is a
 * device double the schedule zeroes first (the op's workspace), out the
 * norm's f32 scalar, so the last call of a norm leaves the total in out. */
void xm_k_sum_sq_acc(const float *x, int64_t n, double *acc, float *out);
/* PyTorch AdamW on one tensor: g' = g * grad_scale; m = b1 m + (1-b1) g';
 * v = b2 v + (1-b2) g'^2; p -= lr * wd * p; p -= lr * (m / (1-b1^t)) /
 * (sqrt(v / (1-b2^t)) + eps), t = step (1-based). */
void xm_k_adamw(float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1,
                float beta2, float eps, float weight_decay, int64_t step, float grad_scale);
/* xm_k_adamw on each of `count` tensors (weight_decay where decay is 1),
 * in one fork of the thread team; bit for bit the per-tensor result. */
void xm_k_adamw_multi(const xm_rt_adamw_tensor_t *tensors, int64_t count, float lr, float beta1,
                      float beta2, float eps, float weight_decay, int64_t step, float grad_scale);
/* bias[e] += gamma * sign(mean(load) - load[e]) */
void xm_k_aux_free_update(float *bias, const int32_t *load, int64_t E, float gamma);

/* ---- fused gather / combine grouped GEMMs (padding-free MoE) ------------
 * The gather of token rows folded into the grouped GEMM that consumes it
 * (A rows read through the slot index) and the weighted scatter-combine
 * folded into the epilogue of the down GEMM, so that neither the [n,K]
 * gathered copy nor the [n,M] expert output is materialised. indices and
 * tpe come from xm_k_permute; n = sum(tpe); x, dx, out, dout have T token
 * rows; w is [E,M,K]. Work goes in jobs of at most tile_rows rows of one
 * expert: a job stages a tile of rows in its thread's slice of `scratch`
 * (tile_rows * W floats at tid * tile_rows * W, W given per kernel, at most
 * `slots` threads), then runs one GEMM on the tile. The tiles are laid
 * from each expert's first row whatever the thread count; the kernels
 * never allocate and never use atomics, and give the same bits on any
 * number of threads. The unfused composition each one replaces is named
 * after it (forward, combine and dx sum in its order). */

/* scratch size in floats for `slots` threads staging tile_rows rows of
 * `width` floats: tile_rows * slots * width (the compiler sizes the
 * buffer with this formula). */
int64_t xm_k_fused_scratch_floats(int64_t tile_rows, int64_t slots, int64_t width);
/* y[i,:] = x[indices[i]/k, :] w[e(i)]^T, i < n: x[T,K] -> y[n,M]; W = K.
 * = xm_k_gather_rows + xm_k_grouped_matmul. */
void xm_k_gather_grouped_matmul(const float *x, const int32_t *indices, const int32_t *tpe,
                                const float *w, float *y, int64_t E, int64_t K, int64_t M,
                                int64_t k, float *scratch, int64_t tile_rows, int64_t slots);
/* out[T,M] = sum over rows i of weights[indices[i]] * h[i,:] w[e(i)]^T,
 * added into token indices[i]/k in row order; h[n,K]; tokens with no row
 * get 0; W = M. = xm_k_grouped_matmul + xm_k_scatter_combine. */
void xm_k_grouped_matmul_combine(const float *h, const float *w, const int32_t *tpe,
                                 const int32_t *indices, const float *weights, float *out,
                                 int64_t E, int64_t K, int64_t M, int64_t T, int64_t k,
                                 float *scratch, int64_t tile_rows, int64_t slots);
/* dx[T,K] = sum over rows i of dy[i,:] w[e(i)] added into token
 * indices[i]/k; dy[n,M]; W = K. = xm_k_grouped_matmul_dx +
 * xm_k_gather_rows_grad. */
void xm_k_gather_grouped_matmul_dx(const float *dy, const float *w, const int32_t *tpe,
                                   const int32_t *indices, float *dx, int64_t E, int64_t K,
                                   int64_t M, int64_t T, int64_t k, float *scratch,
                                   int64_t tile_rows, int64_t slots);
/* dw[e] = beta dw[e] + sum over rows i of e of dy[i,:]^T x[indices[i]/k,:];
 * beta 0 or 1: experts with no rows get zeros (0) or are left as they are
 * (1); W = K. = xm_k_gather_rows + xm_k_grouped_matmul_dw / _dw_acc. */
void xm_k_gather_grouped_matmul_dw(const float *dy, const float *x, const int32_t *indices,
                                   const int32_t *tpe, float *dw, int64_t E, int64_t K,
                                   int64_t M, int64_t k, float beta, float *scratch,
                                   int64_t tile_rows, int64_t slots);
/* Backward of xm_k_grouped_matmul_combine wrt h and weights, without the
 * expert outputs: g = dout[indices[i]/k,:] w[e(i)]; dh[i,:] =
 * weights[indices[i]] g; dweights[indices[i]] = dot(g, h[i,:]) (double
 * sum); dweights[T*k] is overwritten, dropped slots get 0; W = M. Equals
 * xm_k_grouped_matmul + xm_k_scatter_combine_grad (+ _grouped_matmul_dx)
 * up to rounding. */
void xm_k_grouped_matmul_combine_grad(const float *dout, const float *h, const float *w,
                                      const int32_t *tpe, const int32_t *indices,
                                      const float *weights, float *dh, float *dweights,
                                      int64_t E, int64_t K, int64_t M, int64_t T, int64_t k,
                                      float *scratch, int64_t tile_rows, int64_t slots);
/* dw[e] = beta dw[e] + sum over rows i of e of
 * (weights[indices[i]] dout[indices[i]/k,:])^T h[i,:]; beta as in
 * xm_k_gather_grouped_matmul_dw; W = M. = xm_k_scatter_combine_grad's dy +
 * xm_k_grouped_matmul_dw / _dw_acc. */
void xm_k_grouped_matmul_combine_dw(const float *dout, const float *h, const int32_t *indices,
                                    const float *weights, const int32_t *tpe, float *dw,
                                    int64_t E, int64_t K, int64_t M, int64_t k, float beta,
                                    float *scratch, int64_t tile_rows, int64_t slots);

/* ---- bf16 mixed precision (docs/design.md, Mixed precision) ------------
 * bf16 tensors are raw 16-bit words (runtime/abi/bf16.h). The GEMMs read
 * bf16 operands and accumulate in f32; forward and input-gradient GEMMs
 * write bf16 (rounded to nearest even), weight-gradient GEMMs write f32 as
 * dw = beta * dw + product (beta 0 or 1, as the fused kernels' beta), so
 * they add into the f32 gradient state. Shapes and layouts as the f32
 * kernels of the same name; `ws` is the op's workspace from the memory
 * plan, xm_bf16_gemm_ws_floats(rows, K, N, widen_w) floats (rows the bound
 * of the routed rows for the grouped ones). */

void xm_k_cast_f32_bf16(const float *x, xm_bf16_t *y, int64_t n);
void xm_k_cast_bf16_f32(const xm_bf16_t *x, float *y, int64_t n);
void xm_k_matmul_bf16(const xm_bf16_t *x, const xm_bf16_t *w, xm_bf16_t *y, int64_t M, int64_t K,
                      int64_t N, float *ws);
void xm_k_matmul_dx_bf16(const xm_bf16_t *dy, const xm_bf16_t *w, xm_bf16_t *dx, int64_t M,
                         int64_t K, int64_t N, float *ws);
void xm_k_matmul_dw_bf16(const xm_bf16_t *dy, const xm_bf16_t *x, float *dw, int64_t M,
                         int64_t K, int64_t N, float beta, float *ws);
void xm_k_grouped_matmul_bf16(const xm_bf16_t *x, const xm_bf16_t *w, const int32_t *tpe,
                              xm_bf16_t *y, int64_t E, int64_t K, int64_t M, float *ws);
void xm_k_grouped_matmul_dx_bf16(const xm_bf16_t *dy, const xm_bf16_t *w, const int32_t *tpe,
                                 xm_bf16_t *dx, int64_t E, int64_t K, int64_t M, float *ws);
void xm_k_grouped_matmul_dw_bf16(const xm_bf16_t *dy, const xm_bf16_t *x, const int32_t *tpe,
                                 float *dw, int64_t E, int64_t K, int64_t M, float beta,
                                 float *ws);

/* The fused MoE kernels with bf16 token, row and weight operands (routing
 * weights f32), f32 accumulation and f32 results: the same work and tiles
 * as the f32 kernels above on the operands widened as they are read; ws is
 * the op's workspace, xm_bf16_fused_ws_floats(tile_rows, slots, K, M,
 * widen_w) floats (widen_w: the kernel has a weight operand; not the two
 * dw kernels). */
void xm_k_gather_grouped_matmul_bf16(const xm_bf16_t *x, const int32_t *indices,
                                     const int32_t *tpe, const xm_bf16_t *w, float *y, int64_t E,
                                     int64_t K, int64_t M, int64_t k, float *scratch,
                                     int64_t tile_rows, int64_t slots, float *ws);
void xm_k_grouped_matmul_combine_bf16(const xm_bf16_t *h, const xm_bf16_t *w, const int32_t *tpe,
                                      const int32_t *indices, const float *weights, float *out,
                                      int64_t E, int64_t K, int64_t M, int64_t T, int64_t k,
                                      float *scratch, int64_t tile_rows, int64_t slots,
                                      float *ws);
void xm_k_gather_grouped_matmul_dx_bf16(const xm_bf16_t *dy, const xm_bf16_t *w,
                                        const int32_t *tpe, const int32_t *indices, float *dx,
                                        int64_t E, int64_t K, int64_t M, int64_t T, int64_t k,
                                        float *scratch, int64_t tile_rows, int64_t slots,
                                        float *ws);
void xm_k_gather_grouped_matmul_dw_bf16(const xm_bf16_t *dy, const xm_bf16_t *x,
                                        const int32_t *indices, const int32_t *tpe, float *dw,
                                        int64_t E, int64_t K, int64_t M, int64_t k, float beta,
                                        float *scratch, int64_t tile_rows, int64_t slots,
                                        float *ws);
void xm_k_grouped_matmul_combine_grad_bf16(const xm_bf16_t *dout, const xm_bf16_t *h,
                                           const xm_bf16_t *w, const int32_t *tpe,
                                           const int32_t *indices, const float *weights,
                                           float *dh, float *dweights, int64_t E, int64_t K,
                                           int64_t M, int64_t T, int64_t k, float *scratch,
                                           int64_t tile_rows, int64_t slots, float *ws);
void xm_k_grouped_matmul_combine_dw_bf16(const xm_bf16_t *dout, const xm_bf16_t *h,
                                         const int32_t *indices, const float *weights,
                                         const int32_t *tpe, float *dw, int64_t E, int64_t K,
                                         int64_t M, int64_t k, float beta, float *scratch,
                                         int64_t tile_rows, int64_t slots, float *ws);

#endif /* XM_RUNTIME_KERNELS_H */
