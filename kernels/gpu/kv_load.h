/* SPDX-License-Identifier: MIT */
/* kv_load.h - FP8 KV rows into the 16-bit shared-memory tiles both decode
 * bodies read (bf16, or f16 for an E4M3 cache on NVIDIA), in two steps so
 * the global loads are issued ahead of the block that needs them:
 *   issue / copy_async + load_raw
 *          a thread's 16-byte pieces of one row into registers (mma.sync
 *          body), or by cp.async into a raw shared-memory row and from
 *          there into registers when the block's turn comes (sm_90a)
 *   store  converted into the row's 16-byte chunks of the tile
 * A row is read in UNITS pieces of 16 source bytes; TPT threads share a row,
 * thread `sub` taking pieces sub, sub + TPT, ...:
 *   E4M3    36 pieces of 16 e4m3 (-> two 16-bit chunks each), unscaled: the
 *           cache's one scale is folded into the softmax scale and the
 *           output by the bodies (exact: every e4m3 value is a bf16 and
 *           an f16 value)
 *   DS_MLA  32 latent pieces of 16 e4m3 times their tile's scale (pieces
 *           8t .. 8t + 7 are tile t), then 8 rope pieces of 8 bf16, copied
 * A row that is not read (invalid slot, past the item) stores zeros, as the
 * bf16 path's zero-filled cp.async does. */
#ifndef PMLA_GPU_KV_LOAD_H
#define PMLA_GPU_KV_LOAD_H

#include <stdint.h>

#include "hip_compat.h"
#include "kv_map.h"
#include "mla_gpu.h"
#include "mla_types.h"
#include "mma.h"

namespace pmla_kv {

template <int F> struct KvFmt {
  static constexpr int ROW_BYTES = F == PMLA_KV_E4M3 ? 576 : F == PMLA_KV_DS_MLA ? 656 : 1152;
  static constexpr int UNITS = F == PMLA_KV_DS_MLA ? 40 : 36;
  static constexpr int LATENT_UNITS = F == PMLA_KV_DS_MLA ? 32 : 36;
};

/* 16 bytes from global memory through the read-only path */
__device__ __forceinline__ uint4 ldg16(const char *p) {
  return __ldg((const uint4 *)p);
}

#if defined(PMLA_PLATFORM_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
/* the two e4m3 values in the low 16 bits of v (the first in the low byte)
 * as f16x2, exactly: one instruction */
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t v) {
  uint32_t r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"((uint16_t)(v & 0xffffu)));
  return r;
}
/* the same for the high 16 bits of v, read as the register's upper half
 * (no shift) */
__device__ __forceinline__ uint32_t e4m3x2_hi_to_f16x2(uint32_t v) {
  uint32_t r;
  asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, hi;\n}\n"
      : "=r"(r)
      : "r"(v));
  return r;
}
#endif

/* 4 e4m3 values (one word, the first value in the lowest byte) as floats */
__device__ __forceinline__ void e4m3x4_to_f32(uint32_t w, float (&f)[4]) {
#if defined(PMLA_PLATFORM_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const uint32_t h[2] = {e4m3x2_to_f16x2(w), e4m3x2_hi_to_f16x2(w)};
#pragma unroll
  for (int i = 0; i < 2; i++) {
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(f[2 * i]) : "h"((uint16_t)(h[i] & 0xffffu)));
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(f[2 * i + 1]) : "h"((uint16_t)(h[i] >> 16)));
  }
#else
  /* bias 7 -> 127; subnormals m * 2^-9; S.1111.111 is NaN */
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const uint32_t b = (w >> (8 * i)) & 0xffu, e = (b >> 3) & 15u, m = b & 7u;
    float v = e ? __uint_as_float(((e + 120u) << 23) | (m << 20)) : (float)m * 0x1p-9f;
    if ((b & 0x7fu) == 0x7fu)
      v = __uint_as_float(0x7fc00000u);
    f[i] = (b & 0x80u) ? -v : v;
  }
#endif
}

/* 16 e4m3 times s as two 16-byte bf16 chunks (s == 1 for E4M3, whose
 * scale is applied elsewhere; the products of DS_MLA's tile scales round
 * once, to bf16). The hardware conversions measured faster than building
 * the bf16 bits with integer operations (docs/performance.md). */
