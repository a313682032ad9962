/* tests/unit/test_mpi_comm.c — the runtime communicator on 2 ranks (ctest
 * runs test_mpi_* under `mpirun -np 2`): group members of the four layouts
 * of 2 ranks, every collective and all-to-all case of comm_checks.h on
 * every group, first with both ranks on one node (all traffic intra-node)
 * and then with XM_RANKS_PER_NODE=1 (all of it inter-node), and the
 * step-log JSON of a small step.
 */
#include <cjson/cJSON.h>

#include "comm_checks.h"

typedef struct {
  int dp, tp, ep;
  const char *members[XM_RT_GROUP_COUNT][2]; /* [kind][rank]; node for 1 node */
} table2_t;

static const table2_t k_tables[] = {
    /* dp, tp, ep; then the members of: world, dp, tp, ep, edp (node: by the context) */
    {2, 1, 2, {{"0,1", "0,1"}, {"0,1", "0,1"}, {"0", "1"}, {"0,1", "0,1"}, {"0", "1"}}},
    {2, 1, 1, {{"0,1", "0,1"}, {"0,1", "0,1"}, {"0", "1"}, {"0", "1"}, {"0,1", "0,1"}}},
    {1, 2, 2, {{"0,1", "0,1"}, {"0", "1"}, {"0,1", "0,1"}, {"0,1", "0,1"}, {"0", "1"}}},
    {1, 2, 1, {{"0,1", "0,1"}, {"0", "1"}, {"0,1", "0,1"}, {"0", "1"}, {"0,1", "0,1"}}},
};

static void check_tables(const xm_rt_context_t *ctx) {
  for (size_t t = 0; t < sizeof k_tables / sizeof k_tables[0]; t++) {
    const table2_t *T = &k_tables[t];
    xm_rt_comm_layout_t l = {T->dp, T->tp, T->ep, 0, 0};
    xm_rt_comm_t *c = NULL;
    if (xm_rt_comm_create(ctx, &l, NULL, &c) != XM_OK) {
      CHECK(0, "create dp%d tp%d ep%d", T->dp, T->tp, T->ep);
      continue;
    }
    for (int k = 0; k < XM_RT_GROUP_COUNT; k++) {
      char got[32];
      members_text(xm_rt_comm_group(c, k_all_groups[k]), got, sizeof got);
      const char *want = k_all_groups[k] == XM_RT_GROUP_NODE
                             ? (ctx->ranks_per_node == 2 ? "0,1" : (ctx->rank ? "1" : "0"))
                             : T->members[k][ctx->rank];
      CHECK(!strcmp(got, want), "dp%d tp%d ep%d: %s group is {%s}, want {%s}", T->dp, T->tp, T->ep,
            xm_rt_group_name(k_all_groups[k]), got, want);
    }
    xm_rt_comm_destroy(c);
  }
}

/* One dispatch of 3 rows of 2 floats to the peer and one all_reduce of 10:
 * the summed JSON counts both ranks, all intra or all inter. */
static void check_json(const xm_rt_context_t *ctx) {
  xm_rt_comm_layout_t l = {2, 1, 2, 0, 0};
  xm_rt_comm_t *c = NULL;
  if (xm_rt_comm_create(ctx, &l, NULL, &c) != XM_OK) {
    CHECK(0, "create dp2 ep2");
    return;
  }
  int64_t counts[2] = {3, 3};
  float send[12] = {0}, recv[12];
  xm_rt_a2a_t rows = {XM_RT_PHASE_DISPATCH, 0, 2};
  CHECK(xm_rt_comm_all_to_all_v(c, XM_RT_GROUP_EP, rows, send, counts, recv, 6, NULL, NULL, NULL,
                                NULL) == XM_OK,
        "dispatch");
  float buf[10] = {0};
  xm_rt_comm_all_reduce(c, XM_RT_GROUP_DP, buf, 10);
  xm_strbuf_t json;
  xm_strbuf_init(&json);
  CHECK(xm_rt_comm_traffic_report(c, 1, 0, NULL, NULL, NULL, &json) == XM_OK, "report");
  if (ctx->rank == 0) {
    char doc[1024];
    snprintf(doc, sizeof doc, "{%s}", xm_strbuf_cstr(&json));
    cJSON *root = cJSON_Parse(doc);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "traffic");
    const cJSON *by = cJSON_GetObjectItemCaseSensitive(t, "by_phase");
    const char *where = ctx->ranks_per_node == 2 ? "intra" : "inter";
    const char *other = ctx->ranks_per_node == 2 ? "inter" : "intra";
    /* dispatch: 3 rows * 2 floats * 4 bytes per rank; all_reduce of 10 on
     * 2 ranks: chunks of 5, each rank sends 10 - 5 + 10 - 5 = 10 floats. */
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(by, "dispatch");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(by, "all_reduce");
    CHECK(root && cJSON_GetObjectItemCaseSensitive(d, where)->valuedouble == 48 &&
              cJSON_GetObjectItemCaseSensitive(d, other)->valuedouble == 0 &&
              cJSON_GetObjectItemCaseSensitive(a, where)->valuedouble == 80,
          "JSON: %s", doc);
    char key[32];
    snprintf(key, sizeof key, "%s_bytes", where);
    CHECK(cJSON_GetObjectItemCaseSensitive(t, key)->valuedouble == 128, "%s: %s", key, doc);
    cJSON_Delete(root);
  }
  xm_strbuf_free(&json);
  xm_rt_comm_destroy(c);
}

static void check_all(const xm_rt_context_t *ctx) {
  check_tables(ctx);
  const int splits[2][2] = {{1, 2}, {2, 1}};
  for (int s = 0; s < 2; s++)
    for (int ep = 1; ep <= 2; ep *= 2)
      check_layout_all(ctx, splits[s][0], splits[s][1], ep);
  check_json(ctx);
}

int main(int argc, char **argv) {
  setenv("XM_RANKS_PER_NODE", "2", 1);
  xm_rt_context_t ctx;
  if (xm_rt_context_create(&argc, &argv, &ctx) != XM_OK) return 1;
  g_rank = ctx.rank;
  CHECK(ctx.world == 2, "run with 2 ranks (world %d)", ctx.world);
  if (ctx.world != 2) {
    xm_rt_context_destroy(&ctx);
    return 1;
  }
  check_all(&ctx); /* one node */
  setenv("XM_RANKS_PER_NODE", "1", 1);
  xm_rt_context_t two_nodes;
  if (xm_rt_context_create(NULL, NULL, &two_nodes) == XM_OK) {
    check_all(&two_nodes);
    xm_rt_context_destroy(&two_nodes);
  } else {
    CHECK(0, "context with one rank per node");
  }
  int failed = finish_checks(&ctx, "test_mpi_comm");
  xm_rt_context_destroy(&ctx);
  return failed ? 1 : 0;
}
