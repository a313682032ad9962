/* tests/unit/test_kernels_moe.c — router and padding-free MoE kernels
 * (runtime/cpu/kernels_moe.c).
 *
 * Forward kernels are checked on small hand-computed cases (exact experts
 * and weights, ties, group-limited routing for both scorings, bias used for
 * choosing only, capacity dropping) and against naive references written
 * here. Backward kernels are checked against central finite differences of
 * a scalar loss L = sum(c * forward(x)) with fixed random c: step h = 1e-2
 * (in fp32; the loss is summed in double), tolerance |num - ana| <= 2e-3 +
 * 1e-2 |ana|. Output buffers are pre-filled with garbage to check that the
 * kernels overwrite them. The chunk sort of the expert all-to-all is
 * checked on a hand-written case with empty blocks (exact row order), its
 * round trip, the one-member and one-expert identities, and a large case
 * against a naive reference.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cpu/kernels.h"
#include "tests/unit/kernel_rng.h"

/* ---- helpers ------------------------------------------------------------- */

#define GARBAGE 777.0f
#define FD_H 1e-2f
#define FD_ATOL 2e-3
#define FD_RTOL 1e-2


static void fill_rand(float *x, int64_t n, float lo, float hi) {
  for (int64_t i = 0; i < n; i++)
    x[i] = frand(lo, hi);
}

static void fill(float *x, int64_t n, float v) {
  for (int64_t i = 0; i < n; i++)
    x[i] = v;
}

static void assert_close(double got, double want, double tol, const char *what, int64_t i) {
  if (!(fabs(got - want) <= tol)) {
    fail_msg("%s[%lld]: got %.9g, want %.9g (tol %.3g)", what, (long long)i, got, want, tol);
  }
}

static void assert_all_close(const float *got, const float *want, int64_t n, double tol,
                             const char *what) {
  for (int64_t i = 0; i < n; i++)
    assert_close(got[i], want[i], tol, what, i);
}

static double dot(const float *a, const float *b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; i++)
    s += (double)a[i] * b[i];
  return s;
}

/* A scalar loss of the input x (n floats) given a context. */
typedef double (*loss_fn)(const float *x, void *ctx);

/* Compares `grad` with central differences of `f` at x (x is restored). */
static void check_fd(loss_fn f, void *ctx, float *x, int64_t n, const float *grad,
                     const char *what) {
  for (int64_t i = 0; i < n; i++) {
    float x0 = x[i];
    float xp = x0 + FD_H, xm = x0 - FD_H;
    x[i] = xp;
    double lp = f(x, ctx);
    x[i] = xm;
    double lm = f(x, ctx);
    x[i] = x0;
    double num = (lp - lm) / ((double)xp - (double)xm);
    assert_close(grad[i], num, FD_ATOL + FD_RTOL * fabs(num), what, i);
  }
}

/* ---- scoring --------------------------------------------------------------- */

static void test_router_score_values(void **state) {
  (void)state;
  float logits[9] = {0.0f, logf(2.0f), logf(5.0f), 1000.0f, 0.0f, -1000.0f, 3.0f, 3.0f, 3.0f};
  float s[9];
  fill(s, 9, GARBAGE);
  xm_k_router_score(logits, s, 3, 3, XM_K_SOFTMAX);
  float want[9] = {1.0f / 8, 2.0f / 8, 5.0f / 8, 1.0f, 0.0f, 0.0f, 1.0f / 3, 1.0f / 3, 1.0f / 3};
  assert_all_close(s, want, 9, 1e-6, "softmax");

  float sl[4] = {0.0f, logf(3.0f), -logf(3.0f), -200.0f}, ss[4];
  xm_k_router_score(sl, ss, 2, 2, XM_K_SIGMOID);
  float sw[4] = {0.5f, 0.75f, 0.25f, 0.0f};
  assert_all_close(ss, sw, 4, 1e-6, "sigmoid");
}

typedef struct {
  int64_t T, E;
  int scoring;
  const float *c;
  float *tmp;
} score_ctx_t;

static double score_loss(const float *x, void *p) {
  score_ctx_t *c = p;
  xm_k_router_score(x, c->tmp, c->T, c->E, c->scoring);
  return dot(c->c, c->tmp, c->T * c->E);
}

static void test_router_score_grad_fd(void **state) {
  (void)state;
  enum { T = 3, E = 5 };
  for (int scoring = XM_K_SOFTMAX; scoring <= XM_K_SIGMOID; scoring++) {
    float logits[T * E], c[T * E], s[T * E], tmp[T * E], dl[T * E];
    fill_rand(logits, T * E, -2.0f, 2.0f);
    fill_rand(c, T * E, -1.0f, 1.0f);
    xm_k_router_score(logits, s, T, E, scoring);
    fill(dl, T * E, GARBAGE);
    xm_k_router_score_grad(c, s, dl, T, E, scoring);
    score_ctx_t ctx = {T, E, scoring, c, tmp};
    check_fd(score_loss, &ctx, logits, T * E, dl,
             scoring == XM_K_SOFTMAX ? "softmax dlogits" : "sigmoid dlogits");
  }
}

