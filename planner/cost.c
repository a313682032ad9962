/* planner/cost.c — the per-rank cost model of one training configuration
 * (planner/cost.h): memory by category, time per step by phase, bytes on
 * the wire. docs/cost-model.md states every formula; this file follows it.
 *
 * Nothing here builds a graph. The model mirrors what the compiler generates
 * for the xmoec policy — the shard pass's parameter split and gradient
 * groups (passes/shard.c, passes/autodiff.c), the tensors the memory plan
 * keeps for the backward (passes/plan_memory.c over ir/model.c's graph),
 * the runtime's collectives and their byte model (docs/traffic.md) — so the
 * predictions can be checked against a compiled program and the traffic it
 * logs (tests/e2e/cost_validation.sh). The baseline policies change the
 * dispatch mechanism (capacity-padded buffers, [T,E,C] masks, einsum
 * FLOPs, expert tensor parallelism, duplicate-token dropping) on the same
 * arithmetic.
 *
 * Structure of an evaluation:
 *   1. shape: tokens per rank per block, experts per rank, rows the expert
 *      GEMMs see and the rows their buffers hold, dtype sizes;
 *   2. the parameter table: every distinct tensor once with its multiplicity
 *      (layers), its per-rank size, the groups its gradient is summed over,
 *      its ZeRO-1 group and the group of its norm partial sum;
 *   3. memory: the table (weights, grads, optimizer), the activations kept
 *      for the backward plus the backward workspace, buffers, overhead;
 *   4. FLOPs per micro-batch, then time: compute, all-to-alls, TP/SSMB
 *      collectives, gradient reduction (only what the backward cannot hide),
 *      optimizer.
 * Groups are evaluated per distinct placement on the nodes (the residue of
 * the group's first rank modulo the node size) with a multiplicity, so the
 * cost of a 1024-rank configuration is a few thousand operations.
 */
#include "planner/cost.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/count.h"
#include "planner/routing.h"
#include "runtime/abi/bf16.h"
#include "runtime/abi/workspace.h"

/* ---- documented constants (docs/cost-model.md, "Constants") ------------------ */

#define ALIGN_BYTES 64.0 /* the memory plan's alignment */
#define XMOEC_BF16_KEPT_BYTES 3.0
#define MACHINE_BALANCE 150.0                 /* peak FLOP/s per byte/s of device memory */
#define DS_BUCKET_ELEMS 5e8                   /* DeepSpeed reduce/allgather bucket default */
#define DDP_BUCKET_BYTES (25.0 * 1024 * 1024) /* PyTorch DDP bucket_cap_mb */
#define MIN_CAPACITY 4.0                      /* DeepSpeed-MoE min_capacity */
#define MAX_RESIDUES 64                       /* distinct node placements tracked per family */

/* ---- names --------------------------------------------------------------------- */

static const char *const k_policy_names[XM_POLICY_COUNT] = {"xmoec", "x-moe", "deepspeed-moe",
                                                            "tutel", "deepspeed-ted"};

const char *xm_policy_name(xm_policy_t p) {
  return (unsigned)p < XM_POLICY_COUNT ? k_policy_names[p] : "?";
}

bool xm_policy_from_name(const char *name, xm_policy_t *out) {
  for (int p = 0; name && p < XM_POLICY_COUNT; p++)
    if (strcmp(name, k_policy_names[p]) == 0) {
      *out = (xm_policy_t)p;
      return true;
    }
  return false;
}

const char *xm_recompute_name(xm_recompute_t r) {
  switch (r) {
  case XM_RECOMPUTE_NONE: return "none";
  case XM_RECOMPUTE_MOE: return "moe";
  case XM_RECOMPUTE_FULL: return "full";
  }
  return "?";
}

void xm_cost_cluster(const xm_cluster_spec_t *c, xm_net_t *net, double *device_bytes,
                     double *peak_flops, double *gemm_efficiency) {
  xm_net_from_cluster(c, net);
  *device_bytes = c->device_memory_gib * 1024.0 * 1024.0 * 1024.0;
  *peak_flops = c->peak_tflops * 1e12;
  *gemm_efficiency = c->gemm_efficiency;
}

/* ---- group families ------------------------------------------------------------ */

/* All groups of one kind: `size` members `stride` apart, first ranks
 * inner*i + outer*j. Only the first rank modulo the node size decides how a
 * group lies on the nodes, so the groups are kept as distinct residues with
 * the number of groups that share each. */
typedef struct {
  int64_t stride, size, groups;
  int64_t inner_step, inner_n, outer_step, outer_n; /* as made: every group's first rank */
  int nres;
  int64_t res[MAX_RESIDUES];
  double mult[MAX_RESIDUES];
} family_t;

static void family_make(const xm_net_t *net, int64_t stride, int64_t size, int64_t inner_step,
                        int64_t inner_n, int64_t outer_step, int64_t outer_n, family_t *f) {
  memset(f, 0, sizeof *f);
  f->stride = size > 1 ? stride : 1;
  f->size = size;
  f->groups = inner_n * outer_n;
  f->inner_step = inner_step;
  f->inner_n = inner_n;
  f->outer_step = outer_step;
  f->outer_n = outer_n;
  int64_t R = net->ranks_per_node > 0 ? net->ranks_per_node : INT64_MAX / 4;
  if (size <= 1 || f->stride >= R) { /* every placement is the same */
    f->nres = 1;
    f->res[0] = 0;
    f->mult[0] = (double)f->groups;
    return;
  }
  for (int64_t j = 0; j < outer_n; j++)
    for (int64_t i = 0; i < inner_n; i++) {
      int64_t r = (j * outer_step + i * inner_step) % R;
      int k = 0;
      while (k < f->nres && f->res[k] != r)
        k++;
      if (k == f->nres) {
        if (f->nres == MAX_RESIDUES)
          k = MAX_RESIDUES - 1; /* approximate: share the last */
        else
          f->res[f->nres++] = r;
      }
      f->mult[k] += 1.0;
    }
}

static xm_net_group_t family_group(const family_t *f, int i) {
  return (xm_net_group_t){.first = f->res[i], .stride = f->stride, .size = f->size};
}

/* Bytes of all groups together, time of the slowest. */
typedef struct {
  double seconds, intra, inter;
} coll_t;

static xm_net_family_t net_family(const family_t *f) {
  return (xm_net_family_t){.stride = f->stride,
                           .size = f->size,
                           .inner_step = f->inner_step,
                           .inner_n = f->inner_n,
                           .outer_step = f->outer_step,
                           .outer_n = f->outer_n};
}

/* Bytes from the residues (exact, as the runtime counts them); no time. */
static coll_t ring_bytes(const xm_net_t *net, const family_t *f, xm_net_coll_t kind, double bytes) {
  coll_t out = {0, 0, 0};
  if (f->size < 2 || !(bytes > 0)) return out;
  for (int i = 0; i < f->nres; i++) {
    xm_net_cost_t c = xm_net_ring(net, kind, family_group(f, i), bytes);
    out.intra += f->mult[i] * c.intra_bytes;
    out.inter += f->mult[i] * c.inter_bytes;
  }
  return out;
}

/* The bytes, and the time of the whole family on pooled node NICs, the
 * network layer's fat-tree closed form (planner/network.h). */
static coll_t ring_family(const xm_net_t *net, const family_t *f, xm_net_coll_t kind,
                          double bytes) {
  coll_t out = ring_bytes(net, f, kind, bytes);
  if (f->size < 2 || !(bytes > 0)) return out;
  xm_net_family_t nf = net_family(f);
  out.seconds = xm_net_ring_family_seconds(net, kind, &nf, bytes);
  return out;
}

/* Same-node peer pairs summed over all members of all groups. */
static double family_same_node_pairs(const xm_net_t *net, const family_t *f) {
  double p = 0;
  for (int i = 0; i < f->nres; i++)
    p += f->mult[i] * xm_net_group_same_node_pairs(net, family_group(f, i));
  return p;
}

/* An all-to-all over every group of f, each member sending `intra` bytes
 * to peers of its node and `inter` to other nodes. */
static coll_t a2a_family(const xm_net_t *net, const family_t *f, double intra, double inter) {
  coll_t out = {0, 0, 0};
  if (f->size < 2) return out;
  for (int i = 0; i < f->nres; i++) {
    xm_net_cost_t c = xm_net_all_to_all(net, family_group(f, i), intra, inter);
    out.intra += f->mult[i] * c.intra_bytes;
    out.inter += f->mult[i] * c.inter_bytes;
  }
  xm_net_family_t nf = net_family(f);
  out.seconds = xm_net_a2a_family_seconds(net, &nf, intra, inter);
  return out;
}

