/* SPDX-License-Identifier: MIT */
/* host_memory.c - how much host memory a pmla-cpu builder may still take:
 * the machine's (/proc/meminfo) and, inside a container, its cgroup's
 * limits, whichever is less. Files that cannot be read limit nothing. */
#include <stdio.h>
#include <string.h>

#include "host_memory.h"

#define CGROUP_ROOT "/sys/fs/cgroup"

/* the first line of `path` as a byte count; UINT64_MAX for "max", for
 * cgroup v1's "no limit" (any value at or above 2^62) and for a file that
 * cannot be read or parsed */
static uint64_t read_bytes(const char *dir, const char *name) {
  char path[4096];
  if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
    return UINT64_MAX;
  FILE *f = fopen(path, "r");
  if (!f)
    return UINT64_MAX;
  unsigned long long v = 0;
  const int got = fscanf(f, "%llu", &v) == 1;
  fclose(f);
  return got && v < (1ull << 62) ? (uint64_t)v : UINT64_MAX;
}

/* The value of `key` in a memory.stat file ("key value" lines); 0 where
 * absent. */
static uint64_t read_stat(const char *dir, const char *key) {
  char path[4096], line[256], name[64];
  if (snprintf(path, sizeof path, "%s/memory.stat", dir) >= (int)sizeof path)
    return 0;
  FILE *f = fopen(path, "r");
  if (!f)
    return 0;
  unsigned long long v, found = 0;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "%63s %llu", name, &v) == 2 && strcmp(name, key) == 0) {
      found = v;
      break;
    }
  }
  fclose(f);
  return (uint64_t)found;
}

/* What the limit in file `limit` of group `dir` leaves beside the usage in
 * file `usage`: UINT64_MAX where nothing limits, the whole limit where the
 * usage cannot be read. The usage is the working set, less the memory.stat
 * value `cache` (NULL: none): it counts the page cache too, whose inactive
 * file pages are reclaimed before the group's OOM killer runs. Usage and
 * memory.stat are read only under a limit. */
static uint64_t room(const char *dir, const char *limit, const char *usage, const char *cache) {
  const uint64_t max = read_bytes(dir, limit);
  if (max == UINT64_MAX)
    return max;
  uint64_t used = read_bytes(dir, usage);
  if (used == UINT64_MAX)
    return max;
  const uint64_t reclaimable = cache ? read_stat(dir, cache) : 0;
  used = used > reclaimable ? used - reclaimable : 0;
  return max > used ? max - used : 0;
}

static uint64_t min64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* What the process's cgroups leave (UINT64_MAX where nothing limits) */
typedef struct rooms {
  uint64_t mem;  /* memory */
  uint64_t swap; /* swap (v2) */
  uint64_t both; /* memory and swap together (v1's memsw) */
} rooms;

/* Walks the cgroup directory `rel` (as /proc/self/cgroup names it) up to the
 * hierarchy's root: every ancestor's limit holds too. v2 names its files
 * memory.max / memory.current and memory.swap.max / memory.swap.current; v1
 * memory.limit_in_bytes / memory.usage_in_bytes and, for memory and swap
 * together, memory.memsw.limit_in_bytes / memory.memsw.usage_in_bytes;
 * each usage less the inactive file pages of memory.stat. */
static void walk(const char *mount, const char *rel, int v2, rooms *r) {
  char dir[4096];
  if (snprintf(dir, sizeof dir, "%s%s", mount, rel) >= (int)sizeof dir)
    return;
  const size_t root = strlen(mount);
  for (;;) {
    size_t n = strlen(dir);
    while (n > root && dir[n - 1] == '/')
      dir[--n] = '\0';
    if (v2) {
      r->mem = min64(r->mem, room(dir, "memory.max", "memory.current", "inactive_file"));
      r->swap = min64(r->swap, room(dir, "memory.swap.max", "memory.swap.current", NULL));
    } else {
      r->mem = min64(r->mem, room(dir, "memory.limit_in_bytes", "memory.usage_in_bytes",
                                  "total_inactive_file"));
      r->both = min64(r->both, room(dir, "memory.memsw.limit_in_bytes",
                                    "memory.memsw.usage_in_bytes", "total_inactive_file"));
    }
    char *slash = strrchr(dir + root, '/');
    if (!slash)
      return;
    *slash = '\0';
  }
}

static rooms cgroup_rooms(void) {
  rooms r = {UINT64_MAX, UINT64_MAX, UINT64_MAX};
  FILE *f = fopen("/proc/self/cgroup", "r");
  if (!f)
    return r;
  char line[4096];
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = '\0';
    /* "hierarchy-id:controllers:path": v2 is "0::path", v1's memory
     * controller "N:...memory...:path" */
    char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2 || c2[1] != '/')
      continue;
    *c1 = *c2 = '\0';
    const char *ctrls = c1 + 1, *rel = c2 + 1;
    /* a group outside this cgroup namespace's root ("/../x") is not under
     * the mount: nothing here says what limits it */
    if (strstr(rel, "/..") || strstr(rel, "/./"))
      continue;
    if (strcmp(line, "0") == 0 && *ctrls == '\0') {
      walk(CGROUP_ROOT, rel, 1, &r);
      continue;
    }
    for (const char *t = ctrls, *comma; t; t = (comma = strchr(t, ',')) ? comma + 1 : NULL) {
      if (strncmp(t, "memory", 6) == 0 && (t[6] == ',' || t[6] == '\0')) {
        walk(CGROUP_ROOT "/memory", rel, 0, &r);
        break;
      }
    }
  }
  fclose(f);
  return r;
}

static uint64_t add_sat(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

uint64_t pmla_host_available_bytes(int *limited_by_cgroup) {
  *limited_by_cgroup = 0;
  uint64_t avail = UINT64_MAX, swap = 0;
  FILE *f = fopen("/proc/meminfo", "r");
  if (f) {
    char line[256];
    unsigned long long kb;
    int have = 0;
    while (fgets(line, sizeof line, f)) {
      if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1 && kb < UINT64_MAX / 2048) {
        avail = kb * 1024;
        have = 1;
      } else if (sscanf(line, "SwapFree: %llu kB", &kb) == 1 && kb < UINT64_MAX / 2048) {
        swap = kb * 1024;
      }
    }
    fclose(f);
    if (!have) {
      avail = UINT64_MAX;
      swap = 0;
    }
  }
  const uint64_t host = add_sat(avail, swap);
  const rooms r = cgroup_rooms();
  /* the swap a cgroup lets the builder take is at most the host's */
  const uint64_t cg = min64(add_sat(r.mem, min64(swap, r.swap)), r.both);
  if (cg < host) {
    *limited_by_cgroup = 1;
    return cg;
  }
  return host;
}
