/* SPDX-License-Identifier: MIT */
/* fuzz_pmla.c - a libFuzzer target over everything pmla validates, driven
 * the way a host drives it: abi/pmla.h and the registry, nothing else.
 *
 * One input is read front to back as a short host session:
 *   1. negotiation: the entry point of the plugin or of a mock plugin,
 *      called directly (any struct_size, any version range) and through
 *      pmla_negotiate (any message buffer size);
 *   2. the registry: a search path made of the plugin, the mock plugins'
 *      directory and files, missing paths and empty entries; count, each
 *      backend, its path and version, find by any name, diagnostics;
 *   3. a backend (pmla-cpu mostly; else pmla or a mock found by that
 *      registry): init_builder with every config field and struct_size
 *      chosen by the input, then a few calls among build_decode (block
 *      table or CSR), build_sparse, decode, query_builder, copy_buffer,
 *      check_device_error and calls without a builder, then destroy.
 * Every ABI struct is allocated with exactly the struct_size it declares
 * (up to the 1.0 size), so reading past it is an AddressSanitizer report.
 * DLTensors get their dtype, ndim, shape, strides, byte_offset, device and
 * data alignment from the input, and index tensors their contents.
 *
 * What must hold for every input (the target aborts otherwise):
 *   - no crash, leak or sanitizer report;
 *   - every call answers PMLA_OK or a known status with a non-empty
 *     message: last_error(builder), last_error(NULL) for calls made without
 *     a builder, the negotiation message for PMLA_ERR_VERSION; and never
 *     PMLA_ERR_INTERNAL (a batch the checks passed that the planner refused);
 *   - a failed call writes none of its outputs (the builder pointer, info,
 *     host_dst, the out and lse tensors);
 *   - decode after a failed build (or before any) is refused;
 *   - the registry's answers agree with each other.
 *
 * The host's side of the contract is kept, so any memory error is pmla's:
 * a tensor's storage holds everything its DLTensor claims. A claim too large
 * to allocate is only made where the ABI requires a refusal: a negative
 * dim, a dim that must equal a known value, or a length beyond a documented
 * limit. Sizes are capped from the input so one run takes milliseconds.
 *
 *   env: PMLA_FUZZ_PLUGIN (the plugin file), PMLA_FUZZ_MOCK_DIR (mock plugins),
 *        PMLA_FUZZ_TRACE=1 (print each call and its status on stderr) */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pmla.h"
#include "pmla_registry.h"

#ifndef PMLA_FUZZ_PLUGIN
#define PMLA_FUZZ_PLUGIN "plugin/.libs/pmla.so"
#endif
#ifndef PMLA_FUZZ_MOCK_DIR
#define PMLA_FUZZ_MOCK_DIR "tests/.libs"
#endif

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* ---- limits that keep one run small ---- */
enum {
  WORK_BUDGET = 1 << 14, /* query rows x heads x KV positions of one decode */
  SPAN = 128,            /* KV positions of one request (one page, if larger) */
  CACHE_SLOTS = 1024,    /* KV cache rows (pages x page_size), about */
  MAX_TOKENS = 64,       /* query tokens of a decode's tensors */
  MAX_OPS = 8,           /* calls on one builder */
  MAX_UNITS = 4          /* worker threads of one builder */
};
#define STORAGE_CAP ((size_t)64 << 20) /* the largest tensor storage allocated */

/* ---- failures ---- */
static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("fuzz_pmla: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  abort();
}
#define REQUIRE(cond, ...)                                                                  \
  do {                                                                                      \
    if (!(cond))                                                                            \
      fail(__VA_ARGS__);                                                                    \
  } while (0)

/* ---- reading the input ---- */
typedef struct input {
  const uint8_t *p;
  size_t n;
} input;

static uint8_t u8(input *in) {
  if (!in->n)
    return 0;
  in->n--;
  return *in->p++;
}
static uint32_t u32(input *in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++)
    v = v << 8 | u8(in);
  return v;
}
static uint64_t u64(input *in) {
  uint64_t hi = u32(in);
  return hi << 32 | u32(in);
}
/* [0, n), n >= 1 */
static uint32_t below(input *in, uint32_t n) { return n <= 256 ? u8(in) % n : u32(in) % n; }
/* True about one time in eight: take the unusual branch. */
static int rarely(input *in) { return u8(in) >= 224; }
/* Mostly one of `good`, sometimes any 32-bit value. */
static uint32_t pick(input *in, const uint32_t *good, size_t n) {
  uint8_t sel = u8(in);
  return sel < 224 ? good[sel % n] : u32(in);
}
#define PICK(in, ...)                                                                       \
  pick(in, (const uint32_t[]){__VA_ARGS__},                                                 \
       sizeof((const uint32_t[]){__VA_ARGS__}) / sizeof(uint32_t))

/* Now and then, one entry of an int32 array replaced by a value that likely
 * breaks a rule: negative, extreme, just above the limit, or anything. */
static void corrupt(input *in, int32_t *v, size_t n, int32_t just_above) {
  if (!n || !rarely(in))
    return;
  static const int32_t bad[] = {-1, -2, INT32_MIN, INT32_MAX};
  size_t i = below(in, n > 256 ? 256 : (uint32_t)n);
  uint8_t how = u8(in) % 6;
  v[i] = how < 4 ? bad[how] : how == 4 ? just_above : (int32_t)u32(in);
}

/* ---- what the fuzzer loaded once ---- */
#define MAX_FILES 32
static struct {
  char plugin[4096], mock_dir[4096], plugin_dir[4096];
  char files[MAX_FILES][4096]; /* plugin + every .so of the mock dir */
  pmla_entry_fn entries[MAX_FILES]; /* entries[0]: the plugin's */
  size_t entry_file[MAX_FILES];     /* files[] index of each entry */
  size_t num_files, num_entries;
  pmla_registry *registry; /* on the plugin alone */
  const pmla_backend *cpu, *gpu;
  long online_cpus;
  int trace;
} g;

