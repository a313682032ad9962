/* tools/xmoec/cmd_compile.c — `xmoec compile`: a spec to a training program.
 *
 *   spec (+ cluster) -> forward graph (ir/model.c) -> the pass pipeline
 *   "[shard{...},]fuse-permute-gemm,autodiff{...},[recompute{...},]canonicalize,...,
 *   plan-memory,schedule" (build_pipeline has the whole list) ->
 *   out/program.c, out/main.c, out/config.json, out/model.xir,
 *   out/manifest.json -> the system C compiler with the runtime archives ->
 *   out/train.
 *
 * The parallel layout is the spec's (its "parallel" section and the
 * cluster's ranks_per_node, frontend/layout.h) with each layout flag
 * (--dp --tp --ep --ssmb --rbd --zero --ranks-per-node) overriding its knob.
 * When neither the spec nor a flag fixes any of it but a cluster is given
 * (--cluster or the spec's "cluster" section), the planner chooses it
 * (planner/plan.h, policy xmoec, the spec's recompute policy only, since
 * that is what the recompute pass builds into the program): the layout and
 * micro-batch of the fastest configuration that fits are written into the spec's parallel
 * and training sections and compiled, and the report says which was chosen
 * and why. Without a cluster and without a layout the program is one rank,
 * as before;
 * xm_layout_check judges it before anything is built, placing refusals at
 * the flags when any was given, else at /parallel/... . With more than one
 * rank (dp*tp > 1) the pipeline starts with the shard pass, which turns the
 * forward graph into one rank's graph with its collectives, and gradient
 * accumulation counts the micro-batches of one rank:
 * global_batch / (micro_batch * dp). With one rank the pipeline is the
 * single-process one, unchanged. The user never writes the pipeline, so it
 * is printed as a note when lowering fails; the report names the layout
 * and, after a build, the mpirun line that starts the program.
 *
 * Problems with what the user gave (flags, spec, an architecture training
 * cannot do yet, an output folder that cannot be written) exit 2 with their
 * place; a pass or the code generator failing is our bug (exit 1), and so
 * is a generated program that does not compile (the compiler's output is
 * shown). The compiler runs through posix_spawnp with an argv array, never
 * a shell, so paths with spaces or quotes cannot change the command; its
 * flags come from xm_build_config.h (written by CMake into the build
 * folder) unless XMOEC_CC, XMOEC_CFLAGS or XMOEC_LIBS say otherwise, and
 * flag strings are split on spaces. Everything written is deterministic:
 * compiling the same spec twice gives byte-identical files (the manifest
 * records input hashes, not times).
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "args.h"
#include "codegen/c_program.h"
#include "codegen/target.h"
#include "frontend/layout.h"
#include "frontend/spec.h"
#include "ir/model.h"
#include "ir/text.h"
#include "passes/pass.h"
#include "passes/plan_memory.h"
#include "planner/placement.h"
#include "planner/plan.h"
#include "support/diag.h"
#include "support/sha256.h"
#include "support/strbuf.h"
#include "tools/xmoec/commands.h"
#include "xm_build_config.h"

extern char **environ;

typedef struct {
  const char *input;
  const char *cluster;
  const char *placement; /* --placement FILE */
  const char *out_dir;
  const char *cc;
  const char *target;   /* codegen/target.h; "cpu" when not given */
  const char *gpu_arch; /* --gpu-arch; NULL: the cluster's, else the target's default */
  bool print_after_all, timing, no_build, print_flags, no_fuse, no_overlap;
  bool emulate; /* GPU targets: build the kernels for the CPU emulation of the GPU */
  int64_t layout_value[XM_LAYOUT_RANKS_PER_NODE + 1]; /* by xm_layout_knob_t */
  unsigned layout_given;  /* bit 1 << xm_layout_knob_t per layout flag given */
  int64_t dispatch_bound; /* expert receive buffers: min(ep, this) x rows sent */
  int64_t micro_batch;    /* --micro-batch; 0: the spec's (or the planner's) */
  int64_t global_batch;   /* --global-batch; 0: the spec's */
  int recompute;          /* --recompute as xm_recompute_t; -1: the spec's (or the planner's) */
  bool force;             /* --force: build a program larger than the device memory */
} compile_args_t;

static void compile_usage(FILE *out) {
  fprintf(out, "usage: xmoec compile MODEL.json [--cluster FILE] -o OUT [--no-build] [--cc CC]\n"
               "                     [--target cpu|hip|cuda] [--gpu-arch ARCH] [--emulate]\n"
               "                     [--dp N] [--tp N] [--ep N] [--ssmb] [--rbd] [--zero N]\n"
               "                     [--ranks-per-node N] [--dispatch-bound B] [--placement FILE]\n"
               "                     [--micro-batch N] [--global-batch N] [--force]\n"
               "                     [--recompute none|selective|full]\n"
               "                     [--no-fuse] [--no-overlap] [--print-ir-after-all] [--timing]\n"
               "       xmoec compile --print-build-flags\n"
               "\n"
               "Builds the training program of a model: forward graph, autodiff, memory\n"
               "plan and schedule, then C code in OUT/ (program.c, main.c, config.json,\n"
               "model.xir, manifest.json), compiled with the runtime into OUT/train.\n"
               "With dp*tp > 1 ranks the program is one rank's share: run it with\n"
               "mpirun -np <dp*tp> OUT/train ... (docs/parallelism.md).\n"
               "\n"
               "  -o OUT                 output folder (created if missing)\n"
               "  --cluster FILE         a cluster description checked with the spec\n"
               "  --placement FILE       place the routed experts as FILE says (written by\n"
               "                         `xmoec place`; docs/placement.md): which experts share\n"
               "                         a node; checkpoints keep the Hugging Face numbering\n"
               "  --micro-batch N        sequences per rank per micro-step (overrides\n"
               "                         /training/micro_batch)\n"
               "  --global-batch N       sequences per optimizer step (overrides\n"
               "                         /training/global_batch)\n"
               "  --recompute P          none, selective or full (overrides /training/recompute)\n"
               "  --force                build even when the program needs more memory per rank\n"
               "                         than the cluster's devices have (else exit 2)\n"
               "  --no-build             write the sources only\n"
               "  --cc CC                C compiler (default: XMOEC_CC or the build's)\n"
               "  --target T             code generation target: cpu (default: C calling the CPU\n"
               "                         kernels), hip (AMD GPUs: kernels specialised to the\n"
               "                         plan in OUT/kernels.hip, built with hipcc) or cuda\n"
               "                         (the same kernel text built with nvcc for NVIDIA)\n"
               "  --gpu-arch ARCH        GPU architecture (hip: gfx90a by default, e.g. gfx942;\n"
               "                         cuda: sm_90 by default, e.g. sm_90a); default the\n"
               "                         cluster's gpu_arch\n"
               "  --emulate              GPU targets: build OUT/train with the kernels compiled\n"
               "                         for the CPU emulation of the GPU (runs anywhere, slowly;\n"
               "                         the kernels' test bed)\n"
               "  --no-fuse              keep the padding-free gather and combine, and the LM\n"
               "                         head's logits, as separate kernels (no fuse-permute-gemm\n"
               "                         and fuse-lm-head passes; for comparison)\n"
               "  --no-overlap           run every collective in order on the compute stream (no\n"
               "                         overlap-grad-reduce and overlap-moe-comm passes; for\n"
               "                         comparison: the values are the same bit for bit)\n"
               "  --print-ir-after-all   print the module to stderr after every pass\n"
               "  --timing               per-pass time table on stderr\n"
               "  --print-build-flags    print the compiler, flags and libraries used to\n"
               "                         build a program (lines cc:, cflags:, libs:)\n"
               "\n"
               "Parallel layout (each flag overrides the spec's \"parallel\" section):\n"
               "  --dp N                 data-parallel degree (N >= 1)\n"
               "  --tp N                 tensor-parallel degree; world = dp*tp ranks\n"
               "  --ep N                 expert-parallel degree (divides experts and dp*tp)\n"
               "  --ssmb                 shard MoE blocks' tokens over the TP group\n"
               "  --rbd                  redundancy-bypassing dispatch across nodes\n"
               "  --zero N               ZeRO stage: 0, or 1 to shard optimizer states\n"
               "  --ranks-per-node N     ranks per node (0: unknown; default the cluster's)\n"
               "  --dispatch-bound B     expert all-to-all receive buffers hold min(ep, B) times\n"
               "                         the rows a rank sends (default 4: exact up to ep 4);\n"
               "                         a routing over it stops every rank with the size\n"
               "With none of these and no \"parallel\" section, a cluster (--cluster or the\n"
               "spec's \"cluster\" section) lets the planner choose the layout, micro-batch and\n"
               "recompute policy (the fastest that fits, as `xmoec plan` shows; --micro-batch\n"
               "and --recompute narrow its search); without a cluster: one rank.\n");
}

