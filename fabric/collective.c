/* fabric/collective.c — the flows of the runtime's collectives
 * (fabric/collective.h).
 *
 * The byte model is docs/traffic.md's, computed per member in integers so
 * that the flows sum to the bytes the runtime logs: the all-reduce cuts n
 * elements into P chunks of floor(n/P) (+1 for the first n mod P) and
 * member i sends every chunk but its own in the reduce-scatter half and
 * every chunk but chunk i+1 in the all-gather half; ZeRO-1 cuts them into
 * chunks of ceil(n/P) (the last ones short or empty); the all-gather and
 * reduce-scatter of equal blocks send P-1 blocks. planner/network.c counts
 * the same bytes by link class; tests/unit/test_fabric_collective.c holds
 * the two to equality.
 *
 * A ring member sends floor(b/2) to its successor and the rest to its
 * predecessor, which is one flow per direction and member: the flows of a
 * phase are what moves between a pair of ranks during the whole
 * collective, not its P-1 individual messages, which the latency rounds
 * (latency_steps) stand for.
 */
#include "fabric/collective.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

const char *xm_fab_coll_phase_name(xm_fab_coll_t kind) {
  switch (kind) {
  case XM_FAB_ALL_REDUCE: return "all_reduce";
  case XM_FAB_ALL_GATHER:
  case XM_FAB_ZERO_ALL_GATHER: return "all_gather";
  case XM_FAB_REDUCE_SCATTER:
  case XM_FAB_ZERO_REDUCE_SCATTER: return "reduce_scatter";
  default: return "?";
  }
}

double xm_fab_ring_steps(xm_fab_coll_t kind, int64_t P) {
  if (P < 2) return 0;
  return kind == XM_FAB_ALL_REDUCE ? 2.0 * (double)(P - 1) : (double)(P - 1);
}

static bool group_valid(xm_fab_group_t g) {
  return g.size >= 1 && g.first >= 0 && (g.size == 1 || g.stride >= 1) &&
         (g.size == 1 || g.stride <= (INT64_MAX - g.first) / (g.size - 1));
}

/* ---- bytes per ring member -------------------------------------------------- */

/* The buffer in the runtime's elements: 4 bytes when the size allows. */
typedef struct {
  int64_t P, n, elem, q, rem, zc;
} chunks_t;

static bool chunks_init(int64_t P, double bytes, chunks_t *c) {
  if (!(bytes >= 0 && bytes == floor(bytes) && bytes < 0x1p52) || P < 1) return false;
  int64_t b = (int64_t)bytes;
  c->P = P;
  c->elem = b % 4 == 0 ? 4 : 1;
  c->n = b / c->elem;
  c->q = c->n / P;
  c->rem = c->n % P;
  c->zc = c->n / P + (c->n % P != 0);
  return true;
}

/* Elements of all-reduce chunk j (j == P is chunk 0). */
static int64_t ar_chunk(const chunks_t *c, int64_t j) {
  if (j == c->P) j = 0;
  return c->q + (j < c->rem ? 1 : 0);
}

/* Elements of ZeRO-1 chunk j: [j zc, min(n, (j+1) zc)). */
static int64_t zero_chunk(const chunks_t *c, int64_t j) {
  if (j == c->P) j = 0;
  int64_t lo = j * c->zc, hi = lo + c->zc < c->n ? lo + c->zc : c->n;
  return hi > lo ? hi - lo : 0;
}

double xm_fab_ring_member_bytes(xm_fab_coll_t kind, int64_t P, double bytes, int64_t i) {
  if (P < 2 || i < 0 || i >= P || !(bytes > 0) || !isfinite(bytes)) return 0;
  chunks_t c;
  bool exact = P < ((int64_t)1 << 30) && chunks_init(P, bytes, &c);
  double fp = (double)P;
  switch (kind) {
  case XM_FAB_ALL_REDUCE:
    if (!exact) return 2.0 * (fp - 1) / fp * bytes;
    return (double)(c.elem * ((c.n - ar_chunk(&c, i)) + (c.n - ar_chunk(&c, i + 1))));
  case XM_FAB_ALL_GATHER:
  case XM_FAB_REDUCE_SCATTER: return (fp - 1) * bytes;
  case XM_FAB_ZERO_REDUCE_SCATTER:
    if (!exact) return (fp - 1) / fp * bytes;
    return (double)(c.elem * (c.n - zero_chunk(&c, i)));
  case XM_FAB_ZERO_ALL_GATHER:
    if (!exact) return (fp - 1) / fp * bytes;
    return (double)(c.elem * (c.n - zero_chunk(&c, i + 1)));
  default: return 0;
  }
}

