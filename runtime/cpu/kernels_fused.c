/* runtime/cpu/kernels_fused.c — grouped GEMMs with the MoE gather and the
 * weighted scatter-combine folded in (fp32).
 *
 * The padding-free MoE block of kernels_moe.c copies the token rows into an
 * expert-sorted [n,K] buffer before the grouped GEMM and writes an [n,M]
 * expert output that the scatter-combine then sums back into the tokens.
 * The kernels here do the same work without either buffer: the GEMM that
 * consumed the gathered rows reads them through the slot index, and the
 * down GEMM adds its weighted rows into the tokens straight from a tile,
 * plus the four backward kernels of the pair. The work is cut into jobs of
 * at most tile_rows rows of one expert, the tiles laid from each expert's
 * first row, so they depend on tpe and tile_rows alone. A job stages its
 * tile (gathered A rows, or the GEMM's output rows before the epilogue) in
 * its thread's slice of the caller's scratch (tile_rows * W floats at
 * tid * tile_rows * W) and runs one single-threaded cblas_sgemm on it. The
 * kernels never allocate: job numbers map to (expert, piece) through a
 * cursor that each thread moves forward only (the monotonic schedule hands
 * a thread its jobs in increasing order).
 *
 * Parallelism follows grouped() in kernels_moe.c: serial below
 * XM_K_GROUP_PAR_MIN multiply-adds, inside a parallel region, or when
 * OpenBLAS runs multi-threaded (then the tiles go one after the other and
 * OpenBLAS threads each GEMM); otherwise min(slots, max threads) OpenMP
 * threads. Nothing uses atomics, and every GEMM is the same call (same
 * operands, same sizes) whatever the thread count, so the results are
 * bitwise the same for any team. That is why the tiles never follow thread
 * boundaries: OpenBLAS does not round a row the same way in every tile size
 * (0.3.21 on AVX-512 cores takes a small-matrix kernel below a size
 * threshold and the packed one above, and they differ in the last bits).
 *
 * Forward, combine_grad and the two dw kernels write disjoint rows or
 * weight-gradient slices, so their jobs run in any order (dynamic
 * schedule); a dw job is an (expert, slice of the M rows) pair summing the
 * expert's tiles one after the other (beta, then 1). Combine and dx add
 * into token rows: each thread owns a contiguous range of tokens, as in
 * kernels_moe.c, and the tiles go in rounds of one per thread (thread q
 * computes tile j0 + q); after a barrier each thread adds, from the round's
 * tiles in order, the rows of its tokens (a sub-range of each tile, found
 * by binary search: inside one expert the rows are in slot order, hence
 * token order). A token thus gets its rows in expert-sorted row order, the
 * order of xm_k_scatter_combine and xm_k_gather_rows_grad, so forward,
 * combine and dx equal the unfused composition bit for bit whenever
 * OpenBLAS rounds each row of the fused tile as in the unfused GEMM (it
 * does when both fall on the same side of its size threshold). The dw
 * kernels cut the sum over rows into tiles and combine_grad multiplies by
 * the routing weight after the GEMM instead of before, so those three
 * match the unfused path up to rounding only.
 */
#include <omp.h>
#include <string.h>

#include <cblas.h>

#include "runtime/abi/bf16.h"
#include "runtime/cpu/kernels.h"
#include "support/status.h"

/* `omp simd` asks for vectorisation; where the compiler cannot give it
 * (Clang with sanitizers), the scalar loop is just as right. */
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

/* Below this many multiply-adds in all the kernels stay serial (the value
 * of kernels_moe.c's grouped GEMMs). */
#define XM_K_GROUP_PAR_MIN ((int64_t)1 << 20)
/* dw jobs: an expert of up to this many rows is one job, a larger one is cut
 * into about rows / this many slices of its weight-gradient rows (as in
 * kernels_moe.c); the cut depends on tpe only. */
#define XM_K_DW_SLICE_ROWS 256

int64_t xm_k_fused_scratch_floats(int64_t tile_rows, int64_t slots, int64_t width) {
  return tile_rows * slots * width;
}

/* ---- shared machinery ---------------------------------------------------- */

