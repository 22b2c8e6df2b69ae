/* SPDX-License-Identifier: MIT */
/* metadata.hip - the metadata kernel: the planner of planner.h run by one
 * work-group. Every per-request decision is made by the functions the serial
 * pmla_plan calls (pmla_plan_describe / _line_cost / _piece_count /
 * _fill_next / _finish) and every piece is placed by the closed forms the
 * host's walk is tested against (pmla_plan_piece_at, pmla_plan_write_item);
 * this file supplies the prefix sums the serial loop keeps in variables
 * (block-wide scans over chunks of PLAN_THREADS requests) and the fill state
 * entering each request, which one thread walks per chunk (walk_chunk). So
 * the device schedule is the host's, bit for bit. No host sync, no
 * allocation, no copies: capturable in a graph together with the decode. */
#include <stdint.h>

#include "hip_compat.h"
#include "mla_gpu.h"
#include "pdl.h"
#include "plan_invariant.h"

/* 512: a batch of 1024 requests is two chunks (256 threads: 46.9 us per step
 * at b=1024 L=512, 41.5 with 512; equal below 512 requests) */
#define PLAN_THREADS 512
#define FIELD_BITS 21 /* a chunk's pieces stay below 2^21 (512 requests x 2048 units) */
#define FIELD_MASK ((1ll << FIELD_BITS) - 1)

