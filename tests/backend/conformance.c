/* tests/backend/conformance.c — the backend conformance suite
 * (conformance.h says what it checks and with which tolerances).
 *
 * Every case follows the same steps: host inputs from the fixed-seed
 * generator, device buffers from be->alloc filled with copy_h2d (or with
 * fill32 garbage for outputs), one call through be->kernels, sync, the
 * outputs back with copy_d2h, and a comparison with the reference kernel run
 * on the host copies. An entry's buffers, host and device, are released when
 * it ends (a failed alloc ends it early), so nothing outlives the run.
 */
#include "tests/backend/conformance.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/abi/bf16.h" /* xm_bf16_gemm_ws_floats: the workspace contract */
#include "runtime/abi/kernels.h"
#include "runtime/abi/workspace.h" /* xm_ws_*: the f32 kernels' workspace contract */
#include "tests/backend/reference.h"

/* Scoring numbers of runtime/cpu/kernels.h. */
enum { SOFTMAX = 0, SIGMOID = 1 };

/* A quiet NaN with a payload: outputs start as this, so a kernel that leaves
 * an element unwritten shows NaN, and a region that must stay untouched is
 * checked bit for bit against it. */
#define GARBAGE_BITS 0x7fc5a5a5u
/* The guard after a fused kernel's scratch: finite, so it cannot be
 * confused with the NaN the scratch starts as. */
#define GUARD_BITS 0x4b1d2e3fu
#define GUARD_FLOATS 64
/* A bf16 NaN: bf16 outputs start as this (two per fill32 word). */
#define GARBAGE16 0x7fc5u
/* Rows past the routed n (and past a fill or copy) checked for garbage. */
#define TAIL 5

typedef struct {
  double rtol, atol;
} tol_t;

/* conformance.h, Tolerances. */
static const tol_t TOL_EXACT = {0.0, 0.0};
static const tol_t TOL_ROUND = {1e-6, 0.0};
static const tol_t TOL_TRANS = {1e-5, 1e-6};
static const tol_t TOL_SHORT = {1e-6, 1e-6}; /* sums of a few terms */
static const tol_t TOL_SUM = {1e-5, 1e-5};
static const tol_t TOL_GRAD = {1e-4, 1e-5};
static const tol_t TOL_SUMSQ = {1e-10, 0.0};
static const tol_t TOL_BF16 = {1.0 / 128.0, 1e-5}; /* one bf16 ulp */

/* TOL_SUM for a sum of `terms` products: fp32 rounding grows like the
 * square root of the length, so past 64 terms both parts grow with it (a
 * weight gradient over 2000 rows gets 5.6 times TOL_SUM). */
static tol_t tol_sum(int64_t terms) {
  double f = terms > 64 ? sqrt((double)terms / 64.0) : 1.0;
  return (tol_t){TOL_SUM.rtol * f, TOL_SUM.atol * f};
}

/* ---- the harness --------------------------------------------------------- */

typedef struct {
  void **p;
  int n, cap;
} ptrs_t;

typedef struct {
  xm_rt_backend_t *be;
  FILE *log;
  uint64_t rng;
  const char *entry; /* the entry being run */
  int cases;         /* cases begun in this entry */
  int failed_cases;  /* of them, those with a mismatch */
  int case_failed;   /* the current case has one */
  char case_desc[200];
  char first[1024];     /* the entry's first mismatch, as printed */
  ptrs_t dev, host;     /* the entry's buffers */
  int64_t guard_floats; /* of the current case's fused scratch */
  jmp_buf bail;         /* where an alloc failure ends the entry */
  /* The entry's largest errors over every float compared: absolute,
   * relative (elements with |want| >= 1e-6), and as a share of the
   * element's tolerance (at most 1 when the entry passes). */
  double max_abs, max_rel, max_share;
} cx_t;

static void ptrs_push(ptrs_t *v, void *p) {
  if (v->n == v->cap) {
    v->cap = v->cap ? 2 * v->cap : 32;
    void **np = realloc(v->p, sizeof(void *) * (size_t)v->cap);
    if (!np) abort();
    v->p = np;
  }
  v->p[v->n++] = p;
}

