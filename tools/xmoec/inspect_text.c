/* tools/xmoec/inspect_text.c — `xmoec inspect` as text and as Graphviz dot.
 *
 * Text: five sections, each a heading "== name ==" and aligned rows, meant
 * for a terminal and for grep (docs/inspect.md shows one):
 *   schedule          ops, FLOPs and predicted time per phase, per step;
 *   ops by kind       the same per op name;
 *   memory            the plan's peak by category and the activation peak;
 *   memory timeline   activation bytes in use per (phase, layer) stretch;
 *   collectives       every collective per layer: group, members, payload,
 *                     bytes rank 0 sends, traffic class, predicted time;
 *                     then the step's totals per class.
 * Dot: one node per op (params and states small and grey, collectives
 * orange with their group), an edge per operand.
 */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ir/text.h"
#include "tools/xmoec/inspect.h"

#define P(...) xm_strbuf_printf(out, __VA_ARGS__)

static void put_layout(const xm_inspect_t *ins, xm_strbuf_t *out) {
  char name[96];
  xm_layout_format(&ins->layout, name, sizeof name);
  P("%s, %" PRId64 " rank%s (%" PRId64 " per node)", name, ins->world, ins->world == 1 ? "" : "s",
    ins->rpn);
}

static void header(const xm_inspect_t *ins, xm_strbuf_t *out) {
  P("program %s (%s): ", ins->model, ins->dir);
  put_layout(ins, out);
  P("; micro-batch %" PRId64 " x %" PRId64 " tokens, %" PRId64
    " micro-batch%s per optimizer step\n",
    ins->micro_batch, ins->seq_len, ins->grad_accum, ins->grad_accum == 1 ? "" : "es");
  if (ins->pipeline[0]) P("pipeline: %s\n", ins->pipeline);
  P("machine: %s\n", ins->machine);
}

static void schedule(const xm_inspect_t *ins, xm_strbuf_t *out) {
  P("\n== schedule (per rank, one optimizer step) ==\n");
  P("%-6s %6s %6s %5s %12s %12s %11s %14s\n", "phase", "ops", "traced", "runs", "GEMM GFLOP",
    "all GFLOP", "collectives", "predicted");
  double tot_gemm = 0, tot_all = 0, tot_t = 0, tot_comm_t = 0;
  for (int ph = 0; ph < XM_INS_PHASES; ph++) {
    int n = 0, traced = 0, comm = 0;
    double gemm = 0, all = 0, t = 0, runs = ph == XM_INS_STEP ? 1 : (double)ins->grad_accum;
    for (int i = 0; i < ins->num_ops; i++) {
      const xm_ins_op_t *o = &ins->ops[i];
      if ((int)o->phase != ph) continue;
      n++, traced += o->traced, comm += o->comm;
      double r = (double)xm_inspect_runs(ins, o); /* overlapped reductions: once per step */
      gemm += o->gemm ? o->flops * r : 0;
      all += o->flops * r;
      t += o->seconds * r;
      if (o->comm) tot_comm_t += o->seconds * r;
    }
    xm_strbuf_t ts;
    xm_strbuf_init(&ts);
    xm_inspect_put_seconds(&ts, t);
    P("%-6s %6d %6d %5.0f %12.3f %12.3f %11d %14s\n", xm_inspect_phase_name((xm_ins_phase_t)ph), n,
      traced, runs, gemm / 1e9, all / 1e9, comm, xm_strbuf_cstr(&ts));
    xm_strbuf_free(&ts);
    tot_gemm += gemm, tot_all += all, tot_t += t;
  }
  xm_strbuf_t ts;
  xm_strbuf_init(&ts);
  xm_inspect_put_seconds(&ts, tot_t);
  P("%-6s %6d %6s %5s %12.3f %12.3f %11s %14s\n", "total", ins->num_ops, "", "", tot_gemm / 1e9,
    tot_all / 1e9, "", xm_strbuf_cstr(&ts));
  xm_strbuf_clear(&ts);
  xm_inspect_put_seconds(&ts, tot_comm_t);
  P("predicted step %.6f s (collectives %s), %.3f GFLOP/s per rank; nothing overlaps\n", tot_t,
    xm_strbuf_cstr(&ts), tot_t > 0 ? tot_all / tot_t / 1e9 : 0.0);
  xm_strbuf_free(&ts);
}

