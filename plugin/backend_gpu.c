/* SPDX-License-Identifier: MIT */
/* backend_gpu.c - `pmla`: buffers in GPU memory, the planner run by a
 * metadata kernel, the persistent decode kernel and its reduce. build_* and
 * decode only launch on the caller's stream: no host sync, no allocation, no
 * host-device copy, so a host can capture build + decode in one graph.
 * Device-side bad input is skipped by the kernels and ORed into the error
 * word (work_meta_data[PMLA_META_ERROR]); check_device_error reads it. */
#include "config.h"

#include <stdlib.h>
#include <string.h>
#if defined(PMLA_GPU_NVIDIA)
#include <cudaTypedefs.h>
#include <pthread.h>
#endif

#include "backends.h"
#include "builder.h"
#include "gpu_runtime.h"
#include "mla_gpu.h"
#include "planner.h"

/* What the builder's device runs, decided once at init (per builder, so
 * builders on different devices each get their own). */
typedef struct gpu_state {
  int32_t sm90;   /* pmla_gpu_prepare: the wgmma body runs on the device */
  int32_t min_mt; /* pmla_gpu_min_mt for this builder */
} gpu_state;

/* Runs the body with the builder's device current, restoring the caller's.
 * When that fails (ok 0) the call reports err and touches nothing: work
 * queued with another device current would run, or wait, on that device.
 * On NVIDIA the caller's context itself is put back (the driver's
 * cuCtxGetCurrent / cuCtxSetCurrent): restoring its device instead would
 * make a thread that had no context current (which the runtime reports as
 * device 0) create device 0's primary context, hundreds of MiB of device
 * memory, and would replace a host's own driver context by its device's
 * primary one. */
typedef struct device_scope {
  int previous, ok, has_ctx;
  void *ctx; /* the caller's driver context (a CUcontext; NULL: none), when has_ctx */
  gpu_error_t err;
} device_scope;

#if defined(PMLA_GPU_NVIDIA)
static PFN_cuCtxGetCurrent_v4000 ctx_get;
static PFN_cuCtxSetCurrent_v4000 ctx_set;
static pthread_once_t ctx_once = PTHREAD_ONCE_INIT;

static void ctx_lookup(void) {
  void *get = NULL, *set = NULL;
  enum cudaDriverEntryPointQueryResult q_get = cudaDriverEntryPointSymbolNotFound, q_set = q_get;
  if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get, 4000, cudaEnableDefault, &q_get) !=
          cudaSuccess ||
      cudaGetDriverEntryPointByVersion("cuCtxSetCurrent", &set, 4000, cudaEnableDefault, &q_set) !=
          cudaSuccess) {
    cudaGetLastError(); /* the lookup's own failure, not left for the host */
    return;
  }
  if (q_get != cudaDriverEntryPointSuccess || q_set != cudaDriverEntryPointSuccess)
    return; /* the device-number fallback */
  memcpy(&ctx_get, &get, sizeof get); /* object to function pointer, as POSIX's dlsym */
  memcpy(&ctx_set, &set, sizeof set);
}
#endif

static device_scope enter_device(int device) {
  device_scope s = {0, 0, 0, NULL, GPU_SUCCESS};
#if defined(PMLA_GPU_NVIDIA)
  pthread_once(&ctx_once, ctx_lookup);
  CUcontext ctx = NULL;
  s.has_ctx = ctx_get && ctx_get(&ctx) == CUDA_SUCCESS;
  s.ctx = ctx;
#endif
  s.err = gpuGetDevice(&s.previous);
  if (s.err == GPU_SUCCESS)
    s.err = gpuSetDevice(device);
  s.ok = s.err == GPU_SUCCESS;
  if (!s.ok)
    gpuGetLastError(); /* not left for the host's next check */
  return s;
}

