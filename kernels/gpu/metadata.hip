/* SPDX-License-Identifier: MIT */
/* metadata.hip - the metadata kernel: the planner of planner.h run in parallel by
 * one work-group. Every per-request decision is made by the same functions
 * the serial pmla_plan calls (pmla_plan_describe / _line_cost / _piece_count
 * / _fill_next / _place / _finish); this file only supplies the prefix sums
 * the serial loop keeps in variables: block-wide scans over chunks of
 * PLAN_THREADS requests, and the fill state entering each request, which warp
 * 0 walks per chunk (see fill_chunk). So the device schedule is the host's,
 * bit for bit. No host sync, no allocation, no copies: capturable in a graph
 * together with the decode. */
#include <stdint.h>

#include "hip_compat.h"
#include "mla_gpu.h"
#include "pdl.h"
#include "plan_invariant.h"

#define PLAN_THREADS 256
#define FIELD_BITS 21 /* per-chunk sums of pieces stay below 2^21 (256 requests * 2048 units) */
#define FIELD_MASK ((1ll << FIELD_BITS) - 1)

namespace {

/* 32-lane shuffles and ballots on both platforms (an AMD wavefront of 64
 * lanes is two independent 32-lane groups for these; ballot32 assumes the
 * wave64 CDNA targets the build is for). */
#ifdef PMLA_PLATFORM_NVIDIA
template <typename T> __device__ __forceinline__ T shfl32(T v, int src) {
  return __shfl_sync(0xffffffffu, v, src);
}
template <typename T> __device__ __forceinline__ T shfl32_up(T v, int d) {
  return __shfl_up_sync(0xffffffffu, v, d);
}
template <typename T> __device__ __forceinline__ T shfl32_xor(T v, int m) {
  return __shfl_xor_sync(0xffffffffu, v, m);
}
__device__ __forceinline__ unsigned ballot32(bool p) { return __ballot_sync(0xffffffffu, p); }
#else
template <typename T> __device__ __forceinline__ T shfl32(T v, int src) {
  return __shfl(v, src, 32);
}
template <typename T> __device__ __forceinline__ T shfl32_up(T v, int d) {
  return __shfl_up(v, d, 32);
}
template <typename T> __device__ __forceinline__ T shfl32_xor(T v, int m) {
  return __shfl_xor(v, m, 32);
}
__device__ __forceinline__ unsigned ballot32(bool p) {
  return (unsigned)(__ballot(p) >> (threadIdx.x & 32));
}
#endif

/* Exclusive prefix of x over the block; *sum gets the block's total. */
__device__ int64_t block_exclusive_scan(int64_t x, int64_t *buf, int64_t *sum) {
  const int t = threadIdx.x;
  buf[t] = x;
  __syncthreads();
  for (int off = 1; off < PLAN_THREADS; off <<= 1) {
    int64_t y = t >= off ? buf[t - off] : 0;
    __syncthreads();
    buf[t] += y;
    __syncthreads();
  }
  int64_t inclusive = buf[t];
  *sum = buf[PLAN_THREADS - 1];
  __syncthreads();
  return inclusive - x;
}

/* The fill is sequential, so warp 0 walks it over a chunk's n requests
 * (blocks in shared memory), 32 at a time, from the state the previous
 * chunk left in `run` (identical in every lane). Requests that fit whole
 * where the fill stands are settled together from a warp prefix sum of
 * their costs; only the first that does not fit (a split, or a move to the
 * next unit: about one per unit boundary) takes a step of
 * pmla_plan_fill_next, every lane computing it alike. Records the state
 * entering each request and its piece count when unit_at is set (then
 * room_at and pieces too); returns whether some request got more pieces
 * than `cap` (0: no cap). */
__device__ __forceinline__ int fill_chunk(const int64_t *blocks, int32_t n, int64_t capacity,
                                          int32_t units, int32_t cap, pmla_plan_fill &run,
                                          int32_t *unit_at, int64_t *room_at, int32_t *pieces) {
  const int lane = threadIdx.x & 31;
  int over = 0;
  for (int32_t w0 = 0; w0 < n; w0 += 32) {
    const int m = n - w0 < 32 ? n - w0 : 32; /* requests in this window */
    const bool valid = lane < m;
    const int64_t b = valid ? blocks[w0 + lane] : 0;
    const int64_t need = valid ? PMLA_SPLIT_OVERHEAD + b : 0;
    int64_t incl = need; /* costs of this window's requests up to this lane */
    for (int o = 1; o < 32; o <<= 1) {
      int64_t y = shfl32_up(incl, o);
      if (lane >= o)
        incl += y;
    }
    const int64_t excl = incl - need;
    int start = 0;    /* first request of the window still to place */
    int64_t off = 0;  /* its excl */
    for (;;) {
      const bool live = valid && lane >= start;
      const bool fits = incl - off <= run.room || run.unit >= units - 1;
      const unsigned stop = ballot32(live && !fits);
      const int e = stop ? __ffs(stop) - 1 : m; /* the first that does not fit */
      if (unit_at && live && lane < e) {
        unit_at[w0 + lane] = run.unit;
        room_at[w0 + lane] = run.room - (excl - off);
        pieces[w0 + lane] = 1;
      }
      const int64_t excl_e = shfl32(excl, e & 31), incl_e = shfl32(incl, e & 31);
      const int64_t last = shfl32(incl, 31);
      run.room -= (e < 32 ? excl_e : last) - off;
      if (e >= m)
        break;
      const int64_t be = shfl32(b, e);
      if (lane == e && unit_at) {
        unit_at[w0 + e] = run.unit;
        room_at[w0 + e] = run.room;
      }
      const int32_t np = pmla_plan_fill_next(&run, be, capacity, units);
      if (lane == e && unit_at)
        pieces[w0 + e] = np;
      over |= np > cap;
      off = incl_e;
      start = e + 1;
    }
  }
  return cap > 0 && over;
}

/* Sum and maximum over the block of one value per thread, one shared
 * atomic per warp (64-bit shared atomics are compare-and-swap loops). */
__device__ __forceinline__ void block_sum_max(unsigned long long sum, unsigned long long mx,
                                              unsigned long long *s_sum,
                                              unsigned long long *s_max) {
  for (int o = 16; o >= 1; o >>= 1) {
    sum += shfl32_xor(sum, o);
    unsigned long long y = shfl32_xor(mx, o);
    mx = y > mx ? y : mx;
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(s_sum, sum);
    if (s_max)
      atomicMax(s_max, mx);
  }
}

__global__ void __launch_bounds__(PLAN_THREADS) pmla_plan_kernel(pmla_plan_input in,
                                                                  pmla_plan_output out) {
  __shared__ int64_t buf[PLAN_THREADS];
  __shared__ int64_t blocks[PLAN_THREADS];
  __shared__ int32_t unit_at[PLAN_THREADS];
  __shared__ int64_t room_at[PLAN_THREADS];
  __shared__ int32_t pieces[PLAN_THREADS];
  __shared__ int32_t last_unit[PLAN_THREADS];
  __shared__ unsigned long long s_total, s_piece_total, s_max_blocks;
  __shared__ int32_t s_err, s_piece_mode, s_rows, s_max_pieces;
  pdl_wait();
  pdl_trigger();
  const int t = threadIdx.x;
  if (in.invariant) { /* the batch-invariant schedule is serial */
    /* the block reads the request arrays first, so the thread that plans
     * finds them in L1 instead of waiting out a memory latency per request */
    int32_t sink = 0;
    for (int32_t r = t; r <= in.num_requests; r += PLAN_THREADS) {
      if (in.qo_indptr)
        sink += in.qo_indptr[r];
      if (in.kv_indptr)
        sink += in.kv_indptr[r];
      if (r < in.num_requests) {
        if (in.kv_lens)
          sink += in.kv_lens[r];
        if (in.kv_last_page_len)
          sink += in.kv_last_page_len[r];
      }
    }
    __syncthreads();
    asm volatile("" ::"r"(sink)); /* the loads are kept: their values are "used" */
    if (t == 0)
      pmla_plan_invariant(&in, &out);
    return;
  }
  const int32_t R = in.num_requests, N = in.num_units;
  const int64_t OH = PMLA_SPLIT_OVERHEAD;
  if (t == 0) {
    s_total = s_piece_total = s_max_blocks = 0;
    s_err = s_piece_mode = s_rows = s_max_pieces = 0;
  }
  __syncthreads();

  /* C, and the input errors (counted once, as serially). */
  int32_t err = 0, scratch = 0;
  unsigned long long part = 0, longest = 0;
  for (int32_t r = t; r < R; r += PLAN_THREADS) {
    unsigned long long blocks_r = (unsigned long long)pmla_plan_describe(&in, r, &err).blocks;
    part += OH + blocks_r;
    longest = blocks_r > longest ? blocks_r : longest;
  }
  block_sum_max(part, longest, &s_total, &s_max_blocks);
  atomicOr(&s_err, err);
  err = 0;
  __syncthreads();
  pmla_plan_shape sh = pmla_plan_shape_of((int64_t)s_total, N);
  pmla_plan_fill run = pmla_plan_fill_start(&sh); /* warp 0's */

  /* Piece mode when the fill gives any request more pieces than the cap;
   * no walk when even the longest request cannot get that many. */
  if (pmla_plan_cap_applies(&in) &&
      pmla_plan_fill_max_pieces((int64_t)s_max_blocks, sh.capacity) > in.split_cap) {
    for (int32_t c0 = 0; c0 < R && !s_piece_mode; c0 += PLAN_THREADS) {
      const int32_t n = R - c0 < PLAN_THREADS ? R - c0 : PLAN_THREADS;
      if (t < n)
        blocks[t] = pmla_plan_describe(&in, c0 + t, &scratch).blocks;
      __syncthreads();
      if (t < 32 && fill_chunk(blocks, n, sh.capacity, N, in.split_cap, run, NULL, NULL, NULL))
        s_piece_mode = 1;
      __syncthreads();
    }
    sh.piece_mode = s_piece_mode;
    run = pmla_plan_fill_start(&sh);
    if (sh.piece_mode) {
      part = 0;
      for (int32_t r = t; r < R; r += PLAN_THREADS) {
        pmla_plan_req q = pmla_plan_describe(&in, r, &scratch);
        part += (unsigned long long)pmla_plan_line_cost(&in, &sh, &q);
      }
      block_sum_max(part, 0, &s_piece_total, NULL);
      __syncthreads();
      sh.piece_total = s_piece_total ? (int64_t)s_piece_total : 1;
    }
  }

  /* Placement, a chunk of requests at a time; `at` is the prefix before it. */
  pmla_plan_base at = {0, pmla_plan_fill_start(&sh), 0, 0, 0, 0};
  int32_t rows = 0, max_pieces = 0;
  for (int32_t c0 = 0; c0 < R; c0 += PLAN_THREADS) {
    const int32_t r = c0 + t, valid = r < R;
    const int32_t n = R - c0 < PLAN_THREADS ? R - c0 : PLAN_THREADS;
    pmla_plan_req q = {0, 0, 0, 0};
    if (valid)
      q = pmla_plan_describe(&in, r, &scratch);
    pmla_plan_base base = at;
    int32_t npieces = 0;
    if (sh.piece_mode) {
      int64_t line_sum;
      base.line += block_exclusive_scan(valid ? pmla_plan_line_cost(&in, &sh, &q) : 0, buf,
                                        &line_sum);
      at.line += line_sum;
      npieces = valid ? pmla_plan_piece_count(q.blocks, sh.total, N, in.split_cap) : 0;
    } else {
      blocks[t] = q.blocks;
      __syncthreads();
      if (t < 32)
        fill_chunk(blocks, n, sh.capacity, N, 0, run, unit_at, room_at, pieces);
      __syncthreads();
      if (valid) {
        base.fill.unit = unit_at[t];
        base.fill.room = room_at[t];
        npieces = pieces[t];
      }
    }
    int64_t count_sum;
    int64_t split = npieces > 1;
    int64_t packed = npieces | ((split * npieces) << FIELD_BITS) | (split << (2 * FIELD_BITS));
    int64_t before = block_exclusive_scan(packed, buf, &count_sum);
    base.items += (int32_t)(before & FIELD_MASK);
    base.partials += (int32_t)((before >> FIELD_BITS) & FIELD_MASK);
    base.reduces += (int32_t)(before >> (2 * FIELD_BITS));
    /* Each request needs the unit of the previous request's last item. */
    base.unit = 0;
    last_unit[t] = valid ? pmla_plan_place(&in, NULL, &sh, r, &q, npieces, &base, &scratch) : 0;
    __syncthreads();
    base.unit = t == 0 ? at.unit : last_unit[t - 1];
    if (valid) {
      pmla_plan_place(&in, &out, &sh, r, &q, npieces, &base, &err);
      rows += q.qe - q.qb;
      max_pieces = npieces > max_pieces ? npieces : max_pieces;
    }
    at.items += (int32_t)(count_sum & FIELD_MASK);
    at.partials += (int32_t)((count_sum >> FIELD_BITS) & FIELD_MASK);
    at.reduces += (int32_t)(count_sum >> (2 * FIELD_BITS));
    at.unit = last_unit[n - 1];
    __syncthreads();
  }
  atomicOr(&s_err, err);
  atomicAdd(&s_rows, rows);
  atomicMax(&s_max_pieces, max_pieces);
  __syncthreads();
  if (t == 0)
    pmla_plan_finish(&in, &out, &sh, &at, s_max_pieces, s_rows, s_err);
}

} /* namespace */

extern "C" int pmla_gpu_plan(const pmla_plan_input *in, const pmla_plan_output *out,
                             void *stream) {
  if (!in || !out || in->num_requests < 0 || in->num_units < 1 ||
      in->num_units > PMLA_GPU_MAX_UNITS)
    return (int)hipErrorInvalidValue;
  return (int)pdl_launch(pmla_plan_kernel, dim3(1), dim3(PLAN_THREADS), 0, (hipStream_t)stream,
                         *in, *out);
}
