/* fabric/traffic.h — the demand the network carries: measured traffic read
 * from the runtime's files, synthetic traffic for scales the runtime
 * cannot reach, and how local a demand is (docs/traffic.md, "Reading and
 * synthesising traffic").
 *
 *   reading      the `--traffic FILE` matrices, one per (step, layer,
 *                phase), and the step log's `traffic` member with its
 *                optional per-peer matrices, validated with errors at
 *                "FILE:LINE" and a JSON pointer;
 *   synthesis    the expected bytes of one MoE layer's forward dispatch
 *                and combine for any cluster and model, from the routing
 *                statistics (expert popularity, co-selection of experts,
 *                a seed), flat or with RBD, as a world x world or a server
 *                x server matrix; expected values, no sampling noise;
 *   locality     the share of bytes inside a server, inside a region of
 *                servers, on the heaviest server pairs, and how much two
 *                demands differ (step to step, layer to layer).
 *
 * Matrices are row-major doubles of bytes: m.v[i * m.n + j] is what i sent
 * to j. A rank matrix has a zero diagonal; in a server matrix the
 * diagonal holds the bytes that stayed inside the server. Servers are
 * consecutive blocks of `ranks_per_server` ranks, as the runtime's nodes.
 *
 * Ownership: every xm_fab_matrix_t owns its values (xm_fab_matrix_free);
 * the loaders return owned objects (xm_fab_traffic_free,
 * xm_fab_step_log_free); a synthesis result owns its matrices and shares
 * (xm_fab_synth_result_free). All free functions accept zeroed objects.
 */
#ifndef XM_FABRIC_TRAFFIC_H
#define XM_FABRIC_TRAFFIC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/abi/groups.h"
#include "support/diag.h"
#include "support/status.h"

/* ---- matrices ----------------------------------------------------------------- */

typedef struct {
  int64_t n; /* rows = columns */
  double *v; /* owned, n * n */
} xm_fab_matrix_t;

#define XM_FAB_MATRIX_MAX 4096 /* largest n the functions below allocate (128 MiB) */

/* An n x n matrix of zeros (1 <= n <= XM_FAB_MATRIX_MAX, else
 * XM_ERR_INVALID_INPUT; XM_ERR_NO_MEMORY). */
xm_status_t xm_fab_matrix_init(xm_fab_matrix_t *m, int64_t n);
void xm_fab_matrix_free(xm_fab_matrix_t *m);
/* Sum of all entries. */
double xm_fab_matrix_total(const xm_fab_matrix_t *m);
/* out = the transpose of m (a new matrix). */
xm_status_t xm_fab_matrix_transpose(const xm_fab_matrix_t *m, xm_fab_matrix_t *out);
/* out = the server matrix of rank matrix m: block sums over consecutive
 * blocks of ranks_per_server ranks (which must divide m->n). */
xm_status_t xm_fab_matrix_to_servers(const xm_fab_matrix_t *m, int64_t ranks_per_server,
                                     xm_fab_matrix_t *out);
/* Bytes of rank matrix m between ranks of one server (*intra) and of
 * different servers (*inter), as the step log splits them. */
void xm_fab_matrix_split(const xm_fab_matrix_t *m, int64_t ranks_per_server, double *intra,
                         double *inter);

/* ---- the --traffic file ----------------------------------------------------- */

typedef struct {
  int64_t step;
  int64_t layer; /* -1 for `null` */
  xm_rt_phase_t phase;
  int64_t line;          /* 1-based line of the file it came from */
  xm_fab_matrix_t bytes; /* world x world */
} xm_fab_traffic_record_t;

typedef struct {
  char *source; /* owned: the file name */
  int64_t world;
  xm_fab_traffic_record_t *records; /* owned, in file order */
  int64_t num_records;
} xm_fab_traffic_t;

/* Reads a `--traffic FILE` (docs/traffic.md, "The matrix file"). Every
 * line is checked: the keys step, layer, phase, world, bytes and no
 * other; step a whole number >= 0; layer one >= 0 or null; phase one of
 * the six names; world >= 1 (at most XM_FAB_MATRIX_MAX) and the same on
 * every line; bytes world rows of world whole numbers >= 0 with a zero
 * diagonal. A (step, layer, phase) written again (a resumed run rewrites
 * the steps after its checkpoint) replaces the earlier record. Errors go
 * to `diag` with file "FILE:LINE" and the JSON pointer as place:
 * XM_ERR_IO when the file cannot be read, XM_ERR_INVALID_INPUT otherwise
 * (also for a file without records). */
