/* SPDX-License-Identifier: MIT */
/* t_plan_exact.c - white-box: this plugin's schedules are exactly what its
 * shared planner (kernels/planner.h) computes. The backend's six schedule
 * buffers equal pmla_plan's word for word (on pmla the device's metadata
 * kernel, on pmla-cpu the host call); dense builds are uncapped; the sparse
 * split cap follows pmla_sparse_split_cap; the numeric cases marked
 * expect_split (cases.c) do split on this plugin, so pmla-conformance's
 * numerics exercise the partials and the reduce. Another plugin need not
 * pass these; pmla-conformance holds what any plugin must. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cases.h"
#include "harness.h"
#include "plan_invariant.h"
#include "planner.h"

/* Reads the builder's six schedule buffers back and compares them with the
 * host planner run on the same lengths: the backend (on pmla, the device's
 * metadata kernel) must plan identically, word for word. */
static void expect_host_schedule(pmla_builder *b, const pmla_plan_input *host_in,
                                 const char *what) {
  pmla_builder_info info = harness_query(b);
  int32_t *dev[6], *host[6];
  for (int k = 0; k < 6; k++) {
    dev[k] = calloc(1, (size_t)info.buffer_bytes[k]);
    host[k] = calloc(1, (size_t)info.buffer_bytes[k]);
    ck_assert(dev[k] && host[k]);
    ck_assert_int_eq(g_be->copy_buffer(b, (pmla_buffer)k, dev[k], info.buffer_bytes[k]), PMLA_OK);
  }
  pmla_plan_input in = *host_in;
  in.num_units = (int32_t)info.sched_units;
  in.max_items = (int32_t)info.max_work_items;
  in.max_partials = (int32_t)info.max_partial_slots;
  pmla_plan_output out = {host[0], host[1], host[2], host[3], host[4], host[5]};
  ck_assert_int_eq(pmla_plan_step(&in, &out), 0);
  const int32_t *meta = host[0];
  size_t used[6] = {PMLA_META_WORDS, info.sched_units + 1,
                    (size_t)meta[PMLA_META_NUM_ITEMS] * PMLA_WORK_INFO_WORDS,
                    (size_t)meta[PMLA_META_NUM_REDUCE] + 1, (size_t)meta[PMLA_META_NUM_REDUCE],
                    (size_t)meta[PMLA_META_NUM_PARTIALS]};
  static const char *const names[6] = {"work_meta_data",   "work_indptr",
                                       "work_info_set",    "reduce_indptr",
                                       "reduce_final_map", "reduce_partial_map"};
  for (int k = 0; k < 6; k++)
    for (size_t i = 0; i < used[k]; i++)
      ck_assert_msg(dev[k][i] == host[k][i], "%s: %s[%zu] is %d in the builder, %d from the host planner",
                    what, names[k], i, dev[k][i], host[k][i]);
  for (int k = 0; k < 6; k++) {
    free(dev[k]);
    free(host[k]);
  }
}

/* Builds one block-table step (B requests: query rows qo, lengths lens, a
 * block table `width` pages wide) on a builder made with cfg and compares
 * its schedule with the host planner's; returns the schedule's mode
 * (work_meta_data word PMLA_META_MODE). */
static int32_t expect_dense_schedule(const pmla_builder_config *cfg, int32_t B, int32_t *qo,
                                     int32_t *lens, int32_t *bt, int32_t width, int32_t max_q,
                                     const char *what) {
  pmla_builder *b = harness_init(cfg);
  test_tensor t_qo, t_bt, t_lens;
  tt_make1(&t_qo, TT_I32, qo, B + 1);
  tt_make2(&t_bt, TT_I32, bt, B, width);
  tt_make1(&t_lens, TT_I32, lens, B);
  pmla_decode_batch batch = {.struct_size = sizeof batch, .kv_layout = PMLA_KV_BLOCK_TABLE,
                             .qo_indptr = &t_qo.t, .block_table = &t_bt.t,
                             .kv_lens = &t_lens.t, .stream = harness_stream()};
  ck_assert_int_eq(g_be->build_decode(b, &batch), PMLA_OK);
  pmla_plan_input in;
  memset(&in, 0, sizeof in);
  in.num_requests = B;
  in.max_q_len = max_q;
  in.qo_indptr = qo;
  in.kv_lens = lens;
  in.max_kv_len = width * (int32_t)cfg->page_size;
  in.page_size = (int32_t)cfg->page_size;
  in.invariant = (cfg->flags & PMLA_BUILDER_BATCH_INVARIANT) != 0;
  in.inv_least = (int32_t)cfg->invariant_chunk;
  expect_host_schedule(b, &in, what);
  int32_t meta[PMLA_META_WORDS];
  ck_assert_int_eq(g_be->copy_buffer(b, PMLA_BUF_WORK_META_DATA, meta, sizeof meta), PMLA_OK);
  tt_free(&t_qo);
  tt_free(&t_bt);
  tt_free(&t_lens);
  g_be->destroy_builder(b);
  return meta[PMLA_META_MODE];
}

