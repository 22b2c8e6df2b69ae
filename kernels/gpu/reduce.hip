/* SPDX-License-Identifier: MIT */
/* reduce.hip - the reduce of split requests, launched by pmla_gpu_decode
 * after the decode kernel on the same stream: for each reduce entry
 * (reduce_indptr / reduce_final_map / reduce_partial_map) and each of its
 * rows, merge the pieces' normalised fp32 partials weighted by
 * exp(lse - max lse) into bf16 out and the natural-log lse. A request whose
 * rows are outside the query tensor is skipped and flagged (QO_INDPTR). */
#include <math.h>
#include <stdint.h>

#include "hip_compat.h"
#include "launch.h"
#include "mla_gpu.h"
#include "mma.h"
#include "pdl.h"
#include "fold.h"

namespace {

using namespace pmla_mma;

/* Small blocks: a b=4 long-context step has only entries x heads = 512
 * (entry, row) pairs, and 256-thread blocks would leave half the SMs idle. */
constexpr int REDUCE_THREADS = 128;
constexpr int64_t REDUCE_MAX_BLOCKS = 2048; /* 16 resident blocks x 128 SMs */

/* Steps with at most this many query rows reduce each row with SPLIT warps
 * (one float4 of columns per lane): 4 x 2048 warps are about what 132 SMs
 * hold at once (64 warps each), so no warp then loops over a second row. */
constexpr int64_t FEW_ROWS = 2048;
constexpr int SPLIT = PMLA_V_DIM / 4 / WARP; /* 4 (32-lane warps), 2 (64-lane) */
/* Steps of at most GROUPED_ROWS query rows whose requests are split into
 * at least MANY_PIECES pieces on average (num_units per query token): a
 * block's warps share each (row, part), each walking a part of the pieces
 * (reduce_row_grouped). At most 128 rows keeps the blocks within one wave;
 * with fewer pieces a row, or a second wave, the warp-per-(row, part) walk
 * was faster (H200: b=4 L=32768 h=128 82.2 -> 91.8 us grouped, b=8
 * L=8192 h=16 40.0 -> 41.2; a lone request b=1 L=65536 h=16 52.6 -> 41.6). */
constexpr int64_t GROUPED_ROWS = 128;
constexpr int64_t MANY_PIECES = 32;
/* Batch-invariant steps with at most this many query rows fold each row
 * with SPLIT warps (reduce_row_fold), more rows with one (reduce_rows_fold).
 * H200, side by side: one warp a row for every step gave b=1 L=131072
 * h=128 (128 rows) 103.0 -> 104.6 us, b=4 L=32768 h=128 (512) 86.7 -> 86.9,
 * b=8 L=8192 h=128 (1024) 76.3 -> 75.0, b=16 L=16384 h=64 (1024) 106.3 ->
 * 101.5. */
constexpr int64_t FOLD_SPLIT_ROWS = 512;
/* float4 of pieces in flight a lane (sum_pieces): FLY_DEEP up to
 * LOW_FLY_ROWS rows and in the grouped reduce, FLY_SHALLOW above, where
 * the reduce's warps outnumber what 132 SMs hold at the 128 registers a
 * thread that 16 take (56-64 at 4), and more of them start beside the
 * decode's last work-groups. H200, side by side, 16 / 4:
 * b=8 L=8192 h=128 (1024 rows) 54.5 -> 51.3 us, b=64 L=8192 h=16 (1024)
 * 162.9 -> 159.2, b=128 L=2048..6144 h=128 271.5 -> 268.4; with 4 for
 * every step b=4 L=32768 h=128 (512) 79.9 -> 80.9 and b=1 L=131072 h=128
 * (128, grouped) 79.8 -> 81.3. */
constexpr int64_t LOW_FLY_ROWS = 512;
constexpr int FLY_DEEP = 16, FLY_SHALLOW = 4;
/* a fold's first slot not read before the wait (a map entry of that value
 * is read again, then flagged like any other out of range) */
constexpr int NOT_READ = -2;

/* a load that skips L1 (NVIDIA); a plain load elsewhere */
template <typename T> __device__ __forceinline__ T ld_past_l1(const T *a) {
#ifdef PMLA_PLATFORM_NVIDIA
  return __ldcg(a);
#else
  return *a;
#endif
}

/* A warp's sum over pieces [q0, q1) of one row (and a PARTS-th of its
 * columns): the largest lse it met (best), this lane's share of the pieces'
 * weights exp(lse - best) (total) and its columns of their weighted rows. */
template <int PARTS> struct RowSum {
  static constexpr int V4 = PMLA_V_DIM / 4 / WARP / PARTS; /* float4 per lane */
  float best, total;
  float4 acc[V4];
  bool nan; /* this lane met a piece whose lse is NaN (a NaN score): the row is NaN */
};

/* The lanes take 32 pieces at a time (each its slot and lse, one load
 * chain per 32 pieces), the running maximum rescales what is summed so far
 * when a later 32 raise it, and the warp then walks those pieces AHEAD at a
 * time, every lane loading its columns of all AHEAD rows before adding
 * them: FLY float4 in flight per lane whatever PARTS. Partials are read
 * once, past L1. */
template <int PARTS, int FLY>
__device__ __forceinline__ void sum_pieces(const pmla_gpu_problem &p, int i, int q0, int q1,
                                           int part, int lane, RowSum<PARTS> &rs) {
  constexpr int V4 = RowSum<PARTS>::V4;
  static_assert(FLY % V4 == 0, "whole rows in flight");
  constexpr int AHEAD = FLY / V4;
  static_assert(WARP % AHEAD == 0, "a chunk's pieces j0 + a stay below WARP");
  const int col4 = lane + part * WARP * V4; /* this lane's first float4 */
  const int64_t rows_max = (int64_t)p.max_q_len * p.num_heads;
  const int64_t max_slots = p.max_slots;
  float best = -INFINITY;
  float4 acc[V4];
#pragma unroll
  for (int v = 0; v < V4; v++)
    acc[v] = make_float4(0.f, 0.f, 0.f, 0.f);
  float total = 0.f; /* this lane's pieces' weights */
  bool nan = false;
  for (int c0 = q0; c0 < q1; c0 += WARP) {
    const int q = c0 + lane;
    int64_t row = 0; /* this lane's piece: its partial row, lse and weight */
    float l = -INFINITY;
    if (q < q1) {
      const int s = p.reduce_partial_map[q];
      if (s >= 0 && s < max_slots) {
        row = (int64_t)s * rows_max + i;
        l = ld_past_l1(p.partial_lse + row);
      }
    }
    if (l != l) { /* recorded, then summed as empty */
      nan = true;
      l = -INFINITY;
    }
    const float m = fmaxf(best, warp_max(l));
    if (m == -INFINITY) /* nothing to add yet */
      continue;
    if (m != best) { /* a new maximum: what was summed scales down */
      const float c = best == -INFINITY ? 0.f : expf(best - m);
      total *= c;
#pragma unroll
      for (int v = 0; v < V4; v++) {
        acc[v].x *= c;
        acc[v].y *= c;
        acc[v].z *= c;
        acc[v].w *= c;
      }
      best = m;
    }
    const float wgt = l == -INFINITY ? 0.f : expf(l - best);
    total += wgt;
    const int n = q1 - c0 < WARP ? q1 - c0 : WARP;
    for (int j0 = 0; j0 < n; j0 += AHEAD) {
      float w[AHEAD];
      float4 x[AHEAD][V4];
#pragma unroll
      for (int a = 0; a < AHEAD; a++) {
        w[a] = lane_value(wgt, j0 + a); /* lanes >= n hold weight 0 */
        const int64_t at = lane_value(row, j0 + a);
        const float4 *src = (const float4 *)(p.partial_out + at * PMLA_V_DIM);
#pragma unroll
        for (int v = 0; v < V4; v++)
          x[a][v] = w[a] != 0.f ? ld_past_l1(src + col4 + v * WARP) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int a = 0; a < AHEAD; a++)
#pragma unroll
        for (int v = 0; v < V4; v++) {
          acc[v].x += w[a] * x[a][v].x;
          acc[v].y += w[a] * x[a][v].y;
          acc[v].z += w[a] * x[a][v].z;
          acc[v].w += w[a] * x[a][v].w;
        }
    }
  }
  rs.best = best;
  rs.total = total;
  rs.nan = nan;
#pragma unroll
  for (int v = 0; v < V4; v++)
    rs.acc[v] = acc[v];
}

/* Row i of the request whose query rows start at token qb from a warp's
 * sum over all its pieces: bf16 out (this part's columns) and the lse. */
template <int PARTS>
__device__ __forceinline__ void write_row(const pmla_gpu_problem &p, int i, int qb, int part,
                                          int lane, const RowSum<PARTS> &rs) {
  constexpr int V4 = RowSum<PARTS>::V4;
  const int col4 = lane + part * WARP * V4;
  const bool nan = warp_max(rs.nan ? 1.f : 0.f) > 0.f;
  const float total = nan ? NAN : warp_sum(rs.total);
  const float inv = pmla_sum_scale(1.f, total);
  uint16_t *dst = p.out + ((int64_t)qb * p.num_heads + i) * PMLA_V_DIM;
#pragma unroll
  for (int v = 0; v < V4; v++) {
    uint2 pk;
    pk.x = pack_bf16x2(rs.acc[v].x * inv, rs.acc[v].y * inv);
    pk.y = pack_bf16x2(rs.acc[v].z * inv, rs.acc[v].w * inv);
    *(uint2 *)(dst + (col4 + v * WARP) * 4) = pk;
  }
  if (lane == 0 && part == 0 && p.lse)
    p.lse[(int64_t)qb * p.num_heads + i] = pmla_sum_lse(total, rs.best + logf(total));
}

/* PARTS warps merge row i of a reduce entry (pieces [p0, p1); its
 * request's query rows start at token qb), each a PARTS-th of the columns,
 * by lse into bf16 out (+ lse). Few rows (a lone or small batch of long
 * requests) take SPLIT warps a row, so a row's pieces are read in a
 * SPLIT-th of the steps; many rows take one (the extra index loads would
 * cost more than the shorter walk). */
template <int PARTS, int FLY>
__device__ __forceinline__ void reduce_row(const pmla_gpu_problem &p, int i, int qb, int p0,
                                          int p1, int part, int lane) {
  RowSum<PARTS> rs;
  sum_pieces<PARTS, FLY>(p, i, p0, p1, part, lane, rs);
  write_row<PARTS>(p, i, qb, part, lane, rs);
}

/* The G warps of a block share one (row, part) of an entry with many
 * pieces: warp w sums the w-th G-th of them, and warp 0 merges the G sums
 * by their maxima, so a row's pieces are walked in a G-th of the steps (a
 * lone 131072-token request has 66 pieces a row). */
template <int PARTS, int G, int FLY>
__device__ __forceinline__ void reduce_row_grouped(const pmla_gpu_problem &p, int i, int qb,
                                                  int p0, int p1, int part, int lane, int w) {
  constexpr int V4 = RowSum<PARTS>::V4;
  __shared__ RowSum<PARTS> sh[G][WARP];
  const int n = p1 - p0;
  RowSum<PARTS> rs;
  sum_pieces<PARTS, FLY>(p, i, p0 + n * w / G, p0 + n * (w + 1) / G, part, lane, rs);
  sh[w][lane] = rs;
  __syncthreads();
  if (w == 0) {
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < G; k++)
      m = fmaxf(m, sh[k][lane].best);
    RowSum<PARTS> all;
    all.best = m;
    all.total = 0.f;
    all.nan = false;
#pragma unroll
    for (int v = 0; v < V4; v++)
      all.acc[v] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int k = 0; k < G; k++) {
      const RowSum<PARTS> &o = sh[k][lane];
      all.nan |= o.nan;
      if (o.best == -INFINITY) /* no piece of this warp had weight */
        continue;
      const float c = expf(o.best - m);
      all.total += o.total * c;
#pragma unroll
      for (int v = 0; v < V4; v++) {
        all.acc[v].x += o.acc[v].x * c;
        all.acc[v].y += o.acc[v].y * c;
        all.acc[v].z += o.acc[v].z * c;
        all.acc[v].w += o.acc[v].w * c;
      }
    }
    write_row<PARTS>(p, i, qb, part, lane, all);
  }
  __syncthreads(); /* sh is reused by the block's next pair */
}
/* The folds' shared parts. A piece's slot from the map, or -1 where it is
 * out of range (never planned: flagged, folded as empty). */