/* ---- top-k routing ---------------------------------------------------------- */

static void route1(const float *scores, const float *bias, int64_t E, int64_t k, int64_t n_group,
                   int64_t topk_group, int norm, float scaling, int scoring, int32_t *ex,
                   float *w) {
  for (int64_t j = 0; j < k; j++) {
    ex[j] = -1;
    w[j] = GARBAGE;
  }
  xm_k_topk_route(scores, bias, ex, w, 1, E, k, n_group, topk_group, norm, scaling, scoring);
}

static void assert_route(const int32_t *ex, const float *w, const int32_t *want_ex,
                         const float *want_w, int64_t k) {
  for (int64_t j = 0; j < k; j++)
    assert_int_equal(ex[j], want_ex[j]);
  assert_all_close(w, want_w, k, 1e-6, "weights");
}

static void test_topk_basic(void **state) {
  (void)state;
  /* Two tokens in one call: rows must not mix. */
  float s[8] = {0.1f, 0.4f, 0.2f, 0.3f, 0.3f, 0.1f, 0.5f, 0.1f};
  int32_t ex[4];
  float w[4];
  xm_k_topk_route(s, NULL, ex, w, 2, 4, 2, 1, 1, 0, 1.0f, XM_K_SOFTMAX);
  int32_t e1[4] = {1, 3, 2, 0};
  float w1[4] = {0.4f, 0.3f, 0.5f, 0.3f};
  assert_route(ex, w, e1, w1, 4);

  /* norm_topk_prob on; then off with routed_scaling 2.5; then both. */
  route1(s, NULL, 4, 2, 1, 1, 1, 1.0f, XM_K_SOFTMAX, ex, w);
  float w2[2] = {0.4f / 0.7f, 0.3f / 0.7f};
  assert_route(ex, w, e1, w2, 2);
  route1(s, NULL, 4, 2, 1, 1, 0, 2.5f, XM_K_SOFTMAX, ex, w);
  float w3[2] = {1.0f, 0.75f};
  assert_route(ex, w, e1, w3, 2);
  route1(s, NULL, 4, 2, 1, 1, 1, 2.5f, XM_K_SIGMOID, ex, w);
  float w4[2] = {2.5f * 0.4f / 0.7f, 2.5f * 0.3f / 0.7f};
  assert_route(ex, w, e1, w4, 2);
}

static void test_topk_ties(void **state) {
  (void)state;
  int32_t ex[3];
  float w[3];
  float eq[4] = {0.25f, 0.25f, 0.25f, 0.25f};
  route1(eq, NULL, 4, 3, 1, 1, 0, 1.0f, XM_K_SOFTMAX, ex, w);
  int32_t e1[3] = {0, 1, 2};
  float w1[3] = {0.25f, 0.25f, 0.25f};
  assert_route(ex, w, e1, w1, 3);

  float s[5] = {0.1f, 0.3f, 0.05f, 0.3f, 0.3f};
  route1(s, NULL, 5, 2, 1, 1, 0, 1.0f, XM_K_SOFTMAX, ex, w);
  int32_t e2[2] = {1, 3};
  float w2[2] = {0.3f, 0.3f};
  assert_route(ex, w, e2, w2, 2);
}

/* The bias moves the choice but the weights stay the plain scores. */
static void test_topk_bias(void **state) {
  (void)state;
  float s[4] = {0.1f, 0.4f, 0.2f, 0.3f};
  float b[4] = {0.5f, 0.0f, -0.3f, 0.0f};
  int32_t ex[2];
  float w[2];
  route1(s, b, 4, 2, 1, 1, 0, 1.0f, XM_K_SIGMOID, ex, w);
  int32_t e1[2] = {0, 1};
  float w1[2] = {0.1f, 0.4f};
  assert_route(ex, w, e1, w1, 2);
  route1(s, b, 4, 2, 1, 1, 1, 2.0f, XM_K_SIGMOID, ex, w);
  float w2[2] = {2.0f * 0.1f / 0.5f, 2.0f * 0.4f / 0.5f};
  assert_route(ex, w, e1, w2, 2);
}

/* Softmax groups score by their max: groups {0,1} {2,3} {4,5} {6,7} score
 * .30 .20 .03 .25, so groups 0 and 3 stay and expert 2 (.20, third best
 * overall) is masked. */
