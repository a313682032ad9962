/* tests/unit/test_fabric_traffic.c — measured and synthetic traffic of the
 * network model (fabric/traffic.c, docs/traffic.md "Reading and
 * synthesising traffic").
 *
 * Reading: a hand-written --traffic file and step log (written to a temp
 * dir) give back their values, a rewritten step replaces the earlier one,
 * and every malformed line is refused at FILE:LINE and its JSON pointer.
 * Synthesis: uniform routing gives the closed forms (flat: T k / ep rows to
 * every other EP member; RBD: one pilot per (token, server) with the
 * hypergeometric chance that a server holds one of the token's experts,
 * and the replicas of docs/cost-model.md); the server matrix is the block
 * sum of the rank matrix; fitted loads are met; skew, co-selection and
 * source affinity move the shares the way they should. Locality: shares,
 * heaviest pairs, total variation and overlap on hand matrices.
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

#include "fabric/traffic.h"

#define assert_near(a, b, tol)                                                                     \
  do {                                                                                             \
    double a_ = (double)(a), b_ = (double)(b);                                                     \
    if (!(fabs(a_ - b_) <= (tol))) fail_msg("%s = %.12g, expected %.12g", #a, a_, b_);             \
  } while (0)

static char g_dir[] = "/tmp/xm_traffic_XXXXXX";

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

/* The printed diagnostics. */
static char *printed(const xm_diag_t *d) {
  char *buf = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&buf, &n);
  assert_non_null(f);
  xm_diag_print(d, f);
  fclose(f);
  return buf;
}

/* ---- the --traffic file --------------------------------------------------------- */

static const char k_traffic[] =
    "{\"step\":7,\"layer\":0,\"phase\":\"dispatch\",\"world\":4,"
    "\"bytes\":[[0,48,0,0],[36,0,0,0],[0,0,0,60],[0,0,12,0]]}\n"
    "{\"step\":7,\"layer\":0,\"phase\":\"combine\",\"world\":4,"
    "\"bytes\":[[0,36,0,0],[48,0,0,0],[0,0,0,12],[0,0,60,0]]}\n"
    "\n"
    "{\"step\":7,\"layer\":null,\"phase\":\"all_reduce\",\"world\":4,"
    "\"bytes\":[[0,100,0,100],[100,0,100,0],[0,100,0,100],[100,0,100,0]]}\n"
    "{\"step\":8,\"layer\":0,\"phase\":\"dispatch\",\"world\":4,"
    "\"bytes\":[[0,1,2,3],[0,0,0,0],[0,0,0,0],[0,0,0,0]]}\n"
    /* a resumed run writes step 8 again: the last line wins */
    "{\"step\":8,\"layer\":0,\"phase\":\"dispatch\",\"world\":4,"
    "\"bytes\":[[0,10,20,30],[0,0,0,0],[0,0,0,0],[0,0,0,0]]}\n";

static void test_traffic_file(void **state) {
  (void)state;
  const char *path = write_file("traffic.jsonl", k_traffic);
  xm_diag_t d;
  xm_diag_init(&d);
  xm_fab_traffic_t *t = NULL;
  xm_status_t st = xm_fab_traffic_load_file(path, &d, &t);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  assert_int_equal(t->world, 4);
  assert_int_equal(t->num_records, 4);
  const xm_fab_traffic_record_t *r = xm_fab_traffic_find(t, 7, 0, XM_RT_PHASE_DISPATCH);
  assert_non_null(r);
  assert_int_equal(r->line, 1);
  assert_near(r->bytes.v[0 * 4 + 1], 48, 0);
  assert_near(r->bytes.v[1 * 4 + 0], 36, 0);
  assert_near(r->bytes.v[2 * 4 + 3], 60, 0);
  assert_near(xm_fab_matrix_total(&r->bytes), 156, 0);
  r = xm_fab_traffic_find(t, 7, -1, XM_RT_PHASE_ALL_REDUCE);
  assert_non_null(r);
  assert_int_equal(r->line, 4);
  r = xm_fab_traffic_find(t, 8, 0, XM_RT_PHASE_DISPATCH);
  assert_non_null(r);
  assert_int_equal(r->line, 6);
  assert_near(r->bytes.v[3], 30, 0);
  assert_null(xm_fab_traffic_find(t, 7, 1, XM_RT_PHASE_DISPATCH));
  /* file order is kept */
  assert_int_equal(t->records[0].line, 1);
  assert_int_equal(t->records[3].line, 6);
  /* step 7 summed, split by nodes of 2 ranks: what the step log reports */
  xm_fab_matrix_t m;
  assert_int_equal(xm_fab_traffic_sum(t, 7, -2, XM_RT_PHASE_COUNT, &m), XM_OK);
  double intra, inter;
  xm_fab_matrix_split(&m, 2, &intra, &inter);
  assert_near(intra, 156 + 156 + 400, 0);
  assert_near(inter, 400, 0);
  xm_fab_matrix_free(&m);
  assert_int_equal(xm_fab_traffic_sum(t, -1, 0, XM_RT_PHASE_DISPATCH, &m), XM_OK);
  assert_near(xm_fab_matrix_total(&m), 156 + 60, 0);
  xm_fab_matrix_free(&m);
  xm_fab_traffic_free(t);
  xm_diag_free(&d);
}

