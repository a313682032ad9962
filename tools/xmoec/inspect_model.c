/* tools/xmoec/inspect_model.c — reading a compiled program back and
 * predicting what each op costs (tools/xmoec/inspect.h).
 *
 * Everything comes from OUT/model.xir, the module exactly as the code
 * generator saw it: op order is the schedule, "mem" attrs are the memory
 * plan, module attrs par_* the layout and mem_* the memory report. The op
 * index used everywhere is the op's position in that file, which is also
 * the number in the generated program's "/ * op N ... * /" comments and in
 * the events of `out/train --trace`.
 *
 * Predictions (docs/inspect.md has the formulas):
 *   - sizes are expected values: a routed buffer's rows are its memory
 *     plan's bound for a permute (exact when dropless), the rows sent for
 *     an all-to-all's result (uniform routing: a rank receives what it
 *     sends), T*k for an RBD dispatch;
 *   - a compute op takes max(FLOPs / (peak * efficiency), bytes / memory
 *     bandwidth);
 *   - a collective takes what planner/network.h says for its group, and
 *     sends what docs/traffic.md counts for rank 0 (member 0 of each of
 *     its groups); RBD rows use the expected distinct (node, rank) copies
 *     of a token under uniform routing;
 *   - nothing overlaps: the CPU runtime runs one op at a time.
 * The machine is the cluster the program was compiled for when the
 * manifest's inputs can still be read (and hash the same), else a cluster
 * file given with --cluster, else CPU defaults (named in every report).
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "frontend/spec.h"
#include "ir/text.h"
#include "ir/verify.h"
#include "runtime/abi/groups.h"
#include "support/sha256.h"
#include "tools/xmoec/inspect.h"

/* CPU defaults, what `xmoec inspect` assumes without a cluster
 * (docs/inspect.md): a 2-core AVX-512 development machine, where the tiny
 * sample's GEMMs run at ~170 GFLOP/s and its elementwise kernels (their
 * buffers mostly in cache) at ~40 GB/s. */
#define CPU_PEAK_FLOPS 3.2e11
#define CPU_EFFICIENCY 0.5
#define CPU_MEM_BW 4.0e10
#define CPU_LINK_GBPS 5.0
#define CPU_LATENCY_US 5.0
/* Memory bandwidth assumed for a cluster's devices (the cluster spec has
 * no field for it): HBM class. */
#define DEVICE_MEM_BW 2.0e12

const char *xm_inspect_phase_name(xm_ins_phase_t p) {
  static const char *const names[] = {"fwd", "bwd", "step"};
  return p < XM_INS_PHASES ? names[p] : "?";
}

/* The classes are the runtime's traffic phases (runtime/abi/groups.def),
 * in the same order, so a class prints as the phase's name. */
#define XM_PHASE(e, name, doc)                                                                     \
  _Static_assert((int)XM_INS_##e == (int)XM_RT_PHASE_##e, "XM_INS_" #e " is not a phase");
#include "runtime/abi/groups.def"
_Static_assert((int)XM_INS_CLASSES == (int)XM_RT_PHASE_COUNT, "a class is not a phase");

const char *xm_inspect_class_name(xm_ins_class_t c) {
  return c < XM_INS_CLASSES ? xm_rt_phase_kind_name((xm_rt_phase_t)c) : "?";
}

void xm_inspect_put_bytes(xm_strbuf_t *out, double bytes) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (fabs(bytes) >= 1024.0 && u < 4)
    bytes /= 1024.0, u++;
  if (u == 0)
    xm_strbuf_printf(out, "%.0f B", bytes);
  else
    xm_strbuf_printf(out, "%.2f %s", bytes, units[u]);
}

void xm_inspect_put_seconds(xm_strbuf_t *out, double s) {
  if (s >= 1.0)
    xm_strbuf_printf(out, "%.3f s", s);
  else if (s >= 1e-3)
    xm_strbuf_printf(out, "%.3f ms", s * 1e3);
  else
    xm_strbuf_printf(out, "%.3f us", s * 1e6);
}

/* ---- files ------------------------------------------------------------- */

char *xm_inspect_path(const char *dir, const char *name) {
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  xm_strbuf_puts(&b, dir);
  if (b.len == 0 || b.data[b.len - 1] != '/') xm_strbuf_puts(&b, "/");
  xm_strbuf_puts(&b, name);
  return xm_strbuf_take(&b);
}

/* Reads OUT/name; a message naming the file when it cannot. */
static xm_status_t read_out_file(const char *dir, const char *name, xm_diag_t *diag, char **text,
                                 size_t *len, char **out_path) {
  char *path = xm_inspect_path(dir, name);
  int err = xm_read_file_limit(path, XM_READ_LIMIT_IR, text, len);
  if (err) {
    char why[160];
    xm_diag_add(diag, XM_DIAG_ERROR, path, NULL,
                "cannot read: %s (is %s the output folder of "
                "`xmoec compile`?)",
                xm_read_error(err, XM_READ_LIMIT_IR, why, sizeof why), dir);
    free(path);
    return XM_ERR_IO;
  }
  *out_path = path;
  return XM_OK;
}

