/* tests/unit/test_mpi4_comm.c — the runtime communicator on 4 ranks as 2
 * emulated nodes of 2 (ctest runs test_mpi4_* so, XM_RANKS_PER_NODE=2).
 *
 * Covers: layout validation with places; the group members of six layouts
 * against tables written from docs/design.md, Parallel layout by hand; every collective on
 * every group of every legal layout of 4 ranks against local references
 * (comm_checks.h), including all-to-all with random, all-zero and
 * all-to-one counts, the receive-bound overflow, int32 rows and the mirror
 * combine; exact traffic counters, the step-log JSON and the per-layer
 * matrix file parsed back with cJSON; the failure agreement.
 *
 * With XM_COMM_TEST_MODE set the binary instead plays one failure for
 * tests/e2e/comm_failure.sh: "agree" (rank 1 reports bad input at a safe
 * point), "abort" (rank 1 passes a bad count into an all-to-all the others
 * are already waiting in), "overflow" (an all-to-all over its bound, then
 * the agreement). Every rank must end non-zero within seconds.
 */
#include <cjson/cJSON.h>

#include "comm_checks.h"

/* ---- layout validation ---- */

static void check_invalid(xm_rt_comm_layout_t l, const char *place, const char *text) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_status_t st = xm_rt_comm_layout_validate(&l, &d);
  CHECK(st == XM_ERR_INVALID_INPUT, "dp%d tp%d ep%d world %d rpn %d accepted", l.dp, l.tp, l.ep,
        l.world, l.ranks_per_node);
  int found = 0;
  for (int i = 0; i < d.count; i++) {
    int same_place = place ? d.entries[i].place && !strcmp(d.entries[i].place, place)
                           : d.entries[i].place == NULL;
    found |= same_place && strstr(d.entries[i].message, text) != NULL;
  }
  CHECK(found, "no error at %s containing '%s' (first: %s)", place ? place : "(none)", text,
        d.count ? d.entries[0].message : "none");
  xm_diag_free(&d);
}

static void check_validation(const xm_rt_context_t *ctx) {
  xm_diag_t d;
  xm_diag_init(&d);
  xm_rt_comm_layout_t ok = {2, 2, 2, 4, 2};
  CHECK(xm_rt_comm_layout_validate(&ok, &d) == XM_OK && d.count == 0, "dp2 tp2 ep2 refused");
  xm_rt_comm_layout_t big = {64, 16, 128, 1024, 8};
  CHECK(xm_rt_comm_layout_validate(&big, &d) == XM_OK, "dp64 tp16 ep128 refused");
  xm_diag_free(&d);
  check_invalid((xm_rt_comm_layout_t){0, 4, 1, 4, 2}, "/parallel/dp", "dp is 0");
  check_invalid((xm_rt_comm_layout_t){4, -1, 1, 4, 2}, "/parallel/tp", "tp is -1");
  check_invalid((xm_rt_comm_layout_t){4, 1, 0, 4, 2}, "/parallel/ep", "ep is 0");
  check_invalid((xm_rt_comm_layout_t){2, 2, 3, 4, 2}, "/parallel/ep",
                "ep 3 does not divide the 4 token-parallel ranks");
  check_invalid((xm_rt_comm_layout_t){2, 1, 1, 4, 2}, "/parallel",
                "dp 2 * tp 1 = 2 ranks, but the program runs on 4");
  check_invalid((xm_rt_comm_layout_t){4, 1, 1, 4, 3}, NULL, "3 ranks per node");
  check_invalid((xm_rt_comm_layout_t){1, 1, 1, 0, 1}, NULL, "world size is 0");
  /* dp * tp must not overflow int on the way. */
  check_invalid((xm_rt_comm_layout_t){65536, 65536, 1, 4, 2}, "/parallel", "ranks, but");

  /* create: the same errors on every rank, and no hang. */
  xm_rt_comm_t dummy, *c = &dummy; /* must be reset to NULL */
  xm_diag_init(&d);
  xm_rt_comm_layout_t wrong = {4, 2, 1, 0, 0};
  CHECK(xm_rt_comm_create(ctx, &wrong, &d, &c) == XM_ERR_INVALID_INPUT && c == NULL,
        "dp4 tp2 on 4 ranks created");
  xm_rt_comm_layout_t wrong_world = {4, 2, 1, 8, 0};
  CHECK(xm_rt_comm_create(ctx, &wrong_world, &d, &c) == XM_ERR_INVALID_INPUT,
        "world 8 on 4 ranks created");
  xm_rt_comm_layout_t wrong_rpn = {4, 1, 1, 0, 4};
  CHECK(xm_rt_comm_create(ctx, &wrong_rpn, &d, &c) == XM_ERR_INVALID_INPUT,
        "4 ranks per node created on 2 per node");
  CHECK(d.count == 3 && strstr(d.entries[1].message, "runs on 4") &&
            strstr(d.entries[2].message, "XM_RANKS_PER_NODE"),
        "create messages (%d)", d.count);
  xm_diag_free(&d);
}

