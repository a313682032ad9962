/* runtime/emu/emu.cpp — the GPU execution model on the CPU (runtime/emu/emu.h).
 *
 * Blocks are shared among the OpenMP threads; one OS thread runs one block
 * from start to end. The block's GPU threads are fibers on stacks
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
 * A switch on x86-64 saves and restores the callee-saved registers, the
 * stack pointer and the SSE / x87 control words (xm_emu_switch below, about
 * 20 instructions); elsewhere it is ucontext's swapcontext, which also
 * saves the signal mask with a system call and is 10 to 20 times slower
 * (the tiny sample's step spent 80% of its time there).
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

#if defined(__x86_64__) && !defined(XM_EMU_UCONTEXT)
#define XM_EMU_ASM_SWITCH 1
/* xm_emu_switch(save, to): pushes rbp, rbx, r12-r15 and the MXCSR and x87
 * control words on the current stack, stores the stack pointer in *save,
 * loads `to` and pops the same from there. A new fiber's stack is laid out
 * as if it had been switched away from just before entering its entry
 * function (fiber_stack_init). */
extern "C" void xm_emu_switch(void **save, void *to);
__asm__(".text\n"
        ".globl xm_emu_switch\n"
        ".type xm_emu_switch,@function\n"
        "xm_emu_switch:\n"
        "  pushq %rbp\n"
        "  pushq %rbx\n"
        "  pushq %r12\n"
        "  pushq %r13\n"
        "  pushq %r14\n"
        "  pushq %r15\n"
        "  subq $8, %rsp\n"
        "  stmxcsr (%rsp)\n"
        "  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n"
        "  fldcw 4(%rsp)\n"
        "  addq $8, %rsp\n"
        "  popq %r15\n"
        "  popq %r14\n"
        "  popq %r13\n"
        "  popq %r12\n"
        "  popq %rbx\n"
        "  popq %rbp\n"
        "  ret\n"
        ".size xm_emu_switch,.-xm_emu_switch\n"
        ".section .note.GNU-stack,\"\",@progbits\n"
        ".text\n");
#endif

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

/* Stops the process after a message: a kernel error found by the emulator.
 * _exit, since it comes from inside a fiber, whose stack and block state
 * will never be unwound (exit would run the leak checker over them). */
[[noreturn]] void emu_stop(void) {
  fflush(stdout);
  fflush(stderr);
  _exit(70);
}

constexpr size_t kStack = 256 * 1024; /* per GPU thread; kernels keep tiles in registers */
constexpr int kMaxThreads = 1024;

enum State { READY, AT_BLOCK, AT_WARP, DONE };

struct Fiber {
#ifdef XM_EMU_ASM_SWITCH
  void *sp; /* saved stack pointer while switched away */
#else
  ucontext_t ctx;
#endif
  xm_emu_thread_t t;
  State state;
  uint64_t gen; /* the barrier generation it waits to see pass */
  uint64_t exchanges; /* warp exchanges so far: their parity picks the slot bank */
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
  /* Two banks of XM_EMU_MAX_WORDS words per thread: exchange g of a warp
   * uses bank g % 2, so one warp barrier per exchange suffices (a lane can
   * only write bank g % 2 again at exchange g + 2, after every lane has
   * passed exchange g + 1's barrier, i.e. finished reading exchange g). */
  std::vector<uint32_t> slots;
#ifdef XM_EMU_ASM_SWITCH
  void *sched_sp;
#else
  ucontext_t sched;
#endif
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
      emu_stop();
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
#ifdef XM_EMU_ASM_SWITCH
  xm_emu_switch(&f->sp, b->sched_sp);
#else
  swapcontext(&f->ctx, &b->sched);
#endif
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
#ifdef XM_EMU_ASM_SWITCH
  void *dead;
  xm_emu_switch(&dead, b->sched_sp); /* never resumed */
  __builtin_unreachable();
#endif
  /* ucontext: returns to uc_link, the scheduler */
}

#ifdef XM_EMU_ASM_SWITCH
extern "C" void xm_emu_fiber_entry(void) { fiber_main(0, 0); }

/* The initial frame of a fiber: what xm_emu_switch pops, then the entry
 * function's address for its `ret`, then a null return address for the
 * entry function (entered with the stack 8 bytes off 16, as after a call). */
