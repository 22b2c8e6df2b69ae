/* SPDX-License-Identifier: MIT */
/* decode_sm90_e4m3.hip - the persistent split-KV MLA decode kernel for an
 * E4M3 cache with at most 32 query rows per step (heads x query tokens) on
 * sm_90a, outside the batch-invariant mode: same work items, masking and
 * outputs as decode_sm90.hip, whose loaders, softmax parts and epilogue
 * (sm90_parts.h) it shares.
 *
 * E4M3 tiles of at most 32 rows (NC = 16 or 32 columns of S^T and O^T,
 * one per row of the item): the cache's bytes stay as stored in shared
 * memory and reach the tensor cores through registers, converted there;
 * no 16-bit KV tile. Per 64-token block, in one of NS raw stages (whole
 * pages by TMA, anything else by cp.async):
 *   S^T = K Q^T   36 wgmma m64nNCk16 f16 (warpgroup 0): A = the K rows in
 *                 registers (ldmatrix of the e4m3 bytes as 16-bit pairs,
 *                 two conversions per four values, exact), B = Q as f16
 *                 with each row scaled by a power of two (exact) and its
 *                 columns in the order the fragments hold them (k_of)
 *   O^T += V^T P^T  per warpgroup 16 wgmma m64nNCk16 f16, A = V^T from
 *                 registers: ldmatrix.trans of the e4m3 bytes as 16-bit
 *                 pairs, one byte permute and two conversions per four
 *                 values; B = P^T in the stage
 * e4m3 wgmma for S^T (Q split into two e4m3 parts) was faster but lost
 * precision in its accumulation (docs/performance.md).
 * Element rows of the V^T fragments: row q of a warp's 16 is dim 2q of its
 * 16-dim chunk, row q + 8 dim 2q + 1 (the pairs ldmatrix hands out).
 * Hand-offs per stage s: FULL[s] (loader's 128 threads + TMA bytes),
 * PREADY[s] (warpgroup 0's 128 threads: P^T and corr written), EMPTY[s]
 * (all 256 threads: both P V done, the loader may refill it). Stages and
 * parities run on across items (gb counts the blocks of the work-group). */
#include "hip_compat.h"
#ifdef PMLA_PLATFORM_NVIDIA
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "config.h"
#include "kv_load.h"
#include "kv_map.h"
#include "launch.h"
#include "mla_gpu.h"
#include "mma.h"
#include "pdl.h"
#include "sm90.h"
#include "sm90_parts.h"
#include <cudaTypedefs.h> /* CUtensorMap, PFN_cuTensorMapEncodeTiled */

