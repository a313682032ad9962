/* runtime/emu/emu.cpp — the GPU execution model on the CPU (runtime/emu/emu.h).
 *
 * Blocks are shared among the OpenMP threads; one OS thread runs one block
 * from start to end. The block's GPU threads are ucontext fibers on stacks
 * of XM_EMU_STACK bytes (with a guard page below, so an overflow stops
 * with SIGSEGV instead of corrupting a neighbour), kept per OS thread and
 * reused from launch to launch. A round-robin scheduler resumes every
 * fiber that can go on; a fiber gives control back only at a barrier, so
 * between two barriers each thread runs straight, in the scheduler's order
 * (forward, reverse, or a seeded shuffle: XM_EMU_SCHEDULE). When no fiber
 * can go on and some have not ended, the threads wait at barriers that
 * cannot complete: the kernel has a divergent barrier, and the emulator
 * says where and exits with code 70.
 *
 * AddressSanitizer follows the fibers through its fiber-switch hooks.
 */
#include "runtime/emu/emu.h"

#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define XM_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define XM_EMU_ASAN 1
#endif
#endif
#ifdef XM_EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

thread_local xm_emu_thread_t *xm_emu_cur_thread;
thread_local xm_emu_block_t *xm_emu_cur_block;

namespace {

constexpr size_t kStack = 256 * 1024; /* per GPU thread; kernels keep tiles in registers */
constexpr int kMaxThreads = 1024;

enum State { READY, AT_BLOCK, AT_WARP, DONE };

struct Fiber {
  ucontext_t ctx;
  xm_emu_thread_t t;
  State state;
  uint64_t gen; /* the barrier generation it waits to see pass */
  char *stack;  /* usable bottom (above the guard page) */
#ifdef XM_EMU_ASAN
  void *fake;
#endif
};

struct Block {
  xm_emu_block_t info;
  const char *name;
  const std::function<void()> *body;
  std::vector<Fiber> fibers;
  int live;
  int arrived;
  uint64_t gen;
  const char *site_file; /* where the first thread of this generation waits */
  int site_line;
  std::vector<int> warp_live, warp_arrived;
  std::vector<uint64_t> warp_gen;
  std::vector<uint32_t> slots; /* XM_EMU_MAX_WORDS per thread */
  ucontext_t sched;
  Fiber *cur;
#ifdef XM_EMU_ASAN
  void *sched_fake;
  const void *sched_bottom;
  size_t sched_size;
#endif
  int64_t switches;
};

std::atomic<int64_t> g_launches{0}, g_blocks{0}, g_switches{0};

/* The fiber stacks of this OS thread, grown on demand and kept. */
thread_local std::vector<char *> t_stacks;

char *stack_for(int i) {
  while ((int)t_stacks.size() <= i) {
    long page = sysconf(_SC_PAGESIZE);
    size_t len = kStack + (size_t)page;
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      fprintf(stderr, "xmoec emulator: cannot map a fiber stack: %s\n", strerror(errno));
      exit(70);
    }
    mprotect(p, (size_t)page, PROT_NONE);
    t_stacks.push_back((char *)p + page);
  }
  return t_stacks[(size_t)i];
}

thread_local Block *t_block;

/* Fiber -> scheduler. */
void yield_to_sched(Block *b, Fiber *f) {
  b->switches++;
#ifdef XM_EMU_ASAN
  __sanitizer_start_switch_fiber(&f->fake, b->sched_bottom, b->sched_size);
#endif
  swapcontext(&f->ctx, &b->sched);
#ifdef XM_EMU_ASAN
  __sanitizer_finish_switch_fiber(f->fake, &b->sched_bottom, &b->sched_size);
#endif
  xm_emu_cur_thread = &f->t;
  xm_emu_cur_block = &b->info;
}

void release_block(Block *b) {
  b->gen++;
  b->arrived = 0;
}

void release_warp(Block *b, int w) {
  b->warp_gen[(size_t)w]++;
  b->warp_arrived[(size_t)w] = 0;
}