static void fail(cx_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(cx_t *c, const char *fmt, ...) {
  if (!c->case_failed) c->failed_cases++;
  c->case_failed = 1;
  if (c->first[0]) return;
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(c->first, sizeof c->first, "case %d (%s): %s", c->cases, c->case_desc, msg);
}

static void case_end(cx_t *c) {
  for (int i = 0; i < c->dev.n; i++)
    c->be->free(c->be, c->dev.p[i]);
  for (int i = 0; i < c->host.n; i++)
    free(c->host.p[i]);
  c->dev.n = c->host.n = 0;
}

/* Starts a case and keeps its description for the failure line. Buffers
 * live until the entry ends (inputs are often made before the case is
 * named), so an entry's cases hold a few hundred KiB at most. */
static void case_begin(cx_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void case_begin(cx_t *c, const char *fmt, ...) {
  c->cases++;
  c->case_failed = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->case_desc, sizeof c->case_desc, fmt, ap);
  va_end(ap);
}

/* xorshift64*: the suite's own generator, so that inputs do not depend on
 * the C library. */
static uint64_t next_u64(cx_t *c) {
  c->rng ^= c->rng >> 12;
  c->rng ^= c->rng << 25;
  c->rng ^= c->rng >> 27;
  return c->rng * 0x2545F4914F6CDD1Dull;
}

static double unif(cx_t *c) { return (double)(next_u64(c) >> 11) * (1.0 / 9007199254740992.0); }
static float frand(cx_t *c, float lo, float hi) { return (float)(lo + (hi - lo) * unif(c)); }
static int64_t irand(cx_t *c, int64_t n) { return (int64_t)(next_u64(c) % (uint64_t)n); }

/* Host buffers, zeroed, at least one element so that n == 0 is valid. */
static void *hnew(cx_t *c, size_t bytes) {
  void *p = calloc(bytes ? bytes : 1, 1);
  if (!p) abort();
  ptrs_push(&c->host, p);
  return p;
}
static float *hf(cx_t *c, int64_t n) { return hnew(c, sizeof(float) * (size_t)n); }
static int32_t *hi32(cx_t *c, int64_t n) { return hnew(c, sizeof(int32_t) * (size_t)n); }

static float *hrand(cx_t *c, int64_t n, float lo, float hi) {
  float *p = hf(c, n);
  for (int64_t i = 0; i < n; i++)
    p[i] = frand(c, lo, hi);
  return p;
}

static float *hcopy(cx_t *c, const float *src, int64_t n) {
  float *p = hf(c, n);
  if (n) memcpy(p, src, sizeof(float) * (size_t)n);
  return p;
}

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* Device buffers of the current case. */
static void *dnew(cx_t *c, size_t bytes) {
  void *p = c->be->alloc(c->be, bytes);
  if (!p) {
    fail(c, "alloc of %zu bytes returned NULL", bytes);
    longjmp(c->bail, 1);
  }
  ptrs_push(&c->dev, p);
  return p;
}

static void *dput(cx_t *c, const void *src, size_t bytes) {
  void *p = dnew(c, bytes);
  if (bytes) c->be->copy_h2d(c->be, p, src, bytes, NULL);
  return p;
}
static float *df(cx_t *c, const float *src, int64_t n) {
  return dput(c, src, sizeof(float) * (size_t)n);
}
static int32_t *di(cx_t *c, const int32_t *src, int64_t n) {
  return dput(c, src, sizeof(int32_t) * (size_t)n);
}

/* An output buffer of n 32-bit words, all GARBAGE_BITS. */
static void *ddirty(cx_t *c, int64_t n) {
  void *p = dnew(c, sizeof(uint32_t) * (size_t)n);
  if (n) c->be->fill32(c->be, p, GARBAGE_BITS, (size_t)n, NULL);
  return p;
}

/* Host copy of `bytes` of device memory, after the stream is done. */
static void *dget_bytes(cx_t *c, const void *src, size_t bytes) {
  void *h = hnew(c, bytes);
  c->be->sync(c->be, NULL);
  if (bytes) c->be->copy_d2h(c->be, h, src, bytes, NULL);
  c->be->sync(c->be, NULL);
  return h;
}

/* Host copy of n 32-bit words. */
static void *dget(cx_t *c, const void *src, int64_t n) {
  return dget_bytes(c, src, sizeof(uint32_t) * (size_t)n);
}

/* ---- comparisons --------------------------------------------------------- */

static int close_enough(float got, float want, tol_t t) {
  if (isnan(got) || isnan(want)) return 0;
  if (t.rtol == 0.0 && t.atol == 0.0) return got == want;
  double d = fabs((double)got - (double)want);
  return d <= t.atol + t.rtol * fabs((double)want);
}

/* Keeps the entry's largest errors (cx_t max_*). */
static void note_err(cx_t *c, float got, float want, tol_t t) {
  if (isnan(got) || isnan(want) || isinf(want)) return;
  double d = fabs((double)got - (double)want), w = fabs((double)want);
  double bound = t.atol + t.rtol * w;
  if (d > c->max_abs) c->max_abs = d;
  if (w >= 1e-6 && d / w > c->max_rel) c->max_rel = d / w;
  if (bound > 0 && d / bound > c->max_share) c->max_share = d / bound;
}

static int cmp_f(cx_t *c, const char *what, const float *got, const float *want, int64_t n,
                 tol_t t) {
  for (int64_t i = 0; i < n; i++) {
    note_err(c, got[i], want[i], t);
    if (!close_enough(got[i], want[i], t)) {
      fail(c, "%s first mismatch at index %lld: got %.9g want %.9g (tol %g + %g|want|)", what,
           (long long)i, got[i], want[i], t.atol, t.rtol);
      return 1;
    }
  }
  return 0;
}

/* Fetches n floats of `dev` and compares them with `want`. */
static float *chk_f(cx_t *c, const char *what, const float *dev, const float *want, int64_t n,
                    tol_t t) {
  float *got = dget(c, dev, n);
  cmp_f(c, what, got, want, n, t);
  return got;
}

static void chk_i(cx_t *c, const char *what, const int32_t *dev, const int32_t *want, int64_t n) {
  int32_t *got = dget(c, dev, n);
  for (int64_t i = 0; i < n; i++)
    if (got[i] != want[i]) {
      fail(c, "%s first mismatch at index %lld: got %d want %d", what, (long long)i, got[i],
           want[i]);
      return;
    }
}

/* Words [from, to) of `dev` must still hold `bits`. */
static void chk_bits(cx_t *c, const char *what, const void *dev, int64_t from, int64_t to,
                     uint32_t bits) {
  if (to <= from) return;
  const uint32_t *got = dget(c, (const uint32_t *)dev + from, to - from);
  for (int64_t i = 0; i < to - from; i++)
    if (got[i] != bits) {
      fail(c, "%s: index %lld must be untouched (0x%08x) but holds 0x%08x (%.9g)", what,
           (long long)(from + i), bits, got[i], bits_f32(got[i]));
      return;
    }
}

static void chk_untouched(cx_t *c, const char *what, const void *dev, int64_t from, int64_t to) {
  chk_bits(c, what, dev, from, to, GARBAGE_BITS);
}

/* ---- workspaces ------------------------------------------------------------
 * A kernel's workspace (runtime/abi/workspace.h, runtime/abi/bf16.h) from
 * be->alloc: exactly the formula's floats, NaN (the plan hands kernels
 * dirty scratch, and reading what was not written shows), then `guard`
 * floats of GUARD_BITS that must survive. */
static float *ws_new_guarded(cx_t *c, int64_t floats, int64_t guard) {
  float *s = dnew(c, sizeof(float) * (size_t)(floats + guard));
  if (floats) c->be->fill32(c->be, s, GARBAGE_BITS, (size_t)floats, NULL);
  if (guard) c->be->fill32(c->be, s + floats, GUARD_BITS, (size_t)guard, NULL);
  return s;
}

static void ws_guard_n(cx_t *c, const float *s, int64_t floats, int64_t guard, const char *what) {
  chk_bits(c, what, s, floats, floats + guard, GUARD_BITS);
}

static float *ws_new(cx_t *c, int64_t floats) { return ws_new_guarded(c, floats, GUARD_FLOATS); }

static void ws_guard(cx_t *c, const float *s, int64_t floats, const char *what) {
  ws_guard_n(c, s, floats, GUARD_FLOATS, what);
}

/* Floats of a workspace formula's bytes (every formula is whole floats). */
static int64_t ws_floats(int64_t bytes) { return bytes / (int64_t)sizeof(float); }

/* Element i of a fetched output must be exactly zero (zero by structure). */
static void want_zero(cx_t *c, const char *what, const float *got, int64_t i) {
  if (got[i] != 0.0f)
    fail(c, "%s index %lld must be exactly 0 but is %.9g", what, (long long)i, got[i]);
}

#define KT (c->be->kernels)

/* ---- routing inputs ------------------------------------------------------ */

/* Shapes of a routing: experts chosen at random (distinct per token);
 * SPARSE leaves expert 0 without rows and gives expert 1 exactly one;
 * ONE sends every slot to the last expert (k must be 1); TIES draws the
 * weights from four values, so capacity dropping meets equal weights;
 * EMPTY has n == 0 routed rows (tpe all zero) with T > 0 tokens. */
enum { R_RANDOM, R_SPARSE, R_ONE, R_TIES, R_EMPTY };

typedef struct {
  int64_t T, k, E, cap, n, N;
  int32_t *experts; /* [N] */
  float *weights;   /* [N] */
  int32_t *indices; /* [N], first n valid */
  int32_t *bin_ids; /* [N] */
  int32_t *tpe;     /* [E] */
  char *kept;       /* [N]: slot kept after capacity */
  char *has_row;    /* [T]: token has at least one kept slot */
  char desc[80];
} route_t;

static const char *k_route_names[] = {"random", "sparse", "one-expert", "ties", "n=0"};

static route_t make_route(cx_t *c, int64_t T, int64_t k, int64_t E, int64_t cap, int shape) {
  route_t r = {.T = T, .k = k, .E = E, .cap = cap, .N = T * k};
  r.experts = hi32(c, r.N);
  r.weights = hf(c, r.N);
  r.indices = hi32(c, r.N);
  r.bin_ids = hi32(c, r.N);
  r.tpe = hi32(c, E);
  r.kept = hnew(c, (size_t)r.N);
  r.has_row = hnew(c, (size_t)T);
  int32_t *pool = hi32(c, E);
  int64_t lo = shape == R_SPARSE ? 2 : 0;
  for (int64_t t = 0; t < T; t++) {
    int64_t np = 0;
    for (int64_t e = lo; e < E; e++)
      pool[np++] = (int32_t)e;
    for (int64_t j = 0; j < k; j++) {
      int64_t pick = j + irand(c, np - j);
      int32_t tmp = pool[j];
      pool[j] = pool[pick];
      pool[pick] = tmp;
      r.experts[t * k + j] = shape == R_ONE ? (int32_t)(E - 1) : pool[j];
      r.weights[t * k + j] =
          shape == R_TIES ? 0.25f * (float)(1 + irand(c, 4)) : frand(c, 0.05f, 1.0f);
    }
  }
  if (shape == R_SPARSE && T > 0) r.experts[0] = 1;
  if (shape == R_EMPTY) {
    r.n = 0;
  } else {
    r.n = xm_ref_permute(r.experts, r.weights, r.indices, r.bin_ids, r.tpe, T, k, E, cap);
  }
  for (int64_t i = 0; i < r.n; i++) {
    r.kept[r.indices[i]] = 1;
    r.has_row[r.indices[i] / k] = 1;
  }
  snprintf(r.desc, sizeof r.desc, "T=%lld k=%lld E=%lld cap=%lld %s n=%lld", (long long)T,
           (long long)k, (long long)E, (long long)cap, k_route_names[shape], (long long)r.n);
  return r;
}

/* The routings the MoE and fused kernels run on. */
typedef struct {
  int64_t T, k, E, cap;
  int shape;
} route_spec_t;

static const route_spec_t k_routes[] = {
    {19, 3, 6, 0, R_SPARSE}, /* 0 rows, 1 row, and runs of 10+ rows */
    {16, 2, 4, 5, R_TIES},   /* capacity 5 of ~8 per expert: drops with ties */
    {11, 1, 3, 0, R_ONE},    /* k = 1, all 11 rows on one expert */
    {3, 2, 4, 0, R_EMPTY},   /* n = 0 */
    {9, 2, 5, 0, R_RANDOM},
};
#define N_ROUTES ((int)(sizeof k_routes / sizeof k_routes[0]))

static route_t route_case(cx_t *c, int i) {
  const route_spec_t *s = &k_routes[i];
  return make_route(c, s->T, s->k, s->E, s->cap, s->shape);
}

/* The unfused MoE kernels also run one routing of 8000 rows, above the CPU
 * kernels' thresholds for threads (token ranges owned per thread). */
#define N_ROUTES_MOE (N_ROUTES + 1)
static route_t route_case_moe(cx_t *c, int i) {
  if (i < N_ROUTES) return route_case(c, i);
  return make_route(c, 4000, 2, 8, 0, R_RANDOM);
}

/* The longest run: the terms of a weight gradient's sums. */
static int64_t max_rows(const route_t *r) {
  int64_t m = 0;
  for (int64_t e = 0; e < r->E; e++)
    m = r->tpe[e] > m ? r->tpe[e] : m;
  return m;
}

/* A routed input buffer [N, width] whose rows past n are NaN, so a kernel
 * that reads them shows it. Returns the host copy; *dev gets the device one. */
static float *routed_input(cx_t *c, const route_t *r, int64_t width, float **dev) {
  float *h = hrand(c, r->N * width, -1.0f, 1.0f);
  for (int64_t i = r->n * width; i < r->N * width; i++)
    h[i] = bits_f32(GARBAGE_BITS);
  *dev = df(c, h, r->N * width);
  return h;
}

/* ---- memory, copies, fills, reads ----------------------------------------- */

static int aligned(const xm_rt_backend_t *be, const void *p) {
  return ((uintptr_t)p & (uintptr_t)(be->alignment - 1)) == 0;
}

static void t_memory(cx_t *c) {
  xm_rt_backend_t *be = c->be;

  case_begin(c, "alignment is a power of two >= 64");
  if (be->alignment < 64 || (be->alignment & (be->alignment - 1)))
    fail(c, "alignment %zu", be->alignment);

  case_begin(c, "alloc returns zeroed aligned memory; allocated_bytes follows");
  {
    static const size_t sizes[] = {1, 3, 64, 100, 1000, 4096 + 7};
    int64_t before = be->allocated_bytes, total = 0;
    void *ps[6];
    for (int i = 0; i < 6; i++) {
      ps[i] = dnew(c, sizes[i]);
      total += (int64_t)sizes[i];
      if (!aligned(be, ps[i]))
        fail(c, "alloc(%zu) = %p not %zu-aligned", sizes[i], ps[i], be->alignment);
      unsigned char *h = hnew(c, sizes[i]);
      memset(h, 0xab, sizes[i]);
      be->sync(be, NULL);
      be->copy_d2h(be, h, ps[i], sizes[i], NULL);
      be->sync(be, NULL);
      for (size_t j = 0; j < sizes[i]; j++)
        if (h[j]) {
          fail(c, "alloc(%zu): byte %zu is 0x%02x, not 0", sizes[i], j, h[j]);
          break;
        }
    }
    /* The counter is optional (backend.h); one that moves must count. */
    int64_t live = be->allocated_bytes - before;
    if (live != 0 && live < total)
      fail(c, "allocated_bytes grew by %lld for %lld bytes", (long long)live, (long long)total);
    case_end(c);
    if (be->allocated_bytes != before)
      fail(c, "allocated_bytes is %lld after freeing, was %lld", (long long)be->allocated_bytes,
           (long long)before);
  }

  case_begin(c, "alloc(0) gives valid unique pointers; free(NULL)");
  {
    void *a = dnew(c, 0), *b = dnew(c, 0);
    if (a == b) fail(c, "two alloc(0) returned the same pointer %p", a);
    if (!aligned(be, a) || !aligned(be, b)) fail(c, "alloc(0) not aligned");
    be->free(be, NULL);
  }

  case_begin(c, "fill32 with 0, with a float pattern, and partially");
  {
    int64_t n = 37;
    float *d = ddirty(c, n);
    be->fill32(be, d, 0u, (size_t)n, NULL);
    float *z = hf(c, n);
    chk_f(c, "fill32(0)", d, z, n, TOL_EXACT);
    const uint32_t *zb = dget(c, d, n);
    for (int64_t i = 0; i < n; i++)
      if (zb[i] != 0u) {
        fail(c, "fill32(0) index %lld has bits 0x%08x (-0?)", (long long)i, zb[i]);
        break;
      }
    be->fill32(be, d, f32_bits(-1.5f), (size_t)n, NULL);
    float *w = hf(c, n);
    xm_ref_fill(w, n, -1.5f);
    chk_f(c, "fill32(-1.5f)", d, w, n, TOL_EXACT);
    be->fill32(be, d + 3, f32_bits(2.25f), 10, NULL);
    for (int64_t i = 3; i < 13; i++)
      w[i] = 2.25f;
    chk_f(c, "fill32 of words 3..12", d, w, n, TOL_EXACT);
    be->fill32(be, d, 0u, 0, NULL); /* n = 0 is a no-op */
    chk_f(c, "fill32 n=0", d, w, n, TOL_EXACT);
  }

  case_begin(c, "copy_h2d / copy_d2h of odd sizes at odd offsets");
  {
    size_t n = 301;
    unsigned char *src = hnew(c, n), *dst = hnew(c, n);
    for (size_t i = 0; i < n; i++)
      src[i] = (unsigned char)next_u64(c);
    unsigned char *d = dnew(c, n);
    be->copy_h2d(be, d, src, n, NULL);
    be->copy_h2d(be, d + 3, src + 100, 13, NULL);
    be->sync(be, NULL);
    be->copy_d2h(be, dst, d, n, NULL);
    be->sync(be, NULL);
    for (size_t i = 0; i < n; i++) {
      unsigned char want = (i >= 3 && i < 16) ? src[100 + i - 3] : src[i];
      if (dst[i] != want) {
        fail(c, "byte %zu: got 0x%02x want 0x%02x", i, dst[i], want);
        break;
      }
    }
    memset(dst, 0, n);
    be->copy_d2h(be, dst + 5, d + 7, 11, NULL);
    be->sync(be, NULL);
    for (size_t i = 0; i < 11; i++) {
      unsigned char want = (i + 7 >= 3 && i + 7 < 16) ? src[100 + i + 7 - 3] : src[i + 7];
      if (dst[5 + i] != want) {
        fail(c, "copy_d2h at offset: byte %zu got 0x%02x want 0x%02x", i, dst[5 + i], want);
        break;
      }
    }
    if (dst[4] != 0 || dst[16] != 0) fail(c, "copy_d2h wrote outside its 11 bytes");
  }

  case_begin(c, "copy_d2d between buffers and within one");
  {
    int64_t n = 40;
    float *h = hrand(c, n, -1.0f, 1.0f);
    float *a = df(c, h, n), *b = ddirty(c, n + TAIL);
    be->copy_d2d(be, b, a, sizeof(float) * (size_t)n, NULL);
    chk_f(c, "d2d copy", b, h, n, TOL_EXACT);
    chk_untouched(c, "d2d copy tail", b, n, n + TAIL);
    be->copy_d2d(be, a + 20, a, sizeof(float) * 10, NULL);
    float *w = hcopy(c, h, n);
    memcpy(w + 20, h, sizeof(float) * 10);
    chk_f(c, "d2d within a buffer", a, w, n, TOL_EXACT);
  }

  case_begin(c, "read waits, copies and counts");
  {
    int64_t n = 9;
    float *h = hrand(c, n, -1.0f, 1.0f);
    float *d = ddirty(c, n);
    be->copy_h2d(be, d, h, sizeof(float) * (size_t)n, NULL);
    float *d2 = ddirty(c, n);
    KT->scale(d, d2, n, 2.0f); /* queued work the read must wait for */
    d = d2;
    float got[9];
    int64_t r0 = be->reads;
    be->read(be, got, d, sizeof got, NULL);
    if (be->reads != r0 + 1)
      fail(c, "reads went from %lld to %lld over one read", (long long)r0, (long long)be->reads);
    float w[9];
    xm_ref_scale(h, w, n, 2.0f);
    cmp_f(c, "read", got, w, n, TOL_EXACT);
    float one;
    be->read(be, &one, d + 4, sizeof one, NULL);
    be->read(be, &one, d + 4, sizeof one, NULL);
    if (be->reads != r0 + 3)
      fail(c, "reads is %lld after 3 reads from %lld", (long long)be->reads, (long long)r0);
    if (one != w[4]) fail(c, "read of one float at offset 4: got %.9g want %.9g", one, w[4]);
  }
}

static void t_streams(cx_t *c) {
  xm_rt_backend_t *be = c->be;
  case_begin(c, "two streams ordered by an event");
  int64_t n = 64;
  xm_rt_stream_t *s1 = be->stream_create(be), *s2 = be->stream_create(be);
  xm_rt_event_t *e = be->event_create(be);
  if (!s1 || !s2 || !e) {
    fail(c, "stream_create / event_create returned NULL");
  } else {
    float *h = hrand(c, n, -1.0f, 1.0f);
    float *a = ddirty(c, n), *b = ddirty(c, n);
    be->sync(be, NULL); /* the garbage fills ran on the default stream */
    be->copy_h2d(be, a, h, sizeof(float) * (size_t)n, s1);
    be->event_record(be, e, s1);
    be->stream_wait(be, s2, e);
    be->copy_d2d(be, b, a, sizeof(float) * (size_t)n, s2);
    be->fill32(be, b, f32_bits(0.5f), 4, s2);
    be->event_record(be, e, s2);
    be->event_sync(be, e);
    be->sync(be, s2);
    float *got = hf(c, n);
    be->copy_d2h(be, got, b, sizeof(float) * (size_t)n, s1);
    be->sync(be, s1);
    float *w = hcopy(c, h, n);
    for (int i = 0; i < 4; i++)
      w[i] = 0.5f;
    cmp_f(c, "b after s1 -> event -> s2", got, w, n, TOL_EXACT);
    float r;
    be->read(be, &r, b + 10, sizeof r, s2);
    if (r != w[10]) fail(c, "read on s2: got %.9g want %.9g", r, w[10]);
    be->sync(be, NULL);
  }
  if (e) be->event_destroy(be, e);
  if (s1) be->stream_destroy(be, s1);
  if (s2) be->stream_destroy(be, s2);

  case_begin(c, "create and destroy many");
  for (int i = 0; i < 8; i++) {
    xm_rt_stream_t *s = be->stream_create(be);
    xm_rt_event_t *ev = be->event_create(be);
    if (!s || !ev) {
      fail(c, "create %d returned NULL", i);
    } else {
      be->event_record(be, ev, s);
      be->event_sync(be, ev);
      be->sync(be, s);
    }
    if (ev) be->event_destroy(be, ev);
    if (s) be->stream_destroy(be, s);
  }
}

/* ---- dense ----------------------------------------------------------------- */

typedef struct {
  int64_t M, K, N;
} mkn_t;
/* Small shapes, and one above the CPU's threshold for splitting a GEMM
 * over its threads (2^18 multiply-adds). */
static const mkn_t k_mkn[] = {{1, 1, 1},  {3, 5, 4},   {7, 16, 9},   {1, 33, 2},
                              {17, 8, 1}, {6, 40, 23}, {200, 48, 30}};
#define N_MKN ((int)(sizeof k_mkn / sizeof k_mkn[0]))

static void t_matmul(cx_t *c) {
  for (int i = 0; i < N_MKN; i++) {
    mkn_t s = k_mkn[i];
    case_begin(c, "M=%lld K=%lld N=%lld", (long long)s.M, (long long)s.K, (long long)s.N);
    float *x = hrand(c, s.M * s.K, -1, 1), *w = hrand(c, s.N * s.K, -1, 1), *y = hf(c, s.M * s.N);
    float *d = ddirty(c, s.M * s.N);
    KT->matmul(df(c, x, s.M * s.K), df(c, w, s.N * s.K), d, s.M, s.K, s.N);
    xm_ref_matmul(x, w, y, s.M, s.K, s.N);
    chk_f(c, "y", d, y, s.M * s.N, TOL_SUM);
  }
}

static void t_matmul_dx(cx_t *c) {
  for (int i = 0; i < N_MKN; i++) {
    mkn_t s = k_mkn[i];
    case_begin(c, "M=%lld K=%lld N=%lld", (long long)s.M, (long long)s.K, (long long)s.N);
    float *g = hrand(c, s.M * s.N, -1, 1), *w = hrand(c, s.N * s.K, -1, 1), *dx = hf(c, s.M * s.K);
    float *d = ddirty(c, s.M * s.K);
    KT->matmul_dx(df(c, g, s.M * s.N), df(c, w, s.N * s.K), d, s.M, s.K, s.N);
    xm_ref_matmul_dx(g, w, dx, s.M, s.K, s.N);
    chk_f(c, "dx", d, dx, s.M * s.K, TOL_SUM);
  }
}

static void dw_cases(cx_t *c, int acc) {
  for (int i = 0; i < N_MKN; i++) {
    mkn_t s = k_mkn[i];
    case_begin(c, "M=%lld K=%lld N=%lld%s", (long long)s.M, (long long)s.K, (long long)s.N,
               acc ? " onto non-zero dw" : "");
    float *g = hrand(c, s.M * s.N, -1, 1), *x = hrand(c, s.M * s.K, -1, 1);
    float *dw = acc ? hrand(c, s.N * s.K, -2, 2) : hf(c, s.N * s.K);
    float *d = acc ? df(c, dw, s.N * s.K) : ddirty(c, s.N * s.K);
    if (acc) {
      KT->matmul_dw_acc(df(c, g, s.M * s.N), df(c, x, s.M * s.K), d, s.M, s.K, s.N);
      xm_ref_matmul_dw_acc(g, x, dw, s.M, s.K, s.N);
    } else {
      KT->matmul_dw(df(c, g, s.M * s.N), df(c, x, s.M * s.K), d, s.M, s.K, s.N);
      xm_ref_matmul_dw(g, x, dw, s.M, s.K, s.N);
    }
    chk_f(c, "dw", d, dw, s.N * s.K, tol_sum(s.M));
  }
}
static void t_matmul_dw(cx_t *c) { dw_cases(c, 0); }
static void t_matmul_dw_acc(cx_t *c) { dw_cases(c, 1); }

typedef void (*bcast_fn)(const float *, const float *, float *, int64_t, int64_t);

static void bcast_cases(cx_t *c, bcast_fn dev, bcast_fn ref) {
  static const int64_t sh[][2] = {{1, 1},  {12, 12},  {12, 4},    {12, 1},
                                  {35, 7}, {130, 13}, {140000, 7}};
  for (int i = 0; i < 7; i++) {
    int64_t na = sh[i][0], nb = sh[i][1];
    case_begin(c, "na=%lld nb=%lld", (long long)na, (long long)nb);
    float *a = hrand(c, na, -3, 3), *b = hrand(c, nb, -3, 3), *y = hf(c, na);
    float *d = ddirty(c, na + TAIL);
    dev(df(c, a, na), df(c, b, nb), d, na, nb);
    ref(a, b, y, na, nb);
    chk_f(c, "y", d, y, na, TOL_ROUND);
    chk_untouched(c, "y past na", d, na, na + TAIL);
  }
}
static void t_add(cx_t *c) { bcast_cases(c, KT->add, xm_ref_add); }
static void t_mul(cx_t *c) { bcast_cases(c, KT->mul, xm_ref_mul); }

/* One factor per row (the shared-expert gate): a single row, a single
 * column, widths off any vector or block multiple, and one call large
 * enough to split over the CPU's threads. */
static void t_mul_rows(cx_t *c) {
  static const int64_t sh[][2] = {{1, 1}, {1, 7}, {5, 1}, {12, 4}, {33, 17}, {130, 96}, {3000, 64}};
  for (int i = 0; i < 7; i++) {
    int64_t rows = sh[i][0], H = sh[i][1], n = rows * H;
    case_begin(c, "rows=%lld H=%lld", (long long)rows, (long long)H);
    float *a = hrand(c, n, -3, 3), *b = hrand(c, rows, -1, 1), *y = hf(c, n);
    float *d = ddirty(c, n + TAIL);
    KT->mul_rows(df(c, a, n), df(c, b, rows), d, rows, H);
    xm_ref_mul_rows(a, b, y, rows, H);
    chk_f(c, "y", d, y, n, TOL_ROUND);
    chk_untouched(c, "y past rows*H", d, n, n + TAIL);
  }
}

static void t_scale(cx_t *c) {
  static const float factors[] = {0.5f, -3.25f, 0.0f, 1e-3f, 3.0f};
  static const int64_t ns[] = {1, 10, 37, 1000, 140001};
  for (int i = 0; i < 5; i++) {
    case_begin(c, "n=%lld factor=%g", (long long)ns[i], factors[i]);
    float *x = hrand(c, ns[i], -5, 5), *y = hf(c, ns[i]);
    float *d = ddirty(c, ns[i] + TAIL);
    KT->scale(df(c, x, ns[i]), d, ns[i], factors[i]);
    xm_ref_scale(x, y, ns[i], factors[i]);
    chk_f(c, "y", d, y, ns[i], TOL_ROUND);
    chk_untouched(c, "y past n", d, ns[i], ns[i] + TAIL);
  }
}

static void t_reduce_to(cx_t *c) {
  static const int64_t sh[][2] = {{12, 4}, {12, 12}, {12, 1}, {35, 5}, {640, 8}, {139264, 17}};
  for (int i = 0; i < 6; i++) {
    int64_t nx = sh[i][0], ny = sh[i][1];
    case_begin(c, "nx=%lld ny=%lld", (long long)nx, (long long)ny);
    float *x = hrand(c, nx, -1, 1), *y = hf(c, ny);
    float *d = ddirty(c, ny + TAIL);
    KT->reduce_to(df(c, x, nx), d, nx, ny);
    xm_ref_reduce_to(x, y, nx, ny);
    chk_f(c, "y", d, y, ny, tol_sum(nx / ny));
    chk_untouched(c, "y past ny", d, ny, ny + TAIL);
  }
}

/* Row sums (the gate's gradient): rows of one element, rows longer than a
 * GPU block, more rows than a GPU grid has blocks (70000), and a call
 * large enough to split over the CPU's threads. */
static void t_reduce_rows(cx_t *c) {
  static const int64_t sh[][2] = {{1, 1},    {4, 1},     {1, 37},   {12, 4},  {17, 33},
                                  {64, 300}, {700, 257}, {2, 5000}, {70000, 2}};
  for (int i = 0; i < 9; i++) {
    int64_t rows = sh[i][0], H = sh[i][1];
    case_begin(c, "rows=%lld H=%lld", (long long)rows, (long long)H);
    float *x = hrand(c, rows * H, -1, 1), *y = hf(c, rows);
    float *d = ddirty(c, rows + TAIL);
    KT->reduce_rows(df(c, x, rows * H), d, rows, H);
    xm_ref_reduce_rows(x, y, rows, H);
    chk_f(c, "y", d, y, rows, tol_sum(H));
    chk_untouched(c, "y past rows", d, rows, rows + TAIL);
  }
}

static void t_fill(cx_t *c) {
  static const float values[] = {0.0f, -2.5f, 1e-3f, 7.0f, -1.0f};
  static const int64_t ns[] = {1, 17, 100, 1031, 140001};
  for (int i = 0; i < 5; i++) {
    case_begin(c, "n=%lld value=%g", (long long)ns[i], values[i]);
    float *y = hf(c, ns[i]);
    float *d = ddirty(c, ns[i] + TAIL);
    KT->fill(d, ns[i], values[i]);
    xm_ref_fill(y, ns[i], values[i]);
    chk_f(c, "y", d, y, ns[i], TOL_EXACT);
    chk_untouched(c, "y past n", d, ns[i], ns[i] + TAIL);
  }
}

static void t_copy(cx_t *c) {
  static const int64_t ns[] = {1, 17, 100, 1031, 140001};
  for (int i = 0; i < 5; i++) {
    case_begin(c, "n=%lld", (long long)ns[i]);
    float *x = hrand(c, ns[i], -9, 9), *y = hf(c, ns[i]);
    float *d = ddirty(c, ns[i] + TAIL);
    KT->copy(df(c, x, ns[i]), d, ns[i]);
    xm_ref_copy(x, y, ns[i]);
    chk_f(c, "y", d, y, ns[i], TOL_EXACT);
    chk_untouched(c, "y past n", d, ns[i], ns[i] + TAIL);
  }
}

/* Elementwise inputs: random in [lo, hi], with 0 and both ends first. */
static float *ew_input(cx_t *c, int64_t n, float lo, float hi) {
  float *x = hrand(c, n, lo, hi);
  const float special[] = {0.0f, lo, hi, -1.0f, 1.0f};
  for (int64_t i = 0, j = 0; i < n && j < 5; j++)
    if (special[j] >= lo && special[j] <= hi) x[i++] = special[j];
  return x;
}

/* Lengths with ragged vector tails, and one above the CPU's threshold for
 * threads (2^14 for the transcendental kernels). */
static const int64_t k_ew_ns[] = {1, 7, 13, 130, 1001, 20011};
#define N_EW 6

typedef void (*un_fn)(const float *, float *, int64_t);
typedef void (*bin_fn)(const float *, const float *, float *, int64_t);

static void unary_cases(cx_t *c, un_fn dev, un_fn ref, float lo, float hi) {
  for (int i = 0; i < N_EW; i++) {
    int64_t n = k_ew_ns[i];
    case_begin(c, "n=%lld x in [%g, %g]", (long long)n, lo, hi);
    float *x = ew_input(c, n, lo, hi), *y = hf(c, n);
    float *d = ddirty(c, n + TAIL);
    dev(df(c, x, n), d, n);
    ref(x, y, n);
    chk_f(c, "y", d, y, n, TOL_TRANS);
    chk_untouched(c, "y past n", d, n, n + TAIL);
  }
}

/* Kernels of two inputs (dy and x, or g and u); the second in [lo, hi]. */
static void binary_cases(cx_t *c, bin_fn dev, bin_fn ref, float lo, float hi) {
  for (int i = 0; i < N_EW; i++) {
    int64_t n = k_ew_ns[i];
    case_begin(c, "n=%lld second input in [%g, %g]", (long long)n, lo, hi);
    float *a = hrand(c, n, -2, 2), *x = ew_input(c, n, lo, hi), *y = hf(c, n);
    float *d = ddirty(c, n + TAIL);
    dev(df(c, a, n), df(c, x, n), d, n);
    ref(a, x, y, n);
    chk_f(c, "out", d, y, n, TOL_TRANS);
    chk_untouched(c, "out past n", d, n, n + TAIL);
  }
}

static void t_silu(cx_t *c) { unary_cases(c, KT->silu, xm_ref_silu, -20, 20); }
static void t_silu_grad(cx_t *c) { binary_cases(c, KT->silu_grad, xm_ref_silu_grad, -20, 20); }
static void t_gelu(cx_t *c) { unary_cases(c, KT->gelu, xm_ref_gelu, -8, 8); }
static void t_gelu_grad(cx_t *c) { binary_cases(c, KT->gelu_grad, xm_ref_gelu_grad, -8, 8); }
static void t_sigmoid(cx_t *c) { unary_cases(c, KT->sigmoid, xm_ref_sigmoid, -20, 20); }
static void t_sigmoid_grad(cx_t *c) {
  binary_cases(c, KT->sigmoid_grad, xm_ref_sigmoid_grad, 0.0f, 1.0f);
}
/* swiglu(g, u): binary_cases draws g from [-2, 2] and u from [-3, 3]; one
 * more case takes g from [-20, 20], where silu's tails are. */
static void t_swiglu(cx_t *c) {
  binary_cases(c, KT->swiglu, xm_ref_swiglu, -3, 3);
  case_begin(c, "n=64 g in [-20, 20]");
  int64_t n = 64;
  float *g = ew_input(c, n, -20, 20), *u = hrand(c, n, -2, 2), *y = hf(c, n);
  float *d = ddirty(c, n);
  KT->swiglu(df(c, g, n), df(c, u, n), d, n);
  xm_ref_swiglu(g, u, y, n);
  chk_f(c, "y", d, y, n, TOL_TRANS);
}

static void t_swiglu_grad(cx_t *c) {
  for (int i = 0; i < N_EW; i++) {
    int64_t n = k_ew_ns[i];
    case_begin(c, "n=%lld", (long long)n);
    float *dy = hrand(c, n, -2, 2), *g = ew_input(c, n, -12, 12), *u = hrand(c, n, -3, 3);
    float *dg = hf(c, n), *du = hf(c, n);
    float *ddg = ddirty(c, n + TAIL), *ddu = ddirty(c, n + TAIL);
    KT->swiglu_grad(df(c, dy, n), df(c, g, n), df(c, u, n), ddg, ddu, n);
    xm_ref_swiglu_grad(dy, g, u, dg, du, n);
    chk_f(c, "dg", ddg, dg, n, TOL_TRANS);
    chk_f(c, "du", ddu, du, n, TOL_TRANS);
    chk_untouched(c, "dg past n", ddg, n, n + TAIL);
    chk_untouched(c, "du past n", ddu, n, n + TAIL);
  }
}

typedef struct {
  int64_t rows, H;
  float eps;
} norm_t;
static const norm_t k_norms[] = {{1, 1, 1e-6f}, {3, 8, 1e-5f}, {5, 33, 1e-6f}, {4, 64, 0.5f}};

static void t_rmsnorm(cx_t *c) {
  for (int i = 0; i < 4; i++) {
    norm_t s = k_norms[i];
    case_begin(c, "rows=%lld H=%lld eps=%g", (long long)s.rows, (long long)s.H, s.eps);
    float *x = hrand(c, s.rows * s.H, -2, 2), *w = hrand(c, s.H, 0.5f, 1.5f);
    float *y = hf(c, s.rows * s.H), *d = ddirty(c, s.rows * s.H);
    KT->rmsnorm(df(c, x, s.rows * s.H), df(c, w, s.H), d, s.rows, s.H, s.eps);
    xm_ref_rmsnorm(x, w, y, s.rows, s.H, s.eps);
    chk_f(c, "y", d, y, s.rows * s.H, TOL_SUM);
  }
}

static void t_rmsnorm_grad(cx_t *c) {
  for (int i = 0; i < 4; i++) {
    norm_t s = k_norms[i];
    int64_t n = s.rows * s.H;
    case_begin(c, "rows=%lld H=%lld eps=%g", (long long)s.rows, (long long)s.H, s.eps);
    float *dy = hrand(c, n, -1, 1), *x = hrand(c, n, -2, 2), *w = hrand(c, s.H, 0.5f, 1.5f);
    float *dx = hf(c, n), *dw = hf(c, s.H);
    float *ddx = ddirty(c, n), *ddw = ddirty(c, s.H);
    int64_t wf = ws_floats(xm_ws_rmsnorm_grad(s.rows, s.H));
    float *ws = ws_new(c, wf);
    KT->rmsnorm_grad(df(c, dy, n), df(c, x, n), df(c, w, s.H), ddx, ddw, s.rows, s.H, s.eps, ws);
    xm_ref_rmsnorm_grad(dy, x, w, dx, dw, s.rows, s.H, s.eps);
    chk_f(c, "dx", ddx, dx, n, TOL_GRAD);
    chk_f(c, "dw", ddw, dw, s.H, TOL_SUM);
    ws_guard(c, ws, wf, "guard after ws");
  }
}

typedef struct {
  int64_t B, S, nh, D, off, rd;
  float theta, factor, lo, hi, mscale; /* factor 1: plain RoPE, no ramp */
  int interleave;
} rope_t;
/* Plain RoPE on whole heads, then parts of heads (MLA) and interleaved
 * pairs, then YaRN: DeepSeek-V3's ramp (factor 40, beta_fast 32, beta_slow
 * 1 over 4096 original positions: the correction range [10, 23] of 64
 * rotary dims) with its attention factor 0.1 ln 40 + 1, on a whole head and
 * on MLA's layout, a ramp of zero width (ramp_lo == ramp_hi), and a short
 * ramp on 16 dims. */
static const rope_t k_ropes[] = {
    {1, 1, 1, 2, 0, 2, 10000.0f, 1, 0, 0, 1, 0},
    {2, 5, 3, 8, 0, 8, 10000.0f, 1, 0, 0, 1, 0},
    {1, 7, 2, 16, 0, 16, 500000.0f, 1, 0, 0, 1, 0},
    {1, 40, 1, 4, 0, 4, 100.0f, 1, 0, 0, 1, 0},
    {2, 128, 4, 32, 0, 32, 10000.0f, 1, 0, 0, 1, 0}, /* above 2^15 */
    {2, 5, 3, 8, 0, 8, 10000.0f, 1, 0, 0, 1, 1},     /* interleaved pairs */
    {2, 6, 3, 24, 16, 8, 10000.0f, 1, 0, 0, 1, 0},   /* MLA: the last 8 of 24 */
    {2, 6, 3, 24, 16, 8, 10000.0f, 1, 0, 0, 1, 1},   /* the same, interleaved */
    {1, 9, 2, 20, 6, 8, 10000.0f, 1, 0, 0, 1, 1},    /* copies on both sides */
    {1, 5, 2, 12, 0, 8, 10000.0f, 1, 0, 0, 1, 0},    /* the first 8 of 12 */
    {1, 3, 2, 6, 2, 0, 10000.0f, 1, 0, 0, 1, 0},     /* rd = 0: a copy, no ws */
    {1, 33, 2, 64, 0, 64, 10000.0f, 40, 10, 23, 1.3688879f, 0},
    {2, 20, 2, 96, 32, 64, 10000.0f, 40, 10, 23, 1.3688879f, 1},
    {1, 70, 1, 16, 0, 16, 10000.0f, 4, 3, 3, 1.1f, 0},
    {2, 130, 4, 48, 32, 16, 10000.0f, 40, 1, 5, 1.1f, 1}, /* above 2^15 */
};
#define N_ROPES ((int)(sizeof k_ropes / sizeof k_ropes[0]))

static void rope_cases(cx_t *c, int grad) {
  for (int i = 0; i < N_ROPES; i++) {
    rope_t s = k_ropes[i];
    int64_t n = s.B * s.S * s.nh * s.D;
    case_begin(c,
               "B=%lld S=%lld nh=%lld D=%lld off=%lld rd=%lld theta=%g factor=%g ramp=[%g, %g] "
               "mscale=%g interleave=%d",
               (long long)s.B, (long long)s.S, (long long)s.nh, (long long)s.D, (long long)s.off,
               (long long)s.rd, s.theta, s.factor, s.lo, s.hi, s.mscale, s.interleave);
    float *x = hrand(c, n, -1, 1), *y = hf(c, n), *d = ddirty(c, n + TAIL);
    int64_t wf = ws_floats(xm_ws_rope(s.S, s.rd));
    float *ws = ws_new(c, wf);
    if (grad) {
      KT->rope_grad(df(c, x, n), d, s.B, s.S, s.nh, s.D, s.off, s.rd, s.theta, s.factor, s.lo, s.hi,
                    s.mscale, s.interleave, ws);
      xm_ref_rope_grad(x, y, s.B, s.S, s.nh, s.D, s.off, s.rd, s.theta, s.factor, s.lo, s.hi,
                       s.mscale, s.interleave);
    } else {
      KT->rope(df(c, x, n), d, s.B, s.S, s.nh, s.D, s.off, s.rd, s.theta, s.factor, s.lo, s.hi,
               s.mscale, s.interleave, ws);
      xm_ref_rope(x, y, s.B, s.S, s.nh, s.D, s.off, s.rd, s.theta, s.factor, s.lo, s.hi, s.mscale,
                  s.interleave);
    }
    chk_f(c, grad ? "dx" : "y", d, y, n, TOL_TRANS);
    chk_untouched(c, grad ? "dx past the rows" : "y past the rows", d, n, n + TAIL);
    ws_guard(c, ws, wf, "guard after ws");
  }
}
static void t_rope(cx_t *c) { rope_cases(c, 0); }
static void t_rope_grad(cx_t *c) { rope_cases(c, 1); }

/* concat and split: the part b per head (Hb == H) or shared (Hb == 1). */
typedef struct {
  int64_t R, H, Hb, Da, Db;
} cat_t;
static const cat_t k_cats[] = {
    {1, 1, 1, 1, 1},       {3, 4, 4, 5, 3},   {3, 4, 1, 5, 3}, {2, 1, 1, 7, 2},
    {5, 3, 1, 16, 8},      {7, 16, 1, 12, 4}, /* 16 heads sharing b, as MLA's rotary key */
    {64, 16, 16, 128, 64},                    /* this and the next: above the CPU's threshold */
    {64, 16, 1, 128, 64},
};
#define N_CATS ((int)(sizeof k_cats / sizeof k_cats[0]))

static void t_concat(cx_t *c) {
  for (int i = 0; i < N_CATS; i++) {
    cat_t s = k_cats[i];
    case_begin(c, "R=%lld H=%lld Hb=%lld Da=%lld Db=%lld", (long long)s.R, (long long)s.H,
               (long long)s.Hb, (long long)s.Da, (long long)s.Db);
    int64_t na = s.R * s.H * s.Da, nb = s.R * s.Hb * s.Db, ny = s.R * s.H * (s.Da + s.Db);
    float *a = hrand(c, na, -3, 3), *b = hrand(c, nb, -3, 3), *y = hf(c, ny);
    float *d = ddirty(c, ny + TAIL);
    KT->concat(df(c, a, na), df(c, b, nb), d, s.R, s.H, s.Hb, s.Da, s.Db);
    xm_ref_concat(a, b, y, s.R, s.H, s.Hb, s.Da, s.Db);
    chk_f(c, "y", d, y, ny, TOL_EXACT);
    chk_untouched(c, "y past the rows", d, ny, ny + TAIL);
  }
}

static void t_split(cx_t *c) {
  for (int i = 0; i < N_CATS; i++) {
    cat_t s = k_cats[i];
    case_begin(c, "R=%lld H=%lld Hb=%lld Da=%lld Db=%lld", (long long)s.R, (long long)s.H,
               (long long)s.Hb, (long long)s.Da, (long long)s.Db);
    int64_t na = s.R * s.H * s.Da, nb = s.R * s.Hb * s.Db, nx = s.R * s.H * (s.Da + s.Db);
    float *x = hrand(c, nx, -3, 3), *a = hf(c, na), *b = hf(c, nb);
    float *da = ddirty(c, na + TAIL), *db = ddirty(c, nb + TAIL);
    KT->split(df(c, x, nx), da, db, s.R, s.H, s.Hb, s.Da, s.Db);
    xm_ref_split(x, a, b, s.R, s.H, s.Hb, s.Da, s.Db);
    chk_f(c, "a", da, a, na, TOL_EXACT);
    /* a broadcast b's gradient sums the heads: a sum of a few terms */
    chk_f(c, "b", db, b, nb, s.Hb == s.H ? TOL_EXACT : TOL_SHORT);
    chk_untouched(c, "a past the rows", da, na, na + TAIL);
    chk_untouched(c, "b past the rows", db, nb, nb + TAIL);
  }
}

/* split_i32: int rows cut (MTP's labels[:, k:]), compared with a cut made
 * here element by element. */
static void t_split_i32(cx_t *c) {
  static const int64_t k_cuts[][3] = {{1, 1, 1}, {2, 1, 15}, {4, 3, 29}, {3, 62, 2}, {64, 1, 511}};
  for (int i = 0; i < (int)(sizeof k_cuts / sizeof k_cuts[0]); i++) {
    int64_t R = k_cuts[i][0], Da = k_cuts[i][1], Db = k_cuts[i][2], D = Da + Db;
    case_begin(c, "R=%lld Da=%lld Db=%lld", (long long)R, (long long)Da, (long long)Db);
    int32_t *x = hi32(c, R * D), *a = hi32(c, R * Da), *b = hi32(c, R * Db);
    for (int64_t j = 0; j < R * D; j++)
      x[j] = (int32_t)irand(c, 1 << 20) - (1 << 19);
    for (int64_t r = 0; r < R; r++)
      for (int64_t j = 0; j < D; j++)
        *(j < Da ? &a[r * Da + j] : &b[r * Db + j - Da]) = x[r * D + j];
    int32_t *da = ddirty(c, R * Da + TAIL), *db = ddirty(c, R * Db + TAIL);
    KT->split_i32(di(c, x, R * D), da, db, R, Da, Db);
    chk_i(c, "a", da, a, R * Da);
    chk_i(c, "b", db, b, R * Db);
    chk_untouched(c, "a past the rows", da, R * Da, R * Da + TAIL);
    chk_untouched(c, "b past the rows", db, R * Db, R * Db + TAIL);
  }
}

typedef struct {
  int64_t B, S, Hq, Hkv, D, Dv;
  float scale; /* 0: 1/sqrt(D) */
} attn_t;
static const attn_t k_attn[] = {
    {1, 1, 1, 1, 4, 4, 0},     /* S = 1 */
    {2, 5, 4, 2, 8, 6, 0},     /* GQA, Dv < D */
    {1, 7, 3, 3, 5, 5, 0},     /* MHA */
    {1, 6, 4, 1, 4, 8, 0},     /* MQA, Dv > D */
    {2, 9, 2, 1, 16, 3, 0.7f}, /* another scale */
    {1, 1, 6, 2, 8, 12, 0},    /* S = 1 with GQA */
    {2, 64, 4, 2, 16, 12, 0},  /* above the CPU's threshold for threads */
    {1, 64, 1, 1, 32, 32, 0},  /* above it with one unit each way: one slot */
    {1, 130, 2, 1, 16, 16, 0}, /* three row tiles, the last ragged; one kv head */
};
#define N_ATTN ((int)(sizeof k_attn / sizeof k_attn[0]))

static void t_attention(cx_t *c) {
  for (int i = 0; i < N_ATTN; i++) {
    attn_t s = k_attn[i];
    float scale = s.scale ? s.scale : (float)(1.0 / sqrt((double)s.D));
    case_begin(c, "B=%lld S=%lld Hq=%lld Hkv=%lld D=%lld Dv=%lld scale=%g", (long long)s.B,
               (long long)s.S, (long long)s.Hq, (long long)s.Hkv, (long long)s.D, (long long)s.Dv,
               scale);
    int64_t nq = s.B * s.S * s.Hq * s.D, nk = s.B * s.S * s.Hkv * s.D;
    int64_t nv = s.B * s.S * s.Hkv * s.Dv, no = s.B * s.S * s.Hq * s.Dv;
    float *q = hrand(c, nq, -2, 2), *k = hrand(c, nk, -2, 2), *v = hrand(c, nv, -1, 1);
    float *out = hf(c, no), *d = ddirty(c, no);
    /* guard: one slot more, where a thread beyond the slots would write */
    int64_t wf = ws_floats(xm_ws_attention(s.B, s.S, s.Hq));
    int64_t wg = xm_ws_attn_rows(s.S) * s.S + GUARD_FLOATS;
    float *ws = ws_new_guarded(c, wf, wg);
    KT->attention(df(c, q, nq), df(c, k, nk), df(c, v, nv), d, s.B, s.S, s.Hq, s.Hkv, s.D, s.Dv,
                  scale, ws);
    xm_ref_attention(q, k, v, out, s.B, s.S, s.Hq, s.Hkv, s.D, s.Dv, scale);
    chk_f(c, "out", d, out, no, tol_sum(s.S));
    ws_guard_n(c, ws, wf, wg, "guard after ws");
  }
}

static void t_attention_grad(cx_t *c) {
  for (int i = 0; i < N_ATTN; i++) {
    attn_t s = k_attn[i];
    float scale = s.scale ? s.scale : (float)(1.0 / sqrt((double)s.D));
    case_begin(c, "B=%lld S=%lld Hq=%lld Hkv=%lld D=%lld Dv=%lld scale=%g", (long long)s.B,
               (long long)s.S, (long long)s.Hq, (long long)s.Hkv, (long long)s.D, (long long)s.Dv,
               scale);
    int64_t nq = s.B * s.S * s.Hq * s.D, nk = s.B * s.S * s.Hkv * s.D;
    int64_t nv = s.B * s.S * s.Hkv * s.Dv, no = s.B * s.S * s.Hq * s.Dv;
    float *q = hrand(c, nq, -2, 2), *k = hrand(c, nk, -2, 2), *v = hrand(c, nv, -1, 1);
    float *g = hrand(c, no, -1, 1);
    float *dq = hf(c, nq), *dk = hf(c, nk), *dv = hf(c, nv);
    float *ddq = ddirty(c, nq), *ddk = ddirty(c, nk), *ddv = ddirty(c, nv);
    int64_t wf = ws_floats(xm_ws_attention_grad(s.B, s.S, s.Hkv));
    int64_t wg = 2 * xm_ws_attn_rows(s.S) * s.S + GUARD_FLOATS;
    float *ws = ws_new_guarded(c, wf, wg);
    KT->attention_grad(df(c, g, no), df(c, q, nq), df(c, k, nk), df(c, v, nv), ddq, ddk, ddv, s.B,
                       s.S, s.Hq, s.Hkv, s.D, s.Dv, scale, ws);
    xm_ref_attention_grad(g, q, k, v, dq, dk, dv, s.B, s.S, s.Hq, s.Hkv, s.D, s.Dv, scale);
    chk_f(c, "dq", ddq, dq, nq, TOL_GRAD);
    chk_f(c, "dk", ddk, dk, nk, TOL_GRAD);
    chk_f(c, "dv", ddv, dv, nv, TOL_GRAD);
    ws_guard_n(c, ws, wf, wg, "guard after ws");
  }
}

static const int64_t k_emb[][3] = {{1, 1, 1}, {9, 5, 7}, {20, 3, 16}, {4, 50, 9}}; /* n, V, H */

static int32_t *tokens(cx_t *c, int64_t n, int64_t V) {
  int32_t *t = hi32(c, n);
  for (int64_t i = 0; i < n; i++)
    t[i] = (int32_t)irand(c, V);
  if (n > 2) t[n - 1] = t[0]; /* a repeated token */
  return t;
}

static void t_embedding(cx_t *c) {
  for (int i = 0; i < 4; i++) {
    int64_t n = k_emb[i][0], V = k_emb[i][1], H = k_emb[i][2];
    case_begin(c, "n_tok=%lld V=%lld H=%lld", (long long)n, (long long)V, (long long)H);
    int32_t *tok = tokens(c, n, V);
    float *table = hrand(c, V * H, -1, 1), *y = hf(c, n * H), *d = ddirty(c, n * H + TAIL);
    KT->embedding(di(c, tok, n), df(c, table, V * H), d, n, H);
    xm_ref_embedding(tok, table, y, n, H);
    chk_f(c, "y", d, y, n * H, TOL_EXACT);
    chk_untouched(c, "y past n_tok rows", d, n * H, n * H + TAIL);
  }
}

static void t_embedding_grad(cx_t *c) {
  for (int i = 0; i < 4; i++) {
    int64_t n = k_emb[i][0], V = k_emb[i][1], H = k_emb[i][2];
    case_begin(c, "n_tok=%lld V=%lld H=%lld (repeated and unused ids)", (long long)n, (long long)V,
               (long long)H);
    int32_t *tok = tokens(c, n, V);
    float *dy = hrand(c, n * H, -1, 1), *dt = hf(c, V * H), *d = ddirty(c, V * H);
    KT->embedding_grad(df(c, dy, n * H), di(c, tok, n), d, n, V, H);
    xm_ref_embedding_grad(dy, tok, dt, n, V, H);
    float *got = chk_f(c, "dtable", d, dt, V * H, TOL_SHORT);
    for (int64_t v = 0; v < V; v++) {
      int used = 0;
      for (int64_t j = 0; j < n; j++)
        used |= tok[j] == v;
      if (!used)
        for (int64_t h = 0; h < H; h++)
          want_zero(c, "dtable row of an unused id", got, v * H + h);
    }
  }
}

static const int64_t k_ce[][2] = {{1, 1}, {1, 2}, {6, 11}, {4, 50}, {3, 7}}; /* rows, V */

static float *logits_for(cx_t *c, int i, int64_t n) {
  /* the last case has large logits: the softmax must be shifted */
  return i == 4 ? hrand(c, n, -60, 60) : hrand(c, n, -4, 4);
}

static void t_cross_entropy(cx_t *c) {
  for (int i = 0; i < 5; i++) {
    int64_t rows = k_ce[i][0], V = k_ce[i][1];
    case_begin(c, "rows=%lld V=%lld%s", (long long)rows, (long long)V,
               i == 4 ? " logits in [-60, 60]" : "");
    float *l = logits_for(c, i, rows * V);
    int32_t *lab = tokens(c, rows, V);
    float loss, *d = ddirty(c, 1);
    KT->cross_entropy(df(c, l, rows * V), di(c, lab, rows), d, rows, V);
    xm_ref_cross_entropy(l, lab, &loss, rows, V);
    chk_f(c, "loss", d, &loss, 1, TOL_SUM);
  }
}

static void t_cross_entropy_grad(cx_t *c) {
  for (int i = 0; i < 5; i++) {
    int64_t rows = k_ce[i][0], V = k_ce[i][1];
    float dloss = i % 2 ? 0.37f : 1.0f;
    case_begin(c, "rows=%lld V=%lld dloss=%g", (long long)rows, (long long)V, dloss);
    float *l = logits_for(c, i, rows * V);
    int32_t *lab = tokens(c, rows, V);
    float *g = hf(c, rows * V), *d = ddirty(c, rows * V);
    KT->cross_entropy_grad(df(c, &dloss, 1), df(c, l, rows * V), di(c, lab, rows), d, rows, V);
    xm_ref_cross_entropy_grad(&dloss, l, lab, g, rows, V);
    chk_f(c, "dlogits", d, g, rows * V, (tol_t){1e-5, 1e-7});
  }
}

/* ---- router -------------------------------------------------------------- */

static const int64_t k_router[][2] = {{1, 1}, {5, 8}, {3, 64}, {17, 6}, {600, 64}}; /* T, E */

static void t_router_score(cx_t *c) {
  for (int sc = 0; sc < 2; sc++)
    for (int i = 0; i < 5; i++) {
      int64_t T = k_router[i][0], E = k_router[i][1];
      case_begin(c, "T=%lld E=%lld %s", (long long)T, (long long)E, sc ? "sigmoid" : "softmax");
      float *l = hrand(c, T * E, -8, 8), *s = hf(c, T * E), *d = ddirty(c, T * E);
      KT->router_score(df(c, l, T * E), d, T, E, sc);
      xm_ref_router_score(l, s, T, E, sc);
      chk_f(c, "scores", d, s, T * E, TOL_TRANS);
    }
}

static void t_router_score_grad(cx_t *c) {
  for (int sc = 0; sc < 2; sc++)
    for (int i = 0; i < 5; i++) {
      int64_t T = k_router[i][0], E = k_router[i][1];
      case_begin(c, "T=%lld E=%lld %s", (long long)T, (long long)E, sc ? "sigmoid" : "softmax");
      float *l = hrand(c, T * E, -4, 4), *s = hf(c, T * E), *g = hrand(c, T * E, -1, 1);
      xm_ref_router_score(l, s, T, E, sc);
      float *dl = hf(c, T * E), *d = ddirty(c, T * E);
      KT->router_score_grad(df(c, g, T * E), df(c, s, T * E), d, T, E, sc);
      xm_ref_router_score_grad(g, s, dl, T, E, sc);
      chk_f(c, "dlogits", d, dl, T * E, TOL_GRAD);
    }
}

typedef struct {
  int64_t T, E, k, n_group, topk_group;
  int norm, scoring;
  float r;
  int ties; /* scores and bias on a grid of 1/8, 1/16: equal values */
  int bias; /* 0: zero bias */
  const char *what;
} topk_t;
static const topk_t k_topk[] = {
    {6, 8, 2, 1, 1, 1, SOFTMAX, 1.0f, 0, 0, "plain"},
    {9, 16, 4, 4, 2, 1, SIGMOID, 2.5f, 0, 1, "group-limited, sigmoid (sum of top 2)"},
    {9, 16, 3, 4, 2, 0, SOFTMAX, 1.0f, 0, 1, "group-limited, softmax (max), unnormalised"},
    {7, 6, 1, 1, 1, 1, SOFTMAX, 1.0f, 0, 0, "k = 1 normalised"},
    {7, 6, 1, 1, 1, 0, SIGMOID, 16.0f, 0, 1, "k = 1 unnormalised, scaled"},
    {12, 8, 3, 1, 1, 1, SIGMOID, 1.0f, 1, 0, "ties"},
    {12, 12, 3, 4, 2, 1, SIGMOID, 1.0f, 1, 1, "ties, groups tied"},
    {12, 12, 2, 6, 3, 1, SOFTMAX, 1.0f, 1, 1, "ties, softmax groups"},
    {5, 6, 6, 1, 1, 0, SOFTMAX, 1.0f, 0, 1, "k = E"},
    {8, 8, 2, 4, 4, 1, SIGMOID, 1.0f, 0, 1, "n_group > 1, topk_group = n_group"},
    {5, 20, 4, 5, 1, 1, SIGMOID, 2.0f, 0, 1, "one group kept"},
    {600, 64, 6, 8, 3, 1, SIGMOID, 2.5f, 0, 1, "DeepSeek-V3-like, above the CPU's thresholds"},
};
#define N_TOPK ((int)(sizeof k_topk / sizeof k_topk[0]))

/* Scores as the router gives them (or on a grid, for ties) and a bias. */
static void topk_inputs(cx_t *c, const topk_t *s, float **scores, float **bias) {
  int64_t n = s->T * s->E;
  float *l = hrand(c, n, -3, 3);
  *scores = hf(c, n);
  if (s->ties) {
    for (int64_t i = 0; i < n; i++)
      (*scores)[i] = 0.125f * (float)(1 + irand(c, 4));
  } else {
    xm_ref_router_score(l, *scores, s->T, s->E, s->scoring);
  }
  *bias = hf(c, s->E);
  if (s->bias)
    for (int64_t e = 0; e < s->E; e++)
      (*bias)[e] = s->ties ? 0.0625f * (float)irand(c, 3) : frand(c, -0.1f, 0.1f);
}

static void t_topk_route(cx_t *c) {
  for (int i = 0; i < N_TOPK; i++) {
    const topk_t *s = &k_topk[i];
    case_begin(c, "%s: T=%lld E=%lld k=%lld n_group=%lld topk_group=%lld norm=%d r=%g", s->what,
               (long long)s->T, (long long)s->E, (long long)s->k, (long long)s->n_group,
               (long long)s->topk_group, s->norm, s->r);
    float *sc, *b;
    topk_inputs(c, s, &sc, &b);
    int64_t N = s->T * s->k;
    int32_t *ex = hi32(c, N);
    float *w = hf(c, N);
    int32_t *dex = ddirty(c, N);
    float *dw = ddirty(c, N);
    KT->topk_route(df(c, sc, s->T * s->E), df(c, b, s->E), dex, dw, s->T, s->E, s->k, s->n_group,
                   s->topk_group, s->norm, s->r, s->scoring);
    xm_ref_topk_route(sc, b, ex, w, s->T, s->E, s->k, s->n_group, s->topk_group, s->norm, s->r,
                      s->scoring);
    chk_i(c, "experts", dex, ex, N);
    chk_f(c, "weights", dw, w, N, TOL_SHORT);
  }
}

static void t_topk_route_grad(cx_t *c) {
  for (int i = 0; i < N_TOPK; i++) {
    const topk_t *s = &k_topk[i];
    case_begin(c, "%s: T=%lld E=%lld k=%lld norm=%d r=%g", s->what, (long long)s->T,
               (long long)s->E, (long long)s->k, s->norm, s->r);
    float *sc, *b;
    topk_inputs(c, s, &sc, &b);
    int64_t N = s->T * s->k, TE = s->T * s->E;
    int32_t *ex = hi32(c, N);
    float *w = hf(c, N), *g = hrand(c, N, -1, 1), *ds = hf(c, TE);
    xm_ref_topk_route(sc, b, ex, w, s->T, s->E, s->k, s->n_group, s->topk_group, s->norm, s->r,
                      s->scoring);
    float *d = ddirty(c, TE);
    KT->topk_route_grad(df(c, g, N), df(c, sc, TE), di(c, ex, N), d, s->T, s->E, s->k, s->norm,
                        s->r);
    xm_ref_topk_route_grad(g, sc, ex, ds, s->T, s->E, s->k, s->norm, s->r);
    float *got = chk_f(c, "dscores", d, ds, TE, TOL_GRAD);
    for (int64_t t = 0; t < s->T; t++)
      for (int64_t e = 0; e < s->E; e++) {
        int picked = 0;
        for (int64_t j = 0; j < s->k; j++)
          picked |= ex[t * s->k + j] == e;
        if (!picked) want_zero(c, "dscores of an expert not picked", got, t * s->E + e);
      }
  }
}

/* ---- padding-free MoE ------------------------------------------------------ */

static void t_permute(cx_t *c) {
  static const route_spec_t cases[] = {
      {13, 2, 5, 0, R_RANDOM},     {19, 3, 6, 0, R_SPARSE},   {16, 2, 4, 5, R_TIES},
      {16, 2, 4, 100, R_RANDOM},   {0, 2, 4, 0, R_RANDOM},    {0, 1, 3, 3, R_RANDOM},
      {10, 1, 4, 0, R_RANDOM},     {11, 1, 3, 4, R_ONE},      {12, 3, 5, 1, R_TIES},
      {7, 2, 9, 0, R_RANDOM},                                 /* E > T: several experts empty */
      {20000, 2, 16, 0, R_RANDOM}, {2000, 2, 8, 400, R_TIES}, /* above the CPU's thresholds */
  };
  for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
    const route_spec_t *s = &cases[i];
    route_t r = make_route(c, s->T, s->k, s->E, s->cap, s->shape);
    case_begin(c, "%s", r.desc);
    int32_t *dind = ddirty(c, r.N), *dbin = ddirty(c, r.N), *dtpe = ddirty(c, r.E);
    int64_t n = KT->permute(di(c, r.experts, r.N), df(c, r.weights, r.N), dind, dbin, dtpe, r.T,
                            r.k, r.E, r.cap);
    if (n != r.n) fail(c, "returned n = %lld, want %lld", (long long)n, (long long)r.n);
    chk_i(c, "tpe", dtpe, r.tpe, r.E);
    chk_i(c, "indices", dind, r.indices, r.n);
    chk_i(c, "bin_ids", dbin, r.bin_ids, r.n);
  }
}