static void load_file(const char *path) {
  if (g.num_files == MAX_FILES)
    return;
  snprintf(g.files[g.num_files], sizeof g.files[0], "%s", path);
  /* held open for the whole run: the registry's dlopen of it is a lookup */
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (h) {
    void *sym = dlsym(h, PMLA_ENTRY_SYMBOL);
    if (sym) {
      g.entry_file[g.num_entries] = g.num_files;
      memcpy(&g.entries[g.num_entries++], &sym, sizeof sym);
    }
  }
  g.num_files++;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  const char *plugin = getenv("PMLA_FUZZ_PLUGIN"), *mocks = getenv("PMLA_FUZZ_MOCK_DIR");
  snprintf(g.plugin, sizeof g.plugin, "%s", plugin && *plugin ? plugin : PMLA_FUZZ_PLUGIN);
  snprintf(g.mock_dir, sizeof g.mock_dir, "%s", mocks && *mocks ? mocks : PMLA_FUZZ_MOCK_DIR);
  snprintf(g.plugin_dir, sizeof g.plugin_dir, "%s", g.plugin);
  char *slash = strrchr(g.plugin_dir, '/');
  if (slash)
    *slash = '\0';
  else
    snprintf(g.plugin_dir, sizeof g.plugin_dir, ".");
  unsetenv(PMLA_PLUGIN_PATH_ENV); /* only the paths below are searched */
  g.online_cpus = sysconf(_SC_NPROCESSORS_ONLN);
  g.trace = getenv("PMLA_FUZZ_TRACE") && *getenv("PMLA_FUZZ_TRACE") == '1';

  if (access(g.plugin, R_OK) != 0) {
    fprintf(stderr, "fuzz_pmla: plugin %s not found (set PMLA_FUZZ_PLUGIN)\n", g.plugin);
    exit(2);
  }
  load_file(g.plugin);
  DIR *d = opendir(g.mock_dir);
  if (d) { /* the registry sees these names as "<dir>/<name>" too */
    struct dirent *e;
    while ((e = readdir(d))) {
      size_t len = strlen(e->d_name);
      if (len > 3 && strcmp(e->d_name + len - 3, ".so") == 0) {
        char path[4096 + 256];
        snprintf(path, sizeof path, "%s/%s", g.mock_dir, e->d_name);
        load_file(path);
      }
    }
    closedir(d);
  }
  if (g.num_files == 1)
    fprintf(stderr, "fuzz_pmla: no mock plugins in %s (build them with make check)\n",
            g.mock_dir);
  if (pmla_registry_open(g.plugin, &g.registry) != PMLA_OK ||
      !(g.cpu = pmla_registry_find(g.registry, "pmla-cpu"))) {
    fprintf(stderr, "fuzz_pmla: no pmla-cpu backend in %s\n", g.plugin);
    exit(2);
  }
  g.gpu = pmla_registry_find(g.registry, "pmla");
  return 0;
}

/* ---- ABI structs, allocated as large as they say they are ---- */

/* A copy of `full` (a 1.0 struct of `size` bytes) in storage of exactly
 * `struct_size` bytes (at least 4) when that is smaller; a newer host's
 * larger struct gets a tail of input bytes (up to 256). */
static void *abi_struct(input *in, const void *full, size_t size, uint32_t struct_size) {
  size_t n = struct_size < size ? (struct_size < 4 ? 4 : struct_size)
             : struct_size <= size + 256 ? struct_size : size;
  uint8_t *p = malloc(n);
  REQUIRE(p, "out of memory");
  memcpy(p, full, n < size ? n : size);
  for (size_t i = size; i < n; i++)
    p[i] = u8(in);
  memcpy(p, &struct_size, 4);
  return p;
}

static uint32_t struct_size_of(input *in, uint32_t size) {
  return PICK(in, size, size, size, size, size, size + 8, size - 4, size - 8, 4, 0);
}

/* ---- DLTensors whose storage holds what they claim ---- */
#define EXACT (-1)     /* the plugin must refuse any other value */
#define UNBOUNDED (-2) /* any size is accepted: only small ones are made */

typedef struct ftensor {
  DLTensor t;
  int64_t shape[6], strides[6];
  uint8_t *storage;
  size_t bytes; /* storage bytes from t.data + t.byte_offset on (0: none) */
} ftensor;

/* dims[d] is what the host means; limit[d] is EXACT, UNBOUNDED or the
 * largest value the ABI accepts. The input may change any field. */
