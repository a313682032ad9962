/* tests/fuzz/fuzz_ir.c — libFuzzer harness for the IR text parser, the
 * verifier and the printer.
 *
 * Any byte string must either parse or be rejected with a diagnostic. What
 * parses is verified (the verifier must cope with whatever the parser
 * accepts, including type mismatches) and printed; the printed text must
 * parse again and print byte for byte the same (ir/text.h promises
 * parse(print(m)) prints as print(m)). A violation aborts so libFuzzer keeps
 * the input as a reproducer.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "ir/text.h"
#include "ir/verify.h"
#include "support/diag.h"
#include "support/strbuf.h"

#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fail(const char *what, const xm_diag_t *diag, const char *a, const char *b) {
  fprintf(stderr, "fuzz_ir: %s\n", what);
  if (diag) xm_diag_print(diag, stderr);
  if (a) fprintf(stderr, "--- first print:\n%s\n", a);
  if (b) fprintf(stderr, "--- second print:\n%s\n", b);
  abort();
}

/* Prints `m`, parses the text again and checks the second print matches. */
static void check_round_trip(const xm_ir_module_t *m) {
  xm_strbuf_t first, second;
  xm_strbuf_init(&first);
  xm_strbuf_init(&second);
  xm_ir_print(m, &first);

  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_ir_module_t *again = NULL;
  if (xm_ir_parse(xm_strbuf_cstr(&first), first.len, "printed.xir", &diag, &again) != XM_OK)
    fail("printed module does not parse", &diag, xm_strbuf_cstr(&first), NULL);
  xm_ir_print(again, &second);
  if (first.len != second.len || memcmp(xm_strbuf_cstr(&first), xm_strbuf_cstr(&second),
                                        first.len) != 0)
    fail("print(parse(print(m))) != print(m)", NULL, xm_strbuf_cstr(&first),
         xm_strbuf_cstr(&second));
  xm_ir_module_destroy(again);
  xm_diag_free(&diag);
  xm_strbuf_free(&first);
  xm_strbuf_free(&second);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  if (!text) return 0;
  if (size) memcpy(text, data, size);
  text[size] = '\0';

  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_ir_module_t *m = NULL;
  xm_status_t st = xm_ir_parse(text, size, "fuzz.xir", &diag, &m);
  if (st != XM_OK && xm_diag_error_count(&diag) == 0)
    fail("parse failed without reporting an error", &diag, NULL, NULL);
  if (st != XM_OK && m != NULL) fail("failed parse returned a module", &diag, NULL, NULL);
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
  free(text);
  return 0;
}
