/* SPDX-License-Identifier: MIT */
/* t_gpu.c - what only a GPU backend promises: build + decode captured in one
 * graph replay exactly like eager calls (also after the host rewrites the
 * lengths or top-k lists in place, when the replayed build must schedule the
 * new lengths), steps allocate no device memory, misaligned tensors are
 * refused, a device past the last is refused, every call leaves the
 * thread's current device as it found it, a builder gives the same
 * output whichever device is current, and builders made after the host
 * resets the device decode as before, a step queued right behind another
 * leaves the earlier step's schedule to its decode, and a thread with no
 * context current is left without one. GPU runtime
 * calls go through devmem.h.
 * On a host-memory backend these skip with the reason. (That the
 * device's metadata kernel writes this plugin's host planner's schedule is
 * white-box: pmla-unit.) */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "schedule.h"

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

static int require_gpu(const char *test) {
  if (harness_skip_reason()) {
    harness_print_skip(test, harness_skip_reason());
    return 0;
  }
  if (g_mem->device_type == kDLCPU) {
    harness_print_skip(test, "the backend's tensors live in host memory: no GPU devices");
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
  int32_t qo_host[BATCH + 1], lens_host[BATCH]; /* what the dense build plans */
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
  memcpy(s->qo_host, qo, sizeof qo);
  memcpy(s->lens_host, lens, sizeof lens);
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
      memcpy(s.lens_host, lens, sizeof lens);
      free(topk);
    }
    poison_outputs(&s);
    ck_assert_int_eq(g_mem->replay(), 0);
    read_result(&s, o_graph, l_graph);
    /* the replayed build scheduled the lengths now in memory */
    char what[64];
    snprintf(what, sizeof what, "%s graph replay, round %d", sparse ? "sparse" : "dense", round);
    sched_step planned = {BATCH, sparse ? NULL : s.qo_host, sparse ? NULL : s.lens_host,
                          sparse ? TOPK : 0};
    sched_check(s.b, &planned, what);
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

#define SENTINEL_BUILDER ((pmla_builder *)(uintptr_t)0x5e47)

/* config.device = the device count: refused at init by name, nothing
 * written, the current device left alone. (device -1 is t_builder.c's.) */
START_TEST(test_init_refuses_the_device_past_the_last) {
  if (!require_gpu(__func__))
    return;
  int n = devmem_gpu_count(), current = devmem_gpu_current();
  ck_assert_msg(n > 0 && current >= 0, "devmem sees %d GPUs, current %d", n, current);
  pmla_builder_config c = harness_config(HEADS, PAGE, BATCH, 1, 0, 0);
  c.device = n;
  pmla_builder *b = SENTINEL_BUILDER;
  pmla_status st = g_be->init_builder(&c, &b);
  if (st == PMLA_OK && b != SENTINEL_BUILDER)
    g_be->destroy_builder(b);
  const char *msg = g_be->last_error(NULL);
  ck_assert_msg(st == PMLA_ERR_INVALID_ARGUMENT || st == PMLA_ERR_NO_DEVICE,
                "device %d of %d devices: %s (%s)", n, n, harness_status_name(st), msg);
  ck_assert_msg(b == SENTINEL_BUILDER, "*out written on a refused init");
  ck_assert_msg(strstr(msg, "device"), "message '%s' does not name device", msg);
  ck_assert_int_eq(devmem_gpu_current(), current);
}
END_TEST

/* A builder that the GPU's free memory cannot hold (most of it taken by a
 * tensor of the test's first): refused with PMLA_ERR_OUT_OF_MEMORY naming
 * the buffer that did not fit and what the builder needs, *out untouched,
 * every buffer allocated before it freed again; with the memory back, the
 * same config makes a builder. (compute-sanitizer reports the refused
 * cudaMalloc as an API error of the run: this test asks for it.) */
START_TEST(test_a_builder_the_gpu_cannot_hold_is_refused_and_leaves_nothing) {
  if (!require_gpu(__func__))
    return;
  pmla_builder_config c = harness_config(128, PAGE, 64, 8, 0, 0);
  c.flags = PMLA_BUILDER_BATCH_INVARIANT; /* partial_out the largest buffer by far */
  pmla_builder *b = NULL;
  ck_assert_msg(g_be->init_builder(&c, &b) == PMLA_OK, "%s", g_be->last_error(NULL));
  pmla_builder_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  ck_assert_int_eq(g_be->query_builder(b, &info), PMLA_OK);
  g_be->destroy_builder(b);
  const uint64_t part = info.buffer_bytes[PMLA_BUF_PARTIAL_OUT];
  ck_assert_uint_gt(part, info.total_bytes / 2);
  size_t free0 = 0, total = 0;
  ck_assert_int_eq(g_mem->mem_info(&free0, &total), 0);
  /* leave the small buffers room, partial_out none: a hog of the free
   * memory less half of partial_out (allocators round; try smaller hogs) */
  void *hog = NULL;
  size_t hog_bytes = free0 > part / 2 ? free0 - part / 2 : 0;
  while (hog_bytes > part && !(hog = g_mem->alloc(hog_bytes)))
    hog_bytes -= part / 8;
  if (!hog) {
    harness_print_skip(__func__, "no hog of the device's free memory could be allocated");
    return;
  }
  size_t free1 = 0, free2 = 0;
  ck_assert_int_eq(g_mem->mem_info(&free1, &total), 0);
  if (free1 >= part) {
    g_mem->release(hog);
    harness_print_skip(__func__, "the hog left room for partial_out");
    return;
  }
  b = SENTINEL_BUILDER;
  const pmla_status st = g_be->init_builder(&c, &b);
  const char *msg = g_be->last_error(NULL);
  ck_assert_int_eq(g_mem->mem_info(&free2, &total), 0);
  g_mem->release(hog);
  if (st == PMLA_OK && b != SENTINEL_BUILDER)
    g_be->destroy_builder(b);
  ck_assert_msg(st == PMLA_ERR_OUT_OF_MEMORY, "%zu bytes free, partial_out %llu: %s (%s)",
                free1, (unsigned long long)part, harness_status_name(st), msg);
  ck_assert_msg(b == SENTINEL_BUILDER, "*out written on a refused init");
  ck_assert_msg(strstr(msg, "buffer partial_out") && strstr(msg, "bytes in all"),
                "message '%s' does not name the buffer and the builder's need", msg);
  ck_assert_msg(free2 == free1, "device free memory %zu before the refused init, %zu after",
                free1, free2);
  b = NULL;
  ck_assert_msg(g_be->init_builder(&c, &b) == PMLA_OK, "with the memory back: %s",
                g_be->last_error(NULL));
  g_be->destroy_builder(b);
}
END_TEST

/* Makes `dev` current, runs stmt, fails unless `dev` is still current. */
#define KEEPS_CURRENT(what, dev, stmt)                                                     \
  do {                                                                                     \
    ck_assert_int_eq(devmem_gpu_set_current(dev), 0);                                      \
    stmt;                                                                                  \
    int now_ = devmem_gpu_current();                                                       \
    ck_assert_msg(now_ == (dev), "%s changed the current device from %d to %d", what, dev, \
                  now_);                                                                   \
  } while (0)

#define EXPECT_OK(what, st)                                                                \
  ck_assert_msg((st) == PMLA_OK, "%s: %s: %s", what, harness_status_name(st),              \
                g_be->last_error(s.b))

/* Every call of a builder restores the caller's current device: before each
 * the last device is made current (device 0 when that is the builder's and
 * another exists; with one GPU, device 0 itself). */
START_TEST(test_every_call_keeps_the_current_device) {
  if (!require_gpu(__func__))
    return;
  int n = devmem_gpu_count(), before = devmem_gpu_current();
  int other = n - 1 != g_mem->device_id ? n - 1 : 0;
  uint64_t rng = harness_seed() ^ 0xde5;
  step s;
  make_step(&s, 0, &rng);
  g_be->destroy_builder(s.b); /* made again below, under watch */
  s.b = NULL;
  pmla_builder_config c = harness_config(HEADS, PAGE, BATCH, 1, TOPK, 0);
  pmla_status st;
  KEEPS_CURRENT("init_builder", other, st = g_be->init_builder(&c, &s.b));
  EXPECT_OK("init_builder", st);
  KEEPS_CURRENT("build_decode", other, st = g_be->build_decode(s.b, &s.dense));
  EXPECT_OK("build_decode", st);
  KEEPS_CURRENT("decode (dense)", other, st = g_be->decode(s.b, &s.args));
  EXPECT_OK("decode", st);
  KEEPS_CURRENT("build_sparse", other, st = g_be->build_sparse(s.b, &s.sparse));
  EXPECT_OK("build_sparse", st);
  KEEPS_CURRENT("decode (sparse)", other, st = g_be->decode(s.b, &s.args));
  EXPECT_OK("decode", st);
  s.q.t.byte_offset = 2; /* a refused call too */
  KEEPS_CURRENT("a refused decode", other, st = g_be->decode(s.b, &s.args));
  s.q.t.byte_offset = 0;
  ck_assert_int_eq(st, PMLA_ERR_INVALID_ARGUMENT);
  uint32_t flags = 0;
  KEEPS_CURRENT("check_device_error", other, st = g_be->check_device_error(s.b, &flags));
  EXPECT_OK("check_device_error", st);
  pmla_builder_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  KEEPS_CURRENT("query_builder", other, st = g_be->query_builder(s.b, &info));
  EXPECT_OK("query_builder", st);
  uint64_t bytes = info.buffer_bytes[PMLA_BUF_WORK_META_DATA];
  void *meta = malloc(bytes ? bytes : 1);
  ck_assert(meta);
  KEEPS_CURRENT("copy_buffer", other,
                st = g_be->copy_buffer(s.b, PMLA_BUF_WORK_META_DATA, meta, bytes));
  EXPECT_OK("copy_buffer", st);
  free(meta);
  KEEPS_CURRENT("destroy_builder", other, g_be->destroy_builder(s.b));
  s.b = NULL;
  free_step(&s);
  ck_assert_int_eq(devmem_gpu_set_current(before), 0);
}
END_TEST

/* A thread with no context current (one the host never bound to a device,
 * which the runtime reports as device 0) is left without one: restoring
 * "device 0" instead would create device 0's primary context for a builder
 * on another device, and bind this thread to it. */
typedef struct bare_thread_run {
  step *s;
  int before, after, device_before, device_after;
  pmla_status st;
} bare_thread_run;

static void *decode_on_a_bare_thread(void *arg) {
  bare_thread_run *r = arg;
  r->before = devmem_gpu_has_context();
  if (r->before == 0) {
    r->device_before = devmem_gpu_current();
    r->st = g_be->build_decode(r->s->b, &r->s->dense);
    if (r->st == PMLA_OK)
      r->st = g_be->decode(r->s->b, &r->s->args);
    r->after = devmem_gpu_has_context();
    r->device_after = devmem_gpu_current();
  }
  return NULL;
}

START_TEST(test_a_thread_without_a_context_is_left_without_one) {
  if (!require_gpu(__func__))
    return;
  uint64_t rng = harness_seed() ^ 0xc7c7;
  step s;
  make_step(&s, 0, &rng);
  bare_thread_run r = {&s, -1, -1, -1, -1, PMLA_OK};
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, decode_on_a_bare_thread, &r), 0);
  ck_assert_int_eq(pthread_join(t, NULL), 0);
  if (r.before != 0) {
    harness_print_skip(__func__, r.before < 0 ? "the driver's current context cannot be read here"
                                              : "a new thread already had a context current");
  } else {
    ck_assert_msg(r.st == PMLA_OK, "build + decode on a bare thread: %s: %s",
                  harness_status_name(r.st), g_be->last_error(s.b));
    ck_assert_msg(r.after == 0, "a thread with no context current has one after build + decode");
    /* with the builder on another GPU (PMLA_CONFORMANCE_DEVICE=1) this is
     * the case that matters: the runtime must still report the device it
     * did before (0), not the builder's */
    ck_assert_msg(r.device_after == r.device_before,
                  "a bare thread reported device %d before build + decode on device %d, %d after",
                  r.device_before, g_mem->device_id, r.device_after);
  }
  ck_assert_int_eq(g_mem->sync(), 0);
  free_step(&s);
}
END_TEST

