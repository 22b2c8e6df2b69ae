/* SPDX-License-Identifier: MIT */
/* t_numerics.c - decode output and lse against the double-precision
 * reference (reference.c), dense and sparse.
 *
 * The KV cache is first filled with bf16 NaN (0x7fc0); only the slots a
 * request may read are then written, so reading any other slot (the tail of
 * a last page, an unused block-table entry, a page of another request)
 * poisons the output. Pages are handed out in random order. out and lse are
 * filled with a sentinel before decode so every row must be written. Each
 * build's schedule is also held to pmla.h's layout (schedule.h). The cases
 * themselves are in cases.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "test_config.h"
#include "cases.h"
#include "reference.h"
#include "schedule.h"

#define MAX_BATCH CASE_MAX_BATCH

typedef struct host_bufs {
  uint16_t *q, *kv, *out;
  float *outf, *lse;
  double *ref_out, *ref_lse;
} host_bufs;

static void fill_q(uint16_t *q, size_t n, uint64_t *rng) {
  for (size_t i = 0; i < n; i++)
    q[i] = ref_float_to_bf16((float)(rng_uniform(rng) * 4.0 - 2.0));
}

/* q times a power of two (exact in bf16 for the scales the tests use) */
static void scale_q(uint16_t *q, size_t n, double scale) {
  if (scale == 0.0 || scale == 1.0)
    return;
  for (size_t i = 0; i < n; i++)
    q[i] = ref_float_to_bf16((float)(ref_bf16_to_float(q[i]) * scale));
}

static void fill_row(uint16_t *row, uint64_t *rng) {
  for (int d = 0; d < 576; d++)
    row[d] = ref_float_to_bf16((float)(rng_uniform(rng) * 2.0 - 1.0));
}

/* ---- the KV cache in any kv_dtype: slots poisoned until written ---- */
typedef struct kv_store {
  uint32_t dtype; /* pmla_dtype */
  size_t row_bytes;
  int64_t slots;
  uint8_t *bytes;
  float scale;    /* fp8_e4m3: the cache's kv_scale */
  int float8;     /* fp8_e4m3: hand the cache over as float8_e4m3fn, not uint8 */
} kv_store;

static void kv_store_init(kv_store *kv, uint32_t dtype, int64_t slots, uint64_t *rng) {
  kv->dtype = dtype ? dtype : PMLA_DTYPE_BF16;
  kv->row_bytes = (size_t)test_kv_row_bytes(kv->dtype);
  kv->slots = slots;
  kv->bytes = malloc((size_t)slots * kv->row_bytes + 1);
  ck_assert(kv->bytes);
  /* e4m3 reaches 448: scales near 2^-8 keep values within a few units */
  kv->scale = (float)((0.5 + rng_uniform(rng)) / 256.0);
  kv->float8 = (int)rng_below(rng, 2);
  if (kv->dtype == PMLA_DTYPE_BF16) {
    uint16_t *h = (uint16_t *)(void *)kv->bytes;
    for (size_t i = 0; i < (size_t)slots * 576; i++)
      h[i] = REF_BF16_NAN;
  } else {
    /* e4m3 NaN (0x7f / 0xff) everywhere; for DS_MLA 0xff is also a NaN
     * scale and a NaN bf16 */
    for (size_t i = 0; i < (size_t)slots * kv->row_bytes; i++)
      kv->bytes[i] = (i & 1) ? 0xff : 0x7f;
    if (kv->dtype == PMLA_DTYPE_FP8_DS_MLA)
      memset(kv->bytes, 0xff, (size_t)slots * kv->row_bytes);
  }
}

static void kv_store_fill(kv_store *kv, int64_t slot, uint64_t *rng) {
  uint8_t *row = kv->bytes + (size_t)slot * kv->row_bytes;
  if (kv->dtype == PMLA_DTYPE_BF16) {
    fill_row((uint16_t *)(void *)row, rng);
  } else if (kv->dtype == PMLA_DTYPE_FP8_E4M3) {
    for (int d = 0; d < 576; d++)
      row[d] = rng_e4m3(rng);
  } else {
    for (int d = 0; d < 512; d++)
      row[d] = rng_e4m3(rng);
    for (int t = 0; t < 4; t++) { /* a power of two (as DeepSeek quantises) or not */
      float sc = rng_below(rng, 2) ? ldexpf(1.f, -8 - (int)rng_below(rng, 6))
                                   : (float)((0.01 + rng_uniform(rng)) / 256.0);
      memcpy(row + 512 + 4 * t, &sc, sizeof sc);
    }
    for (int d = 0; d < 64; d++) {
      uint16_t h = ref_float_to_bf16((float)(rng_uniform(rng) * 2.0 - 1.0));
      memcpy(row + 528 + 2 * d, &h, sizeof h);
    }
  }
}

/* The cache as the decode argument: [pages, page_size, W] (or with the
 * 1-head axis), bf16 / uint8 / float8_e4m3fn */
static void kv_store_tensor(const kv_store *kv, test_tensor *t, int64_t pages, int64_t ps,
                            int kv4d) {
  const int64_t w = test_kv_width(kv->dtype);
  const int64_t s3[3] = {pages, ps, w}, s4[4] = {pages, ps, 1, w};
  if (kv->dtype == PMLA_DTYPE_BF16)
    tt_make(t, TT_BF16, kv->bytes, kv4d ? 4 : 3, kv4d ? s4 : s3);
  else
    tt_make(t, kv->float8 && kv->dtype == PMLA_DTYPE_FP8_E4M3 ? 10 : kDLUInt, 8, kv->bytes,
            kv4d ? 4 : 3, kv4d ? s4 : s3);
}

