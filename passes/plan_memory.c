/* passes/plan_memory.c — the "plan-memory" pass: every op result gets a
 * place (arena, offset, bytes) so the generated program needs no allocator.
 *
 * Two arenas per rank. The persistent arena holds params and training
 * states (gradients, Adam moments, expert loads) for the whole run; they
 * are laid out in op order, each aligned, so a checkpoint or an optimizer
 * walks them in a predictable order. The activation arena holds everything
 * else and is reused over time: the schedule runs the fwd and bwd ops (in
 * module order) once per micro-batch, then the step ops once per optimizer
 * step. Both functions share one timeline here — micro ops at positions
 * 0..M-1, step ops after them — so one greedy placement serves both: a
 * step temporary never intersects a micro temporary and takes its bytes
 * back, while the rare value that a step op reads from the micro function
 * (it then holds what the last micro-batch wrote) stays alive across.
 *
 * A buffer lives from its definition to its last use. The inputs (tokens,
 * labels) are written by the data loader before the micro function starts
 * and are read by it to its end; the returned values (loss, ce) are read
 * after it ends: both live over the whole micro function's tail. A reshape
 * result is its operand's buffer seen in another shape, so it joins the
 * operand's buffer (same offset) and stretches its lifetime.
 *
 * Placement is the classic greedy-by-size (ggml, TFLite): buffers in
 * decreasing size (ties: earlier definition, then value id), each at the
 * lowest offset that overlaps no already placed buffer whose lifetime
 * intersects its own. It is deterministic and, on transformer graphs whose
 * activations come in few distinct sizes, close to the live-bytes peak.
 *
 * Sizes use the upper bound of dynamic dims. In a single-rank graph those
 * bounds are exact upper bounds (T*k token slots after permute), so the
 * plan always fits. Once the graph is sharded, a dim's bound after permute
 * and all_to_all is a planning bound, not a guarantee: the runtime checks
 * the observed row count against the bound after each such op and stops
 * with the observed size (the codegen emits that check), so an overflowing
 * buffer is reported, never written past.
 *
 * The record format and the report are described in passes/plan_memory.h.
 */
#include "passes/plan_memory.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/pass.h"

enum { PHASE_FWD, PHASE_BWD, PHASE_STEP };
enum { CAT_NONE, CAT_WEIGHTS, CAT_GRADS, CAT_OPTIMIZER };

/* One buffer: an op result together with the reshapes that alias it. */
typedef struct {
  int root;       /* value id of the buffer's own (non-reshape) value */
  int phase;      /* phase of the defining op */
  int category;   /* CAT_* for persistent buffers, CAT_NONE otherwise */
  bool is_input;  /* defined by an input op */
  int64_t bytes;  /* max aligned size over the values sharing it */
  int start, end; /* live interval on the timeline, inclusive */
  int arena;
  int64_t offset;
} buffer_t;

/* Everything the pass works with; freed by plan_free. */
typedef struct {
  xm_ir_module_t *m;
  xm_diag_t *diag;
  int64_t align;
  int num_ops, num_values;
  int num_micro;      /* M: ops of phase fwd or bwd */
  int *op_pos;        /* op index -> timeline position */
  int *op_phase;      /* op index -> PHASE_* */
  int *val_buf;       /* value id -> buffer index, -1 for ids not in use */
  int *op_ws;         /* op index -> buffer index of its workspace, -1 for none */
  int64_t *val_bytes; /* value id -> its own aligned size */
  buffer_t *bufs;
  int num_bufs;
  xm_mem_report_t report;
} plan_t;

static void plan_free(plan_t *p) {
  free(p->op_pos);
  free(p->op_phase);
  free(p->val_buf);
  free(p->op_ws);
  free(p->val_bytes);
  free(p->bufs);
}

static const char *op_name(const xm_ir_op_t *op) { return xm_ir_opinfo(op->code)->name; }

