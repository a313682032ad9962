/* tests/fuzz/fuzz_hf.c — libFuzzer harness for the Hugging Face config
 * importer (frontend/hf_config.c).
 *
 * Random bytes rarely form a JSON object with a known "model_type", so most
 * inputs would stop in the JSON parser. The harness therefore runs three
 * ways per input: the raw bytes through xm_spec_load_text (the loader detects
 * "model_type" itself); and, when the bytes parse as a JSON object, the
 * object with its "model_type" forced to one of the supported values (picked
 * by a hash of the input, so the choice is reproducible), both directly
 * through xm_hf_config_import and re-serialised through the loader. The
 * importer's contract is the loader's: errors and status agree, and every
 * error names a place.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "frontend/hf_config.h"
#include "frontend/spec.h"
#include "support/diag.h"

#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const kModelTypes[] = {
    "mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek", "deepseek_v2",
    "deepseek_v3", "llama"}; /* the last is unsupported on purpose */

static void fail(const char *what, const xm_diag_t *diag) {
  fprintf(stderr, "fuzz_hf: contract violated: %s\n", what);
  xm_diag_print(diag, stderr);
  abort();
}

static void load_and_check(const char *text, size_t len) {
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_spec_t spec;
  xm_status_t st = xm_spec_load_text(text, len, "config.json", &diag, &spec);
  if (st == XM_OK && xm_diag_error_count(&diag) != 0)
    fail("load returned OK but reported errors", &diag);
  if (st != XM_OK && xm_diag_error_count(&diag) == 0)
    fail("load failed without reporting an error", &diag);
  xm_diag_free(&diag);
}

static uint32_t hash_bytes(const uint8_t *data, size_t size) {
  uint32_t h = 2166136261u; /* FNV-1a */
  for (size_t i = 0; i < size; i++) h = (h ^ data[i]) * 16777619u;
  return h;
}

/* Imports `root` directly, then through the loader as text. */
static void import_forced(cJSON *root, const char *model_type) {
  /* Every copy goes: JSON allows duplicate keys and the lookup finds the
   * first one. */
  while (cJSON_GetObjectItemCaseSensitive(root, "model_type"))
    cJSON_DeleteItemFromObjectCaseSensitive(root, "model_type");
  if (!cJSON_AddStringToObject(root, "model_type", model_type)) return;

  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_spec_t spec;
  xm_spec_set_defaults(&spec);
  if (!xm_hf_config_detect(root)) fail("object with model_type not detected", &diag);
  xm_hf_config_import(root, "config.json", &diag, &spec);
  for (int i = 0; i < diag.count; i++)
    if (diag.entries[i].level == XM_DIAG_ERROR && diag.entries[i].place == NULL)
      fail("import error without a place", &diag);
  xm_diag_free(&diag);

  char *printed = cJSON_PrintUnformatted(root);
  if (printed) {
    load_and_check(printed, strlen(printed));
    cJSON_free(printed);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  if (!text) return 0;
  if (size) memcpy(text, data, size);
  text[size] = '\0';

  load_and_check(text, size);

  cJSON *root = cJSON_ParseWithLength(text, size);
  if (root && cJSON_IsObject(root)) {
    size_t n = sizeof kModelTypes / sizeof kModelTypes[0];
    import_forced(root, kModelTypes[hash_bytes(data, size) % n]);
  }
  cJSON_Delete(root);
  free(text);
  return 0;
}
