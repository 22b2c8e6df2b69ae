/* SPDX-License-Identifier: MIT */
/* decode_sm90.hip - the persistent split-KV MLA decode kernel for 64-row
 * head tiles on sm_90a: wgmma from shared-memory descriptors, whole-page
 * KV blocks by TMA. Same work items, masking and outputs as decode_mma.hip.
 *
 * Shared memory holds every 576-dim row (Q and each of two KV stages) as 9
 * column blocks of 64 rows x 64 bf16 (128 B), each block in the canonical
 * K-major 128-byte-swizzle layout (16-byte chunk j of row r at chunk
 * j ^ (r & 7); blocks 1024-byte aligned): the layout TMA writes with
 * CU_TENSOR_MAP_SWIZZLE_128B and the cp.async gather reproduces. Per
 * 64-token block:
 *   QK  warpgroup 0: S[64 x 64] = 36 wgmma m64n64k16, A = Q and B = K
 *       straight from shared memory through descriptors
 *   P   exp2(S - m) as bf16 into the stage's rope block (block 8: 64 rows x
 *       64 tokens, the same swizzled layout, free once QK is done)
 *   PV  warpgroup g: O[64 x 256] (columns 256g..) += P V, 4 wgmma
 *       m64n256k16 with V read MN-major (transposed B) from the stage
 * Warpgroup 1 also loads: a block that is one whole valid page-aligned run
 * of 64 slots (page sizes that are multiples of 64) as nine TMA boxes from
 * one thread, any other block (partial, invalid slots, page sizes 1 / 16,
 * top-k gathers) by per-token cp.async with zero fill. Generic-proxy writes
 * (cp.async, P stores) are made visible to the wgmma async proxy with
 * fence.proxy.async before the barrier that publishes them.
 *
 * One QK warpgroup: warpgroup 0 computes all of S[64 x 64]
 * (36 wgmma m64n64k16: K and Q each read once per block, a third less
 * shared-memory traffic than two m64n32 halves) and the softmax, keeping the
 * running max and sum of its rows in registers; warpgroup 1 is the loader
 * (TMA for whole pages, cp.async otherwise) and runs its half of PV while
 * warpgroup 0 computes the next block's S. Hand-offs, one per stage (block
 * parity b & 1), so a fast side can never complete one twice:
 *   FULL[b&1]    mbarrier: wg1's 128 threads arrive (plus the TMA bytes)
 *                when block b is in shared memory; wg0 waits
 *   PREADY[b&1]  mbarrier: wg0's 128 threads arrive when P(b) and corr(b)
 *                are written; wg1 waits
 *   EMPTY[b&1]   named barrier: wg0 arrives when its PV(b) is done and block
 *                b + 2 exists; wg1 syncs before loading b + 2 into the stage
 * The data hand-offs are mbarriers (release / acquire) rather than bar.arrive
 * + bar.sync, which racecheck does not see as ordering the sCorr read. A
 * side reaches a stage's barrier again only after a hand-off from the other
 * side that follows the first completion (wg0 needs FULL(b + 2), which the
 * loader gives after waiting on PREADY(b)), so the parities stay in step.
 *
 * The kernel is compiled for every NVIDIA target but has a body only in the
 * sm_90a image; dispatch.hip launches it only where that image runs. An AMD
 * build compiles this file to nothing. */
#include "hip_compat.h"
#ifdef PMLA_PLATFORM_NVIDIA
#include <math.h>
#include <stdint.h>
#include <string.h>


#include "config.h"
#include "hip_compat.h"
#include "kv_map.h"
#include "launch.h"
#include "mla_gpu.h"
#include "mma.h"
#include "pdl.h"
#include "sm90.h"
#include <cudaTypedefs.h> /* CUtensorMap, PFN_cuTensorMapEncodeTiled */

