/* frontend/layout.h — legality of a parallel layout and its rank groups.
 *
 * A layout {dp, tp, ep, ssmb, rbd, zero} plus the node size (ranks per node)
 * says how one training step is spread over world = dp * tp MPI ranks
 * (docs/design.md, Parallel layout). The layout comes from the spec's "parallel" section, from
 * command-line flags or from the planner; xm_layout_check decides whether it
 * can train the spec and reports every reason it cannot, placed at the knob
 * that was asked for (/parallel/tp or --tp, by origin) with the model field
 * it conflicts with named in the message.
 *
 * The rank groups are pure functions of (layout, world rank). Every group is
 * an arithmetic progression of world ranks, so a group is {first, stride,
 * size} plus this rank's index and a color that is equal exactly for the
 * ranks of one group: runtime/comm/comm.c builds the same groups with
 * MPI_Comm_split(world, color, index). The groups, their names and
 * formulas are declared once in runtime/abi/groups.def, which the runtime
 * reads too; the runtime cannot include this header (it depends on no
 * compiler layer), so it computes the same formulas itself, and
 * tests/unit/test_layout.c checks that the kinds agree with the table.
 */
#ifndef XM_FRONTEND_LAYOUT_H
#define XM_FRONTEND_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "frontend/spec.h"
#include "support/diag.h"
#include "support/status.h"

typedef struct {
  int64_t dp, tp, ep;
  bool ssmb, rbd;
  int zero;               /* ZeRO stage, 0 or 1 */
  int64_t ranks_per_node; /* 0 = unknown: every rank counts as one node */
} xm_layout_t;

/* Where the layout's values came from: decides the place of messages. */
typedef enum {
  XM_LAYOUT_FROM_SPEC,  /* /parallel/dp ..., /cluster/ranks_per_node */
  XM_LAYOUT_FROM_FLAGS, /* --dp ..., --ranks-per-node */
} xm_layout_origin_t;

typedef enum {
  XM_LAYOUT_DP,
  XM_LAYOUT_TP,
  XM_LAYOUT_EP,
  XM_LAYOUT_SSMB,
  XM_LAYOUT_RBD,
  XM_LAYOUT_ZERO,
  XM_LAYOUT_RANKS_PER_NODE,
} xm_layout_knob_t;

/* The place of a knob in messages: "/parallel/tp" or "--tp". Static text. */
const char *xm_layout_place(xm_layout_origin_t origin, xm_layout_knob_t knob);

/* The layout a loaded spec fixes: its parallel section (dp = tp = ep = 1 and
 * zero = training.zero_stage when absent) and the cluster's ranks_per_node
 * (0 without a cluster). */
void xm_layout_from_spec(const xm_spec_t *spec, xm_layout_t *out);

/* Decides whether `layout` can train `spec` (a spec that loaded without
 * errors). Every refusal goes to `diag` as an error, every legal but useless
 * choice (rbd inside one node, tp spanning nodes, zero with nothing to shard)
 * as a warning. Returns XM_OK when no error was added, XM_ERR_UNSUPPORTED
 * when the only errors are things this version cannot train (MLA; qk_norm
 * "full" with tp > 1; rbd with a capacity factor), else
 * XM_ERR_INVALID_INPUT. `source` names the input in messages (may be NULL). */
xm_status_t xm_layout_check(const xm_spec_t *spec, const xm_layout_t *layout,
                            xm_layout_origin_t origin, const char *source, xm_diag_t *diag);

/* "dp2 tp2 ep4 ssmb rbd zero1" (flags that are off are left out), for
 * messages and reports. Truncates to `cap` bytes; returns `buf`. */
char *xm_layout_format(const xm_layout_t *layout, char *buf, size_t cap);

/* ---- derived quantities (layout assumed legal) ------------------------ */

/* The most ranks a layout may have (dp, tp, ep, ranks_per_node and dp*tp):
 * the bound the spec puts on dp, so products stay far inside int64. */
#define XM_LAYOUT_WORLD_MAX ((int64_t)1 << 24)

static inline int64_t xm_layout_world(const xm_layout_t *l) { return l->dp * l->tp; }

/* Ranks per node, with 0 (unknown) read as "the whole world is one node". */
int64_t xm_layout_node_size(const xm_layout_t *l);
int64_t xm_layout_num_nodes(const xm_layout_t *l);

/* Routed experts each EP rank owns (experts / ep). */
static inline int64_t xm_layout_local_experts(int64_t experts, int64_t ep) { return experts / ep; }
/* Contiguous ownership: expert e lives on EP rank e / (experts / ep). */
static inline int64_t xm_layout_expert_owner(int64_t experts, int64_t ep, int64_t e) {
  return e / (experts / ep);
}

/* Some EP group has ranks on more than one node: only then RBD has
 * anything to deduplicate. */
bool xm_layout_ep_spans_nodes(const xm_layout_t *l);
/* rbd is asked for and does something (ep > 1 and the EP groups span
 * nodes). */
bool xm_layout_rbd_active(const xm_layout_t *l);

/* ---- rank groups ------------------------------------------------------ */

/* One kind per XM_GROUP row of runtime/abi/groups.def (WORLD, DP, TP, EP,
 * EDP, NODE: the same values as the runtime's XM_RT_GROUP_*), then its
 * XM_GROUP_LAYOUT rows (EP_NODE: the EP group's ranks on this node, for
 * which the runtime has no communicator; RBD's intra stage runs over the
 * NODE or the EP group). The table has each kind's formulas;
 * xm_layout_group computes them. */
typedef enum {
#define XM_GROUP(e, name, rt, doc) XM_GROUP_##e,
#define XM_GROUP_LAYOUT(e, name, doc) XM_GROUP_##e,
#include "runtime/abi/groups.def"
  XM_GROUP_COUNT
} xm_group_kind_t;

typedef struct {
  int64_t first;  /* world rank of member 0 */
  int64_t stride; /* world-rank distance between consecutive members */
  int64_t size;   /* members */
  int64_t index;  /* this rank's member index (its rank in the group) */
  int64_t color;  /* equal for the members of one group, distinct otherwise */
} xm_group_t;

/* The group of `kind` that world rank `rank` belongs to (layout legal,
 * 0 <= rank < world). */
xm_group_t xm_layout_group(const xm_layout_t *l, xm_group_kind_t kind, int64_t rank);

/* World rank of member i of g. */
static inline int64_t xm_group_member(const xm_group_t *g, int64_t i) {
  return g->first + i * g->stride;
}

/* Members of every group of `kind`: world, dp, tp, ep, world / ep, the
 * node size; for ep_node, whose groups node boundaries cut to different
 * sizes, the largest (rank 0's, min(ep, node size)). Needs only dp, tp,
 * ep >= 1 (and ep dividing the world for edp), so a pass can ask before
 * the whole layout is known to be legal. */
int64_t xm_layout_group_size(const xm_layout_t *l, xm_group_kind_t kind);

/* The kind's name in runtime/abi/groups.def: "world", "dp", "tp", "ep",
 * "edp", "node", "ep_node". */
const char *xm_group_kind_name(xm_group_kind_t kind);

/* The kind a group name denotes: a kind's own name, or an IR alias of the
 * table, which names another kind's ranks ("sp": TP). False for any other
 * name (out untouched). */
bool xm_group_kind_from_name(const char *name, xm_group_kind_t *out);

#endif /* XM_FRONTEND_LAYOUT_H */
