/* runtime/moe/rbd_exec.c — redundancy-bypassing dispatch over MPI for the
 * generated program (docs/design.md, Redundancy-bypassing dispatch).
 *
 * The dispatch runs in the order that lets every rank learn every size
 * before any hidden row moves:
 *   1. plan the pilots (xm_rt_rbd_plan_send) and exchange their expert ids
 *      over the EP group (all_to_all_v_i32: its count exchange tells each
 *      rank how many pilot rows it gets from each member);
 *   2. plan the replicas over the received ids (xm_rt_rbd_plan_replicate)
 *      and exchange the replicas' ids inside the node;
 *   3. plan this rank's slots (xm_rt_rbd_plan_local): M is now known on
 *      every rank, the EP group agrees on the bound (one MAXLOC all-reduce)
 *      and fails together before a row is written;
 *   4. move the rows, each carrying the token's k routing weights behind its
 *      H values (one float row of H + k), pilots over the EP group then
 *      replicas inside the node, with the counts already known
 *      (all_to_all_v_known).
 * The id exchanges need a receive buffer before their counts are known. A
 * rank gets at most one row (pilot or replica) per (source rank, token):
 * a token sends one pilot per node and its pilot rank makes one replica per
 * other rank of the node, so ep * T rows of k ids bound both exchanges
 * together (T is the same on every rank: the program's static shape). That
 * scratch is k int32 per possible row, small next to the H floats of a row;
 * the float buffers are sized exactly.
 *
 * The combine and both gradients reuse the record's counts in mirror
 * (all_to_all_v_known, no count exchange): "forward" movement follows the
 * dispatch (source -> pilot -> replicas), "return" movement goes back with
 * the node pre-reduction (replicas added into their pilot row) and the
 * source-side sum into the token (xm_rt_rbd_scatter_add).
 *
 * The intra-node exchange runs over the NODE group when ep is a multiple of
 * ranks_per_node (every node then lies inside one EP group, and the NODE
 * group's members are exactly this node's EP ranks, in EP order); otherwise
 * over the EP group with zero rows to the ranks of other nodes, so that the
 * ranks of one node that belong to different EP groups never meet in one
 * collective. The choice depends only on the layout, so every rank makes
 * the same one.
 */
#include "runtime/moe/rbd_exec.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/comm/comm.h"
#include "runtime/comm/stage.h"
#include "runtime/moe/rbd.h"

/* What the later calls of one slot need. */
typedef struct {
  int used;
  xm_rt_rbd_config_t cfg;
  int64_t T, k, H, E;
  xm_rt_group_kind_t intra_kind; /* group of the replica exchange */
  int intra_size;                /* its members */
  int intra_base;                /* EP index of its member 0 */
  xm_rt_rbd_send_plan_t send;    /* stage 1 (source side) */
  int64_t *pilot_recv;           /* [ep] pilot rows received from each EP member */
  int64_t num_recv;              /* sum of pilot_recv */
  xm_rt_rbd_recv_plan_t recv;    /* stage 2 (pilot side) */
  int64_t *intra_send;           /* [intra_size] replica rows sent to each member */
  int64_t *intra_recv;           /* [intra_size] replica rows received from each member */
  int64_t num_replicas_in;       /* sum of intra_recv */
  int64_t rows;                  /* input rows: num_recv pilots, then the replicas */
  xm_rt_rbd_local_plan_t local;  /* stage 3 */
  float *weights;                /* [rows * k] routing weights of the input rows */
} rbd_record_t;

typedef struct {
  rbd_record_t *records; /* [cap], indexed by slot */
  int cap;
  int64_t rbd_inter, flat_inter; /* xm_rt_rbd_stats */
} rbd_state_t;

static xm_rt_comm_t *comm_of(const xm_rt_exec_t *x) { return (xm_rt_comm_t *)x->comm; }

/* ---- memory ---- */

