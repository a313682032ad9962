/* runtime/comm/traffic.c — per-step byte counters of the communicator and their
 * report (formats in docs/traffic.md).
 *
 * A rank only counts what it sends, per destination world rank, so the
 * counters cost one add per peer per collective and need no communication
 * until the report. Intra/inter-node is decided at report time from the
 * node of the peer. The per-layer counters keep a whole row per (layer
 * slot, phase) so that the rank-to-rank matrix of any layer can be gathered
 * to rank 0 one record at a time: rank 0 never holds more than one P x P
 * matrix, whatever the number of layers.
 *
 * The report is collective over the world and ends with a broadcast of
 * rank 0's status, so a full disk on rank 0 fails the step on every rank
 * instead of only where it happened.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm/comm.h"

/* Layers above this are a caller bug (the per-layer rows grow with it). */
enum { XM_RT_TRAFFIC_MAX_LAYERS = 1 << 14 };

static void grow_slots(xm_rt_comm_t *c, int slots) {
  xm_rt_traffic_t *t = &c->traffic;
  if (slots <= t->layer_cap) return;
  int cap = t->layer_cap ? t->layer_cap : 8;
  while (cap < slots)
    cap *= 2;
  size_t row = (size_t)XM_RT_PHASE_COUNT * (size_t)t->world;
  int64_t *sent = realloc(t->layer_sent, (size_t)cap * row * sizeof(int64_t));
  unsigned char *used = realloc(t->used, (size_t)cap * XM_RT_PHASE_COUNT);
  if (!sent || !used)
    xm_rt_abort(c->ctx, 1, "out of memory for the traffic counters of %d layers", cap);
  memset(sent + (size_t)t->layer_cap * row, 0,
         (size_t)(cap - t->layer_cap) * row * sizeof(int64_t));
  memset(used + (size_t)t->layer_cap * XM_RT_PHASE_COUNT, 0,
         (size_t)(cap - t->layer_cap) * XM_RT_PHASE_COUNT);
  t->layer_sent = sent;
  t->used = used;
  t->layer_cap = cap;
}

void xm_rt_comm_traffic_add(xm_rt_comm_t *c, xm_rt_phase_t phase, int layer, int peer,
                            int64_t bytes) {
  xm_rt_traffic_t *t = &c->traffic;
  if ((unsigned)phase >= XM_RT_PHASE_COUNT || layer < -1 || layer >= XM_RT_TRAFFIC_MAX_LAYERS ||
      peer < 0 || peer >= t->world || bytes < 0)
    xm_rt_abort(c->ctx, 1, "traffic: phase %d, layer %d, peer %d, %" PRId64 " bytes is invalid",
                (int)phase, layer, peer, bytes);
  t->sent[(size_t)phase * (size_t)t->world + (size_t)peer] += bytes;
  int slot = layer + 1;
  grow_slots(c, slot + 1);
  if (t->layer_slots < slot + 1) t->layer_slots = slot + 1;
  size_t rec = (size_t)slot * XM_RT_PHASE_COUNT + (size_t)phase;
  t->layer_sent[rec * (size_t)t->world + (size_t)peer] += bytes;
  t->used[rec] = 1;
}

void xm_rt_comm_traffic_reset(xm_rt_comm_t *c) {
  xm_rt_traffic_t *t = &c->traffic;
  size_t row = (size_t)XM_RT_PHASE_COUNT * (size_t)t->world;
  memset(t->sent, 0, row * sizeof(int64_t));
  if (t->layer_slots) {
    memset(t->layer_sent, 0, (size_t)t->layer_slots * row * sizeof(int64_t));
    memset(t->used, 0, (size_t)t->layer_slots * XM_RT_PHASE_COUNT);
  }
  t->layer_slots = 0;
}

int64_t xm_rt_comm_traffic_sent(const xm_rt_comm_t *c, xm_rt_phase_t phase, int peer) {
  const xm_rt_traffic_t *t = &c->traffic;
  if ((unsigned)phase >= XM_RT_PHASE_COUNT || peer < 0 || peer >= t->world) return 0;
  return t->sent[(size_t)phase * (size_t)t->world + (size_t)peer];
}

