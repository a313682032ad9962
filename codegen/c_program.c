/* codegen/c_program.c — a scheduled, memory-planned module as C source:
 * out/program.c (the xm_rt_program_t of runtime/abi/program.h) and out/main.c.
 *
 * The generated program is deliberately dumb: a static tensor table, then
 * two functions of straight-line kernel calls (runtime/cpu/kernels.h), one per
 * op in module order, each preceded by a comment naming the op, its
 * location and layer, so a crash in a kernel points back at the spec field
 * that shaped it. Every pointer is an arena base plus the constant offset
 * the plan-memory pass chose (passes/plan_memory.h); every size is a
 * literal, except the routed row counts, which only exist at run time: the
 * permute kernel returns n, the generated code keeps it in a local
 * `int64_t n_<id>` (id of the indices value) and hands it to the kernels of
 * the same routed rows. Elementwise kernels over routed buffers use n times
 * the row width, so no kernel touches rows past n. Right after a permute
 * the program checks n against the bound the memory plan reserved and
 * stops through xm_rt_fail when it is exceeded; with dropless routing the
 * bound T*k is exact and the check can only fire on a kernel bug.
 *
 * Gradient accumulation: when a weight gradient (matmul_dw,
 * grouped_matmul_dw) has one use, the accumulate into its grad state, the
 * GEMM adds into the state itself (xm_k_*_dw_acc, beta = 1) and the
 * accumulate emits only a comment: one pass over the gradient instead of
 * three (write dw, read dw, read-modify-write the state). Nothing in the
 * micro-batch function reads a grad state, so adding early is safe.
 *
 * Multi-rank programs. Collectives and the data movement around them call
 * runtime/comm/spmd.h with the group of the op's attr group as an XM_RT_GROUP_*
 * constant and its attr layer (-1 when absent): all_reduce, all_gather and
 * narrow (dim 0 only), exchange_counts, all_to_all, reduce_state (f32 or
 * i32 in place), zero_reduce_scatter, zero_gather; replicate is a copy, or
 * nothing when the plan gave it its operand's place; sort_chunks and
 * unsort_chunks are kernels; the four rbd_* ops call runtime/moe/rbd_exec.h
 * with their attr slot. An all_to_all or rbd_dispatch returns the rows it
 * received into `int64_t n_<id>` (id of its first result), which becomes
 * the routed row count of everything computed from those rows, exactly
 * like a permute's.
 * Gradient clipping: grad_norm_sq only stores its f32 sum of squares (a
 * multi-rank step all-reduces and adds partial sums in the graph); each
 * adamw sets x->grad_norm and x->grad_scale from the norm_sq it consumes
 * before its update; a run of consecutive adamw ops on the same norm is one
 * adamw_multi call over a table of their tensors (emit_adamw). An adamw with
 * attrs group/group_size is ZeRO-1: grad, m and v are this member's chunk of
 * c = ceil(n/P) elements and only that range of the param (pointer offset
 * index*c, length clipped to n) is updated. The tensor table carries each
 * tensor's split (a param's attrs split_group/split_dim, inherited by its
 * grad and unchunked moments) and a
 * ZeRO-1 state's chunk_group; the program object carries the layout from
 * the module attrs par_dp, par_tp, par_ep, par_ssmb, par_rbd, par_zero,
 * par_rpn (defaults 1, 1, 1, 0, 0, 0, 0).
 *
 * Which function an op lands in comes from its attr phase (set by the
 * autodiff pass; absent counts as "fwd"): fwd and bwd ops run in micro, step
 * ops in step. Params and states are declarations (they live in the
 * persistent arena and emit nothing); reshape emits nothing because its
 * result aliases its operand (a copy is emitted if a plan ever gives it its
 * own buffer); return emits nothing because the loss values stay where the
 * plan put them and the table's loss/ce_loss entries point there.
 *
 * Trace hooks (runtime/driver/trace.h): the comment line of every op that runs
 * code (all but input and return) ends with XM_TRACE_OP(x, index, "name",
 * layer, phase flags), and each function ends with XM_TRACE_DONE(x). The
 * index is the op's position in the module (OUT/model.xir), the key by
 * which `out/train --trace` events meet `xmoec inspect --format trace`
 * predictions. A hook is one branch on x->trace when tracing is off; being
 * on the comment line, it leaves the line structure of the code as is.
 *
 * Output is deterministic: offsets, sizes and names come from the module,
 * numbers are printed with the shortest round-trip form, nothing depends
 * on addresses or time.
 */
#include "codegen/c_program.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/emit.h"
#include "passes/plan_memory.h"
#include "runtime/abi/groups.h"
#include "runtime/abi/kernels.h"
#include "runtime/abi/program.h"

#define RING 64

typedef struct {
  const xm_ir_module_t *m;
  const xm_spec_t *spec;
  xm_diag_t *diag;
  xm_emitter_t e;
  xm_status_t st; /* first error; emission goes on to report more */
  int *rows_src;  /* value id -> rows_id of the source of its run-time rows, or -1 */
  int *acc_of;    /* value id -> the accumulate op (index) fused into its GEMM, or -1 */
  int *host_of;   /* value id -> the host_read op (index) that reads it, or -1 */
  int op_index;   /* op being emitted, for messages */
  /* overlap-moe-comm: the exchange queued on the MoE lane whose results the
   * compute stream has not waited for yet (NULL: none), its index, and
   * whether the fork of the ops beside the next exchange was emitted. */
  const xm_ir_op_t *pending;
  int pending_index;
  bool forked;
  char ring[RING][128];
  int ring_next;
  /* GPU targets: the kernel specialisations the calls launch (NULL on the
   * CPU target, whose calls are xm_k_* functions). */
  struct gpu_specs *gpu;
} gen_t;

/* ---- small helpers ----------------------------------------------------- */

static char *ring_buf(gen_t *g) {
  char *b = g->ring[g->ring_next];
  g->ring_next = (g->ring_next + 1) % RING;
  return b;
}

static void gen_error(gen_t *g, const xm_ir_op_t *op, xm_status_t st, const char *fmt,
                      const char *detail) {
  char place[48];
  snprintf(place, sizeof place, "op %d", g->op_index);
  xm_diag_add(g->diag, XM_DIAG_ERROR, op && op->loc[0] ? op->loc : NULL, place, fmt,
              op ? xm_ir_opinfo(op->code)->name : "program", detail ? detail : "");
  /* An op the schedule cannot run is the root cause of what follows. */
  if (g->st == XM_OK || st == XM_ERR_UNSUPPORTED) g->st = st;
}

static const char *phase_of(const xm_ir_op_t *op) {
  return xm_ir_op_get_string(op, "phase", "fwd");
}

/* The ABI's element types (runtime/abi/dtypes.def), found by the IR's name
 * of the dtype; a value of a dtype the ABI lacks is an error. */
typedef struct {
  const char *name, *constant, *ctype;
  int bytes;
} abi_dtype_t;

static const abi_dtype_t k_abi_dtypes[] = {
#define XM_DTYPE(e, name, bytes, ctype) {name, "XM_RT_" #e, #ctype, bytes},
#include "runtime/abi/dtypes.def"
#undef XM_DTYPE
};

_Static_assert(XM_IR_MAX_RANK == XM_RT_MAX_RANK, "IR and ABI ranks differ");

static const abi_dtype_t *abi_dtype(gen_t *g, const xm_ir_op_t *op, xm_dtype_t dt) {
  for (size_t i = 0; i < sizeof k_abi_dtypes / sizeof k_abi_dtypes[0]; i++)
    if (strcmp(k_abi_dtypes[i].name, xm_dtype_name(dt)) == 0 &&
        (size_t)k_abi_dtypes[i].bytes == xm_dtype_size(dt))
      return &k_abi_dtypes[i];
  gen_error(g, op, XM_ERR_UNSUPPORTED, "%s: dtype %s has no place in the runtime ABI",
            xm_dtype_name(dt));
  return &k_abi_dtypes[0];
}

/* The C expression of a value's buffer: "(float *)(x->act + 4096)". */
static const char *ptr(gen_t *g, const xm_ir_value_t *v) {
  xm_mem_place_t p;
  char *b = ring_buf(g);
  if (!xm_plan_memory_place(v->def, v->index, &p)) {
    gen_error(g, v->def, XM_ERR_INTERNAL, "%s result has no memory place (run plan-memory)%s",
              NULL);
    snprintf(b, 128, "NULL");
    return b;
  }
  const char *type = abi_dtype(g, v->def, v->type.dtype)->ctype;
  const char *arena = p.arena == XM_MEM_ARENA_PERSISTENT ? "persist" : "act";
  snprintf(b, 128, "(%s *)(x->%s + %" PRId64 ")", type, arena, p.offset);
  return b;
}

static int64_t dim(const xm_ir_value_t *v, int i) {
  return i < 0 ? v->type.dims[v->type.rank + i] : v->type.dims[i];
}

static int64_t numel(const xm_ir_value_t *v) { return xm_ir_type_numel(&v->type); }

/* Elements of v divided by `inner` (a product of trailing dims): a literal,
 * or "n_<id> * c" when dim 0 is routed rows known only at run time. */
static const char *count_div(gen_t *g, const xm_ir_value_t *v, int64_t inner) {
  char *b = ring_buf(g);
  int src = g->rows_src[v->id];
  int64_t total = numel(v);
  if (inner <= 0) inner = 1;
  if (src >= 0 && v->type.rank > 0 && v->type.dynamic[0]) {
    int64_t per_row = total / v->type.dims[0];
    if (per_row % inner == 0) {
      int64_t c = per_row / inner;
      if (c == 1)
        snprintf(b, 128, "n_%d", src);
      else
        snprintf(b, 128, "n_%d * %" PRId64, src, c);
      return b;
    }
  }
  snprintf(b, 128, "%" PRId64, total / inner);
  return b;
}

static const char *count(gen_t *g, const xm_ir_value_t *v) { return count_div(g, v, 1); }

/* The run-time row count of the routed buffers indexed by `indices`. */
static const char *routed_n(gen_t *g, const xm_ir_op_t *op, const xm_ir_value_t *indices) {
  int src = g->rows_src[indices->id];
  char *b = ring_buf(g);
  if (src < 0) {
    gen_error(g, op, XM_ERR_INTERNAL, "%s: its indices operand does not come from a permute%s",
              NULL);
    snprintf(b, 128, "0");
  } else {
    snprintf(b, 128, "n_%d", src);
  }
  return b;
}

/* Shortest round-trip form of a double, as a C literal. */
static const char *num(gen_t *g, const xm_ir_op_t *op, double v) {
  char *b = ring_buf(g);
  if (!isfinite(v)) {
    gen_error(g, op, XM_ERR_INTERNAL, "%s has a non-finite attribute%s", NULL);
    snprintf(b, 128, "0.0");
    return b;
  }
  xm_strbuf_t s;
  xm_strbuf_init(&s);
  xm_strbuf_put_double(&s, v);
  snprintf(b, 128, "%s", xm_strbuf_cstr(&s));
  xm_strbuf_free(&s);
  return b;
}

static const char *fattr(gen_t *g, const xm_ir_op_t *op, const char *key) {
  const xm_ir_attr_t *a = xm_ir_op_attr(op, key);
  if (!a || (a->kind != XM_ATTR_FLOAT && a->kind != XM_ATTR_INT)) {
    gen_error(g, op, XM_ERR_INTERNAL, "%s lacks the numeric attribute %s", key);
    return "0.0";
  }
  return num(g, op, a->kind == XM_ATTR_FLOAT ? a->f : (double)a->i);
}

static int64_t iattr(gen_t *g, const xm_ir_op_t *op, const char *key) {
  const xm_ir_attr_t *a = xm_ir_op_attr(op, key);
  if (!a || (a->kind != XM_ATTR_INT && a->kind != XM_ATTR_BOOL)) {
    gen_error(g, op, XM_ERR_INTERNAL, "%s lacks the integer attribute %s", key);
    return 0;
  }
  return a->i;
}

static const char *scoring(const xm_ir_op_t *op) {
  return strcmp(xm_ir_op_get_string(op, "scoring", "softmax"), "sigmoid") == 0 ? "XM_K_SIGMOID"
                                                                               : "XM_K_SOFTMAX";
}

#define A(i) ptr(g, op->operands[i])
#define R(i) ptr(g, op->results[i])
#define IN(i) (op->operands[i])
#define OUT(i) (op->results[i])
#define EMIT(...) xm_emit(&g->e, __VA_ARGS__)
#define I64 "%" PRId64

/* ---- kernel calls, printed from the signature table ---------------------
 * Every kernel call of the schedule goes through emit_call: the kernel's
 * line of runtime/abi/kernels.def (runtime/abi/kernels.h) gives its name
 * and arguments, the call must pass exactly those, and every buffer
 * argument that is an IR value must have the line's dtype, so a call that
 * does not match the ABI is a codegen error, not a C compiler warning in
 * out/train (and a GPU target prints its launches from the same lines). */

typedef struct {
  const char *text;       /* the C expression passed */
  const xm_ir_value_t *v; /* the IR value a buffer argument holds, or NULL */
} karg_t;

typedef enum { KA_IN, KA_OUT, KA_I64, KA_F32, KA_INT, KA_HOST } karg_kind_t;

/* Argument i of a signature: its kind and, for buffers, its dtype text
 * (for a host table, its type: "adamw_tensor" for xm_rt_adamw_tensor_t). */