static bool switch_flag(const char *arg, compile_args_t *a) {
  if (strcmp(arg, "--print-ir-after-all") == 0)
    a->print_after_all = true;
  else if (strcmp(arg, "--timing") == 0)
    a->timing = true;
  else if (strcmp(arg, "--no-build") == 0)
    a->no_build = true;
  else if (strcmp(arg, "--no-fuse") == 0)
    a->no_fuse = true;
  else if (strcmp(arg, "--no-overlap") == 0)
    a->no_overlap = true;
  else if (strcmp(arg, "--print-build-flags") == 0)
    a->print_flags = true;
  else if (strcmp(arg, "--emulate") == 0)
    a->emulate = true;
  else if (strcmp(arg, "--force") == 0)
    a->force = true;
  else
    return false;
  return true;
}

/* ---- layout flags -------------------------------------------------------- */

/* The valued layout flags; --ssmb and --rbd are switches. */
static const struct {
  const char *flag;
  xm_layout_knob_t knob;
  int64_t min, max;
  const char *expected;
} k_layout_flags[] = {
    {"--dp", XM_LAYOUT_DP, 1, INT64_MAX, "a positive integer"},
    {"--tp", XM_LAYOUT_TP, 1, INT64_MAX, "a positive integer"},
    {"--ep", XM_LAYOUT_EP, 1, INT64_MAX, "a positive integer"},
    {"--zero", XM_LAYOUT_ZERO, 0, 1, "0 or 1"},
    {"--ranks-per-node", XM_LAYOUT_RANKS_PER_NODE, 0, INT64_MAX, "an integer >= 0 (0: unknown)"},
};

static void set_knob(xm_layout_t *l, xm_layout_knob_t knob, int64_t v) {
  switch (knob) {
  case XM_LAYOUT_DP: l->dp = v; break;
  case XM_LAYOUT_TP: l->tp = v; break;
  case XM_LAYOUT_EP: l->ep = v; break;
  case XM_LAYOUT_SSMB: l->ssmb = v != 0; break;
  case XM_LAYOUT_RBD: l->rbd = v != 0; break;
  case XM_LAYOUT_ZERO: l->zero = (int)v; break;
  case XM_LAYOUT_RANKS_PER_NODE: l->ranks_per_node = v; break;
  }
}

/* Consumes argv[*i] when it is a layout flag: *out_rc is 0, or 2 after a
 * bad or missing value (reported). Returns false for any other argument. */
static bool layout_flag(int argc, char **argv, int *i, compile_args_t *a, int *out_rc) {
  *out_rc = 0;
  const char *arg = argv[*i];
  if (strcmp(arg, "--ssmb") == 0 || strcmp(arg, "--rbd") == 0) {
    xm_layout_knob_t knob = arg[2] == 's' ? XM_LAYOUT_SSMB : XM_LAYOUT_RBD;
    a->layout_value[knob] = 1;
    a->layout_given |= 1u << knob;
    return true;
  }
  for (size_t k = 0; k < sizeof k_layout_flags / sizeof k_layout_flags[0]; k++) {
    bool missing = false;
    const char *v = xm_arg_value(argc, argv, i, k_layout_flags[k].flag, &missing);
    if (missing) {
      fprintf(stderr, "xmoec compile: error: %s needs a value (%s)\n", k_layout_flags[k].flag,
              k_layout_flags[k].expected);
      *out_rc = 2;
      return true;
    }
    if (!v) continue;
    int64_t n;
    if (!xm_arg_int(v, k_layout_flags[k].min, k_layout_flags[k].max, &n)) {
      fprintf(stderr, "xmoec compile: error: %s needs %s, got '%s'\n", k_layout_flags[k].flag,
              k_layout_flags[k].expected, v);
      *out_rc = 2;
      return true;
    }
    a->layout_value[k_layout_flags[k].knob] = n;
    a->layout_given |= 1u << k_layout_flags[k].knob;
    return true;
  }
  return false;
}

/* Returns 0 to go on, else an exit code; *out_help after --help. */
static const xm_flag_t k_compile_flags[] = {{"--print-ir-after-all", false},
                                            {"--timing", false},
                                            {"--no-build", false},
                                            {"--no-fuse", false},
                                            {"--no-overlap", false},
                                            {"--print-build-flags", false},
                                            {"--emulate", false},
                                            {"--force", false},
                                            {"--micro-batch", true},
                                            {"--global-batch", true},
                                            {"--recompute", true},
                                            {"--ssmb", false},
                                            {"--rbd", false},
                                            {"--dp", true},
                                            {"--tp", true},
                                            {"--ep", true},
                                            {"--zero", true},
                                            {"--ranks-per-node", true},
                                            {"--dispatch-bound", true},
                                            {"--cluster", true},
                                            {"--placement", true},
                                            {"--cc", true},
                                            {"--target", true},
                                            {"--gpu-arch", true},
                                            {"-o", true},
                                            {NULL, false}};

static int compile_parse_args(int argc, char **argv, compile_args_t *a, bool *out_help) {
  if (xm_args_check("compile", argc, argv, k_compile_flags)) return 2;
  for (int i = 0; i < argc; i++) {
    bool missing = false;
    const char *v;
    int rc = 0;
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      *out_help = true;
      return 0;
    } else if (switch_flag(argv[i], a)) {
    } else if (layout_flag(argc, argv, &i, a, &rc)) {
      if (rc) return rc;
    } else if ((v = xm_arg_value(argc, argv, &i, "--dispatch-bound", &missing))) {
      if (!xm_arg_int(v, 1, 1 << 24, &a->dispatch_bound)) {
        fprintf(stderr,
                "xmoec compile: error: --dispatch-bound needs an integer in [1, %d], got '%s'\n",
                1 << 24, v);
        return 2;
      }
    } else if ((v = xm_arg_value(argc, argv, &i, "--micro-batch", &missing))) {
      if (!xm_arg_int(v, 1, 1 << 20, &a->micro_batch)) {
        fprintf(stderr,
                "xmoec compile: error: --micro-batch needs an integer in [1, %d], got '%s'\n",
                1 << 20, v);
        return 2;
      }
    } else if ((v = xm_arg_value(argc, argv, &i, "--global-batch", &missing))) {
      if (!xm_arg_int(v, 1, INT64_C(1) << 40, &a->global_batch)) {
        fprintf(stderr, "xmoec compile: error: --global-batch needs a positive integer, got '%s'\n",
                v);
        return 2;
      }
    } else if ((v = xm_arg_value(argc, argv, &i, "--recompute", &missing))) {
      if (strcmp(v, "none") == 0)
        a->recompute = XM_RECOMPUTE_NONE;
      else if (strcmp(v, "selective") == 0 || strcmp(v, "moe") == 0)
        a->recompute = XM_RECOMPUTE_SELECTIVE;
      else if (strcmp(v, "full") == 0)
        a->recompute = XM_RECOMPUTE_FULL;
      else {
        fprintf(stderr,
                "xmoec compile: error: --recompute must be none, selective (or moe) or "
                "full, got '%s'\n",
                v);
        return 2;
      }
    } else if ((v = xm_arg_value(argc, argv, &i, "--cluster", &missing))) {
      a->cluster = v;
    } else if ((v = xm_arg_value(argc, argv, &i, "--placement", &missing))) {
      a->placement = v;
    } else if ((v = xm_arg_value(argc, argv, &i, "--cc", &missing))) {
      a->cc = v;
    } else if ((v = xm_arg_value(argc, argv, &i, "--target", &missing))) {
      const xm_codegen_target_t *t = xm_codegen_target_find(v);
      if (!t) {
        fprintf(stderr, "xmoec compile: error: --target must be cpu, hip or cuda, got '%s'\n", v);
        return 2;
      }
      a->target = v;
    } else if ((v = xm_arg_value(argc, argv, &i, "--gpu-arch", &missing))) {
      a->gpu_arch = v;
    } else if ((v = xm_arg_value(argc, argv, &i, "-o", &missing))) {
      a->out_dir = v;
    } else if (missing) {
      fprintf(stderr, "xmoec compile: error: %s needs a value\n", argv[i]);
      return 2;
    } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
      fprintf(stderr, "xmoec compile: error: unknown option '%s'\n", argv[i]);
      compile_usage(stderr);
      return 2;
    } else if (a->input) {
      fprintf(stderr, "xmoec compile: error: more than one input file ('%s', '%s')\n", a->input,
              argv[i]);
      return 2;
    } else {
      a->input = argv[i];
    }
  }
  if (a->print_flags) return 0;
  const xm_codegen_target_t *t = xm_codegen_target_find(a->target ? a->target : "cpu");
  if ((a->emulate || a->gpu_arch) && !t->gpu) {
    fprintf(stderr,
            "xmoec compile: error: %s applies to the GPU targets only (--target hip or "
            "--target cuda)\n",
            a->emulate ? "--emulate" : "--gpu-arch");
    return 2;
  }
  if (a->gpu_arch && !xm_codegen_target_arch_ok(t, a->gpu_arch)) {
    fprintf(stderr, "xmoec compile: error: --gpu-arch %s is not a %s architecture (%s)\n",
            a->gpu_arch, t->name,
            strcmp(t->name, "hip") == 0 ? "gfx and hex digits, e.g. gfx90a or gfx942"
                                        : "sm_ and digits, e.g. sm_90 or sm_90a");
    return 2;
  }
  if (!a->input || !a->out_dir) {
    fprintf(stderr, "xmoec compile: error: %s\n",
            !a->input ? "no model file given" : "no output folder given (-o OUT)");
    compile_usage(stderr);
    return 2;
  }
  if ((a->cc && !a->cc[0]) || !a->out_dir[0]) {
    fprintf(stderr, "xmoec compile: error: %s must not be empty\n", a->out_dir[0] ? "--cc" : "-o");
    return 2;
  }
  return 0;
}

