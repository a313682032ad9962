/* tools/xmoec/cmd_check.c — placeholder until the subcommand lands. */
#include <stdio.h>

#include "tools/xmoec/commands.h"

int xm_cmd_check(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "xmoec check: not built yet\n");
  return 1;
}