/* Loading `text` fails with an error at file "t.jsonl:LINE", place
 * `pointer`, and the printed message shows both. */
static void bad_traffic(const char *text, int line, const char *pointer, const char *needle,
                        bool step_log) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_status_t st;
  if (step_log) {
    xm_fab_step_log_t *l = (xm_fab_step_log_t *)1;
    st = xm_fab_step_log_load_text(text, strlen(text), "t.jsonl", &d, &l);
    assert_null(l);
  } else {
    xm_fab_traffic_t *t = (xm_fab_traffic_t *)1;
    st = xm_fab_traffic_load_text(text, strlen(text), "t.jsonl", &d, &t);
    assert_null(t);
  }
  if (st != XM_ERR_INVALID_INPUT) fail_msg("accepted: %s", text);
  char want[400];
  if (line > 0)
    snprintf(want, sizeof want, "t.jsonl:%d: error: %s%s", line, pointer, *pointer ? ": " : "");
  else
    snprintf(want, sizeof want, "t.jsonl: error: ");
  char *out = printed(&d);
  if (!strstr(out, want) || (needle && !strstr(out, needle)))
    fail_msg("wanted '%s' ... '%s' in:\n%s", want, needle ? needle : "", out);
  free(out);
  xm_diag_free(&d);
}

#define LINE4(bytes)                                                                               \
  "{\"step\":1,\"layer\":0,\"phase\":\"dispatch\",\"world\":2,\"bytes\":" bytes "}"
#define GOOD2 LINE4("[[0,1],[2,0]]")

static void test_traffic_errors(void **state) {
  (void)state;
  bad_traffic(GOOD2 "\n{\"step\":1,\"layer\":1,\"phase\":\"dispatch\",\"world\":3,"
                    "\"bytes\":[[0,1,1],[1,0,1],[1,1,0]]}\n",
              2, "/world", "line 1 has 2", false);
  bad_traffic(LINE4("[[0,1],[2]]"), 1, "/bytes/1", "not square", false);
  bad_traffic(LINE4("[[0,1],[2,0],[0,0]]"), 1, "/bytes", "2 rows", false);
  bad_traffic(GOOD2 "\n" LINE4("[[0,-1],[2,0]]"), 2, "/bytes/0/1", "negative", false);
  bad_traffic(LINE4("[[0,1.5],[2,0]]"), 1, "/bytes/0/1", "not a whole number", false);
  bad_traffic(LINE4("[[0,\"1\"],[2,0]]"), 1, "/bytes/0/1", "a string", false);
  bad_traffic(LINE4("[[3,1],[2,0]]"), 1, "/bytes/0/0", "diagonal", false);
  bad_traffic("{\"step\":1,\"layer\":0,\"phase\":\"dispach\",\"world\":2,\"bytes\":[[0,1],[2,0]]}",
              1, "/phase", "dispach", false);
  bad_traffic("{\"step\":1,\"layer\":-1,\"phase\":\"other\",\"world\":2,\"bytes\":[[0,1],[2,0]]}",
              1, "/layer", "null", false);
  bad_traffic("{\"layer\":0,\"phase\":\"other\",\"world\":2,\"bytes\":[[0,1],[2,0]]}", 1, "/step",
              "missing", false);
  bad_traffic("{\"step\":1,\"layer\":0,\"phase\":\"other\",\"world\":2,\"bytes\":[[0,1],[2,0]],"
              "\"rank\":0}",
              1, "/rank", "unknown member", false);
  bad_traffic("{\"step\":1,\"layer\":0,\"phase\":\"other\",\"world\":0,\"bytes\":[]}", 1, "/world",
              NULL, false);
  bad_traffic(GOOD2 "\n\n{\"step\":1,\n", 3, "", "syntax error", false);
  bad_traffic(GOOD2 " x\n", 1, "", "syntax error", false);
  bad_traffic("[1,2]\n", 1, "", "object", false);
  bad_traffic("\n  \n", 0, "", "no records", false);
}

