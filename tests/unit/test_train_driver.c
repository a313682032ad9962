/* tests/unit/test_train_driver.c — the training driver (runtime/driver/train.h)
 * run in-process on a hand-written program: a bigram language model
 * (embedding -> lm_head -> cross-entropy) plus a stacked "expert" tensor
 * that only feeds a small auxiliary loss, so that per-expert initialisation
 * streams, aux-loss reporting and checkpoints of stacked tensors are all
 * exercised with the real CPU kernels.
 *
 * Asserted: bad flags and bad data return 2 with a message naming the flag
 * or the file; initial parameters equal the named RNG streams; the loss
 * falls on a learnable stream; every --log line parses and has the fields;
 * --json summaries parse; a run resumed from step 3 logs exactly the bits
 * of the uninterrupted run; evaluation reads the checkpoint; a NaN loss
 * ends the run with exit code 1 naming the step; the layout banner, the
 * (zero) traffic of one rank in the log and the summary, --traffic, and
 * a program compiled for 2 ranks refused on 1. The multi-rank driver is
 * tested on 4 ranks in test_mpi4_shard_io.c.
 *
 * MPI can be initialised once per process: main() initialises it so that
 * the driver's context never owns (and never finalises) it. The NaN test
 * needs xm_rt_abort, which ends the process, so it runs in a child forked
 * before MPI starts.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/io/data.h"
#include "runtime/cpu/kernels.h"
#include "runtime/io/rng.h"
#include "runtime/driver/train.h"
#include "support/strbuf.h"

/* ---- the toy program ------------------------------------------------------------ */

enum { V = 16, H = 8, S = 8, MB = 2, GA = 2, N = MB * S, E = 3, EU = 4, EK = 2 };
#define AUX_ALPHA 0.01f

/* clang-format off */
enum {
  T_EMBED, T_HEAD, T_UP, T_G_EMBED, T_G_HEAD, T_G_UP, T_M_EMBED, T_V_EMBED, T_M_HEAD, T_V_HEAD,
  T_M_UP, T_V_UP, T_TOKENS, T_LABELS, T_X, T_LOGITS, T_LOSS, T_CE, T_DLOGITS, T_DX, T_TMP,
  T_COUNT
};

#define VH (V * H * 4)
#define UPB (E * EU * EK * 4)
/* Every tensor gets a 1 KiB slot: persistent arena 3 params, 3 grads, 6
 * moments; activation arena inputs, activations and workspace. */
#define P_OFF(i) ((int64_t)(i) * 1024)
#define A_OFF(i) ((int64_t)(i) * 1024)
#define UP_NAME "model.layers.0.mlp.experts.{e}.up_proj.weight"
#define W(name, cat, rank, d0, d1, d2, off, bytes, init, std, param) \
  {name, cat, XM_RT_F32, rank, {d0, d1, d2}, 1, off, bytes, init, std, init != 0, param, 0, 0, 0, \
   cat == XM_RT_CAT_GRADS, 0}
#define A(name, cat, dt, d0, d1, off, bytes) \
  {name, cat, dt, d1 ? 2 : 0, {d0, d1}, 0, off, bytes, 0, 0.0f, 0, -1, 0, 0, 0, 0, 0}

static const xm_rt_tensor_t k_tensors[T_COUNT] = {
  [T_EMBED]   = W("model.embed_tokens.weight", XM_RT_CAT_WEIGHTS, 2, V, H, 0, P_OFF(0), VH, XM_RT_INIT_NORMAL, 0.5f, -1),
  [T_HEAD]    = W("lm_head.weight", XM_RT_CAT_WEIGHTS, 2, V, H, 0, P_OFF(1), VH, XM_RT_INIT_NORMAL, 0.5f, -1),
  [T_UP]      = W(UP_NAME, XM_RT_CAT_WEIGHTS, 3, E, EU, EK, P_OFF(2), UPB, XM_RT_INIT_NORMAL, 1.0f, -1),
  [T_G_EMBED] = W("model.embed_tokens.weight.grad", XM_RT_CAT_GRADS, 2, V, H, 0, P_OFF(3), VH, 0, 0.0f, T_EMBED),
  [T_G_HEAD]  = W("lm_head.weight.grad", XM_RT_CAT_GRADS, 2, V, H, 0, P_OFF(4), VH, 0, 0.0f, T_HEAD),
  [T_G_UP]    = W(UP_NAME ".grad", XM_RT_CAT_GRADS, 3, E, EU, EK, P_OFF(5), UPB, 0, 0.0f, T_UP),
  [T_M_EMBED] = W("model.embed_tokens.weight.exp_avg", XM_RT_CAT_OPTIMIZER, 2, V, H, 0, P_OFF(6), VH, 0, 0.0f, T_EMBED),
  [T_V_EMBED] = W("model.embed_tokens.weight.exp_avg_sq", XM_RT_CAT_OPTIMIZER, 2, V, H, 0, P_OFF(7), VH, 0, 0.0f, T_EMBED),
  [T_M_HEAD]  = W("lm_head.weight.exp_avg", XM_RT_CAT_OPTIMIZER, 2, V, H, 0, P_OFF(8), VH, 0, 0.0f, T_HEAD),
  [T_V_HEAD]  = W("lm_head.weight.exp_avg_sq", XM_RT_CAT_OPTIMIZER, 2, V, H, 0, P_OFF(9), VH, 0, 0.0f, T_HEAD),
  [T_M_UP]    = W(UP_NAME ".exp_avg", XM_RT_CAT_OPTIMIZER, 3, E, EU, EK, P_OFF(10), UPB, 0, 0.0f, T_UP),
  [T_V_UP]    = W(UP_NAME ".exp_avg_sq", XM_RT_CAT_OPTIMIZER, 3, E, EU, EK, P_OFF(11), UPB, 0, 0.0f, T_UP),
  [T_TOKENS]  = A("tokens", XM_RT_CAT_INPUTS, XM_RT_I32, MB, S, A_OFF(0), N * 4),
  [T_LABELS]  = A("labels", XM_RT_CAT_INPUTS, XM_RT_I32, MB, S, A_OFF(1), N * 4),
  [T_X]       = A("x", XM_RT_CAT_ACTIVATIONS, XM_RT_F32, N, H, A_OFF(2), N * H * 4),
  [T_LOGITS]  = A("logits", XM_RT_CAT_ACTIVATIONS, XM_RT_F32, N, V, A_OFF(3), N * V * 4),
  [T_LOSS]    = A("loss", XM_RT_CAT_ACTIVATIONS, XM_RT_F32, 0, 0, A_OFF(4), 4),
  [T_CE]      = A("ce_loss", XM_RT_CAT_ACTIVATIONS, XM_RT_F32, 0, 0, A_OFF(4) + 64, 4),
  [T_DLOGITS] = A("dlogits", XM_RT_CAT_WORKSPACE, XM_RT_F32, N, V, A_OFF(5), N * V * 4),
  [T_DX]      = A("dx", XM_RT_CAT_WORKSPACE, XM_RT_F32, N, H, A_OFF(6), N * H * 4),
  [T_TMP]     = A("dw", XM_RT_CAT_WORKSPACE, XM_RT_F32, V, H, A_OFF(7), VH),
};
/* clang-format on */

