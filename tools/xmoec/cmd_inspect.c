/* tools/xmoec/cmd_inspect.c — `xmoec inspect OUT`: read a compiled program.
 *
 *   xmoec inspect OUT [--format text|dot|html|trace] [-o FILE] [--cluster FILE]
 *
 * OUT is what `xmoec compile` wrote (model.xir, manifest.json,
 * config.json). The analysis is tools/xmoec/inspect_model.c; each format
 * has its writer (inspect_text.c, inspect_html.c, inspect_trace.c);
 * docs/inspect.md documents them. A missing or malformed OUT, a bad flag or
 * an unreadable cluster file exits 2 with the file named; nothing is
 * written then. Output goes to stdout unless -o names a file.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "support/diag.h"
#include "support/strbuf.h"
#include "tools/xmoec/commands.h"
#include "tools/xmoec/inspect.h"

typedef enum { FORMAT_TEXT, FORMAT_DOT, FORMAT_HTML, FORMAT_TRACE } format_t;

typedef struct {
  const char *dir, *output, *cluster;
  format_t format;
} inspect_args_t;

static void inspect_usage(FILE *out) {
  fprintf(out,
          "usage: xmoec inspect OUT [--format text|dot|html|trace] [-o FILE] [--cluster FILE]\n"
          "\n"
          "Reads the program `xmoec compile` wrote to OUT and shows what one rank does:\n"
          "  text   schedule summary per phase and op kind (FLOPs, predicted time), memory\n"
          "         per category, the activation memory timeline, every collective per\n"
          "         layer with its group, size and bytes on the wire (default)\n"
          "  dot    the graph as Graphviz dot (collectives highlighted)\n"
          "  html   one self-contained page with SVG charts (memory, time per phase,\n"
          "         bytes per layer, memory timeline) and the text report\n"
          "  trace  the predicted timeline of one optimizer step as Chrome/Perfetto\n"
          "         trace JSON, comparable with `OUT/train --trace FILE`\n"
          "\n"
          "  -o FILE          write to FILE instead of stdout\n"
          "  --cluster FILE   predict for this cluster instead of the compile's (or the\n"
          "                   CPU defaults when the compile had none)\n"
          "\n"
          "docs/inspect.md describes every format and the models behind the numbers.\n");
}


static const xm_flag_t k_inspect_flags[] = {
    {"--format", true},
    {"--cluster", true},
    {"-o", true},
    {NULL, false}};

static int inspect_parse_args(int argc, char **argv, inspect_args_t *a, bool *out_help) {
  if (xm_args_check("inspect", argc, argv, k_inspect_flags)) return 2;
  for (int i = 0; i < argc; i++) {
    bool missing = false;
    const char *v;
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      *out_help = true;
      return 0;
    } else if ((v = xm_arg_value(argc, argv, &i, "--format", &missing))) {
      static const char *const names[] = {"text", "dot", "html", "trace"};
      int k = -1;
      for (int j = 0; j < 4; j++)
        if (strcmp(v, names[j]) == 0) k = j;
      if (k < 0) {
        fprintf(stderr,
                "xmoec inspect: error: --format must be text, dot, html or trace, not "
                "'%s'\n",
                v);
        return 2;
      }
      a->format = (format_t)k;
    } else if ((v = xm_arg_value(argc, argv, &i, "--cluster", &missing))) {
      a->cluster = v;
    } else if ((v = xm_arg_value(argc, argv, &i, "-o", &missing))) {
      a->output = v;
    } else if (missing) {
      fprintf(stderr, "xmoec inspect: error: %s needs a value\n", argv[i]);
      return 2;
    } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
      fprintf(stderr, "xmoec inspect: error: unknown option '%s'\n", argv[i]);
      inspect_usage(stderr);
      return 2;
    } else if (a->dir) {
      fprintf(stderr, "xmoec inspect: error: more than one folder ('%s', '%s')\n", a->dir, argv[i]);
      return 2;
    } else {
      a->dir = argv[i];
    }
  }
  if (!a->dir) {
    fprintf(stderr, "xmoec inspect: error: no program folder given (the -o OUT of compile)\n");
    inspect_usage(stderr);
    return 2;
  }
  if ((a->output && !a->output[0]) || !a->dir[0]) {
    fprintf(stderr, "xmoec inspect: error: %s must not be empty\n", a->dir[0] ? "-o" : "OUT");
    return 2;
  }
  return 0;
}

static int write_output(const char *path, const xm_strbuf_t *text) {
  FILE *f = path ? fopen(path, "w") : stdout;
  if (!f) {
    fprintf(stderr, "xmoec inspect: error: cannot open '%s' for writing\n", path);
    return 2;
  }
  fputs(xm_strbuf_cstr(text), f);
  bool ok = fflush(f) == 0 && !ferror(f);
  if (path) ok = fclose(f) == 0 && ok;
  if (!ok) {
    fprintf(stderr, "xmoec inspect: error: cannot write '%s'\n", path ? path : "<stdout>");
    return 2;
  }
  return 0;
}

int xm_cmd_inspect(int argc, char **argv) {
  inspect_args_t a = {0};
  bool help = false;
  int rc = inspect_parse_args(argc, argv, &a, &help);
  if (help) {
    inspect_usage(stdout);
    return 0;
  }
  if (rc) return rc;
  xm_inspect_t *ins = calloc(1, sizeof *ins);
  if (!ins) return 1;
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_status_t st = xm_inspect_load(a.dir, a.cluster, &diag, ins);
  if (st == XM_OK && a.format == FORMAT_TRACE &&
      ins->grad_accum * ins->num_micro > XM_INSPECT_MAX_EVENTS) {
    xm_diag_add(&diag, XM_DIAG_ERROR, a.dir, NULL,
                "the predicted trace would hold %lld micro-batch events (grad_accum %lld x %d "
                "ops), over the limit of %lld; the text and html formats report the same step",
                (long long)(ins->grad_accum * ins->num_micro), (long long)ins->grad_accum,
                ins->num_micro, (long long)XM_INSPECT_MAX_EVENTS);
    st = XM_ERR_INVALID_INPUT;
  }
  if (st != XM_OK && xm_diag_error_count(&diag) == 0)
    xm_diag_add(&diag, XM_DIAG_ERROR, a.dir, NULL, "%s", xm_status_name(st));
  xm_diag_print(&diag, stderr);
  xm_diag_free(&diag);
  if (st == XM_OK) {
    xm_strbuf_t out;
    xm_strbuf_init(&out);
    switch (a.format) {
    case FORMAT_TEXT: xm_inspect_text(ins, &out); break;
    case FORMAT_DOT: xm_inspect_dot(ins, &out); break;
    case FORMAT_HTML: xm_inspect_html(ins, &out); break;
    case FORMAT_TRACE: xm_inspect_trace(ins, &out); break;
    }
    rc = write_output(a.output, &out);
    xm_strbuf_free(&out);
  } else {
    rc = xm_status_exit_code(st);
  }
  xm_inspect_free(ins);
  free(ins);
  return rc;
}