/* ---- the step log ----------------------------------------------------------------- */

#define BYPHASE(d, c)                                                                              \
  "\"by_phase\":{\"dispatch\":{\"intra\":" d ",\"inter\":" c "},\"combine\":{\"intra\":" d         \
  ",\"inter\":" c "},\"all_reduce\":{\"intra\":0,\"inter\":0},\"all_gather\":{\"intra\":0,"        \
  "\"inter\":0},\"reduce_scatter\":{\"intra\":0,\"inter\":0},\"other\":{\"intra\":0,\"inter\":0}}"
#define M0 "[[0,0],[0,0]]"
#define PEERS                                                                                      \
  "\"peers\":{\"world\":2,\"sent\":{\"dispatch\":[[0,70],[30,0]],\"combine\":[[0,30],[70,0]],"     \
  "\"all_reduce\":" M0 ",\"all_gather\":" M0 ",\"reduce_scatter\":" M0 ",\"other\":" M0 "}}"

static void test_step_log(void **state) {
  (void)state;
  const char *text =
      "{\"step\":1,\"loss\":3.5,\"traffic\":{\"intra_bytes\":200,\"inter_bytes\":0," BYPHASE(
          "100", "0") "," PEERS "}}\n"
                      "{\"step\":2,\"loss\":null,\"traffic\":{\"intra_bytes\":20,\"inter_bytes\":"
                      "60," BYPHASE("10", "30") "}}\n"
                                                "{\"step\":1,\"loss\":3.5,\"traffic\":{\"intra_"
                                                "bytes\":2,\"inter_bytes\":0," BYPHASE("1",
                                                                                       "0") "}}\n";
  const char *path = write_file("train.jsonl", text);
  xm_diag_t d;
  xm_diag_init(&d);
  xm_fab_step_log_t *l = NULL;
  xm_status_t st = xm_fab_step_log_load_file(path, &d, &l);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  assert_int_equal(l->num_steps, 2);
  /* step 1 was logged again on line 3: that line wins, without peers */
  assert_int_equal(l->steps[0].step, 1);
  assert_int_equal(l->steps[0].line, 3);
  assert_near(l->steps[0].intra_bytes, 2, 0);
  assert_int_equal(l->steps[0].world, 0);
  assert_int_equal(l->steps[0].sent[XM_RT_PHASE_DISPATCH].n, 0);
  assert_int_equal(l->steps[1].step, 2);
  assert_near(l->steps[1].inter_bytes, 60, 0);
  assert_near(l->steps[1].intra[XM_RT_PHASE_COMBINE], 10, 0);
  assert_near(l->steps[1].inter[XM_RT_PHASE_DISPATCH], 30, 0);
  xm_fab_step_log_free(l);
  /* the first version of step 1 alone: its peers */
  const char *one = "{\"step\":1,\"traffic\":{\"intra_bytes\":200,\"inter_bytes\":0," BYPHASE(
      "100", "0") "," PEERS "}}";
  assert_int_equal(xm_fab_step_log_load_text(one, strlen(one), "one.jsonl", &d, &l), XM_OK);
  assert_int_equal(l->steps[0].world, 2);
  const xm_fab_matrix_t *m = &l->steps[0].sent[XM_RT_PHASE_DISPATCH];
  assert_int_equal(m->n, 2);
  assert_near(m->v[1], 70, 0);
  assert_near(m->v[2], 30, 0);
  double intra, inter;
  xm_fab_matrix_split(m, 2, &intra, &inter); /* one node of 2: all intra, as by_phase says */
  assert_near(intra, l->steps[0].intra[XM_RT_PHASE_DISPATCH], 0);
  assert_near(inter, 0, 0);
  xm_fab_step_log_free(l);
  xm_diag_free(&d);
}