namespace {

constexpr int BN = 64, ROWS = 64, NT = 256;
constexpr int BLK = 64 * 128; /* one column block: 64 rows x 128 B */
constexpr int TILE = 9 * BLK; /* 64 rows x 576 bf16 */
constexpr int PITCH = PMLA_TILE_PITCH;
constexpr size_t SMEM = 1024 /* alignment slack */ + 3 * (size_t)TILE +
                        sizeof(float) * 8 * ROWS + sizeof(int) * 2 * BN;
static_assert(SMEM <= 232448, "shared memory per block (sm_90)");

#ifdef PMLA_SM90_DEVICE
using namespace pmla_mma;
using namespace pmla_kv;
using namespace pmla_sm90;

constexpr int KSTEPS = PMLA_QK_DIM / 16;
constexpr float LN2_F = 0.6931471805599453f;

/* byte offset of 16-byte chunk c (0..71) of row r (0..63) */
__device__ __forceinline__ uint32_t off(int r, int c) {
  return (uint32_t)((c >> 3) * BLK + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}
/* The first slot of block [pos_blk, pos_blk + BN) when the block is one
 * whole valid run of BN slots inside a single page (page size a multiple of
 * BN, block page-aligned, before ke), else -1. Every loader thread holds
 * the same raw entry for such a block, so all of them decide alike. */
__device__ __forceinline__ int64_t whole_page_slot(const pmla_kv_map &m, int32_t raw, int pos_blk,
                                                   int ke) {
  if (m.topk || m.page_size % BN != 0 || pos_blk % BN != 0 || pos_blk + BN > ke || raw < 0)
    return -1;
  const int64_t slot = (int64_t)raw * m.page_size + pos_blk % m.page_size;
  return slot + BN <= m.num_slots ? slot : -1;
}
/* a whole 64-token block (nine 64-column boxes) into the stage at dst */
__device__ __forceinline__ void tma_block(uint32_t dst, const CUtensorMap *map, int64_t slot,
                                          uint32_t bar) {
#pragma unroll
  for (int c = 0; c < 9; c++)
    tma_box(dst + c * BLK, map, c * 64, (int)slot, bar);
}

/* Softmax helpers of the 64-row bodies. Element e of a thread's S
 * accumulator holds row myrow[(e >> 1) & 1], token 8 (e >> 2) + 2 (lane & 3)
 * + (e & 1) of the block. */

/* a loader warp's token validity as bits (the TPT lanes of a token agree):
 * bit k = the warp's k-th token; read back as one word instead of one shared
 * load per element (those loads sat on the softmax's critical path) */
template <int TPT> __device__ __forceinline__ uint32_t token_bits(bool v) {
  const uint32_t b = __ballot_sync(0xffffffffu, v);
  uint32_t m = 0;
#pragma unroll
  for (int k = 0; k < 32 / TPT; k++)
    m |= ((b >> (k * TPT)) & 1u) << k;
  return m;
}
/* publishes a loader warp's validity bits as its 16-bit quarter of the
 * stage's 64-bit word (four loader warps, 16 tokens each) */
template <int TPT>
__device__ __forceinline__ void store_token_bits(uint64_t *sVm, int st, int wi, int lane, bool v) {
  static_assert(32 / TPT == 16, "four loader warps of 16 tokens per 64-token block");
  const uint32_t bits = token_bits<TPT>(v);
  if (lane == 0)
    ((uint16_t *)sVm)[st * 4 + wi] = (uint16_t)bits;
}
/* tokens pos0 + [0, 64) that lie before lim */
__device__ __forceinline__ uint64_t before64(int lim, int pos0) {
  if (lim <= pos0)
    return 0;
  return lim - pos0 >= 64 ? ~0ull : (1ull << (lim - pos0)) - 1;
}
/* masks S in place (raw scores; -inf where a token is invalid or causally
 * after the row) and returns the row maxima scaled to base 2 */
__device__ __forceinline__ void wg_mask_max(float (&s)[32], float (&mx)[2], uint64_t vm, int pos0,
                                            const int (&lim)[2], float scale_log2, int lane) {
  uint64_t rm[2];
#pragma unroll
  for (int sl = 0; sl < 2; sl++)
    rm[sl] = (vm & before64(lim[sl], pos0)) >> ((lane & 3) << 1);
  const uint64_t mine = 0x0303030303030303ull; /* this thread's columns */
  mx[0] = mx[1] = -INFINITY;
  if ((rm[0] & rm[1] & mine) == mine) {
#pragma unroll
    for (int e = 0; e < 32; e++)
      mx[(e >> 1) & 1] = fmaxf(mx[(e >> 1) & 1], s[e]);
  } else {
#pragma unroll
    for (int e = 0; e < 32; e++) {
      const int sl = (e >> 1) & 1;
      if (!((rm[sl] >> ((e >> 2) * 8 + (e & 1))) & 1))
        s[e] = -INFINITY;
      mx[sl] = fmaxf(mx[sl], s[e]);
    }
  }
#pragma unroll
  for (int sl = 0; sl < 2; sl++)
    mx[sl] = row_max(mx[sl]) * scale_log2;
}
/* O *= corr by row; skipped when no row of the warp changed its maximum,
 * which after the first blocks is the common case */
__device__ __forceinline__ void wg_scale_o(float (&o)[128], float c0, float c1) {
  if (!__any_sync(0xffffffffu, c0 != 1.f || c1 != 1.f))
    return;
#pragma unroll
  for (int e = 0; e < 128; e++)
    o[e] *= (e & 2) ? c1 : c0;
}
/* The epilogue of an item: normalised O (columns 256g.. of this
 * warpgroup) as bf16 out or as the fp32 partial of its slot, and the lse of
 * each row; the row sum is sLa[row] (+ sLb[row]) */
__device__ __forceinline__ void store_tile(const pmla_gpu_problem &p, const float (&o)[128],
                                           const float *sM, const float *sLa, const float *sLb,
                                           int g, int lane, const int (&myrow)[2], int nrows,
                                           int32_t pslot, int32_t qb, int row0, int tid) {
  const int H = p.num_heads;
  const int64_t obase =
      pslot >= 0 ? (int64_t)pslot * p.max_q_len * H + row0 : (int64_t)qb * H + row0;
#pragma unroll
  for (int sl = 0; sl < 2; sl++) {
    int rl = myrow[sl];
    if (rl >= nrows)
      continue;
    float l = sLa[rl] + (sLb ? sLb[rl] : 0.f), inv = l > 0.f ? 1.f / l : 0.f;
    int64_t ro = (obase + rl) * PMLA_V_DIM;
#pragma unroll
    for (int j = 0; j < 32; j++) {
      int col = g * 256 + j * 8 + ((lane & 3) << 1);
      float v0 = o[4 * j + 2 * sl] * inv, v1 = o[4 * j + 2 * sl + 1] * inv;
      if (pslot >= 0)
        *(float2 *)(p.partial_out + ro + col) = make_float2(v0, v1);
      else
        *(uint32_t *)(p.out + ro + col) = pack_bf16x2(v0, v1);
    }
  }
  if (tid < nrows) {
    float l = sLa[tid] + (sLb ? sLb[tid] : 0.f);
    float lse = l > 0.f ? (sM[tid] + log2f(l)) * LN2_F : -INFINITY;
    if (pslot >= 0)
      p.partial_lse[obase + tid] = lse;
    else if (p.lse)
      p.lse[obase + tid] = lse;
  }
}
__device__ __forceinline__ void body_pp(const pmla_gpu_problem &p, float scale_log2,
                                        const CUtensorMap *kv_tmap, int use_tma) {
  extern __shared__ __align__(1024) char smem_wg[];
  char *sQ = smem_wg + ((1024u - (smem_u32(smem_wg) & 1023u)) & 1023u);
  char *sKV = sQ + TILE;
  float *sCorr = (float *)(sKV + 2 * TILE); /* [2][ROWS], by block parity */
  float *sM = sCorr + 2 * ROWS;
  float *sL = sM + ROWS;
  uint64_t *sVm = (uint64_t *)(sL + ROWS); /* [2]: token validity bits by stage */
  const uint32_t aFull = smem_u32(sVm + 2);   /* [2] mbarriers: stage loaded */
  const uint32_t aPready = smem_u32(sVm + 4); /* [2] mbarriers: P(b) written */

  const int tid = threadIdx.x, g = tid >> 7, wi = (tid >> 5) & 3, lane = tid & 31;
  if (tid == 0) {
    mbar_init(aFull, 128);
    mbar_init(aFull + 8, 128);
    mbar_init(aPready, 128);
    mbar_init(aPready + 8, 128);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  uint32_t wait_phase = 0; /* bit s: parity of the next completion of stage s's
                              barrier this side waits on (wg0 FULL, wg1 PREADY) */
  const int H = p.num_heads;
  const int u = blockIdx.x, row0 = blockIdx.y * ROWS;
  int32_t *errw = p.work_meta_data + PMLA_META_ERROR;
  const char *kvbase = (const char *)p.kv;
  const uint32_t aQ = smem_u32(sQ);
  const uint64_t dQ = desc(aQ, 16, 1024);
  int myrow[2];
  myrow[0] = wi * 16 + (lane >> 2);
  myrow[1] = myrow[0] + 8;
  enum { EMPTY = 5 }; /* named barrier ids 5, 6 */

  const int it_end = p.work_indptr[u + 1];
  for (int it = p.work_indptr[u]; it < it_end; it++) {
    const int32_t *w = p.work_info_set + (int64_t)it * PMLA_WI_WORDS;
    const int32_t r = w[PMLA_WI_REQUEST], pslot = w[PMLA_WI_PARTIAL];
    const int32_t qb = w[PMLA_WI_Q_BEGIN], qe = w[PMLA_WI_Q_END];
    const int32_t kb = w[PMLA_WI_KV_BEGIN], ke = w[PMLA_WI_KV_END], len = w[PMLA_WI_KV_LEN];
    const int qlen = qe - qb, rows_item = qlen * H;
    if (qlen <= 0 || row0 >= rows_item)
      continue;
    if (qb < 0 || qe > p.num_tokens) {
      if (tid == 0)
        atomicOr(errw, (int)PMLA_PLAN_ERR_QO_INDPTR);
      continue;
    }
    const int nrows = rows_item - row0 < ROWS ? rows_item - row0 : ROWS;
    const int nblk = ke > kb ? (ke - kb + BN - 1) / BN : 0;
    float o[128];
#pragma unroll
    for (int e = 0; e < 128; e++)
      o[e] = 0.f;

    if (g == 1) {
      /* ---------------- warpgroup 1: loader + PV columns 256.. */
      const int t = tid - 128;
      {
        const char *qsrc = (const char *)(p.q + ((int64_t)qb * H + row0) * PMLA_QK_DIM);
        for (int c = t; c < ROWS * PMLA_TILE_CHUNKS; c += 128) {
          int rr = c / PMLA_TILE_CHUNKS, cc = c % PMLA_TILE_CHUNKS;
          bool v = rr < nrows;
          cp16(sQ + off(rr, cc), v ? qsrc + (int64_t)rr * PITCH + cc * 16 : qsrc, v);
        }
      }
      constexpr int TPT = 128 / BN; /* loader threads per token */
      const int32_t csr_first = (!p.map.topk && !p.map.block_table) ? p.map.kv_indptr[r] : 0;
      const int ld_t = t / TPT, ld_sub = t % TPT;
      auto raw_at = [&](int blk) -> int32_t {
        int pos = kb + blk * BN + ld_t;
        return pos < ke ? kv_raw(p.map, r, pos, csr_first) : -1;
      };
      int32_t raw_next = raw_at(0);
      /* issues block blk into stage st; returns whether the loader still has
       * to arrive on the stage's barrier after its cp.async wait (cp.async
       * blocks, and block 0 whose wait also covers Q) */
      auto load_block = [&](int blk, int st) -> bool {
        const int pos = kb + blk * BN + ld_t;
        int64_t slot =
            pos < ke ? kv_slot(p.map, raw_next, pos, errw, ld_sub == 0 && blockIdx.y == 0) : -1;
        bool v = slot >= 0;
        store_token_bits<TPT>(sVm, st, wi, lane, v);
        const uint32_t bar = aFull + 8 * st;
#if PMLA_WG_TMA
        const int64_t first = use_tma ? whole_page_slot(p.map, raw_next, kb + blk * BN, ke) : -1;
        if (first >= 0) {
          if (t == 0) {
            if (blk == 0)
              mbar_expect_tx(bar, TILE);
            else
              mbar_arrive_tx(bar, TILE);
            tma_block(smem_u32(sKV + st * TILE), kv_tmap, first, bar);
          } else if (blk != 0) {
            mbar_arrive(bar);
          }
          raw_next = raw_at(blk + 1);
          return blk == 0;
        }
#endif
        const char *src = v ? kvbase + slot * PITCH : kvbase;
        char *dst = sKV + st * TILE;
#pragma unroll
        for (int k = 0; k < PMLA_TILE_CHUNKS / TPT; k++) {
          int c = ld_sub + k * TPT;
          cp16(dst + off(ld_t, c), src + (v ? c * 16 : 0), v);
        }
        raw_next = raw_at(blk + 1);
        return true;
      };
      uint32_t pending = 0; /* bit s: stage s awaits our arrival after cp_wait */
      if (nblk > 0 && load_block(0, 0))
        pending = 1;
      cp_commit();
      for (int b = 0; b < nblk; b++) {
        if (pending & (1u << (b & 1))) {
          cp_wait<0>();
          proxy_fence();
          mbar_arrive(aFull + 8 * (b & 1));
          pending &= ~(1u << (b & 1));
        }
        if (b + 1 < nblk) {
          if (b >= 1)
            nb_sync(EMPTY + ((b - 1) & 1));
          if (load_block(b + 1, (b + 1) & 1))
            pending |= 1u << ((b + 1) & 1);
        }
        cp_commit();
        mbar_wait(aPready + 8 * (b & 1), (wait_phase >> (b & 1)) & 1);
        wait_phase ^= 1u << (b & 1);
        const uint32_t aK = smem_u32(sKV + (b & 1) * TILE);
        wg_scale_o(o, sCorr[(b & 1) * ROWS + myrow[0]], sCorr[(b & 1) * ROWS + myrow[1]]);
        reg_fence<128>(o);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
          mma_n256_tb(o, desc_at(desc(aK, 16, 1024), 8 * BLK + kk * 32),
                      desc_at(desc(aK, BLK, 1024), 4 * BLK + kk * 16 * 128));
        wg_commit();
        wg_wait0();
        reg_fence<128>(o);
      }
      cp_wait<0>();
    } else {
      /* ---------------- warpgroup 0: QK + softmax + PV columns 0..255 */
      int lim[2];
#pragma unroll
      for (int s = 0; s < 2; s++) {
        int i = row0 + myrow[s];
        int causal = len - qlen + 1 + i / H;
        lim[s] = i < rows_item ? (causal < ke ? causal : ke) : INT32_MIN;
      }
      float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
      for (int b = 0; b < nblk; b++) {
        mbar_wait(aFull + 8 * (b & 1), (wait_phase >> (b & 1)) & 1);
        wait_phase ^= 1u << (b & 1);
        char *sK = sKV + (b & 1) * TILE;
        const uint32_t aK = smem_u32(sK);
        const int pos0 = kb + b * BN;
        float s[32];
#pragma unroll
        for (int e = 0; e < 32; e++)
          s[e] = 0.f;
        reg_fence<32>(s);
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ks++) {
          uint32_t ko = (ks >> 2) * BLK + (ks & 3) * 32;
          mma_n64(s, desc_at(dQ, ko), desc_at(desc(aK, 16, 1024), ko));
        }
        wg_commit();
        wg_wait0();
        reg_fence<32>(s);
        /* every warp's QK has read the rope block before P overwrites it */
        asm volatile("bar.sync 7, 128;\n" ::: "memory");

        float mx[2];
        wg_mask_max(s, mx, sVm[b & 1], pos0, lim, scale_log2, lane);
        float muse[2], corr[2], sum[2] = {0.f, 0.f};
#pragma unroll
        for (int sl = 0; sl < 2; sl++) {
          float m = fmaxf(m_run[sl], mx[sl]);
          muse[sl] = m == -INFINITY ? 0.f : m;
          corr[sl] = fast_exp2(m_run[sl] - muse[sl]);
          m_run[sl] = m;
          if (row_leader(lane))
            sCorr[(b & 1) * ROWS + myrow[sl]] = corr[sl];
        }
        char *sP = sK + 8 * BLK;
#pragma unroll
        for (int e = 0; e < 32; e += 2) {
          int sl = (e >> 1) & 1, row = myrow[sl];
          int col = (e >> 2) * 8 + ((lane & 3) << 1);
          float p0 = fast_exp2(fmaf(s[e], scale_log2, -muse[sl]));
          float p1 = fast_exp2(fmaf(s[e + 1], scale_log2, -muse[sl]));
          sum[sl] += p0 + p1;
          uint32_t pk = pack_bf16x2(p0, p1);
          *(uint32_t *)(sP + row * 128 + (((col >> 3) ^ (row & 7)) << 4) + ((col & 7) << 1)) = pk;
        }
        proxy_fence();
        mbar_arrive(aPready + 8 * (b & 1));
        /* our PV reads every warp's rows of P */
        asm volatile("bar.sync 7, 128;\n" ::: "memory");
#pragma unroll
        for (int sl = 0; sl < 2; sl++) /* this lane's share: summed once, at the end */
          l_run[sl] = l_run[sl] * corr[sl] + sum[sl];
        wg_scale_o(o, corr[0], corr[1]);
        reg_fence<128>(o);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
          mma_n256_tb(o, desc_at(desc(aK, 16, 1024), 8 * BLK + kk * 32),
                      desc_at(desc(aK, BLK, 1024), kk * 16 * 128));
        wg_commit();
        wg_wait0();
        reg_fence<128>(o);
        if (b + 2 < nblk)
          nb_arrive(EMPTY + (b & 1));
      }
#pragma unroll
      for (int sl = 0; sl < 2; sl++)
        l_run[sl] = row_sum(l_run[sl]);
      if (row_leader(lane)) {
#pragma unroll
        for (int sl = 0; sl < 2; sl++) {
          sM[myrow[sl]] = m_run[sl];
          sL[myrow[sl]] = l_run[sl];
        }
      }
    }
    __syncthreads();

    store_tile(p, o, sM, sL, nullptr, g, lane, myrow, nrows, pslot, qb, row0, tid);
    __syncthreads();
  }
}
/* ------------------------------------------------------------------ body_pair
 * Whole-page blocks only (dense steps, page size a multiple of 64: every
 * block of an item lies in one page, so every block comes by TMA; a page
 * index out of range becomes an out-of-bounds box, which TMA fills with
 * zeros, and the block is masked and flagged). The two warpgroups take the
 * blocks in pairs, FlashMLA's schedule: warpgroup 0 owns even blocks (stage
 * 0), warpgroup 1 odd ones (stage 1); each computes S for its own block,
 * and each owns half of O (columns 256g..). Per pair (b, b + 1):
 *   wg0  softmax(b) -> sScale0, sM                            SCALE0 ->
 *        O0 += P0 V0[:, 0:256]   (P0 from registers)
 *   wg1  (SCALE0) softmax(b + 1) from sM -> sScale1, sM;
 *        O1 *= scale0 * scale1                                SCALE1 ->
 *        P1 into stage 1's rope box; O1 += P1 V1[:, 256:]    (registers)
 *   wg0  (SCALE1) refill stage 0 boxes 0-3 with b + 2; P0 * scale1 into
 *        stage 0's rope box                                   P0READY ->
 *   wg1  (P0READY) O1 += P0 V0[:, 256:]                        P1READY ->
 *   wg0  (P1READY) O0 *= scale1; O0 += P1 V1[:, 0:256]; S(b + 2) over
 *        boxes 0-3; once P1 V1 is done, refill stage 1 boxes 0-3 and 8
 *        with b + 3; S(b + 2) over boxes 4-8
 *   wg1  once P1 V1 is done, refill stage 1 boxes 4-7 with b + 3; once
 *        P0 V0 is done, refill stage 0 boxes 4-8 with b + 2; S(b + 3)
 * so one warpgroup's softmax runs while the other's wgmma keep the tensor
 * cores busy. A stage's boxes are refilled by the warpgroup that reads them
 * last, as soon as it is done, on two mbarriers per stage (the boxes each
 * warpgroup refills); the owner waits on both before its QK. Each P lives
 * in the rope box of its own stage (free once its S is computed). V rows of
 * positions past the item (NaN-poisoned slots of a last page) are zeroed in
 * shared memory before a PV reads them. */
enum { NB_SCALE0 = 1, NB_SCALE1, NB_P0READY, NB_P1READY, NB_WG0, NB_WG1 };

/* S (+)= Q K^T over box c of the stage at aK (16 k-steps... 4 of the 36),
 * one commit group (first: S = the product, its old value unread) */
__device__ __forceinline__ void qk_box(float (&s)[32], uint32_t aQ, uint32_t aK, int c,
                                       bool first) {
  wg_fence();
#pragma unroll
  for (int k = 0; k < 4; k++) {
    const uint32_t ko = c * BLK + k * 32;
    mma_n64(s, desc_at(desc(aQ, 16, 1024), ko), desc_at(desc(aK, 16, 1024), ko),
            !(first && k == 0));
  }
  wg_commit();
}
/* O[:, 256 half..] += P V; P from registers (pa) */
__device__ __forceinline__ void pv_rs(float (&o)[128], const uint32_t (&pa)[16], uint32_t aK,
                                      int half) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; kk++)
    mma_n256_rs(o, pa + 4 * kk, desc_at(desc(aK, BLK, 1024), 4 * half * BLK + kk * 16 * 128));
}
/* O[:, 256 half..] += P V; P from the stage's rope box */
__device__ __forceinline__ void pv_ss(float (&o)[128], uint32_t aK, int half) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; kk++)
    mma_n256_tb(o, desc_at(desc(aK, 16, 1024), 8 * BLK + kk * 32),
                desc_at(desc(aK, BLK, 1024), 4 * half * BLK + kk * 16 * 128));
}
/* The TMA row of block [pos0, pos0 + 64) (its first slot), or -BN when its
 * page is out of range (flagged; TMA then fills the box with zeros) */
