/* planner/network.c — the hierarchical network of the cost model: which
 * bytes of a collective stay inside a node and which cross the network, and
 * how long the collective takes (docs/cost-model.md, "Network").
 *
 * Bytes follow the runtime's counters exactly (docs/traffic.md): a ring
 * collective is two rings in opposite directions by group index, member i
 * sends half of its bytes to its successor and the rest to its predecessor
 * (everything to the one peer in a group of 2), and a byte is inter-node when
 * the peer lives on another node (nodes are consecutive blocks of
 * ranks_per_node world ranks). Chunk sizes are the runtime's too: the
 * all-reduce cuts n elements into P chunks of floor(n/P) (+1 for the first
 * n mod P), ZeRO-1 into chunks of ceil(n/P) (the last ones short or empty),
 * so predicted and logged bytes can be compared for equality.
 *
 * A group is an arithmetic progression of world ranks, so the ring edges
 * that cross nodes follow from the node boundaries the group passes
 * instead of from its members: one crossing edge per boundary when the
 * stride is below the node size, every edge otherwise. When every member
 * sends the same bytes the inter-node share is (crossing edges) x (bytes
 * per member), O(1); otherwise the boundaries are walked, O(nodes the group
 * touches), whatever the group size. That keeps the planner's full search
 * fast on 1024 ranks.
 *
 * Time is per member: bytes over the links they use (intra-node bytes at
 * intra_bw, inter-node bytes at inter_bw, one after the other) plus one
 * latency per ring step (the inter-node latency when the ring crosses a
 * node) or per all-to-all peer. The slowest member sets the time.
 */
#include "planner/network.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

void xm_net_from_cluster(const xm_cluster_spec_t *c, xm_net_t *out) {
  out->nodes = c->nodes > 0 ? c->nodes : 1;
  out->ranks_per_node = c->ranks_per_node > 0 ? c->ranks_per_node : 1;
  out->intra_bw = c->intra_bw_gbps * 1e9;
  out->inter_bw = c->inter_bw_gbps * 1e9;
  out->intra_lat = c->intra_latency_us * 1e-6;
  out->inter_lat = c->inter_latency_us * 1e-6;
}

/* ---- the group on the nodes ------------------------------------------------ */

/* Node size; 0 or less reads as "one node holds every rank". */
static int64_t node_size(const xm_net_t *n) {
  return n->ranks_per_node > 0 ? n->ranks_per_node : INT64_MAX / 4;
}

static int64_t node_of(const xm_net_t *n, int64_t rank) { return rank / node_size(n); }

static bool group_valid(xm_net_group_t g) {
  return g.size >= 1 && g.first >= 0 && (g.size == 1 || g.stride >= 1);
}

static int64_t last_member(xm_net_group_t g) { return g.first + (g.size - 1) * g.stride; }

int64_t xm_net_group_members_per_node(const xm_net_t *n, xm_net_group_t g) {
  if (!group_valid(g)) return 0;
  int64_t R = node_size(n);
  if (g.size == 1 || g.stride >= R) return 1;
  int64_t node_end = (node_of(n, g.first) + 1) * R; /* first rank of the next node */
  int64_t in = (node_end - 1 - g.first) / g.stride + 1;
  return in < g.size ? in : g.size;
}

int64_t xm_net_group_nodes(const xm_net_t *n, xm_net_group_t g) {
  if (!group_valid(g)) return 0;
  if (g.size == 1) return 1;
  if (g.stride >= node_size(n)) return g.size;
  return node_of(n, last_member(g)) - node_of(n, g.first) + 1;
}

/* ---- what each ring member sends -------------------------------------------- */

/* The buffer in elements of `elem` bytes: 4-byte elements (fp32, int32)
 * when the byte count allows, bytes otherwise. */