static void test_topk_groups_softmax(void **state) {
  (void)state;
  float s[8] = {0.05f, 0.30f, 0.20f, 0.20f, 0.02f, 0.03f, 0.25f, 0.0f};
  int32_t ex[3];
  float w[3];
  route1(s, NULL, 8, 3, 1, 1, 0, 1.0f, XM_K_SOFTMAX, ex, w);
  int32_t e0[3] = {1, 6, 2};
  float w0[3] = {0.30f, 0.25f, 0.20f};
  assert_route(ex, w, e0, w0, 3);
  route1(s, NULL, 8, 3, 4, 2, 1, 1.0f, XM_K_SOFTMAX, ex, w);
  int32_t e1[3] = {1, 6, 0};
  float w1[3] = {0.30f / 0.6f, 0.25f / 0.6f, 0.05f / 0.6f};
  assert_route(ex, w, e1, w1, 3);
  /* Ties between groups go to the lower group: all groups score .5. */
  float t[8] = {0.5f, 0.1f, 0.2f, 0.5f, 0.5f, 0.4f, 0.5f, 0.45f};
  route1(t, NULL, 8, 2, 4, 2, 0, 1.0f, XM_K_SOFTMAX, ex, w);
  int32_t e2[2] = {0, 3};
  float w2[2] = {0.5f, 0.5f};
  assert_route(ex, w, e2, w2, 2);
}

/* Sigmoid groups score by the sum of their two best: 1.0, 1.2, 1.15, 0.4
 * keeps groups 1 and 2 although group 0 holds the best expert; the max rule
 * (softmax) would keep groups 0 and 2. The bias enters the group scores. */
static void test_topk_groups_sigmoid(void **state) {
  (void)state;
  float s[8] = {0.9f, 0.1f, 0.6f, 0.6f, 0.7f, 0.45f, 0.2f, 0.2f};
  int32_t ex[2];
  float w[2];
  route1(s, NULL, 8, 2, 4, 2, 1, 2.5f, XM_K_SIGMOID, ex, w);
  int32_t e1[2] = {4, 2};
  float w1[2] = {2.5f * 0.7f / 1.3f, 2.5f * 0.6f / 1.3f};
  assert_route(ex, w, e1, w1, 2);
  route1(s, NULL, 8, 2, 4, 2, 0, 1.0f, XM_K_SOFTMAX, ex, w);
  int32_t e2[2] = {0, 4};
  float w2[2] = {0.9f, 0.7f};
  assert_route(ex, w, e2, w2, 2);
  /* A bias of +1 on expert 7 lifts group 3 to 0.2 + 1.2 = 1.4: groups 3 and
   * 1 stay, and expert 7 wins with its plain score as its weight. */
  float b[8] = {0, 0, 0, 0, 0, 0, 0, 1.0f};
  route1(s, b, 8, 2, 4, 2, 0, 1.0f, XM_K_SIGMOID, ex, w);
  int32_t e3[2] = {7, 2};
  float w3[2] = {0.2f, 0.6f};
  assert_route(ex, w, e3, w3, 2);
}

typedef struct {
  int64_t T, E, k;
  int norm;
  float scaling;
  const float *c;
  const int32_t *ex0;
  int32_t *ex;
  float *w;
} topk_ctx_t;

static double topk_loss(const float *x, void *p) {
  topk_ctx_t *c = p;
  xm_k_topk_route(x, NULL, c->ex, c->w, c->T, c->E, c->k, 1, 1, c->norm, c->scaling, XM_K_SOFTMAX);
  for (int64_t i = 0; i < c->T * c->k; i++)
    assert_int_equal(c->ex[i], c->ex0[i]);
  return dot(c->c, c->w, c->T * c->k);
}

/* Scores are spaced 0.1 apart (a shuffled ladder) so a step of 1e-2 never
 * changes the selection; topk_loss asserts that it does not. */
static void test_topk_route_grad_fd(void **state) {
  (void)state;
  enum { T = 4, E = 8, K = 3 };
  for (int norm = 0; norm <= 1; norm++) {
    float s[T * E], c[T * K], w[T * K], ds[T * E], wtmp[T * K];
    int32_t ex[T * K], extmp[T * K];
    for (int64_t t = 0; t < T; t++)
      for (int64_t e = 0; e < E; e++)
        s[t * E + e] = 0.05f + 0.1f * (float)((e * 5 + t * 3) % E);
    fill_rand(c, T * K, -1.0f, 1.0f);
    xm_k_topk_route(s, NULL, ex, w, T, E, K, 1, 1, norm, 1.7f, XM_K_SOFTMAX);
    fill(ds, T * E, GARBAGE);
    xm_k_topk_route_grad(c, s, ex, ds, T, E, K, norm, 1.7f);
    for (int64_t t = 0; t < T; t++)
      for (int64_t e = 0; e < E; e++) {
        int chosen = 0;
        for (int64_t j = 0; j < K; j++)
          chosen |= ex[t * K + j] == e;
        if (!chosen) assert_true(ds[t * E + e] == 0.0f);
      }
    topk_ctx_t ctx = {T, E, K, norm, 1.7f, c, ex, extmp, wtmp};
    check_fd(topk_loss, &ctx, s, T * E, ds, norm ? "dscores (norm)" : "dscores");
  }
}