/* A JSON object file of OUT; NULL (with a message) when malformed. */
static cJSON *read_json_object(const char *dir, const char *name, xm_diag_t *diag,
                               xm_status_t *st) {
  char *text = NULL, *path = NULL;
  size_t len = 0;
  *st = read_out_file(dir, name, diag, &text, &len, &path);
  if (*st != XM_OK) return NULL;
  cJSON *o = cJSON_ParseWithLength(text, len);
  if (!o || !cJSON_IsObject(o)) {
    xm_diag_add(diag, XM_DIAG_ERROR, path, NULL, "not a JSON object (malformed)");
    cJSON_Delete(o);
    o = NULL;
    *st = XM_ERR_INVALID_INPUT;
  }
  free(text);
  free(path);
  return o;
}

/* OUT/model.xir: parsed, verified, planned and scheduled. */
static xm_status_t load_module(xm_inspect_t *ins, xm_diag_t *diag) {
  char *text = NULL, *path = NULL;
  size_t len = 0;
  XM_RETURN_IF_ERROR(read_out_file(ins->dir, "model.xir", diag, &text, &len, &path));
  xm_status_t st = xm_ir_parse(text, len, path, diag, &ins->m);
  free(text);
  if (st == XM_OK && xm_ir_verify(ins->m, diag) != XM_OK) {
    xm_diag_add(diag, XM_DIAG_ERROR, path, NULL, "the module does not verify (edited by hand?)");
    st = XM_ERR_INVALID_INPUT;
  }
  if (st == XM_OK && xm_plan_memory_read_report(ins->m, NULL, &ins->mem) != XM_OK) {
    xm_diag_add(diag, XM_DIAG_ERROR, path, NULL,
                "not a compiled program: the module has no memory plan (mem_* attributes)");
    st = XM_ERR_INVALID_INPUT;
  }
  if (st == XM_OK && xm_ir_module_get_int(ins->m, "schedule_micro_ops", -1) < 0) {
    xm_diag_add(diag, XM_DIAG_ERROR, path, NULL,
                "not a compiled program: the module was not scheduled (no schedule_micro_ops)");
    st = XM_ERR_INVALID_INPUT;
  }
  free(path);
  return st;
}

/* ---- the machine ------------------------------------------------------- */

/* The text of a manifest input when it can still be read and hashes as it
 * did at compile time; NULL otherwise. */
static char *manifest_input(const cJSON *manifest, int i, const char **out_path, size_t *len) {
  const cJSON *in = cJSON_GetArrayItem(cJSON_GetObjectItem(manifest, "inputs"), i);
  const cJSON *p = cJSON_GetObjectItem(in, "path"), *h = cJSON_GetObjectItem(in, "sha256");
  *out_path = cJSON_IsString(p) ? p->valuestring : NULL;
  if (!*out_path || !cJSON_IsString(h)) return NULL;
  char *text = NULL;
  if (xm_read_file(*out_path, &text, len) != 0) return NULL;
  char hex[65];
  xm_sha256_hex(text, *len, hex);
  if (strcmp(hex, h->valuestring) != 0) {
    free(text);
    return NULL;
  }
  return text;
}

/* The cluster the program was compiled with: the cluster file input, or
 * the spec's own cluster section. When there is none, or the inputs cannot
 * be read as they were, `from` says why the CPU defaults are used. */
static bool compile_cluster(const cJSON *manifest, xm_cluster_spec_t *out, char *from, size_t cap) {
  xm_spec_t *spec = calloc(1, sizeof *spec);
  if (!spec) return false;
  bool found = false;
  const char *path = NULL, *cpath = NULL;
  size_t len = 0, clen = 0;
  char *text = manifest_input(manifest, 0, &path, &len);
  char *ctext = manifest_input(manifest, 1, &cpath, &clen);
  xm_diag_t scratch;
  xm_diag_init(&scratch);
  snprintf(from, cap, "CPU defaults (no cluster in the compile's inputs)");
  if (!text && path) {
    snprintf(from, cap, "CPU defaults (the compile's spec %s cannot be read here or has changed)",
             path);
  } else if (!ctext && cpath) {
    snprintf(from, cap,
             "CPU defaults (the compile's cluster file %s cannot be read here or has changed)",
             cpath);
  } else if (text && xm_spec_load_text(text, len, path, &scratch, spec) == XM_OK) {
    if (ctext && xm_spec_load_cluster_text(ctext, clen, cpath, &scratch, spec) == XM_OK) {
      found = spec->cluster.present;
      snprintf(from, cap, "cluster %s (%s, the compile's)", spec->cluster.name, cpath);
    } else if (!ctext && spec->cluster.present) {
      found = true;
      snprintf(from, cap, "cluster %s (the cluster section of %s)", spec->cluster.name, path);
    }
  }
  free(text);
  free(ctext);
  xm_diag_free(&scratch);
  if (found) *out = spec->cluster;
  free(spec);
  return found;
}

