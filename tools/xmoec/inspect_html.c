/* tools/xmoec/inspect_html.c — `xmoec inspect --format html`: one
 * self-contained page (inline CSS and SVG; no script, font, image or
 * style sheet from anywhere else, so it renders offline in any browser).
 *
 * Charts, each an <svg> drawn here with plain rectangles, lines and text,
 * in a viewBox so that it scales to the page's width:
 *   memory breakdown   the plan's peak per category, one stacked bar, against
 *                      the device's capacity when the cluster gives it;
 *   rank layout        the ranks on their nodes, filled by TP group, with
 *                      each rank's EP and DP group (the first nodes of a
 *                      large world: the pattern repeats);
 *   time per phase     predicted seconds of fwd, bwd and step per optimizer
 *                      step, compute and collectives stacked;
 *   bytes per layer    what rank 0 sends per step in each layer, stacked by
 *                      traffic class (the reductions of the step phase
 *                      carry their param's layer; "-" is no layer);
 *   memory timeline    activation bytes in use over the schedule, with the
 *                      arena size.
 * The text report follows in a <pre>, so the page holds everything the
 * text format says.
 */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tools/xmoec/inspect.h"

#define P(...) xm_strbuf_printf(out, __VA_ARGS__)

static void esc(xm_strbuf_t *out, const char *s) {
  for (; *s; s++) {
    switch (*s) {
    case '&': xm_strbuf_puts(out, "&amp;"); break;
    case '<': xm_strbuf_puts(out, "&lt;"); break;
    case '>': xm_strbuf_puts(out, "&gt;"); break;
    case '"': xm_strbuf_puts(out, "&quot;"); break;
    default:
      if ((unsigned char)*s >= 0x20 || *s == '\n') xm_strbuf_append(out, s, 1);
    }
  }
}

static void bytes_text(xm_strbuf_t *out, double b) {
  xm_strbuf_t t;
  xm_strbuf_init(&t);
  xm_inspect_put_bytes(&t, b);
  esc(out, xm_strbuf_cstr(&t));
  xm_strbuf_free(&t);
}

static void seconds_text(xm_strbuf_t *out, double s) {
  xm_strbuf_t t;
  xm_strbuf_init(&t);
  xm_inspect_put_seconds(&t, s);
  esc(out, xm_strbuf_cstr(&t));
  xm_strbuf_free(&t);
}

static const char *const k_colors[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759",
                                       "#76b7b2", "#edc948", "#b07aa1", "#9c755f"};

static void legend(xm_strbuf_t *out, const char *const *names, int n, double y) {
  double x = 10;
  for (int i = 0; i < n; i++) {
    P("<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"%s\"/>", x, y, k_colors[i]);
    P("<text x=\"%.1f\" y=\"%.1f\">", x + 16, y + 10);
    esc(out, names[i]);
    P("</text>");
    x += 24 + 7.0 * (double)strlen(names[i]);
  }
  P("\n");
}

/* ---- charts ------------------------------------------------------------ */

static void memory_chart(const xm_inspect_t *ins, xm_strbuf_t *out) {
  const xm_mem_report_t *r = &ins->mem;
  const char *names[] = {"weights", "gradients", "optimizer", "activations", "workspace"};
  double v[] = {(double)r->weights, (double)r->grads, (double)r->optimizer, (double)r->activations,
                (double)r->workspace};
  double total = 0;
  for (int i = 0; i < 5; i++)
    total += v[i];
  const double dev = ins->device_bytes, scale = fmax(total, dev);
  P("<h2>Memory per rank</h2>\n<p>Peak by category from the memory plan: ");
  bytes_text(out, total);
  P(" in all");
  if (dev > 0) {
    P(" of the device's ");
    bytes_text(out, dev);
    P(" (%.0f%%; the runtime's own context and library workspaces come on top)",
      100.0 * total / dev);
  }
  P(".</p>\n<svg class=\"chart\" viewBox=\"0 0 760 110\" role=\"img\" "
    "aria-label=\"memory breakdown\">\n");
  double x = 10, w = 740;
  for (int i = 0; i < 5; i++) {
    double bw = scale > 0 ? w * v[i] / scale : 0;
    P("<rect x=\"%.2f\" y=\"10\" width=\"%.2f\" height=\"40\" fill=\"%s\"><title>", x, bw,
      k_colors[i]);
    esc(out, names[i]);
    P(": ");
    bytes_text(out, v[i]);
    P("</title></rect>\n");
    x += bw;
  }
  if (dev > 0) { /* the device's capacity: a line at its place on the bar's scale */
    double dx = 10 + w * dev / scale;
    P("<line x1=\"%.2f\" y1=\"4\" x2=\"%.2f\" y2=\"56\" stroke=\"%s\" stroke-width=\"2\"/>"
      "<text x=\"%.2f\" y=\"8\" class=\"small\" text-anchor=\"end\">device ",
      dx, dx, total > dev ? "#c00" : "#222", dx - 3);
    bytes_text(out, dev);
    P("</text>\n");
  }
  legend(out, names, 5, 62);
  x = 10;
  P("<text x=\"10\" y=\"100\">");
  for (int i = 0; i < 5; i++) {
    esc(out, names[i]);
    P(" ");
    bytes_text(out, v[i]);
    P(i < 4 ? ", " : "");
  }
  P("</text>\n</svg>\n");
}