typedef struct {
  karg_kind_t kind;
  char dtype[24];
  char name[24];
} ksig_arg_t;

/* Parses "(XM_IN(f32, x), XM_I64(n), ...)" into at most `cap` args;
 * returns the count, or -1 when the text is not of that form. */
static int parse_signature(const char *args, ksig_arg_t *out, int cap) {
  int n = 0;
  const char *p = args;
  while ((p = strstr(p, "XM_")) != NULL) {
    if (n == cap) return -1;
    ksig_arg_t a = {KA_INT, "", ""};
    const char *open = strchr(p, '('), *close = open ? strchr(open, ')') : NULL;
    if (!close) return -1;
    /* the name: after the comma for buffers, else the whole parenthesis */
    const char *nm = open + 1;
    if (strncmp(p, "XM_IN(", 6) == 0 || strncmp(p, "XM_OUT(", 7) == 0 ||
        strncmp(p, "XM_HOST(", 8) == 0) {
      a.kind = p[3] == 'H' ? KA_HOST : p[3] == 'I' ? KA_IN : KA_OUT;
      const char *d = open + 1, *e = strchr(d, ',');
      if (!e || e > close || e - d >= (long)sizeof a.dtype) return -1;
      memcpy(a.dtype, d, (size_t)(e - d));
      nm = e + 1;
    } else if (strncmp(p, "XM_I64(", 7) == 0) {
      a.kind = KA_I64;
    } else if (strncmp(p, "XM_F32(", 7) == 0) {
      a.kind = KA_F32;
    } else if (strncmp(p, "XM_INT(", 7) != 0) {
      return -1;
    }
    while (*nm == ' ') nm++;
    if (close - nm <= 0 || close - nm >= (long)sizeof a.name) return -1;
    memcpy(a.name, nm, (size_t)(close - nm));
    out[n++] = a;
    p = strchr(p, ')');
    if (!p) return -1;
  }
  return n;
}

/* ---- GPU targets: kernel specialisations -------------------------------
 * On a GPU target every call of the schedule launches a specialisation of
 * the kernel's template (runtime/gpu/kernels): a size argument whose text
 * is an integer literal (a size the compiler knows) becomes a constant of
 * its shape type, the others stay run-time values. Calls with the same
 * kernel and the same constants share one specialisation, xmg_<id>, which
 * out/kernels.hip defines and out/kernels.h declares. */
#define GPU_MAX_ARGS 32
typedef struct {
  int kernel;                /* index in xm_rt_kernel_signatures */
  int64_t val[GPU_MAX_ARGS]; /* per argument: the constant size, or -1 */
  int first_op;              /* the op that first launched it, for the comment */
} gpu_spec_t;

struct gpu_specs {
  gpu_spec_t *v;
  int n, cap;
};

static bool int_literal(const char *t, int64_t *v) {
  char *end;
  errno = 0;
  long long x = strtoll(t, &end, 10);
  if (errno || end == t || *end || x < 0) return false;
  *v = x;
  return true;
}

static int gpu_spec(gen_t *g, const xm_ir_op_t *op, int kernel, const ksig_arg_t *want,
                    const karg_t *a, int n) {
  int64_t val[GPU_MAX_ARGS];
  for (int i = 0; i < GPU_MAX_ARGS; i++)
    if (i >= n || want[i].kind != KA_I64 || !int_literal(a[i].text, &val[i])) val[i] = -1;
  struct gpu_specs *s = g->gpu;
  for (int i = 0; i < s->n; i++)
    if (s->v[i].kernel == kernel && memcmp(s->v[i].val, val, sizeof val) == 0) return i;
  if (s->n == s->cap) {
    int cap = s->cap ? 2 * s->cap : 64;
    gpu_spec_t *v = realloc(s->v, sizeof *v * (size_t)cap);
    if (!v) {
      gen_error(g, op, XM_ERR_NO_MEMORY, "%s: out of memory%s", "");
      return 0;
    }
    s->v = v;
    s->cap = cap;
  }
  gpu_spec_t *sp = &s->v[s->n];
  sp->kernel = kernel;
  memcpy(sp->val, val, sizeof val);
  sp->first_op = g->op_index;
  return s->n++;
}

/* The C type of argument `a` of a signature. */
static void c_type(const ksig_arg_t *a, char *buf, size_t cap) {
  static const struct { const char *dt, *ctype; } k[] = {
      {"f32", "float"}, {"bf16", "xm_bf16_t"}, {"i32", "int32_t"}, {"f64", "double"}};
  switch (a->kind) {
  case KA_I64: snprintf(buf, cap, "int64_t"); return;
  case KA_F32: snprintf(buf, cap, "float"); return;
  case KA_INT: snprintf(buf, cap, "int"); return;
  case KA_HOST: snprintf(buf, cap, "const xm_rt_%s_t *", a->dtype); return;
  default: break;
  }
  const char *ct = "void";
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
    if (strcmp(k[i].dt, a->dtype) == 0) ct = k[i].ctype;
  snprintf(buf, cap, "%s%s *", a->kind == KA_IN ? "const " : "", ct);
}

/* "xm_rt_stream_t *s, const float *x, int64_t M, ..." of a specialisation. */
static void gpu_params(xm_strbuf_t *b, const ksig_arg_t *want, int m) {
  xm_strbuf_puts(b, "xm_rt_stream_t *s");
  for (int i = 0; i < m; i++) {
    char t[48];
    c_type(&want[i], t, sizeof t);
    size_t tl = strlen(t);
    xm_strbuf_printf(b, ", %s%s%s", t, tl && t[tl - 1] == '*' ? "" : " ", want[i].name);
  }
}

/* out/kernels.h and out/kernels.hip of the specialisations of a module. */
static void emit_gpu_files(gen_t *g, const xm_codegen_inputs_t *in, const char *target,
                           xm_strbuf_t *kh, xm_strbuf_t *ksrc);

/* Emits `<prefix>xm_k_<name>(args);` after checking it against the table. */
static void emit_call(gen_t *g, const xm_ir_op_t *op, const char *prefix, const char *name,
                      const karg_t *a, int n) {
  const xm_rt_kernel_signature_t *sig = NULL;
  for (int k = 0; k < XM_RT_KERNEL_COUNT_ && !sig; k++)
    if (strcmp(xm_rt_kernel_signatures[k].name, name) == 0) sig = &xm_rt_kernel_signatures[k];
  ksig_arg_t want[32];
  int m = sig ? parse_signature(sig->args, want, 32) : -1;
  if (!sig || m < 0) {
    gen_error(g, op, XM_ERR_INTERNAL, "%s: no kernel xm_k_%s in runtime/abi/kernels.def", name);
    return;
  }
  char detail[160];
  if (m != n) {
    snprintf(detail, sizeof detail, "xm_k_%s takes %d arguments (kernels.def), not %d", name, m, n);
    gen_error(g, op, XM_ERR_INTERNAL, "%s: %s", detail);
    return;
  }
  xm_strbuf_t c;
  xm_strbuf_init(&c);
  if (g->gpu)
    xm_strbuf_printf(&c, "%sxmg_%d(x->stream%s", prefix,
                     gpu_spec(g, op, (int)(sig - xm_rt_kernel_signatures), want, a, n),
                     n ? ", " : "");
  else
    xm_strbuf_printf(&c, "%sxm_k_%s(", prefix, name);
  for (int i = 0; i < n; i++) {
    bool buffer = want[i].kind == KA_IN || want[i].kind == KA_OUT;
    if (a[i].v && (!buffer || strcmp(xm_dtype_name(a[i].v->type.dtype), want[i].dtype) != 0)) {
      snprintf(detail, sizeof detail, "argument %d of xm_k_%s is a %s value, not %s", i, name,
               xm_dtype_name(a[i].v->type.dtype), buffer ? want[i].dtype : "a scalar");
      gen_error(g, op, XM_ERR_INTERNAL, "%s: %s", detail);
    }
    xm_strbuf_printf(&c, "%s%s", i ? ", " : "", a[i].text);
  }
  xm_strbuf_puts(&c, ");");
  EMIT("%s", xm_strbuf_cstr(&c));
  xm_strbuf_free(&c);
}

static const char *i64_text(gen_t *g, int64_t v) {
  char *b = ring_buf(g);
  snprintf(b, 128, "%" PRId64, v);
  return b;
}

#define KARGS(...)                                                                                 \
  (const karg_t[]){__VA_ARGS__}, (int)(sizeof(KARGS_(__VA_ARGS__)) / sizeof(karg_t))
#define KARGS_(...)                                                                                \
  (const karg_t[]) { __VA_ARGS__ }
#define CALL(name, ...) emit_call(g, op, "", name, KARGS(__VA_ARGS__))
#define CALL_DISCARD(name, ...) emit_call(g, op, "(void)", name, KARGS(__VA_ARGS__))
#define CALL_INTO(prefix, name, ...) emit_call(g, op, prefix, name, KARGS(__VA_ARGS__))
#define KV(val) ((karg_t){ptr(g, (val)), (val)})
#define KS(txt) ((karg_t){(txt), NULL})
#define KI(n) ((karg_t){i64_text(g, (n)), NULL})
/* A weight gradient's destination: its grad state when the accumulate is
 * folded into the GEMM, else its own buffer. */
#define KD(dw) ((karg_t){dw_dest(g, (dw)), dw_dest_value(g, (dw))})
/* A fused MoE kernel: its _bf16 variant, with the op's workspace as the
 * last argument, when mixed-precision gave the op bf16 operands. */
#define FUSED_CALL(name, ...)                                                                      \
  do {                                                                                             \
    if (bf16_gemm(op))                                                                             \
      CALL(name "_bf16", __VA_ARGS__, KS(workspace(g, op)));                                      \
    else                                                                                           \
      CALL(name, __VA_ARGS__);                                                                     \
  } while (0)
/* The scratch result r of a fused MoE op and its tiling. */
#define KTILE(r)                                                                                   \
  KV(OUT(r)), KI(xm_ir_op_get_int(op, "tile_rows", 1)), KI(xm_ir_op_get_int(op, "slots", 1))

/* A weight gradient's destination: its grad state when fold-accumulate
 * folded the accumulate into the GEMM, else its own buffer. */
static const char *dw_dest(gen_t *g, const xm_ir_value_t *dw) {
  int acc = g->acc_of[dw->id];
  if (acc < 0) return ptr(g, dw);
  return ptr(g, xm_ir_module_op(g->m, acc)->operands[0]);
}

static const xm_ir_value_t *dw_dest_value(gen_t *g, const xm_ir_value_t *dw) {
  int acc = g->acc_of[dw->id];
  return acc < 0 ? dw : xm_ir_module_op(g->m, acc)->operands[0];
}

/* beta of a fused weight-gradient kernel: 1 adds into the grad state. */
static const char *dw_beta(gen_t *g, const xm_ir_value_t *dw) {
  return g->acc_of[dw->id] >= 0 ? "1.0f" : "0.0f";
}

/* A GEMM the mixed-precision pass gave bf16 operands (operand j: its
 * first multiplied one). */
static bool bf16_gemm_at(const xm_ir_op_t *op, int j) { return IN(j)->type.dtype == XM_DT_BF16; }
static bool bf16_gemm(const xm_ir_op_t *op) { return bf16_gemm_at(op, 0); }

/* The workspace the memory plan gave the op (attr "ws"). */
static const char *workspace(gen_t *g, const xm_ir_op_t *op) {
  xm_mem_place_t p;
  char *b = ring_buf(g);
  if (!xm_plan_memory_workspace(op, &p)) {
    gen_error(g, op, XM_ERR_INTERNAL, "%s needs a workspace but has none (run plan-memory)%s",
              NULL);
    snprintf(b, 128, "NULL");
    return b;
  }
  snprintf(b, 128, "(float *)(x->act + %" PRId64 ")", p.offset);
  return b;
}

/* ---- ops --------------------------------------------------------------- */

/* rope / rope_grad: the rotated span and the YaRN schedule from the op's
 * attrs (ir/ops.def; the defaults are plain RoPE over the whole row). */
static void emit_rope(gen_t *g, const xm_ir_op_t *op, const char *kernel) {
  int64_t D = dim(IN(0), 3), off, rd;
  xm_ir_rope_span(op, D, &off, &rd);
  CALL(kernel, KV(IN(0)), KV(OUT(0)), KI(dim(IN(0), 0)), KI(dim(IN(0), 1)), KI(dim(IN(0), 2)),
       KI(D), KI(off), KI(rd), KS(fattr(g, op, "theta")),
       KS(num(g, op, xm_ir_op_get_float(op, "yarn_factor", 1.0))),
       KS(num(g, op, xm_ir_op_get_float(op, "yarn_low", 0.0))),
       KS(num(g, op, xm_ir_op_get_float(op, "yarn_high", 0.0))),
       KS(num(g, op, xm_ir_op_get_float(op, "mscale", 1.0))),
       KS(xm_ir_op_get_bool(op, "interleave", false) ? "1" : "0"), KS(workspace(g, op)));
}

/* b is a verified broadcast operand of a that gives one value per row of a
 * (mul's and reduce_to's per-row form, ir/ops.def): a's shape with the
 * last dim 1 where a's is not. A trailing suffix of a never looks so. */
