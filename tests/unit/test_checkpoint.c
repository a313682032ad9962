/* tests/unit/test_checkpoint.c — checkpoints of a hand-built program: bit-exact
 * round trips, Hugging Face names and shapes in the files (headers parsed
 * here independently of the reader), sharded saves, the optimizer file,
 * atomic replacement and recovery from simulated crashes, and every
 * mismatch between files and program reported with its file and name. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "runtime/comm/context.h"
#include "runtime/io/checkpoint.h"
#include "runtime/io/safetensors.h"
#include "support/strbuf.h"

#include "tests/unit/toy_program.h"

/* An exec whose persistent arena holds pseudo-random bit patterns (NaNs,
 * denormals and negative zeros included: the round trip must be exact). */
static xm_rt_exec_t *exec_new(uint32_t seed) {
  xm_rt_exec_t *x = calloc(1, sizeof *x);
  x->program = &g_program;
  x->ctx = &g_ctx;
  x->persist = malloc((size_t)g_program.persistent_bytes);
  x->persist_host = x->persist;
  x->beta1 = 0.9f, x->beta2 = 0.95f, x->adam_eps = 1e-8f, x->lr = 1e-4f;
  uint32_t s = seed * 2654435761u + 12345u;
  for (int64_t i = 0; i < g_program.persistent_bytes; i += 4) {
    s = s * 1664525u + 1013904223u;
    /* Arbitrary bits, but finite as f32 and as either bf16 half (the
     * loader refuses NaN and infinity): the top exponent bit is clear. */
    uint32_t v = s & ~0x40004000u;
    memcpy(x->persist + i, &v, 4);
  }
  return x;
}

static void exec_free(xm_rt_exec_t *x) {
  free(x->persist);
  free(x);
}

static const xm_rt_tensor_t *tensor(const char *name) {
  for (int i = 0; i < NT; i++)
    if (strcmp(g_tensors[i].name, name) == 0) return &g_tensors[i];
  fail_msg("no tensor %s", name);
  return NULL;
}

static void assert_category_equal(const xm_rt_exec_t *a, const xm_rt_exec_t *b, int cat) {
  for (int i = 0; i < NT; i++) {
    const xm_rt_tensor_t *t = &g_tensors[i];
    if (t->persistent && t->category == cat)
      assert_memory_equal(a->persist + t->offset, b->persist + t->offset, (size_t)t->bytes);
  }
}

static void assert_category_zero(const xm_rt_exec_t *x, int cat) {
  for (int i = 0; i < NT; i++) {
    const xm_rt_tensor_t *t = &g_tensors[i];
    for (int64_t k = 0; t->persistent && t->category == cat && k < t->bytes; k++)
      assert_int_equal(x->persist[t->offset + k], 0);
  }
}

/* ---- files ---- */

static char *g_root;

static int rm_cb(const char *p, const struct stat *s, int f, struct FTW *w) {
  (void)s, (void)f, (void)w;
  return remove(p);
}

static void rm_tree(const char *p) { nftw(p, rm_cb, 8, FTW_DEPTH | FTW_PHYS); }

static char *path_of(const char *a, const char *b) {
  xm_strbuf_t s;
  xm_strbuf_init(&s);
  xm_strbuf_printf(&s, "%s/%s", a, b);
  return xm_strbuf_take(&s);
}

static bool exists(const char *dir, const char *name) {
  char *p = path_of(dir, name);
  struct stat sb;
  bool r = stat(p, &sb) == 0;
  free(p);
  return r;
}

static char *read_text(const char *dir, const char *name) {
  char *p = path_of(dir, name), *data = NULL;
  size_t n = 0;
  assert_int_equal(xm_read_file(p, &data, &n), 0);
  free(p);
  return data;
}

static void write_bytes(const char *dir, const char *name, const void *data, size_t n) {
  char *p = path_of(dir, name);
  FILE *f = fopen(p, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, n, f), n);
  fclose(f);
  free(p);
}

static void write_text(const char *dir, const char *name, const char *text) {
  write_bytes(dir, name, text, strlen(text));
}

/* Number of entries of the root that start with "<base>." (leftovers). */
static int siblings(const char *base) {
  DIR *d = opendir(g_root);
  int n = 0;
  size_t nb = strlen(base);
  for (struct dirent *e; (e = readdir(d));)
    if (strncmp(e->d_name, base, nb) == 0 && e->d_name[nb] == '.') n++;
  closedir(d);
  return n;
}

/* The header of a safetensors file, parsed here without the reader. */
static cJSON *header_of(const char *dir, const char *name, uint64_t *out_data_start) {
  char *p = path_of(dir, name), *data = NULL;
  size_t n = 0;
  assert_int_equal(xm_read_file(p, &data, &n), 0);
  free(p);
  assert_true(n >= 8);
  uint64_t len = 0;
  for (int i = 7; i >= 0; i--)
    len = (len << 8) | (unsigned char)data[i];
  assert_true(8 + len <= n);
  assert_int_equal((8 + len) % 8, 0);
  cJSON *j = cJSON_ParseWithLength(data + 8, (size_t)len);
  assert_non_null(j);
  if (out_data_start) *out_data_start = 8 + len;
  free(data);
  return j;
}

