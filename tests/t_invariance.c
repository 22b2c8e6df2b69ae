/* SPDX-License-Identifier: MIT */
/* t_invariance.c - PMLA_BUILDER_BATCH_INVARIANT (ABI 1.1): a request's out
 * and lse are bitwise the same decoded alone and inside random batches
 * (sizes 1..256, random neighbours, the request at a random position),
 * whatever cu_count is (1, 2, 7, all); q_len 1..4; block table, CSR and
 * sparse steps; bf16 caches and both FP8 layouts. The request alone also
 * matches the fp64 reference. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "reference.h"

#define H 16
#define PS 16
#define MAXB 256
#define MAXQ 4
#define PAGES 2048 /* a shared cache of random pages: 32768 slots */
#define TRIALS 12
#define SPARSE_TOPK 2112 /* three chunks of a batch-invariant sparse step */
#define MAXPAGES 2816    /* the long request: 45056 tokens */

static const uint32_t cus[] = {1, 2, 7, 0};

/* A shared cache of kv_dtype: bf16 values in [-1, 1] (host), or FP8 bytes
 * (bytes): any finite e4m3 value, E4M3 with the scale 2^-8 (kv_scale),
 * DS_MLA with tile scales 2^-8..2^-10 and rope values in [-1, 1]. */
typedef struct cache {
  uint32_t dtype;
  test_tensor kv, scale;
  uint16_t *host;
  uint8_t *bytes;
} cache;

#define E4M3_SCALE (1.f / 256.f)

static void cache_make_as(cache *c, uint64_t *rng, uint32_t dtype) {
  memset(c, 0, sizeof *c);
  c->dtype = dtype;
  const size_t slots = (size_t)PAGES * PS;
  if (dtype == PMLA_DTYPE_BF16) {
    c->host = malloc(slots * 576 * 2);
    ck_assert(c->host);
    for (size_t i = 0; i < slots * 576; i++)
      c->host[i] = ref_float_to_bf16((float)(rng_uniform(rng) * 2.0 - 1.0));
    tt_make3(&c->kv, TT_BF16, c->host, PAGES, PS, 576);
    return;
  }
  const size_t w = dtype == PMLA_DTYPE_FP8_E4M3 ? 576 : 656;
  c->bytes = malloc(slots * w);
  ck_assert(c->bytes);
  for (size_t sl = 0; sl < slots; sl++) {
    uint8_t *row = c->bytes + sl * w;
    if (dtype == PMLA_DTYPE_FP8_E4M3) {
      for (size_t d = 0; d < 576; d++)
        row[d] = rng_e4m3(rng);
      continue;
    }
    for (size_t d = 0; d < 512; d++)
      row[d] = rng_e4m3(rng);
    for (int t = 0; t < 4; t++) {
      const float f = ldexpf(1.f, -8 - (int)rng_below(rng, 3));
      memcpy(row + 512 + 4 * t, &f, 4);
    }
    for (int d = 0; d < 64; d++) {
      const uint16_t v = ref_float_to_bf16((float)(rng_uniform(rng) * 2.0 - 1.0));
      memcpy(row + 528 + 2 * d, &v, 2);
    }
  }
  tt_make3(&c->kv, kDLUInt, 8, c->bytes, PAGES, PS, (int64_t)w);
  const float scale = E4M3_SCALE;
  tt_make1(&c->scale, TT_F32, &scale, 1);
}

static void cache_make(cache *c, uint64_t *rng) { cache_make_as(c, rng, PMLA_DTYPE_BF16); }

static void cache_free(cache *c) {
  tt_free(&c->kv);
  if (c->bytes)
    tt_free(&c->scale);
  free(c->host);
  free(c->bytes);
}

/* builds in which some request was split (several pieces, merged by the
 * reduce): the invariance must hold across split and whole; the last
 * build's work items */
static int g_split_builds, g_max_pieces, g_items;

static void count_split(pmla_builder *b) {
  int32_t meta[PMLA_META_WORDS];
  ck_assert_int_eq(g_be->copy_buffer(b, PMLA_BUF_WORK_META_DATA, meta, sizeof meta), PMLA_OK);
  g_split_builds += meta[4] > 1; /* most pieces of one request */
  if (meta[4] > g_max_pieces)
    g_max_pieces = meta[4];
  g_items = meta[0];
}

