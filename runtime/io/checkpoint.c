/* runtime/io/checkpoint.c — saving and loading checkpoints in Hugging Face form.
 *
 * The program's tensor table is the only source of truth. Both directions
 * first turn it into a list of stored tensors ("items"): every persistent
 * weight (model files) or optimizer state (optimizer file), with a stacked
 * expert tensor ("{e}" in its name, experts on dim 0) becoming one item per
 * expert that points at its contiguous slice of the arena. Saving streams
 * the items straight from the arena into safetensors files; loading matches
 * the files against the same list, reports every missing, unexpected,
 * mis-typed or mis-shaped tensor, and copies only when nothing is wrong, so
 * a failed load never leaves a half-filled arena behind silently.
 *
 * Two kinds of load share that path (ck_load_t): a resume reads exactly
 * what out/train wrote (F32, the program's own config.json field by
 * field, the optimizer and trainer state); an import (--init-from) reads
 * the weights of a Hugging Face checkpoint, BF16 and F16 converted to
 * f32, its config.json compared with the program's by what the keys mean
 * (xm_rt_hf_config_check: absent keys take the HF importer's defaults,
 * training settings are not compared), and accepts the copies of shared
 * tensors DeepSeek-V3's MTP layers store.
 *
 * Atomicity (the argument is spelled out in docs/checkpoints.md): a save
 * builds "<dir>.tmp-<pid>" completely and syncs it, then swaps it in, with
 * renameat2(RENAME_EXCHANGE) where the file system has it and otherwise
 * with two renames through "<dir>.old-<pid>". The only moment without
 * "<dir>" is between those two renames, and then both the old and the new
 * checkpoint are complete on disk; the next save finishes the swap and the
 * loader reads the new one directly. Leftovers of crashed saves (tmp or old
 * directories with a numeric suffix) are removed by the next save.
 *
 * Rank 0 writes everything and tensors are stored whole, so any parallel
 * layout can load any checkpoint. A multi-rank program's slices and ZeRO-1
 * chunks are gathered into a whole-tensor view before the save and cut out
 * of it after the load by runtime/io/shard_io.c; this file only sees whole
 * tensors.
 */
#define _GNU_SOURCE /* renameat2, qsort_r */
#include "runtime/io/checkpoint.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "runtime/comm/context.h"
#include "runtime/io/safetensors.h"
#include "support/strbuf.h"

#define CK_DEFAULT_SHARD_BYTES (4ll << 30)
#define CK_MODEL_FILE "model.safetensors"
#define CK_INDEX_FILE "model.safetensors.index.json"
#define CK_OPTIM_FILE "optimizer.safetensors"
#define CK_STATE_FILE "trainer_state.json"
#define CK_STATE_VERSION 1 /* trainer_state.json's "version" */

/* ------------------------------------------------------------------ */
/* stored tensors                                                       */
/* ------------------------------------------------------------------ */

/* One tensor as stored: a whole table tensor or one expert of a stack. */
typedef struct {
  char *name; /* owned; "{e}" replaced */
  int tensor; /* index in the program table */
  xm_st_dtype_t dtype;
  int rank;
  int64_t dims[XM_ST_MAX_RANK];
  int64_t bytes;
  int64_t offset; /* from the start of the persistent arena */
  int file;       /* load: index of the file expected to hold it */
} ck_item_t;

typedef struct {
  ck_item_t *items; /* owned */
  int count;
  int cap;
} ck_list_t;

static void ck_list_free(ck_list_t *l) {
  for (int i = 0; i < l->count; i++)
    free(l->items[i].name);
  free(l->items);
  memset(l, 0, sizeof *l);
}

static ck_item_t *ck_list_push(ck_list_t *l) {
  if (l->count == l->cap) {
    int cap = l->cap ? 2 * l->cap : 32;
    ck_item_t *p = realloc(l->items, (size_t)cap * sizeof *p);
    XM_ASSERT(p != NULL);
    l->items = p;
    l->cap = cap;
  }
  ck_item_t *it = &l->items[l->count++];
  memset(it, 0, sizeof *it);
  return it;
}

static bool ck_stored_in(const xm_rt_tensor_t *t, bool optimizer) {
  return t->category == (optimizer ? XM_RT_CAT_OPTIMIZER : XM_RT_CAT_WEIGHTS);
}

/* Appends the items of table tensor `ti` (one per expert when stacked). */
static xm_status_t ck_expand(const xm_rt_program_t *p, int ti, xm_diag_t *diag, ck_list_t *l) {
  const xm_rt_tensor_t *t = &p->tensors[ti];
  const char *mark = strstr(t->name, "{e}");
  bool ok = t->persistent && (t->dtype == XM_RT_F32 || t->dtype == XM_RT_I32) && t->rank >= 0 &&
            t->rank <= 6 && (!mark || t->rank >= 1);
  int64_t elems = 1;
  for (int d = 0; ok && d < t->rank; d++)
    ok = t->dims[d] >= 0 && !__builtin_mul_overflow(elems, t->dims[d], &elems);
  if (!ok || elems * 4 > t->bytes) {
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, t->name,
                "program table entry cannot be stored (not persistent, bad dtype or shape)");
    return XM_ERR_INTERNAL;
  }
  int64_t experts = mark ? t->dims[0] : 1;
  int64_t slice = experts > 0 ? elems * 4 / experts : 0;
  for (int64_t e = 0; e < experts; e++) {
    ck_item_t *it = ck_list_push(l);
    xm_strbuf_t name;
    xm_strbuf_init(&name);
    if (mark) {
      xm_strbuf_append(&name, t->name, (size_t)(mark - t->name));
      xm_strbuf_printf(&name, "%lld%s", (long long)e, mark + 3);
    } else {
      xm_strbuf_puts(&name, t->name);
    }
    it->name = xm_strbuf_take(&name);
    it->tensor = ti;
    it->dtype = t->dtype == XM_RT_I32 ? XM_ST_I32 : XM_ST_F32;
    it->rank = mark ? t->rank - 1 : t->rank;
    for (int d = 0; d < it->rank; d++)
      it->dims[d] = t->dims[d + (mark ? 1 : 0)];
    it->bytes = slice;
    it->offset = t->offset + e * slice;
    it->file = -1;
  }
  return XM_OK;
}

static xm_status_t ck_collect(const xm_rt_program_t *p, bool optimizer, xm_diag_t *diag,
                              ck_list_t *out) {
  memset(out, 0, sizeof *out);
  for (int i = 0; i < p->num_tensors; i++) {
    if (!ck_stored_in(&p->tensors[i], optimizer)) continue;
    xm_status_t s = ck_expand(p, i, diag, out);
    if (s != XM_OK) {
      ck_list_free(out);
      return s;
    }
  }
  return XM_OK;
}

static int ck_cmp_item_name(const void *a, const void *b) {
  return strcmp(((const ck_item_t *)a)->name, ((const ck_item_t *)b)->name);
}

static ck_item_t *ck_find_item(const ck_list_t *l, const char *name) {
  ck_item_t key = {.name = (char *)name};
  return bsearch(&key, l->items, (size_t)l->count, sizeof key, ck_cmp_item_name);
}

static xm_st_entry_t ck_entry(const xm_rt_exec_t *x, const ck_item_t *it) {
  xm_st_entry_t e = {.name = it->name,
                     .dtype = it->dtype,
                     .rank = it->rank,
                     .data = x->persist_host + it->offset};
  memcpy(e.dims, it->dims, sizeof e.dims);
  return e;
}

/* ------------------------------------------------------------------ */
/* files and directories                                                */
/* ------------------------------------------------------------------ */

static char *ck_join(const char *dir, const char *name) {
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  xm_strbuf_printf(&b, "%s/%s", dir, name);
  return xm_strbuf_take(&b);
}

static bool ck_exists(const char *path) {
  struct stat sb;
  return lstat(path, &sb) == 0;
}

static bool ck_is_dir(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static xm_status_t ck_io_error(xm_diag_t *diag, const char *path, const char *what) {
  xm_diag_add(diag, XM_DIAG_ERROR, path, NULL, "%s: %s", what, strerror(errno));
  return XM_ERR_IO;
}

static xm_status_t ck_fsync_dir(const char *path, xm_diag_t *diag) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ck_io_error(diag, path, "cannot open directory");
  int rc = fsync(fd);
  close(fd);
  /* Some file systems cannot sync directories; the data files are synced. */
  if (rc != 0 && errno != EINVAL && errno != ENOTSUP)
    return ck_io_error(diag, path, "cannot sync directory");
  return XM_OK;
}

static xm_status_t ck_write_text(const char *dir, const char *name, const char *text,
                                 xm_diag_t *diag) {
  char *path = ck_join(dir, name);
  xm_status_t s = XM_OK;
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    s = ck_io_error(diag, path, "cannot create");
  } else {
    size_t n = strlen(text), done = 0;
    while (done < n && s == XM_OK) {
      ssize_t w = write(fd, text + done, n - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0)
        s = ck_io_error(diag, path, "write failed");
      else
        done += (size_t)w;
    }
    if (s == XM_OK && fsync(fd) != 0) s = ck_io_error(diag, path, "fsync failed");
    if (close(fd) != 0 && s == XM_OK) s = ck_io_error(diag, path, "close failed");
  }
  free(path);
  return s;
}

static int ck_remove_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  remove(path);
  return 0;
}

static void ck_remove_tree(const char *path) { nftw(path, ck_remove_cb, 16, FTW_DEPTH | FTW_PHYS); }

/* The target split into parent and base, and the names of its siblings. */
typedef struct {
  char *dir; /* the target, without trailing slashes */
  char *parent;
  char *base;
  char *tmp; /* "<dir>.tmp-<pid>" */
  char *old; /* "<dir>.old-<pid>" */
} ck_paths_t;

static void ck_paths_init(const char *dir, ck_paths_t *p) {
  memset(p, 0, sizeof *p);
  size_t n = strlen(dir);
  while (n > 1 && dir[n - 1] == '/')
    n--;
  p->dir = strndup(dir, n);
  XM_ASSERT(p->dir != NULL);
  const char *slash = strrchr(p->dir, '/');
  p->parent = slash ? strndup(p->dir, slash == p->dir ? 1 : (size_t)(slash - p->dir)) : strdup(".");
  p->base = strdup(slash ? slash + 1 : p->dir);
  XM_ASSERT(p->parent && p->base);
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  xm_strbuf_printf(&b, "%s.tmp-%ld", p->dir, (long)getpid());
  p->tmp = xm_strbuf_take(&b);
  xm_strbuf_printf(&b, "%s.old-%ld", p->dir, (long)getpid());
  p->old = xm_strbuf_take(&b);
}

static void ck_paths_free(ck_paths_t *p) {
  free(p->dir), free(p->parent), free(p->base), free(p->tmp), free(p->old);
  memset(p, 0, sizeof *p);
}

