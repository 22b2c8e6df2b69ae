/* SPDX-License-Identifier: MIT */
/* planner.h - the persistent schedule, written once for host C and device
 * code (the GPU metadata kernel runs the same per-request functions in
 * parallel), so both backends produce identical schedules.
 *
 * Cost model (FlashMLA's): a request costs its KV blocks of PMLA_BLOCK_TOKENS
 * tokens plus PMLA_SPLIT_OVERHEAD (OH) blocks per piece (loading Q, writing
 * the output or a partial, and its share of the reduce). Zero-length
 * requests cost the overhead alone: they still write zeros and lse = -inf.
 * C is the sum of OH + blocks over requests, N the number of units.
 *
 * Fill mode (no cap binds; FlashMLA's packing): every unit has capacity
 * P = ceil(C/N) + OH and units fill in request order. The rest of a request
 * goes whole onto the current unit when it fits (OH + its blocks <= room);
 * otherwise, if room > OH, the unit takes room - OH blocks of it as a piece
 * and the fill moves on; otherwise the fill moves on without splitting.
 * So a batch that packs into whole requests within the slack (uniform
 * lengths: 128 requests of 16 blocks on 66 units) is not split at all, and
 * nothing is paid for partials or a reduce. Proven below and tested:
 *   - every unit's load is <= P (within one block plus OH of C/N), and every
 *     unit before the last non-empty one has load >= P - OH;
 *   - the fill never runs past unit N - 1: the loads add up to C + OH * S
 *     (S splits, each adding a continuation's OH); a unit that ends with a
 *     split has load P, any other that ends has room <= OH, so load
 *     >= P - OH; hence units 0..N-2 take at least (N - 1) * ceil(C/N) of C
 *     and the last unit's rest, at most ceil(C/N) <= P, never splits;
 *   - each split ends a unit, so at most N - 1 splits: at most R + N - 1
 *     work items and 2(N - 1) partial slots.
 *
 * Dealt (plan_invariant.h, pmla_plan_step): where every request whole,
 * dealt by decreasing cost a round of N at a time to the least loaded
 * units, leaves no unit above P + OH, the step takes that deal instead of
 * the fill: no partials and no reduce, for at most OH blocks more on the
 * fullest unit than the fill's bound (PMLA_META_MODE 3).
 *
 * Piece mode (a split cap binds, i.e. the fill would give some request more
 * pieces than the cap): request i gets n_i = min(cap, blocks_i,
 * ceil(N * cost_i / C)) (at least 1) near-equal pieces, each placed on the
 * unit that holds its midpoint on the piece line. The cap is honoured
 * exactly per request; at most R + N items and 2N partial slots (each
 * n_i >= 2 has ceil(x) < 2x with sum x <= N).
 *
 * No allocation, no recursion, no library calls: callable on a GPU thread.
 */
#ifndef PMLA_PLANNER_H
#define PMLA_PLANNER_H

#include <stdint.h>

#include "fastdiv.h"
#include "hd.h"

#define PMLA_BLOCK_TOKENS 64
/* >= 1: every piece must cost something; FlashMLA's 5, kept against the
 * alternatives measured (docs/performance.md) */
#define PMLA_SPLIT_OVERHEAD 5

/* work_info_set entry, int32 words */
enum {
  PMLA_WI_REQUEST = 0,
  PMLA_WI_PARTIAL = 1, /* partial slot, or -1: write the final output */
  PMLA_WI_Q_BEGIN = 2, /* query rows [q_begin, q_end) of the whole step */
  PMLA_WI_Q_END = 3,
  PMLA_WI_KV_BEGIN = 4, /* KV positions [kv_begin, kv_end) of the request */
  PMLA_WI_KV_END = 5,
  PMLA_WI_KV_LEN = 6, /* the request's whole KV length (causal limits) */
  PMLA_WI_PIECE = 7,  /* index of this piece within its request */
  PMLA_WI_WORDS = 8
};

/* work_meta_data words */
enum {
  PMLA_META_NUM_ITEMS = 0,
  PMLA_META_NUM_REDUCE = 1,
  PMLA_META_NUM_PARTIALS = 2,
  PMLA_META_MODE = 3, /* 0 fill mode, 1 piece mode, 2 batch-invariant, 3 dealt whole
                          (plan_invariant.h) */
  PMLA_META_MAX_PIECES = 4,
  PMLA_META_NUM_REQUESTS = 5,
  PMLA_META_ERROR = 6, /* sticky device error word; the planner only ORs */
  PMLA_META_NUM_ROWS = 7,
  PMLA_META_WORDS_ = 8
};

