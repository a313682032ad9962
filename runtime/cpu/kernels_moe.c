/* runtime/cpu/kernels_moe.c — router and padding-free MoE kernels (fp32).
 *
 * The MoE block of docs/design.md, Model semantics and Padding-free token permutation on the CPU:
 * scoring, group-limited top-k routing, the padding-free permutation (a stable counting sort of the
 * T*k token slots by expert, optionally dropping the lowest-weight slots of
 * an expert over capacity), the row gather into the expert-sorted buffer,
 * grouped GEMMs over the variable-size expert groups and the weighted
 * scatter back to tokens, plus the aux load-balancing loss. Every backward
 * kernel sits next to its forward one. Multi-rank expert parallelism adds
 * the chunk sort between the all-to-all's (member, local expert) row order
 * and the grouped GEMMs' expert-major order, and its inverse.
 *
 * Accumulations into token rows (gather backward, scatter forward) never use
 * atomics: each thread owns a contiguous range of tokens and scans all rows,
 * touching only its own tokens. The row order of the sums is therefore the
 * expert-sorted order whatever the thread count, so results are bitwise
 * reproducible across runs and ranks. Small problems stay serial: the
 * OpenMP start-up costs more than the work below XM_K_PAR_MIN elements.
 */
#define _GNU_SOURCE /* qsort_r */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "runtime/cpu/kernels.h"
#include "support/status.h"

/* `omp simd` asks for vectorisation; where the compiler cannot give it
 * (Clang with sanitizers), the scalar loop is just as right, so that is
 * not an error. */
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

#define XM_K_PAR_MIN 32768

/* ---- scoring ------------------------------------------------------------ */

static void softmax_row(const float *x, float *y, int64_t E) {
  float mx = x[0];
  for (int64_t e = 1; e < E; e++)
    mx = x[e] > mx ? x[e] : mx;
  double sum = 0.0;
  for (int64_t e = 0; e < E; e++) {
    y[e] = expf(x[e] - mx);
    sum += y[e];
  }
  float inv = (float)(1.0 / sum);
  for (int64_t e = 0; e < E; e++)
    y[e] *= inv;
}

void xm_k_router_score(const float *logits, float *scores, int64_t T, int64_t E, int scoring) {
  if (E <= 0) return;
#pragma omp parallel for schedule(static) if (T * E > XM_K_PAR_MIN)
  for (int64_t t = 0; t < T; t++) {
    const float *x = logits + t * E;
    float *y = scores + t * E;
    if (scoring == XM_K_SIGMOID) {
      for (int64_t e = 0; e < E; e++)
        y[e] = 1.0f / (1.0f + expf(-x[e]));
    } else {
      softmax_row(x, y, E);
    }
  }
}

/* Both Jacobians are functions of the output alone, so the logits need not
 * be kept alive for the backward pass. */
void xm_k_router_score_grad(const float *dscores, const float *scores, float *dlogits, int64_t T,
                            int64_t E, int scoring) {
#pragma omp parallel for schedule(static) if (T * E > XM_K_PAR_MIN)
  for (int64_t t = 0; t < T; t++) {
    const float *dy = dscores + t * E, *y = scores + t * E;
    float *dx = dlogits + t * E;
    if (scoring == XM_K_SIGMOID) {
      for (int64_t e = 0; e < E; e++)
        dx[e] = dy[e] * y[e] * (1.0f - y[e]);
    } else {
      double dot = 0.0;
      for (int64_t e = 0; e < E; e++)
        dot += (double)dy[e] * y[e];
      for (int64_t e = 0; e < E; e++)
        dx[e] = y[e] * (dy[e] - (float)dot);
    }
  }
}

/* ---- top-k routing -------------------------------------------------------- */

/* Index of the largest value among the candidates (ties: lower index), or -1
 * when there is none. `skip` marks the excluded entries. */
static int64_t argmax_free(const float *v, const unsigned char *skip, int64_t n) {
  int64_t best = -1;
  for (int64_t i = 0; i < n; i++) {
    if (skip[i]) continue;
    if (best < 0 || v[i] > v[best]) best = i;
  }
  return best;
}

/* Marks in `masked` the experts of the groups that do not make the best
 * topk_group (ties: lower group index). A group scores the max of its
 * choices (softmax) or the sum of its two best choices (sigmoid), as in
 * DeepSeek-V2 and V3. */