static float *F(xm_rt_exec_t *x, int i) {
  const xm_rt_tensor_t *t = &k_tensors[i];
  return (float *)((t->persistent ? x->persist : x->act) + t->offset);
}
static int32_t *I(xm_rt_exec_t *x, int i) { return (int32_t *)F(x, i); }

/* What the test inspects from inside the run. */
static float g_first_params[3][V * H];
static int g_captured;
static int g_poison; /* micro produces NaN from this step on (0: never) */

static void toy_micro(xm_rt_exec_t *x) {
  if (!g_captured) {
    memcpy(g_first_params[0], F(x, T_EMBED), VH);
    memcpy(g_first_params[1], F(x, T_HEAD), VH);
    memcpy(g_first_params[2], F(x, T_UP), UPB);
    g_captured = 1;
  }
  float *xs = F(x, T_X), *logits = F(x, T_LOGITS), *dl = F(x, T_DLOGITS), *tmp = F(x, T_TMP);
  xm_k_embedding(I(x, T_TOKENS), F(x, T_EMBED), xs, N, H);
  xm_k_matmul(xs, F(x, T_HEAD), logits, N, H, V);
  xm_k_cross_entropy(logits, I(x, T_LABELS), F(x, T_CE), N, V);
  float aux = AUX_ALPHA * (float)xm_k_sum_sq(F(x, T_UP), E * EU * EK);
  *F(x, T_LOSS) = *F(x, T_CE) + aux;
  if (g_poison && x->step >= g_poison) *F(x, T_LOSS) = NAN;
  float one = 1.0f;
  xm_k_cross_entropy_grad(&one, logits, I(x, T_LABELS), dl, N, V);
  xm_k_matmul_dw(dl, xs, tmp, N, H, V);
  xm_k_accumulate(F(x, T_G_HEAD), tmp, V * H);
  xm_k_matmul_dx(dl, F(x, T_HEAD), F(x, T_DX), N, H, V);
  xm_k_embedding_grad(F(x, T_DX), I(x, T_TOKENS), tmp, N, V, H);
  xm_k_accumulate(F(x, T_G_EMBED), tmp, V * H);
  xm_k_scale(F(x, T_UP), tmp, E * EU * EK, 2.0f * AUX_ALPHA);
  xm_k_accumulate(F(x, T_G_UP), tmp, E * EU * EK);
  /* What a generated micro's host_read ops do: hand the driver the losses. */
  xm_rt_read(x, &x->host_loss, F(x, T_LOSS), 4);
  xm_rt_read(x, &x->host_ce_loss, F(x, T_CE), 4);
}

static void toy_step(xm_rt_exec_t *x) {
  static const int params[3][4] = {{T_EMBED, T_G_EMBED, T_M_EMBED, T_V_EMBED},
                                   {T_HEAD, T_G_HEAD, T_M_HEAD, T_V_HEAD},
                                   {T_UP, T_G_UP, T_M_UP, T_V_UP}};
  double norm_sq = 0.0;
  for (int k = 0; k < 3; k++)
    norm_sq += xm_k_sum_sq(F(x, params[k][1]), k_tensors[params[k][0]].bytes / 4);
  x->grad_norm = sqrt(norm_sq);
  x->grad_scale = xm_rt_clip_coef((float)norm_sq, x->grad_clip);
  for (int k = 0; k < 3; k++) {
    int64_t n = k_tensors[params[k][0]].bytes / 4;
    xm_k_adamw(F(x, params[k][0]), F(x, params[k][1]), F(x, params[k][2]), F(x, params[k][3]), n,
               x->lr, x->beta1, x->beta2, x->adam_eps, x->weight_decay, x->step, x->grad_scale);
    memset(F(x, params[k][1]), 0, (size_t)n * 4);
  }
}

