/* SPDX-License-Identifier: MIT */
/* cases.h - the named dense and sparse decode cases. pmla-conformance
 * decodes each against the fp64 reference (t_numerics.c); pmla-unit checks
 * what this plugin's planner makes of the same shapes (t_plan_exact.c:
 * that the split cases split, that the sparse cap follows its formula). */
#ifndef PMLA_TEST_CASES_H
#define PMLA_TEST_CASES_H

#include <stdint.h>

#define CASE_MAX_BATCH 16

typedef struct dense_case {
  const char *name;
  uint32_t heads, page_size, cu;
  uint32_t layout; /* PMLA_KV_BLOCK_TABLE or PMLA_KV_CSR */
  int32_t batch;
  int32_t q_lens[CASE_MAX_BATCH];
  int32_t kv_lens[CASE_MAX_BATCH];
  int kv4d;         /* pass the cache as [pages, page_size, 1, 576] */
  int twice;        /* decode a second q against the same schedule */
  int expect_split; /* this plugin splits a request here (asserted by pmla-unit) */
  uint32_t kv_dtype; /* pmla_dtype of the cache; 0: bf16 */
  double q_scale;    /* q's values times this power of two; 0: 1 */
  int nan_at;        /* NAN_IN_*: one NaN planted, the rows that see it must be NaN */
  uint32_t builder_flags; /* pmla_builder_config.flags */
  int32_t page_runs; /* pages dealt in shuffled runs of this many adjacent ones; 0: 1 */
} dense_case;

/* dense_case.nan_at: a NaN in q (token 0, head 1), or in dim 7 of a KV
 * row of request 0 that every query of that request sees: its first, or
 * its last such (kv_len - q_len: in the request's last piece) */
enum { NAN_IN_Q = 1, NAN_IN_KV = 2, NAN_IN_KV_LATE = 3 };

typedef struct sparse_case {
  const char *name;
  uint32_t heads, page_size, topk, cu;
  int32_t tokens, num_pages;
  int64_t max_seq_len;
  int hole_pct, dup_pct;
  int32_t valid;    /* listed entries per token (0: topk); the rest are -1 */
  int empty_token0; /* token 0 lists only -1 */
  int nocap;        /* build with PMLA_SPARSE_NO_SPLIT_CAP */
  uint32_t kv_dtype; /* pmla_dtype of the cache; 0: bf16 */
} sparse_case;

extern const dense_case dense_cases[];
extern const int n_dense_cases;
extern const sparse_case sparse_cases[];
extern const int n_sparse_cases;

#endif
