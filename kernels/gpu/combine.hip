/* combine.hip - the reduce of split requests: for each reduce entry
 * (reduce_indptr / reduce_final_map / reduce_partial_map) and each of its
 * rows, merge the pieces' normalised fp32 partials weighted by
 * exp(lse - max lse) into bf16 out and the natural-log lse. A request whose
 * rows are outside the query tensor is skipped and flagged (QO_INDPTR). */
#include <math.h>
#include <stdint.h>

#include "combine.h"
#include "mma.h"
#include "pdl.h"

namespace {

using namespace pmla_mma;

/* Small blocks: a b=4 long-context step has only entries x heads = 512
 * (entry, row) pairs, and 256-thread blocks would leave half the SMs idle. */
constexpr int REDUCE_THREADS = 128;

/* One warp per (reduce entry, row): pmla_merge::merge_row. */
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
    pmla_merge::merge_row(p, k, i, qb, lane);
  }
}

} /* namespace */

hipError_t pmla_gpu_combine(const pmla_gpu_problem &p, hipStream_t stream) {
  /* entries <= num_units, rows per entry <= max_q_len * heads */
  int64_t pairs = (int64_t)p.num_units * p.max_q_len * p.num_heads;
  int64_t blocks = (pairs + REDUCE_THREADS / WARP - 1) / (REDUCE_THREADS / WARP);
  if (blocks > 65535)
    blocks = 65535;
  return pdl_launch(pmla_reduce_kernel, dim3((unsigned)blocks), dim3(REDUCE_THREADS), 0, stream,
                    p);
}
