/* runtime/gpu/kernels/moe.cuh — the router and padding-free MoE kernels
 * (runtime/abi/kernels.def, router and padding-free MoE; semantics:
 * runtime/cpu/kernels.h and runtime/cpu/kernels_moe.c).
 *
 * How work maps to threads:
 *   router_score(_grad), topk_route(_grad): a warp per token (grid-stride
 *     over tokens), lanes strided over the E experts; reductions are warp
 *     butterflies. topk_route picks its k experts in k warp-argmax rounds,
 *     round j taking the best expert after pick j-1 in the order (choice
 *     desc, expert asc), so no per-expert flags are kept; the group limit
 *     is a threshold group found the same way over the group scores.
 *   permute: (1) tpe = 0; (2) histogram: blocks over (slot chunk, expert
 *     chunk) count in shared memory and add their bins into tpe with
 *     integer atomics (exact, so deterministic); (3) rank: a block per
 *     expert walks all T*k slots in slot order, tiles of threads x ITEMS
 *     consecutive slots, with one block-wide prefix sum per tile, and
 *     writes its rows (indices, bin_ids) at its offset (the sum of the
 *     kept counts of the experts before it). An expert over capacity first
 *     finds the weight key of its capacity-th best slot by an 8-bit radix
 *     select (four shared histograms over its slots); slots above that key
 *     are kept, and of those equal to it the first ones in slot order;
 *     (4) with a capacity, tpe is clamped to it.
 *   gather_rows, gather_rows_grad, scatter_combine(_grad): rows split
 *     over groups of tpr threads (tpr the power of two >= H, at most a
 *     warp), consecutive threads on consecutive columns. The
 *     sums over a token's k slots (gather_rows_grad, scatter_combine) take
 *     no atomics: the output is zeroed, then k launches, launch j adding
 *     the rows of slot index % k == j (one per token at most).
 *   sort_chunks / unsort_chunks: grid y over the P*L blocks (p, l), grid x
 *     over the block's contiguous rows; each warp finds both offsets of
 *     its (p, l) with a warp sum over counts (no barrier).
 *   aux_loss: one block (a scalar with no workspace): shared expert
 *     histogram, then the count-weighted column sums of the scores, in
 *     double, in a fixed order.
 *   aux_loss_grad: permute's histogram counts the slots into row 0 (as
 *     integers), then the other rows and last row 0 get c * count.
 * Everything is deterministic: float sums run in a fixed order, atomics
 * only add integers.
 */
#ifndef XM_RUNTIME_GPU_KERNELS_MOE_CUH
#define XM_RUNTIME_GPU_KERNELS_MOE_CUH

#include "runtime/gpu/kernels/common.cuh"

#include "runtime/abi/kernels.h" /* XM_K_SOFTMAX, XM_K_SIGMOID */

/* Experts per shared histogram (permute, aux_loss), slots per histogram
 * block of permute, consecutive slots per thread in permute's rank scan
 * (threads * items must stay below 2^16: two counts share an int), and the
 * blocks of a chunk sort, all chunks together (the row counts are on the
 * device, so the grid cannot follow them; each thread keeps four loads in
 * flight), and the threads of aux_loss's single block. */
#if defined(XM_TARGET_AMD)
#define XM_TILE_MOE_BINS 1024
#define XM_TILE_MOE_HIST_SLOTS 4096
#define XM_TILE_MOE_RANK_ITEMS 16
#define XM_TILE_MOE_CHUNK_BLOCKS 256
#define XM_TILE_MOE_AUX_THREADS 1024
#else
#define XM_TILE_MOE_BINS 1024
#define XM_TILE_MOE_HIST_SLOTS 4096
#define XM_TILE_MOE_RANK_ITEMS 16
#define XM_TILE_MOE_CHUNK_BLOCKS 256
#define XM_TILE_MOE_AUX_THREADS 1024
#endif
static_assert(XM_TILE_THREADS * XM_TILE_MOE_RANK_ITEMS < 65536, "rank counts share an int");
static_assert(XM_TILE_MOE_RANK_ITEMS <= 16, "rank flags share a word");

/* ---- helpers -------------------------------------------------------------- */

/* Threads per row of a row kernel: the power of two >= H, at most a warp. */
XM_HOSTDEV int xm_moe_tpr(int64_t H) {
  int t = 1;
  while (t < XM_WARP && t < H) t <<= 1;
  return t;
}

/* Fills p[0, n) with v (grid-stride). */
template <class S, class V> XM_GLOBAL(XM_TILE_THREADS) k_moe_fill(V *p, int64_t n, V v) {
  XM_FOR_GRID(i, n) p[i] = v;
}

template <class V> static inline void xm_moe_fill(xm_stream_t s, V *p, int64_t n, V v) {
  xm_launch("moe_fill", xm_grid_1d(n, XM_TILE_THREADS), 1, 1, XM_TILE_THREADS, s,
            &k_moe_fill<xm_shape_dyn, V>, p, n, v);
}

/* Integer sum over the block of v, to every thread (sh: XM_MAX_WARPS ints;
 * barriers: every thread calls it). */
XM_DEV int xm_moe_block_sum_i(int v, int *sh) {
  v = xm_warp_sum_i(v);
  if (xm_lane() == 0) sh[xm_warp_id()] = v;
  xm_sync();
  int s = 0;
  for (int i = 0; i < xm_nwarps(); i++) s += sh[i];
  xm_sync();
  return s;
}

/* Exclusive prefix sum of v over the threads of the block in thread order,
 * and the block's total in *total (sh: XM_MAX_WARPS ints; barriers). */
XM_DEV int xm_moe_block_scan_i(int v, int *sh, int *total) {
  const int lane = xm_lane(), w = xm_warp_id();
  int inc = v;
  for (int d = 1; d < XM_WARP; d <<= 1) {
    int y = xm_shfl_i(inc, lane >= d ? lane - d : lane);
    if (lane >= d) inc += y;
  }
  if (lane == XM_WARP - 1) sh[w] = inc;
  xm_sync();
  int before = 0, tot = 0;
  for (int i = 0; i < xm_nwarps(); i++) {
    int x = sh[i];
    if (i < w) before += x;
    tot += x;
  }
  xm_sync();
  *total = tot;
  return before + inc - v;
}