static void t_gather_rows(cx_t *c) {
  for (int i = 0; i < N_ROUTES_MOE; i++) {
    route_t r = route_case_moe(c, i);
    int64_t H = 7;
    case_begin(c, "%s H=%lld", r.desc, (long long)H);
    float *x = hrand(c, r.T * H, -1, 1), *y = hf(c, r.N * H), *d = ddirty(c, r.N * H);
    KT->gather_rows(df(c, x, r.T * H), di(c, r.indices, r.N), d, r.n, H, r.k);
    xm_ref_gather_rows(x, r.indices, y, r.n, H, r.k);
    chk_f(c, "y", d, y, r.n * H, TOL_EXACT);
    chk_untouched(c, "y past row n", d, r.n * H, r.N * H);
  }
}

/* Tokens without a kept slot get exact zeros in a [T, width] output. */
static void zero_rows(cx_t *c, const char *what, const route_t *r, const float *got,
                      int64_t width) {
  for (int64_t t = 0; t < r->T; t++)
    if (!r->has_row[t])
      for (int64_t h = 0; h < width; h++)
        want_zero(c, what, got, t * width + h);
}

static void t_gather_rows_grad(cx_t *c) {
  for (int i = 0; i < N_ROUTES_MOE; i++) {
    route_t r = route_case_moe(c, i);
    int64_t H = 9;
    case_begin(c, "%s H=%lld", r.desc, (long long)H);
    float *ddy;
    float *dy = routed_input(c, &r, H, &ddy);
    float *dx = hf(c, r.T * H), *d = ddirty(c, r.T * H);
    KT->gather_rows_grad(ddy, di(c, r.indices, r.N), d, r.n, r.T, H, r.k);
    xm_ref_gather_rows_grad(dy, r.indices, dx, r.n, r.T, H, r.k);
    float *got = chk_f(c, "dx", d, dx, r.T * H, TOL_SHORT);
    zero_rows(c, "dx of a token without rows", &r, got, H);
  }
}

