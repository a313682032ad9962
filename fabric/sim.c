/* fabric/sim.c — the flow-level engine (fabric/sim.h, docs/fabric.md).
 *
 * Two halves. The parent checks the phases and turns each into transfers
 * between platform hosts (fabric/platform.h): flows inside a node summed
 * per rank pair, flows between nodes summed per server pair (regional-ocs:
 * split between the pair's circuits and the electrical network by
 * capacity), each marked when a reconfiguring region delays it. Phases
 * whose transfers and circuit bandwidths are equal are simulated once.
 * It writes the platform file and forks.
 *
 * The child loads libsimgrid with dlopen (never linked: its SMPI would
 * shadow the real MPI of the program, CMakeLists.txt), starts one driver
 * actor that runs the distinct phases one after the other and, for each,
 * spawns workers of at most XFERS_PER_ACTOR transfers: senders on the
 * source host (put_async to the destination host's mailbox) and receivers
 * on the destination host; a barrier ends the phase. Small workers matter:
 * SimGrid 3.32 keeps an actor's activities in a list it scans on each
 * completion, so one actor per host with all its flows is quadratic. The
 * child writes the phase times to a pipe; a child that dies, is killed by
 * its alarm or writes too little is an XM_ERR_INTERNAL with the last line
 * SimGrid printed.
 */
#include "fabric/sim.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <simgrid/actor.h>
#include <simgrid/barrier.h>
#include <simgrid/comm.h>
#include <simgrid/engine.h>
#include <simgrid/host.h>
#include <simgrid/link.h>
#include <simgrid/mailbox.h>

#include "fabric/platform.h"

enum {
  XFERS_PER_ACTOR = 16,
  CHILD_TIMEOUT_S = 1800,
  MAX_SERVERS = 4096,
  /* dense N x N server-pair sums */ /* the child's alarm: a simulation never hangs the caller */
};

/* ---- transfers ------------------------------------------------------------- */

typedef struct {
  int32_t src, dst; /* platform hosts */
  int32_t delayed;  /* starts after the region's reconfiguration */
  int32_t pad_;
  double bytes;
} xfer_t;

typedef struct {
  int32_t link; /* circuit link */
  int32_t pad_;
  double bw;
} link_bw_t;

/* A distinct phase: its transfers and circuit bandwidths. */
typedef struct {
  xfer_t *xfers;
  int64_t num_xfers;
  link_bw_t *bws;
  int64_t num_bws;
  uint64_t hash;
} uphase_t;

typedef struct {
  const xm_fab_topo_t *t;
  int64_t P, N;
  /* circuit links: server pairs a < b, sorted */
  int64_t *circ_a, *circ_b, num_circ;
  uphase_t *u;
  int64_t num_u;
  int64_t *phase_u; /* phase -> distinct phase, -1 when it moves nothing */
  /* scratch */
  double *inter;       /* N x N bytes between servers */
  int64_t *circ_count; /* N x N circuits of the current phase */
  bool *paused;        /* per region */
  xfer_t *xs;
  int64_t num_xs, cap_xs;
} plan_t;

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

static xm_status_t push_xfer(plan_t *pl, int64_t src, int64_t dst, double bytes, bool delayed) {
  if (pl->num_xs == pl->cap_xs) {
    int64_t cap = pl->cap_xs ? 2 * pl->cap_xs : 1024;
    xfer_t *x = realloc(pl->xs, (size_t)cap * sizeof *x);
    if (!x) return XM_ERR_NO_MEMORY;
    pl->xs = x;
    pl->cap_xs = cap;
  }
  pl->xs[pl->num_xs++] =
      (xfer_t){.src = (int32_t)src, .dst = (int32_t)dst, .delayed = delayed, .bytes = bytes};
  return XM_OK;
}

static int cmp_xfer(const void *a, const void *b) {
  const xfer_t *x = a, *y = b;
  if (x->src != y->src) return x->src < y->src ? -1 : 1;
  return x->dst < y->dst ? -1 : x->dst > y->dst;
}

static int cmp_pair(const void *a, const void *b) {
  const xm_fab_circuit_t *x = a, *y = b;
  if (x->a != y->a) return x->a < y->a ? -1 : 1;
  return x->b < y->b ? -1 : x->b > y->b;
}

