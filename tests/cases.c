/* SPDX-License-Identifier: MIT */
/* cases.c - the named decode cases (see cases.h). */
#include "cases.h"

#include "pmla.h"

#define BT PMLA_KV_BLOCK_TABLE
#define CSR PMLA_KV_CSR
/* the fields after kv_dtype (q_scale, nan_at, builder_flags, page_runs)
 * are left out where zero, not spelled as zeros; the cases that set one
 * name their fields */
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
const dense_case dense_cases[] = {
    {"one request, page 16", 16, 16, 2, BT, 1, {1}, {100}, 0, 1, 0, 0},
    {"page 1, CSR, with an empty request", 16, 1, 2, CSR, 3, {1, 2, 1}, {5, 0, 17}, 0, 0, 0, 0},
    {"page 64, batch 8, ragged", 16, 64, 7, BT, 8, {1, 2, 3, 4, 1, 4, 2, 1},
     {0, 1, 63, 64, 65, 200, 129, 7}, 0, 0, 0, 0},
    {"page 64, batch 8, ragged, CSR", 16, 64, 7, CSR, 8, {4, 3, 2, 1, 1, 2, 3, 4},
     {70, 0, 1, 128, 250, 3, 64, 191}, 0, 0, 0, 0},
    {"page 256, CSR", 16, 256, 1, CSR, 3, {2, 1, 3}, {300, 0, 513}, 0, 0, 0, 0},
    {"page 256, block table", 32, 256, 2, BT, 3, {1, 4, 2}, {257, 600, 1}, 0, 0, 0, 0},
    {"heads 128, block table", 128, 16, 2, BT, 3, {1, 2, 1}, {40, 0, 90}, 0, 0, 0, 0},
    {"heads 128, CSR, q_len 4", 128, 64, 7, CSR, 1, {4}, {130}, 0, 0, 0, 0},
    {"heads 64, 4-d cache", 64, 16, 3, BT, 2, {2, 1}, {33, 47}, 1, 0, 0, 0},
    {"kv shorter than q_len", 16, 16, 2, BT, 3, {4, 3, 2}, {2, 0, 1}, 0, 0, 0, 0},
    {"all requests empty", 16, 16, 2, CSR, 3, {1, 2, 1}, {0, 0, 0}, 0, 0, 0, 0},
    {"long request split over 7 units", 16, 16, 7, BT, 1, {1}, {2000}, 0, 1, 1, 0},
    {"long request split over 2 units, q_len 3", 16, 64, 2, CSR, 1, {3}, {1500}, 0, 0, 1, 0},
    {"one long among short, cu 7", 16, 16, 7, BT, 5, {1, 1, 2, 1, 1}, {10, 3000, 5, 0, 64}, 0,
     1, 1, 0},
    {"cu 1: nothing split", 16, 16, 1, BT, 4, {1, 2, 3, 4}, {500, 20, 0, 90}, 0, 0, 0, 0},
    {"batch 0", 16, 16, 2, BT, 0, {0}, {0}, 0, 0, 0, 0},
    {"zero-row request", 16, 16, 2, CSR, 3, {1, 0, 2}, {50, 40, 30}, 0, 0, 0, 0},
    /* long chains of 64-token blocks on 64-row tiles: every pair-loop case
     * of the wgmma bodies (odd and even block counts, with and without a
     * next pair) several times over, split and unsplit */
    {"heads 128, 21 blocks, split, cu 4", 128, 64, 4, BT, 1, {1}, {1300}, 0, 1, 1, 0},
    {"heads 64, q_len 2, up to 18 blocks, cu 4", 64, 16, 4, CSR, 3, {2, 1, 2}, {1100, 700, 1153},
     0, 0, 0, 0},
    /* head counts that are not a row tile: the kernels pad, the host does not */
    {"heads 1, page 64, q_len 4", 1, 64, 3, BT, 3, {4, 1, 2}, {300, 64, 0}, 0, 0, 0, 0},
    {"heads 3, page 16, CSR", 3, 16, 2, CSR, 3, {2, 1, 3}, {100, 33, 250}, 0, 0, 0, 0},
    {"heads 8, page 64", 8, 64, 5, BT, 4, {1, 2, 1, 1}, {129, 700, 64, 5}, 0, 0, 0, 0},
    {"heads 9, page 1, CSR, q_len 3", 9, 1, 2, CSR, 2, {3, 1}, {40, 17}, 0, 0, 0, 0},
    {"heads 63, page 64, long, cu 4", 63, 64, 4, BT, 2, {2, 1}, {1400, 90}, 0, 0, 0, 0},
    {"heads 126, page 64, CSR, q_len 2", 126, 64, 7, CSR, 2, {2, 1}, {450, 1000}, 0, 0, 0, 0},
    /* a lone request over many units: rows of 32 or more pieces, which the
     * GPU reduce merges a block per row (four warps, each some pieces) */
    {"lone request over 64 units", 16, 64, 64, BT, 1, {1}, {4000}, 0, 1, 1, 0},
    {"lone request over 64 units, heads 128, CSR", 128, 16, 64, CSR, 1, {1}, {2100}, 0, 0, 1, 0},
    /* pages side by side in runs of 64: a loader warp's 16 slots are
     * consecutive across pages, except where a run ends among them */
    {.name = "page 1, pages in runs of 64, heads 64", .heads = 64, .page_size = 1, .cu = 3,
     .layout = BT, .batch = 3, .q_lens = {1, 2, 1}, .kv_lens = {700, 130, 1000}, .page_runs = 64},
    {.name = "page 4, pages in runs of 64, heads 128, CSR", .heads = 128, .page_size = 4, .cu = 2,
     .layout = CSR, .batch = 2, .q_lens = {1, 1}, .kv_lens = {900, 333}, .page_runs = 64},
    {.name = "page 1, pages in runs of 64, e4m3, heads 32", .heads = 32, .page_size = 1, .cu = 2,
     .layout = BT, .batch = 2, .q_lens = {1, 1}, .kv_lens = {800, 450},
     .kv_dtype = PMLA_DTYPE_FP8_E4M3, .page_runs = 64},
    {.name = "page 2, pages in runs of 64, batch-invariant, heads 64", .heads = 64, .page_size = 2,
     .cu = 7, .layout = BT, .batch = 2, .q_lens = {1, 1}, .kv_lens = {5000, 300},
     .builder_flags = PMLA_BUILDER_BATCH_INVARIANT, .page_runs = 64},
};
const int n_dense_cases = (int)(sizeof dense_cases / sizeof dense_cases[0]);

