/* tests/unit/test_cost.c — the cost model (planner/cost.c).
 *
 * Unit tests: names, RBD's expected copies, the memory of a small model by
 * category against values computed by hand from docs/cost-model.md,
 * monotonicity (more EP, SSMB, ZeRO-1, recompute), DeepSpeed-MoE's masks
 * growing as T^2, dispatch bytes for a given routing, refusals, and the
 * paper models costed on the Frontier sample cluster.
 *
 * Validation mode: with XM_COST_VALIDATION_DIR set (by
 * tests/e2e/cost_validation.sh, which compiles and runs the programs), the
 * binary instead compares the model with what the compiled programs
 * planned (manifest.json) and logged (the step log's traffic) for every
 * case listed in DIR/cases.txt; docs/cost-model.md records the numbers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/cost.h"

#define assert_near(a, b, tol) assert_true(fabs((double)(a) - (double)(b)) <= (tol))

static void load_text(const char *text, xm_spec_t *s) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_status_t st = xm_spec_load_text(text, strlen(text), "test", &d, s);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  xm_diag_free(&d);
}

static void load_sample(const char *rel, xm_spec_t *s) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", XM_SOURCE_DIR, rel);
  xm_diag_t d;
  xm_diag_init(&d);
  xm_status_t st = xm_spec_load_file(path, &d, s);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  xm_diag_free(&d);
}

static xm_net_t test_net(int64_t nodes, int64_t rpn) {
  return (xm_net_t){.nodes = nodes,
                    .ranks_per_node = rpn,
                    .intra_bw = 100e9,
                    .inter_bw = 10e9,
                    .intra_lat = 2e-6,
                    .inter_lat = 5e-6};
}

static xm_cost_point_t point(int64_t dp, int64_t tp, int64_t ep, bool ssmb, bool rbd, int zero,
                             int64_t rpn, int64_t mb, xm_policy_t pol, xm_recompute_t rc) {
  xm_cost_point_t p;
  memset(&p, 0, sizeof p);
  p.layout = (xm_layout_t){
      .dp = dp, .tp = tp, .ep = ep, .ssmb = ssmb, .rbd = rbd, .zero = zero, .ranks_per_node = rpn};
  p.micro_batch = mb;
  p.policy = pol;
  p.recompute = rc;
  return p;
}

static xm_cost_t eval(const xm_spec_t *s, const xm_net_t *n, const xm_cost_point_t *p,
                      const xm_cost_routing_t *rt);

/* By value, uniform routing. */
static xm_cost_t ev(const xm_spec_t *s, const xm_net_t *n, xm_cost_point_t p) {
  return eval(s, n, &p, NULL);
}

static xm_cost_t eval(const xm_spec_t *s, const xm_net_t *n, const xm_cost_point_t *p,
                      const xm_cost_routing_t *rt) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_cost_t c;
  xm_status_t st = xm_cost_evaluate(s, n, 64.0 * (1 << 30), 100e12, 0.5, p, rt, &d, &c);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  xm_diag_free(&d);
  return c;
}

/* ---- names and formulas ---------------------------------------------------- */

static void test_names(void **state) {
  (void)state;
  const char *names[] = {"xmoec", "x-moe", "deepspeed-moe", "tutel", "deepspeed-ted"};
  for (int p = 0; p < XM_POLICY_COUNT; p++) {
    assert_string_equal(xm_policy_name((xm_policy_t)p), names[p]);
    xm_policy_t back;
    assert_true(xm_policy_from_name(names[p], &back));
    assert_int_equal(back, p);
  }
  xm_policy_t x;
  assert_false(xm_policy_from_name("megatron", &x));
  assert_false(xm_policy_from_name(NULL, &x));
  assert_string_equal(xm_recompute_name(XM_RECOMPUTE_NONE), "none");
  assert_string_equal(xm_recompute_name(XM_RECOMPUTE_MOE), "moe");
  assert_string_equal(xm_recompute_name(XM_RECOMPUTE_FULL), "full");
}

static void test_rbd_copies(void **state) {
  (void)state;
  assert_near(xm_cost_rbd_expected_copies(256, 8, 4), 3.61, 0.005);
  assert_near(xm_cost_rbd_expected_copies(16, 4, 2), 1.92, 0.005);
  assert_near(xm_cost_rbd_expected_copies(8, 2, 1), 1.0, 1e-12);
  /* one expert per node: every chosen expert is its own node */
  assert_near(xm_cost_rbd_expected_copies(64, 6, 64), 6.0, 1e-9);
  assert_near(xm_cost_rbd_expected_copies(8, 9, 2), 0.0, 0);
}

static void test_cluster(void **state) {
  (void)state;
  xm_spec_t s;
  load_sample("samples/tiny.json", &s);
  char path[512];
  snprintf(path, sizeof path, "%s/samples/clusters/frontier-1024.json", XM_SOURCE_DIR);
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(xm_spec_load_cluster_file(path, &d, &s), XM_OK);
  xm_diag_free(&d);
  xm_net_t n;
  double mem, peak, eff;
  xm_cost_cluster(&s.cluster, &n, &mem, &peak, &eff);
  assert_int_equal(n.nodes * n.ranks_per_node, 1024);
  assert_near(mem, 64.0 * 1024 * 1024 * 1024, 0);
  assert_near(peak, 191.5e12, 1);
  assert_near(eff, 0.6, 1e-12);
  assert_near(n.inter_bw, 12.5e9, 1);
}