/* The phase's circuits as sorted pairs a < b with summed counts (owned). */
static xm_status_t canon_circuits(const xm_fab_topo_t *t, const xm_fab_phase_t *ph, int64_t i,
                                  xm_fab_circuit_t **out, int64_t *out_n, xm_diag_t *diag) {
  *out = NULL;
  *out_n = 0;
  if (ph->num_circuits <= 0) return XM_OK;
  xm_fab_circuit_t *c = malloc((size_t)ph->num_circuits * sizeof *c);
  if (!c) return XM_ERR_NO_MEMORY;
  char place[48];
  snprintf(place, sizeof place, "phase %lld", (long long)i);
  for (int64_t k = 0; k < ph->num_circuits; k++) {
    xm_fab_circuit_t x = ph->circuits[k];
    if (x.a > x.b) {
      int64_t s = x.a;
      x.a = x.b;
      x.b = s;
    }
    if (x.a < 0 || x.b >= t->servers || x.a == x.b || x.count < 1 ||
        xm_fab_region_of(t, x.a) != xm_fab_region_of(t, x.b)) {
      xm_diag_add(diag, XM_DIAG_ERROR, NULL, place,
                  "circuit %lld: %lld circuits between nodes %lld and %lld: need two distinct "
                  "nodes of one region of %lld and a count >= 1",
                  (long long)k, (long long)x.count, (long long)x.a, (long long)x.b,
                  (long long)t->region_servers);
      free(c);
      return XM_ERR_INVALID_INPUT;
    }
    c[k] = x;
  }
  if (ph->num_circuits > 0) qsort(c, (size_t)ph->num_circuits, sizeof *c, cmp_pair);
  int64_t n = 0;
  for (int64_t k = 0; k < ph->num_circuits; k++)
    if (n > 0 && c[n - 1].a == c[k].a && c[n - 1].b == c[k].b)
      c[n - 1].count += c[k].count;
    else
      c[n++] = c[k];
  *out = c;
  *out_n = n;
  return XM_OK;
}

static bool region_same(const xm_fab_topo_t *t, int64_t region, const xm_fab_circuit_t *a,
                        int64_t na, const xm_fab_circuit_t *b, int64_t nb) {
  int64_t i = 0, j = 0;
  for (;;) {
    while (i < na && xm_fab_region_of(t, a[i].a) != region)
      i++;
    while (j < nb && xm_fab_region_of(t, b[j].a) != region)
      j++;
    if (i == na || j == nb) return i == na && j == nb;
    if (a[i].a != b[j].a || a[i].b != b[j].b || a[i].count != b[j].count) return false;
    i++, j++;
  }
}

static int64_t circ_link(const plan_t *pl, int64_t a, int64_t b) {
  int64_t lo = 0, hi = pl->num_circ - 1;
  while (lo <= hi) {
    int64_t mid = (lo + hi) / 2;
    if (pl->circ_a[mid] == a && pl->circ_b[mid] == b) return mid;
    if (pl->circ_a[mid] < a || (pl->circ_a[mid] == a && pl->circ_b[mid] < b))
      lo = mid + 1;
    else
      hi = mid - 1;
  }
  return -1;
}

/* All circuit pairs over every phase, sorted and distinct. */
static xm_status_t collect_circuits(plan_t *pl, const xm_fab_phase_t *phases, int64_t n,
                                    xm_diag_t *diag) {
  int64_t total = 0;
  for (int64_t i = 0; i < n; i++)
    total += phases[i].num_circuits > 0 ? phases[i].num_circuits : 0;
  if (total == 0) return XM_OK;
  xm_fab_circuit_t *all = malloc((size_t)total * sizeof *all);
  if (!all) return XM_ERR_NO_MEMORY;
  int64_t m = 0;
  int64_t *per_server = calloc((size_t)pl->N, sizeof *per_server);
  if (!per_server) {
    free(all);
    return XM_ERR_NO_MEMORY;
  }
  xm_status_t st = XM_OK;
  for (int64_t i = 0; i < n && st == XM_OK; i++) {
    xm_fab_circuit_t *c;
    int64_t nc;
    st = canon_circuits(pl->t, &phases[i], i, &c, &nc, diag);
    if (st != XM_OK) break;
    for (int64_t k = 0; k < nc; k++) {
      per_server[c[k].a] += c[k].count;
      per_server[c[k].b] += c[k].count;
      all[m++] = c[k];
    }
    for (int64_t k = 0; k < nc && st == XM_OK; k++) {
      int64_t s = per_server[c[k].a] > pl->t->ocs_ports ? c[k].a : c[k].b;
      if (per_server[s] > pl->t->ocs_ports) {
        char place[48];
        snprintf(place, sizeof place, "phase %lld", (long long)i);
        xm_diag_add(diag, XM_DIAG_ERROR, NULL, place,
                    "node %lld holds %lld circuits, more than its %lld OCS ports", (long long)s,
                    (long long)per_server[s], (long long)pl->t->ocs_ports);
        st = XM_ERR_INVALID_INPUT;
      }
    }
    for (int64_t k = 0; k < nc; k++)
      per_server[c[k].a] = per_server[c[k].b] = 0;
    free(c);
  }
  free(per_server);
  if (st == XM_OK) {
    if (m > 0) qsort(all, (size_t)m, sizeof *all, cmp_pair);
    int64_t d = 0;
    for (int64_t k = 0; k < m; k++)
      if (d == 0 || all[d - 1].a != all[k].a || all[d - 1].b != all[k].b) all[d++] = all[k];
    pl->circ_a = malloc((size_t)d * sizeof *pl->circ_a);
    pl->circ_b = malloc((size_t)d * sizeof *pl->circ_b);
    if (!pl->circ_a || !pl->circ_b) st = XM_ERR_NO_MEMORY;
    for (int64_t k = 0; k < d && st == XM_OK; k++) {
      pl->circ_a[k] = all[k].a;
      pl->circ_b[k] = all[k].b;
    }
    pl->num_circ = d;
  }
  free(all);
  return st;
}