/* the reference's view of the same bytes */
static void kv_store_ref(const kv_store *kv, ref_problem *p) {
  if (kv->dtype == PMLA_DTYPE_BF16) {
    p->kv = (const uint16_t *)(const void *)kv->bytes;
    p->kv_format = REF_KV_BF16;
  } else {
    p->kv = NULL;
    p->kv_bytes = kv->bytes;
    p->kv_format = kv->dtype == PMLA_DTYPE_FP8_E4M3 ? REF_KV_FP8_E4M3 : REF_KV_FP8_DS_MLA;
    p->kv_scale = kv->scale;
  }
}

static void shuffle(int32_t *a, int32_t n, uint64_t *rng) {
  for (int32_t i = n - 1; i > 0; i--) {
    int32_t j = (int32_t)rng_below(rng, (uint32_t)i + 1), t = a[i];
    a[i] = a[j];
    a[j] = t;
  }
}

/* a[0..n) = the pages 0..n - 1 in random order, in runs of `run` pages
 * that lie side by side (run <= 1: each page on its own, the runs' order
 * then being the pages' order) */
static void deal_pages(int32_t *a, int32_t n, int32_t run, uint64_t *rng) {
  if (run < 1)
    run = 1;
  const int32_t runs = (n + run - 1) / run;
  int32_t *order = malloc(sizeof(int32_t) * (size_t)runs);
  ck_assert(order);
  for (int32_t i = 0; i < runs; i++)
    order[i] = i;
  shuffle(order, runs, rng);
  int32_t k = 0;
  for (int32_t i = 0; i < runs; i++)
    for (int32_t j = order[i] * run; j < (order[i] + 1) * run && j < n; j++)
      a[k++] = j;
  free(order);
}

/* Runs decode and compares to the reference; rows marked in nan_rows
 * (token * heads + head; may be NULL) must instead be NaN in every output
 * value and in lse. */
static void decode_and_check(const char *name, pmla_builder *b, const pmla_decode_args *args,
                             test_tensor *out, test_tensor *lse, const ref_problem *p,
                             const uint8_t *nan_rows) {
  size_t no = (size_t)p->tokens * p->heads * 512, nl = (size_t)p->tokens * p->heads;
  uint16_t *ho = malloc(no * 2 + 2);
  float *hof = malloc(no * 4 + 4), *hl = malloc(nl * 4 + 4);
  double *ro = malloc(no * 8 + 8), *rl = malloc(nl * 8 + 8);
  ck_assert(ho && hof && hl && ro && rl);
  for (size_t i = 0; i < no; i++)
    ho[i] = 0x7fa5; /* NaN sentinel: every element must be written */
  for (size_t i = 0; i < nl; i++)
    hl[i] = NAN;
  for (size_t row = 0; nan_rows && row < nl; row++) /* rows due NaN: a finite sentinel */
    if (nan_rows[row]) {
      for (size_t d = 0; d < 512; d++)
        ho[row * 512 + d] = 0x3f80;
      hl[row] = 1e30f;
    }
  tt_upload(out, ho);
  tt_upload(lse, hl);
  pmla_status s = g_be->decode(b, args);
  ck_assert_msg(s == PMLA_OK, "%s: decode returned %s: %s", name, harness_status_name(s),
                g_be->last_error(b));
  uint32_t flags = 0;
  s = g_be->check_device_error(b, &flags);
  ck_assert_msg(s == PMLA_OK && flags == 0, "%s: device error %s flags 0x%x", name,
                harness_status_name(s), flags);
  tt_download(out, ho);
  tt_download(lse, hl);
  for (size_t i = 0; i < no; i++)
    hof[i] = ref_bf16_to_float(ho[i]);
  ck_assert_msg(ref_mla_decode(p, ro, rl) == 0, "%s: reference failed", name);
  for (size_t row = 0; nan_rows && row < nl; row++) {
    if (!nan_rows[row])
      continue;
    for (size_t d = 0; d < 512; d++)
      ck_assert_msg(isnan(hof[row * 512 + d]), "%s: row %zu (token %zu head %zu) dim %zu: "
                    "got %g, want NaN (a NaN in its q or a KV row it sees)", name, row,
                    row / (size_t)p->heads, row % (size_t)p->heads, d, hof[row * 512 + d]);
    ck_assert_msg(isnan(hl[row]), "%s: lse of row %zu (token %zu head %zu): got %g, want NaN",
                  name, row, row / (size_t)p->heads, row % (size_t)p->heads, hl[row]);
    for (size_t d = 0; d < 512; d++) /* checked: the rest is held to the reference */
      hof[row * 512 + d] = 0.f, ro[row * 512 + d] = 0.0;
    hl[row] = 0.f;
    rl[row] = 0.0;
  }
  ref_report r = ref_check_output(ro, hof, no);
  if (!r.ok) {
    size_t e = r.first_bad;
    ck_assert_msg(r.ok, "%s: out (token %zu head %zu dim %zu): %s", name,
                  e / (512 * (size_t)p->heads), (e / 512) % (size_t)p->heads, e % 512,
                  r.message);
  }
  ref_report rl_rep = ref_check_lse(rl, hl, nl);
  ck_assert_msg(rl_rep.ok, "%s: lse (token %zu head %zu): %s", name,
                rl_rep.first_bad / (size_t)p->heads, rl_rep.first_bad % (size_t)p->heads,
                rl_rep.message);
  free(ho);
  free(hof);
  free(hl);
  free(ro);
  free(rl);
}