/* (v, i) comes after (pv, pi) in the order value desc, index asc. */
XM_DEV bool xm_moe_after(float v, int i, float pv, int pi) {
  return v < pv || (v == pv && i > pi);
}

/* Warp argmax of (v, i), ties to the lower index; i < 0 is no candidate.
 * Every lane gets the same pair. */
XM_DEV void xm_moe_warp_best(float *v, int *i) {
  for (int m = XM_WARP / 2; m > 0; m >>= 1) {
    float ov = xm_shfl_xor(*v, m);
    int oi = xm_shfl_xor_i(*i, m);
    if (oi >= 0 && (*i < 0 || ov > *v || (ov == *v && oi < *i))) {
      *v = ov;
      *i = oi;
    }
  }
}

/* ---- router_score: softmax or sigmoid over each token's E logits -------- */

template <class S>
XM_GLOBAL(XM_TILE_THREADS)
k_router_score(const float *logits, float *scores, int64_t T_, int64_t E_, int scoring) {
  const int64_t T = XM_DIM(S, T, T_), E = XM_DIM(S, E, E_);
  const int lane = xm_lane();
  const int64_t wpb = xm_ntid() / XM_WARP;
  for (int64_t t = (int64_t)xm_bid_x() * wpb + xm_warp_id(); t < T; t += (int64_t)xm_nbid_x() * wpb) {
    const float *x = logits + t * E;
    float *y = scores + t * E;
    if (scoring == XM_K_SIGMOID) {
      for (int64_t e = lane; e < E; e += XM_WARP) y[e] = 1.0f / (1.0f + expf(-x[e]));
      continue;
    }
    float mx = -INFINITY;
    for (int64_t e = lane; e < E; e += XM_WARP) mx = fmaxf(mx, x[e]);
    mx = xm_warp_max(mx);
    float sum = 0.0f;
    for (int64_t e = lane; e < E; e += XM_WARP) sum += expf(x[e] - mx);
    const float inv = 1.0f / xm_warp_sum(sum);
    for (int64_t e = lane; e < E; e += XM_WARP) y[e] = expf(x[e] - mx) * inv;
  }
}

template <class S>
void xm_g_router_score(xm_stream_t s, const float *logits, float *scores, int64_t T_, int64_t E_,
                       int scoring) {
  const int64_t T = XM_DIM(S, T, T_), E = XM_DIM(S, E, E_);
  if (E <= 0) return;
  xm_launch("router_score", xm_grid_1d(T, XM_TILE_THREADS / XM_WARP), 1, 1, XM_TILE_THREADS, s,
            &k_router_score<S>, logits, scores, T, E, scoring);
}
XM_G_TABLE(router_score)

/* ---- router_score_grad: both Jacobians from the scores, a warp per token - */

template <class S>
XM_GLOBAL(XM_TILE_THREADS)
k_router_score_grad(const float *dscores, const float *scores, float *dlogits, int64_t T_,
                    int64_t E_, int scoring) {
  const int64_t T = XM_DIM(S, T, T_), E = XM_DIM(S, E, E_);
  const int lane = xm_lane();
  const int64_t wpb = xm_ntid() / XM_WARP;
  for (int64_t t = (int64_t)xm_bid_x() * wpb + xm_warp_id(); t < T; t += (int64_t)xm_nbid_x() * wpb) {
    const float *dy = dscores + t * E, *y = scores + t * E;
    float *dx = dlogits + t * E;
    if (scoring == XM_K_SIGMOID) {
      for (int64_t e = lane; e < E; e += XM_WARP) dx[e] = dy[e] * y[e] * (1.0f - y[e]);
      continue;
    }
    float dot = 0.0f;
    for (int64_t e = lane; e < E; e += XM_WARP) dot += dy[e] * y[e];
    dot = xm_warp_sum(dot);
    for (int64_t e = lane; e < E; e += XM_WARP) dx[e] = y[e] * (dy[e] - dot);
  }
}

template <class S>
void xm_g_router_score_grad(xm_stream_t s, const float *dscores, const float *scores,
                            float *dlogits, int64_t T_, int64_t E_, int scoring) {
  const int64_t T = XM_DIM(S, T, T_), E = XM_DIM(S, E, E_);
  if (E <= 0) return;
  xm_launch("router_score_grad", xm_grid_1d(T, XM_TILE_THREADS / XM_WARP), 1, 1, XM_TILE_THREADS,
            s, &k_router_score_grad<S>, dscores, scores, dlogits, T, E, scoring);
}
XM_G_TABLE(router_score_grad)

/* ---- topk_route: group-limited top-k, a warp per token ------------------ */

/* The choice value of expert e: its score plus the selection bias. */
XM_DEV float xm_moe_choice(const float *s, const float *bias, int e) {
  return s[e] + (bias ? bias[e] : 0.0f);
}

/* Score of group g (gs experts): its best choice, plus its second best
 * under sigmoid scoring when the group has two experts or more. */
XM_DEV float xm_moe_group_score(const float *s, const float *bias, int g, int gs, bool sigm) {
  const int e0 = g * gs;
  float v0 = xm_moe_choice(s, bias, e0);
  int i0 = 0;
  for (int i = 1; i < gs; i++) {
    float c = xm_moe_choice(s, bias, e0 + i);
    if (c > v0) {
      v0 = c;
      i0 = i;
    }
  }
  if (!sigm || gs <= 1) return v0;
  float v1 = 0.0f;
  bool have = false;
  for (int i = 0; i < gs; i++) {
    if (i == i0) continue;
    float c = xm_moe_choice(s, bias, e0 + i);
    if (!have || c > v1) {
      v1 = c;
      have = true;
    }
  }
  return v0 + v1;
}

/* The group limit of one token: groups up to the threshold group (tv, ti)
 * in the order (score desc, group asc) are kept (none when ti < 0). With
 * at most 64 groups `keep` has their bits; beyond, a group's score is
 * recomputed when asked. */
typedef struct {
  bool grouped, bits;
  int gs, ti;
  float tv;
  uint64_t keep;
} xm_moe_groups_t;

