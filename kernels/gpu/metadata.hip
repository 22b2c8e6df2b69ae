/* SPDX-License-Identifier: MIT */
/* metadata.hip - the metadata kernel: the planner of planner.h run by one
 * work-group. Every per-request decision is made by the functions the serial
 * pmla_plan calls (pmla_plan_describe / _line_cost / _piece_count /
 * _fill_next / _finish) and every piece is placed by the closed forms the
 * host's walk is tested against (pmla_plan_piece_at, pmla_plan_write_item);
 * this file supplies the prefix sums the serial loop keeps in variables
 * (block-wide scans over chunks of PLAN_THREADS requests) and the fill state
 * entering each request, which one thread walks per chunk (walk_chunk). So
 * the device schedule is the host's, bit for bit. No host sync, no
 * allocation, no copies: capturable in a graph together with the decode. */
#include <stdint.h>

#include "hip_compat.h"
#include "mla_gpu.h"
#include "pdl.h"
#include "plan_invariant.h"

/* 512: a batch of 1024 requests is two chunks (256 threads: 46.9 us per step
 * at b=1024 L=512, 41.5 with 512; equal below 512 requests) */
#define PLAN_THREADS 512
#define FIELD_BITS 21 /* a chunk's pieces stay below 2^21 (512 requests x 2048 units) */
#define FIELD_MASK ((1ll << FIELD_BITS) - 1)

namespace {

/* A 32-lane butterfly shuffle on both platforms (an AMD wavefront of 64
 * lanes is two independent 32-lane groups for it). */
template <typename T> __device__ __forceinline__ T shfl32_xor(T v, int m) {
#ifdef PMLA_PLATFORM_NVIDIA
  return __shfl_xor_sync(0xffffffffu, v, m);
#else
  return __shfl_xor(v, m, 32);
#endif
}

/* A 32-lane shuffle up on both platforms (as shfl32_xor's). */
__device__ __forceinline__ int32_t shfl32_up(int32_t v, int d) {
#ifdef PMLA_PLATFORM_NVIDIA
  return __shfl_up_sync(0xffffffffu, v, d);
#else
  return __shfl_up(v, d, 32);
#endif
}

/* A predicate's bits over the thread's 32-lane group (as shfl32_xor's). */
__device__ __forceinline__ uint32_t ballot32(int p) {
#ifdef PMLA_PLATFORM_NVIDIA
  return __ballot_sync(0xffffffffu, p);
#else
  return (uint32_t)(__ballot(p) >> (threadIdx.x & 32));
#endif
}

/* Exclusive prefix of x over the block; *sum gets the block's total. */
__device__ int64_t block_exclusive_scan(int64_t x, int64_t *buf, int64_t *sum) {
  const int t = threadIdx.x;
  buf[t] = x;
  __syncthreads();
  for (int off = 1; off < PLAN_THREADS; off <<= 1) {
    int64_t y = t >= off ? buf[t - off] : 0;
    __syncthreads();
    buf[t] += y;
    __syncthreads();
  }
  int64_t inclusive = buf[t];
  *sum = buf[PLAN_THREADS - 1];
  __syncthreads();
  return inclusive - x;
}

/* The fill steps the walk chains (planner.h's pmla_plan_ends): for steps
 * whose C < 2^30, the 32-bit step when no request is longer than a fresh
 * unit takes, else the 32-bit room step (one multiply-high division a
 * request, no branch); else the 64-bit step. */
struct Short32 {
  typedef pmla_plan_ends32 Ends;
  uint32_t capacity;
  __device__ __forceinline__ void next(Ends &l, int64_t b) const {
    pmla_plan_ends_step32(&l, (uint32_t)b, capacity);
  }
};
struct Long32 {
  typedef pmla_plan_ends32 Ends;
  uint32_t capacity;
  pmla_fastdiv per; /* P - OH */
  __device__ __forceinline__ void next(Ends &l, int64_t b) const {
    pmla_plan_room_step32_long(&l, (uint32_t)b, capacity, per);
  }
};
struct Step64 {
  typedef pmla_plan_ends Ends;
  int64_t capacity;
  __device__ __forceinline__ void next(Ends &l, int64_t b) const {
    pmla_plan_ends_step(&l, b, capacity);
  }
};

/* The fill is sequential: one thread walks a chunk's n requests (blocks in
 * shared memory) from where the previous chunk left it (`run`),
 * recording the fill state entering each request; the blocks are read
 * ahead of the chain, AHEAD at a time with no branch between the steps. A
 * warp settling the requests that fit 32 at a time took ~410 cycles per
 * unit boundary (docs/performance.md). The threads then take their pieces
 * from the recorded units (pieces_of). */
template <typename Step>
__device__ __forceinline__ void walk_chunk(const Step st, const int64_t *__restrict__ blocks,
                                           int32_t n, pmla_plan_ends &run,
                                           int32_t *__restrict__ unit_at,
                                           int64_t *__restrict__ room_at) {
  enum { AHEAD = 8 };
  typename Step::Ends l;
  l.s = 0; /* positions restart at each chunk: only end - s carries */
  l.end = (decltype(l.end))(run.end - run.s);
  l.unit = run.unit;
  auto step = [&](int32_t i, int64_t b) {
    unit_at[i] = l.unit;
    room_at[i] = (int64_t)(l.end - l.s);
    st.next(l, b);
  };
  int32_t i = 0;
  for (; i + AHEAD <= n; i += AHEAD) {
    int64_t b[AHEAD];
#pragma unroll
    for (int k = 0; k < AHEAD; k++)
      b[k] = blocks[i + k];
#pragma unroll
    for (int k = 0; k < AHEAD; k++)
      step(i + k, b[k]);
  }
  for (; i < n; i++)
    step(i, blocks[i]);
  run.s = 0;
  run.end = (int64_t)(l.end - l.s);
  run.unit = l.unit;
}

/* walk_chunk with the 64-bit step (steps of 2^30 blocks or more): out of
 * line, so the code that common steps run stays together */
__device__ __noinline__ void walk_long64(const int64_t *blocks, int32_t n, int64_t capacity,
                                         pmla_plan_ends &run, int32_t *unit_at,
                                         int64_t *room_at) {
  walk_chunk(Step64{capacity}, blocks, n, run, unit_at, room_at);
}

/* walk_chunk with the cheapest step that is exact for this step's sizes */
__device__ __forceinline__ void walk(int64_t total, int64_t max_blocks, const int64_t *blocks,
                                     int32_t n, int64_t capacity, pmla_plan_ends &run,
                                     int32_t *unit_at, int64_t *room_at) {
  if (total < (1 << 30) && max_blocks <= capacity - PMLA_SPLIT_OVERHEAD)
    walk_chunk(Short32{(uint32_t)capacity}, blocks, n, run, unit_at, room_at);
  else if (total < (1 << 30))
    walk_chunk(Long32{(uint32_t)capacity,
                      pmla_fastdiv_make((uint32_t)(capacity - PMLA_SPLIT_OVERHEAD))},
               blocks, n, run, unit_at, room_at);
  else
    walk_long64(blocks, n, capacity, run, unit_at, room_at);
}

/* Request t's pieces in the chunk walk_chunk recorded (*unit_end: the unit
 * after its last request). */
__device__ __forceinline__ int32_t pieces_of(int32_t t, int32_t n, const int32_t *unit_at,
                                             const int64_t *room_at, const int32_t *unit_end) {
  return pmla_plan_ends_pieces(unit_at[t], room_at[t], t + 1 < n ? unit_at[t + 1] : *unit_end);
}

/* Whether the fill gives any request more pieces than the cap: a whole
 * walk, a chunk of requests at a time (out of line: capped sparse steps
 * only). */
__device__ __noinline__ int walk_over_cap(const pmla_plan_input &in, const pmla_plan_shape &sh,
                                          int64_t max_blocks, int64_t *blocks, int32_t *unit_at,
                                          int64_t *room_at, int32_t *unit_end,
                                          int32_t *s_piece_mode) {
  const int t = threadIdx.x;
  const int32_t R = in.num_requests;
  pmla_plan_ends run = pmla_plan_ends_of(pmla_plan_fill_start(&sh)); /* thread 0's */
  int32_t scratch = 0;
  for (int32_t c0 = 0; c0 < R && !*s_piece_mode; c0 += PLAN_THREADS) {
    const int32_t n = R - c0 < PLAN_THREADS ? R - c0 : PLAN_THREADS;
    if (t < n)
      blocks[t] = pmla_plan_describe(&in, c0 + t, &scratch).blocks;
    __syncthreads();
    if (t == 0) {
      walk(sh.total, max_blocks, blocks, n, sh.capacity, run, unit_at, room_at);
      *unit_end = run.unit;
    }
    __syncthreads();
    if (t < n && pieces_of(t, n, unit_at, room_at, unit_end) > in.split_cap)
      atomicOr(s_piece_mode, 1);
    __syncthreads();
  }
  return *s_piece_mode;
}

/* Exclusive prefix of a count over the block (sums below 2^31), *sum the
 * block's total: 32-lane shuffles, then each thread adds the totals of the
 * lane groups before its own, one barrier (block_exclusive_scan takes 20).
 * The caller's barrier follows before the next call writes the totals. */
__device__ __forceinline__ int32_t block_exclusive_count(int32_t x, int32_t *sum) {
  __shared__ int32_t s_group[PLAN_THREADS / 32];
  const int t = threadIdx.x, lane = t & 31, w = t >> 5;
  int32_t v = x;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int32_t y = shfl32_up(v, d);
    v += lane >= d ? y : 0;
  }
  if (lane == 31)
    s_group[w] = v;
  __syncthreads();
  int32_t before = 0, total = 0;
#pragma unroll
  for (int i = 0; i < PLAN_THREADS / 32; i++) {
    const int32_t s = s_group[i];
    before += i < w ? s : 0;
    total += s;
  }
  *sum = total;
  return before + v - x;
}

