/* SPDX-License-Identifier: MIT */
/* t_args.c - build_decode / build_sparse / decode argument checking: every
 * bad argument gets its code, a message, and nothing written to the outputs
 * (out and lse are filled with a sentinel first and must stay intact).
 *
 * Bad values inside index tensors (negative kv_len, page index outside the
 * cache, ...) may be caught either synchronously (an error status, outputs
 * intact) or, as a GPU must, by the kernels through the device error word:
 * then check_device_error returns PMLA_ERR_DEVICE_INPUT with the right bit
 * and clears it. Either way nothing faults. Index tensors in host memory
 * (pmla-cpu) are read before anything is written, so there every bad value
 * is refused. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "reference.h"

#define H 16
#define PS 16
#define MAXB 4
#define MAXQ 2
#define TOPK 64
#define NPAGES 8
#define MAXP 4
#define BATCH 3
#define TOKENS 4
#define OUT_SENTINEL ((uint16_t)0x7e57)
#define LSE_SENTINEL (-12345.0f)

typedef struct fx {
  pmla_builder *b;
  int32_t qo[BATCH + 1], lens[BATCH], bt[BATCH * MAXP];
  int32_t kv_indptr[BATCH + 1], kv_indices[5], last[BATCH];
  int32_t topk[TOKENS * TOPK];
  test_tensor t_qo, t_lens, t_bt, t_kvp, t_kvi, t_last, t_topk;
  test_tensor q, kv, out, lse;
  pmla_decode_batch bt_batch, csr_batch;
  pmla_sparse_batch sparse;
  pmla_decode_args args;
} fx;

static DLDeviceType other_device(void) {
  return g_mem->device_type == kDLCPU ? kDLCUDA : kDLCPU;
}

static void fx_upload_indices(fx *f) {
  tt_upload(&f->t_qo, f->qo);
  tt_upload(&f->t_lens, f->lens);
  tt_upload(&f->t_bt, f->bt);
  tt_upload(&f->t_kvp, f->kv_indptr);
  tt_upload(&f->t_kvi, f->kv_indices);
  tt_upload(&f->t_last, f->last);
  tt_upload(&f->t_topk, f->topk);
}

/* Valid step: q_lens {1, 2, 1}, kv_lens {20, 0, 33}, pages scattered. */
static void fx_setup(fx *f, uint32_t topk) {
  memset(f, 0, sizeof *f);
  pmla_builder_config c = harness_config(H, PS, MAXB, MAXQ, topk, 2);
  f->b = harness_init(&c);
  static const int32_t qo[] = {0, 1, 3, 4}, lens[] = {20, 0, 33};
  static const int32_t bt[] = {1, 5, 0, 0, /**/ 0, 0, 0, 0, /**/ 2, 7, 3, 0};
  static const int32_t kvp[] = {0, 2, 2, 5}, kvi[] = {1, 5, 2, 7, 3}, last[] = {4, 0, 1};
  memcpy(f->qo, qo, sizeof qo);
  memcpy(f->lens, lens, sizeof lens);
  memcpy(f->bt, bt, sizeof bt);
  memcpy(f->kv_indptr, kvp, sizeof kvp);
  memcpy(f->kv_indices, kvi, sizeof kvi);
  memcpy(f->last, last, sizeof last);
  for (int t = 0; t < TOKENS; t++)
    for (int k = 0; k < TOPK; k++)
      f->topk[t * TOPK + k] = (k % 5 == 4) ? -1 : (t * 31 + k * 7) % (NPAGES * PS);
  tt_make1(&f->t_qo, TT_I32, NULL, BATCH + 1);
  tt_make1(&f->t_lens, TT_I32, NULL, BATCH);
  tt_make2(&f->t_bt, TT_I32, NULL, BATCH, MAXP);
  tt_make1(&f->t_kvp, TT_I32, NULL, BATCH + 1);
  tt_make1(&f->t_kvi, TT_I32, NULL, 5);
  tt_make1(&f->t_last, TT_I32, NULL, BATCH);
  tt_make2(&f->t_topk, TT_I32, NULL, TOKENS, TOPK);
  fx_upload_indices(f);

  uint64_t rng = 42;
  size_t nq = (size_t)TOKENS * H * 576, nkv = (size_t)NPAGES * PS * 576;
  uint16_t *hq = malloc(nq * 2), *hkv = malloc(nkv * 2);
  ck_assert(hq && hkv);
  for (size_t i = 0; i < nq; i++)
    hq[i] = ref_float_to_bf16((float)(rng_uniform(&rng) * 2 - 1));
  for (size_t i = 0; i < nkv; i++)
    hkv[i] = ref_float_to_bf16((float)(rng_uniform(&rng) * 2 - 1));
  tt_make3(&f->q, TT_BF16, hq, TOKENS, H, 576);
  tt_make3(&f->kv, TT_BF16, hkv, NPAGES, PS, 576);
  tt_make3(&f->out, TT_BF16, NULL, TOKENS, H, 512);
  tt_make2(&f->lse, TT_F32, NULL, TOKENS, H);
  free(hq);
  free(hkv);

  f->bt_batch.struct_size = sizeof f->bt_batch;
  f->bt_batch.kv_layout = PMLA_KV_BLOCK_TABLE;
  f->bt_batch.qo_indptr = &f->t_qo.t;
  f->bt_batch.block_table = &f->t_bt.t;
  f->bt_batch.kv_lens = &f->t_lens.t;
  f->csr_batch.struct_size = sizeof f->csr_batch;
  f->csr_batch.kv_layout = PMLA_KV_CSR;
  f->csr_batch.qo_indptr = &f->t_qo.t;
  f->csr_batch.kv_indptr = &f->t_kvp.t;
  f->csr_batch.kv_indices = &f->t_kvi.t;
  f->csr_batch.kv_last_page_len = &f->t_last.t;
  f->sparse.struct_size = sizeof f->sparse;
  f->sparse.topk_indices = &f->t_topk.t;
  f->sparse.max_seq_len = 100;
  f->args.struct_size = sizeof f->args;
  f->args.q = &f->q.t;
  f->args.kv_cache = &f->kv.t;
  f->args.out = &f->out.t;
  f->args.lse = &f->lse.t;
  f->bt_batch.stream = f->csr_batch.stream = f->sparse.stream = f->args.stream =
      harness_stream();
}

static void fx_teardown(fx *f) {
  g_be->destroy_builder(f->b);
  test_tensor *all[] = {&f->t_qo, &f->t_lens, &f->t_bt, &f->t_kvp, &f->t_kvi, &f->t_last,
                        &f->t_topk, &f->q, &f->kv, &f->out, &f->lse};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    tt_free(all[i]);
}

static void fx_poison_outputs(fx *f) {
  uint16_t o[TOKENS * H * 512];
  float l[TOKENS * H];
  for (size_t i = 0; i < sizeof o / sizeof o[0]; i++)
    o[i] = OUT_SENTINEL;
  for (size_t i = 0; i < sizeof l / sizeof l[0]; i++)
    l[i] = LSE_SENTINEL;
  tt_upload(&f->out, o);
  tt_upload(&f->lse, l);
}

/* out and lse still hold fx_poison_outputs' sentinels from query token
 * `from` on */
static int fx_rows_intact(const fx *f, int from) {
  uint16_t o[TOKENS * H * 512];
  float l[TOKENS * H];
  tt_download(&f->out, o);
  tt_download(&f->lse, l);
  for (size_t i = (size_t)from * H * 512; i < sizeof o / sizeof o[0]; i++)
    if (o[i] != OUT_SENTINEL)
      return 0;
  for (size_t i = (size_t)from * H; i < sizeof l / sizeof l[0]; i++)
    if (l[i] != LSE_SENTINEL)
      return 0;
  return 1;
}

static int fx_outputs_intact(const fx *f) { return fx_rows_intact(f, 0); }

static void expect_status(pmla_status got, pmla_status want, const fx *f, const char *what) {
  ck_assert_msg(got == want, "%s: got %s, want %s (%s)", what, harness_status_name(got),
                harness_status_name(want), f->b ? g_be->last_error(f->b) : "");
  if (want != PMLA_OK) {
    const char *m = g_be->last_error(f->b);
    ck_assert_msg(m && m[0], "%s: failed without a last_error message", what);
  }
}

/* decode with `args`, expecting `want` and untouched outputs. */
static void expect_decode_fails(fx *f, const pmla_decode_args *args, pmla_status want,
                                const char *what) {
  fx_poison_outputs(f);
  expect_status(g_be->decode(f->b, args), want, f, what);
  ck_assert_msg(fx_outputs_intact(f), "%s: outputs written although decode failed", what);
}

/* ---- state ---- */

START_TEST(test_decode_before_any_build_is_bad_state) {
  REQUIRE_BACKEND();
  fx f;
  fx_setup(&f, 0);
  expect_decode_fails(&f, &f.args, PMLA_ERR_BAD_STATE, "decode before build");
  fx_teardown(&f);
}
END_TEST

/* A failed build leaves no step behind: decode refuses until a build succeeds. */
START_TEST(test_failed_build_leaves_no_step) {
  REQUIRE_BACKEND();
  fx f;
  fx_setup(&f, 0);
  expect_status(g_be->build_decode(f.b, &f.bt_batch), PMLA_OK, &f, "first build");
  pmla_decode_batch bad = f.bt_batch;
  bad.kv_layout = 77;
  expect_status(g_be->build_decode(f.b, &bad), PMLA_ERR_INVALID_ARGUMENT, &f, "bad kv_layout");
  expect_decode_fails(&f, &f.args, PMLA_ERR_BAD_STATE, "decode after a failed build");
  expect_status(g_be->build_decode(f.b, &f.bt_batch), PMLA_OK, &f, "rebuild");
  expect_status(g_be->decode(f.b, &f.args), PMLA_OK, &f, "decode after the rebuild");
  fx_teardown(&f);
}
END_TEST