/* --cluster FILE. */
static xm_status_t flag_cluster(const char *path, xm_diag_t *diag, xm_cluster_spec_t *out) {
  xm_spec_t *spec = calloc(1, sizeof *spec);
  if (!spec) return XM_ERR_NO_MEMORY;
  xm_spec_set_defaults(spec);
  xm_status_t st = xm_spec_load_cluster_file(path, diag, spec);
  if (st == XM_OK && xm_diag_error_count(diag)) st = XM_ERR_INVALID_INPUT;
  if (st == XM_OK) *out = spec->cluster;
  free(spec);
  return st;
}

static void cpu_cluster(xm_cluster_spec_t *c, int64_t world) {
  memset(c, 0, sizeof *c);
  snprintf(c->name, sizeof c->name, "cpu");
  c->nodes = 1;
  c->ranks_per_node = world;
  c->device_memory_gib = 0;
  c->peak_tflops = CPU_PEAK_FLOPS / 1e12;
  c->gemm_efficiency = CPU_EFFICIENCY;
  c->intra_bw_gbps = c->inter_bw_gbps = CPU_LINK_GBPS;
  c->intra_latency_us = c->inter_latency_us = CPU_LATENCY_US;
}

static xm_status_t setup_machine(xm_inspect_t *ins, const cJSON *manifest, const char *cluster,
                                 xm_diag_t *diag) {
  xm_cluster_spec_t c;
  char from[320] = "";
  bool device = true;
  if (cluster) {
    XM_RETURN_IF_ERROR(flag_cluster(cluster, diag, &c));
    snprintf(from, sizeof from, "cluster %s (--cluster %s)", c.name, cluster);
  } else if (!compile_cluster(manifest, &c, from, sizeof from)) {
    cpu_cluster(&c, ins->world);
    device = false;
  }
  ins->peak_flops = c.peak_tflops * 1e12;
  ins->efficiency = c.gemm_efficiency;
  ins->device_bytes = device ? c.device_memory_gib * 1024.0 * 1024.0 * 1024.0 : 0;
  ins->mem_bw = device ? DEVICE_MEM_BW : CPU_MEM_BW;
  /* Ranks per node: the program's, else the cluster's when it tiles the
   * world, else one node. */
  int64_t rpn = xm_ir_module_get_int(ins->m, "par_rpn", 0);
  if (rpn <= 0 && device && c.ranks_per_node > 0 && ins->world % c.ranks_per_node == 0)
    rpn = c.ranks_per_node;
  if (rpn <= 0 || rpn > ins->world || ins->world % rpn != 0) rpn = ins->world;
  ins->rpn = rpn;
  ins->layout.ranks_per_node = rpn;
  xm_net_from_cluster(&c, &ins->net);
  ins->net.ranks_per_node = rpn;
  if (ins->net.nodes < ins->world / rpn) ins->net.nodes = ins->world / rpn;
  snprintf(ins->machine, sizeof ins->machine,
           "%s: peak %.4g TFLOP/s x efficiency %.2f, memory %.4g GB/s, links %.4g / %.4g "
           "GB/s (intra / inter node), ranks per node %lld",
           from, c.peak_tflops, c.gemm_efficiency, ins->mem_bw / 1e9, c.intra_bw_gbps,
           c.inter_bw_gbps, (long long)rpn);
  return XM_OK;
}

/* ---- expected sizes ---------------------------------------------------- */

typedef struct {
  xm_inspect_t *ins;
  double *rows;                     /* value id -> expected rows of dim 0 */
  const xm_ir_op_t **slot_dispatch; /* RBD slot -> its rbd_dispatch */
  int num_slots;
} ctx_t;

static bool dyn0(const xm_ir_value_t *v) { return v->type.rank > 0 && v->type.dynamic[0]; }

static double numel(const xm_ir_value_t *v) {
  int64_t n = xm_ir_type_numel(&v->type);
  return n < 0 ? 0.0 : (double)n;
}

/* Expected elements: the bound scaled by expected rows for routed rows. */
static double exp_numel(const ctx_t *c, const xm_ir_value_t *v) {
  if (!dyn0(v) || v->type.dims[0] <= 0) return numel(v);
  return numel(v) / (double)v->type.dims[0] * c->rows[v->id];
}

static double exp_bytes(const ctx_t *c, const xm_ir_value_t *v) {
  return exp_numel(c, v) * (double)xm_dtype_size(v->type.dtype);
}

static int64_t dim(const xm_ir_value_t *v, int i) {
  if (i < 0) i += v->type.rank;
  return i >= 0 && i < v->type.rank ? v->type.dims[i] : 1;
}

/* Expected rows of every value: a static dim 0 as it is; the routed rows
 * of a source of run-time counts (attr rows_id of the routed-rows pass)
 * from what it receives (an all_to_all: the rows sent, under uniform
 * routing; an rbd_dispatch: T*k; a permute: its bound), and every other
 * dynamic result those of its source (attr rows_of), bounded by its own
 * dim. A module without the attrs (compiled before routed-rows) takes the
 * first routed operand's. */