static void test_step_log_errors(void **state) {
  (void)state;
  bad_traffic("{\"step\":1,\"loss\":2}", 1, "/traffic", "missing", true);
  bad_traffic(
      "{\"step\":1,\"traffic\":{\"intra_bytes\":200,\"inter_bytes\":1," BYPHASE("100", "0") "}}", 1,
      "/traffic", "phases sum to 200", true);
  bad_traffic("{\"step\":1,\"traffic\":{\"intra_bytes\":0,\"inter_bytes\":0,\"by_phase\":{"
              "\"dispatch\":{\"intra\":0,\"inter\":0}}}}",
              1, "/traffic/by_phase/combine", "missing", true);
  bad_traffic("{\"step\":1,\"traffic\":{\"intra_bytes\":200,\"inter_bytes\":0,\"bogus\":1," BYPHASE(
                  "100", "0") "}}",
              1, "/traffic/bogus", "unknown member", true);
  bad_traffic(
      "{\"step\":1,\"traffic\":{\"intra_bytes\":0.5,\"inter_bytes\":0," BYPHASE("0", "0") "}}", 1,
      "/traffic/intra_bytes", "whole number", true);
  bad_traffic("{\"step\":1,\"traffic\":{\"intra_bytes\":200,\"inter_bytes\":0," BYPHASE(
                  "100", "0") ",\"peers\":{\"world\":2,\"sent\":{\"dispatch\":[[0,-7],[30,0]]}}}}",
              1, "/traffic/peers/sent/dispatch/0/1", "negative", true);
  bad_traffic("{\"step\":1,\"traffic\":{\"intra_bytes\":200,\"inter_bytes\":0," BYPHASE(
                  "100", "0") ",\"peers\":{\"world\":2,\"sent\":{\"dispatch\":[[0,7],[30,0]]}}}}",
              1, "/traffic/peers/sent/combine", "missing", true);
  bad_traffic("{\"step\":1,\"traffic\":{\"intra_bytes\":0,\"inter_bytes\":0," BYPHASE(
                  "0", "0") "}}\n{\"step\":\"2\",\"traffic\":{}}",
              2, "/step", "a string", true);
}

/* ---- synthesis: closed forms ------------------------------------------------------ */

static xm_fab_synth_t base_synth(void) {
  return (xm_fab_synth_t){.world = 8,
                          .ranks_per_server = 2,
                          .ep = 4,
                          .experts = 8,
                          .top_k = 2,
                          .hidden = 16,
                          .tokens = 10,
                          .bytes_per_element = 2,
                          .seed = 1};
}

static void synth_ok(const xm_fab_synth_t *s, xm_fab_synth_result_t *r) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_status_t st = xm_fab_synth(s, r, &d);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  xm_diag_free(&d);
}

static void test_synth_uniform_flat(void **state) {
  (void)state;
  xm_fab_synth_t s = base_synth();
  xm_fab_synth_result_t r;
  synth_ok(&s, &r);
  assert_false(r.rbd_active);
  /* each rank sends T k (E/ep)/E = T k / ep rows to every other member of
   * its EP group (consecutive blocks of ep ranks), H b bytes each, and
   * nothing elsewhere: T k (ep-1)/ep rows in all */
  double row = 16 * 2, per_peer = 10.0 * 2 / 4 * row;
  for (int64_t i = 0; i < 8; i++)
    for (int64_t j = 0; j < 8; j++) {
      bool peer = i != j && i / 4 == j / 4;
      assert_near(r.dispatch.v[i * 8 + j], peer ? per_peer : 0, 1e-9);
      assert_near(r.combine.v[j * 8 + i], r.dispatch.v[i * 8 + j], 1e-9);
    }
  assert_near(r.rows, 8 * 10.0 * 2 * 3 / 4, 1e-9);
  /* of a rank's 3 peers one is on its node */
  assert_near(r.inter_rows, 8 * 10.0 * 2 * 2 / 4, 1e-9);
  for (int64_t e = 0; e < 8; e++)
    assert_near(r.expert_share[e], 1.0 / 8, 1e-12);
  /* asking for RBD inside nodes changes nothing: it is not active */
  xm_fab_synth_t s2 = s;
  s2.rbd = true;
  s2.ranks_per_server = 4;
  xm_fab_synth_result_t r2;
  synth_ok(&s2, &r2);
  assert_false(r2.rbd_active);
  assert_near(r2.inter_rows, 0, 0);
  xm_fab_synth_result_free(&r2);
  xm_fab_synth_result_free(&r);
}