typedef struct {
  xm_net_coll_t kind;
  int64_t P;
  int64_t n;          /* elements (all-reduce, ZeRO kinds) */
  int64_t elem;       /* bytes per element */
  int64_t per;        /* all-gather / reduce-scatter: bytes per member */
  int64_t q, rem, zc; /* n / P, n mod P, ceil(n / P) */
} ring_t;

/* Elements of member j's all-reduce chunk (0 <= j <= P): floor(n/P), +1
 * for j < n mod P. */
static int64_t ar_chunk(const ring_t *r, int64_t j) {
  if (j == r->P) j = 0;
  return r->q + (j < r->rem ? 1 : 0);
}

/* Elements of member j's ZeRO-1 chunk: [j c, min(n, (j+1) c)), c = ceil(n/P). */
static int64_t zero_chunk(const ring_t *r, int64_t j) {
  if (j == r->P) j = 0;
  int64_t lo = j * r->zc, hi = lo + r->zc < r->n ? lo + r->zc : r->n;
  return hi > lo ? hi - lo : 0;
}

/* Bytes member i (0 <= i < P) sends in the whole collective (docs/traffic.md). */
static int64_t member_bytes(const ring_t *r, int64_t i) {
  switch (r->kind) {
  case XM_NET_ALL_REDUCE: return r->elem * ((r->n - ar_chunk(r, i)) + (r->n - ar_chunk(r, i + 1)));
  case XM_NET_ALL_GATHER:
  case XM_NET_REDUCE_SCATTER: return (r->P - 1) * r->per;
  case XM_NET_ZERO_REDUCE_SCATTER: return r->elem * (r->n - zero_chunk(r, i));
  case XM_NET_ZERO_ALL_GATHER: return r->elem * (r->n - zero_chunk(r, i + 1));
  }
  return 0;
}

/* Every member sends the same: P divides n (or the kind has no chunks). */
static bool uniform_members(const ring_t *r) {
  return r->kind == XM_NET_ALL_GATHER || r->kind == XM_NET_REDUCE_SCATTER || r->rem == 0;
}

/* Steps of the ring: the all-reduce is a reduce-scatter and an all-gather. */
static int64_t ring_steps(xm_net_coll_t kind, int64_t P) {
  return kind == XM_NET_ALL_REDUCE ? 2 * (P - 1) : P - 1;
}

/* Bytes that edge (j, j+1 mod P) carries: j's half to its successor and
 * j+1's other half to its predecessor. */
static double edge_bytes(const ring_t *r, int64_t j) {
  int64_t bj = member_bytes(r, j), bk = member_bytes(r, j + 1 == r->P ? 0 : j + 1);
  return (double)(bj / 2) + (double)(bk - bk / 2);
}

/* The ring edges of g that cross nodes: how many, and whether some member
 * has both neighbours on other nodes (then all its bytes cross). */
typedef struct {
  int64_t edges; /* crossing edges, the wrap edge included; P == 2: 0 or 1 */
  bool two_sided;
  bool all; /* every edge crosses */
} crossing_t;

static crossing_t crossings(const xm_net_t *n, xm_net_group_t g) {
  crossing_t c = {0, false, false};
  int64_t P = g.size, R = node_size(n);
  if (P < 2) return c;
  if (g.stride >= R) { /* every member on a node of its own */
    c.edges = P == 2 ? 1 : P;
    c.two_sided = c.all = true;
    return c;
  }
  int64_t n0 = node_of(n, g.first), n1 = node_of(n, last_member(g));
  if (n0 == n1) return c;
  if (P == 2) { /* one peer, different node: both members send it everything */
    c.edges = 1;
    c.two_sided = c.all = true;
    return c;
  }
  /* stride < R: one crossing edge per node boundary, plus the wrap edge. */
  c.edges = n1 - n0 + 1;
  int64_t first_on_last = (n1 * R - g.first - 1) / g.stride + 1; /* group index */
  int64_t m0 = xm_net_group_members_per_node(n, g), m_last = P - first_on_last;
  /* A node in the middle holds one member only when stride > R/2
   * (conservatively taken as happening). */
  c.two_sided = m0 == 1 || m_last == 1 || (n1 - n0 >= 2 && 2 * g.stride > R);
  c.all = c.edges == P;
  return c;
}