/* ---- build settings ---------------------------------------------------- */

typedef struct compile compile_t;
/* Everything one compile reads and produces. */
struct compile {
  compile_args_t a;
  char *spec_text, *cluster_text, *placement_text;
  size_t spec_len, cluster_len, placement_len;
  xm_placement_t placement; /* --placement: read and checked against the spec */
  int64_t placed_rows;      /* rows of it that are not the identity */
  xm_spec_t spec;
  xm_layout_t layout; /* the spec's, with the flags applied; checked */
  xm_ir_module_t *m;
  xm_strbuf_t pipeline, program, main_c, config, xir;
  xm_strbuf_t kernels_h, kernels_src; /* GPU targets: out/kernels.h, out/kernels.hip */
  const xm_codegen_target_t *target;
  char gpu_arch[64]; /* GPU targets: the architecture the kernels are built for */
  int64_t fused_gathers, fused_combines; /* module attrs of fuse-permute-gemm */
  int64_t unfused_activation_bytes;      /* the same program's arena without it */
  int64_t kept_activation_bytes;         /* the same program's arena without recompute */
  xm_mem_report_t mem;
  bool planned;             /* the planner chose the layout */
  xm_plan_candidate_t plan; /* what it chose */
  int64_t plan_searched, plan_fit;
  double plan_runner_up; /* step time of the second best; 0 if none */
  bool predicted;        /* the cost model's figures for the built layout (a cluster) */
  xm_cost_t prediction;  /* they: c->plan.cost when planned */
  char plan_runner_up_layout[112];
};

static const char *setting(const char *env, const char *dflt) {
  const char *v = getenv(env);
  return v && v[0] ? v : dflt;
}

static const char *build_cc(const compile_args_t *a) {
  return a->cc ? a->cc : setting("XMOEC_CC", XM_BUILD_CC);
}

/* Splits `s` on spaces into owned words appended to argv (NULL-terminated
 * array with room reserved by the caller's count). */
static int split_words(const char *s, char **argv, int n) {
  const char *p = s;
  while (*p) {
    while (*p == ' ' || *p == '\t')
      p++;
    const char *w = p;
    while (*p && *p != ' ' && *p != '\t')
      p++;
    if (p > w) argv[n++] = strndup(w, (size_t)(p - w));
  }
  return n;
}

static int count_words(const char *s) {
  int n = 0;
  for (const char *p = s; *p;) {
    while (*p == ' ' || *p == '\t')
      p++;
    if (*p) n++;
    while (*p && *p != ' ' && *p != '\t')
      p++;
  }
  return n;
}

static void path_join(xm_strbuf_t *b, const char *dir, const char *name) {
  xm_strbuf_clear(b);
  xm_strbuf_puts(b, dir);
  if (b->len == 0 || b->data[b->len - 1] != '/') xm_strbuf_puts(b, "/");
  xm_strbuf_puts(b, name);
}

/* Runs one build command (argv[0] found on PATH); its output goes to log,
 * shown on failure. 0, or 1 after a message. */
static int run_tool(char **argv, const char *log, const char *what, const char *product) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid;
  int rc = 1, status = 0;
  int err = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
  if (err) {
    fprintf(stderr, "xmoec compile: error: cannot run the %s '%s': %s\n", what, argv[0],
            strerror(err));
  } else if (waitpid(pid, &status, 0) < 0) {
    fprintf(stderr, "xmoec compile: error: waiting for the %s: %s\n", what, strerror(errno));
  } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    char *text = NULL;
    size_t len = 0;
    if (xm_read_file(log, &text, &len) == 0) fputs(text, stderr);
    free(text);
    fprintf(stderr,
            "xmoec compile: error: building %s failed (compiler output above, also in "
            "%s)\n",
            product, log);
  } else {
    rc = 0;
    unlink(log);
  }
  posix_spawn_file_actions_destroy(&fa);
  return rc;
}

/* A NULL-terminated argv from words and space-separated flag strings. */
typedef struct {
  char **v;
  int n, cap;
} argv_t;

static void argv_add(argv_t *a, const char *w) {
  if (a->n + 2 > a->cap) {
    int cap = a->cap ? 2 * a->cap : 64;
    char **v = realloc(a->v, sizeof *v * (size_t)cap);
    if (!v) return;
    a->v = v;
    a->cap = cap;
  }
  a->v[a->n++] = strdup(w);
  a->v[a->n] = NULL;
}

static void argv_words(argv_t *a, const char *s) {
  int n = count_words(s);
  char **w = calloc((size_t)n + 1, sizeof *w);
  if (!w) return;
  int m = split_words(s, w, 0);
  for (int i = 0; i < m; i++) {
    argv_add(a, w[i]);
    free(w[i]);
  }
  free(w);
}

static void argv_free(argv_t *a) {
  for (int i = 0; i < a->n; i++)
    free(a->v[i]);
  free(a->v);
  a->v = NULL;
  a->n = a->cap = 0;
}

/* The GPU part of a build: the compiler of out/kernels.hip with its flags,
 * and the runtime libraries out/train links for the target (or for its
 * emulation). */
typedef struct {
  const char *kernel_cc; /* hipcc, nvcc or the C++ compiler */
  const char *libs;      /* "" when this build of xmoec lacks the backend */
  const char *lacking;   /* why libs is empty */
} gpu_build_t;

static gpu_build_t gpu_build(const compile_t *c) {
  gpu_build_t b;
  if (c->a.emulate) {
    b.kernel_cc = setting("XMOEC_CXX", XM_BUILD_CXX);
    b.libs = setting("XMOEC_LIBS", XM_BUILD_EMU_LIBS);
    b.lacking = "";
  } else if (strcmp(c->target->name, "hip") == 0) {
    b.kernel_cc = setting("XMOEC_HIPCC", XM_BUILD_HIPCC[0] ? XM_BUILD_HIPCC : "hipcc");
    b.libs = setting("XMOEC_LIBS", XM_BUILD_HIP_LIBS);
    b.lacking = "the HIP backend (runtime/hip) was not built: hipcc or the HIP runtime was not "
                "found when xmoec was configured (scripts/setup.sh installs them)";
  } else {
    b.kernel_cc = setting("XMOEC_NVCC", XM_BUILD_NVCC[0] ? XM_BUILD_NVCC : "nvcc");
    b.libs = setting("XMOEC_LIBS", XM_BUILD_CUDA_LIBS);
    b.lacking = "the CUDA backend (runtime/cuda) was not built: nvcc or the CUDA runtime was "
                "not found when xmoec was configured (it is looked for in /usr/local/cuda)";
  }
  return b;
}

