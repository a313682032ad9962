/* tests/unit/test_overlap.c — the overlapped collectives of generated code
 * (runtime/abi/program.h: xm_rt_overlap_begin / _end / _join).
 *
 * A recording backend logs every event_record and stream_wait with the
 * stream and event it was given, so the test asserts the exact protocol of
 * a lane: begin records the lane's fork event on the compute stream (or
 * uses the one xm_rt_overlap_fork recorded earlier) and makes the lane's
 * stream wait for it, then x->stream is the lane's stream; end goes back
 * to the compute stream without waiting; join makes the compute stream
 * wait for an event recorded on the lane's stream, once; the two lanes
 * (gradient reductions, expert exchanges) keep their own streams, events
 * and pending work; without a lane's stream, or while a step is traced,
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

enum { MAX_LOG = 24 };
static char g_log[MAX_LOG][64];
static int g_n;

/* Distinct addresses stand for the streams and events. */
static char k_compute, k_grad, k_grad_fork, k_grad_done, k_moe, k_moe_fork, k_moe_done;

static const char *name_of(const void *p) {
  if (p == &k_compute) return "compute";
  if (p == &k_grad) return "grad";
  if (p == &k_grad_fork) return "grad.fork";
  if (p == &k_grad_done) return "grad.done";
  if (p == &k_moe) return "moe";
  if (p == &k_moe_fork) return "moe.fork";
  if (p == &k_moe_done) return "moe.done";
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

static xm_rt_exec_t exec_with_lanes(void) {
  xm_rt_exec_t x;
  memset(&x, 0, sizeof x);
  x.be = &g_be;
  x.stream = (xm_rt_stream_t *)&k_compute;
  x.lane[XM_RT_LANE_GRAD] = (xm_rt_lane_t){.stream = (xm_rt_stream_t *)&k_grad,
                                           .fork = (xm_rt_event_t *)&k_grad_fork,
                                           .done = (xm_rt_event_t *)&k_grad_done};
  x.lane[XM_RT_LANE_MOE] = (xm_rt_lane_t){.stream = (xm_rt_stream_t *)&k_moe,
                                          .fork = (xm_rt_event_t *)&k_moe_fork,
                                          .done = (xm_rt_event_t *)&k_moe_done};
  g_n = 0;
  return x;
}

static void test_protocol(void **state) {
  (void)state;
  xm_rt_exec_t x = exec_with_lanes();
  xm_rt_overlap_begin(&x, XM_RT_LANE_GRAD);
  assert_ptr_equal(x.stream, &k_grad); /* the collective queues there */
  assert_ptr_equal(x.compute_stream, &k_compute);
  assert_int_equal(g_n, 2);
  assert_string_equal(g_log[0], "record grad.fork on compute");
  assert_string_equal(g_log[1], "grad waits grad.fork");
  xm_rt_overlap_end(&x, XM_RT_LANE_GRAD);
  assert_ptr_equal(x.stream, &k_compute);
  assert_null(x.compute_stream);
  assert_int_equal(x.lane[XM_RT_LANE_GRAD].pending, 1);
  assert_int_equal(g_n, 2); /* the compute stream does not wait */
  /* A second overlapped collective: the same fork, still pending. */
  xm_rt_overlap_begin(&x, XM_RT_LANE_GRAD);
  xm_rt_overlap_end(&x, XM_RT_LANE_GRAD);
  assert_int_equal(g_n, 4);
  assert_string_equal(g_log[2], "record grad.fork on compute");
  assert_string_equal(g_log[3], "grad waits grad.fork");
  xm_rt_overlap_join(&x, XM_RT_LANE_GRAD);
  assert_int_equal(g_n, 6);
  assert_string_equal(g_log[4], "record grad.done on grad");
  assert_string_equal(g_log[5], "compute waits grad.done");
  assert_int_equal(x.lane[XM_RT_LANE_GRAD].pending, 0);
  assert_ptr_equal(x.stream, &k_compute);
  xm_rt_overlap_join(&x, XM_RT_LANE_GRAD); /* nothing pending: nothing to wait for */
  assert_int_equal(g_n, 6);
}

/* overlap-moe-comm's order: fork, the work beside (queued on the compute
 * stream, a gradient reduction among it), then the exchange, whose lane
 * waits for the fork, not for the work beside; the join before its reader. */
static void test_fork_then_exchange(void **state) {
  (void)state;
  xm_rt_exec_t x = exec_with_lanes();
  xm_rt_overlap_fork(&x, XM_RT_LANE_MOE);
  assert_int_equal(g_n, 1);
  assert_string_equal(g_log[0], "record moe.fork on compute");
  assert_ptr_equal(x.stream, &k_compute); /* the work beside stays on the compute stream */
  xm_rt_overlap_begin(&x, XM_RT_LANE_GRAD); /* a reduction among that work */
  xm_rt_overlap_end(&x, XM_RT_LANE_GRAD);
  assert_int_equal(g_n, 3);
  xm_rt_overlap_begin(&x, XM_RT_LANE_MOE);
  assert_ptr_equal(x.stream, &k_moe);
  assert_int_equal(g_n, 4); /* no second fork: the one recorded before the work */
  assert_string_equal(g_log[3], "moe waits moe.fork");
  xm_rt_overlap_end(&x, XM_RT_LANE_MOE);
  assert_ptr_equal(x.stream, &k_compute);
  assert_int_equal(x.lane[XM_RT_LANE_MOE].pending, 1);
  assert_int_equal(x.lane[XM_RT_LANE_MOE].forked, 0);
  xm_rt_overlap_join(&x, XM_RT_LANE_MOE);
  assert_int_equal(g_n, 6);
  assert_string_equal(g_log[4], "record moe.done on moe");
  assert_string_equal(g_log[5], "compute waits moe.done");
  /* The reduction is still pending on its own lane. */
  assert_int_equal(x.lane[XM_RT_LANE_GRAD].pending, 1);
  assert_int_equal(x.lane[XM_RT_LANE_MOE].pending, 0);
  xm_rt_overlap_join(&x, XM_RT_LANE_GRAD);
  assert_string_equal(g_log[7], "compute waits grad.done");
  /* The next exchange without a fork records one at its begin. */
  xm_rt_overlap_begin(&x, XM_RT_LANE_MOE);
  assert_string_equal(g_log[8], "record moe.fork on compute");
  assert_string_equal(g_log[9], "moe waits moe.fork");
  xm_rt_overlap_end(&x, XM_RT_LANE_MOE);
}

static void test_in_order_without_lane_stream(void **state) {
  (void)state;
  xm_rt_exec_t x = exec_with_lanes();
  x.lane[XM_RT_LANE_MOE].stream = NULL;
  xm_rt_overlap_fork(&x, XM_RT_LANE_MOE);
  xm_rt_overlap_begin(&x, XM_RT_LANE_MOE);
  assert_ptr_equal(x.stream, &k_compute);
  xm_rt_overlap_end(&x, XM_RT_LANE_MOE);
  xm_rt_overlap_join(&x, XM_RT_LANE_MOE);
  assert_int_equal(g_n, 0);
  assert_int_equal(x.lane[XM_RT_LANE_MOE].pending, 0);
  /* The other lane still overlaps. */
  xm_rt_overlap_begin(&x, XM_RT_LANE_GRAD);
  assert_ptr_equal(x.stream, &k_grad);
  xm_rt_overlap_end(&x, XM_RT_LANE_GRAD);
  assert_int_equal(g_n, 2);
}

static void test_in_order_when_traced(void **state) {
  (void)state;
  xm_rt_exec_t x = exec_with_lanes();
  int recorder;
  x.trace = &recorder;
  for (int lane = 0; lane < XM_RT_LANES; lane++) {
    xm_rt_overlap_fork(&x, lane);
    xm_rt_overlap_begin(&x, lane);
    assert_ptr_equal(x.stream, &k_compute);
    xm_rt_overlap_end(&x, lane);
    xm_rt_overlap_join(&x, lane);
    assert_int_equal(x.lane[lane].pending, 0);
    assert_int_equal(x.lane[lane].forked, 0);
  }
  assert_int_equal(g_n, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_protocol),
      cmocka_unit_test(test_fork_then_exchange),
      cmocka_unit_test(test_in_order_without_lane_stream),
      cmocka_unit_test(test_in_order_when_traced),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