/* Error bits, equal to the ABI's pmla_device_error_bits. */
enum {
  PMLA_PLAN_ERR_KV_LEN = 1 << 0,
  PMLA_PLAN_ERR_PAGE_INDEX = 1 << 1,
  PMLA_PLAN_ERR_SLOT_INDEX = 1 << 2,
  PMLA_PLAN_ERR_QO_INDPTR = 1 << 3,
  PMLA_PLAN_ERR_LAST_PAGE = 1 << 4,
  PMLA_PLAN_ERR_KV_SCALE = 1 << 5, /* set by the decode kernels, not the planner */
  PMLA_PLAN_ERR_OVERFLOW = 1 << 15 /* never expected: a bound was wrong */
};

/* Where per-request lengths and query rows come from. Exactly one length
 * source: kv_lens (block table), kv_indptr + kv_last_page_len (CSR), or
 * uniform_len (sparse: every request is one token over its top-k list). */
typedef struct pmla_plan_input {
  int32_t num_requests;
  int32_t num_units;       /* N */
  int32_t split_cap;       /* 0: uncapped */
  int32_t max_q_len;
  const int32_t *qo_indptr; /* [R+1] or NULL: request r is row r */
  const int32_t *kv_lens;   /* [R] */
  int32_t max_kv_len;       /* block table: min(pages * page_size, PMLA_PLAN_MAX_KV_LEN) */
  const int32_t *kv_indptr; /* [R+1] */
  const int32_t *kv_last_page_len;
  int32_t page_size;
  int32_t num_page_indices; /* CSR: length of kv_indices */
  int32_t uniform_len;
  /* capacities of the output buffers */
  int32_t max_items;
  int32_t max_partials;
  int32_t invariant;        /* plan with pmla_plan_invariant (plan_invariant.h) */
  int32_t inv_least;        /* its least chunk (pmla_inv_least); 0: pmla's */
} pmla_plan_input;

typedef struct pmla_plan_output {
  int32_t *work_meta_data;     /* [PMLA_META_WORDS_] */
  int32_t *work_indptr;        /* [N+1] */
  int32_t *work_info_set;      /* [max_items * PMLA_WI_WORDS] */
  int32_t *reduce_indptr;      /* [R+1] */
  int32_t *reduce_final_map;   /* [R] */
  int32_t *reduce_partial_map; /* [max_partials] */
} pmla_plan_output;

/* The most KV tokens of one request (pmla.h's PMLA_MAX_KV_LEN): positions,
 * block counts and rounded-up lengths then stay well inside int32. */
#define PMLA_PLAN_MAX_KV_LEN (1 << 30)

/* Validated KV length of request r; bad input ORs a bit into *err and
 * counts as length 0, so later stages never read outside what was given. */
PMLA_HD static inline int32_t pmla_plan_kv_len(const pmla_plan_input *in, int32_t r,
                                               int32_t *err) {
  if (in->kv_lens) {
    int32_t len = in->kv_lens[r];
    if (len < 0 || len > in->max_kv_len) {
      *err |= PMLA_PLAN_ERR_KV_LEN;
      return 0;
    }
    return len;
  }
  if (in->kv_indptr) {
    /* int64: entries anywhere in int32 must not overflow the checks */
    const int64_t first = in->kv_indptr[r], pages = (int64_t)in->kv_indptr[r + 1] - first;
    if (first < 0 || pages < 0 || first + pages > in->num_page_indices) {
      *err |= PMLA_PLAN_ERR_KV_LEN;
      return 0;
    }
    if (pages == 0)
      return 0;
    int32_t last = in->kv_last_page_len[r];
    if (last < 1 || last > in->page_size) {
      *err |= PMLA_PLAN_ERR_LAST_PAGE;
      return 0;
    }
    int64_t len = (int64_t)(pages - 1) * in->page_size + last;
    if (len > PMLA_PLAN_MAX_KV_LEN) {
      *err |= PMLA_PLAN_ERR_KV_LEN;
      return 0;
    }
    return (int32_t)len;
  }
  return in->uniform_len;
}

