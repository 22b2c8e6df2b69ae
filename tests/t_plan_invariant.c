/* SPDX-License-Identifier: MIT */
/* t_plan_invariant.c - white-box: the batch-invariant schedule
 * (kernels/plan_invariant.h) on random batches. Each request's items are its
 * chunks, in order, with boundaries fixed by its length alone; a request
 * kept whole runs on one unit and folds into that unit's accumulator; a
 * split one folds its first piece into its own slot and leaves one partial
 * per later chunk, listed in chunk order for the reduce; slots stay within
 * the budget, items and reduce entries within their buffers. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "fold.h"
#include "plan_invariant.h"

typedef struct inv_buffers {
  int32_t meta[PMLA_META_WORDS_], *indptr, *wi, *rindptr, *rfinal, *rmap;
} inv_buffers;

/* Work item i's cost: its blocks plus the overhead of an item. */
static int64_t item_cost(const inv_buffers *b, int32_t i) {
  const int32_t *w = b->wi + (int64_t)i * PMLA_WI_WORDS;
  return PMLA_SPLIT_OVERHEAD + pmla_plan_blocks(w[PMLA_WI_KV_END] - w[PMLA_WI_KV_BEGIN]);
}

/* Each unit's work; returns the heaviest unit's, and the step's total in
 * *total. */
static int64_t heaviest_unit(const pmla_plan_input *in, const inv_buffers *b, int64_t *total) {
  int64_t worst = 0;
  *total = 0;
  for (int32_t u = 0; u < in->num_units; u++) {
    int64_t load = 0;
    for (int32_t i = b->indptr[u]; i < b->indptr[u + 1]; i++)
      load += item_cost(b, i);
    worst = load > worst ? load : worst;
    *total += load;
  }
  return worst;
}

/* The six buffers of a step, sized by in (max_items, max_partials). */
static pmla_plan_output inv_buffers_alloc(inv_buffers *b, const pmla_plan_input *in) {
  memset(b, 0, sizeof *b);
  b->indptr = calloc((size_t)in->num_units + 1, sizeof(int32_t));
  b->wi = calloc((size_t)in->max_items * PMLA_WI_WORDS, sizeof(int32_t));
  b->rindptr = calloc((size_t)in->num_requests + 1, sizeof(int32_t));
  b->rfinal = calloc((size_t)in->num_requests + 1, sizeof(int32_t));
  b->rmap = calloc((size_t)in->max_partials, sizeof(int32_t));
  ck_assert(b->indptr && b->wi && b->rindptr && b->rfinal && b->rmap);
  const pmla_plan_output out = {b->meta, b->indptr, b->wi, b->rindptr, b->rfinal, b->rmap};
  return out;
}

static void inv_buffers_free(inv_buffers *b) {
  free(b->indptr);
  free(b->wi);
  free(b->rindptr);
  free(b->rfinal);
  free(b->rmap);
}