static void op_error(plan_t *p, const xm_ir_op_t *op, int index, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* "op 12 (matmul): <message>" at the op's location (the pass manager names the pass). */
static void op_error(plan_t *p, const xm_ir_op_t *op, int index, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  xm_diag_add(p->diag, XM_DIAG_ERROR, NULL, op->loc[0] ? op->loc : NULL, "op %d (%s): %s", index,
              op_name(op), msg);
}

/* ---- timeline ---------------------------------------------------------- */

/* Phases from the "phase" attr (absent: fwd, the forward graph before
 * autodiff), then positions: micro ops first, step ops after them. */
static xm_status_t assign_positions(plan_t *p) {
  p->num_micro = 0;
  for (int i = 0; i < p->num_ops; i++) {
    const xm_ir_op_t *op = xm_ir_module_op(p->m, i);
    const char *ph = xm_ir_op_get_string(op, "phase", "fwd");
    if (strcmp(ph, "fwd") == 0)
      p->op_phase[i] = PHASE_FWD;
    else if (strcmp(ph, "bwd") == 0)
      p->op_phase[i] = PHASE_BWD;
    else if (strcmp(ph, "step") == 0)
      p->op_phase[i] = PHASE_STEP;
    else {
      op_error(p, op, i, "phase \"%s\" is not fwd, bwd or step", ph);
      return XM_ERR_INVALID_INPUT;
    }
    if (p->op_phase[i] != PHASE_STEP) p->num_micro++;
  }
  int micro = 0, step = 0;
  for (int i = 0; i < p->num_ops; i++)
    p->op_pos[i] = p->op_phase[i] == PHASE_STEP ? p->num_micro + step++ : micro++;
  return XM_OK;
}

/* Aligned byte size of a type at its bounds; false on overflow. */
static bool type_bytes(const xm_ir_type_t *t, int64_t align, int64_t *out) {
  int64_t numel = xm_ir_type_numel(t), bytes, padded;
  if (numel < 0) return false;
  if (__builtin_mul_overflow(numel, (int64_t)xm_dtype_size(t->dtype), &bytes)) return false;
  if (__builtin_add_overflow(bytes, align - 1, &padded)) return false;
  *out = padded & ~(align - 1);
  return true;
}

static int category_of(const xm_ir_op_t *op) {
  if (op->code == XM_OP_PARAM) return CAT_WEIGHTS;
  if (op->code != XM_OP_STATE) return CAT_NONE;
  /* Every state that is not a gradient is optimizer-side training state
   * (moments, expert loads): it lives and is sharded with the optimizer. */
  return strcmp(xm_ir_op_get_string(op, "kind", ""), "grad") == 0 ? CAT_GRADS : CAT_OPTIMIZER;
}

/* Unverified input (opt --no-verify) must not crash the pass: every
 * operand has to be a result of an earlier op. */
static xm_status_t check_operands(plan_t *p, const xm_ir_op_t *op, int index) {
  for (int k = 0; k < op->num_operands; k++) {
    const xm_ir_value_t *v = op->operands[k];
    if (!v || v->id < 0 || v->id >= p->num_values || p->val_buf[v->id] < 0) {
      op_error(p, op, index, "operand %d is not a result of an earlier op", k);
      return XM_ERR_INVALID_INPUT;
    }
  }
  return XM_OK;
}

/* Creates the buffers: one per non-reshape result; a reshape result joins
 * its operand's buffer. */
static xm_status_t make_buffers(plan_t *p) {
  for (int i = 0; i < p->num_ops; i++) {
    const xm_ir_op_t *op = xm_ir_module_op(p->m, i);
    XM_RETURN_IF_ERROR(check_operands(p, op, i));
    for (int r = 0; r < op->num_results; r++) {
      const xm_ir_value_t *v = op->results[r];
      if (!v || v->id < 0 || v->id >= p->num_values || p->val_buf[v->id] >= 0) {
        op_error(p, op, i, "result %d is not a fresh value of this module", r);
        return XM_ERR_INVALID_INPUT;
      }
      int64_t bytes;
      if (!type_bytes(&v->type, p->align, &bytes)) {
        op_error(p, op, i, "result %d is too large to address", r);
        return XM_ERR_INVALID_INPUT;
      }
      /* A weight gradient the GEMM adds into its state (fold-accumulate)
       * is never written: it holds no bytes. */
      if (r == 0 && xm_ir_op_get_bool(op, "accumulate", false)) bytes = 0;
      p->val_bytes[v->id] = bytes;
      if (op->code == XM_OP_RESHAPE && op->num_operands == 1) {
        int b = p->val_buf[op->operands[0]->id];
        p->val_buf[v->id] = b;
        if (bytes > p->bufs[b].bytes) p->bufs[b].bytes = bytes;
        continue;
      }
      buffer_t *b = &p->bufs[p->num_bufs];
      *b = (buffer_t){.root = v->id,
                      .phase = p->op_phase[i],
                      .category = category_of(op),
                      .is_input = op->code == XM_OP_INPUT,
                      .bytes = bytes,
                      .start = p->op_pos[i],
                      .end = p->op_pos[i],
                      .arena =
                          xm_ir_op_is_declaration(op) ? XM_MEM_ARENA_PERSISTENT : XM_MEM_ARENA_ACTIVATION};
      if (b->is_input && b->phase != PHASE_STEP) b->start = 0;
      p->val_buf[v->id] = p->num_bufs++;
    }
    /* A kernel's workspace: live during its op only. */
    int64_t ws = xm_ir_op_get_int(op, "workspace", 0);
    if (ws < 0) {
      op_error(p, op, i, "attribute workspace is negative (%" PRId64 " bytes)", ws);
      return XM_ERR_INVALID_INPUT;
    }
    if (ws > 0) {
      int64_t bytes;
      if (ws > INT64_MAX - p->align) {
        op_error(p, op, i, "its workspace is too large to address");
        return XM_ERR_INVALID_INPUT;
      }
      bytes = (ws + p->align - 1) / p->align * p->align;
      p->bufs[p->num_bufs] = (buffer_t){.root = -1 - i,
                                        .phase = p->op_phase[i],
                                        .category = CAT_NONE,
                                        .bytes = bytes,
                                        .start = p->op_pos[i],
                                        .end = p->op_pos[i],
                                        .arena = XM_MEM_ARENA_ACTIVATION};
      p->op_ws[i] = p->num_bufs++;
    }
  }
  return XM_OK;
}

/* Stretches each buffer to its last use; rejects a micro op reading a
 * value that only the step function computes. */
static xm_status_t extend_lifetimes(plan_t *p) {
  int micro_end = p->num_micro - 1;
  for (int i = 0; i < p->num_ops; i++) {
    const xm_ir_op_t *op = xm_ir_module_op(p->m, i);
    int pos = p->op_pos[i];
    for (int k = 0; k < op->num_operands; k++) {
      const xm_ir_value_t *v = op->operands[k];
      buffer_t *b = &p->bufs[p->val_buf[v->id]];
      if (p->op_phase[i] != PHASE_STEP && b->phase == PHASE_STEP &&
          b->arena == XM_MEM_ARENA_ACTIVATION) {
        op_error(p, op, i,
                 "operand %d is computed by the step function, which runs after the "
                 "micro-batches",
                 k);
        return XM_ERR_INVALID_INPUT;
      }
      int last = pos;
      if (op->code == XM_OP_RETURN && p->op_phase[i] != PHASE_STEP && micro_end > last)
        last = micro_end;
      if (last > b->end) b->end = last;
    }
  }
  for (int b = 0; b < p->num_bufs; b++)
    if (p->bufs[b].is_input && p->bufs[b].phase != PHASE_STEP && micro_end > p->bufs[b].end)
      p->bufs[b].end = micro_end;
  return XM_OK;
}

/* An exchange queued on the MoE stream (overlap-moe-comm: attr async) runs
 * from the fork before the ops beside it (the run of attr beside just
 * before it) to the join before the first op that reads one of its
 * results: its results and workspace live from the fork, its operands up
 * to the join, so nothing that runs meanwhile shares their bytes. */
static void extend_async(plan_t *p) {
  for (int i = 0; i < p->num_ops; i++) {
    const xm_ir_op_t *op = xm_ir_module_op(p->m, i);
    if (p->op_phase[i] == PHASE_STEP || !xm_ir_op_get_bool(op, "async", false)) continue;
    int f = i;
    while (f > 0 && xm_ir_op_get_bool(xm_ir_module_op(p->m, f - 1), "beside", false))
      f--;
    int join = -1; /* no reader: the end of the micro function */
    for (int j = i + 1; j < p->num_ops && join < 0; j++) {
      const xm_ir_op_t *u = xm_ir_module_op(p->m, j);
      if (p->op_phase[j] == PHASE_STEP) continue;
      for (int k = 0; k < u->num_operands; k++)
        if (u->operands[k]->def == op) join = p->op_pos[j];
    }
    if (join < 0) join = p->num_micro - 1;
    for (int k = 0; k < op->num_operands; k++) {
      buffer_t *b = &p->bufs[p->val_buf[op->operands[k]->id]];
      if (b->arena == XM_MEM_ARENA_ACTIVATION && join > b->end) b->end = join;
    }
    for (int r = 0; r < op->num_results; r++) {
      buffer_t *b = &p->bufs[p->val_buf[op->results[r]->id]];
      if (p->op_pos[f] < b->start) b->start = p->op_pos[f];
    }
    if (p->op_ws[i] >= 0) {
      buffer_t *b = &p->bufs[p->op_ws[i]];
      if (p->op_pos[f] < b->start) b->start = p->op_pos[f];
      if (join > b->end) b->end = join;
    }
  }
}

/* ---- placement --------------------------------------------------------- */

static xm_status_t place_persistent(plan_t *p) {
  int64_t off = 0;
  for (int b = 0; b < p->num_bufs; b++) {
    buffer_t *bf = &p->bufs[b];
    if (bf->arena != XM_MEM_ARENA_PERSISTENT) continue;
    bf->offset = off;
    if (__builtin_add_overflow(off, bf->bytes, &off)) return XM_ERR_NO_MEMORY;
    if (bf->category == CAT_WEIGHTS)
      p->report.weights += bf->bytes;
    else if (bf->category == CAT_GRADS)
      p->report.grads += bf->bytes;
    else
      p->report.optimizer += bf->bytes;
  }
  p->report.persistent_bytes = off;
  return XM_OK;
}

typedef struct {
  int64_t bytes;
  int start;
  int root;
  int buf;
} order_key_t;

static int order_cmp(const void *a, const void *b) {
  const order_key_t *x = a, *y = b;
  if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
  if (x->start != y->start) return x->start < y->start ? -1 : 1;
  return (x->root > y->root) - (x->root < y->root);
}

static bool intersects(const buffer_t *a, const buffer_t *b) {
  return a->start <= b->end && b->start <= a->end;
}

/* Lowest offset for `b` among the placed buffers `placed` (sorted by
 * offset) whose lifetimes intersect it. */
static xm_status_t lowest_fit(const plan_t *p, const int *placed, int n, const buffer_t *b,
                              int64_t *out_offset) {
  int64_t cand = 0;
  for (int j = 0; j < n; j++) {
    const buffer_t *q = &p->bufs[placed[j]];
    if (q->bytes == 0 || !intersects(b, q)) continue;
    int64_t need;
    if (__builtin_add_overflow(cand, b->bytes, &need)) return XM_ERR_NO_MEMORY;
    if (need <= q->offset) break;
    int64_t q_end = q->offset + q->bytes;
    if (q_end > cand) cand = q_end;
  }
  *out_offset = cand;
  return XM_OK;
}

static xm_status_t place_activations(plan_t *p) {
  order_key_t *keys = calloc((size_t)p->num_bufs + 1, sizeof *keys);
  int *placed = calloc((size_t)p->num_bufs + 1, sizeof *placed);
  if (!keys || !placed) {
    free(keys);
    free(placed);
    return XM_ERR_NO_MEMORY;
  }
  int n = 0, num_placed = 0;
  for (int b = 0; b < p->num_bufs; b++)
    if (p->bufs[b].arena == XM_MEM_ARENA_ACTIVATION)
      keys[n++] = (order_key_t){p->bufs[b].bytes, p->bufs[b].start, p->bufs[b].root, b};
  qsort(keys, (size_t)n, sizeof *keys, order_cmp);
  xm_status_t st = XM_OK;
  int64_t arena = 0;
  for (int k = 0; k < n && st == XM_OK; k++) {
    buffer_t *b = &p->bufs[keys[k].buf];
    b->offset = 0;
    if (b->bytes == 0) continue; /* holds nothing; offset 0 overlaps nothing */
    st = lowest_fit(p, placed, num_placed, b, &b->offset);
    if (st != XM_OK) break;
    int at = num_placed;
    while (at > 0 && p->bufs[placed[at - 1]].offset > b->offset)
      at--;
    memmove(placed + at + 1, placed + at, (size_t)(num_placed - at) * sizeof *placed);
    placed[at] = keys[k].buf;
    num_placed++;
    if (b->offset + b->bytes > arena) arena = b->offset + b->bytes;
  }
  p->report.activation_bytes = arena;
  free(keys);
  free(placed);
  return st;
}

/* The activation peak: the earliest position with the most live bytes;
 * the forward buffers live there are the activations, the rest of the
 * arena is workspace. */
static xm_status_t peak_breakdown(plan_t *p) {
  int len = p->num_ops + 1;
  int64_t *delta = calloc((size_t)len, sizeof *delta);
  if (!delta) return XM_ERR_NO_MEMORY;
  for (int b = 0; b < p->num_bufs; b++) {
    const buffer_t *bf = &p->bufs[b];
    if (bf->arena != XM_MEM_ARENA_ACTIVATION) continue;
    delta[bf->start] += bf->bytes;
    delta[bf->end + 1] -= bf->bytes;
  }
  int64_t live = 0, best = 0;
  int peak = -1;
  for (int t = 0; t < p->num_ops; t++) {
    live += delta[t];
    if (live > best) best = live, peak = t;
  }
  free(delta);
  for (int b = 0; peak >= 0 && b < p->num_bufs; b++) {
    const buffer_t *bf = &p->bufs[b];
    if (bf->arena != XM_MEM_ARENA_ACTIVATION || bf->start > peak || bf->end < peak) continue;
    if (bf->phase != PHASE_FWD) continue;
    p->report.activations += bf->bytes;
    if (bf->is_input) p->report.inputs += bf->bytes;
  }
  p->report.workspace = p->report.activation_bytes - p->report.activations;
  return XM_OK;
}

/* ---- recording --------------------------------------------------------- */

static xm_status_t record(plan_t *p) {
  int64_t *ints = NULL;
  int cap = 0;
  for (int i = 0; i < p->num_ops; i++) {
    xm_ir_op_t *op = xm_ir_module_op(p->m, i);
    if (p->op_ws[i] >= 0) {
      const buffer_t *b = &p->bufs[p->op_ws[i]];
      int64_t ws[2] = {b->offset, b->bytes};
      xm_ir_op_set_ints(p->m, op, "ws", 2, ws);
    }
    if (op->num_results == 0) continue;
    if (op->num_results * 3 > cap) {
      cap = op->num_results * 3;
      free(ints);
      ints = calloc((size_t)cap, sizeof *ints);
      if (!ints) return XM_ERR_NO_MEMORY;
    }
    for (int r = 0; r < op->num_results; r++) {
      int id = op->results[r]->id;
      const buffer_t *b = &p->bufs[p->val_buf[id]];
      ints[3 * r] = b->arena;
      ints[3 * r + 1] = b->offset;
      ints[3 * r + 2] = p->val_bytes[id];
    }
    xm_ir_op_set_ints(p->m, op, "mem", 3 * op->num_results, ints);
  }
  free(ints);
  const struct {
    const char *key;
    int64_t v;
  } attrs[] = {
      {"mem_activation_bytes", p->report.activation_bytes},
      {"mem_activations", p->report.activations},
      {"mem_grads", p->report.grads},
      {"mem_inputs", p->report.inputs},
      {"mem_optimizer", p->report.optimizer},
      {"mem_persistent_bytes", p->report.persistent_bytes},
      {"mem_weights", p->report.weights},
      {"mem_workspace", p->report.workspace},
  };
  for (size_t k = 0; k < sizeof attrs / sizeof attrs[0]; k++) {
    xm_ir_attr_t a = {.key = attrs[k].key, .kind = XM_ATTR_INT, .i = attrs[k].v};
    xm_ir_module_set_attr(p->m, &a);
  }
  return XM_OK;
}

static xm_status_t plan_run(plan_t *p) {
  size_t nops = (size_t)p->num_ops + 1, nvals = (size_t)p->num_values + 1;
  p->op_pos = calloc(nops, sizeof *p->op_pos);
  p->op_phase = calloc(nops, sizeof *p->op_phase);
  p->val_buf = malloc(nvals * sizeof *p->val_buf);
  p->op_ws = malloc(nops * sizeof *p->op_ws);
  p->val_bytes = calloc(nvals, sizeof *p->val_bytes);
  p->bufs = calloc(nvals + nops, sizeof *p->bufs);
  if (!p->op_pos || !p->op_phase || !p->val_buf || !p->op_ws || !p->val_bytes || !p->bufs)
    return XM_ERR_NO_MEMORY;
  for (size_t i = 0; i < nvals; i++)
    p->val_buf[i] = -1;
  for (size_t i = 0; i < nops; i++)
    p->op_ws[i] = -1;
  XM_RETURN_IF_ERROR(assign_positions(p));
  XM_RETURN_IF_ERROR(make_buffers(p));
  XM_RETURN_IF_ERROR(extend_lifetimes(p));
  extend_async(p);
  XM_RETURN_IF_ERROR(place_persistent(p));
  XM_RETURN_IF_ERROR(place_activations(p));
  XM_RETURN_IF_ERROR(peak_breakdown(p));
  return record(p);
}

xm_status_t xm_plan_memory(xm_ir_module_t *m, int64_t alignment, xm_diag_t *diag) {
  if (alignment < 1 || alignment > (1 << 20) || (alignment & (alignment - 1)) != 0) {
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL,
                "alignment %lld is not a power of two in [1, 1048576]", (long long)alignment);
    return XM_ERR_INVALID_INPUT;
  }
  plan_t p = {.m = m,
              .diag = diag,
              .align = alignment,
              .num_ops = xm_ir_module_num_ops(m),
              .num_values = xm_ir_module_num_values(m)};
  xm_status_t st = plan_run(&p);
  if (st == XM_ERR_NO_MEMORY)
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL, "out of memory or an arena size overflowed");
  plan_free(&p);
  return st;
}