/* a * b, or a failure naming `what` when it overflows or is negative. */
static int64_t mul(const xm_rt_exec_t *x, int64_t a, int64_t b, const char *what) {
  if (a < 0 || b < 0 || (a > 0 && b > INT64_MAX / a))
    xm_rt_fail(x, "rbd: the size of %s overflows (%lld x %lld)", what, (long long)a, (long long)b);
  return a * b;
}

/* n elements of `size` bytes, zeroed when `zero`; at least one byte so that
 * NULL means failure. */
static void *xalloc(const xm_rt_exec_t *x, int64_t n, size_t size, int zero, const char *what) {
  if (n < 0 || (uint64_t)n > SIZE_MAX / size)
    xm_rt_fail(x, "rbd: the size of %s overflows (%lld elements)", what, (long long)n);
  size_t bytes = n > 0 ? (size_t)n * size : 1;
  void *p = zero ? calloc(1, bytes) : malloc(bytes);
  if (!p) xm_rt_fail(x, "rbd: out of memory for %s (%zu bytes)", what, bytes);
  return p;
}

static void record_clear(rbd_record_t *r) {
  xm_rt_rbd_send_plan_free(&r->send);
  xm_rt_rbd_recv_plan_free(&r->recv);
  xm_rt_rbd_local_plan_free(&r->local);
  free(r->pilot_recv);
  free(r->intra_send);
  free(r->intra_recv);
  free(r->weights);
  memset(r, 0, sizeof *r);
}

static rbd_state_t *state_of(xm_rt_exec_t *x) {
  if (!x->rbd) x->rbd = xalloc(x, 1, sizeof(rbd_state_t), 1, "the RBD state");
  return x->rbd;
}

/* A cleared record for `slot`, growing the table as needed. */
static rbd_record_t *record_new(xm_rt_exec_t *x, int slot, int layer) {
  if (slot < 0) xm_rt_fail(x, "rbd_dispatch (layer %d): slot %d is negative", layer, slot);
  rbd_state_t *s = state_of(x);
  if (slot >= s->cap) {
    int cap = s->cap > INT_MAX / 2 ? INT_MAX : 2 * s->cap;
    if (cap <= slot) cap = slot + 1;
    rbd_record_t *grown = realloc(s->records, (size_t)cap * sizeof *grown);
    if (!grown) xm_rt_fail(x, "rbd: out of memory for %d routing records", cap);
    memset(grown + s->cap, 0, (size_t)(cap - s->cap) * sizeof *grown);
    s->records = grown;
    s->cap = cap;
  }
  record_clear(&s->records[slot]);
  return &s->records[slot];
}

static rbd_record_t *record_get(xm_rt_exec_t *x, int slot, int layer, const char *what) {
  rbd_state_t *s = x->rbd;
  if (!s || slot < 0 || slot >= s->cap || !s->records[slot].used)
    xm_rt_fail(x, "%s (layer %d): slot %d has no routing record (no rbd_dispatch before it)", what,
               layer, slot);
  return &s->records[slot];
}

/* ---- exchanges (a group of one when there is no communicator) ---- */

/* int32 rows with the count exchange and the receive bound; fills
 * out_recv_counts[group size]; returns the rows received. */
static int64_t move_ids(xm_rt_exec_t *x, xm_rt_group_kind_t kind, int layer, int64_t width,
                        const int32_t *send, const int64_t *send_counts, int32_t *recv,
                        int64_t capacity, int64_t *out_recv_counts) {
  xm_rt_comm_t *c = comm_of(x);
  if (!c) {
    int64_t n = send_counts[0];
    XM_ASSERT(n <= capacity);
    if (n > 0) memcpy(recv, send, (size_t)(n * width) * sizeof(int32_t));
    out_recv_counts[0] = n;
    return n;
  }
  xm_diag_t d;
  xm_diag_init(&d);
  int64_t total = 0;
  xm_rt_a2a_t a = {XM_RT_PHASE_DISPATCH, layer, width};
  xm_status_t st = xm_rt_comm_all_to_all_v_i32(c, kind, a, send, send_counts, recv, capacity, &d,
                                               out_recv_counts, NULL, &total);
  if (st != XM_OK) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", d.count ? d.entries[0].message : xm_status_name(st));
    xm_diag_free(&d);
    xm_rt_fail(x, "rbd_dispatch (layer %d): expert ids: %s", layer, msg);
  }
  xm_diag_free(&d);
  return total;
}

