/* passes/registry.c — the table of passes, by name.
 *
 * Each pass file defines one const xm_pass_info_t; adding a pass means one
 * extern line and one table entry here. The table is in the order --help
 * lists passes; lookups are linear (a handful of entries).
 */
#include <string.h>

#include "passes/pass.h"

extern const xm_pass_info_t xm_pass_autodiff;
extern const xm_pass_info_t xm_pass_canonicalize;
extern const xm_pass_info_t xm_pass_dce;
extern const xm_pass_info_t xm_pass_fold_accumulate;
extern const xm_pass_info_t xm_pass_fuse_lm_head;
extern const xm_pass_info_t xm_pass_fuse_permute_gemm;
extern const xm_pass_info_t xm_pass_host_reads;
extern const xm_pass_info_t xm_pass_kernel_workspace;
extern const xm_pass_info_t xm_pass_mixed_precision;
extern const xm_pass_info_t xm_pass_shape_infer;
extern const xm_pass_info_t xm_pass_strip_locations;
extern const xm_pass_info_t xm_pass_plan_memory;
extern const xm_pass_info_t xm_pass_recompute;
extern const xm_pass_info_t xm_pass_routed_rows;
extern const xm_pass_info_t xm_pass_schedule;
extern const xm_pass_info_t xm_pass_shard;
extern const xm_pass_info_t xm_pass_overlap_grad_reduce;
extern const xm_pass_info_t xm_pass_overlap_moe_comm;

static const xm_pass_info_t *const k_passes[] = {
    &xm_pass_autodiff,        /* backward graph + optimizer step */
    &xm_pass_canonicalize,    /* local rewrites + dead-op elimination */
    &xm_pass_dce,             /* dead-op elimination only */
    &xm_pass_fold_accumulate, /* weight-gradient GEMMs add into their grad states */
    &xm_pass_fuse_lm_head,    /* LM head + cross-entropy over vocabulary chunks */
    &xm_pass_fuse_permute_gemm, /* gather and combine folded into grouped GEMMs */
    &xm_pass_host_reads,      /* host_read ops where the host needs device values */
    &xm_pass_kernel_workspace, /* kernel scratch as op workspaces for the memory plan */
    &xm_pass_mixed_precision, /* bf16 GEMM operands, f32 accumulation */
    &xm_pass_overlap_grad_reduce, /* gradient reductions start in the last backward */
    &xm_pass_overlap_moe_comm, /* expert all-to-alls beside the independent work */
    &xm_pass_recompute,       /* forward ops rebuilt before their layer's backward */
    &xm_pass_routed_rows,     /* which run-time row count each routed buffer has */
    &xm_pass_shape_infer,     /* result types recomputed from operands */
    &xm_pass_strip_locations, /* every loc set to "" */
    &xm_pass_plan_memory,     /* liveness -> offsets in the arenas */
    &xm_pass_schedule,        /* micro/step op order checked and recorded */
    &xm_pass_shard,           /* global graph -> per-rank SPMD graph */
};

enum { k_num_passes = (int)(sizeof k_passes / sizeof k_passes[0]) };

int xm_pass_count(void) { return k_num_passes; }

const xm_pass_info_t *xm_pass_get(int i) { return i >= 0 && i < k_num_passes ? k_passes[i] : NULL; }

const xm_pass_info_t *xm_pass_find(const char *name) {
  if (!name) return NULL;
  for (int i = 0; i < k_num_passes; i++)
    if (strcmp(k_passes[i]->name, name) == 0) return k_passes[i];
  return NULL;
}
