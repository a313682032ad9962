/* tests/unit/test_fabric_price.c — the price table of the network model
 * (fabric/price.c, docs/fabric-prices.md).
 *
 * A known bill of materials gives exact totals by category; a speed
 * between two rows is the power law of its neighbours; a speed outside the
 * table is refused; a price file replaces entries and adds speeds; every
 * malformed price file is refused at its JSON pointer and leaves the table
 * as it was.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fabric/price.h"

#define assert_near(a, b, tol)                                                                     \
  do {                                                                                             \
    double a_ = (double)(a), b_ = (double)(b);                                                     \
    if (!(fabs(a_ - b_) <= (tol))) fail_msg("%s = %.12g, expected %.12g", #a, a_, b_);             \
  } while (0)

static xm_fab_bom_t bom400(void) {
  return (xm_fab_bom_t){.link_gbps = 400,
                        .nic_ports = 16,
                        .switch_ports = 32,
                        .switches = 1,
                        .ocs_ports = 8,
                        .ocs_switches = 1,
                        .transceivers = 24,
                        .fibres = 12,
                        .copper_cables = 16};
}

static void test_default_table(void **state) {
  (void)state;
  xm_fab_prices_t p;
  xm_fab_prices_default(&p);
  assert_int_equal(p.num_speeds, 4);
  double speeds[] = {100, 200, 400, 800};
  for (int i = 0; i < 4; i++)
    assert_near(p.speeds[i].gbps, speeds[i], 0);
  /* the switch port is one box's price per Gb/s at every speed (breakout) */
  for (int i = 0; i < 4; i++)
    assert_near(p.speeds[i].switch_port / p.speeds[i].gbps, 3125.0 / 800.0, 1e-12);
  assert_near(p.speeds[2].transceiver, 700, 0);
  assert_near(p.speeds[3].transceiver, 1250, 0);
  assert_near(p.ocs_port, 500, 0);
  assert_near(p.fibre, 35, 0);
  assert_near(p.switch_chassis, 0, 0);
}

static void test_known_bom(void **state) {
  (void)state;
  xm_fab_prices_t p;
  xm_fab_prices_default(&p);
  xm_fab_bom_t b = bom400();
  xm_fab_price_breakdown_t br;
  double total = xm_fab_price(&b, &p, &br);
  assert_near(br.nic_ports, 16 * 1562.5, 0);
  assert_near(br.transceivers, 24 * 700, 0);
  assert_near(br.switch_ports, 32 * 1562.5, 0);
  assert_near(br.switches, 0, 0);
  assert_near(br.ocs_ports, 8 * 500, 0);
  assert_near(br.ocs_switches, 0, 0);
  assert_near(br.fibres, 12 * 35, 0);
  assert_near(br.copper_cables, 16 * 150, 0);
  assert_near(total, 98620, 0);
  assert_near(br.total, total, 0);
  /* at 100 Gb/s the same counts cost the 100 Gb/s row */
  b.link_gbps = 100;
  assert_near(xm_fab_price(&b, &p, NULL),
              16 * 390.625 + 24 * 100 + 32 * 390.625 + 8 * 500 + 12 * 35 + 16 * 60, 1e-9);
}

static void test_interpolation_and_range(void **state) {
  (void)state;
  xm_fab_prices_t p;
  xm_fab_prices_default(&p);
  xm_fab_speed_price_t s;
  assert_true(xm_fab_prices_at(&p, 300, &s));
  /* power law between the 200 and 400 rows */
  double t = log(300.0 / 200.0) / log(2.0);
  assert_near(s.transceiver, 265 * pow(700.0 / 265.0, t), 1e-9);
  assert_near(s.switch_port, 1171.875, 1e-9); /* linear per Gb/s stays linear */
  assert_near(s.copper_cable, 90 * pow(150.0 / 90.0, t), 1e-9);
  assert_true(xm_fab_prices_at(&p, 800, &s));
  assert_near(s.nic_port, 3125, 0);
  assert_false(xm_fab_prices_at(&p, 50, &s));
  assert_false(xm_fab_prices_at(&p, 1600, &s));
  assert_false(xm_fab_prices_at(&p, NAN, &s));
  xm_fab_bom_t b = bom400();
  b.link_gbps = 1600;
  xm_fab_price_breakdown_t br;
  assert_true(isnan(xm_fab_price(&b, &p, &br)));
  assert_true(isnan(br.transceivers));
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(xm_fab_prices_check_speed(&p, 1600, "--link-gbps", &d), XM_ERR_INVALID_INPUT);
  assert_int_equal(xm_diag_find(&d, "--link-gbps"), 0);
  assert_non_null(strstr(d.entries[0].message, "100 to 800"));
  assert_int_equal(xm_fab_prices_check_speed(&p, 250, "--link-gbps", &d), XM_OK);
  xm_diag_free(&d);
}