static bool diag_has(const xm_diag_t *d, const char *file_suffix, const char *place,
                     const char *needle) {
  for (int i = 0; i < d->count; i++) {
    const xm_diag_entry_t *e = &d->entries[i];
    if (e->level != XM_DIAG_ERROR || !strstr(e->message, needle)) continue;
    if (place && (!e->place || strcmp(e->place, place) != 0)) continue;
    if (file_suffix) {
      size_t nf = e->file ? strlen(e->file) : 0, ns = strlen(file_suffix);
      if (nf < ns || strcmp(e->file + nf - ns, file_suffix) != 0) continue;
    }
    return true;
  }
  xm_diag_print(d, stderr);
  return false;
}

static char *ckpt_dir(const char *name) { return path_of(g_root, name); }

static const xm_rt_train_state_t k_state = {
    .step = 17,
    .data_pos = 12345,
    .rng = {0xffffffffffffffffull, 1, 0x8000000000000001ull, 123456789012345678ull},
    .last_loss = 2.718281828459045,
};

static void save_ok(const xm_rt_exec_t *x, const char *dir, bool opt) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_status_t s = xm_rt_checkpoint_save(x, dir, &k_state, opt, &d);
  if (s) xm_diag_print(&d, stderr);
  assert_int_equal(s, XM_OK);
  xm_diag_free(&d);
}

/* Loads into a fresh exec filled with other bits; returns it. */
static xm_rt_exec_t *load_ok(const char *dir, bool opt, xm_rt_train_state_t *st) {
  xm_rt_exec_t *y = exec_new(999);
  xm_diag_t d;
  xm_diag_init(&d);
  xm_status_t s = xm_rt_checkpoint_load(y, dir, opt, st, &d);
  if (s) xm_diag_print(&d, stderr);
  assert_int_equal(s, XM_OK);
  xm_diag_free(&d);
  return y;
}

static void assert_same_state(const xm_rt_train_state_t *a, const xm_rt_train_state_t *b) {
  assert_int_equal(a->step, b->step);
  assert_int_equal(a->data_pos, b->data_pos);
  for (int i = 0; i < 4; i++)
    assert_true(a->rng[i] == b->rng[i]);
  assert_memory_equal(&a->last_loss, &b->last_loss, sizeof(double));
}

static void expect_load_error(const char *dir, const char *file, const char *place,
                              const char *message) {
  xm_rt_exec_t *y = exec_new(77), *before = exec_new(77);
  xm_rt_train_state_t st;
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(xm_rt_checkpoint_load(y, dir, true, &st, &d), XM_ERR_INVALID_INPUT);
  assert_true(diag_has(&d, file, place, message));
  /* Nothing is copied unless everything matches. */
  assert_memory_equal(y->persist, before->persist, (size_t)g_program.persistent_bytes);
  xm_diag_free(&d);
  exec_free(y), exec_free(before);
}

/* ---- tests ---- */

static void test_round_trip_exact(void **state) {
  (void)state;
  char *dir = ckpt_dir("rt");
  xm_rt_exec_t *x = exec_new(1);
  save_ok(x, dir, true);
  xm_rt_train_state_t st;
  xm_rt_exec_t *y = load_ok(dir, true, &st);
  assert_category_equal(x, y, XM_RT_CAT_WEIGHTS);
  assert_category_equal(x, y, XM_RT_CAT_OPTIMIZER);
  assert_category_zero(y, XM_RT_CAT_GRADS);
  assert_same_state(&st, &k_state);
  assert_true(exists(dir, "model.safetensors"));
  assert_false(exists(dir, "model.safetensors.index.json"));
  assert_true(exists(dir, "optimizer.safetensors"));
  char *cfg = read_text(dir, "config.json"), *spec = read_text(dir, "spec.json");
  assert_string_equal(cfg, k_config);
  assert_string_equal(spec, k_spec);
  free(cfg), free(spec);
  assert_int_equal(siblings("rt"), 0);
  /* trainer_state.json keeps the RNG as exact decimal strings. */
  char *ts = read_text(dir, "trainer_state.json");
  cJSON *j = cJSON_Parse(ts);
  assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "rng"), 0)->valuestring,
                      "18446744073709551615");
  assert_string_equal(cJSON_GetObjectItem(j, "model_name")->valuestring, "toy");
  cJSON *set = cJSON_GetObjectItem(j, "settings");
  assert_string_equal(cJSON_GetObjectItem(set, "seed")->valuestring, "18364758544493064720");
  assert_string_equal(cJSON_GetObjectItem(set, "lr_schedule")->valuestring, "cosine");
  assert_true(cJSON_GetObjectItem(set, "weight_decay")->valuedouble == 0.1);
  cJSON_Delete(j);
  free(ts);
  exec_free(x), exec_free(y);
  free(dir);
}