/* Validated query rows [*begin, *end) of request r. */
PMLA_HD static inline void pmla_plan_q_rows(const pmla_plan_input *in, int32_t r, int32_t *begin,
                                            int32_t *end, int32_t *err) {
  if (!in->qo_indptr) {
    *begin = r;
    *end = r + 1;
    return;
  }
  int32_t b = in->qo_indptr[r], e = in->qo_indptr[r + 1];
  if (b < 0 || e < b || e - b > in->max_q_len) {
    *err |= PMLA_PLAN_ERR_QO_INDPTR;
    *begin = *end = b < 0 ? 0 : b;
    return;
  }
  *begin = b;
  *end = e;
}

PMLA_HD static inline int64_t pmla_plan_blocks(int32_t len) {
  return ((int64_t)len + PMLA_BLOCK_TOKENS - 1) / PMLA_BLOCK_TOKENS;
}

/* Whole-step values every request's placement depends on. */
typedef struct pmla_plan_shape {
  int64_t total;       /* C: sum of OH + blocks over requests (>= 1) */
  int64_t capacity;    /* fill mode: P = ceil(C / N) + OH */
  int32_t piece_mode;  /* the fill would exceed the cap somewhere */
  int64_t piece_total; /* piece mode: sum of OH * pieces + blocks (>= 1) */
} pmla_plan_shape;

/* Fill mode: the unit being filled and the room left on it. */
typedef struct pmla_plan_fill {
  int32_t unit;
  int64_t room;
} pmla_plan_fill;

/* Fill mode: the piece of a request (`blocks` blocks) that starts at block
 * `first`, from fill state *f. Sets *unit to the unit that takes it and
 * returns the block after it (== blocks for the request's last piece),
 * leaving *f after it. The last unit takes whatever is left (the header
 * proves it never must; the room then goes negative and is flagged). */
PMLA_HD static inline int64_t pmla_plan_fill_piece(pmla_plan_fill *f, int64_t blocks,
                                                   int64_t first, int64_t capacity,
                                                   int32_t units, int32_t *unit) {
  const int64_t OH = PMLA_SPLIT_OVERHEAD;
  for (;;) {
    *unit = f->unit;
    if (f->room >= OH + (blocks - first) || f->unit >= units - 1) {
      f->room -= OH + (blocks - first);
      return blocks;
    }
    const int64_t take = f->room - OH;
    f->unit++;
    f->room = capacity;
    if (take > 0) /* else nothing more fits here: the fresh unit takes it */
      return first + take;
  }
}

/* Fill mode: pieces of a request of `blocks` blocks; advances *f past it. */
PMLA_HD static inline int32_t pmla_plan_fill_count(pmla_plan_fill *f, int64_t blocks,
                                                   int64_t capacity, int32_t units) {
  int32_t pieces = 0, unit;
  int64_t b = 0;
  do {
    b = pmla_plan_fill_piece(f, blocks, b, capacity, units, &unit);
    pieces++;
  } while (b < blocks);
  return pieces;
}

/* pmla_plan_fill_count in closed form: the request fits where the fill
 * stands, or it leaves a first piece of room - OH blocks there (when that is
 * positive) and fills fresh units of P - OH blocks until its rest fits or
 * the last unit takes it. Equal to pmla_plan_fill_count in pieces and
 * state (tested). */
PMLA_HD static inline int32_t pmla_plan_fill_next(pmla_plan_fill *f, int64_t blocks,
                                                  int64_t capacity, int32_t units) {
  const int64_t OH = PMLA_SPLIT_OVERHEAD, per = capacity - OH;
  const int64_t take = f->room - OH; /* blocks a first piece leaves here (<= 0: none) */
  const int64_t rest = blocks - (take > 0 ? take : 0);
  const int fit = f->room >= OH + blocks || f->unit >= units - 1;
  if (!fit && rest > per && f->unit < units - 2) { /* the rest spans fresh units */
    int64_t m = (rest - 1) / per;                  /* fresh units before its last piece's */
    if (m > units - 2 - f->unit)
      m = units - 2 - f->unit;
    f->unit += 1 + (int32_t)m;
    f->room = per - (rest - m * per);
    return (take > 0) + (int32_t)m + 1;
  }
  /* the common steps, as selects: it fits, or its rest fits the next unit */
  f->room = fit ? f->room - OH - blocks : per - rest;
  f->unit += !fit;
  return fit ? 1 : 1 + (take > 0);
}