/* ---- builders ------------------------------------------------------------------ */

static void raise_steps(xm_fab_phase_t *p, double steps) {
  if (steps > p->latency_steps) p->latency_steps = steps;
}

xm_status_t xm_fab_ring(xm_fab_phase_t *p, xm_fab_coll_t kind, xm_fab_group_t g, double bytes) {
  if (!group_valid(g) || !(bytes >= 0) || !isfinite(bytes) || kind < 0 ||
      kind >= XM_FAB_COLL_COUNT_)
    return XM_ERR_INVALID_INPUT;
  int64_t P = g.size;
  if (P < 2 || bytes == 0) return XM_OK;
  for (int64_t i = 0; i < P; i++) {
    double b = xm_fab_ring_member_bytes(kind, P, bytes, i);
    int64_t me = xm_fab_group_member(g, i);
    int64_t succ = xm_fab_group_member(g, (i + 1) % P);
    int64_t pred = xm_fab_group_member(g, (i + P - 1) % P);
    /* A whole byte count splits as the runtime's floor(b/2); a continuous
     * one in halves. */
    double to_succ = P == 2 ? b : (b == floor(b) ? floor(b / 2) : b / 2);
    XM_RETURN_IF_ERROR(xm_fab_phase_add(p, me, succ, to_succ));
    XM_RETURN_IF_ERROR(xm_fab_phase_add(p, me, pred, b - to_succ));
  }
  raise_steps(p, xm_fab_ring_steps(kind, P));
  return XM_OK;
}

xm_status_t xm_fab_all_to_all(xm_fab_phase_t *p, xm_fab_group_t g, const double *matrix) {
  if (!group_valid(g) || !matrix) return XM_ERR_INVALID_INPUT;
  int64_t P = g.size;
  for (int64_t k = 0; k < P * P; k++)
    if (!(matrix[k] >= 0) || !isfinite(matrix[k])) return XM_ERR_INVALID_INPUT;
  bool moved = false;
  for (int64_t i = 0; i < P; i++)
    for (int64_t j = 0; j < P; j++) {
      double b = matrix[i * P + j];
      if (i == j || b == 0) continue;
      XM_RETURN_IF_ERROR(
          xm_fab_phase_add(p, xm_fab_group_member(g, i), xm_fab_group_member(g, j), b));
      moved = true;
    }
  if (moved) raise_steps(p, (double)(P - 1));
  return XM_OK;
}

xm_status_t xm_fab_all_to_all_uniform(xm_fab_phase_t *p, xm_fab_group_t g, double bytes) {
  if (!group_valid(g) || !(bytes >= 0) || !isfinite(bytes)) return XM_ERR_INVALID_INPUT;
  if (g.size < 2 || bytes == 0) return XM_OK;
  for (int64_t i = 0; i < g.size; i++)
    for (int64_t j = 0; j < g.size; j++)
      if (i != j)
        XM_RETURN_IF_ERROR(
            xm_fab_phase_add(p, xm_fab_group_member(g, i), xm_fab_group_member(g, j), bytes));
  raise_steps(p, (double)(g.size - 1));
  return XM_OK;
}

/* ---- the groups of a layout ----------------------------------------------------- */

