/* SPDX-License-Identifier: MIT */
/* pmla-multigpu - builders of backend pmla on two GPUs of one host, used
 * through the registry as any host uses it (no Check, no NCCL):
 *   concurrent  a builder per device (h=128, page 64, 4 requests of q_len 1
 *               or 2, lengths up to 3072); 50 steps built and decoded by two
 *               threads at once, one per device and stream; every out and
 *               lse bit for bit equal to the same step on device 0 alone
 *   no-alloc    those steps allocate no memory on either device
 *   graph       build_decode + decode captured on each device's stream,
 *               replayed after new lengths are written into the same
 *               kv_lens tensor: equal to eager calls (both devices at once)
 *   tensor-par  two processes, one per GPU, each decoding 64 of the 128
 *               heads into a shared mapping: the concatenation matches the
 *               128-head decode on device 0, and both match the float64
 *               reference, within |a - b| <= 2^-7 |b| + 2^-8
 * Prints a PASS, FAIL or SKIP line per check and device, then "N passed,
 * M failed, K skipped"; exits 1 on a failure (with fewer than two GPUs all
 * are SKIPs, exit 0). make check builds it with the GPU backend but does
 * not run it (CI has no GPU). On a GPU machine, build tree in _nv:
 *   LD_LIBRARY_PATH=_nv/abi/.libs:_nv/devlibs _nv/tests/.libs/pmla-multigpu \
 *     _nv/plugin/.libs/pmla.so
 * The argument is a registry search path (a plugin file or directory);
 * without it $PMLA_PLUGIN_PATH, else the installed plugin directory. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "devmem.h"
#include "pmla.h"
#include "pmla_registry.h"
#include "reference.h"
#include "test_config.h"

#define H 128
#define PS 64
#define B 4                 /* requests per step */
#define MAXQ 2              /* q_len 1 or 2 */
#define MAXP 48             /* pages per request: lengths up to 3072 */
#define PAGES (B * MAXP)
#define TOKENS (B * MAXQ)   /* most query rows of a step */
#define QK 576
#define DV 512
#define STEPS 50
#define ROUNDS 4            /* graph replays */

typedef struct host_step {
  int32_t qo[B + 1], lens[B], tokens;
  uint16_t *q; /* [tokens, H, QK] */
} host_step;

static host_step steps[STEPS];
static int32_t h_bt[B * MAXP], graph_lens[ROUNDS][B];
static uint16_t *h_kv;
static const pmla_backend *be;
static int n_pass, n_fail;

static void report(int ok, const char *check, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("%s %s: ", ok ? "PASS" : "FAIL", check);
  vprintf(fmt, ap);
  printf("\n");
  fflush(stdout);
  va_end(ap);
  *(ok ? &n_pass : &n_fail) += 1;
}

