/* tests/unit/test_placement.c — expert placement (planner/placement.h,
 * planner/placement.c, planner/place.c; docs/placement.md).
 *
 * Placement files: a hand-written file reads back its experts, nodes, rows
 * and slots (rows sorted by layer), formats and reads again to the same
 * placement, writes through a file and loads back; every malformed file is
 * refused with XM_ERR_INVALID_INPUT at its JSON pointer (or line:column for a
 * syntax error) and a missing file with XM_ERR_IO. Checking against a spec:
 * a wrong expert count, a dense or missing layer and, with group-limited
 * routing, a slot group mixing expert groups are refused; permutations
 * inside the groups, whole-group moves and the MTP module's layer pass.
 * Routing statistics: a hand-written file of 8 experts, top-2, reads back
 * every value; wrong sizes, ids out of range, asymmetric or impossible
 * co-selection, a nonzero diagonal, more samples than tokens, a token
 * picking an expert twice and a layer given twice are each refused at their
 * pointer. The prediction is checked against counts done by hand, for the
 * identity and for a permutation, with and without the tokens' source
 * nodes. The search: planted pairs of experts end up on one block with the
 * hand-counted RBD rows, an identity that is already optimal is kept, runs
 * are deterministic, groups stay whole, and bad options are refused.
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

#include <cjson/cJSON.h>

#include "frontend/spec.h"
#include "planner/placement.h"
#include "support/diag.h"
#include "support/strbuf.h"

#define assert_near(a, b, tol)                                                                     \
  do {                                                                                             \
    double a_ = (double)(a), b_ = (double)(b);                                                     \
    if (!(fabs(a_ - b_) <= (tol))) fail_msg("%s = %.12g, expected %.12g", #a, a_, b_);             \
  } while (0)

static char g_dir[] = "/tmp/xm_placement_XXXXXX";

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

/* ---- helpers -------------------------------------------------------------------- */

/* The printed diagnostics (owned by the caller). */
static char *printed(const xm_diag_t *d) {
  char *buf = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&buf, &n);
  assert_non_null(f);
  xm_diag_print(d, f);
  fclose(f);
  return buf;
}

/* Fails unless an error sits at `place` with `needle` in its message, and the
 * printed diagnostics show "place: " too. */
static void expect_error_at(const xm_diag_t *d, const char *place, const char *needle) {
  char *text = printed(d);
  bool found = false;
  for (int i = 0; i < d->count && !found; i++) {
    const xm_diag_entry_t *e = &d->entries[i];
    found = e->level == XM_DIAG_ERROR && e->place && strcmp(e->place, place) == 0 &&
            strstr(e->message, needle) != NULL;
  }
  char shown[256];
  snprintf(shown, sizeof shown, "%s: ", place);
  if (!found || !strstr(text, shown)) {
    fprintf(stderr, "no error at '%s' saying '%s' in:\n%s", place, needle, text);
    free(text);
    fail();
  }
  free(text);
}

/* Fails unless an error names `file` (an option such as "--nodes") and says
 * `needle`. */
static void expect_error_in(const xm_diag_t *d, const char *file, const char *needle) {
  for (int i = 0; i < d->count; i++) {
    const xm_diag_entry_t *e = &d->entries[i];
    if (e->level == XM_DIAG_ERROR && e->file && strcmp(e->file, file) == 0 &&
        strstr(e->message, needle))
      return;
  }
  char *text = printed(d);
  fprintf(stderr, "no error of '%s' saying '%s' in:\n%s", file, needle, text);
  free(text);
  fail();
}

/* `text` with its one occurrence of `from` replaced by `to` (owned by the
 * caller); fails when `from` is missing or occurs more than once. */
static char *replaced(const char *text, const char *from, const char *to) {
  const char *at = strstr(text, from);
  if (!at) fail_msg("'%s' is not in the text", from);
  if (strstr(at + 1, from)) fail_msg("'%s' occurs more than once", from);
  size_t n = strlen(text), nf = strlen(from), nt = strlen(to);
  char *out = malloc(n - nf + nt + 1);
  assert_non_null(out);
  size_t head = (size_t)(at - text);
  memcpy(out, text, head);
  memcpy(out + head, to, nt);
  memcpy(out + head + nt, at + nf, n - head - nf + 1);
  return out;
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

static void load_spec(const char *path, xm_spec_t *spec) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_status_t st = xm_spec_load_file(path, &d, spec);
  if (st != XM_OK || xm_diag_error_count(&d)) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  assert_int_equal(xm_diag_error_count(&d), 0);
  xm_diag_free(&d);
}

/* A placement of `rows` rows of `experts` slots, as xm_placement_parse would
 * give it (every array owned). */
static xm_placement_t make_placement(int64_t experts, int64_t rows, const int64_t *layer,
                                     const int32_t *slots) {
  xm_placement_t p = {.experts = experts, .rows = rows};
  p.source = strdup("made.json");
  p.layer = malloc((size_t)rows * sizeof *p.layer);
  p.slots = malloc((size_t)(rows * experts) * sizeof *p.slots);
  assert_non_null(p.source);
  assert_true(p.layer && p.slots);
  memcpy(p.layer, layer, (size_t)rows * sizeof *p.layer);
  memcpy(p.slots, slots, (size_t)(rows * experts) * sizeof *p.slots);
  return p;
}

/* Whether row r of p is a permutation of 0..E-1. */
static bool row_is_permutation(const xm_placement_t *p, int64_t r) {
  bool seen[64] = {false};
  if (p->experts > 64) return false;
  for (int64_t q = 0; q < p->experts; q++) {
    int32_t e = p->slots[r * p->experts + q];
    if (e < 0 || e >= p->experts || seen[e]) return false;
    seen[e] = true;
  }
  return true;
}

/* The node block (of E / nodes slots) that row r puts expert e in. */
static int64_t block_of(const xm_placement_t *p, int64_t r, int32_t e, int64_t nodes) {
  for (int64_t q = 0; q < p->experts; q++)
    if (p->slots[r * p->experts + q] == e) return q / (p->experts / nodes);
  fail_msg("expert %d is in no slot of row %lld", e, (long long)r);
  return -1;
}

/* ---- placement files -------------------------------------------------------------- */

/* Two rows given out of layer order: the struct holds them ascending. */
static const char k_placement[] =
    "{\"format\": \"xmoec-placement\", \"version\": 1, \"experts\": 8, \"nodes\": 2,\n"
    " \"layers\": [{\"layer\": 3, \"slots\": [0, 1, 2, 3, 4, 5, 6, 7]},\n"
    "            {\"layer\": 1, \"slots\": [4, 0, 5, 1, 6, 2, 7, 3]}],\n"
    " \"predicted\": {\"total\": {\"rbd_drop\": 0.5}}, \"comment\": \"hand-written\"}\n";

static void assert_same_placement(const xm_placement_t *a, const xm_placement_t *b) {
  assert_int_equal(a->experts, b->experts);
  assert_int_equal(a->nodes, b->nodes);
  assert_int_equal(a->rows, b->rows);
  for (int64_t r = 0; r < a->rows; r++) {
    assert_int_equal(a->layer[r], b->layer[r]);
    for (int64_t q = 0; q < a->experts; q++)
      assert_int_equal(a->slots[r * a->experts + q], b->slots[r * b->experts + q]);
  }
}

