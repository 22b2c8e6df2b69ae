/* SPDX-License-Identifier: MIT */
/* mla_cpu.c - the CPU twin of the persistent decode kernel. Each work item
 * streams its KV range in chunks of PMLA_CPU_CHUNK tokens (converted to fp32
 * once, then reused by every query row and head) with a base-2 online
 * softmax; split requests leave a normalised fp32 partial plus its lse.
 * Per chunk, like the GPU body: S = Q K^T (register tiles of 4 rows x 2
 * tokens), the softmax of each row, then O = O * corr + P V (tiles of 2
 * rows x 32 columns), so every loaded K / V vector feeds several rows. */
#include "mla_cpu.h"

#include <math.h>
#include <string.h>

#include "bf16.h"
#include "fold.h"
#include "plan_invariant.h"
#include "planner.h"

/* Inlined so the AVX2 clone of run_item vectorises them too. */
#if defined(__GNUC__)
#define PMLA_INLINE static inline __attribute__((always_inline))
#else
#define PMLA_INLINE static inline
#endif

#define LN2 0.6931471805599453f

/* The row loops run 4 rows (Q K^T) and 2 rows (P V) at a time: an item's
 * rows are padded to a multiple of 4 in scratch (zero Q, P = 0, corr = 1),
 * so any head count works and no pad row reaches the output. */
static size_t padded_rows(size_t rows) { return (rows + 3) & ~(size_t)3; }

size_t pmla_cpu_scratch_floats(int32_t num_heads, int32_t max_q_len) {
  size_t rows = padded_rows((size_t)num_heads * (size_t)max_q_len);
  /* Q, O, max, sum, corr, S/P per row; one chunk of K/V */
  return rows * (PMLA_QK_DIM + PMLA_V_DIM + 3 + PMLA_CPU_CHUNK) +
         (size_t)PMLA_CPU_CHUNK * PMLA_QK_DIM;
}

/* Global slot of position p of request r, or -1 to skip; bad indices flag. */
static int64_t kv_slot(const pmla_kv_map *m, int32_t r, int32_t p, int32_t *err) {
  int64_t slot;
  if (m->topk) {
    slot = m->topk[(int64_t)r * m->topk_stride + p];
    if (slot == -1) /* an unused top-k entry */
      return -1;
    if (slot < 0 || slot >= m->num_slots) {
      *err |= PMLA_PLAN_ERR_SLOT_INDEX;
      return -1;
    }
    return slot;
  }
  int32_t page = m->block_table
                     ? m->block_table[(int64_t)r * m->block_table_stride + p / m->page_size]
                     : m->kv_indices[m->kv_indptr[r] + p / m->page_size];
  slot = (int64_t)page * m->page_size + p % m->page_size;
  if (page < 0 || slot >= m->num_slots) {
    *err |= PMLA_PLAN_ERR_PAGE_INDEX;
    return -1;
  }
  return slot;
}

/* float8_e4m3fn (bias 7, no infinities, S.1111.111 is NaN) as float, by
 * code: a table load the vectoriser can gather, where decoding the fields
 * per element kept the loop scalar */
