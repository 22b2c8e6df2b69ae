/* SPDX-License-Identifier: MIT */
/* plan_emu.cc - the GPU metadata kernel (kernels/gpu/metadata.hip) run on
 * the CPU: one work-group of PLAN_THREADS contexts of one host thread,
 * __syncthreads a barrier, a warp's shuffles a 32-thread barrier around a
 * slot array, and shared memory the kernel's function statics. It plans random steps
 * (fill and piece mode, batch-invariant, requests of length 0 and bad
 * input, R across the kernel's 512-request chunks, 1..2048 units, short
 * and long requests, shrunken buffers) and compares the six buffers with
 * the host planner (planner.h, plan_invariant.h) word for word, so CI
 * checks the device planner's logic without a GPU; pmla-unit's
 * t_plan_exact compares the real kernel on a GPU.
 *
 *   plan-emu [plans [seed]]   (defaults: 300 plans, seed 1) */
#include <functional>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <csignal>
#include <ucontext.h>
#include <unistd.h>

/* the CPU stands in for the GPU: no HIP or CUDA header, these names instead */
#define PMLA_HIP_COMPAT_H
#define PMLA_GPU_PDL_H
#define PMLA_PLATFORM_NVIDIA 1
#define __device__
#define __global__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(n)
#define __shared__ static /* one work-group at a time: the statics are its shared memory */

typedef int hipError_t;
typedef void *hipStream_t;
enum { hipSuccess = 0, hipErrorInvalidValue = 1 };
struct dim3 {
  unsigned x;
  dim3(unsigned v) : x(v) {}
};
struct emu_thread_idx {
  int x;
};
static emu_thread_idx threadIdx; /* set by the scheduler before it runs a thread */

/* The work-group's threads are contexts of one OS thread (ucontext), run in
 * turn: each runs until it waits at a barrier, and a barrier opens when the
 * last of its threads arrives. Each pass takes the threads in a new order
 * (a random start, forwards or backwards), so a read that a missing
 * barrier leaves unordered sees the other thread's write missing on some
 * pass. */
enum { EMU_MAX_THREADS = 1024, EMU_STACK = 64 << 10 };
static ucontext_t g_sched, g_ctx[EMU_MAX_THREADS];
static char *g_stacks;
static int g_cur;

struct emu_barrier {
  int count, arrived;
  unsigned gen;
};
static void emu_wait(emu_barrier &b) {
  const unsigned gen = b.gen;
  if (++b.arrived == b.count) {
    b.arrived = 0;
    b.gen++;
    return;
  }
  const int me = g_cur;
  while (b.gen == gen)
    swapcontext(&g_ctx[me], &g_sched);
}
static emu_barrier g_block, g_warp[EMU_MAX_THREADS / 32];
static uint64_t g_lane_slot[EMU_MAX_THREADS];

static inline void __syncthreads() { emu_wait(g_block); }
/* call n of every thread uses slot n % 3 and clears slot (n + 1) % 3 before
 * it waits: that slot was last read in call n - 2, before call n - 1's
 * barrier opened, and next written in call n + 1, after this one's */
static int g_or_slot[3], g_or_calls[EMU_MAX_THREADS];
static inline int __syncthreads_or(int p) {
  const int n = g_or_calls[threadIdx.x]++;
  g_or_slot[(n + 1) % 3] = 0;
  if (p)
    g_or_slot[n % 3] = 1;
  emu_wait(g_block);
  return g_or_slot[n % 3];
}
/* every lane of the warp calls; each gets the value thread src passed */
template <typename T> static T emu_shfl(T v, int src) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "a shuffle moves at most 64 bits");
  const int t = threadIdx.x;
  uint64_t u = 0;
  memcpy(&u, &v, sizeof v);
  g_lane_slot[t] = u;
  emu_wait(g_warp[t / 32]);
  const uint64_t o = g_lane_slot[src];
  emu_wait(g_warp[t / 32]);
  T r;
  memcpy(&r, &o, sizeof r);
  return r;
}
template <typename T> static T __shfl_xor_sync(unsigned, T v, int m) {
  return emu_shfl(v, threadIdx.x ^ m);
}
/* lanes below d keep their own value, as on the GPU */
template <typename T> static T __shfl_up_sync(unsigned, T v, int d) {
  const int t = threadIdx.x;
  return emu_shfl(v, (t & 31) >= d ? t - d : t);
}
static unsigned __ballot_sync(unsigned, int p) {
  const int t = threadIdx.x;
  g_lane_slot[t] = p != 0;
  emu_wait(g_warp[t / 32]);
  unsigned bits = 0;
  for (int l = 0; l < 32; l++)
    bits |= (unsigned)g_lane_slot[(t & ~31) + l] << l;
  emu_wait(g_warp[t / 32]);
  return bits;
}
static int __popc(unsigned v) { return __builtin_popcount(v); }
template <class T> static T atomicAdd(T *p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}
template <class T> static T atomicOr(T *p, T v) {
  const T old = *p;
  *p = old | v;
  return old;
}
template <class T> static T atomicMax(T *p, T v) {
  const T old = *p;
  *p = old < v ? v : old;
  return old;
}
static inline void pdl_wait() {}
static inline void pdl_trigger() {}

