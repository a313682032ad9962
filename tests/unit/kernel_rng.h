/* tests/unit/kernel_rng.h — the reproducible random inputs of the kernel
 * tests: a fixed xorshift stream, one per test program (each includes this
 * once), so a failing case reproduces exactly. */
#ifndef XM_TESTS_KERNEL_RNG_H
#define XM_TESTS_KERNEL_RNG_H

#include <stdint.h>

static uint64_t rng_state = 88172645463325252ull;

/* Uniform in [lo, hi). */
static float frand(float lo, float hi) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return lo + (hi - lo) * (float)((rng_state >> 11) * (1.0 / 9007199254740992.0));
}

#endif /* XM_TESTS_KERNEL_RNG_H */