/* ---- memory by category, by hand ---------------------------------------------- */

/* vocab 16, hidden 8, 2 layers (one dense, one MoE), 2 heads of 4, dense
 * FFN 16, 4 SwiGLU experts of width 8, top-2, no shared experts, fp32;
 * seq 4, micro-batch 1: T = 4 tokens. */
static const char *k_small =
    "{\"model\":{\"vocab\":16,\"hidden\":8,\"layers\":2,\"heads\":2,\"kv_heads\":2,"
    "\"head_dim\":4,\"first_k_dense\":1,\"dense_ffn\":16},"
    "\"moe\":{\"experts\":4,\"top_k\":2,\"expert_ffn\":8,\"shared_experts\":0},"
    "\"training\":{\"seq_len\":4,\"micro_batch\":1,\"global_batch\":4,\"dtype\":\"fp32\"}}";

static void test_memory_by_hand(void **state) {
  (void)state;
  xm_spec_t s;
  load_text(k_small, &s);
  xm_net_t n = test_net(1, 4);
  xm_cost_t c = eval(&s, &n,
                     &(xm_cost_point_t){.layout = {.dp = 1, .tp = 1, .ep = 1},
                                        .micro_batch = 1,
                                        .policy = XM_POLICY_XMOEC,
                                        .recompute = XM_RECOMPUTE_NONE},
                     NULL);
  /* Weights, each tensor rounded up to 64 bytes: embed and lm_head
   * 16x8 fp32 = 512 each; final norm 32 -> 64; 2 layers x 2 norms -> 64
   * each; q,k,v,o 8x8 = 256 each per layer; dense gate/up/down 16x8 =
   * 512 each; router 4x8 = 128; experts 3 x 4x8x8 = 1024 each. */
  double w = 512 + 512 + 64 + 4 * 64 + 2 * 4 * 256 + 3 * 512 + 128 + 3 * 1024;
  assert_near(c.weights, w, 0);
  assert_near(c.grads, w, 0);
  assert_near(c.optimizer, 2 * w, 0); /* fp32 m and v */
  /* Saved activations (elements x 4 bytes): per layer x, normed x, h,
   * normed h (4 T H = 128) + q, k, v, attention out (4 x 32) = 256 -> 1024;
   * dense: + g, u, s (3 x 4x16) -> 768; MoE: scores 4x4 fp32 (64), ids and
   * weights 2 x 4x2 (64), slot order N = 8 (32), tokens per expert (16),
   * g, u, s 3 x 8x8 (768); with one rank per EP group fuse-permute-gemm
   * reads the rows through the slot index and combines in the down GEMM,
   * so the gathered rows and the expert output are never written; head:
   * last output and its norm (256), tokens and labels (32) and, as xmoec
   * fuses the LM head with the loss (chunk 16 = V), the stats 4x2 (32)
   * instead of the logits. Workspace: the fused loss's scratch 4 x (16 + 4)
   * (320) and its dx (128). */
  double dense = 1024 + 768, moe = 1024 + 64 + 64 + 32 + 16 + 768;
  double head = 256 + 32 + 32;
  assert_near(c.activations, dense + moe + head + 320 + 128, 0);
  assert_near(c.buffers, 0, 0);
  assert_near(c.overhead, 1024.0 * 1024 * 1024, 0);
  assert_near(c.total, c.weights + c.grads + c.optimizer + c.activations + c.buffers + c.overhead,
              1e-6);
  assert_true(c.fits);
  assert_near(c.shortfall, 0, 0);

  /* ep 2 over dp 2: the experts halve; ZeRO-1 chunks the dense states over
   * dp and leaves the experts' (edp has one member) whole. */
  xm_cost_t e =
      eval(&s, &n,
           &(xm_cost_point_t){
               .layout = {.dp = 2, .tp = 1, .ep = 2}, .micro_batch = 1, .policy = XM_POLICY_XMOEC},
           NULL);
  assert_near(e.weights, w - 3 * 512, 0);
  xm_cost_t z = eval(&s, &n,
                     &(xm_cost_point_t){.layout = {.dp = 2, .tp = 1, .ep = 2, .zero = 1},
                                        .micro_batch = 1,
                                        .policy = XM_POLICY_XMOEC},
                     NULL);
  assert_near(z.weights, e.weights, 0);
  /* dense chunks: 128 elems -> 64 (256 B) x2 tensors, norms 8 -> 4 (16 ->
   * 64) x5, attention 64 -> 32 (128) x8, dense FFN 128 -> 64 (256) x3,
   * router 32 -> 16 (64); experts whole 3 x 512; m and v each. */
  double zopt = 2 * (2 * 256 + 5 * 64 + 8 * 128 + 3 * 256 + 64 + 3 * 512);
  assert_near(z.optimizer, zopt, 0);

  /* bf16 under xmoec, as the compiled program holds it: f32 weights,
   * gradients, m and v (the fp32 figures), and a bf16 copy of every
   * trained matrix but the untied embedding in the activations. */
  xm_spec_t b = s;
  b.training.dtype = XM_DTYPE_BF16;
  xm_cost_point_t one = {
      .layout = {.dp = 1, .tp = 1, .ep = 1}, .micro_batch = 1, .policy = XM_POLICY_XMOEC};
  xm_cost_t h = eval(&b, &n, &one, NULL);
  assert_near(h.weights, c.weights, 0);
  assert_near(h.grads, c.grads, 0);
  assert_near(h.optimizer, c.optimizer, 0);
  double copy = 2.0 * (c.grads / 4.0 - (double)s.model.vocab * (double)s.model.hidden);
  assert_true(h.activations > copy);
  /* A baseline in bf16 (DeepSpeed's layout): 2-byte weights and grads,
   * fp32 master + m + v. */
  one.policy = XM_POLICY_XMOE;
  xm_cost_t xf = eval(&s, &n, &one, NULL), xb = eval(&b, &n, &one, NULL);
  assert_true(xb.weights < xf.weights && xb.weights >= xf.weights / 2);
  assert_near(xb.optimizer, 1.5 * xf.optimizer, 0);

  /* A device too small: fits is false and the shortfall is the difference. */
  xm_diag_t d;
  xm_diag_init(&d);
  xm_cost_t t;
  xm_cost_point_t p1 = {.layout = {.dp = 1, .tp = 1, .ep = 1}, .micro_batch = 1};
  assert_int_equal(xm_cost_evaluate(&s, &n, 1e6, 100e12, 0.5, &p1, NULL, &d, &t), XM_OK);
  assert_false(t.fits);
  assert_near(t.shortfall, t.total - 1e6, 1e-3);
  xm_diag_free(&d);
}