typedef enum {
  FUSED_FWD,          /* xm_k_gather_grouped_matmul */
  FUSED_COMBINE,      /* xm_k_grouped_matmul_combine */
  FUSED_DX,           /* xm_k_gather_grouped_matmul_dx */
  FUSED_DW,           /* xm_k_gather_grouped_matmul_dw */
  FUSED_COMBINE_GRAD, /* xm_k_grouped_matmul_combine_grad */
  FUSED_COMBINE_DW,   /* xm_k_grouped_matmul_combine_dw */
} fused_kind_t;

typedef struct {
  fused_kind_t kind;
  const float *tok;   /* token rows read through the slot: x (fwd, dw), dout (grad, cdw) */
  const float *rows;  /* expert-sorted rows: h (combine, grad, cdw), dy (dx, dw) */
  const float *w;     /* expert weights [E,M,K] (fwd, combine, dx, grad) */
  const float *wts;   /* routing weights [T*k] (combine, grad, cdw) */
  const int32_t *idx; /* slot of each row */
  const int32_t *tpe;
  float *out;      /* y, out, dx, dw, or dh (grad) */
  float *dweights; /* grad */
  float *scratch;
  int64_t E, K, M, T, k, tile, width; /* width: W, floats per staged row */
  float beta;                         /* dw, cdw */
  /* bf16 operands (the _bf16 kernels): tok, rows and w read from these
   * instead, widened to f32 as they are used, in each thread's slice of ws
   * (ws_slot floats: the expert weight [M,K] it last widened, when w16,
   * then a tile of rows of up to max(K, M) floats). */
  const xm_bf16_t *tok16, *rows16, *w16;
  float *ws;
  int64_t ws_slot;
} fused_t;

/* One thread's buffers: its scratch tile and, for bf16 operands, its
 * widened expert weight (of expert `we`, -1 for none yet) and row tile. */
typedef struct {
  float *s, *wbuf, *rbuf;
  int64_t we;
} slot_t;

static slot_t slot_of(const fused_t *f, int64_t tid) {
  slot_t sl = {f->scratch + tid * f->tile * f->width, NULL, NULL, -1};
  if (f->ws) {
    sl.wbuf = f->ws + tid * f->ws_slot;
    sl.rbuf = sl.wbuf + (f->w16 ? f->M * f->K : 0);
  }
  return sl;
}

static void widen(const xm_bf16_t *src, float *dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++)
    dst[i] = xm_bf16_to_f32(src[i]);
}

/* Expert e's weight [M,K] in f32: the operand itself, or this thread's
 * widened copy (made once per expert: a thread's jobs come in increasing
 * order, so its experts do too). */
static const float *weights(const fused_t *f, slot_t *sl, int64_t e) {
  int64_t MK = f->M * f->K;
  if (!f->w16) return f->w + e * MK;
  if (sl->we != e) {
    widen(f->w16 + e * MK, sl->wbuf, MK);
    sl->we = e;
  }
  return sl->wbuf;
}

/* Rows [r0, r0 + nr) of the expert-sorted operand (rows of `ld` floats),
 * columns [c0, c0 + cw), in f32: a pointer into the operand with leading
 * dimension ld, or the thread's widened tile with leading dimension cw. */
typedef struct {
  const float *p;
  int64_t ld;
} rows_t;