static const int64_t k_gK = 12, k_gM = 10; /* neither a multiple of 8 */

static void t_grouped_matmul(cx_t *c) {
  for (int i = 0; i < N_ROUTES_MOE; i++) {
    route_t r = route_case_moe(c, i);
    int64_t K = k_gK, M = k_gM;
    case_begin(c, "%s K=%lld M=%lld", r.desc, (long long)K, (long long)M);
    float *dx;
    float *x = routed_input(c, &r, K, &dx);
    float *w = hrand(c, r.E * M * K, -1, 1), *y = hf(c, r.N * M), *d = ddirty(c, r.N * M);
    KT->grouped_matmul(dx, df(c, w, r.E * M * K), di(c, r.tpe, r.E), d, r.E, K, M);
    xm_ref_grouped_matmul(x, w, r.tpe, y, r.E, K, M);
    chk_f(c, "y", d, y, r.n * M, TOL_SUM);
    chk_untouched(c, "y past row n", d, r.n * M, r.N * M);
  }
}

static void t_grouped_matmul_dx(cx_t *c) {
  for (int i = 0; i < N_ROUTES_MOE; i++) {
    route_t r = route_case_moe(c, i);
    int64_t K = k_gK, M = k_gM;
    case_begin(c, "%s K=%lld M=%lld", r.desc, (long long)K, (long long)M);
    float *ddy;
    float *dy = routed_input(c, &r, M, &ddy);
    float *w = hrand(c, r.E * M * K, -1, 1), *dx = hf(c, r.N * K), *d = ddirty(c, r.N * K);
    KT->grouped_matmul_dx(ddy, df(c, w, r.E * M * K), di(c, r.tpe, r.E), d, r.E, K, M);
    xm_ref_grouped_matmul_dx(dy, w, r.tpe, dx, r.E, K, M);
    chk_f(c, "dx", d, dx, r.n * K, TOL_SUM);
    chk_untouched(c, "dx past row n", d, r.n * K, r.N * K);
  }
}

/* dw[E,M,K] of an expert with no rows: zeros (acc 0) or unchanged, bit
 * for bit (acc 1). */