static std::function<void()> g_body;
static bool g_done[EMU_MAX_THREADS];
static void emu_thread(int t) {
  g_body();
  g_done[t] = true;
}

/* the CPU runs every kernel: pmla_gpu_image_error's probe succeeds */
struct hipFuncAttributes {};
static hipError_t hipFuncGetAttributes(hipFuncAttributes *, const void *) { return hipSuccess; }
static hipError_t hipGetLastError() { return hipSuccess; }

/* kernel<<<1, block>>>(args...): the block's threads run to the end */
template <typename... P, typename... A>
static hipError_t pdl_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t, hipStream_t,
                             A... args) {
  const int n = (int)block.x;
  if (grid.x != 1 || n % 32 != 0 || n > EMU_MAX_THREADS)
    return hipErrorInvalidValue;
  if (!g_stacks && !(g_stacks = (char *)malloc((size_t)EMU_MAX_THREADS * EMU_STACK)))
    return hipErrorInvalidValue;
  g_block = {n, 0, 0};
  for (int w = 0; w < n / 32; w++)
    g_warp[w] = {32, 0, 0};
  g_body = [=] { kernel(args...); };
  for (int t = 0; t < n; t++) {
    g_done[t] = false;
    getcontext(&g_ctx[t]);
    g_ctx[t].uc_stack.ss_sp = g_stacks + (size_t)t * EMU_STACK;
    g_ctx[t].uc_stack.ss_size = EMU_STACK;
    g_ctx[t].uc_link = &g_sched;
    makecontext(&g_ctx[t], (void (*)())emu_thread, 1, t);
  }
  static uint64_t order = 0x9e3779b97f4a7c15ull;
  for (int running = n; running > 0;) {
    running = 0;
    order ^= order << 13;
    order ^= order >> 7;
    order ^= order << 17;
    const int start = (int)(order % (uint64_t)n), step = order >> 63 ? 1 : n - 1;
    for (int i = 0, t = start; i < n; i++, t = (t + step) % n)
      if (!g_done[t]) {
        g_cur = t;
        threadIdx.x = t;
        swapcontext(&g_sched, &g_ctx[t]);
        running += !g_done[t];
      }
  }
  return hipSuccess;
}

#include "gpu/metadata.hip"

static uint64_t g_rng = 1;
static uint32_t below(uint32_t n) { /* xorshift64 */
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return n ? (uint32_t)(g_rng % n) : 0;
}

/* A barrier that never opens (a kernel whose threads wait at different
 * barriers) spins the scheduler forever: fail instead of hanging the
 * suite. 300 plans take ~10 s. */
static void on_alarm(int) {
  static const char msg[] = "plan-emu: no end after 600 s (a barrier that never opens?)\n";
  ssize_t n = write(2, msg, sizeof msg - 1);
  (void)n;
  _exit(1);
}

