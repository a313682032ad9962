/* runtime/abi/program.h — what a generated training program gives the runtime.
 *
 * `xmoec compile` emits out/program.c, which defines one xm_rt_program_t
 * named xm_program: the tensor table (every parameter, state, input and
 * activation with its arena offset), the training settings of the spec, and
 * two straight-line functions produced from the scheduled IR: `micro` runs
 * forward and backward of one micro-batch (accumulating gradients into the
 * grad states), `step` runs the optimizer step (global-norm clipping,
 * AdamW, aux-free bias update, zeroing of the accumulators). The runtime's
 * training driver (runtime/driver/train.h) owns everything else: arenas, data,
 * initialisation, the LR schedule, checkpoints, logging. The order of
 * operations, the shapes and the buffers all come from the generated code.
 */
#ifndef XM_RUNTIME_PROGRAM_H
#define XM_RUNTIME_PROGRAM_H

#include <math.h>
#include <stdint.h>

#include "runtime/abi/backend.h"

/* Memory categories of the peak report: weights, gradients,
 * optimizer states, activations, workspace (+ inputs). */
typedef enum {
  XM_RT_CAT_WEIGHTS = 0,
  XM_RT_CAT_GRADS,
  XM_RT_CAT_OPTIMIZER,
  XM_RT_CAT_ACTIVATIONS,
  XM_RT_CAT_WORKSPACE,
  XM_RT_CAT_INPUTS,
  XM_RT_CAT_COUNT_
} xm_rt_category_t;

/* Element types of the tensor table, from runtime/abi/dtypes.def. */
typedef enum {
#define XM_DTYPE(e, name, bytes, ctype) XM_RT_##e,
#include "runtime/abi/dtypes.def"
#undef XM_DTYPE
  XM_RT_DTYPE_COUNT_
} xm_rt_dtype_t;

/* The most dims a tensor of the ABI has (the IR's XM_IR_MAX_RANK is this). */
#define XM_RT_MAX_RANK 6
typedef enum {
  XM_RT_INIT_NONE = 0,
  XM_RT_INIT_NORMAL,
  XM_RT_INIT_ONES,
  XM_RT_INIT_ZEROS
} xm_rt_init_t;

typedef struct {
  const char *name;     /* params: HF name, "{e}" marks a stacked expert dim 0;
                           states: "<param name>.<kind>"; else the IR value */
  int category;         /* xm_rt_category_t */
  int dtype;            /* xm_rt_dtype_t */
  int rank;
  int64_t dims[XM_RT_MAX_RANK]; /* upper bounds for dynamic dims */
  int persistent;       /* 1: in the persistent arena (params, states) */
  int64_t offset;       /* bytes from the start of its arena */
  int64_t bytes;
  int init;             /* params: xm_rt_init_t */
  float init_std;
  int trainable;        /* params: updated by the optimizer */
  int param;            /* states: index of the param they belong to, else -1 */
  /* Sharding (multi-rank programs; all 0 for a tensor every rank holds
   * whole). split_group (xm_rt_group_kind_t + 1, 0 = not split): dim
   * split_dim of the full tensor is cut into group-size equal slices and
   * this rank holds slice number group index; dims above are the slice's.
   * chunk_group (xm_rt_group_kind_t + 1, 0 = none): a ZeRO-1 optimizer
   * state holding this rank's chunk (runtime/comm/spmd.h xm_rt_chunk) of the
   * flattened (slice of the) param `param`; its dims are {c}. */
  int split_group;
  int split_dim;
  int chunk_group;
  /* States: 1 for what a micro-batch accumulates into (gradients, the
   * aux-free load counts), which the driver zeroes after an evaluation
   * (it runs micro but never step); 0 otherwise. */
  int accumulator;
  /* Expert placement (xmoec compile --placement; docs/placement.md): row + 1
   * of the program's placement table when dim 0 of the whole tensor is
   * indexed by the expert slots of that MoE layer (stacked expert weights,
   * the router's weight rows and correction bias, and their states), else 0.
   * The runtime keeps such tensors in slot order and permutes them to the
   * Hugging Face numbering at the edges: initialisation and checkpoints. */
  int placed;
} xm_rt_tensor_t;

typedef struct xm_rt_exec xm_rt_exec_t;
/* The process context (rank, world, node layout; runtime/comm/context.h).
 * Opaque here: the ABI that generated code sees carries no MPI types. */
typedef struct xm_rt_context xm_rt_context_t;

