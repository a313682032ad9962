/* tests/unit/test_plan_memory.c — the plan-memory pass on modules built
 * through the ir.h API: no two simultaneously live buffers overlap (checked
 * over all pairs against a liveness computed here independently), buffers
 * whose lifetimes do not meet share bytes, reshape aliasing, the persistent
 * arena's order and categories, dynamic bounds, determinism, step
 * temporaries reusing the micro arena, errors, the report, the tiny
 * sample model planned below the naive sum, and, per recompute policy, the
 * plans of two models under four layouts each against the cost model
 * (planner/cost.c): the arenas, the savings and their order.
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

#include "frontend/spec.h"
#include "ir/ir.h"
#include "ir/model.h"
#include "ir/text.h"
#include "ir/verify.h"
#include "passes/pass.h"
#include "passes/plan_memory.h"
#include "planner/cost.h"
#include "support/diag.h"
#include "support/strbuf.h"

/* ---- module building --------------------------------------------------- */

static xm_ir_type_t ty(xm_dtype_t dt, int rank, int64_t d0, int64_t d1) {
  int64_t dims[2] = {d0, d1};
  return xm_ir_type_make(dt, rank, dims);
}

static xm_ir_type_t f32(int64_t d0, int64_t d1) { return ty(XM_DT_F32, 2, d0, d1); }

static xm_ir_module_t *new_module(void) {
  xm_ir_module_t *m = NULL;
  assert_int_equal(xm_ir_module_create("t", &m), XM_OK);
  return m;
}

static void set_phase(xm_ir_module_t *m, xm_ir_value_t *v, const char *phase) {
  if (phase) xm_ir_op_set_string(m, v->def, "phase", phase);
}

static xm_ir_value_t *input(xm_ir_module_t *m, const char *name, xm_ir_type_t t) {
  xm_ir_value_t *v = xm_ir_build1(m, XM_OP_INPUT, 0, NULL, t, "/in");
  xm_ir_op_set_string(m, v->def, "name", name);
  return v;
}

static xm_ir_value_t *param(xm_ir_module_t *m, const char *name, xm_ir_type_t t) {
  xm_ir_value_t *v = xm_ir_build1(m, XM_OP_PARAM, 0, NULL, t, "/param");
  xm_ir_op_set_string(m, v->def, "name", name);
  xm_ir_op_set_string(m, v->def, "init", "zeros");
  return v;
}

static xm_ir_value_t *state_op(xm_ir_module_t *m, const char *name, const char *kind,
                               xm_ir_type_t t) {
  xm_ir_value_t *v = xm_ir_build1(m, XM_OP_STATE, 0, NULL, t, "/state");
  xm_ir_op_set_string(m, v->def, "name", name);
  xm_ir_op_set_string(m, v->def, "kind", kind);
  xm_ir_op_set_string(m, v->def, "of", "w");
  return v;
}

static xm_ir_value_t *scale(xm_ir_module_t *m, xm_ir_value_t *x, const char *phase) {
  xm_ir_value_t *v = xm_ir_build1(m, XM_OP_SCALE, 1, &x, x->type, "/scale");
  xm_ir_op_set_float(m, v->def, "factor", 2.0);
  set_phase(m, v, phase);
  return v;
}

static xm_ir_value_t *add(xm_ir_module_t *m, xm_ir_value_t *a, xm_ir_value_t *b) {
  xm_ir_value_t *ops[2] = {a, b};
  return xm_ir_build1(m, XM_OP_ADD, 2, ops, a->type, "/add");
}

static xm_ir_value_t *reshape(xm_ir_module_t *m, xm_ir_value_t *x, xm_ir_type_t t) {
  return xm_ir_build1(m, XM_OP_RESHAPE, 1, &x, t, "/reshape");
}

/* return(loss, y) with a scalar param standing in for the loss. */
static void ret(xm_ir_module_t *m, xm_ir_value_t *y) {
  xm_ir_value_t *ops[2] = {param(m, "loss", ty(XM_DT_F32, 0, 0, 0)), y};
  assert_non_null(xm_ir_op_append(m, XM_OP_RETURN, 2, ops, 0, NULL, ""));
}

static void verify_ok(const xm_ir_module_t *m) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_status_t st = xm_ir_verify(m, &d);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  xm_diag_free(&d);
}

