#!/bin/sh
# Model-checks tests/models/seesaw_handoff.pml (body_ss's hand-off
# protocol, with and without PMLA_WG_SPLIT's early reloads, for items of
# 0..6 KV blocks) with spin (Debian: spin), then checks that the model
# notices each bug in a list of protocol mutations (a reload before its
# stage is free, a missing wait, a value published before it is written, a
# wait that can never complete, ...). Exit 0 when every interleaving of the
# real protocol is free of deadlock and assertion failures and every mutant
# fails; 77 (skip) when spin or a C compiler is missing.
set -u
here=$(cd "$(dirname "$0")" && pwd)
command -v spin >/dev/null 2>&1 || { echo "SKIP: spin not installed"; exit 77; }
cc=${CC:-cc}
command -v "$cc" >/dev/null 2>&1 || { echo "SKIP: no C compiler"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 99
status=0
run_pan() { # model flags...: 0 when pan reports no error
  model=$1
  shift
  spin -a "$@" "$model" >spin.log 2>&1 || { cat spin.log; exit 99; }
  "$cc" -O0 -w -o pan pan.c || exit 99
  ./pan >pan.log 2>&1
  if grep -q "max search depth too small" pan.log; then
    echo "pan: search truncated (raise -m)"
    exit 99
  fi
  grep -q "errors: 0" pan.log && ! grep -q "^pan:[0-9]" pan.log
}
for flags in "" "-DSPLIT"; do
  # shellcheck disable=SC2086
  if run_pan "$here/seesaw_handoff.pml" $flags; then
    echo "${flags:-whole-stage reloads}, items of 0..6 blocks: $(grep -o '[0-9]* states, stored' pan.log), no errors"
  else
    echo "$flags: FAILED"
    cat pan.log
    status=1
  fi
done

# ---- mutants: each must fail
mutant() { # name flags sed-expression...
  name=$1 flags=$2
  shift 2
  sed "$@" "$here/seesaw_handoff.pml" >mutant.pml
  if cmp -s mutant.pml "$here/seesaw_handoff.pml"; then
    echo "mutant '$name': its edit no longer applies to the model"
    status=1
    return
  fi
  # shellcheck disable=SC2086
  if run_pan mutant.pml $flags; then
    echo "mutant '$name': NOT caught"
    status=1
  else
    echo "mutant '$name': caught: $(grep -m1 "^pan:[0-9]" pan.log)"
  fi
}
mutant "warpgroup 0 reloads stage 0 before FREE0" "" \
  -e 's/:: next0 -> bsync(FREE0, 1, ph); load(0, 2 \* i + 2); load(1, 2 \* i + 2)/:: next0 -> load(0, 2 * i + 2); load(1, 2 * i + 2); bsync(FREE0, 1, ph)/'
mutant "split: warpgroup 0 reloads the other group before FREE0" "-DSPLIT" \
  -e 's/:: next0 -> load(0, 2 \* i + 2); bsync(FREE0, 1, ph); load(1, 2 \* i + 2)/:: next0 -> load(0, 2 * i + 2); load(1, 2 * i + 2); bsync(FREE0, 1, ph)/'
mutant "split: warpgroup 1 reloads the other group before FREE1" "-DSPLIT" \
  -e 's/:: next1 -> load(2, 2 \* i + 3); bsync(FREE1, 2, ph); load(3, 2 \* i + 3)/:: next1 -> load(2, 2 * i + 3); load(3, 2 * i + 3); bsync(FREE1, 2, ph)/'
mutant "split: warpgroup 1 reloads its own group before its PV on it is waited" "-DSPLIT" \
  -e 's|^    if :: has1 -> read_close(2) :: else -> skip fi;   /\* wait_group 0 \*/$|    skip;|' \
  -e 's/:: next1 -> load(2, 2 \* i + 3); bsync(FREE1, 2, ph); load(3, 2 \* i + 3)/:: next1 -> load(2, 2 * i + 3); if :: has1 -> read_close(2) :: else -> skip fi; bsync(FREE1, 2, ph); load(3, 2 * i + 3)/'
mutant "FREE1 arrived even without a next odd block" "" \
  -e 's/if :: next1 -> arrive(FREE1, 1) :: else -> skip fi/arrive(FREE1, 1)/'
mutant "P1READY arrived even without an odd block" "" \
  -e 's/:: has1 -> write_p(3, 2 \* i + 1); p1_of = i + 1; arrive(P1READY, 2)/:: true -> p1_of = i + 1; arrive(P1READY, 2)/'
mutant "warpgroup 0 does not wait for m_b" "" -e 's/^    bsync(SCALE1, 1, ph);$/    arrive(SCALE1, 1);/'
mutant "warpgroup 1 does not wait for P0'" "" -e 's/^    bsync(P0READY, 2, ph);$/    arrive(P0READY, 2);/'
mutant "m_a written after SCALE0" "" \
  -e 's/^    ma_of = i + 1; .*$/    skip;/' -e 's/^    arrive(SCALE0, 1);$/    arrive(SCALE0, 1); ma_of = i + 1;/'
mutant "P1 published before it is written" "" \
  -e 's/:: has1 -> write_p(3, 2 \* i + 1); p1_of = i + 1; arrive(P1READY, 2)/:: has1 -> write_p(3, 2 * i + 1); arrive(P1READY, 2); p1_of = i + 1/'
mutant "warpgroup 1 reads its block before it landed" "" \
  -e 's/if :: i > 0 -> land(1) :: else -> skip fi;/skip;/'
mutant "warpgroup 1 frees stage 0 before its PV on it is waited" "" \
  -e 's|^    read_close(1);  *\/\* wait_group 1 (or 0) \*\/$|    skip;|' \
  -e 's|^    if :: next0 -> arrive(FREE0, 2) :: else -> skip fi;$|    if :: next0 -> arrive(FREE0, 2) :: else -> skip fi; read_close(1);|'
mutant "split: warpgroup 0 writes P0' after reloading its stage" "-DSPLIT" \
  -e "s/^    write_p(1, 2 \\* i); p0_of = i + 1; .*$/    p0_of = i + 1;/" \
  -e "s/:: next0 -> load(0, 2 \\* i + 2); bsync(FREE0, 1, ph); load(1, 2 \\* i + 2)/:: next0 -> load(0, 2 * i + 2); bsync(FREE0, 1, ph); load(1, 2 * i + 2); write_p(1, 2 * i)/"
mutant "warpgroup 0 waits for FREE0 before publishing P0' (deadlock)" "" \
  -e 's/^    arrive(P0READY, 1);$/    bsync(FREE0, 1, ph); arrive(P0READY, 1);/'
exit $status