static double choose(int n, int k) {
  double c = 1;
  for (int i = 0; i < k; i++)
    c = c * (n - i) / (i + 1);
  return c;
}

static void test_synth_uniform_rbd(void **state) {
  (void)state;
  /* 8 ranks, 2 per server, one EP group of 8 over n = 4 servers (m = 2
   * ranks each), E = 16 experts (2 per rank), top-4 */
  xm_fab_synth_t s = base_synth();
  s.ep = 8;
  s.experts = 16;
  s.top_k = 4;
  s.rbd = true;
  xm_fab_synth_result_t r;
  synth_ok(&s, &r);
  assert_true(r.rbd_active);
  double T = 10, n = 4, m = 2;
  double p_n = 1 - choose(12, 4) / choose(16, 4); /* a server holds one of a token's experts */
  double p_r = 1 - choose(14, 4) / choose(16, 4); /* a rank does */
  /* one pilot row per (token, other server holding one of its experts) */
  assert_near(r.inter_rows, 8 * T * (n - 1) * p_n, 1e-9);
  /* docs/cost-model.md: replicas and pilots inside a server */
  double intra = T * ((n - 1) * (m * p_r - p_n) + m * p_r - p_n / m);
  assert_near(r.rows - r.inter_rows, 8 * intra, 1e-9);
  /* rank 0 to rank 2 (another server): T p_n / m pilot rows of H b + 8k bytes */
  double drow = 16 * 2 + 8 * 4, crow = 16 * 2;
  assert_near(r.dispatch.v[0 * 8 + 2], T * p_n / m * drow, 1e-9);
  /* rank 0 to rank 1 (its server mate): the pilots of rank 0's own tokens
   * there, and, for each of the 8 sources' tokens that touch server 0 with
   * rank 0 as the pilot, a replica when rank 1 holds another of them */
  double replicas = 8 * T * (p_r - p_n / m);
  assert_near(r.dispatch.v[0 * 8 + 1], (T * p_n / m + replicas) * drow, 1e-9);
  /* every row comes back in the combine: the transpose at H b bytes */
  for (int64_t i = 0; i < 8; i++)
    for (int64_t j = 0; j < 8; j++)
      assert_near(r.combine.v[j * 8 + i], r.dispatch.v[i * 8 + j] / drow * crow, 1e-9);
  /* against the flat dispatch of the same routing: T k (ep - m)/ep rows
   * per rank cross servers */
  xm_fab_synth_t f = s;
  f.rbd = false;
  xm_fab_synth_result_t rf;
  synth_ok(&f, &rf);
  assert_near(rf.inter_rows, 8 * T * 4 * 6 / 8, 1e-9);
  assert_true(r.inter_rows < rf.inter_rows);
  xm_fab_synth_result_free(&rf);
  xm_fab_synth_result_free(&r);
}

static void test_synth_by_server(void **state) {
  (void)state;
  xm_fab_synth_t s = base_synth();
  s.world = 16;
  s.ep = 8;
  s.experts = 32;
  s.top_k = 4;
  s.rbd = true;
  s.zipf = 1.0;
  s.locality = 0.5;
  s.source_affinity = 0.5;
  s.affinity_experts = 8;
  xm_fab_synth_result_t r, rs;
  synth_ok(&s, &r);
  s.by_server = true;
  synth_ok(&s, &rs);
  assert_int_equal(rs.dispatch.n, 8);
  xm_fab_matrix_t agg;
  assert_int_equal(xm_fab_matrix_to_servers(&r.dispatch, 2, &agg), XM_OK);
  for (int64_t i = 0; i < 64; i++)
    assert_near(rs.dispatch.v[i], agg.v[i], 1e-9 * (1 + agg.v[i]));
  assert_near(rs.inter_rows, r.inter_rows, 1e-9);
  /* the server diagonal holds the intra-server bytes */
  double intra, inter;
  xm_fab_matrix_split(&r.dispatch, 2, &intra, &inter);
  double diag = 0;
  for (int64_t a = 0; a < 8; a++)
    diag += rs.dispatch.v[a * 8 + a];
  assert_near(diag, intra, 1e-9 * intra);
  double share = 0;
  for (int64_t e = 0; e < 32; e++)
    share += r.expert_share[e];
  assert_near(share, 1, 1e-12);
  xm_fab_matrix_free(&agg);
  xm_fab_synth_result_free(&r);
  xm_fab_synth_result_free(&rs);
}

