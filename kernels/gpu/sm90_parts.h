/* SPDX-License-Identifier: MIT */
/* sm90_parts.h - the pieces both sm_90a decode bodies are built from
 * (decode_sm90.hip's body_pp, decode_sm90_e4m3.hip's narrow E4M3 body):
 * the KV block and row tile, whether a run of tokens is one page's, the
 * validity bits of a loaded block, causal limits, the running maximum, the
 * column helpers of tiles whose tokens are the wgmma M side, and the
 * epilogue's staged rows and lse. Device parts only where the sm_90a body
 * is compiled (config.h's PMLA_SM90_DEVICE). */
#ifndef PMLA_GPU_SM90_PARTS_H
#define PMLA_GPU_SM90_PARTS_H

#include <math.h>
#include <stdint.h>

#include "config.h"
#include "fold.h"
#include "hip_compat.h"
#include "kv_map.h"
#include "mla_gpu.h"
#include "mma.h"
#include "plan_invariant.h"
#include "sm90.h"

namespace pmla_sm90_parts {

/* tokens of a KV block, rows of a head tile, threads of a work-group */
constexpr int BN = 64, ROWS = 64, NT = 256;

/* an item's normalised O staged in shared memory row for row as in global
 * memory, rows STRIDE bytes apart (the padding puts the eight rows of one
 * store on distinct banks), for bulk copies that leave while the next item
 * starts. Stored from registers, the rows held both warpgroups ~6 us per
 * item at h=128 (docs/performance.md). */
template <bool PARTIAL> struct Staged {
  static constexpr int ROW = PARTIAL ? PMLA_V_DIM * 4 : PMLA_V_DIM * 2;
  static constexpr int STRIDE = ROW + (PARTIAL ? 32 : 16);
};

/* the rows of a KV tensor map's boxes for a page size: BN where a block is
 * one page's run, 16 where a loader warp's rows are (pages of 16 or 32
 * slots), 0 where neither is (no TMA) */
constexpr int tma_box_rows(int32_t page_size) {
  return page_size % BN == 0 ? BN : page_size % 16 == 0 ? 16 : 0;
}

#ifdef PMLA_SM90_DEVICE
using pmla_mma::fast_exp2;
using pmla_mma::row_lse;

constexpr float RESCALE_SLACK = 8.f;

/* The first slot of the RUN tokens [pos, pos + RUN) when they are one
 * valid run inside a single page (page size a multiple of RUN, pos
 * RUN-aligned, before ke), else -1: a whole block (RUN = BN) or a loader
 * warp's 16 rows (RUN = 16). Every thread that loads them holds the same
 * raw entry, so all of them decide alike. */
template <int RUN>
__device__ __forceinline__ int64_t page_run_slot(const pmla_kv_map &m, int32_t raw, int pos,
                                                 int ke) {
  if (m.topk || m.page_size % RUN != 0 || pos % RUN != 0 || pos + RUN > ke || raw < 0)
    return -1;
  const int64_t slot = (int64_t)raw * m.page_size + pmla_fastdiv_r(m.page_div, (uint32_t)pos);
  return slot + RUN <= m.num_slots ? slot : -1;
}
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
/* A loader warp's N rows into shared memory by cp.async, one row at a
 * time, its 32 lanes over the row's CHUNKS 16-byte chunks, so a copy reads
 * 512 contiguous bytes of a row: row j's address is `mine` of lane SRC * j,
 * its validity bit j of bits (an invalid row is zero-filled), and dst(j, c)
 * is the shared-memory address of its chunk c. */
template <int N, int CHUNKS, int SRC, typename Dst>
__device__ __forceinline__ void gather_rows(const char *mine, uint32_t bits, int lane, Dst dst) {
#pragma unroll
  for (int j = 0; j < N; j++) {
    const char *src = (const char *)__shfl_sync(0xffffffffu, (uintptr_t)mine, SRC * j);
    const bool v = (bits >> j) & 1;
#pragma unroll
    for (int k = 0; k < (CHUNKS + 31) / 32; k++) {
      const int c = lane + 32 * k;
      if (c < CHUNKS)
        pmla_kv::cp16(dst(j, c), src + (v ? c * 16 : 0), v);
    }
  }
}
/* tokens pos0 + [0, 64) that lie before lim */
__device__ __forceinline__ uint64_t before64(int lim, int pos0) {
  if (lim <= pos0)
    return 0;
  return lim - pos0 >= 64 ? ~0ull : (1ull << (lim - pos0)) - 1;
}
/* the last KV position + 1 that row i of an item attends: causal (query
 * token i / H of qlen, the request's KV length len) and within the item's
 * KV range. A padding row past the item's rows (its Q is zero, its
 * results never stored) attends the whole range, so that it leaves the
 * softmax's unmasked path to every block whose tokens are all valid for
 * the real rows: head counts that are not a multiple of the tile's rows
 * then cost what full tiles do. */
__device__ __forceinline__ int row_limit(int i, int rows_item, int H, int len, int qlen, int ke) {
  const int causal = len - qlen + 1 + i / H;
  return i < rows_item && causal < ke ? causal : ke;
}
/* A row's running maximum m (scaled, log2 units) after a block whose
 * maximum is mx; *muse: the maximum P is taken against (0 for a row still
 * at -inf), *corr: the factor for what was summed so far. The maximum
 * moves only when a block exceeds it by more than RESCALE_SLACK: P then
 * stays below 2^RESCALE_SLACK, which bf16 and the fp32 sums hold with the
 * same relative precision, and O is rescaled far less often (a row starting
 * at -inf always moves: the difference is +inf). */
__device__ __forceinline__ void move_max(float &m_run, float mx, float *muse, float *corr) {
  float m = fmaxf(m_run, mx);
  if (m - m_run <= RESCALE_SLACK)
    m = m_run;
  *muse = m == -INFINITY ? 0.f : m;
  *corr = fast_exp2(m_run - *muse);
  m_run = m;
}
/* Tiles whose block tokens are the wgmma M side (S^T = K Q^T, O^T +=
 * V^T P^T; body_pp's NARROW form and the narrow E4M3 body): element e of a
 * thread's m64nN tile (N / 2 values) sits at M index 16 w + lane / 4 + 8
 * ((e >> 1) & 1) (w: the warp in its warpgroup) and column nar_col(lane,
 * nar_k(e)); a thread holds N / 4 columns. */
__device__ __forceinline__ int nar_k(int e) { return 2 * (e >> 2) + (e & 1); }
__device__ __forceinline__ int nar_col(int lane, int k) {
  return 8 * (k >> 1) + 2 * (lane & 3) + (k & 1);
}
/* max / sum over the eight lanes of a warp that share lane & 3 */
__device__ __forceinline__ float col_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
}
__device__ __forceinline__ float col_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 4);
  v += __shfl_xor_sync(0xffffffffu, v, 8);
  return v + __shfl_xor_sync(0xffffffffu, v, 16);
}
/* O^T *= corr by column (c: the thread's NC / 4 columns); skipped when no
 * column of the warp moved */