static void plan_ok(xm_ir_module_t *m, const char *pipeline) {
  xm_pass_manager_options_t o;
  xm_pass_manager_options_default(&o);
  xm_diag_t d;
  xm_diag_init(&d);
  xm_status_t st = xm_pass_pipeline_run(m, pipeline, &o, &d);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  xm_diag_free(&d);
}

static xm_mem_place_t place_of(const xm_ir_value_t *v) {
  xm_mem_place_t p;
  assert_true(xm_plan_memory_place(v->def, v->index, &p));
  return p;
}

static xm_mem_report_t report_of(const xm_ir_module_t *m) {
  xm_mem_report_t r;
  assert_int_equal(xm_plan_memory_read_report(m, NULL, &r), XM_OK);
  return r;
}

/* ---- an independent liveness and the all-pairs check ------------------- */

typedef struct {
  const xm_ir_value_t *v;
  int root; /* index in the array of the value whose buffer v uses */
  int start, end;
} live_t;

static bool is_step(const xm_ir_op_t *op) {
  return strcmp(xm_ir_op_get_string(op, "phase", "fwd"), "step") == 0;
}

/* Lifetimes as the pass's contract states them, computed naively. Returns
 * the count; *out holds every result of the module (caller frees). */
static int liveness(const xm_ir_module_t *m, live_t **out) {
  int n = xm_ir_module_num_ops(m), micro = 0, count = 0;
  int *pos = calloc((size_t)n + 1, sizeof *pos);
  live_t *lv = calloc((size_t)xm_ir_module_num_values(m) + 1, sizeof *lv);
  for (int i = 0; i < n; i++)
    micro += !is_step(xm_ir_module_op(m, i));
  for (int i = 0, a = 0, b = 0; i < n; i++)
    pos[i] = is_step(xm_ir_module_op(m, i)) ? micro + b++ : a++;
  for (int i = 0; i < n; i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    for (int r = 0; r < op->num_results; r++) {
      live_t *l = &lv[count];
      *l = (live_t){op->results[r], count, pos[i], pos[i]};
      if (op->code == XM_OP_INPUT) l->start = 0, l->end = micro - 1;
      if (op->code == XM_OP_RESHAPE)
        for (int j = 0; j < count; j++)
          if (lv[j].v == op->operands[0]) l->root = lv[j].root;
      count++;
    }
  }
  for (int i = 0; i < n; i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    int last = op->code == XM_OP_RETURN ? micro - 1 : pos[i];
    for (int k = 0; k < op->num_operands; k++)
      for (int j = 0; j < count; j++)
        if (lv[j].v == op->operands[k] && last > lv[lv[j].root].end) lv[lv[j].root].end = last;
  }
  free(pos);
  *out = lv;
  return count;
}

/* Every pair of activation buffers live at the same time is disjoint;
 * returns how many pairs were compared. */
static int check_no_overlap(const xm_ir_module_t *m) {
  live_t *lv = NULL;
  int n = liveness(m, &lv), pairs = 0;
  for (int i = 0; i < n; i++) {
    xm_mem_place_t a = place_of(lv[i].v);
    const live_t *ra = &lv[lv[i].root];
    for (int j = i + 1; j < n; j++) {
      xm_mem_place_t b = place_of(lv[j].v);
      const live_t *rb = &lv[lv[j].root];
      if (a.arena != b.arena || lv[i].root == lv[j].root || !a.bytes || !b.bytes) continue;
      if (a.arena == XM_MEM_ARENA_ACTIVATION && (ra->start > rb->end || rb->start > ra->end))
        continue;
      pairs++;
      if (a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes)
        fail_msg("values %d and %d overlap: [%lld,+%lld) and [%lld,+%lld)", lv[i].v->id,
                 lv[j].v->id, (long long)a.offset, (long long)a.bytes, (long long)b.offset,
                 (long long)b.bytes);
    }
  }
  free(lv);
  return pairs;
}

/* Sum of the recorded sizes in one arena (reshape results excluded). */
static int64_t naive_sum(const xm_ir_module_t *m, int arena) {
  int64_t sum = 0;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    for (int r = 0; r < op->num_results && op->code != XM_OP_RESHAPE; r++) {
      xm_mem_place_t p = place_of(op->results[r]);
      if (p.arena == arena) sum += p.bytes;
    }
  }
  return sum;
}

/* ---- tests ------------------------------------------------------------- */