__device__ __forceinline__ int block_row(const pmla_kv_map &m, int32_t r, int32_t csr_first,
                                         int pos0, int32_t *errw, bool flag) {
  const int32_t raw = kv_raw(m, r, pos0, csr_first);
  const int64_t slot = (int64_t)raw * m.page_size + pos0 % m.page_size;
  if (raw < 0 || slot + BN > m.num_slots) {
    if (flag)
      atomicOr(errw, (int)PMLA_PLAN_ERR_PAGE_INDEX);
    return -BN;
  }
  return (int)slot;
}
/* boxes [b0, b0 + n) (and the rope box 8 when rope) of the block at TMA row
 * `row` into the stage at dst; box c completes on its own barrier bars + 8c */
__device__ __forceinline__ void tma_boxes(uint32_t dst, const CUtensorMap *map, int row,
                                          uint32_t bars, int b0, int n, bool rope) {
  for (int c = b0; c < b0 + n; c++) {
#ifdef PMLA_DIAG_NOLOAD
    mbar_arrive(bars + 8 * c);
    continue;
#endif
    mbar_arrive_tx(bars + 8 * c, BLK);
    tma_box(dst + c * BLK, map, c * 64, row, bars + 8 * c);
  }
  if (rope) {
#ifdef PMLA_DIAG_NOLOAD
    mbar_arrive(bars + 8 * 8);
    return;
#endif
    mbar_arrive_tx(bars + 8 * 8, BLK);
    tma_box(dst + 8 * BLK, map, 8 * 64, row, bars + 8 * 8);
  }
}
/* zeroes V (boxes [b0, b0 + 4)) of tokens [from, 64) of a stage, then makes
 * the zeros visible to this warpgroup's wgmma */
