/* SPDX-License-Identifier: MIT */
/* reference.c - double-precision MLA decode reference (see reference.h). */
#include "reference.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

float ref_bf16_to_float(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t ref_float_to_bf16(float f) {
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  if (isnan(f))
    return (uint16_t)((bits >> 16) | 0x0040u); /* quiet NaN, sign kept */
  uint32_t lsb = (bits >> 16) & 1u;
  uint32_t rounded = bits + 0x7fffu + lsb; /* ties to even; inf stays inf */
  return (uint16_t)(rounded >> 16);
}

void ref_slot_lists_free(ref_slot_lists *lists) {
  if (!lists)
    return;
  free(lists->indptr);
  free(lists->slots);
  lists->indptr = NULL;
  lists->slots = NULL;
  lists->tokens = 0;
}

static int alloc_lists(ref_slot_lists *lists, int64_t tokens, int64_t nnz) {
  lists->tokens = tokens;
  lists->indptr = calloc((size_t)tokens + 1, sizeof *lists->indptr);
  lists->slots = calloc(nnz > 0 ? (size_t)nnz : 1, sizeof *lists->slots);
  if (!lists->indptr || !lists->slots) {
    ref_slot_lists_free(lists);
    return -1;
  }
  return 0;
}

/* Visible positions of query row j of a request with q_len rows, KV length L. */
static int64_t causal_visible(int64_t L, int64_t q_len, int64_t j) {
  int64_t v = L - q_len + 1 + j;
  if (v < 0)
    v = 0;
  if (v > L)
    v = L;
  return v;
}

/* Shared builder: page_of(r, p) gives the page id of the p-th page of request r. */
typedef int32_t (*page_fn)(const void *ctx, int32_t r, int64_t p);

static int build_dense(int32_t batch, const int32_t *qo_indptr, const int32_t *lens,
                       int32_t page_size, page_fn page_of, const void *ctx,
                       ref_slot_lists *lists) {
  if (batch < 0 || page_size < 1 || qo_indptr[0] != 0)
    return -1;
  int64_t tokens = qo_indptr[batch], nnz = 0;
  for (int32_t r = 0; r < batch; r++) {
    int64_t ql = qo_indptr[r + 1] - qo_indptr[r];
    if (ql < 0 || lens[r] < 0)
      return -1;
    for (int64_t j = 0; j < ql; j++)
      nnz += causal_visible(lens[r], ql, j);
  }
  if (alloc_lists(lists, tokens, nnz))
    return -1;
  int64_t at = 0;
  for (int32_t r = 0; r < batch; r++) {
    int64_t ql = qo_indptr[r + 1] - qo_indptr[r];
    for (int64_t j = 0; j < ql; j++) {
      int64_t t = qo_indptr[r] + j, vis = causal_visible(lens[r], ql, j);
      lists->indptr[t] = at;
      for (int64_t pos = 0; pos < vis; pos++)
        lists->slots[at++] =
            (int64_t)page_of(ctx, r, pos / page_size) * page_size + pos % page_size;
      lists->indptr[t + 1] = at;
    }
  }
  return 0;
}

typedef struct bt_ctx {
  const int32_t *table;
  int32_t max_pages;
} bt_ctx;

static int32_t bt_page(const void *ctx, int32_t r, int64_t p) {
  const bt_ctx *c = ctx;
  return c->table[(int64_t)r * c->max_pages + p];
}

int ref_slots_from_block_table(int32_t batch, const int32_t *qo_indptr,
                               const int32_t *block_table, int32_t max_pages,
                               const int32_t *kv_lens, int32_t page_size,
                               ref_slot_lists *lists) {
  for (int32_t r = 0; r < batch; r++)
    if (kv_lens[r] < 0 || (int64_t)kv_lens[r] > (int64_t)max_pages * page_size)
      return -1;
  bt_ctx c = {block_table, max_pages};
  return build_dense(batch, qo_indptr, kv_lens, page_size, bt_page, &c, lists);
}

typedef struct csr_ctx {
  const int32_t *indptr, *indices;
} csr_ctx;

static int32_t csr_page(const void *ctx, int32_t r, int64_t p) {
  const csr_ctx *c = ctx;
  return c->indices[c->indptr[r] + p];
}

int ref_slots_from_csr(int32_t batch, const int32_t *qo_indptr, const int32_t *kv_indptr,
                       const int32_t *kv_indices, const int32_t *kv_last_page_len,
                       int32_t page_size, ref_slot_lists *lists) {
  int32_t *lens = calloc(batch > 0 ? (size_t)batch : 1, sizeof *lens);
  if (!lens)
    return -1;
  for (int32_t r = 0; r < batch; r++) {
    int32_t pages = kv_indptr[r + 1] - kv_indptr[r];
    if (pages < 0) {
      free(lens);
      return -1;
    }
    if (pages == 0) {
      lens[r] = 0;
      continue;
    }
    if (kv_last_page_len[r] < 1 || kv_last_page_len[r] > page_size) {
      free(lens);
      return -1;
    }
    lens[r] = (pages - 1) * page_size + kv_last_page_len[r];
  }
  csr_ctx c = {kv_indptr, kv_indices};
  int rc = build_dense(batch, qo_indptr, lens, page_size, csr_page, &c, lists);
  free(lens);
  return rc;
}

int ref_slots_from_topk(int64_t tokens, int64_t topk, const int32_t *topk_indices,
                        ref_slot_lists *lists) {
  if (tokens < 0 || topk < 0 || alloc_lists(lists, tokens, tokens * topk))
    return -1;
  for (int64_t t = 0; t < tokens; t++) {
    lists->indptr[t] = t * topk;
    for (int64_t k = 0; k < topk; k++)
      lists->slots[t * topk + k] = topk_indices[t * topk + k];
  }
  lists->indptr[tokens] = tokens * topk;
  return 0;
}

double ref_e4m3_to_double(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  if ((b & 0x7f) == 0x7f)
    return NAN;
  /* normal: (1 + m/8) 2^(e-7); subnormal (e = 0): (m/8) 2^-6 */
  double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
  return (b & 0x80) ? -v : v;
}

/* slot's 576 values, dequantised */
static void kv_row(const ref_problem *p, int64_t slot, double *row) {
  if (p->kv_format == REF_KV_FP8_E4M3) {
    const uint8_t *r = p->kv_bytes + slot * REF_HEAD_DIM;
    for (int d = 0; d < REF_HEAD_DIM; d++)
      row[d] = ref_e4m3_to_double(r[d]) * p->kv_scale;
  } else if (p->kv_format == REF_KV_FP8_DS_MLA) {
    const uint8_t *r = p->kv_bytes + slot * 656;
    for (int d = 0; d < REF_LATENT; d++) {
      float sc;
      memcpy(&sc, r + 512 + 4 * (d / 128), sizeof sc);
      row[d] = ref_e4m3_to_double(r[d]) * (double)sc;
    }
    for (int d = 0; d < REF_ROPE; d++) {
      uint16_t h;
      memcpy(&h, r + 528 + 2 * d, sizeof h);
      row[REF_LATENT + d] = ref_bf16_to_float(h);
    }
  } else {
    const uint16_t *k = p->kv + slot * REF_HEAD_DIM;
    for (int d = 0; d < REF_HEAD_DIM; d++)
      row[d] = ref_bf16_to_float(k[d]);
  }
}

int ref_mla_decode(const ref_problem *p, double *out, double *lse) {
  const int64_t D = REF_HEAD_DIM, V = REF_LATENT;
  const ref_slot_lists *L = p->lists;
  int64_t max_n = 0;
  for (int64_t t = 0; t < p->tokens; t++) {
    int64_t n = L->indptr[t + 1] - L->indptr[t];
    if (n > max_n)
      max_n = n;
    for (int64_t i = L->indptr[t]; i < L->indptr[t + 1]; i++)
      if (L->slots[i] < -1 || L->slots[i] >= p->num_slots)
        return -1;
  }
  const size_t rows = (size_t)(max_n > 0 ? max_n : 1);
  double *qd = malloc(sizeof(double) * (size_t)D);
  double *scores = malloc(sizeof(double) * rows);
  double *acc = malloc(sizeof(double) * (size_t)V);
  double *k = malloc(sizeof(double) * (size_t)D * rows); /* the token's rows, dequantised */
  if (!qd || !scores || !acc || !k) {
    free(qd);
    free(scores);
    free(acc);
    free(k);
    return -1;
  }
  for (int64_t t = 0; t < p->tokens; t++) {
    const int64_t *slots = L->slots + L->indptr[t];
    int64_t n = L->indptr[t + 1] - L->indptr[t];
    for (int64_t i = 0; i < n; i++)
      if (slots[i] >= 0)
        kv_row(p, slots[i], k + i * D);
    for (int64_t h = 0; h < p->heads; h++) {
      const uint16_t *qrow = p->q + (t * p->heads + h) * D;
      for (int64_t d = 0; d < D; d++)
        qd[d] = ref_bf16_to_float(qrow[d]);
      double mx = -INFINITY;
      int64_t used = 0;
      for (int64_t i = 0; i < n; i++) {
        if (slots[i] < 0) {
          scores[i] = -INFINITY;
          continue;
        }
        const double *kr = k + i * D;
        double s = 0.0;
        for (int64_t d = 0; d < D; d++)
          s += qd[d] * kr[d];
        s *= p->softmax_scale;
        scores[i] = s;
        if (s > mx)
          mx = s;
        used++;
      }
      double *o = out + (t * p->heads + h) * V;
      if (used == 0) {
        for (int64_t d = 0; d < V; d++)
          o[d] = 0.0;
        if (lse)
          lse[t * p->heads + h] = -INFINITY;
        continue;
      }
      double sum = 0.0;
      for (int64_t d = 0; d < V; d++)
        acc[d] = 0.0;
      for (int64_t i = 0; i < n; i++) {
        if (slots[i] < 0)
          continue;
        double w = exp(scores[i] - mx);
        sum += w;
        const double *kr = k + i * D;
        for (int64_t d = 0; d < V; d++)
          acc[d] += w * kr[d];
      }
      for (int64_t d = 0; d < V; d++)
        o[d] = acc[d] / sum;
      if (lse)
        lse[t * p->heads + h] = mx + log(sum);
    }
  }
  free(qd);
  free(scores);
  free(acc);
  free(k);
  return 0;
}

ref_report ref_check_output(const double *ref, const float *got, size_t n) {
  ref_report r;
  memset(&r, 0, sizeof r);
  double dot = 0, nr = 0, ng = 0;
  for (size_t i = 0; i < n; i++) {
    double g = got[i], e = ref[i];
    double err = fabs(g - e);
    int bad = !isfinite(g) || !(err <= REF_REL_TOL * fabs(e) + REF_ABS_TOL);
    if (isfinite(g) && err > r.max_abs_err)
      r.max_abs_err = err;
    if (bad) {
      if (r.bad_count == 0) {
        r.first_bad = i;
        r.first_got = g;
        r.first_ref = e;
      }
      r.bad_count++;
    }
    if (isfinite(g)) {
      dot += g * e;
      ng += g * g;
    }
    nr += e * e;
  }
  if (nr == 0.0 && ng == 0.0)
    r.cosine = 1.0;
  else if (nr == 0.0 || ng == 0.0)
    r.cosine = 0.0;
  else
    r.cosine = dot / (sqrt(nr) * sqrt(ng));
  r.ok = r.bad_count == 0 && r.cosine >= 1.0 - REF_COS_TOL;
  if (r.bad_count)
    snprintf(r.message, sizeof r.message,
             "%zu of %zu elements outside tolerance; first at %zu: got %.6g want %.6g; "
             "max abs err %.3g; cosine %.9f",
             r.bad_count, n, r.first_bad, r.first_got, r.first_ref, r.max_abs_err, r.cosine);
  else
    snprintf(r.message, sizeof r.message, "max abs err %.3g, cosine %.9f (need >= %.9f)",
             r.max_abs_err, r.cosine, 1.0 - REF_COS_TOL);
  return r;
}

ref_report ref_check_lse(const double *ref, const float *got, size_t n) {
  ref_report r;
  memset(&r, 0, sizeof r);
  r.cosine = 1.0;
  for (size_t i = 0; i < n; i++) {
    double g = got[i], e = ref[i];
    int bad;
    if (isinf(e) && e < 0)
      bad = !(isinf(g) && g < 0);
    else {
      double err = fabs(g - e);
      bad = !(err <= REF_LSE_TOL);
      if (isfinite(g) && err > r.max_abs_err)
        r.max_abs_err = err;
    }
    if (bad) {
      if (r.bad_count == 0) {
        r.first_bad = i;
        r.first_got = g;
        r.first_ref = e;
      }
      r.bad_count++;
    }
  }
  r.ok = r.bad_count == 0;
  if (r.bad_count)
    snprintf(r.message, sizeof r.message,
             "%zu of %zu lse values outside 1e-3; first at %zu: got %.6g want %.6g", r.bad_count,
             n, r.first_bad, r.first_got, r.first_ref);
  else
    snprintf(r.message, sizeof r.message, "lse max abs err %.3g", r.max_abs_err);
  return r;
}
