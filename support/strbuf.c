/* support/strbuf.c — growable strings, number formatting, file reading. */
#include "support/strbuf.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "support/status.h"

void xm_strbuf_init(xm_strbuf_t *b) { memset(b, 0, sizeof *b); }

void xm_strbuf_free(xm_strbuf_t *b) {
  free(b->data);
  memset(b, 0, sizeof *b);
}

void xm_strbuf_clear(xm_strbuf_t *b) {
  b->len = 0;
  if (b->data) b->data[0] = '\0';
}

static void reserve(xm_strbuf_t *b, size_t extra) {
  XM_ASSERT(extra < ((size_t)1 << 40));
  if (b->len + extra + 1 <= b->cap) return;
  size_t cap = b->cap ? b->cap : 64;
  while (cap < b->len + extra + 1) cap *= 2;
  char *d = realloc(b->data, cap);
  XM_ASSERT(d != NULL);
  b->data = d;
  b->cap = cap;
}

void xm_strbuf_append(xm_strbuf_t *b, const char *s, size_t n) {
  reserve(b, n);
  memcpy(b->data + b->len, s, n);
  b->len += n;
  b->data[b->len] = '\0';
}

void xm_strbuf_puts(xm_strbuf_t *b, const char *s) {
  xm_strbuf_append(b, s, strlen(s));
}

void xm_strbuf_vprintf(xm_strbuf_t *b, const char *fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  XM_ASSERT(n >= 0);
  reserve(b, (size_t)n);
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  b->len += (size_t)n;
}

void xm_strbuf_printf(xm_strbuf_t *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  xm_strbuf_vprintf(b, fmt, ap);
  va_end(ap);
}

const char *xm_strbuf_cstr(const xm_strbuf_t *b) {
  return b->data ? b->data : "";
}

char *xm_strbuf_take(xm_strbuf_t *b) {
  char *s = b->data;
  if (!s) {
    s = strdup("");
    XM_ASSERT(s != NULL);
  }
  memset(b, 0, sizeof *b);
  return s;
}

void xm_strbuf_put_quoted(xm_strbuf_t *b, const char *s) {
  xm_strbuf_puts(b, "\"");
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    switch (*p) {
    case '"': xm_strbuf_puts(b, "\\\""); break;
    case '\\': xm_strbuf_puts(b, "\\\\"); break;
    case '\n': xm_strbuf_puts(b, "\\n"); break;
    case '\t': xm_strbuf_puts(b, "\\t"); break;
    case '\r': xm_strbuf_puts(b, "\\r"); break;
    default:
      if (*p < 0x20 || *p == 0x7f)
        xm_strbuf_printf(b, "\\u%04x", *p);
      else
        xm_strbuf_append(b, (const char *)p, 1);
    }
  }
  xm_strbuf_puts(b, "\"");
}

void xm_strbuf_put_double(xm_strbuf_t *b, double v) {
  if (isnan(v)) {
    xm_strbuf_puts(b, "nan");
    return;
  }
  if (isinf(v)) {
    xm_strbuf_puts(b, v < 0 ? "-inf" : "inf");
    return;
  }
  char tmp[64];
  int prec = 1;
  for (; prec <= 17; prec++) {
    snprintf(tmp, sizeof tmp, "%.*g", prec, v);
    if (strtod(tmp, NULL) == v) break;
  }
  /* Plain decimals between 1e-4 and 1e16, as Python's repr does. */
  double mag = fabs(v);
  if (mag >= 1e-4 && mag < 1e16) {
    int exp10 = (int)floor(log10(mag));
    int decimals = prec - 1 - exp10;
    if (decimals < 0) decimals = 0;
    snprintf(tmp, sizeof tmp, "%.*f", decimals, v);
  }
  xm_strbuf_puts(b, tmp);
  if (!strpbrk(tmp, ".e")) xm_strbuf_puts(b, ".0");
}

int xm_read_stream_limit(FILE *f, size_t limit, char **out_data, size_t *out_len) {
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  char chunk[65536];
  size_t n;
  int err = 0;
  while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
    if (n > limit - b.len) { /* b.len <= limit always */
      err = XM_READ_TOO_LARGE;
      break;
    }
    xm_strbuf_append(&b, chunk, n);
  }
  if (!err && ferror(f)) err = errno ? errno : EIO;
  if (err) {
    xm_strbuf_free(&b);
    return err;
  }
  *out_len = b.len;
  xm_strbuf_append(&b, "", 0); /* a NUL-terminated buffer even when empty */
  *out_data = xm_strbuf_take(&b);
  return 0;
}

