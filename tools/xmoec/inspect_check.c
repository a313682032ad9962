/* tools/xmoec/inspect_check.c — `xmoec inspect`'s checks of what it reads.
 *
 * The files of OUT describe one program three times: model.xir holds the
 * module (its layout, batch, memory plan and schedule as attributes),
 * manifest.json the pipeline that made it and the plan's totals, and
 * config.json the model. A file edited by hand, copied from another
 * compile or cut short can contradict the others or itself, and a report
 * built on it would contradict itself too (a layout the groups do not
 * have, placements outside their arena), or run without end (a grad_accum
 * of 1e11 in the trace, a layer index of 2e9). Each check below says which
 * file disagrees and with what, and stops the report (exit 2):
 *
 *   model.xir   the layout, batch and model attributes within the limits a
 *               spec can reach (docs/spec.md); every op's layer below
 *               `layers`; the schedule's op counts equal to the ops there;
 *               every result placed (mem) inside its arena with at least
 *               its size, every workspace inside the activation arena; the
 *               memory report's categories summing to its arenas; every
 *               collective's group a group of the layout, of its size
 *   manifest    the generator is xmoec; the pipeline parses (every pass
 *               known), ends in plan-memory and schedule, and its shard
 *               and autodiff options are the module's layout and
 *               grad_accum; the target is known; the memory totals are the
 *               module's; the inputs are paths with SHA-256 digests
 *   config      the layers, routed experts and top-k are the module's
 *
 * The limits also bound the work of every format: the trace's events
 * (grad_accum times the micro-batch ops) are capped separately, by
 * XM_INSPECT_MAX_EVENTS (inspect.h).
 */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/target.h"
#include "passes/pipeline.h"
#include "runtime/abi/groups.h"
#include "tools/xmoec/inspect.h"

/* More than this many errors of one check are summed up in one line. */
#define MAX_REPORTED 8

typedef struct {
  const xm_inspect_t *ins;
  xm_diag_t *diag;
  char *xir, *manifest, *config; /* the files' paths, for messages */
  int errors;
} check_t;

#define FAIL(file, ...)                                                                            \
  do {                                                                                             \
    xm_diag_add(c->diag, XM_DIAG_ERROR, (file), NULL, __VA_ARGS__);                                \
    c->errors++;                                                                                   \
  } while (0)

/* A module int attr in [lo, hi]; `dflt` when absent (absent and required:
 * dflt outside the range). */
static int64_t module_int(check_t *c, const char *key, int64_t dflt, int64_t lo, int64_t hi,
                          const char *what) {
  const xm_ir_module_t *m = c->ins->m;
  const xm_ir_attr_t *a = NULL;
  for (int i = 0; i < xm_ir_module_num_attrs(m); i++)
    if (strcmp(xm_ir_module_attr(m, i)->key, key) == 0) a = xm_ir_module_attr(m, i);
  if (a && a->kind != XM_ATTR_INT) {
    FAIL(c->xir, "module attribute %s must be an integer (%s)", key, what);
    return lo;
  }
  int64_t v = a ? a->i : dflt;
  if (v < lo || v > hi) {
    if (a)
      FAIL(c->xir, "module attribute %s = %" PRId64 " is outside [%" PRId64 ", %" PRId64 "] (%s)",
           key, v, lo, hi, what);
    else
      FAIL(c->xir, "module attribute %s is missing (%s)", key, what);
    return lo;
  }
  return v;
}

