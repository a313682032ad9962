/* tools/xmoec/cmd_ir.c — placeholder until the subcommand lands. */
#include <stdio.h>

#include "tools/xmoec/commands.h"

int xm_cmd_ir(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "xmoec ir: not built yet\n");
  return 1;
}
