/* SPDX-License-Identifier: MIT */
/* inject.c - "on error nothing leaks": makes the k-th allocation fail, for
 * k = 1, 2, ... until a run makes fewer than k, and separately the k-th
 * call that starts a builder's threads (pthread_create, pthread_mutex_init,
 * pthread_cond_init), over
 *   init      init_builder alone (then destroy_builder when it succeeded);
 *   cycle     init_builder, build_decode, decode, build_sparse, decode,
 *             destroy_builder;
 *   registry  pmla_registry_open on the plugin, every lookup, close
 *             (allocations only);
 * on pmla-cpu with 4 worker threads. Each run must end in PMLA_OK or
 * PMLA_ERR_OUT_OF_MEMORY (with a message, for the backend's calls), with
 * every allocation made during it freed and no thread left behind
 * (/proc/self/task counted before and after). A cycle that succeeds must
 * give the same output as one without failures; a registry opened despite a
 * failure lists at most the backends of one opened without.
 *
 *   inject [PLUGIN.so]    env: PMLA_CONFORMANCE_PLUGIN, else the build tree's
 *
 * It interposes malloc, calloc, realloc, free, posix_memalign,
 * aligned_alloc, memalign and valloc (forwarding to glibc's __libc_* entry
 * points, as tests/noalloc.c does) and pthread_create, pthread_mutex_init
 * and pthread_cond_init (forwarding to the next definitions, looked up at
 * their first call). Exit 0 pass, 1 fail, 77 skip, 99 hard error. Prints
 * "N passed, M failed", one per injected run. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pmla.h"
#include "interpose.h"
#include "pmla_registry.h"
#include "test_config.h"

#ifndef PMLA_TEST_DEFAULT_PLUGIN
#define PMLA_TEST_DEFAULT_PLUGIN "plugin/.libs/pmla.so"
#endif

/* ---- interposition ----
 * While `watching`, every allocation is numbered (any thread) and the one
 * numbered fail_alloc_at fails; what it returns is remembered in `live`
 * until freed. pthread_create calls are numbered the same way. */

enum { LIVE_SLOTS = 1 << 12 };
static atomic_int watching;
static atomic_long allocs, creates, fail_alloc_at, fail_create_at;
static atomic_int hit, live_overflow;
static atomic_flag live_lock = ATOMIC_FLAG_INIT;
static void *live[LIVE_SLOTS];
static size_t live_count;

static void lock(void) {
  while (atomic_flag_test_and_set_explicit(&live_lock, memory_order_acquire))
    ;
}
static void unlock(void) { atomic_flag_clear_explicit(&live_lock, memory_order_release); }

/* True when this allocation is the one to fail. */
static int fail_this_alloc(void) {
  if (!atomic_load_explicit(&watching, memory_order_relaxed))
    return 0;
  long n = atomic_fetch_add(&allocs, 1) + 1;
  if (n != atomic_load(&fail_alloc_at))
    return 0;
  atomic_store(&hit, 1);
  errno = ENOMEM; /* as glibc's allocator says it */
  return 1;
}

static void *remember(void *p) {
  if (!p || !atomic_load_explicit(&watching, memory_order_relaxed))
    return p;
  lock();
  if (live_count < LIVE_SLOTS)
    live[live_count++] = p;
  else
    atomic_store(&live_overflow, 1);
  unlock();
  return p;
}

static void forget(void *p) {
  if (!p)
    return;
  lock();
  for (size_t i = 0; i < live_count; i++)
    if (live[i] == p) {
      live[i] = live[--live_count];
      break;
    }
  unlock();
}

#ifndef PMLA_TEST_UNDER_SANITIZER
void *malloc(size_t n) { return fail_this_alloc() ? NULL : remember(__libc_malloc(n)); }
void *calloc(size_t a, size_t b) {
  return fail_this_alloc() ? NULL : remember(__libc_calloc(a, b));
}
void *realloc(void *p, size_t n) {
  if (fail_this_alloc())
    return NULL;
  void *q = __libc_realloc(p, n);
  if (q || !n)
    forget(p);
  return remember(q);
}
void free(void *p) {
  forget(p);
  __libc_free(p);
}
int posix_memalign(void **out, size_t align, size_t n) {
  if (align < sizeof(void *) || (align & (align - 1)))
    return EINVAL;
  if (fail_this_alloc())
    return ENOMEM;
  void *p = remember(__libc_memalign(align, n));
  if (!p)
    return ENOMEM;
  *out = p;
  return 0;
}
void *aligned_alloc(size_t align, size_t n) {
  return fail_this_alloc() ? NULL : remember(__libc_memalign(align, n));
}
void *memalign(size_t align, size_t n) {
  return fail_this_alloc() ? NULL : remember(__libc_memalign(align, n));
}
void *valloc(size_t n) {
  return fail_this_alloc() ? NULL
                           : remember(__libc_memalign((size_t)sysconf(_SC_PAGESIZE), n));
}
#endif