/* out/kernels.hip -> out/kernels.o. */
static void kernel_argv(const compile_t *c, const gpu_build_t *b, const char *src, const char *obj,
                        argv_t *v) {
  argv_add(v, b->kernel_cc);
  if (c->a.emulate) {
    argv_words(v, setting("XMOEC_CXXFLAGS", XM_BUILD_CXXFLAGS));
    argv_add(v, strcmp(c->target->name, "hip") == 0 ? "-DXM_EMU_AMD=1" : "-DXM_EMU_AMD=0");
    argv_add(v, "-x");
    argv_add(v, "c++");
  } else if (strcmp(c->target->name, "hip") == 0) {
    char arch[96];
    snprintf(arch, sizeof arch, "--offload-arch=%s", c->gpu_arch);
    argv_add(v, arch);
    argv_add(v, "-std=c++17");
    argv_add(v, "-O3");
    argv_words(v, XM_BUILD_KERNEL_INCLUDES);
  } else {
    char arch[96];
    snprintf(arch, sizeof arch, "-arch=%s", c->gpu_arch);
    argv_add(v, arch);
    argv_add(v, "-std=c++17");
    argv_add(v, "-O3");
    argv_add(v, "-x");
    argv_add(v, "cu");
    argv_words(v, XM_BUILD_KERNEL_INCLUDES);
  }
  argv_add(v, "-c");
  argv_add(v, src);
  argv_add(v, "-o");
  argv_add(v, obj);
}

/* --print-build-flags: what a build of this target runs. For a GPU target
 * also kernel_cc: and kernel_flags: (the compile of out/kernels.hip, whose
 * source and object follow the flags). */
static void print_build_flags(compile_t *c) {
  const char *libs = setting("XMOEC_LIBS", XM_BUILD_LIBS);
  if (c->target->gpu) {
    snprintf(c->gpu_arch, sizeof c->gpu_arch, "%s",
             c->a.gpu_arch ? c->a.gpu_arch : c->target->default_arch);
    gpu_build_t b = gpu_build(c);
    argv_t v = {NULL, 0, 0};
    kernel_argv(c, &b, "", "", &v);
    printf("kernel_cc: %s\nkernel_flags:", v.v[0]);
    for (int i = 1; i + 4 < v.n; i++)
      printf(" %s", v.v[i]); /* up to "-c SRC -o OBJ" */
    printf("\n");
    argv_free(&v);
    libs = b.libs;
  }
  printf("cc: %s\ncflags: %s\nlibs: %s\n", build_cc(&c->a),
         setting("XMOEC_CFLAGS", XM_BUILD_CFLAGS), libs);
}

/* Builds out/train: for a GPU target first out/kernels.o, then the C files
 * linked with the runtime. */
static int run_compiler(const compile_t *c) {
  const compile_args_t *a = &c->a;
  xm_strbuf_t program, main_c, train, log, ksrc, kobj;
  xm_strbuf_init(&program), xm_strbuf_init(&main_c), xm_strbuf_init(&train), xm_strbuf_init(&log);
  xm_strbuf_init(&ksrc), xm_strbuf_init(&kobj);
  path_join(&program, a->out_dir, "program.c");
  path_join(&main_c, a->out_dir, "main.c");
  path_join(&train, a->out_dir, "train");
  path_join(&log, a->out_dir, "build.log");
  path_join(&ksrc, a->out_dir, "kernels.hip");
  path_join(&kobj, a->out_dir, "kernels.o");
  int rc = 0;
  argv_t v = {NULL, 0, 0};
  const char *libs = setting("XMOEC_LIBS", XM_BUILD_LIBS);
  if (c->target->gpu) {
    gpu_build_t b = gpu_build(c);
    libs = b.libs;
    if (!libs[0]) {
      fprintf(stderr,
              "xmoec compile: error: --target %s: %s; the sources are written, or use "
              "--emulate to build for the CPU emulation of the GPU\n",
              c->target->name, b.lacking);
      rc = 2;
    } else {
      kernel_argv(c, &b, xm_strbuf_cstr(&ksrc), xm_strbuf_cstr(&kobj), &v);
      rc = run_tool(v.v, xm_strbuf_cstr(&log), "GPU kernel compiler", xm_strbuf_cstr(&kobj));
      argv_free(&v);
    }
  }
  if (!rc) {
    argv_add(&v, build_cc(a));
    argv_words(&v, setting("XMOEC_CFLAGS", XM_BUILD_CFLAGS));
    if (c->target->gpu) {
      /* program.c includes the generated kernels.h beside it */
      argv_add(&v, xm_strbuf_cstr(&program));
      argv_add(&v, xm_strbuf_cstr(&main_c));
      argv_add(&v, xm_strbuf_cstr(&kobj));
    } else {
      argv_add(&v, xm_strbuf_cstr(&program));
      argv_add(&v, xm_strbuf_cstr(&main_c));
    }
    argv_add(&v, "-o");
    argv_add(&v, xm_strbuf_cstr(&train));
    argv_words(&v, libs);
    rc = run_tool(v.v, xm_strbuf_cstr(&log), "C compiler", xm_strbuf_cstr(&train));
    argv_free(&v);
  }
  xm_strbuf_free(&program), xm_strbuf_free(&main_c), xm_strbuf_free(&train), xm_strbuf_free(&log);
  xm_strbuf_free(&ksrc), xm_strbuf_free(&kobj);
  return rc;
}

/* ---- files ------------------------------------------------------------- */

/* mkdir -p; 0 or errno. */
static int make_dirs(const char *path) {
  char *p = strdup(path);
  if (!p) return ENOMEM;
  int err = 0;
  for (char *s = p + 1;; s++) {
    if (*s != '/' && *s != '\0') continue;
    char c = *s;
    *s = '\0';
    if (mkdir(p, 0755) != 0 && errno != EEXIST) err = errno;
    *s = c;
    if (err || c == '\0') break;
  }
  struct stat st;
  if (!err && (stat(p, &st) != 0 || !S_ISDIR(st.st_mode))) err = ENOTDIR;
  free(p);
  return err;
}

static int write_file(const char *dir, const char *name, const char *text) {
  xm_strbuf_t path;
  xm_strbuf_init(&path);
  path_join(&path, dir, name);
  FILE *f = fopen(xm_strbuf_cstr(&path), "w");
  bool ok = f != NULL;
  if (f) {
    ok = fputs(text, f) >= 0;
    ok = fclose(f) == 0 && ok;
  }
  if (!ok)
    fprintf(stderr, "xmoec compile: error: cannot write '%s': %s\n", xm_strbuf_cstr(&path),
            strerror(errno));
  else
    printf("wrote %s\n", xm_strbuf_cstr(&path));
  xm_strbuf_free(&path);
  return ok ? 0 : 2;
}

static void add_input(cJSON *inputs, const char *path, const char *text, size_t len) {
  char hex[65];
  xm_sha256_hex(text, len, hex);
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "path", path);
  cJSON_AddStringToObject(o, "sha256", hex);
  cJSON_AddItemToArray(inputs, o);
}

static void add_names(cJSON *o, const char *key, const char *const *names, int n) {
  cJSON *arr = cJSON_AddArrayToObject(o, key);
  for (int i = 0; i < n; i++)
    cJSON_AddItemToArray(arr, cJSON_CreateString(names[i]));
}

static void add_memory(cJSON *o, const xm_mem_report_t *r) {
  cJSON *m = cJSON_AddObjectToObject(o, "memory");
  const struct {
    const char *key;
    int64_t v;
  } rows[] = {{"persistent_bytes", r->persistent_bytes},
              {"activation_bytes", r->activation_bytes},
              {"weights", r->weights},
              {"grads", r->grads},
              {"optimizer", r->optimizer},
              {"activations", r->activations},
              {"workspace", r->workspace},
              {"inputs", r->inputs}};
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
    cJSON_AddNumberToObject(m, rows[i].key, (double)rows[i].v);
}

