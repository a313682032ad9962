/* passes/fuse_permute_gemm.c — the padding-free permutation folded into the
 * grouped GEMMs (docs/design.md, Padding-free token permutation).
 *
 * Two rewrites of the forward graph, after shard and before autodiff:
 *
 *   gather_rows(x, indices) -> grouped_matmul(., w, tpe)
 *       becomes gather_grouped_matmul(x, indices, tpe, w) for every grouped
 *       GEMM that reads the gathered rows, when nothing else reads them:
 *       the GEMM reads its A rows through the slot index and the gathered
 *       [N,K] copy of the tokens is never written (nor kept for backward);
 *   grouped_matmul(h, w, tpe) -> scatter_combine(., indices, weights)
 *       becomes grouped_matmul_combine(h, w, tpe, indices, weights) when the
 *       expert outputs have no other use: the weighted combine is the GEMM's
 *       epilogue and the [N,M] expert output is never written either.
 *
 * Running before autodiff means the backward comes out fused as well: the
 * autodiff rules of the two fused ops emit their fused backward ops
 * (ir/ops.def), so no gradient op materialises the gathered rows. Under
 * expert parallelism the gather feeds an all_to_all and the combine reads
 * what the return all_to_all brought back, so neither pattern occurs and
 * the graph is left as it is; with RBD the dispatch replaces the gather.
 *
 * Every fused op gets its scratch result sized from the options: tile-rows
 * rows per staged tile (clamped to the rows that can exist) and slots tiles
 * staged at once, the most threads the kernel may use (clamped to the
 * tiles there can be). The scratch is a value like any other, so
 * plan-memory places it and `xmoec compile` counts it. The pass records
 * how many patterns it folded in module attrs fused_gathers and
 * fused_combines.
 */
#include <stdlib.h>
#include <string.h>

#include "passes/pass.h"
#include "passes/rewrite.h"

#define DEFAULT_TILE_ROWS 128
#define DEFAULT_SLOTS 8

typedef struct {
  xm_ir_module_t *m;
  int64_t tile_rows, slots;
  int *gemm_a_uses; /* value id -> uses as operand 0 of a grouped_matmul */
  int gathers, combines;
} fuse_t;

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Tiling for `rows` routed rows (their bound): never more rows per tile
 * than there are rows, never more tiles than the rows fill. */
static void tiling(const fuse_t *f, int64_t rows, int64_t *out_tile, int64_t *out_slots) {
  if (rows < 1) rows = 1;
  *out_tile = min64(f->tile_rows, rows);
  *out_slots = min64(f->slots, (rows + *out_tile - 1) / *out_tile);
}

/* Appends `code` (result 0 of type *out, then the scratch of `width`
 * floats per row) at `loc` with the old op's attrs plus the tiling, moves it
 * to position `at` (the old op's) and returns it; the old op is left to
 * DCE. */
static xm_ir_op_t *replace_at(fuse_t *f, int at, const xm_ir_op_t *old, const char *loc,
                              xm_ir_opcode_t code, int nops, xm_ir_value_t *const *ops,
                              const xm_ir_type_t *out, int64_t routed_rows, int64_t width) {
  int64_t tile, slots;
  tiling(f, routed_rows, &tile, &slots);
  xm_ir_type_t types[2] = {*out, xm_ir_type_make(XM_DT_F32, 2, (int64_t[]){tile * slots, width})};
  xm_ir_op_t *op = xm_ir_op_append(f->m, code, nops, ops, 2, types, loc);
  XM_ASSERT(op != NULL); /* arena exhaustion, as in the model builder */
  for (int i = 0; i < old->num_attrs; i++)
    xm_ir_op_set_attr(f->m, op, &old->attrs[i]);
  xm_ir_op_set_int(f->m, op, "tile_rows", tile);
  xm_ir_op_set_int(f->m, op, "slots", slots);
  xm_ir_module_move_op(f->m, xm_ir_module_num_ops(f->m) - 1, at);
  xm_ir_value_replace_uses(f->m, old->results[0], op->results[0]);
  return op;
}

/* grouped_matmul(gather_rows(x, idx), w, tpe) at position i. */
static bool fuse_gather(fuse_t *f, int i, xm_ir_op_t *op) {
  xm_ir_value_t *rows = op->operands[0];
  const xm_ir_op_t *g = rows->def;
  if (!g || g->code != XM_OP_GATHER_ROWS || g->num_operands != 2) return false;
  if (f->gemm_a_uses[rows->id] != rows->num_uses) return false; /* someone needs the copy */
  xm_ir_value_t *x = g->operands[0], *idx = g->operands[1];
  xm_ir_value_t *w = op->operands[1], *tpe = op->operands[2];
  xm_ir_op_t *n = replace_at(f, i, op, op->loc, XM_OP_GATHER_GROUPED_MATMUL, 4,
                             (xm_ir_value_t *[]){x, idx, tpe, w}, &op->results[0]->type,
                             idx->type.dims[0], x->type.dims[1]);
  xm_ir_op_set_int(f->m, n, "k", xm_ir_op_get_int(g, "k", 1));
  f->gathers++;
  return true;
}