/* Exact bytes on the crossing edges of a group with stride < R whose
 * members send different amounts: walks the node boundaries. */
static double crossing_bytes(const xm_net_t *n, xm_net_group_t g, const ring_t *r) {
  int64_t R = node_size(n), n0 = node_of(n, g.first), n1 = node_of(n, last_member(g));
  double inter = 0;
  for (int64_t node = n0; node < n1; node++) {
    int64_t j = ((node + 1) * R - g.first - 1) / g.stride; /* last member before the boundary */
    inter += edge_bytes(r, j);
  }
  return inter + edge_bytes(r, g.size - 1); /* the wrap edge (P-1, 0) */
}

/* The ring of `kind` over P members for a buffer of `bytes`; false when
 * the size is not an integer that exact arithmetic can take. */
static bool ring_init(xm_net_coll_t kind, int64_t P, double bytes, ring_t *r) {
  *r = (ring_t){.kind = kind, .P = P, .elem = 1};
  if (!(bytes == floor(bytes) && bytes >= 0 && bytes < 0x1p52 && P < (1 << 20))) return false;
  int64_t b = (int64_t)bytes;
  r->elem = b % 4 == 0 ? 4 : 1;
  r->n = b / r->elem;
  r->per = b;
  r->q = r->n / r->P;
  r->rem = r->n % r->P;
  r->zc = (r->n + r->P - 1) / r->P;
  return true;
}

void xm_net_ring_member(const xm_net_t *n, xm_net_coll_t kind, xm_net_group_t g, double bytes,
                        int64_t i, double *out_intra, double *out_inter) {
  *out_intra = *out_inter = 0;
  ring_t r;
  if (!group_valid(g) || g.size < 2 || i < 0 || i >= g.size || !ring_init(kind, g.size, bytes, &r))
    return;
  double b = (double)member_bytes(&r, i);
  int64_t me = g.first + i * g.stride;
  int64_t succ = g.first + ((i + 1) % g.size) * g.stride;
  int64_t pred = g.first + ((i + g.size - 1) % g.size) * g.stride;
  double to_succ = g.size == 2 ? b : floor(b / 2), to_pred = b - to_succ;
  *(node_of(n, succ) == node_of(n, me) ? out_intra : out_inter) += to_succ;
  *(node_of(n, pred) == node_of(n, me) ? out_intra : out_inter) += to_pred;
}

xm_net_cost_t xm_net_ring(const xm_net_t *n, xm_net_coll_t kind, xm_net_group_t g, double bytes) {
  xm_net_cost_t out = {0, 0, 0};
  if (!group_valid(g) || g.size < 2 || !(bytes > 0) || !isfinite(bytes)) return out;
  double P = (double)g.size;
  double total;
  if (kind == XM_NET_ALL_REDUCE)
    total = 2.0 * (P - 1) * bytes;
  else if (kind == XM_NET_ALL_GATHER || kind == XM_NET_REDUCE_SCATTER)
    total = P * (P - 1) * bytes;
  else
    total = (P - 1) * bytes;

  crossing_t cx = crossings(n, g);
  double inter = 0;
  if (cx.all) {
    inter = total;
  } else if (cx.edges > 0) {
    /* Exact integer arithmetic for integral sizes that cannot overflow;
     * otherwise (or when every member sends the same) each crossing edge
     * carries one member's bytes. */
    ring_t r;
    bool exact = ring_init(kind, g.size, bytes, &r);
    if (exact && !uniform_members(&r))
      inter = crossing_bytes(n, g, &r);
    else if (exact)
      inter = (double)cx.edges * (double)member_bytes(&r, 0);
    else
      inter = (double)cx.edges * total / P;
  }
  if (inter > total) inter = total;
  out.inter_bytes = inter;
  out.intra_bytes = total - inter;

  /* Time: the busiest member's bytes, half to each neighbour; the share
   * that leaves the node goes at inter_bw. */
  double per_member = total / P;
  double off = cx.edges == 0 ? 0.0 : (cx.two_sided ? 1.0 : 0.5);
  double lat = cx.edges > 0 ? n->inter_lat : n->intra_lat;
  out.seconds = per_member * (1.0 - off) / n->intra_bw + per_member * off / n->inter_bw +
                (double)ring_steps(kind, g.size) * lat;
  return out;
}

