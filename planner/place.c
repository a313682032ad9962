/* planner/place.c — choosing a placement from routing statistics, and what
 * a placement predicts (planner/placement.h; docs/placement.md, "The
 * algorithm" and "The prediction").
 *
 * Each layer is one problem: put E experts into n node blocks of E/n so
 * that the sampled tokens touch as few blocks as possible, under a bound on
 * the slots a block receives. The search works on units at positions:
 * experts at slots, or, when the model's expert groups nest inside the
 * blocks (n_group a multiple of n), whole expert groups at slot groups (the
 * only moves that change a block then). A unit may only trade places with
 * a unit of the same position class: the slot group when the blocks nest
 * inside the expert groups, else everything. When neither nests, expert
 * swaps stay inside a slot group and whole slot groups are swapped too.
 *
 * The state keeps, per sampled token and block, how many of the token's
 * units the block holds, and per unit: the tokens in which it is alone in
 * its block (`alone`) and, per block, the tokens that have a unit there
 * (`present`). Moving unit u from X to Y changes the objective by
 * -alone[u] + (tokens of u - present[u][Y]), exactly, so a swap of a and b
 * is bounded below by the sum of both moves (the tokens holding both add
 * back what they counted) and only promising swaps are evaluated in full.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "planner/placement.h"

#define MAX_STATE ((int64_t)1 << 27) /* entries of the per-(token, block) and (unit, block) tables */
#define MAX_COSAMPLE 2048            /* units for which the sampled pair counts are kept */

typedef struct {
  /* The problem. */
  int64_t U, n, B;   /* units, blocks, units per block */
  int64_t *uload;    /* [U] slots routed to the unit */
  int64_t *C;        /* [U * U] co-selection between units (diagonal 0) */
  int32_t *pclass;   /* [U] class of each position */
  int64_t cap;       /* the most slots a block may receive */
  bool by_samples;
  /* Sampled tokens with two units or more (one unit: always one block). */
  int64_t T, obj_const;
  int64_t *toff;     /* [T + 1] */
  int32_t *tu;       /* the tokens' distinct units */
  int64_t *uoff;     /* [U + 1] */
  int32_t *ut;       /* each unit's tokens */
  int32_t *co;       /* [U * U] sampled tokens holding both units, or NULL */
  /* The state. */
  int32_t *at;       /* [U] position -> unit */
  int32_t *blk;      /* [U] unit -> block */
  int64_t *bload;    /* [n] */
  int32_t *cnt;      /* [T * n] */
  int64_t *alone;    /* [U] */
  int64_t *present;  /* [U * n] */
  int64_t *aff;      /* [U * n] (co-selection objective) */
  int64_t obj;       /* minimised: distinct blocks over the samples (less obj_const), or
                        co-selection across blocks */
} prob_t;

static void *xcalloc(size_t n, size_t sz) {
  void *p = calloc(n > 0 ? n : 1, sz);
  XM_ASSERT(p);
  return p;
}

static void prob_free(prob_t *p) {
  free(p->uload);
  free(p->C);
  free(p->pclass);
  free(p->toff);
  free(p->tu);
  free(p->uoff);
  free(p->ut);
  free(p->co);
  free(p->at);
  free(p->blk);
  free(p->bload);
  free(p->cnt);
  free(p->alone);
  free(p->present);
  free(p->aff);
}

/* ---- the state ------------------------------------------------------------------ */

