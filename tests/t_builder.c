/* SPDX-License-Identifier: MIT */
/* t_builder.c - init_builder / destroy_builder / query_builder / copy_buffer
 * / last_error: accepted and rejected configs with their codes and
 * messages, struct_size both ways, buffer sizes against the header's
 * formulas, the CU-count override. */
#define _GNU_SOURCE /* sched_getaffinity / sched_setaffinity */
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "test_config.h"

#define SENTINEL_BUILDER ((pmla_builder *)(uintptr_t)0x5e47)

static pmla_builder_config base_config(void) { return harness_config(16, 16, 8, 4, 0, 2); }

/* Calls init_builder expecting `want`; checks nothing was written to *out and
 * that last_error(NULL) names `field`. */
static void expect_init_fails(const pmla_builder_config *c, pmla_status want, const char *field,
                              const char *what) {
  pmla_builder *b = SENTINEL_BUILDER;
  pmla_status s = g_be->init_builder(c, &b);
  if (s == PMLA_OK && b != SENTINEL_BUILDER)
    g_be->destroy_builder(b);
  ck_assert_msg(s == want, "%s: init_builder returned %s, want %s (%s)", what,
                harness_status_name(s), harness_status_name(want), g_be->last_error(NULL));
  const char *msg = g_be->last_error(NULL);
  ck_assert_msg(msg != NULL && msg[0] != '\0', "%s: last_error(NULL) empty after failed init",
                what);
  if (field)
    ck_assert_msg(strstr(msg, field) != NULL, "%s: message '%s' does not name '%s'", what, msg,
                  field);
  ck_assert_msg(b == SENTINEL_BUILDER,
                "%s: *out written on failure (%p); pmla.h: on error nothing is written", what,
                (void *)b);
}

START_TEST(test_destroy_builder_accepts_null) {
  if (!g_be) {
    harness_print_skip(__func__, harness_skip_reason());
    return;
  }
  g_be->destroy_builder(NULL);
}
END_TEST

START_TEST(test_init_accepts_every_head_count_from_1_to_128) {
  REQUIRE_BACKEND();
  for (uint32_t h = 1; h <= PMLA_MAX_HEADS; h++) {
    pmla_builder_config c = base_config();
    c.num_heads = h;
    pmla_builder *b = harness_init(&c);
    pmla_builder_info info = harness_query(b);
    ck_assert_uint_ge(info.total_bytes, 1);
    const char *e = g_be->last_error(b);
    ck_assert_msg(e != NULL, "last_error(builder) returned NULL");
    g_be->destroy_builder(b);
  }
}
END_TEST

START_TEST(test_init_rejects_unsupported_head_counts) {
  REQUIRE_BACKEND();
  static const uint32_t heads[] = {0, 129, 256, 0xffffffffu};
  for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
    pmla_builder_config c = base_config();
    c.num_heads = heads[i];
    char what[64];
    snprintf(what, sizeof what, "num_heads %u", heads[i]);
    expect_init_fails(&c, PMLA_ERR_UNSUPPORTED, "num_heads", what);
    const char *msg = g_be->last_error(NULL);
    ck_assert_msg(strstr(msg, "1..128") != NULL,
                  "num_heads %u: message '%s' does not say \"1..128\"", heads[i], msg);
  }
}
END_TEST

/* One rejected field per row. */
typedef struct bad_field {
  const char *what;
  const char *field; /* must appear in last_error(NULL) */
  pmla_status want;
  void (*mutate)(pmla_builder_config *c);
} bad_field;

#define MUT(name, stmt)                                                                    \
  static void name(pmla_builder_config *c) { stmt; }