static void test_placement_parse(void **state) {
  (void)state;
  xm_diag_t d;
  xm_diag_init(&d);
  xm_placement_t p;
  xm_status_t st = xm_placement_parse(k_placement, strlen(k_placement), "hand.json", &d, &p);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  assert_int_equal(d.count, 0);
  assert_string_equal(p.source, "hand.json");
  assert_int_equal(p.experts, 8);
  assert_int_equal(p.nodes, 2);
  assert_int_equal(p.rows, 2);
  assert_int_equal(p.layer[0], 1);
  assert_int_equal(p.layer[1], 3);
  static const int32_t want[2][8] = {{4, 0, 5, 1, 6, 2, 7, 3}, {0, 1, 2, 3, 4, 5, 6, 7}};
  for (int r = 0; r < 2; r++)
    for (int q = 0; q < 8; q++)
      assert_int_equal(p.slots[r * 8 + q], want[r][q]);
  assert_false(xm_placement_row_is_identity(&p, 0));
  assert_true(xm_placement_row_is_identity(&p, 1));

  /* Formatted and read again: the same placement, "predicted" kept as text. */
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  xm_placement_format(&p, "{\"total\": {\"rbd_drop\": 0.25}}", &b);
  const char *text = xm_strbuf_cstr(&b);
  assert_non_null(strstr(text, "\"format\": \"xmoec-placement\""));
  assert_non_null(strstr(text, "\"nodes\": 2"));
  assert_non_null(strstr(text, "\"predicted\": {\"total\": {\"rbd_drop\": 0.25}}"));
  xm_placement_t q;
  st = xm_placement_parse(text, b.len, "again.json", &d, &q);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  assert_same_placement(&p, &q);
  assert_false(xm_placement_row_is_identity(&q, 0));
  assert_true(xm_placement_row_is_identity(&q, 1));
  xm_placement_free(&q);

  /* Without nodes and predicted: neither is written, nodes reads back 0. */
  p.nodes = 0;
  xm_strbuf_clear(&b);
  xm_placement_format(&p, NULL, &b);
  text = xm_strbuf_cstr(&b);
  assert_null(strstr(text, "\"nodes\""));
  assert_null(strstr(text, "\"predicted\""));
  st = xm_placement_parse(text, b.len, "bare.json", &d, &q);
  assert_int_equal(st, XM_OK);
  assert_same_placement(&p, &q);
  xm_placement_free(&q);

  /* Through a file: written whole, loaded back with the path as its source. */
  char path[256];
  snprintf(path, sizeof path, "%s/placement.json", g_dir);
  assert_int_equal(xm_placement_write(path, &p, "{\"x\": 1}\n", &d), XM_OK);
  st = xm_placement_load(path, &d, &q);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  assert_string_equal(q.source, path);
  assert_same_placement(&p, &q);
  xm_placement_free(&q);
  assert_int_equal(xm_diag_error_count(&d), 0);

  /* A folder that does not exist cannot be written: XM_ERR_IO naming the path. */
  snprintf(path, sizeof path, "%s/no/such/dir/placement.json", g_dir);
  assert_int_equal(xm_placement_write(path, &p, NULL, &d), XM_ERR_IO);
  assert_int_equal(xm_diag_error_count(&d), 1);
  assert_string_equal(d.entries[d.count - 1].file, path);

  /* No rows at all is a valid placement (every layer keeps the identity). */
  static const char empty[] =
      "{\"format\": \"xmoec-placement\", \"version\": 1, \"experts\": 4, \"layers\": []}";
  st = xm_placement_parse(empty, strlen(empty), NULL, &d, &q);
  assert_int_equal(st, XM_OK);
  assert_int_equal(q.experts, 4);
  assert_int_equal(q.rows, 0);
  assert_int_equal(q.nodes, 0);
  xm_placement_free(&q);
  xm_placement_free(&q); /* safe twice: the struct is zeroed */

  xm_strbuf_free(&b);
  xm_placement_free(&p);
  xm_diag_free(&d);
}

/* Parses `text`, expecting a refusal at `place` saying `needle`, and an empty
 * placement. */
static void expect_placement_refused(const char *text, const char *place, const char *needle) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_placement_t p;
  memset(&p, 0x5a, sizeof p);
  xm_status_t st = xm_placement_parse(text, strlen(text), "bad.json", &d, &p);
  if (st != XM_ERR_INVALID_INPUT) fail_msg("status %d for:\n%s", (int)st, text);
  assert_true(xm_diag_error_count(&d) >= 1);
  expect_error_at(&d, place, needle);
  assert_string_equal(d.entries[0].file, "bad.json");
  assert_null(p.source);
  assert_null(p.layer);
  assert_null(p.slots);
  assert_int_equal(p.rows, 0);
  assert_int_equal(p.experts, 0);
  xm_placement_free(&p);
  xm_diag_free(&d);
}

static void test_placement_refusals(void **state) {
  (void)state;
  /* A syntax error at line:column: the second ',' on line 3 is column 16. */
  expect_placement_refused("{\"format\": \"xmoec-placement\",\n"
                           "  \"version\": 1,\n"
                           "  \"experts\": 8,,\n"
                           "  \"layers\": []}",
                           "3:16", "JSON syntax error: expected a member name");
  expect_placement_refused("[1, 2]", "", "must be a JSON object");
  char *t = replaced(k_placement, "\"xmoec-placement\"", "\"xmoec-routing-stats\"");
  expect_placement_refused(t, "/format", "must be \"xmoec-placement\"");
  free(t);
  t = replaced(k_placement, "\"version\": 1", "\"version\": 2");
  expect_placement_refused(t, "/version", "unsupported version");
  free(t);
  t = replaced(k_placement, "\"comment\"", "\"colour\"");
  expect_placement_refused(t, "/colour", "unknown member");
  free(t);
  t = replaced(k_placement, "\"layer\": 3, \"slots\"", "\"layer\": 3, \"slot\"");
  expect_placement_refused(t, "/layers/0/slot", "unknown member");
  free(t);
  t = replaced(k_placement, "\"experts\": 8", "\"experts\": 0");
  expect_placement_refused(t, "/experts", "must be a whole number in [1, ");
  free(t);
  t = replaced(k_placement, "\"experts\": 8", "\"experts\": -3");
  expect_placement_refused(t, "/experts", "must be a whole number in [1, ");
  free(t);
  /* Expert 6 at slots 0 and 4, expert 4 nowhere: named at the second place. */
  t = replaced(k_placement, "[4, 0, 5, 1, 6, 2, 7, 3]", "[6, 0, 5, 1, 6, 2, 7, 3]");
  expect_placement_refused(t, "/layers/1/slots/4",
                           "expert 6 is given twice (also at slot 0) and expert 4 is missing");
  free(t);
  t = replaced(k_placement, "[4, 0, 5, 1, 6, 2, 7, 3]", "[4, 0, 5, 1, 6, 2, 8, 3]");
  expect_placement_refused(t, "/layers/1/slots/6", "must be a whole number in [0, 7]");
  free(t);
  t = replaced(k_placement, "[4, 0, 5, 1, 6, 2, 7, 3]", "[4, 0, 5, 1, 6, 2, 7]");
  expect_placement_refused(t, "/layers/1/slots", "has 7 values, expected 8");
  free(t);
  /* A layer given twice: named at its second place in the file. */
  t = replaced(k_placement, "{\"layer\": 1,", "{\"layer\": 3,");
  expect_placement_refused(t, "/layers/1/layer", "layer 3 is given twice (also at /layers/0)");
  free(t);
  t = replaced(k_placement, "\"nodes\": 2", "\"nodes\": 9");
  expect_placement_refused(t, "/nodes", "must be a whole number in [1, 8]");
  free(t);
  t = replaced(k_placement, "{\"layer\": 1,", "{\"layer\": -1,");
  expect_placement_refused(t, "/layers/1/layer", "must be a whole number");
  free(t);

  /* A file that is not there: XM_ERR_IO naming the path. */
  xm_diag_t d;
  xm_diag_init(&d);
  xm_placement_t p;
  char path[256];
  snprintf(path, sizeof path, "%s/missing.json", g_dir);
  assert_int_equal(xm_placement_load(path, &d, &p), XM_ERR_IO);
  assert_int_equal(xm_diag_error_count(&d), 1);
  assert_string_equal(d.entries[0].file, path);
  assert_non_null(strstr(d.entries[0].message, "cannot read the placement file"));
  assert_null(p.slots);
  xm_placement_free(&p);
  xm_diag_free(&d);
}

