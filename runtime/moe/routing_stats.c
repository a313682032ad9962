/* runtime/moe/routing_stats.c — counting a run's routing per MoE layer and
 * writing it for `xmoec place` (runtime/moe/routing_stats.h). */
#include "runtime/moe/routing_stats.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/comm/comm.h"
#include "runtime/comm/context.h"

/* The co-selection matrix is E x E counts per layer. */
#define XM_RT_ROUTING_MAX_EXPERTS 4096

/* One MoE layer's counts on this rank. */
typedef struct {
  int layer;
  int64_t E, k;
  const int32_t *to_hf; /* slot -> Hugging Face expert (the program's placement row), or NULL */
  int64_t tokens;
  int64_t *load;        /* [E] */
  int64_t *coselect;    /* [E * E] */
  int64_t samples;      /* tokens kept */
  int32_t *sample_ids;  /* [rank_cap * k] */
} layer_stats_t;

struct xm_rt_routing_stats {
  const xm_rt_program_t *p;
  int recording;        /* 0 on the TP members that route duplicate tokens */
  int node, nodes;      /* this rank's node in its EP group, and the group's nodes */
  int ep, ranks_per_node, world;
  int64_t cap, rank_cap; /* sampled tokens per layer: in all, and per recording rank */
  layer_stats_t *layers;
  int num_layers, cap_layers;
  int32_t *host;        /* the routing read to the host */
  int64_t host_n;
};

xm_status_t xm_rt_routing_stats_create(const xm_rt_program_t *p, const void *comm,
                                       int64_t sample_cap, xm_diag_t *diag,
                                       xm_rt_routing_stats_t **out) {
  *out = NULL;
  const xm_rt_comm_t *c = comm;
  if (sample_cap < 0) sample_cap = 0;
  xm_rt_routing_stats_t *s = calloc(1, sizeof *s);
  if (!s) return XM_ERR_NO_MEMORY;
  s->p = p;
  s->recording = 1;
  s->nodes = 1;
  s->ep = 1;
  s->ranks_per_node = 1;
  s->world = 1;
  int recorders = 1;
  if (c) {
    const xm_rt_comm_group_t *ep = xm_rt_comm_group(c, XM_RT_GROUP_EP);
    const xm_rt_comm_group_t *tp = xm_rt_comm_group(c, XM_RT_GROUP_TP);
    int rpn = c->layout.ranks_per_node > 0 ? c->layout.ranks_per_node : 1;
    int me = c->groups[XM_RT_GROUP_WORLD].index;
    s->world = c->layout.world;
    s->ranks_per_node = rpn;
    s->ep = ep->size;
    s->node = me / rpn - ep->members[0] / rpn;
    s->nodes = ep->members[ep->size - 1] / rpn - ep->members[0] / rpn + 1;
    /* The router runs before SSMB's narrow, on the TP group's shared tokens. */
    int dup = tp->size > 1;
    s->recording = !dup || tp->index == 0;
    recorders = dup ? s->world / tp->size : s->world;
  }
  s->cap = sample_cap;
  s->rank_cap = (sample_cap + recorders - 1) / recorders;
  (void)diag;
  *out = s;
  return XM_OK;
}

void xm_rt_routing_stats_free(xm_rt_routing_stats_t *s) {
  if (!s) return;
  for (int i = 0; i < s->num_layers; i++) {
    free(s->layers[i].load);
    free(s->layers[i].coselect);
    free(s->layers[i].sample_ids);
  }
  free(s->layers);
  free(s->host);
  free(s);
}

/* The placement row of `layer`, or NULL (identity). */
static const int32_t *placement_of(const xm_rt_program_t *p, int layer, int64_t E) {
  if (p->placement_experts != E) return NULL;
  for (int r = 0; r < p->placement_rows; r++)
    if (p->placement_layers[r] == layer) return p->placement + (int64_t)r * E;
  return NULL;
}

/* The counts of `layer`, created on first use (layers arrive in the
 * schedule's order, the same on every rank). NULL: out of memory. */