/* ---- group tables (docs/design.md, Parallel layout; world 4, 2 ranks per node) ---- */

typedef struct {
  int dp, tp, ep;
  const char *members[XM_RT_GROUP_COUNT][4]; /* [kind][rank] */
} layout_table_t;

#define ALL4                                                                                       \
  { "0,1,2,3", "0,1,2,3", "0,1,2,3", "0,1,2,3" }
#define ONE4                                                                                       \
  { "0", "1", "2", "3" }
#define PAIRS                                                                                      \
  { "0,1", "0,1", "2,3", "2,3" }
#define STRIDED                                                                                    \
  { "0,2", "1,3", "0,2", "1,3" }

static const layout_table_t k_tables[] = {
    /* dp, tp, ep; then the members of: world, dp, tp, ep, edp, node */
    {2, 2, 2, {ALL4, STRIDED, PAIRS, PAIRS, STRIDED, PAIRS}},
    {4, 1, 4, {ALL4, ALL4, ONE4, ALL4, ONE4, PAIRS}},
    {4, 1, 2, {ALL4, ALL4, ONE4, PAIRS, STRIDED, PAIRS}},
    {2, 2, 4, {ALL4, STRIDED, PAIRS, ALL4, ONE4, PAIRS}},
    {1, 4, 2, {ALL4, ONE4, ALL4, PAIRS, STRIDED, PAIRS}},
    {4, 1, 1, {ALL4, ALL4, ONE4, ONE4, ALL4, PAIRS}},
    {1, 4, 4, {ALL4, ONE4, ALL4, ALL4, ONE4, PAIRS}},
};

static void check_tables(const xm_rt_context_t *ctx) {
  for (size_t t = 0; t < sizeof k_tables / sizeof k_tables[0]; t++) {
    const layout_table_t *T = &k_tables[t];
    xm_rt_comm_layout_t l = {T->dp, T->tp, T->ep, 0, 0};
    xm_rt_comm_t *c = NULL;
    xm_status_t st = xm_rt_comm_create(ctx, &l, NULL, &c);
    CHECK(st == XM_OK, "dp%d tp%d ep%d: create", T->dp, T->tp, T->ep);
    if (st != XM_OK) continue;
    for (int k = 0; k < XM_RT_GROUP_COUNT; k++) {
      char got[64];
      members_text(xm_rt_comm_group(c, k_all_groups[k]), got, sizeof got);
      const char *want = T->members[k][ctx->rank];
      CHECK(!strcmp(got, want), "dp%d tp%d ep%d: %s group of rank %d is {%s}, want {%s}", T->dp,
            T->tp, T->ep, xm_rt_group_name(k_all_groups[k]), ctx->rank, got, want);
    }
    xm_rt_comm_destroy(c);
  }
}

/* ---- the traffic report ---- */

enum { NREC = 6 };
typedef struct {
  int layer;
  xm_rt_phase_t phase;
} record_t;
static const record_t k_records[NREC] = {
    {0, XM_RT_PHASE_DISPATCH},    {0, XM_RT_PHASE_COMBINE},     {1, XM_RT_PHASE_DISPATCH},
    {-1, XM_RT_PHASE_ALL_REDUCE}, {-1, XM_RT_PHASE_ALL_GATHER}, {-1, XM_RT_PHASE_REDUCE_SCATTER}};

/* The step played by every rank; layer l's dispatch uses seed 11 + l and
 * width 4 + l, the combine mirrors layer 0. */
