/* SPDX-License-Identifier: MIT */
/* t_planner.c - invariants of the shared scheduler (kernels/planner.h),
 * called directly over thousands of random and adversarial batches.
 *
 * For every plan:
 *   - work_indptr has N + 1 monotone entries from 0 to the item count;
 *   - every request's pieces tile its KV range [0, len) in order, pieces
 *     numbered 0..k-1, each non-empty unless len == 0, with the request's
 *     query rows and KV length;
 *   - a request with one piece writes the final output (partial == -1) and has
 *     no reduce entry; a split request has exactly one reduce entry that lists
 *     exactly its pieces' partial slots; no partial slot is used twice;
 *   - items <= R + N, partial slots <= 2N, nothing written past any buffer;
 *   - meta words agree with what was emitted;
 *   - with a split cap, no request has more pieces than the cap;
 *   - in fill mode (always without a cap), every unit's load (blocks +
 *     overhead per item) is at most P = ceil(C / N) + PMLA_SPLIT_OVERHEAD,
 *     and every unit before the last busy one has at least P - overhead:
 *     units fill in order, so a batch that packs whole is not split.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fastdiv.h"
#include "harness.h"
#include "planner.h"

#define CANARY 0x5a5a5a5a
#define GUARD 8

typedef struct plan_bufs {
  int32_t *meta, *indptr, *info, *rindptr, *rfinal, *rpartial;
  int32_t n_indptr, n_info, n_rindptr, n_rfinal, n_rpartial;
} plan_bufs;

static int32_t *guarded(int32_t n) {
  int32_t *p = malloc(sizeof(int32_t) * (size_t)(n + GUARD));
  EXPECT(p != NULL, "out of memory");
  for (int32_t i = 0; i < n + GUARD; i++)
    p[i] = CANARY;
  return p;
}

static int guard_ok(const int32_t *p, int32_t n) {
  for (int32_t i = n; i < n + GUARD; i++)
    if (p[i] != CANARY)
      return 0;
  return 1;
}

static void bufs_alloc(plan_bufs *b, int32_t R, int32_t N) {
  b->n_indptr = N + 1;
  b->n_info = (R + N) * PMLA_WI_WORDS;
  b->n_rindptr = R + 1;
  b->n_rfinal = R;
  b->n_rpartial = 2 * N;
  b->meta = guarded(PMLA_META_WORDS_);
  for (int i = 0; i < PMLA_META_WORDS_; i++)
    b->meta[i] = 0;
  b->indptr = guarded(b->n_indptr);
  b->info = guarded(b->n_info);
  b->rindptr = guarded(b->n_rindptr);
  b->rfinal = guarded(b->n_rfinal);
  b->rpartial = guarded(b->n_rpartial);
}

static void bufs_free(plan_bufs *b) {
  free(b->meta);
  free(b->indptr);
  free(b->info);
  free(b->rindptr);
  free(b->rfinal);
  free(b->rpartial);
}

typedef struct plan_stats {
  int64_t plans;
  double worst_over, worst_under; /* load - C/N, fill mode */
  char worst_over_desc[160];
  double worst_piece_over; /* load - C/N in piece mode (informational) */
  int64_t piece_mode_plans;
  int32_t max_items_seen_minus_bound;
} plan_stats;

static plan_stats g_stats;

/* A batch in plain form. */
typedef struct batch_desc {
  int32_t R, N, cap, max_q_len;
  int kind; /* 0 kv_lens, 1 CSR, 2 uniform (sparse) */
  int32_t *qo_indptr; /* NULL: row r per request */
  int32_t *lens;      /* expected validated lengths */
  int32_t *kv_indptr, *last_page, page_size, num_indices, uniform_len;
} batch_desc;

static void describe(const batch_desc *d, char *buf, size_t size) {
  size_t at = (size_t)snprintf(buf, size, "R=%d N=%d cap=%d kind=%d lens=[", d->R, d->N, d->cap,
                               d->kind);
  for (int32_t r = 0; r < d->R && at + 16 < size; r++)
    at += (size_t)snprintf(buf + at, size - at, "%s%d", r ? "," : "", d->lens[r]);
  if (at + 2 < size)
    snprintf(buf + at, size - at, "]");
}

static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* Plans `d` and checks every invariant; fails the test with the batch.
 * Returns the number of split requests (reduce entries). */
