/* SPDX-License-Identifier: MIT */
/* cp_async_ring.cu - the shared-memory ring of pmla's FP8 converting body
 * (decode_sm90.hip, body_pp with an FP8 cache) alone, to see whether
 * compute-sanitizer's racecheck follows its ordering. It does: 0 hazards
 * in every form below, where pmla's body is reported (README.md here).
 *
 * 256 threads, two warpgroups. Warpgroup 1 (the loader) copies "halves"
 * of 128 x 16 bytes from global memory into a ring of NH shared-memory
 * slots by cp.async, one commit group per half; half h goes to slot
 * h % NH. Block b is halves 2b and 2b + 1. Per block, the loader waits
 * for its own copies with cp.async.wait_group(NH - 2) (all but the two
 * newest groups, block b + 1's halves, complete), then both warpgroups
 * meet at a named barrier, every thread reads one 16-byte piece of block
 * b (warpgroup 0 reads half 2b, which other threads copied; warpgroup 1
 * half 2b + 1, its own), both meet at a second barrier, and only then
 * does the loader reuse the two slots for halves 2b + NH, 2b + NH + 1.
 *
 * Forms (each 0 or 1):
 *   WAIT_ALL   wait_group 0 instead of NH - 2
 *   ZFILL      cp.async with the src-size operand; ZERO_LAST: the last
 *              half zero-filled (src-size 0), as pmla's invalid tokens are
 *   FENCE      fence.proxy.async after the reads
 *   MBAR       an mbarrier hand-off from warpgroup 0 to the loader a block
 *   WGBAR      a barrier of each warpgroup alone between the meetings
 *   SPLIT_PC   each warpgroup in its own loop (the meetings at different
 *              instructions, as in pmla)
 * Each prints its checksum against the host's. Build and run:
 *   nvcc -arch=sm_90a -O2 -DSPLIT_PC=1 cp_async_ring.cu -o ring
 *   compute-sanitizer --tool racecheck ./ring */
#include <cstdint>
#include <cstdio>

#ifndef WAIT_ALL
#define WAIT_ALL 0
#endif
constexpr int NH = 4;      /* ring slots (halves) */
constexpr int PIECES = 128; /* 16-byte pieces a half: one per loader thread */

#ifndef ZFILL
#define ZFILL 0
#endif
#ifndef FENCE
#define FENCE 0
#endif
__device__ __forceinline__ void cp16(void *dst, const void *src, bool valid = true) {
#if ZFILL
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                   (uint32_t)__cvta_generic_to_shared(dst)),
               "l"(src), "r"(valid ? 16 : 0));
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                   (uint32_t)__cvta_generic_to_shared(dst)),
               "l"(src));
#endif
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
/* the two warpgroups meet (the non-aligned form: they reach it from different code) */
__device__ __forceinline__ void meet(int id) {
  asm volatile("barrier.sync %0, 256;\n" ::"r"(id) : "memory");
}

