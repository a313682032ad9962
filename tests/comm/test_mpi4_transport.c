/* tests/comm/test_mpi4_transport.c — the transports of the collectives
 * (runtime/comm/transport.h) on 4 ranks as 2 emulated nodes of 2.
 *
 * Every collective of runtime/comm/spmd.h, on every group of two layouts
 * (dp2 tp2 ep4: groups of 4, 2 and 1; dp4 ep2: tp of 1, edp of 2), runs
 * first on host memory (no backend: the reference) and then on the
 * emulated GPU backend under each transport: host staging, MPI on device
 * memory, and NCCL through the tests' double (XM_NCCL_LIBRARY, set by
 * ctest to tests/comm/nccl_shim.c's library). Inputs are small multiples
 * of 1/4, so every sum is exact in any order and the outputs must be equal
 * bit for bit; the traffic counters (per phase and peer, and the per-layer
 * matrix) must be equal too. Sizes include uneven ZeRO-1 chunks (short and
 * empty ones: the NCCL path pads them), zero-row all-to-all blocks, and
 * n = 0 calls. Also: the staging slots stop growing after the first round;
 * the start-up choice (auto on the emulated and CPU backends, a missing
 * library, nccl refused on the CPU backend) and its line; and the NCCL
 * path's all-to-all plan agrees on an overflow like the MPI one (every
 * member XM_ERR_NO_MEMORY, the same message, no traffic).
 */
#include "tests/unit/mpi_check.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/abi/backend.h"
#include "runtime/comm/comm.h"
#include "runtime/comm/spmd.h"
#include "runtime/comm/transport.h"

/* ---- results and counters ---- */

typedef struct {
  unsigned char *data;
  size_t len, cap;
} blob_t;

static void put(blob_t *b, const void *p, size_t n) {
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n)
      cap *= 2;
    b->data = realloc(b->data, cap);
    b->cap = cap;
  }
  if (n) memcpy(b->data + b->len, p, n);
  b->len += n;
}

/* The counters as bytes: sent [phase][world], then the used layer slots. */
static void snapshot(const xm_rt_comm_t *c, blob_t *b) {
  const xm_rt_traffic_t *t = &c->traffic;
  size_t row = (size_t)XM_RT_PHASE_COUNT * (size_t)t->world;
  put(b, t->sent, row * sizeof(int64_t));
  put(b, &t->layer_slots, sizeof t->layer_slots);
  put(b, t->layer_sent, (size_t)t->layer_slots * row * sizeof(int64_t));
  put(b, t->used, (size_t)t->layer_slots * XM_RT_PHASE_COUNT);
}

/* Exact in float and in any order of summation. */
static float value_of(int rank, int64_t i) {
  return (float)(rank + 1) * 0.5f + (float)(i % 7) * 0.25f;
}

/* ---- one round of every collective on every group ---- */