static void expected_rows(ctx_t *c) {
  const xm_ir_module_t *m = c->ins->m;
  int64_t sources = xm_ir_module_get_int(m, "routed_sources", 0);
  double *src = calloc((size_t)(sources > 0 ? sources : 1), sizeof *src);
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    int64_t id = xm_ir_op_get_int(op, "rows_id", -1), of = xm_ir_op_get_int(op, "rows_of", -1);
    for (int j = 0; j < op->num_results; j++) {
      const xm_ir_value_t *v = op->results[j];
      double r = v->type.rank > 0 ? (double)v->type.dims[0] : 1.0;
      if (dyn0(v)) {
        if (op->code == XM_OP_ALL_TO_ALL && op->num_operands > 0)
          r = c->rows[op->operands[0]->id];
        else if (op->code == XM_OP_RBD_DISPATCH && op->num_operands > 1)
          r = (double)dim(op->operands[0], 0) * (double)dim(op->operands[1], 1);
        else if (src && of >= 0 && of < sources)
          r = src[of];
        else if (op->code != XM_OP_PERMUTE)
          for (int k = 0; k < op->num_operands; k++)
            if (dyn0(op->operands[k])) {
              r = c->rows[op->operands[k]->id];
              break;
            }
        if (r > (double)v->type.dims[0]) r = (double)v->type.dims[0];
        if (src && id >= 0 && id < sources && j == 0) src[id] = r;
      }
      c->rows[v->id] = r;
    }
  }
  free(src);
}

/* ---- compute ----------------------------------------------------------- */

/* An accumulate the fold-accumulate pass folded into the weight-gradient
 * GEMM producing its operand (attr folded): it runs no code of its own, so
 * it costs nothing here. */
static bool fused_accumulate(const xm_ir_op_t *op) {
  return op->code == XM_OP_ACCUMULATE && xm_ir_op_get_bool(op, "folded", false);
}

/* FLOPs per element of the result (elementwise and normalisation ops). */
static double per_element(xm_ir_opcode_t code) {
  switch (code) {
  case XM_OP_SILU:
  case XM_OP_SIGMOID: return 4;
  case XM_OP_GELU: return 8;
  case XM_OP_SWIGLU: return 5;
  case XM_OP_RMSNORM: return 4;
  case XM_OP_ROPE:
  case XM_OP_ROPE_GRAD: return 3;
  case XM_OP_ROUTER_SCORE:
  case XM_OP_CROSS_ENTROPY: return 5;
  case XM_OP_SILU_GRAD:
  case XM_OP_SIGMOID_GRAD:
  case XM_OP_GELU_GRAD: return 8;
  case XM_OP_SWIGLU_GRAD:
  case XM_OP_RMSNORM_GRAD: return 10;
  case XM_OP_ROUTER_SCORE_GRAD:
  case XM_OP_CROSS_ENTROPY_GRAD: return 6;
  case XM_OP_ADAMW: return 12;
  case XM_OP_RESHAPE:
  case XM_OP_SPLIT:
  case XM_OP_CONCAT:
  case XM_OP_REPLICATE:
  case XM_OP_NARROW:
  case XM_OP_CONSTANT:
  case XM_OP_SORT_CHUNKS:
  case XM_OP_UNSORT_CHUNKS:
  case XM_OP_GATHER_ROWS:
  case XM_OP_PERMUTE:
  case XM_OP_EMBEDDING:
  case XM_OP_ZERO: return 0;
  default: return 1;
  }
}

