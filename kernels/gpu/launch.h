/* SPDX-License-Identifier: MIT */
/* launch.h - the host-side launchers each kernel file provides to
 * dispatch.hip (C++ linkage, inside the kernels only). Each queues its
 * kernel on the stream, allocates nothing and never synchronises. */
#ifndef PMLA_GPU_LAUNCH_H
#define PMLA_GPU_LAUNCH_H

#include <stddef.h>

#include "hip_compat.h"
#include "mla_gpu.h"

/* The dynamic shared memory opt-in of `kernel`, once per device (bit d of
 * *done; devices past 63 ask on every launch). */
hipError_t pmla_opt_in_smem(const void *kernel, size_t smem, unsigned long long *done);

/* decode_mma.hip: the mma.sync / MFMA body with MT x 16-row tiles */
hipError_t pmla_launch_decode_mma(const pmla_gpu_problem &p, int mt, int tiles, hipStream_t st);

#ifdef PMLA_PLATFORM_NVIDIA
/* decode_sm90.hip: the wgmma body with 64-row tiles; runs only where the
 * sm_90a image loads (pmla_sm90_image_runs) */
hipError_t pmla_launch_decode_sm90(const pmla_gpu_problem &p, int tiles, hipStream_t st);
/* whether the current device runs the sm_90a image of the wgmma kernel */
bool pmla_sm90_image_runs();
/* one-time lookup of the tensor-map encoder (no host work per step) */
void pmla_sm90_prepare();
/* that encoder (cuTensorMapEncodeTiled), NULL where the driver has none */
void *pmla_sm90_tensor_map_encoder();
/* decode_sm90_e4m3.hip: the body for E4M3 caches with at most 32 rows per
 * step (heads x query tokens), outside the batch-invariant mode */
hipError_t pmla_launch_decode_sm90_e4m3(const pmla_gpu_problem &p, int tiles, hipStream_t st);
#endif

/* reduce.hip: merges every reduce entry's partials into out (+ lse) */
hipError_t pmla_launch_reduce(const pmla_gpu_problem &p, hipStream_t st);

#endif
