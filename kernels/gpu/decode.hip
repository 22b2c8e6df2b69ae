/* decode.hip - the persistent split-KV MLA decode kernel (the reduce of
 * split requests is combine.hip, launched right after it).
 *
 * Grid (num_units, head_tiles). Work-group (u, t) walks the work items of
 * unit u (work_indptr[u] .. work_indptr[u+1]) for the rows [t*ROWS,
 * (t+1)*ROWS) of each item; a row is a (query row, head) pair, row
 * i = j * H + h. ROWS is 16, 32 or 64 (NVIDIA) from heads * max_q_len.
 *
 * Per item: the Q tile (ROWS x 576 bf16) goes to shared memory once; KV
 * positions [kv_begin, kv_end) stream through STAGES shared-memory stages of
 * BN tokens (cp.async, gathered row by row through pmla_kv_map; positions
 * past the item, skipped slots and bad indices are zero-filled, never
 * loaded, so NaN-poisoned slots cannot reach the PV product). Per block:
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
 * [slot][q_local][head][512]); combine.hip merges them by lse.
 *
 * Bad device input never faults: a page/slot outside [0, num_slots) is
 * skipped and ORs PAGE_INDEX / SLOT_INDEX into work_meta_data[ERROR]; query
 * rows beyond num_tokens skip the item and OR QO_INDPTR.
 *
 * The reduce is a second launch (combine.hip). A fused last-piece-merges
 * reduce needs a per-entry arrival counter that is zeroed every step;
 * pmla_gpu_problem has no such buffer, so it is not done (nor measured).
 *
 * NVIDIA tiles (Shape<MT>): 64- and 32-row tiles 8 warps, BN 64, 2 stages
 * (64-row tile: 72 KiB Q + 144 KiB KV), one work-group per SM; on sm_90a the
 * 64-row tile runs the wgmma kernel pmla_decode_wg_kernel (see wg:: below,
 * same semantics, two warpgroups); 16-row tiles
 * 4 warps, BN 32, 2 stages, two work-groups per SM. 16 warps for 64-row
 * tiles and split QK accumulators were measured slower on an H200 and are
 * left as PMLA_MT4_WARPS / PMLA_MT4_KACC knobs.
 *
 * Launchers allocate nothing and never synchronise (graph-capturable). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "hip_compat.h"
#include "combine.h"
#include "mla_gpu.h"
#include "mma.h"
#include "pdl.h"
#ifdef PMLA_PLATFORM_NVIDIA
#include <cudaTypedefs.h> /* CUtensorMap, PFN_cuTensorMapEncodeTiled */
#endif

