/* SPDX-License-Identifier: MIT */
/* pmla-bench - runs MLA decode steps through the registry on a chosen
 * backend and prints median time, TFLOP/s, GB/s and the fraction of the copy
 * bandwidth measured at start; --check compares against the fp64 reference.
 *
 *   FLOPs = 2 * h * s_q * sum(L) * (576 + 512)
 *   bytes = sum(L) * (bytes per KV row as stored: 1152 bf16, 576 fp8_e4m3,
 *           656 fp8_ds_mla) + q bytes + out bytes
 * A sparse shape's sum(L) is tokens * topk, the rows its query rows gather;
 * its tokens share one cache of `slots` rows, so rows repeat across tokens
 * (tokens * topk may exceed slots) and the bytes are not DRAM traffic.
 *
 * --check poisons what must not be read (the rows past each request's
 * length, and a page that every unused block-table entry names) and what
 * must be written (out and lse, before the first step of each plugin), so
 * a backend that reads too far or writes nothing fails.
 *
 * Plugins come from --plugin (each a registry search path of its own; then
 * $PMLA_PLUGIN_PATH is not read; several run side by side, one step of each
 * in turn, on the same inputs), else from the registry's default search:
 * $PMLA_PLUGIN_PATH, else the installed plugin directory. --device N runs on
 * GPU N: its memory and stream, and config.device = N for every builder.
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_config.h"
#include "devmem.h"
#include "pmla.h"
#include "pmla_registry.h"
#include "reference.h"

#define QK 576
#define DV 512

typedef struct shape {
  int b, L, L_max, h, sq; /* L_max > L: lengths uniform in [L, L_max] */
  int sparse_topk;       /* > 0: sparse, b = tokens, L = KV cache slots */
  int kv;                /* pmla_dtype of the cache; 0: --kv's (default bf16) */
  int page;              /* page size in slots (dense; 0: 64) */
  int runs;              /* pages dealt in shuffled runs of this many adjacent ones (0: 1) */
} bench_shape;

#define MAX_PLUGINS 8

typedef struct options {
  const char *backend;
  const char *plugins[MAX_PLUGINS]; /* --plugin, repeatable: side by side */
  int nplugins;
  int iters, warmup, check, json, cu, seed, flush, device;
  int kv; /* --kv: the cache dtype of shapes that do not name one */
  int invariant; /* --batch-invariant: builders with PMLA_BUILDER_BATCH_INVARIANT */
  int chunk;     /* --invariant-chunk: their config.invariant_chunk (0: the plugin's) */
  bench_shape shapes[64];
  int nshapes;
} options;

typedef struct result {
  double us, meta_us, tflops, gbps, copy_frac;
  int checked, ok, nocap;
  double max_abs_err, cosine; /* --check: output against the fp64 reference */
  int lse_ok;
  uint32_t cap;
  int32_t mode, splits; /* the last step's schedule mode and split requests (pmla.h's
                           work_meta_data words 3 and 1); -1: not read */
  char note[400];
} result;

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_u64(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}
static float next_unit(void) { return (float)((next_u64() >> 11) * (1.0 / 9007199254740992.0)) * 2.f - 1.f; }

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}
static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* set once the --json document is open: an error then closes it */
static int json_open;
/* set when pmla-bench ends as it means to: by its own return or fail_exit */
static volatile int finished;

static void json_string(const char *text);

/* Prints "pmla-bench: MESSAGE" on stderr; a --json document already begun
 * is closed, with the message as "error". */
static void report_failure(const char *msg) {
  fprintf(stderr, "pmla-bench: %s\n", msg);
  if (json_open) {
    printf("\n ],\n \"error\": ");
    json_string(msg);
    printf("\n}\n");
    json_open = 0;
  }
}

/* report_failure, then exit with code */
static void fail_exit(int code, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  report_failure(msg);
  finished = 1;
  exit(code);
}

/* A plugin that calls exit() inside a call would end the run with its
 * status (0, say) and the output cut short: an exit that pmla-bench did
 * not make is a failure, said as one. */
static void exit_guard(void) {
  if (finished)
    return;
  report_failure("the process exited in the middle of the run (exit() from inside the plugin?)");
  fflush(NULL);
  _Exit(2);
}

/* host memory, or a clear exit naming what it was for */
static void *xmalloc(size_t bytes, const char *what) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p)
    fail_exit(2, "cannot allocate %zu bytes of host memory for %s", bytes, what);
  return p;
}

static DLTensor tensor(void *data, const devmem *m, DLDataType dt, int ndim, int64_t *shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = m->device_type;
  t.device.device_id = m->device_id;
  t.ndim = ndim;
  t.dtype = dt;
  t.shape = shape;
  return t;
}

static void *upload(const devmem *m, const void *host, size_t bytes) {
  void *d = m->alloc(bytes ? bytes : 1);
  if (!d || (bytes && host && m->upload(d, host, bytes)))
    fail_exit(2, "cannot allocate/upload %zu bytes on %s", bytes, m->name);
  return d;
}

static void die_status(const pmla_backend *be, pmla_builder *b, const char *what, pmla_status st) {
  fail_exit(1, "%s failed: %s: %s", what, pmla_status_name(st), be->last_error(b));
}

/* Measures device-to-device copy bandwidth (GB/s, read + write). */
static double copy_bandwidth(const devmem *m) {
  size_t bytes = m->device_type == kDLCPU ? (size_t)256 << 20 : (size_t)2 << 30;
  void *a = m->alloc(bytes), *b = m->alloc(bytes);
  double t[10], gbps = 0;
  if (a && b && !m->fill(a, 1, bytes) && !m->fill(b, 2, bytes)) {
    for (int i = 0; i < 10; i++) {
      m->timer_start();
      m->copy(b, a, bytes);
      t[i] = m->timer_stop_us();
    }
    gbps = 2.0 * (double)bytes / (median(t, 10) * 1e3);
  } else {
    fprintf(stderr, "pmla-bench: copy bandwidth not measured (no 2 x %zu bytes on %s); copy%% "
            "reads 0\n", bytes, m->name);
  }
  m->release(a);
  m->release(b);
  return gbps;
}

typedef struct problem {
  int tokens, heads;
  int64_t sum_L;
  uint16_t *q;
  uint8_t *kv;   /* rows of row_bytes */
  int kv_dtype;  /* pmla_dtype */
  int64_t row_bytes;
  int64_t num_pages, page_size;
  /* dense */
  int batch, max_pages;
  int32_t *qo_indptr, *block_table, *kv_lens;
  /* sparse */
  int topk;
  int32_t *topk_idx;
  int64_t max_seq_len;
} problem;