xm_net_cost_t xm_net_all_to_all(const xm_net_t *n, xm_net_group_t g, double intra, double inter) {
  xm_net_cost_t out = {0, 0, 0};
  if (!group_valid(g) || g.size < 2) return out;
  if (!(intra > 0)) intra = 0;
  if (!(inter > 0)) inter = 0;
  int64_t m = xm_net_group_members_per_node(n, g); /* incl. the member itself */
  out.intra_bytes = (double)g.size * intra;
  out.inter_bytes = (double)g.size * inter;
  out.seconds = intra / n->intra_bw + inter / n->inter_bw + (double)(m - 1) * n->intra_lat +
                (double)(g.size - m) * n->inter_lat;
  return out;
}

double xm_net_group_same_node_pairs(const xm_net_t *n, xm_net_group_t g) {
  if (!group_valid(g) || g.size < 2 || g.stride >= node_size(n)) return 0;
  int64_t R = node_size(n), n0 = node_of(n, g.first), n1 = node_of(n, last_member(g));
  double pairs = 0;
  int64_t start = 0; /* group index of the first member on `node` */
  for (int64_t node = n0; node <= n1; node++) {
    int64_t end = node == n1 ? g.size : ((node + 1) * R - g.first - 1) / g.stride + 1;
    double c = (double)(end - start);
    pairs += c * (c - 1);
    start = end;
  }
  return pairs;
}

/* ---- families on pooled NICs (the fabric's fat-tree closed form) ------------ */

static xm_net_group_t family_member_group(const xm_net_family_t *f, int64_t i, int64_t j) {
  return (xm_net_group_t){
      .first = i * f->inner_step + j * f->outer_step, .stride = f->stride, .size = f->size};
}

/* Per byte of the buffer: the busiest rank's bytes to or from peers of its
 * node, the busiest node's to or from other nodes, every member sending
 * the mean bytes of the kind, in two exact halves (one to each
 * neighbour; all to the one peer of a group of 2). */
typedef struct {
  double intra, inter; /* per byte of the buffer */
  bool crosses;
} ring_loads_t;

static ring_loads_t ring_loads(const xm_net_t *n, xm_net_coll_t kind, const xm_net_family_t *f) {
  ring_loads_t L = {0, 0, false};
  int64_t P = f->size, nodes = n->nodes > 0 ? n->nodes : 1;
  double b = kind == XM_NET_ALL_REDUCE ? 2.0 * (double)(P - 1) / (double)P
             : kind == XM_NET_ALL_GATHER || kind == XM_NET_REDUCE_SCATTER
                 ? (double)(P - 1)
                 : (double)(P - 1) / (double)P;
  double half = P == 2 ? b : b / 2, other = P == 2 ? 0 : b / 2;
  double *out = calloc((size_t)(2 * nodes), sizeof *out);
  if (!out) {
    L.intra = L.inter = INFINITY;
    return L;
  }
  double *in = out + nodes;
  for (int64_t j = 0; j < f->outer_n; j++)
    for (int64_t i = 0; i < f->inner_n; i++) {
      xm_net_group_t g = family_member_group(f, i, j);
      for (int64_t m = 0; m < P; m++) {
        int64_t me = g.first + m * g.stride;
        int64_t x = node_of(n, me);
        int64_t xs = node_of(n, g.first + ((m + 1) % P) * g.stride);
        int64_t xp = node_of(n, g.first + ((m + P - 1) % P) * g.stride);
        if (x >= nodes || xs >= nodes || xp >= nodes) continue;
        /* m sends `half` to its successor and `other` to its predecessor,
         * and receives as much from each side. */
        double intra = 0;
        if (xs == x)
          intra += half;
        else
          out[x] += half, in[x] += half, L.crosses = true;
        if (P > 2) {
          if (xp == x)
            intra += other;
          else
            out[x] += other, in[x] += other, L.crosses = true;
        }
        if (intra > L.intra) L.intra = intra;
      }
    }
  for (int64_t x = 0; x < nodes; x++) {
    if (out[x] > L.inter) L.inter = out[x];
    if (in[x] > L.inter) L.inter = in[x];
  }
  free(out);
  return L;
}

