/* SPDX-License-Identifier: MIT */
/* unit.c - pmla-unit: white-box tests of this plugin (not installed). They
 * may include kernels/ headers: the shared planner (kernels/planner.h) is
 * called directly, and the plugin's schedules are compared with the
 * planner's exact output, so another plugin is not expected to pass them.
 * What any plugin must do is pmla-conformance's (tests/conformance.c).
 *
 *   pmla-unit [PLUGIN.so]
 *
 * The plugin comes from argv[1], else $PMLA_UNIT_PLUGIN, else the build
 * tree's plugin; the backend is $PMLA_UNIT_BACKEND (default pmla-cpu; pmla
 * on a GPU compares the device's metadata kernel with the host planner);
 * $PMLA_UNIT_SEED changes the random batches. Check's CK_* variables apply. */
#define _POSIX_C_SOURCE 200809L
#include <stddef.h>

#include "harness.h"

#ifndef PMLA_TEST_DEFAULT_PLUGIN
#define PMLA_TEST_DEFAULT_PLUGIN "plugin/.libs/pmla.so"
#endif

int main(int argc, char **argv) {
  static const harness_suite_fn suites[] = {suite_planner, suite_plan_exact, suite_plan_invariant};
  return harness_main(argc, argv, "pmla-unit", "PMLA_UNIT", PMLA_TEST_DEFAULT_PLUGIN, NULL,
                      suites, sizeof suites / sizeof suites[0]);
}