static char *manifest_text(const compile_t *c) {
  static const char *const k_generated[] = {"program.c", "main.c",    "config.json",
                                            "model.xir", "kernels.h", "kernels.hip"};
  static const char *const k_built[] = {"train"};
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "generator", "xmoec 0.1.0");
  cJSON *inputs = cJSON_AddArrayToObject(o, "inputs");
  add_input(inputs, c->a.input, c->spec_text, c->spec_len);
  if (c->a.cluster) add_input(inputs, c->a.cluster, c->cluster_text, c->cluster_len);
  if (c->a.placement) add_input(inputs, c->a.placement, c->placement_text, c->placement_len);
  add_names(o, "generated", k_generated, c->target->gpu ? 6 : 4);
  add_names(o, "built", k_built, c->a.no_build ? 0 : 1);
  cJSON_AddStringToObject(o, "pipeline", xm_strbuf_cstr(&c->pipeline));
  cJSON_AddStringToObject(o, "target", c->target->name);
  if (c->target->gpu) {
    cJSON_AddStringToObject(o, "gpu_arch", c->gpu_arch);
    cJSON_AddBoolToObject(o, "emulated", c->a.emulate);
  }
  add_memory(o, &c->mem);
  char *text = cJSON_Print(o);
  cJSON_Delete(o);
  return text;
}

/* Reads the spec (and cluster) files, loads and validates them. */
static xm_status_t load_inputs(compile_t *c, xm_diag_t *diag) {
  char why[160];
  int err = xm_read_file(c->a.input, &c->spec_text, &c->spec_len);
  if (err) {
    xm_diag_add(diag, XM_DIAG_ERROR, c->a.input, NULL, "cannot read: %s",
                xm_read_error(err, XM_READ_LIMIT_TEXT, why, sizeof why));
    return XM_ERR_IO;
  }
  if (c->a.cluster && (err = xm_read_file(c->a.cluster, &c->cluster_text, &c->cluster_len))) {
    xm_diag_add(diag, XM_DIAG_ERROR, c->a.cluster, NULL, "cannot read: %s",
                xm_read_error(err, XM_READ_LIMIT_TEXT, why, sizeof why));
    return XM_ERR_IO;
  }
  xm_status_t st = xm_spec_load_text(c->spec_text, c->spec_len, c->a.input, diag, &c->spec);
  if (st == XM_OK && c->a.cluster)
    st = xm_spec_load_cluster_text(c->cluster_text, c->cluster_len, c->a.cluster, diag, &c->spec);
  if (st == XM_OK && xm_diag_error_count(diag)) st = XM_ERR_INVALID_INPUT;
  if (st == XM_OK && c->a.micro_batch > 0) c->spec.training.micro_batch = c->a.micro_batch;
  if (st == XM_OK && c->a.global_batch > 0) c->spec.training.global_batch = c->a.global_batch;
  if (st == XM_OK && c->a.recompute >= 0)
    c->spec.training.recompute = (xm_recompute_t)c->a.recompute;
  if (st == XM_OK && c->target->gpu) {
    const char *arch = c->a.gpu_arch ? c->a.gpu_arch : c->spec.cluster.gpu_arch;
    if (!arch[0]) arch = c->target->default_arch;
    if (!xm_codegen_target_arch_ok(c->target, arch)) {
      /* --gpu-arch was checked with the flags: this one is the cluster's */
      xm_diag_add(diag, XM_DIAG_ERROR, c->a.cluster ? c->a.cluster : c->a.input,
                  c->a.cluster ? "/gpu_arch" : "/cluster/gpu_arch",
                  "'%s' is not a %s architecture (%s)", arch, c->target->name,
                  strcmp(c->target->name, "hip") == 0 ? "gfx and hex digits, e.g. gfx90a"
                                                      : "sm_ and digits, e.g. sm_90 or sm_90a");
      st = XM_ERR_INVALID_INPUT;
    }
    snprintf(c->gpu_arch, sizeof c->gpu_arch, "%s", arch);
  }
  if (st == XM_OK && c->spec.training.dtype == XM_DTYPE_FP16) {
    xm_diag_add(diag, XM_DIAG_ERROR, c->a.input, "/training/dtype",
                "fp16 training is not built (it needs dynamic loss scaling); use \"bf16\" "
                "(bf16 GEMMs with f32 accumulation and f32 master weights) or \"fp32\"");
    st = XM_ERR_UNSUPPORTED;
  }
  return st;
}

/* --placement: the file read, checked against the spec (after the
 * layout is known, for the note on its node count). */
static xm_status_t load_placement(compile_t *c, xm_diag_t *diag) {
  if (!c->a.placement) return XM_OK;
  char why[160];
  int err = xm_read_file(c->a.placement, &c->placement_text, &c->placement_len);
  if (err) {
    xm_diag_add(diag, XM_DIAG_ERROR, c->a.placement, NULL, "cannot read: %s",
                xm_read_error(err, XM_READ_LIMIT_TEXT, why, sizeof why));
    return XM_ERR_INVALID_INPUT;
  }
  XM_RETURN_IF_ERROR(
      xm_placement_parse(c->placement_text, c->placement_len, c->a.placement, diag, &c->placement));
  XM_RETURN_IF_ERROR(xm_placement_check(&c->placement, &c->spec, diag));
  for (int64_t r = 0; r < c->placement.rows; r++)
    if (!xm_placement_row_is_identity(&c->placement, r)) c->placed_rows++;
  /* The node blocks of an EP group in this layout: a placement made for
   * another count still trains the same, it only saves less. */
  const xm_layout_t *l = &c->layout;
  int64_t nodes =
      l->ranks_per_node > 0 && l->ep > l->ranks_per_node && l->ep % l->ranks_per_node == 0
          ? l->ep / l->ranks_per_node
          : 1;
  if (c->placement.nodes > 0 && c->placement.nodes != nodes) {
    char rpn[48] = "ranks per node unknown";
    if (l->ranks_per_node > 0)
      snprintf(rpn, sizeof rpn, "%lld ranks per node", (long long)l->ranks_per_node);
    xm_diag_add(diag, XM_DIAG_WARNING, c->a.placement, "/nodes",
                "made for EP groups over %lld nodes, but this layout's span %lld (ep %lld, %s): "
                "it trains the same, with other inter-node traffic",
                (long long)c->placement.nodes, (long long)nodes, (long long)l->ep, rpn);
  }
  return XM_OK;
}

/* The placement as module attrs placement_layers, placement (one row of E
 * experts per layer) and placement_nodes, which codegen emits into the
 * program; identity rows are left out. */
static void set_placement_attrs(compile_t *c) {
  const xm_placement_t *pl = &c->placement;
  if (c->placed_rows == 0) return;
  int64_t E = pl->experts, n = 0;
  int64_t *layers = calloc((size_t)c->placed_rows, sizeof *layers);
  int64_t *slots = calloc((size_t)(c->placed_rows * E), sizeof *slots);
  XM_ASSERT(layers && slots);
  for (int64_t r = 0; r < pl->rows; r++) {
    if (xm_placement_row_is_identity(pl, r)) continue;
    layers[n] = pl->layer[r];
    for (int64_t p = 0; p < E; p++)
      slots[n * E + p] = pl->slots[r * E + p];
    n++;
  }
  xm_ir_attr_t a = {.key = "placement_layers", .kind = XM_ATTR_INTS, .n = (int)n, .ints = layers};
  xm_ir_module_set_attr(c->m, &a);
  a = (xm_ir_attr_t){.key = "placement", .kind = XM_ATTR_INTS, .n = (int)(n * E), .ints = slots};
  xm_ir_module_set_attr(c->m, &a);
  xm_ir_module_set_int(c->m, "placement_nodes", pl->nodes);
  free(layers);
  free(slots);
}

/* No layout anywhere but a cluster: the planner's best configuration
 * becomes the spec's parallel section and micro-batch. */