static int32_t check_plan(const batch_desc *d) {
  const int32_t R = d->R, N = d->N, OH = PMLA_SPLIT_OVERHEAD;
  char desc[2048];
  plan_bufs b;
  bufs_alloc(&b, R, N);
  pmla_plan_input in;
  memset(&in, 0, sizeof in);
  in.num_requests = R;
  in.num_units = N;
  in.split_cap = d->cap;
  in.max_q_len = d->max_q_len;
  in.qo_indptr = d->qo_indptr;
  if (d->kind == 0) {
    in.kv_lens = d->lens;
    in.max_kv_len = INT32_MAX;
  } else if (d->kind == 1) {
    in.kv_indptr = d->kv_indptr;
    in.kv_last_page_len = d->last_page;
    in.page_size = d->page_size;
    in.num_page_indices = d->num_indices;
  } else {
    in.uniform_len = d->uniform_len;
  }
  in.max_items = R + N;
  in.max_partials = 2 * N;
  pmla_plan_output out = {b.meta, b.indptr, b.info, b.rindptr, b.rfinal, b.rpartial};
  int32_t err = pmla_plan(&in, &out);
  g_stats.plans++;
  describe(d, desc, sizeof desc);

  EXPECT(err == 0, "planner error bits 0x%x on a valid batch: %s", err, desc);
  EXPECT(guard_ok(b.meta, PMLA_META_WORDS_) && guard_ok(b.indptr, b.n_indptr) &&
                    guard_ok(b.info, b.n_info) && guard_ok(b.rindptr, b.n_rindptr) &&
                    guard_ok(b.rfinal, b.n_rfinal) && guard_ok(b.rpartial, b.n_rpartial),
                "planner wrote past a buffer: %s", desc);
  const int32_t items = b.meta[PMLA_META_NUM_ITEMS], reduces = b.meta[PMLA_META_NUM_REDUCE],
                partials = b.meta[PMLA_META_NUM_PARTIALS];
  EXPECT(items >= 0 && items <= R + N, "%d items > R + N = %d: %s", items, R + N, desc);
  EXPECT(partials >= 0 && partials <= 2 * N, "%d partial slots > 2N = %d: %s", partials,
                2 * N, desc);
  EXPECT(reduces >= 0 && reduces <= R, "%d reduce entries: %s", reduces, desc);
  EXPECT(b.meta[PMLA_META_NUM_REQUESTS] == R, "meta requests %d != %d: %s",
                b.meta[PMLA_META_NUM_REQUESTS], R, desc);

  /* work_indptr */
  EXPECT(b.indptr[0] == 0, "work_indptr[0] = %d: %s", b.indptr[0], desc);
  for (int32_t n = 0; n < N; n++)
    EXPECT(b.indptr[n + 1] >= b.indptr[n], "work_indptr not monotone at %d: %s", n, desc);
  EXPECT(b.indptr[N] == items, "work_indptr[N] = %d != %d items: %s", b.indptr[N], items,
                desc);

  /* the line's length C and the fill's capacity P (planner.h) */
  int64_t C = 0;
  for (int32_t r = 0; r < R; r++)
    C += OH + pmla_plan_blocks(d->lens[r]);
  const int64_t P = (C > 0 ? (C + N - 1) / N : 1) + OH;

  /* per-request pieces */
  int32_t *npieces = calloc((size_t)R + 1, sizeof *npieces);
  int64_t *covered = calloc((size_t)R + 1, sizeof *covered);
  int32_t *slot_used = calloc((size_t)(2 * N) + 1, sizeof *slot_used);
  int32_t *item_of = malloc(sizeof(int32_t) * ((size_t)(R + N) * 1 + 1));
  EXPECT(npieces && covered && slot_used && item_of, "out of memory");
  int32_t expect_rows = 0, max_pieces = 0;
  for (int32_t r = 0; r < R; r++)
    expect_rows += d->qo_indptr ? d->qo_indptr[r + 1] - d->qo_indptr[r] : 1;
  EXPECT(b.meta[PMLA_META_NUM_ROWS] == expect_rows, "meta rows %d != %d: %s",
                b.meta[PMLA_META_NUM_ROWS], expect_rows, desc);
  /* Items of a request in piece order: scan per request (R and items small). */
  int32_t *req_items_start = calloc((size_t)R + 1, sizeof(int32_t));
  EXPECT(req_items_start != NULL, "out of memory");
  for (int32_t i = 0; i < items; i++) {
    const int32_t *w = b.info + (int64_t)i * PMLA_WI_WORDS;
    int32_t r = w[PMLA_WI_REQUEST];
    EXPECT(r >= 0 && r < R, "item %d has request %d: %s", i, r, desc);
    npieces[r]++;
  }
  for (int32_t r = 0; r < R; r++) {
    req_items_start[r + 1] = req_items_start[r] + npieces[r];
    EXPECT(npieces[r] >= 1, "request %d (len %d) has no work item: %s", r, d->lens[r],
                  desc);
    if (npieces[r] > max_pieces)
      max_pieces = npieces[r];
    if (d->cap > 0)
      EXPECT(npieces[r] <= d->cap, "request %d has %d pieces > cap %d: %s", r, npieces[r],
                    d->cap, desc);
    if (b.meta[PMLA_META_MODE] == 0) {
      int64_t bound = pmla_plan_fill_max_pieces(pmla_plan_blocks(d->lens[r]), P);
      EXPECT(npieces[r] <= bound, "request %d has %d pieces > the fill's bound %" PRId64 ": %s",
             r, npieces[r], bound, desc);
    }
  }
  EXPECT(b.meta[PMLA_META_MAX_PIECES] == max_pieces, "meta max pieces %d != %d: %s",
                b.meta[PMLA_META_MAX_PIECES], max_pieces, desc);
  /* bucket items per request, ordered by piece index */
  for (int32_t i = 0; i < items; i++)
    item_of[i] = -1;
  for (int32_t i = 0; i < items; i++) {
    const int32_t *w = b.info + (int64_t)i * PMLA_WI_WORDS;
    int32_t r = w[PMLA_WI_REQUEST], p = w[PMLA_WI_PIECE];
    EXPECT(p >= 0 && p < npieces[r], "request %d piece index %d of %d: %s", r, p,
                  npieces[r], desc);
    int32_t at = req_items_start[r] + p;
    EXPECT(item_of[at] == -1, "request %d has piece %d twice: %s", r, p, desc);
    item_of[at] = i;
  }
  int32_t split_requests = 0;
  for (int32_t r = 0; r < R; r++) {
    int32_t len = d->lens[r], qb, qe;
    if (d->qo_indptr) {
      qb = d->qo_indptr[r];
      qe = d->qo_indptr[r + 1];
    } else {
      qb = r;
      qe = r + 1;
    }
    int32_t kv = 0;
    for (int32_t p = 0; p < npieces[r]; p++) {
      const int32_t *w = b.info + (int64_t)item_of[req_items_start[r] + p] * PMLA_WI_WORDS;
      EXPECT(w[PMLA_WI_KV_BEGIN] == kv, "request %d piece %d starts at %d, want %d: %s", r,
                    p, w[PMLA_WI_KV_BEGIN], kv, desc);
      EXPECT(w[PMLA_WI_KV_END] > w[PMLA_WI_KV_BEGIN] || (len == 0 && w[PMLA_WI_KV_END] == 0),
                    "request %d piece %d is empty [%d, %d) (len %d): %s", r, p,
                    w[PMLA_WI_KV_BEGIN], w[PMLA_WI_KV_END], len, desc);
      EXPECT(w[PMLA_WI_KV_LEN] == len, "request %d kv_len word %d != %d: %s", r,
                    w[PMLA_WI_KV_LEN], len, desc);
      EXPECT(w[PMLA_WI_Q_BEGIN] == qb && w[PMLA_WI_Q_END] == qe,
                    "request %d rows [%d,%d) want [%d,%d): %s", r, w[PMLA_WI_Q_BEGIN],
                    w[PMLA_WI_Q_END], qb, qe, desc);
      if (npieces[r] == 1) {
        EXPECT(w[PMLA_WI_PARTIAL] == -1, "unsplit request %d uses partial %d: %s", r,
                      w[PMLA_WI_PARTIAL], desc);
      } else {
        int32_t slot = w[PMLA_WI_PARTIAL];
        EXPECT(slot >= 0 && slot < partials, "request %d piece %d slot %d of %d: %s", r, p,
                      slot, partials, desc);
        EXPECT(!slot_used[slot], "partial slot %d used twice: %s", slot, desc);
        slot_used[slot] = 1;
      }
      kv = w[PMLA_WI_KV_END];
    }
    EXPECT(kv == len, "request %d pieces end at %d, len %d: %s", r, kv, len, desc);
    covered[r] = kv;
    split_requests += npieces[r] > 1;
  }
  EXPECT(reduces == split_requests, "%d reduce entries for %d split requests: %s",
                reduces, split_requests, desc);
  /* reduce maps */
  EXPECT(b.rindptr[0] == 0, "reduce_indptr[0] = %d: %s", b.rindptr[0], desc);
  EXPECT(b.rindptr[reduces] == partials, "reduce_indptr[%d] = %d != %d partials: %s",
                reduces, b.rindptr[reduces], partials, desc);
  int32_t *seen_req = calloc((size_t)R + 1, sizeof(int32_t));
  EXPECT(seen_req != NULL, "out of memory");
  for (int32_t k = 0; k < reduces; k++) {
    int32_t r = b.rfinal[k];
    EXPECT(r >= 0 && r < R, "reduce entry %d maps request %d: %s", k, r, desc);
    EXPECT(!seen_req[r], "request %d has two reduce entries: %s", r, desc);
    seen_req[r] = 1;
    EXPECT(npieces[r] > 1, "unsplit request %d has a reduce entry: %s", r, desc);
    int32_t lo = b.rindptr[k], hi = b.rindptr[k + 1];
    EXPECT(hi - lo == npieces[r], "reduce entry of request %d lists %d slots, %d pieces: %s",
                  r, hi - lo, npieces[r], desc);
    int32_t *want = malloc(sizeof(int32_t) * (size_t)npieces[r]);
    int32_t *got = malloc(sizeof(int32_t) * (size_t)npieces[r]);
    EXPECT(want && got, "out of memory");
    for (int32_t p = 0; p < npieces[r]; p++) {
      want[p] = b.info[(int64_t)item_of[req_items_start[r] + p] * PMLA_WI_WORDS + PMLA_WI_PARTIAL];
      got[p] = b.rpartial[lo + p];
    }
    qsort(want, (size_t)npieces[r], sizeof(int32_t), cmp_i32);
    qsort(got, (size_t)npieces[r], sizeof(int32_t), cmp_i32);
    EXPECT(memcmp(want, got, sizeof(int32_t) * (size_t)npieces[r]) == 0,
                  "reduce entry of request %d lists other slots than its pieces: %s", r, desc);
    free(want);
    free(got);
  }

  /* load balance */
  double share = (double)C / N;
  int32_t last_busy = -1;
  for (int32_t n = 0; n < N; n++)
    if (b.indptr[n + 1] > b.indptr[n])
      last_busy = n;
  for (int32_t n = 0; n < N; n++) {
    int64_t load = 0;
    for (int32_t i = b.indptr[n]; i < b.indptr[n + 1]; i++) {
      const int32_t *w = b.info + (int64_t)i * PMLA_WI_WORDS;
      load += OH + pmla_plan_blocks(w[PMLA_WI_KV_END] - w[PMLA_WI_KV_BEGIN]);
    }
    double dev = (double)load - share;
    if (b.meta[PMLA_META_MODE] == 0) {
      if (dev > g_stats.worst_over) {
        g_stats.worst_over = dev;
        snprintf(g_stats.worst_over_desc, sizeof g_stats.worst_over_desc, "%.150s", desc);
      }
      if (dev < g_stats.worst_under)
        g_stats.worst_under = dev;
      EXPECT(load <= P,
             "unit %d load %" PRId64 " over the capacity P = ceil(C/N) + OH = %" PRId64
             " (C=%" PRId64 "): %s",
             n, load, P, C, desc);
      EXPECT(n >= last_busy || load >= P - OH,
             "unit %d (before the last busy unit %d) load %" PRId64 " under P - OH = %" PRId64
             ": units must fill in order: %s",
             n, last_busy, load, P - OH, desc);
    } else if (dev > g_stats.worst_piece_over) {
      g_stats.worst_piece_over = dev;
    }
  }
  if (d->cap == 0)
    EXPECT(b.meta[PMLA_META_MODE] == 0, "piece mode without a cap: %s", desc);
  g_stats.piece_mode_plans += b.meta[PMLA_META_MODE] == 1;
  free(seen_req);
  free(req_items_start);
  free(npieces);
  free(covered);
  free(slot_used);
  free(item_of);
  bufs_free(&b);
  return reduces;
}

