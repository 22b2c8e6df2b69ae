/* SPDX-License-Identifier: MIT */
/* kv_map.h - device helpers both decode bodies gather KV with: the map
 * entry of a position (page or top-k slot), its slot with bad indices
 * skipped and flagged, and 16-byte cp.async copies with zero fill. */
#ifndef PMLA_GPU_KV_MAP_H
#define PMLA_GPU_KV_MAP_H

#include <stdint.h>

#include "hip_compat.h"
#include "mla_gpu.h"

namespace pmla_kv {


__device__ __forceinline__ void cp16(char *dst, const char *src, bool valid) {
#if defined(PMLA_PLATFORM_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                   (uint32_t)__cvta_generic_to_shared(dst)),
               "l"(src), "r"(valid ? 16 : 0));
#else
  uint4 v = valid ? *(const uint4 *)src : make_uint4(0, 0, 0, 0);
  *(uint4 *)dst = v;
#endif
}
__device__ __forceinline__ void cp_commit() {
#if defined(PMLA_PLATFORM_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N> __device__ __forceinline__ void cp_wait() {
#if defined(PMLA_PLATFORM_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

/* The raw map entry of position p of request r (page, or top-k slot), read
 * one block ahead of its use so the gather's index load is off the
 * critical path. csr_first: kv_indptr[r] (CSR only). */
__device__ __forceinline__ int32_t kv_raw(const pmla_kv_map &m, int32_t r, int32_t p,
                                          int32_t csr_first) {
  if (m.topk)
    return m.topk[(int64_t)r * m.topk_stride + p];
  int32_t pg = (int32_t)pmla_fastdiv_q(m.page_div, (uint32_t)p);
  return m.block_table ? m.block_table[(int64_t)r * m.block_table_stride + pg]
                       : m.kv_indices[csr_first + pg];
}
/* Global slot from a raw entry, or -1 to skip (bad indices flagged). */
__device__ __forceinline__ int64_t kv_slot(const pmla_kv_map &m, int32_t raw, int32_t p,
                                           int32_t *err, bool flag) {
  if (m.topk) {
    if (raw == -1) /* an unused top-k entry */
      return -1;
    if (raw < 0 || raw >= m.num_slots) {
      if (flag)
        atomicOr(err, (int)PMLA_PLAN_ERR_SLOT_INDEX);
      return -1;
    }
    return raw;
  }
  int64_t slot = (int64_t)raw * m.page_size + pmla_fastdiv_r(m.page_div, (uint32_t)p);
  if (raw < 0 || slot >= m.num_slots) {
    if (flag)
      atomicOr(err, (int)PMLA_PLAN_ERR_PAGE_INDEX);
    return -1;
  }
  return slot;
}
} /* namespace pmla_kv */
#endif
