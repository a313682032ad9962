/* runtime/abi/groups.h — the communication groups and traffic phases,
 * shared by the communicator (runtime/comm/comm.h) and the generated
 * schedule (runtime/comm/spmd.h) without pulling MPI into generated code.
 * Both lists come from runtime/abi/groups.def, which the compiler reads
 * too (frontend/layout.h, ir/verify.c), so a group or phase is named and
 * numbered in one place; the group formulas are there and in
 * docs/parallelism.md. */
#ifndef XM_RUNTIME_GROUPS_H
#define XM_RUNTIME_GROUPS_H

/* XM_RT_GROUP_WORLD, _DP, _TP, _EP, _EDP, _NODE: the XM_GROUP rows. */
typedef enum {
#define XM_GROUP(e, name, rt, doc) XM_RT_GROUP_##e,
#include "runtime/abi/groups.def"
  XM_RT_GROUP_COUNT
} xm_rt_group_kind_t;

/* XM_RT_PHASE_DISPATCH, _COMBINE, _ALL_REDUCE, _ALL_GATHER,
 * _REDUCE_SCATTER, _OTHER: the XM_PHASE rows. */
typedef enum {
#define XM_PHASE(e, name, doc) XM_RT_PHASE_##e,
#include "runtime/abi/groups.def"
  XM_RT_PHASE_COUNT
} xm_rt_phase_t;

/* The table's name of a group kind ("world", "dp", ...), "?" for a value
 * that is no kind. */
static inline const char *xm_rt_group_kind_name(xm_rt_group_kind_t kind) {
  switch (kind) {
#define XM_GROUP(e, name, rt, doc)                                                                 \
  case XM_RT_GROUP_##e: return name;
#include "runtime/abi/groups.def"
  default: return "?";
  }
}

/* The table's name of a phase ("dispatch", ..., "other"), "?" for a value
 * that is no phase. */
static inline const char *xm_rt_phase_kind_name(xm_rt_phase_t phase) {
  switch (phase) {
#define XM_PHASE(e, name, doc)                                                                     \
  case XM_RT_PHASE_##e: return name;
#include "runtime/abi/groups.def"
  default: return "?";
  }
}

#endif /* XM_RUNTIME_GROUPS_H */