/* ---- the evaluation context ---------------------------------------------------- */

typedef struct {
  const xm_spec_t *s;
  const xm_net_t *net;
  xm_cost_point_t pt;
  xm_layout_t l;
  xm_policy_t pol;
  int64_t world, dp, tp, ep;
  int64_t B, S, T, G; /* micro-batch, seq, tokens per micro-batch, micro-steps */
  /* Decoder layers by kind, DeepSeek-V3's MTP modules' layers included
   * (costed at the full T: each runs on T*(S-k)/S tokens, k <= D small
   * against S); mtp the modules, whose extras (eh_proj, three norms, one
   * more LM head each) are added apart. */
  int64_t L, Lmoe, Ldense, mtp;
  int64_t H, V, E, k, Fe, Fs, Fd, heads, kvh, D;
  int64_t local_experts;
  /* mechanisms */
  bool pft;       /* padding-free dispatch (xmoec, x-moe) */
  bool padded;    /* capacity-padded buffers (deepspeed-moe, tutel, ted) */
  bool masks;     /* [T,E,C] dispatch and combine masks + einsum (deepspeed-moe, ted) */
  bool ted;       /* experts split over TP, duplicate tokens dropped */
  bool ssmb, rbd; /* rbd: asked for and active (the EP group spans nodes) */
  bool shared_split;
  bool router_full; /* the router runs on all T tokens of the TP group */
  /* sizes */
  double ab, wb, gb, ob; /* bytes: activation, weight, gradient elements; optimizer per element */
  double cb;             /* bytes per element of the weights' working copy in the activations
                            (xmoec bf16: the compiled program's bf16 casts), else 0 */
  double kb;             /* bytes per activation element kept for the backward (ab, but for
                            xmoec bf16 the mean of its f32 values and their bf16 casts) */
  double Tm;             /* tokens an MoE block dispatches per rank */
  double Tr;             /* tokens the router scores per rank */
  double Ts;             /* tokens the shared experts see per rank */
  double C;              /* expert capacity (padded policies) */
  double rows_buf;       /* rows the expert buffers hold per rank */
  double rows_comp;      /* rows the expert GEMMs compute per rank (expected) */
  double fe_local;       /* expert FFN width per rank (TED splits it) */
  double imb;            /* measured routing: the busiest EP rank's rows / the mean (1: uniform) */
  /* The groups of each kind, by the table's kinds (frontend/layout.h);
   * only dp, tp, ep and edp are made, the others stay empty. */
  family_t fam[XM_GROUP_COUNT];
  xm_cost_colls_t *rec; /* xm_cost_collectives: every collective call is recorded here */
} cx_t;

/* Records one collective (`calls` per micro-batch when per_micro, else per
 * step) when the evaluation records them. */
static void record(const cx_t *c, xm_cost_comm_t cat, const char *phase, const family_t *f,
                   bool a2a, xm_net_coll_t kind, double bytes, double intra, double inter,
                   double calls, bool per_micro, double seconds) {
  xm_cost_colls_t *r = c->rec;
  if (!r || f->size < 2 || !(calls > 0)) return;
  if (r->n == r->cap) {
    int64_t cap = r->cap ? 2 * r->cap : 32;
    xm_cost_coll_t *v = realloc(r->v, (size_t)cap * sizeof *v);
    if (!v) {
      r->oom = true;
      return;
    }
    r->v = v;
    r->cap = cap;
  }
  r->v[r->n++] = (xm_cost_coll_t){.category = cat,
                                  .phase = phase,
                                  .all_to_all = a2a,
                                  .kind = kind,
                                  .stride = f->stride,
                                  .size = f->size,
                                  .inner_step = f->inner_step,
                                  .inner_n = f->inner_n,
                                  .outer_step = f->outer_step,
                                  .outer_n = f->outer_n,
                                  .bytes = bytes,
                                  .intra = intra,
                                  .inter = inter,
                                  .calls = calls * (per_micro ? (double)c->G : 1.0),
                                  .seconds = seconds};
}

static void record_ring(const cx_t *c, xm_cost_comm_t cat, const char *phase, const family_t *f,
                        xm_net_coll_t kind, double bytes, coll_t cl, double calls, bool per_micro) {
  if (bytes > 0) record(c, cat, phase, f, false, kind, bytes, 0, 0, calls, per_micro, cl.seconds);
}

void xm_cost_colls_free(xm_cost_colls_t *r) {
  free(r->v);
  memset(r, 0, sizeof *r);
}

