/* SPDX-License-Identifier: MIT */
/* harness.h - shared helpers of the Check programs (pmla-conformance, the
 * black-box suite, and pmla-unit, the white-box one): which plugin and
 * backend are under test, tensors in the backend's memory, configs, random
 * numbers, skip reporting and the common main. Nothing here includes
 * kernels/ or plugin/. */
#ifndef PMLA_TEST_HARNESS_H
#define PMLA_TEST_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include <check.h>
#include <dlpack/dlpack.h>

#include "devmem.h"
#include "pmla.h"
#include "pmla_registry.h"

/* ---- what is under test (set by main before the suites run) ---- */
extern const char *g_plugin_path;  /* the plugin file */
extern const char *g_backend_name; /* e.g. "pmla-cpu" */
extern const char *g_mock_dir;     /* where the mock plugins were built, or NULL */
extern pmla_registry *g_registry;  /* opened on g_plugin_path */
extern const pmla_backend *g_be;   /* g_backend_name in g_registry, or NULL */
extern const char *g_no_device;    /* non-NULL: init fails with NO_DEVICE, why */

/* Prints a skip line and returns from the test when the backend has no
 * device (or is missing). */
#define REQUIRE_BACKEND()                                                                  \
  do {                                                                                     \
    if (harness_skip_reason()) {                                                           \
      harness_print_skip(__func__, harness_skip_reason());                                 \
      return;                                                                              \
    }                                                                                      \
  } while (0)

/* Like ck_assert_msg, but free when it holds: Check records the location of
 * every passing ck_assert through its message pipe, which dominates loops that
 * assert millions of times. */
#define EXPECT(cond, ...)                                                                  \
  do {                                                                                     \
    if (!(cond))                                                                           \
      ck_abort_msg(__VA_ARGS__);                                                           \
  } while (0)

const char *harness_skip_reason(void);
void harness_print_skip(const char *test, const char *reason);

/* Every test case is made through this: it adds a fixture that marks the
 * test in progress, so a process that exits in the middle of a test (a
 * plugin calling exit(0), which Check would count as a pass) fails, and
 * gives each test 60 s (tcase_set_timeout after it may change that). */
TCase *harness_tcase_create(const char *name);
#define tcase_create harness_tcase_create

/* ---- memory: tensors live where the backend wants them ----
 * All test data is made on the host and copied through a devmem table
 * (tests/devmem.h): host memory for pmla-cpu, GPU memory for pmla. main
 * picks it; tests only go through tt_* and harness_stream(). */
extern const devmem *g_mem;
void *harness_stream(void); /* the stream pmla calls take (NULL on the CPU) */

typedef struct test_tensor {
  DLTensor t;
  int64_t shape[4];
  size_t bytes;
} test_tensor;

/* dtype codes */
#define TT_I32 kDLInt, 32
#define TT_I64 kDLInt, 64
#define TT_F32 kDLFloat, 32
#define TT_BF16 kDLBfloat, 16

/* Allocates in g_mem and uploads `host` (may be NULL: contents unset).
 * Aborts the test on allocation failure. */
void tt_make(test_tensor *x, uint8_t code, uint8_t bits, const void *host, int ndim,
             const int64_t *shape);
void tt_make1(test_tensor *x, uint8_t code, uint8_t bits, const void *host, int64_t d0);
void tt_make2(test_tensor *x, uint8_t code, uint8_t bits, const void *host, int64_t d0,
              int64_t d1);
void tt_make3(test_tensor *x, uint8_t code, uint8_t bits, const void *host, int64_t d0,
              int64_t d1, int64_t d2);
void tt_upload(test_tensor *x, const void *host);
void tt_download(const test_tensor *x, void *host);
void tt_free(test_tensor *x);

/* A dense step's index tensors uploaded from host arrays (n requests; bt is
 * n x width, kvi has kvp[n] entries), and the decode batch naming all of
 * them: kv_layout picks the ones the backend reads. The batch points into
 * the struct, which stays where it was made until harness_dense_step_free. */