const sparse_case sparse_cases[] = {
    {"topk 512, max_seq_len below topk, holes, dups", 16, 64, 512, 7, 3, 40, 300, 10, 5, 0, 0, 0, 0},
    {"topk 512, max_seq_len above topk", 16, 16, 512, 7, 4, 200, 10000, 5, 10, 0, 0, 0, 0},
    {"topk 2048, max_seq_len 4096, cu 7", 16, 16, 2048, 7, 2, 400, 4096, 3, 3, 0, 0, 0, 0},
    {"topk 2048, short lists of 100", 16, 64, 2048, 2, 4, 50, 100, 0, 0, 100, 0, 0, 0},
    {"topk 2048, one token empty", 16, 1, 2048, 3, 3, 3000, 2048, 20, 5, 0, 1, 0, 0},
    {"topk 512, heads 128", 128, 16, 512, 2, 2, 64, 512, 10, 10, 0, 0, 0, 0},
    {"topk 64, page 1, 8 tokens", 32, 1, 64, 3, 8, 500, 64, 25, 25, 0, 0, 0, 0},
    {"topk 512, cu 1", 64, 256, 512, 1, 3, 6, 100000, 5, 5, 300, 0, 0, 0},
    {"topk 2048, max_seq_len 0", 16, 16, 2048, 7, 2, 300, 0, 0, 50, 0, 0, 0, 0},
    {"topk 2048, uncapped (PMLA_SPARSE_NO_SPLIT_CAP), cu 16", 16, 16, 2048, 16, 2, 400, 300, 5,
     5, 0, 0, 1, 0},
    {"topk 256, heads 3", 3, 16, 256, 4, 5, 40, 500, 10, 0, 0, 0, 0, 0},
    {"topk 128, heads 126, page 64", 126, 64, 128, 7, 3, 10, 400, 5, 5, 0, 0, 0, 0},
    /* capped at 2 pieces a token on 5 units: unit 2 holds both pieces of
     * token 1, [0, 768) and the one a block longer [768, 1600), in
     * consecutive slots (the GPU body must not read them as one run of
     * equal chunks) */
    {"topk 1600, cap 2, cu 5: one unit, two pieces of a token", 64, 64, 1600, 5, 3, 40, 300, 0, 0,
     0, 0, 0, 0},
    /* the same with pieces of equal length ([0, 896), [896, 1792)), which
     * the GPU body reads as one stream, the first piece's rows written
     * from registers */
    {"topk 1792, cap 2, cu 5: one unit, two equal pieces of a token", 64, 64, 1792, 5, 3, 40, 300,
     0, 0, 0, 0, 0, 0},
};
const int n_sparse_cases = (int)(sizeof sparse_cases / sizeof sparse_cases[0]);