/* decode's arguments over test tensors, on the harness stream. */
static pmla_decode_args decode_args(test_tensor *q, test_tensor *kv, test_tensor *out,
                                    test_tensor *lse) {
  pmla_decode_args args;
  memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.q = &q->t;
  args.kv_cache = &kv->t;
  args.out = &out->t;
  args.lse = &lse->t;
  args.stream = harness_stream();
  return args;
}

static void run_dense(const dense_case *c, uint64_t seed) {
  uint64_t rng = seed;
  const int32_t B = c->batch, ps = (int32_t)c->page_size;
  int32_t max_q = 1, qo[MAX_BATCH + 1] = {0}, npages[MAX_BATCH], used = 0, maxp = 1;
  for (int32_t r = 0; r < B; r++) {
    qo[r + 1] = qo[r] + c->q_lens[r];
    if (c->q_lens[r] > max_q)
      max_q = c->q_lens[r];
    npages[r] = (c->kv_lens[r] + ps - 1) / ps;
    used += npages[r];
    if (npages[r] + 1 > maxp)
      maxp = npages[r] + 1;
  }
  const int32_t tokens = qo[B], num_pages = used + 3, H = (int32_t)c->heads;
  pmla_builder_config cfg = harness_config(c->heads, c->page_size, (uint32_t)(B > 0 ? B : 1),
                                           (uint32_t)max_q, 0, c->cu);
  cfg.flags |= c->builder_flags;
  if (c->kv_dtype)
    cfg.kv_dtype = c->kv_dtype;
  pmla_builder *b = harness_init(&cfg);

  /* pages in random order (in runs of adjacent pages where the case asks);
   * the 3 spare pages stay NaN */
  int32_t *perm = malloc(sizeof(int32_t) * (size_t)num_pages);
  ck_assert(perm);
  deal_pages(perm, num_pages, c->page_runs, &rng);
  const int32_t spare = perm[used];
  int32_t *bt = malloc(sizeof(int32_t) * (size_t)(B > 0 ? B : 1) * (size_t)maxp);
  int32_t kv_indptr[MAX_BATCH + 1] = {0}, last[MAX_BATCH];
  int32_t *kv_indices = malloc(sizeof(int32_t) * (size_t)(used + 1));
  size_t slots = (size_t)num_pages * (size_t)ps;
  kv_store kv;
  kv_store_init(&kv, c->kv_dtype, (int64_t)slots, &rng);
  ck_assert(perm && bt && kv_indices);
  int32_t at = 0;
  for (int32_t r = 0; r < B; r++) {
    for (int32_t p = 0; p < maxp; p++)
      bt[r * maxp + p] = p < npages[r] ? perm[at + p] : spare;
    for (int32_t p = 0; p < npages[r]; p++)
      kv_indices[at + p] = perm[at + p];
    kv_indptr[r + 1] = kv_indptr[r] + npages[r];
    last[r] = npages[r] ? c->kv_lens[r] - (npages[r] - 1) * ps : 0;
    for (int32_t pos = 0; pos < c->kv_lens[r]; pos++)
      kv_store_fill(&kv, (int64_t)perm[at + pos / ps] * ps + pos % ps, &rng);
    if ((c->nan_at == NAN_IN_KV || c->nan_at == NAN_IN_KV_LATE) && r == 0 &&
        c->kv_lens[0] >= c->q_lens[0] && c->kv_lens[0] > 0) {
      const int32_t pos = c->nan_at == NAN_IN_KV ? 0 : c->kv_lens[0] - c->q_lens[0];
      uint8_t *row =
          kv.bytes + ((size_t)perm[at + pos / ps] * ps + (size_t)(pos % ps)) * kv.row_bytes;
      if (kv.dtype == PMLA_DTYPE_BF16)
        ((uint16_t *)(void *)row)[7] = REF_BF16_NAN;
      else
        row[7] = 0x7f; /* e4m3 NaN */
    }
    at += npages[r];
  }

  test_tensor t_qo, t_bt, t_lens, t_kvp, t_kvi, t_last, t_q, t_kv, t_out, t_lse, t_scale;
  tt_make1(&t_qo, TT_I32, qo, B + 1);
  tt_make2(&t_bt, TT_I32, bt, B, maxp);
  tt_make1(&t_lens, TT_I32, c->kv_lens, B);
  tt_make1(&t_kvp, TT_I32, kv_indptr, B + 1);
  tt_make1(&t_kvi, TT_I32, kv_indices, used);
  tt_make1(&t_last, TT_I32, last, B);
  size_t nq = (size_t)tokens * H * 576;
  uint16_t *q = malloc(nq * 2 + 2);
  fill_q(q, nq, &rng);
  scale_q(q, nq, c->q_scale);
  uint8_t *nan_rows = NULL;
  if (c->nan_at) {
    nan_rows = calloc((size_t)tokens * H, 1);
    ck_assert(nan_rows && tokens > 0 && H > 1);
    if (c->nan_at == NAN_IN_Q) {
      q[(size_t)(0 * H + 1) * 576 + 7] = REF_BF16_NAN;
      nan_rows[1] = 1;
    } else {
      for (int32_t i = 0; i < qo[1] * H; i++)
        nan_rows[i] = 1;
    }
  }
  tt_make3(&t_q, TT_BF16, q, tokens, H, 576);
  kv_store_tensor(&kv, &t_kv, num_pages, ps, c->kv4d);
  tt_make1(&t_scale, TT_F32, &kv.scale, 1);
  tt_make3(&t_out, TT_BF16, NULL, tokens, H, 512);
  tt_make2(&t_lse, TT_F32, NULL, tokens, H);

  pmla_decode_batch batch;
  memset(&batch, 0, sizeof batch);
  batch.struct_size = sizeof batch;
  batch.kv_layout = c->layout;
  batch.stream = harness_stream();
  batch.qo_indptr = &t_qo.t;
  if (c->layout == PMLA_KV_BLOCK_TABLE) {
    batch.block_table = &t_bt.t;
    batch.kv_lens = &t_lens.t;
  } else {
    batch.kv_indptr = &t_kvp.t;
    batch.kv_indices = &t_kvi.t;
    batch.kv_last_page_len = &t_last.t;
  }
  pmla_status s = g_be->build_decode(b, &batch);
  ck_assert_msg(s == PMLA_OK, "%s: build_decode returned %s: %s", c->name,
                harness_status_name(s), g_be->last_error(b));
  /* the schedule keeps pmla.h's layout (whether it splits is the plugin's
   * choice; pmla-unit asserts this plugin splits the expect_split cases) */
  sched_step step = {B, qo, c->kv_lens, 0};
  if (!(c->builder_flags & PMLA_BUILDER_BATCH_INVARIANT)) /* its own layout: t_invariance */
    sched_check(b, &step, c->name);

  ref_slot_lists lists;
  int rc = c->layout == PMLA_KV_BLOCK_TABLE
               ? ref_slots_from_block_table(B, qo, bt, maxp, c->kv_lens, ps, &lists)
               : ref_slots_from_csr(B, qo, kv_indptr, kv_indices, last, ps, &lists);
  ck_assert_int_eq(rc, 0);
  ref_problem p = {tokens, H, q, NULL, (int64_t)slots, &lists, cfg.softmax_scale, 0, NULL, 0};
  kv_store_ref(&kv, &p);
  pmla_decode_args args = decode_args(&t_q, &t_kv, &t_out, &t_lse);
  args.kv_scale = &t_scale.t;
  decode_and_check(c->name, b, &args, &t_out, &t_lse, &p, nan_rows);
  if (c->twice) { /* the next layer: new q, same schedule */
    fill_q(q, nq, &rng);
    scale_q(q, nq, c->q_scale);
    tt_upload(&t_q, q);
    decode_and_check(c->name, b, &args, &t_out, &t_lse, &p,
                     c->nan_at == NAN_IN_Q ? NULL : nan_rows);
  }
  free(nan_rows);
  ref_slot_lists_free(&lists);
  test_tensor *all[] = {&t_qo, &t_bt, &t_lens, &t_kvp, &t_kvi, &t_last, &t_q, &t_kv, &t_out,
                        &t_lse, &t_scale};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    tt_free(all[i]);
  g_be->destroy_builder(b);
  free(perm);
  free(bt);
  free(kv_indices);
  free(kv.bytes);
  free(q);
}

