/* tests/fuzz/fuzz_placement.c — libFuzzer harness for the two files of
 * expert placement (planner/placement.h; docs/placement.md): the placement
 * file `xmoec compile --placement` reads and the routing statistics file
 * `xmoec place --stats` reads.
 *
 * Each input is parsed as both. Beyond "no crash, no leak, no undefined
 * behaviour" the harness checks the readers' contract: the status and the
 * diagnostics agree, a refused file leaves its struct empty, a placement
 * that read has rows that are permutations with layers strictly ascending
 * and formats to a file that reads back the same, and statistics that read
 * have their layers ascending, their ids in range and samples within the
 * tokens; small ones are then placed over 2 blocks, which must succeed with
 * permutations no worse than the identity by the objective, within the load
 * bound, and predicted as xm_place_predict predicts them. A violated
 * contract aborts.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/placement.h"
#include "support/diag.h"
#include "support/strbuf.h"

#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fail(const char *what, const xm_diag_t *diag) {
  fprintf(stderr, "fuzz_placement: contract violated: %s\n", what);
  if (diag) xm_diag_print(diag, stderr);
  abort();
}

/* Whether each row of p is a permutation of 0..E-1 (seen: E bytes). */
static bool rows_are_permutations(const xm_placement_t *p, unsigned char *seen) {
  for (int64_t r = 0; r < p->rows; r++) {
    memset(seen, 0, (size_t)p->experts);
    for (int64_t q = 0; q < p->experts; q++) {
      int32_t e = p->slots[r * p->experts + q];
      if (e < 0 || e >= p->experts || seen[e]) return false;
      seen[e] = 1;
    }
  }
  return true;
}

static void check_placement(const uint8_t *data, size_t size) {
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_placement_t p;
  xm_status_t st = xm_placement_parse((const char *)data, size, "fuzz", &diag, &p);
  if (st == XM_OK && xm_diag_error_count(&diag) != 0) fail("placement: OK with errors", &diag);
  if (st != XM_OK && xm_diag_error_count(&diag) == 0)
    fail("placement: failed without an error", &diag);
  if (st != XM_OK && (p.slots || p.layer || p.source || p.rows))
    fail("placement: failed but not empty", &diag);
  if (st == XM_OK) {
    if (p.experts < 1 || !p.source) fail("placement: OK without experts or source", &diag);
    for (int64_t r = 1; r < p.rows; r++)
      if (p.layer[r] <= p.layer[r - 1]) fail("placement: layers not strictly ascending", &diag);
    unsigned char *seen = malloc((size_t)p.experts);
    if (!seen) abort();
    if (!rows_are_permutations(&p, seen)) fail("placement: a row is not a permutation", &diag);
    free(seen);
    /* What xm_placement_format writes reads back the same. */
    xm_strbuf_t b;
    xm_strbuf_init(&b);
    xm_placement_format(&p, "{\"fuzz\": true}", &b);
    xm_placement_t q;
    if (xm_placement_parse(xm_strbuf_cstr(&b), b.len, "fuzz-again", &diag, &q) != XM_OK)
      fail("placement: the formatted file does not read back", &diag);
    if (q.experts != p.experts || q.nodes != p.nodes || q.rows != p.rows ||
        memcmp(q.layer, p.layer, (size_t)p.rows * sizeof *p.layer) != 0 ||
        memcmp(q.slots, p.slots, (size_t)(p.rows * p.experts) * sizeof *p.slots) != 0)
      fail("placement: the formatted file reads back otherwise", &diag);
    for (int64_t r = 0; r < q.rows; r++) {
      bool ident = true;
      for (int64_t e = 0; e < q.experts && ident; e++)
        ident = q.slots[r * q.experts + e] == e;
      if (ident != xm_placement_row_is_identity(&q, r)) fail("placement: identity misread", NULL);
    }
    xm_placement_free(&q);
    xm_strbuf_free(&b);
  }
  xm_placement_free(&p);
  xm_diag_free(&diag);
}

/* The statistics' own promises, then a placement over 2 blocks when small. */
static void check_stats_values(const xm_routing_stats_t *s, const xm_diag_t *diag) {
  if (s->experts < 1 || s->top_k < 1 || s->top_k > s->experts || s->nodes < 1 ||
      s->num_layers < 1 || !s->layers || !s->source || !s->model)
    fail("stats: OK with bad sizes", diag);
  for (int64_t i = 0; i < s->num_layers; i++) {
    const xm_routing_stats_layer_t *l = &s->layers[i];
    if (i > 0 && l->layer <= s->layers[i - 1].layer) fail("stats: layers not ascending", diag);
    if (l->samples < 0 || l->samples > l->tokens) fail("stats: samples beyond tokens", diag);
    for (int64_t e = 0; e < s->experts; e++) {
      if (l->load[e] < 0 || l->load[e] > l->tokens) fail("stats: a load out of range", diag);
      if (l->coselect[e * s->experts + e] != 0) fail("stats: a nonzero diagonal", diag);
    }
    for (int64_t t = 0; t < l->samples; t++) {
      if (l->sample_node[t] < 0 || l->sample_node[t] >= s->nodes)
        fail("stats: a node out of range", diag);
      for (int64_t j = 0; j < s->top_k; j++) {
        int32_t e = l->sample_experts[t * s->top_k + j];
        if (e < -1 || e >= s->experts) fail("stats: an expert out of range", diag);
      }
    }
  }
}

static void place_small(const xm_routing_stats_t *s) {
  if (s->experts % 2 != 0 || s->experts > 64) return;
  xm_place_options_t o = {.nodes = 2, .max_imbalance = 0.1, .passes = 4, .n_group = 1};
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_place_result_t r;
  if (xm_place_run(s, &o, &diag, &r) != XM_OK) fail("place: refused valid statistics", &diag);
  unsigned char seen[64];
  if (r.placement.rows != s->num_layers || !rows_are_permutations(&r.placement, seen))
    fail("place: the rows are not permutations", &diag);
  for (int64_t i = 0; i < r.num_layers; i++) {
    const xm_place_layer_t *l = &r.layers[i];
    if (l->objective_placed > l->objective_identity) fail("place: worse than the identity", NULL);
    if (l->changed == xm_placement_row_is_identity(&r.placement, i))
      fail("place: changed disagrees with the row", NULL);
    if (!l->bound_relaxed && l->changed && l->placed.max_block_load > l->load_bound)
      fail("place: beyond the load bound", NULL);
    xm_place_prediction_t x;
    xm_place_predict(s, i, r.placement.slots + i * s->experts, 2, &x);
    if (x.sample_rbd != l->placed.sample_rbd || x.sample_flat != l->placed.sample_flat)
      fail("place: the prediction differs from the result's", NULL);
  }
  xm_place_result_free(&r);
  xm_diag_free(&diag);
}

static void check_stats(const uint8_t *data, size_t size) {
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_routing_stats_t s;
  xm_status_t st = xm_routing_stats_parse((const char *)data, size, "fuzz", &diag, &s);
  if (st == XM_OK && xm_diag_error_count(&diag) != 0) fail("stats: OK with errors", &diag);
  if (st != XM_OK && xm_diag_error_count(&diag) == 0) fail("stats: failed without an error", &diag);
  if (st != XM_OK && (s.layers || s.source || s.model || s.num_layers))
    fail("stats: failed but not empty", &diag);
  if (st == XM_OK) {
    check_stats_values(&s, &diag);
    place_small(&s);
  }
  xm_routing_stats_free(&s);
  xm_diag_free(&diag);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  check_placement(data, size);
  check_stats(data, size);
  return 0;
}