/* Builds the state of the arrangement p->at from scratch. */
static void state_init(prob_t *p) {
  int64_t U = p->U, n = p->n;
  memset(p->bload, 0, (size_t)n * sizeof *p->bload);
  for (int64_t q = 0; q < U; q++) {
    p->blk[p->at[q]] = (int32_t)(q / p->B);
    p->bload[q / p->B] += p->uload[p->at[q]];
  }
  p->obj = 0;
  if (p->by_samples) {
    memset(p->cnt, 0, (size_t)(p->T * n) * sizeof *p->cnt);
    memset(p->alone, 0, (size_t)U * sizeof *p->alone);
    memset(p->present, 0, (size_t)(U * n) * sizeof *p->present);
    for (int64_t t = 0; t < p->T; t++) {
      int32_t *c = p->cnt + t * n;
      for (int64_t i = p->toff[t]; i < p->toff[t + 1]; i++)
        if (c[p->blk[p->tu[i]]]++ == 0) p->obj++;
      for (int64_t i = p->toff[t]; i < p->toff[t + 1]; i++) {
        int32_t f = p->tu[i];
        if (c[p->blk[f]] == 1) p->alone[f]++;
        for (int64_t j = p->toff[t]; j < p->toff[t + 1]; j++) {
          int32_t b = p->blk[p->tu[j]];
          /* once per block: the first unit of the token in it */
          bool first = true;
          for (int64_t x = p->toff[t]; x < j && first; x++)
            first = p->blk[p->tu[x]] != b;
          if (first) p->present[(int64_t)f * n + b]++;
        }
      }
    }
  } else {
    memset(p->aff, 0, (size_t)(U * n) * sizeof *p->aff);
    for (int64_t a = 0; a < U; a++)
      for (int64_t b = 0; b < U; b++) {
        int64_t c = p->C[a * U + b];
        p->aff[a * n + p->blk[b]] += c;
        if (b > a && p->blk[a] != p->blk[b]) p->obj += c;
      }
  }
}

/* Moves unit u from block X to block Y in the sample tables; returns the
 * change of the objective. */
static int64_t move_unit(prob_t *p, int32_t u, int32_t X, int32_t Y) {
  int64_t n = p->n, delta = 0;
  for (int64_t i = p->uoff[u]; i < p->uoff[u + 1]; i++) {
    int64_t t = p->ut[i];
    int32_t *c = p->cnt + t * n;
    int32_t cx = c[X], cy = c[Y];
    int64_t dpx = -(cx == 1), dpy = cy == 0;
    delta += dpx + dpy;
    for (int64_t j = p->toff[t]; j < p->toff[t + 1]; j++) {
      int32_t f = p->tu[j];
      int64_t *pr = p->present + (int64_t)f * n;
      pr[X] += dpx;
      pr[Y] += dpy;
      if (f == u)
        p->alone[f] += (cy == 0) - (cx == 1);
      else if (p->blk[f] == X)
        p->alone[f] += (cx == 2) - (cx == 1);
      else if (p->blk[f] == Y)
        p->alone[f] -= cy == 1;
    }
    c[X] = cx - 1;
    c[Y] = cy + 1;
  }
  p->blk[u] = Y;
  return delta;
}

/* Swaps the units at positions q and r; returns the change of the objective. */
static int64_t apply_swap(prob_t *p, int64_t q, int64_t r) {
  int32_t a = p->at[q], b = p->at[r];
  int32_t A = p->blk[a], Bk = p->blk[b];
  p->at[q] = b;
  p->at[r] = a;
  if (A == Bk) return 0;
  p->bload[A] += p->uload[b] - p->uload[a];
  p->bload[Bk] += p->uload[a] - p->uload[b];
  int64_t delta = 0;
  if (p->by_samples) {
    delta += move_unit(p, a, A, Bk);
    delta += move_unit(p, b, Bk, A);
  } else {
    int64_t U = p->U, n = p->n;
    int64_t dw = p->aff[a * n + Bk] - p->aff[a * n + A] + p->aff[b * n + A] - p->aff[b * n + Bk] -
                 2 * p->C[a * U + b];
    delta = -dw;
    for (int64_t m = 0; m < U; m++) {
      int64_t d = p->C[m * U + b] - p->C[m * U + a];
      p->aff[m * n + A] += d;
      p->aff[m * n + Bk] -= d;
    }
    p->blk[a] = Bk;
    p->blk[b] = A;
  }
  p->obj += delta;
  return delta;
}

