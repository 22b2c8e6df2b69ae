/* SPDX-License-Identifier: MIT */
/* decode_mma.hip - the persistent split-KV MLA decode kernel on warp-level
 * tensor-core tiles (mma.sync on NVIDIA sm_80+, MFMA on AMD CDNA, scalar
 * elsewhere): every row tile on AMD and on NVIDIA targets other than
 * sm_90a, and the 16/32-row tiles on sm_90a (decode_sm90.hip has 64).
 *
 * Grid (num_units, head_tiles). Work-group (u, t) walks the work items of
 * unit u (work_indptr[u] .. work_indptr[u+1]) for the rows [t*ROWS,
 * (t+1)*ROWS) of each item; a row is a (query row, head) pair, row
 * i = j * H + h.
 *
 * Per item: the Q tile (ROWS x 576 bf16) goes to shared memory once; KV
 * positions [kv_begin, kv_end) stream through STAGES shared-memory stages of
 * BN tokens (cp.async, gathered row by row through pmla_kv_map; positions
 * past the item, skipped slots and bad indices are zero-filled, never
 * loaded, so NaN-poisoned slots cannot reach the PV product). An FP8
 * cache's rows are loaded into registers while the previous block computes
 * and dequantised into their stage after it (kv_load.h). Per block:
 *   QK   S[ROWS x BN] = Q K^T over 576 dims; warp w owns rows
 *        16*(w % MT).. and tokens (w / MT) * TW..; scaled to base 2 and
 *        masked to -inf (past the item, causal limit len - qlen + 1 + j,
 *        skipped slot)
 *   max  per-warp row maxima meet in shared memory -> running max m
 *   P    exp2(S - m) as bf16 into the stage's rope columns (512..575),
 *        free once QK is done; row sums meet in shared memory
 *   PV   O[ROWS x 512] += P V, warp w owns columns 512/NW * w..; O is
 *        rescaled by exp2(m_old - m_new) first
 * Unsplit items write bf16 out (+ natural-log lse); split items write the
 * normalised fp32 partial and its lse into slot `partial` (layout
 * [slot][q_local][head][512]); reduce.hip merges them by lse.
 *
 * Bad device input never faults: a page/slot outside [0, num_slots) is
 * skipped and ORs PAGE_INDEX / SLOT_INDEX into work_meta_data[ERROR]; query
 * rows beyond num_tokens skip the item and OR QO_INDPTR. */
#include <math.h>
#include <stdint.h>

#include "hip_compat.h"
#include "fold.h"
#include "kv_load.h"
#include "kv_map.h"
#include "launch.h"
#include "mla_gpu.h"
#include "mma.h"
#include "pdl.h"
#include "plan_invariant.h"
#include "traits.h"

