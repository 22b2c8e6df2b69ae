/* SPDX-License-Identifier: MIT */
/* plan_invariant.h - the batch-invariant schedule (builders made with
 * PMLA_BUILDER_BATCH_INVARIANT). A request of length L is read in chunks
 * whose boundaries depend on L alone: chunk size pmla_inv_chunk(L), at most
 * PMLA_INV_MAX_CHUNKS chunks. Every chunk is one work item computed from a
 * fresh softmax state, and the request's result is the left fold of its
 * chunks (fold.h) - the same fold whether the request runs on one unit or
 * is split:
 *   on one unit   chunk 0 writes its result to an accumulator slot (the
 *                 unit's own, after the budget), each later chunk folds
 *                 into it (PMLA_WI_FOLD), the last one then writes out and
 *                 lse (PMLA_WI_FOLD | PMLA_WI_FINAL); one chunk: out directly
 *   split         the first piece (chunks 0..a-1, one unit) folds into a
 *                 slot of its own; every later chunk leaves its own partial;
 *                 the reduce folds [first piece, chunk a, ..., chunk n-1]
 * Where requests go depends on the batch and changes the balance, never
 * the arithmetic. Three placements (pmla_inv_placement):
 *   whole         every request fits 1.25 units' equal shares of all the
 *                 step's work: each request whole on one unit, the
 *                 requests dealt by decreasing cost a round of N at a
 *                 time, each round's heaviest to the least loaded unit
 *                 (ragged batches: the line below leaves up to half a
 *                 request at each end of a unit, 1.3x its share)
 *   pieces        else, with at least half as many requests as units:
 *                 every request of several chunks split into its chunks
 *                 (the first piece chunk 0 alone), and the pieces dealt
 *                 the same way
 *   line          otherwise: each chunk goes to the unit whose equal share
 *                 of the line of all work holds the chunk's midpoint; a
 *                 request whose chunks land on several units is split.
 * The two deals take at most PMLA_INV_DEAL_MAX pieces and units. Splits
 * spend a slot budget fixed at init: max_partials - N slots (the last N are
 * the units' accumulators); on the line a request whose split would not
 * fit the budget stays whole on its unit.
 *
 * Work item word PMLA_WI_PIECE holds the chunk index and the flags below.
 * pmla_plan_invariant is serial; the GPU metadata kernel places the same
 * schedule in parallel: on the line from the closed forms below (a
 * request's line position is a prefix sum of the requests' costs), walking
 * only the split budget in request order when it binds; a deal a round at a
 * time, one unit a thread. */
#ifndef PMLA_PLAN_INVARIANT_H
#define PMLA_PLAN_INVARIANT_H

#include "mla_types.h"
#include "planner.h"

#define PMLA_INV_MIN_CHUNK 2048        /* tokens, dense steps */
#define PMLA_INV_MIN_CHUNK_SPARSE 1024 /* top-k positions, sparse steps */
#define PMLA_INV_MAX_LEAST (1 << 20)   /* the largest least chunk a builder may ask */
/* a least chunk that makes every request one chunk (twice it is 2^30, the
 * longest request): the default mode's whole deal (pmla_plan_step) */
#define PMLA_INV_ONE_CHUNK (1 << 29)
#define PMLA_INV_MAX_CHUNKS 64  /* per request */
#define PMLA_INV_SLOT_UNITS 8   /* the split budget: at least 8 slots per unit, */
#define PMLA_INV_SLOT_UNITS_MAX 64 /* at most 64, */
#define PMLA_INV_SLOT_BYTES (256ll << 20) /* more than 8 while all fit (pmla_inv_slot_units) */
#define PMLA_INV_DEAL_MAX 512 /* pieces and units the deals take */

enum {
  PMLA_WI_CHUNK_MASK = 0xffff,
  /* the result is folded again by a later item of the same unit: it may
   * stay in a layout of the kernel's own choosing (a slot without it holds
   * rows, for the reduce) */
  PMLA_WI_KEEP = 1 << 28,
  PMLA_WI_FINAL = 1 << 29, /* after folding, write out and lse (not the slot) */
  PMLA_WI_FOLD = 1 << 30   /* fold into the slot's accumulator, don't overwrite it */
};