/* Tokens holding both a and b: what the two single moves over-count. */
static int64_t pair_correction(const prob_t *p, int32_t a, int32_t b, int32_t A, int32_t Bk) {
  int32_t s = a, o = b;
  if (p->uoff[b + 1] - p->uoff[b] < p->uoff[a + 1] - p->uoff[a]) s = b, o = a;
  int64_t corr = 0, n = p->n;
  for (int64_t i = p->uoff[s]; i < p->uoff[s + 1]; i++) {
    int64_t t = p->ut[i];
    bool both = false;
    for (int64_t j = p->toff[t]; j < p->toff[t + 1] && !both; j++)
      both = p->tu[j] == o;
    if (both) corr += (p->cnt[t * n + A] == 1) + (p->cnt[t * n + Bk] == 1);
  }
  return corr;
}

/* The exact change of swapping the units at q and r, or 0 when it cannot
 * improve (then *worth is false). */
static bool swap_improves(const prob_t *p, int64_t q, int64_t r) {
  int32_t a = p->at[q], b = p->at[r];
  int32_t A = p->blk[a], Bk = p->blk[b];
  int64_t la = p->uload[a], lb = p->uload[b];
  if (la != lb && (p->bload[A] - la + lb > p->cap || p->bload[Bk] - lb + la > p->cap)) return false;
  int64_t n = p->n;
  if (!p->by_samples) {
    int64_t dw = p->aff[a * n + Bk] - p->aff[a * n + A] + p->aff[b * n + A] - p->aff[b * n + Bk] -
                 2 * p->C[a * p->U + b];
    return dw > 0;
  }
  int64_t ga = -p->alone[a] + (p->uoff[a + 1] - p->uoff[a]) - p->present[(int64_t)a * n + Bk];
  int64_t gb = -p->alone[b] + (p->uoff[b + 1] - p->uoff[b]) - p->present[(int64_t)b * n + A];
  int64_t lb0 = ga + gb;
  if (lb0 >= 0) return false;
  if (p->co) {
    int64_t both = p->co[(int64_t)a * p->U + b];
    if (both == 0 || lb0 + 2 * both < 0) return true;
  }
  return lb0 + pair_correction(p, a, b, A, Bk) < 0;
}

/* ---- the search ------------------------------------------------------------------- */

/* The greedy start (p->at): each block seeded with the heaviest unit of its
 * class, then grown round by round with the unit of the largest
 * co-selection to the block that keeps it within the bound. false when the
 * bound could not be kept (the caller starts from the identity). */
static bool greedy(prob_t *p, const int32_t *uclass) {
  int64_t U = p->U, n = p->n, B = p->B;
  bool *used = xcalloc((size_t)U, sizeof *used);
  int64_t *aff = xcalloc((size_t)(U * n), sizeof *aff);
  int64_t *load = xcalloc((size_t)n, sizeof *load);
  bool ok = true;
  for (int64_t round = 0; round < B; round++)
    for (int64_t j = 0; j < n; j++) {
      int32_t cls = p->pclass[j * B];
      int64_t best = -1, fallback = -1;
      for (int64_t u = 0; u < U; u++) {
        if (used[u] || uclass[u] != cls) continue;
        if (fallback < 0 || p->uload[u] < p->uload[fallback]) fallback = u;
        if (load[j] + p->uload[u] > p->cap) continue;
        if (best < 0) {
          best = u;
          continue;
        }
        int64_t x = round ? aff[u * n + j] : 0, y = round ? aff[best * n + j] : 0;
        if (x > y || (x == y && p->uload[u] > p->uload[best])) best = u;
      }
      if (best < 0) {
        best = fallback;
        ok = false;
      }
      XM_ASSERT(best >= 0);
      used[best] = true;
      p->at[j * B + round] = (int32_t)best;
      load[j] += p->uload[best];
      for (int64_t u = 0; u < U; u++)
        if (!used[u]) aff[u * n + j] += p->C[u * U + best];
    }
  free(used);
  free(aff);
  free(load);
  return ok;
}

