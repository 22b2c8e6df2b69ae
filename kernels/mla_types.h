/* SPDX-License-Identifier: MIT */
/* mla_types.h - shapes and the KV slot map shared by CPU and GPU compute.
 * Plain C, includable from device code. */
#ifndef PMLA_MLA_TYPES_H
#define PMLA_MLA_TYPES_H

#include <stdint.h>

#include "fastdiv.h"

#define PMLA_QK_DIM 576 /* 512 latent + 64 rope */
#define PMLA_V_DIM 512
/* log2(e): every backend scales the scores by softmax_scale * PMLA_LOG2E in
 * fp32 and takes exp2 (init_builder refuses scales whose product overflows) */
#define PMLA_LOG2E 1.4426950408889634f

/* How a KV row is stored (the kernels' names for the ABI's kv_dtype):
 *   BF16    576 bf16
 *   E4M3    576 float8_e4m3fn; value = e4m3 * one scale for the cache
 *   DS_MLA  512 e4m3 in 4 tiles of 128, 4 fp32 tile scales, 64 bf16 rope */
typedef enum pmla_kv_format {
  PMLA_KV_BF16 = 0,
  PMLA_KV_E4M3 = 1,
  PMLA_KV_DS_MLA = 2
} pmla_kv_format;
#define PMLA_DS_MLA_SCALES 512 /* byte offset of the tile scales in a DS_MLA row */
#define PMLA_DS_MLA_ROPE 528   /* byte offset of the bf16 rope values */
#define PMLA_DS_MLA_TILE 128   /* latent values per scale */

/* bytes of one KV row */
static inline int32_t pmla_kv_row_bytes(int32_t format) {
  return format == PMLA_KV_E4M3 ? 576 : format == PMLA_KV_DS_MLA ? 656 : 1152;
}

/* Maps position p of request r to a global KV slot (row of the cache viewed
 * as [num_slots, 576]). Exactly one source is set:
 *   block table: page = block_table[r * stride + p / page_size]
 *   CSR:         page = kv_indices[kv_indptr[r] + p / page_size]
 *   sparse:      slot = topk[r * topk_stride + p]   (-1: skip)
 * slot = page * page_size + p % page_size. A slot outside [0, num_slots) is
 * skipped and flagged (PAGE_INDEX for pages, SLOT_INDEX for sparse). */
typedef struct pmla_kv_map {
  int32_t page_size;
  pmla_fastdiv page_div; /* page_size, for the GPU loaders' divisions */
  int64_t num_slots;
  const int32_t *block_table;
  int32_t block_table_stride;
  const int32_t *kv_indptr;
  const int32_t *kv_indices;
  const int32_t *topk;
  int32_t topk_stride;
} pmla_kv_map;

#endif