static layer_stats_t *layer_of(xm_rt_routing_stats_t *s, int layer, int64_t E, int64_t k) {
  for (int i = 0; i < s->num_layers; i++)
    if (s->layers[i].layer == layer) return &s->layers[i];
  if (s->num_layers == s->cap_layers) {
    int cap = s->cap_layers ? 2 * s->cap_layers : 16;
    layer_stats_t *g = realloc(s->layers, (size_t)cap * sizeof *g);
    if (!g) return NULL;
    s->layers = g;
    s->cap_layers = cap;
  }
  layer_stats_t *l = &s->layers[s->num_layers];
  memset(l, 0, sizeof *l);
  l->layer = layer;
  l->E = E;
  l->k = k;
  l->to_hf = placement_of(s->p, layer, E);
  l->load = calloc((size_t)E, sizeof *l->load);
  l->coselect = calloc((size_t)(E * E), sizeof *l->coselect);
  l->sample_ids = malloc((size_t)(s->rank_cap * k > 0 ? s->rank_cap * k : 1) * sizeof(int32_t));
  if (!l->load || !l->coselect || !l->sample_ids) {
    free(l->load);
    free(l->coselect);
    free(l->sample_ids);
    return NULL;
  }
  s->num_layers++;
  return l;
}

void xm_rt_routing_observe(xm_rt_exec_t *x, int layer, const int32_t *experts, int64_t T,
                           int64_t k, int64_t E) {
  xm_rt_routing_stats_t *s = x->routing_stats;
  if (!s || T <= 0 || k <= 0) return;
  if (E < 1 || E > XM_RT_ROUTING_MAX_EXPERTS || layer < 0)
    xm_rt_fail(x, "routing statistics: layer %d with %lld experts", layer, (long long)E);
  layer_stats_t *l = layer_of(s, layer, E, k);
  if (!l) xm_rt_fail(x, "routing statistics: out of memory for layer %d", layer);
  if (l->k != k) xm_rt_fail(x, "routing statistics: layer %d routed with two top-k", layer);
  if (!s->recording) return;
  if (s->host_n < T * k) {
    free(s->host);
    s->host = malloc((size_t)(T * k) * sizeof *s->host);
    s->host_n = s->host ? T * k : 0;
    if (!s->host) xm_rt_fail(x, "routing statistics: out of memory for %lld ids", (long long)(T * k));
  }
  xm_rt_read(x, s->host, experts, T * k * (int64_t)sizeof(int32_t));
  int32_t ids[64];
  for (int64_t t = 0; t < T; t++) {
    const int32_t *row = s->host + t * k;
    int64_t n = 0;
    for (int64_t j = 0; j < k; j++) {
      int32_t e = row[j];
      if (e >= E) xm_rt_fail(x, "routing statistics: expert %d of %lld in layer %d", e, (long long)E, layer);
      int32_t h = e < 0 ? -1 : l->to_hf ? l->to_hf[e] : e;
      if (l->samples < s->rank_cap) l->sample_ids[l->samples * k + j] = h;
      if (h < 0) continue;
      l->load[h]++;
      if (n < 64) ids[n++] = h;
    }
    for (int64_t a = 0; a < n; a++)
      for (int64_t b = 0; b < n; b++)
        if (a != b) l->coselect[(int64_t)ids[a] * E + ids[b]]++;
    if (l->samples < s->rank_cap) l->samples++;
    l->tokens++;
  }
}

/* ---- writing ------------------------------------------------------------------ */

static void put_i64s(FILE *f, const int64_t *v, int64_t n) {
  fputc('[', f);
  for (int64_t i = 0; i < n; i++)
    fprintf(f, "%s%" PRId64, i ? "," : "", v[i]);
  fputc(']', f);
}

static void put_i32s(FILE *f, const int32_t *v, int64_t n) {
  fputc('[', f);
  for (int64_t i = 0; i < n; i++)
    fprintf(f, "%s%" PRId32, i ? "," : "", v[i]);
  fputc(']', f);
}

/* A JSON string of the model name (quotes, backslashes and control bytes escaped). */
static void put_string(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
    if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
    else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
    else fputc(*p, f);
  }
  fputc('"', f);
}

/* Rank 0's view of one layer after the reduction. */
typedef struct {
  int64_t tokens, samples;
  int64_t *load, *coselect;
  int32_t *ids, *nodes; /* [samples * k], [samples] */
} merged_t;

static void merged_free(merged_t *m) {
  free(m->load);
  free(m->coselect);
  free(m->ids);
  free(m->nodes);
}