/* one KV row of random values in [-1, 1] as stored: bf16; e4m3 bytes of
 * magnitude <= 1.875 (with kv_scale 0.5); DS_MLA: e4m3 with tile scales
 * 2^-1, bf16 rope */
static void fill_kv_row(uint8_t *row, int kv_dtype) {
  if (kv_dtype == PMLA_DTYPE_BF16) {
    for (int d = 0; d < QK; d++) {
      uint16_t h = ref_float_to_bf16(next_unit());
      memcpy(row + 2 * d, &h, 2);
    }
    return;
  }
  const int latent = kv_dtype == PMLA_DTYPE_FP8_E4M3 ? QK : DV;
  for (int d = 0; d < latent; d++)
    row[d] = (uint8_t)(next_u64() & 0xbf);
  if (kv_dtype == PMLA_DTYPE_FP8_DS_MLA) {
    const float half = 0.5f;
    for (int t = 0; t < 4; t++)
      memcpy(row + 512 + 4 * t, &half, 4);
    for (int d = 0; d < QK - DV; d++) {
      uint16_t h = ref_float_to_bf16(next_unit());
      memcpy(row + 528 + 2 * d, &h, 2);
    }
  }
}

/* a row that must never be read: NaN in every dtype */
static void poison_kv_row(uint8_t *row, int kv_dtype) {
  if (kv_dtype == PMLA_DTYPE_BF16)
    for (int d = 0; d < QK; d++)
      memcpy(row + 2 * d, &(uint16_t){REF_BF16_NAN}, 2);
  else
    memset(row, 0xff, (size_t)test_kv_row_bytes((uint32_t)kv_dtype));
}

#define BENCH_KV_SCALE 0.5f /* fp8_e4m3's kv_scale */

/* Refuses a shape whose host-side inputs (twice where the backend's memory
 * is the host's: the copies it reads) and --check's reference would not fit
 * the host's available memory: allocating them would succeed under Linux's
 * overcommit and filling them end in the OOM killer. The builder is made
 * first, so the memory it holds is no longer counted as available. */
static void check_host_memory(const bench_shape *s, int kv_dtype, int page_size, int check,
                              int host_backend, int plugins) {
  const double tokens = (double)s->b * s->sq, rows = tokens * s->h;
  double L = s->L_max > s->L ? s->L_max : s->L, bytes = rows * QK * 2;
  if (s->sparse_topk)
    bytes += (double)s->L * test_kv_row_bytes((uint32_t)kv_dtype) + tokens * s->sparse_topk * 4;
  else
    bytes += (double)s->b * (ceil(L / page_size) + 1) * ((double)page_size *
             test_kv_row_bytes((uint32_t)kv_dtype) + 8);
  if (host_backend) /* the copies uploaded, and each plugin's out and lse */
    bytes += bytes + plugins * rows * (DV * 2 + 4);
  if (check) { /* the reference's output and lse in double, what is read back, its
                  int64 slot lists and one token's KV rows in double */
    const double visible = s->sparse_topk ? s->sparse_topk : L;
    bytes += rows * (DV * 8 + DV * 4 + DV * 2 + 16) + (tokens + 1) * 8 + tokens * visible * 8 +
             visible * QK * 8;
  }
  const uint64_t have = test_host_available_bytes();
  if (have && bytes > (double)have)
    fail_exit(2, "the shape's inputs%s need %.1f GiB of host memory; %.1f GiB is available "
              "(MemAvailable + SwapFree)", check ? " and --check's reference" : "", bytes / 1073741824.0,
              have / 1073741824.0);
}

static void make_problem(const bench_shape *s, int kv_dtype, int page_size, int poison,
                         problem *p) {
  memset(p, 0, sizeof *p);
  /* the shape's sizes are bounded by parse_shape and init_builder (which
   * refused the shape before this runs): no int arithmetic below overflows */
  p->heads = s->h;
  p->kv_dtype = kv_dtype;
  p->row_bytes = test_kv_row_bytes((uint32_t)kv_dtype);
  p->page_size = page_size;
  if (s->sparse_topk) {
    p->tokens = s->b * s->sq;
    p->topk = s->sparse_topk;
    p->num_pages = (s->L + page_size - 1) / page_size;
    p->max_seq_len = s->L;
    p->topk_idx = xmalloc(sizeof(int32_t) * (size_t)p->tokens * (size_t)p->topk, "top-k indices");
    for (int64_t i = 0; i < (int64_t)p->tokens * p->topk; i++)
      p->topk_idx[i] = (int32_t)(next_u64() % (uint64_t)s->L);
    p->sum_L = (int64_t)p->tokens * p->topk;
  } else {
    p->batch = s->b;
    p->tokens = s->b * s->sq;
    p->qo_indptr = xmalloc(sizeof(int32_t) * ((size_t)s->b + 1), "qo_indptr");
    p->kv_lens = xmalloc(sizeof(int32_t) * (size_t)s->b, "kv_lens");
    int Lmax = s->L_max > s->L ? s->L_max : s->L;
    p->max_pages = (Lmax + page_size - 1) / page_size;
    for (int r = 0; r < s->b; r++) {
      p->qo_indptr[r] = r * s->sq;
      p->kv_lens[r] = s->L_max > s->L ? s->L + (int)(next_u64() % (uint64_t)(s->L_max - s->L + 1)) : s->L;
      p->num_pages += (p->kv_lens[r] + page_size - 1) / page_size;
      p->sum_L += p->kv_lens[r];
    }
    p->qo_indptr[s->b] = s->b * s->sq;
    if (p->num_pages + 1 > INT32_MAX)
      fail_exit(2, "the shape needs %lld pages; block-table entries are int32",
                (long long)p->num_pages + 1);
    /* pages in random order: a shuffled permutation dealt out to requests,
     * with runs=N as runs of N pages that lie side by side in the cache
     * (what an allocator that hands out adjacent pages leaves) */
    const int64_t run = s->runs > 1 ? s->runs : 1, nruns = (p->num_pages + run - 1) / run;
    int32_t *perm = xmalloc(sizeof(int32_t) * (size_t)nruns, "the page permutation");
    for (int64_t i = 0; i < nruns; i++)
      perm[i] = (int32_t)i;
    for (int64_t i = nruns - 1; i > 0; i--) {
      int64_t j = (int64_t)(next_u64() % (uint64_t)(i + 1));
      int32_t t = perm[i];
      perm[i] = perm[j];
      perm[j] = t;
    }
    int32_t *pages = xmalloc(sizeof(int32_t) * (size_t)p->num_pages, "the page order");
    for (int64_t i = 0, k = 0; i < nruns; i++)
      for (int64_t j = (int64_t)perm[i] * run; j < ((int64_t)perm[i] + 1) * run; j++)
        if (j < p->num_pages)
          pages[k++] = (int32_t)j;
    free(perm);
    /* --check: every unused entry names one more page, all of it poison */
    const int32_t unused = poison ? (int32_t)p->num_pages : 0;
    p->block_table = xmalloc(sizeof(int32_t) * (size_t)s->b * (size_t)p->max_pages, "block_table");
    int64_t next = 0;
    for (int r = 0; r < s->b; r++)
      for (int j = 0; j < p->max_pages; j++)
        p->block_table[(int64_t)r * p->max_pages + j] =
            j < (p->kv_lens[r] + page_size - 1) / page_size ? pages[next++] : unused;
    free(pages);
    p->num_pages += poison;
  }
  size_t slots = (size_t)p->num_pages * (size_t)page_size;
  p->kv = xmalloc(slots * (size_t)p->row_bytes, "the KV cache");
  p->q = xmalloc(sizeof(uint16_t) * (size_t)p->tokens * (size_t)p->heads * QK, "q");
  for (size_t i = 0; i < slots; i++)
    fill_kv_row(p->kv + i * (size_t)p->row_bytes, kv_dtype);
  for (size_t i = 0; i < (size_t)p->tokens * (size_t)p->heads * QK; i++)
    p->q[i] = ref_float_to_bf16(next_unit());
  if (poison && !s->sparse_topk) { /* NaN in every slot past a request's length */
    for (int64_t o = 0; o < page_size; o++)
      poison_kv_row(p->kv + ((p->num_pages - 1) * page_size + o) * p->row_bytes, kv_dtype);
    for (int r = 0; r < p->batch; r++) {
      int used = (p->kv_lens[r] + page_size - 1) / page_size;
      if (!used)
        continue;
      int64_t page = p->block_table[(int64_t)r * p->max_pages + used - 1];
      for (int64_t o = p->kv_lens[r] - (int64_t)(used - 1) * page_size; o < page_size; o++)
        poison_kv_row(p->kv + (page * page_size + o) * p->row_bytes, kv_dtype);
    }
  }
}