MUT(m_rank_256, c->kv_lora_rank = 256)
MUT(m_rank_0, c->kv_lora_rank = 0)
MUT(m_rope_0, c->rope_dim = 0)
MUT(m_rope_128, c->rope_dim = 128)
MUT(m_q_fp8, c->q_dtype = PMLA_DTYPE_FP8_E4M3)
MUT(m_q_ds_mla, c->q_dtype = PMLA_DTYPE_FP8_DS_MLA)
MUT(m_out_fp8, c->out_dtype = PMLA_DTYPE_FP8_E4M3)
MUT(m_q_dtype_0, c->q_dtype = 0)
MUT(m_kv_dtype_99, c->kv_dtype = 99)
MUT(m_page_0, c->page_size = 0)
MUT(m_page_3, c->page_size = 3)
MUT(m_page_24, c->page_size = 24)
MUT(m_page_512, c->page_size = 512)
MUT(m_batch_0, c->max_batch = 0)
MUT(m_batch_big, c->max_batch = 65537)
MUT(m_qlen_0, c->max_q_len = 0)
MUT(m_qlen_9, c->max_q_len = 9)
MUT(m_topk_big, c->topk = 65537)
MUT(m_scale_0, c->softmax_scale = 0.0f)
MUT(m_scale_neg, c->softmax_scale = -0.04f)
MUT(m_scale_nan, c->softmax_scale = NAN)
MUT(m_scale_inf, c->softmax_scale = INFINITY)
MUT(m_scale_ninf, c->softmax_scale = -INFINITY)
MUT(m_scale_huge, c->softmax_scale = 3e38f) /* finite, but times log2(e) it is not */
MUT(m_cu_big, c->cu_count = 1025)
MUT(m_device_neg, c->device = -1)

static const bad_field bad_fields[] = {
    {"kv_lora_rank 256", "kv_lora_rank", PMLA_ERR_UNSUPPORTED, m_rank_256},
    {"kv_lora_rank 0", "kv_lora_rank", PMLA_ERR_UNSUPPORTED, m_rank_0},
    {"rope_dim 0", "rope_dim", PMLA_ERR_UNSUPPORTED, m_rope_0},
    {"rope_dim 128", "rope_dim", PMLA_ERR_UNSUPPORTED, m_rope_128},
    {"q_dtype fp8", "q_dtype", PMLA_ERR_UNSUPPORTED, m_q_fp8},
    {"q_dtype fp8_ds_mla (KV only)", "q_dtype", PMLA_ERR_UNSUPPORTED, m_q_ds_mla},
    {"out_dtype fp8", "out_dtype", PMLA_ERR_UNSUPPORTED, m_out_fp8},
    {"q_dtype 0 (no such dtype)", "q_dtype", PMLA_ERR_INVALID_ARGUMENT, m_q_dtype_0},
    {"kv_dtype 99 (no such dtype)", "kv_dtype", PMLA_ERR_INVALID_ARGUMENT, m_kv_dtype_99},
    {"page_size 0", "page_size", PMLA_ERR_INVALID_ARGUMENT, m_page_0},
    {"page_size 3", "page_size", PMLA_ERR_INVALID_ARGUMENT, m_page_3},
    {"page_size 24", "page_size", PMLA_ERR_INVALID_ARGUMENT, m_page_24},
    {"page_size 512", "page_size", PMLA_ERR_INVALID_ARGUMENT, m_page_512},
    {"max_batch 0", "max_batch", PMLA_ERR_INVALID_ARGUMENT, m_batch_0},
    {"max_batch 65537", "max_batch", PMLA_ERR_INVALID_ARGUMENT, m_batch_big},
    {"max_q_len 0", "max_q_len", PMLA_ERR_INVALID_ARGUMENT, m_qlen_0},
    {"max_q_len 9", "max_q_len", PMLA_ERR_INVALID_ARGUMENT, m_qlen_9},
    {"topk 65537", "topk", PMLA_ERR_INVALID_ARGUMENT, m_topk_big},
    {"softmax_scale 0", "softmax_scale", PMLA_ERR_INVALID_ARGUMENT, m_scale_0},
    {"softmax_scale -0.04", "softmax_scale", PMLA_ERR_INVALID_ARGUMENT, m_scale_neg},
    {"softmax_scale NaN", "softmax_scale", PMLA_ERR_INVALID_ARGUMENT, m_scale_nan},
    {"softmax_scale inf", "softmax_scale", PMLA_ERR_INVALID_ARGUMENT, m_scale_inf},
    {"softmax_scale -inf", "softmax_scale", PMLA_ERR_INVALID_ARGUMENT, m_scale_ninf},
    {"softmax_scale 3e38", "softmax_scale", PMLA_ERR_INVALID_ARGUMENT, m_scale_huge},
    {"cu_count 1025", "cu_count", PMLA_ERR_INVALID_ARGUMENT, m_cu_big},
    {"device -1", "device", PMLA_ERR_INVALID_ARGUMENT, m_device_neg},
};
#define N_BAD_FIELDS ((int)(sizeof bad_fields / sizeof bad_fields[0]))

