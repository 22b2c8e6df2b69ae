/* SPDX-License-Identifier: MIT */
/* pmla.h - the pmla plugin ABI: MLA decode attention backends behind a
 * versioned C vtable, loaded with dlopen.
 *
 * Versioning (negotiated, Vulkan loader style)
 *   A version is PMLA_VERSION(major, minor). The host calls the plugin's one
 *   exported symbol, PMLA_ENTRY_SYMBOL, offering the range of versions it
 *   speaks; the plugin answers the highest version inside that range that it
 *   implements, or refuses with PMLA_ERR_VERSION (no common major). Minor
 *   versions only append: new struct members and new vtable slots go at the
 *   end, never in the middle, and the offsets of 1.0 are frozen by the static
 *   asserts at the bottom of this file.
 *
 * struct_size (PJRT style)
 *   Every struct that crosses the ABI starts with `uint32_t struct_size`,
 *   which the writer sets to sizeof() as it was compiled. A plugin accepts a
 *   larger struct_size from a newer host (it ignores the tail) and refuses a
 *   size smaller than its 1.0 prefix with PMLA_ERR_STRUCT_SIZE. A host reads an
 *   appended vtable slot or member only after PMLA_HAS_MEMBER says it is there.
 *
 * Errors
 *   Every call returns a pmla_status. On error nothing is written to outputs
 *   and nothing leaks (two exceptions: check_device_error's
 *   PMLA_ERR_DEVICE_INPUT writes the bits it found to *flags, and a GPU
 *   decode whose reduce the runtime refuses to launch returns
 *   PMLA_ERR_DEVICE with the rows of its unsplit requests written). last_error()
 *   gives a message naming the argument, the value given and what is
 *   accepted. For a failed init_builder (no builder exists yet) call
 *   last_error(NULL) on the same thread. A call given a pointer that is not
 *   a live builder (destroyed, or never made) is refused without reading
 *   through it, and last_error(pointer) gives the message on the same
 *   thread; a builder given to another backend of the plugin is refused
 *   the same way. (A destroyed builder's address that a later
 *   init_builder reuses is that new builder.) decode's out and lse may
 *   share no byte with its inputs (q, kv_cache, kv_scale, the step's index
 *   tensors) or with each other.
 *
 * Threading
 *   Builders are independent: many may live in one process and be used from
 *   many threads at once. One builder is used by one thread at a time (the
 *   host serialises calls on it, and orders on its streams the work they
 *   queue): a call made while another thread is inside a call on the same
 *   builder is refused with PMLA_ERR_BAD_STATE, its message given by
 *   last_error(builder) on the refused thread (destroy_builder then leaves
 *   the builder as it is). Besides builders, the plugin keeps the
 *   list of its live builders (one lock, held for a lookup by every call)
 *   and process-wide caches that every thread may fill and that never
 *   change results: the GPU backend's per-device opt-in of each kernel's shared
 *   memory (a bit per device, set atomically) and the driver's tensor-map
 *   encoder (looked up once). Failed init_builder messages are per thread.
 *   After fork(), a child may go on using a pmla-cpu builder made before the
 *   fork (its units then run on the calling thread: the builder's worker
 *   threads stayed in the parent) when no other thread was inside a pmla
 *   call at the fork; GPU builders do not survive fork, as their runtime
 *   does not.
 *
 * Plan/run
 *   build_decode / build_sparse fill the builder's persistent schedule for one
 *   step and remember the page table (or top-k index) tensors; the host keeps
 *   those tensors alive and unchanged until the last decode of that step.
 *   decode may then be called any number of times (once per layer).
 *   Neither allocates: every buffer is sized and allocated by init_builder.
 *   (Under CUDA's lazy module loading, the default since CUDA 12.2, the
 *   driver loads each kernel variant at its first launch, which takes device
 *   memory for its code: a host that must see no allocation at all runs a
 *   step of each kind once before it counts.)
 *   GPU work is queued on the stream each call is given. Queue a step's
 *   build_*, its decodes and the next step's build_* on one stream (or order
 *   them with events): the next build overwrites the schedule earlier
 *   decodes read. A failed build_* leaves the builder with no step (decode
 *   answers PMLA_ERR_BAD_STATE) until the next successful one.
 *   build_* and decode only queue work, so a CUDA/HIP graph may capture
 *   them; init_builder, destroy_builder, check_device_error and copy_buffer
 *   allocate, free or wait for the device, which invalidates a capture that
 *   another thread runs in the global capture mode (the default of
 *   cudaStreamBeginCapture and torch.cuda.graph): call them outside such a
 *   capture, or capture in thread-local mode.
 */