static void leave_device(device_scope s) {
  if (!s.ok)
    return;
#if defined(PMLA_GPU_NVIDIA)
  /* a thread that had no context is never given one, even if the driver
   * refuses to clear it */
  if (s.has_ctx && (ctx_set((CUcontext)s.ctx) == CUDA_SUCCESS || !s.ctx))
    return;
#endif
  if (gpuSetDevice(s.previous) != GPU_SUCCESS)
    gpuGetLastError(); /* not left for the host's next check */
}

static pmla_status runtime_fail(pmla_builder *b, const char *what, int code) {
  return pmla_fail(b, PMLA_ERR_DEVICE, "%s: %s runtime error %d: %s", what, GPU_PLATFORM_NAME,
                   code, code > 0 ? pmla_gpu_error_string(code) : "unknown");
}

/* frees a builder of this backend, whole or partly made */
static void gpu_free(pmla_builder *b) {
  device_scope d = enter_device(b->cfg.device);
  for (int i = 0; i < PMLA_BUF_COUNT; i++)
    if (b->buf[i])
      gpuFree(b->buf[i]);
  leave_device(d);
  free(b->impl);
  free(b);
}

static void gpu_destroy(pmla_builder *b) {
  if (b && pmla_builder_forget(b, &pmla_gpu_backend))
    gpu_free(b);
}