static const float e4m3_values[256] = {
    0x0.0p+0f, 0x1p-9f, 0x1p-8f, 0x1.800p-8f, 0x1p-7f, 0x1.400p-7f, 0x1.800p-7f, 0x1.c00p-7f,
    0x1p-6f, 0x1.200p-6f, 0x1.400p-6f, 0x1.600p-6f, 0x1.800p-6f, 0x1.a00p-6f, 0x1.c00p-6f, 0x1.e00p-6f,
    0x1p-5f, 0x1.200p-5f, 0x1.400p-5f, 0x1.600p-5f, 0x1.800p-5f, 0x1.a00p-5f, 0x1.c00p-5f, 0x1.e00p-5f,
    0x1p-4f, 0x1.200p-4f, 0x1.400p-4f, 0x1.600p-4f, 0x1.800p-4f, 0x1.a00p-4f, 0x1.c00p-4f, 0x1.e00p-4f,
    0x1p-3f, 0x1.200p-3f, 0x1.400p-3f, 0x1.600p-3f, 0x1.800p-3f, 0x1.a00p-3f, 0x1.c00p-3f, 0x1.e00p-3f,
    0x1p-2f, 0x1.200p-2f, 0x1.400p-2f, 0x1.600p-2f, 0x1.800p-2f, 0x1.a00p-2f, 0x1.c00p-2f, 0x1.e00p-2f,
    0x1p-1f, 0x1.200p-1f, 0x1.400p-1f, 0x1.600p-1f, 0x1.800p-1f, 0x1.a00p-1f, 0x1.c00p-1f, 0x1.e00p-1f,
    0x1p+0f, 0x1.200p+0f, 0x1.400p+0f, 0x1.600p+0f, 0x1.800p+0f, 0x1.a00p+0f, 0x1.c00p+0f, 0x1.e00p+0f,
    0x1p+1f, 0x1.200p+1f, 0x1.400p+1f, 0x1.600p+1f, 0x1.800p+1f, 0x1.a00p+1f, 0x1.c00p+1f, 0x1.e00p+1f,
    0x1p+2f, 0x1.200p+2f, 0x1.400p+2f, 0x1.600p+2f, 0x1.800p+2f, 0x1.a00p+2f, 0x1.c00p+2f, 0x1.e00p+2f,
    0x1p+3f, 0x1.200p+3f, 0x1.400p+3f, 0x1.600p+3f, 0x1.800p+3f, 0x1.a00p+3f, 0x1.c00p+3f, 0x1.e00p+3f,
    0x1p+4f, 0x1.200p+4f, 0x1.400p+4f, 0x1.600p+4f, 0x1.800p+4f, 0x1.a00p+4f, 0x1.c00p+4f, 0x1.e00p+4f,
    0x1p+5f, 0x1.200p+5f, 0x1.400p+5f, 0x1.600p+5f, 0x1.800p+5f, 0x1.a00p+5f, 0x1.c00p+5f, 0x1.e00p+5f,
    0x1p+6f, 0x1.200p+6f, 0x1.400p+6f, 0x1.600p+6f, 0x1.800p+6f, 0x1.a00p+6f, 0x1.c00p+6f, 0x1.e00p+6f,
    0x1p+7f, 0x1.200p+7f, 0x1.400p+7f, 0x1.600p+7f, 0x1.800p+7f, 0x1.a00p+7f, 0x1.c00p+7f, 0x1.e00p+7f,
    0x1p+8f, 0x1.200p+8f, 0x1.400p+8f, 0x1.600p+8f, 0x1.800p+8f, 0x1.a00p+8f, 0x1.c00p+8f, NAN,
    -0x0.0p+0f, -0x1p-9f, -0x1p-8f, -0x1.800p-8f, -0x1p-7f, -0x1.400p-7f, -0x1.800p-7f, -0x1.c00p-7f,
    -0x1p-6f, -0x1.200p-6f, -0x1.400p-6f, -0x1.600p-6f, -0x1.800p-6f, -0x1.a00p-6f, -0x1.c00p-6f, -0x1.e00p-6f,
    -0x1p-5f, -0x1.200p-5f, -0x1.400p-5f, -0x1.600p-5f, -0x1.800p-5f, -0x1.a00p-5f, -0x1.c00p-5f, -0x1.e00p-5f,
    -0x1p-4f, -0x1.200p-4f, -0x1.400p-4f, -0x1.600p-4f, -0x1.800p-4f, -0x1.a00p-4f, -0x1.c00p-4f, -0x1.e00p-4f,
    -0x1p-3f, -0x1.200p-3f, -0x1.400p-3f, -0x1.600p-3f, -0x1.800p-3f, -0x1.a00p-3f, -0x1.c00p-3f, -0x1.e00p-3f,
    -0x1p-2f, -0x1.200p-2f, -0x1.400p-2f, -0x1.600p-2f, -0x1.800p-2f, -0x1.a00p-2f, -0x1.c00p-2f, -0x1.e00p-2f,
    -0x1p-1f, -0x1.200p-1f, -0x1.400p-1f, -0x1.600p-1f, -0x1.800p-1f, -0x1.a00p-1f, -0x1.c00p-1f, -0x1.e00p-1f,
    -0x1p+0f, -0x1.200p+0f, -0x1.400p+0f, -0x1.600p+0f, -0x1.800p+0f, -0x1.a00p+0f, -0x1.c00p+0f, -0x1.e00p+0f,
    -0x1p+1f, -0x1.200p+1f, -0x1.400p+1f, -0x1.600p+1f, -0x1.800p+1f, -0x1.a00p+1f, -0x1.c00p+1f, -0x1.e00p+1f,
    -0x1p+2f, -0x1.200p+2f, -0x1.400p+2f, -0x1.600p+2f, -0x1.800p+2f, -0x1.a00p+2f, -0x1.c00p+2f, -0x1.e00p+2f,
    -0x1p+3f, -0x1.200p+3f, -0x1.400p+3f, -0x1.600p+3f, -0x1.800p+3f, -0x1.a00p+3f, -0x1.c00p+3f, -0x1.e00p+3f,
    -0x1p+4f, -0x1.200p+4f, -0x1.400p+4f, -0x1.600p+4f, -0x1.800p+4f, -0x1.a00p+4f, -0x1.c00p+4f, -0x1.e00p+4f,
    -0x1p+5f, -0x1.200p+5f, -0x1.400p+5f, -0x1.600p+5f, -0x1.800p+5f, -0x1.a00p+5f, -0x1.c00p+5f, -0x1.e00p+5f,
    -0x1p+6f, -0x1.200p+6f, -0x1.400p+6f, -0x1.600p+6f, -0x1.800p+6f, -0x1.a00p+6f, -0x1.c00p+6f, -0x1.e00p+6f,
    -0x1p+7f, -0x1.200p+7f, -0x1.400p+7f, -0x1.600p+7f, -0x1.800p+7f, -0x1.a00p+7f, -0x1.c00p+7f, -0x1.e00p+7f,
    -0x1p+8f, -0x1.200p+8f, -0x1.400p+8f, -0x1.600p+8f, -0x1.800p+8f, -0x1.a00p+8f, -0x1.c00p+8f, NAN,
};

