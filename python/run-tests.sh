#!/bin/sh
# SPDX-License-Identifier: MIT
# Runs the pmla Python tests against a build tree:
#   sh python/run-tests.sh [BUILD_DIR]     (default: $PMLA_BUILD_DIR, else .)
# Uses $PYTHON (default python3). Ends with "N passed, M failed, K skipped";
# exits 1 on a failure, 77 (automake's SKIP) when every test skipped (no
# numpy/torch), else 0. GPU tests skip without CUDA.
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-${PMLA_BUILD_DIR:-.}}
build=$(cd "$build" 2>/dev/null && pwd) || { echo "run-tests.sh: no build dir $1"; exit 1; }
PYTHON=${PYTHON:-python3}
if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "run-tests.sh: $PYTHON not found: 0 passed, 0 failed, 0 skipped"
  exit 77
fi
PMLA_PLUGIN_PATH=$build/plugin/.libs
PMLA_REGISTRY_LIB=$build/abi/.libs/libpmla-registry.so.0
[ -f "$PMLA_REGISTRY_LIB" ] || { echo "run-tests.sh: $PMLA_REGISTRY_LIB missing (build first)"; exit 1; }
PYTHONPATH=$here${PYTHONPATH:+:$PYTHONPATH}
PYTHONDONTWRITEBYTECODE=1
export PMLA_PLUGIN_PATH PMLA_REGISTRY_LIB PYTHONPATH PYTHONDONTWRITEBYTECODE
exec "$PYTHON" - "$here/tests" <<'PY'
import sys
import unittest

start = sys.argv[1]
sys.path.insert(0, start)
suite = unittest.defaultTestLoader.discover(start, pattern="test_*.py", top_level_dir=start)
result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
skipped = len(result.skipped)
passed = result.testsRun - failed - skipped
for test, reason in result.skipped:
    print("skipped %s: %s" % (test.id(), reason))
print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
sys.exit(1 if failed else 77 if result.testsRun and passed == 0 else 0)
PY