__device__ __forceinline__ void zero_v_tail(char *stage, int b0, int from, int t, int nb) {
  const int rows = BN - from;
  for (int i = t; i < rows * 4 * 8; i += 128) {
    const int chunk = i & 7, k = i >> 3;
    *(uint4 *)(stage + (b0 + k / rows) * BLK + (from + k % rows) * 128 + chunk * 16) =
        make_uint4(0, 0, 0, 0);
  }
  proxy_fence();
  nb_sync_n(nb, 128);
}
/* softmax of one block's S in place: mask, row maxima against sM, P =
 * exp2(S scale - m); returns exp2(m_old - m) per row and this lane's share
 * of the row sums; the row leader publishes the new maximum and scale */
__device__ __forceinline__ void pair_softmax(float (&s)[32], float (&sc)[2], float (&sum)[2],
                                             float *sM, float *sScale, uint64_t vm, int pos0,
                                             const int (&lim)[2], float scale_log2,
                                             const int (&myrow)[2], int lane) {
  float mx[2];
  wg_mask_max(s, mx, vm, pos0, lim, scale_log2, lane);
  float muse[2];
#pragma unroll
  for (int sl = 0; sl < 2; sl++) {
    const float m_old = sM[myrow[sl]], m = fmaxf(m_old, mx[sl]);
    muse[sl] = m == -INFINITY ? 0.f : m;
    sc[sl] = fast_exp2(m_old - muse[sl]);
    sum[sl] = 0.f;
    __syncwarp();
    if (row_leader(lane)) {
      sM[myrow[sl]] = m;
      sScale[myrow[sl]] = sc[sl];
    }
  }
#pragma unroll
  for (int e = 0; e < 32; e++) {
    s[e] = fast_exp2(fmaf(s[e], scale_log2, -muse[(e >> 1) & 1]));
    sum[(e >> 1) & 1] += s[e];
  }
}
/* P as bf16 A fragments: k-step kk takes n-tiles 2kk and 2kk + 1 */
__device__ __forceinline__ void pack_p(const float (&s)[32], uint32_t (&pa)[16]) {
#pragma unroll
  for (int i = 0; i < 16; i++)
    pa[i] = pack_bf16x2(s[2 * i], s[2 * i + 1]);
}
/* P * (f0, f1 by row) as bf16 into a stage's rope box (64 rows x 64 tokens,
 * 128B swizzle: the layout a K-major A descriptor reads) */