static bool per_row(const xm_ir_value_t *a, const xm_ir_value_t *b) {
  return a->type.rank > 0 && b->type.rank == a->type.rank && dim(b, -1) == 1 && dim(a, -1) != 1;
}

/* Elementwise, shape and dense transformer ops; false when not one. */
static bool emit_dense(gen_t *g, const xm_ir_op_t *op) {
  switch (op->code) {
  case XM_OP_ADD:
  case XM_OP_MUL:
    if (per_row(IN(0), IN(1))) { /* a[..., H] * b[..., 1]: the shared-expert gate */
      CALL("mul_rows", KV(IN(0)), KV(IN(1)), KV(OUT(0)), KS(count_div(g, IN(0), dim(IN(0), -1))),
           KI(dim(IN(0), -1)));
      break;
    }
    CALL(op->code == XM_OP_ADD ? "add" : "mul", KV(IN(0)), KV(IN(1)), KV(OUT(0)),
         KS(count(g, IN(0))), KS(count(g, IN(1))));
    break;
  case XM_OP_SCALE:
    CALL("scale", KV(IN(0)), KV(OUT(0)), KS(count(g, IN(0))), KS(fattr(g, op, "factor")));
    break;
  case XM_OP_SILU:
  case XM_OP_GELU:
  case XM_OP_SIGMOID:
    CALL(xm_ir_opinfo(op->code)->name, KV(IN(0)), KV(OUT(0)), KS(count(g, IN(0))));
    break;
  case XM_OP_SWIGLU: CALL("swiglu", KV(IN(0)), KV(IN(1)), KV(OUT(0)), KS(count(g, IN(0)))); break;
  case XM_OP_EMBEDDING:
    CALL("embedding", KV(IN(0)), KV(IN(1)), KV(OUT(0)), KI(numel(IN(0))), KI(dim(IN(1), -1)));
    break;
  case XM_OP_RMSNORM:
    CALL("rmsnorm", KV(IN(0)), KV(IN(1)), KV(OUT(0)), KS(count_div(g, IN(0), dim(IN(0), -1))),
         KI(dim(IN(0), -1)), KS(fattr(g, op, "eps")));
    break;
  case XM_OP_MATMUL:
    if (bf16_gemm(op))
      CALL("matmul_bf16", KV(IN(0)), KV(IN(1)), KV(OUT(0)), KS(count_div(g, IN(0), dim(IN(0), -1))),
           KI(dim(IN(0), -1)), KI(dim(IN(1), 0)), KS(workspace(g, op)));
    else
      CALL("matmul", KV(IN(0)), KV(IN(1)), KV(OUT(0)), KS(count_div(g, IN(0), dim(IN(0), -1))),
           KI(dim(IN(0), -1)), KI(dim(IN(1), 0)));
    break;
  case XM_OP_CAST:
    CALL(IN(0)->type.dtype == XM_DT_F32 ? "cast_f32_bf16" : "cast_bf16_f32", KV(IN(0)), KV(OUT(0)),
         KS(count(g, IN(0))));
    break;
  case XM_OP_ROPE: emit_rope(g, op, "rope"); break;
  case XM_OP_SPLIT: /* x[R,H,Da+Db] -> a[R,H,Da], b[R,Hb,Db] */
    if (IN(0)->type.dtype == XM_DT_I32) { /* rows cut, never summed (ir/verify.c) */
      CALL("split_i32", KV(IN(0)), KV(OUT(0)), KV(OUT(1)),
           KS(count_div(g, IN(0), dim(IN(0), -1))), KI(dim(OUT(0), -1)), KI(dim(OUT(1), -1)));
      break;
    }
    CALL("split", KV(IN(0)), KV(OUT(0)), KV(OUT(1)),
         KS(count_div(g, IN(0), dim(IN(0), -1) * dim(IN(0), -2))), KI(dim(IN(0), -2)),
         KI(dim(OUT(1), -2)), KI(dim(OUT(0), -1)), KI(dim(OUT(1), -1)));
    break;
  case XM_OP_CONCAT: /* a[R,H,Da], b[R,Hb,Db] -> y[R,H,Da+Db] */
    CALL("concat", KV(IN(0)), KV(IN(1)), KV(OUT(0)),
         KS(count_div(g, IN(0), dim(IN(0), -1) * dim(IN(0), -2))), KI(dim(IN(0), -2)),
         KI(dim(IN(1), -2)), KI(dim(IN(0), -1)), KI(dim(IN(1), -1)));
    break;
  case XM_OP_ATTENTION:
    CALL("attention", KV(IN(0)), KV(IN(1)), KV(IN(2)), KV(OUT(0)), KI(dim(IN(0), 0)),
         KI(dim(IN(0), 1)), KI(dim(IN(0), 2)), KI(dim(IN(1), 2)), KI(dim(IN(0), 3)),
         KI(dim(IN(2), 3)), KS(fattr(g, op, "scale")), KS(workspace(g, op)));
    break;
  case XM_OP_CROSS_ENTROPY:
    CALL("cross_entropy", KV(IN(0)), KV(IN(1)), KV(OUT(0)), KI(numel(IN(0)) / dim(IN(0), -1)),
         KI(dim(IN(0), -1)));
    break;
  case XM_OP_LM_HEAD_CE: /* x[...,H], w[V,H], labels -> loss, stats, scratch */
    FUSED_CALL("lm_head_ce", KV(IN(0)), KV(IN(1)), KV(IN(2)), KV(OUT(0)), KV(OUT(1)),
               KI(numel(IN(2))), KI(dim(IN(1), 1)), KI(dim(IN(1), 0)), KI(iattr(g, op, "chunk")),
               KV(OUT(2)));
    break;
  default: return false;
  }
  return true;
}

/* Backward kernels of the dense ops; false when not one. */
static bool emit_dense_grad(gen_t *g, const xm_ir_op_t *op) {
  switch (op->code) {
  case XM_OP_MATMUL_DX: /* dy[M,N], w[N,K] -> dx[M,K] */
    if (bf16_gemm(op))
      CALL("matmul_dx_bf16", KV(IN(0)), KV(IN(1)), KV(OUT(0)),
           KS(count_div(g, IN(0), dim(IN(0), -1))), KI(dim(IN(1), 1)), KI(dim(IN(1), 0)),
           KS(workspace(g, op)));
    else
      CALL("matmul_dx", KV(IN(0)), KV(IN(1)), KV(OUT(0)), KS(count_div(g, IN(0), dim(IN(0), -1))),
           KI(dim(IN(1), 1)), KI(dim(IN(1), 0)));
    break;
  case XM_OP_MATMUL_DW: /* dy[M,N], x[M,K] -> dw[N,K] */
    if (bf16_gemm(op)) {
      CALL("matmul_dw_bf16", KV(IN(0)), KV(IN(1)), KD(OUT(0)),
           KS(count_div(g, IN(0), dim(IN(0), -1))), KI(dim(IN(1), -1)), KI(dim(IN(0), -1)),
           KS(dw_beta(g, OUT(0))), KS(workspace(g, op)));
      break;
    }
    CALL(g->acc_of[OUT(0)->id] >= 0 ? "matmul_dw_acc" : "matmul_dw", KV(IN(0)), KV(IN(1)),
         KD(OUT(0)), KS(count_div(g, IN(0), dim(IN(0), -1))), KI(dim(IN(1), -1)),
         KI(dim(IN(0), -1)));
    break;
  case XM_OP_REDUCE_TO:
    if (per_row(IN(0), OUT(0))) { /* x[..., H] -> [..., 1]: the gradient of mul_rows' factor */
      CALL("reduce_rows", KV(IN(0)), KV(OUT(0)), KS(count_div(g, IN(0), dim(IN(0), -1))),
           KI(dim(IN(0), -1)));
      break;
    }
    CALL("reduce_to", KV(IN(0)), KV(OUT(0)), KS(count(g, IN(0))), KS(count(g, OUT(0))));
    break;
  case XM_OP_RMSNORM_GRAD:
    CALL("rmsnorm_grad", KV(IN(0)), KV(IN(1)), KV(IN(2)), KV(OUT(0)), KV(OUT(1)),
         KS(count_div(g, IN(1), dim(IN(1), -1))), KI(dim(IN(1), -1)), KS(fattr(g, op, "eps")),
         KS(workspace(g, op)));
    break;
  case XM_OP_ROPE_GRAD: emit_rope(g, op, "rope_grad"); break;
  case XM_OP_ATTENTION_GRAD:
    CALL("attention_grad", KV(IN(0)), KV(IN(1)), KV(IN(2)), KV(IN(3)), KV(OUT(0)), KV(OUT(1)),
         KV(OUT(2)), KI(dim(IN(1), 0)), KI(dim(IN(1), 1)), KI(dim(IN(1), 2)), KI(dim(IN(2), 2)),
         KI(dim(IN(1), 3)), KI(dim(IN(3), 3)), KS(fattr(g, op, "scale")), KS(workspace(g, op)));
    break;
  case XM_OP_EMBEDDING_GRAD:
    CALL("embedding_grad", KV(IN(0)), KV(IN(1)), KV(OUT(0)), KI(numel(IN(1))), KI(dim(OUT(0), 0)),
         KI(dim(OUT(0), 1)));
    break;
  case XM_OP_SWIGLU_GRAD:
    CALL("swiglu_grad", KV(IN(0)), KV(IN(1)), KV(IN(2)), KV(OUT(0)), KV(OUT(1)),
         KS(count(g, IN(0))));
    break;
  case XM_OP_SILU_GRAD:
  case XM_OP_GELU_GRAD:
  case XM_OP_SIGMOID_GRAD:
    CALL(xm_ir_opinfo(op->code)->name, KV(IN(0)), KV(IN(1)), KV(OUT(0)), KS(count(g, IN(0))));
    break;
  case XM_OP_CROSS_ENTROPY_GRAD:
    CALL("cross_entropy_grad", KV(IN(0)), KV(IN(1)), KV(IN(2)), KV(OUT(0)),
         KI(numel(IN(1)) / dim(IN(1), -1)), KI(dim(IN(1), -1)));
    break;
  case XM_OP_LM_HEAD_CE_GRAD: /* dloss, x, w, labels, stats -> dw, dx, scratch */
    if (bf16_gemm_at(op, 1))
      CALL("lm_head_ce_grad_bf16", KV(IN(0)), KV(IN(1)), KV(IN(2)), KV(IN(3)), KV(IN(4)),
           KD(OUT(0)), KV(OUT(1)), KI(numel(IN(3))), KI(dim(IN(2), 1)), KI(dim(IN(2), 0)),
           KI(iattr(g, op, "chunk")), KS(dw_beta(g, OUT(0))), KV(OUT(2)), KS(workspace(g, op)));
    else
      CALL("lm_head_ce_grad", KV(IN(0)), KV(IN(1)), KV(IN(2)), KV(IN(3)), KV(IN(4)), KD(OUT(0)),
           KV(OUT(1)), KI(numel(IN(3))), KI(dim(IN(2), 1)), KI(dim(IN(2), 0)),
           KI(iattr(g, op, "chunk")), KS(dw_beta(g, OUT(0))), KV(OUT(2)));
    break;
  default: return false;
  }
  return true;
}

/* The permute and its bound check. */
/* The permute runs on the device; its row count reaches the host through
 * the host_read (rows) that follows it (emit_host_read). */
static void emit_permute(gen_t *g, const xm_ir_op_t *op) {
  int64_t T = dim(IN(0), 0), k = dim(IN(0), 1);
  if (g->host_of[OUT(2)->id] < 0)
    gen_error(g, op, XM_ERR_INTERNAL,
              "%s: no host_read of its tokens_per_expert, so the host cannot size the kernels "
              "after it (run host-reads)%s",
              NULL);
  CALL_DISCARD("permute", KV(IN(0)), KV(IN(1)), KV(OUT(0)), KV(OUT(1)), KV(OUT(2)), KI(T), KI(k),
               KI(iattr(g, op, "num_experts")), KI(xm_ir_op_get_int(op, "capacity", 0)));
}

/* host_read: the explicit copy of a device value the host needs, and what
 * the host does with it. rows: n_<id> (id of the permute's first result,
 * the name count() and routed_n() use) is the sum of the table, checked
 * against the bound the memory plan reserved; norm_sq: h_<id> for the
 * adamw ops; the losses: the exec state's fields the driver logs. */
static void emit_host_read(gen_t *g, const xm_ir_op_t *op) {
  const char *as = xm_ir_op_get_string(op, "as", "");
  const xm_ir_value_t *v = IN(0);
  if (strcmp(as, "rows") == 0) {
    const xm_ir_op_t *perm = v->def;
    int id = (int)xm_ir_op_get_int(perm, "rows_id", -1);
    int64_t E = dim(v, 0), bound = dim(perm->results[0], 0);
    EMIT("int64_t n_%d = 0;", id);
    EMIT("{");
    xm_emit_indent(&g->e);
    EMIT("int32_t tpe[" I64 "];", E > 0 ? E : 1);
    EMIT("xm_rt_read(x, tpe, %s, " I64 ");", A(0), E * 4);
    EMIT("for (int64_t e = 0; e < " I64 "; e++) n_%d += tpe[e];", E, id);
    xm_emit_dedent(&g->e);
    EMIT("}");
    EMIT("if (n_%d < 0 || n_%d > " I64 ")", id, id, bound);
    xm_emit_indent(&g->e);
    EMIT("xm_rt_fail(x, \"op %d permute: %%lld routed rows, outside the bound " I64
         " the memory plan reserved\", (long long)n_%d);",
         g->op_index, bound, id);
    xm_emit_dedent(&g->e);
  } else if (strcmp(as, "norm_sq") == 0) {
    EMIT("float h_%d;", v->id);
    EMIT("xm_rt_read(x, &h_%d, %s, 4);", v->id, A(0));
  } else if (strcmp(as, "loss") == 0 || strcmp(as, "ce_loss") == 0 ||
             strcmp(as, "mtp_loss") == 0) {
    EMIT("xm_rt_read(x, &x->host_%s, %s, 4);", as, A(0));
  } else {
    gen_error(g, op, XM_ERR_INTERNAL, "%s reads \"%s\", which the host does not use", as);
  }
}

