/* fabric/platform.c — a topology as a SimGrid platform file (XML 4.1),
 * the flow engine's input (fabric/sim.c; docs/fabric.md, "Platforms").
 *
 * Everything sits in one zone with full routing whose children are
 * SimGrid clusters: a cluster's route between two of its hosts is the
 * sender's private link up and the receiver's down, no backbone, which is
 * exactly a non-blocking switch behind per-host links. Links are split
 * duplex (one direction does not slow the other) and have no latency (the
 * engine adds latencies per phase). The ranks are one such cluster of
 * intra_bw links (flows stay inside a node); the electrical network is
 *
 *   fat-tree / regional-ocs   one cluster of the servers' NIC capacity;
 *   oversubscribed            one cluster per leaf, and between two leaves
 *                             the source leaf's uplink up and the
 *                             destination's down;
 *   dragonfly                 one cluster per router (its servers), and
 *                             between two routers an explicit minimal
 *                             route: the local link inside a group; else
 *                             [local] global [local], the global link
 *                             chosen at the source router if it has one to
 *                             the destination group.
 *
 * regional-ocs adds a zone of the servers' optical sides with one link per
 * circuit pair, its bandwidth set per phase by the engine.
 */
#include "fabric/platform.h"

#include <stdlib.h>

typedef struct {
  int64_t x, y, count; /* router index in the lower group, in the upper group */
} pipe_t;

static void emit_cluster(FILE *f, const char *id, int64_t first, int64_t last, double bw,
                         const char *router) {
  fprintf(f,
          "<cluster id=\"%s\" prefix=\"s\" suffix=\"\" radical=\"%lld-%lld\" speed=\"1f\" "
          "bw=\"%.17gBps\" lat=\"0s\" sharing_policy=\"SPLITDUPLEX\"%s%s%s/>\n",
          id, (long long)first, (long long)last, bw, router ? " router_id=\"" : "",
          router ? router : "", router ? "\"" : "");
}

static void emit_link(FILE *f, const char *id, double bw) {
  fprintf(
      f, "<link id=\"%s\" bandwidth=\"%.17gBps\" latency=\"0s\" sharing_policy=\"SPLITDUPLEX\"/>\n",
      id, bw);
}

/* ---- fat-tree-oversubscribed ----------------------------------------------- */

static void write_oversub(FILE *f, const xm_fab_topo_t *t) {
  int64_t spl = xm_fab_leaf_servers(t), leaves = (t->servers + spl - 1) / spl;
  char id[64], rt[64];
  for (int64_t l = 0; l < leaves; l++) {
    int64_t last = (l + 1) * spl < t->servers ? (l + 1) * spl - 1 : t->servers - 1;
    snprintf(id, sizeof id, "leaf%lld", (long long)l);
    snprintf(rt, sizeof rt, "lr%lld", (long long)l);
    emit_cluster(f, id, l * spl, last, xm_fab_server_elec_bw(t), rt);
  }
  if (leaves < 2) return;
  for (int64_t l = 0; l < leaves; l++) {
    snprintf(id, sizeof id, "up%lld", (long long)l);
    emit_link(f, id, xm_fab_leaf_uplink_bw(t));
  }
  for (int64_t a = 0; a < leaves; a++)
    for (int64_t b = 0; b < leaves; b++)
      if (a != b)
        fprintf(f,
                "<zoneRoute src=\"leaf%lld\" dst=\"leaf%lld\" gw_src=\"lr%lld\" gw_dst=\"lr%lld\" "
                "symmetrical=\"NO\"><link_ctn id=\"up%lld\" direction=\"UP\"/>"
                "<link_ctn id=\"up%lld\" direction=\"DOWN\"/></zoneRoute>\n",
                (long long)a, (long long)b, (long long)a, (long long)b, (long long)a, (long long)b);
}

/* ---- dragonfly ------------------------------------------------------------- */

/* The global links between groups i < j, bundled per router pair: link m
 * of the pair is global port k n + m of each group, where k numbers the
 * other group among the group's g-1 peers (consecutive wiring), and port q
 * sits on router q / h. */