/* A graph with branches and long-lived values, checked over all pairs. */
static void test_no_overlap_branches(void **state) {
  (void)state;
  xm_ir_module_t *m = new_module();
  xm_ir_value_t *x = input(m, "x", f32(4, 8));
  xm_ir_value_t *a = scale(m, x, NULL);
  xm_ir_value_t *b = scale(m, x, NULL);
  xm_ir_value_t *c = add(m, a, b);
  xm_ir_value_t *d = scale(m, c, NULL);
  xm_ir_value_t *e = add(m, d, a);
  ret(m, scale(m, e, NULL));
  verify_ok(m);
  plan_ok(m, "plan-memory");
  assert_true(check_no_overlap(m) >= 10);
  /* a lives until e: it never shares bytes with b, c or d. */
  assert_int_equal(place_of(a).arena, XM_MEM_ARENA_ACTIVATION);
  assert_int_equal(place_of(a).bytes, 128);
  xm_ir_module_destroy(m);
}

/* Deterministic pseudo-random graphs of mixed sizes: many pairs. */
static void test_no_overlap_random(void **state) {
  (void)state;
  for (uint32_t seed = 1; seed <= 5; seed++) {
    xm_ir_module_t *m = new_module();
    enum { classes = 5, ops = 80 };
    xm_ir_value_t *pool[classes][ops + 1];
    int count[classes] = {0};
    char name[16];
    for (int c = 0; c < classes; c++) {
      snprintf(name, sizeof name, "x%d", c);
      pool[c][count[c]++] = input(m, name, f32(1 << c, 24));
    }
    uint32_t s = seed;
    xm_ir_value_t *last = NULL;
    for (int i = 0; i < ops; i++) {
      s = s * 1664525u + 1013904223u;
      int c = (int)((s >> 8) % classes);
      xm_ir_value_t *u = pool[c][(s >> 12) % (uint32_t)count[c]];
      xm_ir_value_t *w = pool[c][(s >> 20) % (uint32_t)count[c]];
      last = (s >> 28) & 1 ? add(m, u, w) : scale(m, u, NULL);
      pool[c][count[c]++] = last;
    }
    ret(m, last);
    verify_ok(m);
    plan_ok(m, "plan-memory");
    assert_true(check_no_overlap(m) > 100);
    assert_true(report_of(m).activation_bytes < naive_sum(m, XM_MEM_ARENA_ACTIVATION));
    xm_ir_module_destroy(m);
  }
}

/* A chain: only the input and two temporaries are ever live at once. */
static void test_reuse_chain(void **state) {
  (void)state;
  xm_ir_module_t *m = new_module();
  xm_ir_value_t *x = input(m, "x", f32(64, 64));
  xm_ir_value_t *v = x;
  for (int i = 0; i < 6; i++)
    v = scale(m, v, NULL);
  ret(m, v);
  plan_ok(m, "plan-memory");
  check_no_overlap(m);
  xm_mem_report_t r = report_of(m);
  assert_int_equal(naive_sum(m, XM_MEM_ARENA_ACTIVATION), 7 * 16384);
  assert_int_equal(r.activation_bytes, 3 * 16384);
  assert_int_equal(place_of(x).offset, 0);
  xm_ir_module_destroy(m);
}

/* A reshape shares its operand's bytes and keeps it alive to its own last
 * use: b, defined in between, must not take a's place. */
static void test_reshape_alias(void **state) {
  (void)state;
  xm_ir_module_t *m = new_module();
  xm_ir_value_t *x = input(m, "x", f32(4, 8));
  xm_ir_value_t *a = scale(m, x, NULL);
  xm_ir_value_t *ra = reshape(m, a, ty(XM_DT_F32, 1, 32, 0));
  xm_ir_value_t *b = scale(m, x, NULL);
  xm_ir_value_t *rb = reshape(m, b, ty(XM_DT_F32, 1, 32, 0));
  xm_ir_value_t *c = add(m, ra, rb);
  ret(m, c);
  verify_ok(m);
  plan_ok(m, "plan-memory");
  check_no_overlap(m);
  xm_mem_place_t pa = place_of(a), pra = place_of(ra), pb = place_of(b), prb = place_of(rb);
  assert_int_equal(pra.arena, pa.arena);
  assert_int_equal(pra.offset, pa.offset);
  assert_int_equal(pra.bytes, 128);
  assert_int_equal(prb.offset, pb.offset);
  assert_true(pa.offset + 128 <= pb.offset || pb.offset + 128 <= pa.offset);
  /* add reads a and b while writing c, and the input x lives throughout. */
  assert_int_equal(report_of(m).activation_bytes, 4 * 128);
  /* A reshape of a param aliases into the persistent arena. */
  xm_ir_module_t *m2 = new_module();
  xm_ir_value_t *w = param(m2, "w", f32(4, 8));
  xm_ir_value_t *rw = reshape(m2, w, ty(XM_DT_F32, 1, 32, 0));
  ret(m2, scale(m2, rw, NULL));
  plan_ok(m2, "plan-memory");
  assert_int_equal(place_of(rw).arena, XM_MEM_ARENA_PERSISTENT);
  assert_int_equal(place_of(rw).offset, place_of(w).offset);
  assert_int_equal(report_of(m2).weights, 128 + 64); /* w and the loss */
  xm_ir_module_destroy(m2);
  xm_ir_module_destroy(m);
}