/* ---- monotonicity on a paper model ---------------------------------------------- */

static void frontier(xm_net_t *n) { *n = test_net(128, 8); }

static void test_monotonic(void **state) {
  (void)state;
  xm_spec_t s;
  load_sample("samples/xmoe-small.json", &s); /* 64 GeLU experts, top-6, bf16 */
  xm_net_t n;
  frontier(&n);
  xm_policy_t X = XM_POLICY_XMOEC;
  xm_recompute_t R0 = XM_RECOMPUTE_NONE;

  /* More EP: fewer expert bytes per rank. */
  xm_cost_t e8 = ev(&s, &n, point(64, 1, 8, 0, 0, 0, 8, 1, X, R0));
  xm_cost_t e16 = ev(&s, &n, point(64, 1, 16, 0, 0, 0, 8, 1, X, R0));
  assert_true(e16.weights < e8.weights);
  assert_true(e16.grads < e8.grads);
  assert_true(e16.optimizer < e8.optimizer);

  /* SSMB: fewer MoE activation bytes (tp 2, ep 1, same everything else). */
  xm_cost_t t0 = ev(&s, &n, point(32, 2, 1, 0, 0, 0, 8, 1, X, R0));
  xm_cost_t t1 = ev(&s, &n, point(32, 2, 1, 1, 0, 0, 8, 1, X, R0));
  assert_true(t1.activations < t0.activations);

  /* ZeRO-1: fewer optimizer bytes, the same weights. */
  xm_cost_t z1 = ev(&s, &n, point(64, 1, 8, 0, 0, 1, 8, 1, X, R0));
  assert_true(z1.optimizer < e8.optimizer / 4);
  assert_near(z1.weights, e8.weights, 0);

  /* Recompute: fewer activation bytes, more compute time. */
  xm_cost_t rm = ev(&s, &n, point(64, 1, 16, 0, 0, 0, 8, 1, X, XM_RECOMPUTE_MOE));
  xm_cost_t rf = ev(&s, &n, point(64, 1, 16, 0, 0, 0, 8, 1, X, XM_RECOMPUTE_FULL));
  assert_true(rm.activations < e16.activations);
  assert_true(rf.activations < rm.activations);
  assert_true(rm.t_compute > e16.t_compute);
  assert_true(rf.t_compute > rm.t_compute);
  /* Full recompute redoes the forward all-to-alls (ep 16 spans 2 nodes). */
  assert_true(e16.bytes_dispatch_inter > 0);
  assert_near(rf.bytes_dispatch_inter, 1.5 * e16.bytes_dispatch_inter,
              1e-6 * rf.bytes_dispatch_inter);
  assert_near(rm.bytes_dispatch_inter, e16.bytes_dispatch_inter, 0);

  /* RBD sends fewer rows across nodes than the flat dispatch. */
  xm_cost_t flat = ev(&s, &n, point(64, 1, 64, 0, 0, 0, 8, 1, X, R0));
  xm_cost_t rbd = ev(&s, &n, point(64, 1, 64, 0, 1, 0, 8, 1, X, R0));
  assert_true(rbd.bytes_dispatch_inter < 0.9 * flat.bytes_dispatch_inter);

  /* The step is the sum of its phases, and the ratios are sane. */
  assert_near(e8.t_step, e8.t_compute + e8.t_dispatch + e8.t_tp + e8.t_dp + e8.t_optimizer, 1e-12);
  assert_true(e8.mfu > 0 && e8.mfu < 1);
  assert_near(e8.tokens_per_step, 1024.0 * 2048, 0);
  assert_int_equal(e8.grad_accum, 1024 / 64);
  assert_near(e8.tflops_per_device, e8.flops_per_device / e8.t_step / 1e12, 1e-9);
}

