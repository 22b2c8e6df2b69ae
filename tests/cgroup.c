/* SPDX-License-Identifier: MIT */
/* cgroup.c - pmla-cpu's init_builder heeds a container's memory limit: this
 * program interposes fopen so that /proc/meminfo, /proc/self/cgroup and the
 * files under /sys/fs/cgroup are read from a directory it writes, then
 * checks that a builder over the room a cgroup leaves is refused (saying a
 * cgroup limit refused it) and one under it is made: cgroup v2 (a limit on
 * an ancestor too, swap, page cache that does not count, a usage that
 * cannot be read), v1, and a group outside the namespace's root.
 *
 *   cgroup [PLUGIN.so]     env: PMLA_CONFORMANCE_PLUGIN
 *
 * Exit 0 pass, 1 fail, 77 skip (automake's skip code), 99 hard error. Its
 * own program (no Check), as it replaces a libc function. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "interpose.h"
#include "pmla.h"
#include "pmla_registry.h"
#include "test_config.h"

#ifndef PMLA_TEST_DEFAULT_PLUGIN
#define PMLA_TEST_DEFAULT_PLUGIN "plugin/.libs/pmla.so"
#endif

/* ---- interposition: the three roots read from `fake` ---- */

static char fake[PATH_MAX]; /* "" = pass through */
static int redirected; /* opens served from `fake` */

FILE *fopen(const char *path, const char *mode) {
  static FILE *(*real)(const char *, const char *);
  if (!real)
    real = (FILE * (*)(const char *, const char *)) dlsym(RTLD_NEXT, "fopen");
  if (fake[0] && (strcmp(path, "/proc/meminfo") == 0 || strcmp(path, "/proc/self/cgroup") == 0 ||
                  strncmp(path, "/sys/fs/cgroup/", 15) == 0)) {
    char moved[4096];
    snprintf(moved, sizeof moved, "%s%s", fake, path);
    redirected++;
    return real(moved, mode);
  }
  return real(path, mode);
}

/* ---- the fake tree ---- */

static int failures;

static void put(const char *rel, const char *fmt, ...) {
  char path[4096];
  snprintf(path, sizeof path, "%s%s", fake, rel);
  for (char *p = path + strlen(fake) + 1; (p = strchr(p, '/')); p++) {
    *p = '\0';
    mkdir(path, 0700);
    *p = '/';
  }
  FILE *f = fopen(path, "w");
  if (!f) {
    perror(path);
    exit(99);
  }
  va_list ap;
  va_start(ap, fmt);
  vfprintf(f, fmt, ap);
  va_end(ap);
  fclose(f);
}

static void clear(void) {
  char cmd[2 * PATH_MAX + 32];
  snprintf(cmd, sizeof cmd, "rm -rf '%s/proc' '%s/sys'", fake, fake);
  if (system(cmd) != 0)
    exit(99);
}

/* the fake tree goes whatever way the program ends */
static void remove_fake(void) {
  if (fake[0]) {
    clear();
    rmdir(fake);
    fake[0] = '\0';
  }
}

/* a host with 64 GiB available and 1 GiB of free swap */
static void host(void) {
  put("/proc/meminfo", "MemTotal: 100000000 kB\nMemAvailable: 67108864 kB\nSwapFree: 1048576 kB\n");
}

/* init_builder of config c: `want_ok` or refused with OUT_OF_MEMORY and a
 * message naming the cgroup limit */
static void expect(const pmla_backend *be, const pmla_builder_config *c, int want_ok,
                   const char *what) {
  pmla_builder *b = NULL;
  redirected = 0;
  const pmla_status s = be->init_builder(c, &b);
  const char *msg = be->last_error(NULL);
  if (want_ok && s == PMLA_OK) {
    printf("ok: %s: made\n", what);
  } else if (!want_ok && s == PMLA_ERR_OUT_OF_MEMORY && b == NULL &&
             strstr(msg, "cgroup memory limit")) {
    printf("ok: %s: refused (%s)\n", what, msg);
  } else {
    fprintf(stderr, "FAIL: %s: status %d, want %s (%s)\n", what, (int)s,
            want_ok ? "PMLA_OK" : "PMLA_ERR_OUT_OF_MEMORY naming the cgroup limit", msg);
    failures++;
  }
  if (redirected == 0) {
    fprintf(stderr, "FAIL: %s: init_builder read none of the files\n", what);
    failures++;
  }
  if (s == PMLA_OK)
    be->destroy_builder(b);
}