static const xm_rt_program_t k_toy = {
    .model_name = "toy-bigram",
    .config_json = "{\"vocab_size\": 16, \"hidden_size\": 8}\n",
    .spec_json = "{}\n",
    .vocab = V,
    .seq_len = S,
    .micro_batch = MB,
    .grad_accum = GA,
    .lr = 0.05,
    .min_lr = 0.005,
    .weight_decay = 0.0,
    .beta1 = 0.9,
    .beta2 = 0.95,
    .adam_eps = 1e-8,
    .grad_clip = 1.0,
    .warmup_steps = 2,
    .train_steps = 40,
    .lr_schedule = 0,
    .seed = 1234,
    .persistent_bytes = 12 * 1024,
    .activation_bytes = 8 * 1024,
    .num_tensors = T_COUNT,
    .tensors = k_tensors,
    .tokens = T_TOKENS,
    .labels = T_LABELS,
    .loss = T_LOSS,
    .ce_loss = T_CE,
    .micro = toy_micro,
    .step = toy_step,
};

/* ---- harness ----------------------------------------------------------------- */

static char *g_dir;
static char g_data[600];

static int rm_cb(const char *p, const struct stat *s, int f, struct FTW *w) {
  (void)s, (void)f, (void)w;
  return remove(p);
}

/* A path in the test directory; 8 rotating buffers (run_train uses 2). */
static const char *tpath(const char *name) {
  static char buf[8][500];
  static int k;
  k = (k + 1) % 8;
  snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
  return buf[k];
}

static char *slurp(const char *path) {
  char *text = NULL;
  size_t len = 0;
  if (xm_read_file(path, &text, &len) != 0) return strdup("");
  return text;
}

/* Runs the driver on argv {"train", args..., NULL} with stdout and stderr
 * captured into *out / *err (owned by the caller; may be NULL). */
static const xm_rt_program_t *g_program = &k_toy; /* what run_train runs */

static int run_train(const char *const *args, char **out, char **err) {
  char *argv[64];
  int argc = 0;
  argv[argc++] = (char *)"train";
  for (; args[argc - 1]; argc++)
    argv[argc] = (char *)args[argc - 1];
  argv[argc] = NULL;
  const char *out_path = tpath("stdout.txt"), *err_path = tpath("stderr.txt");
  fflush(stdout);
  fflush(stderr);
  int saved_out = dup(1), saved_err = dup(2);
  int fo = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  int fe = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  dup2(fo, 1);
  dup2(fe, 2);
  close(fo);
  close(fe);
  int rc = xm_rt_train_main(argc, argv, g_program);
  fflush(stdout);
  fflush(stderr);
  dup2(saved_out, 1);
  dup2(saved_err, 2);
  close(saved_out);
  close(saved_err);
  char *o = slurp(out_path), *e = slurp(err_path);
  if (out)
    *out = o;
  else
    free(o);
  if (err)
    *err = e;
  else
    free(e);
  return rc;
}

/* The learnable stream: the next token is a function of the current one. */
static void write_bigram_data(const char *path, int n, uint32_t vocab_limit) {
  uint32_t *t = malloc((size_t)n * sizeof *t);
  t[0] = 0;
  for (int i = 1; i < n; i++)
    t[i] = (3 * t[i - 1] + 1 + (uint32_t)(i % 7 == 0)) % vocab_limit;
  xm_diag_t diag;
  xm_diag_init(&diag);
  assert_int_equal(xm_rt_data_write_tokens(path, t, n, 2, &diag), XM_OK);
  xm_diag_free(&diag);
  free(t);
}

static int setup(void **state) {
  (void)state;
  const char *base = getenv("TMPDIR");
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  xm_strbuf_printf(&b, "%s/xm-train-XXXXXX", base && *base ? base : "/tmp");
  g_dir = xm_strbuf_take(&b);
  if (!mkdtemp(g_dir)) return -1;
  snprintf(g_data, sizeof g_data, "%s", tpath("bigram.tok"));
  write_bigram_data(g_data, 2001, V);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  nftw(g_dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
  free(g_dir);
  return 0;
}

/* Parses the --log file: one object per line; returns the array. */
static cJSON *read_log(const char *path) {
  char *text = slurp(path);
  cJSON *arr = cJSON_CreateArray();
  char *save = NULL;
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    cJSON *obj = cJSON_Parse(line);
    if (!obj) fprintf(stderr, "unparsable log line: %s\n", line);
    assert_non_null(obj);
    cJSON_AddItemToArray(arr, obj);
  }
  free(text);
  return arr;
}

static void assert_close(double a, double b, double tol) {
  if (!(fabs(a - b) <= tol)) fprintf(stderr, "%.17g != %.17g (tolerance %g)\n", a, b, tol);
  assert_true(fabs(a - b) <= tol);
}