static char g_dir[] = "/tmp/xm_price_XXXXXX";

static int setup(void **state) {
  (void)state;
  return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
  return system(cmd) == 0 ? 0 : -1;
}

static const char *write_file(const char *name, const char *text) {
  static char path[256];
  snprintf(path, sizeof path, "%s/%s", g_dir, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  return path;
}

static void test_override_file(void **state) {
  (void)state;
  const char *path = write_file(
      "prices.json", "{\"comment\": \"quotes of 2025\",\n"
                     " \"prices\": {\"400\": {\"transceiver\": 650, \"comment\": \"x\"},\n"
                     "  \"1600\": {\"nic_port\": 5000, \"transceiver\": 2000,\n"
                     "            \"switch_port\": 6250, \"copper_cable\": 400},\n"
                     "  \"ocs_port\": 450, \"fibre\": 30, \"switch_chassis\": 1000}}\n");
  xm_fab_prices_t p;
  xm_fab_prices_default(&p);
  xm_diag_t d;
  xm_diag_init(&d);
  xm_status_t st = xm_fab_prices_load_file(path, &p, &d);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  assert_int_equal(xm_diag_error_count(&d), 0);
  assert_int_equal(p.num_speeds, 5);
  assert_near(p.speeds[4].gbps, 1600, 0);
  assert_near(p.speeds[2].transceiver, 650, 0);
  assert_near(p.speeds[2].nic_port, 1562.5, 0); /* not named: kept */
  assert_near(p.ocs_port, 450, 0);
  xm_fab_bom_t b = bom400();
  xm_fab_price_breakdown_t br;
  double total = xm_fab_price(&b, &p, &br);
  assert_near(br.transceivers, 24 * 650, 0);
  assert_near(br.switches, 1000, 0);
  assert_near(total, 16 * 1562.5 + 24 * 650 + 32 * 1562.5 + 1000 + 8 * 450 + 12 * 30 + 16 * 150,
              1e-9);
  /* the new row prices 1600 and everything between 800 and 1600 */
  xm_fab_speed_price_t s;
  assert_true(xm_fab_prices_at(&p, 1600, &s));
  assert_near(s.nic_port, 5000, 0);
  assert_true(xm_fab_prices_at(&p, 1200, &s));
  assert_near(s.switch_port, 3125 * 1.5, 1e-9);
  assert_near(s.transceiver, 1250 * pow(2000.0 / 1250.0, log(1.5) / log(2.0)), 1e-9);
  xm_diag_free(&d);
}

/* A price file that must be refused at `place`, naming the file, leaving
 * the table untouched. */
static void bad(const char *text, const char *place, const char *needle) {
  xm_fab_prices_t p, before;
  xm_fab_prices_default(&p);
  before = p;
  xm_diag_t d;
  xm_diag_init(&d);
  xm_status_t st = xm_fab_prices_load_text(text, strlen(text), "bad.json", &p, &d);
  if (st != XM_ERR_INVALID_INPUT) fail_msg("accepted: %s", text);
  assert_memory_equal(&p, &before, sizeof p);
  bool found = false;
  for (int i = 0; i < d.count && !found; i++) {
    const xm_diag_entry_t *e = &d.entries[i];
    bool at = e->place &&
              (strcmp(e->place, place) == 0 || (place[strlen(place) - 1] == '*' &&
                                                strncmp(e->place, place, strlen(place) - 1) == 0));
    found = at && e->file && strcmp(e->file, "bad.json") == 0 &&
            (!needle || strstr(e->message, needle));
  }
  if (!found) {
    xm_diag_print(&d, stderr);
    fail_msg("no error at %s for: %s", place, text);
  }
  assert_int_equal(xm_status_exit_code(st), 2);
  xm_diag_free(&d);
}

static void test_bad_files(void **state) {
  (void)state;
  bad("{\"prices\": {\"400\": {\"nic_prot\": 1}}}", "/prices/400/nic_prot", "unknown member");
  bad("{\"prices\": {\"400\": {\"nic_port\": -1}}}", "/prices/400/nic_port", ">= 0");
  bad("{\"prices\": {\"400\": {\"nic_port\": \"cheap\"}}}", "/prices/400/nic_port", NULL);
  bad("{\"prices\": {\"fast\": {}}}", "/prices/fast", "link speeds");
  bad("{\"prices\": {\"-400\": {}}}", "/prices/-400", NULL);
  bad("{\"prices\": {\"4e2\": {}}}", "/prices/4e2", NULL);
  bad("{\"prices\": {\"a/b\": {}}}", "/prices/a~1b", NULL);
  bad("{\"prices\": {\"400\": 5}}", "/prices/400", "object");
  bad("{\"prices\": {\"1600\": {\"nic_port\": 1}}}", "/prices/1600", "transceiver missing");
  bad("{\"prices\": {\"ocs_port\": null}}", "/prices/ocs_port", NULL);
  bad("{\"price\": {}}", "/price", "unknown member");
  bad("{\"price\": {}}", "/prices", "missing");
  bad("{\"prices\": [1]}", "/prices", "object");
  bad("[1]", "", "object");
  bad("{\"prices\": {\"400\": }", "1:*", "syntax");
  bad("{\n  \"prices\": {\n    \"400\": {\"transceiver\": 1,}\n  }\n}", "3:*", "syntax");
  /* a good entry beside a bad one is not applied either */
  bad("{\"prices\": {\"ocs_port\": 1, \"fibre\": -2}}", "/prices/fibre", NULL);
}

static void test_missing_file(void **state) {
  (void)state;
  xm_fab_prices_t p;
  xm_fab_prices_default(&p);
  xm_diag_t d;
  xm_diag_init(&d);
  char path[300];
  snprintf(path, sizeof path, "%s/none.json", g_dir);
  assert_int_equal(xm_fab_prices_load_file(path, &p, &d), XM_ERR_IO);
  assert_string_equal(d.entries[0].file, path);
  xm_diag_free(&d);
}

static void test_full_table(void **state) {
  (void)state;
  xm_fab_prices_t p;
  xm_fab_prices_default(&p);
  xm_diag_t d;
  xm_diag_init(&d);
  char text[4096] = "{\"prices\": {";
  for (int i = 0; i < XM_FAB_PRICE_SPEEDS_MAX - 4; i++) {
    char row[160];
    snprintf(row, sizeof row,
             "%s\"%d\": {\"nic_port\": 1, \"transceiver\": 2, \"switch_port\": 3, "
             "\"copper_cable\": 4}",
             i ? ", " : "", 1000 + i);
    strcat(text, row);
  }
  strcat(text, "}}");
  assert_int_equal(xm_fab_prices_load_text(text, strlen(text), "full.json", &p, &d), XM_OK);
  assert_int_equal(p.num_speeds, XM_FAB_PRICE_SPEEDS_MAX);
  for (int i = 1; i < p.num_speeds; i++)
    assert_true(p.speeds[i - 1].gbps < p.speeds[i].gbps);
  const char *more = "{\"prices\": {\"5000\": {\"nic_port\": 1, \"transceiver\": 2, "
                     "\"switch_port\": 3, \"copper_cable\": 4}}}";
  assert_int_equal(xm_fab_prices_load_text(more, strlen(more), "full.json", &p, &d),
                   XM_ERR_INVALID_INPUT);
  assert_true(xm_diag_find(&d, "/prices/5000") >= 0);
  xm_diag_free(&d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_default_table),
      cmocka_unit_test(test_known_bom),
      cmocka_unit_test(test_interpolation_and_range),
      cmocka_unit_test(test_override_file),
      cmocka_unit_test(test_bad_files),
      cmocka_unit_test(test_missing_file),
      cmocka_unit_test(test_full_table),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
