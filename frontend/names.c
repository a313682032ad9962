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