#ifndef PMLA_H
#define PMLA_H

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

/* major and minor are 0..0xffff. Both are converted to uint32_t before the
 * shift, so every major (0x8000 and up too) is defined; the result is an
 * integer constant expression when they are. */
#define PMLA_VERSION(major, minor) ((uint32_t)(((uint32_t)(major) << 16) | (uint32_t)(minor)))
#define PMLA_VERSION_MAJOR(v) ((uint32_t)(v) >> 16)
#define PMLA_VERSION_MINOR(v) ((uint32_t)(v) & 0xffffu)

#define PMLA_ABI_MAJOR 1
#define PMLA_ABI_MINOR 1
#define PMLA_ABI_VERSION PMLA_VERSION(PMLA_ABI_MAJOR, PMLA_ABI_MINOR)

/* The most query heads a builder serves (any count from 1; the kernels pad
 * to their row tile, the host pads nothing). */
#define PMLA_MAX_HEADS 128u

/* The most KV tokens of one dense request (2^30): a longer kv_lens entry,
 * or CSR pages holding more, is refused by pmla-cpu at build_decode and
 * flagged PMLA_DEVERR_KV_LEN (the request attends nothing) by the GPU. */
#define PMLA_MAX_KV_LEN (1u << 30)

/* The one symbol a plugin exports; its type is pmla_entry_fn. */
#define PMLA_ENTRY_SYMBOL "pmla_plugin_entry"

/* True when a struct written with `struct_size` holds `member` entirely. */
#define PMLA_HAS_MEMBER(ptr, type, member)                                    \
  ((ptr) != NULL && (size_t)(ptr)->struct_size >=                             \
                        offsetof(type, member) + sizeof(((type *)0)->member))

typedef enum pmla_status {
  PMLA_OK = 0,
  PMLA_ERR_INVALID_ARGUMENT = 1, /* a value outside what is accepted */
  PMLA_ERR_UNSUPPORTED = 2,      /* well-formed but not served (head count, dtype) */
  PMLA_ERR_VERSION = 3,          /* no ABI version in common */
  PMLA_ERR_STRUCT_SIZE = 4,      /* struct_size smaller than the 1.0 prefix */
  PMLA_ERR_CAPACITY = 5,         /* beyond the limits fixed at init_builder */
  PMLA_ERR_NO_DEVICE = 6,        /* no GPU, no GPU support built, or none for this GPU */
  PMLA_ERR_OUT_OF_MEMORY = 7,    /* only init_builder allocates */
  PMLA_ERR_DEVICE = 8,           /* the GPU runtime reported an error */
  PMLA_ERR_BAD_STATE = 9,        /* e.g. decode before any build */
  PMLA_ERR_DEVICE_INPUT = 10,    /* kernels flagged bad device-side input */
  PMLA_ERR_INTERNAL = 11
} pmla_status;

/* Element types. q and out are bf16; the KV cache (config.kv_dtype) may be
 * stored in FP8 since 1.1, dequantised by the kernels as they load it:
 *   FP8_E4M3    576 float8_e4m3fn values per token (uint8 or float8_e4m3fn
 *               tensor), value = e4m3 * kv_scale (one fp32 per cache, read
 *               from pmla_decode_args.kv_scale)
 *   FP8_DS_MLA  656 bytes per token (uint8 tensor), DeepSeek V3.2's layout:
 *               bytes 0..511 the 512 latent values as e4m3 in 4 tiles of 128,
 *               512..527 one fp32 scale per tile (value = e4m3 * scale),
 *               528..655 the 64 rope values as bf16 */
