/* fabric/ocs.c — the regional circuit controller (fabric/ocs.h).
 *
 * Per region, the pairs with demand go into a max-heap keyed by their
 * demand per circuit w / (c + 1). Popping the top pair gives it one more
 * circuit when both its servers have a free OCS port (and pushes it back
 * with its next key), and retires it otherwise: a server whose ports are
 * all taken never frees one, so a retired pair can never be served later.
 * Each pop adds a circuit or retires a pair, so a region of R servers and
 * p pairs with demand takes O((p + R * ocs_ports) log p) after the O(R^2)
 * scan of its block of the demand matrix.
 *
 * The plan of a sequence keeps one assignment per demand it was asked for
 * (the whole iteration, or each layer value) and copies it into every
 * phase it serves, so each phase owns its circuits, as fabric/flow.h
 * wants; sets are compared as sorted arrays.
 */
#include "fabric/ocs.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fabric/collective.h"

static bool topo_valid(const xm_fab_topo_t *t) {
  return t && t->kind == XM_FAB_REGIONAL_OCS && t->servers >= 1 && t->region_servers >= 1 &&
         t->ocs_ports >= 0 && t->ocs_ports <= t->nic_ports && t->ranks_per_server >= 1;
}

/* ---- the greedy of one region -------------------------------------------------- */

typedef struct {
  double key, w; /* w / (c + 1), the pair's demand */
  int64_t a, b, c;
} pair_t;

/* x comes out of the heap before y. */
static bool before(const pair_t *x, const pair_t *y) {
  if (x->key != y->key) return x->key > y->key;
  if (x->a != y->a) return x->a < y->a;
  return x->b < y->b;
}

