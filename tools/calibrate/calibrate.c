/* tools/calibrate/calibrate.c — xmoec-calibrate's command line, process set-up
 * and output (calibrate.h says what the program measures).
 *
 *   mpirun -np P xmoec-calibrate [--shapes FILE] [--quick] -o profile.json
 *
 * The process is set up as out/train sets itself up (runtime/driver/
 * train.c), so that the figures are those a training run would see: the
 * same one-time re-execution with the OpenMP wait policy and the OpenBLAS
 * kernel core chosen, the CPU backend's init (OpenMP threads per rank from
 * the cores of the machine divided among its ranks unless OMP_NUM_THREADS
 * says otherwise, OpenBLAS single-threaded) and the runtime context, whose
 * XM_RANKS_PER_NODE emulates nodes on one machine.
 *
 * Bad flags and bad input (a --shapes file, an output that cannot be
 * written) are reported once and end every rank with exit code 2; a
 * failure of the machine (memory, MPI) is reported by the rank that sees it
 * and ends the whole job with exit code 1 through MPI_Abort, so no rank is
 * left waiting for another.
 */
#define _GNU_SOURCE /* strdup, gmtime_r */
#include <cjson/cJSON.h>
#include <errno.h>
#include <libgen.h>
#include <math.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "frontend/spec.h"
#include "runtime/driver/blas_core.h"
#include "support/diag.h"
#include "support/strbuf.h"
#include "tools/calibrate/calibrate.h"

/* ---- failures and progress --------------------------------------------------- */

static const xm_rt_context_t *g_ctx; /* set once the context exists */

void cal_set_context(const xm_rt_context_t *ctx) { g_ctx = ctx; }

/* The runtime's abort (one line in one write, every rank ended), which
 * names the rank; before the context exists there is no job to end. */
void cal_fatal(const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (g_ctx) xm_rt_abort(g_ctx, 1, CAL_PROG ": error: %s", msg);
  fprintf(stderr, CAL_PROG ": error: %s\n", msg);
  exit(1);
}

void *cal_alloc(const cal_t *c, size_t bytes, const char *what) {
  void *p = c->be->alloc(c->be, bytes);
  if (!p) cal_fatal("out of memory for %s (%zu bytes)", what, bytes);
  return p;
}

void cal_progress(const cal_t *c, const char *section, int done, int total, double started) {
  if (c->ctx.rank != 0) return;
  if (done < total && !c->tty) return;
  /* One write per update, so that the launcher, which forwards stderr as
   * it comes, never splits the line around another stream's. */
  char line[160];
  if (done >= total)
    snprintf(line, sizeof line, "%scalibrate: %s %d/%d done in %.1f s\n", c->tty ? "\r" : "",
             section, done, total, MPI_Wtime() - started);
  else
    snprintf(line, sizeof line, "\rcalibrate: %s %d/%d ...", section, done, total);
  fputs(line, stderr);
  fflush(stderr);
}

const char *cal_op_name(int op) {
  static const char *const names[CAL_OP_COUNT] = {"fwd", "dx", "dw"};
  return op >= 0 && op < CAL_OP_COUNT ? names[op] : "?";
}

const char *cal_kind_name(int kind) {
  static const char *const names[CAL_KIND_COUNT] = {"all_reduce", "all_gather", "reduce_scatter",
                                                    "all_to_all"};
  return kind >= 0 && kind < CAL_KIND_COUNT ? names[kind] : "?";
}

/* An MPI error on any communicator: the message, then the whole job ends
 * with exit code 1 (the default handler's exit code is MPI's own). */
