/* SPDX-License-Identifier: MIT */
/* mla_cpu.h - MLA decode compute on the CPU: one scheduling unit's work
 * items (online softmax over its KV range) and the reduce of split requests.
 * Plain pointers only; the plugin owns threads and buffers. */
#ifndef PMLA_MLA_CPU_H
#define PMLA_MLA_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "mla_types.h"

#define PMLA_CPU_CHUNK 16 /* KV tokens converted to fp32 at a time */

typedef struct pmla_cpu_problem {
  int32_t num_heads;
  int32_t max_q_len;            /* rows per partial slot */
  float softmax_scale;
  const uint16_t *q;            /* bf16 [tokens, heads, 576] */
  int64_t num_tokens;
  const void *kv;               /* [num_slots] rows of pmla_kv_row_bytes(kv_format) */
  int32_t kv_format;            /* pmla_kv_format */
  float kv_scale;               /* PMLA_KV_E4M3: value = e4m3 * kv_scale */
  pmla_kv_map map;
  const int32_t *qo_indptr;     /* NULL: request r is row r */
  uint16_t *out;                /* bf16 [tokens, heads, 512] */
  float *lse;                   /* fp32 [tokens, heads] or NULL */
  float *partial_out;           /* [slots, max_q_len, heads, 512] */
  float *partial_lse;           /* [slots, max_q_len, heads] */
  int32_t fold;                 /* batch-invariant schedule (plan_invariant.h):
                                   fold flags on items, the reduce folds */
} pmla_cpu_problem;

/* Scratch floats one worker needs for a builder's shape. */
size_t pmla_cpu_scratch_floats(int32_t num_heads, int32_t max_q_len);

/* Runs work items [begin, end) of work_info_set. Returns device-style error
 * bits for slots it had to skip (0 when the input was clean). */
int32_t pmla_cpu_run_items(const pmla_cpu_problem *pb, const int32_t *work_info_set,
                           int32_t begin, int32_t end, float *scratch);

/* Merges reduce entries k = first, first + stride, ... < count. */
void pmla_cpu_reduce(const pmla_cpu_problem *pb, const int32_t *reduce_indptr,
                     const int32_t *reduce_final_map, const int32_t *reduce_partial_map,
                     int32_t first, int32_t stride, int32_t count);

#endif
