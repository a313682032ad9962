/* tests/fuzz/fuzz_spec.c — libFuzzer harness for the xmoec spec loader.
 *
 * Each input is loaded twice: as a model spec (xm_spec_load_text, which also
 * routes Hugging Face configs to frontend/hf_config.c) and as a cluster
 * description on top of a default spec (xm_spec_load_cluster_text). Beyond
 * "no crash, no leak, no undefined behaviour" the harness checks the loader's
 * contract: a failed load reports at least one error, a successful one
 * reports none and leaves a spec that satisfies the basic semantic checks
 * that later stages rely on without re-checking. A violated contract aborts,
 * so libFuzzer keeps the input as a reproducer.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/spec.h"
#include "support/diag.h"

#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fail(const char *what, const xm_diag_t *diag) {
  fprintf(stderr, "fuzz_spec: contract violated: %s\n", what);
  xm_diag_print(diag, stderr);
  abort();
}

/* The status and the diagnostics must agree. */
static void check_status(xm_status_t st, const xm_diag_t *diag) {
  if (st == XM_OK && xm_diag_error_count(diag) != 0)
    fail("load returned OK but reported errors", diag);
  if (st != XM_OK && xm_diag_error_count(diag) == 0)
    fail("load failed without reporting an error", diag);
}

/* Invariants spec.h promises for a spec that loaded without errors. */
static void check_valid_spec(const xm_spec_t *s, const xm_diag_t *diag) {
  const xm_model_spec_t *m = &s->model;
  if (m->vocab <= 0 || m->hidden <= 0 || m->layers <= 0 || m->heads <= 0)
    fail("accepted spec has a non-positive size", diag);
  if (m->attention != XM_ATTN_MLA &&
      (m->kv_heads <= 0 || m->head_dim <= 0 || m->heads % m->kv_heads != 0))
    fail("accepted spec has heads not divisible by kv_heads", diag);
  if (s->moe.experts > 0 && (s->moe.top_k < 1 || s->moe.top_k > s->moe.experts))
    fail("accepted spec has top_k outside [1, experts]", diag);
  if (memchr(s->name, '\0', sizeof s->name) == NULL ||
      memchr(s->model_type, '\0', sizeof s->model_type) == NULL)
    fail("accepted spec has an unterminated name", diag);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* A private NUL-terminated copy: the loader takes (text, len), but an
   * overread past len then shows up as a heap-buffer-overflow on the
   * terminator's neighbour rather than going unnoticed. */
  char *text = malloc(size + 1);
  if (!text) return 0;
  if (size) memcpy(text, data, size);
  text[size] = '\0';

  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_spec_t spec;
  xm_status_t st = xm_spec_load_text(text, size, "fuzz.json", &diag, &spec);
  check_status(st, &diag);
  if (st == XM_OK) check_valid_spec(&spec, &diag);
  xm_diag_free(&diag);

  xm_diag_init(&diag);
  xm_spec_t base;
  xm_spec_set_defaults(&base);
  st = xm_spec_load_cluster_text(text, size, "fuzz-cluster.json", &diag, &base);
  check_status(st, &diag);
  xm_diag_free(&diag);

  free(text);
  return 0;
}
