/* SPDX-License-Identifier: MIT */
/* sm90.h - the sm_90a primitives the wgmma decode body is built from:
 * shared-memory matrix descriptors (128-byte swizzle), wgmma fences and
 * groups, the wgmma shapes it issues, named barriers, mbarriers and
 * TMA box copies. Inline PTX; compiled only where __CUDA_ARCH_FEAT_SM90_ALL
 * is defined (nvcc -arch sm_90a), see config.h's PMLA_SM90_DEVICE. */
#ifndef PMLA_GPU_SM90_H
#define PMLA_GPU_SM90_H

#include <stdint.h>

#include "config.h"
#include "hip_compat.h"

#ifdef PMLA_SM90_DEVICE
#include <cudaTypedefs.h> /* CUtensorMap */

namespace pmla_sm90 {

/* smem matrix descriptor: start, leading / stride byte offsets, 128B swizzle */
__device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((addr & 0x3ffff) >> 4) | ((uint64_t)(lbo >> 4) << 16) |
         ((uint64_t)(sbo >> 4) << 32) | (1ull << 62);
}
/* the descriptor of (the address of d) + off: the start field holds
 * address >> 4 in its low 14 bits and shared addresses stay below 256 KiB,
 * so a byte offset (a multiple of 16) adds to it without carry. Built once
 * per base, a descriptor costs one add per wgmma instead of the masks and
 * shifts of desc() */
__device__ __forceinline__ uint64_t desc_at(uint64_t d, uint32_t off) { return d + (off >> 4); }
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
/* at most N committed groups still pending */
template <int N> __device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void wg_wait0() { wg_wait<0>(); }
__device__ __forceinline__ void proxy_fence() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/* the same for this thread's global accesses */
__device__ __forceinline__ void proxy_fence_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
/* keeps uses of the accumulators after the wait that completes them */
template <int N> __device__ __forceinline__ void reg_fence(float *d) {
#pragma unroll
  for (int i = 0; i < N; i++)
    asm volatile("" : "+f"(d[i])::"memory");
}
/* The three wgmma forms come with bf16 operands, or with f16 ones (F16: an
 * E4M3 cache's tiles, whose e4m3 values convert to f16 in one instruction
 * per pair, and the Q and P they meet). */
#define PMLA_WG_N64(T)                                                                        \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                  \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." T "." T " {"                     \
               "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                        \
               "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"              \
               "}, %32, %33, p, 1, 1, 0, 0;\n}\n"                                            \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),      \
                 "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),    \
                 "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), \
                 "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
                 "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), \
                 "+f"(d[30]), "+f"(d[31])                                                     \
               : "l"(da), "l"(db))
template <bool F16> __device__ __forceinline__ void mma_n64(float *d, uint64_t da, uint64_t db) {
  if (F16)
    PMLA_WG_N64("f16");
  else
    PMLA_WG_N64("bf16");
}
/* m64n16k16 for tiles of at most 16 rows, where the 64 tokens of a block
 * are the M side (S^T = K Q^T: A = the K tile, B = Q, both K-major; O^T +=
 * V^T P^T: A = V read MN-major (transposed), B = P^T K-major) */
#define PMLA_WG_N16(T, TA)                                                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                  \
               "wgmma.mma_async.sync.aligned.m64n16k16.f32." T "." T " {"                     \
               "%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, p, 1, 1, " TA ", 0;\n}\n"                    \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),      \
                 "+f"(d[6]), "+f"(d[7])                                                       \
               : "l"(da), "l"(db))
template <bool F16> __device__ __forceinline__ void mma_n16(float *d, uint64_t da, uint64_t db) {
  if (F16)
    PMLA_WG_N16("f16", "0");
  else
    PMLA_WG_N16("bf16", "0");
}
template <bool F16>
__device__ __forceinline__ void mma_n16_ta(float *d, uint64_t da, uint64_t db) {
  if (F16)
    PMLA_WG_N16("f16", "1");
  else
    PMLA_WG_N16("bf16", "1");
}
/* m64n16k16 f16 with A from registers (four b32 per thread, the layout of
 * mma_n256_rs) and B K-major in shared memory */
__device__ __forceinline__ void mma_n16_rs_f16(float *d, const uint32_t *a, uint64_t db) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {"
               "%0,%1,%2,%3,%4,%5,%6,%7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                 "+f"(d[6]), "+f"(d[7])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
/* the same for 32 columns (B: 32 rows) */
__device__ __forceinline__ void mma_n32_rs_f16(float *d, const uint32_t *a, uint64_t db) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {"
               "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16, %17, %18, %19}, %20,"
               " p, 1, 1, 0;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                 "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                 "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
/* four 8 x 8 b16 matrices stored transposed (stmatrix: the mirror of
 * ldmatrix.trans; lane l gives the address of row l % 8 of matrix l / 8) */
__device__ __forceinline__ void stsm_x4_t(uint32_t addr, uint32_t a, uint32_t b, uint32_t c,
                                          uint32_t d) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(a), "r"(b), "r"(c), "r"(d)
               : "memory");
}
/* the 128 fp32 accumulators of an m64n256 wgmma as asm operands %0..%127
 * (both n256 forms below) */
