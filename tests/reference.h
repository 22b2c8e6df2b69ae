/* SPDX-License-Identifier: MIT */
/* reference.h - an independent double-precision MLA decode reference for the
 * conformance suite. It shares no code with the plugin or kernels/.
 *
 * Model: every query token t attends a list of KV slots (a slot is one row of
 * the KV cache viewed as [num_slots, 576], slot = page * page_size + offset).
 *   score(t, h, s) = softmax_scale * dot(q[t][h][0:576], kv[s][0:576])
 *   out[t][h]      = sum_s softmax(score)_s * kv[s][0:512]
 *   lse[t][h]      = log(sum_s exp(score))          (natural log)
 * A token with an empty list gets out = 0 and lse = -inf. A slot listed twice
 * counts twice; -1 entries are skipped.
 *
 * Dense lists come from a block table or CSR page list plus kv_len, with
 * causal MTP masking: query row j (0-based) of a request with q_len rows and
 * KV length L sees positions [0, L - q_len + 1 + j) (empty when <= 0).
 */
#ifndef PMLA_TEST_REFERENCE_H
#define PMLA_TEST_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

#define REF_LATENT 512
#define REF_ROPE 64
#define REF_HEAD_DIM 576

/* bf16 helpers, round to nearest even; NaN stays NaN. */
float ref_bf16_to_float(uint16_t h);
uint16_t ref_float_to_bf16(float f);
#define REF_BF16_NAN ((uint16_t)0x7fc0)

/* Per-token KV slot lists: token t attends slots[indptr[t] .. indptr[t+1]). */
typedef struct ref_slot_lists {
  int64_t tokens;
  int64_t *indptr; /* [tokens + 1] */
  int64_t *slots;  /* -1 entries are skipped by ref_mla_decode */
} ref_slot_lists;

void ref_slot_lists_free(ref_slot_lists *lists);

/* Dense, block-table layout: block_table [batch, max_pages], kv_lens [batch],
 * qo_indptr [batch + 1]. Returns 0 on success, -1 on inconsistent input. */
int ref_slots_from_block_table(int32_t batch, const int32_t *qo_indptr,
                               const int32_t *block_table, int32_t max_pages,
                               const int32_t *kv_lens, int32_t page_size,
                               ref_slot_lists *lists);

/* Dense, CSR layout: kv_indptr [batch + 1] into kv_indices, kv_last_page_len
 * [batch]; a request with no pages has length 0. */
int ref_slots_from_csr(int32_t batch, const int32_t *qo_indptr, const int32_t *kv_indptr,
                       const int32_t *kv_indices, const int32_t *kv_last_page_len,
                       int32_t page_size, ref_slot_lists *lists);

/* Sparse: topk_indices [tokens, topk], listed as given (-1 kept, skipped later). */
int ref_slots_from_topk(int64_t tokens, int64_t topk, const int32_t *topk_indices,
                        ref_slot_lists *lists);

/* How the KV cache is stored (pmla.h's kv_dtype values). */
#define REF_KV_BF16 1       /* 576 bf16 per slot (ref_problem.kv) */
#define REF_KV_FP8_E4M3 2   /* 576 e4m3 per slot, times kv_scale */
#define REF_KV_FP8_DS_MLA 3 /* 512 e4m3 in 4 tiles, 4 fp32 tile scales, 64 bf16 */

/* float8_e4m3fn byte as a double (NaN for S.1111.111) */
double ref_e4m3_to_double(uint8_t b);

typedef struct ref_problem {
  int64_t tokens;
  int64_t heads;
  const uint16_t *q;  /* bf16 [tokens, heads, 576] */
  const uint16_t *kv; /* bf16 [num_slots, 576] (kv_format 0 or REF_KV_BF16) */
  int64_t num_slots;
  const ref_slot_lists *lists;
  double softmax_scale;
  /* FP8 caches: kv_format REF_KV_FP8_*, the cache's bytes, and (E4M3) its
   * scale; every value is dequantised exactly in double */
  int kv_format;
  const uint8_t *kv_bytes;
  double kv_scale;
} ref_problem;

/* out: [tokens, heads, 512]; lse: [tokens, heads] (may be NULL).
 * Returns 0, or -1 when a listed slot is outside [0, num_slots). */
int ref_mla_decode(const ref_problem *problem, double *out, double *lse);

/* Tolerance (bf16 rounding): per element |got - ref| <= 2/128 * |ref| +
 * 2^-8, and over the whole output the cosine similarity >= 1 - 1e-5 (the
 * check FlashMLA's tests make). lse: |got - ref| <= 1e-3, or both -inf.
 * The absolute term is 2^-8, not 1e-3: tensor-core kernels (FlashMLA, pmla
 * on GPUs) feed the softmax weights P to the PV product as bf16, a 2^-9
 * relative error per weight; over a short KV range (a few tokens, weights
 * near 1) against test values |V| <= 1 that reaches ~3e-3 in a few of ~10^5
 * elements (measured on the H200), while the cosine stays > 1 - 2e-6. */
#define REF_REL_TOL (2.0 / 128.0)
#define REF_ABS_TOL (1.0 / 256.0)
#define REF_COS_TOL 1e-5
#define REF_LSE_TOL 1e-3

typedef struct ref_report {
  int ok;
  size_t bad_count;
  size_t first_bad;   /* element index of the first failure, when any */
  double first_got, first_ref;
  double max_abs_err; /* over finite pairs */
  double cosine;
  char message[256];
} ref_report;

/* Compares n outputs (got as float, e.g. from bf16). */
ref_report ref_check_output(const double *ref, const float *got, size_t n);
/* Compares n lse values. */
ref_report ref_check_lse(const double *ref, const float *got, size_t n);

#endif
