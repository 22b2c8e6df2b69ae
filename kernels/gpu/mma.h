/* SPDX-License-Identifier: MIT */
/* mma.h - the tensor-core tile interface of the decode kernel.
 *
 * One warp multiplies A (16 x 16, bf16, row-major in shared memory) by B
 * (16 x MMA_N, bf16) into an fp32 accumulator tile 16 x MMA_N held as ACC
 * floats per lane. Operands live in "swizzled row tiles": rows of
 * PMLA_TILE_CHUNKS 16-byte chunks (1152 bytes: one 576-dim bf16 KV or Q
 * row), chunk c of row r stored at chunk c ^ (r & 7), so eight rows read at
 * one chunk column hit eight different bank groups (ldmatrix conflict-free).
 *
 *   ld_a(a, tile, row0, chunk0)          A rows row0.., k = chunks chunk0, +1
 *   ld_b_nk(b, tile, n0, chunk0)         B stored [n][k] (K rows: QK^T)
 *   ld_b_kn(b, tile, k0, chunk0)         B stored [k][n] (V rows: PV)
 *   ld_b_nk2 / ld_b_kn2                  two adjacent n-tiles at once
 *   mma(c, a, b)                         c += a * b
 *   acc_row(lane, e), acc_col(lane, e)   where accumulator element e lives
 *   ROWSLOTS, slot_of(e)                 distinct rows a lane holds
 *   row_max / row_sum                    reduce over the lanes sharing a row
 *
 * Implementations (same interface, picked at compile time):
 *   NVIDIA sm_80+: ldmatrix + mma.sync.m16n8k16 bf16 (inline PTX), MMA_N 8.
 *   AMD gfx90a / gfx94x: v_mfma_f32_16x16x16bf16_1k (wave64), MMA_N 16.
 *   Portable scalar fallback (PMLA_MMA_SCALAR, or any other target): plain
 *   shared-memory loads and FMAs with the platform's tile shape.
 */
#ifndef PMLA_GPU_MMA_H
#define PMLA_GPU_MMA_H

#include <stdint.h>

#include "hip_compat.h"
#include "fold.h"

#define PMLA_TILE_CHUNKS 72 /* 16-byte chunks per row: 576 bf16 */
#define PMLA_TILE_PITCH (PMLA_TILE_CHUNKS * 16)

/* Platform tile shape: fixed per platform (host and device passes agree). */
#ifdef PMLA_PLATFORM_NVIDIA
#define PMLA_WARP 32
#define PMLA_MMA_N 8
#else
#define PMLA_WARP 64 /* CDNA wave64 (gfx90a, gfx94x) */
#define PMLA_MMA_N 16
#endif

#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#if !defined(PMLA_MMA_SCALAR)
#if defined(PMLA_PLATFORM_NVIDIA) && __CUDA_ARCH__ >= 800
#define PMLA_MMA_NV 1
#elif defined(PMLA_PLATFORM_AMD) &&                                                          \
    (defined(__gfx90a__) || defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__))
#define PMLA_MMA_MFMA 1
#endif
#endif
#endif