__device__ __forceinline__ void e4m3x16_to_bf16(const uint4 &raw, float s, uint4 &lo, uint4 &hi) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    float f[4];
    e4m3x4_to_f32(w[i], f);
    o[2 * i] = pmla_mma::pack_bf16x2(f[0] * s, f[1] * s);
    o[2 * i + 1] = pmla_mma::pack_bf16x2(f[2] * s, f[3] * s);
  }
  lo = make_uint4(o[0], o[1], o[2], o[3]);
  hi = make_uint4(o[4], o[5], o[6], o[7]);
}

/* 16 e4m3 as two 16-byte f16 chunks, exactly (every e4m3 value is a
 * normal f16 value): one conversion per pair where the bf16 chunks above
 * take four instructions. The sm_90a body's E4M3 tiles are f16. */
__device__ __forceinline__ void e4m3x16_to_f16(const uint4 &raw, uint4 &lo, uint4 &hi) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 4; i++) {
#if defined(PMLA_PLATFORM_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    o[2 * i] = e4m3x2_to_f16x2(w[i]);
    o[2 * i + 1] = e4m3x2_hi_to_f16x2(w[i]);
#else
    float f[4]; /* each exactly an f16 value: the packing does not round */
    e4m3x4_to_f32(w[i], f);
    o[2 * i] = pmla_mma::pack_f16x2(f[0], f[1]);
    o[2 * i + 1] = pmla_mma::pack_f16x2(f[2], f[3]);
#endif
  }
  lo = make_uint4(o[0], o[1], o[2], o[3]);
  hi = make_uint4(o[4], o[5], o[6], o[7]);
}

/* One loader thread's share of one FP8 row. */
template <int F, int TPT> struct RowLoad {
  static constexpr int N = KvFmt<F>::UNITS / TPT;
  static_assert(KvFmt<F>::UNITS % TPT == 0, "pieces per loader thread");
  uint4 raw[N];
  uint4 scales; /* DS_MLA: the row's four tile scales */

  /* byte offset of piece u in a row */
  static __device__ __forceinline__ int piece(int u) {
    return u < KvFmt<F>::LATENT_UNITS ? u * 16 : PMLA_DS_MLA_ROPE + (u - 32) * 16;
  }
  /* the thread's pieces of a row as stored (DS_MLA: and its scales, from
   * thread 0 of the row) by cp.async into a raw stage's row, zero-filled
   * when !valid; load_raw then takes a share of them from there */
  static __device__ __forceinline__ void copy_async(char *dst, const char *row, bool valid,
                                                    int sub) {
#pragma unroll
    for (int k = 0; k < N; k++) {
      const int o = piece(sub + k * TPT);
      cp16(dst + o, valid ? row + o : row, valid);
    }
    if (F == PMLA_KV_DS_MLA && sub == 0)
      cp16(dst + PMLA_DS_MLA_SCALES, valid ? row + PMLA_DS_MLA_SCALES : row, valid);
  }
  __device__ __forceinline__ void load_raw(const char *row, int sub) {
#pragma unroll
    for (int k = 0; k < N; k++)
      raw[k] = *(const uint4 *)(row + piece(sub + k * TPT));
    if (F == PMLA_KV_DS_MLA)
      scales = *(const uint4 *)(row + PMLA_DS_MLA_SCALES);
  }
  __device__ __forceinline__ void issue(const char *row, bool valid, int sub) {
    const uint4 z = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int k = 0; k < N; k++)
      raw[k] = valid ? ldg16(row + piece(sub + k * TPT)) : z;
    if (F == PMLA_KV_DS_MLA)
      scales = valid ? ldg16(row + PMLA_DS_MLA_SCALES) : z;
  }

  /* chunk(c): the shared-memory address of 16-bit chunk c (0..71) of the
   * row; F16: an E4M3 row as f16 rather than bf16 */
  template <bool F16 = false, typename Chunk>
  __device__ __forceinline__ void store(int sub, Chunk chunk) const {
    static_assert(!F16 || F == PMLA_KV_E4M3, "f16 tiles hold unscaled e4m3 only");
#pragma unroll
    for (int k = 0; k < N; k++) {
      const int u = sub + k * TPT;
      if (u < KvFmt<F>::LATENT_UNITS) {
        float s = 1.f;
        if (F == PMLA_KV_DS_MLA) {
          const uint32_t t = u >> 3;
          s = __uint_as_float(t == 0 ? scales.x : t == 1 ? scales.y : t == 2 ? scales.z
                                                                             : scales.w);
        }
        uint4 lo, hi;
        if (F16)
          e4m3x16_to_f16(raw[k], lo, hi);
        else
          e4m3x16_to_bf16(raw[k], s, lo, hi);
        *(uint4 *)chunk(2 * u) = lo;
        *(uint4 *)chunk(2 * u + 1) = hi;
      } else {
        *(uint4 *)chunk(64 + (u - 32)) = raw[k];
      }
    }
  }
};