static void tensor_make(input *in, ftensor *x, uint8_t code, uint8_t bits, int ndim,
                        const int64_t *dims, const int64_t *limit, const void *values,
                        size_t value_bytes) {
  memset(x, 0, sizeof *x);
  DLTensor *t = &x->t;
  t->device.device_type = kDLCPU;
  t->dtype.code = code;
  t->dtype.bits = bits;
  t->dtype.lanes = 1;
  t->ndim = ndim;
  t->shape = x->shape;
  for (int d = 0; d < ndim; d++)
    x->shape[d] = dims[d];
  if (rarely(in)) {
    int d = (int)below(in, (uint32_t)ndim);
    switch (u8(in) % 9) {
    case 0: t->dtype.code = u8(in); break;
    case 1: t->dtype.bits = u8(in); break;
    case 2: t->dtype.lanes = (uint16_t)(2 + u8(in)); break;
    case 3: t->ndim = (int8_t)u8(in) % 7; break;
    case 4: x->shape[d] = below(in, (uint32_t)(2 * dims[d] + 3)); break;
    case 5: x->shape[d] = u8(in) & 1 ? INT64_MIN : -1 - (int64_t)u8(in); break;
    case 6: /* too large to allocate: only where a refusal is required */
      if (limit[d] == EXACT)
        x->shape[d] = dims[d] + 1 + (int64_t)(u64(in) >> 2);
      else if (limit[d] >= 0)
        x->shape[d] = u8(in) & 1 ? INT64_MAX : limit[d] + 1 + (int64_t)u32(in);
      break;
    case 7: t->shape = NULL; break;
    default:
      t->device.device_type = (DLDeviceType)u8(in);
      t->device.device_id = (int8_t)u8(in);
    }
  }
  /* bytes the claim covers; 0 when it covers nothing allocatable */
  size_t esize = ((size_t)t->dtype.bits * t->dtype.lanes + 7) / 8, need = 0;
  int64_t numel = 1;
  int ok = t->shape && t->ndim >= 0 && t->ndim <= 6;
  for (int d = 0; ok && d < t->ndim; d++) {
    if (x->shape[d] < 0 || (x->shape[d] && numel > (int64_t)(STORAGE_CAP / (size_t)x->shape[d])))
      ok = 0;
    else
      numel *= x->shape[d];
  }
  if (ok && (size_t)numel <= STORAGE_CAP / (esize ? esize : 1))
    need = (size_t)numel * esize;
  /* strides: none (contiguous), row-major written out, or one entry off */
  if (t->shape && t->ndim >= 1 && t->ndim <= 6 && u8(in) >= 192) {
    uint64_t s = 1; /* unsigned: a claim past int64 wraps here, not in UB */
    for (int d = t->ndim - 1; d >= 0; d--) {
      x->strides[d] = (int64_t)s;
      s *= x->shape[d] > 0 ? (uint64_t)x->shape[d] : 1;
    }
    if (u8(in) & 1) {
      int d = (int)below(in, (uint32_t)t->ndim);
      x->strides[d] = (int64_t)((uint64_t)x->strides[d] + (u8(in) & 1 ? 1 : u64(in)));
    }
    t->strides = x->strides;
  }
  /* where the data starts: aligned, or off by bytes that break alignment */
  size_t offset = 0, misalign = 0;
  int null_data = 0;
  if (rarely(in)) {
    switch (u8(in) % 6) {
    case 0: offset = esize; break;
    case 1: offset = 64; break;
    case 2: offset = 1 + u8(in) % 3; break;
    case 3: misalign = 1 + u8(in) % 3; break;
    case 4: null_data = 1; break;
    default: offset = 3 * esize;
    }
  }
  if (null_data)
    return;
  x->storage = malloc(misalign + offset + (need ? need : 16));
  REQUIRE(x->storage, "out of memory for %zu bytes", need);
  t->data = x->storage + misalign;
  t->byte_offset = offset;
  x->bytes = need;
  uint8_t *data = x->storage + misalign + offset;
  size_t fill = values && value_bytes < need ? value_bytes : values ? need : 0;
  if (fill)
    memcpy(data, values, fill);
  memset(data + fill, 0, need - fill);
}

static void tensor_free(ftensor *x) {
  free(x->storage);
  x->storage = NULL;
}

/* Fills storage with a pattern a failed call must leave alone. */
static void tensor_poison(ftensor *x) {
  if (x->bytes)
    memset((uint8_t *)x->t.data + x->t.byte_offset, 0xa5, x->bytes);
}
static int tensor_untouched(const ftensor *x) {
  static uint8_t poison[4096];
  if (!poison[0])
    memset(poison, 0xa5, sizeof poison);
  const uint8_t *p = x->bytes ? (const uint8_t *)x->t.data + x->t.byte_offset : NULL;
  for (size_t at = 0; at < x->bytes; at += sizeof poison)
    if (memcmp(p + at, poison, x->bytes - at < sizeof poison ? x->bytes - at : sizeof poison))
      return 0;
  return 1;
}

/* ---- the host session on one backend ---- */
typedef struct session {
  input *in;
  const pmla_backend *be;
  pmla_builder *b;
  int is_pmla; /* pmla-cpu from this plugin: the full contract is checked */
  /* the config the builder was made with (or defaults when init failed) */
  uint32_t heads, page, max_batch, max_q_len, topk, kv_dtype;
  pmla_builder_info info;
  /* the step built last: its tensors stay alive until the next build */
  int step_built;
  int64_t step_tokens, cache_pages;
  ftensor step[6];
} session;

static const char *status_text(pmla_status s) { return pmla_status_name(s); }

/* A failed call must say why: last_error of its builder, or of NULL. */
static void check_status(session *s, pmla_status st, const pmla_builder *b, const char *call) {
  if (g.trace)
    fprintf(stderr, "  %s %s: %s%s%s\n", s->be->name, call, status_text(st),
            st ? ": " : "", st ? s->be->last_error(b) : "");
  if (st == PMLA_OK)
    return;
  REQUIRE((unsigned)st <= PMLA_ERR_INTERNAL, "%s on %s: unknown status %d", call, s->be->name,
          (int)st);
  const char *msg = s->be->last_error(b);
  REQUIRE(msg && *msg, "%s on %s returned %s with an empty last_error(%s)", call, s->be->name,
          status_text(st), b ? "builder" : "NULL");
  REQUIRE(!s->is_pmla || st != PMLA_ERR_INTERNAL, "%s on %s: %s: %s", call, s->be->name,
          status_text(st), msg);
}

static void free_step(ftensor *step) {
  for (int i = 0; i < 6; i++)
    tensor_free(&step[i]);
}

/* The KV cache pages a step refers to, and how many query rows it may have. */
static void step_limits(session *s, int64_t *cache_pages, int64_t *max_rows) {
  *cache_pages = 1 + below(s->in, CACHE_SLOTS / s->page > 1 ? CACHE_SLOTS / s->page : 1);
  int64_t rows = WORK_BUDGET / ((int64_t)s->heads * SPAN);
  *max_rows = rows < 1 ? 1 : rows > 16 ? 16 : rows;
}