static void free_problem(problem *p) {
  free(p->q);
  free(p->kv);
  free(p->qo_indptr);
  free(p->block_table);
  free(p->kv_lens);
  free(p->topk_idx);
}

static int check_against_reference(const problem *p, const uint16_t *out, const float *lse,
                                   float scale, result *res) {
  char *note = res->note;
  size_t note_size = sizeof res->note;
  ref_slot_lists lists;
  int rc = p->topk ? ref_slots_from_topk(p->tokens, p->topk, p->topk_idx, &lists)
                   : ref_slots_from_block_table(p->batch, p->qo_indptr, p->block_table,
                                                p->max_pages, p->kv_lens, (int32_t)p->page_size,
                                                &lists);
  if (rc) {
    snprintf(note, note_size, "reference rejected the problem");
    return 0;
  }
  size_t n = (size_t)p->tokens * (size_t)p->heads;
  double *ref = xmalloc(sizeof(double) * n * DV, "the reference output"),
         *ref_lse = xmalloc(sizeof(double) * n, "the reference lse");
  float *got = xmalloc(sizeof(float) * n * DV, "the output read back");
  ref_problem rp = {p->tokens, p->heads, p->q, NULL, p->num_pages * p->page_size, &lists, scale,
                    p->kv_dtype, p->kv, BENCH_KV_SCALE};
  if (p->kv_dtype == PMLA_DTYPE_BF16)
    rp.kv = (const uint16_t *)(const void *)p->kv;
  if (ref_mla_decode(&rp, ref, ref_lse))
    fail_exit(2, "the double-precision reference could not allocate its scratch (one "
              "token's KV rows in double)");
  for (size_t i = 0; i < n * DV; i++)
    got[i] = ref_bf16_to_float(out[i]);
  ref_report o = ref_check_output(ref, got, n * DV), l = ref_check_lse(ref_lse, lse, n);
  res->max_abs_err = o.max_abs_err;
  res->cosine = o.cosine;
  res->lse_ok = l.ok;
  snprintf(note, note_size, "max|err| %.2e cos %.9f lse %s%s%s", o.max_abs_err, o.cosine,
           l.ok ? "ok" : "BAD", o.ok ? "" : " out: ", o.ok ? "" : o.message);
  free(ref);
  free(ref_lse);
  free(got);
  ref_slot_lists_free(&lists);
  return o.ok && l.ok;
}

/* One plugin's side of a shape: its builder, its out and lse, its times. */
typedef struct plugin_run {
  pmla_builder *b;
  void *d_out, *d_lse;
  DLTensor tout, tlse;
  pmla_decode_args da;
  double *t, *tm;
} plugin_run;

/* Runs shape s on every plugin (be[0..nb-1]) with the same inputs, one
 * step of each plugin in turn, the order reversed every step, so that no
 * plugin always runs first or gets the machine's state to itself; fills
 * res[0..nb-1]. */