/* A builder on the run's device gives the same bits while another device
 * is the thread's current one (device 1 for a builder on device 0). */
START_TEST(test_a_builder_ignores_which_device_is_current) {
  if (!require_gpu(__func__))
    return;
  int n = devmem_gpu_count(), before = devmem_gpu_current();
  if (n < 2) {
    harness_print_skip(__func__, "one GPU: no other device to make current");
    return;
  }
  int own = g_mem->device_id, other = own == 0 ? 1 : 0;
  for (int sparse = 0; sparse <= 1; sparse++) {
    uint64_t rng = harness_seed() ^ (sparse ? 0xc1 : 0xc0);
    step s;
    make_step(&s, sparse, &rng);
    size_t n_out = s.out.bytes / 2, n_lse = s.lse.bytes / 4;
    uint16_t *o_own = malloc(n_out * 2), *o_other = malloc(n_out * 2);
    float *l_own = malloc(n_lse * 4), *l_other = malloc(n_lse * 4);
    ck_assert(o_own && o_other && l_own && l_other);
    ck_assert_int_eq(devmem_gpu_set_current(own), 0);
    poison_outputs(&s);
    run_step(&s, sparse);
    read_result(&s, o_own, l_own);
    ck_assert_int_eq(devmem_gpu_set_current(other), 0);
    poison_outputs(&s);
    run_step(&s, sparse);
    read_result(&s, o_other, l_other);
    ck_assert_int_eq(devmem_gpu_current(), other);
    ck_assert_msg(memcmp(o_own, o_other, n_out * 2) == 0 && memcmp(l_own, l_other, n_lse * 4) == 0,
                  "%s: builder on device %d: output with device %d current differs from output "
                  "with device %d current", sparse ? "sparse" : "dense", own, other, own);
    free(o_own);
    free(o_other);
    free(l_own);
    free(l_other);
    free_step(&s);
  }
  ck_assert_int_eq(devmem_gpu_set_current(before), 0);
}
END_TEST

