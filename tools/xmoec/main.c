/* tools/xmoec/main.c — the xmoec driver: dispatches to a subcommand. */
#include <stdio.h>
#include <signal.h>
#include <errno.h>
#include <string.h>

#include "support/strbuf.h"
#include "tools/xmoec/commands.h"

typedef struct {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *summary;
} command_t;

static const command_t k_commands[] = {
    {"check", xm_cmd_check, "validate a model spec; parameter and FLOP counts"},
    {"ir", xm_cmd_ir, "build the forward graph of a model; print it as IR or MLIR"},
    {"opt", xm_cmd_opt, "run a pass pipeline over IR or MLIR text"},
    {"plan", xm_cmd_plan, "choose the parallel layout of a model on a cluster; compare systems"},
    {"fabric", xm_cmd_fabric, "time and price a model's training step on network topologies"},
    {"place", xm_cmd_place, "place experts chosen together on one node, from a run's routing"},
    {"compile", xm_cmd_compile, "compile a model into a training program (OUT/train)"},
    {"inspect", xm_cmd_inspect, "read a compiled program: schedule, memory, collectives, traces"},
    {"calibrate", xm_cmd_calibrate,
     "measure this machine for the cost model (run with mpirun; writes a profile)"},
};

static void usage(FILE *out) {
  fprintf(out, "usage: xmoec <command> [args]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
    fprintf(out, "  %-9s %s\n", k_commands[i].name, k_commands[i].summary);
  fprintf(out, "\n'xmoec <command> --help' describes a command.\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  /* `xmoec help COMMAND` is `xmoec COMMAND --help`. */
  static char help_flag[] = "--help";
  char *help_argv[4] = {argv[0], NULL, help_flag, NULL};
  if (strcmp(argv[1], "help") == 0 && argc >= 3) {
    help_argv[1] = argv[2];
    argv = help_argv; /* xmoec COMMAND --help */
    argc = 3;
  } else if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
             strcmp(argv[1], "help") == 0) {
    usage(stdout);
    return 0;
  }
  if (strcmp(argv[1], "--version") == 0) {
    printf("xmoec 0.1.0\n");
    return 0;
  }
  /* A file-size limit makes writes fail (reported) instead of killing us. */
  signal(SIGXFSZ, SIG_IGN);
  for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
    if (strcmp(argv[1], k_commands[i].name) == 0) {
      int rc = k_commands[i].run(argc - 2, argv + 2);
      /* What went to stdout must have arrived (a full disk, a closed pipe). */
      if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "xmoec %s: error: cannot write to stdout: %s\n", argv[1],
                strerror(errno ? errno : EIO));
        return rc ? rc : 1;
      }
      return rc;
    }
  const char *best = NULL;
  int best_d = 3; /* a suggestion within two edits */
  for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++) {
    int d = xm_edit_distance(argv[1], k_commands[i].name);
    if (d < best_d && (size_t)d * 3 <= strlen(argv[1])) best_d = d, best = k_commands[i].name;
  }
  if (best)
    fprintf(stderr, "xmoec: unknown command '%s'; did you mean '%s'?\n", argv[1], best);
  else
    fprintf(stderr, "xmoec: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
