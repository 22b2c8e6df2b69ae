/* SPDX-License-Identifier: MIT */
/* builder.c - config validation, buffer sizing, argument checks and error
 * messages shared by the CPU and GPU backends. */
#include "builder.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mla_types.h"
#include "plan_invariant.h"
#include "planner.h"

_Static_assert(PMLA_WI_WORDS == PMLA_WORK_INFO_WORDS, "work item layout matches the ABI");
_Static_assert(PMLA_META_WORDS_ == PMLA_META_WORDS, "meta layout matches the ABI");
_Static_assert(PMLA_WI_REQUEST == 0 && PMLA_WI_PARTIAL == 1 && PMLA_WI_Q_BEGIN == 2 &&
                   PMLA_WI_Q_END == 3 && PMLA_WI_KV_BEGIN == 4 && PMLA_WI_KV_END == 5 &&
                   PMLA_WI_KV_LEN == 6 && PMLA_WI_PIECE == 7,
               "work item words as pmla.h documents them");
_Static_assert(PMLA_META_NUM_ITEMS == 0 && PMLA_META_NUM_REDUCE == 1 &&
                   PMLA_META_NUM_PARTIALS == 2 && PMLA_META_MODE == 3 &&
                   PMLA_META_MAX_PIECES == 4 && PMLA_META_NUM_REQUESTS == 5 &&
                   PMLA_META_ERROR == 6 && PMLA_META_NUM_ROWS == 7,
               "meta words as pmla.h documents them");
_Static_assert((int)PMLA_PLAN_ERR_KV_LEN == (int)PMLA_DEVERR_KV_LEN &&
                   (int)PMLA_PLAN_ERR_PAGE_INDEX == (int)PMLA_DEVERR_PAGE_INDEX &&
                   (int)PMLA_PLAN_ERR_SLOT_INDEX == (int)PMLA_DEVERR_SLOT_INDEX &&
                   (int)PMLA_PLAN_ERR_QO_INDPTR == (int)PMLA_DEVERR_QO_INDPTR &&
                   (int)PMLA_PLAN_ERR_LAST_PAGE == (int)PMLA_DEVERR_LAST_PAGE &&
                   (int)PMLA_PLAN_ERR_KV_SCALE == (int)PMLA_DEVERR_KV_SCALE &&
                   (int)PMLA_PLAN_ERR_OVERFLOW == (int)PMLA_DEVERR_SCHEDULE,
               "error bits match the ABI");

const DLDataType pmla_dl_bf16 = {kDLBfloat, 16, 1};
const DLDataType pmla_dl_int32 = {kDLInt, 32, 1};
const DLDataType pmla_dl_fp32 = {kDLFloat, 32, 1};
const DLDataType pmla_dl_uint8 = {kDLUInt, 8, 1};
/* DLPack 1.1's kDLFloat8_e4m3fn (torch.float8_e4m3fn), absent from older
 * dlpack.h */
const DLDataType pmla_dl_float8_e4m3fn = {10, 8, 1};

static _Thread_local char init_error[PMLA_ERROR_SIZE];

pmla_status pmla_fail(pmla_builder *b, pmla_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b ? b->error : init_error, PMLA_ERROR_SIZE, fmt, ap);
  va_end(ap);
  return status;
}

void pmla_clear_error(pmla_builder *b) { (b ? b->error : init_error)[0] = '\0'; }

/* the builder this thread's last refusal was about (another thread inside
 * a call on it, or a call through another backend): the message is in
 * init_error, which last_error(b) returns on this thread. A refused call
 * writes nothing into the builder, which the thread does not hold and whose
 * owner may be writing its message or freeing it at that moment. */
static _Thread_local const pmla_builder *refused_in_call;

/* The live builders: few per process, so a list under one lock; every
 * entry point looks its builder up before reading through it. */
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static const pmla_builder **live;
static size_t live_count, live_room;

/* the index of b in `live`, or live_count; under live_lock */
static size_t live_find(const pmla_builder *b) {
  size_t i = 0;
  while (i < live_count && live[i] != b)
    i++;
  return i;
}

int pmla_builder_adopt(pmla_builder *b) {
  int ok = 1;
  pthread_mutex_lock(&live_lock);
  if (live_count == live_room) {
    const size_t room = live_room ? 2 * live_room : 16;
    const pmla_builder **grown = realloc(live, room * sizeof *grown);
    if (grown) {
      live = grown;
      live_room = room;
    } else {
      ok = 0;
    }
  }
  if (ok)
    live[live_count++] = b;
  pthread_mutex_unlock(&live_lock);
  if (ok && refused_in_call == b) /* a new builder where a refused one was */
    refused_in_call = NULL;
  return ok;
}

/* the builder's backend if b is live, else NULL */
static const pmla_backend *live_backend(const pmla_builder *b) {
  pthread_mutex_lock(&live_lock);
  const pmla_backend *be = live_find(b) < live_count ? b->backend : NULL;
  pthread_mutex_unlock(&live_lock);
  return be;
}

/* the refusal of call `what` on b, of backend be, where the live list gave
 * b's backend as made_by (NULL: b is not live) */
static pmla_status refusal(const pmla_builder *b, const pmla_backend *made_by,
                           const pmla_backend *be, const char *what) {
  if (!made_by)
    return pmla_fail(NULL, PMLA_ERR_INVALID_ARGUMENT,
                     "%s: builder %p is not a live builder of this plugin (destroyed, or not "
                     "made by init_builder); accepted: a builder init_builder returned and "
                     "destroy_builder has not freed",
                     what, (const void *)b);
  refused_in_call = b;
  return pmla_fail(NULL, PMLA_ERR_INVALID_ARGUMENT,
                   "%s: the builder was made by backend %s; this is backend %s (accepted: the "
                   "backend whose init_builder made it)",
                   what, made_by->name, be->name);
}

static pmla_status in_call_refusal(const pmla_builder *b, const char *what, const char *left) {
  refused_in_call = b;
  return pmla_fail(NULL, PMLA_ERR_BAD_STATE,
                   "%s: another thread is inside a call on this builder%s; accepted: one "
                   "thread at a time on a builder (the host serialises its calls)",
                   what, left);
}

/* b looked up as a live builder of backend be (any backend: NULL) and,
 * with take, taken for a call, in one hold of the live list's lock */