static void op_build_decode(session *s) {
  input *in = s->in;
  ftensor step[6];
  memset(step, 0, sizeof step);
  int64_t pages, max_rows;
  step_limits(s, &pages, &max_rows);
  const int64_t P = s->page, width_max = SPAN / P > 1 ? SPAN / P : 1;
  int32_t R = (int32_t)below(in, (s->max_batch < 8 ? s->max_batch : 8) + 2);
  int32_t qo[10], lens[9], last[9], indptr[10], table[9 * 256], indices[9 * 256];
  int64_t rows_left = max_rows;
  qo[0] = rarely(in) ? (int32_t)below(in, 100) : 0;
  for (int32_t r = 0; r < R; r++) {
    int32_t rows = (int32_t)below(in, s->max_q_len + 2);
    if (rows > rows_left)
      rows = (int32_t)rows_left;
    rows_left -= rows;
    qo[r + 1] = qo[r] + rows;
  }
  corrupt(in, qo, (size_t)R + 1, (int32_t)s->max_q_len + 1);
  uint32_t layout = PICK(in, PMLA_KV_BLOCK_TABLE, PMLA_KV_CSR);
  int64_t width = 1 + below(in, (uint32_t)width_max);
  for (int32_t r = 0; r < R; r++) {
    lens[r] = (int32_t)below(in, (uint32_t)(width * P < SPAN ? width * P : SPAN) + 1);
    for (int64_t j = 0; j < width; j++)
      table[r * width + j] = (int32_t)below(in, (uint32_t)pages);
  }
  corrupt(in, lens, (size_t)R, (int32_t)(width * P + 1));
  corrupt(in, table, (size_t)(R * width), (int32_t)pages);
  indptr[0] = 0;
  for (int32_t r = 0; r < R; r++) {
    int32_t n = (int32_t)below(in, (uint32_t)width_max + 1);
    indptr[r + 1] = indptr[r] + n;
    last[r] = n ? 1 + (int32_t)below(in, (uint32_t)(P < SPAN ? P : SPAN)) : 0;
  }
  int32_t nnz = indptr[R];
  for (int32_t i = 0; i < nnz; i++)
    indices[i] = (int32_t)below(in, (uint32_t)pages);
  corrupt(in, indptr, (size_t)R + 1, nnz + 1);
  corrupt(in, indices, (size_t)nnz, (int32_t)pages);
  corrupt(in, last, (size_t)R, (int32_t)P + 1);

  const int64_t qo_dims[1] = {R + 1}, qo_lim[1] = {(int64_t)s->max_batch + 1};
  const int64_t r_dims[1] = {R}, r_lim[1] = {EXACT};
  const int64_t bt_dims[2] = {R, width}, bt_lim[2] = {EXACT, INT32_MAX / P};
  const int64_t nnz_dims[1] = {nnz}, nnz_lim[1] = {INT32_MAX};
  tensor_make(in, &step[0], kDLInt, 32, 1, qo_dims, qo_lim, qo, sizeof(int32_t) * (R + 1));
  if (layout == PMLA_KV_BLOCK_TABLE) {
    tensor_make(in, &step[1], kDLInt, 32, 2, bt_dims, bt_lim, table,
                sizeof(int32_t) * (size_t)(R * width));
    tensor_make(in, &step[2], kDLInt, 32, 1, r_dims, r_lim, lens, sizeof(int32_t) * R);
  } else {
    tensor_make(in, &step[3], kDLInt, 32, 1, qo_dims, r_lim, indptr, sizeof(int32_t) * (R + 1));
    tensor_make(in, &step[4], kDLInt, 32, 1, nnz_dims, nnz_lim, indices,
                sizeof(int32_t) * (size_t)nnz);
    tensor_make(in, &step[5], kDLInt, 32, 1, r_dims, r_lim, last, sizeof(int32_t) * R);
  }
  pmla_decode_batch batch = {sizeof batch, layout, &step[0].t, &step[1].t, &step[2].t,
                             &step[3].t, &step[4].t, &step[5].t, NULL};
  if (layout == PMLA_KV_BLOCK_TABLE) {
    batch.kv_indptr = batch.kv_indices = batch.kv_last_page_len = NULL;
  } else {
    batch.block_table = batch.kv_lens = NULL;
  }
  if (rarely(in)) { /* a tensor the layout needs left out */
    const DLTensor **slot[6] = {&batch.qo_indptr, &batch.block_table, &batch.kv_lens,
                                &batch.kv_indptr, &batch.kv_indices, &batch.kv_last_page_len};
    *slot[below(in, 6)] = NULL;
  }
  pmla_decode_batch *bp = abi_struct(in, &batch, sizeof batch,
                                     struct_size_of(in, sizeof batch));
  pmla_status st = s->be->build_decode(s->b, rarely(in) ? NULL : bp);
  check_status(s, st, s->b, "build_decode");
  free(bp);
  free_step(s->step); /* the previous step's tensors are no longer read */
  memcpy(s->step, step, sizeof step);
  s->step_built = st == PMLA_OK;
  s->step_tokens = qo[R];
  s->cache_pages = pages;
}