/* First-improvement swaps until a pass improves nothing or `passes` ran.
 * gsize > 0: whole slot groups of gsize positions are swapped too. */
static void local_search(prob_t *p, int64_t passes, int64_t gsize, int64_t *out_passes,
                         int64_t *out_swaps) {
  int64_t U = p->U, B = p->B, swaps = 0, pass = 0;
  for (; pass < passes; pass++) {
    bool improved = false;
    for (int64_t q = 0; q < U; q++)
      for (int64_t r = (q / B + 1) * B; r < U; r++) {
        if (p->pclass[q] != p->pclass[r]) continue;
        if (!swap_improves(p, q, r)) continue;
        int64_t d = apply_swap(p, q, r);
        XM_ASSERT(d < 0);
        swaps++;
        improved = true;
      }
    for (int64_t g = 0; gsize > 0 && g < U / gsize; g++)
      for (int64_t h = g + 1; h < U / gsize; h++) {
        int64_t before = p->obj;
        for (int64_t i = 0; i < gsize; i++)
          apply_swap(p, g * gsize + i, h * gsize + i);
        bool within = true;
        for (int64_t j = 0; j < p->n; j++)
          within &= p->bload[j] <= p->cap;
        if (within && p->obj < before) {
          swaps++;
          improved = true;
        } else {
          for (int64_t i = gsize - 1; i >= 0; i--)
            apply_swap(p, g * gsize + i, h * gsize + i);
          XM_ASSERT(p->obj == before);
        }
      }
    if (!improved) {
      pass++;
      break;
    }
  }
  *out_passes = pass;
  *out_swaps = swaps;
}

/* ---- the prediction ------------------------------------------------------------------ */

void xm_place_predict(const xm_routing_stats_t *s, int64_t li, const int32_t *slots, int64_t nodes,
                      xm_place_prediction_t *out) {
  memset(out, 0, sizeof *out);
  const xm_routing_stats_layer_t *l = &s->layers[li];
  int64_t E = s->experts, k = s->top_k, S = E / nodes;
  bool sources = s->nodes == nodes;
  int32_t *block = xcalloc((size_t)E, sizeof *block);
  int64_t *bl = xcalloc((size_t)nodes, sizeof *bl);
  int64_t *seen = xcalloc((size_t)nodes, sizeof *seen);
  int64_t total = 0;
  for (int64_t q = 0; q < E; q++) {
    block[slots[q]] = (int32_t)(q / S);
    bl[q / S] += l->load[slots[q]];
    total += l->load[slots[q]];
  }
  for (int64_t j = 0; j < nodes; j++) {
    seen[j] = -1;
    if (bl[j] > out->max_block_load) out->max_block_load = bl[j];
  }
  out->imbalance = total > 0 ? (double)out->max_block_load * (double)nodes / (double)total : 1.0;
  int64_t rbd = 0, flat = 0;
  for (int64_t t = 0; t < l->samples; t++) {
    int64_t src = sources ? l->sample_node[t] : -1;
    for (int64_t j = 0; j < k; j++) {
      int32_t e = l->sample_experts[t * k + j];
      if (e < 0) continue;
      int32_t b = block[e];
      if (b != src) flat++;
      if (seen[b] != t) {
        seen[b] = t;
        if (b != src) rbd++;
      }
    }
  }
  out->sample_rbd = rbd;
  out->sample_flat = flat;
  double f = sources ? 1.0 : (double)(nodes - 1) / (double)nodes;
  if (l->samples == l->tokens) {
    out->rbd_inter_rows = sources ? (double)rbd : (double)rbd * f;
    out->flat_inter_rows = sources ? (double)flat : (double)flat * f;
  } else if (l->samples > 0) {
    double sc = (double)l->tokens / (double)l->samples;
    out->rbd_inter_rows = (double)rbd * f * sc;
    out->flat_inter_rows = (double)flat * f * sc;
  }
  free(block);
  free(bl);
  free(seen);
}