static void test_hf_names_in_files(void **state) {
  (void)state;
  char *dir = ckpt_dir("names");
  xm_rt_exec_t *x = exec_new(2);
  save_ok(x, dir, true);
  uint64_t start = 0;
  cJSON *h = header_of(dir, "model.safetensors", &start);
  const char *want[] = {"model.embed_tokens.weight",
                        "model.layers.0.mlp.experts.0.gate_proj.weight",
                        "model.layers.0.mlp.experts.1.gate_proj.weight",
                        "model.layers.0.mlp.experts.2.gate_proj.weight",
                        BIAS,
                        "model.norm.weight"};
  assert_int_equal(cJSON_GetArraySize(h), 7); /* + __metadata__ */
  assert_string_equal(
      cJSON_GetObjectItem(cJSON_GetObjectItem(h, "__metadata__"), "format")->valuestring, "pt");
  const char *prev = "";
  for (cJSON *e = h->child->next; e; e = e->next) { /* sorted by name */
    assert_true(strcmp(prev, e->string) < 0);
    assert_null(strstr(e->string, "{e}"));
    prev = e->string;
  }
  for (int i = 0; i < 6; i++)
    assert_non_null(cJSON_GetObjectItemCaseSensitive(h, want[i]));
  cJSON *e1 = cJSON_GetObjectItem(h, "model.layers.0.mlp.experts.1.gate_proj.weight");
  assert_string_equal(cJSON_GetObjectItem(e1, "dtype")->valuestring, "F32");
  cJSON *shape = cJSON_GetObjectItem(e1, "shape");
  assert_int_equal(cJSON_GetArraySize(shape), 2);
  assert_int_equal(cJSON_GetArrayItem(shape, 0)->valueint, F);
  assert_int_equal(cJSON_GetArrayItem(shape, 1)->valueint, H);
  /* Expert 1's bytes are the second slice of the stacked arena tensor. */
  int b = cJSON_GetArrayItem(cJSON_GetObjectItem(e1, "data_offsets"), 0)->valueint;
  int e = cJSON_GetArrayItem(cJSON_GetObjectItem(e1, "data_offsets"), 1)->valueint;
  assert_int_equal(e - b, F * H * 4);
  char *raw = NULL;
  size_t n = 0;
  char *p = path_of(dir, "model.safetensors");
  assert_int_equal(xm_read_file(p, &raw, &n), 0);
  assert_memory_equal(raw + start + b, x->persist + tensor(EXPERT)->offset + F * H * 4, F * H * 4);
  free(raw), free(p);
  cJSON_Delete(h);
  h = header_of(dir, "optimizer.safetensors", NULL);
  assert_int_equal(cJSON_GetArraySize(h), 12); /* 11 states + __metadata__ */
  assert_non_null(cJSON_GetObjectItem(h, "model.embed_tokens.weight.exp_avg"));
  assert_non_null(
      cJSON_GetObjectItem(h, "model.layers.0.mlp.experts.2.gate_proj.weight.exp_avg_sq"));
  cJSON *load = cJSON_GetObjectItem(h, "model.layers.0.mlp.gate.load");
  assert_string_equal(cJSON_GetObjectItem(load, "dtype")->valuestring, "I32");
  for (cJSON *it = h->child; it; it = it->next)
    assert_null(strstr(it->string, ".grad"));
  cJSON_Delete(h);
  exec_free(x);
  free(dir);
}

static void test_sharded(void **state) {
  (void)state;
  char *dir = ckpt_dir("sharded");
  xm_rt_exec_t *x = exec_new(3);
  /* embed 80 | experts 3 x 32 | bias 12 + norm 16: three shards of <= 100. */
  setenv("XM_CKPT_SHARD_BYTES", "100", 1);
  save_ok(x, dir, true);
  unsetenv("XM_CKPT_SHARD_BYTES");
  assert_false(exists(dir, "model.safetensors"));
  for (int k = 1; k <= 3; k++) {
    char name[64];
    snprintf(name, sizeof name, "model-%05d-of-00003.safetensors", k);
    assert_true(exists(dir, name));
  }
  char *text = read_text(dir, "model.safetensors.index.json");
  cJSON *idx = cJSON_Parse(text);
  assert_int_equal(
      cJSON_GetObjectItem(cJSON_GetObjectItem(idx, "metadata"), "total_size")->valueint,
      80 + 96 + 12 + 16);
  cJSON *map = cJSON_GetObjectItem(idx, "weight_map");
  assert_int_equal(cJSON_GetArraySize(map), 6);
  assert_string_equal(cJSON_GetObjectItem(map, "model.embed_tokens.weight")->valuestring,
                      "model-00001-of-00003.safetensors");
  assert_string_equal(
      cJSON_GetObjectItem(map, "model.layers.0.mlp.experts.2.gate_proj.weight")->valuestring,
      "model-00002-of-00003.safetensors");
  assert_string_equal(cJSON_GetObjectItem(map, "model.norm.weight")->valuestring,
                      "model-00003-of-00003.safetensors");
  cJSON_Delete(idx);
  free(text);
  xm_rt_train_state_t st;
  xm_rt_exec_t *y = load_ok(dir, true, &st);
  assert_category_equal(x, y, XM_RT_CAT_WEIGHTS);
  assert_category_equal(x, y, XM_RT_CAT_OPTIMIZER);
  exec_free(y);
  /* A weight map without the norm, then one naming a missing shard. */
  idx = cJSON_Parse(text = read_text(dir, "model.safetensors.index.json"));
  free(text);
  map = cJSON_GetObjectItem(idx, "weight_map");
  cJSON_DeleteItemFromObject(map, "model.norm.weight");
  text = cJSON_Print(idx);
  write_text(dir, "model.safetensors.index.json", text);
  free(text);
  expect_load_error(dir, "sharded/model.safetensors.index.json", "model.norm.weight",
                    "missing tensor \"model.norm.weight\" (not in the weight map)");
  expect_load_error(dir, "sharded/model-00003-of-00003.safetensors", "model.norm.weight",
                    "index maps it to another file");
  cJSON_ReplaceItemInObject(map, "model.embed_tokens.weight",
                            cJSON_CreateString("model-00009-of-00003.safetensors"));
  text = cJSON_Print(idx);
  write_text(dir, "model.safetensors.index.json", text);
  free(text);
  cJSON_Delete(idx);
  expect_load_error(dir, "sharded/model-00009-of-00003.safetensors", NULL, "cannot open");
  /* A weight map naming an unknown tensor. */
  write_text(dir, "model.safetensors.index.json",
             "{\"weight_map\": {\"model.bogus\": \"model-00001-of-00003.safetensors\"}}");
  y = exec_new(4);
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(xm_rt_checkpoint_load(y, dir, false, &st, &d), XM_ERR_INVALID_INPUT);
  assert_true(
      diag_has(&d, "model.safetensors.index.json", "/weight_map/model.bogus", "unexpected tensor"));
  xm_diag_free(&d);
  exec_free(y);
  /* A malformed limit is bad input. */
  setenv("XM_CKPT_SHARD_BYTES", "12k", 1);
  xm_diag_init(&d);
  assert_int_equal(xm_rt_checkpoint_save(x, dir, &k_state, true, &d), XM_ERR_INVALID_INPUT);
  assert_true(diag_has(&d, NULL, "XM_CKPT_SHARD_BYTES", "positive number"));
  xm_diag_free(&d);
  unsetenv("XM_CKPT_SHARD_BYTES");
  assert_int_equal(siblings("sharded"), 0);
  exec_free(x);
  free(dir);
}