/* The fill on the line of the requests' costs (how the device walks it):
 * s is where a request starts (OH + blocks summed over the requests
 * before it) and end where the unit being filled ends on that line, so the
 * fill state is {unit, end - s}. A request fits iff s + OH + blocks <= end.
 * Past an end, the next unit ends P - OH further on (the request's rest
 * pays OH once more) or, when the room was at most OH (no first piece), P
 * past the request's start: end' = max(end + P - OH, s + P); a request
 * longer than a fresh unit takes passes further ends, P - OH apart. The
 * last unit is not special: the walk passes it exactly where
 * pmla_plan_fill_next's room goes negative (never: the proof above). A
 * step's serial chain is a compare, a maximum and a select, against ~40
 * cycles for stepping the room; the pieces follow from the units
 * (pmla_plan_ends_pieces). Equal to pmla_plan_fill_next (tested). */
typedef struct pmla_plan_ends {
  int64_t s, end;
  int32_t unit;
} pmla_plan_ends;

PMLA_HD static inline pmla_plan_ends pmla_plan_ends_of(pmla_plan_fill f) {
  pmla_plan_ends l = {0, f.room, f.unit};
  return l;
}

PMLA_HD static inline void pmla_plan_ends_step(pmla_plan_ends *l, int64_t blocks,
                                               int64_t capacity) {
  const int64_t OH = PMLA_SPLIT_OVERHEAD, per = capacity - OH, next = l->s + OH + blocks;
  if (next > l->end) {
    const int64_t end = l->end + per > l->s + capacity ? l->end + per : l->s + capacity;
    const int64_t m = next > end ? (next - end - 1) / per + 1 : 0; /* further ends */
    l->end = end + m * per;
    l->unit += 1 + (int32_t)m;
  }
  l->s = next;
}

/* A request's pieces from the unit it enters on with `room`, and the unit
 * the next request enters on: one per unit it reaches, less the unit it
 * leaves without a first piece (room <= OH). */
PMLA_HD static inline int32_t pmla_plan_ends_pieces(int32_t unit, int64_t room,
                                                    int32_t next_unit) {
  const int32_t d = next_unit - unit;
  return d + 1 - (d > 0 && room <= PMLA_SPLIT_OVERHEAD);
}

/* pmla_plan_ends on 32-bit values, for steps whose C is below 2^30 (every
 * s and end then lies below 2^32): a 64-bit step is twice the dependent
 * instructions. */
typedef struct pmla_plan_ends32 {
  uint32_t s, end;
  int32_t unit;
} pmla_plan_ends32;

/* pmla_plan_ends_step for a request no longer than a fresh unit takes
 * (blocks <= P - OH: one end at most), as selects. Equal to it there
 * (tested). */
PMLA_HD static inline void pmla_plan_ends_step32(pmla_plan_ends32 *l, uint32_t blocks,
                                                 uint32_t capacity) {
  const uint32_t OH = PMLA_SPLIT_OVERHEAD, next = l->s + OH + blocks;
  const uint32_t a = l->end + (capacity - OH), b = l->s + capacity;
  const int cross = next > l->end;
  l->end = cross ? (a > b ? a : b) : l->end;
  l->unit += cross;
  l->s = next;
}

/* pmla_plan_ends_step for any request, C below 2^30, on the room alone
 * (l->s stays 0 and l->end is the room the request enters with): no
 * branch, one multiply-high division (per_div, the step's P - OH; a 64-bit
 * division is a software loop on the GPU). A crossing request ends
 * ceil(d / per) units further for the d blocks past its room, a request
 * entering inside the overhead (room < OH) as if it entered a fresh unit
 * with room OH. Equal to pmla_plan_ends_step wherever the room is not
 * negative (tested). */
PMLA_HD static inline void pmla_plan_room_step32_long(pmla_plan_ends32 *l, uint32_t blocks,
                                                      uint32_t capacity, pmla_fastdiv per_div) {
  const uint32_t OH = PMLA_SPLIT_OVERHEAD, per = capacity - OH, c = OH + blocks, r = l->end;
  const int fresh = (int32_t)r < (int32_t)OH, cross = fresh || c > r;
  const uint32_t d = c - (fresh ? OH : r); /* >= 0 where crossing */
  const uint32_t q = pmla_fastdiv_q(per_div, d - (d > 0)); /* (d - 1) / per, 0 for d = 0 */
  l->end = cross ? q * per + (per - d) : r - c;
  l->unit += cross ? 1 + (int32_t)q : 0;
}

