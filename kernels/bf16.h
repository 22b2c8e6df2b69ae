/* SPDX-License-Identifier: MIT */
/* bf16.h - bfloat16 <-> float on the host, round to nearest even. */
#ifndef PMLA_BF16_H
#define PMLA_BF16_H

#include <stdint.h>
#include <string.h>

static inline float pmla_bf16_to_float(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static inline uint16_t pmla_float_to_bf16(float f) {
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) /* NaN stays NaN */
    return (uint16_t)((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}

#endif