void xm_rt_comm_traffic_local(const xm_rt_comm_t *c, xm_rt_traffic_totals_t *out) {
  memset(out, 0, sizeof *out);
  int me = xm_rt_comm_node_of(c, c->ctx->rank);
  for (int p = 0; p < XM_RT_PHASE_COUNT; p++) {
    for (int q = 0; q < c->traffic.world; q++) {
      int64_t b = c->traffic.sent[(size_t)p * (size_t)c->traffic.world + (size_t)q];
      if (xm_rt_comm_node_of(c, q) == me)
        out->intra[p] += b;
      else
        out->inter[p] += b;
    }
    out->intra_total += out->intra[p];
    out->inter_total += out->inter[p];
  }
}

/* The member without its closing brace (put_peers may add to it). */
static void put_json(const xm_rt_traffic_totals_t *t, xm_strbuf_t *b) {
  xm_strbuf_printf(
      b, "\"traffic\":{\"intra_bytes\":%" PRId64 ",\"inter_bytes\":%" PRId64 ",\"by_phase\":{",
      t->intra_total, t->inter_total);
  for (int p = 0; p < XM_RT_PHASE_COUNT; p++)
    xm_strbuf_printf(b, "%s\"%s\":{\"intra\":%" PRId64 ",\"inter\":%" PRId64 "}", p ? "," : "",
                     xm_rt_phase_name((xm_rt_phase_t)p), t->intra[p], t->inter[p]);
  xm_strbuf_puts(b, "}");
}

/* ,"peers":{"world":P,"sent":{"<phase>":[row 0 ..., row P-1], ...}}: what
 * each rank sent to each peer in the step, per phase, rows by sender
 * (docs/traffic.md). all: [P][PHASE][P] as gathered. */
static void put_peers(const int64_t *all, int world, xm_strbuf_t *b) {
  xm_strbuf_printf(b, ",\"peers\":{\"world\":%d,\"sent\":{", world);
  for (int p = 0; p < XM_RT_PHASE_COUNT; p++) {
    xm_strbuf_printf(b, "%s\"%s\":[", p ? "," : "", xm_rt_phase_name((xm_rt_phase_t)p));
    for (int i = 0; i < world; i++) {
      xm_strbuf_puts(b, i ? ",[" : "[");
      for (int j = 0; j < world; j++)
        xm_strbuf_printf(
            b, "%s%" PRId64, j ? "," : "",
            all[((size_t)i * XM_RT_PHASE_COUNT + (size_t)p) * (size_t)world + (size_t)j]);
      xm_strbuf_puts(b, "]");
    }
    xm_strbuf_puts(b, "]");
  }
  xm_strbuf_puts(b, "}}");
}

/* One matrix line: bytes[i][j] = what rank i sent to rank j. */
static void put_matrix_line(int64_t step, int layer, xm_rt_phase_t phase, int world,
                            const int64_t *m, xm_strbuf_t *b) {
  xm_strbuf_clear(b);
  xm_strbuf_printf(b, "{\"step\":%" PRId64 ",\"layer\":", step);
  if (layer >= 0)
    xm_strbuf_printf(b, "%d", layer);
  else
    xm_strbuf_puts(b, "null");
  xm_strbuf_printf(b, ",\"phase\":\"%s\",\"world\":%d,\"bytes\":[", xm_rt_phase_name(phase), world);
  for (int i = 0; i < world; i++) {
    xm_strbuf_puts(b, i ? ",[" : "[");
    for (int j = 0; j < world; j++)
      xm_strbuf_printf(b, "%s%" PRId64, j ? "," : "", m[(size_t)i * (size_t)world + (size_t)j]);
    xm_strbuf_puts(b, "]");
  }
  xm_strbuf_puts(b, "]}\n");
}

/* Gathers and writes every (layer, phase) record some rank used. Layers in
 * ascending order, then the records without a layer; phases in enum order.
 * Returns 0, or on rank 0 ENOMEM or 1 (a write failed). */
