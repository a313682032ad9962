/* tests/unit/test_routing.c — measured routing as planner input
 * (planner/routing.c) and its effect on the cost model and the search.
 *
 * Parsing: a histogram's shares, counts and per-layer rows, the block
 * imbalance and RBD copies by hand (docs/cost-model.md, "Measured
 * routing"); every malformed histogram and log reported at its place.
 * Effect: a skewed histogram scales the padding-free dispatch time by the
 * busiest rank's imbalance (exactly, on a network without latency) and the
 * expert compute, leaves the bytes and the padded policies alone, grows
 * X-MoE's buffers, and refuses xmoec points whose receive buffers cannot
 * hold it (also in the search); a log of an RBD run scales the RBD
 * inter-node bytes by its measured ratio.
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

#include "planner/cost.h"
#include "planner/plan.h"
#include "planner/routing.h"

#define assert_near(a, b, tol)                                                                     \
  do {                                                                                             \
    double a_ = (double)(a), b_ = (double)(b);                                                     \
    if (!(fabs(a_ - b_) <= (tol))) fail_msg("%s = %.12g, expected %.12g", #a, a_, b_);             \
  } while (0)

static xm_routing_t *load_ok(const char *text, const xm_routing_options_t *o) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_routing_t *r = NULL;
  xm_status_t st = xm_routing_load_text(text, strlen(text), "test.json", o, &d, &r);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  assert_non_null(r);
  xm_diag_free(&d);
  return r;
}

/* Loading fails with an error at `place` (a JSON pointer, "line N", or
 * NULL: any) whose file or message contains `needle` (NULL: any). */
static void load_bad(const char *text, const xm_routing_options_t *o, const char *place,
                     const char *needle) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_routing_t *r = (xm_routing_t *)1;
  xm_status_t st = xm_routing_load_text(text, strlen(text), "test.json", o, &d, &r);
  if (st != XM_ERR_INVALID_INPUT) fail_msg("accepted: %s", text);
  assert_null(r);
  assert_true(xm_diag_error_count(&d) > 0);
  bool found = false;
  for (int i = 0; i < d.count && !found; i++) {
    const xm_diag_entry_t *e = &d.entries[i];
    bool at = !place || (e->place && strcmp(e->place, place) == 0);
    bool says = !needle || strstr(e->message, needle) || (e->file && strstr(e->file, needle));
    found = at && says;
  }
  if (!found) {
    xm_diag_print(&d, stderr);
    fail_msg("no error at '%s' saying '%s' for: %s", place ? place : "(any)",
             needle ? needle : "(any)", text);
  }
  xm_diag_free(&d);
}

/* ---- parsing ---------------------------------------------------------------- */