static int32_t random_len(uint64_t *rng) {
  uint32_t k = rng_below(rng, 100);
  if (k < 10)
    return 0;
  if (k < 50)
    return 1 + (int32_t)rng_below(rng, 200);
  if (k < 85)
    return 1 + (int32_t)rng_below(rng, 4096);
  if (k < 97)
    return 1 + (int32_t)rng_below(rng, 65536);
  return 1 + (int32_t)rng_below(rng, 1 << 20);
}

/* Fills d with a random batch of the given kind. Arrays are owned by d. */
static void random_batch(batch_desc *d, uint64_t *rng, int kind) {
  memset(d, 0, sizeof *d);
  d->kind = kind;
  uint32_t rk = rng_below(rng, 10);
  d->R = rk == 0 ? 0 : rk < 7 ? 1 + (int32_t)rng_below(rng, 16) : 1 + (int32_t)rng_below(rng, 200);
  uint32_t nk = rng_below(rng, 4);
  d->N = nk == 0 ? 1 + (int32_t)rng_below(rng, 8)
                 : nk == 1 ? 1 + (int32_t)rng_below(rng, 300)
                           : (int32_t)(16 * (1 + rng_below(rng, 20)));
  uint32_t ck = rng_below(rng, 4);
  d->cap = ck < 2 ? 0 : ck == 2 ? (int32_t)(1u << rng_below(rng, 6)) : 1 + (int32_t)rng_below(rng, 40);
  d->max_q_len = 1 + (int32_t)rng_below(rng, 8);
  d->lens = calloc((size_t)d->R + 1, sizeof(int32_t));
  EXPECT(d->lens != NULL, "out of memory");
  if (kind != 2 && rng_below(rng, 4)) {
    d->qo_indptr = calloc((size_t)d->R + 1, sizeof(int32_t));
    for (int32_t r = 0; r < d->R; r++)
      d->qo_indptr[r + 1] = d->qo_indptr[r] + (int32_t)rng_below(rng, (uint32_t)d->max_q_len + 1);
  }
  if (kind == 2) {
    d->uniform_len = (int32_t)rng_below(rng, 3) == 0 ? (int32_t)rng_below(rng, 100)
                                                     : (int32_t)(512u << rng_below(rng, 3));
    for (int32_t r = 0; r < d->R; r++)
      d->lens[r] = d->uniform_len;
    return;
  }
  for (int32_t r = 0; r < d->R; r++)
    d->lens[r] = random_len(rng);
  if (kind == 1) {
    d->page_size = 1 << rng_below(rng, 9);
    d->kv_indptr = calloc((size_t)d->R + 1, sizeof(int32_t));
    d->last_page = calloc((size_t)d->R + 1, sizeof(int32_t));
    for (int32_t r = 0; r < d->R; r++) {
      int32_t pages = (d->lens[r] + d->page_size - 1) / d->page_size;
      d->kv_indptr[r + 1] = d->kv_indptr[r] + pages;
      d->last_page[r] = pages ? d->lens[r] - (pages - 1) * d->page_size : (int32_t)rng_below(rng, 3);
    }
    d->num_indices = d->kv_indptr[d->R] + (int32_t)rng_below(rng, 5);
  }
}