namespace {

using namespace pmla_mma;
using namespace pmla_kv;
using pmla_traits::Shape;

constexpr int KSTEPS = PMLA_QK_DIM / 16;
constexpr int PITCH = PMLA_TILE_PITCH;

template <int MT> struct Cfg {
  static constexpr int NW = Shape<MT>::NW, BN = Shape<MT>::BN, STAGES = Shape<MT>::STAGES;
  static constexpr int NT = NW * WARP;
  static constexpr int QKU = MT == 4 ? 1 : 4; /* QK unroll: MT 4 is register bound */
  /* independent QK accumulator sets, to break the 36-deep mma chain */
  static constexpr int KACC = MT == 4 ? 1 : (MT == 1 ? 4 : 2);
  static constexpr int ROWS = MT * 16;
  static constexpr int TG = NW / MT;     /* token groups in QK */
  static constexpr int TW = BN / TG;         /* tokens per warp in QK */
  static constexpr int NTQ = TW / MMA_N;     /* n-tiles per warp in QK */
  static constexpr int DW = PMLA_V_DIM / NW; /* output columns per warp */
  static constexpr int NTV = DW / MMA_N;
  static constexpr int TPT = NT / BN;        /* loader threads per token */
  static constexpr size_t SMEM = (size_t)ROWS * PITCH + (size_t)STAGES * BN * PITCH +
                                 sizeof(float) * (2 * TG * ROWS + 5 * ROWS) +
                                 sizeof(int) * STAGES * BN;
#ifdef PMLA_PLATFORM_NVIDIA
  static_assert((SMEM + 1024) * Shape<MT>::OCC <= 233472, "shared memory per SM (sm_90)");
#endif
  static_assert(NW % MT == 0, "warps per row group");
  static_assert(TW % MMA_N == 0 && NTQ >= 1, "QK tokens per warp");
  static_assert(NTQ == 1 || NTQ % 2 == 0, "QK n-tiles");
  static_assert(NTV % 2 == 0, "PV n-tiles");
  static_assert(NT % BN == 0 && PMLA_TILE_CHUNKS % TPT == 0, "loader");
  static_assert(ROWS <= BN, "P lives in the stage's rope columns");
  static_assert(BN / 8 <= 8, "P row fits the rope chunks");
};

template <int MT, int F, bool FOLD>
__device__ __forceinline__ void decode_body(const pmla_gpu_problem &p, float scale_log2) {
  using C = Cfg<MT>;
  constexpr bool FP8 = F != PMLA_KV_BF16;
  /* an E4M3 cache's tiles, Q and P as f16 where the platform's MMA takes it
   * (one conversion per e4m3 pair; Q rescaled by rows, q_row_to_f16) */
  constexpr bool F16 = F16_TILES && F == PMLA_KV_E4M3;
  constexpr int ROWB = KvFmt<F>::ROW_BYTES;
  static_assert(!FP8 || C::STAGES <= 2, "FP8 rows wait in registers for the one free stage");
  constexpr int NT = C::NT, QKU = C::QKU, KACC = C::KACC, BN = C::BN, STAGES = C::STAGES;
  constexpr int ROWS = C::ROWS, TG = C::TG, TW = C::TW, NTQ = C::NTQ, DW = C::DW, NTV = C::NTV,
                TPT = C::TPT;
  extern __shared__ __align__(16) char smem[];
  char *sQ = smem;
  char *sKV = sQ + ROWS * PITCH;
  float *sPmax = (float *)(sKV + STAGES * BN * PITCH);
  float *sPsum = sPmax + TG * ROWS;
  float *sM = sPsum + TG * ROWS; /* [2][ROWS], by block parity */
  float *sL = sM + 2 * ROWS;
  float *sCorr = sL + ROWS;
  int *sValid = (int *)(sCorr + ROWS);
  float *sQf = (float *)(sValid + STAGES * BN); /* F16: [ROWS] Q's row factors */

  const int tid = threadIdx.x, warp = tid / WARP, lane = tid % WARP;
  const int H = p.num_heads;
  const int u = blockIdx.x, row0 = blockIdx.y * ROWS;
  const int rg = warp % MT, tg = warp / MT;
  int32_t *errw = p.work_meta_data + PMLA_META_ERROR;
  const char *kvbase = (const char *)p.kv;
  bool scale_ok;
  const float out_scale = kv_out_scale<F>(p, scale_ok);
  if (F == PMLA_KV_E4M3)
    scale_log2 *= out_scale;
  RowLoad<F, C::TPT> fp8; /* FP8: the next block's row pieces, in flight */

  const int it_end = p.work_indptr[u + 1];
  for (int it = p.work_indptr[u]; it < it_end; it++) {
    const int32_t *w = p.work_info_set + (int64_t)it * PMLA_WI_WORDS;
    const int32_t r = w[PMLA_WI_REQUEST], pslot = w[PMLA_WI_PARTIAL];
    const int32_t qb = w[PMLA_WI_Q_BEGIN], qe = w[PMLA_WI_Q_END];
    const int32_t kb = w[PMLA_WI_KV_BEGIN], ke = w[PMLA_WI_KV_END], len = w[PMLA_WI_KV_LEN];
    const int qlen = qe - qb, rows_item = qlen * H;
    if (qlen <= 0 || row0 >= rows_item)
      continue;
    if (qb < 0 || qe > p.num_tokens || qlen > p.max_q_len) { /* the tiles cover max_q_len */
      if (tid == 0)
        atomicOr(errw, (int)PMLA_PLAN_ERR_QO_INDPTR);
      continue;
    }
    const int nrows = rows_item - row0 < ROWS ? rows_item - row0 : ROWS;
    const int nblk = ke > kb && scale_ok ? (ke - kb + BN - 1) / BN : 0;

    /* Q tile (rows past the item zero-filled) */
    {
      const char *qsrc = (const char *)(p.q + ((int64_t)qb * H + row0) * PMLA_QK_DIM);
      for (int c = tid; c < ROWS * PMLA_TILE_CHUNKS; c += NT) {
        int rr = c / PMLA_TILE_CHUNKS, cc = c % PMLA_TILE_CHUNKS;
        bool v = rr < nrows;
        cp16(sQ + tile_off(rr, cc), v ? qsrc + (int64_t)rr * PITCH + cc * 16 : qsrc, v);
      }
    }
    if (tid < ROWS) {
      sM[tid] = -INFINITY;
      sL[tid] = 0.f;
    }

    const int32_t csr_first = (!p.map.topk && !p.map.block_table) ? p.map.kv_indptr[r] : 0;
    const int ld_t = tid / TPT, ld_sub = tid % TPT;
    auto raw_at = [&](int blk) -> int32_t {
      int pos = kb + blk * BN + ld_t;
      return pos < ke ? kv_raw(p.map, r, pos, csr_first) : -1;
    };
    int32_t raw_next = raw_at(0);
    /* loads block blk (whose raw entry is raw_next) and prefetches blk + 1's;
     * FP8 rows only reach registers here, fp8_store puts them in the stage */
    auto load_block = [&](int blk, int st) {
      const int pos = kb + blk * BN + ld_t;
      int64_t slot = pos < ke ? kv_slot(p.map, raw_next, pos, errw, ld_sub == 0 && blockIdx.y == 0)
                              : -1;
      bool v = slot >= 0;
      if (ld_sub == 0)
        sValid[st * BN + ld_t] = v;
      const char *src = v ? kvbase + slot * ROWB : kvbase;
      if (FP8) {
        fp8.issue(src, v, ld_sub);
      } else {
        char *dst = sKV + st * BN * PITCH;
#pragma unroll
        for (int k = 0; k < PMLA_TILE_CHUNKS / TPT; k++) {
          int c = ld_sub + k * TPT;
          cp16(dst + tile_off(ld_t, c), src + (v ? c * 16 : 0), v);
        }
      }
      raw_next = raw_at(blk + 1);
    };
    auto fp8_store = [&](int st) {
      char *dst = sKV + st * BN * PITCH;
      fp8.template store<F16>(ld_sub, [&](int c) { return dst + tile_off(ld_t, c); });
    };

#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
      if (s < nblk) {
        load_block(s, s);
        if (FP8)
          fp8_store(s);
      }
      cp_commit();
    }

    /* causal/item limit of each row a lane holds in QK */
    int lim[ROWSLOTS];
#pragma unroll
    for (int s = 0; s < ROWSLOTS; s++) {
      int i = row0 + rg * 16 + slot_row(lane, s);
      int causal = len - qlen + 1 + i / H;
      lim[s] = i < rows_item ? (causal < ke ? causal : ke) : INT32_MIN;
    }

    float sc[ROWSLOTS]; /* the scores' scale by row (F16: times Q's row factor) */
#pragma unroll
    for (int sl = 0; sl < ROWSLOTS; sl++)
      sc[sl] = scale_log2;
    Acc o[MT][NTV];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int nt = 0; nt < NTV; nt++)
        acc_zero(o[mt][nt]);