typedef enum pmla_dtype {
  PMLA_DTYPE_BF16 = 1,
  PMLA_DTYPE_FP8_E4M3 = 2, /* KV cache only; 1.0 plugins refuse it */
  PMLA_DTYPE_FP8_DS_MLA = 3 /* KV cache only; since 1.1 */
} pmla_dtype;

/* Bytes per token of a KV cache of each kv_dtype. */
#define PMLA_KV_TOKEN_BYTES_BF16 1152
#define PMLA_KV_TOKEN_BYTES_FP8_E4M3 576
#define PMLA_KV_TOKEN_BYTES_FP8_DS_MLA 656

/* How build_decode receives the paged KV layout. */
typedef enum pmla_kv_layout {
  PMLA_KV_BLOCK_TABLE = 1, /* vLLM: block_table[batch][pages] + kv_lens[batch] */
  PMLA_KV_CSR = 2          /* AITER/FlashInfer: kv_indptr, kv_indices, kv_last_page_len */
} pmla_kv_layout;

/* Bits of the device error word (see check_device_error). Kernels that meet
 * bad device-side input skip it (never fault) and OR a bit in. */
enum pmla_device_error_bits {
  PMLA_DEVERR_KV_LEN = 1u << 0,      /* negative, beyond the pages given, > PMLA_MAX_KV_LEN */
  PMLA_DEVERR_PAGE_INDEX = 1u << 1,  /* page index outside the KV cache */
  PMLA_DEVERR_SLOT_INDEX = 1u << 2,  /* sparse slot outside the KV cache */
  PMLA_DEVERR_QO_INDPTR = 1u << 3,   /* qo_indptr not monotone / rows > max_q_len */
  PMLA_DEVERR_LAST_PAGE = 1u << 4,   /* kv_last_page_len outside 1..page_size */
  PMLA_DEVERR_KV_SCALE = 1u << 5,    /* 1.1: kv_scale not finite and > 0 (nothing attended) */
  /* 1.1 names it (1.0 plugins set it too): a step outgrew a bound of the
   * schedule the plugin derived at init. A pmla defect, never bad input;
   * the work past the bound is skipped. Please report it. */
  PMLA_DEVERR_SCHEDULE = 1u << 15
};

/* The persistent buffers a builder holds, in query order.
 * With R = max_batch * max_q_len (requests: dense uses max_batch of them,
 * sparse schedules each query token as its own request), N = the builder's
 * scheduling units (query: sched_units), all int32 unless noted:
 *   work_meta_data     PMLA_META_WORDS            counts, mode, error word
 *   work_indptr        N + 1                      work items of unit n
 *   work_info_set      (R + N) * PMLA_WORK_INFO_WORDS
 *   reduce_indptr      R + 1                      partials of reduce entry k
 *   reduce_final_map   R                          request of reduce entry k
 *   reduce_partial_map 2 * N                      partial slot ids
 *   partial_out  fp32  2 * N * max_q_len * heads * 512
 *   partial_lse  fp32  2 * N * max_q_len * heads
 * A request split into k pieces uses k partial slots; the planner proves at
 * most 2N slots and R + N work items exist for any batch within the limits.
 * A PMLA_BUILDER_BATCH_INVARIANT builder has R * 64 + N work items (a
 * request has at most 64 chunks) and 9N to 65N partial slots (8N for split
 * requests, more where slots are small: up to 64N while all slots take at
 * most 256 MiB; then one accumulator per unit); its partial buffers and
 * reduce_partial_map are sized by that slot count (query_builder). */
typedef enum pmla_buffer {
  PMLA_BUF_WORK_META_DATA = 0,
  PMLA_BUF_WORK_INDPTR = 1,
  PMLA_BUF_WORK_INFO_SET = 2,
  PMLA_BUF_REDUCE_INDPTR = 3,
  PMLA_BUF_REDUCE_FINAL_MAP = 4,
  PMLA_BUF_REDUCE_PARTIAL_MAP = 5,
  PMLA_BUF_PARTIAL_OUT = 6,
  PMLA_BUF_PARTIAL_LSE = 7,
  PMLA_BUF_COUNT = 8
} pmla_buffer;

typedef struct pmla_builder pmla_builder; /* opaque, one per host context */

