/* fabric/analytic.c — the closed forms of fabric/analytic.h.
 *
 * One pass over a phase's flows adds each flow's bytes to the resources it
 * crosses (its ranks' node links, or its servers' NICs and the topology's
 * links), a second pass reads the latest finish among the resources it
 * touched, and a third puts those back to zero, so a phase costs O(flows)
 * whatever the size of the cluster; the scratch arrays (per rank, server,
 * leaf, group pair, circuit end and region) are allocated once for a
 * whole sequence.
 *
 * The capacities are the ones the engine builds its platform with
 * (fabric/platform.h: a server's electrical NIC capacity, a leaf's
 * uplinks, the global links between two dragonfly groups), and circuits
 * are read the way the engine reads them (a pair in either order, counts
 * of a repeated pair summed), so that the two agree exactly where the
 * closed form is exact (tests/unit/test_fabric_analytic.c).
 */
#include "fabric/analytic.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "fabric/platform.h"

/* ---- scratch ------------------------------------------------------------------- */

/* A resource's load: all its bytes, and those that wait for a pause. */
typedef struct {
  double all, paused;
} load_t;

typedef struct {
  const xm_fab_topo_t *t;
  int64_t world, servers, slots; /* slots: OCS ports per server */
  int64_t per_leaf, per_group, groups, regions;
  double nic_bw, leaf_bw, pair_bw;
  double *rank_out, *rank_in; /* intra-node bytes per rank */
  load_t *srv_out, *srv_in;   /* inter-node bytes through each server's NIC */
  double *leaf_out, *leaf_in; /* bytes through each leaf's uplinks */
  double *pair;               /* groups x groups: bytes from group x to group y */
  double *local;              /* routers x routers_per_group: bytes on a local link, one way */
  /* circuits: server s's k-th circuit peer, its count and the bytes s
   * sends on it (slots per server) */
  int64_t *peer, *count, *used;
  double *circ_out;
  bool *paused; /* per region */
  /* the canonical circuits of the previous and of the current phase */
  xm_fab_circuit_t *prev, *cur;
  int64_t num_prev, num_cur, cap_prev, cap_cur;
} scratch_t;

static void scratch_free(scratch_t *s) {
  free(s->rank_out);
  free(s->rank_in);
  free(s->srv_out);
  free(s->srv_in);
  free(s->leaf_out);
  free(s->leaf_in);
  free(s->pair);
  free(s->local);
  free(s->peer);
  free(s->count);
  free(s->used);
  free(s->circ_out);
  free(s->paused);
  free(s->prev);
  free(s->cur);
  memset(s, 0, sizeof *s);
}

static bool topo_valid(const xm_fab_topo_t *t) {
  if (!t || t->servers < 1 || t->ranks_per_server < 1 || !(t->intra_bw > 0) || !(t->link_bw > 0) ||
      t->nic_ports < 1 || t->servers > ((int64_t)1 << 40) / t->ranks_per_server)
    return false;
  switch (t->kind) {
  case XM_FAB_FAT_TREE: return true;
  case XM_FAB_FAT_TREE_OVERSUB: return t->switch_radix >= 2 && t->oversubscription >= 1;
  case XM_FAB_DRAGONFLY:
    return t->df_servers_per_router >= 1 && t->df_routers_per_group >= 1 && t->df_groups >= 1 &&
           t->df_groups <= ((int64_t)1 << 16) && t->df_global_links >= 0 &&
           t->df_servers_per_router * t->df_routers_per_group * t->df_groups >= t->servers;
  case XM_FAB_REGIONAL_OCS:
    return t->region_servers >= 1 && t->ocs_ports >= 0 && t->ocs_ports <= t->nic_ports &&
           !(t->reconfig_s < 0);
  default: return false;
  }
}

static void *zalloc(int64_t n, size_t size) {
  if (n < 1) n = 1;
  if ((uint64_t)n > SIZE_MAX / size) return NULL;
  return calloc((size_t)n, size);
}