/* Router and padding-free MoE ops, forward and backward. */
static bool emit_moe(gen_t *g, const xm_ir_op_t *op) {
  switch (op->code) {
  case XM_OP_ROUTER_SCORE:
    CALL("router_score", KV(IN(0)), KV(OUT(0)), KI(dim(IN(0), 0)), KI(dim(IN(0), 1)),
         KS(scoring(op)));
    break;
  case XM_OP_ROUTER_SCORE_GRAD:
    CALL("router_score_grad", KV(IN(0)), KV(IN(1)), KV(OUT(0)), KI(dim(IN(0), 0)),
         KI(dim(IN(0), 1)), KS(scoring(op)));
    break;
  case XM_OP_TOPK_ROUTE:
    CALL("topk_route", KV(IN(0)), KV(IN(1)), KV(OUT(0)), KV(OUT(1)), KI(dim(IN(0), 0)),
         KI(dim(IN(0), 1)), KI(iattr(g, op, "k")), KI(iattr(g, op, "n_group")),
         KI(iattr(g, op, "topk_group")), KI(iattr(g, op, "norm_topk_prob")),
         KS(fattr(g, op, "routed_scaling")), KS(scoring(op)));
    /* The routing statistics of out/train --routing-stats: the forward
     * routing only (a recomputed clone routes the same tokens again). */
    if (strcmp(phase_of(op), "fwd") == 0 && !xm_ir_op_get_bool(op, "recompute", false))
      EMIT("if (x->routing_stats) xm_rt_routing_observe(x, %d, %s, " I64 ", " I64 ", " I64 ");",
           (int)xm_ir_op_get_int(op, "layer", -1), ptr(g, OUT(0)), dim(IN(0), 0), dim(OUT(0), 1),
           dim(IN(0), 1));
    break;
  case XM_OP_TOPK_ROUTE_GRAD:
    CALL("topk_route_grad", KV(IN(0)), KV(IN(1)), KV(IN(2)), KV(OUT(0)), KI(dim(IN(1), 0)),
         KI(dim(IN(1), 1)), KI(dim(IN(0), 1)), KI(iattr(g, op, "norm_topk_prob")),
         KS(fattr(g, op, "routed_scaling")));
    break;
  case XM_OP_PERMUTE: emit_permute(g, op); break;
  case XM_OP_GATHER_ROWS:
    CALL("gather_rows", KV(IN(0)), KV(IN(1)), KV(OUT(0)), KS(routed_n(g, op, IN(1))),
         KI(dim(IN(0), -1)), KI(iattr(g, op, "k")));
    break;
  case XM_OP_GATHER_ROWS_GRAD:
    CALL("gather_rows_grad", KV(IN(0)), KV(IN(1)), KV(OUT(0)), KS(routed_n(g, op, IN(1))),
         KI(dim(OUT(0), 0)), KI(dim(OUT(0), -1)), KI(iattr(g, op, "k")));
    break;
  case XM_OP_GROUPED_MATMUL: /* x[N,K], w[E,M,K] */
  case XM_OP_GROUPED_MATMUL_DX:
    if (bf16_gemm(op)) {
      char name[48];
      snprintf(name, sizeof name, "%s_bf16", xm_ir_opinfo(op->code)->name);
      CALL(name, KV(IN(0)), KV(IN(1)), KV(IN(2)), KV(OUT(0)), KI(dim(IN(1), 0)), KI(dim(IN(1), 2)),
           KI(dim(IN(1), 1)), KS(workspace(g, op)));
    } else {
      CALL(xm_ir_opinfo(op->code)->name, KV(IN(0)), KV(IN(1)), KV(IN(2)), KV(OUT(0)),
           KI(dim(IN(1), 0)), KI(dim(IN(1), 2)), KI(dim(IN(1), 1)));
    }
    break;
  case XM_OP_GROUPED_MATMUL_DW: /* dy[N,M], x[N,K], tpe -> dw[E,M,K] */
    if (bf16_gemm(op)) {
      CALL("grouped_matmul_dw_bf16", KV(IN(0)), KV(IN(1)), KV(IN(2)), KD(OUT(0)),
           KI(dim(OUT(0), 0)), KI(dim(OUT(0), 2)), KI(dim(OUT(0), 1)), KS(dw_beta(g, OUT(0))),
           KS(workspace(g, op)));
      break;
    }
    CALL(g->acc_of[OUT(0)->id] >= 0 ? "grouped_matmul_dw_acc" : "grouped_matmul_dw", KV(IN(0)),
         KV(IN(1)), KV(IN(2)), KD(OUT(0)), KI(dim(OUT(0), 0)), KI(dim(OUT(0), 2)),
         KI(dim(OUT(0), 1)));
    break;
  case XM_OP_SCATTER_COMBINE: /* y[N,H], indices, weights[T,k] */
    CALL("scatter_combine", KV(IN(0)), KV(IN(1)), KV(IN(2)), KV(OUT(0)), KS(routed_n(g, op, IN(1))),
         KI(dim(IN(2), 0)), KI(dim(IN(2), 1)), KI(dim(IN(0), -1)));
    break;
  case XM_OP_SCATTER_COMBINE_GRAD: /* dout, y, indices, weights -> dy, dweights */
    CALL("scatter_combine_grad", KV(IN(0)), KV(IN(1)), KV(IN(2)), KV(IN(3)), KV(OUT(0)), KV(OUT(1)),
         KS(routed_n(g, op, IN(2))), KI(dim(IN(3), 0)), KI(dim(IN(3), 1)), KI(dim(IN(0), -1)));
    break;
  case XM_OP_GATHER_GROUPED_MATMUL: /* x[T,K], indices, tpe, w[E,M,K] -> y, scratch */
    FUSED_CALL("gather_grouped_matmul", KV(IN(0)), KV(IN(1)), KV(IN(2)), KV(IN(3)), KV(OUT(0)),
         KI(dim(IN(3), 0)), KI(dim(IN(3), 2)), KI(dim(IN(3), 1)), KI(iattr(g, op, "k")), KTILE(1));
    break;
  case XM_OP_GROUPED_MATMUL_COMBINE: /* h[N,K], w[E,M,K], tpe, indices, weights[T,k] */
    FUSED_CALL("grouped_matmul_combine", KV(IN(0)), KV(IN(1)), KV(IN(2)), KV(IN(3)), KV(IN(4)),
         KV(OUT(0)), KI(dim(IN(1), 0)), KI(dim(IN(1), 2)), KI(dim(IN(1), 1)), KI(dim(IN(4), 0)),
         KI(dim(IN(4), 1)), KTILE(1));
    break;
  case XM_OP_GATHER_GROUPED_MATMUL_DX: /* dy[N,M], w[E,M,K], tpe, indices -> dx[T,K] */
    FUSED_CALL("gather_grouped_matmul_dx", KV(IN(0)), KV(IN(1)), KV(IN(2)), KV(IN(3)), KV(OUT(0)),
         KI(dim(IN(1), 0)), KI(dim(IN(1), 2)), KI(dim(IN(1), 1)), KI(dim(OUT(0), 0)),
         KI(iattr(g, op, "k")), KTILE(1));
    break;
  case XM_OP_GATHER_GROUPED_MATMUL_DW: /* dy[N,M], x[T,K], indices, tpe -> dw[E,M,K] */
    FUSED_CALL("gather_grouped_matmul_dw", KV(IN(0)), KV(IN(1)), KV(IN(2)), KV(IN(3)), KD(OUT(0)),
         KI(dim(OUT(0), 0)), KI(dim(OUT(0), 2)), KI(dim(OUT(0), 1)), KI(iattr(g, op, "k")),
         KS(dw_beta(g, OUT(0))), KTILE(1));
    break;
  case XM_OP_GROUPED_MATMUL_COMBINE_GRAD: /* dout, h, w, tpe, indices, weights -> dh, dweights */
    FUSED_CALL("grouped_matmul_combine_grad", KV(IN(0)), KV(IN(1)), KV(IN(2)), KV(IN(3)), KV(IN(4)),
         KV(IN(5)), KV(OUT(0)), KV(OUT(1)), KI(dim(IN(2), 0)), KI(dim(IN(2), 2)), KI(dim(IN(2), 1)),
         KI(dim(IN(5), 0)), KI(dim(IN(5), 1)), KTILE(2));
    break;
  case XM_OP_GROUPED_MATMUL_COMBINE_DW: /* dout[T,M], h[N,K], indices, weights, tpe -> dw */
    FUSED_CALL("grouped_matmul_combine_dw", KV(IN(0)), KV(IN(1)), KV(IN(2)), KV(IN(3)), KV(IN(4)),
         KD(OUT(0)), KI(dim(OUT(0), 0)), KI(dim(OUT(0), 2)), KI(dim(OUT(0), 1)), KI(dim(IN(3), 1)),
         KS(dw_beta(g, OUT(0))), KTILE(1));
    break;
  case XM_OP_AUX_LOSS:
    CALL("aux_loss", KV(IN(0)), KV(IN(1)), KV(OUT(0)), KI(dim(IN(0), 0)), KI(dim(IN(0), 1)),
         KI(dim(IN(1), 1)), KS(fattr(g, op, "alpha")));
    break;
  case XM_OP_AUX_LOSS_GRAD:
    CALL("aux_loss_grad", KV(IN(0)), KV(IN(1)), KV(IN(2)), KV(OUT(0)), KI(dim(IN(1), 0)),
         KI(dim(IN(1), 1)), KI(dim(IN(2), 1)), KS(fattr(g, op, "alpha")));
    break;
  default: return false;
  }
  return true;
}

/* ---- multi-rank ops (runtime/comm/spmd.h) ------------------------------------ */

/* Group names of the IR and the runtime's group constants, from the one
 * table both sides include (runtime/abi/groups.def); an alias such as "sp"
 * (the sequence shard of an SSMB block) names its group's constant. */
static const struct {
  const char *name, *constant;
  int kind; /* xm_rt_group_kind_t */
} k_groups[] = {
#define XM_GROUP(e, name, rt, doc) {name, #rt, rt},
#define XM_GROUP_ALIAS(e, name, rt, doc) {name, #rt, rt},
#include "runtime/abi/groups.def"
};

/* Index in k_groups of a group name, or -1. */
static int group_lookup(const char *name) {
  for (size_t i = 0; name && i < sizeof k_groups / sizeof k_groups[0]; i++)
    if (strcmp(k_groups[i].name, name) == 0) return (int)i;
  return -1;
}

/* The XM_RT_GROUP_* constant of an op's attr group. */
static const char *group_const(gen_t *g, const xm_ir_op_t *op) {
  const char *name = xm_ir_op_get_string(op, "group", NULL);
  int i = group_lookup(name);
  if (i < 0) {
    gen_error(g, op, XM_ERR_INTERNAL, "%s has no known group attribute (\"%s\")",
              name ? name : "none");
    return "XM_RT_GROUP_WORLD";
  }
  return k_groups[i].constant;
}

static int layer_of(const xm_ir_op_t *op) { return (int)xm_ir_op_get_int(op, "layer", -1); }

/* Elements per row (per index of dim 0). */
static int64_t row_width(const xm_ir_value_t *v) {
  if (v->type.rank < 1 || v->type.dims[0] <= 0) return 1;
  return numel(v) / v->type.dims[0];
}

static bool dynamic0(const xm_ir_value_t *v) { return v->type.rank > 0 && v->type.dynamic[0]; }

/* all_gather and narrow move whole slices of dim 0 of static tensors. */
static bool leading_static(gen_t *g, const xm_ir_op_t *op) {
  if (xm_ir_op_get_int(op, "dim", 0) == 0 && !dynamic0(IN(0)) && !dynamic0(OUT(0))) return true;
  gen_error(g, op, XM_ERR_UNSUPPORTED,
            "%s cannot run in the CPU schedule along a dim other than 0 or over rows of a "
            "run-time count%s",
            NULL);
  return false;
}

/* The copy of replicate and of a reshape the plan did not alias. */
static void emit_copy_unless_aliased(gen_t *g, const xm_ir_op_t *op) {
  xm_mem_place_t a, b;
  if (xm_plan_memory_place(op, 0, &a) && xm_plan_memory_place(IN(0)->def, IN(0)->index, &b) &&
      (a.arena != b.arena || a.offset != b.offset))
    EMIT("xm_rt_copy(x, %s, %s, (int64_t)(%s) * %zu);", R(0), A(0), count(g, OUT(0)),
         xm_dtype_size(OUT(0)->type.dtype));
  else
    EMIT("/* aliased: no code */");
}

/* all_to_all: the rows it returns become the run-time row count n_<id> of
 * everything computed from them (compute_rows_src). */
