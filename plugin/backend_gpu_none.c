/* SPDX-License-Identifier: MIT */
/* backend_gpu_none.c - `pmla` in a build without HIP: every call answers
 * PMLA_ERR_NO_DEVICE so hosts can fall back to pmla-cpu. */
#include "backends.h"
#include "builder.h"

#define NO_GPU                                                                 \
  "backend pmla: no GPU support built (configure --with-hip=nvidia or --with-hip=amd); use " \
  "pmla-cpu"

/* No builder of this backend exists, so every call answers on the calling
 * thread (last_error(NULL)) and writes none of its outputs. */
static pmla_status no_gpu(const char *call) {
  return pmla_fail(NULL, PMLA_ERR_NO_DEVICE, "%s: " NO_GPU, call);
}

/* A builder given to this backend is another's, as none of its own exists:
 * refused as every backend refuses one, the message on the calling thread
 * (pmla_builder_check); NULL gets the answer of every call. */
static pmla_status no_gpu_b(const pmla_builder *b, const char *call) {
  if (!b)
    return no_gpu(call);
  const pmla_status st = pmla_builder_check(b, &pmla_gpu_backend, call);
  return st != PMLA_OK ? st : no_gpu(call);
}

static pmla_status no_gpu_init(const pmla_builder_config *config, pmla_builder **out) {
  (void)config;
  (void)out;
  return no_gpu("init_builder");
}

static void no_gpu_destroy(pmla_builder *b) { (void)b; }

static pmla_status no_gpu_query(const pmla_builder *b, pmla_builder_info *info) {
  (void)info;
  return no_gpu_b(b, "query_builder");
}

static pmla_status no_gpu_build_decode(pmla_builder *b, const pmla_decode_batch *batch) {
  (void)batch;
  return no_gpu_b(b, "build_decode");
}

static pmla_status no_gpu_build_sparse(pmla_builder *b, const pmla_sparse_batch *batch) {
  (void)batch;
  return no_gpu_b(b, "build_sparse");
}

static pmla_status no_gpu_decode(pmla_builder *b, const pmla_decode_args *args) {
  (void)args;
  return no_gpu_b(b, "decode");
}

static pmla_status no_gpu_check(pmla_builder *b, uint32_t *flags) {
  (void)flags;
  return no_gpu_b(b, "check_device_error");
}

static pmla_status no_gpu_copy(pmla_builder *b, pmla_buffer which, void *dst, uint64_t bytes) {
  (void)which;
  (void)dst;
  (void)bytes;
  return no_gpu_b(b, "copy_buffer");
}

const pmla_backend pmla_gpu_backend = {
    .struct_size = sizeof(pmla_backend),
    .abi_version = PMLA_ABI_VERSION,
    .name = "pmla",
    .description = "pmla persistent MLA decode on a GPU (not built: no HIP)",
    .init_builder = no_gpu_init,
    .destroy_builder = no_gpu_destroy,
    .query_builder = no_gpu_query,
    .build_decode = no_gpu_build_decode,
    .build_sparse = no_gpu_build_sparse,
    .decode = no_gpu_decode,
    .last_error = pmla_builder_last_error,
    .check_device_error = no_gpu_check,
    .copy_buffer = no_gpu_copy,
};
