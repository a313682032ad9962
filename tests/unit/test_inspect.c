/* tests/unit/test_inspect.c — the measured side of `xmoec inspect`'s traces:
 * the op hooks the code generator puts into a program (codegen/c_program.c)
 * and the recorder and writer behind them (runtime/driver/trace.h).
 *
 * The generated text is checked on the tiny sample through the real
 * pipeline: every op that runs code has exactly one hook, on its comment
 * line, with its index, name, layer and phase; input and return have none;
 * each function ends with XM_TRACE_DONE. The recorder is driven through the
 * same macros the program uses: nothing is recorded with x->trace NULL, an
 * event ends where the next starts, the step and micro-batch come from
 * xm_rt_trace_set, and the JSON written (one rank, MPI started by main)
 * holds one "X" event per record with its args. The predicted side and
 * the 1:1 match of a real run's events are tests/e2e/trace.sh's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/c_program.h"
#include "frontend/spec.h"
#include "ir/model.h"
#include "passes/pass.h"
#include "runtime/comm/context.h"
#include "runtime/driver/trace.h"
#include "support/strbuf.h"

#define PIPELINE                                                                                   \
  "autodiff{grad-accum=2},canonicalize,fold-accumulate,host-reads,kernel-workspace,routed-rows,"   \
  "plan-memory,schedule"

/* ---- the hooks in generated code ---------------------------------------- */

static xm_ir_module_t *lowered_tiny(xm_spec_t *spec) {
  xm_diag_t d;
  xm_diag_init(&d);
  assert_int_equal(xm_spec_load_file(XM_SOURCE_DIR "/samples/tiny.json", &d, spec), XM_OK);
  xm_ir_module_t *m = NULL;
  assert_int_equal(xm_ir_build_model(spec, "tiny.json", &d, &m), XM_OK);
  xm_pass_manager_options_t po;
  xm_pass_manager_options_default(&po);
  xm_status_t st = xm_pass_pipeline_run(m, PIPELINE, &po, &d);
  if (st != XM_OK) xm_diag_print(&d, stderr);
  assert_int_equal(st, XM_OK);
  xm_diag_free(&d);
  return m;
}

/* The line of the program that starts with op i's comment, owned. */
static char *op_line(const char *text, int i, const char *name) {
  char want[96];
  snprintf(want, sizeof want, "/* op %d %s ", i, name);
  const char *p = strstr(text, want);
  if (!p) return NULL;
  const char *end = strchr(p, '\n');
  return strndup(p, end ? (size_t)(end - p) : strlen(p));
}

static int count_substr(const char *s, const char *needle) {
  int n = 0;
  for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle))
    n++;
  return n;
}

static void test_program_hooks(void **state) {
  (void)state;
  xm_spec_t *spec = calloc(1, sizeof *spec);
  assert_non_null(spec);
  xm_ir_module_t *m = lowered_tiny(spec);
  xm_diag_t d;
  xm_diag_init(&d);
  xm_strbuf_t out;
  xm_strbuf_init(&out);
  xm_codegen_inputs_t in = {.spec_path = "samples/tiny.json",
                            .spec_text = "{}\n",
                            .config_json = "{}\n",
                            .pipeline = PIPELINE};
  assert_int_equal(xm_codegen_program_c(m, spec, &in, &d, &out), XM_OK);
  const char *text = xm_strbuf_cstr(&out);
  assert_non_null(strstr(text, "#include \"runtime/driver/trace.h\"\n"));
  int traced = 0, seen_bwd = 0, seen_step = 0;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->code == XM_OP_PARAM || op->code == XM_OP_STATE) continue;
    const char *name = xm_ir_opinfo(op->code)->name;
    char *line = op_line(text, i, name);
    assert_non_null(line);
    if (op->code == XM_OP_INPUT || op->code == XM_OP_RETURN) {
      assert_null(strstr(line, "XM_TRACE_OP"));
    } else {
      const char *phase = xm_ir_op_get_string(op, "phase", "fwd");
      const char *flag = strcmp(phase, "bwd") == 0    ? "XM_RT_TRACE_BWD"
                         : strcmp(phase, "step") == 0 ? "XM_RT_TRACE_STEP"
                                                      : "XM_RT_TRACE_FWD";
      char want[160];
      snprintf(want, sizeof want, " */ XM_TRACE_OP(x, %d, \"%s\", %d, %s);", i, name,
               (int)xm_ir_op_get_int(op, "layer", -1), flag);
      if (!strstr(line, want)) fprintf(stderr, "line: %s\nwant: %s\n", line, want);
      assert_non_null(strstr(line, want));
      assert_int_equal(count_substr(line, "XM_TRACE_OP"), 1);
      traced++;
      seen_bwd += strcmp(phase, "bwd") == 0;
      seen_step += strcmp(phase, "step") == 0;
    }
    free(line);
  }
  /* one hook per traced op, nowhere else; one end per function */
  assert_int_equal(count_substr(text, "XM_TRACE_OP("), traced);
  assert_int_equal(count_substr(text, "XM_TRACE_DONE(x);"), 2);
  assert_true(traced > 400 && seen_bwd > 200 && seen_step > 100);
  xm_strbuf_free(&out);
  xm_diag_free(&d);
  xm_ir_module_destroy(m);
  free(spec);
}