/* The ranks on their nodes: one row per node, a box per rank filled by its
 * TP group, labelled with the rank and, below, its EP and DP groups (as
 * group colors: the members of a group share the number). Worlds larger
 * than the drawing show their first nodes and ranks; the groups are
 * arithmetic progressions of ranks (frontend/layout.h), so the rest
 * repeats the pattern. */
#define LAYOUT_MAX_NODES 4
#define LAYOUT_MAX_RANKS 16
static void layout_chart(const xm_inspect_t *ins, xm_strbuf_t *out) {
  const xm_layout_t *l = &ins->layout;
  int64_t rpn = ins->rpn > 0 ? ins->rpn : ins->world, nodes = ins->world / rpn;
  int64_t show_nodes = nodes < LAYOUT_MAX_NODES ? nodes : LAYOUT_MAX_NODES;
  int64_t show_ranks = rpn < LAYOUT_MAX_RANKS ? rpn : LAYOUT_MAX_RANKS;
  P("<h2>Rank layout</h2>\n<p>%" PRId64 " rank%s on %" PRId64 " node%s of %" PRId64
    ": boxes are ranks, filled by TP group (%" PRId64 " rank%s each); below each, its EP group "
    "(%" PRId64 " ranks) and DP group (%" PRId64 " ranks), numbered by their first rank.",
    ins->world, ins->world == 1 ? "" : "s", nodes, nodes == 1 ? "" : "s", rpn, l->tp,
    l->tp == 1 ? "" : "s", xm_layout_group_size(l, XM_GROUP_EP),
    xm_layout_group_size(l, XM_GROUP_DP));
  if (show_nodes < nodes || show_ranks < rpn)
    P(" Showing %" PRId64 " of %" PRId64 " nodes and %" PRId64 " of %" PRId64
      " ranks per node; the groups repeat the pattern.",
      show_nodes, nodes, show_ranks, rpn);
  P("</p>\n");
  const double x0 = 70, box = fmin(40, (760 - x0 - 10) / (double)show_ranks), row = 62;
  int h = (int)(row * (double)show_nodes) + 30;
  P("<svg class=\"chart\" viewBox=\"0 0 760 %d\" role=\"img\" aria-label=\"rank layout\">\n", h);
  P("<text x=\"%.1f\" y=\"14\" class=\"small\">rank / ep group / dp group</text>\n", x0);
  for (int64_t n = 0; n < show_nodes; n++) {
    double y = 22 + row * (double)n;
    P("<text x=\"4\" y=\"%.1f\">node %" PRId64 "</text>\n", y + box / 2 + 4, n);
    for (int64_t i = 0; i < show_ranks; i++) {
      int64_t r = n * rpn + i;
      xm_group_t tp = xm_layout_group(l, XM_GROUP_TP, r), ep = xm_layout_group(l, XM_GROUP_EP, r),
                 dp = xm_layout_group(l, XM_GROUP_DP, r);
      double x = x0 + box * (double)i;
      P("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\" "
        "fill-opacity=\"0.55\" stroke=\"#fff\"><title>rank %" PRId64 ": tp group of rank %" PRId64
        ", ep group of rank %" PRId64 ", dp group of rank %" PRId64 "</title></rect>",
        x, y, box, box, k_colors[((tp.color % 8) + 8) % 8], r, tp.first, ep.first, dp.first);
      P("<text x=\"%.1f\" y=\"%.1f\" class=\"small\" text-anchor=\"middle\">%" PRId64 "</text>",
        x + box / 2, y + box / 2 + 4, r);
      P("<text x=\"%.1f\" y=\"%.1f\" class=\"small\" text-anchor=\"middle\">%" PRId64 "/%" PRId64
        "</text>\n",
        x + box / 2, y + box + 11, ep.first, dp.first);
    }
  }
  P("</svg>\n");
}