static void test_histogram_shares(void **state) {
  (void)state;
  xm_routing_options_t o = {.experts = 4, .top_k = 2};
  xm_routing_t *r = load_ok("{\"comment\": \"by hand\", \"experts\": 4, \"top_k\": 2, "
                            "\"expert_load\": [0.4, 0.3, 0.2, 0.1]}",
                            &o);
  assert_int_equal(r->kind, XM_ROUTING_HISTOGRAM);
  assert_string_equal(xm_routing_kind_name(r->kind), "histogram");
  assert_int_equal(r->experts, 4);
  assert_int_equal(r->top_k, 2);
  assert_int_equal(r->layers, 1);
  assert_false(r->rbd_measured);
  /* blocks of E/parts experts: ep 2 -> 0.7 of the slots on rank 0 */
  assert_near(xm_routing_imbalance(r, 1, false), 1.0, 1e-12);
  assert_near(xm_routing_imbalance(r, 2, false), 1.4, 1e-12);
  assert_near(xm_routing_imbalance(r, 4, false), 1.6, 1e-12);
  assert_near(xm_routing_imbalance(r, 4, true), 1.6, 1e-12);
  /* a density over the expert index: 3 blocks end at 4/3 and 8/3 experts,
   * the first holds 0.4 + 0.3/3 = 0.5; 8 blocks halve the experts */
  assert_near(xm_routing_imbalance(r, 3, false), 1.5, 1e-12);
  assert_near(xm_routing_imbalance(r, 8, false), 1.6, 1e-12);
  /* RBD copies from the loads over 2 nodes: (1 - 0.3^2) + (1 - 0.7^2) = 1.42
   * against 2 (1 - 0.5^2) = 1.5 uniform, times copies(4, 2, 2) = 5/3 */
  assert_near(xm_routing_dedup(r, 2, 2), 1.42 / 1.5, 1e-12);
  assert_near(xm_routing_rbd_copies(r, 4, 2, 2), 5.0 / 3.0 * 1.42 / 1.5, 1e-12);
  /* one expert per block: k copies whatever the routing */
  assert_near(xm_routing_rbd_copies(r, 4, 2, 4), 2.0, 1e-12);
  /* no routing: uniform */
  assert_near(xm_routing_imbalance(NULL, 4, true), 1.0, 0);
  assert_near(xm_routing_rbd_copies(NULL, 4, 2, 2), 5.0 / 3.0, 1e-12);
  /* an uncached block count gives what the table would */
  assert_near(xm_routing_dedup(r, 3, 2), (1 - pow(0.3, 3) + 1 - pow(0.7, 3)) / (2 * (1 - 0.125)),
              1e-12);
  xm_routing_free(r);
}

static void test_histogram_layers_counts(void **state) {
  (void)state;
  /* counts, one row per MoE layer: layer 0 uniform, layer 1 all on expert 0 */
  xm_routing_t *r = load_ok(
      "{\"experts\": 4, \"top_k\": 1, \"expert_counts\": [[5, 5, 5, 5], [12, 0, 0, 0]]}", NULL);
  assert_int_equal(r->layers, 2);
  assert_near(r->load[4], 1.0, 0);
  assert_near(xm_routing_imbalance(r, 2, false), (1.0 + 2.0) / 2, 1e-12);
  assert_near(xm_routing_imbalance(r, 2, true), 2.0, 1e-12);
  assert_near(xm_routing_imbalance(r, 4, false), (1.0 + 4.0) / 2, 1e-12);
  assert_near(xm_routing_imbalance(r, 4, true), 4.0, 1e-12);
  xm_routing_free(r);
  /* shares within 1e-3 of 1 are renormalised */
  r = load_ok("{\"experts\": 2, \"top_k\": 1, \"expert_load\": [0.7504, 0.2500]}", NULL);
  assert_near(r->load[0] + r->load[1], 1.0, 1e-15);
  xm_routing_free(r);
}

static void test_histogram_rbd(void **state) {
  (void)state;
  /* measured: 1.5 nodes per token over 2 nodes; uniform copies(8, 2, 2) =
   * 2 (1 - C(4,2)/C(8,2)) = 11/7 */
  xm_routing_t *r = load_ok("{\"experts\": 8, \"top_k\": 2, \"expert_load\": [0.125, 0.125, "
                            "0.125, 0.125, 0.125, 0.125, 0.125, 0.125],"
                            " \"rbd\": {\"nodes\": 2, \"copies_per_token\": 1.5}}",
                            NULL);
  assert_true(r->rbd_measured);
  assert_int_equal(r->rbd_nodes, 2);
  assert_near(r->rbd_dedup, 1.5 / (11.0 / 7.0), 1e-12);
  assert_near(xm_routing_rbd_copies(r, 8, 2, 2), 1.5, 1e-12);
  /* the ratio carries over to other node counts: copies(8, 2, 4) = 13/7 */
  assert_near(xm_routing_rbd_copies(r, 8, 2, 4), 13.0 / 7.0 * r->rbd_dedup, 1e-12);
  assert_near(xm_routing_imbalance(r, 8, true), 1.0, 1e-12);
  xm_routing_free(r);
  /* the same from the log's rows: 60 pilots for 80 flat slots, k = 2 */
  r = load_ok("{\"experts\": 8, \"top_k\": 2, \"expert_load\": [0.125, 0.125, 0.125, 0.125, "
              "0.125, 0.125, 0.125, 0.125], \"rbd\": {\"nodes\": 2, \"inter_rows\": 60, "
              "\"flat_inter_rows\": 80}}",
              NULL);
  assert_near(r->rbd_copies, 1.5, 1e-12);
  assert_near(r->inter_rows, 60, 0);
  xm_routing_free(r);
}