    for (int b = 0; b < nblk; b++) {
      if (STAGES == 1) {
        __syncthreads();
        load_block(b, 0);
        if (FP8)
          fp8_store(0);
        cp_commit();
        cp_wait<0>();
        __syncthreads();
      } else {
        cp_wait<(STAGES >= 2 ? STAGES - 2 : 0)>();
        __syncthreads();
        if (b + STAGES - 1 < nblk)
          load_block(b + STAGES - 1, (b + STAGES - 1) % STAGES);
        cp_commit();
      }
      if (F16 && b == 0) {
        /* Q has landed (the barrier above): as f16, and each row's factor */
        constexpr int TPR = NT / ROWS < 32 ? NT / ROWS : 32;
        if (tid < ROWS * TPR) {
          const int qr = tid / TPR;
          const float f = q_row_to_f16<TPR>(tid % TPR, [&](int c) { return sQ + tile_off(qr, c); });
          if (tid % TPR == 0)
            sQf[qr] = f;
        }
        __syncthreads();
#pragma unroll
        for (int sl = 0; sl < ROWSLOTS; sl++)
          sc[sl] = scale_log2 * sQf[rg * 16 + slot_row(lane, sl)];
      }
      const int st = b % STAGES;
      char *sK = sKV + st * BN * PITCH;
      const int *vld = sValid + st * BN;
      const int pos0 = kb + b * BN;
      const int cur = (b & 1) * ROWS, nxt = ROWS - cur;

      /* ---- S = Q K^T (KACC interleaved accumulator sets, summed after) */
      Acc s[NTQ], sx[KACC > 1 ? KACC - 1 : 1][NTQ];
#pragma unroll
      for (int nt = 0; nt < NTQ; nt++) {
        acc_zero(s[nt]);
#pragma unroll
        for (int k = 0; k < KACC - 1; k++)
          acc_zero(sx[k][nt]);
      }
      auto sacc = [&](int k, int nt) -> Acc & { return k == 0 ? s[nt] : sx[k > 0 ? k - 1 : 0][nt]; };
      const int n0 = tg * TW;
      if (NTQ == 1) {
#pragma unroll 6
        for (int ks = 0; ks < KSTEPS; ks += 2) {
          FragA a0, a1;
          FragB b0, b1;
          ld_a(a0, sQ, rg * 16, ks * 2);
          ld_a(a1, sQ, rg * 16, ks * 2 + 2);
          ld_b_nk_k2(b0, b1, sK, n0, ks * 2);
          mma<F16>(sacc(ks % KACC, 0), a0, b0);
          mma<F16>(sacc((ks + 1) % KACC, 0), a1, b1);
        }
      } else {
#pragma unroll QKU
        for (int ks = 0; ks < KSTEPS; ks++) {
          FragA a;
          ld_a(a, sQ, rg * 16, ks * 2);
#pragma unroll
          for (int np = 0; np < NTQ / 2; np++) {
            FragB b0, b1;
            ld_b_nk2(b0, b1, sK, n0 + np * 2 * MMA_N, ks * 2);
            mma<F16>(sacc(ks % KACC, 2 * np), a, b0);
            mma<F16>(sacc(ks % KACC, 2 * np + 1), a, b1);
          }
        }
      }
#pragma unroll
      for (int k = 0; k < KACC - 1; k++)
#pragma unroll
        for (int nt = 0; nt < NTQ; nt++)
#pragma unroll
          for (int e = 0; e < ACC; e++)
            s[nt].x[e] += sx[k][nt].x[e];

      /* ---- scale, mask, row maxima */
      float mx[ROWSLOTS];
#pragma unroll
      for (int sl = 0; sl < ROWSLOTS; sl++)
        mx[sl] = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < NTQ; nt++)
#pragma unroll
        for (int e = 0; e < ACC; e++) {
          int col = n0 + nt * MMA_N + acc_col(lane, e);
          int sl = slot_of(e);
          float v = s[nt].x[e] * sc[sl];
          if (!(pos0 + col < lim[sl] && vld[col]))
            v = -INFINITY;
          s[nt].x[e] = v;
          mx[sl] = fmaxf(mx[sl], v);
        }
#pragma unroll
      for (int sl = 0; sl < ROWSLOTS; sl++) {
        float m = row_max(mx[sl]);
        if (row_leader(lane))
          sPmax[tg * ROWS + rg * 16 + slot_row(lane, sl)] = m;
      }
      __syncthreads();