namespace {

using namespace pmla_mma;

#ifdef PMLA_PLATFORM_NVIDIA
#ifndef PMLA_MT4_WARPS
#define PMLA_MT4_WARPS 8
#endif
/* Per-tile-size shapes (knobs for measurement). 16-row tiles are latency
 * bound per warp (few rows, three barriers per block; H200 stall samples:
 * fixed-latency and shared-memory dependencies, not DRAM), so two small
 * independent work-groups share an SM (OCC, and twice the planner units)
 * and overlap each other's barriers and softmax: 212 -> 200 us at
 * b=128 L=4096 h=16. Deeper pipelines alone (32-token blocks x 4-5 stages,
 * one work-group) were slower (259 us), as was OCC 2 for 32-row tiles (no
 * gain) and 2 warps x 16 tokens x OCC 4 (same as OCC 2). */
#ifndef PMLA_MT1_WARPS
#define PMLA_MT1_WARPS 4
#endif
#ifndef PMLA_MT1_BN
#define PMLA_MT1_BN 32
#endif
#ifndef PMLA_MT1_STAGES
#define PMLA_MT1_STAGES 2
#endif
#ifndef PMLA_MT1_OCC
#define PMLA_MT1_OCC 2
#endif
#ifndef PMLA_MT2_WARPS
#define PMLA_MT2_WARPS 8
#endif
#ifndef PMLA_MT2_BN
#define PMLA_MT2_BN 64
#endif
#ifndef PMLA_MT2_STAGES
#define PMLA_MT2_STAGES 2
#endif
#ifndef PMLA_MT2_OCC
#define PMLA_MT2_OCC 1
#endif
constexpr int MAX_MT = 4;
constexpr int MT4_WARPS = PMLA_MT4_WARPS; /* 64-row tiles: 16 measured slower */
template <int MT> struct Shape {
  static constexpr int NW = MT == 4 ? MT4_WARPS : MT == 1 ? PMLA_MT1_WARPS : PMLA_MT2_WARPS;
  static constexpr int BN = MT == 4 ? 64 : MT == 1 ? PMLA_MT1_BN : PMLA_MT2_BN;
  static constexpr int STAGES = MT == 4 ? 2 : MT == 1 ? PMLA_MT1_STAGES : PMLA_MT2_STAGES;
  static constexpr int OCC = MT == 4 ? 1 : MT == 1 ? PMLA_MT1_OCC : PMLA_MT2_OCC; /* per SM */
};
#ifndef PMLA_MT4_KACC
#define PMLA_MT4_KACC 1
#endif
#else
/* CDNA: 64 KiB of LDS per work-group */
constexpr int NWARPS = 2, MAX_MT = 1;
constexpr int MT4_WARPS = NWARPS;
template <int MT> struct Shape {
  static constexpr int NW = NWARPS, BN = 32, STAGES = 1, OCC = 1;
};
#define PMLA_MT4_KACC 1
#endif
constexpr int KSTEPS = PMLA_QK_DIM / 16;
constexpr int PITCH = PMLA_TILE_PITCH;
constexpr float LOG2E_F = 1.4426950408889634f;
constexpr float LN2_F = 0.6931471805599453f;

/* The smallest row tile (in 16-row units), per builder: see
 * pmla_gpu_min_mt. PMLA_MIN_MT 1 or 4 forces it. */
#ifndef PMLA_MIN_MT
#define PMLA_MIN_MT 0
#endif
bool g_wgmma_loaded = false; /* the sm_90a image runs here (pmla_gpu_prepare) */
int host_mt(int H, int mq, int min_mt) {
  long rows = (long)H * mq;
  int mt = rows <= 16 ? 1 : rows <= 32 ? 2 : 4;
  if (mt < min_mt)
    mt = min_mt;
  return mt > MAX_MT ? MAX_MT : mt;
}
int host_tiles(int H, int mq, int min_mt) {
  long rows = (long)H * mq, per = 16L * host_mt(H, mq, min_mt);
  return (int)((rows + per - 1) / per);
}

template <int MT> struct Cfg {
  static constexpr int NW = Shape<MT>::NW, BN = Shape<MT>::BN, STAGES = Shape<MT>::STAGES;
  static constexpr int NT = NW * WARP;
  static constexpr int QKU = MT == 4 ? PMLA_MT4_KACC : 4; /* QK unroll: MT 4 is register bound */
  /* independent QK accumulator sets, to break the 36-deep mma chain */
  static constexpr int KACC = MT == 4 ? PMLA_MT4_KACC : (MT == 1 ? 4 : 2);
  static constexpr int ROWS = MT * 16;
  static constexpr int TG = NW / MT;     /* token groups in QK */
  static constexpr int TW = BN / TG;         /* tokens per warp in QK */
  static constexpr int NTQ = TW / MMA_N;     /* n-tiles per warp in QK */
  static constexpr int DW = PMLA_V_DIM / NW; /* output columns per warp */
  static constexpr int NTV = DW / MMA_N;
  static constexpr int TPT = NT / BN;        /* loader threads per token */
  static constexpr size_t SMEM = (size_t)ROWS * PITCH + (size_t)STAGES * BN * PITCH +
                                 sizeof(float) * (2 * TG * ROWS + 4 * ROWS) +
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

__device__ __forceinline__ void cp16(char *dst, const char *src, bool valid) {
#if defined(PMLA_PLATFORM_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                   (uint32_t)__cvta_generic_to_shared(dst)),
               "l"(src), "r"(valid ? 16 : 0));
#else
  uint4 v = valid ? *(const uint4 *)src : make_uint4(0, 0, 0, 0);
  *(uint4 *)dst = v;
#endif
}
__device__ __forceinline__ void cp_commit() {
#if defined(PMLA_PLATFORM_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N> __device__ __forceinline__ void cp_wait() {
#if defined(PMLA_PLATFORM_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

/* The raw map entry of position p of request r (page, or top-k slot), read
 * one block ahead of its use so the gather's index load is off the
 * critical path. csr_first: kv_indptr[r] (CSR only). */
__device__ __forceinline__ int32_t kv_raw(const pmla_kv_map &m, int32_t r, int32_t p,
                                          int32_t csr_first) {
  if (m.topk)
    return m.topk[(int64_t)r * m.topk_stride + p];
  int32_t pg = p / m.page_size;
  return m.block_table ? m.block_table[(int64_t)r * m.block_table_stride + pg]
                       : m.kv_indices[csr_first + pg];
}
/* Global slot from a raw entry, or -1 to skip (bad indices flagged). */
__device__ __forceinline__ int64_t kv_slot(const pmla_kv_map &m, int32_t raw, int32_t p,
                                           int32_t *err, bool flag) {
  if (m.topk) {
    if (raw == -1) /* an unused top-k entry */
      return -1;
    if (raw < 0 || raw >= m.num_slots) {
      if (flag)
        atomicOr(err, (int)PMLA_PLAN_ERR_SLOT_INDEX);
      return -1;
    }
    return raw;
  }
  int64_t slot = (int64_t)raw * m.page_size + p % m.page_size;
  if (raw < 0 || slot >= m.num_slots) {
    if (flag)
      atomicOr(err, (int)PMLA_PLAN_ERR_PAGE_INDEX);
    return -1;
  }
  return slot;
}

template <int MT>
__device__ __forceinline__ void decode_body(const pmla_gpu_problem &p, float scale_log2) {
  using C = Cfg<MT>;
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

  const int tid = threadIdx.x, warp = tid / WARP, lane = tid % WARP;
  const int H = p.num_heads;
  const int u = blockIdx.x, row0 = blockIdx.y * ROWS;
  const int rg = warp % MT, tg = warp / MT;
  int32_t *errw = p.work_meta_data + PMLA_META_ERROR;
  const char *kvbase = (const char *)p.kv;

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
    /* loads block blk (whose raw entry is raw_next) and prefetches blk + 1's */
    auto load_block = [&](int blk, int st) {
      const int pos = kb + blk * BN + ld_t;
      int64_t slot = pos < ke ? kv_slot(p.map, raw_next, pos, errw, ld_sub == 0 && blockIdx.y == 0)
                              : -1;
      bool v = slot >= 0;
      if (ld_sub == 0)
        sValid[st * BN + ld_t] = v;
      const char *src = v ? kvbase + slot * PITCH : kvbase;
      char *dst = sKV + st * BN * PITCH;
#pragma unroll
      for (int k = 0; k < PMLA_TILE_CHUNKS / TPT; k++) {
        int c = ld_sub + k * TPT;
        cp16(dst + tile_off(ld_t, c), src + (v ? c * 16 : 0), v);
      }
      raw_next = raw_at(blk + 1);
    };

#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
      if (s < nblk)
        load_block(s, s);
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
          mma(sacc(ks % KACC, 0), a0, b0);
          mma(sacc((ks + 1) % KACC, 0), a1, b1);
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
            mma(sacc(ks % KACC, 2 * np), a, b0);
            mma(sacc(ks % KACC, 2 * np + 1), a, b1);
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
          float v = s[nt].x[e] * scale_log2;
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
            uint32_t pk = pack_bf16x2(p0, p1);
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
            mma(o[mt][2 * np], pa[mt], b0);
            mma(o[mt][2 * np + 1], pa[mt], b1);
          }
        }
      }
    }
    cp_wait<0>();
    __syncthreads();

    /* ---- epilogue */
    const int mfin = (nblk & 1) * ROWS;
    const int64_t obase =
        pslot >= 0 ? (int64_t)pslot * p.max_q_len * H + row0 : (int64_t)qb * H + row0;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int sl = 0; sl < ROWSLOTS; sl++) {
        int rl = mt * 16 + slot_row(lane, sl);
        if (rl >= nrows)
          continue;
        float l = sL[rl], inv = l > 0.f ? 1.f / l : 0.f;
        int64_t ro = (obase + rl) * PMLA_V_DIM;
#pragma unroll
        for (int nt = 0; nt < NTV; nt++) {
          if (PAIRED) {
#pragma unroll
            for (int e = 0; e < ACC; e += 2) {
              if (slot_of(e) != sl)
                continue;
              int col = warp * DW + nt * MMA_N + acc_col(lane, e);
              float v0 = o[mt][nt].x[e] * inv, v1 = o[mt][nt].x[e + 1] * inv;
              if (pslot >= 0) {
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
              if (pslot >= 0)
                p.partial_out[ro + col] = v0;
              else
                p.out[ro + col] = f_to_bf16(v0);
            }
          }
        }
      }
    if (tid < nrows) {
      float l = sL[tid];
      float lse = l > 0.f ? (sM[mfin + tid] + log2f(l)) * LN2_F : -INFINITY;
      if (pslot >= 0)
        p.partial_lse[obase + tid] = lse;
      else if (p.lse)
        p.lse[obase + tid] = lse;
    }
    __syncthreads();
  }
}