#define BT PMLA_KV_BLOCK_TABLE
#define CSR PMLA_KV_CSR
#define N_DENSE n_dense_cases

START_TEST(test_dense_decode_matches_reference) {
  REQUIRE_BACKEND();
  run_dense(&dense_cases[_i], harness_seed() + (uint64_t)_i * 1000);
}
END_TEST

/* Random shapes: page sizes 1..256, batch 1/3/8, q_len 1..4, ragged and
 * zero lengths, both layouts, cu 1/2/7; half of them with their pages in
 * runs of 64 adjacent pages (a block's slots then often consecutive across
 * pages, and as often not, where a run ends inside it). */
START_TEST(test_dense_decode_matches_reference_on_random_batches) {
  REQUIRE_BACKEND();
  uint64_t rng = harness_seed() ^ (0x9000u + (uint64_t)_i);
  static const uint32_t pages[] = {1, 16, 32, 64, 256}, heads[] = {16, 16, 32, 64};
  static const uint32_t cus[] = {1, 2, 7};
  static const int32_t batches[] = {1, 3, 8};
  dense_case c;
  memset(&c, 0, sizeof c);
  char name[64];
  snprintf(name, sizeof name, "random dense #%d", _i);
  c.name = name;
  c.page_size = pages[rng_below(&rng, 5)];
  c.heads = _i == 5 ? 128 : heads[rng_below(&rng, 4)];
  c.cu = cus[rng_below(&rng, 3)];
  c.layout = rng_below(&rng, 2) ? BT : CSR;
  c.batch = batches[rng_below(&rng, 3)];
  c.twice = _i % 4 == 0;
  c.page_runs = _i % 2 ? 64 : 1;
  int32_t budget = c.heads >= 64 ? 400 : 1500; /* keeps each case well under a second */
  for (int32_t r = 0; r < c.batch; r++) {
    c.q_lens[r] = 1 + (int32_t)rng_below(&rng, 4);
    uint32_t k = rng_below(&rng, 8);
    c.kv_lens[r] = k == 0 ? 0 : k == 1 ? (int32_t)rng_below(&rng, 5) : (int32_t)rng_below(&rng, (uint32_t)budget);
  }
  run_dense(&c, rng);
}
END_TEST