/* Sum and maxima over the block of one value per thread (a second
 * maximum where s_max2 is given), one shared atomic per warp each (64-bit
 * shared atomics are compare-and-swap loops). */
__device__ __forceinline__ void block_sum_max(unsigned long long sum, unsigned long long mx,
                                              unsigned long long *s_sum,
                                              unsigned long long *s_max,
                                              unsigned long long mx2 = 0,
                                              unsigned long long *s_max2 = nullptr) {
  for (int o = 16; o >= 1; o >>= 1) {
    sum += shfl32_xor(sum, o);
    unsigned long long y = shfl32_xor(mx, o);
    mx = y > mx ? y : mx;
    if (s_max2) {
      y = shfl32_xor(mx2, o);
      mx2 = y > mx2 ? y : mx2;
    }
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(s_sum, sum);
    if (s_max)
      atomicMax(s_max, mx);
    if (s_max2)
      atomicMax(s_max2, mx2);
  }
}

/* The threads that share one of n counts: a power of two, at most a warp,
 * so that `threads` threads (whole warps) cover n of them. */
__device__ __forceinline__ int group_of(int32_t n, int threads = PLAN_THREADS) {
  int g = 32;
  while (g > 1 && (int64_t)n * g > threads)
    g >>= 1;
  return g;
}
/* The sum over an aligned group of g lanes (every lane of the warp calls). */
__device__ __forceinline__ int32_t group_sum(int32_t v, int g) {
  for (int o = 1; o < g; o <<= 1)
    v += shfl32_xor(v, o);
  return v;
}

/* Per request of a chunk of PLAN_THREADS, what the threads that write its
 * work items need (shared memory; the kernel's arrays, reused) */
struct InvReqs {
  int64_t *cum;          /* work before the request's first chunk */
  int64_t *chunk;        /* chunk size */
  int32_t *len, *qb, *qe;
  int32_t *item;         /* first item, relative to the chunk of requests' */
  int32_t *slot0;        /* split: the first piece's slot; -1 whole */
  int32_t *u0;           /* the unit of chunk 0 */
  int32_t *na;           /* chunks n | first-piece chunks a << 8 */
};

/* The sums of pmla_inv_sum, block-wide (shared memory). */
struct InvSums {
  unsigned long long total, max_cost, chunks, pieces, slots, max_piece;
  unsigned long long not_min; /* ~ the cheapest request's cost: a maximum */
};

/* The dealt placements (plan_invariant.h: at most PLAN_THREADS pieces and
 * units), of a batch-invariant step (plan_deal) or of a default step's
 * whole requests (deal_whole). Each piece is ranked by decreasing cost
 * (deal_rank), the ranks are dealt to the units a round at a time
 * (deal_rounds), each unit's items are counted and scanned into
 * work_indptr (deal_items), then each piece's items written by the thread
 * of its rank. By request: n_at chunks, poff_at first piece, first_at
 * first split slot (-1 whole); by piece: req_of; by rank: piece_of,
 * item_at, unit_of (plan_deal's: deal_whole writes its items by rank);
 * perm and load: the deal's. */
struct DealArrays {
  int32_t *n_at, *poff_at, *first_at, *req_of, *piece_of, *item_at, *unit_of;
  int32_t *perm; /* 2 PLAN_THREADS */
  int64_t *load; /* by unit */
};
/* A deal's ranks: the rank of each of the P keys (all differ; key_of(j))
 * is the count of keys below it, counted by up to a warp's threads of the
 * `threads` threads (whole warps, P of them at least) this one is thread t
 * of; piece_of[rank] = its index. No barrier: the caller's (b=128 took ~2
 * us more with a bitonic sort's 28 barrier rounds). */
