/* tests/fuzz/fuzz_routing.c — libFuzzer harness for the planner's measured
 * routing input (planner/routing.h: an expert-load histogram or an
 * out/train --log), the file `xmoec plan --routing` reads.
 *
 * Each input is loaded as a routing of two models (8 experts top-2, and the
 * file's own sizes unchecked) and, as a log, with 2 nodes. Beyond "no
 * crash, no leak, no undefined behaviour" the harness checks the loader's
 * contract: the status and the diagnostics agree, and a routing that loaded
 * gives an imbalance >= 1 and finite RBD copies in [1, min(k, parts)] for
 * every block count the planner asks about. A violated contract aborts.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "planner/routing.h"
#include "support/diag.h"

#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fail(const char *what, const xm_diag_t *diag) {
  fprintf(stderr, "fuzz_routing: contract violated: %s\n", what);
  xm_diag_print(diag, stderr);
  abort();
}

static void load_one(const uint8_t *data, size_t size, int64_t experts, int64_t top_k,
                     int64_t nodes) {
  xm_routing_options_t o = {.experts = experts, .top_k = top_k, .log_nodes = nodes};
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_routing_t *r = NULL;
  xm_status_t st = xm_routing_load_text((const char *)data, size, "fuzz", &o, &diag, &r);
  if (st == XM_OK && xm_diag_error_count(&diag) != 0) fail("OK with errors", &diag);
  if (st != XM_OK && xm_diag_error_count(&diag) == 0) fail("failed without an error", &diag);
  if (st != XM_OK && r) fail("failed but returned a routing", &diag);
  if (st == XM_OK) {
    if (!r) fail("OK without a routing", &diag);
    const int64_t parts[] = {1, 2, 4, 8};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
      for (int worst = 0; worst < 2; worst++) {
        double f = xm_routing_imbalance(r, parts[i], worst != 0);
        if (!isfinite(f) || f < 1.0 - 1e-9) fail("imbalance below 1 or not finite", &diag);
      }
      int64_t e = experts > 0 ? experts : 8, k = top_k > 0 ? top_k : 2;
      double c = xm_routing_rbd_copies(r, e, k, parts[i]);
      double hi = (double)(k < parts[i] ? k : parts[i]);
      if (!isfinite(c) || c < 1.0 - 1e-9 || c > hi + 1e-9) fail("RBD copies out of range", &diag);
    }
  }
  xm_routing_free(r);
  xm_diag_free(&diag);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  load_one(data, size, 8, 2, 0);
  load_one(data, size, 8, 2, 2);
  load_one(data, size, 0, 0, 2);
  return 0;
}