static void test_histogram_errors(void **state) {
  (void)state;
  xm_routing_options_t o = {.experts = 4, .top_k = 2};
  const char *base = "\"experts\": 4, \"top_k\": 2";
  char t[512];
  load_bad("", &o, NULL, "empty");
  load_bad("  \n", &o, NULL, "empty");
  load_bad("{\"experts\": 4,\n \"top_k\": }", &o, "2:11", "JSON syntax error");
  load_bad("[0.5, 0.5]", &o, "", "must be a JSON object");
  load_bad("{\"top_k\": 2, \"expert_load\": [1]}", &o, "/experts", "missing");
  load_bad("{\"experts\": 4, \"expert_load\": [0.25, 0.25, 0.25, 0.25]}", &o, "/top_k", "missing");
  load_bad("{\"experts\": 4.5, \"top_k\": 2, \"expert_load\": [1]}", &o, "/experts", "whole");
  load_bad("{\"experts\": 4, \"top_k\": 5, \"expert_load\": [0.25, 0.25, 0.25, 0.25]}", NULL,
           "/top_k", "[1, 4]");
  snprintf(t, sizeof t, "{%s}", base);
  load_bad(t, &o, "/expert_load", "missing");
  snprintf(t, sizeof t, "{%s, \"expert_load\": [0.5, 0.5]}", base);
  load_bad(t, &o, "/expert_load", "has 2 values");
  snprintf(t, sizeof t, "{%s, \"expert_load\": [0.5, 0.5, -0.1, 0.1]}", base);
  load_bad(t, &o, "/expert_load/2", ">= 0");
  snprintf(t, sizeof t, "{%s, \"expert_load\": [0.5, 0.2, 0.1, 0.1]}", base);
  load_bad(t, &o, "/expert_load", "sum to 0.9");
  snprintf(t, sizeof t, "{%s, \"expert_load\": [[0.25, 0.25, 0.25, 0.25], [1, 0, 0]]}", base);
  load_bad(t, &o, "/expert_load/1", "has 3 values");
  snprintf(t, sizeof t, "{%s, \"expert_counts\": [[1, 1, 1, 1], [1, 1, 1, \"x\"]]}", base);
  load_bad(t, &o, "/expert_counts/1/3", ">= 0");
  snprintf(t, sizeof t, "{%s, \"expert_counts\": [0, 0, 0, 0]}", base);
  load_bad(t, &o, "/expert_counts", "all zeros");
  snprintf(t, sizeof t, "{%s, \"expert_load\": [1, 0, 0, 0], \"expert_counts\": [1, 0, 0, 0]}",
           base);
  load_bad(t, &o, "/expert_counts", "not both");
  snprintf(t, sizeof t, "{%s, \"expert_load\": [1, 0, 0, 0], \"bogus\": 1}", base);
  load_bad(t, &o, "/bogus", "unknown member");
  /* the model's experts and top_k */
  xm_routing_options_t o8 = {.experts = 8, .top_k = 2};
  snprintf(t, sizeof t, "{%s, \"expert_load\": [1, 0, 0, 0]}", base);
  load_bad(t, &o8, "/experts", "the histogram has 4 experts, the model 8");
  xm_routing_options_t ok1 = {.experts = 4, .top_k = 1};
  load_bad(t, &ok1, "/top_k", "top_k 2, the model 1");
  xm_routing_options_t on = {.experts = 4, .top_k = 2, .log_nodes = 2};
  load_bad(t, &on, NULL, "--routing-nodes");
  /* rbd */
  snprintf(t, sizeof t,
           "{%s, \"expert_load\": [1, 0, 0, 0], \"rbd\": {\"nodes\": 2, "
           "\"copies_per_token\": 2.5}}",
           base);
  load_bad(t, &o, "/rbd/copies_per_token", "[1, 2]");
  snprintf(t, sizeof t,
           "{%s, \"expert_load\": [1, 0, 0, 0], \"rbd\": {\"nodes\": 1, "
           "\"copies_per_token\": 1}}",
           base);
  load_bad(t, &o, "/rbd/nodes", "[2, 4]");
  snprintf(t, sizeof t,
           "{%s, \"expert_load\": [1, 0, 0, 0], \"rbd\": {\"nodes\": 2, "
           "\"inter_rows\": 90, \"flat_inter_rows\": 80}}",
           base);
  load_bad(t, &o, "/rbd/inter_rows", "exceeds");
  snprintf(t, sizeof t, "{%s, \"expert_load\": [1, 0, 0, 0], \"rbd\": {\"nodes\": 2}}", base);
  load_bad(t, &o, "/rbd", "either copies_per_token");
  snprintf(t, sizeof t,
           "{%s, \"expert_load\": [1, 0, 0, 0], \"rbd\": {\"nodes\": 2, "
           "\"copies_per_token\": 1.2, \"extra\": 0}}",
           base);
  load_bad(t, &o, "/rbd/extra", "unknown member");
  /* a file that cannot be read */
  xm_diag_t d;
  xm_diag_init(&d);
  xm_routing_t *r = NULL;
  assert_int_equal(xm_routing_load_file("/nonexistent/routing.json", &o, &d, &r), XM_ERR_IO);
  assert_null(r);
  assert_string_equal(d.entries[0].file, "/nonexistent/routing.json");
  xm_diag_free(&d);
}

