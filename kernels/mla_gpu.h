/* SPDX-License-Identifier: MIT */
/* mla_gpu.h - host-callable launchers of the GPU kernels (HIP source in
 * kernels/gpu/, built by hipcc for AMD or nvcc for NVIDIA). C linkage and
 * plain device pointers only: the plugin owns allocation and streams.
 * Every launcher is asynchronous on `stream`, allocates nothing, never
 * synchronises, and returns 0 or the runtime's error code. */
#ifndef PMLA_MLA_GPU_H
#define PMLA_MLA_GPU_H

#include <stdint.h>

#include "mla_types.h"
#include "planner.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pmla_gpu_problem {
  int32_t num_heads;
  int32_t max_q_len;          /* rows per partial slot */
  float softmax_scale;
  int32_t num_units;          /* N: planner units = persistent work-groups per head tile */
  int32_t min_mt;             /* smallest row tile, 16-row units: pmla_gpu_min_mt */
  int32_t sm90;               /* 64-row tiles run the wgmma body: pmla_gpu_prepare */
  const uint16_t *q;          /* bf16 [num_tokens, heads, 576] */
  int64_t num_tokens;
  const void *kv;             /* [num_slots] rows of pmla_kv_row_bytes(kv_format) */
  int32_t kv_format;          /* pmla_kv_format */
  const float *kv_scale;      /* PMLA_KV_E4M3: device fp32 [1], value = e4m3 * scale */
  pmla_kv_map map;
  const int32_t *qo_indptr;   /* dense: [R+1]; sparse: NULL (request r = row r) */
  uint16_t *out;              /* bf16 [num_tokens, heads, 512] */
  float *lse;                 /* fp32 [num_tokens, heads] or NULL */
  float *partial_out;         /* fp32 [max_slots, max_q_len, heads, 512] */
  float *partial_lse;         /* fp32 [max_slots, max_q_len, heads] */
  int32_t *work_meta_data;    /* [PMLA_META_WORDS_]; error word at PMLA_META_ERROR */
  const int32_t *work_indptr; /* [N+1] */
  const int32_t *work_info_set;
  const int32_t *reduce_indptr;
  const int32_t *reduce_final_map;
  const int32_t *reduce_partial_map;
  int32_t max_slots;          /* partial slots (pmla_builder_info.max_partial_slots) */
  int32_t fold;               /* batch-invariant schedule (plan_invariant.h): items may
                                 fold into their slot, the reduce folds left to right */
} pmla_gpu_problem;

/* The most planner units the metadata kernel takes (its per-chunk piece
 * counts are packed in 21-bit fields: 512 requests x 2048 units); the
 * plugin clamps pmla_gpu_sched_units to it. */
#define PMLA_GPU_MAX_UNITS 2048

/* The smallest row tile (16-row units) on a device where pmla_gpu_prepare
 * answered sm90: 4 (64-row wgmma tiles for every head count) where the
 * wgmma body runs, else 1. */
int32_t pmla_gpu_min_mt(int32_t sm90);

/* Planner units for a device with cu_count CUs/SMs and this head count
 * (a head tile may take several CUs per unit). */
int32_t pmla_gpu_sched_units(int32_t cu_count, int32_t num_heads, int32_t max_q_len,
                             int32_t min_mt);

/* One-time lookups the launchers need later (NVIDIA: the tensor-map
 * encoder, found through the runtime), so a decode step allocates nothing
 * on the host; call it at builder init with the builder's device current.
 * Returns 1 when that device runs the sm_90a wgmma body, else 0 (the value
 * of pmla_gpu_problem.sm90 for its builders). */
int32_t pmla_gpu_prepare(void);

/* 0 when the current device runs this build's kernels, else the runtime's
 * error for loading one of them (e.g. no image for the device's
 * architecture: every launch would fail the same way). */
int pmla_gpu_image_error(void);

/* Runs pmla_plan on the device. `in` holds device pointers (qo_indptr,
 * kv_lens, ...); `out` device buffers. */
int pmla_gpu_plan(const pmla_plan_input *in, const pmla_plan_output *out, void *stream);

/* The persistent decode kernel followed by the reduce of split requests. */
int pmla_gpu_decode(const pmla_gpu_problem *problem, void *stream);

const char *pmla_gpu_error_string(int code);

#ifdef __cplusplus
}
#endif
#endif