/* Split slots per unit of a builder whose partial slots hold `rows` rows
 * (max_q_len x heads) on N units: PMLA_INV_SLOT_UNITS, or as many more (up
 * to PMLA_INV_SLOT_UNITS_MAX) as fit PMLA_INV_SLOT_BYTES in all. On the
 * line every chunk of a split request past its first unit takes a slot, and
 * a request whose split does not fit stays whole on one unit: a few dozen
 * requests of 65536-131072 tokens need 12-24 slots a unit
 * (docs/performance.md). A slot of 16 rows takes 32 KiB, of 128 rows 256. */
PMLA_HD static inline int32_t pmla_inv_slot_units(int64_t rows, int32_t N) {
  const int64_t slot = (rows > 0 ? rows : 1) * PMLA_V_DIM * 4;
  const int64_t fit = PMLA_INV_SLOT_BYTES / (slot * (N > 0 ? N : 1));
  return fit < PMLA_INV_SLOT_UNITS       ? PMLA_INV_SLOT_UNITS
         : fit > PMLA_INV_SLOT_UNITS_MAX ? PMLA_INV_SLOT_UNITS_MAX
                                         : (int32_t)fit;
}

/* The least chunk of a dense or sparse step: the builder's invariant_chunk
 * (asked, a multiple of PMLA_BLOCK_TOKENS), or pmla's when it is 0. */
PMLA_HD static inline int32_t pmla_inv_least(int sparse, int32_t asked) {
  return asked > 0 ? asked : sparse ? PMLA_INV_MIN_CHUNK_SPARSE : PMLA_INV_MIN_CHUNK;
}
/* Chunk size (positions, a multiple of PMLA_BLOCK_TOKENS, at least
 * pmla_inv_least) of a request of len. A dense request of at most twice
 * the least chunk is one chunk: full batches of such requests then fold
 * nothing (b=128 L=4096 h=128: 1.14x the default mode's time in 2048-token
 * chunks, 1.02x whole), at the price of parallelism in small batches of
 * them (b=1 L=4096 h=16: 71 -> 130 us; docs/performance.md). */
PMLA_HD static inline int32_t pmla_inv_chunk(int32_t len, int sparse, int32_t asked) {
  const int32_t least = pmla_inv_least(sparse, asked);
  if (!sparse && len <= 2 * least)
    return 2 * least;
  int64_t c = ((int64_t)len + PMLA_INV_MAX_CHUNKS - 1) / PMLA_INV_MAX_CHUNKS;
  c = (c + PMLA_BLOCK_TOKENS - 1) / PMLA_BLOCK_TOKENS * PMLA_BLOCK_TOKENS;
  return c < least ? least : (int32_t)c;
}

/* Chunks of a request of len (a request of length 0 is one empty chunk). */
PMLA_HD static inline int32_t pmla_inv_chunks(int32_t len, int32_t chunk) {
  return len <= 0 ? 1 : (int32_t)(((int64_t)len + chunk - 1) / chunk);
}

/* Blocks of chunk j. */
PMLA_HD static inline int64_t pmla_inv_chunk_blocks(int32_t len, int32_t chunk, int32_t j) {
  const int64_t b = (int64_t)j * chunk, e = b + chunk < len ? b + chunk : len;
  return e > b ? pmla_plan_blocks((int32_t)(e - b)) : 0;
}

/* The smallest unit u >= from with (u + 1) * 2 total > x2 * N, at most
 * N - 1 (x2: twice a chunk's midpoint on the line of all work) */
PMLA_HD static inline int32_t pmla_inv_unit_from(int32_t from, int64_t x2, int32_t N,
                                                 int64_t total) {
  int32_t u = from;
  while (u < N - 1 && (int64_t)(u + 1) * 2 * total <= x2 * N)
    u++;
  return u;
}

/* Work on the line of all work of a request of n chunks (each pays OH). */
PMLA_HD static inline int64_t pmla_inv_cost(int32_t n, int64_t blocks) {
  return (int64_t)PMLA_SPLIT_OVERHEAD * n + blocks;
}

/* Work before chunk j of a request whose work starts at cum: every chunk
 * but the last is whole (chunk / 64 blocks). */