static void round_of(xm_rt_exec_t *x, xm_rt_comm_t *c, blob_t *out) {
  int r = c->ctx->rank;
  for (int k = 0; k < XM_RT_GROUP_COUNT; k++) {
    const xm_rt_comm_group_t *g = xm_rt_comm_group(c, (xm_rt_group_kind_t)k);
    int P = g->size;
    enum { N = 11, M = 5 };
    float a[4 * N], b[4 * N];
    for (int i = 0; i < 4 * N; i++)
      a[i] = value_of(r + k, i), b[i] = -1.0f;
    xm_rt_all_reduce(x, k, 2, a, b, N);
    put(out, b, sizeof(float) * N);
    xm_rt_all_reduce(x, k, -1, a, a, N); /* in place */
    put(out, a, sizeof(float) * N);
    xm_rt_all_reduce(x, k, -1, a, b, 0);
    int32_t cnt[7];
    for (int i = 0; i < 7; i++)
      cnt[i] = r * 10 + i + k;
    xm_rt_all_reduce_i32(x, k, 1, cnt, 7);
    put(out, cnt, sizeof cnt);

    for (int i = 0; i < 4 * N; i++)
      a[i] = value_of(r, i + k), b[i] = -1.0f;
    xm_rt_all_gather(x, k, -1, a, b, M);
    put(out, b, sizeof(float) * (size_t)(P * M));
    xm_rt_all_gather(x, k, -1, a, b, 0);
    for (int i = 0; i < 4 * N; i++)
      b[i] = -1.0f;
    xm_rt_reduce_scatter(x, k, -1, a, b, 3);
    put(out, b, sizeof(float) * 4);
    xm_rt_narrow(x, k, a, b, 2, 4);
    put(out, b, sizeof(float) * 2);

    /* The expert all-to-all: L local experts, rows of W, some blocks empty. */
    enum { L = 2, W = 3 };
    int32_t sc[4 * L], rc[4 * L], tpe[L], back_sc[4 * L];
    int sent = 0;
    for (int i = 0; i < P * L; i++) {
      sc[i] = (r + i + k) % 3;
      sent += sc[i];
    }
    xm_rt_exchange_counts(x, k, 0, sc, rc, tpe, L);
    put(out, rc, sizeof(int32_t) * (size_t)(P * L));
    put(out, tpe, sizeof tpe);
    float rows[4 * L * 2 * W], got_rows[4 * L * 2 * W], home[4 * L * 2 * W];
    for (int i = 0; i < sent * W; i++)
      rows[i] = value_of(r, i);
    int64_t bound = P * L * 2;
    memset(got_rows, 0, sizeof got_rows);
    int64_t got =
        xm_rt_all_to_all(x, k, XM_RT_PHASE_DISPATCH, 0, rows, sc, rc, L, W, got_rows, bound);
    put(out, &got, sizeof got);
    put(out, got_rows, sizeof(float) * (size_t)(got * W));
    /* The mirror combine: every row goes home. */
    memcpy(back_sc, rc, sizeof(int32_t) * (size_t)(P * L));
    memset(home, 0, sizeof home);
    int64_t back =
        xm_rt_all_to_all(x, k, XM_RT_PHASE_COMBINE, 0, got_rows, back_sc, sc, L, W, home, sent);
    CHECK_I64("rows home", back, sent);
    CHECK(memcmp(home, rows, sizeof(float) * (size_t)(sent * W)) == 0,
          "group %d: the combine returns every row", k);

    /* ZeRO-1: uneven chunks (10 over 4: 3 3 3 1), empty ones (2 over 4),
     * even ones, and nothing. */
    static const int64_t sizes[] = {10, 2, 8, 0};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
      int64_t n = sizes[s], cl = xm_rt_chunk(n, P);
      float grad[16], chunk[16], param[16];
      for (int i = 0; i < 16; i++)
        grad[i] = value_of(r, i * 3 + k), chunk[i] = -7.0f;
      xm_rt_zero_reduce_scatter(x, k, grad, n, chunk);
      put(out, chunk, sizeof(float) * (size_t)cl);
      for (int64_t i = 0; i < 16; i++) {
        int64_t owner = cl ? i / cl : 0;
        param[i] = owner == g->index ? value_of(g->index, i) : -5.0f;
      }
      xm_rt_zero_gather(x, k, param, n);
      put(out, param, sizeof(float) * (size_t)n);
    }
  }
}

/* ---- the runs ---- */

static const char *k_names[] = {"host staging", "mpi", "nccl"};
static const xm_rt_comm_mode_t k_modes[] = {XM_RT_COMM_HOST, XM_RT_COMM_MPI, XM_RT_COMM_NCCL};