/* ---- one layer ---------------------------------------------------------------------- */

/* The problem of layer li over units of `usize` experts (1 or a group). */
static void build_problem(const xm_routing_stats_t *s, int64_t li, int64_t n, int64_t usize,
                          prob_t *p) {
  const xm_routing_stats_layer_t *l = &s->layers[li];
  int64_t E = s->experts, k = s->top_k, U = E / usize;
  memset(p, 0, sizeof *p);
  p->U = U;
  p->n = n;
  p->B = U / n;
  p->uload = xcalloc((size_t)U, sizeof *p->uload);
  p->C = xcalloc((size_t)(U * U), sizeof *p->C);
  p->pclass = xcalloc((size_t)U, sizeof *p->pclass);
  p->at = xcalloc((size_t)U, sizeof *p->at);
  p->blk = xcalloc((size_t)U, sizeof *p->blk);
  p->bload = xcalloc((size_t)n, sizeof *p->bload);
  for (int64_t e = 0; e < E; e++)
    p->uload[e / usize] += l->load[e];
  for (int64_t a = 0; a < E; a++)
    for (int64_t b = 0; b < E; b++)
      if (a / usize != b / usize) p->C[(a / usize) * U + b / usize] += l->coselect[a * E + b];
  /* The sampled tokens as lists of distinct units. */
  int64_t T = 0, ids = 0;
  int32_t *tmp = xcalloc((size_t)k, sizeof *tmp);
  int64_t *stamp = xcalloc((size_t)U, sizeof *stamp);
  for (int64_t u = 0; u < U; u++)
    stamp[u] = -1;
  for (int pass = 0; pass < 2; pass++) {
    T = ids = 0;
    for (int64_t t = 0; t < l->samples; t++) {
      int64_t m = 0;
      for (int64_t j = 0; j < k; j++) {
        int32_t e = l->sample_experts[t * k + j];
        if (e < 0) continue;
        int32_t u = (int32_t)(e / usize);
        if (stamp[u] == t + pass * l->samples) continue;
        stamp[u] = t + pass * l->samples;
        tmp[m++] = u;
      }
      if (m == 0) continue;
      if (m == 1) {
        if (pass == 0) p->obj_const++;
        continue;
      }
      if (pass == 1) {
        p->toff[T] = ids;
        for (int64_t i = 0; i < m; i++) {
          p->tu[ids + i] = tmp[i];
          p->uoff[tmp[i] + 1]++;
        }
      }
      T++;
      ids += m;
    }
    if (pass == 0) {
      p->toff = xcalloc((size_t)(T + 1), sizeof *p->toff);
      p->tu = xcalloc((size_t)ids, sizeof *p->tu);
      p->uoff = xcalloc((size_t)(U + 1), sizeof *p->uoff);
    }
  }
  p->toff[T] = ids;
  p->T = T;
  for (int64_t u = 0; u < U; u++)
    p->uoff[u + 1] += p->uoff[u];
  p->ut = xcalloc((size_t)ids, sizeof *p->ut);
  int64_t *fill = xcalloc((size_t)U, sizeof *fill);
  for (int64_t t = 0; t < T; t++)
    for (int64_t i = p->toff[t]; i < p->toff[t + 1]; i++) {
      int32_t u = p->tu[i];
      p->ut[p->uoff[u] + fill[u]++] = (int32_t)t;
    }
  free(fill);
  free(tmp);
  free(stamp);
}