/* float rows with counts both sides know. */
static void move_rows(xm_rt_exec_t *x, xm_rt_group_kind_t kind, xm_rt_phase_t phase, int layer,
                      int64_t width, const float *send, const int64_t *send_counts, float *recv,
                      const int64_t *recv_counts) {
  xm_rt_comm_t *c = comm_of(x);
  if (!c) {
    XM_ASSERT(send_counts[0] == recv_counts[0]);
    if (send_counts[0] > 0) memcpy(recv, send, (size_t)(send_counts[0] * width) * sizeof(float));
    return;
  }
  xm_rt_a2a_t a = {phase, layer, width};
  xm_status_t st = xm_rt_comm_all_to_all_v_known(c, kind, a, send, send_counts, recv, recv_counts);
  if (st != XM_OK)
    xm_rt_fail(x, "rbd (%s, layer %d): all_to_all_v_known over %s failed: %s",
               xm_rt_phase_name(phase), layer, xm_rt_group_name(kind), xm_status_name(st));
}

/* ---- dispatch ---- */

/* The RBD config and the intra-node group of this rank. */
static void setup_layout(xm_rt_exec_t *x, rbd_record_t *r, int layer) {
  xm_rt_comm_t *c = comm_of(x);
  xm_rt_rbd_config_t *cfg = &r->cfg;
  cfg->experts = r->E;
  cfg->top_k = r->k;
  cfg->rule = XM_RT_RBD_PILOT_FIRST;
  cfg->ep = 1;
  cfg->ranks_per_node = 1;
  r->intra_kind = XM_RT_GROUP_EP;
  r->intra_size = 1;
  if (c) {
    const xm_rt_comm_group_t *g = xm_rt_comm_group(c, XM_RT_GROUP_EP);
    cfg->ep = g->size;
    cfg->ep_rank = g->index;
    cfg->ep_first_rank = g->members[0];
    cfg->ranks_per_node = c->layout.ranks_per_node;
    if (cfg->ep % cfg->ranks_per_node == 0) {
      r->intra_kind = XM_RT_GROUP_NODE;
      r->intra_size = xm_rt_comm_group(c, XM_RT_GROUP_NODE)->size;
    } else {
      r->intra_size = cfg->ep;
    }
  }
  if (r->E % cfg->ep != 0)
    xm_rt_fail(x,
               "rbd_dispatch (layer %d): %lld experts do not divide over the %d ranks of the ep "
               "group",
               layer, (long long)r->E, cfg->ep);
  if (xm_rt_rbd_config_check(cfg) != XM_OK)
    xm_rt_fail(x, "rbd_dispatch (layer %d): bad routing shape (%lld experts, top_k %lld, ep %d)",
               layer, (long long)r->E, (long long)r->k, cfg->ep);
}

/* Fails naming the first expert id >= E. */
static void check_ids(xm_rt_exec_t *x, const int32_t *experts, int64_t T, int64_t k, int64_t E,
                      int layer) {
  for (int64_t i = 0; i < T * k; i++)
    if (experts[i] >= E)
      xm_rt_fail(x,
                 "rbd_dispatch (layer %d): token %lld slot %lld routes to expert %d, but the "
                 "layer has %lld experts",
                 layer, (long long)(i / k), (long long)(i % k), (int)experts[i], (long long)E);
}

/* Every member of the EP group learns whether one of them holds more than
 * `bound` rows, before any row is written; then all of them fail. */