typedef int (*create_fn)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
typedef int (*mutex_init_fn)(pthread_mutex_t *, const pthread_mutexattr_t *);
typedef int (*cond_init_fn)(pthread_cond_t *, const pthread_condattr_t *);

/* the next definition of `name`, looked up at its first call (a library's
 * constructor may call it before main); NULL ends the program */
static void *next_fn(const char *name) {
  void *f = dlsym(RTLD_NEXT, name);
  if (!f) {
    fprintf(stderr, "inject: no %s to forward to\n", name);
    _exit(99);
  }
  return f;
}
#define FORWARD(type, name)                                                                \
  static type real;                                                                        \
  if (!real) {                                                                             \
    void *f_ = next_fn(name);                                                              \
    memcpy(&real, &f_, sizeof f_);                                                         \
  }

/* pthread_create, pthread_mutex_init and pthread_cond_init are numbered in
 * one sequence: the calls that start a builder's threads */
static int fail_this_thread_call(void) {
  if (!atomic_load(&watching))
    return 0;
  long n = atomic_fetch_add(&creates, 1) + 1;
  if (n != atomic_load(&fail_create_at))
    return 0;
  atomic_store(&hit, 1);
  return 1;
}

int pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg) {
  FORWARD(create_fn, "pthread_create")
  return fail_this_thread_call() ? EAGAIN : real(t, attr, fn, arg);
}
int pthread_mutex_init(pthread_mutex_t *m, const pthread_mutexattr_t *attr) {
  FORWARD(mutex_init_fn, "pthread_mutex_init")
  return fail_this_thread_call() ? ENOMEM : real(m, attr);
}
int pthread_cond_init(pthread_cond_t *c, const pthread_condattr_t *attr) {
  FORWARD(cond_init_fn, "pthread_cond_init")
  return fail_this_thread_call() ? ENOMEM : real(c, attr);
}

/* ---- what a run leaves behind ---- */
static int count_threads(void) {
  DIR *d = opendir("/proc/self/task");
  if (!d)
    return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* Joined threads leave /proc/self/task a moment after pthread_join. */
static int threads_back_to(int baseline) {
  for (int i = 0; i < 200; i++) {
    if (count_threads() == baseline)
      return 1;
    nanosleep(&(struct timespec){0, 5 * 1000 * 1000}, NULL);
  }
  return 0;
}

/* ---- the runs ---- */
static const pmla_backend *be;
static int passed, failed;

#define CHECK(cond, ...)                                                                   \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      printf("FAIL: " __VA_ARGS__);                                                        \
      putchar('\n');                                                                       \
      ok = 0;                                                                              \
    }                                                                                      \
  } while (0)

enum { H = 16, PS = 16, B = 3, MAXQ = 2, TOPK = 64, PAGES = 16, T = 4, UNITS = 4 };
static int32_t qo[B + 1] = {0, 1, 3, 4}, lens[B] = {100, 0, 200}, table[B * 16], topk[T * TOPK];
static uint16_t q[T * H * 576], kv[PAGES * PS * 576], out[T * H * 512];
static float lse[T * H];
static int64_t s_qo[1] = {B + 1}, s_b[1] = {B}, s_bt[2] = {B, 16}, s_topk[2] = {T, TOPK};
static int64_t s_q[3] = {T, H, 576}, s_kv[3] = {PAGES, PS, 576}, s_out[3] = {T, H, 512},
               s_lse[2] = {T, H};
static DLTensor t_qo, t_lens, t_bt, t_topk, t_q, t_kv, t_out, t_lse;

static DLTensor tensor(void *data, uint8_t code, uint8_t bits, int ndim, int64_t *shape) {
  return (DLTensor){.data = data, .device = {kDLCPU, 0}, .ndim = ndim,
                    .dtype = {code, bits, 1}, .shape = shape};
}