__device__ __forceinline__ void store_p(char *stage, const float (&s)[32], float f0, float f1,
                                        const int (&myrow)[2], int lane) {
  char *sP = stage + 8 * BLK;
#pragma unroll
  for (int i = 0; i < 16; i++) {
    const int row = myrow[i & 1], col = (i >> 1) * 8 + ((lane & 3) << 1);
    const float f = (i & 1) ? f1 : f0;
    *(uint32_t *)(sP + row * 128 + (((col >> 3) ^ (row & 7)) << 4) + ((col & 7) << 1)) =
        pack_bf16x2(s[2 * i] * f, s[2 * i + 1] * f);
  }
}
/* the registers an RS wgmma reads stay live (and unmoved) until its wait */
__device__ __forceinline__ void reg_fence_u(uint32_t (&a)[16]) {
#pragma unroll
  for (int i = 0; i < 16; i++)
    asm volatile("" : "+r"(a[i])::"memory");
}

__device__ __forceinline__ void body_pair(const pmla_gpu_problem &p, float scale_log2,
                                          const CUtensorMap *kv_tmap) {
  extern __shared__ __align__(1024) char smem_wg[];
  char *sQ = smem_wg + ((1024u - (smem_u32(smem_wg) & 1023u)) & 1023u);
  char *sKV = sQ + TILE;
  float *sScale = (float *)(sKV + 2 * TILE); /* [2][ROWS]: scale0, scale1 of the pair */
  float *sM = sScale + 2 * ROWS;             /* running row maxima (base 2, scaled) */
  float *sL = sM + ROWS;                     /* [2][ROWS]: row sums of each warpgroup */
  uint64_t *sVm = (uint64_t *)(sL + 2 * ROWS); /* [2]: page validity of each stage's block */
  const uint32_t aBar = smem_u32(sVm + 2);     /* [2 stages][9 boxes] mbarriers */
  static_assert(sizeof(float) * 5 * ROWS + 8 * 20 <= sizeof(float) * 8 * ROWS + sizeof(int) * 2 * BN,
                "body_pair's shared state fits SMEM");

  const int tid = threadIdx.x, g = tid >> 7, t = tid & 127, wi = (tid >> 5) & 3, lane = tid & 31;
  if (tid == 0) {
    for (int i = 0; i < 18; i++)
      mbar_init(aBar + 8 * i, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  /* parity of the next completion of the own stage's two barriers */
  uint32_t phase = 0;
  const int H = p.num_heads;
  const int u = blockIdx.x, row0 = blockIdx.y * ROWS;
  int32_t *errw = p.work_meta_data + PMLA_META_ERROR;
  const uint32_t aQ = smem_u32(sQ);
  char *stage0 = sKV, *stage1 = sKV + TILE;
  const uint32_t aK0 = smem_u32(stage0), aK1 = smem_u32(stage1);
  const uint32_t bars0 = aBar, bars1 = aBar + 8 * 9; /* box c of stage s: bars_s + 8c */
  int myrow[2];
  myrow[0] = wi * 16 + (lane >> 2);
  myrow[1] = myrow[0] + 8;
  const bool flag = blockIdx.y == 0; /* one head tile reports bad pages */

  const int it_end = p.work_indptr[u + 1];
  for (int it = p.work_indptr[u]; it < it_end; it++) {
    const int32_t *w = p.work_info_set + (int64_t)it * PMLA_WI_WORDS;
    const int32_t r = w[PMLA_WI_REQUEST], pslot = w[PMLA_WI_PARTIAL];
    const int32_t qb = w[PMLA_WI_Q_BEGIN], qe = w[PMLA_WI_Q_END];
    const int32_t kb = w[PMLA_WI_KV_BEGIN], ke = w[PMLA_WI_KV_END], len = w[PMLA_WI_KV_LEN];
    const int qlen = qe - qb, rows_item = qlen * H;
    if (qlen <= 0 || row0 >= rows_item)
      continue;
    if (qb < 0 || qe > p.num_tokens) {
      if (tid == 0)
        atomicOr(errw, (int)PMLA_PLAN_ERR_QO_INDPTR);
      continue;
    }
    const int nrows = rows_item - row0 < ROWS ? rows_item - row0 : ROWS;
    const int nblk = ke > kb ? (ke - kb + BN - 1) / BN : 0;
    const int32_t csr_first = (!p.map.topk && !p.map.block_table) ? p.map.kv_indptr[r] : 0;
    auto row_of = [&](int blk) { return block_row(p.map, r, csr_first, kb + blk * BN, errw, flag); };

    /* Q (rows past the item zero-filled) by every thread; the first two
     * blocks by TMA, block 0 by wg0's first thread, block 1 by wg1's */
    {
      const char *qsrc = (const char *)(p.q + ((int64_t)qb * H + row0) * PMLA_QK_DIM);
      for (int c = tid; c < ROWS * PMLA_TILE_CHUNKS; c += NT) {
        int rr = c / PMLA_TILE_CHUNKS, cc = c % PMLA_TILE_CHUNKS;
        bool v = rr < nrows;
        cp16(sQ + off(rr, cc), v ? qsrc + (int64_t)rr * PITCH + cc * 16 : qsrc, v);
      }
      cp_commit();
    }
    if (t == 0 && g < nblk) {
      const int row = row_of(g);
      sVm[g] = row >= 0 ? ~0ull : 0ull;
      if (g == 0)
        tma_boxes(aK0, kv_tmap, row, bars0, 0, 8, true);
      else
        tma_boxes(aK1, kv_tmap, row, bars1, 4, 4, false), tma_boxes(aK1, kv_tmap, row, bars1, 0, 4, true);
    }
    if (tid < ROWS)
      sM[tid] = -INFINITY;
    cp_wait<0>();
    proxy_fence();
    __syncthreads();

    int lim[2];
#pragma unroll
    for (int s = 0; s < 2; s++) {
      int i = row0 + myrow[s];
      int causal = len - qlen + 1 + i / H;
      lim[s] = i < rows_item ? (causal < ke ? causal : ke) : INT32_MIN;
    }
    float o[128], s[32], lrun[2] = {0.f, 0.f};
    uint32_t pa[16];
#pragma unroll
    for (int e = 0; e < 128; e++)
      o[e] = 0.f;
    /* One pair (b, b + 1) on each side; the flags are compile-time so that
     * no wgmma is issued or waited for under a runtime branch (ptxas would
     * serialise every wgmma of the kernel). wg0: HAS1 = b + 1 < nblk, NEXT =
     * b + 2 < nblk; wg1: HAS1, NEXT = b + 3 < nblk. */
    auto wg0_pair = [&](int b, bool has1_t, bool next_t) {
      const bool HAS1 = has1_t, NEXT = next_t;
      const int pos0 = kb + b * BN, pos1 = pos0 + BN;
      /* the refills' rows, read now: the table lookup is off the issue path */
      const int row2 = t == 0 && b + 2 < nblk ? row_of(b + 2) : 0;
      const int row3 = t == 0 && b + 3 < nblk ? row_of(b + 3) : 0;
      float sc[2], sum[2];
      pair_softmax(s, sc, sum, sM, sScale, sVm[0], pos0, lim, scale_log2, myrow, lane);
      nb_arrive_n(NB_SCALE0, 256);
#pragma unroll
      for (int sl = 0; sl < 2; sl++)
        lrun[sl] = lrun[sl] * sc[sl] + sum[sl];
      wg_scale_o(o, sc[0], sc[1]);
      pack_p(s, pa);
      if (ke - pos0 < BN)
        zero_v_tail(stage0, 0, ke - pos0, t, NB_WG0);
      reg_fence<128>(o);
      reg_fence_u(pa);
      wg_fence();
      pv_rs(o, pa, aK0, 0);
      wg_commit();
      wg_wait0();
      reg_fence<128>(o);
      reg_fence_u(pa);
      nb_sync_n(NB_SCALE1, 256);
      if (NEXT && t == 0) {
        sVm[0] = row2 >= 0 ? ~0ull : 0ull;
        tma_boxes(aK0, kv_tmap, row2, bars0, 0, 4, false);
      }
      const float c0 = sScale[ROWS + myrow[0]], c1 = sScale[ROWS + myrow[1]];
      store_p(stage0, s, c0, c1, myrow, lane);
      proxy_fence();
      nb_arrive_n(NB_P0READY, 256);
      lrun[0] *= c0;
      lrun[1] *= c1;
      wg_scale_o(o, c0, c1);
      if (HAS1) {
        if (ke - pos1 < BN)
          zero_v_tail(stage1, 0, ke - pos1, t, NB_WG0);
        nb_sync_n(NB_P1READY, 256);
        reg_fence<128>(o);
        wg_fence();
        pv_ss(o, aK1, 0);
        wg_commit();
      }
      if (NEXT) {
#pragma unroll
        for (int c = 0; c < 4; c++) {
          mbar_wait(bars0 + 8 * c, phase);
          qk_box(s, aQ, aK0, c, c == 0);
        }
        wg_wait<4>(); /* P1 V1 done: stage 1's boxes 0-3 and 8 are free */
        if (t == 0 && b + 3 < nblk) {
          sVm[1] = row3 >= 0 ? ~0ull : 0ull;
          tma_boxes(aK1, kv_tmap, row3, bars1, 0, 4, true);
        }
#pragma unroll
        for (int c = 4; c < 9; c++) {
          mbar_wait(bars0 + 8 * c, phase);
          qk_box(s, aQ, aK0, c, false);
        }
        phase ^= 1;
      }
      wg_wait0();
      reg_fence<128>(o);
      reg_fence<32>(s);
    };
    auto wg1_pair = [&](int b, bool has1_t, bool next_t) {
      const bool HAS1 = has1_t, NEXT = next_t;
      const int pos0 = kb + b * BN, pos1 = pos0 + BN;
      const int row2 = t == 0 && b + 2 < nblk ? row_of(b + 2) : 0;
      const int row3 = t == 0 && b + 3 < nblk ? row_of(b + 3) : 0;
      nb_sync_n(NB_SCALE0, 256);
      float sc[2] = {1.f, 1.f}, sum[2] = {0.f, 0.f};
      if (HAS1) {
        pair_softmax(s, sc, sum, sM, sScale + ROWS, sVm[1], pos1, lim, scale_log2, myrow, lane);
      } else if (row_leader(lane)) {
        sScale[ROWS + myrow[0]] = 1.f;
        sScale[ROWS + myrow[1]] = 1.f;
      }
      float c[2];
#pragma unroll
      for (int sl = 0; sl < 2; sl++) {
        c[sl] = sc[sl] * sScale[myrow[sl]];
        lrun[sl] = lrun[sl] * c[sl] + sum[sl];
      }
      nb_arrive_n(NB_SCALE1, 256);
      wg_scale_o(o, c[0], c[1]);
      if (HAS1) {
        pack_p(s, pa);
        store_p(stage1, s, 1.f, 1.f, myrow, lane);
        proxy_fence();
        if (ke - pos1 < BN)
          zero_v_tail(stage1, 4, ke - pos1, t, NB_WG1);
        reg_fence<128>(o);
        reg_fence_u(pa);
        wg_fence();
        pv_rs(o, pa, aK1, 1);
        wg_commit();
      }
      nb_sync_n(NB_P0READY, 256);
      if (ke - pos0 < BN)
        zero_v_tail(stage0, 4, ke - pos0, t, NB_WG1);
      if (!HAS1) /* else O is in flight: P1 V1 accumulates into it */
        reg_fence<128>(o);
      wg_fence();
      pv_ss(o, aK0, 1);
      wg_commit();
      if (HAS1) {
        nb_arrive_n(NB_P1READY, 256);
        wg_wait<1>();
        reg_fence_u(pa);
        if (t == 0 && b + 3 < nblk)
          tma_boxes(aK1, kv_tmap, row3, bars1, 4, 4, false);
      }
      wg_wait0();
      reg_fence<128>(o);
      if (t == 0 && b + 2 < nblk)
        tma_boxes(aK0, kv_tmap, row2, bars0, 4, 4, true);
      if (NEXT) {
#pragma unroll
        for (int i = 0; i < 9; i++) { /* boxes 4-7 (refilled first), 0-3, 8 */
          const int c = i < 4 ? i + 4 : i < 8 ? i - 4 : 8;
          mbar_wait(bars1 + 8 * c, phase);
          qk_box(s, aQ, aK1, c, i == 0);
        }
        phase ^= 1;
      }
      wg_wait0();
      reg_fence<32>(s);
    };
    if (g == 0) {
      /* S of block 0; the wait stays outside the branch (see above) */
      if (nblk > 0) {
#pragma unroll
        for (int c = 0; c < 9; c++) {
          mbar_wait(bars0 + 8 * c, phase);
          qk_box(s, aQ, aK0, c, c == 0);
        }
        phase ^= 1;
      }
      wg_wait0();
      reg_fence<32>(s);
#pragma unroll 1
      for (int b = 0; b < nblk; b += 2)
        wg0_pair(b, b + 1 < nblk, b + 2 < nblk);
    } else {
      if (nblk > 1) {
#pragma unroll
        for (int i = 0; i < 9; i++) { /* boxes 4-7 (refilled first), 0-3, 8 */
          const int c = i < 4 ? i + 4 : i < 8 ? i - 4 : 8;
          mbar_wait(bars1 + 8 * c, phase);
          qk_box(s, aQ, aK1, c, i == 0);
        }
        phase ^= 1;
      }
      wg_wait0();
      reg_fence<32>(s);
#pragma unroll 1
      for (int b = 0; b < nblk; b += 2)
        wg1_pair(b, b + 1 < nblk, b + 3 < nblk);
    }

    /* ---- epilogue: each warpgroup's row sums, then O by warpgroup halves */
#pragma unroll
    for (int sl = 0; sl < 2; sl++)
      lrun[sl] = row_sum(lrun[sl]);
    if (row_leader(lane)) {
      sL[g * ROWS + myrow[0]] = lrun[0];
      sL[g * ROWS + myrow[1]] = lrun[1];
    }
    __syncthreads();
    store_tile(p, o, sM, sL, sL + ROWS, g, lane, myrow, nrows, pslot, qb, row0, tid);
    __syncthreads();
  }
}
#endif /* PMLA_SM90_DEVICE */

/* kv_tmap: the KV cache as a [num_slots, 576] bf16 tensor map (64 x 64
 * boxes, 128B swizzle). Two kernels, so that each body gets the registers
 * it needs: body_pair where every block can come by TMA, body_pp (its
 * loader gathers by cp.async what TMA cannot) otherwise. */
__global__ void __launch_bounds__(NT, 1)
    pmla_decode_sm90_pair_kernel(pmla_gpu_problem p, float scale_log2,
                                 const __grid_constant__ CUtensorMap kv_tmap) {
#ifdef PMLA_SM90_DEVICE
  pdl_wait();
  pdl_trigger();
  body_pair(p, scale_log2, &kv_tmap);
#endif
}
__global__ void __launch_bounds__(NT, 1)
    pmla_decode_sm90_kernel(pmla_gpu_problem p, float scale_log2,
                            const __grid_constant__ CUtensorMap kv_tmap, int use_tma) {
#ifdef PMLA_SM90_DEVICE
  pdl_wait();
  pdl_trigger();
  body_pp(p, scale_log2, &kv_tmap, use_tma);
#endif
}

/* cuTensorMapEncodeTiled, looked up once through the runtime (the plugin
 * links no libcuda); NULL: no TMA, every block takes the cp.async path */
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static bool looked = false;
  if (!looked) {
    cudaDriverEntryPointQueryResult q;
    void *f = nullptr;
    /* a failure clears only the error it set, never one the host had pending */
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess)
      cudaGetLastError();
    else if (q == cudaDriverEntryPointSuccess)
      fn = (PFN_cuTensorMapEncodeTiled_v12000)f;
    looked = true;
  }
  return fn;
}
/* The KV cache as a 2-D tensor map for body_pp's whole-page loads; 0 when
 * TMA does not apply (top-k gather, page size not a multiple of 64, a cache
 * the map cannot describe) */