START_TEST(test_schedule_equals_host_planner) {
  REQUIRE_BACKEND();
  uint64_t rng = harness_seed() ^ 0x77;
  enum { MAXB = 700, WIDTH = 40 }; /* up to two 512-request chunks of the device planner */
  int32_t *qo = malloc(sizeof(int32_t) * (MAXB + 1)), *lens = malloc(sizeof(int32_t) * MAXB);
  int32_t *bt = calloc((size_t)MAXB * WIDTH, sizeof(int32_t));
  ck_assert(qo && lens && bt);
  for (int round = 0; round < 40; round++) {
    int32_t B = (int32_t)rng_below(&rng, MAXB + 1), ps = 64;
    int32_t cu = round % 4 == 0 ? 0 : 1 + (int32_t)rng_below(&rng, 200);
    qo[0] = 0;
    for (int32_t r = 0; r < B; r++) {
      qo[r + 1] = qo[r] + 1 + (int32_t)rng_below(&rng, 2);
      lens[r] = round % 3 == 0 ? (int32_t)rng_below(&rng, 65) : (int32_t)rng_below(&rng, WIDTH * ps + 1);
    }
    /* every fifth round batch-invariant: its own planner (plan_invariant.h) */
    const int inv = round % 5 == 4;
    /* half of those with a least chunk of the host's, 256..2048 */
    const uint32_t asked = inv && round % 10 == 9 ? 256u << (round / 10 % 4) : 0;
    pmla_builder_config cfg = harness_config(round % 2 ? 128 : 16, (uint32_t)ps, MAXB, 2, 0,
                                             (uint32_t)cu);
    cfg.flags = inv ? PMLA_BUILDER_BATCH_INVARIANT : 0;
    cfg.invariant_chunk = asked;
    char what[64];
    snprintf(what, sizeof what, "dense round %d (B=%d, cu=%d%s)", round, B, cu,
             inv ? ", invariant" : "");
    expect_dense_schedule(&cfg, B, qo, lens, bt, WIDTH, 2, what);

    /* sparse: every token one request over topk slots, capped */
    int32_t tokens = 1 + (int32_t)rng_below(&rng, 256), topk = round % 2 ? 2048 : 512;
    int64_t max_seq = (int64_t)rng_below(&rng, 8192);
    cfg = harness_config(16, (uint32_t)ps, 256, 1, (uint32_t)topk, (uint32_t)cu);
    cfg.flags = inv ? PMLA_BUILDER_BATCH_INVARIANT : 0;
    cfg.invariant_chunk = asked;
    pmla_builder *b = harness_init(&cfg);
    int32_t *idx = calloc((size_t)tokens * (size_t)topk, sizeof(int32_t));
    test_tensor t_idx;
    tt_make2(&t_idx, TT_I32, idx, tokens, topk);
    pmla_sparse_batch sb = {.struct_size = sizeof sb, .topk_indices = &t_idx.t,
                            .max_seq_len = max_seq, .stream = harness_stream()};
    ck_assert_int_eq(g_be->build_sparse(b, &sb), PMLA_OK);
    pmla_plan_input in;
    memset(&in, 0, sizeof in);
    in.num_requests = tokens;
    in.max_q_len = 1;
    in.uniform_len = topk;
    in.split_cap = (int32_t)harness_query(b).split_cap;
    in.invariant = inv;
    in.inv_least = (int32_t)cfg.invariant_chunk;
    snprintf(what, sizeof what, "sparse round %d (tokens=%d, cap=%d)", round, tokens, in.split_cap);
    expect_host_schedule(b, &in, what);
    tt_free(&t_idx);
    free(idx);
    g_be->destroy_builder(b);
  }
  free(qo);
  free(lens);
  free(bt);
}
END_TEST