/* If `entry` is "<base>.<kind>-<digits>", returns the digits, else NULL. */
static const char *ck_sibling_pid(const char *entry, const char *base, const char *kind) {
  size_t nb = strlen(base), nk = strlen(kind);
  if (strncmp(entry, base, nb) != 0 || entry[nb] != '.' || strncmp(entry + nb + 1, kind, nk) != 0 ||
      entry[nb + 1 + nk] != '-')
    return NULL;
  const char *digits = entry + nb + nk + 2;
  if (!*digits) return NULL;
  for (const char *c = digits; *c; c++)
    if (!isdigit((unsigned char)*c)) return NULL;
  return digits;
}

/* An interrupted swap leaves no "<dir>" but "<dir>.old-P", and then the
 * complete new checkpoint in "<dir>.tmp-P" when it is still there. Sets
 * *out_old / *out_new (owned, NULL when absent) for the first such P. */
static void ck_find_interrupted(const ck_paths_t *p, char **out_old, char **out_new) {
  *out_old = *out_new = NULL;
  DIR *d = opendir(p->parent);
  if (!d) return;
  char *best = NULL;
  for (struct dirent *e; (e = readdir(d));) {
    const char *pid = ck_sibling_pid(e->d_name, p->base, "old");
    if (pid && (!best || strcmp(pid, best) < 0)) {
      free(best);
      best = strdup(pid);
    }
  }
  closedir(d);
  if (!best) return;
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  xm_strbuf_printf(&b, "%s.old-%s", p->dir, best);
  *out_old = xm_strbuf_take(&b);
  xm_strbuf_printf(&b, "%s.tmp-%s", p->dir, best);
  char *tmp = xm_strbuf_take(&b);
  free(best);
  if (ck_is_dir(tmp))
    *out_new = tmp;
  else
    free(tmp);
}

/* Finishes a swap that a crash interrupted, then removes every leftover
 * "<dir>.tmp-N" / "<dir>.old-N". Only the saving rank calls this. */
static xm_status_t ck_recover(const ck_paths_t *p, xm_diag_t *diag) {
  if (!ck_exists(p->dir)) {
    char *old = NULL, *fresh = NULL;
    ck_find_interrupted(p, &old, &fresh);
    const char *keep = fresh ? fresh : old;
    xm_status_t s = XM_OK;
    if (keep && rename(keep, p->dir) != 0)
      s = ck_io_error(diag, keep, "cannot restore the interrupted checkpoint");
    else if (keep)
      s = ck_fsync_dir(p->parent, diag);
    free(old), free(fresh);
    XM_RETURN_IF_ERROR(s);
  }
  DIR *d = opendir(p->parent);
  if (!d) return ck_io_error(diag, p->parent, "cannot read directory");
  xm_strbuf_t victims; /* NUL-separated, removed after the scan */
  xm_strbuf_init(&victims);
  for (struct dirent *e; (e = readdir(d));) {
    if (ck_sibling_pid(e->d_name, p->base, "tmp") || ck_sibling_pid(e->d_name, p->base, "old")) {
      xm_strbuf_printf(&victims, "%s/%s", p->parent, e->d_name);
      xm_strbuf_append(&victims, "", 1);
    }
  }
  closedir(d);
  for (size_t at = 0; at < victims.len; at += strlen(victims.data + at) + 1)
    ck_remove_tree(victims.data + at);
  xm_strbuf_free(&victims);
  return XM_OK;
}

void xm_rt_ckpt_crash_point(const char *point) {
  const char *v = getenv("XM_CKPT_CRASH");
  if (v && strcmp(v, point) == 0) _exit(137); /* as SIGKILL would leave it */
}

static bool ck_exchange_allowed(void) {
  const char *v = getenv("XM_CKPT_RENAME_EXCHANGE"); /* "0": test the two-rename path */
  return !(v && strcmp(v, "0") == 0);
}

/* Puts the complete tmp directory in place of the target. */
static xm_status_t ck_swap(const ck_paths_t *p, xm_diag_t *diag) {
  if (!ck_exists(p->dir)) {
    if (rename(p->tmp, p->dir) != 0) return ck_io_error(diag, p->dir, "cannot rename into place");
    return ck_fsync_dir(p->parent, diag);
  }
  if (ck_exchange_allowed() &&
      renameat2(AT_FDCWD, p->tmp, AT_FDCWD, p->dir, RENAME_EXCHANGE) == 0) {
    XM_RETURN_IF_ERROR(ck_fsync_dir(p->parent, diag));
    xm_rt_ckpt_crash_point("exchanged");
    ck_remove_tree(p->tmp); /* now the previous checkpoint */
    return XM_OK;
  }
  if (rename(p->dir, p->old) != 0) return ck_io_error(diag, p->dir, "cannot move aside");
  xm_rt_ckpt_crash_point("aside");
  /* A crash here leaves old + tmp, both complete: ck_recover and the loader
   * take tmp. */
  if (rename(p->tmp, p->dir) != 0) {
    xm_status_t s = ck_io_error(diag, p->dir, "cannot rename into place");
    rename(p->old, p->dir); /* put the previous checkpoint back */
    return s;
  }
  XM_RETURN_IF_ERROR(ck_fsync_dir(p->parent, diag));
  xm_rt_ckpt_crash_point("placed");
  ck_remove_tree(p->old);
  return XM_OK;
}

/* ------------------------------------------------------------------ */
/* save                                                                 */
/* ------------------------------------------------------------------ */

static xm_status_t ck_shard_limit(xm_diag_t *diag, int64_t *out_bytes) {
  const char *v = getenv("XM_CKPT_SHARD_BYTES");
  *out_bytes = CK_DEFAULT_SHARD_BYTES;
  if (!v) return XM_OK;
  char *end = NULL;
  errno = 0;
  long long n = strtoll(v, &end, 10);
  if (errno || end == v || *end || n <= 0) {
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, "XM_CKPT_SHARD_BYTES",
                "must be a positive number of bytes, got \"%s\"", v);
    return XM_ERR_INVALID_INPUT;
  }
  *out_bytes = n;
  return XM_OK;
}

static xm_status_t ck_write_items(const xm_rt_exec_t *x, const char *path, const ck_list_t *l,
                                  const int *shard, int which, xm_diag_t *diag) {
  xm_st_entry_t *entries = malloc((size_t)(l->count > 0 ? l->count : 1) * sizeof *entries);
  if (!entries) return XM_ERR_NO_MEMORY;
  int n = 0;
  for (int i = 0; i < l->count; i++)
    if (!shard || shard[i] == which) entries[n++] = ck_entry(x, &l->items[i]);
  xm_status_t s = xm_st_write(path, entries, n, NULL, 0, diag);
  free(entries);
  return s;
}

static char *ck_shard_name(int k, int n) {
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  xm_strbuf_printf(&b, "model-%05d-of-%05d.safetensors", k + 1, n);
  return xm_strbuf_take(&b);
}

static xm_status_t ck_write_index(const char *dir, const ck_list_t *l, const int *shard,
                                  int nshards, int64_t total, xm_diag_t *diag) {
  ck_item_t *sorted = malloc((size_t)(l->count > 0 ? l->count : 1) * sizeof *sorted);
  XM_ASSERT(sorted != NULL);
  memcpy(sorted, l->items, (size_t)l->count * sizeof *sorted);
  for (int i = 0; i < l->count; i++)
    sorted[i].file = shard[i];
  qsort(sorted, (size_t)l->count, sizeof *sorted, ck_cmp_item_name);
  cJSON *root = cJSON_CreateObject();
  cJSON *md = cJSON_AddObjectToObject(root, "metadata");
  cJSON_AddNumberToObject(md, "total_size", (double)total);
  cJSON *map = cJSON_AddObjectToObject(root, "weight_map");
  for (int i = 0; i < l->count; i++) {
    char *file = ck_shard_name(sorted[i].file, nshards);
    cJSON_AddStringToObject(map, sorted[i].name, file);
    free(file);
  }
  char *text = cJSON_Print(root);
  cJSON_Delete(root);
  free(sorted);
  if (!text) return XM_ERR_NO_MEMORY;
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  xm_strbuf_printf(&b, "%s\n", text);
  free(text);
  xm_status_t s = ck_write_text(dir, CK_INDEX_FILE, b.data, diag);
  xm_strbuf_free(&b);
  return s;
}

/* Shards in table order (layers stay together, as in HF's own splitter): a
 * new shard starts when the next tensor would push the current one past the
 * limit; a tensor larger than the limit gets a shard of its own. */
static xm_status_t ck_save_model(const xm_rt_exec_t *x, const char *dir, const ck_list_t *l,
                                 xm_diag_t *diag) {
  int64_t limit;
  XM_RETURN_IF_ERROR(ck_shard_limit(diag, &limit));
  int *shard = calloc((size_t)(l->count > 0 ? l->count : 1), sizeof *shard);
  XM_ASSERT(shard != NULL);
  int nshards = l->count > 0 ? 1 : 0;
  int64_t cur = 0, total = 0;
  for (int i = 0; i < l->count; i++) {
    int64_t b = l->items[i].bytes;
    if (cur > 0 && cur + b > limit) {
      nshards++;
      cur = 0;
    }
    cur += b;
    total += b;
    shard[i] = nshards - 1;
  }
  xm_status_t s = XM_OK;
  if (nshards <= 1) {
    char *path = ck_join(dir, CK_MODEL_FILE);
    s = ck_write_items(x, path, l, NULL, 0, diag);
    free(path);
  } else {
    for (int k = 0; k < nshards && s == XM_OK; k++) {
      char *name = ck_shard_name(k, nshards);
      char *path = ck_join(dir, name);
      s = ck_write_items(x, path, l, shard, k, diag);
      free(path);
      free(name);
    }
    if (s == XM_OK) s = ck_write_index(dir, l, shard, nshards, total, diag);
  }
  free(shard);
  return s;
}

static const char *ck_schedule_name(int s) {
  return s == 0 ? "cosine" : s == 1 ? "constant" : s == 2 ? "linear" : "unknown";
}

static char *ck_u64_str(uint64_t v) {
  char buf[32];
  snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
  return strdup(buf);
}

static void ck_add_u64_string(cJSON *obj, const char *key, uint64_t v) {
  char *s = ck_u64_str(v);
  cJSON_AddStringToObject(obj, key, s);
  free(s);
}

/* Settings go in twice: the program's (spec) values and the optimizer
 * values in force in the exec (out/train flags may override them). */