int kv_tensor_map(CUtensorMap *m, const pmla_gpu_problem &p) {
  PFN_cuTensorMapEncodeTiled_v12000 enc = tensor_map_encoder();
  if (!PMLA_WG_TMA || !enc || p.map.topk || p.map.page_size % BN != 0 ||
      p.map.num_slots < BN || p.map.num_slots > INT32_MAX || ((uintptr_t)p.kv & 15) != 0)
    return 0;
  cuuint64_t dim[2] = {PMLA_QK_DIM, (cuuint64_t)p.map.num_slots};
  cuuint64_t stride[1] = {PITCH};
  cuuint32_t box[2] = {64, (cuuint32_t)BN}, estride[2] = {1, 1};
  return enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)p.kv, dim, stride, box, estride,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}
hipError_t launch_decode_wg(const pmla_gpu_problem &p, int tiles, hipStream_t st) {
  static unsigned long long opted_pp = 0, opted_pair = 0;
  const dim3 grid((unsigned)p.num_units, (unsigned)tiles);
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f; /* log2(e) */
  CUtensorMap tmap;
  memset(&tmap, 0, sizeof tmap);
  int use_tma = kv_tensor_map(&tmap, p);
#ifdef PMLA_DIAG_PP
  if (use_tma) {
    static unsigned long long o2 = 0;
    hipError_t e2 = pmla_opt_in_smem((const void *)pmla_decode_sm90_kernel, SMEM, &o2);
    if (e2 != hipSuccess)
      return e2;
    return pdl_launch(pmla_decode_sm90_kernel, grid, dim3(NT), SMEM, st, p, scale_log2, tmap, use_tma);
  }
#endif
  const void *kernel =
      use_tma ? (const void *)pmla_decode_sm90_pair_kernel : (const void *)pmla_decode_sm90_kernel;
  hipError_t e = pmla_opt_in_smem(kernel, SMEM, use_tma ? &opted_pair : &opted_pp);
  if (e != hipSuccess)
    return e;
  if (use_tma)
    return pdl_launch(pmla_decode_sm90_pair_kernel, grid, dim3(NT), SMEM, st, p, scale_log2, tmap);
  return pdl_launch(pmla_decode_sm90_kernel, grid, dim3(NT), SMEM, st, p, scale_log2, tmap, use_tma);
}

} /* namespace */

hipError_t pmla_launch_decode_sm90(const pmla_gpu_problem &p, int tiles, hipStream_t st) {
  return launch_decode_wg(p, tiles, st);
}

void pmla_sm90_prepare() { (void)tensor_map_encoder(); }

bool pmla_sm90_image_runs() {
  /* binaryVersion 90: the sm_90a image (the one with the body) runs here */
  cudaFuncAttributes fa;
  if (cudaFuncGetAttributes(&fa, (const void *)pmla_decode_sm90_kernel) != cudaSuccess) {
    cudaGetLastError(); /* no image for this device: no error left behind */
    return false;
  }
  return fa.binaryVersion == 90;
}
#endif /* PMLA_PLATFORM_NVIDIA */