static pmla_status gpu_init(const pmla_builder_config *config, pmla_builder **out) {
  pmla_builder_config cfg;
  pmla_status st;
  if ((st = pmla_validate_init(config, out, &cfg)))
    return st;
  int count = 0;
  gpu_error_t e = gpuGetDeviceCount(&count);
  if (e != GPU_SUCCESS)
    gpuGetLastError(); /* not left for the host's next check */
  if (e != GPU_SUCCESS || count == 0)
    return pmla_fail(NULL, PMLA_ERR_NO_DEVICE,
                     "init_builder: backend pmla: no GPU device (%s: %s); use pmla-cpu",
                     GPU_PLATFORM_NAME, e != GPU_SUCCESS ? gpuGetErrorString(e) : "0 devices");
  if (cfg.device >= count)
    return pmla_fail(NULL, PMLA_ERR_INVALID_ARGUMENT,
                     "init_builder: config.device = %d; accepted: 0..%d (devices present)",
                     cfg.device, count - 1);
  device_scope d = enter_device(cfg.device);
  int sms = 0;
  e = d.ok ? gpuMultiProcessorCount(&sms, cfg.device) : d.err;
  if (e != GPU_SUCCESS || sms < 1) {
    gpuGetLastError();
    leave_device(d);
    return pmla_fail(NULL, PMLA_ERR_DEVICE, "init_builder: cannot %s device %d: %s",
                     d.ok ? "query" : "switch to", cfg.device,
                     e != GPU_SUCCESS ? gpuGetErrorString(e) : "no multiprocessors reported");
  }
  /* a device none of the build's targets runs would fail every launch
   * (e.g. sm_90a code on a newer GPU): refused here, with what would run */
  const int image = pmla_gpu_image_error();
  if (image) {
    char arch[300];
    if (gpuArchName(arch, sizeof arch, cfg.device) != GPU_SUCCESS)
      gpuGetLastError();
    leave_device(d);
    return pmla_fail(NULL, PMLA_ERR_NO_DEVICE,
                     "init_builder: device %d (%s) cannot run this plugin's kernels, built for "
                     "%s: %s runtime error %d (%s); rebuild with configure --with-gpu-arch "
                     "naming this device's target",
                     cfg.device, arch, PMLA_GPU_ARCHS, GPU_PLATFORM_NAME, image,
                     pmla_gpu_error_string(image));
  }
  uint32_t cus = cfg.cu_count ? cfg.cu_count : (uint32_t)sms;
  pmla_builder *b = calloc(1, sizeof *b);
  if (!b) {
    leave_device(d);
    return pmla_fail(NULL, PMLA_ERR_OUT_OF_MEMORY, "init_builder: out of host memory");
  }
  gpu_state *s = calloc(1, sizeof *s);
  if (!s) {
    free(b);
    leave_device(d);
    return pmla_fail(NULL, PMLA_ERR_OUT_OF_MEMORY, "init_builder: out of host memory");
  }
  b->backend = &pmla_gpu_backend;
  b->cfg = cfg;
  b->impl = s;
  s->sm90 = pmla_gpu_prepare();
  s->min_mt = pmla_gpu_min_mt(s->sm90);
  int32_t units = pmla_gpu_sched_units((int32_t)cus, (int32_t)cfg.num_heads, (int32_t)cfg.max_q_len,
                                       s->min_mt);
  pmla_size_buffers(b, cus, (uint32_t)(units < PMLA_GPU_MAX_UNITS ? units : PMLA_GPU_MAX_UNITS));
  static const char *const buf_name[PMLA_BUF_COUNT] = {
      "work_meta_data",     "work_indptr",        "work_info_set", "reduce_indptr",
      "reduce_final_map",   "reduce_partial_map", "partial_out",   "partial_lse"};
  for (int i = 0; i < PMLA_BUF_COUNT; i++) {
    size_t bytes = (size_t)b->info.buffer_bytes[i];
    const int allocated = (e = gpuMalloc(&b->buf[i], bytes ? bytes : 4)) == GPU_SUCCESS;
    if (allocated)
      e = gpuMemset(b->buf[i], 0, bytes ? bytes : 4);
    if (e != GPU_SUCCESS) {
      gpuGetLastError(); /* clear the sticky-free error state */
      const uint64_t total = b->info.total_bytes;
      const int invariant = pmla_batch_invariant(b); /* b is freed next */
      gpu_free(b);
      leave_device(d);
      /* only a refused allocation is a lack of memory; anything else is
       * the runtime's failure, named */
      return pmla_fail(NULL, !allocated && e == GPU_OUT_OF_MEMORY ? PMLA_ERR_OUT_OF_MEMORY
                                                                   : PMLA_ERR_DEVICE,
                       "init_builder: cannot %s %zu bytes (buffer %s) on device %d: %s; the "
                       "builder needs %llu bytes in all (fewer with a smaller max_batch, "
                       "cu_count, max_q_len or num_heads%s)",
                       allocated ? "zero" : "allocate", bytes, buf_name[i], cfg.device,
                       gpuGetErrorString(e), (unsigned long long)total,
                       invariant ? ", or no PMLA_BUILDER_BATCH_INVARIANT" : "");
    }
  }
  /* cudaMemset returns before the zeros land, on the legacy stream, which a
   * host's non-blocking streams do not wait for: the first step's kernels
   * could run under it. init_builder is never captured, so it waits. */
  if ((e = gpuDeviceSynchronize()) != GPU_SUCCESS) {
    gpuGetLastError();
    gpu_free(b);
    leave_device(d);
    return pmla_fail(NULL, PMLA_ERR_DEVICE, "init_builder: %s runtime error %d (%s) zeroing "
                     "the buffers on device %d", GPU_PLATFORM_NAME, (int)e,
                     gpuGetErrorString(e), cfg.device);
  }
  leave_device(d);
  if (!pmla_builder_adopt(b)) {
    gpu_free(b);
    return pmla_fail(NULL, PMLA_ERR_OUT_OF_MEMORY, "init_builder: out of host memory");
  }
  *out = b;
  return PMLA_OK;
}

static pmla_status gpu_plan(pmla_builder *b, int32_t cap, void *stream, const char *what) {
  pmla_plan_input in;
  pmla_plan_output o;
  pmla_step_plan_input(b, cap, &in);
  pmla_plan_buffers(b, &o);
  device_scope d = enter_device(b->cfg.device);
  if (!d.ok)
    return runtime_fail(b, what, (int)d.err);
  int rc = pmla_gpu_plan(&in, &o, stream);
  leave_device(d);
  if (rc)
    return runtime_fail(b, what, rc);
  return PMLA_OK;
}