static void make_inputs(void) {
  for (int i = 0; i < B * 16; i++)
    table[i] = (i * 7) % PAGES;
  for (int i = 0; i < T * TOPK; i++)
    topk[i] = i % 5 == 4 ? -1 : (i * 13) % (PAGES * PS);
  for (size_t i = 0; i < sizeof q / 2; i++)
    q[i] = (uint16_t)(0x3c00 + (i * 7919) % 0x200) ^ (uint16_t)((i & 1) << 15);
  for (size_t i = 0; i < sizeof kv / 2; i++)
    kv[i] = (uint16_t)(0x3b00 + (i * 104729) % 0x300) ^ (uint16_t)((i & 2) << 14);
  t_qo = tensor(qo, kDLInt, 32, 1, s_qo);
  t_lens = tensor(lens, kDLInt, 32, 1, s_b);
  t_bt = tensor(table, kDLInt, 32, 2, s_bt);
  t_topk = tensor(topk, kDLInt, 32, 2, s_topk);
  t_q = tensor(q, kDLBfloat, 16, 3, s_q);
  t_kv = tensor(kv, kDLBfloat, 16, 3, s_kv);
  t_out = tensor(out, kDLBfloat, 16, 3, s_out);
  t_lse = tensor(lse, kDLFloat, 32, 2, s_lse);
}

typedef enum { INIT_ONLY, CYCLE, REGISTRY } scenario;
static const char *const scenario_name[] = {"init", "cycle", "registry"};
static const char *plugin_path;
static size_t registry_backends; /* what the plugin's registry lists */
typedef struct result {
  pmla_status status; /* the first failing call's, or PMLA_OK */
  char message[512];
  const char *call;
  uint16_t dense[T * H * 512], sparse[T * H * 512];
} result;

/* One run; the failing call's status and message land in r. */
static void run(scenario what, result *r) {
  pmla_builder_config c = test_config(H, PS, B, MAXQ, TOPK, UNITS);
  pmla_decode_batch dense = {sizeof dense, PMLA_KV_BLOCK_TABLE, &t_qo, &t_bt, &t_lens,
                             NULL, NULL, NULL, NULL};
  pmla_sparse_batch sparse = {sizeof sparse, 0, &t_topk, 4096, NULL};
  pmla_decode_args args = {sizeof args, 0, &t_q, &t_kv, &t_out, &t_lse, NULL, NULL};
  pmla_builder *b = NULL;
  memset(r, 0, sizeof *r);
  if (what == REGISTRY) {
    pmla_registry *reg = NULL;
    r->call = "pmla_registry_open";
    r->status = pmla_registry_open(plugin_path, &reg);
    if (r->status == PMLA_OK) {
      size_t n = pmla_registry_count(reg);
      for (size_t i = 0; i < n; i++)
        if (!pmla_registry_find(reg, pmla_registry_backend(reg, i)->name))
          r->status = PMLA_ERR_INTERNAL;
      if (n > registry_backends)
        r->status = PMLA_ERR_INTERNAL;
      snprintf(r->message, sizeof r->message, "%zu backends, %s", n,
               pmla_registry_diagnostics(reg));
    }
    pmla_registry_close(reg);
    return;
  }
  r->call = "init_builder";
  r->status = be->init_builder(&c, &b);
  if (r->status != PMLA_OK) {
    snprintf(r->message, sizeof r->message, "%s", be->last_error(NULL));
    return;
  }
#define STEP(label, expr)                                                                  \
  if (r->status == PMLA_OK) {                                                              \
    r->call = label;                                                                       \
    r->status = expr;                                                                      \
  }
  if (what == CYCLE) {
    STEP("build_decode", be->build_decode(b, &dense));
    STEP("decode", be->decode(b, &args));
    memcpy(r->dense, out, sizeof out);
    STEP("build_sparse", be->build_sparse(b, &sparse));
    STEP("decode", be->decode(b, &args));
    memcpy(r->sparse, out, sizeof out);
    if (r->status != PMLA_OK)
      snprintf(r->message, sizeof r->message, "%s", be->last_error(b));
  }
#undef STEP
  be->destroy_builder(b);
}

/* Runs `what` with the k-th allocation (kind 0) or thread-start call (kind 1)
 * failing; returns 0 once k is past the last one the run makes. */