PMLA_HD static inline int64_t pmla_inv_chunk_start(int64_t cum, int32_t chunk, int32_t j) {
  return cum + (int64_t)j * (PMLA_SPLIT_OVERHEAD + chunk / PMLA_BLOCK_TOKENS);
}

/* pmla_inv_unit_from(0, x2, N, total) in closed form (tested): the device
 * places requests in parallel, each from no earlier unit. */
PMLA_HD static inline int32_t pmla_inv_unit_at(int64_t x2, int32_t N, int64_t total) {
  const int64_t u = x2 * N / (2 * total);
  return u < N - 1 ? (int32_t)u : N - 1;
}

/* The unit of chunk j of a request of len whose work starts at cum: where
 * the chunk's midpoint falls (pmla_inv_unit_at) */
PMLA_HD static inline int32_t pmla_inv_chunk_unit(int64_t cum, int32_t chunk, int32_t len,
                                                  int32_t j, int32_t N, int64_t total) {
  return pmla_inv_unit_at(2 * pmla_inv_chunk_start(cum, chunk, j) + PMLA_SPLIT_OVERHEAD +
                              pmla_inv_chunk_blocks(len, chunk, j),
                          N, total);
}

/* Chunk j's slot, and its flags in *flags, in a request of n chunks.
 * Whole (first < 0): the unit's accumulator acc, which chunk 0 writes,
 * later chunks fold into and the last one folds into out and lse; a single
 * chunk writes out directly (-1). Split: chunks 0..a-1 fold into slot
 * first, each later chunk leaves its own partial in first + 1 + (j - a).
 * Every chunk that a later one folds is PMLA_WI_KEEP. */
PMLA_HD static inline int32_t pmla_inv_item_slot(int32_t n, int32_t a, int32_t first,
                                                 int32_t acc, int32_t j, int32_t *flags) {
  if (first < 0) {
    *flags = (j > 0 ? PMLA_WI_FOLD : 0) | (j == n - 1 ? (j > 0 ? PMLA_WI_FINAL : 0) : PMLA_WI_KEEP);
    return n == 1 ? -1 : acc;
  }
  *flags = j >= a ? 0 : (j > 0 ? PMLA_WI_FOLD : 0) | (j < a - 1 ? PMLA_WI_KEEP : 0);
  return j < a ? first : first + 1 + (j - a);
}

/* Chunks 0..a-1 of a request: those whose midpoints fall on unit u0, the
 * unit of chunk 0's (units only grow along the line, so they are a prefix);
 * returns a. */
PMLA_HD static inline int32_t pmla_inv_first_piece(const pmla_plan_req *q, int32_t chunk, int32_t n,
                                                   int64_t cum, int32_t u0, int32_t N,
                                                   int64_t total) {
  int32_t a = 1;
  for (int64_t c = cum + PMLA_SPLIT_OVERHEAD + pmla_inv_chunk_blocks(q->len, chunk, 0); a < n;
       a++) {
    const int64_t cost = PMLA_SPLIT_OVERHEAD + pmla_inv_chunk_blocks(q->len, chunk, a);
    if (pmla_inv_unit_from(u0, 2 * c + cost, N, total) != u0)
      break;
    c += cost;
  }
  return a;
}

/* Work item `item`: chunk j of request r on unit `unit` with slot `slot`
 * (-1: out directly) and the flags, and the work_indptr of units (prev,
 * unit]. */
PMLA_HD static inline void pmla_inv_write_item(const pmla_plan_output *out, int32_t r,
                                               const pmla_plan_req *q, int32_t chunk,
                                               int32_t item, int32_t prev, int32_t unit,
                                               int32_t slot, int32_t j, int32_t flags) {
  for (int32_t uu = prev + 1; uu <= unit; uu++)
    out->work_indptr[uu] = item;
  const int64_t kb = (int64_t)j * chunk, ke = kb + chunk;
  pmla_plan_store_item(out, item, r, slot, q->qb, q->qe, (int32_t)(kb < q->len ? kb : q->len),
                       (int32_t)(ke < q->len ? ke : q->len), q->len, j | flags);
}

/* The sums a step's placement needs: the work of all requests (total, at
 * least 1), the costliest request's, the chunks, and for the pieces
 * placement its pieces (every chunk of a request of several, every other
 * request whole), the partial slots they take and the costliest piece's;
 * ORs the input errors into *err. */