static rows_t rows_at(const fused_t *f, slot_t *sl, int64_t r0, int64_t nr, int64_t ld,
                      int64_t c0, int64_t cw) {
  if (!f->rows16) return (rows_t){f->rows + r0 * ld + c0, ld};
  for (int64_t i = 0; i < nr; i++)
    widen(f->rows16 + (r0 + i) * ld + c0, sl->rbuf + i * cw, cw);
  return (rows_t){sl->rbuf, cw};
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Threads for `work` multiply-adds: 1 (serial) or min(slots, max threads). */
static int team_size(int64_t work, int64_t slots) {
  if (work < XM_K_GROUP_PAR_MIN || omp_in_parallel() || openblas_get_num_threads() != 1) return 1;
  int64_t nt = min64(slots, omp_get_max_threads());
  return nt > 1 ? (int)nt : 1;
}

static int64_t total_rows(const int32_t *tpe, int64_t E) {
  int64_t n = 0;
  for (int64_t e = 0; e < E; e++)
    n += tpe[e];
  return n;
}

static int is_dw(const fused_t *f) { return f->kind == FUSED_DW || f->kind == FUSED_COMBINE_DW; }

/* Jobs of an expert with r rows: its tiles, or for dw its slices of the M
 * weight-gradient rows (one for an empty expert, which dw still writes). */
static int64_t jobs_of(const fused_t *f, int64_t r) {
  if (!is_dw(f)) return (r + f->tile - 1) / f->tile;
  int64_t np = r <= XM_K_DW_SLICE_ROWS ? 1 : (r + XM_K_DW_SLICE_ROWS / 2) / XM_K_DW_SLICE_ROWS;
  return min64(np, f->M);
}

/* Expert e, its first row and its first job; moved forward to the expert
 * of job j (j is never below the cursor's job). */
typedef struct {
  int64_t e, row, job;
} cursor_t;

static void seek(const fused_t *f, cursor_t *c, int64_t j) {
  for (;;) {
    int64_t nj = jobs_of(f, f->tpe[c->e]);
    if (j < c->job + nj) return;
    c->job += nj;
    c->row += f->tpe[c->e];
    c->e++;
  }
}

/* First i < n with v[i] >= key (v increasing), n when there is none. */
static int64_t lower_bound(const int32_t *v, int64_t n, int64_t key) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (v[mid] < key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* s[i, 0:width] = src[slot_i / k, c0 : c0 + width] (rows of ld floats) for
 * the rows [r0, r0 + nr), times the slot's routing weight when wts is set. */
static void gather_tile(const fused_t *f, int64_t ld, int64_t c0, int64_t width,
                        const float *wts, int64_t r0, int64_t nr, float *s) {
  const int32_t *idx = f->idx;
  int64_t k = f->k;
  for (int64_t i = 0; i < nr; i++) {
    int32_t slot = idx[r0 + i];
    float *d = s + i * width;
    if (f->tok16) { /* widened, then weighted as the f32 rows are */
      widen(f->tok16 + (int64_t)(slot / k) * ld + c0, d, width);
      if (!wts) continue;
      float w = wts[slot];
#pragma omp simd
      for (int64_t c = 0; c < width; c++)
        d[c] = w * d[c];
      continue;
    }
    const float *g = f->tok + (int64_t)(slot / k) * ld + c0;
    if (!wts) {
      memcpy(d, g, sizeof(float) * (size_t)width);
      continue;
    }
    float w = wts[slot];
#pragma omp simd
    for (int64_t c = 0; c < width; c++)
      d[c] = w * g[c];
  }
}

/* ---- jobs of fixed tiles: forward, combine_grad, the two dw -------------- */

/* Tile p of expert e (rows [row, row + r)): forward or combine_grad. */
static void row_job(const fused_t *f, int64_t e, int64_t row, int64_t r, int64_t p, slot_t *sl) {
  int64_t K = f->K, M = f->M, r0 = row + p * f->tile, nr = min64(f->tile, r - p * f->tile);
  float *s = sl->s;
  const float *we = weights(f, sl, e);
  if (f->kind == FUSED_FWD) {
    gather_tile(f, K, 0, K, NULL, r0, nr, s);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nr, (int)M, (int)K, 1.0f, s,
                (int)K, we, (int)K, 0.0f, f->out + r0 * M, (int)M);
    return;
  }
  /* combine_grad: g = dout rows times w[e], written into dh, then scaled
   * there once its dot with h is taken. */
  gather_tile(f, M, 0, M, NULL, r0, nr, s);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nr, (int)K, (int)M, 1.0f, s,
              (int)M, we, (int)K, 0.0f, f->out + r0 * K, (int)K);
  rows_t hr = rows_at(f, sl, r0, nr, K, 0, K);
  for (int64_t i = r0; i < r0 + nr; i++) {
    int32_t slot = f->idx[i];
    float wt = f->wts[slot], *d = f->out + i * K;
    const float *h = hr.p + (i - r0) * hr.ld;
    double dot = 0.0;
#pragma omp simd reduction(+ : dot)
    for (int64_t c = 0; c < K; c++) {
      float g = d[c];
      dot += (double)g * h[c];
      d[c] = wt * g;
    }
    f->dweights[slot] = (float)dot;
  }
}

/* Slice p of the weight-gradient rows of expert e: the sum over its rows,
 * tile after tile (beta for the first, 1 after). */