static void batch_free(batch_desc *d) {
  free(d->qo_indptr);
  free(d->lens);
  free(d->kv_indptr);
  free(d->last_page);
}

START_TEST(test_planner_invariants_hold_on_random_batches) {
  uint64_t rng = harness_seed() ^ 0x11;
  memset(&g_stats, 0, sizeof g_stats);
  for (int it = 0; it < 30000; it++) {
    batch_desc d;
    random_batch(&d, &rng, it % 3);
    check_plan(&d);
    batch_free(&d);
  }
  printf("planner: %" PRId64 " random plans (%" PRId64
         " in piece mode); fill-mode worst unit load vs C/N: +%.2f / %.2f blocks (bound +%d)\n"
         "  worst over: %s\n  piece mode worst over (informational): +%.2f\n",
         g_stats.plans, g_stats.piece_mode_plans, g_stats.worst_over, g_stats.worst_under,
         1 + PMLA_SPLIT_OVERHEAD, g_stats.worst_over_desc, g_stats.worst_piece_over);
  fflush(stdout);
}
END_TEST

/* One long request among many short ones, every unit count 1..300 and the
 * caps 0, 1, 2, 4, 16: the cap must bind per request. */
START_TEST(test_planner_honours_split_cap_on_adversarial_batches) {
  static const int32_t caps[] = {0, 1, 2, 4, 16};
  static const int32_t shorts[] = {0, 1, 7, 63};
  uint64_t rng = harness_seed() ^ 0x22;
  memset(&g_stats, 0, sizeof g_stats);
  for (int32_t N = 1; N <= 300; N++) {
    for (size_t c = 0; c < sizeof caps / sizeof caps[0]; c++) {
      for (size_t s = 0; s < sizeof shorts / sizeof shorts[0]; s += (N % 7 == 0) ? 1 : 3) {
        batch_desc d;
        memset(&d, 0, sizeof d);
        d.R = 1 + (int32_t)(N % 37) + (int32_t)s * 5;
        d.N = N;
        d.cap = caps[c];
        d.max_q_len = 1;
        d.lens = calloc((size_t)d.R, sizeof(int32_t));
        EXPECT(d.lens != NULL, "out of memory");
        int32_t longest = (int32_t)rng_below(&rng, (uint32_t)d.R);
        for (int32_t r = 0; r < d.R; r++)
          d.lens[r] = r == longest ? 64 * 1000 + (int32_t)rng_below(&rng, 64 * 1000) : shorts[s];
        check_plan(&d);
        /* the sparse shape: every request of the same length */
        d.kind = 2;
        d.uniform_len = 2048;
        for (int32_t r = 0; r < d.R; r++)
          d.lens[r] = 2048;
        check_plan(&d);
        batch_free(&d);
      }
    }
  }
  printf("planner: %" PRId64 " adversarial plans; fill-mode worst over +%.2f (%s)\n",
         g_stats.plans, g_stats.worst_over, g_stats.worst_over_desc);
}
END_TEST