/* amax with the magnitudes of 8 bf16 (bits) folded in */
__device__ __forceinline__ uint32_t bf16x8_amax(const uint4 &v, uint32_t amax) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const uint32_t a = w[i] & 0x7fff7fffu;
    amax = max(amax, max(a & 0xffffu, a >> 16));
  }
  return amax;
}
/* the exponent e of q_row_to_f16 (below) from the largest magnitude (bf16
 * bits) each of TPR consecutive lanes found in its part of the row */
template <int TPR> __device__ __forceinline__ int q_row_f16_exp(uint32_t amax) {
#pragma unroll
  for (int d = 1; d < TPR; d <<= 1)
#ifdef PMLA_PLATFORM_NVIDIA
    amax = max(amax, (uint32_t)__shfl_xor_sync(0xffffffffu, amax, d));
#else
    amax = max(amax, (uint32_t)__shfl_xor((int)amax, d));
#endif
  const int e = 14 - ((int)(amax >> 7) - 127); /* |value| < 2^(exponent + 1) */
  return e < -114 ? -114 : e > 64 ? 64 : e;
}
/* a bf16 pair (bits, the first in the low half) times f as f16x2 */
__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t w, float f) {
  return pmla_mma::pack_f16x2(__uint_as_float(w << 16) * f, __uint_as_float(w & 0xffff0000u) * f);
}

/* An E4M3 item's Q row, landed as bf16, rewritten in place as f16 for the
 * f16 tiles: times 2^e, e chosen from the row's largest magnitude so that
 * it lands in [2^14, 2^15) (below f16's maximum, and every value down to
 * 2^-28 of it stays normal, where bf16's 8 mantissa bits fit f16's 11
 * exactly). e is at least -114, which every finite bf16 row needs (and
 * inf / NaN stay inf / NaN), and at most 64: a row whose magnitudes all
 * lie below 2^-50 gives scores too small to move exp2 from 1 at any e
 * (uniform weights either way). TPR consecutive lanes share the row, lane
 * `sub` taking chunks sub, sub + TPR, ...; chunk(c) is the address of chunk
 * c (0..71). Returns 2^-e, by which the row's scores are multiplied back. */
template <int TPR, typename Chunk>
__device__ __forceinline__ float q_row_to_f16(int sub, Chunk chunk) {
  uint32_t amax = 0; /* the largest |value| as bf16 bits */
#pragma unroll 4
  for (int c = sub; c < PMLA_TILE_CHUNKS; c += TPR)
    amax = bf16x8_amax(*(const uint4 *)chunk(c), amax);
  const int e = q_row_f16_exp<TPR>(amax);
  const float f = __uint_as_float((uint32_t)(127 + e) << 23);
#pragma unroll 4
  for (int c = sub; c < PMLA_TILE_CHUNKS; c += TPR) {
    uint4 *p = (uint4 *)chunk(c);
    const uint4 v = *p;
    *p = make_uint4(bf16x2_to_f16x2(v.x, f), bf16x2_to_f16x2(v.y, f), bf16x2_to_f16x2(v.z, f),
                    bf16x2_to_f16x2(v.w, f));
  }
  return __uint_as_float((uint32_t)(127 - e) << 23);
}

/* The factor an item's output is multiplied by (the E4M3 cache scale, else
 * 1), and whether it is usable: a scale that is not finite and > 0 flags
 * PMLA_PLAN_ERR_KV_SCALE (once per launch) and the bodies attend nothing. */
template <int F>
__device__ __forceinline__ float kv_out_scale(const pmla_gpu_problem &p, bool &ok) {
  ok = true;
  if (F != PMLA_KV_E4M3)
    return 1.f;
  const float s = __ldg(p.kv_scale);
  ok = s > 0.f && s <= 3.402823466e38f; /* false for NaN too */
  if (!ok && threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0)
    atomicOr(p.work_meta_data + PMLA_META_ERROR, (int)PMLA_PLAN_ERR_KV_SCALE);
  return ok ? s : 0.f;
}

} /* namespace pmla_kv */
#endif
