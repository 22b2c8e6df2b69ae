/* SPDX-License-Identifier: MIT */
/* hip_compat.h - the thin portability layer of kernels/gpu/.
 *
 * AMD (hipcc, __HIP_PLATFORM_AMD__): <hip/hip_runtime.h> as is.
 * NVIDIA (nvcc): CUDA's own headers plus the handful of hip* names the GPU
 * sources use, defined here. Debian's HIP 5.2 NVIDIA headers do not compile
 * against CUDA 13 (nvidia_hip_runtime_api.h fails on cudaMemLocation and
 * removed cudaDeviceProp fields), so the NVIDIA path never includes any hip
 * header. Add a name here only when a source needs it. */
#ifndef PMLA_HIP_COMPAT_H
#define PMLA_HIP_COMPAT_H

#if defined(__CUDACC__) && !defined(__HIP_PLATFORM_AMD__) && !defined(__HIP__)
#define PMLA_PLATFORM_NVIDIA 1
#include <cuda_runtime.h>
#include <cuda_bf16.h>
typedef cudaStream_t hipStream_t;
typedef cudaError_t hipError_t;
#define hipSuccess cudaSuccess
#define hipGetLastError cudaGetLastError
#define hipGetErrorString cudaGetErrorString
#define hipGetDevice cudaGetDevice
#define hipFuncSetAttribute(f, a, v) cudaFuncSetAttribute(f, a, v)
#define hipFuncAttributeMaxDynamicSharedMemorySize cudaFuncAttributeMaxDynamicSharedMemorySize
typedef cudaFuncAttributes hipFuncAttributes;
#define hipFuncGetAttributes cudaFuncGetAttributes
#define hipErrorInvalidValue cudaErrorInvalidValue
#else
#define PMLA_PLATFORM_AMD 1
#include <hip/hip_runtime.h>
#endif

#endif