void fiber_main(int lo, int hi) {
  (void)lo;
  (void)hi;
  Block *b = t_block;
  Fiber *f = b->cur;
#ifdef XM_EMU_ASAN
  __sanitizer_finish_switch_fiber(NULL, &b->sched_bottom, &b->sched_size);
#endif
  xm_emu_cur_thread = &f->t;
  xm_emu_cur_block = &b->info;
  (*b->body)();
  f->state = DONE;
  b->live--;
  int w = f->t.tid / b->info.warp;
  b->warp_live[(size_t)w]--;
  if (b->arrived > 0 && b->arrived == b->live) release_block(b);
  if (b->warp_arrived[(size_t)w] > 0 && b->warp_arrived[(size_t)w] == b->warp_live[(size_t)w])
    release_warp(b, w);
#ifdef XM_EMU_ASAN
  __sanitizer_start_switch_fiber(NULL, b->sched_bottom, b->sched_size);
#endif
  /* returns to uc_link: the scheduler */
}

/* XM_EMU_SCHEDULE: "forward" (default), "reverse", "random[:seed]". */
struct Order {
  int kind; /* 0 forward, 1 reverse, 2 random */
  uint64_t seed;
};

Order schedule_order() {
  static Order o = [] {
    Order r{0, 1};
    const char *s = getenv("XM_EMU_SCHEDULE");
    if (!s || !*s || strcmp(s, "forward") == 0) return r;
    if (strcmp(s, "reverse") == 0) {
      r.kind = 1;
      return r;
    }
    if (strncmp(s, "random", 6) == 0 && (s[6] == 0 || s[6] == ':')) {
      r.kind = 2;
      if (s[6] == ':') r.seed = strtoull(s + 7, NULL, 10);
      return r;
    }
    fprintf(stderr, "xmoec emulator: XM_EMU_SCHEDULE=%s: expected forward, reverse or random[:seed]\n",
            s);
    exit(2);
  }();
  return o;
}

void deadlock(Block *b) {
  fprintf(stderr,
          "xmoec emulator: kernel %s, block (%lld,%lld,%lld): threads wait at barriers that cannot "
          "complete (a divergent barrier):\n",
          b->name, (long long)b->info.bx, (long long)b->info.by, (long long)b->info.bz);
  int shown = 0;
  for (const Fiber &f : b->fibers) {
    if (f.state == DONE) continue;
    if (shown++ < 8)
      fprintf(stderr, "  thread %d waits at a %s barrier\n", f.t.tid,
              f.state == AT_BLOCK ? "block" : "warp");
  }
  fprintf(stderr, "  (%d of %d threads still live)\n", b->live, b->info.threads);
  exit(70);
}

void run_block(Block *b, int64_t index, uint64_t *rng) {
  xm_emu_block_t &in = b->info;
  in.bx = index % in.gx;
  in.by = (index / in.gx) % in.gy;
  in.bz = index / (in.gx * in.gy);
  int n = in.threads, warps = (n + in.warp - 1) / in.warp;
  b->fibers.resize((size_t)n);
  b->live = n;
  b->arrived = 0;
  b->gen = 0;
  b->site_file = NULL;
  b->site_line = 0;
  b->warp_live.assign((size_t)warps, 0);
  b->warp_arrived.assign((size_t)warps, 0);
  b->warp_gen.assign((size_t)warps, 0);
  b->slots.assign((size_t)n * XM_EMU_MAX_WORDS, 0u);
  for (int i = 0; i < n; i++) {
    Fiber &f = b->fibers[(size_t)i];
    f.t.tid = i;
    f.state = READY;
    f.gen = 0;
    f.stack = stack_for(i);
    b->warp_live[(size_t)(i / in.warp)]++;
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = kStack;
    f.ctx.uc_link = &b->sched;
    makecontext(&f.ctx, (void (*)(void))fiber_main, 2, 0, 0);
  }
  std::vector<int> order((size_t)n);
  Order o = schedule_order();
  while (b->live > 0) {
    for (int i = 0; i < n; i++) order[(size_t)i] = o.kind == 1 ? n - 1 - i : i;
    if (o.kind == 2)
      for (int i = n - 1; i > 0; i--) {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        int j = (int)(*rng % (uint64_t)(i + 1));
        int t = order[(size_t)i];
        order[(size_t)i] = order[(size_t)j];
        order[(size_t)j] = t;
      }
    bool progressed = false;
    for (int i : order) {
      Fiber &f = b->fibers[(size_t)i];
      if (f.state == DONE) continue;
      if (f.state == AT_BLOCK && f.gen == b->gen) continue;
      if (f.state == AT_WARP && f.gen == b->warp_gen[(size_t)(i / in.warp)]) continue;
      f.state = READY;
      b->cur = &f;
      b->switches++;
#ifdef XM_EMU_ASAN
      __sanitizer_start_switch_fiber(&b->sched_fake, f.stack, kStack);
#endif
      swapcontext(&b->sched, &f.ctx);
#ifdef XM_EMU_ASAN
      __sanitizer_finish_switch_fiber(b->sched_fake, NULL, NULL);
#endif
      progressed = true;
    }
    if (!progressed) deadlock(b);
  }
}

} // namespace