static pmla_status look_up(const pmla_builder *b, const pmla_backend *be, const char *what,
                           int take) {
  if (!b)
    return pmla_fail(NULL, PMLA_ERR_INVALID_ARGUMENT, "%s: builder is NULL", what);
  pthread_mutex_lock(&live_lock);
  const pmla_backend *made_by = live_find(b) < live_count ? b->backend : NULL;
  const int ours = made_by && (!be || made_by == be), busy = take && ours && b->in_call;
  if (take && ours && !busy)
    ((pmla_builder *)b)->in_call = 1;
  pthread_mutex_unlock(&live_lock);
  if (!ours)
    return refusal(b, made_by, be, what);
  if (busy)
    return in_call_refusal(b, what, "");
  if (take && refused_in_call == b)
    refused_in_call = NULL;
  return PMLA_OK;
}

pmla_status pmla_builder_check(const pmla_builder *b, const pmla_backend *be, const char *what) {
  return look_up(b, be, what, 0);
}

pmla_status pmla_builder_enter(const pmla_builder *b, const pmla_backend *be, const char *what) {
  return look_up(b, be, what, 1);
}

pmla_status pmla_builder_leave(const pmla_builder *b, pmla_status st) {
  pthread_mutex_lock(&live_lock);
  ((pmla_builder *)b)->in_call = 0;
  pthread_mutex_unlock(&live_lock);
  return st;
}

int pmla_builder_forget(pmla_builder *b, const pmla_backend *be) {
  if (pmla_builder_check(b, be, "destroy_builder"))
    return 0;
  pthread_mutex_lock(&live_lock);
  const size_t i = live_find(b);
  const int busy = i < live_count && b->in_call, found = i < live_count && !busy;
  if (found)
    live[i] = live[--live_count];
  if (live_count == 0) { /* the list leaves with the last builder: the
                            plugin may be unloaded next */
    free(live);
    live = NULL;
    live_room = 0;
  }
  pthread_mutex_unlock(&live_lock);
  if (busy) /* freeing it would pull it from under that call: left as it is */
    in_call_refusal(b, "destroy_builder", " (it was not destroyed)");
  return found;
}

const char *pmla_builder_last_error(const pmla_builder *b) {
  if (b && b == refused_in_call)
    return init_error;
  return b && live_backend(b) ? b->error : init_error;
}

static int is_pow2(uint32_t v) { return v && !(v & (v - 1)); }

static const char *dtype_name(uint32_t d) {
  switch (d) {
  case PMLA_DTYPE_BF16: return "bf16";
  case PMLA_DTYPE_FP8_E4M3: return "fp8_e4m3";
  case PMLA_DTYPE_FP8_DS_MLA: return "fp8_ds_mla";
  default: return "unknown";
  }
}

/* q and out are bf16; the KV cache may also be one of the FP8 layouts */
static pmla_status check_dtype(const char *field, uint32_t d, int kv) {
  if (d == PMLA_DTYPE_BF16 || (kv && (d == PMLA_DTYPE_FP8_E4M3 || d == PMLA_DTYPE_FP8_DS_MLA)))
    return PMLA_OK;
  const char *accepted = kv ? "1 (bf16), 2 (fp8_e4m3) or 3 (fp8_ds_mla)" : "1 (bf16)";
  if (d == PMLA_DTYPE_FP8_E4M3 || d == PMLA_DTYPE_FP8_DS_MLA)
    return pmla_fail(NULL, PMLA_ERR_UNSUPPORTED,
                     "init_builder: config.%s = %u (%s) is not served (FP8 is for the KV cache "
                     "only); accepted: %s",
                     field, d, dtype_name(d), accepted);
  return pmla_fail(NULL, PMLA_ERR_INVALID_ARGUMENT,
                   "init_builder: config.%s = %u is not a pmla_dtype; accepted: %s", field, d,
                   accepted);
}

int32_t pmla_kv_format_of(uint32_t kv_dtype) {
  return kv_dtype == PMLA_DTYPE_FP8_E4M3    ? PMLA_KV_E4M3
         : kv_dtype == PMLA_DTYPE_FP8_DS_MLA ? PMLA_KV_DS_MLA
                                             : PMLA_KV_BF16;
}