/* A fresh builder's step from seed: its output and lse (n_out / n_lse
 * values), with no device error flagged. */
static void fresh_step_result(int sparse, uint64_t seed, uint16_t *out, size_t n_out, float *lse,
                              size_t n_lse) {
  step s;
  uint64_t rng = seed;
  make_step(&s, sparse, &rng);
  ck_assert(s.out.bytes == n_out * 2 && s.lse.bytes == n_lse * 4);
  poison_outputs(&s); /* a step that writes nothing cannot match the other */
  run_step(&s, sparse);
  read_result(&s, out, lse);
  uint32_t flags = 0;
  ck_assert_int_eq(g_be->check_device_error(s.b, &flags), PMLA_OK);
  ck_assert_uint_eq(flags, 0);
  free_step(&s);
}

/* pmla.h: a step's build, its decodes and the next step's build queued on
 * one stream, the next build overwriting the schedule the earlier decodes
 * read. Step X (six whole requests of 4096 tokens: none splits, so the
 * reduce has nothing to merge and its warps leave without waiting for the
 * decode) is queued, then step Y (six of 64 tokens, other pages) right
 * behind it, with no wait between; each step's out and lse must equal the
 * same steps run with a wait after each. If the decode of X could still be
 * running when Y's metadata kernel rewrote the schedule (a reduce that
 * exits early must not let the next kernel past the decode), X would
 * attend Y's 64 tokens. */
