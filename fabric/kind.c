/* fabric/kind.c — the names of the topologies (fabric/topology.h). */
#include <string.h>

#include "fabric/topology.h"

static const char *const k_names[XM_FAB_KIND_COUNT_] = {
    [XM_FAB_FAT_TREE] = "fat-tree",
    [XM_FAB_FAT_TREE_OVERSUB] = "fat-tree-oversubscribed",
    [XM_FAB_DRAGONFLY] = "dragonfly",
    [XM_FAB_REGIONAL_OCS] = "regional-ocs",
};

const char *xm_fab_kind_name(xm_fab_kind_t k) {
  return k >= 0 && k < XM_FAB_KIND_COUNT_ ? k_names[k] : "?";
}

bool xm_fab_kind_parse(const char *name, xm_fab_kind_t *out) {
  for (int k = 0; k < XM_FAB_KIND_COUNT_; k++)
    if (name && strcmp(name, k_names[k]) == 0) {
      *out = (xm_fab_kind_t)k;
      return true;
    }
  return false;
}
