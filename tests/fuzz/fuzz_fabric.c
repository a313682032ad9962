/* tests/fuzz/fuzz_fabric.c — libFuzzer harness for the files the network
 * layer reads: a run's `--traffic` matrices and step log (fabric/traffic.h)
 * and a price file (fabric/price.h), what `xmoec fabric --traffic` and
 * `--prices` take.
 *
 * Every input is read as each of the three. Beyond "no crash, no leak, no
 * undefined behaviour" the harness checks the loaders' contracts: status
 * and diagnostics agree; a traffic file that loaded has records whose
 * matrices are world x world with finite entries >= 0 and a zero
 * diagonal; a step log's totals are the sums of its phases; a price table
 * that loaded keeps its speeds ascending with finite prices >= 0, and a
 * failed load leaves the table as it was. A violated contract aborts.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "fabric/price.h"
#include "fabric/traffic.h"
#include "support/diag.h"

#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fail(const char *what, const xm_diag_t *diag) {
  fprintf(stderr, "fuzz_fabric: contract violated: %s\n", what);
  xm_diag_print(diag, stderr);
  abort();
}

static void agree(xm_status_t st, const xm_diag_t *diag) {
  if (st == XM_OK && xm_diag_error_count(diag) != 0) fail("OK with errors", diag);
  if (st != XM_OK && xm_diag_error_count(diag) == 0) fail("failed without an error", diag);
}

static void traffic(const uint8_t *data, size_t size) {
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_fab_traffic_t *t = NULL;
  xm_status_t st = xm_fab_traffic_load_text((const char *)data, size, "fuzz", &diag, &t);
  agree(st, &diag);
  if (st != XM_OK && t) fail("failed but returned a traffic file", &diag);
  if (st == XM_OK) {
    if (!t || t->world < 1 || t->num_records < 1) fail("OK without records", &diag);
    for (int64_t i = 0; i < t->num_records; i++) {
      const xm_fab_matrix_t *m = &t->records[i].bytes;
      if (m->n != t->world) fail("a matrix that is not world x world", &diag);
      for (int64_t a = 0; a < m->n; a++)
        for (int64_t b = 0; b < m->n; b++) {
          double v = m->v[a * m->n + b];
          if (!isfinite(v) || v < 0 || (a == b && v != 0)) fail("a bad matrix entry", &diag);
        }
    }
  }
  xm_fab_traffic_free(t);
  xm_diag_free(&diag);
}

static void step_log(const uint8_t *data, size_t size) {
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_fab_step_log_t *l = NULL;
  xm_status_t st = xm_fab_step_log_load_text((const char *)data, size, "fuzz", &diag, &l);
  agree(st, &diag);
  if (st != XM_OK && l) fail("failed but returned a log", &diag);
  for (int64_t i = 0; st == XM_OK && i < l->num_steps; i++) {
    const xm_fab_step_traffic_t *s = &l->steps[i];
    double in = 0, out = 0;
    for (int p = 0; p < XM_RT_PHASE_COUNT; p++)
      in += s->intra[p], out += s->inter[p];
    if (in != s->intra_bytes || out != s->inter_bytes) fail("totals that are not the sums", &diag);
  }
  xm_fab_step_log_free(l);
  xm_diag_free(&diag);
}

static bool same_prices(const xm_fab_prices_t *a, const xm_fab_prices_t *b) {
  if (a->num_speeds != b->num_speeds || a->ocs_port != b->ocs_port || a->fibre != b->fibre ||
      a->switch_chassis != b->switch_chassis || a->ocs_chassis != b->ocs_chassis)
    return false;
  for (int i = 0; i < a->num_speeds; i++) {
    const xm_fab_speed_price_t *x = &a->speeds[i], *y = &b->speeds[i];
    if (x->gbps != y->gbps || x->nic_port != y->nic_port || x->transceiver != y->transceiver ||
        x->switch_port != y->switch_port || x->copper_cable != y->copper_cable)
      return false;
  }
  return true;
}

static void prices(const uint8_t *data, size_t size) {
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_fab_prices_t p, before;
  xm_fab_prices_default(&p);
  before = p;
  xm_status_t st = xm_fab_prices_load_text((const char *)data, size, "fuzz", &p, &diag);
  agree(st, &diag);
  if (st != XM_OK && !same_prices(&p, &before)) fail("a failed load changed the table", &diag);
  if (p.num_speeds < 1 || p.num_speeds > XM_FAB_PRICE_SPEEDS_MAX) fail("bad row count", &diag);
  for (int i = 0; i < p.num_speeds; i++) {
    const xm_fab_speed_price_t *r = &p.speeds[i];
    if (i > 0 && !(r->gbps > p.speeds[i - 1].gbps)) fail("speeds not ascending", &diag);
    double v[] = {r->nic_port, r->transceiver, r->switch_port, r->copper_cable};
    for (size_t k = 0; k < sizeof v / sizeof v[0]; k++)
      if (!isfinite(v[k]) || v[k] < 0) fail("a bad price", &diag);
  }
  xm_diag_free(&diag);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  traffic(data, size);
  step_log(data, size);
  prices(data, size);
  return 0;
}