#define QR_BATCH 6
#define QR_PAGE 64
#define QR_X_PAGES 64 /* 4096 tokens a request */
START_TEST(test_a_step_queued_behind_another_leaves_its_schedule_alone) {
  if (!require_gpu(__func__))
    return;
  uint64_t rng = harness_seed() ^ 0x9e9e;
  const int32_t pages = QR_BATCH * QR_X_PAGES + QR_BATCH;
  pmla_builder_config cfg = harness_config(HEADS, QR_PAGE, QR_BATCH, 1, 0, QR_BATCH);
  pmla_builder *b = harness_init(&cfg);
  int32_t qo[QR_BATCH + 1], bt_x[QR_BATCH * QR_X_PAGES], bt_y[QR_BATCH * QR_X_PAGES];
  int32_t len_x[QR_BATCH], len_y[QR_BATCH];
  for (int32_t r = 0; r <= QR_BATCH; r++)
    qo[r] = r;
  for (int32_t r = 0; r < QR_BATCH; r++) {
    len_x[r] = QR_X_PAGES * QR_PAGE;
    len_y[r] = QR_PAGE;
    for (int32_t j = 0; j < QR_X_PAGES; j++) {
      bt_x[r * QR_X_PAGES + j] = r * QR_X_PAGES + j;
      bt_y[r * QR_X_PAGES + j] = QR_BATCH * QR_X_PAGES + r; /* only entry 0 is read */
    }
  }
  const size_t nkv = (size_t)pages * QR_PAGE * 576, nq = (size_t)QR_BATCH * HEADS * 576;
  uint16_t *kv = malloc(nkv * 2), *q = malloc(nq * 2);
  ck_assert(kv && q);
  for (size_t i = 0; i < nkv; i++)
    kv[i] = bf16_of(&rng);
  for (size_t i = 0; i < nq; i++)
    q[i] = bf16_of(&rng);
  test_tensor t_qo, t_btx, t_bty, t_lx, t_ly, t_q, t_kv, t_out[2], t_lse[2];
  tt_make1(&t_qo, TT_I32, qo, QR_BATCH + 1);
  tt_make2(&t_btx, TT_I32, bt_x, QR_BATCH, QR_X_PAGES);
  tt_make2(&t_bty, TT_I32, bt_y, QR_BATCH, QR_X_PAGES);
  tt_make1(&t_lx, TT_I32, len_x, QR_BATCH);
  tt_make1(&t_ly, TT_I32, len_y, QR_BATCH);
  tt_make3(&t_q, TT_BF16, q, QR_BATCH, HEADS, 576);
  tt_make3(&t_kv, TT_BF16, kv, pages, QR_PAGE, 576);
  pmla_decode_batch batch[2];
  pmla_decode_args args[2];
  for (int k = 0; k < 2; k++) {
    tt_make3(&t_out[k], TT_BF16, NULL, QR_BATCH, HEADS, 512);
    tt_make2(&t_lse[k], TT_F32, NULL, QR_BATCH, HEADS);
    batch[k] = (pmla_decode_batch){.struct_size = sizeof batch[k],
                                   .kv_layout = PMLA_KV_BLOCK_TABLE,
                                   .qo_indptr = &t_qo.t,
                                   .block_table = k ? &t_bty.t : &t_btx.t,
                                   .kv_lens = k ? &t_ly.t : &t_lx.t,
                                   .stream = harness_stream()};
    args[k] = (pmla_decode_args){.struct_size = sizeof args[k],
                                 .q = &t_q.t,
                                 .kv_cache = &t_kv.t,
                                 .out = &t_out[k].t,
                                 .lse = &t_lse[k].t,
                                 .stream = harness_stream()};
  }
  const size_t n_out = (size_t)QR_BATCH * HEADS * 512, n_lse = (size_t)QR_BATCH * HEADS;
  uint16_t *o_want[2], *o_got = malloc(n_out * 2);
  float *l_want[2], *l_got = malloc(n_lse * 4);
  ck_assert(o_got && l_got);
  for (int k = 0; k < 2; k++) { /* each step alone, waited for */
    o_want[k] = malloc(n_out * 2);
    l_want[k] = malloc(n_lse * 4);
    ck_assert(o_want[k] && l_want[k]);
    ck_assert_int_eq(g_be->build_decode(b, &batch[k]), PMLA_OK);
    ck_assert_int_eq(g_be->decode(b, &args[k]), PMLA_OK);
    ck_assert_int_eq(g_mem->sync(), 0);
    tt_download(&t_out[k], o_want[k]);
    tt_download(&t_lse[k], l_want[k]);
  }
  int32_t meta[PMLA_META_WORDS];
  ck_assert_int_eq(g_be->build_decode(b, &batch[0]), PMLA_OK);
  ck_assert_int_eq(g_be->copy_buffer(b, PMLA_BUF_WORK_META_DATA, meta, sizeof meta), PMLA_OK);
  ck_assert_msg(meta[SCHED_META_REDUCE] == 0, "step X splits %d requests; the test needs none",
                meta[SCHED_META_REDUCE]);
  for (int round = 0; round < 20; round++) {
    for (int k = 0; k < 2; k++) {
      ck_assert_int_eq(g_mem->fill(t_out[k].t.data, 0xff, t_out[k].bytes), 0);
      ck_assert_int_eq(g_mem->fill(t_lse[k].t.data, 0xff, t_lse[k].bytes), 0);
    }
    for (int k = 0; k < 2; k++) { /* queued back to back, no wait */
      ck_assert_int_eq(g_be->build_decode(b, &batch[k]), PMLA_OK);
      ck_assert_int_eq(g_be->decode(b, &args[k]), PMLA_OK);
    }
    ck_assert_int_eq(g_mem->sync(), 0);
    for (int k = 0; k < 2; k++) {
      tt_download(&t_out[k], o_got);
      tt_download(&t_lse[k], l_got);
      ck_assert_msg(memcmp(o_got, o_want[k], n_out * 2) == 0 &&
                        memcmp(l_got, l_want[k], n_lse * 4) == 0,
                    "round %d: step %c queued behind another differs from the step alone", round,
                    k ? 'Y' : 'X');
    }
  }
  uint32_t flags = 0;
  ck_assert_int_eq(g_be->check_device_error(b, &flags), PMLA_OK);
  ck_assert_uint_eq(flags, 0);
  test_tensor *all[] = {&t_qo, &t_btx, &t_bty, &t_lx, &t_ly, &t_q, &t_kv,
                        &t_out[0], &t_out[1], &t_lse[0], &t_lse[1]};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    tt_free(all[i]);
  for (int k = 0; k < 2; k++) {
    free(o_want[k]);
    free(l_want[k]);
  }
  free(o_got);
  free(l_got);
  free(kv);
  free(q);
  g_be->destroy_builder(b);
}
END_TEST

