/* tools/xmoec/cmd_opt.c — `xmoec opt`: a pass pipeline over IR or MLIR text.
 *
 * The xmoec counterpart of mlir-opt, and the harness of the textual pass
 * tests: read a module (IR text, or MLIR through the bridge when the file
 * name or the first words say so), verify it, run --pipeline, print the
 * result. Input that does not parse or verify is the user's problem (exit
 * 2, with file:line:col); IR broken by a pass is ours (exit 1, "after pass
 * 'X'"). --no-verify skips both the input check and the checks between
 * passes, which is what a test of shape-infer on stale types needs.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "ir/mlir_bridge.h"
#include "ir/text.h"
#include "ir/verify.h"
#include "passes/pass.h"
#include "support/diag.h"
#include "support/strbuf.h"
#include "tools/xmoec/commands.h"

typedef struct {
  const char *input;
  const char *output;
  const char *pipeline;
  bool mlir_out;
  bool print_after_all;
  bool timing;
  bool no_verify;
} opt_args_t;

static void opt_usage(FILE *out) {
  fprintf(out,
          "usage: xmoec opt FILE|- [--pipeline=P] [--emit=xir|mlir] [--print-ir-after-all]\n"
          "                 [--timing] [--no-verify] [-o OUT]\n"
          "\n"
          "Reads a module as xmoec IR text or MLIR (a .mlir file, or text starting\n"
          "with \"module {\" or \"builtin.module\"), runs a pass pipeline over it and\n"
          "prints the result. '-' reads stdin.\n"
          "\n"
          "  --pipeline=P          passes to run, e.g. \"canonicalize,shape-infer{check=true}\"\n"
          "  --emit=xir|mlir       output form (default xir)\n"
          "  --print-ir-after-all  print the module to stderr after every pass\n"
          "  --timing              print a per-pass time table to stderr\n"
          "  --no-verify           do not verify the input nor the IR between passes\n"
          "  -o OUT                write to OUT instead of stdout\n"
          "\npasses:\n");
  for (int i = 0; i < xm_pass_count(); i++) {
    const xm_pass_info_t *p = xm_pass_get(i);
    fprintf(out, "  %-18s %s\n", p->name, p->summary);
    for (const char *const *o = p->option_names; o && *o; o++)
      fprintf(out, "  %-18s   option %s\n", "", *o);
  }
}


/* Flags without a value; false when argv[i] is none of them. */
static bool switch_flag(const char *arg, opt_args_t *a) {
  if (strcmp(arg, "--print-ir-after-all") == 0)
    a->print_after_all = true;
  else if (strcmp(arg, "--timing") == 0)
    a->timing = true;
  else if (strcmp(arg, "--no-verify") == 0)
    a->no_verify = true;
  else
    return false;
  return true;
}

/* Returns 0 to go on, else the exit code; *out_help after --help. */
static const xm_flag_t k_opt_flags[] = {
    {"--print-ir-after-all", false},
    {"--timing", false},
    {"--no-verify", false},
    {"--pipeline", true},
    {"--emit", true},
    {"-o", true},
    {NULL, false}};

static int opt_parse_args(int argc, char **argv, opt_args_t *a, bool *out_help) {
  if (xm_args_check("opt", argc, argv, k_opt_flags)) return 2;
  for (int i = 0; i < argc; i++) {
    bool missing = false;
    const char *v;
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      *out_help = true;
      return 0;
    } else if (switch_flag(argv[i], a)) {
    } else if ((v = xm_arg_value(argc, argv, &i, "--pipeline", &missing))) {
      a->pipeline = v;
    } else if ((v = xm_arg_value(argc, argv, &i, "--emit", &missing))) {
      if (strcmp(v, "xir") != 0 && strcmp(v, "mlir") != 0) {
        fprintf(stderr, "xmoec opt: error: --emit must be xir or mlir, not '%s'\n", v);
        return 2;
      }
      a->mlir_out = strcmp(v, "mlir") == 0;
    } else if ((v = xm_arg_value(argc, argv, &i, "-o", &missing))) {
      a->output = v;
    } else if (missing) {
      fprintf(stderr, "xmoec opt: error: %s needs a value\n", argv[i]);
      return 2;
    } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
      fprintf(stderr, "xmoec opt: error: unknown option '%s'\n", argv[i]);
      return 2;
    } else if (a->input) {
      fprintf(stderr, "xmoec opt: error: more than one input file ('%s', '%s')\n", a->input,
              argv[i]);
      return 2;
    } else {
      a->input = argv[i];
    }
  }
  if (!a->input) {
    fprintf(stderr, "xmoec opt: error: no input file given ('-' reads stdin)\n");
    return 2;
  }
  return 0;
}

static int read_stdin(char **out_data, size_t *out_len) {
  return xm_read_stream_limit(stdin, XM_READ_LIMIT_IR, out_data, out_len);
}