void xm_emu_launch(const char *name, int64_t gx, int64_t gy, int64_t gz, int threads, int warp,
                   const std::function<void()> &body) {
  if (gx <= 0 || gy <= 0 || gz <= 0) return;
  if (threads < 1 || threads > kMaxThreads || warp < 1) {
    fprintf(stderr, "xmoec emulator: kernel %s launched with %d threads per block (1 to %d)\n",
            name, threads, kMaxThreads);
    exit(70);
  }
  int64_t blocks = gx * gy * gz;
  g_launches++;
  g_blocks += blocks;
  xm_emu_thread_t *saved_t = xm_emu_cur_thread;
  xm_emu_block_t *saved_b = xm_emu_cur_block;
  int64_t switches = 0;
#pragma omp parallel reduction(+ : switches) if (blocks > 1)
  {
    Block b;
    b.info.threads = threads;
    b.info.warp = warp;
    b.info.gx = gx;
    b.info.gy = gy;
    b.info.gz = gz;
    b.name = name;
    b.body = &body;
    b.switches = 0;
    t_block = &b;
    uint64_t rng = schedule_order().seed * 0x9E3779B97F4A7C15ull + 1u + (uint64_t)omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < blocks; i++) run_block(&b, i, &rng);
    switches += b.switches;
    t_block = NULL;
  }
  g_switches += switches;
  xm_emu_cur_thread = saved_t;
  xm_emu_cur_block = saved_b;
}

void xm_emu_sync_at(const char *file, int line) {
  Block *b = t_block;
  Fiber *f = b->cur;
  if (b->arrived == 0) {
    b->site_file = file;
    b->site_line = line;
  } else if (line != b->site_line || (file != b->site_file && strcmp(file, b->site_file) != 0)) {
    fprintf(stderr,
            "xmoec emulator: kernel %s, block (%lld,%lld,%lld): thread %d reached the barrier at "
            "%s:%d while %d thread(s) wait at the one at %s:%d (a divergent barrier)\n",
            b->name, (long long)b->info.bx, (long long)b->info.by, (long long)b->info.bz,
            f->t.tid, file, line, b->arrived, b->site_file, b->site_line);
    exit(70);
  }
  if (++b->arrived == b->live) {
    release_block(b);
    return;
  }
  f->state = AT_BLOCK;
  f->gen = b->gen;
  yield_to_sched(b, f);
  b->cur = f;
}

static void warp_barrier(Block *b, Fiber *f) {
  int w = f->t.tid / b->info.warp;
  if (++b->warp_arrived[(size_t)w] == b->warp_live[(size_t)w]) {
    release_warp(b, w);
    return;
  }
  f->state = AT_WARP;
  f->gen = b->warp_gen[(size_t)w];
  yield_to_sched(b, f);
  b->cur = f;
}

void xm_emu_warp_exchange(const uint32_t *mine, int words, uint32_t *all) {
  Block *b = t_block;
  Fiber *f = b->cur;
  if (words < 0 || words > XM_EMU_MAX_WORDS) {
    fprintf(stderr, "xmoec emulator: kernel %s: a warp exchange of %d words (at most %d)\n",
            b->name, words, XM_EMU_MAX_WORDS);
    exit(70);
  }
  int tid = f->t.tid, W = b->info.warp, first = tid / W * W;
  memcpy(&b->slots[(size_t)tid * XM_EMU_MAX_WORDS], mine, sizeof(uint32_t) * (size_t)words);
  warp_barrier(b, f);
  for (int l = 0; l < W; l++) {
    int t = first + l;
    for (int w = 0; w < words; w++)
      all[l * words + w] =
          t < b->info.threads ? b->slots[(size_t)t * XM_EMU_MAX_WORDS + (size_t)w] : 0u;
  }
  warp_barrier(b, f);
}

uint32_t xm_emu_shfl(uint32_t v, int src) {
  uint32_t all[1024];
  xm_emu_warp_exchange(&v, 1, all);
  int W = t_block->info.warp;
  return all[((src % W) + W) % W];
}

xm_emu_stats_t xm_emu_stats(void) {
  xm_emu_stats_t s;
  s.launches = g_launches.load();
  s.blocks = g_blocks.load();
  s.switches = g_switches.load();
  return s;
}