/* Three steps of an RBD run's log (other members abridged). */
static const char *k_log =
    "{\"step\":1,\"loss\":5.69,\"traffic\":{\"intra_bytes\":1,\"inter_bytes\":2},"
    "\"rbd\":{\"inter_rows\":70,\"flat_inter_rows\":100}}\n"
    "\n"
    "{\"step\":2,\"loss\":5.45,\"rbd\":{\"inter_rows\":66,\"flat_inter_rows\":90}}\n"
    "{\"step\":3,\"loss\":5.19,\"rbd\":{\"inter_rows\":74,\"flat_inter_rows\":110}}\n";

static void test_log(void **state) {
  (void)state;
  xm_routing_options_t o = {.experts = 8, .top_k = 2, .log_nodes = 2};
  xm_routing_t *r = load_ok(k_log, &o);
  assert_int_equal(r->kind, XM_ROUTING_LOG);
  assert_int_equal(r->log_lines, 3);
  assert_int_equal(r->log_rbd_lines, 3);
  assert_near(r->inter_rows, 210, 0);
  assert_near(r->flat_inter_rows, 300, 0);
  /* 210 / 300 x k = 1.4 nodes per token at 2 nodes; uniform 11/7 */
  assert_true(r->rbd_measured);
  assert_near(r->rbd_copies, 1.4, 1e-12);
  assert_near(r->rbd_dedup, 1.4 / (11.0 / 7.0), 1e-12);
  assert_int_equal(r->layers, 0);
  assert_near(xm_routing_imbalance(r, 4, true), 1.0, 0); /* a log has no loads */
  assert_near(xm_routing_rbd_copies(r, 8, 2, 2), 1.4, 1e-12);
  xm_routing_free(r);
  /* a one-line log is a log too */
  r = load_ok("{\"step\":9,\"rbd\":{\"inter_rows\":7,\"flat_inter_rows\":10}}", &o);
  assert_int_equal(r->kind, XM_ROUTING_LOG);
  xm_routing_free(r);
}

