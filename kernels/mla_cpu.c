/* mla_cpu.c - the CPU twin of the persistent decode kernel. Each work item
 * streams its KV range in chunks of PMLA_CPU_CHUNK tokens (converted to fp32
 * once, then reused by every query row and head) with a base-2 online
 * softmax; split requests leave a normalised fp32 partial plus its lse. */
#include "mla_cpu.h"

#include <math.h>
#include <string.h>

#include "bf16.h"
#include "planner.h"

/* Inlined so the AVX2 clone of run_item vectorises them too. */
#if defined(__GNUC__)
#define PMLA_INLINE static inline __attribute__((always_inline))
#else
#define PMLA_INLINE static inline
#endif

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

size_t pmla_cpu_scratch_floats(int32_t num_heads, int32_t max_q_len) {
  size_t rows = (size_t)num_heads * (size_t)max_q_len;
  return rows * (PMLA_QK_DIM + PMLA_V_DIM + 2) + (size_t)PMLA_CPU_CHUNK * (PMLA_QK_DIM + 1);
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

PMLA_INLINE float dot576(const float *restrict a, const float *restrict b) {
  float acc[16] = {0};
  for (int i = 0; i < PMLA_QK_DIM; i += 16)
    for (int j = 0; j < 16; j++)
      acc[j] += a[i + j] * b[i + j];
  float s = 0;
  for (int j = 0; j < 16; j++)
    s += acc[j];
  return s;
}

PMLA_INLINE void axpy512(float *restrict y, float a, const float *restrict x) {
  for (int i = 0; i < PMLA_V_DIM; i++)
    y[i] += a * x[i];
}

PMLA_INLINE void scale512(float *restrict y, float a) {
  for (int i = 0; i < PMLA_V_DIM; i++)
    y[i] *= a;
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
  float *qf = scratch;
  float *acc = qf + (size_t)rows * PMLA_QK_DIM;
  float *mx = acc + (size_t)rows * PMLA_V_DIM;
  float *sum = mx + rows;
  float *kf = sum + rows;
  float *score = kf + PMLA_CPU_CHUNK * PMLA_QK_DIM;
  const float qscale = pb->softmax_scale * LOG2E;

  for (int32_t i = 0; i < rows; i++) {
    const uint16_t *src = pb->q + ((size_t)qb * H + i) * PMLA_QK_DIM;
    for (int d = 0; d < PMLA_QK_DIM; d++)
      qf[(size_t)i * PMLA_QK_DIM + d] = pmla_bf16_to_float(src[d]) * qscale;
    mx[i] = -INFINITY;
    sum[i] = 0.f;
  }
  memset(acc, 0, sizeof(float) * (size_t)rows * PMLA_V_DIM);

  for (int32_t p0 = kb; p0 < ke; p0 += PMLA_CPU_CHUNK) {
    int32_t n = ke - p0 < PMLA_CPU_CHUNK ? ke - p0 : PMLA_CPU_CHUNK;
    int valid[PMLA_CPU_CHUNK];
    for (int32_t t = 0; t < n; t++) {
      int64_t s = kv_slot(&pb->map, r, p0 + t, err);
      valid[t] = s >= 0;
      if (valid[t]) {
        const uint16_t *src = pb->kv + (size_t)s * PMLA_QK_DIM;
        for (int d = 0; d < PMLA_QK_DIM; d++)
          kf[t * PMLA_QK_DIM + d] = pmla_bf16_to_float(src[d]);
      }
    }
    for (int32_t j = 0; j < qlen; j++) {
      /* causal inside the step: query j of qlen sees len - qlen + 1 + j */
      int32_t limit = len - qlen + 1 + j;
      int32_t visible = limit - p0 < n ? limit - p0 : n;
      if (visible <= 0)
        continue;
      for (int32_t h = 0; h < H; h++) {
        int32_t i = j * H + h;
        float chunk_max = -INFINITY;
        for (int32_t t = 0; t < visible; t++) {
          score[t] = valid[t] ? dot576(qf + (size_t)i * PMLA_QK_DIM, kf + t * PMLA_QK_DIM)
                              : -INFINITY;
          chunk_max = score[t] > chunk_max ? score[t] : chunk_max;
        }
        if (chunk_max == -INFINITY)
          continue;
        float m_new = chunk_max > mx[i] ? chunk_max : mx[i];
        float *o = acc + (size_t)i * PMLA_V_DIM;
        if (m_new != mx[i]) {
          float corr = exp2f(mx[i] - m_new);
          sum[i] *= corr;
          scale512(o, corr);
          mx[i] = m_new;
        }
        for (int32_t t = 0; t < visible; t++) {
          if (!valid[t])
            continue;
          float pr = exp2f(score[t] - m_new);
          sum[i] += pr;
          axpy512(o, pr, kf + t * PMLA_QK_DIM);
        }
      }
    }
  }

  for (int32_t i = 0; i < rows; i++) {
    float *o = acc + (size_t)i * PMLA_V_DIM;
    float inv = sum[i] > 0.f ? 1.f / sum[i] : 0.f;
    float lse = sum[i] > 0.f ? (mx[i] + log2f(sum[i])) * LN2 : -INFINITY;
    if (slot < 0) {
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

void pmla_cpu_reduce(const pmla_cpu_problem *pb, const int32_t *reduce_indptr,
                     const int32_t *reduce_final_map, const int32_t *reduce_partial_map,
                     int32_t first, int32_t stride, int32_t count) {
  const int32_t H = pb->num_heads;
  for (int32_t k = first; k < count; k += stride) {
    int32_t r = reduce_final_map[k];
    int32_t qb = pb->qo_indptr ? pb->qo_indptr[r] : r;
    int32_t qe = pb->qo_indptr ? pb->qo_indptr[r + 1] : r + 1;
    int32_t p0 = reduce_indptr[k], p1 = reduce_indptr[k + 1];
    for (int32_t i = 0; i < (qe - qb) * H; i++) {
      float best = -INFINITY;
      for (int32_t p = p0; p < p1; p++) {
        float l = pb->partial_lse[(size_t)reduce_partial_map[p] * pb->max_q_len * H + i];
        best = l > best ? l : best;
      }
      float o[PMLA_V_DIM] = {0};
      float total = 0.f;
      if (best != -INFINITY) {
        for (int32_t p = p0; p < p1; p++) {
          size_t base = (size_t)reduce_partial_map[p] * pb->max_q_len * H + i;
          float l = pb->partial_lse[base];
          if (l == -INFINITY)
            continue;
          float wgt = expf(l - best);
          total += wgt;
          axpy512(o, wgt, pb->partial_out + base * PMLA_V_DIM);
        }
      }
      float inv = total > 0.f ? 1.f / total : 0.f;
      uint16_t *dst = pb->out + ((size_t)qb * H + i) * PMLA_V_DIM;
      for (int d = 0; d < PMLA_V_DIM; d++)
        dst[d] = pmla_float_to_bf16(o[d] * inv);
      if (pb->lse)
        pb->lse[(size_t)qb * H + i] = total > 0.f ? best + logf(total) : -INFINITY;
    }
  }
}