static void emit_all_to_all(gen_t *g, const xm_ir_op_t *op) {
  const char *traffic = xm_ir_op_get_string(op, "traffic", NULL);
  const char *phase = "XM_RT_PHASE_OTHER";
  if (traffic && strcmp(traffic, xm_rt_phase_kind_name(XM_RT_PHASE_DISPATCH)) == 0)
    phase = "XM_RT_PHASE_DISPATCH";
  else if (traffic && strcmp(traffic, xm_rt_phase_kind_name(XM_RT_PHASE_COMBINE)) == 0)
    phase = "XM_RT_PHASE_COMBINE";
  else if (traffic)
    gen_error(g, op, XM_ERR_INTERNAL, "%s: traffic \"%s\" is neither dispatch nor combine",
              traffic);
  int id = (int)xm_ir_op_get_int(op, "rows_id", -1);
  int64_t bound = dim(OUT(0), 0);
  EMIT("int64_t n_%d = xm_rt_all_to_all(x, %s, %s, %d, %s, %s, %s, " I64 ", " I64 ", %s, " I64 ");",
       id, group_const(g, op), phase, layer_of(op), A(0), A(1), A(2), dim(IN(1), 1),
       row_width(OUT(0)), R(0), bound);
  if (dynamic0(OUT(0))) return;
  EMIT("if (n_%d != " I64 ")", id, bound);
  xm_emit_indent(&g->e);
  EMIT("xm_rt_fail(x, \"op %d all_to_all: %%lld rows arrived, the static shape says " I64
       "\", (long long)n_%d);",
       g->op_index, bound, id);
  xm_emit_dedent(&g->e);
}

/* The chunk size of a ZeRO-1 op against its group_size (when given). */
static void check_chunk(gen_t *g, const xm_ir_op_t *op, int64_t n, int64_t c) {
  int64_t P = xm_ir_op_get_int(op, "group_size", 0);
  if (P >= 1 && c != (n + P - 1) / P)
    gen_error(g, op, XM_ERR_INTERNAL, "%s: the chunk is not ceil(n / group_size)%s", NULL);
}

/* Redundancy-bypassing dispatch (runtime/moe/rbd_exec.h): the dispatch returns
 * the rows of this rank's experts into n_<id> like an all_to_all; the
 * routing record between the four calls lives in the runtime under attr
 * slot. */
static bool emit_rbd(gen_t *g, const xm_ir_op_t *op) {
  switch (op->code) {
  case XM_OP_RBD_DISPATCH: { /* x[T,H], experts i32[T,k], weights[T,k] -> rows, tpe */
    int id = (int)xm_ir_op_get_int(op, "rows_id", -1);
    int64_t bound = dim(OUT(0), 0);
    EMIT("int64_t n_%d = xm_rt_rbd_dispatch(x, %d, %d, %s, %s, %s, " I64 ", " I64 ", " I64 ", " I64
         ", %s, %s, " I64 ");",
         id, (int)iattr(g, op, "slot"), layer_of(op), A(0), A(1), A(2), dim(IN(0), 0),
         dim(IN(1), 1), dim(IN(0), 1), iattr(g, op, "num_experts"), R(0), R(1), bound);
    if (!dynamic0(OUT(0))) {
      EMIT("if (n_%d != " I64 ")", id, bound);
      xm_emit_indent(&g->e);
      EMIT("xm_rt_fail(x, \"op %d rbd_dispatch: %%lld rows arrived, the static shape says " I64
           "\", (long long)n_%d);",
           g->op_index, bound, id);
      xm_emit_dedent(&g->e);
    }
    break;
  }
  case XM_OP_RBD_COMBINE:
    EMIT("xm_rt_rbd_combine(x, %d, %d, %s, %s);", (int)iattr(g, op, "slot"), layer_of(op), A(0),
         R(0));
    break;
  case XM_OP_RBD_COMBINE_GRAD:
    EMIT("xm_rt_rbd_combine_grad(x, %d, %d, %s, %s, %s, %s);", (int)iattr(g, op, "slot"),
         layer_of(op), A(0), A(1), R(0), R(1));
    break;
  case XM_OP_RBD_DISPATCH_GRAD:
    EMIT("xm_rt_rbd_dispatch_grad(x, %d, %d, %s, %s);", (int)iattr(g, op, "slot"), layer_of(op),
         A(0), R(0));
    break;
  default: return false;
  }
  return true;
}

/* Collectives and the data movement around them; false when not one. */
static bool emit_spmd(gen_t *g, const xm_ir_op_t *op) {
  switch (op->code) {
  case XM_OP_ALL_REDUCE:
    EMIT("xm_rt_all_reduce(x, %s, %d, %s, %s, %s);", group_const(g, op), layer_of(op), A(0), R(0),
         count(g, IN(0)));
    break;
  case XM_OP_ALL_GATHER:
    if (leading_static(g, op))
      EMIT("xm_rt_all_gather(x, %s, %d, %s, %s, " I64 ");", group_const(g, op), layer_of(op), A(0),
           R(0), numel(IN(0)));
    break;
  case XM_OP_REDUCE_SCATTER:
    if (leading_static(g, op))
      EMIT("xm_rt_reduce_scatter(x, %s, %d, %s, %s, " I64 ");", group_const(g, op), layer_of(op),
           A(0), R(0), numel(OUT(0)));
    break;
  case XM_OP_NARROW:
    if (leading_static(g, op))
      EMIT("xm_rt_narrow(x, %s, %s, %s, " I64 ", %zu);", group_const(g, op), A(0), R(0),
           numel(OUT(0)), xm_dtype_size(OUT(0)->type.dtype));
    break;
  case XM_OP_REPLICATE: emit_copy_unless_aliased(g, op); break;
  case XM_OP_EXCHANGE_COUNTS:
    EMIT("xm_rt_exchange_counts(x, %s, %d, %s, %s, %s, " I64 ");", group_const(g, op), layer_of(op),
         A(0), R(0), R(1), dim(IN(0), 1));
    break;
  case XM_OP_ALL_TO_ALL: emit_all_to_all(g, op); break;
  case XM_OP_SORT_CHUNKS:
  case XM_OP_UNSORT_CHUNKS:
    CALL(xm_ir_opinfo(op->code)->name, KV(IN(0)), KV(IN(1)), KI(dim(IN(1), 0)), KI(dim(IN(1), 1)),
         KI(row_width(IN(0))), KV(OUT(0)));
    break;
  case XM_OP_REDUCE_STATE:
    if (IN(0)->type.dtype == XM_DT_I32)
      EMIT("xm_rt_all_reduce_i32(x, %s, %d, %s, %s);", group_const(g, op), layer_of(op), A(0),
           count(g, IN(0)));
    else
      EMIT("xm_rt_all_reduce(x, %s, %d, %s, %s, %s);", group_const(g, op), layer_of(op), A(0), A(0),
           count(g, IN(0)));
    break;
  case XM_OP_ZERO_REDUCE_SCATTER:
    check_chunk(g, op, numel(IN(0)), numel(OUT(0)));
    EMIT("xm_rt_zero_reduce_scatter(x, %s, %s, " I64 ", %s);", group_const(g, op), A(0),
         numel(IN(0)), R(0));
    break;
  case XM_OP_ZERO_GATHER:
    EMIT("xm_rt_zero_gather(x, %s, %s, " I64 ");", group_const(g, op), A(0), numel(IN(0)));
    break;
  default: return emit_rbd(g, op);
  }
  return true;
}

/* grad_norm_sq: a squared norm summed in double on the device (its
 * workspace holds the accumulator), stored as its f32 scalar result; the
 * host sees it through the host_read after it. On one rank it is the global norm; a multi-rank step
 * all-reduces partial sums and adds them in the graph, so the clip coefficient is taken by each
 * adamw from the value it consumes (emit_adamw), not here. */
static void emit_grad_norm(gen_t *g, const xm_ir_op_t *op) {
  EMIT("{");
  xm_emit_indent(&g->e);
  EMIT("double *acc = (double *)%s;", workspace(g, op));
  EMIT("xm_rt_zero(x, acc, 8);");
  for (int i = 0; i < op->num_operands; i++)
    CALL("sum_sq_acc", KV(IN(i)), KS(count(g, IN(i))), KS("acc"), KV(OUT(0)));
  xm_emit_dedent(&g->e);
  EMIT("}");
}

/* The op before module index i that runs code (declarations of params and
 * states emit nothing), or -1. */
static int prev_code_op(const gen_t *g, int i) {
  while (--i >= 0)
    if (!xm_ir_op_is_declaration(xm_ir_module_op(g->m, i))) return i;
  return -1;
}

/* Whether the op at module index i is an adamw that continues a batch: the
 * op before it that runs code is an adamw of the step reading the same
 * norm_sq. */
static bool adamw_continues(const gen_t *g, int i) {
  const xm_ir_op_t *op = xm_ir_module_op(g->m, i);
  int j = prev_code_op(g, i);
  if (op->code != XM_OP_ADAMW || j < 0) return false;
  const xm_ir_op_t *prev = xm_ir_module_op(g->m, j);
  return prev->code == XM_OP_ADAMW && xm_ir_op_in_step(prev) && prev->operands[4] == op->operands[4];
}

/* adamw: a run of consecutive adamw ops that read the same norm_sq (the
 * step's optimizer, which autodiff emits as one block) is one launch of
 * adamw_multi over a table of the run's tensors, emitted at the run's first
 * op; the others say where they went. Before it, the global norm and clip
 * coefficient from the norm_sq (read by its host_read). Each op's decay
 * attr is its entry's decay flag. With attrs group/group_size (ZeRO-1)
 * grad, m and v are this member's chunk [c] of the flattened param [n]:
 * the entry covers elements [index*c, min(n, (index+1)*c)) of the param
 * (none when the range is empty: the last members of a short tensor own
 * nothing). */
static void emit_adamw(gen_t *g, const xm_ir_op_t *op) {
  const int first = g->op_index;
  if (adamw_continues(g, first)) {
    int head = first;
    while (adamw_continues(g, head)) head = prev_code_op(g, head);
    EMIT("/* batched: updated by the adamw_multi of op %d */", head);
    return;
  }
  char norm[32];
  snprintf(norm, sizeof norm, "(&h_%d)", IN(4)->id);
  if (g->host_of[IN(4)->id] < 0)
    gen_error(g, op, XM_ERR_INTERNAL,
              "%s: its norm operand has no host_read, so the host cannot take the clip "
              "coefficient (run host-reads)%s",
              NULL);
  /* The run: module indices of its ops, declarations between them skipped. */
  int count = 0, *run = malloc(sizeof *run * (size_t)xm_ir_module_num_ops(g->m));
  if (!run) {
    gen_error(g, op, XM_ERR_NO_MEMORY, "%s: out of memory%s", "");
    return;
  }
  run[count++] = first;
  for (int i = first + 1; i < xm_ir_module_num_ops(g->m); i++) {
    if (xm_ir_op_is_declaration(xm_ir_module_op(g->m, i))) continue;
    if (!adamw_continues(g, i)) break;
    run[count++] = i;
  }
  EMIT("x->grad_norm = sqrt((double)*%s);", norm);
  EMIT("x->grad_scale = xm_rt_clip_coef(*%s, x->grad_clip);", norm);
  EMIT("{");
  xm_emit_indent(&g->e);
  EMIT("xm_rt_adamw_tensor_t t[%d] = {", count);
  xm_emit_indent(&g->e);
  for (int j = 0; j < count; j++) {
    const xm_ir_op_t *a = xm_ir_module_op(g->m, run[j]);
    g->op_index = run[j];
    int64_t n = numel(a->operands[0]);
    if (xm_ir_op_attr(a, "group")) {
      int64_t c = numel(a->operands[1]), P = iattr(g, a, "group_size");
      if (P < 1 || c != (n + P - 1) / P || numel(a->operands[2]) != c ||
          numel(a->operands[3]) != c)
        gen_error(g, a, XM_ERR_INTERNAL,
                  "%s: the ZeRO-1 chunks of grad, m and v are not ceil(n / group_size)%s", NULL);
      n = 0; /* this member's range, set below */
    }
    EMIT("{%s, %s, %s, %s, " I64 ", %d, 0}, /* of op %d */", ptr(g, a->operands[0]),
         ptr(g, a->operands[1]), ptr(g, a->operands[2]), ptr(g, a->operands[3]), n,
         xm_ir_op_get_bool(a, "decay", false) ? 1 : 0, run[j]);
  }
  xm_emit_dedent(&g->e);
  EMIT("};");
  for (int j = 0; j < count; j++) {
    const xm_ir_op_t *a = xm_ir_module_op(g->m, run[j]);
    if (!xm_ir_op_attr(a, "group")) continue;
    g->op_index = run[j];
    int64_t n = numel(a->operands[0]), c = numel(a->operands[1]);
    EMIT("{ /* ZeRO-1: this member's chunk of the param of op %d */", run[j]);
    xm_emit_indent(&g->e);
    EMIT("int64_t lo = xm_rt_group_index(x, %s) * " I64 ";", group_const(g, a), c);
    EMIT("int64_t len = " I64 " - lo < " I64 " ? " I64 " - lo : " I64 ";", n, c, n, c);
    EMIT("if (len > 0) {");
    EMIT("  t[%d].p += lo;", j);
    EMIT("  t[%d].n = len;", j);
    EMIT("}");
    xm_emit_dedent(&g->e);
    EMIT("}");
  }
  g->op_index = first;
  CALL("adamw_multi", KS("t"), KI(count), KS("x->lr"), KS("x->beta1"), KS("x->beta2"),
       KS("x->adam_eps"), KS("x->weight_decay"), KS("x->step"), KS("x->grad_scale"));
  xm_emit_dedent(&g->e);
  EMIT("}");
  free(run);
}