/* Chooses layer li's row into `slots`, filling the layer's result. */
static void place_layer(const xm_routing_stats_t *s, int64_t li, const xm_place_options_t *o,
                        int32_t *slots, xm_place_layer_t *r) {
  const xm_routing_stats_layer_t *l = &s->layers[li];
  int64_t E = s->experts, n = o->nodes, S = E / n;
  int64_t G = o->n_group > 1 ? o->n_group : 1, gs = E / G;
  memset(r, 0, sizeof *r);
  r->layer = l->layer;
  r->tokens = l->tokens;
  r->samples = l->samples;
  r->predicted = l->samples > 0 || l->tokens == 0;
  r->scale = l->samples > 0 ? (l->samples == l->tokens ? 1.0 : (double)l->tokens / (double)l->samples)
                            : l->tokens == 0 ? 1.0
                                             : 0.0;
  for (int64_t q = 0; q < E; q++)
    slots[q] = (int32_t)q;
  xm_place_predict(s, li, slots, n, &r->identity);
  /* The load bound. */
  int64_t total = 0;
  for (int64_t e = 0; e < E; e++)
    total += l->load[e];
  double bound = (1.0 + o->max_imbalance) * (double)total / (double)n;
  int64_t cap = bound >= 9.2e18 ? INT64_MAX : (int64_t)floor(bound * (1 + 1e-12));
  if (r->identity.max_block_load > cap) {
    cap = r->identity.max_block_load;
    r->bound_relaxed = true;
  }
  r->load_bound = cap;
  /* Units: expert groups when they nest inside the blocks, else experts. */
  bool groups_as_units = G > 1 && G % n == 0;
  bool blocks_in_groups = G > 1 && n % G == 0;
  bool misaligned = G > 1 && !groups_as_units && !blocks_in_groups;
  int64_t usize = groups_as_units ? gs : 1;
  prob_t p;
  build_problem(s, li, n, usize, &p);
  p.cap = cap;
  p.by_samples = l->samples > 0;
  r->by_samples = p.by_samples;
  bool fits = p.U * n <= MAX_STATE && (!p.by_samples || p.T * n <= MAX_STATE) && p.B >= 1;
  if (fits && p.by_samples && p.U <= MAX_COSAMPLE) {
    p.co = xcalloc((size_t)(p.U * p.U), sizeof *p.co);
    for (int64_t t = 0; t < p.T; t++)
      for (int64_t i = p.toff[t]; i < p.toff[t + 1]; i++)
        for (int64_t j = p.toff[t]; j < p.toff[t + 1]; j++)
          if (i != j) p.co[(int64_t)p.tu[i] * p.U + p.tu[j]]++;
  }
  if (fits) {
    p.cnt = p.by_samples ? xcalloc((size_t)(p.T * n), sizeof *p.cnt) : NULL;
    p.alone = xcalloc((size_t)p.U, sizeof *p.alone);
    p.present = p.by_samples ? xcalloc((size_t)(p.U * n), sizeof *p.present) : NULL;
    p.aff = p.by_samples ? NULL : xcalloc((size_t)(p.U * n), sizeof *p.aff);
  }
  /* Position classes: the slot group when swaps must stay inside one. */
  for (int64_t q = 0; q < p.U; q++)
    p.pclass[q] = blocks_in_groups || misaligned ? (int32_t)(q * usize / gs) : 0;
  for (int64_t q = 0; q < p.U; q++)
    p.at[q] = (int32_t)q;
  int64_t obj_identity = 0;
  if (fits) {
    state_init(&p);
    obj_identity = p.obj;
  }
  /* Nothing to gain: one expert per block, or no routing at all. */
  bool search = fits && S > 1 && (p.by_samples ? p.T > 0 : obj_identity > 0);
  if (search) {
    int32_t *uclass = xcalloc((size_t)p.U, sizeof *uclass);
    for (int64_t u = 0; u < p.U; u++)
      uclass[u] = p.pclass[u]; /* the identity puts unit u at position u */
    bool started = !misaligned && greedy(&p, uclass);
    if (!started)
      for (int64_t q = 0; q < p.U; q++)
        p.at[q] = (int32_t)q;
    free(uclass);
    state_init(&p);
    local_search(&p, o->passes, misaligned ? gs : 0, &r->passes, &r->swaps);
  }
  int64_t obj_placed = search ? p.obj : obj_identity;
  r->objective_identity = obj_identity + (p.by_samples ? p.obj_const : 0);
  /* Keep the identity unless strictly better. */
  if (search && obj_placed < obj_identity) {
    for (int64_t q = 0; q < p.U; q++)
      for (int64_t i = 0; i < usize; i++)
        slots[q * usize + i] = (int32_t)(p.at[q] * usize + i);
    r->objective_placed = obj_placed + (p.by_samples ? p.obj_const : 0);
  } else {
    for (int64_t q = 0; q < E; q++)
      slots[q] = (int32_t)q;
    r->objective_placed = r->objective_identity;
  }
  for (int64_t q = 0; q < E && !r->changed; q++)
    r->changed = slots[q] != q;
  xm_place_predict(s, li, slots, n, &r->placed);
  prob_free(&p);
}

