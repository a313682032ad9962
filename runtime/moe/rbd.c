/* runtime/moe/rbd.c — redundancy-bypassing dispatch plans
 * (docs/design.md, Redundancy-bypassing dispatch).
 *
 * Every plan is built in two passes over the routing: the first counts rows
 * per destination, the prefix sums give each destination's block, the
 * second fills the blocks in token order. So the rows for one destination
 * keep the order of their tokens, a receiver can rely on it, and a plan is a
 * pure function of its inputs (the random pilot rule hashes its inputs; it
 * draws from no stream).
 *
 * The per-token work is over the k slots only (k is small: at most the
 * number of experts, 8 in DeepSeek-V3), so the quadratic scans over a
 * token's slots below are cheaper than any map.
 *
 * Ownership of experts is contiguous (expert e on EP rank e / (E/ep)) and an
 * EP group is a block of consecutive world ranks, so the EP ranks of one
 * node are a consecutive range too; nothing here requires the EP group to
 * start or end on a node boundary.
 */
#include "runtime/moe/rbd.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

xm_status_t xm_rt_rbd_config_check(const xm_rt_rbd_config_t *c) {
  if (c->ep < 1 || c->experts < 1 || c->experts % c->ep != 0) return XM_ERR_INVALID_INPUT;
  if (c->top_k < 1 || c->top_k > c->experts) return XM_ERR_INVALID_INPUT;
  if (c->ep_rank < 0 || c->ep_rank >= c->ep) return XM_ERR_INVALID_INPUT;
  if (c->ep_first_rank < 0 || c->ranks_per_node < 1) return XM_ERR_INVALID_INPUT;
  if (c->rule != XM_RT_RBD_PILOT_FIRST && c->rule != XM_RT_RBD_PILOT_RANDOM)
    return XM_ERR_INVALID_INPUT;
  return XM_OK;
}

void xm_rt_rbd_node_ranks(const xm_rt_rbd_config_t *c, int node, int *out_first, int *out_count) {
  int64_t base = ((int64_t)c->ep_first_rank / c->ranks_per_node + node) * c->ranks_per_node;
  int64_t lo = base - c->ep_first_rank, hi = lo + c->ranks_per_node;
  if (lo < 0) lo = 0;
  if (hi > c->ep) hi = c->ep;
  *out_first = (int)lo;
  *out_count = hi > lo ? (int)(hi - lo) : 0;
}

/* Zeroed arrays of n elements; NULL on overflow or exhaustion. calloc
 * checks n * size itself. At least one element so that NULL means failure. */
static void *alloc_zero(int64_t n, size_t size) {
  if (n < 0) return NULL;
  return calloc(n > 0 ? (size_t)n : 1, size);
}

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Checks the expert ids of `n` slots. */
static xm_status_t check_ids(const xm_rt_rbd_config_t *c, const int32_t *ids, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (ids[i] >= c->experts) return XM_ERR_INVALID_INPUT;
  return XM_OK;
}

/* ---- stage 1 ------------------------------------------------------------ */

/* Scratch for one token's slots. */
typedef struct {
  int *owner;  /* [k] EP rank of the slot's expert; -1 dropped */
  int *leader; /* [k] first slot of the same node (the pilot's slot group) */
  int *dest;   /* [k] pilot rank of the slot's node */
  int *cand;   /* [k] candidate pilot ranks (random rule) */
} token_scratch_t;

/* The pilot rank of the node group led by slot `lead`. */
static int pick_pilot(const xm_rt_rbd_config_t *c, const token_scratch_t *s, int64_t t, int lead) {
  if (c->rule == XM_RT_RBD_PILOT_FIRST) return s->owner[lead];
  int node = xm_rt_rbd_node_of(c, s->owner[lead]), n = 0;
  for (int64_t j = lead; j < c->top_k; j++) {
    if (s->owner[j] < 0 || s->leader[j] != lead) continue;
    int seen = 0;
    for (int i = 0; i < n; i++)
      seen |= s->cand[i] == s->owner[j];
    if (!seen) s->cand[n++] = s->owner[j];
  }
  uint64_t h = mix64(c->seed);
  h = mix64(h ^ (uint64_t)c->step);
  h = mix64(h ^ (uint64_t)(c->ep_first_rank + c->ep_rank));
  h = mix64(h ^ (uint64_t)t);
  h = mix64(h ^ (uint64_t)node);
  return s->cand[h % (uint64_t)n];
}