/* A host may reset the device (cudaDeviceReset) once its builders are
 * destroyed; builders made after that decode as before, bit for bit. The
 * plugin keeps no device state outside its builders; the per-process cache
 * of each kernel's shared-memory opt-in stays valid, since the runtime
 * applies a function's attributes again in the new context. */
START_TEST(test_a_builder_made_after_a_device_reset_decodes) {
  if (!require_gpu(__func__))
    return;
  const uint64_t seed = harness_seed() ^ 0x7e5e7;
  const size_t n_out = (size_t)BATCH * HEADS * 512, n_lse = (size_t)BATCH * HEADS;
  uint16_t *o_before = malloc(n_out * 2), *o_after = malloc(n_out * 2);
  float *l_before = malloc(n_lse * 4), *l_after = malloc(n_lse * 4);
  ck_assert(o_before && o_after && l_before && l_after);
  for (int sparse = 0; sparse < 2; sparse++) {
    fresh_step_result(sparse, seed, o_before, n_out, l_before, n_lse);
    ck_assert_int_eq(devmem_gpu_reset(g_mem->device_id), 0);
    fresh_step_result(sparse, seed, o_after, n_out, l_after, n_lse);
    ck_assert_msg(memcmp(o_before, o_after, n_out * 2) == 0,
                  "%s step after the reset: output differs from before it",
                  sparse ? "sparse" : "dense");
    ck_assert_msg(memcmp(l_before, l_after, n_lse * 4) == 0,
                  "%s step after the reset: lse differs from before it", sparse ? "sparse" : "dense");
  }
  free(o_before);
  free(o_after);
  free(l_before);
  free(l_after);
}
END_TEST