static void run_shape(const options *o, const pmla_backend *const *be, int nb, const devmem *m,
                      const bench_shape *s, double copy_gbps, int nocap, uint64_t seed,
                      result *res) {
  memset(res, 0, sizeof *res * (size_t)nb);
  rng = seed; /* every shape's inputs follow from its index alone */
  problem p;
  const int kv_dtype = s->kv ? s->kv : o->kv;
  const int page = s->page ? s->page : 64;
  /* the builders first: a backend refuses a shape it cannot serve (heads,
   * page size, batch, query tokens) with its own message before the inputs
   * are made */
  pmla_builder_config cfg =
      test_config((uint32_t)s->h, (uint32_t)page, (uint32_t)(s->sparse_topk ? s->b * s->sq : s->b),
                  (uint32_t)(s->sparse_topk ? 1 : s->sq), (uint32_t)s->sparse_topk,
                  (uint32_t)o->cu);
  cfg.device = m->device_id;
  cfg.kv_dtype = (uint32_t)kv_dtype;
  cfg.flags = o->invariant ? PMLA_BUILDER_BATCH_INVARIANT : 0;
  cfg.invariant_chunk = (uint32_t)o->chunk;
  plugin_run pr[MAX_PLUGINS];
  memset(pr, 0, sizeof pr);
  for (int k = 0; k < nb; k++) {
    pmla_status st = be[k]->init_builder(&cfg, &pr[k].b);
    if (st)
      die_status(be[k], NULL, "init_builder", st);
  }
  check_host_memory(s, kv_dtype, page, o->check, m->device_type == kDLCPU, nb);
  make_problem(s, kv_dtype, page, o->check, &p);

  /* the inputs, read by every plugin */
  size_t q_bytes = (size_t)p.tokens * (size_t)p.heads * QK * 2;
  size_t out_bytes = (size_t)p.tokens * (size_t)p.heads * DV * 2;
  size_t lse_bytes = (size_t)p.tokens * (size_t)p.heads * 4;
  size_t kv_bytes = (size_t)p.num_pages * (size_t)p.page_size * (size_t)p.row_bytes;
  const float kv_scale = BENCH_KV_SCALE;
  void *d_q = upload(m, p.q, q_bytes), *d_kv = upload(m, p.kv, kv_bytes);
  void *d_scale = upload(m, &kv_scale, sizeof kv_scale);
  int64_t q_shape[3] = {p.tokens, p.heads, QK}, out_shape[3] = {p.tokens, p.heads, DV},
          lse_shape[2] = {p.tokens, p.heads},
          kv_shape[3] = {p.num_pages, p.page_size, test_kv_width((uint32_t)kv_dtype)},
          one[1] = {1};
  DLDataType bf16 = {kDLBfloat, 16, 1}, i32 = {kDLInt, 32, 1}, f32 = {kDLFloat, 32, 1};
  DLDataType u8 = {kDLUInt, 8, 1};
  DLTensor tq = tensor(d_q, m, bf16, 3, q_shape);
  DLTensor tkv = tensor(d_kv, m, kv_dtype == PMLA_DTYPE_BF16 ? bf16 : u8, 3, kv_shape);
  DLTensor tscale = tensor(d_scale, m, f32, 1, one);

  void *d_a = NULL, *d_b = NULL, *d_c = NULL;
  int64_t sh_a[2], sh_b[2], sh_c[1];
  DLTensor ta, tb, tc;
  pmla_decode_batch db;
  pmla_sparse_batch sb;
  memset(&db, 0, sizeof db);
  memset(&sb, 0, sizeof sb);
  if (s->sparse_topk) {
    sh_a[0] = p.tokens;
    sh_a[1] = p.topk;
    d_a = upload(m, p.topk_idx, sizeof(int32_t) * (size_t)p.tokens * (size_t)p.topk);
    ta = tensor(d_a, m, i32, 2, sh_a);
    sb.struct_size = sizeof sb;
    sb.flags = nocap ? PMLA_SPARSE_NO_SPLIT_CAP : 0;
    sb.topk_indices = &ta;
    sb.max_seq_len = p.max_seq_len;
    sb.stream = m->stream();
  } else {
    sh_a[0] = p.batch + 1;
    sh_b[0] = p.batch;
    sh_b[1] = p.max_pages;
    sh_c[0] = p.batch;
    d_a = upload(m, p.qo_indptr, sizeof(int32_t) * (size_t)(p.batch + 1));
    d_b = upload(m, p.block_table, sizeof(int32_t) * (size_t)p.batch * (size_t)p.max_pages);
    d_c = upload(m, p.kv_lens, sizeof(int32_t) * (size_t)p.batch);
    ta = tensor(d_a, m, i32, 1, sh_a);
    tb = tensor(d_b, m, i32, 2, sh_b);
    tc = tensor(d_c, m, i32, 1, sh_c);
    db.struct_size = sizeof db;
    db.kv_layout = PMLA_KV_BLOCK_TABLE;
    db.qo_indptr = &ta;
    db.block_table = &tb;
    db.kv_lens = &tc;
    db.stream = m->stream();
  }

  const int n = o->iters;
  for (int k = 0; k < nb; k++) {
    plugin_run *r = &pr[k];
    r->d_out = upload(m, NULL, out_bytes);
    r->d_lse = upload(m, NULL, lse_bytes);
    /* NaN until the backend writes them (all-ones bytes: NaN as bf16 and as
     * fp32), so --check fails a backend that leaves them as they were */
    if (m->fill(r->d_out, 0xff, out_bytes) || m->fill(r->d_lse, 0xff, lse_bytes))
      fail_exit(2, "cannot fill out and lse on %s", m->name);
    r->tout = tensor(r->d_out, m, bf16, 3, out_shape);
    r->tlse = tensor(r->d_lse, m, f32, 2, lse_shape);
    r->da = (pmla_decode_args){sizeof r->da, 0, &tq, &tkv, &r->tout, &r->tlse, m->stream(), &tscale};
    r->t = xmalloc(sizeof(double) * (size_t)n, "timings");
    r->tm = xmalloc(sizeof(double) * (size_t)n, "timings");
  }

  size_t flush_bytes = m->device_type == kDLCPU || !o->flush ? 0 : (size_t)256 << 20;
  void *flush = flush_bytes ? m->alloc(flush_bytes) : NULL;
  if (flush_bytes && !flush)
    fail_exit(2, "cannot allocate the %zu-byte L2 flush buffer on %s (--no-flush times "
              "without flushing)", flush_bytes, m->name);
  for (int i = 0; i < o->warmup + n; i++)
    for (int j = 0; j < nb; j++) {
      const int k = i & 1 ? nb - 1 - j : j;
      plugin_run *r = &pr[k];
      if (flush && m->fill(flush, i & 0xff, flush_bytes))
        fail_exit(2, "the L2 flush failed on %s", m->name);
      m->timer_start();
      pmla_status st = s->sparse_topk ? be[k]->build_sparse(r->b, &sb) : be[k]->build_decode(r->b, &db);
      double meta = m->timer_stop_us();
      if (st)
        die_status(be[k], r->b, s->sparse_topk ? "build_sparse" : "build_decode", st);
      if (flush && m->fill(flush, (i + 1) & 0xff, flush_bytes))
        fail_exit(2, "the L2 flush failed on %s", m->name);
      m->timer_start();
      st = be[k]->decode(r->b, &r->da);
      double us = m->timer_stop_us();
      if (st)
        die_status(be[k], r->b, "decode", st);
      if (!(us >= 0) || !(meta >= 0))
        fail_exit(2, "the timer on %s failed", m->name);
      if (i >= o->warmup) {
        r->t[i - o->warmup] = us;
        r->tm[i - o->warmup] = meta;
      }
    }
  m->sync();
  double flops = 2.0 * s->h * (s->sparse_topk ? 1 : s->sq) * (double)p.sum_L * (QK + DV);
  double bytes = (double)p.sum_L * (double)p.row_bytes + (double)q_bytes + (double)out_bytes;
  for (int k = 0; k < nb; k++) {
    plugin_run *r = &pr[k];
    uint32_t flags = 0;
    pmla_status st = be[k]->check_device_error(r->b, &flags);
    if (st)
      die_status(be[k], r->b, "check_device_error", st);
    res[k].us = median(r->t, n);
    res[k].meta_us = median(r->tm, n);
    res[k].tflops = flops / (res[k].us * 1e6);
    res[k].gbps = bytes / (res[k].us * 1e3);
    res[k].copy_frac = copy_gbps > 0 ? res[k].gbps / copy_gbps : 0;
    res[k].nocap = nocap;
    pmla_builder_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    if (be[k]->query_builder(r->b, &info) == PMLA_OK)
      res[k].cap = info.split_cap;
    int32_t meta[PMLA_META_WORDS];
    const int meta_ok =
        be[k]->copy_buffer(r->b, PMLA_BUF_WORK_META_DATA, meta, sizeof meta) == PMLA_OK;
    res[k].mode = meta_ok ? meta[3] : -1;
    res[k].splits = meta_ok ? meta[1] : -1;
    if (o->check) {
      uint16_t *out = xmalloc(out_bytes, "the output read back");
      float *lse = xmalloc(lse_bytes, "the lse read back");
      if (m->download(out, r->d_out, out_bytes) || m->download(lse, r->d_lse, lse_bytes))
        fail_exit(2, "cannot read out and lse back from %s", m->name);
      res[k].checked = 1;
      res[k].ok = check_against_reference(&p, out, lse, cfg.softmax_scale, &res[k]);
      free(out);
      free(lse);
    }
    free(r->t);
    free(r->tm);
    m->release(r->d_out);
    m->release(r->d_lse);
    be[k]->destroy_builder(r->b);
  }
  m->release(flush);
  m->release(d_q);
  m->release(d_kv);
  m->release(d_scale);
  m->release(d_a);
  m->release(d_b);
  m->release(d_c);
  free_problem(&p);
}