/* ---- the pass ---------------------------------------------------------- */

static xm_status_t plan_memory_run(xm_ir_module_t *m, const xm_pass_options_t *options,
                                   xm_diag_t *diag, bool *out_changed) {
  int64_t alignment = XM_PLAN_MEMORY_DEFAULT_ALIGNMENT;
  const char *s = xm_pass_option(options, "alignment");
  if (s) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0') {
      xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL, "option alignment=\"%s\" is not an integer", s);
      return XM_ERR_INVALID_INPUT;
    }
    alignment = v;
  }
  XM_RETURN_IF_ERROR(xm_plan_memory(m, alignment, diag));
  *out_changed = true;
  return XM_OK;
}

static const char *const k_options[] = {"alignment", NULL};

const xm_pass_info_t xm_pass_plan_memory = {
    .name = "plan-memory",
    .summary = "liveness and greedy-by-size offsets in a persistent and an activation arena",
    .option_names = k_options,
    .run = plan_memory_run,
};

/* ---- readers ----------------------------------------------------------- */

bool xm_plan_memory_place(const xm_ir_op_t *op, int result, xm_mem_place_t *out_place) {
  const xm_ir_attr_t *a = xm_ir_op_attr(op, "mem");
  if (!a || a->kind != XM_ATTR_INTS || a->n != 3 * op->num_results) return false;
  if (result < 0 || result >= op->num_results) return false;
  const int64_t *e = a->ints + 3 * result;
  if ((e[0] != XM_MEM_ARENA_PERSISTENT && e[0] != XM_MEM_ARENA_ACTIVATION) || e[1] < 0 || e[2] < 0)
    return false;
  *out_place = (xm_mem_place_t){.arena = (int)e[0], .offset = e[1], .bytes = e[2]};
  return true;
}