xm_status_t xm_fab_traffic_load_file(const char *path, xm_diag_t *diag, xm_fab_traffic_t **out);
xm_status_t xm_fab_traffic_load_text(const char *text, size_t len, const char *source,
                                     xm_diag_t *diag, xm_fab_traffic_t **out);
void xm_fab_traffic_free(xm_fab_traffic_t *t);

/* The record of (step, layer, phase), or NULL. */
const xm_fab_traffic_record_t *xm_fab_traffic_find(const xm_fab_traffic_t *t, int64_t step,
                                                   int64_t layer, xm_rt_phase_t phase);
/* out = the sum of the records of `step` (-1: every step) in `layer` (-2:
 * every layer, -1: the records without a layer) of `phase`
 * (XM_RT_PHASE_COUNT: every phase); a world x world matrix. */
xm_status_t xm_fab_traffic_sum(const xm_fab_traffic_t *t, int64_t step, int64_t layer,
                               xm_rt_phase_t phase, xm_fab_matrix_t *out);

/* ---- the step log's traffic member ------------------------------------------ */

typedef struct {
  int64_t step, line;
  double intra_bytes, inter_bytes;
  double intra[XM_RT_PHASE_COUNT], inter[XM_RT_PHASE_COUNT]; /* by_phase */
  int64_t world;                                             /* "peers": 0 when absent */
  xm_fab_matrix_t sent[XM_RT_PHASE_COUNT];                   /* "peers"/"sent"; n 0 when absent */
} xm_fab_step_traffic_t;

typedef struct {
  char *source;                 /* owned */
  xm_fab_step_traffic_t *steps; /* owned; one per step, the last line of each step */
  int64_t num_steps;
} xm_fab_step_log_t;

/* Reads an `out/train --log` file's "traffic" members (docs/traffic.md,
 * "The step log member"); the other members of a line are not looked at.
 * Checked: every line an object with a whole "step" and a "traffic"
 * object of intra_bytes, inter_bytes, by_phase (all six phases, each
 * {intra, inter}) and optionally peers {world, sent: one world x world
 * matrix per phase, all six}, no other keys, whole numbers >= 0,
 * intra_bytes + inter_bytes equal to the phases' sum. A step logged again
 * replaces the earlier line. Errors as xm_fab_traffic_load_file. */
xm_status_t xm_fab_step_log_load_file(const char *path, xm_diag_t *diag, xm_fab_step_log_t **out);
xm_status_t xm_fab_step_log_load_text(const char *text, size_t len, const char *source,
                                      xm_diag_t *diag, xm_fab_step_log_t **out);
void xm_fab_step_log_free(xm_fab_step_log_t *l);

/* ---- synthesis -------------------------------------------------------------- */

/* One MoE layer's routing on a cluster. EP groups are consecutive blocks
 * of `ep` world ranks (frontend/layout.h), expert e lives on EP rank
 * e / (experts / ep) of every group, and each rank's `tokens` tokens pick
 * top_k distinct experts of their own EP group. The generative model
 * (docs/traffic.md, "Synthetic traffic"):
 *
 *   weights   w_e: uniform (zipf 0), 1 / (rank_e + 1)^zipf with the
 *             popularity ranks a seeded permutation of the experts, or
 *             `loads` (E values >= 0; with fit_loads they are the target
 *             share of the slots each expert receives, and the weights
 *             are fitted so that the global draw below meets them);
 *   groups    affinity groups of `affinity_experts` experts: consecutive
 *             ids, or (affinity_scattered) a seeded permutation cut in
 *             blocks; each server has a seeded home group;
 *   a token   with probability 1 - locality draws its top_k experts from
 *             all E; else from one affinity group: its server's home
 *             group with probability source_affinity, otherwise group g
 *             with probability proportional to g's weight. A draw of k
 *             distinct experts from a set C is conditional Poisson:
 *             P(S) proportional to the product of w_e over S, |S| = k
 *             (uniform weights: every k-subset alike).
 *
 * Bytes of the forward movements: flat, one row per (token, expert on
 * another rank) of hidden * bytes_per_element bytes; with RBD (when
 * rbd_active: rbd asked, ep > 1 and some EP group spans servers) one pilot
 * row per (token, destination server of the group holding one of its
 * experts) to a rank there holding one, then one replica row from the
 * pilot to every other rank of that server holding one, dispatch rows of
 * hidden * bytes_per_element + 8 top_k bytes (the expert ids and weights
 * travel along). The combine sends every row back: the transpose of the
 * row counts at hidden * bytes_per_element bytes per row. */