/* text as an int >= min, the whole of it; 0 on success */
static int to_int(const char *text, int min, int *out) {
  char *end;
  const char *digits = text[0] == '-' ? text + 1 : text;
  if (!isdigit((unsigned char)digits[0])) /* strtol would skip spaces and take '+' */
    return -1;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (errno || end == text || *end || v < min || v > INT_MAX)
    return -1;
  *out = (int)v;
  return 0;
}

/* --iters and --warmup: steps of one shape on one plugin */
#define MAX_ITERS 1000000

/* an option's value as an int in min (0 or 1) .. max; exits naming it otherwise */
static int option_int(const char *name, const char *text, int min, int max) {
  int v;
  if (to_int(text, min, &v)) {
    fprintf(stderr, "pmla-bench: --%s: '%s' is not a %s integer\n", name, text,
            min > 0 ? "positive" : "non-negative");
    exit(2);
  }
  if (v > max) {
    fprintf(stderr, "pmla-bench: --%s: %d; accepted: at most %d\n", name, v, max);
    exit(2);
  }
  return v;
}

/* kv=NAME: bf16, fp8 (per-tensor e4m3) or ds_mla; 0 for anything else */
static int kv_dtype_of(const char *name) {
  return !strcmp(name, "bf16")     ? PMLA_DTYPE_BF16
         : !strcmp(name, "fp8")    ? PMLA_DTYPE_FP8_E4M3
         : !strcmp(name, "ds_mla") ? PMLA_DTYPE_FP8_DS_MLA
                                   : 0;
}

static const char *kv_dtype_name(int kv_dtype) {
  return kv_dtype == PMLA_DTYPE_FP8_E4M3 ? "fp8" : kv_dtype == PMLA_DTYPE_FP8_DS_MLA ? "ds_mla"
                                                                                   : "bf16";
}

/* Parses a shape SPEC; on error says what is wrong in why. */
static int parse_shape(const char *text, bench_shape *s, char *why, size_t size) {
  memset(s, 0, sizeof *s);
  s->sq = 1;
  char buf[256];
  if (snprintf(buf, sizeof buf, "%s", text) >= (int)sizeof buf)
    return snprintf(why, size, "longer than %zu characters", sizeof buf - 1), -1;
  int ranged = 0, have_L = 0;
  const void *seen[8];
  int nseen = 0;
  for (char *next = buf, *tok; (tok = next) != NULL;) {
    char *comma = strchr(tok, ',');
    next = comma ? comma + 1 : NULL;
    if (comma)
      *comma = '\0';
    if (!*tok) /* strtok would merge it away: "b=1,,L=64" is a typo */
      return snprintf(why, size, "an empty field (two commas, or one at an end)"), -1;
    char *value = strchr(tok, '=');
    if (!value)
      return snprintf(why, size, "'%.64s' is not FIELD=VALUE", tok), -1;
    *value++ = '\0';
    if (!strcmp(tok, "kv")) {
      for (int k = 0; k < nseen; k++)
        if (seen[k] == &s->kv)
          return snprintf(why, size, "kv is given twice"), -1;
      seen[nseen++] = &s->kv;
      if ((s->kv = kv_dtype_of(value)) == 0)
        return snprintf(why, size, "kv must be bf16, fp8 or ds_mla, not '%s'", value), -1;
      continue;
    }
    char *dash = strcmp(tok, "L") == 0 && *value ? strchr(value + 1, '-') : NULL;
    if (dash) /* L=MIN-MAX: lengths uniform in [MIN, MAX] */
      *dash = '\0';
    int v;
    int *field = !strcmp(tok, "b") || !strcmp(tok, "tokens") ? &s->b
               : !strcmp(tok, "L") || !strcmp(tok, "slots") ? &s->L
               : !strcmp(tok, "h")                          ? &s->h
               : !strcmp(tok, "sq")                         ? &s->sq
               : !strcmp(tok, "topk")                       ? &s->sparse_topk
               : !strcmp(tok, "page")                       ? &s->page
               : !strcmp(tok, "runs")                       ? &s->runs
                                                            : NULL;
    if (!field)
      return snprintf(why, size,
                      "unknown field '%.32s' (b, tokens, L, slots, h, sq, topk, kv, page, runs)",
                      tok),
             -1;
    for (int k = 0; k < nseen; k++)
      if (seen[k] == field)
        return snprintf(why, size, "%.32s is given twice (b/tokens and L/slots are one field each)",
                        tok), -1;
    seen[nseen++] = field;
    have_L |= field == &s->L;
    ranged |= dash != NULL;
    int min = field == &s->L ? 0 : 1;
    if (to_int(value, min, &v))
      return snprintf(why, size, "%.32s must be a %s integer, not '%.64s'", tok,
                      min ? "positive" : "non-negative", value), -1;
    *field = v;
    if (dash && to_int(dash + 1, v, &s->L_max))
      return snprintf(why, size, "L=%d-%s: the range's end must be an integer >= %d", v,
                      dash + 1, v), -1;
  }
  if (!s->b)
    return snprintf(why, size, "b (or tokens) is missing"), -1;
  if (!s->h)
    return snprintf(why, size, "h is missing"), -1;
  if (s->sparse_topk && !s->L)
    return snprintf(why, size, "slots must be given and positive for a sparse (topk) shape"), -1;
  if (s->sparse_topk && (s->page || s->runs))
    return snprintf(why, size, "%s applies to dense shapes only", s->page ? "page" : "runs"), -1;
  if (s->sparse_topk && ranged)
    return snprintf(why, size, "a range of lengths applies to dense shapes only"), -1;
  if (!s->sparse_topk && !have_L)
    return snprintf(why, size, "L is missing (L=0 for empty requests)"), -1;
  if ((uint32_t)s->L > PMLA_MAX_KV_LEN || (uint32_t)s->L_max > PMLA_MAX_KV_LEN)
    return snprintf(why, size, "%s is at most %u (PMLA_MAX_KV_LEN)",
                    s->sparse_topk ? "slots" : "L", PMLA_MAX_KV_LEN), -1;
  if ((int64_t)s->b * s->sq > INT_MAX)
    return snprintf(why, size, "b * sq = %lld query tokens; at most %d", (long long)s->b * s->sq,
                    INT_MAX), -1;
  return 0;
}