template <typename KeyOf>
__device__ __forceinline__ void deal_rank(KeyOf key_of, int32_t P, int t, int threads,
                                          int32_t *piece_of) {
  const int G = group_of(P, threads), k = t / G;
  const int64_t mine = k < P ? key_of(k) : INT64_MIN;
  int32_t rank = 0;
#pragma unroll 4
  for (int32_t j = t % G; j < P; j += G)
    rank += key_of(j) < mine;
  rank = group_sum(rank, G);
  if (k < P && t % G == 0)
    piece_of[rank] = k;
}

/* The threads that count the deal's ranks while thread 0 walks the fill:
 * on NVIDIA the warps on the other three schedulers (warp w runs on
 * scheduler w % 4), so that the walk keeps its scheduler's issue slots; on
 * AMD the wavefronts after the walker's. *ti: this thread's index among
 * them. */
#ifdef PMLA_PLATFORM_NVIDIA
constexpr int BESIDE_THREADS = PLAN_THREADS / 4 * 3;
__device__ __forceinline__ bool beside_walk(int t, int *ti) {
  const int w = t >> 5;
  *ti = (w - (w >> 2) - 1) * 32 + (t & 31);
  return (w & 3) != 0;
}
#else
constexpr int BESIDE_THREADS = PLAN_THREADS - 64;
__device__ __forceinline__ bool beside_walk(int t, int *ti) {
  *ti = t - 64;
  return t >= 64;
}
#endif

/* The deal's ranks of P keys in keys[] (all differ, each with its index
 * in its low word, as pmla_inv_deal_key's): piece_of[rank] = index.
 * Counted (deal_rank), or with SORT more than 128 keys sorted: a bitonic
 * sort of the next power of two whose strides below 32 are shuffles and
 * the rest (at most 10) pass through shared memory, alternating two arrays
 * so one barrier a stride suffices (counting 512 keys takes 512 compares a
 * thread). Every thread calls; the caller's barrier follows. */
template <bool SORT>
__device__ __forceinline__ void deal_order(const int64_t *keys, int32_t P, int32_t *piece_of) {
  if (!SORT || P <= 128) {
    deal_rank([&](int32_t j) { return keys[j]; }, P, threadIdx.x, PLAN_THREADS, piece_of);
    return;
  }
  static_assert(PMLA_INV_DEAL_MAX <= PLAN_THREADS && (PLAN_THREADS & (PLAN_THREADS - 1)) == 0,
                "one key a thread, a power of two of them");
  __shared__ int64_t s_pass[2][PLAN_THREADS];
  const int t = threadIdx.x;
  int64_t v = t < P ? keys[t] : INT64_MAX;
  int32_t S = 256;
  while (S < P)
    S <<= 1;
  int pass = 0;
#pragma unroll 1 /* a loop: less code (smaller kernels ran faster) */
  for (int32_t k = 2; k <= S; k <<= 1)
#pragma unroll 1
    for (int32_t j = k >> 1; j > 0; j >>= 1) {
      int64_t o;
      if (j < 32) {
        o = shfl32_xor(v, j);
      } else {
        s_pass[pass][t] = v;
        __syncthreads();
        o = s_pass[pass][t ^ j];
        pass ^= 1;
      }
      /* ascending where bit k of t is clear; the lower of a pair keeps the less */
      const bool less = ((t & k) == 0) == ((t & j) == 0);
      v = (o < v) == less ? o : v;
    }
  if (t < P)
    piece_of[t] = (int32_t)v;
}

/* The deal of the ranked keys, a round at a time (plan_invariant.h): unit
 * u gets rank perm[k N + u] in round k (-1: none), the unit of rank i is
 * unit_of[i] (not in a WHOLE deal). A whole deal (limit < INT64_MAX) gives
 * way, returning 0, where the second round's first piece would take the
 * unit holding the N-th costliest over the limit, or after a round that
 * takes any unit over (loads only grow). A round reads the loads from one
 * array and writes them to the other, and its over-limit flag is its own,
 * so one barrier a round suffices. WHOLE, deal_whole's: up to 64 units,
 * each unit's place counted by ballots (below), and no unit_of. */
template <bool WHOLE>
__device__ __forceinline__ int deal_rounds(const int64_t *buf, int32_t P, int32_t N,
                                           const DealArrays &a, int64_t limit) {
  const int t = threadIdx.x;
  if (limit < INT64_MAX && P > N &&
      pmla_inv_key_cost(buf[a.piece_of[N - 1]]) + pmla_inv_key_cost(buf[a.piece_of[N]]) > limit)
    return 0;
  const int32_t rounds = pmla_inv_rounds(P, N);
  __shared__ int64_t s_next[PMLA_INV_DEAL_MAX];
  __shared__ int32_t s_over[2]; /* round k's in s_over[k & 1] */
  int64_t *load = a.load, *next = s_next;
  if (t < N)
    load[t] = 0;
  if (t < 2)
    s_over[t] = 0;
  /* Up to 64 units, lane m of 32-lane group w places unit w + 16 m, its
   * place counted by ballots of the loads of units lane and lane + 32
   * (each read once a round); more, GU threads count a unit's and the
   * first of them places it */
  const int ballots = WHOLE && N <= 64, GU = group_of(N);
  const int u = ballots ? (t >> 5) + 16 * (t & 31) : t % GU == 0 ? t / GU : PMLA_INV_DEAL_MAX;
  /* unit v (load l) comes before unit w (load m): by load, ties by unit */
  const auto before = [](int64_t l, int v, int64_t m, int w) { return l < m || (l == m && v < w); };
  for (int32_t k = 0; k < rounds; k++) {
    __syncthreads();
    if (k > 0 && s_over[(k - 1) & 1])
      return 0;
    /* the unit's place among the units by increasing load (ties by
     * unit): in the first round every load is 0 */
    int32_t pos = u;
    if (P >= N && k > 0 && ballots) {
      static_assert(PLAN_THREADS == 512, "16 groups of 32 lanes");
      const int lane = t & 31;
      const int64_t l0 = lane < N ? load[lane] : INT64_MAX;
      const int64_t l1 = lane + 32 < N ? load[lane + 32] : INT64_MAX;
#pragma unroll 1 /* unrolled, the kernel's code grew by 11 KiB and the steps
                   * that deal no rounds ran 0.2-0.4 us slower */
      for (int32_t m = 0, um = t >> 5; um < N; m++, um += 16) {
        const int64_t mine = load[um];
        int32_t c = __popc(ballot32(before(l0, lane, mine, um)));
        if (N > 32)
          c += __popc(ballot32(before(l1, lane + 32, mine, um)));
        if (lane == m)
          pos = c;
      }
    } else if (P >= N && k > 0) {
      const int gu = t / GU;
      const int64_t mine = gu < N ? load[gu] : 0;
      pos = 0;
#pragma unroll 4
      for (int32_t v = t % GU; v < N; v += GU)
        pos += before(load[v], v, mine, gu);
      pos = group_sum(pos, GU);
    }
    if (u < N) {
      const int32_t i = P < N ? pmla_inv_spaced_rank(u, N, P) : k * N + pos < P ? k * N + pos : -1;
      a.perm[k * N + u] = i;
      int64_t l = load[u];
      if (i >= 0) {
        if (!WHOLE)
          a.unit_of[i] = u;
        l += pmla_inv_key_cost(buf[a.piece_of[i]]);
        if (l > limit)
          s_over[k & 1] = 1; /* 0 here: round k - 2 was read as not over */
      }
      next[u] = l;
    }
    int64_t *const was = load;
    load = next;
    next = was;
  }
  __syncthreads();
  return !s_over[(rounds - 1) & 1];
}