static inline float e4m3_to_float(uint8_t b) { return e4m3_values[b]; }

/* Row `slot` of the cache as 576 floats, dequantised. */
static void load_kv_row(const pmla_cpu_problem *pb, int64_t slot, float *dst) {
  const uint8_t *row = (const uint8_t *)pb->kv + slot * pmla_kv_row_bytes(pb->kv_format);
  if (pb->kv_format == PMLA_KV_BF16) {
    const uint16_t *src = (const uint16_t *)(const void *)row;
    for (int d = 0; d < PMLA_QK_DIM; d++)
      dst[d] = pmla_bf16_to_float(src[d]);
  } else if (pb->kv_format == PMLA_KV_E4M3) {
    for (int d = 0; d < PMLA_QK_DIM; d++)
      dst[d] = e4m3_to_float(row[d]) * pb->kv_scale;
  } else {
    for (int t = 0; t < PMLA_V_DIM / PMLA_DS_MLA_TILE; t++) {
      float sc;
      memcpy(&sc, row + PMLA_DS_MLA_SCALES + 4 * t, sizeof sc);
      for (int d = t * PMLA_DS_MLA_TILE; d < (t + 1) * PMLA_DS_MLA_TILE; d++)
        dst[d] = e4m3_to_float(row[d]) * sc;
    }
    for (int d = PMLA_V_DIM; d < PMLA_QK_DIM; d++) {
      uint16_t h;
      memcpy(&h, row + PMLA_DS_MLA_ROPE + 2 * (d - PMLA_V_DIM), sizeof h);
      dst[d] = pmla_bf16_to_float(h);
    }
  }
}