/* An input defined late in the module is still written before the micro
 * function starts: it must not take the bytes of a temporary that died
 * before its definition. The returned value lives to the end, past the
 * step ops that precede the return in module order. */
static void test_late_input(void **state) {
  (void)state;
  xm_ir_module_t *m = new_module();
  xm_ir_value_t *x = input(m, "x", f32(4, 8));
  xm_ir_value_t *a = scale(m, x, "fwd");
  xm_ir_value_t *t = scale(m, x, "fwd");
  xm_ir_value_t *t2 = scale(m, t, "fwd");
  xm_ir_value_t *y = input(m, "y", f32(4, 8));
  xm_ir_value_t *v = add(m, t2, y);
  set_phase(m, v, "bwd");
  for (int i = 0; i < 3; i++)
    v = scale(m, v, "step");
  ret(m, a);
  plan_ok(m, "plan-memory");
  assert_true(check_no_overlap(m) >= 15);
  xm_mem_place_t pt = place_of(t), py = place_of(y);
  assert_true(pt.offset + 128 <= py.offset || py.offset + 128 <= pt.offset);
  /* x, a, y, t2 and the add's result at the add. */
  assert_int_equal(report_of(m).activation_bytes, 5 * 128);
  xm_ir_module_destroy(m);
}

/* Params and states in op order, aligned, split by category. */
static void test_persistent(void **state) {
  (void)state;
  xm_ir_module_t *m = new_module();
  xm_ir_value_t *x = input(m, "x", f32(2, 8));
  xm_ir_value_t *w1 = param(m, "w1", f32(16, 8));                          /* 512 */
  xm_ir_value_t *w2 = param(m, "w2", ty(XM_DT_F32, 1, 8, 0));              /* 32 -> 64 */
  xm_ir_value_t *g1 = state_op(m, "g1", "grad", f32(16, 8));               /* 512 */
  xm_ir_value_t *m1 = state_op(m, "m1", "adam_m", f32(16, 8));             /* 512 */
  xm_ir_value_t *v1 = state_op(m, "v1", "adam_v", f32(16, 8));             /* 512 */
  xm_ir_value_t *ld = state_op(m, "load", "load", ty(XM_DT_I32, 1, 4, 0)); /* 16 -> 64 */
  ret(m, scale(m, x, NULL));
  plan_ok(m, "plan-memory");
  const xm_ir_value_t *vals[] = {w1, w2, g1, m1, v1, ld};
  const int64_t offsets[] = {0, 512, 576, 1088, 1600, 2112};
  for (int i = 0; i < 6; i++) {
    assert_int_equal(place_of(vals[i]).arena, XM_MEM_ARENA_PERSISTENT);
    assert_int_equal(place_of(vals[i]).offset, offsets[i]);
  }
  assert_int_equal(place_of(x).arena, XM_MEM_ARENA_ACTIVATION);
  xm_mem_report_t r = report_of(m);
  assert_int_equal(r.weights, 512 + 64 + 64); /* the loss param after ld */
  assert_int_equal(r.grads, 512);
  assert_int_equal(r.optimizer, 512 + 512 + 64);
  assert_int_equal(r.persistent_bytes, 2176 + 64);
  assert_int_equal(r.inputs, 64);
  check_no_overlap(m);
  xm_ir_module_destroy(m);
}