/* The loads depend on the family's shape and the nodes, not on the bytes:
 * kept per shape (the planner costs thousands of points of few shapes). */
typedef struct {
  bool valid;
  xm_net_coll_t kind;
  xm_net_family_t f;
  int64_t R, nodes;
  ring_loads_t loads;
} ring_shape_t;

#define RING_SHAPES 64
static _Thread_local ring_shape_t g_shapes[RING_SHAPES];
static _Thread_local int g_next_shape;

static bool same_shape(const ring_shape_t *e, xm_net_coll_t kind, const xm_net_family_t *f,
                       int64_t R, int64_t nodes) {
  return e->valid && e->kind == kind && e->R == R && e->nodes == nodes &&
         e->f.stride == f->stride && e->f.size == f->size && e->f.inner_step == f->inner_step &&
         e->f.inner_n == f->inner_n && e->f.outer_step == f->outer_step &&
         e->f.outer_n == f->outer_n;
}

double xm_net_ring_family_seconds(const xm_net_t *n, xm_net_coll_t kind, const xm_net_family_t *f,
                                  double bytes) {
  if (f->size < 2 || !(bytes > 0) || !isfinite(bytes)) return 0;
  int64_t R = node_size(n), nodes = n->nodes > 0 ? n->nodes : 1;
  ring_loads_t L;
  int k = 0;
  while (k < RING_SHAPES && !same_shape(&g_shapes[k], kind, f, R, nodes))
    k++;
  if (k < RING_SHAPES) {
    L = g_shapes[k].loads;
  } else {
    L = ring_loads(n, kind, f);
    g_shapes[g_next_shape] =
        (ring_shape_t){.valid = true, .kind = kind, .f = *f, .R = R, .nodes = nodes, .loads = L};
    g_next_shape = (g_next_shape + 1) % RING_SHAPES;
  }
  double intra_s = L.intra * bytes / n->intra_bw;
  double inter_s = L.inter * bytes / ((double)R * n->inter_bw);
  double lat = L.crosses ? n->inter_lat : n->intra_lat;
  return (intra_s > inter_s ? intra_s : inter_s) + (double)ring_steps(kind, f->size) * lat;
}

double xm_net_a2a_family_seconds(const xm_net_t *n, const xm_net_family_t *f, double intra,
                                 double inter) {
  if (f->size < 2) return 0;
  if (!(intra > 0)) intra = 0;
  if (!(inter > 0)) inter = 0;
  /* Every rank is in one group and sends `inter` off its node: a node
   * sends R x inter over R x inter_bw, and receives as much. */
  bool crosses = false;
  for (int64_t j = 0; j < f->outer_n && !crosses; j++)
    for (int64_t i = 0; i < f->inner_n && !crosses; i++)
      crosses = xm_net_group_nodes(n, family_member_group(f, i, j)) > 1;
  double intra_s = intra / n->intra_bw, inter_s = inter / n->inter_bw;
  double lat = crosses ? n->inter_lat : n->intra_lat;
  return (intra_s > inter_s ? intra_s : inter_s) + (double)(f->size - 1) * lat;
}