static void dw_job(const fused_t *f, int64_t e, int64_t row, int64_t r, int64_t p, slot_t *sl) {
  float *s = sl->s;
  int64_t K = f->K, M = f->M, np = jobs_of(f, r);
  int64_t m0 = M * p / np, m1 = M * (p + 1) / np, mw = m1 - m0;
  float *d = f->out + e * M * K + m0 * K;
  if (r == 0) {
    if (f->beta == 0.0f)
      memset(d, 0, sizeof(float) * (size_t)(mw * K));
    else if (f->beta != 1.0f)
      for (int64_t i = 0; i < mw * K; i++)
        d[i] *= f->beta;
    return;
  }
  for (int64_t c0 = 0; c0 < r; c0 += f->tile) {
    int64_t nr = min64(f->tile, r - c0), r0 = row + c0;
    float beta = c0 == 0 ? f->beta : 1.0f;
    if (f->kind == FUSED_DW) {
      /* dy slice of the rows (in place) against the gathered x rows */
      gather_tile(f, K, 0, K, NULL, r0, nr, s);
      rows_t dy = rows_at(f, sl, r0, nr, M, m0, mw);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)mw, (int)K, (int)nr, 1.0f, dy.p,
                  (int)dy.ld, s, (int)K, beta, d, (int)K);
    } else {
      /* gathered, weight-scaled dout slice against the h rows (in place) */
      gather_tile(f, M, m0, mw, f->wts, r0, nr, s);
      rows_t h = rows_at(f, sl, r0, nr, K, 0, K);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)mw, (int)K, (int)nr, 1.0f, s,
                  (int)mw, h.p, (int)h.ld, beta, d, (int)K);
    }
  }
}

static void job(const fused_t *f, const cursor_t *c, int64_t j, slot_t *sl) {
  int64_t r = f->tpe[c->e];
  if (is_dw(f))
    dw_job(f, c->e, c->row, r, j - c->job, sl);
  else
    row_job(f, c->e, c->row, r, j - c->job, sl);
}

/* All jobs, on nt threads; the cursor only moves forward because the
 * monotonic schedule gives each thread its jobs in increasing order. */
static void run_jobs(const fused_t *f, int nt) {
  XM_ASSERT(f->tile > 0 && f->scratch);
  int64_t total = 0;
  for (int64_t e = 0; e < f->E; e++)
    total += jobs_of(f, f->tpe[e]);
  if (nt <= 1) {
    cursor_t c = {0, 0, 0};
    slot_t sl = slot_of(f, 0);
    for (int64_t j = 0; j < total; j++) {
      seek(f, &c, j);
      job(f, &c, j, &sl);
    }
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    cursor_t c = {0, 0, 0};
    slot_t sl = slot_of(f, omp_get_thread_num());
#pragma omp for schedule(monotonic : dynamic, 1)
    for (int64_t j = 0; j < total; j++) {
      seek(f, &c, j);
      job(f, &c, j, &sl);
    }
  }
}

/* ---- token-owned sums: combine and dx ------------------------------------ */

/* The GEMM of tile j (expert c->e) into s: h rows times w[e]^T (combine,
 * s [nr,M]) or dy rows times w[e] (dx, s [nr,K]). The rows are contiguous
 * in h / dy, so nothing is gathered. */
static void sum_gemm(const fused_t *f, const cursor_t *c, int64_t j, slot_t *sl) {
  int64_t K = f->K, M = f->M, p = j - c->job, r0 = c->row + p * f->tile;
  int64_t nr = min64(f->tile, f->tpe[c->e] - p * f->tile);
  const float *we = weights(f, sl, c->e);
  if (f->kind == FUSED_COMBINE) {
    rows_t h = rows_at(f, sl, r0, nr, K, 0, K);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nr, (int)M, (int)K, 1.0f, h.p,
                (int)h.ld, we, (int)K, 0.0f, sl->s, (int)M);
  } else {
    rows_t dy = rows_at(f, sl, r0, nr, M, 0, M);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nr, (int)K, (int)M, 1.0f, dy.p,
                (int)dy.ld, we, (int)K, 0.0f, sl->s, (int)K);
  }
}

/* Adds the rows of tile j (its GEMM in s) whose token is in [t0, t1), in
 * row order; they are a sub-range of the tile (one expert: slots
 * increasing), found by binary search. */
