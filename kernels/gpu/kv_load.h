/* SPDX-License-Identifier: MIT */
/* kv_load.h - FP8 KV rows into the bf16 shared-memory tiles both decode
 * bodies read, in two steps so the global loads can be issued a block ahead
 * and their latency hidden behind the current block's math:
 *   issue  a loader thread's 16-byte pieces of one row into registers
 *   store  converted to bf16 into the row's 16-byte chunks of the tile
 * A row is read in UNITS pieces of 16 source bytes; TPT threads share a row,
 * thread `sub` taking pieces sub, sub + TPT, ...:
 *   E4M3    36 pieces of 16 e4m3 (-> two bf16 chunks each), unscaled: the
 *           cache's one scale is folded into the softmax scale and the
 *           output by the bodies (exact: every e4m3 value is a bf16 value)
 *   DS_MLA  32 latent pieces of 16 e4m3 times their tile's scale (pieces
 *           8t .. 8t + 7 are tile t), then 8 rope pieces of 8 bf16, copied
 * A row that is not read (invalid slot, past the item) stores zeros, as the
 * bf16 path's zero-filled cp.async does. */
#ifndef PMLA_GPU_KV_LOAD_H
#define PMLA_GPU_KV_LOAD_H

#include <stdint.h>

#include "hip_compat.h"
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

/* 4 e4m3 values (one word, the first value in the lowest byte) as floats */
__device__ __forceinline__ void e4m3x4_to_f32(uint32_t w, float (&f)[4]) {
#if defined(PMLA_PLATFORM_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t h[2];
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h[0]) : "h"((uint16_t)(w & 0xffffu)));
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h[1]) : "h"((uint16_t)(w >> 16)));
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

/* One loader thread's share of one FP8 row. */
template <int F, int TPT> struct RowLoad {
  static constexpr int N = KvFmt<F>::UNITS / TPT;
  static_assert(KvFmt<F>::UNITS % TPT == 0, "pieces per loader thread");
  uint4 raw[N];
  uint4 scales; /* DS_MLA: the row's four tile scales */

  __device__ __forceinline__ void issue(const char *row, bool valid, int sub) {
    const uint4 z = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int k = 0; k < N; k++) {
      const int u = sub + k * TPT;
      const int src = u < KvFmt<F>::LATENT_UNITS ? u * 16 : PMLA_DS_MLA_ROPE + (u - 32) * 16;
      raw[k] = valid ? ldg16(row + src) : z;
    }
    if (F == PMLA_KV_DS_MLA)
      scales = valid ? ldg16(row + PMLA_DS_MLA_SCALES) : z;
  }

  /* chunk(c): the shared-memory address of bf16 chunk c (0..71) of the row */
  template <typename Chunk> __device__ __forceinline__ void store(int sub, Chunk chunk) const {
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
        e4m3x16_to_bf16(raw[k], s, lo, hi);
        *(uint4 *)chunk(2 * u) = lo;
        *(uint4 *)chunk(2 * u + 1) = hi;
      } else {
        *(uint4 *)chunk(64 + (u - 32)) = raw[k];
      }
    }
  }
};

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