/* Training-state and optimizer ops. */
static bool emit_train(gen_t *g, const xm_ir_op_t *op) {
  switch (op->code) {
  case XM_OP_ACCUMULATE:
    if (g->acc_of[IN(1)->id] == g->op_index)
      EMIT("/* fused: the weight-gradient GEMM above added into the state */");
    else
      CALL(IN(0)->type.dtype == XM_DT_I32 ? "accumulate_i32" : "accumulate", KV(IN(0)), KV(IN(1)),
           KS(count(g, IN(1))));
    break;
  case XM_OP_GRAD_NORM_SQ: emit_grad_norm(g, op); break;
  case XM_OP_HOST_READ: emit_host_read(g, op); break;
  case XM_OP_ADAMW: emit_adamw(g, op); break;
  case XM_OP_AUX_FREE_UPDATE:
    CALL("aux_free_update", KV(IN(0)), KV(IN(1)), KI(numel(IN(0))), KS(fattr(g, op, "gamma")));
    break;
  case XM_OP_ZERO:
    EMIT("xm_rt_zero(x, %s, " I64 ");", A(0),
         numel(IN(0)) * (int64_t)xm_dtype_size(IN(0)->type.dtype));
    break;
  default: return false;
  }
  return true;
}

/* Graph structure: constants, reshapes, inputs and the return. */
static bool emit_structure(gen_t *g, const xm_ir_op_t *op) {
  xm_mem_place_t a, b;
  switch (op->code) {
  case XM_OP_INPUT: EMIT("/* filled by the training driver */"); break;
  case XM_OP_RETURN: EMIT("/* the losses: read to the host by the host_read ops */"); break;
  case XM_OP_CONSTANT:
    if (OUT(0)->type.dtype == XM_DT_I32)
      EMIT("xm_rt_fill_i32(x, %s, (int32_t)%s, " I64 ");", R(0), fattr(g, op, "value"),
           numel(OUT(0)));
    else
      CALL("fill", KV(OUT(0)), KI(numel(OUT(0))), KS(fattr(g, op, "value")));
    break;
  case XM_OP_RESHAPE:
    if (xm_plan_memory_place(op, 0, &a) && xm_plan_memory_place(IN(0)->def, IN(0)->index, &b) &&
        (a.arena != b.arena || a.offset != b.offset))
      EMIT("xm_rt_copy(x, %s, %s, " I64 ");", R(0), A(0),
           numel(OUT(0)) * (int64_t)xm_dtype_size(OUT(0)->type.dtype));
    else
      EMIT("/* aliased: no code */");
    break;
  default: return false;
  }
  return true;
}

/* A location goes into a comment: one without line breaks or a comment
 * end, else "?". */
static bool comment_safe(const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p; p++)
    if (*p < 0x20 || (p[0] == '*' && p[1] == '/')) return false;
  return true;
}

/* The trace hook of an op that runs code (runtime/driver/trace.h): its index,
 * name, layer and phase flags. Input and return run nothing. */
static void trace_hook(const gen_t *g, const xm_ir_op_t *op, xm_strbuf_t *c) {
  if (op->code == XM_OP_INPUT || op->code == XM_OP_RETURN) return;
  const char *phase = phase_of(op);
  const char *flag = strcmp(phase, "bwd") == 0    ? "XM_RT_TRACE_BWD"
                     : strcmp(phase, "step") == 0 ? "XM_RT_TRACE_STEP"
                                                  : "XM_RT_TRACE_FWD";
  const xm_ir_attr_t *layer = xm_ir_op_attr(op, "layer");
  xm_strbuf_printf(c, " XM_TRACE_OP(x, %d, \"%s\", %d, %s%s);", g->op_index,
                   xm_ir_opinfo(op->code)->name,
                   layer && layer->kind == XM_ATTR_INT ? (int)layer->i : -1, flag,
                   (xm_ir_opinfo(op->code)->flags & XM_OPF_COMM) ? " | XM_RT_TRACE_COMM" : "");
}

static bool emit_code(gen_t *g, const xm_ir_op_t *op) {
  return emit_structure(g, op) || emit_dense(g, op) || emit_dense_grad(g, op) ||
         emit_moe(g, op) || emit_spmd(g, op) || emit_train(g, op);
}

/* An op with attr last_micro (overlap-grad-reduce: a collective of the
 * micro function that runs in the last micro-batch of a step only) runs,
 * trace hook included, under `if (x->last_micro)`, queued on the gradient
 * lane between xm_rt_overlap_begin and _end. An op with attr async
 * (overlap-moe-comm: an expert exchange) is queued on the MoE lane; the ops
 * beside it (attr beside, the run just before it) follow the lane's fork. */
static void emit_op(gen_t *g, const xm_ir_op_t *op) {
  const char *loc = op->loc[0] && comment_safe(op->loc) ? op->loc : "?";
  const bool last_micro = xm_ir_op_get_bool(op, "last_micro", false);
  const bool async = xm_ir_op_get_bool(op, "async", false);
  const bool beside = xm_ir_op_get_bool(op, "beside", false);
  const bool comm = (xm_ir_opinfo(op->code)->flags & XM_OPF_COMM) != 0;
  if ((last_micro || async) && (xm_ir_op_in_step(op) || !comm))
    gen_error(g, op, XM_ERR_INTERNAL, "%s has attr %s but is not a collective of the micro-batch",
              last_micro ? "last_micro" : "async");
  if (async && (last_micro || beside || g->pending))
    gen_error(g, op, XM_ERR_INTERNAL,
              "%s: an exchange on the MoE lane must be neither beside another nor a gradient "
              "reduction%s",
              NULL);
  if (beside && comm && !last_micro)
    gen_error(g, op, XM_ERR_INTERNAL, "%s is a collective beside an exchange%s", NULL);
  /* The compute stream waits for the exchange before reading what it made. */
  if (g->pending)
    for (int k = 0; k < op->num_operands; k++)
      if (IN(k)->def == g->pending) {
        EMIT("xm_rt_overlap_join(x, XM_RT_LANE_MOE); /* the %s of op %d */",
             xm_ir_opinfo(g->pending->code)->name, g->pending_index);
        g->pending = NULL;
        break;
      }
  if (beside && !g->forked) {
    EMIT("xm_rt_overlap_fork(x, XM_RT_LANE_MOE); /* what follows runs beside the exchange */");
    g->forked = true;
  }
  xm_strbuf_t c;
  xm_strbuf_init(&c);
  xm_strbuf_printf(&c, "/* op %d %s @%s", g->op_index, xm_ir_opinfo(op->code)->name, loc);
  const xm_ir_attr_t *layer = xm_ir_op_attr(op, "layer");
  if (layer && layer->kind == XM_ATTR_INT) xm_strbuf_printf(&c, " layer %" PRId64, layer->i);
  xm_strbuf_puts(&c, last_micro ? " last micro-batch, gradient lane */"
                     : async    ? " MoE lane */"
                                : " */");
  if (!last_micro) trace_hook(g, op, &c);
  EMIT("%s", xm_strbuf_cstr(&c));
  xm_strbuf_free(&c);
  if (last_micro) {
    xm_strbuf_t h;
    xm_strbuf_init(&h);
    xm_strbuf_puts(&h, "if (x->last_micro) {");
    trace_hook(g, op, &h);
    EMIT("%s", xm_strbuf_cstr(&h));
    xm_strbuf_free(&h);
    xm_emit_indent(&g->e);
    EMIT("xm_rt_overlap_begin(x, XM_RT_LANE_GRAD);");
  }
  if (async) {
    if (!g->forked)
      gen_error(g, op, XM_ERR_INTERNAL, "%s has attr async but no op beside it%s", NULL);
    EMIT("xm_rt_overlap_begin(x, XM_RT_LANE_MOE);");
  }
  bool ok = emit_code(g, op);
  if (last_micro) {
    EMIT("xm_rt_overlap_end(x, XM_RT_LANE_GRAD);");
    xm_emit_dedent(&g->e);
    EMIT("}");
  }
  if (async) {
    EMIT("xm_rt_overlap_end(x, XM_RT_LANE_MOE);");
    g->pending = op;
    g->pending_index = g->op_index;
    g->forked = false;
  }
  if (!ok)
    gen_error(g, op, XM_ERR_UNSUPPORTED, "%s cannot run in the generated CPU schedule yet%s",
              NULL);
}

/* The run-time row count of each routed value, as the routed-rows pass
 * recorded it: a source op's attr rows_id k names its count n_<k> (a
 * permute's indices and bin_ids, the rows an all_to_all or rbd_dispatch
 * returns); any other op's dynamic results have the count of its attr
 * rows_of. A dynamic result without either is an unplanned module. */
static void compute_rows_src(gen_t *g) {
  const xm_ir_module_t *m = g->m;
  for (int i = 0; i < xm_ir_module_num_values(m); i++)
    g->rows_src[i] = -1;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    int64_t id = xm_ir_op_get_int(op, "rows_id", -1);
    if (id >= 0) {
      int routed = op->code == XM_OP_PERMUTE ? 2 : 1;
      for (int r = 0; r < routed && r < op->num_results; r++)
        g->rows_src[OUT(r)->id] = (int)id;
      continue;
    }
    int64_t of = xm_ir_op_get_int(op, "rows_of", -1);
    for (int j = 0; j < op->num_results; j++) {
      if (!dynamic0(OUT(j))) continue;
      if (of < 0) {
        g->op_index = i;
        gen_error(g, op, XM_ERR_INTERNAL,
                  "%s has dynamic rows but no attr rows_of (run routed-rows)%s", NULL);
        break;
      }
      g->rows_src[OUT(j)->id] = (int)of;
    }
  }
}

/* The accumulates the fold-accumulate pass folded into the GEMM that makes
 * their gradient (attrs folded / accumulate): the GEMM writes into the
 * accumulate's state. A folded accumulate whose GEMM does not say so, or
 * whose gradient has another use, is an inconsistent module. */
static void compute_acc_fusion(gen_t *g) {
  const xm_ir_module_t *m = g->m;
  for (int i = 0; i < xm_ir_module_num_values(m); i++)
    g->acc_of[i] = -1;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->code != XM_OP_ACCUMULATE || !xm_ir_op_get_bool(op, "folded", false)) continue;
    const xm_ir_value_t *dw = IN(1);
    if (!dw->def || !xm_ir_op_get_bool(dw->def, "accumulate", false) || dw->num_uses != 1 ||
        dw->index != 0) {
      g->op_index = i;
      gen_error(g, op, XM_ERR_INTERNAL,
                "%s is folded but its operand is not the only use of a GEMM with attr "
                "accumulate%s",
                NULL);
      continue;
    }
    g->acc_of[dw->id] = i;
  }
}

/* Which values a host_read reads (the host code uses its copy). */
static void compute_host_reads(gen_t *g) {
  const xm_ir_module_t *m = g->m;
  for (int i = 0; i < xm_ir_module_num_values(m); i++)
    g->host_of[i] = -1;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->code == XM_OP_HOST_READ && op->num_operands == 1) g->host_of[IN(0)->id] = i;
  }
}

/* Emits `static void <name>(xm_rt_exec_t *x)` with the ops of one function. */
static void emit_function(gen_t *g, const char *name, bool step) {
  EMIT("static void %s(xm_rt_exec_t *x) {", name);
  xm_emit_indent(&g->e);
  if (step) {
    if (xm_ir_module_get_int(g->m, "overlapped_reductions", 0) > 0)
      EMIT("xm_rt_overlap_join(x, XM_RT_LANE_GRAD); /* the reductions of the last micro-batch */");
    EMIT("x->grad_norm = 0.0;");
    EMIT("x->grad_scale = 1.0f;");
  }
  for (int i = 0; i < xm_ir_module_num_ops(g->m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(g->m, i);
    if (xm_ir_op_is_declaration(op) || xm_ir_op_in_step(op) != step) continue;
    g->op_index = i;
    emit_op(g, op);
  }
  if (g->pending) {
    EMIT("xm_rt_overlap_join(x, XM_RT_LANE_MOE); /* the %s of op %d */",
         xm_ir_opinfo(g->pending->code)->name, g->pending_index);
    g->pending = NULL;
  }
  if (g->forked) gen_error(g, NULL, XM_ERR_INTERNAL, "%s: ops beside no exchange%s", NULL);
  /* The last traced op ends here. */
  EMIT(step ? "XM_TRACE_DONE(x);" : "XM_TRACE_DONE(x); (void)x;");
  xm_emit_dedent(&g->e);
  EMIT("}");
  xm_emit_blank(&g->e);
}

/* ---- the tensor table -------------------------------------------------- */

typedef struct {
  int tokens, labels, loss, ce_loss, mtp_loss, count;
} table_idx_t;

static const char *init_name(const char *init) {
  if (strcmp(init, "ones") == 0) return "XM_RT_INIT_ONES";
  if (strcmp(init, "zeros") == 0) return "XM_RT_INIT_ZEROS";
  if (strcmp(init, "normal") == 0) return "XM_RT_INIT_NORMAL";
  return "XM_RT_INIT_NONE";
}

/* Category of a state by kind (passes/plan_memory.h uses the same split). */
static const char *state_category(const xm_ir_op_t *op) {
  return strcmp(xm_ir_op_get_string(op, "kind", ""), "grad") == 0 ? "XM_RT_CAT_GRADS"
                                                                  : "XM_RT_CAT_OPTIMIZER";
}

/* The param op named `name`, or NULL. */
static const xm_ir_op_t *param_op(const xm_ir_module_t *m, const char *name) {
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->code == XM_OP_PARAM && strcmp(xm_ir_op_get_string(op, "name", ""), name) == 0)
      return op;
  }
  return NULL;
}