/* adds shape `text`, given by `option` (--shape, or --suite NAME) */
static void add(options *o, const char *option, const char *text) {
  char why[200];
  if (o->nshapes == 64)
    fprintf(stderr, "pmla-bench: %s: at most 64 shapes in all ('%s' is one too many)\n",
            option, text),
        exit(2);
  if (parse_shape(text, &o->shapes[o->nshapes], why, sizeof why))
    fprintf(stderr, "pmla-bench: %s '%s': %s\n", option, text, why), exit(2);
  o->nshapes++;
}

/* The suites: dense (12 block-table steps: batch 4..128, L 1024..32768,
 * uniform and ranged lengths, heads 16..128, one and two query tokens) and
 * sparse (8 top-k 2048 steps over 32768 slots, 2..128 tokens, heads 16 and
 * 128, then 6 dense steps of L = 2048, the same work as a top-k 2048
 * token, for comparing sparse with dense). */
static void add_suite(options *o, const char *name) {
  static const char *const dense[] = {
      "b=128,L=4096,h=16", "b=128,L=4096,h=128", "b=64,L=8192,h=16", "b=64,L=8192,h=128",
      "b=32,L=16384,h=128", "b=4,L=32768,h=128", "b=128,L=1024,h=128", "b=128,L=4096,h=64",
      "b=128,L=4096,h=32", "b=128,L=2048-6144,h=128", "b=128,L=4096,h=16,sq=2",
      "b=128,L=4096,h=128,sq=2"};
  static const char *const sparse[] = {
      "tokens=2,slots=32768,h=128,topk=2048", "tokens=64,slots=32768,h=128,topk=2048",
      "tokens=128,slots=32768,h=128,topk=2048", "tokens=2,slots=32768,h=16,topk=2048",
      "tokens=64,slots=32768,h=16,topk=2048", "tokens=128,slots=32768,h=16,topk=2048",
      "tokens=64,slots=32768,h=128,topk=2048,sq=2", "tokens=64,slots=32768,h=16,topk=2048,sq=2",
      /* dense over 2048 tokens of the same batches, to compare with */
      "b=2,L=2048,h=128", "b=64,L=2048,h=128", "b=128,L=2048,h=128", "b=2,L=2048,h=16",
      "b=64,L=2048,h=16", "b=128,L=2048,h=16"};
  int is_dense = !strcmp(name, "dense"), is_sparse = !strcmp(name, "sparse");
  if (!is_dense && !is_sparse)
    fprintf(stderr, "pmla-bench: --suite: '%s' is not a suite (dense, sparse)\n", name), exit(2);
  const char *const *list = is_dense ? dense : sparse;
  size_t n = is_dense ? sizeof dense / sizeof *dense : sizeof sparse / sizeof *sparse;
  char option[32];
  snprintf(option, sizeof option, "--suite %s", name);
  for (size_t i = 0; i < n; i++)
    add(o, option, list[i]);
}

/* a path as a JSON string: quotes, backslashes and control bytes escaped */
static void json_string(const char *text) {
  putchar('"');
  for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
    if (*c == '"' || *c == '\\')
      printf("\\%c", *c);
    else if (*c < 0x20)
      printf("\\u%04x", *c);
    else
      putchar(*c);
  }
  putchar('"');
}

/* a number as JSON: null when not finite */
static void json_number(const char *key, const char *fmt, double v) {
  printf(", \"%s\": ", key);
  if (isfinite(v))
    printf(fmt, v);
  else
    printf("null");
}

/* the file the registry loaded a backend from */
static const char *backend_file(const pmla_registry *r, const pmla_backend *be) {
  for (size_t i = 0; i < pmla_registry_count(r); i++)
    if (pmla_registry_backend(r, i) == be)
      return pmla_registry_backend_path(r, i);
  return "";
}

/* the ABI version the registry agreed with backend be */
static uint32_t backend_version(const pmla_registry *r, const pmla_backend *be) {
  for (size_t i = 0; i < pmla_registry_count(r); i++)
    if (pmla_registry_backend(r, i) == be)
      return pmla_registry_backend_version(r, i);
  return 0;
}

static void usage(void) {
  puts("usage: pmla-bench [--backend NAME] [--plugin PATH]... [--shape SPEC]... [--suite dense|sparse]\n"
       "                  [--iters N] [--warmup N] [--cu N] [--device N] [--check] [--no-flush]\n"
       "                  [--json]\n"
       "                  [--kv bf16|fp8|ds_mla] [--batch-invariant [--invariant-chunk N]]\n"
       "SPEC: b=128,L=4096,h=16[,sq=2][,kv=fp8][,page=16] (L=2048-6144 for uniform lengths;\n"
       "      page: the page size in slots, default 64; runs=N: pages dealt in shuffled\n"
       "      runs of N pages that lie side by side in the cache, default 1),\n"
       "      tokens=64,slots=32768,h=128,topk=2048[,sq=2] for sparse (also run uncapped)\n"
       "--kv: the KV cache dtype of shapes without kv= (bf16; fp8 = per-tensor e4m3,\n"
       "      ds_mla = DeepSeek V3.2's 656-byte rows); bytes count the cache as stored\n"
       "--plugin PATH: a plugin file or directory (repeat to compare side by side);\n"
       "      without it, $PMLA_PLUGIN_PATH, else the installed plugin directory\n"
       "--device N: the GPU to run on (default 0; pmla-cpu has device 0 only)\n"
       "--batch-invariant: every builder made with PMLA_BUILDER_BATCH_INVARIANT\n"
       "--invariant-chunk N: and config.invariant_chunk = N, the least chunk in KV positions\n"
       "      (a multiple of 64 up to 1048576; default 0, the plugin's)");
}