/* The module's own attributes: limits, and what they must agree on. */
static void check_module_attrs(check_t *c) {
  const xm_inspect_t *ins = c->ins;
  const int64_t wmax = XM_LAYOUT_WORLD_MAX;
  module_int(c, "par_dp", 1, 1, wmax, "data-parallel degree");
  module_int(c, "par_tp", 1, 1, 1024, "tensor-parallel degree");
  module_int(c, "par_ep", 1, 1, 4096, "expert-parallel degree");
  module_int(c, "par_ssmb", 0, 0, 1, "sequence-sharded MoE blocks: 0 or 1");
  module_int(c, "par_rbd", 0, 0, 1, "redundancy-bypassing dispatch: 0 or 1");
  module_int(c, "par_zero", 0, 0, 1, "ZeRO stage: 0 or 1");
  int64_t rpn = module_int(c, "par_rpn", 0, 0, wmax, "ranks per node, 0 when unknown");
  module_int(c, "grad_accum", 1, 1, (int64_t)1 << 24, "micro-batches per step");
  module_int(c, "micro_batch", 0, 1, (int64_t)1 << 16, "sequences per rank per micro-batch");
  module_int(c, "seq_len", 0, 1, (int64_t)1 << 22, "tokens per sequence");
  module_int(c, "layers", 0, 1, 1024, "decoder layers");
  int64_t experts = module_int(c, "experts", 0, 0, 4096, "routed experts");
  int64_t top_k = module_int(c, "top_k", 1, 1, 64, "experts per token");
  if (c->errors) return;
  const xm_layout_t *l = &ins->layout;
  if (l->dp * l->tp > wmax)
    FAIL(c->xir, "par_dp * par_tp = %" PRId64 " ranks exceeds %" PRId64, l->dp * l->tp, wmax);
  else if ((l->dp * l->tp) % l->ep != 0)
    FAIL(c->xir, "par_ep = %" PRId64 " does not divide the world par_dp * par_tp = %" PRId64, l->ep,
         l->dp * l->tp);
  else if (rpn > 0 && (l->dp * l->tp) % rpn != 0)
    FAIL(c->xir, "par_rpn = %" PRId64 " does not divide the world par_dp * par_tp = %" PRId64, rpn,
         l->dp * l->tp);
  if (experts > 0 && top_k > experts)
    FAIL(c->xir, "top_k = %" PRId64 " exceeds the routed experts (experts = %" PRId64 ")", top_k,
         experts);
  if (experts > 0 && experts % l->ep != 0)
    FAIL(c->xir, "par_ep = %" PRId64 " does not divide the routed experts (experts = %" PRId64 ")",
         l->ep, experts);
}

static int64_t value_bytes(const xm_ir_value_t *v) {
  int64_t n = xm_ir_type_numel(&v->type);
  size_t es = xm_dtype_size(v->type.dtype);
  return n < 0 || (es && n > INT64_MAX / (int64_t)es) ? -1 : n * (int64_t)es;
}

/* Ops: layers, placements, groups, and the schedule's counts. */
static void check_ops(check_t *c) {
  const xm_inspect_t *ins = c->ins;
  const xm_ir_module_t *m = ins->m;
  int64_t layers = xm_ir_module_get_int(m, "layers", 1);
  int64_t arena[2] = {ins->mem.persistent_bytes, ins->mem.activation_bytes};
  int64_t micro = 0, step = 0;
  int bad_layer = 0, bad_mem = 0, bad_group = 0;
  for (int i = 0; i < xm_ir_module_num_ops(m); i++) {
    const xm_ir_op_t *op = xm_ir_module_op(m, i);
    const char *name = xm_ir_opinfo(op->code)->name;
    if (!xm_ir_op_is_declaration(op)) {
      const char *phase = xm_ir_op_get_string(op, "phase", "fwd");
      if (strcmp(phase, "step") == 0 && op->code != XM_OP_RETURN)
        step++;
      else
        micro++;
    }
    int64_t layer = xm_ir_op_get_int(op, "layer", -1);
    if ((layer < -1 || layer >= layers) && bad_layer++ < MAX_REPORTED)
      FAIL(c->xir, "op %d (%s): layer %" PRId64 " is outside the module's %" PRId64 " layers", i,
           name, layer, layers);
    for (int j = 0; j < op->num_results; j++) {
      xm_mem_place_t p;
      int64_t need = value_bytes(op->results[j]);
      bool folded = op->code == XM_OP_ACCUMULATE || xm_ir_op_attr(op, "accumulate");
      const char *why = NULL;
      if (!xm_plan_memory_place(op, j, &p))
        why = "has no valid placement (mem = [arena, offset, bytes] per result)";
      else if (p.offset > arena[p.arena] || p.bytes > arena[p.arena] - p.offset)
        why = "lies outside its arena (mem_persistent_bytes / mem_activation_bytes)";
      else if (need < 0 || (p.bytes < need && !(folded && p.bytes == 0)))
        why = "is placed in fewer bytes than its type holds";
      if (why && bad_mem++ < MAX_REPORTED)
        FAIL(c->xir, "op %d (%s): result %d %s", i, name, j, why);
    }
    xm_mem_place_t w;
    if (xm_ir_op_attr(op, "ws") &&
        (!xm_plan_memory_workspace(op, &w) || w.offset > arena[1] ||
         w.bytes > arena[1] - w.offset) &&
        bad_mem++ < MAX_REPORTED)
      FAIL(c->xir,
           "op %d (%s): its workspace (ws = [offset, bytes]) lies outside the activation "
           "arena",
           i, name);
    if (!(xm_ir_opinfo(op->code)->flags & XM_OPF_COMM)) continue;
    const char *g = xm_ir_op_get_string(op, "group", NULL);
    xm_group_kind_t kind;
    if (!g || !xm_group_kind_from_name(g, &kind)) {
      if (bad_group++ < MAX_REPORTED)
        FAIL(c->xir,
             "op %d (%s): group '%s' is not a group of the runtime (runtime/abi/groups.def)", i,
             name, g ? g : "(none)");
      continue;
    }
    int64_t size = xm_ir_op_get_int(op, "group_size", -1),
            want = xm_layout_group_size(&ins->layout, kind);
    if (size != want && bad_group++ < MAX_REPORTED)
      FAIL(c->xir,
           "op %d (%s): group_size %" PRId64 " is not the size of group '%s' under the "
           "module's layout (%" PRId64 ")",
           i, name, size, g, want);
  }
  int over = (bad_layer > MAX_REPORTED ? bad_layer - MAX_REPORTED : 0) +
             (bad_mem > MAX_REPORTED ? bad_mem - MAX_REPORTED : 0) +
             (bad_group > MAX_REPORTED ? bad_group - MAX_REPORTED : 0);
  if (over) FAIL(c->xir, "and %d more errors of the same kinds", over);
  int64_t sm = xm_ir_module_get_int(m, "schedule_micro_ops", -1);
  int64_t ss = xm_ir_module_get_int(m, "schedule_step_ops", -1);
  if (sm != micro || ss != step)
    FAIL(c->xir,
         "the schedule's counts (schedule_micro_ops = %" PRId64 ", schedule_step_ops = %" PRId64
         ") are not the module's ops (%" PRId64 " micro-batch, %" PRId64 " step)",
         sm, ss, micro, step);
  const xm_mem_report_t *r = &ins->mem;
  if (r->weights + r->grads + r->optimizer != r->persistent_bytes)
    FAIL(c->xir,
         "mem_weights + mem_grads + mem_optimizer (%" PRId64 ") is not "
         "mem_persistent_bytes (%" PRId64 ")",
         r->weights + r->grads + r->optimizer, r->persistent_bytes);
  if (r->activations + r->workspace != r->activation_bytes || r->inputs > r->activations)
    FAIL(c->xir,
         "mem_activations + mem_workspace (%" PRId64 ") is not mem_activation_bytes (%" PRId64
         "), or mem_inputs exceeds mem_activations",
         r->activations + r->workspace, r->activation_bytes);
}