/* the builders' invariant_chunk (0: pmla's) */
static uint32_t g_chunk;

/* One dense request: its query rows and pages. */
typedef struct req {
  int32_t q_len, kv_len, npages;
  int32_t pages[MAXPAGES];
  uint16_t *q; /* [q_len, H, 576] */
} req;

/* Gives r a new length and random pages for it (its q is kept). */
static void req_set_len(req *r, uint64_t *rng, int32_t kv_len) {
  r->kv_len = kv_len;
  r->npages = (kv_len + PS - 1) / PS;
  for (int32_t p = 0; p < r->npages; p++)
    r->pages[p] = (int32_t)rng_below(rng, PAGES);
}

static void req_random(req *r, uint64_t *rng, int32_t max_len) {
  r->q_len = 1 + (int32_t)rng_below(rng, MAXQ);
  req_set_len(r, rng, (int32_t)rng_below(rng, (uint32_t)max_len + 1));
  size_t n = (size_t)r->q_len * H * 576;
  r->q = malloc(n * 2);
  ck_assert(r->q);
  for (size_t i = 0; i < n; i++)
    r->q[i] = ref_float_to_bf16((float)(rng_uniform(rng) * 4.0 - 2.0));
}

/* Decodes the step built on b (q of T tokens) and copies `rows` rows of out
 * and lse from row `first` (a row is a (token, head) pair) to the host. */
static void decode_rows(pmla_builder *b, const cache *c, const uint16_t *q, int64_t T,
                        size_t first, size_t rows, uint16_t *got_out, float *got_lse) {
  test_tensor t_q, t_out, t_lse;
  tt_make3(&t_q, TT_BF16, q, T, H, 576);
  tt_make3(&t_out, TT_BF16, NULL, T, H, 512);
  tt_make2(&t_lse, TT_F32, NULL, T, H);
  pmla_decode_args args;
  memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.q = &t_q.t;
  args.kv_cache = &c->kv.t;
  args.out = &t_out.t;
  args.lse = &t_lse.t;
  args.stream = harness_stream();
  args.kv_scale = c->dtype == PMLA_DTYPE_FP8_E4M3 ? &c->scale.t : NULL;
  pmla_status st = g_be->decode(b, &args);
  ck_assert_msg(st == PMLA_OK, "decode: %s", g_be->last_error(b));
  uint16_t *out = malloc(t_out.bytes + 2);
  float *lse = malloc(t_lse.bytes + 4);
  ck_assert(out && lse);
  tt_download(&t_out, out);
  tt_download(&t_lse, lse);
  memcpy(got_out, out + first * 512, rows * 512 * 2);
  memcpy(got_lse, lse + first, rows * 4);
  tt_free(&t_q);
  tt_free(&t_out);
  tt_free(&t_lse);
  free(out);
  free(lse);
}

/* Decodes the batch `reqs` (block table or CSR) with `cu` units and copies
 * request `probe`'s out rows and lse into got_out / got_lse. */