START_TEST(test_valid_fixture_builds_and_decodes) {
  REQUIRE_BACKEND();
  fx f;
  fx_setup(&f, TOPK);
  expect_status(g_be->build_decode(f.b, &f.bt_batch), PMLA_OK, &f, "block-table build");
  expect_status(g_be->decode(f.b, &f.args), PMLA_OK, &f, "decode");
  expect_status(g_be->build_decode(f.b, &f.csr_batch), PMLA_OK, &f, "CSR build");
  f.args.lse = NULL; /* lse is optional */
  expect_status(g_be->decode(f.b, &f.args), PMLA_OK, &f, "decode without lse");
  /* a [pages, page_size, 1, 576] cache is the same cache */
  DLTensor kv4 = f.kv.t;
  int64_t s4[4] = {NPAGES, PS, 1, 576};
  kv4.ndim = 4;
  kv4.shape = s4;
  f.args.kv_cache = &kv4;
  expect_status(g_be->decode(f.b, &f.args), PMLA_OK, &f, "decode with a 4-d cache");
  f.args.kv_cache = &f.kv.t;
  f.args.lse = &f.lse.t;
  expect_status(g_be->build_sparse(f.b, &f.sparse), PMLA_OK, &f, "sparse build");
  expect_status(g_be->decode(f.b, &f.args), PMLA_OK, &f, "sparse decode");
  uint32_t flags = 1;
  expect_status(g_be->check_device_error(f.b, &flags), PMLA_OK, &f, "check_device_error");
  ck_assert_uint_eq(flags, 0);
  fx_teardown(&f);
}
END_TEST

/* ---- build_decode: structural errors ---- */

START_TEST(test_build_decode_rejects_null_and_struct_size) {
  REQUIRE_BACKEND();
  fx f;
  fx_setup(&f, 0);
  ck_assert_int_eq(g_be->build_decode(NULL, &f.bt_batch), PMLA_ERR_INVALID_ARGUMENT);
  expect_status(g_be->build_decode(f.b, NULL), PMLA_ERR_INVALID_ARGUMENT, &f, "NULL batch");
  pmla_decode_batch small = f.bt_batch;
  small.struct_size = offsetof(pmla_decode_batch, stream);
  expect_status(g_be->build_decode(f.b, &small), PMLA_ERR_STRUCT_SIZE, &f, "small struct_size");
  small.struct_size = 0;
  expect_status(g_be->build_decode(f.b, &small), PMLA_ERR_STRUCT_SIZE, &f, "struct_size 0");
  struct {
    pmla_decode_batch b;
    unsigned char tail[40];
  } big;
  memset(&big, 0, sizeof big);
  big.b = f.bt_batch;
  big.b.struct_size = sizeof big;
  expect_status(g_be->build_decode(f.b, &big.b), PMLA_OK, &f, "larger struct_size");
  fx_teardown(&f);
}
END_TEST

/* Each row breaks one thing about the index tensors. */
typedef struct batch_mut {
  const char *what;
  int csr;
  pmla_status want;
} batch_mut;

static const batch_mut batch_muts[] = {
    {"kv_layout 0", 0, PMLA_ERR_INVALID_ARGUMENT},
    {"kv_layout 3", 0, PMLA_ERR_INVALID_ARGUMENT},
    {"qo_indptr NULL", 0, PMLA_ERR_INVALID_ARGUMENT},
    {"qo_indptr float32", 0, PMLA_ERR_INVALID_ARGUMENT},
    {"qo_indptr int64", 0, PMLA_ERR_INVALID_ARGUMENT},
    {"qo_indptr 2 lanes", 0, PMLA_ERR_INVALID_ARGUMENT},
    {"qo_indptr 2-d", 0, PMLA_ERR_INVALID_ARGUMENT},
    {"qo_indptr on the wrong device type", 0, PMLA_ERR_INVALID_ARGUMENT},
    {"qo_indptr data NULL", 0, PMLA_ERR_INVALID_ARGUMENT},
    {"block_table NULL", 0, PMLA_ERR_INVALID_ARGUMENT},
    {"block_table 1-d", 0, PMLA_ERR_INVALID_ARGUMENT},
    {"block_table rows != batch", 0, PMLA_ERR_INVALID_ARGUMENT},
    {"block_table uint32", 0, PMLA_ERR_INVALID_ARGUMENT},
    {"block_table non-contiguous strides", 0, PMLA_ERR_INVALID_ARGUMENT},
    {"block_table on the wrong device type", 0, PMLA_ERR_INVALID_ARGUMENT},
    {"kv_lens NULL", 0, PMLA_ERR_INVALID_ARGUMENT},
    {"kv_lens length != batch", 0, PMLA_ERR_INVALID_ARGUMENT},
    {"kv_lens float32", 0, PMLA_ERR_INVALID_ARGUMENT},
    {"kv_indptr NULL", 1, PMLA_ERR_INVALID_ARGUMENT},
    {"kv_indptr length != batch + 1", 1, PMLA_ERR_INVALID_ARGUMENT},
    {"kv_indices NULL", 1, PMLA_ERR_INVALID_ARGUMENT},
    {"kv_indices int64", 1, PMLA_ERR_INVALID_ARGUMENT},
    {"kv_last_page_len NULL", 1, PMLA_ERR_INVALID_ARGUMENT},
    {"kv_last_page_len length != batch", 1, PMLA_ERR_INVALID_ARGUMENT},
    {"kv_indices on the wrong device type", 1, PMLA_ERR_INVALID_ARGUMENT},
    {"kv_lens shape NULL", 0, PMLA_ERR_INVALID_ARGUMENT},
    {"qo_indptr of a negative length", 0, PMLA_ERR_INVALID_ARGUMENT},
};
#define N_BATCH_MUTS ((int)(sizeof batch_muts / sizeof batch_muts[0]))

START_TEST(test_build_decode_rejects_malformed_index_tensors) {
  REQUIRE_BACKEND();
  fx f;
  fx_setup(&f, 0);
  const batch_mut *m = &batch_muts[_i];
  pmla_decode_batch b = m->csr ? f.csr_batch : f.bt_batch;
  DLTensor qo = f.t_qo.t, bt = f.t_bt.t, lens = f.t_lens.t, kvp = f.t_kvp.t, kvi = f.t_kvi.t,
           last = f.t_last.t;
  int64_t s2[2] = {BATCH + 1, 1}, s1[1] = {MAXP * BATCH}, rows2[2] = {BATCH - 1, MAXP},
          len2[1] = {BATCH - 1}, lenp[1] = {BATCH + 2}, strides[2] = {1, BATCH}, neg[1] = {-4};
  switch (_i) {
  case 0: b.kv_layout = 0; break;
  case 1: b.kv_layout = 3; break;
  case 2: b.qo_indptr = NULL; break;
  case 3: qo.dtype.code = kDLFloat; break;
  case 4: qo.dtype.bits = 64; break;
  case 5: qo.dtype.lanes = 2; break;
  case 6: qo.ndim = 2; qo.shape = s2; break;
  case 7: qo.device.device_type = other_device(); break;
  case 8: qo.data = NULL; break;
  case 9: b.block_table = NULL; break;
  case 10: bt.ndim = 1; bt.shape = s1; break;
  case 11: bt.shape = rows2; break;
  case 12: bt.dtype.code = kDLUInt; break;
  case 13: bt.strides = strides; break;
  case 14: bt.device.device_type = other_device(); break;
  case 15: b.kv_lens = NULL; break;
  case 16: lens.shape = len2; break;
  case 17: lens.dtype.code = kDLFloat; break;
  case 18: b.kv_indptr = NULL; break;
  case 19: kvp.shape = lenp; break;
  case 20: b.kv_indices = NULL; break;
  case 21: kvi.dtype.bits = 64; break;
  case 22: b.kv_last_page_len = NULL; break;
  case 23: last.shape = len2; break;
  case 24: kvi.device.device_type = other_device(); break;
  case 25: lens.shape = NULL; break;
  case 26: qo.shape = neg; break;
  }
  if (b.qo_indptr)
    b.qo_indptr = &qo;
  if (b.block_table)
    b.block_table = &bt;
  if (b.kv_lens)
    b.kv_lens = &lens;
  if (b.kv_indptr)
    b.kv_indptr = &kvp;
  if (b.kv_indices)
    b.kv_indices = &kvi;
  if (b.kv_last_page_len)
    b.kv_last_page_len = &last;
  expect_status(g_be->build_decode(f.b, &b), m->want, &f, m->what);
  if (_i == 25)
    ck_assert_msg(strstr(g_be->last_error(f.b), "batch->kv_lens: ndim = 1, shape NULL"),
                  "message '%s' does not say the shape is NULL", g_be->last_error(f.b));
  if (_i == 26) /* the value given, not the wildcard of an accepted shape */
    ck_assert_msg(strstr(g_be->last_error(f.b), "shape [-4] (dim 0)"),
                  "message '%s' does not give the shape", g_be->last_error(f.b));
  fx_teardown(&f);
}
END_TEST

START_TEST(test_build_decode_rejects_batch_over_max_batch) {
  REQUIRE_BACKEND();
  fx f;
  fx_setup(&f, 0);
  int32_t qo[MAXB + 2], lens[MAXB + 1], bt[(MAXB + 1) * MAXP] = {0};
  for (int i = 0; i <= MAXB + 1; i++)
    qo[i] = i;
  for (int i = 0; i <= MAXB; i++)
    lens[i] = 1;
  test_tensor tq, tl, tb;
  tt_make1(&tq, TT_I32, qo, MAXB + 2);
  tt_make1(&tl, TT_I32, lens, MAXB + 1);
  tt_make2(&tb, TT_I32, bt, MAXB + 1, MAXP);
  pmla_decode_batch b = f.bt_batch;
  b.qo_indptr = &tq.t;
  b.kv_lens = &tl.t;
  b.block_table = &tb.t;
  expect_status(g_be->build_decode(f.b, &b), PMLA_ERR_CAPACITY, &f, "batch max_batch + 1");
  ck_assert_msg(strstr(g_be->last_error(f.b), "max_batch") || strstr(g_be->last_error(f.b), "batch"),
                "capacity message '%s' does not mention the batch", g_be->last_error(f.b));
  /* batch 0 is valid */
  int64_t one[1] = {1}, zero[1] = {0}, zero2[2] = {0, MAXP};
  tq.t.shape = one;
  tl.t.shape = zero;
  tb.t.shape = zero2;
  expect_status(g_be->build_decode(f.b, &b), PMLA_OK, &f, "batch 0");
  tt_free(&tq);
  tt_free(&tl);
  tt_free(&tb);
  fx_teardown(&f);
}
END_TEST

/* A batch of no requests still names its first query row: a negative
 * qo_indptr[0] is refused by a backend that reads the indices on the host,
 * naming the entry (its loop over requests does not reach it); a device
 * backend's step of no requests reads and writes nothing. */