static uint64_t rng = 0x6d756c7469677075ull;
static uint64_t rng_next(void) { /* splitmix64 */
  uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static uint32_t below(uint32_t n) { return (uint32_t)(rng_next() % n); }
static uint16_t bf16_unit(void) {
  return ref_float_to_bf16((float)((rng_next() >> 11) * 0x1p-53) * 2.f - 1.f);
}

static void make_inputs(void) {
  h_kv = malloc(sizeof(uint16_t) * PAGES * PS * QK);
  for (size_t i = 0; i < (size_t)PAGES * PS * QK; i++)
    h_kv[i] = bf16_unit();
  for (int i = 0; i < B * MAXP; i++)
    h_bt[i] = (i * 7 + 5) % PAGES; /* a permutation: 7 is coprime to 192 */
  for (int s = 0; s < STEPS; s++) {
    host_step *st = &steps[s];
    for (int r = 0; r < B; r++) {
      st->qo[r + 1] = st->qo[r] + 1 + (int32_t)below(MAXQ);
      st->lens[r] = (int32_t)below(MAXP * PS + 1);
    }
    st->tokens = st->qo[B];
    size_t n = (size_t)st->tokens * H * QK;
    st->q = malloc(sizeof(uint16_t) * n);
    for (size_t i = 0; i < n; i++)
      st->q[i] = bf16_unit();
  }
  for (int k = 0; k < ROUNDS; k++)
    for (int r = 0; r < B; r++)
      graph_lens[k][r] = (int32_t)below(MAXP * PS + 1);
}

/* ---- a builder and its tensors on one device ---- */
enum { T_Q, T_KV, T_OUT, T_LSE, T_QO, T_LENS, T_BT, N_T };

typedef struct dev {
  int id, heads;
  const devmem *m;
  pmla_builder *b;
  void *mem[N_T];
  int64_t shape[N_T][3];
  DLTensor t[N_T];
  pmla_decode_batch batch;
  pmla_decode_args args;
  int bad; /* a check's verdict, written by its thread */
  char err[320];
} dev;

static int fail(dev *d, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(d->err, sizeof d->err, fmt, ap);
  va_end(ap);
  return 1;
}

static int call(dev *d, const char *what, pmla_status st) {
  return st ? fail(d, "device %d: %s: %s: %s", d->id, what, pmla_status_name(st),
                   be->last_error(d->b))
            : 0;
}

static int dev_open(dev *d, int id, int heads, uint32_t cu) {
  memset(d, 0, sizeof *d);
  d->id = id;
  d->heads = heads;
  const char *why = NULL;
  if (!(d->m = devmem_gpu_on(id, &why)))
    return fail(d, "device %d: %s", id, why);
  pmla_builder_config c = test_config((uint32_t)heads, PS, B, MAXQ, 0, cu);
  c.device = id;
  if (call(d, "init_builder", be->init_builder(&c, &d->b)))
    return 1;
  static const struct {
    uint8_t code, bits;
    int ndim;
    int64_t d0, d1, d2; /* d1 < 0: heads */
  } spec[N_T] = {{kDLBfloat, 16, 3, TOKENS, -1, QK}, {kDLBfloat, 16, 3, PAGES, PS, QK},
                 {kDLBfloat, 16, 3, TOKENS, -1, DV}, {kDLFloat, 32, 2, TOKENS, -1, 0},
                 {kDLInt, 32, 1, B + 1, 0, 0},       {kDLInt, 32, 1, B, 0, 0},
                 {kDLInt, 32, 2, B, MAXP, 0}};
  for (int i = 0; i < N_T; i++) {
    int64_t *sh = d->shape[i], n = 1;
    sh[0] = spec[i].d0, sh[1] = spec[i].d1 < 0 ? heads : spec[i].d1, sh[2] = spec[i].d2;
    for (int k = 0; k < spec[i].ndim; k++)
      n *= sh[k];
    if (!(d->mem[i] = d->m->alloc((size_t)n * spec[i].bits / 8)))
      return fail(d, "device %d: cannot allocate %lld bytes", id, (long long)n * spec[i].bits / 8);
    d->t[i] = (DLTensor){.data = d->mem[i], .device = {d->m->device_type, id},
                         .ndim = spec[i].ndim, .dtype = {spec[i].code, spec[i].bits, 1},
                         .shape = sh};
  }
  if (d->m->upload(d->mem[T_KV], h_kv, sizeof(uint16_t) * PAGES * PS * QK) ||
      d->m->upload(d->mem[T_BT], h_bt, sizeof h_bt))
    return fail(d, "device %d: upload failed", id);
  d->batch = (pmla_decode_batch){.struct_size = sizeof d->batch, .kv_layout = PMLA_KV_BLOCK_TABLE,
                                 .qo_indptr = &d->t[T_QO], .block_table = &d->t[T_BT],
                                 .kv_lens = &d->t[T_LENS], .stream = d->m->stream()};
  d->args = (pmla_decode_args){.struct_size = sizeof d->args, .q = &d->t[T_Q],
                               .kv_cache = &d->t[T_KV], .out = &d->t[T_OUT],
                               .lse = &d->t[T_LSE], .stream = d->m->stream()};
  return 0;
}

static void dev_close(dev *d) {
  if (d->b)
    be->destroy_builder(d->b);
  for (int i = 0; d->m && i < N_T; i++)
    d->m->release(d->mem[i]);
}

/* Uploads a step (q: [tokens, d->heads, QK]) without running it. */
static int dev_load(dev *d, const host_step *s, const uint16_t *q) {
  d->shape[T_Q][0] = d->shape[T_OUT][0] = d->shape[T_LSE][0] = s->tokens;
  size_t rows = (size_t)s->tokens * (size_t)d->heads;
  return d->m->upload(d->mem[T_QO], s->qo, sizeof s->qo) ||
                 d->m->upload(d->mem[T_LENS], s->lens, sizeof s->lens) ||
                 d->m->upload(d->mem[T_Q], q, rows * QK * 2)
             ? fail(d, "device %d: upload failed", d->id)
             : 0;
}

static int dev_run(dev *d) {
  return call(d, "build_decode", be->build_decode(d->b, &d->batch)) ||
         call(d, "decode", be->decode(d->b, &d->args));
}

/* Poisons out and lse (stale results cannot pass), runs `how`, reads back. */
static int dev_result(dev *d, int (*how)(dev *), uint16_t *out, float *lse) {
  size_t rows = (size_t)d->shape[T_Q][0] * (size_t)d->heads;
  if (d->m->fill(d->mem[T_OUT], 0xff, rows * DV * 2) || d->m->fill(d->mem[T_LSE], 0xff, rows * 4))
    return fail(d, "device %d: fill failed", d->id);
  if (how(d))
    return 1;
  return d->m->download(out, d->mem[T_OUT], rows * DV * 2) ||
                 d->m->download(lse, d->mem[T_LSE], rows * 4)
             ? fail(d, "device %d: download failed", d->id)
             : 0;
}

static int dev_replay(dev *d) {
  return d->m->replay() ? fail(d, "device %d: graph replay failed", d->id) : 0;
}

#define OUT_N ((size_t)TOKENS * H * DV)
#define LSE_N ((size_t)TOKENS * H)
static uint16_t *ref_out; /* [STEPS][OUT_N]: device 0 alone */
static float *ref_lse;    /* [STEPS][LSE_N] */

static int same(const uint16_t *o1, const float *l1, const uint16_t *o2, const float *l2,
                int tokens) {
  return !memcmp(o1, o2, (size_t)tokens * H * DV * 2) && !memcmp(l1, l2, (size_t)tokens * H * 4);
}

static void *concurrent_steps(void *arg) {
  dev *d = arg;
  uint16_t *out = malloc(OUT_N * 2);
  float *lse = malloc(LSE_N * 4);
  for (int s = 0; s < STEPS && !d->bad; s++) {
    if (dev_load(d, &steps[s], steps[s].q) || dev_result(d, dev_run, out, lse))
      d->bad = 1;
    else if (!same(out, lse, ref_out + s * OUT_N, ref_lse + s * LSE_N, steps[s].tokens))
      d->bad = fail(d, "step %d differs from device 0 alone", s);
  }
  free(out);
  free(lse);
  return NULL;
}

/* Captures step 0, then replays it with graph_lens[k] in kv_lens. */
static void *graph_rounds(void *arg) {
  dev *d = arg;
  uint16_t *o_graph = malloc(OUT_N * 2), *o_eager = malloc(OUT_N * 2);
  float *l_graph = malloc(LSE_N * 4), *l_eager = malloc(LSE_N * 4);
  if (dev_load(d, &steps[0], steps[0].q) || d->m->capture_begin())
    d->bad = d->err[0] ? 1 : fail(d, "device %d: cannot begin a capture", d->id);
  else if (dev_run(d) | d->m->capture_end()) /* end the capture whatever happened */
    d->bad = d->err[0] ? 1 : fail(d, "device %d: capture failed", d->id);
  for (int k = 0; k < ROUNDS && !d->bad; k++) {
    if (d->m->upload(d->mem[T_LENS], graph_lens[k], sizeof graph_lens[k]))
      d->bad = fail(d, "device %d: upload failed", d->id);
    else if (dev_result(d, dev_replay, o_graph, l_graph) ||
             dev_result(d, dev_run, o_eager, l_eager))
      d->bad = 1;
    else if (!same(o_graph, l_graph, o_eager, l_eager, steps[0].tokens))
      d->bad = fail(d, "round %d: the replay differs from eager calls", k);
  }
  free(o_graph);
  free(o_eager);
  free(l_graph);
  free(l_eager);
  return NULL;
}

/* ---- tensor parallel: a child per GPU, 64 heads each ---- */
#define TP_H (H / 2)
typedef struct tp_shared {
  int status[2];
  char err[2][320];
  uint16_t out[2][(size_t)TOKENS * TP_H * DV];
} tp_shared;

static int open_backend(const char *path) {
  pmla_registry *reg = NULL;
  if (pmla_registry_open(path, &reg) || !(be = pmla_registry_find(reg, "pmla"))) {
    fprintf(stderr, "pmla-multigpu: no backend pmla on the search path %s\n%s",
            reg ? pmla_registry_search_path(reg) : "?", reg ? pmla_registry_diagnostics(reg) : "");
    return 1;
  }
  return 0; /* the registry stays open until exit */
}

static void tp_child(tp_shared *sh, int k, const char *path) {
  const host_step *s = &steps[0];
  uint16_t *q = malloc((size_t)s->tokens * TP_H * QK * 2);
  for (int t = 0; t < s->tokens; t++) /* heads k*64 .. k*64+63 of each row */
    memcpy(q + (size_t)t * TP_H * QK, s->q + ((size_t)t * H + (size_t)k * TP_H) * QK,
           (size_t)TP_H * QK * 2);
  float *lse = malloc(LSE_N * 4);
  dev d;
  int bad = open_backend(path) ? fail(&d, "no backend pmla")
            : dev_open(&d, k, TP_H, 0) || dev_load(&d, s, q) ||
                  dev_result(&d, dev_run, sh->out[k], lse);
  memcpy(sh->err[k], d.err, sizeof d.err);
  sh->status[k] = bad;
  _exit(bad);
}

static int within(double a, double b) { return fabs(a - b) <= fabs(b) * 0x1p-7 + 0x1p-8; }

static void tensor_parallel_verdict(const tp_shared *sh) {
  const host_step *s = &steps[0];
  for (int k = 0; k < 2; k++)
    if (sh->status[k]) {
      report(0, "tensor-par", "process on device %d: %s", k, sh->err[k][0] ? sh->err[k] : "died");
      return;
    }
  size_t n = (size_t)s->tokens * H * DV, bad_single = 0, bad_tp = 0, bad_ref = 0;
  double *ref = malloc(n * sizeof(double));
  ref_slot_lists lists;
  if (ref_slots_from_block_table(B, s->qo, h_bt, MAXP, s->lens, PS, &lists)) {
    report(0, "tensor-par", "the reference refused the step");
    free(ref);
    return;
  }
  pmla_builder_config cfg = test_config(H, PS, B, MAXQ, 0, 0); /* its softmax_scale */
  ref_problem p = {s->tokens, H, s->q, h_kv, (int64_t)PAGES * PS, &lists, cfg.softmax_scale,
                   0, NULL, 0};
  ref_mla_decode(&p, ref, NULL);
  for (size_t i = 0; i < n; i++) {
    size_t t = i / (H * DV), h = i / DV % H, c = i % DV;
    double tp = ref_bf16_to_float(sh->out[h / TP_H][(t * TP_H + h % TP_H) * DV + c]);
    double single = ref_bf16_to_float(ref_out[i]);
    bad_tp += !within(tp, single);
    bad_ref += !within(tp, ref[i]);
    bad_single += !within(single, ref[i]);
  }
  report(!bad_tp && !bad_ref && !bad_single, "tensor-par",
         "2 x %d heads on devices 0 and 1 vs %d heads on device 0: %zu of %zu outside tolerance; "
         "vs the float64 reference: %zu (2 devices), %zu (1 device)",
         TP_H, H, bad_tp, n, bad_ref, bad_single);
  ref_slot_lists_free(&lists);
  free(ref);
}

static int setup_failed(const char *what, const char *err) {
  report(0, "setup", "%s: %s", what, err);
  printf("%d passed, %d failed, 0 skipped\n", n_pass, n_fail);
  return 1;
}

/* Counting GPUs starts the runtime, which a forked child could not use
 * then: count in a child of its own. */
static int count_gpus(void) {
  pid_t pid = fork();
  if (pid == 0)
    _exit(devmem_gpu_count() > 100 ? 100 : devmem_gpu_count());
  int status = 0;
  return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) ? WEXITSTATUS(status) : 0;
}

