/* SPDX-License-Identifier: MIT */
/* t_threads.c - "builders are independent: many may live in one process and
 * be used from many threads at once". Each thread owns a builder, its own
 * tensors and its own stream (on a GPU a non-blocking one, so the threads'
 * kernels may run at the same time); run concurrently, every decode must
 * give bit-for-bit what the same builder gave when run alone. */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "reference.h"

#define NTHREADS 4
#define ROUNDS 25
#define TOKENS 3
#define TOPK 256
#define PAGES 32
#define PS 16

typedef struct worker {
  pmla_builder *b;
  void *stream;
  uint32_t heads;
  test_tensor idx, q, kv, out, lse;
  pmla_sparse_batch sb;
  pmla_decode_args args;
  uint16_t *expect, *got;
  size_t n_out;
  int mismatches;
  pmla_status first_error;
} worker;

static void worker_setup(worker *w, int id) {
  memset(w, 0, sizeof *w);
  uint64_t rng = harness_seed() + 1000u * (uint64_t)id;
  w->heads = id % 2 ? 32 : 16;
  pmla_builder_config c = harness_config(w->heads, PS, TOKENS, 1, TOPK, 1 + (uint32_t)id % 3);
  w->b = harness_init(&c);
  ck_assert_int_eq(g_mem->stream_new(&w->stream), 0);
  int32_t idx[TOKENS * TOPK];
  for (int i = 0; i < TOKENS * TOPK; i++)
    idx[i] = rng_below(&rng, 10) == 0 ? -1 : (int32_t)rng_below(&rng, PAGES * PS);
  size_t nq = (size_t)TOKENS * w->heads * 576, nkv = (size_t)PAGES * PS * 576;
  uint16_t *q = malloc(nq * 2), *kv = malloc(nkv * 2);
  ck_assert(q && kv);
  for (size_t i = 0; i < nq; i++)
    q[i] = ref_float_to_bf16((float)(rng_uniform(&rng) * 4 - 2));
  for (size_t i = 0; i < nkv; i++)
    kv[i] = ref_float_to_bf16((float)(rng_uniform(&rng) * 2 - 1));
  tt_make2(&w->idx, TT_I32, idx, TOKENS, TOPK);
  tt_make3(&w->q, TT_BF16, q, TOKENS, w->heads, 576);
  tt_make3(&w->kv, TT_BF16, kv, PAGES, PS, 576);
  tt_make3(&w->out, TT_BF16, NULL, TOKENS, w->heads, 512);
  tt_make2(&w->lse, TT_F32, NULL, TOKENS, w->heads);
  free(q);
  free(kv);
  w->sb.struct_size = sizeof w->sb;
  w->sb.topk_indices = &w->idx.t;
  w->sb.max_seq_len = 1000 * (id + 1);
  w->sb.stream = w->stream;
  w->args.struct_size = sizeof w->args;
  w->args.q = &w->q.t;
  w->args.kv_cache = &w->kv.t;
  w->args.out = &w->out.t;
  w->args.lse = &w->lse.t;
  w->args.stream = w->stream;
  w->n_out = (size_t)TOKENS * w->heads * 512;
  w->expect = malloc(w->n_out * 2);
  w->got = malloc(w->n_out * 2);
  ck_assert(w->expect && w->got);
  /* alone */
  ck_assert_int_eq(g_be->build_sparse(w->b, &w->sb), PMLA_OK);
  ck_assert_int_eq(g_be->decode(w->b, &w->args), PMLA_OK);
  ck_assert_int_eq(g_mem->stream_sync(w->stream), 0);
  tt_download(&w->out, w->expect);
}

static void *worker_run(void *arg) {
  worker *w = arg;
  for (int r = 0; r < ROUNDS; r++) {
    pmla_status s = g_be->build_sparse(w->b, &w->sb);
    if (s == PMLA_OK)
      s = g_be->decode(w->b, &w->args);
    if (s != PMLA_OK) {
      w->first_error = s;
      return NULL;
    }
    /* plain copies: no Check calls off the main thread */
    if (g_mem->stream_sync(w->stream) != 0 ||
        g_mem->download(w->got, w->out.t.data, w->n_out * 2) != 0 ||
        memcmp(w->got, w->expect, w->n_out * 2) != 0)
      w->mismatches++;
  }
  return NULL;
}

static void worker_free(worker *w) {
  g_be->destroy_builder(w->b);
  g_mem->stream_free(w->stream);
  tt_free(&w->idx);
  tt_free(&w->q);
  tt_free(&w->kv);
  tt_free(&w->out);
  tt_free(&w->lse);
  free(w->expect);
  free(w->got);
}

