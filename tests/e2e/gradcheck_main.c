/* tests/e2e/gradcheck_main.c — finite-difference check of a generated
 * training program: the acceptance test of autodiff + codegen + kernels.
 *
 * Linked with an out/program.c (instead of out/main.c) and the runtime, it
 * runs program->micro once to get the total loss L (cross-entropy plus aux
 * losses) and the analytic gradients (the grad states, times grad_accum
 * since the loss seed is 1/grad_accum), then checks every trainable param
 * against central differences of L:
 *   - 4 elements: the one with the largest |gradient|, then random ones,
 *     D = (L(p + h e_j) - L(p - h e_j)) / 2h with h = 2e-2 * max(1, |p_j|);
 *   - 2 random directions s (entries +-1 over the whole tensor), comparing
 *     <g, s> with (L(p + h s) - L(p - h s)) / 2h, h = 2e-3: this sees every
 *     element of the tensor at once, so a gradient wrong anywhere shows.
 *
 * Error measure: err = |a - D| / max(|a| + |D|, noise / tol), fail when
 * err > tol (1e-2). noise = 4 ulp(L) / 2h bounds what fp32 rounding of
 * the loss does to D (L ~ 3.5 has an ulp of 2.4e-7); a difference within it
 * scores at most tol, so tiny gradients are compared absolutely, large
 * ones relatively. Every param needs at least one check above the noise
 * floor (else its gradient is not tested, and that is a failure), unless
 * its analytic gradient is identically zero (reported as a note). Measured: the worst error
 * over the models of gradcheck.sh is ~3e-3 (steps 2x smaller give larger
 * noise, 2x larger give curvature errors near 1e-2), and doubling the
 * aux-loss gradient or using the wrong router score gradient fails.
 *
 * Parameters are drawn with 10x the table's std (std 0.2 for matrices):
 * with the 0.02 of real training, attention and routing are nearly uniform
 * at init and most gradients sit below the fp32 noise of the loss; ones
 * and trainable zeros get a little noise so norms and biases are not at a
 * special point. Tokens and labels come from the same fixed xorshift RNG.
 *
 * Routing is discontinuous: top-k selection (and capacity dropping) can
 * flip inside [p - h, p + h], and then D measures a jump, not a slope. So
 * every difference is computed at h and h/2: for a smooth loss they agree
 * (to O(h^2) and the noise); a flip anywhere in the interval makes them
 * differ by at least half the jump over h. Such a check is retried with
 * h/4 and h/16 and, if it still disagrees, counted as a routing flip and
 * skipped. More than 10% skipped fails the run (a broken gradient cannot
 * hide as flips). With these models flips are rare (0 in the runs so far).
 * OMP/OpenBLAS threads must be 1 (gradcheck.sh sets them) so the forward
 * pass rounds identically between evaluations.
 *
 * usage: gradcheck [--samples N] [--dirs N] [--tol X] [--noise-ulps X]
 *                  [--h-elem X] [--h-dir X] [--std-scale X] [--verbose]
 * exit 0: all checks within tolerance; 1: a failure (table on stdout).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/abi/program.h"

#define H_ELEM 2e-2
#define H_DIR 2e-3
#define NOISE_ULPS 4.0
#define DEFAULT_TOL 1e-2
#define STD_SCALE 10.0
#define SAMPLES 4
#define DIRS 2
#define MAX_SKIP_FRACTION 0.1

typedef struct {
  const xm_rt_program_t *p;
  xm_rt_exec_t x;
  uint64_t rng;
  unsigned char *grads; /* copy of the persistent arena after the baseline run */
  float *saved;         /* scratch: the param being perturbed */
  int8_t *sign;         /* scratch: a random direction */
  double tol, noise_ulps, h_elem, h_dir, std_scale, loss0;
  double last_noise;    /* noise bound of the last check */
  int samples, dirs, verbose;
} harness_t;

static uint64_t next_u64(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *s = x;
}

static double uniform(uint64_t *s) { return (double)(next_u64(s) >> 11) * 0x1.0p-53; }