/* deal_rounds where every piece costs the same and the ranks are in order
 * (piece_of[i] = i): before each round every load is equal, so unit u's
 * place is u in all of them (fewer pieces than units: spaced), and the deal
 * fits where the fullest unit's final load does. Out of line: the other
 * deals' code stays as it was (inlined, the ragged deals ran 1-2 us
 * slower). */
__device__ __noinline__ int deal_equal(const int64_t *buf, int32_t P, int32_t N, int32_t *perm,
                                       int64_t limit) {
  const int t = threadIdx.x;
  int over = 0;
  if (t < N) {
    int64_t l = 0;
    for (int32_t k = 0; k < pmla_inv_rounds(P, N); k++) {
      const int32_t i = P < N ? pmla_inv_spaced_rank(t, N, P) : k * N + t < P ? k * N + t : -1;
      perm[k * N + t] = i;
      if (i >= 0)
        l += pmla_inv_key_cost(buf[i]);
    }
    over = l > limit;
  }
  return !__syncthreads_or(over);
}

/* Each unit's items counted (items_of(rank)) and scanned into work_indptr,
 * and each rank's first item in item_at; returns the step's items. */
template <typename ItemsOf>
__device__ __forceinline__ int32_t deal_items(int32_t N, int32_t rounds, const DealArrays &a,
                                              const pmla_plan_output &out, ItemsOf items_of) {
  const int t = threadIdx.x;
  int32_t count = 0; /* the step's items fit max_items */
  if (t < N)
    for (int32_t k = 0; k < rounds; k++)
      count += a.perm[k * N + t] >= 0 ? items_of(a.perm[k * N + t]) : 0;
  int32_t all;
  const int32_t start = block_exclusive_count(count, &all);
  if (t < N) {
    out.work_indptr[t] = start;
    int32_t at = start;
    for (int32_t k = 0; k < rounds; k++) {
      const int32_t i = a.perm[k * N + t];
      if (i >= 0) {
        a.item_at[i] = at;
        at += items_of(i);
      }
    }
  }
  __syncthreads();
  return all;
}

/* A batch-invariant step's deal: each request's pieces, split slots and
 * reduce entry numbered by one scan, then ranked, dealt and written. */
__device__ void plan_deal(const pmla_plan_input &in, const pmla_plan_output &out, int place,
                          int64_t *buf, const DealArrays &a, int32_t *s_err, int32_t *s_rows,
                          int32_t *s_max_pieces) {
  static_assert(PMLA_INV_DEAL_MAX <= PLAN_THREADS, "one piece and one unit a thread");
  const int t = threadIdx.x;
  const int32_t R = in.num_requests, N = in.num_units, budget = in.max_partials - N;
  int32_t scratch = 0, rows = 0, n = 0, split = 0;
  if (t < R) {
    const pmla_plan_req q = pmla_plan_describe(&in, t, &scratch);
    n = pmla_inv_chunks(q.len, pmla_inv_chunk(q.len, in.uniform_len, in.inv_least));
    split = place == PMLA_INV_PLACE_PIECES && n > 1;
    rows = q.qe - q.qb;
  }
  int64_t sum;
  const int64_t packed = (int64_t)(split ? n : t < R) | ((int64_t)(split ? n : 0) << FIELD_BITS) |
                         ((int64_t)split << (2 * FIELD_BITS));
  const int64_t before = block_exclusive_scan(packed, buf, &sum);
  const int32_t P = (int32_t)(sum & FIELD_MASK), slots = (int32_t)((sum >> FIELD_BITS) & FIELD_MASK);
  const int32_t reduces = (int32_t)(sum >> (2 * FIELD_BITS));
  if (t < R) {
    const int32_t first = (int32_t)((before >> FIELD_BITS) & FIELD_MASK);
    a.n_at[t] = n;
    a.poff_at[t] = (int32_t)(before & FIELD_MASK);
    a.first_at[t] = split ? first : -1;
    if (split) {
      const int32_t red = (int32_t)(before >> (2 * FIELD_BITS));
      out.reduce_indptr[red] = first;
      out.reduce_final_map[red] = t;
      for (int32_t j = 0; j < n; j++)
        out.reduce_partial_map[first + j] = first + j;
      atomicMax(s_max_pieces, n);
    } else {
      atomicMax(s_max_pieces, 1);
    }
    for (int32_t j = 0; j < (split ? n : 1); j++)
      a.req_of[a.poff_at[t] + j] = t;
  }
  __syncthreads();
  int64_t key = INT64_MAX;
  if (t < P) {
    const int32_t r = a.req_of[t], j = t - a.poff_at[r];
    const pmla_plan_req q = pmla_plan_describe(&in, r, &scratch);
    const int32_t chunk = pmla_inv_chunk(q.len, in.uniform_len, in.inv_least);
    key = pmla_inv_deal_key(pmla_inv_piece_cost(&q, chunk, a.n_at[r], j, a.first_at[r] >= 0), t);
  }
  buf[t] = key;
  __syncthreads();
  /* counted: with the sort and the ballots in this kernel every one of
   * its steps ran 0.5-1.5 us slower, those it deals and those it does not
   * (H100, docs/performance.md) */
  deal_order<false>(buf, P, a.piece_of);
  __syncthreads();
  deal_rounds<false>(buf, P, N, a, INT64_MAX);
  /* a piece's items: a whole request's chunks, or one */
  const int32_t all = deal_items(N, pmla_inv_rounds(P, N), a, out, [&](int32_t i) {
    const int32_t r = a.req_of[a.piece_of[i]];
    return a.first_at[r] >= 0 ? 1 : a.n_at[r];
  });
  if (t < P) {
    const int32_t p = a.piece_of[t], r = a.req_of[p], u = a.unit_of[t];
    const pmla_plan_req q = pmla_plan_describe(&in, r, &scratch);
    const int32_t chunk = pmla_inv_chunk(q.len, in.uniform_len, in.inv_least);
    if (a.first_at[r] < 0) {
      pmla_inv_write_whole(&out, r, &q, chunk, a.n_at[r], a.item_at[t], u, budget + u);
    } else {
      const int32_t j = p - a.poff_at[r];
      int32_t flags;
      const int32_t slot = pmla_inv_item_slot(a.n_at[r], 1, a.first_at[r], 0, j, &flags);
      pmla_inv_write_item(&out, r, &q, chunk, a.item_at[t], u, u, slot, j, flags);
    }
  }
  atomicAdd(s_rows, rows);
  __syncthreads();
  pmla_inv_finish(&in, &out, all, slots, reduces, N - 1, *s_max_pieces, *s_rows, *s_err, t,
                  PLAN_THREADS);
}