START_TEST(test_batch_0_with_a_negative_first_row_is_refused) {
  REQUIRE_BACKEND();
  fx f;
  fx_setup(&f, 0);
  int32_t qo[1] = {-5}, lens[1] = {0}, bt[MAXP] = {0};
  test_tensor tq, tl, tb;
  tt_make1(&tq, TT_I32, qo, 1);
  tt_make1(&tl, TT_I32, lens, 1);
  tt_make2(&tb, TT_I32, bt, 1, MAXP);
  int64_t zero[1] = {0}, zero2[2] = {0, MAXP};
  tl.t.shape = zero;
  tb.t.shape = zero2;
  pmla_decode_batch b = f.bt_batch;
  b.qo_indptr = &tq.t;
  b.kv_lens = &tl.t;
  b.block_table = &tb.t;
  pmla_status s = g_be->build_decode(f.b, &b);
  if (s != PMLA_OK || g_mem->device_type == kDLCPU) {
    expect_status(s, PMLA_ERR_INVALID_ARGUMENT, &f, "batch 0, qo_indptr {-5}");
    ck_assert_msg(strstr(g_be->last_error(f.b), "qo_indptr[0] = -5"), "message '%s'",
                  g_be->last_error(f.b));
  }
  qo[0] = 0;
  tt_upload(&tq, qo);
  expect_status(g_be->build_decode(f.b, &b), PMLA_OK, &f, "batch 0, qo_indptr {0}");
  tt_free(&tq);
  tt_free(&tl);
  tt_free(&tb);
  fx_teardown(&f);
}
END_TEST

/* ---- bad values inside index tensors ---- */

typedef struct value_case {
  const char *what;
  int kind; /* 0 block table, 1 CSR, 2 sparse */
  uint32_t bit;
} value_case;

static const value_case value_cases[] = {
    {"negative kv_len", 0, PMLA_DEVERR_KV_LEN},
    {"kv_len beyond the block table", 0, PMLA_DEVERR_KV_LEN},
    {"block table page index == num pages", 0, PMLA_DEVERR_PAGE_INDEX},
    {"block table page index -1 inside kv_len", 0, PMLA_DEVERR_PAGE_INDEX},
    {"qo_indptr not monotone", 0, PMLA_DEVERR_QO_INDPTR},
    {"q_len > max_q_len", 0, PMLA_DEVERR_QO_INDPTR},
    {"CSR last_page_len 0", 1, PMLA_DEVERR_LAST_PAGE},
    {"CSR last_page_len > page_size", 1, PMLA_DEVERR_LAST_PAGE},
    {"CSR page index outside the cache", 1, PMLA_DEVERR_PAGE_INDEX},
    {"CSR kv_indptr not monotone", 1, PMLA_DEVERR_KV_LEN},
    {"CSR kv_indptr beyond kv_indices", 1, PMLA_DEVERR_KV_LEN},
    {"sparse slot == num slots", 2, PMLA_DEVERR_SLOT_INDEX},
    {"sparse slot -2", 2, PMLA_DEVERR_SLOT_INDEX},
    {"sparse slot INT32_MAX", 2, PMLA_DEVERR_SLOT_INDEX},
};
#define N_VALUE_CASES ((int)(sizeof value_cases / sizeof value_cases[0]))

START_TEST(test_bad_index_values_are_reported_never_faulted) {
  REQUIRE_BACKEND();
  fx f;
  fx_setup(&f, TOPK);
  const value_case *c = &value_cases[_i];
  switch (_i) {
  case 0: f.lens[0] = -1; break;
  case 1: f.lens[2] = MAXP * PS + 1; break;
  case 2: f.bt[2 * MAXP + 1] = NPAGES; break;
  case 3: f.bt[0 * MAXP + 1] = -1; break;
  case 4: f.qo[1] = 3; f.qo[2] = 1; break;
  case 5: f.qo[1] = 0; break; /* request 1 gets rows [0, 3): 3 > MAXQ */
  case 6: f.last[0] = 0; break;
  case 7: f.last[2] = PS + 1; break;
  case 8: f.kv_indices[3] = NPAGES + 100; break;
  case 9: f.kv_indptr[1] = 3; f.kv_indptr[2] = 1; break;
  case 10: f.kv_indptr[3] = 6; break;
  case 11: f.topk[1 * TOPK + 3] = NPAGES * PS; break;
  case 12: f.topk[2 * TOPK + 0] = -2; break;
  case 13: f.topk[3 * TOPK + 9] = INT32_MAX; break;
  }
  fx_upload_indices(&f);
  pmla_status s;
  if (c->kind == 2)
    s = g_be->build_sparse(f.b, &f.sparse);
  else
    s = g_be->build_decode(f.b, c->kind ? &f.csr_batch : &f.bt_batch);
  if (s != PMLA_OK) {
    ck_assert_msg(s == PMLA_ERR_INVALID_ARGUMENT || s == PMLA_ERR_DEVICE_INPUT,
                  "%s: build returned %s", c->what, harness_status_name(s));
    ck_assert_msg(g_be->last_error(f.b)[0], "%s: build failed without a message", c->what);
    fx_teardown(&f);
    return;
  }
  fx_poison_outputs(&f);
  s = g_be->decode(f.b, &f.args);
  if (s != PMLA_OK) {
    ck_assert_msg(s == PMLA_ERR_INVALID_ARGUMENT || s == PMLA_ERR_DEVICE_INPUT,
                  "%s: decode returned %s (%s)", c->what, harness_status_name(s),
                  g_be->last_error(f.b));
    ck_assert_msg(fx_outputs_intact(&f), "%s: decode failed but wrote outputs", c->what);
    ck_assert_msg(g_be->last_error(f.b)[0], "%s: decode failed without a message", c->what);
    fx_teardown(&f);
    return;
  }
  ck_assert_msg(g_mem->device_type != kDLCPU,
                "%s: decoded from index tensors in host memory, which a backend reads before "
                "it writes: refused with a message expected",
                c->what);
  uint32_t flags = 0;
  s = g_be->check_device_error(f.b, &flags);
  ck_assert_msg(s == PMLA_ERR_DEVICE_INPUT,
                "%s: accepted by build and decode, check_device_error says %s (flags 0x%x)",
                c->what, harness_status_name(s), flags);
  ck_assert_msg(flags & c->bit, "%s: device error flags 0x%x lack bit 0x%x", c->what, flags,
                c->bit);
  s = g_be->check_device_error(f.b, &flags);
  ck_assert_msg(s == PMLA_OK && flags == 0, "%s: error word not cleared (%s, 0x%x)", c->what,
                harness_status_name(s), flags);
  fx_teardown(&f);
}
END_TEST

/* ---- build_sparse ---- */

START_TEST(test_build_sparse_rejects_bad_arguments) {
  REQUIRE_BACKEND();
  fx f;
  fx_setup(&f, TOPK);
  pmla_sparse_batch sb = f.sparse;
  DLTensor t = f.t_topk.t;
  sb.topk_indices = &t;
  int64_t wrong_k[2] = {TOKENS, TOPK / 2}, s1[1] = {TOKENS * TOPK};

  ck_assert_int_eq(g_be->build_sparse(NULL, &sb), PMLA_ERR_INVALID_ARGUMENT);
  expect_status(g_be->build_sparse(f.b, NULL), PMLA_ERR_INVALID_ARGUMENT, &f, "NULL batch");
  sb.struct_size = offsetof(pmla_sparse_batch, stream);
  expect_status(g_be->build_sparse(f.b, &sb), PMLA_ERR_STRUCT_SIZE, &f, "small struct_size");
  sb.struct_size = sizeof sb;
  t.shape = wrong_k;
  expect_status(g_be->build_sparse(f.b, &sb), PMLA_ERR_INVALID_ARGUMENT, &f,
                "topk dim != config topk");
  ck_assert_msg(strstr(g_be->last_error(f.b), "topk"), "message '%s' does not name topk",
                g_be->last_error(f.b));
  t = f.t_topk.t;
  t.ndim = 1;
  t.shape = s1;
  expect_status(g_be->build_sparse(f.b, &sb), PMLA_ERR_INVALID_ARGUMENT, &f, "1-d topk");
  t = f.t_topk.t;
  t.dtype.bits = 64;
  expect_status(g_be->build_sparse(f.b, &sb), PMLA_ERR_INVALID_ARGUMENT, &f, "int64 topk");
  t = f.t_topk.t;
  t.device.device_type = other_device();
  expect_status(g_be->build_sparse(f.b, &sb), PMLA_ERR_INVALID_ARGUMENT, &f,
                "topk on the wrong device type");
  t = f.t_topk.t;
  sb.topk_indices = NULL;
  expect_status(g_be->build_sparse(f.b, &sb), PMLA_ERR_INVALID_ARGUMENT, &f, "NULL topk");
  sb.topk_indices = &t;
  sb.max_seq_len = -1;
  expect_status(g_be->build_sparse(f.b, &sb), PMLA_ERR_INVALID_ARGUMENT, &f,
                "negative max_seq_len");
  sb.max_seq_len = 100;

  /* more tokens than max_batch * max_q_len */
  int32_t *many = calloc((size_t)(MAXB * MAXQ + 1) * TOPK, sizeof(int32_t));
  test_tensor tm;
  tt_make2(&tm, TT_I32, many, MAXB * MAXQ + 1, TOPK);
  sb.topk_indices = &tm.t;
  expect_status(g_be->build_sparse(f.b, &sb), PMLA_ERR_CAPACITY, &f, "tokens > R");
  /* exactly R tokens fits */
  int64_t r_rows[2] = {MAXB * MAXQ, TOPK};
  tm.t.shape = r_rows;
  expect_status(g_be->build_sparse(f.b, &sb), PMLA_OK, &f, "tokens == R");
  tt_free(&tm);
  free(many);

  /* decode after sparse build: q rows must equal the tokens of the build */
  sb.topk_indices = &f.t_topk.t;
  expect_status(g_be->build_sparse(f.b, &sb), PMLA_OK, &f, "valid sparse build");
  DLTensor q = f.q.t;
  int64_t qs[3] = {TOKENS - 1, H, 576};
  q.shape = qs;
  pmla_decode_args a = f.args;
  a.q = &q;
  expect_decode_fails(&f, &a, PMLA_ERR_INVALID_ARGUMENT, "sparse decode with fewer q rows");
  /* and with out and lse of as few rows, agreeing with q but not the build */
  DLTensor out = f.out.t, lse = f.lse.t;
  int64_t os[3] = {TOKENS - 1, H, 512}, ls[2] = {TOKENS - 1, H};
  out.shape = os;
  lse.shape = ls;
  a.out = &out;
  a.lse = &lse;
  expect_decode_fails(&f, &a, PMLA_ERR_INVALID_ARGUMENT, "sparse q, out and lse of fewer rows");
  fx_teardown(&f);
}
END_TEST