static void test_synth_fit_loads(void **state) {
  (void)state;
  double loads[8] = {0.3, 0.2, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05};
  xm_fab_synth_t s = base_synth();
  s.loads = loads;
  s.fit_loads = true;
  xm_fab_synth_result_t r;
  synth_ok(&s, &r);
  for (int e = 0; e < 8; e++)
    assert_near(r.expert_share[e], loads[e], 1e-8);
  /* rank 0 holds experts 0, 1 (half the slots): the others send it T k / 2 */
  assert_near(r.dispatch.v[1 * 8 + 0], 10.0 * 2 * 0.5 * 32, 1e-6);
  assert_near(r.dispatch.v[1 * 8 + 3], 10.0 * 2 * 0.1 * 32, 1e-6);
  xm_fab_synth_result_free(&r);
  /* the loads as plain weights: a token takes an expert at most once, so
   * the popular one gets less than its weight */
  s.fit_loads = false;
  synth_ok(&s, &r);
  assert_true(r.expert_share[0] < 0.3 - 0.01);
  assert_true(r.expert_share[7] > 0.05);
  xm_fab_synth_result_free(&r);
}

/* ---- synthesis: the parameters move the shares --------------------------------- */

/* Largest over the mean of the bytes each rank receives. */
static double column_peak(const xm_fab_matrix_t *m) {
  double mx = 0, sum = 0;
  for (int64_t j = 0; j < m->n; j++) {
    double c = 0;
    for (int64_t i = 0; i < m->n; i++)
      c += m->v[i * m->n + j];
    sum += c;
    if (c > mx) mx = c;
  }
  return mx / (sum / (double)m->n);
}

static xm_fab_synth_t big_synth(void) {
  return (xm_fab_synth_t){.world = 64,
                          .ranks_per_server = 4,
                          .ep = 64,
                          .experts = 128,
                          .top_k = 4,
                          .hidden = 64,
                          .tokens = 100,
                          .bytes_per_element = 2,
                          .rbd = true,
                          .seed = 42};
}

static void test_synth_directions(void **state) {
  (void)state;
  xm_fab_synth_t s = big_synth();
  xm_fab_synth_result_t u, z, loc, scat, home;
  synth_ok(&s, &u);
  /* skew: a few experts (and their ranks) receive much more */
  s.zipf = 1.2;
  synth_ok(&s, &z);
  assert_near(column_peak(&u.dispatch), 1, 1e-9);
  assert_true(column_peak(&z.dispatch) > 1.5);
  double top = 0;
  for (int64_t e = 0; e < 128; e++)
    top = z.expert_share[e] > top ? z.expert_share[e] : top;
  assert_true(top > 4.0 / 128);
  /* co-selection within a server's experts (the default groups): fewer
   * servers per token, fewer pilots across servers, more bytes kept in */
  s.zipf = 0;
  s.locality = 0.9;
  synth_ok(&s, &loc);
  assert_true(loc.inter_rows < 0.6 * u.inter_rows);
  /* the same co-selection with groups scattered over the servers saves
   * almost nothing: placement matters */
  s.affinity_scattered = true;
  synth_ok(&s, &scat);
  assert_true(scat.inter_rows > 0.9 * u.inter_rows);
  assert_true(scat.inter_rows > loc.inter_rows);
  /* source affinity: each server's tokens use its home group, so a few
   * server pairs carry most bytes */
  s.affinity_scattered = false;
  s.locality = 1;
  s.source_affinity = 1;
  synth_ok(&s, &home);
  int64_t k10 = xm_fab_pairs_for_fraction(16, 0.10);
  assert_int_equal(k10, 12);
  double su = xm_fab_top_pairs_share(&u.dispatch, 4, k10);
  double sh = xm_fab_top_pairs_share(&home.dispatch, 4, k10);
  assert_near(su, 12.0 / 120, 1e-9); /* uniform: every pair alike */
  assert_true(sh > su + 0.3);
  /* seeds: another layer draws another popularity order */
  xm_fab_synth_t a = big_synth(), b = big_synth();
  a.zipf = b.zipf = 1.0;
  b.layer = 1;
  xm_fab_synth_result_t ra, rb, ra2;
  synth_ok(&a, &ra);
  synth_ok(&a, &ra2);
  synth_ok(&b, &rb);
  assert_near(xm_fab_matrix_tvd(&ra.dispatch, &ra2.dispatch), 0, 0);
  assert_true(xm_fab_matrix_tvd(&ra.dispatch, &rb.dispatch) > 0.05);
  assert_near(xm_fab_matrix_tvd(&u.dispatch, &u.combine), 0, 1e-12); /* symmetric */
  xm_fab_synth_result_free(&u);
  xm_fab_synth_result_free(&z);
  xm_fab_synth_result_free(&loc);
  xm_fab_synth_result_free(&scat);
  xm_fab_synth_result_free(&home);
  xm_fab_synth_result_free(&ra);
  xm_fab_synth_result_free(&ra2);
  xm_fab_synth_result_free(&rb);
}

