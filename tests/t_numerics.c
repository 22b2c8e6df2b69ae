/* t_numerics.c - decode output and lse against the double-precision
 * reference (reference.c), dense and sparse.
 *
 * The KV cache is first filled with bf16 NaN (0x7fc0); only the slots a
 * request may read are then written, so reading any other slot (the tail of
 * a last page, an unused block-table entry, a page of another request)
 * poisons the output. Pages are handed out in random order. out and lse are
 * filled with a sentinel before decode so every row must be written. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "planner.h"
#include "reference.h"

#define MAX_BATCH 16

typedef struct dense_case {
  const char *name;
  uint32_t heads, page_size, cu;
  uint32_t layout; /* PMLA_KV_BLOCK_TABLE or PMLA_KV_CSR */
  int32_t batch;
  int32_t q_lens[MAX_BATCH];
  int32_t kv_lens[MAX_BATCH];
  int kv4d;         /* pass the cache as [pages, page_size, 1, 576] */
  int twice;        /* decode a second q against the same schedule */
  int expect_split; /* some request must be split and reduced */
} dense_case;

typedef struct host_bufs {
  uint16_t *q, *kv, *out;
  float *outf, *lse;
  double *ref_out, *ref_lse;
} host_bufs;

static void fill_q(uint16_t *q, size_t n, uint64_t *rng) {
  for (size_t i = 0; i < n; i++)
    q[i] = ref_float_to_bf16((float)(rng_uniform(rng) * 4.0 - 2.0));
}

static void fill_row(uint16_t *row, uint64_t *rng) {
  for (int d = 0; d < 576; d++)
    row[d] = ref_float_to_bf16((float)(rng_uniform(rng) * 2.0 - 1.0));
}

static void shuffle(int32_t *a, int32_t n, uint64_t *rng) {
  for (int32_t i = n - 1; i > 0; i--) {
    int32_t j = (int32_t)rng_below(rng, (uint32_t)i + 1), t = a[i];
    a[i] = a[j];
    a[j] = t;
  }
}

