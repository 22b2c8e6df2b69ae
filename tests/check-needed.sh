#!/bin/sh
# SPDX-License-Identifier: MIT
# A CPU-only plugin links neither libstdc++ nor libdl: dlopen is the host's
# business (abi/registry.c), and nothing CPU-side is C++. GPU builds skip.
plugin=${PMLA_TEST_PLUGIN:-plugin/.libs/pmla.so}
if [ "${GPU_PLATFORM:-none}" != none ]; then
  echo "SKIP: the plugin is built for GPU platform $GPU_PLATFORM (its runtime is C++)"
  exit 77
fi
command -v readelf >/dev/null 2>&1 || { echo "SKIP: readelf not found"; exit 77; }
needed=$(readelf -d "$plugin" | sed -n 's/.*(NEEDED).*\[\(.*\)\].*/\1/p')
[ -n "$needed" ] || { echo "FAIL: cannot read NEEDED entries of $plugin"; exit 1; }
echo "NEEDED:" $needed
for lib in $needed; do
  case $lib in
  libstdc++* | libdl.*) echo "FAIL: the CPU-only plugin needs $lib"; exit 1 ;;
  esac
done
echo "PASS: no libstdc++, no libdl"
