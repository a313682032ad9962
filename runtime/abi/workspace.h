/* runtime/abi/workspace.h — the workspace of every f32 CPU kernel that
 * needs scratch, in bytes, from the kernel's own size arguments.
 *
 * Kernels never allocate: a kernel that needs scratch takes it as its last
 * argument `ws`, and the compiler's kernel-workspace pass gives the op attr
 * workspace = the formula here, which plan-memory turns into a buffer of
 * the activation arena live during that op only (attr ws). The compiler,
 * the kernels and the tests all include this header, so each formula is
 * written once. (The bf16 GEMMs' formula lives in runtime/abi/bf16.h for
 * the same reason.)
 *
 * Contract: `ws` is at least the formula's bytes, 8-byte aligned (the plan
 * aligns every buffer to 64 bytes by default, the backends' alloc too), and
 * may be dirty: a kernel writes every scratch word before it reads it, so
 * its results do not depend on what the buffer held. When a formula gives
 * 0 the kernel does not touch ws at all (it may be NULL); that happens only
 * for empty shapes, where the kernel has nothing to compute.
 *
 * Thread count. A workspace must not depend on the run-time thread count:
 * the compiler sizes it long before out/train picks its team. Kernels whose
 * scratch is per thread (attention) therefore have a fixed number of slots
 * from the shapes alone, XM_WS_ATTN_SLOTS clamped to the kernel's units of
 * parallel work, and run at most that many threads. Because every unit of
 * work is computed the same way on whichever slot it lands, their results
 * are bitwise the same for any number of threads, capped or not.
 */
#ifndef XM_RUNTIME_ABI_WORKSPACE_H
#define XM_RUNTIME_ABI_WORKSPACE_H

#include <stdint.h>

/* Query rows per attention tile (the CPU kernels' tiling: a tile's scores
 * are one GEMM of tile x keys; runtime/cpu/kernels_attn.c). */
#define XM_WS_ATTN_TILE 64

/* Most per-thread slots an attention kernel gets. A forward slot holds one
 * tile's probabilities (tile x S floats: 256 KiB at S = 1024), a backward
 * slot twice that, so 64 slots cost 16 / 32 MiB at S = 1024, live during
 * one attention op, and leave room for the cores a CPU rank has. */
#define XM_WS_ATTN_SLOTS 64

static inline int64_t xm_ws_min_(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---- RoPE -------------------------------------------------------------------
 * xm_k_rope / xm_k_rope_grad(x, y, B, S, nh, D, off, rd, ...): the inverse
 * frequencies in double (rd/2 of them, rd the rotated span of a row) at ws,
 * then the cos and sin tables of the S positions (2 x S x rd/2 floats).
 * Independent of B, nh and the row width D. */
static inline int64_t xm_ws_rope(int64_t S, int64_t rd) {
  int64_t half = rd / 2;
  if (S <= 0 || half <= 0) return 0;
  return half * (int64_t)sizeof(double) + 2 * S * half * (int64_t)sizeof(float);
}

/* ---- attention ----------------------------------------------------------------
 * Rows of a slot's probability tile: one tile, or all S rows when shorter. */
static inline int64_t xm_ws_attn_rows(int64_t S) {
  return S < XM_WS_ATTN_TILE ? S : XM_WS_ATTN_TILE;
}

/* Slots (= most threads) of xm_k_attention: its units of work are the
 * (batch, query head, row tile) triples. */
static inline int64_t xm_ws_attention_slots(int64_t B, int64_t S, int64_t Hq) {
  if (B <= 0 || S <= 0 || Hq <= 0) return 0;
  int64_t ntile = (S + XM_WS_ATTN_TILE - 1) / XM_WS_ATTN_TILE;
  return xm_ws_min_(XM_WS_ATTN_SLOTS, B * Hq * ntile);
}

/* xm_k_attention(q, k, v, out, B, S, Hq, Hkv, D, Dv, scale, ws): one
 * probability tile (rows x S floats) per slot, slot i at i * rows * S. */
static inline int64_t xm_ws_attention(int64_t B, int64_t S, int64_t Hq) {
  return xm_ws_attention_slots(B, S, Hq) * xm_ws_attn_rows(S) * S * (int64_t)sizeof(float);
}

/* Slots of xm_k_attention_grad: its units are the (batch, kv head) pairs
 * (a GQA group's dk/dv sums stay on one thread). */
static inline int64_t xm_ws_attention_grad_slots(int64_t B, int64_t S, int64_t Hkv) {
  if (B <= 0 || S <= 0 || Hkv <= 0) return 0;
  return xm_ws_min_(XM_WS_ATTN_SLOTS, B * Hkv);
}

/* xm_k_attention_grad(dout, q, k, v, dq, dk, dv, B, S, Hq, Hkv, D, Dv,
 * scale, ws): per slot the tile's probabilities and their gradient (2 x
 * rows x S floats), slot i at i * 2 * rows * S. */
static inline int64_t xm_ws_attention_grad(int64_t B, int64_t S, int64_t Hkv) {
  return xm_ws_attention_grad_slots(B, S, Hkv) * 2 * xm_ws_attn_rows(S) * S *
         (int64_t)sizeof(float);
}

/* ---- RMSNorm backward -----------------------------------------------------------
 * xm_k_rmsnorm_grad(dy, x, w, dx, dw, rows, H, eps, ws): each row's inverse
 * RMS (one float per row), computed in the row pass and read again by the
 * column pass of dw. `rows` is the bound (routed buffers are sized by it). */
static inline int64_t xm_ws_rmsnorm_grad(int64_t rows, int64_t H) {
  if (rows <= 0 || H <= 0) return 0;
  return rows * (int64_t)sizeof(float);
}

/* ---- the LM head's chunked cross-entropy ------------------------------------
 * lm_head_ce / lm_head_ce_grad (runtime/abi/kernels.def) compute the logits
 * x w^T one chunk of vocabulary columns at a time, so the [rows, V] logits
 * never exist whole. Chunk width: the hidden width rounded up to a multiple
 * of 64 (a chunk of logits is then no larger than the f32 hidden state it
 * comes from), at least 64 columns, at most V. */
#define XM_LM_CE_CHUNK_ALIGN 64

static inline int64_t xm_lm_ce_chunk(int64_t V, int64_t H) {
  int64_t c = (H + XM_LM_CE_CHUNK_ALIGN - 1) / XM_LM_CE_CHUNK_ALIGN * XM_LM_CE_CHUNK_ALIGN;
  if (c < XM_LM_CE_CHUNK_ALIGN) c = XM_LM_CE_CHUNK_ALIGN;
  return V < c ? (V > 0 ? V : 1) : c;
}

/* Their scratch in floats (the op's last result, f32[n]): per row the
 * running softmax denominator (a double, 2 floats), the running maximum and
 * the label's logit (the forward's state across chunks), then one chunk of
 * logits (rows x chunk; the backward turns it into their gradient in
 * place). The state words come first, so the double is 8-byte aligned. */
static inline int64_t xm_lm_ce_scratch_floats(int64_t rows, int64_t chunk) {
  if (rows < 0) rows = 0;
  if (chunk < 1) chunk = 1;
  return rows * (4 + chunk);
}

/* grad_norm_sq: the double the sum_sq_acc calls add into. */
static inline int64_t xm_ws_norm_sq(void) { return (int64_t)sizeof(double); }

#endif /* XM_RUNTIME_ABI_WORKSPACE_H */