/* An int option of a pipeline entry, as the pass parses it. */
static bool option_int(const xm_pass_pipeline_entry_t *e, const char *key, int64_t *out) {
  const char *v = xm_pass_option(&e->options, key);
  if (!v) return false;
  char *end;
  long long x = strtoll(v, &end, 10);
  if (end == v || *end) return false;
  *out = x;
  return true;
}

static void check_pipeline(check_t *c, const char *text) {
  xm_diag_t scratch;
  xm_diag_init(&scratch);
  xm_pass_pipeline_t p;
  if (xm_pass_pipeline_parse(text, &scratch, &p) != XM_OK) {
    FAIL(c->manifest, "\"pipeline\" does not parse: %s",
         scratch.count ? scratch.entries[0].message : "malformed");
    xm_diag_free(&scratch);
    return;
  }
  xm_diag_free(&scratch);
  if (p.num < 2 || strcmp(p.entries[p.num - 2].info->name, "plan-memory") != 0 ||
      strcmp(p.entries[p.num - 1].info->name, "schedule") != 0)
    FAIL(c->manifest, "\"pipeline\" must end in plan-memory,schedule (the passes of a compiled "
                      "program)");
  const xm_layout_t *l = &c->ins->layout;
  const struct {
    const char *key;
    int64_t want;
  } shard[] = {{"dp", l->dp},
               {"tp", l->tp},
               {"ep", l->ep},
               {"ssmb", l->ssmb},
               {"rbd", l->rbd},
               {"zero", l->zero},
               {"ranks-per-node", xm_ir_module_get_int(c->ins->m, "par_rpn", 0)}};
  for (int i = 0; i < p.num; i++) {
    const xm_pass_pipeline_entry_t *e = &p.entries[i];
    int64_t v;
    if (strcmp(e->info->name, "shard") == 0) {
      for (size_t k = 0; k < sizeof shard / sizeof shard[0]; k++)
        if (option_int(e, shard[k].key, &v) && v != shard[k].want)
          FAIL(c->manifest,
               "the pipeline's shard{%s=%" PRId64 "} is not the module's layout (%" PRId64
               " in %s)",
               shard[k].key, v, shard[k].want, c->xir);
    } else if (strcmp(e->info->name, "autodiff") == 0 && option_int(e, "grad-accum", &v) &&
               v != c->ins->grad_accum) {
      FAIL(c->manifest,
           "the pipeline's autodiff{grad-accum=%" PRId64 "} is not the module's "
           "grad_accum (%" PRId64 " in %s)",
           v, c->ins->grad_accum, c->xir);
    }
  }
  xm_pass_pipeline_free(&p);
}

