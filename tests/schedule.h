/* SPDX-License-Identifier: MIT */
/* schedule.h - what abi/pmla.h promises about a builder's schedule, read
 * back through copy_buffer after a successful build. Black box: the layouts
 * below are pmla.h's "Work-item and metadata layouts" and pmla_buffer, not
 * any planner's; a plugin may schedule however it likes within them. */
#ifndef PMLA_TEST_SCHEDULE_H
#define PMLA_TEST_SCHEDULE_H

#include <stdint.h>

#include "pmla.h"

/* work_info_set item words (pmla.h) */
enum {
  SCHED_WI_REQUEST = 0,
  SCHED_WI_PARTIAL = 1, /* partial slot, -1: writes the final output */
  SCHED_WI_Q_BEGIN = 2, /* query rows [begin, end) of the step */
  SCHED_WI_Q_END = 3,
  SCHED_WI_KV_BEGIN = 4, /* KV positions [begin, end) of the request */
  SCHED_WI_KV_END = 5,
  SCHED_WI_KV_LEN = 6, /* the request's KV length */
  SCHED_WI_PIECE = 7   /* the piece's index within its request */
};

/* work_meta_data words (pmla.h) */
enum {
  SCHED_META_ITEMS = 0,
  SCHED_META_REDUCE = 1,
  SCHED_META_PARTIALS = 2,
  SCHED_META_MODE = 3, /* 0 units filled in order, 1 capped pieces, 3 requests dealt whole */
  SCHED_META_MAX_PIECES = 4,
  SCHED_META_REQUESTS = 5,
  SCHED_META_ERROR = 6,
  SCHED_META_ROWS = 7
};

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
_Static_assert(PMLA_WORK_INFO_WORDS == 8, "pmla.h documents 8 words per work item");
_Static_assert(PMLA_META_WORDS == 8, "pmla.h documents 8 metadata words");
#endif

/* The step the builder was last built for, on the host. */
typedef struct sched_step {
  int32_t requests;         /* dense: the batch; sparse: the query tokens */
  const int32_t *qo_indptr; /* dense: [requests + 1]; NULL for sparse (one row each) */
  const int32_t *kv_lens;   /* dense: each request's KV length; NULL for sparse */
  int32_t topk;             /* sparse: the top-k width (bounds the KV length) */
} sched_step;

/* What the schedule held (for tests that want a split to have happened). */
typedef struct sched_summary {
  int32_t items, reduces, partials, max_pieces;
  int32_t split_requests; /* requests with more than one piece */
  int32_t units;          /* sched_units */
  uint32_t split_cap;
} sched_summary;

/* Copies the six schedule buffers of `b` and fails the test (naming `what`)
 * unless every promise of pmla.h holds for `step`:
 *   - work_meta_data: requests and query rows of the step, item / reduce /
 *     partial counts within max_work_items / max_requests /
 *     max_partial_slots, mode 0 or 1 (0 when split_cap is 0), the most
 *     pieces of one request, and a clear error word (valid input);
 *   - work_indptr: N + 1 monotone entries from 0 to the item count, so every
 *     item is run by exactly one unit;
 *   - work items: request in range, the request's query rows and KV length,
 *     0 <= kv_begin <= kv_end <= length; each request's pieces cover its KV
 *     range [0, length) exactly once and carry piece indices 0..k-1, each
 *     once; no more pieces than a non-zero split_cap;
 *   - partial slots: a request with one piece writing the output has -1; any
 *     other piece a slot in [0, partials used), no slot used twice;
 *   - reduce maps: reduce_indptr monotone from 0 to the partials used; each
 *     entry names a distinct request whose pieces' slots are exactly the
 *     slots it lists, and every request with partials has one entry;
 *   - mode 0 (units filled in order): items in unit order take requests in
 *     non-decreasing order. */
sched_summary sched_check(pmla_builder *b, const sched_step *step, const char *what);

#endif
