/* SPDX-License-Identifier: MIT */
/* t_fp8.c - FP8 KV caches (ABI 1.1): which kv_dtype values a builder
 * takes, the cache each of them must be given, fp8_e4m3's kv_scale (absent,
 * malformed, or a value that is not finite and > 0), and a 1.0 host's
 * smaller pmla_decode_args. The numerics of both FP8 layouts against the
 * double-precision reference are in t_numerics.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "test_config.h"
#include "reference.h"

#define H 16
#define PS 16
#define PAGES 4
#define LEN 40 /* one request of 40 tokens on pages 2, 0, 3 */
#define OUT_SENTINEL ((uint16_t)0x7e57)

typedef struct fx {
  pmla_builder *b;
  uint32_t kv_dtype;
  test_tensor qo, lens, bt, q, kv, out, lse, scale;
  pmla_decode_batch batch;
  pmla_decode_args args;
} fx;

/* A built one-request step over a cache of kv_dtype (uint8 for FP8, with
 * finite e4m3 bytes; scale 1 for DS_MLA tiles); args ready to decode. */
static void fx_setup(fx *f, uint32_t kv_dtype) {
  memset(f, 0, sizeof *f);
  f->kv_dtype = kv_dtype;
  pmla_builder_config c = harness_config(H, PS, 1, 1, 0, 2);
  c.kv_dtype = kv_dtype;
  f->b = harness_init(&c);
  const int32_t qo[2] = {0, 1}, lens[1] = {LEN}, bt[3] = {2, 0, 3};
  tt_make1(&f->qo, TT_I32, qo, 2);
  tt_make1(&f->lens, TT_I32, lens, 1);
  tt_make2(&f->bt, TT_I32, bt, 1, 3);
  uint16_t q[H * 576];
  for (int i = 0; i < H * 576; i++)
    q[i] = ref_float_to_bf16((float)((i % 13) - 6) / 8.f);
  tt_make3(&f->q, TT_BF16, q, 1, H, 576);
  const int64_t w = test_kv_width(kv_dtype);
  const size_t bytes = (size_t)PAGES * PS * (size_t)w * (kv_dtype == PMLA_DTYPE_BF16 ? 2 : 1);
  uint8_t *kv = malloc(bytes);
  ck_assert(kv);
  for (size_t i = 0; i < bytes; i++)
    kv[i] = (uint8_t)((i * 37) & 0x3f); /* finite in every dtype */
  if (kv_dtype == PMLA_DTYPE_FP8_DS_MLA)
    for (int s = 0; s < PAGES * PS; s++)
      for (int t = 0; t < 4; t++) {
        const float one = 1.f;
        memcpy(kv + (size_t)s * 656 + 512 + 4 * t, &one, 4);
      }
  if (kv_dtype == PMLA_DTYPE_BF16)
    tt_make3(&f->kv, TT_BF16, kv, PAGES, PS, 576);
  else
    tt_make3(&f->kv, kDLUInt, 8, kv, PAGES, PS, w);
  free(kv);
  tt_make3(&f->out, TT_BF16, NULL, 1, H, 512);
  tt_make2(&f->lse, TT_F32, NULL, 1, H);
  const float one = 1.f;
  tt_make1(&f->scale, TT_F32, &one, 1);
  f->batch.struct_size = sizeof f->batch;
  f->batch.kv_layout = PMLA_KV_BLOCK_TABLE;
  f->batch.qo_indptr = &f->qo.t;
  f->batch.block_table = &f->bt.t;
  f->batch.kv_lens = &f->lens.t;
  f->batch.stream = harness_stream();
  pmla_status st = g_be->build_decode(f->b, &f->batch);
  ck_assert_msg(st == PMLA_OK, "build_decode: %s", g_be->last_error(f->b));
  f->args.struct_size = sizeof f->args;
  f->args.q = &f->q.t;
  f->args.kv_cache = &f->kv.t;
  f->args.out = &f->out.t;
  f->args.lse = &f->lse.t;
  f->args.stream = harness_stream();
  f->args.kv_scale = &f->scale.t;
}