START_TEST(test_build_sparse_refused_on_a_dense_only_builder) {
  REQUIRE_BACKEND();
  fx f;
  fx_setup(&f, 0);
  static const pmla_status ok[] = {PMLA_ERR_BAD_STATE, PMLA_ERR_INVALID_ARGUMENT,
                                   PMLA_ERR_UNSUPPORTED};
  pmla_status s = g_be->build_sparse(f.b, &f.sparse);
  ck_assert_msg(harness_status_in(s, ok, 3),
                "build_sparse on a topk 0 builder returned %s, want BAD_STATE, "
                "INVALID_ARGUMENT or UNSUPPORTED",
                harness_status_name(s));
  ck_assert_msg(strstr(g_be->last_error(f.b), "topk"), "message '%s' does not name topk",
                g_be->last_error(f.b));
  fx_teardown(&f);
}
END_TEST

/* ---- decode ---- */

START_TEST(test_decode_rejects_bad_arguments_and_writes_nothing) {
  REQUIRE_BACKEND();
  fx f;
  fx_setup(&f, 0);
  expect_status(g_be->build_decode(f.b, &f.bt_batch), PMLA_OK, &f, "build");
  pmla_decode_args a;
  DLTensor q, kv, out, lse;
  int64_t q_tok[3] = {TOKENS + 1, H, 576}, q_heads[3] = {TOKENS, 2 * H, 576},
          q_dim[3] = {TOKENS, H, 512}, q2[2] = {TOKENS, H * 576};
  int64_t kv_dim[3] = {NPAGES, PS, 512}, kv_ps[3] = {NPAGES * 2, PS / 2, 576},
          kv4[4] = {NPAGES, PS, 2, 576}, kv_strides[3] = {PS * 576, 1, PS},
          kv5[5] = {NPAGES, PS, 1, 1, 576};
  int64_t out_tok[3] = {TOKENS - 1, H, 512}, out_dim[3] = {TOKENS, H, 576},
          out_strides[3] = {H * 512, 1, H};
  int64_t lse_h[2] = {TOKENS, H / 2}, lse_tok[2] = {TOKENS - 1, H},
          q_less[3] = {TOKENS - 1, H, 576};
  for (int i = 0;; i++) {
    a = f.args;
    q = f.q.t;
    kv = f.kv.t;
    out = f.out.t;
    lse = f.lse.t;
    a.q = &q;
    a.kv_cache = &kv;
    a.out = &out;
    a.lse = &lse;
    pmla_status want = PMLA_ERR_INVALID_ARGUMENT;
    const char *what;
    pmla_decode_args *pa = &a;
    switch (i) {
    case 0: what = "NULL args"; pa = NULL; break;
    case 1: what = "small struct_size"; a.struct_size = 8; want = PMLA_ERR_STRUCT_SIZE; break;
    case 2: what = "NULL q"; a.q = NULL; break;
    case 3: what = "NULL kv_cache"; a.kv_cache = NULL; break;
    case 4: what = "NULL out"; a.out = NULL; break;
    case 5: what = "q float32"; q.dtype.code = kDLFloat; q.dtype.bits = 32; break;
    case 6: what = "q tokens != qo_indptr rows"; q.shape = q_tok; break;
    case 7: what = "q heads != num_heads"; q.shape = q_heads; break;
    case 8: what = "q last dim 512"; q.shape = q_dim; break;
    case 9: what = "q 2-d"; q.ndim = 2; q.shape = q2; break;
    case 10: what = "q on the wrong device type"; q.device.device_type = other_device(); break;
    case 11: what = "q data NULL"; q.data = NULL; break;
    case 12: what = "kv float32"; kv.dtype.code = kDLFloat; kv.dtype.bits = 32; break;
    case 13: what = "kv last dim 512"; kv.shape = kv_dim; break;
    case 14: what = "kv page dim != page_size"; kv.shape = kv_ps; break;
    case 15: what = "kv 4-d with a head dim of 2"; kv.ndim = 4; kv.shape = kv4; break;
    case 16: what = "kv non-contiguous"; kv.strides = kv_strides; break;
    case 17: what = "kv fp8 (uint8)"; kv.dtype.code = kDLUInt; kv.dtype.bits = 8; break;
    case 18: what = "out float32"; out.dtype.code = kDLFloat; out.dtype.bits = 32; break;
    case 19: what = "out tokens != q tokens"; out.shape = out_tok; break;
    case 20: what = "out last dim 576"; out.shape = out_dim; break;
    case 21: what = "out non-contiguous"; out.strides = out_strides; break;
    case 22: what = "out on the wrong device type"; out.device.device_type = other_device(); break;
    case 23: what = "lse bf16"; lse.dtype.code = kDLBfloat; lse.dtype.bits = 16; break;
    case 24: what = "lse heads != num_heads"; lse.shape = lse_h; break;
    case 25: what = "lse 3-d"; lse.ndim = 3; lse.shape = out_tok; break;
    case 26: what = "kv 5-d"; kv.ndim = 5; kv.shape = kv5; break;
    case 27: what = "q of 2 lanes"; q.dtype.lanes = 2; break;
    default: what = NULL; break;
    }
    if (!what)
      break;
    expect_decode_fails(&f, pa, want, what);
    if (i == 26) /* a cache of neither accepted rank is told both */
      ck_assert_msg(strstr(g_be->last_error(f.b), "ndim = 5; accepted: 3, shape [*, 16, 576], or "
                                                   "4, shape [*, 16, 1, 576]"),
                    "kv 5-d: message '%s'", g_be->last_error(f.b));
    if (i == 27) /* the value given, lanes included */
      ck_assert_msg(strstr(g_be->last_error(f.b), "bfloat16 with 2 lanes"),
                    "q of 2 lanes: message '%s'", g_be->last_error(f.b));
  }
  /* q, out and lse that agree with each other, not with the rows of the
   * step's qo_indptr: refused where qo_indptr is in host memory (checked
   * at decode, before anything is written); where it lies on the device,
   * the rows past the tensors are skipped and flagged, never written */
  a = f.args;
  q = f.q.t;
  out = f.out.t;
  lse = f.lse.t;
  q.shape = q_less;
  out.shape = out_tok;
  lse.shape = lse_tok;
  a.q = &q;
  a.out = &out;
  a.lse = &lse;
  if (g_mem->device_type == kDLCPU) {
    expect_decode_fails(&f, &a, PMLA_ERR_INVALID_ARGUMENT,
                        "q, out and lse of one row fewer than qo_indptr's");
  } else {
    uint32_t flags = 0;
    fx_poison_outputs(&f);
    pmla_status s = g_be->decode(f.b, &a);
    ck_assert_msg(fx_rows_intact(&f, TOKENS - 1),
                  "one row fewer than qo_indptr's: out or lse written past their shape");
    ck_assert_msg(s == PMLA_OK || s == PMLA_ERR_INVALID_ARGUMENT,
                  "q, out and lse of one row fewer than qo_indptr's: %s (%s)",
                  harness_status_name(s), g_be->last_error(f.b));
    if (s == PMLA_OK) {
      s = g_be->check_device_error(f.b, &flags);
      ck_assert_msg(s == PMLA_ERR_DEVICE_INPUT && (flags & PMLA_DEVERR_QO_INDPTR),
                    "q, out and lse of one row fewer than qo_indptr's: decoded, and "
                    "check_device_error says %s (flags 0x%x)",
                    harness_status_name(s), flags);
    }
  }
  /* a cache of no pages: the accepted range says so (not "0..-1") */
  if (strcmp(g_backend_name, "pmla-cpu") == 0) {
    kv = f.kv.t;
    int64_t none[3] = {0, PS, 576};
    kv.shape = none;
    kv.data = NULL;
    a = f.args;
    a.kv_cache = &kv;
    fx_poison_outputs(&f);
    expect_status(g_be->decode(f.b, &a), PMLA_ERR_INVALID_ARGUMENT, &f, "a cache of no pages");
    ck_assert_msg(strstr(g_be->last_error(f.b), "accepted: none (the KV cache has no whole page)"),
                  "a cache of no pages: message '%s'", g_be->last_error(f.b));
    ck_assert_msg(fx_outputs_intact(&f), "a cache of no pages: outputs written");
  }
  ck_assert_int_eq(g_be->decode(NULL, &f.args), PMLA_ERR_INVALID_ARGUMENT);
  fx_teardown(&f);
}
END_TEST

/* ---- extreme values: refused, with the exact values in the message ---- */

/* qo_indptr entries at the ends of int32: the difference of two entries does
 * not fit int32. A backend that checks on the host refuses the build and
 * reports the entries and the row count they give exactly; one that checks
 * on the device flags the request instead. */
typedef struct qo_extreme {
  int32_t q0, q1;
} qo_extreme;

static const qo_extreme qo_extremes[] = {
    {INT32_MIN, INT32_MAX}, {-1, INT32_MAX}, {INT32_MAX, INT32_MIN},
    {INT32_MIN, 0},         {0, INT32_MAX},  {INT32_MAX, INT32_MAX - 1},
};
#define N_QO_EXTREMES ((int)(sizeof qo_extremes / sizeof qo_extremes[0]))

START_TEST(test_extreme_qo_indptr_is_refused_with_the_exact_row_count) {
  REQUIRE_BACKEND();
  fx f;
  fx_setup(&f, 0);
  const qo_extreme *c = &qo_extremes[_i];
  char q0[24], q1[24], rows[24];
  snprintf(q0, sizeof q0, "%d", c->q0);
  snprintf(q1, sizeof q1, "%d", c->q1);
  snprintf(rows, sizeof rows, " %lld", (long long)c->q1 - c->q0); /* not a tail of q0 */
  f.qo[0] = c->q0;
  f.qo[1] = c->q1;
  fx_upload_indices(&f);
  pmla_status s = g_be->build_decode(f.b, &f.bt_batch);
  if (s != PMLA_OK) {
    const char *m = g_be->last_error(f.b);
    ck_assert_msg(s == PMLA_ERR_INVALID_ARGUMENT, "qo_indptr {%s, %s}: build returned %s", q0,
                  q1, harness_status_name(s));
    ck_assert_msg(strstr(m, "qo_indptr") && strstr(m, q0) && strstr(m, q1) && strstr(m, rows),
                  "qo_indptr {%s, %s}: message '%s' lacks the entries or their %s rows", q0, q1,
                  m, rows);
  } else {
    uint32_t flags = 0;
    fx_poison_outputs(&f);
    expect_status(g_be->decode(f.b, &f.args), PMLA_OK, &f, "decode of a device-checked step");
    ck_assert_int_eq(g_be->check_device_error(f.b, &flags), PMLA_ERR_DEVICE_INPUT);
    ck_assert_msg(flags & PMLA_DEVERR_QO_INDPTR, "qo_indptr {%s, %s}: flags 0x%x", q0, q1, flags);
  }
  f.qo[0] = 0;
  f.qo[1] = 1;
  fx_upload_indices(&f);
  expect_status(g_be->build_decode(f.b, &f.bt_batch), PMLA_OK, &f, "the next valid build");
  expect_status(g_be->decode(f.b, &f.args), PMLA_OK, &f, "the next valid decode");
  fx_teardown(&f);
}
END_TEST