typedef struct pmla_builder_config {
  uint32_t struct_size;
  uint32_t num_heads;     /* query heads: 1..PMLA_MAX_HEADS (128) */
  uint32_t kv_lora_rank;  /* latent dim, 512 */
  uint32_t rope_dim;      /* 64 */
  uint32_t q_dtype;       /* pmla_dtype; bf16 */
  uint32_t kv_dtype;      /* pmla_dtype; bf16, or (1.1) fp8_e4m3 or fp8_ds_mla */
  uint32_t out_dtype;     /* pmla_dtype; bf16 */
  uint32_t page_size;     /* power of two, 1..256 */
  uint32_t max_batch;     /* requests per step, 1..65536 */
  uint32_t max_q_len;     /* query tokens per request, 1..8 (MTP), causal */
  uint32_t topk;          /* sparse top-k; 0 = dense only, else 1..65536 */
  float softmax_scale;    /* > 0, at most FLT_MAX / log2(e); usually 576^-0.5 */
  int32_t device;         /* GPU ordinal; must be 0 for pmla-cpu */
  uint32_t cu_count;      /* 0 = all CUs / the CPUs of the calling
                           * thread's affinity mask; else 1..1024 */
  /* --- 1.1 --- */
  /* pmla_builder_flags; absent (1.0 host) = 0. A 1.0 plugin ignores it (the
   * tail of a larger struct): a host that needs a flag checks that the
   * backend's agreed version is 1.1 or later. */
  uint32_t flags;
  /* Batch-invariant builders: the least chunk, in KV positions (tokens;
   * top-k positions on sparse steps), a multiple of 64 in 64..1048576; 0 =
   * pmla's, 2048 (dense) and 1024 (sparse). A request of L positions is
   * read in chunks of max(invariant_chunk, L / 64 rounded up to a multiple
   * of 64), and a dense request of at most 2 * invariant_chunk tokens in
   * one. Results depend on it (it is part of the fixed configuration): a
   * larger chunk merges fewer pieces, faster for large batches, and splits
   * long requests of small batches over fewer units (docs/design.md,
   * "Batch-invariant mode"). Must be 0 without PMLA_BUILDER_BATCH_INVARIANT;
   * absent (a host built before it) = 0. */
  uint32_t invariant_chunk;
} pmla_builder_config;

/* The 1.0 size of pmla_builder_config: a host built against 1.0 passes it. */
#define PMLA_BUILDER_CONFIG_SIZE_1_0 56u

/* pmla_builder_config.flags (1.1) */
enum pmla_builder_flags {
  /* A request's out and lse are bitwise the same whatever else is in the
   * step (the other requests, their order, the batch size) and whatever
   * cu_count is: they depend only on its own q, KV and length and the
   * builder's fixed configuration. Bitwise equality holds per backend and
   * device model. A request is read in chunks whose boundaries depend on
   * its length alone and their results are merged in one fixed order, by
   * the unit that ran them or by the reduce; the schedule still balances
   * the step over the units. */
  PMLA_BUILDER_BATCH_INVARIANT = 1u << 0
};

typedef struct pmla_builder_info {
  uint32_t struct_size;
  uint32_t cu_count;      /* CUs (GPU) or worker threads (CPU) */
  uint32_t sched_units;   /* N: planner units (GPU: CUs / head tiles) */
  uint32_t split_cap;     /* per-request split cap of the last build (0 = uncapped) */
  uint32_t max_requests;  /* R */
  uint32_t max_work_items;
  uint32_t max_partial_slots;
  uint32_t reserved;
  uint64_t buffer_bytes[PMLA_BUF_COUNT];
  uint64_t total_bytes;   /* everything the builder holds */
} pmla_builder_info;

/* Dense step. All tensors int32, on the backend's device, contiguous. */
typedef struct pmla_decode_batch {
  uint32_t struct_size;
  uint32_t kv_layout;                 /* pmla_kv_layout */
  const DLTensor *qo_indptr;          /* [batch + 1], rows of q per request; q holds
                                         qo_indptr[batch] rows, and those of q / out /
                                         lse before qo_indptr[0] are not touched */
  const DLTensor *block_table;        /* BLOCK_TABLE: [batch, max_pages] */
  const DLTensor *kv_lens;            /* BLOCK_TABLE: [batch] tokens */
  const DLTensor *kv_indptr;          /* CSR: [batch + 1] into kv_indices */
  const DLTensor *kv_indices;         /* CSR: [nnz_pages] */
  const DLTensor *kv_last_page_len;   /* CSR: [batch], 1..page_size (or 0 pages) */
  void *stream;                       /* cudaStream_t / hipStream_t; CPU: NULL */
} pmla_decode_batch;

