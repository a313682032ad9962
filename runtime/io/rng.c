/* runtime/io/rng.c — xoshiro256** (Blackman and Vigna), splitmix64 seeding,
 * Box-Muller normals.
 *
 * The generator is the reference algorithm written out from its published
 * description; it is small, fast, and has a 256-bit state that checkpoints
 * can store verbatim. Box-Muller is used rather than the Ziggurat because it
 * needs no tables and draws a fixed number of uniforms per sample, which
 * keeps a stream's position a simple function of how many values were drawn.
 */
#include "runtime/io/rng.h"

#include <math.h>

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void xm_rt_rng_seed(xm_rt_rng_t *r, uint64_t seed) {
  uint64_t x = seed;
  for (int i = 0; i < 4; i++)
    r->s[i] = splitmix64(&x);
}

uint64_t xm_rt_hash_name(const char *name) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
    h ^= *p;
    h *= 0x100000001b3ULL;
  }
  return h;
}

void xm_rt_rng_seed_named(xm_rt_rng_t *r, uint64_t seed, const char *name) {
  /* One splitmix round on the seed first, so that seeds 0 and 1 do not give
   * streams that differ only in the low bit of the combined value. */
  uint64_t s = seed;
  uint64_t mixed = splitmix64(&s) ^ xm_rt_hash_name(name);
  xm_rt_rng_seed(r, mixed);
}

uint64_t xm_rt_rng_next(xm_rt_rng_t *r) {
  uint64_t *s = r->s;
  uint64_t result = rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

double xm_rt_rng_uniform(xm_rt_rng_t *r) { return (double)(xm_rt_rng_next(r) >> 11) * 0x1.0p-53; }

/* Two independent standard normals from two uniforms; u1 is taken in (0, 1]
 * so that the logarithm is finite. */
static void normal_pair(xm_rt_rng_t *r, double *a, double *b) {
  double u1 = ((double)(xm_rt_rng_next(r) >> 11) + 1.0) * 0x1.0p-53;
  double u2 = xm_rt_rng_uniform(r);
  double rad = sqrt(-2.0 * log(u1));
  double ang = 2.0 * M_PI * u2;
  *a = rad * cos(ang);
  *b = rad * sin(ang);
}

double xm_rt_rng_normal(xm_rt_rng_t *r) {
  double a, b;
  normal_pair(r, &a, &b);
  return a;
}

void xm_rt_rng_fill_normal(xm_rt_rng_t *r, float *y, int64_t n, double mean, double std) {
  int64_t i = 0;
  for (; i + 1 < n; i += 2) {
    double a, b;
    normal_pair(r, &a, &b);
    y[i] = (float)(mean + std * a);
    y[i + 1] = (float)(mean + std * b);
  }
  if (i < n) y[i] = (float)(mean + std * xm_rt_rng_normal(r));
}