static void empty_experts(cx_t *c, const route_t *r, const float *got, const float *before,
                          int64_t MK, int acc) {
  for (int64_t e = 0; e < r->E; e++) {
    if (r->tpe[e]) continue;
    for (int64_t j = 0; j < MK; j++) {
      if (!acc) {
        want_zero(c, "dw of an expert without rows", got, e * MK + j);
      } else if (f32_bits(got[e * MK + j]) != f32_bits(before[e * MK + j])) {
        fail(c, "dw of an expert without rows, index %lld: %.9g changed to %.9g",
             (long long)(e * MK + j), before[e * MK + j], got[e * MK + j]);
        return;
      }
    }
  }
}

static void grouped_dw_cases(cx_t *c, int acc) {
  for (int i = 0; i < N_ROUTES_MOE; i++) {
    route_t r = route_case_moe(c, i);
    int64_t K = k_gK, M = k_gM, MK = M * K;
    case_begin(c, "%s K=%lld M=%lld%s", r.desc, (long long)K, (long long)M,
               acc ? " onto non-zero dw" : "");
    float *ddy, *dx;
    float *dy = routed_input(c, &r, M, &ddy), *x = routed_input(c, &r, K, &dx);
    float *dw = acc ? hrand(c, r.E * MK, -1, 1) : hf(c, r.E * MK);
    float *before = hcopy(c, dw, r.E * MK);
    float *d = acc ? df(c, dw, r.E * MK) : ddirty(c, r.E * MK);
    if (acc) {
      KT->grouped_matmul_dw_acc(ddy, dx, di(c, r.tpe, r.E), d, r.E, K, M);
      xm_ref_grouped_matmul_dw_acc(dy, x, r.tpe, dw, r.E, K, M);
    } else {
      KT->grouped_matmul_dw(ddy, dx, di(c, r.tpe, r.E), d, r.E, K, M);
      xm_ref_grouped_matmul_dw(dy, x, r.tpe, dw, r.E, K, M);
    }
    float *got = chk_f(c, "dw", d, dw, r.E * MK, tol_sum(max_rows(&r)));
    empty_experts(c, &r, got, before, MK, acc);
  }
}
static void t_grouped_matmul_dw(cx_t *c) { grouped_dw_cases(c, 0); }
static void t_grouped_matmul_dw_acc(cx_t *c) { grouped_dw_cases(c, 1); }

static void t_scatter_combine(cx_t *c) {
  for (int i = 0; i < N_ROUTES_MOE; i++) {
    route_t r = route_case_moe(c, i);
    int64_t H = 11;
    case_begin(c, "%s H=%lld", r.desc, (long long)H);
    float *dy;
    float *y = routed_input(c, &r, H, &dy);
    float *out = hf(c, r.T * H), *d = ddirty(c, r.T * H);
    KT->scatter_combine(dy, di(c, r.indices, r.N), df(c, r.weights, r.N), d, r.n, r.T, r.k, H);
    xm_ref_scatter_combine(y, r.indices, r.weights, out, r.n, r.T, r.k, H);
    float *got = chk_f(c, "out", d, out, r.T * H, TOL_SHORT);
    zero_rows(c, "out of a token without rows", &r, got, H);
  }
}

/* The combine-weight gradient of a dropped slot is exactly 0. */
static void dropped_slots(cx_t *c, const route_t *r, const float *got) {
  for (int64_t s = 0; s < r->N; s++)
    if (!r->kept[s]) want_zero(c, "dweights of a dropped slot", got, s);
}

static void t_scatter_combine_grad(cx_t *c) {
  for (int i = 0; i < N_ROUTES_MOE; i++) {
    route_t r = route_case_moe(c, i);
    int64_t H = 11;
    case_begin(c, "%s H=%lld", r.desc, (long long)H);
    float *ddy_in;
    float *y = routed_input(c, &r, H, &ddy_in);
    float *dout = hrand(c, r.T * H, -1, 1);
    float *dy = hf(c, r.N * H), *dwt = hf(c, r.N);
    float *ddy = ddirty(c, r.N * H), *ddw = ddirty(c, r.N);
    KT->scatter_combine_grad(df(c, dout, r.T * H), ddy_in, di(c, r.indices, r.N),
                             df(c, r.weights, r.N), ddy, ddw, r.n, r.T, r.k, H);
    xm_ref_scatter_combine_grad(dout, y, r.indices, r.weights, dy, dwt, r.n, r.T, r.k, H);
    chk_f(c, "dy", ddy, dy, r.n * H, TOL_ROUND);
    chk_untouched(c, "dy past row n", ddy, r.n * H, r.N * H);
    float *got = chk_f(c, "dweights", ddw, dwt, r.N, TOL_SUM);
    dropped_slots(c, &r, got);
  }
}

typedef struct {
  int64_t P, L, width;
  int zeros; /* 0: random counts 0..4; 1: some zero; 2: all zero */
} chunks_t;
static const chunks_t k_chunks[] = {
    {3, 2, 5, 0}, {1, 1, 4, 0}, {2, 3, 7, 1}, {4, 4, 1, 1}, {2, 3, 3, 2}};

static void chunk_cases(cx_t *c, int unsort) {
  for (int i = 0; i < 5; i++) {
    chunks_t s = k_chunks[i];
    int32_t *counts = hi32(c, s.P * s.L);
    int64_t rows = 0;
    for (int64_t j = 0; j < s.P * s.L; j++) {
      counts[j] = s.zeros == 2 ? 0 : (int32_t)(1 + irand(c, 4));
      if (s.zeros == 1 && j % 3 == 1) counts[j] = 0;
      rows += counts[j];
    }
    case_begin(c, "P=%lld L=%lld width=%lld rows=%lld", (long long)s.P, (long long)s.L,
               (long long)s.width, (long long)rows);
    int64_t n = rows * s.width;
    float *x = hrand(c, n, -1, 1), *y = hf(c, n), *d = ddirty(c, n + TAIL * s.width);
    float *dx = df(c, x, n);
    if (unsort) {
      KT->unsort_chunks(dx, di(c, counts, s.P * s.L), s.P, s.L, s.width, d);
      xm_ref_unsort_chunks(x, counts, s.P, s.L, s.width, y);
    } else {
      KT->sort_chunks(dx, di(c, counts, s.P * s.L), s.P, s.L, s.width, d);
      xm_ref_sort_chunks(x, counts, s.P, s.L, s.width, y);
    }
    chk_f(c, "y", d, y, n, TOL_EXACT);
    chk_untouched(c, "y past sum(counts) rows", d, n, n + TAIL * s.width);
    /* the other direction restores x */
    float *back = ddirty(c, n);
    int32_t *dcounts = di(c, counts, s.P * s.L);
    if (unsort)
      KT->sort_chunks(d, dcounts, s.P, s.L, s.width, back);
    else
      KT->unsort_chunks(d, dcounts, s.P, s.L, s.width, back);
    chk_f(c, "round trip", back, x, n, TOL_EXACT);
  }
}
static void t_sort_chunks(cx_t *c) { chunk_cases(c, 0); }
static void t_unsort_chunks(cx_t *c) { chunk_cases(c, 1); }

static const int64_t k_aux[][3] = {{9, 6, 2}, {1, 1, 1}, {16, 4, 1}, {20, 8, 3}}; /* T E k */

static void aux_cases(cx_t *c, int grad) {
  for (int i = 0; i < 4; i++) {
    int64_t T = k_aux[i][0], E = k_aux[i][1], k = k_aux[i][2];
    float alpha = i % 2 ? 0.5f : 0.01f, dloss = 0.75f;
    case_begin(c, "T=%lld E=%lld k=%lld alpha=%g", (long long)T, (long long)E, (long long)k, alpha);
    float *l = hrand(c, T * E, -3, 3), *s = hf(c, T * E);
    xm_ref_router_score(l, s, T, E, SOFTMAX);
    route_t r = make_route(c, T, k, E, 0, R_RANDOM);
    if (grad) {
      float *ds = hf(c, T * E), *d = ddirty(c, T * E);
      KT->aux_loss_grad(df(c, &dloss, 1), df(c, s, T * E), di(c, r.experts, r.N), d, T, E, k,
                        alpha);
      xm_ref_aux_loss_grad(&dloss, s, r.experts, ds, T, E, k, alpha);
      chk_f(c, "dscores", d, ds, T * E, TOL_SHORT);
    } else {
      float loss, *d = ddirty(c, 1);
      KT->aux_loss(df(c, s, T * E), di(c, r.experts, r.N), d, T, E, k, alpha);
      xm_ref_aux_loss(s, r.experts, &loss, T, E, k, alpha);
      chk_f(c, "loss", d, &loss, 1, TOL_SUM);
    }
  }
}
static void t_aux_loss(cx_t *c) { aux_cases(c, 0); }
static void t_aux_loss_grad(cx_t *c) { aux_cases(c, 1); }

/* ---- fused gather / combine grouped GEMMs ---------------------------------- */

typedef struct {
  int64_t tile_rows, slots;
} tiling_t;
/* Tiles of 1 row, of sizes that divide no run, one larger than any run. */
static const tiling_t k_tilings[] = {{1, 1}, {4, 2}, {7, 3}, {5, 1}, {64, 1}};
#define N_TILINGS ((int)(sizeof k_tilings / sizeof k_tilings[0]))

/* Exactly the documented scratch (tile_rows * slots * W floats, NaN, so
 * reading what was not staged shows), then a guard of one more thread's
 * slice and GUARD_FLOATS, which must survive: a kernel that runs one
 * thread too many lands in the guard and is reported, not a heap overrun. */
static float *scratch_new(cx_t *c, tiling_t t, int64_t W, int64_t *floats) {
  *floats = t.tile_rows * t.slots * W;
  c->guard_floats = t.tile_rows * W + GUARD_FLOATS;
  float *s = dnew(c, sizeof(float) * (size_t)(*floats + c->guard_floats));
  c->be->fill32(c->be, s, GARBAGE_BITS, (size_t)*floats, NULL);
  c->be->fill32(c->be, s + *floats, GUARD_BITS, (size_t)c->guard_floats, NULL);
  return s;
}

static void scratch_guard(cx_t *c, const float *s, int64_t floats) {
  chk_bits(c, "guard after scratch", s, floats, floats + c->guard_floats, GUARD_BITS);
}

/* The fused cases: every routing with every tiling at K = 12, M = 10,
 * then three of 3000 slots at K = 48, M = 40 (5.8M multiply-adds, above
 * the CPU kernels' threshold for a team of `slots` threads): dropless with
 * the sparse experts, dropping under capacity, and slots 1. */
typedef struct {
  route_t r;
  tiling_t t;
  int64_t K, M;
} fcase_t;
#define N_FUSED_SMALL (N_ROUTES * N_TILINGS)
#define N_FUSED (N_FUSED_SMALL + 3)

static fcase_t fused_case(cx_t *c, int ci, const char *extra) {
  fcase_t f;
  if (ci < N_FUSED_SMALL) {
    f.r = route_case(c, ci / N_TILINGS);
    f.t = k_tilings[ci % N_TILINGS];
    f.K = k_gK;
    f.M = k_gM;
  } else if (ci == N_FUSED_SMALL) {
    f.r = make_route(c, 1500, 2, 6, 0, R_SPARSE);
    f.t = (tiling_t){16, 3};
    f.K = 48;
    f.M = 40;
  } else if (ci == N_FUSED_SMALL + 1) {
    f.r = make_route(c, 1500, 2, 6, 400, R_TIES);
    f.t = (tiling_t){128, 2};
    f.K = 48;
    f.M = 40;
  } else { /* slots 1 above the threshold: a second thread would hit the guard */
    f.r = make_route(c, 1500, 2, 6, 0, R_RANDOM);
    f.t = (tiling_t){8, 1};
    f.K = 48;
    f.M = 40;
  }
  case_begin(c, "%s K=%lld M=%lld tile_rows=%lld slots=%lld%s", f.r.desc, (long long)f.K,
             (long long)f.M, (long long)f.t.tile_rows, (long long)f.t.slots, extra);
  return f;
}

static void t_gather_grouped_matmul(cx_t *c) {
  for (int ci = 0; ci < N_FUSED; ci++) {
    fcase_t f = fused_case(c, ci, "");
    route_t r = f.r;
    tiling_t t = f.t;
    int64_t K = f.K, M = f.M;
    float *x = hrand(c, r.T * K, -1, 1), *w = hrand(c, r.E * M * K, -1, 1);
    float *y = hf(c, r.N * M), *d = ddirty(c, r.N * M);
    int64_t sf;
    float *s = scratch_new(c, t, K, &sf);
    KT->gather_grouped_matmul(df(c, x, r.T * K), di(c, r.indices, r.N), di(c, r.tpe, r.E),
                              df(c, w, r.E * M * K), d, r.E, K, M, r.k, s, t.tile_rows, t.slots);
    xm_ref_gather_grouped_matmul(x, r.indices, r.tpe, w, y, r.E, K, M, r.k);
    chk_f(c, "y", d, y, r.n * M, TOL_SUM);
    chk_untouched(c, "y past row n", d, r.n * M, r.N * M);
    scratch_guard(c, s, sf);
  }
}

static void t_grouped_matmul_combine(cx_t *c) {
  for (int ci = 0; ci < N_FUSED; ci++) {
    fcase_t f = fused_case(c, ci, "");
    route_t r = f.r;
    tiling_t t = f.t;
    int64_t K = f.K, M = f.M;
    float *dh;
    float *h = routed_input(c, &r, K, &dh);
    float *w = hrand(c, r.E * M * K, -1, 1), *out = hf(c, r.T * M), *d = ddirty(c, r.T * M);
    int64_t sf;
    float *s = scratch_new(c, t, M, &sf);
    KT->grouped_matmul_combine(dh, df(c, w, r.E * M * K), di(c, r.tpe, r.E), di(c, r.indices, r.N),
                               df(c, r.weights, r.N), d, r.E, K, M, r.T, r.k, s, t.tile_rows,
                               t.slots);
    xm_ref_grouped_matmul_combine(h, w, r.tpe, r.indices, r.weights, out, r.E, K, M, r.T, r.k);
    float *got = chk_f(c, "out", d, out, r.T * M, TOL_SUM);
    zero_rows(c, "out of a token without rows", &r, got, M);
    scratch_guard(c, s, sf);
  }
}

static void t_gather_grouped_matmul_dx(cx_t *c) {
  for (int ci = 0; ci < N_FUSED; ci++) {
    fcase_t f = fused_case(c, ci, "");
    route_t r = f.r;
    tiling_t t = f.t;
    int64_t K = f.K, M = f.M;
    float *ddy;
    float *dy = routed_input(c, &r, M, &ddy);
    float *w = hrand(c, r.E * M * K, -1, 1), *dx = hf(c, r.T * K), *d = ddirty(c, r.T * K);
    int64_t sf;
    float *s = scratch_new(c, t, K, &sf);
    KT->gather_grouped_matmul_dx(ddy, df(c, w, r.E * M * K), di(c, r.tpe, r.E),
                                 di(c, r.indices, r.N), d, r.E, K, M, r.T, r.k, s, t.tile_rows,
                                 t.slots);
    xm_ref_gather_grouped_matmul_dx(dy, w, r.tpe, r.indices, dx, r.E, K, M, r.T, r.k);
    float *got = chk_f(c, "dx", d, dx, r.T * K, TOL_SUM);
    zero_rows(c, "dx of a token without rows", &r, got, K);
    scratch_guard(c, s, sf);
  }
}

static void t_gather_grouped_matmul_dw(cx_t *c) {
  for (int beta = 0; beta <= 1; beta++) {
    for (int ci = 0; ci < N_FUSED; ci++) {
      fcase_t f = fused_case(c, ci, beta ? " beta=1 onto non-zero dw" : " beta=0");
      route_t r = f.r;
      tiling_t t = f.t;
      int64_t K = f.K, M = f.M, MK = M * K;
      float *ddy;
      float *dy = routed_input(c, &r, M, &ddy);
      float *x = hrand(c, r.T * K, -1, 1);
      float *dw = beta ? hrand(c, r.E * MK, -1, 1) : hf(c, r.E * MK);
      float *before = hcopy(c, dw, r.E * MK);
      float *d = beta ? df(c, dw, r.E * MK) : ddirty(c, r.E * MK);
      int64_t sf;
      float *s = scratch_new(c, t, K, &sf);
      KT->gather_grouped_matmul_dw(ddy, df(c, x, r.T * K), di(c, r.indices, r.N), di(c, r.tpe, r.E),
                                   d, r.E, K, M, r.k, (float)beta, s, t.tile_rows, t.slots);
      xm_ref_gather_grouped_matmul_dw(dy, x, r.indices, r.tpe, dw, r.E, K, M, r.k, (float)beta);
      float *got = chk_f(c, "dw", d, dw, r.E * MK, tol_sum(max_rows(&r)));
      empty_experts(c, &r, got, before, MK, beta);
      scratch_guard(c, s, sf);
    }
  }
}

static void t_grouped_matmul_combine_grad(cx_t *c) {
  for (int ci = 0; ci < N_FUSED; ci++) {
    fcase_t f = fused_case(c, ci, "");
    route_t r = f.r;
    tiling_t t = f.t;
    int64_t K = f.K, M = f.M;
    float *dh_in;
    float *h = routed_input(c, &r, K, &dh_in);
    float *dout = hrand(c, r.T * M, -1, 1), *w = hrand(c, r.E * M * K, -1, 1);
    float *dh = hf(c, r.N * K), *dwt = hf(c, r.N);
    float *ddh = ddirty(c, r.N * K), *ddw = ddirty(c, r.N);
    int64_t sf;
    float *s = scratch_new(c, t, M, &sf);
    KT->grouped_matmul_combine_grad(df(c, dout, r.T * M), dh_in, df(c, w, r.E * M * K),
                                    di(c, r.tpe, r.E), di(c, r.indices, r.N), df(c, r.weights, r.N),
                                    ddh, ddw, r.E, K, M, r.T, r.k, s, t.tile_rows, t.slots);
    xm_ref_grouped_matmul_combine_grad(dout, h, w, r.tpe, r.indices, r.weights, dh, dwt, r.E, K, M,
                                       r.T, r.k);
    chk_f(c, "dh", ddh, dh, r.n * K, TOL_SUM);
    chk_untouched(c, "dh past row n", ddh, r.n * K, r.N * K);
    float *got = chk_f(c, "dweights", ddw, dwt, r.N, TOL_SUM);
    dropped_slots(c, &r, got);
    scratch_guard(c, s, sf);
  }
}