pmla_status pmla_validate_init(const pmla_builder_config *cfg, pmla_builder **builder,
                               pmla_builder_config *out) {
  pmla_status st;
  pmla_clear_error(NULL);
  if (!builder)
    return pmla_fail(NULL, PMLA_ERR_INVALID_ARGUMENT, "init_builder: out is NULL");
  if (!cfg)
    return pmla_fail(NULL, PMLA_ERR_INVALID_ARGUMENT, "init_builder: config is NULL");
  if (cfg->struct_size < PMLA_BUILDER_CONFIG_SIZE_1_0)
    return pmla_fail(NULL, PMLA_ERR_STRUCT_SIZE,
                     "init_builder: config.struct_size = %u is smaller than the ABI 1.0 "
                     "pmla_builder_config (%u bytes)",
                     cfg->struct_size, PMLA_BUILDER_CONFIG_SIZE_1_0);
  /* a 1.0 host's config ends before flags: read only the members it holds
   * whole, the rest is 0 */
  pmla_builder_config c;
  memset(&c, 0, sizeof c);
  memcpy(&c, cfg, PMLA_BUILDER_CONFIG_SIZE_1_0);
  if (PMLA_HAS_MEMBER(cfg, pmla_builder_config, flags))
    c.flags = cfg->flags;
  if (PMLA_HAS_MEMBER(cfg, pmla_builder_config, invariant_chunk))
    c.invariant_chunk = cfg->invariant_chunk;
  cfg = &c;
  uint32_t h = cfg->num_heads;
  if (h < 1 || h > PMLA_MAX_HEADS)
    return pmla_fail(NULL, PMLA_ERR_UNSUPPORTED,
                     "init_builder: config.num_heads = %u is not supported; accepted: 1..%u",
                     h, PMLA_MAX_HEADS);
  if (cfg->kv_lora_rank != PMLA_V_DIM)
    return pmla_fail(NULL, PMLA_ERR_UNSUPPORTED,
                     "init_builder: config.kv_lora_rank = %u; accepted: 512", cfg->kv_lora_rank);
  if (cfg->rope_dim != PMLA_QK_DIM - PMLA_V_DIM)
    return pmla_fail(NULL, PMLA_ERR_UNSUPPORTED,
                     "init_builder: config.rope_dim = %u; accepted: 64", cfg->rope_dim);
  if ((st = check_dtype("q_dtype", cfg->q_dtype, 0)) ||
      (st = check_dtype("kv_dtype", cfg->kv_dtype, 1)) ||
      (st = check_dtype("out_dtype", cfg->out_dtype, 0)))
    return st;
  if (!is_pow2(cfg->page_size) || cfg->page_size > 256)
    return pmla_fail(NULL, PMLA_ERR_INVALID_ARGUMENT,
                     "init_builder: config.page_size = %u; accepted: a power of two in 1..256",
                     cfg->page_size);
  if (cfg->max_batch < 1 || cfg->max_batch > 65536)
    return pmla_fail(NULL, PMLA_ERR_INVALID_ARGUMENT,
                     "init_builder: config.max_batch = %u; accepted: 1..65536", cfg->max_batch);
  if (cfg->max_q_len < 1 || cfg->max_q_len > 8)
    return pmla_fail(NULL, PMLA_ERR_INVALID_ARGUMENT,
                     "init_builder: config.max_q_len = %u; accepted: 1..8", cfg->max_q_len);
  if (cfg->topk > 65536)
    return pmla_fail(NULL, PMLA_ERR_INVALID_ARGUMENT,
                     "init_builder: config.topk = %u; accepted: 0 (dense only) or 1..65536",
                     cfg->topk);
  /* a scale whose product with PMLA_LOG2E overflows fp32 would make every
   * output NaN */
  if (!(cfg->softmax_scale > 0.f) || !isfinite(cfg->softmax_scale * PMLA_LOG2E))
    return pmla_fail(NULL, PMLA_ERR_INVALID_ARGUMENT,
                     "init_builder: config.softmax_scale = %g; accepted: a finite value > 0 "
                     "up to FLT_MAX / log2(e) (about 2.3586e38)",
                     (double)cfg->softmax_scale);
  if (cfg->cu_count > 1024)
    return pmla_fail(NULL, PMLA_ERR_INVALID_ARGUMENT,
                     "init_builder: config.cu_count = %u; accepted: 0 (all) or 1..1024",
                     cfg->cu_count);
  if (cfg->device < 0)
    return pmla_fail(NULL, PMLA_ERR_INVALID_ARGUMENT,
                     "init_builder: config.device = %d; accepted: a GPU ordinal >= 0 (0 for "
                     "pmla-cpu)",
                     cfg->device);
  if (cfg->flags & ~(uint32_t)PMLA_BUILDER_BATCH_INVARIANT)
    return pmla_fail(NULL, PMLA_ERR_INVALID_ARGUMENT,
                     "init_builder: config.flags = 0x%x; accepted: 0 or "
                     "PMLA_BUILDER_BATCH_INVARIANT (0x%x)",
                     cfg->flags, (unsigned)PMLA_BUILDER_BATCH_INVARIANT);
  if (cfg->invariant_chunk % PMLA_BLOCK_TOKENS || cfg->invariant_chunk > PMLA_INV_MAX_LEAST)
    return pmla_fail(NULL, PMLA_ERR_INVALID_ARGUMENT,
                     "init_builder: config.invariant_chunk = %u; accepted: 0 (pmla's) or a "
                     "multiple of %d in %d..%d",
                     cfg->invariant_chunk, PMLA_BLOCK_TOKENS, PMLA_BLOCK_TOKENS,
                     PMLA_INV_MAX_LEAST);
  if (cfg->invariant_chunk && !(cfg->flags & PMLA_BUILDER_BATCH_INVARIANT))
    return pmla_fail(NULL, PMLA_ERR_INVALID_ARGUMENT,
                     "init_builder: config.invariant_chunk = %u without "
                     "PMLA_BUILDER_BATCH_INVARIANT in config.flags; accepted: 0, or the flag "
                     "with it",
                     cfg->invariant_chunk);
  memcpy(out, cfg, sizeof *out);
  out->struct_size = sizeof *out;
  return PMLA_OK;
}

void pmla_size_buffers(pmla_builder *b, uint32_t cu_count, uint32_t sched_units) {
  pmla_builder_info *in = &b->info;
  const uint64_t R = (uint64_t)b->cfg.max_batch * b->cfg.max_q_len, N = sched_units;
  const uint64_t rows = (uint64_t)b->cfg.max_q_len * b->cfg.num_heads;
  memset(in, 0, sizeof *in);
  in->struct_size = sizeof *in;
  in->cu_count = cu_count;
  in->sched_units = sched_units;
  in->max_requests = (uint32_t)R;
  /* batch-invariant: a work item per chunk (at most PMLA_INV_MAX_CHUNKS a
   * request), a split budget (pmla_inv_slot_units a unit) and one
   * accumulator slot per unit */
  const int inv = pmla_batch_invariant(b);
  in->max_work_items = (uint32_t)(inv ? R * PMLA_INV_MAX_CHUNKS + N : R + N);
  in->max_partial_slots =
      (uint32_t)(inv ? ((uint64_t)pmla_inv_slot_units((int64_t)rows, (int32_t)N) + 1) * N : 2 * N);
  in->buffer_bytes[PMLA_BUF_WORK_META_DATA] = PMLA_META_WORDS * 4;
  in->buffer_bytes[PMLA_BUF_WORK_INDPTR] = (N + 1) * 4;
  in->buffer_bytes[PMLA_BUF_WORK_INFO_SET] =
      (uint64_t)in->max_work_items * PMLA_WORK_INFO_WORDS * 4;
  in->buffer_bytes[PMLA_BUF_REDUCE_INDPTR] = (R + 1) * 4;
  in->buffer_bytes[PMLA_BUF_REDUCE_FINAL_MAP] = R * 4;
  const uint64_t slots = in->max_partial_slots;
  in->buffer_bytes[PMLA_BUF_REDUCE_PARTIAL_MAP] = slots * 4;
  in->buffer_bytes[PMLA_BUF_PARTIAL_OUT] = slots * rows * PMLA_V_DIM * 4;
  in->buffer_bytes[PMLA_BUF_PARTIAL_LSE] = slots * rows * 4;
  for (int i = 0; i < PMLA_BUF_COUNT; i++)
    in->total_bytes += in->buffer_bytes[i];
}