/* DeepSpeed-MoE's [T,E,C] masks: C grows with T, so the masks grow as T^2
 * (tutel has the same padded buffers without them). */
static void test_masks_quadratic(void **state) {
  (void)state;
  xm_spec_t s;
  load_sample("samples/xmoe-small.json", &s);
  xm_net_t n;
  frontier(&n);
  double masks[2];
  for (int i = 0; i < 2; i++) {
    xm_spec_t t = s;
    t.training.seq_len = 2048 << i;
    xm_cost_point_t ds = point(64, 1, 8, 0, 0, 0, 8, 1, XM_POLICY_DEEPSPEED_MOE, 0);
    xm_cost_point_t tu = point(64, 1, 8, 0, 0, 0, 8, 1, XM_POLICY_TUTEL, 0);
    xm_cost_t a = eval(&t, &n, &ds, NULL), b = eval(&t, &n, &tu, NULL);
    masks[i] = a.activations - b.activations;
    /* T*E*C*5 bytes per MoE layer, C = ceil(T k / E) */
    double T = 2048 << i, C = ceil(T * 6 / 64);
    assert_near(masks[i], 28 * T * 64 * C * 5, 1);
    /* the einsums cost FLOPs, so DeepSpeed-MoE is slower than tutel */
    assert_true(a.t_compute > b.t_compute);
  }
  assert_near(masks[1] / masks[0], 4.0, 1e-9);
  /* and padding-free dispatch (X-MoE's, allocating what arrives) holds no
   * masks and no padding at all */
  xm_cost_t x = ev(&s, &n, point(64, 1, 8, 0, 0, 0, 8, 1, XM_POLICY_XMOE, 0));
  xm_cost_t d = ev(&s, &n, point(64, 1, 8, 0, 0, 0, 8, 1, XM_POLICY_DEEPSPEED_MOE, 0));
  assert_true(x.activations < d.activations);
}

/* Dispatch bytes for a given routing, by hand: layouts-like model, ep 4 on
 * 2 nodes of 2, flat; per MoE layer and micro-batch the EP group sends 150
 * slots inside nodes and 236 across (4-byte rows of H = 64 floats, forward
 * and backward through both the dispatch and the combine). */
static void test_given_routing(void **state) {
  (void)state;
  char path[512];
  snprintf(path, sizeof path, "%s/tests/e2e/inputs/layouts.json", XM_SOURCE_DIR);
  xm_spec_t s;
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(xm_spec_load_file(path, &d, &s), XM_OK);
  xm_diag_free(&d);
  xm_net_t n = test_net(2, 2);
  xm_cost_point_t p = point(4, 1, 4, 0, 0, 0, 2, 2, XM_POLICY_XMOEC, 0);
  xm_cost_routing_t rt = {
      .given = true, .slots_intra = 150, .slots_inter = 236, .rbd_rows_intra = -1};
  xm_cost_t c = eval(&s, &n, &p, &rt);
  /* one MoE layer, one micro-batch per rank (8 / (2 * 4)), one EP group */
  assert_near(c.bytes_dispatch_intra, 150.0 * 64 * 4 * 4, 1e-6);
  assert_near(c.bytes_dispatch_inter, 236.0 * 64 * 4 * 4, 1e-6);
  /* RBD: 202 pilots across nodes; dispatch 4 (H + 2k) + 4 H, combine
   * 4 H + 4 k + 4 H bytes per pilot (docs/traffic.md) */
  p.layout.rbd = true;
  rt.pilots_inter = 202;
  c = eval(&s, &n, &p, &rt);
  double per_row = 4 * (64 + 4) + 4 * 64 + 4 * 64 + 4 * 2 + 4 * 64;
  assert_near(c.bytes_dispatch_inter, 202.0 * per_row, 1e-6);
  /* the rows inside nodes, when known, replace the expectation */
  rt.rbd_rows_intra = 190;
  xm_cost_t ci = eval(&s, &n, &p, &rt);
  assert_near(ci.bytes_dispatch_intra, 190.0 * per_row, 1e-6);
  assert_near(ci.bytes_dispatch_inter, c.bytes_dispatch_inter, 0);
  assert_true(c.bytes_dispatch_intra > 0 && c.bytes_dispatch_intra != ci.bytes_dispatch_intra);
  rt.rbd_rows_intra = -1;
  /* uniform routing: the expected RBD rows are fewer than the flat ones */
  xm_cost_t u = eval(&s, &n, &p, NULL);
  p.layout.rbd = false;
  xm_cost_t f = eval(&s, &n, &p, NULL);
  /* flat, uniform: each rank sends T k = 128 slots, 1/4 stay, 1/4 go to
   * the node's other rank, 1/2 cross; 4 ranks */
  assert_near(f.bytes_dispatch_intra, 4 * 32.0 * 64 * 4 * 4, 1e-6);
  assert_near(f.bytes_dispatch_inter, 4 * 64.0 * 64 * 4 * 4, 1e-6);
  assert_true(u.bytes_dispatch_inter < f.bytes_dispatch_inter);
  /* 2 nodes of 4 experts, k = 2: 1 - C(4,2)/C(8,2) = 11/14 per node; a
   * token's pilot crosses to the other node with that chance */
  double pilots = 4 * 64 * (11.0 / 14.0);
  assert_near(u.bytes_dispatch_inter, pilots * (4 * (64 + 4) + 4 * 64 + 4 * 64 + 4 * 2 + 4 * 64),
              1e-6);
}

