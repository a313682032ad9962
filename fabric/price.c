/* fabric/price.c — the price table of the network's parts and the price
 * of a bill of materials (fabric/price.h).
 *
 * The table is a short list of rows by link speed plus the speed-free
 * items. A price file is validated completely into a copy of the table
 * and the copy replaces the caller's only when no error was found, so a
 * bad file never leaves a half-applied table. Sources of the built-in
 * numbers: docs/fabric-prices.md.
 */
#include "fabric/price.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "support/strbuf.h"

/* One row per speed: nic_port, transceiver, switch_port, copper_cable
 * (docs/fabric-prices.md, "The table", has the source of each). */
static const xm_fab_speed_price_t k_default_speeds[] = {
    {100, 390.625, 100, 390.625, 60},
    {200, 781.25, 265, 781.25, 90},
    {400, 1562.5, 700, 1562.5, 150},
    {800, 3125, 1250, 3125, 250},
};

#define DEFAULT_OCS_PORT 500.0
#define DEFAULT_FIBRE 35.0

void xm_fab_prices_default(xm_fab_prices_t *out) {
  memset(out, 0, sizeof *out);
  out->num_speeds = (int)(sizeof k_default_speeds / sizeof *k_default_speeds);
  memcpy(out->speeds, k_default_speeds, sizeof k_default_speeds);
  out->ocs_port = DEFAULT_OCS_PORT;
  out->fibre = DEFAULT_FIBRE;
  out->switch_chassis = 0;
  out->ocs_chassis = 0;
}

/* ---- lookup ------------------------------------------------------------------ */

static double power_law(double x0, double y0, double x1, double y1, double x) {
  if (y0 <= 0 || y1 <= 0) /* a free item: log undefined, interpolate linearly */
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0);
  double t = (log(x) - log(x0)) / (log(x1) - log(x0));
  return exp(log(y0) + t * (log(y1) - log(y0)));
}

bool xm_fab_prices_at(const xm_fab_prices_t *p, double gbps, xm_fab_speed_price_t *out) {
  if (!p || p->num_speeds < 1 || !isfinite(gbps) || !(gbps > 0)) return false;
  const xm_fab_speed_price_t *s = p->speeds;
  int n = p->num_speeds;
  if (gbps < s[0].gbps || gbps > s[n - 1].gbps) return false;
  for (int i = 0; i < n; i++)
    if (s[i].gbps == gbps) {
      *out = s[i];
      return true;
    }
  int i = 0;
  while (s[i + 1].gbps < gbps)
    i++;
  const xm_fab_speed_price_t *a = &s[i], *b = &s[i + 1];
  out->gbps = gbps;
  out->nic_port = power_law(a->gbps, a->nic_port, b->gbps, b->nic_port, gbps);
  out->transceiver = power_law(a->gbps, a->transceiver, b->gbps, b->transceiver, gbps);
  out->switch_port = power_law(a->gbps, a->switch_port, b->gbps, b->switch_port, gbps);
  out->copper_cable = power_law(a->gbps, a->copper_cable, b->gbps, b->copper_cable, gbps);
  return true;
}

xm_status_t xm_fab_prices_check_speed(const xm_fab_prices_t *p, double gbps, const char *place,
                                      xm_diag_t *diag) {
  xm_fab_speed_price_t s;
  if (xm_fab_prices_at(p, gbps, &s)) return XM_OK;
  if (p->num_speeds < 1)
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, place, "the price table has no link speed");
  else
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, place,
                "no price for %g Gb/s links: the price table covers %g to %g Gb/s (between two "
                "rows it interpolates; outside them add a row with a price file, "
                "docs/fabric-prices.md)",
                gbps, p->speeds[0].gbps, p->speeds[p->num_speeds - 1].gbps);
  return XM_ERR_INVALID_INPUT;
}

double xm_fab_price(const xm_fab_bom_t *bom, const xm_fab_prices_t *p,
                    xm_fab_price_breakdown_t *out) {
  xm_fab_price_breakdown_t b;
  xm_fab_speed_price_t s;
  if (!xm_fab_prices_at(p, bom->link_gbps, &s)) {
    b.nic_ports = b.transceivers = b.switch_ports = b.switches = b.ocs_ports = b.ocs_switches =
        b.fibres = b.copper_cables = b.total = NAN;
    if (out) *out = b;
    return NAN;
  }
  b.nic_ports = bom->nic_ports * s.nic_port;
  b.transceivers = bom->transceivers * s.transceiver;
  b.switch_ports = bom->switch_ports * s.switch_port;
  b.switches = bom->switches * p->switch_chassis;
  b.ocs_ports = bom->ocs_ports * p->ocs_port;
  b.ocs_switches = bom->ocs_switches * p->ocs_chassis;
  b.fibres = bom->fibres * p->fibre;
  b.copper_cables = bom->copper_cables * s.copper_cable;
  b.total = b.nic_ports + b.transceivers + b.switch_ports + b.switches + b.ocs_ports +
            b.ocs_switches + b.fibres + b.copper_cables;
  if (out) *out = b;
  return b.total;
}

