/* tests/fuzz/fuzz_mlir.c — libFuzzer harness for the MLIR importer
 * (ir/mlir_bridge.h), what `xmoec opt` reads a .mlir file with.
 *
 * Any byte string must either import or be rejected with a diagnostic, and
 * a failed import returns no module. What imports is verified (the verifier
 * must cope with whatever the importer accepts), then exported to MLIR
 * again; the export must succeed, import again, and print as xmoec IR byte
 * for byte the same as the first import (the bridge promises that import
 * is the exact inverse of export). A violation aborts so libFuzzer keeps
 * the input as a reproducer.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "ir/mlir_bridge.h"
#include "ir/text.h"
#include "ir/verify.h"
#include "support/diag.h"
#include "support/strbuf.h"

#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fail(const char *what, const xm_diag_t *diag, const char *a, const char *b) {
  fprintf(stderr, "fuzz_mlir: %s\n", what);
  if (diag) xm_diag_print(diag, stderr);
  if (a) fprintf(stderr, "--- first:\n%s\n", a);
  if (b) fprintf(stderr, "--- second:\n%s\n", b);
  abort();
}

/* Exports `m`, imports the MLIR text again and checks that both modules
 * print the same xmoec IR. */
static void check_round_trip(const xm_ir_module_t *m) {
  xm_strbuf_t first, mlir, second;
  xm_strbuf_init(&first);
  xm_strbuf_init(&mlir);
  xm_strbuf_init(&second);
  xm_ir_print(m, &first);
  if (xm_mlir_export(m, &mlir) != XM_OK)
    fail("an imported module does not export", NULL, xm_strbuf_cstr(&first), NULL);

  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_ir_module_t *again = NULL;
  if (xm_mlir_import(xm_strbuf_cstr(&mlir), mlir.len, "exported.mlir", &diag, &again) != XM_OK)
    fail("the exported MLIR does not import", &diag, xm_strbuf_cstr(&first), xm_strbuf_cstr(&mlir));
  xm_ir_print(again, &second);
  if (first.len != second.len ||
      memcmp(xm_strbuf_cstr(&first), xm_strbuf_cstr(&second), first.len) != 0)
    fail("print(import(export(m))) != print(m)", NULL, xm_strbuf_cstr(&first),
         xm_strbuf_cstr(&second));
  xm_ir_module_destroy(again);
  xm_diag_free(&diag);
  xm_strbuf_free(&first);
  xm_strbuf_free(&mlir);
  xm_strbuf_free(&second);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_ir_module_t *m = NULL;
  xm_status_t st = xm_mlir_import((const char *)data, size, "fuzz.mlir", &diag, &m);
  if (st != XM_OK && xm_diag_error_count(&diag) == 0)
    fail("import failed without reporting an error", &diag, NULL, NULL);
  if (st != XM_OK && m != NULL) fail("failed import returned a module", &diag, NULL, NULL);
  if (st == XM_OK && m == NULL) fail("import succeeded without a module", &diag, NULL, NULL);
  if (st == XM_OK) {
    xm_diag_t vdiag;
    xm_diag_init(&vdiag);
    xm_status_t vst = xm_ir_verify(m, &vdiag);
    if (vst != XM_OK && xm_diag_error_count(&vdiag) == 0)
      fail("verify failed without reporting an error", &vdiag, NULL, NULL);
    xm_diag_free(&vdiag);
    check_round_trip(m);
    xm_ir_module_destroy(m);
  }
  xm_diag_free(&diag);
  return 0;
}
