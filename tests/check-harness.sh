#!/bin/sh
# SPDX-License-Identifier: MIT
# pmla-conformance's exit status, which certification runs read: a run in
# which no test ran, a test whose process exits in the middle (a plugin
# calling exit(0), which Check would count as a pass), and a report that
# could not be written fail; bad settings are refused (2); the GPU
# backend without a device exits 77 (skipped), not 0. make check exports
# PMLA_CONFORMANCE_PLUGIN and PMLA_CONFORMANCE_MOCK_DIR.
conf=tests/pmla-conformance
fail() { echo "FAIL: $*"; exit 1; }

out=$(CK_RUN_SUITE=no-such-suite $conf 2>&1)
rc=$?
[ $rc -eq 1 ] || fail "a run of no test exited $rc, want 1: $out"
case $out in *"no test ran"*) ;; *) fail "a run of no test does not say so: $out" ;; esac

exiting=tests/bench/.libs/mock_exiting.so
[ -f "$exiting" ] || fail "$exiting is not built"
for fork in yes no; do
  out=$(CK_FORK=$fork CK_RUN_SUITE=numerics CK_RUN_CASE=dense $conf "$exiting" 2>&1)
  rc=$?
  [ $rc -eq 1 ] || fail "CK_FORK=$fork: a plugin exiting in decode left the run at $rc, want 1: $out"
done

# a number or directory from the environment that cannot be what it names
# is refused (2), not read as something else
for bad in SEED=not-a-number SEED=12abc SEED=-1 DEVINPUT_STEPS=lots DEVINPUT_STEPS=0 \
  MOCK_DIR=/nonexistent; do
  out=$(env "PMLA_CONFORMANCE_$bad" CK_RUN_SUITE=threads $conf 2>&1)
  rc=$?
  [ $rc -eq 2 ] || fail "PMLA_CONFORMANCE_$bad exited $rc, want 2: $out"
  case $out in *"PMLA_CONFORMANCE_$bad"*accepted*) ;; *) fail "no refusal naming it: $out" ;; esac
done
# a report that cannot be written is no pass
if [ -w /dev/full ]; then
  CK_RUN_SUITE=threads $conf >/dev/full 2>/dev/null && fail "a run writing to /dev/full exited 0"
fi

if [ "${GPU_PLATFORM:-none}" = none ]; then
  out=$(PMLA_CONFORMANCE_BACKEND=pmla CK_RUN_SUITE=builder $conf 2>&1)
  rc=$?
  [ $rc -eq 77 ] || fail "the GPU backend of a build without one exited $rc, want 77: $out"
  case $out in *"SKIPPED (no device)"*) ;; *) fail "the run does not say it skipped: $out" ;; esac
else
  echo "SKIP part: a GPU build may find a device here (the 77 case is for no device)"
fi
echo "PASS: pmla-conformance exit status"