static bool is_sha256(const char *s) {
  if (strlen(s) != 64) return false;
  for (; *s; s++)
    if (!isxdigit((unsigned char)*s) || isupper((unsigned char)*s)) return false;
  return true;
}

static void check_manifest(check_t *c, const cJSON *mf) {
  const cJSON *gen = cJSON_GetObjectItem(mf, "generator");
  if (!cJSON_IsString(gen) || strncmp(gen->valuestring, "xmoec ", 6) != 0)
    FAIL(c->manifest, "\"generator\" must be \"xmoec VERSION\" (not written by `xmoec compile`?)");
  const cJSON *pipe = cJSON_GetObjectItem(mf, "pipeline");
  if (!cJSON_IsString(pipe))
    FAIL(c->manifest, "\"pipeline\" must be a string (the passes that made model.xir)");
  else
    check_pipeline(c, pipe->valuestring);
  const cJSON *target = cJSON_GetObjectItem(mf, "target");
  if (!cJSON_IsString(target) || !xm_codegen_target_find(target->valuestring))
    FAIL(c->manifest, "\"target\" must be cpu, hip or cuda");
  const cJSON *inputs = cJSON_GetObjectItem(mf, "inputs");
  if (!cJSON_IsArray(inputs) || cJSON_GetArraySize(inputs) < 1 || cJSON_GetArraySize(inputs) > 2) {
    FAIL(c->manifest, "\"inputs\" must list the spec (and the cluster file) of the compile");
  } else {
    const cJSON *in;
    int k = 0;
    cJSON_ArrayForEach(in, inputs) {
      const cJSON *p = cJSON_GetObjectItem(in, "path"), *h = cJSON_GetObjectItem(in, "sha256");
      if (!cJSON_IsString(p) || !p->valuestring[0] || !cJSON_IsString(h) ||
          !is_sha256(h->valuestring))
        FAIL(c->manifest, "\"inputs\"[%d] must be {\"path\": a path, \"sha256\": 64 hex digits}",
             k);
      k++;
    }
  }
  const cJSON *mem = cJSON_GetObjectItem(mf, "memory");
  const xm_mem_report_t *r = &c->ins->mem;
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
  if (!cJSON_IsObject(mem)) {
    FAIL(c->manifest, "\"memory\" must be an object (the memory plan's totals)");
    return;
  }
  for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
    const cJSON *v = cJSON_GetObjectItem(mem, rows[k].key);
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)rows[k].v)
      FAIL(c->manifest, "\"memory\".\"%s\" is not the module's mem_%s (%" PRId64 " in %s)",
           rows[k].key, rows[k].key, rows[k].v, c->xir);
  }
}

static void check_config(check_t *c, const cJSON *cfg) {
  const xm_ir_module_t *m = c->ins->m;
  const struct {
    const char *key, *attr;
  } rows[] = {{"num_hidden_layers", "layers"},
              {"n_routed_experts", "experts"},
              {"num_experts_per_tok", "top_k"}};
  for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
    const cJSON *v = cJSON_GetObjectItem(cfg, rows[k].key);
    int64_t want = xm_ir_module_get_int(m, rows[k].attr, -1);
    if (!v || want < 0) continue;
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)want)
      FAIL(c->config,
           "\"%s\" is not the module's %s (%" PRId64 " in %s): config.json and "
           "model.xir come from different compiles",
           rows[k].key, rows[k].attr, want, c->xir);
  }
}

xm_status_t xm_inspect_check(const xm_inspect_t *ins, const cJSON *manifest, const cJSON *config,
                             xm_diag_t *diag) {
  check_t c = {.ins = ins,
               .diag = diag,
               .xir = xm_inspect_path(ins->dir, "model.xir"),
               .manifest = xm_inspect_path(ins->dir, "manifest.json"),
               .config = xm_inspect_path(ins->dir, "config.json")};
  check_module_attrs(&c);
  if (!c.errors) check_ops(&c);
  if (!c.errors) check_manifest(&c, manifest);
  if (!c.errors) check_config(&c, config);
  free(c.xir), free(c.manifest), free(c.config);
  return c.errors ? XM_ERR_INVALID_INPUT : XM_OK;
}
