/* fabric/flow.h — what the network carries: flows grouped in phases.
 *
 * A phase is one collective (or one layer's all-to-all): flows between
 * world ranks that start together; it ends when its last flow ends, and
 * the phases of a sequence run one after the other. A flow-level engine
 * (fabric/sim.h) or the closed forms (fabric/analytic.h) turn a sequence
 * into seconds. Flows are in bytes, as the runtime counts them
 * (docs/traffic.md): collective.h builds them from the same byte model.
 *
 * Ownership: a phase owns its flows and circuits (xm_fab_phase_free).
 */
#ifndef XM_FABRIC_FLOW_H
#define XM_FABRIC_FLOW_H

#include <stdbool.h>
#include <stdint.h>

#include "support/status.h"

typedef struct {
  int64_t src, dst; /* world ranks, src != dst */
  double bytes;
} xm_fab_flow_t;

/* regional-ocs: `count` circuits between servers a < b of one region (a
 * circuit is one OCS port at each end and carries both directions). */
typedef struct {
  int64_t a, b, count;
} xm_fab_circuit_t;

typedef struct {
  char name[32]; /* a docs/traffic.md phase: dispatch, combine, all_reduce, ... */
  int64_t layer; /* model layer, -1 for none */
  xm_fab_flow_t *flows;
  int64_t num_flows, cap_flows;
  /* Message rounds on the critical path (2 (P-1) for a ring all-reduce,
   * P-1 for a ring all-gather, 1 for a direct all-to-all): the engine adds
   * this many end-to-end latencies to the bandwidth time. */
  double latency_steps;
  /* regional-ocs only: the circuits in force during the phase, and whether
   * the regions reconfigure just before it (each region whose circuits
   * change pauses its flows for the reconfiguration delay). */
  xm_fab_circuit_t *circuits;
  int64_t num_circuits;
  bool reconfigure;
} xm_fab_phase_t;

void xm_fab_phase_init(xm_fab_phase_t *p, const char *name, int64_t layer);
/* Appends a flow (bytes <= 0 or src == dst: nothing). XM_ERR_NO_MEMORY. */
xm_status_t xm_fab_phase_add(xm_fab_phase_t *p, int64_t src, int64_t dst, double bytes);
void xm_fab_phase_free(xm_fab_phase_t *p);

#endif /* XM_FABRIC_FLOW_H */