/* Fills owner, leader and dest for token t. */
static void token_pilots(const xm_rt_rbd_config_t *c, const int32_t *ids, int64_t t,
                         token_scratch_t *s) {
  int64_t k = c->top_k;
  for (int64_t j = 0; j < k; j++) {
    int32_t e = ids[t * k + j];
    s->owner[j] = e < 0 ? -1 : xm_rt_rbd_owner(c, e);
    s->leader[j] = -1;
    if (e < 0) continue;
    int node = xm_rt_rbd_node_of(c, s->owner[j]);
    s->leader[j] = (int)j;
    for (int64_t i = 0; i < j; i++) {
      if (s->owner[i] >= 0 && xm_rt_rbd_node_of(c, s->owner[i]) == node) {
        s->leader[j] = s->leader[i];
        break;
      }
    }
  }
  for (int64_t j = 0; j < k; j++) {
    if (s->owner[j] < 0) continue;
    s->dest[j] = s->leader[j] == j ? pick_pilot(c, s, t, (int)j) : s->dest[s->leader[j]];
  }
}

void xm_rt_rbd_send_plan_free(xm_rt_rbd_send_plan_t *p) {
  free(p->pilot_token);
  free(p->pilot_dest);
  free(p->send_counts);
  free(p->send_offsets);
  free(p->slot_pilot);
  memset(p, 0, sizeof *p);
}

/* Second pass: rows in token order within each destination's block. */
static void fill_pilots(const xm_rt_rbd_config_t *c, const int32_t *experts, token_scratch_t *s,
                        int64_t *fill, xm_rt_rbd_send_plan_t *p) {
  int64_t k = c->top_k;
  int own_node = xm_rt_rbd_node_of(c, c->ep_rank);
  for (int64_t t = 0; t < p->tokens; t++) {
    token_pilots(c, experts, t, s);
    for (int64_t j = 0; j < k; j++) {
      int64_t slot = t * k + j;
      if (s->owner[j] < 0) {
        p->slot_pilot[slot] = -1;
      } else if (s->leader[j] == j) {
        int64_t row = fill[s->dest[j]]++;
        p->pilot_token[row] = t;
        p->pilot_dest[row] = s->dest[j];
        p->slot_pilot[slot] = row;
        if (xm_rt_rbd_node_of(c, s->dest[j]) != own_node) p->inter_node_rows++;
      } else {
        p->slot_pilot[slot] = p->slot_pilot[t * k + s->leader[j]];
      }
    }
  }
}

xm_status_t xm_rt_rbd_plan_send(const xm_rt_rbd_config_t *c, const int32_t *experts, int64_t tokens,
                                xm_rt_rbd_send_plan_t *out) {
  memset(out, 0, sizeof *out);
  XM_RETURN_IF_ERROR(xm_rt_rbd_config_check(c));
  int64_t k = c->top_k;
  if (tokens < 0 || tokens > INT64_MAX / k) return XM_ERR_INVALID_INPUT;
  XM_RETURN_IF_ERROR(check_ids(c, experts, tokens * k));
  out->tokens = tokens;
  out->top_k = k;
  out->ep = c->ep;
  token_scratch_t s = {alloc_zero(k, sizeof(int)), alloc_zero(k, sizeof(int)),
                       alloc_zero(k, sizeof(int)), alloc_zero(k, sizeof(int))};
  int64_t *fill = alloc_zero(c->ep, sizeof(int64_t));
  out->send_counts = alloc_zero(c->ep, sizeof(int64_t));
  out->send_offsets = alloc_zero(c->ep + 1, sizeof(int64_t));
  out->slot_pilot = alloc_zero(tokens * k, sizeof(int64_t));
  xm_status_t st = XM_ERR_NO_MEMORY;
  if (!s.owner || !s.leader || !s.dest || !s.cand || !fill || !out->send_counts ||
      !out->send_offsets || !out->slot_pilot)
    goto done;
  for (int64_t t = 0; t < tokens; t++) {
    token_pilots(c, experts, t, &s);
    for (int64_t j = 0; j < k; j++) {
      if (s.owner[j] < 0) continue;
      out->slots++;
      if (s.leader[j] == j) out->send_counts[s.dest[j]]++;
    }
  }
  for (int q = 0; q < c->ep; q++) {
    out->send_offsets[q + 1] = out->send_offsets[q] + out->send_counts[q];
    fill[q] = out->send_offsets[q];
  }
  out->num_pilots = out->send_offsets[c->ep];
  out->pilot_token = alloc_zero(out->num_pilots, sizeof(int64_t));
  out->pilot_dest = alloc_zero(out->num_pilots, sizeof(int32_t));
  if (!out->pilot_token || !out->pilot_dest) goto done;
  fill_pilots(c, experts, &s, fill, out);
  st = XM_OK;
done:
  free(s.owner);
  free(s.leader);
  free(s.dest);
  free(s.cand);
  free(fill);
  if (st != XM_OK) xm_rt_rbd_send_plan_free(out);
  return st;
}

