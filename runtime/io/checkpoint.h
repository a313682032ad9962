/* runtime/io/checkpoint.h — checkpoints in Hugging Face form.
 *
 * A checkpoint directory holds model.safetensors (or model-0000x-of-0000y
 * shards + model.safetensors.index.json when large) with Hugging Face
 * tensor names and [out, in] layout, stacked expert params split into one
 * tensor per expert ("{e}" replaced by the index); config.json with the
 * DeepSeek-V3 field names (the program's config_json); optimizer.safetensors
 * with "<name>.exp_avg" / "<name>.exp_avg_sq" (and the aux-free load
 * accumulators); trainer_state.json with step, data position, RNG state and
 * the settings. Saving is atomic: everything is written into a temporary
 * directory beside the target, synced, then renamed into place; a crash at
 * any moment leaves the previous checkpoint intact. Loading checks names,
 * shapes and dtypes against the program and reports every mismatch with the
 * file and tensor name (XM_ERR_INVALID_INPUT).
 */
#ifndef XM_RUNTIME_CHECKPOINT_H
#define XM_RUNTIME_CHECKPOINT_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/abi/program.h"
#include "support/diag.h"
#include "support/status.h"

typedef struct {
  int64_t step;          /* optimizer steps completed */
  int64_t data_pos;      /* next training window */
  uint64_t rng[4];       /* RNG state (xoshiro256**) */
  double last_loss;
} xm_rt_train_state_t;

/* Writes the checkpoint of `x` (params from the persistent arena, the
 * optimizer states when with_optimizer) to `dir` atomically. */
xm_status_t xm_rt_checkpoint_save(const xm_rt_exec_t *x, const char *dir,
                                  const xm_rt_train_state_t *st, bool with_optimizer,
                                  xm_diag_t *diag);

/* Loads params (and optimizer states when with_optimizer and present) into
 * the persistent arena of `x`; fills *st from trainer_state.json when
 * present (zeros otherwise). */
xm_status_t xm_rt_checkpoint_load(xm_rt_exec_t *x, const char *dir, bool with_optimizer,
                                  xm_rt_train_state_t *st, xm_diag_t *diag);

/* Test-only (tests/e2e/ckpt_crash.sh): when XM_CKPT_CRASH names `point`,
 * the process ends there at once (exit code 137, nothing cleaned up), as a
 * kill at that moment of a save would leave it. The points, in the order
 * of a save: model-written, written, exchanged | aside, placed (the swap
 * into an existing directory), latest (out/train's `latest` file). Never
 * set in a real run. */
void xm_rt_ckpt_crash_point(const char *point);

#endif /* XM_RUNTIME_CHECKPOINT_H */