int main(int argc, char **argv) {
#ifdef PMLA_TEST_UNDER_SANITIZER
  (void)argc;
  (void)argv;
  fprintf(stderr, "SKIP: cgroup: built with a sanitizer that intercepts fopen\n");
  return 77;
#endif
  const char *plugin = test_plugin(argc, argv, PMLA_TEST_DEFAULT_PLUGIN, "cgroup");
  if (!plugin)
    return 99;
  pmla_registry *reg = NULL;
  if (pmla_registry_open(plugin, &reg) != PMLA_OK)
    return 99;
  const pmla_backend *be = pmla_registry_find(reg, "pmla-cpu");
  if (!be) {
    fprintf(stderr, "cgroup: pmla-cpu not in %s\n", plugin);
    return 99;
  }
  const char *tmp = getenv("TMPDIR");
  int made = 0;
  for (int i = 0; i < 2 && !made; i++) {
    const char *dir = i == 0 && tmp && *tmp ? tmp : "/tmp";
    made = snprintf(fake, sizeof fake, "%s/pmla-cgroup-XXXXXX", dir) < (int)sizeof fake &&
           strlen(fake) + 64 < sizeof fake && mkdtemp(fake) != NULL;
  }
  if (!made) {
    fake[0] = '\0';
    printf("SKIP: cgroup: no writable directory for the fake tree ($TMPDIR, /tmp)\n");
    return 77;
  }
  atexit(remove_fake);

  /* the builder's size, from a builder made with no limit anywhere */
  pmla_builder_config c = test_config(128, 64, 16, 4, 0, 8);
  host();
  put("/proc/self/cgroup", "0::/\n");
  pmla_builder *b = NULL;
  pmla_builder_info info = {.struct_size = sizeof info};
  if (be->init_builder(&c, &b) != PMLA_OK || be->query_builder(b, &info) != PMLA_OK) {
    fprintf(stderr, "cgroup: no builder without a limit: %s\n", be->last_error(NULL));
    return 99; /* remove_fake runs at exit */
  }
  be->destroy_builder(b);
  const unsigned long long need = info.total_bytes, used = 300ull << 20;
  printf("a builder of 128 heads, 4 tokens, 8 workers: %llu bytes\n", need);

  /* v2: the container's own group, limited; then only an ancestor limited */
  put("/proc/self/cgroup", "0::/pod/ctr\n");
  put("/sys/fs/cgroup/pod/ctr/memory.max", "%llu\n", used + need / 2);
  put("/sys/fs/cgroup/pod/ctr/memory.current", "%llu\n", used);
  put("/sys/fs/cgroup/pod/ctr/memory.swap.max", "0\n");
  put("/sys/fs/cgroup/pod/ctr/memory.swap.current", "0\n");
  expect(be, &c, 0, "v2, half the builder left below memory.max, no swap");
  put("/sys/fs/cgroup/pod/ctr/memory.max", "%llu\n", used + 2 * need);
  expect(be, &c, 1, "v2, twice the builder left below memory.max");
  put("/sys/fs/cgroup/pod/ctr/memory.max", "max\n");
  put("/sys/fs/cgroup/pod/memory.max", "%llu\n", 2 * used + need / 2);
  put("/sys/fs/cgroup/pod/memory.current", "%llu\n", 2 * used);
  expect(be, &c, 0, "v2, half the builder left below an ancestor's memory.max");
  /* swap the group may still take counts, up to the host's free swap */
  put("/sys/fs/cgroup/pod/ctr/memory.swap.max", "max\n");
  put("/sys/fs/cgroup/pod/memory.max", "%llu\n", 2 * used + need - need / 4);
  expect(be, &c, 1, "v2, a quarter of the builder short of memory.max, 1 GiB of swap allowed");
  /* page cache counts in memory.current; its inactive file pages are
   * reclaimed before the group's OOM killer runs */
  put("/sys/fs/cgroup/pod/ctr/memory.swap.max", "0\n");
  put("/sys/fs/cgroup/pod/memory.max", "%llu\n", 2 * used + need / 2);
  put("/sys/fs/cgroup/pod/memory.stat", "anon %llu\nfile %llu\ninactive_file %llu\n", used,
      used, used);
  expect(be, &c, 1, "v2, half the builder left below memory.max but for inactive page cache");
  put("/sys/fs/cgroup/pod/memory.stat", "anon %llu\nfile %llu\nactive_file %llu\n", used, used,
      used);
  expect(be, &c, 0, "v2, the same page cache active");
  /* a usage that cannot be read leaves the whole limit */
  clear();
  host();
  put("/proc/self/cgroup", "0::/ctr\n");
  put("/sys/fs/cgroup/ctr/memory.max", "%llu\n", need / 2);
  put("/sys/fs/cgroup/ctr/memory.swap.max", "0\n");
  expect(be, &c, 0, "v2, a limit of half the builder, no swap, its usage unreadable");
  put("/sys/fs/cgroup/ctr/memory.max", "%llu\n", 2 * need);
  expect(be, &c, 1, "v2, a limit of twice the builder, its usage unreadable");
  /* a group outside the namespace's root is not under the mount */
  put("/proc/self/cgroup", "0::/../other\n");
  put("/sys/fs/cgroup/memory.max", "%llu\n", need / 2);
  put("/sys/fs/cgroup/memory.current", "0\n");
  put("/sys/fs/cgroup/memory.swap.max", "0\n");
  expect(be, &c, 1, "v2, a group outside the namespace (\"/../other\"): no limit known");

  /* v1: the memory controller's hierarchy, memsw counting swap too */
  clear();
  host();
  put("/proc/self/cgroup", "12:pids:/docker/abc\n5:cpu,cpuacct:/docker/abc\n"
                           "4:memory:/docker/abc\n0::/\n");
  put("/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "%llu\n", used + need / 2);
  put("/sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes", "%llu\n", used);
  put("/sys/fs/cgroup/memory/docker/abc/memory.memsw.limit_in_bytes", "%llu\n", used + need / 2);
  put("/sys/fs/cgroup/memory/docker/abc/memory.memsw.usage_in_bytes", "%llu\n", used);
  expect(be, &c, 0, "v1, half the builder left below memory.limit_in_bytes");
  put("/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "9223372036854771712\n");
  put("/sys/fs/cgroup/memory/docker/abc/memory.memsw.limit_in_bytes", "9223372036854771712\n");
  expect(be, &c, 1, "v1, no limit (the controller's largest value)");

  remove_fake();
  if (failures) {
    fprintf(stderr, "cgroup: %d failed\n", failures);
    return 1;
  }
  printf("cgroup: all passed\n");
  return 0;
}
