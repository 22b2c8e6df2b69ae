/* SPDX-License-Identifier: MIT */
/* decode_sm90.hip - the persistent split-KV MLA decode kernel for 64-row
 * head tiles on sm_90a: wgmma from shared-memory descriptors, whole-page
 * KV blocks by TMA. Same work items, masking and outputs as decode_mma.hip.
 * Tiles of at most 16 rows take the NARROW form of the same body (the
 * block's tokens as the wgmma M side; see nar_k below); the rest of this
 * comment describes the 64-row form.
 *
 * Shared memory holds every 576-dim row (Q and each of two KV stages) as 9
 * column blocks of 64 rows x 64 16-bit values (128 B; bf16, or f16 for an
 * E4M3 cache), each block in the canonical
 * K-major 128-byte-swizzle layout (16-byte chunk j of row r at chunk
 * j ^ (r & 7); blocks 1024-byte aligned): the layout TMA writes with
 * CU_TENSOR_MAP_SWIZZLE_128B and the cp.async gather reproduces. Per
 * 64-token block:
 *   QK  warpgroup 0: S[64 x 64] = 36 wgmma m64n64k16, A = Q and B = K
 *       straight from shared memory through descriptors
 *   P   exp2(S - m) as bf16 (f16), kept in warpgroup 0's registers and stored
 *       into the stage's rope block (block 8: 64 rows x 64 tokens, the same
 *       swizzled layout, free once QK is done) for warpgroup 1; m, the
 *       running row maximum, moves only when a block exceeds it by more
 *       than RESCALE_SLACK, so O is rarely rescaled
 *   PV  warpgroup g: O[64 x 256] (columns 256g..) += P V, 4 wgmma
 *       m64n256k16 with V read MN-major (transposed B) from the stage; P
 *       from registers (warpgroup 0) or the rope block (warpgroup 1)
 * Warpgroup 1 also loads: on 64-row tiles a block that is one whole valid
 * page-aligned run of 64 slots (page sizes that are multiples of 64) as
 * nine TMA boxes from one thread, issued before the per-token bookkeeping
 * (from block 2 on in two parts: boxes 0-3 once warpgroup 0's P V of the
 * stage's last block is done, 4-8 once the loader's own is);
 * any other block (partial, invalid slots, page sizes 1 / 16, top-k
 * gathers, every block of a NARROW tile) by cp.async with zero fill, a
 * warp's 32 lanes over one row at a time, published while the loader's own
 * P V of the block before runs. Generic-proxy writes (cp.async, P stores,
 * converted FP8 tiles) are made visible to the wgmma async proxy with
 * fence.proxy.async before the barrier that publishes them.
 *
 * FP8 caches. E4M3: the loader reads each half-block's rows as stored
 * into registers (four threads a row, one half-block in flight), converts
 * them into the block's 16-bit stage itself, the first half once the stage
 * is free and the second under its P V of the block before, and publishes
 * the block with the bf16 hand-offs (FULL / EMPTY below); the block, its Q
 * and P are f16 (kv_load.h). DS_MLA, whose conversion takes several times
 * the instructions: the rows stream by cp.async into raw half-blocks in
 * the second stage's room, and both warpgroups convert each block into the
 * first stage once the block before is done with it (two named barriers
 * per block replace FULL / EMPTY).
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
 *   DONE         mbarrier: wg0's 128 threads arrive once an item's row sums
 *                are written; wg1 waits before the epilogue reads them
 * An item's epilogue (bf16 out or an fp32 partial) stages the normalised O
 * in the two stages, row for row as in global memory, and one loader warp
 * sends the rows with bulk copies; the loader waits for them to be read
 * before the next item's first block enters the stages. In the default
 * mode an item followed by another that its tile serves leaves stage 0 to
 * that item's block 0, copied before the epilogue (B0_NEXT): it stages bf16
 * rows in stage 1 alone and writes fp32 rows from registers. A batch-invariant
 * chunk that a later chunk of the work-group folds leaves O from registers
 * in the threads' own order instead (keep_o), and the folding chunk reads
 * it back into registers (fold_into_o). Adjacent such chunks of one request
 * run as one stream of blocks with that epilogue between them (RUNS).
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

#include <type_traits>

#include "config.h"
#include "hip_compat.h"
#include "fold.h"
#include "kv_load.h"
#include "kv_map.h"
#include "launch.h"
#include "mla_gpu.h"
#include "mma.h"
#include "pdl.h"
#include "plan_invariant.h"
#include "sm90.h"
#include "sm90_parts.h"
#include <cudaTypedefs.h> /* CUtensorMap, PFN_cuTensorMapEncodeTiled */