static void check_schedule(const pmla_plan_input *in, const int32_t *lens, const inv_buffers *b,
                           const char *what) {
  const int32_t R = in->num_requests, N = in->num_units, budget = in->max_partials - N;
  const int32_t least = pmla_inv_least(in->uniform_len, in->inv_least);
  const int32_t items = b->meta[PMLA_META_NUM_ITEMS], reduces = b->meta[PMLA_META_NUM_REDUCE];
  int32_t scratch = 0;
  const pmla_inv_sums sums = pmla_inv_sum(in, &scratch);
  const int place = pmla_inv_placement(R, N, budget, &sums);
  EXPECT(b->meta[PMLA_META_MODE] == 2, "%s: mode %d", what, b->meta[PMLA_META_MODE]);
  EXPECT(b->meta[PMLA_META_NUM_PARTIALS] <= budget, "%s: %d slots over the budget %d", what,
         b->meta[PMLA_META_NUM_PARTIALS], budget);
  EXPECT(b->indptr[0] == 0 && b->indptr[N] == items, "%s: work_indptr ends", what);
  EXPECT(place != PMLA_INV_PLACE_WHOLE || reduces == 0, "%s: requests spread whole, yet %d split",
         what, reduces);
  EXPECT(items == sums.chunks, "%s: %d items for %lld chunks", what, items, (long long)sums.chunks);
  /* item_of[off[r] + j]: the item of chunk j of request r */
  int32_t *unit_of = malloc(sizeof(int32_t) * (size_t)(items + 1));
  int32_t *off = malloc(sizeof(int32_t) * (size_t)(R + 1));
  int32_t *item_of = malloc(sizeof(int32_t) * (size_t)(items + 1));
  ck_assert(unit_of && off && item_of);
  for (int32_t u = 0; u < N; u++) {
    EXPECT(b->indptr[u] <= b->indptr[u + 1], "%s: work_indptr not monotone at %d", what, u);
    for (int32_t k = b->indptr[u]; k < b->indptr[u + 1]; k++)
      unit_of[k] = u;
  }
  off[0] = 0;
  for (int32_t r = 0; r < R; r++)
    off[r + 1] =
        off[r] + pmla_inv_chunks(lens[r], pmla_inv_chunk(lens[r], in->uniform_len, in->inv_least));
  for (int32_t i = 0; i < items; i++)
    item_of[i] = -1;
  for (int32_t k = 0; k < items; k++) {
    const int32_t *w = b->wi + (int64_t)k * PMLA_WI_WORDS, r = w[PMLA_WI_REQUEST];
    const int32_t j = w[PMLA_WI_PIECE] & PMLA_WI_CHUNK_MASK;
    EXPECT(r >= 0 && r < R && j < off[r + 1] - off[r], "%s: item %d is chunk %d of request %d",
           what, k, j, r);
    EXPECT(item_of[off[r] + j] < 0, "%s: request %d has two chunks %d", what, r, j);
    item_of[off[r] + j] = k;
  }
  int32_t red = 0;
  for (int32_t r = 0; r < R; r++) {
    const int32_t L = lens[r], C = pmla_inv_chunk(L, in->uniform_len, in->inv_least);
    const int32_t n = pmla_inv_chunks(L, C);
    EXPECT(n <= PMLA_INV_MAX_CHUNKS && C % PMLA_BLOCK_TOKENS == 0 && C >= least,
           "%s: request %d (len %d): chunk %d, %d chunks", what, r, L, C, n);
    const int split = red < reduces && b->rfinal[red] == r;
    EXPECT(place != PMLA_INV_PLACE_PIECES || split == (n > 1),
           "%s: pieces spread, request %d of %d chunks %s", what, r, n,
           split ? "split" : "whole");
    const int32_t *at = item_of + off[r], first_unit = unit_of[at[0]];
    /* split: the first piece, chunks 0..a-1 (one partial), then one each */
    const int32_t a = split ? n + 1 - (b->rindptr[red + 1] - b->rindptr[red]) : n;
    EXPECT(!split || (a >= 1 && a < n && (place != PMLA_INV_PLACE_PIECES || a == 1)),
           "%s: split request %d: first piece %d of %d chunks", what, r, a, n);
    for (int32_t j = 0; j < n; j++) {
      const int32_t k = at[j], *w = b->wi + (int64_t)k * PMLA_WI_WORDS;
      const int32_t kb = (int32_t)((int64_t)j * C < L ? (int64_t)j * C : L);
      const int32_t ke = (int32_t)((int64_t)(j + 1) * C < L ? (int64_t)(j + 1) * C : L);
      EXPECT(w[PMLA_WI_KV_BEGIN] == kb && w[PMLA_WI_KV_END] == ke && w[PMLA_WI_KV_LEN] == L,
             "%s: item %d is not chunk %d [%d, %d) of request %d", what, k, j, kb, ke, r);
      const int32_t flags = w[PMLA_WI_PIECE] & ~PMLA_WI_CHUNK_MASK, slot = w[PMLA_WI_PARTIAL];
      if (!split) { /* consecutive on one unit: they fold in its one accumulator */
        EXPECT(unit_of[k] == first_unit && k == at[0] + j,
               "%s: whole request %d: chunk %d is item %d on unit %d, chunk 0 item %d on %d", what,
               r, j, k, unit_of[k], at[0], first_unit);
        const int32_t want = n == 1       ? 0
                             : j == 0     ? PMLA_WI_KEEP
                             : j == n - 1 ? PMLA_WI_FOLD | PMLA_WI_FINAL
                                          : PMLA_WI_FOLD | PMLA_WI_KEEP;
        EXPECT(flags == want && slot == (n == 1 ? -1 : budget + first_unit),
               "%s: whole request %d chunk %d: flags 0x%x slot %d", what, r, j, flags, slot);
        continue;
      }
      const int32_t p0 = b->rindptr[red];
      if (j < a) { /* the first piece: in order on one unit, folding in its slot */
        EXPECT(slot == b->rmap[p0] &&
                   flags == ((j ? PMLA_WI_FOLD : 0) | (j < a - 1 ? PMLA_WI_KEEP : 0)) &&
                   unit_of[k] == first_unit && (j == 0 || k > at[j - 1]),
               "%s: split request %d first-piece chunk %d: flags 0x%x slot %d item %d unit %d",
               what, r, j, flags, slot, k, unit_of[k]);
      } else {
        EXPECT(flags == 0 && slot == b->rmap[p0 + 1 + (j - a)] &&
                   (place != PMLA_INV_PLACE_LINE || unit_of[k] > first_unit),
               "%s: split request %d chunk %d: flags 0x%x slot %d unit %d", what, r, j, flags,
               slot, unit_of[k]);
      }
    }
    if (split) {
      for (int32_t q = b->rindptr[red]; q < b->rindptr[red + 1]; q++)
        EXPECT(b->rmap[q] >= 0 && b->rmap[q] < budget, "%s: slot %d outside the budget", what,
               b->rmap[q]);
      red++;
    }
  }
  EXPECT(red == reduces, "%s: %d reduces left over", what, reduces - red);
  int32_t most_merged = R > 0; /* pmla.h's work_meta_data word 4 (0: no requests) */
  for (int32_t k = 0; k < reduces; k++)
    if (b->rindptr[k + 1] - b->rindptr[k] > most_merged)
      most_merged = b->rindptr[k + 1] - b->rindptr[k];
  EXPECT(b->meta[PMLA_META_MAX_PIECES] == most_merged,
         "%s: work_meta_data most pieces %d, its largest reduce entry merges %d slots", what,
         b->meta[PMLA_META_MAX_PIECES], most_merged);
  /* balance: spread, no unit holds more than an equal share of all the work
   * plus the costliest request or piece; on the line, while the split
   * budget never ran short (a request that would overrun it stays whole,
   * wherever its chunks fall), more than the share plus one chunk */
  int64_t total, chunk_max = 0;
  const int64_t worst = heaviest_unit(in, b, &total);
  for (int32_t i = 0; i < items; i++)
    chunk_max = item_cost(b, i) > chunk_max ? item_cost(b, i) : chunk_max;
  const int64_t share = (total + N - 1) / N;
  const int64_t most = place == PMLA_INV_PLACE_WHOLE ? sums.max_cost : sums.max_piece;
  if (place != PMLA_INV_PLACE_LINE)
    EXPECT(worst <= share + most,
           "%s: spread, a unit holds %lld blocks of work, over the share %lld plus a piece %lld",
           what, (long long)worst, (long long)share, (long long)most);
  else if (b->meta[PMLA_META_NUM_PARTIALS] + 1 + PMLA_INV_MAX_CHUNKS <= budget)
    EXPECT(worst <= share + chunk_max,
           "%s: a unit holds %lld blocks of work, over the share %lld plus a chunk %lld", what,
           (long long)worst, (long long)share, (long long)chunk_max);
  free(item_of);
  free(off);
  free(unit_of);
}