bool xm_plan_memory_workspace(const xm_ir_op_t *op, xm_mem_place_t *out_place) {
  const xm_ir_attr_t *a = xm_ir_op_attr(op, "ws");
  if (!a || a->kind != XM_ATTR_INTS || a->n != 2 || a->ints[0] < 0 || a->ints[1] <= 0) return false;
  *out_place = (xm_mem_place_t){
      .arena = XM_MEM_ARENA_ACTIVATION, .offset = a->ints[0], .bytes = a->ints[1]};
  return true;
}

static const xm_ir_attr_t *module_attr(const xm_ir_module_t *m, const char *key) {
  for (int i = 0; i < xm_ir_module_num_attrs(m); i++) {
    const xm_ir_attr_t *a = xm_ir_module_attr(m, i);
    if (strcmp(a->key, key) == 0) return a;
  }
  return NULL;
}

xm_status_t xm_plan_memory_read_report(const xm_ir_module_t *m, xm_diag_t *diag,
                                       xm_mem_report_t *out_report) {
  xm_mem_report_t r = {0};
  const struct {
    const char *key;
    int64_t *dst;
  } fields[] = {
      {"mem_persistent_bytes", &r.persistent_bytes},
      {"mem_activation_bytes", &r.activation_bytes},
      {"mem_weights", &r.weights},
      {"mem_grads", &r.grads},
      {"mem_optimizer", &r.optimizer},
      {"mem_activations", &r.activations},
      {"mem_workspace", &r.workspace},
      {"mem_inputs", &r.inputs},
  };
  for (size_t k = 0; k < sizeof fields / sizeof fields[0]; k++) {
    const xm_ir_attr_t *a = module_attr(m, fields[k].key);
    if (!a || a->kind != XM_ATTR_INT || a->i < 0) {
      if (diag)
        xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL,
                    "module @%s has no memory plan: attribute %s is %s (run plan-memory)",
                    xm_ir_module_name(m), fields[k].key, a ? "not a byte count" : "missing");
      return XM_ERR_INVALID_INPUT;
    }
    *fields[k].dst = a->i;
  }
  *out_report = r;
  return XM_OK;
}

void xm_plan_memory_format_bytes(int64_t bytes, xm_strbuf_t *out) {
  static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) {
    xm_strbuf_printf(out, "%" PRId64 " B", bytes);
    return;
  }
  double v = (double)bytes / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 5)
    v /= 1024.0, u++;
  xm_strbuf_printf(out, "%.2f %s", v, units[u]);
}

void xm_plan_memory_print_report(const xm_mem_report_t *r, xm_strbuf_t *out) {
  const struct {
    const char *label;
    int64_t v;
  } parts[] = {
      {"weights", r->weights},     {"gradients", r->grads},
      {"optimizer", r->optimizer}, {"activations", r->activations},
      {"workspace", r->workspace}, {"total", r->persistent_bytes + r->activation_bytes},
  };
  xm_strbuf_puts(out, "peak memory per rank: ");
  for (size_t k = 0; k < sizeof parts / sizeof parts[0]; k++) {
    xm_strbuf_printf(out, "%s%s ", k ? ", " : "", parts[k].label);
    xm_plan_memory_format_bytes(parts[k].v, out);
  }
}