/* ---- entry points ---------------------------------------------------------------------- */

void xm_place_result_free(xm_place_result_t *r) {
  if (!r) return;
  free(r->layers);
  xm_placement_free(&r->placement);
  memset(r, 0, sizeof *r);
}

static void add_prediction(xm_place_prediction_t *t, const xm_place_prediction_t *x) {
  t->sample_rbd += x->sample_rbd;
  t->sample_flat += x->sample_flat;
  t->rbd_inter_rows += x->rbd_inter_rows;
  t->flat_inter_rows += x->flat_inter_rows;
  if (x->max_block_load > t->max_block_load) t->max_block_load = x->max_block_load;
  if (x->imbalance > t->imbalance) t->imbalance = x->imbalance;
}

xm_status_t xm_place_run(const xm_routing_stats_t *s, const xm_place_options_t *o, xm_diag_t *diag,
                         xm_place_result_t *out) {
  memset(out, 0, sizeof *out);
  int64_t E = s->experts, n = o->nodes;
  int before = xm_diag_error_count(diag);
  if (n < 2)
    xm_diag_add(diag, XM_DIAG_ERROR, "--nodes", NULL,
                "%lld node block: nothing to place (every expert is on the token's node)",
                (long long)n);
  else if (n > E || E % n != 0)
    xm_diag_add(diag, XM_DIAG_ERROR, "--nodes", NULL,
                "%lld experts do not split into %lld equal node blocks (the node count must "
                "divide the experts)",
                (long long)E, (long long)n);
  if (!(o->max_imbalance >= 0) || !isfinite(o->max_imbalance))
    xm_diag_add(diag, XM_DIAG_ERROR, "--max-imbalance", NULL, "must be a finite number >= 0");
  if (o->passes < 0)
    xm_diag_add(diag, XM_DIAG_ERROR, "--passes", NULL, "must be a whole number >= 0");
  if (o->n_group > 1 && E % o->n_group != 0)
    xm_diag_add(diag, XM_DIAG_ERROR, s->source, "/experts",
                "%lld experts do not split into the model's %lld expert groups", (long long)E,
                (long long)o->n_group);
  if (xm_diag_error_count(diag) > before) return XM_ERR_INVALID_INPUT;
  out->nodes = n;
  out->max_imbalance = o->max_imbalance;
  out->sources = s->nodes == n;
  out->num_layers = s->num_layers;
  out->layers = xcalloc((size_t)s->num_layers, sizeof *out->layers);
  xm_placement_t *pl = &out->placement;
  pl->experts = E;
  pl->nodes = n;
  pl->rows = s->num_layers;
  pl->layer = xcalloc((size_t)s->num_layers, sizeof *pl->layer);
  pl->slots = xcalloc((size_t)(s->num_layers * E), sizeof *pl->slots);
  size_t sl = strlen(s->source ? s->source : "") + 1;
  pl->source = malloc(sl);
  XM_ASSERT(pl->source);
  memcpy(pl->source, s->source ? s->source : "", sl);
  for (int64_t i = 0; i < s->num_layers; i++) {
    if (o->progress) o->progress(o->progress_ctx, i, s->num_layers, s->layers[i].layer);
    pl->layer[i] = s->layers[i].layer;
    place_layer(s, i, o, pl->slots + i * E, &out->layers[i]);
    const xm_place_layer_t *r = &out->layers[i];
    if (!r->predicted) {
      out->unpredicted++;
      continue;
    }
    add_prediction(&out->total_identity, &r->identity);
    add_prediction(&out->total_placed, &r->placed);
  }
  return XM_OK;
}