void pmla_step_plan_input(const pmla_builder *b, int32_t split_cap, pmla_plan_input *in) {
  const pmla_step *s = &b->step;
  memset(in, 0, sizeof *in);
  in->num_requests = s->num_requests;
  in->num_units = (int32_t)b->info.sched_units;
  in->split_cap = split_cap;
  in->max_q_len = (int32_t)b->cfg.max_q_len;
  in->page_size = (int32_t)b->cfg.page_size;
  in->max_items = (int32_t)b->info.max_work_items;
  in->max_partials = (int32_t)b->info.max_partial_slots;
  in->invariant = pmla_batch_invariant(b);
  in->inv_least = (int32_t)b->cfg.invariant_chunk;
  if (s->topk_stride > 0) { /* sparse: each token its own request over its top-k list */
    in->uniform_len = s->topk_stride;
    return;
  }
  in->qo_indptr = s->qo_indptr;
  in->kv_lens = s->kv_lens;
  in->max_kv_len = pmla_max_kv_len(b);
  in->kv_indptr = s->kv_indptr;
  in->kv_last_page_len = s->kv_last_page_len;
  in->num_page_indices = (int32_t)s->num_page_indices;
}

_Static_assert(PMLA_MAX_KV_LEN == PMLA_PLAN_MAX_KV_LEN, "the ABI's and the planner's KV cap");

int32_t pmla_max_kv_len(const pmla_builder *b) {
  const int64_t width = (int64_t)b->step.block_table_stride * b->cfg.page_size;
  return width < PMLA_PLAN_MAX_KV_LEN ? (int32_t)width : PMLA_PLAN_MAX_KV_LEN;
}

void pmla_plan_buffers(pmla_builder *b, pmla_plan_output *o) {
  o->work_meta_data = b->buf[PMLA_BUF_WORK_META_DATA];
  o->work_indptr = b->buf[PMLA_BUF_WORK_INDPTR];
  o->work_info_set = b->buf[PMLA_BUF_WORK_INFO_SET];
  o->reduce_indptr = b->buf[PMLA_BUF_REDUCE_INDPTR];
  o->reduce_final_map = b->buf[PMLA_BUF_REDUCE_FINAL_MAP];
  o->reduce_partial_map = b->buf[PMLA_BUF_REDUCE_PARTIAL_MAP];
}

void pmla_step_kv_map(const pmla_builder *b, int64_t num_slots, pmla_kv_map *map) {
  const pmla_step *s = &b->step;
  memset(map, 0, sizeof *map);
  map->page_size = (int32_t)b->cfg.page_size;
  map->page_div = pmla_fastdiv_make(b->cfg.page_size);
  map->num_slots = num_slots;
  map->block_table = s->block_table;
  map->block_table_stride = s->block_table_stride;
  map->kv_indptr = s->kv_indptr;
  map->kv_indices = s->kv_indices;
  map->topk = s->topk;
  map->topk_stride = s->topk_stride;
}

pmla_status pmla_query_builder(const pmla_builder *b, pmla_builder_info *info) {
  if (!info)
    return pmla_fail((pmla_builder *)b, PMLA_ERR_INVALID_ARGUMENT, "query_builder: info is NULL");
  if (info->struct_size < sizeof *info)
    return pmla_fail((pmla_builder *)b, PMLA_ERR_STRUCT_SIZE,
                     "query_builder: info->struct_size = %u is smaller than the ABI 1.0 "
                     "pmla_builder_info (%zu bytes)",
                     info->struct_size, sizeof *info);
  uint32_t size = info->struct_size;
  memcpy(info, &b->info, sizeof *info);
  info->struct_size = size < sizeof *info ? size : (uint32_t)sizeof *info;
  return PMLA_OK;
}

int pmla_mul_i64(int64_t a, int64_t b, int64_t *out) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    return 0;
  *out = r;
  return 1;
}

/* Integer arithmetic, not pointer arithmetic: data may be NULL (no
 * elements), and pmla_check_tensor has checked the sum does not wrap. */
void *pmla_tensor_data(const DLTensor *t) {
  return (void *)((uintptr_t)t->data + (uintptr_t)t->byte_offset);
}

static void dtype_str(DLDataType d, char *s, size_t n) {
  const char *code = d.code == kDLInt ? "int" : d.code == kDLUInt ? "uint"
                   : d.code == kDLFloat ? "float" : d.code == kDLBfloat ? "bfloat"
                   : d.code == pmla_dl_float8_e4m3fn.code ? "float8_e4m3fn" : NULL;
  if (!code) {
    snprintf(s, n, "(code %u, %u bits)", d.code, d.bits);
    return;
  }
  if (d.code == pmla_dl_float8_e4m3fn.code && d.bits == 8 && d.lanes == 1) {
    snprintf(s, n, "%s", code);
    return;
  }
  if (d.lanes == 1)
    snprintf(s, n, "%s%u", code, d.bits);
  else
    snprintf(s, n, "%s%u with %u lanes", code, d.bits, d.lanes);
}

/* The one alignment rule per dtype: what a load of one element needs. */
static uint64_t dtype_align(DLDataType d) {
  if (d.code == kDLBfloat && d.bits == 16)
    return _Alignof(uint16_t);
  if (d.code == kDLInt && d.bits == 32)
    return _Alignof(int32_t);
  if (d.code == kDLFloat && d.bits == 32)
    return _Alignof(float);
  return 1;
}

/* a shape as text; wild: a negative dimension is "*" (any), as in an
 * accepted shape, else its value, as in a caller's */
static void shape_str(const int64_t *shape, int ndim, int wild, char *s, size_t n) {
  size_t used = 0;
  used += (size_t)snprintf(s, n, "[");
  for (int i = 0; i < ndim && used < n; i++) {
    if (wild && shape[i] < 0)
      used += (size_t)snprintf(s + used, n - used, "%s*", i ? ", " : "");
    else
      used += (size_t)snprintf(s + used, n - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
  }
  if (used < n)
    snprintf(s + used, n - used, "]");
}

pmla_status pmla_check_alignment(pmla_builder *b, const char *name, const DLTensor *t,
                                 uint64_t align, const char *why) {
  uintptr_t addr = (uintptr_t)pmla_tensor_data(t);
  if (addr % align != 0)
    return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                     "%s: data + byte_offset = 0x%llx (data %p, byte_offset %llu); accepted: a "
                     "%llu-byte aligned address (%s)",
                     name, (unsigned long long)addr, t->data, (unsigned long long)t->byte_offset,
                     (unsigned long long)align, why);
  return PMLA_OK;
}