/* Dynamic dims count at their bound; alignment rounds up; option value. */
static void test_dynamic_and_alignment(void **state) {
  (void)state;
  xm_ir_module_t *m = new_module();
  int64_t dims[2] = {100, 8};
  xm_ir_type_t t = xm_ir_type_make(XM_DT_F32, 2, dims);
  t.dynamic[0] = true;
  xm_ir_value_t *x = input(m, "x", t);
  xm_ir_type_t ti = ty(XM_DT_I32, 1, 30, 0);
  ti.dynamic[0] = true;
  xm_ir_value_t *ids = input(m, "ids", ti);
  xm_ir_value_t *y = scale(m, x, NULL);
  ret(m, y);
  plan_ok(m, "plan-memory");
  assert_int_equal(place_of(x).bytes, 3200);
  assert_int_equal(place_of(ids).bytes, 128);
  assert_int_equal(place_of(y).bytes, 3200);
  plan_ok(m, "plan-memory{alignment=1024}");
  assert_int_equal(place_of(x).bytes, 4096);
  assert_int_equal(place_of(ids).bytes, 1024);
  assert_int_equal(place_of(ids).offset % 1024, 0);
  assert_int_equal(place_of(y).offset % 1024, 0);
  check_no_overlap(m);
  xm_ir_module_destroy(m);
}

static char *plan_text(xm_ir_module_t *m) {
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  xm_ir_print(m, &b);
  return xm_strbuf_take(&b);
}

static xm_ir_module_t *load_tiny(void) {
  xm_spec_t spec;
  xm_diag_t d;
  xm_diag_init(&d);
  xm_status_t st = xm_spec_load_file(XM_SOURCE_DIR "/samples/tiny.json", &d, &spec);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  xm_ir_module_t *m = NULL;
  st = xm_ir_build_model(&spec, "tiny.json", &d, &m);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  xm_diag_free(&d);
  return m;
}

/* Two builds planned separately print the same; planning again changes
 * nothing. */
static void test_deterministic(void **state) {
  (void)state;
  xm_ir_module_t *a = load_tiny(), *b = load_tiny();
  plan_ok(a, "plan-memory");
  plan_ok(b, "plan-memory");
  char *ta = plan_text(a), *tb = plan_text(b);
  assert_string_equal(ta, tb);
  plan_ok(a, "plan-memory");
  char *ta2 = plan_text(a);
  assert_string_equal(ta, ta2);
  assert_non_null(strstr(ta, "mem_activation_bytes = "));
  free(ta);
  free(tb);
  free(ta2);
  xm_ir_module_destroy(a);
  xm_ir_module_destroy(b);
}

/* The step function's temporaries take the bytes of the micro buffers:
 * the arena is the larger of the two, not their sum. */
static void test_step_reuses_arena(void **state) {
  (void)state;
  xm_ir_module_t *m = new_module();
  xm_ir_value_t *x = input(m, "x", f32(64, 64));
  xm_ir_value_t *g = state_op(m, "g", "grad", f32(64, 64));
  xm_ir_value_t *a = scale(m, x, "fwd");
  xm_ir_value_t *s1 = scale(m, g, "step"); /* interleaved in module order */
  xm_ir_value_t *b = scale(m, a, "bwd");
  xm_ir_value_t *s2 = scale(m, s1, "step");
  xm_ir_value_t *s3 = scale(m, s2, "step");
  ret(m, b);
  verify_ok(m);
  plan_ok(m, "plan-memory");
  check_no_overlap(m);
  xm_mem_report_t r = report_of(m);
  assert_int_equal(r.activation_bytes, 3 * 16384); /* x, a, b */
  assert_int_equal(place_of(x).offset, 0);
  assert_int_equal(place_of(s1).offset, 0); /* the step starts on x's bytes */
  assert_true(place_of(s2).offset + 16384 <= r.activation_bytes);
  assert_int_equal(place_of(s3).offset, place_of(s1).offset);
  /* Peak in the micro function: x and a are forward, b backward. */
  assert_int_equal(r.activations, 2 * 16384);
  assert_int_equal(r.inputs, 16384);
  assert_int_equal(r.workspace, 16384);
  assert_int_equal(r.grads, 16384);
  xm_ir_module_destroy(m);
}

static xm_status_t plan_fails(xm_ir_module_t *m, const char *pipeline, const char *needle) {
  xm_pass_manager_options_t o;
  xm_pass_manager_options_default(&o);
  o.verify_each = false;
  xm_diag_t d;
  xm_diag_init(&d);
  xm_status_t st = xm_pass_pipeline_run(m, pipeline, &o, &d);
  assert_true(xm_diag_error_count(&d) > 0);
  bool found = false;
  for (int i = 0; i < d.count; i++)
    if (strstr(d.entries[i].message, needle)) found = true;
  if (!found) xm_diag_print(&d, stderr);
  assert_true(found);
  xm_diag_free(&d);
  return st;
}