static pmla_status gpu_build_decode(pmla_builder *b, const pmla_decode_batch *batch) {
  return pmla_build_dense(b, batch, &pmla_gpu_backend, GPU_DLPACK_DEVICE, gpu_plan);
}

static pmla_status gpu_build_sparse(pmla_builder *b, const pmla_sparse_batch *batch) {
  return pmla_build_sparse(b, batch, &pmla_gpu_backend, GPU_DLPACK_DEVICE, gpu_plan);
}

static pmla_status decode_taken(pmla_builder *b, const pmla_decode_args *args) {
  pmla_decode_args a;
  int64_t num_slots;
  pmla_status st;
  pmla_clear_error(b);
  if ((st = pmla_check_decode_args(b, args, GPU_DLPACK_DEVICE, &a, &num_slots)))
    return st;
  /* the kernels move q, kv_cache and out in 16-byte pieces (cp.async, TMA) */
  const DLTensor *aligned[3] = {a.q, a.kv_cache, a.out};
  static const char *const aligned_name[3] = {"decode: args->q", "decode: args->kv_cache",
                                              "decode: args->out"};
  for (int i = 0; i < 3; i++)
    if ((st = pmla_check_alignment(b, aligned_name[i], aligned[i], 16,
                                   "the pmla backend moves q, kv_cache and out in 16-byte "
                                   "pieces")))
      return st;
  if ((st = pmla_check_no_overlap(b, &a)))
    return st;
  pmla_gpu_problem p;
  memset(&p, 0, sizeof p);
  p.num_heads = (int32_t)b->cfg.num_heads;
  p.max_q_len = (int32_t)b->cfg.max_q_len;
  p.softmax_scale = b->cfg.softmax_scale;
  p.num_units = (int32_t)b->info.sched_units;
  const gpu_state *s = b->impl;
  p.min_mt = s->min_mt;
  p.sm90 = s->sm90;
  p.q = pmla_tensor_data(a.q);
  p.num_tokens = a.q->shape[0];
  p.kv = pmla_tensor_data(a.kv_cache);
  p.kv_format = pmla_kv_format_of(b->cfg.kv_dtype);
  p.kv_scale = a.kv_scale ? pmla_tensor_data(a.kv_scale) : NULL;
  pmla_step_kv_map(b, num_slots, &p.map);
  p.qo_indptr = b->step.kind == PLAN_DENSE ? b->step.qo_indptr : NULL;
  p.out = pmla_tensor_data(a.out);
  p.lse = a.lse ? pmla_tensor_data(a.lse) : NULL;
  p.partial_out = b->buf[PMLA_BUF_PARTIAL_OUT];
  p.partial_lse = b->buf[PMLA_BUF_PARTIAL_LSE];
  p.work_meta_data = b->buf[PMLA_BUF_WORK_META_DATA];
  p.work_indptr = b->buf[PMLA_BUF_WORK_INDPTR];
  p.work_info_set = b->buf[PMLA_BUF_WORK_INFO_SET];
  p.reduce_indptr = b->buf[PMLA_BUF_REDUCE_INDPTR];
  p.reduce_final_map = b->buf[PMLA_BUF_REDUCE_FINAL_MAP];
  p.reduce_partial_map = b->buf[PMLA_BUF_REDUCE_PARTIAL_MAP];
  p.max_slots = (int32_t)b->info.max_partial_slots;
  p.fold = pmla_batch_invariant(b);
  device_scope d = enter_device(b->cfg.device);
  if (!d.ok)
    return runtime_fail(b, "decode", (int)d.err);
  int rc = pmla_gpu_decode(&p, a.stream);
  leave_device(d);
  return rc ? runtime_fail(b, "decode", rc) : PMLA_OK;
}