static void by_kind(const xm_inspect_t *ins, xm_strbuf_t *out) {
  P("\n== ops by kind (per rank) ==\n");
  P("%-28s %5s %5s %5s %14s %14s\n", "kind", "fwd", "bwd", "step", "GFLOP/step", "predicted/step");
  for (int code = 0; code < XM_OP_COUNT_; code++) {
    int count[XM_INS_PHASES] = {0};
    double flops = 0, t = 0;
    for (int i = 0; i < ins->num_ops; i++) {
      const xm_ins_op_t *o = &ins->ops[i];
      if ((int)o->op->code != code) continue;
      count[o->phase]++;
      flops += o->flops * (double)xm_inspect_runs(ins, o);
      t += o->seconds * (double)xm_inspect_runs(ins, o);
    }
    if (!count[0] && !count[1] && !count[2]) continue;
    xm_strbuf_t ts;
    xm_strbuf_init(&ts);
    xm_inspect_put_seconds(&ts, t);
    P("%-28s %5d %5d %5d %14.3f %14s\n", xm_ir_opinfo((xm_ir_opcode_t)code)->name, count[0],
      count[1], count[2], flops / 1e9, xm_strbuf_cstr(&ts));
    xm_strbuf_free(&ts);
  }
}

static void memory(const xm_inspect_t *ins, xm_strbuf_t *out) {
  const xm_mem_report_t *r = &ins->mem;
  P("\n== memory (per rank, from the memory plan) ==\n");
  const struct {
    const char *name;
    int64_t v;
  } rows[] = {{"weights", r->weights},
              {"gradients", r->grads},
              {"optimizer", r->optimizer},
              {"activations", r->activations},
              {"workspace", r->workspace},
              {"total", r->weights + r->grads + r->optimizer + r->activations + r->workspace}};
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    P("%-12s %14" PRId64 " B  ", rows[i].name, rows[i].v);
    xm_inspect_put_bytes(out, (double)rows[i].v);
    P("\n");
  }
  P("activation arena %" PRId64 " B; ", r->activation_bytes);
  if (ins->num_ops > 0) {
    const xm_ins_op_t *o = &ins->ops[ins->act_peak_at];
    P("peak in use %" PRId64 " B (", ins->act_peak);
    xm_inspect_put_bytes(out, (double)ins->act_peak);
    P(") during op %d %s (%s", o->index, o->name, xm_inspect_phase_name(o->phase));
    if (o->layer >= 0) P(", layer %d", o->layer);
    P(")");
    if (r->activation_bytes > ins->act_peak) {
      P("; ");
      xm_inspect_put_bytes(out, (double)(r->activation_bytes - ins->act_peak));
      P(" of the arena is fragmentation");
    }
    P("\n");
  } else {
    P("no ops\n");
  }
}

static void timeline(const xm_inspect_t *ins, xm_strbuf_t *out) {
  P("\n== memory timeline (activation arena in use, execution order) ==\n");
  P("%-12s %-5s %5s %16s %16s\n", "ops", "phase", "layer", "peak in use", "at end");
  for (int s = 0; s < ins->num_ops;) {
    const xm_ins_op_t *a = &ins->ops[s];
    int e = s;
    int64_t peak = 0;
    while (e < ins->num_ops && ins->ops[e].phase == a->phase && ins->ops[e].layer == a->layer) {
      if (ins->ops[e].act_in_use > peak) peak = ins->ops[e].act_in_use;
      e++;
    }
    char span[32], layer[16];
    snprintf(span, sizeof span, "%d-%d", a->index, ins->ops[e - 1].index);
    snprintf(layer, sizeof layer, a->layer >= 0 ? "%d" : "-", a->layer);
    xm_strbuf_t p, end;
    xm_strbuf_init(&p), xm_strbuf_init(&end);
    xm_inspect_put_bytes(&p, (double)peak);
    xm_inspect_put_bytes(&end, (double)ins->ops[e - 1].act_in_use);
    P("%-12s %-5s %5s %16s %16s\n", span, xm_inspect_phase_name(a->phase), layer,
      xm_strbuf_cstr(&p), xm_strbuf_cstr(&end));
    xm_strbuf_free(&p), xm_strbuf_free(&end);
    s = e;
  }
}

