/* tools/xmoec/cmd_calibrate.c — `xmoec calibrate`: runs xmoec-calibrate
 * (tools/calibrate/), which measures the machine it runs on with the
 * runtime out/train links (GEMMs through the CPU kernels, memory
 * bandwidth, call overhead, the collectives through the communicator) and
 * writes a profile (docs/cost-model.md, "Calibration"). It is a separate
 * program because it links MPI and the runtime, which xmoec itself does
 * not; started with mpirun, every rank execs it in place. The program is
 * the one next to this xmoec, or XMOEC_CALIBRATE. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/xmoec/commands.h"

int xm_cmd_calibrate(int argc, char **argv) {
  char path[PATH_MAX];
  const char *env = getenv("XMOEC_CALIBRATE");
  if (env && *env) {
    snprintf(path, sizeof path, "%s", env);
  } else {
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
    if (n <= 0) {
      fprintf(stderr, "xmoec calibrate: error: cannot find this program's folder: %s\n",
              strerror(errno));
      return 1;
    }
    path[n] = '\0';
    char *slash = strrchr(path, '/');
    size_t dir = slash ? (size_t)(slash - path) + 1 : 0;
    const char *name = "xmoec-calibrate";
    if (dir + strlen(name) + 1 > sizeof path) {
      fprintf(stderr, "xmoec calibrate: error: the program's folder name is too long\n");
      return 1;
    }
    memcpy(path + dir, name, strlen(name) + 1);
  }
  char **args = calloc((size_t)argc + 2, sizeof *args);
  if (!args) return 1;
  args[0] = path;
  for (int i = 0; i < argc; i++)
    args[i + 1] = argv[i];
  execv(path, args);
  fprintf(stderr,
          "xmoec calibrate: error: cannot run %s: %s (it is built with xmoec; XMOEC_CALIBRATE "
          "names another)\n",
          path, strerror(errno));
  free(args);
  return 1;
}