static pmla_status gpu_decode(pmla_builder *b, const pmla_decode_args *args) {
  pmla_status st = pmla_builder_enter(b, &pmla_gpu_backend, "decode");
  return st ? st : pmla_builder_leave(b, decode_taken(b, args));
}

static pmla_status gpu_query(const pmla_builder *b, pmla_builder_info *info) {
  pmla_status st = pmla_builder_enter(b, &pmla_gpu_backend, "query_builder");
  return st ? st : pmla_builder_leave(b, pmla_query_builder(b, info));
}

static pmla_status device_error_taken(pmla_builder *b, uint32_t *flags) {
  int32_t meta[PMLA_META_WORDS];
  device_scope d = enter_device(b->cfg.device);
  if (!d.ok)
    return runtime_fail(b, "check_device_error", (int)d.err);
  gpu_error_t e = gpuDeviceSynchronize();
  if (e == GPU_SUCCESS)
    e = gpuMemcpyDtoH(meta, b->buf[PMLA_BUF_WORK_META_DATA], sizeof meta);
  /* the clear lands before the call returns, so no later step's bit can
   * be wiped by it (cudaMemset may return before it is done) */
  if (e == GPU_SUCCESS && meta[PMLA_META_ERROR] &&
      (e = gpuMemset((int32_t *)b->buf[PMLA_BUF_WORK_META_DATA] + PMLA_META_ERROR, 0, 4)) ==
          GPU_SUCCESS)
    e = gpuDeviceSynchronize();
  if (e != GPU_SUCCESS)
    gpuGetLastError();
  leave_device(d);
  if (e != GPU_SUCCESS)
    return runtime_fail(b, "check_device_error", (int)e);
  return pmla_device_error_status(b, (uint32_t)meta[PMLA_META_ERROR], flags);
}

static pmla_status gpu_check_device_error(pmla_builder *b, uint32_t *flags) {
  pmla_status st = pmla_builder_enter(b, &pmla_gpu_backend, "check_device_error");
  return st ? st : pmla_builder_leave(b, device_error_taken(b, flags));
}

static pmla_status copy_taken(pmla_builder *b, pmla_buffer which, void *dst, uint64_t bytes) {
  pmla_status st = pmla_check_copy_args(b, which, dst, bytes);
  if (st != PMLA_OK)
    return st;
  device_scope d = enter_device(b->cfg.device);
  if (!d.ok)
    return runtime_fail(b, "copy_buffer", (int)d.err);
  gpu_error_t e = gpuDeviceSynchronize();
  if (e == GPU_SUCCESS)
    e = gpuMemcpyDtoH(dst, b->buf[which], (size_t)bytes);
  if (e != GPU_SUCCESS)
    gpuGetLastError();
  leave_device(d);
  return e == GPU_SUCCESS ? PMLA_OK : runtime_fail(b, "copy_buffer", (int)e);
}

static pmla_status gpu_copy_buffer(pmla_builder *b, pmla_buffer which, void *dst, uint64_t bytes) {
  pmla_status st = pmla_builder_enter(b, &pmla_gpu_backend, "copy_buffer");
  return st ? st : pmla_builder_leave(b, copy_taken(b, which, dst, bytes));
}

const pmla_backend pmla_gpu_backend = {
    .struct_size = sizeof(pmla_backend),
    .abi_version = PMLA_ABI_VERSION,
    .name = "pmla",
    .description = "pmla persistent MLA decode on a GPU (" GPU_PLATFORM_NAME ")",
    .init_builder = gpu_init,
    .destroy_builder = gpu_destroy,
    .query_builder = gpu_query,
    .build_decode = gpu_build_decode,
    .build_sparse = gpu_build_sparse,
    .decode = gpu_decode,
    .last_error = pmla_builder_last_error,
    .check_device_error = gpu_check_device_error,
    .copy_buffer = gpu_copy_buffer,
};