/* Transfers of phase i into pl->xs; the circuit bandwidths into *bws. */
static xm_status_t build_phase(plan_t *pl, const xm_fab_phase_t *ph, int64_t i,
                               const xm_fab_circuit_t *prev, int64_t nprev,
                               const xm_fab_circuit_t *cur, int64_t ncur, link_bw_t **bws,
                               int64_t *nbws, bool *out_inter, xm_diag_t *diag) {
  const xm_fab_topo_t *t = pl->t;
  int64_t P = pl->P, N = pl->N, R = t->ranks_per_server;
  bool inter = false;
  pl->num_xs = 0;
  *bws = NULL;
  *nbws = 0;
  for (int64_t k = 0; k < ph->num_flows; k++) {
    xm_fab_flow_t f = ph->flows[k];
    if (f.src < 0 || f.src >= P || f.dst < 0 || f.dst >= P || !(f.bytes >= 0) ||
        !isfinite(f.bytes)) {
      char place[48];
      snprintf(place, sizeof place, "phase %lld", (long long)i);
      xm_diag_add(diag, XM_DIAG_ERROR, NULL, place,
                  "flow %lld: %g bytes from rank %lld to rank %lld: ranks must be in [0, %lld)",
                  (long long)k, f.bytes, (long long)f.src, (long long)f.dst, (long long)P);
      return XM_ERR_INVALID_INPUT;
    }
    if (f.src == f.dst || f.bytes == 0) continue;
    int64_t a = f.src / R, b = f.dst / R;
    if (a == b) {
      XM_RETURN_IF_ERROR(push_xfer(pl, f.src, f.dst, f.bytes, false));
    } else {
      pl->inter[a * N + b] += f.bytes;
      inter = true;
    }
  }
  *out_inter = inter;
  /* inside the nodes: summed per rank pair */
  if (pl->num_xs > 0) qsort(pl->xs, (size_t)pl->num_xs, sizeof *pl->xs, cmp_xfer);
  int64_t m = 0;
  for (int64_t k = 0; k < pl->num_xs; k++)
    if (m > 0 && pl->xs[m - 1].src == pl->xs[k].src && pl->xs[m - 1].dst == pl->xs[k].dst)
      pl->xs[m - 1].bytes += pl->xs[k].bytes;
    else
      pl->xs[m++] = pl->xs[k];
  pl->num_xs = m;
  bool ocs = t->kind == XM_FAB_REGIONAL_OCS;
  int64_t regions = ocs ? (N + t->region_servers - 1) / t->region_servers : 0;
  for (int64_t g = 0; g < regions; g++)
    pl->paused[g] = ph->reconfigure && !region_same(t, g, prev, nprev, cur, ncur);
  if (ncur > 0) {
    *bws = malloc((size_t)ncur * sizeof **bws);
    if (!*bws) return XM_ERR_NO_MEMORY;
    for (int64_t k = 0; k < ncur; k++) {
      pl->circ_count[cur[k].a * N + cur[k].b] = cur[k].count;
      (*bws)[k] = (link_bw_t){.link = (int32_t)circ_link(pl, cur[k].a, cur[k].b),
                              .bw = (double)cur[k].count * t->link_bw};
    }
    *nbws = ncur;
  }
  double elec = xm_fab_server_elec_bw(t);
  for (int64_t a = 0; a < N; a++)
    for (int64_t b = 0; b < N; b++) {
      double *v = &pl->inter[a * N + b];
      if (!(*v > 0)) continue;
      bool delayed = ocs && xm_fab_region_of(t, a) == xm_fab_region_of(t, b) &&
                     pl->paused[xm_fab_region_of(t, a)];
      int64_t c = ocs ? pl->circ_count[(a < b ? a : b) * N + (a < b ? b : a)] : 0;
      double e_bytes = *v;
      if (c > 0) {
        double cap = (double)c * t->link_bw, o_bytes = *v * cap / (cap + elec);
        e_bytes = *v - o_bytes;
        XM_RETURN_IF_ERROR(push_xfer(pl, P + N + a, P + N + b, o_bytes, delayed));
      }
      XM_RETURN_IF_ERROR(push_xfer(pl, P + a, P + b, e_bytes, delayed));
      *v = 0;
    }
  for (int64_t k = 0; k < ncur; k++)
    pl->circ_count[cur[k].a * N + cur[k].b] = 0;
  return XM_OK;
}

