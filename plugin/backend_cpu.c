/* SPDX-License-Identifier: MIT */
/* backend_cpu.c - `pmla-cpu`: the persistent schedule walked by worker
 * threads, one per scheduling unit. All data is host memory (kDLCPU), so
 * every device-side check of the GPU backend is done here up front, with a
 * message, before anything is written. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT_S: the CPUs the caller may run on */
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends.h"
#include "builder.h"
#include "host_memory.h"
#include "mla_cpu.h"
#include "plan_invariant.h"
#include "planner.h"
#include "workers.h"

typedef struct cpu_state {
  pmla_workers *workers;
  float *scratch;        /* one slice per worker */
  size_t scratch_floats; /* per worker */
  int32_t *errors;       /* per worker, device-error bits */
  /* a dense step's qo_indptr, kv_lens or kv_indptr, and kv_last_page_len,
   * copied at build (3 x (max_batch + 1)): what was validated and planned is
   * what every decode of the step reads, whatever the host's tensors hold
   * later */
  int32_t *indptr_copy;
  pmla_cpu_problem pb;   /* the decode in flight */
} cpu_state;

static void *alloc_zero(uint64_t bytes) {
  size_t size = (size_t)((bytes + 63) / 64 * 64);
  void *p = aligned_alloc(64, size ? size : 64);
  if (p)
    memset(p, 0, size ? size : 64);
  return p;
}

/* The CPUs the calling thread may run on (its affinity mask, as a
 * container's cpuset or taskset leaves it, which the workers inherit),
 * clamped to 1..1024; the online CPUs where the mask cannot be read. One
 * worker a CPU: more would only take turns. */
static uint32_t usable_cpus(void) {
  long n = 0;
  for (int cpus = 1024; cpus <= 262144 && n == 0; cpus *= 8) {
    cpu_set_t *set = CPU_ALLOC(cpus);
    if (!set)
      break;
    const size_t size = CPU_ALLOC_SIZE(cpus);
    CPU_ZERO_S(size, set);
    const int got = sched_getaffinity(0, size, set) == 0;
    const int again = !got && errno == EINVAL; /* the kernel's mask is larger */
    if (got)
      n = CPU_COUNT_S(size, set);
    CPU_FREE(set);
    if (!got && !again)
      break;
  }
  if (n < 1)
    n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : n > 1024 ? 1024 : (uint32_t)n;
}

/* frees a builder of this backend, whole or partly made */
static void cpu_free(pmla_builder *b) {
  cpu_state *s = b->impl;
  if (s) {
    pmla_workers_stop(s->workers);
    free(s->scratch);
    free(s->errors);
    free(s->indptr_copy);
    free(s);
  }
  for (int i = 0; i < PMLA_BUF_COUNT; i++)
    free(b->buf[i]);
  free(b);
}

static void cpu_destroy(pmla_builder *b) {
  if (b && pmla_builder_forget(b, &pmla_cpu_backend))
    cpu_free(b);
}

