/* tests/fuzz/fuzz_safetensors.c — libFuzzer harness for the safetensors
 * reader (runtime/io/safetensors.h), what every checkpoint load and every
 * imported Hugging Face file goes through.
 *
 * Each input is a whole file image, parsed in memory (xm_st_parse). Beyond
 * "no crash, no leak, no undefined behaviour" the harness checks the
 * reader's contract: the status and the diagnostics agree, and a file that
 * parsed has every tensor's bytes inside the image, of exactly the size its
 * dtype and shape give, with names found again by xm_st_find. A violated
 * contract aborts.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/io/safetensors.h"
#include "support/diag.h"

#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fail(const char *what, const xm_diag_t *diag) {
  fprintf(stderr, "fuzz_safetensors: contract violated: %s\n", what);
  xm_diag_print(diag, stderr);
  abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_st_file_t f;
  xm_status_t st = xm_st_parse("fuzz.safetensors", data, size, &diag, &f);
  if (st == XM_OK && xm_diag_error_count(&diag) != 0) fail("OK with errors", &diag);
  if (st != XM_OK && xm_diag_error_count(&diag) == 0) fail("failed without an error", &diag);
  if (st == XM_OK) {
    if (f.data_start > size) fail("data section past the end", &diag);
    for (int i = 0; i < f.num_tensors; i++) {
      const xm_st_tensor_t *t = &f.tensors[i];
      if (t->begin > t->end || t->end > size - f.data_start) fail("tensor outside the file", &diag);
      uint64_t n = (uint64_t)xm_st_dtype_size(t->dtype);
      for (int d = 0; d < t->rank; d++) n *= (uint64_t)t->dims[d];
      if (n != t->end - t->begin) fail("tensor size differs from its shape", &diag);
      if (xm_st_find(&f, t->name) != t) fail("a tensor is not found by its name", &diag);
    }
  }
  xm_st_close(&f);
  xm_diag_free(&diag);
  return 0;
}