static void test_log_errors(void **state) {
  (void)state;
  xm_routing_options_t o = {.experts = 8, .top_k = 2, .log_nodes = 2};
  load_bad("{\"step\":1,\"rbd\":{\"inter_rows\":7,\"flat_inter_rows\":10}}\n{\"step\":2,\n", &o,
           "line 2", "not valid JSON");
  load_bad("{\"step\":1,\"rbd\":{\"inter_rows\":7,\"flat_inter_rows\":10}}\n{\"loss\":2}\n", &o,
           "line 2", "/step");
  load_bad("{\"step\":1}\n{\"step\":2,\"rbd\":{\"inter_rows\":11,\"flat_inter_rows\":10}}\n", &o,
           "line 2", "exceeds");
  load_bad("{\"step\":1}\n\n{\"step\":2,\"rbd\":{\"inter_rows\":-1,\"flat_inter_rows\":10}}\n", &o,
           "line 3", "/rbd/inter_rows");
  load_bad("{\"step\":1}\n{\"step\":2,\"rbd\":{\"inter_rows\":1}}\n", &o, "line 2",
           "/rbd/flat_inter_rows");
  /* a flat run's log measures nothing that carries over */
  load_bad("{\"step\":1,\"traffic\":{}}\n{\"step\":2}\n", &o, NULL, "no line has an \"rbd\"");
  load_bad("{\"step\":1,\"rbd\":{\"inter_rows\":0,\"flat_inter_rows\":0}}\n", &o, NULL,
           "no slot crossed nodes");
  /* the run's node count is needed, and must fit the ratio */
  xm_routing_options_t nn = {.experts = 8, .top_k = 2};
  load_bad(k_log, &nn, NULL, "--routing-nodes");
  xm_routing_options_t k8 = {.experts = 16, .top_k = 8, .log_nodes = 2};
  load_bad(k_log, &k8, NULL, "is --routing-nodes 2 the nodes");
  xm_routing_options_t none = {0};
  load_bad(k_log, &none, NULL, "experts and top_k");
}

/* ---- effect on the cost model --------------------------------------------------- */

static void load_layouts(xm_spec_t *s) {
  char path[512];
  snprintf(path, sizeof path, "%s/tests/e2e/inputs/layouts.json", XM_SOURCE_DIR);
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(xm_spec_load_file(path, &d, s), XM_OK);
  xm_diag_free(&d);
}

static xm_cost_point_t point(int64_t dp, int64_t ep, bool rbd, xm_policy_t pol, int64_t bound) {
  xm_cost_point_t p;
  memset(&p, 0, sizeof p);
  p.layout = (xm_layout_t){.dp = dp, .tp = 1, .ep = ep, .rbd = rbd, .ranks_per_node = 2};
  p.micro_batch = 2;
  p.policy = pol;
  p.recompute = XM_RECOMPUTE_NONE;
  p.dispatch_bound = bound;
  return p;
}

static xm_status_t eval(const xm_spec_t *s, const xm_net_t *n, xm_cost_point_t p,
                        const xm_routing_t *r, xm_diag_t *d, xm_cost_t *out) {
  xm_cost_routing_t rt = {.measured = r};
  return xm_cost_evaluate(s, n, 64.0 * (1 << 30), 100e12, 0.5, &p, r ? &rt : NULL, d, out);
}

static xm_cost_t eval_ok(const xm_spec_t *s, const xm_net_t *n, xm_cost_point_t p,
                         const xm_routing_t *r) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_cost_t c;
  xm_status_t st = eval(s, n, p, r, &d, &c);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  xm_diag_free(&d);
  return c;
}

/* 8 experts: ep 4 blocks hold 0.6, 0.2, 0.1, 0.1 (imbalance 2.4), ep 2
 * blocks 0.8, 0.2 (1.6). */