/* ---- stage 2 ------------------------------------------------------------ */

void xm_rt_rbd_recv_plan_free(xm_rt_rbd_recv_plan_t *p) {
  free(p->replica_src_row);
  free(p->replica_dest);
  free(p->intra_send_counts);
  free(p->intra_send_offsets);
  memset(p, 0, sizeof *p);
}

/* Visits the distinct ranks other than this one on this node that hold
 * experts of received row r, in slot order; counts the row's slots. With
 * `fill` NULL it counts replica rows per destination, else it writes them.
 * Returns false when the row has no slot on this rank. */
static bool replicate_row(const xm_rt_rbd_config_t *c, const int32_t *ids, int64_t r, int *seen,
                          int64_t *fill, xm_rt_rbd_recv_plan_t *p) {
  int own_node = xm_rt_rbd_node_of(c, c->ep_rank), n_seen = 0;
  int64_t mine = 0;
  for (int64_t j = 0; j < c->top_k; j++) {
    int32_t e = ids[r * c->top_k + j];
    if (e < 0) continue;
    int q = xm_rt_rbd_owner(c, e);
    if (q == c->ep_rank) {
      mine++;
      continue;
    }
    if (xm_rt_rbd_node_of(c, q) != own_node) continue;
    if (!fill) p->replica_slots++;
    int dup = 0;
    for (int i = 0; i < n_seen; i++)
      dup |= seen[i] == q;
    if (dup) continue;
    seen[n_seen++] = q;
    if (!fill) {
      p->intra_send_counts[q - p->node_first]++;
    } else {
      int64_t row = fill[q - p->node_first]++;
      p->replica_src_row[row] = r;
      p->replica_dest[row] = q;
    }
  }
  if (!fill) p->local_slots += mine;
  return mine > 0;
}

xm_status_t xm_rt_rbd_plan_replicate(const xm_rt_rbd_config_t *c, const int32_t *recv_experts,
                                     int64_t num_recv, xm_rt_rbd_recv_plan_t *out) {
  memset(out, 0, sizeof *out);
  XM_RETURN_IF_ERROR(xm_rt_rbd_config_check(c));
  if (num_recv < 0 || num_recv > INT64_MAX / c->top_k) return XM_ERR_INVALID_INPUT;
  XM_RETURN_IF_ERROR(check_ids(c, recv_experts, num_recv * c->top_k));
  out->num_recv = num_recv;
  xm_rt_rbd_node_ranks(c, xm_rt_rbd_node_of(c, c->ep_rank), &out->node_first, &out->node_ranks);
  int *seen = alloc_zero(c->top_k, sizeof(int));
  int64_t *fill = alloc_zero(out->node_ranks, sizeof(int64_t));
  out->intra_send_counts = alloc_zero(out->node_ranks, sizeof(int64_t));
  out->intra_send_offsets = alloc_zero(out->node_ranks + 1, sizeof(int64_t));
  xm_status_t st = XM_ERR_NO_MEMORY;
  if (!seen || !fill || !out->intra_send_counts || !out->intra_send_offsets) goto done;
  st = XM_ERR_INVALID_INPUT;
  for (int64_t r = 0; r < num_recv; r++)
    if (!replicate_row(c, recv_experts, r, seen, NULL, out)) goto done;
  for (int i = 0; i < out->node_ranks; i++) {
    out->intra_send_offsets[i + 1] = out->intra_send_offsets[i] + out->intra_send_counts[i];
    fill[i] = out->intra_send_offsets[i];
  }
  out->num_replicas = out->intra_send_offsets[out->node_ranks];
  st = XM_ERR_NO_MEMORY;
  out->replica_src_row = alloc_zero(out->num_replicas, sizeof(int64_t));
  out->replica_dest = alloc_zero(out->num_replicas, sizeof(int32_t));
  if (!out->replica_src_row || !out->replica_dest) goto done;
  for (int64_t r = 0; r < num_recv; r++)
    replicate_row(c, recv_experts, r, seen, fill, out);
  st = XM_OK;
done:
  free(seen);
  free(fill);
  if (st != XM_OK) xm_rt_rbd_recv_plan_free(out);
  return st;
}

/* ---- stage 3 ------------------------------------------------------------ */

void xm_rt_rbd_local_plan_free(xm_rt_rbd_local_plan_t *p) {
  free(p->slot_index);
  free(p->tpe);
  memset(p, 0, sizeof *p);
}