namespace pmla_mma {

constexpr int WARP = PMLA_WARP;
constexpr int MMA_N = PMLA_MMA_N;
constexpr int ACC = 16 * MMA_N / WARP;
/* softmax runs in base 2: scores are scaled by log2(e), lse converted back */
constexpr float LOG2E_F = PMLA_LOG2E;
constexpr float LN2_F = 0.6931471805599453f;

/* byte offset of chunk c of row r in a swizzled row tile */
__device__ __forceinline__ uint32_t tile_off(int r, int c) {
  return (uint32_t)(r * PMLA_TILE_PITCH + ((c ^ (r & 7)) << 4));
}
/* byte offset of element (r, col) where col counts bf16 from chunk c0 */
__device__ __forceinline__ uint32_t elem_off(int r, int c0, int col) {
  return tile_off(r, c0 + (col >> 3)) + ((col & 7) << 1);
}

__device__ __forceinline__ float bf16_to_f(uint16_t h) {
  union {
    uint32_t u;
    float f;
  } x;
  x.u = (uint32_t)h << 16;
  return x.f;
}
/* round to nearest even; NaN stays NaN */
__device__ __forceinline__ uint16_t f_to_bf16(float f) {
  union {
    uint32_t u;
    float f;
  } x;
  x.f = f;
  if ((x.u & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)((x.u >> 16) | 0x40);
  return (uint16_t)((x.u + 0x7fffu + ((x.u >> 16) & 1)) >> 16);
}

/* (lo, hi) as packed bf16, round to nearest even, NaN stays NaN: one
 * cvt on sm_80+ where the integer rounding above costs ~8 instructions per
 * value (measured: a third of the softmax in the wgmma body) */
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
#if defined(PMLA_PLATFORM_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return (uint32_t)f_to_bf16(lo) | ((uint32_t)f_to_bf16(hi) << 16);
#endif
}
/* f16 bits of f, round to nearest even; NaN stays NaN */
__device__ __forceinline__ uint16_t f_to_f16(float f) {
  const uint32_t u = __float_as_uint(f), sgn = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u)
    return (uint16_t)(sgn | 0x7e00u);
  if (a >= 0x477ff000u) /* 65520 and above round to inf */
    return (uint16_t)(sgn | 0x7c00u);
  if (a < 0x38800000u) /* below 2^-14: a multiple of 2^-24 */
    return (uint16_t)(sgn | (uint32_t)rintf(__uint_as_float(a) * 16777216.f));
  return (uint16_t)(sgn | (((a + 0xfffu + ((a >> 13) & 1u)) >> 13) - (112u << 10)));
}
/* (lo, hi) as packed f16, round to nearest even (the f16 tiles' P, and
 * their Q: values that fit f16's range) */
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
#if defined(PMLA_PLATFORM_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return (uint32_t)f_to_f16(lo) | ((uint32_t)f_to_f16(hi) << 16);
#endif
}
/* 2^x for the softmax: one MUFU.EX2 on NVIDIA (exp2f adds a range check
 * and a rescale for results below 2^-126, which flush to 0 here: they are
 * probabilities next to a row maximum of 1) */
__device__ __forceinline__ float fast_exp2(float x) {
#if defined(PMLA_PLATFORM_NVIDIA) && defined(__CUDA_ARCH__)
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
#else
  return exp2f(x);
#endif
}

struct Acc {
  float x[ACC];
};
__device__ __forceinline__ void acc_zero(Acc &c) {
#pragma unroll
  for (int e = 0; e < ACC; e++)
    c.x[e] = 0.f;
}

#if defined(PMLA_MMA_NV)
/* ------------------------------------------------------------ NVIDIA */
constexpr int ROWSLOTS = 2;
constexpr bool PAIRED = true; /* elements 2s, 2s+1: same row, adjacent cols */
struct FragA {
  uint32_t r[4];
};
struct FragB {
  uint32_t r[2];
};
__device__ __forceinline__ int slot_of(int e) { return e >> 1; }
__device__ __forceinline__ int acc_row(int lane, int e) { return (lane >> 2) + ((e >> 1) << 3); }
__device__ __forceinline__ int acc_col(int lane, int e) { return ((lane & 3) << 1) + (e & 1); }
__device__ __forceinline__ int slot_row(int lane, int s) { return (lane >> 2) + (s << 3); }
__device__ __forceinline__ bool row_leader(int lane) { return (lane & 3) == 0; }
__device__ __forceinline__ float row_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float row_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ __forceinline__ uint32_t smem_u32(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t &a, uint32_t &b, uint32_t &c,
                                        uint32_t &d) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t &a, uint32_t &b, uint32_t &c,
                                          uint32_t &d) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2(uint32_t addr, uint32_t &a, uint32_t &b) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(a), "=r"(b)
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2_t(uint32_t addr, uint32_t &a, uint32_t &b) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(a), "=r"(b)
               : "r"(addr));
}
__device__ __forceinline__ int lane_id() { return threadIdx.x & 31; }