typedef struct {
  const char *model_name;
  const char *config_json;    /* HF-style config.json text (docs/design.md, Interfaces) */
  const char *spec_json;      /* the input spec, for the manifest and checkpoints */
  /* shapes */
  int64_t vocab, seq_len, micro_batch, grad_accum;
  /* training settings (spec defaults; flags of out/train override) */
  double lr, min_lr, weight_decay, beta1, beta2, adam_eps, grad_clip;
  int64_t warmup_steps, train_steps;
  int lr_schedule;            /* 0 cosine, 1 constant, 2 linear (xm_lr_schedule_t) */
  uint64_t seed;
  /* parallel layout the schedule was compiled for (0 read as 1; out/train
   * refuses to run on a world size other than dp*tp). ranks_per_node 0:
   * unknown at compile time (the run decides). */
  int dp, tp, ep, ssmb, rbd, zero, ranks_per_node;
  /* memory */
  int64_t persistent_bytes, activation_bytes;
  int64_t category_bytes[XM_RT_CAT_COUNT_]; /* peak per category */
  /* tensors */
  int num_tensors;
  const xm_rt_tensor_t *tensors;
  int tokens, labels;         /* input tensors, i32[micro_batch, seq_len] */
  int loss, ce_loss;          /* f32[] outputs of micro: total and cross-entropy */
  /* Programs with MTP modules (has_mtp 1): the f32[] output of their mean
   * cross-entropy, and the weight the loss takes it with. */
  int has_mtp, mtp_loss;
  double mtp_loss_weight;
  /* Expert placement: placement_rows MoE layers (Hugging Face layer index
   * placement_layers[r]) whose slot p holds expert
   * placement[r * placement_experts + p]; 0 rows when every layer is the
   * identity. placement_experts: the routed experts of an MoE layer (0: a
   * dense model). placement_nodes: the node blocks it was made for (0
   * unknown). */
  int placement_rows;
  int64_t placement_experts, placement_nodes;
  const int32_t *placement_layers;
  const int32_t *placement;
  /* schedule */
  void (*micro)(xm_rt_exec_t *x);
  void (*step)(xm_rt_exec_t *x);
} xm_rt_program_t;

/* The lanes of overlapped collectives (xm_rt_overlap_*, below): the
 * gradient reductions of the last micro-batch, and the expert exchanges. */
enum { XM_RT_LANE_GRAD = 0, XM_RT_LANE_MOE = 1, XM_RT_LANES = 2 };
typedef struct {
  xm_rt_stream_t *stream;
  xm_rt_event_t *fork, *done;
  int forked;  /* fork recorded, the begin not yet made */
  int pending; /* work queued that the compute stream has not waited for */
} xm_rt_lane_t;

/* The state the generated functions read. */
struct xm_rt_exec {
  const xm_rt_program_t *program;
  const xm_rt_context_t *ctx;
  /* The backend that owns the arenas and runs the kernels, and the stream
   * the schedule is queued on (runtime/abi/backend.h). */
  xm_rt_backend_t *be;
  xm_rt_stream_t *stream;
  unsigned char *persist;     /* persistent arena (device memory) */
  unsigned char *act;         /* activation arena (device memory) */
  /* The host image of the persistent arena that initialisation and
   * checkpoints read and write: persist itself on a host-visible backend,
   * else a host copy the driver moves with copy_h2d / copy_d2h at the
   * edges (after initialisation or a load, before a save). */
  unsigned char *persist_host;
  float lr;                   /* learning rate of the current step */
  int64_t step;               /* 1-based optimizer step being taken */
  /* optimizer settings in force (program defaults or out/train flags) */
  float beta1, beta2, adam_eps, weight_decay, grad_clip;
  float grad_scale;           /* set by the step function: the clip coefficient */
  /* Set by the micro function (its host_read ops): the total, the
   * cross-entropy and the MTP loss of the micro-batch, read from the device. */
  float host_loss, host_ce_loss, host_mtp_loss; /* host_mtp_loss: programs with MTP */
  double grad_norm;           /* set by the step function: global norm before clipping */
  void *comm; /* xm_rt_comm_t * (runtime/comm/comm.h) of a multi-rank run, else NULL */
  void *rbd;  /* RBD routing records between forward and backward (runtime/moe/rbd_exec.h) */
  /* The routing statistics recorder (xm_rt_routing_stats_t *,
   * runtime/moe/routing_stats.h) while `out/train --routing-stats` trains,
   * else NULL: the hook after each forward top-k routing tests it. */
  void *routing_stats;
  /* The op-timeline recorder (xm_rt_trace_t *, runtime/driver/trace.h) while a
   * step traced by `out/train --trace` runs, else NULL: the hooks of the
   * generated code test it and do nothing else when it is NULL. */
  void *trace;
  /* Overlapped collectives (the overlap-grad-reduce and overlap-moe-comm
   * passes; docs/design.md, Overlap): one lane per kind, each a stream
   * beside `stream` with its two events (lane[].stream NULL when the
   * backend gave none: that lane's collectives then run in order on
   * `stream`). While a collective is queued on a lane, `stream` is the
   * lane's stream and compute_stream holds the compute one. last_micro:
   * set by the driver while the last micro-batch of an optimizer step runs
   * (the overlapped gradient reductions run then only; 0 in an
   * evaluation). */
  xm_rt_lane_t lane[XM_RT_LANES];
  xm_rt_stream_t *compute_stream;
  int last_micro;
};