static void on_mpi_error(MPI_Comm *comm, int *code, ...) {
  (void)comm;
  char text[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  MPI_Error_string(*code, text, &len);
  cal_fatal("MPI: %s", text);
}

/* ---- the command line -------------------------------------------------------- */

typedef struct {
  const char *out;
  const char *shapes;
  const char *cluster; /* --cluster FILE */
  int quick;
  int help;
} cal_args_t;

static void usage(FILE *f) {
  fprintf(f, "usage: [mpirun -np P] xmoec calibrate [--cluster FILE] [--shapes FILE] [--quick]\n"
             "                                   -o PROFILE.json\n"
             "\n"
             "Measures what the cost model of training needs to know about this machine,\n"
             "with the kernels and the communicator out/train runs: GEMM throughput\n"
             "(forward, dx, dw), memory bandwidth (STREAM triad), the cost of one kernel\n"
             "call, and all_reduce, all_gather, reduce_scatter and all_to_all with a\n"
             "latency + bandwidth fit each. All P ranks measure at the same time, so the\n"
             "profile holds for runs with as many ranks per machine.\n"
             "\n"
             "  -o, --output FILE  the profile to write (JSON; required)\n"
             "  --cluster FILE     the cluster (as xmoec plan reads it): its name goes into\n"
             "                     the profile, its ranks_per_node forms the nodes unless\n"
             "                     XM_RANKS_PER_NODE says otherwise\n"
             "  --shapes FILE      the GEMM shapes: a JSON array of {\"m\":M,\"n\":N,\"k\":K},\n"
             "                     y[M,N] = x[M,K] w[N,K]^T (default: m 64..4096, n and k\n"
             "                     128..2048)\n"
             "  --quick            fewer shapes and sizes, shorter timings (a smoke test)\n"
             "  -h, --help         this text\n"
             "\n"
             "Environment: OMP_NUM_THREADS=N threads per rank (default: the machine's\n"
             "cores divided among its ranks); XM_RANKS_PER_NODE=N makes every N\n"
             "consecutive ranks one node; OPENBLAS_CORETYPE=NAME the BLAS kernels\n"
             "(default: the best the CPU supports).\n");
}

/* A flag's value: "--flag VALUE" or "--flag=VALUE". Returns 1 when argv[*i]
 * is that flag (then *value is set, NULL when missing), 0 otherwise. */
static int flag_value(int argc, char **argv, int *i, const char *flag, const char *alias,
                      const char **value) {
  const char *a = argv[*i];
  size_t n = strlen(flag);
  if (strncmp(a, flag, n) == 0 && a[n] == '=') {
    *value = a + n + 1;
    return 1;
  }
  if (strcmp(a, flag) != 0 && !(alias && strcmp(a, alias) == 0)) return 0;
  *value = *i + 1 < argc ? argv[++*i] : NULL;
  return 1;
}

/* 0, or 2 with the message in err. --help anywhere wins over errors. */
static int parse_args(int argc, char **argv, cal_args_t *a, char *err, size_t cap) {
  memset(a, 0, sizeof *a);
  err[0] = '\0';
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i], *v = NULL;
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
      a->help = 1;
    } else if (strcmp(arg, "--quick") == 0) {
      a->quick = 1;
    } else if (flag_value(argc, argv, &i, "--cluster", NULL, &v)) {
      if (!v || !*v) {
        if (!err[0]) snprintf(err, cap, "--cluster needs a file name");
      } else {
        a->cluster = v;
      }
    } else if (flag_value(argc, argv, &i, "--output", "-o", &v) ||
               flag_value(argc, argv, &i, "--shapes", NULL, &v)) {
      int is_out = strcmp(arg, "--shapes") != 0 && strncmp(arg, "--shapes=", 9) != 0;
      if (!v || !*v) {
        if (!err[0]) snprintf(err, cap, "%s needs a file name", is_out ? "-o" : "--shapes");
      } else if (is_out) {
        a->out = v;
      } else {
        a->shapes = v;
      }
    } else if (!err[0]) {
      if (arg[0] == '-')
        snprintf(err, cap, "unknown flag '%s'", arg);
      else
        snprintf(err, cap, "unexpected argument '%s'", arg);
    }
  }
  if (!err[0] && !a->out) snprintf(err, cap, "-o FILE is required (where to write the profile)");
  return err[0] ? 2 : 0;
}

/* --cluster FILE, read and checked as `xmoec plan` reads it: its name goes
 * into the profile, and unless XM_RANKS_PER_NODE is set its ranks per node
 * say which ranks form a node (the context then checks that they tile the
 * world). Before MPI starts; 2 after a message on a bad file. */