/* What the model refuses, with a message. */
static void test_refusals(void **state) {
  (void)state;
  xm_spec_t s;
  load_sample("samples/xmoe-small.json", &s);
  xm_net_t n;
  frontier(&n);
  struct {
    xm_cost_point_t p;
    const char *needle;
  } cases[] = {
      {point(64, 1, 3, 0, 0, 0, 8, 1, 0, 0), "must divide the routed experts"},
      {point(32, 2, 8, 0, 0, 0, 8, 1, 0, 0), "needs ssmb"},
      {point(64, 1, 16, 0, 1, 0, 8, 1, XM_POLICY_XMOE, 0), "one local expert"},
      {point(32, 2, 64, 1, 1, 0, 8, 1, XM_POLICY_XMOE, 0), "RBD with SSMB"},
      {point(32, 2, 1, 1, 0, 0, 8, 1, XM_POLICY_DEEPSPEED_MOE, 0), "has no SSMB"},
      {point(64, 1, 8, 0, 1, 0, 8, 1, XM_POLICY_TUTEL, 0), "has no RBD"},
      {point(2048, 1, 8, 0, 0, 0, 8, 1, 0, 0), "the cluster has 1024"},
      {point(64, 1, 8, 0, 0, 0, 8, 3, 0, 0), "global_batch"},
      {point(32, 32, 1, 0, 0, 0, 8, 1, 0, 0), "must divide heads"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    xm_diag_t d;
    xm_diag_init(&d);
    xm_cost_t c;
    xm_status_t st = xm_cost_evaluate(&s, &n, 64e9, 1e14, 0.5, &cases[i].p, NULL, &d, &c);
    assert_int_equal(st, XM_ERR_INVALID_INPUT);
    assert_int_equal(d.count, 1);
    if (!strstr(d.entries[0].message, cases[i].needle))
      fail_msg("case %zu: '%s' lacks '%s'", i, d.entries[0].message, cases[i].needle);
    xm_diag_free(&d);
  }
  /* x-moe with one expert per rank may use RBD; NULL diag is allowed */
  xm_cost_t c;
  xm_cost_point_t ok = point(64, 1, 64, 0, 1, 0, 8, 1, XM_POLICY_XMOE, 0);
  assert_int_equal(xm_cost_evaluate(&s, &n, 64e9, 1e14, 0.5, &ok, NULL, NULL, &c), XM_OK);
  xm_cost_point_t bad = point(64, 1, 3, 0, 0, 0, 8, 1, 0, 0);
  assert_int_equal(xm_cost_evaluate(&s, &n, 64e9, 1e14, 0.5, &bad, NULL, NULL, &c),
                   XM_ERR_INVALID_INPUT);
}

/* Every policy costs the four paper models and the HF samples (MLA
 * included) without refusing, with finite positive numbers. */
static void test_samples_all_policies(void **state) {
  (void)state;
  const char *specs[] = {"samples/xmoe-small.json",     "samples/xmoe-medium.json",
                         "samples/xmoe-large.json",     "samples/xmoe-super.json",
                         "samples/hf/deepseek-v3.json", "samples/hf/mixtral-8x7b.json"};
  xm_net_t n;
  frontier(&n);
  for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
    xm_spec_t s;
    load_sample(specs[i], &s);
    s.training.global_batch = 1024;
    int64_t ep = s.moe.experts >= 64 ? 64 : s.moe.experts;
    for (int p = 0; p < XM_POLICY_COUNT; p++) {
      int64_t tp = p == XM_POLICY_DEEPSPEED_TED ? 2 : 1;
      xm_cost_point_t pt = point(1024 / tp, tp, ep, 0, 0, 1, 8, 1, (xm_policy_t)p, 0);
      xm_cost_t c = eval(&s, &n, &pt, NULL);
      assert_true(c.total > 0 && isfinite(c.total));
      assert_true(c.t_step > 0 && isfinite(c.t_step));
      assert_true(c.mfu > 0 && c.mfu < 1);
      assert_true(c.bytes_dispatch_intra + c.bytes_dispatch_inter > 0);
    }
  }
}