/* Sparse (DSA) step: each query token attends its own top-k KV slots. */
/* pmla_sparse_batch.flags */
enum pmla_sparse_flags {
  PMLA_SPARSE_NO_SPLIT_CAP = 1u << 0 /* schedule uncapped, over every CU (for measuring the cap) */
};

typedef struct pmla_sparse_batch {
  uint32_t struct_size;
  uint32_t flags;                /* pmla_sparse_flags */
  const DLTensor *topk_indices;  /* int32 [tokens, topk]: page*page_size+offset, -1 unused */
  int64_t max_seq_len;           /* host-side max KV length of the step, >= 0 */
  void *stream;
} pmla_sparse_batch;

typedef struct pmla_decode_args {
  uint32_t struct_size;
  uint32_t reserved;
  const DLTensor *q;        /* bf16 [tokens, heads, 576] */
  /* [pages, page_size, W] or [pages, page_size, 1, W]: bf16 W = 576;
   * fp8_e4m3 uint8 or float8_e4m3fn W = 576; fp8_ds_mla uint8 W = 656 */
  const DLTensor *kv_cache;
  /* A row that sees no KV position gets out 0 and lse -inf; a row with a
   * NaN score (a NaN in its q, or in a KV row it sees) gets NaN in every
   * out value and in lse, however its request is scheduled. A NaN in a KV
   * row that only a later query of the same step sees may also reach an
   * earlier query's out (its weight 0 times NaN), that row's lse finite. */
  DLTensor *out;            /* bf16 [tokens, heads, 512] */
  DLTensor *lse;            /* optional fp32 [tokens, heads] (natural log); NULL skips */
  void *stream;
  /* --- 1.1 --- */
  /* fp32 [1] on the backend's device: the dequantisation scale of an
   * fp8_e4m3 cache, read by the kernels at each decode (a captured graph
   * replays with the value the tensor holds then). Required for fp8_e4m3,
   * ignored for the other kv_dtypes. */
  const DLTensor *kv_scale;
} pmla_decode_args;

/* The 1.0 size of pmla_decode_args: a host built against 1.0 passes it. */
#define PMLA_DECODE_ARGS_SIZE_1_0 48u

typedef struct pmla_backend {
  uint32_t struct_size;
  uint32_t abi_version;     /* highest version this backend implements */
  const char *name;         /* registry name, e.g. "pmla-cpu" */
  const char *description;

  /* --- 1.0 --- */
  pmla_status (*init_builder)(const pmla_builder_config *config, pmla_builder **out);
  /* NULL, and any pointer that is not a live builder of this backend, are
   * ignored */
  void (*destroy_builder)(pmla_builder *builder);
  pmla_status (*query_builder)(const pmla_builder *builder, pmla_builder_info *info);
  pmla_status (*build_decode)(pmla_builder *builder, const pmla_decode_batch *batch);
  pmla_status (*build_sparse)(pmla_builder *builder, const pmla_sparse_batch *batch);
  pmla_status (*decode)(pmla_builder *builder, const pmla_decode_args *args);
  /* Message of the last failed call on builder; NULL builder: the last failed
   * init_builder on this thread. Never NULL; "" when there is none. */
  const char *(*last_error)(const pmla_builder *builder);
  /* Waits for the builder's pending work (on a GPU: for all work on its
   * device), reads and clears the device error word
   * (pmla_device_error_bits). Returns PMLA_ERR_DEVICE_INPUT when set. */
  pmla_status (*check_device_error)(pmla_builder *builder, uint32_t *flags);
  /* Copies one persistent buffer to host memory (waits for pending work);
   * `bytes` must equal buffer_bytes[which]. For tests and debugging. */
  pmla_status (*copy_buffer)(pmla_builder *builder, pmla_buffer which, void *host_dst,
                             uint64_t bytes);
} pmla_backend;