static void heap_push(pair_t *h, int64_t *n, pair_t e) {
  int64_t i = (*n)++;
  while (i > 0 && before(&e, &h[(i - 1) / 2])) {
    h[i] = h[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  h[i] = e;
}

static pair_t heap_pop(pair_t *h, int64_t *n) {
  pair_t top = h[0], e = h[--*n];
  int64_t i = 0;
  for (;;) {
    int64_t l = 2 * i + 1, best = i;
    const pair_t *bp = &e;
    if (l < *n && before(&h[l], bp)) best = l, bp = &h[l];
    if (l + 1 < *n && before(&h[l + 1], bp)) best = l + 1;
    if (best == i) break;
    h[i] = h[best];
    i = best;
  }
  if (*n > 0) h[i] = e;
  return top;
}

typedef struct {
  xm_fab_circuit_t *v;
  int64_t n, cap;
} circuits_t;

static xm_status_t circuits_add(circuits_t *cs, int64_t a, int64_t b, int64_t count) {
  if (cs->n == cs->cap) {
    int64_t cap = cs->cap ? 2 * cs->cap : 16;
    xm_fab_circuit_t *v = realloc(cs->v, (size_t)cap * sizeof *v);
    if (!v) return XM_ERR_NO_MEMORY;
    cs->v = v;
    cs->cap = cap;
  }
  cs->v[cs->n++] = (xm_fab_circuit_t){.a = a, .b = b, .count = count};
  return XM_OK;
}

/* Servers [lo, hi) of one region; `free_ports` is scratch of hi - lo. */
static xm_status_t assign_region(const xm_fab_topo_t *t, const double *d, int64_t lo, int64_t hi,
                                 int64_t *free_ports, circuits_t *out) {
  int64_t N = t->servers, R = hi - lo;
  int64_t pairs = 0;
  for (int64_t a = lo; a < hi; a++)
    for (int64_t b = a + 1; b < hi; b++)
      if (d[a * N + b] + d[b * N + a] > 0) pairs++;
  if (pairs == 0 || t->ocs_ports == 0) return XM_OK;
  pair_t *h = malloc((size_t)pairs * sizeof *h);
  if (!h) return XM_ERR_NO_MEMORY;
  int64_t n = 0;
  for (int64_t a = lo; a < hi; a++)
    for (int64_t b = a + 1; b < hi; b++) {
      double w = d[a * N + b] + d[b * N + a];
      if (w > 0) heap_push(h, &n, (pair_t){.key = w, .w = w, .a = a, .b = b, .c = 0});
    }
  for (int64_t s = 0; s < R; s++)
    free_ports[s] = t->ocs_ports;
  xm_status_t st = XM_OK;
  while (n > 0 && st == XM_OK) {
    pair_t e = heap_pop(h, &n);
    if (free_ports[e.a - lo] > 0 && free_ports[e.b - lo] > 0) {
      free_ports[e.a - lo]--;
      free_ports[e.b - lo]--;
      e.c++;
      e.key = e.w / (double)(e.c + 1);
      heap_push(h, &n, e);
    } else if (e.c > 0) {
      st = circuits_add(out, e.a, e.b, e.c);
    }
  }
  free(h);
  return st;
}

static int circuit_cmp(const void *x, const void *y) {
  const xm_fab_circuit_t *p = x, *q = y;
  if (p->a != q->a) return p->a < q->a ? -1 : 1;
  if (p->b != q->b) return p->b < q->b ? -1 : 1;
  return 0;
}

xm_status_t xm_fab_ocs_assign(const xm_fab_topo_t *t, const double *demand,
                              xm_fab_circuit_t **out_circuits, int64_t *out_num) {
  *out_circuits = NULL;
  *out_num = 0;
  if (!topo_valid(t) || !demand) return XM_ERR_INVALID_INPUT;
  int64_t N = t->servers;
  if ((uint64_t)N > SIZE_MAX / sizeof(double) / (uint64_t)N) return XM_ERR_INVALID_INPUT;
  for (int64_t k = 0; k < N * N; k++)
    if (!(demand[k] >= 0) || !isfinite(demand[k])) return XM_ERR_INVALID_INPUT;
  int64_t R = t->region_servers < N ? t->region_servers : N;
  int64_t *free_ports = malloc((size_t)R * sizeof *free_ports);
  if (!free_ports) return XM_ERR_NO_MEMORY;
  circuits_t cs = {0};
  xm_status_t st = XM_OK;
  for (int64_t lo = 0; lo < N && st == XM_OK; lo += R)
    st = assign_region(t, demand, lo, lo + R < N ? lo + R : N, free_ports, &cs);
  free(free_ports);
  if (st != XM_OK) {
    free(cs.v);
    return st;
  }
  if (cs.n > 1) qsort(cs.v, (size_t)cs.n, sizeof *cs.v, circuit_cmp);
  *out_circuits = cs.v;
  *out_num = cs.n;
  return XM_OK;
}

/* ---- comparing sets ------------------------------------------------------------ */

static bool same_circuit(const xm_fab_circuit_t *x, const xm_fab_circuit_t *y) {
  return x->a == y->a && x->b == y->b && x->count == y->count;
}

static bool same_set(const xm_fab_circuit_t *x, int64_t nx, const xm_fab_circuit_t *y, int64_t ny) {
  if (nx != ny) return false;
  for (int64_t k = 0; k < nx; k++)
    if (!same_circuit(&x[k], &y[k])) return false;
  return true;
}

bool xm_fab_ocs_region_changed(const xm_fab_topo_t *t, const xm_fab_circuit_t *x, int64_t nx,
                               const xm_fab_circuit_t *y, int64_t ny, int64_t region) {
  int64_t i = 0, j = 0;
  for (;;) {
    while (i < nx && xm_fab_ocs_region(t, x[i].a) != region)
      i++;
    while (j < ny && xm_fab_ocs_region(t, y[j].a) != region)
      j++;
    if (i == nx || j == ny) return (i == nx) != (j == ny);
    if (!same_circuit(&x[i], &y[j])) return true;
    i++;
    j++;
  }
}

/* ---- the plan of a sequence -------------------------------------------------- */

/* Gives phase p a copy of n circuits. */
static xm_status_t set_circuits(xm_fab_phase_t *p, const xm_fab_circuit_t *c, int64_t n) {
  free(p->circuits);
  p->circuits = NULL;
  p->num_circuits = 0;
  if (n == 0) return XM_OK;
  p->circuits = malloc((size_t)n * sizeof *c);
  if (!p->circuits) return XM_ERR_NO_MEMORY;
  memcpy(p->circuits, c, (size_t)n * sizeof *c);
  p->num_circuits = n;
  return XM_OK;
}

/* The assignment for the phases whose layer is `layer` (all of them when
 * `all`), copied into each of them; `demand` is zeroed scratch. */
static xm_status_t plan_group(const xm_fab_topo_t *t, xm_fab_phase_t *phases, int64_t num, bool all,
                              int64_t layer, double *demand) {
  size_t cells = (size_t)t->servers * (size_t)t->servers;
  memset(demand, 0, cells * sizeof *demand);
  for (int64_t i = 0; i < num; i++)
    if (all || phases[i].layer == layer)
      XM_RETURN_IF_ERROR(xm_fab_server_demand(&phases[i], t->servers, t->ranks_per_server, demand));
  xm_fab_circuit_t *c;
  int64_t n;
  XM_RETURN_IF_ERROR(xm_fab_ocs_assign(t, demand, &c, &n));
  xm_status_t st = XM_OK;
  for (int64_t i = 0; i < num && st == XM_OK; i++)
    if (all || phases[i].layer == layer) st = set_circuits(&phases[i], c, n);
  free(c);
  return st;
}

static int layer_cmp(const void *x, const void *y) {
  int64_t p = *(const int64_t *)x, q = *(const int64_t *)y;
  return p < q ? -1 : p > q;
}

xm_status_t xm_fab_ocs_plan(const xm_fab_topo_t *t, xm_fab_phase_t *phases, int64_t num_phases,
                            const xm_fab_circuit_t *before_set, int64_t num_before) {
  if (!t || num_phases < 0 || (num_phases > 0 && !phases) || num_before < 0 ||
      (num_before > 0 && !before_set))
    return XM_ERR_INVALID_INPUT;
  if (t->kind != XM_FAB_REGIONAL_OCS) {
    for (int64_t i = 0; i < num_phases; i++) {
      XM_RETURN_IF_ERROR(set_circuits(&phases[i], NULL, 0));
      phases[i].reconfigure = false;
    }
    return XM_OK;
  }
  if (!topo_valid(t)) return XM_ERR_INVALID_INPUT;
  if (num_phases == 0) return XM_OK;
  if ((uint64_t)t->servers > SIZE_MAX / sizeof(double) / (uint64_t)t->servers)
    return XM_ERR_NO_MEMORY;
  double *demand = malloc((size_t)t->servers * (size_t)t->servers * sizeof *demand);
  int64_t *layers = malloc((size_t)num_phases * sizeof *layers);
  xm_status_t st = demand && layers ? XM_OK : XM_ERR_NO_MEMORY;
  if (st == XM_OK && !t->reconfig_per_layer) {
    st = plan_group(t, phases, num_phases, true, 0, demand);
  } else if (st == XM_OK) {
    for (int64_t i = 0; i < num_phases; i++)
      layers[i] = phases[i].layer;
    if (num_phases > 0) qsort(layers, (size_t)num_phases, sizeof *layers, layer_cmp);
    for (int64_t i = 0; i < num_phases && st == XM_OK; i++)
      if (i == 0 || layers[i] != layers[i - 1])
        st = plan_group(t, phases, num_phases, false, layers[i], demand);
  }
  free(demand);
  free(layers);
  if (st != XM_OK) return st;
  const xm_fab_circuit_t *prev = before_set;
  int64_t num_prev = num_before;
  for (int64_t i = 0; i < num_phases; i++) {
    phases[i].reconfigure = !same_set(prev, num_prev, phases[i].circuits, phases[i].num_circuits);
    prev = phases[i].circuits;
    num_prev = phases[i].num_circuits;
  }
  return XM_OK;
}