static const char *k_skew = "{\"experts\": 8, \"top_k\": 2, \"expert_load\": "
                            "[0.3, 0.3, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05]}";

static void test_skew_dispatch(void **state) {
  (void)state;
  xm_spec_t s;
  load_layouts(&s);
  /* no latency: the all-to-all time is proportional to the bytes */
  xm_net_t n = {.nodes = 2, .ranks_per_node = 2, .intra_bw = 100e9, .inter_bw = 10e9};
  xm_routing_options_t o = {.experts = 8, .top_k = 2};
  xm_routing_t *r = load_ok(k_skew, &o);
  assert_near(xm_routing_imbalance(r, 4, true), 2.4, 1e-12);

  xm_cost_t u = eval_ok(&s, &n, point(4, 4, false, XM_POLICY_XMOEC, 4), NULL);
  xm_cost_t k = eval_ok(&s, &n, point(4, 4, false, XM_POLICY_XMOEC, 4), r);
  assert_true(u.t_dispatch > 0);
  assert_near(k.t_dispatch / u.t_dispatch, 2.4, 1e-9);
  /* the bytes are the routing's expectation, skewed or not */
  assert_near(k.bytes_dispatch_intra, u.bytes_dispatch_intra, 1e-6);
  assert_near(k.bytes_dispatch_inter, u.bytes_dispatch_inter, 1e-6);
  /* the busiest rank computes 1.4 more expert rows: 3 x (2 N H F_e 3)
   * FLOPs per MoE layer, N = T k = 64 x 2, one micro-step, 50 TFLOP/s */
  double expert = 2.0 * 128 * 64 * 32 * 3;
  assert_near(k.t_compute - u.t_compute, 3 * 1.4 * expert / 50e12, 1e-15);
  assert_true(k.t_step > u.t_step);
  /* xmoec's static buffers are unchanged; only the time moves */
  assert_near(k.total, u.total, 0);

  /* ep 2: imbalance 1.6 */
  xm_cost_t u2 = eval_ok(&s, &n, point(4, 2, false, XM_POLICY_XMOEC, 4), NULL);
  xm_cost_t k2 = eval_ok(&s, &n, point(4, 2, false, XM_POLICY_XMOEC, 4), r);
  assert_near(k2.t_dispatch / u2.t_dispatch, 1.6, 1e-9);

  /* X-MoE allocates what arrives: the busiest rank's buffers grow */
  xm_cost_t ux = eval_ok(&s, &n, point(4, 4, false, XM_POLICY_XMOE, 0), NULL);
  xm_cost_t kx = eval_ok(&s, &n, point(4, 4, false, XM_POLICY_XMOE, 0), r);
  assert_true(kx.activations + kx.buffers > ux.activations + ux.buffers);
  assert_near(kx.t_dispatch / ux.t_dispatch, 2.4, 1e-9);

  /* capacity-padded buffers are sent whole whatever the routing */
  for (int pol = XM_POLICY_DEEPSPEED_MOE; pol <= XM_POLICY_TUTEL; pol++) {
    xm_cost_t up = eval_ok(&s, &n, point(4, 4, false, (xm_policy_t)pol, 0), NULL);
    xm_cost_t kp = eval_ok(&s, &n, point(4, 4, false, (xm_policy_t)pol, 0), r);
    assert_near(kp.t_step, up.t_step, 0);
    assert_near(kp.total, up.total, 0);
  }
  xm_routing_free(r);
}