/* ---- placements against specs -------------------------------------------------- */

/* Checks p against spec: the status, and when refused, an error at `place`
 * saying `needle`. */
static void check_against(const xm_placement_t *p, const xm_spec_t *spec, xm_status_t want,
                          const char *place, const char *needle) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_status_t st = xm_placement_check(p, spec, &d);
  if (st != want) {
    xm_diag_print(&d, stderr);
    fail_msg("xm_placement_check gave %d, expected %d", (int)st, (int)want);
  }
  if (want == XM_OK) {
    assert_int_equal(xm_diag_error_count(&d), 0);
  } else {
    expect_error_at(&d, place, needle);
    assert_string_equal(d.entries[0].file, "made.json");
  }
  xm_diag_free(&d);
}

static void test_placement_check(void **state) {
  (void)state;
  /* samples/tiny.json: 4 layers, layer 0 dense, 16 experts, no groups. */
  xm_spec_t tiny;
  load_spec(XM_SOURCE_DIR "/samples/tiny.json", &tiny);
  assert_int_equal(tiny.moe.experts, 16);
  assert_int_equal(tiny.model.first_k_dense, 1);
  int32_t rev[3 * 16];
  for (int r = 0; r < 3; r++)
    for (int q = 0; q < 16; q++)
      rev[r * 16 + q] = 15 - q;
  int64_t moe_layers[3] = {1, 2, 3};
  xm_placement_t p = make_placement(16, 3, moe_layers, rev);
  check_against(&p, &tiny, XM_OK, NULL, NULL);
  xm_placement_free(&p);

  int32_t ident8[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  int64_t one[1] = {1};
  p = make_placement(8, 1, one, ident8);
  check_against(&p, &tiny, XM_ERR_INVALID_INPUT, "/experts",
                "the placement is for 8 routed experts, the model has 16");
  xm_placement_free(&p);

  int64_t dense[1] = {0};
  p = make_placement(16, 1, dense, rev);
  check_against(&p, &tiny, XM_ERR_INVALID_INPUT, "/layers", "layer 0 is a dense layer");
  xm_placement_free(&p);

  int64_t beyond[1] = {4};
  p = make_placement(16, 1, beyond, rev);
  check_against(&p, &tiny, XM_ERR_INVALID_INPUT, "/layers", "layer 4: the model has 4 layers");
  xm_placement_free(&p);

  /* samples/deepseek-v3-mini.json: 16 experts in n_group 4 groups of 4,
   * layer 0 dense, layers 1..3 MoE and the MTP module's layer 4. */
  xm_spec_t ds;
  load_spec(XM_SOURCE_DIR "/samples/deepseek-v3-mini.json", &ds);
  assert_int_equal(ds.moe.experts, 16);
  assert_int_equal(ds.moe.n_group, 4);
  assert_int_equal(ds.model.mtp_layers, 1);
  /* Experts 3 and 4 swapped: slot group 0 holds expert 4 of group 1. */
  int32_t cross[16];
  for (int q = 0; q < 16; q++)
    cross[q] = q;
  cross[3] = 4;
  cross[4] = 3;
  p = make_placement(16, 1, one, cross);
  check_against(&p, &ds, XM_ERR_INVALID_INPUT, "/layers",
                "layer 1: slot group 0 (slots 0..3) holds expert 0 of expert group 0 and expert 4 "
                "of group 1");
  xm_placement_free(&p);
  /* The same swap is fine without groups. */
  p = make_placement(16, 1, one, cross);
  check_against(&p, &tiny, XM_OK, NULL, NULL);
  xm_placement_free(&p);
  /* Inside the groups (each reversed) and whole groups moved (2, 0, 3, 1),
   * on every MoE layer including the MTP module's. */
  static const int32_t within[16] = {3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12};
  static const int32_t groups[16] = {8, 9, 10, 11, 0, 1, 2, 3, 12, 13, 14, 15, 4, 5, 6, 7};
  static const int32_t both[16] = {9, 8, 11, 10, 2, 3, 1, 0, 15, 12, 13, 14, 4, 7, 6, 5};
  int32_t rows[4 * 16];
  memcpy(rows, within, sizeof within);
  memcpy(rows + 16, groups, sizeof groups);
  memcpy(rows + 32, both, sizeof both);
  memcpy(rows + 48, within, sizeof within);
  int64_t ds_layers[4] = {1, 2, 3, 4};
  p = make_placement(16, 4, ds_layers, rows);
  check_against(&p, &ds, XM_OK, NULL, NULL);
  xm_placement_free(&p);
  int64_t five[1] = {5};
  p = make_placement(16, 1, five, within);
  check_against(&p, &ds, XM_ERR_INVALID_INPUT, "/layers",
                "layer 5: the model has 4 layers and MTP modules (0..4)");
  xm_placement_free(&p);
  p = make_placement(16, 1, dense, within);
  check_against(&p, &ds, XM_ERR_INVALID_INPUT, "/layers", "layer 0 is a dense layer");
  xm_placement_free(&p);
}

/* ---- routing statistics files ---------------------------------------------------- */

/* Six sampled tokens of 8 experts, top-2, on 2 nodes (all of the layer's
 * tokens), their source nodes and picks:
 *   t0 node 0 {0, 1}   t1 node 0 {0, 4}   t2 node 1 {1, 5}
 *   t3 node 1 {2, 3}   t4 node 1 {6, -}   t5 node 0 {4, 6}
 * Loads: 0:2 1:2 2:1 3:1 4:2 5:1 6:2 7:0 (11 kept slots); co-selected pairs
 * (0,1) (0,4) (1,5) (2,3) (4,6), once each. */
#define STATS_HEAD                                                                                 \
  "{\"format\": \"xmoec-routing-stats\", \"version\": 1, \"model\": \"place-test\",\n"             \
  " \"experts\": 8, \"top_k\": 2,\n"                                                               \
  " \"layout\": {\"world\": 4, \"ep\": 4, \"ranks_per_node\": 2, \"nodes\": 2},\n"                 \
  " \"placed\": false, \"steps\": 3, \"sample_cap\": 64,\n"                                        \
  " \"layers\": ["
#define STATS_LAYER(layer)                                                                         \
  "{\"layer\": " #layer ", \"tokens\": 6,\n"                                                       \
  "   \"load\": [2, 2, 1, 1, 2, 1, 2, 0],\n"                                                       \
  "   \"coselect\": [\n"                                                                           \
  "     0, 1, 0, 0, 1, 0, 0, 0,\n"                                                                 \
  "     1, 0, 0, 0, 0, 1, 0, 0,\n"                                                                 \
  "     0, 0, 0, 1, 0, 0, 0, 0,\n"                                                                 \
  "     0, 0, 1, 0, 0, 0, 0, 0,\n"                                                                 \
  "     1, 0, 0, 0, 0, 0, 1, 0,\n"                                                                 \
  "     0, 1, 0, 0, 0, 0, 0, 0,\n"                                                                 \
  "     0, 0, 0, 0, 1, 0, 0, 0,\n"                                                                 \
  "     0, 0, 0, 0, 0, 0, 0, 0],\n"                                                                \
  "   \"samples\": 6, \"sample_node\": [0, 0, 1, 1, 1, 0],\n"                                      \
  "   \"sample_experts\": [0, 1, 0, 4, 1, 5, 2, 3, 6, -1, 4, 6]}"
#define STATS_TAIL "]}\n"

static const char k_stats[] = STATS_HEAD STATS_LAYER(1) STATS_TAIL;

static void parse_stats_ok(const char *text, xm_routing_stats_t *s) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_status_t st = xm_routing_stats_parse(text, strlen(text), "stats.json", &d, s);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  assert_int_equal(xm_diag_error_count(&d), 0);
  xm_diag_free(&d);
}