static void mask_groups(const float *choice, unsigned char *masked, unsigned char *gtaken,
                        float *gscore, int64_t E, int64_t n_group, int64_t topk_group,
                        int scoring) {
  int64_t gs = E / n_group;
  for (int64_t g = 0; g < n_group; g++) {
    const float *c = choice + g * gs;
    int64_t i0 = 0;
    for (int64_t i = 1; i < gs; i++)
      i0 = c[i] > c[i0] ? i : i0;
    float s = c[i0];
    if (scoring == XM_K_SIGMOID && gs > 1) {
      int64_t i1 = -1;
      for (int64_t i = 0; i < gs; i++)
        if (i != i0 && (i1 < 0 || c[i] > c[i1])) i1 = i;
      s += c[i1];
    }
    gscore[g] = s;
    gtaken[g] = 0;
  }
  for (int64_t j = 0; j < topk_group && j < n_group; j++) {
    int64_t g = argmax_free(gscore, gtaken, n_group);
    gtaken[g] = 1;
  }
  for (int64_t e = 0; e < E; e++)
    masked[e] = !gtaken[e / gs];
}

/* Routes one token. Scratch: choice[E], gscore[n_group], flags[2E + n_group]. */
static void route_token(const float *s, const float *bias, int32_t *ex, float *w, int64_t E,
                        int64_t k, int64_t n_group, int64_t topk_group, int norm_topk_prob,
                        float routed_scaling, int scoring, float *choice, float *gscore,
                        unsigned char *flags) {
  unsigned char *masked = flags, *taken = flags + E, *gtaken = flags + 2 * E;
  for (int64_t e = 0; e < E; e++) {
    choice[e] = s[e] + (bias ? bias[e] : 0.0f);
    masked[e] = 0;
  }
  if (n_group > 1 && E % n_group == 0 && topk_group < n_group)
    mask_groups(choice, masked, gtaken, gscore, E, n_group, topk_group, scoring);
  for (int64_t e = 0; e < E; e++)
    taken[e] = masked[e];
  double sum = 0.0;
  for (int64_t j = 0; j < k; j++) {
    int64_t e = argmax_free(choice, taken, E);
    if (e < 0) { /* more picks than kept experts: the spec forbids it; stay in range */
      for (int64_t i = 0; i < E; i++)
        taken[i] = taken[i] && !masked[i];
      for (int64_t i = 0; i < j; i++)
        taken[ex[i]] = 1;
      e = argmax_free(choice, taken, E);
      XM_ASSERT(e >= 0); /* k <= E is checked when the spec is validated */
    }
    taken[e] = 1;
    ex[j] = (int32_t)e;
    w[j] = s[e];
    sum += s[e];
  }
  float f = routed_scaling;
  if (norm_topk_prob) f = (float)(routed_scaling / sum);
  for (int64_t j = 0; j < k; j++)
    w[j] *= f;
}

void xm_k_topk_route(const float *scores, const float *bias, int32_t *experts, float *weights,
                     int64_t T, int64_t E, int64_t k, int64_t n_group, int64_t topk_group,
                     int norm_topk_prob, float routed_scaling, int scoring) {
  if (E <= 0 || k <= 0) return;
  int64_t ng = n_group > 1 ? n_group : 1;
#pragma omp parallel if (T * E > XM_K_PAR_MIN)
  {
    /* Per-thread scratch on the stack: E is at most a few thousand. */
    float choice[E + ng];
    unsigned char flags[2 * E + ng];
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; t++)
      route_token(scores + t * E, bias, experts + t * k, weights + t * k, E, k, n_group, topk_group,
                  norm_topk_prob, routed_scaling, scoring, choice, choice + E, flags);
  }
}

/* w_j = r s_j / S with S = sum of the chosen scores (or w_j = r s_j):
 * ds_i = r (dw_i - sum_j dw_j w_j / r) / S. The selection itself is piecewise
 * constant and has no gradient. */