static void agree_bound(xm_rt_exec_t *x, int64_t M, int64_t bound, int layer, int slot) {
  xm_rt_comm_t *c = comm_of(x);
  if (!c) {
    if (M > bound)
      xm_rt_fail(x,
                 "rbd_dispatch (layer %d, slot %d): this rank would hold %lld expert rows, more "
                 "than the bound of %lld rows",
                 layer, slot, (long long)M, (long long)bound);
    return;
  }
  const xm_rt_comm_group_t *g = xm_rt_comm_group(c, XM_RT_GROUP_EP);
  struct {
    long value;
    int index;
  } mine = {M > bound ? (long)M : -1L, g->index}, worst;
  MPI_Allreduce(&mine, &worst, 1, MPI_LONG_INT, MPI_MAXLOC, g->comm);
  if (worst.value < 0) return;
  /* The reporting rank's abort ends the others; they follow on their own
   * after a grace period, so one message prints, not one per rank at once
   * (concurrent MPI_Aborts garble Open MPI's own report). */
  if (g->index != worst.index) nanosleep(&(struct timespec){.tv_sec = 2}, NULL);
  xm_rt_fail(x,
             "rbd_dispatch (layer %d, slot %d) over the ep group: rank %d would hold %ld expert "
             "rows, more than the bound of %lld rows (the memory plan reserves min(ep, B) times "
             "the rows a rank sends; recompile with a larger xmoec compile --dispatch-bound B)",
             layer, slot, g->members[worst.index], worst.value, (long long)bound);
}

/* Stages 1-3 on the expert ids: fills the plans and counts of r, returns
 * the ids of the input rows ([rows * k], the caller frees). */
static int32_t *plan_ids(xm_rt_exec_t *x, rbd_record_t *r, const int32_t *experts, int layer) {
  const xm_rt_rbd_config_t *cfg = &r->cfg;
  int64_t k = r->k, ep = cfg->ep;
  xm_status_t st = xm_rt_rbd_plan_send(cfg, experts, r->T, &r->send);
  if (st != XM_OK)
    xm_rt_fail(x, "rbd_dispatch (layer %d): planning the pilots: %s", layer, xm_status_name(st));
  int64_t np = r->send.num_pilots;
  int32_t *ids_out = xalloc(x, mul(x, np, k, "pilot ids"), sizeof(int32_t), 0, "pilot ids");
  xm_rt_rbd_gather(experts, (size_t)k * sizeof(int32_t), r->send.pilot_token, np, ids_out);
  int64_t cap = mul(x, ep, r->T, "the receive bound");
  int32_t *ids = xalloc(x, mul(x, cap, k, "received ids"), sizeof(int32_t), 0, "received ids");
  r->pilot_recv = xalloc(x, ep, sizeof(int64_t), 1, "pilot counts");
  r->num_recv =
      move_ids(x, XM_RT_GROUP_EP, layer, k, ids_out, r->send.send_counts, ids, cap, r->pilot_recv);
  free(ids_out);

  st = xm_rt_rbd_plan_replicate(cfg, ids, r->num_recv, &r->recv);
  if (st != XM_OK)
    xm_rt_fail(x, "rbd_dispatch (layer %d): planning the replicas: %s", layer, xm_status_name(st));
  const xm_rt_rbd_recv_plan_t *rp = &r->recv;
  if (r->intra_kind == XM_RT_GROUP_NODE) {
    XM_ASSERT(r->intra_size == rp->node_ranks);
    r->intra_base = rp->node_first;
  }
  r->intra_send = xalloc(x, r->intra_size, sizeof(int64_t), 1, "replica counts");
  r->intra_recv = xalloc(x, r->intra_size, sizeof(int64_t), 1, "replica counts");
  for (int i = 0; i < r->intra_size; i++) {
    int q = r->intra_base + i;
    if (q >= rp->node_first && q < rp->node_first + rp->node_ranks)
      r->intra_send[i] = rp->intra_send_counts[q - rp->node_first];
  }
  int64_t nr = rp->num_replicas;
  int32_t *rep_out = xalloc(x, mul(x, nr, k, "replica ids"), sizeof(int32_t), 0, "replica ids");
  xm_rt_rbd_gather(ids, (size_t)k * sizeof(int32_t), rp->replica_src_row, nr, rep_out);
  r->num_replicas_in = move_ids(x, r->intra_kind, layer, k, rep_out, r->intra_send,
                                ids + r->num_recv * k, cap - r->num_recv, r->intra_recv);
  free(rep_out);
  r->rows = r->num_recv + r->num_replicas_in;

  st = xm_rt_rbd_plan_local(cfg, ids, r->rows, &r->local);
  if (st != XM_OK)
    xm_rt_fail(x, "rbd_dispatch (layer %d): planning the expert rows: %s", layer,
               xm_status_name(st));
  return ids;
}