XM_DEV bool xm_moe_masked(const xm_moe_groups_t *G, const float *s, const float *bias, int e,
                          bool sigm) {
  if (!G->grouped) return false;
  const int g = e / G->gs;
  if (G->bits) return !((G->keep >> g) & 1u);
  if (G->ti < 0) return true;
  return xm_moe_after(xm_moe_group_score(s, bias, g, G->gs, sigm), g, G->tv, G->ti);
}

template <class S>
XM_GLOBAL(XM_TILE_THREADS)
k_topk_route(const float *scores, const float *bias, int32_t *experts, float *weights,
             int64_t T_, int64_t E_, int64_t k_, int64_t n_group_, int64_t topk_group_,
             int norm_topk_prob, float routed_scaling, int scoring) {
  const int64_t T = XM_DIM(S, T, T_), E = XM_DIM(S, E, E_), k = XM_DIM(S, k, k_);
  const int64_t n_group = XM_DIM(S, n_group, n_group_);
  const int64_t topk_group = XM_DIM(S, topk_group, topk_group_);
  const int lane = xm_lane();
  const int64_t wpb = xm_ntid() / XM_WARP;
  const bool sigm = scoring == XM_K_SIGMOID;
  xm_moe_groups_t G;
  G.grouped = n_group > 1 && E % n_group == 0 && topk_group < n_group;
  const int ng = G.grouped ? (int)n_group : 1;
  G.gs = G.grouped ? (int)(E / n_group) : (int)E;
  G.bits = ng <= 64;
  for (int64_t t = (int64_t)xm_bid_x() * wpb + xm_warp_id(); t < T; t += (int64_t)xm_nbid_x() * wpb) {
    const float *s = scores + t * E;
    G.ti = -1;
    G.tv = 0.0f;
    G.keep = ~(uint64_t)0;
    if (G.grouped) {
      /* topk_group rounds over the group scores: the last pick is the
       * threshold group */
      const float mine = lane < ng ? xm_moe_group_score(s, bias, lane, G.gs, sigm) : 0.0f;
      for (int64_t r = 0; r < topk_group; r++) {
        float bv = 0.0f;
        int bi = -1;
        for (int g = lane; g < ng; g += XM_WARP) {
          float v = g == lane ? mine : xm_moe_group_score(s, bias, g, G.gs, sigm);
          if (G.ti >= 0 && !xm_moe_after(v, g, G.tv, G.ti)) continue;
          if (bi < 0 || v > bv) {
            bv = v;
            bi = g;
          }
        }
        xm_moe_warp_best(&bv, &bi);
        G.tv = bv;
        G.ti = bi;
      }
      if (G.bits) {
        uint32_t lo = 0, hi = 0;
        for (int g = lane; g < ng; g += XM_WARP) {
          float v = g == lane ? mine : xm_moe_group_score(s, bias, g, G.gs, sigm);
          if (G.ti < 0 || xm_moe_after(v, g, G.tv, G.ti)) continue;
          if (g < 32)
            lo |= 1u << g;
          else
            hi |= 1u << (g - 32);
        }
        for (int m = XM_WARP / 2; m > 0; m >>= 1) {
          lo |= (uint32_t)xm_shfl_xor_i((int)lo, m);
          hi |= (uint32_t)xm_shfl_xor_i((int)hi, m);
        }
        G.keep = ((uint64_t)hi << 32) | lo;
      }
    }
    /* k rounds: the best unmasked choice after the previous pick; when the
     * unmasked experts run out (k above what the groups keep, which the
     * spec forbids), the masked ones follow in the same order, as on the
     * CPU */
    float pv = 0.0f;
    int pe = -1, phase = 0;
    double sum = 0.0;
    int64_t j = 0;
    while (j < k) {
      float bv = 0.0f;
      int bi = -1;
      for (int e = lane; e < E; e += XM_WARP) {
        if ((int)xm_moe_masked(&G, s, bias, e, sigm) != phase) continue;
        float c = xm_moe_choice(s, bias, e);
        if (pe >= 0 && !xm_moe_after(c, e, pv, pe)) continue;
        if (bi < 0 || c > bv) {
          bv = c;
          bi = e;
        }
      }
      xm_moe_warp_best(&bv, &bi);
      if (bi < 0) {
        if (phase) break;
        phase = 1;
        pe = -1;
        continue;
      }
      pv = bv;
      pe = bi;
      const float sc = s[bi];
      sum += sc;
      /* lane j % WARP owns pick j: it rescales it below */
      if (lane == (int)(j % XM_WARP)) {
        experts[t * k + j] = bi;
        weights[t * k + j] = sc;
      }
      j++;
    }
    for (; j < k; j++) /* k > E: out of the spec, stay in range */
      if (lane == (int)(j % XM_WARP)) {
        experts[t * k + j] = 0;
        weights[t * k + j] = 0.0f;
      }
    const float f = norm_topk_prob ? (float)(routed_scaling / sum) : routed_scaling;
    for (int64_t i = lane; i < k; i += XM_WARP) weights[t * k + i] *= f;
  }
}

template <class S>
void xm_g_topk_route(xm_stream_t s, const float *scores, const float *bias, int32_t *experts,
                     float *weights, int64_t T_, int64_t E_, int64_t k_, int64_t n_group_,
                     int64_t topk_group_, int norm_topk_prob, float routed_scaling, int scoring) {
  const int64_t T = XM_DIM(S, T, T_), E = XM_DIM(S, E, E_), k = XM_DIM(S, k, k_);
  const int64_t n_group = XM_DIM(S, n_group, n_group_);
  const int64_t topk_group = XM_DIM(S, topk_group, topk_group_);
  if (E <= 0 || k <= 0) return;
  xm_launch("topk_route", xm_grid_1d(T, XM_TILE_THREADS / XM_WARP), 1, 1, XM_TILE_THREADS, s,
            &k_topk_route<S>, scores, bias, experts, weights, T, E, k, n_group, topk_group,
            norm_topk_prob, routed_scaling, scoring);
}
XM_G_TABLE(topk_route)

/* ---- topk_route_grad: a warp per token, each lane its experts ----------- */