void *fiber_stack_init(char *stack, size_t size) {
  uintptr_t top = ((uintptr_t)stack + size) & ~(uintptr_t)15;
  uint64_t *p = (uint64_t *)(top - 72);
  uint32_t mxcsr = 0x1f80;
  uint16_t fpcw = 0x037f;
  memset(p, 0, 72);
  memcpy(p, &mxcsr, 4);
  memcpy((char *)p + 4, &fpcw, 2);
  p[7] = (uint64_t)(uintptr_t)&xm_emu_fiber_entry; /* at top - 16 */
  p[8] = 0;                                         /* at top - 8 */
  return p;
}
#endif

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
  emu_stop();
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
  if (b->slots.size() < (size_t)n * 2 * XM_EMU_MAX_WORDS)
    b->slots.resize((size_t)n * 2 * XM_EMU_MAX_WORDS);
  for (int i = 0; i < n; i++) {
    Fiber &f = b->fibers[(size_t)i];
    f.t.tid = i;
    f.state = READY;
    f.gen = 0;
    f.exchanges = 0;
    f.stack = stack_for(i);
    b->warp_live[(size_t)(i / in.warp)]++;
#ifdef XM_EMU_ASM_SWITCH
    f.sp = fiber_stack_init(f.stack, kStack);
#else
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = kStack;
    f.ctx.uc_link = &b->sched;
    makecontext(&f.ctx, (void (*)(void))fiber_main, 2, 0, 0);
#endif
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
#ifdef XM_EMU_ASM_SWITCH
      xm_emu_switch(&b->sched_sp, f.sp);
#else
      swapcontext(&b->sched, &f.ctx);
#endif
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
    emu_stop();
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
    emu_stop();
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
  int lanes = b->info.threads - w * b->info.warp;
  if (lanes > b->info.warp) lanes = b->info.warp;
  if (b->warp_live[(size_t)w] != lanes) {
    /* A full-warp collective (the only kind xm_gpu.h has) with lanes that
     * have left the kernel: undefined on NVIDIA (__shfl_xor_sync with a
     * full mask), so a kernel error here too. */
    fprintf(stderr,
            "xmoec emulator: kernel %s, block (%lld,%lld,%lld): thread %d takes part in a warp "
            "collective after %d lane(s) of its warp returned\n",
            b->name, (long long)b->info.bx, (long long)b->info.by, (long long)b->info.bz,
            f->t.tid, lanes - b->warp_live[(size_t)w]);
    emu_stop();
  }
  if (++b->warp_arrived[(size_t)w] == b->warp_live[(size_t)w]) {
    release_warp(b, w);
    return;
  }
  f->state = AT_WARP;
  f->gen = b->warp_gen[(size_t)w];
  yield_to_sched(b, f);
  b->cur = f;
}

/* This thread's slot in the bank of its next exchange. */
static uint32_t *my_slot(Block *b, Fiber *f) {
  size_t bank = (size_t)(f->exchanges++ & 1u);
  return &b->slots[((size_t)f->t.tid * 2 + bank) * XM_EMU_MAX_WORDS];
}

static const uint32_t *lane_slot(const Block *b, int tid, const uint32_t *mine, const Fiber *f) {
  (void)f;
  size_t bank = (size_t)((mine - b->slots.data()) / XM_EMU_MAX_WORDS) & 1u;
  return &b->slots[((size_t)tid * 2 + bank) * XM_EMU_MAX_WORDS];
}

void xm_emu_warp_exchange(const uint32_t *mine, int words, uint32_t *all) {
  Block *b = t_block;
  Fiber *f = b->cur;
  if (words < 0 || words > XM_EMU_MAX_WORDS) {
    fprintf(stderr, "xmoec emulator: kernel %s: a warp exchange of %d words (at most %d)\n",
            b->name, words, XM_EMU_MAX_WORDS);
    emu_stop();
  }
  int tid = f->t.tid, W = b->info.warp, first = tid / W * W;
  uint32_t *slot = my_slot(b, f);
  memcpy(slot, mine, sizeof(uint32_t) * (size_t)words);
  warp_barrier(b, f);
  for (int l = 0; l < W; l++) {
    int t = first + l;
    if (t < b->info.threads) {
      memcpy(all + l * words, lane_slot(b, t, slot, f), sizeof(uint32_t) * (size_t)words);
    } else {
      for (int w = 0; w < words; w++) all[l * words + w] = 0u;
    }
  }
}

uint32_t xm_emu_shfl(uint32_t v, int src) {
  Block *b = t_block;
  Fiber *f = b->cur;
  int tid = f->t.tid, W = b->info.warp, first = tid / W * W;
  uint32_t *slot = my_slot(b, f);
  slot[0] = v;
  warp_barrier(b, f);
  int t = first + ((src % W) + W) % W;
  return t < b->info.threads ? lane_slot(b, t, slot, f)[0] : 0u;
}

xm_emu_stats_t xm_emu_stats(void) {
  xm_emu_stats_t s;
  s.launches = g_launches.load();
  s.blocks = g_blocks.load();
  s.switches = g_switches.load();
  return s;
}