int main(int argc, char **argv) {
  options o = {.backend = "pmla-cpu", .iters = 0, .warmup = -1, .flush = 1,
               .kv = PMLA_DTYPE_BF16};
  enum { OPT_NO_FLUSH = 256, OPT_KV, OPT_INVARIANT, OPT_CHUNK };
  static const struct option longopts[] = {
      {"backend", required_argument, NULL, 'b'}, {"plugin", required_argument, NULL, 'p'},
      {"shape", required_argument, NULL, 's'},   {"suite", required_argument, NULL, 'S'},
      {"iters", required_argument, NULL, 'n'},   {"warmup", required_argument, NULL, 'w'},
      {"cu", required_argument, NULL, 'c'},      {"check", no_argument, NULL, 'k'},
      {"json", no_argument, NULL, 'j'},          {"no-flush", no_argument, NULL, OPT_NO_FLUSH},
      {"device", required_argument, NULL, 'd'},  {"help", no_argument, NULL, 'h'},
      {"kv", required_argument, NULL, OPT_KV},
      {"batch-invariant", no_argument, NULL, OPT_INVARIANT},
      {"invariant-chunk", required_argument, NULL, OPT_CHUNK},
      {NULL, 0, NULL, 0}};
  int opt;
  while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (opt) {
    case 'b': o.backend = optarg; break;
    case OPT_INVARIANT: o.invariant = 1; break;
    case OPT_CHUNK:
      o.chunk = option_int("invariant-chunk", optarg, 0, 1048576);
      if (o.chunk % 64) {
        fprintf(stderr, "pmla-bench: --invariant-chunk %d: accepted: a multiple of 64 up to "
                "1048576 (0: the plugin's)\n", o.chunk);
        return 2;
      }
      break;
    case OPT_KV:
      if ((o.kv = kv_dtype_of(optarg)) == 0) {
        fprintf(stderr, "pmla-bench: --kv: '%s' is not bf16, fp8 or ds_mla\n", optarg);
        return 2;
      }
      break;
    case 'p':
      if (!*optarg) { /* not "no path": the installed directory would be searched */
        fprintf(stderr, "pmla-bench: --plugin: an empty path; give a plugin file or directory\n");
        return 2;
      }
      if (o.nplugins == MAX_PLUGINS) {
        fprintf(stderr, "pmla-bench: --plugin %s: at most %d plugins side by side\n", optarg,
                MAX_PLUGINS);
        return 2;
      }
      o.plugins[o.nplugins++] = optarg;
      break;
    case 's': add(&o, "--shape", optarg); break;
    case 'S': add_suite(&o, optarg); break;
    case 'n': o.iters = option_int("iters", optarg, 1, MAX_ITERS); break;
    case 'w': o.warmup = option_int("warmup", optarg, 0, MAX_ITERS); break;
    case 'c': o.cu = option_int("cu", optarg, 0, INT_MAX); break;
    case 'd': o.device = option_int("device", optarg, 0, INT_MAX); break;
    case 'k': o.check = 1; break;
    case 'j': o.json = 1; break;
    case OPT_NO_FLUSH: o.flush = 0; break;
    case 'h': usage(); return 0;
    default: /* getopt_long has named the option */
      fprintf(stderr, "pmla-bench: see pmla-bench --help\n");
      return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "pmla-bench: unexpected argument '%s' (see pmla-bench --help)\n",
            argv[optind]);
    return 2;
  }
  if (o.chunk && !o.invariant) {
    fprintf(stderr, "pmla-bench: --invariant-chunk %d needs --batch-invariant\n", o.chunk);
    return 2;
  }
  int gpu = strcmp(o.backend, "pmla-cpu") != 0, ngpus = gpu ? devmem_gpu_count() : 0;
  if ((!gpu && o.device != 0) || (ngpus > 0 && o.device >= ngpus)) {
    if (gpu)
      fprintf(stderr, "pmla-bench: --device %d: accepted: 0..%d (GPUs present)\n", o.device,
              ngpus - 1);
    else
      fprintf(stderr, "pmla-bench: --device %d: backend pmla-cpu has device 0 only\n",
              o.device);
    return 2;
  }
  if (!o.nshapes)
    add(&o, "the default shape", "b=8,L=4096,h=16");
  /* one registry per plugin: the same backend name may come from each.
   * A --plugin given on the command line is used as given: the environment
   * must not put another file's backend in its place. */
  pmla_registry *reg[MAX_PLUGINS] = {NULL};
  const pmla_backend *be[MAX_PLUGINS];
  const char *file[MAX_PLUGINS];
  if (o.nplugins)
    unsetenv(PMLA_PLUGIN_PATH_ENV);
  atexit(exit_guard); /* plugins load from here on */
  const int nregs = o.nplugins ? o.nplugins : 1;
  int rc = 1;
  for (int k = 0; k < nregs; k++) {
    if (pmla_registry_open(o.nplugins ? o.plugins[k] : NULL, &reg[k])) {
      fprintf(stderr, "pmla-bench: cannot open the registry\n");
      goto done;
    }
    if (!(be[k] = pmla_registry_find(reg[k], o.backend))) {
      fprintf(stderr, "pmla-bench: no backend '%s' on the search path %s%s\n%s", o.backend,
              *pmla_registry_search_path(reg[k]) ? pmla_registry_search_path(reg[k]) : "(none)",
              o.nplugins ? "" : " (name a plugin with --plugin or PMLA_PLUGIN_PATH)",
              pmla_registry_diagnostics(reg[k]));
      goto done;
    }
    file[k] = backend_file(reg[k], be[k]);
    /* a 1.0 plugin would ignore config.flags and refuses FP8 caches */
    int needs_1_1 = o.invariant || o.kv != PMLA_DTYPE_BF16;
    for (int i = 0; i < o.nshapes; i++)
      needs_1_1 |= o.shapes[i].kv > PMLA_DTYPE_BF16;
    const uint32_t v = backend_version(reg[k], be[k]);
    if (needs_1_1 && v < PMLA_VERSION(1, 1)) {
      fprintf(stderr, "pmla-bench: %s needs ABI 1.1; backend '%s' in %s agreed %u.%u\n",
              o.invariant ? "--batch-invariant" : "an FP8 cache", o.backend, file[k],
              PMLA_VERSION_MAJOR(v), PMLA_VERSION_MINOR(v));
      goto done;
    }
  }
  if (!o.nplugins)
    o.nplugins = 1;
  const devmem *m = &devmem_cpu;
  if (gpu) {
    const char *why = NULL;
    if (!(m = devmem_gpu_on(o.device, &why))) {
      fprintf(stderr, "pmla-bench: backend %s needs a GPU: %s\n", o.backend, why);
      goto done;
    }
  }
  int cpu = m->device_type == kDLCPU;
  if (o.iters <= 0)
    o.iters = cpu ? 5 : 50;
  if (o.warmup < 0)
    o.warmup = cpu ? 1 : 10;
  double copy_gbps = copy_bandwidth(m);
  if (o.json) {
    printf("{\n \"backend\": ");
    json_string(o.backend);
    printf(", \"memory\": \"%s\", \"device\": %d, \"copy_GBps\": %.1f, \"iters\": %d, "
           "\"warmup\": %d,\n \"l2_flushed\": %s, \"batch_invariant\": %s, "
           "\"invariant_chunk\": %d,\n \"results\": [\n",
           m->name, o.device, copy_gbps, o.iters, o.warmup, cpu || !o.flush ? "false" : "true",
           o.invariant ? "true" : "false", o.chunk);
    json_open = 1;
  } else {
    char mode[80] = "";
    if (o.invariant)
      snprintf(mode, sizeof mode, ", batch-invariant builders (invariant_chunk %d)", o.chunk);
    printf("pmla-bench: backend %s (%s), copy bandwidth %.1f GB/s, median of %d runs%s%s\n",
           o.backend, m->name, copy_gbps, o.iters, cpu || !o.flush ? "" : ", L2 flushed before each",
           mode);
  }
  if (!o.json && o.nplugins > 1)
    for (int k = 0; k < o.nplugins; k++)
      printf("plugin @%d: %s\n", k, file[k]);
  else if (!o.json)
    printf("plugin: %s\n", file[0]);
  if (!o.json)
    printf("%-40s %10s %9s %9s %7s %10s %5s  %s\n", "shape", "median_us", "TFLOP/s", "GB/s",
           "copy%", "build_us", "cap", "check");
  int failed = 0, first = 1;
  for (int i = 0; i < o.nshapes; i++) {
    const bench_shape *s = &o.shapes[i];
    const uint64_t seed = 0x9e3779b97f4a7c15ull ^ ((uint64_t)(i + 1) * 0xbf58476d1ce4e5b9ull);
    for (int nocap = 0; nocap <= (s->sparse_topk ? 1 : 0); nocap++) {
      result rs[MAX_PLUGINS];
      run_shape(&o, be, o.nplugins, m, s, copy_gbps, nocap, seed, rs);
      for (int k = 0; k < o.nplugins; k++) {
        const result r = rs[k];
        /* what follows the shape's own fields: page size, cache dtype, plugin */
        char name[112], tag[48] = "";
        const int kvd = s->kv ? s->kv : o.kv;
        if (s->page && s->page != 64 && !s->sparse_topk)
          snprintf(tag, sizeof tag, " page=%d", s->page);
        if (s->runs > 1 && !s->sparse_topk)
          snprintf(tag + strlen(tag), sizeof tag - strlen(tag), " runs=%d", s->runs);
        if (kvd != PMLA_DTYPE_BF16)
          snprintf(tag + strlen(tag), sizeof tag - strlen(tag), " kv=%s", kv_dtype_name(kvd));
        if (o.nplugins > 1)
          snprintf(tag + strlen(tag), sizeof tag - strlen(tag), " @%d", k);
        if (s->sparse_topk)
          snprintf(name, sizeof name, "sparse t=%d slots=%d h=%d topk=%d sq=%d%s%s", s->b, s->L,
                   s->h, s->sparse_topk, s->sq, nocap ? " nocap" : "", tag);
        else if (s->L_max > s->L)
          snprintf(name, sizeof name, "b=%d L=%d..%d h=%d sq=%d%s", s->b, s->L, s->L_max, s->h,
                   s->sq, tag);
        else
          snprintf(name, sizeof name, "b=%d L=%d h=%d sq=%d%s", s->b, s->L, s->h, s->sq, tag);
        failed |= r.checked && !r.ok;
        if (o.json) {
          printf("%s  {\"shape\": \"%s\", \"plugin\": ", first ? "" : ",\n", name);
          json_string(file[k]);
          printf(", \"median_us\": %.2f, "
                 "\"tflops\": %.2f, \"gbps\": %.1f, \"copy_frac\": %.3f, \"build_us\": %.2f, "
                 "\"split_cap\": %u, \"schedule_mode\": %d, \"split_requests\": %d, "
                 "\"checked\": %s, \"ok\": %s",
                 r.us, r.tflops, r.gbps, r.copy_frac, r.meta_us, r.cap, r.mode, r.splits,
                 r.checked ? "true" : "false", r.ok || !r.checked ? "true" : "false");
          if (r.checked) {
            json_number("max_abs_err", "%.3e", r.max_abs_err);
            json_number("cosine", "%.9f", r.cosine);
            printf(", \"lse_ok\": %s", r.lse_ok ? "true" : "false");
          }
          printf("}");
        } else
          printf("%-40s %10.1f %9.2f %9.1f %6.1f%% %10.1f %5u  %s%s\n", name, r.us, r.tflops,
                 r.gbps, 100 * r.copy_frac, r.meta_us, r.cap,
                 r.checked ? (r.ok ? "PASS " : "FAIL ") : "-", r.note);
        first = 0;
        fflush(stdout);
      }
    }
  }
  if (o.json)
    printf("\n ]\n}\n");
  json_open = 0;
  rc = failed ? 1 : 0;
done:
  for (int k = 0; k < nregs; k++)
    pmla_registry_close(reg[k]);
  if (fflush(stdout) || ferror(stdout)) { /* a full disk, a closed pipe */
    fprintf(stderr, "pmla-bench: cannot write the results to standard output\n");
    rc = 2;
  }
  finished = 1;
  return rc;
}