template <int MT>
__global__ void __launch_bounds__(Cfg<MT>::NT, Shape<MT>::OCC)
    pmla_decode_kernel(pmla_gpu_problem p, float scale_log2) {
  pdl_wait();
  pdl_trigger();
  decode_body<MT>(p, scale_log2);
}

#ifdef PMLA_PLATFORM_NVIDIA
/* ------------------------------------------------ sm_90a wgmma 64-row tile
 * Same work, masking and outputs as decode_body<4>, on two warpgroups.
 * Shared memory holds every 576-dim row (Q and each of two KV stages) as 9
 * column blocks of 64 rows x 64 bf16 (128 B), each block in the canonical
 * K-major 128-byte-swizzle layout (16-byte chunk j of row r at chunk
 * j ^ (r & 7); blocks 1024-byte aligned): the layout TMA writes with
 * CU_TENSOR_MAP_SWIZZLE_128B and the cp.async gather reproduces. Per
 * 64-token block (body_pp, the default):
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
 * Measured on an H200 (us, b=128 L=4096 h=128, side by side per step):
 * mma.sync 701 -> two-warpgroup QK 517 -> body_pp 494 (session 1); softmax
 * without per-element shared loads, integer bf16 rounding or exp2f's range
 * fix-up 501 -> 432; TMA loads 432 -> 310. Profiles (ncu, source counters)
 * of the step before TMA: the loader's 36 cp.async per thread per block
 * held warpgroup 1 and congested the MIO queue that warpgroup 0's
 * shuffles use.
 * PMLA_WG_PP=2 selects body_ss, the seesaw (both warpgroups compute QK on
 * alternate blocks); it passes the conformance suite but measured slower in
 * every form (490 vs 432 us with cp.async, 405 vs 308 with TMA: a
 * warpgroup's next block is issued only once the other frees the stage).
 * Compiled only for sm_90a (wgmma); every other NVIDIA target runs
 * decode_body<4> inside the same kernel (same block size and smem bound).
 * PMLA_WGMMA=0 selects the mma.sync kernel for 64-row tiles everywhere. */
#ifndef PMLA_WGMMA
#define PMLA_WGMMA 1
#endif
#ifndef PMLA_WG_PP
#define PMLA_WG_PP 1
#endif
/* PMLA_WG_SPLIT 1 (body_ss only): each warpgroup reloads the half of a
 * stage that only its own PV read as soon as that PV is done, and the rest
 * after the other warpgroup frees the stage (see body_ss). */
#ifndef PMLA_WG_SPLIT
#define PMLA_WG_SPLIT 0
#endif
/* PMLA_FUSED_REDUCE 1: body_pp merges a split request's partials in the
 * work-group that finishes its last piece (per head tile) and no reduce
 * kernel is launched for the 64-row wgmma path; 0 (default): the separate
 * reduce kernel (measured faster, README). */
#ifndef PMLA_FUSED_REDUCE
#define PMLA_FUSED_REDUCE 0
#endif
/* PMLA_WG_TMA 1 (default): body_pp loads a KV block that is one whole,
 * valid, page-aligned run of 64 slots (page sizes that are multiples of 64)
 * with nine TMA copies issued by one thread; every other block takes the
 * per-token cp.async path. */
#ifndef PMLA_WG_TMA
#define PMLA_WG_TMA 1
#endif
#if PMLA_WGMMA && defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PMLA_WG_DEVICE 1
#endif
namespace wg {
constexpr int BN = 64, ROWS = 64, NT = 256;
constexpr int BLK = 64 * 128;     /* one column block: 64 rows x 128 B */
constexpr int TILE = 9 * BLK;     /* 64 rows x 576 bf16 */
constexpr size_t SMEM = 1024 /* alignment slack */ + 3 * (size_t)TILE +
                        sizeof(float) * 8 * ROWS + sizeof(int) * 2 * BN;
static_assert(SMEM <= 232448, "shared memory per block (sm_90)");
static_assert(Cfg<4>::NT == NT, "the fallback body runs with the same block");
constexpr size_t LAUNCH_SMEM = SMEM > Cfg<4>::SMEM ? SMEM : Cfg<4>::SMEM;

#ifdef PMLA_WG_DEVICE
/* byte offset of 16-byte chunk c (0..71) of row r (0..63) */
__device__ __forceinline__ uint32_t off(int r, int c) {
  return (uint32_t)((c >> 3) * BLK + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}
/* smem matrix descriptor: start, leading / stride byte offsets, 128B swizzle */
__device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((addr & 0x3ffff) >> 4) | ((uint64_t)(lbo >> 4) << 16) |
         ((uint64_t)(sbo >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_wait0() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
__device__ __forceinline__ void wg_wait1() {
  asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
}
__device__ __forceinline__ void proxy_fence() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/* keeps uses of the accumulators after the wait that completes them */
template <int N> __device__ __forceinline__ void reg_fence(float *d) {
#pragma unroll
  for (int i = 0; i < N; i++)
    asm volatile("" : "+f"(d[i])::"memory");
}
__device__ __forceinline__ void mma_n64(float *d, uint64_t da, uint64_t db) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
               "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
               "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
               "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                 "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                 "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
                 "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                 "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                 "+f"(d[30]), "+f"(d[31])
               : "l"(da), "l"(db));
}
/* B stored MN-major (V rows: [token][dim]) */
__device__ __forceinline__ void mma_n256_tb(float *d, uint64_t da, uint64_t db) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
               "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
               "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
               "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
               "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
               "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
               "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"
               "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"
               "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
               "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                 "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                 "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
                 "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                 "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                 "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                 "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
                 "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                 "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),
                 "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
                 "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]),
                 "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
                 "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]),
                 "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
                 "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]),
                 "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
                 "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]),
                 "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]),
                 "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]),
                 "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
                 "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]),
                 "+f"(d[126]), "+f"(d[127])
               : "l"(da), "l"(db));
}

/* One QK warpgroup (body_pp): warpgroup 0 computes all of S[64 x 64]
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
 * loader gives after waiting on PREADY(b)), so the parities stay in step. */
