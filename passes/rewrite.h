/* passes/rewrite.h — helpers shared by the rewriting passes: dead-op
 * elimination and boolean option parsing.
 *
 * Dead-op elimination lives here rather than in one pass because both
 * "dce" and "canonicalize" run it (canonicalize after every round of
 * rewrites, so that folded-away producers disappear in the same pass).
 */
#ifndef XM_PASSES_REWRITE_H
#define XM_PASSES_REWRITE_H

#include <stdbool.h>

#include "ir/ir.h"
#include "passes/pass.h"
#include "support/diag.h"

/* Removes every op that is not a root (XM_OPF_ROOT) and whose results are
 * all unused, to a fixed point (an op kept alive only by dead ops dies too).
 * Sets *out_changed when something was removed (never clears it). */
xm_status_t xm_rewrite_dce(xm_ir_module_t *m, bool *out_changed);

/* Reads a boolean option "true" or "false"; absent gives `dflt`.
 * Any other value is reported to `diag` (XM_ERR_INVALID_INPUT). */
xm_status_t xm_pass_option_bool(const xm_pass_options_t *o, const char *key, bool dflt,
                                xm_diag_t *diag, bool *out_value);

#endif /* XM_PASSES_REWRITE_H */