/* The collectives xm_cost_collectives lists add up to the step's
 * communication times, category by category, and describe groups that tile
 * the world. */
static void test_collectives_add_up(void **state) {
  (void)state;
  xm_net_t n;
  frontier(&n);
  const char *specs[] = {"samples/xmoe-small.json", "samples/hf/deepseek-v3.json"};
  /* dp tp ep ssmb rbd zero policy recompute */
  const struct {
    int64_t dp, tp, ep;
    bool ssmb, rbd;
    int zero;
    xm_policy_t pol;
    xm_recompute_t rc;
  } pts[] = {
      {1024, 1, 64, 0, 0, 0, XM_POLICY_XMOEC, XM_RECOMPUTE_NONE},
      {512, 2, 64, 1, 1, 1, XM_POLICY_XMOEC, XM_RECOMPUTE_FULL},
      {256, 4, 32, 1, 0, 1, XM_POLICY_XMOEC, XM_RECOMPUTE_MOE},
      {512, 2, 32, 0, 0, 1, XM_POLICY_DEEPSPEED_TED, XM_RECOMPUTE_NONE},
      {1024, 1, 64, 0, 0, 0, XM_POLICY_DEEPSPEED_MOE, XM_RECOMPUTE_NONE},
  };
  for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
    xm_spec_t s;
    load_sample(specs[i], &s);
    s.training.global_batch = 1024;
    for (size_t j = 0; j < sizeof pts / sizeof pts[0]; j++) {
      xm_cost_point_t pt = point(pts[j].dp, pts[j].tp, pts[j].ep, pts[j].ssmb, pts[j].rbd,
                                 pts[j].zero, 8, 1, pts[j].pol, pts[j].rc);
      xm_cost_t plain = eval(&s, &n, &pt, NULL), c;
      xm_cost_colls_t colls;
      memset(&colls, 0, sizeof colls);
      xm_diag_t d;
      xm_diag_init(&d);
      assert_int_equal(
          xm_cost_collectives(&s, &n, 64.0 * (1 << 30), 100e12, 0.5, &pt, NULL, &d, &c, &colls),
          XM_OK);
      xm_diag_free(&d);
      assert_true(c.t_step == plain.t_step); /* recording changes nothing */
      double sum[XM_COST_COMM_COUNT_] = {0};
      int64_t world = 1024;
      for (int64_t k = 0; k < colls.n; k++) {
        const xm_cost_coll_t *x = &colls.v[k];
        sum[x->category] += x->calls * x->seconds;
        /* the groups tile the world: as many members as ranks, all inside it */
        assert_int_equal(x->inner_n * x->outer_n * x->size, world);
        int64_t last = (x->inner_n - 1) * x->inner_step + (x->outer_n - 1) * x->outer_step +
                       (x->size - 1) * x->stride;
        assert_true(last < world);
        assert_true(x->all_to_all ? x->intra + x->inter > 0 : x->bytes > 0);
        assert_true(x->phase && x->phase[0]);
      }
      double tol = 1e-9 * (c.t_step + 1e-12);
      assert_true(fabs(sum[XM_COST_COMM_DISPATCH] - c.t_dispatch) <= tol);
      assert_true(fabs(sum[XM_COST_COMM_TP] - c.t_tp) <= tol);
      double reduce = sum[XM_COST_COMM_REDUCE];
      double exposed = reduce > c.t_overlap_window ? reduce - c.t_overlap_window : 0;
      assert_true(fabs(exposed + sum[XM_COST_COMM_GATHER] - c.t_dp) <= tol);
      assert_true(c.t_dispatch > 0);
      if (pts[j].tp > 1) assert_true(c.t_tp > 0);
      xm_cost_colls_free(&colls);
    }
  }
}

/* ---- validation against compiled programs ------------------------------------------ */

typedef struct {
  char name[64], spec[512], flat_from[64], total_from[64];
  int64_t dp, tp, ep, rpn;
  int ssmb, rbd, zero;
} vcase_t;

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)n + 1);
  if (b && fread(b, 1, (size_t)n, f) != (size_t)n) n = 0;
  if (b) b[n] = '\0';
  fclose(f);
  return b;
}

/* Step `step` (1-based) of DIR/name.jsonl. */
static cJSON *log_step(const char *dir, const char *name, int step) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s.jsonl", dir, name);
  char *text = slurp(path);
  if (!text) fail_msg("cannot read %s", path);
  cJSON *found = NULL;
  for (char *line = strtok(text, "\n"); line && !found; line = strtok(NULL, "\n")) {
    cJSON *j = cJSON_Parse(line);
    cJSON *st = cJSON_GetObjectItem(j, "step");
    if (cJSON_IsNumber(st) && (int)st->valuedouble == step)
      found = j;
    else
      cJSON_Delete(j);
  }
  free(text);
  if (!found) fail_msg("%s has no step %d", path, step);
  return found;
}