int main(int argc, char **argv) {
  signal(SIGALRM, on_alarm);
  alarm(600);
  const int plans = argc > 1 ? atoi(argv[1]) : 300;
  /* odd and distinct for distinct seeds (the generator needs a nonzero state) */
  g_rng = argc > 2 ? strtoull(argv[2], NULL, 10) * 2 + 1 : 1;
  static const int32_t edge_r[] = {0, 1, 511, 512, 513, 1024, 1025};
  int fails = 0, kinds[4] = {0, 0, 0, 0}, splits = 0, places[3] = {0, 0, 0};
  for (int it = 0; it < plans; it++) {
    pmla_plan_input in;
    memset(&in, 0, sizeof in);
    int32_t R = it % 10 == 0 ? edge_r[(it / 10) % 7]
                : below(3) == 0 ? 400 + (int32_t)below(1300)
                                : (int32_t)below(600);
    int32_t N = below(3) == 0 ? 1 + (int32_t)below(4) : 1 + (int32_t)below(below(4) ? 300 : 2048);
    in.num_requests = R;
    in.num_units = N;
    in.invariant = below(3) == 0;
    /* a ragged batch (2048..6144 tokens) on about as many units as requests */
    const int ragged = in.invariant && below(3) == 0;
    if (ragged) {
      R = in.num_requests = 8 + (int32_t)below(160);
      N = in.num_units = R * (6 + (int32_t)below(5)) / 8;
    }
    in.split_cap = below(2) ? 0 : (int32_t)below((uint32_t)N + 2);
    const int piece = !in.invariant && it % 3 == 1; /* a cap that binds: piece mode */
    /* a default step's ragged batch of at most 512 requests on fewer units:
     * the fill splits, so the kernel deals (its ranks beside the walk up to
     * 240 requests); half of them equally long (ranks in request order) */
    const int ragged_dealt = !in.invariant && !piece && !ragged && below(3) == 0;
    const int32_t equal_len = ragged_dealt && below(2) ? 2048 + (int32_t)below(4097) : 0;
    if (ragged_dealt) {
      /* a third of them past the ranks beside the walk: the deal sorts */
      R = in.num_requests = below(3) == 0 ? 241 + (int32_t)below(272) : 8 + (int32_t)below(233);
      N = in.num_units = R * (3 + (int32_t)below(6)) / 8;
    }
    if (equal_len) { /* a few short of k a unit: the fill splits, the deal holds */
      N = in.num_units = 10 + (int32_t)below(50);
      R = in.num_requests = (1 + (int32_t)below(4)) * N - 1 - (int32_t)below(3);
    }
    if (piece) {
      N = in.num_units = 20 + (int32_t)below(2029);
      in.split_cap = 1 + (int32_t)below(6);
    }
    in.max_q_len = 1 + (int32_t)below(3);
    const int bad = below(4) == 0, layout = ragged || ragged_dealt ? 0 : (int)below(3);
    std::vector<int32_t> qo(R + 1), lens(R + 1), indptr(R + 1), last(R + 1);
    for (int32_t r = 0; r < R; r++) {
      qo[r + 1] = qo[r] + (int32_t)below((uint32_t)in.max_q_len + 1);
      if (bad && below(50) == 0)
        qo[r + 1] = qo[r] - 1;
    }
    in.qo_indptr = below(4) ? qo.data() : NULL;
    static const uint32_t longest[] = {200, 5000, 200000, 2000000000u};
    const uint32_t maxlen = ragged || ragged_dealt ? 200000 : longest[below(4)];
    if (layout == 0) { /* block table lengths */
      for (int32_t r = 0; r < R; r++) {
        lens[r] = equal_len                ? equal_len
                  : ragged || ragged_dealt ? 2048 + (int32_t)below(4097)
                  : below(8) == 0 ? 0
                  : below(6) == 0 ? (int32_t)maxlen - 1
                                  : (int32_t)below(maxlen);
        if (piece && below(40)) /* mostly short, a few long */
          lens[r] = (int32_t)below(maxlen < 300 ? maxlen : 300);
        if (bad && below(30) == 0)
          lens[r] = below(2) ? -5 : (int32_t)(maxlen - 1) + 1;
      }
      in.kv_lens = lens.data();
      in.max_kv_len = (int32_t)(maxlen - 1);
    } else if (layout == 1) { /* CSR pages */
      in.page_size = 1 + (int32_t)below(128);
      for (int32_t r = 0; r < R; r++) {
        indptr[r + 1] = indptr[r] + (int32_t)below(below(3) ? 40 : 3000);
        last[r] = 1 + (int32_t)below((uint32_t)in.page_size);
        if (bad && below(30) == 0)
          last[r] = 0;
        if (bad && below(40) == 0)
          indptr[r + 1] = indptr[r] - 2;
      }
      in.kv_indptr = indptr.data();
      in.kv_last_page_len = last.data();
      in.num_page_indices = indptr[R] - (bad && below(2) ? 5 : 0);
    } else { /* sparse: every request one token over its top-k list */
      in.uniform_len = below(5) == 0 ? 0 : 1 + (int32_t)below(below(2) ? 3000 : 300000);
    }
    /* the builder's sizes (plugin/builder.c), sometimes shrunk */
    in.max_items = in.invariant ? R * PMLA_INV_MAX_CHUNKS + N : R + N;
    in.max_partials = in.invariant ? (PMLA_INV_SLOT_UNITS + 1) * N : 2 * N;
    if (below(8) == 0) {
      in.max_items = (int32_t)below((uint32_t)in.max_items + 1);
      in.max_partials = (int32_t)below((uint32_t)in.max_partials + 1);
    }
    if (in.invariant && below(4) == 0) /* a split budget that binds */
      in.max_partials = N + (int32_t)below(3 * (uint32_t)N + 1);
    const size_t size[6] = {PMLA_META_WORDS_,
                            (size_t)N + 1,
                            (size_t)in.max_items * PMLA_WI_WORDS + 8,
                            (size_t)R + 1,
                            (size_t)R + 1,
                            (size_t)in.max_partials + 1};
    std::vector<int32_t> host[6], dev[6];
    for (int k = 0; k < 6; k++) {
      host[k].assign(size[k], 0x7eadbeef);
      dev[k].assign(size[k], 0x7eadbeef);
    }
    host[0][PMLA_META_ERROR] = dev[0][PMLA_META_ERROR] = 0;
    const pmla_plan_output ho = {host[0].data(), host[1].data(), host[2].data(),
                                 host[3].data(), host[4].data(), host[5].data()};
    const pmla_plan_output dout = {dev[0].data(), dev[1].data(), dev[2].data(),
                                   dev[3].data(), dev[4].data(), dev[5].data()};
    const int32_t err = pmla_plan_step(&in, &ho);
    if (pmla_gpu_plan(&in, &dout, NULL) != 0) {
      printf("plan %d: the launch was refused (R=%d N=%d)\n", it, R, N);
      fails++;
      continue;
    }
    /* fill, piece mode, invariant, default requests dealt whole */
    kinds[in.invariant ? 2 : host[0][PMLA_META_MODE] == PMLA_DEALT_MODE ? 3
                             : host[0][PMLA_META_MODE] ? 1 : 0]++;
    if (in.invariant && host[0][PMLA_META_NUM_ITEMS] > 0) {
      int32_t scratch = 0;
      const pmla_inv_sums s = pmla_inv_sum(&in, &scratch);
      places[pmla_inv_placement(R, N, in.max_partials - N, &s)]++;
    }
    splits += host[0][PMLA_META_NUM_REDUCE] > 0;
    for (int k = 0, done = 0; k < 6 && !done; k++)
      for (size_t i = 0; i < size[k]; i++)
        if (host[k][i] != dev[k][i]) {
          printf("plan %d (R=%d N=%d invariant=%d cap=%d layout=%d items<=%d partials<=%d, "
                 "host error 0x%x): buffer %d word %zu is %d on the device, %d on the host\n",
                 it, R, N, in.invariant, in.split_cap, layout, in.max_items, in.max_partials, err,
                 k, i, dev[k][i], host[k][i]);
          fails++;
          done = 1;
          break;
        }
  }
  printf("plan-emu: %d plans (fill %d, dealt whole %d, piece %d, invariant %d: line %d, whole "
         "requests spread %d, pieces spread %d; %d with splits), %d differ\n",
         plans, kinds[0], kinds[3], kinds[1], kinds[2], places[0], places[1], places[2], splits,
         fails);
  /* a run that never reached a mode proves nothing about it */
  return fails != 0 || kinds[0] == 0 || kinds[1] == 0 || kinds[2] == 0 || kinds[3] == 0 ||
         splits == 0 ||
         places[0] == 0 || places[1] == 0 || places[2] == 0;
}
