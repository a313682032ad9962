/* support/rbd_copies.h — the expected number of distinct nodes a token's
 * top-k experts land on under uniform routing (docs/design.md, Redundancy-bypassing dispatch),
 * shared by the runtime's RBD planner (runtime/moe/rbd.h) and the cost model (planner/cost.h),
 * which cannot link each other. */
#ifndef XM_SUPPORT_RBD_COPIES_H
#define XM_SUPPORT_RBD_COPIES_H

#include <stdint.h>

/* nodes * (1 - C(E - E/nodes, k) / C(E, k)) when k distinct experts of E
 * are chosen uniformly and the experts are spread evenly over `nodes`
 * nodes (E=256, k=8, 4 nodes: 3.61). 0 for out-of-range arguments. */
double xm_rbd_expected_copies(int64_t experts, int64_t top_k, int64_t nodes);

#endif /* XM_SUPPORT_RBD_COPIES_H */