static int injected_run(scenario what, int kind, long k, const result *clean, int threads) {
  static result r;
  const char *name = scenario_name[what];
  const char *thing = kind ? "thread call" : "allocation";
  atomic_store(&allocs, 0);
  atomic_store(&creates, 0);
  atomic_store(&fail_alloc_at, kind ? 0 : k);
  atomic_store(&fail_create_at, kind ? k : 0);
  atomic_store(&hit, 0);
  live_count = 0;
  atomic_store(&watching, 1);
  run(what, &r);
  atomic_store(&watching, 0);
  if (!atomic_load(&hit))
    return 0;
  int ok = 1;
  CHECK(r.status == PMLA_OK || r.message[0] || what == REGISTRY,
        "%s, %s %ld fails: %s returned %s with no message", name, thing, k, r.call,
        pmla_status_name(r.status));
  CHECK(r.status == PMLA_OK || r.status == PMLA_ERR_OUT_OF_MEMORY,
        "%s, %s %ld fails: %s returned %s (%s); expected PMLA_ERR_OUT_OF_MEMORY", name, thing,
        k, r.call, pmla_status_name(r.status), r.message);
  CHECK(what != CYCLE || r.status != PMLA_OK ||
            (memcmp(r.dense, clean->dense, sizeof r.dense) == 0 &&
             memcmp(r.sparse, clean->sparse, sizeof r.sparse) == 0),
        "%s, %s %ld fails: the cycle succeeded with a different output", name, thing, k);
  CHECK(live_count == 0 && !atomic_load(&live_overflow),
        "%s, %s %ld fails (%s: %s): %zu allocations left outstanding", name, thing, k, r.call,
        pmla_status_name(r.status), live_count);
  CHECK(threads_back_to(threads), "%s, %s %ld fails: %d threads remain (%d before)", name,
        thing, k, count_threads(), threads);
  ok ? passed++ : failed++;
  return 1;
}

static void sweep(scenario what, int kind, const result *clean, int threads) {
  long k = 1;
  while (k < 100000 && injected_run(what, kind, k, clean, threads))
    k++;
  printf("%s: %ld %s points, each failed once\n", scenario_name[what], k - 1,
         kind ? "thread-start (pthread_create, pthread_mutex_init, pthread_cond_init)"
              : "allocation");
}

int main(int argc, char **argv) {
#ifdef PMLA_TEST_UNDER_SANITIZER
  (void)argc;
  (void)argv;
  printf("SKIP: inject: built with a sanitizer that owns malloc\n");
  return 77;
#else
  const char *plugin = test_plugin(argc, argv, PMLA_TEST_DEFAULT_PLUGIN, "inject");
  if (!plugin)
    return 99;
  plugin_path = plugin;
  /* the interposers must see the plugin's calls */
  atomic_store(&watching, 1);
  void *volatile probe = malloc(16);
  free(probe);
  atomic_store(&watching, 0);
  if (atomic_load(&allocs) != 1) {
    printf("SKIP: malloc interposition not effective here\n");
    return 77;
  }
  pmla_registry *reg = NULL;
  if (pmla_registry_open(plugin, &reg) != PMLA_OK || !(be = pmla_registry_find(reg, "pmla-cpu"))) {
    fprintf(stderr, "inject: no pmla-cpu in %s\n", plugin);
    return 99;
  }
  registry_backends = pmla_registry_count(reg);
  make_inputs();

  /* warm-up: first-use state (thread stacks, thread-local storage) is made
   * here, not in a counted run */
  static result clean;
  run(CYCLE, &clean);
  run(CYCLE, &clean);
  if (clean.status != PMLA_OK) {
    fprintf(stderr, "inject: a cycle without failures: %s returned %s: %s\n", clean.call,
            pmla_status_name(clean.status), clean.message);
    return 99;
  }
  atomic_store(&allocs, 0);
  atomic_store(&creates, 0);
  live_count = 0;
  atomic_store(&watching, 1);
  run(CYCLE, &clean);
  atomic_store(&watching, 0);
  printf("a cycle without failures: %ld allocations, %ld thread-start calls, %zu outstanding\n",
         atomic_load(&allocs), atomic_load(&creates), live_count);
  int threads = count_threads();
  if (live_count || threads < 1) {
    printf("FAIL: a cycle without failures left %zu allocations outstanding\n", live_count);
    return 1;
  }

  for (int kind = 0; kind < 2; kind++) {
    sweep(INIT_ONLY, kind, &clean, threads);
    sweep(CYCLE, kind, &clean, threads);
  }
  sweep(REGISTRY, 0, &clean, threads);
  pmla_registry_close(reg);
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : passed ? 0 : 99;
#endif
}