/* Fill mode, closed form: piece p of the npieces a request of `blocks`
 * blocks gets from fill state *entry (pmla_plan_fill_next's count): blocks
 * [*first, *next) on unit *unit, as the p-th pmla_plan_fill_piece step from
 * *entry places it (tested). Lets the device place pieces in parallel. */
PMLA_HD static inline void pmla_plan_fill_piece_at(const pmla_plan_fill *entry, int64_t blocks,
                                                   int32_t p, int32_t npieces, int64_t capacity,
                                                   int32_t units, int64_t *first, int64_t *next,
                                                   int32_t *unit) {
  const int64_t OH = PMLA_SPLIT_OVERHEAD, take = entry->room - OH;
  if (entry->room >= OH + blocks || entry->unit >= units - 1) { /* whole, where it stands */
    *first = 0;
    *next = blocks;
    *unit = entry->unit;
    return;
  }
  const int32_t k0 = take > 0; /* a first piece on the entry unit */
  if (p < k0) {
    *first = 0;
    *next = take;
    *unit = entry->unit;
    return;
  }
  const int64_t m = p - k0;
  *unit = entry->unit + 1 + (int32_t)m;
  *first = (k0 ? take : 0) + m * (capacity - OH);
  *next = p == npieces - 1 ? blocks : *first + capacity - OH;
}

/* Fill mode: the most pieces a request of `blocks` blocks can get: its
 * first piece has >= 1 block, every later one but the last is a fresh
 * unit's P - OH blocks. Lets the device skip the walk that decides piece
 * mode when no request can exceed the cap (tested in t_planner). */
PMLA_HD static inline int64_t pmla_plan_fill_max_pieces(int64_t blocks, int64_t capacity) {
  const int64_t per_unit = capacity - PMLA_SPLIT_OVERHEAD;
  return blocks <= 1 ? 1 : 1 + (blocks - 1 + per_unit - 1) / per_unit;
}

/* Piece mode: how many pieces request cost OH + blocks gets. */
PMLA_HD static inline int32_t pmla_plan_piece_count(int64_t blocks, int64_t total, int64_t units,
                                                    int32_t cap) {
  int64_t n = (units * (PMLA_SPLIT_OVERHEAD + blocks) + total - 1) / total;
  if (n > cap)
    n = cap;
  if (n > blocks)
    n = blocks;
  return n < 1 ? 1 : (int32_t)n;
}

/* One request's validated inputs. */
typedef struct pmla_plan_req {
  int32_t len, qb, qe;
  int64_t blocks;
} pmla_plan_req;

PMLA_HD static inline pmla_plan_req pmla_plan_describe(const pmla_plan_input *in, int32_t r,
                                                       int32_t *err) {
  pmla_plan_req q;
  q.len = pmla_plan_kv_len(in, r, err);
  pmla_plan_q_rows(in, r, &q.qb, &q.qe, err);
  q.blocks = pmla_plan_blocks(q.len);
  return q;
}

/* Piece mode: the request's length on the piece line. */
PMLA_HD static inline int64_t pmla_plan_line_cost(const pmla_plan_input *in,
                                                  const pmla_plan_shape *sh,
                                                  const pmla_plan_req *q) {
  return (int64_t)PMLA_SPLIT_OVERHEAD *
             pmla_plan_piece_count(q->blocks, sh->total, in->num_units, in->split_cap) +
         q->blocks;
}

/* Where a request's items go: the exclusive prefix over earlier requests. */
typedef struct pmla_plan_base {
  int64_t line;        /* piece mode: line start of the request */
  pmla_plan_fill fill; /* fill mode: the fill state entering the request */
  int32_t items;       /* its first work item */
  int32_t partials;    /* its first partial slot, when split */
  int32_t reduces;     /* its reduce entry, when split */
  int32_t unit;        /* unit of the previous request's last item (0 first) */
} pmla_plan_base;

/* Piece mode, closed form: piece p of npieces, blocks [*first, *next),
 * placed on the unit that holds its midpoint on the piece line; the line
 * before it holds the request's earlier pieces, p * OH + *first. */
PMLA_HD static inline void pmla_plan_line_piece_at(const pmla_plan_input *in,
                                                   const pmla_plan_shape *sh,
                                                   const pmla_plan_req *q, int32_t npieces,
                                                   int64_t line, int32_t p, int64_t *first,
                                                   int64_t *next, int32_t *unit) {
  const int64_t N = in->num_units, OH = PMLA_SPLIT_OVERHEAD;
  *first = q->blocks * p / npieces;
  *next = q->blocks * (p + 1) / npieces;
  const int64_t cost = OH + (*next - *first);
  const int64_t u = (line + p * OH + *first + cost / 2) * N / sh->piece_total;
  *unit = (int32_t)(u < N - 1 ? u : N - 1);
}

