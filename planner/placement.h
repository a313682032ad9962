/* planner/placement.h — topology-aware expert placement (docs/placement.md).
 *
 * A placement is, per MoE layer, a permutation of the routed experts over
 * the expert slots of the program: slot p of layer l holds the expert that
 * the Hugging Face checkpoint numbers slots[p]. Expert parallelism gives EP
 * rank r the contiguous slots [r E/ep, (r+1) E/ep), so a placement decides
 * which experts share a node. Nothing in the graph changes: the router's
 * weight rows, the correction bias and the stacked expert weights are held
 * in slot order, so routing, dispatch, RBD and the aux-free update work on
 * slots, and training is the identity placement's up to the order of some
 * floating-point sums. Checkpoints keep the Hugging Face numbering (the
 * runtime permutes at the edges: runtime/io/shard_io.c).
 *
 * Two files (formats in docs/placement.md):
 *   a placement file ("format": "xmoec-placement"), which
 *     `xmoec compile --placement FILE` applies and `xmoec place` writes;
 *   a routing statistics file ("format": "xmoec-routing-stats"), which
 *     `out/train --routing-stats FILE` writes: per MoE layer the expert
 *     loads, the co-selection counts of expert pairs and a sample of the
 *     tokens' expert sets with the node that routed them, all in the
 *     Hugging Face numbering.
 *
 * `xmoec place` (tools/xmoec/cmd_place.c) turns statistics into a placement:
 * experts chosen together go to the same node block, under a load-balance
 * bound, and the drop in RBD's inter-node pilot rows is predicted from the
 * sampled tokens.
 *
 * Ownership: the load functions fill caller-provided structs whose arrays
 * they own; free them with the matching _free (safe on a zeroed struct).
 */
#ifndef XM_PLANNER_PLACEMENT_H
#define XM_PLANNER_PLACEMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "frontend/spec.h"
#include "support/diag.h"
#include "support/status.h"
#include "support/strbuf.h"

/* ---- placement files ------------------------------------------------------ */

typedef struct {
  char *source;    /* owned: the file name, or the source given to the parser */
  int64_t experts; /* E */
  int64_t nodes;   /* the node blocks it was made for; 0 when the file names none */
  int64_t rows;    /* layers listed */
  int64_t *layer;  /* [rows] Hugging Face layer index, strictly ascending */
  int32_t *slots;  /* [rows * experts]: slot p of row r holds expert slots[r * experts + p] */
} xm_placement_t;

/* Reads a placement file. Every problem is reported with its place (JSON
 * pointer, or line:column for a syntax error): not an object, wrong
 * "format" or "version", an unknown member, experts < 1, a row that is not
 * a permutation of 0..E-1 (the first repeated or missing expert named), a
 * layer given twice. XM_ERR_INVALID_INPUT (XM_ERR_IO when the file cannot
 * be read); *out is then empty. */
xm_status_t xm_placement_load(const char *path, xm_diag_t *diag, xm_placement_t *out);
xm_status_t xm_placement_parse(const char *text, size_t len, const char *source, xm_diag_t *diag,
                               xm_placement_t *out);

/* Whether a placement fits a spec: the same routed expert count, every
 * listed layer an MoE layer of the model (decoder layers with routed
 * experts, and the MTP modules' layers num_layers + j), and, with
 * group-limited routing (n_group > 1), every slot group [g E/G, (g+1) E/G)
 * holding exactly the experts of one group (routing picks contiguous id
 * ranges, so any other permutation would change what is routed).
 * XM_ERR_INVALID_INPUT with every reason. */
xm_status_t xm_placement_check(const xm_placement_t *p, const xm_spec_t *spec, xm_diag_t *diag);

/* 1 when row r is the identity. */
bool xm_placement_row_is_identity(const xm_placement_t *p, int64_t r);

void xm_placement_free(xm_placement_t *p);

/* ---- writing placement files ------------------------------------------------ */

/* The text of a placement file for `p` (format in docs/placement.md): one
 * line per layer, "nodes" when p->nodes > 0, and "predicted" holding
 * `predicted`, the text of a JSON object (NULL: left out). Appended to out. */
void xm_placement_format(const xm_placement_t *p, const char *predicted, xm_strbuf_t *out);

/* Writes that text to `path` through a temporary file in the same folder
 * renamed into place, so a reader never sees half a file. XM_ERR_IO with
 * the path in diag when it cannot be written. */
xm_status_t xm_placement_write(const char *path, const xm_placement_t *p, const char *predicted,
                               xm_diag_t *diag);

/* ---- routing statistics files ---------------------------------------------- */

/* The most a statistics file may hold: 65536 sampled tokens of k = 8 over
 * 61 layers is ~150 MB of text. */
#define XM_ROUTING_STATS_READ_LIMIT ((size_t)4 << 30)

/* One MoE layer of a run's statistics; every id in the Hugging Face
 * numbering. */
typedef struct {
  int64_t layer;           /* the Hugging Face layer index */
  int64_t index;           /* its position in the file's "layers" (for messages) */
  int64_t tokens;          /* distinct tokens routed over the run */
  int64_t *load;           /* [experts] kept slots routed to each expert */
  int64_t *coselect;       /* [experts * experts] tokens that chose both a and b */
  int64_t samples;         /* sampled tokens, <= tokens */
  int32_t *sample_node;    /* [samples] node of the EP group that routed token i */
  int32_t *sample_experts; /* [samples * top_k] its picks, -1 a dropped slot */
} xm_routing_stats_layer_t;