static xm_status_t plan_layout(compile_t *c, xm_diag_t *diag) {
  if (c->spec.parallel.present || c->a.layout_given || !c->spec.cluster.present) return XM_OK;
  const double gib = 1024.0 * 1024.0 * 1024.0;
  /* The same space as `xmoec plan`: every recompute policy and micro-batch,
   * unless --recompute or --micro-batch fixes one. */
  xm_plan_options_t o = {.policy = XM_POLICY_XMOEC,
                         .recompute_mask = c->a.recompute >= 0 ? 1u << c->a.recompute : 0,
                         .dispatch_bound = c->a.dispatch_bound};
  xm_plan_result_t r;
  XM_RETURN_IF_ERROR(xm_plan_search_with(&c->spec, &o, diag, &r));
  xm_status_t st = XM_OK;
  int64_t world = c->spec.cluster.nodes * c->spec.cluster.ranks_per_node;
  if (c->a.micro_batch > 0 && r.chosen >= 0) { /* the fastest that fits at that micro-batch */
    int64_t i = r.chosen;
    while (i < r.num_fit && r.cands[i].point.micro_batch != c->a.micro_batch)
      i++;
    if (i < r.num_fit) {
      xm_plan_candidate_t pick = r.cands[i];
      memmove(&r.cands[r.chosen + 1], &r.cands[r.chosen], (size_t)(i - r.chosen) * sizeof pick);
      r.cands[r.chosen] = pick;
    } else {
      xm_diag_add(diag, XM_DIAG_ERROR, c->a.input, NULL,
                  "no layout of the cluster's %lld ranks fits in device memory at micro-batch "
                  "%lld (xmoec plan shows the search)",
                  (long long)world, (long long)c->a.micro_batch);
      xm_plan_result_free(&r);
      return XM_ERR_INVALID_INPUT;
    }
  }
  if (r.chosen < 0) {
    if (r.num > 0 && r.cands[0].legal) {
      char name[96];
      xm_layout_format(&r.cands[0].point.layout, name, sizeof name);
      xm_diag_add(diag, XM_DIAG_ERROR, c->a.input, NULL,
                  "no layout of the cluster's %lld ranks fits in device memory; the closest, %s "
                  "(micro-batch %lld), needs %.2f GiB per rank of %.2f GiB (xmoec plan shows "
                  "the search)",
                  (long long)world, name, (long long)r.cands[0].point.micro_batch,
                  r.cands[0].cost.total / gib, r.cands[0].cost.device / gib);
    } else {
      xm_diag_add(diag, XM_DIAG_ERROR, c->a.input, NULL,
                  "no legal layout for the cluster's %lld ranks: %s", (long long)world,
                  r.num > 0 ? r.cands[0].reason : "nothing to search");
    }
    st = XM_ERR_INVALID_INPUT;
  } else {
    const xm_plan_candidate_t *best = &r.cands[r.chosen];
    const xm_layout_t *l = &best->point.layout;
    c->planned = true;
    c->plan = *best;
    if (best->point.dispatch_bound > 0) c->a.dispatch_bound = best->point.dispatch_bound;
    c->plan_searched = r.num;
    c->plan_fit = r.num_fit;
    c->plan_runner_up = 0;
    if (r.num_fit > 1) {
      c->plan_runner_up = r.cands[r.chosen + 1].cost.t_step;
      const xm_plan_candidate_t *next = &r.cands[r.chosen + 1];
      char name[80];
      xm_layout_format(&next->point.layout, name, sizeof name);
      snprintf(c->plan_runner_up_layout, sizeof c->plan_runner_up_layout, "%s micro-batch %lld",
               name, (long long)next->point.micro_batch);
    }
    c->spec.parallel = (xm_parallel_spec_t){.present = true,
                                            .dp = l->dp,
                                            .tp = l->tp,
                                            .ep = l->ep,
                                            .ssmb = l->ssmb,
                                            .rbd = l->rbd,
                                            .zero = l->zero};
    c->spec.training.zero_stage = l->zero;
    c->spec.training.micro_batch = best->point.micro_batch;
    c->spec.training.recompute = best->point.recompute;
  }
  xm_plan_result_free(&r);
  return st;
}

/* "plan: chose dp8 tp1 ep8 ..., micro-batch N ...": what and why. */
static void print_plan(const compile_t *c) {
  if (!c->planned) return;
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const xm_cost_t *k = &c->plan.cost;
  char name[96];
  xm_layout_format(&c->plan.point.layout, name, sizeof name);
  printf("plan: chose %s, micro-batch %lld, recompute %s: the fastest of %lld configurations "
         "that fit (%lld searched, policy xmoec)\n",
         name, (long long)c->plan.point.micro_batch, xm_recompute_name(c->plan.point.recompute),
         (long long)c->plan_fit, (long long)c->plan_searched);
  printf("plan: predicted step %.4g s (compute %.3g s, all-to-all %.3g s, tp %.3g s, dp %.3g s), "
         "%.2f of %.2f GiB per rank, MFU %.1f%%\n",
         k->t_step, k->t_compute, k->t_dispatch, k->t_tp, k->t_dp, k->total / gib, k->device / gib,
         100.0 * k->mfu);
  if (c->plan_runner_up > 0)
    printf("plan: the runner-up, %s, is predicted %.1f%% slower\n", c->plan_runner_up_layout,
           k->t_step > 0 ? 100.0 * (c->plan_runner_up / k->t_step - 1.0) : 0.0);
}

/* The spec's layout with the given flags applied, checked (the batch rule
 * global_batch % (micro_batch*dp) = 0 among the others). Warnings stay in
 * `diag` and are printed with everything else. */
static xm_status_t resolve_layout(compile_t *c, xm_diag_t *diag) {
  xm_layout_from_spec(&c->spec, &c->layout);
  for (int k = XM_LAYOUT_DP; k <= XM_LAYOUT_RANKS_PER_NODE; k++)
    if (c->a.layout_given & (1u << k)) set_knob(&c->layout, k, c->a.layout_value[k]);
  xm_layout_origin_t origin = c->a.layout_given ? XM_LAYOUT_FROM_FLAGS : XM_LAYOUT_FROM_SPEC;
  return xm_layout_check(&c->spec, &c->layout, origin, c->a.input, diag);
}

/* "[shard{...},][fuse-permute-gemm,fuse-lm-head,]autodiff{...},[mixed-precision{...},]
 * [recompute{policy=P},]canonicalize,fold-accumulate,[overlap-grad-reduce,]host-reads,
 * kernel-workspace,routed-rows,[overlap-moe-comm,]plan-memory,schedule" (the bracketed
 * shard and overlap passes on more than one rank, the overlap passes unless --no-overlap).
 * The shard
 * pass's options are all spelled out, so the manifest records the whole
 * layout. `fuse` false
 * leaves the permutation and the loss unfused (--no-fuse, and the
 * comparison build of the memory report); a bf16 program gets mixed-precision after autodiff.
 * `recompute` adds the spec's /training/recompute policy unless it is none
 * (false: the comparison build of the report). The recompute pass follows
 * autodiff and mixed-precision (it rebuilds the forward as it runs, casts
 * included) and precedes canonicalize (whose dead-op sweep drops what the
 * forward no longer needs), host-reads (a rebuilt permute gets its own
 * read) and the overlap and memory passes (passes/recompute.c). */
static bool bf16(const compile_t *c) { return c->spec.training.dtype == XM_DTYPE_BF16; }

static void build_pipeline(const compile_t *c, bool fuse, bool recompute, xm_strbuf_t *out) {
  const xm_layout_t *l = &c->layout;
  const xm_training_spec_t *t = &c->spec.training;
  if (xm_layout_world(l) > 1)
    xm_strbuf_printf(out,
                     "shard{dp=%lld tp=%lld ep=%lld ssmb=%d rbd=%d zero=%d ranks-per-node=%lld "
                     "dispatch-bound=%lld},",
                     (long long)l->dp, (long long)l->tp, (long long)l->ep, l->ssmb ? 1 : 0,
                     l->rbd ? 1 : 0, l->zero, (long long)l->ranks_per_node,
                     (long long)(c->a.dispatch_bound > 0 ? c->a.dispatch_bound : 4));
  if (fuse) xm_strbuf_puts(out, "fuse-permute-gemm,fuse-lm-head,");
  xm_strbuf_printf(out, "autodiff{grad-accum=%lld aux-free-gamma=",
                   (long long)(t->global_batch / (t->micro_batch * l->dp)));
  xm_strbuf_put_double(out, c->spec.moe.aux_free_gamma);
  xm_strbuf_puts(out, "},");
  if (bf16(c)) xm_strbuf_puts(out, "mixed-precision{dtype=bf16},");
  if (recompute && t->recompute != XM_RECOMPUTE_NONE)
    xm_strbuf_printf(out, "recompute{policy=%s},",
                     t->recompute == XM_RECOMPUTE_FULL ? "full" : "selective");
  xm_strbuf_puts(out, "canonicalize,fold-accumulate,");
  bool overlap = xm_layout_world(l) > 1 && !c->a.no_overlap;
  if (overlap) xm_strbuf_puts(out, "overlap-grad-reduce,");
  xm_strbuf_puts(out, "host-reads,kernel-workspace,routed-rows,");
  if (overlap) xm_strbuf_puts(out, "overlap-moe-comm,");
  xm_strbuf_puts(out, "plan-memory,schedule");
}