static void fx_teardown(fx *f) {
  test_tensor *all[] = {&f->qo, &f->lens, &f->bt, &f->q, &f->kv, &f->out, &f->lse, &f->scale};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    tt_free(all[i]);
  g_be->destroy_builder(f->b);
}

static void fx_poison_out(fx *f) {
  uint16_t o[H * 512];
  for (int i = 0; i < H * 512; i++)
    o[i] = OUT_SENTINEL;
  tt_upload(&f->out, o);
}

static int fx_out_intact(const fx *f) {
  uint16_t o[H * 512];
  tt_download(&f->out, o);
  for (int i = 0; i < H * 512; i++)
    if (o[i] != OUT_SENTINEL)
      return 0;
  return 1;
}

/* A 1.0 host's args (48 bytes; harness_sized_copy) */
static void *args_1_0(const pmla_decode_args *args) {
  return harness_sized_copy(args, PMLA_DECODE_ARGS_SIZE_1_0);
}

/* decode(args) fails with `want`, a message naming `what`, out untouched */
static void expect_refused(fx *f, const pmla_decode_args *args, pmla_status want,
                           const char *what, const char *label) {
  fx_poison_out(f);
  pmla_status st = g_be->decode(f->b, args);
  const char *msg = g_be->last_error(f->b);
  ck_assert_msg(st == want, "%s: decode gave %s, want %s (%s)", label, harness_status_name(st),
                harness_status_name(want), msg);
  ck_assert_msg(strstr(msg, what) != NULL, "%s: message does not name %s: %s", label, what, msg);
  ck_assert_msg(fx_out_intact(f), "%s: out was written by a refused decode", label);
}

/* kv_dtype takes bf16 and both FP8 layouts; q and out stay bf16 */
START_TEST(test_builder_takes_fp8_kv_dtypes_and_only_for_the_cache) {
  REQUIRE_BACKEND();
  static const uint32_t ok[] = {PMLA_DTYPE_BF16, PMLA_DTYPE_FP8_E4M3, PMLA_DTYPE_FP8_DS_MLA};
  for (size_t i = 0; i < 3; i++) {
    pmla_builder_config c = harness_config(H, PS, 1, 1, 64, 2);
    c.kv_dtype = ok[i];
    pmla_builder *b = NULL;
    pmla_status st = g_be->init_builder(&c, &b);
    ck_assert_msg(st == PMLA_OK, "kv_dtype %u: %s", ok[i], g_be->last_error(NULL));
    g_be->destroy_builder(b);
  }
  struct {
    int field; /* 0 q_dtype, 1 kv_dtype, 2 out_dtype */
    uint32_t value;
    pmla_status want;
  } bad[] = {{1, 0, PMLA_ERR_INVALID_ARGUMENT}, {1, 4, PMLA_ERR_INVALID_ARGUMENT},
             {0, PMLA_DTYPE_FP8_E4M3, PMLA_ERR_UNSUPPORTED},
             {2, PMLA_DTYPE_FP8_DS_MLA, PMLA_ERR_UNSUPPORTED}};
  static const char *const names[] = {"q_dtype", "kv_dtype", "out_dtype"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    pmla_builder_config c = harness_config(H, PS, 1, 1, 0, 2);
    uint32_t *field = bad[i].field == 0 ? &c.q_dtype : bad[i].field == 1 ? &c.kv_dtype
                                                                           : &c.out_dtype;
    *field = bad[i].value;
    pmla_builder *b = (pmla_builder *)0x1;
    pmla_status st = g_be->init_builder(&c, &b);
    const char *msg = g_be->last_error(NULL);
    ck_assert_msg(st == bad[i].want, "%s = %u gave %s", names[bad[i].field], bad[i].value,
                  harness_status_name(st));
    ck_assert_msg(strstr(msg, names[bad[i].field]) && strstr(msg, "accepted"),
                  "%s = %u: message %s", names[bad[i].field], bad[i].value, msg);
  }
}
END_TEST

