/* tools/xmoec/commands.h — the subcommands of the xmoec driver. Each takes
 * the arguments after the subcommand name and returns the process exit code
 * (0 ok, 1 failure, 2 bad input). One file per subcommand. */
#ifndef XM_TOOLS_COMMANDS_H
#define XM_TOOLS_COMMANDS_H

int xm_cmd_check(int argc, char **argv);
int xm_cmd_ir(int argc, char **argv);
int xm_cmd_opt(int argc, char **argv);
int xm_cmd_compile(int argc, char **argv);
int xm_cmd_inspect(int argc, char **argv);
int xm_cmd_plan(int argc, char **argv);
int xm_cmd_fabric(int argc, char **argv);
int xm_cmd_place(int argc, char **argv);
int xm_cmd_calibrate(int argc, char **argv);

#endif
