/* tests/fuzz/fuzz_inspect.c — libFuzzer harness for `xmoec inspect`'s
 * reader (tools/xmoec/inspect.h): the files of a compiled program's folder
 * read back, checked against each other (inspect_check.c) and reported.
 *
 * Each input is split at the line "=====" into up to three parts, written
 * into a temporary folder as model.xir, manifest.json and config.json (a
 * part left out is an empty file). The folder is loaded; when it loads,
 * every format is written (the trace within XM_INSPECT_MAX_EVENTS, as the
 * command does); when it does not, there must be an error message.
 * Properties: no crash, no leak, no run without end (libFuzzer's
 * -timeout), and a failed load always says why. The seeds are a real
 * compile of a one-layer model, on one rank and on two (dp 2, ep 2).
 */
#define _GNU_SOURCE
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/diag.h"
#include "support/strbuf.h"
#include "tools/xmoec/inspect.h"

#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_dir[256];
static const char *const k_names[3] = {"model.xir", "manifest.json", "config.json"};

static int rm_cb(const char *p, const struct stat *s, int f, struct FTW *w) {
  (void)s, (void)f, (void)w;
  return remove(p);
}

static void cleanup(void) {
  if (g_dir[0]) nftw(g_dir, rm_cb, 8, FTW_DEPTH | FTW_PHYS);
}

static void write_part(int k, const char *text, size_t len) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", g_dir, k_names[k]);
  FILE *f = fopen(path, "wb");
  if (!f || (len && fwrite(text, 1, len, f) != len) || fclose(f) != 0) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!g_dir[0]) {
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/xm-fuzz-ins-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) abort();
    atexit(cleanup);
  }
  const char *text = (const char *)data, *end = text + size;
  static const char sep[] = "\n=====\n";
  const size_t seplen = sizeof sep - 1;
  for (int k = 0; k < 3; k++) {
    const char *cut = NULL;
    for (const char *p = text; p + seplen <= end; p++)
      if (memcmp(p, sep, seplen) == 0) {
        cut = p;
        break;
      }
    write_part(k, text, (size_t)((cut ? cut : end) - text));
    text = cut ? cut + seplen : end;
  }
  xm_inspect_t *ins = calloc(1, sizeof *ins);
  if (!ins) return 0;
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_status_t st = xm_inspect_load(g_dir, NULL, &diag, ins);
  if (st == XM_OK) {
    xm_strbuf_t out;
    xm_strbuf_init(&out);
    xm_inspect_text(ins, &out);
    xm_inspect_dot(ins, &out);
    xm_inspect_html(ins, &out);
    if (ins->grad_accum * ins->num_micro <= XM_INSPECT_MAX_EVENTS) xm_inspect_trace(ins, &out);
    xm_strbuf_free(&out);
  } else if (xm_diag_error_count(&diag) == 0) {
    fprintf(stderr, "fuzz_inspect: the load failed (%d) without an error message\n", (int)st);
    abort();
  }
  xm_diag_free(&diag);
  xm_inspect_free(ins);
  free(ins);
  return 0;
}
