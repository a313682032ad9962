/* tools/xmoec/inspect_trace.c — the predicted step timeline as Chrome /
 * Perfetto trace JSON (`xmoec inspect --format trace`).
 *
 * One optimizer step of rank 0, as the generated program runs it: the
 * micro-batch function grad_accum times, then the step function; one "X"
 * event per traced op (every op but input and return) with its predicted
 * duration, back to back (the CPU runtime runs one op at a time). Compute
 * ops are on tid 0, collectives on tid 1, both in pid 0. args carry the op
 * index (position in OUT/model.xir), the micro-batch (-1: step function),
 * the phase and the layer: the keys by which the events of
 * `out/train --trace` (runtime/driver/trace.c, same format) meet these.
 */
#include <inttypes.h>

#include "tools/xmoec/inspect.h"

static void event(xm_strbuf_t *out, const xm_ins_op_t *o, int micro, double ts, bool *first) {
  xm_strbuf_printf(out,
                   "%s{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,"
                   "\"pid\":0,\"tid\":%d,\"args\":{\"op\":%d,\"micro\":%d,\"layer\":%d,"
                   "\"flops\":%.0f,\"bytes_sent\":%.0f}}",
                   *first ? "" : ",\n", o->name, xm_inspect_phase_name(o->phase), ts * 1e6,
                   o->seconds * 1e6, o->comm ? 1 : 0, o->index, micro, o->layer, o->flops,
                   o->sent_intra + o->sent_inter);
  *first = false;
}

void xm_inspect_trace(const xm_inspect_t *ins, xm_strbuf_t *out) {
  xm_strbuf_puts(out, "{\"traceEvents\":[\n");
  xm_strbuf_puts(out, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,"
                      "\"args\":{\"name\":\"rank 0 (predicted)\"}},\n");
  xm_strbuf_puts(out, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,"
                      "\"args\":{\"name\":\"compute\"}},\n");
  xm_strbuf_puts(out, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":1,"
                      "\"args\":{\"name\":\"collectives\"}},\n");
  double ts = 0.0;
  bool first = true;
  int64_t events = 0;
  for (int64_t micro = 0; micro < ins->grad_accum; micro++)
    for (int i = 0; i < ins->num_micro; i++) {
      const xm_ins_op_t *o = &ins->ops[i];
      if (!o->traced || (o->last_micro && micro != ins->grad_accum - 1)) continue;
      event(out, o, (int)micro, ts, &first);
      ts += o->seconds;
      events++;
    }
  for (int i = ins->num_micro; i < ins->num_ops; i++) {
    const xm_ins_op_t *o = &ins->ops[i];
    if (!o->traced) continue;
    event(out, o, -1, ts, &first);
    ts += o->seconds;
    events++;
  }
  xm_strbuf_puts(out, "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"source\":\"xmoec "
                      "inspect\",\"kind\":\"predicted\",\"model\":");
  xm_strbuf_put_quoted(out, ins->model);
  xm_strbuf_printf(out,
                   ",\"world\":%" PRId64 ",\"grad_accum\":%" PRId64 ",\"events\":%" PRId64
                   ",\"step_s\":%.9g,\"machine\":",
                   ins->world, ins->grad_accum, events, ts);
  xm_strbuf_put_quoted(out, ins->machine);
  xm_strbuf_puts(out, "}}\n");
}