/* Sums the counts of layer i on rank 0 and gathers the samples (in rank
 * order, cut at the cap). Collective; every rank must call it for the same i. */
static xm_status_t merge_layer(const xm_rt_routing_stats_t *s, const xm_rt_comm_t *c, int i,
                               merged_t *m) {
  const layer_stats_t *l = &s->layers[i];
  int64_t E = l->E, k = l->k;
  memset(m, 0, sizeof *m);
  int me = c ? c->groups[XM_RT_GROUP_WORLD].index : 0;
  int world = c ? c->layout.world : 1;
  MPI_Comm comm = c ? c->groups[XM_RT_GROUP_WORLD].comm : MPI_COMM_NULL;
  int64_t mine_samples = s->recording ? l->samples : 0;
  int bad = 0;
  if (me == 0) {
    m->load = malloc((size_t)E * sizeof *m->load);
    m->coselect = malloc((size_t)(E * E) * sizeof *m->coselect);
    bad = !m->load || !m->coselect;
  }
  int64_t *counts = NULL; /* samples per rank */
  if (me == 0) counts = calloc((size_t)world, sizeof *counts);
  if (me == 0 && !counts) bad = 1;
  if (c) MPI_Bcast(&bad, 1, MPI_INT, 0, comm);
  if (bad) {
    free(counts);
    merged_free(m);
    return XM_ERR_NO_MEMORY;
  }
  /* The members that do not record hold zeros (they never count). */
  int64_t tokens = l->tokens;
  if (!c) {
    memcpy(m->load, l->load, (size_t)E * sizeof *m->load);
    memcpy(m->coselect, l->coselect, (size_t)(E * E) * sizeof *m->coselect);
    m->tokens = tokens;
    counts[0] = mine_samples;
  } else {
    MPI_Reduce(l->load, m->load, (int)E, MPI_INT64_T, MPI_SUM, 0, comm);
    MPI_Reduce(l->coselect, m->coselect, (int)(E * E), MPI_INT64_T, MPI_SUM, 0, comm);
    MPI_Reduce(&tokens, &m->tokens, 1, MPI_INT64_T, MPI_SUM, 0, comm);
    MPI_Gather(&mine_samples, 1, MPI_INT64_T, counts, 1, MPI_INT64_T, 0, comm);
  }
  if (me == 0) {
    int64_t total = 0;
    for (int r = 0; r < world; r++)
      total += counts[r];
    m->ids = malloc((size_t)(total * k > 0 ? total * k : 1) * sizeof *m->ids);
    m->nodes = malloc((size_t)(total > 0 ? total : 1) * sizeof *m->nodes);
    bad = !m->ids || !m->nodes;
  }
  if (c) MPI_Bcast(&bad, 1, MPI_INT, 0, comm);
  if (bad) {
    free(counts);
    merged_free(m);
    return XM_ERR_NO_MEMORY;
  }
  /* The samples, rank by rank, with the node each came from. */
  int64_t at = 0;
  if (me == 0) {
    memcpy(m->ids, l->sample_ids, (size_t)(mine_samples * k) * sizeof *m->ids);
    for (int64_t t = 0; t < mine_samples; t++)
      m->nodes[t] = s->node;
    at = mine_samples;
  }
  if (c) {
    int node_sent = s->node;
    int *node_of = me == 0 ? malloc((size_t)world * sizeof *node_of) : NULL;
    MPI_Gather(&node_sent, 1, MPI_INT, node_of, 1, MPI_INT, 0, comm);
    for (int r = 1; r < world; r++) {
      if (me == r && mine_samples > 0)
        MPI_Send(l->sample_ids, (int)(mine_samples * k), MPI_INT32_T, 0, 0x5253, comm);
      if (me == 0 && counts[r] > 0) {
        MPI_Recv(m->ids + at * k, (int)(counts[r] * k), MPI_INT32_T, r, 0x5253, comm,
                 MPI_STATUS_IGNORE);
        for (int64_t t = 0; t < counts[r]; t++)
          m->nodes[at + t] = node_of ? node_of[r] : 0;
        at += counts[r];
      }
    }
    free(node_of);
  }
  m->samples = at < s->cap ? at : s->cap;
  free(counts);
  return XM_OK;
}