/* MLIR when the name says so or the first non-comment words are a builtin
 * module; xmoec IR opens with "module @name {" and has no quoted op names. */
static bool looks_like_mlir(const char *name, const char *text) {
  size_t n = strlen(name);
  if (n > 5 && strcmp(name + n - 5, ".mlir") == 0) return true;
  const char *p = text;
  for (;;) {
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
      p++;
    if (p[0] != '/' || p[1] != '/') break;
    while (*p && *p != '\n')
      p++;
  }
  if (strncmp(p, "\"builtin.module\"", 16) == 0 || strncmp(p, "builtin.module", 14) == 0)
    return true;
  if (strncmp(p, "module", 6) != 0) return false;
  p += 6;
  while (*p == ' ' || *p == '\t')
    p++;
  if (*p == '{' || strncmp(p, "attributes", 10) == 0) return true;
  return strstr(p, "\"xmoe.") != NULL; /* mlir-opt's "module @name {" */
}

/* Reads and parses the input into *out_m; verifies it unless told not to. */
static xm_status_t load(const opt_args_t *a, xm_diag_t *diag, xm_ir_module_t **out_m) {
  bool from_stdin = strcmp(a->input, "-") == 0;
  const char *source = from_stdin ? "<stdin>" : a->input;
  char *text = NULL;
  size_t len = 0;
  int err = from_stdin ? read_stdin(&text, &len)
                       : xm_read_file_limit(a->input, XM_READ_LIMIT_IR, &text, &len);
  if (err) {
    char why[160];
    xm_diag_add(diag, XM_DIAG_ERROR, source, NULL, "cannot read: %s",
                xm_read_error(err, XM_READ_LIMIT_IR, why, sizeof why));
    return XM_ERR_IO;
  }
  xm_status_t st = looks_like_mlir(source, text) ? xm_mlir_import(text, len, source, diag, out_m)
                                                 : xm_ir_parse(text, len, source, diag, out_m);
  free(text);
  if (st != XM_OK || a->no_verify) return st;
  st = xm_ir_verify(*out_m, diag);
  if (st != XM_OK) {
    xm_diag_add(diag, XM_DIAG_ERROR, source, NULL, "the input module does not verify");
    xm_ir_module_destroy(*out_m);
    *out_m = NULL;
    return XM_ERR_INVALID_INPUT;
  }
  return XM_OK;
}

static int write_output(const char *path, const xm_strbuf_t *text) {
  FILE *f = path ? fopen(path, "w") : stdout;
  if (!f) {
    fprintf(stderr, "xmoec opt: error: cannot open '%s' for writing\n", path);
    return 2;
  }
  fputs(xm_strbuf_cstr(text), f);
  bool ok = fflush(f) == 0 && !ferror(f);
  if (path) ok = fclose(f) == 0 && ok;
  if (!ok) {
    fprintf(stderr, "xmoec opt: error: cannot write '%s'\n", path ? path : "<stdout>");
    return 2;
  }
  return 0;
}

static xm_status_t run_and_print(const opt_args_t *a, xm_ir_module_t *m, xm_diag_t *diag,
                                 xm_strbuf_t *out) {
  xm_pass_manager_options_t po;
  xm_pass_manager_options_default(&po);
  po.print_ir_after_all = a->print_after_all;
  po.timing = a->timing;
  po.verify_each = !a->no_verify;
  po.dump = stderr;
  XM_RETURN_IF_ERROR(xm_pass_pipeline_run(m, a->pipeline, &po, diag));
  if (!a->mlir_out) {
    xm_ir_print(m, out);
    return XM_OK;
  }
  xm_status_t st = xm_mlir_export(m, out);
  if (st != XM_OK)
    xm_diag_add(diag, XM_DIAG_ERROR, NULL, NULL, "MLIR export failed: %s", xm_status_name(st));
  return st;
}

int xm_cmd_opt(int argc, char **argv) {
  opt_args_t a = {0};
  bool help = false;
  int rc = opt_parse_args(argc, argv, &a, &help);
  if (help) {
    opt_usage(stdout);
    return 0;
  }
  if (rc) return rc;
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_ir_module_t *m = NULL;
  xm_strbuf_t out;
  xm_strbuf_init(&out);
  xm_status_t st = load(&a, &diag, &m);
  if (st == XM_OK) st = run_and_print(&a, m, &diag, &out);
  if (st != XM_OK && xm_diag_error_count(&diag) == 0)
    xm_diag_add(&diag, XM_DIAG_ERROR, a.input, NULL, "%s", xm_status_name(st));
  xm_diag_print(&diag, stderr);
  rc = st == XM_OK ? write_output(a.output, &out) : xm_status_exit_code(st);
  xm_strbuf_free(&out);
  xm_ir_module_destroy(m);
  xm_diag_free(&diag);
  return rc;
}