static double num(const cJSON *obj, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (!cJSON_IsNumber(v)) fprintf(stderr, "field %s missing or not a number\n", key);
  assert_true(cJSON_IsNumber(v));
  return v->valuedouble;
}

/* ---- flags and inputs ---------------------------------------------------------------- */

static void expect_exit2(const char *const *args, const char *needle) {
  char *err = NULL;
  int rc = run_train(args, NULL, &err);
  if (rc != 2 || !strstr(err, needle))
    fprintf(stderr, "rc %d, wanted 2 and '%s' in:\n%s\n", rc, needle, err);
  assert_int_equal(rc, 2);
  assert_non_null(strstr(err, needle));
  free(err);
}

static void test_bad_flags(void **state) {
  (void)state;
  const char *d = g_data;
  expect_exit2((const char *[]){"--data", d, "--stpes", "3", NULL}, "did you mean --steps");
  expect_exit2((const char *[]){"--data", d, "--frobnicate", NULL}, "--frobnicate: unknown flag");
  expect_exit2((const char *[]){"--data", d, "--steps", NULL}, "--steps: missing value");
  expect_exit2((const char *[]){"--data", d, "--steps", "10k", NULL},
               "--steps: expected a non-negative integer, got '10k'");
  expect_exit2((const char *[]){"--data", d, "--steps", "-1", NULL},
               "--steps: expected a non-negative integer");
  expect_exit2((const char *[]){"--data", d, "--lr", "-1", NULL},
               "--lr: expected a positive number");
  expect_exit2((const char *[]){"--data", d, "--lr", "nan", NULL},
               "--lr: expected a positive number");
  expect_exit2((const char *[]){"--data", d, "--clip=x", NULL}, "--clip: expected");
  expect_exit2((const char *[]){"--data", d, "--seed", "-3", NULL}, "--seed: expected an unsigned");
  /* numbers are decimal with nothing around them */
  expect_exit2((const char *[]){"--data", d, "--seed", "0x10", NULL}, "--seed: expected an unsigned");
  expect_exit2((const char *[]){"--data", d, "--steps", " 5", NULL}, "--steps: expected");
  expect_exit2((const char *[]){"--data", d, "--steps", "+5", NULL}, "--steps: expected");
  expect_exit2((const char *[]){"--data", d, "--lr", "0x1p-3", NULL}, "--lr: expected");
  expect_exit2((const char *[]){"--data", d, "--lr", "inf", NULL}, "--lr: expected");
  expect_exit2((const char *[]){"--data", d, "--lr", " 1e-3", NULL}, "--lr: expected");
  expect_exit2((const char *[]){"--data", d, "--schedule", "step", NULL},
               "--schedule: expected cosine");
  expect_exit2((const char *[]){"--data", d, "--progress", "sometimes", NULL},
               "--progress: expected auto");
  expect_exit2((const char *[]){"--data", d, "--eval-fraction", "1", NULL},
               "--eval-fraction: expected");
  expect_exit2((const char *[]){"--data", d, "--eval", "--batches", "2", NULL},
               "--eval: needs --resume");
  expect_exit2((const char *[]){"--data", d, "--batches", "0", NULL},
               "--batches: expected a positive integer");
  expect_exit2((const char *[]){"--data", d, "--batches", "-2", NULL},
               "--batches: expected a positive integer");
  expect_exit2((const char *[]){"--data", d, "--save-every", "2", NULL},
               "--save-every: needs --ckpt-dir");
  expect_exit2((const char *[]){"--data", d, "--json=1", NULL}, "--json: takes no value");
  expect_exit2((const char *[]){"--data", d, "--steps", "2", "--steps", "3", NULL},
               "--steps: given more than once");
  expect_exit2((const char *[]){"--steps", "2", NULL}, "--data: required");
  expect_exit2((const char *[]){"--data", d, "--resume", tpath("nowhere"), NULL},
               "not a checkpoint directory");
  expect_exit2((const char *[]){"--data", d, "--eval", "--ckpt", tpath("x"), "--steps", "3", NULL},
               "--steps: has no effect with --eval");
  expect_exit2((const char *[]){"--data", d, "--log", tpath("no/such/dir/log"), "--steps", "1",
                                "--quiet", NULL},
               "cannot open the log");
  expect_exit2((const char *[]){"--data", d, "--traffic", tpath("no/such/dir/t"), "--steps", "1",
                                "--quiet", NULL},
               "no/such/dir/t: cannot open the traffic file");
  expect_exit2(
      (const char *[]){"--data", d, "--eval", "--ckpt", tpath("x"), "--traffic", tpath("t"), NULL},
      "--traffic: has no effect with --eval");
  expect_exit2((const char *[]){"--data", d, "--traffic", NULL}, "--traffic: missing value");
}

static void test_help(void **state) {
  (void)state;
  char *out = NULL;
  assert_int_equal(run_train((const char *[]){"--help", NULL}, &out, NULL), 0);
  assert_non_null(strstr(out, "--data PATH"));
  assert_non_null(strstr(out, "--eval-fraction X"));
  assert_non_null(strstr(out, "--traffic FILE"));
  assert_non_null(strstr(out, "toy-bigram"));
  free(out);
}