static xm_ins_class_t main_class(const xm_ins_op_t *o) {
  int best = XM_INS_OTHER;
  for (int c = 0; c < XM_INS_CLASSES; c++)
    if (o->sent[c] > o->sent[best]) best = c;
  return (xm_ins_class_t)best;
}

static void collective_row(const xm_ins_op_t *o, xm_strbuf_t *out) {
  xm_strbuf_t pay, sent, in, ex, t;
  xm_strbuf_init(&pay), xm_strbuf_init(&sent), xm_strbuf_init(&in), xm_strbuf_init(&ex);
  xm_strbuf_init(&t);
  xm_inspect_put_bytes(&pay, o->payload);
  xm_inspect_put_bytes(&sent, o->sent_intra + o->sent_inter);
  xm_inspect_put_bytes(&in, o->sent_intra);
  xm_inspect_put_bytes(&ex, o->sent_inter);
  xm_inspect_put_seconds(&t, o->seconds);
  P("  op %-5d %-20s %-4s group %-4s (%" PRId64 " ranks)  payload %-11s sent %-11s (intra %s, "
    "inter %s)  %-14s %s\n",
    o->index, o->name, xm_inspect_phase_name(o->phase), o->group ? o->group : "-", o->group_size,
    xm_strbuf_cstr(&pay), xm_strbuf_cstr(&sent), xm_strbuf_cstr(&in), xm_strbuf_cstr(&ex),
    xm_inspect_class_name(main_class(o)), xm_strbuf_cstr(&t));
  xm_strbuf_free(&pay), xm_strbuf_free(&sent), xm_strbuf_free(&in), xm_strbuf_free(&ex);
  xm_strbuf_free(&t);
}

static void collectives(const xm_inspect_t *ins, xm_strbuf_t *out) {
  P("\n== collectives (rank 0: group, members, bytes per call) ==\n");
  int max_layer = -1, count = 0;
  for (int i = 0; i < ins->num_ops; i++) {
    if (ins->ops[i].layer > max_layer) max_layer = ins->ops[i].layer;
    count += ins->ops[i].comm;
  }
  if (count == 0) P("none: the program runs on one rank\n");
  for (int layer = 0; layer <= max_layer + 1; layer++) {
    int want = layer <= max_layer ? layer : -1, shown = 0;
    for (int i = 0; i < ins->num_ops; i++) {
      const xm_ins_op_t *o = &ins->ops[i];
      if (!o->comm || o->layer != want) continue;
      if (!shown++) {
        if (want >= 0)
          P("layer %d:\n", want);
        else
          P("no layer:\n");
      }
      collective_row(o, out);
    }
  }
  if (count == 0) return;
  P("per optimizer step, rank 0 sends:\n");
  double total[2] = {0, 0};
  for (int c = 0; c < XM_INS_CLASSES; c++) {
    double sum = 0, intra = 0;
    for (int i = 0; i < ins->num_ops; i++) {
      const xm_ins_op_t *o = &ins->ops[i];
      double all = o->sent_intra + o->sent_inter, runs = (double)xm_inspect_runs(ins, o);
      sum += o->sent[c] * runs;
      intra += all > 0 ? o->sent[c] * runs * o->sent_intra / all : 0;
    }
    P("  %-15s %16.0f B (intra %.0f, inter %.0f)\n", xm_inspect_class_name((xm_ins_class_t)c), sum,
      intra, sum - intra);
    total[0] += intra, total[1] += sum - intra;
  }
  P("  %-15s %16.0f B (intra %.0f, inter %.0f)\n", "total", total[0] + total[1], total[0],
    total[1]);
}

void xm_inspect_text(const xm_inspect_t *ins, xm_strbuf_t *out) {
  header(ins, out);
  schedule(ins, out);
  by_kind(ins, out);
  memory(ins, out);
  timeline(ins, out);
  collectives(ins, out);
}