xm_status_t xm_rt_rbd_plan_local(const xm_rt_rbd_config_t *c, const int32_t *row_experts,
                                 int64_t rows, xm_rt_rbd_local_plan_t *out) {
  memset(out, 0, sizeof *out);
  XM_RETURN_IF_ERROR(xm_rt_rbd_config_check(c));
  int64_t k = c->top_k, local = c->experts / c->ep, lo = c->ep_rank * local;
  if (rows < 0 || rows > INT64_MAX / k) return XM_ERR_INVALID_INPUT;
  XM_RETURN_IF_ERROR(check_ids(c, row_experts, rows * k));
  out->rows = rows;
  out->tpe = alloc_zero(local, sizeof(int64_t));
  int64_t *fill = alloc_zero(local, sizeof(int64_t));
  xm_status_t st = XM_ERR_NO_MEMORY;
  if (!out->tpe || !fill) goto done;
  st = XM_ERR_INVALID_INPUT;
  for (int64_t r = 0; r < rows; r++) {
    int64_t mine = 0;
    for (int64_t j = 0; j < k; j++) {
      int64_t e = row_experts[r * k + j];
      if (e >= lo && e < lo + local) out->tpe[e - lo]++, mine++;
    }
    if (mine == 0) goto done; /* a row sent here must have work here */
    out->num_slots += mine;
  }
  for (int64_t e = 1; e < local; e++)
    fill[e] = fill[e - 1] + out->tpe[e - 1];
  st = XM_ERR_NO_MEMORY;
  out->slot_index = alloc_zero(out->num_slots, sizeof(int64_t));
  if (!out->slot_index) goto done;
  for (int64_t s = 0; s < rows * k; s++) {
    int64_t e = row_experts[s];
    if (e >= lo && e < lo + local) out->slot_index[fill[e - lo]++] = s;
  }
  st = XM_OK;
done:
  free(fill);
  if (st != XM_OK) xm_rt_rbd_local_plan_free(out);
  return st;
}

/* ---- row movement --------------------------------------------------------- */

void xm_rt_rbd_gather(const void *src, size_t row_bytes, const int64_t *index, int64_t n,
                      void *dst) {
  const char *s = src;
  char *d = dst;
  for (int64_t i = 0; i < n; i++)
    memcpy(d + (size_t)i * row_bytes, s + (size_t)index[i] * row_bytes, row_bytes);
}

void xm_rt_rbd_scatter_add(const float *src, int64_t h, const int64_t *index, int64_t n,
                           float *dst) {
  for (int64_t i = 0; i < n; i++) {
    float *d = dst + index[i] * h;
    const float *s = src + i * h;
    for (int64_t c = 0; c < h; c++)
      d[c] += s[c];
  }
}

void xm_rt_rbd_reduce_local(const xm_rt_rbd_local_plan_t *p, int64_t top_k, const float *expert_out,
                            const float *weights, int64_t h, float *partial) {
  if (p->rows * h > 0) memset(partial, 0, (size_t)(p->rows * h) * sizeof(float));
  for (int64_t m = 0; m < p->num_slots; m++) {
    int64_t s = p->slot_index[m];
    float w = weights[s];
    float *d = partial + (s / top_k) * h;
    const float *y = expert_out + m * h;
    for (int64_t c = 0; c < h; c++)
      d[c] += w * y[c];
  }
}

/* ---- volumes -------------------------------------------------------------- */

xm_status_t xm_rt_rbd_flat_counts(const xm_rt_rbd_config_t *c, const int32_t *experts,
                                  int64_t tokens, int64_t *out_send_counts,
                                  int64_t *out_inter_node_rows) {
  XM_RETURN_IF_ERROR(xm_rt_rbd_config_check(c));
  if (tokens < 0 || tokens > INT64_MAX / c->top_k) return XM_ERR_INVALID_INPUT;
  int64_t n = tokens * c->top_k;
  XM_RETURN_IF_ERROR(check_ids(c, experts, n));
  int own_node = xm_rt_rbd_node_of(c, c->ep_rank);
  memset(out_send_counts, 0, (size_t)c->ep * sizeof(int64_t));
  *out_inter_node_rows = 0;
  for (int64_t i = 0; i < n; i++) {
    if (experts[i] < 0) continue;
    int q = xm_rt_rbd_owner(c, experts[i]);
    out_send_counts[q]++;
    if (xm_rt_rbd_node_of(c, q) != own_node) (*out_inter_node_rows)++;
  }
  return XM_OK;
}

