/* t_gpu.c - what only a GPU backend promises: build + decode captured in one
 * graph replay exactly like eager calls (also after the host rewrites the
 * lengths or top-k lists in place), steps allocate no device memory, and the
 * device's parallel planner writes the host planner's schedule exactly.
 * On a host-memory backend these skip with the reason. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "planner.h"

#define HEADS 16
#define PAGE 16
#define BATCH 6
#define MAXP 24 /* pages per request in the block table */
#define TOPK 256

static int require_graphs(const char *test) {
  if (harness_skip_reason()) {
    harness_print_skip(test, harness_skip_reason());
    return 0;
  }
  if (!g_mem->capture_begin) {
    harness_print_skip(test, "the backend's tensors live in host memory: no graphs");
    return 0;
  }
  return 1;
}

typedef struct step {
  pmla_builder *b;
  test_tensor qo, bt, lens, topk, q, kv, out, lse;
  pmla_decode_batch dense;
  pmla_sparse_batch sparse;
  pmla_decode_args args;
  int32_t num_pages, tokens;
} step;

static uint16_t bf16_of(uint64_t *rng) {
  float f = (float)rng_uniform(rng) * 2.f - 1.f;
  uint32_t bits;
  memcpy(&bits, &f, 4);
  return (uint16_t)(bits >> 16);
}

/* Random lengths (some 0, some splitting), every slot filled (no NaN: this
 * suite compares graph against eager bit for bit, the numerics suite owns
 * the reference). */
static void make_step(step *s, int sparse, uint64_t *rng) {
  memset(s, 0, sizeof *s);
  s->tokens = BATCH;
  s->num_pages = BATCH * MAXP;
  pmla_builder_config cfg = harness_config(HEADS, PAGE, BATCH, 1, sparse ? TOPK : 0, 0);
  s->b = harness_init(&cfg);
  int32_t qo[BATCH + 1], bt[BATCH * MAXP], lens[BATCH], *topk = malloc(sizeof(int32_t) * BATCH * TOPK);
  for (int32_t r = 0; r <= BATCH; r++)
    qo[r] = r;
  for (int32_t i = 0; i < BATCH * MAXP; i++)
    bt[i] = (i * 7 + 3) % s->num_pages; /* a permutation: 7 is coprime to 144 */
  for (int32_t r = 0; r < BATCH; r++)
    lens[r] = (int32_t)rng_below(rng, MAXP * PAGE + 1);
  for (int32_t i = 0; i < BATCH * TOPK; i++)
    topk[i] = rng_below(rng, 8) == 0 ? -1 : (int32_t)rng_below(rng, (uint32_t)(s->num_pages * PAGE));
  size_t nkv = (size_t)s->num_pages * PAGE * 576, nq = (size_t)s->tokens * HEADS * 576;
  uint16_t *kv = malloc(nkv * 2), *q = malloc(nq * 2);
  ck_assert(kv && q && topk);
  for (size_t i = 0; i < nkv; i++)
    kv[i] = bf16_of(rng);
  for (size_t i = 0; i < nq; i++)
    q[i] = bf16_of(rng);
  tt_make1(&s->qo, TT_I32, qo, BATCH + 1);
  tt_make2(&s->bt, TT_I32, bt, BATCH, MAXP);
  tt_make1(&s->lens, TT_I32, lens, BATCH);
  tt_make2(&s->topk, TT_I32, topk, BATCH, TOPK);
  tt_make3(&s->q, TT_BF16, q, s->tokens, HEADS, 576);
  tt_make3(&s->kv, TT_BF16, kv, s->num_pages, PAGE, 576);
  tt_make3(&s->out, TT_BF16, NULL, s->tokens, HEADS, 512);
  tt_make2(&s->lse, TT_F32, NULL, s->tokens, HEADS);
  free(kv);
  free(q);
  free(topk);
  s->dense = (pmla_decode_batch){.struct_size = sizeof s->dense,
                                 .kv_layout = PMLA_KV_BLOCK_TABLE,
                                 .qo_indptr = &s->qo.t,
                                 .block_table = &s->bt.t,
                                 .kv_lens = &s->lens.t,
                                 .stream = harness_stream()};
  s->sparse = (pmla_sparse_batch){.struct_size = sizeof s->sparse,
                                  .topk_indices = &s->topk.t,
                                  .max_seq_len = MAXP * PAGE,
                                  .stream = harness_stream()};
  s->args = (pmla_decode_args){.struct_size = sizeof s->args,
                               .q = &s->q.t,
                               .kv_cache = &s->kv.t,
                               .out = &s->out.t,
                               .lse = &s->lse.t,
                               .stream = harness_stream()};
}

static void free_step(step *s) {
  test_tensor *all[] = {&s->qo, &s->bt, &s->lens, &s->topk, &s->q, &s->kv, &s->out, &s->lse};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    tt_free(all[i]);
  g_be->destroy_builder(s->b);
}