__device__ __forceinline__ void nb_sync(int id) {
  asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory");
}
__device__ __forceinline__ void nb_arrive(int id) {
  asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory");
}
/* mbarrier and TMA (sm_90): a stage's "full" barrier counts the 128 loader
 * threads' arrivals plus, for a TMA block, the bytes the copies deliver */
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile("{\n.reg .pred done;\nWAIT:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
               "@!done bra WAIT;\n}\n" ::"r"(bar),
               "r"(parity)
               : "memory");
}
/* one 64-column x 64-row box of the KV cache into a 128B-swizzled block */
__device__ __forceinline__ void tma_box(uint32_t dst, const CUtensorMap *map, int col, int row,
                                        uint32_t bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
               "l"((uint64_t)map), "r"(col), "r"(row), "r"(bar)
               : "memory");
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
#if PMLA_FUSED_REDUCE
/* The fused reduce: the work-group that writes the last of a split
 * request's partials for its head tile merges that tile's rows, so no
 * reduce kernel runs. Arrivals are counted per (request, tile) in
 * merge_counts; the last arriver resets its counter for the next step.
 * first_slot: the request's first partial slot (its reduce entry starts
 * there). */
__device__ __noinline__ void merge_if_last(const pmla_gpu_problem &p, int32_t r,
                                           int32_t first_slot, int32_t qb, int row0,
                                           int nrows) {
  __shared__ int s_entry;
  __threadfence(); /* this thread's partial stores, before the arrival */
  __syncthreads();
  if (threadIdx.x == 0) {
    const int nred = p.work_meta_data[PMLA_META_NUM_REDUCE];
    int lo = 0, hi = nred; /* the entry whose slots start at first_slot */
    while (lo < hi) {
      int mid = (lo + hi) / 2;
      if (p.reduce_indptr[mid] < first_slot)
        lo = mid + 1;
      else
        hi = mid;
    }
    const int pieces = p.reduce_indptr[lo + 1] - p.reduce_indptr[lo];
    int32_t *count = p.merge_counts + (int64_t)r * gridDim.y + blockIdx.y;
    const int before = atomicAdd(count, 1);
    s_entry = before == pieces - 1 ? lo : -1;
    if (before == pieces - 1)
      *count = 0;
  }
  __syncthreads();
  const int k = s_entry;
  if (k < 0)
    return;
  __threadfence(); /* the other pieces' partials, after their arrivals */
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int rl = warp; rl < nrows; rl += NT / 32)
    pmla_merge::merge_row(p, k, row0 + rl, qb, lane);
}
#endif

/* O *= corr by row; skipped when no row of the warp changed its maximum,
 * which after the first blocks is the common case */
__device__ __forceinline__ void wg_scale_o(float (&o)[128], float c0, float c1) {
  if (!__any_sync(0xffffffffu, c0 != 1.f || c1 != 1.f))
    return;
#pragma unroll
  for (int e = 0; e < 128; e++)
    o[e] *= (e & 2) ? c1 : c0;
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
#ifdef PMLA_WG_NOLOAD /* diagnostic: time without KV traffic (wrong results) */
        if (blk >= 2) {
          raw_next = -1;
          return true;
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
          mma_n256_tb(o, desc(aK + 8 * BLK + kk * 32, 16, 1024),
                      desc(aK + 4 * BLK + kk * 16 * 128, BLK, 1024));
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
          mma_n64(s, desc(aQ + ko, 16, 1024), desc(aK + ko, 16, 1024));
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
          mma_n256_tb(o, desc(aK + 8 * BLK + kk * 32, 16, 1024),
                      desc(aK + kk * 16 * 128, BLK, 1024));
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

    /* ---- epilogue */
    const int64_t obase =
        pslot >= 0 ? (int64_t)pslot * p.max_q_len * H + row0 : (int64_t)qb * H + row0;
#pragma unroll
    for (int sl = 0; sl < 2; sl++) {
      int rl = myrow[sl];
      if (rl >= nrows)
        continue;
      float l = sL[rl], inv = l > 0.f ? 1.f / l : 0.f;
      int64_t ro = (obase + rl) * PMLA_V_DIM;
#pragma unroll
      for (int j = 0; j < 32; j++) {
        int col = g * 256 + j * 8 + ((lane & 3) << 1);
        float v0 = o[4 * j + 2 * sl] * inv, v1 = o[4 * j + 2 * sl + 1] * inv;
        if (pslot >= 0)
          *(float2 *)(p.partial_out + ro + col) = make_float2(v0, v1);
        else
          *(uint32_t *)(p.out + ro + col) =
              pack_bf16x2(v0, v1);
      }
    }
    if (tid < nrows) {
      float l = sL[tid];
      float lse = l > 0.f ? (sM[tid] + log2f(l)) * LN2_F : -INFINITY;
      if (pslot >= 0)
        p.partial_lse[obase + tid] = lse;
      else if (p.lse)
        p.lse[obase + tid] = lse;
    }
#if PMLA_FUSED_REDUCE
    if (pslot >= 0)
      merge_if_last(p, r, pslot - w[PMLA_WI_PIECE], qb, row0, nrows);
#endif
    __syncthreads();
  }
}
/* The seesaw (PMLA_WG_PP=2): the two warpgroups take KV blocks in pairs,
 * warpgroup 0 the even block (stage 0), warpgroup 1 the odd one (stage 1);
 * each loads its own block and computes its S = Q K^T, so the 36-step QK no
 * longer sits on one warpgroup's chain. Warpgroup 0 owns O[:, 0:256],
 * warpgroup 1 O[:, 256:512]. Per pair (b0 = 2i in stage 0, b1 = 2i + 1 in
 * stage 1), with m the running row max both sides keep:
 *   wg0: S0; m_a = max(m, rowmax S0); P0 = exp2(S0 - m_a)    -> SCALE0 (m_a)
 *   wg1: S1;                      (waits SCALE0) m_b = max(m_a, rowmax S1)
 *        P1 = exp2(S1 - m_b); O_R *= exp2(m - m_b)            -> SCALE1 (m_b)
 *        P1 to stage 1's rope block                           -> P1READY
 *        O_R += P1 V1_R (A = P1 from registers)
 *   wg0: O_L *= exp2(m - m_a); O_L += P0 V0_L (A from registers); (waits
 *        SCALE1) P0 * exp2(m_a - m_b) to stage 0's rope block -> P0READY
 *   wg1: (waits P0READY) O_R += P0' V0_R, then O_R += P1 V1_R (A from
 *        registers); when the first is done                    -> FREE0
 *   wg0: O_L *= exp2(m_a - m_b); (waits FREE0) loads the next even block
 *        into stage 0 (no wgmma in flight: ptxas serialises wgmma across the
 *        loader's divergent code); (waits P1READY) O_L += P1 V1_L; done
 *                                                               -> FREE1
 *   wg1: (waits FREE1) loads the next odd block into stage 1
 * Each side keeps its own row sum; they add up in the epilogue. A pair
 * without an odd block runs the same hand-offs with m_b = m_a and no P1.
 * One barrier id per hand-off is enough: before either side can arrive at
 * a hand-off a second time it must have waited on the other side's later
 * hand-off, which comes after the first one was consumed. Writing P over
 * the rope block is safe once every warp of the warpgroup has finished its
 * QK; the wait on SCALE0 / SCALE1 (all 128 threads of the writer's
 * warpgroup take part) guarantees that. */