/* Arena access from generated code and the driver, queued on the exec's
 * stream: a copy between device buffers, zeroing, a 32-bit fill, and the
 * explicit host read (blocking) of a device value. */
static inline void xm_rt_copy(const xm_rt_exec_t *x, void *dst, const void *src, int64_t bytes) {
  x->be->copy_d2d(x->be, dst, src, (size_t)bytes, x->stream);
}
static inline void xm_rt_zero(const xm_rt_exec_t *x, void *dst, int64_t bytes) {
  x->be->fill32(x->be, dst, 0u, (size_t)bytes / 4u, x->stream);
}
static inline void xm_rt_fill_i32(const xm_rt_exec_t *x, int32_t *dst, int32_t v, int64_t n) {
  x->be->fill32(x->be, dst, (uint32_t)v, (size_t)n, x->stream);
}
static inline void xm_rt_read(const xm_rt_exec_t *x, void *host, const void *dev, int64_t bytes) {
  x->be->read(x->be, host, dev, (size_t)bytes, x->stream);
}

/* An overlapped collective of generated code, on lane `lane`:
 * xm_rt_overlap_begin makes the lane's stream wait for what the compute
 * stream had queued at the lane's fork (xm_rt_overlap_fork, or this call
 * when there was none) and queues what follows there (the collective reads
 * and writes through x->stream, so it lands on that stream whatever its
 * transport); xm_rt_overlap_end goes back to the compute stream, which runs
 * on without waiting. Between a fork and the begin the compute stream is
 * given the work that runs beside the collective (overlap-moe-comm: the
 * collective's inputs are ready at the fork, that work does not need it).
 * xm_rt_overlap_join makes the compute stream wait for everything the lane
 * was given: before the first reader of an exchange's results, and at the
 * start of the step for the gradient reductions. Without the lane's
 * stream, and in a step traced by `out/train --trace` (whose op timings
 * assume one op at a time), fork, begin and end do nothing and the
 * collective runs in order. A host-blocking transport (MPI, host staging)
 * synchronises the stream it is given, so it is correct here too; it
 * overlaps what was queued on the compute stream before it. */
static inline void xm_rt_overlap_fork(xm_rt_exec_t *x, int lane) {
  xm_rt_lane_t *l = &x->lane[lane];
  if (!l->stream || x->trace || x->compute_stream) return;
  x->be->event_record(x->be, l->fork, x->stream);
  l->forked = 1;
}
static inline void xm_rt_overlap_begin(xm_rt_exec_t *x, int lane) {
  xm_rt_lane_t *l = &x->lane[lane];
  if (!l->stream || x->trace || x->compute_stream) return;
  if (!l->forked) x->be->event_record(x->be, l->fork, x->stream);
  l->forked = 0;
  x->be->stream_wait(x->be, l->stream, l->fork);
  x->compute_stream = x->stream;
  x->stream = l->stream;
}
static inline void xm_rt_overlap_end(xm_rt_exec_t *x, int lane) {
  if (!x->compute_stream) return;
  x->stream = x->compute_stream;
  x->compute_stream = NULL;
  x->lane[lane].pending = 1;
}
static inline void xm_rt_overlap_join(xm_rt_exec_t *x, int lane) {
  xm_rt_lane_t *l = &x->lane[lane];
  if (!l->pending) return;
  x->be->event_record(x->be, l->done, l->stream);
  x->be->stream_wait(x->be, x->stream, l->done);
  l->pending = 0;
}

/* The program a generated out/program.c defines. */
extern const xm_rt_program_t xm_program;

/* min(1, clip / (sqrt(norm_sq) + 1e-6)); 1 when clip <= 0 (PyTorch's
 * clip_grad_norm_). A host computation of the step function, the same for
 * every backend. */
static inline float xm_rt_clip_coef(float norm_sq, float clip) {
  if (!(clip > 0.0f)) return 1.0f;
  double coef = (double)clip / (sqrt((double)norm_sq) + 1e-6);
  return coef < 1.0 ? (float)coef : 1.0f;
}

/* Stops the program from generated code (a data-dependent size over the
 * bound the memory plan reserved, ...): prints "xmoec: rank R: <message>"
 * and ends every rank with exit code 1 (xm_rt_abort). With no context yet
 * (x->ctx NULL, e.g. a test harness) it prints and exits. Never returns. */
void xm_rt_fail(const xm_rt_exec_t *x, const char *fmt, ...)
    __attribute__((format(printf, 2, 3), noreturn));

/* Fault injection for the failure tests: true when the environment
 * variable XM_FAULT is "KIND:RANK:STEP" with this KIND, this world rank and
 * x->step == STEP (runtime/comm/fail.c). Never set in normal runs. */
int xm_rt_fault(const xm_rt_exec_t *x, const char *kind);

#endif /* XM_RUNTIME_PROGRAM_H */