static int launcher_rank_zero(void);
static int load_cluster(const char *path, char *name, size_t cap) {
  char *text = NULL;
  size_t len = 0;
  xm_diag_t d;
  xm_diag_init(&d);
  int err = xm_read_file(path, &text, &len);
  xm_spec_t spec;
  memset(&spec, 0, sizeof spec);
  int rc = 0;
  if (err) {
    char why[160];
    xm_diag_add(&d, XM_DIAG_ERROR, path, NULL, "cannot read: %s",
                xm_read_error(err, XM_READ_LIMIT_TEXT, why, sizeof why));
    rc = 2;
  } else if (xm_spec_load_cluster_text(text, len, path, &d, &spec) != XM_OK ||
             xm_diag_error_count(&d) > 0) {
    rc = 2;
  }
  if (rc && launcher_rank_zero()) xm_diag_print(&d, stderr);
  if (!rc) {
    snprintf(name, cap, "%s", spec.cluster.name);
    const char *env = getenv("XM_RANKS_PER_NODE");
    if ((!env || !*env) && spec.cluster.ranks_per_node > 0) {
      char v[32];
      snprintf(v, sizeof v, "%lld", (long long)spec.cluster.ranks_per_node);
      setenv("XM_RANKS_PER_NODE", v, 1);
    }
  }
  xm_diag_free(&d);
  free(text);
  return rc;
}

/* Before MPI starts, the launcher's rank, so that a usage message is
 * printed once for the whole job: 1 on rank 0 or when started alone. */
static int launcher_rank_zero(void) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v) return strcmp(v, "0") == 0;
  }
  return 1;
}

/* ---- the set-up out/train makes ---------------------------------------------- */

/* The CPU backend prepared as out/train prepares it (setup_backend there),
 * from this rank's index among the ranks of its machine and their number;
 * the machine's communicator stays for the timing of the triad. An MPI
 * failure here ends the job through the error handler. */
static void setup_backend(cal_t *c) {
  int index = 0, count = 1;
  MPI_Comm_split_type(c->ctx.world_comm, MPI_COMM_TYPE_SHARED, c->ctx.rank, MPI_INFO_NULL,
                      &c->machine);
  MPI_Comm_rank(c->machine, &index);
  MPI_Comm_size(c->machine, &count);
  c->be = xm_rt_cpu_backend();
  char err[256] = "";
  c->threads = 1;
  if (c->be->init && c->be->init(c->be, index, count, &c->threads, err, sizeof err) != 0)
    cal_fatal("the cpu backend cannot start: %s", err[0] ? err : "no reason given");
}

/* ---- inputs ------------------------------------------------------------------- */

/* Bounds of a --shapes entry: each dimension, and each of the three
 * matrices of a shape (1 GiB of floats), so that a typo is a message, not
 * an allocation of terabytes. */
#define CAL_DIM_MAX ((int64_t)1 << 20)
#define CAL_MATRIX_MAX ((int64_t)1 << 28)
#define CAL_SHAPES_MAX 4096

static cal_shape_t *default_shapes(int quick, int *count) {
  static const int64_t m_all[] = {64, 256, 1024, 4096}, nk_all[] = {128, 384, 1024, 2048};
  static const int64_t m_quick[] = {64, 256}, nk_quick[] = {128, 1024};
  const int64_t *ms = quick ? m_quick : m_all, *nks = quick ? nk_quick : nk_all;
  int nm = quick ? 2 : 4, nnk = quick ? 2 : 4;
  cal_shape_t *s = calloc((size_t)(nm * nnk * nnk), sizeof *s);
  if (!s) cal_fatal("out of memory for the GEMM shapes");
  int n = 0;
  for (int i = 0; i < nm; i++)
    for (int j = 0; j < nnk; j++)
      for (int k = 0; k < nnk; k++)
        s[n++] = (cal_shape_t){ms[i], nks[j], nks[k]};
  *count = n;
  return s;
}

static int shape_dim(const cJSON *item, const char *key, int64_t *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(item, key);
  if (!cJSON_IsNumber(v)) return 0;
  double d = v->valuedouble;
  if (!(d >= 1 && d <= (double)CAL_DIM_MAX) || d != floor(d)) return 0;
  *out = (int64_t)d;
  return 1;
}

/* Whether a --shapes entry is an object of m, n and k only (a misspelt
 * member would otherwise be a default nobody asked for). */
static int only_mnk(const cJSON *item) {
  if (!cJSON_IsObject(item)) return 0;
  const cJSON *key;
  cJSON_ArrayForEach(key, item) {
    if (!key->string || (strcmp(key->string, "m") != 0 && strcmp(key->string, "n") != 0 &&
                         strcmp(key->string, "k") != 0))
      return 0;
  }
  return 1;
}

