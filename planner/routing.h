/* planner/routing.h — a measured routing as input to the cost model, in a
 * form that carries over to every layout the planner searches.
 *
 * `xmoec plan --routing FILE` reads one of two files (formats in
 * docs/plan-json.md, "Measured routing"; formulas in docs/cost-model.md,
 * "Measured routing"):
 *
 *   a routing histogram (JSON): the share of the token slots each expert
 *     received, for all MoE layers at once or per layer, and optionally a
 *     measured RBD co-location ("rbd": distinct nodes per token at a node
 *     count);
 *   a training log (`out/train --log`, JSON lines) of an RBD run: the
 *     pilot rows that crossed nodes and the slots a flat dispatch of the
 *     same routing would have sent across (each line's "rbd" member), at
 *     the node count the run's EP group spanned (`--routing-nodes`).
 *
 * What carries over from one layout to another, for a point with `ep` EP
 * ranks over `n` nodes (experts are laid out in contiguous blocks: rank r
 * of an EP group holds experts [r E/ep, (r+1) E/ep), node j of the group
 * the blocks of its ranks):
 *
 *   imbalance f(ep) = ep x the largest share of the slots one block of
 *     E/ep experts receives (1 for uniform routing). The busiest rank
 *     receives and computes f times the mean; the cost model scales the
 *     padding-free dispatch's time and expert compute by the mean over the
 *     layers, and refuses an xmoec point whose receive buffers, min(ep, B)
 *     times the mean, cannot hold the worst layer's (B: xm_cost_point_t's
 *     dispatch bound).
 *   RBD copies per token over n blocks: the uniform expectation
 *     (xm_cost_rbd_expected_copies) times a deduplication ratio d, either
 *     measured (histogram "rbd", or the log) and applied at every node
 *     count, or estimated from the loads; clamped to [1, min(k, n)].
 *
 * A histogram is read as a density over the expert index (expert e of E
 * covers [e/E, (e+1)/E)), so a block's share is defined for any number of
 * blocks; for the model it was measured on (same E) the shares are exact.
 *
 * Ownership: xm_routing_load_* return an owned object (xm_routing_free).
 * The query functions are pure and fast (a table prepared at load time
 * covers the divisors of the file's expert count), so the cost model can
 * call them for every candidate of a 1024-rank search.
 */
#ifndef XM_PLANNER_ROUTING_H
#define XM_PLANNER_ROUTING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "support/diag.h"
#include "support/status.h"

typedef enum {
  XM_ROUTING_HISTOGRAM, /* expert loads (and optionally measured RBD copies) */
  XM_ROUTING_LOG,       /* an out/train --log file of an RBD run */
} xm_routing_kind_t;

#define XM_ROUTING_CACHE 64 /* prepared block counts */

typedef struct xm_routing {
  xm_routing_kind_t kind;
  char *source; /* owned: the file name (or the source given to the parser) */
  /* The model the measurement describes: the histogram's own /experts and
   * /top_k; for a log, the planned spec's (a log names neither). */
  int64_t experts, top_k;
  /* Loads: `layers` rows of `experts` shares, each row summing to 1, and
   * their prefix sums (layers * (experts + 1)); layers 0 and NULL for a log
   * (no loads: imbalance 1). Owned. */
  int64_t layers;
  double *load, *cdf;
  /* Measured RBD co-location: distinct nodes a token's experts land on,
   * per token, at rbd_nodes nodes, and its ratio to the uniform
   * expectation there. rbd_measured false: none measured (a histogram
   * without "rbd": the ratio is estimated from the loads). */
  bool rbd_measured;
  int64_t rbd_nodes;
  double rbd_copies, rbd_dedup;
  /* Log: lines read, lines with an "rbd" member, and their sums. From a
   * histogram's "rbd" given as rows, the rows; else 0. */
  int64_t log_lines, log_rbd_lines;
  double inter_rows, flat_inter_rows;
  /* Prepared answers for the divisors of `experts` at top_k (not part of
   * the interface; filled by the loaders). */
  int ncache;
  struct {
    int64_t parts;
    double imb_mean, imb_worst, dedup;
  } cache[XM_ROUTING_CACHE];
} xm_routing_t;

typedef struct {
  /* The planned model's routed experts and top-k. A histogram must match
   * them (reported at /experts, /top_k; 0: not checked); a log is read as
   * coming from this model and needs them. */
  int64_t experts, top_k;
  /* The nodes the logged run's EP group spanned (`--routing-nodes`); a log
   * with RBD rows needs it (>= 2). Must be 0 for a histogram. */
  int64_t log_nodes;
} xm_routing_options_t;

/* Reads FILE, which is a histogram or a log (told apart by content: one
 * JSON object without "step" is a histogram; JSON lines whose first line
 * has "step" are a log). Errors name the file and the place (a JSON
 * pointer for a histogram, "line N" and a pointer for a log): XM_ERR_IO
 * when it cannot be read, XM_ERR_INVALID_INPUT otherwise. */
xm_status_t xm_routing_load_file(const char *path, const xm_routing_options_t *opts,
                                 xm_diag_t *diag, xm_routing_t **out);
/* The same from text in memory; `source` names it in messages. */
xm_status_t xm_routing_load_text(const char *text, size_t len, const char *source,
                                 const xm_routing_options_t *opts, xm_diag_t *diag,
                                 xm_routing_t **out);
void xm_routing_free(xm_routing_t *r);

/* "histogram" or "log". */
const char *xm_routing_kind_name(xm_routing_kind_t k);

/* f(parts): parts x the largest share of one of `parts` equal contiguous
 * blocks of experts; the mean over the layers (worst false: what the
 * layers' all-to-all and expert times add up to) or the largest (worst
 * true: what a static receive buffer must hold in every layer). 1 for
 * parts <= 1, a NULL routing, or no loads. */
double xm_routing_imbalance(const xm_routing_t *r, int64_t parts, bool worst);

/* Expected distinct blocks (of `parts` over `experts` experts: nodes of an
 * EP group, or its ranks) that a token's top_k experts land on under the
 * measured routing: xm_cost_rbd_expected_copies(experts, top_k, parts)
 * times the deduplication ratio, clamped to [1, min(top_k, parts)]; the
 * uniform value for a NULL routing and when a block holds one expert or
 * less (then the copies are top_k whatever the routing). */
double xm_routing_rbd_copies(const xm_routing_t *r, int64_t experts, int64_t top_k, int64_t parts);

/* The deduplication ratio behind xm_routing_rbd_copies (before clamping):
 * the measured one, or from the loads under independent slots
 * sum_i (1 - (1 - s_i)^k) / (parts (1 - (1 - 1/parts)^k)) averaged over
 * the layers, s_i the blocks' shares; 1 without either. */
double xm_routing_dedup(const xm_routing_t *r, int64_t top_k, int64_t parts);

#endif /* XM_PLANNER_ROUTING_H */