static double phase_bytes(cJSON *step, const char *phase, const char *where) {
  cJSON *t = cJSON_GetObjectItem(cJSON_GetObjectItem(step, "traffic"), "by_phase");
  cJSON *v = cJSON_GetObjectItem(cJSON_GetObjectItem(t, phase), where);
  if (!cJSON_IsNumber(v)) fail_msg("no traffic.by_phase.%s.%s in the log", phase, where);
  return v->valuedouble;
}

static double rbd_rows(cJSON *step, const char *key) {
  cJSON *v = cJSON_GetObjectItem(cJSON_GetObjectItem(step, "rbd"), key);
  if (!cJSON_IsNumber(v)) fail_msg("no rbd.%s in the log", key);
  return v->valuedouble;
}

static bool parse_case(char *line, vcase_t *c) {
  memset(c, 0, sizeof *c);
  for (char *tok = strtok(line, " \t\n"); tok; tok = strtok(NULL, " \t\n")) {
    char *eq = strchr(tok, '=');
    if (!eq) continue;
    *eq = '\0';
    const char *k = tok, *v = eq + 1;
    if (!strcmp(k, "name"))
      snprintf(c->name, sizeof c->name, "%s", v);
    else if (!strcmp(k, "spec"))
      snprintf(c->spec, sizeof c->spec, "%s", v);
    else if (!strcmp(k, "flat_from"))
      snprintf(c->flat_from, sizeof c->flat_from, "%s", v);
    else if (!strcmp(k, "total_from"))
      snprintf(c->total_from, sizeof c->total_from, "%s", v);
    else if (!strcmp(k, "dp"))
      c->dp = atoll(v);
    else if (!strcmp(k, "tp"))
      c->tp = atoll(v);
    else if (!strcmp(k, "ep"))
      c->ep = atoll(v);
    else if (!strcmp(k, "rpn"))
      c->rpn = atoll(v);
    else if (!strcmp(k, "ssmb"))
      c->ssmb = atoi(v);
    else if (!strcmp(k, "rbd"))
      c->rbd = atoi(v);
    else if (!strcmp(k, "zero"))
      c->zero = atoi(v);
  }
  return c->name[0] && c->spec[0] && c->dp > 0;
}

static int g_failures;

static void check_equal(const char *name, int step, const char *what, double pred, double meas) {
  bool ok = fabs(pred - meas) <= 0.5 + 1e-9 * fabs(meas);
  printf("  %-28s step %d %-24s predicted %14.1f measured %14.0f %s\n", name, step, what, pred,
         meas, ok ? "" : "MISMATCH");
  if (!ok) g_failures++;
}