int xm_open_regular(const char *path, size_t limit, int *out_fd, size_t *out_size,
                    struct timespec *out_mtime) {
  *out_fd = -1;
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return errno ? errno : EIO;
  struct stat st;
  int err = 0;
  if (fstat(fd, &st) != 0)
    err = errno ? errno : EIO;
  else if (S_ISDIR(st.st_mode))
    err = EISDIR;
  else if (!S_ISREG(st.st_mode))
    err = XM_READ_NOT_REGULAR;
  else if ((uint64_t)st.st_size > (uint64_t)limit)
    err = XM_READ_TOO_LARGE;
  if (err) {
    close(fd);
    return err;
  }
  *out_fd = fd;
  if (out_size) *out_size = (size_t)st.st_size;
  if (out_mtime) *out_mtime = st.st_mtim;
  return 0;
}

int xm_read_file_limit(const char *path, size_t limit, char **out_data, size_t *out_len) {
  int fd;
  int err = xm_open_regular(path, limit, &fd, NULL, NULL);
  if (err) return err;
  FILE *f = fdopen(fd, "rb");
  if (!f) {
    err = errno ? errno : EIO;
    close(fd);
    return err;
  }
  err = xm_read_stream_limit(f, limit, out_data, out_len);
  fclose(f);
  return err;
}

int xm_read_file(const char *path, char **out_data, size_t *out_len) {
  return xm_read_file_limit(path, XM_READ_LIMIT_TEXT, out_data, out_len);
}

const char *xm_read_error(int err, size_t limit, char *buf, size_t n) {
  if (err == XM_READ_NOT_REGULAR)
    snprintf(buf, n, "not a regular file (a FIFO, a device or a socket is not read)");
  else if (err == XM_READ_TOO_LARGE)
    snprintf(buf, n, "larger than the limit of %zu MiB for this kind of file", limit >> 20);
  else if (err == EISDIR)
    snprintf(buf, n, "is a directory, not a file");
  else
    snprintf(buf, n, "%s", strerror(err));
  return buf;
}

const char *xm_open_error(int err, size_t limit, const char *kind, char *buf, size_t n) {
  if (err == EISDIR) {
    snprintf(buf, n, "is a directory, not a %s", kind);
    return buf;
  }
  char why[160];
  xm_read_error(err, limit, why, sizeof why);
  bool refused = err == XM_READ_NOT_REGULAR || err == XM_READ_TOO_LARGE;
  snprintf(buf, n, "%s%s", refused ? "" : "cannot open: ", why);
  return buf;
}

long long xm_utf8_bad_at(const char *text, size_t n, const char *allowed) {
  const unsigned char *p = (const unsigned char *)text;
  size_t i = 0;
  while (i < n) {
    unsigned c = p[i];
    if (c < 0x80) {
      if ((c < 0x20 || c == 0x7f) && allowed && (c == 0 || !strchr(allowed, (int)c)))
        return (long long)i;
      i++;
      continue;
    }
    size_t len = c >= 0xc2 && c <= 0xdf   ? 2
                 : c >= 0xe0 && c <= 0xef ? 3
                 : c >= 0xf0 && c <= 0xf4 ? 4
                                          : 0;
    if (len == 0 || i + len > n) return (long long)i;
    for (size_t j = 1; j < len; j++)
      if ((p[i + j] & 0xc0) != 0x80) return (long long)i;
    /* overlong forms, surrogates and code points past U+10FFFF */
    if ((c == 0xe0 && p[i + 1] < 0xa0) || (c == 0xed && p[i + 1] > 0x9f) ||
        (c == 0xf0 && p[i + 1] < 0x90) || (c == 0xf4 && p[i + 1] > 0x8f))
      return (long long)i;
    i += len;
  }
  return -1;
}

int xm_edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 256 || lb > 256) return (int)(la > lb ? la : lb);
  int row[257];
  for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
  for (size_t i = 1; i <= la; i++) {
    int prev = row[0];
    row[0] = (int)i;
    for (size_t j = 1; j <= lb; j++) {
      int cur = row[j];
      int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      int best = prev + cost;
      if (row[j] + 1 < best) best = row[j] + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      prev = cur;
    }
  }
  return row[lb];
}

void xm_text_line_col(const char *text, size_t off, int *line, int *col) {
  *line = 1;
  *col = 1;
  for (size_t i = 0; i < off; i++) {
    if (text[i] == '\n')
      ++*line, *col = 1;
    else
      ++*col;
  }
}
