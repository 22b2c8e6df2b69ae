/* SPDX-License-Identifier: MIT */
/* harness.c - shared helpers of the Check programs (see harness.h). */
#define _XOPEN_SOURCE 700 /* realpath */
#include "harness.h"

#include "test_config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

const char *g_plugin_path;
const char *g_backend_name;
const char *g_mock_dir;
pmla_registry *g_registry;
const pmla_backend *g_be;
const char *g_no_device;

const char *harness_skip_reason(void) {
  if (!g_be)
    return "backend not found in the plugin";
  return g_no_device;
}

void harness_print_skip(const char *test, const char *reason) {
  size_t n = strlen(test); /* START_TEST names the function <test>_fn */
  if (n > 3 && strcmp(test + n - 3, "_fn") == 0)
    n -= 3;
  printf("SKIP %.*s: backend %s: %s\n", (int)n, test, g_backend_name, reason);
  fflush(stdout);
}

const devmem *g_mem = &devmem_cpu;

void *harness_stream(void) { return g_mem->stream ? g_mem->stream() : NULL; }

void tt_make(test_tensor *x, uint8_t code, uint8_t bits, const void *host, int ndim,
             const int64_t *shape) {
  memset(x, 0, sizeof *x);
  ck_assert_int_le(ndim, 4);
  size_t n = 1;
  for (int i = 0; i < ndim; i++) {
    x->shape[i] = shape[i];
    n *= (size_t)shape[i];
  }
  x->bytes = n * (bits / 8);
  x->t.data = g_mem->alloc(x->bytes);
  ck_assert_msg(x->t.data != NULL, "test tensor allocation of %zu bytes failed", x->bytes);
  x->t.device.device_type = g_mem->device_type;
  x->t.device.device_id = g_mem->device_id;
  x->t.ndim = ndim;
  x->t.dtype.code = code;
  x->t.dtype.bits = bits;
  x->t.dtype.lanes = 1;
  x->t.shape = x->shape;
  x->t.strides = NULL;
  x->t.byte_offset = 0;
  if (host)
    tt_upload(x, host);
}

void tt_make1(test_tensor *x, uint8_t code, uint8_t bits, const void *host, int64_t d0) {
  int64_t s[1] = {d0};
  tt_make(x, code, bits, host, 1, s);
}
void tt_make2(test_tensor *x, uint8_t code, uint8_t bits, const void *host, int64_t d0,
              int64_t d1) {
  int64_t s[2] = {d0, d1};
  tt_make(x, code, bits, host, 2, s);
}
void tt_make3(test_tensor *x, uint8_t code, uint8_t bits, const void *host, int64_t d0,
              int64_t d1, int64_t d2) {
  int64_t s[3] = {d0, d1, d2};
  tt_make(x, code, bits, host, 3, s);
}

void tt_upload(test_tensor *x, const void *host) {
  if (x->bytes)
    ck_assert_msg(g_mem->upload(x->t.data, host, x->bytes) == 0, "%s: upload of %zu bytes failed",
                  g_mem->name, x->bytes);
}
void tt_download(const test_tensor *x, void *host) {
  if (g_mem->sync)
    ck_assert_msg(g_mem->sync() == 0, "%s: sync failed", g_mem->name);
  if (x->bytes)
    ck_assert_msg(g_mem->download(host, x->t.data, x->bytes) == 0,
                  "%s: download of %zu bytes failed", g_mem->name, x->bytes);
}
void tt_free(test_tensor *x) {
  if (x->t.data)
    g_mem->release(x->t.data);
  x->t.data = NULL;
}