/* 8 floats; GCC and clang split it into SSE halves where AVX is absent */
typedef float pmla_v8 __attribute__((vector_size(32)));

PMLA_INLINE pmla_v8 ld8(const float *p) {
  pmla_v8 v;
  memcpy(&v, p, sizeof v);
  return v;
}

PMLA_INLINE void st8(float *p, pmla_v8 v) { memcpy(p, &v, sizeof v); }

PMLA_INLINE float hsum8(pmla_v8 v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

/* s[r * stride + t] = q_r . k_t for 4 rows and 2 tokens over 576 dims;
 * the accumulators are named so they stay in registers */
PMLA_INLINE void qk_4x2(const float *restrict q, const float *restrict k, float *restrict s,
                        size_t stride) {
  const pmla_v8 z = {0};
  pmla_v8 a00 = z, a01 = z, a10 = z, a11 = z, a20 = z, a21 = z, a30 = z, a31 = z;
  const float *q0 = q, *q1 = q + PMLA_QK_DIM, *q2 = q + 2 * PMLA_QK_DIM, *q3 = q + 3 * PMLA_QK_DIM;
  const float *k0 = k, *k1 = k + PMLA_QK_DIM;
  for (int d = 0; d < PMLA_QK_DIM; d += 8) {
    const pmla_v8 x0 = ld8(k0 + d), x1 = ld8(k1 + d);
    pmla_v8 y = ld8(q0 + d);
    a00 += y * x0;
    a01 += y * x1;
    y = ld8(q1 + d);
    a10 += y * x0;
    a11 += y * x1;
    y = ld8(q2 + d);
    a20 += y * x0;
    a21 += y * x1;
    y = ld8(q3 + d);
    a30 += y * x0;
    a31 += y * x1;
  }
  s[0] = hsum8(a00);
  s[1] = hsum8(a01);
  s[stride] = hsum8(a10);
  s[stride + 1] = hsum8(a11);
  s[2 * stride] = hsum8(a20);
  s[2 * stride + 1] = hsum8(a21);
  s[3 * stride] = hsum8(a30);
  s[3 * stride + 1] = hsum8(a31);
}

/* o_r = o_r * c_r + sum_t p_r[t] v_t for two rows, 32 columns at a time;
 * v_t is row t of the chunk (pitch 576, the first 512 dims are V). The
 * chunk's sum starts from zero and meets O once, so O takes one rounding a
 * chunk rather than one a token (the GPU adds a 64-token block's P V at a
 * time): token by token, a long item of near-uniform weights drifted (a
 * 2^20-token request by ~2%). */
PMLA_INLINE void pv_2rows(float *restrict o0, float *restrict o1, float c0, float c1,
                          const float *restrict p0, const float *restrict p1,
                          const float *restrict v, int32_t n) {
  for (int d = 0; d < PMLA_V_DIM; d += 32) {
    const pmla_v8 zero = {0};
    pmla_v8 a0 = zero, a1 = zero, a2 = zero, a3 = zero;
    pmla_v8 b0 = zero, b1 = zero, b2 = zero, b3 = zero;
    const float *vt = v + d;
    for (int32_t t = 0; t < n; t++, vt += PMLA_QK_DIM) {
      const float w0 = p0[t], w1 = p1[t];
      pmla_v8 x = ld8(vt);
      a0 += w0 * x;
      b0 += w1 * x;
      x = ld8(vt + 8);
      a1 += w0 * x;
      b1 += w1 * x;
      x = ld8(vt + 16);
      a2 += w0 * x;
      b2 += w1 * x;
      x = ld8(vt + 24);
      a3 += w0 * x;
      b3 += w1 * x;
    }
    st8(o0 + d, ld8(o0 + d) * c0 + a0);
    st8(o0 + d + 8, ld8(o0 + d + 8) * c0 + a1);
    st8(o0 + d + 16, ld8(o0 + d + 16) * c0 + a2);
    st8(o0 + d + 24, ld8(o0 + d + 24) * c0 + a3);
    st8(o1 + d, ld8(o1 + d) * c1 + b0);
    st8(o1 + d + 8, ld8(o1 + d + 8) * c1 + b1);
    st8(o1 + d + 16, ld8(o1 + d + 16) * c1 + b2);
    st8(o1 + d + 24, ld8(o1 + d + 24) * c1 + b3);
  }
}

/* x86-64 hosts get an AVX2+FMA clone of the hot loop picked at load time;
 * everything else (and older CPUs) the baseline build. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PMLA_HOT __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define PMLA_HOT
#endif

PMLA_HOT static void run_item(const pmla_cpu_problem *pb, const int32_t *w, float *scratch,
                     int32_t *err) {
  const int32_t H = pb->num_heads;
  const int32_t r = w[PMLA_WI_REQUEST], slot = w[PMLA_WI_PARTIAL];
  const int32_t qb = w[PMLA_WI_Q_BEGIN], qe = w[PMLA_WI_Q_END];
  const int32_t kb = w[PMLA_WI_KV_BEGIN], ke = w[PMLA_WI_KV_END], len = w[PMLA_WI_KV_LEN];
  const int32_t qlen = qe - qb, rows = qlen * H;
  if (qlen <= 0)
    return;
  if (qe > pb->num_tokens) {
    *err |= PMLA_PLAN_ERR_QO_INDPTR;
    return;
  }
  const int32_t prows = (int32_t)padded_rows((size_t)rows);
  float *qf = scratch;
  float *acc = qf + (size_t)prows * PMLA_QK_DIM;
  float *mx = acc + (size_t)prows * PMLA_V_DIM;
  float *sum = mx + prows;
  float *corr = sum + prows;
  float *score = corr + prows; /* S, then P: [prows][PMLA_CPU_CHUNK] */
  float *kf = score + (size_t)prows * PMLA_CPU_CHUNK;
  const float qscale = pb->softmax_scale * PMLA_LOG2E;

  for (int32_t i = 0; i < prows; i++) {
    float *dst = qf + (size_t)i * PMLA_QK_DIM;
    if (i < rows) {
      const uint16_t *src = pb->q + ((size_t)qb * H + i) * PMLA_QK_DIM;
      for (int d = 0; d < PMLA_QK_DIM; d++)
        dst[d] = pmla_bf16_to_float(src[d]) * qscale;
    } else {
      memset(dst, 0, sizeof(float) * PMLA_QK_DIM);
    }
    mx[i] = -INFINITY;
    sum[i] = 0.f;
  }
  memset(acc, 0, sizeof(float) * (size_t)prows * PMLA_V_DIM);

  for (int32_t p0 = kb; p0 < ke; p0 += PMLA_CPU_CHUNK) {
    const int32_t n = ke - p0 < PMLA_CPU_CHUNK ? ke - p0 : PMLA_CPU_CHUNK;
    const int32_t n2 = (n + 1) & ~1; /* QK runs on token pairs */
    int valid[PMLA_CPU_CHUNK];
    for (int32_t t = 0; t < n2; t++) {
      int64_t s = t < n ? kv_slot(&pb->map, r, p0 + t, err) : -1;
      valid[t] = s >= 0;
      float *dst = kf + (size_t)t * PMLA_QK_DIM;
      if (valid[t]) {
        load_kv_row(pb, s, dst);
      } else {
        memset(dst, 0, sizeof(float) * PMLA_QK_DIM); /* never read NaN slots */
      }
    }
    for (int32_t i = 0; i < prows; i += 4)
      for (int32_t t = 0; t < n2; t += 2)
        qk_4x2(qf + (size_t)i * PMLA_QK_DIM, kf + (size_t)t * PMLA_QK_DIM,
               score + (size_t)i * PMLA_CPU_CHUNK + t, PMLA_CPU_CHUNK);
    int any = 0;
    for (int32_t i = 0; i < rows; i++) {
      /* causal inside the step: query j of qlen sees len - qlen + 1 + j */
      const int32_t limit = len - qlen + 1 + i / H;
      const int32_t visible = limit - p0 < n ? limit - p0 : n;
      float *pr = score + (size_t)i * PMLA_CPU_CHUNK;
      float chunk_max = -INFINITY;
      int nan = 0;
      for (int32_t t = 0; t < n; t++) {
        if (!(t < visible && valid[t]))
          pr[t] = -INFINITY;
        nan |= pr[t] != pr[t];
        chunk_max = pr[t] > chunk_max ? pr[t] : chunk_max;
      }
      if (nan) /* a NaN score makes the row NaN (sum, then out and lse), split or not */
        sum[i] = NAN;
      if (chunk_max == -INFINITY) { /* nothing visible: O unchanged */
        corr[i] = 1.f;
        for (int32_t t = 0; t < n; t++)
          pr[t] = 0.f;
        continue;
      }
      any = 1;
      const float m_new = chunk_max > mx[i] ? chunk_max : mx[i];
      corr[i] = exp2f(mx[i] - m_new);
      mx[i] = m_new;
      float add = 0.f;
      for (int32_t t = 0; t < n; t++) {
        pr[t] = exp2f(pr[t] - m_new);
        add += pr[t];
      }
      sum[i] = sum[i] * corr[i] + add;
    }
    if (!any)
      continue;
    for (int32_t i = rows; i < prows; i++) { /* pad rows: O stays 0 */
      corr[i] = 1.f;
      memset(score + (size_t)i * PMLA_CPU_CHUNK, 0, sizeof(float) * (size_t)n);
    }
    for (int32_t i = 0; i < prows; i += 2)
      pv_2rows(acc + (size_t)i * PMLA_V_DIM, acc + (size_t)(i + 1) * PMLA_V_DIM, corr[i],
               corr[i + 1], score + (size_t)i * PMLA_CPU_CHUNK,
               score + (size_t)(i + 1) * PMLA_CPU_CHUNK, kf, n);
  }

  const int32_t flags = w[PMLA_WI_PIECE];
  for (int32_t i = 0; i < rows; i++) {
    float *o = acc + (size_t)i * PMLA_V_DIM;
    float inv = pmla_sum_scale(1.f, sum[i]);
    float lse = pmla_sum_lse(sum[i], pmla_fold_lse(mx[i] + log2f(sum[i]), LN2));
    if (pb->fold && (flags & PMLA_WI_FOLD)) {
      /* this chunk into the accumulator in `slot`, as the reduce folds */
      size_t base = (size_t)slot * pb->max_q_len * H + i;
      float *a = pb->partial_out + base * PMLA_V_DIM;
      const pmla_fold_w fw = pmla_fold_weights(pb->partial_lse[base], lse);
      if (flags & PMLA_WI_FINAL) {
        uint16_t *dst = pb->out + ((size_t)qb * H + i) * PMLA_V_DIM;
        for (int d = 0; d < PMLA_V_DIM; d++)
          dst[d] = pmla_float_to_bf16(pmla_fold(a[d], o[d] * inv, fw));
        if (pb->lse)
          pb->lse[(size_t)qb * H + i] = fw.lse;
      } else {
        for (int d = 0; d < PMLA_V_DIM; d++)
          a[d] = pmla_fold(a[d], o[d] * inv, fw);
        pb->partial_lse[base] = fw.lse;
      }
    } else if (slot < 0) {
      uint16_t *dst = pb->out + ((size_t)qb * H + i) * PMLA_V_DIM;
      for (int d = 0; d < PMLA_V_DIM; d++)
        dst[d] = pmla_float_to_bf16(o[d] * inv);
      if (pb->lse)
        pb->lse[(size_t)qb * H + i] = lse;
    } else {
      size_t base = (size_t)slot * pb->max_q_len * H + i;
      float *dst = pb->partial_out + base * PMLA_V_DIM;
      for (int d = 0; d < PMLA_V_DIM; d++)
        dst[d] = o[d] * inv;
      pb->partial_lse[base] = lse;
    }
  }
}