__device__ __forceinline__ void ld_a(FragA &a, const char *tile, int row0, int chunk0) {
  int l = lane_id();
  ldsm_x4(smem_u32(tile + tile_off(row0 + (l & 15), chunk0 + (l >> 4))), a.r[0], a.r[1], a.r[2],
          a.r[3]);
}
__device__ __forceinline__ void ld_b_nk(FragB &b, const char *tile, int n0, int chunk0) {
  int l = lane_id() & 15;
  ldsm_x2(smem_u32(tile + tile_off(n0 + (l & 7), chunk0 + (l >> 3))), b.r[0], b.r[1]);
}
/* n-tiles n0 and n0 + 8 */
__device__ __forceinline__ void ld_b_nk2(FragB &b0, FragB &b1, const char *tile, int n0,
                                         int chunk0) {
  int l = lane_id();
  ldsm_x4(smem_u32(tile + tile_off(n0 + (l & 7) + ((l >> 4) << 3), chunk0 + ((l >> 3) & 1))),
          b0.r[0], b0.r[1], b1.r[0], b1.r[1]);
}
/* one n-tile, k-steps chunk0 and chunk0 + 2 */
__device__ __forceinline__ void ld_b_nk_k2(FragB &b0, FragB &b1, const char *tile, int n0,
                                           int chunk0) {
  int l = lane_id();
  ldsm_x4(smem_u32(tile + tile_off(n0 + (l & 7), chunk0 + (l >> 3))), b0.r[0], b0.r[1], b1.r[0],
          b1.r[1]);
}
__device__ __forceinline__ void ld_b_kn(FragB &b, const char *tile, int k0, int chunk0) {
  int l = lane_id() & 15;
  ldsm_x2_t(smem_u32(tile + tile_off(k0 + l, chunk0)), b.r[0], b.r[1]);
}
/* n-tiles chunk0 and chunk0 + 1 (8 columns each) */
__device__ __forceinline__ void ld_b_kn2(FragB &b0, FragB &b1, const char *tile, int k0,
                                         int chunk0) {
  int l = lane_id();
  ldsm_x4_t(smem_u32(tile + tile_off(k0 + (l & 15), chunk0 + (l >> 4))), b0.r[0], b0.r[1],
            b1.r[0], b1.r[1]);
}
/* F16: the fragments hold f16 (an E4M3 cache's tiles, kv_load.h) */
constexpr bool F16_TILES = true;
template <bool F16 = false> __device__ __forceinline__ void mma(Acc &c, const FragA &a, const FragB &b) {
  if (F16)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c.x[0]), "+f"(c.x[1]), "+f"(c.x[2]), "+f"(c.x[3])
                 : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c.x[0]), "+f"(c.x[1]), "+f"(c.x[2]), "+f"(c.x[3])
                 : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
}

#elif defined(PMLA_MMA_MFMA)
/* ------------------------------------------------------- AMD CDNA MFMA */
/* v_mfma_f32_16x16x16bf16_1k, wave64: A lane l = row l%16, k 4*(l/16)..+3;
 * B lane l = col l%16, same k; D lane l = col l%16, rows 4*(l/16)..+3. */