typedef struct pmla_inv_sums {
  int64_t total, max_cost, chunks, pieces, slots, max_piece;
  int64_t min_cost; /* the cheapest request's cost (INT64_MAX: none) */
} pmla_inv_sums;

/* A piece's cost: chunk j of a split request, else the whole request. */
PMLA_HD static inline int64_t pmla_inv_piece_cost(const pmla_plan_req *q, int32_t chunk,
                                                  int32_t n, int32_t j, int split) {
  return split ? PMLA_SPLIT_OVERHEAD + pmla_inv_chunk_blocks(q->len, chunk, j)
               : pmla_inv_cost(n, q->blocks);
}

/* What one request adds to the sums: its cost, its chunks, and as pieces
 * (split when it has several chunks) their count, slots and the costliest. */
PMLA_HD static inline void pmla_inv_sum_add(pmla_inv_sums *s, const pmla_plan_req *q,
                                            int32_t chunk, int32_t n) {
  const int64_t cost = pmla_inv_cost(n, q->blocks);
  const int64_t piece = pmla_inv_piece_cost(q, chunk, n, 0, n > 1); /* chunk 0 is whole */
  s->total += cost;
  s->max_cost = cost > s->max_cost ? cost : s->max_cost;
  s->chunks += n;
  s->pieces += n > 1 ? n : 1;
  s->slots += n > 1 ? n : 0;
  s->max_piece = piece > s->max_piece ? piece : s->max_piece;
  s->min_cost = cost < s->min_cost ? cost : s->min_cost;
}

PMLA_HD static inline pmla_inv_sums pmla_inv_sum(const pmla_plan_input *in, int32_t *err) {
  pmla_inv_sums s = {0, 0, 0, 0, 0, 0, INT64_MAX};
  for (int32_t r = 0; r < in->num_requests; r++) {
    const pmla_plan_req q = pmla_plan_describe(in, r, err);
    const int32_t chunk = pmla_inv_chunk(q.len, in->uniform_len, in->inv_least);
    pmla_inv_sum_add(&s, &q, chunk, pmla_inv_chunks(q.len, chunk));
  }
  if (s.total < 1)
    s.total = 1;
  return s;
}

/* How a step's work is placed on the units. */
enum {
  PMLA_INV_PLACE_LINE,  /* chunks cut along the line of all work */
  PMLA_INV_PLACE_WHOLE, /* requests whole, spread by cost */
  PMLA_INV_PLACE_PIECES /* pieces (the chunks of longer requests) spread by cost */
};

/* The placement of a step of R requests on N units with `budget` split
 * slots. Requests whole and spread when each fits 1.25 units' equal shares
 * of the work: the heaviest unit is then at most 1.25x a share where
 * requests are fewer than units, and no split is needed (b=56 L=8192 h=128,
 * 1.18 shares a request: 299.8 us on the line, 284.6 spread; b=60 L=16384
 * h=128, 1.10: 759.6 and 561.9, where the line's splits overrun the slot
 * budget). Where requests outnumber units some unit holds two, so also
 * the two cheapest must fit 1.25 shares (80 equal requests on 66 units
 * dealt whole: 14 units hold two, 1.65x a share; in pieces 1.03x). Else,
 * with at least half as many requests as units, pieces spread when each
 * fits 1.25 shares and their slots the budget: a ragged
 * batch with fewer requests than units, several of them longer than a
 * share (b=128 L=2048..6144 h=64 on 132 units: 234.4 us on the line).
 * Else the line: long requests in batches of fewer, where each request's
 * chunks on one unit fold there instead of each leaving a partial. At most
 * PMLA_INV_DEAL_MAX pieces and units either way. */
PMLA_HD static inline int pmla_inv_placement(int32_t R, int32_t N, int32_t budget,
                                             const pmla_inv_sums *s) {
  if (R < 1 || N > PMLA_INV_DEAL_MAX)
    return PMLA_INV_PLACE_LINE;
  if (R <= PMLA_INV_DEAL_MAX && s->max_cost * N * 4 <= s->total * 5 &&
      (R <= N || 2 * s->min_cost * N * 4 <= s->total * 5))
    return PMLA_INV_PLACE_WHOLE;
  if (2 * (int64_t)R >= N && s->pieces <= PMLA_INV_DEAL_MAX && s->slots <= budget &&
      s->max_piece * N * 4 <= s->total * 5)
    return PMLA_INV_PLACE_PIECES;
  return PMLA_INV_PLACE_LINE;
}