static void compute_cost(const ctx_t *c, xm_ins_op_t *o) {
  const xm_ir_op_t *op = o->op;
  const xm_ir_value_t *const *in = (const xm_ir_value_t *const *)op->operands;
  double f = 0.0;
  switch (op->code) {
  case XM_OP_MATMUL: f = 2 * exp_numel(c, in[0]) * (double)dim(in[1], 0); break;
  case XM_OP_MATMUL_DX: f = 2 * exp_numel(c, in[0]) * (double)dim(in[1], 1); break;
  case XM_OP_MATMUL_DW:
  case XM_OP_GROUPED_MATMUL_DW: f = 2 * exp_numel(c, in[0]) * (double)dim(in[1], -1); break;
  case XM_OP_GROUPED_MATMUL: f = 2 * exp_numel(c, in[0]) * (double)dim(in[1], 1); break;
  case XM_OP_GROUPED_MATMUL_DX: f = 2 * exp_numel(c, in[0]) * (double)dim(in[1], 2); break;
  /* The fused MoE GEMMs: the products of the unfused ones, 2 N M K, with
   * the routed rows N taken from the operand or result that has them. */
  case XM_OP_GATHER_GROUPED_MATMUL: /* y[N,M], x[T,K] */
    f = 2 * exp_numel(c, op->results[0]) * (double)dim(in[0], 1);
    break;
  case XM_OP_GROUPED_MATMUL_COMBINE: /* h[N,K], w[E,M,K] */
    f = 2 * exp_numel(c, in[0]) * (double)dim(in[1], 1);
    break;
  case XM_OP_GATHER_GROUPED_MATMUL_DX: /* dy[N,M], w[E,M,K] */
  case XM_OP_GATHER_GROUPED_MATMUL_DW: /* dy[N,M], x[T,K] */
    f = 2 * exp_numel(c, in[0]) * (double)dim(op->results[0], -1);
    break;
  case XM_OP_GROUPED_MATMUL_COMBINE_GRAD: /* dout[T,M], h[N,K] */
  case XM_OP_GROUPED_MATMUL_COMBINE_DW: f = 2 * exp_numel(c, in[1]) * (double)dim(in[0], 1); break;
  /* The fused loss: the head's GEMM, 2 T H V (the softmax's few T V
   * are left out, as for the matmul it replaces); its backward recomputes
   * the logits and runs the dx and dw GEMMs: three times that. */
  case XM_OP_LM_HEAD_CE: /* x[...,H], w[V,H], labels */
    f = 2 * (double)dim(in[1], 1) * exp_numel(c, in[2]) * (double)dim(in[1], 0);
    break;
  case XM_OP_LM_HEAD_CE_GRAD: /* dloss, x, w[V,H], labels */
    f = 6 * (double)dim(in[2], 1) * exp_numel(c, in[3]) * (double)dim(in[2], 0);
    break;
  case XM_OP_ATTENTION: /* causal: half of 2 B Hq S^2 (D + Dv) */
    f = (double)dim(in[0], 0) * dim(in[0], 2) * dim(in[0], 1) * dim(in[0], 1) *
        (double)(dim(in[0], 3) + dim(in[2], 3));
    break;
  case XM_OP_ATTENTION_GRAD: /* 2.5x the forward: two GEMMs each way plus the recompute */
    f = 2.5 * (double)dim(in[1], 0) * dim(in[1], 2) * dim(in[1], 1) * dim(in[1], 1) *
        (double)(dim(in[1], 3) + dim(in[3], 3));
    break;
  default: {
    double n = 0.0;
    for (int j = 0; j < op->num_results; j++)
      n = fmax(n, exp_numel(c, op->results[j]));
    for (int j = 0; j < op->num_operands; j++)
      n = fmax(n, exp_numel(c, op->operands[j]));
    f = per_element(op->code) * n;
  }
  }
  o->gemm =
      op->code == XM_OP_MATMUL || op->code == XM_OP_MATMUL_DX || op->code == XM_OP_MATMUL_DW ||
      op->code == XM_OP_GROUPED_MATMUL || op->code == XM_OP_GROUPED_MATMUL_DX ||
      op->code == XM_OP_GROUPED_MATMUL_DW ||
      (op->code >= XM_OP_GATHER_GROUPED_MATMUL_DX && op->code <= XM_OP_GROUPED_MATMUL_COMBINE_DW) ||
      op->code == XM_OP_GATHER_GROUPED_MATMUL || op->code == XM_OP_GROUPED_MATMUL_COMBINE ||
      op->code == XM_OP_LM_HEAD_CE || op->code == XM_OP_LM_HEAD_CE_GRAD;
  o->flops = o->comm ? 0.0 : f;
  /* Bytes: operands read, results written; in-place updates (no results)
   * read and write their operands; aliased reshapes move nothing. */
  double b = 0.0;
  if (fused_accumulate(op)) {
    o->flops = 0.0;
  } else if (op->code != XM_OP_RESHAPE && op->code != XM_OP_INPUT && op->code != XM_OP_RETURN) {
    for (int j = 0; j < op->num_operands; j++)
      b += exp_bytes(c, op->operands[j]);
    for (int j = 0; j < op->num_results; j++)
      b += exp_bytes(c, op->results[j]);
    if (op->num_results == 0 && op->code != XM_OP_ZERO) b *= 2;
  }
  o->mem_bytes = b;
}

/* ---- collectives ------------------------------------------------------- */

/* Group of rank 0 for an op's group name (runtime/abi/groups.def; an
 * alias such as "sp" is the group whose ranks it names). */
static bool group_of(const xm_inspect_t *ins, const char *name, xm_net_group_t *g) {
  xm_group_kind_t kind;
  if (!xm_group_kind_from_name(name, &kind)) return false;
  xm_group_t x = xm_layout_group(&ins->layout, kind, 0);
  *g = (xm_net_group_t){x.first, x.stride, x.size};
  return true;
}

static int64_t node_of(const xm_inspect_t *ins, int64_t rank) { return rank / ins->rpn; }

/* Members of g other than rank 0 on rank 0's node, and elsewhere. */
static void peers(const xm_inspect_t *ins, xm_net_group_t g, double *same, double *other) {
  /* Rank 0's node holds ranks [0, rpn): members first + i*stride for i
   * in [1, size) below rpn (counted, not enumerated: a group may hold
   * 2^24 ranks). */
  int64_t below = ins->rpn > g.first ? (ins->rpn - g.first - 1) / g.stride : 0;
  if (below > g.size - 1) below = g.size - 1;
  if (below < 0) below = 0;
  *same = (double)below;
  *other = (double)(g.size - 1 - below);
}

/* prod_{i<k} (E - h - i) / (E - i): no slot of a token (k distinct
 * experts among E, uniform) lands among h given experts. */
static double miss(double E, double h, double k) {
  double p = 1.0;
  for (int i = 0; i < (int)k; i++)
    p *= E - h - i > 0 ? (E - h - i) / (E - i) : 0.0;
  return p;
}

/* Expected rows one RBD call of rank 0 sends per token, inside its node
 * and to other nodes (uniform routing; docs/inspect.md). */
