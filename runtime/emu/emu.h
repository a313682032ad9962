/* runtime/emu/emu.h — the CPU emulation of the GPU execution model that the
 * kernel text of runtime/gpu/ is compiled against when no GPU compiler is
 * used (runtime/gpu/xm_gpu.h includes it; C++ only).
 *
 * A launch runs its blocks on the OpenMP threads of the process; inside a
 * block every GPU thread is a fiber with its own stack, run until it
 * reaches a barrier and switched there, so the kernel text runs unchanged:
 * shared memory is block-private (XM_SHARED is a thread_local array, and
 * one OS thread runs one block to its end), a block barrier waits for
 * every live thread of the block, a warp collective for every live lane of
 * the warp. What a GPU would not tell you, the emulator reports and stops
 * on: threads waiting at different barriers (a divergent barrier), and,
 * with XM_EMU_SCHEDULE=reverse or random[:seed], the threads between two
 * barriers run in another order, which exposes a missing barrier as a
 * changed result. Warp width and fragment layouts are the kernel text's
 * (xm_gpu.h), so one emulator serves the AMD and the NVIDIA targets.
 */
#ifndef XM_RUNTIME_EMU_EMU_H
#define XM_RUNTIME_EMU_EMU_H

#include <stdint.h>

#include <functional>

/* What kernel text can see of the block it runs in. */
typedef struct {
  int threads;              /* threads of the block */
  int warp;                 /* lanes per warp */
  int64_t bx, by, bz;       /* this block */
  int64_t gx, gy, gz;       /* the grid */
} xm_emu_block_t;

typedef struct {
  int tid;
} xm_emu_thread_t;

extern thread_local xm_emu_thread_t *xm_emu_cur_thread;
extern thread_local xm_emu_block_t *xm_emu_cur_block;

static inline xm_emu_thread_t *xm_emu_self(void) { return xm_emu_cur_thread; }
static inline xm_emu_block_t *xm_emu_block(void) { return xm_emu_cur_block; }

/* Runs `body` once per thread of every block of the grid (blocks of
 * `threads` threads, warps of `warp` lanes); returns when all have ended. */
void xm_emu_launch(const char *name, int64_t gx, int64_t gy, int64_t gz, int threads, int warp,
                   const std::function<void()> &body);

/* The block barrier at source place (file, line). */
void xm_emu_sync_at(const char *file, int line);

/* Every live lane of the calling thread's warp passes `words` (at most
 * XM_EMU_MAX_WORDS) 32-bit words; each gets all of them, lane by lane, in
 * all[lane * words + w] (lanes past the end of the block read zeros). */
#define XM_EMU_MAX_WORDS 16
void xm_emu_warp_exchange(const uint32_t *mine, int words, uint32_t *all);

/* The value `v` of lane `src` of the warp. */
uint32_t xm_emu_shfl(uint32_t v, int src);

/* Counters of the emulator (the tests read them). */
typedef struct {
  int64_t launches, blocks, switches;
} xm_emu_stats_t;
xm_emu_stats_t xm_emu_stats(void);

#endif /* XM_RUNTIME_EMU_EMU_H */
