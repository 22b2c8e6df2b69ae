#!/bin/sh
# SPDX-License-Identifier: MIT
# Runs the example host against the in-tree plugin (make check exports
# PMLA_TEST_PLUGIN), then checks that the copy of examples/host.c shown in
# README.md is that file, line for line.
./examples/host "${PMLA_TEST_PLUGIN:-plugin/.libs/pmla.so}" || exit 1
src=${srcdir:-.}
sed -n '/^```c$/,/^```$/p' "$src/README.md" | sed '1d;$d' | diff -u "$src/examples/host.c" - ||
  { echo "FAIL: README.md's C example differs from examples/host.c"; exit 1; }
echo "PASS: README.md shows examples/host.c as it is"