void xm_k_topk_route_grad(const float *dweights, const float *scores, const int32_t *experts,
                          float *dscores, int64_t T, int64_t E, int64_t k, int norm_topk_prob,
                          float routed_scaling) {
#pragma omp parallel for schedule(static) if (T * E > XM_K_PAR_MIN)
  for (int64_t t = 0; t < T; t++) {
    const float *s = scores + t * E, *dw = dweights + t * k;
    const int32_t *ex = experts + t * k;
    float *ds = dscores + t * E;
    memset(ds, 0, sizeof(float) * (size_t)E);
    if (!norm_topk_prob) {
      for (int64_t j = 0; j < k; j++)
        ds[ex[j]] += routed_scaling * dw[j];
      continue;
    }
    double sum = 0.0, dot = 0.0;
    for (int64_t j = 0; j < k; j++) {
      sum += s[ex[j]];
      dot += (double)dw[j] * s[ex[j]];
    }
    double r = routed_scaling;
    for (int64_t j = 0; j < k; j++)
      ds[ex[j]] += (float)(r * (dw[j] / sum - dot / (sum * sum)));
  }
}

/* ---- padding-free permutation ------------------------------------------- */

/* Orders the slots of one over-full expert by weight, highest first, ties to
 * the lower slot. */
static int cmp_weight_desc(const void *a, const void *b, void *ctx) {
  const float *w = ctx;
  int32_t ia = *(const int32_t *)a, ib = *(const int32_t *)b;
  if (w[ia] > w[ib]) return -1;
  if (w[ia] < w[ib]) return 1;
  return (ia > ib) - (ia < ib);
}

static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* Keeps the best `capacity` slots of each expert group of the sorted
 * `indices` (which holds all N slots) and compacts the groups in place; the
 * kept slots stay in slot order. Groups only move left, so memmove is safe. */
static int64_t drop_over_capacity(const float *weights, int32_t *indices, int32_t *tpe, int64_t E,
                                  int64_t capacity) {
  int64_t rd = 0, wr = 0;
  for (int64_t e = 0; e < E; e++) {
    int64_t cnt = tpe[e];
    int32_t *seg = indices + rd;
    if (cnt > capacity) {
      qsort_r(seg, (size_t)cnt, sizeof *seg, cmp_weight_desc, (void *)weights);
      qsort(seg, (size_t)capacity, sizeof *seg, cmp_i32);
      cnt = capacity;
    }
    memmove(indices + wr, seg, sizeof *seg * (size_t)cnt);
    rd += tpe[e];
    wr += cnt;
    tpe[e] = (int32_t)cnt;
  }
  return wr;
}

/* tpe serves as the scatter cursor: it holds the start of each expert's
 * rows before the scatter and the end after it, from which the counts come
 * back without any scratch memory. */
int64_t xm_k_permute(const int32_t *experts, const float *weights, int32_t *indices,
                     int32_t *bin_ids, int32_t *tpe, int64_t T, int64_t k, int64_t E,
                     int64_t capacity) {
  int64_t N = T * k;
  memset(tpe, 0, sizeof(int32_t) * (size_t)E);
  for (int64_t i = 0; i < N; i++)
    tpe[experts[i]]++;
  int64_t off = 0;
  for (int64_t e = 0; e < E; e++) {
    int64_t c = tpe[e];
    tpe[e] = (int32_t)off;
    off += c;
  }
  for (int64_t i = 0; i < N; i++)
    indices[tpe[experts[i]]++] = (int32_t)i;
  for (int64_t e = E - 1; e > 0; e--)
    tpe[e] -= tpe[e - 1];
  int64_t n = N;
  if (capacity > 0) n = drop_over_capacity(weights, indices, tpe, E, capacity);
  int64_t row = 0;
  for (int64_t e = 0; e < E; e++)
    for (int32_t r = 0; r < tpe[e]; r++)
      bin_ids[row++] = (int32_t)e;
  return n;
}

/* ---- gather and scatter -------------------------------------------------- */

void xm_k_gather_rows(const float *x, const int32_t *indices, float *y, int64_t n, int64_t H,
                      int64_t k) {
#pragma omp parallel for schedule(static) if (n * H > XM_K_PAR_MIN)
  for (int64_t i = 0; i < n; i++)
    memcpy(y + i * H, x + (int64_t)(indices[i] / k) * H, sizeof(float) * (size_t)H);
}

/* The token range [t0, t1) that thread `id` of `nt` owns. */
static void token_range(int64_t T, int64_t *t0, int64_t *t1) {
  int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
  *t0 = T * id / nt;
  *t1 = T * (id + 1) / nt;
}