static void test_optimizer_optional(void **state) {
  (void)state;
  char *dir = ckpt_dir("noopt");
  xm_rt_exec_t *x = exec_new(5);
  save_ok(x, dir, false);
  assert_false(exists(dir, "optimizer.safetensors"));
  xm_rt_exec_t *y = exec_new(6);
  xm_rt_train_state_t st;
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(xm_rt_checkpoint_load(y, dir, true, &st, &d), XM_ERR_INVALID_INPUT);
  assert_true(diag_has(&d, "optimizer.safetensors", NULL, "has none"));
  xm_diag_free(&d);
  exec_free(y);
  y = load_ok(dir, false, &st);
  assert_category_equal(x, y, XM_RT_CAT_WEIGHTS);
  assert_category_zero(y, XM_RT_CAT_OPTIMIZER);
  assert_category_zero(y, XM_RT_CAT_GRADS);
  assert_same_state(&st, &k_state);
  exec_free(x), exec_free(y);
  free(dir);
}

/* Replaces `dir` atomically, with and without RENAME_EXCHANGE, and cleans
 * the leftovers of crashed saves. */
static void test_atomic_replace(void **state) {
  (void)state;
  char *dir = ckpt_dir("atomic");
  xm_rt_exec_t *a = exec_new(10), *b = exec_new(11), *c = exec_new(12);
  save_ok(a, dir, true);
  /* A save that crashed while writing, and a stale old directory. */
  char *junk = ckpt_dir("atomic.tmp-99999");
  assert_int_equal(mkdir(junk, 0755), 0);
  write_text(junk, "config.json", "{");
  char *stale = ckpt_dir("atomic.old-424242");
  assert_int_equal(mkdir(stale, 0755), 0);
  char *keep = ckpt_dir("atomic.tmp-notes"); /* not ours: left alone */
  write_text(g_root, "atomic.tmp-notes", "x");
  xm_rt_train_state_t st;
  xm_rt_exec_t *y = load_ok(dir, true, &st); /* the leftover does not disturb a load */
  assert_category_equal(a, y, XM_RT_CAT_WEIGHTS);
  exec_free(y);
  save_ok(b, dir, true);
  assert_int_equal(siblings("atomic"), 1); /* only atomic.tmp-notes */
  y = load_ok(dir, true, &st);
  assert_category_equal(b, y, XM_RT_CAT_WEIGHTS);
  assert_category_equal(b, y, XM_RT_CAT_OPTIMIZER);
  exec_free(y);
  setenv("XM_CKPT_RENAME_EXCHANGE", "0", 1); /* the two-rename path */
  save_ok(c, dir, true);
  unsetenv("XM_CKPT_RENAME_EXCHANGE");
  assert_int_equal(siblings("atomic"), 1);
  y = load_ok(dir, true, &st);
  assert_category_equal(c, y, XM_RT_CAT_WEIGHTS);
  exec_free(y);
  remove(keep);
  exec_free(a), exec_free(b), exec_free(c);
  free(dir), free(junk), free(stale), free(keep);
}

/* A crash between the two renames: no "<dir>", "<dir>.old-P" (previous)
 * and "<dir>.tmp-P" (new, complete). Load reads the new one; the next save
 * finishes the swap. Without the tmp, the old one is read. */