namespace {
using namespace pmla_sm90_parts;

/* nc columns (16 or 32 rows): Q, four raw stages with their P^T, barriers
 * and row statistics (e4n::Geo) */
constexpr size_t smem_e4n(int nc) {
  return 1024 + 9 * (size_t)nc * 128 + 4 * (5 * 64 * 128 + (size_t)nc * 128) + 3072;
}
static_assert(smem_e4n(32) <= 232448, "shared memory per block (sm_90)");

#ifdef PMLA_SM90_DEVICE
using namespace pmla_mma;
using namespace pmla_kv;
using namespace pmla_sm90;

namespace e4n {
constexpr int NS = 4;                /* raw stages */
constexpr int CB = 64 * 128;         /* a column block: 64 tokens x 128 e4m3 */
constexpr int KB = 5 * CB;           /* 576-byte rows in five column blocks (the last half used) */
constexpr int ROWB = 576;
template <int NC> struct Geo {
  static constexpr int PB = NC * 128;     /* P^T: NC rows x 64 f16 */
  static constexpr int STG = KB + PB;     /* one stage */
  static constexpr int QB = NC * 128;     /* a column block of Q: NC rows x 64 f16 */
  static constexpr int QT = 9 * QB;       /* Q */
  static constexpr int MISC = 3072;       /* barriers, validity bits, row statistics */
  static_assert(STG % 1024 == 0 && QT % 1024 == 0, "128B-swizzle blocks stay 1024-byte aligned");
  static_assert(1024 + QT + NS * STG + MISC == smem_e4n(NC), "the launch's shared memory");
  static_assert(NC * Staged<true>::STRIDE <= NS * STG, "staged O fits the stages");
};

/* the logical column (as K fragments and Q hold it) of dim p of a 16-dim
 * k-step: thread c's fragment holds dims 4c..4c + 3 as columns 2c, 2c + 1,
 * 2c + 8, 2c + 9, and a dot product does not care in which order */
__device__ __forceinline__ int k_of(int p) { return 8 * ((p >> 1) & 1) + 2 * (p >> 2) + (p & 1); }
/* byte offset of 16-byte chunk c (0..39) of row r in a column-blocked tile of blk bytes a block */
__device__ __forceinline__ uint32_t koff(int r, int c, int blk) {
  return (uint32_t)((c >> 3) * blk + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}
/* this warpgroup's V^T fragments of M tiles M0 .. M1 - 1 of the stage at
 * aS: a[m][kk] for dims 256 g + 64 m .. (M tile m) and tokens 16 kk ..
 * (k-step kk) */
template <int M0 = 0, int M1 = 4>
__device__ __forceinline__ void v_frags(uint32_t (&a)[4][4][4], uint32_t aS, int g, int wi,
                                        int lane) {
#pragma unroll
  for (int m = M0; m < M1; m++) {
    const int cb = 2 * g + (m >> 1), j = 4 * (m & 1) + wi;
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int t = 32 * h + lane;
      uint32_t R[4];
      ldsm_x4_t(aS + cb * CB + t * 128 + ((j ^ (t & 7)) << 4), R[0], R[1], R[2], R[3]);
#pragma unroll
      for (int i = 0; i < 4; i++) {
        /* bytes (token 2c: dim 2q, 2q + 1; token 2c + 1: dim 2q, 2q + 1)
         * -> (dim 2q: tokens 2c, 2c + 1), (dim 2q + 1: tokens 2c, 2c + 1) */
        const uint32_t x = __byte_perm(R[i], 0, 0x3120);
        const int kk = 2 * h + (i >> 1), o = (i & 1) * 2;
        a[m][kk][o] = e4m3x2_to_f16x2(x);
        a[m][kk][o + 1] = e4m3x2_hi_to_f16x2(x);
      }
    }
  }
}
/* O^T += V^T P^T for this warpgroup's dims, issued and committed */
template <int NC>
__device__ __forceinline__ void pv(float (&o)[2 * NC], const uint32_t (&a)[4][4][4], uint32_t aP) {
  const uint64_t dp = desc(aP, 16, 1024);
  wg_fence();
#pragma unroll
  for (int m = 0; m < 4; m++)
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      if (NC == 16)
        mma_n16_rs_f16(o + 8 * m, a[m][kk], desc_at(dp, kk * 32));
      else
        mma_n32_rs_f16(o + 16 * m, a[m][kk], desc_at(dp, kk * 32));
    }
  wg_commit();
}
/* the epilogue's staging: column c of O^T is row c of the item */
template <bool PARTIAL, int NC>
__device__ __forceinline__ void stage_o(char *sO, const float (&o)[2 * NC], const float *sL, int g,
                                        int wi, int lane, int nrows, float out_scale) {
#pragma unroll
  for (int k = 0; k < NC / 4; k++) {
    const int c = nar_col(lane, k);
    if (c >= nrows)
      continue;
    const float l = sL[c], inv = pmla_sum_scale(out_scale, l);
    char *row = sO + c * Staged<PARTIAL>::STRIDE;
#pragma unroll
    for (int m = 0; m < 4; m++) {
      const int e = NC / 2 * m + 4 * (k >> 1) + (k & 1); /* dim d; e + 2: dim d + 1 */
      const int d = 256 * g + 64 * m + 16 * wi + 2 * (lane >> 2);
      if (PARTIAL)
        *(float2 *)(row + d * 4) = make_float2(o[e] * inv, o[e + 2] * inv);
      else
        *(uint32_t *)(row + d * 2) = pack_bf16x2(o[e] * inv, o[e + 2] * inv);
    }
  }
}
/* Q rows of an item as f16 with their columns permuted as the K fragments
 * take them (k_of), loaded by warpgroup 1 (t = 0..127: TPR threads a row,
 * chunks t % TPR + TPR k of its 72): each row times 2^e so that its largest
 * magnitude lies in [2^14, 2^15), which keeps every bf16 value down to
 * 2^-28 of it exactly (inf and NaN stay so); 2^-e into sQf; rows past
 * nrows are zero */
template <int NC>
__device__ __forceinline__ void q_f16(const pmla_gpu_problem &p, char *sQ, float *sQf,
                                      int64_t qrow0, int nrows, int t) {
  constexpr int TPR = 128 / NC, CH = PMLA_TILE_CHUNKS / TPR, QB = Geo<NC>::QB;
  const int row = t / TPR, sub = t % TPR;
  const bool v = row < nrows;
  const char *src = (const char *)(p.q + (qrow0 + (v ? row : 0)) * PMLA_QK_DIM);
  uint4 c[CH];
#pragma unroll
  for (int k = 0; k < CH; k++)
    c[k] = v ? ldg16(src + (sub + TPR * k) * 16) : make_uint4(0, 0, 0, 0);
  uint32_t amax = 0; /* the largest |value| as bf16 bits */
#pragma unroll
  for (int k = 0; k < CH; k++)
    amax = bf16x8_amax(c[k], amax);
  const int e = q_row_f16_exp<TPR>(amax);
  const float f = __uint_as_float((uint32_t)(127 + e) << 23);
#pragma unroll
  for (int k = 0; k < CH; k++) {
    const int cc = sub + TPR * k; /* dims 8 cc .. 8 cc + 7: pairs 2i, 2i + 1 */
    const uint32_t w[4] = {c[k].x, c[k].y, c[k].z, c[k].w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int d = 16 * (cc >> 1) + k_of(8 * (cc & 1) + 2 * i), col = d & 63;
      *(uint32_t *)(sQ + (d >> 6) * QB + row * 128 + ((((col >> 3) ^ row) & 7) << 4) +
                    (col & 7) * 2) = bf16x2_to_f16x2(w[i], f);
    }
  }
  if (sub == 0)
    sQf[row] = __uint_as_float((uint32_t)(127 - e) << 23);
}
/* this warp's K fragments of k-steps ks, ks + 1 (16 tokens x 16 dims each,
 * raw chunks ks and ks + 1) from the stage at aS: ldmatrix of the e4m3
 * bytes as 16-bit pairs gives the thread bytes 4c..4c + 3 of its two
 * tokens, i.e. logical columns 2c, 2c + 1 (dims 4c, 4c + 1) and 2c + 8,
 * 2c + 9 (dims 4c + 2, 4c + 3): k_of */
__device__ __forceinline__ void k_frags(uint32_t (&a)[2][4], uint32_t aS, int ks, int wi,
                                        int lane) {
  const int m = lane >> 3, t = 16 * wi + (lane & 7) + 8 * (m & 1), c = ks + (m >> 1);
  uint32_t R[4];
  ldsm_x4(aS + (c >> 3) * CB + t * 128 + (((c & 7) ^ (t & 7)) << 4), R[0], R[1], R[2], R[3]);
#pragma unroll
  for (int h = 0; h < 2; h++) {
    a[h][0] = e4m3x2_to_f16x2(R[2 * h]);
    a[h][1] = e4m3x2_to_f16x2(R[2 * h + 1]);
    a[h][2] = e4m3x2_hi_to_f16x2(R[2 * h]);
    a[h][3] = e4m3x2_hi_to_f16x2(R[2 * h + 1]);
  }
}
} /* namespace e4n */