static void op_build_sparse(session *s) {
  input *in = s->in;
  ftensor step[6];
  memset(step, 0, sizeof step);
  int64_t pages, max_rows;
  step_limits(s, &pages, &max_rows);
  const uint32_t K = s->topk ? s->topk : 1;
  int64_t tokens_max = WORK_BUDGET / ((int64_t)K * s->heads);
  if (tokens_max < 1)
    tokens_max = 1;
  if (tokens_max > 16)
    tokens_max = 16;
  uint64_t capacity = (uint64_t)s->max_batch * s->max_q_len;
  if ((uint64_t)tokens_max > capacity)
    tokens_max = (int64_t)capacity;
  int64_t T = below(in, (uint32_t)tokens_max + 2); /* one more than fits: CAPACITY */
  size_t n = (size_t)T * K;
  int32_t *idx = malloc(n ? n * sizeof *idx : 1);
  REQUIRE(idx, "out of memory");
  const int64_t slots = pages * s->page;
  for (size_t i = 0; i < n; i++)
    idx[i] = u8(in) < 32 ? -1 : (int32_t)below(in, (uint32_t)slots);
  corrupt(in, idx, n, (int32_t)slots);
  const int64_t dims[2] = {T, K}, lim[2] = {(int64_t)capacity, EXACT};
  tensor_make(in, &step[0], kDLInt, 32, 2, dims, lim, idx, n * sizeof *idx);
  free(idx);
  static const int64_t seq_lens[] = {0, 1, 127, 128, 129, 4096, 1 << 20, INT64_MAX, -1};
  uint32_t flags = PICK(in, 0, PMLA_SPARSE_NO_SPLIT_CAP);
  int64_t max_seq_len = u8(in) < 224 ? seq_lens[u8(in) % 9] : (int64_t)u64(in);
  pmla_sparse_batch batch = {sizeof batch, flags, &step[0].t, max_seq_len, NULL};
  if (rarely(in))
    batch.topk_indices = NULL;
  pmla_sparse_batch *bp = abi_struct(in, &batch, sizeof batch,
                                     struct_size_of(in, sizeof batch));
  pmla_status st = s->be->build_sparse(s->b, rarely(in) ? NULL : bp);
  check_status(s, st, s->b, "build_sparse");
  free(bp);
  free_step(s->step);
  memcpy(s->step, step, sizeof step);
  s->step_built = st == PMLA_OK;
  s->step_tokens = T;
  s->cache_pages = pages;
}

/* Finite bf16 values for q and the KV cache. */
static void fill_values(ftensor *x) {
  static uint16_t pattern[576 * 16];
  if (!pattern[1])
    for (size_t i = 0; i < sizeof pattern / sizeof *pattern; i++)
      pattern[i] = (uint16_t)((0x3c00 + (i * 37) % 0x300) ^ (i & 1) << 15);
  if (!x->bytes)
    return;
  uint8_t *p = (uint8_t *)x->t.data + x->t.byte_offset;
  for (size_t at = 0; at < x->bytes; at += sizeof pattern)
    memcpy(p + at, pattern, x->bytes - at < sizeof pattern ? x->bytes - at : sizeof pattern);
}

static void op_decode(session *s) {
  input *in = s->in;
  const int64_t H = s->heads, P = s->page;
  /* the step's token count when it is small; else a count it must refuse */
  int known = s->step_tokens >= 0 && s->step_tokens <= MAX_TOKENS;
  int64_t T = known ? s->step_tokens : below(in, 4);
  int64_t pages = s->cache_pages > 0 ? s->cache_pages : 1 + below(in, 4);
  ftensor q, kv, out, lse;
  const int64_t q_dims[3] = {T, H, 576}, o_dims[3] = {T, H, 512}, l_dims[2] = {T, H};
  /* the cache of the builder's kv_dtype, now and then another's */
  uint32_t kvd = rarely(in) ? PICK(in, PMLA_DTYPE_BF16, PMLA_DTYPE_FP8_E4M3,
                                   PMLA_DTYPE_FP8_DS_MLA)
                            : s->kv_dtype;
  const int64_t W = kvd == PMLA_DTYPE_FP8_DS_MLA ? 656 : 576;
  const int64_t kv3[3] = {pages, P, W}, kv4[4] = {pages, P, 1, W};
  const int64_t tok_lim[3] = {known ? EXACT : UNBOUNDED, EXACT, EXACT};
  const int64_t kv_lim[4] = {UNBOUNDED, EXACT, EXACT, EXACT};
  tensor_make(in, &q, kDLBfloat, 16, 3, q_dims, tok_lim, NULL, 0);
  int four = u8(in) & 1;
  if (kvd == PMLA_DTYPE_BF16)
    tensor_make(in, &kv, kDLBfloat, 16, four ? 4 : 3, four ? kv4 : kv3, kv_lim, NULL, 0);
  else /* bytes; an e4m3 cache may also come as float8_e4m3fn (DLPack code 10) */
    tensor_make(in, &kv, kvd == PMLA_DTYPE_FP8_E4M3 && (u8(in) & 1) ? 10 : kDLUInt, 8,
                four ? 4 : 3, four ? kv4 : kv3, kv_lim, NULL, 0);
  /* kv_scale: absent, fp32 [1] of any value, or malformed */
  static const float kv_scales[] = {1.0f, 0.5f, 0.0f, -1.0f, INFINITY, NAN};
  float scale_value[2] = {kv_scales[below(in, 6)], 1.0f};
  ftensor scale;
  const int64_t one[1] = {1}, scale_lim[1] = {EXACT};
  const uint32_t scale_kind = PICK(in, 0, 1, 1, 2);
  tensor_make(in, &scale, kDLFloat, scale_kind == 2 ? 64 : 32, 1,
              one, scale_lim, scale_value, sizeof scale_value);
  tensor_make(in, &out, kDLBfloat, 16, 3, o_dims, tok_lim, NULL, 0);
  tensor_make(in, &lse, kDLFloat, 32, 2, l_dims, tok_lim, NULL, 0);
  fill_values(&q);
  fill_values(&kv);
  tensor_poison(&out);
  tensor_poison(&lse);
  uint32_t reserved = u8(in) < 224 ? 0 : u32(in);
  int no_lse = u8(in) & 1;
  pmla_decode_args args = {sizeof args, reserved, &q.t, &kv.t, &out.t, no_lse ? NULL : &lse.t,
                           NULL, scale_kind ? &scale.t : NULL};
  if (rarely(in)) {
    if (u8(in) & 1)
      args.q = NULL;
    else
      args.kv_cache = NULL;
  }
  if (rarely(in))
    args.out = NULL;
  if (rarely(in))
    args.stream = (void *)(uintptr_t)u64(in); /* pmla-cpu never looks at it */
  pmla_decode_args *ap = abi_struct(in, &args, sizeof args, struct_size_of(in, sizeof args));
  pmla_status st = s->be->decode(s->b, rarely(in) ? NULL : ap);
  check_status(s, st, s->b, "decode");
  if (s->is_pmla) {
    REQUIRE(st != PMLA_OK || s->step_built, "decode succeeded with no step built");
    REQUIRE(st == PMLA_OK || (tensor_untouched(&out) && tensor_untouched(&lse)),
            "a failed decode (%s) wrote its out or lse tensor", status_text(st));
  }
  free(ap);
  tensor_free(&q);
  tensor_free(&kv);
  tensor_free(&out);
  tensor_free(&lse);
  tensor_free(&scale);
}