      /* ---- P = exp2(S - m) into the rope columns of the stage */
      float muse[ROWSLOTS], sum[ROWSLOTS];
#pragma unroll
      for (int sl = 0; sl < ROWSLOTS; sl++) {
        int row = rg * 16 + slot_row(lane, sl);
        float m_old = sM[cur + row], m = m_old;
#pragma unroll
        for (int t = 0; t < TG; t++)
          m = fmaxf(m, sPmax[t * ROWS + row]);
        muse[sl] = m == -INFINITY ? 0.f : m;
        sum[sl] = 0.f;
        if (tg == 0 && row_leader(lane)) {
          sCorr[row] = fast_exp2(m_old - muse[sl]);
          sM[nxt + row] = m;
        }
      }
#pragma unroll
      for (int nt = 0; nt < NTQ; nt++) {
        if (PAIRED) {
#pragma unroll
          for (int e = 0; e < ACC; e += 2) {
            int sl = slot_of(e);
            float p0 = fast_exp2(s[nt].x[e] - muse[sl]), p1 = fast_exp2(s[nt].x[e + 1] - muse[sl]);
            sum[sl] += p0 + p1;
            uint32_t pk = F16 ? pack_f16x2(p0, p1) : pack_bf16x2(p0, p1);
            *(uint32_t *)(sK + elem_off(rg * 16 + acc_row(lane, e), 64,
                                        n0 + nt * MMA_N + acc_col(lane, e))) = pk;
          }
        } else {
#pragma unroll
          for (int e = 0; e < ACC; e++) {
            int sl = slot_of(e);
            float p0 = fast_exp2(s[nt].x[e] - muse[sl]);
            sum[sl] += p0;
            *(uint16_t *)(sK + elem_off(rg * 16 + acc_row(lane, e), 64,
                                        n0 + nt * MMA_N + acc_col(lane, e))) = f_to_bf16(p0);
          }
        }
      }
#pragma unroll
      for (int sl = 0; sl < ROWSLOTS; sl++) {
        float t = row_sum(sum[sl]);
        if (row_leader(lane))
          sPsum[tg * ROWS + rg * 16 + slot_row(lane, sl)] = t;
      }
      __syncthreads();