static void test_stats_parse(void **state) {
  (void)state;
  xm_routing_stats_t s;
  parse_stats_ok(k_stats, &s);
  assert_string_equal(s.source, "stats.json");
  assert_string_equal(s.model, "place-test");
  assert_int_equal(s.experts, 8);
  assert_int_equal(s.top_k, 2);
  assert_int_equal(s.world, 4);
  assert_int_equal(s.ep, 4);
  assert_int_equal(s.ranks_per_node, 2);
  assert_int_equal(s.nodes, 2);
  assert_false(s.placed);
  assert_int_equal(s.steps, 3);
  assert_int_equal(s.sample_cap, 64);
  assert_int_equal(s.num_layers, 1);
  const xm_routing_stats_layer_t *l = &s.layers[0];
  assert_int_equal(l->layer, 1);
  assert_int_equal(l->index, 0);
  assert_int_equal(l->tokens, 6);
  static const int64_t load[8] = {2, 2, 1, 1, 2, 1, 2, 0};
  for (int e = 0; e < 8; e++)
    assert_int_equal(l->load[e], load[e]);
  int64_t pairs = 0;
  for (int a = 0; a < 8; a++)
    for (int b = 0; b < 8; b++)
      pairs += l->coselect[a * 8 + b];
  assert_int_equal(pairs, 10); /* five pairs, each counted both ways */
  assert_int_equal(l->coselect[0 * 8 + 4], 1);
  assert_int_equal(l->coselect[4 * 8 + 0], 1);
  assert_int_equal(l->coselect[6 * 8 + 4], 1);
  assert_int_equal(l->coselect[1 * 8 + 4], 0);
  assert_int_equal(l->samples, 6);
  static const int32_t node[6] = {0, 0, 1, 1, 1, 0};
  static const int32_t ids[12] = {0, 1, 0, 4, 1, 5, 2, 3, 6, -1, 4, 6};
  for (int t = 0; t < 6; t++)
    assert_int_equal(l->sample_node[t], node[t]);
  for (int i = 0; i < 12; i++)
    assert_int_equal(l->sample_experts[i], ids[i]);
  xm_routing_stats_free(&s);
  xm_routing_stats_free(&s); /* safe twice */

  /* Optional members left out: steps and sample_cap read -1, model "". */
  char *t = replaced(k_stats, " \"placed\": false, \"steps\": 3, \"sample_cap\": 64,\n", "");
  char *u = replaced(t, "\"model\": \"place-test\",", "");
  parse_stats_ok(u, &s);
  assert_int_equal(s.steps, -1);
  assert_int_equal(s.sample_cap, -1);
  assert_string_equal(s.model, "");
  xm_routing_stats_free(&s);
  free(u);
  free(t);

  /* Two layers out of order: held ascending, each with its place in the file. */
  static const char two[] = STATS_HEAD STATS_LAYER(3) ",\n" STATS_LAYER(1) STATS_TAIL;
  parse_stats_ok(two, &s);
  assert_int_equal(s.num_layers, 2);
  assert_int_equal(s.layers[0].layer, 1);
  assert_int_equal(s.layers[0].index, 1);
  assert_int_equal(s.layers[1].layer, 3);
  assert_int_equal(s.layers[1].index, 0);
  xm_routing_stats_free(&s);

  /* Through a file, and a file that is not there. */
  const char *path = write_file("stats.json", k_stats);
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(xm_routing_stats_load(path, &d, &s), XM_OK);
  assert_string_equal(s.source, path);
  assert_int_equal(s.layers[0].samples, 6);
  xm_routing_stats_free(&s);
  char missing[256];
  snprintf(missing, sizeof missing, "%s/missing-stats.json", g_dir);
  assert_int_equal(xm_routing_stats_load(missing, &d, &s), XM_ERR_IO);
  assert_int_equal(xm_diag_error_count(&d), 1);
  assert_string_equal(d.entries[0].file, missing);
  assert_null(s.layers);
  xm_diag_free(&d);
}

static void expect_stats_refused(const char *text, const char *place, const char *needle) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_routing_stats_t s;
  memset(&s, 0x5a, sizeof s);
  xm_status_t st = xm_routing_stats_parse(text, strlen(text), "bad-stats.json", &d, &s);
  if (st != XM_ERR_INVALID_INPUT) fail_msg("status %d for:\n%s", (int)st, text);
  expect_error_at(&d, place, needle);
  assert_string_equal(d.entries[0].file, "bad-stats.json");
  assert_null(s.layers);
  assert_null(s.source);
  assert_null(s.model);
  assert_int_equal(s.num_layers, 0);
  xm_routing_stats_free(&s);
  xm_diag_free(&d);
}

/* Refuses k_stats with `from` replaced by `to`. */
static void expect_edit_refused(const char *from, const char *to, const char *place,
                                const char *needle) {
  char *t = replaced(k_stats, from, to);
  expect_stats_refused(t, place, needle);
  free(t);
}

static void test_stats_refusals(void **state) {
  (void)state;
  /* Syntax: the missing ',' before "experts" on line 2 (column 15). */
  expect_stats_refused("{\"format\": \"xmoec-routing-stats\",\n \"version\": 1 \"experts\": 8}",
                       "2:15", "JSON syntax error: expected ',' or '}' in an object");
  expect_edit_refused("\"xmoec-routing-stats\"", "\"xmoec-placement\"", "/format",
                      "must be \"xmoec-routing-stats\"");
  expect_edit_refused("\"version\": 1", "\"version\": 0", "/version", "unsupported version");
  expect_edit_refused("\"top_k\": 2", "\"top_k\": 9", "/top_k", "must be a whole number in [1, 8]");
  expect_edit_refused("\"samples\": 6,", "\"samples\": 6, \"weights\": [],", "/layers/0/weights",
                      "unknown member");
  expect_edit_refused("\"nodes\": 2}", "\"nodes\": 8}", "/layout/nodes", "(8) exceeds /layout/ep");
  /* Sizes: E loads, E x E counts, one node per sample, k ids per sample. */
  expect_edit_refused("[2, 2, 1, 1, 2, 1, 2, 0]", "[2, 2, 1, 1, 2, 1, 2]", "/layers/0/load",
                      "has 7 values, expected 8");
  expect_edit_refused("     0, 0, 0, 0, 0, 0, 0, 0]", "     0, 0, 0, 0, 0, 0, 0]",
                      "/layers/0/coselect", "has 63 values, expected 64");
  expect_edit_refused("[0, 0, 1, 1, 1, 0]", "[0, 0, 1, 1, 1]", "/layers/0/sample_node",
                      "has 5 values, expected 6");
  expect_edit_refused("6, -1, 4, 6]", "6, -1, 4]", "/layers/0/sample_experts",
                      "has 11 values, expected 12");
  /* Ranges: ids in [-1, E), nodes below layout.nodes. */
  expect_edit_refused("2, 3, 6, -1", "2, 3, 8, -1", "/layers/0/sample_experts/8",
                      "must be a whole number in [-1, 7]");
  expect_edit_refused("2, 3, 6, -1", "2, 3, 6, -2", "/layers/0/sample_experts/9",
                      "must be a whole number in [-1, 7]");
  expect_edit_refused("[0, 0, 1, 1, 1, 0]", "[0, 0, 2, 1, 1, 0]", "/layers/0/sample_node/2",
                      "must be a whole number in [0, 1]");
  expect_edit_refused("[2, 2, 1, 1, 2, 1, 2, 0]", "[2, 2, 1, 1, 7, 1, 2, 0]", "/layers/0/load/4",
                      "(7) exceeds tokens (6)");
  /* Co-selection: symmetric, a zero diagonal, within the loads. */
  expect_edit_refused("     1, 0, 0, 0, 0, 1, 0, 0,", "     0, 0, 0, 0, 0, 1, 0, 0,",
                      "/layers/0/coselect/1", "(1) differs from [8] (0): the counts are symmetric");
  expect_edit_refused("     0, 0, 0, 1, 0, 0, 0, 0,", "     0, 0, 1, 1, 0, 0, 0, 0,",
                      "/layers/0/coselect/18", "must be 0: the diagonal counts no pair");
  expect_edit_refused("[2, 2, 1, 1, 2, 1, 2, 0]", "[2, 2, 0, 1, 2, 1, 2, 0]",
                      "/layers/0/coselect/19", "exceeds the load of expert 2 or 3");
  /* Samples: no more than the tokens; a token's experts distinct. */
  expect_edit_refused("\"tokens\": 6", "\"tokens\": 5", "/layers/0/samples",
                      "(6) exceeds tokens (5)");
  expect_edit_refused("\"sample_cap\": 64", "\"sample_cap\": 4", "/layers/0/samples",
                      "(6) exceeds /sample_cap (4)");
  expect_edit_refused("2, 3, 6, -1", "2, 3, 6, 6", "/layers/0/sample_experts/9",
                      "sampled token 4 picks expert 6 twice");
  /* A layer given twice: named at its second place. */
  expect_stats_refused(STATS_HEAD STATS_LAYER(1) ",\n" STATS_LAYER(1) STATS_TAIL, "/layers/1/layer",
                       "layer 1 is given twice (also at /layers/0)");
  expect_stats_refused(STATS_HEAD STATS_TAIL, "/layers", "must be a non-empty array");
}