template <class S>
XM_GLOBAL(XM_TILE_THREADS)
k_topk_route_grad(const float *dweights, const float *scores, const int32_t *experts,
                  float *dscores, int64_t T_, int64_t E_, int64_t k_, int norm_topk_prob,
                  float routed_scaling) {
  const int64_t T = XM_DIM(S, T, T_), E = XM_DIM(S, E, E_), k = XM_DIM(S, k, k_);
  const int lane = xm_lane();
  const int64_t wpb = xm_ntid() / XM_WARP;
  for (int64_t t = (int64_t)xm_bid_x() * wpb + xm_warp_id(); t < T; t += (int64_t)xm_nbid_x() * wpb) {
    const float *s = scores + t * E, *dw = dweights + t * k;
    const int32_t *ex = experts + t * k;
    float *ds = dscores + t * E;
    double sum = 0.0, dot = 0.0;
    if (norm_topk_prob)
      for (int64_t j = 0; j < k; j++) {
        sum += s[ex[j]];
        dot += (double)dw[j] * s[ex[j]];
      }
    const double r = routed_scaling;
    /* every expert written once, by its lane: 0 unless picked */
    for (int64_t e = lane; e < E; e += XM_WARP) {
      float v = 0.0f;
      for (int64_t j = 0; j < k; j++) {
        if (ex[j] != e) continue;
        v += norm_topk_prob ? (float)(r * (dw[j] / sum - dot / (sum * sum)))
                            : routed_scaling * dw[j];
      }
      ds[e] = v;
    }
  }
}

template <class S>
void xm_g_topk_route_grad(xm_stream_t s, const float *dweights, const float *scores,
                          const int32_t *experts, float *dscores, int64_t T_, int64_t E_,
                          int64_t k_, int norm_topk_prob, float routed_scaling) {
  const int64_t T = XM_DIM(S, T, T_), E = XM_DIM(S, E, E_), k = XM_DIM(S, k, k_);
  if (E <= 0) return;
  xm_launch("topk_route_grad", xm_grid_1d(T, XM_TILE_THREADS / XM_WARP), 1, 1, XM_TILE_THREADS,
            s, &k_topk_route_grad<S>, dweights, scores, experts, dscores, T, E, k, norm_topk_prob,
            routed_scaling);
}
XM_G_TABLE(topk_route_grad)

/* ---- permute: stable counting sort of the slots by expert --------------- */

/* Histogram: block (x, y) counts the experts of chunk y in its slots and
 * adds its non-zero bins into tpe (zeroed before). */
template <class S>
XM_GLOBAL(XM_TILE_THREADS)
k_permute_hist(const int32_t *experts, int32_t *tpe, int64_t T_, int64_t k_, int64_t E_) {
  const int64_t T = XM_DIM(S, T, T_), k = XM_DIM(S, k, k_), E = XM_DIM(S, E, E_);
  XM_SHARED(int, bins, XM_TILE_MOE_BINS);
  const int64_t N = T * k, e0 = (int64_t)xm_bid_y() * XM_TILE_MOE_BINS;
  const int ne = (int)(E - e0 < XM_TILE_MOE_BINS ? E - e0 : XM_TILE_MOE_BINS);
  for (int i = xm_tid(); i < ne; i += xm_ntid()) bins[i] = 0;
  xm_sync();
  const int64_t s0 = (int64_t)xm_bid_x() * XM_TILE_MOE_HIST_SLOTS;
  const int64_t s1 = N - s0 < XM_TILE_MOE_HIST_SLOTS ? N : s0 + XM_TILE_MOE_HIST_SLOTS;
  for (int64_t i = s0 + xm_tid(); i < s1; i += xm_ntid()) {
    int64_t e = (int64_t)experts[i] - e0;
    if (e >= 0 && e < ne) xm_atomic_add_i32(&bins[e], 1);
  }
  xm_sync();
  for (int i = xm_tid(); i < ne; i += xm_ntid())
    if (bins[i]) xm_atomic_add_i32((int *)&tpe[e0 + i], bins[i]);
}

/* A weight as an unsigned key in the same order (-0 as +0, as the float
 * comparisons of the CPU see them). */