static void test_skew_rejects(void **state) {
  (void)state;
  xm_spec_t s;
  load_layouts(&s);
  xm_net_t n = {.nodes = 2,
                .ranks_per_node = 2,
                .intra_bw = 100e9,
                .inter_bw = 10e9,
                .intra_lat = 2e-6,
                .inter_lat = 5e-6};
  xm_routing_options_t o = {.experts = 8, .top_k = 2};
  xm_routing_t *r = load_ok(k_skew, &o);
  xm_cost_t c;
  /* receive buffers of min(4, 2) = 2x the mean cannot hold 2.4x */
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(eval(&s, &n, point(4, 4, false, XM_POLICY_XMOEC, 2), r, &d, &c),
                   XM_ERR_INVALID_INPUT);
  assert_int_equal(d.count, 1);
  if (!strstr(d.entries[0].message, "busiest EP rank gets 2.40x its fair share") ||
      !strstr(d.entries[0].message, "min(ep, 2) = 2x (--dispatch-bound 3 holds it)"))
    fail_msg("message: %s", d.entries[0].message);
  xm_diag_free(&d);
  /* uniform routing fits them; so do buffers of 4x, and ep 2 (1.6x) */
  assert_int_equal(eval(&s, &n, point(4, 4, false, XM_POLICY_XMOEC, 2), NULL, NULL, &c), XM_OK);
  assert_int_equal(eval(&s, &n, point(4, 4, false, XM_POLICY_XMOEC, 4), r, NULL, &c), XM_OK);
  assert_int_equal(eval(&s, &n, point(4, 2, false, XM_POLICY_XMOEC, 2), r, NULL, &c), XM_OK);
  /* the worst layer decides: a second, uniform layer does not help */
  xm_routing_t *r2 = load_ok("{\"experts\": 8, \"top_k\": 2, \"expert_load\": [[0.3, 0.3, 0.1, "
                             "0.1, 0.05, 0.05, 0.05, 0.05], [0.125, 0.125, 0.125, 0.125, 0.125, "
                             "0.125, 0.125, 0.125]]}",
                             &o);
  assert_near(xm_routing_imbalance(r2, 4, false), 1.7, 1e-12);
  assert_int_equal(eval(&s, &n, point(4, 4, false, XM_POLICY_XMOEC, 2), r2, NULL, &c),
                   XM_ERR_INVALID_INPUT);
  xm_routing_free(r2);
  xm_routing_free(r);
}

static void test_log_rbd_bytes(void **state) {
  (void)state;
  xm_spec_t s;
  load_layouts(&s);
  xm_net_t n = {.nodes = 2,
                .ranks_per_node = 2,
                .intra_bw = 100e9,
                .inter_bw = 10e9,
                .intra_lat = 2e-6,
                .inter_lat = 5e-6};
  xm_routing_options_t o = {.experts = 8, .top_k = 2, .log_nodes = 2};
  xm_routing_t *r = load_ok(k_log, &o);
  xm_cost_t u = eval_ok(&s, &n, point(4, 4, true, XM_POLICY_XMOEC, 4), NULL);
  xm_cost_t m = eval_ok(&s, &n, point(4, 4, true, XM_POLICY_XMOEC, 4), r);
  /* the pilots across nodes scale with the measured copies: 1.4 / (11/7) */
  assert_near(m.bytes_dispatch_inter / u.bytes_dispatch_inter, 1.4 / (11.0 / 7.0), 1e-12);
  /* by hand: 4 ranks x 64 tokens x (n - 1) x 1.4 / 2 pilots, bytes per pilot
   * 4 (H + 2k) + 4H + 4H + 4k + 4H (docs/traffic.md) */
  double per_row = 4 * (64 + 4) + 4 * 64 + 4 * 64 + 4 * 2 + 4 * 64;
  assert_near(m.bytes_dispatch_inter, 4 * 64 * 0.7 * per_row, 1e-6);
  assert_true(m.t_dispatch < u.t_dispatch);
  /* the flat dispatch of the same layout does not depend on it */
  xm_cost_t uf = eval_ok(&s, &n, point(4, 4, false, XM_POLICY_XMOEC, 4), NULL);
  xm_cost_t mf = eval_ok(&s, &n, point(4, 4, false, XM_POLICY_XMOEC, 4), r);
  assert_near(mf.bytes_dispatch_inter, uf.bytes_dispatch_inter, 0);
  assert_near(mf.t_step, uf.t_step, 0);
  /* a given routing (exact rows) still wins over the measured ratio */
  xm_cost_routing_t given = {
      .given = true, .pilots_inter = 202, .rbd_rows_intra = -1, .measured = r};
  xm_cost_point_t p = point(4, 4, true, XM_POLICY_XMOEC, 4);
  xm_cost_t g;
  assert_int_equal(xm_cost_evaluate(&s, &n, 64.0 * (1 << 30), 100e12, 0.5, &p, &given, NULL, &g),
                   XM_OK);
  assert_near(g.bytes_dispatch_inter, 202.0 * per_row, 1e-6);
  xm_routing_free(r);
}