__device__ __forceinline__ void nb_sync_wg(int id) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory");
}
/* B stored MN-major (V rows), A = four registers of packed bf16 per thread */
__device__ __forceinline__ void mma_n256_rs(float *d, const uint32_t *a, uint64_t db) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
               "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
               "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
               "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
               "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
               "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
               "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"
               "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"
               "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
               "}, {%128,%129,%130,%131}, %132, p, 1, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                 "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                 "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
                 "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                 "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                 "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                 "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
                 "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                 "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),
                 "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
                 "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]),
                 "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
                 "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]),
                 "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
                 "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]),
                 "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
                 "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]),
                 "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]),
                 "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]),
                 "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
                 "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]),
                 "+f"(d[126]), "+f"(d[127])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
/* S[64 x 64] = Q K^T over 576 dims, both from shared memory */
__device__ __forceinline__ void ss_qk(float (&s)[32], uint32_t aQ, uint32_t aK) {
#pragma unroll
  for (int e = 0; e < 32; e++)
    s[e] = 0.f;
  reg_fence<32>(s);
  wg_fence();
#pragma unroll
  for (int ks = 0; ks < KSTEPS; ks++) {
    uint32_t ko = (ks >> 2) * BLK + (ks & 3) * 32;
    mma_n64(s, desc(aQ + ko, 16, 1024), desc(aK + ko, 16, 1024));
  }
  wg_commit();
  wg_wait0();
  reg_fence<32>(s);
}
/* P = exp2(S scale - m) in place; returns this lane's share of the row
 * sums (the four lanes of a row are summed once, in the epilogue) */
__device__ __forceinline__ void ss_exp(float (&s)[32], float scale_log2, const float (&muse)[2],
                                       float (&sum)[2]) {
  sum[0] = sum[1] = 0.f;
#pragma unroll
  for (int e = 0; e < 32; e++) {
    s[e] = fast_exp2(fmaf(s[e], scale_log2, -muse[(e >> 1) & 1]));
    sum[(e >> 1) & 1] += s[e];
  }
}
/* the accumulator of S, as bf16, is the A operand of the PV k-steps:
 * k-step kk takes n-tiles 2kk and 2kk + 1 */
__device__ __forceinline__ void ss_pack(const float (&s)[32], uint32_t (&pa)[16]) {
#pragma unroll
  for (int i = 0; i < 16; i++)
    pa[i] = pack_bf16x2(s[2 * i], s[2 * i + 1]);
}
/* P * (f0, f1 by row) as bf16 into a stage's rope block (64 rows x 64
 * tokens, swizzled) */
