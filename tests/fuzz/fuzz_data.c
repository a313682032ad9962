/* tests/fuzz/fuzz_data.c — libFuzzer harness for the training data loader
 * (runtime/io/data.h): token files, raw text, and Megatron .idx headers.
 *
 * The input is written to a scratch file and opened three ways: as a data
 * file of its own (token file or text, found from the content), and as the
 * .idx of a Megatron pair whose .bin is the same bytes. Beyond "no crash, no
 * leak, no undefined behaviour" the harness checks the loader's contract:
 * the status and the diagnostics agree, and a data set that opened has
 * windows that copy without error, every id in [0, vocab). A violated
 * contract aborts.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/io/data.h"
#include "support/diag.h"

#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fail(const char *what, const xm_diag_t *diag) {
  fprintf(stderr, "fuzz_data: contract violated: %s\n", what);
  xm_diag_print(diag, stderr);
  abort();
}

static void write_file(const char *path, const uint8_t *data, size_t size) {
  FILE *f = fopen(path, "wb");
  if (!f) abort();
  if (size && fwrite(data, 1, size, f) != size) abort();
  if (fclose(f) != 0) abort();
}

static void open_one(const char *path, int64_t vocab) {
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_rt_data_t *d = NULL;
  xm_status_t st = xm_rt_data_open(path, vocab, 4, 0.25, &diag, &d);
  if (st == XM_OK && xm_diag_error_count(&diag) != 0) fail("OK with errors", &diag);
  if (st != XM_OK && xm_diag_error_count(&diag) == 0) fail("failed without an error", &diag);
  if (st != XM_OK && d) fail("failed but returned a data set", &diag);
  if (st == XM_OK) {
    int32_t tok[4], lab[4];
    int64_t nt = xm_rt_data_train_windows(d), ne = xm_rt_data_eval_windows(d);
    for (int eval = 0; eval < 2; eval++)
      for (int64_t j = 0; j < (eval ? ne : nt) && j < 64; j++) {
        if (xm_rt_data_window(d, eval, j, tok, lab, &diag) != XM_OK) fail("a window failed", &diag);
        for (int i = 0; i < 4; i++)
          if (tok[i] < 0 || tok[i] >= vocab || lab[i] < 0 || lab[i] >= vocab)
            fail("an id outside the vocabulary", &diag);
      }
    xm_rt_data_close(d);
  }
  xm_diag_free(&diag);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char dir[64], one[96], bin[96], idx[96];
  snprintf(dir, sizeof dir, "/tmp/xm-fuzz-data-%ld", (long)getpid());
  mkdir(dir, 0700);
  snprintf(one, sizeof one, "%s/input", dir);
  snprintf(bin, sizeof bin, "%s/pair.bin", dir);
  snprintf(idx, sizeof idx, "%s/pair.idx", dir);
  write_file(one, data, size);
  open_one(one, 300);
  open_one(one, 50000);
  write_file(bin, data, size);
  write_file(idx, data, size);
  open_one(idx, 50000);
  unlink(one);
  unlink(bin);
  unlink(idx);
  rmdir(dir);
  return 0;
}
