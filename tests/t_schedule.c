/* SPDX-License-Identifier: MIT */
/* t_schedule.c - the schedule a build leaves in the builder's buffers, read
 * through copy_buffer and held to what pmla.h documents (schedule.h lists
 * every check), over random and edge-case dense and sparse steps. Only the
 * layout is asserted, never one planner's choices: how many pieces a
 * request gets and on which unit is the plugin's business. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "schedule.h"

#define WIDTH 48 /* pages of the longest random request */

/* A dense step on the host: lengths, query rows, layout. */
typedef struct dense_step {
  int32_t batch, page_size, csr;
  int32_t *qo, *lens;
} dense_step;

/* Uploads `d` in its layout, builds it on `b` and checks the schedule.
 * Returns what the schedule held. */
static sched_summary build_and_check_dense(pmla_builder *b, const dense_step *d,
                                          const char *what) {
  const int32_t B = d->batch, ps = d->page_size;
  int32_t width = 1; /* block-table pages per request: the longest request's */
  for (int32_t r = 0; r < B; r++)
    if ((d->lens[r] + ps - 1) / ps > width)
      width = (d->lens[r] + ps - 1) / ps;
  int32_t *bt = calloc((size_t)(B > 0 ? B : 1) * (size_t)width, sizeof(int32_t));
  int32_t *kvp = calloc((size_t)B + 1, sizeof(int32_t)), *last = calloc((size_t)B + 1, sizeof(int32_t));
  ck_assert(bt && kvp && last);
  for (int32_t r = 0; r < B; r++) {
    int32_t pages = (d->lens[r] + ps - 1) / ps;
    kvp[r + 1] = kvp[r] + pages;
    last[r] = pages ? d->lens[r] - (pages - 1) * ps : 0;
  }
  int32_t *kvi = calloc((size_t)kvp[B] + 1, sizeof(int32_t));
  ck_assert(kvi != NULL);
  harness_dense_step ds;
  harness_dense_step_make(&ds, d->csr ? PMLA_KV_CSR : PMLA_KV_BLOCK_TABLE, B, d->qo, d->lens, bt,
                          width, kvp, kvi, last);
  pmla_status s = g_be->build_decode(b, &ds.batch);
  ck_assert_msg(s == PMLA_OK, "%s: build_decode returned %s: %s", what, harness_status_name(s),
                g_be->last_error(b));
  sched_step step = {B, d->qo, d->lens, 0};
  sched_summary sum = sched_check(b, &step, what);
  harness_dense_step_free(&ds);
  free(bt);
  free(kvp);
  free(last);
  free(kvi);
  return sum;
}

/* Builds a sparse step of `tokens` x topk (contents irrelevant to the
 * schedule: a few valid slots and holes) and checks the schedule. */
static sched_summary build_and_check_sparse(pmla_builder *b, int32_t tokens, int32_t topk,
                                            int64_t max_seq_len, uint32_t flags,
                                            const char *what) {
  int32_t *idx = malloc(sizeof(int32_t) * (size_t)(tokens > 0 ? tokens : 1) * (size_t)topk);
  ck_assert(idx != NULL);
  for (int64_t i = 0; i < (int64_t)tokens * topk; i++)
    idx[i] = i % 7 == 3 ? -1 : (int32_t)(i % 97);
  test_tensor t;
  tt_make2(&t, TT_I32, idx, tokens, topk);
  pmla_sparse_batch sb;
  memset(&sb, 0, sizeof sb);
  sb.struct_size = sizeof sb;
  sb.flags = flags;
  sb.topk_indices = &t.t;
  sb.max_seq_len = max_seq_len;
  sb.stream = harness_stream();
  pmla_status s = g_be->build_sparse(b, &sb);
  ck_assert_msg(s == PMLA_OK, "%s: build_sparse returned %s: %s", what, harness_status_name(s),
                g_be->last_error(b));
  sched_step step = {tokens, NULL, NULL, topk};
  sched_summary sum = sched_check(b, &step, what);
  if (flags & PMLA_SPARSE_NO_SPLIT_CAP)
    ck_assert_msg(sum.split_cap == 0, "%s: PMLA_SPARSE_NO_SPLIT_CAP build reports split_cap %u",
                  what, sum.split_cap);
  tt_free(&t);
  free(idx);
  return sum;
}

