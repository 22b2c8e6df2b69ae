/* SPDX-License-Identifier: MIT */
/* noalloc.c - "nothing is allocated after init_builder": this program
 * interposes malloc, calloc, realloc, free, posix_memalign, aligned_alloc,
 * memalign and valloc (forwarding to glibc's __libc_* entry points), counts
 * the calls made by any thread while counting is on, and asserts that
 * build_decode + decode + build_sparse + decode (and their error paths,
 * query_builder, last_error, check_device_error) make none.
 *
 *   noalloc [PLUGIN.so]     env: PMLA_CONFORMANCE_PLUGIN, PMLA_CONFORMANCE_BACKEND
 *
 * Exit 0 pass, 1 fail, 77 skip (automake's skip code), 99 hard error. It is
 * a plain program (no Check: Check allocates as it reports). Only meaningful
 * for host memory: a GPU backend's device allocations are not seen here. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_config.h"
#include "pmla.h"
#include "interpose.h"
#include "pmla_registry.h"

#ifndef PMLA_TEST_DEFAULT_PLUGIN
#define PMLA_TEST_DEFAULT_PLUGIN "plugin/.libs/pmla.so"
#endif

/* ---- interposition ---- */

static atomic_int counting;
static atomic_long n_alloc, n_free;

static inline void count(atomic_long *c) {
  if (atomic_load_explicit(&counting, memory_order_relaxed))
    atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
}

#ifndef PMLA_TEST_UNDER_SANITIZER
void *malloc(size_t n) {
  count(&n_alloc);
  return __libc_malloc(n);
}
void *calloc(size_t a, size_t b) {
  count(&n_alloc);
  return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n) {
  count(&n_alloc);
  return __libc_realloc(p, n);
}
void free(void *p) {
  if (p)
    count(&n_free);
  __libc_free(p);
}
int posix_memalign(void **out, size_t align, size_t n) {
  count(&n_alloc);
  if (align < sizeof(void *) || (align & (align - 1)))
    return EINVAL;
  void *p = __libc_memalign(align, n);
  if (!p)
    return ENOMEM;
  *out = p;
  return 0;
}
void *aligned_alloc(size_t align, size_t n) {
  count(&n_alloc);
  return __libc_memalign(align, n);
}
void *memalign(size_t align, size_t n); /* glibc's, interposed (no prototype in <stdlib.h>) */
void *memalign(size_t align, size_t n) {
  count(&n_alloc);
  return __libc_memalign(align, n);
}
void *valloc(size_t n) {
  count(&n_alloc);
  return __libc_memalign((size_t)sysconf(_SC_PAGESIZE), n);
}
#endif

/* ---- helpers ---- */
static int failures;
#define FAIL(...)                                                                          \
  do {                                                                                     \
    fprintf(stderr, "FAIL: " __VA_ARGS__);                                                 \
    fputc('\n', stderr);                                                                   \
    failures++;                                                                            \
  } while (0)

static uint16_t bf16(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  b += 0x7fffu + ((b >> 16) & 1u);
  return (uint16_t)(b >> 16);
}

static void tensor(DLTensor *t, int64_t *shape, void *data, uint8_t code, uint8_t bits, int ndim) {
  memset(t, 0, sizeof *t);
  t->data = data;
  t->device.device_type = kDLCPU;
  t->ndim = ndim;
  t->dtype.code = code;
  t->dtype.bits = bits;
  t->dtype.lanes = 1;
  t->shape = shape;
}

/* Runs `what` with counting on and checks no allocation happened. */
#define NO_ALLOC(what, stmt)                                                               \
  do {                                                                                     \
    atomic_store(&n_alloc, 0);                                                             \
    atomic_store(&n_free, 0);                                                              \
    atomic_store(&counting, 1);                                                            \
    stmt;                                                                                  \
    atomic_store(&counting, 0);                                                            \
    long a_ = atomic_load(&n_alloc), f_ = atomic_load(&n_free);                            \
    if (a_ || f_)                                                                          \
      FAIL("%s: %ld allocations and %ld frees after init_builder", what, a_, f_);         \
    else                                                                                   \
      printf("ok: %s: no allocation\n", what);                                             \
  } while (0)