typedef struct {
  int64_t world, ranks_per_server, ep;
  int64_t experts, top_k, hidden, tokens; /* tokens per rank */
  double bytes_per_element;
  bool rbd;
  double zipf;              /* >= 0 */
  const double *loads;      /* NULL, or `experts` values (borrowed) */
  bool fit_loads;           /* loads are slot shares to reach */
  double locality;          /* [0, 1] */
  int64_t affinity_experts; /* 0: the experts of one server of an EP group */
  bool affinity_scattered;  /* groups from a seeded permutation */
  double source_affinity;   /* [0, 1] */
  uint64_t seed;            /* popularity ranks, scattered groups, home groups */
  int64_t layer;            /* mixed into the seed: each layer its own pattern */
  bool by_server;           /* server x server matrices instead of rank x rank */
} xm_fab_synth_t;

typedef struct {
  bool rbd_active;
  xm_fab_matrix_t dispatch, combine; /* bytes (world or servers square) */
  double rows, inter_rows;           /* rows sent per movement, and those across servers */
  int64_t experts;
  double *expert_share; /* owned: the share of the slots each expert receives */
} xm_fab_synth_result_t;

#define XM_FAB_SYNTH_WORLD_MAX 16384
#define XM_FAB_SYNTH_EXPERTS_MAX 16384
#define XM_FAB_SYNTH_TOP_K_MAX 64

/* Computes the expected matrices. Parameters out of range (each reported
 * at its field name: "ep", "top_k", ...; a rank matrix over
 * XM_FAB_MATRIX_MAX ranks, affinity groups smaller than top_k, weights
 * with fewer than top_k positive values, loads the fit cannot reach) are
 * XM_ERR_INVALID_INPUT; XM_ERR_NO_MEMORY. */
xm_status_t xm_fab_synth(const xm_fab_synth_t *s, xm_fab_synth_result_t *out, xm_diag_t *diag);
void xm_fab_synth_result_free(xm_fab_synth_result_t *r);

/* ---- locality ----------------------------------------------------------------- */

typedef struct {
  double total;        /* bytes */
  double intra_server; /* share of the bytes with both ends in one server */
  double intra_region; /* share with both ends in one region (intra-server included) */
  double inter_server; /* bytes between servers (what the network carries) */
  int64_t servers, pairs, active_pairs; /* unordered server pairs, those with bytes */
} xm_fab_locality_t;

/* Locality of m, a rank matrix (ranks_per_server > 1, dividing m->n) or a
 * server matrix (ranks_per_server 1); regions are consecutive blocks of
 * region_servers servers, the last one possibly shorter (0: no regions,
 * intra_region = intra_server). XM_ERR_INVALID_INPUT when ranks_per_server
 * does not divide m->n; XM_ERR_NO_MEMORY. */
xm_status_t xm_fab_locality(const xm_fab_matrix_t *m, int64_t ranks_per_server,
                            int64_t region_servers, xm_fab_locality_t *out);

/* The heaviest k unordered server pairs ({a, b}, a != b, weighed by the
 * bytes both ways: what one circuit carries) carry this share of the
 * inter-server bytes (0 when there are none). Ties go to the pair with
 * the lower index (a * servers + b). */
double xm_fab_top_pairs_share(const xm_fab_matrix_t *m, int64_t ranks_per_server, int64_t k);
/* ceil(fraction * pairs) for `servers` servers, at least 1: "the top 5% of
 * pairs". */
int64_t xm_fab_pairs_for_fraction(int64_t servers, double fraction);

/* Total-variation distance of the normalised matrices, 0.5 sum |a/|a| -
 * b/|b||, in [0, 1]: 0 for the same pattern at any scale; two all-zero
 * matrices 0, one all-zero 1. Both must have the same n (else NaN). */
double xm_fab_matrix_tvd(const xm_fab_matrix_t *a, const xm_fab_matrix_t *b);
/* |A n B| / max(|A|, |B|) where A, B are the heaviest k server pairs with
 * bytes of a and b (fewer when fewer have bytes; 1 when both have none).
 * Same n for both (else NaN). */
double xm_fab_top_pairs_overlap(const xm_fab_matrix_t *a, const xm_fab_matrix_t *b,
                                int64_t ranks_per_server, int64_t k);

#endif /* XM_FABRIC_TRAFFIC_H */
