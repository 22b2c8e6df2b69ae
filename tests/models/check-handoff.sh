#!/bin/sh
# Model-checks tests/models/seesaw_handoff.pml (body_ss's hand-off protocol)
# for items of 0..6 KV blocks (every case of the pair loop: odd and even
# counts, with and without a next pair) with spin (Debian: spin), then checks that the
# model would notice each bug in a list of protocol mutations (a load before
# its stage is free, a missing wait, a value published before it is
# written, ...). Exit 0 when every interleaving of the real protocol is free
# of deadlock and assertion failures and every mutant fails; 77 (skip) when
# spin or a C compiler is missing.
set -u
here=$(cd "$(dirname "$0")" && pwd)
command -v spin >/dev/null 2>&1 || { echo "SKIP: spin not installed"; exit 77; }
cc=${CC:-cc}
command -v "$cc" >/dev/null 2>&1 || { echo "SKIP: no C compiler"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 99
status=0
for n in 0 1 2 3 4 5 6; do
  spin -a -DNBLK=$n "$here/seesaw_handoff.pml" >spin.log 2>&1 || { cat spin.log; exit 99; }
  "$cc" -O0 -w -o pan pan.c || exit 99
  ./pan >pan.log 2>&1
  if grep -q "errors: 0" pan.log && ! grep -q "^pan:[0-9]" pan.log; then
    echo "NBLK=$n: $(grep -o '[0-9]* states, stored' pan.log), no errors"
  else
    echo "NBLK=$n: FAILED"
    cat pan.log
    status=1
  fi
done

# ---- mutants: each must fail for some item size 1..4
fails_somewhere() { # model file
  for n in 1 2 3 4; do
    spin -a -DNBLK=$n "$1" >spin.log 2>&1 || return 0
    "$cc" -O0 -w -o pan pan.c || exit 99
    ./pan >pan.log 2>&1
    if grep -q "^pan:[0-9]\|errors: [1-9]" pan.log; then
      echo "  caught at NBLK=$n: $(grep -m1 "^pan:[0-9]" pan.log)"
      return 0
    fi
  done
  return 1
}
mutant() { # name sed-expression...
  name=$1
  shift
  sed "$@" "$here/seesaw_handoff.pml" >mutant.pml
  if cmp -s mutant.pml "$here/seesaw_handoff.pml"; then
    echo "mutant '$name': its edit no longer applies to the model"
    status=1
  elif fails_somewhere mutant.pml >result.log; then
    echo "mutant '$name':$(cat result.log)"
  else
    echo "mutant '$name': NOT caught"
    status=1
  fi
}
mutant "warpgroup 0 reloads stage 0 before FREE0" \
  -e 's/:: next0 -> bsync(FREE0, 1, ph); load(0, 2 \* i + 2)/:: next0 -> load(0, 2 * i + 2); bsync(FREE0, 1, ph)/'
mutant "FREE1 arrived even without a next odd block" \
  -e 's/if :: next1 -> arrive(FREE1, 1) :: else -> skip fi/arrive(FREE1, 1)/'
mutant "P1READY arrived even without an odd block" \
  -e 's/:: has1 -> p1_of = i + 1; arrive(P1READY, 2)/:: true -> p1_of = i + 1; arrive(P1READY, 2)/'
mutant "warpgroup 0 does not wait for m_b" -e 's/^    bsync(SCALE1, 1, ph);$/    arrive(SCALE1, 1);/'
mutant "warpgroup 1 does not wait for P0'" -e 's/^    bsync(P0READY, 2, ph);$/    arrive(P0READY, 2);/'
mutant "m_a written after SCALE0" \
  -e 's/^    ma_of = i + 1; .*$/    skip;/' -e 's/^    arrive(SCALE0, 1);$/    arrive(SCALE0, 1); ma_of = i + 1;/'
mutant "P1 published before it is written" \
  -e 's/:: has1 -> p1_of = i + 1; arrive(P1READY, 2)/:: has1 -> arrive(P1READY, 2); p1_of = i + 1/'
mutant "warpgroup 1 reads its block before it landed" \
  -e 's/if :: i > 0 -> landed\[1\] = true :: else -> skip fi/skip/'
mutant "warpgroup 1 frees stage 0 before its PV on it is waited" \
  -e 's|^    read_close(0);  *\/\* wait_group 1 (or 0) \*\/$|    skip;|' \
  -e 's|^    if :: next0 -> arrive(FREE0, 2) :: else -> skip fi;$|    if :: next0 -> arrive(FREE0, 2) :: else -> skip fi; read_close(0);|'
exit $status