/* The sort key of request (or piece) r of cost (below 2^31): increasing
 * keys are decreasing costs, ties in order. */
PMLA_HD static inline int64_t pmla_inv_deal_key(int64_t cost, int32_t r) {
  return ((int64_t)(INT32_MAX - cost) << 32) | (int64_t)(uint32_t)r;
}

/* The deal of P pieces ranked by decreasing cost to N units. Fewer pieces
 * than units: one a unit, spaced evenly over the units, so the idle ones
 * are spread over the GPU (b=120 L=4096 h=16 on 132 units: 155.8 us with
 * the idle units bunched at the end against 151.3 on the line, side by
 * side; spaced 150.0 against 150.0); pmla_inv_spaced_rank is the rank unit
 * u is dealt (-1: none). Otherwise rounds of N ranks, in each the heaviest
 * to the least loaded unit (pmla_inv_load_rank: a unit's place among the
 * units by increasing load, ties by unit). In a round the heavier pieces
 * go to the lighter units, so the gap between the most and the least
 * loaded unit never grows past the costliest piece, and no unit holds more
 * than its share plus one piece (longest-first to the least loaded unit, a round at
 * a time: a ragged batch's pieces on 132 units 1.03-1.11x a share in a
 * model, 1.03-1.21x dealt in a fixed back-and-forth order). */
PMLA_HD static inline int32_t pmla_inv_spaced_rank(int32_t u, int32_t N, int32_t P) {
  const int32_t i = (int32_t)(((int64_t)u * P + N - 1) / N); /* the first i with i N / P >= u */
  return i < P && (int64_t)i * N / P == u ? i : -1;
}

PMLA_HD static inline int32_t pmla_inv_load_rank(const int64_t *load, int32_t u, int32_t N) {
  int32_t pos = 0;
  for (int32_t v = 0; v < N; v++)
    pos += load[v] < load[u] || (load[v] == load[u] && v < u);
  return pos;
}
/* The rounds of a deal of P pieces to N units. */
PMLA_HD static inline int32_t pmla_inv_rounds(int32_t P, int32_t N) {
  return P < N ? 1 : (P + N - 1) / N;
}

/* The cost a sort key holds. */
PMLA_HD static inline int64_t pmla_inv_key_cost(int64_t key) {
  return INT32_MAX - (key >> 32);
}

/* The n chunks of request r, whole on unit u from item `item`, folding in
 * the unit's accumulator acc (work_indptr is the caller's). */
PMLA_HD static inline void pmla_inv_write_whole(const pmla_plan_output *out, int32_t r,
                                                const pmla_plan_req *q, int32_t chunk, int32_t n,
                                                int32_t item, int32_t u, int32_t acc) {
  for (int32_t j = 0; j < n; j++) {
    int32_t flags;
    const int32_t slot = pmla_inv_item_slot(n, n, -1, acc, j, &flags);
    pmla_inv_write_item(out, r, q, chunk, item + j, u, u, slot, j, flags);
  }
}

/* PMLA_META_MODE of an invariant step, and of a default step whose
 * requests are dealt whole (pmla_plan_step) */
enum { PMLA_INV_MODE = 2, PMLA_DEALT_MODE = 3 };

/* The end of a dealt or invariant schedule: pmla_plan_finish after `items`
 * items, `slots` partial slots and `reduces` reduce entries, the last item
 * on unit `unit` (-1: none); the mode word of an invariant step unless
 * `mode` says otherwise. */
