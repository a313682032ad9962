/* runtime/driver/progress.c — progress line, per-step JSON log, time formatting.
 *
 * The live line is padded rather than cleared with terminal escapes so that
 * it also reads correctly in terminals and CI logs that ignore them. Losses
 * in the log are written with the shortest decimal that reads back to the
 * same double; since the loss is an fp32 value widened exactly, a reader
 * recovers the bits the program computed (tests compare resumed runs with
 * uninterrupted ones that way).
 */
#include "runtime/driver/progress.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double xm_rt_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void xm_rt_format_duration(double seconds, char *buf, size_t size) {
  if (!isfinite(seconds) || seconds < 0) {
    snprintf(buf, size, "?");
    return;
  }
  int64_t s = (int64_t)(seconds + 0.5);
  if (s >= 3600)
    snprintf(buf, size, "%" PRId64 ":%02d:%02d", s / 3600, (int)(s / 60 % 60), (int)(s % 60));
  else
    snprintf(buf, size, "%d:%02d", (int)(s / 60), (int)(s % 60));
}

void xm_rt_put_json_number(xm_strbuf_t *b, double v) {
  if (isfinite(v))
    xm_strbuf_put_double(b, v);
  else
    xm_strbuf_puts(b, "null");
}

void xm_rt_progress_init(xm_rt_progress_t *p, int rank, int mode, int quiet, int64_t first_step,
                         int64_t last_step, FILE *out) {
  memset(p, 0, sizeof *p);
  p->out = out;
  p->first_step = first_step;
  p->last_step = last_step;
  p->print = rank == 0 && !quiet && mode != 2 /* never */;
  p->live = mode == 1 /* always */ || (mode == 0 && isatty(fileno(out)));
  int64_t n = last_step - first_step + 1;
  p->every = n / 20 > 1 ? n / 20 : 1;
}

xm_status_t xm_rt_progress_open_log(xm_rt_progress_t *p, const char *path, int append,
                                    xm_diag_t *diag) {
  p->log = fopen(path, append ? "a" : "w");
  if (!p->log) {
    xm_diag_add(diag, XM_DIAG_ERROR, path, NULL, "cannot open the log: %s", strerror(errno));
    return XM_ERR_IO;
  }
  return XM_OK;
}

double xm_rt_aux_loss(const xm_rt_step_report_t *r) {
  return r->loss - r->ce_loss - (r->has_mtp ? r->mtp_weight * r->mtp_loss : 0.0);
}

static int write_log(FILE *log, const xm_rt_step_report_t *r) {
  xm_strbuf_t b;
  xm_strbuf_init(&b);
  xm_strbuf_printf(&b, "{\"step\":%" PRId64 ",\"loss\":", r->step);
  xm_rt_put_json_number(&b, r->loss);
  xm_strbuf_puts(&b, ",\"ce_loss\":");
  xm_rt_put_json_number(&b, r->ce_loss);
  if (r->has_mtp) {
    xm_strbuf_puts(&b, ",\"mtp_loss\":");
    xm_rt_put_json_number(&b, r->mtp_loss);
  }
  xm_strbuf_puts(&b, ",\"aux_loss\":");
  xm_rt_put_json_number(&b, xm_rt_aux_loss(r));
  xm_strbuf_puts(&b, ",\"lr\":");
  xm_rt_put_json_number(&b, r->lr);
  xm_strbuf_puts(&b, ",\"grad_norm\":");
  xm_rt_put_json_number(&b, r->grad_norm);
  xm_strbuf_printf(&b, ",\"tokens\":%" PRId64 ",\"tokens_per_s\":", r->tokens);
  xm_rt_put_json_number(&b, r->tokens_per_s);
  xm_strbuf_puts(&b, ",\"elapsed_s\":");
  xm_rt_put_json_number(&b, r->elapsed_s);
  if (r->traffic && r->traffic[0]) xm_strbuf_printf(&b, ",%s", r->traffic);
  xm_strbuf_puts(&b, "}\n");
  errno = 0;
  int bad = fputs(xm_strbuf_cstr(&b), log) == EOF;
  bad |= fflush(log) != 0;
  bad |= ferror(log) != 0;
  xm_strbuf_free(&b);
  return bad ? (errno ? errno : EIO) : 0;
}

int xm_rt_progress_step(xm_rt_progress_t *p, const xm_rt_step_report_t *r) {
  int err = p->log ? write_log(p->log, r) : 0;
  if (!p->print) return err;
  int last = r->step == p->last_step;
  if (!p->live && !last && (r->step - p->first_step + 1) % p->every != 0) return err;
  int64_t done = r->step - p->first_step + 1, left = p->last_step - r->step;
  char elapsed[32], eta[32];
  xm_rt_format_duration(r->elapsed_s, elapsed, sizeof elapsed);
  xm_rt_format_duration(done > 0 ? r->elapsed_s / (double)done * (double)left : 0, eta, sizeof eta);
  char line[256], mtp[32] = "";
  if (r->has_mtp) snprintf(mtp, sizeof mtp, "  mtp %.4f", r->mtp_loss);
  snprintf(line, sizeof line,
           "step %" PRId64 "/%" PRId64 "  loss %.4f%s  aux %.4f  lr %.3g  %.0f tok/s  "
           "elapsed %s  eta %s",
           r->step, p->last_step, r->loss, mtp, xm_rt_aux_loss(r), r->lr, r->tokens_per_s,
           elapsed, eta);
  if (p->live) {
    fprintf(p->out, "\r%-100s", line);
    p->dirty = 1;
  } else {
    fprintf(p->out, "%s\n", line);
  }
  fflush(p->out);
  return err;
}

int xm_rt_progress_finish(xm_rt_progress_t *p) {
  if (p->dirty) fputc('\n', p->out);
  p->dirty = 0;
  int err = 0;
  if (p->log && fclose(p->log) != 0) err = errno ? errno : EIO;
  p->log = NULL;
  return err;
}
