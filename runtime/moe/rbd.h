/* runtime/moe/rbd.h — redundancy-bypassing dispatch (RBD) plans
 * (docs/design.md, Redundancy-bypassing dispatch).
 *
 * With fine-grained experts and a large top-k, one token often selects
 * several experts on the same node. RBD sends it across the network once
 * per destination node (the pilot row) and copies it inside the node over
 * the fast links (replicas). The functions here plan that movement as pure
 * functions over routing arrays; they do no communication, so the MPI code
 * (runtime/comm/comm.c), the generated schedule and the tests share them, and a
 * test can simulate every rank of an EP group in one process.
 *
 * One MoE layer on one EP group of `ep` ranks (EP rank i = world rank
 * ep_first_rank + i; node of a world rank = rank / ranks_per_node; expert e
 * lives on EP rank e / (experts / ep)):
 *
 *   dispatch  1. plan_send: per (token, destination node) with at least one
 *                selected expert there, one pilot row to a pilot rank of
 *                that node that holds one of those experts: the rank of the
 *                first such slot in slot order, or a pseudo-random choice
 *                among the ranks holding them (seeded by seed, step, source
 *                rank, token, node). Rows are ordered by destination EP
 *                rank: send_counts / send_offsets feed an all-to-all over
 *                the EP group. Each row carries the token's k expert ids
 *                and weights as metadata.
 *             2. plan_replicate (on the pilot rank, over the received rows'
 *                metadata): one replica row per other rank of this node that
 *                holds some of the token's experts (a rank owning several of
 *                them gets the row once), ordered by destination: an
 *                all-to-all over the EP group's ranks on this node.
 *             3. plan_local (every rank, over pilot rows + replica rows): the
 *                (row, slot) pairs whose expert lives here, stably sorted by
 *                local expert, for the padding-free grouped GEMMs (4.1).
 *   combine   the mirror: reduce_local sums w_j * f_{e_j}(x) over this
 *             rank's slots of each input row (rank-level pre-reduction);
 *             replica rows return to their pilot rank and are added to the
 *             pilot row (node-level pre-reduction, scatter_add with
 *             replica_src_row); pilot rows return to the source rank and are
 *             added to their token (scatter_add with pilot_token). So one
 *             row per (token, node) crosses the network in each direction.
 *
 * Slots with a negative expert id are dropped (capacity) and go nowhere.
 * Every plan owns its arrays; free it with its _free function (safe on a
 * zeroed plan). Sizes are int64_t; counts fit MPI's int after the caller's
 * check.
 */
#ifndef XM_RUNTIME_RBD_H
#define XM_RUNTIME_RBD_H

#include <stddef.h>
#include <stdint.h>

#include "support/rbd_copies.h"
#include "support/status.h"

typedef enum {
  XM_RT_RBD_PILOT_FIRST = 0,  /* the rank of the first slot on that node */
  XM_RT_RBD_PILOT_RANDOM = 1, /* hashed choice among the ranks holding the token's experts */
} xm_rt_rbd_pilot_rule_t;

typedef struct {
  int64_t experts;    /* E: routed experts of the layer; ep divides it */
  int64_t top_k;      /* k: slots per token */
  int ep;             /* EP group size */
  int ep_rank;        /* this rank's index in the EP group */
  int ep_first_rank;  /* world rank of EP rank 0 */
  int ranks_per_node; /* world ranks per node (>= 1) */
  xm_rt_rbd_pilot_rule_t rule;
  uint64_t seed; /* random rule only */
  int64_t step;  /* random rule only: the optimizer step */
} xm_rt_rbd_config_t;

/* XM_ERR_INVALID_INPUT when a field is out of range (ep < 1, ep not
 * dividing experts, ep_rank outside the group, top_k < 1, ...). */
xm_status_t xm_rt_rbd_config_check(const xm_rt_rbd_config_t *c);

/* EP rank owning expert e (contiguous ownership). */
static inline int xm_rt_rbd_owner(const xm_rt_rbd_config_t *c, int64_t e) {
  return (int)(e / (c->experts / c->ep));
}
/* Node of EP rank i, counted from the EP group's first node. */
static inline int xm_rt_rbd_node_of(const xm_rt_rbd_config_t *c, int ep_rank) {
  return (c->ep_first_rank + ep_rank) / c->ranks_per_node - c->ep_first_rank / c->ranks_per_node;
}
/* Nodes the EP group touches. */
static inline int xm_rt_rbd_num_nodes(const xm_rt_rbd_config_t *c) {
  return xm_rt_rbd_node_of(c, c->ep - 1) + 1;
}
/* The EP ranks on group node n: [*out_first, *out_first + *out_count). */
void xm_rt_rbd_node_ranks(const xm_rt_rbd_config_t *c, int node, int *out_first, int *out_count);

/* ---- stage 1: pilots (source side) ----------------------------------- */

typedef struct {
  int64_t tokens, top_k;
  int ep;
  int64_t num_pilots;      /* rows of the pilot all-to-all */
  int64_t *pilot_token;    /* [num_pilots] local token of each row, in send order */
  int32_t *pilot_dest;     /* [num_pilots] destination EP rank */
  int64_t *send_counts;    /* [ep] rows per destination EP rank */
  int64_t *send_offsets;   /* [ep + 1] exclusive prefix sums of send_counts */
  int64_t *slot_pilot;     /* [tokens * top_k] pilot row carrying slot t*k+j; -1 dropped */
  int64_t inter_node_rows; /* pilots to a node other than this rank's */
  int64_t slots;           /* slots kept (expert id >= 0) */
} xm_rt_rbd_send_plan_t;