/* ---- the prediction ------------------------------------------------------------------ */

static void test_predict(void **state) {
  (void)state;
  xm_routing_stats_t s;
  parse_stats_ok(k_stats, &s);
  xm_place_prediction_t x;

  /* The identity over the run's 2 nodes (blocks {0,1,2,3} and {4,5,6,7}),
   * with the tokens' source nodes:
   *   t0 node 0 {0,1}: blocks {0}        rbd 0  flat 0
   *   t1 node 0 {0,4}: blocks {0,1}      rbd 1  flat 1 (expert 4)
   *   t2 node 1 {1,5}: blocks {0,1}      rbd 1  flat 1 (expert 1)
   *   t3 node 1 {2,3}: blocks {0}        rbd 1  flat 2
   *   t4 node 1 {6}:   blocks {1}        rbd 0  flat 0
   *   t5 node 0 {4,6}: blocks {1}        rbd 1  flat 2
   * rbd 4, flat 6. Block loads 2+2+1+1 = 6 and 2+1+2+0 = 5: max 6, mean
   * 11/2, imbalance 12/11. All tokens sampled: the run's rows are these. */
  static const int32_t ident[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  xm_place_predict(&s, 0, ident, 2, &x);
  assert_int_equal(x.sample_rbd, 4);
  assert_int_equal(x.sample_flat, 6);
  assert_near(x.rbd_inter_rows, 4, 0);
  assert_near(x.flat_inter_rows, 6, 0);
  assert_int_equal(x.max_block_load, 6);
  assert_near(x.imbalance, 12.0 / 11.0, 1e-12);

  /* Slots [0, 1, 4, 6 | 2, 3, 5, 7]: block 0 holds {0,1,4,6}, block 1 {2,3,5,7}.
   *   t0 node 0 {0,1}: {0}    rbd 0  flat 0
   *   t1 node 0 {0,4}: {0}    rbd 0  flat 0
   *   t2 node 1 {1,5}: {0,1}  rbd 1  flat 1 (expert 1)
   *   t3 node 1 {2,3}: {1}    rbd 0  flat 0
   *   t4 node 1 {6}:   {0}    rbd 1  flat 1
   *   t5 node 0 {4,6}: {0}    rbd 0  flat 0
   * rbd 2, flat 2. Block loads 2+2+2+2 = 8 and 1+1+1+0 = 3: imbalance 16/11. */
  static const int32_t perm[8] = {0, 1, 4, 6, 2, 3, 5, 7};
  xm_place_predict(&s, 0, perm, 2, &x);
  assert_int_equal(x.sample_rbd, 2);
  assert_int_equal(x.sample_flat, 2);
  assert_near(x.rbd_inter_rows, 2, 0);
  assert_near(x.flat_inter_rows, 2, 0);
  assert_int_equal(x.max_block_load, 8);
  assert_near(x.imbalance, 16.0 / 11.0, 1e-12);

  /* Over 4 blocks the sources are unknown (the run spanned 2 nodes): rbd is
   * the distinct blocks, flat the kept slots, each times (1 - 1/4). The
   * identity's blocks {0,1} {2,3} {4,5} {6,7}: t0 1, t1 2, t2 2, t3 1, t4 1,
   * t5 2 = 9 blocks; 11 slots. Block loads 4, 2, 3, 2: imbalance 4 x 4/11. */
  xm_place_predict(&s, 0, ident, 4, &x);
  assert_int_equal(x.sample_rbd, 9);
  assert_int_equal(x.sample_flat, 11);
  assert_near(x.rbd_inter_rows, 9 * 0.75, 1e-12);
  assert_near(x.flat_inter_rows, 11 * 0.75, 1e-12);
  assert_int_equal(x.max_block_load, 4);
  assert_near(x.imbalance, 16.0 / 11.0, 1e-12);
  xm_routing_stats_free(&s);

  /* The same samples as half of 12 tokens: the run's rows scale by 2. */
  char *t = replaced(k_stats, "\"tokens\": 6", "\"tokens\": 12");
  parse_stats_ok(t, &s);
  free(t);
  xm_place_predict(&s, 0, ident, 2, &x);
  assert_int_equal(x.sample_rbd, 4);
  assert_near(x.rbd_inter_rows, 8, 1e-12);
  assert_near(x.flat_inter_rows, 12, 1e-12);
  xm_place_predict(&s, 0, perm, 2, &x);
  assert_near(x.rbd_inter_rows, 4, 1e-12);
  assert_near(x.flat_inter_rows, 4, 1e-12);
  /* Unknown sources and scaled: 9 x 3/4 x 2. */
  xm_place_predict(&s, 0, ident, 4, &x);
  assert_near(x.rbd_inter_rows, 13.5, 1e-12);
  xm_routing_stats_free(&s);
}

/* ---- the search ------------------------------------------------------------------------ */

/* A statistics file of one layer (`layer`) whose tokens are `ids` (T x k, -1
 * for a dropped slot) from nodes `src`: the loads and co-selection counted
 * from them, every token sampled (or none when !with_samples). */
static char *stats_of_tokens(int64_t E, int64_t k, int64_t nodes, int64_t layer, int64_t T,
                             const int32_t *ids, const int32_t *src, bool with_samples) {
  int64_t *load = calloc((size_t)E, sizeof *load);
  int64_t *co = calloc((size_t)(E * E), sizeof *co);
  assert_true(load && co);
  for (int64_t t = 0; t < T; t++)
    for (int64_t i = 0; i < k; i++) {
      int32_t a = ids[t * k + i];
      if (a < 0) continue;
      load[a]++;
      for (int64_t j = 0; j < k; j++) {
        int32_t b = ids[t * k + j];
        if (j != i && b >= 0) co[a * E + b]++;
      }
    }
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  xm_strbuf_printf(
      &b,
      "{\"format\": \"xmoec-routing-stats\", \"version\": 1, \"model\": \"gen\", "
      "\"experts\": %lld, \"top_k\": %lld, \"layout\": {\"world\": %lld, \"ep\": %lld, "
      "\"ranks_per_node\": 1, \"nodes\": %lld}, \"placed\": false, \"steps\": 1, "
      "\"layers\": [{\"layer\": %lld, \"tokens\": %lld, \"load\": [",
      (long long)E, (long long)k, (long long)nodes, (long long)nodes, (long long)nodes,
      (long long)layer, (long long)T);
  for (int64_t e = 0; e < E; e++)
    xm_strbuf_printf(&b, "%s%lld", e ? ", " : "", (long long)load[e]);
  xm_strbuf_puts(&b, "], \"coselect\": [");
  for (int64_t i = 0; i < E * E; i++)
    xm_strbuf_printf(&b, "%s%lld", i ? ", " : "", (long long)co[i]);
  int64_t m = with_samples ? T : 0;
  xm_strbuf_printf(&b, "], \"samples\": %lld, \"sample_node\": [", (long long)m);
  for (int64_t t = 0; t < m; t++)
    xm_strbuf_printf(&b, "%s%d", t ? ", " : "", src[t]);
  xm_strbuf_puts(&b, "], \"sample_experts\": [");
  for (int64_t i = 0; i < m * k; i++)
    xm_strbuf_printf(&b, "%s%d", i ? ", " : "", ids[i]);
  xm_strbuf_puts(&b, "]}]}\n");
  free(load);
  free(co);
  return xm_strbuf_take(&b);
}

/* 16 tokens of 8 experts, top-2, on 2 nodes: 4 tokens for each pair of
 * `pairs`, alternately from node 0 and node 1. */
static char *planted(const int32_t pairs[4][2], bool with_samples) {
  int32_t ids[16 * 2], src[16];
  for (int t = 0; t < 16; t++) {
    ids[2 * t] = pairs[t % 4][0];
    ids[2 * t + 1] = pairs[t % 4][1];
    src[t] = (t / 4) % 2;
  }
  return stats_of_tokens(8, 2, 2, 1, 16, ids, src, with_samples);
}

static const int32_t k_across[4][2] = {{0, 4}, {1, 5}, {2, 6}, {3, 7}};
static const int32_t k_along[4][2] = {{0, 1}, {2, 3}, {4, 5}, {6, 7}};

static xm_place_options_t options(int64_t nodes) {
  return (xm_place_options_t){.nodes = nodes, .max_imbalance = 0.1, .passes = 20, .n_group = 1};
}

static void run_ok(const xm_routing_stats_t *s, const xm_place_options_t *o, xm_place_result_t *r) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_status_t st = xm_place_run(s, o, &d, r);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  assert_int_equal(d.count, 0);
  xm_diag_free(&d);
}