/* ---- JSON --------------------------------------------------------------------------------- */

static void add_rows(cJSON *o, const char *key, bool known, double v) {
  if (known)
    cJSON_AddNumberToObject(o, key, v);
  else
    cJSON_AddNullToObject(o, key);
}

static cJSON *prediction_json(const xm_place_prediction_t *x, bool known) {
  cJSON *o = cJSON_CreateObject();
  add_rows(o, "rbd_inter_rows", known, x->rbd_inter_rows);
  add_rows(o, "flat_inter_rows", known, x->flat_inter_rows);
  cJSON_AddNumberToObject(o, "imbalance", x->imbalance);
  cJSON_AddNumberToObject(o, "max_block_load", (double)x->max_block_load);
  return o;
}

static void add_drop(cJSON *o, bool known, const xm_place_prediction_t *a,
                     const xm_place_prediction_t *b) {
  add_rows(o, "rbd_drop", known && a->rbd_inter_rows > 0,
           a->rbd_inter_rows > 0 ? 1.0 - b->rbd_inter_rows / a->rbd_inter_rows : 0);
}

cJSON *xm_place_result_json(const xm_place_result_t *r, const xm_routing_stats_t *s) {
  cJSON *root = cJSON_CreateObject();
  if (!root) return NULL;
  cJSON_AddStringToObject(root, "stats", s->source ? s->source : "");
  cJSON_AddStringToObject(root, "model", s->model ? s->model : "");
  cJSON_AddNumberToObject(root, "experts", (double)s->experts);
  cJSON_AddNumberToObject(root, "top_k", (double)s->top_k);
  cJSON_AddNumberToObject(root, "nodes", (double)r->nodes);
  cJSON_AddNumberToObject(root, "max_imbalance", r->max_imbalance);
  cJSON_AddStringToObject(root, "sources", r->sources ? "sampled" : "uniform");
  cJSON *arr = cJSON_AddArrayToObject(root, "layers");
  for (int64_t i = 0; i < r->num_layers; i++) {
    const xm_place_layer_t *l = &r->layers[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "layer", (double)l->layer);
    cJSON_AddNumberToObject(o, "samples", (double)l->samples);
    cJSON_AddNumberToObject(o, "tokens", (double)l->tokens);
    cJSON_AddNumberToObject(o, "scale", l->scale);
    cJSON_AddStringToObject(o, "objective", l->by_samples ? "blocks" : "coselect");
    cJSON_AddBoolToObject(o, "changed", l->changed);
    cJSON_AddNumberToObject(o, "load_bound", (double)l->load_bound);
    cJSON_AddBoolToObject(o, "bound_relaxed", l->bound_relaxed);
    cJSON_AddNumberToObject(o, "passes", (double)l->passes);
    cJSON_AddNumberToObject(o, "swaps", (double)l->swaps);
    cJSON_AddItemToObject(o, "identity", prediction_json(&l->identity, l->predicted));
    cJSON_AddItemToObject(o, "placed", prediction_json(&l->placed, l->predicted));
    add_drop(o, l->predicted, &l->identity, &l->placed);
    cJSON_AddItemToArray(arr, o);
  }
  cJSON *t = cJSON_AddObjectToObject(root, "total");
  bool any = r->unpredicted < r->num_layers;
  cJSON_AddItemToObject(t, "identity", prediction_json(&r->total_identity, any));
  cJSON_AddItemToObject(t, "placed", prediction_json(&r->total_placed, any));
  add_drop(t, any, &r->total_identity, &r->total_placed);
  cJSON_AddNumberToObject(t, "layers_unpredicted", (double)r->unpredicted);
  return root;
}
