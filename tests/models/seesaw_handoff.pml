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
 *     writer overwrites it for the next; P0' and P1 are written over the
 *     rope block of this pair's block, with no read of it in flight;
 *   - not modelled: the warps inside a warpgroup (the code's warpgroup-local
 *     barriers order them) and the wgmma / cp.async data paths themselves.
 *   - every read of a stage (QK, each warpgroup's PV, asynchronous wgmma
 *     reads held open from issue to wait) sees the block it expects, after
 *     the load that brought it has landed;
 *   - a stage is reloaded only when no read of it is in flight and all
 *     uses of its block are done. Each stage is two column groups: "own"
 *     (read by the owner's QK and the owner's PV: V_L of stage 0, V_R of
 *     stage 1) and "other" (the owner's QK and the other warpgroup's PV,
 *     which also reads P in the rope block). With -DSPLIT (PMLA_WG_SPLIT)
 *     the own group is reloaded right after the owner's PV, the other after
 *     the FREE hand-off;
 *   - at the end no barrier phase is left half-completed (the next item
 *     starts clean).
 * Run: spin -a [-DSPLIT] seesaw_handoff.pml && cc -o pan pan.c && ./pan
 * (tests/models/check-handoff.sh runs both, then mutants of it). */
/* the item's block count: every value 0..MAXBLK is explored (0..6 covers
 * every case of the pair loop: odd and even counts, with and without a
 * next pair) */
#ifndef MAXBLK
#define MAXBLK 6
#endif
byte nblk;
#define NBLK nblk
#define NPAIR ((nblk + 1) / 2)

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

/* column groups: stage s, group OWN or OTHER -> index 2 s + group */
#define OWN 0
#define OTHER 1
byte blk[4];      /* block held by the group */
bool landed[4];   /* its load is complete (owner did cp.async.wait + barrier) */
byte uses[4];     /* reads of that block still to come: QK and one PV */
byte readers[4];  /* reads in flight */
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

inline read_open(x, b) {
  atomic { assert(blk[x] == b && landed[x] && uses[x] > 0); readers[x]++ }
}
inline read_close(x) {
  atomic { readers[x]--; uses[x]-- }
}
/* QK reads both groups of its stage */
inline qk(st, b) {
  read_open(2 * st + OWN, b); read_open(2 * st + OTHER, b);
  read_close(2 * st + OWN); read_close(2 * st + OTHER)
}
/* P0' / P1 go over the rope block, in the "other" group of the writer's
 * stage: it must hold this pair's block, landed, with no read in flight */
inline write_p(x, b) {
  atomic { assert(blk[x] == b && landed[x] && readers[x] == 0 && uses[x] > 0) }
}
inline load(x, b) {
  atomic { assert(readers[x] == 0 && uses[x] == 0); blk[x] = b; landed[x] = false; uses[x] = 2 }
}
inline land(st) {
  landed[2 * st + OWN] = true; landed[2 * st + OTHER] = true
}

proctype wg0() {
  byte i = 0, ph;
  bool has1, next0, next1;
  do
  :: i < NPAIR ->
    has1 = 2 * i + 1 < NBLK; next0 = 2 * i + 2 < NBLK; next1 = 2 * i + 3 < NBLK;
    if :: i > 0 -> land(0) :: else -> skip fi;        /* cp.async.wait + LOC */
    qk(0, 2 * i);                                     /* S0 = Q K0^T */
    ma_of = i + 1;                                    /* m_a to sMa */
    arrive(SCALE0, 1);
    read_open(0, 2 * i);                              /* PV0_L issued (own group) */
    bsync(SCALE1, 1, ph);
    assert(mb_of == i + 1);                           /* m_b from sMb */
    write_p(1, 2 * i); p0_of = i + 1;                 /* P0' to stage 0's rope */
    arrive(P0READY, 1);
    read_close(0);                                    /* PV0_L waited */
#ifdef SPLIT
    if
    :: next0 -> load(0, 2 * i + 2); bsync(FREE0, 1, ph); load(1, 2 * i + 2)
    :: else -> skip
    fi;
#else
    if
    :: next0 -> bsync(FREE0, 1, ph); load(0, 2 * i + 2); load(1, 2 * i + 2)
    :: else -> skip
    fi;
#endif
    if
    :: has1 ->
      bsync(P1READY, 1, ph);
      assert(p1_of == i + 1);
      read_open(3, 2 * i + 1); read_close(3);         /* P1 V1_L (other group of stage 1) */
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
      if :: i > 0 -> land(1) :: else -> skip fi;
      qk(1, 2 * i + 1)                                /* S1 = Q K1^T */
    :: else -> skip
    fi;
    bsync(SCALE0, 2, ph);
    assert(ma_of == i + 1);                           /* m_a from sMa */
    mb_of = i + 1;                                    /* m_b to sMb */
    arrive(SCALE1, 2);
    if
    :: has1 -> write_p(3, 2 * i + 1); p1_of = i + 1; arrive(P1READY, 2) /* P1 to stage 1's rope */
    :: else -> skip
    fi;
    bsync(P0READY, 2, ph);
    assert(p0_of == i + 1);
    read_open(1, 2 * i);                              /* P0' V0_R issued (other group of stage 0) */
    if
    :: has1 -> read_open(2, 2 * i + 1)                /* P1 V1_R issued (own group of stage 1) */
    :: else -> skip
    fi;
    read_close(1);                                    /* wait_group 1 (or 0) */
    if :: next0 -> arrive(FREE0, 2) :: else -> skip fi;
    if :: has1 -> read_close(2) :: else -> skip fi;   /* wait_group 0 */
#ifdef SPLIT
    if
    :: next1 -> load(2, 2 * i + 3); bsync(FREE1, 2, ph); load(3, 2 * i + 3)
    :: else -> skip
    fi;
#else
    if
    :: next1 -> bsync(FREE1, 2, ph); load(2, 2 * i + 3); load(3, 2 * i + 3)
    :: else -> skip
    fi;
#endif
    i++
  :: else -> break
  od;
  finished++
}

init {
  select(nblk : 0 .. MAXBLK);
  atomic {
    /* item start: Q, block 0 (warpgroup 0) and block 1 (warpgroup 1) land
     * before __syncthreads */
    if
    :: NBLK > 0 -> blk[0] = 0; blk[1] = 0; landed[0] = true; landed[1] = true; uses[0] = 2; uses[1] = 2
    :: else -> skip
    fi;
    if
    :: NBLK > 1 -> blk[2] = 1; blk[3] = 1; landed[2] = true; landed[3] = true; uses[2] = 2; uses[3] = 2
    :: else -> skip
    fi;
    run wg0(); run wg1()
  }
  (finished == 2);
  /* the epilogue's __syncthreads: nothing half-arrived, every block used up */
  byte k = 0;
  do
  :: k < NBAR -> assert(arrived[k] == 0); k++
  :: else -> break
  od;
  k = 0;
  do
  :: k < 4 -> assert(readers[k] == 0 && uses[k] == 0); k++
  :: else -> break
  od
}