      if (tid < ROWS) {
        float l = sL[tid] * sCorr[tid];
#pragma unroll
        for (int t = 0; t < TG; t++)
          l += sPsum[t * ROWS + tid];
        sL[tid] = l;
      }

      /* ---- O = O * corr + P V */
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        float corr[ROWSLOTS];
#pragma unroll
        for (int sl = 0; sl < ROWSLOTS; sl++)
          corr[sl] = sCorr[mt * 16 + slot_row(lane, sl)];
#pragma unroll
        for (int nt = 0; nt < NTV; nt++)
#pragma unroll
          for (int e = 0; e < ACC; e++)
            o[mt][nt].x[e] *= corr[slot_of(e)];
      }
#pragma unroll
      for (int ks = 0; ks < BN / 16; ks++) {
        FragA pa[MT];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
          ld_a(pa[mt], sK, mt * 16, 64 + ks * 2);
#pragma unroll
        for (int np = 0; np < NTV / 2; np++) {
          FragB b0, b1;
          ld_b_kn2(b0, b1, sK, ks * 16, (warp * DW + np * 2 * MMA_N) / 8);
#pragma unroll
          for (int mt = 0; mt < MT; mt++) {
            mma<F16>(o[mt][2 * np], pa[mt], b0);
            mma<F16>(o[mt][2 * np + 1], pa[mt], b1);
          }
        }
      }
      /* FP8: block b + 1's rows, loaded while this block computed, into
       * the stage block b - 1 left (free since this iteration's barrier) */
      if (FP8 && STAGES == 2 && b + 1 < nblk)
        fp8_store((b + 1) % STAGES);
    }
    cp_wait<0>();
    __syncthreads();

    /* ---- epilogue (a batch-invariant item with PMLA_WI_FOLD folds into
     * the accumulator in its slot, fold.h; with PMLA_WI_FINAL it writes
     * the fold to out and lse) */
    const int mfin = (nblk & 1) * ROWS;
    const int64_t obase =
        pslot >= 0 ? (int64_t)pslot * p.max_q_len * H + row0 : (int64_t)qb * H + row0;
    const int32_t wflags = FOLD ? w[PMLA_WI_PIECE] : 0;
    const bool fold = FOLD && pslot >= 0 && (wflags & PMLA_WI_FOLD), final = wflags & PMLA_WI_FINAL;
    const int64_t fbase = (int64_t)qb * H + row0;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int sl = 0; sl < ROWSLOTS; sl++) {
        int rl = mt * 16 + slot_row(lane, sl);
        if (rl >= nrows)
          continue;
        float l = sL[rl], inv = pmla_sum_scale(out_scale, l);
        int64_t ro = (obase + rl) * PMLA_V_DIM;
        const int64_t fo = (fbase + rl) * PMLA_V_DIM;
        pmla_fold_w fw = {1.f, 0.f, 0.f};
        /* a folding item's accumulator values, all loaded before any store
         * (the stores may alias them: loads interleaved with stores would
         * each wait out a latency) */
        float acc_in[NTV][ACC];
        if (fold) {
          fw = pmla_fold_weights(p.partial_lse[obase + rl],
                                 row_lse(sM[mfin + rl], l));
#pragma unroll
          for (int nt = 0; nt < NTV; nt++)
#pragma unroll
            for (int e = 0; e < ACC; e++)
              if (slot_of(e) == sl)
                acc_in[nt][e] = p.partial_out[ro + warp * DW + nt * MMA_N + acc_col(lane, e)];
        }
#pragma unroll
        for (int nt = 0; nt < NTV; nt++) {
          if (PAIRED) {
#pragma unroll
            for (int e = 0; e < ACC; e += 2) {
              if (slot_of(e) != sl)
                continue;
              int col = warp * DW + nt * MMA_N + acc_col(lane, e);
              float v0 = o[mt][nt].x[e] * inv, v1 = o[mt][nt].x[e + 1] * inv;
              if (fold) {
                const float f0 = pmla_fold(acc_in[nt][e], v0, fw),
                            f1 = pmla_fold(acc_in[nt][e + 1], v1, fw);
                if (final)
                  *(uint32_t *)(p.out + fo + col) = pack_bf16x2(f0, f1);
                else
                  *(float2 *)(p.partial_out + ro + col) = make_float2(f0, f1);
              } else if (pslot >= 0) {
                *(float2 *)(p.partial_out + ro + col) = make_float2(v0, v1);
              } else {
                *(uint32_t *)(p.out + ro + col) =
                    pack_bf16x2(v0, v1);
              }
            }
          } else {
#pragma unroll
            for (int e = 0; e < ACC; e++) {
              if (slot_of(e) != sl)
                continue;
              int col = warp * DW + nt * MMA_N + acc_col(lane, e);
              float v0 = o[mt][nt].x[e] * inv;
              if (fold) {
                const float f0 = pmla_fold(acc_in[nt][e], v0, fw);
                if (final)
                  p.out[fo + col] = f_to_bf16(f0);
                else
                  p.partial_out[ro + col] = f0;
              } else if (pslot >= 0) {
                p.partial_out[ro + col] = v0;
              } else {
                p.out[ro + col] = f_to_bf16(v0);
              }
            }
          }
        }
      }
    if (fold) /* every thread has read the accumulator's lse */
      __syncthreads();
    if (tid < nrows) {
      float l = sL[tid];
      float lse = row_lse(sM[mfin + tid], l);
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
    __syncthreads();
  }
}

