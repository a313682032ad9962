/* tools/xmoec/args.c — see args.h. */
#include "args.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

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
