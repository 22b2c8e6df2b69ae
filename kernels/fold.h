/* SPDX-License-Identifier: MIT */
/* fold.h - the one merge of two softmax partial results (o, lse) that the
 * batch-invariant mode uses everywhere it merges: the decode epilogues that
 * fold a request's chunks on one unit and the reduce that folds the pieces
 * of a split request. Merging is not associative in floating point, so the
 * same left fold over a request's chunks must give the same bits whoever
 * performs each step: both sites call these functions, with fmaf spelled
 * out so no compiler contracts one site and not the other. */
#ifndef PMLA_FOLD_H
#define PMLA_FOLD_H

#include <math.h>

#include "hd.h"

/* exp, log and reciprocal of the weights; on an NVIDIA GPU the hardware's
 * approximations with denormals flushed (one instruction each, no fix-up
 * branch: the reduce folds a long request's pieces in one dependent chain
 * per row, whose steps must stay short), elsewhere on a GPU the
 * platform's fast forms. The fold's result is the same function of its
 * inputs wherever it runs on one backend, which is all the batch-invariant
 * mode asks. */
#if defined(__CUDA_ARCH__)
static __device__ __forceinline__ float pmla_fold_exp(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(__fmul_rn(x, 1.44269504088896341f)));
  return r;
}
static __device__ __forceinline__ float pmla_fold_log(float x) {
  float r;
  /* volatile: run on every step, so the select that may discard it stays
   * a select (the compiler otherwise branches around it, splitting each
   * step of a long fold into blocks that cannot overlap) */
  asm volatile("lg2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return __fmul_rn(r, 0.693147180559945309f);
}
static __device__ __forceinline__ float pmla_fold_rcp(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
#elif defined(__HIP_DEVICE_COMPILE__)
#define pmla_fold_exp(x) __expf(x)
#define pmla_fold_log(x) __logf(x)
#define pmla_fold_rcp(x) __frcp_rn(x)
#else
#define pmla_fold_exp(x) expf(x)
#define pmla_fold_log(x) logf(x)
#define pmla_fold_rcp(x) (1.f / (x))
#endif
/* the lse's add rounded on its own: a log that ends in a multiply could be
 * fused into a following add at one site and not another */
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define pmla_fold_add(x, y) __fadd_rn(x, y)
#else
#define pmla_fold_add(x, y) ((x) + (y))
#endif

/* A softmax partial result's output factor s / l and its lse, from its sum
 * of weights l (lse_pos: the lse when l > 0): 0 and -inf when it saw no
 * token (l == 0); NaN and NaN when one of its scores was NaN (so l is), so
 * a NaN reaches out and lse however the request is split or merged. */
PMLA_HD static inline float pmla_sum_scale(float s, float l) {
  return l > 0.f ? s / l : l == 0.f ? 0.f : NAN;
}
PMLA_HD static inline float pmla_sum_lse(float l, float lse_pos) {
  return l > 0.f ? lse_pos : l == 0.f ? -INFINITY : NAN;
}

typedef struct pmla_fold_w {
  float wa, wc; /* weights of the accumulator and the new chunk */
  float lse;    /* the merged log-sum-exp (natural log) */
} pmla_fold_w;

/* Weights for merging a chunk of log-sum-exp c into an accumulator of a.
 * Callers round c before it gets here (the GPU bodies with __fmul_rn, the
 * CPU one through pmla_fold_lse), so no compiler fuses the multiply that
 * made it into `c - a` at one site and not at the other. */
PMLA_HD static inline pmla_fold_w pmla_fold_weights(float a, float c) {
  /* e = exp(-|c - a|) and s = 1 + e: the chain a long fold waits on from
   * one step's lse to the next is a subtraction, exp, add, log and add.
   * Without a branch: an accumulator of -inf (d = +inf) gives e = 0, the
   * chunk's weight 1 and its lse, a chunk of -inf (d = -inf) weight 0 and
   * the accumulator's lse, exactly; only both at -inf (d NaN) needs the
   * select. A NaN lse on either side makes the merged lse NaN (and the
   * weights, but for a chunk of -inf, which leaves the accumulator as is). */
  const float d = c - a, e = pmla_fold_exp(-fabsf(d)), s = 1.f + e, r = pmla_fold_rcp(s);
  const float lg = pmla_fold_log(s);
  const int later = d > 0.f; /* the new chunk holds the larger lse */
  const int none = c == -INFINITY; /* the chunk saw nothing: the accumulator stays */
  pmla_fold_w w;
  w.wa = none ? 1.f : later ? e * r : r;
  w.wc = none ? 0.f : later ? r : e * r;
  w.lse = none ? a : pmla_fold_add(later ? c : a, lg);
  return w;
}

/* A chunk's lse as the fold reads it: (m + log2 l) ln 2, rounded to fp32
 * before any later use (a volatile store keeps -ffp-contract from fusing
 * the multiply into the caller's arithmetic). */
static inline float pmla_fold_lse(float m_log2, float ln2) {
  volatile float v = m_log2 * ln2;
  return v;
}

/* One merged output element. */
PMLA_HD static inline float pmla_fold(float oa, float oc, pmla_fold_w w) {
  return fmaf(oa, w.wa, oc * w.wc);
}

#endif
