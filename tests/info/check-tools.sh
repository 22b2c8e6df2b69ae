#!/bin/sh
# SPDX-License-Identifier: MIT
# pmla-info and pmla-bench as a user meets them, on the build tree through
# the environment (make check exports PMLA_TEST_PLUGIN): what pmla-info
# lists, and that pmla-bench names a bad argument and the plugin file used.
plugin=${PMLA_TEST_PLUGIN:-plugin/.libs/pmla.so}
info=tests/info/pmla-info
bench=tests/bench/pmla-bench
fail() { echo "FAIL: $*"; exit 1; }
# has TEXT WANT...: each WANT occurs in TEXT
has() {
  text=$1
  shift
  for want in "$@"; do
    case $text in *"$want"*) ;; *) fail "no '$want' in:
$text" ;; esac
  done
}

out=$(PMLA_PLUGIN_PATH=$plugin $info) || fail "pmla-info exited $? with PMLA_PLUGIN_PATH=$plugin"
has "$out" "search path: $plugin" "$plugin: ABI 1." "pmla-cpu: " "device 0: cu_count" \
  "searched file $plugin (from PMLA_PLUGIN_PATH)"
echo "$out"

# not a plugin: said plainly, and exit 1 (no backend)
lib=abi/.libs/libpmla-registry.so
out=$(PMLA_PLUGIN_PATH= $info $lib 2>&1) && fail "pmla-info exited 0 with no backend"
has "$out" "$lib: not a pmla plugin (no pmla_plugin_entry symbol)" "no backend found"

# bench: each bad argument is named (exit 2)
bad() {
  expect=$1
  shift
  out=$($bench "$@" 2>&1) && fail "pmla-bench $* exited 0"
  has "$out" "$expect"
}
bad "pmla-bench: --iters: 'abc' is not a positive integer" --iters abc
bad "pmla-bench: --iters: '0' is not a positive integer" --iters=0
bad "pmla-bench: --warmup: '-1' is not a non-negative integer" --warmup -1
bad "pmla-bench: --cu: '4x' is not a non-negative integer" --cu 4x
bad "pmla-bench: --shape 'b=0,L=64,h=16': b must be a positive integer, not '0'" --shape b=0,L=64,h=16
bad "pmla-bench: --shape 'b=1,L=64,q=16': unknown field 'q'" --shape b=1,L=64,q=16
bad "pmla-bench: --shape 'b=1,L=64': h is missing" --shape b=1,L=64
bad "pmla-bench: --shape 'tokens=2,slots=64,h=16,topk=8,page=16': page applies to dense shapes only" \
  --shape tokens=2,slots=64,h=16,topk=8,page=16
bad "pmla-bench: --shape 'b=1,L=64,h=16,page=0': page must be a positive integer, not '0'" \
  --shape b=1,L=64,h=16,page=0
bad "pmla-bench: --shape 'tokens=2,slots=64,h=16,topk=8,runs=4': runs applies to dense shapes only" \
  --shape tokens=2,slots=64,h=16,topk=8,runs=4
bad "pmla-bench: --shape 'b=1,L=64,h=16,runs=0': runs must be a positive integer, not '0'" \
  --shape b=1,L=64,h=16,runs=0
bad "pmla-bench: --shape 'b=1,L=64,h=16,h=32': h is given twice" --shape b=1,L=64,h=16,h=32
bad "pmla-bench: --shape 'b=1,,L=64,h=16': an empty field" --shape b=1,,L=64,h=16
bad "pmla-bench: --shape 'b=1,L=64,h=16,': an empty field" --shape b=1,L=64,h=16,
bad "pmla-bench: --plugin: an empty path" --plugin "" --shape b=1,L=64,h=16
bad "pmla-bench: --suite dense: at most 64 shapes in all" --suite dense --suite dense --suite dense \
  --suite dense --suite dense --suite dense
bad "pmla-bench: --shape 'b=1,h=16': L is missing" --shape b=1,h=16
bad "pmla-bench: --shape 'b=1,L=1073741825,h=16': L is at most 1073741824" --shape b=1,L=1073741825,h=16
bad "pmla-bench: --shape 'tokens=2,L=100-200,h=16,topk=8': a range of lengths applies to dense shapes only" \
  --shape tokens=2,L=100-200,h=16,topk=8
bad "pmla-bench: --iters: '+5' is not a positive integer" --iters +5
bad "pmla-bench: --warmup: 2000000; accepted: at most 1000000" --warmup 2000000
bad "pmla-bench: --suite: 'big' is not a suite" --suite big
bad "see pmla-bench --help" --no-such-option
bad "unexpected argument 'extra'" extra
bad "pmla-bench: --invariant-chunk 63: accepted: a multiple of 64 up to 1048576" \
  --batch-invariant --invariant-chunk 63

# bench: --json names the plugin file that provided the backend and the --check figures
out=$(PMLA_PLUGIN_PATH=$plugin $bench --shape b=1,L=64,h=16 --iters 1 --warmup 0 --check --json) ||
  fail "pmla-bench --check --json exited $?: $out"
has "$out" "\"plugin\": \"$plugin\"" '"max_abs_err": ' '"cosine": ' '"lse_ok": true'
# bench: page=N sets the page size of a dense shape and is named in its row
out=$(PMLA_PLUGIN_PATH=$plugin $bench --shape b=2,L=100,h=16,page=16 --iters 1 --warmup 0 --check) ||
  fail "pmla-bench page=16 --check exited $?: $out"