static void test_crash_between_renames(void **state) {
  (void)state;
  char *dir = ckpt_dir("crash");
  char *old = ckpt_dir("crash.old-777"), *tmp = ckpt_dir("crash.tmp-777");
  xm_rt_exec_t *a = exec_new(20), *b = exec_new(21), *c = exec_new(22);
  save_ok(a, old, true);
  save_ok(b, tmp, true);
  xm_rt_train_state_t st;
  xm_rt_exec_t *y = load_ok(dir, true, &st);
  assert_category_equal(b, y, XM_RT_CAT_WEIGHTS);
  assert_category_equal(b, y, XM_RT_CAT_OPTIMIZER);
  exec_free(y);
  rm_tree(tmp);
  y = load_ok(dir, true, &st);
  assert_category_equal(a, y, XM_RT_CAT_WEIGHTS);
  exec_free(y);
  save_ok(c, dir, true);
  assert_int_equal(siblings("crash"), 0);
  y = load_ok(dir, true, &st);
  assert_category_equal(c, y, XM_RT_CAT_WEIGHTS);
  exec_free(y);
  /* The same state again, then a save: the new checkpoint (tmp) is put in
   * place first, then replaced by the save. */
  assert_int_equal(rename(dir, old), 0);
  save_ok(b, tmp, true);
  save_ok(a, dir, true);
  assert_int_equal(siblings("crash"), 0);
  y = load_ok(dir, true, &st);
  assert_category_equal(a, y, XM_RT_CAT_WEIGHTS);
  exec_free(y);
  exec_free(a), exec_free(b), exec_free(c);
  free(dir), free(old), free(tmp);
}

/* Rewrites model.safetensors of `dir` with the program's weights, edited. */
typedef enum { DROP_NORM, EXTRA, NORM_SHAPE, NORM_DTYPE } edit_t;

static void rewrite_model(const xm_rt_exec_t *x, const char *dir, edit_t edit) {
  static float big[16];
  xm_st_entry_t e[8];
  int n = 0;
  const xm_rt_tensor_t *emb = tensor("model.embed_tokens.weight");
  e[n++] = (xm_st_entry_t){emb->name, XM_ST_F32, 2, {V, H}, x->persist + emb->offset};
  for (int k = 0; k < E; k++) {
    static char names[E][64];
    snprintf(names[k], sizeof names[k], "model.layers.0.mlp.experts.%d.gate_proj.weight", k);
    e[n++] = (xm_st_entry_t){
        names[k], XM_ST_F32, 2, {F, H}, x->persist + tensor(EXPERT)->offset + k * F * H * 4};
  }
  e[n++] = (xm_st_entry_t){BIAS, XM_ST_F32, 1, {E}, x->persist + tensor(BIAS)->offset};
  if (edit == EXTRA) e[n++] = (xm_st_entry_t){"model.extra.weight", XM_ST_F32, 1, {2}, big};
  if (edit == NORM_SHAPE) e[n++] = (xm_st_entry_t){"model.norm.weight", XM_ST_F32, 1, {5}, big};
  if (edit == NORM_DTYPE) e[n++] = (xm_st_entry_t){"model.norm.weight", XM_ST_I32, 1, {H}, big};
  if (edit == EXTRA) e[n++] = (xm_st_entry_t){"model.norm.weight", XM_ST_F32, 1, {H}, big};
  char *p = path_of(dir, "model.safetensors");
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(xm_st_write(p, e, n, NULL, 0, &d), XM_OK);
  xm_diag_free(&d);
  free(p);
}

static void test_mismatches(void **state) {
  (void)state;
  char *dir = ckpt_dir("bad");
  xm_rt_exec_t *x = exec_new(30);
  save_ok(x, dir, true);
  rewrite_model(x, dir, DROP_NORM);
  expect_load_error(dir, "bad/model.safetensors", "model.norm.weight",
                    "missing tensor \"model.norm.weight\"");
  rewrite_model(x, dir, EXTRA);
  expect_load_error(dir, "bad/model.safetensors", "model.extra.weight",
                    "unexpected tensor \"model.extra.weight\"");
  rewrite_model(x, dir, NORM_SHAPE);
  expect_load_error(dir, "bad/model.safetensors", "model.norm.weight",
                    "has shape [5], the program expects [4]");
  rewrite_model(x, dir, NORM_DTYPE);
  expect_load_error(dir, "bad/model.safetensors", "model.norm.weight",
                    "has dtype I32, the program expects F32");
  /* A header length beyond any sane size. */
  write_bytes(dir, "model.safetensors", "\xff\xff\xff\xff\xff\x00\x00\x00{}", 10);
  expect_load_error(dir, "bad/model.safetensors", "offset 0", "exceeds the limit");
  /* A truncated file: the tensors no longer fit the data section. */
  save_ok(x, dir, true);
  char *p = path_of(dir, "optimizer.safetensors");
  struct stat sb;
  assert_int_equal(stat(p, &sb), 0);
  assert_int_equal(truncate(p, sb.st_size - 4), 0);
  free(p);
  expect_load_error(dir, "bad/optimizer.safetensors", "model.norm.weight.exp_avg_sq",
                    "out of range");
  /* trainer_state.json: bad JSON, then bad fields with their pointers. */
  save_ok(x, dir, true);
  write_text(dir, "trainer_state.json", "{\"step\": 3,");
  expect_load_error(dir, "bad/trainer_state.json", "offset 11", "invalid JSON");
  write_text(dir, "trainer_state.json",
             "{\"format\": \"xmoec-trainer-state\", \"version\": 1, \"step\": -1, "
             "\"data_pos\": 0, \"rng\": [\"1\", \"2\", \"3\", \"x\"]}");
  expect_load_error(dir, "bad/trainer_state.json", "/step", "non-negative integer");
  expect_load_error(dir, "bad/trainer_state.json", "/rng/3", "decimal");
  write_text(
      dir, "trainer_state.json",
      "{\"format\": \"xmoec-trainer-state\", \"version\": 1, \"step\": 1, \"data_pos\": 2, "
      "\"rng\": [\"1\", \"2\", \"3\", \"18446744073709551616\"]}");
  expect_load_error(dir, "bad/trainer_state.json", "/rng/3", "decimal");
  /* No model file at all, and no directory at all. */
  p = path_of(dir, "model.safetensors");
  remove(p);
  free(p);
  expect_load_error(dir, "bad", NULL, "no model.safetensors");
  char *none = ckpt_dir("none");
  expect_load_error(none, "none", NULL, "not found");
  free(none);
  exec_free(x);
  free(dir);
}