/* Checks the parsed --shapes array into `shapes` (room for all); 0, or -1
 * with a message in err. */
static int check_shapes(const char *path, const cJSON *root, cal_shape_t *shapes, char *err,
                        size_t cap) {
  int i = 0;
  const cJSON *item;
  cJSON_ArrayForEach(item, root) {
    cal_shape_t *s = &shapes[i];
    if (!only_mnk(item) || !shape_dim(item, "m", &s->m) || !shape_dim(item, "n", &s->n) ||
        !shape_dim(item, "k", &s->k)) {
      snprintf(err, cap,
               "%s: shape %d: must be {\"m\":M,\"n\":N,\"k\":K} with integers from 1 to %lld "
               "and no other members",
               path, i, (long long)CAL_DIM_MAX);
      return -1;
    }
    if (s->m * s->k > CAL_MATRIX_MAX || s->n * s->k > CAL_MATRIX_MAX ||
        s->m * s->n > CAL_MATRIX_MAX) {
      snprintf(err, cap, "%s: shape %d: m %lld n %lld k %lld has a matrix of more than %lld floats",
               path, i, (long long)s->m, (long long)s->n, (long long)s->k,
               (long long)CAL_MATRIX_MAX);
      return -1;
    }
    i++;
  }
  return 0;
}

/* Reads and checks a --shapes file; NULL with a message in err. */
static cal_shape_t *load_shapes(const char *path, int *count, char *err, size_t cap) {
  char *text = NULL, why[128];
  size_t len = 0;
  int rc = xm_read_file(path, &text, &len);
  if (rc != 0) {
    snprintf(err, cap, "cannot read %s: %s", path,
             xm_read_error(rc, XM_READ_LIMIT_TEXT, why, sizeof why));
    return NULL;
  }
  cJSON *root = cJSON_ParseWithLength(text, len);
  cal_shape_t *shapes = NULL;
  int n = root ? cJSON_GetArraySize(root) : 0;
  if (!root) {
    const char *at = cJSON_GetErrorPtr();
    int line = 1, col = 1;
    if (at && at >= text && at <= text + len)
      xm_text_line_col(text, (size_t)(at - text), &line, &col);
    snprintf(err, cap, "%s:%d:%d: not valid JSON", path, line, col);
  } else if (!cJSON_IsArray(root) || n == 0 || n > CAL_SHAPES_MAX) {
    snprintf(err, cap, "%s: must be a JSON array of 1 to %d objects {\"m\":M,\"n\":N,\"k\":K}",
             path, CAL_SHAPES_MAX);
  } else {
    shapes = calloc((size_t)n, sizeof *shapes);
    if (!shapes) cal_fatal("out of memory for %d GEMM shapes", n);
    if (check_shapes(path, root, shapes, err, cap) != 0) {
      free(shapes);
      shapes = NULL;
    } else {
      *count = n;
    }
  }
  cJSON_Delete(root);
  free(text);
  return shapes;
}

/* Whether the profile can be written where -o says, checked before the
 * measurements so that a typo does not cost the whole run. */
static int check_output(const char *path, char *err, size_t cap) {
  struct stat st;
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
    snprintf(err, cap, "-o %s: is a directory", path);
    return 0;
  }
  char *copy = strdup(path);
  if (!copy) cal_fatal("out of memory");
  const char *dir = dirname(copy);
  int ok = access(dir, W_OK | X_OK) == 0;
  if (!ok) snprintf(err, cap, "-o %s: cannot write in %s: %s", path, dir, strerror(errno));
  free(copy);
  return ok;
}

/* Rank 0 checks the inputs and tells every rank; the shapes go to all. On
 * bad input rank 0 prints the message and every rank returns 2. */