/* ---- permutation ------------------------------------------------------------ */

static void test_permute_dropless(void **state) {
  (void)state;
  int32_t experts[8] = {2, 0, 0, 2, 3, 2, 2, 0};
  float weights[8] = {0};
  int32_t idx[8], bins[8], tpe[4];
  for (int i = 0; i < 8; i++)
    idx[i] = bins[i] = -7;
  int64_t n = xm_k_permute(experts, weights, idx, bins, tpe, 4, 2, 4, 0);
  assert_int_equal(n, 8);
  int32_t want_idx[8] = {1, 2, 7, 0, 3, 5, 6, 4}, want_bins[8] = {0, 0, 0, 2, 2, 2, 2, 3};
  int32_t want_tpe[4] = {3, 0, 4, 1};
  assert_memory_equal(idx, want_idx, sizeof idx);
  assert_memory_equal(bins, want_bins, sizeof bins);
  assert_memory_equal(tpe, want_tpe, sizeof tpe);
}

/* Capacity 2: expert 0 drops slot 2 (lowest weight), expert 2 keeps slot 5
 * (0.9) and slot 0 (lowest slot of the 0.3 tie). Kept rows stay in slot
 * order; a large capacity drops nothing. */
static void test_permute_capacity(void **state) {
  (void)state;
  int32_t experts[8] = {2, 0, 0, 2, 3, 2, 2, 0};
  float weights[8] = {0.3f, 0.5f, 0.2f, 0.3f, 1.0f, 0.9f, 0.3f, 0.5f};
  int32_t idx[8], bins[8], tpe[4];
  int64_t n = xm_k_permute(experts, weights, idx, bins, tpe, 4, 2, 4, 2);
  assert_int_equal(n, 5);
  int32_t want_idx[5] = {1, 7, 0, 5, 4}, want_bins[5] = {0, 0, 2, 2, 3};
  int32_t want_tpe[4] = {2, 0, 2, 1};
  assert_memory_equal(idx, want_idx, sizeof want_idx);
  assert_memory_equal(bins, want_bins, sizeof want_bins);
  assert_memory_equal(tpe, want_tpe, sizeof want_tpe);

  n = xm_k_permute(experts, weights, idx, bins, tpe, 4, 2, 4, 4);
  assert_int_equal(n, 8);
  int32_t want_tpe4[4] = {3, 0, 4, 1};
  assert_memory_equal(tpe, want_tpe4, sizeof want_tpe4);

  /* The weights order the drop, not the slot: capacity 1 keeps slot 6. */
  float w2[8] = {0.3f, 0.5f, 0.2f, 0.3f, 1.0f, 0.1f, 0.8f, 0.5f};
  n = xm_k_permute(experts, w2, idx, bins, tpe, 4, 2, 4, 1);
  assert_int_equal(n, 3);
  int32_t want_idx1[3] = {1, 6, 4};
  assert_memory_equal(idx, want_idx1, sizeof want_idx1);
}

/* Token 1 sends all three slots to expert 2; expert 3 receives nothing.
 * With weights 1, scatter_combine(gather_rows(x)) == k * x. */
static void test_round_trip(void **state) {
  (void)state;
  enum { T = 5, K = 3, E = 4, H = 7 };
  int32_t experts[T * K] = {0, 1, 2, 2, 2, 2, 1, 0, 2, 0, 1, 2, 1, 0, 2};
  float ones[T * K], x[T * H], y[T * K * H], out[T * H];
  fill(ones, T * K, 1.0f);
  fill_rand(x, T * H, -3.0f, 3.0f);
  int32_t idx[T * K], bins[T * K], tpe[E];
  int64_t n = xm_k_permute(experts, ones, idx, bins, tpe, T, K, E, 0);
  assert_int_equal(n, T * K);
  assert_int_equal(tpe[3], 0);
  assert_int_equal(tpe[2], 7);
  fill(y, T * K * H, GARBAGE);
  xm_k_gather_rows(x, idx, y, n, H, K);
  for (int64_t i = 0; i < n; i++) {
    assert_int_equal(bins[i], experts[idx[i]]);
    assert_memory_equal(y + i * H, x + (idx[i] / K) * H, sizeof(float) * H);
  }
  fill(out, T * H, GARBAGE);
  xm_k_scatter_combine(y, idx, ones, out, n, T, K, H);
  for (int64_t i = 0; i < T * H; i++)
    assert_close(out[i], 3.0f * x[i], 1e-6, "k*x", i);
}