XM_DEV uint32_t xm_moe_key(float w) {
  if (w == 0.0f) w = 0.0f;
  uint32_t u;
  memcpy(&u, &w, 4);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Rank: block e writes the rows of expert e (tpe holds the raw counts). */
template <class S>
XM_GLOBAL(XM_TILE_THREADS)
k_permute_rank(const int32_t *experts, const float *weights, int32_t *indices, int32_t *bin_ids,
               const int32_t *tpe, int64_t T_, int64_t k_, int64_t E_, int64_t capacity_) {
  const int64_t T = XM_DIM(S, T, T_), k = XM_DIM(S, k, k_), E = XM_DIM(S, E, E_);
  const int64_t capacity = XM_DIM(S, capacity, capacity_);
  XM_SHARED(int, sh, XM_MAX_WARPS);
  XM_SHARED(int, hist, 256);
  XM_SHARED(int, pick, 2);
  const int64_t N = T * k;
  const int tid = xm_tid(), nt = xm_ntid();
  for (int64_t e = xm_bid_x(); e < E; e += xm_nbid_x()) {
    /* rows before expert e: the kept counts of the experts before it */
    int part = 0;
    for (int64_t i = tid; i < e; i += nt) part += capacity > 0 && tpe[i] > capacity ? (int)capacity : tpe[i];
    const int64_t off = xm_moe_block_sum_i(part, sh);
    const bool drop = capacity > 0 && tpe[e] > capacity;
    /* over capacity: the key kth of the capacity-th best slot, and how
     * many slots of key kth are kept (rem), by radix select */
    uint32_t kth = 0;
    int rem = 0;
    if (drop) {
      uint32_t mask = 0;
      int want = (int)capacity;
      for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = tid; b < 256; b += nt) hist[b] = 0;
        xm_sync();
        for (int64_t i = tid; i < N; i += nt) {
          if (experts[i] != e) continue;
          uint32_t key = xm_moe_key(weights[i]);
          if ((key & mask) == kth) xm_atomic_add_i32(&hist[(key >> shift) & 255u], 1);
        }
        xm_sync();
        if (tid == 0) {
          int cum = 0, b = 255;
          for (; b > 0 && cum + hist[b] < want; b--) cum += hist[b];
          pick[0] = b;
          pick[1] = want - cum;
        }
        xm_sync();
        kth |= (uint32_t)pick[0] << shift;
        mask |= 255u << shift;
        want = pick[1];
        xm_sync();
      }
      rem = want;
    }
    /* all slots in order, ITEMS consecutive per thread: kept slots above
     * kth (all slots when nothing drops) count in the high half, slots of
     * key kth in the low half */
    const int64_t tile = (int64_t)nt * XM_TILE_MOE_RANK_ITEMS;
    int64_t gt_run = 0, eq_run = 0;
    for (int64_t base = 0; base < N; base += tile) {
      const int64_t s0 = base + (int64_t)tid * XM_TILE_MOE_RANK_ITEMS;
      uint32_t flags = 0;
      int cnt = 0;
      for (int i = 0; i < XM_TILE_MOE_RANK_ITEMS; i++) {
        const int64_t sl = s0 + i;
        if (sl >= N || experts[sl] != e) continue;
        if (!drop) {
          flags |= 1u << i;
          cnt += 1 << 16;
          continue;
        }
        uint32_t key = xm_moe_key(weights[sl]);
        if (key > kth) {
          flags |= 1u << i;
          cnt += 1 << 16;
        } else if (key == kth) {
          flags |= 1u << (16 + i);
          cnt += 1;
        }
      }
      int total;
      const int ex = xm_moe_block_scan_i(cnt, sh, &total);
      int64_t gt = gt_run + (ex >> 16), eq = eq_run + (ex & 0xffff);
      for (int i = 0; flags && i < XM_TILE_MOE_RANK_ITEMS; i++) {
        int64_t pos = -1;
        if ((flags >> i) & 1u) {
          pos = off + gt + (eq < rem ? eq : rem);
          gt++;
        } else if ((flags >> (16 + i)) & 1u) {
          if (eq < rem) pos = off + gt + eq;
          eq++;
        }
        if (pos >= 0) {
          indices[pos] = (int32_t)(s0 + i);
          bin_ids[pos] = (int32_t)e;
        }
      }
      gt_run += total >> 16;
      eq_run += total & 0xffff;
    }
  }
}

/* With a capacity: tpe[e] = min(tpe[e], capacity). */
template <class S> XM_GLOBAL(XM_TILE_THREADS) k_permute_clamp(int32_t *tpe, int64_t E_, int64_t capacity_) {
  const int64_t E = XM_DIM(S, E, E_), capacity = XM_DIM(S, capacity, capacity_);
  XM_FOR_GRID(e, E) if (tpe[e] > capacity) tpe[e] = (int32_t)capacity;
}

template <class S>
void xm_g_permute(xm_stream_t s, const int32_t *experts, const float *weights, int32_t *indices,
                  int32_t *bin_ids, int32_t *tpe, int64_t T_, int64_t k_, int64_t E_,
                  int64_t capacity_) {
  const int64_t T = XM_DIM(S, T, T_), k = XM_DIM(S, k, k_), E = XM_DIM(S, E, E_);
  const int64_t capacity = XM_DIM(S, capacity, capacity_);
  if (E <= 0) return;
  const int64_t N = T * k;
  xm_moe_fill<int32_t>(s, tpe, E, 0);
  xm_launch("permute_hist", xm_cdiv(N, XM_TILE_MOE_HIST_SLOTS), xm_cdiv(E, XM_TILE_MOE_BINS), 1,
            XM_TILE_THREADS, s, &k_permute_hist<S>, experts, tpe, T, k, E);
  if (N > 0)
    xm_launch("permute_rank", E < XM_TILE_MAX_GRID_1D ? E : XM_TILE_MAX_GRID_1D, 1, 1,
              XM_TILE_THREADS, s, &k_permute_rank<S>, experts, weights, indices, bin_ids,
              (const int32_t *)tpe, T, k, E, capacity);
  if (capacity > 0)
    xm_launch("permute_clamp", xm_grid_1d(E, XM_TILE_THREADS), 1, 1, XM_TILE_THREADS, s,
              &k_permute_clamp<S>, tpe, E, capacity);
}

/* ---- gather_rows: y[i] = x[indices[i] / k], i < n ------------------------- */

template <class S>
XM_GLOBAL(XM_TILE_THREADS)
k_gather_rows(const float *x, const int32_t *indices, float *y, int64_t n_, int64_t H_, int64_t k_) {
  const int64_t n = XM_DIM(S, n, n_), H = XM_DIM(S, H, H_), k = XM_DIM(S, k, k_);
  const int tpr = xm_moe_tpr(H), rpb = xm_ntid() / tpr, c0 = xm_tid() % tpr;
  for (int64_t i = (int64_t)xm_bid_x() * rpb + xm_tid() / tpr; i < n; i += (int64_t)xm_nbid_x() * rpb) {
    const float *src = x + (int64_t)(indices[i] / k) * H;
    float *dst = y + i * H;
    for (int64_t c = c0; c < H; c += tpr) dst[c] = src[c];
  }
}

template <class S>
void xm_g_gather_rows(xm_stream_t s, const float *x, const int32_t *indices, float *y, int64_t n_,
                      int64_t H_, int64_t k_) {
  const int64_t n = XM_DIM(S, n, n_), H = XM_DIM(S, H, H_), k = XM_DIM(S, k, k_);
  if (H <= 0) return;
  xm_launch("gather_rows", xm_grid_1d(n, XM_TILE_THREADS / xm_moe_tpr(H)), 1, 1, XM_TILE_THREADS,
            s, &k_gather_rows<S>, x, indices, y, n, H, k);
}
XM_G_TABLE(gather_rows)

/* ---- gather_rows_grad: dx = 0, then launch j adds the rows of slot j ---- */