static double normal(uint64_t *s) {
  double u1 = uniform(s), u2 = uniform(s);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

static void *tensor_ptr(harness_t *h, int i) {
  const xm_rt_tensor_t *t = &h->p->tensors[i];
  return (t->persistent ? h->x.persist : h->x.act) + t->offset;
}

static int64_t tensor_numel(const xm_rt_tensor_t *t) { return t->bytes / 4; }

/* Params: normal(std), and ones/zeros with a little noise so that norm
 * weights and biases are not at a special point; non-trainable params
 * (the routing bias) stay as initialised. */
static void init_params(harness_t *h) {
  for (int i = 0; i < h->p->num_tensors; i++) {
    const xm_rt_tensor_t *t = &h->p->tensors[i];
    if (t->category != XM_RT_CAT_WEIGHTS) continue;
    float *w = tensor_ptr(h, i);
    for (int64_t j = 0; j < tensor_numel(t); j++) {
      double v = 0.0;
      if (t->init == XM_RT_INIT_NORMAL) v = h->std_scale * t->init_std * normal(&h->rng);
      if (t->init == XM_RT_INIT_ONES) v = 1.0 + (t->trainable ? 0.1 * normal(&h->rng) : 0.0);
      if (t->init == XM_RT_INIT_ZEROS && t->trainable) v = 0.02 * normal(&h->rng);
      w[j] = (float)v;
    }
  }
}

static void init_inputs(harness_t *h) {
  int32_t *tok = tensor_ptr(h, h->p->tokens), *lab = tensor_ptr(h, h->p->labels);
  int64_t n = tensor_numel(&h->p->tensors[h->p->tokens]);
  for (int64_t i = 0; i < n; i++) {
    tok[i] = (int32_t)(next_u64(&h->rng) % (uint64_t)h->p->vocab);
    lab[i] = (int32_t)(next_u64(&h->rng) % (uint64_t)h->p->vocab);
  }
}

/* Zeroes every state (grads, loads): micro accumulates into them. */
static void zero_states(harness_t *h) {
  for (int i = 0; i < h->p->num_tensors; i++) {
    const xm_rt_tensor_t *t = &h->p->tensors[i];
    if (t->persistent && t->param >= 0 && t->category == XM_RT_CAT_GRADS)
      memset(tensor_ptr(h, i), 0, (size_t)t->bytes);
    else if (t->persistent && t->category == XM_RT_CAT_OPTIMIZER && t->dtype == XM_RT_I32)
      memset(tensor_ptr(h, i), 0, (size_t)t->bytes);
  }
}

static double run_loss(harness_t *h) {
  zero_states(h);
  h->p->micro(&h->x);
  return *(float *)tensor_ptr(h, h->p->loss);
}

/* Index of the grad state of param i, or -1. */
static int grad_of(const xm_rt_program_t *p, int i) {
  for (int j = 0; j < p->num_tensors; j++)
    if (p->tensors[j].param == i && p->tensors[j].category == XM_RT_CAT_GRADS) return j;
  return -1;
}

/* Central difference along `sign` (entries +-1 over all n elements) or,
 * when sign is NULL, along element j alone. */
static double central(harness_t *h, float *w, int64_t n, const int8_t *sign, int64_t j,
                      double step) {
  int64_t lo = sign ? 0 : j, hi = sign ? n : j + 1;
  for (int64_t i = lo; i < hi; i++) h->saved[i] = w[i];
  for (int64_t i = lo; i < hi; i++) w[i] = (float)(h->saved[i] + step * (sign ? sign[i] : 1));
  double up = sign ? step : (double)w[j] - h->saved[j];
  double lp = run_loss(h);
  for (int64_t i = lo; i < hi; i++) w[i] = (float)(h->saved[i] - step * (sign ? sign[i] : 1));
  double down = sign ? step : h->saved[j] - (double)w[j];
  double lm = run_loss(h);
  for (int64_t i = lo; i < hi; i++) w[i] = h->saved[i];
  return (lp - lm) / (up + down); /* the steps actually taken in fp32 */
}

typedef struct {
  int checked, failed, skipped, decisive;
  double worst;
} tally_t;

/* What fp32 rounding of the loss alone can make of a central difference
 * with this step: noise_ulps units in the last place of L over 2 * step. */
static double noise_of(const harness_t *h, double step) {
  float l = fabsf((float)h->loss0);
  return h->noise_ulps * (double)(nextafterf(l, INFINITY) - l) / (2.0 * step);
}

/* |a - b| relative to |a| + |b|, with the noise floor: a difference within
 * the noise scores at most tol. */
static double rel_err(const harness_t *h, double a, double b, double noise) {
  return fabs(a - b) / fmax(fabs(a) + fabs(b), noise / h->tol);
}

/* One check: returns the error, or -1 when the routing flipped. */
static double check_one(harness_t *h, float *w, int64_t n, const int8_t *sign, int64_t j,
                        double step, double analytic, double *out_numeric) {
  for (int attempt = 0; attempt < 3; attempt++, step /= 4) {
    double d1 = central(h, w, n, sign, j, step), d2 = central(h, w, n, sign, j, step / 2);
    double noise = noise_of(h, step / 2);
    *out_numeric = d2;
    h->last_noise = noise;
    if (rel_err(h, d1, d2, 2 * noise) <= h->tol) return rel_err(h, analytic, d2, noise);
  }
  return -1.0;
}

static void record(harness_t *h, const char *name, const char *what, double a, double num,
                   double err, tally_t *t) {
  const char *verdict = err < 0 ? "SKIP" : err > h->tol ? "FAIL" : "ok";
  if (err < 0) {
    t->skipped++;
  } else {
    t->checked++;
    if (err > h->tol) t->failed++;
    if (err > t->worst) t->worst = err;
    /* Decisive: the relative test, not the noise floor, judged it. */
    if (fabs(a) + fabs(num) > h->last_noise / h->tol) t->decisive++;
  }
  if (h->verbose || err < 0 || err > h->tol)
    printf("%-4s %-52s %-9s analytic % .6e numeric % .6e err %.2e\n", verdict, name, what, a, num,
           err);
}

/* Element checks (the largest gradients first, then random elements) and
 * random-direction checks over the whole tensor. */
static void check_param(harness_t *h, int i, tally_t *t) {
  const xm_rt_tensor_t *pt = &h->p->tensors[i];
  int gi = grad_of(h->p, i);
  if (gi < 0) {
    printf("FAIL %-52s no grad state\n", pt->name);
    t->failed++;
    return;
  }
  float *w = tensor_ptr(h, i);
  const float *g = (const float *)(h->grads + h->p->tensors[gi].offset);
  int64_t n = tensor_numel(pt), imax = 0;
  for (int64_t j = 1; j < n; j++)
    if (fabsf(g[j]) > fabsf(g[imax])) imax = j;
  double ga = (double)h->p->grad_accum;
  int decisive0 = t->decisive;
  char what[32];
  for (int s = 0; s < h->samples && s < n; s++) {
    int64_t j = s == 0 ? imax : (int64_t)(next_u64(&h->rng) % (uint64_t)n);
    double a = g[j] * ga, num = 0.0;
    double step = h->h_elem * fmax(1.0, fabs((double)w[j]));
    double err = check_one(h, w, n, NULL, j, step, a, &num);
    snprintf(what, sizeof what, "[%lld]", (long long)j);
    record(h, pt->name, what, a, num, err, t);
  }
  for (int d = 0; d < h->dirs; d++) {
    double a = 0.0, num = 0.0;
    for (int64_t j = 0; j < n; j++) {
      h->sign[j] = (next_u64(&h->rng) >> 63) ? 1 : -1;
      a += h->sign[j] * (double)g[j] * ga;
    }
    double err = check_one(h, w, n, h->sign, 0, h->h_dir, a, &num);
    snprintf(what, sizeof what, "dir %d", d);
    record(h, pt->name, what, a, num, err, t);
  }
  if (t->decisive == decisive0 && fabsf(g[imax]) == 0.0f) {
    /* Legitimately constant loss in this param (top-1 routing with
     * normalised weights has weight 1 whatever the router says). */
    printf("note %-52s gradient identically zero; matched the differences within noise\n",
           pt->name);
  } else if (t->decisive == decisive0) {
    printf("FAIL %-52s every check is under the noise floor: the gradient is not tested\n",
           pt->name);
    t->failed++;
  }
}

static void *arena(int64_t bytes) {
  size_t n = (size_t)((bytes + 63) / 64 * 64);
  void *p = aligned_alloc(64, n ? n : 64);
  if (!p) {
    fprintf(stderr, "gradcheck: out of memory (%lld bytes)\n", (long long)bytes);
    exit(1);
  }
  memset(p, 0, n ? n : 64);
  return p;
}

/* Largest tensor, for the scratch buffers. */
static int64_t max_numel(const xm_rt_program_t *p) {
  int64_t m = 1;
  for (int i = 0; i < p->num_tensors; i++)
    if (tensor_numel(&p->tensors[i]) > m) m = tensor_numel(&p->tensors[i]);
  return m;
}

static int parse_args(int argc, char **argv, harness_t *h) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--verbose") == 0) h->verbose = 1;
    else if (!v) return 2;
    else if (strcmp(a, "--samples") == 0) h->samples = atoi(v), i++;
    else if (strcmp(a, "--dirs") == 0) h->dirs = atoi(v), i++;
    else if (strcmp(a, "--tol") == 0) h->tol = atof(v), i++;
    else if (strcmp(a, "--noise-ulps") == 0) h->noise_ulps = atof(v), i++;
    else if (strcmp(a, "--h-elem") == 0) h->h_elem = atof(v), i++;
    else if (strcmp(a, "--h-dir") == 0) h->h_dir = atof(v), i++;
    else if (strcmp(a, "--std-scale") == 0) h->std_scale = atof(v), i++;
    else return 2;
  }
  return 0;
}

