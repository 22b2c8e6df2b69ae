/* SPDX-License-Identifier: MIT */
/* fastdiv.h - division by a runtime divisor fixed for a whole step (the
 * page size, a unit's share in the metadata kernel's fill walk) as a
 * multiply-high, an add and a shift: the KV loaders divide every position
 * they gather by the page size, and an integer division is some twenty
 * instructions on the GPU. Round-up method (Granlund and
 * Montgomery): for d >= 1, s = ceil(log2 d), mul = floor(2^32 (2^s - d) / d)
 * + 1, then n / d = (mulhi(n, mul) + n) >> s for every 0 <= n < 2^31. */
#ifndef PMLA_FASTDIV_H
#define PMLA_FASTDIV_H

#include <stdint.h>

#include "hd.h"

typedef struct pmla_fastdiv {
  uint32_t d, mul, shift;
} pmla_fastdiv;

/* leading zero bits of x != 0 */
PMLA_HD static inline int pmla_clz32(uint32_t x) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __clz((int)x);
#else
  return __builtin_clz(x);
#endif
}

/* d >= 1 (a divisor of 0 is taken as 1). The metadata kernel makes one per
 * step, so no loop and no 64-bit division (a called software routine on
 * NVIDIA GPUs): the shift by a count of leading zeros, the quotient of mul
 * through a double-precision reciprocal (within one of the true quotient,
 * which is below 2^32; the numerator is exact as a double) and one
 * correction. */
PMLA_HD static inline pmla_fastdiv pmla_fastdiv_make(uint32_t d) {
  pmla_fastdiv f;
  f.d = d ? d : 1;
  f.shift = f.d > 1 ? (uint32_t)(32 - pmla_clz32(f.d - 1)) : 0;
  const uint64_t num = ((1ull << f.shift) - f.d) << 32;
  uint64_t q = (uint64_t)((double)num * (1.0 / (double)f.d));
  const int64_t r = (int64_t)(num - q * f.d);
  q = r < 0 ? q - 1 : r >= (int64_t)f.d ? q + 1 : q;
  f.mul = (uint32_t)(q + 1);
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
