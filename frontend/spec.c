/* frontend/spec.c — PLACEHOLDER: replaced by the real implementation. */
#include <string.h>
#include "frontend/spec.h"

void xm_spec_set_defaults(xm_spec_t *spec) { memset(spec, 0, sizeof *spec); }
xm_status_t xm_spec_load_file(const char *path, xm_diag_t *diag, xm_spec_t *out) {
  (void)path; (void)diag; xm_spec_set_defaults(out); return XM_ERR_UNSUPPORTED; }
xm_status_t xm_spec_load_text(const char *text, size_t len, const char *source,
                              xm_diag_t *diag, xm_spec_t *out) {
  (void)text; (void)len; (void)source; (void)diag; xm_spec_set_defaults(out); return XM_ERR_UNSUPPORTED; }
xm_status_t xm_spec_load_cluster_file(const char *path, xm_diag_t *diag, xm_spec_t *spec) {
  (void)path; (void)diag; (void)spec; return XM_ERR_UNSUPPORTED; }
xm_status_t xm_spec_load_cluster_text(const char *text, size_t len, const char *source,
                                      xm_diag_t *diag, xm_spec_t *spec) {
  (void)text; (void)len; (void)source; (void)diag; (void)spec; return XM_ERR_UNSUPPORTED; }
void xm_spec_validate(const xm_spec_t *spec, const char *source, xm_diag_t *diag) {
  (void)spec; (void)source; (void)diag; }