void xm_k_gather_rows_grad(const float *dy, const int32_t *indices, float *dx, int64_t n, int64_t T,
                           int64_t H, int64_t k) {
#pragma omp parallel if (n * H > XM_K_PAR_MIN)
  {
    int64_t t0, t1;
    token_range(T, &t0, &t1);
    memset(dx + t0 * H, 0, sizeof(float) * (size_t)((t1 - t0) * H));
    for (int64_t i = 0; i < n; i++) {
      int64_t t = indices[i] / k;
      if (t < t0 || t >= t1) continue;
      float *d = dx + t * H;
      const float *s = dy + i * H;
#pragma omp simd
      for (int64_t c = 0; c < H; c++)
        d[c] += s[c];
    }
  }
}

void xm_k_scatter_combine(const float *y, const int32_t *indices, const float *weights, float *out,
                          int64_t n, int64_t T, int64_t k, int64_t H) {
#pragma omp parallel if (n * H > XM_K_PAR_MIN)
  {
    int64_t t0, t1;
    token_range(T, &t0, &t1);
    memset(out + t0 * H, 0, sizeof(float) * (size_t)((t1 - t0) * H));
    for (int64_t i = 0; i < n; i++) {
      int64_t t = indices[i] / k;
      if (t < t0 || t >= t1) continue;
      float w = weights[indices[i]], *o = out + t * H;
      const float *s = y + i * H;
#pragma omp simd
      for (int64_t c = 0; c < H; c++)
        o[c] += w * s[c];
    }
  }
}

/* Each slot occurs at most once among the kept rows, so the rows can be
 * processed in parallel without conflicts. */
void xm_k_scatter_combine_grad(const float *dout, const float *y, const int32_t *indices,
                               const float *weights, float *dy, float *dweights, int64_t n,
                               int64_t T, int64_t k, int64_t H) {
  memset(dweights, 0, sizeof(float) * (size_t)(T * k));
#pragma omp parallel for schedule(static) if (n * H > XM_K_PAR_MIN)
  for (int64_t i = 0; i < n; i++) {
    int32_t slot = indices[i];
    const float *g = dout + (int64_t)(slot / k) * H, *yi = y + i * H;
    float w = weights[slot], *d = dy + i * H;
    double dot = 0.0;
#pragma omp simd reduction(+ : dot)
    for (int64_t c = 0; c < H; c++) {
      d[c] = w * g[c];
      dot += (double)g[c] * yi[c];
    }
    dweights[slot] = (float)dot;
  }
}

/* ---- grouped GEMMs -------------------------------------------------------- */

/* The expert GEMMs are small (a few hundred rows each at most), too small
 * for OpenBLAS to split well, and there are many of them, so they are
 * spread over the OpenMP team as whole single-threaded GEMMs. A job is one
 * expert or, for an expert with many rows, one slice of it: a slice of its
 * rows for the forward and dx GEMMs, a slice of its weight-gradient rows
 * for dw (which sums over the rows, so those are not cut). Jobs are handed
 * out dynamically, since experts get different row counts. This needs
 * OpenBLAS to run single-threaded (out/train sets it so); when it does not,
 * each GEMM is left to OpenBLAS's threads, one expert after the other.
 * Job j maps to its expert through a cursor each thread moves forward only
 * (the monotonic schedule hands a thread its jobs in increasing order, as
 * in kernels_fused.c), so no per-expert prefix table is built and the
 * kernels need no scratch: they never allocate. */

/* Rows of one job: experts of up to this many rows are one job, larger ones
 * are cut into about this many rows each. */
#define XM_K_GROUP_JOB_ROWS 256
/* Below this many multiply-adds in all the grouped GEMM stays serial. */
#define XM_K_GROUP_PAR_MIN ((int64_t)1 << 20)

typedef enum { GROUP_FWD, GROUP_DX, GROUP_DW } group_kind_t;

typedef struct {
  group_kind_t kind;
  const float *a, *w; /* a: x (fwd), dy (dx, dw); w: weights (fwd, dx), x (dw) */
  float *out;
  int64_t K, M;
  float beta; /* dw: 1 adds into out */
} group_args_t;