static int64_t df_pipes(const xm_fab_topo_t *t, int64_t i, int64_t j, pipe_t *out) {
  int64_t g = t->df_groups, h = t->df_global_links, n = xm_fab_df_pair_links(t), np = 0;
  int64_t ki = (j - i - 1 + g) % g, kj = (i - j - 1 + g) % g;
  for (int64_t m = 0; m < n; m++) {
    int64_t x = (ki * n + m) / h, y = (kj * n + m) / h;
    if (np > 0 && out[np - 1].x == x && out[np - 1].y == y)
      out[np - 1].count++;
    else
      out[np++] = (pipe_t){x, y, 1};
  }
  return np;
}

/* Local link between routers x < y of group g; traversed x -> y it is UP. */
static void local_name(char *buf, size_t cap, const xm_fab_topo_t *t, int64_t g, int64_t x,
                       int64_t y) {
  (void)t;
  snprintf(buf, cap, "L%lld_%lld_%lld", (long long)g, (long long)(x < y ? x : y),
           (long long)(x < y ? y : x));
}

static void emit_hop(FILE *f, const char *link, bool up) {
  fprintf(f, "<link_ctn id=\"%s\" direction=\"%s\"/>", link, up ? "UP" : "DOWN");
}

static void emit_local(FILE *f, const xm_fab_topo_t *t, int64_t g, int64_t x, int64_t y) {
  char name[96];
  if (x == y) return;
  local_name(name, sizeof name, t, g, x, y);
  emit_hop(f, name, x < y);
}

static xm_status_t write_dragonfly(FILE *f, const xm_fab_topo_t *t) {
  int64_t spr = t->df_servers_per_router, a = t->df_routers_per_group, g = t->df_groups;
  int64_t routers = (t->servers + spr - 1) / spr, n = xm_fab_df_pair_links(t);
  char id[96], rt[96];
  for (int64_t r = 0; r < routers; r++) {
    int64_t last = (r + 1) * spr < t->servers ? (r + 1) * spr - 1 : t->servers - 1;
    snprintf(id, sizeof id, "rt%lld", (long long)r);
    snprintf(rt, sizeof rt, "R%lld", (long long)r);
    emit_cluster(f, id, r * spr, last, xm_fab_server_elec_bw(t), rt);
  }
  if (routers < 2) return XM_OK;
  for (int64_t grp = 0; grp < g; grp++)
    for (int64_t x = 0; x < a; x++)
      for (int64_t y = x + 1; y < a; y++) {
        local_name(id, sizeof id, t, grp, x, y);
        emit_link(f, id, t->link_bw);
      }
  /* pipes[(i * g + j) * n ...] for i < j */
  size_t cells = (size_t)g * (size_t)g * (size_t)(n > 0 ? n : 1);
  pipe_t *pipes = calloc(cells, sizeof *pipes);
  int64_t *npipes = calloc((size_t)g * (size_t)g, sizeof *npipes);
  if (!pipes || !npipes) {
    free(pipes);
    free(npipes);
    return XM_ERR_NO_MEMORY;
  }
  for (int64_t i = 0; i < g; i++)
    for (int64_t j = i + 1; j < g; j++) {
      pipe_t *p = pipes + (size_t)(i * g + j) * (size_t)n;
      npipes[i * g + j] = df_pipes(t, i, j, p);
      for (int64_t k = 0; k < npipes[i * g + j]; k++) {
        snprintf(id, sizeof id, "G%lld_%lld_%lld", (long long)i, (long long)j, (long long)k);
        emit_link(f, id, (double)p[k].count * t->link_bw);
      }
    }
  for (int64_t r1 = 0; r1 < routers; r1++)
    for (int64_t r2 = 0; r2 < routers; r2++) {
      if (r1 == r2) continue;
      int64_t g1 = r1 / a, x1 = r1 % a, g2 = r2 / a, x2 = r2 % a;
      fprintf(f,
              "<zoneRoute src=\"rt%lld\" dst=\"rt%lld\" gw_src=\"R%lld\" gw_dst=\"R%lld\" "
              "symmetrical=\"NO\">",
              (long long)r1, (long long)r2, (long long)r1, (long long)r2);
      if (g1 == g2) {
        emit_local(f, t, g1, x1, x2);
      } else {
        /* the pipe's ends in the source and destination groups */
        int64_t lo = g1 < g2 ? g1 : g2, hi = g1 < g2 ? g2 : g1;
        const pipe_t *p = pipes + (size_t)(lo * g + hi) * (size_t)n;
        int64_t np = npipes[lo * g + hi], best = -1, best_score = -1;
        for (int64_t k = 0; k < np; k++) {
          int64_t s = p[k].x, d = p[k].y;
          if (g1 > g2) s = p[k].y, d = p[k].x;
          int64_t score = (s == x1 ? 2 : 0) + (d == x2 ? 1 : 0);
          if (score > best_score) best = k, best_score = score;
        }
        if (best_score == 0) best = (x1 + x2) % np;
        int64_t s = g1 < g2 ? p[best].x : p[best].y, d = g1 < g2 ? p[best].y : p[best].x;
        emit_local(f, t, g1, x1, s);
        snprintf(id, sizeof id, "G%lld_%lld_%lld", (long long)lo, (long long)hi, (long long)best);
        emit_hop(f, id, g1 < g2);
        emit_local(f, t, g2, d, x2);
      }
      fprintf(f, "</zoneRoute>\n");
    }
  free(pipes);
  free(npipes);
  return XM_OK;
}