/* Batch-invariant steps of requests long enough (up to 64 chunks each) that
 * the splits ask for more partial slots than the budget holds: the slots
 * are spent in request order, which the device walks only then; 600
 * requests make two chunks of the device planner, the second starting
 * from the slots the first spent. */
START_TEST(test_invariant_schedule_equals_host_planner_when_the_budget_binds) {
  REQUIRE_BACKEND();
  uint64_t rng = harness_seed() ^ 0x5e1;
  enum { MAXB = 600, PS = 64, WIDTH = 2048 };
  int32_t *qo = malloc(sizeof(int32_t) * (MAXB + 1)), *lens = malloc(sizeof(int32_t) * MAXB);
  int32_t *bt = calloc((size_t)MAXB * WIDTH, sizeof(int32_t));
  ck_assert(qo && lens && bt);
  static const uint32_t units[] = {2, 5, 8, 13, 60};
  for (int round = 0; round < 10; round++) {
    const int32_t B = round < 8 ? 40 : MAXB;
    qo[0] = 0;
    for (int32_t r = 0; r < B; r++) {
      qo[r + 1] = qo[r] + 1;
      lens[r] = round % 2 ? WIDTH * PS - (int32_t)rng_below(&rng, 64)
                          : 2048 + (int32_t)rng_below(&rng, WIDTH * PS - 2048);
    }
    const uint32_t cu = round < 8 ? units[round % 4] : units[4];
    pmla_builder_config cfg = harness_config(16, PS, B, 1, 0, cu);
    cfg.flags = PMLA_BUILDER_BATCH_INVARIANT;
    char what[64];
    snprintf(what, sizeof what, "long invariant round %d (B=%d, cu=%u)", round, B, cu);
    expect_dense_schedule(&cfg, B, qo, lens, bt, WIDTH, 1, what);
  }
  free(qo);
  free(lens);
  free(bt);
}
END_TEST

/* Builds dense case `c` (its lengths and query rows; the page indices do not
 * matter to a schedule) on a builder configured as t_numerics.c does. */
static pmla_builder *build_dense_case(const dense_case *c) {
  const int32_t B = c->batch, ps = (int32_t)c->page_size;
  int32_t qo[CASE_MAX_BATCH + 1] = {0}, max_q = 1, maxp = 1;
  for (int32_t r = 0; r < B; r++) {
    qo[r + 1] = qo[r] + c->q_lens[r];
    if (c->q_lens[r] > max_q)
      max_q = c->q_lens[r];
    int32_t pages = (c->kv_lens[r] + ps - 1) / ps;
    if (pages + 1 > maxp)
      maxp = pages + 1;
  }
  pmla_builder_config cfg = harness_config(c->heads, c->page_size, (uint32_t)(B > 0 ? B : 1),
                                           (uint32_t)max_q, 0, c->cu);
  pmla_builder *b = harness_init(&cfg);
  int32_t *bt = calloc((size_t)(B > 0 ? B : 1) * (size_t)maxp, sizeof(int32_t));
  ck_assert(bt != NULL);
  test_tensor t_qo, t_bt, t_lens;
  tt_make1(&t_qo, TT_I32, qo, B + 1);
  tt_make2(&t_bt, TT_I32, bt, B, maxp);
  tt_make1(&t_lens, TT_I32, c->kv_lens, B);
  pmla_decode_batch batch = {.struct_size = sizeof batch, .kv_layout = PMLA_KV_BLOCK_TABLE,
                             .qo_indptr = &t_qo.t, .block_table = &t_bt.t,
                             .kv_lens = &t_lens.t, .stream = harness_stream()};
  pmla_status s = g_be->build_decode(b, &batch);
  ck_assert_msg(s == PMLA_OK, "%s: build_decode returned %s: %s", c->name,
                harness_status_name(s), g_be->last_error(b));
  tt_free(&t_qo);
  tt_free(&t_bt);
  tt_free(&t_lens);
  free(bt);
  return b;
}

/* Equally long requests a few short of k a unit (k = 1: fewer requests
 * than units), each so long that the fill cannot fit k of them on a unit
 * but the deal of whole requests can (j of them short of k N, j (OH +
 * blocks) about 7.5 N): the deal is written in closed form (every load
 * equal before each round), and the schedule is still the host planner's.
 * Each of these steps is dealt. */