static int agree_inputs(const cal_t *c, const cal_args_t *a, cal_shape_t **shapes, int *count) {
  char err[1024] = "";
  int head[2] = {0, 0}; /* status, number of shapes */
  if (c->ctx.rank == 0) {
    *shapes = a->shapes ? load_shapes(a->shapes, count, err, sizeof err)
                        : default_shapes(c->quick, count);
    if (*shapes && !check_output(a->out, err, sizeof err)) {
      free(*shapes);
      *shapes = NULL;
    }
    head[0] = *shapes ? 0 : 2;
    head[1] = *shapes ? *count : 0;
    if (head[0]) fprintf(stderr, CAL_PROG ": error: %s\n", err);
  }
  MPI_Bcast(head, 2, MPI_INT, 0, c->ctx.world_comm);
  if (head[0]) return head[0];
  *count = head[1];
  int64_t *dims = malloc(sizeof(int64_t) * 3 * (size_t)*count);
  if (!dims) cal_fatal("out of memory for %d GEMM shapes", *count);
  if (c->ctx.rank == 0)
    for (int i = 0; i < *count; i++) {
      dims[3 * i] = (*shapes)[i].m;
      dims[3 * i + 1] = (*shapes)[i].n;
      dims[3 * i + 2] = (*shapes)[i].k;
    }
  MPI_Bcast(dims, 3 * *count, MPI_INT64_T, 0, c->ctx.world_comm);
  if (c->ctx.rank != 0) {
    *shapes = calloc((size_t)*count, sizeof **shapes);
    if (!*shapes) cal_fatal("out of memory for %d GEMM shapes", *count);
    for (int i = 0; i < *count; i++)
      (*shapes)[i] = (cal_shape_t){dims[3 * i], dims[3 * i + 1], dims[3 * i + 2]};
  }
  free(dims);
  return 0;
}

/* ---- the profile ---------------------------------------------------------------- */

/* The processor's name as the kernel reports it, or "unknown". */
static void cpu_model(char *buf, size_t cap) {
  snprintf(buf, cap, "unknown");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10) != 0) continue;
    const char *v = strchr(line, ':');
    if (!v) break;
    v++;
    while (*v == ' ' || *v == '\t')
      v++;
    size_t n = strcspn(v, "\r\n");
    while (n > 0 && (v[n - 1] == ' ' || v[n - 1] == '\t'))
      n--;
    if (n > 0) snprintf(buf, cap, "%.*s", (int)n, v);
    break;
  }
  fclose(f);
}

/* Four significant digits: the repetitions do not make the figures any
 * more precise than that, and the profile stays readable. */
static double sig4(double v) {
  if (!(v > 0) || !isfinite(v)) return v;
  double scale = pow(10.0, 3.0 - floor(log10(v)));
  return round(v * scale) / scale;
}

typedef struct {
  cal_gemm_t *gemm;
  int gemm_count;
  double triad_rank, triad_total;
  double call_us;
  cal_coll_t *coll;
  int coll_count;
  cal_fit_t fits[2 * CAL_KIND_COUNT];
  int fit_count;
} cal_results_t;