/* Runs decode and compares to the reference. */
static void decode_and_check(const char *name, pmla_builder *b, const pmla_decode_args *args,
                             test_tensor *out, test_tensor *lse, const ref_problem *p) {
  size_t no = (size_t)p->tokens * p->heads * 512, nl = (size_t)p->tokens * p->heads;
  uint16_t *ho = malloc(no * 2 + 2);
  float *hof = malloc(no * 4 + 4), *hl = malloc(nl * 4 + 4);
  double *ro = malloc(no * 8 + 8), *rl = malloc(nl * 8 + 8);
  ck_assert(ho && hof && hl && ro && rl);
  for (size_t i = 0; i < no; i++)
    ho[i] = 0x7fa5; /* NaN sentinel: every element must be written */
  for (size_t i = 0; i < nl; i++)
    hl[i] = NAN;
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
  pmla_builder *b = harness_init(&cfg);

  /* pages in random order; the 3 spare pages stay NaN */
  int32_t *perm = malloc(sizeof(int32_t) * (size_t)num_pages);
  for (int32_t i = 0; i < num_pages; i++)
    perm[i] = i;
  shuffle(perm, num_pages, &rng);
  const int32_t spare = perm[used];
  int32_t *bt = malloc(sizeof(int32_t) * (size_t)(B > 0 ? B : 1) * (size_t)maxp);
  int32_t kv_indptr[MAX_BATCH + 1] = {0}, last[MAX_BATCH];
  int32_t *kv_indices = malloc(sizeof(int32_t) * (size_t)(used + 1));
  size_t slots = (size_t)num_pages * (size_t)ps;
  uint16_t *kv = malloc(slots * 576 * 2);
  ck_assert(perm && bt && kv_indices && kv);
  for (size_t i = 0; i < slots * 576; i++)
    kv[i] = REF_BF16_NAN;
  int32_t at = 0;
  for (int32_t r = 0; r < B; r++) {
    for (int32_t p = 0; p < maxp; p++)
      bt[r * maxp + p] = p < npages[r] ? perm[at + p] : spare;
    for (int32_t p = 0; p < npages[r]; p++)
      kv_indices[at + p] = perm[at + p];
    kv_indptr[r + 1] = kv_indptr[r] + npages[r];
    last[r] = npages[r] ? c->kv_lens[r] - (npages[r] - 1) * ps : 0;
    for (int32_t pos = 0; pos < c->kv_lens[r]; pos++)
      fill_row(kv + ((size_t)perm[at + pos / ps] * ps + pos % ps) * 576, &rng);
    at += npages[r];
  }

  test_tensor t_qo, t_bt, t_lens, t_kvp, t_kvi, t_last, t_q, t_kv, t_out, t_lse;
  tt_make1(&t_qo, TT_I32, qo, B + 1);
  tt_make2(&t_bt, TT_I32, bt, B, maxp);
  tt_make1(&t_lens, TT_I32, c->kv_lens, B);
  tt_make1(&t_kvp, TT_I32, kv_indptr, B + 1);
  tt_make1(&t_kvi, TT_I32, kv_indices, used);
  tt_make1(&t_last, TT_I32, last, B);
  size_t nq = (size_t)tokens * H * 576;
  uint16_t *q = malloc(nq * 2 + 2);
  fill_q(q, nq, &rng);
  tt_make3(&t_q, TT_BF16, q, tokens, H, 576);
  int64_t kv4[4] = {num_pages, ps, 1, 576};
  if (c->kv4d)
    tt_make(&t_kv, TT_BF16, kv, 4, kv4);
  else
    tt_make3(&t_kv, TT_BF16, kv, num_pages, ps, 576);
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
  pmla_builder_info info = harness_query(b);
  ck_assert_msg(info.split_cap == 0, "%s: dense build reports split_cap %u", c->name,
                info.split_cap);
  if (c->expect_split) {
    int32_t meta[PMLA_META_WORDS];
    ck_assert_int_eq(g_be->copy_buffer(b, PMLA_BUF_WORK_META_DATA, meta, sizeof meta), PMLA_OK);
    ck_assert_msg(meta[PMLA_META_NUM_REDUCE] > 0,
                  "%s: expected a split request (cu %u), schedule has none", c->name, c->cu);
  }

  ref_slot_lists lists;
  int rc = c->layout == PMLA_KV_BLOCK_TABLE
               ? ref_slots_from_block_table(B, qo, bt, maxp, c->kv_lens, ps, &lists)
               : ref_slots_from_csr(B, qo, kv_indptr, kv_indices, last, ps, &lists);
  ck_assert_int_eq(rc, 0);
  ref_problem p = {tokens, H, q, kv, (int64_t)slots, &lists, cfg.softmax_scale};
  pmla_decode_args args = decode_args(&t_q, &t_kv, &t_out, &t_lse);
  decode_and_check(c->name, b, &args, &t_out, &t_lse, &p);
  if (c->twice) { /* the next layer: new q, same schedule */
    fill_q(q, nq, &rng);
    tt_upload(&t_q, q);
    decode_and_check(c->name, b, &args, &t_out, &t_lse, &p);
  }
  ref_slot_lists_free(&lists);
  test_tensor *all[] = {&t_qo, &t_bt, &t_lens, &t_kvp, &t_kvi, &t_last, &t_q, &t_kv, &t_out,
                        &t_lse};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    tt_free(all[i]);
  g_be->destroy_builder(b);
  free(perm);
  free(bt);
  free(kv_indices);
  free(kv);
  free(q);
}

