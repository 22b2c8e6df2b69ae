/* plan.hip - the metadata kernel: the planner of planner.h run in parallel
 * by one work-group. Every per-request decision is made by the same
 * functions the serial pmla_plan calls (pmla_plan_describe / _line_cost /
 * _pieces / _place / _finish); this file only supplies the prefix sums the
 * serial loop keeps in variables, as block-wide scans over chunks of
 * PLAN_THREADS requests. So the device schedule is the host's, bit for bit,
 * without one thread walking the whole batch. No host sync, no allocation,
 * no copies: capturable in a graph together with the decode. */
#include <stdint.h>

#include "hip_compat.h"
#include "mla_gpu.h"
#include "pdl.h"

#define PLAN_THREADS 256
#define FIELD_BITS 21 /* per-chunk sums of pieces stay below 2^21 (256 requests * 2048 units) */
#define FIELD_MASK ((1ll << FIELD_BITS) - 1)

namespace {

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

__global__ void __launch_bounds__(PLAN_THREADS) pmla_plan_kernel(pmla_plan_input in,
                                                                  pmla_plan_output out) {
  __shared__ int64_t buf[PLAN_THREADS];
  __shared__ int32_t last_unit[PLAN_THREADS];
  __shared__ int64_t cuts[PMLA_GPU_MAX_UNITS]; /* the line's cut points, divided once */
  __shared__ unsigned long long s_total, s_piece_total;
  __shared__ int32_t s_err, s_piece_mode, s_rows, s_max_pieces;
  pdl_wait();
  pdl_trigger();
  const int t = threadIdx.x;
  const int32_t R = in.num_requests;
  const int64_t N = in.num_units, OH = PMLA_SPLIT_OVERHEAD;
  if (t == 0) {
    s_total = s_piece_total = 0;
    s_err = s_piece_mode = s_rows = s_max_pieces = 0;
  }
  __syncthreads();

  /* The line's length C, and the input errors (counted once, as serially). */
  int32_t err = 0, scratch = 0;
  unsigned long long part = 0;
  for (int32_t r = t; r < R; r += PLAN_THREADS)
    part += (unsigned long long)(OH + pmla_plan_describe(&in, r, &err).blocks);
  atomicAdd(&s_total, part);
  atomicOr(&s_err, err);
  err = 0;
  __syncthreads();
  pmla_plan_shape sh;
  sh.total = s_total ? (int64_t)s_total : 1;
  sh.piece_mode = 0;
  sh.piece_total = 1;
  for (int32_t u = t; u < N; u += PLAN_THREADS)
    cuts[u] = pmla_plan_cut(u, sh.total, N);
  sh.cuts = cuts;
  __syncthreads();

  /* Piece mode when the line-cut gives any request more pieces than the cap. */
  if (in.split_cap > 0 && in.split_cap < N) {
    int64_t line = 0;
    for (int32_t c0 = 0; c0 < R; c0 += PLAN_THREADS) {
      const int32_t r = c0 + t;
      pmla_plan_req q = {0, 0, 0, 0};
      if (r < R)
        q = pmla_plan_describe(&in, r, &scratch);
      int64_t sum, s = line + block_exclusive_scan(r < R ? OH + q.blocks : 0, buf, &sum);
      if (r < R && pmla_plan_line_count(&sh, s, q.blocks, N) > in.split_cap)
        s_piece_mode = 1;
      line += sum;
    }
    __syncthreads();
    sh.piece_mode = s_piece_mode;
    if (sh.piece_mode) {
      part = 0;
      for (int32_t r = t; r < R; r += PLAN_THREADS) {
        pmla_plan_req q = pmla_plan_describe(&in, r, &scratch);
        part += (unsigned long long)pmla_plan_line_cost(&in, &sh, &q);
      }
      atomicAdd(&s_piece_total, part);
      __syncthreads();
      sh.piece_total = s_piece_total ? (int64_t)s_piece_total : 1;
    }
  }

  /* Placement, a chunk of requests at a time; `at` is the prefix before it. */
  pmla_plan_base at = {0, 0, 0, 0, 0};
  int32_t rows = 0, max_pieces = 0;
  for (int32_t c0 = 0; c0 < R; c0 += PLAN_THREADS) {
    const int32_t r = c0 + t, valid = r < R;
    pmla_plan_req q = {0, 0, 0, 0};
    if (valid)
      q = pmla_plan_describe(&in, r, &scratch);
    int64_t line_sum, count_sum;
    pmla_plan_base base = at;
    base.line += block_exclusive_scan(valid ? pmla_plan_line_cost(&in, &sh, &q) : 0, buf,
                                      &line_sum);
    int32_t npieces = valid ? pmla_plan_pieces(&in, &sh, &q, base.line) : 0;
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
    const int32_t last = (R - c0 < PLAN_THREADS ? R - c0 : PLAN_THREADS) - 1;
    at.line += line_sum;
    at.items += (int32_t)(count_sum & FIELD_MASK);
    at.partials += (int32_t)((count_sum >> FIELD_BITS) & FIELD_MASK);
    at.reduces += (int32_t)(count_sum >> (2 * FIELD_BITS));
    at.unit = last_unit[last];
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
