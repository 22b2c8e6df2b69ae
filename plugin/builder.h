/* SPDX-License-Identifier: MIT */
/* builder.h - what every backend's builder shares: the validated config,
 * buffer sizes, the remembered step plan, and error reporting. */
#ifndef PMLA_PLUGIN_BUILDER_H
#define PMLA_PLUGIN_BUILDER_H

#include <stdarg.h>
#include <stdint.h>

#include "pmla.h"

#define PMLA_ERROR_SIZE 512

enum { PLAN_NONE = 0, PLAN_DENSE = 1, PLAN_SPARSE = 2 };

/* The step remembered by build_* for decode: raw pointers into the host's
 * tensors (device or host memory, as the backend requires). */
typedef struct pmla_step {
  int kind;
  int32_t num_requests;
  int64_t num_tokens;        /* -1 when only the device knows (GPU dense) */
  uint32_t kv_layout;
  const int32_t *qo_indptr;
  const int32_t *block_table;
  int32_t block_table_stride;
  const int32_t *kv_lens;
  const int32_t *kv_indptr;
  const int32_t *kv_indices;
  int64_t num_page_indices;
  const int32_t *kv_last_page_len;
  const int32_t *topk;
  int32_t topk_stride;
  /* the byte spans [lo, hi) of the step's index tensors, which no output
   * of its decodes may overlap */
  struct {
    uintptr_t lo, hi;
    const char *name;
  } spans[4];
  int num_spans;
  int64_t checked_slots;     /* pmla-cpu: indices already checked against a cache
                                of this many slots (-1: not yet); the host keeps
                                the step's tensors unchanged until its last decode */
} pmla_step;

struct pmla_builder {
  const pmla_backend *backend;
  pmla_builder_config cfg;   /* 1.0 prefix, struct_size normalised */
  pmla_builder_info info;    /* sizes; split_cap follows the last build */
  void *buf[PMLA_BUF_COUNT];
  pmla_step step;
  void *impl;                /* backend-private state */
  char error[PMLA_ERROR_SIZE];
  int in_call;               /* a thread is inside a call on it (under the live list's lock) */
};

/* Formats the builder's message (NULL builder: this thread's init message)
 * and returns `status`, so error paths read `return pmla_fail(b, ...)`. */