static void test_place_planted_pairs(void **state) {
  (void)state;
  char *text = planted(k_across, true);
  xm_routing_stats_t s;
  parse_stats_ok(text, &s);
  free(text);
  xm_place_options_t o = options(2);
  xm_place_result_t r;
  run_ok(&s, &o, &r);
  assert_int_equal(r.nodes, 2);
  assert_true(r.sources);
  assert_int_equal(r.num_layers, 1);
  assert_int_equal(r.unpredicted, 0);
  const xm_place_layer_t *l = &r.layers[0];
  assert_int_equal(l->layer, 1);
  assert_int_equal(l->tokens, 16);
  assert_int_equal(l->samples, 16);
  assert_true(l->predicted);
  assert_true(l->by_samples);
  assert_near(l->scale, 1, 0);
  /* 32 slots, 16 per block: the bound is floor(1.1 x 16) = 17, met by both. */
  assert_int_equal(l->load_bound, 17);
  assert_false(l->bound_relaxed);
  /* The identity splits every pair: each token touches both blocks (32 in
   * all), one of them remote (16 RBD rows, 16 flat rows). */
  assert_int_equal(l->objective_identity, 32);
  assert_int_equal(l->identity.sample_rbd, 16);
  assert_int_equal(l->identity.sample_flat, 16);
  assert_near(l->identity.rbd_inter_rows, 16, 0);
  assert_int_equal(l->identity.max_block_load, 16);
  assert_near(l->identity.imbalance, 1, 1e-12);
  /* Placed: every token on one block (16); half of each pair's tokens come
   * from that block's node, the other half send one RBD row (8) and their
   * two slots flat (16). */
  assert_true(l->changed);
  assert_int_equal(l->objective_placed, 16);
  assert_int_equal(l->placed.sample_rbd, 8);
  assert_int_equal(l->placed.sample_flat, 16);
  assert_near(l->placed.rbd_inter_rows, 8, 0);
  assert_true(l->placed.rbd_inter_rows < l->identity.rbd_inter_rows);
  assert_int_equal(l->placed.max_block_load, 16);
  assert_near(l->placed.imbalance, 1, 1e-12);
  assert_true(l->passes >= 1 && l->passes <= 20);
  /* The placement: one row for layer 1, each pair on one block. */
  const xm_placement_t *p = &r.placement;
  assert_int_equal(p->experts, 8);
  assert_int_equal(p->nodes, 2);
  assert_int_equal(p->rows, 1);
  assert_int_equal(p->layer[0], 1);
  assert_string_equal(p->source, "stats.json");
  assert_true(row_is_permutation(p, 0));
  assert_false(xm_placement_row_is_identity(p, 0));
  for (int i = 0; i < 4; i++)
    if (block_of(p, 0, k_across[i][0], 2) != block_of(p, 0, k_across[i][1], 2))
      fail_msg("experts %d and %d are on different blocks", k_across[i][0], k_across[i][1]);
  /* The totals are the one layer's. */
  assert_int_equal(r.total_identity.sample_rbd, 16);
  assert_int_equal(r.total_placed.sample_rbd, 8);
  assert_near(r.total_placed.rbd_inter_rows, 8, 0);
  /* The JSON of docs/placement.md, "--json". */
  cJSON *j = xm_place_result_json(&r, &s);
  assert_non_null(j);
  assert_string_equal(cJSON_GetObjectItem(j, "stats")->valuestring, "stats.json");
  assert_string_equal(cJSON_GetObjectItem(j, "model")->valuestring, "gen");
  assert_string_equal(cJSON_GetObjectItem(j, "sources")->valuestring, "sampled");
  assert_near(cJSON_GetObjectItem(j, "experts")->valuedouble, 8, 0);
  assert_near(cJSON_GetObjectItem(j, "nodes")->valuedouble, 2, 0);
  cJSON *jl = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "layers"), 0);
  assert_non_null(jl);
  assert_string_equal(cJSON_GetObjectItem(jl, "objective")->valuestring, "blocks");
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(jl, "changed")));
  assert_near(cJSON_GetObjectItem(jl, "rbd_drop")->valuedouble, 0.5, 1e-12);
  assert_near(cJSON_GetObjectItem(cJSON_GetObjectItem(jl, "placed"), "rbd_inter_rows")->valuedouble,
              8, 0);
  cJSON *jt = cJSON_GetObjectItem(j, "total");
  assert_near(cJSON_GetObjectItem(jt, "rbd_drop")->valuedouble, 0.5, 1e-12);
  assert_near(cJSON_GetObjectItem(jt, "layers_unpredicted")->valuedouble, 0, 0);
  cJSON_Delete(j);
  xm_place_result_free(&r);

  /* With no local search the greedy start alone finds it. */
  o.passes = 0;
  run_ok(&s, &o, &r);
  assert_true(r.layers[0].changed);
  assert_int_equal(r.layers[0].passes, 0);
  assert_int_equal(r.layers[0].swaps, 0);
  assert_int_equal(r.layers[0].placed.sample_rbd, 8);
  xm_place_result_free(&r);

  /* One expert per block: nothing to gain, the identity is kept. */
  o = options(8);
  run_ok(&s, &o, &r);
  assert_false(r.layers[0].changed);
  assert_true(xm_placement_row_is_identity(&r.placement, 0));
  assert_false(r.sources);
  xm_place_result_free(&r);
  xm_routing_stats_free(&s);

  /* Without samples the co-selection counts are the objective: the pairs
   * still end up together, and the rows are unknown. */
  text = planted(k_across, false);
  parse_stats_ok(text, &s);
  free(text);
  o = options(2);
  run_ok(&s, &o, &r);
  l = &r.layers[0];
  assert_false(l->by_samples);
  assert_false(l->predicted);
  assert_near(l->scale, 0, 0);
  assert_true(l->changed);
  assert_int_equal(l->objective_identity, 16); /* 4 pairs x 4 tokens across */
  assert_int_equal(l->objective_placed, 0);
  assert_int_equal(r.unpredicted, 1);
  for (int i = 0; i < 4; i++)
    assert_int_equal(block_of(&r.placement, 0, k_across[i][0], 2),
                     block_of(&r.placement, 0, k_across[i][1], 2));
  j = xm_place_result_json(&r, &s);
  assert_non_null(j);
  jl = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "layers"), 0);
  assert_string_equal(cJSON_GetObjectItem(jl, "objective")->valuestring, "coselect");
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(jl, "rbd_drop")));
  assert_true(
      cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetObjectItem(jl, "identity"), "rbd_inter_rows")));
  cJSON_Delete(j);
  xm_place_result_free(&r);
  xm_routing_stats_free(&s);
}