__device__ __forceinline__ int fold_slot(const pmla_gpu_problem &p, int s) {
  if (s < 0 || s >= p.max_slots) {
    atomicOr(p.work_meta_data + PMLA_META_ERROR, (int)PMLA_PLAN_ERR_OVERFLOW);
    return -1;
  }
  return s;
}
/* piece q's slot (-1 for none: at or past p1, or never planned, which is
 * flagged) and its lse in row i; slot_of(q) reads its map entry */
template <typename SlotOf>
__device__ __forceinline__ void fold_piece(const pmla_gpu_problem &p, int i, int64_t rows_max,
                                           int q, int p1, SlotOf slot_of, int &slot, float &l) {
  slot = -1;
  l = -INFINITY;
  if (q >= p1)
    return;
  const int s = fold_slot(p, slot_of(q));
  if (s < 0)
    return;
  slot = s;
  l = ld_past_l1(p.partial_lse + (int64_t)s * rows_max + i);
}
/* acc and lse <- their fold with piece x of lse l: the arithmetic of the
 * decode epilogues' folds (fold.h), column by column */
template <int V4>
__device__ __forceinline__ void fold_in(float4 (&acc)[V4], float &lse, const float4 (&x)[V4],
                                        float l) {
  const pmla_fold_w fw = pmla_fold_weights(lse, l);
#pragma unroll
  for (int v = 0; v < V4; v++) {
    acc[v].x = pmla_fold(acc[v].x, x[v].x, fw);
    acc[v].y = pmla_fold(acc[v].y, x[v].y, fw);
    acc[v].z = pmla_fold(acc[v].z, x[v].z, fw);
    acc[v].w = pmla_fold(acc[v].w, x[v].w, fw);
  }
  lse = fw.lse;
}
/* a folded row's columns (this lane's, from col4) into bf16 out, its lse
 * by one lane of the row */