#define BT PMLA_KV_BLOCK_TABLE
#define CSR PMLA_KV_CSR
static const dense_case dense_cases[] = {
    {"one request, page 16", 16, 16, 2, BT, 1, {1}, {100}, 0, 1, 0},
    {"page 1, CSR, with an empty request", 16, 1, 2, CSR, 3, {1, 2, 1}, {5, 0, 17}, 0, 0, 0},
    {"page 64, batch 8, ragged", 16, 64, 7, BT, 8, {1, 2, 3, 4, 1, 4, 2, 1},
     {0, 1, 63, 64, 65, 200, 129, 7}, 0, 0, 0},
    {"page 64, batch 8, ragged, CSR", 16, 64, 7, CSR, 8, {4, 3, 2, 1, 1, 2, 3, 4},
     {70, 0, 1, 128, 250, 3, 64, 191}, 0, 0, 0},
    {"page 256, CSR", 16, 256, 1, CSR, 3, {2, 1, 3}, {300, 0, 513}, 0, 0, 0},
    {"page 256, block table", 32, 256, 2, BT, 3, {1, 4, 2}, {257, 600, 1}, 0, 0, 0},
    {"heads 128, block table", 128, 16, 2, BT, 3, {1, 2, 1}, {40, 0, 90}, 0, 0, 0},
    {"heads 128, CSR, q_len 4", 128, 64, 7, CSR, 1, {4}, {130}, 0, 0, 0},
    {"heads 64, 4-d cache", 64, 16, 3, BT, 2, {2, 1}, {33, 47}, 1, 0, 0},
    {"kv shorter than q_len", 16, 16, 2, BT, 3, {4, 3, 2}, {2, 0, 1}, 0, 0, 0},
    {"all requests empty", 16, 16, 2, CSR, 3, {1, 2, 1}, {0, 0, 0}, 0, 0, 0},
    {"long request split over 7 units", 16, 16, 7, BT, 1, {1}, {2000}, 0, 1, 1},
    {"long request split over 2 units, q_len 3", 16, 64, 2, CSR, 1, {3}, {1500}, 0, 0, 1},
    {"one long among short, cu 7", 16, 16, 7, BT, 5, {1, 1, 2, 1, 1}, {10, 3000, 5, 0, 64}, 0,
     1, 1},
    {"cu 1: nothing split", 16, 16, 1, BT, 4, {1, 2, 3, 4}, {500, 20, 0, 90}, 0, 0, 0},
    {"batch 0", 16, 16, 2, BT, 0, {0}, {0}, 0, 0, 0},
    {"zero-row request", 16, 16, 2, CSR, 3, {1, 0, 2}, {50, 40, 30}, 0, 0, 0},
    /* long chains of 64-token blocks on 64-row tiles: every pair-loop case
     * of the wgmma bodies (odd and even block counts, with and without a
     * next pair) several times over, split and unsplit */
    {"heads 128, 21 blocks, split, cu 4", 128, 64, 4, BT, 1, {1}, {1300}, 0, 1, 1},
    {"heads 64, q_len 2, up to 18 blocks, cu 4", 64, 16, 4, CSR, 3, {2, 1, 2}, {1100, 700, 1153},
     0, 0, 0},
};
#define N_DENSE ((int)(sizeof dense_cases / sizeof dense_cases[0]))

START_TEST(test_dense_decode_matches_reference) {
  REQUIRE_BACKEND();
  run_dense(&dense_cases[_i], harness_seed() + (uint64_t)_i * 1000);
}
END_TEST

/* Random shapes: page sizes 1..256, batch 1/3/8, q_len 1..4, ragged and
 * zero lengths, both layouts, cu 1/2/7. */
START_TEST(test_dense_decode_matches_reference_on_random_batches) {
  REQUIRE_BACKEND();
  uint64_t rng = harness_seed() ^ (0x9000u + (uint64_t)_i);
  static const uint32_t pages[] = {1, 16, 64, 256}, heads[] = {16, 16, 32, 64};
  static const uint32_t cus[] = {1, 2, 7};
  static const int32_t batches[] = {1, 3, 8};
  dense_case c;
  memset(&c, 0, sizeof c);
  char name[64];
  snprintf(name, sizeof name, "random dense #%d", _i);
  c.name = name;
  c.page_size = pages[rng_below(&rng, 4)];
  c.heads = _i == 5 ? 128 : heads[rng_below(&rng, 4)];
  c.cu = cus[rng_below(&rng, 3)];
  c.layout = rng_below(&rng, 2) ? BT : CSR;
  c.batch = batches[rng_below(&rng, 3)];
  c.twice = _i % 4 == 0;
  int32_t budget = c.heads >= 64 ? 400 : 1500; /* keeps each case well under a second */
  for (int32_t r = 0; r < c.batch; r++) {
    c.q_lens[r] = 1 + (int32_t)rng_below(&rng, 4);
    uint32_t k = rng_below(&rng, 8);
    c.kv_lens[r] = k == 0 ? 0 : k == 1 ? (int32_t)rng_below(&rng, 5) : (int32_t)rng_below(&rng, (uint32_t)budget);
  }
  run_dense(&c, rng);
}
END_TEST