xm_status_t xm_fab_layout_groups(const xm_layout_t *l, xm_group_kind_t kind,
                                 xm_fab_group_t **out_groups, int64_t *out_num) {
  *out_groups = NULL;
  *out_num = 0;
  if (!l || l->dp < 1 || l->tp < 1 || l->ep < 1 || kind < 0 || kind >= XM_GROUP_COUNT ||
      l->dp > XM_LAYOUT_WORLD_MAX || l->tp > XM_LAYOUT_WORLD_MAX / l->dp)
    return XM_ERR_INVALID_INPUT;
  int64_t world = xm_layout_world(l);
  if (world % l->ep != 0 || l->ranks_per_node < 0 || world % xm_layout_node_size(l) != 0)
    return XM_ERR_INVALID_INPUT;
  /* Member 0 of every group is the rank whose index is 0: one pass over
   * the world finds them in order. A group count is at most the world. */
  int64_t n = 0;
  for (int64_t r = 0; r < world; r++)
    if (xm_layout_group(l, kind, r).index == 0) n++;
  xm_fab_group_t *gs = malloc((size_t)(n > 0 ? n : 1) * sizeof *gs);
  if (!gs) return XM_ERR_NO_MEMORY;
  int64_t k = 0;
  for (int64_t r = 0; r < world; r++) {
    xm_group_t g = xm_layout_group(l, kind, r);
    if (g.index == 0)
      gs[k++] =
          (xm_fab_group_t){.first = g.first, .stride = g.size > 1 ? g.stride : 1, .size = g.size};
  }
  *out_groups = gs;
  *out_num = n;
  return XM_OK;
}

xm_status_t xm_fab_ring_layout(xm_fab_phase_t *p, const xm_layout_t *l, xm_group_kind_t kind,
                               xm_fab_coll_t coll, double bytes) {
  xm_fab_group_t *gs;
  int64_t n;
  XM_RETURN_IF_ERROR(xm_fab_layout_groups(l, kind, &gs, &n));
  xm_status_t st = XM_OK;
  for (int64_t k = 0; k < n && st == XM_OK; k++)
    st = xm_fab_ring(p, coll, gs[k], bytes);
  free(gs);
  return st;
}

xm_status_t xm_fab_all_to_all_uniform_layout(xm_fab_phase_t *p, const xm_layout_t *l,
                                             xm_group_kind_t kind, double bytes) {
  xm_fab_group_t *gs;
  int64_t n;
  XM_RETURN_IF_ERROR(xm_fab_layout_groups(l, kind, &gs, &n));
  xm_status_t st = XM_OK;
  for (int64_t k = 0; k < n && st == XM_OK; k++)
    st = xm_fab_all_to_all_uniform(p, gs[k], bytes);
  free(gs);
  return st;
}

/* ---- servers -------------------------------------------------------------------- */

xm_status_t xm_fab_server_demand(const xm_fab_phase_t *p, int64_t servers, int64_t ranks_per_server,
                                 double *demand) {
  if (servers < 1 || ranks_per_server < 1 || !demand || servers > INT64_MAX / ranks_per_server)
    return XM_ERR_INVALID_INPUT;
  int64_t world = servers * ranks_per_server;
  for (int64_t k = 0; k < p->num_flows; k++) {
    const xm_fab_flow_t *f = &p->flows[k];
    if (f->src < 0 || f->dst < 0 || f->src >= world || f->dst >= world) return XM_ERR_INVALID_INPUT;
    int64_t s = f->src / ranks_per_server, d = f->dst / ranks_per_server;
    if (s != d) demand[s * servers + d] += f->bytes;
  }
  return XM_OK;
}

xm_status_t xm_fab_server_demand_create(const xm_fab_phase_t *phases, int64_t num_phases,
                                        int64_t servers, int64_t ranks_per_server,
                                        double **out_demand) {
  *out_demand = NULL;
  if (servers < 1 || num_phases < 0) return XM_ERR_INVALID_INPUT;
  if ((uint64_t)servers > SIZE_MAX / sizeof(double) / (uint64_t)servers) return XM_ERR_NO_MEMORY;
  double *m = calloc((size_t)servers * (size_t)servers, sizeof *m);
  if (!m) return XM_ERR_NO_MEMORY;
  for (int64_t i = 0; i < num_phases; i++) {
    xm_status_t st = xm_fab_server_demand(&phases[i], servers, ranks_per_server, m);
    if (st != XM_OK) {
      free(m);
      return st;
    }
  }
  *out_demand = m;
  return XM_OK;
}