static void check_layout(const xm_rt_context_t *ctx, xm_rt_comm_layout_t layout, const char *shim) {
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_rt_comm_t *c = NULL;
  xm_status_t st = xm_rt_comm_create(ctx, &layout, &diag, &c);
  xm_diag_free(&diag);
  CHECK(st == XM_OK, "comm_create dp%d tp%d ep%d", layout.dp, layout.tp, layout.ep);
  if (st != XM_OK) return;

  xm_rt_exec_t x;
  memset(&x, 0, sizeof x);
  x.ctx = ctx;
  x.comm = c;
  blob_t want = {0}, want_traffic = {0};
  xm_rt_comm_traffic_reset(c);
  round_of(&x, c, &want); /* host memory, no transport */
  snapshot(c, &want_traffic);

  xm_rt_backend_t *emu = xm_rt_emu_backend();
  int threads = 1;
  char err[512];
  emu->init(emu, 0, 1, &threads, err, sizeof err);
  setenv("XM_NCCL_LIBRARY", shim, 1);
  for (int m = 0; m < 3; m++) {
    st = xm_rt_transport_create(c, emu, k_modes[m], err, sizeof err);
    CHECK(st == XM_OK, "%s: %s", k_names[m], err);
    if (st != XM_OK) continue;
    CHECK(c->transport->kind == (xm_rt_xport_kind_t)(XM_RT_XPORT_STAGED + m), "%s: kind %d",
          k_names[m], (int)c->transport->kind);
    x.be = emu;
    x.stream = emu->stream_create(emu);
    for (int rep = 0; rep < 2; rep++) {
      void *slots[XM_RT_STAGE_SLOTS];
      memcpy(slots, c->transport->stage.buf, sizeof slots);
      blob_t got = {0}, got_traffic = {0};
      xm_rt_comm_traffic_reset(c);
      round_of(&x, c, &got);
      snapshot(c, &got_traffic);
      CHECK(got.len == want.len && memcmp(got.data, want.data, want.len) == 0,
            "dp%d tp%d ep%d, %s, round %d: the results differ from host memory's", layout.dp,
            layout.tp, layout.ep, k_names[m], rep);
      CHECK(got_traffic.len == want_traffic.len &&
                memcmp(got_traffic.data, want_traffic.data, want_traffic.len) == 0,
            "dp%d tp%d ep%d, %s, round %d: the traffic counters differ", layout.dp, layout.tp,
            layout.ep, k_names[m], rep);
      if (rep == 1)
        CHECK(memcmp(slots, c->transport->stage.buf, sizeof slots) == 0,
              "%s: the staging slots grew in the second round", k_names[m]);
      free(got.data);
      free(got_traffic.data);
    }
    emu->stream_destroy(emu, x.stream);
    x.be = NULL;
    x.stream = NULL;
    xm_rt_transport_destroy(c->transport);
    c->transport = NULL;
  }
  unsetenv("XM_NCCL_LIBRARY");
  free(want.data);
  free(want_traffic.data);
  xm_rt_comm_destroy(c);
}

