/* SPDX-License-Identifier: MIT */
/* traits.h - tile shapes of the decode bodies, per row tile, as
 * compile-time traits that host dispatch and device code agree on.
 *
 * A row is a (query token, head) pair; a head tile holds MT * 16 rows.
 * NVIDIA: MT 4 (64 rows) runs the sm_90a wgmma body where its image loads
 * (decode_sm90.hip) and the mma.sync body elsewhere; MT 1 and 2 run the
 * mma.sync body (decode_mma.hip). AMD (CDNA, 64 KiB of LDS): MT 1 only. */
#ifndef PMLA_GPU_TRAITS_H
#define PMLA_GPU_TRAITS_H

#include "hip_compat.h"

namespace pmla_traits {

#ifdef PMLA_PLATFORM_NVIDIA
constexpr int MAX_MT = 4;
/* NW warps, BN-token KV blocks, STAGES shared-memory stages, OCC
 * work-groups per SM. 16-row tiles are latency bound per warp (few rows,
 * three barriers per block), so two small work-groups share an SM and
 * overlap each other's barriers and softmax (docs/performance.md). */
template <int MT> struct Shape {
  static constexpr int NW = MT == 1 ? 4 : 8;
  static constexpr int BN = MT == 1 ? 32 : 64;
  static constexpr int STAGES = 2;
  static constexpr int OCC = MT == 1 ? 2 : 1;
};
#else
constexpr int MAX_MT = 1;
template <int MT> struct Shape {
  static constexpr int NW = 2, BN = 32, STAGES = 1, OCC = 1;
};
#endif

/* the row tile (16-row units) of a step with H heads and mq query rows
 * per request, at least min_mt */
inline int host_mt(int H, int mq, int min_mt) {
  long rows = (long)H * mq;
  int mt = rows <= 16 ? 1 : rows <= 32 ? 2 : 4;
  if (mt < min_mt)
    mt = min_mt;
  return mt > MAX_MT ? MAX_MT : mt;
}
/* head tiles: the grid's second dimension */
inline int host_tiles(int H, int mq, int min_mt) {
  long rows = (long)H * mq, per = 16L * host_mt(H, mq, min_mt);
  return (int)((rows + per - 1) / per);
}
inline int host_occupancy(int mt) {
  switch (mt) {
  case 1:
    return Shape<1>::OCC;
#ifdef PMLA_PLATFORM_NVIDIA
  case 2:
    return Shape<2>::OCC;
  case 4:
    return Shape<4>::OCC;
#endif
  }
  return 1;
}

} /* namespace pmla_traits */
#endif