pmla_status pmla_check_tensor(pmla_builder *b, const char *name, const DLTensor *t,
                              DLDataType dtype, int ndim, const int64_t *shape, int device_type,
                              int device_id) {
  char want[96], got[96];
  if (!t)
    return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT, "%s is NULL; a DLTensor is required", name);
  if (t->dtype.code != dtype.code || t->dtype.bits != dtype.bits || t->dtype.lanes != dtype.lanes) {
    dtype_str(t->dtype, got, sizeof got);
    dtype_str(dtype, want, sizeof want);
    return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT, "%s: dtype %s; accepted: %s", name, got, want);
  }
  if (t->ndim != ndim || !t->shape) {
    shape_str(shape, ndim, 1, want, sizeof want);
    return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT, "%s: ndim = %d%s; accepted: %d, shape %s",
                     name, t->ndim, t->shape ? "" : ", shape NULL", ndim, want);
  }
  for (int i = 0; i < ndim; i++) {
    if (t->shape[i] < 0 || (shape[i] >= 0 && t->shape[i] != shape[i])) {
      shape_str(t->shape, ndim, 0, got, sizeof got);
      shape_str(shape, ndim, 1, want, sizeof want);
      return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT, "%s: shape %s (dim %d); accepted: %s", name,
                       got, i, want);
    }
  }
  /* element count and byte size; a dimension of 0 makes the tensor empty,
   * whatever the others multiply to */
  int64_t elems = 1, bytes;
  int empty = 0;
  for (int i = 0; i < ndim; i++)
    empty |= t->shape[i] == 0;
  for (int i = 0; i < ndim && !empty; i++) {
    if (!pmla_mul_i64(elems, t->shape[i], &elems)) {
      shape_str(t->shape, ndim, 0, got, sizeof got);
      return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                       "%s: shape %s: the element count overflows int64 at dim %d (%lld * %lld); "
                       "accepted: a tensor of at most INT64_MAX bytes",
                       name, got, i, (long long)elems, (long long)t->shape[i]);
    }
  }
  if (empty)
    elems = 0;
  const int64_t elem_bytes = dtype.bits / 8;
  if (!pmla_mul_i64(elems, elem_bytes, &bytes)) {
    shape_str(t->shape, ndim, 0, got, sizeof got);
    return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                     "%s: shape %s: %lld elements of %lld bytes overflow int64; accepted: a "
                     "tensor of at most INT64_MAX bytes",
                     name, got, (long long)elems, (long long)elem_bytes);
  }
  if (t->strides && !empty) {
    /* a dimension of size 1 takes any stride: stride * (1 - 1) moves nothing;
     * an empty tensor addresses nothing, and exporters give its 0 dims any
     * stride (torch: 1) */
    int64_t expect = 1;
    for (int i = ndim - 1; i >= 0; i--) {
      if (t->shape[i] != 1 && t->strides[i] != expect)
        return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                         "%s: stride %lld in dim %d; accepted: contiguous row-major (%lld)", name,
                         (long long)t->strides[i], i, (long long)expect);
      if (i > 0 && !pmla_mul_i64(expect, t->shape[i], &expect))
        return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                         "%s: strides: the row-major stride of dim %d overflows int64 (%lld * "
                         "%lld); accepted: strides that fit int64",
                         name, i - 1, (long long)expect, (long long)t->shape[i]);
    }
  }
  if (!t->data && elems > 0)
    return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                     "%s: data is NULL for %lld elements; accepted: NULL only for an empty "
                     "tensor",
                     name, (long long)elems);
  if (device_type && (t->device.device_type != (DLDeviceType)device_type ||
                      t->device.device_id != device_id))
    return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                     "%s: device (type %d, id %d); accepted: (type %d, id %d) for backend %s",
                     name, (int)t->device.device_type, (int)t->device.device_id, device_type,
                     device_id, b->backend->name);
  uintptr_t first, end;
  if (__builtin_add_overflow((uintptr_t)t->data, t->byte_offset, &first) ||
      __builtin_add_overflow(first, (uint64_t)bytes, &end))
    return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                     "%s: data %p + byte_offset %llu + %lld bytes wraps the address space; "
                     "accepted: a tensor that ends inside it",
                     name, t->data, (unsigned long long)t->byte_offset, (long long)bytes);
  char dt[24], why[40];
  dtype_str(dtype, dt, sizeof dt);
  snprintf(why, sizeof why, "%s elements", dt);
  return pmla_check_alignment(b, name, t, dtype_align(dtype), why);
}

#define CHECK(expr)                                                                            \
  do {                                                                                         \
    pmla_status st_ = (expr);                                                                  \
    if (st_ != PMLA_OK)                                                                        \
      return st_;                                                                              \
  } while (0)

/* The bytes [*lo, *hi) of a tensor pmla_check_tensor accepted (contiguous,
 * its end inside the address space); empty: lo == hi. */
static void tensor_span(const DLTensor *t, uintptr_t *lo, uintptr_t *hi) {
  uint64_t bytes = (uint64_t)t->dtype.bits / 8 * t->dtype.lanes;
  for (int i = 0; i < t->ndim; i++)
    bytes *= (uint64_t)t->shape[i];
  *lo = (uintptr_t)pmla_tensor_data(t);
  *hi = *lo + (uintptr_t)bytes;
}

/* remembers an accepted index tensor of the step being built */
static void step_span(pmla_step *s, const DLTensor *t, const char *name) {
  tensor_span(t, &s->spans[s->num_spans].lo, &s->spans[s->num_spans].hi);
  s->spans[s->num_spans++].name = name;
}

static int spans_overlap(uintptr_t lo0, uintptr_t hi0, uintptr_t lo1, uintptr_t hi1) {
  return lo0 < hi0 && lo1 < hi1 && lo0 < hi1 && lo1 < hi0;
}