static void test_bad_data(void **state) {
  (void)state;
  expect_exit2((const char *[]){"--data", tpath("missing.tok"), NULL},
               "missing.tok: error: cannot open");
  /* token 16 >= vocab 16 at index 3: offset 16 + 3*2 */
  uint32_t toks[40] = {1, 2, 3, 16};
  const char *bad = tpath("bad.tok");
  xm_diag_t diag;
  xm_diag_init(&diag);
  assert_int_equal(xm_rt_data_write_tokens(bad, toks, 40, 2, &diag), XM_OK);
  xm_diag_free(&diag);
  expect_exit2((const char *[]){"--data", bad, NULL}, "bad.tok: error: offset 22: token id 16");
  /* too short for one window of 8 */
  xm_diag_init(&diag);
  uint32_t few[5] = {1, 2, 3, 4, 5};
  assert_int_equal(xm_rt_data_write_tokens(bad, few, 5, 2, &diag), XM_OK);
  xm_diag_free(&diag);
  expect_exit2((const char *[]){"--data", bad, NULL}, "too few tokens");
}

/* ---- training ------------------------------------------------------------------------ */

/* Initial values are the named streams: one per tensor, one per expert of
 * a stacked tensor, independent of where the tensor sits in the arena. */
static void test_init_streams(void **state) {
  (void)state;
  g_captured = 0;
  assert_int_equal(
      run_train((const char *[]){"--data", g_data, "--steps", "1", "--seed", "77", "--quiet", NULL},
                NULL, NULL),
      0);
  assert_true(g_captured);
  float want[V * H];
  xm_rt_rng_t r;
  xm_rt_rng_seed_named(&r, 77, "model.embed_tokens.weight");
  xm_rt_rng_fill_normal(&r, want, V * H, 0.0, 0.5);
  assert_memory_equal(want, g_first_params[0], VH);
  xm_rt_rng_seed_named(&r, 77, "lm_head.weight");
  xm_rt_rng_fill_normal(&r, want, V * H, 0.0, 0.5);
  assert_memory_equal(want, g_first_params[1], VH);
  for (int e = 0; e < E; e++) {
    char name[96];
    snprintf(name, sizeof name, "model.layers.0.mlp.experts.%d.up_proj.weight", e);
    xm_rt_rng_seed_named(&r, 77, name);
    xm_rt_rng_fill_normal(&r, want, EU * EK, 0.0, 1.0);
    assert_memory_equal(want, g_first_params[2] + e * EU * EK, EU * EK * 4);
  }
  /* another seed gives other values */
  g_captured = 0;
  assert_int_equal(
      run_train((const char *[]){"--data", g_data, "--steps", "1", "--seed", "78", "--quiet", NULL},
                NULL, NULL),
      0);
  xm_rt_rng_seed_named(&r, 77, "lm_head.weight");
  xm_rt_rng_fill_normal(&r, want, V * H, 0.0, 0.5);
  assert_true(memcmp(want, g_first_params[1], VH) != 0);
}

static void test_learns_and_logs(void **state) {
  (void)state;
  const char *log = tpath("learn.log");
  char *out = NULL, *err = NULL;
  int rc = run_train((const char *[]){"--data", g_data, "--log", log, "--ckpt-dir",
                                      tpath("learn-ckpt"), "--progress", "never", NULL},
                     &out, &err);
  if (rc != 0) fprintf(stderr, "%s\n", err);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "trained 40 steps"));
  cJSON *arr = read_log(log);
  assert_int_equal(cJSON_GetArraySize(arr), 40); /* --steps defaults to train_steps */
  static const char *const fields[] = {"step",      "loss",   "ce_loss",      "aux_loss", "lr",
                                       "grad_norm", "tokens", "tokens_per_s", "elapsed_s"};
  for (int i = 0; i < 40; i++) {
    const cJSON *l = cJSON_GetArrayItem(arr, i);
    for (size_t f = 0; f < sizeof fields / sizeof *fields; f++)
      (void)num(l, fields[f]);
    assert_int_equal((int)num(l, "step"), i + 1);
    assert_int_equal((int64_t)num(l, "tokens"), (int64_t)(i + 1) * GA * MB * S);
    double aux = num(l, "aux_loss");
    assert_true(aux > 0.0);
    assert_close(aux, num(l, "loss") - num(l, "ce_loss"), 1e-12);
    assert_true(num(l, "grad_norm") > 0.0);
  }
  /* schedule: warmup 2 from 0, then cosine from 0.05 to 0.005 at step 40 */
  assert_close(num(cJSON_GetArrayItem(arr, 0), "lr"), 0.025, 1e-12);
  assert_close(num(cJSON_GetArrayItem(arr, 1), "lr"), 0.05, 1e-12);
  assert_close(num(cJSON_GetArrayItem(arr, 20), "lr"),
               0.005 + 0.5 * 0.045 * (1 + cos(M_PI * 19.0 / 38.0)), 1e-12);
  assert_close(num(cJSON_GetArrayItem(arr, 39), "lr"), 0.005, 1e-12);
  double first = num(cJSON_GetArrayItem(arr, 0), "ce_loss");
  double last = num(cJSON_GetArrayItem(arr, 39), "ce_loss");
  fprintf(stderr, "ce loss %.4f -> %.4f\n", first, last);
  assert_true(first > 2.0);        /* about log(16) at the start */
  assert_true(last < 0.5 * first); /* the bigram is learnt */
  assert_true(num(cJSON_GetArrayItem(arr, 39), "aux_loss") <
              num(cJSON_GetArrayItem(arr, 0), "aux_loss"));
  cJSON_Delete(arr);
  char *latest = slurp(tpath("learn-ckpt/latest"));
  assert_string_equal(latest, "step-000040\n");
  free(latest);
  free(out);
  free(err);
}