typedef short pmla_short4 __attribute__((ext_vector_type(4)));
typedef float pmla_float4 __attribute__((ext_vector_type(4)));
constexpr int ROWSLOTS = 4;
constexpr bool PAIRED = false;
struct FragA {
  pmla_short4 v;
};
struct FragB {
  pmla_short4 v;
};
__device__ __forceinline__ int lane_id() { return threadIdx.x & 63; }
__device__ __forceinline__ int slot_of(int e) { return e; }
__device__ __forceinline__ int acc_row(int lane, int e) { return ((lane >> 4) << 2) + e; }
__device__ __forceinline__ int acc_col(int lane, int e) { return lane & 15; }
__device__ __forceinline__ int slot_row(int lane, int s) { return ((lane >> 4) << 2) + s; }
__device__ __forceinline__ bool row_leader(int lane) { return (lane & 15) == 0; }
__device__ __forceinline__ float row_max(float v) {
  for (int o = 1; o < 16; o <<= 1)
    v = fmaxf(v, __shfl_xor(v, o));
  return v;
}
__device__ __forceinline__ float row_sum(float v) {
  for (int o = 1; o < 16; o <<= 1)
    v += __shfl_xor(v, o);
  return v;
}
/* 4 consecutive bf16 along k of row r, k offset (in elements) from chunk0 */
__device__ __forceinline__ pmla_short4 ld4(const char *tile, int r, int chunk0, int k) {
  return *(const pmla_short4 *)(tile + elem_off(r, chunk0, k));
}
__device__ __forceinline__ void ld_a(FragA &a, const char *tile, int row0, int chunk0) {
  int l = lane_id();
  a.v = ld4(tile, row0 + (l & 15), chunk0, (l >> 4) << 2);
}
__device__ __forceinline__ void ld_b_nk(FragB &b, const char *tile, int n0, int chunk0) {
  int l = lane_id();
  b.v = ld4(tile, n0 + (l & 15), chunk0, (l >> 4) << 2);
}
__device__ __forceinline__ void ld_b_nk2(FragB &b0, FragB &b1, const char *tile, int n0,
                                         int chunk0) {
  ld_b_nk(b0, tile, n0, chunk0);
  ld_b_nk(b1, tile, n0 + 16, chunk0);
}
__device__ __forceinline__ void ld_b_nk_k2(FragB &b0, FragB &b1, const char *tile, int n0,
                                           int chunk0) {
  ld_b_nk(b0, tile, n0, chunk0);
  ld_b_nk(b1, tile, n0, chunk0 + 2);
}
__device__ __forceinline__ void ld_b_kn(FragB &b, const char *tile, int k0, int chunk0) {
  int l = lane_id(), kk = k0 + ((l >> 4) << 2);
  const uint16_t *p;
  for (int i = 0; i < 4; i++) {
    p = (const uint16_t *)(tile + elem_off(kk + i, chunk0, l & 15));
    b.v[i] = (short)*p;
  }
}
__device__ __forceinline__ void ld_b_kn2(FragB &b0, FragB &b1, const char *tile, int k0,
                                         int chunk0) {
  ld_b_kn(b0, tile, k0, chunk0);
  ld_b_kn(b1, tile, k0, chunk0 + 2);
}
constexpr bool F16_TILES = false; /* bf16 tiles for every cache */
template <bool F16 = false> __device__ __forceinline__ void mma(Acc &c, const FragA &a, const FragB &b) {
  static_assert(!F16, "bf16 fragments only");
  pmla_float4 d = {c.x[0], c.x[1], c.x[2], c.x[3]};
  d = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a.v, b.v, d, 0, 0, 0);
  c.x[0] = d[0];
  c.x[1] = d[1];
  c.x[2] = d[2];
  c.x[3] = d[3];
}

#else
/* ----------------------------------------------------- scalar fallback */
/* Same tile shape as the platform; each lane computes its own elements by
 * plain loads. NVIDIA-style layout for MMA_N 8 (rows lane/4 and +8, cols
 * 2*(lane%4)..+1), MFMA-style for MMA_N 16 (col lane%16, rows grouped). */
