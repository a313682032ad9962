/* runtime/io/rng.h — the runtime's random numbers: xoshiro256** streams.
 *
 * Every random quantity of a training run comes from a named stream whose
 * seed is derived from (run seed, name), never from a shared sequence, so
 * that a value does not depend on the order in which things are drawn nor on
 * how tensors are laid out over ranks: parameter `model.layers.3.mlp.experts.
 * 17.up_proj.weight` gets the same numbers whether expert 17 lives on rank 0
 * or rank 5. The state is four 64-bit words and is what checkpoints store
 * (xm_rt_train_state_t.rng). Normal samples use Box-Muller on 53-bit
 * uniforms; fills consume the stream in pairs, so a fill of n values is a
 * pure function of the seed and n.
 */
#ifndef XM_RUNTIME_RNG_H
#define XM_RUNTIME_RNG_H

#include <stdint.h>

typedef struct {
  uint64_t s[4];
} xm_rt_rng_t;

/* Seeds the state from one 64-bit value through splitmix64 (the seeding
 * xoshiro's authors recommend; never yields the all-zero state). */
void xm_rt_rng_seed(xm_rt_rng_t *r, uint64_t seed);
/* Seeds the stream of `name` under the run seed: a 64-bit FNV-1a hash of the
 * name mixed with the seed. */
void xm_rt_rng_seed_named(xm_rt_rng_t *r, uint64_t seed, const char *name);

uint64_t xm_rt_rng_next(xm_rt_rng_t *r);
/* Uniform double in [0, 1) with 53 random bits. */
double xm_rt_rng_uniform(xm_rt_rng_t *r);
/* One standard normal sample (draws two uniforms, keeps one value). */
double xm_rt_rng_normal(xm_rt_rng_t *r);
/* y[i] = mean + std * N(0,1), i < n; consumes ceil(n/2) pairs. */
void xm_rt_rng_fill_normal(xm_rt_rng_t *r, float *y, int64_t n, double mean, double std);

/* 64-bit FNV-1a of a NUL-terminated string. */
uint64_t xm_rt_hash_name(const char *name);

#endif /* XM_RUNTIME_RNG_H */