int main(int argc, char **argv) {
  harness_t h = {.p = &xm_program, .rng = 0x9e3779b97f4a7c15ull, .tol = DEFAULT_TOL,
                 .noise_ulps = NOISE_ULPS, .h_elem = H_ELEM, .h_dir = H_DIR, .std_scale = STD_SCALE,
                 .samples = SAMPLES, .dirs = DIRS};
  if (parse_args(argc, argv, &h)) {
    fprintf(stderr, "usage: gradcheck [--samples N] [--dirs N] [--tol X] [--noise-ulps X] [--h-elem X]\n"
                    "                 [--h-dir X] [--std-scale X] [--verbose]\n");
    return 2;
  }
  h.x.program = h.p;
  h.x.be = xm_rt_cpu_backend();
  h.x.stream = h.x.be->stream_create(h.x.be);
  h.x.persist = arena(h.p->persistent_bytes);
  h.x.act = arena(h.p->activation_bytes);
  h.x.grad_scale = 1.0f;
  h.saved = malloc(sizeof(float) * (size_t)max_numel(h.p));
  h.sign = malloc((size_t)max_numel(h.p));
  init_params(&h);
  init_inputs(&h);
  double loss = run_loss(&h);
  h.loss0 = loss;
  double ce = *(float *)tensor_ptr(&h, h.p->ce_loss);
  printf("model %s: loss %.6f (cross-entropy %.6f), tolerance %.1e, noise %.0f ulp(L)\n",
         h.p->model_name, loss, ce, h.tol, h.noise_ulps);
  if (!isfinite(loss)) {
    printf("FAIL the loss is not finite\n");
    return 1;
  }
  /* Keep the baseline gradients: later runs overwrite the grad states. */
  h.grads = malloc((size_t)h.p->persistent_bytes + 1);
  memcpy(h.grads, h.x.persist, (size_t)h.p->persistent_bytes);
  tally_t t = {0};
  int params = 0;
  for (int i = 0; i < h.p->num_tensors; i++) {
    const xm_rt_tensor_t *pt = &h.p->tensors[i];
    if (pt->category != XM_RT_CAT_WEIGHTS || !pt->trainable) continue;
    params++;
    check_param(&h, i, &t);
  }
  int total = t.checked + t.skipped;
  printf("%d params, %d checks: %d within tolerance (%d above the noise floor), %d failed, %d "
         "skipped (routing flips), worst err %.2e\n",
         params, total, t.checked - t.failed, t.decisive, t.failed, t.skipped, t.worst);
  free(h.grads), free(h.saved), free(h.sign), free(h.x.persist), free(h.x.act);
  if (t.failed > 0 || total == 0 || t.skipped > MAX_SKIP_FRACTION * total) {
    printf("FAIL\n");
    return 1;
  }
  printf("PASS\n");
  return 0;
}
