/* tools/xmoec/inspect.h — `xmoec inspect`: what a compiled program does, per
 * rank, read back from the folder `xmoec compile` wrote.
 *
 * inspect_model.c loads OUT/ (model.xir: the scheduled, memory-planned IR;
 * manifest.json; config.json), and derives one record per op in execution
 * order (the micro-batch function's ops, then the step function's, as the
 * generated program runs them): its phase and layer, expected FLOPs and
 * memory traffic, for a collective its group and the bytes rank 0 puts on
 * the wire (the byte model of docs/traffic.md, with uniform routing for
 * the data-dependent all-to-alls), a predicted duration, and the
 * activation bytes in use after it. The four output formats each have a
 * file: inspect_text.c (text and Graphviz dot), inspect_html.c (one
 * self-contained page with SVG charts), inspect_trace.c (the predicted step
 * as Chrome/Perfetto trace JSON, the format `out/train --trace` measures).
 * docs/inspect.md describes the formats and every number's model.
 */
#ifndef XM_TOOLS_INSPECT_H
#define XM_TOOLS_INSPECT_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#include "frontend/layout.h"
#include "ir/ir.h"
#include "passes/plan_memory.h"
#include "planner/network.h"
#include "support/diag.h"
#include "support/strbuf.h"

typedef enum { XM_INS_FWD, XM_INS_BWD, XM_INS_STEP, XM_INS_PHASES } xm_ins_phase_t;

/* Traffic classes, as the runtime counts them (docs/traffic.md). */
typedef enum {
  XM_INS_DISPATCH,
  XM_INS_COMBINE,
  XM_INS_ALL_REDUCE,
  XM_INS_ALL_GATHER,
  XM_INS_REDUCE_SCATTER,
  XM_INS_OTHER,
  XM_INS_CLASSES
} xm_ins_class_t;

typedef struct {
  int index;            /* position in model.xir (the op index of traces) */
  const xm_ir_op_t *op; /* borrowed from the module */
  const char *name;     /* op name (static) */
  xm_ins_phase_t phase;
  int layer;        /* -1: none */
  bool traced;      /* runs code: has an event in both traces */
  bool comm;        /* a collective (XM_OPF_COMM) */
  bool last_micro;  /* a micro op run in the last micro-batch of a step only
                       (overlap-grad-reduce's attr last_micro) */
  bool gemm;        /* matmul / grouped_matmul family */
  double flops;     /* expected, one execution */
  double mem_bytes; /* bytes read and written, one execution */
  /* collectives (comm): the op's group and what rank 0 sends per call */
  const char *group; /* attr group (borrowed), NULL when none */
  int64_t group_size;
  double payload; /* bytes of the op's data operand */
  double sent[XM_INS_CLASSES];
  double sent_intra, sent_inter;
  double seconds;     /* predicted duration of one execution */
  int64_t act_in_use; /* activation arena bytes in use after it */
} xm_ins_op_t;

typedef struct {
  char *dir;         /* OUT, owned */
  xm_ir_module_t *m; /* owned */
  char model[64];
  xm_layout_t layout; /* from the module's par_* attrs */
  int64_t world, rpn; /* rpn: ranks per node the numbers use */
  int64_t grad_accum, micro_batch, seq_len;
  xm_mem_report_t mem;
  char pipeline[512]; /* from manifest.json, "" when absent */
  /* the machine the predictions assume */
  char machine[512]; /* where its numbers come from, for the reports */
  double peak_flops, efficiency, mem_bw;
  double device_bytes; /* the cluster's device memory; 0 for the CPU defaults */
  xm_net_t net;
  /* ops in execution order: [0, num_micro) micro function, then step */
  int num_ops, num_micro;
  xm_ins_op_t *ops; /* owned */
  int64_t act_peak; /* most activation bytes in use at once */
  int act_peak_at;  /* index into ops */
} xm_inspect_t;

/* Loads and analyses OUT. `cluster` (may be NULL) names a cluster file
 * whose machine numbers replace those found through the manifest. Every
 * problem goes to `diag` naming the file; XM_ERR_IO or
 * XM_ERR_INVALID_INPUT then (exit 2). The caller frees *out with
 * xm_inspect_free, also on failure. */
xm_status_t xm_inspect_load(const char *dir, const char *cluster, xm_diag_t *diag,
                            xm_inspect_t *out);
void xm_inspect_free(xm_inspect_t *ins);

/* DIR/NAME (one slash between), owned by the caller. */
char *xm_inspect_path(const char *dir, const char *name);

/* Checks the files of OUT against each other and against the limits of a
 * compiled program (inspect_check.c lists what); called by xm_inspect_load
 * once the module's layout, batch and memory report are read, before any
 * number is derived from them. Every contradiction goes to `diag` naming
 * the file; XM_ERR_INVALID_INPUT then. */
xm_status_t xm_inspect_check(const xm_inspect_t *ins, const cJSON *manifest, const cJSON *config,
                             xm_diag_t *diag);

/* The most events the trace format writes (grad_accum times the
 * micro-batch ops, plus the step's): about 400 MiB of JSON. */
#define XM_INSPECT_MAX_EVENTS ((int64_t)1 << 22)

/* Times an op runs per optimizer step: grad_accum for the micro function's
 * ops, 1 for the step function's. */
static inline int64_t xm_inspect_runs(const xm_inspect_t *ins, const xm_ins_op_t *o) {
  return o->phase == XM_INS_STEP || o->last_micro ? 1 : ins->grad_accum;
}

const char *xm_inspect_phase_name(xm_ins_phase_t p); /* "fwd", "bwd", "step" */
const char *xm_inspect_class_name(xm_ins_class_t c); /* "dispatch", ... */

/* The output formats; each appends to `out`. */
void xm_inspect_text(const xm_inspect_t *ins, xm_strbuf_t *out);
void xm_inspect_dot(const xm_inspect_t *ins, xm_strbuf_t *out);
void xm_inspect_html(const xm_inspect_t *ins, xm_strbuf_t *out);
void xm_inspect_trace(const xm_inspect_t *ins, xm_strbuf_t *out);

/* "1.50 MiB"-style bytes and "12.3 ms"-style seconds, appended. */
void xm_inspect_put_bytes(xm_strbuf_t *out, double bytes);
void xm_inspect_put_seconds(xm_strbuf_t *out, double seconds);

#endif /* XM_TOOLS_INSPECT_H */