#ifndef SPLIT_PC
#define SPLIT_PC 0
#endif
#ifndef WGBAR
#define WGBAR 0
#endif
#ifndef MBAR
#define MBAR 0
#endif
__device__ __forceinline__ void mbar_init(uint32_t a, int n) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(a), "r"(n));
}
__device__ __forceinline__ void mbar_arrive(uint32_t a) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(a) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t a, uint32_t ph) {
  asm volatile("{\n.reg .pred p;\nW:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
               "@!p bra W;\n}\n" ::"r"(a), "r"(ph) : "memory");
}
__global__ void __launch_bounds__(256, 1) ring(const uint4 *src, uint4 *out, int nblk) {
  __shared__ uint4 slot[NH][PIECES];
  __shared__ uint64_t bar[2];
  const int tid = threadIdx.x, g = tid >> 7, t = tid & 127;
  const uint32_t aBar = (uint32_t)__cvta_generic_to_shared(bar);
  if (tid == 0) {
    mbar_init(aBar, 128);
    mbar_init(aBar + 8, 128);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const int halves = 2 * nblk;
#ifndef ZERO_LAST
#define ZERO_LAST 0
#endif
  /* ZERO_LAST: the last half's pieces are zero-filled (src-size 0) */
  auto issue = [&](int h) {
    cp16(&slot[h % NH][t], src + (int64_t)h * PIECES + t, !(ZERO_LAST && h == halves - 1));
  };
  if (g == 1)
    for (int h = 0; h < NH; h++) {
      if (h < halves)
        issue(h);
      commit();
    }
  uint32_t acc = 0;
  /* block b: this thread's piece, between the two meetings */
  auto read = [&](int b) {
    meet(1);
#if WGBAR /* barriers of one warpgroup, as pmla's softmax and epilogue have */
    if (g == 0)
      asm volatile("bar.sync 7, 128;\n" ::: "memory");
    else
      asm volatile("bar.sync 4, 128;\n" ::: "memory");
#endif
    const uint4 v = slot[(2 * b + g) % NH][t];
    acc += v.x ^ v.y ^ v.z ^ v.w;
#if FENCE
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
    meet(2);
  };
  auto wait = [&]() {
    if (WAIT_ALL)
      wait_group<0>();
    else
      wait_group<NH - 2>();
  };
  auto refill = [&](int b) {
    for (int h = 2 * b + NH; h < 2 * b + NH + 2; h++) {
      if (h < halves)
        issue(h);
      commit();
    }
  };
#if SPLIT_PC
  /* each warpgroup runs its own loop, so the two meet at the same
   * barriers from different instructions (as pmla's do) */
  if (g == 0) {
    for (int b = 0; b < nblk; b++) {
      read(b);
#if MBAR
      mbar_arrive(aBar + 8 * (b & 1));
#endif
    }
  } else {
    for (int b = 0; b < nblk; b++) {
      wait();
      read(b);
#if MBAR
      mbar_wait(aBar + 8 * (b & 1), (b >> 1) & 1);
#endif
      refill(b);
    }
  }
#else
  /* one loop: both warpgroups reach each barrier at the same instruction */
  for (int b = 0; b < nblk; b++) {
    if (g == 1)
      wait();
    read(b);
#if MBAR /* warpgroup 0 hands something over per block, as pmla's P is */
    if (g == 0)
      mbar_arrive(aBar + 8 * (b & 1));
    else
      mbar_wait(aBar + 8 * (b & 1), (b >> 1) & 1);
#endif
    if (g == 1)
      refill(b);
  }
#endif
  if (g == 1)
    wait_group<0>();
  out[blockIdx.x * 256 + tid] = make_uint4(acc, 0, 0, 0);
}

int main() {
  const int nblk = 8, grid = 2;
  const size_t n = (size_t)2 * nblk * PIECES;
  uint4 *src, *out;
  cudaMalloc(&src, n * sizeof(uint4));
  cudaMalloc(&out, grid * 256 * sizeof(uint4));
  uint4 *h = new uint4[n];
  for (size_t i = 0; i < n; i++)
    h[i] = make_uint4((uint32_t)i, (uint32_t)(i * 7), (uint32_t)(i * 13), 1u);
  cudaMemcpy(src, h, n * sizeof(uint4), cudaMemcpyHostToDevice);
  ring<<<grid, 256>>>(src, out, nblk);
  uint4 *o = new uint4[grid * 256];
  cudaMemcpy(o, out, grid * 256 * sizeof(uint4), cudaMemcpyDeviceToHost);
  /* the expected sum: every thread xors its piece of each of its blocks */
  uint64_t got = 0, want = 0;
  for (int i = 0; i < grid * 256; i++)
    got += o[i].x;
  for (int c = 0; c < grid; c++)
    for (int tid = 0; tid < 256; tid++) {
      uint32_t a = 0;
      for (int b = 0; b < nblk; b++) {
        const int half = 2 * b + (tid >> 7);
        const uint4 v = h[(size_t)half * PIECES + (tid & 127)];
        if (!(ZERO_LAST && half == 2 * nblk - 1))
          a += v.x ^ v.y ^ v.z ^ v.w;
      }
      want += a;
    }
  printf("WAIT_ALL=%d checksum %llu expected %llu: %s\n", WAIT_ALL, (unsigned long long)got,
         (unsigned long long)want, got == want ? "ok" : "WRONG");
  delete[] h;
  delete[] o;
  return cudaDeviceSynchronize() == cudaSuccess && got == want ? 0 : 1;
}
