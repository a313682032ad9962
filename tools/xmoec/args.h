/* tools/xmoec/args.h — the argument helpers every subcommand shares:
 * "--flag VALUE" / "--flag=VALUE" lookup, the checks of unknown and
 * repeated flags, and whole-integer parsing, so that every command accepts
 * and refuses flags the same way. */
#ifndef XM_TOOLS_ARGS_H
#define XM_TOOLS_ARGS_H

#include <stdbool.h>
#include <stdint.h>

/* The value of argv[*i] when it is `flag` ("--flag VALUE", which advances
 * *i past the value, or "--flag=VALUE"); NULL when argv[*i] is another
 * argument, or when the value is missing (then *missing is set). */
const char *xm_arg_value(int argc, char **argv, int *i, const char *flag, bool *missing);

/* One flag of a command: its name ("--dp", "-o") and whether it takes a
 * value ("--dp 2" or "--dp=2"). A command's table ends with {NULL}. */
typedef struct {
  const char *name;
  bool takes_value;
} xm_flag_t;

/* The checks every command makes the same way, before it parses argv
 * itself: an unknown option gets the closest known name ("did you mean
 * --dp?"), a flag given twice is an error (as in out/train: no silent "last
 * one wins"), a switch given a value too (a flag without its value is
 * left to the command, which says what the value is). --help and -h are
 * always known. Returns 0, or 2 after one message
 * "xmoec CMD: error: ..." on stderr. */
int xm_args_check(const char *cmd, int argc, char **argv, const xm_flag_t *flags);
/* The same, except that the flags named in `repeatable` (NULL-terminated)
 * may be given more than once ("--topology a --topology b"). */
int xm_args_check_repeat(const char *cmd, int argc, char **argv, const xm_flag_t *flags,
                         const char *const *repeatable);

/* A whole decimal integer in [min, max]: "2x", "", " 2" and overflow are
 * not. */
bool xm_arg_int(const char *s, int64_t min, int64_t max, int64_t *out);

#endif /* XM_TOOLS_ARGS_H */