template <int NC> __device__ __forceinline__ void nar_scale_o(float (&o)[2 * NC], const float *c) {
  bool moved = false;
#pragma unroll
  for (int k = 0; k < NC / 4; k++)
    moved |= c[k] != 1.f;
  if (!__any_sync(0xffffffffu, moved))
    return;
#pragma unroll
  for (int e = 0; e < 2 * NC; e++)
    o[e] *= c[nar_k(e & (NC / 2 - 1))];
}
/* The end of an item for warpgroup 0 of a narrow tile: the columns' sums
 * over its four warps (through sMx's half for parity nblk & 1, free since
 * every warp has passed the last block's barrier 7), then each column's
 * running maximum and sum into sM and sL */
template <int NC>
__device__ __forceinline__ void nar_row_stats(float *sMx, const float (&m_run)[NC / 4],
                                              float (&l_run)[NC / 4], float *sM, float *sL,
                                              int nblk, int wi, int lane) {
  float *sb = sMx + (nblk & 1) * 4 * NC;
#pragma unroll
  for (int k = 0; k < NC / 4; k++) {
    l_run[k] = col_sum(l_run[k]);
    if (lane < 4)
      sb[wi * NC + nar_col(lane, k)] = l_run[k];
  }
  asm volatile("bar.sync 7, 128;\n" ::: "memory");
  if (wi == 0 && lane < 4) {
#pragma unroll
    for (int k = 0; k < NC / 4; k++) {
      const int c = nar_col(lane, k);
      sM[c] = m_run[k];
      sL[c] = sb[c] + sb[NC + c] + sb[2 * NC + c] + sb[3 * NC + c];
    }
  }
}
/* one warp sends an item's staged rows (Staged, at sO) by bulk copies to
 * out (bf16) or to the item's partial slot (fp32) */
__device__ __forceinline__ void send_staged(const pmla_gpu_problem &p, const char *sO,
                                            int32_t pslot, int32_t qb, int row0, int nrows,
                                            int lane) {
  const int H = p.num_heads;
  const int rowb = pslot >= 0 ? Staged<true>::ROW : Staged<false>::ROW;
  const int stride = pslot >= 0 ? Staged<true>::STRIDE : Staged<false>::STRIDE;
  char *dst = pslot >= 0
                  ? (char *)(p.partial_out + ((int64_t)pslot * p.max_q_len * H + row0) * PMLA_V_DIM)
                  : (char *)(p.out + ((int64_t)qb * H + row0) * PMLA_V_DIM);
  for (int rr = lane; rr < nrows; rr += 32)
    pmla_sm90::bulk_store(dst + (int64_t)rr * rowb, pmla_mma::smem_u32(sO) + rr * stride, rowb);
  pmla_sm90::bulk_commit();
}
/* the lse of row tid of the tile (tid < nrows); in a folding item it
 * replaces the accumulator's, which fold_into_o reads first */
template <bool FOLD>
__device__ __forceinline__ void store_lse(const pmla_gpu_problem &p, const float *sM,
                                          const float *sL, int tid, int nrows, int32_t pslot,
                                          int32_t qb, int row0, int32_t flags) {
  const int H = p.num_heads;
  const int64_t obase =
      pslot >= 0 ? (int64_t)pslot * p.max_q_len * H + row0 : (int64_t)qb * H + row0;
  const int64_t fbase = (int64_t)qb * H + row0;
  const bool fold = FOLD && pslot >= 0 && (flags & PMLA_WI_FOLD), final = flags & PMLA_WI_FINAL;
  if (tid < nrows) {
    float l = sL[tid];
    float lse = row_lse(sM[tid], l);
    if (fold) {
      const pmla_fold_w fw = pmla_fold_weights(p.partial_lse[obase + tid], lse);
      if (!final)
        p.partial_lse[obase + tid] = fw.lse;
      else if (p.lse)
        p.lse[fbase + tid] = fw.lse;
    } else if (pslot >= 0) {
      p.partial_lse[obase + tid] = lse;
    } else if (p.lse) {
      p.lse[obase + tid] = lse;
    }
  }
}
#endif /* PMLA_SM90_DEVICE */

} /* namespace pmla_sm90_parts */
#endif