static void play_step(xm_rt_comm_t *c) {
  const xm_rt_comm_group_t *g = xm_rt_comm_group(c, XM_RT_GROUP_EP);
  int64_t got0[64], total = 0;
  for (int layer = 0; layer < 2; layer++) {
    int64_t W = 4 + layer;
    a2a_send_t s = make_send(g, c->ctx->rank, 11u + (uint32_t)layer, W, -1);
    float *recv = malloc((size_t)(64 * 5 * W) * sizeof(float));
    int64_t counts[64];
    xm_rt_a2a_t rows = {XM_RT_PHASE_DISPATCH, layer, W};
    CHECK(xm_rt_comm_all_to_all_v(c, XM_RT_GROUP_EP, rows, s.rows, s.counts, recv, 64 * 5, NULL,
                                  counts, NULL, &total) == XM_OK,
          "dispatch of layer %d", layer);
    if (layer == 0) {
      memcpy(got0, counts, sizeof counts);
      float *back = malloc((size_t)(s.total * W + 1) * sizeof(float));
      xm_rt_a2a_t comb = {XM_RT_PHASE_COMBINE, 0, W};
      xm_rt_comm_all_to_all_v_known(c, XM_RT_GROUP_EP, comb, recv, got0, back, s.counts);
      free(back);
    }
    free(recv);
    free(s.rows);
  }
  float buf[64] = {0}, out[64];
  xm_rt_comm_all_reduce(c, XM_RT_GROUP_DP, buf, 37);
  xm_rt_comm_all_gather(c, XM_RT_GROUP_TP, buf, 5, out);
  xm_rt_comm_reduce_scatter(c, XM_RT_GROUP_EDP, buf, 6, out);
}

/* What rank s sent to rank q in record rec under play_step. */
static int64_t expect_bytes(const xm_rt_comm_layout_t *l, record_t rec, int s, int q) {
  switch (rec.phase) {
  case XM_RT_PHASE_ALL_REDUCE: return ring_expect(l, XM_RT_GROUP_DP, rec.phase, 37, s, q);
  case XM_RT_PHASE_ALL_GATHER: return ring_expect(l, XM_RT_GROUP_TP, rec.phase, 5, s, q);
  case XM_RT_PHASE_REDUCE_SCATTER: return ring_expect(l, XM_RT_GROUP_EDP, rec.phase, 6, s, q);
  default: break;
  }
  int m[64], i = 0, P = xm_rt_comm_layout_group(l, XM_RT_GROUP_EP, s, m, &i);
  int64_t W = 4 + rec.layer;
  for (int j = 0; j < P; j++) {
    if (m[j] != q || j == i) continue;
    if (rec.phase == XM_RT_PHASE_DISPATCH) return a_count(11u + (uint32_t)rec.layer, s, j) * W * 4;
    return a_count(11u, q, i) * W * 4; /* combine: back what q sent to s */
  }
  return 0;
}

static int64_t json_i64(const cJSON *obj, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  return cJSON_IsNumber(v) ? (int64_t)v->valuedouble : -1;
}

static void check_step_json(const xm_rt_comm_layout_t *l, const char *fragment,
                            const xm_rt_traffic_totals_t *totals) {
  int64_t intra[XM_RT_PHASE_COUNT] = {0}, inter[XM_RT_PHASE_COUNT] = {0}, ti = 0, te = 0;
  for (int r = 0; r < NREC; r++)
    for (int s = 0; s < l->world; s++)
      for (int q = 0; q < l->world; q++) {
        int64_t b = expect_bytes(l, k_records[r], s, q);
        int same = s / l->ranks_per_node == q / l->ranks_per_node;
        (same ? intra : inter)[k_records[r].phase] += b;
        *(same ? &ti : &te) += b;
      }
  size_t len = strlen(fragment);
  char *doc = malloc(len + 3);
  snprintf(doc, len + 3, "{%s}", fragment);
  cJSON *root = cJSON_Parse(doc);
  CHECK(root != NULL, "step-log fragment does not parse: %s", fragment);
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "traffic");
  CHECK_I64("intra_bytes", json_i64(t, "intra_bytes"), ti);
  CHECK_I64("inter_bytes", json_i64(t, "inter_bytes"), te);
  CHECK_I64("totals intra", totals->intra_total, ti);
  CHECK_I64("totals inter", totals->inter_total, te);
  const cJSON *by = cJSON_GetObjectItemCaseSensitive(t, "by_phase");
  CHECK(cJSON_GetArraySize(by) == XM_RT_PHASE_COUNT, "by_phase has %d phases",
        cJSON_GetArraySize(by));
  for (int p = 0; p < XM_RT_PHASE_COUNT; p++) {
    const cJSON *ph = cJSON_GetObjectItemCaseSensitive(by, xm_rt_phase_name((xm_rt_phase_t)p));
    CHECK(ph != NULL, "by_phase lacks %s", xm_rt_phase_name((xm_rt_phase_t)p));
    CHECK_I64(xm_rt_phase_name((xm_rt_phase_t)p), json_i64(ph, "intra"), intra[p]);
    CHECK_I64(xm_rt_phase_name((xm_rt_phase_t)p), json_i64(ph, "inter"), inter[p]);
  }
  CHECK(ti + te > 0, "the step moved no bytes");
  cJSON_Delete(root);
  free(doc);
}