/* Naive combine over the kept rows, with dropped slots. */
static void test_scatter_combine_capacity(void **state) {
  (void)state;
  enum { T = 4, K = 2, E = 3, H = 5 };
  int32_t experts[T * K] = {0, 1, 0, 2, 0, 1, 0, 2};
  float w[T * K], x[T * H], y[T * K * H], out[T * H], want[T * H];
  fill_rand(w, T * K, 0.1f, 1.0f);
  fill_rand(x, T * H, -1.0f, 1.0f);
  int32_t idx[T * K], bins[T * K], tpe[E];
  int64_t n = xm_k_permute(experts, w, idx, bins, tpe, T, K, E, 2);
  assert_int_equal(n, 6);
  xm_k_gather_rows(x, idx, y, n, H, K);
  for (int64_t i = 0; i < n * H; i++)
    y[i] *= 1.0f + 0.1f * (float)(i % 7); /* expert output */
  int kept[T * K] = {0};
  for (int64_t i = 0; i < n; i++)
    kept[idx[i]] = 1;
  memset(want, 0, sizeof want);
  for (int64_t i = 0; i < n; i++)
    for (int64_t c = 0; c < H; c++)
      want[(idx[i] / K) * H + c] += w[idx[i]] * y[i * H + c];
  fill(out, T * H, GARBAGE);
  xm_k_scatter_combine(y, idx, w, out, n, T, K, H);
  assert_all_close(out, want, T * H, 1e-6, "combine");
  /* Of the four expert-0 slots the two lightest were dropped. */
  int dropped = 0;
  for (int64_t s = 0; s < T * K; s++)
    if (experts[s] == 0 && !kept[s]) {
      dropped++;
      for (int64_t o = 0; o < T * K; o++)
        if (experts[o] == 0 && kept[o]) assert_true(w[o] >= w[s]);
    }
  assert_int_equal(dropped, 2);
}

/* ---- gradients of gather, grouped GEMMs and scatter -------------------------- */

typedef struct {
  int64_t n, T, H, K, E, M, k;
  const int32_t *idx, *tpe;
  const float *c, *other, *w;
  float *tmp, *tmp2;
} moe_ctx_t;

static double gather_loss(const float *x, void *p) {
  moe_ctx_t *c = p;
  xm_k_gather_rows(x, c->idx, c->tmp, c->n, c->H, c->k);
  return dot(c->c, c->tmp, c->n * c->H);
}

static void test_gather_rows_grad_fd(void **state) {
  (void)state;
  enum { T = 4, K = 2, E = 3, H = 3 };
  int32_t experts[T * K] = {1, 1, 0, 2, 2, 0, 1, 2};
  float ones[T * K], x[T * H], c[T * K * H], tmp[T * K * H], dx[T * H];
  fill(ones, T * K, 1.0f);
  int32_t idx[T * K], bins[T * K], tpe[E];
  int64_t n = xm_k_permute(experts, ones, idx, bins, tpe, T, K, E, 0);
  fill_rand(x, T * H, -1.0f, 1.0f);
  fill_rand(c, n * H, -1.0f, 1.0f);
  fill(dx, T * H, GARBAGE);
  xm_k_gather_rows_grad(c, idx, dx, n, T, H, K);
  moe_ctx_t ctx = {.n = n, .T = T, .H = H, .k = K, .idx = idx, .c = c, .tmp = tmp};
  check_fd(gather_loss, &ctx, x, T * H, dx, "gather dx");
}

static double gmm_loss_x(const float *x, void *p) {
  moe_ctx_t *c = p;
  xm_k_grouped_matmul(x, c->other, c->tpe, c->tmp, c->E, c->K, c->M);
  return dot(c->c, c->tmp, c->n * c->M);
}

static double gmm_loss_w(const float *w, void *p) {
  moe_ctx_t *c = p;
  xm_k_grouped_matmul(c->other, w, c->tpe, c->tmp, c->E, c->K, c->M);
  return dot(c->c, c->tmp, c->n * c->M);
}

/* Expert 1 gets no rows: its dw must be zero, the other groups must match a
 * naive product and finite differences. */
