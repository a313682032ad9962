/* tests/unit/test_overlap.c — the overlapped collectives of generated code
 * (runtime/abi/program.h: xm_rt_overlap_begin / _end / _join).
 *
 * A recording backend logs every event_record and stream_wait with the
 * stream and event it was given, so the test asserts the exact protocol:
 * begin records the fork event on the compute stream and makes the
 * communication stream wait for it, then x->stream is the communication
 * stream; end goes back to the compute stream without waiting; join makes
 * the compute stream wait for an event recorded on the communication
 * stream, once; without a communication stream, or while a step is traced,
 * nothing is recorded and everything stays on the compute stream.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "runtime/abi/program.h"

enum { MAX_LOG = 16 };
static char g_log[MAX_LOG][64];
static int g_n;

/* Distinct addresses stand for the streams and events. */
static char k_compute, k_comm, k_fork, k_done;

static const char *name_of(const void *p) {
  if (p == &k_compute) return "compute";
  if (p == &k_comm) return "comm";
  if (p == &k_fork) return "fork";
  if (p == &k_done) return "done";
  return "?";
}

static void rec_record(xm_rt_backend_t *be, xm_rt_event_t *e, xm_rt_stream_t *s) {
  (void)be;
  if (g_n < MAX_LOG) snprintf(g_log[g_n++], 64, "record %s on %s", name_of(e), name_of(s));
}

static void rec_wait(xm_rt_backend_t *be, xm_rt_stream_t *s, xm_rt_event_t *e) {
  (void)be;
  if (g_n < MAX_LOG) snprintf(g_log[g_n++], 64, "%s waits %s", name_of(s), name_of(e));
}

static xm_rt_backend_t g_be = {
    .name = "recording", .event_record = rec_record, .stream_wait = rec_wait};

static xm_rt_exec_t exec_with_comm(void) {
  xm_rt_exec_t x;
  memset(&x, 0, sizeof x);
  x.be = &g_be;
  x.stream = (xm_rt_stream_t *)&k_compute;
  x.comm_stream = (xm_rt_stream_t *)&k_comm;
  x.comm_fork = (xm_rt_event_t *)&k_fork;
  x.comm_done = (xm_rt_event_t *)&k_done;
  g_n = 0;
  return x;
}

static void test_protocol(void **state) {
  (void)state;
  xm_rt_exec_t x = exec_with_comm();
  xm_rt_overlap_begin(&x);
  assert_ptr_equal(x.stream, &k_comm); /* the collective queues there */
  assert_ptr_equal(x.compute_stream, &k_compute);
  assert_int_equal(g_n, 2);
  assert_string_equal(g_log[0], "record fork on compute");
  assert_string_equal(g_log[1], "comm waits fork");
  xm_rt_overlap_end(&x);
  assert_ptr_equal(x.stream, &k_compute);
  assert_null(x.compute_stream);
  assert_int_equal(x.comm_pending, 1);
  assert_int_equal(g_n, 2); /* the compute stream does not wait */
  /* A second overlapped collective: the same fork, still pending. */
  xm_rt_overlap_begin(&x);
  xm_rt_overlap_end(&x);
  assert_int_equal(g_n, 4);
  assert_string_equal(g_log[2], "record fork on compute");
  assert_string_equal(g_log[3], "comm waits fork");
  xm_rt_overlap_join(&x);
  assert_int_equal(g_n, 6);
  assert_string_equal(g_log[4], "record done on comm");
  assert_string_equal(g_log[5], "compute waits done");
  assert_int_equal(x.comm_pending, 0);
  assert_ptr_equal(x.stream, &k_compute);
  xm_rt_overlap_join(&x); /* nothing pending: nothing to wait for */
  assert_int_equal(g_n, 6);
}

static void test_in_order_without_comm_stream(void **state) {
  (void)state;
  xm_rt_exec_t x = exec_with_comm();
  x.comm_stream = NULL;
  xm_rt_overlap_begin(&x);
  assert_ptr_equal(x.stream, &k_compute);
  xm_rt_overlap_end(&x);
  xm_rt_overlap_join(&x);
  assert_int_equal(g_n, 0);
  assert_int_equal(x.comm_pending, 0);
}

static void test_in_order_when_traced(void **state) {
  (void)state;
  xm_rt_exec_t x = exec_with_comm();
  int recorder;
  x.trace = &recorder;
  xm_rt_overlap_begin(&x);
  assert_ptr_equal(x.stream, &k_compute);
  xm_rt_overlap_end(&x);
  xm_rt_overlap_join(&x);
  assert_int_equal(g_n, 0);
  assert_int_equal(x.comm_pending, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_protocol),
      cmocka_unit_test(test_in_order_without_comm_stream),
      cmocka_unit_test(test_in_order_when_traced),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