int main(int argc, char **argv) {
  static const char *const checks[] = {"concurrent", "no-alloc", "graph", "tensor-par"};
  if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
    fprintf(stderr, "usage: pmla-multigpu [PLUGIN.so or directory] (see its source header)\n");
    return 2;
  }
  const char *path = argc == 2 ? argv[1] : NULL;
  if (path)
    unsetenv(PMLA_PLUGIN_PATH_ENV);
  make_inputs();
  fflush(stdout);
  int ngpus = count_gpus();
  if (ngpus < 2) {
    for (int i = 0; i < 4; i++)
      printf("SKIP %s: %d GPU%s: needs two\n", checks[i], ngpus, ngpus == 1 ? "" : "s");
    printf("0 passed, 0 failed, 4 skipped\n");
    return 0;
  }

  /* tensor-par first: the children must start before this process uses a GPU */
  tp_shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED)
    return perror("pmla-multigpu: mmap"), 2;
  memset(sh, 0, sizeof *sh);
  sh->status[0] = sh->status[1] = 1;
  pid_t child[2];
  for (int k = 0; k < 2; k++)
    if ((child[k] = fork()) == 0)
      tp_child(sh, k, path);
  for (int k = 0; k < 2; k++)
    if (child[k] < 0 || waitpid(child[k], NULL, 0) != child[k])
      sh->status[k] = 1;

  if (open_backend(path))
    return setup_failed("registry", "no backend pmla (see above)");
  dev d[2];
  ref_out = malloc(STEPS * OUT_N * 2);
  ref_lse = malloc(STEPS * LSE_N * 4);
  if (dev_open(&d[0], 0, H, 0))
    return setup_failed("device 0", d[0].err);
  pmla_builder_info info = {.struct_size = sizeof info};
  be->query_builder(d[0].b, &info); /* the same CU count, so the same schedule */
  if (dev_open(&d[1], 1, H, info.cu_count))
    return setup_failed("device 1", d[1].err);
  for (int s = 0; s < STEPS; s++) /* device 0 alone */
    if (dev_load(&d[0], &steps[s], steps[s].q) ||
        dev_result(&d[0], dev_run, ref_out + s * OUT_N, ref_lse + s * LSE_N))
      return setup_failed("device 0 alone", d[0].err);
  /* device 1 runs the steps once too: first launches may load modules */
  size_t free0[2] = {0, 0}, free1[2] = {0, 0}, total;
  int info_bad = 0;
  for (int s = 0; s < STEPS && !info_bad; s++)
    info_bad = dev_load(&d[1], &steps[s], steps[s].q) || dev_run(&d[1]);
  info_bad |= d[1].m->sync();
  for (int k = 0; k < 2; k++)
    info_bad |= d[k].m->mem_info(&free0[k], &total);

  pthread_t th[2];
  for (int k = 0; k < 2; k++)
    if (pthread_create(&th[k], NULL, concurrent_steps, &d[k]))
      return perror("pmla-multigpu: pthread_create"), 2;
  for (int k = 0; k < 2; k++)
    pthread_join(th[k], NULL);
  for (int k = 0; k < 2; k++) {
    report(!d[k].bad, "concurrent", "device %d: %d steps alongside device %d, %s", k, STEPS, 1 - k,
           d[k].bad ? d[k].err : "bit for bit equal to device 0 alone");
    info_bad |= d[k].m->sync() || d[k].m->mem_info(&free1[k], &total);
  }
  for (int k = 0; k < 2; k++)
    report(!info_bad && free0[k] == free1[k], "no-alloc",
           "device %d: free memory %zu -> %zu bytes%s", k, free0[k], free1[k],
           info_bad ? " (mem_info or the warm-up failed)" : "");

  for (int k = 0; k < 2; k++) {
    d[k].bad = 0;
    d[k].err[0] = '\0';
    if (pthread_create(&th[k], NULL, graph_rounds, &d[k]))
      return perror("pmla-multigpu: pthread_create"), 2;
  }
  for (int k = 0; k < 2; k++)
    pthread_join(th[k], NULL);
  for (int k = 0; k < 2; k++)
    report(!d[k].bad, "graph", "device %d: %d replays with new lengths %s", k, ROUNDS,
           d[k].bad ? d[k].err : "equal to eager calls");

  tensor_parallel_verdict(sh);
  for (int k = 0; k < 2; k++)
    dev_close(&d[k]);
  printf("%d passed, %d failed, 0 skipped\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