static pmla_status cpu_init(const pmla_builder_config *config, pmla_builder **out) {
  pmla_builder_config cfg;
  pmla_status st;
  if ((st = pmla_validate_init(config, out, &cfg)))
    return st;
  if (cfg.device != 0)
    return pmla_fail(NULL, PMLA_ERR_INVALID_ARGUMENT,
                     "init_builder: config.device = %d; accepted for pmla-cpu: 0", cfg.device);
  const uint32_t cus = cfg.cu_count ? cfg.cu_count : usable_cpus();
  pmla_builder *b = calloc(1, sizeof *b);
  if (!b)
    return pmla_fail(NULL, PMLA_ERR_OUT_OF_MEMORY, "init_builder: out of host memory");
  b->backend = &pmla_cpu_backend;
  b->cfg = cfg;
  pmla_size_buffers(b, cus, cus);
  const size_t scratch_floats =
      (pmla_cpu_scratch_floats((int32_t)cfg.num_heads, (int32_t)cfg.max_q_len) + 15) / 16 * 16;
  b->info.total_bytes += (uint64_t)scratch_floats * cus * 4;
  const size_t indptr_words = 3 * ((size_t)cfg.max_batch + 1);
  b->info.total_bytes += indptr_words * 4;
  int by_cgroup = 0;
  const uint64_t avail = pmla_host_available_bytes(&by_cgroup), need = b->info.total_bytes;
  if (need > avail) {
    /* the message reads the builder: made before it is freed */
    st = pmla_fail(
        NULL, PMLA_ERR_OUT_OF_MEMORY,
        "init_builder: pmla-cpu needs %.2f GiB of host memory for %u workers (%u partial slots "
        "of %u heads x %u query tokens, and each worker's scratch), %.2f GiB is available "
        "(%s); accepted: a smaller cu_count, max_q_len or num_heads%s",
        need / 1073741824.0, cus, b->info.max_partial_slots, cfg.num_heads, cfg.max_q_len,
        avail / 1073741824.0,
        by_cgroup ? "below this process's cgroup memory limit" : "MemAvailable + SwapFree",
        pmla_batch_invariant(b) ? ", or no PMLA_BUILDER_BATCH_INVARIANT" : "");
    cpu_free(b);
    return st;
  }
  cpu_state *s = calloc(1, sizeof *s);
  b->impl = s;
  int ok = s != NULL;
  for (int i = 0; ok && i < PMLA_BUF_COUNT; i++)
    ok = (b->buf[i] = alloc_zero(b->info.buffer_bytes[i])) != NULL;
  if (ok) {
    s->scratch_floats = scratch_floats;
    ok = (s->scratch = alloc_zero((uint64_t)s->scratch_floats * cus * 4)) != NULL &&
         (s->errors = calloc(cus, sizeof *s->errors)) != NULL &&
         (s->indptr_copy = calloc(indptr_words, sizeof *s->indptr_copy)) != NULL;
  }
  if (!ok) {
    cpu_free(b);
    return pmla_fail(NULL, PMLA_ERR_OUT_OF_MEMORY,
                     "init_builder: out of host memory for %u workers' buffers", cus);
  }
  if (!(s->workers = pmla_workers_start(cus))) {
    cpu_free(b);
    return pmla_fail(NULL, PMLA_ERR_OUT_OF_MEMORY, "init_builder: cannot start %u threads", cus);
  }
  if (!pmla_builder_adopt(b)) {
    cpu_free(b);
    return pmla_fail(NULL, PMLA_ERR_OUT_OF_MEMORY, "init_builder: out of host memory");
  }
  *out = b;
  return PMLA_OK;
}

/* Host-side twin of the planner's device checks, with messages. */
static pmla_status validate_dense_step(pmla_builder *b) {
  const pmla_step *s = &b->step;
  const int32_t R = s->num_requests, P = (int32_t)b->cfg.page_size;
  if (R == 0 && s->qo_indptr[0] < 0) /* a batch of requests: checked in the loop below */
    return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                     "build_decode: qo_indptr[0] = %d; accepted: >= 0", s->qo_indptr[0]);
  for (int32_t r = 0; r < R; r++) {
    /* int64: the difference of two int32 entries need not fit int32 */
    const int64_t q0 = s->qo_indptr[r], q1 = s->qo_indptr[r + 1];
    if (q0 < 0 || q1 < q0 || q1 - q0 > b->cfg.max_q_len)
      return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                       "build_decode: qo_indptr[%d..%d] = %lld, %lld gives %lld query rows; "
                       "accepted: non-decreasing from >= 0, 0..%u rows (config.max_q_len)",
                       r, r + 1, (long long)q0, (long long)q1, (long long)(q1 - q0),
                       b->cfg.max_q_len);
    if (s->kv_layout == PMLA_KV_BLOCK_TABLE) {
      const int32_t cap = pmla_max_kv_len(b);
      if (s->kv_lens[r] < 0 || s->kv_lens[r] > cap)
        return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                         "build_decode: kv_lens[%d] = %d; accepted: 0..%d (block_table width "
                         "%d pages of %d tokens, at most PMLA_MAX_KV_LEN = %u)",
                         r, s->kv_lens[r], cap, s->block_table_stride, P, PMLA_MAX_KV_LEN);
    } else {
      const int64_t p0 = s->kv_indptr[r], p1 = s->kv_indptr[r + 1];
      if (p0 < 0 || p1 < p0 || p1 > s->num_page_indices)
        return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                         "build_decode: kv_indptr[%d..%d] = %lld, %lld; accepted: non-decreasing "
                         "within 0..%lld (kv_indices length)",
                         r, r + 1, (long long)p0, (long long)p1, (long long)s->num_page_indices);
      int32_t last = s->kv_last_page_len[r];
      if (p1 > p0 && (last < 1 || last > P))
        return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                         "build_decode: kv_last_page_len[%d] = %d; accepted: 1..%d (page_size) "
                         "for a request with pages",
                         r, last, P);
      /* a request without pages has length 0 whatever its last_page_len */
      const int64_t len = p1 > p0 ? (p1 - p0 - 1) * P + last : 0;
      if (len > PMLA_MAX_KV_LEN)
        return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                         "build_decode: request %d has %lld pages (%lld tokens); accepted: at "
                         "most PMLA_MAX_KV_LEN = %u tokens",
                         r, (long long)(p1 - p0), (long long)len, PMLA_MAX_KV_LEN);
    }
  }
  return PMLA_OK;
}