/* Sharding columns of a table row (runtime/abi/program.h): group kinds + 1,
 * 0 when not split / not chunked. */
typedef struct {
  int split_group, split_dim, chunk_group;
} shard_cols_t;

static const shard_cols_t k_unsharded = {0, 0, 0};

/* A group attr as a table column: kind + 1, 0 when absent. */
static int group_column(gen_t *g, const xm_ir_op_t *op, const char *key) {
  const char *name = xm_ir_op_get_string(op, key, NULL);
  if (!name) return 0;
  int i = group_lookup(name);
  if (i < 0) {
    gen_error(g, op, XM_ERR_INTERNAL, "%s has an unknown group in its sharding (\"%s\")", name);
    return 0;
  }
  return k_groups[i].kind + 1;
}

/* A param's split (attrs split_group, split_dim). */
static shard_cols_t param_shard(gen_t *g, const xm_ir_op_t *param) {
  shard_cols_t c = {0, 0, 0};
  if (!param) return c;
  c.split_group = group_column(g, param, "split_group");
  if (c.split_group) c.split_dim = (int)xm_ir_op_get_int(param, "split_dim", 0);
  return c;
}

/* A state: a ZeRO-1 chunk (attr chunk_group) is not split; grads and
 * unchunked Adam moments hold the same slice as their param. */
static shard_cols_t state_shard(gen_t *g, const xm_ir_op_t *state) {
  shard_cols_t c = {0, 0, 0};
  c.chunk_group = group_column(g, state, "chunk_group");
  if (c.chunk_group) return c;
  const char *kind = xm_ir_op_get_string(state, "kind", "");
  if (strcmp(kind, "grad") && strcmp(kind, "adam_m") && strcmp(kind, "adam_v")) return c;
  return param_shard(g, param_op(g->m, xm_ir_op_get_string(state, "of", "")));
}

/* Index in the table of the param named `name`, or -1. */
static int param_index(const xm_ir_module_t *m, const char *name) {
  int idx = 0;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    if (op->code != XM_OP_PARAM && op->code != XM_OP_STATE && op->code != XM_OP_INPUT) continue;
    if (op->code == XM_OP_PARAM && strcmp(xm_ir_op_get_string(op, "name", ""), name) == 0)
      return idx;
    idx++;
  }
  return -1;
}

/* One table row: name, category, dtype, rank, dims, place, init, param,
 * sharding. */
static void emit_row(gen_t *g, const char *name, const char *category, const xm_ir_value_t *v,
                     const char *init, double std, int trainable, int param, shard_cols_t sh,
                     bool accumulator, int placed) {
  xm_mem_place_t p = {0, 0, 0};
  if (!xm_plan_memory_place(v->def, v->index, &p))
    gen_error(g, v->def, XM_ERR_INTERNAL, "%s result has no memory place (run plan-memory)%s",
              NULL);
  xm_strbuf_t row;
  xm_strbuf_init(&row);
  xm_strbuf_puts(&row, "{");
  xm_codegen_c_string(&row, name, 0);
  xm_strbuf_printf(&row, ", %s, %s, %d, {", category, abi_dtype(g, v->def, v->type.dtype)->constant,
                   v->type.rank);
  for (int i = 0; i < v->type.rank; i++)
    xm_strbuf_printf(&row, "%s%" PRId64, i ? ", " : "", v->type.dims[i]);
  if (v->type.rank == 0) xm_strbuf_puts(&row, "0");
  xm_strbuf_printf(&row, "}, %d, %" PRId64 ", %" PRId64 ", %s, %sf, %d, %d, %d, %d, %d, %d, %d},",
                   p.arena == XM_MEM_ARENA_PERSISTENT ? 1 : 0, p.offset,
                   numel(v) * (int64_t)xm_dtype_size(v->type.dtype), init, num(g, v->def, std),
                   trainable, param, sh.split_group, sh.split_dim, sh.chunk_group,
                   accumulator ? 1 : 0, placed);
  EMIT("%s", xm_strbuf_cstr(&row));
  xm_strbuf_free(&row);
}

/* The placement column of a param (or of a state of it): row + 1 of the
 * module's placement (attrs placement_layers, placement; set by xmoec
 * compile --placement) for a param with attr expert_slots of a placed
 * layer, else 0. */
static int placed_column(const gen_t *g, const xm_ir_op_t *param) {
  const xm_ir_attr_t *rows = xm_ir_module_find_attr(g->m, "placement_layers");
  if (!param || !rows || rows->kind != XM_ATTR_INTS || !xm_ir_op_get_bool(param, "expert_slots", false))
    return 0;
  int64_t layer = xm_ir_op_get_int(param, "layer", -1);
  for (int r = 0; r < rows->n; r++)
    if (rows->ints[r] == layer) return r + 1;
  return 0;
}

static void emit_decl_row(gen_t *g, const xm_ir_op_t *op, table_idx_t *t) {
  const char *name = xm_ir_op_get_string(op, "name", "");
  if (op->code == XM_OP_PARAM) {
    const char *init = xm_ir_op_get_string(op, "init", "normal");
    double std = strcmp(init, "normal") == 0 ? xm_ir_op_get_float(op, "std", 0.02) : 0.0;
    emit_row(g, name, "XM_RT_CAT_WEIGHTS", OUT(0), init_name(init), std,
             xm_ir_op_get_bool(op, "trainable", true), -1, param_shard(g, op), false,
             placed_column(g, op));
  } else if (op->code == XM_OP_STATE) {
    const char *of_name = xm_ir_op_get_string(op, "of", "");
    int of = param_index(g->m, of_name);
    const char *kind = xm_ir_op_get_string(op, "kind", "");
    emit_row(g, name, state_category(op), OUT(0), "XM_RT_INIT_ZEROS", 0.0, 0, of,
             state_shard(g, op), strcmp(kind, "grad") == 0 || strcmp(kind, "load") == 0,
             placed_column(g, param_op(g->m, of_name)));
  } else {
    if (strcmp(name, "tokens") == 0) t->tokens = t->count;
    if (strcmp(name, "labels") == 0) t->labels = t->count;
    emit_row(g, name, "XM_RT_CAT_INPUTS", OUT(0), "XM_RT_INIT_NONE", 0.0, 0, -1, k_unsharded,
             false, 0);
  }
  t->count++;
}