static void run_step(step *s, int sparse) {
  pmla_status st = sparse ? g_be->build_sparse(s->b, &s->sparse) : g_be->build_decode(s->b, &s->dense);
  ck_assert_msg(st == PMLA_OK, "build: %s: %s", harness_status_name(st), g_be->last_error(s->b));
  st = g_be->decode(s->b, &s->args);
  ck_assert_msg(st == PMLA_OK, "decode: %s: %s", harness_status_name(st), g_be->last_error(s->b));
}

/* Output and lse after the last run, poisoning them first so stale data
 * cannot pass for a result. */
static void read_result(step *s, uint16_t *out, float *lse) {
  tt_download(&s->out, out);
  tt_download(&s->lse, lse);
}

static void poison_outputs(step *s) {
  ck_assert_int_eq(g_mem->fill(s->out.t.data, 0xff, s->out.bytes), 0);
  ck_assert_int_eq(g_mem->fill(s->lse.t.data, 0xff, s->lse.bytes), 0);
}

static void graph_matches_eager(int sparse) {
  uint64_t rng = harness_seed() ^ (sparse ? 0x5a5a : 0xa5a5);
  step s;
  make_step(&s, sparse, &rng);
  size_t n_out = s.out.bytes / 2, n_lse = s.lse.bytes / 4;
  uint16_t *o_graph = malloc(n_out * 2), *o_eager = malloc(n_out * 2);
  float *l_graph = malloc(n_lse * 4), *l_eager = malloc(n_lse * 4);
  ck_assert(o_graph && o_eager && l_graph && l_eager);

  ck_assert_int_eq(g_mem->capture_begin(), 0);
  run_step(&s, sparse);
  ck_assert_msg(g_mem->capture_end() == 0, "graph capture of build + decode failed");

  for (int round = 0; round < 3; round++) {
    if (round > 0) { /* the host rewrites the step's inputs in place */
      int32_t lens[BATCH], *topk = malloc(sizeof(int32_t) * BATCH * TOPK);
      for (int32_t r = 0; r < BATCH; r++)
        lens[r] = (int32_t)rng_below(&rng, MAXP * PAGE + 1);
      for (int32_t i = 0; i < BATCH * TOPK; i++)
        topk[i] = (int32_t)rng_below(&rng, (uint32_t)(s.num_pages * PAGE));
      tt_upload(&s.lens, lens);
      tt_upload(&s.topk, topk);
      free(topk);
    }
    poison_outputs(&s);
    ck_assert_int_eq(g_mem->replay(), 0);
    read_result(&s, o_graph, l_graph);
    poison_outputs(&s);
    run_step(&s, sparse);
    read_result(&s, o_eager, l_eager);
    ck_assert_msg(memcmp(o_graph, o_eager, n_out * 2) == 0,
                  "%s round %d: graph replay output differs from eager", sparse ? "sparse" : "dense",
                  round);
    ck_assert_msg(memcmp(l_graph, l_eager, n_lse * 4) == 0,
                  "%s round %d: graph replay lse differs from eager", sparse ? "sparse" : "dense",
                  round);
  }
  uint32_t flags = 0;
  ck_assert_int_eq(g_be->check_device_error(s.b, &flags), PMLA_OK);
  ck_assert_uint_eq(flags, 0);
  free(o_graph);
  free(o_eager);
  free(l_graph);
  free(l_eager);
  free_step(&s);
}

START_TEST(test_graph_of_build_decode_and_decode_replays_like_eager) {
  if (require_graphs(__func__))
    graph_matches_eager(0);
}
END_TEST

START_TEST(test_graph_of_build_sparse_and_decode_replays_like_eager) {
  if (require_graphs(__func__))
    graph_matches_eager(1);
}
END_TEST

START_TEST(test_steps_allocate_no_device_memory) {
  if (!require_graphs(__func__))
    return;
  uint64_t rng = harness_seed();
  step dense, sparse;
  make_step(&dense, 0, &rng);
  make_step(&sparse, 1, &rng);
  run_step(&dense, 0); /* first launches may load modules */
  run_step(&sparse, 1);
  ck_assert_int_eq(g_mem->sync(), 0);
  size_t free_before = 0, free_after = 0, total = 0;
  ck_assert_int_eq(g_mem->mem_info(&free_before, &total), 0);
  for (int i = 0; i < 20; i++) {
    run_step(&dense, 0);
    run_step(&sparse, 1);
  }
  ck_assert_int_eq(g_mem->sync(), 0);
  ck_assert_int_eq(g_mem->mem_info(&free_after, &total), 0);
  ck_assert_msg(free_after == free_before, "device free memory went from %zu to %zu bytes",
                free_before, free_after);
  free_step(&dense);
  free_step(&sparse);
}
END_TEST

/* The GPU kernels move q, kv_cache and out in 16-byte pieces: a tensor
 * whose data + byte_offset is not 16-byte aligned is refused by name, the
 * output is left as it was, and the next aligned call works. */