/* The step's per-request arrays into the builder's copy, which the step
 * then reads instead of the host's tensors. */
static void copy_indptrs(pmla_builder *b) {
  pmla_step *s = &b->step;
  cpu_state *cs = b->impl;
  const size_t R = (size_t)s->num_requests, n = (size_t)b->cfg.max_batch + 1;
  int32_t *qo = cs->indptr_copy, *kv = qo + n, *last = kv + n;
  memcpy(qo, s->qo_indptr, (R + 1) * sizeof *qo);
  s->qo_indptr = qo;
  /* (an empty tensor's data may be NULL: copied only when it has entries) */
  if (s->kv_layout == PMLA_KV_BLOCK_TABLE && R) {
    memcpy(kv, s->kv_lens, R * sizeof *kv);
    s->kv_lens = kv;
  }
  if (s->kv_layout == PMLA_KV_CSR) {
    memcpy(kv, s->kv_indptr, (R + 1) * sizeof *kv);
    s->kv_indptr = kv;
    if (R)
      memcpy(last, s->kv_last_page_len, R * sizeof *last);
    s->kv_last_page_len = last;
  }
}

/* Plans on the host; a dense step's host data is validated first. */
static pmla_status cpu_plan(pmla_builder *b, int32_t cap, void *stream, const char *what) {
  pmla_step *s = &b->step;
  pmla_status st;
  (void)stream;
  if (s->topk_stride == 0) {
    copy_indptrs(b);
    if ((st = validate_dense_step(b)))
      return st;
    const int64_t T = s->qo_indptr[s->num_requests],
                  room = (int64_t)b->cfg.max_batch * b->cfg.max_q_len;
    if (T > room) /* rows before qo_indptr[0] count: q holds them */
      return pmla_fail(b, PMLA_ERR_CAPACITY,
                       "build_decode: qo_indptr[%d] = %lld query tokens; accepted: <= "
                       "max_batch * max_q_len = %lld",
                       s->num_requests, (long long)T, (long long)room);
    s->num_tokens = (int32_t)T;
  }
  pmla_plan_input in;
  pmla_plan_output o;
  pmla_step_plan_input(b, cap, &in);
  pmla_plan_buffers(b, &o);
  if (pmla_plan_step(&in, &o))
    return pmla_fail(b, PMLA_ERR_INTERNAL, "%s: the planner rejected a validated batch", what);
  return PMLA_OK;
}

static pmla_status cpu_build_decode(pmla_builder *b, const pmla_decode_batch *batch) {
  return pmla_build_dense(b, batch, &pmla_cpu_backend, kDLCPU, cpu_plan);
}

static pmla_status cpu_build_sparse(pmla_builder *b, const pmla_sparse_batch *batch) {
  return pmla_build_sparse(b, batch, &pmla_cpu_backend, kDLCPU, cpu_plan);
}