xm_status_t xm_rt_routing_stats_write(xm_rt_routing_stats_t *s, const void *comm,
                                      const char *path, int64_t steps, xm_diag_t *diag) {
  const xm_rt_comm_t *c = comm;
  int me = c ? c->groups[XM_RT_GROUP_WORLD].index : 0;
  MPI_Comm wc = c ? c->groups[XM_RT_GROUP_WORLD].comm : MPI_COMM_NULL;
  /* Every rank must have seen the same layers in the same order. */
  int n = s->num_layers, lo = n, hi = n;
  if (c) {
    MPI_Allreduce(&n, &lo, 1, MPI_INT, MPI_MIN, wc);
    MPI_Allreduce(&n, &hi, 1, MPI_INT, MPI_MAX, wc);
  }
  if (lo != hi) {
    xm_diag_add(diag, XM_DIAG_ERROR, path, NULL,
                "routing statistics: the ranks routed different numbers of MoE layers (%d to %d)",
                lo, hi);
    return XM_ERR_INTERNAL;
  }
  char *tmp = NULL;
  FILE *f = NULL;
  int failed = 0;
  if (me == 0) {
    size_t len = strlen(path) + 32;
    tmp = malloc(len);
    if (tmp) snprintf(tmp, len, "%s.tmp-%ld", path, (long)getpid());
    f = tmp ? fopen(tmp, "w") : NULL;
    failed = !f;
  }
  if (c) MPI_Bcast(&failed, 1, MPI_INT, 0, wc);
  if (failed) {
    if (me == 0)
      xm_diag_add(diag, XM_DIAG_ERROR, path, NULL, "cannot write the routing statistics: %s",
                  strerror(errno));
    free(tmp);
    return XM_ERR_IO;
  }
  int64_t E = n ? s->layers[0].E : s->p->placement_experts;
  int64_t k = n ? s->layers[0].k : 0;
  if (me == 0) {
    fprintf(f, "{\"format\": \"xmoec-routing-stats\", \"version\": 1, \"model\": ");
    put_string(f, s->p->model_name);
    fprintf(f,
            ", \"experts\": %" PRId64 ", \"top_k\": %" PRId64
            ",\n \"layout\": {\"world\": %d, \"ep\": %d, \"ranks_per_node\": %d, \"nodes\": %d},"
            " \"placed\": %s, \"steps\": %" PRId64 ", \"sample_cap\": %" PRId64
            ",\n \"layers\": [",
            E, k, s->world, s->ep, s->ranks_per_node, s->nodes,
            s->p->placement_rows > 0 ? "true" : "false", steps, s->cap);
  }
  xm_status_t st = XM_OK;
  for (int i = 0; i < n && st == XM_OK; i++) {
    merged_t m;
    st = merge_layer(s, c, i, &m);
    if (st != XM_OK) break;
    if (me == 0) {
      const layer_stats_t *l = &s->layers[i];
      fprintf(f, "%s\n  {\"layer\": %d, \"tokens\": %" PRId64 ", \"load\": ", i ? "," : "",
              l->layer, m.tokens);
      put_i64s(f, m.load, l->E);
      fprintf(f, ",\n   \"coselect\": ");
      put_i64s(f, m.coselect, l->E * l->E);
      fprintf(f, ",\n   \"samples\": %" PRId64 ", \"sample_node\": ", m.samples);
      put_i32s(f, m.nodes, m.samples);
      fprintf(f, ",\n   \"sample_experts\": ");
      put_i32s(f, m.ids, m.samples * l->k);
      fprintf(f, "}");
    }
    merged_free(&m);
  }
  if (me == 0) {
    fprintf(f, "\n ]}\n");
    int bad = ferror(f) != 0;
    bad |= fclose(f) != 0;
    if (st == XM_OK && (bad || rename(tmp, path) != 0)) {
      xm_diag_add(diag, XM_DIAG_ERROR, path, NULL, "cannot write the routing statistics: %s",
                  strerror(errno));
      st = XM_ERR_IO;
    }
    if (st != XM_OK) unlink(tmp);
    if (st == XM_ERR_NO_MEMORY)
      xm_diag_add(diag, XM_DIAG_ERROR, path, NULL,
                  "out of memory gathering the routing statistics");
  }
  free(tmp);
  int code = (int)st;
  if (c) MPI_Bcast(&code, 1, MPI_INT, 0, wc);
  return (xm_status_t)code;
}