static cJSON *profile_json(const cal_t *c, const cal_results_t *r) {
  cJSON *root = cJSON_CreateObject();
  char cpu[256], created[32];
  cpu_model(cpu, sizeof cpu);
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", &tm);
  const char *core = xm_blas_core_running();
  cJSON_AddStringToObject(root, "kind", "xmoec-profile");
  cJSON_AddNumberToObject(root, "version", 1);
  cJSON_AddStringToObject(root, "backend", c->be->name);
  cJSON_AddNumberToObject(root, "ranks", c->ctx.world);
  cJSON_AddNumberToObject(root, "ranks_per_node", c->ctx.ranks_per_node);
  cJSON_AddNumberToObject(root, "threads_per_rank", c->threads);
  if (core)
    cJSON_AddStringToObject(root, "blas_core", core);
  else
    cJSON_AddNullToObject(root, "blas_core");
  cJSON_AddStringToObject(root, "cpu", cpu);
  cJSON_AddStringToObject(root, "created", created);
  if (c->cluster[0])
    cJSON_AddStringToObject(root, "cluster", c->cluster);
  else
    cJSON_AddNullToObject(root, "cluster");

  cJSON *gemm = cJSON_AddArrayToObject(root, "gemm");
  for (int i = 0; i < r->gemm_count; i++) {
    const cal_gemm_t *g = &r->gemm[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "op", cal_op_name(g->op));
    cJSON_AddNumberToObject(o, "m", (double)g->shape.m);
    cJSON_AddNumberToObject(o, "n", (double)g->shape.n);
    cJSON_AddNumberToObject(o, "k", (double)g->shape.k);
    cJSON_AddNumberToObject(o, "gflops", sig4(g->gflops));
    cJSON_AddItemToArray(gemm, o);
  }
  cJSON *mem = cJSON_AddObjectToObject(root, "memory");
  cJSON_AddNumberToObject(mem, "triad_gbps_per_rank", sig4(r->triad_rank));
  cJSON_AddNumberToObject(mem, "triad_gbps_total", sig4(r->triad_total));
  cJSON *over = cJSON_AddObjectToObject(root, "overhead");
  cJSON_AddNumberToObject(over, "call_us", sig4(r->call_us));

  cJSON *coll = cJSON_AddArrayToObject(root, "collectives");
  for (int i = 0; i < r->coll_count; i++) {
    const cal_coll_t *p = &r->coll[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "kind", cal_kind_name(p->kind));
    cJSON_AddNumberToObject(o, "group", p->group);
    cJSON_AddBoolToObject(o, "inter_node", p->inter_node);
    cJSON_AddNumberToObject(o, "bytes", (double)p->bytes);
    cJSON_AddNumberToObject(o, "seconds", sig4(p->seconds));
    cJSON_AddItemToArray(coll, o);
  }
  cJSON *fits = cJSON_AddArrayToObject(root, "collective_fits");
  for (int i = 0; i < r->fit_count; i++) {
    const cal_fit_t *f = &r->fits[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "kind", cal_kind_name(f->kind));
    cJSON_AddBoolToObject(o, "inter_node", f->inter_node);
    cJSON_AddNumberToObject(o, "latency_us", sig4(f->latency_us));
    cJSON_AddNumberToObject(o, "bandwidth_gbps", sig4(f->bandwidth_gbps));
    cJSON_AddItemToArray(fits, o);
  }
  return root;
}

/* Writes the profile beside its final name and renames it, so that a
 * reader never sees half a profile. 0, or 2 with the message printed. */