/* ---- sparse ---- */

typedef struct sparse_case {
  const char *name;
  uint32_t heads, page_size, topk, cu;
  int32_t tokens, num_pages;
  int64_t max_seq_len;
  int hole_pct, dup_pct;
  int32_t valid; /* listed entries per token (0: topk); the rest are -1 */
  int empty_token0; /* token 0 lists only -1 */
  int nocap;        /* build with PMLA_SPARSE_NO_SPLIT_CAP */
} sparse_case;

static void run_sparse(const sparse_case *c, uint64_t seed) {
  uint64_t rng = seed;
  const int32_t T = c->tokens, K = (int32_t)c->topk, H = (int32_t)c->heads;
  const int64_t slots = (int64_t)c->num_pages * c->page_size;
  uint32_t max_q = 2, max_batch = (uint32_t)(T + 1) / 2;
  pmla_builder_config cfg = harness_config(c->heads, c->page_size, max_batch, max_q, c->topk,
                                           c->cu);
  pmla_builder *b = harness_init(&cfg);
  int32_t *idx = malloc(sizeof(int32_t) * (size_t)T * (size_t)K);
  uint16_t *kv = malloc((size_t)slots * 576 * 2);
  char *written = calloc((size_t)slots, 1);
  ck_assert(idx && kv && written);
  for (size_t i = 0; i < (size_t)slots * 576; i++)
    kv[i] = REF_BF16_NAN;
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
        fill_row(kv + (size_t)row[k] * 576, &rng);
      }
  }
  size_t nq = (size_t)T * H * 576;
  uint16_t *q = malloc(nq * 2);
  fill_q(q, nq, &rng);
  test_tensor t_idx, t_q, t_kv, t_out, t_lse;
  tt_make2(&t_idx, TT_I32, idx, T, K);
  tt_make3(&t_q, TT_BF16, q, T, H, 576);
  tt_make3(&t_kv, TT_BF16, kv, c->num_pages, c->page_size, 576);
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
  pmla_builder_info info = harness_query(b);
  int32_t want_cap =
      c->nocap ? 0 : pmla_sparse_split_cap(c->max_seq_len, c->topk, info.cu_count);
  ck_assert_msg(info.split_cap == (uint32_t)want_cap,
                "%s: split_cap %u, want min(next_pow2(max(1, min(%lld, %u) / 128)), %u) = %d",
                c->name, info.split_cap, (long long)c->max_seq_len, c->topk, info.cu_count,
                want_cap);
  int32_t meta[PMLA_META_WORDS];
  ck_assert_int_eq(g_be->copy_buffer(b, PMLA_BUF_WORK_META_DATA, meta, sizeof meta), PMLA_OK);
  if (c->nocap) /* uncapped, few tokens over many units: tokens split wider */
    ck_assert_msg(meta[PMLA_META_MAX_PIECES] > pmla_sparse_split_cap(c->max_seq_len, c->topk,
                                                                    info.cu_count),
                  "%s: uncapped schedule has only %d pieces per token", c->name,
                  meta[PMLA_META_MAX_PIECES]);
  else
    ck_assert_msg(meta[PMLA_META_MAX_PIECES] <= want_cap, "%s: a token has %d pieces > cap %d",
                  c->name, meta[PMLA_META_MAX_PIECES], want_cap);

  ref_slot_lists lists;
  ck_assert_int_eq(ref_slots_from_topk(T, K, idx, &lists), 0);
  ref_problem p = {T, H, q, kv, slots, &lists, cfg.softmax_scale};
  pmla_decode_args args = decode_args(&t_q, &t_kv, &t_out, &t_lse);
  decode_and_check(c->name, b, &args, &t_out, &t_lse, &p);
  ref_slot_lists_free(&lists);
  test_tensor *all[] = {&t_idx, &t_q, &t_kv, &t_out, &t_lse};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    tt_free(all[i]);
  g_be->destroy_builder(b);
  free(idx);
  free(kv);
  free(written);
  free(q);
}

