/* tools/xmoec/cmd_opt.c — placeholder until the subcommand lands. */
#include <stdio.h>

#include "tools/xmoec/commands.h"

int xm_cmd_opt(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "xmoec opt: not built yet\n");
  return 1;
}
