/* SPDX-License-Identifier: MIT */
/* pdl.h - programmatic dependent launch (NVIDIA sm_90, CUDA 12+), on by
 * default; the knob PMLA_PDL=0 of config.h makes plain launches and the
 * calls below no-ops (always so on AMD).
 *
 * Each of our kernels is launched with programmatic stream
 * serialisation: the runtime may schedule it while the previous kernel in
 * the stream is still running, which hides the launch gap between the
 * metadata, decode and reduce kernels. Every kernel therefore calls
 * pdl_wait() before it touches memory an earlier kernel writes (it returns
 * once the previous grid has completed and its writes are visible: the
 * caller's own kernels before ours are covered too), and pdl_trigger()
 * early so that the next kernel may be scheduled. The one read before the
 * wait is the reduce's of the schedule: the decode kernel triggers only
 * after its own wait, by which time the metadata kernel has completed. */
#ifndef PMLA_GPU_PDL_H
#define PMLA_GPU_PDL_H

#include "config.h"
#include "hip_compat.h"

#if PMLA_PDL && defined(PMLA_PLATFORM_NVIDIA)
#define PMLA_PDL_ON 1
#endif

__device__ __forceinline__ void pdl_wait() {
#if defined(PMLA_PDL_ON) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(PMLA_PDL_ON) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

#ifdef PMLA_PDL_ON
/* the current device runs griddepcontrol (sm_90 and later); the kernels
 * built for older targets compile the calls above to nothing, so they must
 * not be launched early there */
static inline bool pdl_device() {
  int dev = 0, major = 0;
  return cudaGetDevice(&dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
         major >= 9;
}
#endif

/* kernel<<<grid, block, smem, stream>>>(args...): the launch's own error,
 * read and cleared. An error already pending on the thread (a failed call
 * of the host's, or of pmla's own that was reported) is cleared first, so
 * it is not taken for this launch's. */
template <typename... P, typename... A>
static inline hipError_t plain_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                                      hipStream_t stream, A... args) {
  (void)hipGetLastError();
  kernel<<<grid, block, smem, stream>>>(args...);
  return hipGetLastError();
}

/* kernel<<<grid, block, smem, stream>>>(args...), with the PDL attribute
 * when PMLA_PDL is on and the device supports it */
template <typename... P, typename... A>
static inline hipError_t pdl_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                                    hipStream_t stream, A... args) {
#ifdef PMLA_PDL_ON
  if (!pdl_device())
    return plain_launch(kernel, grid, block, smem, stream, args...);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, args...);
  if (e != cudaSuccess)
    (void)cudaGetLastError(); /* returned here: not left for the host's next check */
  return e;
#else
  return plain_launch(kernel, grid, block, smem, stream, args...);
#endif
}

#endif