/* Stage 4: the token rows with their weights; returns the input records
 * [rows, H + k] (the caller frees). */
static float *move_records(xm_rt_exec_t *x, rbd_record_t *r, const float *tokens,
                           const float *weights, int layer) {
  int64_t H = r->H, k = r->k, W = H + k, np = r->send.num_pilots;
  float *out = xalloc(x, mul(x, np, W, "pilot rows"), sizeof(float), 0, "pilot rows");
  for (int64_t p = 0; p < np; p++) {
    int64_t t = r->send.pilot_token[p];
    memcpy(out + p * W, tokens + t * H, (size_t)H * sizeof(float));
    memcpy(out + p * W + H, weights + t * k, (size_t)k * sizeof(float));
  }
  float *rec = xalloc(x, mul(x, r->rows, W, "input rows"), sizeof(float), 0, "input rows");
  move_rows(x, XM_RT_GROUP_EP, XM_RT_PHASE_DISPATCH, layer, W, out, r->send.send_counts, rec,
            r->pilot_recv);
  free(out);
  int64_t nr = r->recv.num_replicas;
  out = xalloc(x, mul(x, nr, W, "replica rows"), sizeof(float), 0, "replica rows");
  xm_rt_rbd_gather(rec, (size_t)W * sizeof(float), r->recv.replica_src_row, nr, out);
  move_rows(x, r->intra_kind, XM_RT_PHASE_DISPATCH, layer, W, out, r->intra_send,
            rec + r->num_recv * W, r->intra_recv);
  free(out);
  return rec;
}

static int64_t host_rbd_dispatch(xm_rt_exec_t *x, int slot, int layer, const float *tokens,
                           const int32_t *experts, const float *weights, int64_t T, int64_t k,
                           int64_t H, int64_t E, float *rows, int32_t *tpe, int64_t bound) {
  if (xm_rt_fault(x, "arena")) bound = 0; /* tests: a plan too small for the routing */
  if (T < 0 || k < 1 || H < 1 || E < 1 || k > E)
    xm_rt_fail(x, "rbd_dispatch (layer %d): bad shapes T %lld, k %lld, H %lld, E %lld", layer,
               (long long)T, (long long)k, (long long)H, (long long)E);
  if ((T > 0 && (!tokens || !experts || !weights)) || !tpe)
    xm_rt_fail(x, "rbd_dispatch (layer %d): a null buffer", layer);
  mul(x, T, H, "the tokens");
  mul(x, T, k, "the routing");
  rbd_record_t *r = record_new(x, slot, layer);
  r->T = T, r->k = k, r->H = H, r->E = E;
  setup_layout(x, r, layer);
  check_ids(x, experts, T, k, E, layer);

  int32_t *ids = plan_ids(x, r, experts, layer);
  int64_t M = r->local.num_slots;
  agree_bound(x, M, bound, layer, slot);
  if (M > 0 && !rows) xm_rt_fail(x, "rbd_dispatch (layer %d): a null row buffer", layer);
  int64_t L = E / r->cfg.ep;
  for (int64_t l = 0; l < L; l++)
    if (r->local.tpe[l] > INT32_MAX)
      xm_rt_fail(x, "rbd_dispatch (layer %d): %lld rows for one expert do not fit int32", layer,
                 (long long)r->local.tpe[l]);

  rbd_state_t *s = state_of(x);
  int64_t *flat = xalloc(x, r->cfg.ep, sizeof(int64_t), 1, "flat counts"), flat_inter = 0;
  if (xm_rt_rbd_flat_counts(&r->cfg, experts, T, flat, &flat_inter) == XM_OK)
    s->flat_inter += flat_inter;
  free(flat);
  s->rbd_inter += r->send.inter_node_rows;

  float *rec = move_records(x, r, tokens, weights, layer);
  int64_t W = H + k;
  r->weights = xalloc(x, mul(x, r->rows, k, "row weights"), sizeof(float), 0, "row weights");
  for (int64_t i = 0; i < r->rows; i++)
    memcpy(r->weights + i * k, rec + i * W + H, (size_t)k * sizeof(float));
  for (int64_t m = 0; m < M; m++)
    memcpy(rows + m * H, rec + (r->local.slot_index[m] / k) * W, (size_t)H * sizeof(float));
  for (int64_t l = 0; l < L; l++)
    tpe[l] = (int32_t)r->local.tpe[l];
  free(rec);
  free(ids);
  r->used = 1;
  return M;
}

