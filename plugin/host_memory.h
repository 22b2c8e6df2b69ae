/* SPDX-License-Identifier: MIT */
/* host_memory.h - the host memory a pmla-cpu builder may still take */
#ifndef PMLA_PLUGIN_HOST_MEMORY_H
#define PMLA_PLUGIN_HOST_MEMORY_H

#include <stdint.h>

/* MemAvailable + SwapFree of /proc/meminfo, or less where the process's
 * cgroups (v2, or v1's memory controller, under /sys/fs/cgroup) leave less
 * below their limits, each usage counted without its inactive file pages
 * (then *limited_by_cgroup = 1); UINT64_MAX where nothing could be read.
 * init_builder zeroes what it allocates, and under Linux's overcommit
 * zeroing more than this ends in the OOM killer (the machine's or the
 * container's) rather than in a failed allocation. */
uint64_t pmla_host_available_bytes(int *limited_by_cgroup);

#endif