static void synth_bad(xm_fab_synth_t s, const char *place) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_fab_synth_result_t r;
  assert_int_equal(xm_fab_synth(&s, &r, &d), XM_ERR_INVALID_INPUT);
  if (xm_diag_find(&d, place) < 0) {
    xm_diag_print(&d, stderr);
    fail_msg("no error at %s", place);
  }
  assert_null(r.dispatch.v);
  xm_diag_free(&d);
}

static void test_synth_errors(void **state) {
  (void)state;
  xm_fab_synth_t s = base_synth();
  s.ep = 3;
  synth_bad(s, "ep");
  s = base_synth();
  s.top_k = 9;
  synth_bad(s, "top_k");
  s = base_synth();
  s.ranks_per_server = 3;
  synth_bad(s, "ranks_per_server");
  s = base_synth();
  s.locality = 1.5;
  synth_bad(s, "locality");
  s = base_synth();
  s.locality = 0.5;
  s.affinity_experts = 1; /* a group of 1 cannot hold top-2 */
  synth_bad(s, "affinity_experts");
  s = base_synth();
  s.affinity_experts = 3;
  synth_bad(s, "affinity_experts");
  double loads[8] = {0.6, 0.1, 0.1, 0.1, 0.1, 0, 0, 0};
  s = base_synth();
  s.loads = loads;
  s.fit_loads = true;
  synth_bad(s, "loads/0"); /* 0.6 > 1/top_k */
  double few[8] = {1, 0, 0, 0, 0, 0, 0, 0};
  s.loads = few;
  s.fit_loads = false;
  synth_bad(s, "loads");
  s = base_synth();
  s.world = 8192;
  s.ranks_per_server = 8;
  synth_bad(s, "world"); /* an 8192 x 8192 rank matrix: ask for servers */
}

/* ---- locality ------------------------------------------------------------------- */