static void err(xm_diag_t *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void err(xm_diag_t *d, const char *fmt, ...) {
  if (!d) return;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  xm_diag_add(d, XM_DIAG_ERROR, NULL, NULL, "cost model: %s", msg);
}

static double align_up(double bytes) { return ceil(bytes / ALIGN_BYTES) * ALIGN_BYTES; }

/* Refuses what cannot be costed; fills the shape. */
static xm_status_t setup(cx_t *c, const xm_spec_t *s, const xm_net_t *net,
                         const xm_cost_point_t *pt, const xm_cost_routing_t *rt, xm_diag_t *diag) {
  memset(c, 0, sizeof *c);
  c->s = s;
  c->net = net;
  c->pt = *pt;
  c->l = pt->layout;
  c->pol = pt->policy;
  const xm_model_spec_t *m = &s->model;
  const xm_moe_spec_t *moe = &s->moe;
  c->dp = c->l.dp;
  c->tp = c->l.tp;
  c->ep = c->l.ep;
  c->B = pt->micro_batch;
  c->S = s->training.seq_len;
  if ((unsigned)c->pol >= XM_POLICY_COUNT || (unsigned)pt->recompute >= XM_RECOMPUTE_COUNT) {
    err(diag, "unknown policy %d or recompute policy %d", (int)c->pol, (int)pt->recompute);
    return XM_ERR_INVALID_INPUT;
  }
  if (c->dp < 1 || c->tp < 1 || c->ep < 1 || c->B < 1 || c->S < 1) {
    err(diag, "dp %lld, tp %lld, ep %lld and micro_batch %lld must be positive", (long long)c->dp,
        (long long)c->tp, (long long)c->ep, (long long)c->B);
    return XM_ERR_INVALID_INPUT;
  }
  c->world = c->dp * c->tp;
  int64_t ranks = net->nodes * net->ranks_per_node;
  if (c->world > ranks) {
    err(diag, "the layout needs %lld ranks, the cluster has %lld", (long long)c->world,
        (long long)ranks);
    return XM_ERR_INVALID_INPUT;
  }
  c->T = c->B * c->S;
  if (s->training.global_batch % (c->B * c->dp) != 0) {
    err(diag, "global_batch (%lld) must be a multiple of micro_batch*dp (%lld * %lld)",
        (long long)s->training.global_batch, (long long)c->B, (long long)c->dp);
    return XM_ERR_INVALID_INPUT;
  }
  c->G = s->training.global_batch / (c->B * c->dp);
  c->L = m->layers;
  c->Ldense = moe->experts == 0 ? c->L : (m->first_k_dense < c->L ? m->first_k_dense : c->L);
  c->Lmoe = c->L - c->Ldense;
  c->mtp = m->mtp_layers;
  if (moe->experts > 0)
    c->Lmoe += c->mtp;
  else
    c->Ldense += c->mtp;
  c->L += c->mtp;
  c->H = m->hidden;
  c->V = m->vocab;
  c->E = moe->experts;
  c->k = moe->top_k;
  c->Fe = moe->expert_ffn;
  c->Fs = moe->shared_experts > 0 ? moe->shared_ffn : 0;
  c->Fd = m->dense_ffn;
  c->heads = m->heads;
  c->kvh = m->kv_heads;
  c->D = m->head_dim;

  /* What the policies can express (docs/cost-model.md, "Policies"). */
  bool xm = c->pol == XM_POLICY_XMOEC || c->pol == XM_POLICY_XMOE;
  c->pft = xm;
  c->padded = !xm;
  c->masks = c->pol == XM_POLICY_DEEPSPEED_MOE || c->pol == XM_POLICY_DEEPSPEED_TED;
  c->ted = c->pol == XM_POLICY_DEEPSPEED_TED;
  if (!xm && (c->l.ssmb || c->l.rbd)) {
    err(diag, "%s has no %s", xm_policy_name(c->pol), c->l.ssmb ? "SSMB" : "RBD");
    return XM_ERR_INVALID_INPUT;
  }
  if (c->l.ssmb && (c->tp < 2 || c->Lmoe == 0 || c->T % c->tp != 0)) {
    err(diag, "ssmb needs tp > 1, MoE layers and micro_batch*seq_len (%lld) divisible by tp (%lld)",
        (long long)c->T, (long long)c->tp);
    return XM_ERR_INVALID_INPUT;
  }
  if (c->ep > 1 && (c->E == 0 || c->E % c->ep != 0)) {
    err(diag, "ep (%lld) must divide the routed experts (%lld)", (long long)c->ep, (long long)c->E);
    return XM_ERR_INVALID_INPUT;
  }
  /* xmoec's EP groups are consecutive ranks (token-parallel ranks with tp
   * inside them under SSMB); the baselines build EP groups over the
   * data-parallel ranks of one TP index. */
  if (xm ? c->world % c->ep != 0 : c->dp % c->ep != 0) {
    err(diag, "ep (%lld) must divide %s (%lld)", (long long)c->ep, xm ? "dp*tp" : "dp",
        (long long)(xm ? c->world : c->dp));
    return XM_ERR_INVALID_INPUT;
  }
  if (xm && c->ep > 1 && c->tp > 1 && !c->l.ssmb) {
    err(diag,
        "ep (%lld) with tp (%lld) needs ssmb for %s: the TP ranks would dispatch the same "
        "tokens tp times",
        (long long)c->ep, (long long)c->tp, xm_policy_name(c->pol));
    return XM_ERR_INVALID_INPUT;
  }
  if (m->attention != XM_ATTN_MLA && (c->heads % c->tp != 0 || c->kvh % c->tp != 0)) {
    err(diag, "tp (%lld) must divide heads (%lld) and kv_heads (%lld)", (long long)c->tp,
        (long long)c->heads, (long long)c->kvh);
    return XM_ERR_INVALID_INPUT;
  }
  if (m->attention == XM_ATTN_MLA && c->heads % c->tp != 0) {
    err(diag, "tp (%lld) must divide heads (%lld)", (long long)c->tp, (long long)c->heads);
    return XM_ERR_INVALID_INPUT;
  }
  if (c->Ldense > 0 && c->Fd % c->tp != 0) {
    err(diag, "tp (%lld) must divide dense_ffn (%lld)", (long long)c->tp, (long long)c->Fd);
    return XM_ERR_INVALID_INPUT;
  }
  if (c->ted && c->Fe % c->tp != 0) {
    err(diag, "deepspeed-ted splits experts over tp (%lld), which must divide expert_ffn (%lld)",
        (long long)c->tp, (long long)c->Fe);
    return XM_ERR_INVALID_INPUT;
  }
  xm_layout_t l = c->l;
  l.ranks_per_node = net->ranks_per_node;
  c->rbd = l.rbd && xm_layout_rbd_active(&l);
  c->local_experts = c->E > 0 ? c->E / c->ep : 0;
  /* X-MoE's reference code runs RBD only with one local expert and
   * without SSMB (docs/design.md, Redundancy-bypassing dispatch). */
  if (c->pol == XM_POLICY_XMOE && c->rbd && c->local_experts > 1) {
    err(diag, "x-moe runs RBD only with one local expert per rank (experts/ep = %lld)",
        (long long)c->local_experts);
    return XM_ERR_INVALID_INPUT;
  }
  if (c->pol == XM_POLICY_XMOE && c->rbd && c->l.ssmb) {
    err(diag, "x-moe cannot combine RBD with SSMB");
    return XM_ERR_INVALID_INPUT;
  }
  c->ssmb = c->l.ssmb;
  c->imb = 1.0;

  /* Dtypes: the runtime trains in fp32 (weights, grads, m, v); bf16/fp16
   * keep 2-byte weights, grads and activations and fp32 master weights,
   * m and v (12 bytes per element). */
  bool f32 = s->training.dtype == XM_DTYPE_FP32;
  c->ab = f32 ? 4 : 2;
  c->wb = c->ab;
  c->gb = c->ab;
  c->ob = f32 ? 8 : 12;
  c->cb = 0;
  c->kb = c->ab;
  /* What `xmoec compile` builds for bf16 (passes/mixed_precision.c): f32
   * master weights and f32 gradients in the persistent arena, m and v
   * (8 bytes, sharded by ZeRO-1), and each GEMM weight cast to bf16 once
   * per micro-batch, the copy alive from its forward GEMM to its last
   * backward one: 2 bytes per element in the activation arena. */
  if (!f32 && c->pol == XM_POLICY_XMOEC) {
    c->wb = 4;
    c->gb = 4;
    c->ob = 8;
    c->cb = 2;
    c->ab = 4;
    c->kb = XMOEC_BF16_KEPT_BYTES;
  }

  /* Tokens per rank in each part of an MoE layer. */
  c->Tm = c->ssmb || c->ted ? (double)c->T / (double)c->tp : (double)c->T;
  c->router_full = c->pol == XM_POLICY_XMOEC; /* xmoec routes the whole batch under SSMB */
  c->Tr = c->router_full ? (double)c->T : c->Tm;
  c->Ts = c->ted ? (double)c->T : c->Tm; /* TED keeps the shared experts TP-parallel on all T */
  c->shared_split = c->tp > 1 && !c->ssmb && c->Fs > 0 && c->Fs % c->tp == 0;
  c->fe_local = c->ted ? (double)c->Fe / (double)c->tp : (double)c->Fe;
  double N = c->Tm * (double)c->k;
  if (c->padded && c->E > 0) {
    double cf = s->moe.has_capacity ? s->moe.capacity_factor : 1.0;
    c->C = ceil(cf * N / (double)c->E - 1e-9);
    if (c->C < MIN_CAPACITY) c->C = MIN_CAPACITY;
    c->rows_comp = (double)c->E * c->C;        /* padding is computed too */
    if (c->ted) c->rows_comp *= (double)c->tp; /* gathered over TP, each computes F/tp */
    c->rows_buf = c->rows_comp;
  } else {
    c->rows_comp = N; /* expected rows received = rows sent */
    /* The runtime's static arena bounds what one rank can receive by
     * min(ep, dispatch_bound) times what it sends (passes/shard.c; exact up
     * to ep = dispatch_bound); X-MoE allocates what arrives. */
    int64_t B = pt->dispatch_bound > 0 ? pt->dispatch_bound : 4;
    c->rows_buf = c->pol == XM_POLICY_XMOEC && c->ep > 1 ? (double)(c->ep < B ? c->ep : B) * N : N;
    /* A measured routing (docs/cost-model.md, "Measured routing"): the
     * busiest EP rank receives and computes imb times the mean; xmoec's
     * static buffers must hold the worst layer's, X-MoE's grow. */
    if (rt && rt->measured && c->ep > 1 && c->E > 0) {
      c->imb = xm_routing_imbalance(rt->measured, c->ep, false);
      double worst = xm_routing_imbalance(rt->measured, c->ep, true);
      int64_t hold = c->ep < B ? c->ep : B;
      if (c->pol == XM_POLICY_XMOEC && worst > (double)hold * (1 + 1e-9)) {
        err(diag,
            "routing: the busiest EP rank gets %.2fx its fair share, over the receive "
            "buffers' min(ep, %lld) = %lldx (--dispatch-bound %lld holds it)",
            worst, (long long)B, (long long)hold, (long long)ceil(worst - 1e-9));
        return XM_ERR_INVALID_INPUT;
      }
      c->rows_comp = c->imb * N;
      if (c->pol == XM_POLICY_XMOE) c->rows_buf = c->imb * N;
    }
  }

  /* Group families. xmoec: TP consecutive, DP strided by tp, EP consecutive,
   * EDP strided by ep (frontend/layout.h). Baselines: EP over the DP ranks
   * of one TP index (stride tp), EDP the rest of those. */
  family_make(net, 1, c->tp, c->tp, c->world / c->tp, 0, 1, &c->fam[XM_GROUP_TP]);
  family_make(net, c->tp, c->dp, 1, c->tp, 0, 1, &c->fam[XM_GROUP_DP]);
  if (xm) {
    family_make(net, 1, c->ep, c->ep, c->world / c->ep, 0, 1, &c->fam[XM_GROUP_EP]);
    family_make(net, c->ep, c->world / c->ep, 1, c->ep, 0, 1, &c->fam[XM_GROUP_EDP]);
  } else {
    family_make(net, c->tp, c->ep, 1, c->tp, c->ep * c->tp, c->dp / c->ep, &c->fam[XM_GROUP_EP]);
    family_make(net, c->ep * c->tp, c->dp / c->ep, 1, c->ep * c->tp, 0, 1, &c->fam[XM_GROUP_EDP]);
  }
  return XM_OK;
}

/* ---- the parameter table --------------------------------------------------------- */

/* One distinct parameter tensor (all layers of a kind share a row). */
typedef struct {
  double numel; /* elements per rank */
  double count; /* tensors like it (layers) */
  bool trainable;
  int reduce[2]; /* groups its gradient is summed over, -1 = none */
  int zero;      /* ZeRO-1 group, -1 = none */
  int split;     /* group it is sliced over (its norm partial differs there), -1 = none */
} tensor_t;

#define MAX_TENSORS 48

typedef struct {
  tensor_t t[MAX_TENSORS];
  int n;
} table_t;

static int64_t group_size(const cx_t *c, int g) { return g < 0 ? 1 : c->fam[g].size; }

/* Adds a tensor of `numel` global elements sliced `parts` ways over
 * `split`; reduce groups and the ZeRO group as passes/shard.c sets them
 * (groups of one member are dropped, as there). */
static void add_tensor(const cx_t *c, table_t *tb, double numel, double count, int split,
                       double parts, int r0, int r1, int zero_g, bool trainable) {
  if (numel <= 0 || count <= 0) return;
  XM_ASSERT(tb->n < MAX_TENSORS);
  tensor_t *t = &tb->t[tb->n++];
  t->numel = numel / (parts > 1 ? parts : 1);
  t->count = count;
  t->trainable = trainable;
  t->split = parts > 1 ? split : -1;
  t->reduce[0] = group_size(c, r0) > 1 ? r0 : -1;
  t->reduce[1] = group_size(c, r1) > 1 ? r1 : -1;
  t->zero = c->l.zero && trainable && group_size(c, zero_g) > 1 ? zero_g : -1;
  /* The ZeRO group's reduction is the reduce-scatter, not an all-reduce. */
  for (int i = 0; i < 2; i++)
    if (t->reduce[i] == t->zero) t->reduce[i] = -1;
}

/* Attention parameters of one layer (per layer count `n`). */
static void attention_tensors(const cx_t *c, table_t *tb, double n) {
  const xm_model_spec_t *m = &c->s->model;
  double H = (double)c->H, tp = (double)c->tp;
  if (m->attention == XM_ATTN_MLA) {
    /* Split by heads like Megatron: q_b, kv_b, o over TP; the low-rank
     * down projections and their norms whole. */
    double qk = (double)(m->qk_nope_head_dim + m->qk_rope_head_dim), hd = (double)c->heads;
    if (m->q_lora_rank > 0) {
      add_tensor(c, tb, H * (double)m->q_lora_rank, n, -1, 1, XM_GROUP_DP, -1, XM_GROUP_DP, true);
      add_tensor(c, tb, (double)m->q_lora_rank, n, -1, 1, XM_GROUP_DP, -1, XM_GROUP_DP, true);
      add_tensor(c, tb, (double)m->q_lora_rank * hd * qk, n, XM_GROUP_TP, tp, XM_GROUP_DP, -1,
                 XM_GROUP_DP, true);
    } else {
      add_tensor(c, tb, H * hd * qk, n, XM_GROUP_TP, tp, XM_GROUP_DP, -1, XM_GROUP_DP, true);
    }
    add_tensor(c, tb, H * (double)(m->kv_lora_rank + m->qk_rope_head_dim), n, -1, 1, XM_GROUP_DP,
               -1, XM_GROUP_DP, true);
    add_tensor(c, tb, (double)m->kv_lora_rank, n, -1, 1, XM_GROUP_DP, -1, XM_GROUP_DP, true);
    add_tensor(c, tb, (double)m->kv_lora_rank * hd * (double)(m->qk_nope_head_dim + m->v_head_dim),
               n, XM_GROUP_TP, tp, XM_GROUP_DP, -1, XM_GROUP_DP, true);
    add_tensor(c, tb, hd * (double)m->v_head_dim * H, n, XM_GROUP_TP, tp, XM_GROUP_DP, -1,
               XM_GROUP_DP, true);
    return;
  }
  double qd = (double)(c->heads * c->D), kvd = (double)(c->kvh * c->D);
  add_tensor(c, tb, qd * H, n, XM_GROUP_TP, tp, XM_GROUP_DP, -1, XM_GROUP_DP, true);
  add_tensor(c, tb, kvd * H, 2 * n, XM_GROUP_TP, tp, XM_GROUP_DP, -1, XM_GROUP_DP, true);
  if (m->attention_bias) {
    add_tensor(c, tb, qd, n, XM_GROUP_TP, tp, XM_GROUP_DP, -1, XM_GROUP_DP, true);
    add_tensor(c, tb, kvd, 2 * n, XM_GROUP_TP, tp, XM_GROUP_DP, -1, XM_GROUP_DP, true);
  }
  if (m->qk_norm == XM_QK_NORM_HEAD) /* applied to this rank's heads: partial over TP */
    add_tensor(c, tb, (double)c->D, 2 * n, -1, 1, XM_GROUP_DP, XM_GROUP_TP, XM_GROUP_DP, true);
  if (m->qk_norm == XM_QK_NORM_FULL) {
    add_tensor(c, tb, qd, n, -1, 1, XM_GROUP_DP, -1, XM_GROUP_DP, true);
    add_tensor(c, tb, kvd, n, -1, 1, XM_GROUP_DP, -1, XM_GROUP_DP, true);
  }
  add_tensor(c, tb, H * qd, n, XM_GROUP_TP, tp, XM_GROUP_DP, -1, XM_GROUP_DP, true);
}

static void build_table(const cx_t *c, table_t *tb) {
  const xm_spec_t *s = c->s;
  double H = (double)c->H, tp = (double)c->tp, L = (double)c->L;
  tb->n = 0;
  add_tensor(c, tb, (double)c->V * H, s->model.tied_embeddings ? 1 : 2, -1, 1, XM_GROUP_DP, -1,
             XM_GROUP_DP, true);
  /* final + per-layer norms, and each MTP module's enorm, hnorm and
   * shared_head.norm */
  add_tensor(c, tb, H, 1 + 2 * L + 3 * (double)c->mtp, -1, 1, XM_GROUP_DP, -1, XM_GROUP_DP, true);
  add_tensor(c, tb, 2 * H * H, (double)c->mtp, -1, 1, XM_GROUP_DP, -1, XM_GROUP_DP,
             true); /* eh_proj */
  attention_tensors(c, tb, L);
  if (c->Ldense > 0)
    add_tensor(c, tb, (double)c->Fd * H, 3 * (double)c->Ldense, XM_GROUP_TP, tp, XM_GROUP_DP, -1,
               XM_GROUP_DP, true);
  if (c->Lmoe == 0) return;
  double n = (double)c->Lmoe;
  add_tensor(c, tb, (double)c->E * H, n, -1, 1, XM_GROUP_DP, -1, XM_GROUP_DP, true); /* router */
  if (s->moe.aux_free_gamma > 0 || s->moe.scoring == XM_SCORING_SIGMOID)
    add_tensor(c, tb, (double)c->E, n, -1, 1, -1, -1, -1, false); /* correction bias */
  /* Routed experts: sliced over EP (and over TP for TED); summed over the
   * token-parallel ranks holding the same slice. */
  int mats = s->moe.activation == XM_ACT_GELU ? 2 : 3;
  bool edp = !c->pft || c->ssmb || c->tp == 1;
  double parts = (double)c->ep * (c->ted ? tp : 1);
  int rg = edp ? XM_GROUP_EDP : XM_GROUP_DP;
  if (c->ep > 1 || c->ted) {
    add_tensor(c, tb, (double)c->E * (double)c->Fe * H, mats * n,
               c->ep > 1 ? XM_GROUP_EP : XM_GROUP_TP, parts, rg, -1, rg, true);
  } else {
    add_tensor(c, tb, (double)c->E * (double)c->Fe * H, mats * n, -1, 1, rg, -1, rg, true);
  }
  if (c->Fs > 0) {
    if (c->shared_split || c->ted)
      add_tensor(c, tb, (double)c->Fs * H, 3 * n, XM_GROUP_TP, tp, XM_GROUP_DP, -1, XM_GROUP_DP,
                 true);
    else if (c->ssmb) /* computed on this rank's token slice: partial over TP */
      add_tensor(c, tb, (double)c->Fs * H, 3 * n, -1, 1, XM_GROUP_DP, XM_GROUP_TP, XM_GROUP_DP,
                 true);
    else
      add_tensor(c, tb, (double)c->Fs * H, 3 * n, -1, 1, XM_GROUP_DP, -1, XM_GROUP_DP, true);
  }
  if (s->moe.shared_expert_gate) /* reduced over tp too under ssmb, as passes/shard.c does */
    add_tensor(c, tb, H, n, -1, 1, XM_GROUP_DP, c->ssmb ? XM_GROUP_TP : -1, XM_GROUP_DP, true);
}

/* ---- memory ------------------------------------------------------------------ */

static void table_memory(const cx_t *c, const table_t *tb, xm_cost_t *o, double *out_params,
                         double *out_grad_elems) {
  double w = 0, g = 0, opt = 0, params = 0, gel = 0;
  for (int i = 0; i < tb->n; i++) {
    const tensor_t *t = &tb->t[i];
    w += t->count * align_up(t->numel * c->wb);
    if (!t->trainable) continue;
    g += t->count * align_up(t->numel * c->gb);
    gel += t->count * t->numel;
    double chunk = t->numel;
    if (t->zero >= 0) chunk = ceil(t->numel / (double)group_size(c, t->zero));
    params += t->count * chunk;
    /* m and v (and the fp32 master copy) as separate 4-byte states */
    opt += t->count * (c->ob / 4.0) * align_up(chunk * 4.0);
  }
  /* The aux-free load counters (int32 [E] per MoE layer) live with the optimizer. */
  if (c->Lmoe > 0 && c->s->moe.aux_free_gamma > 0)
    opt += (double)c->Lmoe * align_up((double)c->E * 4.0);
  o->weights = w;
  o->grads = g;
  o->optimizer = opt;
  /* The bf16 working copies: every trained matrix but an untied embedding
   * table (a lookup, not a GEMM); norms and biases are vectors, also
   * copied where a GEMM reads them, and left out (under 0.1%). Under full
   * recompute a layer's casts are forward ops the pass runs again, so only
   * the layer being rebuilt holds its copies (the layers' mean), besides
   * the LM head's. */
  if (c->cb > 0) {
    double head = (double)c->V * (double)c->H, mats = gel - head;
    if (mats < 0) mats = 0;
    if (c->pt.recompute == XM_RECOMPUTE_FULL && c->L > 0) mats /= (double)c->L;
    o->activations += c->cb * (mats + head);
  }
  *out_params = params;
  *out_grad_elems = gel;
}

/* Elements of the attention block kept for the backward, per layer. */
static double attention_saved(const cx_t *c) {
  const xm_model_spec_t *m = &c->s->model;
  double T = (double)c->T, H = (double)c->H, tp = (double)c->tp;
  double e = 4 * T * H; /* layer input, normed input, h = x + attn, normed h */
  if (m->attention == XM_ATTN_MLA) {
    double qk = (double)(m->qk_nope_head_dim + m->qk_rope_head_dim), hd = (double)c->heads / tp;
    e += 2 * T * (double)(m->q_lora_rank + m->kv_lora_rank + m->qk_rope_head_dim);
    e += T * hd * (2 * qk + 2 * (double)m->v_head_dim);
    return e;
  }
  double q = T * (double)(c->heads * c->D) / tp, kv = T * (double)(c->kvh * c->D) / tp;
  e += 2 * q + 2 * kv;                            /* q, k after RoPE, v, attention output */
  if (m->qk_norm != XM_QK_NORM_NONE) e += q + kv; /* the norms' inputs */
  return e;
}

/* Bytes of one MoE block kept for the backward; `ffn` gets the expert FFN
 * intermediates among them (what recompute "moe" drops). */
static double moe_saved_bytes(const cx_t *c, double *ffn) {
  double H = (double)c->H, k = (double)c->k, E = (double)c->E, ab = c->kb;
  double N = c->Tm * k;
  int nm = c->s->moe.activation == XM_ACT_GELU ? 2 : 3;
  double b = c->Tr * E * 4 + 2 * c->Tr * k * 4;     /* scores (fp32), expert ids, weights */
  b += N * 4 + E * 4;                               /* slot order, tokens per expert */
  if (c->ssmb) b += c->Tm * H * ab + c->Tm * k * 4; /* this rank's token slice */
  if (c->masks) b += c->Tm * E * c->C * 5;          /* combine weights fp32 + dispatch mask */
  *ffn = c->rows_buf * c->fe_local * nm * ab;
  b += *ffn; /* expert FFN intermediates */
  if (c->Fs > 0) {
    double fs = c->shared_split || c->ted ? (double)c->Fs / (double)c->tp : (double)c->Fs;
    b += 3 * c->Ts * fs * ab;
  }
  /* xmoec with its experts local (ep 1): fuse-permute-gemm reads the
   * tokens through the slot index and combines in the down GEMM's
   * epilogue, so neither the gathered rows nor the expert output exist. */
  if (c->pol == XM_POLICY_XMOEC && c->ep == 1) return b;
  /* The expert input rows (under xmoec bf16 their bf16 cast: the GEMMs
   * read it, and the f32 rows as received die with the cast). */
  b += c->rows_buf * H * (c->cb > 0 ? c->cb : ab);
  /* The expert output the combine's backward reads: xmoec's flat EP keeps
   * the rows returned to the source, RBD and one rank the expert-side rows. */
  if (c->pft && c->ep > 1 && !c->rbd && c->pol == XM_POLICY_XMOEC)
    b += N * H * ab;
  else
    b += (c->ted ? c->rows_buf / (double)c->tp : c->rows_buf) * H * ab;
  return b;
}

static void activation_memory(const cx_t *c, xm_cost_t *o, double grad_elems) {
  double T = (double)c->T, H = (double)c->H, V = (double)c->V, ab = c->kb;
  double attn = attention_saved(c) * ab;
  double dense = c->Ldense > 0 ? attn + 3 * T * (double)c->Fd / (double)c->tp * ab : 0;
  double ffn = 0, moe = c->Lmoe > 0 ? attn + moe_saved_bytes(c, &ffn) : 0;
  /* The head: the last output and its norm, the tokens and labels, and
   * the logits, except under xmoec, whose fuse-lm-head pass makes them one
   * chunk of the vocabulary at a time and keeps two floats per row (the
   * stats) for the backward. */
  const bool fused_head = c->pol == XM_POLICY_XMOEC;
  double chunk = (double)xm_lm_ce_chunk(c->V, c->H);
  double head = 2 * T * H * ab + 2 * T * 4 + (fused_head ? 2 * T * 4 : T * V * ab);
  /* Each MTP module: its two input slices and their concatenation (kept
   * by the norms' and eh_proj's backward) and a head of its own. */
  head += (double)c->mtp * (4 * T * H * ab + head);

  double saved, ws_layer;
  switch (c->pt.recompute) {
  case XM_RECOMPUTE_FULL:
    /* Only each layer's input is kept; one layer is rebuilt at a time. */
    saved = (double)c->L * T * H * ab + head;
    ws_layer = dense > moe ? dense : moe;
    break;
  case XM_RECOMPUTE_MOE:
    saved = (double)c->Ldense * dense + (double)c->Lmoe * (moe - ffn) + head;
    ws_layer = ffn;
    break;
  default:
    saved = (double)c->Ldense * dense + (double)c->Lmoe * moe + head;
    ws_layer = 0;
    break;
  }
  /* Backward workspace at the peak: the logits' gradient and the head's
   * input gradient at the start of the backward, or later the gradient rows
   * of an MoE block in flight, by which time the head's saved tensors are
   * gone; whichever is larger, plus what is being recomputed. */
  /* fused: the op's scratch (one f32 chunk of logits and 4 floats a row),
   * its f32 dx and, under bf16, its workspace (xm_bf16_lm_ce_ws_floats) */
  double ws_head = T * V * ab + T * H * ab;
  if (fused_head)
    ws_head = T * (chunk + 4) * 4 + T * H * 4 +
              (ab == 2 ? 4 * (double)xm_bf16_lm_ce_ws_floats(c->T, c->H, (int64_t)chunk, 1) : 0);
  double ws = ws_head;
  if (c->Lmoe > 0) {
    double N = c->Tm * (double)c->k, rows;
    if (c->padded)
      rows = 2 * c->rows_buf; /* received, regrouped */
    else if (c->ep == 1)
      rows = c->pol == XM_POLICY_XMOEC ? 0 : 2 * N; /* gathered rows' gradient (fused: none) */
    else if (c->rbd)
      rows = c->rows_buf + N; /* drows, dx rows */
    else
      rows = 2 * c->rows_buf + N; /* a2a, unsort, back */
    double ws_moe = rows * H * ab - (head - 2 * T * 4);
    if (ws_moe > ws) ws = ws_moe;
  }
  ws += ws_layer;
  /* The all-to-all receive buffers (the rows an MoE block received, kept
   * for its backward) are reported as buffers, the rest as activations:
   * every MoE layer's without full recompute, one layer's (the one being
   * rebuilt) with it. */
  double recv = c->ep > 1 && c->Lmoe > 0 ? c->rows_buf * H * (c->cb > 0 ? c->cb : ab) : 0;
  /* xmoec bf16: one layer's f32 rows as received, alive until the cast. */
  if (c->cb > 0 && c->Lmoe > 0) ws += c->rows_buf * H * c->ab;
  if (c->pt.recompute == XM_RECOMPUTE_FULL)
    recv = moe >= dense ? recv : 0;
  else
    recv *= (double)c->Lmoe;
  o->activations += saved + ws - recv;

  /* Buffers outside the memory plan: gradient-reduction buckets of the
   * DeepSpeed-based policies and of PyTorch DDP (tutel); xmoec reduces the
   * gradients in place. */
  double buckets = 0;
  if (c->pol == XM_POLICY_TUTEL) {
    buckets = grad_elems * c->gb < DDP_BUCKET_BYTES ? grad_elems * c->gb : DDP_BUCKET_BYTES;
  } else if (c->pol != XM_POLICY_XMOEC) {
    double e = grad_elems < DS_BUCKET_ELEMS ? grad_elems : DS_BUCKET_ELEMS;
    buckets = e * c->gb * (c->l.zero ? 2 : 1); /* reduce bucket (+ ZeRO all-gather bucket) */
  }
  o->buffers = recv + buckets;
}

/* ---- FLOPs ------------------------------------------------------------------- */

typedef struct {
  double attn, dense, moe_experts, moe_other, head;
  /* Of those, the last GEMMs of the FFNs whose outputs only the residual
   * add reads (dense and shared down projections; with the fused combine,
   * one rank per EP group, the expert down projection): xmoec's full
   * recompute does not run them again. */
  double fed_to_residual;
} flops_t;

/* Forward FLOPs of one micro-batch on one rank, per part. */
static flops_t forward_flops(const cx_t *c) {
  const xm_model_spec_t *m = &c->s->model;
  flops_t f = {0, 0, 0, 0, 0, 0};
  double T = (double)c->T, H = (double)c->H, tp = (double)c->tp, S = (double)c->S;
  double ctx = (S + 1) / 2; /* causal: token t attends to t+1 keys */
  double per_layer;
  if (m->attention == XM_ATTN_MLA) {
    double qk = (double)(m->qk_nope_head_dim + m->qk_rope_head_dim), hd = (double)c->heads;
    double ql = (double)m->q_lora_rank, kvl = (double)m->kv_lora_rank;
    double proj = (ql > 0 ? H * ql + ql * hd * qk / tp : H * hd * qk / tp) +
                  H * (kvl + (double)m->qk_rope_head_dim) +
                  kvl * hd * (double)(m->qk_nope_head_dim + m->v_head_dim) / tp +
                  hd * (double)m->v_head_dim * H / tp;
    per_layer = 2 * T * proj + 2 * T * (hd / tp) * (qk + (double)m->v_head_dim) * ctx;
  } else {
    double qd = (double)(c->heads * c->D), kvd = (double)(c->kvh * c->D);
    per_layer = 2 * T * H * (2 * qd + 2 * kvd) / tp +
                2 * T * (double)(c->heads / c->tp) * (2 * (double)c->D) * ctx;
  }
  f.attn = (double)c->L * per_layer;
  f.dense = (double)c->Ldense * 2 * T * H * (double)c->Fd / tp * 3;
  f.fed_to_residual = f.dense / 3;
  if (c->Lmoe > 0) {
    double n = (double)c->Lmoe, E = (double)c->E;
    int nm = c->s->moe.activation == XM_ACT_GELU ? 2 : 3;
    f.moe_experts = n * 2 * c->rows_comp * H * c->fe_local * nm;
    /* fuse-permute-gemm folds the combine into the down GEMM when the
     * experts are local (no all-to-all between them and the tokens) */
    if (c->ep == 1) f.fed_to_residual += f.moe_experts / nm;
    double other = 2 * c->Tr * H * E; /* router */
    if (c->Fs > 0) {
      double shared = 2 * c->Ts * H * (double)c->Fs * 3 / (c->shared_split || c->ted ? tp : 1);
      other += shared;
      f.fed_to_residual += n * shared / 3;
    }
    if (c->masks) other += 2 * (2 * c->Tm * E * c->C * H); /* dispatch and combine einsums */
    f.moe_other = n * other;
  }
  /* the LM head once more per MTP module, and its eh_proj [H, 2H] */
  f.head = (1 + (double)c->mtp) * 2 * T * H * (double)c->V + (double)c->mtp * 2 * T * 2 * H * H;
  return f;
}

/* ---- communication ------------------------------------------------------------- */

typedef struct {
  double dispatch_intra, dispatch_inter, ar_intra, ar_inter, ag_intra, ag_inter, rs_intra, rs_inter;
  double t_dispatch, t_tp, t_reduce, t_gather;
} comm_t;

static void add_coll(double *intra, double *inter, coll_t cl, double times) {
  *intra += times * cl.intra;
  *inter += times * cl.inter;
}

/* Expert all-to-alls of one micro-batch over all MoE layers (bytes of all
 * ranks; time of one rank). */
static void dispatch_comm(const cx_t *c, const xm_cost_routing_t *rt, bool recompute_fwd,
                          comm_t *cm) {
  if (c->Lmoe == 0 || c->ep < 2) return;
  const family_t *f = &c->fam[XM_GROUP_EP];
  double H = (double)c->H, k = (double)c->k, ab = c->ab, P = (double)c->ep;
  double ngroups = (double)f->groups, layers = (double)c->Lmoe;
  /* Same-node share of a member's peers, averaged over the EP groups. */
  double pairs = family_same_node_pairs(c->net, f) / (ngroups * P); /* per member */
  double intra_rows, inter_rows;                                    /* per member */
  /* Bytes per row of each movement: forward dispatch, forward combine,
   * backward along the dispatch path, backward along the combine path. */
  double b_fd, b_fc, b_bd, b_bc;
  if (c->rbd) {
    int64_t nodes = xm_net_group_nodes(c->net, family_group(f, 0));
    double m = P / (double)nodes; /* EP ranks per node */
    /* Chances that a node / a given rank holds one of the token's experts:
     * the uniform expectation, or a measured routing's (planner/routing.h;
     * a token reaches at least as many ranks as nodes). */
    const xm_routing_t *mr = rt ? rt->measured : NULL;
    double c_node = xm_routing_rbd_copies(mr, c->E, c->k, nodes);
    double c_rank = xm_routing_rbd_copies(mr, c->E, c->k, c->ep);
    if (c_rank < c_node) c_rank = c_node;
    double p_node = c_node / (double)nodes;
    double p_rank = c_rank / P;
    double distinct = m * p_rank; /* ranks of one node the token reaches */
    inter_rows = c->Tm * ((double)nodes - 1) * p_node;
    intra_rows = c->Tm * (((double)nodes - 1) * (distinct - p_node) + distinct - p_node / m);
    if (rt && rt->given) {
      inter_rows = rt->pilots_inter / P;
      if (rt->rbd_rows_intra > 0) intra_rows = rt->rbd_rows_intra / P;
    }
    b_fd = 4 * k + H * ab + 4 * k; /* expert ids, then the row and its weights */
    b_fc = H * ab;
    b_bd = H * ab;         /* dout along the dispatch path */
    b_bc = H * ab + 4 * k; /* dweights rows, then dx rows */
  } else {
    double sent = c->padded ? (double)c->E * c->C : c->Tm * k; /* rows a member sends */
    intra_rows = sent * pairs / P;
    inter_rows = sent * (P - 1) / P - intra_rows;
    if (rt && rt->given && !c->padded) {
      intra_rows = rt->slots_intra / P;
      inter_rows = rt->slots_inter / P;
    }
    b_fd = b_fc = b_bd = b_bc = H * ab;
  }
  double mv[4] = {b_fd, b_fc, b_bd, b_bc};
  /* Full recompute runs the forward movements again, except, under xmoec
   * with RBD, the combine: the recompute pass rebuilds only what the
   * backward reads, and rbd_combine_grad reads the expert-side rows, not
   * the combined tokens (the flat combine's backward reads the rows the
   * return all-to-all delivered, so that one runs again). */
  bool again[4] = {recompute_fwd, recompute_fwd && !(c->pol == XM_POLICY_XMOEC && c->rbd), false,
                   false};
  for (int i = 0; i < 4; i++) {
    coll_t a = a2a_family(c->net, f, intra_rows * mv[i], inter_rows * mv[i]);
    double times = layers * (again[i] ? 2 : 1);
    add_coll(&cm->dispatch_intra, &cm->dispatch_inter, a, times);
    /* A skewed routing: the busiest rank moves imb times the mean rows. */
    double secs = c->imb > 1.0 ? a2a_family(c->net, f, c->imb * intra_rows * mv[i],
                                            c->imb * inter_rows * mv[i])
                                     .seconds
                               : a.seconds;
    cm->t_dispatch += times * secs;
    /* Movements 0 and 2 follow the dispatch path, 1 and 3 the combine's. */
    record(c, XM_COST_COMM_DISPATCH, i % 2 == 0 ? "dispatch" : "combine", f, true,
           XM_NET_ALL_REDUCE, 0, intra_rows * mv[i], inter_rows * mv[i], times, true, secs);
  }
}

/* Tensor-parallel all-reduces and SSMB / TED gathers of one micro-batch. */
static void tp_comm(const cx_t *c, bool recompute_fwd, comm_t *cm) {
  if (c->tp < 2) return;
  const family_t *f = &c->fam[XM_GROUP_TP];
  double T = (double)c->T, H = (double)c->H, ab = c->ab, k = (double)c->k;
  double fwd_times = recompute_fwd ? 2 : 1;
  coll_t ar = ring_family(c->net, f, XM_NET_ALL_REDUCE, T * H * ab);
  /* Megatron's g (forward, after o_proj / down_proj) and f (backward,
   * before the column-parallel projections): one each per TP block. MLA's
   * column-parallel projections read its low-rank values instead of the
   * hidden state: the backward all-reduces the gradients of the q latent
   * (or of the hidden state with q_proj), of the kv latent and of the
   * rotary key shared by the heads. */
  double blocks = (double)c->L + (double)c->Ldense;
  if (c->Lmoe > 0 && (c->shared_split || c->ted) && c->Fs > 0) blocks += (double)c->Lmoe;
  double bwd_blocks = blocks;
  const xm_model_spec_t *m = &c->s->model;
  if (m->attention == XM_ATTN_MLA) {
    bwd_blocks -= (double)c->L;
    double width = (double)(m->q_lora_rank > 0 ? m->q_lora_rank : c->H) + (double)m->kv_lora_rank +
                   (double)m->qk_rope_head_dim;
    coll_t mla = ring_family(c->net, f, XM_NET_ALL_REDUCE, T * width * ab);
    add_coll(&cm->ar_intra, &cm->ar_inter, mla, (double)c->L);
    cm->t_tp += (double)c->L * mla.seconds;
    record_ring(c, XM_COST_COMM_TP, "all_reduce", f, XM_NET_ALL_REDUCE, T * width * ab, mla,
                (double)c->L, true);
  }
  /* Full recompute runs the forward all-reduces again. xmoec's pass
   * rebuilds only what the backward reads: the attention output (h = x +
   * attn feeds the next norm), not a dense FFN's or the split shared
   * experts' output (only the residual add reads it), nor the SSMB block's
   * gathered output; the baselines re-run the whole layer. */
  bool xm = c->pol == XM_POLICY_XMOEC;
  double again = recompute_fwd ? (xm ? (double)c->L : blocks) : 0;
  add_coll(&cm->ar_intra, &cm->ar_inter, ar, blocks + again + bwd_blocks);
  cm->t_tp += (blocks + again + bwd_blocks) * ar.seconds;
  record_ring(c, XM_COST_COMM_TP, "all_reduce", f, XM_NET_ALL_REDUCE, T * H * ab, ar,
              blocks + again + bwd_blocks, true);
  if (c->Lmoe == 0) return;
  double n = (double)c->Lmoe;
  if (c->ssmb) {
    /* Forward: the block's output gathered at its exit; backward: the
     * gradients of the narrowed tokens and routing weights. */
    double fwd_rows = xm ? 1 : fwd_times;
    coll_t g_rows = ring_family(c->net, f, XM_NET_ALL_GATHER, c->Tm * H * ab);
    coll_t g_w = ring_family(c->net, f, XM_NET_ALL_GATHER, c->Tm * k * 4);
    add_coll(&cm->ag_intra, &cm->ag_inter, g_rows, n * (fwd_rows + 1));
    add_coll(&cm->ag_intra, &cm->ag_inter, g_w, n);
    cm->t_tp += n * ((fwd_rows + 1) * g_rows.seconds + g_w.seconds);
    record_ring(c, XM_COST_COMM_TP, "all_gather", f, XM_NET_ALL_GATHER, c->Tm * H * ab, g_rows,
                n * (fwd_rows + 1), true);
    record_ring(c, XM_COST_COMM_TP, "all_gather", f, XM_NET_ALL_GATHER, c->Tm * k * 4, g_w, n,
                true);
  }
  if (c->ted) {
    /* Expert tensor parallelism: received rows gathered over TP before the
     * expert, partial outputs reduce-scattered after it; the backward
     * mirrors both; the deduplicated tokens are gathered back at the exit. */
    double rows = c->rows_buf / (double)c->tp;
    coll_t g = ring_family(c->net, f, XM_NET_ALL_GATHER, rows * H * ab);
    coll_t r = ring_family(c->net, f, XM_NET_REDUCE_SCATTER, rows * H * ab);
    coll_t x = ring_family(c->net, f, XM_NET_ALL_GATHER, c->Tm * H * ab);
    add_coll(&cm->ag_intra, &cm->ag_inter, g, n * (fwd_times + 1));
    add_coll(&cm->rs_intra, &cm->rs_inter, r, n * (fwd_times + 1));
    add_coll(&cm->ag_intra, &cm->ag_inter, x, n * (fwd_times + 1));
    cm->t_tp += n * (fwd_times + 1) * (g.seconds + r.seconds + x.seconds);
    record_ring(c, XM_COST_COMM_TP, "all_gather", f, XM_NET_ALL_GATHER, rows * H * ab, g,
                n * (fwd_times + 1), true);
    record_ring(c, XM_COST_COMM_TP, "reduce_scatter", f, XM_NET_REDUCE_SCATTER, rows * H * ab, r,
                n * (fwd_times + 1), true);
    record_ring(c, XM_COST_COMM_TP, "all_gather", f, XM_NET_ALL_GATHER, c->Tm * H * ab, x,
                n * (fwd_times + 1), true);
  }
}

/* Gradient reduction, ZeRO-1 gathers, norm partial sums and expert loads
 * of one optimizer step. Bytes per tensor, exactly as the runtime counts
 * them; time in buckets (one ring per group and kind). */
static void step_comm(const cx_t *c, const table_t *tb, comm_t *cm) {
  double ar_bytes[XM_GROUP_COUNT] = {0}, rs_bytes[XM_GROUP_COUNT] = {0};
  bool norm_seen[XM_GROUP_COUNT + 1][XM_GROUP_COUNT + 1];
  memset(norm_seen, 0, sizeof norm_seen);
  for (int i = 0; i < tb->n; i++) {
    const tensor_t *t = &tb->t[i];
    if (!t->trainable) continue;
    double bytes = t->numel * c->gb;
    for (int r = 0; r < 2; r++) {
      if (t->reduce[r] < 0) continue;
      coll_t cl = ring_bytes(c->net, &c->fam[t->reduce[r]], XM_NET_ALL_REDUCE, bytes);
      add_coll(&cm->ar_intra, &cm->ar_inter, cl, t->count);
      ar_bytes[t->reduce[r]] += t->count * bytes;
    }
    if (t->zero >= 0) {
      const family_t *f = &c->fam[t->zero];
      coll_t rs = ring_bytes(c->net, f, XM_NET_ZERO_REDUCE_SCATTER, bytes);
      coll_t ag = ring_bytes(c->net, f, XM_NET_ZERO_ALL_GATHER, t->numel * c->wb);
      add_coll(&cm->rs_intra, &cm->rs_inter, rs, t->count);
      add_coll(&cm->ag_intra, &cm->ag_inter, ag, t->count);
      rs_bytes[t->zero] += t->count * bytes;
    }
    norm_seen[t->split + 1][t->zero + 1] = true;
  }
  /* The global gradient norm: one fp32 partial sum per (split, zero) pair,
   * all-reduced over each of the two groups. */
  for (int s = 0; s <= XM_GROUP_COUNT; s++)
    for (int z = 0; z <= XM_GROUP_COUNT; z++) {
      if (!norm_seen[s][z]) continue;
      int gs[2] = {s - 1, z - 1};
      for (int j = 0; j < 2; j++) {
        if (gs[j] < 0) continue;
        coll_t cl = ring_family(c->net, &c->fam[gs[j]], XM_NET_ALL_REDUCE, 4);
        add_coll(&cm->ar_intra, &cm->ar_inter, cl, 1);
        cm->t_reduce += cl.seconds;
        record_ring(c, XM_COST_COMM_REDUCE, "all_reduce", &c->fam[gs[j]], XM_NET_ALL_REDUCE, 4, cl,
                    1, false);
      }
    }
  /* Aux-free load counters: int32 [E] per MoE layer over dp (and tp
   * under SSMB). */
  if (c->Lmoe > 0 && c->s->moe.aux_free_gamma > 0) {
    int lg[2] = {XM_GROUP_DP, c->ssmb ? XM_GROUP_TP : -1};
    for (int j = 0; j < 2; j++) {
      if (lg[j] < 0 || group_size(c, lg[j]) < 2) continue;
      coll_t cl = ring_family(c->net, &c->fam[lg[j]], XM_NET_ALL_REDUCE, (double)c->E * 4);
      add_coll(&cm->ar_intra, &cm->ar_inter, cl, (double)c->Lmoe);
      cm->t_reduce += (double)c->Lmoe * cl.seconds;
      record_ring(c, XM_COST_COMM_REDUCE, "all_reduce", &c->fam[lg[j]], XM_NET_ALL_REDUCE,
                  (double)c->E * 4, cl, (double)c->Lmoe, false);
    }
  }
  /* Time: each group's gradients in one bucketed ring. */
  for (int g = 0; g < XM_GROUP_COUNT; g++) {
    const family_t *f = &c->fam[g];
    if (ar_bytes[g] > 0) {
      coll_t cl = ring_family(c->net, f, XM_NET_ALL_REDUCE, ar_bytes[g]);
      cm->t_reduce += cl.seconds;
      record_ring(c, XM_COST_COMM_REDUCE, "all_reduce", f, XM_NET_ALL_REDUCE, ar_bytes[g], cl, 1,
                  false);
    }
    if (rs_bytes[g] > 0) {
      double ag_bytes = rs_bytes[g] / c->gb * c->wb;
      coll_t rs = ring_family(c->net, f, XM_NET_ZERO_REDUCE_SCATTER, rs_bytes[g]);
      coll_t ag = ring_family(c->net, f, XM_NET_ZERO_ALL_GATHER, ag_bytes);
      cm->t_reduce += rs.seconds;
      cm->t_gather += ag.seconds;
      record_ring(c, XM_COST_COMM_REDUCE, "reduce_scatter", f, XM_NET_ZERO_REDUCE_SCATTER,
                  rs_bytes[g], rs, 1, false);
      record_ring(c, XM_COST_COMM_GATHER, "all_gather", f, XM_NET_ZERO_ALL_GATHER, ag_bytes, ag, 1,
                  false);
    }
  }
}

/* ---- the evaluation ------------------------------------------------------------ */

xm_status_t xm_cost_evaluate(const xm_spec_t *spec, const xm_net_t *net, double device_bytes,
                             double peak_flops, double gemm_efficiency,
                             const xm_cost_point_t *point, const xm_cost_routing_t *routing,
                             xm_diag_t *diag, xm_cost_t *out) {
  return xm_cost_collectives(spec, net, device_bytes, peak_flops, gemm_efficiency, point, routing,
                             diag, out, NULL);
}

xm_status_t xm_cost_collectives(const xm_spec_t *spec, const xm_net_t *net, double device_bytes,
                                double peak_flops, double gemm_efficiency,
                                const xm_cost_point_t *point, const xm_cost_routing_t *routing,
                                xm_diag_t *diag, xm_cost_t *out, xm_cost_colls_t *colls) {
  XM_ASSERT(spec && net && point && out);
  memset(out, 0, sizeof *out);
  if (!(peak_flops > 0) || !(gemm_efficiency > 0) || !(net->intra_bw > 0) || !(net->inter_bw > 0) ||
      net->nodes < 1 || net->ranks_per_node < 1) {
    err(diag, "the cluster needs positive peak FLOP/s, GEMM efficiency, bandwidths, nodes and "
              "ranks per node");
    return XM_ERR_INVALID_INPUT;
  }
  cx_t c;
  XM_RETURN_IF_ERROR(setup(&c, spec, net, point, routing, diag));
  c.rec = colls;

  /* Memory. */
  table_t tb;
  build_table(&c, &tb);
  double params_updated = 0, grad_elems = 0;
  table_memory(&c, &tb, out, &params_updated, &grad_elems);
  activation_memory(&c, out, grad_elems);
  out->overhead = XM_COST_FIXED_OVERHEAD_BYTES;
  out->total =
      out->weights + out->grads + out->optimizer + out->activations + out->buffers + out->overhead;
  out->device = device_bytes;
  out->fits = out->total <= device_bytes;
  out->shortfall = out->fits ? 0 : out->total - device_bytes;

  /* Compute. */
  flops_t f = forward_flops(&c);
  double fwd = f.attn + f.dense + f.moe_experts + f.moe_other + f.head;
  double layers_fwd = fwd - f.head;
  /* Recompute runs the forward of what it drops again: the expert FFN's
   * first GEMMs ("moe": the intermediates before the down projection),
   * or the layers, less, for xmoec, the GEMMs the backward does not need
   * the output of (passes/recompute.c rebuilds only what the backward reads). */
  int nm = spec->moe.activation == XM_ACT_GELU ? 2 : 3;
  double recompute = 0;
  if (point->recompute == XM_RECOMPUTE_FULL)
    recompute = layers_fwd - (c.pol == XM_POLICY_XMOEC ? f.fed_to_residual : 0);
  else if (point->recompute == XM_RECOMPUTE_MOE)
    recompute = f.moe_experts * (double)(nm - 1) / nm;
  if (c.pol == XM_POLICY_XMOEC) recompute += f.head; /* the fused loss remakes the logits */
  double rate = peak_flops * gemm_efficiency;
  double t_bwd_micro = (2 * fwd + recompute) / rate;
  out->grad_accum = c.G;
  out->t_compute = (double)c.G * (3 * fwd + recompute) / rate;

  /* Communication. */
  comm_t cm;
  memset(&cm, 0, sizeof cm);
  bool rfull = point->recompute == XM_RECOMPUTE_FULL;
  dispatch_comm(&c, routing, rfull, &cm);
  tp_comm(&c, rfull, &cm);
  double G = (double)c.G;
  cm.dispatch_intra *= G;
  cm.dispatch_inter *= G;
  cm.ar_intra *= G;
  cm.ar_inter *= G;
  cm.ag_intra *= G;
  cm.ag_inter *= G;
  cm.rs_intra *= G;
  cm.rs_inter *= G;
  out->t_dispatch = G * cm.t_dispatch;
  out->t_tp = G * cm.t_tp;
  step_comm(&c, &tb, &cm);
  /* Overlap: the gradient reduction runs behind the last micro-batch's
   * backward; the ZeRO-1 gathers follow the optimizer and are exposed. */
  double hidden = cm.t_reduce < t_bwd_micro ? cm.t_reduce : t_bwd_micro;
  out->t_dp = cm.t_reduce - hidden + cm.t_gather;
  out->t_overlap_window = t_bwd_micro;

  /* Optimizer: memory bound; reads p, g, m, v (+ master), writes p, m, v (+ master). */
  double hbm = peak_flops / MACHINE_BALANCE;
  out->t_optimizer = params_updated * (2 * c.wb + c.gb + 2 * c.ob) / hbm;

  out->t_step = out->t_compute + out->t_dispatch + out->t_tp + out->t_dp + out->t_optimizer;
  out->tokens_per_step = (double)spec->training.global_batch * (double)c.S;
  xm_count_t cnt;
  xm_count_params(spec, &cnt);
  out->flops_per_device = (cnt.flops_per_token_fwdbwd + 3 * cnt.mtp_flops_per_token_fwd) *
                          out->tokens_per_step / (double)c.world;
  out->tflops_per_device = out->t_step > 0 ? out->flops_per_device / out->t_step / 1e12 : 0;
  out->mfu = out->tflops_per_device * 1e12 / peak_flops;

  out->bytes_dispatch_intra = cm.dispatch_intra;
  out->bytes_dispatch_inter = cm.dispatch_inter;
  out->bytes_all_reduce_intra = cm.ar_intra;
  out->bytes_all_reduce_inter = cm.ar_inter;
  out->bytes_all_gather_intra = cm.ag_intra;
  out->bytes_all_gather_inter = cm.ag_inter;
  out->bytes_reduce_scatter_intra = cm.rs_intra;
  out->bytes_reduce_scatter_inter = cm.rs_inter;
  if (colls && colls->oom) {
    xm_cost_colls_free(colls);
    return XM_ERR_NO_MEMORY;
  }
  return XM_OK;
}
