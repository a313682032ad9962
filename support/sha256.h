/* support/sha256.h — SHA-256 (FIPS 180-4), for the manifests that name the
 * inputs a generated program came from.
 *
 * Streaming interface (init, update any number of times, final) plus a
 * one-call helper for a file. No allocation; the context is a plain value
 * the caller owns.
 */
#ifndef XM_SUPPORT_SHA256_H
#define XM_SUPPORT_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  uint32_t h[8];
  uint64_t total;     /* bytes hashed so far */
  uint8_t block[64];  /* pending partial block */
  size_t fill;        /* bytes in block */
} xm_sha256_t;

void xm_sha256_init(xm_sha256_t *c);
void xm_sha256_update(xm_sha256_t *c, const void *data, size_t len);
/* Writes the 32-byte digest; the context must be re-initialised to reuse. */
void xm_sha256_final(xm_sha256_t *c, uint8_t out_digest[32]);
/* Lowercase hex of the digest of `data` (65 bytes with the NUL). */
void xm_sha256_hex(const void *data, size_t len, char out_hex[65]);

#endif /* XM_SUPPORT_SHA256_H */