/* What one planned batch came to. */
typedef struct case_result {
  int split, place;     /* requests split; the placement (PMLA_INV_PLACE_*) */
  int64_t worst, share; /* the heaviest unit's work, and an equal share */
} case_result;

enum { LENS_MIXED, LENS_RAGGED, LENS_16K, LENS_32K, LENS_64K, LENS_128K };
/* the length of every request of the batches of one length */
static const int32_t equal_len[] = {[LENS_16K] = 16384, [LENS_32K] = 32768,
                                    [LENS_64K] = 65536, [LENS_128K] = 131072};

/* Plans one random batch and checks it: lengths of every kind from 0 to
 * 300000 (LENS_MIXED), 2048..6144 tokens (LENS_RAGGED) or all one length
 * (LENS_16K .. LENS_128K); slot_units: the split budget's slots per unit;
 * asked: the builder's invariant_chunk (0: pmla's). */
static case_result run_case(uint64_t *rng, int32_t R, int32_t N, int sparse, int lens_kind,
                            int32_t slot_units, int32_t asked, const char *what) {
  int32_t *lens = malloc(sizeof(int32_t) * (size_t)(R + 1));
  int32_t *qo = malloc(sizeof(int32_t) * (size_t)(R + 1));
  ck_assert(lens && qo);
  const int32_t topk = sparse ? 64 * (1 + (int32_t)rng_below(rng, 64)) : 0;
  qo[0] = 0;
  for (int32_t r = 0; r < R; r++) {
    const uint32_t kind = rng_below(rng, 10);
    lens[r] = sparse   ? topk
              : lens_kind == LENS_RAGGED ? 2048 + (int32_t)rng_below(rng, 4097)
              : lens_kind >= LENS_16K    ? equal_len[lens_kind]
              : kind == 0 ? 0
              : kind < 5  ? (int32_t)rng_below(rng, 3000)
              : kind < 9  ? (int32_t)rng_below(rng, 40000)
                          : 100000 + (int32_t)rng_below(rng, 200000);
    qo[r + 1] = qo[r] + (sparse ? 1 : 1 + (int32_t)rng_below(rng, 2));
  }
  pmla_plan_input in;
  memset(&in, 0, sizeof in);
  in.num_requests = R;
  in.num_units = N;
  in.max_q_len = 2;
  in.qo_indptr = sparse ? NULL : qo;
  in.kv_lens = sparse ? NULL : lens;
  in.max_kv_len = INT32_MAX;
  in.uniform_len = topk;
  in.page_size = 16;
  in.max_items = R * PMLA_INV_MAX_CHUNKS + N;
  in.max_partials = (slot_units + 1) * N;
  in.invariant = 1;
  in.inv_least = asked;
  inv_buffers b;
  const pmla_plan_output out = inv_buffers_alloc(&b, &in);
  const int32_t err = pmla_plan_invariant(&in, &out);
  EXPECT(err == 0, "%s: planner error bits 0x%x", what, err);
  check_schedule(&in, lens, &b, what);
  case_result res;
  int32_t scratch = 0;
  const pmla_inv_sums sums = pmla_inv_sum(&in, &scratch);
  res.split = b.meta[PMLA_META_NUM_REDUCE];
  res.place = pmla_inv_placement(R, N, in.max_partials - N, &sums);
  int64_t total;
  res.worst = heaviest_unit(&in, &b, &total);
  res.share = (total + N - 1) / N;
  inv_buffers_free(&b);
  free(lens);
  free(qo);
  return res;
}

