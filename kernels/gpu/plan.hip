/* plan.hip - the metadata kernel: pmla_plan (planner.h) on the device.
 *
 * One work-group: every thread first stages the per-request inputs
 * (qo_indptr, kv_lens or kv_indptr + kv_last_page_len) into shared memory,
 * then a single thread runs the shared planner over shared memory, so the
 * device schedule is the host's bit for bit. No host sync, no allocation,
 * no copies: capturable in a graph together with the decode. Requests
 * beyond PMLA_PLAN_STAGE_MAX are read from global memory directly. */
#include <stdint.h>

#include "hip_compat.h"
#include "mla_gpu.h"

#define PMLA_PLAN_THREADS 256
#define PMLA_PLAN_STAGE_MAX 2048 /* 4 arrays: 32 KiB of shared memory */

namespace {

__device__ void stage(int32_t *dst, const int32_t *src, int32_t n) {
  for (int32_t k = threadIdx.x; k < n; k += blockDim.x)
    dst[k] = src[k];
}

__global__ void __launch_bounds__(PMLA_PLAN_THREADS) pmla_plan_kernel(pmla_plan_input in,
                                                                       pmla_plan_output out,
                                                                       int staged) {
  extern __shared__ int32_t s_in[];
  if (staged) {
    const int32_t R = in.num_requests;
    int32_t *s = s_in;
    if (in.qo_indptr) {
      stage(s, in.qo_indptr, R + 1);
      in.qo_indptr = s;
      s += R + 1;
    }
    if (in.kv_lens) {
      stage(s, in.kv_lens, R);
      in.kv_lens = s;
      s += R;
    } else if (in.kv_indptr) {
      stage(s, in.kv_indptr, R + 1);
      in.kv_indptr = s;
      s += R + 1;
      stage(s, in.kv_last_page_len, R);
      in.kv_last_page_len = s;
      s += R;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0)
    pmla_plan(&in, &out);
}

} /* namespace */

extern "C" int pmla_gpu_plan(const pmla_plan_input *in, const pmla_plan_output *out,
                             void *stream) {
  if (!in || !out || in->num_requests < 0 || in->num_units < 1)
    return (int)hipErrorInvalidValue;
  const int32_t R = in->num_requests;
  int staged = R <= PMLA_PLAN_STAGE_MAX;
  size_t words = 0;
  if (staged) {
    if (in->qo_indptr)
      words += R + 1;
    if (in->kv_lens)
      words += R;
    else if (in->kv_indptr)
      words += 2 * (size_t)R + 1;
  }
  pmla_plan_kernel<<<1, PMLA_PLAN_THREADS, words * sizeof(int32_t), (hipStream_t)stream>>>(
      *in, *out, staged);
  return (int)hipGetLastError();
}