/* ---- the recorder -------------------------------------------------------- */

static void busy(void) {
  volatile double s = 0;
  for (int i = 0; i < 20000; i++)
    s += i * 0.5;
}

/* Two micro-batch ops then a step op, as a generated program runs them. */
static void run_ops(xm_rt_exec_t *x, xm_rt_trace_t *t) {
  if (t) xm_rt_trace_set(t, 7, 1);
  XM_TRACE_OP(x, 3, "matmul", 0, XM_RT_TRACE_FWD);
  busy();
  XM_TRACE_OP(x, 4, "all_to_all", 1, XM_RT_TRACE_BWD | XM_RT_TRACE_COMM);
  busy();
  XM_TRACE_DONE(x);
  if (t) xm_rt_trace_set(t, 7, -1);
  XM_TRACE_OP(x, 10, "adamw", -1, XM_RT_TRACE_STEP);
  busy();
  XM_TRACE_DONE(x);
}

static void test_recorder(void **state) {
  (void)state;
  xm_rt_exec_t x;
  memset(&x, 0, sizeof x);
  run_ops(&x, NULL); /* tracing off: the hooks do nothing */
  xm_rt_trace_t *t = xm_rt_trace_create();
  assert_non_null(t);
  assert_int_equal(xm_rt_trace_count(t), 0);
  x.trace = t;
  run_ops(&x, t);
  x.trace = NULL;
  run_ops(&x, NULL);
  assert_int_equal(xm_rt_trace_count(t), 3);
  assert_false(xm_rt_trace_truncated(t));
  const struct {
    int op, micro, layer, flags;
  } want[] = {{3, 1, 0, XM_RT_TRACE_FWD},
              {4, 1, 1, XM_RT_TRACE_BWD | XM_RT_TRACE_COMM},
              {10, -1, -1, XM_RT_TRACE_STEP}};
  double prev_end = 0;
  for (int i = 0; i < 3; i++) {
    int op, micro, layer, flags;
    int64_t step;
    double a, b;
    xm_rt_trace_event(t, i, &op, &micro, &layer, &flags, &step, &a, &b);
    assert_int_equal(op, want[i].op);
    assert_int_equal(micro, want[i].micro);
    assert_int_equal(layer, want[i].layer);
    assert_int_equal(flags, want[i].flags);
    assert_int_equal(step, 7);
    assert_true(b > a);                     /* busy() took time */
    if (i == 1) assert_true(a == prev_end); /* the next hook ends the op before */
    if (i == 2) assert_true(a >= prev_end); /* DONE closed op 4; the driver ran between */
    prev_end = b;
  }
  xm_rt_trace_destroy(t);
}

