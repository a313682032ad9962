/* passes/pass.h — the pass manager: passes registered by name, pipeline
 * strings with options, the verifier between passes, IR dumps and timing.
 *
 * A pipeline string is a comma-separated list of pass names, each optionally
 * followed by options in braces, MLIR style:
 *     "canonicalize,shape-infer{strict=true}"
 * Option values are strings to the pass; each pass parses and checks its
 * own options and rejects unknown ones (XM_ERR_INVALID_INPUT with the pass
 * name and the option). Every pass lives in its own file under passes/ and
 * registers itself in the table of passes/registry.c.
 */
#ifndef XM_PASSES_PASS_H
#define XM_PASSES_PASS_H

#include <stdbool.h>
#include <stdio.h>

#include "ir/ir.h"
#include "support/diag.h"

#define XM_PASS_MAX_OPTIONS 8

typedef struct {
  int num;
  const char *keys[XM_PASS_MAX_OPTIONS];   /* borrowed from the pipeline */
  const char *values[XM_PASS_MAX_OPTIONS];
} xm_pass_options_t;

/* Returns the value of option `key` or NULL. */
const char *xm_pass_option(const xm_pass_options_t *o, const char *key);

/* Runs one pass over a module in place. `changed` may be set by the pass
 * (for statistics). Errors go to `diag`. */
typedef xm_status_t (*xm_pass_run_fn)(xm_ir_module_t *m,
                                      const xm_pass_options_t *options,
                                      xm_diag_t *diag, bool *out_changed);

typedef struct {
  const char *name;         /* used in pipeline strings */
  const char *summary;      /* one line, for --help */
  const char *const *option_names; /* NULL-terminated list of accepted options */
  xm_pass_run_fn run;
} xm_pass_info_t;

/* The registry (passes/registry.c). */
int xm_pass_count(void);
const xm_pass_info_t *xm_pass_get(int i);
const xm_pass_info_t *xm_pass_find(const char *name);

typedef struct {
  bool print_ir_after_all; /* print the module after every pass */
  bool timing;             /* print a per-pass time table at the end */
  bool verify_each;        /* run the verifier after every pass (default on) */
  FILE *dump;              /* where IR dumps and timing go (stderr if NULL) */
} xm_pass_manager_options_t;

void xm_pass_manager_options_default(xm_pass_manager_options_t *o);

/* Parses `pipeline` and runs it on `m`. Unknown pass or option names are
 * reported (with the nearest known name) before anything runs. */
xm_status_t xm_pass_pipeline_run(xm_ir_module_t *m, const char *pipeline,
                                 const xm_pass_manager_options_t *options,
                                 xm_diag_t *diag);

#endif /* XM_PASSES_PASS_H */