START_TEST(test_builders_run_concurrently_on_threads) {
  REQUIRE_BACKEND();
  worker w[NTHREADS];
  pthread_t th[NTHREADS];
  for (int i = 0; i < NTHREADS; i++)
    worker_setup(&w[i], i);
  for (int i = 0; i < NTHREADS; i++)
    ck_assert_int_eq(pthread_create(&th[i], NULL, worker_run, &w[i]), 0);
  for (int i = 0; i < NTHREADS; i++)
    pthread_join(th[i], NULL);
  for (int i = 0; i < NTHREADS; i++) {
    ck_assert_msg(w[i].first_error == PMLA_OK, "thread %d: %s", i,
                  harness_status_name(w[i].first_error));
    ck_assert_msg(w[i].mismatches == 0,
                  "thread %d: %d of %d concurrent decodes differ from the same builder alone", i,
                  w[i].mismatches, ROUNDS);
  }
  for (int i = 0; i < NTHREADS; i++)
    worker_free(&w[i]);
}
END_TEST

/* the step of w decoded and compared with the parent's bits: 1 when equal */
static int32_t decode_in_child(void *arg) {
  worker *w = arg;
  const int32_t same = g_be->build_sparse(w->b, &w->sb) == PMLA_OK &&
                       g_be->decode(w->b, &w->args) == PMLA_OK &&
                       g_mem->download(w->got, w->out.t.data, w->n_out * 2) == 0 &&
                       memcmp(w->got, w->expect, w->n_out * 2) == 0;
  g_be->destroy_builder(w->b);
  return same;
}

/* A pmla-cpu builder made before fork() decodes in the child, whose process
 * has none of the builder's worker threads, and gives the bits it gives in
 * the parent; the child's destroy_builder returns. (A GPU runtime does not
 * survive fork.) */
START_TEST(test_a_cpu_builder_decodes_in_a_forked_child) {
  REQUIRE_BACKEND();
  if (strcmp(g_backend_name, "pmla-cpu") != 0) {
    harness_print_skip(__func__, "GPU runtimes are not usable after fork");
    return;
  }
  worker w;
  worker_setup(&w, 2); /* 3 units: 3 worker threads */
  /* a decode waiting for the parent's threads ends at the child's alarm */
  ck_assert_msg(harness_in_child(decode_in_child, &w, "the child's decode") == 1,
                "the child's decode differs from the parent's");
  /* the parent's builder and threads are untouched */
  ck_assert_int_eq(g_be->decode(w.b, &w.args), PMLA_OK);
  tt_download(&w.out, w.got);
  ck_assert(memcmp(w.got, w.expect, w.n_out * 2) == 0);
  worker_free(&w);
}
END_TEST

/* One builder shared by two threads, which pmla.h leaves to the host to
 * prevent: each thread's own out and lse, the step built and decoded until
 * SHARED_SERVED calls were served (a refused call returns at once, so a
 * thread may see many refusals while the other holds the builder). */
#define SHARED_SERVED 200
#define SHARED_TRIES 10000000
typedef struct sharer {
  worker *w;
  test_tensor out, lse;
  int served, refused, other, mismatches;
} sharer;

static void *share_run(void *arg) {
  sharer *s = arg;
  pmla_decode_args a = s->w->args;
  a.out = &s->out.t;
  a.lse = &s->lse.t;
  for (int r = 0; r < SHARED_TRIES && s->served < SHARED_SERVED; r++) {
    pmla_status st = g_be->build_sparse(s->w->b, &s->w->sb);
    if (st == PMLA_OK)
      st = g_be->decode(s->w->b, &a);
    if (st == PMLA_OK) {
      s->served++;
      /* plain copies: no Check calls off the main thread */
      if (memcmp(s->out.t.data, s->w->expect, s->w->n_out * 2) != 0)
        s->mismatches++;
    } else if (st == PMLA_ERR_BAD_STATE &&
               strstr(g_be->last_error(s->w->b), "another thread is inside a call")) {
      s->refused++;
      sched_yield(); /* let the other thread's call end */
    } else {
      s->other++;
    }
  }
  return NULL;
}

/* in a child (made there, the builder's worker threads are the child's):
 * 1 + the calls refused when every call was served with the bits of the
 * builder alone or refused as overlapping another, else 0 */
static int32_t share_one_builder(void *unused) {
  (void)unused;
  worker w;
  worker_setup(&w, 2); /* 3 units: 3 worker threads */
  sharer s[2];
  pthread_t th[2];
  for (int i = 0; i < 2; i++) {
    memset(&s[i], 0, sizeof s[i]);
    s[i].w = &w;
    tt_make3(&s[i].out, TT_BF16, NULL, TOKENS, w.heads, 512);
    tt_make2(&s[i].lse, TT_F32, NULL, TOKENS, w.heads);
  }
  for (int i = 0; i < 2; i++)
    if (pthread_create(&th[i], NULL, share_run, &s[i]) != 0)
      return 0;
  for (int i = 0; i < 2; i++)
    pthread_join(th[i], NULL);
  int32_t refused = 0, ok = 1;
  for (int i = 0; i < 2; i++) {
    refused += s[i].refused;
    ok = ok && s[i].other == 0 && s[i].mismatches == 0 && s[i].served == SHARED_SERVED;
    tt_free(&s[i].out);
    tt_free(&s[i].lse);
  }
  worker_free(&w);
  return ok ? 1 + refused : 0;
}