/* ---- dot --------------------------------------------------------------- */

static void dot_quoted(xm_strbuf_t *out, const char *s) {
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') xm_strbuf_append(out, "\\", 1);
    if ((unsigned char)*s >= 0x20) xm_strbuf_append(out, s, 1);
  }
}

static const char *const k_fill[XM_INS_PHASES] = {"#e8f1fb", "#fdf0dc", "#e7f5e7"};

void xm_inspect_dot(const xm_inspect_t *ins, xm_strbuf_t *out) {
  const xm_ir_module_t *m = ins->m;
  int nv = xm_ir_module_num_values(m);
  int *def = malloc(((size_t)nv + 1) * sizeof *def); /* value id -> op index */
  int *num = malloc(((size_t)nv + 1) * sizeof *num); /* value id -> printed %number */
  if (!def || !num) {
    free(def), free(num);
    return;
  }
  P("digraph \"");
  dot_quoted(out, ins->model);
  P("\" {\n  graph [rankdir=TB, fontname=\"Helvetica\", label=\"");
  dot_quoted(out, ins->model);
  P(": ");
  char layout[96];
  xm_layout_format(&ins->layout, layout, sizeof layout);
  dot_quoted(out, layout);
  P(", one rank's program\"];\n");
  P("  node [shape=box, style=\"rounded,filled\", fillcolor=\"#ffffff\", fontname=\"Helvetica\", "
    "fontsize=10];\n  edge [color=\"#888888\"];\n");
  int next = 0;
  xm_strbuf_t label;
  xm_strbuf_init(&label);
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    xm_strbuf_clear(&label);
    bool decl = xm_ir_op_is_declaration(op);
    for (int j = 0; j < op->num_results; j++) {
      def[op->results[j]->id] = i;
      num[op->results[j]->id] = next++;
    }
    if (decl) {
      xm_strbuf_puts(&label, xm_ir_op_get_string(op, "name", xm_ir_opinfo(op->code)->name));
    } else {
      for (int j = 0; j < op->num_results; j++)
        xm_strbuf_printf(&label, "%s%%%d", j ? ", " : "", num[op->results[j]->id]);
      xm_strbuf_printf(&label, "%s%s", op->num_results ? " = " : "", xm_ir_opinfo(op->code)->name);
    }
    for (int j = 0; j < op->num_results; j++) {
      xm_strbuf_puts(&label, j ? ", " : "\n");
      xm_ir_print_type(&op->results[j]->type, &label);
    }
    bool comm = (xm_ir_opinfo(op->code)->flags & XM_OPF_COMM) != 0;
    const char *group = xm_ir_op_get_string(op, "group", NULL);
    if (comm && group)
      xm_strbuf_printf(&label, "\ngroup %s (%" PRId64 ")", group,
                       xm_ir_op_get_int(op, "group_size", 0));
    P("  op%d [label=\"", i);
    /* dot_quoted drops control characters: spell the line breaks */
    for (const char *s = xm_strbuf_cstr(&label); *s; s++) {
      if (*s == '\n')
        P("\\n");
      else if (*s == '"' || *s == '\\')
        P("\\%c", *s);
      else if ((unsigned char)*s >= 0x20)
        xm_strbuf_append(out, s, 1);
    }
    P("\"");
    if (decl)
      P(", shape=note, fontsize=7, height=0.2, fillcolor=\"#eeeeee\", color=\"#aaaaaa\"");
    else if (comm)
      P(", fillcolor=\"#f4a261\", penwidth=2, fontname=\"Helvetica-Bold\"");
    else {
      const char *ph = xm_ir_op_get_string(op, "phase", "fwd");
      int p = strcmp(ph, "bwd") == 0 ? 1 : strcmp(ph, "step") == 0 ? 2 : 0;
      P(", fillcolor=\"%s\"", k_fill[p]);
    }
    P("];\n");
    for (int j = 0; j < op->num_operands; j++)
      P("  op%d -> op%d;\n", def[op->operands[j]->id], i);
  }
  P("}\n");
  xm_strbuf_free(&label);
  free(def), free(num);
}