/* Plans R requests of length len on N units without a cap, checking every
 * invariant; returns the number of split requests. */
static int32_t splits_of_uniform(int32_t R, int32_t len, int32_t N) {
  int32_t *lens = malloc(sizeof(int32_t) * (size_t)R);
  EXPECT(lens != NULL, "out of memory");
  for (int32_t r = 0; r < R; r++)
    lens[r] = len;
  batch_desc d;
  memset(&d, 0, sizeof d);
  d.R = R;
  d.N = N;
  d.max_q_len = 1;
  d.lens = lens;
  int32_t splits = check_plan(&d);
  free(lens);
  return splits;
}

/* FlashMLA's packing: when whole requests fit in each unit's slack (OH
 * blocks over the even share), nothing is split, so a step pays for no
 * partials and no reduce. The H200 shapes: 128 requests on 66 units (h=128,
 * two 64-row tiles per request) or 132 (h<=64). */
START_TEST(test_planner_packs_whole_requests_within_the_slack) {
  static const struct {
    int32_t R, len, N;
  } whole[] = {{128, 1024, 66}, {128, 4096, 66}, {128, 4096, 132}, {64, 8192, 66},
               {132, 4096, 132}, {5, 100, 8}};
  for (size_t i = 0; i < sizeof whole / sizeof whole[0]; i++) {
    int32_t splits = splits_of_uniform(whole[i].R, whole[i].len, whole[i].N);
    EXPECT(splits == 0, "%d requests of %d tokens on %d units: %d split, want none",
           whole[i].R, whole[i].len, whole[i].N, splits);
  }
  /* fewer requests than units, or requests longer than a unit's share: split */
  EXPECT(splits_of_uniform(4, 32768, 66) == 4, "4 long requests on 66 units must all split");
  EXPECT(splits_of_uniform(64, 8192, 132) == 64, "64 requests on 132 units must all split");
}
END_TEST

/* The device walk's step is the reference step, case by case: random
 * states (including the last units and rooms at and around OH) and
 * lengths (zero, one block, around the capacity, many units long). */