static void t_grouped_matmul_combine_dw(cx_t *c) {
  for (int beta = 0; beta <= 1; beta++) {
    for (int ci = 0; ci < N_FUSED; ci++) {
      fcase_t f = fused_case(c, ci, beta ? " beta=1 onto non-zero dw" : " beta=0");
      route_t r = f.r;
      tiling_t t = f.t;
      int64_t K = f.K, M = f.M, MK = M * K;
      float *dh;
      float *h = routed_input(c, &r, K, &dh);
      float *dout = hrand(c, r.T * M, -1, 1);
      float *dw = beta ? hrand(c, r.E * MK, -1, 1) : hf(c, r.E * MK);
      float *before = hcopy(c, dw, r.E * MK);
      float *d = beta ? df(c, dw, r.E * MK) : ddirty(c, r.E * MK);
      int64_t sf;
      float *s = scratch_new(c, t, M, &sf);
      KT->grouped_matmul_combine_dw(df(c, dout, r.T * M), dh, di(c, r.indices, r.N),
                                    df(c, r.weights, r.N), di(c, r.tpe, r.E), d, r.E, K, M, r.k,
                                    (float)beta, s, t.tile_rows, t.slots);
      xm_ref_grouped_matmul_combine_dw(dout, h, r.indices, r.weights, r.tpe, dw, r.E, K, M, r.k,
                                       (float)beta);
      float *got = chk_f(c, "dw", d, dw, r.E * MK, tol_sum(max_rows(&r)));
      empty_experts(c, &r, got, before, MK, beta);
      scratch_guard(c, s, sf);
    }
  }
}

/* ---- bf16 mixed precision --------------------------------------------------- */

static xm_bf16_t *hb(cx_t *c, int64_t n) { return hnew(c, sizeof(xm_bf16_t) * (size_t)n); }

/* Random bf16 operands (f32 values in [lo, hi] rounded by the reference). */
static xm_bf16_t *hrand_b(cx_t *c, int64_t n, float lo, float hi) {
  xm_bf16_t *h = hb(c, n);
  for (int64_t i = 0; i < n; i++)
    h[i] = xm_ref_bf16(frand(c, lo, hi));
  return h;
}

static xm_bf16_t *db(cx_t *c, const xm_bf16_t *src, int64_t n) {
  return dput(c, src, sizeof(xm_bf16_t) * (size_t)n);
}

/* A bf16 output of n elements, every one GARBAGE16. */
static xm_bf16_t *ddirty16(cx_t *c, int64_t n) {
  int64_t words = (n + 1) / 2;
  void *p = dnew(c, sizeof(uint32_t) * (size_t)words);
  if (words) c->be->fill32(c->be, p, GARBAGE16 | (GARBAGE16 << 16), (size_t)words, NULL);
  return p;
}

static xm_bf16_t *dget16(cx_t *c, const xm_bf16_t *src, int64_t n) {
  return dget_bytes(c, src, sizeof(xm_bf16_t) * (size_t)n);
}

/* A routed bf16 input [N, width], NaN past row n. */
static xm_bf16_t *routed_input_b(cx_t *c, const route_t *r, int64_t width, xm_bf16_t **dev) {
  xm_bf16_t *h = hrand_b(c, r->N * width, -1.0f, 1.0f);
  for (int64_t i = r->n * width; i < r->N * width; i++)
    h[i] = (xm_bf16_t)GARBAGE16;
  *dev = db(c, h, r->N * width);
  return h;
}

/* bf16 results compared as the f32 values they widen to. */
static void chk_b(cx_t *c, const char *what, const xm_bf16_t *dev, const xm_bf16_t *want, int64_t n,
                  tol_t t) {
  const xm_bf16_t *got = dget16(c, dev, n);
  for (int64_t i = 0; i < n; i++) {
    float g = xm_ref_bf16_widen(got[i]), w = xm_ref_bf16_widen(want[i]);
    note_err(c, g, w, t);
    if (!close_enough(g, w, t)) {
      fail(c,
           "%s first mismatch at index %lld: got %.9g (0x%04x) want %.9g (0x%04x) (tol %g + "
           "%g|want|)",
           what, (long long)i, g, got[i], w, want[i], t.atol, t.rtol);
      return;
    }
  }
}

static void chk_untouched16(cx_t *c, const char *what, const xm_bf16_t *dev, int64_t from,
                            int64_t to) {
  if (to <= from) return;
  const xm_bf16_t *got = dget16(c, dev + from, to - from);
  for (int64_t i = 0; i < to - from; i++)
    if (got[i] != GARBAGE16) {
      fail(c, "%s: index %lld must be untouched (0x%04x) but holds 0x%04x", what,
           (long long)(from + i), GARBAGE16, got[i]);
      return;
    }
}

static int bf16_is_quiet_nan(xm_bf16_t h) {
  return (h & 0x7f80u) == 0x7f80u && (h & 0x007fu) != 0 && (h & 0x0040u) != 0;
}

/* Every non-NaN input rounds to exactly the reference's word; a NaN gives
 * some quiet NaN (bf16.h does not fix its payload). */
static void cast_check(cx_t *c, const float *x, int64_t n) {
  xm_bf16_t *want = hb(c, n), *d = ddirty16(c, n + TAIL);
  KT->cast_f32_bf16(df(c, x, n), d, n);
  xm_ref_cast_f32_bf16(x, want, n);
  const xm_bf16_t *got = dget16(c, d, n);
  for (int64_t i = 0; i < n; i++) {
    int ok = isnan(x[i]) ? bf16_is_quiet_nan(got[i]) : got[i] == want[i];
    if (!ok) {
      fail(c, "y first mismatch at index %lld: x = %.9g (0x%08x) gave 0x%04x want 0x%04x%s",
           (long long)i, x[i], f32_bits(x[i]), got[i], want[i],
           isnan(x[i]) ? " (any quiet NaN)" : "");
      break;
    }
  }
  chk_untouched16(c, "y past n", d, n, n + TAIL);
}

static void t_cast_f32_bf16(cx_t *c) {
  static const uint32_t special[] = {
      0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, /* zeros, infinities */
      0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7fbfffffu, /* quiet and signalling NaNs */
      0x7f7fffffu, 0xff7fffffu,                           /* FLT_MAX: rounds to infinity */
      0x00000001u, 0x00008000u, 0x00018000u, 0x807fffffu, /* subnormals, ties among them */
      0x3f808000u, 0x3f818000u, 0xbf808000u,              /* ties: to even, both signs */
      0x3f807fffu, 0x3f808001u, 0x3fff8000u, 0x3f7fffffu, /* around the tie, carries */
  };
  int64_t ns = (int64_t)(sizeof special / sizeof special[0]);
  case_begin(c, "zeros, infinities, NaNs, FLT_MAX, subnormals, ties");
  float *x = hf(c, ns);
  for (int64_t i = 0; i < ns; i++)
    x[i] = bits_f32(special[i]);
  cast_check(c, x, ns);

  case_begin(c, "n=4099 random bit patterns");
  int64_t n = 4099;
  x = hf(c, n);
  for (int64_t i = 0; i < n; i++)
    x[i] = bits_f32((uint32_t)next_u64(c));
  cast_check(c, x, n);

  case_begin(c, "n=1001 values in [-4, 4], ties forced on every third");
  n = 1001;
  x = hrand(c, n, -4, 4);
  for (int64_t i = 0; i < n; i += 3)
    x[i] = bits_f32((f32_bits(x[i]) & 0xffff0000u) | 0x8000u);
  cast_check(c, x, n);

  case_begin(c, "n=1");
  cast_check(c, hrand(c, 1, -1, 1), 1);
}

static void t_cast_bf16_f32(cx_t *c) {
  case_begin(c, "all 65536 bf16 words, NaNs included, bit for bit");
  int64_t n = 65536;
  xm_bf16_t *x = hb(c, n);
  for (int64_t i = 0; i < n; i++)
    x[i] = (xm_bf16_t)i;
  float *d = ddirty(c, n + TAIL);
  KT->cast_bf16_f32(db(c, x, n), d, n);
  const uint32_t *got = dget(c, d, n);
  for (int64_t i = 0; i < n; i++)
    if (got[i] != (uint32_t)i << 16) {
      fail(c, "y first mismatch at index %lld: got 0x%08x want 0x%08x", (long long)i, got[i],
           (unsigned)i << 16);
      break;
    }
  chk_untouched(c, "y past n", d, n, n + TAIL);

  case_begin(c, "n=3");
  x = hrand_b(c, 3, -2, 2);
  float *want = hf(c, 3);
  d = ddirty(c, 3 + TAIL);
  KT->cast_bf16_f32(db(c, x, 3), d, 3);
  xm_ref_cast_bf16_f32(x, want, 3);
  chk_f(c, "y", d, want, 3, TOL_EXACT);
  chk_untouched(c, "y past n", d, 3, 3 + TAIL);
}

/* The f32 shapes and one above XM_BF16_TILE_ROWS rows, so the CPU
 * kernels' row tiles are crossed. */
static const mkn_t k_mkn_bf16[] = {{1, 1, 1},  {3, 5, 4},  {7, 16, 9},
                                   {1, 33, 2}, {17, 8, 1}, {300, 12, 7}};
#define N_MKN_BF16 ((int)(sizeof k_mkn_bf16 / sizeof k_mkn_bf16[0]))

/* A workspace of exactly `floats` floats (NaN), then the guard. */
static void t_matmul_bf16(cx_t *c) {
  for (int i = 0; i < N_MKN_BF16; i++) {
    mkn_t s = k_mkn_bf16[i];
    case_begin(c, "M=%lld K=%lld N=%lld", (long long)s.M, (long long)s.K, (long long)s.N);
    xm_bf16_t *x = hrand_b(c, s.M * s.K, -1, 1), *w = hrand_b(c, s.N * s.K, -1, 1);
    xm_bf16_t *y = hb(c, s.M * s.N), *d = ddirty16(c, s.M * s.N + TAIL);
    int64_t wf = xm_bf16_gemm_ws_floats(s.M, s.K, s.N, 1);
    float *ws = ws_new(c, wf);
    KT->matmul_bf16(db(c, x, s.M * s.K), db(c, w, s.N * s.K), d, s.M, s.K, s.N, ws);
    xm_ref_matmul_bf16(x, w, y, s.M, s.K, s.N);
    chk_b(c, "y", d, y, s.M * s.N, TOL_BF16);
    chk_untouched16(c, "y past M*N", d, s.M * s.N, s.M * s.N + TAIL);
    ws_guard(c, ws, wf, "guard after ws");
  }
}

static void t_matmul_dx_bf16(cx_t *c) {
  for (int i = 0; i < N_MKN_BF16; i++) {
    mkn_t s = k_mkn_bf16[i];
    case_begin(c, "M=%lld K=%lld N=%lld", (long long)s.M, (long long)s.K, (long long)s.N);
    xm_bf16_t *g = hrand_b(c, s.M * s.N, -1, 1), *w = hrand_b(c, s.N * s.K, -1, 1);
    xm_bf16_t *dx = hb(c, s.M * s.K), *d = ddirty16(c, s.M * s.K + TAIL);
    int64_t wf = xm_bf16_gemm_ws_floats(s.M, s.K, s.N, 1);
    float *ws = ws_new(c, wf);
    KT->matmul_dx_bf16(db(c, g, s.M * s.N), db(c, w, s.N * s.K), d, s.M, s.K, s.N, ws);
    xm_ref_matmul_dx_bf16(g, w, dx, s.M, s.K, s.N);
    chk_b(c, "dx", d, dx, s.M * s.K, TOL_BF16);
    chk_untouched16(c, "dx past M*K", d, s.M * s.K, s.M * s.K + TAIL);
    ws_guard(c, ws, wf, "guard after ws");
  }
}

static void t_matmul_dw_bf16(cx_t *c) {
  for (int beta = 0; beta <= 1; beta++)
    for (int i = 0; i < N_MKN_BF16; i++) {
      mkn_t s = k_mkn_bf16[i];
      case_begin(c, "M=%lld K=%lld N=%lld beta=%d%s", (long long)s.M, (long long)s.K,
                 (long long)s.N, beta, beta ? " onto non-zero dw" : "");
      xm_bf16_t *g = hrand_b(c, s.M * s.N, -1, 1), *x = hrand_b(c, s.M * s.K, -1, 1);
      float *dw = beta ? hrand(c, s.N * s.K, -2, 2) : hf(c, s.N * s.K);
      float *d = beta ? df(c, dw, s.N * s.K) : ddirty(c, s.N * s.K);
      int64_t wf = xm_bf16_gemm_ws_floats(s.M, s.K, s.N, 0);
      float *ws = ws_new(c, wf);
      KT->matmul_dw_bf16(db(c, g, s.M * s.N), db(c, x, s.M * s.K), d, s.M, s.K, s.N, (float)beta,
                         ws);
      xm_ref_matmul_dw_bf16(g, x, dw, s.M, s.K, s.N, (float)beta);
      chk_f(c, "dw", d, dw, s.N * s.K, tol_sum(s.M));
      ws_guard(c, ws, wf, "guard after ws");
    }
}

/* ---- the LM head fused with the cross-entropy --------------------------------
 * rows, H, V, chunk: one chunk, chunks with a tail (7 = 3 + 3 + 1), a chunk
 * wider than V, labels outside [0, V) (rows with zero loss and gradient),
 * logits far from 0 (the running maximum must rescale across chunks), and
 * one above the CPU's threshold for an OpenMP team (rows x chunk >= 2^17). */
typedef struct {
  int64_t rows, H, V, chunk;
  int ignored, big;
} lmce_case_t;
static const lmce_case_t k_lmce[] = {
    {1, 1, 1, 1, 0, 0},  {3, 5, 7, 3, 0, 0},   {6, 16, 50, 16, 0, 0}, {4, 8, 33, 64, 0, 0},
    {5, 12, 40, 7, 1, 0}, {4, 6, 30, 8, 0, 1}, {260, 8, 600, 512, 0, 0},
};
#define N_LMCE ((int)(sizeof k_lmce / sizeof k_lmce[0]))

typedef struct {
  float *x, *w; /* f32 values (bf16-exact when bf16) */
  xm_bf16_t *xb, *wb;
  int32_t *lab;
} lmce_in_t;

static lmce_in_t lmce_inputs(cx_t *c, const lmce_case_t *k, int bf16) {
  lmce_in_t in = {0};
  int64_t nx = k->rows * k->H, nw = k->V * k->H;
  float span = k->big ? 12.0f : 1.0f; /* logits up to ~ H * span^2 / 4 */
  if (bf16) {
    in.xb = hrand_b(c, nx, -span, span), in.wb = hrand_b(c, nw, -span, span);
    in.x = hf(c, nx), in.w = hf(c, nw);
    for (int64_t i = 0; i < nx; i++)
      in.x[i] = xm_ref_bf16_widen(in.xb[i]);
    for (int64_t i = 0; i < nw; i++)
      in.w[i] = xm_ref_bf16_widen(in.wb[i]);
  } else {
    in.x = hrand(c, nx, -span, span), in.w = hrand(c, nw, -span, span);
  }
  in.lab = tokens(c, k->rows, k->V);
  if (k->ignored)
    for (int64_t r = 0; r < k->rows; r += 2)
      in.lab[r] = r % 4 ? (int32_t)k->V : -1;
  return in;
}

static void lmce_fwd_cases(cx_t *c, int bf16) {
  for (int i = 0; i < N_LMCE; i++) {
    const lmce_case_t *k = &k_lmce[i];
    case_begin(c, "rows=%lld H=%lld V=%lld chunk=%lld%s%s", (long long)k->rows, (long long)k->H,
               (long long)k->V, (long long)k->chunk, k->ignored ? " labels outside [0, V)" : "",
               k->big ? " large logits" : "");
    lmce_in_t in = lmce_inputs(c, k, bf16);
    float loss, *stats = hf(c, 2 * k->rows);
    float *dl = ddirty(c, 1), *dst = ddirty(c, 2 * k->rows);
    int64_t sf = xm_lm_ce_scratch_floats(k->rows, k->chunk);
    float *s = ws_new(c, sf);
    int32_t *lab = di(c, in.lab, k->rows);
    if (bf16) {
      int64_t wf = xm_bf16_lm_ce_ws_floats(k->rows, k->H, k->chunk, 0);
      float *ws = ws_new(c, wf);
      KT->lm_head_ce_bf16(db(c, in.xb, k->rows * k->H), db(c, in.wb, k->V * k->H), lab, dl, dst,
                          k->rows, k->H, k->V, k->chunk, s, ws);
      ws_guard(c, ws, wf, "guard after ws");
    } else {
      KT->lm_head_ce(df(c, in.x, k->rows * k->H), df(c, in.w, k->V * k->H), lab, dl, dst, k->rows,
                     k->H, k->V, k->chunk, s);
    }
    xm_ref_lm_head_ce(in.x, in.w, in.lab, &loss, stats, k->rows, k->H, k->V);
    tol_t t = tol_sum(k->H);
    chk_f(c, "loss", dl, &loss, 1, t);
    chk_f(c, "stats", dst, stats, 2 * k->rows, t);
    ws_guard(c, s, sf, "guard after scratch");
  }
}

static void lmce_grad_cases(cx_t *c, int bf16) {
  for (int beta = 0; beta <= 1; beta++)
    for (int i = 0; i < N_LMCE; i++) {
      const lmce_case_t *k = &k_lmce[i];
      float dloss = i % 2 ? 0.37f : 1.0f;
      case_begin(c, "rows=%lld H=%lld V=%lld chunk=%lld dloss=%g beta=%d%s%s", (long long)k->rows,
                 (long long)k->H, (long long)k->V, (long long)k->chunk, dloss, beta,
                 k->ignored ? " labels outside [0, V)" : "", k->big ? " large logits" : "");
      lmce_in_t in = lmce_inputs(c, k, bf16);
      int64_t nx = k->rows * k->H, nw = k->V * k->H;
      float loss, *stats = hf(c, 2 * k->rows);
      xm_ref_lm_head_ce(in.x, in.w, in.lab, &loss, stats, k->rows, k->H, k->V);
      float *dw = beta ? hrand(c, nw, -2, 2) : hf(c, nw), *dx = hf(c, nx);
      float *ddw = beta ? df(c, dw, nw) : ddirty(c, nw), *ddx = ddirty(c, nx);
      int64_t sf = xm_lm_ce_scratch_floats(k->rows, k->chunk);
      float *s = ws_new(c, sf);
      float *dd = df(c, &dloss, 1), *dst = df(c, stats, 2 * k->rows);
      int32_t *lab = di(c, in.lab, k->rows);
      if (bf16) {
        int64_t wf = xm_bf16_lm_ce_ws_floats(k->rows, k->H, k->chunk, 1);
        float *ws = ws_new(c, wf);
        KT->lm_head_ce_grad_bf16(dd, db(c, in.xb, nx), db(c, in.wb, nw), lab, dst, ddw, ddx,
                                 k->rows, k->H, k->V, k->chunk, (float)beta, s, ws);
        ws_guard(c, ws, wf, "guard after ws");
      } else {
        KT->lm_head_ce_grad(dd, df(c, in.x, nx), df(c, in.w, nw), lab, dst, ddw, ddx, k->rows,
                            k->H, k->V, k->chunk, (float)beta, s);
      }
      xm_ref_lm_head_ce_grad(&dloss, in.x, in.w, in.lab, stats, dw, dx, k->rows, k->H, k->V,
                             (float)beta, bf16);
      /* Gradients that subtract (softmax - onehot), summed over V (dx) or
       * the rows (dw); under bf16 each logit gradient is one bf16 rounding
       * of a value the kernel and the reference compute slightly apart. */
      tol_t tx = tol_sum(k->V), tw = tol_sum(k->rows);
      tx.rtol *= 10, tw.rtol *= 10;
      if (k->big) /* f32 logits of ~200 are 1e-5 off, which exp makes relative */
        tx.rtol *= 10, tx.atol *= 10, tw.rtol *= 10, tw.atol *= 10;
      if (bf16) tx = (tol_t){1.0 / 128.0, 2e-4}, tw = (tol_t){1.0 / 128.0, 2e-4 + tw.atol};
      float *gx = chk_f(c, "dx", ddx, dx, nx, tx);
      chk_f(c, "dw", ddw, dw, nw, tw);
      for (int64_t r = 0; r < k->rows; r++)
        if (in.lab[r] < 0 || in.lab[r] >= k->V)
          for (int64_t h = 0; h < k->H; h++)
            want_zero(c, "dx of a row whose label is outside [0, V)", gx, r * k->H + h);
      ws_guard(c, s, sf, "guard after scratch");
    }
}