static void check_matrix_file(const xm_rt_comm_layout_t *l, FILE *f, int64_t step) {
  rewind(f);
  char line[1 << 14];
  int n = 0;
  while (fgets(line, sizeof line, f)) {
    cJSON *o = cJSON_Parse(line);
    CHECK(o != NULL, "matrix line %d does not parse", n);
    if (!o || n >= NREC) {
      n++;
      cJSON_Delete(o);
      continue;
    }
    record_t rec = k_records[n];
    const cJSON *layer = cJSON_GetObjectItemCaseSensitive(o, "layer");
    const cJSON *phase = cJSON_GetObjectItemCaseSensitive(o, "phase");
    CHECK_I64("step", json_i64(o, "step"), step);
    CHECK_I64("world", json_i64(o, "world"), l->world);
    CHECK(rec.layer < 0 ? cJSON_IsNull(layer) : json_i64(o, "layer") == rec.layer, "line %d: layer",
          n);
    CHECK(cJSON_IsString(phase) && !strcmp(phase->valuestring, xm_rt_phase_name(rec.phase)),
          "line %d: phase %s", n, cJSON_IsString(phase) ? phase->valuestring : "?");
    const cJSON *bytes = cJSON_GetObjectItemCaseSensitive(o, "bytes");
    CHECK(cJSON_GetArraySize(bytes) == l->world, "line %d: %d rows", n, cJSON_GetArraySize(bytes));
    for (int s = 0; s < l->world; s++) {
      const cJSON *row = cJSON_GetArrayItem(bytes, s);
      CHECK(cJSON_GetArraySize(row) == l->world, "line %d row %d", n, s);
      for (int q = 0; q < l->world; q++) {
        const cJSON *v = cJSON_GetArrayItem(row, q);
        int64_t want = expect_bytes(l, rec, s, q), got = v ? (int64_t)v->valuedouble : -1;
        CHECK(got == want, "matrix line %d [%d][%d]: %lld, want %lld", n, s, q, (long long)got,
              (long long)want);
      }
    }
    cJSON_Delete(o);
    n++;
  }
  CHECK_I64("matrix lines", n, NREC);
}

static void check_report(const xm_rt_context_t *ctx, int dp, int tp, int ep) {
  xm_rt_comm_layout_t l = {dp, tp, ep, 0, 0};
  xm_rt_comm_t *c = NULL;
  if (xm_rt_comm_create(ctx, &l, NULL, &c) != XM_OK) {
    CHECK(0, "create dp%d tp%d ep%d", dp, tp, ep);
    return;
  }
  xm_rt_comm_traffic_reset(c);
  play_step(c);
  FILE *f = ctx->rank == 0 ? tmpfile() : NULL;
  xm_strbuf_t json;
  xm_strbuf_init(&json);
  xm_rt_traffic_totals_t totals;
  memset(&totals, 0, sizeof totals);
  xm_diag_t d;
  xm_diag_init(&d);
  xm_status_t st = xm_rt_comm_traffic_report(c, 7, 1, f, &d, &totals, &json);
  CHECK(st == XM_OK, "report dp%d tp%d ep%d: %d", dp, tp, ep, (int)st);
  if (ctx->rank == 0) {
    check_step_json(&c->layout, xm_strbuf_cstr(&json), &totals);
    check_matrix_file(&c->layout, f, 7);
  } else {
    CHECK(json.len == 0, "rank %d wrote JSON", ctx->rank);
  }
  /* A reset step reports zeros and no matrix lines. */
  xm_rt_comm_traffic_reset(c);
  long end = f ? ftell(f) : 0;
  xm_strbuf_clear(&json);
  st = xm_rt_comm_traffic_report(c, 8, 1, f, &d, &totals, &json);
  CHECK(st == XM_OK && (!f || ftell(f) == end), "empty step wrote matrix lines");
  CHECK(ctx->rank != 0 || (totals.intra_total == 0 && totals.inter_total == 0 &&
                           strstr(xm_strbuf_cstr(&json), "\"intra_bytes\":0,\"inter_bytes\":0")),
        "empty step totals: %s", xm_strbuf_cstr(&json));
  /* No file on rank 0: the same error on every rank. */
  play_step(c);
  st = xm_rt_comm_traffic_report(c, 9, 1, NULL, &d, NULL, NULL);
  CHECK(st == XM_ERR_IO, "report without a file: %d", (int)st);
  CHECK((ctx->rank == 0) == (d.count == 1), "the message is on rank 0 only (%d)", d.count);
  xm_diag_free(&d);
  xm_strbuf_free(&json);
  if (f) fclose(f);
  xm_rt_comm_destroy(c);
}

/* ---- agreement ---- */