/* A whole request's deal key (pmla_plan_dealt's with one chunk a request). */
__device__ __forceinline__ int64_t whole_key(int64_t blocks, int32_t r) {
  return pmla_inv_deal_key(pmla_inv_cost(1, blocks), r);
}

/* Request r's length and query rows (shared memory, by request). */
struct ReqCols {
  const int32_t *len, *qb, *qe;
};

/* Where the deal's ranks come from: counted here, counted beside the
 * fill's walk (a.piece_of holds them), or every request equally long
 * (ties go in request order: rank r is request r). */
enum DealRanks { RANKS_COUNT, RANKS_BESIDE, RANKS_EQUAL };

/* The default mode's deal (pmla_plan_step): every request whole, one
 * piece and one item each (plan_deal's numbering with one chunk a request:
 * piece r is request r), or nothing written and 0 where the fullest unit
 * would hold more than limit. q is request t's. */
__device__ int deal_whole(const pmla_plan_input &in, const pmla_plan_output &out, int64_t *buf,
                          const DealArrays &a, const ReqCols &rc, const pmla_plan_req &q,
                          DealRanks ranks, int32_t *s_err, int32_t *s_rows, int64_t limit) {
  const int t = threadIdx.x;
  const int32_t R = in.num_requests, N = in.num_units;
  buf[t] = t < R ? whole_key(q.blocks, t) : INT64_MAX;
  __syncthreads();
  if (ranks == RANKS_COUNT)
    deal_order<true>(buf, R, a.piece_of);
  else if (ranks == RANKS_EQUAL && t < R)
    a.piece_of[t] = t;
  if (ranks != RANKS_BESIDE)
    __syncthreads();
  if (!(ranks == RANKS_EQUAL ? deal_equal(buf, R, N, a.perm, limit)
                             : deal_rounds<true>(buf, R, N, a, limit)))
    return 0;
  const int32_t all = deal_items(N, pmla_inv_rounds(R, N), a, out, [](int32_t) { return 1; });
  if (t < R) {
    const int32_t r = a.piece_of[t];
    pmla_plan_store_item(&out, a.item_at[t], r, -1, rc.qb[r], rc.qe[r], 0, rc.len[r], rc.len[r],
                         0);
  }
  atomicAdd(s_rows, q.qe - q.qb); /* zero past the requests */
  __syncthreads();
  pmla_inv_finish_as(&in, &out, PMLA_DEALT_MODE, all, 0, 0, N - 1, 1, *s_rows, *s_err, t,
                     PLAN_THREADS);
  return 1;
}

/* The batch-invariant schedule (plan_invariant.h) placed by the whole
 * block: a request's chunks go where their midpoints fall on the line of all
 * work, and where a request starts on that line is a prefix sum of the
 * requests' costs, so each thread places its own request. Only the split
 * budget is spent in request order; one thread walks it for a chunk of
 * requests when those that would split do not all fit it. The items are
 * then written one a thread across the whole chunk of requests (a lone
 * request's 64 chunks no longer by one thread: b=1 L=131072 took 25 us).
 * Equal to pmla_plan_invariant word for word (t_plan_exact,
 * tests/plan_emu.cc), which one thread took 135-165 us at b=128. */
