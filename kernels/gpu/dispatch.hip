/* SPDX-License-Identifier: MIT */
/* dispatch.hip - the C entry points of mla_gpu.h: per-device preparation,
 * the row tile and unit count of a builder, and one decode step = the
 * decode kernel of the step's row tile followed by the reduce. */
#include <stdint.h>

#include "config.h"
#include "hip_compat.h"
#include "launch.h"
#include "mla_gpu.h"
#include "traits.h"

using pmla_traits::host_mt;
using pmla_traits::host_tiles;

hipError_t pmla_opt_in_smem(const void *kernel, size_t smem, unsigned long long *done) {
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
  if (e != hipSuccess)
    (void)hipGetLastError(); /* returned here: not left for the host's next check */
  return e;
}

extern "C" int32_t pmla_gpu_prepare(void) {
#ifdef PMLA_PLATFORM_NVIDIA
  pmla_sm90_prepare();
  return PMLA_WGMMA && pmla_sm90_image_runs() ? 1 : 0;
#else
  return 0;
#endif
}

/* 64-row tiles (h <= 16: the NARROW form) for every builder where the
 * wgmma kernel runs: faster than the 16/32-row mma.sync body for every
 * cache format, page size and top-k step measured (docs/performance.md;
 * b=128 L=4096 h=16 page 16: 164.8 us against 197.9, top-k 2048 x 128
 * tokens h=16: 74.8 against 109.4); a lone short request on small pages
 * loses a little (b=1 L=4096 h=16 page 16: 16.6 against 15.4). */
extern "C" int32_t pmla_gpu_min_mt(int32_t sm90) {
  if (PMLA_MIN_MT)
    return PMLA_MIN_MT;
  return sm90 ? 4 : 1;
}

extern "C" int32_t pmla_gpu_sched_units(int32_t cu_count, int32_t num_heads, int32_t max_q_len,
                                        int32_t min_mt) {
  if (num_heads < 1)
    num_heads = 1;
  if (max_q_len < 1)
    max_q_len = 1;
  const int occ = pmla_traits::host_occupancy(host_mt(num_heads, max_q_len, min_mt));
  int32_t n = cu_count * occ / host_tiles(num_heads, max_q_len, min_mt);
  return n < 1 ? 1 : n;
}

extern "C" int pmla_gpu_decode(const pmla_gpu_problem *problem, void *stream) {
  if (!problem || problem->num_heads < 1 || problem->max_q_len < 1 || problem->num_units < 1)
    return (int)hipErrorInvalidValue;
  const pmla_gpu_problem &p = *problem;
  hipStream_t st = (hipStream_t)stream;
  const int mt = host_mt(p.num_heads, p.max_q_len, p.min_mt);
  const int tiles = host_tiles(p.num_heads, p.max_q_len, p.min_mt);
  hipError_t e;
#ifdef PMLA_PLATFORM_NVIDIA
  if (mt == 4 && p.sm90)
    e = pmla_launch_decode_sm90(p, tiles, st);
  else
#endif
    e = pmla_launch_decode_mma(p, mt, tiles, st);
  if (e != hipSuccess)
    return (int)e;
  return (int)pmla_launch_reduce(p, st);
}

extern "C" const char *pmla_gpu_error_string(int code) {
  return hipGetErrorString((hipError_t)code);
}