namespace {
using namespace pmla_sm90_parts;

constexpr int BLK = 64 * 128; /* one column block: 64 rows x 128 B */
constexpr int TILE = 9 * BLK; /* 64 rows x 576 bf16 */
constexpr int PITCH = PMLA_TILE_PITCH;
constexpr size_t SMEM = 1024 /* alignment slack */ + 3 * (size_t)TILE +
                        sizeof(float) * 8 * ROWS + sizeof(int) * 2 * BN;
static_assert(SMEM <= 232448, "shared memory per block (sm_90)");
/* Tiles of fewer rows keep plain KV loads, never L2's first evictions
 * (kv_first in body_pp, KV_FIRST steps in pmla_launch_decode_sm90): near
 * the copy bandwidth the hint cost more than it kept. */
constexpr int KV_FIRST_MIN_ROWS = 33;

#ifdef PMLA_SM90_DEVICE
using namespace pmla_mma;
using namespace pmla_kv;
using namespace pmla_sm90;

constexpr int KSTEPS = PMLA_QK_DIM / 16;

/* byte offset of 16-byte chunk c (0..71) of row r (0..63) */
__device__ __forceinline__ uint32_t off(int r, int c) {
  return (uint32_t)((c >> 3) * BLK + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}
/* boxes [C0, C1) of a whole 64-token block (nine 64-column boxes) into the
 * stage at dst; with evict_first, its lines are the first L2 evicts
 * (kv_first below) */
template <int C0 = 0, int C1 = 9>
__device__ __forceinline__ void tma_block(uint32_t dst, const CUtensorMap *map, int64_t slot,
                                          uint32_t bar, bool evict_first) {
  if (evict_first) {
    const uint64_t pol = l2_evict_first();
#pragma unroll
    for (int c = C0; c < C1; c++)
      tma_box_hint(dst + c * BLK, map, c * 64, (int)slot, bar, pol);
  } else {
#pragma unroll
    for (int c = C0; c < C1; c++)
      tma_box(dst + c * BLK, map, c * 64, (int)slot, bar);
  }
}

/* Softmax helpers of the 64-row bodies. Element e of a thread's S
 * accumulator holds row myrow[(e >> 1) & 1], token 8 (e >> 2) + 2 (lane & 3)
 * + (e & 1) of the block. */

/* masks S in place (raw scores; -inf where a token is invalid or causally
 * after the row) and returns the row maxima scaled to base 2. A block of
 * valid tokens that both rows attend whole skips the per-token masks with
 * one test (their shifts and selects sat on warpgroup 0's chain every
 * block) */
__device__ __forceinline__ void wg_mask_max(float (&s)[32], float (&mx)[2], uint64_t vm, int pos0,
                                            const int (&lim)[2], const float (&sc)[2], int lane) {
  uint64_t rm[2];
  const uint64_t mine = 0x0303030303030303ull; /* this thread's columns */
  if (!(vm == ~0ull && pos0 + 64 <= min(lim[0], lim[1]))) {
#pragma unroll
    for (int sl = 0; sl < 2; sl++)
      rm[sl] = (vm & before64(lim[sl], pos0)) >> ((lane & 3) << 1);
    if ((rm[0] & rm[1] & mine) != mine) {
#pragma unroll
      for (int e = 0; e < 32; e++) {
        const int sl = (e >> 1) & 1;
        if (!((rm[sl] >> ((e >> 2) * 8 + (e & 1))) & 1))
          s[e] = -INFINITY;
      }
    }
  }
  /* each row's 16 values as a tree of maxima: four dependent steps where
   * a chain takes sixteen (the softmax runs one warp per scheduler, so
   * each step's latency is paid) */
  float t[2][8];
#pragma unroll
  for (int sl = 0; sl < 2; sl++)
#pragma unroll
    for (int i = 0; i < 8; i++) /* elements 4 i + sl * 2 + {0, 1} */
      t[sl][i] = fmaxf(s[4 * i + 2 * sl], s[4 * i + 2 * sl + 1]);
#pragma unroll
  for (int sl = 0; sl < 2; sl++) {
#pragma unroll
    for (int i = 0; i < 4; i++)
      t[sl][i] = fmaxf(t[sl][i], t[sl][i + 4]);
#pragma unroll
    for (int i = 0; i < 2; i++)
      t[sl][i] = fmaxf(t[sl][i], t[sl][i + 2]);
    t[sl][0] = fmaxf(t[sl][0], t[sl][1]);
  }
  mx[0] = t[0][0];
  mx[1] = t[1][0];
#pragma unroll
  for (int sl = 0; sl < 2; sl++)
    mx[sl] = row_max(mx[sl]) * sc[sl];
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
static_assert(ROWS * Staged<true>::STRIDE <= 2 * TILE, "staged O fits the two stages");
static_assert(ROWS * Staged<false>::STRIDE <= TILE, "staged bf16 O fits one stage");
/* this warpgroup's O times inv[sl] (by row) into rows of fp32 (PARTIAL)
 * or bf16, row rl of the tile starting at row_at(rl) */
template <bool PARTIAL, typename RowAt>
__device__ __forceinline__ void put_rows(RowAt row_at, const float (&o)[128], const float (&inv)[2],
                                         int g, int lane, const int (&myrow)[2], int nrows) {
#pragma unroll
  for (int sl = 0; sl < 2; sl++) {
    const int rl = myrow[sl];
    if (rl >= nrows)
      continue;
    char *row = row_at(rl);
#pragma unroll
    for (int j = 0; j < 32; j++) {
      const int col = g * 256 + j * 8 + ((lane & 3) << 1);
      const float v0 = o[4 * j + 2 * sl] * inv[sl], v1 = o[4 * j + 2 * sl + 1] * inv[sl];
      if (PARTIAL)
        *(float2 *)(row + col * 4) = make_float2(v0, v1);
      else
        *(uint32_t *)(row + col * 2) = pack_bf16x2(v0, v1);
    }
  }
}
/* put_rows into the staged rows (Staged) */
template <bool PARTIAL>
__device__ __forceinline__ void stage_rows(char *sO, const float (&o)[128], const float (&inv)[2],
                                           int g, int lane, const int (&myrow)[2], int nrows) {
  put_rows<PARTIAL>([&](int rl) { return sO + rl * Staged<PARTIAL>::STRIDE; }, o, inv, g, lane,
                    myrow, nrows);
}
/* the factors that normalise this thread's two rows of O (0 past nrows) */
__device__ __forceinline__ void row_factors(float (&inv)[2], const float *sL,
                                            const int (&myrow)[2], int nrows, float out_scale) {
#pragma unroll
  for (int sl = 0; sl < 2; sl++)
    inv[sl] = myrow[sl] < nrows ? pmla_sum_scale(out_scale, sL[myrow[sl]]) : 0.f;
}
/* this warpgroup's normalised O into the staged rows */
template <bool PARTIAL>
__device__ __forceinline__ void stage_o(char *sO, const float (&o)[128], const float *sL, int g,
                                        int lane, const int (&myrow)[2], int nrows,
                                        float out_scale) {
  float inv[2];
  row_factors(inv, sL, myrow, nrows, out_scale);
  stage_rows<PARTIAL>(sO, o, inv, g, lane, myrow, nrows);
}
/* A batch-invariant accumulator that only this work-group's later chunks
 * fold (PMLA_WI_KEEP) is kept in the order of the thread's fragments, not
 * as rows: thread (g, lane) holds columns g * 256 + 8 j + 2 (lane & 3)
 * + {0, 1} of its rows (j = 0..31), and the pair j = 2 i, 2 i + 1 sits as
 * one 16-byte word at g * 256 + 16 i + 4 (lane & 3) of the row's 512. Each
 * thread writes and later reads back its own words from registers: no
 * staging in the stages, which the next chunk's first block then finds
 * free, and no barrier between the chunks' epilogues. */
__device__ __forceinline__ float *kept_words(const pmla_gpu_problem &p, int64_t orow, int g,
                                             int lane) {
  return p.partial_out + orow * PMLA_V_DIM + g * 256 + ((lane & 3) << 2);
}
/* How item b continues item a in one run of body_pp (RUNS): the same
 * request and query rows, b's chunk right after a's, which is a whole
 * number of blocks, and either RUN_FOLD (a kept in a slot that b folds) or
 * RUN_PIECES (both pieces for the reduce, in consecutive slots); 0: not. */
enum { RUN_FOLD = 1, RUN_PIECES = 2 };
__device__ __forceinline__ int chained(const int32_t *a, const int32_t *b) {
  const int32_t n = a[PMLA_WI_KV_END] - a[PMLA_WI_KV_BEGIN];
  const int32_t sa = a[PMLA_WI_PARTIAL], sb = b[PMLA_WI_PARTIAL];
  const int32_t fa = a[PMLA_WI_PIECE] & ~PMLA_WI_CHUNK_MASK,
                fb = b[PMLA_WI_PIECE] & ~PMLA_WI_CHUNK_MASK;
  if (a[PMLA_WI_REQUEST] != b[PMLA_WI_REQUEST] || a[PMLA_WI_Q_BEGIN] != b[PMLA_WI_Q_BEGIN] ||
      a[PMLA_WI_Q_END] != b[PMLA_WI_Q_END] || sa < 0 || b[PMLA_WI_KV_BEGIN] != a[PMLA_WI_KV_END] ||
      b[PMLA_WI_KV_END] <= b[PMLA_WI_KV_BEGIN] || n <= 0 || n % BN != 0)
    return 0;
  if (sb == sa && (fa & PMLA_WI_KEEP) && (fb & PMLA_WI_FOLD))
    return RUN_FOLD;
  return fa == 0 && fb == 0 && sb == sa + 1 ? RUN_PIECES : 0;
}
/* this warpgroup's normalised O as rows of fp32 partial from registers:
 * a run's piece before its last, whose stages hold the next chunk's first
 * block, or a piece whose stage 0 holds the next item's (B0_NEXT); the
 * values stage_o<true> would stage */
__device__ __forceinline__ void rows_o(const pmla_gpu_problem &p, const float (&o)[128],
                                       const float *sL, int g, int lane, const int (&myrow)[2],
                                       int nrows, int64_t obase, float out_scale) {
  float inv[2];
  row_factors(inv, sL, myrow, nrows, out_scale);
  put_rows<true>([&](int rl) { return (char *)(p.partial_out + (obase + rl) * PMLA_V_DIM); }, o,
                 inv, g, lane, myrow, nrows);
}
/* this warpgroup's O, times inv[sl] by row, kept (above); evict_last: the
 * next chunk reads it back after its whole KV stream has passed L2 */
__device__ __forceinline__ void keep_o(const pmla_gpu_problem &p, const float (&o)[128],
                                       const float (&inv)[2], int g, int lane,
                                       const int (&myrow)[2], int nrows, int64_t obase) {
  const uint64_t pol = l2_evict_last();
#pragma unroll
  for (int sl = 0; sl < 2; sl++) {
    if (myrow[sl] >= nrows)
      continue;
    float *w = kept_words(p, obase + myrow[sl], g, lane);
    const float f = inv[sl];
#pragma unroll
    for (int i = 0; i < 16; i++)
      st_f4_hint(w + 16 * i,
                 make_float4(o[8 * i + 2 * sl] * f, o[8 * i + 2 * sl + 1] * f,
                             o[8 * i + 4 + 2 * sl] * f, o[8 * i + 5 + 2 * sl] * f),
                 pol);
  }
}
/* A batch-invariant item with PMLA_WI_FOLD: this warpgroup's O becomes the
 * fold (fold.h) of the kept accumulator (its lse in the slot's) and its
 * own normalised result, in registers. */
__device__ __forceinline__ void fold_into_o(const pmla_gpu_problem &p, float (&o)[128],
                                            const float *sM, const float *sL, int g, int lane,
                                            const int (&myrow)[2], int nrows, int64_t obase,
                                            float out_scale, bool final) {
  /* read once more only if this fold keeps it again */
  const uint64_t pol = final ? l2_evict_first() : l2_evict_last();
  constexpr int FLY = 8; /* words in flight a thread (16 measured no faster) */
#pragma unroll
  for (int sl = 0; sl < 2; sl++) {
    const int rl = myrow[sl];
    if (rl >= nrows)
      continue;
    const float l = sL[rl], inv = pmla_sum_scale(out_scale, l);
    const pmla_fold_w fw = pmla_fold_weights(p.partial_lse[obase + rl], row_lse(sM[rl], l));
    const float *w = kept_words(p, obase + rl, g, lane);
#pragma unroll
    for (int h = 0; h < 16 / FLY; h++) {
      float4 a[FLY];
#pragma unroll
      for (int i = 0; i < FLY; i++)
        a[i] = ld_f4_hint(w + 16 * (FLY * h + i), pol);
#pragma unroll
      for (int i = 0; i < FLY; i++) {
        float *e = o + 8 * (FLY * h + i) + 2 * sl;
        e[0] = pmla_fold(a[i].x, e[0] * inv, fw);
        e[1] = pmla_fold(a[i].y, e[1] * inv, fw);
        e[4] = pmla_fold(a[i].z, e[4] * inv, fw);
        e[5] = pmla_fold(a[i].w, e[5] * inv, fw);
      }
    }
  }
}
/* Tiles of at most 16 rows (NARROW): the 64 tokens of a block are the M
 * side of every wgmma, so no MMA works on padding rows. S^T = K Q^T is 36
 * m64n16k16 (A = the K tile, B = Q), its softmax runs down the columns
 * (one per row of the item), and O^T += V^T P^T is 16 m64n16k16 per
 * warpgroup (A = the stage's V read transposed, four 64-dim column blocks;
 * B = P^T, 16 rows of 64 tokens in the stage's rope block). Element
 * layout: nar_k / nar_col (sm90_parts.h). */
/* this warpgroup's O^T += V^T P^T for dims 256 g.. of the stage at aK (P^T
 * in its rope block), issued and committed */
template <bool F16>
__device__ __forceinline__ void nar_pv(float (&o)[32], uint32_t aK, int g) {
  const uint64_t dv = desc(aK, BLK, 1024), dp = desc(aK + 8 * BLK, 16, 1024);
  wg_fence();
#pragma unroll
  for (int m = 0; m < 4; m++)
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++)
      mma_n16_ta<F16>(o + 8 * m, desc_at(dv, (4 * g + m) * BLK + kk * 16 * 128),
                      desc_at(dp, kk * 32));
  wg_commit();
}
/* the epilogue's staging (stage_o) for NARROW tiles: row c of the item is
 * column c of O^T */
template <bool PARTIAL>
__device__ __forceinline__ void nar_stage_o(char *sO, const float (&o)[32], const float *sL, int g,
                                            int wi, int lane, int nrows, float out_scale) {
#pragma unroll
  for (int k = 0; k < 4; k++) {
    const int c = nar_col(lane, k);
    if (c >= nrows)
      continue;
    const float l = sL[c], inv = pmla_sum_scale(out_scale, l);
    char *row = sO + c * Staged<PARTIAL>::STRIDE;
#pragma unroll
    for (int e = 0; e < 32; e++) {
      if (nar_k(e & 7) != k)
        continue;
      const int d = 256 * g + 64 * (e >> 3) + 16 * wi + (lane >> 2) + 8 * ((e >> 1) & 1);
      if (PARTIAL)
        *(float *)(row + d * 4) = o[e] * inv;
      else
        *(uint16_t *)(row + d * 2) = (uint16_t)(pack_bf16x2(o[e] * inv, 0.f) & 0xffffu);
    }
  }
}
/* KV_FIRST: every KV box is loaded as L2's first evictions (steps of few
 * requests, pmla_launch_decode_sm90). GATHER: top-k steps, whose blocks are
 * never whole pages, compiled without the whole-page path (with it, the
 * loop's schedule cost them 2% on the H200). SMALL: bf16 pages of 16 or 32
 * slots, each loader warp's 16 rows by TMA where they are one page's run
 * (the only kernels with that branch) */
template <int F, bool FOLD, bool NARROW, bool KV_FIRST, bool GATHER, bool SMALL>
__device__ __forceinline__ void body_pp(const pmla_gpu_problem &p, float scale_log2,
                                        const CUtensorMap *kv_tmap, int use_tma) {
  constexpr bool FP8 = F != PMLA_KV_BF16;
  static_assert(!(FOLD && NARROW), "the NARROW epilogue does not fold");
  static_assert(!(KV_FIRST && (FOLD || NARROW || FP8)), "KV_FIRST: default bf16 64-row tiles");
  /* E4M3 tiles (64 rows; fewer rows run decode_sm90_e4m3.hip) convert
   * from registers (REG8), DS_MLA tiles through the raw ring (RING) */
  constexpr bool REG8 = F == PMLA_KV_E4M3, RING = FP8 && !REG8;
  /* bf16 64-row tiles: a run of items that are one request's adjacent
   * chunks (chained: each kept for the next to fold, or each a piece for
   * the reduce: batch-invariant schedules, and the default mode's capped
   * sparse steps where a unit holds two pieces of a token) is read as one
   * stream of blocks.
   * Its chunks pass one at a time through the body and the epilogue, which
   * keeps, folds or writes each as its own item would (same bits), while
   * the next chunk's first block is already on its way into the other
   * stage: no item end and start between them. Compiled with this body the
   * default mode's kernel also ran its dense steps, which chain no items,
   * 1-2.6% faster on the H200 (docs/performance.md). */
  constexpr bool RUNS = F == PMLA_KV_BF16 && !NARROW;
  static_assert(!(REG8 && NARROW), "E4M3 runs 64-row tiles here");
  /* an E4M3 cache's tiles, Q and P are f16: one conversion per e4m3 pair,
   * unscaled e4m3 values exact; Q rescaled by rows to fit, its bf16 values
   * kept exactly (q_row_to_f16); P <= 2^RESCALE_SLACK keeps 11 bits down to
   * 2^-14 where bf16 keeps 8, fewer below, and 0 below 2^-25 (weights under
   * the tolerance's absolute term) */
  constexpr bool F16 = F == PMLA_KV_E4M3;
  /* RING: the cache's rows as stored stream by cp.async into NH raw
   * half-blocks of 32 rows in the second 16-bit stage's room (DS_MLA's
   * 656-byte rows: 3), and both warpgroups convert each block into the
   * first stage when the last block's P V is done with it. */
  constexpr int ROWB = KvFmt<F>::ROW_BYTES, HALF = BN / 2 * ROWB, NH = TILE / HALF;
  static_assert(!RING || NH >= 3, "a block converts while the next half lands");
  bool scale_ok;
  const float out_scale = kv_out_scale<F>(p, scale_ok);
  if (F == PMLA_KV_E4M3)
    scale_log2 *= out_scale;
  extern __shared__ __align__(1024) char smem_wg[];
  char *sQ = smem_wg + ((1024u - (smem_u32(smem_wg) & 1023u)) & 1023u);
  char *sKV = sQ + TILE;
  float *sCorr = (float *)(sKV + 2 * TILE); /* [2][ROWS], by block parity */
  float *sM = sCorr + 2 * ROWS;
  float *sL = sM + ROWS;
  uint64_t *sVm = (uint64_t *)(sL + ROWS); /* [2]: token validity bits by stage */
  const uint32_t aFull = smem_u32(sVm + 2);   /* [2] mbarriers: stage loaded */
  const uint32_t aPready = smem_u32(sVm + 4); /* [2] mbarriers: P(b) written */
  const uint32_t aDone = smem_u32(sVm + 6);   /* mbarrier: an item's row stats written */
  float *sQf = (float *)(sVm + 8);             /* F16: [ROWS] Q's row factors (q_row_to_f16) */
  uint64_t *sVr = sVm + 8 + ROWS / 2;          /* RING: [4] token validity bits by block & 3 */
  float *sMx = (float *)(sVr + 4); /* NARROW: [2][4 warps][16] column maxima, by block parity */
  char *sRaw = sKV + TILE;                     /* RING: [NH] raw half-blocks, half h in h % NH */
  /* RING: [2] mbarriers, by converted-block parity: every thread has read
   * the block's raw halves (ring_convert), so the loader may refill them */
  const uint32_t aRawRead = smem_u32(sMx + 128);

  const int tid = threadIdx.x, g = tid >> 7, wi = (tid >> 5) & 3, lane = tid & 31;
  /* whole pages by TMA: use_tma is 0 or 1, and 2 (pages of 16 or 32 slots)
   * in the SMALL kernels only */
  const bool whole_tma = !SMALL && use_tma != 0;
#if PMLA_WG_TMA
  /* warpgroup 1: boxes [C0, 9) of a whole-page KV block (its first slot:
   * first) into stage st by TMA, the bytes of all nine expected with box
   * 0; every token is then valid (one whole page), and the bits are written
   * before this thread's arrival (when it arrives) */
  auto page_boxes = [&](auto c0, int st, int64_t first, bool evict_first, bool arrive) {
    constexpr int C0 = decltype(c0)::value;
    const uint32_t bar = aFull + 8 * st;
    if (tid == 128) {
      if constexpr (C0 == 0)
        mbar_expect_tx(bar, TILE);
      tma_block<C0, 9>(smem_u32(sKV + st * TILE), kv_tmap, first, bar, evict_first);
    }
    if (lane == 0)
      ((uint16_t *)sVm)[st * 4 + wi] = 0xffffu;
    if (arrive)
      mbar_arrive(bar);
  };
  /* warpgroup 1, pages smaller than a block (use_tma == 2): this warp's 16
   * rows of the block, one page's run from slot first, as nine 16-row
   * boxes into stage st, their bytes expected by the warp's lane 0 before
   * it issues them (the stage's phase also waits for that lane's arrival) */
  auto group_boxes = [&](int st, int64_t first, bool evict_first, bool arrive) {
    const uint32_t bar = aFull + 8 * st;
    if (lane == 0) {
      mbar_expect_tx(bar, TILE / 4);
      const uint32_t dst = smem_u32(sKV + st * TILE) + 16 * wi * 128;
      const uint64_t pol = evict_first ? l2_evict_first() : 0;
#pragma unroll
      for (int c = 0; c < 9; c++) {
        if (evict_first)
          tma_box_hint(dst + c * BLK, kv_tmap, c * 64, (int)first, bar, pol);
        else
          tma_box(dst + c * BLK, kv_tmap, c * 64, (int)first, bar);
      }
      ((uint16_t *)sVm)[st * 4 + wi] = 0xffffu;
    }
    if (arrive)
      mbar_arrive(bar);
  };
#endif
  if (tid == 0) {
    mbar_init(aFull, 128);
    mbar_init(aFull + 8, 128);
    mbar_init(aPready, 128);
    mbar_init(aPready + 8, 128);
    mbar_init(aDone, 128);
    if (RING) {
      mbar_init(aRawRead, 256);
      mbar_init(aRawRead + 8, 256);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  uint32_t done_phase = 0; /* warpgroup 1: parity of aDone's next completion */
  uint32_t conv_before = 0; /* RING: blocks converted before the item */
  uint32_t wait_phase = 0; /* bit s: parity of the next completion of stage s's
                              barrier this side waits on (wg0 FULL, wg1 PREADY) */
  const int H = p.num_heads;
  const int u = blockIdx.y, row0 = blockIdx.x * ROWS;
  int32_t *errw = p.work_meta_data + PMLA_META_ERROR;
  const char *kvbase = (const char *)p.kv;
  const uint32_t aQ = smem_u32(sQ);
  const uint64_t dQ = desc(aQ, 16, 1024);
  int myrow[2];
  myrow[0] = wi * 16 + (lane >> 2);
  myrow[1] = myrow[0] + 8;
  enum { EMPTY = 5 }; /* named barrier ids 5, 6 */
  enum { CONV = 5 };  /* RING: named barrier ids 5, 6 (both warpgroups) */
  /* block b's 16-bit stage (RING blocks all convert into the first) */
  auto stage = [&](int b) { return sKV + (RING ? 0 : (b & 1) * TILE); };
  /* RING: block b's raw rows have landed (warpgroup 1 waited for its
   * copies) and both P V of block b - 1 are done: both warpgroups convert
   * it into the 16-bit stage */
  auto ring_convert = [&](int b) {
    nb_sync_split(CONV);
    RowLoad<F, 4> rl;
    const int row = tid >> 2;
    rl.load_raw(sRaw + (2 * b + (row >> 5)) % NH * HALF + (row & 31) * ROWB, tid & 3);
    /* the raw reads released to the loader's refill of these slots: barrier
     * CONV + 1 below orders them as well, but racecheck does not see that
     * (docs/racecheck/README.md) */
    mbar_arrive(aRawRead + 8 * ((conv_before + (uint32_t)b) & 1));
    rl.store(tid & 3, [&](int c) { return sKV + off(tid >> 2, c); });
    proxy_fence();
    nb_sync_split(CONV + 1);
  };

  /* the tile's Q rows of query tokens [qb, qe) into sQ by cp.async from the
   * 128 threads of one warpgroup (t: 0..127); rows past the item's are zero */
  auto load_q = [&](char *dst, int32_t qb, int32_t qe, int t) {
    const int rows = (qe - qb) * H - row0, nr = rows < ROWS ? rows : ROWS;
    const char *qsrc = (const char *)(p.q + ((int64_t)qb * H + row0) * PMLA_QK_DIM);
    for (int c = t; c < ROWS * PMLA_TILE_CHUNKS; c += 128) {
      const int rr = c / PMLA_TILE_CHUNKS, cc = c % PMLA_TILE_CHUNKS;
      const bool v = rr < nr;
      cp16(dst + off(rr, cc), v ? qsrc + (int64_t)rr * PITCH + cc * 16 : qsrc, v);
    }
  };
  const int t_q = tid & 127;
  int32_t q_rows[2] = {-1, -1}; /* the rows of Q in sQ */
  bool staged = false; /* warpgroup 1: the last item's O may still be leaving the stages */
  /* default-mode bf16 64-row tiles: an item followed by another that this
   * tile serves leaves stage 0 to that item's block 0, copied (when it is
   * a whole page) under the epilogue instead of after it: the epilogue
   * stages bf16 rows in stage 1 only and writes a partial's fp32 rows from
   * registers */
  constexpr bool B0_NEXT = F == PMLA_KV_BF16 && !NARROW && !FOLD && !GATHER;
  bool b0_pre = false; /* warpgroup 1: this item's block 0 is in stage 0 and published */
  /* bf16 64-row tiles: the next item's Q, when it has other rows, is copied
   * into sQ by warpgroup 0 once the item's last Q K^T is done, under the
   * last block and the epilogue, instead of at the next item's start */
  constexpr bool PREFETCH_Q = F == PMLA_KV_BF16 && !NARROW;
  bool q_pref = false; /* warpgroup 0: sQ holds this item's Q by its own cp.async */
  const int it_end = p.work_indptr[u + 1];
  auto item_at = [&](int k) { return p.work_info_set + (int64_t)k * PMLA_WI_WORDS; };
  for (int it = p.work_indptr[u]; it < it_end; it++) {
    const int32_t *w = item_at(it);
    const int32_t r = w[PMLA_WI_REQUEST], pslot = w[PMLA_WI_PARTIAL];
    const int32_t qb = w[PMLA_WI_Q_BEGIN], qe = w[PMLA_WI_Q_END];
    const int32_t kb = w[PMLA_WI_KV_BEGIN], len = w[PMLA_WI_KV_LEN];
    /* RUNS: the items chained to this one in one way (every one but the
     * last as long as the first) are read with it, and w becomes the last.
     * run: the blocks of each chunk but the last, times 4, plus 1 when the
     * first folds into an earlier item's accumulator, plus 2 for a run of
     * pieces; 0: one item */
    int32_t run = 0;
    if constexpr (RUNS) {
      const int32_t n0 = w[PMLA_WI_KV_END] - kb, fold0 = (w[PMLA_WI_PIECE] & PMLA_WI_FOLD) != 0;
      const int32_t *wl = w;
      const int how = it + 1 < it_end ? chained(w, item_at(it + 1)) : 0;
      /* every item but the last exactly as long as the first, the last no
       * longer: the passes below cut the run every n0 tokens (the default
       * planner's capped sparse pieces differ by a block) */
      while (how && it + 1 < it_end && wl[PMLA_WI_KV_END] - wl[PMLA_WI_KV_BEGIN] == n0 &&
             item_at(it + 1)[PMLA_WI_KV_END] - item_at(it + 1)[PMLA_WI_KV_BEGIN] <= n0 &&
             chained(wl, item_at(it + 1)) == how)
        wl = item_at(++it);
      if (wl != w)
        run = n0 / BN * 4 + (how == RUN_PIECES ? 2 : fold0);
      w = wl;
    }
    const int32_t ke = w[PMLA_WI_KV_END];
    const int qlen = qe - qb, rows_item = qlen * H;
    if (qlen <= 0 || row0 >= rows_item)
      continue;
    if (qb < 0 || qe > p.num_tokens || qlen > p.max_q_len) { /* the tiles cover max_q_len */
      if (tid == 0)
        atomicOr(errw, (int)PMLA_PLAN_ERR_QO_INDPTR);
      continue;
    }
    /* whether this tile serves an item of query tokens [b2, e2): it has rows
     * here and its tokens are in range (what the item loop tests above) */
    const auto serves = [&](int32_t b2, int32_t e2) {
      return e2 - b2 > 0 && row0 < (e2 - b2) * H && b2 >= 0 && e2 <= p.num_tokens &&
             e2 - b2 <= p.max_q_len;
    };
    /* the next item whose Q this item's warpgroup 0 copies (-1: none): the
     * one after it, when served and on other query rows */
    int32_t nq_b = -1, nq_e = -1;
    if (PREFETCH_Q && it + 1 < it_end) {
      const int32_t *wn = item_at(it + 1);
      const int32_t b2 = wn[PMLA_WI_Q_BEGIN], e2 = wn[PMLA_WI_Q_END];
      if (serves(b2, e2) && (b2 != qb || e2 != qe)) {
        nq_b = b2;
        nq_e = e2;
      }
    }
    const int nrows = rows_item - row0 < ROWS ? rows_item - row0 : ROWS;
    const int nblk = ke > kb && scale_ok ? (ke - kb + BN - 1) / BN : 0;
    /* B0_NEXT: the next item is served here and finds its Q in sQ (the
     * same rows, or warpgroup 0's copy): its block 0 may come early */
    bool b0_next = false;
    if (B0_NEXT && whole_tma && nblk > 0 && it + 1 < it_end) {
      const int32_t *wn = item_at(it + 1);
      const int32_t b2 = wn[PMLA_WI_Q_BEGIN], e2 = wn[PMLA_WI_Q_END];
      b0_next = serves(b2, e2) && wn[PMLA_WI_KV_END] > wn[PMLA_WI_KV_BEGIN];
    }
    /* KV read as the first lines L2 evicts, so that the partial slots'
     * lines outlive the KV streams between their write and their read:
     * every item of a KV_FIRST step, and a batch-invariant item of more
     * than 32 rows whose result goes through a slot (a chunk kept, folded
     * or left for the reduce). With the KV at the default priority the
     * H200 evicted the kept accumulators of b=64 L=8192 h=128 to DRAM (33
     * MB written a step). Not for tiles of fewer rows (KV_FIRST_MIN_ROWS),
     * nor for the default mode's fuller steps, which lost more on the
     * hinted loads than their few split items gained */
    const bool kv_first = KV_FIRST || (FOLD && pslot >= 0 && nrows >= KV_FIRST_MIN_ROWS);
    constexpr int OR = NARROW ? 32 : 128;
    /* consecutive items of one request (a batch-invariant request's chunks)
     * find its Q in shared memory already (F16: converted, unless the item
     * had no block to convert it with) */
    const bool q_new = qb != q_rows[0] || qe != q_rows[1];
    q_rows[0] = nblk == 0 ? -1 : qb; /* no block: Q is neither needed nor loaded */
    q_rows[1] = qe;
    /* the loader's state, kept from one chunk of a run to the next */
    int32_t raw_next = -1; /* bf16: the page entry of the next block to load */
    uint32_t pending = 0;  /* cp.async: bit s, stage s awaits our arrival after cp_wait */
    /* bf16 by TMA: the block whose boxes 0-3 are issued, 4-8 not yet (-1:
     * none), and its first slot */
    int32_t half_blk = -1;
    int64_t half_first = -1;
    /* chunk ci of the run: blocks [b0, b1) (one item: all of them) */
    for (int ci = 0, b0 = 0;; ci++) {
      const int b1 = run > 3 && b0 + (run >> 2) < nblk ? b0 + (run >> 2) : nblk;
      const bool last = b1 == nblk;
      float o[OR];
#pragma unroll
      for (int e = 0; e < OR; e++)
        o[e] = 0.f;

      if (g == 1) {
        /* ---------------- warpgroup 1: loader + PV columns 256.. */
        const int t = tid - 128;
        if (b0 == 0 && q_new && nblk > 0)
          load_q(sQ, qb, qe, t);
        const int32_t csr_first = (!p.map.topk && !p.map.block_table) ? p.map.kv_indptr[r] : 0;
        /* each loader warp gathers 16 tokens of a block; lane l (and l + 16)
         * holds the page entry and slot of token 16 wi + (l & 15) */
        const int ld_t = 16 * wi + (lane & 15);
        auto raw_at = [&](int blk) -> int32_t {
          int pos = kb + blk * BN + ld_t;
          return pos < ke ? kv_raw(p.map, r, pos, csr_first) : -1;
        };
        if (staged) {
          /* the stages held the last item's O: its bulk copies have read it */
          if (wi == 0)
            bulk_wait_read();
          asm volatile("bar.sync 4, 128;\n" ::: "memory");
          staged = false;
        }
        if (b0 == 0 && !RING)
          raw_next = raw_at(0);
        /* FP8: half-block h (32 rows of block h / 2), four threads a row: this
         * thread's row rt, its page entry raw_h read a half ahead */
        const int rt = t >> 2, rsub = t & 3;
        int32_t raw_h = -1;
        auto raw_of_half = [&](int h) -> int32_t {
          const int pos = kb + h * (BN / 2) + rt;
          return pos < ke ? kv_raw(p.map, r, pos, csr_first) : -1;
        };
        /* the slot of this thread's row of half h (-1: none; bad entries flagged) */
        auto half_slot = [&](int h) -> int64_t {
          const int pos = kb + h * (BN / 2) + rt;
          return pos < ke ? kv_slot(p.map, raw_h, pos, errw, rsub == 0 && blockIdx.x == 0) : -1;
        };
#if PMLA_WG_TMA
        /* boxes [C0, 9) of whole-page block blk (its first slot: first)
         * into stage st (page_boxes); block 0's arrival waits for Q */
        auto page_block = [&](auto c0, int blk, int st, int64_t first) -> bool {
          page_boxes(c0, st, first, kv_first, blk != 0);
          raw_next = raw_at(blk + 1);
          return blk == 0;
        };
#endif
        /* bf16: issues block blk into stage st; returns whether the loader
         * still has to arrive on the stage's barrier after its cp.async wait
         * (cp.async blocks, and block 0 whose wait also covers Q) */
        auto load_block = [&](int blk, int st) -> bool {
          const int pos = kb + blk * BN + ld_t;
#if PMLA_WG_TMA
          const int64_t first = !NARROW && !GATHER && whole_tma
                                    ? page_run_slot<BN>(p.map, raw_next, kb + blk * BN, ke)
                                    : -1;
          if (first >= 0)
            return page_block(std::integral_constant<int, 0>(), blk, st, first);
          /* pages of 16 or 32 slots: each warp's 16 rows by TMA where they
           * are one page's run */
          const int64_t gfirst =
              SMALL && !NARROW && !GATHER
                  ? page_run_slot<16>(p.map, raw_next, kb + blk * BN + 16 * wi, ke)
                  : -1;
          if (gfirst >= 0) {
            group_boxes(st, gfirst, kv_first, blk != 0);
            raw_next = raw_at(blk + 1);
            return blk == 0;
          }
#endif
          const int64_t slot =
              pos < ke ? kv_slot(p.map, raw_next, pos, errw, lane < 16 && blockIdx.x == 0) : -1;
          const uint32_t bits = __ballot_sync(0xffffffffu, slot >= 0) & 0xffffu;
          if (lane == 0)
            ((uint16_t *)sVm)[st * 4 + wi] = (uint16_t)bits;
          const char *mine = slot >= 0 ? kvbase + slot * ROWB : kvbase;
          char *dst = sKV + st * TILE;
          /* one row at a time (four L2 lines a copy rather than 32 bytes of
           * each of 16 rows) */
          gather_rows<16, PMLA_TILE_CHUNKS, 1>(
              mine, bits, lane, [&](int j, int c) { return dst + off(16 * wi + j, c); });
          raw_next = raw_at(blk + 1);
          return true;
        };
        /* this warpgroup's P V of block b, issued and committed */
        auto pv = [&](int b) {
          mbar_wait(aPready + 8 * (b & 1), (wait_phase >> (b & 1)) & 1);
          wait_phase ^= 1u << (b & 1);
          const uint32_t aK = smem_u32(stage(b));
          if constexpr (NARROW) {
            float c[4];
#pragma unroll
            for (int k = 0; k < 4; k++)
              c[k] = sCorr[(b & 1) * ROWS + nar_col(lane, k)];
            nar_scale_o<16>(o, c);
            reg_fence<OR>(o);
            nar_pv<F16>(o, aK, 1);
          } else {
            wg_scale_o(o, sCorr[(b & 1) * ROWS + myrow[0]], sCorr[(b & 1) * ROWS + myrow[1]]);
            reg_fence<128>(o);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++)
              mma_n256_tb<F16>(o, desc_at(desc(aK, 16, 1024), 8 * BLK + kk * 32),
                               desc_at(desc(aK, BLK, 1024), 4 * BLK + kk * 16 * 128));
            wg_commit();
          }
        };
        if constexpr (RING) {
          /* half h into raw slot h % NH; its validity bits are byte
           * 4 (h & 1) + wi of its block's word */
          auto ring_issue = [&](int h) {
            const int64_t slot = half_slot(h);
            const bool v = slot >= 0;
            const uint32_t bits = token_bits<4>(v);
            if (lane == 0)
              ((uint8_t *)(sVr + ((h >> 1) & 3)))[(h & 1) * 4 + wi] = (uint8_t)bits;
            /* the warp's eight rows as stored, one at a time (lane 4 j holds
             * row j's slot) */
            const char *mine = v ? kvbase + slot * ROWB : kvbase;
            char *dst = sRaw + h % NH * HALF + 8 * wi * ROWB;
            gather_rows<8, ROWB / 16, 4>(mine, bits, lane,
                                         [&](int j, int c) { return dst + j * ROWB + c * 16; });
            raw_h = raw_of_half(h + 1);
          };
          /* one cp.async group per half (Q goes with half 0): block b's
           * halves are complete with NH - 2 groups left pending */
          const int halves = 2 * nblk;
          if (halves > 0)
            raw_h = raw_of_half(0);
          for (int h = 0; h < NH; h++) {
            if (h < halves)
              ring_issue(h);
            cp_commit();
          }
          for (int b = 0; b < nblk; b++) {
            cp_wait<(NH >= 2 ? NH - 2 : 0)>();
            ring_convert(b);
            if (2 * b + NH < halves) {
              const uint32_t G = conv_before + (uint32_t)b;
              mbar_wait(aRawRead + 8 * (G & 1), (G >> 1) & 1);
            }
            for (int h = 2 * b + NH; h < 2 * b + NH + 2; h++) {
              if (h < halves)
                ring_issue(h);
              cp_commit();
            }
            pv(b);
            wg_wait0();
            reg_fence<OR>(o);
          }
        } else if constexpr (REG8) {
          /* half h of the item as stored, in registers: one half in flight
           * at a time */
          RowLoad<F, 4> rl;
          bool rv = false;
          if (nblk > 0)
            raw_h = raw_of_half(0);
          auto fetch = [&](int h) {
            const int64_t slot = half_slot(h);
            rv = slot >= 0;
            rl.issue(rv ? kvbase + slot * ROWB : kvbase, rv, rsub);
            raw_h = raw_of_half(h + 1);
          };
          /* the fetched half converted into its block's stage (h / 2) & 1; the
           * first half of an item's new Q first waits for Q's copies and
           * rewrites Q as f16 */
          auto put = [&](int h) {
            const int st = (h >> 1) & 1;
            const uint32_t bits = token_bits<4>(rv);
            if (lane == 0)
              ((uint8_t *)(sVm + st))[(h & 1) * 4 + wi] = (uint8_t)bits;
            if (h == 0 && q_new) {
              cp_wait<0>();
              asm volatile("bar.sync 4, 128;\n" ::: "memory"); /* all of Q landed */
              const float f = q_row_to_f16<2>(t & 1, [&](int c) { return sQ + off(t >> 1, c); });
              if ((t & 1) == 0)
                sQf[t >> 1] = f;
            }
            const int row = (h & 1) * (BN / 2) + rt;
            rl.template store<true>(rsub, [&](int c) { return sKV + st * TILE + off(row, c); });
          };
          auto publish = [&](int blk) {
            proxy_fence();
            mbar_arrive(aFull + 8 * (blk & 1));
          };
          cp_commit(); /* Q's copies, if any: cp_wait covers committed groups only */
          if (nblk > 0) {
            fetch(0);
            put(0);
            fetch(1);
            put(1);
            publish(0);
            if (nblk > 1)
              fetch(2);
          }
          for (int b = 0; b < nblk; b++) {
            if (b + 1 < nblk) {
              /* stage (b + 1) & 1 held block b - 1: both its P V are done */
              if (b >= 1)
                nb_sync(EMPTY + ((b - 1) & 1));
              put(2 * b + 2);
              fetch(2 * b + 3);
            }
            pv(b);
            if (b + 1 < nblk) {
              put(2 * b + 3); /* under this P V */
              publish(b + 1);
              if (b + 2 < nblk)
                fetch(2 * b + 4);
            }
            wg_wait0();
            reg_fence<OR>(o);
          }
        } else {
          /* block blk's cp.async data has landed: make it visible to wgmma
           * and publish it */
          auto publish = [&](int blk) {
            cp_wait<0>();
            proxy_fence();
            mbar_arrive(aFull + 8 * (blk & 1));
            pending &= ~(1u << (blk & 1));
          };
          if (b0 == 0) {
            if (b0_pre) /* block 0 came under the last item's epilogue */
              raw_next = raw_at(1);
            else if (nblk > 0 && load_block(0, 0))
              pending = 1;
            b0_pre = false;
            cp_commit();
          }
          for (int b = b0; b < b1; b++) {
            if (pending & (1u << (b & 1)))
              publish(b);
            if (b + 1 < nblk) {
#if PMLA_WG_TMA
              if (half_blk == b + 1) {
                /* the rest of a whole-page block whose first boxes went
                 * in under the last P V: this warpgroup's P V of the stage's
                 * block before is done */
                page_block(std::integral_constant<int, 4>(), b + 1, (b + 1) & 1, half_first);
                half_blk = -1;
              } else
#endif
              {
                if (b >= 1)
                  nb_sync(EMPTY + ((b - 1) & 1));
                if (load_block(b + 1, (b + 1) & 1))
                  pending |= 1u << ((b + 1) & 1);
              }
            }
            cp_commit();
            pv(b);
            /* block b + 1 is published while this P V runs, not after it:
             * its landing wait is off warpgroup 0's path */
            if (pending & (1u << ((b + 1) & 1)))
              publish(b + 1);
#if PMLA_WG_TMA
            /* A whole-page block b + 2 goes into this block's stage in two
             * parts: boxes 0-3 (V's columns of warpgroup 0's P V) as soon as
             * warpgroup 0's P V of block b is done, while this warpgroup's
             * own, queued behind it, still reads boxes 4-8; those follow at
             * the next block's top */
            if (!NARROW && !GATHER && whole_tma && b + 2 < nblk) {
              const int64_t first = page_run_slot<BN>(p.map, raw_next, kb + (b + 2) * BN, ke);
              if (first >= 0) {
                nb_sync(EMPTY + (b & 1));
                if (t == 0) {
                  const uint32_t bar = aFull + 8 * (b & 1);
                  mbar_expect_tx(bar, TILE);
                  tma_block<0, 4>(smem_u32(sKV + (b & 1) * TILE), kv_tmap, first, bar, kv_first);
                }
                half_blk = b + 2;
                half_first = first;
              }
            }
#endif
            wg_wait0();
            reg_fence<OR>(o);
          }
        }
        cp_wait<0>();
        /* warpgroup 0's row sums, read in the epilogue: an acquire of their
         * release, besides the block barrier (racecheck does not see the
         * block barrier order these cross-warpgroup accesses) */
        mbar_wait(aDone, done_phase);
        done_phase ^= 1;
      } else if constexpr (NARROW) {
        /* ---------------- warpgroup 0, NARROW: S^T + softmax + O^T dims 0..255 */
        int lim[4];     /* by column: tokens before it are attended */
        float sc[4];    /* by column; F16: times Q's row factor */
        float m_run[4], l_run[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
          lim[k] = row_limit(row0 + nar_col(lane, k), rows_item, H, len, qlen, ke);
          sc[k] = scale_log2;
          m_run[k] = -INFINITY;
          l_run[k] = 0.f;
        }
        const int t0 = 16 * wi + (lane >> 2); /* this thread's tokens: t0, t0 + 8 */
        float s[8];
        for (int b = 0; b < nblk; b++) {
          if (RING)
            ring_convert(b);
          else {
            mbar_wait(aFull + 8 * (b & 1), (wait_phase >> (b & 1)) & 1);
            wait_phase ^= 1u << (b & 1);
          }
          char *sK = stage(b);
          const uint32_t aK = smem_u32(sK);
#pragma unroll
          for (int e = 0; e < 8; e++)
            s[e] = 0.f;
          reg_fence<8>(s);
          wg_fence();
#pragma unroll
          for (int ks = 0; ks < KSTEPS; ks++) {
            const uint32_t ko = (ks >> 2) * BLK + (ks & 3) * 32;
            mma_n16<F16>(s, desc_at(desc(aK, 16, 1024), ko), desc_at(dQ, ko));
          }
          wg_commit();
          if (F16 && b == 0) /* block 0 came with Q and its row factors */
#pragma unroll
            for (int k = 0; k < 4; k++)
              sc[k] = scale_log2 * sQf[nar_col(lane, k)];
          wg_wait0();
          reg_fence<8>(s);
          /* mask (raw scores; -inf where a token is invalid or causally after
           * the column's row), then the column maxima over the block: within
           * the warp by shuffles, across the four warps through sMx */
          const int pos0 = kb + b * BN;
          const uint64_t vm = RING ? sVr[b & 3] : sVm[b & 1];
          float mx[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
          for (int e = 0; e < 8; e++) {
            const int k = nar_k(e), t = t0 + 8 * ((e >> 1) & 1);
            if (!((vm & before64(lim[k], pos0)) >> t & 1))
              s[e] = -INFINITY;
            mx[k] = fmaxf(mx[k], s[e]);
          }
          float *mxb = sMx + (b & 1) * 64;
#pragma unroll
          for (int k = 0; k < 4; k++) {
            mx[k] = col_max(mx[k]);
            if (lane < 4)
              mxb[wi * 16 + nar_col(lane, k)] = mx[k];
          }
          /* also: every warp's S^T has read the rope block P^T overwrites */
          asm volatile("bar.sync 7, 128;\n" ::: "memory");
          float muse[4], corr[4], sum[4];
#pragma unroll
          for (int k = 0; k < 4; k++) {
            const int c = nar_col(lane, k);
            const float bm = fmaxf(fmaxf(mxb[c], mxb[16 + c]), fmaxf(mxb[32 + c], mxb[48 + c]));
            move_max(m_run[k], bm * sc[k], &muse[k], &corr[k]);
            sum[k] = 0.f;
            if (wi == 0 && lane < 4)
              sCorr[(b & 1) * ROWS + c] = corr[k];
          }
          /* P^T: row c of the rope block holds column c's 64 probabilities */
          char *sP = sK + 8 * BLK;
#pragma unroll
          for (int e = 0; e < 8; e++) {
            const int k = nar_k(e), c = nar_col(lane, k), t = t0 + 8 * ((e >> 1) & 1);
            const float pv = fast_exp2(fmaf(s[e], sc[k], -muse[k]));
            sum[k] += pv;
            const uint32_t pk = F16 ? pack_f16x2(pv, 0.f) : pack_bf16x2(pv, 0.f);
            *(uint16_t *)(sP + c * 128 + (((t >> 3) ^ (c & 7)) << 4) + ((t & 7) << 1)) =
                (uint16_t)(pk & 0xffffu);
          }
          proxy_fence();
          mbar_arrive(aPready + 8 * (b & 1));
          /* this warpgroup's P V reads every warp's P^T rows (B spans all 64
           * tokens), not only its own */
          asm volatile("bar.sync 7, 128;\n" ::: "memory");
#pragma unroll
          for (int k = 0; k < 4; k++)
            l_run[k] = l_run[k] * corr[k] + sum[k];
          nar_scale_o<16>(o, corr);
          reg_fence<32>(o);
          nar_pv<F16>(o, aK, 0);
          wg_wait0();
          reg_fence<32>(o);
          if (!RING && b + 2 < nblk)
            nb_arrive(EMPTY + (b & 1));
        }
        nar_row_stats<16>(sMx, m_run, l_run, sM, sL, nblk, wi, lane);
        mbar_arrive(aDone);
      } else {
        /* ---------------- warpgroup 0: QK + softmax + PV columns 0..255 */
        int lim[2];
#pragma unroll
        for (int s = 0; s < 2; s++)
          lim[s] = row_limit(row0 + myrow[s], rows_item, H, len, qlen, ke);
        float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
        float sc[2] = {scale_log2, scale_log2}; /* by row; F16: times Q's row factor */
        /* S(b) of block b: waits for the block, issues its 36 wgmma and
         * commits them as one group (not waited for here) */
        float s[32];
        auto issue_qk = [&](int b) {
          if (!RING) {
            mbar_wait(aFull + 8 * (b & 1), (wait_phase >> (b & 1)) & 1);
            wait_phase ^= 1u << (b & 1);
          }
          const uint32_t aK = smem_u32(stage(b));
#pragma unroll
          for (int e = 0; e < 32; e++)
            s[e] = 0.f;
          reg_fence<32>(s);
          wg_fence();
#pragma unroll
          for (int ks = 0; ks < KSTEPS; ks++) {
            uint32_t ko = (ks >> 2) * BLK + (ks & 3) * 32;
            mma_n64<F16>(s, desc_at(dQ, ko), desc_at(desc(aK, 16, 1024), ko));
          }
          wg_commit();
        };
        /* softmax of S(b), then this warpgroup's P V of block b, issued and
         * committed (not waited for) */
        auto softmax_pv = [&](int b, uint64_t vm) {
          char *sK = stage(b);
          const uint32_t aK = smem_u32(sK);
          const int pos0 = kb + b * BN;
          /* every warp's QK has read the rope block before P overwrites it */
          asm volatile("bar.sync 7, 128;\n" ::: "memory");

          float mx[2];
          wg_mask_max(s, mx, vm, pos0, lim, sc, lane);
          float muse[2], corr[2], sum[2] = {0.f, 0.f};
#pragma unroll
          for (int sl = 0; sl < 2; sl++) {
            move_max(m_run[sl], mx[sl], &muse[sl], &corr[sl]);
            if (row_leader(lane))
              sCorr[(b & 1) * ROWS + myrow[sl]] = corr[sl];
          }
          /* P(b) as 16-bit pairs: this warpgroup's P V reads them from
           * registers (pair e / 2 of S is A-fragment register e / 2 of its
           * k-step e / 8), warpgroup 1 from the stage's rope block */
          char *sP = sK + 8 * BLK;
          uint32_t pr[16];
#pragma unroll
          for (int e = 0; e < 32; e += 2) {
            int sl = (e >> 1) & 1, row = myrow[sl];
            int col = (e >> 2) * 8 + ((lane & 3) << 1);
            float p0 = fast_exp2(fmaf(s[e], sc[sl], -muse[sl]));
            float p1 = fast_exp2(fmaf(s[e + 1], sc[sl], -muse[sl]));
            sum[sl] += p0 + p1;
            pr[e >> 1] = F16 ? pack_f16x2(p0, p1) : pack_bf16x2(p0, p1);
            *(uint32_t *)(sP + row * 128 + (((col >> 3) ^ (row & 7)) << 4) + ((col & 7) << 1)) =
                pr[e >> 1];
          }
          /* P's stores made visible to warpgroup 1's P V: after this
           * warpgroup's own P V is queued (it reads P from registers, so the
           * tensor cores need not wait for the fence), but for DS_MLA, whose
           * next block both warpgroups convert once both P V are done, before
           * it (either order measured, docs/performance.md) */
          auto publish_p = [&] {
            proxy_fence();
            mbar_arrive(aPready + 8 * (b & 1));
          };
          if (RING)
            publish_p();
#pragma unroll
          for (int sl = 0; sl < 2; sl++) /* this lane's share: summed once, at the end */
            l_run[sl] = l_run[sl] * corr[sl] + sum[sl];
          wg_scale_o(o, corr[0], corr[1]);
          reg_fence<128>(o);
          wg_fence();
#pragma unroll
          for (int kk = 0; kk < BN / 16; kk++)
            mma_n256_rs<F16>(o, pr + 4 * kk, desc_at(desc(aK, BLK, 1024), kk * 16 * 128));
          wg_commit();
          if (!RING)
            publish_p();
        };
        /* this item's Q came by this warpgroup's copies: landed and visible
         * to wgmma from every thread before the first Q K^T */
        if (PREFETCH_Q && q_pref) {
          cp_wait<0>();
          proxy_fence();
          asm volatile("bar.sync 7, 128;\n" ::: "memory");
          q_pref = false;
        }
        /* bf16 and E4M3: the stage is released as soon as this warpgroup's
         * P V is done, so the loader can refill it while S(b + 1) is
         * computed; DS_MLA: the next block is converted once both P V are
         * done (ring_convert) */
        for (int b = b0; b < b1; b++) {
          if (RING)
            ring_convert(b);
          issue_qk(b);
          if (F16 && b == 0) /* block 0 came with Q and its row factors */
#pragma unroll
            for (int sl = 0; sl < 2; sl++)
              sc[sl] = scale_log2 * sQf[myrow[sl]];
          /* the block's token bits, read under its Q K^T */
          const uint64_t vm = RING ? sVr[b & 3] : sVm[b & 1];
          wg_wait0();
          reg_fence<32>(s);
          softmax_pv(b, vm);
          if (PREFETCH_Q && b == nblk - 1 && nq_b >= 0) {
            /* every Q K^T of the item is done (waited above) */
            load_q(sQ, nq_b, nq_e, t_q);
            cp_commit(); /* cp_wait covers committed groups only */
            q_pref = true;
          }
          wg_wait0();
          reg_fence<128>(o);
          if (!RING && b + 2 < nblk)
            nb_arrive(EMPTY + (b & 1));
        }
        if (PREFETCH_Q && nblk == 0 && nq_b >= 0) {
          load_q(sQ, nq_b, nq_e, t_q);
          cp_commit(); /* cp_wait covers committed groups only */
          q_pref = true;
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
        mbar_arrive(aDone);
      }
      __syncthreads();
      conv_before += RING ? (uint32_t)nblk : 0u;
#if PMLA_WG_TMA
      /* every P V of the item is done: the next item's block 0 into stage 0 */
      if (B0_NEXT && b0_next && last && g == 1) {
        const int32_t *wn = item_at(it + 1);
        const int32_t r2 = wn[PMLA_WI_REQUEST], kb2 = wn[PMLA_WI_KV_BEGIN];
        const int32_t csr2 = (!p.map.topk && !p.map.block_table) ? p.map.kv_indptr[r2] : 0;
        const int64_t first =
            page_run_slot<BN>(p.map, kv_raw(p.map, r2, kb2, csr2), kb2, wn[PMLA_WI_KV_END]);
        if (first >= 0) {
          page_boxes(std::integral_constant<int, 0>(), 0, first, KV_FIRST, true);
          b0_pre = true;
        }
      }
#endif

      /* the epilogue: O staged in the two stages, row for row, and sent by
       * bulk copies (out is 16-byte aligned: gpu_decode refuses it
       * otherwise); a folding item first folds the accumulator in */
      /* a folding run's chunks before its last are kept, those after its
       * first fold; a run of pieces writes each into its own slot, from
       * registers but the last (the stages hold the next chunk's block) */
      const int32_t cslot = run & 2 ? pslot + ci : pslot;
      const int32_t piece = !FOLD    ? 0
                            : last     ? w[PMLA_WI_PIECE]
                            : run & 2  ? 0
                                       : PMLA_WI_KEEP | (ci > 0 || (run & 1) ? PMLA_WI_FOLD : 0);
      /* B0_NEXT: stage 0 may hold the next item's block 0 */
      const bool b0_kept = B0_NEXT && b0_next && last;
      const bool rows_now = ((run & 2) && !last) || (b0_kept && cslot >= 0);
      char *const sO = b0_kept ? sKV + TILE : sKV;
      const bool fold = FOLD && cslot >= 0 && (piece & PMLA_WI_FOLD);
      const bool keep = FOLD && cslot >= 0 && (piece & PMLA_WI_KEEP);
      const int32_t dst = fold && (piece & PMLA_WI_FINAL) ? -1 : cslot; /* -1: out */
      const int64_t obase = (int64_t)cslot * p.max_q_len * H + row0;
      const float one[2] = {1.f, 1.f};
      if constexpr (NARROW) {
        if (cslot >= 0)
          nar_stage_o<true>(sKV, o, sL, g, wi, lane, nrows, out_scale);
        else
          nar_stage_o<false>(sKV, o, sL, g, wi, lane, nrows, out_scale);
      } else if (fold) {
        fold_into_o(p, o, sM, sL, g, lane, myrow, nrows, obase, out_scale, dst < 0);
        __syncthreads(); /* every accumulator lse read before store_lse replaces it */
        if (keep)
          keep_o(p, o, one, g, lane, myrow, nrows, obase);
        else if (dst >= 0)
          stage_rows<true>(sKV, o, one, g, lane, myrow, nrows);
        else
          stage_rows<false>(sKV, o, one, g, lane, myrow, nrows);
      } else if (keep) {
        float inv[2];
        row_factors(inv, sL, myrow, nrows, out_scale);
        keep_o(p, o, inv, g, lane, myrow, nrows, obase);
      } else if (rows_now) {
        rows_o(p, o, sL, g, lane, myrow, nrows, obase, out_scale);
      } else if (cslot >= 0) {
        stage_o<true>(sKV, o, sL, g, lane, myrow, nrows, out_scale);
      } else {
        stage_o<false>(sO, o, sL, g, lane, myrow, nrows, out_scale);
      }
      if (!keep && !rows_now) {
        proxy_fence();
        /* a folding item's slot held kept words, written and read by these
         * threads through the generic proxy; the bulk stores below may
         * overwrite them */
        if (fold)
          proxy_fence_global();
        __syncthreads();
        if (g == 1) {
          staged = true;
          if (wi == 0)
            send_staged(p, sO, dst, qb, row0, nrows, lane);
        }
      }
      store_lse<FOLD>(p, sM, sL, tid, nrows, cslot, qb, row0, piece);
      __syncthreads();
      if (last)
        break;
      b0 = b1;
    }
    if (PREFETCH_Q && nq_b >= 0) { /* sQ holds (or receives) the next item's Q */
      q_rows[0] = nq_b;
      q_rows[1] = nq_e;
    }
  }
  /* the bulk copies have read shared memory before the work-group leaves
   * (the kernel's end makes their writes visible to the next kernel) */
  if (staged && wi == 0)
    bulk_wait_read();
}
#endif /* PMLA_SM90_DEVICE */

/* kv_tmap: the KV cache as a [num_slots, 576] bf16 tensor map (64-column
 * boxes of 64 rows where use_tma == 1, of 16 where it is 2; 128B swizzle) */
template <int F, bool FOLD, bool NARROW, bool KV_FIRST, bool GATHER, bool SMALL>
__global__ void __launch_bounds__(NT, 1)
    pmla_decode_sm90_kernel(pmla_gpu_problem p, float scale_log2,
                            const __grid_constant__ CUtensorMap kv_tmap, int use_tma) {
#ifdef PMLA_SM90_DEVICE
  pdl_wait();
  pdl_trigger();
  body_pp<F, FOLD, NARROW, KV_FIRST, GATHER, SMALL>(p, scale_log2, &kv_tmap, use_tma);
#endif
}

/* cuTensorMapEncodeTiled, looked up once per process through the runtime
 * (the plugin links no libcuda; a function-local static is initialised
 * once even when builders start on several threads); NULL: no TMA, every
 * block takes the cp.async path */
PFN_cuTensorMapEncodeTiled_v12000 lookup_tensor_map_encoder() {
  cudaDriverEntryPointQueryResult q;
  void *f = nullptr;
  /* a failure clears only the error it set, never one the host had pending */
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                       &q) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return q == cudaDriverEntryPointSuccess ? (PFN_cuTensorMapEncodeTiled_v12000)f : nullptr;
}
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = lookup_tensor_map_encoder();
  return fn;
}
/* The KV cache as a 2-D tensor map for body_pp's page loads: 1 with
 * 64-row boxes (page size a multiple of 64: a block is one page's run), 2
 * with 16-row boxes (other multiples of 16: a loader warp's 16 rows are),
 * 0 when TMA does not apply (top-k gather, other page sizes, a cache the
 * map cannot describe). No L2 promotion: a box is 128 bytes of a
 * 1152-byte row, and promoting it to 256 bytes cost the memory-bound tiles
 * 4-5% of their time */
int kv_tensor_map(CUtensorMap *m, const pmla_gpu_problem &p) {
  PFN_cuTensorMapEncodeTiled_v12000 enc = tensor_map_encoder();
  const int rows = tma_box_rows(p.map.page_size);
  if (!PMLA_WG_TMA || !enc || p.kv_format != PMLA_KV_BF16 || p.map.topk || rows == 0 ||
      p.map.num_slots < rows || p.map.num_slots > INT32_MAX || ((uintptr_t)p.kv & 15) != 0)
    return 0;
  cuuint64_t dim[2] = {PMLA_QK_DIM, (cuuint64_t)p.map.num_slots};
  cuuint64_t stride[1] = {PITCH};
  cuuint32_t box[2] = {64, (cuuint32_t)rows}, estride[2] = {1, 1};
  if (enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)p.kv, dim, stride, box, estride,
          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
          CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
    return 0;
  return rows == BN ? 1 : 2;
}
template <int F, bool FOLD, bool NARROW, bool KV_FIRST, bool GATHER, bool SMALL>
hipError_t launch_kernel(const pmla_gpu_problem &p, int tiles, hipStream_t st,
                         const CUtensorMap &tmap, int use_tma) {
  static unsigned long long opted_in = 0;
  hipError_t e = pmla_opt_in_smem(
      (const void *)pmla_decode_sm90_kernel<F, FOLD, NARROW, KV_FIRST, GATHER, SMALL>, SMEM,
      &opted_in);
  if (e != hipSuccess)
    return e;
  /* head tiles on x: a unit's tiles are neighbouring blocks, started
   * together, so the second read of each KV block finds it in L2 (3% faster
   * at h = 128 than units on x) */
  const dim3 grid((unsigned)tiles, (unsigned)p.num_units);
  return pdl_launch(pmla_decode_sm90_kernel<F, FOLD, NARROW, KV_FIRST, GATHER, SMALL>, grid,
                    dim3(NT), SMEM, st, p, p.softmax_scale * pmla_mma::LOG2E_F, tmap, use_tma);
}
template <int F, bool FOLD, bool NARROW = false, bool KV_FIRST = false, bool GATHER = false>
hipError_t launch_decode_wg(const pmla_gpu_problem &p, int tiles, hipStream_t st) {
  CUtensorMap tmap;
  memset(&tmap, 0, sizeof tmap);
  /* NARROW tiles gather every block with cp.async: their steps are bound by
   * memory, and 128 loader threads' copies keep more reads in flight than
   * one thread's nine TMA boxes (docs/performance.md) */
  const int use_tma = NARROW || GATHER ? 0 : kv_tensor_map(&tmap, p);
  /* pages of 16 or 32 slots have kernels of their own: the 16-row boxes'
   * branch in the loader cost the whole-page steps 1% */
  if constexpr (F == PMLA_KV_BF16 && !NARROW && !GATHER)
    if (use_tma == 2)
      return launch_kernel<F, FOLD, NARROW, KV_FIRST, GATHER, true>(p, tiles, st, tmap, use_tma);
  return launch_kernel<F, FOLD, NARROW, KV_FIRST, GATHER, false>(p, tiles, st, tmap, use_tma);
}

} /* namespace */

void *pmla_sm90_tensor_map_encoder() { return (void *)tensor_map_encoder(); }

hipError_t pmla_launch_decode_sm90(const pmla_gpu_problem &p, int tiles, hipStream_t st) {
  /* the batch-invariant epilogue is a variant of its own: its registers
   * would otherwise spill in the default one */
  /* tiles of at most 16 rows (a step's rows: heads x query tokens) take
   * the NARROW body, outside the batch-invariant mode; an E4M3 cache with
   * at most 32 rows has a body of its own (decode_sm90_e4m3.hip) */
  const int64_t rows = (int64_t)p.num_heads * p.max_q_len;
  if (p.kv_format == PMLA_KV_E4M3 && rows <= 32 && !p.fold)
    return pmla_launch_decode_sm90_e4m3(p, tiles, st);
  const bool narrow = rows <= 16;
  switch (p.kv_format * 4 + (p.fold != 0) * 2 + (narrow && !p.fold)) {
  case PMLA_KV_DS_MLA * 4 + 1:
    return launch_decode_wg<PMLA_KV_DS_MLA, false, true>(p, tiles, st);
  case PMLA_KV_BF16 * 4 + 1:
    return launch_decode_wg<PMLA_KV_BF16, false, true>(p, tiles, st);
  case PMLA_KV_E4M3 * 4:
    return launch_decode_wg<PMLA_KV_E4M3, false>(p, tiles, st);
  case PMLA_KV_E4M3 * 4 + 2:
    return launch_decode_wg<PMLA_KV_E4M3, true>(p, tiles, st);
  case PMLA_KV_DS_MLA * 4:
    return launch_decode_wg<PMLA_KV_DS_MLA, false>(p, tiles, st);
  case PMLA_KV_DS_MLA * 4 + 2:
    return launch_decode_wg<PMLA_KV_DS_MLA, true>(p, tiles, st);
  default:
    if (p.fold)
      return launch_decode_wg<PMLA_KV_BF16, true>(p, tiles, st);
    /* A step whose rows fill at most half its work-groups' tiles splits
     * every request over two or more units (a lone or small batch of long
     * requests): nearly every item writes a partial, whose lines the KV
     * streams push out of L2 before the reduce reads them, so that step
     * loads its KV as L2's first evictions (H200: b=4 L=32768 h=128 81 ->
     * 79 us). Fuller steps keep the plain loads (a hinted box costs them
     * 0.3-1%). */
    if (rows >= KV_FIRST_MIN_ROWS &&
        p.num_tokens * p.num_heads * 2 <= (int64_t)ROWS * tiles * p.num_units)
      return launch_decode_wg<PMLA_KV_BF16, false, false, true>(p, tiles, st);
    /* top-k steps gather every block: a form without the whole-page path */
    if (p.map.topk)
      return launch_decode_wg<PMLA_KV_BF16, false, false, false, true>(p, tiles, st);
    return launch_decode_wg<PMLA_KV_BF16, false>(p, tiles, st);
  }
}

void pmla_sm90_prepare() { (void)tensor_map_encoder(); }

bool pmla_sm90_image_runs() {
  /* binaryVersion 90: the sm_90a image (the one with the body) runs here */
  cudaFuncAttributes fa;
  const void *k =
      (const void *)pmla_decode_sm90_kernel<PMLA_KV_BF16, false, false, false, false, false>;
  if (cudaFuncGetAttributes(&fa, k) != cudaSuccess) {
    cudaGetLastError(); /* no image for this device: no error left behind */
    return false;
  }
  return fa.binaryVersion == 90;
}
#endif /* PMLA_PLATFORM_NVIDIA */