/* A NaN in a query row, or in a KV row that a request's queries see, gives
 * those rows NaN in every output value and in lse (a NaN is never dropped
 * as if the row saw nothing), and every other row stays as the reference
 * has it: whole on one unit or split over seven (cases 0..23: the NaN in
 * the request's first piece), in the default and the batch-invariant mode
 * (whose 5000-token request folds three chunks), at 16 and 128 heads, for
 * bf16 (cases 0..15) and E4M3 (16..23, default mode) caches; then the NaN
 * in the request's last piece (24..27), and split over 132 units (28, 29:
 * few rows, many pieces, which a GPU reduces with a block per row). */
#define N_NAN_CASES 30
START_TEST(test_nan_in_q_or_a_visible_kv_row_gives_nan_rows) {
  REQUIRE_BACKEND();
  int in_kv = _i & 1, split = (_i >> 1) & 1, wide = (_i >> 2) & 1;
  int e4m3 = _i >= 16 && _i < 24, inv = _i < 16 && (_i >> 3) & 1, late = 0, units = 7;
  if (_i >= 24) { /* 24..27: late KV NaN, split; 28, 29: 132 units */
    in_kv = _i < 28 || _i == 29;
    late = in_kv;
    split = 1;
    wide = _i == 25 || _i == 27;
    inv = _i == 26 || _i == 27;
    units = _i >= 28 ? 132 : 7;
  }
  dense_case c;
  memset(&c, 0, sizeof c);
  char name[128];
  c.heads = wide ? 128 : 16;
  c.page_size = split ? 64 : 16;
  c.cu = split ? (uint32_t)units : 1;
  c.layout = _i % 3 ? BT : CSR;
  c.batch = 3;
  c.q_lens[0] = wide ? 1 : 2;
  c.q_lens[1] = c.q_lens[2] = 1;
  c.kv_lens[0] = 5000;
  c.kv_lens[1] = 777;
  c.kv_lens[2] = 40;
  c.kv_dtype = e4m3 ? PMLA_DTYPE_FP8_E4M3 : 0;
  c.nan_at = !in_kv ? NAN_IN_Q : late ? NAN_IN_KV_LATE : NAN_IN_KV;
  c.builder_flags = inv ? PMLA_BUILDER_BATCH_INVARIANT : 0;
  snprintf(name, sizeof name, "nan #%d (in %s, %u unit(s), heads %u, %s, %s)", _i,
           !in_kv ? "q" : late ? "kv, last piece" : "kv, first piece", c.cu, c.heads,
           inv ? "batch-invariant" : "default", e4m3 ? "e4m3" : "bf16");
  c.name = name;
  run_dense(&c, harness_seed() ^ (0xa700u + (uint64_t)_i));
}
END_TEST

/* One request of 2^19 tokens whose KV rows are all one row v (every
 * block-table entry names the same page of copies): the weights are
 * uniform, so out is v and lse is the score + ln L. A backend that adds each
 * token's weighted row into its fp32 output one at a time drifts at this
 * length (pmla-cpu did: max relative error 0.9%, cosine 0.99998894 where
 * 0.99999 is accepted); one block of rows at a time does not. One unit, so
 * the request stays one work item. */
