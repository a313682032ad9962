/* tools/xmoec/json_out.h — the one JSON document a --json command prints. */
#ifndef XM_TOOLS_JSON_OUT_H
#define XM_TOOLS_JSON_OUT_H

#include <cjson/cJSON.h>

/* Prints `root` on stdout (cJSON's formatted text and a newline) and
 * deletes it. Returns 0, or 1 after "xmoec CMD: error: out of memory
 * printing JSON" on stderr. */
int xm_print_json(const char *cmd, cJSON *root);

#endif /* XM_TOOLS_JSON_OUT_H */
