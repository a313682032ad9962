/* fabric/topology.c — a cluster's network as one of the four topologies
 * (fabric/topology.h), with the defaults of docs/fabric.md, and what it is
 * built of (the bill of materials).
 *
 * Defaults keep the cluster's own numbers: with `nic_ports` and
 * `link_gbps` left at 0 every rank still gets `inter_bw_gbps` across nodes
 * (nic_ports = ranks_per_node, link_bw = inter_bw * ranks / ports). The
 * shapes derived from the switch radix follow docs/fabric.md: leaves that
 * split their ports down:up as oversubscription:1, Frontier-like dragonfly
 * routers (a quarter of the ports to servers, half to the group, a quarter
 * global), regions of 16 servers. Every check names the cluster key a user
 * would change.
 *
 * The bill of materials counts a folded Clos of radix-k switches with as
 * many tiers as the ports need: t tiers reach 2 (k/2)^t ports, the t-1
 * lower tiers have E/(k/2) switches each (half the ports down, half up),
 * the top tier E/k (all down). Server-to-first-switch cables are copper
 * (inside the rack), every switch-to-switch link and every OCS port
 * optical.
 */
#include "fabric/topology.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "fabric/platform.h"

/* ---- shapes shared with the engine ----------------------------------------- */

double xm_fab_server_elec_bw(const xm_fab_topo_t *t) {
  int64_t ports = t->nic_ports - (t->kind == XM_FAB_REGIONAL_OCS ? t->ocs_ports : 0);
  return (double)ports * t->link_bw;
}

/* A leaf of radix k splits its ports down:up = o:1, so k o / (1 + o) ports
 * face the servers, each of which takes nic_ports of them. */
int64_t xm_fab_leaf_servers(const xm_fab_topo_t *t) {
  double o = t->oversubscription >= 1 ? t->oversubscription : 1;
  double down = floor((double)t->switch_radix * o / (1 + o) + 1e-9);
  int64_t n = (int64_t)(down / (double)(t->nic_ports > 0 ? t->nic_ports : 1));
  return n >= 1 ? n : 1;
}

double xm_fab_leaf_uplink_bw(const xm_fab_topo_t *t) {
  double o = t->oversubscription >= 1 ? t->oversubscription : 1;
  return (double)xm_fab_leaf_servers(t) * xm_fab_server_elec_bw(t) / o;
}

int64_t xm_fab_df_pair_links(const xm_fab_topo_t *t) {
  if (t->df_groups <= 1) return 0;
  return t->df_routers_per_group * t->df_global_links / (t->df_groups - 1);
}

/* ---- the topology of a cluster ---------------------------------------------- */

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

__attribute__((format(printf, 3, 4))) static xm_status_t bad(xm_diag_t *diag, const char *key,
                                                             const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  xm_diag_addv(diag, XM_DIAG_ERROR, NULL, key, fmt, ap);
  va_end(ap);
  return XM_ERR_INVALID_INPUT;
}

static xm_status_t dragonfly_shape(const xm_cluster_spec_t *c, xm_fab_topo_t *t, xm_diag_t *diag) {
  int64_t k = t->switch_radix, p = t->nic_ports;
  int64_t spr = c->dragonfly_servers_per_router;
  if (spr <= 0) spr = k / 4 / p >= 1 ? k / 4 / p : 1;
  int64_t routers = ceil_div(t->servers, spr);
  int64_t a = c->dragonfly_routers_per_group;
  if (a <= 0) a = routers < k / 2 ? routers : k / 2;
  if (a < 1) a = 1;
  int64_t h = c->dragonfly_global_links;
  if (h <= 0) {
    h = k - spr * p - (a - 1);
    if (h > k / 4 + 1) h = k / 4 + 1;
    if (h < 1) h = 1;
  }
  int64_t groups = ceil_div(routers, a);
  t->df_servers_per_router = spr;
  t->df_routers_per_group = a;
  t->df_global_links = h;
  t->df_groups = groups;
  if (spr * p + (a - 1) + h > k)
    return bad(diag, "/switch_radix",
               "dragonfly routers need %.0f ports (servers, local and global links), more than "
               "switch_radix %.0f",
               (double)(spr * p + (a - 1) + h), (double)k);
  if (groups > 1 && a * h < groups - 1)
    return bad(diag, "/dragonfly_global_links",
               "%.0f dragonfly groups need at least one global link between every two groups, "
               "but a group has only %.0f global links",
               (double)groups, (double)(a * h));
  return XM_OK;
}