static void test_grouped_matmul(void **state) {
  (void)state;
  enum { E = 4, K = 5, M = 3, N = 7 };
  int32_t tpe[E] = {2, 0, 4, 1};
  float x[N * K], w[E * M * K], y[N * M], c[N * M], dx[N * K], dw[E * M * K];
  fill_rand(x, N * K, -1.0f, 1.0f);
  fill_rand(w, E * M * K, -1.0f, 1.0f);
  fill_rand(c, N * M, -1.0f, 1.0f);
  fill(y, N * M, GARBAGE);
  xm_k_grouped_matmul(x, w, tpe, y, E, K, M);
  int64_t row = 0;
  for (int64_t e = 0; e < E; e++)
    for (int64_t r = 0; r < tpe[e]; r++, row++)
      for (int64_t m = 0; m < M; m++) {
        double s = dot(x + row * K, w + (e * M + m) * K, K);
        assert_close(y[row * M + m], s, 1e-5, "grouped y", row * M + m);
      }
  fill(dx, N * K, GARBAGE);
  fill(dw, E * M * K, GARBAGE);
  xm_k_grouped_matmul_dx(c, w, tpe, dx, E, K, M);
  xm_k_grouped_matmul_dw(c, x, tpe, dw, E, K, M);
  for (int64_t i = 0; i < M * K; i++)
    assert_true(dw[M * K + i] == 0.0f);
  float tmp[N * M];
  moe_ctx_t ctx = {.n = N, .E = E, .K = K, .M = M, .tpe = tpe, .c = c, .other = w, .tmp = tmp};
  check_fd(gmm_loss_x, &ctx, x, N * K, dx, "grouped dx");
  ctx.other = x;
  check_fd(gmm_loss_w, &ctx, w, E * M * K, dw, "grouped dw");
}

static double combine_loss_y(const float *y, void *p) {
  moe_ctx_t *c = p;
  xm_k_scatter_combine(y, c->idx, c->w, c->tmp, c->n, c->T, c->k, c->H);
  return dot(c->c, c->tmp, c->T * c->H);
}

static double combine_loss_w(const float *w, void *p) {
  moe_ctx_t *c = p;
  xm_k_scatter_combine(c->other, c->idx, w, c->tmp, c->n, c->T, c->k, c->H);
  return dot(c->c, c->tmp, c->T * c->H);
}

/* With capacity 2 some slots are dropped: their dweights are exactly 0 and
 * finite differences agree (the dropped weight does not enter the loss). */
static void test_scatter_combine_grad_fd(void **state) {
  (void)state;
  enum { T = 4, K = 2, E = 3, H = 4 };
  int32_t experts[T * K] = {0, 1, 0, 2, 0, 1, 0, 2};
  float w[T * K], y[T * K * H], dout[T * H], dy[T * K * H], dw[T * K], tmp[T * H];
  fill_rand(w, T * K, 0.1f, 1.0f);
  int32_t idx[T * K], bins[T * K], tpe[E];
  int64_t n = xm_k_permute(experts, w, idx, bins, tpe, T, K, E, 2);
  assert_int_equal(n, 6);
  fill_rand(y, n * H, -1.0f, 1.0f);
  fill_rand(dout, T * H, -1.0f, 1.0f);
  fill(dy, T * K * H, GARBAGE);
  fill(dw, T * K, GARBAGE);
  xm_k_scatter_combine_grad(dout, y, idx, w, dy, dw, n, T, K, H);
  int kept[T * K] = {0};
  for (int64_t i = 0; i < n; i++)
    kept[idx[i]] = 1;
  for (int64_t s = 0; s < T * K; s++)
    if (!kept[s]) assert_true(dw[s] == 0.0f);
  moe_ctx_t ctx = {.n = n, .T = T, .H = H, .k = K, .idx = idx, .c = dout, .w = w, .tmp = tmp};
  check_fd(combine_loss_y, &ctx, y, n * H, dy, "combine dy");
  ctx.other = y;
  check_fd(combine_loss_w, &ctx, w, T * K, dw, "combine dweights");
}

/* ---- aux loss ----------------------------------------------------------------- */

static void test_aux_loss_value(void **state) {
  (void)state;
  /* T=2, E=2, k=1, both tokens on expert 0: f = (2, 0), P_0 = 0.55. */
  float s[4] = {0.7f, 0.3f, 0.4f, 0.6f}, loss = GARBAGE;
  int32_t ex[2] = {0, 0};
  xm_k_aux_loss(s, ex, &loss, 2, 2, 1, 0.01f);
  assert_close(loss, 0.011, 1e-8, "aux loss", 0);
  /* T=3, E=3, k=2 by hand: counts (3, 2, 1), f = 3/6 * counts. */
  float s3[9] = {0.2f, 0.5f, 0.3f, 0.6f, 0.1f, 0.3f, 0.1f, 0.1f, 0.8f};
  int32_t ex3[6] = {1, 0, 0, 2, 0, 1};
  xm_k_aux_loss(s3, ex3, &loss, 3, 3, 2, 0.5f);
  double p0 = 0.9 / 3, p1 = 0.7 / 3, p2 = 1.4 / 3;
  double want = 0.5 * 0.5 * (3 * p0 + 2 * p1 + 1 * p2);
  assert_close(loss, want, 1e-7, "aux loss 3", 0);
}

typedef struct {
  const int32_t *ex;
  int64_t T, E, k;
  float alpha;
} aux_ctx_t;

static double aux_loss_of(const float *s, void *p) {
  aux_ctx_t *c = p;
  float l;
  xm_k_aux_loss(s, c->ex, &l, c->T, c->E, c->k, c->alpha);
  return l;
}

