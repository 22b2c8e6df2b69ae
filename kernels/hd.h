/* SPDX-License-Identifier: MIT */
/* hd.h - PMLA_HD marks the functions written once for host C and device
 * code (the planner, the fold, the fast division). */
#ifndef PMLA_HD_H
#define PMLA_HD_H

#if defined(__CUDACC__) || defined(__HIPCC__)
#define PMLA_HD __host__ __device__
#else
#define PMLA_HD
#endif

#endif