/* ---- regional-ocs circuits ------------------------------------------------- */

static xm_status_t write_circuits(FILE *f, const xm_fab_topo_t *t, const int64_t *circ_a,
                                  const int64_t *circ_b, int64_t num_circ) {
  if (num_circ == 0) return XM_OK;
  bool *used = calloc((size_t)t->servers, sizeof *used);
  if (!used) return XM_ERR_NO_MEMORY;
  for (int64_t k = 0; k < num_circ; k++)
    used[circ_a[k]] = used[circ_b[k]] = true;
  fprintf(f, "<zone id=\"ocs\" routing=\"Full\">\n");
  for (int64_t s = 0; s < t->servers; s++)
    if (used[s]) fprintf(f, "<host id=\"o%lld\" speed=\"1f\"/>\n", (long long)s);
  free(used);
  char id[64];
  for (int64_t k = 0; k < num_circ; k++) {
    snprintf(id, sizeof id, "c%lld", (long long)k);
    emit_link(f, id, t->link_bw);
  }
  for (int64_t k = 0; k < num_circ; k++)
    fprintf(f,
            "<route src=\"o%lld\" dst=\"o%lld\" symmetrical=\"NO\"><link_ctn id=\"c%lld\" "
            "direction=\"UP\"/></route>\n<route src=\"o%lld\" dst=\"o%lld\" "
            "symmetrical=\"NO\"><link_ctn id=\"c%lld\" direction=\"DOWN\"/></route>\n",
            (long long)circ_a[k], (long long)circ_b[k], (long long)k, (long long)circ_b[k],
            (long long)circ_a[k], (long long)k);
  fprintf(f, "</zone>\n");
  return XM_OK;
}

xm_status_t xm_fab_platform_write(FILE *f, const xm_fab_topo_t *t, const int64_t *circ_a,
                                  const int64_t *circ_b, int64_t num_circ) {
  fprintf(f,
          "<?xml version='1.0'?>\n<!DOCTYPE platform SYSTEM \"https://simgrid.org/simgrid.dtd\">\n"
          "<platform version=\"4.1\">\n<zone id=\"world\" routing=\"Full\">\n");
  fprintf(f,
          "<cluster id=\"ranks\" prefix=\"r\" suffix=\"\" radical=\"0-%lld\" speed=\"1f\" "
          "bw=\"%.17gBps\" lat=\"0s\" sharing_policy=\"SPLITDUPLEX\"/>\n",
          (long long)(t->servers * t->ranks_per_server - 1), t->intra_bw);
  xm_status_t st = XM_OK;
  switch (t->kind) {
  case XM_FAB_FAT_TREE_OVERSUB: write_oversub(f, t); break;
  case XM_FAB_DRAGONFLY: st = write_dragonfly(f, t); break;
  case XM_FAB_REGIONAL_OCS:
    st = write_circuits(f, t, circ_a, circ_b, num_circ);
    emit_cluster(f, "net", 0, t->servers - 1, xm_fab_server_elec_bw(t), NULL);
    break;
  default: emit_cluster(f, "net", 0, t->servers - 1, xm_fab_server_elec_bw(t), NULL); break;
  }
  fprintf(f, "</zone>\n</platform>\n");
  if (st == XM_OK && (fflush(f) != 0 || ferror(f))) st = XM_ERR_IO;
  return st;
}