START_TEST(test_a_long_request_of_equal_rows_gives_that_row) {
  REQUIRE_BACKEND();
  enum { H = 16, PS = 64, L = 1 << 19, WIDTH = L / PS };
  uint64_t rng = harness_seed() ^ 0x10a6u;
  pmla_builder_config cfg = harness_config(H, PS, 1, 1, 0, 1);
  pmla_builder *b = harness_init(&cfg);
  uint16_t *page = malloc(sizeof(uint16_t) * PS * 576), *q = malloc(sizeof(uint16_t) * H * 576);
  uint16_t *out = malloc(sizeof(uint16_t) * H * 512);
  int32_t *bt = calloc(WIDTH, sizeof(int32_t)), qo[2] = {0, 1}, lens[1] = {L};
  float lse[H];
  ck_assert(page && q && out && bt);
  fill_row(page, &rng);
  for (int t = 1; t < PS; t++)
    memcpy(page + (size_t)t * 576, page, sizeof(uint16_t) * 576);
  fill_q(q, (size_t)H * 576, &rng);
  test_tensor t_qo, t_bt, t_lens, t_q, t_kv, t_out, t_lse;
  tt_make1(&t_qo, TT_I32, qo, 2);
  tt_make2(&t_bt, TT_I32, bt, 1, WIDTH);
  free(bt);
  tt_make1(&t_lens, TT_I32, lens, 1);
  tt_make3(&t_q, TT_BF16, q, 1, H, 576);
  tt_make3(&t_kv, TT_BF16, page, 1, PS, 576);
  tt_make3(&t_out, TT_BF16, NULL, 1, H, 512);
  tt_make2(&t_lse, TT_F32, NULL, 1, H);
  pmla_decode_batch batch;
  memset(&batch, 0, sizeof batch);
  batch.struct_size = sizeof batch;
  batch.kv_layout = PMLA_KV_BLOCK_TABLE;
  batch.stream = harness_stream();
  batch.qo_indptr = &t_qo.t;
  batch.block_table = &t_bt.t;
  batch.kv_lens = &t_lens.t;
  pmla_status s = g_be->build_decode(b, &batch);
  ck_assert_msg(s == PMLA_OK, "build_decode: %s: %s", harness_status_name(s), g_be->last_error(b));
  pmla_decode_args args = decode_args(&t_q, &t_kv, &t_out, &t_lse);
  s = g_be->decode(b, &args);
  ck_assert_msg(s == PMLA_OK, "decode: %s: %s", harness_status_name(s), g_be->last_error(b));
  uint32_t flags = 1;
  ck_assert_int_eq(g_be->check_device_error(b, &flags), PMLA_OK);
  ck_assert_uint_eq(flags, 0);
  tt_download(&t_out, out);
  tt_download(&t_lse, lse);
  double *want = malloc(sizeof(double) * H * 512), want_lse[H];
  float *got = malloc(sizeof(float) * H * 512);
  ck_assert(want && got);
  for (int h = 0; h < H; h++) {
    double score = 0;
    for (int d = 0; d < 576; d++)
      score += (double)ref_bf16_to_float(q[h * 576 + d]) * ref_bf16_to_float(page[d]);
    want_lse[h] = score * cfg.softmax_scale + log((double)L);
    for (int d = 0; d < 512; d++) {
      want[h * 512 + d] = ref_bf16_to_float(page[d]);
      got[h * 512 + d] = ref_bf16_to_float(out[h * 512 + d]);
    }
  }
  free(page);
  free(q);
  free(out);
  ref_report r = ref_check_output(want, got, (size_t)H * 512);
  ck_assert_msg(r.ok, "out of %d equal rows: %s", L, r.message);
  r = ref_check_lse(want_lse, lse, H);
  ck_assert_msg(r.ok, "lse of %d equal rows: %s", L, r.message);
  test_tensor *all[] = {&t_qo, &t_bt, &t_lens, &t_q, &t_kv, &t_out, &t_lse};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    tt_free(all[i]);
  g_be->destroy_builder(b);
  free(want);
  free(got);
}
END_TEST

static void run_sparse(const sparse_case *c, uint64_t seed);

/* FP8 caches (fp8_e4m3 with a scale, fp8_ds_mla with tile scales), every
 * head count of a set that crosses each row tile, page sizes 1 / 16 / 64,
 * q_len 1..4, block table and CSR; unused slots hold e4m3 NaN. */
static const uint32_t fp8_heads[] = {1, 3, 8, 9, 16, 63, 64, 126, 128};
#define N_FP8_HEADS 9

/* Case i's FP8 layout, head count and page size: i / 2 runs over every
 * head count x page size, i % 2 over both layouts. */
typedef struct fp8_shape {
  uint32_t kv_dtype, heads, page_size;
  const char *dtype_name;
} fp8_shape;

static fp8_shape fp8_shape_of(int i) {
  static const uint32_t pages[] = {1, 16, 64};
  fp8_shape f = {i % 2 ? PMLA_DTYPE_FP8_DS_MLA : PMLA_DTYPE_FP8_E4M3,
                 fp8_heads[(i / 2) % N_FP8_HEADS], pages[(i / 2) / N_FP8_HEADS],
                 i % 2 ? "ds_mla" : "e4m3"};
  return f;
}

START_TEST(test_fp8_dense_decode_matches_reference) {
  REQUIRE_BACKEND();
  uint64_t rng = harness_seed() ^ (0xf800u + (uint64_t)_i);
  static const uint32_t cus[] = {1, 2, 7};
  const fp8_shape f = fp8_shape_of(_i);
  dense_case c;
  memset(&c, 0, sizeof c);
  char name[96];
  c.kv_dtype = f.kv_dtype;
  c.heads = f.heads;
  c.page_size = f.page_size;
  c.layout = (_i / 6) % 2 ? CSR : BT;
  c.cu = cus[rng_below(&rng, 3)];
  c.batch = 1 + (int32_t)rng_below(&rng, 3);
  c.kv4d = (_i / 4) % 2;
  snprintf(name, sizeof name, "fp8 dense #%d (%s, heads %u, page %u, %s)", _i, f.dtype_name,
           c.heads, c.page_size, c.layout == BT ? "block table" : "CSR");
  c.name = name;
  int32_t budget = c.heads >= 64 ? 300 : 900;
  for (int32_t r = 0; r < c.batch; r++) {
    c.q_lens[r] = 1 + (int32_t)((r + _i) % 4);
    c.kv_lens[r] = rng_below(&rng, 6) == 0 ? 0 : 1 + (int32_t)rng_below(&rng, (uint32_t)budget);
  }
  run_dense(&c, rng);
}
END_TEST

/* Query rows far from unit magnitude, on an E4M3 cache (whose kernels may
 * carry q in a narrower format than bf16): tiny rows give near-uniform
 * weights, larger ones sharper ones; the reference is the same either way.
 * Heads 8, 16 and 128 at q_len 1 and 2 give steps of 16, 32 and 256 rows. */