template <class S>
XM_GLOBAL(XM_TILE_THREADS)
k_gather_rows_grad(const float *dy, const int32_t *indices, float *dx, int64_t n_, int64_t T_,
                   int64_t H_, int64_t k_, int64_t j) {
  const int64_t n = XM_DIM(S, n, n_), H = XM_DIM(S, H, H_), k = XM_DIM(S, k, k_);
  (void)T_;
  const int tpr = xm_moe_tpr(H), rpb = xm_ntid() / tpr, c0 = xm_tid() % tpr;
  for (int64_t i = (int64_t)xm_bid_x() * rpb + xm_tid() / tpr; i < n; i += (int64_t)xm_nbid_x() * rpb) {
    const int64_t slot = indices[i];
    if (slot % k != j) continue;
    float *d = dx + (slot / k) * H;
    const float *g = dy + i * H;
    for (int64_t c = c0; c < H; c += tpr) d[c] += g[c];
  }
}

template <class S>
void xm_g_gather_rows_grad(xm_stream_t s, const float *dy, const int32_t *indices, float *dx,
                           int64_t n_, int64_t T_, int64_t H_, int64_t k_) {
  const int64_t n = XM_DIM(S, n, n_), T = XM_DIM(S, T, T_), H = XM_DIM(S, H, H_);
  const int64_t k = XM_DIM(S, k, k_);
  if (H <= 0) return;
  xm_moe_fill<float>(s, dx, T * H, 0.0f);
  for (int64_t j = 0; j < k && n > 0; j++)
    xm_launch("gather_rows_grad", xm_grid_1d(n, XM_TILE_THREADS / xm_moe_tpr(H)), 1, 1,
              XM_TILE_THREADS, s, &k_gather_rows_grad<S>, dy, indices, dx, n, T, H, k, j);
}
XM_G_TABLE(gather_rows_grad)

/* ---- scatter_combine: out = 0, then launch j adds w * y of slot j ------- */

template <class S>
XM_GLOBAL(XM_TILE_THREADS)
k_scatter_combine(const float *y, const int32_t *indices, const float *weights, float *out,
                  int64_t n_, int64_t T_, int64_t k_, int64_t H_, int64_t j) {
  const int64_t n = XM_DIM(S, n, n_), k = XM_DIM(S, k, k_), H = XM_DIM(S, H, H_);
  (void)T_;
  const int tpr = xm_moe_tpr(H), rpb = xm_ntid() / tpr, c0 = xm_tid() % tpr;
  for (int64_t i = (int64_t)xm_bid_x() * rpb + xm_tid() / tpr; i < n; i += (int64_t)xm_nbid_x() * rpb) {
    const int64_t slot = indices[i];
    if (slot % k != j) continue;
    const float w = weights[slot];
    float *o = out + (slot / k) * H;
    const float *src = y + i * H;
    for (int64_t c = c0; c < H; c += tpr) o[c] += w * src[c];
  }
}

template <class S>
void xm_g_scatter_combine(xm_stream_t s, const float *y, const int32_t *indices,
                          const float *weights, float *out, int64_t n_, int64_t T_, int64_t k_,
                          int64_t H_) {
  const int64_t n = XM_DIM(S, n, n_), T = XM_DIM(S, T, T_), k = XM_DIM(S, k, k_);
  const int64_t H = XM_DIM(S, H, H_);
  if (H <= 0) return;
  xm_moe_fill<float>(s, out, T * H, 0.0f);
  for (int64_t j = 0; j < k && n > 0; j++)
    xm_launch("scatter_combine", xm_grid_1d(n, XM_TILE_THREADS / xm_moe_tpr(H)), 1, 1,
              XM_TILE_THREADS, s, &k_scatter_combine<S>, y, indices, weights, out, n, T, k, H, j);
}
XM_G_TABLE(scatter_combine)

/* ---- scatter_combine_grad: per row, dy = w dout[t], dweights = dot ------ */

template <class S>
XM_GLOBAL(XM_TILE_THREADS)
k_scatter_combine_grad(const float *dout, const float *y, const int32_t *indices,
                       const float *weights, float *dy, float *dweights, int64_t n_, int64_t T_,
                       int64_t k_, int64_t H_) {
  const int64_t n = XM_DIM(S, n, n_), k = XM_DIM(S, k, k_), H = XM_DIM(S, H, H_);
  (void)T_;
  const int tpr = xm_moe_tpr(H), rpb = xm_ntid() / tpr, c0 = xm_tid() % tpr;
  /* the loop is uniform over the block: every lane reaches the shuffles */
  for (int64_t base = (int64_t)xm_bid_x() * rpb; base < n; base += (int64_t)xm_nbid_x() * rpb) {
    const int64_t i = base + xm_tid() / tpr;
    const bool act = i < n;
    const int64_t slot = act ? indices[i] : 0;
    const float w = act ? weights[slot] : 0.0f;
    const float *g = dout + (slot / k) * H, *yi = y + i * H;
    float dot = 0.0f;
    if (act)
      for (int64_t c = c0; c < H; c += tpr) {
        const float gc = g[c];
        dy[i * H + c] = w * gc;
        dot += gc * yi[c];
      }
    for (int m = tpr / 2; m > 0; m >>= 1) dot += xm_shfl_xor(dot, m);
    if (act && c0 == 0) dweights[slot] = dot;
  }
}

template <class S>
void xm_g_scatter_combine_grad(xm_stream_t s, const float *dout, const float *y,
                               const int32_t *indices, const float *weights, float *dy,
                               float *dweights, int64_t n_, int64_t T_, int64_t k_, int64_t H_) {
  const int64_t n = XM_DIM(S, n, n_), T = XM_DIM(S, T, T_), k = XM_DIM(S, k, k_);
  const int64_t H = XM_DIM(S, H, H_);
  xm_moe_fill<float>(s, dweights, T * k, 0.0f); /* dropped slots: 0 */
  xm_launch("scatter_combine_grad", xm_grid_1d(n, XM_TILE_THREADS / xm_moe_tpr(H)), 1, 1,
            XM_TILE_THREADS, s, &k_scatter_combine_grad<S>, dout, y, indices, weights, dy,
            dweights, n, T, k, H);
}
XM_G_TABLE(scatter_combine_grad)

/* ---- sort_chunks / unsort_chunks: blocks (p, l) <-> (l, p) --------------- */