static xm_status_t scratch_init(const xm_fab_topo_t *t, scratch_t *s) {
  memset(s, 0, sizeof *s);
  if (!topo_valid(t)) return XM_ERR_INVALID_INPUT;
  s->t = t;
  s->servers = t->servers;
  s->world = t->servers * t->ranks_per_server;
  s->nic_bw = xm_fab_server_elec_bw(t);
  s->rank_out = zalloc(s->world, sizeof(double));
  s->rank_in = zalloc(s->world, sizeof(double));
  s->srv_out = zalloc(s->servers, sizeof(load_t));
  s->srv_in = zalloc(s->servers, sizeof(load_t));
  bool ok = s->rank_out && s->rank_in && s->srv_out && s->srv_in;
  if (t->kind == XM_FAB_FAT_TREE_OVERSUB) {
    s->per_leaf = xm_fab_leaf_servers(t);
    int64_t leaves = (s->servers + s->per_leaf - 1) / s->per_leaf;
    s->leaf_bw = xm_fab_leaf_uplink_bw(t);
    s->leaf_out = zalloc(leaves, sizeof(double));
    s->leaf_in = zalloc(leaves, sizeof(double));
    ok = ok && s->leaf_out && s->leaf_in;
  } else if (t->kind == XM_FAB_DRAGONFLY) {
    s->per_group = t->df_servers_per_router * t->df_routers_per_group;
    s->groups = t->df_groups;
    s->pair_bw = (double)xm_fab_df_pair_links(t) * t->link_bw;
    s->pair = zalloc(s->groups * s->groups, sizeof(double));
    int64_t routers = (s->servers + t->df_servers_per_router - 1) / t->df_servers_per_router;
    s->local = routers <= INT64_MAX / t->df_routers_per_group
                   ? zalloc(routers * t->df_routers_per_group, sizeof(double))
                   : NULL;
    ok = ok && s->pair && s->local;
  } else if (t->kind == XM_FAB_REGIONAL_OCS) {
    s->regions = (s->servers + t->region_servers - 1) / t->region_servers;
    s->paused = zalloc(s->regions, sizeof(bool));
    s->slots = t->ocs_ports;
    ok = ok && s->paused && (s->slots == 0 || s->servers <= INT64_MAX / s->slots);
    if (ok && s->slots > 0) {
      int64_t n = s->servers * s->slots;
      s->peer = zalloc(n, sizeof(int64_t));
      s->count = zalloc(n, sizeof(int64_t));
      s->circ_out = zalloc(n, sizeof(double));
      s->used = zalloc(s->servers, sizeof(int64_t));
      ok = s->peer && s->count && s->circ_out && s->used;
    }
  }
  if (!ok) {
    scratch_free(s);
    return XM_ERR_NO_MEMORY;
  }
  return XM_OK;
}

/* ---- circuits ------------------------------------------------------------------ */

static int circuit_cmp(const void *x, const void *y) {
  const xm_fab_circuit_t *p = x, *q = y;
  if (p->a != q->a) return p->a < q->a ? -1 : 1;
  if (p->b != q->b) return p->b < q->b ? -1 : 1;
  return 0;
}

/* p's circuits as the engine reads them into s->cur: pairs a < b, sorted,
 * a repeated pair's counts summed; checked against regions and ports. */
static xm_status_t circuits_canon(scratch_t *s, const xm_fab_phase_t *p) {
  const xm_fab_topo_t *t = s->t;
  s->num_cur = 0;
  if (p->num_circuits <= 0) return XM_OK;
  if (p->num_circuits > s->cap_cur) {
    xm_fab_circuit_t *c = realloc(s->cur, (size_t)p->num_circuits * sizeof *c);
    if (!c) return XM_ERR_NO_MEMORY;
    s->cur = c;
    s->cap_cur = p->num_circuits;
  }
  for (int64_t k = 0; k < p->num_circuits; k++) {
    xm_fab_circuit_t c = p->circuits[k];
    if (c.a > c.b) {
      int64_t x = c.a;
      c.a = c.b;
      c.b = x;
    }
    if (c.a < 0 || c.b >= s->servers || c.a == c.b || c.count < 1 ||
        c.a / t->region_servers != c.b / t->region_servers || c.count > s->slots)
      return XM_ERR_INVALID_INPUT;
    s->cur[k] = c;
  }
  if (p->num_circuits > 0) qsort(s->cur, (size_t)p->num_circuits, sizeof *s->cur, circuit_cmp);
  int64_t n = 0;
  for (int64_t k = 0; k < p->num_circuits; k++)
    if (n > 0 && s->cur[n - 1].a == s->cur[k].a && s->cur[n - 1].b == s->cur[k].b)
      s->cur[n - 1].count += s->cur[k].count;
    else
      s->cur[n++] = s->cur[k];
  s->num_cur = n;
  return XM_OK;
}

