/* support/diag.c — the diagnostic list. Entries keep insertion order so that
 * messages come out in the order the input was read. */
#include "support/diag.h"

#include <stdlib.h>
#include <string.h>

#include "support/status.h"
#include "support/strbuf.h"

void xm_diag_init(xm_diag_t *d) { memset(d, 0, sizeof *d); }

void xm_diag_free(xm_diag_t *d) {
  for (int i = 0; i < d->count; i++) {
    free(d->entries[i].file);
    free(d->entries[i].place);
    free(d->entries[i].message);
  }
  free(d->entries);
  memset(d, 0, sizeof *d);
}

static char *dup_or_null(const char *s) {
  if (!s) return NULL;
  char *r = strdup(s);
  XM_ASSERT(r != NULL);
  return r;
}

void xm_diag_addv(xm_diag_t *d, xm_diag_level_t level, const char *file,
                  const char *place, const char *fmt, va_list ap) {
  if (d->count == d->capacity) {
    int cap = d->capacity ? d->capacity * 2 : 16;
    xm_diag_entry_t *e = realloc(d->entries, (size_t)cap * sizeof *e);
    XM_ASSERT(e != NULL);
    d->entries = e;
    d->capacity = cap;
  }
  xm_strbuf_t msg;
  xm_strbuf_init(&msg);
  xm_strbuf_vprintf(&msg, fmt, ap);
  xm_diag_entry_t *e = &d->entries[d->count++];
  e->level = level;
  e->file = dup_or_null(file);
  e->place = dup_or_null(place);
  e->message = xm_strbuf_take(&msg);
  if (level == XM_DIAG_ERROR) d->errors++;
}

void xm_diag_add(xm_diag_t *d, xm_diag_level_t level, const char *file,
                 const char *place, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  xm_diag_addv(d, level, file, place, fmt, ap);
  va_end(ap);
}

int xm_diag_find(const xm_diag_t *d, const char *place) {
  for (int i = 0; i < d->count; i++)
    if (d->entries[i].place && place && strcmp(d->entries[i].place, place) == 0)
      return i;
  return -1;
}

void xm_diag_name_file(xm_diag_t *d, int from, const char *file) {
  for (int i = from < 0 ? 0 : from; file && i < d->count; i++)
    if (!d->entries[i].file) d->entries[i].file = dup_or_null(file);
}

void xm_diag_print(const xm_diag_t *d, FILE *out) {
  static const char *names[] = {"error", "warning", "note"};
  for (int i = 0; i < d->count; i++) {
    const xm_diag_entry_t *e = &d->entries[i];
    if (e->file) fprintf(out, "%s: ", e->file);
    fprintf(out, "%s: ", names[e->level]);
    if (e->place && e->place[0]) fprintf(out, "%s: ", e->place);
    fprintf(out, "%s\n", e->message);
  }
}