/* The writer on one rank: the JSON parses and holds the records. */
static void test_write(void **state) {
  (void)state;
  xm_rt_context_t ctx;
  int argc = 0;
  char **argv = NULL;
  assert_int_equal(xm_rt_context_create(&argc, &argv, &ctx), XM_OK);
  xm_rt_exec_t x;
  memset(&x, 0, sizeof x);
  xm_rt_trace_t *t = xm_rt_trace_create();
  x.trace = t;
  run_ops(&x, t);
  FILE *f = tmpfile();
  assert_non_null(f);
  assert_int_equal(xm_rt_trace_write(t, &ctx, "tiny \"q\"", f), XM_OK);
  long len = ftell(f);
  assert_true(len > 0);
  rewind(f);
  char *text = calloc(1, (size_t)len + 1);
  assert_int_equal(fread(text, 1, (size_t)len, f), (size_t)len);
  fclose(f);
  cJSON *o = cJSON_Parse(text);
  if (!o) fprintf(stderr, "%s\n", text);
  assert_non_null(o);
  const cJSON *events = cJSON_GetObjectItem(o, "traceEvents");
  assert_true(cJSON_IsArray(events));
  int x_events = 0;
  const char *names[] = {"matmul", "all_to_all", "adamw"};
  const int ops[] = {3, 4, 10}, micro[] = {1, 1, -1}, tid[] = {0, 1, 0};
  const char *cat[] = {"fwd", "bwd", "step"};
  double last_ts = -1;
  const cJSON *e;
  cJSON_ArrayForEach(e, events) {
    const char *ph = cJSON_GetObjectItem(e, "ph")->valuestring;
    if (strcmp(ph, "X") != 0) {
      assert_string_equal(ph, "M");
      continue;
    }
    int i = x_events++;
    assert_true(i < 3);
    assert_string_equal(cJSON_GetObjectItem(e, "name")->valuestring, names[i]);
    assert_string_equal(cJSON_GetObjectItem(e, "cat")->valuestring, cat[i]);
    assert_int_equal(cJSON_GetObjectItem(e, "pid")->valueint, 0);
    assert_int_equal(cJSON_GetObjectItem(e, "tid")->valueint, tid[i]);
    const cJSON *args = cJSON_GetObjectItem(e, "args");
    assert_int_equal(cJSON_GetObjectItem(args, "op")->valueint, ops[i]);
    assert_int_equal(cJSON_GetObjectItem(args, "micro")->valueint, micro[i]);
    assert_int_equal(cJSON_GetObjectItem(args, "step")->valueint, 7);
    double ts = cJSON_GetObjectItem(e, "ts")->valuedouble;
    if (i == 0) assert_true(ts == 0.0); /* times count from the first event */
    assert_true(ts > last_ts);
    assert_true(cJSON_GetObjectItem(e, "dur")->valuedouble > 0);
    last_ts = ts;
  }
  assert_int_equal(x_events, 3);
  const cJSON *other = cJSON_GetObjectItem(o, "otherData");
  assert_string_equal(cJSON_GetObjectItem(other, "kind")->valuestring, "measured");
  assert_string_equal(cJSON_GetObjectItem(other, "model")->valuestring, "tiny \"q\"");
  assert_int_equal(cJSON_GetObjectItem(other, "events")->valueint, 3);
  assert_true(cJSON_IsFalse(cJSON_GetObjectItem(other, "truncated")));
  cJSON_Delete(o);
  free(text);
  /* A stream that cannot be written is an i/o error. */
  FILE *ro = fopen("/dev/full", "w");
  if (ro) {
    assert_int_equal(xm_rt_trace_write(t, &ctx, "tiny", ro), XM_ERR_IO);
    fclose(ro);
  }
  xm_rt_trace_destroy(t);
  xm_rt_context_destroy(&ctx);
}

/* See tests/unit/test_train_driver.c: full malloc stacks for the
 * suppressions of Open MPI's leaks in the sanitizer build. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "fast_unwind_on_malloc=0"; }
const char *__lsan_default_options(void);
const char *__lsan_default_options(void) { return "fast_unwind_on_malloc=0"; }

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_program_hooks),
      cmocka_unit_test(test_recorder),
      cmocka_unit_test(test_write),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  MPI_Finalize();
  return failed;
}