static void test_place_identity_kept(void **state) {
  (void)state;
  /* Pairs {0,1} {2,3} {4,5} {6,7}: the identity already puts every token on
   * one block (16 in all), nothing is strictly better. */
  char *text = planted(k_along, true);
  xm_routing_stats_t s;
  parse_stats_ok(text, &s);
  free(text);
  xm_place_options_t o = options(2);
  xm_place_result_t r;
  run_ok(&s, &o, &r);
  const xm_place_layer_t *l = &r.layers[0];
  assert_false(l->changed);
  assert_true(xm_placement_row_is_identity(&r.placement, 0));
  assert_int_equal(l->objective_identity, 16);
  assert_int_equal(l->objective_placed, 16);
  assert_int_equal(l->identity.sample_rbd, 8);
  assert_int_equal(l->placed.sample_rbd, 8);
  assert_near(l->placed.rbd_inter_rows, l->identity.rbd_inter_rows, 0);
  xm_place_result_free(&r);
  xm_routing_stats_free(&s);
}

/* Called before each layer: counts the calls and checks the arguments. */
static void count_progress(void *ctx, int64_t i, int64_t count, int64_t layer) {
  int64_t *calls = ctx;
  assert_int_equal(i, *calls);
  assert_int_equal(count, 1);
  assert_int_equal(layer, 2);
  ++*calls;
}

static void test_place_deterministic(void **state) {
  (void)state;
  /* 400 tokens of 16 experts, top-2, from 4 nodes, drawn with a skew towards
   * low ids and towards partners 8 apart. */
  enum { T = 400, E = 16, K = 2 };
  int32_t ids[T * K], src[T];
  uint64_t x = 12345;
  for (int t = 0; t < T; t++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    int32_t a = (int32_t)((x >> 33) % 16);
    if ((x >> 20) % 3 == 0) a = (int32_t)((x >> 40) % 6);
    int32_t b = (x >> 45) % 4 == 0 ? (a + 8) % E : (int32_t)((a + 1 + (x >> 50) % 15) % E);
    ids[t * K] = a;
    ids[t * K + 1] = b;
    src[t] = (int32_t)((x >> 58) % 4);
  }
  char *text = stats_of_tokens(E, K, 4, 2, T, ids, src, true);
  xm_routing_stats_t s;
  parse_stats_ok(text, &s);
  free(text);
  xm_place_options_t o = options(4);
  int64_t calls = 0;
  o.progress = count_progress;
  o.progress_ctx = &calls;
  xm_place_result_t a, b;
  run_ok(&s, &o, &a);
  assert_int_equal(calls, 1);
  calls = 0;
  run_ok(&s, &o, &b);
  const xm_place_layer_t *la = &a.layers[0], *lb = &b.layers[0];
  for (int q = 0; q < E; q++)
    assert_int_equal(a.placement.slots[q], b.placement.slots[q]);
  assert_int_equal(la->swaps, lb->swaps);
  assert_int_equal(la->passes, lb->passes);
  assert_int_equal(la->objective_placed, lb->objective_placed);
  assert_int_equal(la->placed.sample_rbd, lb->placed.sample_rbd);
  /* Whatever it chose: a permutation within the bound, strictly better than
   * the identity when changed, and a placement samples/tiny.json (16
   * experts, layer 2 MoE) accepts. */
  assert_true(row_is_permutation(&a.placement, 0));
  assert_true(la->objective_placed <= la->objective_identity);
  if (la->changed) assert_true(la->objective_placed < la->objective_identity);
  assert_true(la->changed); /* the skewed pairs leave room to improve */
  if (!la->bound_relaxed) assert_true(la->placed.max_block_load <= la->load_bound);
  xm_place_prediction_t again;
  xm_place_predict(&s, 0, a.placement.slots, 4, &again);
  assert_int_equal(again.sample_rbd, la->placed.sample_rbd);
  assert_int_equal(again.max_block_load, la->placed.max_block_load);
  xm_spec_t tiny;
  load_spec(XM_SOURCE_DIR "/samples/tiny.json", &tiny);
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(xm_placement_check(&a.placement, &tiny, &d), XM_OK);
  xm_diag_free(&d);
  xm_place_result_free(&a);
  xm_place_result_free(&b);
  xm_place_result_free(&b); /* safe twice */
  xm_routing_stats_free(&s);
}

static void test_place_groups(void **state) {
  (void)state;
  /* n_group 4 over 8 experts: groups {0,1} {2,3} {4,5} {6,7}, 2 per block,
   * so whole groups move. The pairs {i, i+4} join groups 0 and 2, and 1 and
   * 3: slots [0 1 4 5 | 2 3 6 7] puts every pair on one block. */
  char *text = planted(k_across, true);
  xm_routing_stats_t s;
  parse_stats_ok(text, &s);
  free(text);
  xm_place_options_t o = options(2);
  o.n_group = 4;
  xm_place_result_t r;
  run_ok(&s, &o, &r);
  const xm_placement_t *p = &r.placement;
  assert_true(r.layers[0].changed);
  assert_true(row_is_permutation(p, 0));
  for (int g = 0; g < 4; g++)
    if (p->slots[2 * g] / 2 != p->slots[2 * g + 1] / 2)
      fail_msg("slot group %d holds experts %d and %d of different groups", g, p->slots[2 * g],
               p->slots[2 * g + 1]);
  for (int i = 0; i < 4; i++)
    assert_int_equal(block_of(p, 0, k_across[i][0], 2), block_of(p, 0, k_across[i][1], 2));
  assert_int_equal(r.layers[0].placed.sample_rbd, 8);
  xm_place_result_free(&r);

  /* n_group 8: groups of one expert nest inside the blocks, so experts
   * move freely and the pairs join. */
  o.n_group = 8;
  run_ok(&s, &o, &r);
  for (int i = 0; i < 4; i++)
    assert_int_equal(block_of(&r.placement, 0, k_across[i][0], 2),
                     block_of(&r.placement, 0, k_across[i][1], 2));
  xm_place_result_free(&r);

  /* n_group 2 over 2 blocks: the groups {0..3} {4..7} are the blocks and
   * every pair crosses them. Only whole groups may move, which gains
   * nothing, so the identity is kept. */
  o.n_group = 2;
  run_ok(&s, &o, &r);
  assert_false(r.layers[0].changed);
  for (int g = 0; g < 2; g++)
    for (int i = 0; i < 4; i++)
      assert_int_equal(r.placement.slots[4 * g + i] / 4, r.placement.slots[4 * g] / 4);
  assert_int_equal(r.layers[0].placed.sample_rbd, 16);
  xm_place_result_free(&r);

  /* n_group 2 over 4 blocks: the blocks nest inside the groups, so every
   * expert stays in its own slot group; a pair's experts are in different
   * groups and so on different blocks whatever the placement. */
  o = options(4);
  o.n_group = 2;
  run_ok(&s, &o, &r);
  for (int q = 0; q < 8; q++)
    assert_int_equal(r.placement.slots[q] / 4, q / 4);
  assert_int_equal(r.layers[0].objective_placed, r.layers[0].objective_identity);
  assert_false(r.layers[0].changed);
  xm_place_result_free(&r);
  xm_routing_stats_free(&s);
}

