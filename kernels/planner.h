/* planner.h - the persistent schedule, written once for host C and device
 * code (the GPU metadata kernel includes this file and runs pmla_plan on one
 * thread), so both backends produce identical schedules.
 *
 * Cost model (FlashMLA's): a request costs its KV blocks of PMLA_BLOCK_TOKENS
 * tokens plus PMLA_SPLIT_OVERHEAD blocks per piece (loading Q, writing the
 * output or a partial, and its share of the reduce). Zero-length requests
 * cost the overhead alone: they still write zeros and lse = -inf.
 *
 * Line-cut mode (no cap binds): lay requests on one line, each as OH units
 * then its blocks, total C. Unit n starts at floor(n*C/N); a start that falls
 * inside a request's overhead (or on its first block) moves back to the
 * request's start, one inside its blocks splits it there. Proven below and
 * tested: every unit's load (blocks + OH per piece) is within one block plus
 * the overhead of the even share C/N; at most R + N - 1 work items and
 * 2(N - 1) partial slots.
 *
 * Piece mode (a split cap binds): request i gets
 * n_i = min(cap, blocks_i, ceil(N * cost_i / C)) (at least 1) near-equal
 * pieces, each placed on the unit that holds its midpoint on the piece line.
 * The cap is honoured exactly per request; at most R + N items and 2N
 * partial slots (each n_i >= 2 has ceil(x) < 2x with sum x <= N).
 *
 * No allocation, no recursion, no library calls: callable on a GPU thread.
 */
#ifndef PMLA_PLANNER_H
#define PMLA_PLANNER_H

#include <stdint.h>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define PMLA_HD __host__ __device__
#else
#define PMLA_HD
#endif

#define PMLA_BLOCK_TOKENS 64
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
  PMLA_META_MODE = 3, /* 0 line-cut, 1 piece mode */
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
  PMLA_PLAN_ERR_OVERFLOW = 1 << 5 /* never expected: a bound was wrong */
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
  int32_t max_kv_len;       /* block table capacity: pages * page_size */
  const int32_t *kv_indptr; /* [R+1] */
  const int32_t *kv_last_page_len;
  int32_t page_size;
  int32_t num_page_indices; /* CSR: length of kv_indices */
  int32_t uniform_len;
  /* capacities of the output buffers */
  int32_t max_items;
  int32_t max_partials;
} pmla_plan_input;

