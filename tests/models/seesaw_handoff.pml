/* seesaw_handoff.pml - the hand-off protocol of body_ss
 * (kernels/gpu/decode.hip, PMLA_WG_PP=2) for one work item of NBLK KV
 * blocks, checked with spin over every interleaving of the two warpgroups
 * (each modelled as one process: its 128 threads reach a named barrier
 * together). Checked:
 *   - no deadlock (every barrier wait is eventually matched);
 *   - a side never arrives twice on a barrier id before the other side
 *     completes that phase (one id per hand-off is enough);
 *   - each value handed over (m_a, m_b, P0', P1: one shared-memory slot
 *     each) is read after it was written for this pair and before the
 *     writer overwrites it for the next;
 *   - every read of a stage (QK, each warpgroup's PV, asynchronous wgmma
 *     reads held open from issue to wait) sees the block it expects, after
 *     the load that brought it has landed;
 *   - a stage is reloaded only when no read of it is in flight and all
 *     three uses of its block (QK, PV left, PV right) are done;
 *   - at the end no barrier phase is left half-completed (the next item
 *     starts clean).
 * Run: spin -a -DNBLK=5 seesaw_handoff.pml && cc -O2 -o pan pan.c && ./pan
 * (tests/models/check-handoff.sh runs NBLK = 0..6, then mutants of it). */
#ifndef NBLK
#define NBLK 5
#endif
#define NPAIR ((NBLK + 1) / 2)

/* barrier ids as in body_ss */
#define SCALE0 0
#define SCALE1 1
#define P0READY 2
#define P1READY 3
#define FREE0 4
#define FREE1 5
#define NBAR 6

byte arrived[NBAR]; /* bit 0: warpgroup 0 arrived in this phase, bit 1: warpgroup 1 */
byte phase[NBAR];

byte blk[2];      /* block held by stage s */
bool landed[2];   /* its load is complete (owner did cp.async.wait + barrier) */
byte uses[2];     /* uses of that block still to come (QK, PV_L, PV_R) */
byte readers[2];  /* reads in flight */
byte finished;
byte ma_of, mb_of, p0_of, p1_of; /* pair (+1) whose value the slot holds */

inline arrive(id, me) {
  atomic {
    assert((arrived[id] & me) == 0);
    arrived[id] = arrived[id] | me;
    if
    :: arrived[id] == 3 -> arrived[id] = 0; phase[id]++
    :: else -> skip
    fi
  }
}

inline bsync(id, me, ph) {
  atomic {
    assert((arrived[id] & me) == 0);
    ph = phase[id];
    arrived[id] = arrived[id] | me;
    if
    :: arrived[id] == 3 -> arrived[id] = 0; phase[id]++
    :: else -> skip
    fi
  }
  (phase[id] != ph) /* blocks until the phase completes */
}

inline read_open(s, b) {
  atomic { assert(blk[s] == b && landed[s] && uses[s] > 0); readers[s]++ }
}
inline read_close(s) {
  atomic { readers[s]--; uses[s]-- }
}
inline load(s, b) {
  atomic { assert(readers[s] == 0 && uses[s] == 0); blk[s] = b; landed[s] = false; uses[s] = 3 }
}

proctype wg0() {
  byte i = 0, ph;
  bool has1, next0, next1;
  do
  :: i < NPAIR ->
    has1 = 2 * i + 1 < NBLK; next0 = 2 * i + 2 < NBLK; next1 = 2 * i + 3 < NBLK;
    if :: i > 0 -> landed[0] = true :: else -> skip fi /* cp.async.wait + LOC */
    read_open(0, 2 * i); read_close(0);               /* S0 = Q K0^T */
    ma_of = i + 1;                                    /* m_a to sMa */
    arrive(SCALE0, 1);
    read_open(0, 2 * i);                              /* PV0_L issued */
    bsync(SCALE1, 1, ph);
    assert(mb_of == i + 1);                           /* m_b from sMb */
    p0_of = i + 1;                                    /* P0' to stage 0's rope */
    arrive(P0READY, 1);
    read_close(0);                                    /* PV0_L waited */
    if
    :: next0 -> bsync(FREE0, 1, ph); load(0, 2 * i + 2)
    :: else -> skip
    fi;
    if
    :: has1 ->
      bsync(P1READY, 1, ph);
      assert(p1_of == i + 1);
      read_open(1, 2 * i + 1); read_close(1);         /* P1 V1_L, issued and waited */
      if :: next1 -> arrive(FREE1, 1) :: else -> skip fi
    :: else -> skip
    fi;
    i++
  :: else -> break
  od;
  finished++
}

proctype wg1() {
  byte i = 0, ph;
  bool has1, next0, next1;
  do
  :: i < NPAIR ->
    has1 = 2 * i + 1 < NBLK; next0 = 2 * i + 2 < NBLK; next1 = 2 * i + 3 < NBLK;
    if
    :: has1 ->
      if :: i > 0 -> landed[1] = true :: else -> skip fi
      read_open(1, 2 * i + 1); read_close(1)          /* S1 = Q K1^T */
    :: else -> skip
    fi;
    bsync(SCALE0, 2, ph);
    assert(ma_of == i + 1);                           /* m_a from sMa */
    mb_of = i + 1;                                    /* m_b to sMb */
    arrive(SCALE1, 2);
    if
    :: has1 -> p1_of = i + 1; arrive(P1READY, 2)      /* P1 to stage 1's rope */
    :: else -> skip
    fi;
    bsync(P0READY, 2, ph);
    assert(p0_of == i + 1);
    read_open(0, 2 * i);                              /* P0' V0_R issued */
    if
    :: has1 -> read_open(1, 2 * i + 1)                /* P1 V1_R issued */
    :: else -> skip
    fi;
    read_close(0);                                    /* wait_group 1 (or 0) */
    if :: next0 -> arrive(FREE0, 2) :: else -> skip fi;
    if :: has1 -> read_close(1) :: else -> skip fi;   /* wait_group 0 */
    if
    :: next1 -> bsync(FREE1, 2, ph); load(1, 2 * i + 3)
    :: else -> skip
    fi;
    i++
  :: else -> break
  od;
  finished++
}

init {
  atomic {
    /* item start: Q, block 0 (warpgroup 0) and block 1 (warpgroup 1) land
     * before __syncthreads */
    if :: NBLK > 0 -> blk[0] = 0; landed[0] = true; uses[0] = 3 :: else -> skip fi;
    if :: NBLK > 1 -> blk[1] = 1; landed[1] = true; uses[1] = 3 :: else -> skip fi;
    run wg0(); run wg1()
  }
  (finished == 2);
  /* the epilogue's __syncthreads: nothing half-arrived, every block used up */
  byte k = 0;
  do
  :: k < NBAR -> assert(arrived[k] == 0); k++
  :: else -> break
  od;
  assert(readers[0] == 0 && readers[1] == 0 && uses[0] == 0 && uses[1] == 0)
}