/* ---- combine and gradients ---- */

/* Source -> pilot -> replicas: in[T, width] to the input rows out[rows,
 * width] (phase DISPATCH). */
static void forward_path(xm_rt_exec_t *x, const rbd_record_t *r, int layer, int64_t width,
                         const float *in, float *out) {
  int64_t np = r->send.num_pilots, nr = r->recv.num_replicas;
  int64_t n = np > nr ? np : nr;
  float *buf = xalloc(x, mul(x, n, width, "rows"), sizeof(float), 0, "rows");
  xm_rt_rbd_gather(in, (size_t)width * sizeof(float), r->send.pilot_token, np, buf);
  move_rows(x, XM_RT_GROUP_EP, XM_RT_PHASE_DISPATCH, layer, width, buf, r->send.send_counts, out,
            r->pilot_recv);
  xm_rt_rbd_gather(out, (size_t)width * sizeof(float), r->recv.replica_src_row, nr, buf);
  move_rows(x, r->intra_kind, XM_RT_PHASE_DISPATCH, layer, width, buf, r->intra_send,
            out + r->num_recv * width, r->intra_recv);
  free(buf);
}

/* Replicas -> pilot (added: node pre-reduction) -> source (added into the
 * token): partial[rows, width] (overwritten) to out[T, width] (phase
 * COMBINE). */
static void return_path(xm_rt_exec_t *x, const rbd_record_t *r, int layer, int64_t width,
                        float *partial, float *out) {
  int64_t np = r->send.num_pilots, nr = r->recv.num_replicas;
  int64_t n = np > nr ? np : nr;
  float *buf = xalloc(x, mul(x, n, width, "rows"), sizeof(float), 0, "rows");
  move_rows(x, r->intra_kind, XM_RT_PHASE_COMBINE, layer, width, partial + r->num_recv * width,
            r->intra_recv, buf, r->intra_send);
  xm_rt_rbd_scatter_add(buf, width, r->recv.replica_src_row, nr, partial);
  move_rows(x, XM_RT_GROUP_EP, XM_RT_PHASE_COMBINE, layer, width, partial, r->pilot_recv, buf,
            r->send.send_counts);
  if (r->T > 0) memset(out, 0, (size_t)(r->T * width) * sizeof(float));
  xm_rt_rbd_scatter_add(buf, width, r->send.pilot_token, np, out);
  free(buf);
}

static void require_buffers(xm_rt_exec_t *x, int layer, const char *what, int ok) {
  if (!ok) xm_rt_fail(x, "%s (layer %d): a null buffer", what, layer);
}

static void host_rbd_combine(xm_rt_exec_t *x, int slot, int layer, const float *rows, float *out) {
  rbd_record_t *r = record_get(x, slot, layer, "rbd_combine");
  require_buffers(x, layer, "rbd_combine", (r->local.num_slots == 0 || rows) && (r->T == 0 || out));
  float *partial =
      xalloc(x, mul(x, r->rows, r->H, "partial rows"), sizeof(float), 0, "partial rows");
  xm_rt_rbd_reduce_local(&r->local, r->k, rows, r->weights, r->H, partial);
  return_path(x, r, layer, r->H, partial, out);
  free(partial);
}

