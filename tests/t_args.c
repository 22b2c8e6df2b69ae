/* SPDX-License-Identifier: MIT */
/* t_args.c - build_decode / build_sparse / decode argument checking: every
 * bad argument gets its code, a message, and nothing written to the outputs
 * (out and lse are filled with a sentinel first and must stay intact).
 *
 * Bad values inside index tensors (negative kv_len, page index outside the
 * cache, ...) may be caught either synchronously (an error status, outputs
 * intact) or, as a GPU must, by the kernels through the device error word:
 * then check_device_error returns PMLA_ERR_DEVICE_INPUT with the right bit
 * and clears it. Either way nothing faults. */
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

static int fx_outputs_intact(const fx *f) {
  uint16_t o[TOKENS * H * 512];
  float l[TOKENS * H];
  tt_download(&f->out, o);
  tt_download(&f->lse, l);
  for (size_t i = 0; i < sizeof o / sizeof o[0]; i++)
    if (o[i] != OUT_SENTINEL)
      return 0;
  for (size_t i = 0; i < sizeof l / sizeof l[0]; i++)
    if (l[i] != LSE_SENTINEL)
      return 0;
  return 1;
}

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
          len2[1] = {BATCH - 1}, lenp[1] = {BATCH + 2}, strides[2] = {1, BATCH};
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
          kv4[4] = {NPAGES, PS, 2, 576}, kv_strides[3] = {PS * 576, 1, PS};
  int64_t out_tok[3] = {TOKENS - 1, H, 512}, out_dim[3] = {TOKENS, H, 576},
          out_strides[3] = {H * 512, 1, H};
  int64_t lse_h[2] = {TOKENS, H / 2};
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
    default: what = NULL; break;
    }
    if (!what)
      break;
    expect_decode_fails(&f, pa, want, what);
  }
  ck_assert_int_eq(g_be->decode(NULL, &f.args), PMLA_ERR_INVALID_ARGUMENT);
  fx_teardown(&f);
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
  return s;
}