static int write_matrices(xm_rt_comm_t *c, int64_t step, FILE *matrix) {
  xm_rt_traffic_t *t = &c->traffic;
  MPI_Comm world = c->groups[XM_RT_GROUP_WORLD].comm;
  int rank = c->ctx->rank, P = t->world, slots = 0;
  MPI_Allreduce(&t->layer_slots, &slots, 1, MPI_INT, MPI_MAX, world);
  if (slots == 0) return 0;
  grow_slots(c, slots); /* zero rows where this rank made no call */
  size_t nrec = (size_t)slots * XM_RT_PHASE_COUNT;
  unsigned char *used = malloc(nrec);
  int64_t *m = rank == 0 ? malloc((size_t)P * (size_t)P * sizeof(int64_t)) : NULL;
  int ok = used && (rank != 0 || m), all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, world);
  if (!all_ok) {
    free(used);
    free(m);
    return rank == 0 ? ENOMEM : 0;
  }
  MPI_Allreduce(t->used, used, (int)nrec, MPI_UNSIGNED_CHAR, MPI_MAX, world);
  xm_strbuf_t line;
  xm_strbuf_init(&line);
  int failed = 0;
  for (int k = 1; k <= slots; k++) {
    int slot = k % slots; /* slots 1.., then slot 0 (no layer) last */
    for (int p = 0; p < XM_RT_PHASE_COUNT; p++) {
      size_t rec = (size_t)slot * XM_RT_PHASE_COUNT + (size_t)p;
      if (!used[rec]) continue;
      MPI_Gather(t->layer_sent + rec * (size_t)P, P, MPI_INT64_T, m, P, MPI_INT64_T, 0, world);
      if (rank != 0 || failed) continue;
      put_matrix_line(step, slot - 1, (xm_rt_phase_t)p, P, m, &line);
      if (fputs(xm_strbuf_cstr(&line), matrix) < 0) failed = 1;
    }
  }
  if (rank == 0 && !failed && fflush(matrix) != 0) failed = 1;
  if (rank == 0 && ferror(matrix)) failed = 1;
  xm_strbuf_free(&line);
  free(used);
  free(m);
  return failed;
}

xm_status_t xm_rt_comm_traffic_report(xm_rt_comm_t *c, int64_t step, int write_matrix, FILE *matrix,
                                      xm_diag_t *diag, xm_rt_traffic_totals_t *out_totals,
                                      xm_strbuf_t *out_json) {
  MPI_Comm world = c->groups[XM_RT_GROUP_WORLD].comm;
  int rank = c->ctx->rank;
  xm_rt_traffic_totals_t local, sum;
  xm_rt_comm_traffic_local(c, &local);
  memset(&sum, 0, sizeof sum);
  MPI_Reduce(&local, &sum, (int)(sizeof local / sizeof(int64_t)), MPI_INT64_T, MPI_SUM, 0, world);
  /* Small worlds also log who sent what to whom (the --traffic file has it
   * per layer for any world). */
  int P = c->traffic.world, n = XM_RT_PHASE_COUNT * P;
  int64_t *all = NULL;
  int peers = P <= XM_RT_TRAFFIC_PEERS_MAX;
  if (peers && rank == 0) {
    all = malloc((size_t)n * (size_t)P * sizeof *all);
    if (!all) peers = 0;
  }
  MPI_Bcast(&peers, 1, MPI_INT, 0, world);
  if (peers)
    MPI_Gather(c->traffic.sent, n, MPI_INT64_T, all, n, MPI_INT64_T, 0, world);
  if (rank == 0) {
    if (out_totals) *out_totals = sum;
    if (out_json) {
      put_json(&sum, out_json);
      if (peers) put_peers(all, P, out_json);
      xm_strbuf_puts(out_json, "}");
    }
  }
  free(all);
  int failed = 0;
  if (write_matrix) {
    if (rank == 0 && !matrix) failed = EINVAL; /* the caller passed no file */
    MPI_Bcast(&failed, 1, MPI_INT, 0, world);
    if (!failed) failed = write_matrices(c, step, matrix);
  }
  MPI_Bcast(&failed, 1, MPI_INT, 0, world);
  if (!failed) return XM_OK;
  if (rank == 0 && diag)
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL,
                "cannot write the traffic matrix of step %" PRId64 "%s", step,
                failed == EINVAL ? ": no file" : (failed == ENOMEM ? ": out of memory" : ""));
  return failed == ENOMEM ? XM_ERR_NO_MEMORY : XM_ERR_IO;
}