static void ck_add_settings(cJSON *root, const xm_rt_exec_t *x) {
  const xm_rt_program_t *p = x->program;
  cJSON *set = cJSON_AddObjectToObject(root, "settings");
  cJSON_AddNumberToObject(set, "lr", p->lr);
  cJSON_AddNumberToObject(set, "min_lr", p->min_lr);
  cJSON_AddNumberToObject(set, "weight_decay", p->weight_decay);
  cJSON_AddNumberToObject(set, "beta1", p->beta1);
  cJSON_AddNumberToObject(set, "beta2", p->beta2);
  cJSON_AddNumberToObject(set, "adam_eps", p->adam_eps);
  cJSON_AddNumberToObject(set, "grad_clip", p->grad_clip);
  cJSON_AddNumberToObject(set, "warmup_steps", (double)p->warmup_steps);
  cJSON_AddNumberToObject(set, "train_steps", (double)p->train_steps);
  cJSON_AddStringToObject(set, "lr_schedule", ck_schedule_name(p->lr_schedule));
  ck_add_u64_string(set, "seed", p->seed);
  cJSON_AddNumberToObject(set, "vocab", (double)p->vocab);
  cJSON_AddNumberToObject(set, "seq_len", (double)p->seq_len);
  cJSON_AddNumberToObject(set, "micro_batch", (double)p->micro_batch);
  cJSON_AddNumberToObject(set, "grad_accum", (double)p->grad_accum);
  cJSON *now = cJSON_AddObjectToObject(root, "in_force");
  cJSON_AddNumberToObject(now, "lr", x->lr);
  cJSON_AddNumberToObject(now, "weight_decay", x->weight_decay);
  cJSON_AddNumberToObject(now, "beta1", x->beta1);
  cJSON_AddNumberToObject(now, "beta2", x->beta2);
  cJSON_AddNumberToObject(now, "adam_eps", x->adam_eps);
  cJSON_AddNumberToObject(now, "grad_clip", x->grad_clip);
}

static char *ck_trainer_state_text(const xm_rt_exec_t *x, const xm_rt_train_state_t *st) {
  const xm_rt_program_t *p = x->program;
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "format", "xmoec-trainer-state");
  cJSON_AddNumberToObject(root, "version", CK_STATE_VERSION);
  cJSON_AddStringToObject(root, "model_name", p->model_name ? p->model_name : "");
  cJSON_AddNumberToObject(root, "step", (double)st->step);
  cJSON_AddNumberToObject(root, "data_pos", (double)st->data_pos);
  cJSON *rng = cJSON_AddArrayToObject(root, "rng");
  for (int i = 0; i < 4; i++) {
    char *s = ck_u64_str(st->rng[i]);
    cJSON_AddItemToArray(rng, cJSON_CreateString(s));
    free(s);
  }
  if (isfinite(st->last_loss))
    cJSON_AddNumberToObject(root, "last_loss", st->last_loss);
  else
    cJSON_AddNullToObject(root, "last_loss"); /* JSON has no NaN */
  ck_add_settings(root, x);
  char *text = cJSON_Print(root);
  cJSON_Delete(root);
  XM_ASSERT(text != NULL);
  size_t n = strlen(text);
  char *out = malloc(n + 2);
  XM_ASSERT(out != NULL);
  memcpy(out, text, n);
  memcpy(out + n, "\n", 2);
  free(text);
  return out;
}

/* Every file of the checkpoint into `dir` (the temporary directory). */
static xm_status_t ck_write_all(const xm_rt_exec_t *x, const char *dir,
                                const xm_rt_train_state_t *st, bool with_optimizer,
                                xm_diag_t *diag) {
  const xm_rt_program_t *p = x->program;
  ck_list_t l;
  XM_RETURN_IF_ERROR(ck_collect(p, false, diag, &l));
  xm_status_t s = ck_save_model(x, dir, &l, diag);
  ck_list_free(&l);
  XM_RETURN_IF_ERROR(s);
  xm_rt_ckpt_crash_point("model-written");
  if (with_optimizer) {
    XM_RETURN_IF_ERROR(ck_collect(p, true, diag, &l));
    char *path = ck_join(dir, CK_OPTIM_FILE);
    s = ck_write_items(x, path, &l, NULL, 0, diag);
    free(path);
    ck_list_free(&l);
    XM_RETURN_IF_ERROR(s);
  }
  XM_RETURN_IF_ERROR(
      ck_write_text(dir, "config.json", p->config_json ? p->config_json : "{}\n", diag));
  if (p->spec_json) XM_RETURN_IF_ERROR(ck_write_text(dir, "spec.json", p->spec_json, diag));
  char *text = ck_trainer_state_text(x, st);
  s = ck_write_text(dir, CK_STATE_FILE, text, diag);
  free(text);
  XM_RETURN_IF_ERROR(s);
  return ck_fsync_dir(dir, diag);
}

xm_status_t xm_rt_checkpoint_save(const xm_rt_exec_t *x, const char *dir,
                                  const xm_rt_train_state_t *st, bool with_optimizer,
                                  xm_diag_t *diag) {
  /* The caller's exec holds whole tensors: for a sharded program it is the
   * full view runtime/io/shard_io.c gathered on rank 0. */
  if (x->ctx && x->ctx->rank != 0) return XM_OK;
  xm_rt_train_state_t zero = {0};
  if (!st) st = &zero;
  ck_paths_t p;
  ck_paths_init(dir, &p);
  xm_status_t s = ck_recover(&p, diag);
  if (s == XM_OK && mkdir(p.tmp, 0755) != 0) s = ck_io_error(diag, p.tmp, "cannot create");
  if (s == XM_OK) {
    s = ck_write_all(x, p.tmp, st, with_optimizer, diag);
    if (s == XM_OK) xm_rt_ckpt_crash_point("written");
    if (s == XM_OK) s = ck_swap(&p, diag);
    if (s != XM_OK) ck_remove_tree(p.tmp);
  }
  ck_paths_free(&p);
  return s;
}

/* ------------------------------------------------------------------ */
/* load                                                                 */
/* ------------------------------------------------------------------ */

typedef struct {
  char *name; /* owned; file name inside the checkpoint */
  char *path; /* owned */
  xm_st_file_t st;
} ck_file_t;

typedef struct {
  ck_file_t *files; /* owned */
  int count;
  char *index; /* owned; the index path when the weights are sharded */
} ck_files_t;

static void ck_files_free(ck_files_t *fs) {
  for (int i = 0; i < fs->count; i++) {
    xm_st_close(&fs->files[i].st);
    free(fs->files[i].name);
    free(fs->files[i].path);
  }
  free(fs->files);
  free(fs->index);
  memset(fs, 0, sizeof *fs);
}

/* Index of file `name`, added (unopened) when new. */
static int ck_files_add(ck_files_t *fs, const char *dir, const char *name) {
  for (int i = 0; i < fs->count; i++)
    if (strcmp(fs->files[i].name, name) == 0) return i;
  ck_file_t *p = realloc(fs->files, (size_t)(fs->count + 1) * sizeof *p);
  XM_ASSERT(p != NULL);
  fs->files = p;
  ck_file_t *f = &fs->files[fs->count];
  memset(f, 0, sizeof *f);
  f->name = strdup(name);
  f->path = ck_join(dir, name);
  XM_ASSERT(f->name != NULL);
  return fs->count++;
}

/* How a load reads the weight files. --resume reads exactly what out/train
 * wrote: F32 tensors, nothing else. --init-from (import) also takes BF16
 * and F16 weights (converted to the f32 master weights), ignores the RoPE
 * buffers old transformers checkpoints store, and accepts the copies of
 * the shared embedding and head that DeepSeek-V3's checkpoints keep in
 * each multi-token-prediction layer (checked to be copies). */
typedef struct {
  bool import;
  int64_t mtp_first, mtp_count; /* the MTP layers' indices [first, first + count) */
  const char *head;             /* the shared head: lm_head.weight, or the embedding */
} ck_load_t;

static const ck_load_t k_exact = {0};

/* The shared tensor that `name` is an MTP layer's stored copy of, or NULL:
 * model.layers.<L+k>.embed_tokens.weight and .shared_head.head.weight. */
static const char *ck_copy_of(const ck_load_t *o, const char *name) {
  static const char head[] = "model.layers.";
  if (!o->import || o->mtp_count <= 0 || strncmp(name, head, sizeof head - 1) != 0) return NULL;
  const char *p = name + sizeof head - 1;
  char *end = NULL;
  if (!isdigit((unsigned char)*p)) return NULL;
  errno = 0;
  long long layer = strtoll(p, &end, 10);
  if (errno || *end != '.' || layer < o->mtp_first || layer >= o->mtp_first + o->mtp_count)
    return NULL;
  if (strcmp(end, ".embed_tokens.weight") == 0) return "model.embed_tokens.weight";
  if (strcmp(end, ".shared_head.head.weight") == 0) return o->head;
  return NULL;
}

/* transformers recomputes these non-persistent RoPE buffers; checkpoints
 * of older versions store them. */
static bool ck_is_rope_buffer(const ck_load_t *o, const char *name) {
  static const char tail[] = ".rotary_emb.inv_freq";
  size_t n = strlen(name), k = sizeof tail - 1;
  return o->import && n > k && strcmp(name + n - k, tail) == 0;
}

/* The dtypes a load takes for an item of dtype `want`. */
static bool ck_dtype_ok(const ck_load_t *o, xm_st_dtype_t got, xm_st_dtype_t want) {
  if (got == want) return true;
  return o->import && want == XM_ST_F32 && (got == XM_ST_BF16 || got == XM_ST_F16);
}