/* Shapes, strides and offsets whose sizes do not fit int64 (or the address
 * space): refused by tensor, naming the field and the value given, before
 * anything is read or written; the next valid call works. */
typedef struct size_case {
  const char *what;
  int call; /* 0 build_decode (block table), 1 build_decode (CSR), 2 build_sparse, 3 decode */
  const char *name, *field, *value;
} size_case;

#define P2_59 "576460752303423488"
#define P2_61 "2305843009213693952"
#define I64MAX "9223372036854775807"
static const size_case size_cases[] = {
    {"q shape [2^61, H, 576]: elements overflow", 3, "args->q", "shape", P2_61},
    {"q shape [INT64_MAX, H, 576]: elements overflow", 3, "args->q", "shape", I64MAX},
    {"kv_cache one page past INT64_MAX elements", 3, "args->kv_cache", "shape", "1000799917193444"},
    {"kv_cache elements fit, bytes overflow", 3, "args->kv_cache", "shape", "1000799917193443"},
    {"kv_cache 4-d [2^59, PS, 1, 576]", 3, "args->kv_cache", "shape", P2_59},
    {"q stride INT64_MAX on a dim of TOKENS", 3, "args->q", "stride", I64MAX},
    {"q stride INT64_MIN on a dim of TOKENS", 3, "args->q", "stride", "-9223372036854775808"},
    {"q byte_offset wraps the address space", 3, "args->q", "byte_offset",
     "18446744073709551614"},
    {"out byte_offset wraps the address space", 3, "args->out", "byte_offset",
     "18446744073709551612"},
    {"qo_indptr [INT64_MAX]: bytes overflow", 0, "qo_indptr", "shape", I64MAX},
    {"kv_indices [2^62]: bytes overflow", 1, "kv_indices", "shape", "4611686018427387904"},
    {"topk_indices [2^62, TOPK]: elements overflow", 2, "topk_indices", "shape",
     "4611686018427387904"},
    {"block_table [0, INT64_MAX]: width * page_size overflows", 0, "block_table", "pages",
     I64MAX},
    {"block_table [0, 2^59]: width * page_size wraps to INT64_MIN", 0, "block_table", "pages",
     P2_59},
};
#define N_SIZE_CASES ((int)(sizeof size_cases / sizeof size_cases[0]))

START_TEST(test_sizes_that_overflow_int64_are_refused_by_tensor_and_value) {
  REQUIRE_BACKEND();
  fx f;
  fx_setup(&f, TOPK);
  const size_case *c = &size_cases[_i];
  pmla_decode_batch bt = f.bt_batch, csr = f.csr_batch;
  pmla_sparse_batch sp = f.sparse;
  pmla_decode_args a = f.args;
  pmla_status s;
  DLTensor q = f.q.t, kv = f.kv.t, out = f.out.t, qo = f.t_qo.t, kvi = f.t_kvi.t,
           topk = f.t_topk.t, bt_t = f.t_bt.t, lens = f.t_lens.t;
  const int64_t kv_row = (int64_t)PS * 576;
  int64_t q_huge[3] = {(int64_t)1 << 61, H, 576}, q_max[3] = {INT64_MAX, H, 576};
  int64_t kv_elems[3] = {INT64_MAX / kv_row + 1, PS, 576},
          kv_bytes[3] = {INT64_MAX / kv_row, PS, 576};
  int64_t kv4[4] = {(int64_t)1 << 59, PS, 1, 576};
  int64_t q_str_max[3] = {INT64_MAX, 576, 1}, q_str_min[3] = {INT64_MIN, 576, 1};
  int64_t qo_max[1] = {INT64_MAX}, kvi_huge[1] = {(int64_t)1 << 62};
  int64_t topk_huge[2] = {(int64_t)1 << 62, TOPK};
  int64_t one[1] = {1}, zero[1] = {0}, bt_max[2] = {0, INT64_MAX},
          bt_wrap[2] = {0, (int64_t)1 << 59};
  a.q = &q;
  a.kv_cache = &kv;
  a.out = &out;
  bt.qo_indptr = csr.qo_indptr = &qo;
  bt.block_table = &bt_t;
  bt.kv_lens = &lens;
  csr.kv_indices = &kvi;
  sp.topk_indices = &topk;
  switch (_i) {
  case 0: q.shape = q_huge; break;
  case 1: q.shape = q_max; break;
  case 2: kv.shape = kv_elems; break;
  case 3: kv.shape = kv_bytes; break;
  case 4: kv.ndim = 4; kv.shape = kv4; break;
  case 5: q.strides = q_str_max; break;
  case 6: q.strides = q_str_min; break;
  case 7: q.byte_offset = UINT64_MAX - 1; break;
  case 8: out.byte_offset = UINT64_MAX - 3; break;
  case 9: qo.shape = qo_max; break;
  case 10: kvi.shape = kvi_huge; break;
  case 11: topk.shape = topk_huge; break;
  case 12: qo.shape = one; lens.shape = zero; bt_t.shape = bt_max; break;
  case 13: qo.shape = one; lens.shape = zero; bt_t.shape = bt_wrap; break;
  }
  switch (c->call) {
  case 0: s = g_be->build_decode(f.b, &bt); break;
  case 1: s = g_be->build_decode(f.b, &csr); break;
  case 2: s = g_be->build_sparse(f.b, &sp); break;
  default:
    expect_status(g_be->build_decode(f.b, &f.bt_batch), PMLA_OK, &f, "build");
    expect_decode_fails(&f, &a, PMLA_ERR_INVALID_ARGUMENT, c->what);
    s = PMLA_ERR_INVALID_ARGUMENT;
    break;
  }
  expect_status(s, PMLA_ERR_INVALID_ARGUMENT, &f, c->what);
  const char *m = g_be->last_error(f.b);
  ck_assert_msg(strstr(m, c->name) && strstr(m, c->field) && strstr(m, c->value),
                "%s: message '%s' does not name %s, its %s and the value %s", c->what, m,
                c->name, c->field, c->value);
  expect_status(g_be->build_decode(f.b, &f.bt_batch), PMLA_OK, &f, "the next valid build");
  expect_status(g_be->decode(f.b, &f.args), PMLA_OK, &f, "the next valid decode");
  fx_teardown(&f);
}
END_TEST

/* A dimension of size 1 takes any stride, INT64_MAX included: nothing is
 * ever stepped over it, so no size is computed from it. */
START_TEST(test_a_size_one_dim_takes_any_stride_without_overflow) {
  REQUIRE_BACKEND();
  fx f;
  fx_setup(&f, 0);
  expect_status(g_be->build_decode(f.b, &f.bt_batch), PMLA_OK, &f, "build");
  DLTensor kv4 = f.kv.t;
  int64_t s4[4] = {NPAGES, PS, 1, 576}, st4[4] = {PS * 576, 576, INT64_MAX, 1};
  kv4.ndim = 4;
  kv4.shape = s4;
  kv4.strides = st4;
  pmla_decode_args a = f.args;
  a.kv_cache = &kv4;
  expect_status(g_be->decode(f.b, &a), PMLA_OK, &f, "4-d cache, head dim stride INT64_MAX");
  st4[2] = INT64_MIN;
  expect_status(g_be->decode(f.b, &a), PMLA_OK, &f, "4-d cache, head dim stride INT64_MIN");
  fx_teardown(&f);
}
END_TEST

/* An empty tensor addresses no element, so its strides are not checked:
 * DLPack exporters give a dimension of 0 any stride (torch gives 1, where
 * row-major would say 0 for the dimension before it). A block table of
 * width 0 for requests without KV builds and decodes. */
START_TEST(test_an_empty_tensor_takes_any_strides) {
  REQUIRE_BACKEND();
  fx f;
  fx_setup(&f, 0);
  for (int r = 0; r < BATCH; r++)
    f.lens[r] = 0;
  fx_upload_indices(&f);
  DLTensor bt0 = f.t_bt.t;
  int64_t shape[2] = {BATCH, 0}, strides[2] = {1, 1};
  bt0.shape = shape;
  bt0.strides = strides;
  pmla_decode_batch batch = f.bt_batch;
  batch.block_table = &bt0;
  expect_status(g_be->build_decode(f.b, &batch), PMLA_OK, &f, "block_table [3, 0], strides {1, 1}");
  expect_status(g_be->decode(f.b, &f.args), PMLA_OK, &f, "its decode");
  float l[TOKENS * H];
  tt_download(&f.lse, l);
  for (int i = 0; i < TOKENS * H; i++)
    ck_assert_msg(isinf(l[i]) && l[i] < 0, "lse[%d] = %g; a row without KV has lse -inf", i,
                  (double)l[i]);
  fx_teardown(&f);
}
END_TEST

/* ---- alignment: data + byte_offset must suit the dtype ---- */

/* x's contents `offset` bytes into a fresh buffer (*slack, 16 bytes longer),
 * and *view, x's tensor moved there; *host receives what the buffer holds. */
static void misaligned_copy(const test_tensor *x, size_t offset, test_tensor *slack,
                            DLTensor *view, unsigned char **host) {
  size_t n = x->bytes + 16;
  *host = calloc(n, 1);
  ck_assert(*host);
  tt_download(x, *host + offset);
  tt_make1(slack, kDLUInt, 8, *host, (int64_t)n);
  *view = x->t;
  view->data = slack->t.data;
  view->byte_offset = offset;
}

typedef struct align_case {
  const char *name; /* as the message names it */
  int call;         /* as size_case's */
  size_t offset;
  int align; /* what the dtype needs */
} align_case;

static const align_case align_cases[] = {
    {"q", 3, 1, 2},           {"kv_cache", 3, 1, 2},       {"out", 3, 1, 2},
    {"lse", 3, 2, 4},         {"lse", 3, 1, 4},            {"qo_indptr", 0, 2, 4},
    {"qo_indptr", 1, 1, 4},   {"block_table", 0, 2, 4},    {"kv_lens", 0, 3, 4},
    {"kv_indptr", 1, 2, 4},   {"kv_indices", 1, 2, 4},     {"kv_last_page_len", 1, 2, 4},
    {"topk_indices", 2, 2, 4},
};
#define N_ALIGN_CASES ((int)(sizeof align_cases / sizeof align_cases[0]))