pmla_status pmla_check_no_overlap(pmla_builder *b, const pmla_decode_args *a) {
  struct {
    uintptr_t lo, hi;
    const char *name;
  } in[8];
  int n = 0;
  const DLTensor *const reads[3] = {a->q, a->kv_cache, a->kv_scale};
  static const char *const read_names[3] = {"args->q", "args->kv_cache", "args->kv_scale"};
  for (int i = 0; i < 3; i++)
    if (reads[i]) {
      tensor_span(reads[i], &in[n].lo, &in[n].hi);
      in[n++].name = read_names[i];
    }
  for (int i = 0; i < b->step.num_spans; i++) {
    in[n].lo = b->step.spans[i].lo;
    in[n].hi = b->step.spans[i].hi;
    in[n++].name = b->step.spans[i].name;
  }
  const DLTensor *const writes[2] = {a->out, a->lse};
  static const char *const write_names[2] = {"args->out", "args->lse"};
  uintptr_t wlo[2] = {0, 0}, whi[2] = {0, 0};
  for (int w = 0; w < 2; w++) {
    if (!writes[w])
      continue;
    tensor_span(writes[w], &wlo[w], &whi[w]);
    /* every input it overlaps, named with its bytes, as many as the message
     * holds whole; the rest counted */
    char hit[256] = "";
    size_t len = 0;
    int more = 0;
    for (int i = 0; i < n; i++)
      if (spans_overlap(wlo[w], whi[w], in[i].lo, in[i].hi)) {
        char one[128];
        const int k = snprintf(one, sizeof one, "%s%s (bytes 0x%llx..0x%llx)", len ? ", " : "",
                               in[i].name, (unsigned long long)in[i].lo,
                               (unsigned long long)in[i].hi);
        if (k > 0 && (size_t)k < sizeof one && len + (size_t)k + 24 < sizeof hit) {
          memcpy(hit + len, one, (size_t)k + 1);
          len += (size_t)k;
        } else {
          more++;
        }
      }
    if (more)
      snprintf(hit + len, sizeof hit - len, " and %d more input%s", more, more > 1 ? "s" : "");
    if (hit[0])
      return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                       "decode: %s (bytes 0x%llx..0x%llx) overlaps %s; accepted: outputs that "
                       "share no byte with q, kv_cache, kv_scale, the step's index tensors or "
                       "each other",
                       write_names[w], (unsigned long long)wlo[w], (unsigned long long)whi[w], hit);
  }
  if (spans_overlap(wlo[0], whi[0], wlo[1], whi[1]))
    return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                     "decode: args->out (bytes 0x%llx..0x%llx) overlaps args->lse (bytes "
                     "0x%llx..0x%llx); accepted: outputs that share no byte with q, kv_cache, "
                     "kv_scale, the step's index tensors or each other",
                     (unsigned long long)wlo[0], (unsigned long long)whi[0],
                     (unsigned long long)wlo[1], (unsigned long long)whi[1]);
  return PMLA_OK;
}

static pmla_status check_struct(pmla_builder *b, const char *what, const void *p, uint32_t size,
                                size_t need) {
  if (!p)
    return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT, "%s is NULL", what);
  if (size < need)
    return pmla_fail(b, PMLA_ERR_STRUCT_SIZE,
                     "%s->struct_size = %u is smaller than its ABI 1.0 size (%zu bytes)", what,
                     size, need);
  return PMLA_OK;
}

pmla_status pmla_check_decode_batch(pmla_builder *b, const pmla_decode_batch *batch,
                                    int device_type, pmla_decode_batch *copy) {
  const int dev = b->cfg.device;
  CHECK(check_struct(b, "build_decode: batch", batch, batch ? batch->struct_size : 0,
                     sizeof *batch));
  *copy = *batch;
  const int64_t any1[1] = {-1};
  CHECK(pmla_check_tensor(b, "build_decode: batch->qo_indptr", batch->qo_indptr, pmla_dl_int32,
                          1, any1, device_type, dev));
  int64_t R = batch->qo_indptr->shape[0] - 1;
  if (R < 0)
    return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                     "build_decode: batch->qo_indptr has 0 entries; accepted: batch + 1 >= 1");
  if (R > b->cfg.max_batch)
    return pmla_fail(b, PMLA_ERR_CAPACITY,
                     "build_decode: batch size %lld (qo_indptr has %lld entries) exceeds "
                     "config.max_batch = %u",
                     (long long)R, (long long)R + 1, b->cfg.max_batch);
  pmla_step *s = &b->step;
  memset(s, 0, sizeof *s);
  s->checked_slots = -1;
  s->num_requests = (int32_t)R;
  s->num_tokens = -1;
  s->kv_layout = batch->kv_layout;
  s->qo_indptr = pmla_tensor_data(batch->qo_indptr);
  step_span(s, batch->qo_indptr, "batch->qo_indptr");
  const int64_t shape_r[1] = {R}, shape_r1[1] = {R + 1}, shape_bt[2] = {R, -1};
  if (batch->kv_layout == PMLA_KV_BLOCK_TABLE) {
    CHECK(pmla_check_tensor(b, "build_decode: batch->block_table", batch->block_table,
                            pmla_dl_int32, 2, shape_bt, device_type, dev));
    CHECK(pmla_check_tensor(b, "build_decode: batch->kv_lens", batch->kv_lens, pmla_dl_int32, 1,
                            shape_r, device_type, dev));
    int64_t width = batch->block_table->shape[1], tokens;
    if (!pmla_mul_i64(width, b->cfg.page_size, &tokens) || tokens > INT32_MAX)
      return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                       "build_decode: batch->block_table has %lld pages per request of %u "
                       "tokens; accepted: at most %d tokens per request",
                       (long long)width, b->cfg.page_size, INT32_MAX);
    s->block_table = pmla_tensor_data(batch->block_table);
    s->block_table_stride = (int32_t)width;
    s->kv_lens = pmla_tensor_data(batch->kv_lens);
    step_span(s, batch->block_table, "batch->block_table");
    step_span(s, batch->kv_lens, "batch->kv_lens");
  } else if (batch->kv_layout == PMLA_KV_CSR) {
    CHECK(pmla_check_tensor(b, "build_decode: batch->kv_indptr", batch->kv_indptr, pmla_dl_int32,
                            1, shape_r1, device_type, dev));
    CHECK(pmla_check_tensor(b, "build_decode: batch->kv_indices", batch->kv_indices,
                            pmla_dl_int32, 1, any1, device_type, dev));
    CHECK(pmla_check_tensor(b, "build_decode: batch->kv_last_page_len", batch->kv_last_page_len,
                            pmla_dl_int32, 1, shape_r, device_type, dev));
    if (batch->kv_indices->shape[0] > INT32_MAX)
      return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                       "build_decode: batch->kv_indices has %lld entries; accepted: < 2^31",
                       (long long)batch->kv_indices->shape[0]);
    s->kv_indptr = pmla_tensor_data(batch->kv_indptr);
    s->kv_indices = pmla_tensor_data(batch->kv_indices);
    s->num_page_indices = batch->kv_indices->shape[0];
    s->kv_last_page_len = pmla_tensor_data(batch->kv_last_page_len);
    step_span(s, batch->kv_indptr, "batch->kv_indptr");
    step_span(s, batch->kv_indices, "batch->kv_indices");
    step_span(s, batch->kv_last_page_len, "batch->kv_last_page_len");
  } else {
    return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                     "build_decode: batch->kv_layout = %u; accepted: %d (PMLA_KV_BLOCK_TABLE) or "
                     "%d (PMLA_KV_CSR)",
                     batch->kv_layout, PMLA_KV_BLOCK_TABLE, PMLA_KV_CSR);
  }
  return PMLA_OK;
}