START_TEST(test_init_rejects_each_bad_config_field) {
  REQUIRE_BACKEND();
  const bad_field *f = &bad_fields[_i];
  pmla_builder_config c = base_config();
  f->mutate(&c);
  expect_init_fails(&c, f->want, f->field, f->what);
}
END_TEST

/* pmla-cpu has one device: ordinal 0. */
START_TEST(test_cpu_init_rejects_nonzero_device) {
  REQUIRE_BACKEND();
  if (strcmp(g_backend_name, "pmla-cpu") != 0) {
    harness_print_skip(__func__, "a GPU backend may have a device 1");
    return;
  }
  pmla_builder_config c = base_config();
  c.device = 1;
  pmla_builder *b = SENTINEL_BUILDER;
  pmla_status s = g_be->init_builder(&c, &b);
  ck_assert_msg(s == PMLA_ERR_INVALID_ARGUMENT || s == PMLA_ERR_NO_DEVICE,
                "pmla-cpu device 1: %s", harness_status_name(s));
  ck_assert(b == SENTINEL_BUILDER);
  ck_assert_msg(strstr(g_be->last_error(NULL), "device"), "message '%s' does not name device",
                g_be->last_error(NULL));
}
END_TEST

/* pmla-cpu zeroes what it allocates at init, and under Linux's overcommit
 * zeroing more than the host has ends in the OOM killer: a builder larger
 * than the available memory is refused with a message instead. A
 * batch-invariant builder of 128 heads, 8 query tokens and 1024 workers
 * holds at least 9 * 1024 partial slots of 1024 rows x 512 fp32 (pmla.h),
 * 18 GiB, and each worker's scratch on top: a host with less than 18 GiB
 * available cannot hold it. */
START_TEST(test_cpu_init_refuses_a_builder_larger_than_the_available_memory) {
  REQUIRE_BACKEND();
  if (strcmp(g_backend_name, "pmla-cpu") != 0) {
    harness_print_skip(__func__, "a GPU backend's partials are device memory");
    return;
  }
  const uint64_t least = 9ull * 1024 * (8 * 128) * 512 * 4, have = test_host_available_bytes();
  if (have == 0 || have > least) {
    char why[160];
    if (have == 0)
      snprintf(why, sizeof why, "/proc/meminfo cannot be read here");
    else
      snprintf(why, sizeof why, "%.1f GiB available here (/proc/meminfo), more than 18 GiB",
               have / 1073741824.0);
    harness_print_skip(__func__, why);
    return;
  }
  pmla_builder_config c = harness_config(128, 64, 1, 8, 0, 1024);
  c.flags = PMLA_BUILDER_BATCH_INVARIANT;
  expect_init_fails(&c, PMLA_ERR_OUT_OF_MEMORY, "GiB is available",
                    "128 heads, 8 tokens, 1024 workers, batch-invariant");
}
END_TEST