/* scatter_combine(grouped_matmul(h, w, tpe), idx, weights) at position i. */
static bool fuse_combine(fuse_t *f, int i, xm_ir_op_t *op) {
  xm_ir_value_t *y = op->operands[0];
  const xm_ir_op_t *d = y->def;
  if (!d || d->code != XM_OP_GROUPED_MATMUL || d->num_operands != 3 || y->num_uses != 1)
    return false;
  xm_ir_value_t *h = d->operands[0], *w = d->operands[1], *tpe = d->operands[2];
  xm_ir_value_t *idx = op->operands[1], *rw = op->operands[2];
  /* The GEMM's place: the combine is its epilogue. */
  replace_at(f, i, op, d->loc, XM_OP_GROUPED_MATMUL_COMBINE, 5,
             (xm_ir_value_t *[]){h, w, tpe, idx, rw}, &op->results[0]->type, idx->type.dims[0],
             w->type.dims[1]);
  f->combines++;
  return true;
}

static void count_gemm_a_uses(fuse_t *f) {
  int nv = xm_ir_module_num_values(f->m);
  memset(f->gemm_a_uses, 0, sizeof(int) * (size_t)nv);
  for (int i = 0; i < xm_ir_module_num_ops(f->m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(f->m, i);
    if (op->code == XM_OP_GROUPED_MATMUL && op->num_operands == 3)
      f->gemm_a_uses[op->operands[0]->id]++;
  }
}

static xm_status_t parse_count(const xm_pass_options_t *o, const char *key, int64_t dflt,
                               int64_t max, xm_diag_t *diag, int64_t *out) {
  const char *v = xm_pass_option(o, key);
  *out = dflt;
  if (!v) return XM_OK;
  char *end = NULL;
  long long n = strtoll(v, &end, 10);
  if (!*v || *end || n < 1 || n > max) {
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL,
                "fuse-permute-gemm: option %s must be an integer in [1, %lld], got '%s'", key,
                (long long)max, v);
    return XM_ERR_INVALID_INPUT;
  }
  *out = n;
  return XM_OK;
}

static bool has_backward(const xm_ir_module_t *m) {
  for (int i = 0; i < xm_ir_module_num_ops(m); i++)
    if (xm_ir_op_attr(xm_ir_module_op(m, i), "phase")) return true;
  return false;
}

static xm_status_t fuse_run(xm_ir_module_t *m, const xm_pass_options_t *options, xm_diag_t *diag,
                            bool *out_changed) {
  fuse_t f = {m, 0, 0, NULL, 0, 0};
  XM_RETURN_IF_ERROR(
      parse_count(options, "tile-rows", DEFAULT_TILE_ROWS, XM_IR_FUSED_MAX_TILE_ROWS, diag,
                  &f.tile_rows));
  XM_RETURN_IF_ERROR(
      parse_count(options, "slots", DEFAULT_SLOTS, XM_IR_FUSED_MAX_SLOTS, diag, &f.slots));
  if (has_backward(m)) {
    /* Fused after autodiff, the backward would still gather: refuse rather
     * than fuse half the block. */
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL,
                "fuse-permute-gemm runs on the forward graph (before autodiff); this module "
                "already has a backward");
    return XM_ERR_INVALID_INPUT;
  }
  /* Values created by the rewrites get ids past the table: they are never
   * grouped_matmul operands, and the table is only read for old values. */
  f.gemm_a_uses = calloc((size_t)xm_ir_module_num_values(m) + 1, sizeof(int));
  if (!f.gemm_a_uses) return XM_ERR_NO_MEMORY;
  count_gemm_a_uses(&f);
  int nv = xm_ir_module_num_values(m);
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->num_results < 1 || op->results[0]->num_uses == 0) continue;
    if (op->code == XM_OP_GROUPED_MATMUL && op->num_operands == 3 && op->operands[0]->id < nv)
      fuse_gather(&f, i, op);
    else if (op->code == XM_OP_SCATTER_COMBINE && op->num_operands == 3)
      fuse_combine(&f, i, op);
  }
  free(f.gemm_a_uses);
  if (f.gathers || f.combines) {
    bool removed = false;
    XM_RETURN_IF_ERROR(xm_rewrite_dce(m, &removed));
    *out_changed = true;
  }
  xm_ir_module_set_int(m, "fused_gathers", f.gathers);
  xm_ir_module_set_int(m, "fused_combines", f.combines);
  return XM_OK;
}

static const char *const k_options[] = {"tile-rows", "slots", NULL};

const xm_pass_info_t xm_pass_fuse_permute_gemm = {
    .name = "fuse-permute-gemm",
    .summary = "fold the padding-free gather into the grouped GEMMs' row reads and the weighted "
               "combine into the down GEMM's epilogue",
    .option_names = k_options,
    .run = fuse_run,
};