__device__ __forceinline__ void ss_store_p(char *sP, const float (&s)[32], float f0, float f1,
                                           const int (&myrow)[2], int lane) {
#pragma unroll
  for (int i = 0; i < 16; i++) {
    int row = myrow[i & 1], col = (i >> 1) * 8 + ((lane & 3) << 1);
    float f = (i & 1) ? f1 : f0;
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
/* O[:, 256 half..] += P V over one stage; P from registers or from the
 * stage's rope block */
__device__ __forceinline__ void ss_pv_rs(float (&o)[128], uint32_t (&pa)[16], uint32_t aK,
                                         int half) {
  reg_fence<128>(o);
  reg_fence_u(pa); /* the packing happens before the fence */
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < BN / 16; kk++)
    mma_n256_rs(o, pa + 4 * kk, desc(aK + half * 4 * BLK + kk * 16 * 128, BLK, 1024));
  wg_commit();
}
__device__ __forceinline__ void ss_pv_ss(float (&o)[128], uint32_t aK, int half) {
  reg_fence<128>(o);
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < BN / 16; kk++)
    mma_n256_tb(o, desc(aK + 8 * BLK + kk * 32, 16, 1024),
                desc(aK + half * 4 * BLK + kk * 16 * 128, BLK, 1024));
  wg_commit();
}
__device__ __forceinline__ void ss_pv_wait(float (&o)[128]) {
  wg_wait0();
  reg_fence<128>(o);
}
__device__ __forceinline__ void body_ss(const pmla_gpu_problem &p, float scale_log2,
                                        const CUtensorMap *kv_tmap, int use_tma) {
  extern __shared__ __align__(1024) char smem_wg[];
  char *sQ = smem_wg + ((1024u - (smem_u32(smem_wg) & 1023u)) & 1023u);
  char *sKV = sQ + TILE;
  float *sMa = (float *)(sKV + 2 * TILE); /* m_a of the current pair */
  float *sMb = sMa + ROWS;               /* m_b of the current pair */
  float *sM = sMb + ROWS;                /* final row max */
  float *sL0 = sM + ROWS, *sL1 = sL0 + ROWS;
  uint64_t *sVm = (uint64_t *)(sL1 + ROWS); /* [2]: token validity bits by stage */

  const int tid = threadIdx.x, g = tid >> 7, wi = (tid >> 5) & 3, lane = tid & 31;
  const int t = tid & 127;
  /* this warpgroup's stage-loaded mbarrier (TMA blocks only: one arrival
   * with the byte count, by the thread that issues the copies) */
  const uint32_t aLoad = smem_u32(sVm + 2) + 8 * g;
  if (tid == 0) {
    mbar_init(aLoad, 1);
    mbar_init(aLoad + 8, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  uint32_t ld_phase = 0;
  const int H = p.num_heads;
  const int u = blockIdx.x, row0 = blockIdx.y * ROWS;
  int32_t *errw = p.work_meta_data + PMLA_META_ERROR;
  const char *kvbase = (const char *)p.kv;
  const uint32_t aQ = smem_u32(sQ);
  char *sK = sKV + g * TILE; /* this warpgroup's stage */
  const uint32_t aK0 = smem_u32(sKV), aK1 = aK0 + TILE;
  int myrow[2];
  myrow[0] = wi * 16 + (lane >> 2);
  myrow[1] = myrow[0] + 8;
  enum { LOC = 1 /* + g */, SCALE0 = 3, SCALE1, P0READY, P1READY, FREE0, FREE1 };

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
    const int npair = (nblk + 1) / 2;

    /* loader: this warpgroup's blocks g, g + 2, ... into its own stage */
    constexpr int TPT = 128 / BN;
    const int32_t csr_first = (!p.map.topk && !p.map.block_table) ? p.map.kv_indptr[r] : 0;
    const int ld_t = t / TPT, ld_sub = t % TPT;
    auto raw_at = [&](int blk) -> int32_t {
      int pos = kb + blk * BN + ld_t;
      return pos < ke ? kv_raw(p.map, r, pos, csr_first) : -1;
    };
    int32_t raw_next = raw_at(g);
    /* a block's load: its token's slot and validity, then its 16-byte
     * chunks [2 k_lo, 2 k_hi) (this thread takes every TPT-th chunk) */
    const char *ld_src = kvbase;
    bool ld_v = false;
#ifdef PMLA_WG_NOLOAD /* diagnostic: time without KV traffic (wrong results) */
    bool ld_skip = false;
#endif
    auto load_begin = [&](int blk) {
#ifdef PMLA_WG_NOLOAD
      ld_skip = blk >= 2;
#endif
      const int pos = kb + blk * BN + ld_t;
      int64_t slot =
          pos < ke ? kv_slot(p.map, raw_next, pos, errw, ld_sub == 0 && blockIdx.y == 0) : -1;
      ld_v = slot >= 0;
      store_token_bits<TPT>(sVm, g, wi, lane, ld_v);
      ld_src = ld_v ? kvbase + slot * PITCH : kvbase;
      raw_next = raw_at(blk + 2);
    };
    auto load_chunks = [&](int k_lo, int k_hi) {
#ifdef PMLA_WG_NOLOAD
      if (ld_skip)
        return;
#endif
#pragma unroll
      for (int k = k_lo; k < k_hi; k++) {
        int c = ld_sub + k * TPT;
        cp16(sK + off(ld_t, c), ld_src + (ld_v ? c * 16 : 0), ld_v);
      }
    };
    constexpr int KC = PMLA_TILE_CHUNKS / TPT; /* chunk steps per block */
    constexpr int KB = 8 / TPT;                /* chunk steps per 64-column block */
    static_assert(TPT == 2 && KC == 36 && KB == 4, "split loads: two loader threads per token");
    /* TMA for a whole page-aligned block inside one page (see body_pp) */
    bool ld_tma = false;
    auto load_block = [&](int blk) {
      const int64_t first = PMLA_WG_TMA && !PMLA_WG_SPLIT && use_tma
                                ? whole_page_slot(p.map, raw_next, kb + blk * BN, ke)
                                : -1;
      load_begin(blk);
      ld_tma = first >= 0;
      if (ld_tma) {
        if (t == 0) {
          mbar_arrive_tx(aLoad, TILE);
          tma_block(smem_u32(sK), kv_tmap, first, aLoad);
        }
      } else {
        load_chunks(0, KC);
      }
    };
    /* this warpgroup's block is in shared memory (the warpgroup barrier
     * that follows also publishes its validity bits) */
    auto load_wait = [&]() {
      if (ld_tma) {
        mbar_wait(aLoad, ld_phase);
        ld_phase ^= 1;
      } else {
        cp_wait<0>();
        proxy_fence();
      }
    };
    {
      const char *qsrc = (const char *)(p.q + ((int64_t)qb * H + row0) * PMLA_QK_DIM);
      for (int c = tid; c < ROWS * PMLA_TILE_CHUNKS; c += NT) {
        int rr = c / PMLA_TILE_CHUNKS, cc = c % PMLA_TILE_CHUNKS;
        bool v = rr < nrows;
        cp16(sQ + off(rr, cc), v ? qsrc + (int64_t)rr * PITCH + cc * 16 : qsrc, v);
      }
    }
    ld_tma = false;
    if (g < nblk)
      load_block(g);
    cp_commit();
    cp_wait<0>();
    proxy_fence();
    if (ld_tma) {
      mbar_wait(aLoad, ld_phase);
      ld_phase ^= 1;
    }
    __syncthreads();

    int lim[2];
#pragma unroll
    for (int sl = 0; sl < 2; sl++) {
      int i = row0 + myrow[sl];
      int causal = len - qlen + 1 + i / H;
      lim[sl] = i < rows_item ? (causal < ke ? causal : ke) : INT32_MIN;
    }
    float o[128];
#pragma unroll
    for (int e = 0; e < 128; e++)
      o[e] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
    float s[32];
    uint32_t pa[16];

    for (int i = 0; i < npair; i++) {
      const bool has1 = 2 * i + 1 < nblk;
      const bool next0 = 2 * i + 2 < nblk, next1 = 2 * i + 3 < nblk;
      if (g == 0) {
        /* ---------------- warpgroup 0: block 2i, O[:, 0:256] */
        if (i > 0) {
          load_wait();
          nb_sync_wg(LOC);
        }
        ss_qk(s, aQ, aK0);
        float mx[2], muse[2], corr[2], sum[2], m_a[2];
        wg_mask_max(s, mx, sVm[0], kb + 2 * i * BN, lim, scale_log2, lane);
#pragma unroll
        for (int sl = 0; sl < 2; sl++) {
          m_a[sl] = fmaxf(m_run[sl], mx[sl]);
          muse[sl] = m_a[sl] == -INFINITY ? 0.f : m_a[sl];
          corr[sl] = fast_exp2(m_run[sl] - muse[sl]);
          if (row_leader(lane))
            sMa[myrow[sl]] = m_a[sl];
        }
        nb_arrive(SCALE0);
        ss_exp(s, scale_log2, muse, sum);
#pragma unroll
        for (int sl = 0; sl < 2; sl++)
          l_run[sl] = l_run[sl] * corr[sl] + sum[sl];
        wg_scale_o(o, corr[0], corr[1]);
        ss_pack(s, pa);
        ss_pv_rs(o, pa, aK0, 0);
        /* P0 for warpgroup 1, relative to m_b */
        nb_sync(SCALE1);
        float c1[2];
#pragma unroll
        for (int sl = 0; sl < 2; sl++) {
          float m_b = sMb[myrow[sl]];
          c1[sl] = fast_exp2(m_a[sl] - (m_b == -INFINITY ? 0.f : m_b));
          m_run[sl] = m_b;
        }
        ss_store_p(sKV + 8 * BLK, s, c1[0], c1[1], myrow, lane);
        proxy_fence();
        nb_arrive(P0READY);
        ss_pv_wait(o);
        reg_fence_u(pa);
        wg_scale_o(o, c1[0], c1[1]);
#pragma unroll
        for (int sl = 0; sl < 2; sl++)
          l_run[sl] *= c1[sl];
        /* no wgmma may be in flight across the loader's divergent code */
#if PMLA_WG_SPLIT
        /* V_L (column blocks 0-3) of stage 0 was read only by our PV0_L:
         * reload it as soon as every warp of ours is past that wait */
        if (next0) {
          nb_sync_wg(LOC);
          load_begin(2 * i + 2);
          load_chunks(0, 4 * KB);
          cp_commit();
          nb_sync(FREE0);
          load_chunks(4 * KB, KC);
          cp_commit();
        }
#else
        if (next0) {
          nb_sync(FREE0);
          load_block(2 * i + 2);
          cp_commit();
        }
#endif
        if (has1) {
          nb_sync(P1READY);
          ss_pv_ss(o, aK1, 0);
          ss_pv_wait(o);
          if (next1)
            nb_arrive(FREE1);
        }
      } else {
        /* ---------------- warpgroup 1: block 2i + 1, O[:, 256:512] */
        float mx[2] = {-INFINITY, -INFINITY};
        if (has1) {
          if (i > 0) {
            load_wait();
            nb_sync_wg(LOC + 1);
          }
          ss_qk(s, aQ, aK1);
          wg_mask_max(s, mx, sVm[1], kb + (2 * i + 1) * BN, lim, scale_log2, lane);
        }
        nb_sync(SCALE0);
        float muse[2], corr[2], sum[2] = {0.f, 0.f};
#pragma unroll
        for (int sl = 0; sl < 2; sl++) {
          float m_b = fmaxf(sMa[myrow[sl]], mx[sl]);
          muse[sl] = m_b == -INFINITY ? 0.f : m_b;
          corr[sl] = fast_exp2(m_run[sl] - muse[sl]);
          m_run[sl] = m_b;
          if (row_leader(lane))
            sMb[myrow[sl]] = m_b;
        }
        nb_arrive(SCALE1);
        wg_scale_o(o, corr[0], corr[1]);
        if (has1) {
          ss_exp(s, scale_log2, muse, sum);
          ss_pack(s, pa);
          ss_store_p(sKV + TILE + 8 * BLK, s, 1.f, 1.f, myrow, lane);
          proxy_fence();
          nb_arrive(P1READY);
        }
#pragma unroll
        for (int sl = 0; sl < 2; sl++)
          l_run[sl] = l_run[sl] * corr[sl] + sum[sl];
        /* P0 V0 first: stage 0 is what warpgroup 0 reloads next */
        nb_sync(P0READY);
        ss_pv_ss(o, aK0, 1);
        if (has1) {
          ss_pv_rs(o, pa, aK1, 1);
          wg_wait1();
        } else {
          wg_wait0();
        }
        if (next0)
          nb_arrive(FREE0);
        ss_pv_wait(o);
        reg_fence_u(pa);
#if PMLA_WG_SPLIT
        /* V_R (column blocks 4-7) of stage 1 was read only by our P1 V1_R */
        if (next1) {
          nb_sync_wg(LOC + 1);
          load_begin(2 * i + 3);
          load_chunks(4 * KB, 8 * KB);
          cp_commit();
          nb_sync(FREE1);
          load_chunks(0, 4 * KB);
          load_chunks(8 * KB, KC);
          cp_commit();
        }
#else
        if (next1) {
          nb_sync(FREE1);
          load_block(2 * i + 3);
          cp_commit();
        }
#endif
      }
    }
    cp_wait<0>();
#pragma unroll
    for (int sl = 0; sl < 2; sl++)
      l_run[sl] = row_sum(l_run[sl]);
    if (row_leader(lane)) {
#pragma unroll
      for (int sl = 0; sl < 2; sl++) {
        if (g == 0)
          sM[myrow[sl]] = m_run[sl];
        (g == 0 ? sL0 : sL1)[myrow[sl]] = l_run[sl];
      }
    }
    __syncthreads();

    /* ---- epilogue */
    const int64_t obase =
        pslot >= 0 ? (int64_t)pslot * p.max_q_len * H + row0 : (int64_t)qb * H + row0;
#pragma unroll
    for (int sl = 0; sl < 2; sl++) {
      int rl = myrow[sl];
      if (rl >= nrows)
        continue;
      float l = sL0[rl] + sL1[rl], inv = l > 0.f ? 1.f / l : 0.f;
      int64_t ro = (obase + rl) * PMLA_V_DIM;
#pragma unroll
      for (int j = 0; j < 32; j++) {
        int col = g * 256 + j * 8 + ((lane & 3) << 1);
        float v0 = o[4 * j + 2 * sl] * inv, v1 = o[4 * j + 2 * sl + 1] * inv;
        if (pslot >= 0)
          *(float2 *)(p.partial_out + ro + col) = make_float2(v0, v1);
        else
          *(uint32_t *)(p.out + ro + col) =
              pack_bf16x2(v0, v1);
      }
    }
    if (tid < nrows) {
      float l = sL0[tid] + sL1[tid];
      float lse = l > 0.f ? (sM[tid] + log2f(l)) * LN2_F : -INFINITY;
      if (pslot >= 0)
        p.partial_lse[obase + tid] = lse;
      else if (p.lse)
        p.lse[obase + tid] = lse;
    }
    __syncthreads();
  }
}
#endif /* PMLA_WG_DEVICE */
} /* namespace wg */

