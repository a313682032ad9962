/* frontend/names.c — spelling of the spec's enumerations. */
#include "frontend/spec.h"

const char *xm_activation_name(xm_activation_t a) {
  return a == XM_ACT_GELU ? "gelu" : "swiglu";
}

const char *xm_scoring_name(xm_scoring_t s) {
  return s == XM_SCORING_SIGMOID ? "sigmoid" : "softmax";
}

const char *xm_attn_kind_name(xm_attn_kind_t a) {
  switch (a) {
  case XM_ATTN_MHA: return "mha";
  case XM_ATTN_GQA: return "gqa";
  case XM_ATTN_MLA: return "mla";
  }
  return "?";
}

const char *xm_topology_name(xm_topology_t t) {
  switch (t) {
  case XM_TOPO_FAT_TREE: return "fat-tree";
  case XM_TOPO_DRAGONFLY: return "dragonfly";
  case XM_TOPO_TORUS: return "torus";
  case XM_TOPO_FAT_TREE_OVERSUB: return "fat-tree-oversubscribed";
  case XM_TOPO_REGIONAL_OCS: return "regional-ocs";
  }
  return "?";
}