/* IEEE binary16 to float, subnormals, infinities and NaNs included. */
static float ck_half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else { /* subnormal: normalise */
    int e = -1;
    do {
      man <<= 1;
      e++;
    } while (!(man & 0x400u));
    bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* Element i of a stored tensor as a float (F32, BF16 or F16). */
static float ck_element(const xm_st_tensor_t *t, int64_t i) {
  if (t->dtype == XM_ST_F32) {
    float f;
    memcpy(&f, t->data + 4 * i, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, t->data + 2 * i, 2);
  if (t->dtype == XM_ST_F16) return ck_half_to_float(h);
  uint32_t bits = (uint32_t)h << 16; /* BF16 is the top half of an f32 */
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* A weight-map value must name a file inside the checkpoint directory. */
static bool ck_plain_file_name(const char *s) {
  return s[0] && s[0] != '.' && !strchr(s, '/') && !strchr(s, '\\');
}

static xm_status_t ck_read_index(const char *dir, const ck_load_t *o, ck_list_t *l, ck_files_t *fs,
                                 xm_diag_t *diag) {
  char *path = ck_join(dir, CK_INDEX_FILE);
  char *text = NULL;
  size_t len = 0;
  int err = xm_read_file(path, &text, &len);
  if (err) {
    char why[160];
    xm_diag_add(diag, XM_DIAG_ERROR, path, NULL, "cannot read: %s",
                xm_read_error(err, XM_READ_LIMIT_TEXT, why, sizeof why));
    free(path);
    return XM_ERR_IO;
  }
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
  const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
  int errors = xm_diag_error_count(diag);
  if (!root) {
    char place[48];
    snprintf(place, sizeof place, "offset %lld", (long long)(end ? end - text : 0));
    xm_diag_add(diag, XM_DIAG_ERROR, path, place, "invalid JSON");
  } else if (!cJSON_IsObject(map)) {
    xm_diag_add(diag, XM_DIAG_ERROR, path, "/weight_map", "missing or not an object");
  } else {
    for (const cJSON *e = map->child; e; e = e->next) {
      xm_strbuf_t ptr;
      xm_strbuf_init(&ptr);
      xm_strbuf_printf(&ptr, "/weight_map/%s", e->string);
      ck_item_t *it = ck_find_item(l, e->string);
      if (!cJSON_IsString(e) || !ck_plain_file_name(e->valuestring))
        xm_diag_add(diag, XM_DIAG_ERROR, path, ptr.data, "must name a file of the checkpoint");
      else if (!it && (ck_copy_of(o, e->string) || ck_is_rope_buffer(o, e->string)))
        ck_files_add(fs, dir, e->valuestring); /* checked with the file's tensors */
      else if (!it)
        xm_diag_add(diag, XM_DIAG_ERROR, path, ptr.data,
                    "unexpected tensor \"%s\": the program has no such parameter", e->string);
      else
        it->file = ck_files_add(fs, dir, e->valuestring);
      xm_strbuf_free(&ptr);
    }
  }
  cJSON_Delete(root);
  free(text);
  free(path);
  return xm_diag_error_count(diag) == errors ? XM_OK : XM_ERR_INVALID_INPUT;
}

static void ck_shape_str(xm_strbuf_t *b, int rank, const int64_t *dims) {
  xm_strbuf_puts(b, "[");
  for (int d = 0; d < rank; d++)
    xm_strbuf_printf(b, "%s%lld", d ? ", " : "", (long long)dims[d]);
  xm_strbuf_puts(b, "]");
}

static void ck_check_item(const ck_item_t *it, const ck_load_t *o, const ck_files_t *fs,
                          xm_diag_t *diag) {
  if (it->file < 0) {
    xm_diag_add(diag, XM_DIAG_ERROR, fs->index, it->name,
                "missing tensor \"%s\" (not in the weight map)", it->name);
    return;
  }
  const ck_file_t *f = &fs->files[it->file];
  const xm_st_tensor_t *t = xm_st_find(&f->st, it->name);
  if (!t) {
    xm_diag_add(diag, XM_DIAG_ERROR, f->path, it->name, "missing tensor \"%s\"", it->name);
    return;
  }
  if (!ck_dtype_ok(o, t->dtype, it->dtype) && o->import)
    xm_diag_add(diag, XM_DIAG_ERROR, f->path, it->name,
                "tensor \"%s\" has dtype %s, which --init-from does not read (F32, BF16 or "
                "F16, converted to the f32 master weights)",
                it->name, xm_st_dtype_name(t->dtype));
  else if (!ck_dtype_ok(o, t->dtype, it->dtype))
    xm_diag_add(diag, XM_DIAG_ERROR, f->path, it->name,
                "tensor \"%s\" has dtype %s, the program expects %s", it->name,
                xm_st_dtype_name(t->dtype), xm_st_dtype_name(it->dtype));
  if (t->rank != it->rank || memcmp(t->dims, it->dims, (size_t)it->rank * sizeof(int64_t))) {
    xm_strbuf_t a, b;
    xm_strbuf_init(&a);
    xm_strbuf_init(&b);
    ck_shape_str(&a, t->rank, t->dims);
    ck_shape_str(&b, it->rank, it->dims);
    xm_diag_add(diag, XM_DIAG_ERROR, f->path, it->name,
                "tensor \"%s\" has shape %s, the program expects %s", it->name, a.data, b.data);
    xm_strbuf_free(&a);
    xm_strbuf_free(&b);
  }
}

/* Opens every file and checks every item and every stored tensor. */
/* An MTP layer's copy of a shared tensor must be one: same shape, same
 * values (whatever the two dtypes), since xmoec's MTP layers share them. */
static void ck_check_copy(const ck_file_t *f, const xm_st_tensor_t *t, const char *of,
                          const ck_list_t *l, const ck_files_t *fs, xm_diag_t *diag) {
  const ck_item_t *it = ck_find_item(l, of);
  const xm_st_tensor_t *m =
      it && it->file >= 0 ? xm_st_find(&fs->files[it->file].st, it->name) : NULL;
  if (!m) return; /* the shared tensor's own absence is reported */
  if (t->rank != m->rank || memcmp(t->dims, m->dims, (size_t)t->rank * sizeof(int64_t)) ||
      (t->dtype != XM_ST_F32 && t->dtype != XM_ST_BF16 && t->dtype != XM_ST_F16)) {
    xm_diag_add(diag, XM_DIAG_ERROR, f->path, t->name,
                "tensor \"%s\" (a multi-token-prediction layer's copy of \"%s\") has another "
                "shape or dtype %s",
                t->name, of, xm_st_dtype_name(t->dtype));
    return;
  }
  if (m->dtype != XM_ST_F32 && m->dtype != XM_ST_BF16 && m->dtype != XM_ST_F16) return;
  int64_t n = 1;
  for (int d = 0; d < m->rank; d++)
    n *= m->dims[d];
  for (int64_t e = 0; e < n; e++) {
    float a = ck_element(t, e), b = ck_element(m, e);
    if (a != b && !(a != a && b != b)) {
      xm_diag_add(diag, XM_DIAG_ERROR, f->path, t->name,
                  "tensor \"%s\" should be a copy of \"%s\" (xmoec's multi-token prediction "
                  "shares the embedding and the head) but differs at element %lld",
                  t->name, of, (long long)e);
      return;
    }
  }
}

static xm_status_t ck_match(const ck_load_t *o, ck_list_t *l, ck_files_t *fs, xm_diag_t *diag) {
  int errors = xm_diag_error_count(diag);
  xm_status_t worst = XM_OK;
  for (int i = 0; i < fs->count; i++) {
    xm_status_t s = xm_st_open(fs->files[i].path, diag, &fs->files[i].st);
    if (s != XM_OK) worst = s == XM_ERR_IO ? XM_ERR_INVALID_INPUT : s;
  }
  if (worst != XM_OK) return worst;
  for (int i = 0; i < l->count; i++)
    ck_check_item(&l->items[i], o, fs, diag);
  int64_t buffers = 0;
  for (int k = 0; k < fs->count; k++) {
    const ck_file_t *f = &fs->files[k];
    for (int j = 0; j < f->st.num_tensors; j++) {
      const char *name = f->st.tensors[j].name;
      const ck_item_t *it = ck_find_item(l, name);
      const char *of = it ? NULL : ck_copy_of(o, name);
      if (of)
        ck_check_copy(f, &f->st.tensors[j], of, l, fs, diag);
      else if (!it && ck_is_rope_buffer(o, name))
        buffers++;
      else if (!it)
        xm_diag_add(diag, XM_DIAG_ERROR, f->path, name,
                    "unexpected tensor \"%s\": the program has no such tensor", name);
      else if (it->file != k)
        xm_diag_add(diag, XM_DIAG_ERROR, f->path, name,
                    "tensor \"%s\" is stored here but the index maps it to another file", name);
    }
  }
  if (buffers)
    xm_diag_add(diag, XM_DIAG_WARNING, fs->index ? fs->index : fs->files[0].path, NULL,
                "ignored %lld RoPE buffers (*.rotary_emb.inv_freq): transformers recomputes them "
                "and so does xmoec",
                (long long)buffers);
  /* Values: a NaN or an infinity in a weight or a moment would only show
   * as a divergence steps later; it is named here, at load. */
  for (int i = 0; i < l->count && xm_diag_error_count(diag) == errors; i++) {
    const ck_item_t *it = &l->items[i];
    const ck_file_t *f = &fs->files[it->file];
    const xm_st_tensor_t *t = xm_st_find(&f->st, it->name);
    if (!t) continue;
    int64_t n = (int64_t)(t->end - t->begin), bad = -1;
    if (t->dtype == XM_ST_F32) {
      for (int64_t e = 0; e < n / 4 && bad < 0; e++) {
        float v;
        memcpy(&v, t->data + 4 * e, 4);
        if (!isfinite(v)) bad = e;
      }
    } else if (t->dtype == XM_ST_BF16 || t->dtype == XM_ST_F16) {
      uint16_t mask = t->dtype == XM_ST_BF16 ? 0x7f80 : 0x7c00; /* all exponent bits set */
      for (int64_t e = 0; e < n / 2 && bad < 0; e++) {
        uint16_t v;
        memcpy(&v, t->data + 2 * e, 2);
        if ((v & mask) == mask) bad = e;
      }
    }
    if (bad >= 0)
      xm_diag_add(diag, XM_DIAG_ERROR, f->path, it->name,
                  "tensor \"%s\" holds a NaN or an infinity (element %lld): the checkpoint "
                  "cannot be trained from (it diverged before it was saved, or the file was "
                  "damaged)",
                  it->name, (long long)bad);
  }
  return xm_diag_error_count(diag) == errors ? XM_OK : XM_ERR_INVALID_INPUT;
}

/* A matched group of stored tensors and the files that hold them; copied
 * into the arena only once every group of the checkpoint has matched. */
typedef struct {
  ck_list_t items;
  ck_files_t files;
} ck_group_t;

static void ck_group_free(ck_group_t *g) {
  ck_files_free(&g->files);
  ck_list_free(&g->items);
}

/* Copies every matched tensor into the arena, BF16 and F16 (imports)
 * converted to F32 on the way. */
static void ck_group_copy(xm_rt_exec_t *x, const ck_group_t *g) {
  for (int i = 0; i < g->items.count; i++) {
    const ck_item_t *it = &g->items.items[i];
    const xm_st_tensor_t *t = xm_st_find(&g->files.files[it->file].st, it->name);
    unsigned char *dst = x->persist_host + it->offset;
    if (t->dtype == it->dtype) {
      if (it->bytes) memcpy(dst, t->data, (size_t)it->bytes);
      continue;
    }
    for (int64_t e = 0; e < it->bytes / 4; e++) {
      float v = ck_element(t, e);
      memcpy(dst + 4 * e, &v, 4);
    }
  }
}

static xm_status_t ck_sorted_items(const xm_rt_program_t *p, bool optimizer, xm_diag_t *diag,
                                   ck_list_t *out) {
  XM_RETURN_IF_ERROR(ck_collect(p, optimizer, diag, out));
  qsort(out->items, (size_t)out->count, sizeof *out->items, ck_cmp_item_name);
  for (int i = 1; i < out->count; i++) {
    if (strcmp(out->items[i].name, out->items[i - 1].name) == 0) {
      xm_diag_add(diag, XM_DIAG_ERROR, NULL, out->items[i].name,
                  "the program table names two tensors alike");
      ck_list_free(out);
      return XM_ERR_INTERNAL;
    }
  }
  return XM_OK;
}

static xm_status_t ck_match_model(const xm_rt_program_t *p, const char *dir, const ck_load_t *o,
                                  xm_diag_t *diag, ck_group_t *g) {
  XM_RETURN_IF_ERROR(ck_sorted_items(p, false, diag, &g->items));
  char *index = ck_join(dir, CK_INDEX_FILE);
  char *single = ck_join(dir, CK_MODEL_FILE);
  xm_status_t s = XM_OK;
  if (ck_exists(index)) {
    g->files.index = strdup(index);
    s = ck_read_index(dir, o, &g->items, &g->files, diag);
  } else if (ck_exists(single)) {
    int f = ck_files_add(&g->files, dir, CK_MODEL_FILE);
    for (int i = 0; i < g->items.count; i++)
      g->items.items[i].file = f;
  } else {
    xm_diag_add(diag, XM_DIAG_ERROR, dir, NULL, "no %s or %s in the checkpoint", CK_MODEL_FILE,
                CK_INDEX_FILE);
    s = XM_ERR_INVALID_INPUT;
  }
  if (s == XM_OK) s = ck_match(o, &g->items, &g->files, diag);
  free(index);
  free(single);
  return s;
}

static xm_status_t ck_match_optimizer(const xm_rt_program_t *p, const char *dir, xm_diag_t *diag,
                                      ck_group_t *g) {
  XM_RETURN_IF_ERROR(ck_sorted_items(p, true, diag, &g->items));
  int f = ck_files_add(&g->files, dir, CK_OPTIM_FILE);
  for (int i = 0; i < g->items.count; i++)
    g->items.items[i].file = f;
  if (!ck_exists(g->files.files[f].path)) {
    xm_diag_add(diag, XM_DIAG_ERROR, g->files.files[f].path, NULL,
                "the optimizer state was asked for but the checkpoint has none");
    return XM_ERR_INVALID_INPUT;
  }
  return ck_match(&k_exact, &g->items, &g->files, diag);
}

/* Zeroes the persistent tensors of one category (grads always start a
 * step at zero; optimizer states when they are not loaded). */
static void ck_zero_category(xm_rt_exec_t *x, int category) {
  const xm_rt_program_t *p = x->program;
  for (int i = 0; i < p->num_tensors; i++) {
    const xm_rt_tensor_t *t = &p->tensors[i];
    if (t->persistent && t->category == category && t->bytes > 0)
      memset(x->persist_host + t->offset, 0, (size_t)t->bytes);
  }
}

/* ---- trainer_state.json ---- */

static bool ck_json_count(const cJSON *j, int64_t *out) {
  if (!cJSON_IsNumber(j)) return false;
  double v = j->valuedouble;
  if (!(v >= 0 && v < 9007199254740992.0) || v != floor(v)) return false;
  *out = (int64_t)v;
  return true;
}

static bool ck_parse_u64(const char *s, uint64_t *out) {
  if (!*s || strlen(s) > 20) return false;
  uint64_t v = 0;
  for (const char *c = s; *c; c++) {
    if (!isdigit((unsigned char)*c)) return false;
    if (__builtin_mul_overflow(v, 10u, &v) || __builtin_add_overflow(v, (uint64_t)(*c - '0'), &v))
      return false;
  }
  *out = v;
  return true;
}

/* The settings the trainer state records (the spec's, at save time)
 * against the program's: a different seq_len or vocab would make the data
 * position count other windows and the embedding another vocabulary (an
 * error); the rest may change between runs (a new schedule, a new batch
 * size), and each change is said once (a warning). */
static void ck_check_settings(const cJSON *set, const char *path, const xm_rt_program_t *p,
                              xm_diag_t *diag) {
  if (!set) return; /* written before settings were recorded */
  if (!cJSON_IsObject(set)) {
    xm_diag_add(diag, XM_DIAG_ERROR, path, "/settings", "must be an object");
    return;
  }
  const struct {
    const char *key;
    double program;
    bool fatal;
    const char *why;
  } rows[] = {
      {"vocab", (double)p->vocab, true, "the embedding and the data's token ids"},
      {"seq_len", (double)p->seq_len, true,
       "data_pos counts windows of seq_len tokens; recompile with the checkpoint's seq_len to "
       "resume"},
      {"micro_batch", (double)p->micro_batch, false, "sequences per micro-batch"},
      {"grad_accum", (double)p->grad_accum, false, "micro-batches per step"},
      {"lr", p->lr, false, "peak learning rate"},
      {"min_lr", p->min_lr, false, "final learning rate"},
      {"warmup_steps", (double)p->warmup_steps, false, "warmup"},
      {"train_steps", (double)p->train_steps, false, "the schedule's length"},
      {"weight_decay", p->weight_decay, false, "AdamW decay"},
      {"beta1", p->beta1, false, "AdamW beta1"},
      {"beta2", p->beta2, false, "AdamW beta2"},
      {"adam_eps", p->adam_eps, false, "AdamW epsilon"},
      {"grad_clip", p->grad_clip, false, "gradient clipping"},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(set, rows[i].key);
    char place[48];
    snprintf(place, sizeof place, "/settings/%s", rows[i].key);
    if (!v) continue;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
      xm_diag_add(diag, XM_DIAG_ERROR, path, place, "must be a number");
    } else if ((float)v->valuedouble != (float)rows[i].program) {
      xm_diag_add(diag, rows[i].fatal ? XM_DIAG_ERROR : XM_DIAG_WARNING, path, place,
                  "the checkpoint was trained with %.9g, the program is compiled with %.9g "
                  "(%s)%s",
                  v->valuedouble, rows[i].program, rows[i].why,
                  rows[i].fatal ? "" : "; the run goes on with the program's value");
    }
  }
  const cJSON *sched = cJSON_GetObjectItemCaseSensitive(set, "lr_schedule");
  if (cJSON_IsString(sched) && strcmp(sched->valuestring, ck_schedule_name(p->lr_schedule)) != 0)
    xm_diag_add(diag, XM_DIAG_WARNING, path, "/settings/lr_schedule",
                "the checkpoint was trained with the %s schedule, the program is compiled with "
                "%s; the run goes on with the program's",
                sched->valuestring, ck_schedule_name(p->lr_schedule));
}

static void ck_parse_state(const cJSON *root, const char *path, const xm_rt_program_t *p,
                           xm_rt_train_state_t *st, xm_diag_t *diag) {
  if (!cJSON_IsObject(root)) {
    xm_diag_add(diag, XM_DIAG_ERROR, path, "", "must be a JSON object");
    return;
  }
  const cJSON *format = cJSON_GetObjectItemCaseSensitive(root, "format");
  const cJSON *version = cJSON_GetObjectItemCaseSensitive(root, "version");
  int64_t ver = 0;
  if (!cJSON_IsString(format) || strcmp(format->valuestring, "xmoec-trainer-state") != 0) {
    xm_diag_add(diag, XM_DIAG_ERROR, path, "/format",
                "must be \"xmoec-trainer-state\" (the trainer state out/train writes), not %s",
                cJSON_IsString(format) ? format->valuestring : format ? "a non-string" : "missing");
    return;
  }
  if (!ck_json_count(version, &ver) || ver < 1) {
    xm_diag_add(diag, XM_DIAG_ERROR, path, "/version", "must be a positive integer");
    return;
  }
  if (ver > CK_STATE_VERSION) {
    xm_diag_add(diag, XM_DIAG_ERROR, path, "/version",
                "is %lld, written by a newer xmoec; this one reads version %d (resume with the "
                "xmoec that wrote it)",
                (long long)ver, CK_STATE_VERSION);
    return;
  }
  const cJSON *name = cJSON_GetObjectItemCaseSensitive(root, "model_name");
  if (cJSON_IsString(name) && p->model_name && strcmp(name->valuestring, p->model_name) != 0)
    xm_diag_add(diag, XM_DIAG_WARNING, path, "/model_name",
                "the checkpoint is of model '%s', the program of '%s' (their config.json "
                "agree, so it loads)",
                name->valuestring, p->model_name);
  ck_check_settings(cJSON_GetObjectItemCaseSensitive(root, "settings"), path, p, diag);
  if (!ck_json_count(cJSON_GetObjectItemCaseSensitive(root, "step"), &st->step))
    xm_diag_add(diag, XM_DIAG_ERROR, path, "/step", "must be a non-negative integer");
  if (!ck_json_count(cJSON_GetObjectItemCaseSensitive(root, "data_pos"), &st->data_pos))
    xm_diag_add(diag, XM_DIAG_ERROR, path, "/data_pos", "must be a non-negative integer");
  const cJSON *rng = cJSON_GetObjectItemCaseSensitive(root, "rng");
  if (!cJSON_IsArray(rng) || cJSON_GetArraySize(rng) != 4) {
    xm_diag_add(diag, XM_DIAG_ERROR, path, "/rng", "must be an array of 4 decimal strings");
  } else {
    int i = 0;
    for (const cJSON *e = rng->child; e; e = e->next, i++) {
      if (!cJSON_IsString(e) || !ck_parse_u64(e->valuestring, &st->rng[i])) {
        char place[16];
        snprintf(place, sizeof place, "/rng/%d", i);
        xm_diag_add(diag, XM_DIAG_ERROR, path, place, "must be a decimal unsigned 64-bit string");
      }
    }
  }
  const cJSON *loss = cJSON_GetObjectItemCaseSensitive(root, "last_loss");
  if (cJSON_IsNumber(loss))
    st->last_loss = loss->valuedouble;
  else if (!loss || cJSON_IsNull(loss))
    st->last_loss = loss ? NAN : 0.0;
  else
    xm_diag_add(diag, XM_DIAG_ERROR, path, "/last_loss", "must be a number or null");
}

static xm_status_t ck_load_state(const char *dir, const xm_rt_program_t *p,
                                 xm_rt_train_state_t *st, xm_diag_t *diag) {
  char *path = ck_join(dir, CK_STATE_FILE);
  char *text = NULL;
  size_t len = 0;
  int err = xm_read_file(path, &text, &len);
  xm_status_t s = XM_OK;
  if (err == ENOENT) {
    /* An exported model without training state: start from zero. */
  } else if (err) {
    char why[160];
    xm_diag_add(diag, XM_DIAG_ERROR, path, NULL, "cannot read: %s",
                xm_read_error(err, XM_READ_LIMIT_TEXT, why, sizeof why));
    s = XM_ERR_IO;
  } else {
    const char *end = NULL;
    cJSON *root = strlen(text) == len ? cJSON_ParseWithOpts(text, &end, 1) : NULL;
    int errors = xm_diag_error_count(diag);
    if (!root) {
      char place[48];
      snprintf(place, sizeof place, "offset %lld",
               (long long)(end ? end - text : (long long)strlen(text)));
      xm_diag_add(diag, XM_DIAG_ERROR, path, place, "invalid JSON");
    } else {
      ck_parse_state(root, path, p, st, diag);
    }
    cJSON_Delete(root);
    if (xm_diag_error_count(diag) != errors) s = XM_ERR_INVALID_INPUT;
  }
  free(text);
  free(path);
  return s;
}

/* ---- config.json ---- */

/* The checkpoint's config.json against the program's, exactly: every
 * field the same (the model's semantics: a rope_theta, an eps or a routing
 * rule that differ would not show in the tensors' shapes), except the name
 * and torch_dtype (the tensors' own dtypes are checked one by one).
 * Returns the number of differing fields. */
static int ck_config_exact(const cJSON *mine, const cJSON *theirs, const char *path,
                           xm_diag_t *diag) {
  int shown = 0, differ = 0;
  for (int pass = 0; pass < 2; pass++) {
    const cJSON *a = pass == 0 ? mine : theirs, *b = pass == 0 ? theirs : mine;
    for (const cJSON *e = a->child; e; e = e->next) {
      if (strcmp(e->string, "name") == 0 || strcmp(e->string, "torch_dtype") == 0) continue;
      const cJSON *o = cJSON_GetObjectItemCaseSensitive(b, e->string);
      if (pass == 1 && o) continue; /* compared in the first pass */
      if (o && cJSON_Compare(e, o, true)) continue;
      differ++;
      if (shown++ >= 8) continue;
      char *vm = pass == 0 ? cJSON_PrintUnformatted(e) : NULL;
      char *vt = pass == 0 ? (o ? cJSON_PrintUnformatted(o) : NULL) : cJSON_PrintUnformatted(e);
      char place[160];
      snprintf(place, sizeof place, "/%s", e->string);
      xm_diag_add(diag, XM_DIAG_ERROR, path, place,
                  "is %s in the checkpoint, %s in the compiled program", vt ? vt : "missing",
                  vm ? vm : "missing");
      free(vm), free(vt);
    }
  }
  if (shown > 8)
    xm_diag_add(diag, XM_DIAG_ERROR, path, NULL, "and %d more fields differ", shown - 8);
  return differ;
}

/* A Hugging Face config.json against the program's by what it means: the
 * keys that decide the weights and the function, each absent or null one
 * taking the default xmoec's importer (frontend/hf_config.c) gives it,
 * which is the value transformers' config class has or, where the two
 * differ, the importer's (tests/unit/test_hf_arch.c holds this table to
 * the importer key by key). Training settings (router_aux_loss_coef,
 * aux_loss_alpha, aux_free_bias_update_speed, dropout, jitter),
 * max_position_embeddings, token ids and keys xmoec does not know are not
 * compared: they change no tensor and no value the model computes. */
typedef enum {
  HK_NUM,      /* a number */
  HK_BOOL,     /* true or false */
  HK_STR,      /* a string */
  HK_NULL,     /* must be null (OLMoE's clip_qkv) */
  HK_LIST,     /* an array; null is [] (Qwen-MoE's mlp_only_layers) */
  HK_KV,       /* num_key_value_heads: default num_attention_heads */
  HK_HEAD_DIM, /* head_dim: default hidden_size / num_attention_heads */
  HK_LORA,     /* q_lora_rank: null (q_proj) or a positive integer */
  HK_ROPE,     /* rope_scaling: null or YaRN */
  HK_WINDOW,   /* Mixtral's sliding_window: null, or no shorter than the trained length */
  HK_GROUPS,   /* n_group and topk_group, compared as the routing they give */
  HK_POS_INT,  /* read but not compared (MLA's num_key_value_heads): a positive integer */
  HK_AUX,      /* an aux-loss weight: a training setting, not compared; a number in [0, 10] */
  HK_SPEED,    /* the aux-free bias speed: a training setting, not compared; in [0, 1] */
  HK_MLA_DIM,  /* MLA's head_dim (= qk_rope_head_dim), qk_head_dim (= nope + rope) */
} hk_kind_t;

typedef struct {
  const char *key;
  hk_kind_t kind;
  const char *dflt; /* JSON of the value when absent or null; NULL: required */
  bool dense_only;  /* the value matters only when the model has dense layers */
} hk_key_t;

#define HK_SIZES                                                                                   \
  {"vocab_size", HK_NUM, NULL, false}, {"hidden_size", HK_NUM, NULL, false},                       \
      {"num_hidden_layers", HK_NUM, NULL, false}, {                                                \
    "num_attention_heads", HK_NUM, NULL, false                                                     \
  }
#define HK_GQA                                                                                     \
  {"num_key_value_heads", HK_KV, NULL, false}, { "head_dim", HK_HEAD_DIM, NULL, false }
#define HK_ROPE_KEYS(theta)                                                                        \
  {"rope_theta", HK_NUM, theta, false}, { "rope_scaling", HK_ROPE, NULL, false }
#define HK_COMMON(eps)                                                                             \
  {"rms_norm_eps", HK_NUM, eps, false}, {"tie_word_embeddings", HK_BOOL, "false", false},          \
      {"hidden_act", HK_STR, "\"silu\"", false}, {                                                 \
    "num_experts_per_tok", HK_NUM, NULL, false                                                     \
  }
#define HK_ROUTER_AUX                                                                              \
  { "router_aux_loss_coef", HK_AUX, NULL, false }
#define HK_QWEN                                                                                    \
  {"num_experts", HK_NUM, NULL, false}, {"moe_intermediate_size", HK_NUM, NULL, false},            \
      {"norm_topk_prob", HK_BOOL, "false", false}, {"decoder_sparse_step", HK_NUM, "1", false},    \
      {"mlp_only_layers", HK_LIST, "[]", false}, {"use_sliding_window", HK_BOOL, "false", false},  \
  {                                                                                                \
    "intermediate_size", HK_NUM, "0", true                                                         \
  }

static const hk_key_t k_hk_mixtral[] = {
    HK_SIZES,
    HK_GQA,
    HK_ROPE_KEYS("1000000"),
    HK_COMMON("1e-5"),
    {"num_local_experts", HK_NUM, NULL, false},
    {"intermediate_size", HK_NUM, NULL, false},
    {"sliding_window", HK_WINDOW, NULL, false},
    HK_ROUTER_AUX,
    {NULL, HK_NUM, NULL, false},
};
static const hk_key_t k_hk_qwen2[] = {
    HK_SIZES,
    HK_GQA,
    HK_ROPE_KEYS("10000"),
    HK_COMMON("1e-6"),
    HK_QWEN,
    {"shared_expert_intermediate_size", HK_NUM, NULL, false},
    HK_ROUTER_AUX,
    {NULL, HK_NUM, NULL, false},
};
static const hk_key_t k_hk_qwen3[] = {
    HK_SIZES,
    HK_GQA,
    HK_ROPE_KEYS("10000"),
    HK_COMMON("1e-6"),
    HK_QWEN,
    {"attention_bias", HK_BOOL, "false", false},
    HK_ROUTER_AUX,
    {NULL, HK_NUM, NULL, false},
};
static const hk_key_t k_hk_olmoe[] = {
    HK_SIZES,
    HK_GQA,
    HK_ROPE_KEYS("10000"),
    HK_COMMON("1e-5"),
    {"num_experts", HK_NUM, NULL, false},
    {"intermediate_size", HK_NUM, NULL, false},
    {"norm_topk_prob", HK_BOOL, "false", false},
    {"attention_bias", HK_BOOL, "false", false},
    {"clip_qkv", HK_NULL, NULL, false},
    HK_ROUTER_AUX,
    {NULL, HK_NUM, NULL, false},
};
static const hk_key_t k_hk_deepseek_v3[] = {
    HK_SIZES,
    HK_ROPE_KEYS("10000"),
    HK_COMMON("1e-6"),
    {"q_lora_rank", HK_LORA, NULL, false},
    {"kv_lora_rank", HK_NUM, NULL, false},
    {"qk_nope_head_dim", HK_NUM, NULL, false},
    {"qk_rope_head_dim", HK_NUM, NULL, false},
    {"v_head_dim", HK_NUM, NULL, false},
    {"rope_interleave", HK_BOOL, "true", false},
    {"attention_bias", HK_BOOL, "false", false},
    {"first_k_dense_replace", HK_NUM, "0", false},
    {"intermediate_size", HK_NUM, NULL, true},
    {"moe_layer_freq", HK_NUM, "1", false},
    {"n_routed_experts", HK_NUM, NULL, false},
    {"moe_intermediate_size", HK_NUM, NULL, false},
    {"n_shared_experts", HK_NUM, "0", false},
    {"norm_topk_prob", HK_BOOL, "true", false},
    {"routed_scaling_factor", HK_NUM, "2.5", false},
    {"scoring_func", HK_STR, "\"sigmoid\"", false},
    {"topk_method", HK_STR, "\"noaux_tc\"", false},
    {"n_group", HK_GROUPS, NULL, false},
    {"num_nextn_predict_layers", HK_NUM, "0", false},
    {"num_key_value_heads", HK_POS_INT, NULL, false},
    {"aux_loss_alpha", HK_AUX, NULL, false},
    {"aux_free_bias_update_speed", HK_SPEED, NULL, false},
    {"head_dim", HK_MLA_DIM, NULL, false},
    {"qk_head_dim", HK_MLA_DIM, NULL, false},
    {NULL, HK_NUM, NULL, false},
};

static const struct {
  const char *model_type;
  const hk_key_t *keys;
} k_hk_archs[] = {
    {"mixtral", k_hk_mixtral}, {"qwen2_moe", k_hk_qwen2},         {"qwen3_moe", k_hk_qwen3},
    {"olmoe", k_hk_olmoe},     {"deepseek_v3", k_hk_deepseek_v3},
};

static const hk_key_t *ck_hf_keys(const char *model_type) {
  for (size_t i = 0; model_type && i < sizeof k_hk_archs / sizeof k_hk_archs[0]; i++)
    if (strcmp(k_hk_archs[i].model_type, model_type) == 0) return k_hk_archs[i].keys;
  return NULL;
}

typedef struct {
  const cJSON *mine, *theirs;
  const char *path;
  xm_diag_t *diag;
  int errors;
} hk_ctx_t;

static void hk_error(hk_ctx_t *c, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void hk_error(hk_ctx_t *c, const char *key, const char *fmt, ...) {
  char place[128];
  snprintf(place, sizeof place, "/%s", key);
  va_list ap;
  va_start(ap, fmt);
  xm_diag_addv(c->diag, XM_DIAG_ERROR, c->path, place, fmt, ap);
  va_end(ap);
  c->errors++;
}

static const char *hk_type(const cJSON *v) {
  if (!v) return "missing";
  if (cJSON_IsNumber(v)) return "a number";
  if (cJSON_IsString(v)) return "a string";
  if (cJSON_IsBool(v)) return "a boolean";
  if (cJSON_IsArray(v)) return "an array";
  if (cJSON_IsObject(v)) return "an object";
  return "null";
}

/* `key` of `o`; NULL when absent or null (the importer reads null as absent). */
static const cJSON *hk_get(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsNull(v) ? NULL : v;
}

static void hk_differ(hk_ctx_t *c, const char *key, const cJSON *got, const cJSON *want) {
  char *g = got ? cJSON_PrintUnformatted(got) : NULL,
       *w = want ? cJSON_PrintUnformatted(want) : NULL;
  hk_error(c, key, "is %s in the checkpoint, %s in the compiled program", g ? g : "missing",
           w ? w : "missing");
  free(g), free(w);
}

static void hk_differ_num(hk_ctx_t *c, const char *key, double got, double want) {
  char g[40], w[40];
  snprintf(g, sizeof g, "%.17g", got);
  snprintf(w, sizeof w, "%.17g", want);
  hk_error(c, key, "is %s in the checkpoint, %s in the compiled program", g, w);
}

/* A number of either file: the value, the derived default, or NaN when
 * it is not a number (reported for the checkpoint). */
static double hk_number(hk_ctx_t *c, const cJSON *o, const char *key, double dflt, bool theirs) {
  const cJSON *v = hk_get(o, key);
  if (!v) return dflt;
  if (cJSON_IsNumber(v)) return v->valuedouble;
  if (theirs) hk_error(c, key, "expected a number, got %s", hk_type(v));
  return NAN;
}

static void hk_compare_derived(hk_ctx_t *c, const hk_key_t *k) {
  double gh = hk_number(c, c->theirs, "num_attention_heads", NAN, false);
  double wh = hk_number(c, c->mine, "num_attention_heads", NAN, false);
  double gd = gh, wd = wh; /* num_key_value_heads defaults to the heads */
  if (k->kind == HK_HEAD_DIM) {
    double gx = hk_number(c, c->theirs, "hidden_size", NAN, false);
    double wx = hk_number(c, c->mine, "hidden_size", NAN, false);
    gd = gh > 0 && gx == floor(gx / gh) * gh ? gx / gh : NAN;
    wd = wh > 0 ? floor(wx / wh) : NAN;
  }
  int before = c->errors;
  double g = hk_number(c, c->theirs, k->key, gd, true);
  double w = hk_number(c, c->mine, k->key, wd, false);
  if (c->errors == before && g != w) {
    if (g != g)
      hk_error(c, k->key,
               "missing, and hidden_size is not a multiple of num_attention_heads "
               "(%.17g in the compiled program)",
               w);
    else
      hk_differ_num(c, k->key, g, w);
  }
}

/* rope_scaling as the importer reads it: null (or type "default") is
 * plain RoPE; YaRN's keys default as in transformers'
 * _compute_yarn_parameters; any other type is refused. */
typedef struct {
  bool on;
  double
      v[7]; /* factor, original, beta_fast, beta_slow, mscale, mscale_all_dim, attention_factor */
  bool truncate;
} hk_rope_t;

static const char *const k_rope_keys[7] = {"factor",          "original_max_position_embeddings",
                                           "beta_fast",       "beta_slow",
                                           "mscale",          "mscale_all_dim",
                                           "attention_factor"};

static bool hk_rope(hk_ctx_t *c, const cJSON *root, bool theirs, hk_rope_t *r) {
  memset(r, 0, sizeof *r);
  r->truncate = true;
  const cJSON *rs = hk_get(root, "rope_scaling");
  if (!rs) return true;
  if (!cJSON_IsObject(rs)) {
    if (theirs) hk_error(c, "rope_scaling", "expected an object or null, got %s", hk_type(rs));
    return false;
  }
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
  if (!t) t = cJSON_GetObjectItemCaseSensitive(rs, "type");
  if (cJSON_IsString(t) && strcmp(t->valuestring, "default") == 0) return true;
  if (!cJSON_IsString(t) || strcmp(t->valuestring, "yarn") != 0) {
    if (theirs)
      hk_error(c, "rope_scaling", "unsupported rope scaling %s; xmoec applies YaRN only",
               cJSON_IsString(t) ? t->valuestring : "without a type");
    return false;
  }
  r->on = true;
  const double dflt[7] = {NAN, NAN, 32, 1, 0, 0, 0};
  for (int i = 0; i < 7; i++) {
    const cJSON *v = hk_get(rs, k_rope_keys[i]);
    r->v[i] = v && cJSON_IsNumber(v) ? v->valuedouble : dflt[i];
    if (v && !cJSON_IsNumber(v) && theirs) {
      char key[80];
      snprintf(key, sizeof key, "rope_scaling/%s", k_rope_keys[i]);
      hk_error(c, key, "expected a number, got %s", hk_type(v));
    }
  }
  if (r->v[1] != r->v[1]) { /* the importer falls back to max_position_embeddings */
    const cJSON *mp = hk_get(root, "max_position_embeddings");
    if (cJSON_IsNumber(mp)) r->v[1] = mp->valuedouble;
  }
  r->truncate = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(rs, "truncate"));
  for (const cJSON *it = rs->child; theirs && it; it = it->next) {
    bool known = strcmp(it->string, "type") == 0 || strcmp(it->string, "rope_type") == 0 ||
                 strcmp(it->string, "truncate") == 0;
    for (int i = 0; i < 7 && !known; i++)
      known = strcmp(it->string, k_rope_keys[i]) == 0;
    if (!known) {
      char key[160];
      snprintf(key, sizeof key, "rope_scaling/%s", it->string);
      hk_error(c, key, "unknown YaRN key");
    }
  }
  return true;
}

static void hk_compare_rope(hk_ctx_t *c) {
  hk_rope_t g, w;
  int before = c->errors;
  bool gok = hk_rope(c, c->theirs, true, &g);
  hk_rope(c, c->mine, false, &w);
  if (!gok || c->errors != before) return;
  if (g.on != w.on) {
    hk_error(c, "rope_scaling", "is %s in the checkpoint, %s in the compiled program",
             g.on ? "YaRN" : "null", w.on ? "YaRN" : "null");
    return;
  }
  for (int i = 0; g.on && i < 7; i++) {
    if (g.v[i] == w.v[i]) continue;
    char key[80];
    snprintf(key, sizeof key, "rope_scaling/%s", k_rope_keys[i]);
    if (g.v[i] != g.v[i])
      hk_error(c, key, "missing (YaRN needs it), %.17g in the compiled program", w.v[i]);
    else
      hk_differ_num(c, key, g.v[i], w.v[i]);
  }
  if (g.on && g.truncate != w.truncate)
    hk_error(c, "rope_scaling/truncate", "is %s in the checkpoint, %s in the compiled program",
             g.truncate ? "true" : "false", w.truncate ? "true" : "false");
}

/* n_group / topk_group as the routing they give (topk_method greedy, or
 * every group kept, is plain top-k), DeepSeek-V3's defaults 8 and 4. */
static void hk_compare_groups(hk_ctx_t *c) {
  int before = c->errors;
  double gn = hk_number(c, c->theirs, "n_group", 8, true);
  double gt = hk_number(c, c->theirs, "topk_group", 4, true);
  double wn = hk_number(c, c->mine, "n_group", 8, false);
  double wt = hk_number(c, c->mine, "topk_group", 4, false);
  if (c->errors != before) return;
  const cJSON *method = hk_get(c->theirs, "topk_method");
  if (cJSON_IsString(method) && strcmp(method->valuestring, "greedy") == 0) gn = gt = 1;
  /* Groups the experts cannot form, or too few kept for top_k, are no
   * routing at all (the importer refuses them too). */
  double experts = hk_number(c, c->theirs, "n_routed_experts", NAN, false);
  double top_k = hk_number(c, c->theirs, "num_experts_per_tok", NAN, false);
  if (gn < 1 || gn != floor(gn) || fmod(experts, gn) != 0 || (gn > 1 && experts / gn < 2)) {
    hk_error(c, "n_group",
             "%.17g groups of the %.17g experts cannot be formed (DeepSeek-V3 "
             "needs at least 2 experts per group)",
             gn, experts);
    return;
  }
  if (gt < 1 || gt != floor(gt) || gt > gn || top_k > gt * (experts / gn)) {
    hk_error(c, "topk_group", "keeps %.17g of %.17g groups: not a routing of %.17g experts", gt, gn,
             top_k);
    return;
  }
  if (gt >= gn) gn = gt = 1;
  if (wt >= wn) wn = wt = 1;
  if (gn != wn)
    hk_differ_num(c, "n_group", gn, wn);
  else if (gt != wt)
    hk_differ_num(c, "topk_group", gt, wt);
}

/* transformers' DeepseekV3Config derives head_dim and qk_head_dim from
 * the rotary and non-rotary widths; a file without them means those. */
static double hk_mla_dim(hk_ctx_t *c, const cJSON *o, const char *key, bool theirs) {
  double rope = hk_number(c, o, "qk_rope_head_dim", NAN, false);
  double nope = hk_number(c, o, "qk_nope_head_dim", NAN, false);
  return hk_number(c, o, key, strcmp(key, "head_dim") == 0 ? rope : nope + rope, theirs);
}

static void hk_compare_mla_dim(hk_ctx_t *c, const hk_key_t *k) {
  int before = c->errors;
  double g = hk_mla_dim(c, c->theirs, k->key, true);
  double w = hk_mla_dim(c, c->mine, k->key, false);
  if (c->errors == before && g == g && g != w) hk_differ_num(c, k->key, g, w);
}

static bool hk_has_dense_layers(const cJSON *mine) {
  const cJSON *k = hk_get(mine, "first_k_dense_replace");
  const cJSON *l = hk_get(mine, "mlp_only_layers");
  return (cJSON_IsNumber(k) && k->valuedouble > 0) || (cJSON_IsArray(l) && cJSON_GetArraySize(l));
}

static void hk_compare(hk_ctx_t *c, const hk_key_t *k) {
  /* A key the program's config does not have holds nothing to compare
   * (head_dim may be derived: Qwen2-MoE and OLMoE do not write it). */
  if (k->kind != HK_HEAD_DIM && !cJSON_GetObjectItemCaseSensitive(c->mine, k->key)) return;
  const cJSON *w = hk_get(c->mine, k->key), *g = hk_get(c->theirs, k->key);
  cJSON *owned = NULL;
  switch (k->kind) {
  case HK_KV:
  case HK_HEAD_DIM: hk_compare_derived(c, k); return;
  case HK_ROPE: hk_compare_rope(c); return;
  case HK_GROUPS: hk_compare_groups(c); return;
  case HK_NULL:
    if (g) hk_error(c, k->key, "is %s in the checkpoint; xmoec models only null", hk_type(g));
    return;
  case HK_POS_INT:
    if (g && (!cJSON_IsNumber(g) || g->valuedouble < 1 || g->valuedouble != floor(g->valuedouble)))
      hk_error(c, k->key, "expected a positive integer, got %s", hk_type(g));
    return;
  case HK_MLA_DIM: hk_compare_mla_dim(c, k); return;
  case HK_SPEED:
    if (g && (!cJSON_IsNumber(g) || !(g->valuedouble >= 0 && g->valuedouble <= 1)))
      hk_error(c, k->key, "expected a bias update speed in [0, 1], got %s",
               cJSON_IsNumber(g) ? "a number outside" : hk_type(g));
    return;
  case HK_AUX:
    if (g && (!cJSON_IsNumber(g) || !(g->valuedouble >= 0 && g->valuedouble <= 10)))
      hk_error(c, k->key, "expected an aux-loss weight in [0, 10], got %s",
               cJSON_IsNumber(g) ? "a number outside" : hk_type(g));
    return;
  case HK_WINDOW: {
    double len = hk_number(c, c->mine, "max_position_embeddings", 0, false);
    if (g && !cJSON_IsNumber(g))
      hk_error(c, k->key, "expected a number or null, got %s", hk_type(g));
    else if (g && g->valuedouble < len)
      hk_error(c, k->key,
               "sliding-window attention over %.17g tokens is not modelled (the program attends "
               "over all %.17g tokens of a sequence)",
               g->valuedouble, len);
    return;
  }
  case HK_LORA: {
    double gv = g && cJSON_IsNumber(g) ? g->valuedouble : 0, wv = w ? w->valuedouble : 0;
    if (g && (!cJSON_IsNumber(g) || gv < 1 || gv != floor(gv)))
      hk_error(c, k->key, "expected null or a positive integer, got %s", hk_type(g));
    else if (gv != wv && (gv == 0 || wv == 0))
      hk_error(c, k->key, "is %s in the checkpoint, %s in the compiled program (null: q_proj)",
               gv == 0 ? "null" : "a rank", wv == 0 ? "null" : "a rank");
    else if (gv != wv)
      hk_differ_num(c, k->key, gv, wv);
    return;
  }
  default: break;
  }
  if (!w) return; /* not written by this program: nothing to hold it to */
  if (!g && !k->dflt) {
    if (!k->dense_only || hk_has_dense_layers(c->mine))
      hk_differ(c, k->key, NULL, w);
    else
      hk_error(c, k->key, "missing in the checkpoint (required by its config class)");
    return;
  }
  if (!g) g = owned = cJSON_Parse(k->dflt);
  XM_ASSERT(g != NULL);
  bool type_ok = k->kind == HK_NUM    ? cJSON_IsNumber(g)
                 : k->kind == HK_BOOL ? cJSON_IsBool(g)
                 : k->kind == HK_STR  ? cJSON_IsString(g)
                                      : cJSON_IsArray(g);
  static const char *const want_type[] = {"a number", "true or false", "a string", "", "an array"};
  if (!type_ok)
    hk_error(c, k->key, "expected %s, got %s", want_type[k->kind], hk_type(g));
  else if (k->dense_only && !hk_has_dense_layers(c->mine))
    ; /* the width of layers the model does not have */
  else if (k->kind == HK_NUM ? g->valuedouble != w->valuedouble : !cJSON_Compare(g, w, true))
    hk_differ(c, k->key, g, w);
  cJSON_Delete(owned);
}

static int ck_config_hf(const hk_key_t *keys, const cJSON *mine, const cJSON *theirs,
                        const char *path, xm_diag_t *diag) {
  hk_ctx_t c = {.mine = mine, .theirs = theirs, .path = path, .diag = diag};
  const cJSON *wt = hk_get(mine, "model_type"), *gt = hk_get(theirs, "model_type");
  if (!cJSON_IsString(gt) || strcmp(gt->valuestring, wt->valuestring) != 0) {
    hk_differ(&c, "model_type", gt, wt);
    return c.errors; /* another family: its keys mean other things */
  }
  for (const hk_key_t *k = keys; k->key; k++)
    hk_compare(&c, k);
  return c.errors;
}

xm_status_t xm_rt_hf_config_check(const char *program_config, const char *text, size_t len,
                                  const char *path, xm_diag_t *diag) {
  cJSON *mine = program_config ? cJSON_Parse(program_config) : NULL;
  cJSON *theirs = strlen(text) == len ? cJSON_ParseWithLength(text, len) : NULL;
  xm_status_t s = XM_OK;
  if (!cJSON_IsObject(theirs)) {
    xm_diag_add(diag, XM_DIAG_ERROR, path, NULL, "not a JSON object (malformed)");
    s = XM_ERR_INVALID_INPUT;
  } else if (cJSON_IsObject(mine)) {
    const cJSON *mt = hk_get(mine, "model_type");
    const hk_key_t *keys = cJSON_IsString(mt) ? ck_hf_keys(mt->valuestring) : NULL;
    int differ = keys ? ck_config_hf(keys, mine, theirs, path, diag)
                      : ck_config_exact(mine, theirs, path, diag);
    if (differ) {
      xm_diag_add(diag, XM_DIAG_NOTE, path, NULL,
                  "the checkpoint is of another model: compile its config.json (or a spec of "
                  "the same model) to train from it");
      s = XM_ERR_INVALID_INPUT;
    }
  }
  cJSON_Delete(mine);
  cJSON_Delete(theirs);
  return s;
}

/* config.json of the checkpoint directory against the program's: exactly
 * for --resume (the program's own checkpoints), by meaning for --init-from
 * (xm_rt_hf_config_check). A resumed checkpoint without one (an export of
 * weights alone) is taken as it is; an import needs it, since nothing else
 * says what the weights compute. */
static xm_status_t ck_match_config(const xm_rt_program_t *p, const char *dir, bool import,
                                   xm_diag_t *diag) {
  if (!p->config_json) return XM_OK;
  char *path = ck_join(dir, "config.json");
  char *text = NULL;
  size_t len = 0;
  int err = xm_read_file(path, &text, &len);
  xm_status_t s = XM_OK;
  if (err == ENOENT && !import) {
    /* taken as it is */
  } else if (err == ENOENT) {
    xm_diag_add(diag, XM_DIAG_ERROR, path, NULL,
                "missing: --init-from checks the checkpoint's architecture against the "
                "program's from its config.json");
    s = XM_ERR_INVALID_INPUT;
  } else if (err) {
    char why[160];
    xm_diag_add(diag, XM_DIAG_ERROR, path, NULL, "cannot read: %s",
                xm_read_error(err, XM_READ_LIMIT_TEXT, why, sizeof why));
    s = XM_ERR_IO;
  } else if (import) {
    s = xm_rt_hf_config_check(p->config_json, text, len, path, diag);
  } else {
    cJSON *mine = cJSON_Parse(p->config_json);
    cJSON *theirs = strlen(text) == len ? cJSON_ParseWithLength(text, len) : NULL;
    if (!cJSON_IsObject(theirs)) {
      xm_diag_add(diag, XM_DIAG_ERROR, path, NULL, "not a JSON object (malformed)");
      s = XM_ERR_INVALID_INPUT;
    } else if (cJSON_IsObject(mine) && ck_config_exact(mine, theirs, path, diag)) {
      xm_diag_add(diag, XM_DIAG_NOTE, path, NULL,
                  "the checkpoint is of another model; resume it with a program compiled from "
                  "its spec.json");
      s = XM_ERR_INVALID_INPUT;
    }
    cJSON_Delete(mine);
    cJSON_Delete(theirs);
  }
  free(text);
  free(path);
  return s;
}

/* The directory to read: the target, or the complete checkpoint that an
 * interrupted swap left beside it. Owned by the caller. */
static xm_status_t ck_resolve(const char *dir, xm_diag_t *diag, char **out_dir) {
  ck_paths_t p;
  ck_paths_init(dir, &p);
  xm_status_t s = XM_OK;
  if (ck_is_dir(p.dir)) {
    *out_dir = strdup(p.dir);
  } else {
    char *old = NULL, *fresh = NULL;
    ck_find_interrupted(&p, &old, &fresh);
    if (fresh || old) {
      *out_dir = strdup(fresh ? fresh : old);
      xm_diag_add(diag, XM_DIAG_NOTE, p.dir, NULL,
                  "reading %s, left complete by an interrupted save", *out_dir);
    } else {
      xm_diag_add(diag, XM_DIAG_ERROR, p.dir, NULL, "checkpoint directory not found");
      s = XM_ERR_INVALID_INPUT;
    }
    free(old), free(fresh);
  }
  ck_paths_free(&p);
  return s;
}

xm_status_t xm_rt_checkpoint_load(xm_rt_exec_t *x, const char *dir, bool with_optimizer,
                                  xm_rt_train_state_t *st, xm_diag_t *diag) {
  /* Every rank reads the files itself (no broadcast): tensors are stored
   * whole; a sharded program loads into its full view and
   * runtime/io/shard_io.c copies each rank's slice out of it. */
  memset(st, 0, sizeof *st);
  char *path = NULL;
  XM_RETURN_IF_ERROR(ck_resolve(dir, diag, &path));
  ck_group_t model = {0}, optim = {0};
  xm_rt_train_state_t loaded = {0};
  /* Everything is checked before anything is copied: a failed load leaves
   * the arena as it was (and *st zeroed). */
  xm_status_t s = ck_match_model(x->program, path, &k_exact, diag, &model);
  if (with_optimizer) {
    xm_status_t so = ck_match_optimizer(x->program, path, diag, &optim);
    if (s == XM_OK) s = so;
  }
  xm_status_t sc = ck_match_config(x->program, path, false, diag);
  if (s == XM_OK) s = sc;
  xm_status_t ss = ck_load_state(path, x->program, &loaded, diag);
  if (s == XM_OK) s = ss;
  if (s == XM_OK) {
    ck_group_copy(x, &model);
    ck_zero_category(x, XM_RT_CAT_GRADS);
    if (with_optimizer)
      ck_group_copy(x, &optim);
    else
      ck_zero_category(x, XM_RT_CAT_OPTIMIZER);
    *st = loaded;
  }
  ck_group_free(&model);
  ck_group_free(&optim);
  free(path);
  return s;
}

/* What an import may find beside the program's weights (ck_load_t): the
 * MTP layers and the shared head, from the program's config.json. */
static ck_load_t ck_import_options(const xm_rt_program_t *p) {
  ck_load_t o = {.import = true, .head = "lm_head.weight"};
  cJSON *cfg = p->config_json ? cJSON_Parse(p->config_json) : NULL;
  const cJSON *layers = cJSON_GetObjectItemCaseSensitive(cfg, "num_hidden_layers");
  const cJSON *mtp = cJSON_GetObjectItemCaseSensitive(cfg, "num_nextn_predict_layers");
  if (cJSON_IsNumber(layers) && cJSON_IsNumber(mtp)) {
    o.mtp_first = (int64_t)layers->valuedouble;
    o.mtp_count = (int64_t)mtp->valuedouble;
  }
  if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, "tie_word_embeddings")))
    o.head = "model.embed_tokens.weight";
  cJSON_Delete(cfg);
  return o;
}

xm_status_t xm_rt_checkpoint_import(xm_rt_exec_t *x, const char *dir, xm_diag_t *diag) {
  char *path = NULL;
  XM_RETURN_IF_ERROR(ck_resolve(dir, diag, &path));
  ck_load_t o = ck_import_options(x->program);
  ck_group_t model = {0};
  /* As for a resume, every check runs before anything is copied. The
   * config goes first: a checkpoint of another model is said in one line
   * (its differing key), not in a tensor list whose every name or shape
   * differs in consequence. */
  xm_status_t s = ck_match_config(x->program, path, true, diag);
  if (s == XM_OK) s = ck_match_model(x->program, path, &o, diag, &model);
  if (s == XM_OK) {
    ck_group_copy(x, &model);
    ck_zero_category(x, XM_RT_CAT_GRADS);
    ck_zero_category(x, XM_RT_CAT_OPTIMIZER);
  }
  ck_group_free(&model);
  free(path);
  return s;
}