START_TEST(test_fp8_query_rows_of_any_magnitude_match_reference) {
  REQUIRE_BACKEND();
  uint64_t rng = harness_seed() ^ (0xf810u + (uint64_t)_i);
  static const double scales[] = {0x1p-60, 0x1p-20, 0x1p4};
  static const uint32_t heads[] = {16, 128, 8};
  dense_case c;
  memset(&c, 0, sizeof c);
  char name[96];
  c.kv_dtype = PMLA_DTYPE_FP8_E4M3;
  c.heads = heads[_i % 3];
  c.page_size = 64;
  c.layout = BT;
  c.cu = 7;
  c.batch = 2;
  c.q_scale = scales[_i / 3];
  snprintf(name, sizeof name, "fp8 q x %g (heads %u)", c.q_scale, c.heads);
  c.name = name;
  for (int32_t r = 0; r < c.batch; r++) {
    c.q_lens[r] = 1 + r;
    c.kv_lens[r] = 1 + (int32_t)rng_below(&rng, 300);
  }
  run_dense(&c, rng);
}
END_TEST

START_TEST(test_fp8_sparse_decode_matches_reference) {
  REQUIRE_BACKEND();
  uint64_t rng = harness_seed() ^ (0xf900u + (uint64_t)_i);
  static const uint32_t topks[] = {64, 128, 512};
  const fp8_shape f = fp8_shape_of(_i);
  sparse_case c;
  memset(&c, 0, sizeof c);
  char name[96];
  c.kv_dtype = f.kv_dtype;
  c.heads = f.heads;
  c.page_size = f.page_size;
  c.topk = topks[rng_below(&rng, 3)];
  c.cu = 1 + rng_below(&rng, 7);
  c.tokens = 1 + (int32_t)rng_below(&rng, 4);
  c.num_pages = (int32_t)(2048 / c.page_size) + 1;
  c.max_seq_len = 1 + rng_below(&rng, 4096);
  c.hole_pct = 10;
  c.dup_pct = 5;
  snprintf(name, sizeof name, "fp8 sparse #%d (%s, heads %u, page %u, topk %u)", _i,
           f.dtype_name, c.heads, c.page_size, c.topk);
  c.name = name;
  run_sparse(&c, rng);
}
END_TEST

/* ---- sparse ---- */

static void run_sparse(const sparse_case *c, uint64_t seed) {
  uint64_t rng = seed;
  const int32_t T = c->tokens, K = (int32_t)c->topk, H = (int32_t)c->heads;
  const int64_t slots = (int64_t)c->num_pages * c->page_size;
  uint32_t max_q = 2, max_batch = (uint32_t)(T + 1) / 2;
  pmla_builder_config cfg = harness_config(c->heads, c->page_size, max_batch, max_q, c->topk,
                                           c->cu);
  if (c->kv_dtype)
    cfg.kv_dtype = c->kv_dtype;
  pmla_builder *b = harness_init(&cfg);
  int32_t *idx = malloc(sizeof(int32_t) * (size_t)T * (size_t)K);
  kv_store kv;
  kv_store_init(&kv, c->kv_dtype, slots, &rng);
  char *written = calloc((size_t)slots, 1);
  ck_assert(idx && written);
  for (int32_t t = 0; t < T; t++) {
    int32_t *row = idx + (size_t)t * K;
    int32_t valid = c->valid ? c->valid : K;
    for (int32_t k = 0; k < K; k++) {
      if (k >= valid || (c->empty_token0 && t == 0) || (int)rng_below(&rng, 100) < c->hole_pct)
        row[k] = -1;
      else if (k > 0 && (int)rng_below(&rng, 100) < c->dup_pct) {
        int32_t j = row[rng_below(&rng, (uint32_t)k)]; /* a duplicate counts twice */
        row[k] = j >= 0 ? j : (int32_t)rng_below(&rng, (uint32_t)slots);
      } else
        row[k] = (int32_t)rng_below(&rng, (uint32_t)slots);
    }
    shuffle(row, K, &rng); /* valid entries not necessarily first */
    for (int32_t k = 0; k < K; k++)
      if (row[k] >= 0 && !written[row[k]]) {
        written[row[k]] = 1;
        kv_store_fill(&kv, row[k], &rng);
      }
  }
  size_t nq = (size_t)T * H * 576;
  uint16_t *q = malloc(nq * 2);
  fill_q(q, nq, &rng);
  test_tensor t_idx, t_q, t_kv, t_out, t_lse, t_scale;
  tt_make2(&t_idx, TT_I32, idx, T, K);
  tt_make3(&t_q, TT_BF16, q, T, H, 576);
  kv_store_tensor(&kv, &t_kv, c->num_pages, c->page_size, 0);
  tt_make1(&t_scale, TT_F32, &kv.scale, 1);
  tt_make3(&t_out, TT_BF16, NULL, T, H, 512);
  tt_make2(&t_lse, TT_F32, NULL, T, H);
  pmla_sparse_batch sb;
  memset(&sb, 0, sizeof sb);
  sb.struct_size = sizeof sb;
  sb.topk_indices = &t_idx.t;
  sb.max_seq_len = c->max_seq_len;
  sb.flags = c->nocap ? PMLA_SPARSE_NO_SPLIT_CAP : 0;
  sb.stream = harness_stream();
  pmla_status s = g_be->build_sparse(b, &sb);
  ck_assert_msg(s == PMLA_OK, "%s: build_sparse returned %s: %s", c->name,
                harness_status_name(s), g_be->last_error(b));
  /* the schedule keeps pmla.h's layout, no token over a non-zero split_cap;
   * PMLA_SPARSE_NO_SPLIT_CAP reports split_cap 0 (uncapped). The cap's
   * formula is this plugin's (pmla-unit). */
  sched_step step = {T, NULL, NULL, K};
  sched_summary sum = sched_check(b, &step, c->name);
  if (c->nocap)
    ck_assert_msg(sum.split_cap == 0, "%s: PMLA_SPARSE_NO_SPLIT_CAP build reports split_cap %u",
                  c->name, sum.split_cap);

  ref_slot_lists lists;
  ck_assert_int_eq(ref_slots_from_topk(T, K, idx, &lists), 0);
  ref_problem p = {T, H, q, NULL, slots, &lists, cfg.softmax_scale, 0, NULL, 0};
  kv_store_ref(&kv, &p);
  pmla_decode_args args = decode_args(&t_q, &t_kv, &t_out, &t_lse);
  args.kv_scale = &t_scale.t;
  decode_and_check(c->name, b, &args, &t_out, &t_lse, &p, NULL);
  ref_slot_lists_free(&lists);
  test_tensor *all[] = {&t_idx, &t_q, &t_kv, &t_out, &t_lse, &t_scale};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    tt_free(all[i]);
  g_be->destroy_builder(b);
  free(idx);
  free(kv.bytes);
  free(written);
  free(q);
}

