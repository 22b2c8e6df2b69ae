/* SPDX-License-Identifier: MIT */
/* gpu_runtime.h - the few GPU runtime calls the plugin's C code makes, mapped
 * to the CUDA runtime (NVIDIA) or HIP (AMD). Debian's HIP 5.2 headers for the
 * NVIDIA platform do not compile against CUDA 13 (nvidia_hip_runtime_api.h
 * trips on cudaMemLocation and removed cudaDeviceProp fields), so on NVIDIA
 * we call the CUDA runtime's C API directly instead of going through HIP. */
#ifndef PMLA_GPU_RUNTIME_H
#define PMLA_GPU_RUNTIME_H

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
#define gpuComputeCapability(major, minor, dev)                                                \
  (cudaDeviceGetAttribute((major), cudaDevAttrComputeCapabilityMajor, (dev)) ||               \
   cudaDeviceGetAttribute((minor), cudaDevAttrComputeCapabilityMinor, (dev)))
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
#define gpuComputeCapability(major, minor, dev)                                                \
  (hipDeviceGetAttribute((major), hipDeviceAttributeComputeCapabilityMajor, (dev)) ||          \
   hipDeviceGetAttribute((minor), hipDeviceAttributeComputeCapabilityMinor, (dev)))
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