typedef struct {
  char *source;    /* owned: the file name, or the source given to the parser */
  char *model;     /* owned: the run's model name ("" when the file names none) */
  int64_t experts; /* E */
  int64_t top_k;   /* k */
  /* The run's layout: world ranks, the EP group size, ranks per node and
   * the nodes the EP group spans (1 for one rank). */
  int64_t world, ep, ranks_per_node, nodes;
  bool placed;            /* the run had a placement other than the identity */
  int64_t steps;          /* optimizer steps recorded; -1 when absent */
  int64_t sample_cap;     /* the run's cap on sampled tokens per layer; -1 when absent */
  int64_t num_layers;     /* >= 1 */
  xm_routing_stats_layer_t *layers; /* [num_layers], layer strictly ascending */
} xm_routing_stats_t;

/* Reads a statistics file (`out/train --routing-stats FILE`). Everything is
 * checked, every problem reported with its place (JSON pointer, or
 * line:column for a syntax error): format and version, sizes (E loads, E x E
 * co-selection counts, samples node ids and samples x k expert ids), ranges
 * (ids in [-1, E), nodes below layout.nodes, samples <= tokens), a
 * symmetric co-selection with a zero diagonal and counts the loads allow,
 * a token's experts distinct, a layer given twice, unknown members.
 * XM_ERR_INVALID_INPUT (XM_ERR_IO when the file cannot be read); *out is
 * then empty. */
xm_status_t xm_routing_stats_load(const char *path, xm_diag_t *diag, xm_routing_stats_t *out);
xm_status_t xm_routing_stats_parse(const char *text, size_t len, const char *source,
                                   xm_diag_t *diag, xm_routing_stats_t *out);
void xm_routing_stats_free(xm_routing_stats_t *s);

/* ---- choosing a placement (`xmoec place`, planner/place.c) ------------------ */

typedef struct {
  int64_t nodes;        /* node blocks n: >= 2, dividing the experts */
  double max_imbalance; /* x >= 0: a block receives at most (1 + x) x the mean block load */
  int64_t passes;       /* local search passes at most (>= 0) */
  int64_t n_group;      /* the model's expert groups G (<= 1: none): moves keep them whole */
  /* Called before each layer (may be NULL): i of count, the layer. */
  void (*progress)(void *ctx, int64_t i, int64_t count, int64_t layer);
  void *progress_ctx;
} xm_place_options_t;

/* What a placement row predicts for one layer over the whole run. */
typedef struct {
  /* Over the sampled tokens. With the source nodes known (the statistics'
   * nodes equal the blocks): rbd = pilot rows to blocks other than the
   * token's source, flat = kept slots on other blocks. Otherwise
   * rbd = distinct blocks, flat = kept slots (the expectation under a
   * uniform source multiplies both by 1 - 1/n). */
  int64_t sample_rbd, sample_flat;
  double rbd_inter_rows;  /* predicted for the run: sample_rbd [x (1 - 1/n)] x tokens/samples */
  double flat_inter_rows; /* likewise */
  int64_t max_block_load; /* the most slots one block receives (from the loads) */
  double imbalance;       /* max_block_load / mean block load; 1 without load */
} xm_place_prediction_t;

typedef struct {
  int64_t layer, tokens, samples;
  bool predicted;       /* false: tokens but no samples, the rows are unknown */
  double scale;         /* tokens / samples (1 when equal; 0 without samples) */
  bool by_samples;      /* the objective: sampled distinct blocks (else co-selection) */
  int64_t objective_identity, objective_placed; /* minimised: distinct blocks summed over the
                                                   samples, or co-selection across blocks */
  int64_t load_bound;   /* the most slots a block may receive */
  bool bound_relaxed;   /* the identity exceeds (1 + x) x the mean: its own bound is used */
  int64_t passes, swaps;
  bool changed;         /* the row is not the identity */
  xm_place_prediction_t identity, placed;
} xm_place_layer_t;

typedef struct {
  int64_t nodes;
  double max_imbalance;
  bool sources;        /* the statistics' node count is n: their source nodes are used */
  int64_t num_layers;  /* the statistics' layers, ascending */
  xm_place_layer_t *layers;
  /* Sums over the predicted layers (the imbalance: the worst layer's). */
  xm_place_prediction_t total_identity, total_placed;
  int64_t unpredicted; /* layers without samples (left out of the totals) */
  xm_placement_t placement; /* one row per layer; source: the statistics' */
} xm_place_result_t;

/* Places each layer of `s` over o->nodes blocks (docs/placement.md, "The
 * algorithm"): deterministic. XM_ERR_INVALID_INPUT (reported at the flag
 * "--nodes" / "--max-imbalance" / "--passes") for bad options or experts
 * not divisible by the blocks or the groups. *out is filled on success. */
xm_status_t xm_place_run(const xm_routing_stats_t *s, const xm_place_options_t *o, xm_diag_t *diag,
                         xm_place_result_t *out);
void xm_place_result_free(xm_place_result_t *r);

/* The prediction for layer `li` of `s` (an index into s->layers) placed as
 * `slots` (E experts, slot order) over `nodes` blocks. */
void xm_place_predict(const xm_routing_stats_t *s, int64_t li, const int32_t *slots, int64_t nodes,
                      xm_place_prediction_t *out);

/* The JSON of a result (docs/placement.md, "--json"): what `xmoec place
 * --json` prints and the placement file's "predicted" holds. Owned by the
 * caller (cJSON_Delete); NULL when out of memory. */
struct cJSON *xm_place_result_json(const xm_place_result_t *r, const xm_routing_stats_t *s);

#endif /* XM_PLANNER_PLACEMENT_H */
