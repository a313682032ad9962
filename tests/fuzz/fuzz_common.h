/* tests/fuzz/fuzz_common.h — what the libFuzzer harnesses share.
 *
 * libFuzzer writes every new interesting input into the first corpus folder
 * on its command line. ctest passes the seed corpus in the source tree
 * (tests/fuzz/corpus/<name>/), so a test run would fill the checkout with
 * hundreds of generated files. When run by ctest (which sets XM_BINARY_DIR),
 * LLVMFuzzerInitialize therefore puts a scratch folder of the build tree,
 * <build>/fuzz-corpus/<name>, in front of the seed folder: libFuzzer reads
 * both and writes only to the scratch one. Run by hand, the harness leaves
 * its arguments alone. Included by exactly one file per fuzzer.
 */
#ifndef XM_TESTS_FUZZ_COMMON_H
#define XM_TESTS_FUZZ_COMMON_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);

/* Index of the first positional argument that names a folder, or -1. */
static int xm_fuzz_first_corpus(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (argv[i][0] != '-' && stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)) return i;
  }
  return -1;
}

static int xm_fuzz_mkdir(const char *path) {
  return mkdir(path, 0755) == 0 || errno == EEXIST ? 0 : -1;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  const char *bin = getenv("XM_BINARY_DIR");
  int at = xm_fuzz_first_corpus(*argc, *argv);
  if (!bin || !*bin || at < 0) return 0;
  const char *seed = (*argv)[at];
  size_t n = strlen(seed);
  while (n > 1 && seed[n - 1] == '/') n--;
  const char *base = seed + n;
  while (base > seed && base[-1] != '/') base--;

  /* Kept for the whole run: libFuzzer reads argv after this returns. */
  static char scratch[4096];
  int len = snprintf(scratch, sizeof scratch, "%s/fuzz-corpus", bin);
  if (len < 0 || (size_t)len >= sizeof scratch || xm_fuzz_mkdir(scratch) != 0) return 0;
  len = snprintf(scratch, sizeof scratch, "%s/fuzz-corpus/%.*s", bin,
                 (int)(seed + n - base), base);
  if (len < 0 || (size_t)len >= sizeof scratch || xm_fuzz_mkdir(scratch) != 0) return 0;

  static char **args;
  args = malloc(sizeof(char *) * (size_t)(*argc + 2));
  if (!args) return 0;
  for (int i = 0; i < at; i++) args[i] = (*argv)[i];
  args[at] = scratch;
  for (int i = at; i < *argc; i++) args[i + 1] = (*argv)[i];
  args[*argc + 1] = NULL;
  *argc += 1;
  *argv = args;
  fprintf(stderr, "fuzz: new inputs go to %s (seeds read from %s)\n", scratch, seed);
  return 0;
}

#endif /* XM_TESTS_FUZZ_COMMON_H */