/* ---- price files ------------------------------------------------------------- */

static void err(xm_diag_t *d, const char *source, const char *place, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void err(xm_diag_t *d, const char *source, const char *place, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  xm_diag_addv(d, XM_DIAG_ERROR, source, place, fmt, ap);
  va_end(ap);
}

/* A JSON pointer token: '~' and '/' escaped (RFC 6901). */
static void put_token(char *buf, size_t cap, const char *prefix, const char *key) {
  size_t n = (size_t)snprintf(buf, cap, "%s/", prefix);
  for (const char *c = key; *c && n + 3 < cap; c++) {
    if (*c == '~')
      buf[n++] = '~', buf[n++] = '0';
    else if (*c == '/')
      buf[n++] = '~', buf[n++] = '1';
    else
      buf[n++] = *c;
  }
  buf[n < cap ? n : cap - 1] = '\0';
}

/* A price: a finite number >= 0. */
static bool get_price(const cJSON *v, const char *src, const char *place, xm_diag_t *d,
                      double *out) {
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0) {
    err(d, src, place, "must be a finite number >= 0 (US dollars per item)");
    return false;
  }
  *out = v->valuedouble;
  return true;
}

/* A speed key: a whole or decimal number of Gb/s, > 0, nothing else. */
static bool parse_speed(const char *key, double *out) {
  if (!key || !*key) return false;
  char *end = NULL;
  double g = strtod(key, &end);
  if (!end || *end != '\0' || !isfinite(g) || !(g > 0)) return false;
  for (const char *c = key; *c; c++)
    if (!strchr("0123456789.", *c)) return false; /* no signs, exponents, spaces */
  *out = g;
  return true;
}

static const char *const k_speed_items[] = {"nic_port", "transceiver", "switch_port",
                                            "copper_cable"};

static double *speed_item(xm_fab_speed_price_t *s, int i) {
  switch (i) {
  case 0: return &s->nic_port;
  case 1: return &s->transceiver;
  case 2: return &s->switch_port;
  default: return &s->copper_cable;
  }
}

static int find_speed(const xm_fab_prices_t *p, double g) {
  for (int i = 0; i < p->num_speeds; i++)
    if (p->speeds[i].gbps == g) return i;
  return -1;
}

/* Inserts a row for speed g (none there yet), keeping the rows ascending. */
static int insert_speed(xm_fab_prices_t *p, double g) {
  int at = 0;
  while (at < p->num_speeds && p->speeds[at].gbps < g)
    at++;
  memmove(&p->speeds[at + 1], &p->speeds[at], (size_t)(p->num_speeds - at) * sizeof p->speeds[0]);
  memset(&p->speeds[at], 0, sizeof p->speeds[at]);
  p->speeds[at].gbps = g;
  p->num_speeds++;
  return at;
}

static void read_speed(xm_fab_prices_t *p, const cJSON *row, const char *src, xm_diag_t *d) {
  char place[160];
  put_token(place, sizeof place, "/prices", row->string);
  double g = 0;
  if (!parse_speed(row->string, &g)) {
    err(d, src, place,
        "unknown member: /prices has link speeds in Gb/s (\"100\", \"400\", ...) and ocs_port, "
        "fibre, switch_chassis, ocs_chassis, comment");
    return;
  }
  if (!cJSON_IsObject(row)) {
    err(d, src, place,
        "must be an object of per-item prices (nic_port, transceiver, switch_port, "
        "copper_cable)");
    return;
  }
  int at = find_speed(p, g);
  bool added = at < 0;
  if (added && p->num_speeds >= XM_FAB_PRICE_SPEEDS_MAX) {
    err(d, src, place, "the price table holds at most %d link speeds", XM_FAB_PRICE_SPEEDS_MAX);
    return;
  }
  xm_fab_speed_price_t s;
  memset(&s, 0, sizeof s);
  if (!added) s = p->speeds[at];
  s.gbps = g;
  bool given[4] = {false, false, false, false};
  bool ok = true;
  for (const cJSON *m = row->child; m; m = m->next) {
    char ip[224];
    put_token(ip, sizeof ip, place, m->string);
    int i = 0;
    while (i < 4 && strcmp(m->string, k_speed_items[i]) != 0)
      i++;
    if (i == 4) {
      if (strcmp(m->string, "comment") == 0) continue;
      err(d, src, ip,
          "unknown member (a link speed's prices are nic_port, transceiver, switch_port, "
          "copper_cable)");
      ok = false;
      continue;
    }
    if (!get_price(m, src, ip, d, speed_item(&s, i))) ok = false;
    given[i] = true;
  }
  if (added)
    for (int i = 0; i < 4; i++)
      if (!given[i]) {
        err(d, src, place,
            "%s missing: %g Gb/s is not in the price table, so a new row gives all of "
            "nic_port, transceiver, switch_port, copper_cable",
            k_speed_items[i], g);
        ok = false;
      }
  if (!ok) return;
  if (added) at = insert_speed(p, g);
  p->speeds[at] = s;
}