static void rbd_rows(const ctx_t *c, const xm_ir_op_t *op, xm_net_group_t g, double *intra,
                     double *inter, double *k_out) {
  *intra = *inter = 0;
  int64_t slot = xm_ir_op_get_int(op, "slot", -1);
  const xm_ir_op_t *d = slot >= 0 && slot < c->num_slots ? c->slot_dispatch[slot] : NULL;
  if (!d || d->num_operands < 2) return;
  double E = (double)xm_ir_op_get_int(d, "num_experts", 0), k = (double)dim(d->operands[1], 1);
  *k_out = k;
  double ep = (double)g.size, m = 0;
  for (int64_t i = 0; i < g.size; i++)
    m += node_of(c->ins, g.first + i * g.stride) == node_of(c->ins, g.first);
  if (E <= 0 || ep <= 0 || m <= 0) return;
  double nodes = ceil(ep / m);
  double r = 1.0 - miss(E, E / ep, k);     /* a given rank holds one of the token's experts */
  double q = 1.0 - miss(E, E * m / ep, k); /* a given node does */
  *inter = (nodes - 1) * q;
  *intra = q * (1.0 - 1.0 / m) + nodes * (m * r - q);
}

static void comm_cost(const ctx_t *c, xm_ins_op_t *o) {
  const xm_inspect_t *ins = c->ins;
  const xm_ir_op_t *op = o->op;
  xm_net_group_t g = {0, 1, 1};
  o->group = xm_ir_op_get_string(op, "group", NULL);
  if (!group_of(ins, o->group, &g)) g = (xm_net_group_t){0, 1, 1};
  o->group_size = g.size;
  const xm_ir_value_t *x = op->num_operands ? op->operands[0] : NULL;
  o->payload = x ? exp_bytes(c, x) : 0.0;
  double P = (double)g.size, es = x ? (double)xm_dtype_size(x->type.dtype) : 4.0;
  double n = x ? exp_numel(c, x) : 0.0, b = 0.0;
  xm_ins_class_t cls = XM_INS_OTHER;
  xm_net_cost_t t = {0, 0, 0};
  switch (op->code) {
  case XM_OP_ALL_REDUCE:
  case XM_OP_REDUCE_STATE:
  case XM_OP_ALL_GATHER:
  case XM_OP_REDUCE_SCATTER:
  case XM_OP_ZERO_REDUCE_SCATTER:
  case XM_OP_ZERO_GATHER: {
    /* Ring collectives: the planner's network layer says what rank 0
     * (member 0) sends and how long the ring takes (docs/traffic.md). */
    xm_net_coll_t kind = XM_NET_ALL_REDUCE;
    double size = es * n; /* the buffer as xm_net_ring takes it */
    cls = XM_INS_ALL_REDUCE;
    if (op->code == XM_OP_ALL_GATHER) {
      kind = XM_NET_ALL_GATHER;
      cls = XM_INS_ALL_GATHER;
    } else if (op->code == XM_OP_REDUCE_SCATTER) {
      kind = XM_NET_REDUCE_SCATTER;
      size = es * exp_numel(c, op->results[0]); /* the slice each member keeps */
      cls = XM_INS_REDUCE_SCATTER;
    } else if (op->code == XM_OP_ZERO_REDUCE_SCATTER) {
      kind = XM_NET_ZERO_REDUCE_SCATTER;
      cls = XM_INS_REDUCE_SCATTER;
    } else if (op->code == XM_OP_ZERO_GATHER) {
      kind = XM_NET_ZERO_ALL_GATHER;
      cls = XM_INS_ALL_GATHER;
    }
    t = xm_net_ring(&ins->net, kind, g, size);
    xm_net_ring_member(&ins->net, kind, g, size, 0, &o->sent_intra, &o->sent_inter);
    b = o->sent_intra + o->sent_inter;
    break;
  }
  case XM_OP_EXCHANGE_COUNTS:
  case XM_OP_ALL_TO_ALL: {
    double same, other, per_peer;
    peers(ins, g, &same, &other);
    if (op->code == XM_OP_EXCHANGE_COUNTS) {
      per_peer = 4.0 * (double)dim(x, 1); /* L counts to every other member */
    } else {
      per_peer = o->payload / P; /* uniform: an even share to every member */
      const char *tr = xm_ir_op_get_string(op, "traffic", "");
      cls = strcmp(tr, xm_inspect_class_name(XM_INS_DISPATCH)) == 0  ? XM_INS_DISPATCH
            : strcmp(tr, xm_inspect_class_name(XM_INS_COMBINE)) == 0 ? XM_INS_COMBINE
                                                                     : XM_INS_OTHER;
    }
    o->sent_intra = per_peer * same;
    o->sent_inter = per_peer * other;
    b = o->sent_intra + o->sent_inter;
    t = xm_net_all_to_all(&ins->net, g, o->sent_intra, o->sent_inter);
    break;
  }
  case XM_OP_RBD_DISPATCH:
  case XM_OP_RBD_COMBINE:
  case XM_OP_RBD_COMBINE_GRAD:
  case XM_OP_RBD_DISPATCH_GRAD: {
    double ri, re, k = 1;
    rbd_rows(c, op, g, &ri, &re, &k);
    /* T tokens and H of this call's token-side tensor */
    const xm_ir_value_t *tok = op->code == XM_OP_RBD_DISPATCH       ? op->operands[0]
                               : op->code == XM_OP_RBD_COMBINE      ? op->results[0]
                               : op->code == XM_OP_RBD_COMBINE_GRAD ? op->operands[0]
                                                                    : op->results[0];
    double T = (double)dim(tok, 0), H = (double)dim(tok, -1);
    double rows = T * (ri + re);
    if (op->code == XM_OP_RBD_DISPATCH) {
      o->sent[XM_INS_DISPATCH] = rows * 4 * (H + 2 * k);
    } else if (op->code == XM_OP_RBD_COMBINE_GRAD) {
      o->sent[XM_INS_DISPATCH] = rows * 4 * H;
      o->sent[XM_INS_COMBINE] = rows * 4 * k;
    } else {
      o->sent[XM_INS_COMBINE] = rows * 4 * H;
    }
    b = o->sent[XM_INS_DISPATCH] + o->sent[XM_INS_COMBINE];
    o->sent_intra = rows > 0 ? b * ri / (ri + re) : 0;
    o->sent_inter = b - o->sent_intra;
    t = xm_net_all_to_all(&ins->net, g, o->sent_intra, o->sent_inter);
    o->seconds = t.seconds;
    return;
  }
  default: break;
  }
  o->sent[cls] = b;
  o->seconds = t.seconds;
}