/* One job: piece `p` of `np` of expert e, whose rows start at `row`. */
static void group_job(const group_args_t *g, int64_t e, int64_t row, int64_t r, int64_t p,
                      int64_t np) {
  int64_t K = g->K, M = g->M;
  if (g->kind == GROUP_DW) {
    int64_t m0 = M * p / np, m1 = M * (p + 1) / np;
    float *d = g->out + e * M * K + m0 * K;
    if (r == 0) {
      if (g->beta == 0.0f) memset(d, 0, sizeof(float) * (size_t)((m1 - m0) * K));
      return;
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)(m1 - m0), (int)K, (int)r, 1.0f,
                g->a + row * M + m0, (int)M, g->w + row * K, (int)K, g->beta, d, (int)K);
    return;
  }
  int64_t r0 = row + r * p / np, nr = r * (p + 1) / np - r * p / np;
  if (nr == 0) return;
  const float *we = g->w + e * M * K;
  if (g->kind == GROUP_FWD)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nr, (int)M, (int)K, 1.0f,
                g->a + r0 * K, (int)K, we, (int)K, 0.0f, g->out + r0 * M, (int)M);
  else
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nr, (int)K, (int)M, 1.0f,
                g->a + r0 * M, (int)M, we, (int)K, 0.0f, g->out + r0 * K, (int)K);
}

static int64_t group_pieces(int64_t rows) {
  return rows <= XM_K_GROUP_JOB_ROWS ? 1 : (rows + XM_K_GROUP_JOB_ROWS / 2) / XM_K_GROUP_JOB_ROWS;
}

static void grouped(const group_args_t *g, const int32_t *tpe, int64_t E) {
  int64_t n = 0, total = 0;
  for (int64_t e = 0; e < E; e++) {
    n += tpe[e];
    total += group_pieces(tpe[e]);
  }
  int par = n * g->K * g->M >= XM_K_GROUP_PAR_MIN && !omp_in_parallel() &&
            omp_get_max_threads() > 1 && openblas_get_num_threads() == 1;
  if (!par) {
    for (int64_t e = 0, r0 = 0; e < E; r0 += tpe[e], e++)
      if (tpe[e] > 0 || g->kind == GROUP_DW) group_job(g, e, r0, tpe[e], 0, 1);
    return;
  }
#pragma omp parallel
  {
    /* Expert e of the cursor, its first row and its first job. */
    int64_t e = 0, row = 0, job = 0;
#pragma omp for schedule(monotonic : dynamic, 1)
    for (int64_t j = 0; j < total; j++) {
      while (j >= job + group_pieces(tpe[e])) {
        job += group_pieces(tpe[e]);
        row += tpe[e];
        e++;
      }
      group_job(g, e, row, tpe[e], j - job, group_pieces(tpe[e]));
    }
  }
}

void xm_k_grouped_matmul(const float *x, const float *w, const int32_t *tpe, float *y, int64_t E,
                         int64_t K, int64_t M) {
  group_args_t g = {GROUP_FWD, x, w, y, K, M, 0.0f};
  grouped(&g, tpe, E);
}

void xm_k_grouped_matmul_dx(const float *dy, const float *w, const int32_t *tpe, float *dx,
                            int64_t E, int64_t K, int64_t M) {
  group_args_t g = {GROUP_DX, dy, w, dx, K, M, 0.0f};
  grouped(&g, tpe, E);
}

void xm_k_grouped_matmul_dw(const float *dy, const float *x, const int32_t *tpe, float *dw,
                            int64_t E, int64_t K, int64_t M) {
  group_args_t g = {GROUP_DW, dy, x, dw, K, M, 0.0f};
  grouped(&g, tpe, E);
}

void xm_k_grouped_matmul_dw_acc(const float *dy, const float *x, const int32_t *tpe, float *dw,
                                int64_t E, int64_t K, int64_t M) {
  group_args_t g = {GROUP_DW, dy, x, dw, K, M, 1.0f};
  grouped(&g, tpe, E);
}

/* ---- chunk sort around the expert all-to-all ----------------------------- */

/* The rows an all-to-all delivers are grouped by source member p and, inside,
 * by this rank's local expert l (blocks (p, l), counts[p*L + l] rows each);
 * the grouped GEMMs want them expert-major (blocks (l, p)). Every block is
 * contiguous on both sides, so the permutation is one memcpy per block. The
 * offsets are recomputed per expert instead of kept in a table, so the
 * kernel allocates nothing: O(P L^2) integer adds, nothing next to the rows.
 * Experts are independent, so they go to different threads when the rows
 * are many. Negative counts (never produced by exchange_counts) count as 0. */