static void sum_add(const fused_t *f, const cursor_t *c, int64_t j, const float *s, int64_t t0,
                    int64_t t1) {
  int64_t width = f->width, k = f->k, p = j - c->job, r0 = c->row + p * f->tile;
  int64_t nr = min64(f->tile, f->tpe[c->e] - p * f->tile);
  const int32_t *idx = f->idx + r0;
  int64_t a = lower_bound(idx, nr, t0 * k), b = lower_bound(idx, nr, t1 * k);
  for (int64_t i = a; i < b; i++) {
    int32_t slot = idx[i];
    float *o = f->out + (int64_t)(slot / k) * width;
    const float *src = s + i * width;
    if (f->kind == FUSED_COMBINE) {
      float w = f->wts[slot]; /* the expression of xm_k_scatter_combine */
#pragma omp simd
      for (int64_t c = 0; c < width; c++)
        o[c] += w * src[c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < width; c++)
        o[c] += src[c];
    }
  }
}

/* The tiles are the fixed ones of run_jobs, taken in rounds of one per
 * thread (thread q computes tile j0 + q into its scratch); after a barrier
 * every thread adds, from all the round's tiles in order, the rows of its
 * own tokens, then a barrier frees the scratch for the next round. Each
 * token thus gets its rows in row order, and every GEMM is the same call
 * whatever the thread count. */
static void run_tokens(const fused_t *f, int nt) {
  XM_ASSERT(f->tile > 0 && f->scratch);
  int64_t total = 0;
  for (int64_t e = 0; e < f->E; e++)
    total += jobs_of(f, f->tpe[e]);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    int64_t nth = omp_get_num_threads(), id = omp_get_thread_num(), tile = f->tile * f->width;
    int64_t t0 = f->T * id / nth, t1 = f->T * (id + 1) / nth;
    memset(f->out + t0 * f->width, 0, sizeof(float) * (size_t)((t1 - t0) * f->width));
    cursor_t mine = {0, 0, 0}, walk = {0, 0, 0};
    slot_t sl = slot_of(f, id);
    for (int64_t j0 = 0; j0 < total; j0 += nth) {
      if (j0 + id < total) {
        seek(f, &mine, j0 + id);
        sum_gemm(f, &mine, j0 + id, &sl);
      }
#pragma omp barrier
      for (int64_t q = 0; q < nth && j0 + q < total; q++) {
        seek(f, &walk, j0 + q);
        if (t0 < t1) sum_add(f, &walk, j0 + q, f->scratch + q * tile, t0, t1);
      }
#pragma omp barrier
    }
  }
}

/* ---- the kernels ----------------------------------------------------------- */

/* Runs the kernel `f` describes. Sizes where a GEMM dimension is 0 (cblas
 * rejects a leading dimension of 0) have nothing to multiply; the outputs
 * are their empty sums. */
static void run_fused(fused_t *f, int64_t slots) {
  int64_t E = f->E, K = f->K, M = f->M, T = f->T;
  int64_t n = total_rows(f->tpe, E);
  switch (f->kind) {
  case FUSED_FWD:
    if (n == 0 || M <= 0) return;
    if (K <= 0) {
      memset(f->out, 0, sizeof(float) * (size_t)(n * M));
      return;
    }
    run_jobs(f, team_size(n * K * M, slots));
    return;
  case FUSED_COMBINE:
  case FUSED_DX: {
    int64_t wout = f->kind == FUSED_COMBINE ? M : K, win = f->kind == FUSED_COMBINE ? K : M;
    if (T <= 0 || wout <= 0) return;
    if (n == 0 || win <= 0) {
      memset(f->out, 0, sizeof(float) * (size_t)(T * wout));
      return;
    }
    run_tokens(f, team_size(n * K * M, slots));
    return;
  }
  case FUSED_COMBINE_GRAD:
    if (T > 0 && f->k > 0) memset(f->dweights, 0, sizeof(float) * (size_t)(T * f->k));
    if (n == 0 || K <= 0) return;
    if (M <= 0) { /* g = 0: dh = 0, and so are the dots */
      memset(f->out, 0, sizeof(float) * (size_t)(n * K));
      return;
    }
    run_jobs(f, team_size(n * K * M, slots));
    return;
  case FUSED_DW:
  case FUSED_COMBINE_DW:
    if (E <= 0 || K <= 0 || M <= 0) return;
    run_jobs(f, team_size(n * K * M, slots));
    return;
  }
}