/* Each builder takes only the cache of its kv_dtype: dtype and row width */
START_TEST(test_a_cache_of_another_kv_dtype_is_refused) {
  REQUIRE_BACKEND();
  static const uint32_t dts[] = {PMLA_DTYPE_BF16, PMLA_DTYPE_FP8_E4M3, PMLA_DTYPE_FP8_DS_MLA};
  for (size_t i = 0; i < 3; i++) {
    fx f;
    fx_setup(&f, dts[i]);
    /* the cache of every other dtype, same pages */
    for (size_t j = 0; j < 3; j++) {
      if (j == i)
        continue;
      test_tensor other;
      const int64_t w = test_kv_width(dts[j]);
      if (dts[j] == PMLA_DTYPE_BF16)
        tt_make3(&other, TT_BF16, NULL, PAGES, PS, 576);
      else
        tt_make3(&other, kDLUInt, 8, NULL, PAGES, PS, w);
      pmla_decode_args a = f.args;
      a.kv_cache = &other.t;
      char label[64];
      snprintf(label, sizeof label, "kv_dtype %u given a kv_dtype %u cache", dts[i], dts[j]);
      expect_refused(&f, &a, PMLA_ERR_INVALID_ARGUMENT, "kv_cache", label);
      tt_free(&other);
    }
    /* signed int8 is not a byte cache */
    if (dts[i] != PMLA_DTYPE_BF16) {
      test_tensor s8;
      tt_make3(&s8, kDLInt, 8, NULL, PAGES, PS, test_kv_width(dts[i]));
      pmla_decode_args a = f.args;
      a.kv_cache = &s8.t;
      expect_refused(&f, &a, PMLA_ERR_INVALID_ARGUMENT, "kv_cache", "int8 cache");
      tt_free(&s8);
    }
    fx_teardown(&f);
  }
}
END_TEST

/* fp8_e4m3 reads kv_scale: NULL, a 1.0-sized args struct without the
 * member, or a tensor that is not fp32 [1] on the device is refused */
START_TEST(test_fp8_e4m3_requires_a_kv_scale_tensor) {
  REQUIRE_BACKEND();
  fx f;
  fx_setup(&f, PMLA_DTYPE_FP8_E4M3);
  pmla_decode_args a = f.args;
  a.kv_scale = NULL;
  expect_refused(&f, &a, PMLA_ERR_INVALID_ARGUMENT, "kv_scale", "NULL kv_scale");
  /* a 1.0 host's struct: exactly its 48 bytes, so reading past them shows
   * under the sanitizers */
  void *small = args_1_0(&f.args);
  expect_refused(&f, small, PMLA_ERR_INVALID_ARGUMENT, "kv_scale", "1.0-sized args");
  free(small);
  small = harness_sized_copy(&f.args, PMLA_DECODE_ARGS_SIZE_1_0 + 4); /* half a kv_scale */
  expect_refused(&f, small, PMLA_ERR_INVALID_ARGUMENT, "kv_scale", "half a kv_scale");
  free(small);
  test_tensor two, f64;
  const float vals[2] = {1.f, 1.f};
  tt_make1(&two, TT_F32, vals, 2);
  tt_make1(&f64, kDLFloat, 64, NULL, 1);
  a = f.args;
  a.kv_scale = &two.t;
  expect_refused(&f, &a, PMLA_ERR_INVALID_ARGUMENT, "kv_scale", "kv_scale [2]");
  a.kv_scale = &f64.t;
  expect_refused(&f, &a, PMLA_ERR_INVALID_ARGUMENT, "kv_scale", "kv_scale float64");
  tt_free(&two);
  tt_free(&f64);
  /* the fixture's own scale decodes */
  ck_assert_int_eq(g_be->decode(f.b, &f.args), PMLA_OK);
  fx_teardown(&f);
}
END_TEST

/* A scale that is not finite and > 0 never turns into a silent NaN: a host
 * backend refuses it (nothing written); a device backend, which reads it
 * only in the kernel, flags PMLA_DEVERR_KV_SCALE and attends nothing
 * (out 0, lse -inf) */