namespace {

/* A 32-lane butterfly shuffle on both platforms (an AMD wavefront of 64
 * lanes is two independent 32-lane groups for it). */
template <typename T> __device__ __forceinline__ T shfl32_xor(T v, int m) {
#ifdef PMLA_PLATFORM_NVIDIA
  return __shfl_xor_sync(0xffffffffu, v, m);
#else
  return __shfl_xor(v, m, 32);
#endif
}

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

/* The fill steps the walk chains (planner.h): the short 32-bit step when
 * the step's C < 2^30 and no request is longer than a fresh unit takes,
 * else pmla_plan_fill_next. */
struct Step64 {
  typedef pmla_plan_fill Fill;
  static __device__ __forceinline__ int32_t next(Fill &f, int64_t b, int64_t cap, int32_t n) {
    return pmla_plan_fill_next(&f, b, cap, n);
  }
};
struct Short32 {
  typedef pmla_plan_fill32 Fill;
  static __device__ __forceinline__ int32_t next(Fill &f, int64_t b, int64_t cap, int32_t n) {
    return pmla_plan_fill_step32(&f, (int32_t)b, (int32_t)cap, n);
  }
};

/* The fill is sequential: one thread walks a chunk's n requests (blocks in
 * shared memory) from the state the previous chunk left in `run`, a few
 * dependent instructions per request (~70 cycles on the H200): the blocks
 * are read ahead of the chain, AHEAD at a time with no branch between the
 * steps. A warp settling the requests that fit 32 at a time took ~410
 * cycles per unit boundary (docs/performance.md). With REC, records the state entering each request
 * and its piece count. Sets *over when a request gets more pieces than
 * `cap` (0: no cap), *overflow when the fill runs past the last unit's room
 * (never expected: planner.h proves it cannot). */
template <bool REC, typename Step>
__device__ __forceinline__ void walk_chunk(const int64_t *__restrict__ blocks, int32_t n,
                                           int64_t capacity, int32_t units, int32_t cap,
                                           pmla_plan_fill &state, int32_t *__restrict__ unit_at,
                                           int64_t *__restrict__ room_at,
                                           int32_t *__restrict__ pieces, int *over,
                                           int *overflow) {
  enum { AHEAD = 8 };
  typename Step::Fill run;
  run.unit = state.unit;
  run.room = state.room;
  int ov = 0, neg = 0;
  auto step = [&](int32_t i, int64_t b) {
    if (REC) {
      unit_at[i] = run.unit;
      room_at[i] = run.room;
    }
    const int32_t np = Step::next(run, b, capacity, units);
    if (REC)
      pieces[i] = np;
    ov |= np > cap;
    neg |= run.room < 0;
  };
  int32_t i = 0;
  for (; i + AHEAD <= n; i += AHEAD) {
    int64_t b[AHEAD];
#pragma unroll
    for (int k = 0; k < AHEAD; k++)
      b[k] = blocks[i + k];
#pragma unroll
    for (int k = 0; k < AHEAD; k++)
      step(i + k, b[k]);
  }
  for (; i < n; i++)
    step(i, blocks[i]);
  state.unit = run.unit;
  state.room = run.room;
  *over |= cap > 0 && ov;
  *overflow |= neg;
}

/* walk_chunk with the cheapest step that is exact for this step's sizes */
template <bool REC>
__device__ __forceinline__ void walk(int64_t total, int64_t max_blocks, const int64_t *blocks,
                                     int32_t n, int64_t capacity, int32_t units, int32_t cap,
                                     pmla_plan_fill &run, int32_t *unit_at, int64_t *room_at,
                                     int32_t *pieces, int *over, int *overflow) {
  if (total < (1 << 30) && max_blocks <= capacity - PMLA_SPLIT_OVERHEAD)
    walk_chunk<REC, Short32>(blocks, n, capacity, units, cap, run, unit_at, room_at, pieces, over,
                             overflow);
  else
    walk_chunk<REC, Step64>(blocks, n, capacity, units, cap, run, unit_at, room_at, pieces, over,
                            overflow);
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
  /* per request of the chunk, for the threads that place its pieces (with
   * blocks, and unit_at / room_at: its fill state, or room_at its line) */
  __shared__ int32_t len_at[PLAN_THREADS], qb_at[PLAN_THREADS], qe_at[PLAN_THREADS];
  __shared__ int32_t item_at[PLAN_THREADS]; /* first item, relative to the chunk's */
  __shared__ int32_t part_at[PLAN_THREADS]; /* first partial slot; -1 unsplit, -2 no room */
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
  pmla_plan_req q0 = {0, 0, 0, 0}; /* request t, which the first chunk places */
  for (int32_t r = t; r < R; r += PLAN_THREADS) {
    const pmla_plan_req q = pmla_plan_describe(&in, r, &err);
    if (r == t)
      q0 = q;
    part += OH + (unsigned long long)q.blocks;
    longest = (unsigned long long)q.blocks > longest ? (unsigned long long)q.blocks : longest;
  }
  block_sum_max(part, longest, &s_total, &s_max_blocks);
  atomicOr(&s_err, err);
  err = 0;
  __syncthreads();
  pmla_plan_shape sh = pmla_plan_shape_of((int64_t)s_total, N);
  pmla_plan_fill run = pmla_plan_fill_start(&sh); /* thread 0's */
  int overflow = 0;                               /* thread 0's */

  /* Piece mode when the fill gives any request more pieces than the cap;
   * no walk when even the longest request cannot get that many. */
  if (pmla_plan_cap_applies(&in) &&
      pmla_plan_fill_max_pieces((int64_t)s_max_blocks, sh.capacity) > in.split_cap) {
    for (int32_t c0 = 0; c0 < R && !s_piece_mode; c0 += PLAN_THREADS) {
      const int32_t n = R - c0 < PLAN_THREADS ? R - c0 : PLAN_THREADS;
      if (t < n)
        blocks[t] = pmla_plan_describe(&in, c0 + t, &scratch).blocks;
      __syncthreads();
      if (t == 0) {
        int over = 0, unused = 0;
        walk<false>(sh.total, (int64_t)s_max_blocks, blocks, n, sh.capacity, N, in.split_cap,
                    run, NULL, NULL, NULL, &over, &unused);
        s_piece_mode = over;
      }
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
    pmla_plan_req q = q0;
    if (c0 > 0 && valid)
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
      if (t == 0) {
        int over = 0; /* uncapped */
        walk<true>(sh.total, (int64_t)s_max_blocks, blocks, n, sh.capacity, N, 0, run, unit_at,
                   room_at, pieces, &over, &overflow);
      }
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
    if (valid) {
      const int fits = pmla_plan_fits(&in, &base, npieces);
      if (!fits)
        err |= PMLA_PLAN_ERR_OVERFLOW;
      if (fits && split) {
        out.reduce_indptr[base.reduces] = base.partials;
        out.reduce_final_map[base.reduces] = r;
      }
      int64_t first, next;
      pmla_plan_piece_at(&in, &sh, &q, npieces, &base, npieces - 1, &first, &next, &last_unit[t]);
      len_at[t] = q.len;
      qb_at[t] = q.qb;
      qe_at[t] = q.qe;
      blocks[t] = q.blocks;
      unit_at[t] = base.fill.unit;
      room_at[t] = sh.piece_mode ? base.line : base.fill.room;
      item_at[t] = base.items - at.items;
      part_at[t] = !fits ? -2 : split ? base.partials : -1;
      rows += q.qe - q.qb;
      max_pieces = npieces > max_pieces ? npieces : max_pieces;
    }
    __syncthreads();
    /* Every item of the chunk, one per thread: its request by a search
     * over the requests' first items, its piece in closed form. */
    const int32_t items = (int32_t)(count_sum & FIELD_MASK);
    for (int32_t k = t; k < items; k += PLAN_THREADS) {
      int32_t lo = 0, hi = n - 1; /* the last request whose first item is <= k */
      if (items == n) /* one item per request */
        lo = hi = k;
      while (lo < hi) {
        const int32_t mid = (lo + hi + 1) >> 1;
        if (item_at[mid] <= k)
          lo = mid;
        else
          hi = mid - 1;
      }
      const int32_t partials = part_at[lo];
      if (partials == -2)
        continue;
      const pmla_plan_req q_lo = {len_at[lo], qb_at[lo], qe_at[lo], blocks[lo]};
      pmla_plan_base b_lo = at;
      b_lo.line = room_at[lo];
      b_lo.fill.unit = unit_at[lo];
      b_lo.fill.room = room_at[lo];
      b_lo.items = at.items + item_at[lo];
      const int32_t p = k - item_at[lo];
      const int32_t np = (lo + 1 < n ? item_at[lo + 1] : items) - item_at[lo];
      int64_t first, next, f0, n0;
      int32_t unit, prev;
      pmla_plan_piece_at(&in, &sh, &q_lo, np, &b_lo, p, &first, &next, &unit);
      if (p > 0)
        pmla_plan_piece_at(&in, &sh, &q_lo, np, &b_lo, p - 1, &f0, &n0, &prev);
      else
        prev = lo > 0 ? last_unit[lo - 1] : at.unit;
      pmla_plan_write_item(&out, c0 + lo, &q_lo, partials, b_lo.items, p, prev, unit, first,
                           next);
    }
    at.items += items;
    at.partials += (int32_t)((count_sum >> FIELD_BITS) & FIELD_MASK);
    at.reduces += (int32_t)(count_sum >> (2 * FIELD_BITS));
    at.unit = last_unit[n - 1];
    __syncthreads();
  }
  if (t == 0 && overflow)
    err |= PMLA_PLAN_ERR_OVERFLOW;
  atomicOr(&s_err, err);
  atomicAdd(&s_rows, rows);
  atomicMax(&s_max_pieces, max_pieces);
  __syncthreads();
  pmla_plan_finish(&in, &out, &sh, &at, s_max_pieces, s_rows, s_err, t, PLAN_THREADS);
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