/* Grid y: the chunks (p, l); grid x: the chunk's rows. Each warp sums the
 * counts for both offsets itself (P*L is small), so there is no barrier.
 * to_em 1: the input is member-major, the output expert-major (sort); 0
 * the other way. */
template <class S>
XM_GLOBAL(XM_TILE_THREADS)
k_chunks(const float *x, const int32_t *counts, int64_t P_, int64_t L_, int64_t width_, float *y,
         int to_em) {
  const int64_t P = XM_DIM(S, P, P_), L = XM_DIM(S, L, L_), width = XM_DIM(S, width, width_);
  const int64_t PL = P * L;
  for (int64_t c = xm_bid_y(); c < PL; c += xm_nbid_y()) {
    const int64_t p = c / L, l = c % L;
    /* member-major offset: the chunks before c; expert-major: those of a
     * lower expert, or of this one and a lower member */
    int mm = 0, em = 0;
    for (int64_t i = xm_lane(); i < PL; i += XM_WARP) {
      const int ci = counts[i] > 0 ? counts[i] : 0;
      const int64_t pi = i / L, li = i % L;
      if (i < c) mm += ci;
      if (li < l || (li == l && pi < p)) em += ci;
    }
    mm = xm_warp_sum_i(mm);
    em = xm_warp_sum_i(em);
    const int64_t rows = counts[c] > 0 ? counts[c] : 0;
    const float *src = x + (int64_t)(to_em ? mm : em) * width;
    float *dst = y + (int64_t)(to_em ? em : mm) * width;
    /* grid-stride copy, four independent loads in flight per thread */
    const int64_t n = rows * width, step = (int64_t)xm_nbid_x() * xm_ntid();
    int64_t i = (int64_t)xm_bid_x() * xm_ntid() + xm_tid();
    for (; i + 3 * step < n; i += 4 * step) {
      const float a = src[i], b = src[i + step], d = src[i + 2 * step], e = src[i + 3 * step];
      dst[i] = a;
      dst[i + step] = b;
      dst[i + 2 * step] = d;
      dst[i + 3 * step] = e;
    }
    for (; i < n; i += step) dst[i] = src[i];
  }
}

template <class S>
static inline void xm_moe_chunks(xm_stream_t s, const char *name, const float *x,
                                 const int32_t *counts, int64_t P, int64_t L, int64_t width,
                                 float *y, int to_em) {
  if (P <= 0 || L <= 0 || width <= 0) return;
  const int64_t PL = P * L, gx = xm_cdiv(XM_TILE_MOE_CHUNK_BLOCKS, PL);
  xm_launch(name, gx, PL < 65535 ? PL : 65535, 1, XM_TILE_THREADS, s, &k_chunks<S>, x, counts, P,
            L, width, y, to_em);
}

template <class S>
void xm_g_sort_chunks(xm_stream_t s, const float *x, const int32_t *counts, int64_t P_,
                      int64_t L_, int64_t width_, float *y) {
  xm_moe_chunks<S>(s, "sort_chunks", x, counts, XM_DIM(S, P, P_), XM_DIM(S, L, L_),
                   XM_DIM(S, width, width_), y, 1);
}
XM_G_TABLE(sort_chunks)

template <class S>
void xm_g_unsort_chunks(xm_stream_t s, const float *x, const int32_t *counts, int64_t P_,
                        int64_t L_, int64_t width_, float *y) {
  xm_moe_chunks<S>(s, "unsort_chunks", x, counts, XM_DIM(S, P, P_), XM_DIM(S, L, L_),
                   XM_DIM(S, width, width_), y, 0);
}
XM_G_TABLE(unsort_chunks)

/* ---- aux_loss: alpha E/(k T^2) sum_e count_e sum_t s[t,e], one block ---- */

/* The loss is a scalar with no workspace, so one block of
 * XM_TILE_MOE_AUX_THREADS threads does it all, four loads in flight per
 * thread: per chunk of experts a shared histogram of the slots, then the
 * column sums of the scores (a thread per column, or several threads per
 * column, each on every R-th row) weighted by the counts, in double. */
template <class S>
XM_GLOBAL(XM_TILE_MOE_AUX_THREADS)
k_aux_loss(const float *scores, const int32_t *experts, float *loss, int64_t T_, int64_t E_,
           int64_t k_, float alpha) {
  const int64_t T = XM_DIM(S, T, T_), E = XM_DIM(S, E, E_), k = XM_DIM(S, k, k_);
  XM_SHARED(int, bins, XM_TILE_MOE_BINS);
  XM_SHARED(double, red, XM_TILE_MOE_AUX_THREADS);
  const int64_t N = T * k;
  const int tid = xm_tid(), nt = xm_ntid();
  double acc = 0.0;
  for (int64_t e0 = 0; e0 < E; e0 += XM_TILE_MOE_BINS) {
    const int64_t ne = E - e0 < XM_TILE_MOE_BINS ? E - e0 : XM_TILE_MOE_BINS;
    for (int64_t i = tid; i < ne; i += nt) bins[i] = 0;
    xm_sync();
    int64_t i = tid;
    for (; i + 3 * (int64_t)nt < N; i += 4 * (int64_t)nt) {
      const int64_t a = (int64_t)experts[i] - e0, b = (int64_t)experts[i + nt] - e0;
      const int64_t c = (int64_t)experts[i + 2 * nt] - e0, d = (int64_t)experts[i + 3 * nt] - e0;
      if (a >= 0 && a < ne) xm_atomic_add_i32(&bins[a], 1);
      if (b >= 0 && b < ne) xm_atomic_add_i32(&bins[b], 1);
      if (c >= 0 && c < ne) xm_atomic_add_i32(&bins[c], 1);
      if (d >= 0 && d < ne) xm_atomic_add_i32(&bins[d], 1);
    }
    for (; i < N; i += nt) {
      const int64_t a = (int64_t)experts[i] - e0;
      if (a >= 0 && a < ne) xm_atomic_add_i32(&bins[a], 1);
    }
    xm_sync();
    const int64_t cstep = ne >= nt ? nt : ne, R = nt / cstep, r0 = tid / cstep;
    if (r0 < R)
      for (int64_t el = tid % cstep; el < ne; el += cstep) {
        const float *col = scores + e0 + el;
        double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
        int64_t t = r0;
        for (; t + 3 * R < T; t += 4 * R) {
          a0 += col[t * E];
          a1 += col[(t + R) * E];
          a2 += col[(t + 2 * R) * E];
          a3 += col[(t + 3 * R) * E];
        }
        for (; t < T; t += R) a0 += col[t * E];
        acc += (double)bins[el] * ((a0 + a1) + (a2 + a3));
      }
    xm_sync();
  }
  red[tid] = acc;
  xm_sync();
  if (tid == 0) {
    double total = 0.0;
    for (int j = 0; j < nt; j++) total += red[j];
    *loss = N > 0 ? (float)(alpha * ((double)E / ((double)k * (double)T)) * (total / (double)T))
                  : 0.0f;
  }
}