constexpr int ROWSLOTS = MMA_N == 8 ? ACC / 2 : ACC;
constexpr bool PAIRED = MMA_N == 8;
struct FragA {
  const char *t;
  int r0, c0;
};
struct FragB {
  const char *t;
  int n0, c0, kn; /* kn: stored [k][n] */
};
__device__ __forceinline__ int lane_id() { return threadIdx.x % WARP; }
__device__ __forceinline__ int slot_of(int e) { return MMA_N == 8 ? e >> 1 : e; }
__device__ __forceinline__ int acc_row(int lane, int e) {
  return MMA_N == 8 ? (lane >> 2) + ((e >> 1) << 3) : (lane >> 4) * ACC + e;
}
__device__ __forceinline__ int acc_col(int lane, int e) {
  return MMA_N == 8 ? ((lane & 3) << 1) + (e & 1) : lane & 15;
}
__device__ __forceinline__ int slot_row(int lane, int s) {
  return MMA_N == 8 ? (lane >> 2) + (s << 3) : (lane >> 4) * ACC + s;
}
__device__ __forceinline__ bool row_leader(int lane) {
  return MMA_N == 8 ? (lane & 3) == 0 : (lane & 15) == 0;
}
__device__ __forceinline__ float shfl_xor_(float v, int o) {
#ifdef PMLA_PLATFORM_NVIDIA
  return __shfl_xor_sync(0xffffffffu, v, o);
#else
  return __shfl_xor(v, o);
#endif
}
__device__ __forceinline__ float row_max(float v) {
  for (int o = 1; o < (MMA_N == 8 ? 4 : 16); o <<= 1)
    v = fmaxf(v, shfl_xor_(v, o));
  return v;
}
__device__ __forceinline__ float row_sum(float v) {
  for (int o = 1; o < (MMA_N == 8 ? 4 : 16); o <<= 1)
    v += shfl_xor_(v, o);
  return v;
}
__device__ __forceinline__ void ld_a(FragA &a, const char *tile, int row0, int chunk0) {
  a.t = tile;
  a.r0 = row0;
  a.c0 = chunk0;
}
__device__ __forceinline__ void ld_b_nk(FragB &b, const char *tile, int n0, int chunk0) {
  b.t = tile;
  b.n0 = n0;
  b.c0 = chunk0;
  b.kn = 0;
}
__device__ __forceinline__ void ld_b_nk2(FragB &b0, FragB &b1, const char *tile, int n0,
                                         int chunk0) {
  ld_b_nk(b0, tile, n0, chunk0);
  ld_b_nk(b1, tile, n0 + MMA_N, chunk0);
}
__device__ __forceinline__ void ld_b_nk_k2(FragB &b0, FragB &b1, const char *tile, int n0,
                                           int chunk0) {
  ld_b_nk(b0, tile, n0, chunk0);
  ld_b_nk(b1, tile, n0, chunk0 + 2);
}
__device__ __forceinline__ void ld_b_kn(FragB &b, const char *tile, int k0, int chunk0) {
  b.t = tile;
  b.n0 = k0; /* first k row */
  b.c0 = chunk0;
  b.kn = 1;
}
__device__ __forceinline__ void ld_b_kn2(FragB &b0, FragB &b1, const char *tile, int k0,
                                         int chunk0) {
  ld_b_kn(b0, tile, k0, chunk0);
  ld_b_kn(b1, tile, k0, chunk0 + MMA_N / 8);
}
__device__ __forceinline__ float sm_bf16(const char *t, int r, int c0, int col) {
  return bf16_to_f(*(const uint16_t *)(t + elem_off(r, c0, col)));
}
constexpr bool F16_TILES = false; /* bf16 tiles for every cache */
template <bool F16 = false> __device__ __forceinline__ void mma(Acc &c, const FragA &a, const FragB &b) {
  static_assert(!F16, "bf16 fragments only");
  int l = lane_id();
  for (int e = 0; e < ACC; e++) {
    int row = acc_row(l, e), col = acc_col(l, e);
    float s = c.x[e];
    for (int k = 0; k < 16; k++) {
      float x = sm_bf16(a.t, a.r0 + row, a.c0, k);
      float y = b.kn ? sm_bf16(b.t, b.n0 + k, b.c0, col) : sm_bf16(b.t, b.n0 + col, b.c0, k);
      s += x * y;
    }
    c.x[e] = s;
  }
}
#endif

/* A row's lse (natural log) from its running maximum m (log2 units) and
 * sum l (pmla_sum_lse: -inf without a token, NaN after a NaN score) */
__device__ __forceinline__ float row_lse(float m, float l) {
  return pmla_sum_lse(l, __fmul_rn(m + log2f(l), LN2_F));
}

/* Maximum over all lanes of the warp (wave). */
__device__ __forceinline__ float warp_max(float v) {
  for (int o = WARP / 2; o > 0; o >>= 1)
#ifdef PMLA_PLATFORM_NVIDIA
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
#else
    v = fmaxf(v, __shfl_xor(v, o));
#endif
  return v;
}
/* Sum over all lanes of the warp (wave). */
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = WARP / 2; o > 0; o >>= 1)
#ifdef PMLA_PLATFORM_NVIDIA
    v += __shfl_xor_sync(0xffffffffu, v, o);
#else
    v += __shfl_xor(v, o);
#endif
  return v;
}
/* The warp's (wave's) shared-memory writes seen by its other lanes. A
 * wave runs as one instruction stream, its LDS accesses in order. */
__device__ __forceinline__ void warp_sync() {
#ifdef PMLA_PLATFORM_NVIDIA
  __syncwarp();
#else
  __builtin_amdgcn_wave_barrier();
#endif
}
/* Lane src's v, to every lane of the warp (wave). */
template <typename T> __device__ __forceinline__ T lane_value(T v, int src) {
#ifdef PMLA_PLATFORM_NVIDIA
  return __shfl_sync(0xffffffffu, v, src);
#else
  return __shfl(v, src);
#endif
}

} /* namespace pmla_mma */

#endif
