/* combine.h - the reduce of split requests, launched by pmla_gpu_decode
 * after the persistent kernel on the same stream. */
#ifndef PMLA_GPU_COMBINE_H
#define PMLA_GPU_COMBINE_H

#include "hip_compat.h"
#include "mla_gpu.h"

/* Merges every reduce entry's partials into bf16 out (+ lse): one warp per
 * (entry, row). Allocates nothing, never synchronises. */
hipError_t pmla_gpu_combine(const pmla_gpu_problem &p, hipStream_t stream);

#endif
