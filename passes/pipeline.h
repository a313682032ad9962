/* passes/pipeline.h — a parsed pipeline string, exposed for the pass manager
 * and its tests.
 *
 * xm_pass_pipeline_run (passes/pass.h) is what callers use; this header lets
 * tests look at what the parser made of a string (names, option keys and
 * unquoted values) without running anything. Parsing resolves every pass
 * name against the registry and every option key against the pass's
 * option_names, so a parsed pipeline is known to be runnable.
 */
#ifndef XM_PASSES_PIPELINE_H
#define XM_PASSES_PIPELINE_H

#include "passes/pass.h"

typedef struct {
  const xm_pass_info_t *info; /* borrowed from the registry */
  xm_pass_options_t options;  /* keys and values point into `storage` */
} xm_pass_pipeline_entry_t;

typedef struct {
  char *storage;                     /* owned: the split, unquoted text */
  int num;                           /* entries in order of execution */
  xm_pass_pipeline_entry_t *entries; /* owned */
} xm_pass_pipeline_t;

/* Parses `text` (NULL or blank: an empty pipeline). Every problem goes to
 * `diag` with the place "pipeline:<column>"; returns XM_ERR_INVALID_INPUT
 * then, and `out` holds nothing. On success the caller frees `out` with
 * xm_pass_pipeline_free. */
xm_status_t xm_pass_pipeline_parse(const char *text, xm_diag_t *diag, xm_pass_pipeline_t *out);
void xm_pass_pipeline_free(xm_pass_pipeline_t *p);

/* Runs an already parsed pipeline (what xm_pass_pipeline_run does after
 * parsing). */
xm_status_t xm_pass_pipeline_execute(xm_ir_module_t *m, const xm_pass_pipeline_t *p,
                                     const xm_pass_manager_options_t *options, xm_diag_t *diag);

#endif /* XM_PASSES_PIPELINE_H */