static void phase_chart(const xm_inspect_t *ins, xm_strbuf_t *out) {
  double comp[XM_INS_PHASES] = {0}, comm[XM_INS_PHASES] = {0}, max = 0, total = 0;
  for (int i = 0; i < ins->num_ops; i++) {
    const xm_ins_op_t *o = &ins->ops[i];
    double t = o->seconds * (double)xm_inspect_runs(ins, o);
    (o->comm ? comm : comp)[o->phase] += t;
    total += t;
  }
  for (int p = 0; p < XM_INS_PHASES; p++)
    max = fmax(max, comp[p] + comm[p]);
  P("<h2>Predicted time per phase</h2>\n<p>One optimizer step (%" PRId64 " micro-batch%s): ",
    ins->grad_accum, ins->grad_accum == 1 ? "" : "es");
  seconds_text(out, total);
  P(" on the machine model below; nothing overlaps.</p>\n");
  P("<svg class=\"chart\" viewBox=\"0 0 760 150\" role=\"img\" aria-label=\"time per "
    "phase\">\n");
  for (int p = 0; p < XM_INS_PHASES; p++) {
    double y = 10 + 32.0 * p, w = 560, a = max > 0 ? w * comp[p] / max : 0,
           b = max > 0 ? w * comm[p] / max : 0;
    P("<text x=\"10\" y=\"%.1f\">%s</text>", y + 16, xm_inspect_phase_name((xm_ins_phase_t)p));
    P("<rect x=\"60\" y=\"%.1f\" width=\"%.2f\" height=\"22\" fill=\"%s\"><title>compute ", y, a,
      k_colors[0]);
    seconds_text(out, comp[p]);
    P("</title></rect>");
    P("<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"22\" fill=\"%s\"><title>collectives ",
      60 + a, y, b, k_colors[1]);
    seconds_text(out, comm[p]);
    P("</title></rect>");
    P("<text x=\"%.2f\" y=\"%.1f\">", 66 + a + b, y + 16);
    seconds_text(out, comp[p] + comm[p]);
    P("</text>\n");
  }
  const char *names[] = {"compute", "collectives"};
  legend(out, names, 2, 112);
  P("</svg>\n");
}

static void layer_chart(const xm_inspect_t *ins, xm_strbuf_t *out) {
  int max_layer = -1;
  for (int i = 0; i < ins->num_ops; i++)
    if (ins->ops[i].layer > max_layer) max_layer = ins->ops[i].layer;
  int slots = max_layer + 2; /* layers, then "no layer" */
  double *v = calloc((size_t)slots * XM_INS_CLASSES, sizeof *v);
  if (!v) return;
  double max = 0, total = 0;
  for (int i = 0; i < ins->num_ops; i++) {
    const xm_ins_op_t *o = &ins->ops[i];
    int s = o->layer >= 0 ? o->layer : slots - 1;
    for (int c = 0; c < XM_INS_CLASSES; c++) {
      double b = o->sent[c] * (double)xm_inspect_runs(ins, o);
      v[s * XM_INS_CLASSES + c] += b;
      total += b;
    }
  }
  for (int s = 0; s < slots; s++) {
    double sum = 0;
    for (int c = 0; c < XM_INS_CLASSES; c++)
      sum += v[s * XM_INS_CLASSES + c];
    max = fmax(max, sum);
  }
  P("<h2>Bytes per layer</h2>\n<p>What rank 0 sends per optimizer step, by collective (");
  bytes_text(out, total);
  P(" in all; uniform routing for the all-to-alls).</p>\n");
  double bar = slots > 0 ? fmin(40, 700.0 / slots) : 40, h = 200;
  P("<svg class=\"chart\" viewBox=\"0 0 760 %d\" role=\"img\" aria-label=\"bytes per "
    "layer\">\n",
    (int)h + 70);
  P("<line x1=\"40\" y1=\"%.1f\" x2=\"750\" y2=\"%.1f\" stroke=\"#999\"/>\n", h + 10, h + 10);
  for (int s = 0; s < slots; s++) {
    double x = 44 + s * bar, y = h + 10;
    for (int c = 0; c < XM_INS_CLASSES; c++) {
      double b = v[s * XM_INS_CLASSES + c], bh = max > 0 ? h * b / max : 0;
      if (bh <= 0) continue;
      y -= bh;
      P("<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\"><title>", x, y,
        bar * 0.8, bh, k_colors[c]);
      if (s < slots - 1)
        P("layer %d ", s);
      else
        P("no layer ");
      esc(out, xm_inspect_class_name((xm_ins_class_t)c));
      P(": ");
      bytes_text(out, b);
      P("</title></rect>");
    }
    if (s < slots - 1)
      P("<text x=\"%.2f\" y=\"%.1f\" class=\"small\">%d</text>\n", x, h + 24, s);
    else
      P("<text x=\"%.2f\" y=\"%.1f\" class=\"small\">-</text>\n", x, h + 24);
  }
  P("<text x=\"4\" y=\"16\" class=\"small\">");
  bytes_text(out, max);
  P("</text>\n");
  const char *names[XM_INS_CLASSES];
  for (int c = 0; c < XM_INS_CLASSES; c++)
    names[c] = xm_inspect_class_name((xm_ins_class_t)c);
  legend(out, names, XM_INS_CLASSES, h + 40);
  P("</svg>\n");
  free(v);
}