static void t_lm_head_ce(cx_t *c) { lmce_fwd_cases(c, 0); }
static void t_lm_head_ce_grad(cx_t *c) { lmce_grad_cases(c, 0); }
static void t_lm_head_ce_bf16(cx_t *c) { lmce_fwd_cases(c, 1); }
static void t_lm_head_ce_grad_bf16(cx_t *c) { lmce_grad_cases(c, 1); }

/* The MoE routings and one with more rows on an expert than a CPU tile. */
static route_t route_case_bf16(cx_t *c, int i) {
  if (i < N_ROUTES) return route_case(c, i);
  return make_route(c, 300, 1, 2, 0, R_ONE);
}
#define N_ROUTES_BF16 (N_ROUTES + 1)

static void t_grouped_matmul_bf16(cx_t *c) {
  for (int i = 0; i < N_ROUTES_BF16; i++) {
    route_t r = route_case_bf16(c, i);
    int64_t K = k_gK, M = k_gM;
    case_begin(c, "%s K=%lld M=%lld", r.desc, (long long)K, (long long)M);
    xm_bf16_t *dx;
    xm_bf16_t *x = routed_input_b(c, &r, K, &dx);
    xm_bf16_t *w = hrand_b(c, r.E * M * K, -1, 1), *y = hb(c, r.N * M);
    xm_bf16_t *d = ddirty16(c, r.N * M);
    int64_t wf = xm_bf16_gemm_ws_floats(r.N, K, M, 1);
    float *ws = ws_new(c, wf);
    KT->grouped_matmul_bf16(dx, db(c, w, r.E * M * K), di(c, r.tpe, r.E), d, r.E, K, M, ws);
    xm_ref_grouped_matmul_bf16(x, w, r.tpe, y, r.E, K, M);
    chk_b(c, "y", d, y, r.n * M, TOL_BF16);
    chk_untouched16(c, "y past row n", d, r.n * M, r.N * M);
    ws_guard(c, ws, wf, "guard after ws");
  }
}

static void t_grouped_matmul_dx_bf16(cx_t *c) {
  for (int i = 0; i < N_ROUTES_BF16; i++) {
    route_t r = route_case_bf16(c, i);
    int64_t K = k_gK, M = k_gM;
    case_begin(c, "%s K=%lld M=%lld", r.desc, (long long)K, (long long)M);
    xm_bf16_t *ddy;
    xm_bf16_t *dy = routed_input_b(c, &r, M, &ddy);
    xm_bf16_t *w = hrand_b(c, r.E * M * K, -1, 1), *dx = hb(c, r.N * K);
    xm_bf16_t *d = ddirty16(c, r.N * K);
    int64_t wf = xm_bf16_gemm_ws_floats(r.N, K, M, 1);
    float *ws = ws_new(c, wf);
    KT->grouped_matmul_dx_bf16(ddy, db(c, w, r.E * M * K), di(c, r.tpe, r.E), d, r.E, K, M, ws);
    xm_ref_grouped_matmul_dx_bf16(dy, w, r.tpe, dx, r.E, K, M);
    chk_b(c, "dx", d, dx, r.n * K, TOL_BF16);
    chk_untouched16(c, "dx past row n", d, r.n * K, r.N * K);
    ws_guard(c, ws, wf, "guard after ws");
  }
}

static void t_grouped_matmul_dw_bf16(cx_t *c) {
  for (int beta = 0; beta <= 1; beta++)
    for (int i = 0; i < N_ROUTES_BF16; i++) {
      route_t r = route_case_bf16(c, i);
      int64_t K = k_gK, M = k_gM, MK = M * K;
      case_begin(c, "%s K=%lld M=%lld beta=%d%s", r.desc, (long long)K, (long long)M, beta,
                 beta ? " onto non-zero dw" : "");
      xm_bf16_t *ddy, *dx;
      xm_bf16_t *dy = routed_input_b(c, &r, M, &ddy), *x = routed_input_b(c, &r, K, &dx);
      float *dw = beta ? hrand(c, r.E * MK, -1, 1) : hf(c, r.E * MK);
      float *before = hcopy(c, dw, r.E * MK);
      float *d = beta ? df(c, dw, r.E * MK) : ddirty(c, r.E * MK);
      int64_t wf = xm_bf16_gemm_ws_floats(r.N, K, M, 0);
      float *ws = ws_new(c, wf);
      KT->grouped_matmul_dw_bf16(ddy, dx, di(c, r.tpe, r.E), d, r.E, K, M, (float)beta, ws);
      xm_ref_grouped_matmul_dw_bf16(dy, x, r.tpe, dw, r.E, K, M, (float)beta);
      float *got = chk_f(c, "dw", d, dw, r.E * MK, tol_sum(max_rows(&r)));
      empty_experts(c, &r, got, before, MK, beta);
      ws_guard(c, ws, wf, "guard after ws");
    }
}

/* ---- fused MoE kernels on bf16 operands ------------------------------------
 * The fused cases (tilings, tails, empty and one-row experts, drops) with
 * bf16 token, row and weight operands, held to the f32 reference run on
 * the same values widened (exact), with the f32 kernels' tolerances: the
 * results are f32 and the accumulation is f32. */

static float *widened(cx_t *c, const xm_bf16_t *b, int64_t n) {
  float *f = hf(c, n);
  for (int64_t i = 0; i < n; i++)
    f[i] = xm_bf16_to_f32(b[i]);
  return f;
}

static float *fused_ws(cx_t *c, tiling_t t, int64_t K, int64_t M, int widen_w, int64_t *floats) {
  *floats = xm_bf16_fused_ws_floats(t.tile_rows, t.slots, K, M, widen_w);
  return ws_new(c, *floats);
}

static void t_gather_grouped_matmul_bf16(cx_t *c) {
  for (int ci = 0; ci < N_FUSED; ci++) {
    fcase_t f = fused_case(c, ci, " bf16");
    route_t r = f.r;
    tiling_t t = f.t;
    int64_t K = f.K, M = f.M, sf, wf;
    xm_bf16_t *x = hrand_b(c, r.T * K, -1, 1), *w = hrand_b(c, r.E * M * K, -1, 1);
    float *y = hf(c, r.N * M), *d = ddirty(c, r.N * M);
    float *s = scratch_new(c, t, K, &sf), *ws = fused_ws(c, t, K, M, 1, &wf);
    KT->gather_grouped_matmul_bf16(db(c, x, r.T * K), di(c, r.indices, r.N), di(c, r.tpe, r.E),
                                   db(c, w, r.E * M * K), d, r.E, K, M, r.k, s, t.tile_rows,
                                   t.slots, ws);
    xm_ref_gather_grouped_matmul(widened(c, x, r.T * K), r.indices, r.tpe,
                                 widened(c, w, r.E * M * K), y, r.E, K, M, r.k);
    chk_f(c, "y", d, y, r.n * M, TOL_SUM);
    chk_untouched(c, "y past row n", d, r.n * M, r.N * M);
    scratch_guard(c, s, sf);
    ws_guard(c, ws, wf, "guard after ws");
  }
}

static void t_grouped_matmul_combine_bf16(cx_t *c) {
  for (int ci = 0; ci < N_FUSED; ci++) {
    fcase_t f = fused_case(c, ci, " bf16");
    route_t r = f.r;
    tiling_t t = f.t;
    int64_t K = f.K, M = f.M, sf, wf;
    xm_bf16_t *dh;
    xm_bf16_t *h = routed_input_b(c, &r, K, &dh), *w = hrand_b(c, r.E * M * K, -1, 1);
    float *out = hf(c, r.T * M), *d = ddirty(c, r.T * M);
    float *s = scratch_new(c, t, M, &sf), *ws = fused_ws(c, t, K, M, 1, &wf);
    KT->grouped_matmul_combine_bf16(dh, db(c, w, r.E * M * K), di(c, r.tpe, r.E),
                                    di(c, r.indices, r.N), df(c, r.weights, r.N), d, r.E, K, M,
                                    r.T, r.k, s, t.tile_rows, t.slots, ws);
    xm_ref_grouped_matmul_combine(widened(c, h, r.N * K), widened(c, w, r.E * M * K), r.tpe,
                                  r.indices, r.weights, out, r.E, K, M, r.T, r.k);
    float *got = chk_f(c, "out", d, out, r.T * M, TOL_SUM);
    zero_rows(c, "out of a token without rows", &r, got, M);
    scratch_guard(c, s, sf);
    ws_guard(c, ws, wf, "guard after ws");
  }
}

static void t_gather_grouped_matmul_dx_bf16(cx_t *c) {
  for (int ci = 0; ci < N_FUSED; ci++) {
    fcase_t f = fused_case(c, ci, " bf16");
    route_t r = f.r;
    tiling_t t = f.t;
    int64_t K = f.K, M = f.M, sf, wf;
    xm_bf16_t *ddy;
    xm_bf16_t *dy = routed_input_b(c, &r, M, &ddy), *w = hrand_b(c, r.E * M * K, -1, 1);
    float *dx = hf(c, r.T * K), *d = ddirty(c, r.T * K);
    float *s = scratch_new(c, t, K, &sf), *ws = fused_ws(c, t, K, M, 1, &wf);
    KT->gather_grouped_matmul_dx_bf16(ddy, db(c, w, r.E * M * K), di(c, r.tpe, r.E),
                                      di(c, r.indices, r.N), d, r.E, K, M, r.T, r.k, s,
                                      t.tile_rows, t.slots, ws);
    xm_ref_gather_grouped_matmul_dx(widened(c, dy, r.N * M), widened(c, w, r.E * M * K), r.tpe,
                                    r.indices, dx, r.E, K, M, r.T, r.k);
    float *got = chk_f(c, "dx", d, dx, r.T * K, TOL_SUM);
    zero_rows(c, "dx of a token without rows", &r, got, K);
    scratch_guard(c, s, sf);
    ws_guard(c, ws, wf, "guard after ws");
  }
}

static void t_gather_grouped_matmul_dw_bf16(cx_t *c) {
  for (int beta = 0; beta <= 1; beta++) {
    for (int ci = 0; ci < N_FUSED; ci++) {
      fcase_t f = fused_case(c, ci, beta ? " bf16 beta=1 onto non-zero dw" : " bf16 beta=0");
      route_t r = f.r;
      tiling_t t = f.t;
      int64_t K = f.K, M = f.M, MK = M * K, sf, wf;
      xm_bf16_t *ddy;
      xm_bf16_t *dy = routed_input_b(c, &r, M, &ddy), *x = hrand_b(c, r.T * K, -1, 1);
      float *dw = beta ? hrand(c, r.E * MK, -1, 1) : hf(c, r.E * MK);
      float *before = hcopy(c, dw, r.E * MK);
      float *d = beta ? df(c, dw, r.E * MK) : ddirty(c, r.E * MK);
      float *s = scratch_new(c, t, K, &sf), *ws = fused_ws(c, t, K, M, 0, &wf);
      KT->gather_grouped_matmul_dw_bf16(ddy, db(c, x, r.T * K), di(c, r.indices, r.N),
                                        di(c, r.tpe, r.E), d, r.E, K, M, r.k, (float)beta, s,
                                        t.tile_rows, t.slots, ws);
      xm_ref_gather_grouped_matmul_dw(widened(c, dy, r.N * M), widened(c, x, r.T * K), r.indices,
                                      r.tpe, dw, r.E, K, M, r.k, (float)beta);
      float *got = chk_f(c, "dw", d, dw, r.E * MK, tol_sum(max_rows(&r)));
      empty_experts(c, &r, got, before, MK, beta);
      scratch_guard(c, s, sf);
      ws_guard(c, ws, wf, "guard after ws");
    }
  }
}

static void t_grouped_matmul_combine_grad_bf16(cx_t *c) {
  for (int ci = 0; ci < N_FUSED; ci++) {
    fcase_t f = fused_case(c, ci, " bf16");
    route_t r = f.r;
    tiling_t t = f.t;
    int64_t K = f.K, M = f.M, sf, wf;
    xm_bf16_t *dh_in;
    xm_bf16_t *h = routed_input_b(c, &r, K, &dh_in);
    xm_bf16_t *dout = hrand_b(c, r.T * M, -1, 1), *w = hrand_b(c, r.E * M * K, -1, 1);
    float *dh = hf(c, r.N * K), *dwt = hf(c, r.N);
    float *ddh = ddirty(c, r.N * K), *ddw = ddirty(c, r.N);
    float *s = scratch_new(c, t, M, &sf), *ws = fused_ws(c, t, K, M, 1, &wf);
    KT->grouped_matmul_combine_grad_bf16(db(c, dout, r.T * M), dh_in, db(c, w, r.E * M * K),
                                         di(c, r.tpe, r.E), di(c, r.indices, r.N),
                                         df(c, r.weights, r.N), ddh, ddw, r.E, K, M, r.T, r.k, s,
                                         t.tile_rows, t.slots, ws);
    xm_ref_grouped_matmul_combine_grad(widened(c, dout, r.T * M), widened(c, h, r.N * K),
                                       widened(c, w, r.E * M * K), r.tpe, r.indices, r.weights,
                                       dh, dwt, r.E, K, M, r.T, r.k);
    chk_f(c, "dh", ddh, dh, r.n * K, TOL_SUM);
    chk_untouched(c, "dh past row n", ddh, r.n * K, r.N * K);
    float *got = chk_f(c, "dweights", ddw, dwt, r.N, TOL_SUM);
    dropped_slots(c, &r, got);
    scratch_guard(c, s, sf);
    ws_guard(c, ws, wf, "guard after ws");
  }
}

static void t_grouped_matmul_combine_dw_bf16(cx_t *c) {
  for (int beta = 0; beta <= 1; beta++) {
    for (int ci = 0; ci < N_FUSED; ci++) {
      fcase_t f = fused_case(c, ci, beta ? " bf16 beta=1 onto non-zero dw" : " bf16 beta=0");
      route_t r = f.r;
      tiling_t t = f.t;
      int64_t K = f.K, M = f.M, MK = M * K, sf, wf;
      xm_bf16_t *dh;
      xm_bf16_t *h = routed_input_b(c, &r, K, &dh), *dout = hrand_b(c, r.T * M, -1, 1);
      float *dw = beta ? hrand(c, r.E * MK, -1, 1) : hf(c, r.E * MK);
      float *before = hcopy(c, dw, r.E * MK);
      float *d = beta ? df(c, dw, r.E * MK) : ddirty(c, r.E * MK);
      float *s = scratch_new(c, t, M, &sf), *ws = fused_ws(c, t, K, M, 0, &wf);
      KT->grouped_matmul_combine_dw_bf16(db(c, dout, r.T * M), dh, di(c, r.indices, r.N),
                                         df(c, r.weights, r.N), di(c, r.tpe, r.E), d, r.E, K, M,
                                         r.k, (float)beta, s, t.tile_rows, t.slots, ws);
      xm_ref_grouped_matmul_combine_dw(widened(c, dout, r.T * M), widened(c, h, r.N * K),
                                       r.indices, r.weights, r.tpe, dw, r.E, K, M, r.k,
                                       (float)beta);
      float *got = chk_f(c, "dw", d, dw, r.E * MK, tol_sum(max_rows(&r)));
      empty_experts(c, &r, got, before, MK, beta);
      scratch_guard(c, s, sf);
      ws_guard(c, ws, wf, "guard after ws");
    }
  }
}

/* ---- training state and the optimizer --------------------------------------- */

static void t_accumulate(cx_t *c) {
  static const int64_t ns[] = {1, 17, 100, 1031, 140001};
  for (int i = 0; i < 5; i++) {
    int64_t n = ns[i];
    case_begin(c, "n=%lld onto non-zero acc", (long long)n);
    float *acc = hrand(c, n, -2, 2), *x = hrand(c, n, -2, 2);
    float *d = df(c, acc, n);
    KT->accumulate(d, df(c, x, n), n);
    xm_ref_accumulate(acc, x, n);
    chk_f(c, "acc", d, acc, n, TOL_ROUND);
  }
}

static void t_accumulate_i32(cx_t *c) {
  static const int64_t ns[] = {1, 17, 100, 1031, 140001};
  for (int i = 0; i < 5; i++) {
    int64_t n = ns[i];
    case_begin(c, "n=%lld onto non-zero acc", (long long)n);
    int32_t *acc = hi32(c, n), *x = hi32(c, n);
    for (int64_t j = 0; j < n; j++) {
      acc[j] = (int32_t)irand(c, 2000) - 1000;
      x[j] = (int32_t)irand(c, 100000) - 50000;
    }
    int32_t *d = di(c, acc, n);
    KT->accumulate_i32(d, di(c, x, n), n);
    xm_ref_accumulate_i32(acc, x, n);
    chk_i(c, "acc", d, acc, n);
  }
}

/* sum_sq_acc adds into a device double and leaves its f32 value in out:
 * two calls in a row, as a norm over two tensors, from a nonzero start. */