static void decode_batch(const cache *c, req *const *reqs, int32_t n, int32_t probe,
                         uint32_t layout, uint32_t cu, uint16_t *got_out, float *got_lse) {
  pmla_builder_config cfg = harness_config(H, PS, MAXB, MAXQ, 0, cu);
  cfg.flags = PMLA_BUILDER_BATCH_INVARIANT;
  cfg.invariant_chunk = g_chunk;
  cfg.kv_dtype = c->dtype;
  pmla_builder *b = harness_init(&cfg);
  int32_t qo[MAXB + 1] = {0}, lens[MAXB], kvp[MAXB + 1] = {0}, last[MAXB], width = 1;
  for (int32_t i = 0; i < n; i++) {
    qo[i + 1] = qo[i] + reqs[i]->q_len;
    lens[i] = reqs[i]->kv_len;
    kvp[i + 1] = kvp[i] + reqs[i]->npages;
    last[i] = reqs[i]->npages ? reqs[i]->kv_len - (reqs[i]->npages - 1) * PS : 0;
    if (reqs[i]->npages > width)
      width = reqs[i]->npages;
  }
  const int32_t T = qo[n];
  int32_t *bt = calloc((size_t)n * (size_t)width, sizeof(int32_t));
  int32_t *idx = malloc(sizeof(int32_t) * (size_t)(kvp[n] + 1));
  uint16_t *q = malloc((size_t)T * H * 576 * 2);
  ck_assert(bt && idx && q);
  for (int32_t i = 0; i < n; i++) {
    memcpy(bt + (size_t)i * width, reqs[i]->pages, sizeof(int32_t) * (size_t)reqs[i]->npages);
    memcpy(idx + kvp[i], reqs[i]->pages, sizeof(int32_t) * (size_t)reqs[i]->npages);
    memcpy(q + (size_t)qo[i] * H * 576, reqs[i]->q, (size_t)reqs[i]->q_len * H * 576 * 2);
  }
  harness_dense_step ds;
  harness_dense_step_make(&ds, layout, n, qo, lens, bt, width, kvp, idx, last);
  pmla_status st = g_be->build_decode(b, &ds.batch);
  ck_assert_msg(st == PMLA_OK, "build_decode: %s", g_be->last_error(b));
  count_split(b);
  decode_rows(b, c, q, T, (size_t)qo[probe] * H, (size_t)reqs[probe]->q_len * H, got_out,
              got_lse);
  harness_dense_step_free(&ds);
  g_be->destroy_builder(b);
  free(bt);
  free(idx);
  free(q);
}

/* `tokens` query tokens' rows (q, out, lse as decoded) against the fp64
 * reference over the slot lists. */
static void check_lists(const cache *c, const ref_slot_lists *lists, int64_t tokens,
                        const uint16_t *q, const uint16_t *out, const float *lse,
                        const char *what) {
  const size_t rows = (size_t)tokens * H;
  double *ro = malloc(rows * 512 * 8), *rl = malloc(rows * 8);
  float *of = malloc(rows * 512 * 4);
  ck_assert(ro && rl && of);
  const int fmt = c->dtype == PMLA_DTYPE_FP8_E4M3    ? REF_KV_FP8_E4M3
                  : c->dtype == PMLA_DTYPE_FP8_DS_MLA ? REF_KV_FP8_DS_MLA
                                                      : 0;
  ref_problem p = {tokens, H, q, c->host, (int64_t)PAGES * PS, lists,
                   harness_config(H, PS, 1, 1, 0, 1).softmax_scale, fmt, c->bytes,
                   E4M3_SCALE};
  ck_assert_int_eq(ref_mla_decode(&p, ro, rl), 0);
  for (size_t i = 0; i < rows * 512; i++)
    of[i] = ref_bf16_to_float(out[i]);
  ref_report o = ref_check_output(ro, of, rows * 512), l = ref_check_lse(rl, lse, rows);
  ck_assert_msg(o.ok && l.ok, "%s vs reference: out %s, lse %s", what, o.message, l.message);
  free(ro);
  free(rl);
  free(of);
}

/* The probe alone (one unit) against the fp64 reference. */
static void check_reference(const cache *c, const req *r, const uint16_t *out, const float *lse) {
  const int32_t qo[2] = {0, r->q_len};
  ref_slot_lists lists;
  ck_assert_int_eq(ref_slots_from_block_table(1, qo, r->pages, r->npages > 0 ? r->npages : 1,
                                              &r->kv_len, PS, &lists),
                   0);
  check_lists(c, &lists, r->q_len, r->q, out, lse, "probe alone");
  ref_slot_lists_free(&lists);
}

/* A request's out rows and lse as one decode gave them. */
typedef struct result {
  uint16_t *out;
  float *lse;
  size_t rows;
} result;
static result result_make(size_t rows) {
  result r = {malloc(rows * 512 * 2), malloc(rows * 4), rows};
  ck_assert(r.out && r.lse);
  return r;
}
/* the same bits in out and lse */
static int result_same(const result *a, const result *b) {
  return memcmp(a->out, b->out, a->rows * 512 * 2) == 0 &&
         memcmp(a->lse, b->lse, a->rows * 4) == 0;
}
static void result_free(result *r) {
  free(r->out);
  free(r->lse);
}

static const char *dtype_name(uint32_t dtype) {
  return dtype == PMLA_DTYPE_FP8_E4M3 ? "fp8_e4m3" : dtype == PMLA_DTYPE_FP8_DS_MLA ? "fp8_ds_mla" : "bf16";
}