static void op_query(session *s) {
  input *in = s->in;
  pmla_builder_info full;
  memset(&full, 0x5a, sizeof full);
  pmla_builder_info *info = abi_struct(in, &full, sizeof full, struct_size_of(in, sizeof full));
  size_t n = info->struct_size < sizeof full ? (info->struct_size < 4 ? 4 : info->struct_size)
                                              : sizeof full;
  pmla_status st = s->be->query_builder(s->b, rarely(in) ? NULL : info);
  check_status(s, st, s->b, "query_builder");
  if (s->is_pmla && st != PMLA_OK) {
    REQUIRE(memcmp((uint8_t *)info + 4, (uint8_t *)&full + 4, n - 4) == 0,
            "a failed query_builder (%s) wrote info", status_text(st));
  } else if (s->is_pmla) {
    uint64_t sum = 0;
    for (int i = 0; i < PMLA_BUF_COUNT; i++)
      sum += info->buffer_bytes[i];
    REQUIRE(sum <= info->total_bytes && info->struct_size <= sizeof full,
            "query_builder: buffer sizes add up to %llu > total_bytes %llu",
            (unsigned long long)sum, (unsigned long long)info->total_bytes);
  }
  free(info);
}

static void op_copy(session *s) {
  input *in = s->in;
  uint32_t which = PICK(in, 0, 1, 2, 3, 4, 5, 6, 7, PMLA_BUF_COUNT);
  uint64_t want = which < PMLA_BUF_COUNT ? s->info.buffer_bytes[which] : 0;
  uint64_t bytes = want;
  if (rarely(in)) {
    bytes = PICK(in, 0, 1, 4);
    bytes += u8(in) & 1 ? want : 0;
  }
  if (bytes == want && want > STORAGE_CAP)
    return; /* a host would need that much memory */
  size_t n = bytes == want && want ? (size_t)want : 16;
  uint8_t *dst = malloc(n);
  REQUIRE(dst, "out of memory");
  memset(dst, 0xa5, n);
  pmla_status st = s->be->copy_buffer(s->b, (pmla_buffer)which, rarely(in) ? NULL : dst, bytes);
  check_status(s, st, s->b, "copy_buffer");
  if (s->is_pmla && st != PMLA_OK)
    for (size_t i = 0; i < n; i++)
      REQUIRE(dst[i] == 0xa5, "a failed copy_buffer (%s) wrote host_dst", status_text(st));
  free(dst);
}

static void op_check_device_error(session *s) {
  uint32_t flags = 0xdeadbeef;
  pmla_status st = s->be->check_device_error(s->b, u8(s->in) & 1 ? NULL : &flags);
  check_status(s, st, s->b, "check_device_error");
  /* pmla-cpu checks every index on the host, with a message, before any
   * kernel runs: its device error word stays 0 */
  REQUIRE(!s->is_pmla || st == PMLA_OK || !s->b, "check_device_error on pmla-cpu: %s: %s",
          status_text(st), s->be->last_error(s->b));
}

/* Calls a host should never make, which must still fail cleanly. */
static void op_without_builder(session *s) {
  pmla_builder_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  uint8_t dst[16];
  uint32_t flags;
  pmla_status st;
  switch (u8(s->in) % 6) {
  case 0: st = s->be->build_decode(NULL, NULL); break;
  case 1: st = s->be->build_sparse(NULL, NULL); break;
  case 2: st = s->be->decode(NULL, NULL); break;
  case 3: st = s->be->query_builder(NULL, &info); break;
  case 4: st = s->be->copy_buffer(NULL, PMLA_BUF_WORK_META_DATA, dst, sizeof dst); break;
  default: st = s->be->check_device_error(NULL, &flags);
  }
  REQUIRE(st != PMLA_OK, "a call without a builder on %s succeeded", s->be->name);
  /* pmla.h promises last_error(NULL) only for init_builder; pmla-cpu also
   * explains these there */
  if (s->is_pmla)
    check_status(s, st, NULL, "a call without a builder");
  s->be->destroy_builder(NULL);
}