START_TEST(test_invariant_schedule_holds_its_layout_on_random_batches) {
  uint64_t rng = harness_seed() ^ 0x1a7u;
  static const int32_t units[] = {1, 2, 7, 66, 132};
  int splits = 0, places[3] = {0, 0, 0};
  for (int i = 0; i < 300; i++) {
    char what[80];
    const int32_t R = i % 5 == 0 ? 1 : 1 + (int32_t)rng_below(&rng, i % 3 ? 16 : 300);
    const int32_t N = units[rng_below(&rng, 5)];
    const int sparse = i % 4 == 3, ragged = i % 7 == 2;
    snprintf(what, sizeof what, "case %d (%d requests, %d units%s%s%s)", i, R, N,
             sparse ? ", sparse" : "", ragged ? ", ragged" : "", i % 3 == 1 ? ", asked chunk" : "");
    /* every third batch with a least chunk of the host's, 64..8192 */
    const int32_t asked = i % 3 == 1 ? 64 << rng_below(&rng, 8) : 0;
    const case_result c = run_case(&rng, R, N, sparse, ragged ? LENS_RAGGED : LENS_MIXED,
                                   PMLA_INV_SLOT_UNITS, asked, what);
    splits += c.split > 0;
    places[c.place] += N > 1;
  }
  ck_assert_msg(splits > 0 && places[0] > 0 && places[1] > 0 && places[2] > 0,
                "300 batches: %d split a request; on several units %d on the line, %d with "
                "requests spread whole, %d with pieces spread: the test proves too little",
                splits, places[0], places[1], places[2]);
}
END_TEST

/* Fewer requests than units, each within 1.25 units' shares: spread, one
 * request a unit, no split (on the line, 60 requests of 16384 tokens on
 * 66 units split so many that a budget of 4 slots a unit ran out: 1.6x the
 * default mode's time); 50 of them are 1.32 shares each, and their 400
 * chunks fit the budget of 528 slots as pieces (on the line, with 264
 * slots, the requests left over stayed whole: 2x the share). */
START_TEST(test_fewer_requests_than_units_take_one_unit_each) {
  uint64_t rng = 7;
  case_result c = run_case(&rng, 60, 66, 0, LENS_16K, PMLA_INV_SLOT_UNITS, 0,
                           "60 requests of 16384 tokens, 66 units");
  /* one request a unit: 8 chunks of 2048 tokens */
  EXPECT(c.place == PMLA_INV_PLACE_WHOLE && c.split == 0 &&
             c.worst == 8 * PMLA_SPLIT_OVERHEAD + 16384 / PMLA_BLOCK_TOKENS,
         "60 x 16384 tokens on 66 units: %s, %d split, heaviest unit %lld",
         c.place == PMLA_INV_PLACE_WHOLE ? "spread" : "not spread whole", c.split,
         (long long)c.worst);
  c = run_case(&rng, 50, 66, 0, LENS_16K, PMLA_INV_SLOT_UNITS, 0,
               "50 requests of 16384 tokens, 66 units");
  EXPECT(c.place == PMLA_INV_PLACE_PIECES && c.split == 50 && c.worst * 100 <= c.share * 120,
         "50 x 16384 tokens on 66 units: placement %d, %d split, heaviest unit %lld against a "
         "share of %lld",
         c.place, c.split, (long long)c.worst, (long long)c.share);
}
END_TEST

/* Fewer pieces than units: each dealt to one unit, in rank order, every
 * piece once, the units taken spaced evenly (gaps differ by at most one). */
START_TEST(test_fewer_pieces_than_units_are_spaced_evenly) {
  for (int32_t N = 2; N <= PMLA_INV_DEAL_MAX; N += N < 40 ? 1 : 23)
    for (int32_t P = 1; P < N; P += P < 30 ? 1 : 17) {
      int32_t last = -1, gap_lo = N, gap_hi = 0;
      for (int32_t u = 0; u < N; u++) {
        const int32_t i = pmla_inv_spaced_rank(u, N, P);
        if (i < 0)
          continue;
        EXPECT(i < P && i == last + 1, "N %d P %d: unit %d gets rank %d after %d", N, P, u, i,
               last);
        last = i;
      }
      EXPECT(last == P - 1, "N %d P %d: ranks up to %d dealt", N, P, last);
      int32_t prev = -1;
      for (int32_t u = 0; u < N; u++)
        if (pmla_inv_spaced_rank(u, N, P) >= 0) {
          if (prev >= 0) {
            gap_lo = u - prev < gap_lo ? u - prev : gap_lo;
            gap_hi = u - prev > gap_hi ? u - prev : gap_hi;
          }
          prev = u;
        }
      EXPECT(P < 2 || gap_hi - gap_lo <= 1, "N %d P %d: gaps %d..%d", N, P, gap_lo, gap_hi);
    }
}
END_TEST


