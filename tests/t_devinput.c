/* SPDX-License-Identifier: MIT */
/* t_devinput.c - bad values inside the index tensors of otherwise valid
 * steps, drawn at random: a page or slot index outside the cache, a kv_len
 * past the block table or negative, qo_indptr out of order or past the
 * query tensor. Each step is refused with a message (outputs intact) or
 * runs and sets the device error word; nothing faults (on the GPU, run it
 * under compute-sanitizer memcheck); and the valid step decoded after it
 * gives exactly the output it gave before any bad step.
 *
 * Steps per test: PMLA_CONFORMANCE_DEVINPUT_STEPS (default 40). Page size 64
 * and 64 heads, so on sm_90a the whole-page TMA path sees the bad pages. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "reference.h"

#define DH 64      /* heads */
#define DPS 64     /* page size */
#define DB 4       /* requests */
#define DMAXQ 2    /* query rows per request at most */
#define DMAXP 6    /* pages per request in the block table */
#define DPAGES 24  /* pages in the cache */
#define DTOKENS (DB * DMAXQ)
#define DTOPK 128
#define OUT_N ((size_t)DTOKENS * DH * 512)

typedef struct dfx {
  pmla_builder *b;
  int sparse;
  int32_t qo[DB + 1], lens[DB], bt[DB * DMAXP], topk[DTOKENS * DTOPK];
  test_tensor t_qo, t_lens, t_bt, t_topk, q, kv, out, lse;
  pmla_decode_batch batch;
  pmla_sparse_batch sbatch;
  pmla_decode_args args;
  uint16_t *base, *got; /* out on the host: the valid step's, a later decode's */
  size_t out_n;         /* elements the valid step writes */
} dfx;


/* a valid step: every request 1-2 query rows, 1..DMAXP*DPS tokens, pages
 * distinct and shuffled; top-k lists of valid slots with -1 holes */