template <int V4>
__device__ __forceinline__ void store_folded(const pmla_gpu_problem &p, int i, int qb, int col4,
                                             bool writes_lse, const float4 (&acc)[V4],
                                             float lse) {
  uint16_t *dst = p.out + ((int64_t)qb * p.num_heads + i) * PMLA_V_DIM;
#pragma unroll
  for (int v = 0; v < V4; v++) {
    uint2 pk;
    pk.x = pack_bf16x2(acc[v].x, acc[v].y);
    pk.y = pack_bf16x2(acc[v].z, acc[v].w);
    *(uint2 *)(dst + (col4 + v * WARP) * 4) = pk;
  }
  if (writes_lse && p.lse)
    p.lse[(int64_t)qb * p.num_heads + i] = lse;
}
/* Batch-invariant: the left fold of the pieces in order (fold.h), the same
 * fold the decode items of a whole request perform, so a split request
 * gets the bits it would get whole. Every lane computes the weights. A warp
 * folds a PARTS-th of the row's columns (PARTS warps a row; the columns
 * fold independently, so the bits do not depend on PARTS). Few rows (a
 * lone or small batch of long requests, FOLD_SPLIT_ROWS) take SPLIT warps
 * a row here: a long request's pieces are folded one after another, so the
 * row's work is spread over more warps instead; more rows take one warp a
 * row (reduce_rows_fold, below).
 *
 * Such a warp is alone on its scheduler, so every instruction of its chain
 * waits out the latency of the one before unless the scheduler can move
 * independent work between them: the steps of a round are one basic block.
 * The pieces' slots (as row offsets) and lse are read WARP at a time, two
 * batches ahead, into a ring in shared memory that every step reads with
 * plain loads: a shuffle brings a branch for a diverged warp, and a step
 * per basic block ran ~60 instructions at 4.7 cycles each (H200, ncu). The
 * loads of a round are not guarded either: pieces past the last are none
 * (their rows never folded). The first batch's slots are read before the
 * wait for the decode (schedule data). */