/* The ragged batch of the bench's dense suite (128 requests of 2048..6144
 * tokens) on 66 units (128 heads on 132 compute units): requests spread
 * whole, the heaviest unit at most 1.15 times an equal share of the work
 * (1.03-1.13 over these seeds: a batch with more than 66 requests of three
 * chunks must pair two of them on a unit; their chunks placed along the
 * line: 1.18-1.36). On 132 units (64 heads or fewer), where a third of
 * the requests are longer than a share, every request of several chunks
 * is split into its chunks and the pieces are dealt: at most 1.15 too
 * (1.6-1.8 on the line). */
START_TEST(test_a_ragged_batch_is_spread_evenly) {
  for (uint64_t seed = 1; seed <= 20; seed++)
    for (int wide = 0; wide < 2; wide++) {
      uint64_t rng = seed * 0x9e3779b97f4a7c15ull;
      char what[64];
      snprintf(what, sizeof what, "ragged batch on %d units, seed %llu", wide ? 132 : 66,
               (unsigned long long)seed);
      const case_result c = run_case(&rng, 128, wide ? 132 : 66, 0, LENS_RAGGED,
                                     PMLA_INV_SLOT_UNITS, 0, what);
      EXPECT(c.place == (wide ? PMLA_INV_PLACE_PIECES : PMLA_INV_PLACE_WHOLE) &&
                 c.worst * 100 <= c.share * 115,
             "%s: placement %d, the heaviest unit holds %lld blocks of work against a share of "
             "%lld",
             what, c.place, (long long)c.worst, (long long)c.share);
    }
}
END_TEST

/* run_case on R requests of one length (LENS_16K .. LENS_128K), named in what */
static case_result run_equal(uint64_t seed, int32_t R, int32_t N, int lens_kind,
                             int32_t slot_units, char *what, size_t size) {
  uint64_t rng = seed;
  snprintf(what, size, "%d requests of %d tokens, %d units", R, equal_len[lens_kind], N);
  return run_case(&rng, R, N, 0, lens_kind, slot_units, 0, what);
}

/* Equal requests a little more than the units: dealt whole, some unit
 * holds two (80 of 16384 tokens on 66 units: 14 do, 1.65x a share), so
 * they are cut into chunks instead */
START_TEST(test_equal_requests_outnumbering_the_units_are_cut) {
  static const struct {
    int32_t R, N, lens;
  } cases[] = {{80, 66, LENS_16K}, {70, 66, LENS_32K}, {96, 66, LENS_16K}, {160, 132, LENS_16K}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char what[80];
    /* the budget of a 128-head builder: on the line 70 x 32768 needs 8 a unit */
    const case_result c = run_equal(0x51077u + i, cases[i].R, cases[i].N, cases[i].lens,
                                    pmla_inv_slot_units(128, cases[i].N), what, sizeof what);
    EXPECT(c.place != PMLA_INV_PLACE_WHOLE && c.worst * 100 <= c.share * 110,
           "%s: placement %d, the heaviest unit holds %lld blocks of work against a share of "
           "%lld",
           what, c.place, (long long)c.worst, (long long)c.share);
  }
}
END_TEST

/* Batches of long requests with fewer than half as many requests as units
 * stay on the line, and most of their chunks past a request's first unit
 * each take a slot of the split budget. With 4 slots a unit these batches
 * ran out of it: the requests left over stayed whole, each on one unit, 2.0
 * to 4.3x the share (the H200 took 1240 us for b=20 L=32768 h=128 where the
 * default mode takes 316). The budget holds their splits now. */
START_TEST(test_long_requests_on_the_line_split_within_the_budget) {
  static const struct {
    int32_t R, N, lens;
  } cases[] = {{20, 66, LENS_32K}, {28, 66, LENS_32K}, {16, 66, LENS_64K},
               {40, 132, LENS_32K}, {60, 132, LENS_32K}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char what[80];
    const case_result c = run_equal(0x51075u + i, cases[i].R, cases[i].N, cases[i].lens,
                                    PMLA_INV_SLOT_UNITS, what, sizeof what);
    EXPECT(c.place == PMLA_INV_PLACE_LINE && c.split == cases[i].R &&
               c.worst * 100 <= c.share * 112,
           "%s: placement %d, %d requests split, the heaviest unit holds %lld blocks of work "
           "against a share of %lld",
           what, c.place, c.split, (long long)c.worst, (long long)c.share);
  }
}
END_TEST

/* Builders whose slots are small get more of them: a few dozen requests of
 * 131072 tokens split on the line within their builder's budget (with 8
 * slots a unit the requests past it stayed whole: 2.7-6.8x a share) */