/* kv_tmap: the KV cache as a [num_slots, 576] bf16 tensor map (64 x 64
 * boxes, 128B swizzle), valid when use_tma */
__global__ void __launch_bounds__(wg::NT, 1)
    pmla_decode_wg_kernel(pmla_gpu_problem p, float scale_log2,
                          const __grid_constant__ CUtensorMap kv_tmap, int use_tma) {
  pdl_wait();
  pdl_trigger();
#if defined(PMLA_WG_DEVICE) && PMLA_WG_PP == 2
  wg::body_ss(p, scale_log2, &kv_tmap, use_tma);
#elif defined(PMLA_WG_DEVICE)
  wg::body_pp(p, scale_log2, &kv_tmap, use_tma);
#else
  decode_body<4>(p, scale_log2);
#endif
}
#endif /* PMLA_PLATFORM_NVIDIA */

/* The dynamic shared memory opt-in binds to the current device: once per
 * device (bit d of *done; devices past 63 ask every launch). */
hipError_t opt_in_smem(const void *kernel, size_t smem, unsigned long long *done) {
  int dev = 0;
  hipError_t e = hipGetDevice(&dev);
  if (e != hipSuccess)
    return e;
  const unsigned long long bit = dev >= 0 && dev < 64 ? 1ull << dev : 0;
  if (bit && (__atomic_load_n(done, __ATOMIC_ACQUIRE) & bit))
    return hipSuccess;
  e = hipFuncSetAttribute(kernel, hipFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e == hipSuccess && bit)
    __atomic_fetch_or(done, bit, __ATOMIC_RELEASE);
  return e;
}

