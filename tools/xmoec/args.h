/* tools/xmoec/args.h — the argument helpers every subcommand shares:
 * "--flag VALUE" / "--flag=VALUE" lookup and whole-integer parsing, so
 * that every command accepts and refuses flags the same way. */
#ifndef XM_TOOLS_ARGS_H
#define XM_TOOLS_ARGS_H

#include <stdbool.h>
#include <stdint.h>

/* The value of argv[*i] when it is `flag` ("--flag VALUE", which advances
 * *i past the value, or "--flag=VALUE"); NULL when argv[*i] is another
 * argument, or when the value is missing (then *missing is set). */
const char *xm_arg_value(int argc, char **argv, int *i, const char *flag, bool *missing);

/* A whole decimal integer in [min, max]: "2x", "", " 2" and overflow are
 * not. */
bool xm_arg_int(const char *s, int64_t min, int64_t max, int64_t *out);

#endif /* XM_TOOLS_ARGS_H */