START_TEST(test_decode_refuses_tensors_not_16_byte_aligned) {
  if (!require_graphs(__func__))
    return;
  uint64_t rng = harness_seed() ^ 0x16;
  step s;
  make_step(&s, 0, &rng);
  ck_assert_int_eq(g_be->build_decode(s.b, &s.dense), PMLA_OK);
  test_tensor *which[3] = {&s.q, &s.kv, &s.out};
  static const char *const name[3] = {"q", "kv_cache", "out"};
  size_t n_out = s.out.bytes / 2;
  uint16_t *before = malloc(n_out * 2), *after = malloc(n_out * 2);
  ck_assert(before && after);
  poison_outputs(&s);
  tt_download(&s.out, before);
  for (int i = 0; i < 3; i++) {
    which[i]->t.byte_offset = 2; /* one bf16 in: still a valid element address */
    pmla_status st = g_be->decode(s.b, &s.args);
    which[i]->t.byte_offset = 0;
    ck_assert_msg(st == PMLA_ERR_INVALID_ARGUMENT, "%s + 2 bytes: %s", name[i],
                  harness_status_name(st));
    const char *msg = g_be->last_error(s.b);
    ck_assert_msg(strstr(msg, name[i]) && strstr(msg, "16-byte"), "message: %s", msg);
  }
  ck_assert_int_eq(g_mem->sync(), 0);
  tt_download(&s.out, after);
  ck_assert_msg(memcmp(before, after, n_out * 2) == 0, "a refused decode wrote the output");
  run_step(&s, 0);
  free(before);
  free(after);
  free_step(&s);
}
END_TEST

/* Reads the builder's six schedule buffers back and compares them with the
 * host planner run on the same lengths: the device must plan identically. */
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
  ck_assert_int_eq(pmla_plan(&in, &out), 0);
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
      ck_assert_msg(dev[k][i] == host[k][i], "%s: %s[%zu] is %d on the device, %d on the host",
                    what, names[k], i, dev[k][i], host[k][i]);
  for (int k = 0; k < 6; k++) {
    free(dev[k]);
    free(host[k]);
  }
}

START_TEST(test_device_schedule_equals_host_planner) {
  if (!require_graphs(__func__))
    return;
  uint64_t rng = harness_seed() ^ 0x77;
  enum { MAXB = 700, WIDTH = 40 }; /* up to three 256-request chunks of the device planner */
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
    pmla_builder_config cfg = harness_config(round % 2 ? 128 : 16, (uint32_t)ps, MAXB, 2, 0,
                                             (uint32_t)cu);
    pmla_builder *b = harness_init(&cfg);
    test_tensor t_qo, t_bt, t_lens;
    tt_make1(&t_qo, TT_I32, qo, B + 1);
    tt_make2(&t_bt, TT_I32, bt, B, WIDTH);
    tt_make1(&t_lens, TT_I32, lens, B);
    pmla_decode_batch batch = {.struct_size = sizeof batch, .kv_layout = PMLA_KV_BLOCK_TABLE,
                               .qo_indptr = &t_qo.t, .block_table = &t_bt.t,
                               .kv_lens = &t_lens.t, .stream = harness_stream()};
    ck_assert_int_eq(g_be->build_decode(b, &batch), PMLA_OK);
    pmla_plan_input in;
    memset(&in, 0, sizeof in);
    in.num_requests = B;
    in.max_q_len = 2;
    in.qo_indptr = qo;
    in.kv_lens = lens;
    in.max_kv_len = WIDTH * ps;
    in.page_size = ps;
    char what[64];
    snprintf(what, sizeof what, "dense round %d (B=%d, cu=%d)", round, B, cu);
    expect_host_schedule(b, &in, what);
    tt_free(&t_qo);
    tt_free(&t_bt);
    tt_free(&t_lens);
    g_be->destroy_builder(b);

    /* sparse: every token one request over topk slots, capped */
    int32_t tokens = 1 + (int32_t)rng_below(&rng, 256), topk = round % 2 ? 2048 : 512;
    int64_t max_seq = (int64_t)rng_below(&rng, 8192);
    cfg = harness_config(16, (uint32_t)ps, 256, 1, (uint32_t)topk, (uint32_t)cu);
    b = harness_init(&cfg);
    int32_t *idx = calloc((size_t)tokens * (size_t)topk, sizeof(int32_t));
    test_tensor t_idx;
    tt_make2(&t_idx, TT_I32, idx, tokens, topk);
    pmla_sparse_batch sb = {.struct_size = sizeof sb, .topk_indices = &t_idx.t,
                            .max_seq_len = max_seq, .stream = harness_stream()};
    ck_assert_int_eq(g_be->build_sparse(b, &sb), PMLA_OK);
    memset(&in, 0, sizeof in);
    in.num_requests = tokens;
    in.max_q_len = 1;
    in.uniform_len = topk;
    in.split_cap = (int32_t)harness_query(b).split_cap;
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

Suite *suite_gpu(void) {
  Suite *s = suite_create("gpu");
  TCase *tc = tcase_create("graphs and allocation");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_graph_of_build_decode_and_decode_replays_like_eager);
  tcase_add_test(tc, test_graph_of_build_sparse_and_decode_replays_like_eager);
  tcase_add_test(tc, test_steps_allocate_no_device_memory);
  tcase_add_test(tc, test_device_schedule_equals_host_planner);
  tcase_add_test(tc, test_decode_refuses_tensors_not_16_byte_aligned);
  suite_add_tcase(s, tc);
  return s;
}