typedef struct pmla_plugin {
  uint32_t struct_size;
  uint32_t abi_version;     /* highest version the plugin implements */
  const char *name;
  const char *version;      /* the plugin's own release string */
  uint32_t backend_count;
  uint32_t reserved;
  const pmla_backend *const *backends;
} pmla_plugin;

typedef struct pmla_negotiation {
  uint32_t struct_size;
  uint32_t host_min_version;  /* in: lowest version the host speaks */
  uint32_t host_max_version;  /* in: highest */
  uint32_t agreed_version;    /* out: the version both will use */
  const pmla_plugin *plugin;  /* out: valid until dlclose */
  char message[256];          /* out: why negotiation failed */
} pmla_negotiation;

typedef pmla_status (*pmla_entry_fn)(pmla_negotiation *negotiation);

/* Work-item and metadata layouts, shared by every backend (what copy_buffer
 * returns). work_info_set item k, int32 words: 0 request, 1 partial slot
 * (-1: writes the final output), 2..3 query rows [begin, end) of the step,
 * 4..5 KV positions [begin, end) of the request, 6 the request's KV length,
 * 7 the piece's index within its request. Unit n runs items
 * work_indptr[n] .. work_indptr[n + 1] in order. work_meta_data words:
 * 0 items, 1 reduce entries, 2 partial slots used, 3 schedule mode (0 units
 * filled in order, 1 capped pieces, 2 batch-invariant chunks: word 7 of an
 * item then also carries flags above bit 16, and an item may fold into its
 * slot instead of overwriting it, 3 (1.1) every request whole, one item
 * each, the units' items in no request order), 4 the most partial slots one request's
 * reduce entry merges (1 where no request splits, 0 in a step of no
 * requests), 5 requests,
 * 6 the device error word, 7 query rows. Reduce entry k merges partial
 * slots reduce_partial_map[reduce_indptr[k] .. reduce_indptr[k + 1]] into
 * request reduce_final_map[k]. */
#define PMLA_WORK_INFO_WORDS 8
#define PMLA_META_WORDS 8

/* Frozen 1.0 layout (LP64). Appending is fine; moving anything is not. */
#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L && defined(__LP64__)
_Static_assert(offsetof(pmla_negotiation, plugin) == 16, "1.0 layout");
_Static_assert(offsetof(pmla_negotiation, message) == 24, "1.0 layout");
_Static_assert(offsetof(pmla_plugin, backends) == 32, "1.0 layout");
_Static_assert(offsetof(pmla_backend, init_builder) == 24, "1.0 layout");
_Static_assert(offsetof(pmla_backend, copy_buffer) == 88, "1.0 layout");
_Static_assert(sizeof(pmla_backend) == 96, "1.0 layout");
_Static_assert(offsetof(pmla_builder_config, softmax_scale) == 44, "1.0 layout");
_Static_assert(offsetof(pmla_builder_config, flags) == PMLA_BUILDER_CONFIG_SIZE_1_0,
               "1.1 layout");
_Static_assert(sizeof(pmla_builder_config) == 64, "1.1 layout");
_Static_assert(offsetof(pmla_builder_info, buffer_bytes) == 32, "1.0 layout");
_Static_assert(sizeof(pmla_builder_info) == 104, "1.0 layout");
_Static_assert(offsetof(pmla_decode_batch, stream) == 56, "1.0 layout");
_Static_assert(sizeof(pmla_decode_batch) == 64, "1.0 layout");
_Static_assert(offsetof(pmla_sparse_batch, max_seq_len) == 16, "1.0 layout");
_Static_assert(sizeof(pmla_sparse_batch) == 32, "1.0 layout");
_Static_assert(offsetof(pmla_decode_args, stream) == 40, "1.0 layout");
_Static_assert(offsetof(pmla_decode_args, kv_scale) == PMLA_DECODE_ARGS_SIZE_1_0, "1.1 layout");
_Static_assert(sizeof(pmla_decode_args) == 56, "1.1 layout");
#endif

#ifdef __cplusplus
}
#endif
#endif /* PMLA_H */