/* The page and slot indices the step will read, checked against the cache. */
static pmla_status validate_indices(pmla_builder *b, int64_t num_slots) {
  pmla_step *s = &b->step;
  if (s->checked_slots == num_slots) /* every layer of a step shares one check */
    return PMLA_OK;
  const int64_t P = b->cfg.page_size, pages = num_slots / P;
  if (s->kind == PLAN_SPARSE) {
    for (int64_t i = 0; i < (int64_t)s->num_requests * s->topk_stride; i++)
      if (s->topk[i] < -1 || s->topk[i] >= num_slots) {
        char range[64] = "only -1 (the KV cache has no slots)";
        if (num_slots > 0)
          snprintf(range, sizeof range, "-1 or 0..%lld (KV cache slots)",
                   (long long)num_slots - 1);
        return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                         "decode: topk_indices[%lld][%lld] = %d; accepted: %s",
                         (long long)(i / s->topk_stride), (long long)(i % s->topk_stride),
                         s->topk[i], range);
      }
    s->checked_slots = num_slots;
    return PMLA_OK;
  }
  for (int32_t r = 0; r < s->num_requests; r++) {
    /* pages of request r: base[first + j]; indexed, never a pointer formed
     * into an empty tensor (whose data may be NULL) */
    const int bt = s->kv_layout == PMLA_KV_BLOCK_TABLE;
    const int32_t *base = bt ? s->block_table : s->kv_indices;
    const int64_t first = bt ? (int64_t)r * s->block_table_stride : s->kv_indptr[r];
    const int32_t used =
        bt ? (int32_t)((s->kv_lens[r] + P - 1) / P) : s->kv_indptr[r + 1] - s->kv_indptr[r];
    for (int32_t j = 0; j < used; j++) {
      const int32_t page = base[first + j];
      if (page < 0 || page >= pages) {
        char range[64] = "none (the KV cache has no whole page)";
        if (pages > 0)
          snprintf(range, sizeof range, "0..%lld (KV cache pages)", (long long)pages - 1);
        return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                         "decode: page %d of request %d is %d (%s); accepted: %s", j, r, page,
                         bt ? "block_table" : "kv_indices", range);
      }
    }
  }
  s->checked_slots = num_slots;
  return PMLA_OK;
}

static void run_unit(void *arg, uint32_t unit) {
  pmla_builder *b = arg;
  cpu_state *s = b->impl;
  const int32_t *indptr = b->buf[PMLA_BUF_WORK_INDPTR];
  s->errors[unit] = pmla_cpu_run_items(&s->pb, b->buf[PMLA_BUF_WORK_INFO_SET], indptr[unit],
                                       indptr[unit + 1],
                                       s->scratch + (size_t)unit * s->scratch_floats);
}

static void reduce_unit(void *arg, uint32_t unit) {
  pmla_builder *b = arg;
  cpu_state *s = b->impl;
  const int32_t *meta = b->buf[PMLA_BUF_WORK_META_DATA];
  pmla_cpu_reduce(&s->pb, b->buf[PMLA_BUF_REDUCE_INDPTR], b->buf[PMLA_BUF_REDUCE_FINAL_MAP],
                  b->buf[PMLA_BUF_REDUCE_PARTIAL_MAP], (int32_t)unit, (int32_t)b->info.cu_count,
                  meta[PMLA_META_NUM_REDUCE]);
}