#define PMLA_WG_ACC128_FMT \
  "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15," \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31," \
  "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47," \
  "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63," \
  "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79," \
  "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95," \
  "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111," \
  "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
#define PMLA_WG_ACC128(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), \
  "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), \
  "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), \
  "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), \
  "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), \
  "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), \
  "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), \
  "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), \
  "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), \
  "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), \
  "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), \
  "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), \
  "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), \
  "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), \
  "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), \
  "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), \
  "+f"(d[126]), "+f"(d[127])
/* B stored MN-major (V rows: [token][dim]) */
#define PMLA_WG_N256_TB(T)                                                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                  \
               "wgmma.mma_async.sync.aligned.m64n256k16.f32." T "." T " {" PMLA_WG_ACC128_FMT \
               "}, %128, %129, p, 1, 1, 0, 1;\n}\n"                                          \
               : PMLA_WG_ACC128(d)                                                            \
               : "l"(da), "l"(db))
template <bool F16>
__device__ __forceinline__ void mma_n256_tb(float *d, uint64_t da, uint64_t db) {
  if (F16)
    PMLA_WG_N256_TB("f16");
  else
    PMLA_WG_N256_TB("bf16");
}
/* A from registers (a 64 x 16 fragment, four b32 per thread: the layout of
 * an m64nNk16 accumulator's columns 16k..16k+15 packed in pairs), B stored
 * MN-major */
#define PMLA_WG_N256_RS(T)                                                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                  \
               "wgmma.mma_async.sync.aligned.m64n256k16.f32." T "." T " {" PMLA_WG_ACC128_FMT \
               "}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"                         \
               : PMLA_WG_ACC128(d)                                                            \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db))
template <bool F16>
__device__ __forceinline__ void mma_n256_rs(float *d, const uint32_t *a, uint64_t db) {
  if (F16)
    PMLA_WG_N256_RS("f16");
  else
    PMLA_WG_N256_RS("bf16");
}
/* named barriers over both warpgroups (256 threads) */
__device__ __forceinline__ void nb_sync(int id) {
  asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory");
}
/* the same, reached by the two warpgroups from different code: the
 * non-aligned form (bar.sync is barrier.sync.aligned, which requires every
 * thread to execute the same instruction; synccheck reports the aligned
 * form used so) */
__device__ __forceinline__ void nb_sync_split(int id) {
  asm volatile("barrier.sync %0, 256;\n" ::"r"(id) : "memory");
}
__device__ __forceinline__ void nb_arrive(int id) {
  asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory");
}
/* mbarrier and TMA (sm_90): a stage's "full" barrier counts the 128 loader
 * threads' arrivals plus, for a TMA block, the bytes the copies deliver */
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile("{\n.reg .pred done;\nWAIT:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
               "@!done bra WAIT;\n}\n" ::"r"(bar),
               "r"(parity)
               : "memory");
}
/* one box of the KV cache (the map's box shape) into a 128B-swizzled block */
__device__ __forceinline__ void tma_box(uint32_t dst, const CUtensorMap *map, int col, int row,
                                        uint32_t bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
               "l"((uint64_t)map), "r"(col), "r"(row), "r"(bar)
               : "memory");
}
/* L2 eviction policies (createpolicy) and global accesses that carry one:
 * the fp32 partials are kept in L2 for the reader that follows */
__device__ __forceinline__ uint64_t l2_evict_last() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(pol));
  return pol;
}
__device__ __forceinline__ uint64_t l2_evict_first() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
  return pol;
}
/* tma_box whose lines take the L2 eviction policy pol */
__device__ __forceinline__ void tma_box_hint(uint32_t dst, const CUtensorMap *map, int col, int row,
                                             uint32_t bar, uint64_t pol) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
               ".L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
               "l"((uint64_t)map), "r"(col), "r"(row), "r"(bar), "l"(pol)
               : "memory");
}
__device__ __forceinline__ void st_f4_hint(float *p, float4 v, uint64_t pol) {
  asm volatile("st.global.L2::cache_hint.v4.f32 [%0], {%1, %2, %3, %4}, %5;\n" ::"l"(p), "f"(v.x),
               "f"(v.y), "f"(v.z), "f"(v.w), "l"(pol)
               : "memory");
}
__device__ __forceinline__ float4 ld_f4_hint(const float *p, uint64_t pol) {
  float4 v;
  asm volatile("ld.global.L2::cache_hint.v4.f32 {%0, %1, %2, %3}, [%4], %5;\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "l"(p), "l"(pol)
               : "memory");
  return v;
}
/* bulk copies shared -> global (no tensor map: contiguous bytes, 16-byte
 * aligned, a multiple of 16), tracked per thread in bulk groups */
__device__ __forceinline__ void bulk_store(void *dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst),
               "r"(src), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
/* the sources of this thread's bulk copies have been read */
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
} /* namespace pmla_sm90 */
#endif /* PMLA_SM90_DEVICE */
#endif