/* The start-up choice and its errors, on one layout. */
static void check_choice(const xm_rt_context_t *ctx, const char *shim) {
  xm_rt_comm_layout_t layout = {2, 2, 4, 0, 0};
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_rt_comm_t *c = NULL;
  xm_status_t st = xm_rt_comm_create(ctx, &layout, &diag, &c);
  xm_diag_free(&diag);
  if (st != XM_OK) return;
  /* The transport only asks a backend whether its memory is host memory
   * and what it is called: a host-visible copy of the emulated one stands
   * for the CPU backend (a program links one backend; so does this test). */
  xm_rt_backend_t *emu = xm_rt_emu_backend(), cpu_like = *emu, *cpu = &cpu_like;
  cpu_like.name = "cpu";
  cpu_like.host_visible = 1;
  char err[512];

  unsetenv("XM_NCCL_LIBRARY");
  st = xm_rt_transport_create(c, emu, XM_RT_COMM_AUTO, err, sizeof err);
  CHECK(st == XM_OK && c->transport->kind == XM_RT_XPORT_STAGED &&
            strstr(c->transport->line, "comm: host staging (auto on the emulated backend") ==
                c->transport->line,
        "auto on emu: %s", c->transport ? c->transport->line : err);
  xm_rt_transport_destroy(c->transport);
  c->transport = NULL;

  st = xm_rt_transport_create(c, emu, XM_RT_COMM_NCCL, err, sizeof err);
  CHECK(st == XM_ERR_INVALID_INPUT && !c->transport &&
            strstr(err, "--comm nccl: the emu backend has no NCCL library of its own") == err,
        "nccl on emu without a library: %s", err);

  setenv("XM_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
  st = xm_rt_transport_create(c, emu, XM_RT_COMM_NCCL, err, sizeof err);
  CHECK(st == XM_ERR_INVALID_INPUT && !c->transport &&
            strstr(err, "--comm nccl: /nonexistent/libnccl.so.2 not found (dlopen: ") == err,
        "a missing library: %s", err);

  /* Found on some ranks only: every rank refuses, with the lowest failing
   * rank's reason. */
  setenv("XM_NCCL_LIBRARY", ctx->rank % 2 ? "/nonexistent/odd.so" : shim, 1);
  st = xm_rt_transport_create(c, emu, XM_RT_COMM_NCCL, err, sizeof err);
  CHECK(st == XM_ERR_INVALID_INPUT &&
            strstr(err, "--comm nccl: rank 1: /nonexistent/odd.so") == err,
        "a library on some ranks only: %s", err);

  setenv("XM_NCCL_LIBRARY", shim, 1);
  st = xm_rt_transport_create(c, emu, XM_RT_COMM_NCCL, err, sizeof err);
  CHECK(st == XM_OK && strstr(c->transport->line, "comm: nccl 2.30.1 (") == c->transport->line,
        "nccl through the shim: %s", st == XM_OK ? c->transport->line : err);
  if (st == XM_OK) {
    /* The plan of the NCCL path agrees on an overflow like the MPI path:
     * rank 1 can take no row. */
    const xm_rt_comm_group_t *g = xm_rt_comm_group(c, XM_RT_GROUP_EP);
    int64_t sc[4] = {1, 1, 1, 1}, rcv[4], roff[4], total = -1;
    xm_rt_comm_traffic_reset(c);
    xm_diag_init(&diag);
    xm_rt_a2a_t rows = {XM_RT_PHASE_DISPATCH, 3, 8};
    float dummy[64];
    st = xm_rt_comm_all_to_all_v_counts(c, XM_RT_GROUP_EP, rows, dummy, sc, dummy,
                                        ctx->rank == 1 ? 0 : 8, &diag, rcv, roff, &total);
    CHECK(st == XM_ERR_NO_MEMORY, "overflow: %s", xm_status_name(st));
    CHECK_I64("observed rows", total, g->size);
    char msg[512] = "", first[512] = "";
    if (diag.count) snprintf(msg, sizeof msg, "%s", diag.entries[0].message);
    memcpy(first, msg, sizeof first);
    MPI_Bcast(first, (int)sizeof first, MPI_CHAR, 0, ctx->world_comm);
    /* The overflowing member's message adds its buffer's size; every
     * member names the same rank and row count. */
    CHECK(strstr(msg, "over the ep group: rank 1 would receive 4 rows") &&
              strstr(first, "over the ep group: rank 1 would receive 4 rows"),
          "every member names the overflow: '%s' / rank 0: '%s'", msg, first);
    xm_diag_free(&diag);
    xm_rt_traffic_totals_t tot;
    xm_rt_comm_traffic_local(c, &tot);
    CHECK_I64("no traffic on overflow", tot.intra_total + tot.inter_total, 0);
  }
  xm_rt_transport_destroy(c->transport);
  c->transport = NULL;

  st = xm_rt_transport_create(c, emu, XM_RT_COMM_MPI, err, sizeof err);
  CHECK(st == XM_OK && c->transport->kind == XM_RT_XPORT_MPI, "mpi on emu: %s", err);
  xm_rt_transport_destroy(c->transport);
  c->transport = NULL;

  /* The CPU backend: nccl is refused, mpi and auto are host memory. */
  st = xm_rt_transport_create(c, cpu, XM_RT_COMM_NCCL, err, sizeof err);
  CHECK(st == XM_ERR_INVALID_INPUT && strstr(err, "--comm nccl: NCCL moves device memory") == err,
        "nccl on cpu: %s", err);
  for (int m = 0; m < 2; m++) {
    st = xm_rt_transport_create(c, cpu, m ? XM_RT_COMM_MPI : XM_RT_COMM_AUTO, err, sizeof err);
    CHECK(st == XM_OK && c->transport->kind == XM_RT_XPORT_HOST &&
              strstr(c->transport->line, "comm: MPI on host memory (the cpu backend") ==
                  c->transport->line,
          "%s on cpu: %s", m ? "mpi" : "auto", st == XM_OK ? c->transport->line : err);
    xm_rt_transport_destroy(c->transport);
    c->transport = NULL;
  }
  unsetenv("XM_NCCL_LIBRARY");
  xm_rt_comm_destroy(c);
}

int main(int argc, char **argv) {
  xm_rt_context_t ctx;
  const char *env = getenv("XM_NCCL_LIBRARY");
  char shim[1024] = "";
  if (env) snprintf(shim, sizeof shim, "%s", env);
  if (!start_checks(&argc, &argv, 4, 2, &ctx)) return 1;
  CHECK(shim[0] != '\0', "XM_NCCL_LIBRARY must name the NCCL test double");
  if (shim[0]) {
    check_layout(&ctx, (xm_rt_comm_layout_t){2, 2, 4, 0, 0}, shim);
    check_layout(&ctx, (xm_rt_comm_layout_t){4, 1, 2, 0, 0}, shim);
    check_choice(&ctx, shim);
  }
  int rc = finish_checks(&ctx, "test_mpi4_transport");
  xm_rt_context_destroy(&ctx);
  return rc;
}