/* ---- the search --------------------------------------------------------------- */

static int64_t count_reason(const xm_plan_result_t *res, const char *needle) {
  int64_t n = 0;
  for (int64_t i = 0; i < res->num; i++)
    if (strstr(res->cands[i].reason, needle)) n++;
  return n;
}

static void test_search(void **state) {
  (void)state;
  char path[512];
  snprintf(path, sizeof path, "%s/tests/lit/Inputs/plan/inline-cluster.json", XM_SOURCE_DIR);
  xm_spec_t s;
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(xm_spec_load_file(path, &d, &s), XM_OK);
  /* 16 experts: the first 4 (rank 0 at ep 4) take 0.6 of the slots */
  xm_routing_options_t o = {.experts = 16, .top_k = 2};
  xm_routing_t *r = load_ok("{\"experts\": 16, \"top_k\": 2, \"expert_load\": [0.15, 0.15, 0.15, "
                            "0.15, 0.05, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025, 0.025, 0.025, "
                            "0.025, 0.025, 0.025]}",
                            &o);
  assert_near(xm_routing_imbalance(r, 4, true), 2.4, 1e-12);
  xm_cost_routing_t rt = {.measured = r};
  xm_plan_options_t po = {.policy = XM_POLICY_XMOEC, .routing = &rt};
  xm_plan_result_t uni, skew;
  assert_int_equal(xm_plan_search(&s, XM_POLICY_XMOEC, &d, &uni), XM_OK);
  assert_int_equal(xm_plan_search_with(&s, &po, &d, &skew), XM_OK);
  assert_int_equal(uni.num, skew.num);
  assert_int_equal(count_reason(&uni, "busiest EP rank"), 0);
  int64_t refused = count_reason(&skew, "busiest EP rank");
  assert_true(refused > 0);
  assert_int_equal(skew.num_legal, uni.num_legal - refused);
  /* every candidate refused for the routing is an ep 4 one with bound 2 */
  for (int64_t i = 0; i < skew.num; i++)
    if (strstr(skew.cands[i].reason, "busiest EP rank")) {
      assert_int_equal(skew.cands[i].point.layout.ep, 4);
      assert_int_equal(skew.cands[i].point.dispatch_bound, 2);
    }
  /* the skew cannot make the best plan faster */
  assert_true(skew.chosen >= 0 && uni.chosen >= 0);
  assert_true(skew.cands[0].cost.t_step >= uni.cands[0].cost.t_step);
  xm_plan_result_free(&uni);
  xm_plan_result_free(&skew);
  xm_routing_free(r);
  xm_diag_free(&d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_histogram_shares),
      cmocka_unit_test(test_histogram_layers_counts),
      cmocka_unit_test(test_histogram_rbd),
      cmocka_unit_test(test_histogram_errors),
      cmocka_unit_test(test_log),
      cmocka_unit_test(test_log_errors),
      cmocka_unit_test(test_skew_dispatch),
      cmocka_unit_test(test_skew_rejects),
      cmocka_unit_test(test_log_rbd_bytes),
      cmocka_unit_test(test_search),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