static void validate_case(const char *dir, const vcase_t *vc) {
  xm_spec_t s;
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(xm_spec_load_file(vc->spec, &d, &s), XM_OK);
  xm_diag_free(&d);
  int64_t world = vc->dp * vc->tp;
  xm_net_t n = test_net(world / vc->rpn, vc->rpn);
  xm_cost_point_t p = point(vc->dp, vc->tp, vc->ep, vc->ssmb, vc->rbd, vc->zero, vc->rpn,
                            s.training.micro_batch, XM_POLICY_XMOEC, XM_RECOMPUTE_NONE);
  xm_cost_t u = eval(&s, &n, &p, NULL);

  /* Memory: the plan's two arenas per rank. */
  char path[1024];
  snprintf(path, sizeof path, "%s/%s/manifest.json", dir, vc->name);
  char *text = slurp(path);
  if (!text) fail_msg("cannot read %s", path);
  cJSON *man = cJSON_Parse(text);
  free(text);
  cJSON *mem = cJSON_GetObjectItem(man, "memory");
  double persist = cJSON_GetObjectItem(mem, "persistent_bytes")->valuedouble;
  double act = cJSON_GetObjectItem(mem, "activation_bytes")->valuedouble;
  cJSON_Delete(man);
  double pred_persist = u.weights + u.grads + u.optimizer;
  double pred = pred_persist + u.activations + u.buffers;
  double rel = (pred - (persist + act)) / (persist + act);
  printf("  %-28s arena: predicted %10.0f (persistent %10.0f, activation arena %9.0f) measured "
         "%10.0f (%10.0f, %9.0f): %+.2f%%\n",
         vc->name, pred, pred_persist, u.activations + u.buffers, persist + act, persist, act,
         100 * rel);
  if (fabs(rel) > 0.10) g_failures++;
  if (pred_persist != persist) {
    printf("  %-28s persistent bytes differ\n", vc->name);
    g_failures++;
  }

  /* Bytes on the wire, per step. */
  int64_t G = s.training.global_batch / (s.training.micro_batch * vc->dp);
  int64_t moe_layers =
      s.model.layers -
      (s.model.first_k_dense < s.model.layers ? s.model.first_k_dense : s.model.layers);
  double units = (double)G * (double)moe_layers * (double)(world / vc->ep);
  double row_bytes = 4.0 * (double)s.model.hidden; /* one fp32 row */
  xm_layout_t l = p.layout;
  bool rbd_active = xm_layout_rbd_active(&l);
  for (int step = 1; step <= 2; step++) {
    cJSON *lg = log_step(dir, vc->name, step);
    xm_cost_routing_t rt = {.given = false, .rbd_rows_intra = -1};
    bool inter_known = false, intra_known = false;
    if (rbd_active) {
      rt.given = true;
      rt.pilots_inter = rbd_rows(lg, "inter_rows") / units;
      inter_known = true;
    }
    if (vc->flat_from[0]) {
      cJSON *src = log_step(dir, vc->flat_from, step);
      rt.given = true;
      rt.slots_inter = rbd_rows(src, "flat_inter_rows") / units;
      inter_known = true;
      cJSON_Delete(src);
      if (vc->total_from[0]) {
        /* One node: every slot that left its rank is intra-node bytes;
         * the dispatch phase carries each one forward and backward. */
        cJSON *one = log_step(dir, vc->total_from, step);
        double left =
            (phase_bytes(one, "dispatch", "intra") + phase_bytes(one, "dispatch", "inter")) /
            (2 * row_bytes);
        rt.slots_intra = left / units - rt.slots_inter;
        intra_known = true;
        cJSON_Delete(one);
      }
    }
    xm_cost_t c = rt.given ? eval(&s, &n, &p, &rt) : u;
    check_equal(vc->name, step, "all_reduce intra", c.bytes_all_reduce_intra,
                phase_bytes(lg, "all_reduce", "intra"));
    check_equal(vc->name, step, "all_reduce inter", c.bytes_all_reduce_inter,
                phase_bytes(lg, "all_reduce", "inter"));
    check_equal(vc->name, step, "all_gather intra", c.bytes_all_gather_intra,
                phase_bytes(lg, "all_gather", "intra"));
    check_equal(vc->name, step, "all_gather inter", c.bytes_all_gather_inter,
                phase_bytes(lg, "all_gather", "inter"));
    check_equal(vc->name, step, "reduce_scatter intra", c.bytes_reduce_scatter_intra,
                phase_bytes(lg, "reduce_scatter", "intra"));
    check_equal(vc->name, step, "reduce_scatter inter", c.bytes_reduce_scatter_inter,
                phase_bytes(lg, "reduce_scatter", "inter"));
    double d_intra = phase_bytes(lg, "dispatch", "intra") + phase_bytes(lg, "combine", "intra");
    double d_inter = phase_bytes(lg, "dispatch", "inter") + phase_bytes(lg, "combine", "inter");
    /* Without the routing, a part the model predicts to be zero (the EP
     * group inside one node, or one rank per node) must be zero. */
    if (inter_known || c.bytes_dispatch_inter == 0)
      check_equal(vc->name, step, "dispatch+combine inter", c.bytes_dispatch_inter, d_inter);
    if (intra_known || c.bytes_dispatch_intra == 0)
      check_equal(vc->name, step, "dispatch+combine intra", c.bytes_dispatch_intra, d_intra);
    if (step == 1 && vc->ep > 1) {
      /* Uniform routing against the first step (the router starts near
       * uniform): the expected rows within 15%. */
      double upred = u.bytes_dispatch_intra + u.bytes_dispatch_inter, meas = d_intra + d_inter;
      double r = (upred - meas) / meas;
      printf("  %-28s step 1 dispatch+combine uniform: predicted %.0f (intra %.0f, inter %.0f) "
             "measured %.0f (intra %.0f, inter %.0f): %+.2f%%\n",
             vc->name, upred, u.bytes_dispatch_intra, u.bytes_dispatch_inter, meas, d_intra,
             d_inter, 100 * r);
      if (fabs(r) > 0.15) g_failures++;
    }
    cJSON_Delete(lg);
  }
}

static void test_validation(void **state) {
  (void)state;
  const char *dir = getenv("XM_COST_VALIDATION_DIR");
  char path[1024];
  snprintf(path, sizeof path, "%s/cases.txt", dir);
  char *text = slurp(path);
  if (!text) fail_msg("cannot read %s", path);
  /* strtok is used inside parse_case: split lines first */
  char *lines[64];
  int nl = 0;
  for (char *p = text; *p && nl < 64;) {
    lines[nl++] = p;
    char *e = strchr(p, '\n');
    if (!e) break;
    *e = '\0';
    p = e + 1;
  }
  int cases = 0;
  for (int i = 0; i < nl; i++) {
    vcase_t vc;
    if (!parse_case(lines[i], &vc)) continue;
    validate_case(dir, &vc);
    cases++;
  }
  free(text);
  printf("validation: %d cases, %d failures\n", cases, g_failures);
  assert_true(cases > 0);
  assert_int_equal(g_failures, 0);
}

int main(void) {
  if (getenv("XM_COST_VALIDATION_DIR")) {
    const struct CMUnitTest v[] = {cmocka_unit_test(test_validation)};
    return cmocka_run_group_tests(v, NULL, NULL);
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_names),
      cmocka_unit_test(test_rbd_copies),
      cmocka_unit_test(test_cluster),
      cmocka_unit_test(test_memory_by_hand),
      cmocka_unit_test(test_monotonic),
      cmocka_unit_test(test_masks_quadratic),
      cmocka_unit_test(test_given_routing),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_samples_all_policies),
      cmocka_unit_test(test_collectives_add_up),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