static void host_rbd_combine_grad(xm_rt_exec_t *x, int slot, int layer, const float *dout,
                            const float *rows, float *drows, float *dweights) {
  rbd_record_t *r = record_get(x, slot, layer, "rbd_combine_grad");
  int64_t M = r->local.num_slots, H = r->H, k = r->k;
  require_buffers(x, layer, "rbd_combine_grad",
                  (M == 0 || (rows && drows)) && (r->T == 0 || (dout && dweights)));
  float *d = xalloc(x, mul(x, r->rows, H, "dout rows"), sizeof(float), 0, "dout rows");
  forward_path(x, r, layer, H, dout, d);
  /* dw[row * k + j]: the k-wide dweights row of each input row; slot j of a
   * token is computed on exactly one rank, so the return sums assemble it. */
  float *dw = xalloc(x, mul(x, r->rows, k, "dweights rows"), sizeof(float), 1, "dweights rows");
  for (int64_t m = 0; m < M; m++) {
    int64_t s = r->local.slot_index[m];
    const float *g = d + (s / k) * H, *y = rows + m * H;
    float w = r->weights[s], *dr = drows + m * H;
    double dot = 0.0;
    for (int64_t c = 0; c < H; c++) {
      dr[c] = w * g[c];
      dot += (double)g[c] * (double)y[c];
    }
    dw[s] = (float)dot;
  }
  free(d);
  return_path(x, r, layer, k, dw, dweights);
  free(dw);
}

static void host_rbd_dispatch_grad(xm_rt_exec_t *x, int slot, int layer, const float *drows, float *dx) {
  rbd_record_t *r = record_get(x, slot, layer, "rbd_dispatch_grad");
  int64_t M = r->local.num_slots, H = r->H, k = r->k;
  require_buffers(x, layer, "rbd_dispatch_grad", (M == 0 || drows) && (r->T == 0 || dx));
  float *partial = xalloc(x, mul(x, r->rows, H, "partial rows"), sizeof(float), 1, "partial rows");
  for (int64_t m = 0; m < M; m++) {
    float *p = partial + (r->local.slot_index[m] / k) * H;
    const float *g = drows + m * H;
    for (int64_t c = 0; c < H; c++)
      p[c] += g[c];
  }
  return_path(x, r, layer, H, partial, dx);
  free(partial);
}

/* ---- staging through host memory (runtime/comm/stage.h), as the
 * collectives of runtime/comm/spmd.c ---- */
static int staged(const xm_rt_exec_t *x) { return xm_rt_staged(x); }

int64_t xm_rt_rbd_dispatch(xm_rt_exec_t *x, int slot, int layer, const float *tokens,
                           const int32_t *experts, const float *weights, int64_t T, int64_t k,
                           int64_t H, int64_t E, float *rows, int32_t *tpe, int64_t bound) {
  if (!staged(x) || T < 0 || k < 1 || H < 1 || E < 1 || k > E || bound < 0)
    return host_rbd_dispatch(x, slot, layer, tokens, experts, weights, T, k, H, E, rows, tpe,
                             bound);
  const char *what = "rbd_dispatch";
  float *ht = xm_rt_stage_in(x, tokens, mul(x, T, H, "the tokens"), sizeof(float), what);
  int32_t *he = xm_rt_stage_in(x, experts, mul(x, T, k, "the routing"), sizeof(int32_t), what);
  float *hw = xm_rt_stage_in(x, weights, T * k, sizeof(float), what);
  float *hr = xm_rt_stage_in(x, NULL, mul(x, bound, H, "the rows"), sizeof(float), what);
  int32_t *hp = xm_rt_stage_in(x, NULL, E, sizeof(int32_t), what);
  int64_t M = host_rbd_dispatch(x, slot, layer, ht, he, hw, T, k, H, E, rows ? hr : NULL,
                                tpe ? hp : NULL, bound);
  const rbd_record_t *r = record_get(x, slot, layer, what);
  xm_rt_stage_out(x, rows, hr, M * H, sizeof(float));
  xm_rt_stage_out(x, tpe, hp, E / r->cfg.ep, sizeof(int32_t));
  free(ht), free(he), free(hw), free(hr), free(hp);
  return M;
}