/* Calls that overlap on one builder are refused (PMLA_ERR_BAD_STATE, the
 * message on the refused thread), never run beside each other: pmla-cpu's
 * workers hung on two overlapping decodes. The child's alarm ends a hang. */
START_TEST(test_overlapping_calls_on_one_builder_are_refused) {
  REQUIRE_BACKEND();
  if (strcmp(g_backend_name, "pmla-cpu") != 0) {
    harness_print_skip(__func__, "GPU runtimes are not usable after fork");
    return;
  }
  const int32_t r = harness_in_child(share_one_builder, NULL, "two threads on one builder");
  ck_assert_msg(r >= 1, "a call on a shared builder was neither served with the bits of the "
                        "builder alone nor refused as overlapping");
  printf("  two threads on one builder: %d served, %d refused as overlapping\n",
         2 * SHARED_SERVED, (int)r - 1);
}
END_TEST

/* A call through another backend (refused) beside a failing call of the
 * builder's own on another thread: each thread reads its own refusal from
 * last_error(builder), never the other's (the refusal through the wrong
 * backend once wrote into the builder its owner was writing). */
#define CROSS_CALLS 20000
typedef struct crosser {
  worker *w;
  const pmla_backend *other;
  int mixed;
} crosser;

static void *cross_own(void *arg) {
  crosser *c = arg;
  pmla_decode_args a = c->w->args;
  DLTensor q = *a.q;
  q.byte_offset = 1; /* bf16 at an odd address: refused, naming args->q */
  a.q = &q;
  for (int i = 0; i < CROSS_CALLS; i++)
    if (g_be->decode(c->w->b, &a) != PMLA_ERR_INVALID_ARGUMENT ||
        !strstr(g_be->last_error(c->w->b), "args->q"))
      c->mixed++;
  return NULL;
}

static void *cross_other(void *arg) {
  crosser *c = arg;
  pmla_builder_info info;
  for (int i = 0; i < CROSS_CALLS; i++) {
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    if (c->other->query_builder(c->w->b, &info) != PMLA_ERR_INVALID_ARGUMENT ||
        !strstr(c->other->last_error(c->w->b), "made by backend"))
      c->mixed++;
  }
  return NULL;
}

/* in a child: 1 when neither thread ever read the other's message */
static int32_t cross_backends(void *other) {
  worker w;
  worker_setup(&w, 0);
  if (g_be->build_sparse(w.b, &w.sb) != PMLA_OK)
    return 0;
  crosser c[2] = {{&w, other, 0}, {&w, other, 0}};
  pthread_t th[2];
  if (pthread_create(&th[0], NULL, cross_own, &c[0]) != 0 ||
      pthread_create(&th[1], NULL, cross_other, &c[1]) != 0)
    return 0;
  pthread_join(th[0], NULL);
  pthread_join(th[1], NULL);
  worker_free(&w);
  return 1 + c[0].mixed + c[1].mixed;
}

START_TEST(test_a_call_through_another_backend_leaves_the_owners_message_alone) {
  REQUIRE_BACKEND();
  const pmla_backend *other = NULL;
  for (size_t i = 0; i < pmla_registry_count(g_registry) && !other; i++)
    if (pmla_registry_backend(g_registry, i) != g_be)
      other = pmla_registry_backend(g_registry, i);
  if (strcmp(g_backend_name, "pmla-cpu") != 0 || !other) {
    harness_print_skip(__func__, other ? "GPU runtimes are not usable after fork"
                                       : "the plugin has one backend");
    return;
  }
  const int32_t r = harness_in_child(cross_backends, (void *)other,
                                     "a builder's own backend and another on two threads");
  ck_assert_msg(r == 1, "%d of %d calls on two threads returned another status or read the "
                "other thread's message", (int)r - 1, 2 * CROSS_CALLS);
}
END_TEST

Suite *suite_threads(void) {
  Suite *s = suite_create("threads");
  TCase *tc = tcase_create("independent builders");
  tcase_add_test(tc, test_builders_run_concurrently_on_threads);
  tcase_add_test(tc, test_a_cpu_builder_decodes_in_a_forked_child);
  tcase_add_test(tc, test_overlapping_calls_on_one_builder_are_refused);
  tcase_add_test(tc, test_a_call_through_another_backend_leaves_the_owners_message_alone);
  suite_add_tcase(s, tc);
  return s;
}