static int32_t random_len(uint64_t *rng, int32_t max_len) {
  uint32_t k = rng_below(rng, 10);
  if (k == 0)
    return 0;
  if (k < 4) {
    int32_t short_len = 1 + (int32_t)rng_below(rng, 130);
    return short_len < max_len ? short_len : max_len;
  }
  return (int32_t)rng_below(rng, (uint32_t)max_len + 1);
}

/* Random dense steps: batch 0..64, q_len 0..max_q_len per request, lengths
 * 0..WIDTH pages (some empty, some one page), page sizes 1..256, both
 * layouts, CU counts 1..64 or all, heads 16..128. */
START_TEST(test_schedule_of_random_dense_steps_keeps_the_documented_layout) {
  REQUIRE_BACKEND();
  uint64_t rng = harness_seed() ^ 0x5c4ed;
  int64_t splits = 0, builds = 0;
  for (int round = 0; round < 60; round++) {
    static const uint32_t heads[] = {16, 32, 64, 128};
    const uint32_t H = heads[rng_below(&rng, 4)], ps = 1u << rng_below(&rng, 9);
    const uint32_t max_q = 1 + rng_below(&rng, H == 128 ? 2 : 4);
    const uint32_t cu = rng_below(&rng, 4) == 0 ? 0 : 1 + rng_below(&rng, 64);
    const uint32_t max_b = 1 + rng_below(&rng, 64);
    pmla_builder_config cfg = harness_config(H, ps, max_b, max_q, 0, cu);
    pmla_builder *b = harness_init(&cfg);
    /* several steps per builder: each build's schedule is its own */
    for (int step = 0; step < 4; step++) {
      dense_step d;
      memset(&d, 0, sizeof d);
      d.batch = (int32_t)rng_below(&rng, max_b + 1);
      d.page_size = (int32_t)ps;
      d.csr = (int)rng_below(&rng, 2);
      d.qo = calloc((size_t)d.batch + 1, sizeof(int32_t));
      d.lens = calloc((size_t)d.batch + 1, sizeof(int32_t));
      ck_assert(d.qo && d.lens);
      for (int32_t r = 0; r < d.batch; r++) {
        d.qo[r + 1] = d.qo[r] + (int32_t)rng_below(&rng, max_q + 1);
        d.lens[r] = random_len(&rng, WIDTH * (int32_t)ps);
      }
      char what[160];
      snprintf(what, sizeof what, "dense round %d step %d (heads %u page %u batch %d %s cu %u)",
               round, step, H, ps, d.batch, d.csr ? "CSR" : "block table", cu);
      sched_summary s = build_and_check_dense(b, &d, what);
      splits += s.split_requests;
      builds++;
      free(d.qo);
      free(d.lens);
    }
    g_be->destroy_builder(b);
  }
  printf("schedule: %lld dense builds checked, %lld split requests among them\n",
         (long long)builds, (long long)splits);
  fflush(stdout);
}
END_TEST

/* Random sparse steps: tokens 1..R, topk 1..2048, max_seq_len 0..2^20,
 * capped and uncapped (PMLA_SPARSE_NO_SPLIT_CAP), CU counts 1..64 or all. */