static void run_dense(uint32_t layout, uint64_t seed, uint32_t dtype) {
  uint64_t rng = seed;
  cache c;
  cache_make_as(&c, &rng, dtype);
  req probe;
  req_random(&probe, &rng, 3000);
  /* more than one chunk (longer than the 4096 tokens a dense request keeps
   * whole; then 2048-token chunks), so that alone it is split */
  req_set_len(&probe, &rng, 4200 + (int32_t)rng_below(&rng, 1900));
  result alone = result_make((size_t)probe.q_len * H), got = result_make(alone.rows);
  req *one[1] = {&probe};
  decode_batch(&c, one, 1, 0, layout, 1, alone.out, alone.lse);
  /* alone on one unit: one work item a chunk of the least size (2048
   * tokens, or the builder's) */
  const int32_t least = g_chunk ? (int32_t)g_chunk : 2048;
  ck_assert_msg(g_items == (probe.kv_len + least - 1) / least,
                "kv_len %d in chunks of %d: %d work items", probe.kv_len, least, g_items);
  check_reference(&c, &probe, alone.out, alone.lse);
  static req pool[MAXB];
  req *batch[MAXB];
  g_split_builds = 0;
  for (int t = 0; t < TRIALS; t++) {
    static const int32_t sizes[] = {1, 2, 5, 17, 64, 131, 256};
    /* trial 1 (two units) has the request alone, which splits it: every
     * seed meets both the split and the whole path */
    const int32_t drawn = sizes[rng_below(&rng, 7)], n = t == 1 ? 1 : drawn;
    const int32_t at = (int32_t)rng_below(&rng, (uint32_t)n);
    const uint32_t cu = cus[t % 4];
    for (int32_t i = 0; i < n; i++) {
      if (i == at) {
        batch[i] = &probe;
        continue;
      }
      req_random(&pool[i], &rng, n > 64 ? 400 : 2500);
      batch[i] = &pool[i];
    }
    decode_batch(&c, batch, n, at, layout, cu, got.out, got.lse);
    ck_assert_msg(result_same(&alone, &got),
                  "%s %s: request (q_len %d, kv_len %d) at %d of a batch of %d, cu_count %u: "
                  "out or lse differs from the request decoded alone",
                  dtype_name(dtype), layout == PMLA_KV_CSR ? "CSR" : "block table", probe.q_len,
                  probe.kv_len, at, n, cu);
    for (int32_t i = 0; i < n; i++)
      if (i != at)
        free(pool[i].q);
  }
  printf("invariance %s %s: %d batches (sizes 1..256, cu_count 1/2/7/all), q_len %d, "
         "kv_len %d in chunks of %d, %d builds split a request\n",
         dtype_name(dtype), layout == PMLA_KV_CSR ? "CSR" : "block table", TRIALS, probe.q_len,
         probe.kv_len, least, g_split_builds);
  ck_assert_msg(g_split_builds > 0, "no build split a request: the test proves too little");
  free(probe.q);
  result_free(&alone);
  result_free(&got);
  cache_free(&c);
}

START_TEST(test_dense_output_is_independent_of_the_batch) {
  REQUIRE_BACKEND();
  run_dense(_i % 2 ? PMLA_KV_CSR : PMLA_KV_BLOCK_TABLE, harness_seed() ^ (0x1a0u + (uint64_t)_i),
            PMLA_DTYPE_BF16);
}
END_TEST

/* FP8 caches: the same promise (each dtype has kernels of its own) */
START_TEST(test_fp8_output_is_independent_of_the_batch) {
  REQUIRE_BACKEND();
  run_dense(_i % 2 ? PMLA_KV_CSR : PMLA_KV_BLOCK_TABLE, harness_seed() ^ (0xf80u + (uint64_t)_i),
            _i < 2 ? PMLA_DTYPE_FP8_E4M3 : PMLA_DTYPE_FP8_DS_MLA);
}
END_TEST