static void read_prices(xm_fab_prices_t *p, const cJSON *root, const char *src, xm_diag_t *d) {
  if (!cJSON_IsObject(root)) {
    err(d, src, "", "must be a JSON object {\"prices\": {...}}");
    return;
  }
  const cJSON *prices = NULL;
  for (const cJSON *m = root->child; m; m = m->next) {
    if (strcmp(m->string, "prices") == 0) {
      prices = m;
    } else if (strcmp(m->string, "comment") != 0) {
      char place[160];
      put_token(place, sizeof place, "", m->string);
      err(d, src, place, "unknown member (a price file has prices and comment)");
    }
  }
  if (!prices) {
    err(d, src, "/prices", "missing: the object of prices to replace");
    return;
  }
  if (!cJSON_IsObject(prices)) {
    err(d, src, "/prices",
        "must be an object: link speeds (\"400\": {...}) and ocs_port, fibre, switch_chassis, "
        "ocs_chassis");
    return;
  }
  for (const cJSON *m = prices->child; m; m = m->next) {
    char place[160];
    put_token(place, sizeof place, "/prices", m->string);
    double *slot = strcmp(m->string, "ocs_port") == 0         ? &p->ocs_port
                   : strcmp(m->string, "fibre") == 0          ? &p->fibre
                   : strcmp(m->string, "switch_chassis") == 0 ? &p->switch_chassis
                   : strcmp(m->string, "ocs_chassis") == 0    ? &p->ocs_chassis
                                                              : NULL;
    if (slot)
      get_price(m, src, place, d, slot);
    else if (strcmp(m->string, "comment") != 0)
      read_speed(p, m, src, d);
  }
}

xm_status_t xm_fab_prices_load_text(const char *text, size_t len, const char *source,
                                    xm_fab_prices_t *p, xm_diag_t *diag) {
  source = source ? source : "prices";
  if (!text || memchr(text, '\0', len)) {
    err(diag, source, NULL, "not a text file (contains a NUL byte)");
    return XM_ERR_INVALID_INPUT;
  }
  char *buf = malloc(len + 1);
  if (!buf) return XM_ERR_NO_MEMORY;
  memcpy(buf, text, len);
  buf[len] = '\0';
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(buf, len + 1, &end, 1);
  int before = xm_diag_error_count(diag);
  if (!root) {
    size_t off = end && end >= buf && end <= buf + len ? (size_t)(end - buf) : len;
    int line, col;
    xm_text_line_col(buf, off, &line, &col);
    char place[48];
    snprintf(place, sizeof place, "%d:%d", line, col);
    err(diag, source, place, "JSON syntax error in the price file");
  } else {
    xm_fab_prices_t copy = *p;
    read_prices(&copy, root, source, diag);
    if (xm_diag_error_count(diag) == before) *p = copy;
  }
  cJSON_Delete(root);
  free(buf);
  return xm_diag_error_count(diag) > before ? XM_ERR_INVALID_INPUT : XM_OK;
}

xm_status_t xm_fab_prices_load_file(const char *path, xm_fab_prices_t *p, xm_diag_t *diag) {
  char *text = NULL;
  size_t len = 0;
  int e = xm_read_file(path, &text, &len);
  if (e != 0) {
    char why[160];
    xm_diag_add(diag, XM_DIAG_ERROR, path, NULL, "cannot read the price file: %s",
                xm_read_error(e, XM_READ_LIMIT_TEXT, why, sizeof why));
    return XM_ERR_IO;
  }
  xm_status_t st = xm_fab_prices_load_text(text, len, path, p, diag);
  free(text);
  return st;
}