void xm_k_gather_grouped_matmul(const float *x, const int32_t *indices, const int32_t *tpe,
                                const float *w, float *y, int64_t E, int64_t K, int64_t M,
                                int64_t k, float *scratch, int64_t tile_rows, int64_t slots) {
  fused_t f = {.kind = FUSED_FWD, .tok = x, .w = w, .idx = indices, .tpe = tpe, .out = y,
               .scratch = scratch, .E = E, .K = K, .M = M, .k = k, .tile = tile_rows,
               .width = K};
  run_fused(&f, slots);
}

void xm_k_grouped_matmul_combine(const float *h, const float *w, const int32_t *tpe,
                                 const int32_t *indices, const float *weights, float *out,
                                 int64_t E, int64_t K, int64_t M, int64_t T, int64_t k,
                                 float *scratch, int64_t tile_rows, int64_t slots) {
  fused_t f = {.kind = FUSED_COMBINE, .rows = h, .w = w, .wts = weights, .idx = indices,
               .tpe = tpe, .out = out, .scratch = scratch, .E = E, .K = K, .M = M, .T = T,
               .k = k, .tile = tile_rows, .width = M};
  run_fused(&f, slots);
}

void xm_k_gather_grouped_matmul_dx(const float *dy, const float *w, const int32_t *tpe,
                                   const int32_t *indices, float *dx, int64_t E, int64_t K,
                                   int64_t M, int64_t T, int64_t k, float *scratch,
                                   int64_t tile_rows, int64_t slots) {
  fused_t f = {.kind = FUSED_DX, .rows = dy, .w = w, .idx = indices, .tpe = tpe, .out = dx,
               .scratch = scratch, .E = E, .K = K, .M = M, .T = T, .k = k, .tile = tile_rows,
               .width = K};
  run_fused(&f, slots);
}

void xm_k_gather_grouped_matmul_dw(const float *dy, const float *x, const int32_t *indices,
                                   const int32_t *tpe, float *dw, int64_t E, int64_t K,
                                   int64_t M, int64_t k, float beta, float *scratch,
                                   int64_t tile_rows, int64_t slots) {
  fused_t f = {.kind = FUSED_DW, .tok = x, .rows = dy, .idx = indices, .tpe = tpe, .out = dw,
               .scratch = scratch, .E = E, .K = K, .M = M, .k = k, .tile = tile_rows,
               .width = K, .beta = beta};
  run_fused(&f, slots);
}

void xm_k_grouped_matmul_combine_grad(const float *dout, const float *h, const float *w,
                                      const int32_t *tpe, const int32_t *indices,
                                      const float *weights, float *dh, float *dweights,
                                      int64_t E, int64_t K, int64_t M, int64_t T, int64_t k,
                                      float *scratch, int64_t tile_rows, int64_t slots) {
  fused_t f = {.kind = FUSED_COMBINE_GRAD, .tok = dout, .rows = h, .w = w, .wts = weights,
               .idx = indices, .tpe = tpe, .out = dh, .dweights = dweights, .scratch = scratch,
               .E = E, .K = K, .M = M, .T = T, .k = k, .tile = tile_rows, .width = M};
  run_fused(&f, slots);
}

void xm_k_grouped_matmul_combine_dw(const float *dout, const float *h, const int32_t *indices,
                                    const float *weights, const int32_t *tpe, float *dw,
                                    int64_t E, int64_t K, int64_t M, int64_t k, float beta,
                                    float *scratch, int64_t tile_rows, int64_t slots) {
  fused_t f = {.kind = FUSED_COMBINE_DW, .tok = dout, .rows = h, .wts = weights,
               .idx = indices, .tpe = tpe, .out = dw, .scratch = scratch, .E = E, .K = K,
               .M = M, .k = k, .tile = tile_rows, .width = M, .beta = beta};
  run_fused(&f, slots);
}

/* ---- bf16 operands ----------------------------------------------------------
 * The same kernels with every token, row and weight operand in bf16 (the
 * routing weights stay f32): the staged tiles, the row tiles the GEMMs read
 * and each expert's weight are widened to f32 on the way in (exact, so the
 * products are the bf16 products), accumulation and every result are f32.
 * ws holds each thread's widening buffers, xm_bf16_fused_ws_floats(). */

static void run_fused_bf16(fused_t *f, float *ws, int64_t slots) {
  int64_t wide = f->K > f->M ? f->K : f->M;
  f->ws = ws;
  f->ws_slot = (f->w16 ? f->M * f->K : 0) + f->tile * wide;
  run_fused(f, slots);
}