/* a negative device: the message gives both rules, so a pmla-cpu host is not
 * sent on to try 1 */
START_TEST(test_init_refuses_a_negative_device_naming_the_cpu_rule) {
  REQUIRE_BACKEND();
  pmla_builder_config c = base_config();
  c.device = -1;
  expect_init_fails(&c, PMLA_ERR_INVALID_ARGUMENT, "config.device", "device -1");
  ck_assert_msg(strstr(g_be->last_error(NULL), "accepted: a GPU ordinal >= 0 (0 for pmla-cpu)"),
                "device -1: message '%s'", g_be->last_error(NULL));
}
END_TEST

START_TEST(test_init_accepts_the_limits) {
  REQUIRE_BACKEND();
  static const uint32_t pages[] = {1, 2, 64, 256};
  for (size_t i = 0; i < 4; i++) {
    pmla_builder_config c = base_config();
    c.page_size = pages[i];
    c.max_q_len = i == 0 ? 8 : 1;
    c.max_batch = 1;
    c.topk = i == 3 ? 2048 : (uint32_t)i;
    c.cu_count = i == 2 ? 1024 : 1;
    g_be->destroy_builder(harness_init(&c));
  }
}
END_TEST

START_TEST(test_init_rejects_too_small_struct_size) {
  REQUIRE_BACKEND();
  static const uint32_t sizes[] = {0, 4, offsetof(pmla_builder_config, softmax_scale),
                                   offsetof(pmla_builder_config, cu_count),
                                   PMLA_BUILDER_CONFIG_SIZE_1_0 - 1};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    pmla_builder_config c = base_config();
    c.struct_size = sizes[i];
    char what[64];
    snprintf(what, sizeof what, "config struct_size %u", sizes[i]);
    expect_init_fails(&c, PMLA_ERR_STRUCT_SIZE, "struct_size", what);
  }
}
END_TEST

START_TEST(test_init_accepts_larger_struct_size) {
  REQUIRE_BACKEND();
  struct {
    pmla_builder_config c;
    unsigned char tail[64];
  } big;
  memset(&big, 0, sizeof big);
  big.c = base_config();
  big.c.struct_size = sizeof big;
  pmla_builder *b = NULL;
  pmla_status s = g_be->init_builder(&big.c, &b);
  ck_assert_msg(s == PMLA_OK && b, "config with struct_size %zu refused: %s (%s)", sizeof big,
                harness_status_name(s), g_be->last_error(NULL));
  g_be->destroy_builder(b);
}
END_TEST

START_TEST(test_init_rejects_null_arguments) {
  REQUIRE_BACKEND();
  pmla_builder *b = SENTINEL_BUILDER;
  ck_assert_int_eq(g_be->init_builder(NULL, &b), PMLA_ERR_INVALID_ARGUMENT);
  ck_assert(b == SENTINEL_BUILDER);
  ck_assert_msg(g_be->last_error(NULL)[0] != '\0', "no message for NULL config");
  pmla_builder_config c = base_config();
  ck_assert_int_eq(g_be->init_builder(&c, NULL), PMLA_ERR_INVALID_ARGUMENT);
  ck_assert_msg(g_be->last_error(NULL)[0] != '\0', "no message for NULL out");
}
END_TEST

START_TEST(test_last_error_is_never_null) {
  REQUIRE_BACKEND();
  ck_assert_ptr_nonnull(g_be->last_error(NULL));
  pmla_builder_config c = base_config();
  pmla_builder *b = harness_init(&c);
  const char *e = g_be->last_error(b);
  ck_assert_ptr_nonnull(e);
  ck_assert_msg(e[0] == '\0', "fresh builder has last_error '%s'", e);
  g_be->destroy_builder(b);
}
END_TEST

/* Every backend the plugin lists (a GPU backend built without a GPU
 * toolchain too) refuses each call given a NULL builder: a status, a
 * message naming the call on the calling thread (last_error(NULL)), and
 * none of the call's outputs written. */