/* Bad options and a micro op reading a step value: messages, no plan. */
static void test_errors(void **state) {
  (void)state;
  xm_ir_module_t *m = new_module();
  xm_ir_value_t *x = input(m, "x", f32(4, 8));
  xm_ir_value_t *s = scale(m, x, "step");
  ret(m, scale(m, s, "bwd"));
  assert_int_equal(plan_fails(m, "plan-memory{alignment=48}", "power of two"),
                   XM_ERR_INVALID_INPUT);
  assert_int_equal(plan_fails(m, "plan-memory{alignment=x}", "not an integer"),
                   XM_ERR_INVALID_INPUT);
  assert_int_equal(plan_fails(m, "plan-memory", "computed by the step function"),
                   XM_ERR_INVALID_INPUT);
  assert_null(xm_ir_op_attr(x->def, "mem"));
  xm_mem_report_t r;
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(xm_plan_memory_read_report(m, &d, &r), XM_ERR_INVALID_INPUT);
  assert_int_equal(xm_diag_error_count(&d), 1);
  assert_non_null(strstr(d.entries[0].message, "no memory plan"));
  xm_diag_free(&d);
  xm_mem_place_t p;
  assert_false(xm_plan_memory_place(x->def, 0, &p));
  xm_ir_module_destroy(m);
  /* Unverified IR with a use before its definition: a message, no crash. */
  m = new_module();
  x = input(m, "x", f32(4, 8));
  xm_ir_value_t *u = scale(m, scale(m, x, NULL), NULL);
  ret(m, u);
  xm_ir_module_move_op(m, 2, 1);
  xm_diag_init(&d);
  assert_int_equal(xm_plan_memory(m, 64, &d), XM_ERR_INVALID_INPUT);
  assert_non_null(strstr(d.entries[0].message, "op 1 (scale): operand 0 is not a result"));
  xm_diag_free(&d);
  assert_null(xm_ir_op_attr(x->def, "mem"));
  xm_ir_module_destroy(m);
}

static void test_report_text(void **state) {
  (void)state;
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  xm_plan_memory_format_bytes(512, &b);
  assert_string_equal(xm_strbuf_cstr(&b), "512 B");
  xm_strbuf_clear(&b);
  xm_plan_memory_format_bytes(1536, &b);
  assert_string_equal(xm_strbuf_cstr(&b), "1.50 KiB");
  xm_strbuf_clear(&b);
  xm_plan_memory_format_bytes(3LL << 30, &b);
  assert_string_equal(xm_strbuf_cstr(&b), "3.00 GiB");
  xm_strbuf_clear(&b);
  xm_mem_report_t r = {.persistent_bytes = 3 << 20,
                       .activation_bytes = 1 << 20,
                       .weights = 1 << 20,
                       .grads = 1 << 20,
                       .optimizer = 1 << 20,
                       .activations = 512 << 10,
                       .workspace = 512 << 10};
  xm_plan_memory_print_report(&r, &b);
  assert_string_equal(xm_strbuf_cstr(&b),
                      "peak memory per rank: weights 1.00 MiB, gradients 1.00 MiB, optimizer "
                      "1.00 MiB, activations 512.00 KiB, workspace 512.00 KiB, total 4.00 MiB");
  xm_strbuf_free(&b);
}

/* The tiny sample: every pair checked, persistent = the params, the
 * activation arena well below the naive sum, parts that add up. */
static void test_tiny_model(void **state) {
  (void)state;
  xm_ir_module_t *m = load_tiny();
  plan_ok(m, "plan-memory");
  assert_true(check_no_overlap(m) > 1000);
  xm_mem_report_t r = report_of(m);
  int64_t naive = naive_sum(m, XM_MEM_ARENA_ACTIVATION);
  assert_true(r.activation_bytes > 0);
  assert_true(r.activation_bytes < naive);
  assert_int_equal(r.persistent_bytes, naive_sum(m, XM_MEM_ARENA_PERSISTENT));
  assert_int_equal(r.weights, r.persistent_bytes);
  assert_int_equal(r.grads + r.optimizer, 0);
  assert_int_equal(r.activations + r.workspace, r.activation_bytes);
  /* Inputs: tokens and labels, i32[4, 128] each. */
  assert_int_equal(r.inputs, 2 * 4 * 128 * 4);
  assert_true(r.activations >= r.inputs);
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  xm_plan_memory_print_report(&r, &b);
  assert_non_null(strstr(xm_strbuf_cstr(&b), "peak memory per rank: weights "));
  xm_strbuf_free(&b);
  xm_ir_module_destroy(m);
}

