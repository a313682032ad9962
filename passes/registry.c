/* passes/registry.c — the table of passes, by name. */
#include <string.h>

#include "passes/pass.h"

static const xm_pass_info_t *const k_passes[] = {NULL};

int xm_pass_count(void) { return 0; }
const xm_pass_info_t *xm_pass_get(int i) { return k_passes[i]; }
const xm_pass_info_t *xm_pass_find(const char *name) {
  (void)name;
  return NULL;
}