START_TEST(test_every_backend_refuses_a_null_builder_writing_nothing) {
  REQUIRE_BACKEND();
  for (size_t k = 0; k < pmla_registry_count(g_registry); k++) {
    const pmla_backend *be = pmla_registry_backend(g_registry, k);
    uint32_t flags = 0xdeadbeefu;
    pmla_builder_info info;
    memset(&info, 0xab, sizeof info);
    info.struct_size = sizeof info;
    unsigned char dst[8];
    memset(dst, 0xcd, sizeof dst);
    pmla_decode_batch batch = {.struct_size = sizeof batch};
    pmla_sparse_batch sparse = {.struct_size = sizeof sparse};
    pmla_decode_args args = {.struct_size = sizeof args};
    const char *calls[] = {"query_builder", "build_decode", "build_sparse", "decode",
                           "check_device_error", "copy_buffer"};
    for (int c = 0; c < 6; c++) {
      pmla_status s;
      switch (c) {
      case 0: s = be->query_builder(NULL, &info); break;
      case 1: s = be->build_decode(NULL, &batch); break;
      case 2: s = be->build_sparse(NULL, &sparse); break;
      case 3: s = be->decode(NULL, &args); break;
      case 4: s = be->check_device_error(NULL, &flags); break;
      default: s = be->copy_buffer(NULL, PMLA_BUF_WORK_INDPTR, dst, sizeof dst); break;
      }
      const char *m = be->last_error(NULL);
      ck_assert_msg(s != PMLA_OK, "%s: %s(NULL) succeeded", be->name, calls[c]);
      ck_assert_msg(m && strstr(m, calls[c]), "%s: %s(NULL) left the message '%s'", be->name,
                    calls[c], m ? m : "(null)");
    }
    ck_assert_msg(flags == 0xdeadbeefu, "%s: check_device_error(NULL) wrote flags 0x%x",
                  be->name, flags);
    ck_assert_msg(info.struct_size == sizeof info && info.cu_count == 0xababababu,
                  "%s: query_builder(NULL) wrote info", be->name);
    for (size_t i = 0; i < sizeof dst; i++)
      ck_assert_msg(dst[i] == 0xcd, "%s: copy_buffer(NULL) wrote dst", be->name);
  }
}
END_TEST

START_TEST(test_many_builders_coexist_with_their_own_cu_counts) {
  REQUIRE_BACKEND();
  pmla_builder *bs[4];
  for (int i = 0; i < 4; i++) {
    pmla_builder_config c = harness_config(16u << i, 1u << (2 * i), 1 + i, 1 + i, i * 100, 1 + i);
    bs[i] = harness_init(&c);
  }
  for (int i = 0; i < 4; i++) {
    pmla_builder_info info = harness_query(bs[i]);
    ck_assert_uint_eq(info.cu_count, (uint32_t)(1 + i));
  }
  g_be->destroy_builder(bs[2]);
  g_be->destroy_builder(bs[0]);
  g_be->destroy_builder(bs[3]);
  g_be->destroy_builder(bs[1]);
}
END_TEST

/* ---- query_builder ---- */