/* Plans the pilots of `tokens` tokens routed to experts[tokens * top_k]
 * (int32 ids as xm_k_topk_route writes them; negative = dropped). Returns
 * XM_ERR_INVALID_INPUT for an id >= experts or a bad config,
 * XM_ERR_NO_MEMORY when allocation fails. */
xm_status_t xm_rt_rbd_plan_send(const xm_rt_rbd_config_t *c, const int32_t *experts, int64_t tokens,
                                xm_rt_rbd_send_plan_t *out);
void xm_rt_rbd_send_plan_free(xm_rt_rbd_send_plan_t *p);

/* ---- stage 2: replicas (pilot side) ----------------------------------- */

typedef struct {
  int64_t num_recv;            /* pilot rows received in stage 1 */
  int node_first;              /* EP rank of the intra-node group's member 0 */
  int node_ranks;              /* EP ranks on this node: the intra-node group */
  int64_t num_replicas;        /* rows of the intra-node all-to-all */
  int64_t *replica_src_row;    /* [num_replicas] received pilot row each replica copies */
  int32_t *replica_dest;       /* [num_replicas] destination EP rank (on this node) */
  int64_t *intra_send_counts;  /* [node_ranks] rows per intra-node member */
  int64_t *intra_send_offsets; /* [node_ranks + 1] */
  int64_t local_slots;         /* slots of received rows whose expert lives here */
  int64_t replica_slots;       /* slots of received rows served through replicas */
} xm_rt_rbd_recv_plan_t;

/* Plans the intra-node copies of the `num_recv` pilot rows this rank got;
 * recv_experts[num_recv * top_k] is their metadata (the token's expert
 * ids). XM_ERR_INVALID_INPUT when a row names no expert of this rank (a
 * pilot always lands on a rank holding one of its experts) or an id is out
 * of range. */
xm_status_t xm_rt_rbd_plan_replicate(const xm_rt_rbd_config_t *c, const int32_t *recv_experts,
                                     int64_t num_recv, xm_rt_rbd_recv_plan_t *out);
void xm_rt_rbd_recv_plan_free(xm_rt_rbd_recv_plan_t *p);

/* ---- stage 3: this rank's expert slots -------------------------------- */

typedef struct {
  int64_t rows;        /* input rows: pilot rows then replica rows */
  int64_t num_slots;   /* (row, slot) pairs computed on this rank */
  int64_t *slot_index; /* [num_slots] row * top_k + j, sorted by local expert (stable) */
  int64_t *tpe;        /* [experts / ep] slots per local expert */
} xm_rt_rbd_local_plan_t;

/* Collects the slots of `rows` input rows (metadata row_experts[rows *
 * top_k]) whose expert this rank owns. Every row must have one. */
xm_status_t xm_rt_rbd_plan_local(const xm_rt_rbd_config_t *c, const int32_t *row_experts,
                                 int64_t rows, xm_rt_rbd_local_plan_t *out);
void xm_rt_rbd_local_plan_free(xm_rt_rbd_local_plan_t *p);

/* ---- row movement (the local halves of the all-to-alls) ---------------- */

/* dst[i] = src[index[i]] for i < n; rows of row_bytes bytes (x rows,
 * metadata records). */
void xm_rt_rbd_gather(const void *src, size_t row_bytes, const int64_t *index, int64_t n,
                      void *dst);
/* dst[index[i]] += src[i], rows of h floats: the combine's pre-reductions
 * (replicas into pilots, pilots into tokens). */
void xm_rt_rbd_scatter_add(const float *src, int64_t h, const int64_t *index, int64_t n,
                           float *dst);
/* partial[r] = sum over this rank's slots (r, j) of weights[r*k+j] *
 * expert_out[m], where slot_index[m] = r*k+j; every input row is written
 * (zero when it has no slot here). expert_out is [num_slots, h] in the
 * plan's order, weights [rows * top_k] the rows' metadata. */
void xm_rt_rbd_reduce_local(const xm_rt_rbd_local_plan_t *p, int64_t top_k, const float *expert_out,
                            const float *weights, int64_t h, float *partial);

/* ---- volumes ----------------------------------------------------------- */

/* The flat (non-RBD) dispatch: one row per kept (token, expert) slot to the
 * expert's rank. out_send_counts[ep]; *out_inter_node_rows counts the slots
 * whose expert is on another node. */
xm_status_t xm_rt_rbd_flat_counts(const xm_rt_rbd_config_t *c, const int32_t *experts,
                                  int64_t tokens, int64_t *out_send_counts,
                                  int64_t *out_inter_node_rows);

/* Expected pilot rows per token when k distinct experts of E are chosen
 * uniformly and the experts are spread evenly over `nodes` nodes:
 * nodes * (1 - C(E - E/nodes, k) / C(E, k)). (E=256, k=8, 4 nodes: 3.61.) */
static inline double xm_rt_rbd_expected_copies(int64_t experts, int64_t top_k, int64_t nodes) {
  return xm_rbd_expected_copies(experts, top_k, nodes);
}

#endif /* XM_RUNTIME_RBD_H */