static int write_profile(const char *path, const cJSON *root) {
  char *text = cJSON_Print(root);
  if (!text) cal_fatal("out of memory for the profile's text");
  size_t n = strlen(path) + 5;
  char *tmp = malloc(n);
  if (!tmp) cal_fatal("out of memory");
  snprintf(tmp, n, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  int ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
  if (f && fclose(f) != 0) ok = 0;
  if (ok && rename(tmp, path) != 0) ok = 0;
  if (!ok) {
    fprintf(stderr, CAL_PROG ": error: cannot write %s: %s\n", path, strerror(errno));
    remove(tmp);
  }
  free(tmp);
  free(text);
  return ok ? 0 : 2;
}

static void print_summary(const cal_t *c, const cal_results_t *r, const char *path,
                          double seconds) {
  const char *core = xm_blas_core_running();
  char cpu[256];
  cpu_model(cpu, sizeof cpu);
  printf("calibrate: wrote %s in %.1f s: %d rank%s (%d per node) x %d thread%s, %s, BLAS core %s\n",
         path, seconds, c->ctx.world, c->ctx.world == 1 ? "" : "s", c->ctx.ranks_per_node,
         c->threads, c->threads == 1 ? "" : "s", cpu, core ? core : "none");
  for (int op = 0; op < CAL_OP_COUNT; op++) {
    const cal_gemm_t *best = NULL;
    for (int i = 0; i < r->gemm_count; i++)
      if (r->gemm[i].op == op && (!best || r->gemm[i].gflops > best->gflops)) best = &r->gemm[i];
    if (best)
      printf("calibrate:   gemm %-3s best %8.1f GFLOP/s per rank (m %lld n %lld k %lld)\n",
             cal_op_name(op), best->gflops, (long long)best->shape.m, (long long)best->shape.n,
             (long long)best->shape.k);
  }
  printf("calibrate:   triad %.1f GB/s per rank, %.1f GB/s in all; one kernel call %.3f us\n",
         r->triad_rank, r->triad_total, r->call_us);
  for (int i = 0; i < r->fit_count; i++) {
    const cal_fit_t *f = &r->fits[i];
    printf("calibrate:   %-14s %s: %8.1f us + bytes / %.2f GB/s (%d points)\n",
           cal_kind_name(f->kind), f->inter_node ? "inter-node" : "intra-node", f->latency_us,
           f->bandwidth_gbps, f->points);
  }
  fflush(stdout);
}

int main(int argc, char **argv) {
  cal_args_t args;
  char err[512];
  int rc = parse_args(argc, argv, &args, err, sizeof err);
  if (args.help || rc != 0) {
    if (launcher_rank_zero()) {
      if (args.help)
        usage(stdout);
      else
        fprintf(stderr, CAL_PROG ": error: %s (see --help)\n", err);
    }
    return args.help ? 0 : rc;
  }
  /* out/train's start-up (runtime/driver/blas_core.h): the OpenMP spin and
   * the OpenBLAS core change what every section measures, so the profile
   * is taken under them too. */
  xm_rt_reexec_once(argv);

  cal_t c;
  memset(&c, 0, sizeof c);
  c.quick = args.quick;
  if (args.cluster) {
    rc = load_cluster(args.cluster, c.cluster, sizeof c.cluster);
    if (rc != 0) return rc;
  }
  xm_status_t st = xm_rt_context_create(&argc, &argv, &c.ctx);
  if (st != XM_OK) {
    /* A bad XM_RANKS_PER_NODE has been named by the context already. */
    if (st != XM_ERR_INVALID_INPUT) fprintf(stderr, CAL_PROG ": error: MPI does not start\n");
    return xm_status_exit_code(st);
  }
  cal_set_context(&c.ctx);
  MPI_Errhandler handler;
  MPI_Comm_create_errhandler(on_mpi_error, &handler);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, handler);
  /* The communicator's groups are split from the world copy and inherit
   * its handler. */
  MPI_Comm_set_errhandler(c.ctx.world_comm, handler);
  MPI_Comm_set_errhandler(c.ctx.node_comm, handler);
  c.tty = c.ctx.rank == 0 && isatty(STDERR_FILENO);
  double started = MPI_Wtime();
  setup_backend(&c);

  cal_shape_t *shapes = NULL;
  int nshapes = 0;
  rc = agree_inputs(&c, &args, &shapes, &nshapes);
  if (rc != 0) {
    MPI_Comm_free(&c.machine);
    MPI_Errhandler_free(&handler);
    xm_rt_context_destroy(&c.ctx);
    return rc;
  }
  int tmin = c.threads, tmax = c.threads;
  MPI_Allreduce(MPI_IN_PLACE, &tmin, 1, MPI_INT, MPI_MIN, c.ctx.world_comm);
  MPI_Allreduce(MPI_IN_PLACE, &tmax, 1, MPI_INT, MPI_MAX, c.ctx.world_comm);
  if (c.ctx.rank == 0) {
    fprintf(stderr, "calibrate: %d rank%s (%d per node) x %d thread%s, %d GEMM shapes%s\n",
            c.ctx.world, c.ctx.world == 1 ? "" : "s", c.ctx.ranks_per_node, c.threads,
            c.threads == 1 ? "" : "s", nshapes, c.quick ? ", quick" : "");
    /* The profile records one thread count; ranks that were bound to fewer
     * cores than the others make it an approximation. */
    if (tmin != tmax)
      fprintf(stderr, "calibrate: warning: ranks run %d to %d threads; the profile says %d\n", tmin,
              tmax, c.threads);
  }

  cal_results_t r;
  memset(&r, 0, sizeof r);
  r.gemm = cal_run_gemm(&c, shapes, nshapes);
  r.gemm_count = nshapes * CAL_OP_COUNT;
  cal_run_memory(&c, &r.triad_rank, &r.triad_total);
  r.call_us = cal_run_overhead(&c);
  r.coll = cal_run_collectives(&c, &r.coll_count);
  r.fit_count = cal_fit(r.coll, r.coll_count, r.fits);

  int wrote = 0;
  if (c.ctx.rank == 0) {
    cJSON *root = profile_json(&c, &r);
    if (!root) cal_fatal("out of memory for the profile");
    wrote = write_profile(args.out, root);
    cJSON_Delete(root);
    if (wrote == 0) print_summary(&c, &r, args.out, MPI_Wtime() - started);
  }
  MPI_Bcast(&wrote, 1, MPI_INT, 0, c.ctx.world_comm);
  free(shapes);
  free(r.gemm);
  free(r.coll);
  MPI_Comm_free(&c.machine);
  MPI_Errhandler_free(&handler);
  xm_rt_context_destroy(&c.ctx);
  return wrote;
}