void xm_rt_rbd_combine(xm_rt_exec_t *x, int slot, int layer, const float *rows, float *out) {
  if (!staged(x)) {
    host_rbd_combine(x, slot, layer, rows, out);
    return;
  }
  const char *what = "rbd_combine";
  const rbd_record_t *r = record_get(x, slot, layer, what);
  int64_t M = r->local.num_slots, T = r->T, H = r->H;
  float *hr = xm_rt_stage_in(x, rows, M * H, sizeof(float), what);
  float *ho = xm_rt_stage_in(x, NULL, T * H, sizeof(float), what);
  host_rbd_combine(x, slot, layer, rows ? hr : NULL, out ? ho : NULL);
  xm_rt_stage_out(x, out, ho, T * H, sizeof(float));
  free(hr), free(ho);
}

void xm_rt_rbd_combine_grad(xm_rt_exec_t *x, int slot, int layer, const float *dout,
                            const float *rows, float *drows, float *dweights) {
  if (!staged(x)) {
    host_rbd_combine_grad(x, slot, layer, dout, rows, drows, dweights);
    return;
  }
  const char *what = "rbd_combine_grad";
  const rbd_record_t *r = record_get(x, slot, layer, what);
  int64_t M = r->local.num_slots, T = r->T, H = r->H, k = r->k;
  float *hd = xm_rt_stage_in(x, dout, T * H, sizeof(float), what);
  float *hr = xm_rt_stage_in(x, rows, M * H, sizeof(float), what);
  float *hdr = xm_rt_stage_in(x, NULL, M * H, sizeof(float), what);
  float *hdw = xm_rt_stage_in(x, NULL, T * k, sizeof(float), what);
  host_rbd_combine_grad(x, slot, layer, dout ? hd : NULL, rows ? hr : NULL, drows ? hdr : NULL,
                        dweights ? hdw : NULL);
  xm_rt_stage_out(x, drows, hdr, M * H, sizeof(float));
  xm_rt_stage_out(x, dweights, hdw, T * k, sizeof(float));
  free(hd), free(hr), free(hdr), free(hdw);
}

void xm_rt_rbd_dispatch_grad(xm_rt_exec_t *x, int slot, int layer, const float *drows, float *dx) {
  if (!staged(x)) {
    host_rbd_dispatch_grad(x, slot, layer, drows, dx);
    return;
  }
  const char *what = "rbd_dispatch_grad";
  const rbd_record_t *r = record_get(x, slot, layer, what);
  int64_t M = r->local.num_slots, T = r->T, H = r->H;
  float *hd = xm_rt_stage_in(x, drows, M * H, sizeof(float), what);
  float *hx = xm_rt_stage_in(x, NULL, T * H, sizeof(float), what);
  host_rbd_dispatch_grad(x, slot, layer, drows ? hd : NULL, dx ? hx : NULL);
  xm_rt_stage_out(x, dx, hx, T * H, sizeof(float));
  free(hd), free(hx);
}

/* ---- statistics and cleanup ---- */

void xm_rt_rbd_stats(xm_rt_exec_t *x, int64_t *out_rbd_inter_rows, int64_t *out_flat_inter_rows,
                     int reset) {
  rbd_state_t *s = x->rbd;
  if (out_rbd_inter_rows) *out_rbd_inter_rows = s ? s->rbd_inter : 0;
  if (out_flat_inter_rows) *out_flat_inter_rows = s ? s->flat_inter : 0;
  if (reset && s) s->rbd_inter = s->flat_inter = 0;
}

void xm_rt_rbd_exec_free(xm_rt_exec_t *x) {
  rbd_state_t *s = x->rbd;
  if (!s) return;
  for (int i = 0; i < s->cap; i++)
    record_clear(&s->records[i]);
  free(s->records);
  free(s);
  x->rbd = NULL;
}