/* Sparse: token `probe` with its own top-k list, alone and among others. */
static void decode_sparse(const cache *c, const int32_t *lists, const uint16_t *q, int32_t n,
                          int32_t probe, uint32_t cu, uint16_t *out1, float *lse1) {
  pmla_builder_config cfg = harness_config(H, PS, MAXB, 1, SPARSE_TOPK, cu);
  cfg.flags = PMLA_BUILDER_BATCH_INVARIANT;
  cfg.invariant_chunk = g_chunk;
  cfg.kv_dtype = c->dtype;
  pmla_builder *b = harness_init(&cfg);
  test_tensor t_idx;
  tt_make2(&t_idx, TT_I32, lists, n, SPARSE_TOPK);
  pmla_sparse_batch sb;
  memset(&sb, 0, sizeof sb);
  sb.struct_size = sizeof sb;
  sb.topk_indices = &t_idx.t;
  sb.max_seq_len = PAGES * PS;
  sb.stream = harness_stream();
  ck_assert_msg(g_be->build_sparse(b, &sb) == PMLA_OK, "build_sparse: %s", g_be->last_error(b));
  count_split(b);
  decode_rows(b, c, q, n, (size_t)probe * H, H, out1, lse1);
  tt_free(&t_idx);
  g_be->destroy_builder(b);
}

static void run_sparse(uint32_t dtype, uint64_t seed) {
  uint64_t rng = seed;
  cache c;
  cache_make_as(&c, &rng, dtype);
  int32_t *lists = malloc(sizeof(int32_t) * MAXB * SPARSE_TOPK);
  uint16_t *q = malloc((size_t)MAXB * H * 576 * 2);
  int32_t probe_list[SPARSE_TOPK];
  uint16_t probe_q[H * 576];
  ck_assert(lists && q);
  for (int k = 0; k < SPARSE_TOPK; k++)
    probe_list[k] = rng_below(&rng, 10) == 0 ? -1 : (int32_t)rng_below(&rng, PAGES * PS);
  for (int i = 0; i < H * 576; i++)
    probe_q[i] = ref_float_to_bf16((float)(rng_uniform(&rng) * 4.0 - 2.0));
  uint16_t alone[H * 512], got[H * 512];
  float alone_lse[H], got_lse[H];
  g_split_builds = 0;
  decode_sparse(&c, probe_list, probe_q, 1, 0, 1, alone, alone_lse);
  const int32_t least = g_chunk ? (int32_t)g_chunk : 1024; /* top-k positions */
  ck_assert_msg(g_items == (SPARSE_TOPK + least - 1) / least,
                "top-k %d in chunks of %d: %d work items", SPARSE_TOPK, least, g_items);
  for (int t = 0; t < TRIALS; t++) {
    static const int32_t sizes[] = {1, 3, 40, 128, 256};
    /* trial 1 (two units) has the token alone, which splits it: every seed
     * meets both the split and the whole path */
    const int32_t drawn = sizes[rng_below(&rng, 5)], n = t == 1 ? 1 : drawn;
    const int32_t at = (int32_t)rng_below(&rng, (uint32_t)n);
    for (int32_t i = 0; i < n; i++) {
      int32_t *row = lists + (size_t)i * SPARSE_TOPK;
      uint16_t *qr = q + (size_t)i * H * 576;
      if (i == at) {
        memcpy(row, probe_list, sizeof probe_list);
        memcpy(qr, probe_q, sizeof probe_q);
        continue;
      }
      for (int k = 0; k < SPARSE_TOPK; k++)
        row[k] = rng_below(&rng, 4) == 0 ? -1 : (int32_t)rng_below(&rng, PAGES * PS);
      for (int d = 0; d < H * 576; d++)
        qr[d] = ref_float_to_bf16((float)(rng_uniform(&rng) * 4.0 - 2.0));
    }
    decode_sparse(&c, lists, q, n, at, cus[t % 4], got, got_lse);
    ck_assert_msg(memcmp(alone, got, sizeof alone) == 0 && memcmp(alone_lse, got_lse,
                                                                  sizeof alone_lse) == 0,
                  "sparse %s: token at %d of %d, cu_count %u: out or lse differs from alone",
                  dtype_name(dtype), at, n, cus[t % 4]);
  }
  printf("invariance sparse %s: %d batches (1..256 tokens, cu_count 1/2/7/all), chunks of "
         "%d, %d builds split a token\n", dtype_name(dtype), TRIALS, least, g_split_builds);
  ck_assert_msg(g_split_builds > 0, "no build split a token: the test proves too little");
  free(lists);
  free(q);
  cache_free(&c);
}