static xm_status_t ocs_shape(const xm_cluster_spec_t *c, xm_fab_topo_t *t, xm_diag_t *diag) {
  if (t->nic_ports < 2)
    return bad(diag, "/nic_ports",
               "regional-ocs needs at least 2 NIC ports per node (one electrical, one optical), "
               "got %.0f",
               (double)t->nic_ports);
  int64_t rs = c->ocs_region_servers;
  if (rs <= 0) rs = t->servers < 16 ? t->servers : 16;
  if (rs > t->servers)
    return bad(diag, "/ocs_region_servers", "a region of %.0f nodes is larger than the %.0f nodes",
               (double)rs, (double)t->servers);
  int64_t o = c->ocs_ports > 0 ? c->ocs_ports : t->nic_ports / 2;
  if (o > t->nic_ports - 1)
    return bad(diag, "/ocs_ports",
               "%.0f OCS ports leave no electrical port of the %.0f NIC ports (at most nic_ports - "
               "1)",
               (double)o, (double)t->nic_ports);
  int64_t sp = c->ocs_switch_ports > 0 ? c->ocs_switch_ports : rs * o;
  if (sp < rs)
    return bad(diag, "/ocs_switch_ports",
               "an OCS of %.0f ports cannot reach each of the %.0f nodes of a region", (double)sp,
               (double)rs);
  if (!(c->ocs_reconfig_ms >= 0) || !isfinite(c->ocs_reconfig_ms))
    return bad(diag, "/ocs_reconfig_ms", "reconfiguration delay %g ms must be >= 0",
               c->ocs_reconfig_ms);
  t->region_servers = rs;
  t->ocs_ports = o;
  t->ocs_switch_ports = sp;
  t->reconfig_s = c->ocs_reconfig_ms * 1e-3;
  t->reconfig_per_layer = c->ocs_reconfig == XM_OCS_PER_LAYER;
  return XM_OK;
}

xm_status_t xm_fab_topo_from_cluster(const xm_cluster_spec_t *c, xm_fab_kind_t kind,
                                     double link_gbps, xm_fab_topo_t *out, xm_diag_t *diag) {
  xm_fab_topo_t t;
  memset(&t, 0, sizeof t);
  memset(out, 0, sizeof *out);
  if (kind < 0 || kind >= XM_FAB_KIND_COUNT_)
    return bad(diag, "/topology", "unknown fabric topology %.0f", (double)kind);
  if (c->nodes < 1 || c->ranks_per_node < 1)
    return bad(diag, "/nodes", "a cluster needs nodes >= 1 and ranks_per_node >= 1 (%.0f, %.0f)",
               (double)c->nodes, (double)c->ranks_per_node);
  if (!(c->intra_bw_gbps > 0) || !isfinite(c->intra_bw_gbps))
    return bad(diag, "/intra_bw_gbps", "intra_bw_gbps %g must be positive", c->intra_bw_gbps);
  if (!(c->inter_bw_gbps > 0) || !isfinite(c->inter_bw_gbps))
    return bad(diag, "/inter_bw_gbps", "inter_bw_gbps %g must be positive", c->inter_bw_gbps);
  if (!(link_gbps >= 0) || !isfinite(link_gbps))
    return bad(diag, "/link_gbps", "link speed %g Gb/s must be >= 0", link_gbps);
  if (!(c->link_gbps >= 0) || !isfinite(c->link_gbps))
    return bad(diag, "/link_gbps", "link_gbps %g must be >= 0", c->link_gbps);
  if (c->nic_ports < 0)
    return bad(diag, "/nic_ports", "nic_ports %.0f must be >= 0", (double)c->nic_ports);
  if (c->switch_radix != 0 && c->switch_radix < 4)
    return bad(diag, "/switch_radix", "switch_radix %.0f must be at least 4",
               (double)c->switch_radix);
  t.kind = kind;
  t.servers = c->nodes;
  t.ranks_per_server = c->ranks_per_node;
  t.intra_bw = c->intra_bw_gbps * 1e9;
  t.intra_lat = c->intra_latency_us * 1e-6;
  t.link_lat = c->inter_latency_us * 1e-6;
  t.nic_ports = c->nic_ports > 0 ? c->nic_ports : c->ranks_per_node;
  double gbps = link_gbps > 0 ? link_gbps : c->link_gbps;
  t.link_bw = gbps > 0 ? gbps * 1e9 / 8
                       : c->inter_bw_gbps * 1e9 * (double)c->ranks_per_node / (double)t.nic_ports;
  t.switch_radix = c->switch_radix > 0 ? c->switch_radix : 64;
  t.oversubscription = 1;
  switch (kind) {
  case XM_FAB_FAT_TREE: break;
  case XM_FAB_FAT_TREE_OVERSUB: {
    double o = c->oversubscription > 0 ? c->oversubscription : 2;
    if (!(o >= 1) || !isfinite(o))
      return bad(diag, "/oversubscription", "oversubscription %g must be >= 1", o);
    t.oversubscription = o;
    double down = floor((double)t.switch_radix * o / (1 + o) + 1e-9);
    if ((double)t.nic_ports > down)
      return bad(diag, "/switch_radix",
                 "a leaf of this switch_radix has %.0f server ports, fewer than the %.0f NIC ports "
                 "of one node",
                 down, (double)t.nic_ports);
    break;
  }
  case XM_FAB_DRAGONFLY: XM_RETURN_IF_ERROR(dragonfly_shape(c, &t, diag)); break;
  case XM_FAB_REGIONAL_OCS: XM_RETURN_IF_ERROR(ocs_shape(c, &t, diag)); break;
  default: break;
  }
  *out = t;
  return XM_OK;
}