PMLA_HD static inline void pmla_inv_finish_as(const pmla_plan_input *in,
                                              const pmla_plan_output *out, int32_t mode,
                                              int32_t items, int32_t slots, int32_t reduces,
                                              int32_t unit, int32_t max_pieces, int32_t rows,
                                              int32_t err, int32_t lane, int32_t lanes) {
  pmla_plan_base end = {0, {0, 0}, items, slots, reduces, unit};
  pmla_plan_finish(in, out, mode, &end, max_pieces, rows, err, lane, lanes);
}
PMLA_HD static inline void pmla_inv_finish(const pmla_plan_input *in,
                                           const pmla_plan_output *out, int32_t items,
                                           int32_t slots, int32_t reduces, int32_t unit,
                                           int32_t max_pieces, int32_t rows, int32_t err,
                                           int32_t lane, int32_t lanes) {
  pmla_inv_finish_as(in, out, PMLA_INV_MODE, items, slots, reduces, unit, max_pieces, rows, err,
                     lane, lanes);
}

/* The schedule of a step whose chunks do not fit the item buffer (never
 * expected: the builder sizes it for PMLA_INV_MAX_CHUNKS a request): no
 * item, and the overflow flagged with the input errors `err`. */
PMLA_HD static inline void pmla_inv_empty(const pmla_plan_input *in, const pmla_plan_output *out,
                                          int32_t err, int32_t lane, int32_t lanes) {
  pmla_inv_finish(in, out, 0, 0, 0, -1, 0, 0, err | PMLA_PLAN_ERR_OVERFLOW, lane, lanes);
}

/* The step on the units by a deal (place: PMLA_INV_PLACE_WHOLE or
 * _PIECES): the pieces by decreasing cost (insertion sort: at most
 * PMLA_INV_DEAL_MAX), dealt a round at a time; a split request's slots and
 * reduce entry in request order. err: the input errors found; mode: the
 * PMLA_META_MODE word. A whole deal whose fullest unit would hold more
 * than `limit` writes nothing and returns 0; else returns 1. */
PMLA_HD static inline int pmla_plan_dealt(const pmla_plan_input *in, const pmla_plan_output *out,
                                          int place, int32_t err, int64_t limit, int32_t mode) {
  const int32_t R = in->num_requests, N = in->num_units, budget = in->max_partials - N;
  int32_t scratch = 0;
  int64_t key[PMLA_INV_DEAL_MAX];
  int32_t req_of[PMLA_INV_DEAL_MAX], first_of[PMLA_INV_DEAL_MAX], poff_of[PMLA_INV_DEAL_MAX];
  int32_t P = 0, rows = 0, slots = 0, reduces = 0, max_pieces = 1;
  for (int32_t r = 0; r < R; r++) {
    const pmla_plan_req q = pmla_plan_describe(in, r, &scratch);
    const int32_t chunk = pmla_inv_chunk(q.len, in->uniform_len, in->inv_least);
    const int32_t n = pmla_inv_chunks(q.len, chunk);
    const int split = place == PMLA_INV_PLACE_PIECES && n > 1;
    rows += q.qe - q.qb;
    first_of[r] = split ? slots : -1;
    poff_of[r] = P;
    if (split) {
      out->reduce_indptr[reduces] = slots;
      out->reduce_final_map[reduces++] = r;
      for (int32_t j = 0; j < n; j++)
        out->reduce_partial_map[slots + j] = slots + j;
      slots += n;
      max_pieces = n > max_pieces ? n : max_pieces;
    }
    for (int32_t j = 0; j < (split ? n : 1); j++, P++) {
      const int64_t k = pmla_inv_deal_key(pmla_inv_piece_cost(&q, chunk, n, j, split), P);
      req_of[P] = r;
      int32_t i = P;
      for (; i > 0 && key[i - 1] > k; i--)
        key[i] = key[i - 1];
      key[i] = k;
    }
  }
  /* the deal: perm[k N + u] is the rank unit u gets in round k (-1: none) */
  int64_t load[PMLA_INV_DEAL_MAX];
  int32_t perm[2 * PMLA_INV_DEAL_MAX], pos[PMLA_INV_DEAL_MAX];
  const int32_t rounds = pmla_inv_rounds(P, N);
  for (int32_t u = 0; u < N; u++)
    load[u] = 0;
  for (int32_t k = 0; k < rounds; k++) {
    for (int32_t u = 0; u < N; u++)
      pos[u] = P < N ? pmla_inv_spaced_rank(u, N, P) : pmla_inv_load_rank(load, u, N);
    for (int32_t u = 0; u < N; u++) {
      const int32_t i = P < N ? pos[u] : k * N + pos[u] < P ? k * N + pos[u] : -1;
      perm[k * N + u] = i;
      load[u] += i >= 0 ? pmla_inv_key_cost(key[i]) : 0;
    }
  }
  if (place == PMLA_INV_PLACE_WHOLE) /* nothing written yet: no request split */
    for (int32_t u = 0; u < N; u++)
      if (load[u] > limit)
        return 0;
  int32_t items = 0;
  for (int32_t u = 0; u < N; u++) {
    out->work_indptr[u] = items;
    for (int32_t k = 0; k < rounds; k++) {
      const int32_t i = perm[k * N + u];
      if (i < 0)
        continue;
      const int32_t p = (int32_t)(key[i] & 0xffffffff), r = req_of[p];
      const pmla_plan_req q = pmla_plan_describe(in, r, &scratch);
      const int32_t chunk = pmla_inv_chunk(q.len, in->uniform_len, in->inv_least);
      const int32_t n = pmla_inv_chunks(q.len, chunk);
      if (first_of[r] < 0) { /* whole */
        pmla_inv_write_whole(out, r, &q, chunk, n, items, u, budget + u);
        items += n;
      } else { /* chunk j of a split request: a partial of its own */
        const int32_t j = p - poff_of[r];
        int32_t flags;
        const int32_t slot = pmla_inv_item_slot(n, 1, first_of[r], 0, j, &flags);
        pmla_inv_write_item(out, r, &q, chunk, items++, u, u, slot, j, flags);
      }
    }
  }
  pmla_inv_finish_as(in, out, mode, items, slots, reduces, N - 1, max_pieces, rows, err, 0, 1);
  return 1;
}

