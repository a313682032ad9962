/* fabric/flow.c — phases of flows (fabric/flow.h). */
#include "fabric/flow.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void xm_fab_phase_init(xm_fab_phase_t *p, const char *name, int64_t layer) {
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "%s", name ? name : "");
  p->layer = layer;
}

xm_status_t xm_fab_phase_add(xm_fab_phase_t *p, int64_t src, int64_t dst, double bytes) {
  if (!(bytes > 0) || src == dst) return XM_OK;
  if (p->num_flows == p->cap_flows) {
    int64_t cap = p->cap_flows ? 2 * p->cap_flows : 64;
    xm_fab_flow_t *f = realloc(p->flows, (size_t)cap * sizeof *f);
    if (!f) return XM_ERR_NO_MEMORY;
    p->flows = f;
    p->cap_flows = cap;
  }
  p->flows[p->num_flows++] = (xm_fab_flow_t){.src = src, .dst = dst, .bytes = bytes};
  return XM_OK;
}

void xm_fab_phase_free(xm_fab_phase_t *p) {
  free(p->flows);
  free(p->circuits);
  memset(p, 0, sizeof *p);
}