static void check_buffer_formulas(const pmla_builder_config *c) {
  pmla_builder *b = harness_init(c);
  pmla_builder_info info = harness_query(b);
  const uint64_t R = (uint64_t)c->max_batch * c->max_q_len, N = info.sched_units;
  const uint64_t H = c->num_heads, Q = c->max_q_len;
  char what[160];
  snprintf(what, sizeof what, "heads %u batch %u q_len %u topk %u cu %u (N %u)", c->num_heads,
           c->max_batch, c->max_q_len, c->topk, c->cu_count, info.sched_units);
  ck_assert_msg(info.struct_size >= offsetof(pmla_builder_info, total_bytes) + 8,
                "%s: info.struct_size %u", what, info.struct_size);
  ck_assert_msg(N >= 1, "%s: no scheduling units", what);
  if (c->cu_count)
    ck_assert_msg(info.cu_count == c->cu_count, "%s: cu_count %u, override %u", what,
                  info.cu_count, c->cu_count);
  ck_assert_msg(info.max_requests == R, "%s: max_requests %u != %llu", what, info.max_requests,
                (unsigned long long)R);
  ck_assert_msg(info.max_work_items == R + N, "%s: max_work_items %u != R + N", what,
                info.max_work_items);
  ck_assert_msg(info.max_partial_slots == 2 * N, "%s: max_partial_slots %u != 2N", what,
                info.max_partial_slots);
  const uint64_t want[PMLA_BUF_COUNT] = {
      [PMLA_BUF_WORK_META_DATA] = PMLA_META_WORDS * 4,
      [PMLA_BUF_WORK_INDPTR] = (N + 1) * 4,
      [PMLA_BUF_WORK_INFO_SET] = (R + N) * PMLA_WORK_INFO_WORDS * 4,
      [PMLA_BUF_REDUCE_INDPTR] = (R + 1) * 4,
      [PMLA_BUF_REDUCE_FINAL_MAP] = R * 4,
      [PMLA_BUF_REDUCE_PARTIAL_MAP] = 2 * N * 4,
      [PMLA_BUF_PARTIAL_OUT] = 2 * N * Q * H * 512 * 4,
      [PMLA_BUF_PARTIAL_LSE] = 2 * N * Q * H * 4,
  };
  static const char *names[] = {"work_meta_data",     "work_indptr",      "work_info_set",
                                "reduce_indptr",      "reduce_final_map", "reduce_partial_map",
                                "partial_out",        "partial_lse"};
  uint64_t sum = 0;
  for (int k = 0; k < PMLA_BUF_COUNT; k++) {
    ck_assert_msg(info.buffer_bytes[k] == want[k], "%s: %s is %llu bytes, formula %llu", what,
                  names[k], (unsigned long long)info.buffer_bytes[k],
                  (unsigned long long)want[k]);
    sum += want[k];
  }
  ck_assert_msg(info.total_bytes >= sum, "%s: total_bytes %llu < buffers %llu", what,
                (unsigned long long)info.total_bytes, (unsigned long long)sum);
  /* copy_buffer takes exactly buffer_bytes */
  unsigned char *tmp = malloc(want[PMLA_BUF_WORK_INDPTR] + want[PMLA_BUF_WORK_META_DATA] + 8);
  ck_assert_ptr_nonnull(tmp);
  ck_assert_int_eq(g_be->copy_buffer(b, PMLA_BUF_WORK_META_DATA, tmp, want[0]), PMLA_OK);
  ck_assert_int_eq(g_be->copy_buffer(b, PMLA_BUF_WORK_INDPTR, tmp, want[1]), PMLA_OK);
  ck_assert_int_eq(g_be->copy_buffer(b, PMLA_BUF_WORK_INDPTR, tmp, want[1] - 4),
                   PMLA_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(g_be->copy_buffer(b, PMLA_BUF_WORK_INDPTR, tmp, want[1] + 4),
                   PMLA_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(g_be->copy_buffer(b, PMLA_BUF_COUNT, tmp, 4), PMLA_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(g_be->copy_buffer(b, PMLA_BUF_WORK_INDPTR, NULL, want[1]),
                   PMLA_ERR_INVALID_ARGUMENT);
  free(tmp);
  g_be->destroy_builder(b);
}

START_TEST(test_query_buffer_bytes_match_the_header_formulas) {
  REQUIRE_BACKEND();
  static const uint32_t rows[][5] = {
      /* heads, max_batch, max_q_len, topk, cu */
      {16, 1, 1, 0, 1},  {16, 8, 4, 0, 2},      {32, 7, 8, 2048, 3}, {64, 64, 2, 512, 16},
      {128, 3, 1, 0, 7}, {128, 300, 2, 2048, 12}, {16, 4, 1, 0, 0}};
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    pmla_builder_config c = harness_config(rows[i][0], 16, rows[i][1], rows[i][2], rows[i][3],
                                           rows[i][4]);
    check_buffer_formulas(&c);
  }
}
END_TEST

START_TEST(test_query_honours_the_cu_count_override) {
  REQUIRE_BACKEND();
  static const uint32_t cus[] = {1, 2, 7, 13, 64};
  for (size_t i = 0; i < sizeof cus / sizeof cus[0]; i++) {
    pmla_builder_config c = harness_config(16, 16, 4, 2, 0, cus[i]);
    pmla_builder *b = harness_init(&c);
    pmla_builder_info info = harness_query(b);
    ck_assert_msg(info.cu_count == cus[i], "cu_count override %u, query says %u", cus[i],
                  info.cu_count);
    g_be->destroy_builder(b);
  }
  pmla_builder_config c = harness_config(16, 16, 4, 2, 0, 0);
  pmla_builder *b = harness_init(&c);
  pmla_builder_info info = harness_query(b);
  ck_assert_uint_ge(info.cu_count, 1);
  if (strcmp(g_backend_name, "pmla-cpu") == 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
      const int usable = CPU_COUNT(&set);
      ck_assert_msg(info.cu_count == (uint32_t)(usable > 1024 ? 1024 : usable),
                    "pmla-cpu default cu_count %u, CPUs in the affinity mask %d", info.cu_count,
                    usable);
    }
  }
  g_be->destroy_builder(b);
}
END_TEST

/* In a child: the affinity mask narrowed to CPU *arg, then a builder of
 * cu_count 0. Returns its workers (> 0), 0 when the mask could not be set,
 * or minus the status of a failed call. */
static int32_t workers_on_one_cpu(void *arg) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(*(const int *)arg, &one);
  if (sched_setaffinity(0, sizeof one, &one) != 0)
    return 0;
  pmla_builder_config c = harness_config(16, 16, 4, 2, 0, 0);
  pmla_builder *b = NULL;
  pmla_builder_info info = {.struct_size = sizeof info};
  pmla_status st = g_be->init_builder(&c, &b);
  if (st == PMLA_OK)
    st = g_be->query_builder(b, &info);
  g_be->destroy_builder(b);
  return st == PMLA_OK ? (int32_t)info.cu_count : -(int32_t)st;
}