/* ---- the op records ---------------------------------------------------- */

static xm_ins_phase_t phase_of(const xm_ir_op_t *op) {
  const char *p = xm_ir_op_get_string(op, "phase", "fwd");
  return strcmp(p, "bwd") == 0 ? XM_INS_BWD : strcmp(p, "step") == 0 ? XM_INS_STEP : XM_INS_FWD;
}

/* Ops in the order the generated program runs them. */
static xm_status_t collect_ops(xm_inspect_t *ins) {
  const xm_ir_module_t *m = ins->m;
  int n = xm_ir_module_num_ops(m);
  ins->ops = calloc((size_t)n + 1, sizeof *ins->ops);
  if (!ins->ops) return XM_ERR_NO_MEMORY;
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < n; i++) {
      const xm_ir_op_t *op = xm_ir_module_op(m, i);
      if (xm_ir_op_is_declaration(op) || (phase_of(op) == XM_INS_STEP) != (pass == 1)) continue;
      xm_ins_op_t *o = &ins->ops[ins->num_ops++];
      o->index = i;
      o->op = op;
      o->name = xm_ir_opinfo(op->code)->name;
      o->phase = phase_of(op);
      o->layer = (int)xm_ir_op_get_int(op, "layer", -1);
      o->traced = op->code != XM_OP_INPUT && op->code != XM_OP_RETURN;
      o->comm = (xm_ir_opinfo(op->code)->flags & XM_OPF_COMM) != 0;
      o->last_micro = xm_ir_op_get_bool(op, "last_micro", false);
    }
    if (pass == 0) ins->num_micro = ins->num_ops;
  }
  return XM_OK;
}

/* RBD slot -> its dispatch (the combine and gradients name only the slot). */
static xm_status_t index_slots(ctx_t *c) {
  const xm_ir_module_t *m = c->ins->m;
  int max = -1;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    int64_t s = xm_ir_op_get_int(op, "slot", -1);
    if (op->code == XM_OP_RBD_DISPATCH && s > max && s < (1 << 20)) max = (int)s;
  }
  c->num_slots = max + 1;
  c->slot_dispatch = calloc((size_t)c->num_slots + 1, sizeof *c->slot_dispatch);
  if (!c->slot_dispatch) return XM_ERR_NO_MEMORY;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    int64_t s = xm_ir_op_get_int(op, "slot", -1);
    if (op->code == XM_OP_RBD_DISPATCH && s >= 0 && s < c->num_slots) c->slot_dispatch[s] = op;
  }
  return XM_OK;
}

/* Activation bytes in use after each op: every activation-arena result
 * lives from its op to its last use (a reshape or replicate that the plan
 * put in its operand's place extends the operand instead). */
