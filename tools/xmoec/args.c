/* tools/xmoec/args.c — see args.h. */
#include "args.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/strbuf.h"

const char *xm_arg_value(int argc, char **argv, int *i, const char *flag, bool *missing) {
  size_t n = strlen(flag);
  if (strncmp(argv[*i], flag, n) != 0) return NULL;
  if (argv[*i][n] == '=') return argv[*i] + n + 1;
  if (argv[*i][n] != '\0') return NULL;
  if (*i + 1 >= argc) {
    *missing = true;
    return NULL;
  }
  return argv[++*i];
}

bool xm_arg_int(const char *s, int64_t min, int64_t max, int64_t *out) {
  if (!s[0] || !(s[0] == '-' || (s[0] >= '0' && s[0] <= '9'))) return false;
  errno = 0;
  char *end = NULL;
  long long v = strtoll(s, &end, 10);
  if (errno || *end || v < min || v > max) return false;
  *out = v;
  return true;
}

int xm_args_check(const char *cmd, int argc, char **argv, const xm_flag_t *flags) {
  return xm_args_check_repeat(cmd, argc, argv, flags, NULL);
}

static bool is_repeatable(const char *name, const char *const *repeatable) {
  for (int i = 0; repeatable && repeatable[i]; i++)
    if (strcmp(repeatable[i], name) == 0) return true;
  return false;
}

int xm_args_check_repeat(const char *cmd, int argc, char **argv, const xm_flag_t *flags,
                         const char *const *repeatable) {
  int n = 0;
  while (flags[n].name)
    n++;
  unsigned char *seen = calloc((size_t)n + 1, 1);
  if (!seen) return 2;
  int rc = 0;
  for (int i = 0; i < argc && !rc; i++) {
    const char *arg = argv[i];
    if (arg[0] != '-' || arg[1] == '\0') continue; /* a positional argument, or "-" (stdin) */
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) continue;
    const char *eq = strchr(arg, '=');
    size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
    int k = -1;
    for (int j = 0; j < n && k < 0; j++)
      if (strlen(flags[j].name) == len && strncmp(flags[j].name, arg, len) == 0) k = j;
    if (k < 0) {
      const char *best = NULL;
      int best_d = 4; /* close misspellings only */
      char *name = malloc(len + 1);
      if (name) memcpy(name, arg, len), name[len] = '\0';
      for (int j = 0; name && j < n; j++) {
        int d = xm_edit_distance(name, flags[j].name);
        if (d < best_d && (size_t)d * 3 <= len) best_d = d, best = flags[j].name;
      }
      free(name);
      if (best)
        fprintf(stderr, "xmoec %s: error: unknown option '%s'; did you mean %s? (xmoec help %s)\n",
                cmd, arg, best, cmd);
      else
        fprintf(stderr, "xmoec %s: error: unknown option '%s' (xmoec help %s lists them)\n", cmd,
                arg, cmd);
      rc = 2;
    } else if (seen[k]++ && !is_repeatable(flags[k].name, repeatable)) {
      fprintf(stderr, "xmoec %s: error: %s given more than once\n", cmd, flags[k].name);
      rc = 2;
    } else if (!flags[k].takes_value && eq) {
      fprintf(stderr, "xmoec %s: error: %s takes no value\n", cmd, flags[k].name);
      rc = 2;
    } else if (flags[k].takes_value && !eq) {
      i++; /* its value, whatever it looks like (a missing one: the command says which) */
    }
  }
  free(seen);
  return rc;
}