/* The activation arena of the same program without the fusion (or without
 * recompute), for the report: the whole pipeline once more on a fresh graph. */
static xm_status_t other_activations(compile_t *c, bool fuse, bool recompute, xm_diag_t *diag,
                                     int64_t *out_bytes) {
  xm_ir_module_t *m = NULL;
  xm_strbuf_t pipeline;
  xm_strbuf_init(&pipeline);
  build_pipeline(c, fuse, recompute, &pipeline);
  xm_pass_manager_options_t po;
  xm_pass_manager_options_default(&po);
  xm_mem_report_t r;
  xm_status_t st = xm_ir_build_model(&c->spec, c->a.input, diag, &m);
  if (st == XM_OK) st = xm_pass_pipeline_run(m, xm_strbuf_cstr(&pipeline), &po, diag);
  if (st == XM_OK) st = xm_plan_memory_read_report(m, diag, &r);
  if (st == XM_OK) *out_bytes = r.activation_bytes;
  xm_ir_module_destroy(m);
  xm_strbuf_free(&pipeline);
  return st;
}

/* Graph, passes and the generated texts. */
static xm_status_t lower(compile_t *c, xm_diag_t *diag) {
  XM_RETURN_IF_ERROR(xm_ir_build_model(&c->spec, c->a.input, diag, &c->m));
  set_placement_attrs(c);
  build_pipeline(c, !c->a.no_fuse, true, &c->pipeline);
  xm_pass_manager_options_t po;
  xm_pass_manager_options_default(&po);
  po.print_ir_after_all = c->a.print_after_all;
  po.timing = c->a.timing;
  po.dump = stderr;
  XM_RETURN_IF_ERROR(xm_pass_pipeline_run(c->m, xm_strbuf_cstr(&c->pipeline), &po, diag));
  XM_RETURN_IF_ERROR(xm_plan_memory_read_report(c->m, diag, &c->mem));
  c->fused_gathers = xm_ir_module_get_int(c->m, "fused_gathers", 0);
  c->fused_combines = xm_ir_module_get_int(c->m, "fused_combines", 0);
  if (c->fused_gathers + c->fused_combines > 0 || xm_ir_module_get_int(c->m, "fused_losses", 0) > 0)
    XM_RETURN_IF_ERROR(other_activations(c, false, true, diag, &c->unfused_activation_bytes));
  if (c->spec.training.recompute != XM_RECOMPUTE_NONE)
    XM_RETURN_IF_ERROR(other_activations(c, !c->a.no_fuse, false, diag, &c->kept_activation_bytes));
  XM_RETURN_IF_ERROR(xm_codegen_config_json(&c->spec, &c->config));
  xm_codegen_inputs_t in = {.spec_path = c->a.input,
                            .spec_text = c->spec_text,
                            .cluster_path = c->a.cluster,
                            .config_json = xm_strbuf_cstr(&c->config),
                            .pipeline = xm_strbuf_cstr(&c->pipeline)};
  if (c->target->gpu)
    XM_RETURN_IF_ERROR(xm_codegen_program_gpu(c->m, &c->spec, &in, c->target->name, diag,
                                              &c->program, &c->kernels_h, &c->kernels_src));
  else
    XM_RETURN_IF_ERROR(xm_codegen_program_c(c->m, &c->spec, &in, diag, &c->program));
  xm_codegen_main_c(&in, &c->main_c);
  xm_ir_print(c->m, &c->xir);
  return XM_OK;
}

static int write_outputs(compile_t *c) {
  int err = make_dirs(c->a.out_dir);
  if (err) {
    fprintf(stderr, "xmoec compile: error: cannot create '%s': %s\n", c->a.out_dir, strerror(err));
    return 2;
  }
  char *manifest = manifest_text(c);
  if (!manifest) return 1;
  int rc = write_file(c->a.out_dir, "program.c", xm_strbuf_cstr(&c->program));
  if (!rc) rc = write_file(c->a.out_dir, "main.c", xm_strbuf_cstr(&c->main_c));
  if (!rc && c->target->gpu)
    rc = write_file(c->a.out_dir, "kernels.h", xm_strbuf_cstr(&c->kernels_h));
  if (!rc && c->target->gpu)
    rc = write_file(c->a.out_dir, "kernels.hip", xm_strbuf_cstr(&c->kernels_src));
  if (!rc) rc = write_file(c->a.out_dir, "config.json", xm_strbuf_cstr(&c->config));
  if (!rc) rc = write_file(c->a.out_dir, "model.xir", xm_strbuf_cstr(&c->xir));
  xm_strbuf_t m;
  xm_strbuf_init(&m);
  xm_strbuf_printf(&m, "%s\n", manifest);
  if (!rc) rc = write_file(c->a.out_dir, "manifest.json", xm_strbuf_cstr(&m));
  xm_strbuf_free(&m);
  cJSON_free(manifest);
  return rc;
}

/* What fuse-permute-gemm folded and the activation arena it saved. */
static void print_fusion(const compile_t *c) {
  if (bf16(c))
    printf("precision: bf16 GEMM operands and results, f32 accumulation (%lld casts); f32 "
           "master weights, gradients, reductions and AdamW states\n",
           (long long)xm_ir_module_get_int(c->m, "mixed_casts", 0));
  if (c->a.no_fuse) {
    printf("fuse-permute-gemm: off (--no-fuse)\nfuse-lm-head: off (--no-fuse)\n");
    return;
  }
  const double mib = 1024.0 * 1024.0;
  if (c->fused_gathers + c->fused_combines == 0)
    printf("fuse-permute-gemm: nothing to fold (the gathers and combines meet collectives)\n");
  else
    printf("fuse-permute-gemm: the gather folded into %lld grouped GEMMs, the combine into %lld; "
           "activation arena %.2f MiB (%.2f MiB unfused)\n",
           (long long)c->fused_gathers, (long long)c->fused_combines,
           (double)c->mem.activation_bytes / mib, (double)c->unfused_activation_bytes / mib);
  if (xm_ir_module_get_int(c->m, "fused_losses", 0) > 0) {
    printf("fuse-lm-head: the LM head and the cross-entropy over the vocabulary in chunks of %lld "
           "columns (the [tokens, vocab] logits never exist whole)",
           (long long)xm_ir_module_get_int(c->m, "lm_ce_chunk", 0));
    if (c->fused_gathers + c->fused_combines == 0) /* the arena line was not printed above */
      printf("; activation arena %.2f MiB (%.2f MiB unfused)",
             (double)c->mem.activation_bytes / mib, (double)c->unfused_activation_bytes / mib);
    printf("\n");
  } else
    printf("fuse-lm-head: nothing to fold\n");
}

/* What the recompute pass rebuilt and the activation arena it saved. */
static void print_recompute(const compile_t *c) {
  xm_recompute_t r = c->spec.training.recompute;
  if (r == XM_RECOMPUTE_NONE) return;
  const double mib = 1024.0 * 1024.0;
  printf("recompute: %s: %lld forward ops rebuilt in the backward, each layer's before its "
         "backward reads them; activation arena %.2f MiB (%.2f MiB without)\n",
         r == XM_RECOMPUTE_FULL ? "full (each layer's input kept)"
                                : "selective (the expert FFN intermediates)",
         (long long)xm_ir_module_get_int(c->m, "recomputed_ops", 0),
         (double)c->mem.activation_bytes / mib, (double)c->kept_activation_bytes / mib);
}

/* What the overlap passes put beside the computation (more than one rank). */
static void print_overlap(const compile_t *c) {
  if (xm_layout_world(&c->layout) == 1) return;
  if (c->a.no_overlap) {
    printf("overlap: off (--no-overlap): every collective in order on the compute stream\n");
    return;
  }
  printf("overlap: %lld gradient reductions start in the last micro-batch's backward; %lld expert "
         "exchanges run beside %lld ops of their layer\n",
         (long long)xm_ir_module_get_int(c->m, "overlapped_reductions", 0),
         (long long)xm_ir_module_get_int(c->m, "overlapped_exchanges", 0),
         (long long)xm_ir_module_get_int(c->m, "overlapped_ops", 0));
}

