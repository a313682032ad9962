/* runtime/abi/groups.h — the names of the communication groups and traffic
 * phases, shared by the communicator (runtime/comm/comm.h) and the generated
 * schedule (runtime/comm/spmd.h) without pulling MPI into generated code.
 * The group formulas are in docs/parallelism.md. */
#ifndef XM_RUNTIME_GROUPS_H
#define XM_RUNTIME_GROUPS_H

typedef enum {
  XM_RT_GROUP_WORLD, /* every rank */
  XM_RT_GROUP_DP,    /* same tp index: dense-parameter gradient reduction, ZeRO-1 */
  XM_RT_GROUP_TP,    /* consecutive tp ranks: attention and dense blocks */
  XM_RT_GROUP_EP,    /* consecutive ep token-parallel ranks: expert all-to-all */
  XM_RT_GROUP_EDP,   /* strided by ep: expert-parameter gradient reduction */
  XM_RT_GROUP_NODE,  /* ranks of one node: RBD's intra-node stage */
  XM_RT_GROUP_COUNT
} xm_rt_group_kind_t;

typedef enum {
  XM_RT_PHASE_DISPATCH,
  XM_RT_PHASE_COMBINE,
  XM_RT_PHASE_ALL_REDUCE,
  XM_RT_PHASE_ALL_GATHER,
  XM_RT_PHASE_REDUCE_SCATTER,
  XM_RT_PHASE_OTHER,
  XM_RT_PHASE_COUNT
} xm_rt_phase_t;

#endif /* XM_RUNTIME_GROUPS_H */