void xm_k_gather_grouped_matmul_bf16(const xm_bf16_t *x, const int32_t *indices,
                                     const int32_t *tpe, const xm_bf16_t *w, float *y, int64_t E,
                                     int64_t K, int64_t M, int64_t k, float *scratch,
                                     int64_t tile_rows, int64_t slots, float *ws) {
  fused_t f = {.kind = FUSED_FWD, .tok16 = x, .w16 = w, .idx = indices, .tpe = tpe, .out = y,
               .scratch = scratch, .E = E, .K = K, .M = M, .k = k, .tile = tile_rows,
               .width = K};
  run_fused_bf16(&f, ws, slots);
}

void xm_k_grouped_matmul_combine_bf16(const xm_bf16_t *h, const xm_bf16_t *w, const int32_t *tpe,
                                      const int32_t *indices, const float *weights, float *out,
                                      int64_t E, int64_t K, int64_t M, int64_t T, int64_t k,
                                      float *scratch, int64_t tile_rows, int64_t slots,
                                      float *ws) {
  fused_t f = {.kind = FUSED_COMBINE, .rows16 = h, .w16 = w, .wts = weights, .idx = indices,
               .tpe = tpe, .out = out, .scratch = scratch, .E = E, .K = K, .M = M, .T = T,
               .k = k, .tile = tile_rows, .width = M};
  run_fused_bf16(&f, ws, slots);
}

void xm_k_gather_grouped_matmul_dx_bf16(const xm_bf16_t *dy, const xm_bf16_t *w,
                                        const int32_t *tpe, const int32_t *indices, float *dx,
                                        int64_t E, int64_t K, int64_t M, int64_t T, int64_t k,
                                        float *scratch, int64_t tile_rows, int64_t slots,
                                        float *ws) {
  fused_t f = {.kind = FUSED_DX, .rows16 = dy, .w16 = w, .idx = indices, .tpe = tpe, .out = dx,
               .scratch = scratch, .E = E, .K = K, .M = M, .T = T, .k = k, .tile = tile_rows,
               .width = K};
  run_fused_bf16(&f, ws, slots);
}

void xm_k_gather_grouped_matmul_dw_bf16(const xm_bf16_t *dy, const xm_bf16_t *x,
                                        const int32_t *indices, const int32_t *tpe, float *dw,
                                        int64_t E, int64_t K, int64_t M, int64_t k, float beta,
                                        float *scratch, int64_t tile_rows, int64_t slots,
                                        float *ws) {
  fused_t f = {.kind = FUSED_DW, .tok16 = x, .rows16 = dy, .idx = indices, .tpe = tpe,
               .out = dw, .scratch = scratch, .E = E, .K = K, .M = M, .k = k, .tile = tile_rows,
               .width = K, .beta = beta};
  run_fused_bf16(&f, ws, slots);
}

void xm_k_grouped_matmul_combine_grad_bf16(const xm_bf16_t *dout, const xm_bf16_t *h,
                                           const xm_bf16_t *w, const int32_t *tpe,
                                           const int32_t *indices, const float *weights,
                                           float *dh, float *dweights, int64_t E, int64_t K,
                                           int64_t M, int64_t T, int64_t k, float *scratch,
                                           int64_t tile_rows, int64_t slots, float *ws) {
  fused_t f = {.kind = FUSED_COMBINE_GRAD, .tok16 = dout, .rows16 = h, .w16 = w,
               .wts = weights, .idx = indices, .tpe = tpe, .out = dh, .dweights = dweights,
               .scratch = scratch, .E = E, .K = K, .M = M, .T = T, .k = k, .tile = tile_rows,
               .width = M};
  run_fused_bf16(&f, ws, slots);
}

void xm_k_grouped_matmul_combine_dw_bf16(const xm_bf16_t *dout, const xm_bf16_t *h,
                                         const int32_t *indices, const float *weights,
                                         const int32_t *tpe, float *dw, int64_t E, int64_t K,
                                         int64_t M, int64_t k, float beta, float *scratch,
                                         int64_t tile_rows, int64_t slots, float *ws) {
  fused_t f = {.kind = FUSED_COMBINE_DW, .tok16 = dout, .rows16 = h, .wts = weights,
               .idx = indices, .tpe = tpe, .out = dw, .scratch = scratch, .E = E, .K = K,
               .M = M, .k = k, .tile = tile_rows, .width = M, .beta = beta};
  run_fused_bf16(&f, ws, slots);
}