/* Slot of server a's circuit to b, or -1. */
static int64_t circuit_slot(const scratch_t *s, int64_t a, int64_t b) {
  for (int64_t k = 0; k < s->used[a]; k++)
    if (s->peer[a * s->slots + k] == b) return a * s->slots + k;
  return -1;
}

static void circuits_clear(scratch_t *s) {
  for (int64_t i = 0; i < s->num_cur; i++) {
    int64_t ends[2] = {s->cur[i].a, s->cur[i].b};
    for (int e = 0; e < 2; e++) {
      for (int64_t k = 0; k < s->used[ends[e]]; k++)
        s->circ_out[ends[e] * s->slots + k] = 0;
      s->used[ends[e]] = 0;
    }
  }
}

/* Enters s->cur at both ends; XM_ERR_INVALID_INPUT when a server would
 * hold more circuits than its OCS ports. */
static xm_status_t circuits_load(scratch_t *s) {
  for (int64_t i = 0; i < s->num_cur; i++) {
    const xm_fab_circuit_t *c = &s->cur[i];
    for (int e = 0; e < 2; e++) {
      int64_t a = e ? c->b : c->a, b = e ? c->a : c->b, ports = c->count;
      for (int64_t k = 0; k < s->used[a]; k++)
        ports += s->count[a * s->slots + k];
      if (ports > s->slots) {
        circuits_clear(s);
        return XM_ERR_INVALID_INPUT;
      }
      int64_t slot = a * s->slots + s->used[a]++;
      s->peer[slot] = b;
      s->count[slot] = c->count;
      s->circ_out[slot] = 0;
    }
  }
  return XM_OK;
}

/* Marks the regions whose circuits differ between s->prev and s->cur
 * (both sorted by (a, b), so by region); returns how many. */
static int64_t mark_paused(scratch_t *s) {
  const xm_fab_topo_t *t = s->t;
  int64_t i = 0, j = 0, n = 0;
  while (i < s->num_prev || j < s->num_cur) {
    const xm_fab_circuit_t *x = i < s->num_prev ? &s->prev[i] : NULL;
    const xm_fab_circuit_t *y = j < s->num_cur ? &s->cur[j] : NULL;
    int cmp = !x ? 1 : !y ? -1 : circuit_cmp(x, y);
    int64_t region = (cmp <= 0 ? x->a : y->a) / t->region_servers;
    if (cmp != 0 || x->count != y->count) {
      if (!s->paused[region]) n++;
      s->paused[region] = true;
    }
    if (cmp <= 0) i++;
    if (cmp >= 0) j++;
  }
  return n;
}

static void unmark_paused(scratch_t *s) {
  for (int64_t k = 0; k < s->num_prev; k++)
    s->paused[s->prev[k].a / s->t->region_servers] = false;
  for (int64_t k = 0; k < s->num_cur; k++)
    s->paused[s->cur[k].a / s->t->region_servers] = false;
}

/* The current circuits become the previous phase's. */
static void circuits_shift(scratch_t *s) {
  xm_fab_circuit_t *x = s->prev;
  int64_t cap = s->cap_prev;
  s->prev = s->cur;
  s->cap_prev = s->cap_cur;
  s->num_prev = s->num_cur;
  s->cur = x;
  s->cap_cur = cap;
  s->num_cur = 0;
}

/* ---- one phase ----------------------------------------------------------------- */

static double ratio(double bytes, double bw) {
  if (!(bytes > 0)) return 0;
  return bw > 0 ? bytes / bw : INFINITY;
}

static void keep_max(double *m, double v) {
  if (v > *m) *m = v;
}

/* When a resource of capacity bw ends its load. */
static double finish(load_t l, double bw, double pause) {
  double f = ratio(l.all, bw);
  if (l.paused > 0) keep_max(&f, pause + ratio(l.paused, bw));
  return f;
}

static void add_load(load_t *l, double bytes, bool paused) {
  l->all += bytes;
  if (paused) l->paused += bytes;
}

/* dragonfly: the local link from sa's router to sb's when both are
 * routers of one group, or -1. */
static int64_t local_index(const scratch_t *s, int64_t sa, int64_t sb) {
  int64_t spr = s->t->df_servers_per_router, a = s->t->df_routers_per_group;
  int64_t ra = sa / spr, rb = sb / spr;
  if (ra == rb || ra / a != rb / a) return -1;
  return ra * a + rb % a;
}