START_TEST(test_a_bad_kv_scale_value_is_refused_or_flagged) {
  REQUIRE_BACKEND();
  const float bad[] = {NAN, INFINITY, -INFINITY, -1.f, 0.f, -0.f};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    fx f;
    fx_setup(&f, PMLA_DTYPE_FP8_E4M3);
    tt_upload(&f.scale, &bad[i]);
    char label[48];
    snprintf(label, sizeof label, "kv_scale %g", (double)bad[i]);
    if (g_mem->device_type == kDLCPU) {
      expect_refused(&f, &f.args, PMLA_ERR_INVALID_ARGUMENT, "kv_scale", label);
    } else {
      fx_poison_out(&f);
      ck_assert_int_eq(g_be->decode(f.b, &f.args), PMLA_OK);
      uint32_t flags = 0;
      pmla_status st = g_be->check_device_error(f.b, &flags);
      ck_assert_msg(st == PMLA_ERR_DEVICE_INPUT && (flags & PMLA_DEVERR_KV_SCALE),
                    "%s: check_device_error %s flags 0x%x", label, harness_status_name(st),
                    flags);
      uint16_t o[H * 512];
      float l[H];
      tt_download(&f.out, o);
      tt_download(&f.lse, l);
      for (int k = 0; k < H * 512; k++)
        ck_assert_msg(o[k] == 0, "%s: out[%d] = 0x%04x, want 0", label, k, o[k]);
      for (int k = 0; k < H; k++)
        ck_assert_msg(isinf(l[k]) && l[k] < 0, "%s: lse[%d] = %g, want -inf", label, k,
                      (double)l[k]);
      ck_assert_int_eq(g_be->check_device_error(f.b, &flags), PMLA_OK);
    }
    fx_teardown(&f);
  }
}
END_TEST

/* A 1.0 host passes the 48-byte pmla_decode_args: a bf16 or DS_MLA builder
 * decodes it exactly as the full struct (nothing past 48 bytes is read) */
START_TEST(test_a_1_0_args_struct_decodes_like_the_1_1_struct) {
  REQUIRE_BACKEND();
  static const uint32_t dts[] = {PMLA_DTYPE_BF16, PMLA_DTYPE_FP8_DS_MLA};
  for (size_t i = 0; i < 2; i++) {
    fx f;
    fx_setup(&f, dts[i]);
    uint16_t full[H * 512], old[H * 512];
    ck_assert_int_eq(g_be->decode(f.b, &f.args), PMLA_OK);
    tt_download(&f.out, full);
    fx_poison_out(&f);
    void *small = args_1_0(&f.args);
    pmla_status st = g_be->decode(f.b, small);
    ck_assert_msg(st == PMLA_OK, "kv_dtype %u, 1.0 args: %s", dts[i], g_be->last_error(f.b));
    free(small);
    tt_download(&f.out, old);
    ck_assert_msg(memcmp(full, old, sizeof full) == 0, "kv_dtype %u: 1.0 args decode differs",
                  dts[i]);
    /* below the 1.0 size is still refused */
    pmla_decode_args a = f.args;
    a.struct_size = PMLA_DECODE_ARGS_SIZE_1_0 - 8;
    expect_refused(&f, &a, PMLA_ERR_STRUCT_SIZE, "struct_size", "args below 1.0 size");
    fx_teardown(&f);
  }
}
END_TEST

Suite *suite_fp8(void) {
  Suite *s = suite_create("fp8");
  TCase *tc = tcase_create("fp8");
  tcase_add_test(tc, test_builder_takes_fp8_kv_dtypes_and_only_for_the_cache);
  tcase_add_test(tc, test_a_cache_of_another_kv_dtype_is_refused);
  tcase_add_test(tc, test_fp8_e4m3_requires_a_kv_scale_tensor);
  tcase_add_test(tc, test_a_bad_kv_scale_value_is_refused_or_flagged);
  tcase_add_test(tc, test_a_1_0_args_struct_decodes_like_the_1_1_struct);
  suite_add_tcase(s, tc);
  return s;
}