static void test_locality(void **state) {
  (void)state;
  /* 8 ranks, 2 per server: 4 servers, regions of 2 servers */
  xm_fab_matrix_t m;
  assert_int_equal(xm_fab_matrix_init(&m, 8), XM_OK);
  m.v[0 * 8 + 1] = 10; /* inside server 0 */
  m.v[0 * 8 + 2] = 20; /* server 0 -> 1: same region */
  m.v[3 * 8 + 1] = 5;  /* server 1 -> 0 */
  m.v[4 * 8 + 7] = 15; /* server 2 -> 3 */
  m.v[1 * 8 + 6] = 50; /* server 0 -> 3: across regions */
  xm_fab_locality_t L;
  assert_int_equal(xm_fab_locality(&m, 2, 2, &L), XM_OK);
  assert_near(L.total, 100, 0);
  assert_near(L.intra_server, 0.10, 1e-12);
  assert_near(L.intra_region, 0.50, 1e-12);
  assert_near(L.inter_server, 90, 0);
  assert_int_equal(L.servers, 4);
  assert_int_equal(L.pairs, 6);
  assert_int_equal(L.active_pairs, 3);
  /* pairs: {0,3} 50, {0,1} 25, {2,3} 15 */
  assert_near(xm_fab_top_pairs_share(&m, 2, 1), 50.0 / 90, 1e-12);
  assert_near(xm_fab_top_pairs_share(&m, 2, 2), 75.0 / 90, 1e-12);
  assert_near(xm_fab_top_pairs_share(&m, 2, 6), 1, 1e-12);
  assert_int_equal(xm_fab_pairs_for_fraction(4, 0.01), 1);
  assert_int_equal(xm_fab_pairs_for_fraction(4, 0.5), 3);
  /* the same on the server matrix */
  xm_fab_matrix_t s;
  assert_int_equal(xm_fab_matrix_to_servers(&m, 2, &s), XM_OK);
  assert_near(s.v[0 * 4 + 0], 10, 0);
  assert_near(s.v[0 * 4 + 3], 50, 0);
  xm_fab_locality_t Ls;
  assert_int_equal(xm_fab_locality(&s, 1, 2, &Ls), XM_OK);
  assert_near(Ls.intra_region, L.intra_region, 1e-12);
  assert_near(xm_fab_top_pairs_share(&s, 1, 2), 75.0 / 90, 1e-12);
  assert_int_equal(xm_fab_locality(&m, 3, 0, &L), XM_ERR_INVALID_INPUT);
  /* change: scaling keeps the pattern; moving 50 bytes of 100 is 0.5 */
  xm_fab_matrix_t b;
  assert_int_equal(xm_fab_matrix_init(&b, 8), XM_OK);
  memcpy(b.v, m.v, 64 * sizeof *b.v);
  for (int i = 0; i < 64; i++)
    b.v[i] *= 3;
  assert_near(xm_fab_matrix_tvd(&m, &b), 0, 1e-12);
  assert_near(xm_fab_top_pairs_overlap(&m, &b, 2, 2), 1, 0);
  memcpy(b.v, m.v, 64 * sizeof *b.v);
  b.v[1 * 8 + 6] = 0;
  b.v[5 * 8 + 6] = 50; /* the heaviest pair moves to {2,3} */
  assert_near(xm_fab_matrix_tvd(&m, &b), 0.5, 1e-12);
  /* top 2 of a: {0,3}, {0,1}; of b: {2,3} 65, {0,1} 25 */
  assert_near(xm_fab_top_pairs_overlap(&m, &b, 2, 2), 0.5, 0);
  assert_near(xm_fab_top_pairs_overlap(&m, &b, 2, 1), 0, 0);
  xm_fab_matrix_t z;
  assert_int_equal(xm_fab_matrix_init(&z, 8), XM_OK);
  assert_near(xm_fab_matrix_tvd(&z, &z), 0, 0);
  assert_near(xm_fab_matrix_tvd(&z, &m), 1, 0);
  assert_near(xm_fab_top_pairs_overlap(&z, &z, 2, 3), 1, 0);
  assert_near(xm_fab_top_pairs_share(&z, 2, 3), 0, 0);
  /* ties go to the lower pair index */
  xm_fab_matrix_t t;
  assert_int_equal(xm_fab_matrix_init(&t, 3), XM_OK);
  t.v[0 * 3 + 1] = t.v[1 * 3 + 2] = t.v[0 * 3 + 2] = 7;
  xm_fab_matrix_t t2;
  assert_int_equal(xm_fab_matrix_init(&t2, 3), XM_OK);
  t2.v[0 * 3 + 1] = 7;
  assert_near(xm_fab_top_pairs_overlap(&t, &t2, 1, 1), 1, 0);
  xm_fab_matrix_free(&t);
  xm_fab_matrix_free(&t2);
  xm_fab_matrix_free(&z);
  xm_fab_matrix_free(&b);
  xm_fab_matrix_free(&s);
  xm_fab_matrix_free(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_traffic_file),       cmocka_unit_test(test_traffic_errors),
      cmocka_unit_test(test_step_log),           cmocka_unit_test(test_step_log_errors),
      cmocka_unit_test(test_synth_uniform_flat), cmocka_unit_test(test_synth_uniform_rbd),
      cmocka_unit_test(test_synth_by_server),    cmocka_unit_test(test_synth_fit_loads),
      cmocka_unit_test(test_synth_directions),   cmocka_unit_test(test_synth_errors),
      cmocka_unit_test(test_locality),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