template <class S>
void xm_g_aux_loss(xm_stream_t s, const float *scores, const int32_t *experts, float *loss,
                   int64_t T_, int64_t E_, int64_t k_, float alpha) {
  const int64_t T = XM_DIM(S, T, T_), E = XM_DIM(S, E, E_), k = XM_DIM(S, k, k_);
  xm_launch("aux_loss", 1, 1, 1, XM_TILE_MOE_AUX_THREADS, s, &k_aux_loss<S>, scores, experts, loss,
            T, E, k, alpha);
}
XM_G_TABLE(aux_loss)

/* ---- aux_loss_grad: c count_e in every row, c = dloss alpha E/(k T^2) ---
 * Row 0 holds the slot counts as integers first (zeroed, then permute's
 * histogram adds into it), the rows below are written from them, and row
 * 0 is converted last. */

XM_DEV double xm_moe_aux_c(const float *dloss, float alpha, int64_t T, int64_t E, int64_t k) {
  return (double)dloss[0] * alpha * (double)E / ((double)k * (double)T * (double)T);
}

/* Rows t >= 1 (grid y over rows, x over columns). */
template <class S>
XM_GLOBAL(XM_TILE_THREADS)
k_aux_loss_grad_rows(const float *dloss, float *dscores, int64_t T_, int64_t E_, int64_t k_,
                     float alpha) {
  const int64_t T = XM_DIM(S, T, T_), E = XM_DIM(S, E, E_), k = XM_DIM(S, k, k_);
  const double c = xm_moe_aux_c(dloss, alpha, T, E, k);
  const int32_t *cnt = (const int32_t *)dscores;
  for (int64_t e = (int64_t)xm_bid_x() * xm_ntid() + xm_tid(); e < E;
       e += (int64_t)xm_nbid_x() * xm_ntid()) {
    const float v = (float)(c * (double)cnt[e]);
    for (int64_t t = 1 + xm_bid_y(); t < T; t += xm_nbid_y()) dscores[t * E + e] = v;
  }
}

/* Row 0, each element converted by the thread that reads it. */
template <class S>
XM_GLOBAL(XM_TILE_THREADS)
k_aux_loss_grad_row0(const float *dloss, float *dscores, int64_t T_, int64_t E_, int64_t k_,
                     float alpha) {
  const int64_t T = XM_DIM(S, T, T_), E = XM_DIM(S, E, E_), k = XM_DIM(S, k, k_);
  const double c = xm_moe_aux_c(dloss, alpha, T, E, k);
  int32_t *cnt = (int32_t *)dscores;
  XM_FOR_GRID(e, E) {
    const int32_t n = cnt[e];
    dscores[e] = (float)(c * (double)n);
  }
}

template <class S>
void xm_g_aux_loss_grad(xm_stream_t s, const float *dloss, const float *scores,
                        const int32_t *experts, float *dscores, int64_t T_, int64_t E_,
                        int64_t k_, float alpha) {
  const int64_t T = XM_DIM(S, T, T_), E = XM_DIM(S, E, E_), k = XM_DIM(S, k, k_);
  (void)scores;
  if (T <= 0 || E <= 0) return;
  int32_t *cnt = (int32_t *)dscores;
  xm_moe_fill<int32_t>(s, cnt, E, 0);
  xm_launch("aux_loss_grad_hist", xm_cdiv(T * k, XM_TILE_MOE_HIST_SLOTS),
            xm_cdiv(E, XM_TILE_MOE_BINS), 1, XM_TILE_THREADS, s, &k_permute_hist<S>, experts, cnt,
            T, k, E);
  const int64_t gx = xm_grid_1d(E, XM_TILE_THREADS), gy = T - 1 < 65535 ? T - 1 : 65535;
  xm_launch("aux_loss_grad_rows", gx, gy, 1, XM_TILE_THREADS, s, &k_aux_loss_grad_rows<S>, dloss,
            dscores, T, E, k, alpha);
  xm_launch("aux_loss_grad_row0", gx, 1, 1, XM_TILE_THREADS, s, &k_aux_loss_grad_row0<S>, dloss,
            dscores, T, E, k, alpha);
}
XM_G_TABLE(aux_loss_grad)

/* ---- the table's permute entry: it returns n = sum(tpe) ------------------ */
#ifdef XM_G_BUILD_TABLE
static int64_t xm_g_table_permute(const int32_t *experts, const float *weights, int32_t *indices,
                                  int32_t *bin_ids, int32_t *tpe, int64_t T, int64_t k, int64_t E,
                                  int64_t capacity) {
  xm_g_permute<xm_shape_dyn>(xm_g_table_stream, experts, weights, indices, bin_ids, tpe, T, k, E,
                             capacity);
  int64_t n = 0;
  int32_t buf[1024];
  for (int64_t e0 = 0; e0 < E; e0 += 1024) {
    const int64_t ne = E - e0 < 1024 ? E - e0 : 1024;
    xm_gpu_copy_d2h_sync(buf, tpe + e0, sizeof(int32_t) * (size_t)ne, xm_g_table_stream);
    for (int64_t i = 0; i < ne; i++) n += buf[i];
  }
  return n;
}
static const int xm_g_reg_permute = (xm_g_table.permute = xm_g_table_permute, 0);
#endif

#endif /* XM_RUNTIME_GPU_KERNELS_MOE_CUH */