template <int MT, int F, bool FOLD>
__global__ void __launch_bounds__(Cfg<MT>::NT, Shape<MT>::OCC)
    pmla_decode_kernel(pmla_gpu_problem p, float scale_log2) {
  pdl_wait();
  pdl_trigger();
  decode_body<MT, F, FOLD>(p, scale_log2);
}
template <int MT, int F, bool FOLD>
hipError_t launch_decode(const pmla_gpu_problem &p, int tiles, hipStream_t st) {
  static unsigned long long opted_in = 0;
  const size_t smem = Cfg<MT>::SMEM;
  hipError_t e =
      pmla_opt_in_smem((const void *)pmla_decode_kernel<MT, F, FOLD>, smem, &opted_in);
  if (e != hipSuccess)
    return e;
  dim3 grid((unsigned)p.num_units, (unsigned)tiles);
  return pdl_launch(pmla_decode_kernel<MT, F, FOLD>, grid, dim3(Cfg<MT>::NT), smem, st, p,
                    p.softmax_scale * LOG2E_F);
}
/* the batch-invariant epilogue is a variant of its own (its registers would
 * otherwise count against the default one) */
template <int MT, int F>
hipError_t launch_fold(const pmla_gpu_problem &p, int tiles, hipStream_t st) {
  return p.fold ? launch_decode<MT, F, true>(p, tiles, st)
                : launch_decode<MT, F, false>(p, tiles, st);
}
template <int MT> hipError_t launch_format(const pmla_gpu_problem &p, int tiles, hipStream_t st) {
  switch (p.kv_format) {
  case PMLA_KV_E4M3:
    return launch_fold<MT, PMLA_KV_E4M3>(p, tiles, st);
  case PMLA_KV_DS_MLA:
    return launch_fold<MT, PMLA_KV_DS_MLA>(p, tiles, st);
  default:
    return launch_fold<MT, PMLA_KV_BF16>(p, tiles, st);
  }
}

} /* namespace */

hipError_t pmla_launch_decode_mma(const pmla_gpu_problem &p, int mt, int tiles, hipStream_t st) {
  switch (mt) {
#ifdef PMLA_PLATFORM_NVIDIA
  case 2:
    return launch_format<2>(p, tiles, st);
  case 4:
    return launch_format<4>(p, tiles, st);
#endif
  default:
    return launch_format<1>(p, tiles, st);
  }
}
