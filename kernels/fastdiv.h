/* SPDX-License-Identifier: MIT */
/* fastdiv.h - division by a runtime divisor fixed for a whole step (the
 * page size) as a multiply-high, an add and a shift: the KV loaders divide
 * every position they gather by the page size, and an integer division is
 * some twenty instructions on the GPU. Round-up method (Granlund and
 * Montgomery): for d >= 1, s = ceil(log2 d), mul = floor(2^32 (2^s - d) / d)
 * + 1, then n / d = (mulhi(n, mul) + n) >> s for every 0 <= n < 2^31. */
#ifndef PMLA_FASTDIV_H
#define PMLA_FASTDIV_H

#include <stdint.h>

#include "hd.h"

typedef struct pmla_fastdiv {
  uint32_t d, mul, shift;
} pmla_fastdiv;

/* d >= 1 (a divisor of 0 is taken as 1) */
PMLA_HD static inline pmla_fastdiv pmla_fastdiv_make(uint32_t d) {
  pmla_fastdiv f;
  f.d = d ? d : 1;
  f.shift = 0;
  while ((1ull << f.shift) < f.d)
    f.shift++;
  f.mul = (uint32_t)(((1ull << 32) * ((1ull << f.shift) - f.d)) / f.d + 1);
  return f;
}

/* n / d for 0 <= n < 2^31 */
PMLA_HD static inline uint32_t pmla_fastdiv_q(pmla_fastdiv f, uint32_t n) {
  const uint32_t hi = (uint32_t)(((uint64_t)n * f.mul) >> 32);
  return (hi + n) >> f.shift;
}

/* n % d for 0 <= n < 2^31 */
PMLA_HD static inline uint32_t pmla_fastdiv_r(pmla_fastdiv f, uint32_t n) {
  return n - pmla_fastdiv_q(f, n) * f.d;
}

#endif
