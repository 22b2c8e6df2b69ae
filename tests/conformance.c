/* conformance.c - pmla-conformance: the Check-based conformance suite for
 * any pmla plugin.
 *
 *   pmla-conformance [PLUGIN.so]
 *
 * The plugin comes from argv[1], else $PMLA_CONFORMANCE_PLUGIN, else the
 * build tree's plugin. The backend under test is $PMLA_CONFORMANCE_BACKEND
 * (default pmla-cpu). Mock plugins for the registry tests are looked for in
 * $PMLA_CONFORMANCE_MOCK_DIR, else the build tree (tests that need them skip
 * with a message when they are absent). $PMLA_CONFORMANCE_SEED changes the
 * random batches. Check's own CK_RUN_SUITE / CK_RUN_CASE / CK_FORK /
 * CK_VERBOSITY apply. Exit status 0 when every test passed. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#ifndef PMLA_TEST_DEFAULT_PLUGIN
#define PMLA_TEST_DEFAULT_PLUGIN "plugin/.libs/pmla.so"
#endif
#ifndef PMLA_TEST_MOCK_DIR
#define PMLA_TEST_MOCK_DIR NULL
#endif

/* First existing file of a colon-separated list (or the first entry). */
static const char *first_existing(const char *list) {
  static char buf[4096];
  const char *p = list;
  const char *first = NULL;
  size_t first_len = 0;
  while (p && *p) {
    const char *e = strchr(p, ':');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    if (n && n < sizeof buf) {
      memcpy(buf, p, n);
      buf[n] = '\0';
      if (harness_file_exists(buf))
        return buf;
      if (!first) {
        first = p;
        first_len = n;
      }
    }
    p = e ? e + 1 : NULL;
  }
  if (first) {
    memcpy(buf, first, first_len);
    buf[first_len] = '\0';
    return buf;
  }
  return list;
}

int main(int argc, char **argv) {
  if (argc > 2 || (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")))) {
    fprintf(stderr, "usage: %s [PLUGIN.so]\n  env: PMLA_CONFORMANCE_PLUGIN, "
                    "PMLA_CONFORMANCE_BACKEND (default pmla-cpu), PMLA_CONFORMANCE_MOCK_DIR, "
                    "PMLA_CONFORMANCE_SEED, CK_RUN_SUITE, CK_RUN_CASE, CK_FORK\n",
            argv[0]);
    return argc == 2 ? 0 : 2;
  }
  const char *env_plugin = getenv("PMLA_CONFORMANCE_PLUGIN");
  g_plugin_path = argc == 2 ? argv[1]
                            : env_plugin && *env_plugin ? env_plugin
                                                        : first_existing(PMLA_TEST_DEFAULT_PLUGIN);
  const char *env_backend = getenv("PMLA_CONFORMANCE_BACKEND");
  g_backend_name = env_backend && *env_backend ? env_backend : "pmla-cpu";
  const char *env_mock = getenv("PMLA_CONFORMANCE_MOCK_DIR");
  g_mock_dir = env_mock && *env_mock ? env_mock : PMLA_TEST_MOCK_DIR;

  if (!harness_file_exists(g_plugin_path)) {
    fprintf(stderr, "pmla-conformance: plugin %s not found (pass it as the argument)\n",
            g_plugin_path);
    return 2;
  }
  if (pmla_registry_open(g_plugin_path, &g_registry) != PMLA_OK) {
    fprintf(stderr, "pmla-conformance: cannot open a registry on %s\n", g_plugin_path);
    return 2;
  }
  g_be = pmla_registry_find(g_registry, g_backend_name);
  if (!g_be) {
    fprintf(stderr, "pmla-conformance: backend %s not in %s\n%s", g_backend_name,
                    g_plugin_path, pmla_registry_diagnostics(g_registry));
    return 1;
  }

  int gpu = strcmp(g_backend_name, "pmla-cpu") != 0;
  if (gpu) {
    const char *why = NULL;
    const devmem *m = devmem_gpu(&why);
    if (m)
      g_mem = m;
    else
      g_no_device = why ? why : "no GPU memory provider";
  }
  if (!g_no_device) {
    /* Does the backend have a device at all? */
    pmla_builder_config c = harness_config(16, 16, 1, 1, 0, 1);
    pmla_builder *b = NULL;
    pmla_status s = g_be->init_builder(&c, &b);
    if (s == PMLA_ERR_NO_DEVICE) {
      static char why[512];
      snprintf(why, sizeof why, "init_builder says PMLA_ERR_NO_DEVICE: %s",
               g_be->last_error(NULL));
      g_no_device = why;
    } else if (s == PMLA_OK) {
      g_be->destroy_builder(b);
    }
  }
  printf("pmla-conformance: plugin %s, backend %s, memory %s, mocks %s\n", g_plugin_path,
         g_backend_name, g_mem->name, g_mock_dir ? g_mock_dir : "(none)");
  if (g_no_device)
    printf("pmla-conformance: tests that need a builder are SKIPPED: %s\n", g_no_device);
  fflush(stdout);

  SRunner *sr = srunner_create(suite_abi());
  srunner_add_suite(sr, suite_builder());
  srunner_add_suite(sr, suite_args());
  srunner_add_suite(sr, suite_planner());
  srunner_add_suite(sr, suite_numerics());
  srunner_add_suite(sr, suite_threads());
  srunner_add_suite(sr, suite_gpu());
  /* A GPU runtime does not survive fork: run in one process there. */
  if (gpu && g_mem->device_type != kDLCPU && !getenv("CK_FORK"))
    srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_ENV);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  pmla_registry_close(g_registry);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