static const char *const align_names[] = {"q", "kv_cache", "out", "lse", "qo_indptr",
                                          "block_table", "kv_lens", "kv_indptr", "kv_indices",
                                          "kv_last_page_len", "topk_indices"};

/* The fixture tensor the case moves. */
static test_tensor *align_target(fx *f, const align_case *c) {
  test_tensor *const x[] = {&f->q, &f->kv, &f->out, &f->lse, &f->t_qo, &f->t_bt, &f->t_lens,
                            &f->t_kvp, &f->t_kvi, &f->t_last, &f->t_topk};
  for (size_t i = 0; i < sizeof x / sizeof x[0]; i++)
    if (!strcmp(align_names[i], c->name))
      return x[i];
  ck_abort_msg("no fixture tensor %s", c->name);
  return NULL;
}

/* Puts t where the case's call takes its tensor. */
static void align_place(const align_case *c, pmla_decode_batch *bt, pmla_decode_batch *csr,
                        pmla_sparse_batch *sp, pmla_decode_args *a, DLTensor *t) {
  size_t i = 0;
  while (strcmp(align_names[i], c->name))
    i++;
  switch (i) {
  case 0: a->q = t; break;
  case 1: a->kv_cache = t; break;
  case 2: a->out = t; break;
  case 3: a->lse = t; break;
  case 4: *(c->call == 1 ? &csr->qo_indptr : &bt->qo_indptr) = t; break;
  case 5: bt->block_table = t; break;
  case 6: bt->kv_lens = t; break;
  case 7: csr->kv_indptr = t; break;
  case 8: csr->kv_indices = t; break;
  case 9: csr->kv_last_page_len = t; break;
  default: sp->topk_indices = t; break;
  }
}

static pmla_status align_call(fx *f, int call, const pmla_decode_batch *bt,
                              const pmla_decode_batch *csr, const pmla_sparse_batch *sp,
                              const pmla_decode_args *a) {
  switch (call) {
  case 0: return g_be->build_decode(f->b, bt);
  case 1: return g_be->build_decode(f->b, csr);
  case 2: return g_be->build_sparse(f->b, sp);
  default: return g_be->decode(f->b, a);
  }
}

START_TEST(test_misaligned_tensors_are_refused_by_name_and_nothing_is_written) {
  REQUIRE_BACKEND();
  fx f;
  fx_setup(&f, TOPK);
  const align_case *c = &align_cases[_i];
  pmla_decode_batch bt = f.bt_batch, csr = f.csr_batch;
  pmla_sparse_batch sp = f.sparse;
  pmla_decode_args a = f.args;
  test_tensor *x = align_target(&f, c);
  fx_poison_outputs(&f);
  test_tensor slack;
  DLTensor view;
  unsigned char *before;
  misaligned_copy(x, c->offset, &slack, &view, &before);
  unsigned char *after = malloc(slack.bytes);
  ck_assert(after);
  align_place(c, &bt, &csr, &sp, &a, &view);
  char what[96], align[24];
  snprintf(what, sizeof what, "%s at byte_offset %zu", c->name, c->offset);
  snprintf(align, sizeof align, "%d-byte", c->align);
  if (c->call == 3) {
    expect_status(g_be->build_decode(f.b, &f.bt_batch), PMLA_OK, &f, "build");
    expect_decode_fails(&f, &a, PMLA_ERR_INVALID_ARGUMENT, what);
  } else {
    expect_status(align_call(&f, c->call, &bt, &csr, &sp, &a), PMLA_ERR_INVALID_ARGUMENT, &f,
                  what);
  }
  const char *m = g_be->last_error(f.b);
  ck_assert_msg(strstr(m, c->name) && strstr(m, "aligned") && strstr(m, align),
                "%s: message '%s' does not name the tensor and its %s alignment", what, m, align);
  if (c->call != 3)
    expect_decode_fails(&f, &f.args, PMLA_ERR_BAD_STATE, "decode after the refused build");
  tt_download(&slack, after);
  ck_assert_msg(memcmp(before, after, slack.bytes) == 0, "%s: the refused call wrote into it",
                what);
  /* the same call with the fixture's own tensor goes through */
  align_place(c, &bt, &csr, &sp, &a, &x->t);
  if (c->call != 3)
    expect_status(align_call(&f, c->call, &bt, &csr, &sp, &a), PMLA_OK, &f,
                  "the next valid build");
  else
    expect_status(g_be->build_decode(f.b, &f.bt_batch), PMLA_OK, &f, "the next valid build");
  expect_status(g_be->decode(f.b, &a), PMLA_OK, &f, "the next valid decode");
  tt_free(&slack);
  free(before);
  free(after);
  fx_teardown(&f);
}
END_TEST

/* Alignment is the dtype's, no more: int32 and fp32 tensors one element
 * into a buffer are accepted, and read from there. */
START_TEST(test_int32_and_fp32_tensors_one_element_in_are_accepted) {
  REQUIRE_BACKEND();
  fx f;
  fx_setup(&f, TOPK);
  for (int i = 0; i < N_ALIGN_CASES; i++) {
    align_case c = align_cases[i];
    if (c.align != 4 || (i > 0 && !strcmp(align_cases[i - 1].name, c.name)))
      continue;
    c.offset = 4;
    pmla_decode_batch bt = f.bt_batch, csr = f.csr_batch;
    pmla_sparse_batch sp = f.sparse;
    pmla_decode_args a = f.args;
    test_tensor *x = align_target(&f, &c);
    test_tensor slack;
    DLTensor view;
    unsigned char *host;
    misaligned_copy(x, c.offset, &slack, &view, &host);
    align_place(&c, &bt, &csr, &sp, &a, &view);
    if (c.call == 3)
      expect_status(g_be->build_decode(f.b, &f.bt_batch), PMLA_OK, &f, "build");
    else
      expect_status(align_call(&f, c.call, &bt, &csr, &sp, &a), PMLA_OK, &f, c.name);
    expect_status(g_be->decode(f.b, &a), PMLA_OK, &f, c.name);
    uint32_t flags = 1;
    expect_status(g_be->check_device_error(f.b, &flags), PMLA_OK, &f, c.name);
    tt_free(&slack);
    free(host);
  }
  fx_teardown(&f);
}
END_TEST

/* A request of more than PMLA_MAX_KV_LEN tokens (block table or CSR, up
 * to 2^31 - 1): pmla-cpu refuses the build naming the cap, a GPU flags
 * PMLA_DEVERR_KV_LEN and the request attends nothing (out 0, lse -inf);
 * one of exactly PMLA_MAX_KV_LEN tokens builds. Every page entry is page 0
 * of a one-page cache, so no test array holds more than 2^23 entries. */
typedef struct kv_cap_case {
  uint32_t layout;
  int64_t len;
} kv_cap_case;

static const kv_cap_case kv_cap_cases[] = {
    {PMLA_KV_BLOCK_TABLE, PMLA_MAX_KV_LEN},     {PMLA_KV_BLOCK_TABLE, PMLA_MAX_KV_LEN + 1ll},
    {PMLA_KV_CSR, PMLA_MAX_KV_LEN},             {PMLA_KV_CSR, PMLA_MAX_KV_LEN + 1ll},
    {PMLA_KV_CSR, INT32_MAX - 14},              {PMLA_KV_CSR, INT32_MAX},
};
#define N_KV_CAP_CASES ((int)(sizeof kv_cap_cases / sizeof kv_cap_cases[0]))

START_TEST(test_a_request_longer_than_the_kv_cap_is_refused_or_flagged) {
  REQUIRE_BACKEND();
  enum { P = 256, HC = 16 };
  const kv_cap_case *c = &kv_cap_cases[_i];
  const int32_t pages = (int32_t)((c->len + P - 1) / P), last = (int32_t)(c->len - (pages - 1ll) * P);
  const int32_t width = c->layout == PMLA_KV_BLOCK_TABLE ? pages : 1;
  const int32_t qo[2] = {0, 1}, lens[1] = {c->layout == PMLA_KV_BLOCK_TABLE ? (int32_t)c->len : 0};
  const int32_t kvp[2] = {0, c->layout == PMLA_KV_CSR ? pages : 0};
  int32_t *zeros = calloc((size_t)pages, sizeof *zeros);
  ck_assert(zeros);
  pmla_builder_config cfg = harness_config(HC, P, 1, 1, 0, 2);
  pmla_builder *b = harness_init(&cfg);
  harness_dense_step st;
  harness_dense_step_make(&st, c->layout, 1, qo, lens, zeros, width, kvp, zeros, &last);
  free(zeros);
  char what[96], len_s[24];
  snprintf(what, sizeof what, "%s request of %lld tokens",
           c->layout == PMLA_KV_CSR ? "CSR" : "block-table", (long long)c->len);
  snprintf(len_s, sizeof len_s, "%lld", (long long)c->len);
  pmla_status s = g_be->build_decode(b, &st.batch);
  if (c->len <= PMLA_MAX_KV_LEN) {
    ck_assert_msg(s == PMLA_OK, "%s: %s (%s)", what, harness_status_name(s), g_be->last_error(b));
  } else if (s != PMLA_OK) {
    const char *m = g_be->last_error(b);
    ck_assert_msg(s == PMLA_ERR_INVALID_ARGUMENT, "%s: %s", what, harness_status_name(s));
    ck_assert_msg(strstr(m, "PMLA_MAX_KV_LEN") && strstr(m, "1073741824") &&
                      (c->layout == PMLA_KV_CSR || strstr(m, len_s)),
                  "%s: message '%s' lacks the cap or the length", what, m);
  } else { /* checked on the device */
    test_tensor q, kv, out, lse;
    uint16_t *hq = calloc((size_t)HC * 576, 2), *hkv = calloc((size_t)P * 576, 2);
    ck_assert(hq && hkv);
    tt_make3(&q, TT_BF16, hq, 1, HC, 576);
    tt_make3(&kv, TT_BF16, hkv, 1, P, 576);
    tt_make3(&out, TT_BF16, NULL, 1, HC, 512);
    tt_make2(&lse, TT_F32, NULL, 1, HC);
    pmla_decode_args a = {.struct_size = sizeof a, .q = &q.t, .kv_cache = &kv.t, .out = &out.t,
                          .lse = &lse.t, .stream = harness_stream()};
    ck_assert_msg(g_be->decode(b, &a) == PMLA_OK, "%s: decode: %s", what, g_be->last_error(b));
    uint32_t flags = 0;
    ck_assert_int_eq(g_be->check_device_error(b, &flags), PMLA_ERR_DEVICE_INPUT);
    ck_assert_msg(flags & PMLA_DEVERR_KV_LEN, "%s: flags 0x%x", what, flags);
    float l[HC];
    tt_download(&lse, l);
    for (int h = 0; h < HC; h++)
      ck_assert_msg(isinf(l[h]) && l[h] < 0, "%s: lse[%d] = %g, want -inf", what, h, l[h]);
    tt_download(&out, hq);
    for (int i = 0; i < HC * 512; i++)
      ck_assert_msg(hq[i] == 0, "%s: out[%d] = 0x%04x, want 0", what, i, hq[i]);
    free(hq);
    free(hkv);
    test_tensor *all[] = {&q, &kv, &out, &lse};
    for (int i = 0; i < 4; i++)
      tt_free(all[i]);
  }
  harness_dense_step_free(&st);
  g_be->destroy_builder(b);
}
END_TEST