static void test_json_summary(void **state) {
  (void)state;
  const char *log = tpath("json.log");
  char *out = NULL;
  assert_int_equal(run_train((const char *[]){"--data", g_data, "--steps", "5", "--json", "--log",
                                              log, "--batches", "3", "--quiet", NULL},
                             &out, NULL),
                   0);
  cJSON *j = cJSON_Parse(out);
  assert_non_null(j);
  assert_int_equal((int)num(j, "steps"), 5);
  assert_int_equal((int)num(j, "last_step"), 5);
  assert_int_equal((int)num(j, "tokens"), 5 * GA * MB * S);
  assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "checkpoint")));
  double eval = num(j, "eval_loss");
  assert_true(eval > 0.0 && eval < 10.0);
  cJSON *arr = read_log(log);
  assert_int_equal(cJSON_GetArraySize(arr), 5);
  assert_true(num(j, "final_loss") == num(cJSON_GetArrayItem(arr, 4), "loss"));
  /* one rank: every step's traffic is zero, in the log and the summary */
  for (int i = 0; i < 5; i++) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(arr, i), "traffic");
    assert_true(cJSON_IsObject(t));
    assert_true(num(t, "intra_bytes") == 0 && num(t, "inter_bytes") == 0);
    assert_true(cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(t, "by_phase"), "dispatch")));
  }
  const cJSON *tj = cJSON_GetObjectItemCaseSensitive(j, "traffic");
  assert_true(cJSON_IsObject(tj));
  assert_true(num(tj, "intra_bytes") == 0);
  cJSON_Delete(arr);
  cJSON_Delete(j);
  free(out);
}

static int count_lines_with(const char *text, const char *needle) {
  int n = 0;
  for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle))
    n++;
  return n;
}

/* Plain lines every steps/20 when stderr is a file, a rewritten line with
 * --progress always, nothing with --quiet or --progress never. */
static void test_progress(void **state) {
  (void)state;
  char *err = NULL;
  assert_int_equal(run_train((const char *[]){"--data", g_data, NULL}, NULL, &err), 0);
  assert_int_equal(count_lines_with(err, "\nstep "), 20); /* steps 2, 4, ..., 40 */
  assert_non_null(strstr(err, "\nstep 40/40  loss "));
  assert_non_null(strstr(err, "eta 0:00\n"));
  assert_null(strstr(err, "\r"));
  free(err);
  assert_int_equal(
      run_train((const char *[]){"--data", g_data, "--steps", "3", "--progress", "always", NULL},
                NULL, &err),
      0);
  assert_int_equal(count_lines_with(err, "\rstep "), 3);
  assert_non_null(strstr(err, "\rstep 3/3  loss "));
  free(err);
  char *out = NULL;
  assert_int_equal(
      run_train((const char *[]){"--data", g_data, "--steps", "3", "--quiet", NULL}, &out, &err),
      0);
  assert_string_equal(err, "");
  assert_string_equal(out, "");
  free(err);
  free(out);
}

/* The logged values of step s (1-based) as exact bit patterns. */
static void expect_same_step(const cJSON *a, const cJSON *b) {
  static const char *const keys[] = {"step", "loss",      "ce_loss", "aux_loss",
                                     "lr",   "grad_norm", "tokens"};
  for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
    char x[64], y[64];
    snprintf(x, sizeof x, "%a", num(a, keys[k]));
    snprintf(y, sizeof y, "%a", num(b, keys[k]));
    if (strcmp(x, y) != 0) fprintf(stderr, "%s: %s vs %s\n", keys[k], x, y);
    assert_string_equal(x, y);
  }
}

/* 6 steps straight vs 3 steps, then a resumed run to step 6: the logs of
 * steps 4..6 must agree bit for bit (params, moments, step count, data
 * position all restored). */