int32_t pmla_cpu_run_items(const pmla_cpu_problem *pb, const int32_t *work_info_set,
                           int32_t begin, int32_t end, float *scratch) {
  int32_t err = 0;
  for (int32_t k = begin; k < end; k++)
    run_item(pb, work_info_set + (size_t)k * PMLA_WI_WORDS, scratch, &err);
  return err;
}

static void axpy512(float *restrict y, float a, const float *restrict x) {
  for (int i = 0; i < PMLA_V_DIM; i++)
    y[i] += a * x[i];
}

void pmla_cpu_reduce(const pmla_cpu_problem *pb, const int32_t *reduce_indptr,
                     const int32_t *reduce_final_map, const int32_t *reduce_partial_map,
                     int32_t first, int32_t stride, int32_t count) {
  const int32_t H = pb->num_heads;
  for (int32_t k = first; k < count; k += stride) {
    int32_t r = reduce_final_map[k];
    int32_t qb = pb->qo_indptr ? pb->qo_indptr[r] : r;
    int32_t qe = pb->qo_indptr ? pb->qo_indptr[r + 1] : r + 1;
    int32_t p0 = reduce_indptr[k], p1 = reduce_indptr[k + 1];
    if (pb->fold) { /* the left fold of the pieces, as the decode items fold */
      for (int32_t i = 0; i < (qe - qb) * H; i++) {
        float o[PMLA_V_DIM];
        size_t base = (size_t)reduce_partial_map[p0] * pb->max_q_len * H + i;
        memcpy(o, pb->partial_out + base * PMLA_V_DIM, sizeof o);
        float lse = pb->partial_lse[base];
        for (int32_t p = p0 + 1; p < p1; p++) {
          base = (size_t)reduce_partial_map[p] * pb->max_q_len * H + i;
          const pmla_fold_w fw = pmla_fold_weights(lse, pb->partial_lse[base]);
          const float *c = pb->partial_out + base * PMLA_V_DIM;
          for (int d = 0; d < PMLA_V_DIM; d++)
            o[d] = pmla_fold(o[d], c[d], fw);
          lse = fw.lse;
        }
        uint16_t *dst = pb->out + ((size_t)qb * H + i) * PMLA_V_DIM;
        for (int d = 0; d < PMLA_V_DIM; d++)
          dst[d] = pmla_float_to_bf16(o[d]);
        if (pb->lse)
          pb->lse[(size_t)qb * H + i] = lse;
      }
      continue;
    }
    for (int32_t i = 0; i < (qe - qb) * H; i++) {
      float best = -INFINITY;
      int nan = 0; /* a piece's NaN lse (a NaN score) makes the row NaN */
      for (int32_t p = p0; p < p1; p++) {
        float l = pb->partial_lse[(size_t)reduce_partial_map[p] * pb->max_q_len * H + i];
        nan |= l != l;
        best = l > best ? l : best;
      }
      float o[PMLA_V_DIM] = {0};
      float total = 0.f;
      if (best != -INFINITY) {
        for (int32_t p = p0; p < p1; p++) {
          size_t base = (size_t)reduce_partial_map[p] * pb->max_q_len * H + i;
          float l = pb->partial_lse[base];
          if (l == -INFINITY || l != l)
            continue;
          float wgt = expf(l - best);
          total += wgt;
          axpy512(o, wgt, pb->partial_out + base * PMLA_V_DIM);
        }
      }
      if (nan)
        total = NAN;
      float inv = pmla_sum_scale(1.f, total);
      uint16_t *dst = pb->out + ((size_t)qb * H + i) * PMLA_V_DIM;
      for (int d = 0; d < PMLA_V_DIM; d++)
        dst[d] = pmla_float_to_bf16(o[d] * inv);
      if (pb->lse)
        pb->lse[(size_t)qb * H + i] = pmla_sum_lse(total, best + logf(total));
    }
  }
}