template <int MT> hipError_t launch_decode(const pmla_gpu_problem &p, int tiles, hipStream_t st) {
  static unsigned long long opted_in = 0;
  const size_t smem = Cfg<MT>::SMEM;
  hipError_t e = opt_in_smem((const void *)pmla_decode_kernel<MT>, smem, &opted_in);
  if (e != hipSuccess)
    return e;
  dim3 grid((unsigned)p.num_units, (unsigned)tiles);
  return pdl_launch(pmla_decode_kernel<MT>, grid, dim3(Cfg<MT>::NT), smem, st, p,
                    p.softmax_scale * LOG2E_F);
}

#ifdef PMLA_PLATFORM_NVIDIA
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
  if (!PMLA_WG_TMA || !enc || p.map.topk || p.map.page_size % wg::BN != 0 ||
      p.map.num_slots < wg::BN || p.map.num_slots > INT32_MAX || ((uintptr_t)p.kv & 15) != 0)
    return 0;
  cuuint64_t dim[2] = {PMLA_QK_DIM, (cuuint64_t)p.map.num_slots};
  cuuint64_t stride[1] = {PITCH};
  cuuint32_t box[2] = {64, (cuuint32_t)wg::BN}, estride[2] = {1, 1};
  return enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)p.kv, dim, stride, box, estride,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}
hipError_t launch_decode_wg(const pmla_gpu_problem &p, int tiles, hipStream_t st) {
  static unsigned long long opted_in = 0;
  const size_t smem = wg::LAUNCH_SMEM;
  hipError_t e = opt_in_smem((const void *)pmla_decode_wg_kernel, smem, &opted_in);
  if (e != hipSuccess)
    return e;
  dim3 grid((unsigned)p.num_units, (unsigned)tiles);
  CUtensorMap tmap;
  memset(&tmap, 0, sizeof tmap);
  const int use_tma = kv_tensor_map(&tmap, p);
  return pdl_launch(pmla_decode_wg_kernel, grid, dim3(wg::NT), smem, st, p,
                    p.softmax_scale * LOG2E_F, tmap, use_tma);
}
#endif

} /* namespace */

extern "C" void pmla_gpu_prepare(void) {
#ifdef PMLA_PLATFORM_NVIDIA
  (void)tensor_map_encoder();
#if PMLA_WGMMA
  static bool decided = false;
  if (!decided) {
    /* binaryVersion 90: the sm_90a image (with the wgmma body) is the one
     * this device runs */
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, (const void *)pmla_decode_wg_kernel) != cudaSuccess)
      cudaGetLastError(); /* no image for this device: the small tiles, no error left */
    else if (fa.binaryVersion == 90)
      g_wgmma_loaded = true;
    decided = true;
  }
#endif
#endif
}

/* 64-row tiles for every head count (h=16 padded as FlashMLA pads) where
 * the wgmma kernel runs and every dense block can come by TMA: on an H200,
 * b=128 L=4096 h=16 175 vs 197 us, h=32 180 vs 241 us against the 16/32-row
 * mma.sync body (side by side). Not for a builder that serves top-k steps
 * or pages below 64 slots: their per-token cp.async gather starves the
 * one-loader-warpgroup body (sparse 128 x 16: 120 vs 106 us). */
extern "C" int32_t pmla_gpu_min_mt(int32_t page_size, int32_t topk) {
  if (PMLA_MIN_MT)
    return PMLA_MIN_MT;
#ifdef PMLA_PLATFORM_NVIDIA
  return g_wgmma_loaded && PMLA_WG_TMA && topk == 0 && page_size % 64 == 0 ? 4 : 1;
#else
  (void)page_size;
  (void)topk;
  return 1;
#endif
}

extern "C" int32_t pmla_gpu_sched_units(int32_t cu_count, int32_t num_heads, int32_t max_q_len,
                                        int32_t min_mt) {
  if (num_heads < 1)
    num_heads = 1;
  if (max_q_len < 1)
    max_q_len = 1;
  int occ = 1;
  switch (host_mt(num_heads, max_q_len, min_mt)) {
  case 1:
    occ = Shape<1>::OCC;
    break;
#ifdef PMLA_PLATFORM_NVIDIA
  case 2:
    occ = Shape<2>::OCC;
    break;
  case 4:
    occ = Shape<4>::OCC;
    break;
#endif
  }
  int32_t n = cu_count * occ / host_tiles(num_heads, max_q_len, min_mt);
  return n < 1 ? 1 : n;
}

extern "C" int pmla_gpu_decode(const pmla_gpu_problem *problem, void *stream) {
  if (!problem || problem->num_heads < 1 || problem->max_q_len < 1 || problem->num_units < 1)
    return (int)hipErrorInvalidValue;
  const pmla_gpu_problem &p = *problem;
  hipStream_t st = (hipStream_t)stream;
  const int tiles = host_tiles(p.num_heads, p.max_q_len, p.min_mt);
  hipError_t e;
  switch (host_mt(p.num_heads, p.max_q_len, p.min_mt)) {
#ifdef PMLA_PLATFORM_NVIDIA
  case 2:
    e = launch_decode<2>(p, tiles, st);
    break;
  case 4:
#if PMLA_WGMMA
    e = launch_decode_wg(p, tiles, st);
#else
    e = launch_decode<4>(p, tiles, st);
#endif
    break;
#endif
  default:
    e = launch_decode<1>(p, tiles, st);
    break;
  }
  if (e != hipSuccess)
    return (int)e;
#if PMLA_FUSED_REDUCE && PMLA_WGMMA && PMLA_WG_PP == 1 && defined(PMLA_PLATFORM_NVIDIA)
  if (host_mt(p.num_heads, p.max_q_len, p.min_mt) == 4 && g_wgmma_loaded)
    return 0; /* body_pp merged the split requests itself */
#endif
  return (int)pmla_gpu_combine(p, st);
}

extern "C" int64_t pmla_gpu_merge_counts(int64_t max_requests, int32_t max_q_len,
                                         int32_t num_heads) {
#if PMLA_FUSED_REDUCE
  return max_requests * (((int64_t)max_q_len * num_heads + 15) / 16); /* 16-row tiles at most */
#else
  (void)max_requests;
  (void)max_q_len;
  (void)num_heads;
  return 0;
#endif
}

extern "C" const char *pmla_gpu_error_string(int code) {
  return hipGetErrorString((hipError_t)code);
}