/* ---- bill of materials ----------------------------------------------------- */

typedef struct {
  double switches, ports, links; /* links between switches */
} clos_t;

/* A non-blocking folded Clos of radix-k switches below E endpoint ports. */
static clos_t clos(double E, int64_t k) {
  clos_t c = {0, 0, 0};
  if (E <= 0) return c;
  double half = (double)(k / 2), reach = (double)k;
  int tiers = 1;
  while (reach < E && tiers < 16) {
    tiers++;
    reach = 2 * pow(half, tiers);
  }
  c.switches = (tiers - 1) * ceil(E / half) + ceil(E / (double)k);
  c.ports = E * (2 * tiers - 1);
  c.links = E * (tiers - 1);
  return c;
}

/* The tiers above the leaves of a folded Clos whose leaves send U uplink
 * ports up: Clos(U) less its own bottom tier, which the leaves are (one
 * spine tier of ceil(U / k) switches when one switch's k ports reach). */
static clos_t clos_above_leaves(double U, int64_t k) {
  clos_t c = clos(U, k);
  if (U <= 0) return c;
  double half = (double)(k / 2);
  if (U <= (double)k) return (clos_t){.switches = ceil(U / (double)k), .ports = U, .links = 0};
  c.switches -= ceil(U / half);
  c.ports -= 2 * U;
  c.links -= U;
  return c;
}

static void add_optical(xm_fab_bom_t *b, double links) {
  b->transceivers += 2 * links;
  b->fibres += links;
}

void xm_fab_bom(const xm_fab_topo_t *t, xm_fab_bom_t *out) {
  memset(out, 0, sizeof *out);
  double N = (double)t->servers, p = (double)t->nic_ports;
  int64_t k = t->switch_radix;
  out->link_gbps = t->link_bw * 8 / 1e9;
  out->nic_ports = N * p;
  switch (t->kind) {
  case XM_FAB_FAT_TREE: {
    clos_t c = clos(N * p, k);
    out->switches = c.switches;
    out->switch_ports = c.ports;
    out->copper_cables = N * p;
    add_optical(out, c.links);
    break;
  }
  case XM_FAB_FAT_TREE_OVERSUB: {
    int64_t spl = xm_fab_leaf_servers(t);
    double leaves = ceil(N / (double)spl);
    double up = leaves > 1 ? ceil((double)spl * p / t->oversubscription) : 0;
    clos_t spine = clos_above_leaves(leaves * up, k);
    out->switches = leaves + spine.switches;
    out->switch_ports = N * p + leaves * up + spine.ports;
    out->copper_cables = N * p;
    add_optical(out, leaves * up + spine.links);
    break;
  }
  case XM_FAB_DRAGONFLY: {
    double g = (double)t->df_groups, a = (double)t->df_routers_per_group;
    double local = g * a * (a - 1) / 2;
    double global = g * (g - 1) / 2 * (double)xm_fab_df_pair_links(t);
    out->switches = g * a;
    out->switch_ports = N * p + 2 * local + 2 * global;
    out->copper_cables = N * p + local;
    add_optical(out, global);
    break;
  }
  case XM_FAB_REGIONAL_OCS: {
    double o = (double)t->ocs_ports;
    clos_t c = clos(N * (p - o), k);
    out->switches = c.switches;
    out->switch_ports = c.ports;
    out->copper_cables = N * (p - o);
    add_optical(out, c.links);
    /* An OCS port takes one fibre and no transceiver: the switch steers
     * light, the circuit's two ends are the servers' transceivers. */
    out->ocs_ports = N * o;
    out->transceivers += N * o;
    out->fibres += N * o;
    for (int64_t first = 0; first < t->servers; first += t->region_servers) {
      int64_t rs = t->servers - first < t->region_servers ? t->servers - first : t->region_servers;
      out->ocs_switches += (double)ceil_div(rs * t->ocs_ports, t->ocs_switch_ports);
    }
    break;
  }
  default: break;
  }
}