START_TEST(test_equal_requests_are_dealt_as_the_host_plans) {
  REQUIRE_BACKEND();
  enum { WIDTH = 496, MAXB = 300 };
  int32_t *qo = malloc(sizeof(int32_t) * (MAXB + 1)), *lens = malloc(sizeof(int32_t) * MAXB);
  int32_t *bt = calloc((size_t)MAXB * WIDTH, sizeof(int32_t));
  ck_assert(qo && lens && bt);
  static const uint32_t cus[] = {10, 33, 66};
  for (size_t ci = 0; ci < sizeof cus / sizeof cus[0]; ci++) {
    const pmla_builder_config cfg = harness_config(16, 64, MAXB, 2, 0, cus[ci]);
    pmla_builder *probe = harness_init(&cfg);
    const int32_t N = (int32_t)harness_query(probe).sched_units;
    g_be->destroy_builder(probe);
    for (int32_t k = 1; k <= 4; k++)
      for (int32_t j = 1; j <= 3; j++) {
        const int32_t B = k * N - j;
        const int32_t blocks = (15 * N + 2 * j - 1) / (2 * j) - PMLA_SPLIT_OVERHEAD;
        if (B < 1 || B > MAXB || blocks < 1 || blocks > WIDTH)
          continue;
        qo[0] = 0;
        for (int32_t r = 0; r < B; r++) {
          qo[r + 1] = qo[r] + 1 + (j == 2); /* two query rows a request when j = 2 */
          lens[r] = 64 * blocks - 17;
        }
        char what[80];
        snprintf(what, sizeof what, "%d requests of %d blocks on %d units", B, blocks, N);
        const int32_t mode = expect_dense_schedule(&cfg, B, qo, lens, bt, WIDTH, 2, what);
        ck_assert_msg(mode == PMLA_DEALT_MODE, "%s: schedule mode %d, not dealt", what, mode);
      }
  }
  free(qo);
  free(lens);
  free(bt);
}
END_TEST

/* Every dense build is uncapped (split_cap 0: filled, or dealt whole), and
 * the cases marked expect_split split a request on this plugin. */
START_TEST(test_dense_case_is_uncapped_and_splits_where_marked) {
  REQUIRE_BACKEND();
  const dense_case *c = &dense_cases[_i];
  pmla_builder *b = build_dense_case(c);
  pmla_builder_info info = harness_query(b);
  ck_assert_msg(info.split_cap == 0, "%s: dense build reports split_cap %u", c->name,
                info.split_cap);
  int32_t meta[PMLA_META_WORDS];
  ck_assert_int_eq(g_be->copy_buffer(b, PMLA_BUF_WORK_META_DATA, meta, sizeof meta), PMLA_OK);
  ck_assert_msg(meta[PMLA_META_MODE] == 0 || meta[PMLA_META_MODE] == PMLA_DEALT_MODE,
                "%s: dense schedule in mode %d (1: piece mode)", c->name, meta[PMLA_META_MODE]);
  if (c->expect_split)
    ck_assert_msg(meta[PMLA_META_NUM_REDUCE] > 0,
                  "%s: expected a split request (cu %u), schedule has none", c->name, c->cu);
  g_be->destroy_builder(b);
}
END_TEST

/* The sparse cases: split_cap is pmla_sparse_split_cap's (0 uncapped), no
 * token has more pieces; uncapped, few tokens over many units split wider
 * than the cap would allow. */