void harness_dense_step_make(harness_dense_step *s, uint32_t layout, int32_t n,
                             const int32_t *qo, const int32_t *lens, const int32_t *bt,
                             int32_t width, const int32_t *kvp, const int32_t *kvi,
                             const int32_t *last) {
  tt_make1(&s->qo, TT_I32, qo, n + 1);
  tt_make1(&s->lens, TT_I32, lens, n);
  tt_make2(&s->bt, TT_I32, bt, n, width);
  tt_make1(&s->kvp, TT_I32, kvp, n + 1);
  tt_make1(&s->kvi, TT_I32, kvi, kvp[n]);
  tt_make1(&s->last, TT_I32, last, n);
  pmla_decode_batch *b = &s->batch;
  memset(b, 0, sizeof *b);
  b->struct_size = sizeof *b;
  b->kv_layout = layout;
  b->qo_indptr = &s->qo.t;
  b->block_table = &s->bt.t;
  b->kv_lens = &s->lens.t;
  b->kv_indptr = &s->kvp.t;
  b->kv_indices = &s->kvi.t;
  b->kv_last_page_len = &s->last.t;
  b->stream = harness_stream();
}

void harness_dense_step_free(harness_dense_step *s) {
  test_tensor *all[] = {&s->qo, &s->lens, &s->bt, &s->kvp, &s->kvi, &s->last};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    tt_free(all[i]);
}

/* ---- configs ---- */
pmla_builder_config harness_config(uint32_t heads, uint32_t page_size, uint32_t max_batch,
                                   uint32_t max_q_len, uint32_t topk, uint32_t cu_count) {
  pmla_builder_config c = test_config(heads, page_size, max_batch, max_q_len, topk, cu_count);
  c.device = g_mem->device_id; /* <PREFIX>_DEVICE picked g_mem */
  return c;
}

pmla_builder *harness_init(const pmla_builder_config *config) {
  pmla_builder *b = NULL;
  pmla_status s = g_be->init_builder(config, &b);
  ck_assert_msg(s == PMLA_OK && b != NULL,
                "init_builder(heads %u, page %u, batch %u, q_len %u, topk %u, cu %u) "
                "returned %s: %s",
                config->num_heads, config->page_size, config->max_batch, config->max_q_len,
                config->topk, config->cu_count, harness_status_name(s), g_be->last_error(NULL));
  return b;
}

pmla_builder_info harness_query(const pmla_builder *b) {
  pmla_builder_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  pmla_status s = g_be->query_builder(b, &info);
  ck_assert_msg(s == PMLA_OK, "query_builder returned %s: %s", harness_status_name(s),
                g_be->last_error(b));
  return info;
}