static int64_t chunk_count(const int32_t *counts, int64_t i) {
  return counts[i] > 0 ? counts[i] : 0;
}

static void chunk_permute(const float *x, const int32_t *counts, int64_t P, int64_t L,
                          int64_t width, float *y, int to_expert_major) {
  if (P <= 0 || L <= 0 || width <= 0) return;
  int64_t rows = 0;
  for (int64_t i = 0; i < P * L; i++)
    rows += chunk_count(counts, i);
#pragma omp parallel for schedule(dynamic, 1) if (rows * width > XM_K_PAR_MIN && L > 1)
  for (int64_t l = 0; l < L; l++) {
    /* expert-major offset of block (l, 0): all rows of experts before l */
    int64_t em = 0;
    for (int64_t p = 0; p < P; p++)
      for (int64_t j = 0; j < l; j++)
        em += chunk_count(counts, p * L + j);
    int64_t mm = 0; /* member-major offset of block (p, 0) */
    for (int64_t p = 0; p < P; p++) {
      int64_t in_row = mm;
      for (int64_t j = 0; j < l; j++)
        in_row += chunk_count(counts, p * L + j);
      int64_t n = chunk_count(counts, p * L + l);
      if (n > 0) {
        const float *src = x + (to_expert_major ? in_row : em) * width;
        float *dst = y + (to_expert_major ? em : in_row) * width;
        memcpy(dst, src, sizeof(float) * (size_t)(n * width));
      }
      em += n;
      for (int64_t j = 0; j < L; j++)
        mm += chunk_count(counts, p * L + j);
    }
  }
}

void xm_k_sort_chunks(const float *x, const int32_t *counts, int64_t P, int64_t L, int64_t width,
                      float *y) {
  chunk_permute(x, counts, P, L, width, y, 1);
}

void xm_k_unsort_chunks(const float *x, const int32_t *counts, int64_t P, int64_t L,
                        int64_t width, float *y) {
  chunk_permute(x, counts, P, L, width, y, 0);
}

/* ---- aux load-balancing loss --------------------------------------------- */

/* f_e counts every routed slot (dropped ones too: the router chose them) and
 * is a constant of the loss; only P_e carries a gradient. The forward pass
 * walks the experts in chunks so that the counts fit on the stack. */
#define XM_K_AUX_CHUNK 256

void xm_k_aux_loss(const float *scores, const int32_t *experts, float *loss, int64_t T, int64_t E,
                   int64_t k, float alpha) {
  int64_t N = T * k;
  double total = 0.0;
  for (int64_t e0 = 0; e0 < E; e0 += XM_K_AUX_CHUNK) {
    int64_t ne = E - e0 < XM_K_AUX_CHUNK ? E - e0 : XM_K_AUX_CHUNK;
    int64_t count[XM_K_AUX_CHUNK] = {0};
    double p[XM_K_AUX_CHUNK] = {0};
    for (int64_t i = 0; i < N; i++)
      if (experts[i] >= e0 && experts[i] < e0 + ne) count[experts[i] - e0]++;
    for (int64_t t = 0; t < T; t++)
      for (int64_t e = 0; e < ne; e++)
        p[e] += scores[t * E + e0 + e];
    for (int64_t e = 0; e < ne; e++)
      total += (double)E / (double)(k * T) * (double)count[e] * (p[e] / (double)T);
  }
  *loss = N > 0 ? (float)(alpha * total) : 0.0f;
}

/* The gradient row is the same for every token: build it in row 0 (slot
 * counts are exact in fp32 below 2^24), then copy it down. */
void xm_k_aux_loss_grad(const float *dloss, const float *scores, const int32_t *experts,
                        float *dscores, int64_t T, int64_t E, int64_t k, float alpha) {
  (void)scores;
  if (T <= 0) return;
  float *g = dscores;
  memset(g, 0, sizeof(float) * (size_t)E);
  for (int64_t i = 0; i < T * k; i++)
    g[experts[i]] += 1.0f;
  double c = (double)*dloss * alpha * (double)E / ((double)k * (double)T * (double)T);
  for (int64_t e = 0; e < E; e++)
    g[e] = (float)(c * g[e]);
#pragma omp parallel for schedule(static) if (T * E > XM_K_PAR_MIN)
  for (int64_t t = 1; t < T; t++)
    memcpy(dscores + t * E, g, sizeof(float) * (size_t)E);
}