/* bf16, fp8_ds_mla (DeepSeek V3.2's sparse cache) and fp8_e4m3 */
START_TEST(test_sparse_output_is_independent_of_the_batch) {
  REQUIRE_BACKEND();
  static const uint32_t dtypes[] = {PMLA_DTYPE_BF16, PMLA_DTYPE_FP8_DS_MLA, PMLA_DTYPE_FP8_E4M3};
  run_sparse(dtypes[_i], harness_seed() ^ (0x5a11u + (uint64_t)_i));
}
END_TEST

/* A least chunk of the host's (config.invariant_chunk): requests read in
 * chunks of that size, and the same promise */
START_TEST(test_a_chunk_of_the_hosts_keeps_the_promise) {
  REQUIRE_BACKEND();
  const uint64_t seed = harness_seed() ^ (0xc4u + (uint64_t)_i);
  g_chunk = _i == 1 ? 1024 : 512;
  if (_i == 0)
    run_dense(PMLA_KV_BLOCK_TABLE, seed, PMLA_DTYPE_BF16);
  else if (_i == 1)
    run_dense(PMLA_KV_CSR, seed, PMLA_DTYPE_FP8_E4M3);
  else
    run_sparse(PMLA_DTYPE_BF16, seed);
  g_chunk = 0;
}
END_TEST

/* Top-k lists with chunks that attend nothing (every entry -1): token 0's
 * first two chunks, its fourth and the slots between are empty, token 1's
 * whole list is. An empty chunk folds as nothing: token 0 gives the same
 * bits on 1, 2, 7 and all units and matches the fp64 reference; token 1
 * comes out as an empty request, zeros and lse -inf, however it is split. */
START_TEST(test_empty_chunks_of_a_top_k_list_fold_as_nothing) {
  REQUIRE_BACKEND();
  uint64_t rng = harness_seed() ^ 0xe3c4u;
  g_chunk = 512; /* chunks [0, 512) [512, 1024) [1024, 1536) [1536, 2048) [2048, 2112) */
  cache c;
  cache_make(&c, &rng);
  static int32_t lists[2 * SPARSE_TOPK];
  uint16_t *q = malloc((size_t)2 * H * 576 * 2);
  ck_assert(q);
  for (int k = 0; k < 2 * SPARSE_TOPK; k++)
    lists[k] = -1;
  for (int k = 1024; k < 1536; k += 1 + (int)rng_below(&rng, 3))
    lists[k] = (int32_t)rng_below(&rng, PAGES * PS);
  for (int k = 2048; k < SPARSE_TOPK; k += 2)
    lists[k] = (int32_t)rng_below(&rng, PAGES * PS);
  for (int i = 0; i < 2 * H * 576; i++)
    q[i] = ref_float_to_bf16((float)(rng_uniform(&rng) * 4.0 - 2.0));
  uint16_t first[H * 512], got[H * 512];
  float first_lse[H], got_lse[H];
  for (int u = 0; u < 4; u++) {
    decode_sparse(&c, lists, q, 2, 0, cus[u], u ? got : first, u ? got_lse : first_lse);
    ck_assert_msg(u == 0 || (memcmp(first, got, sizeof got) == 0 &&
                             memcmp(first_lse, got_lse, sizeof got_lse) == 0),
                  "token 0 on %u units: out or lse differs from one unit", cus[u]);
    decode_sparse(&c, lists, q, 2, 1, cus[u], got, got_lse);
    for (int i = 0; i < H * 512; i++)
      ck_assert_msg(got[i] == 0, "token 1 (no slot) on %u units: out[%d] = %g", cus[u], i,
                    (double)ref_bf16_to_float(got[i]));
    for (int h = 0; h < H; h++)
      ck_assert_msg(got_lse[h] == -INFINITY, "token 1 (no slot) on %u units: lse[%d] = %g",
                    cus[u], h, (double)got_lse[h]);
  }
  ref_slot_lists sl;
  ck_assert_int_eq(ref_slots_from_topk(1, SPARSE_TOPK, lists, &sl), 0);
  check_lists(&c, &sl, 1, q, first, first_lse, "token 0");
  ref_slot_lists_free(&sl);
  free(q);
  cache_free(&c);
  g_chunk = 0;
}
END_TEST