pmla_status pmla_fail(pmla_builder *b, pmla_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void pmla_clear_error(pmla_builder *b);
/* b's message; for NULL, a pointer that is not a live builder (never made,
 * or destroyed), or a live builder this thread's last call on was refused
 * (another backend's, or another thread inside a call on it), this thread's
 * message (init_builder's, or that refusal) */
const char *pmla_builder_last_error(const pmla_builder *b);

/* The plugin's live builders, so that a call given a pointer that is not
 * one (destroyed, never made by init_builder, or made by another backend)
 * is refused without reading through it. pmla_builder_adopt enters a
 * finished builder (0: out of memory, nothing entered); pmla_builder_forget
 * removes b if it is live, of backend `be` and no thread is inside a call
 * on it (1), and otherwise leaves it and says why on this thread (0). */
int pmla_builder_adopt(pmla_builder *b);
int pmla_builder_forget(pmla_builder *b, const pmla_backend *be);
/* PMLA_OK when b is live and, unless `be` is NULL, made by `be`; else the
 * refusal (INVALID_ARGUMENT), named after `what` (the call), as this
 * thread's message. */
pmla_status pmla_builder_check(const pmla_builder *b, const pmla_backend *be, const char *what);

/* Takes b for one call, `what`: pmla_builder_check's refusals, and
 * BAD_STATE while another thread is inside a call on b (pmla.h: one thread
 * at a time; overlapping calls would race on the step, and hang pmla-cpu's
 * workers). That refusal's message is the calling thread's: last_error(b)
 * on that thread returns it until its next call on b is taken. Every call
 * taken is given back by pmla_builder_leave, which returns `st`. */
pmla_status pmla_builder_enter(const pmla_builder *b, const pmla_backend *be, const char *what);
pmla_status pmla_builder_leave(const pmla_builder *b, pmla_status st);

/* init_builder's common checks: `builder` (the out pointer) and every
 * config field (the message names field, value and what is accepted);
 * copies the config's 1.0 prefix into *out. Clears this thread's message. */
pmla_status pmla_validate_init(const pmla_builder_config *cfg, pmla_builder **builder,
                               pmla_builder_config *out);

/* Fills sizes in b->info from cfg, cu_count and sched_units. */
void pmla_size_buffers(pmla_builder *b, uint32_t cu_count, uint32_t sched_units);

/* a * b into *out; returns 0, leaving *out alone, when the product does not
 * fit int64_t. Every size computed from caller input (element counts, byte
 * sizes, strides, slots) is multiplied through it. */
int pmla_mul_i64(int64_t a, int64_t b, int64_t *out);

/* Tensor checks. device_type 0 skips the device check. A shape entry of -1
 * matches anything. Besides dtype, shape, contiguity and device, the tensor
 * must be addressable: its element count and byte size fit int64, data +
 * byte_offset + its bytes stay inside the address space, and data +
 * byte_offset is aligned for its dtype (pmla_check_alignment). */
pmla_status pmla_check_tensor(pmla_builder *b, const char *name, const DLTensor *t,
                              DLDataType dtype, int ndim, const int64_t *shape,
                              int device_type, int device_id);
/* Refuses t unless data + byte_offset is a multiple of `align` bytes (a power
 * of two); `why` says what needs it, for the message. */
pmla_status pmla_check_alignment(pmla_builder *b, const char *name, const DLTensor *t,
                                 uint64_t align, const char *why);
/* data + byte_offset (of a tensor pmla_check_tensor accepted). */
void *pmla_tensor_data(const DLTensor *t);

extern const DLDataType pmla_dl_bf16, pmla_dl_int32, pmla_dl_fp32, pmla_dl_uint8,
    pmla_dl_float8_e4m3fn;

/* The kernels' pmla_kv_format of a config.kv_dtype. */
int32_t pmla_kv_format_of(uint32_t kv_dtype);

/* Whether b was made with PMLA_BUILDER_BATCH_INVARIANT (its schedules are
 * plan_invariant.h's, its kernels fold). */
static inline int pmla_batch_invariant(const pmla_builder *b) {
  return (b->cfg.flags & PMLA_BUILDER_BATCH_INVARIANT) != 0;
}

/* Validates a batch / args struct's size and the host-side shape of the
 * step; on success fills b->step (not its device-side values). */
pmla_status pmla_check_decode_batch(pmla_builder *b, const pmla_decode_batch *batch,
                                    int device_type, pmla_decode_batch *copy);
pmla_status pmla_check_sparse_batch(pmla_builder *b, const pmla_sparse_batch *batch,
                                    int device_type, pmla_sparse_batch *copy);
/* Checks q / kv_cache / out / lse / kv_scale (a 1.0-sized args struct is
 * copied with kv_scale NULL; kv_scale is NULL in the copy unless the
 * builder's kv_dtype reads it); returns num_slots of the cache. */
pmla_status pmla_check_decode_args(pmla_builder *b, const pmla_decode_args *args,
                                   int device_type, pmla_decode_args *copy, int64_t *num_slots);
/* decode's outputs (in args accepted by pmla_check_decode_args) share no
 * byte with its inputs, the step's index tensors or each other: the
 * kernels and pmla-cpu's workers read the inputs while the outputs are
 * written. Each backend calls it after its own checks of the tensors. */
pmla_status pmla_check_no_overlap(pmla_builder *b, const pmla_decode_args *args);

/* A backend's planning of the step just remembered in b->step, under the
 * given split cap (0: uncapped), on `stream`; `what` names the ABI call. */
typedef pmla_status (*pmla_plan_fn)(pmla_builder *b, int32_t cap, void *stream, const char *what);

/* build_decode / build_sparse for every backend: take the builder as
 * backend be's (pmla_builder_enter), check the batch against device_type,
 * remember the step, choose the split cap, let the backend plan it. A step
 * counts as built only when all of that succeeded. */
pmla_status pmla_build_dense(pmla_builder *b, const pmla_decode_batch *batch,
                             const pmla_backend *be, int device_type, pmla_plan_fn plan);
pmla_status pmla_build_sparse(pmla_builder *b, const pmla_sparse_batch *batch,
                              const pmla_backend *be, int device_type, pmla_plan_fn plan);

/* copy_buffer's argument checks for both backends, of a builder the
 * caller has taken (pmla_builder_enter). */
pmla_status pmla_check_copy_args(pmla_builder *b, pmla_buffer which,
                                 const void *dst, uint64_t bytes);

/* check_device_error's answer for the error word `bits` the backend read
 * (and cleared): writes *flags, explains set bits, returns the status. */
pmla_status pmla_device_error_status(pmla_builder *b, uint32_t bits, uint32_t *flags);

/* Answers the query call from b->info, for a builder its backend has looked
 * up (pmla_builder_check). */
pmla_status pmla_query_builder(const pmla_builder *b, pmla_builder_info *info);

/* The planner's input for the step in b->step (pointers as the backend
 * holds them: host for pmla-cpu, device for pmla). */
struct pmla_plan_input;
struct pmla_plan_output;
struct pmla_kv_map;
void pmla_step_plan_input(const pmla_builder *b, int32_t split_cap, struct pmla_plan_input *in);
/* The longest KV length a block-table request of the step may have: the
 * table's width in tokens, at most PMLA_MAX_KV_LEN. */
int32_t pmla_max_kv_len(const pmla_builder *b);
/* The builder's six schedule buffers as planner output. */
void pmla_plan_buffers(pmla_builder *b, struct pmla_plan_output *out);
/* How the step's positions map to slots of a cache of num_slots rows. */
void pmla_step_kv_map(const pmla_builder *b, int64_t num_slots, struct pmla_kv_map *map);

#endif