/* Fills every output buffer for one batch-invariant step. Returns the error
 * bits it found (also ORed into work_meta_data[PMLA_META_ERROR]). */
PMLA_HD static inline int32_t pmla_plan_invariant(const pmla_plan_input *in,
                                                  const pmla_plan_output *out) {
  const int32_t R = in->num_requests, N = in->num_units;
  const int64_t OH = PMLA_SPLIT_OVERHEAD;
  const int32_t budget = in->max_partials - N; /* slots for splits */
  int32_t err = 0, scratch = 0;
  const pmla_inv_sums sums = pmla_inv_sum(in, &err);
  const int64_t total = sums.total;
  if (sums.chunks > in->max_items) {
    pmla_inv_empty(in, out, err, 0, 1);
    return err | PMLA_PLAN_ERR_OVERFLOW;
  }
  const int place = pmla_inv_placement(R, N, budget, &sums);
  if (place != PMLA_INV_PLACE_LINE) {
    pmla_plan_dealt(in, out, place, err, INT64_MAX, PMLA_INV_MODE);
    return err;
  }
  int32_t items = 0, slots = 0, reduces = 0, rows = 0, max_pieces = 0, prev = 0;
  int64_t cum = 0; /* work before the chunk being placed */
  out->work_indptr[0] = 0;
  /* A chunk goes to the unit whose equal share of the line of all work
   * (total) holds the chunk's midpoint: a unit's load stays within one chunk
   * of total / N, and no rounding drifts onto the last unit (chunks are
   * indivisible, so filling each unit up to a capacity would). Midpoints
   * only grow along the line, so each search starts at the unit of the last
   * chunk placed (pmla_inv_unit_from: no division). */
  int32_t ucur = 0; /* the unit of the last chunk placed */
  for (int32_t r = 0; r < R; r++) {
    const pmla_plan_req q = pmla_plan_describe(in, r, &scratch);
    const int32_t chunk = pmla_inv_chunk(q.len, in->uniform_len, in->inv_least);
    const int32_t n = pmla_inv_chunks(q.len, chunk);
    rows += q.qe - q.qb;
    /* the first piece: the chunks on the unit of chunk 0 (units only grow
     * along the line, so they are a prefix) */
    const int64_t cost0 = OH + pmla_inv_chunk_blocks(q.len, chunk, 0);
    ucur = pmla_inv_unit_from(ucur, 2 * cum + cost0, N, total);
    const int32_t u0 = ucur;
    const int32_t a = pmla_inv_first_piece(&q, chunk, n, cum, u0, N, total);
    const int split = a < n && slots + 1 + (n - a) <= budget;
    if (!split) { /* whole on unit u0, folding in its accumulator */
      for (int32_t j = 0; j < n; j++) {
        int32_t flags;
        const int32_t slot = pmla_inv_item_slot(n, n, -1, budget + u0, j, &flags);
        pmla_inv_write_item(out, r, &q, chunk, items++, prev, u0, slot, j, flags);
        prev = u0 > prev ? u0 : prev;
        cum += OH + pmla_inv_chunk_blocks(q.len, chunk, j);
      }
      max_pieces = max_pieces > 1 ? max_pieces : 1;
      continue;
    }
    /* split: chunks 0..a-1 fold into slot `first` on unit u0, the rest
     * leave a partial each on the units their midpoints fall in */
    const int32_t first = slots;
    out->reduce_indptr[reduces] = first;
    out->reduce_final_map[reduces] = r;
    reduces++;
    for (int32_t j = 0; j < a; j++) {
      int32_t flags;
      const int32_t slot = pmla_inv_item_slot(n, a, first, 0, j, &flags);
      pmla_inv_write_item(out, r, &q, chunk, items++, prev, u0, slot, j, flags);
      prev = u0 > prev ? u0 : prev;
      cum += OH + pmla_inv_chunk_blocks(q.len, chunk, j);
    }
    out->reduce_partial_map[first] = first;
    slots = first + 1;
    for (int32_t j = a; j < n; j++) {
      const int64_t cost = OH + pmla_inv_chunk_blocks(q.len, chunk, j);
      ucur = pmla_inv_unit_from(ucur, 2 * cum + cost, N, total);
      const int32_t u = ucur;
      cum += cost;
      int32_t flags;
      const int32_t slot = pmla_inv_item_slot(n, a, first, 0, j, &flags);
      out->reduce_partial_map[slot] = slot;
      pmla_inv_write_item(out, r, &q, chunk, items++, prev, u, slot, j, flags);
      prev = u > prev ? u : prev;
      slots = slot + 1;
    }
    /* the partial slots its reduce merges, as the deals count them */
    max_pieces = slots - first > max_pieces ? slots - first : max_pieces;
  }
  pmla_inv_finish(in, out, items, slots, reduces, prev, max_pieces, rows, err, 0, 1);
  return err;
}

