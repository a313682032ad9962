/* tests/e2e/gpu_step_main.c — one training step of a generated program on
 * whatever backend it is linked with, written out for comparison.
 *
 * Linked with an out/program.c (instead of out/main.c): the CPU program
 * with the CPU backend, or a GPU program (--target hip|cuda) with its
 * kernels and the emulated (or a real) GPU backend. Parameters, tokens and
 * labels come from a fixed xorshift RNG, so every build gets the same
 * inputs; the program runs micro once, then step once, only through the
 * backend table (so a backend whose memory the host cannot see works).
 * Written to the file given as argv[1], all little-endian f32:
 *   the total loss, the cross-entropy loss,
 *   for every gradient tensor in table order: its numel values after micro,
 *   the gradient norm (the step function's, as f32),
 *   for every trainable parameter in table order: its values after step.
 * and beside it OUT.bin.idx, one line per tensor written: "grad NAME N" or
 * "param NAME N". tests/e2e/gpu_emulated.sh compares two such files.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/abi/backend.h"
#include "runtime/abi/program.h"

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static double uniform(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return (double)(g_rng >> 11) / 9007199254740992.0;
}

static int64_t numel(const xm_rt_tensor_t *t) {
  int64_t n = 1;
  for (int d = 0; d < t->rank; d++) n *= t->dims[d];
  return n;
}

static void die(const char *what) {
  fprintf(stderr, "gpu_step: %s\n", what);
  exit(1);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: gpu_step OUT.bin\n");
    return 2;
  }
  const xm_rt_program_t *p = &xm_program;
  xm_rt_exec_t x;
  memset(&x, 0, sizeof x);
  x.program = p;
  x.be = xm_rt_backend_default();
  char err[256] = "";
  int threads = 1;
  if (x.be->init && x.be->init(x.be, 0, 1, &threads, err, sizeof err) != 0) die(err);
  x.stream = x.be->stream_create(x.be);
  x.persist = x.be->alloc(x.be, (size_t)p->persistent_bytes);
  x.act = x.be->alloc(x.be, (size_t)p->activation_bytes);
  unsigned char *host = calloc(1, (size_t)p->persistent_bytes + 64);
  if (!x.stream || !x.persist || !x.act || !host) die("out of memory");
  x.persist_host = host;
  x.lr = 1e-3f;
  x.step = 1;
  x.beta1 = (float)p->beta1;
  x.beta2 = (float)p->beta2;
  x.adam_eps = (float)p->adam_eps;
  x.weight_decay = (float)p->weight_decay;
  x.grad_clip = (float)p->grad_clip;
  x.grad_scale = 1.0f;

  /* parameters: uniform with the table's std (ones and zeros as declared,
   * plus a little noise so norms are not at a special point) */
  for (int i = 0; i < p->num_tensors; i++) {
    const xm_rt_tensor_t *t = &p->tensors[i];
    if (!t->persistent || t->category != XM_RT_CAT_WEIGHTS || t->dtype != XM_RT_F32) continue;
    float *v = (float *)(host + t->offset);
    for (int64_t j = 0; j < numel(t); j++) {
      double u = 2.0 * uniform() - 1.0;
      if (t->init == XM_RT_INIT_NORMAL)
        v[j] = (float)(u * 1.7320508 * (t->init_std > 0 ? t->init_std : 0.02) * 5.0);
      else if (t->init == XM_RT_INIT_ONES)
        v[j] = (float)(1.0 + 0.1 * u);
      else
        v[j] = (float)(0.01 * u);
    }
  }
  x.be->copy_h2d(x.be, x.persist, host, (size_t)p->persistent_bytes, x.stream);
  /* tokens and labels */
  const xm_rt_tensor_t *tt = &p->tensors[p->tokens], *lt = &p->tensors[p->labels];
  int64_t ntok = numel(tt);
  int32_t *tok = malloc(sizeof(int32_t) * (size_t)ntok * 2);
  if (!tok) die("out of memory");
  for (int64_t j = 0; j < 2 * ntok; j++) tok[j] = (int32_t)(uniform() * (double)p->vocab);
  unsigned char *tok_dev = (tt->persistent ? x.persist : x.act) + tt->offset;
  unsigned char *lab_dev = (lt->persistent ? x.persist : x.act) + lt->offset;
  x.be->copy_h2d(x.be, tok_dev, tok, sizeof(int32_t) * (size_t)ntok, x.stream);
  x.be->copy_h2d(x.be, lab_dev, tok + ntok, sizeof(int32_t) * (size_t)ntok, x.stream);
  x.be->sync(x.be, x.stream);

  p->micro(&x);
  FILE *f = fopen(argv[1], "wb");
  char idx_path[4096];
  snprintf(idx_path, sizeof idx_path, "%s.idx", argv[1]);
  FILE *idx = fopen(idx_path, "w");
  if (!f || !idx) die("cannot write the output files");
  float losses[2] = {x.host_loss, x.host_ce_loss};
  fwrite(losses, sizeof(float), 2, f);
  x.be->read(x.be, host, x.persist, (size_t)p->persistent_bytes, x.stream);
  for (int i = 0; i < p->num_tensors; i++) {
    const xm_rt_tensor_t *t = &p->tensors[i];
    if (t->persistent && t->category == XM_RT_CAT_GRADS && t->dtype == XM_RT_F32) {
      fwrite(host + t->offset, sizeof(float), (size_t)numel(t), f);
      fprintf(idx, "grad %s %lld\n", t->name, (long long)numel(t));
    }
  }
  p->step(&x);
  float norm = (float)x.grad_norm;
  fwrite(&norm, sizeof(float), 1, f);
  x.be->read(x.be, host, x.persist, (size_t)p->persistent_bytes, x.stream);
  for (int i = 0; i < p->num_tensors; i++) {
    const xm_rt_tensor_t *t = &p->tensors[i];
    if (t->persistent && t->category == XM_RT_CAT_WEIGHTS && t->trainable &&
        t->dtype == XM_RT_F32) {
      fwrite(host + t->offset, sizeof(float), (size_t)numel(t), f);
      fprintf(idx, "param %s %lld\n", t->name, (long long)numel(t));
    }
  }
  if (fclose(f) != 0 || fclose(idx) != 0) die("write error");
  printf("loss %.7f ce %.7f grad_norm %.7f\n", losses[0], losses[1], norm);
  x.be->free(x.be, x.persist);
  x.be->free(x.be, x.act);
  free(host);
  free(tok);
  return 0;
}