/* Stores one work item's words. On a GPU as two 16-byte stores, which rely
 * on PMLA_WI_* being 0..7 in this order (asserted in plugin/builder.c):
 * the metadata kernel writes one item a thread, and eight 4-byte stores
 * across a warp's items are eight memory instructions of eight cache lines
 * each. The builder's buffers are aligned for it. */
PMLA_HD static inline void pmla_plan_store_item(const pmla_plan_output *out, int32_t item,
                                                int32_t r, int32_t partial, int32_t qb,
                                                int32_t qe, int32_t kv_begin, int32_t kv_end,
                                                int32_t kv_len, int32_t piece) {
  int32_t *w = out->work_info_set + (int64_t)item * PMLA_WI_WORDS;
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  ((int4 *)w)[0] = make_int4(r, partial, qb, qe);
  ((int4 *)w)[1] = make_int4(kv_begin, kv_end, kv_len, piece);
#else
  w[PMLA_WI_REQUEST] = r;
  w[PMLA_WI_PARTIAL] = partial;
  w[PMLA_WI_Q_BEGIN] = qb;
  w[PMLA_WI_Q_END] = qe;
  w[PMLA_WI_KV_BEGIN] = kv_begin;
  w[PMLA_WI_KV_END] = kv_end;
  w[PMLA_WI_KV_LEN] = kv_len;
  w[PMLA_WI_PIECE] = piece;
#endif
}

/* Work item `items + p` (piece p of request r, blocks [first, next)) and
 * the work_indptr of units (prev, unit]: what pmla_plan_place writes per
 * piece; `partials` is the request's first partial slot, or -1 unsplit. */
PMLA_HD static inline void pmla_plan_write_item(const pmla_plan_output *out, int32_t r,
                                                const pmla_plan_req *q, int32_t partials,
                                                int32_t items, int32_t p, int32_t prev,
                                                int32_t unit, int64_t first, int64_t next) {
  const int32_t item = items + p;
  for (int32_t u = prev + 1; u <= unit; u++)
    out->work_indptr[u] = item;
  const int64_t kb = first * PMLA_BLOCK_TOKENS, ke = next * PMLA_BLOCK_TOKENS;
  pmla_plan_store_item(out, item, r, partials < 0 ? -1 : partials + p, q->qb, q->qe,
                       (int32_t)(kb < q->len ? kb : q->len), (int32_t)(ke < q->len ? ke : q->len),
                       q->len, p);
  if (partials >= 0)
    out->reduce_partial_map[partials + p] = partials + p;
}

/* Piece p of a request whose pieces start from *base, in closed form: the
 * device places pieces in parallel with it. In fill mode pmla_plan_place
 * walks the pieces instead (the two agree: t_planner); piece mode's closed
 * form is pmla_plan_place's own. t_plan_exact compares the device's
 * schedules with the host's. */
PMLA_HD static inline void pmla_plan_piece_at(const pmla_plan_input *in,
                                              const pmla_plan_shape *sh,
                                              const pmla_plan_req *q, int32_t npieces,
                                              const pmla_plan_base *base, int32_t p,
                                              int64_t *first, int64_t *next, int32_t *unit) {
  if (sh->piece_mode)
    pmla_plan_line_piece_at(in, sh, q, npieces, base->line, p, first, next, unit);
  else
    pmla_plan_fill_piece_at(&base->fill, q->blocks, p, npieces, sh->capacity, in->num_units,
                            first, next, unit);
}

/* Whether a request's items and partial slots fit the buffers (planner.h
 * proves they always do; a miss is flagged, never written). */
PMLA_HD static inline int pmla_plan_fits(const pmla_plan_input *in, const pmla_plan_base *base,
                                         int32_t npieces) {
  return base->items + npieces <= in->max_items &&
         (npieces == 1 || base->partials + npieces <= in->max_partials);
}

/* Walks request r's pieces (there are npieces) and, when `out` is set,
 * writes its work items, its reduce entry and the work_indptr of units
 * (base->unit, unit of each item]. Returns the unit of its last item. The
 * serial planner's; the device writes the same words per piece in
 * parallel (pmla_plan_piece_at, pmla_plan_write_item). Writes past the
 * capacities are skipped and flagged (never expected: planner.h proves
 * the bounds). */