/* The default mode's step: the fill (pmla_plan), or, where the fill would
 * split a request, every request whole, dealt by decreasing cost a round
 * at a time as a batch-invariant step's whole requests are
 * (pmla_plan_dealt), when the deal's fullest unit holds at most the
 * fill's capacity P plus PMLA_SPLIT_OVERHEAD: then no request is split, so
 * no partial is written and the reduce has nothing to do, for at most one
 * overhead more on the fullest unit than the fill's bound. A ragged batch
 * (b=128 L=2048..6144 on 66 units) is dealt within 0-3 blocks of P where
 * the fill splits about one request a unit. A fill that splits nothing
 * stays (the deal would change no request and cost the metadata kernel
 * its time). Not in piece mode (a split cap binds), and for at most
 * PMLA_INV_DEAL_MAX requests and units. Batch-invariant steps:
 * pmla_plan_invariant. Returns the error bits found. */
PMLA_HD static inline int32_t pmla_plan_step(const pmla_plan_input *in,
                                             const pmla_plan_output *out) {
  if (in->invariant)
    return pmla_plan_invariant(in, out);
  int32_t err = 0;
  const pmla_plan_shape sh = pmla_plan_shape_for(in, &err);
  if (!sh.piece_mode && in->num_requests >= 1 && in->num_requests <= PMLA_INV_DEAL_MAX &&
      in->num_units <= PMLA_INV_DEAL_MAX && in->num_requests <= in->max_items &&
      pmla_plan_fill_exceeds(in, &sh, 1)) {
    pmla_plan_input whole = *in;
    whole.inv_least = PMLA_INV_ONE_CHUNK;
    if (pmla_plan_dealt(&whole, out, PMLA_INV_PLACE_WHOLE, err,
                        sh.capacity + PMLA_SPLIT_OVERHEAD, PMLA_DEALT_MODE))
      return err;
  }
  return pmla_plan_shaped(in, out, &sh, err);
}

#endif
