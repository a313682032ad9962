/* fabric/sim.h — the flow-level engine: seconds per phase on a topology,
 * simulated by SimGrid (docs/fabric.md, "The flow engine").
 *
 * SimGrid shares every link max-min fairly between the flows crossing it
 * (its CM02 model, cross-traffic off, full-duplex links), so a phase's
 * time is that of its slowest flow under that sharing. Inside a node each
 * rank has its own link of intra_bw to the node's switch; between nodes
 * the flows of a phase are summed per (source node, destination node) and
 * cross the topology from NIC to NIC. regional-ocs splits a node pair's
 * bytes between its circuits and the electrical fat-tree in proportion to
 * their capacities, and a phase with `reconfigure` set delays the
 * inter-node flows of every region whose circuits changed by reconfig_s
 * (the other topologies ignore circuits).
 * Each phase starts on an idle network when the previous one has ended;
 * its time is the simulated time plus latency_steps end-to-end latencies
 * (link_lat when the phase has an inter-node flow, intra_lat otherwise).
 *
 * SimGrid's engine is one per process and aborts on its own errors, so the
 * simulation runs in a child process (fork) that loads libsimgrid at run
 * time; the caller's process never links or initialises SimGrid.
 */
#ifndef XM_FABRIC_SIM_H
#define XM_FABRIC_SIM_H

#include <stdint.h>

#include "fabric/flow.h"
#include "fabric/topology.h"
#include "support/diag.h"
#include "support/status.h"

/* Simulates phases[0..n) one after the other on `t`; out_seconds[i] is
 * the time of phase i (n entries, caller-owned). A flow with a rank
 * outside the topology, or a circuit outside a region or beyond a node's
 * ocs_ports, is XM_ERR_INVALID_INPUT (place "phase <i>"); a failure of
 * SimGrid or of the child process is XM_ERR_INTERNAL with SimGrid's last
 * message. Phases equal in flows, circuits and pauses are simulated once
 * (an idle network gives them the same time). Nothing is kept between
 * calls. */
xm_status_t xm_fab_simulate(const xm_fab_topo_t *t, const xm_fab_phase_t *phases, int64_t n,
                            double *out_seconds, xm_diag_t *diag);

#endif /* XM_FABRIC_SIM_H */
