/* SPDX-License-Identifier: MIT */
/* devmem.h - memory and timing where a backend wants its tensors: host
 * memory for pmla-cpu, GPU memory (CUDA or HIP runtime) for pmla. Shared by
 * the conformance suite and the benchmark; knows nothing of the plugin. */
#ifndef PMLA_TEST_DEVMEM_H
#define PMLA_TEST_DEVMEM_H

#include <stddef.h>

#include <dlpack/dlpack.h>

typedef struct devmem {
  const char *name;
  DLDeviceType device_type;
  int device_id;
  void *(*alloc)(size_t bytes);          /* NULL on failure */
  void (*release)(void *ptr);
  int (*upload)(void *dst, const void *host_src, size_t bytes);   /* 0 ok */
  int (*download)(void *host_dst, const void *src, size_t bytes);
  int (*fill)(void *dst, int byte, size_t bytes);                /* on the stream */
  int (*copy)(void *dst, const void *src, size_t bytes);        /* device to device */
  void *(*stream)(void);                                          /* what pmla calls take */
  /* Times what runs between start and stop on the stream (µs). */
  int (*timer_start)(void);
  double (*timer_stop_us)(void);
  int (*sync)(void);
  /* Streams of the caller's own (pmla-cpu: NULL, which it ignores), for
   * work that must not be ordered behind the provider's stream: new (0 ok),
   * wait for everything queued on it (0 ok), destroy. */
  int (*stream_new)(void **out);
  int (*stream_sync)(void *stream);
  void (*stream_free)(void *stream);
  /* Free and total device memory, for "no allocation" checks; -1 unknown. */
  int (*mem_info)(size_t *free_bytes, size_t *total_bytes);
  /* Graph capture of the stream (NULL where there are no graphs): begin,
   * end (instantiates, replacing any earlier graph), replay. 0 ok. */
  int (*capture_begin)(void);
  int (*capture_end)(void);
  int (*replay)(void);
} devmem;

extern const devmem devmem_cpu;

/* ---- GPUs (the CUDA or HIP runtime; stubs in a build without them) ----
 * One provider per device, created on first use and kept: its own stream,
 * timing events and graph. Each of its calls makes its device current and
 * restores the calling thread's current device before returning (the
 * promise the pmla backend makes too), so providers of several devices
 * serve one thread, or one thread each. Creation is thread-safe. */
#define DEVMEM_MAX_GPUS 16

/* How many GPUs the runtime sees; 0 without any (or without GPU support). */
int devmem_gpu_count(void);
/* The provider of GPU `device`, or NULL when the tests were built without
 * GPU support, the device is not present or its stream cannot be created
 * (reason in *why). */
const devmem *devmem_gpu_on(int device, const char **why);
/* devmem_gpu_on(0, why). */
const devmem *devmem_gpu(const char **why);
/* The calling thread's current GPU, -1 on failure (or without GPU support);
 * setting it returns 0 on success. For tests of the current-device promise. */
int devmem_gpu_current(void);
int devmem_gpu_set_current(int device);
/* Whether the calling thread has a driver context current: 1 yes, 0 none,
 * -1 unknown (no driver entry point, AMD, or no GPU support). */
int devmem_gpu_has_context(void);
/* Resets GPU `device` as a host may (cudaDeviceReset / hipDeviceReset):
 * every allocation, stream and graph made on it is gone. Its provider
 * gets a new stream and events and keeps serving. 0 on success. */
int devmem_gpu_reset(int device);

#endif
