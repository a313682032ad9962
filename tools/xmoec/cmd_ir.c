/* tools/xmoec/cmd_ir.c — `xmoec ir`: the forward graph of a model as IR
 * text or MLIR.
 *
 * The command is the shortest path from a spec to readable IR: load and
 * validate the spec (optionally with a cluster file), build the graph,
 * verify it, print it. Problems with what the user gave (flags, files, spec
 * fields, an architecture the builder cannot train yet) exit 2 with the
 * place of the problem; a graph that fails the verifier is a builder bug and
 * exits 1. Output goes to stdout unless -o names a file, and nothing is
 * written on failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "frontend/spec.h"
#include "ir/mlir_bridge.h"
#include "ir/model.h"
#include "ir/text.h"
#include "ir/verify.h"
#include "support/diag.h"
#include "support/strbuf.h"
#include "tools/xmoec/commands.h"

typedef struct {
  const char *input;
  const char *cluster;
  const char *output;
  bool mlir;
} ir_args_t;

static void ir_usage(FILE *out) {
  fprintf(out, "usage: xmoec ir MODEL.json [--emit=xir|mlir] [--cluster FILE] [-o OUT]\n"
               "\n"
               "Builds the forward training graph of a model (global shapes) and\n"
               "prints it as xmoec IR text (default) or as MLIR in generic form.\n"
               "\n"
               "  --emit=xir|mlir   output form (default xir)\n"
               "  --cluster FILE    a cluster description checked with the spec\n"
               "  -o OUT            write to OUT instead of stdout\n");
}


/* Returns 0 to go on, else an exit code (2 bad flags, 0 after --help). */
static const xm_flag_t k_ir_flags[] = {
    {"--emit", true},
    {"--cluster", true},
    {"-o", true},
    {NULL, false}};

static int ir_parse_args(int argc, char **argv, ir_args_t *a, bool *out_help) {
  if (xm_args_check("ir", argc, argv, k_ir_flags)) return 2;
  for (int i = 0; i < argc; i++) {
    bool missing = false;
    const char *v;
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      *out_help = true;
      return 0;
    } else if ((v = xm_arg_value(argc, argv, &i, "--emit", &missing))) {
      if (strcmp(v, "xir") != 0 && strcmp(v, "mlir") != 0) {
        fprintf(stderr, "xmoec ir: error: --emit must be xir or mlir, not '%s'\n", v);
        return 2;
      }
      a->mlir = strcmp(v, "mlir") == 0;
    } else if ((v = xm_arg_value(argc, argv, &i, "--cluster", &missing))) {
      a->cluster = v;
    } else if ((v = xm_arg_value(argc, argv, &i, "-o", &missing))) {
      a->output = v;
    } else if (missing) {
      fprintf(stderr, "xmoec ir: error: %s needs a value\n", argv[i]);
      return 2;
    } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
      fprintf(stderr, "xmoec ir: error: unknown option '%s'\n", argv[i]);
      ir_usage(stderr);
      return 2;
    } else if (a->input) {
      fprintf(stderr, "xmoec ir: error: more than one input file ('%s', '%s')\n", a->input,
              argv[i]);
      return 2;
    } else {
      a->input = argv[i];
    }
  }
  if (!a->input) {
    fprintf(stderr, "xmoec ir: error: no model file given\n");
    ir_usage(stderr);
    return 2;
  }
  return 0;
}

/* Writes `text` to `path` or stdout. */
static int write_output(const char *path, const xm_strbuf_t *text) {
  FILE *f = path ? fopen(path, "w") : stdout;
  if (!f) {
    fprintf(stderr, "xmoec ir: error: cannot open '%s' for writing\n", path);
    return 2;
  }
  fputs(xm_strbuf_cstr(text), f);
  bool ok = fflush(f) == 0 && !ferror(f);
  if (path) ok = fclose(f) == 0 && ok;
  if (!ok) {
    fprintf(stderr, "xmoec ir: error: cannot write '%s'\n", path ? path : "<stdout>");
    return 2;
  }
  return 0;
}

/* Loads the spec and builds the verified graph; prints diagnostics. */
static xm_status_t build(const ir_args_t *a, xm_diag_t *diag, xm_ir_module_t **out_m) {
  xm_spec_t *spec = calloc(1, sizeof *spec);
  if (!spec) return XM_ERR_NO_MEMORY;
  xm_status_t st = xm_spec_load_file(a->input, diag, spec);
  if (st == XM_OK && a->cluster) st = xm_spec_load_cluster_file(a->cluster, diag, spec);
  if (st == XM_OK && xm_diag_error_count(diag)) st = XM_ERR_INVALID_INPUT;
  if (st == XM_OK) st = xm_ir_build_model(spec, a->input, diag, out_m);
  free(spec);
  if (st != XM_OK) return st;
  if (xm_ir_verify(*out_m, diag) != XM_OK) {
    xm_diag_add(diag, XM_DIAG_ERROR, a->input, NULL,
                "internal error: the graph built from this spec does not verify");
    xm_ir_module_destroy(*out_m);
    *out_m = NULL;
    return XM_ERR_INTERNAL;
  }
  return XM_OK;
}

int xm_cmd_ir(int argc, char **argv) {
  ir_args_t a = {0};
  bool help = false;
  int rc = ir_parse_args(argc, argv, &a, &help);
  if (help) {
    ir_usage(stdout);
    return 0;
  }
  if (rc) return rc;
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_ir_module_t *m = NULL;
  xm_status_t st = build(&a, &diag, &m);
  xm_strbuf_t out;
  xm_strbuf_init(&out);
  if (st == XM_OK) {
    if (a.mlir) {
      st = xm_mlir_export(m, &out);
      if (st != XM_OK)
        xm_diag_add(&diag, XM_DIAG_ERROR, a.input, NULL, "MLIR export failed: %s",
                    xm_status_name(st));
    } else {
      xm_ir_print(m, &out);
    }
  }
  if (st != XM_OK && xm_diag_error_count(&diag) == 0)
    xm_diag_add(&diag, XM_DIAG_ERROR, a.input, NULL, "%s", xm_status_name(st));
  xm_diag_print(&diag, stderr);
  if (st == XM_OK)
    rc = write_output(a.output, &out);
  else
    rc = xm_status_exit_code(st);
  xm_strbuf_free(&out);
  xm_ir_module_destroy(m);
  xm_diag_free(&diag);
  return rc;
}