START_TEST(test_planner_fill_step_and_pieces_equal_the_walk) {
  uint64_t rng = harness_seed() ^ 0x44;
  const int64_t OH = PMLA_SPLIT_OVERHEAD;
  for (int i = 0; i < 2000000; i++) {
    int32_t units = 1 + (int32_t)rng_below(&rng, 300);
    int64_t capacity = OH + 1 + (int64_t)rng_below(&rng, rng_below(&rng, 2) ? 50 : 5000);
    pmla_plan_fill f = {(int32_t)rng_below(&rng, (uint32_t)units),
                        (int64_t)rng_below(&rng, (uint32_t)capacity + 1)};
    if (rng_below(&rng, 4) == 0)
      f.room = OH - 1 + (int64_t)rng_below(&rng, 3);
    else if (rng_below(&rng, 16) == 0) /* past the last unit's room (flagged, still defined) */
      f.room = -(int64_t)rng_below(&rng, 1000);
    int64_t blocks;
    switch (rng_below(&rng, 4)) {
    case 0:
      blocks = (int64_t)rng_below(&rng, 3);
      break;
    case 1:
      blocks = capacity - OH - 2 + (int64_t)rng_below(&rng, 5);
      break;
    case 2:
      blocks = (int64_t)rng_below(&rng, (uint32_t)(4 * capacity));
      break;
    default:
      blocks = (int64_t)rng_below(&rng, 1u << 20);
    }
    if (blocks < 0)
      blocks = 0;
    pmla_plan_fill want = f, got = f;
    int32_t want_pieces = pmla_plan_fill_count(&want, blocks, capacity, units);
    int32_t got_pieces = pmla_plan_fill_next(&got, blocks, capacity, units);
    EXPECT(got_pieces == want_pieces && got.unit == want.unit && got.room == want.room,
           "fill step from unit %d room %" PRId64 " (units %d, P %" PRId64 ", %" PRId64
           " blocks): %d pieces, unit %d room %" PRId64 "; reference %d, %d, %" PRId64,
           f.unit, f.room, units, capacity, blocks, got_pieces, got.unit, got.room, want_pieces,
           want.unit, want.room);
    /* the device's walk on the units' ends, 64-bit and, where the caller
     * may use them (C < 2^30), 32-bit: the same unit and room, the pieces
     * from the units; past the last unit exactly where the reference's
     * room goes negative */
    const int64_t s0 = 2000 + (int64_t)rng_below(&rng, 1u << 20);
    pmla_plan_ends e = {s0, s0 + f.room, f.unit};
    pmla_plan_ends_step(&e, blocks, capacity);
    if (e.unit <= units - 1)
      EXPECT(e.unit == want.unit && e.end - e.s == want.room &&
                 pmla_plan_ends_pieces(f.unit, f.room, e.unit) == want_pieces,
             "ends step from unit %d room %" PRId64 " (units %d, P %" PRId64 ", %" PRId64
             " blocks): %d pieces, unit %d room %" PRId64 "; reference %d, %d, %" PRId64,
             f.unit, f.room, units, capacity, blocks,
             pmla_plan_ends_pieces(f.unit, f.room, e.unit), e.unit, e.end - e.s, want_pieces,
             want.unit, want.room);
    else
      EXPECT(want.room < 0,
             "ends step from unit %d room %" PRId64 " (units %d, P %" PRId64 ", %" PRId64
             " blocks) passes the last unit; the reference keeps room %" PRId64,
             f.unit, f.room, units, capacity, blocks, want.room);
    if (capacity < (1 << 29) && blocks < (1 << 29)) {
      const pmla_plan_ends32 e0 = {(uint32_t)s0, (uint32_t)(s0 + f.room), f.unit};
      if (f.room >= 0) { /* the room step, on the room alone */
        pmla_plan_ends32 r32 = {0, (uint32_t)f.room, f.unit};
        pmla_plan_room_step32_long(&r32, (uint32_t)blocks, (uint32_t)capacity,
                                   pmla_fastdiv_make((uint32_t)(capacity - OH)));
        EXPECT(r32.s == 0 && r32.unit == e.unit && (int64_t)r32.end == e.end - e.s,
               "32-bit room step from unit %d room %" PRId64 " (P %" PRId64 ", %" PRId64
               " blocks): unit %d room %" PRId64 "; 64-bit %d, %" PRId64,
               f.unit, f.room, capacity, blocks, r32.unit, (int64_t)r32.end, e.unit,
               e.end - e.s);
      }
      if (blocks <= capacity - OH) { /* the short step, one end at most */
        pmla_plan_ends32 s32 = e0;
        pmla_plan_ends_step32(&s32, (uint32_t)blocks, (uint32_t)capacity);
        EXPECT(s32.unit == e.unit && (int64_t)(s32.end - s32.s) == e.end - e.s,
               "short 32-bit ends step from unit %d room %" PRId64 " (P %" PRId64 ", %" PRId64
               " blocks): unit %d room %" PRId64 "; 64-bit %d, %" PRId64,
               f.unit, f.room, capacity, blocks, s32.unit, (int64_t)(s32.end - s32.s), e.unit,
               e.end - e.s);
      }
    }
    /* each piece in closed form (the device places pieces in parallel) is
     * the piece the walk places */
    pmla_plan_fill walk = f;
    int64_t b = 0;
    for (int32_t p = 0; p < want_pieces; p++) {
      int32_t unit, at_unit;
      const int64_t first = b;
      b = pmla_plan_fill_piece(&walk, blocks, b, capacity, units, &unit);
      int64_t at_first, at_next;
      pmla_plan_fill_piece_at(&f, blocks, p, want_pieces, capacity, units, &at_first, &at_next,
                              &at_unit);
      EXPECT(at_first == first && at_next == b && at_unit == unit,
             "piece %d of %d from unit %d room %" PRId64 " (units %d, P %" PRId64 ", %" PRId64
             " blocks): [%" PRId64 ", %" PRId64 ") on unit %d; the walk places [%" PRId64
             ", %" PRId64 ") on unit %d",
             p, want_pieces, f.unit, f.room, units, capacity, blocks, at_first, at_next, at_unit,
             first, b, unit);
    }
  }
}
END_TEST