Suite *suite_gpu(void) {
  Suite *s = suite_create("gpu");
  TCase *tc = tcase_create("graphs and allocation");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_graph_of_build_decode_and_decode_replays_like_eager);
  tcase_add_test(tc, test_graph_of_build_sparse_and_decode_replays_like_eager);
  tcase_add_test(tc, test_steps_allocate_no_device_memory);
  tcase_add_test(tc, test_decode_refuses_tensors_not_16_byte_aligned);
  tcase_add_test(tc, test_a_step_queued_behind_another_leaves_its_schedule_alone);
  suite_add_tcase(s, tc);
  TCase *dev = tcase_create("devices");
  tcase_set_timeout(dev, 120);
  tcase_add_test(dev, test_init_refuses_the_device_past_the_last);
  tcase_add_test(dev, test_a_builder_the_gpu_cannot_hold_is_refused_and_leaves_nothing);
  tcase_add_test(dev, test_every_call_keeps_the_current_device);
  tcase_add_test(dev, test_a_builder_ignores_which_device_is_current);
  tcase_add_test(dev, test_a_thread_without_a_context_is_left_without_one);
  tcase_add_test(dev, test_a_builder_made_after_a_device_reset_decodes); /* last: it resets */
  suite_add_tcase(s, dev);
  return s;
}