static void dfx_valid(dfx *f, uint64_t *rng) {
  f->qo[0] = 0;
  for (int r = 0; r < DB; r++) {
    f->qo[r + 1] = f->qo[r] + 1 + (int32_t)rng_below(rng, DMAXQ);
    f->lens[r] = 1 + (int32_t)rng_below(rng, DMAXP * DPS);
  }
  int32_t perm[DPAGES];
  for (int i = 0; i < DPAGES; i++)
    perm[i] = i;
  for (int i = DPAGES - 1; i > 0; i--) {
    int j = (int)rng_below(rng, (uint32_t)i + 1), t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  for (int i = 0; i < DB * DMAXP; i++)
    f->bt[i] = perm[i % DPAGES];
  for (int i = 0; i < DTOKENS * DTOPK; i++)
    f->topk[i] = rng_below(rng, 8) == 0 ? -1 : (int32_t)rng_below(rng, DPAGES * DPS);
}

static void dfx_upload(dfx *f) {
  tt_upload(&f->t_qo, f->qo);
  tt_upload(&f->t_lens, f->lens);
  tt_upload(&f->t_bt, f->bt);
  tt_upload(&f->t_topk, f->topk);
}

static void dfx_setup(dfx *f, int sparse, uint64_t *rng) {
  memset(f, 0, sizeof *f);
  f->sparse = sparse;
  pmla_builder_config c =
      harness_config(DH, DPS, sparse ? DTOKENS : DB, sparse ? 1 : DMAXQ, sparse ? DTOPK : 0, 0);
  f->b = harness_init(&c);
  tt_make1(&f->t_qo, TT_I32, NULL, DB + 1);
  tt_make1(&f->t_lens, TT_I32, NULL, DB);
  tt_make2(&f->t_bt, TT_I32, NULL, DB, DMAXP);
  tt_make2(&f->t_topk, TT_I32, NULL, DTOKENS, DTOPK);
  size_t nq = (size_t)DTOKENS * DH * 576, nkv = (size_t)DPAGES * DPS * 576;
  uint16_t *hq = malloc(nq * 2), *hkv = malloc(nkv * 2);
  ck_assert(hq && hkv);
  for (size_t i = 0; i < nq; i++)
    hq[i] = ref_float_to_bf16((float)(rng_uniform(rng) * 2 - 1));
  for (size_t i = 0; i < nkv; i++)
    hkv[i] = ref_float_to_bf16((float)(rng_uniform(rng) * 2 - 1));
  tt_make3(&f->q, TT_BF16, hq, DTOKENS, DH, 576);
  tt_make3(&f->kv, TT_BF16, hkv, DPAGES, DPS, 576);
  tt_make3(&f->out, TT_BF16, NULL, DTOKENS, DH, 512);
  tt_make2(&f->lse, TT_F32, NULL, DTOKENS, DH);
  free(hq);
  free(hkv);
  f->base = malloc(OUT_N * 2);
  f->got = malloc(OUT_N * 2);
  ck_assert(f->base && f->got);
  f->batch.struct_size = sizeof f->batch;
  f->batch.kv_layout = PMLA_KV_BLOCK_TABLE;
  f->batch.qo_indptr = &f->t_qo.t;
  f->batch.block_table = &f->t_bt.t;
  f->batch.kv_lens = &f->t_lens.t;
  f->sbatch.struct_size = sizeof f->sbatch;
  f->sbatch.topk_indices = &f->t_topk.t;
  f->sbatch.max_seq_len = DPAGES * DPS;
  f->args.struct_size = sizeof f->args;
  f->args.q = &f->q.t;
  f->args.kv_cache = &f->kv.t;
  f->args.out = &f->out.t;
  f->args.lse = &f->lse.t;
  f->batch.stream = f->sbatch.stream = f->args.stream = harness_stream();
}

static void dfx_teardown(dfx *f) {
  g_be->destroy_builder(f->b);
  test_tensor *all[] = {&f->t_qo, &f->t_lens, &f->t_bt, &f->t_topk,
                        &f->q,    &f->kv,     &f->out,  &f->lse};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    tt_free(all[i]);
  free(f->base);
  free(f->got);
}

static pmla_status dfx_build(dfx *f) {
  return f->sparse ? g_be->build_sparse(f->b, &f->sbatch) : g_be->build_decode(f->b, &f->batch);
}

/* one bad value that every conforming backend must notice; returns what */
static const char *corrupt(dfx *f, uint64_t *rng) {
  static const int32_t bad_page[] = {DPAGES, DPAGES + 1, -1, -7, INT32_MAX, INT32_MIN};
  static const int32_t bad_slot[] = {DPAGES * DPS, -2, INT32_MAX, INT32_MIN};
  if (f->sparse) {
    f->topk[rng_below(rng, DTOKENS * DTOPK)] = bad_slot[rng_below(rng, 4)];
    return "top-k slot outside the cache";
  }
  const int r = (int)rng_below(rng, DB);
  switch (rng_below(rng, 4)) {
  case 0: { /* a page the request reads */
    const int used = (f->lens[r] + DPS - 1) / DPS;
    f->bt[r * DMAXP + (int)rng_below(rng, (uint32_t)used)] = bad_page[rng_below(rng, 6)];
    return "block table page outside the cache";
  }
  case 1:
    f->lens[r] = rng_below(rng, 2) ? -1 - (int32_t)rng_below(rng, 1000)
                                   : DMAXP * DPS + 1 + (int32_t)rng_below(rng, 1000);
    return "kv_len negative or past the block table";
  case 2: /* two requests' row ranges out of order */
    f->qo[r + 1] = f->qo[r] + 1 + DMAXQ + (int32_t)rng_below(rng, 3);
    return "qo_indptr out of order or a request longer than max_q_len";
  default:
    f->qo[DB] = DTOKENS + 1 + (int32_t)rng_below(rng, 1000);
    return "qo_indptr past the query tensor";
  }
}

/* The fixture with a valid step of its own (q, out and lse hold the
 * step's tokens). */
static void dfx_prepare(dfx *f, int sparse, uint64_t *rng) {
  dfx_setup(f, sparse, rng);
  dfx_valid(f, rng);
  if (!sparse)
    f->q.shape[0] = f->out.shape[0] = f->lse.shape[0] = f->qo[DB];
  f->out_n = (size_t)f->out.shape[0] * DH * 512;
}

/* Builds and decodes the fixture's step, which must be valid; its output
 * in f->base. */
static void dfx_decode_valid(dfx *f) {
  uint32_t flags = 0;
  dfx_upload(f);
  ck_assert_msg(dfx_build(f) == PMLA_OK, "valid build: %s", g_be->last_error(f->b));
  ck_assert_msg(g_be->decode(f->b, &f->args) == PMLA_OK, "valid decode: %s",
                g_be->last_error(f->b));
  ck_assert_msg(g_be->check_device_error(f->b, &flags) == PMLA_OK && flags == 0,
                "the valid step set device error flags 0x%x", flags);
  tt_download(&f->out, f->base);
}

/* A decode of the built step that now reads a bad index: refused with a
 * message, or run with `bit` set in the device error word (nothing read
 * outside the cache: the sanitizers watch that). `host`: the backend checks
 * the indices in host memory at this decode, so it must refuse. */
static void expect_noticed(dfx *f, uint32_t bit, int host, const char *what) {
  uint32_t flags = 0;
  pmla_status s = g_be->decode(f->b, &f->args);
  if (s != PMLA_OK) {
    EXPECT(s == PMLA_ERR_INVALID_ARGUMENT, "%s: %s", what, harness_status_name(s));
    EXPECT(g_be->last_error(f->b)[0], "%s: refused without a message", what);
    return;
  }
  EXPECT(!host, "%s: decoded, where the indices in host memory are checked first", what);
  s = g_be->check_device_error(f->b, &flags);
  EXPECT(s == PMLA_ERR_DEVICE_INPUT && (flags & bit),
         "%s: decoded, and check_device_error says %s (flags 0x%x, expected bit 0x%x)", what,
         harness_status_name(s), flags, bit);
}

/* The built step decoded again with its indices as they were: f->base,
 * bit for bit, and no flag. */
static void expect_base_again(dfx *f, const char *what) {
  uint32_t flags = 0;
  EXPECT(g_be->decode(f->b, &f->args) == PMLA_OK, "valid decode after %s: %s", what,
         g_be->last_error(f->b));
  EXPECT(g_be->check_device_error(f->b, &flags) == PMLA_OK && flags == 0,
         "the valid decode after %s set flags 0x%x", what, flags);
  tt_download(&f->out, f->got);
  EXPECT(memcmp(f->got, f->base, f->out_n * 2) == 0,
         "the valid decode after %s changed its output", what);
}

static void run_devinput(int sparse) {
  REQUIRE_BACKEND();
  uint64_t rng = harness_seed() ^ (sparse ? 0x5eedull : 0xd0e5ull);
  dfx f;
  dfx_prepare(&f, sparse, &rng);
  int32_t good_qo[DB + 1], good_lens[DB], good_bt[DB * DMAXP], good_topk[DTOKENS * DTOPK];
  memcpy(good_qo, f.qo, sizeof good_qo);
  memcpy(good_lens, f.lens, sizeof good_lens);
  memcpy(good_bt, f.bt, sizeof good_bt);
  memcpy(good_topk, f.topk, sizeof good_topk);
  dfx_decode_valid(&f);
  for (size_t i = 0; i < f.out_n; i++)
    EXPECT(ref_bf16_to_float(f.base[i]) == ref_bf16_to_float(f.base[i]),
           "valid step: NaN at %zu", i);
  uint32_t flags = 0;

  const int n = harness_devinput_steps();
  int refused = 0, flagged = 0;
  for (int k = 0; k < n; k++) {
    const char *what = corrupt(&f, &rng);
    dfx_upload(&f);
    pmla_status s = dfx_build(&f);
    if (s == PMLA_OK)
      s = g_be->decode(f.b, &f.args);
    if (s != PMLA_OK) {
      EXPECT(s == PMLA_ERR_INVALID_ARGUMENT || s == PMLA_ERR_DEVICE_INPUT,
             "step %d (%s): %s", k, what, harness_status_name(s));
      EXPECT(g_be->last_error(f.b)[0], "step %d (%s): refused without a message", k, what);
      refused++;
    } else {
      s = g_be->check_device_error(f.b, &flags);
      EXPECT(s == PMLA_ERR_DEVICE_INPUT && flags != 0,
             "step %d (%s): ran, and check_device_error says %s (flags 0x%x)", k, what,
             harness_status_name(s), flags);
      flagged++;
    }
    /* the valid step again: the same output, bit for bit */
    memcpy(f.qo, good_qo, sizeof good_qo);
    memcpy(f.lens, good_lens, sizeof good_lens);
    memcpy(f.bt, good_bt, sizeof good_bt);
    memcpy(f.topk, good_topk, sizeof good_topk);
    dfx_upload(&f);
    EXPECT(dfx_build(&f) == PMLA_OK, "step %d: valid rebuild after %s: %s", k, what,
           g_be->last_error(f.b));
    char after[128];
    snprintf(after, sizeof after, "step %d (%s)", k, what);
    expect_base_again(&f, after);
  }
  printf("devinput %s: %d bad steps, %d refused, %d flagged by the device\n",
         sparse ? "sparse" : "dense", n, refused, flagged);
  dfx_teardown(&f);
}

/* An index rewritten in place after a decode of its step checked it: the
 * next decode of the same step (the next layer) reads the new value. A
 * backend may keep its check for the step, so every read is checked again.
 * Each request (token) in turn, its first and last page (slot), so that a
 * bad read falls to every unit with work. */
static void run_rewritten(int sparse) {
  REQUIRE_BACKEND();
  uint64_t rng = harness_seed() ^ 0x4e3217ull;
  dfx f;
  dfx_prepare(&f, sparse, &rng);
  dfx_decode_valid(&f);
  for (int r = 0; r < (sparse ? DTOKENS : DB); r++)
    for (int last = 0; last < 2; last++) {
      int32_t *at = sparse ? &f.topk[r * DTOPK + (last ? DTOPK - 1 : 0)]
                           : &f.bt[r * DMAXP + (last ? (f.lens[r] - 1) / DPS : 0)];
      const int32_t keep = *at;
      *at = sparse ? DPAGES * DPS : DPAGES;
      dfx_upload(&f);
      char what[96];
      snprintf(what, sizeof what, "%s %d's %s %s rewritten outside the cache after its check",
               sparse ? "token" : "request", r, last ? "last" : "first",
               sparse ? "slot" : "page");
      expect_noticed(&f, sparse ? PMLA_DEVERR_SLOT_INDEX : PMLA_DEVERR_PAGE_INDEX, 0, what);
      *at = keep;
      dfx_upload(&f);
      expect_base_again(&f, what);
    }
  dfx_teardown(&f);
}

/* The built step decoded against a cache one page smaller, which its
 * largest index no longer fits: checked against that cache (refused where
 * the indices are in host memory); against the whole cache again it gives
 * its output. */
static void run_smaller_cache(int sparse) {
  REQUIRE_BACKEND();
  uint64_t rng = harness_seed() ^ 0x5a11ull;
  dfx f;
  dfx_prepare(&f, sparse, &rng);
  if (sparse) { /* the step reads the cache's last slot (page) */
    f.topk[0] = DPAGES * DPS - 1;
  } else {
    for (int i = 1; i < DB * DMAXP; i++)
      if (f.bt[i] == DPAGES - 1) {
        f.bt[i] = f.bt[0];
        f.bt[0] = DPAGES - 1;
      }
  }
  dfx_decode_valid(&f);
  f.kv.shape[0] = DPAGES - 1;
  expect_noticed(&f, sparse ? PMLA_DEVERR_SLOT_INDEX : PMLA_DEVERR_PAGE_INDEX,
                 g_mem->device_type == kDLCPU, "the step decoded against a cache a page smaller");
  f.kv.shape[0] = DPAGES;
  expect_base_again(&f, "a decode against a smaller cache");
  dfx_teardown(&f);
}

START_TEST(test_a_page_index_rewritten_after_its_check_is_still_never_read) {
  run_rewritten(0);
}
END_TEST

START_TEST(test_a_topk_slot_rewritten_after_its_check_is_still_never_read) {
  run_rewritten(1);
}
END_TEST

START_TEST(test_a_step_decoded_against_a_smaller_cache_is_checked_against_it) {
  run_smaller_cache(0);
}
END_TEST

START_TEST(test_a_sparse_step_decoded_against_a_smaller_cache_is_checked_against_it) {
  run_smaller_cache(1);
}
END_TEST

START_TEST(test_random_bad_dense_indices_are_flagged_and_the_next_step_is_exact) {
  run_devinput(0);
}
END_TEST

START_TEST(test_random_bad_topk_slots_are_flagged_and_the_next_step_is_exact) {
  run_devinput(1);
}
END_TEST

Suite *suite_devinput(void) {
  Suite *s = suite_create("devinput");
  TCase *tc = tcase_create("random bad indices");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, test_random_bad_dense_indices_are_flagged_and_the_next_step_is_exact);
  tcase_add_test(tc, test_random_bad_topk_slots_are_flagged_and_the_next_step_is_exact);
  suite_add_tcase(s, tc);
  tc = tcase_create("indices that change under a built step");
  tcase_add_test(tc, test_a_page_index_rewritten_after_its_check_is_still_never_read);
  tcase_add_test(tc, test_a_topk_slot_rewritten_after_its_check_is_still_never_read);
  tcase_add_test(tc, test_a_step_decoded_against_a_smaller_cache_is_checked_against_it);
  tcase_add_test(tc, test_a_sparse_step_decoded_against_a_smaller_cache_is_checked_against_it);
  suite_add_tcase(s, tc);
  return s;
}