has "$out" "b=2 L=100 h=16 sq=1 page=16" "PASS"
# bench: runs=N deals the pages in runs of N adjacent ones, named in the row
out=$(PMLA_PLUGIN_PATH=$plugin $bench --shape b=2,L=100,h=32,page=1,runs=64 --iters 1 --warmup 0 \
  --check) || fail "pmla-bench page=1,runs=64 --check exited $?: $out"
has "$out" "b=2 L=100 h=32 sq=1 page=1 runs=64" "PASS"
out=$($bench --plugin "$(dirname "$plugin")" --shape b=1,L=64,h=16 --iters 1 --warmup 0 --json) ||
  fail "pmla-bench --plugin DIR exited $?: $out"
has "$out" "\"plugin\": \"$(dirname "$plugin")/pmla.so\""
# bench: a 1.1 feature on a backend that agreed 1.0 is refused by name
# (a 1.0 plugin would ignore config.flags); the mock plugin speaks 1.0 only
old=${PMLA_TEST_MOCK_DIR:-tests/.libs}/mock_old_minor.so
if [ -f "$old" ]; then
  out=$($bench --plugin "$old" --backend mock-old-minor --shape b=1,L=64,h=16 \
    --batch-invariant 2>&1) && fail "pmla-bench --batch-invariant on a 1.0 backend exited 0"
  has "$out" "--batch-invariant needs ABI 1.1; backend 'mock-old-minor'" "agreed 1.0"
  out=$($bench --plugin "$old" --backend mock-old-minor --shape b=1,L=64,h=16,kv=fp8 2>&1) &&
    fail "pmla-bench kv=fp8 on a 1.0 backend exited 0"
  has "$out" "an FP8 cache needs ABI 1.1" "agreed 1.0"
else
  echo "SKIP: the 1.0 mock plugin $old is not built"
fi
# bench --json: a shape the backend refuses after others ran still leaves
# one JSON document, the refusal as its "error"
out=$(PMLA_PLUGIN_PATH=$plugin $bench --json --iters 1 --warmup 0 --shape b=1,L=64,h=16 \
  --shape b=1,L=64,h=200 2>/dev/null) && fail "pmla-bench --json with h=200 exited 0"
has "$out" '"results": [' '"error": "init_builder failed: PMLA_ERR_UNSUPPORTED'
case $out in *'
}') ;; *) fail "the --json document is not closed after the refusal: $out" ;; esac
# bench --check: out and lse are poisoned (NaN) before each plugin's steps,
# so a backend that writes nothing fails on NaN, never on whatever the
# memory held (another plugin's right values, say)
idle=tests/bench/.libs/mock_idle.so
if [ -f "$idle" ]; then
  out=$($bench --plugin "$plugin" --plugin "$idle" --shape b=2,L=100,h=16 --shape tokens=3,slots=500,h=16,topk=64 \
    --iters 1 --warmup 0 --check) && fail "pmla-bench --check passed a backend that writes nothing: $out"
  has "$out" "b=2 L=100 h=16 sq=1 @0 " "sparse t=3 slots=500 h=16 topk=64 sq=1 @1 "
  if echo "$out" | grep ' @0 ' | grep -qv ' PASS '; then fail "the real plugin failed a row: $out"; fi
  if echo "$out" | grep ' @1 ' | grep -qv ' FAIL .* out: .*got -\{0,1\}nan'; then
    fail "the idle backend's rows should fail on the NaN poison: $out"
  fi
else
  echo "SKIP: the idle mock plugin $idle is not built"
fi
# bench: a plugin that exits inside a call fails the run (2), and the --json
# document is closed with the reason, not cut off with the exit's status
exiting=tests/bench/.libs/mock_exiting.so
if [ -f "$exiting" ]; then
  out=$($bench --plugin "$exiting" --shape b=1,L=64,h=16 --iters 1 --warmup 0 --json 2>/dev/null)
  rc=$?
  [ $rc -eq 2 ] || fail "pmla-bench on a plugin exiting in decode exited $rc, want 2: $out"
  has "$out" '"error": "the process exited in the middle of the run'
else
  echo "SKIP: the exiting mock plugin $exiting is not built"
fi
# info, bench: output that cannot be written is a failure (2); bad
# arguments to pmla-info are named on stderr (2)
if [ -w /dev/full ]; then
  PMLA_PLUGIN_PATH=$plugin $info >/dev/full 2>/dev/null
  rc=$?
  [ $rc -eq 2 ] || fail "pmla-info writing to /dev/full exited $rc, want 2"
  PMLA_PLUGIN_PATH=$plugin $bench --shape b=1,L=64,h=16 --iters 1 --warmup 0 >/dev/full 2>/dev/null
  rc=$?
  [ $rc -eq 2 ] || fail "pmla-bench writing to /dev/full exited $rc, want 2"
fi
# bench: a backend that is not there is named (1), and the registry is
# closed on the way out (a sanitizer build reports a leak otherwise)
out=$($bench --plugin "$plugin" --backend no-such-backend --shape b=1,L=64,h=16 2>&1)
rc=$?
[ $rc -eq 1 ] || fail "pmla-bench --backend no-such-backend exited $rc, want 1: $out"
has "$out" "pmla-bench: no backend 'no-such-backend' on the search path $plugin"
case $out in *LeakSanitizer*) fail "pmla-bench leaked on the way out: $out" ;; esac
out=$($info a b 2>&1 >/dev/null) && fail "pmla-info a b exited 0"
has "$out" "pmla-info: too many arguments" "usage: pmla-info [PATH]"
out=$($info -x 2>&1 >/dev/null) && fail "pmla-info -x exited 0"
has "$out" "pmla-info: unknown option"
echo "PASS: pmla-info and pmla-bench"