START_TEST(test_planner_invariants_hold_for_batch_zero_and_zero_lengths) {
  for (int32_t N = 1; N <= 64; N++) {
    batch_desc d;
    memset(&d, 0, sizeof d);
    d.N = N;
    d.max_q_len = 4;
    d.lens = calloc(40, sizeof(int32_t));
    d.R = 0; /* batch 0 */
    check_plan(&d);
    d.R = 33; /* all zero-length */
    check_plan(&d);
    d.lens[5] = 1; /* one token among empties */
    check_plan(&d);
    d.cap = 1;
    check_plan(&d);
    batch_free(&d);
  }
}
END_TEST

START_TEST(test_planner_invariants_hold_for_huge_lengths_without_overflow) {
  batch_desc d;
  memset(&d, 0, sizeof d);
  d.R = 64;
  d.max_q_len = 8;
  d.lens = calloc(64, sizeof(int32_t));
  for (int32_t r = 0; r < 64; r++)
    d.lens[r] = INT32_MAX - r * 1000;
  for (int32_t N = 1; N <= 1024; N = N * 3 + 1) {
    d.N = N;
    d.cap = 0;
    check_plan(&d);
    d.cap = 16;
    check_plan(&d);
  }
  batch_free(&d);
}
END_TEST

/* Bad per-request input flags its bit and counts as length 0; the plan stays
 * within the buffers. */
START_TEST(test_planner_flags_bad_input_and_writes_within_its_buffers) {
  plan_bufs b;
  const int32_t R = 4, N = 8;
  int32_t lens[4] = {10, -3, 5000, 70};
  int32_t qo[5] = {0, 1, 3, 2, 4}; /* non-monotone at request 2 */
  pmla_plan_input in;
  memset(&in, 0, sizeof in);
  in.num_requests = R;
  in.num_units = N;
  in.max_q_len = 8;
  in.qo_indptr = qo;
  in.kv_lens = lens;
  in.max_kv_len = 4096; /* 5000 is beyond the block table */
  in.max_items = R + N;
  in.max_partials = 2 * N;
  bufs_alloc(&b, R, N);
  pmla_plan_output out = {b.meta, b.indptr, b.info, b.rindptr, b.rfinal, b.rpartial};
  int32_t err = pmla_plan(&in, &out);
  EXPECT(err & PMLA_PLAN_ERR_KV_LEN, "negative / too long kv_len not flagged (0x%x)", err);
  EXPECT(err & PMLA_PLAN_ERR_QO_INDPTR, "non-monotone qo_indptr not flagged (0x%x)", err);
  EXPECT(!(err & PMLA_PLAN_ERR_OVERFLOW), "overflow on bad input (0x%x)", err);
  ck_assert(b.meta[PMLA_META_ERROR] == err);
  ck_assert(guard_ok(b.info, b.n_info) && guard_ok(b.rpartial, b.n_rpartial));
  bufs_free(&b);

  /* CSR: last page 0 and > page_size, indptr beyond the indices */
  int32_t kv_indptr[4] = {0, 2, 4, 9};
  int32_t last[3] = {0, 17, 3};
  memset(&in, 0, sizeof in);
  in.num_requests = 3;
  in.num_units = N;
  in.max_q_len = 1;
  in.kv_indptr = kv_indptr;
  in.kv_last_page_len = last;
  in.page_size = 16;
  in.num_page_indices = 6;
  in.max_items = 3 + N;
  in.max_partials = 2 * N;
  bufs_alloc(&b, 3, N);
  pmla_plan_output out2 = {b.meta, b.indptr, b.info, b.rindptr, b.rfinal, b.rpartial};
  err = pmla_plan(&in, &out2);
  EXPECT(err & PMLA_PLAN_ERR_LAST_PAGE, "bad last_page_len not flagged (0x%x)", err);
  EXPECT(err & PMLA_PLAN_ERR_KV_LEN, "kv_indptr beyond kv_indices not flagged (0x%x)", err);
  ck_assert(guard_ok(b.info, b.n_info));
  bufs_free(&b);
}
END_TEST

/* ---- the sparse split cap ---- */

/* Independent: next power of two by bit length. */
static int64_t indep_cap(int64_t max_seq_len, int64_t topk, int64_t cu) {
  int64_t m = max_seq_len < topk ? max_seq_len : topk;
  int64_t q = m / 128;
  if (q < 1)
    q = 1;
  int bits = 0;
  while ((1ll << bits) < q)
    bits++;
  int64_t p = 1ll << bits;
  return p < cu ? p : cu;
}

