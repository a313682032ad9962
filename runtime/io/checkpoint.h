/* runtime/io/checkpoint.h — checkpoints in Hugging Face form.
 *
 * A checkpoint directory holds model.safetensors (or model-0000x-of-0000y
 * shards + model.safetensors.index.json when large) with Hugging Face
 * tensor names and [out, in] layout, stacked expert params split into one
 * tensor per expert ("{e}" replaced by the index); config.json (the
 * program's config_json: its architecture's, or DeepSeek-V3 field names
 * with model_type "xmoec"); optimizer.safetensors
 * with "<name>.exp_avg" / "<name>.exp_avg_sq" (and the aux-free load
 * accumulators); trainer_state.json with step, data position, RNG state and
 * the settings. Saving is atomic: everything is written into a temporary
 * directory beside the target, synced, then renamed into place; a crash at
 * any moment leaves the previous checkpoint intact. Loading checks names,
 * shapes and dtypes against the program and reports every mismatch with the
 * file and tensor name (XM_ERR_INVALID_INPUT). A program of a Hugging Face
 * architecture (frontend/hf_arch.h) has that architecture's tensor names
 * and config.json, so its checkpoints are that model's; --init-from
 * (xm_rt_checkpoint_import) starts training from such a checkpoint, BF16
 * or F16 ones included.
 */
#ifndef XM_RUNTIME_CHECKPOINT_H
#define XM_RUNTIME_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
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

/* --init-from: loads the weights of a checkpoint of this model into the
 * persistent arena of `x` and zeroes the gradients and optimizer states
 * (step 0, data position 0 are the caller's). The checkpoint is a Hugging
 * Face directory (config.json with model.safetensors, or
 * model-0000k-of-0000N.safetensors with model.safetensors.index.json) or
 * one out/train wrote; tensors may be F32, BF16 or F16 (converted to f32).
 * Every expected tensor must be there with its shape, nothing else (but
 * the MTP layers' copies of the embedding and head DeepSeek-V3 stores,
 * checked to be copies, and old RoPE buffers), no NaN or infinity, and
 * config.json must be there and describe the same model
 * (xm_rt_hf_config_check). Every problem is reported with the file and
 * tensor or key (XM_ERR_INVALID_INPUT); the arena is unchanged then. */
xm_status_t xm_rt_checkpoint_import(xm_rt_exec_t *x, const char *dir, xm_diag_t *diag);

/* The config.json text of a checkpoint (`text`, `len` bytes, read from
 * `path`) against the program's config_json. For a program of a Hugging
 * Face architecture: the model_type, then the keys that decide the weights
 * and the function, absent ones taking the defaults of xmoec's HF importer
 * (docs/checkpoints.md); every difference is an error at its HF key
 * ("/num_experts_per_tok: is 3 in the checkpoint, 2 in the compiled
 * program"). For an xmoec program: every field but name and torch_dtype
 * equal. XM_ERR_INVALID_INPUT when they differ or the text is not a JSON
 * object. */
xm_status_t xm_rt_hf_config_check(const char *program_config, const char *text, size_t len,
                                  const char *path, xm_diag_t *diag);

/* Test-only (tests/e2e/ckpt_crash.sh): when XM_CKPT_CRASH names `point`,
 * the process ends there at once (exit code 137, nothing cleaned up), as a
 * kill at that moment of a save would leave it. The points, in the order
 * of a save: model-written, written, exchanged | aside, placed (the swap
 * into an existing directory), latest (out/train's `latest` file). Never
 * set in a real run. */
void xm_rt_ckpt_crash_point(const char *point);

#endif /* XM_RUNTIME_CHECKPOINT_H */
