/* SPDX-License-Identifier: MIT */
/* pmla-info - what a host linked with the registry finds: the search path,
 * each plugin file and the ABI version agreed with it, each backend and the
 * devices it can open, and why anything on the path was skipped.
 *
 *   pmla-info [PATH]
 *
 * PATH is searched after $PMLA_PLUGIN_PATH; with neither, the installed
 * plugin directory. Devices are found through the ABI alone: a small
 * builder (cu_count 0: all CUs) is made on ordinal 0, 1, ... until the
 * backend refuses one, and query_builder says how many CUs (or worker
 * threads) it got. Exit status 0 when at least one backend was found, 1
 * when none was, 2 for bad arguments or a listing that could not be
 * written. */
#include <stdio.h>
#include <string.h>

#include "pmla.h"
#include "pmla_registry.h"
#include "test_config.h"

#define MAX_DEVICES 64

static void print_version(uint32_t v) {
  printf("%u.%u", PMLA_VERSION_MAJOR(v), PMLA_VERSION_MINOR(v));
}

/* Opens one small builder per device ordinal until the backend refuses. */
static void list_devices(const pmla_backend *be) {
  for (int dev = 0; dev < MAX_DEVICES; dev++) {
    pmla_builder_config cfg = test_config(16, 64, 1, 1, 0, 0);
    cfg.device = dev;
    pmla_builder *b = NULL;
    pmla_status st = be->init_builder(&cfg, &b);
    if (st != PMLA_OK) {
      if (dev == 0)
        printf("    no device: %s: %s\n", pmla_status_name(st), be->last_error(NULL));
      else
        printf("    %d device%s (device %d refused: %s)\n", dev, dev == 1 ? "" : "s", dev,
               be->last_error(NULL));
      return;
    }
    pmla_builder_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    if (be->query_builder(b, &info) == PMLA_OK)
      printf("    device %d: cu_count %u (CUs, or worker threads on the CPU), %u scheduling "
             "units\n", dev, info.cu_count, info.sched_units);
    else
      printf("    device %d: opens, but query_builder failed: %s\n", dev, be->last_error(b));
    be->destroy_builder(b);
  }
  printf("    (stopped probing at %d devices)\n", MAX_DEVICES);
}

/* Prints each line of text indented. */
static void print_indented(const char *text) {
  while (*text) {
    const char *end = strchr(text, '\n');
    int len = end ? (int)(end - text) : (int)strlen(text);
    printf("  %.*s\n", len, text);
    text += len + (end ? 1 : 0);
  }
}

int main(int argc, char **argv) {
  const int help = argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"));
  if (argc > 2 || help || (argc == 2 && argv[1][0] == '-')) {
    if (!help)
      fprintf(stderr, "pmla-info: %s: expected at most one PATH\n",
              argc > 2 ? "too many arguments" : "unknown option");
    fprintf(help ? stdout : stderr,
            "usage: pmla-info [PATH]\n"
            "  lists the plugins and backends found on $%s, then PATH (colon-separated\n"
            "  files or directories); with neither, in %s\n",
            PMLA_PLUGIN_PATH_ENV, pmla_registry_plugindir());
    return help ? 0 : 2;
  }
  pmla_registry *r = NULL;
  if (pmla_registry_open(argc == 2 ? argv[1] : NULL, &r) != PMLA_OK) {
    fprintf(stderr, "pmla-info: cannot open the registry (out of memory)\n");
    return 2;
  }
  size_t n = pmla_registry_count(r);
  printf("search path: %s\n", *pmla_registry_search_path(r) ? pmla_registry_search_path(r)
                                                              : "(none)");
  printf("  ($%s first, then the program's argument; with neither, the installed "
         "directory %s)\n",
         PMLA_PLUGIN_PATH_ENV, pmla_registry_plugindir());

  printf("plugin files:\n");
  for (size_t i = 0; i < n; i++) {
    const char *path = pmla_registry_backend_path(r, i);
    size_t first = 0;
    while (strcmp(pmla_registry_backend_path(r, first), path) != 0)
      first++;
    if (first < i) /* listed with its first backend */
      continue;
    printf("  %s: ABI ", path);
    print_version(pmla_registry_backend_version(r, i));
    printf("\n");
  }
  if (!n)
    printf("  (none)\n");

  printf("backends:\n");
  for (size_t i = 0; i < n; i++) {
    const pmla_backend *be = pmla_registry_backend(r, i);
    printf("  %s: %s\n    ABI ", be->name, be->description ? be->description : "");
    print_version(be->abi_version);
    printf(" (agreed ");
    print_version(pmla_registry_backend_version(r, i));
    printf("), from %s\n", pmla_registry_backend_path(r, i));
    list_devices(be);
  }
  if (!n)
    printf("  (none)\n");

  printf("registry diagnostics (each place searched, each file skipped and why):\n");
  print_indented(pmla_registry_diagnostics(r));
  pmla_registry_close(r);
  if (!n)
    fprintf(stderr, "pmla-info: no backend found; set %s to a plugin file or directory\n",
            PMLA_PLUGIN_PATH_ENV);
  if (fflush(stdout) || ferror(stdout)) { /* a full disk, a closed pipe */
    fprintf(stderr, "pmla-info: cannot write the listing to standard output\n");
    return 2;
  }
  return n ? 0 : 1;
}