static void drive_backend(input *in, const pmla_backend *be) {
  session s;
  memset(&s, 0, sizeof s);
  s.in = in;
  s.be = be;
  s.is_pmla = be == g.cpu;
  pmla_builder_config c;
  memset(&c, 0, sizeof c);
  c.struct_size = struct_size_of(in, sizeof c);
  c.num_heads = PICK(in, 16, 32, 64, 128, 1, 3, 0, 129);
  c.kv_lora_rank = PICK(in, 512, 512, 512, 256);
  c.rope_dim = PICK(in, 64, 64, 64, 128);
  c.q_dtype = PICK(in, PMLA_DTYPE_BF16, PMLA_DTYPE_BF16, PMLA_DTYPE_FP8_E4M3, 0);
  c.kv_dtype = PICK(in, PMLA_DTYPE_BF16, PMLA_DTYPE_BF16, PMLA_DTYPE_FP8_E4M3,
                    PMLA_DTYPE_FP8_DS_MLA, 0, 4);
  c.out_dtype = PICK(in, PMLA_DTYPE_BF16, PMLA_DTYPE_BF16, PMLA_DTYPE_FP8_E4M3, 0);
  c.page_size = PICK(in, 16, 1, 2, 64, 256, 3, 512, 0);
  c.max_batch = PICK(in, 1, 2, 3, 8, 65536, 65537, 0);
  c.max_q_len = PICK(in, 1, 2, 4, 8, 9, 0);
  c.topk = PICK(in, 0, 1, 16, 64, 256, 65536, 65537);
  static const float scales[] = {0.0416667f, 1.0f, 1e-30f, 0.0f, -1.0f, INFINITY, NAN};
  uint32_t scale_pick = u8(in);
  if (scale_pick < 224) {
    c.softmax_scale = scales[scale_pick % 7];
  } else {
    uint32_t bits = u32(in);
    memcpy(&c.softmax_scale, &bits, 4);
  }
  c.device = (int32_t)PICK(in, 0, 0, 0, 1, (uint32_t)-1);
  c.cu_count = PICK(in, 1, 2, 3, 4, 0, 1025);
  c.flags = PICK(in, 0, 0, PMLA_BUILDER_BATCH_INVARIANT, 2, 0x80000001u);
  c.invariant_chunk = PICK(in, 0, 0, 0, 64, 1024, 100, 1u << 20, (1u << 20) + 64);
  /* valid values that would make a run slow are brought down */
  if (c.cu_count > MAX_UNITS && c.cu_count <= 1024)
    c.cu_count = 1 + c.cu_count % MAX_UNITS;
  if (c.cu_count == 0 && g.online_cpus > MAX_UNITS)
    c.cu_count = MAX_UNITS;
  if (c.topk > 128 && c.topk <= 65536)
    c.topk = 1 + c.topk % 128;

  pmla_builder_config *cp = abi_struct(in, &c, sizeof c, c.struct_size);
  pmla_builder *const untouched = (pmla_builder *)&s;
  pmla_builder *b = untouched;
  int no_config = rarely(in), no_out = u8(in) == 255;
  pmla_status st = be->init_builder(no_config ? NULL : cp, no_out ? NULL : &b);
  free(cp);
  check_status(&s, st, NULL, "init_builder");
  if (st != PMLA_OK) {
    REQUIRE(b == untouched, "a failed init_builder (%s) wrote *out", status_text(st));
    b = NULL;
  } else {
    REQUIRE(b && b != untouched, "init_builder succeeded without a builder");
  }
  s.b = b;
  int ok = st == PMLA_OK;
  s.heads = ok ? c.num_heads : 16;
  s.page = ok ? c.page_size : 16;
  s.max_batch = ok ? c.max_batch : 4;
  s.max_q_len = ok ? c.max_q_len : 2;
  s.topk = ok ? c.topk : 16;
  s.kv_dtype = ok ? c.kv_dtype : PMLA_DTYPE_BF16;
  if (ok) {
    s.info.struct_size = sizeof s.info;
    pmla_status q = be->query_builder(b, &s.info);
    check_status(&s, q, b, "query_builder");
  }
  s.step_tokens = -1;
  uint32_t ops = 1 + below(in, MAX_OPS);
  for (uint32_t i = 0; i < ops && in->n; i++) {
    switch (u8(in) % 9) {
    case 0:
    case 1: op_build_decode(&s); break;
    case 2: op_build_sparse(&s); break;
    case 3:
    case 4: op_decode(&s); break;
    case 5: op_query(&s); break;
    case 6: op_copy(&s); break;
    case 7: op_check_device_error(&s); break;
    default: op_without_builder(&s);
    }
    if (!b && i >= 2)
      break; /* without a builder every call is a quick refusal */
  }
  be->destroy_builder(b);
  free_step(s.step);
}

/* ---- negotiation ---- */
/* The plugin's entry point is held to pmla.h; the mock plugins' entry
 * points (some misbehave on purpose) only feed pmla_negotiate. */
static void negotiate(input *in) {
  if (!g.num_entries)
    return;
  uint32_t which = below(in, (uint32_t)g.num_entries);
  pmla_entry_fn entry = g.entries[which];
  const int ours = which == 0;
  static const uint32_t versions[] = {PMLA_VERSION(1, 0), PMLA_VERSION(1, 1), PMLA_VERSION(1, 2),
                                      PMLA_VERSION(1, 0xffff), PMLA_VERSION(2, 0),
                                      PMLA_VERSION(0, 9), 0, UINT32_MAX};
  uint32_t lo = u8(in) < 224 ? versions[u8(in) % 8] : u32(in);
  uint32_t hi = u8(in) < 224 ? versions[u8(in) % 8] : u32(in);
  const size_t prefix =
      offsetof(pmla_negotiation, message) + sizeof(((pmla_negotiation *)0)->message);
  pmla_status st;
  /* the entry point itself, as a host with its own loader calls it */
  pmla_negotiation full;
  memset(&full, 0, sizeof full);
  full.host_min_version = lo;
  full.host_max_version = hi;
  uint32_t size = PICK(in, sizeof full, sizeof full + 16, (uint32_t)prefix - 1, 16, 4, 0);
  pmla_negotiation *n = abi_struct(in, &full, sizeof full, size);
  if (ours) {
    st = entry(n);
    if (g.trace)
      fprintf(stderr, "  negotiation %#x..%#x, struct_size %u: %s\n", lo, hi, size,
              status_text(st));
    if (st == PMLA_OK) {
      REQUIRE(n->plugin && n->agreed_version >= lo && n->agreed_version <= hi,
              "negotiation of %#x..%#x agreed on %#x", lo, hi, n->agreed_version);
      REQUIRE(n->plugin->struct_size >= sizeof(pmla_plugin) && n->plugin->name,
              "the plugin's descriptor is incomplete");
    } else if (st == PMLA_ERR_VERSION) {
      REQUIRE(size >= prefix && memchr(n->message, 0, sizeof n->message) && n->message[0],
              "PMLA_ERR_VERSION without a message for %#x..%#x", lo, hi);
    } else {
      REQUIRE(st == PMLA_ERR_STRUCT_SIZE && size < prefix,
              "negotiation answered %s to struct_size %u", status_text(st), size);
    }
  }
  free(n);
  /* the registry's negotiation, with any message buffer */
  size_t msg_size = PICK(in, 256, 0, 1, 8);
  if (msg_size > 256)
    msg_size = 256;
  char *msg = msg_size ? malloc(msg_size) : NULL;
  const pmla_plugin *const unset = (const pmla_plugin *)&full, *plugin = unset;
  uint32_t agreed = 0xdeadbeef;
  st = pmla_negotiate(entry, lo, hi, &plugin, &agreed, msg, msg_size);
  if (g.trace)
    fprintf(stderr, "  pmla_negotiate(%s) %#x..%#x: %s\n", g.files[g.entry_file[which]], lo, hi,
            status_text(st));
  if (st == PMLA_OK)
    REQUIRE(plugin && agreed >= lo && agreed <= hi, "pmla_negotiate agreed on %#x", agreed);
  else
    REQUIRE(plugin == unset && agreed == 0xdeadbeef &&
                (!msg_size || (memchr(msg, 0, msg_size) && (!ours || msg_size == 1 || msg[0]))),
            "pmla_negotiate returned %s and wrote its outputs or no terminated message",
            status_text(st));
  free(msg);
}