static void test_aux_loss_grad_fd(void **state) {
  (void)state;
  enum { T = 5, E = 6, K = 2 };
  float s[T * E], ds[T * E], dloss = 1.0f;
  int32_t ex[T * K] = {0, 3, 3, 1, 5, 3, 0, 1, 3, 2};
  fill_rand(s, T * E, 0.0f, 1.0f);
  fill(ds, T * E, GARBAGE);
  xm_k_aux_loss_grad(&dloss, s, ex, ds, T, E, K, 0.3f);
  assert_true(ds[4] == 0.0f); /* expert 4 got no slot */
  aux_ctx_t ctx = {ex, T, E, K, 0.3f};
  check_fd(aux_loss_of, &ctx, s, T * E, ds, "aux dscores");
  dloss = 2.0f;
  float ds2[T * E];
  xm_k_aux_loss_grad(&dloss, s, ex, ds2, T, E, K, 0.3f);
  for (int64_t i = 0; i < T * E; i++)
    assert_close(ds2[i], 2.0 * ds[i], 1e-7, "dloss scale", i);
}

/* Large enough that the OpenMP paths run: the routed round trip against a
 * serial naive reference. */
static void test_large_round_trip(void **state) {
  (void)state;
  const int64_t T = 512, K = 4, E = 16, H = 96;
  float *sc = malloc(sizeof(float) * T * E), *w = malloc(sizeof(float) * T * K);
  int32_t *ex = malloc(sizeof(int32_t) * T * K), *idx = malloc(sizeof(int32_t) * T * K);
  int32_t *bins = malloc(sizeof(int32_t) * T * K), tpe[16];
  float *x = malloc(sizeof(float) * T * H), *y = malloc(sizeof(float) * T * K * H);
  float *out = malloc(sizeof(float) * T * H), *dx = malloc(sizeof(float) * T * H);
  fill_rand(sc, T * E, -2.0f, 2.0f);
  xm_k_router_score(sc, sc, T, E, XM_K_SOFTMAX);
  xm_k_topk_route(sc, NULL, ex, w, T, E, K, 4, 2, 1, 1.0f, XM_K_SOFTMAX);
  fill_rand(x, T * H, -1.0f, 1.0f);
  int64_t n = xm_k_permute(ex, w, idx, bins, tpe, T, K, E, 0);
  assert_int_equal(n, T * K);
  xm_k_gather_rows(x, idx, y, n, H, K);
  xm_k_scatter_combine(y, idx, w, out, n, T, K, H);
  xm_k_gather_rows_grad(y, idx, dx, n, T, H, K);
  for (int64_t t = 0; t < T; t++) {
    double wsum = 0.0;
    for (int64_t j = 0; j < K; j++)
      wsum += w[t * K + j];
    assert_close(wsum, 1.0, 1e-5, "normalised weights", t);
    for (int64_t c = 0; c < H; c++) {
      assert_close(out[t * H + c], x[t * H + c], 1e-5, "combine", t * H + c);
      assert_close(dx[t * H + c], K * x[t * H + c], 1e-5, "gather grad", t * H + c);
    }
  }
  free(sc);
  free(w);
  free(ex);
  free(idx);
  free(bins);
  free(x);
  free(y);
  free(out);
  free(dx);
}

/* ---- chunk sort of the expert all-to-all ------------------------------- */

/* Row r of a test buffer carries 100 * r + e in element e, so a row's
 * origin can be read back from its values. */
static void fill_rows(float *x, int64_t rows, int64_t width) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t e = 0; e < width; e++)
      x[r * width + e] = (float)(100 * r + e);
}

/* P = 2 members, L = 3 local experts, zero counts on both sides. Member-major
 * input: (0,0) rows 0-1, (0,1) none, (0,2) row 2, (1,0) row 3, (1,1) rows
 * 4-6, (1,2) none. Expert-major output: expert 0 from member 0 (0, 1) then
 * member 1 (3); expert 1 from member 1 (4, 5, 6); expert 2 from member 0 (2). */