START_TEST(test_long_requests_fit_the_budget_of_small_slots) {
  static const struct {
    int32_t R, N, rows;
  } cases[] = {{20, 132, 16}, {40, 132, 16}, {56, 132, 16}, {12, 66, 128}, {16, 132, 64}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint64_t rng = 0x51076u + i;
    const int32_t units = pmla_inv_slot_units(cases[i].rows, cases[i].N);
    char what[96];
    snprintf(what, sizeof what,
             "%d requests of 131072 tokens, %d units, %d rows a slot (%d slots a unit)",
             cases[i].R, cases[i].N, cases[i].rows, units);
    const case_result c = run_case(&rng, cases[i].R, cases[i].N, 0, LENS_128K, units, 0, what);
    EXPECT(c.place == PMLA_INV_PLACE_LINE && c.split == cases[i].R &&
               c.worst * 100 <= c.share * 105,
           "%s: placement %d, %d requests split, the heaviest unit holds %lld blocks of work "
           "against a share of %lld",
           what, c.place, c.split, (long long)c.worst, (long long)c.share);
  }
  /* the budget: 8 slots a unit where slots are large, at most 64, and all
   * of them within 256 MiB whenever more than 8 */
  EXPECT(pmla_inv_slot_units(128, 66) == 15 && pmla_inv_slot_units(16, 132) == 62 &&
             pmla_inv_slot_units(512, 66) == PMLA_INV_SLOT_UNITS &&
             pmla_inv_slot_units(1, 4) == PMLA_INV_SLOT_UNITS_MAX,
         "slots a unit: %d %d %d %d", pmla_inv_slot_units(128, 66), pmla_inv_slot_units(16, 132),
         pmla_inv_slot_units(512, 66), pmla_inv_slot_units(1, 4));
}
END_TEST

/* The chunk boundaries: a function of the length (and dense / sparse, and
 * the builder's invariant_chunk) alone, at most PMLA_INV_MAX_CHUNKS, whole
 * blocks, covering the request; a dense request of at most twice the least
 * chunk is one */
START_TEST(test_chunk_size_is_a_function_of_the_length) {
  static const int32_t asked[] = {0, 64, 1024, 4096, 8192, PMLA_INV_MAX_LEAST};
  EXPECT(pmla_inv_least(0, 0) == PMLA_INV_MIN_CHUNK &&
             pmla_inv_least(1, 0) == PMLA_INV_MIN_CHUNK_SPARSE && pmla_inv_least(1, 4096) == 4096,
         "least chunks %d %d %d", pmla_inv_least(0, 0), pmla_inv_least(1, 0),
         pmla_inv_least(1, 4096));
  for (size_t a = 0; a < sizeof asked / sizeof asked[0]; a++)
    for (int32_t L = 0; L < 5000000; L = L * 3 / 2 + 1) {
      for (int sparse = 0; sparse < 2; sparse++) {
        const int32_t least = pmla_inv_least(sparse, asked[a]);
        const int32_t C = pmla_inv_chunk(L, sparse, asked[a]), n = pmla_inv_chunks(L, C);
        EXPECT(C >= least && C % PMLA_BLOCK_TOKENS == 0, "len %d: chunk %d", L, C);
        EXPECT(n >= 1 && n <= PMLA_INV_MAX_CHUNKS, "len %d: %d chunks", L, n);
        EXPECT(sparse || L > 2 * least || n == 1, "len %d: %d dense chunks", L, n);
        EXPECT(n == 1 || C == least || (int64_t)(C - PMLA_BLOCK_TOKENS) * PMLA_INV_MAX_CHUNKS < L,
               "len %d, least %d: chunk %d larger than 64 chunks need", L, least, C);
        EXPECT(L == 0 || ((int64_t)(n - 1) * C < L && (int64_t)n * C >= L),
               "len %d: %d chunks of %d do not cover it exactly", L, n, C);
      }
    }
}
END_TEST

/* The closed forms the device places requests with in parallel: a chunk's
 * start on the line and the unit holding a position equal the serial
 * planner's running sum and search */
START_TEST(test_closed_forms_equal_the_serial_walk) {
  uint64_t rng = harness_seed() ^ 0x2b8u;
  for (int i = 0; i < 200000; i++) {
    const int32_t L = (int32_t)rng_below(&rng, i % 2 ? 5000 : 3000000);
    const int32_t C = pmla_inv_chunk(L, i % 3 == 0, i % 4 ? 0 : 64 << (i % 9));
    const int32_t n = pmla_inv_chunks(L, C);
    const int64_t cum = (int64_t)rng_below(&rng, 1u << 30);
    int64_t c = cum;
    for (int32_t j = 0; j < n; j++) {
      EXPECT(pmla_inv_chunk_start(cum, C, j) == c, "len %d: chunk %d starts at %" PRId64
             ", the walk at %" PRId64, L, j, pmla_inv_chunk_start(cum, C, j), c);
      c += PMLA_SPLIT_OVERHEAD + pmla_inv_chunk_blocks(L, C, j);
    }
    EXPECT(c - cum == pmla_inv_cost(n, pmla_plan_blocks(L)), "len %d: cost", L);
    const int32_t N = 1 + (int32_t)rng_below(&rng, 2048);
    const int64_t total = 1 + (int64_t)rng_below(&rng, 1u << 31) * (1 + i % 7);
    int64_t x2 = (int64_t)rng_below(&rng, 1u << 31) * (int64_t)(1 + i % 5) % (2 * total + 9);
    if (i % 2) { /* at a unit boundary (x2 * N a multiple of 2 * total) and beside it */
      const int64_t t2 = 1 + (int64_t)rng_below(&rng, 4000), u = (int64_t)rng_below(&rng, 2049);
      int64_t at = (2 * t2 * u + N - 1) / N + (int64_t)rng_below(&rng, 3) - 1;
      at = at < 0 ? 0 : at;
      EXPECT(pmla_inv_unit_at(at, N, t2) == pmla_inv_unit_from(0, at, N, t2),
             "x2 %" PRId64 " N %d total %" PRId64 ": unit %d, the search %d", at, N, t2,
             pmla_inv_unit_at(at, N, t2), pmla_inv_unit_from(0, at, N, t2));
    }
    EXPECT(pmla_inv_unit_at(x2, N, total) == pmla_inv_unit_from(0, x2, N, total),
           "x2 %" PRId64 " N %d total %" PRId64 ": unit %d, the search %d", x2, N, total,
           pmla_inv_unit_at(x2, N, total), pmla_inv_unit_from(0, x2, N, total));
  }
}
END_TEST

