/* SPDX-License-Identifier: MIT */
/* gpu_runtime.h - the few GPU runtime calls the plugin's C code makes, mapped
 * to the CUDA runtime (NVIDIA) or HIP (AMD). Debian's HIP 5.2 headers for the
 * NVIDIA platform do not compile against CUDA 13 (nvidia_hip_runtime_api.h
 * trips on cudaMemLocation and removed cudaDeviceProp fields), so on NVIDIA
 * we call the CUDA runtime's C API directly instead of going through HIP. */
#ifndef PMLA_GPU_RUNTIME_H
#define PMLA_GPU_RUNTIME_H

#include <stddef.h>
#include <stdio.h>

#if defined(PMLA_GPU_NVIDIA)
#include <cuda_runtime_api.h>
typedef cudaError_t gpu_error_t;
typedef cudaStream_t gpu_stream_t;
#define GPU_SUCCESS cudaSuccess
#define GPU_OUT_OF_MEMORY cudaErrorMemoryAllocation
#define GPU_DLPACK_DEVICE kDLCUDA
#define gpuGetDeviceCount cudaGetDeviceCount
#define gpuGetDevice cudaGetDevice
#define gpuSetDevice cudaSetDevice
#define gpuMultiProcessorCount(out, dev)                                                       \
  cudaDeviceGetAttribute((out), cudaDevAttrMultiProcessorCount, (dev))
/* the device's architecture, as a message names it: its compute capability */
static inline gpu_error_t gpuArchName(char *buf, size_t size, int dev) {
  int major = 0, minor = 0;
  gpu_error_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (e == cudaSuccess)
    snprintf(buf, size, "compute capability %d.%d", major, minor);
  else
    snprintf(buf, size, "compute capability unknown");
  return e;
}
#define gpuMalloc cudaMalloc
#define gpuFree cudaFree
#define gpuMemset cudaMemset
#define gpuMemcpyDtoH(dst, src, n) cudaMemcpy((dst), (src), (n), cudaMemcpyDeviceToHost)
#define gpuDeviceSynchronize cudaDeviceSynchronize
#define gpuGetErrorString cudaGetErrorString
#define gpuGetLastError cudaGetLastError
#define GPU_PLATFORM_NAME "NVIDIA (CUDA runtime)"
#elif defined(PMLA_GPU_AMD)
#include <hip/hip_runtime_api.h>
typedef hipError_t gpu_error_t;
typedef hipStream_t gpu_stream_t;
#define GPU_SUCCESS hipSuccess
#define GPU_OUT_OF_MEMORY hipErrorOutOfMemory
#define GPU_DLPACK_DEVICE kDLROCM
#define gpuGetDeviceCount hipGetDeviceCount
#define gpuGetDevice hipGetDevice
#define gpuSetDevice hipSetDevice
#define gpuMultiProcessorCount(out, dev)                                                       \
  hipDeviceGetAttribute((out), hipDeviceAttributeMultiprocessorCount, (dev))
/* the device's architecture, as a message names it: its gfx target (what
 * --with-gpu-arch takes), not HIP's compute capability */
static inline gpu_error_t gpuArchName(char *buf, size_t size, int dev) {
  hipDeviceProp_t prop;
  const gpu_error_t e = hipGetDeviceProperties(&prop, dev);
  if (e == hipSuccess)
    snprintf(buf, size, "%.*s", (int)sizeof prop.gcnArchName, prop.gcnArchName);
  else
    snprintf(buf, size, "architecture unknown");
  return e;
}
#define gpuMalloc hipMalloc
#define gpuFree hipFree
#define gpuMemset hipMemset
#define gpuMemcpyDtoH(dst, src, n) hipMemcpy((dst), (src), (n), hipMemcpyDeviceToHost)
#define gpuDeviceSynchronize hipDeviceSynchronize
#define gpuGetErrorString hipGetErrorString
#define gpuGetLastError hipGetLastError
#define GPU_PLATFORM_NAME "AMD (HIP runtime)"
#else
#error "gpu_runtime.h needs PMLA_GPU_NVIDIA or PMLA_GPU_AMD"
#endif

#endif
