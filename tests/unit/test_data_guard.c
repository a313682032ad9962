/* tests/unit/test_data_guard.c — the data loader's SIGBUS guard
 * (runtime/io/data.c): a file truncated while a window reads it ends the
 * process with a message naming the file and exit code 1, and a SIGBUS
 * that is not a fault on one of the loader's mappings keeps its default
 * action.
 *
 * The public window call checks the file's size and modification time
 * before it reads, so a truncation reaches the mapping only in the instant
 * between that check and the copy. To fault deterministically, this test
 * includes data.c and calls its copy (read_stream) after truncating,
 * without the check. Each case runs in a child process, whose stderr is
 * read back through a pipe. */
#define _GNU_SOURCE
#include "runtime/io/data.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <sys/wait.h>

static char g_dir[256];

static int setup_dir(void **state) {
  (void)state;
  const char *base = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/xm-guard-XXXXXX", base && *base ? base : "/tmp");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown_dir(void **state) {
  (void)state;
  char p[400];
  const char *names[] = {"big.tok", "corpus.bin", "corpus.idx"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    snprintf(p, sizeof p, "%s/%s", g_dir, names[i]);
    unlink(p);
  }
  rmdir(g_dir);
  return 0;
}

/* What a child did: its wait status and its stderr. */
typedef struct {
  int status;
  char err[2048];
} outcome_t;

/* Runs body(arg) in a child with stderr on a pipe; the child exits 0 if
 * body returns. */
static outcome_t in_child(void (*body)(const char *), const char *arg) {
  outcome_t o;
  memset(&o, 0, sizeof o);
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], 2);
    signal(SIGBUS, SIG_DFL); /* as in a program: not cmocka's handler */
    body(arg);
    _exit(0);
  }
  close(fds[1]);
  size_t n = 0;
  ssize_t r;
  while (n + 1 < sizeof o.err && (r = read(fds[0], o.err + n, sizeof o.err - 1 - n)) > 0)
    n += (size_t)r;
  o.err[n] = 0;
  close(fds[0]);
  assert_int_equal(waitpid(pid, &o.status, 0), pid);
  return o;
}

enum { TOKENS = 4096, SEQ = 64 }; /* 16 KiB of u32 ids: four pages */

/* Opens path, truncates its token array to 16 bytes and copies the window at its end
 * without the change check; returns only if the copy does not fault. */
static void truncate_then_read(const char *path) {
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_rt_data_t *d = NULL;
  if (xm_rt_data_open(path, 1000, SEQ, 0.0, &diag, &d) != XM_OK) _exit(3);
  if (truncate(d->path, TOKENS_HEADER) != 0) _exit(4);
  int32_t out[SEQ];
  int64_t k0 = d->num_tokens - SEQ - 1;
  int64_t bad = read_stream(d, k0, SEQ, out);
  fprintf(stderr, "read without a fault (%lld)\n", (long long)bad);
}

/* Installs the guard with a mapping, then raises SIGBUS by hand. */
static void raise_sigbus(const char *path) {
  xm_diag_t diag;
  xm_diag_init(&diag);
  xm_rt_data_t *d = NULL;
  if (xm_rt_data_open(path, 1000, SEQ, 0.0, &diag, &d) != XM_OK) _exit(3);
  raise(SIGBUS);
}

static void write_tokens(const char *path) {
  static uint32_t toks[TOKENS];
  for (int i = 0; i < TOKENS; i++)
    toks[i] = (uint32_t)(i % 997);
  xm_diag_t diag;
  xm_diag_init(&diag);
  assert_int_equal(xm_rt_data_write_tokens(path, toks, TOKENS, 4, &diag), XM_OK);
  xm_diag_free(&diag);
}

static void test_truncated_token_file(void **state) {
  (void)state;
  char path[400];
  snprintf(path, sizeof path, "%s/big.tok", g_dir);
  write_tokens(path);
  outcome_t o = in_child(truncate_then_read, path);
  if (!WIFEXITED(o.status) || WEXITSTATUS(o.status) != 1) fprintf(stderr, "child: %s", o.err);
  assert_true(WIFEXITED(o.status));
  assert_int_equal(WEXITSTATUS(o.status), 1);
  char want[600];
  snprintf(want, sizeof want,
           "error: %s: the data file shrank while the program was reading it (it must not "
           "change during training)\n",
           path);
  assert_string_equal(o.err, want);
}

/* A Megatron pair: the .bin is guarded like a token file. */
static void test_truncated_megatron_bin(void **state) {
  (void)state;
  char prefix[400], idx[420], bin[420];
  snprintf(prefix, sizeof prefix, "%s/corpus", g_dir);
  snprintf(idx, sizeof idx, "%s.idx", prefix);
  snprintf(bin, sizeof bin, "%s.bin", prefix);
  /* one sequence of TOKENS int32 ids (dtype code 4) */
  unsigned char head[IDX_HEADER + 4 + 8 + 16];
  uint64_t version = 1, ns = 1, nd = 2;
  int32_t size = TOKENS;
  int64_t ptr = 0, docs[2] = {0, 1};
  memcpy(head, k_idx_magic, 9);
  memcpy(head + 9, &version, 8);
  head[17] = 4;
  memcpy(head + 18, &ns, 8);
  memcpy(head + 26, &nd, 8);
  memcpy(head + IDX_HEADER, &size, 4);
  memcpy(head + IDX_HEADER + 4, &ptr, 8);
  memcpy(head + IDX_HEADER + 12, docs, 16);
  FILE *f = fopen(idx, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(head, 1, sizeof head, f), sizeof head);
  fclose(f);
  static int32_t toks[TOKENS];
  for (int i = 0; i < TOKENS; i++)
    toks[i] = i % 997;
  f = fopen(bin, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(toks, 4, TOKENS, f), TOKENS);
  fclose(f);
  outcome_t o = in_child(truncate_then_read, prefix);
  if (!WIFEXITED(o.status) || WEXITSTATUS(o.status) != 1) fprintf(stderr, "child: %s", o.err);
  assert_true(WIFEXITED(o.status));
  assert_int_equal(WEXITSTATUS(o.status), 1);
  assert_non_null(strstr(o.err, bin));
  assert_non_null(strstr(o.err, "shrank while the program was reading it"));
}

/* A SIGBUS sent rather than faulted is not the loader's: default action. */
static void test_foreign_sigbus(void **state) {
  (void)state;
  char path[400];
  snprintf(path, sizeof path, "%s/big.tok", g_dir);
  write_tokens(path);
  outcome_t o = in_child(raise_sigbus, path);
  assert_true(WIFSIGNALED(o.status));
  assert_int_equal(WTERMSIG(o.status), SIGBUS);
  assert_null(strstr(o.err, "shrank"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_truncated_token_file),
      cmocka_unit_test(test_truncated_megatron_bin),
      cmocka_unit_test(test_foreign_sigbus),
  };
  return cmocka_run_group_tests(tests, setup_dir, teardown_dir);
}