static void timeline_chart(const xm_inspect_t *ins, xm_strbuf_t *out) {
  double arena = (double)ins->mem.activation_bytes, max = fmax(arena, (double)ins->act_peak);
  int n = ins->num_ops;
  P("<h2>Memory timeline</h2>\n<p>Activation bytes in use while each op runs, in execution "
    "order (the micro-batch function, then the step function); the dashed line is the arena "
    "(");
  bytes_text(out, arena);
  P("), the peak ");
  bytes_text(out, (double)ins->act_peak);
  P(".</p>\n<svg class=\"chart\" viewBox=\"0 0 760 230\" role=\"img\" aria-label=\"memory "
    "timeline\">\n");
  double w = 680, h = 180, x0 = 70, y0 = 200;
  if (n > 0 && max > 0) {
    P("<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", k_colors[0]);
    for (int i = 0; i < n; i++)
      P("%.1f,%.1f ", x0 + w * i / (n > 1 ? n - 1 : 1),
        y0 - h * (double)ins->ops[i].act_in_use / max);
    P("\"/>\n");
    P("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
      "stroke-dasharray=\"6 4\"/>\n",
      x0, y0 - h * arena / max, x0 + w, y0 - h * arena / max, k_colors[3]);
    /* where the backward and the step function start */
    int first_bwd = -1;
    for (int i = 0; i < ins->num_micro && first_bwd < 0; i++)
      if (ins->ops[i].phase == XM_INS_BWD) first_bwd = i;
    const int marks[2] = {first_bwd, ins->num_micro < n ? ins->num_micro : -1};
    const char *const labels[2] = {"bwd", "step"};
    for (int k = 0; k < 2; k++) {
      if (marks[k] <= 0) continue;
      double x = x0 + w * marks[k] / (n > 1 ? n - 1 : 1);
      P("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#bbb\"/>"
        "<text x=\"%.1f\" y=\"14\" class=\"small\">%s</text>\n",
        x, y0, x, y0 - h, x + 2, labels[k]);
    }
  }
  P("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#999\"/>\n", x0, y0, x0 + w,
    y0);
  P("<text x=\"4\" y=\"%.1f\" class=\"small\">0</text><text x=\"4\" y=\"%.1f\" class=\"small\">",
    y0, y0 - h + 4);
  bytes_text(out, max);
  P("</text><text x=\"%.1f\" y=\"222\" class=\"small\">ops in execution order</text>\n</svg>\n",
    x0 + w / 2 - 60);
}

void xm_inspect_html(const xm_inspect_t *ins, xm_strbuf_t *out) {
  P("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>xmoec "
    "inspect: ");
  esc(out, ins->model);
  P("</title>\n<style>\n"
    "body { font-family: sans-serif; margin: 24px; max-width: 980px; color: #222; }\n"
    "h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; }\n"
    "svg.chart { border: 1px solid #ddd; background: #fff; display: block; width: 100%%; "
    "height: auto; }\n"
    "svg text { font-size: 12px; fill: #222; } svg text.small { font-size: 10px; }\n"
    "pre { font-size: 11px; background: #f7f7f7; padding: 8px; overflow-x: auto; }\n"
    "table { border-collapse: collapse; } td, th { padding: 2px 10px; text-align: left; }\n"
    "</style>\n</head>\n<body>\n<h1>xmoec inspect: ");
  esc(out, ins->model);
  P("</h1>\n<table>\n<tr><th>folder</th><td>");
  esc(out, ins->dir);
  char layout[96];
  xm_layout_format(&ins->layout, layout, sizeof layout);
  P("</td></tr>\n<tr><th>layout</th><td>");
  esc(out, layout);
  P(", %" PRId64 " rank%s (%" PRId64 " per node)</td></tr>\n", ins->world,
    ins->world == 1 ? "" : "s", ins->rpn);
  P("<tr><th>batch</th><td>micro-batch %" PRId64 " x %" PRId64 " tokens, %" PRId64
    " per optimizer step</td></tr>\n<tr><th>machine</th><td>",
    ins->micro_batch, ins->seq_len, ins->grad_accum);
  esc(out, ins->machine);
  P("</td></tr>\n</table>\n");
  memory_chart(ins, out);
  layout_chart(ins, out);
  phase_chart(ins, out);
  layer_chart(ins, out);
  timeline_chart(ins, out);
  xm_strbuf_t text;
  xm_strbuf_init(&text);
  xm_inspect_text(ins, &text);
  P("<h2>Report</h2>\n<pre>");
  esc(out, xm_strbuf_cstr(&text));
  P("</pre>\n</body>\n</html>\n");
  xm_strbuf_free(&text);
}