/* Adds `bytes` from server sa to server sb (sa != sb) to the resources. */
static void add_inter(scratch_t *s, int64_t sa, int64_t sb, double bytes) {
  const xm_fab_topo_t *t = s->t;
  bool paused = false;
  if (t->kind == XM_FAB_REGIONAL_OCS) {
    int64_t ra = sa / t->region_servers;
    paused = ra == sb / t->region_servers && s->paused[ra];
    int64_t slot = s->slots > 0 ? circuit_slot(s, sa, sb) : -1;
    if (slot >= 0) {
      double circ = (double)s->count[slot] * t->link_bw;
      double on = bytes * circ / (circ + s->nic_bw);
      s->circ_out[slot] += on;
      bytes -= on;
    }
  }
  add_load(&s->srv_out[sa], bytes, paused);
  add_load(&s->srv_in[sb], bytes, paused);
  if (t->kind == XM_FAB_FAT_TREE_OVERSUB) {
    int64_t la = sa / s->per_leaf, lb = sb / s->per_leaf;
    if (la != lb) {
      s->leaf_out[la] += bytes;
      s->leaf_in[lb] += bytes;
    }
  } else if (t->kind == XM_FAB_DRAGONFLY) {
    int64_t ga = sa / s->per_group, gb = sb / s->per_group;
    if (ga != gb) s->pair[ga * s->groups + gb] += bytes;
    int64_t li = local_index(s, sa, sb);
    if (li >= 0) s->local[li] += bytes;
  }
}

/* The latest finish among the resources the flows touched, then those
 * resources back to zero. */
static void read_and_clear(scratch_t *s, const xm_fab_phase_t *p, xm_fab_phase_time_t *out) {
  const xm_fab_topo_t *t = s->t;
  int64_t rps = t->ranks_per_server;
  double pause = t->kind == XM_FAB_REGIONAL_OCS ? t->reconfig_s : 0;
  for (int64_t k = 0; k < p->num_flows; k++) {
    const xm_fab_flow_t *f = &p->flows[k];
    int64_t sa = f->src / rps, sb = f->dst / rps;
    if (f->src == f->dst) continue;
    if (sa == sb) {
      keep_max(&out->intra_s, ratio(s->rank_out[f->src], t->intra_bw));
      keep_max(&out->intra_s, ratio(s->rank_in[f->dst], t->intra_bw));
      continue;
    }
    keep_max(&out->inter_s, finish(s->srv_out[sa], s->nic_bw, pause));
    keep_max(&out->inter_s, finish(s->srv_in[sb], s->nic_bw, pause));
    if (t->kind == XM_FAB_FAT_TREE_OVERSUB) {
      keep_max(&out->inter_s, ratio(s->leaf_out[sa / s->per_leaf], s->leaf_bw));
      keep_max(&out->inter_s, ratio(s->leaf_in[sb / s->per_leaf], s->leaf_bw));
    } else if (t->kind == XM_FAB_DRAGONFLY) {
      int64_t li = local_index(s, sa, sb);
      if (li >= 0) keep_max(&out->inter_s, ratio(s->local[li], t->link_bw));
      if (sa / s->per_group != sb / s->per_group)
        keep_max(&out->inter_s,
                 ratio(s->pair[sa / s->per_group * s->groups + sb / s->per_group], s->pair_bw));
    }
  }
  /* A circuit lies in one region: all its bytes wait when the region
   * pauses. */
  for (int64_t i = 0; i < s->num_cur; i++) {
    const xm_fab_circuit_t *c = &s->cur[i];
    double wait = s->paused[c->a / t->region_servers] ? pause : 0;
    for (int e = 0; e < 2; e++) {
      int64_t slot = e ? circuit_slot(s, c->b, c->a) : circuit_slot(s, c->a, c->b);
      double bytes = s->circ_out[slot];
      if (bytes > 0) keep_max(&out->inter_s, wait + ratio(bytes, (double)c->count * t->link_bw));
    }
  }
  for (int64_t k = 0; k < p->num_flows; k++) {
    const xm_fab_flow_t *f = &p->flows[k];
    int64_t sa = f->src / rps, sb = f->dst / rps;
    s->rank_out[f->src] = s->rank_in[f->dst] = 0;
    s->srv_out[sa] = s->srv_in[sb] = (load_t){0, 0};
    if (t->kind == XM_FAB_FAT_TREE_OVERSUB)
      s->leaf_out[sa / s->per_leaf] = s->leaf_in[sb / s->per_leaf] = 0;
    else if (t->kind == XM_FAB_DRAGONFLY) {
      int64_t li = local_index(s, sa, sb);
      if (li >= 0) s->local[li] = 0;
      if (sa / s->per_group != sb / s->per_group)
        s->pair[sa / s->per_group * s->groups + sb / s->per_group] = 0;
    }
  }
  if (s->slots > 0) circuits_clear(s);
}

