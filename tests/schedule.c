/* SPDX-License-Identifier: MIT */
/* schedule.c - sched_check (see schedule.h): the schedule layout that
 * pmla.h documents, checked through copy_buffer. */
#include "schedule.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static int32_t *copy_ints(pmla_builder *b, const pmla_builder_info *info, pmla_buffer which,
                          size_t want_words, const char *name, const char *what) {
  uint64_t bytes = info->buffer_bytes[which];
  EXPECT(bytes >= want_words * sizeof(int32_t), "%s: %s is %llu bytes, pmla.h gives %zu words",
         what, name, (unsigned long long)bytes, want_words);
  int32_t *p = malloc(bytes ? (size_t)bytes : 1);
  EXPECT(p != NULL, "out of memory");
  pmla_status s = g_be->copy_buffer(b, which, p, bytes);
  EXPECT(s == PMLA_OK, "%s: copy_buffer(%s) returned %s: %s", what, name,
         harness_status_name(s), g_be->last_error(b));
  return p;
}

static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

sched_summary sched_check(pmla_builder *b, const sched_step *step, const char *what) {
  const pmla_builder_info info = harness_query(b);
  const int32_t N = (int32_t)info.sched_units, R = step->requests;
  const int sparse = step->qo_indptr == NULL;
  EXPECT(N >= 1, "%s: sched_units %d", what, N);
  EXPECT(R >= 0 && (uint32_t)R <= info.max_requests, "%s: the step has %d requests, max %u",
         what, R, info.max_requests);

  int32_t *meta = copy_ints(b, &info, PMLA_BUF_WORK_META_DATA, PMLA_META_WORDS,
                            "work_meta_data", what);
  int32_t *indptr = copy_ints(b, &info, PMLA_BUF_WORK_INDPTR, (size_t)N + 1, "work_indptr", what);
  int32_t *wi = copy_ints(b, &info, PMLA_BUF_WORK_INFO_SET,
                          (size_t)info.max_work_items * PMLA_WORK_INFO_WORDS, "work_info_set",
                          what);
  int32_t *rindptr = copy_ints(b, &info, PMLA_BUF_REDUCE_INDPTR, (size_t)info.max_requests + 1,
                               "reduce_indptr", what);
  int32_t *rfinal = copy_ints(b, &info, PMLA_BUF_REDUCE_FINAL_MAP, info.max_requests,
                              "reduce_final_map", what);
  int32_t *rpartial = copy_ints(b, &info, PMLA_BUF_REDUCE_PARTIAL_MAP, info.max_partial_slots,
                                "reduce_partial_map", what);

  /* ---- work_meta_data ---- */
  const int32_t items = meta[SCHED_META_ITEMS], reduces = meta[SCHED_META_REDUCE],
                partials = meta[SCHED_META_PARTIALS], mode = meta[SCHED_META_MODE];
  int32_t rows = 0;
  if (sparse)
    rows = R;
  else
    rows = R > 0 ? step->qo_indptr[R] - step->qo_indptr[0] : 0;
  EXPECT(meta[SCHED_META_REQUESTS] == R, "%s: work_meta_data requests %d, the step has %d", what,
         meta[SCHED_META_REQUESTS], R);
  EXPECT(meta[SCHED_META_ROWS] == rows, "%s: work_meta_data query rows %d, the step has %d",
         what, meta[SCHED_META_ROWS], rows);
  EXPECT(items >= 0 && (uint32_t)items <= info.max_work_items,
         "%s: %d work items, max_work_items %u", what, items, info.max_work_items);
  EXPECT(reduces >= 0 && reduces <= R, "%s: %d reduce entries for %d requests", what, reduces, R);
  EXPECT(partials >= 0 && (uint32_t)partials <= info.max_partial_slots,
         "%s: %d partial slots used, max_partial_slots %u", what, partials,
         info.max_partial_slots);
  EXPECT(mode == 0 || mode == 1 || mode == 3, "%s: schedule mode %d is not 0, 1 or 3", what,
         mode);
  EXPECT(mode != 3 || (reduces == 0 && partials == 0 && items == R),
         "%s: mode 3 (requests dealt whole) with %d reduce entries, %d partial slots and %d "
         "items for %d requests",
         what, reduces, partials, items, R);
  EXPECT(info.split_cap != 0 || mode != 1, "%s: capped-pieces mode %d with split_cap 0", what,
         mode);
  EXPECT(meta[SCHED_META_ERROR] == 0, "%s: device error word 0x%x after a valid build", what,
         (unsigned)meta[SCHED_META_ERROR]);

  /* ---- work_indptr: every item run by exactly one unit ---- */
  EXPECT(indptr[0] == 0, "%s: work_indptr[0] = %d", what, indptr[0]);
  for (int32_t n = 0; n < N; n++)
    EXPECT(indptr[n + 1] >= indptr[n], "%s: work_indptr falls at unit %d (%d -> %d)", what, n,
           indptr[n], indptr[n + 1]);
  EXPECT(indptr[N] == items, "%s: work_indptr[%d] = %d, %d items", what, N, indptr[N], items);

  /* ---- work items ---- */
  int32_t *npieces = calloc((size_t)R + 1, sizeof(int32_t));
  int32_t *len_of = malloc(sizeof(int32_t) * ((size_t)R + 1));
  int32_t *row_of = malloc(sizeof(int32_t) * ((size_t)R + 1));
  int32_t *row_owner = malloc(sizeof(int32_t) * ((size_t)R + 1));
  int32_t *final_pieces = calloc((size_t)R + 1, sizeof(int32_t));
  int32_t *slot_owner = malloc(sizeof(int32_t) * ((size_t)partials + 1));
  EXPECT(npieces && len_of && row_of && row_owner && final_pieces && slot_owner, "out of memory");
  for (int32_t r = 0; r < R; r++)
    len_of[r] = row_of[r] = row_owner[r] = -1;
  for (int32_t s = 0; s < partials; s++)
    slot_owner[s] = -1;
  int32_t last_request = 0;
  for (int32_t i = 0; i < items; i++) {
    const int32_t *w = wi + (size_t)i * PMLA_WORK_INFO_WORDS;
    const int32_t r = w[SCHED_WI_REQUEST];
    EXPECT(r >= 0 && r < R, "%s: item %d has request %d of %d", what, i, r, R);
    npieces[r]++;
    if (mode == 0) {
      EXPECT(r >= last_request,
             "%s: mode 0 (units filled in order) but item %d has request %d after request %d",
             what, i, r, last_request);
      last_request = r;
    }
    /* query rows */
    if (sparse) {
      const int32_t qb = w[SCHED_WI_Q_BEGIN];
      EXPECT(qb >= 0 && qb < R && w[SCHED_WI_Q_END] == qb + 1,
             "%s: sparse item %d (request %d) has rows [%d, %d), want one row of %d", what, i, r,
             qb, w[SCHED_WI_Q_END], R);
      if (row_of[r] < 0) {
        EXPECT(row_owner[qb] < 0, "%s: requests %d and %d both have query row %d", what,
               row_owner[qb], r, qb);
        row_of[r] = qb;
        row_owner[qb] = r;
      }
      EXPECT(row_of[r] == qb, "%s: request %d has pieces on rows %d and %d", what, r, row_of[r],
             qb);
    } else {
      EXPECT(w[SCHED_WI_Q_BEGIN] == step->qo_indptr[r] &&
                 w[SCHED_WI_Q_END] == step->qo_indptr[r + 1],
             "%s: item %d (request %d) has rows [%d, %d), qo_indptr gives [%d, %d)", what, i, r,
             w[SCHED_WI_Q_BEGIN], w[SCHED_WI_Q_END], step->qo_indptr[r], step->qo_indptr[r + 1]);
    }
    /* KV range */
    const int32_t len = w[SCHED_WI_KV_LEN];
    if (sparse)
      EXPECT(len >= 0 && len <= step->topk, "%s: sparse item %d has KV length %d, topk %d", what,
             i, len, step->topk);
    else
      EXPECT(len == step->kv_lens[r], "%s: item %d (request %d) has KV length %d, want %d", what,
             i, r, len, step->kv_lens[r]);
    if (len_of[r] < 0)
      len_of[r] = len;
    EXPECT(len_of[r] == len, "%s: request %d has pieces of KV length %d and %d", what, r,
           len_of[r], len);
    EXPECT(0 <= w[SCHED_WI_KV_BEGIN] && w[SCHED_WI_KV_BEGIN] <= w[SCHED_WI_KV_END] &&
               w[SCHED_WI_KV_END] <= len,
           "%s: item %d (request %d) covers KV [%d, %d) of %d", what, i, r, w[SCHED_WI_KV_BEGIN],
           w[SCHED_WI_KV_END], len);
    /* partial slot */
    const int32_t slot = w[SCHED_WI_PARTIAL];
    if (slot == -1) {
      final_pieces[r]++;
    } else {
      EXPECT(slot >= 0 && slot < partials, "%s: item %d (request %d) has partial slot %d of %d",
             what, i, r, slot, partials);
      EXPECT(slot_owner[slot] < 0, "%s: partial slot %d used twice (items %d and %d)", what,
             slot, slot_owner[slot], i);
      slot_owner[slot] = i;
    }
  }
  int32_t used_slots = 0;
  for (int32_t s = 0; s < partials; s++)
    used_slots += slot_owner[s] >= 0;
  EXPECT(used_slots == partials, "%s: %d of the %d partial slots said used are used", what,
         used_slots, partials);

  /* per request: its pieces, in KV order, tile [0, len) exactly once */
  int32_t *start = calloc((size_t)R + 1, sizeof(int32_t));
  int32_t *order = malloc(sizeof(int32_t) * ((size_t)items + 1));
  int32_t *fill = calloc((size_t)R + 1, sizeof(int32_t));
  EXPECT(start && order && fill, "out of memory");
  for (int32_t r = 0; r < R; r++)
    start[r + 1] = start[r] + npieces[r];
  for (int32_t i = 0; i < items; i++) {
    const int32_t r = wi[(size_t)i * PMLA_WORK_INFO_WORDS + SCHED_WI_REQUEST];
    order[start[r] + fill[r]++] = i;
  }
  sched_summary sum;
  memset(&sum, 0, sizeof sum);
  sum.items = items;
  sum.reduces = reduces;
  sum.partials = partials;
  sum.units = N;
  sum.split_cap = info.split_cap;
  int32_t with_partials = 0;
  for (int32_t r = 0; r < R; r++) {
    const int32_t k = npieces[r], *mine = order + start[r];
    const int32_t len = k ? len_of[r] : 0;
    if (!sparse)
      EXPECT(k > 0 || step->kv_lens[r] == 0, "%s: request %d (KV length %d) has no work item",
             what, r, step->kv_lens[r]);
    if (k > sum.max_pieces)
      sum.max_pieces = k;
    sum.split_requests += k > 1;
    if (info.split_cap)
      EXPECT((uint32_t)k <= info.split_cap, "%s: request %d has %d pieces, split_cap %u", what,
             r, k, info.split_cap);
    /* piece indices 0..k-1, each once */
    int32_t *seen = calloc((size_t)k + 1, sizeof(int32_t));
    EXPECT(seen != NULL, "out of memory");
    for (int32_t j = 0; j < k; j++) {
      const int32_t p = wi[(size_t)mine[j] * PMLA_WORK_INFO_WORDS + SCHED_WI_PIECE];
      EXPECT(p >= 0 && p < k, "%s: request %d has piece index %d of %d pieces", what, r, p, k);
      EXPECT(!seen[p], "%s: request %d has piece index %d twice", what, r, p);
      seen[p] = 1;
    }
    free(seen);
    /* KV coverage: sorted by begin, each piece starts where the last ended */
    int64_t *ranges = malloc(sizeof(int64_t) * ((size_t)k + 1));
    EXPECT(ranges != NULL, "out of memory");
    for (int32_t j = 0; j < k; j++) {
      const int32_t *w = wi + (size_t)mine[j] * PMLA_WORK_INFO_WORDS;
      ranges[j] = ((int64_t)w[SCHED_WI_KV_BEGIN] << 32) | (uint32_t)w[SCHED_WI_KV_END];
    }
    for (int32_t j = 1; j < k; j++) /* insertion sort: k is small */
      for (int32_t m = j; m > 0 && ranges[m - 1] > ranges[m]; m--) {
        int64_t t = ranges[m];
        ranges[m] = ranges[m - 1];
        ranges[m - 1] = t;
      }
    int32_t at = 0;
    for (int32_t j = 0; j < k; j++) {
      const int32_t kb = (int32_t)(ranges[j] >> 32), ke = (int32_t)(uint32_t)ranges[j];
      EXPECT(kb == at, "%s: request %d KV positions [%d, %d) %s", what, r, at < kb ? at : kb,
             at < kb ? kb : at, at < kb ? "are not covered" : "are covered twice");
      at = ke;
    }
    free(ranges);
    EXPECT(at == len, "%s: request %d pieces end at %d, KV length %d", what, r, at, len);
    /* who writes the output */
    if (final_pieces[r] > 0)
      EXPECT(k == 1, "%s: request %d has %d pieces, %d of them writing the final output", what,
             r, k, final_pieces[r]);
    with_partials += k > final_pieces[r];
  }
  EXPECT(meta[SCHED_META_MAX_PIECES] == sum.max_pieces,
         "%s: work_meta_data most pieces %d, the items give %d", what,
         meta[SCHED_META_MAX_PIECES], sum.max_pieces);

  /* ---- reduce maps ---- */
  EXPECT(reduces == with_partials, "%s: %d reduce entries, %d requests write partials", what,
         reduces, with_partials);
  EXPECT(rindptr[0] == 0, "%s: reduce_indptr[0] = %d", what, rindptr[0]);
  for (int32_t k = 0; k < reduces; k++)
    EXPECT(rindptr[k + 1] >= rindptr[k], "%s: reduce_indptr falls at entry %d (%d -> %d)", what,
           k, rindptr[k], rindptr[k + 1]);
  EXPECT(rindptr[reduces] == partials, "%s: reduce_indptr[%d] = %d, %d partial slots used", what,
         reduces, rindptr[reduces], partials);
  int32_t *has_entry = calloc((size_t)R + 1, sizeof(int32_t));
  EXPECT(has_entry != NULL, "out of memory");
  for (int32_t k = 0; k < reduces; k++) {
    const int32_t r = rfinal[k];
    EXPECT(r >= 0 && r < R, "%s: reduce entry %d merges into request %d of %d", what, k, r, R);
    EXPECT(!has_entry[r], "%s: request %d has two reduce entries", what, r);
    has_entry[r] = 1;
    const int32_t n = rindptr[k + 1] - rindptr[k];
    EXPECT(n == npieces[r] && final_pieces[r] == 0,
           "%s: reduce entry %d lists %d slots for request %d of %d pieces (%d writing the "
           "output)",
           what, k, n, r, npieces[r], final_pieces[r]);
    int32_t *want = malloc(sizeof(int32_t) * ((size_t)n + 1));
    int32_t *got = malloc(sizeof(int32_t) * ((size_t)n + 1));
    EXPECT(want && got, "out of memory");
    for (int32_t j = 0; j < n; j++) {
      want[j] = wi[(size_t)order[start[r] + j] * PMLA_WORK_INFO_WORDS + SCHED_WI_PARTIAL];
      got[j] = rpartial[rindptr[k] + j];
    }
    qsort(want, (size_t)n, sizeof(int32_t), cmp_i32);
    qsort(got, (size_t)n, sizeof(int32_t), cmp_i32);
    EXPECT(memcmp(want, got, sizeof(int32_t) * (size_t)n) == 0,
           "%s: reduce entry %d lists other partial slots than request %d's pieces use", what, k,
           r);
    free(want);
    free(got);
  }

  free(has_entry);
  free(start);
  free(order);
  free(fill);
  free(npieces);
  free(len_of);
  free(row_of);
  free(row_owner);
  free(final_pieces);
  free(slot_owner);
  free(meta);
  free(indptr);
  free(wi);
  free(rindptr);
  free(rfinal);
  free(rpartial);
  return sum;
}