/* A CSR request without pages has length 0: its kv_last_page_len is not
 * read, however large (it is bounded only for requests with pages). */
START_TEST(test_a_csr_request_without_pages_ignores_its_last_page_len) {
  REQUIRE_BACKEND();
  fx f;
  fx_setup(&f, 0);
  f.last[1] = INT32_MAX; /* request 1 has no pages: kv_indptr {0, 2, 2, 5} */
  fx_upload_indices(&f);
  expect_status(g_be->build_decode(f.b, &f.csr_batch), PMLA_OK, &f, "last_page_len INT32_MAX");
  expect_status(g_be->decode(f.b, &f.args), PMLA_OK, &f, "its decode");
  uint32_t flags = 0;
  ck_assert_int_eq(g_be->check_device_error(f.b, &flags), PMLA_OK);
  fx_teardown(&f);
}
END_TEST

/* The query tokens a dense step addresses (qo_indptr[batch], rows before
 * qo_indptr[0] included) beyond max_batch * max_q_len: a backend that reads
 * qo_indptr on the host refuses the build with PMLA_ERR_CAPACITY; any
 * backend refuses a q that long at decode. */
START_TEST(test_query_tokens_beyond_the_capacity_are_refused) {
  REQUIRE_BACKEND();
  fx f;
  fx_setup(&f, 0);
  const int32_t room = MAXB * MAXQ;
  f.qo[0] = room - 1; /* rows [room - 1, room + 3): 3 requests, within max_q_len each */
  f.qo[1] = room;
  f.qo[2] = room + 2;
  f.qo[3] = room + 3;
  fx_upload_indices(&f);
  pmla_status s = g_be->build_decode(f.b, &f.bt_batch);
  if (s != PMLA_OK || g_mem->device_type == kDLCPU) { /* host data: checked at build */
    expect_status(s, PMLA_ERR_CAPACITY, &f, "qo_indptr past max_batch * max_q_len");
    ck_assert_msg(strstr(g_be->last_error(f.b), "qo_indptr[3] = 11"), "message '%s'",
                  g_be->last_error(f.b));
  }
  test_tensor q, out;
  tt_make3(&q, TT_BF16, NULL, room + 3, H, 576);
  tt_make3(&out, TT_BF16, NULL, room + 3, H, 512);
  pmla_decode_args a = f.args;
  a.q = &q.t;
  a.out = &out.t;
  a.lse = NULL;
  if (s == PMLA_OK)
    expect_decode_fails(&f, &a, PMLA_ERR_CAPACITY, "q of more than max_batch * max_q_len");
  else
    expect_decode_fails(&f, &a, PMLA_ERR_BAD_STATE, "decode after the refused build");
  tt_free(&q);
  tt_free(&out);
  fx_teardown(&f);
}
END_TEST

/* Rows of q, out and lse before qo_indptr[0] are neither read nor
 * written (q holds qo_indptr[batch] rows): the fixture's step placed one
 * row further in leaves row 0 as it was, and its rows come out bit for bit
 * as at offset 0. */
START_TEST(test_rows_before_the_first_request_are_not_touched) {
  REQUIRE_BACKEND();
  fx f;
  fx_setup(&f, 0);
  const size_t row_out = (size_t)H * 512, row_q = (size_t)H * 576;
  uint16_t *out0 = malloc(TOKENS * row_out * 2), *hq = malloc((TOKENS + 1) * row_q * 2);
  uint16_t *out1 = malloc((TOKENS + 1) * row_out * 2);
  float lse0[TOKENS * H], lse1[(TOKENS + 1) * H];
  ck_assert(out0 && hq && out1);
  for (size_t i = 0; i < (TOKENS + 1) * row_out; i++)
    out1[i] = OUT_SENTINEL;
  for (size_t i = 0; i < (TOKENS + 1) * H; i++)
    lse1[i] = LSE_SENTINEL;
  expect_status(g_be->build_decode(f.b, &f.bt_batch), PMLA_OK, &f, "the step at offset 0");
  expect_status(g_be->decode(f.b, &f.args), PMLA_OK, &f, "its decode");
  tt_download(&f.out, out0);
  tt_download(&f.lse, lse0);

  tt_download(&f.q, hq + row_q); /* rows 1..TOKENS; row 0 is never read */
  for (size_t i = 0; i < row_q; i++)
    hq[i] = 0x7fc0; /* NaN */
  test_tensor q, out, lse;
  tt_make3(&q, TT_BF16, hq, TOKENS + 1, H, 576);
  tt_make3(&out, TT_BF16, out1, TOKENS + 1, H, 512);
  tt_make2(&lse, TT_F32, lse1, TOKENS + 1, H);
  for (int r = 0; r <= BATCH; r++)
    f.qo[r] += 1;
  fx_upload_indices(&f);
  pmla_decode_args a = f.args;
  a.q = &q.t;
  a.out = &out.t;
  a.lse = &lse.t;
  expect_status(g_be->build_decode(f.b, &f.bt_batch), PMLA_OK, &f, "the step one row in");
  expect_status(g_be->decode(f.b, &a), PMLA_OK, &f, "its decode");
  tt_download(&out, out1);
  tt_download(&lse, lse1);
  for (size_t i = 0; i < row_out; i++)
    ck_assert_msg(out1[i] == OUT_SENTINEL, "out row 0, value %zu written", i);
  for (size_t i = 0; i < H; i++)
    ck_assert_msg(lse1[i] == LSE_SENTINEL, "lse row 0, value %zu written", i);
  ck_assert_msg(memcmp(out1 + row_out, out0, TOKENS * row_out * 2) == 0,
                "out of the rows one row in differs from offset 0");
  ck_assert_msg(memcmp(lse1 + H, lse0, sizeof lse0) == 0,
                "lse of the rows one row in differs from offset 0");
  tt_free(&q);
  tt_free(&out);
  tt_free(&lse);
  free(out0);
  free(out1);
  free(hq);
  fx_teardown(&f);
}
END_TEST

/* ---- builders that are not live, or not this backend's ---- */

/* A destroyed builder is no builder: a second destroy is ignored, and any
 * call given the pointer is refused without reading through it (the
 * address sanitizer of CI's CPU run would see such a read). */
START_TEST(test_a_destroyed_builder_is_refused_and_destroying_it_again_is_ignored) {
  REQUIRE_BACKEND();
  fx f;
  fx_setup(&f, 0);
  pmla_builder *dead = f.b;
  g_be->destroy_builder(dead);
  g_be->destroy_builder(dead);
  ck_assert_msg(strstr(g_be->last_error(NULL), "not a live builder"),
                "second destroy: message '%s'", g_be->last_error(NULL));
  pmla_builder_info info = {.struct_size = sizeof info};
  uint32_t flags = 0;
  int32_t word[PMLA_META_WORDS];
  pmla_status got[6]; /* one call a statement: copy_buffer's refusal is the last */
  got[0] = g_be->build_decode(dead, &f.bt_batch);
  got[1] = g_be->build_sparse(dead, &f.sparse);
  got[2] = g_be->decode(dead, &f.args);
  got[3] = g_be->query_builder(dead, &info);
  got[4] = g_be->check_device_error(dead, &flags);
  got[5] = g_be->copy_buffer(dead, PMLA_BUF_WORK_META_DATA, word, sizeof word);
  for (int i = 0; i < 6; i++) {
    ck_assert_msg(got[i] == PMLA_ERR_INVALID_ARGUMENT, "call %d on a destroyed builder: %s", i,
                  harness_status_name(got[i]));
  }
  /* last_error of the dead pointer is this thread's message, the last refusal */
  ck_assert_msg(strstr(g_be->last_error(dead), "copy_buffer: builder") &&
                    strstr(g_be->last_error(dead), "not a live builder"),
                "last_error(destroyed): '%s'", g_be->last_error(dead));
  f.b = NULL; /* fx_teardown's destroy of NULL does nothing */
  fx_teardown(&f);
}
END_TEST

/* Each backend serves only the builders its own init_builder made: another
 * backend of the plugin refuses them (or, built without a GPU, refuses
 * everything), and its destroy leaves them alive. */
START_TEST(test_a_builder_is_refused_by_the_other_backend_and_stays_usable) {
  REQUIRE_BACKEND();
  const pmla_backend *other = NULL;
  for (size_t i = 0; i < pmla_registry_count(g_registry); i++) {
    const pmla_backend *be = pmla_registry_backend(g_registry, i);
    if (be != g_be && strcmp(pmla_registry_backend_path(g_registry, i), g_plugin_path) == 0)
      other = be;
  }
  if (!other) {
    fprintf(stderr, "SKIP %s: the plugin has no second backend\n", __func__);
    return;
  }
  fx f;
  fx_setup(&f, 0);
  expect_status(g_be->build_decode(f.b, &f.bt_batch), PMLA_OK, &f, "build");
  fx_poison_outputs(&f);
  pmla_builder_info info = {.struct_size = sizeof info};
  /* each refusal says so in the builder, naming the backend that made it
   * (after a refusal of the builder's own backend, whose message it replaces) */
  for (int i = 0; i < 3; i++) {
    g_be->copy_buffer(f.b, PMLA_BUF_WORK_INDPTR, NULL, 1);
    const pmla_status got = i == 0   ? other->build_decode(f.b, &f.bt_batch)
                            : i == 1 ? other->decode(f.b, &f.args)
                                     : other->query_builder(f.b, &info);
    ck_assert_msg(got == PMLA_ERR_INVALID_ARGUMENT, "call %d: %s", i, harness_status_name(got));
    ck_assert_msg(strstr(other->last_error(f.b), "made by backend") &&
                      strstr(other->last_error(f.b), g_be->name),
                  "call %d: last_error '%s'", i, other->last_error(f.b));
  }
  ck_assert_msg(fx_outputs_intact(&f), "%s's decode wrote outputs of a %s builder", other->name,
                g_be->name);
  other->destroy_builder(f.b);
  expect_status(g_be->query_builder(f.b, &info), PMLA_OK, &f, "query after the other's destroy");
  expect_status(g_be->build_decode(f.b, &f.bt_batch), PMLA_OK, &f, "build after the other's calls");
  expect_status(g_be->decode(f.b, &f.args), PMLA_OK, &f, "decode after the other's calls");
  fx_teardown(&f);
}
END_TEST