/* A request of 20+ chunks: whole on one unit (every fold in the unit's
 * accumulator), split over 2, 7 and 64 units (the reduce folding up to 21
 * pieces, more than it keeps in flight at once) and beside neighbours: the
 * same bits every way, and the whole one matches the fp64 reference. */
START_TEST(test_a_long_request_folds_alike_in_many_pieces) {
  REQUIRE_BACKEND();
  uint64_t rng = harness_seed() ^ 0x10a6u;
  cache c;
  cache_make(&c, &rng);
  static req probe, pool[3];
  req_random(&probe, &rng, 100);
  probe.q_len = 1; /* its first query row only: the fp64 reference stays quick */
  req_set_len(&probe, &rng, 40960 + (int32_t)rng_below(&rng, 4000));
  result whole = result_make((size_t)probe.q_len * H), got = result_make(whole.rows);
  req *one[1] = {&probe};
  decode_batch(&c, one, 1, 0, PMLA_KV_BLOCK_TABLE, 1, whole.out, whole.lse);
  check_reference(&c, &probe, whole.out, whole.lse);
  static const uint32_t units[] = {2, 7, 64};
  g_split_builds = g_max_pieces = 0;
  for (int k = 0; k < 4; k++) {
    req *batch[4];
    int32_t n = 1, at = 0;
    if (k == 3) { /* beside three short neighbours, the probe second */
      for (int i = 0; i < 3; i++)
        req_random(&pool[i], &rng, 3000);
      batch[0] = &pool[0];
      batch[1] = &probe;
      batch[2] = &pool[1];
      batch[3] = &pool[2];
      n = 4;
      at = 1;
    } else {
      batch[0] = &probe;
    }
    const uint32_t cu = k == 3 ? 64 : units[k];
    decode_batch(&c, batch, n, at, PMLA_KV_BLOCK_TABLE, cu, got.out, got.lse);
    ck_assert_msg(result_same(&whole, &got),
                  "kv_len %d over %u units%s: out or lse differs from the request on one unit",
                  probe.kv_len, cu, k == 3 ? " beside neighbours" : "");
    if (k == 3)
      for (int i = 0; i < 3; i++)
        free(pool[i].q);
  }
  ck_assert_msg(g_max_pieces > 8, "the most pieces of the request were %d: the reduce's "
                "pieces in flight were never refilled", g_max_pieces);
  free(probe.q);
  result_free(&whole);
  result_free(&got);
  cache_free(&c);
}
END_TEST

/* flags: unknown bits are refused by name; a 1.0 host's 56-byte config
 * (no flags member) makes a default builder */