START_TEST(test_schedule_of_random_sparse_steps_keeps_the_documented_layout) {
  REQUIRE_BACKEND();
  uint64_t rng = harness_seed() ^ 0x5ba75e;
  int64_t splits = 0, builds = 0;
  for (int round = 0; round < 40; round++) {
    static const uint32_t topks[] = {1, 64, 512, 2048};
    const uint32_t topk = rng_below(&rng, 3) ? topks[rng_below(&rng, 4)] : 1 + rng_below(&rng, 2048);
    const uint32_t max_q = 1 + rng_below(&rng, 2), max_b = 1 + rng_below(&rng, 32);
    const uint32_t cu = rng_below(&rng, 4) == 0 ? 0 : 1 + rng_below(&rng, 64);
    pmla_builder_config cfg = harness_config(rng_below(&rng, 2) ? 16 : 128, 64, max_b, max_q,
                                             topk, cu);
    pmla_builder *b = harness_init(&cfg);
    for (int step = 0; step < 3; step++) {
      const int32_t tokens = 1 + (int32_t)rng_below(&rng, max_b * max_q);
      const int64_t seq = rng_below(&rng, 2) ? (int64_t)rng_below(&rng, 4096)
                                             : (int64_t)rng_below(&rng, 1u << 20);
      const uint32_t flags = rng_below(&rng, 3) == 0 ? PMLA_SPARSE_NO_SPLIT_CAP : 0;
      char what[160];
      snprintf(what, sizeof what, "sparse round %d step %d (tokens %d topk %u max_seq_len %lld%s cu %u)",
               round, step, tokens, topk, (long long)seq, flags ? " uncapped" : "", cu);
      sched_summary s = build_and_check_sparse(b, tokens, (int32_t)topk, seq, flags, what);
      splits += s.split_requests;
      builds++;
    }
    g_be->destroy_builder(b);
  }
  printf("schedule: %lld sparse builds checked, %lld split tokens among them\n",
         (long long)builds, (long long)splits);
  fflush(stdout);
}
END_TEST

/* Batch 0 has nothing to schedule: no items, no reduce, no partials. */
START_TEST(test_schedule_of_batch_zero_is_empty) {
  REQUIRE_BACKEND();
  pmla_builder_config cfg = harness_config(16, 16, 4, 2, 0, 3);
  pmla_builder *b = harness_init(&cfg);
  int32_t qo[1] = {0}, lens[1] = {0};
  for (int csr = 0; csr < 2; csr++) {
    dense_step d = {0, 16, csr, qo, lens};
    sched_summary s = build_and_check_dense(b, &d, csr ? "batch 0, CSR" : "batch 0");
    ck_assert_msg(s.items == 0 && s.reduces == 0 && s.partials == 0,
                  "batch 0: %d items, %d reduce entries, %d partials", s.items, s.reduces,
                  s.partials);
  }
  g_be->destroy_builder(b);
}
END_TEST

/* Empty requests, zero-row requests and one-token requests side by side:
 * each non-empty KV range still covered exactly once. */
START_TEST(test_schedule_covers_empty_and_tiny_requests) {
  REQUIRE_BACKEND();
  static const int32_t qlen[8] = {1, 0, 2, 4, 0, 1, 3, 1};
  static const int32_t lens[8] = {0, 0, 1, 0, 5, 64, 0, 65};
  pmla_builder_config cfg = harness_config(32, 1, 8, 4, 0, 5);
  pmla_builder *b = harness_init(&cfg);
  int32_t qo[9] = {0}, l[8];
  for (int r = 0; r < 8; r++) {
    qo[r + 1] = qo[r] + qlen[r];
    l[r] = lens[r];
  }
  for (int csr = 0; csr < 2; csr++) {
    dense_step d = {8, 1, csr, qo, l};
    build_and_check_dense(b, &d, csr ? "empty and tiny requests, CSR" : "empty and tiny requests");
  }
  for (int r = 0; r < 8; r++)
    l[r] = 0;
  dense_step all_empty = {8, 1, 0, qo, l};
  build_and_check_dense(b, &all_empty, "all requests empty");
  g_be->destroy_builder(b);
}
END_TEST

/* Long requests on many units (the shapes that invite splitting: few
 * requests, 1..300 units): whatever the plugin splits, every piece is
 * accounted for by the partial slots and reduce maps. */