typedef struct harness_dense_step {
  test_tensor qo, lens, bt, kvp, kvi, last;
  pmla_decode_batch batch;
} harness_dense_step;
void harness_dense_step_make(harness_dense_step *s, uint32_t layout, int32_t n,
                             const int32_t *qo, const int32_t *lens, const int32_t *bt,
                             int32_t width, const int32_t *kvp, const int32_t *kvi,
                             const int32_t *last);
void harness_dense_step_free(harness_dense_step *s);

/* ---- configs and builders ---- */
/* test_config with .device = g_mem->device_id: the run's GPU ($<PREFIX>_DEVICE,
 * default 0), 0 on the CPU. */
pmla_builder_config harness_config(uint32_t heads, uint32_t page_size, uint32_t max_batch,
                                   uint32_t max_q_len, uint32_t topk, uint32_t cu_count);
/* init_builder through g_be; fails the test unless PMLA_OK. */
pmla_builder *harness_init(const pmla_builder_config *config);
pmla_builder_info harness_query(const pmla_builder *b);

/* ---- misc ---- */
uint64_t rng_next(uint64_t *state);
uint32_t rng_below(uint64_t *state, uint32_t n); /* [0, n) */
double rng_uniform(uint64_t *state);             /* [0, 1) */
uint8_t rng_e4m3(uint64_t *state); /* any finite e4m3 byte: up to +-448, zeros and subnormals */
uint64_t harness_seed(void);                     /* <PREFIX>_SEED or fixed */
int harness_devinput_steps(void);                /* <PREFIX>_DEVINPUT_STEPS, default 40 */
int harness_status_in(pmla_status got, const pmla_status *set, size_t n);
const char *harness_status_name(pmla_status s);
int harness_file_exists(const char *path);
/* What an older host passes: the first `size` bytes of an ABI struct `full`
 * in a block of exactly that size (a read past it shows under the
 * sanitizers), its struct_size set to `size`. free() it. */
void *harness_sized_copy(const void *full, uint32_t size);
/* mock plugin path "<g_mock_dir>/<name>.so", made absolute, into buf; 0 when it exists. */
int harness_mock_path(const char *name, char *buf, size_t size);
/* Runs fn(arg) in a forked child, which has 30 s (SIGALRM) to return, and
 * returns what it returned; the calling test fails, saying `what` and how
 * the child ended, when it ended any other way. */
int32_t harness_in_child(int32_t (*fn)(void *), void *arg, const char *what);

/* ---- the common main ----
 * Picks the plugin (argv[1], else $<PREFIX>_PLUGIN, else the first existing
 * entry of default_plugins, a colon-separated list), the backend
 * ($<PREFIX>_BACKEND, default pmla-cpu), the mock plugins' directory
 * ($<PREFIX>_MOCK_DIR, else default_mock_dir, may be NULL) and the memory
 * provider (a GPU backend's: GPU $<PREFIX>_DEVICE, default 0), runs `suites` and returns the exit status (0: every test
 * passed). env_prefix is e.g. "PMLA_CONFORMANCE". PMLA_PLUGIN_PATH is
 * unset (with a note when it was set): the registry would read it first. */
typedef Suite *(*harness_suite_fn)(void);
int harness_main(int argc, char **argv, const char *program, const char *env_prefix,
                 const char *default_plugins, const char *default_mock_dir,
                 const harness_suite_fn *suites, size_t nsuites);

/* ---- suites of pmla-conformance (black box: only abi/ and tests/) ---- */
Suite *suite_abi(void);
Suite *suite_builder(void);
Suite *suite_args(void);
Suite *suite_devinput(void);
Suite *suite_schedule(void);
Suite *suite_numerics(void);
Suite *suite_fp8(void);
Suite *suite_invariance(void);
Suite *suite_threads(void);
Suite *suite_gpu(void);

/* ---- suites of pmla-unit (white box: this plugin's planner) ---- */
Suite *suite_planner(void);
Suite *suite_plan_exact(void);
Suite *suite_plan_invariant(void);

#endif