/* Index of an equal distinct phase, or -1. */
static int64_t find_same(const plan_t *pl, uint64_t h, const link_bw_t *bws, int64_t nbws) {
  for (int64_t u = 0; u < pl->num_u; u++) {
    const uphase_t *x = &pl->u[u];
    if (x->hash == h && x->num_xfers == pl->num_xs && x->num_bws == nbws &&
        memcmp(x->xfers, pl->xs, (size_t)pl->num_xs * sizeof *pl->xs) == 0 &&
        (nbws == 0 || memcmp(x->bws, bws, (size_t)nbws * sizeof *bws) == 0))
      return u;
  }
  return -1;
}

static xm_status_t plan_build(plan_t *pl, const xm_fab_phase_t *phases, int64_t n, bool *inter_of,
                              xm_diag_t *diag) {
  const xm_fab_topo_t *t = pl->t;
  int64_t N = pl->N;
  bool ocs = t->kind == XM_FAB_REGIONAL_OCS;
  if (ocs) XM_RETURN_IF_ERROR(collect_circuits(pl, phases, n, diag));
  pl->inter = calloc((size_t)(N * N), sizeof *pl->inter);
  pl->circ_count = ocs ? calloc((size_t)(N * N), sizeof *pl->circ_count) : NULL;
  pl->paused = calloc((size_t)N, sizeof *pl->paused);
  pl->u = calloc((size_t)n, sizeof *pl->u);
  pl->phase_u = calloc((size_t)n, sizeof *pl->phase_u);
  if (!pl->inter || (ocs && !pl->circ_count) || !pl->paused || !pl->u || !pl->phase_u)
    return XM_ERR_NO_MEMORY;
  xm_fab_circuit_t *prev = NULL;
  int64_t nprev = 0;
  xm_status_t st = XM_OK;
  for (int64_t i = 0; i < n && st == XM_OK; i++) {
    xm_fab_circuit_t *cur = NULL;
    int64_t ncur = 0;
    if (ocs) st = canon_circuits(t, &phases[i], i, &cur, &ncur, diag);
    link_bw_t *bws = NULL;
    int64_t nbws = 0;
    if (st == XM_OK)
      st = build_phase(pl, &phases[i], i, prev, nprev, cur, ncur, &bws, &nbws, &inter_of[i], diag);
    free(prev);
    prev = cur;
    nprev = ncur;
    if (st != XM_OK) {
      free(bws);
      break;
    }
    if (pl->num_xs == 0) {
      pl->phase_u[i] = -1;
      free(bws);
      continue;
    }
    uint64_t h = fnv(fnv(14695981039346656037ull, pl->xs, (size_t)pl->num_xs * sizeof *pl->xs), bws,
                     (size_t)nbws * sizeof *bws);
    int64_t same = find_same(pl, h, bws, nbws);
    if (same >= 0) {
      pl->phase_u[i] = same;
      free(bws);
      continue;
    }
    uphase_t *u = &pl->u[pl->num_u];
    u->xfers = malloc((size_t)pl->num_xs * sizeof *u->xfers);
    if (!u->xfers) {
      free(bws);
      st = XM_ERR_NO_MEMORY;
      break;
    }
    memcpy(u->xfers, pl->xs, (size_t)pl->num_xs * sizeof *u->xfers);
    u->num_xfers = pl->num_xs;
    u->bws = bws;
    u->num_bws = nbws;
    u->hash = h;
    pl->phase_u[i] = pl->num_u++;
  }
  free(prev);
  return st;
}

static void plan_free(plan_t *pl) {
  for (int64_t u = 0; u < pl->num_u; u++) {
    free(pl->u[u].xfers);
    free(pl->u[u].bws);
  }
  free(pl->u);
  free(pl->phase_u);
  free(pl->inter);
  free(pl->circ_count);
  free(pl->paused);
  free(pl->xs);
  free(pl->circ_a);
  free(pl->circ_b);
}

/* ---- the child: SimGrid through dlsym -------------------------------------- */