static void check_agree(const xm_rt_context_t *ctx) {
  char msg[256];
  CHECK(xm_rt_comm_agree(ctx, XM_OK, NULL, msg, sizeof msg) == XM_OK && msg[0] == '\0',
        "all OK: %s", msg);
  int r = ctx->rank;
  xm_status_t st = xm_rt_comm_agree(ctx, r == 2 ? XM_ERR_IO : XM_OK,
                                    r == 2 ? "disk full on rank 2" : NULL, msg, sizeof msg);
  CHECK(st == XM_ERR_IO && !strcmp(msg, "rank 2: disk full on rank 2"), "one failure: %d %s",
        (int)st, msg);
  st = xm_rt_comm_agree(ctx, r % 2 ? XM_ERR_INVALID_INPUT + (r == 3) * 4 : XM_OK,
                        r == 1 ? "first" : "second", msg, sizeof msg);
  CHECK(st == XM_ERR_INVALID_INPUT && !strcmp(msg, "rank 1: first"), "lowest wins: %d %s", (int)st,
        msg);
  st = xm_rt_comm_agree(ctx, r == 3 ? XM_ERR_NO_MEMORY : XM_OK, NULL, msg, 12);
  CHECK(st == XM_ERR_NO_MEMORY && strlen(msg) == 11 && !strncmp(msg, "rank 3: ", 8),
        "truncated status-name message: '%s'", msg);
}

/* ---- failure modes (tests/e2e/comm_failure.sh) ---- */

static int play_failure(xm_rt_context_t *ctx, const char *mode) {
  xm_rt_comm_layout_t l = {2, 2, 2, 0, 0};
  xm_rt_comm_t *c = NULL;
  xm_diag_t d;
  xm_diag_init(&d);
  xm_rt_comm_exit_on_error(ctx, NULL, xm_rt_comm_create(ctx, &l, &d, &c), "create failed");
  if (!strcmp(mode, "agree")) {
    int bad = ctx->rank == 1;
    xm_rt_comm_exit_on_error(ctx, c, bad ? XM_ERR_INVALID_INPUT : XM_OK,
                             bad ? "data file corpus.tok:128: token id 70000 >= vocab 50257"
                                 : NULL);
  } else if (!strcmp(mode, "abort")) {
    int64_t counts[4] = {ctx->rank == 1 ? -3 : 0, 0, 0, 0};
    xm_rt_a2a_t rows = {XM_RT_PHASE_DISPATCH, 0, 8};
    xm_rt_comm_all_to_all_v(c, XM_RT_GROUP_WORLD, rows, NULL, counts, NULL, 0, NULL, NULL, NULL,
                            NULL);
  } else if (!strcmp(mode, "overflow")) {
    int64_t counts[2] = {4, 4};
    float send[64] = {0}, recv[64];
    xm_rt_a2a_t rows = {XM_RT_PHASE_DISPATCH, 5, 4};
    xm_status_t st = xm_rt_comm_all_to_all_v(c, XM_RT_GROUP_EP, rows, send, counts, recv,
                                             ctx->rank == 1 ? 3 : 16, &d, NULL, NULL, NULL);
    char msg[512] = "";
    if (d.count) snprintf(msg, sizeof msg, "%s", d.entries[0].message);
    xm_diag_free(&d);
    xm_rt_comm_exit_on_error(ctx, c, st, msg);
  }
  printf("rank %d: NOT REACHED (mode %s)\n", ctx->rank, mode);
  fflush(stdout);
  xm_rt_comm_destroy(c);
  xm_diag_free(&d);
  return 0;
}

int main(int argc, char **argv) {
  xm_rt_context_t ctx;
  if (!start_checks(&argc, &argv, 4, 2, &ctx)) return 1;
  const char *mode = getenv("XM_COMM_TEST_MODE");
  if (mode && *mode) {
    int rc = play_failure(&ctx, mode);
    xm_rt_context_destroy(&ctx);
    return rc;
  }
  check_validation(&ctx);
  check_tables(&ctx);
  const int splits[3][2] = {{1, 4}, {2, 2}, {4, 1}};
  for (int s = 0; s < 3; s++)
    for (int ep = 1; ep <= 4; ep *= 2)
      check_layout_all(&ctx, splits[s][0], splits[s][1], ep);
  check_report(&ctx, 2, 2, 2);
  check_report(&ctx, 4, 1, 4);
  check_report(&ctx, 1, 4, 1);
  check_agree(&ctx);
  int failed = finish_checks(&ctx, "test_mpi4_comm");
  xm_rt_context_destroy(&ctx);
  return failed ? 1 : 0;
}
