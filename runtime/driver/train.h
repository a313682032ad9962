/* runtime/driver/train.h — the training driver that out/train runs.
 *
 *   out/train --data PATH [--steps N] [--lr X] [--warmup N]
 *             [--schedule cosine|constant] [--weight-decay X] [--clip X]
 *             [--seed S] [--ckpt-dir DIR] [--save-every N] [--resume DIR]
 *             [--eval --batches N] [--json] [--log FILE] [--traffic FILE]
 *
 * It starts the runtime context (MPI), refuses a world size other than the
 * program's dp * tp, builds the communicator of the program's layout,
 * allocates the arenas the program asks for, initialises parameters
 * deterministically from the seed (each rank its slices of the full
 * tensors) or loads a checkpoint (whole tensors, any layout), and for every
 * optimizer step runs program->micro grad_accum times on this DP group's
 * share of the step's training windows, then program->step with the
 * learning rate of the schedule. A progress line per step on a terminal
 * (step, loss, aux loss, tokens/s, elapsed, ETA), one JSON object per step
 * to --log. Bad flags or data: a message and exit code 2.
 */
#ifndef XM_RUNTIME_TRAIN_H
#define XM_RUNTIME_TRAIN_H

#include "runtime/abi/program.h"

int xm_rt_train_main(int argc, char **argv, const xm_rt_program_t *program);

#endif /* XM_RUNTIME_TRAIN_H */
