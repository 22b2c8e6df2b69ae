/* SPDX-License-Identifier: MIT */
/* config.h - the only compile-time knobs of the GPU kernels, for debugging
 * and for testing one path on hardware that would normally take another.
 * The default build sets none of them; .ci/device-build builds a plugin per
 * knob so the conformance suite covers each path on one GPU.
 *
 *   PMLA_PDL=0      plain launches instead of programmatic dependent launch
 *                   between the metadata, decode and reduce kernels
 *                   (default 1; it applies on NVIDIA sm_90 only)
 *   PMLA_MIN_MT=N   force the smallest row tile to N x 16 rows (1: the
 *                   16/32-row mma.sync body for h <= 32; default 0 = chosen
 *                   by pmla_gpu_min_mt: 64-row tiles where wgmma runs)
 *   PMLA_WGMMA=0    the mma.sync body for 64-row tiles on sm_90a too
 *                   (default 1: the wgmma body where the sm_90a image runs)
 *   PMLA_WG_TMA=0   the wgmma body gathers every KV block with cp.async,
 *                   never by TMA (default 1: whole pages by TMA)
 */
#ifndef PMLA_GPU_CONFIG_H
#define PMLA_GPU_CONFIG_H

#ifndef PMLA_PDL
#define PMLA_PDL 1
#endif
#ifndef PMLA_MIN_MT
#define PMLA_MIN_MT 0
#endif
#ifndef PMLA_WGMMA
#define PMLA_WGMMA 1
#endif
#ifndef PMLA_WG_TMA
#define PMLA_WG_TMA 1
#endif

/* device code of the wgmma body: nvcc compiling for sm_90a */
#if PMLA_WGMMA && defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PMLA_SM90_DEVICE 1
#endif

#endif