/* Phase p after the phase whose canonical circuits are in s->prev; leaves
 * p's in s->prev for the next one. */
static xm_status_t phase_time(scratch_t *s, const xm_fab_phase_t *p, xm_fab_phase_time_t *out) {
  const xm_fab_topo_t *t = s->t;
  memset(out, 0, sizeof *out);
  for (int64_t k = 0; k < p->num_flows; k++) {
    const xm_fab_flow_t *f = &p->flows[k];
    if (f->src < 0 || f->dst < 0 || f->src >= s->world || f->dst >= s->world || !(f->bytes >= 0) ||
        !isfinite(f->bytes))
      return XM_ERR_INVALID_INPUT;
  }
  bool ocs = t->kind == XM_FAB_REGIONAL_OCS;
  if (ocs) {
    XM_RETURN_IF_ERROR(circuits_canon(s, p));
    if (s->slots > 0) XM_RETURN_IF_ERROR(circuits_load(s));
    if (p->reconfigure) out->paused_regions = mark_paused(s);
  }
  if (out->paused_regions > 0) out->pause_s = t->reconfig_s;

  int64_t rps = t->ranks_per_server;
  for (int64_t k = 0; k < p->num_flows; k++) {
    const xm_fab_flow_t *f = &p->flows[k];
    int64_t sa = f->src / rps, sb = f->dst / rps;
    if (f->src == f->dst || f->bytes == 0) continue;
    if (sa == sb) {
      s->rank_out[f->src] += f->bytes;
      s->rank_in[f->dst] += f->bytes;
      out->intra_bytes += f->bytes;
    } else {
      add_inter(s, sa, sb, f->bytes);
      out->inter_bytes += f->bytes;
    }
  }
  read_and_clear(s, p, out);
  if (ocs) {
    unmark_paused(s);
    circuits_shift(s);
  }
  if (out->intra_bytes + out->inter_bytes > 0 && p->latency_steps > 0)
    out->latency_s = p->latency_steps * (out->inter_bytes > 0 ? t->link_lat : t->intra_lat);
  out->seconds = fmax(out->intra_s, out->inter_s) + out->latency_s;
  return XM_OK;
}

xm_status_t xm_fab_analytic_phase(const xm_fab_topo_t *t, const xm_fab_phase_t *p,
                                  const xm_fab_phase_t *prev, xm_fab_phase_time_t *out) {
  memset(out, 0, sizeof *out);
  scratch_t s;
  XM_RETURN_IF_ERROR(scratch_init(t, &s));
  xm_status_t st = XM_OK;
  if (prev && t->kind == XM_FAB_REGIONAL_OCS) {
    st = circuits_canon(&s, prev);
    circuits_shift(&s);
  }
  if (st == XM_OK) st = phase_time(&s, p, out);
  scratch_free(&s);
  return st;
}

xm_status_t xm_fab_analytic(const xm_fab_topo_t *t, const xm_fab_phase_t *phases,
                            int64_t num_phases, double *out_seconds, double *out_total) {
  *out_total = 0;
  if (num_phases < 0 || (num_phases > 0 && !phases)) return XM_ERR_INVALID_INPUT;
  scratch_t s;
  XM_RETURN_IF_ERROR(scratch_init(t, &s));
  xm_status_t st = XM_OK;
  double total = 0;
  for (int64_t i = 0; i < num_phases && st == XM_OK; i++) {
    xm_fab_phase_time_t pt;
    st = phase_time(&s, &phases[i], &pt);
    if (out_seconds) out_seconds[i] = pt.seconds;
    total += pt.seconds;
  }
  scratch_free(&s);
  if (st == XM_OK) *out_total = total;
  return st;
}