__device__ void plan_invariant(const pmla_plan_input &in, const pmla_plan_output &out,
                               int64_t *buf, int32_t *want, int32_t *split_at, int32_t *last_unit,
                               const InvReqs &rq, InvSums *ss, int32_t *s_err, int32_t *s_rows,
                               int32_t *s_max_pieces) {
  const int t = threadIdx.x;
  const int32_t R = in.num_requests, N = in.num_units;
  const int32_t budget = in.max_partials - N; /* slots for splits; then one per unit */
  if (t == 0) {
    ss->total = ss->max_cost = ss->chunks = ss->pieces = ss->slots = ss->max_piece = 0;
    ss->not_min = 0;
    *s_err = *s_rows = *s_max_pieces = 0;
  }
  __syncthreads();
  int32_t err = 0, scratch = 0;
  pmla_inv_sums mine = {0, 0, 0, 0, 0, 0, INT64_MAX}; /* this thread's requests' */
  for (int32_t r = t; r < R; r += PLAN_THREADS) {
    const pmla_plan_req q = pmla_plan_describe(&in, r, &err);
    const int32_t chunk = pmla_inv_chunk(q.len, in.uniform_len, in.inv_least);
    pmla_inv_sum_add(&mine, &q, chunk, pmla_inv_chunks(q.len, chunk));
  }
  typedef unsigned long long u64;
  block_sum_max((u64)mine.total, (u64)mine.max_cost, &ss->total, &ss->max_cost);
  block_sum_max((u64)mine.chunks, (u64)mine.max_piece, &ss->chunks, &ss->max_piece);
  block_sum_max((u64)mine.pieces, ~(u64)mine.min_cost, &ss->pieces, &ss->not_min);
  block_sum_max((u64)mine.slots, 0, &ss->slots, NULL);
  atomicOr(s_err, err);
  __syncthreads();
  const int64_t total = ss->total > 0 ? (int64_t)ss->total : 1;
  if (ss->chunks > (unsigned long long)in.max_items) {
    pmla_inv_empty(&in, &out, *s_err, t, PLAN_THREADS);
    return;
  }
  const pmla_inv_sums sums = {total,
                              (int64_t)ss->max_cost,
                              (int64_t)ss->chunks,
                              (int64_t)ss->pieces,
                              (int64_t)ss->slots,
                              (int64_t)ss->max_piece,
                              (int64_t)~ss->not_min};
  const int place = pmla_inv_placement(R, N, budget, &sums);
  if (place != PMLA_INV_PLACE_LINE) {
    const DealArrays sa = {want,  rq.item, rq.slot0, rq.len, split_at, last_unit, rq.qb,
                             (int32_t *)rq.cum, rq.chunk};
    plan_deal(in, out, place, buf, sa, s_err, s_rows, s_max_pieces);
    return;
  }
  int64_t at_cum = 0; /* the prefix before the chunk of requests */
  int32_t at_items = 0, at_slots = 0, at_reduces = 0, at_unit = 0;
  int32_t rows = 0, max_pieces = 0;
  for (int32_t c0 = 0; c0 < R; c0 += PLAN_THREADS) {
    const int32_t r = c0 + t, valid = r < R;
    const int32_t nreq = R - c0 < PLAN_THREADS ? R - c0 : PLAN_THREADS;
    pmla_plan_req q = {0, 0, 0, 0};
    int32_t chunk = 0, n = 0;
    if (valid) {
      q = pmla_plan_describe(&in, r, &scratch);
      chunk = pmla_inv_chunk(q.len, in.uniform_len, in.inv_least);
      n = pmla_inv_chunks(q.len, chunk);
    }
    int64_t cost_sum;
    const int64_t cum =
        at_cum + block_exclusive_scan(valid ? pmla_inv_cost(n, q.blocks) : 0, buf, &cost_sum);
    int32_t u0 = 0, need = 0; /* need: the slots a split takes, 0 whole */
    int32_t a = n;
    if (valid) {
      u0 = pmla_inv_chunk_unit(cum, chunk, q.len, 0, N, total);
      a = pmla_inv_first_piece(&q, chunk, n, cum, u0, N, total);
      need = a < n ? 1 + (n - a) : 0;
    }
    /* the split budget, in request order, as the serial planner spends it */
    int64_t need_sum;
    block_exclusive_scan(need, buf, &need_sum);
    int split = need > 0;
    if (at_slots + need_sum > budget) {
      want[t] = need;
      __syncthreads();
      if (t == 0) {
        int32_t slots = at_slots;
        for (int32_t i = 0; i < nreq; i++) {
          const int s = want[i] > 0 && slots + want[i] <= budget;
          split_at[i] = s;
          slots += s ? want[i] : 0;
        }
      }
      __syncthreads();
      split = valid && split_at[t];
    }
    int64_t count_sum;
    const int64_t packed = (int64_t)n | ((int64_t)(split ? need : 0) << FIELD_BITS) |
                           ((int64_t)split << (2 * FIELD_BITS));
    const int64_t before = block_exclusive_scan(packed, buf, &count_sum);
    const int32_t slot0 = at_slots + (int32_t)((before >> FIELD_BITS) & FIELD_MASK);
    const int32_t red0 = at_reduces + (int32_t)(before >> (2 * FIELD_BITS));
    /* the unit of the request's last item (a request's units only grow) */
    if (valid)
      last_unit[t] = !split ? u0 : pmla_inv_chunk_unit(cum, chunk, q.len, n - 1, N, total);
    /* what the item writers need (want and split_at are free again) */
    if (valid) {
      rows += q.qe - q.qb;
      rq.cum[t] = cum;
      rq.chunk[t] = chunk;
      rq.len[t] = q.len;
      rq.qb[t] = q.qb;
      rq.qe[t] = q.qe;
      rq.item[t] = (int32_t)(before & FIELD_MASK);
      rq.slot0[t] = split ? slot0 : -1;
      rq.u0[t] = u0;
      static_assert(PMLA_INV_MAX_CHUNKS < 256, "n and a packed in 8 bits each");
      rq.na[t] = n | a << 8;
      /* the partial slots its reduce merges: the first piece's, then one
       * a chunk */
      const int32_t slots_merged = split ? 1 + n - a : 1;
      max_pieces = slots_merged > max_pieces ? slots_merged : max_pieces;
      if (split) {
        out.reduce_indptr[red0] = slot0;
        out.reduce_final_map[red0] = r;
        out.reduce_partial_map[slot0] = slot0;
      }
    }
    __syncthreads();
    /* the chunk of requests' items, one a thread: item k is chunk j of the
     * request whose first item is the last at or before k */
    const int32_t count = (int32_t)(count_sum & FIELD_MASK);
    for (int32_t k = t; k < count; k += PLAN_THREADS) {
      int32_t lo = 0, hi = nreq - 1;
      while (lo < hi) {
        const int32_t mid = (lo + hi + 1) >> 1;
        if (rq.item[mid] <= k)
          lo = mid;
        else
          hi = mid - 1;
      }
      const int32_t i = lo, j = k - rq.item[i];
      const int32_t ni = rq.na[i] & 0xff, ai = rq.na[i] >> 8, s0 = rq.slot0[i], ui = rq.u0[i];
      const int32_t ci = (int32_t)rq.chunk[i];
      const pmla_plan_req qi = {rq.len[i], rq.qb[i], rq.qe[i], 0};
      /* chunk jj's unit: the first piece's on u0, every later chunk where
       * its midpoint falls (units only grow along a request) */
      auto unit_of = [&](int32_t jj) {
        return s0 < 0 || jj < ai ? ui : pmla_inv_chunk_unit(rq.cum[i], ci, qi.len, jj, N, total);
      };
      const int32_t u = unit_of(j);
      const int32_t before_req = i == 0 ? at_unit : last_unit[i - 1];
      int32_t prev = before_req;
      if (j > 0) {
        const int32_t up = unit_of(j - 1);
        prev = up > prev ? up : prev;
      }
      int32_t flags;
      const int32_t slot = pmla_inv_item_slot(ni, ai, s0, budget + ui, j, &flags);
      if (s0 >= 0 && j >= ai) /* a partial of its own */
        out.reduce_partial_map[slot] = slot;
      pmla_inv_write_item(&out, c0 + i, &qi, ci, at_items + k, prev, u, slot, j, flags);
    }
    __syncthreads();
    at_cum += cost_sum;
    at_items += (int32_t)(count_sum & FIELD_MASK);
    at_slots += (int32_t)((count_sum >> FIELD_BITS) & FIELD_MASK);
    at_reduces += (int32_t)(count_sum >> (2 * FIELD_BITS));
    at_unit = last_unit[nreq - 1];
    __syncthreads();
  }
  atomicAdd(s_rows, rows);
  atomicMax(s_max_pieces, max_pieces);
  __syncthreads();
  pmla_inv_finish(&in, &out, at_items, at_slots, at_reduces, at_unit, *s_max_pieces, *s_rows,
                  *s_err, t, PLAN_THREADS);
}

/* The batch-invariant steps' kernel: its own, so the default steps'
 * kernel holds only the code they run (the smaller kernel ran its steps
 * faster; docs/design.md). */