/* The SimGrid C API calls the child makes, looked up by name. */
#define XM_SG_FUNCS(X)                                                                             \
  X(void, simgrid_init, (int *, char **))                                                          \
  X(void, simgrid_load_platform, (const char *))                                                   \
  X(void, simgrid_run, (void))                                                                     \
  X(double, simgrid_get_clock, (void))                                                             \
  X(sg_actor_t, sg_actor_init, (const char *, sg_host_t))                                          \
  X(void, sg_actor_set_data, (sg_actor_t, void *))                                                 \
  X(void, sg_actor_start_, (sg_actor_t, xbt_main_func_t, int, const char *const *))                \
  X(void *, sg_actor_self_get_data, (void))                                                        \
  X(void, sg_actor_sleep_for, (double))                                                            \
  X(sg_host_t, sg_host_by_name, (const char *))                                                    \
  X(sg_mailbox_t, sg_mailbox_by_name, (const char *))                                              \
  X(sg_comm_t, sg_mailbox_put_async, (sg_mailbox_t, void *, long))                                 \
  X(sg_comm_t, sg_mailbox_get_async, (sg_mailbox_t, void **))                                      \
  X(void, sg_comm_wait_all, (sg_comm_t *, size_t))                                                 \
  X(sg_bar_t, sg_barrier_init, (unsigned int))                                                     \
  X(int, sg_barrier_wait, (sg_bar_t))                                                              \
  X(void, sg_barrier_destroy, (sg_bar_t))                                                          \
  X(sg_link_t, sg_link_by_name, (const char *))                                                    \
  X(void, sg_link_set_bandwidth, (sg_link_t, double))

typedef struct {
#define XM_SG_FIELD(ret, name, args) ret(*name) args;
  XM_SG_FUNCS(XM_SG_FIELD)
#undef XM_SG_FIELD
} sg_api_t;

typedef struct {
  const sg_api_t *sg;
  const plan_t *pl;
  const xm_fab_topo_t *t;
  sg_host_t *hosts;      /* platform host -> SimGrid host (NULL: unused) */
  sg_mailbox_t *mailbox; /* platform host -> its mailbox */
  sg_link_t *circ_up, *circ_down;
  double *times; /* per distinct phase */
  const char *error;
} engine_t;

typedef struct {
  engine_t *e;
  const xfer_t *xfers;
  const int64_t *idx; /* receivers: transfers by destination */
  int64_t n;
  bool sender, delayed;
  sg_bar_t bar;
} worker_t;

/* Actors get their worker or engine as a pointer printed into argv[1]
 * (SimGrid copies argv), so the child keeps no global state. */
static void *arg_pointer(int argc, char **argv) {
  void *p = NULL;
  if (argc < 2 || sscanf(argv[1], "%p", &p) != 1) return NULL;
  return p;
}

static void host_name(char *buf, size_t cap, const plan_t *pl, int64_t h) {
  if (h < pl->P)
    snprintf(buf, cap, "r%lld", (long long)h);
  else if (h < pl->P + pl->N)
    snprintf(buf, cap, "s%lld", (long long)(h - pl->P));
  else
    snprintf(buf, cap, "o%lld", (long long)(h - pl->P - pl->N));
}

static sg_host_t host_of(engine_t *e, int64_t h) {
  if (!e->hosts[h]) {
    char name[40];
    host_name(name, sizeof name, e->pl, h);
    e->hosts[h] = e->sg->sg_host_by_name(name);
    snprintf(name, sizeof name, "m%lld", (long long)h);
    e->mailbox[h] = e->sg->sg_mailbox_by_name(name);
  }
  return e->hosts[h];
}

static void worker_main(int argc, char **argv) {
  worker_t *w = arg_pointer(argc, argv);
  const sg_api_t *sg = w->e->sg;
  sg_comm_t comms[XFERS_PER_ACTOR];
  void *got = NULL;
  if (w->sender && w->delayed) sg->sg_actor_sleep_for(w->e->t->reconfig_s);
  for (int64_t i = 0; i < w->n; i++) {
    const xfer_t *x = &w->xfers[w->idx[i]];
    if (w->sender) {
      long size = (long)llround(x->bytes);
      comms[i] = sg->sg_mailbox_put_async(w->e->mailbox[x->dst], w, size > 0 ? size : 1);
    } else {
      comms[i] = sg->sg_mailbox_get_async(w->e->mailbox[x->dst], &got);
    }
  }
  sg->sg_comm_wait_all(comms, (size_t)w->n);
  sg->sg_barrier_wait(w->bar);
}

/* idx[] = transfers ordered by key(x) in [0, nkeys), stable. */
static void order_by(const xfer_t *x, int64_t n, int64_t nkeys, bool by_src, int64_t *count,
                     int64_t *idx) {
  memset(count, 0, (size_t)(nkeys + 1) * sizeof *count);
  for (int64_t i = 0; i < n; i++)
    count[(by_src ? 2 * (int64_t)x[i].src + x[i].delayed : x[i].dst) + 1]++;
  for (int64_t k = 0; k < nkeys; k++)
    count[k + 1] += count[k];
  for (int64_t i = 0; i < n; i++)
    idx[count[by_src ? 2 * (int64_t)x[i].src + x[i].delayed : x[i].dst]++] = i;
}

/* Workers of one side: runs of equal key cut into pieces of at most
 * XFERS_PER_ACTOR. Returns the number written to w (NULL: count only). */
