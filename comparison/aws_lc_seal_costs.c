/*
 * What a seal costs inside AWS-LC, in thread CPU time (so that other
 * processes on the cores count less than in wall time): the 12-byte random
 * nonce alone (RAND_bytes, as AES-256-GCM's random-nonce AEAD draws it on
 * every seal), the same bytes drawn 16 nonces at a time, and a 1 KB seal
 * with 200 bytes of associated data with a random nonce (what the crate
 * calls) and with a nonce given. BENCHMARKS.md, "Encryption and KMS".
 *
 * Built against the aws-lc-sys that a release build of the crate compiled:
 *
 *   OUT=$(dirname $(find target/server-bench/release/build -name 'libaws_lc_*_crypto.a' | head -1))
 *   PREFIX=$(basename $OUT/libaws_lc_*_crypto.a | sed 's/^lib//; s/_crypto.a$//')
 *   cc -O2 -DBORINGSSL_PREFIX=$PREFIX -I$OUT/include comparison/aws_lc_seal_costs.c \
 *     $OUT/libaws_lc_*_crypto.a -lpthread -o target/aws_lc_seal_costs
 *   target/aws_lc_seal_costs
 */
#include <openssl/boringssl_prefix_symbols.h>
#include <openssl/aead.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <time.h>

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(void) {
  unsigned char key[32] = {7}, buf[1024 + 192], nonce[12], tag[64], aad[200] = {1};
  size_t tag_len;
  const int n = 200000;
  EVP_AEAD_CTX *random = EVP_AEAD_CTX_new(EVP_aead_aes_256_gcm_randnonce(), key, 32, 16);
  EVP_AEAD_CTX *given = EVP_AEAD_CTX_new(EVP_aead_aes_256_gcm(), key, 32, 16);
  RAND_bytes(nonce, sizeof nonce); /* the one-time seeding, not counted */
  for (int round = 1; round <= 3; round++) {
    double a = now_ns();
    for (int i = 0; i < n; i++) RAND_bytes(nonce, sizeof nonce);
    double b = now_ns();
    for (int i = 0; i < n / 16; i++) RAND_bytes(buf, 16 * sizeof nonce);
    double c = now_ns();
    for (int i = 0; i < n; i++)
      EVP_AEAD_CTX_seal_scatter(random, buf, tag, &tag_len, sizeof tag, NULL, 0, buf, 1024, NULL, 0, aad, sizeof aad);
    double d = now_ns();
    for (int i = 0; i < n; i++)
      EVP_AEAD_CTX_seal_scatter(given, buf, tag, &tag_len, sizeof tag, nonce, sizeof nonce, buf, 1024, NULL, 0, aad, sizeof aad);
    double e = now_ns();
    printf("round %d: nonce %.0f ns, nonce drawn 16 at a time %.0f ns, seal 1 KB random nonce %.0f ns, nonce given %.0f ns\n",
           round, (b - a) / n, (c - b) / n, (d - c) / n, (e - d) / n);
  }
  return 0;
}