static void test_resume_bit_identical(void **state) {
  (void)state;
  char straight[500], split[500]; /* tpath's buffers rotate */
  snprintf(straight, sizeof straight, "%s", tpath("straight"));
  snprintf(split, sizeof split, "%s", tpath("split"));
  char *err = NULL;
  int rc = run_train((const char *[]){"--data", g_data, "--steps", "6", "--ckpt-dir", straight,
                                      "--save-every", "2", "--log", tpath("straight.log"),
                                      "--quiet", NULL},
                     NULL, &err);
  if (rc) fprintf(stderr, "%s", err);
  assert_int_equal(rc, 0);
  free(err);
  assert_true(access(tpath("straight/step-000002/model.safetensors"), F_OK) == 0);
  assert_true(access(tpath("straight/step-000004/model.safetensors"), F_OK) == 0);
  assert_true(access(tpath("straight/step-000006/optimizer.safetensors"), F_OK) == 0);
  assert_int_equal(run_train((const char *[]){"--data", g_data, "--steps", "3", "--ckpt-dir", split,
                                              "--log", tpath("first.log"), "--quiet", NULL},
                             NULL, NULL),
                   0);
  char *latest = slurp(tpath("split/latest"));
  assert_string_equal(latest, "step-000003\n");
  free(latest);
  rc = run_train((const char *[]){"--data", g_data, "--steps", "6", "--resume", split, "--ckpt-dir",
                                  split, "--log", tpath("second.log"), "--quiet", NULL},
                 NULL, &err);
  if (rc) fprintf(stderr, "%s", err);
  assert_int_equal(rc, 0);
  free(err);
  cJSON *a = read_log(tpath("straight.log")), *b1 = read_log(tpath("first.log")),
        *b2 = read_log(tpath("second.log"));
  assert_int_equal(cJSON_GetArraySize(a), 6);
  assert_int_equal(cJSON_GetArraySize(b1), 3);
  assert_int_equal(cJSON_GetArraySize(b2), 3);
  for (int s = 0; s < 3; s++)
    expect_same_step(cJSON_GetArrayItem(a, s), cJSON_GetArrayItem(b1, s));
  for (int s = 0; s < 3; s++)
    expect_same_step(cJSON_GetArrayItem(a, 3 + s), cJSON_GetArrayItem(b2, s));
  cJSON_Delete(a);
  cJSON_Delete(b1);
  cJSON_Delete(b2);
  /* resuming a step directory directly, with nothing left to do */
  char *out = NULL;
  rc = run_train((const char *[]){"--data", g_data, "--steps", "6", "--resume",
                                  tpath("split/step-000006"), "--json", NULL},
                 &out, &err);
  if (rc) fprintf(stderr, "%s", err);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(err, "nothing to train"));
  cJSON *j = cJSON_Parse(out);
  assert_non_null(j);
  assert_int_equal((int)num(j, "steps"), 0);
  assert_int_equal((int)num(j, "last_step"), 6);
  cJSON_Delete(j);
  free(out);
  free(err);
  /* The log rule: a new run truncates the file (the log of a resumed run,
   * second.log, was appended to and holds 3 steps; a new run into it holds
   * its own 2), a resumed run appends. */
  rc = run_train((const char *[]){"--data", g_data, "--steps", "2", "--log", tpath("second.log"),
                                  "--quiet", NULL},
                 NULL, &err);
  assert_int_equal(rc, 0);
  free(err);
  b2 = read_log(tpath("second.log"));
  assert_int_equal(cJSON_GetArraySize(b2), 2);
  assert_int_equal((int)num(cJSON_GetArrayItem(b2, 0), "step"), 1);
  cJSON_Delete(b2);
  rc = run_train((const char *[]){"--data", g_data, "--steps", "4", "--resume",
                                  tpath("split/step-000003"), "--log", tpath("second.log"),
                                  "--quiet", NULL},
                 NULL, &err);
  assert_int_equal(rc, 0);
  free(err);
  b2 = read_log(tpath("second.log"));
  assert_int_equal(cJSON_GetArraySize(b2), 3);
  assert_int_equal((int)num(cJSON_GetArrayItem(b2, 2), "step"), 4);
  cJSON_Delete(b2);
  /* --steps 0 on a fresh run: the initial checkpoint, no made-up loss (the
   * text says no step was trained, the JSON's losses are null). */
  rc = run_train((const char *[]){"--data", g_data, "--steps", "0", "--ckpt-dir",
                                  tpath("zero"), NULL},
                 &out, &err);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(err, "--steps is 0: nothing to train; the initial weights are saved"));
  assert_non_null(strstr(out, "trained no step (at step 0), checkpoint "));
  assert_null(strstr(out, "final loss"));
  free(out);
  free(err);
  rc = run_train((const char *[]){"--data", g_data, "--steps", "0", "--json", NULL}, &out, &err);
  assert_int_equal(rc, 0);
  j = cJSON_Parse(out);
  assert_non_null(j);
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(j, "final_loss")));
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(j, "checkpoint")));
  cJSON_Delete(j);
  free(out);
  free(err);
}

static void test_eval(void **state) {
  (void)state;
  char ckpt[500]; /* written by test_learns_and_logs */
  snprintf(ckpt, sizeof ckpt, "%s", tpath("learn-ckpt"));
  char *out = NULL, *err = NULL;
  int rc = run_train((const char *[]){"--data", g_data, "--eval", "--ckpt", ckpt, "--batches", "2",
                                      "--json", NULL},
                     &out, &err);
  if (rc) fprintf(stderr, "%s", err);
  assert_int_equal(rc, 0);
  cJSON *j = cJSON_Parse(out);
  assert_non_null(j);
  double trained = num(j, "loss");
  assert_int_equal((int)num(j, "tokens"), 2 * MB * S);
  assert_int_equal((int)num(j, "batches"), 2);
  assert_int_equal((int)num(j, "step"), 40);
  cJSON_Delete(j);
  free(out);
  free(err);
  /* the same evaluation twice gives the same loss (no state leaks) */
  rc = run_train((const char *[]){"--data", g_data, "--eval", "--resume", ckpt, "--batches", "2",
                                  "--json", NULL},
                 &out, NULL);
  assert_int_equal(rc, 0);
  j = cJSON_Parse(out);
  assert_true(num(j, "loss") == trained);
  cJSON_Delete(j);
  free(out);
  /* more batches than the split holds: 2001 tokens / 8 = 250 windows, 12
   * for evaluation = 6 batches of 2 */
  rc = run_train((const char *[]){"--data", g_data, "--eval", "--resume", ckpt, "--batches", "100",
                                  "--json", NULL},
                 &out, &err);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(err, "using all of them"));
  j = cJSON_Parse(out);
  assert_int_equal((int)num(j, "batches"), 6);
  assert_int_equal((int)num(j, "tokens"), 6 * MB * S);
  cJSON_Delete(j);
  free(out);
  free(err);
  /* untrained parameters are worse than trained ones */
  rc = run_train((const char *[]){"--data", g_data, "--steps", "1", "--lr", "1e-9", "--ckpt-dir",
                                  tpath("untrained"), "--quiet", NULL},
                 NULL, NULL);
  assert_int_equal(rc, 0);
  rc = run_train((const char *[]){"--data", g_data, "--eval", "--resume", tpath("untrained"),
                                  "--batches", "2", "--json", NULL},
                 &out, NULL);
  assert_int_equal(rc, 0);
  j = cJSON_Parse(out);
  fprintf(stderr, "eval loss trained %.4f, untrained %.4f\n", trained, num(j, "loss"));
  assert_true(trained < 0.5 * num(j, "loss"));
  cJSON_Delete(j);
  free(out);
}