/* Params, states and inputs in op order, then the two loss outputs. */
static void emit_table(gen_t *g, table_idx_t *t) {
  const xm_ir_op_t *ret = NULL;
  EMIT("/* name, category, dtype, rank, dims, persistent, offset, bytes, init, std, trainable, "
       "param, split_group, split_dim, chunk_group (group kind + 1, 0 = none), accumulator, "
       "placed */");
  EMIT("static const xm_rt_tensor_t k_tensors[] = {");
  xm_emit_indent(&g->e);
  for (int i = 0; i < xm_ir_module_num_ops(g->m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(g->m, i);
    g->op_index = i;
    if (op->code == XM_OP_RETURN) ret = op;
    if (op->code == XM_OP_PARAM || op->code == XM_OP_STATE || op->code == XM_OP_INPUT)
      emit_decl_row(g, op, t);
  }
  if (!ret || ret->num_operands < 1) {
    xm_diag_add(g->diag, XM_DIAG_ERROR, NULL, NULL, "the module has no return of the loss");
    if (g->st == XM_OK) g->st = XM_ERR_INTERNAL;
  } else {
    t->loss = t->count++;
    emit_row(g, "loss", "XM_RT_CAT_ACTIVATIONS", ret->operands[0], "XM_RT_INIT_NONE", 0.0, 0, -1,
             k_unsharded, false, 0);
    t->ce_loss = t->count++;
    emit_row(g, "ce_loss", "XM_RT_CAT_ACTIVATIONS", ret->operands[ret->num_operands > 1 ? 1 : 0],
             "XM_RT_INIT_NONE", 0.0, 0, -1, k_unsharded, false, 0);
    if (ret->num_operands > 2) {
      t->mtp_loss = t->count++;
      emit_row(g, "mtp_loss", "XM_RT_CAT_ACTIVATIONS", ret->operands[2], "XM_RT_INIT_NONE", 0.0,
               0, -1, k_unsharded, false, 0);
    }
  }
  xm_emit_dedent(&g->e);
  EMIT("};");
  xm_emit_blank(&g->e);
  if (t->tokens < 0 || t->labels < 0) {
    xm_diag_add(g->diag, XM_DIAG_ERROR, NULL, NULL,
                "the module lacks the inputs \"tokens\" and \"labels\"");
    if (g->st == XM_OK) g->st = XM_ERR_INTERNAL;
  }
}

/* ---- the program object ------------------------------------------------ */

static void emit_text_const(gen_t *g, const char *name, const char *text) {
  xm_strbuf_t s;
  xm_strbuf_init(&s);
  xm_strbuf_printf(&s, "static const char %s[] =\n    ", name);
  xm_codegen_c_string(&s, text ? text : "", 4);
  xm_strbuf_puts(&s, ";");
  EMIT("%s", xm_strbuf_cstr(&s));
  xm_strbuf_free(&s);
  xm_emit_blank(&g->e);
}

static void emit_settings(gen_t *g) {
  const xm_training_spec_t *t = &g->spec->training;
  EMIT(".vocab = " I64 ", .seq_len = " I64 ", .micro_batch = " I64 ", .grad_accum = " I64 ",",
       g->spec->model.vocab, t->seq_len, t->micro_batch,
       xm_ir_module_get_int(g->m, "grad_accum", 1));
  EMIT(".lr = %s, .min_lr = %s, .weight_decay = %s,", num(g, NULL, t->lr), num(g, NULL, t->min_lr),
       num(g, NULL, t->weight_decay));
  EMIT(".beta1 = %s, .beta2 = %s, .adam_eps = %s, .grad_clip = %s,", num(g, NULL, t->beta1),
       num(g, NULL, t->beta2), num(g, NULL, t->adam_eps), num(g, NULL, t->grad_clip));
  EMIT(".warmup_steps = " I64 ", .train_steps = " I64 ", .lr_schedule = %d, .seed = %" PRIu64 "u,",
       t->warmup_steps, t->train_steps, (int)t->lr_schedule, t->seed);
  const xm_ir_module_t *m = g->m;
  EMIT(".dp = " I64 ", .tp = " I64 ", .ep = " I64 ", .ssmb = " I64 ", .rbd = " I64 ", .zero = " I64
       ", .ranks_per_node = " I64 ",",
       xm_ir_module_get_int(m, "par_dp", 1), xm_ir_module_get_int(m, "par_tp", 1),
       xm_ir_module_get_int(m, "par_ep", 1), xm_ir_module_get_int(m, "par_ssmb", 0),
       xm_ir_module_get_int(m, "par_rbd", 0), xm_ir_module_get_int(m, "par_zero", 0),
       xm_ir_module_get_int(m, "par_rpn", 0));
}

/* The expert placement (module attrs placement_layers and placement, one
 * row of E experts per layer): two arrays the program points at. Returns
 * the rows (0: none). */
static int emit_placement(gen_t *g) {
  const xm_ir_attr_t *rows = xm_ir_module_find_attr(g->m, "placement_layers");
  const xm_ir_attr_t *slots = xm_ir_module_find_attr(g->m, "placement");
  int64_t E = g->spec->moe.experts;
  if (!rows && !slots) return 0;
  if (!rows || !slots || rows->kind != XM_ATTR_INTS || slots->kind != XM_ATTR_INTS ||
      rows->n < 1 || E < 1 || (int64_t)slots->n != rows->n * E) {
    xm_diag_add(g->diag, XM_DIAG_ERROR, NULL, NULL,
                "the module's placement attrs do not hold one row of %lld experts per layer",
                (long long)E);
    if (g->st == XM_OK) g->st = XM_ERR_INTERNAL;
    return 0;
  }
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  xm_strbuf_puts(&b, "static const int32_t k_placement_layers[] = {");
  for (int r = 0; r < rows->n; r++)
    xm_strbuf_printf(&b, "%s%" PRId64, r ? ", " : "", rows->ints[r]);
  xm_strbuf_puts(&b, "};");
  EMIT("/* Expert placement: slot p of layer k_placement_layers[r] holds expert");
  EMIT(" * k_placement[r * E + p] (Hugging Face numbering). */");
  EMIT("%s", xm_strbuf_cstr(&b));
  EMIT("static const int32_t k_placement[] = {");
  xm_emit_indent(&g->e);
  for (int r = 0; r < rows->n; r++) {
    xm_strbuf_clear(&b);
    for (int64_t p = 0; p < E; p++)
      xm_strbuf_printf(&b, "%" PRId64 ",%s", slots->ints[r * E + p],
                       p + 1 < E && (p + 1) % 16 ? " " : "");
    EMIT("%s", xm_strbuf_cstr(&b));
  }
  xm_emit_dedent(&g->e);
  EMIT("};");
  xm_emit_blank(&g->e);
  xm_strbuf_free(&b);
  return rows->n;
}

static void emit_program(gen_t *g, const table_idx_t *t, xm_mem_report_t *r) {
  int placement_rows = emit_placement(g);
  EMIT("const xm_rt_program_t xm_program = {");
  xm_emit_indent(&g->e);
  xm_strbuf_t name;
  xm_strbuf_init(&name);
  xm_codegen_c_string(&name, g->spec->name, 0);
  EMIT(".model_name = %s,", xm_strbuf_cstr(&name));
  xm_strbuf_free(&name);
  EMIT(".config_json = k_config_json,");
  EMIT(".spec_json = k_spec_json,");
  emit_settings(g);
  EMIT(".persistent_bytes = " I64 ", .activation_bytes = " I64 ",", r->persistent_bytes,
       r->activation_bytes);
  EMIT("/* weights, grads, optimizer, activations, workspace, inputs */");
  EMIT(".category_bytes = {" I64 ", " I64 ", " I64 ", " I64 ", " I64 ", " I64 "},", r->weights,
       r->grads, r->optimizer, r->activations, r->workspace, r->inputs);
  EMIT(".num_tensors = %d, .tensors = k_tensors,", t->count);
  EMIT(".tokens = %d, .labels = %d, .loss = %d, .ce_loss = %d,", t->tokens, t->labels, t->loss,
       t->ce_loss);
  if (t->mtp_loss >= 0)
    EMIT(".has_mtp = 1, .mtp_loss = %d, .mtp_loss_weight = %s,", t->mtp_loss,
         num(g, NULL, g->spec->training.mtp_loss_weight));
  if (placement_rows)
    EMIT(".placement_rows = %d, .placement_experts = " I64 ", .placement_nodes = " I64
         ", .placement_layers = k_placement_layers, .placement = k_placement,",
         placement_rows, g->spec->moe.experts,
         xm_ir_module_get_int(g->m, "placement_nodes", 0));
  else
    EMIT(".placement_experts = " I64 ",", g->spec->moe.experts);
  EMIT(".micro = micro, .step = step,");
  xm_emit_dedent(&g->e);
  EMIT("};");
}

/* The inputs named by a header; a line break in a path would end the
 * line comment, so control bytes become '?'. Returns the count. */
static int header_inputs(const xm_codegen_inputs_t *in, char bufs[2][512], const char *out[2]) {
  const char *src[2] = {in->spec_path ? in->spec_path : "<spec>", in->cluster_path};
  int n = 0;
  for (int i = 0; i < 2; i++) {
    if (!src[i]) continue;
    snprintf(bufs[n], 512, "%s", src[i]);
    for (char *p = bufs[n]; *p; p++)
      if ((unsigned char)*p < 0x20) *p = '?';
    out[n] = bufs[n];
    n++;
  }
  return n;
}

static void emit_header(gen_t *g, const xm_codegen_inputs_t *in) {
  char bufs[2][512];
  const char *inputs[2];
  xm_emit_header(&g->e, "//", header_inputs(in, bufs, inputs), inputs);
  if (in->pipeline) EMIT("// pipeline: %s", in->pipeline);
}

/* program.c for any target: gpu NULL (CPU: calls of the xm_k_* functions)
 * or "hip" / "cuda" (launches of the specialisations of out/kernels.hip,
 * whose two files go to kh and ksrc). */
static xm_status_t program(const xm_ir_module_t *m, const xm_spec_t *spec,
                           const xm_codegen_inputs_t *in, xm_diag_t *diag, xm_strbuf_t *out,
                           const char *gpu, xm_strbuf_t *kh, xm_strbuf_t *ksrc) {
  xm_mem_report_t report;
  XM_RETURN_IF_ERROR(xm_plan_memory_read_report(m, diag, &report));
  if (xm_ir_module_get_int(m, "schedule_micro_ops", -1) < 0) {
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL,
                "the module was not scheduled (run the schedule pass before codegen)");
    return XM_ERR_INTERNAL;
  }
  struct gpu_specs specs = {NULL, 0, 0};
  gen_t gen = {.m = m, .spec = spec, .diag = diag, .st = XM_OK, .gpu = gpu ? &specs : NULL};
  gen_t *g = &gen;
  g->rows_src = calloc((size_t)xm_ir_module_num_values(m) + 1, sizeof(int));
  g->acc_of = calloc((size_t)xm_ir_module_num_values(m) + 1, sizeof(int));
  g->host_of = calloc((size_t)xm_ir_module_num_values(m) + 1, sizeof(int));
  if (!g->rows_src || !g->acc_of || !g->host_of) {
    free(g->rows_src);
    free(g->acc_of);
    free(g->host_of);
    return XM_ERR_NO_MEMORY;
  }
  xm_emitter_init(&g->e, out);
  compute_rows_src(g);
  compute_acc_fusion(g);
  compute_host_reads(g);

  emit_header(g, in);
  xm_emit_blank(&g->e);
  EMIT("#include <math.h>");
  EMIT("#include <stdint.h>");
  EMIT("#include <string.h>");
  xm_emit_blank(&g->e);
  EMIT("#include \"runtime/abi/program.h\"");
  EMIT("#include \"runtime/comm/spmd.h\"");
  if (gpu)
    EMIT("#include \"kernels.h\" /* the launches of out/kernels.hip */");
  else
    EMIT("#include \"runtime/cpu/kernels.h\"");
  EMIT("#include \"runtime/driver/trace.h\"");
  EMIT("#include \"runtime/moe/rbd_exec.h\"");
  EMIT("#include \"runtime/moe/routing_stats.h\"");
  xm_emit_blank(&g->e);
  table_idx_t t = {
      .tokens = -1, .labels = -1, .loss = -1, .ce_loss = -1, .mtp_loss = -1, .count = 0};
  emit_table(g, &t);
  emit_text_const(g, "k_config_json", in->config_json);
  emit_text_const(g, "k_spec_json", in->spec_text);
  EMIT("/* One micro-batch: forward, backward, gradient accumulation. */");
  emit_function(g, "micro", false);
  EMIT("/* One optimizer step, after the last micro-batch. */");
  emit_function(g, "step", true);
  emit_program(g, &t, &report);
  if (gpu && g->st == XM_OK) emit_gpu_files(g, in, gpu, kh, ksrc);
  free(specs.v);
  free(g->rows_src);
  free(g->acc_of);
  free(g->host_of);
  return g->st;
}

xm_status_t xm_codegen_program_c(const xm_ir_module_t *m, const xm_spec_t *spec,
                                 const xm_codegen_inputs_t *in, xm_diag_t *diag, xm_strbuf_t *out) {
  return program(m, spec, in, diag, out, NULL, NULL, NULL);
}

xm_status_t xm_codegen_program_gpu(const xm_ir_module_t *m, const xm_spec_t *spec,
                                   const xm_codegen_inputs_t *in, const char *target,
                                   xm_diag_t *diag, xm_strbuf_t *out, xm_strbuf_t *kernels_h,
                                   xm_strbuf_t *kernels_src) {
  return program(m, spec, in, diag, out, target, kernels_h, kernels_src);
}

static void emit_gpu_files(gen_t *g, const xm_codegen_inputs_t *in, const char *target,
                           xm_strbuf_t *kh, xm_strbuf_t *ksrc) {
  struct gpu_specs *s = g->gpu;
  char bufs[2][512];
  const char *inputs[2];
  int ninputs = header_inputs(in, bufs, inputs);
  xm_emitter_t e;
  xm_emitter_init(&e, kh);
  xm_emit_header(&e, "//", ninputs, inputs);
  xm_emit(&e, "// The launches of out/kernels.hip that out/program.c calls (target %s).", target);
  xm_emit(&e, "#ifndef XM_GENERATED_KERNELS_H");
  xm_emit(&e, "#define XM_GENERATED_KERNELS_H");
  xm_emit_blank(&e);
  xm_emit(&e, "#include <stdint.h>");
  xm_emit_blank(&e);
  xm_emit(&e, "#include \"runtime/abi/backend.h\"");
  xm_emit(&e, "#include \"runtime/abi/kernels.h\"");
  xm_emit_blank(&e);
  xm_emit(&e, "#ifdef __cplusplus");
  xm_emit(&e, "extern \"C\" {");
  xm_emit(&e, "#endif");
  xm_strbuf_t line;
  xm_strbuf_init(&line);
  for (int i = 0; i < s->n; i++) {
    const xm_rt_kernel_signature_t *sig = &xm_rt_kernel_signatures[s->v[i].kernel];
    ksig_arg_t want[32];
    int m = parse_signature(sig->args, want, 32);
    xm_strbuf_clear(&line);
    gpu_params(&line, want, m);
    xm_emit(&e, "void xmg_%d(%s); /* %s */", i, xm_strbuf_cstr(&line), sig->name);
  }
  xm_emit(&e, "#ifdef __cplusplus");
  xm_emit(&e, "}");
  xm_emit(&e, "#endif");
  xm_emit(&e, "#endif");

  xm_emitter_init(&e, ksrc);
  xm_emit_header(&e, "//", ninputs, inputs);
  xm_emit(&e, "// Every kernel the schedule of out/program.c launches, specialised to its");
  xm_emit(&e, "// shapes: a size >= 0 is a compile-time constant of the launch's shape type,");
  xm_emit(&e, "// -1 a run-time value. One text for both vendors: hipcc compiles it for AMD,");
  xm_emit(&e, "// nvcc for NVIDIA, a C++ compiler for the emulated GPU (runtime/gpu/xm_gpu.h).");
  xm_emit(&e, "// Generated for target %s; tiles: runtime/gpu/tiles.h.", target);
  xm_emit_blank(&e);
  xm_emit(&e, "#include \"kernels.h\"");
  xm_emit(&e, "#include \"runtime/gpu/kernels/all.cuh\"");
  for (int i = 0; i < s->n; i++) {
    const xm_rt_kernel_signature_t *sig = &xm_rt_kernel_signatures[s->v[i].kernel];
    ksig_arg_t want[32];
    int m = parse_signature(sig->args, want, 32);
    xm_emit_blank(&e);
    xm_strbuf_clear(&line);
    xm_strbuf_printf(&line, "struct xmg_s%d {", i);
    int sizes = 0;
    for (int a = 0; a < m && a < GPU_MAX_ARGS; a++) {
      if (want[a].kind != KA_I64) continue;
      sizes++;
      if (s->v[i].val[a] >= 0)
        xm_strbuf_printf(&line, " XM_SHAPE_CONST(%s, %" PRId64 ")", want[a].name, s->v[i].val[a]);
      else
        xm_strbuf_printf(&line, " XM_SHAPE_DYN(%s)", want[a].name);
    }
    xm_emit(&e, "// %s, first launched by op %d%s", sig->name, s->v[i].first_op,
            sizes ? "" : " (no sizes)");
    xm_strbuf_puts(&line, " };");
    xm_emit(&e, "%s", xm_strbuf_cstr(&line));
    xm_strbuf_clear(&line);
    gpu_params(&line, want, m);
    xm_emit(&e, "extern \"C\" void xmg_%d(%s) {", i, xm_strbuf_cstr(&line));
    xm_strbuf_clear(&line);
    for (int a = 0; a < m; a++) xm_strbuf_printf(&line, ", %s", want[a].name);
    xm_emit(&e, "  xm_g_%s<xmg_s%d>((xm_stream_t)s%s);", sig->name, i, xm_strbuf_cstr(&line));
    xm_emit(&e, "}");
  }
  xm_strbuf_free(&line);
}

void xm_codegen_main_c(const xm_codegen_inputs_t *in, xm_strbuf_t *out) {
  xm_emitter_t e;
  xm_emitter_init(&e, out);
  char bufs[2][512];
  const char *inputs[2];
  xm_emit_header(&e, "//", header_inputs(in, bufs, inputs), inputs);
  xm_emit_blank(&e);
  xm_emit(&e, "#include \"runtime/driver/train.h\"");
  xm_emit_blank(&e);
  xm_emit(&e, "int main(int argc, char **argv) { return xm_rt_train_main(argc, argv, "
              "&xm_program); }");
}

void xm_codegen_c_string(xm_strbuf_t *out, const char *s, int indent) {
  xm_strbuf_puts(out, "\"");
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') {
      char esc[3] = {'\\', (char)*p, 0};
      xm_strbuf_puts(out, esc);
    } else if (*p == '\n') {
      xm_strbuf_puts(out, "\\n");
      if (p[1] != '\0') {
        xm_strbuf_puts(out, "\"\n");
        for (int i = 0; i < indent; i++)
          xm_strbuf_puts(out, " ");
        xm_strbuf_puts(out, "\"");
      }
    } else if (*p == '\t') {
      xm_strbuf_puts(out, "\\t");
    } else if (*p < 0x20 || *p >= 0x7f || (*p == '?' && p[1] == '?')) {
      xm_strbuf_printf(out, "\\%03o", *p); /* also keeps "??" from forming trigraphs */
    } else {
      xm_strbuf_append(out, (const char *)p, 1);
    }
  }
  xm_strbuf_puts(out, "\"");
}