/* The real input: the tiny model after autodiff. Gradients mirror the
 * trainable params, Adam moments double them, the step's temporaries fit
 * in the micro function's arena. */
static void test_tiny_after_autodiff(void **state) {
  (void)state;
  assert_non_null(xm_pass_find("autodiff"));
  xm_ir_module_t *m = load_tiny();
  plan_ok(m, "autodiff,plan-memory");
  assert_true(check_no_overlap(m) > 10000);
  xm_mem_report_t r = report_of(m);
  assert_true(r.grads > 0 && r.grads <= r.weights);
  assert_true(r.optimizer >= 2 * r.grads);
  assert_int_equal(r.weights + r.grads + r.optimizer, r.persistent_bytes);
  assert_int_equal(r.activations + r.workspace, r.activation_bytes);
  assert_true(r.activation_bytes < naive_sum(m, XM_MEM_ARENA_ACTIVATION) / 2);
  xm_ir_module_destroy(m);
}


/* ---- the cost model's activation memory against the plan, per recompute policy ---- */

typedef struct {
  const char *spec;       /* relative to the source tree */
  int64_t dp, tp, ep, rpn;
  bool ssmb, rbd;
  int zero;
} mem_case_t;

/* The pipeline xmoec compile runs (tools/xmoec/cmd_compile.c, build_pipeline)
 * for a layout and recompute policy. */
static void compile_pipeline(const xm_spec_t *s, const mem_case_t *c, xm_recompute_t rc,
                             xm_strbuf_t *out) {
  bool multi = c->dp * c->tp > 1;
  if (multi)
    xm_strbuf_printf(out,
                     "shard{dp=%lld tp=%lld ep=%lld ssmb=%d rbd=%d zero=%d ranks-per-node=%lld "
                     "dispatch-bound=4},",
                     (long long)c->dp, (long long)c->tp, (long long)c->ep, c->ssmb, c->rbd,
                     c->zero, (long long)c->rpn);
  xm_strbuf_printf(out, "fuse-permute-gemm,fuse-lm-head,autodiff{grad-accum=%lld aux-free-gamma=",
                   (long long)(s->training.global_batch / (s->training.micro_batch * c->dp)));
  xm_strbuf_put_double(out, s->moe.aux_free_gamma);
  xm_strbuf_puts(out, "},");
  if (s->training.dtype == XM_DTYPE_BF16) xm_strbuf_puts(out, "mixed-precision{dtype=bf16},");
  if (rc != XM_RECOMPUTE_NONE)
    xm_strbuf_printf(out, "recompute{policy=%s},", rc == XM_RECOMPUTE_FULL ? "full" : "selective");
  xm_strbuf_puts(out, "canonicalize,fold-accumulate,");
  if (multi) xm_strbuf_puts(out, "overlap-grad-reduce,");
  xm_strbuf_puts(out, "host-reads,kernel-workspace,routed-rows,");
  if (multi) xm_strbuf_puts(out, "overlap-moe-comm,");
  xm_strbuf_puts(out, "plan-memory,schedule");
}

/* The plan of one case under one policy. */
static xm_mem_report_t plan_case(const xm_spec_t *s, const mem_case_t *c, xm_recompute_t rc) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_ir_module_t *m = NULL;
  assert_int_equal(xm_ir_build_model(s, "spec", &d, &m), XM_OK);
  xm_diag_free(&d);
  xm_strbuf_t p;
  xm_strbuf_init(&p);
  compile_pipeline(s, c, rc, &p);
  plan_ok(m, xm_strbuf_cstr(&p));
  xm_strbuf_free(&p);
  xm_mem_report_t r = report_of(m);
  xm_ir_module_destroy(m);
  return r;
}

static xm_cost_t cost_case(const xm_spec_t *s, const mem_case_t *c, xm_recompute_t rc) {
  int64_t world = c->dp * c->tp;
  xm_net_t n = {.nodes = world / c->rpn,
                .ranks_per_node = c->rpn,
                .intra_bw = 100e9,
                .inter_bw = 10e9,
                .intra_lat = 2e-6,
                .inter_lat = 5e-6};
  xm_cost_point_t pt = {.layout = {.dp = c->dp, .tp = c->tp, .ep = c->ep, .ssmb = c->ssmb,
                                   .rbd = c->rbd, .zero = c->zero, .ranks_per_node = c->rpn},
                        .recompute = rc,
                        .micro_batch = s->training.micro_batch,
                        .policy = XM_POLICY_XMOEC};
  xm_diag_t d;
  xm_diag_init(&d);
  xm_cost_t k;
  xm_status_t st = xm_cost_evaluate(s, &n, 64.0 * (1 << 30), 100e12, 0.5, &pt, NULL, &d, &k);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  xm_diag_free(&d);
  return k;
}