typedef struct pmla_plan_output {
  int32_t *work_meta_data;     /* [PMLA_META_WORDS_] */
  int32_t *work_indptr;        /* [N+1] */
  int32_t *work_info_set;      /* [max_items * PMLA_WI_WORDS] */
  int32_t *reduce_indptr;      /* [R+1] */
  int32_t *reduce_final_map;   /* [R] */
  int32_t *reduce_partial_map; /* [max_partials] */
} pmla_plan_output;

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
    int32_t first = in->kv_indptr[r], pages = in->kv_indptr[r + 1] - first;
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
    if (len > INT32_MAX) {
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

/* Start of unit n on a line of `total` units shared by `units`. */
PMLA_HD static inline int64_t pmla_plan_cut(int64_t n, int64_t total, int64_t units) {
  return n * total / units;
}

/* Line-cut: advance *unit to the unit owning the start of a request whose
 * line begins at s (cuts in (s, s + OH] snap back to s). */
PMLA_HD static inline void pmla_plan_line_start(int64_t s, int64_t total, int64_t units,
                                                int32_t *unit) {
  while (*unit + 1 < units && pmla_plan_cut(*unit + 1, total, units) <= s + PMLA_SPLIT_OVERHEAD)
    (*unit)++;
}

/* Line-cut: the piece after block `start` of a request (line start s,
 * `blocks` blocks) on *unit. Returns the first block of the next piece
 * (== blocks for the last piece) and leaves *unit on the unit that takes it;
 * cuts that coincide produce no empty piece. */
PMLA_HD static inline int64_t pmla_plan_line_next(int64_t s, int64_t blocks, int64_t start,
                                                  int64_t total, int64_t units, int32_t *unit) {
  int64_t base = s + PMLA_SPLIT_OVERHEAD;
  while (*unit + 1 < units) {
    int64_t cut = pmla_plan_cut(*unit + 1, total, units);
    if (cut >= base + blocks)
      break;
    (*unit)++;
    if (cut - base > start)
      return cut - base;
  }
  return blocks;
}

PMLA_HD static inline int32_t pmla_plan_line_count(int64_t s, int64_t blocks, int64_t total,
                                                   int64_t units, int32_t unit) {
  int32_t pieces = 1;
  for (int64_t b = pmla_plan_line_next(s, blocks, 0, total, units, &unit); b < blocks;
       b = pmla_plan_line_next(s, blocks, b, total, units, &unit))
    pieces++;
  return pieces;
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

/* Writes one work item; returns 0 when the item buffer is full. */
PMLA_HD static inline int pmla_plan_emit(const pmla_plan_input *in, const pmla_plan_output *out,
                                         int32_t *items, const int32_t word[PMLA_WI_WORDS]) {
  if (*items >= in->max_items)
    return 0;
  int32_t *w = out->work_info_set + (int64_t)(*items) * PMLA_WI_WORDS;
  for (int k = 0; k < PMLA_WI_WORDS; k++)
    w[k] = word[k];
  (*items)++;
  return 1;
}

/* Fills every output buffer for one step. Returns the error bits it found
 * (also ORed into work_meta_data[PMLA_META_ERROR]). */
PMLA_HD static inline int32_t pmla_plan(const pmla_plan_input *in, const pmla_plan_output *out) {
  const int64_t R = in->num_requests, N = in->num_units, OH = PMLA_SPLIT_OVERHEAD;
  int32_t err = 0, scratch = 0;
  int64_t total = 0;
  for (int32_t r = 0; r < R; r++)
    total += OH + pmla_plan_blocks(pmla_plan_kv_len(in, r, &err));
  if (total == 0)
    total = 1;

  /* Piece mode only when the line-cut would give some request more pieces
   * than the cap. */
  int piece_mode = 0;
  int64_t piece_total = 0;
  if (in->split_cap > 0 && in->split_cap < N) {
    int64_t s = 0;
    int32_t unit = 0;
    for (int32_t r = 0; r < R && !piece_mode; r++) {
      int64_t blocks = pmla_plan_blocks(pmla_plan_kv_len(in, r, &scratch));
      pmla_plan_line_start(s, total, N, &unit);
      piece_mode = pmla_plan_line_count(s, blocks, total, N, unit) > in->split_cap;
      s += OH + blocks;
    }
    for (int32_t r = 0; r < R && piece_mode; r++) {
      int64_t blocks = pmla_plan_blocks(pmla_plan_kv_len(in, r, &scratch));
      piece_total += OH * pmla_plan_piece_count(blocks, total, N, in->split_cap) + blocks;
    }
    if (piece_total == 0)
      piece_total = 1;
  }

  int32_t items = 0, partials = 0, reduces = 0, max_pieces = 0, rows = 0, filled = 0;
  int64_t s = 0; /* line position of request r (line-cut) or of its first piece */
  int32_t unit = 0;
  out->work_indptr[0] = 0;
  for (int32_t r = 0; r < R && !(err & PMLA_PLAN_ERR_OVERFLOW); r++) {
    int32_t qb, qe;
    int32_t len = pmla_plan_kv_len(in, r, &err);
    pmla_plan_q_rows(in, r, &qb, &qe, &err);
    rows += qe - qb;
    int64_t blocks = pmla_plan_blocks(len);
    int32_t npieces;
    if (piece_mode) {
      npieces = pmla_plan_piece_count(blocks, total, N, in->split_cap);
    } else {
      pmla_plan_line_start(s, total, N, &unit);
      npieces = pmla_plan_line_count(s, blocks, total, N, unit);
    }
    if (npieces > max_pieces)
      max_pieces = npieces;
    int split = npieces > 1;
    if (split) {
      if (partials + npieces > in->max_partials) {
        err |= PMLA_PLAN_ERR_OVERFLOW;
        break;
      }
      out->reduce_indptr[reduces] = partials;
      out->reduce_final_map[reduces] = r;
      reduces++;
    }
    int64_t first = 0;
    for (int32_t p = 0; p < npieces; p++) {
      int64_t next;
      int32_t piece_unit;
      if (piece_mode) {
        next = blocks * (p + 1) / npieces;
        int64_t cost = OH + (next - first);
        piece_unit = (int32_t)((s + cost / 2) * N / piece_total);
        s += cost;
      } else {
        piece_unit = unit;
        next = pmla_plan_line_next(s, blocks, first, total, N, &unit);
      }
      if (piece_unit >= N)
        piece_unit = (int32_t)N - 1;
      while (filled < piece_unit)
        out->work_indptr[++filled] = items;
      int32_t word[PMLA_WI_WORDS];
      int64_t kb = first * PMLA_BLOCK_TOKENS, ke = next * PMLA_BLOCK_TOKENS;
      word[PMLA_WI_REQUEST] = r;
      word[PMLA_WI_PARTIAL] = split ? partials + p : -1;
      word[PMLA_WI_Q_BEGIN] = qb;
      word[PMLA_WI_Q_END] = qe;
      word[PMLA_WI_KV_BEGIN] = (int32_t)(kb < len ? kb : len);
      word[PMLA_WI_KV_END] = (int32_t)(ke < len ? ke : len);
      word[PMLA_WI_KV_LEN] = len;
      word[PMLA_WI_PIECE] = p;
      if (split)
        out->reduce_partial_map[partials + p] = partials + p;
      if (!pmla_plan_emit(in, out, &items, word)) {
        err |= PMLA_PLAN_ERR_OVERFLOW;
        break;
      }
      first = next;
    }
    if (split)
      partials += npieces;
    if (!piece_mode)
      s += OH + blocks;
  }
  while (filled < N)
    out->work_indptr[++filled] = items;
  out->reduce_indptr[reduces] = partials;
  int32_t *meta = out->work_meta_data;
  meta[PMLA_META_NUM_ITEMS] = items;
  meta[PMLA_META_NUM_REDUCE] = reduces;
  meta[PMLA_META_NUM_PARTIALS] = partials;
  meta[PMLA_META_MODE] = piece_mode;
  meta[PMLA_META_MAX_PIECES] = max_pieces;
  meta[PMLA_META_NUM_REQUESTS] = (int32_t)R;
  meta[PMLA_META_ERROR] |= err;
  meta[PMLA_META_NUM_ROWS] = rows;
  return err;
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