int main(int argc, char **argv) {
#ifdef PMLA_TEST_UNDER_SANITIZER
  (void)argc;
  (void)argv;
  fprintf(stderr, "SKIP: noalloc: built with a sanitizer that owns malloc\n");
  return 77;
#endif
  const char *plugin = test_plugin(argc, argv, PMLA_TEST_DEFAULT_PLUGIN, "noalloc");
  if (!plugin)
    return 99;
  const char *backend = getenv("PMLA_CONFORMANCE_BACKEND");
  if (!backend || !*backend)
    backend = "pmla-cpu";
  /* the counters themselves must see the plugin's calls */
  atomic_store(&counting, 1);
  void *volatile probe = malloc(16);
  free(probe);
  atomic_store(&counting, 0);
  if (atomic_load(&n_alloc) != 1) {
    printf("SKIP: malloc interposition not effective here\n");
    return 77;
  }

  pmla_registry *reg = NULL;
  if (pmla_registry_open(plugin, &reg) != PMLA_OK)
    return 99;
  const pmla_backend *be = pmla_registry_find(reg, backend);
  if (!be) {
    fprintf(stderr, "noalloc: backend %s not in %s\n", backend, plugin);
    return 99;
  }
  if (strcmp(backend, "pmla-cpu") != 0) {
    printf("SKIP: noalloc watches host allocations with host tensors; backend %s\n", backend);
    return 77;
  }

  enum { H = 16, PS = 16, B = 3, MAXQ = 2, TOPK = 128, PAGES = 16, T = 4 };
  pmla_builder_config c = test_config(H, PS, B, MAXQ, TOPK, 3);
  pmla_builder *b = NULL;
  pmla_status s = be->init_builder(&c, &b);
  if (s == PMLA_ERR_NO_DEVICE) {
    printf("SKIP: %s has no device: %s\n", backend, be->last_error(NULL));
    return 77;
  }
  if (s != PMLA_OK) {
    fprintf(stderr, "noalloc: init_builder: %s\n", be->last_error(NULL));
    return 99;
  }

  /* all tensors made before counting starts */
  static int32_t qo[B + 1] = {0, 1, 3, 4}, lens[B] = {100, 0, 200}, bt[B * 16];
  static int32_t kvp[B + 1] = {0, 7, 7, 20}, kvi[20], last[B] = {4, 0, 8}, topk[T * TOPK];
  for (int i = 0; i < B * 16; i++)
    bt[i] = i % PAGES;
  for (int i = 0; i < 20; i++)
    kvi[i] = (i * 5) % PAGES;
  for (int i = 0; i < T * TOPK; i++)
    topk[i] = i % 7 == 3 ? -1 : (i * 13) % (PAGES * PS);
  size_t nq = (size_t)T * H * 576, nkv = (size_t)PAGES * PS * 576, no = (size_t)T * H * 512;
  uint16_t *q = malloc(nq * 2), *kv = malloc(nkv * 2), *out = malloc(no * 2);
  float *lse = malloc((size_t)T * H * 4);
  for (size_t i = 0; i < nq; i++)
    q[i] = bf16((float)((i * 7919) % 201) / 100.0f - 1.0f);
  for (size_t i = 0; i < nkv; i++)
    kv[i] = bf16((float)((i * 104729) % 199) / 100.0f - 1.0f);
  int64_t s_qo[1] = {B + 1}, s_b[1] = {B}, s_bt[2] = {B, 16}, s_kvi[1] = {20};
  int64_t s_topk[2] = {T, TOPK}, s_q[3] = {T, H, 576}, s_kv[3] = {PAGES, PS, 576};
  int64_t s_out[3] = {T, H, 512}, s_lse[2] = {T, H}, s_big[1] = {B + 2};
  DLTensor t_qo, t_lens, t_bt, t_kvp, t_kvi, t_last, t_topk, t_q, t_kv, t_out, t_lse, t_bad;
  tensor(&t_qo, s_qo, qo, kDLInt, 32, 1);
  tensor(&t_lens, s_b, lens, kDLInt, 32, 1);
  tensor(&t_bt, s_bt, bt, kDLInt, 32, 2);
  tensor(&t_kvp, s_qo, kvp, kDLInt, 32, 1);
  tensor(&t_kvi, s_kvi, kvi, kDLInt, 32, 1);
  tensor(&t_last, s_b, last, kDLInt, 32, 1);
  tensor(&t_topk, s_topk, topk, kDLInt, 32, 2);
  tensor(&t_q, s_q, q, kDLBfloat, 16, 3);
  tensor(&t_kv, s_kv, kv, kDLBfloat, 16, 3);
  tensor(&t_out, s_out, out, kDLBfloat, 16, 3);
  tensor(&t_lse, s_lse, lse, kDLFloat, 32, 2);
  tensor(&t_bad, s_big, qo, kDLInt, 32, 1);
  pmla_decode_batch bt_batch = {sizeof bt_batch, PMLA_KV_BLOCK_TABLE, &t_qo, &t_bt, &t_lens,
                                NULL, NULL, NULL, NULL};
  pmla_decode_batch csr_batch = {sizeof csr_batch, PMLA_KV_CSR, &t_qo, NULL, NULL,
                                 &t_kvp, &t_kvi, &t_last, NULL};
  pmla_decode_batch bad_batch = bt_batch;
  bad_batch.qo_indptr = &t_bad;
  pmla_sparse_batch sparse = {sizeof sparse, 0, &t_topk, 3000, NULL};
  pmla_decode_args args = {sizeof args, 0, &t_q, &t_kv, &t_out, &t_lse, NULL, NULL};
  pmla_builder_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  uint32_t flags = 0;
  /* warm-up: lazily initialised library state (e.g. first-use TLS) is fine */
  be->build_decode(b, &bt_batch);
  be->decode(b, &args);

  pmla_status r1 = PMLA_OK, r2 = PMLA_OK, r3 = PMLA_OK, r4 = PMLA_OK, r5 = PMLA_OK, r6 = PMLA_OK;
  NO_ALLOC("build_decode (block table) + decode", {
    r1 = be->build_decode(b, &bt_batch);
    r2 = be->decode(b, &args);
  });
  NO_ALLOC("build_decode (CSR) + decode x3", {
    r3 = be->build_decode(b, &csr_batch);
    for (int i = 0; i < 3; i++)
      r4 = be->decode(b, &args);
  });
  NO_ALLOC("build_sparse + decode", {
    r5 = be->build_sparse(b, &sparse);
    r6 = be->decode(b, &args);
  });
  if (r1 || r2 || r3 || r4 || r5 || r6)
    FAIL("a call failed: %d %d %d %d %d %d (%s)", r1, r2, r3, r4, r5, r6, be->last_error(b));
  NO_ALLOC("query_builder + check_device_error + last_error", {
    be->query_builder(b, &info);
    be->check_device_error(b, &flags);
    (void)be->last_error(b);
  });
  pmla_status e1 = PMLA_OK, e2 = PMLA_OK;
  NO_ALLOC("failing build_decode and decode (error messages)", {
    e1 = be->build_decode(b, &bad_batch);
    args.out = NULL;
    e2 = be->decode(b, &args);
    args.out = &t_out;
    (void)be->last_error(b);
  });
  if (e1 == PMLA_OK || e2 == PMLA_OK)
    FAIL("bad calls were accepted (%d %d)", e1, e2);

  be->destroy_builder(b);
  pmla_registry_close(reg);
  free(q);
  free(kv);
  free(out);
  free(lse);
  if (failures)
    return 1;
  printf("PASS: no allocation after init_builder on %s\n", backend);
  return 0;
}