/* ---- misc ---- */
uint64_t rng_next(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
uint32_t rng_below(uint64_t *s, uint32_t n) { return n ? (uint32_t)(rng_next(s) % n) : 0; }
double rng_uniform(uint64_t *s) { return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }
uint8_t rng_e4m3(uint64_t *s) {
  const uint8_t b = (uint8_t)rng_below(s, 256);
  return (b & 0x7f) == 0x7f ? (uint8_t)(b ^ 1) : b; /* S.1111.111 is NaN */
}

static const char *g_env_prefix = "PMLA_CONFORMANCE";

/* getenv("<prefix>_<name>"); NULL when unset or empty. */
static const char *harness_env(const char *name) {
  char key[128];
  snprintf(key, sizeof key, "%s_%s", g_env_prefix, name);
  const char *v = getenv(key);
  return v && *v ? v : NULL;
}

static uint64_t g_seed = 0x5eed2024ull, g_devinput_steps = 40;

uint64_t harness_seed(void) { return g_seed; }
int harness_devinput_steps(void) { return (int)g_devinput_steps; }

/* <PREFIX>_<name>, when set, as a whole number (decimal, or hex after 0x)
 * in min..max into *v; 0 (with a message) for anything else */
static int env_number(const char *program, const char *name, uint64_t min, uint64_t max,
                      uint64_t *v) {
  const char *e = harness_env(name);
  if (!e)
    return 1;
  char *end;
  errno = 0;
  const unsigned long long n = strtoull(e, &end, 0);
  if (!isdigit((unsigned char)e[0]) || *end || errno || n < min || n > max) {
    fprintf(stderr, "%s: %s_%s=%s: accepted: a whole number %llu..%llu (decimal, or hex after "
            "0x)\n", program, g_env_prefix, name, e, (unsigned long long)min,
            (unsigned long long)max);
    return 0;
  }
  *v = n;
  return 1;
}

int harness_status_in(pmla_status got, const pmla_status *set, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (set[i] == got)
      return 1;
  return 0;
}

const char *harness_status_name(pmla_status s) {
  static const char *names[] = {"PMLA_OK",          "PMLA_ERR_INVALID_ARGUMENT",
                                "PMLA_ERR_UNSUPPORTED", "PMLA_ERR_VERSION",
                                "PMLA_ERR_STRUCT_SIZE", "PMLA_ERR_CAPACITY",
                                "PMLA_ERR_NO_DEVICE",   "PMLA_ERR_OUT_OF_MEMORY",
                                "PMLA_ERR_DEVICE",      "PMLA_ERR_BAD_STATE",
                                "PMLA_ERR_DEVICE_INPUT", "PMLA_ERR_INTERNAL"};
  if ((unsigned)s < sizeof names / sizeof names[0])
    return names[s];
  return "(unknown status)";
}

int harness_file_exists(const char *path) { return path && access(path, R_OK) == 0; }

void *harness_sized_copy(const void *full, uint32_t size) {
  unsigned char *p = malloc(size);
  ck_assert(p);
  memcpy(p, full, size);
  memcpy(p, &size, sizeof size);
  return p;
}

/* An absolute path: tests link to the mocks from temporary directories,
 * where a relative link target would name nothing. */
int harness_mock_path(const char *name, char *buf, size_t size) {
  if (!g_mock_dir)
    return -1;
  snprintf(buf, size, "%s/%s.so", g_mock_dir, name);
  char *abs = harness_file_exists(buf) ? realpath(buf, NULL) : NULL;
  const int fits = abs && strlen(abs) < size;
  if (fits)
    memcpy(buf, abs, strlen(abs) + 1);
  free(abs);
  return fits ? 0 : -1;
}

int32_t harness_in_child(int32_t (*fn)(void *), void *arg, const char *what) {
  int fd[2];
  ck_assert_int_eq(pipe(fd), 0);
  const pid_t pid = fork();
  ck_assert_msg(pid >= 0, "%s: fork failed", what);
  if (pid == 0) {
    signal(SIGALRM, SIG_DFL); /* not the test runner's handler */
    alarm(30);
    const int32_t v = fn(arg);
    _exit(write(fd[1], &v, sizeof v) == sizeof v ? 0 : 1);
  }
  close(fd[1]);
  int32_t v = 0;
  const ssize_t n = read(fd[0], &v, sizeof v);
  close(fd[0]);
  int ws = 0;
  ck_assert_int_eq(waitpid(pid, &ws, 0), pid);
  ck_assert_msg(n == sizeof v && WIFEXITED(ws) && WEXITSTATUS(ws) == 0,
                "%s: the child did not finish (%s %d)", what,
                WIFSIGNALED(ws) ? "signal" : "exit status",
                WIFSIGNALED(ws) ? WTERMSIG(ws) : WEXITSTATUS(ws));
  return v;
}

/* ---- the common main ---- */

/* A test in progress, set and cleared by a checked fixture around each
 * test (in the forked child, or in the one process without fork). A
 * process that exits while it is set did so from inside a test. */
static volatile int g_in_test;
static void test_begins(void) { g_in_test = 1; }
static void test_ends(void) { g_in_test = 0; }
static void exit_guard(void) {
  if (g_in_test) {
    fputs("harness: the process exited in the middle of a test (exit() from the code under "
          "test?): failed\n", stderr);
    fflush(NULL);
    _exit(EXIT_FAILURE);
  }
}

#undef tcase_create
TCase *harness_tcase_create(const char *name) {
  TCase *tc = tcase_create(name);
  /* Check's default of 4 s per test is below what a sanitizer build takes
   * on a loaded machine (1024 worker threads of one init under ASan beside
   * the other test programs: over 4 s); a test case may ask for more */
  tcase_set_timeout(tc, 60);
  tcase_add_checked_fixture(tc, test_begins, test_ends);
  return tc;
}

/* First existing file of a colon-separated list (or the first entry). */
static const char *first_existing(const char *list) {
  static char buf[4096];
  const char *p = list;
  const char *first = NULL;
  size_t first_len = 0;
  while (p && *p) {
    const char *e = strchr(p, ':');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    if (n && n < sizeof buf) {
      memcpy(buf, p, n);
      buf[n] = '\0';
      if (harness_file_exists(buf))
        return buf;
      if (!first) {
        first = p;
        first_len = n;
      }
    }
    p = e ? e + 1 : NULL;
  }
  if (first) {
    memcpy(buf, first, first_len);
    buf[first_len] = '\0';
    return buf;
  }
  return list;
}

int harness_main(int argc, char **argv, const char *program, const char *env_prefix,
                 const char *default_plugins, const char *default_mock_dir,
                 const harness_suite_fn *suites, size_t nsuites) {
  g_env_prefix = env_prefix;
  if (argc > 2 || (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")))) {
    fprintf(stderr,
            "usage: %s [PLUGIN.so]\n  env: %s_PLUGIN, %s_BACKEND (default pmla-cpu; pmla when "
            "%s_DEVICE is set), %s_DEVICE (GPU ordinal, default 0), %s_MOCK_DIR, %s_SEED, "
            "%s_DEVINPUT_STEPS, CK_RUN_SUITE, CK_RUN_CASE, CK_FORK\n  exit: 0 all passed, 1 a "
            "failure (or no test ran, or the report not written), 2 bad arguments, 77 a GPU "
            "backend without a device (all skipped)\n",
            argv[0], env_prefix, env_prefix, env_prefix, env_prefix, env_prefix, env_prefix,
            env_prefix);
    return argc == 2 ? 0 : 2;
  }
  const char *env_plugin = harness_env("PLUGIN");
  g_plugin_path = argc == 2 ? argv[1] : env_plugin ? env_plugin : first_existing(default_plugins);
  const char *env_backend = harness_env("BACKEND");
  /* <PREFIX>_DEVICE alone names a GPU, so the GPU backend */
  g_backend_name = env_backend ? env_backend : harness_env("DEVICE") ? "pmla" : "pmla-cpu";
  const char *env_mock = harness_env("MOCK_DIR");
  g_mock_dir = env_mock ? env_mock : default_mock_dir;
  struct stat st;
  if (env_mock && (stat(env_mock, &st) != 0 || !S_ISDIR(st.st_mode))) {
    fprintf(stderr, "%s: %s_MOCK_DIR=%s is not a directory (accepted: the directory the mock "
            "plugins were built in, or unset to skip the tests that need them)\n",
            program, env_prefix, env_mock);
    return 2;
  }
  if (!env_number(program, "SEED", 0, UINT64_MAX, &g_seed) ||
      !env_number(program, "DEVINPUT_STEPS", 1, 1000000, &g_devinput_steps))
    return 2;

  if (!harness_file_exists(g_plugin_path)) {
    fprintf(stderr, "%s: plugin %s not found (pass it as the argument or in %s_PLUGIN)\n",
            program, g_plugin_path, env_prefix);
    return 2;
  }
  /* The plugin under test is the file chosen above: PMLA_PLUGIN_PATH, which
   * the registry reads before its argument, must not stand in for it. */
  const char *env_path = getenv(PMLA_PLUGIN_PATH_ENV);
  if (env_path && *env_path)
    printf("%s: %s=%s is ignored: the plugin under test is %s\n", program,
           PMLA_PLUGIN_PATH_ENV, env_path, g_plugin_path);
  unsetenv(PMLA_PLUGIN_PATH_ENV);
  if (pmla_registry_open(g_plugin_path, &g_registry) != PMLA_OK) {
    fprintf(stderr, "%s: cannot open a registry on %s\n", program, g_plugin_path);
    return 2;
  }
  g_be = pmla_registry_find(g_registry, g_backend_name);
  if (!g_be) {
    fprintf(stderr, "%s: backend %s not in %s\n%s", program, g_backend_name, g_plugin_path,
            pmla_registry_diagnostics(g_registry));
    return 1;
  }

  /* <PREFIX>_DEVICE=N: the whole run on GPU N (its memory, stream and
   * every builder config); a device the host lacks is an error, not a skip,
   * unless there is no GPU at all. */
  int gpu = strcmp(g_backend_name, "pmla-cpu") != 0, device = 0;
  const char *env_device = harness_env("DEVICE");
  if (env_device) {
    char *end;
    long v = strtol(env_device, &end, 10);
    if (*end || v < 0 || v >= DEVMEM_MAX_GPUS || (!gpu && v != 0)) {
      fprintf(stderr, "%s: %s_DEVICE=%s: accepted: %s\n", program, env_prefix, env_device,
              gpu ? "a GPU ordinal 0..15" : "0 (backend pmla-cpu has device 0 only)");
      return 2;
    }
    device = (int)v;
  }
  if (gpu) {
    const char *why = NULL;
    const devmem *m = devmem_gpu_on(device, &why);
    if (m)
      g_mem = m;
    else if (env_device && devmem_gpu_count() > 0) {
      fprintf(stderr, "%s: %s_DEVICE=%d: %s\n", program, env_prefix, device, why);
      return 2;
    } else
      g_no_device = why ? why : "no GPU memory provider";
  }
  if (!g_no_device) {
    /* Does the backend have a device at all? */
    pmla_builder_config c = harness_config(16, 16, 1, 1, 0, 1);
    pmla_builder *b = NULL;
    pmla_status s = g_be->init_builder(&c, &b);
    if (s == PMLA_ERR_NO_DEVICE) {
      static char why[512];
      snprintf(why, sizeof why, "init_builder says PMLA_ERR_NO_DEVICE: %s",
               g_be->last_error(NULL));
      g_no_device = why;
    } else if (s == PMLA_OK) {
      g_be->destroy_builder(b);
    }
  }
  printf("%s: plugin %s, backend %s, memory %s, mocks %s, seed %#llx\n", program,
         g_plugin_path, g_backend_name, g_mem->name, g_mock_dir ? g_mock_dir : "(none)",
         (unsigned long long)g_seed);
  if (g_no_device)
    printf("%s: tests that need a builder are SKIPPED: %s\n", program, g_no_device);
  const char *filters[] = {"CK_RUN_SUITE", "CK_RUN_CASE", "CK_INCLUDE_TAGS", "CK_EXCLUDE_TAGS"};
  for (size_t i = 0; i < sizeof filters / sizeof filters[0]; i++) {
    const char *v = getenv(filters[i]);
    if (v && *v)
      printf("%s: %s=%s: only those tests run\n", program, filters[i], v);
  }
  fflush(stdout);
  atexit(exit_guard);

  SRunner *sr = srunner_create(nsuites ? suites[0]() : NULL);
  for (size_t i = 1; i < nsuites; i++)
    srunner_add_suite(sr, suites[i]());
  /* A GPU runtime does not survive fork: run in one process there. */
  if (gpu && g_mem->device_type != kDLCPU && !getenv("CK_FORK"))
    srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_ENV);
  const int failed = srunner_ntests_failed(sr), ran = srunner_ntests_run(sr);
  srunner_free(sr);
  pmla_registry_close(g_registry);
  /* the last line says what ran where, so that a tail of the output does */
  printf("%s: backend %s, memory %s: %d checks run, %d failed%s\n", program, g_backend_name,
         g_mem->name, ran, failed,
         g_no_device ? "; every test that needs a builder SKIPPED (no device)" : "");
  if (fflush(stdout) || ferror(stdout)) { /* a full disk, a closed pipe */
    fprintf(stderr, "%s: cannot write the report to standard output\n", program);
    return EXIT_FAILURE;
  }
  if (failed)
    return EXIT_FAILURE;
  if (ran == 0) {
    fprintf(stderr, "%s: no test ran (see CK_RUN_SUITE / CK_RUN_CASE)\n", program);
    return EXIT_FAILURE;
  }
  /* a GPU backend without a device certifies nothing: 77, automake's skip */
  return gpu && g_no_device ? 77 : EXIT_SUCCESS;
}
