/* SPDX-License-Identifier: MIT */
/* wgmma_rate.cu - how many tensor-core instructions of the shapes pmla's
 * sm_90a bodies issue one SM retires a clock, measured apart from any
 * kernel (docs/performance.md quotes the results; README.md here).
 *
 * 132 blocks of 256 threads (one a SM on an H200), 64 KiB of shared
 * memory each. One or both warpgroups of a block issue ITERS groups of
 * eight instructions into one accumulator (the way a Q K^T chain
 * accumulates its k-steps), a commit per group and at most one group
 * pending; mma.sync warps issue eight instructions a step into four
 * accumulators. Block 0's thread 0 reads clock64 around the loop; the
 * operands are constants (the rate does not depend on the values).
 *
 * Shapes: wgmma m64n16k16 and m64n32k16 f16 with A in registers (the
 * narrow E4M3 body's S^T and P V), m64n16k16 f16 with both operands in
 * shared memory, m64n64k16 bf16 from shared memory and with A in
 * registers (the 64-row body's Q K^T), mma.sync m16n8k16 f16.
 * Build and run (CUDA 12.3 or later, an sm_90 GPU):
 *   nvcc -O3 -gencode arch=compute_90a,code=sm_90a wgmma_rate.cu -o wgmma_rate
 *   ./wgmma_rate */
#include <cstdint>
#include <cstdio>

#define ITERS 2000

__device__ __forceinline__ uint64_t desc(uint32_t addr) {
  /* 128B swizzle, 16-byte leading and 1024-byte stride offsets */
  return (uint64_t)((addr & 0x3ffff) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

#define PRED "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
#define ACC8(d) "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define ACC16(d) ACC8(d), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), \
    "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define ACC32(d) ACC16(d), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
    "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
    "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define R8 "{%0,%1,%2,%3,%4,%5,%6,%7}"
#define R16 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}"
#define R32 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21," \
    "%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"

enum Shape { RS_N16, RS_N32, SS_N16, SS_N64_BF16, RS_N64_BF16, MMA_SYNC, NSHAPES };
static const char *const names[NSHAPES] = {
    "wgmma m64n16k16 f16, A in registers", "wgmma m64n32k16 f16, A in registers",
    "wgmma m64n16k16 f16, SS",            "wgmma m64n64k16 bf16, SS",
    "wgmma m64n64k16 bf16, A in registers", "mma.sync m16n8k16 f16 (a warp)"};
static const double fmas[NSHAPES] = {64 * 16 * 16, 64 * 32 * 16, 64 * 16 * 16,
                                     64 * 64 * 16, 64 * 64 * 16, 16 * 8 * 16};

template <int S>
__device__ __forceinline__ void one(float *d, const uint32_t *a, const uint32_t *b, uint64_t da,
                                    uint64_t db) {
  if constexpr (S == RS_N16)
    asm volatile(PRED "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 " R8
                      ", {%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"
                 : ACC8(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
  else if constexpr (S == RS_N32)
    asm volatile(PRED "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 " R16
                      ", {%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"
                 : ACC16(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
  else if constexpr (S == SS_N16)
    asm volatile(PRED "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 " R8
                      ", %8, %9, p, 1, 1, 0, 0;\n}\n"
                 : ACC8(d) : "l"(da), "l"(db));
  else if constexpr (S == SS_N64_BF16)
    asm volatile(PRED "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " R32
                      ", %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : ACC32(d) : "l"(da), "l"(db));
  else if constexpr (S == RS_N64_BF16)
    asm volatile(PRED "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " R32
                      ", {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
                 : ACC32(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <int S> __global__ void __launch_bounds__(256, 1) rate(float *out, int nwg, long long *cyc) {
  extern __shared__ __align__(1024) char smem[];
  for (int i = threadIdx.x; i < 16384; i += blockDim.x)
    ((uint32_t *)smem)[i] = (i & 1) ? 0x3c003c00u : 0u;
  __syncthreads();
  float d[32] = {0};
  const uint32_t a[4] = {0x3c003c00u ^ threadIdx.x, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u};
  const uint32_t b[2] = {0x3c003c00u, 0x3c003c00u ^ threadIdx.x};
  const uint32_t base = (uint32_t)__cvta_generic_to_shared(smem);
  const uint64_t db = desc(base), da = desc(base + 16384);
  const long long t0 = clock64();
  if ((int)(threadIdx.x >> 7) < nwg) {
    for (int it = 0; it < ITERS; it++) {
      if constexpr (S == MMA_SYNC) {
#pragma unroll
        for (int j = 0; j < 8; j++)
          one<S>(d + 4 * (j & 3), a, b, 0, 0);
      } else {
        wg_fence();
#pragma unroll
        for (int j = 0; j < 8; j++)
          one<S>(d, a, b, da + 2 * j, db + 2 * j); /* the next k-step: 32 bytes on */
        wg_commit();
        wg_wait<1>();
      }
    }
    if constexpr (S != MMA_SYNC)
      wg_wait<0>();
  }
  const long long t1 = clock64();
  float s = 0.f;
  for (int i = 0; i < 32; i++)
    s += d[i];
  out[blockIdx.x * 256 + threadIdx.x] = s; /* keeps the results live */
  if (threadIdx.x == 0)
    cyc[blockIdx.x] = t1 - t0;
}

template <int S> static int measure(float *out, long long *cyc) {
  cudaFuncSetAttribute(rate<S>, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536);
  for (int nwg = 1; nwg <= 2; nwg++) {
    long long c = 0;
    for (int rep = 0; rep < 2; rep++) { /* the first launch warms up */
      rate<S><<<132, 256, 65536>>>(out, nwg, cyc);
      if (cudaDeviceSynchronize() != cudaSuccess ||
          cudaMemcpy(&c, cyc, sizeof c, cudaMemcpyDeviceToHost) != cudaSuccess) {
        fprintf(stderr, "%s: %s\n", names[S], cudaGetErrorString(cudaGetLastError()));
        return 1;
      }
    }
    const double n = (S == MMA_SYNC ? 4.0 * nwg : nwg) * ITERS * 8.0; /* instructions a SM */
    printf("%-40s warpgroups %d: %6.2f cycles an instruction, %5.0f multiply-adds a clock\n",
           names[S], nwg, (double)c / n, n * fmas[S] / (double)c);
  }
  return 0;
}

int main() {
  float *out;
  long long *cyc;
  if (cudaMalloc(&out, 132 * 256 * sizeof(float)) != cudaSuccess ||
      cudaMalloc(&cyc, 132 * sizeof(long long)) != cudaSuccess) {
    fprintf(stderr, "no device memory\n");
    return 1;
  }
  return measure<RS_N16>(out, cyc) | measure<RS_N32>(out, cyc) | measure<SS_N16>(out, cyc) |
         measure<SS_N64_BF16>(out, cyc) | measure<RS_N64_BF16>(out, cyc) |
         measure<MMA_SYNC>(out, cyc);
}