pmla_status pmla_check_sparse_batch(pmla_builder *b, const pmla_sparse_batch *batch,
                                    int device_type, pmla_sparse_batch *copy) {
  CHECK(check_struct(b, "build_sparse: batch", batch, batch ? batch->struct_size : 0,
                     sizeof *batch));
  *copy = *batch;
  if (batch->flags & ~(uint32_t)PMLA_SPARSE_NO_SPLIT_CAP)
    return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                     "build_sparse: batch->flags = 0x%x; accepted: 0 or PMLA_SPARSE_NO_SPLIT_CAP "
                     "(0x%x)",
                     batch->flags, (unsigned)PMLA_SPARSE_NO_SPLIT_CAP);
  if (b->cfg.topk == 0)
    return pmla_fail(b, PMLA_ERR_BAD_STATE,
                     "build_sparse: this builder was made with config.topk = 0 (dense only); "
                     "make one with topk > 0 for sparse decode");
  const int64_t shape[2] = {-1, b->cfg.topk};
  CHECK(pmla_check_tensor(b, "build_sparse: batch->topk_indices", batch->topk_indices,
                          pmla_dl_int32, 2, shape, device_type, b->cfg.device));
  int64_t T = batch->topk_indices->shape[0];
  int64_t R = (int64_t)b->cfg.max_batch * b->cfg.max_q_len;
  if (T > R)
    return pmla_fail(b, PMLA_ERR_CAPACITY,
                     "build_sparse: %lld query tokens exceed config.max_batch * max_q_len = %lld",
                     (long long)T, (long long)R);
  if (batch->max_seq_len < 0)
    return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                     "build_sparse: batch->max_seq_len = %lld; accepted: >= 0",
                     (long long)batch->max_seq_len);
  pmla_step *s = &b->step;
  memset(s, 0, sizeof *s);
  s->checked_slots = -1;
  s->num_requests = (int32_t)T;
  s->num_tokens = T;
  s->topk = pmla_tensor_data(batch->topk_indices);
  step_span(s, batch->topk_indices, "batch->topk_indices");
  s->topk_stride = (int32_t)b->cfg.topk;
  return PMLA_OK;
}

/* The KV cache of a builder's kv_dtype: its dtype (an fp8_e4m3 cache may
 * be uint8 or float8_e4m3fn), [pages, page_size, W] or with the 1-head axis */
static pmla_status check_kv_cache(pmla_builder *b, const DLTensor *kv, int device_type) {
  const int dev = b->cfg.device;
  const int64_t P = b->cfg.page_size, W = b->cfg.kv_dtype == PMLA_DTYPE_FP8_DS_MLA
                                               ? PMLA_KV_TOKEN_BYTES_FP8_DS_MLA
                                               : PMLA_QK_DIM;
  DLDataType dt = b->cfg.kv_dtype == PMLA_DTYPE_BF16 ? pmla_dl_bf16 : pmla_dl_uint8;
  if (b->cfg.kv_dtype == PMLA_DTYPE_FP8_E4M3 && kv &&
      kv->dtype.code == pmla_dl_float8_e4m3fn.code)
    dt = pmla_dl_float8_e4m3fn;
  if (kv && (kv->dtype.code != dt.code || kv->dtype.bits != dt.bits || kv->dtype.lanes != 1)) {
    char got[24];
    dtype_str(kv->dtype, got, sizeof got);
    return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                     "decode: args->kv_cache: dtype %s does not match the builder's kv_dtype %u "
                     "(%s); accepted: %s",
                     got, b->cfg.kv_dtype, dtype_name(b->cfg.kv_dtype),
                     b->cfg.kv_dtype == PMLA_DTYPE_BF16      ? "bfloat16"
                     : b->cfg.kv_dtype == PMLA_DTYPE_FP8_E4M3 ? "uint8 or float8_e4m3fn"
                                                              : "uint8");
  }
  if (kv && kv->ndim != 3 && kv->ndim != 4)
    return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                     "decode: args->kv_cache: ndim = %d; accepted: 3, shape [*, %lld, %lld], or "
                     "4, shape [*, %lld, 1, %lld]",
                     kv->ndim, (long long)P, (long long)W, (long long)P, (long long)W);
  if (kv && kv->ndim == 4) {
    const int64_t kv4[4] = {-1, P, 1, W};
    return pmla_check_tensor(b, "decode: args->kv_cache", kv, dt, 4, kv4, device_type, dev);
  }
  const int64_t kv3[3] = {-1, P, W};
  return pmla_check_tensor(b, "decode: args->kv_cache", kv, dt, 3, kv3, device_type, dev);
}