/* cu_count 0 on pmla-cpu: one worker a CPU the calling thread may run on
 * (its affinity mask, which the workers inherit: a container's cpuset,
 * taskset), not one a CPU of the machine. The mask is narrowed to one CPU in
 * a child, so the runner's own mask is left alone. */
START_TEST(test_cpu_default_workers_follow_the_affinity_mask) {
  REQUIRE_BACKEND();
  if (strcmp(g_backend_name, "pmla-cpu") != 0) {
    harness_print_skip(__func__, "the affinity mask counts host threads (pmla-cpu)");
    return;
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  ck_assert_int_eq(sched_getaffinity(0, sizeof set, &set), 0);
  int first = 0;
  while (first < CPU_SETSIZE && !CPU_ISSET(first, &set))
    first++;
  ck_assert_int_lt(first, CPU_SETSIZE);
  const int32_t report = harness_in_child(workers_on_one_cpu, &first, "the child's builder");
  if (report == 0) {
    harness_print_skip(__func__, "sched_setaffinity is not permitted here");
    return;
  }
  ck_assert_msg(report > 0, "init_builder or query_builder in the child: %s",
                harness_status_name((pmla_status)-report));
  ck_assert_msg(report == 1, "one CPU in the affinity mask, cu_count 0: %d workers", report);
}
END_TEST

START_TEST(test_query_refuses_a_small_struct_and_leaves_a_larger_ones_tail_alone) {
  REQUIRE_BACKEND();
  pmla_builder_config c = base_config();
  pmla_builder *b = harness_init(&c);
  pmla_builder_info small;
  memset(&small, 0x77, sizeof small);
  small.struct_size = offsetof(pmla_builder_info, total_bytes);
  ck_assert_int_eq(g_be->query_builder(b, &small), PMLA_ERR_STRUCT_SIZE);
  ck_assert_msg(small.cu_count == 0x77777777u, "query wrote into a too-small struct");
  ck_assert_msg(strstr(g_be->last_error(b), "struct_size"), "message '%s' lacks struct_size",
                g_be->last_error(b));
  struct {
    pmla_builder_info info;
    unsigned char tail[32];
  } big;
  memset(&big, 0, sizeof big);
  memset(big.tail, 0xcd, sizeof big.tail);
  big.info.struct_size = sizeof big;
  ck_assert_int_eq(g_be->query_builder(b, &big.info), PMLA_OK);
  for (size_t i = 0; i < sizeof big.tail; i++)
    ck_assert_msg(big.tail[i] == 0xcd, "query wrote past its own info struct (+%zu)", i);
  ck_assert_uint_eq(big.info.cu_count, c.cu_count);
  ck_assert_int_eq(g_be->query_builder(b, NULL), PMLA_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(g_be->query_builder(NULL, &big.info), PMLA_ERR_INVALID_ARGUMENT);
  g_be->destroy_builder(b);
}
END_TEST

START_TEST(test_check_device_error_is_clean_on_a_fresh_builder) {
  REQUIRE_BACKEND();
  pmla_builder_config c = base_config();
  pmla_builder *b = harness_init(&c);
  uint32_t flags = 0xffffffffu;
  ck_assert_int_eq(g_be->check_device_error(b, &flags), PMLA_OK);
  ck_assert_uint_eq(flags, 0);
  g_be->destroy_builder(b);
}
END_TEST

Suite *suite_builder(void) {
  Suite *s = suite_create("builder");
  TCase *tc = tcase_create("init");
  tcase_add_test(tc, test_destroy_builder_accepts_null);
  tcase_add_test(tc, test_init_accepts_every_head_count_from_1_to_128);
  tcase_add_test(tc, test_init_rejects_unsupported_head_counts);
  tcase_add_loop_test(tc, test_init_rejects_each_bad_config_field, 0, N_BAD_FIELDS);
  tcase_add_test(tc, test_cpu_init_rejects_nonzero_device);
  tcase_add_test(tc, test_cpu_init_refuses_a_builder_larger_than_the_available_memory);
  tcase_add_test(tc, test_init_refuses_a_negative_device_naming_the_cpu_rule);
  tcase_add_test(tc, test_init_accepts_the_limits);
  tcase_add_test(tc, test_init_rejects_too_small_struct_size);
  tcase_add_test(tc, test_init_accepts_larger_struct_size);
  tcase_add_test(tc, test_init_rejects_null_arguments);
  tcase_add_test(tc, test_last_error_is_never_null);
  tcase_add_test(tc, test_every_backend_refuses_a_null_builder_writing_nothing);
  tcase_add_test(tc, test_many_builders_coexist_with_their_own_cu_counts);
  suite_add_tcase(s, tc);
  tc = tcase_create("query");
  tcase_add_test(tc, test_query_buffer_bytes_match_the_header_formulas);
  tcase_add_test(tc, test_query_honours_the_cu_count_override);
  tcase_add_test(tc, test_cpu_default_workers_follow_the_affinity_mask);
  tcase_add_test(tc, test_query_refuses_a_small_struct_and_leaves_a_larger_ones_tail_alone);
  tcase_add_test(tc, test_check_device_error_is_clean_on_a_fresh_builder);
  suite_add_tcase(s, tc);
  return s;
}