/* decode's outputs may not share a byte with what it reads: q, the cache,
 * the step's index tensors, or each other. Refused by name, nothing written. */
START_TEST(test_outputs_overlapping_an_input_are_refused_by_name) {
  REQUIRE_BACKEND();
  fx f;
  fx_setup(&f, 0);
  expect_status(g_be->build_decode(f.b, &f.bt_batch), PMLA_OK, &f, "build");
  static const struct {
    const char *out, *in;
  } want[5] = {{"args->out", "args->q"},
               {"args->out", "args->kv_cache"},
               {"args->out", "batch->block_table"},
               {"args->lse", "args->kv_cache"},
               {"args->out", "args->lse"}};
  for (int c = 0; c < 5; c++) {
    DLTensor out = f.out.t, lse = f.lse.t;
    switch (c) {
    case 0: out.data = f.q.t.data; break;
    case 1: out.data = f.kv.t.data; out.byte_offset = 1024; break;
    case 2: out.data = f.t_bt.t.data; break;
    case 3: lse.data = f.kv.t.data; break;
    case 4: lse.data = f.out.t.data; lse.byte_offset = 4096; break;
    }
    pmla_decode_args a = f.args;
    a.out = &out;
    a.lse = &lse;
    fx_poison_outputs(&f);
    expect_status(g_be->decode(f.b, &a), PMLA_ERR_INVALID_ARGUMENT, &f, want[c].in);
    const char *m = g_be->last_error(f.b);
    const char *w = strstr(m, want[c].out);
    ck_assert_msg(w && strstr(w, "overlaps") && strstr(m, want[c].in),
                  "case %d: message '%s' does not name %s and %s", c, m, want[c].out, want[c].in);
    ck_assert_msg(fx_outputs_intact(&f), "case %d: outputs written", c);
  }
  expect_status(g_be->decode(f.b, &f.args), PMLA_OK, &f, "separate outputs");
  /* the edges, with out and lse in one allocation: lse from out's end is
   * accepted (byte_offset counted), lse from its last element on is not
   * (4 bytes, lse's element, in host memory; 16, the least alignment a
   * GPU accepts, in a GPU's) */
  test_tensor arena;
  tt_make3(&arena, TT_BF16, NULL, TOKENS, H, 2 * 512);
  const uint64_t out_bytes = (uint64_t)TOKENS * H * 512 * 2,
                 edge = g_mem->device_type == kDLCPU ? 4 : 16;
  DLTensor out = f.out.t, lse = f.lse.t;
  out.data = lse.data = arena.t.data;
  pmla_decode_args a = f.args;
  a.out = &out;
  a.lse = &lse;
  lse.byte_offset = out_bytes;
  expect_status(g_be->decode(f.b, &a), PMLA_OK, &f, "lse from out's end on");
  lse.byte_offset = out_bytes - edge;
  expect_status(g_be->decode(f.b, &a), PMLA_ERR_INVALID_ARGUMENT, &f,
                "lse over out's last element");
  const char *m = g_be->last_error(f.b);
  ck_assert_msg(strstr(m, "args->out") && strstr(m, "overlaps args->lse"),
                "lse over out's last element: message '%s'", m);
  tt_free(&arena);
  fx_teardown(&f);
}
END_TEST

/* kv_scale belongs to an fp8_e4m3 cache: a bf16 cache's decode ignores
 * it, whatever it holds or however it is made (not read, not checked) */
START_TEST(test_a_bf16_cache_ignores_kv_scale) {
  REQUIRE_BACKEND();
  fx f;
  fx_setup(&f, 0);
  const size_t n = (size_t)TOKENS * H * 512;
  uint16_t *want = malloc(n * 2), *got = malloc(n * 2);
  ck_assert(want && got);
  expect_status(g_be->build_decode(f.b, &f.bt_batch), PMLA_OK, &f, "build");
  expect_status(g_be->decode(f.b, &f.args), PMLA_OK, &f, "decode without kv_scale");
  tt_download(&f.out, want);
  const float nan = NAN;
  test_tensor scale;
  tt_make1(&scale, TT_F32, &nan, 1);
  for (int c = 0; c < 2; c++) {
    DLTensor s = scale.t;
    if (c) { /* not even a tensor the fp8 check would take */
      s.data = NULL;
      s.dtype.bits = 64;
    }
    pmla_decode_args a = f.args;
    a.kv_scale = &s;
    fx_poison_outputs(&f);
    expect_status(g_be->decode(f.b, &a), PMLA_OK, &f,
                  c ? "a malformed kv_scale" : "a NaN kv_scale");
    tt_download(&f.out, got);
    ck_assert_msg(memcmp(want, got, n * 2) == 0, "case %d: out differs with kv_scale set", c);
  }
  tt_free(&scale);
  free(want);
  free(got);
  fx_teardown(&f);
}
END_TEST

/* pmla-cpu reads a dense step's qo_indptr, kv_lens, kv_indptr and
 * kv_last_page_len once, at build: a host that breaks the contract and
 * rewrites them before decode gets the step it built, not a wild read or
 * write. (A GPU reads them on the device, which checks what it reads.) */
START_TEST(test_cpu_indptrs_rewritten_after_the_build_change_nothing) {
  REQUIRE_BACKEND();
  if (g_mem->device_type != kDLCPU) {
    fprintf(stderr, "SKIP %s: the indices are read on the device\n", __func__);
    return;
  }
  for (int csr = 0; csr < 2; csr++) {
    fx f;
    fx_setup(&f, 0);
    const pmla_decode_batch *batch = csr ? &f.csr_batch : &f.bt_batch;
    uint16_t *out0 = malloc((size_t)TOKENS * H * 512 * 2), *out1 = malloc((size_t)TOKENS * H * 512 * 2);
    ck_assert(out0 && out1);
    expect_status(g_be->build_decode(f.b, batch), PMLA_OK, &f, "build");
    expect_status(g_be->decode(f.b, &f.args), PMLA_OK, &f, "decode");
    tt_download(&f.out, out0);
    expect_status(g_be->build_decode(f.b, batch), PMLA_OK, &f, "build again");
    for (int r = 0; r <= BATCH; r++) {
      f.qo[r] = r == BATCH ? 1 << 30 : -(1 << 30) + r;
      f.kv_indptr[r] = r % 2 ? 1 << 29 : -7;
    }
    for (int r = 0; r < BATCH; r++)
      f.lens[r] = f.last[r] = 1 << 30;
    fx_upload_indices(&f);
    expect_status(g_be->decode(f.b, &f.args), PMLA_OK, &f, "decode after the rewrite");
    tt_download(&f.out, out1);
    ck_assert_msg(memcmp(out0, out1, (size_t)TOKENS * H * 512 * 2) == 0,
                  "%s: the decode after the rewrite differs", csr ? "CSR" : "block table");
    uint32_t flags = 0;
    expect_status(g_be->check_device_error(f.b, &flags), PMLA_OK, &f, "no error bits");
    free(out0);
    free(out1);
    fx_teardown(&f);
  }
}
END_TEST

Suite *suite_args(void) {
  Suite *s = suite_create("arguments");
  TCase *tc = tcase_create("build_decode");
  tcase_add_test(tc, test_decode_before_any_build_is_bad_state);
  tcase_add_test(tc, test_failed_build_leaves_no_step);
  tcase_add_test(tc, test_valid_fixture_builds_and_decodes);
  tcase_add_test(tc, test_build_decode_rejects_null_and_struct_size);
  tcase_add_loop_test(tc, test_build_decode_rejects_malformed_index_tensors, 0, N_BATCH_MUTS);
  tcase_add_test(tc, test_build_decode_rejects_batch_over_max_batch);
  tcase_add_test(tc, test_batch_0_with_a_negative_first_row_is_refused);
  suite_add_tcase(s, tc);
  tc = tcase_create("values");
  tcase_add_loop_test(tc, test_bad_index_values_are_reported_never_faulted, 0, N_VALUE_CASES);
  suite_add_tcase(s, tc);
  tc = tcase_create("build_sparse");
  tcase_add_test(tc, test_build_sparse_rejects_bad_arguments);
  tcase_add_test(tc, test_build_sparse_refused_on_a_dense_only_builder);
  suite_add_tcase(s, tc);
  tc = tcase_create("decode");
  tcase_add_test(tc, test_decode_rejects_bad_arguments_and_writes_nothing);
  suite_add_tcase(s, tc);
  tc = tcase_create("extremes");
  tcase_add_loop_test(tc, test_extreme_qo_indptr_is_refused_with_the_exact_row_count, 0,
                      N_QO_EXTREMES);
  tcase_add_loop_test(tc, test_sizes_that_overflow_int64_are_refused_by_tensor_and_value, 0,
                      N_SIZE_CASES);
  tcase_add_test(tc, test_a_size_one_dim_takes_any_stride_without_overflow);
  tcase_add_test(tc, test_an_empty_tensor_takes_any_strides);
  tcase_add_loop_test(tc, test_a_request_longer_than_the_kv_cap_is_refused_or_flagged, 0,
                      N_KV_CAP_CASES);
  tcase_add_test(tc, test_query_tokens_beyond_the_capacity_are_refused);
  tcase_add_test(tc, test_rows_before_the_first_request_are_not_touched);
  tcase_add_test(tc, test_a_csr_request_without_pages_ignores_its_last_page_len);
  suite_add_tcase(s, tc);
  tc = tcase_create("alignment");
  tcase_add_loop_test(tc, test_misaligned_tensors_are_refused_by_name_and_nothing_is_written, 0,
                      N_ALIGN_CASES);
  tcase_add_test(tc, test_int32_and_fp32_tensors_one_element_in_are_accepted);
  suite_add_tcase(s, tc);
  tc = tcase_create("builders");
  tcase_add_test(tc, test_a_destroyed_builder_is_refused_and_destroying_it_again_is_ignored);
  tcase_add_test(tc, test_a_builder_is_refused_by_the_other_backend_and_stays_usable);
  tcase_add_test(tc, test_outputs_overlapping_an_input_are_refused_by_name);
  tcase_add_test(tc, test_a_bf16_cache_ignores_kv_scale);
  tcase_add_test(tc, test_cpu_indptrs_rewritten_after_the_build_change_nothing);
  suite_add_tcase(s, tc);
  return s;
}