pmla_status pmla_check_decode_args(pmla_builder *b, const pmla_decode_args *args,
                                   int device_type, pmla_decode_args *copy, int64_t *num_slots) {
  const int dev = b->cfg.device;
  const int64_t H = b->cfg.num_heads, P = b->cfg.page_size;
  CHECK(check_struct(b, "decode: args", args, args ? args->struct_size : 0,
                     PMLA_DECODE_ARGS_SIZE_1_0));
  /* a 1.0 host's struct ends before kv_scale: read only the members it
   * holds whole, the rest is 0 */
  memset(copy, 0, sizeof *copy);
  memcpy(copy, args, PMLA_DECODE_ARGS_SIZE_1_0);
  if (PMLA_HAS_MEMBER(args, pmla_decode_args, kv_scale))
    copy->kv_scale = args->kv_scale;
  args = copy;
  if (b->step.kind == PLAN_NONE)
    return pmla_fail(b, PMLA_ERR_BAD_STATE,
                     "decode: no step was built; call build_decode or build_sparse first");
  const int64_t q_shape[3] = {-1, H, PMLA_QK_DIM};
  CHECK(pmla_check_tensor(b, "decode: args->q", args->q, pmla_dl_bf16, 3, q_shape, device_type,
                          dev));
  int64_t T = args->q->shape[0];
  if (b->step.num_tokens >= 0 && T != b->step.num_tokens)
    return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                     "decode: args->q has %lld tokens; the built step has %lld", (long long)T,
                     (long long)b->step.num_tokens);
  if (T > (int64_t)b->cfg.max_batch * b->cfg.max_q_len)
    return pmla_fail(b, PMLA_ERR_CAPACITY,
                     "decode: args->q has %lld tokens; accepted: <= max_batch * max_q_len = %lld",
                     (long long)T, (long long)b->cfg.max_batch * b->cfg.max_q_len);
  const DLTensor *kv = args->kv_cache;
  CHECK(check_kv_cache(b, kv, device_type));
  if (!pmla_mul_i64(kv->shape[0], P, num_slots))
    return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                     "decode: args->kv_cache has %lld pages of %lld slots: the slot count "
                     "overflows int64; accepted: at most INT64_MAX slots",
                     (long long)kv->shape[0], (long long)P);
  const int64_t out_shape[3] = {T, H, PMLA_V_DIM}, lse_shape[2] = {T, H};
  CHECK(pmla_check_tensor(b, "decode: args->out", args->out, pmla_dl_bf16, 3, out_shape,
                          device_type, dev));
  if (args->lse)
    CHECK(pmla_check_tensor(b, "decode: args->lse", args->lse, pmla_dl_fp32, 2, lse_shape,
                            device_type, dev));
  if (b->cfg.kv_dtype == PMLA_DTYPE_FP8_E4M3) {
    if (!args->kv_scale)
      return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                       "decode: args->kv_scale is %s; accepted: an fp32 [1] tensor on the "
                       "backend's device, required for kv_dtype 2 (fp8_e4m3)",
                       args->struct_size < sizeof *args ? "absent (a 1.0 pmla_decode_args)"
                                                        : "NULL");
    const int64_t one[1] = {1};
    CHECK(pmla_check_tensor(b, "decode: args->kv_scale", args->kv_scale, pmla_dl_fp32, 1, one,
                            device_type, dev));
  } else {
    copy->kv_scale = NULL; /* ignored for the other kv_dtypes */
  }
  return PMLA_OK;
}

static pmla_status build_dense(pmla_builder *b, const pmla_decode_batch *batch, int device_type,
                               pmla_plan_fn plan) {
  pmla_decode_batch copy;
  pmla_status st;
  pmla_clear_error(b);
  b->step.kind = PLAN_NONE;
  if ((st = pmla_check_decode_batch(b, batch, device_type, &copy)) ||
      (st = plan(b, 0, copy.stream, "build_decode")))
    return st;
  b->info.split_cap = 0;
  b->step.kind = PLAN_DENSE;
  return PMLA_OK;
}

pmla_status pmla_build_dense(pmla_builder *b, const pmla_decode_batch *batch,
                             const pmla_backend *be, int device_type, pmla_plan_fn plan) {
  pmla_status st = pmla_builder_enter(b, be, "build_decode");
  return st ? st : pmla_builder_leave(b, build_dense(b, batch, device_type, plan));
}

static pmla_status build_sparse(pmla_builder *b, const pmla_sparse_batch *batch,
                                int device_type, pmla_plan_fn plan) {
  pmla_sparse_batch copy;
  pmla_status st;
  pmla_clear_error(b);
  b->step.kind = PLAN_NONE;
  if ((st = pmla_check_sparse_batch(b, batch, device_type, &copy)))
    return st;
  /* batch-invariant steps split at fixed chunks, not by a cap */
  int32_t cap = pmla_batch_invariant(b) ? 0
                : copy.flags & PMLA_SPARSE_NO_SPLIT_CAP
                    ? 0
                    : pmla_sparse_split_cap(copy.max_seq_len, b->cfg.topk, b->info.cu_count);
  if ((st = plan(b, cap, copy.stream, "build_sparse")))
    return st;
  b->info.split_cap = (uint32_t)cap;
  b->step.kind = PLAN_SPARSE;
  return PMLA_OK;
}

pmla_status pmla_build_sparse(pmla_builder *b, const pmla_sparse_batch *batch,
                              const pmla_backend *be, int device_type, pmla_plan_fn plan) {
  pmla_status st = pmla_builder_enter(b, be, "build_sparse");
  return st ? st : pmla_builder_leave(b, build_sparse(b, batch, device_type, plan));
}

pmla_status pmla_check_copy_args(pmla_builder *b, pmla_buffer which, const void *dst,
                                 uint64_t bytes) {
  pmla_clear_error(b);
  if ((unsigned)which >= PMLA_BUF_COUNT)
    return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT, "copy_buffer: which = %d; accepted: 0..%d",
                     (int)which, PMLA_BUF_COUNT - 1);
  if (!dst || bytes != b->info.buffer_bytes[which])
    return pmla_fail(b, PMLA_ERR_INVALID_ARGUMENT,
                     "copy_buffer: bytes = %llu, host_dst %s; accepted: bytes = %llu and a "
                     "non-NULL host_dst",
                     (unsigned long long)bytes, dst ? "set" : "NULL",
                     (unsigned long long)b->info.buffer_bytes[which]);
  return PMLA_OK;
}

pmla_status pmla_device_error_status(pmla_builder *b, uint32_t bits, uint32_t *flags) {
  if (flags)
    *flags = bits;
  if (bits)
    return pmla_fail(b, PMLA_ERR_DEVICE_INPUT,
                     "check_device_error: kernels skipped bad device-side input (bits 0x%x: "
                     "1 kv_len, 2 page index, 4 slot index, 8 qo_indptr, 16 last_page_len, "
                     "32 kv_scale, 32768 a schedule bound: a pmla defect)",
                     bits);
  return PMLA_OK;
}