/* The one merge (fold.h), host form: a side that saw nothing (lse -inf)
 * leaves the other exactly, a NaN on either side reaches the weights and
 * the lse, and otherwise the weights are the two sides' shares of the
 * merged sum, which is log(e^a + e^c) */
START_TEST(test_the_fold_merges_two_softmax_results) {
  const float inf = INFINITY;
  pmla_fold_w w = pmla_fold_weights(1.5f, -inf);
  EXPECT(w.wa == 1.f && w.wc == 0.f && w.lse == 1.5f, "chunk -inf: %g %g %g", w.wa, w.wc, w.lse);
  w = pmla_fold_weights(-inf, -2.25f);
  EXPECT(w.wa == 0.f && w.wc == 1.f && w.lse == -2.25f, "acc -inf: %g %g %g", w.wa, w.wc, w.lse);
  w = pmla_fold_weights(-inf, -inf);
  EXPECT(w.wa == 1.f && w.wc == 0.f && w.lse == -inf, "both -inf: %g %g %g", w.wa, w.wc, w.lse);
  w = pmla_fold_weights(NAN, 0.5f);
  EXPECT(isnan(w.wa) && isnan(w.wc) && isnan(w.lse), "acc NaN: %g %g %g", w.wa, w.wc, w.lse);
  w = pmla_fold_weights(0.5f, NAN);
  EXPECT(isnan(w.wa) && isnan(w.wc) && isnan(w.lse), "chunk NaN: %g %g %g", w.wa, w.wc, w.lse);
  EXPECT(pmla_fold(2.f, 3.f, pmla_fold_weights(1.f, -inf)) == 2.f, "a merge with nothing");
  uint64_t rng = harness_seed() ^ 0xf01du;
  for (int i = 0; i < 100000; i++) {
    const float a = (float)(rng_uniform(&rng) * 200.0 - 100.0);
    const float c = a + (float)(rng_uniform(&rng) * 60.0 - 30.0);
    w = pmla_fold_weights(a, c);
    const double m = a > c ? a : c, sum = exp(a - m) + exp(c - m);
    EXPECT(fabs(w.lse - (m + log(sum))) <= 1e-5 * (1.0 + fabs(m)), "lse(%g, %g) = %.9g", a, c,
           w.lse);
    EXPECT(fabs(w.wa - exp(a - m) / sum) <= 1e-6 && fabs(w.wc - exp(c - m) / sum) <= 1e-6,
           "weights(%g, %g) = %.9g %.9g", a, c, w.wa, w.wc);
  }
}
END_TEST

/* Plans a default-mode dense step of lens on N units with pmla_plan_step;
 * returns its mode word. When it deals the requests whole (mode 3): one
 * item a request over its whole range with no partial slot, no reduce, and
 * no unit above P + OH (P = ceil(C/N) + OH, the fill's capacity). */