__global__ void __launch_bounds__(PLAN_THREADS) pmla_plan_invariant_kernel(pmla_plan_input in,
                                                                            pmla_plan_output out) {
  __shared__ int64_t buf[PLAN_THREADS];
  __shared__ int64_t blocks[PLAN_THREADS];
  __shared__ int32_t unit_at[PLAN_THREADS];
  __shared__ int64_t room_at[PLAN_THREADS];
  __shared__ int32_t pieces[PLAN_THREADS];
  __shared__ int32_t len_at[PLAN_THREADS], qb_at[PLAN_THREADS], qe_at[PLAN_THREADS];
  __shared__ int32_t item_at[PLAN_THREADS];
  __shared__ int32_t part_at[PLAN_THREADS];
  __shared__ int32_t last_unit[PLAN_THREADS];
  __shared__ InvSums s_inv;
  __shared__ int32_t s_err, s_rows, s_max_pieces;
  pdl_wait();
  pdl_trigger();
  /* want and split_at (the budget walk) share pieces and unit_at with
   * rq.na and rq.u0: each thread writes its own entry after the walk */
  const InvReqs rq = {blocks, room_at, len_at, qb_at, qe_at, item_at, part_at, unit_at, pieces};
  plan_invariant(in, out, buf, pieces, unit_at, last_unit, rq, &s_inv, &s_err, &s_rows,
                 &s_max_pieces);
}

/* CAPPED: a split cap applies (pmla_plan_cap_applies, known to the host);
 * the instance for uncapped steps (every dense step) has no piece-mode
 * code */