static const sparse_case sparse_cases[] = {
    {"topk 512, max_seq_len below topk, holes, dups", 16, 64, 512, 7, 3, 40, 300, 10, 5, 0, 0, 0},
    {"topk 512, max_seq_len above topk", 16, 16, 512, 7, 4, 200, 10000, 5, 10, 0, 0, 0},
    {"topk 2048, max_seq_len 4096, cu 7", 16, 16, 2048, 7, 2, 400, 4096, 3, 3, 0, 0, 0},
    {"topk 2048, short lists of 100", 16, 64, 2048, 2, 4, 50, 100, 0, 0, 100, 0, 0},
    {"topk 2048, one token empty", 16, 1, 2048, 3, 3, 3000, 2048, 20, 5, 0, 1, 0},
    {"topk 512, heads 128", 128, 16, 512, 2, 2, 64, 512, 10, 10, 0, 0, 0},
    {"topk 64, page 1, 8 tokens", 32, 1, 64, 3, 8, 500, 64, 25, 25, 0, 0, 0},
    {"topk 512, cu 1", 64, 256, 512, 1, 3, 6, 100000, 5, 5, 300, 0, 0},
    {"topk 2048, max_seq_len 0", 16, 16, 2048, 7, 2, 300, 0, 0, 50, 0, 0, 0},
    {"topk 2048, uncapped (PMLA_SPARSE_NO_SPLIT_CAP), cu 16", 16, 16, 2048, 16, 2, 400, 300, 5,
     5, 0, 0, 1},
};
#define N_SPARSE ((int)(sizeof sparse_cases / sizeof sparse_cases[0]))

START_TEST(test_sparse_decode_matches_reference) {
  REQUIRE_BACKEND();
  run_sparse(&sparse_cases[_i], harness_seed() + 77 + (uint64_t)_i);
}
END_TEST

/* The cap the query reports follows the formula for every max_seq_len. */
START_TEST(test_sparse_split_cap_through_query) {
  REQUIRE_BACKEND();
  static const uint32_t cus[] = {1, 5, 16};
  static const int64_t seqs[] = {0, 1, 127, 128, 255, 256, 300, 1000, 2047, 2048, 4096, 1 << 20};
  for (size_t ci = 0; ci < 3; ci++) {
    pmla_builder_config cfg = harness_config(16, 64, 2, 1, 2048, cus[ci]);
    pmla_builder *b = harness_init(&cfg);
    int32_t *idx = malloc(sizeof(int32_t) * 2 * 2048);
    for (int i = 0; i < 2 * 2048; i++)
      idx[i] = i % 3 ? i % 1000 : -1;
    test_tensor t;
    tt_make2(&t, TT_I32, idx, 2, 2048);
    pmla_sparse_batch sb;
    memset(&sb, 0, sizeof sb);
    sb.struct_size = sizeof sb;
    sb.topk_indices = &t.t;
    sb.stream = harness_stream();
    for (size_t si = 0; si < sizeof seqs / sizeof seqs[0]; si++) {
      sb.max_seq_len = seqs[si];
      ck_assert_int_eq(g_be->build_sparse(b, &sb), PMLA_OK);
      pmla_builder_info info = harness_query(b);
      uint32_t want = (uint32_t)pmla_sparse_split_cap(seqs[si], 2048, info.cu_count);
      ck_assert_msg(info.split_cap == want, "cu %u max_seq_len %lld: split_cap %u want %u",
                    info.cu_count, (long long)seqs[si], info.split_cap, want);
    }
    tt_free(&t);
    free(idx);
    g_be->destroy_builder(b);
  }
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
  dense_case d = {"dense step", 16, 16, 3, BT, 3, {1, 2, 1}, {40, 130, 7}, 0, 1, 0};
  sparse_case s = {"sparse step", 16, 16, 512, 3, 4, 64, 1000, 10, 5, 0, 0, 0};
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
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_dense_decode_matches_reference, 0, N_DENSE);
  tcase_add_loop_test(tc, test_dense_decode_matches_reference_on_random_batches, 0, 24);
  suite_add_tcase(s, tc);
  tc = tcase_create("sparse");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_sparse_decode_matches_reference, 0, N_SPARSE);
  tcase_add_test(tc, test_sparse_split_cap_through_query);
  tcase_add_test(tc, test_sparse_unknown_flags_are_refused);
  tcase_add_test(tc, test_builder_alternates_dense_and_sparse_steps);
  suite_add_tcase(s, tc);
  return s;
}