START_TEST(test_schedule_of_long_requests_accounts_for_every_piece) {
  REQUIRE_BACKEND();
  static const uint32_t cus[] = {1, 2, 7, 16, 64, 132, 300};
  static const int32_t batches[] = {1, 2, 5};
  int64_t splits = 0;
  for (size_t c = 0; c < sizeof cus / sizeof cus[0]; c++)
    for (size_t k = 0; k < sizeof batches / sizeof batches[0]; k++) {
      const int32_t B = batches[k], ps = 256;
      pmla_builder_config cfg = harness_config(16, (uint32_t)ps, (uint32_t)B, 2, 0, cus[c]);
      pmla_builder *b = harness_init(&cfg);
      int32_t qo[6] = {0}, lens[5];
      for (int32_t r = 0; r < B; r++) {
        qo[r + 1] = qo[r] + 1 + r % 2;
        lens[r] = WIDTH * ps - r * 1001; /* 12288 tokens and a little less */
      }
      char what[96];
      snprintf(what, sizeof what, "%d long requests, cu %u", B, cus[c]);
      dense_step d = {B, ps, (int32_t)(c % 2), qo, lens};
      splits += build_and_check_dense(b, &d, what).split_requests;
      g_be->destroy_builder(b);
    }
  printf("schedule: long requests: %lld split requests checked\n", (long long)splits);
  fflush(stdout);
}
END_TEST

/* For every max_seq_len, the split cap the query reports after build_sparse
 * bounds each token's pieces (and the schedule keeps its layout). */
START_TEST(test_sparse_schedule_honours_the_reported_split_cap) {
  REQUIRE_BACKEND();
  static const uint32_t cus[] = {1, 5, 16, 64};
  static const int64_t seqs[] = {0, 1, 127, 128, 255, 256, 300, 1000, 2047, 2048, 4096, 1 << 20};
  for (size_t ci = 0; ci < sizeof cus / sizeof cus[0]; ci++) {
    pmla_builder_config cfg = harness_config(16, 64, 2, 1, 2048, cus[ci]);
    pmla_builder *b = harness_init(&cfg);
    for (size_t si = 0; si < sizeof seqs / sizeof seqs[0]; si++) {
      char what[96];
      snprintf(what, sizeof what, "cu %u, 2 tokens, topk 2048, max_seq_len %lld", cus[ci],
               (long long)seqs[si]);
      build_and_check_sparse(b, 2, 2048, seqs[si], 0, what);
    }
    g_be->destroy_builder(b);
  }
}
END_TEST

/* Each build's schedule describes its own step only: after a step of 32
 * long requests, a step of 2 must not keep any of the earlier items, reduce
 * entries or partials (sched_check bounds every request index by 2). */
START_TEST(test_schedule_after_a_larger_step_describes_only_the_new_one) {
  REQUIRE_BACKEND();
  pmla_builder_config cfg = harness_config(16, 16, 32, 2, 64, 9);
  pmla_builder *b = harness_init(&cfg);
  int32_t qo[33], lens[32];
  qo[0] = 0;
  for (int32_t r = 0; r < 32; r++) {
    qo[r + 1] = qo[r] + 2;
    lens[r] = 700 + 13 * r;
  }
  dense_step big = {32, 16, 0, qo, lens};
  build_and_check_dense(b, &big, "32 requests");
  int32_t qo2[3] = {0, 1, 2}, lens2[2] = {5, 0};
  dense_step small = {2, 16, 1, qo2, lens2};
  build_and_check_dense(b, &small, "2 requests after 32");
  build_and_check_sparse(b, 3, 64, 64, 0, "3 sparse tokens after 2 requests");
  build_and_check_dense(b, &big, "32 requests after a sparse step");
  g_be->destroy_builder(b);
}
END_TEST

Suite *suite_schedule(void) {
  Suite *s = suite_create("schedule");
  TCase *tc = tcase_create("layout");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_schedule_of_random_dense_steps_keeps_the_documented_layout);
  tcase_add_test(tc, test_schedule_of_random_sparse_steps_keeps_the_documented_layout);
  tcase_add_test(tc, test_schedule_of_batch_zero_is_empty);
  tcase_add_test(tc, test_schedule_covers_empty_and_tiny_requests);
  tcase_add_test(tc, test_schedule_of_long_requests_accounts_for_every_piece);
  tcase_add_test(tc, test_sparse_schedule_honours_the_reported_split_cap);
  tcase_add_test(tc, test_schedule_after_a_larger_step_describes_only_the_new_one);
  suite_add_tcase(s, tc);
  return s;
}