static int64_t make_workers(engine_t *e, const xfer_t *x, const int64_t *idx, int64_t n,
                            bool sender, worker_t *w) {
  int64_t nw = 0;
  for (int64_t i = 0; i < n;) {
    const xfer_t *a = &x[idx[i]];
    int64_t j = i;
    while (j < n && j - i < XFERS_PER_ACTOR &&
           (sender ? x[idx[j]].src == a->src && x[idx[j]].delayed == a->delayed
                   : x[idx[j]].dst == a->dst))
      j++;
    if (w)
      w[nw] = (worker_t){.e = e,
                         .xfers = x,
                         .idx = idx + i,
                         .n = j - i,
                         .sender = sender,
                         .delayed = sender && a->delayed};
    nw++;
    i = j;
  }
  return nw;
}

/* Runs transfers x[0..n) from an idle network to their end; the simulated
 * seconds, or -1 when memory ran out. */
static double run_round(engine_t *e, const xfer_t *x, int64_t n, int64_t *count) {
  const sg_api_t *sg = e->sg;
  int64_t H = e->pl->P + 2 * e->pl->N;
  int64_t *by_src = malloc((size_t)n * sizeof *by_src);
  int64_t *by_dst = malloc((size_t)n * sizeof *by_dst);
  worker_t *w = NULL;
  int64_t ns = 0, nr = 0;
  if (by_src && by_dst) {
    order_by(x, n, 2 * H, true, count, by_src);
    order_by(x, n, H, false, count, by_dst);
    ns = make_workers(e, x, by_src, n, true, NULL);
    nr = make_workers(e, x, by_dst, n, false, NULL);
    w = malloc((size_t)(ns + nr) * sizeof *w);
  }
  if (!w) {
    free(by_src);
    free(by_dst);
    return -1;
  }
  make_workers(e, x, by_src, n, true, w);
  make_workers(e, x, by_dst, n, false, w + ns);
  for (int64_t i = 0; i < n; i++) {
    host_of(e, x[i].src);
    host_of(e, x[i].dst);
  }
  sg_bar_t bar = sg->sg_barrier_init((unsigned)(ns + nr + 1));
  double t0 = sg->simgrid_get_clock();
  for (int64_t k = 0; k < ns + nr; k++) {
    const xfer_t *first = &x[w[k].idx[0]];
    char arg[32];
    snprintf(arg, sizeof arg, "%p", (void *)&w[k]);
    const char *av[] = {"w", arg};
    w[k].bar = bar;
    sg_actor_t a = sg->sg_actor_init("w", e->hosts[w[k].sender ? first->src : first->dst]);
    sg->sg_actor_start_(a, worker_main, 2, av);
  }
  sg->sg_barrier_wait(bar);
  double dt = sg->simgrid_get_clock() - t0;
  sg->sg_barrier_destroy(bar);
  free(w);
  free(by_src);
  free(by_dst);
  return dt;
}

/* The distinct phases one after the other. A phase's flows inside nodes
 * (first in its transfers) and between nodes use disjoint links, so they
 * run as two rounds and the phase takes the longer: the same time, and
 * SimGrid's full update then solves two smaller systems. */
static void driver_main(int argc, char **argv) {
  engine_t *e = arg_pointer(argc, argv);
  const sg_api_t *sg = e->sg;
  const plan_t *pl = e->pl;
  int64_t H = pl->P + 2 * pl->N;
  int64_t *count = malloc((size_t)(2 * H + 1) * sizeof *count);
  for (int64_t u = 0; u < pl->num_u && count; u++) {
    const uphase_t *ph = &pl->u[u];
    for (int64_t k = 0; k < ph->num_bws; k++) {
      sg->sg_link_set_bandwidth(e->circ_up[ph->bws[k].link], ph->bws[k].bw);
      sg->sg_link_set_bandwidth(e->circ_down[ph->bws[k].link], ph->bws[k].bw);
    }
    int64_t n_intra = 0;
    while (n_intra < ph->num_xfers && ph->xfers[n_intra].src < pl->P)
      n_intra++;
    double a = n_intra > 0 ? run_round(e, ph->xfers, n_intra, count) : 0;
    double b = ph->num_xfers > n_intra
                   ? run_round(e, ph->xfers + n_intra, ph->num_xfers - n_intra, count)
                   : 0;
    if (a < 0 || b < 0) {
      e->error = "out of memory";
      break;
    }
    e->times[u] = a > b ? a : b;
  }
  if (!count) e->error = "out of memory";
  free(count);
}