static pmla_status decode_taken(pmla_builder *b, const pmla_decode_args *args) {
  pmla_decode_args a;
  int64_t num_slots;
  pmla_status st;
  pmla_clear_error(b);
  if ((st = pmla_check_decode_args(b, args, kDLCPU, &a, &num_slots)) ||
      (st = pmla_check_no_overlap(b, &a)) ||
      (st = validate_indices(b, num_slots)))
    return st;
  cpu_state *s = b->impl;
  const pmla_step *step = &b->step;
  pmla_cpu_problem *pb = &s->pb;
  memset(pb, 0, sizeof *pb);
  pb->num_heads = (int32_t)b->cfg.num_heads;
  pb->max_q_len = (int32_t)b->cfg.max_q_len;
  pb->softmax_scale = b->cfg.softmax_scale;
  pb->q = pmla_tensor_data(a.q);
  pb->num_tokens = a.q->shape[0];
  pb->kv = pmla_tensor_data(a.kv_cache);
  pb->kv_format = pmla_kv_format_of(b->cfg.kv_dtype);
  pb->kv_scale = 1.f;
  if (a.kv_scale) {
    float sc;
    memcpy(&sc, pmla_tensor_data(a.kv_scale), sizeof sc);
    if (!(sc > 0.f) || !isfinite(sc))
      return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                       "decode: args->kv_scale holds %g; accepted: a finite value > 0", (double)sc);
    pb->kv_scale = sc;
  }
  pmla_step_kv_map(b, num_slots, &pb->map);
  pb->qo_indptr = step->kind == PLAN_DENSE ? step->qo_indptr : NULL;
  pb->out = pmla_tensor_data(a.out);
  pb->lse = a.lse ? pmla_tensor_data(a.lse) : NULL;
  pb->partial_out = b->buf[PMLA_BUF_PARTIAL_OUT];
  pb->partial_lse = b->buf[PMLA_BUF_PARTIAL_LSE];
  pb->fold = pmla_batch_invariant(b);
  pmla_workers_run(s->workers, run_unit, b);
  pmla_workers_run(s->workers, reduce_unit, b);
  int32_t *meta = b->buf[PMLA_BUF_WORK_META_DATA];
  for (uint32_t i = 0; i < b->info.cu_count; i++)
    meta[PMLA_META_ERROR] |= s->errors[i];
  return PMLA_OK;
}

static pmla_status cpu_decode(pmla_builder *b, const pmla_decode_args *args) {
  pmla_status st = pmla_builder_enter(b, &pmla_cpu_backend, "decode");
  return st ? st : pmla_builder_leave(b, decode_taken(b, args));
}

static pmla_status cpu_query(const pmla_builder *b, pmla_builder_info *info) {
  pmla_status st = pmla_builder_enter(b, &pmla_cpu_backend, "query_builder");
  return st ? st : pmla_builder_leave(b, pmla_query_builder(b, info));
}

static pmla_status device_error_taken(pmla_builder *b, uint32_t *flags) {
  int32_t *meta = b->buf[PMLA_BUF_WORK_META_DATA];
  uint32_t bits = (uint32_t)meta[PMLA_META_ERROR];
  meta[PMLA_META_ERROR] = 0;
  return pmla_device_error_status(b, bits, flags);
}

static pmla_status cpu_check_device_error(pmla_builder *b, uint32_t *flags) {
  pmla_status st = pmla_builder_enter(b, &pmla_cpu_backend, "check_device_error");
  return st ? st : pmla_builder_leave(b, device_error_taken(b, flags));
}

static pmla_status copy_taken(pmla_builder *b, pmla_buffer which, void *dst, uint64_t bytes) {
  pmla_status st = pmla_check_copy_args(b, which, dst, bytes);
  if (st == PMLA_OK)
    memcpy(dst, b->buf[which], (size_t)bytes);
  return st;
}

static pmla_status cpu_copy_buffer(pmla_builder *b, pmla_buffer which, void *dst, uint64_t bytes) {
  pmla_status st = pmla_builder_enter(b, &pmla_cpu_backend, "copy_buffer");
  return st ? st : pmla_builder_leave(b, copy_taken(b, which, dst, bytes));
}

const pmla_backend pmla_cpu_backend = {
    .struct_size = sizeof(pmla_backend),
    .abi_version = PMLA_ABI_VERSION,
    .name = "pmla-cpu",
    .description = "pmla persistent MLA decode on CPU worker threads (fp32 accumulation)",
    .init_builder = cpu_init,
    .destroy_builder = cpu_destroy,
    .query_builder = cpu_query,
    .build_decode = cpu_build_decode,
    .build_sparse = cpu_build_sparse,
    .decode = cpu_decode,
    .last_error = pmla_builder_last_error,
    .check_device_error = cpu_check_device_error,
    .copy_buffer = cpu_copy_buffer,
};