/* ---- the registry ---- */
static const pmla_backend *registry_round(input *in, pmla_registry **out) {
  char path[8192] = "";
  size_t used = 0;
  uint32_t parts = below(in, 5);
  for (uint32_t i = 0; i < parts; i++) {
    char part[4096 + 64];
    switch (u8(in) % 8) {
    case 0: snprintf(part, sizeof part, "%s", g.plugin); break;
    case 1: snprintf(part, sizeof part, "%s", g.mock_dir); break;
    case 2: snprintf(part, sizeof part, "%s", g.plugin_dir); break;
    case 3: snprintf(part, sizeof part, "/nonexistent/pmla-%u.so", u8(in)); break;
    case 4: part[0] = '\0'; break; /* an empty entry */
    default: snprintf(part, sizeof part, "%s", g.files[below(in, (uint32_t)g.num_files)]);
    }
    int n = snprintf(path + used, sizeof path - used, "%s%s", i ? ":" : "", part);
    if (n < 0 || (size_t)n >= sizeof path - used)
      break;
    used += (size_t)n;
  }
  pmla_registry *r = NULL;
  pmla_status st = pmla_registry_open(parts ? path : NULL, &r);
  REQUIRE(st == PMLA_OK && r, "pmla_registry_open(\"%s\") returned %s", path, status_text(st));
  size_t count = pmla_registry_count(r);
  if (g.trace)
    fprintf(stderr, "  registry \"%s\": %zu backends\n", parts ? path : "", count);
  for (size_t i = 0; i <= count; i++) {
    const pmla_backend *be = pmla_registry_backend(r, i);
    const char *file = pmla_registry_backend_path(r, i);
    uint32_t version = pmla_registry_backend_version(r, i);
    if (i == count) {
      REQUIRE(!be && !file && !version, "registry backend %zu of %zu answered", i, count);
      break;
    }
    REQUIRE(be && be->name && file && be->struct_size >= sizeof(pmla_backend),
            "registry backend %zu is incomplete", i);
    REQUIRE(version >= PMLA_VERSION(PMLA_ABI_MAJOR, 0) && version <= PMLA_ABI_VERSION,
            "registry backend %s agreed on %#x", be->name, version);
    REQUIRE(pmla_registry_find(r, be->name) == be, "find(\"%s\") is not backend %zu", be->name,
            i);
  }
  const char *diagnostics = pmla_registry_diagnostics(r), *searched = pmla_registry_search_path(r);
  REQUIRE(diagnostics && searched, "the registry's diagnostics or search path is NULL");
  if (g.trace)
    fprintf(stderr, "  searched \"%s\" (%zu bytes of diagnostics)\n", searched,
            strlen(diagnostics));
  REQUIRE(!pmla_registry_find(r, NULL) && !pmla_registry_find(NULL, "pmla-cpu") &&
              !pmla_registry_count(NULL) && !pmla_registry_backend(NULL, 0),
          "the registry answered for a NULL argument");
  static const char *const names[] = {"pmla-cpu", "pmla",         "mock-dup",
                                      "mock-old-minor", "mock-new-minor", "mock-short",
                                      "mock-wrong-major", ""};
  char raw[16];
  for (size_t i = 0; i < sizeof raw - 1; i++)
    raw[i] = (char)(1 + u8(in) % 255);
  raw[sizeof raw - 1] = '\0';
  const char *name = u8(in) < 224 ? names[u8(in) % 8] : raw;
  const pmla_backend *found = pmla_registry_find(r, name);
  REQUIRE(!found || strcmp(found->name, name) == 0, "find(\"%s\") answered %s", name,
          found->name);
  *out = r;
  return found;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  input in = {data, size};
  negotiate(&in);
  pmla_registry *r = NULL;
  const pmla_backend *found = registry_round(&in, &r);
  /* mostly the plugin's pmla-cpu; else whichever backend the path gave */
  uint8_t which = u8(&in);
  const pmla_backend *be = g.cpu;
  if (which >= 224 && found)
    be = found;
  else if (which >= 192 && g.gpu)
    be = g.gpu;
  drive_backend(&in, be);
  pmla_registry_close(r);
  return 0;
}
