/* runtime/moe/routing_stats.h — the routing statistics of a training run
 * (`out/train --routing-stats FILE`; format in docs/placement.md).
 *
 * The generated program calls xm_rt_routing_observe after every forward
 * top-k routing (not after a recomputed one) when x->routing_stats is set.
 * The recorder counts, per MoE layer and in the Hugging Face expert
 * numbering (the program's placement undone), the slots each expert got,
 * the tokens that chose each pair of experts together, and keeps a sample
 * of the tokens' expert sets with the node of the EP group that routed
 * them: what `xmoec place` needs to put experts chosen together on one
 * node, and to predict RBD's inter-node rows under any placement.
 *
 * Tokens are counted once: every member of a TP group routes the same
 * tokens (with SSMB too: its narrow comes after the router), and only TP
 * index 0 records them (TP stays inside a node, so its node is theirs). Evaluation batches
 * are not recorded (the driver clears x->routing_stats around them).
 *
 * Writing is collective over the world: the counts are summed on rank 0,
 * the samples gathered (each rank keeps its first ceil(cap / recording
 * ranks) tokens per layer, rank 0 the first `cap` of all), and rank 0
 * writes the file (a temporary file renamed into place).
 */
#ifndef XM_RUNTIME_ROUTING_STATS_H
#define XM_RUNTIME_ROUTING_STATS_H

#include <stdint.h>

#include "runtime/abi/program.h"
#include "support/diag.h"
#include "support/status.h"

typedef struct xm_rt_routing_stats xm_rt_routing_stats_t;

#define XM_RT_ROUTING_SAMPLE_CAP 65536 /* sampled tokens per layer (all ranks) by default */

/* A recorder for `p` on this rank of the communicator `comm`
 * (xm_rt_comm_t *, NULL on one rank); sample_cap >= 0 tokens per layer.
 * XM_ERR_NO_MEMORY, or XM_ERR_INVALID_INPUT for a program without routed
 * experts (reported to diag). */
xm_status_t xm_rt_routing_stats_create(const xm_rt_program_t *p, const void *comm,
                                       int64_t sample_cap, xm_diag_t *diag,
                                       xm_rt_routing_stats_t **out);
void xm_rt_routing_stats_free(xm_rt_routing_stats_t *s);

/* The hook of the generated code: experts[T, k] (device memory; slot ids,
 * negative = dropped) of MoE layer `layer` over E slots. Ends the run
 * through xm_rt_fail on an id out of range or exhausted memory. */
void xm_rt_routing_observe(xm_rt_exec_t *x, int layer, const int32_t *experts, int64_t T,
                           int64_t k, int64_t E);

/* Collective over the world of `comm` (NULL: one rank): writes the file on
 * rank 0 with `steps` optimizer steps recorded. The same status on every
 * rank; a write failure is XM_ERR_IO with the path in diag (rank 0). */
xm_status_t xm_rt_routing_stats_write(xm_rt_routing_stats_t *s, const void *comm,
                                      const char *path, int64_t steps, xm_diag_t *diag);

#endif /* XM_RUNTIME_ROUTING_STATS_H */