/* "layout: dp2 tp2 ep4 ssmb, 4 ranks (2 per node)", or "(one rank)". */
static void print_layout(const xm_layout_t *l) {
  char name[96];
  xm_layout_format(l, name, sizeof name);
  int64_t world = xm_layout_world(l);
  if (world == 1) {
    printf("layout: %s (one rank)\n", name);
    return;
  }
  printf("layout: %s, %lld ranks", name, (long long)world);
  if (l->ranks_per_node > 0) printf(" (%lld per node)", (long long)l->ranks_per_node);
  printf("\n");
}

/* What the cost model predicts for the layout being built (the planner's
 * own figures when it chose it), so that plan and program can be
 * compared; nothing without a cluster, or for a point the model refuses. */
static void predict(compile_t *c) {
  if (c->planned) {
    c->prediction = c->plan.cost;
    c->predicted = true;
    return;
  }
  if (!c->spec.cluster.present) return;
  xm_net_t net;
  double dev = 0, peak = 0, eff = 0;
  xm_cost_cluster(&c->spec.cluster, &net, &dev, &peak, &eff);
  xm_cost_point_t pt = {.layout = c->layout,
                        .recompute = c->spec.training.recompute,
                        .micro_batch = c->spec.training.micro_batch,
                        .dispatch_bound = c->a.dispatch_bound > 0 ? c->a.dispatch_bound : 4,
                        .policy = XM_POLICY_XMOEC};
  xm_diag_t d;
  xm_diag_init(&d);
  c->predicted =
      xm_cost_evaluate(&c->spec, &net, dev, peak, eff, &pt, NULL, &d, &c->prediction) == XM_OK;
  xm_diag_free(&d);
}

/* The compiled program against the cluster's device memory: what the
 * memory plan holds plus the fixed overhead. Over it, an error with the
 * shortfall by category (a warning under --force). */
static xm_status_t check_device_memory(const compile_t *c, xm_diag_t *diag) {
  const xm_cluster_spec_t *cl = &c->spec.cluster;
  if (!cl->present || cl->device_memory_gib <= 0) return XM_OK;
  const double gib = 1024.0 * 1024.0 * 1024.0, device = cl->device_memory_gib * gib;
  const xm_mem_report_t *r = &c->mem;
  double total =
      (double)r->persistent_bytes + (double)r->activation_bytes + XM_COST_FIXED_OVERHEAD_BYTES;
  if (total <= device) return XM_OK;
  char plan[160] = "";
  if (c->predicted)
    snprintf(plan, sizeof plan, "; the cost model predicts %.2f GiB for this layout",
             c->prediction.total / gib);
  xm_diag_add(diag, c->a.force ? XM_DIAG_WARNING : XM_DIAG_ERROR, c->a.input, NULL,
              "the program needs %.2f GiB per rank (weights %.2f, gradients %.2f, optimizer "
              "%.2f, activations %.2f, workspace %.2f, runtime overhead %.2f), more than the "
              "cluster's %.2f GiB of device memory: short by %.2f GiB%s; %s",
              total / gib, (double)r->weights / gib, (double)r->grads / gib,
              (double)r->optimizer / gib, (double)r->activations / gib, (double)r->workspace / gib,
              XM_COST_FIXED_OVERHEAD_BYTES / gib, cl->device_memory_gib, (total - device) / gib,
              plan,
              c->a.force ? "built anyway (--force)"
                         : "choose a layout that fits (xmoec plan), or give --force to build it "
                           "anyway");
  return c->a.force ? XM_OK : XM_ERR_INVALID_INPUT;
}

static int compile(compile_t *c) {
  xm_diag_t diag;
  xm_diag_init(&diag);
  fprintf(stderr, "compiling %s ...\n", c->a.input);
  xm_status_t st = load_inputs(c, &diag);
  if (st == XM_OK) st = plan_layout(c, &diag);
  if (st == XM_OK) st = resolve_layout(c, &diag);
  if (st == XM_OK) st = load_placement(c, &diag);
  if (st == XM_OK) {
    st = lower(c, &diag);
    /* The user never wrote the pipeline: show it, so that "pipeline:N"
     * places and errors after the shard pass can be read. */
    if (st != XM_OK && c->pipeline.len)
      xm_diag_add(&diag, XM_DIAG_NOTE, NULL, NULL, "the pass pipeline was: %s",
                  xm_strbuf_cstr(&c->pipeline));
  }
  if (st == XM_OK) predict(c);
  if (st == XM_OK) st = check_device_memory(c, &diag);
  if (st != XM_OK && xm_diag_error_count(&diag) == 0)
    xm_diag_add(&diag, XM_DIAG_ERROR, c->a.input, NULL, "%s", xm_status_name(st));
  xm_diag_print(&diag, stderr);
  xm_diag_free(&diag);
  if (st != XM_OK) return xm_status_exit_code(st);
  print_plan(c);
  print_layout(&c->layout);
  xm_strbuf_t report;
  xm_strbuf_init(&report);
  xm_plan_memory_print_report(&c->mem, &report);
  printf("%s\n", xm_strbuf_cstr(&report));
  if (c->predicted) {
    /* Without the fixed overhead, which both add alike. */
    double want = c->prediction.total - c->prediction.overhead;
    int64_t have = c->mem.persistent_bytes + c->mem.activation_bytes;
    xm_strbuf_t w, h;
    xm_strbuf_init(&w), xm_strbuf_init(&h);
    xm_plan_memory_format_bytes((int64_t)want, &w);
    xm_plan_memory_format_bytes(have, &h);
    printf("plan: the cost model predicts %s per rank besides the runtime's overhead; the "
           "program's arenas hold %s (%+.1f%%)\n",
           xm_strbuf_cstr(&w), xm_strbuf_cstr(&h),
           want > 0 ? 100.0 * ((double)have / want - 1.0) : 0.0);
    xm_strbuf_free(&w), xm_strbuf_free(&h);
  }
  print_fusion(c);
  print_recompute(c);
  print_overlap(c);
  if (c->a.placement)
    printf("placement: %s: %lld of %lld listed MoE layers placed otherwise than the identity%s\n",
           c->a.placement, (long long)c->placed_rows, (long long)c->placement.rows,
           c->placed_rows ? "; checkpoints keep the Hugging Face expert numbering" : "");
  xm_strbuf_free(&report);
  int rc = write_outputs(c);
  if (rc || c->a.no_build) return rc;
  xm_strbuf_t train;
  xm_strbuf_init(&train);
  path_join(&train, c->a.out_dir, "train");
  fprintf(stderr, "building %s ...\n", xm_strbuf_cstr(&train));
  fflush(stdout);
  rc = run_compiler(c);
  if (!rc) {
    printf("built %s\n", xm_strbuf_cstr(&train));
    int64_t world = xm_layout_world(&c->layout);
    if (world > 1)
      printf("run it on %lld ranks: mpirun -np %lld %s --data PATH ... (docs/train.md)\n",
             (long long)world, (long long)world, xm_strbuf_cstr(&train));
    else
      printf("run it: %s --data PATH ... (docs/train.md)\n", xm_strbuf_cstr(&train));
  }
  xm_strbuf_free(&train);
  return rc;
}

int xm_cmd_compile(int argc, char **argv) {
  compile_t *c = calloc(1, sizeof *c);
  if (!c) return 1;
  bool help = false;
  c->a.recompute = -1;
  int rc = compile_parse_args(argc, argv, &c->a, &help);
  c->target = xm_codegen_target_find(c->a.target ? c->a.target : "cpu");
  if (help) {
    compile_usage(stdout);
  } else if (!rc && c->a.print_flags) {
    print_build_flags(c);
  } else if (!rc) {
    xm_strbuf_init(&c->pipeline), xm_strbuf_init(&c->program), xm_strbuf_init(&c->main_c);
    xm_strbuf_init(&c->config), xm_strbuf_init(&c->xir);
    xm_strbuf_init(&c->kernels_h), xm_strbuf_init(&c->kernels_src);
    rc = compile(c);
    xm_strbuf_free(&c->pipeline), xm_strbuf_free(&c->program), xm_strbuf_free(&c->main_c);
    xm_strbuf_free(&c->config), xm_strbuf_free(&c->xir);
    xm_strbuf_free(&c->kernels_h), xm_strbuf_free(&c->kernels_src);
  }
  xm_ir_module_destroy(c->m);
  free(c->spec_text);
  free(c->cluster_text);
  free(c->placement_text);
  xm_placement_free(&c->placement);
  free(c);
  return rc;
}
