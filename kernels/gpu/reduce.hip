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

namespace {

using namespace pmla_mma;

/* Small blocks: a b=4 long-context step has only entries x heads = 512
 * (entry, row) pairs, and 256-thread blocks would leave half the SMs idle. */
constexpr int REDUCE_THREADS = 128;

/* Pieces whose partial rows a warp loads before it adds any of them, so
 * AHEAD * PMLA_V_DIM * 4 bytes per warp are in flight, not one row. */
constexpr int AHEAD = 4;
static_assert(WARP % AHEAD == 0, "a chunk's pieces j0 + a stay below WARP");

/* a load that skips L1 (NVIDIA); a plain load elsewhere */
template <typename T> __device__ __forceinline__ T ld_past_l1(const T *a) {
#ifdef PMLA_PLATFORM_NVIDIA
  return __ldcg(a);
#else
  return *a;
#endif
}

/* One warp merges row i of reduce entry k (its request's query rows start
 * at token qb) by lse into bf16 out (+ lse). The lanes first take one piece
 * each (its slot and weight exp(lse - max lse), 0 for a piece to skip);
 * then the warp walks the pieces AHEAD at a time, every lane loading its
 * columns of all AHEAD rows before adding them. Partials are read once,
 * past L1. */
__device__ __forceinline__ void reduce_row(const pmla_gpu_problem &p, int k, int i, int qb,
                                          int lane) {
  constexpr int V4 = PMLA_V_DIM / 4 / WARP; /* float4 per lane */
  const int H = p.num_heads;
  const int64_t rows_max = (int64_t)p.max_q_len * H;
  const int64_t max_slots = 2LL * p.num_units;
  const int p0 = p.reduce_indptr[k], p1 = p.reduce_indptr[k + 1];
  float best = -INFINITY;
  for (int q = p0 + lane; q < p1; q += WARP) {
    int s = p.reduce_partial_map[q];
    if (s >= 0 && s < max_slots)
      best = fmaxf(best, ld_past_l1(p.partial_lse + (int64_t)s * rows_max + i));
  }
  best = warp_max(best);
  float4 acc[V4];
#pragma unroll
  for (int v = 0; v < V4; v++)
    acc[v] = make_float4(0.f, 0.f, 0.f, 0.f);
  float total = 0.f; /* this lane's pieces' weights */
  for (int c0 = p0; best != -INFINITY && c0 < p1; c0 += WARP) {
    const int q = c0 + lane;
    int64_t row = 0; /* this lane's piece: its partial row, and weight */
    float wgt = 0.f;
    if (q < p1) {
      int s = p.reduce_partial_map[q];
      if (s >= 0 && s < max_slots) {
        row = (int64_t)s * rows_max + i;
        float l = ld_past_l1(p.partial_lse + row);
        wgt = l == -INFINITY ? 0.f : expf(l - best);
      }
    }
    total += wgt;
    const int n = p1 - c0 < WARP ? p1 - c0 : WARP;
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
          x[a][v] = w[a] != 0.f ? ld_past_l1(src + lane + v * WARP) : make_float4(0.f, 0.f, 0.f, 0.f);
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
  total = warp_sum(total);
  const float inv = total > 0.f ? 1.f / total : 0.f;
  uint16_t *dst = p.out + ((int64_t)qb * H + i) * PMLA_V_DIM;
#pragma unroll
  for (int v = 0; v < V4; v++) {
    uint2 pk;
    pk.x = pack_bf16x2(acc[v].x * inv, acc[v].y * inv);
    pk.y = pack_bf16x2(acc[v].z * inv, acc[v].w * inv);
    *(uint2 *)(dst + (lane + v * WARP) * 4) = pk;
  }
  if (lane == 0 && p.lse)
    p.lse[(int64_t)qb * H + i] = total > 0.f ? best + logf(total) : -INFINITY;
}

/* One warp per (reduce entry, row). */
__global__ void __launch_bounds__(REDUCE_THREADS) pmla_reduce_kernel(pmla_gpu_problem p) {
  pdl_wait();
  pdl_trigger();
  const int H = p.num_heads, mq = p.max_q_len;
  const int64_t rows_max = (int64_t)mq * H;
  const int nred = p.work_meta_data[PMLA_META_NUM_REDUCE];
  const int lane = threadIdx.x % WARP;
  const int64_t nw = (int64_t)gridDim.x * (blockDim.x / WARP);
  int32_t *errw = p.work_meta_data + PMLA_META_ERROR;
  for (int64_t pair = (int64_t)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
       pair < nred * rows_max; pair += nw) {
    const int k = (int)(pair / rows_max), i = (int)(pair % rows_max);
    const int r = p.reduce_final_map[k];
    const int qb = p.qo_indptr ? p.qo_indptr[r] : r;
    const int qe = p.qo_indptr ? p.qo_indptr[r + 1] : r + 1;
    if (qb < 0 || qe < qb || qe > p.num_tokens || qe - qb > mq) {
      if (lane == 0 && i == 0)
        atomicOr(errw, (int)PMLA_PLAN_ERR_QO_INDPTR);
      continue;
    }
    if (i >= (qe - qb) * H)
      continue;
    reduce_row(p, k, i, qb, lane);
  }
}

} /* namespace */

hipError_t pmla_launch_reduce(const pmla_gpu_problem &p, hipStream_t stream) {
  /* entries <= num_units, rows per entry <= max_q_len * heads */
  int64_t pairs = (int64_t)p.num_units * p.max_q_len * p.num_heads;
  int64_t blocks = (pairs + REDUCE_THREADS / WARP - 1) / (REDUCE_THREADS / WARP);
  if (blocks > 65535)
    blocks = 65535;
  return pdl_launch(pmla_reduce_kernel, dim3((unsigned)blocks), dim3(REDUCE_THREADS), 0, stream,
                    p);
}