template <bool CAPPED>
__global__ void __launch_bounds__(PLAN_THREADS) pmla_plan_kernel(pmla_plan_input in,
                                                                  pmla_plan_output out) {
  __shared__ int64_t buf[PLAN_THREADS];
  __shared__ int64_t blocks[PLAN_THREADS];
  __shared__ int32_t unit_at[PLAN_THREADS];
  __shared__ int64_t room_at[PLAN_THREADS];
  /* per request of the chunk, for the threads that place its pieces (with
   * blocks, and unit_at / room_at: its fill state, or room_at its line);
   * len_at, qb_at and qe_at also for a dealt step's items, written before
   * the walk */
  __shared__ int32_t len_at[PLAN_THREADS], qb_at[PLAN_THREADS], qe_at[PLAN_THREADS];
  __shared__ int32_t item_at[PLAN_THREADS]; /* first item, relative to the chunk's */
  __shared__ int32_t part_at[PLAN_THREADS]; /* first partial slot; -1 unsplit, -2 no room */
  __shared__ int32_t last_unit[PLAN_THREADS];
  __shared__ unsigned long long s_total, s_piece_total, s_max_blocks, s_not_min;
  __shared__ int32_t s_err, s_piece_mode, s_rows, s_max_pieces, s_unit_end;
  pdl_wait();
  pdl_trigger();
  const int t = threadIdx.x;
  const int32_t R = in.num_requests, N = in.num_units;
  const int64_t OH = PMLA_SPLIT_OVERHEAD;
  if (t == 0) {
    s_total = s_piece_total = s_max_blocks = s_not_min = 0;
    s_err = s_piece_mode = s_rows = s_max_pieces = 0;
  }
  __syncthreads();

  /* C, and the input errors (counted once, as serially). */
  int32_t err = 0, scratch = 0;
  unsigned long long part = 0, longest = 0, not_min = 0; /* ~ the shortest: a maximum */
  pmla_plan_req q0 = {0, 0, 0, 0}; /* request t, which the first chunk places */
  for (int32_t r = t; r < R; r += PLAN_THREADS) {
    const pmla_plan_req q = pmla_plan_describe(&in, r, &err);
    if (r == t)
      q0 = q;
    part += OH + (unsigned long long)q.blocks;
    longest = (unsigned long long)q.blocks > longest ? (unsigned long long)q.blocks : longest;
    not_min = ~(unsigned long long)q.blocks > not_min ? ~(unsigned long long)q.blocks : not_min;
  }
  block_sum_max(part, longest, &s_total, &s_max_blocks, not_min, &s_not_min);
  atomicOr(&s_err, err);
  err = 0;
  __syncthreads();
  pmla_plan_shape sh = pmla_plan_shape_of((int64_t)s_total, N);
  pmla_plan_ends run = pmla_plan_ends_of(pmla_plan_fill_start(&sh)); /* thread 0's */

  /* Piece mode when the fill gives any request more pieces than the cap;
   * no walk when even the longest request cannot get that many. */
  if (CAPPED && pmla_plan_cap_applies(&in) &&
      pmla_plan_fill_max_pieces((int64_t)s_max_blocks, sh.capacity) > in.split_cap) {
    sh.piece_mode = walk_over_cap(in, sh, (int64_t)s_max_blocks, blocks, unit_at, room_at,
                                  &s_unit_end, &s_piece_mode);
    if (sh.piece_mode) {
      part = 0;
      for (int32_t r = t; r < R; r += PLAN_THREADS) {
        pmla_plan_req q = pmla_plan_describe(&in, r, &scratch);
        part += (unsigned long long)pmla_plan_line_cost(&in, &sh, &q);
      }
      block_sum_max(part, 0, &s_piece_total, NULL);
      __syncthreads();
      sh.piece_total = s_piece_total ? (int64_t)s_piece_total : 1;
    }
  }

  /* Every request whole, dealt, where the fill would split one and the
   * fullest unit of the deal stays within P + OH (pmla_plan_step): tried
   * once the fill's walk has counted its splits, before it writes any
   * word; the deal's arrays are the placement's, which the fill rewrites
   * from its registers when the deal gives way. Not tried where it must
   * give way: some unit then holds the longest request, and with more
   * requests than units one holds two (the shortest or longer) */
  const int64_t limit = sh.capacity + OH;
  const int deal = !sh.piece_mode && R >= 1 && R <= PMLA_INV_DEAL_MAX &&
                   N <= PMLA_INV_DEAL_MAX && R <= in.max_items &&
                   OH + (int64_t)s_max_blocks <= limit &&
                   (R <= N || 2 * (OH + (int64_t)~s_not_min) <= limit);
  static_assert(PMLA_INV_DEAL_MAX <= PLAN_THREADS, "a dealt step is one chunk of requests");
  /* The deal's ranks: request order where every length is equal; else
   * counted beside the walk (beside_walk) from keys written before it,
   * one thread a key at least; else by the whole block once the deal is
   * tried */
  const DealRanks ranks = s_max_blocks == ~s_not_min   ? RANKS_EQUAL
                          : deal && R <= BESIDE_THREADS ? RANKS_BESIDE
                                                        : RANKS_COUNT;

  /* Placement, a chunk of requests at a time; `at` is the prefix before it. */
  pmla_plan_base at = {0, pmla_plan_fill_start(&sh), 0, 0, 0, 0};
  int32_t rows = 0, max_pieces = 0;
  for (int32_t c0 = 0; c0 < R; c0 += PLAN_THREADS) {
    const int32_t r = c0 + t, valid = r < R;
    const int32_t n = R - c0 < PLAN_THREADS ? R - c0 : PLAN_THREADS;
    pmla_plan_req q = q0;
    if (c0 > 0 && valid)
      q = pmla_plan_describe(&in, r, &scratch);
    pmla_plan_base base = at;
    int32_t npieces = 0;
    if (sh.piece_mode) {
      int64_t line_sum;
      base.line += block_exclusive_scan(valid ? pmla_plan_line_cost(&in, &sh, &q) : 0, buf,
                                        &line_sum);
      at.line += line_sum;
      npieces = valid ? pmla_plan_piece_count(q.blocks, sh.total, N, in.split_cap) : 0;
    } else {
      blocks[t] = q.blocks;
      len_at[t] = q.len;
      qb_at[t] = q.qb;
      qe_at[t] = q.qe;
      if (ranks == RANKS_BESIDE && valid)
        buf[t] = whole_key(q.blocks, t); /* the deal's keys, read by the ranks */
      __syncthreads();
      int ti;
      if (t == 0) {
        walk(sh.total, (int64_t)s_max_blocks, blocks, n, sh.capacity, run, unit_at, room_at);
        s_unit_end = run.unit;
      } else if (ranks == RANKS_BESIDE && beside_walk(t, &ti)) {
        /* the deal's ranks, in case the fill splits */
        deal_rank([&](int32_t j) { return buf[j]; }, n, ti, BESIDE_THREADS, part_at);
      }
      __syncthreads();
      if (valid) {
        /* within the units even past the last one (flagged below), as the
         * host's walk stays: the item writers index work_indptr by unit */
        base.fill.unit = unit_at[t] < N - 1 ? unit_at[t] : N - 1;
        base.fill.room = room_at[t];
        npieces = pieces_of(t, n, unit_at, room_at, &s_unit_end);
      }
    }
    int64_t split = npieces > 1;
    if (deal && __syncthreads_or((int)split)) {
      const DealArrays da = {len_at, qb_at, qe_at, item_at, part_at, last_unit, unit_at,
                             (int32_t *)blocks, room_at};
      if (deal_whole(in, out, buf, da, ReqCols{len_at, qb_at, qe_at}, q, ranks, &s_err, &s_rows,
                     limit))
        return;
      __syncthreads();
    }
    int64_t count_sum;
    int64_t packed = npieces | ((split * npieces) << FIELD_BITS) | (split << (2 * FIELD_BITS));
    int64_t before = block_exclusive_scan(packed, buf, &count_sum);
    base.items += (int32_t)(before & FIELD_MASK);
    base.partials += (int32_t)((before >> FIELD_BITS) & FIELD_MASK);
    base.reduces += (int32_t)(before >> (2 * FIELD_BITS));
    if (valid) {
      const int fits = pmla_plan_fits(&in, &base, npieces);
      if (!fits)
        err |= PMLA_PLAN_ERR_OVERFLOW;
      if (fits && split) {
        out.reduce_indptr[base.reduces] = base.partials;
        out.reduce_final_map[base.reduces] = r;
      }
      int64_t first, next;
      pmla_plan_piece_at(&in, &sh, &q, npieces, &base, npieces - 1, &first, &next, &last_unit[t]);
      len_at[t] = q.len;
      qb_at[t] = q.qb;
      qe_at[t] = q.qe;
      blocks[t] = q.blocks;
      unit_at[t] = base.fill.unit;
      room_at[t] = sh.piece_mode ? base.line : base.fill.room;
      item_at[t] = base.items - at.items;
      part_at[t] = !fits ? -2 : split ? base.partials : -1;
      rows += q.qe - q.qb;
      max_pieces = npieces > max_pieces ? npieces : max_pieces;
    }
    __syncthreads();
    /* Every item of the chunk, one per thread: its request by a search
     * over the requests' first items, its piece in closed form. */
    const int32_t items = (int32_t)(count_sum & FIELD_MASK);
    for (int32_t k = t; k < items; k += PLAN_THREADS) {
      int32_t lo = 0, hi = n - 1; /* the last request whose first item is <= k */
      if (items == n) /* one item per request */
        lo = hi = k;
      while (lo < hi) {
        const int32_t mid = (lo + hi + 1) >> 1;
        if (item_at[mid] <= k)
          lo = mid;
        else
          hi = mid - 1;
      }
      const int32_t partials = part_at[lo];
      if (partials == -2)
        continue;
      const pmla_plan_req q_lo = {len_at[lo], qb_at[lo], qe_at[lo], blocks[lo]};
      pmla_plan_base b_lo = at;
      b_lo.line = room_at[lo];
      b_lo.fill.unit = unit_at[lo];
      b_lo.fill.room = room_at[lo];
      b_lo.items = at.items + item_at[lo];
      const int32_t p = k - item_at[lo];
      const int32_t np = (lo + 1 < n ? item_at[lo + 1] : items) - item_at[lo];
      int64_t first, next, f0, n0;
      int32_t unit, prev;
      pmla_plan_piece_at(&in, &sh, &q_lo, np, &b_lo, p, &first, &next, &unit);
      if (p > 0)
        pmla_plan_piece_at(&in, &sh, &q_lo, np, &b_lo, p - 1, &f0, &n0, &prev);
      else
        prev = lo > 0 ? last_unit[lo - 1] : at.unit;
      pmla_plan_write_item(&out, c0 + lo, &q_lo, partials, b_lo.items, p, prev, unit, first,
                           next);
    }
    at.items += items;
    at.partials += (int32_t)((count_sum >> FIELD_BITS) & FIELD_MASK);
    at.reduces += (int32_t)(count_sum >> (2 * FIELD_BITS));
    at.unit = last_unit[n - 1];
    __syncthreads();
  }
  /* past the last unit: never (planner.h proves it) */
  if (t == 0 && !sh.piece_mode && run.unit > N - 1)
    err |= PMLA_PLAN_ERR_OVERFLOW;
  atomicOr(&s_err, err);
  atomicAdd(&s_rows, rows);
  atomicMax(&s_max_pieces, max_pieces);
  __syncthreads();
  pmla_plan_finish(&in, &out, sh.piece_mode, &at, s_max_pieces, s_rows, s_err, t, PLAN_THREADS);
}

} /* namespace */

extern "C" int pmla_gpu_image_error(void) {
  hipFuncAttributes fa;
  const hipError_t e = hipFuncGetAttributes(&fa, (const void *)pmla_plan_kernel<false>);
  if (e != hipSuccess)
    (void)hipGetLastError(); /* answered here: not left for the host's next check */
  return (int)e;
}

extern "C" int pmla_gpu_plan(const pmla_plan_input *in, const pmla_plan_output *out,
                             void *stream) {
  if (!in || !out || in->num_requests < 0 || in->num_units < 1 ||
      in->num_units > PMLA_GPU_MAX_UNITS)
    return (int)hipErrorInvalidValue;
  return (int)pdl_launch(in->invariant                   ? pmla_plan_invariant_kernel
                         : pmla_plan_cap_applies(in) ? pmla_plan_kernel<true>
                                                     : pmla_plan_kernel<false>, dim3(1),
                         dim3(PLAN_THREADS), 0, (hipStream_t)stream, *in, *out);
}