/* The load bound. Experts 0, 2, 4 and 6 form a clique: each of their 6
 * pairs is chosen by 4 tokens (load 12 each); the light pairs {1,3} and
 * {5,7} by 2 tokens each (load 2). 56 slots, a mean block load of 28. */
static char *clique(void) {
  static const int32_t pairs[8][2] = {{0, 2}, {0, 4}, {0, 6}, {2, 4},
                                      {2, 6}, {4, 6}, {1, 3}, {5, 7}};
  int32_t ids[28 * 2], src[28];
  int t = 0;
  for (int p = 0; p < 8; p++)
    for (int i = 0; i < (p < 6 ? 4 : 2); i++, t++) {
      ids[2 * t] = pairs[p][0];
      ids[2 * t + 1] = pairs[p][1];
      src[t] = t % 2;
    }
  assert_int_equal(t, 28);
  return stats_of_tokens(8, 2, 2, 1, 28, ids, src, true);
}

static void test_place_load_bound(void **state) {
  (void)state;
  char *text = clique();
  xm_routing_stats_t s;
  parse_stats_ok(text, &s);
  free(text);
  /* Bound floor(1.1 x 28) = 30: the clique (48 slots) cannot share a block.
   * The identity splits it 2 + 2 ({0,2} and {4,6}): of its 24 tokens 8 stay
   * on one block and 16 touch two (40), and each light pair is on one block
   * (4): 44, the best the bound allows, so the identity is kept. */
  xm_place_options_t o = options(2);
  xm_place_result_t r;
  run_ok(&s, &o, &r);
  const xm_place_layer_t *l = &r.layers[0];
  assert_int_equal(l->load_bound, 30);
  assert_false(l->bound_relaxed);
  assert_int_equal(l->identity.max_block_load, 28);
  assert_int_equal(l->objective_identity, 44);
  assert_int_equal(l->objective_placed, 44);
  assert_false(l->changed);
  assert_true(l->placed.max_block_load <= 30);
  xm_place_result_free(&r);
  /* Bound floor(11 x 28) = 308: the clique shares a block, the light pairs
   * the other (28: one block per token), at a block load of 48. */
  o.max_imbalance = 10;
  run_ok(&s, &o, &r);
  l = &r.layers[0];
  assert_int_equal(l->load_bound, 308);
  assert_true(l->changed);
  assert_int_equal(l->objective_placed, 28);
  assert_int_equal(l->placed.max_block_load, 48);
  assert_near(l->placed.imbalance, 48.0 / 28.0, 1e-12);
  int64_t b0 = block_of(&r.placement, 0, 0, 2);
  for (int32_t e = 2; e <= 6; e += 2)
    assert_int_equal(block_of(&r.placement, 0, e, 2), b0);
  xm_place_result_free(&r);
  xm_routing_stats_free(&s);

  /* Every token on experts 0..3: the identity's block 0 receives all 32
   * slots, beyond floor(1.1 x 16) = 17, so its own 32 is the bound. */
  int32_t ids[16 * 2], src[16];
  for (int t = 0; t < 16; t++) {
    ids[2 * t] = t % 2 ? 2 : 0;
    ids[2 * t + 1] = t % 2 ? 3 : 1;
    src[t] = 0;
  }
  text = stats_of_tokens(8, 2, 2, 1, 16, ids, src, true);
  parse_stats_ok(text, &s);
  free(text);
  o = options(2);
  run_ok(&s, &o, &r);
  l = &r.layers[0];
  assert_true(l->bound_relaxed);
  assert_int_equal(l->load_bound, 32);
  assert_int_equal(l->identity.max_block_load, 32);
  assert_near(l->identity.imbalance, 2, 1e-12);
  assert_true(l->placed.max_block_load <= 32);
  assert_true(l->objective_placed <= l->objective_identity);
  xm_place_result_free(&r);
  xm_routing_stats_free(&s);
}

/* xm_place_run refusing options: XM_ERR_INVALID_INPUT reported at `flag`,
 * and an empty result. */
static void expect_options_refused(const xm_routing_stats_t *s, const xm_place_options_t *o,
                                   const char *flag, const char *needle) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_place_result_t r;
  memset(&r, 0x5a, sizeof r);
  assert_int_equal(xm_place_run(s, o, &d, &r), XM_ERR_INVALID_INPUT);
  expect_error_in(&d, flag, needle);
  assert_null(r.layers);
  assert_null(r.placement.slots);
  assert_int_equal(r.num_layers, 0);
  xm_place_result_free(&r);
  xm_diag_free(&d);
}

static void test_place_options(void **state) {
  (void)state;
  xm_routing_stats_t s;
  parse_stats_ok(k_stats, &s);
  xm_place_options_t o = options(1);
  expect_options_refused(&s, &o, "--nodes", "nothing to place");
  o = options(0);
  expect_options_refused(&s, &o, "--nodes", "nothing to place");
  o = options(3);
  expect_options_refused(&s, &o, "--nodes", "8 experts do not split into 3 equal node blocks");
  o = options(16);
  expect_options_refused(&s, &o, "--nodes", "8 experts do not split into 16 equal node blocks");
  o = options(2);
  o.max_imbalance = -0.1;
  expect_options_refused(&s, &o, "--max-imbalance", "must be a finite number >= 0");
  o.max_imbalance = NAN;
  expect_options_refused(&s, &o, "--max-imbalance", "must be a finite number >= 0");
  o.max_imbalance = INFINITY;
  expect_options_refused(&s, &o, "--max-imbalance", "must be a finite number >= 0");
  o = options(2);
  o.passes = -1;
  expect_options_refused(&s, &o, "--passes", "must be a whole number >= 0");
  o = options(2);
  o.n_group = 3;
  expect_options_refused(&s, &o, "stats.json", "do not split into the model's 3 expert groups");
  /* A good run of the hand-written file, for contrast. */
  o = options(2);
  xm_place_result_t r;
  run_ok(&s, &o, &r);
  assert_int_equal(r.layers[0].identity.sample_rbd, 4);
  assert_true(row_is_permutation(&r.placement, 0));
  assert_true(r.layers[0].objective_placed <= r.layers[0].objective_identity);
  xm_place_result_free(&r);
  xm_routing_stats_free(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_placement_parse),     cmocka_unit_test(test_placement_refusals),
      cmocka_unit_test(test_placement_check),     cmocka_unit_test(test_stats_parse),
      cmocka_unit_test(test_stats_refusals),      cmocka_unit_test(test_predict),
      cmocka_unit_test(test_place_planted_pairs), cmocka_unit_test(test_place_identity_kept),
      cmocka_unit_test(test_place_deterministic), cmocka_unit_test(test_place_groups),
      cmocka_unit_test(test_place_load_bound),    cmocka_unit_test(test_place_options),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