/* The banner names the layout; --traffic writes nothing on one rank (no
 * collective is called) but creates the file; a program compiled for
 * dp 2 does not run on 1 rank. */
static void test_layout(void **state) {
  (void)state;
  char *err = NULL;
  const char *traffic = tpath("one.traffic");
  int rc = run_train((const char *[]){"--data", g_data, "--steps", "2", "--traffic", traffic,
                                      "--progress", "never", NULL},
                     NULL, &err);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(err, "layout dp1 tp1 ep1 zero0 on 1 rank (1 per node)"));
  free(err);
  assert_int_equal(access(traffic, F_OK), 0);
  char *text = slurp(traffic);
  assert_string_equal(text, "");
  free(text);
  xm_rt_program_t two = k_toy;
  two.dp = 2;
  two.ep = 2;
  g_program = &two;
  rc = run_train((const char *[]){"--data", g_data, "--steps", "1", "--quiet", NULL}, NULL, &err);
  g_program = &k_toy;
  if (rc != 2) fprintf(stderr, "%s", err);
  assert_int_equal(rc, 2);
  assert_non_null(
      strstr(err, "compiled for dp 2 x tp 1 = 2 ranks, but it runs on 1 rank (mpirun -np 2"));
  free(err);
}

/* ---- NaN: runs in a child forked before MPI starts ------------------------------------ */

static int g_nan_status = -1;
static char g_nan_err[4096];

static void run_nan_child(void) {
  char path[] = "/tmp/xm-nan-XXXXXX", dir[] = "/tmp/xm-nan-data-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0 || !mkdtemp(dir)) return;
  char data[64];
  snprintf(data, sizeof data, "%s/d.tok", dir);
  g_dir = dir; /* tpath and write_bigram_data's helpers use it */
  write_bigram_data(data, 200, V);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fd, 2);
    dup2(fd, 1);
    g_poison = 2;
    char *argv[] = {"train", "--data", data, "--steps", "4", "--quiet", NULL};
    int rc = xm_rt_train_main(6, argv, &k_toy);
    _exit(rc == 0 ? 98 : 97); /* must not get here: the abort ends the process */
  }
  int status = 0;
  waitpid(pid, &status, 0);
  g_nan_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  ssize_t n = pread(fd, g_nan_err, sizeof g_nan_err - 1, 0);
  g_nan_err[n > 0 ? n : 0] = '\0';
  close(fd);
  unlink(path);
  unlink(data);
  rmdir(dir);
  g_dir = NULL;
}

static void test_nan_aborts(void **state) {
  (void)state;
  if (g_nan_status != 1) fprintf(stderr, "child status %d, output:\n%s\n", g_nan_status, g_nan_err);
  assert_int_equal(g_nan_status, 1);
  assert_non_null(strstr(g_nan_err, "step 2: the loss is"));
}

/* The sanitizer build: Open MPI's leaks are suppressed by its entry points
 * (tests/lsan.supp), which only match with full malloc stacks (Open MPI
 * has no frame pointers). scripts/test.sh asks for those for test_mpi_*;
 * this test starts MPI too, so it asks for them itself. Unused otherwise. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "fast_unwind_on_malloc=0"; }
const char *__lsan_default_options(void);
const char *__lsan_default_options(void) { return "fast_unwind_on_malloc=0"; }

int main(int argc, char **argv) {
  setenv("XM_NO_REEXEC", "1", 1);
  run_nan_child();
  MPI_Init(&argc, &argv);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_flags),
      cmocka_unit_test(test_help),
      cmocka_unit_test(test_bad_data),
      cmocka_unit_test(test_init_streams),
      cmocka_unit_test(test_learns_and_logs),
      cmocka_unit_test(test_json_summary),
      cmocka_unit_test(test_progress),
      cmocka_unit_test(test_resume_bit_identical),
      cmocka_unit_test(test_eval),
      cmocka_unit_test(test_layout),
      cmocka_unit_test(test_nan_aborts),
  };
  int failed = cmocka_run_group_tests(tests, setup, teardown);
  MPI_Finalize();
  return failed;
}
