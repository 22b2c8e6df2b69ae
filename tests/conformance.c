/* SPDX-License-Identifier: MIT */
/* conformance.c - pmla-conformance: the black-box conformance suite for any
 * pmla plugin. It speaks to the plugin only through abi/pmla.h and the
 * registry (abi/pmla_registry.h): what it asserts is what the ABI promises,
 * so a plugin with other kernels or another scheduler passes it too. The
 * white-box tests of this plugin's planner are pmla-unit (tests/unit.c).
 *
 *   pmla-conformance [PLUGIN.so]
 *
 * The plugin comes from argv[1], else $PMLA_CONFORMANCE_PLUGIN, else the
 * installed plugin (make check sets the variable to the build tree's). The backend under test is $PMLA_CONFORMANCE_BACKEND
 * (default pmla-cpu). Mock plugins for the registry tests are looked for in
 * $PMLA_CONFORMANCE_MOCK_DIR (make check sets it; tests that need them skip
 * with a message when it is unset). $PMLA_CONFORMANCE_SEED changes the
 * random batches. Check's own CK_RUN_SUITE / CK_RUN_CASE / CK_FORK /
 * CK_VERBOSITY apply. Exit status 0 when every test passed. */
#define _POSIX_C_SOURCE 200809L
#include <stddef.h>

#include "harness.h"

#ifndef PMLA_TEST_DEFAULT_PLUGIN
#define PMLA_TEST_DEFAULT_PLUGIN "plugin/.libs/pmla.so"
#endif
#ifndef PMLA_TEST_MOCK_DIR
#define PMLA_TEST_MOCK_DIR NULL
#endif

int main(int argc, char **argv) {
  static const harness_suite_fn suites[] = {suite_abi,       suite_builder,  suite_args,
                                            suite_devinput,  suite_schedule, suite_numerics,
                                            suite_fp8,       suite_invariance,
                                            suite_threads,   suite_gpu};
  return harness_main(argc, argv, "pmla-conformance", "PMLA_CONFORMANCE",
                      PMLA_TEST_DEFAULT_PLUGIN, PMLA_TEST_MOCK_DIR, suites,
                      sizeof suites / sizeof suites[0]);
}
