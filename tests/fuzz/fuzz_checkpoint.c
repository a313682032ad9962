/* tests/fuzz/fuzz_checkpoint.c — libFuzzer harness for the checkpoint
 * loader (runtime/io/checkpoint.h) on hostile trainer_state.json,
 * model.safetensors.index.json and config.json.
 *
 * On first use a valid sharded checkpoint of the hand-built program of
 * tests/unit/toy_program.h (an embedding, three stacked experts, a router
 * bias, a norm, their grads and AdamW moments, an i32 load accumulator)
 * is saved into a temporary directory. Each input is split at the line
 * "=====" into up to three parts, written as that checkpoint's
 * trainer_state.json, model.safetensors.index.json and config.json (a part
 * left out keeps the valid file); then the checkpoint is loaded with its
 * optimizer state. Properties: the load returns OK or an error; an error
 * has at least one error message naming a file (the user must learn which
 * file to fix); and after an error the persistent arena is exactly as it
 * was and the train state is zeroed (nothing is copied before everything
 * is checked). A violation aborts so libFuzzer keeps the input.
 */
#define _GNU_SOURCE
#include <ftw.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/comm/context.h"
#include "runtime/io/checkpoint.h"
#include "support/diag.h"
#include "support/strbuf.h"

#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#include "tests/unit/toy_program.h"

static xm_rt_exec_t g_exec;
static unsigned char *g_before;
static char g_dir[256];
static char *g_valid[3]; /* the saved files' texts, in part order */
static const char *const k_names[3] = {"trainer_state.json", "model.safetensors.index.json",
                                       "config.json"};

static int rm_cb(const char *p, const struct stat *s, int f, struct FTW *w) {
  (void)s, (void)f, (void)w;
  return remove(p);
}

static void cleanup(void) {
  if (g_dir[0]) nftw(g_dir, rm_cb, 8, FTW_DEPTH | FTW_PHYS);
  for (int i = 0; i < 3; i++)
    free(g_valid[i]);
  free(g_exec.persist);
  free(g_before);
}

static char *path_in(const char *name) {
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  xm_strbuf_printf(&b, "%s/ck/%s", g_dir, name);
  return xm_strbuf_take(&b);
}

static void write_part(int k, const char *text, size_t len) {
  char *p = path_in(k_names[k]);
  FILE *f = fopen(p, "wb");
  if (!f || fwrite(text, 1, len, f) != len || fclose(f) != 0) abort();
  free(p);
}

static void setup(void) {
  program_init();
  int64_t persist = g_program.persistent_bytes;
  g_exec.program = &g_program;
  g_exec.ctx = &g_ctx;
  g_exec.persist = calloc((size_t)persist, 1);
  g_before = malloc((size_t)persist);
  if (!g_exec.persist || !g_before) abort();
  g_exec.persist_host = g_exec.persist;
  for (int64_t i = 0; i < persist; i += 4) {
    float v = (float)(i % 97) / 97.0f;
    memcpy(g_exec.persist + i, &v, 4);
  }
  const char *tmp = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/xm-fuzz-ck-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(g_dir)) abort();
  atexit(cleanup);
  char *dir = path_in("");
  setenv("XM_CKPT_SHARD_BYTES", "100", 1); /* several shards and an index */
  xm_rt_train_state_t st = {.step = 3, .data_pos = 48, .rng = {1, 2, 3, 4}, .last_loss = 2.5};
  xm_diag_t diag;
  xm_diag_init(&diag);
  if (xm_rt_checkpoint_save(&g_exec, dir, &st, true, &diag) != XM_OK) {
    xm_diag_print(&diag, stderr);
    abort();
  }
  unsetenv("XM_CKPT_SHARD_BYTES");
  xm_diag_free(&diag);
  free(dir);
  for (int k = 0; k < 3; k++) {
    char *p = path_in(k_names[k]);
    size_t len;
    if (xm_read_file(p, &g_valid[k], &len) != 0) abort();
    free(p);
  }
  memcpy(g_before, g_exec.persist, (size_t)persist);
  /* XM_FUZZ_WRITE_SEED=FILE writes the valid parts joined, the seed of
   * tests/fuzz/corpus/checkpoint/ (how it was made). */
  const char *seed = getenv("XM_FUZZ_WRITE_SEED");
  FILE *f = seed ? fopen(seed, "wb") : NULL;
  for (int k = 0; f && k < 3; k++)
    fprintf(f, "%s%s", k ? "\n=====\n" : "", g_valid[k]);
  if (f) fclose(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int ready;
  if (!ready) setup(), ready = 1;
  /* Split at "\n=====\n" into up to three parts. */
  const char *text = (const char *)data, *end = text + size;
  static const char sep[] = "\n=====\n";
  const size_t seplen = sizeof sep - 1;
  for (int k = 0; k < 3; k++) {
    const char *cut = NULL;
    for (const char *p = text; p && p + seplen <= end; p++)
      if (memcmp(p, sep, seplen) == 0) {
        cut = p;
        break;
      }
    if (text < end || k == 0) {
      size_t len = (size_t)((cut ? cut : end) - text);
      write_part(k, text, len);
    } else {
      write_part(k, g_valid[k], strlen(g_valid[k]));
    }
    text = cut ? cut + seplen : end;
  }
  memset(g_exec.persist, 0x5a, (size_t)g_program.persistent_bytes);
  memcpy(g_before, g_exec.persist, (size_t)g_program.persistent_bytes);
  xm_rt_train_state_t st;
  xm_diag_t diag;
  xm_diag_init(&diag);
  char *dir = path_in("");
  xm_status_t s = xm_rt_checkpoint_load(&g_exec, dir, true, &st, &diag);
  free(dir);
  if (s != XM_OK) {
    bool named = false;
    for (int i = 0; i < diag.count; i++)
      named |= diag.entries[i].level == XM_DIAG_ERROR && diag.entries[i].file != NULL;
    if (!named) {
      fprintf(stderr, "fuzz_checkpoint: load failed (%d) without an error naming a file\n", (int)s);
      xm_diag_print(&diag, stderr);
      abort();
    }
    const xm_rt_train_state_t zero = {0};
    if (memcmp(&st, &zero, sizeof st) != 0) {
      fprintf(stderr, "fuzz_checkpoint: a failed load left a train state\n");
      abort();
    }
    if (memcmp(g_before, g_exec.persist, (size_t)g_program.persistent_bytes) != 0) {
      fprintf(stderr, "fuzz_checkpoint: a failed load changed the arena\n");
      abort();
    }
  }
  xm_diag_free(&diag);
  return 0;
}