PMLA_HD static inline int32_t pmla_plan_place(const pmla_plan_input *in,
                                              const pmla_plan_output *out,
                                              const pmla_plan_shape *sh, int32_t r,
                                              const pmla_plan_req *q, int32_t npieces,
                                              const pmla_plan_base *base, int32_t *err) {
  const int64_t N = in->num_units;
  const int split = npieces > 1, fits = pmla_plan_fits(in, base, npieces);
  if (out && !fits)
    *err |= PMLA_PLAN_ERR_OVERFLOW;
  if (out && fits && split) {
    out->reduce_indptr[base->reduces] = base->partials;
    out->reduce_final_map[base->reduces] = r;
  }
  pmla_plan_fill fill = base->fill;
  int32_t prev = base->unit;
  int64_t first = 0;
  for (int32_t p = 0; p < npieces; p++) {
    int64_t next;
    int32_t piece_unit;
    if (sh->piece_mode)
      pmla_plan_line_piece_at(in, sh, q, npieces, base->line, p, &first, &next, &piece_unit);
    else
      next = pmla_plan_fill_piece(&fill, q->blocks, first, sh->capacity, (int32_t)N,
                                  &piece_unit);
    if (out && fits)
      pmla_plan_write_item(out, r, q, split ? base->partials : -1, base->items, p, prev,
                           piece_unit, first, next);
    if (piece_unit > prev)
      prev = piece_unit;
    first = next;
  }
  if (out && fill.room < 0)
    *err |= PMLA_PLAN_ERR_OVERFLOW;
  return prev;
}

/* Work_indptr of the units after the last item, reduce_indptr's end and the
 * counters (mode: the PMLA_META_MODE word); `end` is the prefix after the
 * last request. `lanes` callers share it, lane `lane` of them (the serial
 * planners: 0 of 1). */
PMLA_HD static inline void pmla_plan_finish(const pmla_plan_input *in,
                                            const pmla_plan_output *out, int32_t mode,
                                            const pmla_plan_base *end, int32_t max_pieces,
                                            int32_t rows, int32_t err, int32_t lane,
                                            int32_t lanes) {
  for (int32_t u = end->unit + 1 + lane; u <= in->num_units; u += lanes)
    out->work_indptr[u] = end->items;
  if (lane != 0)
    return;
  out->work_indptr[0] = 0;
  out->reduce_indptr[end->reduces] = end->partials;
  int32_t *meta = out->work_meta_data;
  meta[PMLA_META_NUM_ITEMS] = end->items;
  meta[PMLA_META_NUM_REDUCE] = end->reduces;
  meta[PMLA_META_NUM_PARTIALS] = end->partials;
  meta[PMLA_META_MODE] = mode;
  meta[PMLA_META_MAX_PIECES] = max_pieces;
  meta[PMLA_META_NUM_REQUESTS] = in->num_requests;
  if (err) /* no read of the word where there is nothing to add (the device's would wait on it) */
    meta[PMLA_META_ERROR] |= err;
  meta[PMLA_META_NUM_ROWS] = rows;
}

/* The step's shape from the requests' costs: C and P, then whether the
 * fill would give a request more pieces than the cap (piece mode). */
PMLA_HD static inline pmla_plan_shape pmla_plan_shape_of(int64_t total, int32_t units) {
  pmla_plan_shape sh;
  sh.total = total > 0 ? total : 1;
  sh.capacity = (sh.total + units - 1) / units + PMLA_SPLIT_OVERHEAD;
  sh.piece_mode = 0;
  sh.piece_total = 1;
  return sh;
}

/* The fill state a step starts from. */
PMLA_HD static inline pmla_plan_fill pmla_plan_fill_start(const pmla_plan_shape *sh) {
  pmla_plan_fill f = {0, sh->capacity};
  return f;
}

/* Whether a split cap can bind at all (else piece mode is never tried). */
PMLA_HD static inline int pmla_plan_cap_applies(const pmla_plan_input *in) {
  return in->split_cap > 0 && in->split_cap < in->num_units;
}

/* Whether the fill of a step whose shape is sh gives some request more
 * than `most` pieces (walked serially, stopping at the first). */