static int32_t default_step(const int32_t *lens, int32_t R, int32_t N, const char *what) {
  int32_t *qo = malloc(sizeof(int32_t) * (size_t)(R + 1));
  ck_assert(qo);
  int64_t C = 0;
  for (int32_t r = 0; r <= R; r++)
    qo[r] = r;
  for (int32_t r = 0; r < R; r++)
    C += PMLA_SPLIT_OVERHEAD + pmla_plan_blocks(lens[r]);
  pmla_plan_input in;
  memset(&in, 0, sizeof in);
  in.num_requests = R;
  in.num_units = N;
  in.max_q_len = 1;
  in.qo_indptr = qo;
  in.kv_lens = lens;
  in.max_kv_len = INT32_MAX;
  in.page_size = 64;
  in.max_items = R + N;
  in.max_partials = 2 * N;
  inv_buffers b;
  const pmla_plan_output out = inv_buffers_alloc(&b, &in);
  EXPECT(pmla_plan_step(&in, &out) == 0, "%s: planner error", what);
  const int32_t mode = b.meta[PMLA_META_MODE];
  if (mode == PMLA_DEALT_MODE) {
    const int64_t limit = (C + N - 1) / N + 2 * PMLA_SPLIT_OVERHEAD;
    EXPECT(b.meta[PMLA_META_NUM_ITEMS] == R && b.meta[PMLA_META_NUM_REDUCE] == 0 &&
               b.meta[PMLA_META_NUM_PARTIALS] == 0 && b.indptr[0] == 0 && b.indptr[N] == R,
           "%s: dealt whole, yet %d items, %d reduce entries", what, b.meta[PMLA_META_NUM_ITEMS],
           b.meta[PMLA_META_NUM_REDUCE]);
    int32_t *seen = calloc((size_t)R + 1, sizeof(int32_t));
    ck_assert(seen);
    for (int32_t u = 0; u < N; u++) {
      EXPECT(b.indptr[u] <= b.indptr[u + 1], "%s: work_indptr falls at unit %d", what, u);
      for (int32_t k = b.indptr[u]; k < b.indptr[u + 1]; k++) {
        const int32_t *w = b.wi + (int64_t)k * PMLA_WI_WORDS, r = w[PMLA_WI_REQUEST];
        EXPECT(r >= 0 && r < R && !seen[r]++ && w[PMLA_WI_PARTIAL] == -1 &&
                   w[PMLA_WI_KV_BEGIN] == 0 && w[PMLA_WI_KV_END] == lens[r] &&
                   w[PMLA_WI_PIECE] == 0,
               "%s: item %d (request %d) is not its request whole", what, k, r);
      }
    }
    free(seen);
    int64_t total;
    const int64_t worst = heaviest_unit(&in, &b, &total);
    EXPECT(worst <= limit, "%s: a unit holds %" PRId64 " blocks of work, above P + OH = %" PRId64,
           what, worst, limit);
  }
  free(qo);
  inv_buffers_free(&b);
  return mode;
}

/* The default mode deals a step's requests whole where the fill would
 * split one and the fullest unit then stays within one overhead of the
 * fill's capacity: ragged batches, which the fill splits about one request
 * a unit; equal requests that do not pack into the fill's capacity (100 of
 * 4096 tokens on 66 units: the deal would put two on 34 units) are filled
 * and split, and those the fill packs whole (132 on 66 units) are filled. */
START_TEST(test_default_steps_deal_requests_whole_within_one_overhead) {
  int32_t lens[512];
  for (uint64_t seed = 1; seed <= 20; seed++) {
    uint64_t rng = seed * 0x9e3779b97f4a7c15ull;
    for (int32_t r = 0; r < 128; r++)
      lens[r] = 2048 + (int32_t)rng_below(&rng, 4097);
    char what[64];
    snprintf(what, sizeof what, "ragged batch on 66 units, seed %llu", (unsigned long long)seed);
    const int32_t mode = default_step(lens, 128, 66, what);
    EXPECT(mode == PMLA_DEALT_MODE, "%s: mode %d, want the deal", what, mode);
  }
  for (int32_t r = 0; r < 132; r++)
    lens[r] = 4096;
  EXPECT(default_step(lens, 100, 66, "100 x 4096 on 66 units") == 0, "100 x 4096 dealt");
  EXPECT(default_step(lens, 132, 66, "132 x 4096 on 66 units") == 0,
         "132 x 4096 on 66 units dealt, though the fill splits none");
  EXPECT(default_step(lens, 128, 33, "128 x 4096 on 33 units") == PMLA_DEALT_MODE,
         "128 x 4096 on 33 units filled");
  /* random batches: whatever is dealt keeps the bound */
  uint64_t rng = harness_seed() ^ 0xdea1u;
  for (int i = 0; i < 400; i++) {
    const int32_t R = 1 + (int32_t)rng_below(&rng, 512), N = 1 + (int32_t)rng_below(&rng, 300);
    const uint32_t spread = i % 3 == 0 ? 300 : i % 3 == 1 ? 8000 : 200000;
    for (int32_t r = 0; r < R; r++)
      lens[r] = (int32_t)rng_below(&rng, spread);
    char what[64];
    snprintf(what, sizeof what, "random batch %d (%d requests, %d units)", i, R, N);
    default_step(lens, R, N, what);
  }
}
END_TEST

Suite *suite_plan_invariant(void) {
  Suite *s = suite_create("plan_invariant");
  TCase *tc = tcase_create("layout");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_long_requests_on_the_line_split_within_the_budget);
  tcase_add_test(tc, test_long_requests_fit_the_budget_of_small_slots);
  tcase_add_test(tc, test_chunk_size_is_a_function_of_the_length);
  tcase_add_test(tc, test_invariant_schedule_holds_its_layout_on_random_batches);
  tcase_add_test(tc, test_a_ragged_batch_is_spread_evenly);
  tcase_add_test(tc, test_equal_requests_outnumbering_the_units_are_cut);
  tcase_add_test(tc, test_fewer_pieces_than_units_are_spaced_evenly);
  tcase_add_test(tc, test_fewer_requests_than_units_take_one_unit_each);
  tcase_add_test(tc, test_closed_forms_equal_the_serial_walk);
  tcase_add_test(tc, test_default_steps_deal_requests_whole_within_one_overhead);
  tcase_add_test(tc, test_the_fold_merges_two_softmax_results);
  suite_add_tcase(s, tc);
  return s;
}