START_TEST(test_sparse_split_cap_matches_its_table_and_an_independent_formula) {
  static const struct {
    int64_t seq, topk, cu, cap;
  } rows[] = {{4096, 2048, 132, 16}, {100, 2048, 132, 1}, {300, 2048, 132, 2},
              {4096, 2048, 8, 8},    {2048, 2048, 304, 16}, {0, 2048, 132, 1},
              {128, 2048, 132, 1},   {256, 2048, 132, 2},   {257, 2048, 132, 2},
              {384, 2048, 132, 4},   {65536, 512, 132, 4},  {1 << 20, 65536, 132, 132},
              {1 << 20, 65536, 1024, 512}, {4096, 2048, 1, 1}};
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    int32_t got = pmla_sparse_split_cap(rows[i].seq, rows[i].topk, rows[i].cu);
    EXPECT(got == rows[i].cap, "cap(%lld, %lld, %lld) = %d, want %lld",
                  (long long)rows[i].seq, (long long)rows[i].topk, (long long)rows[i].cu, got,
                  (long long)rows[i].cap);
  }
  uint64_t rng = harness_seed() ^ 0x33;
  for (int i = 0; i < 200000; i++) {
    int64_t seq = rng_below(&rng, 4) == 0 ? (int64_t)rng_below(&rng, 1024)
                                          : (int64_t)rng_below(&rng, 1u << 22);
    int64_t topk = 1 + (int64_t)rng_below(&rng, 65536);
    int64_t cu = 1 + (int64_t)rng_below(&rng, 1024);
    int32_t got = pmla_sparse_split_cap(seq, topk, cu);
    EXPECT(got == indep_cap(seq, topk, cu), "cap(%lld, %lld, %lld) = %d, want %lld",
                  (long long)seq, (long long)topk, (long long)cu, got,
                  (long long)indep_cap(seq, topk, cu));
  }
}
END_TEST

/* The loaders' page-size division (kernels/fastdiv.h) equals integer
 * division for every divisor a page size can be and numerators across the
 * whole non-negative int32 range, the ends included */
START_TEST(test_fastdiv_equals_integer_division) {
  uint64_t rng = harness_seed() ^ 0xd1fu;
  static const uint32_t big[] = {65535, 65536, 65537, 1u << 20, 12345678, 1u << 30,
                                 (1u << 31) - 1, 1u << 31};
  for (int k = 0; k < 4096 + 8; k++) {
    const uint32_t d = k < 4096 ? (uint32_t)k + 1 : big[k - 4096];
    const pmla_fastdiv f = pmla_fastdiv_make(d);
    const uint32_t edge[] = {0, 1, d - 1, d, d + 1, 2 * d - 1, 0x7ffffffeu, 0x7fffffffu};
    for (int i = 0; i < 8 + 64; i++) {
      uint32_t n = i < 8 ? edge[i] : (uint32_t)(rng_next(&rng) >> 33);
      if (n > 0x7fffffffu)
        continue;
      EXPECT(pmla_fastdiv_q(f, n) == n / d && pmla_fastdiv_r(f, n) == n % d,
             "%u / %u: got %u rem %u", n, d, pmla_fastdiv_q(f, n), pmla_fastdiv_r(f, n));
    }
  }
}
END_TEST

/* pmla_fastdiv_make's words equal the round-up method's definition (shift
 * = ceil(log2 d), mul = floor(2^32 (2^shift - d) / d) + 1, by integer
 * division here): every divisor below 2^20, the 16 below 2^26 whose
 * reciprocal estimate of mul's quotient is one too high, random ones up
 * to 2^31 */
START_TEST(test_fastdiv_make_gives_the_round_up_multiplier) {
  uint64_t rng = harness_seed() ^ 0xd1f2u;
  static const uint32_t corrected[] = {6087579,  9110917,  10325701, 12175158, 18139745, 18221834,
                                       20651402, 22321123, 24350316, 35766739, 36279490, 36443668,
                                       41302804, 44642246, 48700632, 48912491};
  const uint32_t nc = sizeof corrected / sizeof corrected[0], all = (1u << 20) + nc + 200000;
  for (uint32_t k = 1; k < all; k++) {
    const uint32_t d = k < (1u << 20)        ? k
                       : k < (1u << 20) + nc ? corrected[k - (1u << 20)]
                                             : 1 + (uint32_t)(rng_next(&rng) >> 33);
    uint32_t shift = 0;
    while ((1ull << shift) < d)
      shift++;
    const uint32_t mul = (uint32_t)(((1ull << 32) * ((1ull << shift) - d)) / d + 1);
    const pmla_fastdiv f = pmla_fastdiv_make(d);
    EXPECT(f.d == d && f.shift == shift && f.mul == mul, "pmla_fastdiv_make(%u): mul %u shift %u; the definition: mul %u shift %u", d,
           f.mul, f.shift, mul, shift);
  }
  const pmla_fastdiv z = pmla_fastdiv_make(0); /* taken as 1 */
  EXPECT(z.d == 1 && z.shift == 0 && z.mul == 1, "pmla_fastdiv_make(0): d %u mul %u shift %u",
         z.d, z.mul, z.shift);
}
END_TEST

Suite *suite_planner(void) {
  Suite *s = suite_create("planner");
  TCase *tc = tcase_create("invariants");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_planner_invariants_hold_on_random_batches);
  tcase_add_test(tc, test_planner_honours_split_cap_on_adversarial_batches);
  tcase_add_test(tc, test_planner_packs_whole_requests_within_the_slack);
  tcase_add_test(tc, test_planner_fill_step_and_pieces_equal_the_walk);
  tcase_add_test(tc, test_planner_invariants_hold_for_batch_zero_and_zero_lengths);
  tcase_add_test(tc, test_planner_invariants_hold_for_huge_lengths_without_overflow);
  tcase_add_test(tc, test_planner_flags_bad_input_and_writes_within_its_buffers);
  tcase_add_test(tc, test_sparse_split_cap_matches_its_table_and_an_independent_formula);
  tcase_add_test(tc, test_fastdiv_equals_integer_division);
  tcase_add_test(tc, test_fastdiv_make_gives_the_round_up_multiplier);
  suite_add_tcase(s, tc);
  return s;
}