#define N_SPARSE n_sparse_cases

START_TEST(test_sparse_decode_matches_reference) {
  REQUIRE_BACKEND();
  run_sparse(&sparse_cases[_i], harness_seed() + 77 + (uint64_t)_i);
}
END_TEST

/* flags other than PMLA_SPARSE_NO_SPLIT_CAP are refused, naming the field. */
START_TEST(test_sparse_unknown_flags_are_refused) {
  REQUIRE_BACKEND();
  pmla_builder_config cfg = harness_config(16, 64, 2, 1, 64, 2);
  pmla_builder *b = harness_init(&cfg);
  int32_t idx[2 * 64];
  for (int i = 0; i < 2 * 64; i++)
    idx[i] = i;
  test_tensor t;
  tt_make2(&t, TT_I32, idx, 2, 64);
  pmla_sparse_batch sb;
  memset(&sb, 0, sizeof sb);
  sb.struct_size = sizeof sb;
  sb.topk_indices = &t.t;
  sb.max_seq_len = 64;
  sb.stream = harness_stream();
  sb.flags = 0x80;
  pmla_status st = g_be->build_sparse(b, &sb);
  ck_assert_msg(st == PMLA_ERR_INVALID_ARGUMENT, "flags 0x80 gave %s", harness_status_name(st));
  ck_assert_msg(strstr(g_be->last_error(b), "flags") != NULL, "message does not name flags: %s",
                g_be->last_error(b));
  sb.flags = PMLA_SPARSE_NO_SPLIT_CAP;
  ck_assert_int_eq(g_be->build_sparse(b, &sb), PMLA_OK);
  ck_assert_uint_eq(harness_query(b).split_cap, 0);
  tt_free(&t);
  g_be->destroy_builder(b);
}
END_TEST

/* One builder alternates dense and sparse steps; each is right. */
START_TEST(test_builder_alternates_dense_and_sparse_steps) {
  REQUIRE_BACKEND();
  dense_case d = {.name = "dense step", .heads = 16, .page_size = 16, .cu = 3, .layout = BT,
                  .batch = 3, .q_lens = {1, 2, 1}, .kv_lens = {40, 130, 7}, .twice = 1};
  sparse_case s = {"sparse step", 16, 16, 512, 3, 4, 64, 1000, 10, 5, 0, 0, 0, 0};
  /* separate builders per run_* call; repeat to catch state carried across
   * builders in the same process */
  for (int i = 0; i < 2; i++) {
    run_dense(&d, harness_seed() + 5 + (uint64_t)i);
    run_sparse(&s, harness_seed() + 6 + (uint64_t)i);
  }
}
END_TEST

Suite *suite_numerics(void) {
  Suite *s = suite_create("numerics");
  TCase *tc = tcase_create("dense");
  tcase_add_loop_test(tc, test_dense_decode_matches_reference, 0, N_DENSE);
  tcase_add_loop_test(tc, test_dense_decode_matches_reference_on_random_batches, 0, 24);
  tcase_add_loop_test(tc, test_nan_in_q_or_a_visible_kv_row_gives_nan_rows, 0, N_NAN_CASES);
  tcase_add_test(tc, test_a_long_request_of_equal_rows_gives_that_row);
  suite_add_tcase(s, tc);
  tc = tcase_create("sparse");
  tcase_add_loop_test(tc, test_sparse_decode_matches_reference, 0, N_SPARSE);
  tcase_add_test(tc, test_sparse_unknown_flags_are_refused);
  tcase_add_test(tc, test_builder_alternates_dense_and_sparse_steps);
  suite_add_tcase(s, tc);
  tc = tcase_create("fp8");
  tcase_add_loop_test(tc, test_fp8_dense_decode_matches_reference, 0, 6 * N_FP8_HEADS);
  tcase_add_loop_test(tc, test_fp8_query_rows_of_any_magnitude_match_reference, 0, 9);
  tcase_add_loop_test(tc, test_fp8_sparse_decode_matches_reference, 0, 6 * N_FP8_HEADS);
  suite_add_tcase(s, tc);
  return s;
}