/* For every recompute policy: the planned persistent + activation arenas
 * within 10% of what cost.c predicts (the tolerance of
 * tests/e2e/cost_validation.sh) and the persistent arena exactly; what the
 * policy saves on the activation arena (against none) within 20% of the
 * predicted saving (plus 2% of the arena, for the placement's slack where
 * the model predicts no saving); and the order none > selective > full of
 * the planned arenas wherever the model predicts it (never an increase). */
static void test_recompute_against_cost_model(void **state) {
  (void)state;
  static const mem_case_t cases[] = {
      {"tests/e2e/inputs/layouts.json", 1, 1, 1, 1, false, false, 0},
      {"tests/e2e/inputs/layouts.json", 2, 1, 2, 2, false, false, 0},
      {"tests/e2e/inputs/layouts.json", 1, 2, 2, 2, true, false, 0},
      {"tests/e2e/inputs/layouts.json", 2, 2, 4, 2, true, true, 1},
      {"samples/tiny.json", 1, 1, 1, 1, false, false, 0},
      {"samples/tiny.json", 2, 1, 2, 1, false, false, 1},
      {"samples/tiny.json", 1, 2, 2, 2, true, false, 0},
      {"samples/tiny.json", 2, 2, 4, 2, true, true, 1},
  };
  static const char *const names[] = {"none", "selective", "full"};
  int failures = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const mem_case_t *c = &cases[i];
    char path[512];
    snprintf(path, sizeof path, "%s/%s", XM_SOURCE_DIR, c->spec);
    xm_spec_t s;
    xm_diag_t d;
    xm_diag_init(&d);
    assert_int_equal(xm_spec_load_file(path, &d, &s), XM_OK);
    xm_diag_free(&d);
    double pred[3], plan[3];
    for (int rc = 0; rc < 3; rc++) {
      xm_mem_report_t r = plan_case(&s, c, (xm_recompute_t)rc);
      xm_cost_t k = cost_case(&s, c, (xm_recompute_t)rc);
      double persist = k.weights + k.grads + k.optimizer;
      pred[rc] = k.activations + k.buffers;
      plan[rc] = (double)r.activation_bytes;
      double total = (double)(r.persistent_bytes + r.activation_bytes);
      double rel = (persist + pred[rc] - total) / total;
      double saved_pred = pred[0] - pred[rc], saved_plan = plan[0] - plan[rc];
      bool ok = fabs(rel) <= 0.10 && persist == (double)r.persistent_bytes &&
                fabs(saved_plan - saved_pred) <= 0.20 * saved_pred + 0.02 * plan[0] &&
                (rc == 0 || plan[rc] <= plan[rc - 1]) &&
                (rc == 0 || pred[rc] >= pred[rc - 1] || plan[rc] < plan[rc - 1]);
      printf("  %-30s dp%lld tp%lld ep%lld%s%s%s %-9s activation arena predicted %9.0f planned "
             "%9.0f, saved %9.0f of %9.0f predicted; arenas %+6.2f%%%s\n",
             c->spec, (long long)c->dp, (long long)c->tp, (long long)c->ep,
             c->ssmb ? " ssmb" : "", c->rbd ? " rbd" : "", c->zero ? " zero1" : "", names[rc],
             pred[rc], plan[rc], saved_plan, saved_pred, 100 * rel, ok ? "" : "  FAIL");
      failures += !ok;
    }
  }
  assert_int_equal(failures, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_no_overlap_branches),
      cmocka_unit_test(test_no_overlap_random),
      cmocka_unit_test(test_reuse_chain),
      cmocka_unit_test(test_reshape_alias),
      cmocka_unit_test(test_late_input),
      cmocka_unit_test(test_persistent),
      cmocka_unit_test(test_dynamic_and_alignment),
      cmocka_unit_test(test_deterministic),
      cmocka_unit_test(test_step_reuses_arena),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_report_text),
      cmocka_unit_test(test_tiny_model),
      cmocka_unit_test(test_tiny_after_autodiff),
      cmocka_unit_test(test_recompute_against_cost_model),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