START_TEST(test_builder_flags_and_a_1_0_config) {
  REQUIRE_BACKEND();
  pmla_builder_config cfg = harness_config(H, PS, 4, 1, 0, 2);
  cfg.flags = 0x2;
  pmla_builder *b = NULL;
  pmla_status st = g_be->init_builder(&cfg, &b);
  ck_assert_msg(st == PMLA_ERR_INVALID_ARGUMENT && strstr(g_be->last_error(NULL), "flags"),
                "flags 0x2: %s %s", harness_status_name(st), g_be->last_error(NULL));
  cfg.flags = PMLA_BUILDER_BATCH_INVARIANT;
  b = harness_init(&cfg);
  g_be->destroy_builder(b);
  /* invariant_chunk: a multiple of 64 up to 2^20, only with the flag */
  static const struct {
    uint32_t flags, chunk;
    int ok;
  } chunks[] = {{PMLA_BUILDER_BATCH_INVARIANT, 64, 1},
                {PMLA_BUILDER_BATCH_INVARIANT, 1u << 20, 1},
                {PMLA_BUILDER_BATCH_INVARIANT, 100, 0},
                {PMLA_BUILDER_BATCH_INVARIANT, 32, 0},
                {PMLA_BUILDER_BATCH_INVARIANT, (1u << 20) + 64, 0},
                {PMLA_BUILDER_BATCH_INVARIANT, 0xffffffc0u, 0},
                {0, 2048, 0}};
  for (size_t i = 0; i < sizeof chunks / sizeof chunks[0]; i++) {
    cfg.flags = chunks[i].flags;
    cfg.invariant_chunk = chunks[i].chunk;
    b = NULL;
    st = g_be->init_builder(&cfg, &b);
    ck_assert_msg(chunks[i].ok ? st == PMLA_OK
                               : st == PMLA_ERR_INVALID_ARGUMENT && !b &&
                                     strstr(g_be->last_error(NULL), "invariant_chunk"),
                  "invariant_chunk %u, flags 0x%x: %s %s", chunks[i].chunk, chunks[i].flags,
                  harness_status_name(st), chunks[i].ok ? "" : g_be->last_error(NULL));
    g_be->destroy_builder(b);
  }
  cfg.invariant_chunk = 0;
  cfg.flags = 0;
  void *old = harness_sized_copy(&cfg, PMLA_BUILDER_CONFIG_SIZE_1_0);
  b = NULL;
  st = g_be->init_builder(old, &b);
  ck_assert_msg(st == PMLA_OK, "1.0-sized config: %s", g_be->last_error(NULL));
  g_be->destroy_builder(b);
  free(old);
  /* 57..59 bytes hold part of flags: absent, so a default builder (its
   * schedule mode, work_meta_data word 3, is 0, 1 or 3; an invariant one's 2);
   * 60..63 hold flags whole and part of invariant_chunk (absent, 0: an
   * invalid chunk in those bytes is never read) */
  const int32_t qo[2] = {0, 1}, bt[1] = {0}, lens[1] = {5};
  test_tensor t_qo, t_bt, t_lens;
  tt_make1(&t_qo, TT_I32, qo, 2);
  tt_make2(&t_bt, TT_I32, bt, 1, 1);
  tt_make1(&t_lens, TT_I32, lens, 1);
  pmla_decode_batch batch;
  memset(&batch, 0, sizeof batch);
  batch.struct_size = sizeof batch;
  batch.kv_layout = PMLA_KV_BLOCK_TABLE;
  batch.qo_indptr = &t_qo.t;
  batch.block_table = &t_bt.t;
  batch.kv_lens = &t_lens.t;
  batch.stream = harness_stream();
  cfg.flags = PMLA_BUILDER_BATCH_INVARIANT;
  cfg.invariant_chunk = 100;
  const uint32_t with_flags = (uint32_t)offsetof(pmla_builder_config, invariant_chunk);
  for (uint32_t n = PMLA_BUILDER_CONFIG_SIZE_1_0 + 1; n < sizeof cfg; n++) {
    void *p = harness_sized_copy(&cfg, n);
    b = NULL;
    st = g_be->init_builder(p, &b);
    ck_assert_msg(st == PMLA_OK, "%u-byte config: %s", n, g_be->last_error(NULL));
    ck_assert_int_eq(g_be->build_decode(b, &batch), PMLA_OK);
    int32_t meta[PMLA_META_WORDS];
    ck_assert_int_eq(g_be->copy_buffer(b, PMLA_BUF_WORK_META_DATA, meta, sizeof meta), PMLA_OK);
    const int invariant = meta[3] == 2;
    ck_assert_msg(invariant == (n >= with_flags), "%u-byte config: schedule mode %d (flags %s)",
                  n, meta[3], n >= with_flags ? "present" : "absent");
    g_be->destroy_builder(b);
    free(p);
  }
  tt_free(&t_qo);
  tt_free(&t_bt);
  tt_free(&t_lens);
}
END_TEST

Suite *suite_invariance(void) {
  Suite *s = suite_create("invariance");
  TCase *tc = tcase_create("invariance");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_builder_flags_and_a_1_0_config);
  tcase_add_loop_test(tc, test_dense_output_is_independent_of_the_batch, 0, 4);
  tcase_add_loop_test(tc, test_fp8_output_is_independent_of_the_batch, 0, 4);
  tcase_add_loop_test(tc, test_sparse_output_is_independent_of_the_batch, 0, 3);
  tcase_add_loop_test(tc, test_a_chunk_of_the_hosts_keeps_the_promise, 0, 3);
  tcase_add_test(tc, test_empty_chunks_of_a_top_k_list_fold_as_nothing);
  tcase_add_test(tc, test_a_long_request_folds_alike_in_many_pieces);
  suite_add_tcase(s, tc);
  return s;
}