static void t_sum_sq_acc(cx_t *c) {
  static const int64_t ns[] = {0, 1, 17, 1000, 100003};
  for (int i = 0; i < 5; i++) {
    int64_t n = ns[i];
    case_begin(c, "n=%lld twice onto 0.5", (long long)n);
    float *x = hrand(c, n, -3, 3), *y = hrand(c, n + 3, -1, 1);
    double start = 0.5;
    double *acc = dput(c, &start, sizeof start);
    float *out = ddirty(c, 1);
    KT->sum_sq_acc(df(c, x, n), n, acc, out);
    KT->sum_sq_acc(df(c, y, n + 3), n + 3, acc, out);
    double want = start + xm_ref_sum_sq(x, n) + xm_ref_sum_sq(y, n + 3);
    double got = *(const double *)dget_bytes(c, acc, sizeof got);
    float got_out = *(const float *)dget_bytes(c, out, sizeof got_out);
    if (!(fabs(got - want) <= TOL_SUMSQ.atol + TOL_SUMSQ.rtol * fabs(want)))
      fail(c, "acc %.17g want %.17g (tol %g|want|)", got, want, TOL_SUMSQ.rtol);
    if (got_out != (float)got)
      fail(c, "out %.9g is not the accumulator %.17g as f32", got_out, got);
  }
}

typedef struct {
  int64_t n, step;
  float lr, b1, b2, eps, wd, gs;
} adam_t;
static const adam_t k_adam[] = {
    {1, 1, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f},
    {33, 1, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f},
    {33, 5, 3e-4f, 0.9f, 0.999f, 1e-6f, 0.01f, 0.5f},
    {100, 1000, 1e-3f, 0.8f, 0.99f, 1e-8f, 0.1f, 0.25f},
};

static void t_adamw(cx_t *c) {
  for (int i = 0; i < 4; i++) {
    adam_t s = k_adam[i];
    case_begin(c, "n=%lld step=%lld lr=%g b1=%g b2=%g eps=%g wd=%g grad_scale=%g", (long long)s.n,
               (long long)s.step, s.lr, s.b1, s.b2, s.eps, s.wd, s.gs);
    float *p = hrand(c, s.n, -1, 1), *g = hrand(c, s.n, -1, 1);
    float *m = s.step > 1 ? hrand(c, s.n, -0.1f, 0.1f) : hf(c, s.n);
    float *v = s.step > 1 ? hrand(c, s.n, 0.0f, 0.01f) : hf(c, s.n);
    float *dp = df(c, p, s.n), *dm = df(c, m, s.n), *dv = df(c, v, s.n);
    KT->adamw(dp, df(c, g, s.n), dm, dv, s.n, s.lr, s.b1, s.b2, s.eps, s.wd, s.step, s.gs);
    xm_ref_adamw(p, g, m, v, s.n, s.lr, s.b1, s.b2, s.eps, s.wd, s.step, s.gs);
    chk_f(c, "p", dp, p, s.n, (tol_t){2e-6, 1e-7});
    /* m and v are small differences of terms of order 0.1 and 0.01: the
     * absolute part is an ulp of those terms */
    chk_f(c, "m", dm, m, s.n, (tol_t){2e-6, 2e-8});
    chk_f(c, "v", dv, v, s.n, (tol_t){2e-6, 2e-9});
  }
}

/* adamw_multi against the reference per tensor (decay where the entry says
 * so), and bit for bit against the backend's own adamw on each tensor
 * alone. Empty entries point at a dirty buffer that must stay untouched;
 * the host table is wiped right after the call (a backend reads it at the
 * call, never later); 53 tensors cross a GPU launch's pack of 48 and the
 * long ones span several blocks. */
static void t_adamw_multi(cx_t *c) {
  enum { MAXT = 53 };
  for (int cs = 0; cs < 3; cs++) {
    adam_t s = k_adam[cs + 1];
    int count = cs == 0 ? 5 : cs == 1 ? MAXT : 1;
    int64_t sizes[MAXT];
    int decay[MAXT];
    for (int i = 0; i < count; i++) {
      static const int64_t first[5] = {1, 0, 33, 4096, 4097};
      sizes[i] = cs == 0 ? first[i] : cs == 2 ? 9001 : (i % 7 == 3 ? 0 : 1 + irand(c, 300));
      decay[i] = (i + cs) % 2;
    }
    if (cs == 1) sizes[17] = 9000;
    case_begin(c, "%d tensors step=%lld lr=%g wd=%g grad_scale=%g", count, (long long)s.step,
               s.lr, s.wd, s.gs);
    xm_rt_adamw_tensor_t tab[MAXT];
    float *hp[MAXT], *hm[MAXT], *hv[MAXT], *dp1[MAXT], *dm1[MAXT], *dv1[MAXT];
    float *dp2[MAXT], *dm2[MAXT], *dv2[MAXT];
    const float *dg[MAXT];
    void *dirty = ddirty(c, 64);
    for (int i = 0; i < count; i++) {
      int64_t n = sizes[i];
      if (n == 0) {
        tab[i] = (xm_rt_adamw_tensor_t){dirty, dirty, dirty, dirty, 0, decay[i], 0};
        continue;
      }
      hp[i] = hrand(c, n, -1, 1);
      float *g = hrand(c, n, -1, 1);
      hm[i] = s.step > 1 ? hrand(c, n, -0.1f, 0.1f) : hf(c, n);
      hv[i] = s.step > 1 ? hrand(c, n, 0.0f, 0.01f) : hf(c, n);
      dp1[i] = df(c, hp[i], n), dm1[i] = df(c, hm[i], n), dv1[i] = df(c, hv[i], n);
      dp2[i] = df(c, hp[i], n), dm2[i] = df(c, hm[i], n), dv2[i] = df(c, hv[i], n);
      dg[i] = df(c, g, n);
      tab[i] = (xm_rt_adamw_tensor_t){dp1[i], dg[i], dm1[i], dv1[i], n, decay[i], 0};
      xm_ref_adamw(hp[i], g, hm[i], hv[i], n, s.lr, s.b1, s.b2, s.eps, decay[i] ? s.wd : 0.0f,
                   s.step, s.gs);
    }
    KT->adamw_multi(tab, count, s.lr, s.b1, s.b2, s.eps, s.wd, s.step, s.gs);
    memset(tab, 0, sizeof tab);
    for (int i = 0; i < count; i++)
      if (sizes[i])
        KT->adamw(dp2[i], dg[i], dm2[i], dv2[i], sizes[i], s.lr, s.b1, s.b2, s.eps,
                  decay[i] ? s.wd : 0.0f, s.step, s.gs);
    for (int i = 0; i < count && !c->case_failed; i++) {
      int64_t n = sizes[i];
      if (n == 0) continue;
      float *p = chk_f(c, "p", dp1[i], hp[i], n, (tol_t){2e-6, 1e-7});
      float *m = chk_f(c, "m", dm1[i], hm[i], n, (tol_t){2e-6, 2e-8});
      float *v = chk_f(c, "v", dv1[i], hv[i], n, (tol_t){2e-6, 2e-9});
      cmp_f(c, "p against adamw alone", p, dget(c, dp2[i], n), n, (tol_t){0, 0});
      cmp_f(c, "m against adamw alone", m, dget(c, dm2[i], n), n, (tol_t){0, 0});
      cmp_f(c, "v against adamw alone", v, dget(c, dv2[i], n), n, (tol_t){0, 0});
      if (c->case_failed) fail(c, "(tensor %d of %d, %lld elements)", i, count, (long long)n);
    }
    chk_untouched(c, "the buffer of the empty entries", dirty, 0, 64);
  }
}

static void t_aux_free_update(cx_t *c) {
  static const int32_t loads[][7] = {{5},
                                     {1, 2, 3, 0, 0, 0, 0},
                                     {10, 0, 4, 2, 0, 0, 0},
                                     {3, 3, 3, 3, 0, 0, 0},
                                     {7, 1, 0, 9, 4, 4, 3}};
  static const int64_t Es[] = {1, 3, 4, 4, 7};
  for (int i = 0; i < 5; i++) {
    int64_t E = Es[i];
    float gamma = i % 2 ? 1e-3f : 0.25f;
    case_begin(c, "E=%lld gamma=%g", (long long)E, gamma);
    float *b = hrand(c, E, -1, 1);
    float *before = hcopy(c, b, E);
    float *d = df(c, b, E);
    KT->aux_free_update(d, di(c, loads[i], E), E, gamma);
    xm_ref_aux_free_update(b, loads[i], E, gamma);
    float *got = chk_f(c, "bias", d, b, E, TOL_ROUND);
    for (int64_t e = 0; e < E; e++) /* load == mean: sign 0, bias unchanged */
      if (b[e] == before[e] && got[e] != before[e])
        fail(c, "bias[%lld] at load == mean changed from %.9g to %.9g", (long long)e, before[e],
             got[e]);
  }
}

/* ---- the suite -------------------------------------------------------------- */

typedef struct {
  const char *name;
  void (*run)(cx_t *);
} entry_t;

/* One entry per line of runtime/abi/kernels.def, under the kernel's name;
 * "coverage" checks that none is missing. */
static const entry_t k_kernel_entries[] = {
    {"matmul", t_matmul},
    {"matmul_dx", t_matmul_dx},
    {"matmul_dw", t_matmul_dw},
    {"matmul_dw_acc", t_matmul_dw_acc},
    {"add", t_add},
    {"mul", t_mul},
    {"mul_rows", t_mul_rows},
    {"scale", t_scale},
    {"reduce_to", t_reduce_to},
    {"reduce_rows", t_reduce_rows},
    {"fill", t_fill},
    {"copy", t_copy},
    {"silu", t_silu},
    {"silu_grad", t_silu_grad},
    {"gelu", t_gelu},
    {"gelu_grad", t_gelu_grad},
    {"sigmoid", t_sigmoid},
    {"sigmoid_grad", t_sigmoid_grad},
    {"swiglu", t_swiglu},
    {"swiglu_grad", t_swiglu_grad},
    {"rmsnorm", t_rmsnorm},
    {"rmsnorm_grad", t_rmsnorm_grad},
    {"rope", t_rope},
    {"rope_grad", t_rope_grad},
    {"concat", t_concat},
    {"split", t_split},
    {"split_i32", t_split_i32},
    {"attention", t_attention},
    {"attention_grad", t_attention_grad},
    {"embedding", t_embedding},
    {"embedding_grad", t_embedding_grad},
    {"cross_entropy", t_cross_entropy},
    {"cross_entropy_grad", t_cross_entropy_grad},
    {"lm_head_ce", t_lm_head_ce},
    {"lm_head_ce_grad", t_lm_head_ce_grad},
    {"lm_head_ce_bf16", t_lm_head_ce_bf16},
    {"lm_head_ce_grad_bf16", t_lm_head_ce_grad_bf16},
    {"router_score", t_router_score},
    {"router_score_grad", t_router_score_grad},
    {"topk_route", t_topk_route},
    {"topk_route_grad", t_topk_route_grad},
    {"permute", t_permute},
    {"gather_rows", t_gather_rows},
    {"gather_rows_grad", t_gather_rows_grad},
    {"grouped_matmul", t_grouped_matmul},
    {"grouped_matmul_dx", t_grouped_matmul_dx},
    {"grouped_matmul_dw", t_grouped_matmul_dw},
    {"grouped_matmul_dw_acc", t_grouped_matmul_dw_acc},
    {"scatter_combine", t_scatter_combine},
    {"scatter_combine_grad", t_scatter_combine_grad},
    {"sort_chunks", t_sort_chunks},
    {"unsort_chunks", t_unsort_chunks},
    {"aux_loss", t_aux_loss},
    {"aux_loss_grad", t_aux_loss_grad},
    {"gather_grouped_matmul", t_gather_grouped_matmul},
    {"grouped_matmul_combine", t_grouped_matmul_combine},
    {"gather_grouped_matmul_dx", t_gather_grouped_matmul_dx},
    {"gather_grouped_matmul_dw", t_gather_grouped_matmul_dw},
    {"grouped_matmul_combine_grad", t_grouped_matmul_combine_grad},
    {"grouped_matmul_combine_dw", t_grouped_matmul_combine_dw},
    {"cast_f32_bf16", t_cast_f32_bf16},
    {"cast_bf16_f32", t_cast_bf16_f32},
    {"matmul_bf16", t_matmul_bf16},
    {"matmul_dx_bf16", t_matmul_dx_bf16},
    {"matmul_dw_bf16", t_matmul_dw_bf16},
    {"grouped_matmul_bf16", t_grouped_matmul_bf16},
    {"grouped_matmul_dx_bf16", t_grouped_matmul_dx_bf16},
    {"grouped_matmul_dw_bf16", t_grouped_matmul_dw_bf16},
    {"gather_grouped_matmul_bf16", t_gather_grouped_matmul_bf16},
    {"grouped_matmul_combine_bf16", t_grouped_matmul_combine_bf16},
    {"gather_grouped_matmul_dx_bf16", t_gather_grouped_matmul_dx_bf16},
    {"gather_grouped_matmul_dw_bf16", t_gather_grouped_matmul_dw_bf16},
    {"grouped_matmul_combine_grad_bf16", t_grouped_matmul_combine_grad_bf16},
    {"grouped_matmul_combine_dw_bf16", t_grouped_matmul_combine_dw_bf16},
    {"accumulate", t_accumulate},
    {"accumulate_i32", t_accumulate_i32},
    {"sum_sq_acc", t_sum_sq_acc},
    {"adamw", t_adamw},
    {"adamw_multi", t_adamw_multi},
    {"aux_free_update", t_aux_free_update},
};
#define N_KERNEL_ENTRIES ((int)(sizeof k_kernel_entries / sizeof k_kernel_entries[0]))

static const entry_t k_backend_entries[] = {{"memory", t_memory}, {"streams", t_streams}};

/* Whether the backend's table has a function for kernel `name` (-1: no
 * kernel of that name in kernels.def). */
static int kernel_present(const xm_rt_kernels_t *kt, const char *name) {
#define XM_KERNEL(kname, ret, args)                                                                \
  if (strcmp(name, #kname) == 0) return kt->kname != NULL;
#include "runtime/abi/kernels.def"
#undef XM_KERNEL
  return -1;
}

/* Whether `name` is one of the comma-separated names of `only`. */
static int selected(const char *only, const char *name) {
  if (!only) return 1;
  size_t len = strlen(name);
  for (const char *p = only; *p;) {
    const char *end = strchr(p, ',');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    if (n == len && strncmp(p, name, n) == 0) return 1;
    if (!end) break;
    p = end + 1;
  }
  return 0;
}

/* Seeds differ per entry, so that running one entry alone sees the same
 * inputs as in the whole suite. */
static uint64_t seed_of(const char *name) {
  uint64_t h = 0x9E3779B97F4A7C15ull;
  for (const char *p = name; *p; p++)
    h = (h ^ (unsigned char)*p) * 0x100000001B3ull;
  return h ? h : 1;
}

/* Runs one entry and prints its line; returns 1 if it failed. */
static int run_entry(cx_t *c, const entry_t *e, int is_kernel) {
  c->entry = e->name;
  c->rng = seed_of(e->name);
  c->cases = c->failed_cases = c->case_failed = 0;
  c->first[0] = '\0';
  c->case_desc[0] = '\0';
  c->max_abs = c->max_rel = c->max_share = 0.0;
  if (is_kernel && kernel_present(c->be->kernels, e->name) != 1) {
    fprintf(c->log, "FAIL %s: the backend's kernel table has no function for it\n", e->name);
    return 1;
  }
  if (setjmp(c->bail) == 0) e->run(c);
  case_end(c);
  if (c->failed_cases) {
    fprintf(c->log, "FAIL %s %d/%d cases: %s\n", e->name, c->failed_cases, c->cases, c->first);
    return 1;
  }
  if (is_kernel)
    fprintf(c->log, "ok %s %d cases (max error: abs %.2e, rel %.2e, %.2f of the tolerance)\n",
            e->name, c->cases, c->max_abs, c->max_rel, c->max_share);
  else
    fprintf(c->log, "ok %s %d cases\n", e->name, c->cases);
  return 0;
}

/* Every line of kernels.def must have an entry here. */
static int coverage(FILE *log) {
  int missing = 0;
  for (int i = 0; i < XM_RT_KERNEL_COUNT_; i++) {
    const char *name = xm_rt_kernel_signatures[i].name;
    int found = 0;
    for (int j = 0; j < N_KERNEL_ENTRIES; j++)
      found |= strcmp(k_kernel_entries[j].name, name) == 0;
    if (!found) {
      fprintf(log, "FAIL coverage: kernel %s%s of kernels.def has no conformance case\n", name,
              xm_rt_kernel_signatures[i].args);
      missing++;
    }
  }
  if (!missing)
    fprintf(log, "ok coverage %d kernels of kernels.def, %d entries\n", XM_RT_KERNEL_COUNT_,
            N_KERNEL_ENTRIES);
  return missing != 0;
}

int xm_conformance_run(xm_rt_backend_t *be, const char *only, FILE *log) {
  if (!log) log = stdout;
  if (!be || !be->kernels) {
    fprintf(log, "FAIL backend: no backend or no kernel table\n");
    return 1;
  }
  /* backend.h: init once, before any alloc; the suite is this process's
   * only user of the backend, as rank 0 of 1 on this machine. */
  if (be->init) {
    char err[256] = "";
    int threads = 0;
    if (be->init(be, 0, 1, &threads, err, sizeof err) != 0) {
      fprintf(log, "FAIL init: %s\n", err[0] ? err : "returned non-zero without a message");
      return 1;
    }
    if (threads < 1) {
      fprintf(log, "FAIL init: %d worker threads\n", threads);
      return 1;
    }
    fprintf(log, "ok init %d threads\n", threads);
  }
  cx_t c = {.be = be, .log = log};
  int failures = 0, ran = 0;
  for (int i = 0; i < 2; i++)
    if (selected(only, k_backend_entries[i].name)) {
      failures += run_entry(&c, &k_backend_entries[i], 0);
      ran++;
    }
  for (int i = 0; i < N_KERNEL_ENTRIES; i++)
    if (selected(only, k_kernel_entries[i].name)) {
      failures += run_entry(&c, &k_kernel_entries[i], 1);
      ran++;
    }
  if (selected(only, "coverage")) {
    failures += coverage(log);
    ran++;
  }
  if (only) {
    /* a misspelt name must not pass as "nothing failed" */
    for (const char *p = only; *p;) {
      const char *end = strchr(p, ',');
      size_t n = end ? (size_t)(end - p) : strlen(p);
      int known = (n == 8 && !strncmp(p, "coverage", 8));
      for (int i = 0; i < 2; i++)
        known |=
            strlen(k_backend_entries[i].name) == n && !strncmp(p, k_backend_entries[i].name, n);
      for (int i = 0; i < N_KERNEL_ENTRIES; i++)
        known |= strlen(k_kernel_entries[i].name) == n && !strncmp(p, k_kernel_entries[i].name, n);
      if (!known) {
        fprintf(log, "FAIL only: no entry named '%.*s'\n", (int)n, p);
        failures++;
      }
      if (!end) break;
      p = end + 1;
    }
  }
  free(c.dev.p);
  free(c.host.p);
  fprintf(log, "%s: %d entries run, %d failed on backend %s\n", failures ? "FAIL" : "ok", ran,
          failures, be->name ? be->name : "?");
  return failures;
}
