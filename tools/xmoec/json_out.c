/* tools/xmoec/json_out.c — see json_out.h. */
#include "tools/xmoec/json_out.h"

#include <stdio.h>

int xm_print_json(const char *cmd, cJSON *root) {
  char *text = cJSON_Print(root);
  cJSON_Delete(root);
  if (!text) {
    fprintf(stderr, "xmoec %s: error: out of memory printing JSON\n", cmd);
    return 1;
  }
  printf("%s\n", text);
  cJSON_free(text);
  return 0;
}
