/* runtime/driver/progress.h — what out/train tells the user while it trains
 * (internal to the training driver).
 *
 * Three outputs, all written by rank 0 only: a live progress line rewritten
 * in place on a terminal (or one plain line every ~5% of the run when stderr
 * is a file or pipe), the --log file with one JSON object per step (with
 * the step's communication traffic when the driver has it), flushed
 * after each so that `tail -f` and a crashed run both see every completed
 * step, and the formatting helpers of the final summary.
 */
#ifndef XM_RUNTIME_PROGRESS_H
#define XM_RUNTIME_PROGRESS_H

#include <stdint.h>
#include <stdio.h>

#include "support/diag.h"
#include "support/status.h"
#include "support/strbuf.h"

typedef struct {
  int64_t step;
  double loss, ce_loss, lr, grad_norm;
  /* Programs with MTP (has_mtp): the modules' mean cross-entropy and the
   * weight the loss takes it with; aux_loss is what remains of the loss. */
  int has_mtp;
  double mtp_loss, mtp_weight;
  int64_t tokens;      /* trained so far, resumed steps included */
  double tokens_per_s; /* over this run */
  double elapsed_s;    /* since this run's first step began */
  const char *traffic; /* the step's "traffic":{...} member (docs/traffic.md), or NULL;
                          borrowed */
} xm_rt_step_report_t;

/* loss - ce_loss, less the weighted MTP loss when there is one. */
double xm_rt_aux_loss(const xm_rt_step_report_t *r);

typedef struct {
  int print;     /* progress lines at all (rank 0, not --quiet/never) */
  int live;      /* rewrite one line with \r */
  int64_t every; /* plain mode: a line every `every` steps */
  int64_t first_step, last_step;
  int dirty; /* a live line is on screen without its newline */
  FILE *out; /* stderr; borrowed */
  FILE *log; /* owned; NULL without --log */
} xm_rt_progress_t;

/* mode: xm_rt_progress_mode_t. Steps first_step..last_step will be
 * reported. `out` is where progress goes (stderr). */
void xm_rt_progress_init(xm_rt_progress_t *p, int rank, int mode, int quiet, int64_t first_step,
                         int64_t last_step, FILE *out);
/* Opens the --log file (append when resuming, so the log of an interrupted
 * run continues). */
xm_status_t xm_rt_progress_open_log(xm_rt_progress_t *p, const char *path, int append,
                                    xm_diag_t *diag);
/* Reports a step (the log line, the progress line). Returns 0, or the
 * errno of a failed write of the log (a full disk, a file-size limit): the
 * caller ends the run. */
int xm_rt_progress_step(xm_rt_progress_t *p, const xm_rt_step_report_t *r);
/* Ends a live line and closes the log; returns 0 or the errno of a failed
 * close (the last lines did not reach the disk). */
int xm_rt_progress_finish(xm_rt_progress_t *p);

/* Seconds on a monotonic clock. */
double xm_rt_now(void);
/* "1:02:03" or "2:03" */
void xm_rt_format_duration(double seconds, char *buf, size_t size);
/* A JSON number, or null when not finite (JSON has no inf/nan). */
void xm_rt_put_json_number(xm_strbuf_t *b, double v);

#endif /* XM_RUNTIME_PROGRESS_H */