/* Replaces `from` by `to` (once) in DIR/name. */
static void edit_text(const char *dir, const char *name, const char *from, const char *to) {
  char *text = read_text(dir, name);
  char *at = strstr(text, from);
  assert_non_null(at);
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  xm_strbuf_printf(&b, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
  write_text(dir, name, xm_strbuf_cstr(&b));
  xm_strbuf_free(&b);
  free(text);
}

static bool diag_warns(const xm_diag_t *d, const char *place, const char *needle) {
  for (int i = 0; i < d->count; i++)
    if (d->entries[i].level == XM_DIAG_WARNING && d->entries[i].place &&
        strcmp(d->entries[i].place, place) == 0 && strstr(d->entries[i].message, needle))
      return true;
  xm_diag_print(d, stderr);
  return false;
}

/* A resume checks what it resumes against the program: the trainer
 * state's format and version, the settings it was trained with, and the
 * model's config.json field by field. */
static void test_resume_validates(void **state) {
  (void)state;
  char *dir = ckpt_dir("validate");
  xm_rt_exec_t *x = exec_new(5);
  save_ok(x, dir, true);
  edit_text(dir, "trainer_state.json", "\"xmoec-trainer-state\"", "\"megatron\"");
  expect_load_error(dir, "validate/trainer_state.json", "/format", "xmoec-trainer-state");
  save_ok(x, dir, true);
  edit_text(dir, "trainer_state.json", "\"version\":\t1", "\"version\":\t2");
  expect_load_error(dir, "validate/trainer_state.json", "/version", "written by a newer xmoec");
  save_ok(x, dir, true);
  edit_text(dir, "trainer_state.json", "\"version\":\t1", "\"version\":\t0.5");
  expect_load_error(dir, "validate/trainer_state.json", "/version", "positive integer");
  /* seq_len: the data position would count other windows. */
  save_ok(x, dir, true);
  edit_text(dir, "trainer_state.json", "\"seq_len\":\t8", "\"seq_len\":\t16");
  expect_load_error(dir, "validate/trainer_state.json", "/settings/seq_len",
                    "trained with 16, the program is compiled with 8");
  /* A new learning rate and batch: loaded, each change a warning. */
  save_ok(x, dir, true);
  edit_text(dir, "trainer_state.json", "\"micro_batch\":\t2", "\"micro_batch\":\t4");
  edit_text(dir, "trainer_state.json", "\"lr_schedule\":\t\"cosine\"",
            "\"lr_schedule\":\t\"linear\"");
  xm_rt_exec_t *y = exec_new(6);
  xm_rt_train_state_t st;
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(xm_rt_checkpoint_load(y, dir, true, &st, &d), XM_OK);
  assert_true(diag_warns(&d, "/settings/micro_batch", "trained with 4"));
  assert_true(diag_warns(&d, "/settings/lr_schedule", "linear"));
  assert_int_equal(st.step, k_state.step);
  xm_diag_free(&d);
  exec_free(y);
  /* config.json of another model: a changed field, an extra one. */
  save_ok(x, dir, true);
  write_text(dir, "config.json", "{\"hidden_size\": 4, \"n_routed_experts\": 5, \"rope_theta\": 1}");
  expect_load_error(dir, "validate/config.json", "/n_routed_experts",
                    "is 5 in the checkpoint, 3 in the compiled program");
  expect_load_error(dir, "validate/config.json", "/rope_theta",
                    "is 1 in the checkpoint, missing in the compiled program");
  write_text(dir, "config.json", "[1]");
  expect_load_error(dir, "validate/config.json", NULL, "not a JSON object");
  exec_free(x);
  free(dir);
}

static void test_other_ranks_do_not_write(void **state) {
  (void)state;
  char *dir = ckpt_dir("rank1");
  xm_rt_exec_t *x = exec_new(40);
  xm_rt_context_t ctx = g_ctx;
  ctx.rank = 1;
  ctx.world = 2;
  x->ctx = &ctx;
  save_ok(x, dir, true);
  struct stat sb;
  assert_int_not_equal(stat(dir, &sb), 0);
  exec_free(x);
  free(dir);
}

/* ---- --init-from ---- */

/* The weights of the toy program as F32 values, for hand-written files. */
static float weight_value(const char *name, int64_t i) {
  return (float)((int)(strlen(name) % 7) - 3) * 0.25f + (float)i * 0.125f;
}

/* IEEE half of a float that one holds exactly (normal or zero). */
static uint16_t half_of(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  uint32_t sign = (b >> 16) & 0x8000u, exp = (b >> 23) & 0xff, man = b & 0x7fffffu;
  if (exp == 0) return (uint16_t)sign;
  assert_true(exp >= 113 && exp <= 142 && (man & 0x1fff) == 0);
  return (uint16_t)(sign | ((exp - 112) << 10) | (man >> 13));
}

/* Writes `dir` as a Hugging Face checkpoint of the toy program: one tensor
 * per expert, the embedding in BF16, the experts in F16, the bias and the
 * norm in F32 (dtype `odd` for the norm instead when it is not F32), plus
 * `extra` tensors (name, values of `like`). */
static void write_hf(const char *dir, xm_st_dtype_t odd, const char *const *extra, int n_extra,
                     const char *config) {
  mkdir(dir, 0755);
  xm_st_entry_t e[16];
  unsigned char *bufs[16];
  int n = 0;
  const struct {
    const char *name;
    int rank;
    int64_t d0, d1;
    xm_st_dtype_t dt;
  } rows[] = {
      {"model.embed_tokens.weight", 2, V, H, XM_ST_BF16},
      {"model.layers.0.mlp.experts.0.gate_proj.weight", 2, F, H, XM_ST_F16},
      {"model.layers.0.mlp.experts.1.gate_proj.weight", 2, F, H, XM_ST_F16},
      {"model.layers.0.mlp.experts.2.gate_proj.weight", 2, F, H, XM_ST_F16},
      {BIAS, 1, E, 0, XM_ST_F32},
      {"model.norm.weight", 1, H, 0, odd},
  };
  for (int r = 0; r < 6 + n_extra; r++) {
    const char *name = r < 6 ? rows[r].name : extra[r - 6];
    int k = r < 6 ? r : 0; /* extras: shaped and valued like the embedding */
    int64_t count = rows[k].rank == 2 ? rows[k].d0 * rows[k].d1 : rows[k].d0;
    xm_st_dtype_t dt = rows[k].dt;
    bufs[n] = malloc((size_t)count * 8);
    for (int64_t i = 0; i < count; i++) {
      float v = weight_value(rows[k].name, i);
      if (dt == XM_ST_F32) memcpy(bufs[n] + 4 * i, &v, 4);
      if (dt == XM_ST_F64) {
        double dv = v;
        memcpy(bufs[n] + 8 * i, &dv, 8);
      }
      if (dt == XM_ST_F16) {
        uint16_t h = half_of(v);
        memcpy(bufs[n] + 2 * i, &h, 2);
      }
      if (dt == XM_ST_BF16) {
        uint32_t bits;
        memcpy(&bits, &v, 4);
        uint16_t top = (uint16_t)(bits >> 16);
        assert_int_equal(bits & 0xffff, 0);
        memcpy(bufs[n] + 2 * i, &top, 2);
      }
    }
    e[n] = (xm_st_entry_t){.name = name, .dtype = dt, .rank = rows[k].rank, .data = bufs[n]};
    e[n].dims[0] = rows[k].d0;
    e[n].dims[1] = rows[k].d1;
    n++;
  }
  xm_diag_t d;
  xm_diag_init(&d);
  char *path = path_of(dir, "model.safetensors");
  assert_int_equal(xm_st_write(path, e, n, NULL, 0, &d), XM_OK);
  free(path);
  xm_diag_free(&d);
  for (int i = 0; i < n; i++)
    free(bufs[i]);
  if (config) write_text(dir, "config.json", config);
}

static void expect_import_error(const char *dir, const char *place, const char *message) {
  xm_rt_exec_t *y = exec_new(77), *before = exec_new(77);
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(xm_rt_checkpoint_import(y, dir, &d), XM_ERR_INVALID_INPUT);
  assert_true(diag_has(&d, NULL, place, message));
  assert_memory_equal(y->persist, before->persist, (size_t)g_program.persistent_bytes);
  xm_diag_free(&d);
  exec_free(y), exec_free(before);
}

/* --init-from: weights only (optimizer and grads zeroed), BF16 and F16
 * converted exactly, F64 refused, config.json required and compared. */
static void test_import(void **state) {
  (void)state;
  /* Our own checkpoint: the weights, nothing else. */
  char *dir = ckpt_dir("import");
  xm_rt_exec_t *x = exec_new(50);
  save_ok(x, dir, true);
  xm_rt_exec_t *y = exec_new(51);
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(xm_rt_checkpoint_import(y, dir, &d), XM_OK);
  assert_category_equal(x, y, XM_RT_CAT_WEIGHTS);
  assert_category_zero(y, XM_RT_CAT_OPTIMIZER);
  assert_category_zero(y, XM_RT_CAT_GRADS);
  xm_diag_free(&d);
  exec_free(x), exec_free(y);
  free(dir);

  /* A Hugging Face one in BF16, F16 and F32. */
  dir = ckpt_dir("import-hf");
  write_hf(dir, XM_ST_F32, NULL, 0, k_config);
  y = exec_new(52);
  xm_diag_init(&d);
  xm_status_t st = xm_rt_checkpoint_import(y, dir, &d);
  if (st) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  xm_diag_free(&d);
  const float *emb = (const float *)(y->persist + tensor("model.embed_tokens.weight")->offset);
  const float *exp = (const float *)(y->persist + tensor(EXPERT)->offset);
  const float *bias = (const float *)(y->persist + tensor(BIAS)->offset);
  for (int64_t i = 0; i < V * H; i++)
    assert_true(emb[i] == weight_value("model.embed_tokens.weight", i));
  for (int64_t e = 0; e < E; e++)
    for (int64_t i = 0; i < F * H; i++)
      assert_true(exp[e * F * H + i] ==
                  weight_value("model.layers.0.mlp.experts.0.gate_proj.weight", i));
  for (int64_t i = 0; i < E; i++)
    assert_true(bias[i] == weight_value(BIAS, i));
  assert_category_zero(y, XM_RT_CAT_OPTIMIZER);
  exec_free(y);
  /* --resume takes F32 only: a BF16 file is not its own checkpoint. */
  expect_load_error(dir, "import-hf/model.safetensors", "model.embed_tokens.weight",
                    "has dtype BF16, the program expects F32");

  /* F64 is not read; neither is a checkpoint without config.json. */
  write_hf(dir, XM_ST_F64, NULL, 0, k_config);
  expect_import_error(
      dir, "model.norm.weight",
      "tensor \"model.norm.weight\" has dtype F64, which --init-from does not read");
  write_hf(dir, XM_ST_F32, NULL, 0, NULL);
  char *cfg = path_of(dir, "config.json");
  unlink(cfg);
  free(cfg);
  expect_import_error(dir, NULL, "missing: --init-from checks the checkpoint's architecture");
  write_hf(dir, XM_ST_F32, NULL, 0, "{\"hidden_size\": 8, \"n_routed_experts\": 3}");
  expect_import_error(dir, "/hidden_size", "is 8 in the checkpoint, 4 in the compiled program");

  /* DeepSeek-V3: an MTP layer stores copies of the shared embedding (and,
   * tied, of the head); they load when they are copies. */
  static const char ds[] = "{\"model_type\": \"deepseek_v3\", \"num_hidden_layers\": 1, "
                           "\"num_nextn_predict_layers\": 1, \"tie_word_embeddings\": true}";
  const char *saved = g_program.config_json;
  g_program.config_json = ds;
  const char *copies[] = {"model.layers.1.embed_tokens.weight",
                          "model.layers.1.shared_head.head.weight",
                          "model.layers.0.self_attn.rotary_emb.inv_freq"};
  write_hf(dir, XM_ST_F32, copies, 3, ds);
  y = exec_new(53);
  xm_diag_init(&d);
  st = xm_rt_checkpoint_import(y, dir, &d);
  if (st) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  assert_true(d.count == 1 && d.entries[0].level == XM_DIAG_WARNING &&
              strstr(d.entries[0].message, "ignored 1 RoPE buffers"));
  xm_diag_free(&d);
  exec_free(y);
  /* Outside the MTP layers the same names are unexpected. */
  const char *wrong[] = {"model.layers.0.embed_tokens.weight"};
  write_hf(dir, XM_ST_F32, wrong, 1, ds);
  expect_import_error(dir, "model.layers.0.embed_tokens.weight", "unexpected tensor");
  g_program.config_json = saved;
  /* A "copy" that is not one: element 3 of the stored head set to 1.0
   * (BF16, like the embedding it copies). */
  const char *norm_copy[] = {"model.layers.1.shared_head.head.weight"};
  g_program.config_json = ds;
  write_hf(dir, XM_ST_F32, norm_copy, 1, ds);
  char *p = path_of(dir, "model.safetensors");
  xm_st_file_t f;
  xm_diag_init(&d);
  assert_int_equal(xm_st_open(p, &d, &f), XM_OK);
  const xm_st_tensor_t *t = xm_st_find(&f, "model.layers.1.shared_head.head.weight");
  size_t at = (size_t)(t->data - f.bytes);
  xm_st_close(&f);
  xm_diag_free(&d);
  char *raw = NULL;
  size_t n = 0;
  assert_int_equal(xm_read_file(p, &raw, &n), 0);
  const uint16_t one = 0x3f80; /* 1.0 in BF16 */
  memcpy(raw + at + 2 * 3, &one, 2);
  write_bytes(dir, "model.safetensors", raw, n);
  free(raw), free(p);
  expect_import_error(dir, "model.layers.1.shared_head.head.weight",
                      "should be a copy of \"model.embed_tokens.weight\"");
  g_program.config_json = saved;
  free(dir);
}

static int setup(void **state) {
  (void)state;
  program_init();
  const char *base = getenv("TMPDIR");
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  xm_strbuf_printf(&b, "%s/xm-ck-XXXXXX", base && *base ? base : "/tmp");
  g_root = xm_strbuf_take(&b);
  return mkdtemp(g_root) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  rm_tree(g_root);
  free(g_root);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip_exact),
      cmocka_unit_test(test_hf_names_in_files),
      cmocka_unit_test(test_sharded),
      cmocka_unit_test(test_optimizer_optional),
      cmocka_unit_test(test_atomic_replace),
      cmocka_unit_test(test_crash_between_renames),
      cmocka_unit_test(test_mismatches),
      cmocka_unit_test(test_resume_validates),
      cmocka_unit_test(test_other_ranks_do_not_write),
      cmocka_unit_test(test_import),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