static xm_status_t timeline(xm_inspect_t *ins) {
  int nv = xm_ir_module_num_values(ins->m), n = ins->num_ops;
  int *root = malloc(((size_t)nv + 1) * sizeof *root);
  int *first = malloc(((size_t)nv + 1) * sizeof *first);
  int *last = malloc(((size_t)nv + 1) * sizeof *last);
  int64_t *bytes = calloc((size_t)nv + 1, sizeof *bytes);
  int64_t *delta = calloc((size_t)n + 2, sizeof *delta);
  xm_status_t st = root && first && last && bytes && delta ? XM_OK : XM_ERR_NO_MEMORY;
  for (int v = 0; st == XM_OK && v < nv; v++)
    root[v] = first[v] = last[v] = -1;
  for (int p = 0; st == XM_OK && p < n; p++) {
    const xm_ir_op_t *op = ins->ops[p].op;
    for (int j = 0; j < op->num_operands; j++) {
      int r = root[op->operands[j]->id];
      if (r >= 0 && p > last[r]) last[r] = p;
    }
    for (int j = 0; j < op->num_results; j++) {
      xm_mem_place_t pl, src;
      const xm_ir_value_t *v = op->results[j];
      if (!xm_plan_memory_place(op, j, &pl) || pl.arena != XM_MEM_ARENA_ACTIVATION) continue;
      const xm_ir_value_t *a = op->num_operands ? op->operands[0] : NULL;
      if ((op->code == XM_OP_RESHAPE || op->code == XM_OP_REPLICATE) && a && root[a->id] >= 0 &&
          xm_plan_memory_place(a->def, a->index, &src) && src.arena == pl.arena &&
          src.offset == pl.offset) {
        int r = root[a->id];
        root[v->id] = r;
        if (pl.bytes > bytes[r]) bytes[r] = pl.bytes;
        continue;
      }
      root[v->id] = v->id;
      first[v->id] = last[v->id] = p;
      bytes[v->id] = pl.bytes;
    }
  }
  for (int v = 0; st == XM_OK && v < nv; v++) {
    if (root[v] != v) continue;
    delta[first[v]] += bytes[v];
    delta[last[v] + 1] -= bytes[v];
  }
  int64_t in_use = 0;
  for (int p = 0; st == XM_OK && p < n; p++) {
    in_use += delta[p];
    /* what is freed after op p is still in use during it */
    ins->ops[p].act_in_use = in_use;
    if (in_use > ins->act_peak) ins->act_peak = in_use, ins->act_peak_at = p;
  }
  free(root), free(first), free(last), free(bytes), free(delta);
  return st;
}

xm_status_t xm_inspect_load(const char *dir, const char *cluster, xm_diag_t *diag,
                            xm_inspect_t *ins) {
  memset(ins, 0, sizeof *ins);
  struct stat sb;
  if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
    xm_diag_add(diag, XM_DIAG_ERROR, dir, NULL,
                "%s (expected the output folder of `xmoec compile`)",
                stat(dir, &sb) != 0 ? strerror(errno) : "not a directory");
    return XM_ERR_IO;
  }
  ins->dir = strdup(dir);
  if (!ins->dir) return XM_ERR_NO_MEMORY;
  XM_RETURN_IF_ERROR(load_module(ins, diag));
  xm_status_t st;
  cJSON *manifest = read_json_object(dir, "manifest.json", diag, &st);
  if (!manifest) return st;
  cJSON *config = read_json_object(dir, "config.json", diag, &st);
  if (st != XM_OK) {
    cJSON_Delete(manifest);
    return st;
  }
  const cJSON *pipe = cJSON_GetObjectItem(manifest, "pipeline");
  if (cJSON_IsString(pipe)) snprintf(ins->pipeline, sizeof ins->pipeline, "%s", pipe->valuestring);
  const xm_ir_module_t *m = ins->m;
  snprintf(ins->model, sizeof ins->model, "%s", xm_ir_module_name(m));
  ins->layout = (xm_layout_t){.dp = xm_ir_module_get_int(m, "par_dp", 1),
                              .tp = xm_ir_module_get_int(m, "par_tp", 1),
                              .ep = xm_ir_module_get_int(m, "par_ep", 1),
                              .ssmb = xm_ir_module_get_int(m, "par_ssmb", 0) != 0,
                              .rbd = xm_ir_module_get_int(m, "par_rbd", 0) != 0,
                              .zero = (int)xm_ir_module_get_int(m, "par_zero", 0)};
  ins->grad_accum = xm_ir_module_get_int(m, "grad_accum", 1);
  st = xm_inspect_check(ins, manifest, config, diag);
  cJSON_Delete(config);
  if (st != XM_OK) {
    cJSON_Delete(manifest);
    return st;
  }
  ins->world = ins->layout.dp * ins->layout.tp;
  ins->grad_accum = xm_ir_module_get_int(m, "grad_accum", 1);
  ins->micro_batch = xm_ir_module_get_int(m, "micro_batch", 0);
  ins->seq_len = xm_ir_module_get_int(m, "seq_len", 0);
  st = setup_machine(ins, manifest, cluster, diag);
  cJSON_Delete(manifest);
  XM_RETURN_IF_ERROR(st);
  XM_RETURN_IF_ERROR(collect_ops(ins));

  ctx_t c = {.ins = ins};
  c.rows = calloc((size_t)xm_ir_module_num_values(m) + 1, sizeof *c.rows);
  st = c.rows ? index_slots(&c) : XM_ERR_NO_MEMORY;
  if (st == XM_OK) {
    expected_rows(&c);
    for (int i = 0; i < ins->num_ops; i++) {
      xm_ins_op_t *o = &ins->ops[i];
      compute_cost(&c, o);
      if (o->comm) {
        comm_cost(&c, o);
      } else if (o->traced) {
        o->seconds =
            fmax(o->flops / (ins->peak_flops * ins->efficiency), o->mem_bytes / ins->mem_bw);
      }
    }
    st = timeline(ins);
  }
  free(c.rows);
  free(c.slot_dispatch);
  return st;
}

void xm_inspect_free(xm_inspect_t *ins) {
  free(ins->dir);
  free(ins->ops);
  xm_ir_module_destroy(ins->m);
  memset(ins, 0, sizeof *ins);
}