PMLA_HD static inline int pmla_plan_fill_exceeds(const pmla_plan_input *in,
                                                 const pmla_plan_shape *sh, int32_t most) {
  int32_t scratch = 0;
  pmla_plan_fill f = pmla_plan_fill_start(sh);
  for (int32_t r = 0; r < in->num_requests; r++)
    if (pmla_plan_fill_next(&f, pmla_plan_describe(in, r, &scratch).blocks, sh->capacity,
                            in->num_units) > most)
      return 1;
  return 0;
}

/* The step's shape (C, P, piece mode), serially; ORs the input errors
 * into *err. */
PMLA_HD static inline pmla_plan_shape pmla_plan_shape_for(const pmla_plan_input *in,
                                                          int32_t *err) {
  const int32_t R = in->num_requests;
  const int32_t N = in->num_units;
  int32_t scratch = 0;
  int64_t total = 0;
  for (int32_t r = 0; r < R; r++)
    total += PMLA_SPLIT_OVERHEAD + pmla_plan_describe(in, r, err).blocks;
  pmla_plan_shape sh = pmla_plan_shape_of(total, N);
  if (pmla_plan_cap_applies(in)) {
    sh.piece_mode = pmla_plan_fill_exceeds(in, &sh, in->split_cap);
    if (sh.piece_mode) {
      sh.piece_total = 0;
      for (int32_t r = 0; r < R; r++) {
        pmla_plan_req q = pmla_plan_describe(in, r, &scratch);
        sh.piece_total += pmla_plan_line_cost(in, &sh, &q);
      }
      if (sh.piece_total == 0)
        sh.piece_total = 1;
    }
  }
  return sh;
}

/* pmla_plan for a step whose shape pmla_plan_shape_for has computed, with
 * err the input errors it found. */
PMLA_HD static inline int32_t pmla_plan_shaped(const pmla_plan_input *in,
                                               const pmla_plan_output *out,
                                               const pmla_plan_shape *shape, int32_t err) {
  const int32_t R = in->num_requests;
  const int32_t N = in->num_units;
  const pmla_plan_shape sh = *shape;
  int32_t scratch = 0;
  pmla_plan_base at = {0, pmla_plan_fill_start(&sh), 0, 0, 0, 0};
  int32_t max_pieces = 0, rows = 0;
  for (int32_t r = 0; r < R; r++) {
    pmla_plan_req q = pmla_plan_describe(in, r, &scratch);
    pmla_plan_fill after = at.fill;
    int32_t npieces = sh.piece_mode
                          ? pmla_plan_piece_count(q.blocks, sh.total, N, in->split_cap)
                          : pmla_plan_fill_next(&after, q.blocks, sh.capacity, N);
    at.unit = pmla_plan_place(in, out, &sh, r, &q, npieces, &at, &err);
    if (sh.piece_mode)
      at.line += pmla_plan_line_cost(in, &sh, &q);
    else
      at.fill = after;
    at.items += npieces;
    if (npieces > 1) {
      at.partials += npieces;
      at.reduces++;
    }
    rows += q.qe - q.qb;
    max_pieces = npieces > max_pieces ? npieces : max_pieces;
  }
  pmla_plan_finish(in, out, sh.piece_mode, &at, max_pieces, rows, err, 0, 1);
  return err;
}

/* Fills every output buffer for one step by the fill, or pieces where a
 * cap binds (the serial driver; the device runs the same per-request
 * functions in parallel; pmla_plan_step in plan_invariant.h chooses
 * between this and a deal). Returns the error bits it found (also ORed
 * into work_meta_data[PMLA_META_ERROR]). */
PMLA_HD static inline int32_t pmla_plan(const pmla_plan_input *in, const pmla_plan_output *out) {
  int32_t err = 0;
  const pmla_plan_shape sh = pmla_plan_shape_for(in, &err);
  return pmla_plan_shaped(in, out, &sh, err);
}

/* The sparse split cap: min(next_pow2(max(1, min(max_seq_len, topk) / 128)), cu_count). */
PMLA_HD static inline int32_t pmla_sparse_split_cap(int64_t max_seq_len, int64_t topk,
                                                    int64_t cu_count) {
  int64_t m = max_seq_len < topk ? max_seq_len : topk;
  int64_t q = m / 128;
  if (q < 1)
    q = 1;
  int64_t p = 1;
  while (p < q)
    p <<= 1;
  if (p > cu_count)
    p = cu_count;
  return (int32_t)p;
}

#endif