/* SMALL (32 rows only): pages smaller than a block, each loader warp's 16
 * rows by TMA where they are one page's run; a kernel of its own, as the
 * branch cost the other pages' 32-row steps 2% */
template <int NC, bool SMALL>
__device__ __forceinline__ void body_e4m3_narrow(const pmla_gpu_problem &p, float scale_log2,
                                                 const CUtensorMap *kv_tmap, int use_tma) {
  using namespace e4n;
  constexpr int QT = Geo<NC>::QT, QB = Geo<NC>::QB, STG = Geo<NC>::STG, NK = NC / 4;
  bool scale_ok;
  const float out_scale = kv_out_scale<PMLA_KV_E4M3>(p, scale_ok);
  scale_log2 *= out_scale;
  extern __shared__ __align__(1024) char smem_e4[];
  char *sQ = smem_e4 + ((1024u - (smem_u32(smem_e4) & 1023u)) & 1023u);
  char *sSt = sQ + QT;                                    /* [NS] stages */
  uint64_t *bars = (uint64_t *)(sSt + NS * STG);          /* FULL, PREADY, EMPTY [NS], DONE */
  uint64_t *sVm = bars + 3 * NS + 1;                      /* [NS] token validity bits */
  float *sCorr = (float *)(sVm + NS);                     /* [NS][NC] */
  float *sM = sCorr + NS * NC, *sL = sM + NC, *sQf = sL + NC;
  float *sMx = sQf + NC; /* [2][4 warps][NC] column maxima, then [2][4] votes, by block parity */
  const uint32_t aFull = smem_u32(bars), aPready = aFull + 8 * NS, aEmpty = aPready + 8 * NS,
                 aDone = aEmpty + 8 * NS;

  const int tid = threadIdx.x, g = tid >> 7, wi = (tid >> 5) & 3, lane = tid & 31;
  if (tid == 0) {
    for (int s = 0; s < NS; s++) {
      mbar_init(aFull + 8 * s, 128);
      mbar_init(aPready + 8 * s, 128);
      mbar_init(aEmpty + 8 * s, 256);
    }
    mbar_init(aDone, 128);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  uint32_t done_phase = 0;
  uint32_t gb = 0; /* blocks this work-group has run before the item */
  const int H = p.num_heads;
  const int u = blockIdx.y, row0 = blockIdx.x * ROWS;
  int32_t *errw = p.work_meta_data + PMLA_META_ERROR;
  const char *kvbase = (const char *)p.kv;
  int32_t q_rows[2] = {-1, -1};
  bool staged = false;
  const int it_end = p.work_indptr[u + 1];
  for (int it = p.work_indptr[u]; it < it_end; it++) {
    const int32_t *w = p.work_info_set + (int64_t)it * PMLA_WI_WORDS;
    const int32_t r = w[PMLA_WI_REQUEST], pslot = w[PMLA_WI_PARTIAL];
    const int32_t qb = w[PMLA_WI_Q_BEGIN], qe = w[PMLA_WI_Q_END];
    const int32_t kb = w[PMLA_WI_KV_BEGIN], ke = w[PMLA_WI_KV_END], len = w[PMLA_WI_KV_LEN];
    const int qlen = qe - qb, rows_item = qlen * H;
    if (qlen <= 0 || row0 >= rows_item)
      continue;
    if (qb < 0 || qe > p.num_tokens || qlen > p.max_q_len) {
      if (tid == 0)
        atomicOr(errw, (int)PMLA_PLAN_ERR_QO_INDPTR);
      continue;
    }
    const int nrows = rows_item - row0 < NC ? rows_item - row0 : NC;
    const int nblk = ke > kb && scale_ok ? (ke - kb + BN - 1) / BN : 0;
    float o[2 * NC];
#pragma unroll
    for (int e = 0; e < 2 * NC; e++)
      o[e] = 0.f;
    const bool q_new = qb != q_rows[0] || qe != q_rows[1];
    q_rows[0] = qb;
    q_rows[1] = qe;
    auto stage_of = [&](int b) { return (gb + (uint32_t)b) % NS; };
    auto phase_of = [&](int b) { return ((gb + (uint32_t)b) / NS) & 1u; };
    uint32_t a[4][4][4];

    if (g == 1) {
      /* ---------------- warpgroup 1: Q, loader, P V dims 256.. */
      const int t = tid - 128;
      if (staged) {
        if (wi == 0)
          bulk_wait_read();
        asm volatile("bar.sync 4, 128;\n" ::: "memory");
        staged = false;
      }
      if (q_new) {
        q_f16<NC>(p, sQ, sQf, (int64_t)qb * H + row0, nrows, t);
        proxy_fence(); /* published with block 0, or by the item's end */
      }
      const int32_t csr_first = (!p.map.topk && !p.map.block_table) ? p.map.kv_indptr[r] : 0;
      /* each loader warp gathers 16 tokens of a block; lane l (and l + 16)
       * holds the page entry and slot of token 16 wi + (l & 15) */
      const int ld_t = 16 * wi + (lane & 15);
      auto raw_at = [&](int blk) -> int32_t {
        const int pos = kb + blk * BN + ld_t;
        return pos < ke ? kv_raw(p.map, r, pos, csr_first) : -1;
      };
      int32_t raw_next = nblk > 0 ? raw_at(0) : -1;
      uint32_t pend = 0; /* bit s: stage s awaits this thread's cp.async publication */
      /* block blk into its stage, once both P V of the stage's last block are done */
      auto issue = [&](int blk) {
        const uint32_t G = gb + (uint32_t)blk, s = G % NS;
        if (G >= NS)
          mbar_wait(aEmpty + 8 * s, ((G / NS) - 1) & 1u);
        char *dst = sSt + s * STG;
        const uint32_t bar = aFull + 8 * s;
#if PMLA_WG_TMA
        /* whole pages: use_tma 1; the SMALL kernel is launched with 2
         * (pages of 16 or 32 slots) only, so it has no whole-page path */
        const bool whole_tma = !SMALL && use_tma != 0;
        const int64_t first =
            whole_tma ? page_run_slot<BN>(p.map, raw_next, kb + blk * BN, ke) : -1;
        if (first >= 0) {
          if (t == 0) {
            mbar_expect_tx(bar, KB);
#pragma unroll
            for (int c = 0; c < 5; c++)
              tma_box(smem_u32(dst) + c * CB, kv_tmap, c * 128, (int)first, bar);
          }
          if (lane == 0)
            ((uint16_t *)sVm)[s * 4 + wi] = 0xffffu;
          mbar_arrive(bar);
          raw_next = raw_at(blk + 1);
          return;
        }
        /* pages of 16 or 32 slots, 32 rows: each warp's 16 rows as five
         * 16-row boxes where they are one page's run */
        const int64_t gfirst =
            SMALL ? page_run_slot<16>(p.map, raw_next, kb + blk * BN + 16 * wi, ke) : -1;
        if (gfirst >= 0) {
          if (lane == 0) {
            mbar_expect_tx(bar, KB / 4);
#pragma unroll
            for (int c = 0; c < 5; c++)
              tma_box(smem_u32(dst) + c * CB + 16 * wi * 128, kv_tmap, c * 128, (int)gfirst, bar);
            ((uint16_t *)sVm)[s * 4 + wi] = 0xffffu;
          }
          mbar_arrive(bar);
          raw_next = raw_at(blk + 1);
          return;
        }
#endif
        const int pos = kb + blk * BN + ld_t;
        const int64_t slot =
            pos < ke ? kv_slot(p.map, raw_next, pos, errw, lane < 16 && blockIdx.x == 0) : -1;
        const uint32_t bits = __ballot_sync(0xffffffffu, slot >= 0) & 0xffffu;
        if (lane == 0)
          ((uint16_t *)sVm)[s * 4 + wi] = (uint16_t)bits;
        const char *mine = slot >= 0 ? kvbase + slot * ROWB : kvbase;
        /* one row at a time (a copy reads 512 contiguous bytes of a row
         * rather than 32 bytes of 16 rows) */
        gather_rows<16, 36, 1>(mine, bits, lane,
                               [&](int j, int c) { return dst + koff(16 * wi + j, c, CB); });
        pend |= 1u << s;
        raw_next = raw_at(blk + 1);
      };
      /* block blk's cp.async rows have landed (NS - 2 groups younger than
       * its own may still be pending): visible to wgmma, published */
      auto publish = [&](int blk) {
        const uint32_t s = stage_of(blk);
        if (!(pend & (1u << s)))
          return;
        cp_wait<NS - 2>();
        proxy_fence();
        mbar_arrive(aFull + 8 * s);
        pend &= ~(1u << s);
      };
      for (int j = 0; j < NS - 1; j++) { /* one group per block, empty ones too */
        if (j < nblk)
          issue(j);
        cp_commit();
      }
      if (nblk > 0)
        publish(0);
      for (int b = 0; b < nblk; b++) {
        if (b + NS - 1 < nblk)
          issue(b + NS - 1);
        cp_commit();
        const uint32_t s = stage_of(b), ph = phase_of(b);
        char *sS = sSt + s * STG;
        mbar_wait(aFull + 8 * s, ph);
        v_frags(a, smem_u32(sS), 1, wi, lane);
        /* block b + 1 published while this block's work goes on */
        if (b + 1 < nblk)
          publish(b + 1);
        mbar_wait(aPready + 8 * s, ph);
        float c[NK];
#pragma unroll
        for (int k = 0; k < NK; k++)
          c[k] = sCorr[s * NC + nar_col(lane, k)];
        nar_scale_o<NC>(o, c);
        reg_fence<2 * NC>(o);
        pv<NC>(o, a, smem_u32(sS + KB));
        wg_wait0();
        reg_fence<2 * NC>(o);
        mbar_arrive(aEmpty + 8 * s);
      }
      cp_wait<0>();
      mbar_wait(aDone, done_phase);
      done_phase ^= 1;
    } else {
      /* ---------------- warpgroup 0: S^T + softmax + P V dims 0..255 */
      int lim[NK];
      float sc[NK], m_run[NK], l_run[NK];
#pragma unroll
      for (int k = 0; k < NK; k++) {
        lim[k] = row_limit(row0 + nar_col(lane, k), rows_item, H, len, qlen, ke);
        sc[k] = scale_log2;
        m_run[k] = -INFINITY;
        l_run[k] = 0.f;
      }
      const int t0 = 16 * wi + (lane >> 2);
      /* the least limit over this thread's columns (padding columns
       * attend the whole range: row_limit) */
      int lim_min = INT32_MAX;
#pragma unroll
      for (int k = 0; k < NK; k++)
        lim_min = min(lim_min, lim[k]);
      const uint64_t dQ = desc(smem_u32(sQ), 16, 1024);
      for (int b = 0; b < nblk; b++) {
        const uint32_t s = stage_of(b), ph = phase_of(b);
        char *sS = sSt + s * STG;
        const uint32_t aS = smem_u32(sS);
        mbar_wait(aFull + 8 * s, ph);
        /* S^T: the K rows converted into registers (exactly: every e4m3
         * value is an f16 value), 36 wgmma m64nNCk16 f16 with B = Q, in
         * parts of PK k-steps: each part's wgmma are issued as soon as its
         * registers are written, so the tensor cores run while the next
         * part is converted; NB parts live at once in KA registers (all
         * 36 k-steps at 16 columns, 18 at 32) */
        constexpr int PK = 6, NP = 36 / PK, KA = NC == 16 ? 144 : 72, NB = KA / (4 * PK);
        static_assert(PK % 2 == 0 && 36 % PK == 0, "k_frags converts k-steps in pairs");
        float sq[NC / 2];
#pragma unroll
        for (int e = 0; e < NC / 2; e++)
          sq[e] = 0.f;
        reg_fence<NC / 2>(sq);
        uint32_t ka[NB][PK][4];
#pragma unroll
        for (int pt = 0; pt < NP; pt++) {
          if (pt >= NB)
            wg_wait<NB - 1>(); /* part pt - NB is done with its registers */
#pragma unroll
          for (int j = 0; j < PK / 2; j++) {
            uint32_t two[2][4];
            k_frags(two, aS, pt * PK + 2 * j, wi, lane);
#pragma unroll
            for (int i = 0; i < 4; i++) {
              ka[pt % NB][2 * j][i] = two[0][i];
              ka[pt % NB][2 * j + 1][i] = two[1][i];
            }
          }
          wg_fence();
#pragma unroll
          for (int kk = 0; kk < PK; kk++) {
            const int ks = pt * PK + kk;
            const uint64_t db = desc_at(dQ, (ks >> 2) * QB + (ks & 3) * 32);
            if (NC == 16)
              mma_n16_rs_f16(sq, ka[pt % NB][kk], db);
            else
              mma_n32_rs_f16(sq, ka[pt % NB][kk], db);
          }
          wg_commit();
          if (b == 0 && pt == 0)
#pragma unroll
            for (int k = 0; k < NK; k++)
              sc[k] = scale_log2 * sQf[nar_col(lane, k)];
        }
        /* the first two M tiles of V^T (32 registers) into those of the
         * parts already done (at most half of the live ones pending: 48 or
         * more registers free), under the last parts' wgmma */
        wg_wait<NB / 2>();
        v_frags<0, 2>(a, aS, 0, wi, lane);
        wg_wait0();
        reg_fence<NC / 2>(sq);
        v_frags<2, 4>(a, aS, 0, wi, lane);
        /* scaled scores (log2 units), -inf where a token is invalid or
         * causally after the column's row; a block whose tokens are all
         * valid for every real column of this thread skips the mask */
        float sv[NC / 2];
#pragma unroll
        for (int e = 0; e < NC / 2; e++)
          sv[e] = sq[e] * sc[nar_k(e)];
        const int pos0 = kb + b * BN;
        const uint64_t vm = sVm[s];
        if (!(vm == ~0ull && lim_min >= pos0 + BN)) {
#pragma unroll
          for (int e = 0; e < NC / 2; e++) {
            const int k = nar_k(e), tt = t0 + 8 * ((e >> 1) & 1);
            if (!((vm & before64(lim[k], pos0)) >> tt & 1))
              sv[e] = -INFINITY;
          }
        }
        /* P against the running maximum, unless some score of the block
         * exceeds it by more than RESCALE_SLACK (move_max): every warp's
         * vote is read after the barrier that P^T needs anyway, and only a
         * block that moves a maximum takes the second pass */
        bool grow = false;
#pragma unroll
        for (int e = 0; e < NC / 2; e++)
          grow |= sv[e] > m_run[nar_k(e)] + RESCALE_SLACK;
        grow = __any_sync(0xffffffffu, grow);
        int *votes = (int *)(sMx + 8 * NC) + (b & 1) * 4;
        if (lane == 0)
          votes[wi] = grow;
        float muse[NK], corr[NK], sum[NK];
#pragma unroll
        for (int k = 0; k < NK; k++) {
          muse[k] = m_run[k] == -INFINITY ? 0.f : m_run[k];
          corr[k] = 1.f;
        }
        char *sP = sS + KB;
        /* P^T rows by stmatrix.trans, one x4 per 16 columns: matrix i of
         * the warp's 16 tokens x 16 columns is tokens 8 (i & 1)..,
         * columns 8 (i >> 1)..; lane l addresses row l % 8 of matrix l / 8 */
        const int pc = (lane & 7) + 8 * (lane >> 4), ptok = 16 * wi + 8 * ((lane >> 3) & 1);
        const uint32_t aProw = smem_u32(sP) + pc * 128 + (((ptok >> 3) ^ (pc & 7)) << 4);
        auto write_p = [&]() {
          uint32_t pk[NK];
#pragma unroll
          for (int k = 0; k < NK; k++)
            sum[k] = 0.f;
#pragma unroll
          for (int e = 0; e < NC / 2; e += 2) {
            const float p0 = fast_exp2(sv[e] - muse[nar_k(e)]);
            const float p1 = fast_exp2(sv[e + 1] - muse[nar_k(e + 1)]);
            sum[nar_k(e)] += p0;
            sum[nar_k(e + 1)] += p1;
            pk[e >> 1] = pack_f16x2(p0, p1);
          }
#pragma unroll
          for (int j = 0; j < NC / 16; j++)
            stsm_x4_t(aProw + j * 16 * 128, pk[4 * j], pk[4 * j + 1], pk[4 * j + 2], pk[4 * j + 3]);
        };
        write_p();
        asm volatile("bar.sync 7, 128;\n" ::: "memory");
        if (votes[0] | votes[1] | votes[2] | votes[3]) {
          /* the block's column maxima over the four warps, then P again */
          float *mxb = sMx + (b & 1) * 4 * NC;
          float mx[NK];
#pragma unroll
          for (int k = 0; k < NK; k++)
            mx[k] = -INFINITY;
#pragma unroll
          for (int e = 0; e < NC / 2; e++)
            mx[nar_k(e)] = fmaxf(mx[nar_k(e)], sv[e]);
#pragma unroll
          for (int k = 0; k < NK; k++) {
            mx[k] = col_max(mx[k]);
            if (lane < 4)
              mxb[wi * NC + nar_col(lane, k)] = mx[k];
          }
          asm volatile("bar.sync 7, 128;\n" ::: "memory");
#pragma unroll
          for (int k = 0; k < NK; k++) {
            const int c = nar_col(lane, k);
            const float bm = fmaxf(fmaxf(mxb[c], mxb[NC + c]), fmaxf(mxb[2 * NC + c], mxb[3 * NC + c]));
            move_max(m_run[k], bm, &muse[k], &corr[k]);
          }
          write_p();
        }
        if (wi == 0 && lane < 4)
#pragma unroll
          for (int k = 0; k < NK; k++)
            sCorr[s * NC + nar_col(lane, k)] = corr[k];
        proxy_fence();
        mbar_arrive(aPready + 8 * s);
        /* this warpgroup's P V reads every warp's P^T rows */
        asm volatile("bar.sync 7, 128;\n" ::: "memory");
#pragma unroll
        for (int k = 0; k < NK; k++)
          l_run[k] = l_run[k] * corr[k] + sum[k];
        nar_scale_o<NC>(o, corr);
        reg_fence<2 * NC>(o);
        pv<NC>(o, a, smem_u32(sP));
        wg_wait0();
        reg_fence<2 * NC>(o);
        mbar_arrive(aEmpty + 8 * s);
      }
      nar_row_stats<NC>(sMx, m_run, l_run, sM, sL, nblk, wi, lane);
      mbar_arrive(aDone);
    }
    gb += (uint32_t)nblk;
    __syncthreads();

    if (pslot >= 0)
      stage_o<true, NC>(sSt, o, sL, g, wi, lane, nrows, out_scale);
    else
      stage_o<false, NC>(sSt, o, sL, g, wi, lane, nrows, out_scale);
    proxy_fence();
    __syncthreads();
    if (g == 1) {
      staged = true;
      if (wi == 0)
        send_staged(p, sSt, pslot, qb, row0, nrows, lane);
    }
    store_lse<false>(p, sM, sL, tid, nrows, pslot, qb, row0, 0);
    __syncthreads();
  }
  if (staged && wi == 0)
    bulk_wait_read();
}
#endif /* PMLA_SM90_DEVICE */

/* kv_tmap: the E4M3 cache as a [num_slots, 576] byte tensor map (128-byte
 * boxes of 64 rows where use_tma == 1, of 16 where it is 2, in the SMALL
 * kernel only; 128B swizzle) */
template <int NC, bool SMALL>
__global__ void __launch_bounds__(NT, 1)
    pmla_decode_sm90_e4m3_kernel(pmla_gpu_problem p, float scale_log2,
                                 const __grid_constant__ CUtensorMap kv_tmap, int use_tma) {
#ifdef PMLA_SM90_DEVICE
  pdl_wait();
  pdl_trigger();
  body_e4m3_narrow<NC, SMALL>(p, scale_log2, &kv_tmap, use_tma);
#endif
}

/* The cache's rows as bytes for the page loads: 128-byte boxes, the fifth
 * reaching past the row's 576 bytes, which TMA fills with zeros; 1 with
 * 64-row boxes (page size a multiple of 64: a block is one page's run), 2
 * with 16-row boxes (other multiples of 16: a loader warp's 16 rows are),
 * 0 when TMA does not apply (top-k gather, other page sizes, a cache the
 * map cannot describe) */
int kv_tensor_map_e4m3(CUtensorMap *m, const pmla_gpu_problem &p) {
  const PFN_cuTensorMapEncodeTiled_v12000 enc =
      (PFN_cuTensorMapEncodeTiled_v12000)pmla_sm90_tensor_map_encoder();
  constexpr int ROWB = pmla_kv::KvFmt<PMLA_KV_E4M3>::ROW_BYTES;
  const int rows = tma_box_rows(p.map.page_size);
  if (!PMLA_WG_TMA || !enc || p.kv_format != PMLA_KV_E4M3 || p.map.topk || rows == 0 ||
      p.map.num_slots < rows || p.map.num_slots > INT32_MAX || ((uintptr_t)p.kv & 15) != 0)
    return 0;
  cuuint64_t dim[2] = {ROWB, (cuuint64_t)p.map.num_slots};
  cuuint64_t stride[1] = {ROWB};
  cuuint32_t box[2] = {128, (cuuint32_t)rows}, estride[2] = {1, 1};
  if (enc(m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void *)p.kv, dim, stride, box, estride,
          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
    return 0;
  return rows == BN ? 1 : 2;
}
template <int NC, bool SMALL>
hipError_t launch_kernel(const pmla_gpu_problem &p, int tiles, hipStream_t st,
                         const CUtensorMap &tmap, int use_tma) {
  static unsigned long long opted_in = 0;
  hipError_t e = pmla_opt_in_smem((const void *)pmla_decode_sm90_e4m3_kernel<NC, SMALL>,
                                  smem_e4n(NC), &opted_in);
  if (e != hipSuccess)
    return e;
  const dim3 grid((unsigned)tiles, (unsigned)p.num_units);
  return pdl_launch(pmla_decode_sm90_e4m3_kernel<NC, SMALL>, grid, dim3(NT), smem_e4n(NC), st, p,
                    p.softmax_scale * pmla_mma::LOG2E_F, tmap, use_tma);
}
template <int NC> hipError_t launch(const pmla_gpu_problem &p, int tiles, hipStream_t st) {
  CUtensorMap tmap;
  memset(&tmap, 0, sizeof tmap);
  /* 16-row boxes cost the 16-row kernel 3-5% (bound by memory, its 128
   * gathering threads keep more reads in flight) and gain the 32-row one 7% */
  int use_tma = kv_tensor_map_e4m3(&tmap, p);
  if constexpr (NC == 32)
    if (use_tma == 2)
      return launch_kernel<NC, true>(p, tiles, st, tmap, use_tma);
  if (use_tma == 2)
    use_tma = 0;
  return launch_kernel<NC, false>(p, tiles, st, tmap, use_tma);
}

} /* namespace */

hipError_t pmla_launch_decode_sm90_e4m3(const pmla_gpu_problem &p, int tiles, hipStream_t st) {
  return (int64_t)p.num_heads * p.max_q_len <= 16 ? launch<16>(p, tiles, st)
                                                  : launch<32>(p, tiles, st);
}
#endif /* PMLA_PLATFORM_NVIDIA */