static int write_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n > 0) {
    ssize_t k = write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

/* The child's whole life; its exit status. */
static int child_run(const plan_t *pl, const char *xml, int fd) {
  const char *name = getenv("XMOEC_SIMGRID");
  void *lib = dlopen(name && *name ? name : "libsimgrid.so.3.32", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "cannot load SimGrid: %s\n", dlerror());
    return 3;
  }
  sg_api_t sg;
#define XM_SG_LOOKUP(ret, name, args)                                                              \
  *(void **)&sg.name = dlsym(lib, #name);                                                          \
  if (!sg.name) {                                                                                  \
    fprintf(stderr, "libsimgrid.so.3.32 has no %s\n", #name);                                      \
    return 3;                                                                                      \
  }
  XM_SG_FUNCS(XM_SG_LOOKUP)
#undef XM_SG_LOOKUP
  /* CM02: plain max-min; no cross-traffic; the Full update (it solves
   * every event afresh: faster than the lazy one on all-to-alls, where each
   * completion changes every rate, and exact where the lazy one drifts by
   * 1e-7). */
  char a0[] = "xmoec-fabric", a1[] = "--cfg=network/model:CM02",
       a2[] = "--cfg=network/crosstraffic:0", a3[] = "--cfg=network/optim:Full",
       a4[] = "--cfg=contexts/stack-size:128", a5[] = "--log=root.thresh:critical",
       a6[] = "--log=root.fmt:%m%n";
  /* XMOEC_SIMGRID_CFG: one more SimGrid option, for experiments */
  const char *extra = getenv("XMOEC_SIMGRID_CFG");
  char *argv[] = {a0, a1, a2, a3, a4, a5, a6, extra && *extra ? (char *)extra : NULL, NULL};
  int argc = extra && *extra ? 8 : 7;
  sg.simgrid_init(&argc, argv);
  sg.simgrid_load_platform(xml);
  int64_t H = pl->P + 2 * pl->N;
  engine_t e = {.sg = &sg, .pl = pl, .t = pl->t};
  e.hosts = calloc((size_t)H, sizeof *e.hosts);
  e.mailbox = calloc((size_t)H, sizeof *e.mailbox);
  e.times = calloc((size_t)(pl->num_u > 0 ? pl->num_u : 1), sizeof *e.times);
  e.circ_up = calloc((size_t)(pl->num_circ + 1), sizeof *e.circ_up);
  e.circ_down = calloc((size_t)(pl->num_circ + 1), sizeof *e.circ_down);
  if (!e.hosts || !e.mailbox || !e.times || !e.circ_up || !e.circ_down) {
    fprintf(stderr, "out of memory\n");
    return 4;
  }
  for (int64_t k = 0; k < pl->num_circ; k++) {
    char name[48];
    snprintf(name, sizeof name, "c%lld_UP", (long long)k);
    e.circ_up[k] = sg.sg_link_by_name(name);
    snprintf(name, sizeof name, "c%lld_DOWN", (long long)k);
    e.circ_down[k] = sg.sg_link_by_name(name);
  }
  char arg[32];
  snprintf(arg, sizeof arg, "%p", (void *)&e);
  const char *av[] = {"driver", arg};
  sg.sg_actor_start_(sg.sg_actor_init("driver", host_of(&e, 0)), driver_main, 2, av);
  sg.simgrid_run();
  if (e.error) {
    fprintf(stderr, "%s\n", e.error);
    return 4;
  }
  return write_all(fd, e.times, (size_t)pl->num_u * sizeof *e.times) == 0 ? 0 : 5;
}

/* ---- the parent ------------------------------------------------------------ */

/* The last non-empty line of the child's log, for the diagnostic. */
static void last_line(int fd, char *buf, size_t cap) {
  buf[0] = '\0';
  off_t end = lseek(fd, 0, SEEK_END);
  off_t from = end > (off_t)cap - 1 ? end - (off_t)cap + 1 : 0;
  if (end <= 0 || lseek(fd, from, SEEK_SET) < 0) return;
  ssize_t n = read(fd, buf, cap - 1);
  if (n <= 0) {
    buf[0] = '\0';
    return;
  }
  buf[n] = '\0';
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
    buf[--n] = '\0';
  char *nl = strrchr(buf, '\n');
  if (nl) memmove(buf, nl + 1, strlen(nl + 1) + 1);
}

static xm_status_t internal(xm_diag_t *diag, const char *fmt, const char *what) {
  xm_diag_add(diag, XM_DIAG_ERROR, NULL, "fabric", fmt, what);
  return XM_ERR_INTERNAL;
}

static xm_status_t run_child(const plan_t *pl, double *times, xm_diag_t *diag) {
  const char *dir = getenv("TMPDIR");
  if (!dir || !*dir) dir = "/tmp";
  char xml[4096], log[4096];
  if (snprintf(xml, sizeof xml, "%s/xmoec-fabric-XXXXXX.xml", dir) >= (int)sizeof xml ||
      snprintf(log, sizeof log, "%s/xmoec-fabric-XXXXXX.log", dir) >= (int)sizeof log)
    return internal(diag, "temporary directory name too long: %s", dir);
  int xfd = mkstemps(xml, 4);
  if (xfd < 0) return internal(diag, "cannot create the SimGrid platform file in %s", dir);
  int lfd = mkstemps(log, 4);
  if (lfd < 0) {
    close(xfd);
    unlink(xml);
    return internal(diag, "cannot create the SimGrid log file in %s", dir);
  }
  xm_status_t st = XM_OK;
  FILE *f = fdopen(xfd, "w");
  if (!f) {
    close(xfd);
    st = internal(diag, "cannot write %s", xml);
  } else {
    st = xm_fab_platform_write(f, pl->t, pl->circ_a, pl->circ_b, pl->num_circ);
    if (fclose(f) != 0 && st == XM_OK) st = XM_ERR_IO;
    if (st == XM_ERR_IO) st = internal(diag, "cannot write the SimGrid platform %s", xml);
  }
  int fds[2] = {-1, -1};
  if (st == XM_OK && pipe(fds) != 0) st = internal(diag, "pipe: %s", strerror(errno));
  pid_t pid = -1;
  if (st == XM_OK) {
    fflush(NULL);
    pid = fork();
    if (pid < 0) {
      st = internal(diag, "fork: %s", strerror(errno));
      close(fds[0]);
      close(fds[1]);
    }
  }
  if (pid == 0) {
    close(fds[0]);
    dup2(lfd, 2);
    signal(SIGALRM, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    alarm(CHILD_TIMEOUT_S);
    _exit(child_run(pl, xml, fds[1]));
  }
  if (pid > 0) {
    close(fds[1]);
    size_t want = (size_t)pl->num_u * sizeof *times, got = 0;
    char *p = (char *)times, sink[256];
    for (;;) {
      ssize_t k = got < want ? read(fds[0], p + got, want - got) : read(fds[0], sink, sizeof sink);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) break;
      if (got < want) got += (size_t)k;
    }
    close(fds[0]);
    int status = 0;
    pid_t w;
    while ((w = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
    }
    bool ok = got == want && (w < 0 || (WIFEXITED(status) && WEXITSTATUS(status) == 0));
    if (!ok) {
      char line[512], how[64];
      last_line(lfd, line, sizeof line);
      if (w >= 0 && WIFSIGNALED(status))
        snprintf(how, sizeof how, "was killed by signal %d%s", WTERMSIG(status),
                 WTERMSIG(status) == SIGALRM ? " (time limit)" : "");
      else
        snprintf(how, sizeof how, "exited with status %d", w >= 0 ? WEXITSTATUS(status) : -1);
      xm_diag_add(diag, XM_DIAG_ERROR, NULL, "fabric", "the SimGrid simulation %s: %s", how,
                  line[0] ? line : "(no message)");
      st = XM_ERR_INTERNAL;
    }
  }
  close(lfd);
  unlink(xml);
  unlink(log);
  return st;
}

xm_status_t xm_fab_simulate(const xm_fab_topo_t *t, const xm_fab_phase_t *phases, int64_t n,
                            double *out_seconds, xm_diag_t *diag) {
  if (n < 0 || (n > 0 && (!phases || !out_seconds)) || !t) {
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, "fabric", "no phases to simulate");
    return XM_ERR_INVALID_INPUT;
  }
  for (int64_t i = 0; i < n; i++)
    out_seconds[i] = 0;
  if (n == 0) return XM_OK;
  if (t->servers < 1 || t->ranks_per_server < 1 || !(t->intra_bw > 0) || !(t->link_bw > 0) ||
      t->nic_ports < 1) {
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, "fabric",
                "topology without servers, ranks or bandwidth (build it with "
                "xm_fab_topo_from_cluster)");
    return XM_ERR_INVALID_INPUT;
  }
  if (t->servers > MAX_SERVERS || t->servers * t->ranks_per_server > INT32_MAX / 4) {
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, "/nodes",
                "the flow engine simulates at most %d nodes, the cluster has %lld", MAX_SERVERS,
                (long long)t->servers);
    return XM_ERR_UNSUPPORTED;
  }
  plan_t pl = {.t = t, .P = t->servers * t->ranks_per_server, .N = t->servers};
  bool *inter = calloc((size_t)n, sizeof *inter);
  xm_status_t st = inter ? plan_build(&pl, phases, n, inter, diag) : XM_ERR_NO_MEMORY;
  double *times = NULL;
  if (st == XM_OK && pl.num_u > 0) {
    times = calloc((size_t)pl.num_u, sizeof *times);
    st = times ? run_child(&pl, times, diag) : XM_ERR_NO_MEMORY;
  }
  if (st == XM_OK)
    for (int64_t i = 0; i < n; i++) {
      if (pl.phase_u[i] < 0) continue;
      double lat = inter[i] ? t->link_lat : t->intra_lat;
      out_seconds[i] = times[pl.phase_u[i]] + phases[i].latency_steps * lat;
    }
  free(times);
  free(inter);
  plan_free(&pl);
  return st;
}