START_TEST(test_sparse_case_cap_follows_the_formula) {
  REQUIRE_BACKEND();
  const sparse_case *c = &sparse_cases[_i];
  const int32_t T = c->tokens, K = (int32_t)c->topk;
  pmla_builder_config cfg = harness_config(c->heads, c->page_size, (uint32_t)(T + 1) / 2, 2,
                                           c->topk, c->cu);
  pmla_builder *b = harness_init(&cfg);
  int32_t *idx = malloc(sizeof(int32_t) * (size_t)T * (size_t)K);
  ck_assert(idx != NULL);
  for (int64_t i = 0; i < (int64_t)T * K; i++)
    idx[i] = i % 5 == 4 ? -1 : (int32_t)(i % 113);
  test_tensor t;
  tt_make2(&t, TT_I32, idx, T, K);
  pmla_sparse_batch sb;
  memset(&sb, 0, sizeof sb);
  sb.struct_size = sizeof sb;
  sb.topk_indices = &t.t;
  sb.max_seq_len = c->max_seq_len;
  sb.flags = c->nocap ? PMLA_SPARSE_NO_SPLIT_CAP : 0;
  sb.stream = harness_stream();
  pmla_status s = g_be->build_sparse(b, &sb);
  ck_assert_msg(s == PMLA_OK, "%s: build_sparse returned %s: %s", c->name,
                harness_status_name(s), g_be->last_error(b));
  pmla_builder_info info = harness_query(b);
  int32_t want_cap =
      c->nocap ? 0 : pmla_sparse_split_cap(c->max_seq_len, c->topk, info.cu_count);
  ck_assert_msg(info.split_cap == (uint32_t)want_cap,
                "%s: split_cap %u, want min(next_pow2(max(1, min(%lld, %u) / 128)), %u) = %d",
                c->name, info.split_cap, (long long)c->max_seq_len, c->topk, info.cu_count,
                want_cap);
  int32_t meta[PMLA_META_WORDS];
  ck_assert_int_eq(g_be->copy_buffer(b, PMLA_BUF_WORK_META_DATA, meta, sizeof meta), PMLA_OK);
  if (c->nocap) /* uncapped, few tokens over many units: tokens split wider */
    ck_assert_msg(meta[PMLA_META_MAX_PIECES] > pmla_sparse_split_cap(c->max_seq_len, c->topk,
                                                                    info.cu_count),
                  "%s: uncapped schedule has only %d pieces per token", c->name,
                  meta[PMLA_META_MAX_PIECES]);
  else
    ck_assert_msg(meta[PMLA_META_MAX_PIECES] <= want_cap, "%s: a token has %d pieces > cap %d",
                  c->name, meta[PMLA_META_MAX_PIECES], want_cap);
  tt_free(&t);
  free(idx);
  g_be->destroy_builder(b);
}
END_TEST

/* The cap the query reports follows the formula for every max_seq_len. */
START_TEST(test_sparse_split_cap_through_query_follows_the_formula) {
  REQUIRE_BACKEND();
  static const uint32_t cus[] = {1, 5, 16};
  static const int64_t seqs[] = {0, 1, 127, 128, 255, 256, 300, 1000, 2047, 2048, 4096, 1 << 20};
  for (size_t ci = 0; ci < 3; ci++) {
    pmla_builder_config cfg = harness_config(16, 64, 2, 1, 2048, cus[ci]);
    pmla_builder *b = harness_init(&cfg);
    int32_t *idx = malloc(sizeof(int32_t) * 2 * 2048);
    ck_assert(idx != NULL);
    for (int i = 0; i < 2 * 2048; i++)
      idx[i] = i % 3 ? i % 1000 : -1;
    test_tensor t;
    tt_make2(&t, TT_I32, idx, 2, 2048);
    pmla_sparse_batch sb;
    memset(&sb, 0, sizeof sb);
    sb.struct_size = sizeof sb;
    sb.topk_indices = &t.t;
    sb.stream = harness_stream();
    for (size_t si = 0; si < sizeof seqs / sizeof seqs[0]; si++) {
      sb.max_seq_len = seqs[si];
      ck_assert_int_eq(g_be->build_sparse(b, &sb), PMLA_OK);
      pmla_builder_info info = harness_query(b);
      uint32_t want = (uint32_t)pmla_sparse_split_cap(seqs[si], 2048, info.cu_count);
      ck_assert_msg(info.split_cap == want, "cu %u max_seq_len %lld: split_cap %u want %u",
                    info.cu_count, (long long)seqs[si], info.split_cap, want);
    }
    tt_free(&t);
    free(idx);
    g_be->destroy_builder(b);
  }
}
END_TEST

Suite *suite_plan_exact(void) {
  Suite *s = suite_create("plan_exact");
  TCase *tc = tcase_create("this plugin's planner");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_schedule_equals_host_planner);
  tcase_add_test(tc, test_invariant_schedule_equals_host_planner_when_the_budget_binds);
  tcase_add_test(tc, test_equal_requests_are_dealt_as_the_host_plans);
  tcase_add_loop_test(tc, test_dense_case_is_uncapped_and_splits_where_marked, 0, n_dense_cases);
  tcase_add_loop_test(tc, test_sparse_case_cap_follows_the_formula, 0, n_sparse_cases);
  tcase_add_test(tc, test_sparse_split_cap_through_query_follows_the_formula);
  suite_add_tcase(s, tc);
  return s;
}