template <int PARTS>
__device__ __forceinline__ void reduce_row_fold(const pmla_gpu_problem &p, int i, int qb, int p0,
                                               int p1, int part, int lane, int pre) {
  constexpr int V4 = PMLA_V_DIM / 4 / WARP / PARTS;
  const int H = p.num_heads;
  const int64_t rows_max = (int64_t)p.max_q_len * H;
  constexpr int D = 8; /* pieces in flight */
  static_assert(WARP % D == 0 && 2 * D <= WARP, "a round's loads stay within two batches");
  const int col4 = lane + part * WARP * V4; /* this warp's float4 columns start there */
  /* this lane's first float4 of the row in slot 0, and a slot's stride */
  const float4 *row0 = (const float4 *)(p.partial_out + (int64_t)i * PMLA_V_DIM) + col4;
  const int64_t stride4 = rows_max * (PMLA_V_DIM / 4);
  /* this lane's piece of the batch from c (fold_piece) */
  auto batch = [&](int c, int &slot, float &l) {
    fold_piece(p, i, rows_max, c + lane, p1, [&](int q) {
      return p0 == c && pre != NOT_READ ? pre : ld_past_l1(p.reduce_partial_map + q);
    }, slot, l);
  };
  /* pieces c0 .. c0 + 2 WARP - 1 in the warp's ring in shared memory (the
   * offset of the piece's row from slot 0's, -1 for none, and its lse),
   * the next WARP in (sf, lf) */
  __shared__ int64_t ring_off[REDUCE_THREADS / WARP][2 * WARP];
  __shared__ float ring_l[REDUCE_THREADS / WARP][2 * WARP];
  int64_t *r_off = ring_off[threadIdx.x / WARP];
  float *r_l = ring_l[threadIdx.x / WARP];
  auto put = [&](int c, int slot, float l) {
    const int j = (c - p0 + lane) & (2 * WARP - 1);
    r_off[j] = slot >= 0 ? (int64_t)slot * stride4 : -1;
    r_l[j] = l;
  };
  int c0 = p0;
  int sf;
  float lf;
  batch(c0, sf, lf);
  warp_sync(); /* a warp's previous row read the ring to its end */
  put(c0, sf, lf);
  batch(c0 + WARP, sf, lf);
  put(c0 + WARP, sf, lf);
  batch(c0 + 2 * WARP, sf, lf);
  warp_sync();
  /* piece q's row (zeros for none) and lse, from the ring */
  auto load = [&](int q, float4 (&x)[V4], float &l) {
    const int j = (q - p0) & (2 * WARP - 1);
    const int64_t off = r_off[j];
    l = r_l[j];
    /* none reads slot 0's row and keeps zeros: no branch */
    const float4 *src = row0 + (off >= 0 ? off : 0);
#pragma unroll
    for (int v = 0; v < V4; v++) {
      const float4 y = ld_past_l1(src + v * WARP);
      x[v] = off >= 0 ? y : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };
  /* the fold starts from the first piece as it is; the next D are read
   * before it is waited for */
  float4 acc[V4], buf[D][V4];
  float lse, bl[D];
  load(p0, acc, lse);
#pragma unroll
  for (int d = 0; d < D; d++)
    if (p0 + 1 + d < p1)
      load(p0 + 1 + d, buf[d], bl[d]);
  /* whole rounds of D pieces without a branch between the steps, so one
   * step's loads and columns overlap the next step's weights (a row's
   * steps are one dependent chain, and a lone request's rows are few) */
  int q = p0 + 1;
  for (; q + D <= p1; q += D) {
    if (q - c0 >= WARP) { /* batch c0 is done: (sf, lf) takes its place */
      warp_sync();
      put(c0 + 2 * WARP, sf, lf);
      c0 += WARP;
      batch(c0 + 2 * WARP, sf, lf);
      warp_sync();
    }
    /* one basic block a round: no shuffle (each brings a branch for a
     * diverged warp) and no test between the steps, so the scheduler can
     * fill one step's latencies with the next one's loads */
#pragma unroll
    for (int d = 0; d < D; d++) {
      fold_in(acc, lse, buf[d], bl[d]);
      load(q + D + d, buf[d], bl[d]); /* past p1: none, never folded */
    }
  }
#pragma unroll
  for (int d = 0; d < D; d++) /* the last pieces, read by the last round */
    if (q + d < p1)
      fold_in(acc, lse, buf[d], bl[d]);
  store_folded(p, i, qb, col4, lane == 0 && part == 0, acc, lse);
}

/* The same fold for many rows, one warp a row (the columns of four float4
 * a lane). Many warps share each scheduler, so the shuffles and branches
 * of a step cost little, and the ring above was slower here (H200,
 * batch-invariant b=32 L=16384 h=128: 302.7 -> 307.0 us). One piece in
 * flight a warp (72 registers a thread; four took 128): alone the reduce
 * is no faster so (ncu), but in the step, where its warps start beside the
 * decode's last work-groups, it is (H200, side by side: b=24 L=16384 h=128
 * 230.2 -> 224.6 us, b=32 L=16384 299.0 -> 297.3). */
__device__ __forceinline__ void reduce_rows_fold(const pmla_gpu_problem &p, int i, int qb, int p0,
                                                int p1, int lane) {
  constexpr int V4 = PMLA_V_DIM / 4 / WARP;
  const int H = p.num_heads;
  const int64_t rows_max = (int64_t)p.max_q_len * H;
  constexpr int D = 1; /* pieces in flight */
  static_assert(WARP % D == 0 && 2 * D <= WARP, "a round's loads stay within two batches");
  const int col4 = lane; /* this lane's first float4 column */
  /* this lane's first float4 of the row in slot 0, and a slot's stride */
  const float4 *row0 = (const float4 *)(p.partial_out + (int64_t)i * PMLA_V_DIM) + col4;
  const int64_t stride4 = rows_max * (PMLA_V_DIM / 4);
  /* this lane's piece of the batch from c (fold_piece) */
  auto batch = [&](int c, int &slot, float &l) {
    fold_piece(p, i, rows_max, c + lane, p1, [&](int q) { return p.reduce_partial_map[q]; },
               slot, l);
  };
  int c0 = p0; /* pieces c0 .. c0 + WARP - 1 are in (sc, lc), the next WARP in (sn, ln) */
  int sc, sn = -1;
  float lc, ln = -INFINITY;
  batch(c0, sc, lc);
  if (c0 + WARP < p1)
    batch(c0 + WARP, sn, ln);
  auto load = [&](int q, float4 (&x)[V4], float &l) {
    const int j = q - c0; /* < 2 WARP, the same on every lane */
    const int slot = lane_value(j < WARP ? sc : sn, j & (WARP - 1));
    l = lane_value(j < WARP ? lc : ln, j & (WARP - 1));
    const float4 *src = row0 + (int64_t)slot * stride4;
#pragma unroll
    for (int v = 0; v < V4; v++)
      x[v] = slot >= 0 ? ld_past_l1(src + v * WARP) : make_float4(0.f, 0.f, 0.f, 0.f);
  };
  /* the fold starts from the first piece as it is; the next D are read
   * before it is waited for */
  float4 acc[V4], buf[D][V4];
  float lse, bl[D];
  load(p0, acc, lse);
#pragma unroll
  for (int d = 0; d < D; d++)
    if (p0 + 1 + d < p1)
      load(p0 + 1 + d, buf[d], bl[d]);
  /* whole rounds of D pieces without a branch between the steps, so one
   * step's loads and columns overlap the next step's weights (a row's
   * steps are one dependent chain, and a lone request's rows are few) */
  int q = p0 + 1;
  for (; q + D <= p1; q += D) {
    if (q - c0 >= WARP) { /* the next batch becomes current; read the one after */
      c0 += WARP;
      sc = sn;
      lc = ln;
      sn = -1;
      ln = -INFINITY;
      if (c0 + WARP < p1)
        batch(c0 + WARP, sn, ln);
    }
#pragma unroll
    for (int d = 0; d < D; d++) {
      fold_in(acc, lse, buf[d], bl[d]);
      if (q + D + d < p1)
        load(q + D + d, buf[d], bl[d]);
    }
  }
#pragma unroll
  for (int d = 0; d < D; d++) /* the last pieces, read by the last round */
    if (q + d < p1)
      fold_in(acc, lse, buf[d], bl[d]);
  store_folded(p, i, qb, col4, lane == 0, acc, lse);
}

/* A reduce entry: its request, pieces [p0, p1) and query rows [qb, qe). */
struct Entry {
  int r, p0, p1, qb, qe;
};
/* read past L1: a warp's first entry is read before the wait for the
 * decode, where only L2 is sure to hold the metadata kernel's writes */
__device__ __forceinline__ Entry entry_at(const pmla_gpu_problem &p, int k) {
  Entry e;
  e.r = ld_past_l1(p.reduce_final_map + k);
  e.p0 = ld_past_l1(p.reduce_indptr + k);
  e.p1 = ld_past_l1(p.reduce_indptr + k + 1);
  e.qb = p.qo_indptr ? ld_past_l1(p.qo_indptr + e.r) : e.r;
  e.qe = p.qo_indptr ? ld_past_l1(p.qo_indptr + e.r + 1) : e.r + 1;
  return e;
}
/* PARTS warps per (reduce entry, row), or with GROUPED a block's warps
 * per (entry, row, part). The schedule is the metadata kernel's, complete
 * before the decode kernel began, so a warp reads its first entry before
 * waiting for the decode: under programmatic dependent launch that chain of
 * loads runs while the decode finishes. */
template <int PARTS, bool FOLD, bool GROUPED, int FLY>
__global__ void __launch_bounds__(REDUCE_THREADS) pmla_reduce_kernel(pmla_gpu_problem p) {
  constexpr int G = GROUPED ? REDUCE_THREADS / WARP : 1; /* warps per pair */
  const int H = p.num_heads, mq = p.max_q_len;
  const int64_t rows_max = (int64_t)mq * H;
  const int nred = ld_past_l1(p.work_meta_data + PMLA_META_NUM_REDUCE);
  const int64_t npairs = nred * rows_max * PARTS;
  const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
  const int64_t nw = (int64_t)gridDim.x * (blockDim.x / WARP) / G;
  const int64_t first =
      GROUPED ? (int64_t)blockIdx.x : (int64_t)blockIdx.x * (blockDim.x / WARP) + w;
  /* a warp (GROUPED: a block) with nothing to merge leaves at once, without
   * waiting for the decode: the grid is sized for the most entries a step
   * can have, and blocks that wait only to exit held up the step's end by
   * ~3 us on the H200 where few or no requests split */
  if (first >= npairs)
    return;
  const Entry e0 = entry_at(p, (int)(first / PARTS / rows_max));
  /* a fold's first pieces' slots (schedule data) before the wait too */
  int pre = NOT_READ;
  if (FOLD && PARTS > 1 && e0.p0 + lane < e0.p1)
    pre = ld_past_l1(p.reduce_partial_map + e0.p0 + lane);
  pdl_wait();
  pdl_trigger();
  int32_t *errw = p.work_meta_data + PMLA_META_ERROR;
  for (int64_t pair = first; pair < npairs; pair += nw) { /* GROUPED: uniform over the block */
    const int part = (int)(pair % PARTS);
    const int k = (int)(pair / PARTS / rows_max), i = (int)(pair / PARTS % rows_max);
    const Entry e = pair == first ? e0 : entry_at(p, k);
    if (e.qb < 0 || e.qe < e.qb || e.qe > p.num_tokens || e.qe - e.qb > mq) {
      if (lane == 0 && (!GROUPED || w == 0) && i == 0 && part == 0)
        atomicOr(errw, (int)PMLA_PLAN_ERR_QO_INDPTR);
      continue;
    }
    if (i >= (e.qe - e.qb) * H)
      continue;
    if (FOLD && PARTS == 1)
      reduce_rows_fold(p, i, e.qb, e.p0, e.p1, lane);
    else if (FOLD)
      reduce_row_fold<PARTS>(p, i, e.qb, e.p0, e.p1, part, lane, pair == first ? pre : NOT_READ);
    else if (GROUPED)
      reduce_row_grouped<PARTS, G, FLY>(p, i, e.qb, e.p0, e.p1, part, lane, w);
    else
      reduce_row<PARTS, FLY>(p, i, e.qb, e.p0, e.p1, part, lane);
  }
}

template <int PARTS, bool FOLD, bool GROUPED = false, int FLY = FLY_DEEP>
hipError_t launch_reduce(const pmla_gpu_problem &p, hipStream_t stream) {
  /* entries < num_units where a split request spans a boundary between
   * units (the default planner, the batch-invariant line), and, but for
   * requests without query rows (which have nothing to merge), <=
   * num_tokens; rows per entry <= max_q_len * heads. A batch-invariant step
   * whose pieces are dealt can split more requests than there are units:
   * the grid is then sized for num_units of them. The loop strides over the
   * pairs, so the grid only sets how many run at once: one that fills the
   * GPU once is enough, and blocks past the step's entries would only start
   * and exit (a lone request's reduce needs 16 blocks, not 2048). */
  const int64_t entries = p.num_tokens < p.num_units ? p.num_tokens : p.num_units;
  int64_t pairs = entries * p.max_q_len * p.num_heads * PARTS;
  const int per_block = GROUPED ? 1 : REDUCE_THREADS / WARP;
  int64_t blocks = (pairs + per_block - 1) / per_block;
  if (blocks > REDUCE_MAX_BLOCKS)
    blocks = REDUCE_MAX_BLOCKS;
  if (blocks < 1)
    blocks = 1;
  return pdl_launch(pmla_reduce_kernel<PARTS, FOLD, GROUPED, FLY>, dim3((unsigned)blocks),
                    dim3(REDUCE_THREADS), 0, stream, p);
}

} /* namespace */

hipError_t pmla_launch_reduce(const pmla_gpu_problem &p, hipStream_t stream) {
  const int64_t rows = p.num_tokens * p.num_heads;
  if (p.fold)
    return rows <= FOLD_SPLIT_ROWS ? launch_reduce<SPLIT, true>(p, stream)
                                   : launch_reduce<1, true>(p, stream);
  if (rows <= GROUPED_ROWS && (int64_t)p.num_units >= MANY_PIECES * p.num_tokens)
    return launch_reduce<SPLIT, false, true>(p, stream);
  if (rows <= LOW_FLY_ROWS)
    return launch_reduce<SPLIT, false>(p, stream);
  if (rows <= FEW_ROWS)
    return launch_reduce<SPLIT, false, false, FLY_SHALLOW>(p, stream);
  return launch_reduce<1, false, false, FLY_SHALLOW>(p, stream);
}
