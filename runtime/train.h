/* runtime/train.h — the training driver that out/train runs.
 *
 *   out/train --data PATH [--steps N] [--lr X] [--warmup N]
 *             [--schedule cosine|constant] [--weight-decay X] [--clip X]
 *             [--seed S] [--ckpt-dir DIR] [--save-every N] [--resume DIR]
 *             [--eval --batches N] [--json] [--log FILE]
 *
 * It starts the runtime context (MPI), allocates the arenas the program
 * asks for, initialises parameters deterministically from the seed (or
 * loads a checkpoint), and for every optimizer step runs program->micro
 * grad_accum times on consecutive training windows, then program->step with
 * the learning rate of the schedule. A progress line per step on a terminal
 * (step, loss, aux loss, tokens/s, elapsed, ETA), one JSON object per step
 * to --log. Bad flags or data: a message and exit code 2.
 */
#ifndef XM_RUNTIME_TRAIN_H
#define XM_RUNTIME_TRAIN_H

#include "runtime/program.h"

int xm_rt_train_main(int argc, char **argv, const xm_rt_program_t *program);

#endif /* XM_RUNTIME_TRAIN_H */