static void test_sort_chunks_order(void **state) {
  (void)state;
  const int64_t P = 2, L = 3, W = 2, N = 7;
  const int32_t counts[6] = {2, 0, 1, 1, 3, 0};
  const int64_t want[7] = {0, 1, 3, 4, 5, 6, 2};
  float x[N * W], y[(N + 1) * W], back[(N + 1) * W];
  fill_rows(x, N, W);
  fill(y, (N + 1) * W, GARBAGE);
  xm_k_sort_chunks(x, counts, P, L, W, y);
  for (int64_t r = 0; r < N; r++)
    for (int64_t e = 0; e < W; e++)
      assert_close(y[r * W + e], x[want[r] * W + e], 0.0, "sorted row", r);
  /* Nothing past the counted rows is written. */
  assert_close(y[N * W], GARBAGE, 0.0, "past the rows", N);
  fill(back, (N + 1) * W, GARBAGE);
  xm_k_unsort_chunks(y, counts, P, L, W, back);
  for (int64_t i = 0; i < N * W; i++)
    assert_close(back[i], x[i], 0.0, "round trip", i);
  assert_close(back[N * W], GARBAGE, 0.0, "past the rows", N);
  /* unsort alone on an expert-major buffer: the inverse permutation. */
  float em[N * W];
  fill_rows(em, N, W);
  fill(back, (N + 1) * W, GARBAGE);
  xm_k_unsort_chunks(em, counts, P, L, W, back);
  for (int64_t r = 0; r < N; r++)
    for (int64_t e = 0; e < W; e++)
      assert_close(back[want[r] * W + e], em[r * W + e], 0.0, "unsorted row", r);
}

/* All-zero counts and one member: nothing moves, or everything stays put. */
static void test_sort_chunks_edges(void **state) {
  (void)state;
  const int32_t zeros[4] = {0, 0, 0, 0};
  float x[8], y[8];
  fill_rows(x, 4, 2);
  fill(y, 8, GARBAGE);
  xm_k_sort_chunks(x, zeros, 2, 2, 2, y);
  xm_k_unsort_chunks(x, zeros, 2, 2, 2, y);
  for (int i = 0; i < 8; i++)
    assert_close(y[i], GARBAGE, 0.0, "zero counts", i);
  /* P = 1: (0, l) order is already expert-major. */
  const int32_t one[3] = {1, 0, 3};
  xm_k_sort_chunks(x, one, 1, 3, 2, y);
  for (int i = 0; i < 8; i++)
    assert_close(y[i], x[i], 0.0, "one member", i);
  /* L = 1: (p, 0) order is already expert-major too. */
  const int32_t col[3] = {2, 0, 2};
  fill(y, 8, GARBAGE);
  xm_k_unsort_chunks(x, col, 3, 1, 2, y);
  for (int i = 0; i < 8; i++)
    assert_close(y[i], x[i], 0.0, "one expert", i);
}

/* Large enough for the threaded path: against a naive reference that
 * walks (l, p) and searches each block's start from scratch. */
static void test_sort_chunks_large(void **state) {
  (void)state;
  const int64_t P = 8, L = 6, W = 64;
  int32_t counts[48];
  int64_t N = 0;
  for (int i = 0; i < P * L; i++) {
    counts[i] = (int32_t)(frand(0.0f, 1.0f) < 0.2f ? 0 : frand(0.0f, 40.0f));
    N += counts[i];
  }
  float *x = malloc(sizeof(float) * N * W), *y = malloc(sizeof(float) * N * W);
  float *back = malloc(sizeof(float) * N * W);
  fill_rows(x, N, W);
  xm_k_sort_chunks(x, counts, P, L, W, y);
  int64_t out = 0;
  for (int64_t l = 0; l < L; l++)
    for (int64_t p = 0; p < P; p++) {
      int64_t in = 0;
      for (int64_t i = 0; i < p * L + l; i++)
        in += counts[i];
      for (int64_t r = 0; r < counts[p * L + l]; r++, out++)
        for (int64_t e = 0; e < W; e++)
          if (y[out * W + e] != x[(in + r) * W + e])
            fail_msg("row %lld (block l %lld p %lld) differs", (long long)out, (long long)l,
                     (long long)p);
    }
  assert_int_equal(out, N);
  xm_k_unsort_chunks(y, counts, P, L, W, back);
  assert_memory_equal(back, x, sizeof(float) * (size_t)(N * W));
  free(x);
  free(y);
  free(back);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_router_score_values),
      cmocka_unit_test(test_router_score_grad_fd),
      cmocka_unit_test(test_topk_basic),
      cmocka_unit_test(test_topk_ties),
      cmocka_unit_test(test_topk_bias),
      cmocka_unit_test(test_topk_groups_softmax),
      cmocka_unit_test(test_topk_groups_sigmoid),
      cmocka_unit_test(test_topk_route_grad_fd),
      cmocka_unit_test(test_permute_dropless),
      cmocka_unit_test(test_permute_capacity),
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_scatter_combine_capacity),
      cmocka_unit_test(test_gather_rows_grad_fd),
      cmocka_unit_test(test_grouped_matmul),
      cmocka_unit_test(test_scatter_combine_grad_fd),
      cmocka_unit_test(test_aux_loss_value),
      cmocka_unit_test(test_aux_loss_grad_fd),
      cmocka_unit_test(test_large_round_trip),
      cmocka_unit_test(test_sort_chunks_order),
      cmocka_unit_test(test_sort_chunks_edges),
      cmocka_unit_test(test_sort_chunks_large),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
