/* SPDX-License-Identifier: MIT */
/* mla_types.h - shapes and the KV slot map shared by CPU and GPU compute.
 * Plain C, includable from device code. */
#ifndef PMLA_MLA_TYPES_H
#define PMLA_MLA_TYPES_H

#include <stdint.h>

#define PMLA_QK_DIM 576 /* 512 latent + 64 rope */
#define PMLA_V_DIM 512

/* Maps position p of request r to a global KV slot (row of the cache viewed
 * as [num_slots, 576]). Exactly one source is set:
 *   block table: page = block_table[r * stride + p / page_size]
 *   CSR:         page = kv_indices[kv_indptr[r] + p / page_size]
 *   sparse:      slot = topk[r * topk_stride + p]   (-1: skip)
 * slot = page * page_size + p % page_size. A slot outside [0, num_slots) is
 * skipped and flagged (PAGE_INDEX for pages, SLOT_INDEX for sparse). */
typedef struct pmla_kv_map {
  int32_t page_size;
  int64_t num_slots;
  const int32_t *block_table;
  int32_t block_table_stride;
  const int32_t *kv_indptr;
  const int32_t *kv_indices;
  const int32_t *topk;
  int32_t topk_stride;
} pmla_kv_map;

#endif
