/* SPDX-License-Identifier: MIT */
/* devmem_cpu.c - host memory and wall-clock timing for pmla-cpu. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "devmem.h"

static void *cpu_alloc(size_t bytes) { return aligned_alloc(64, (bytes + 63) / 64 * 64 + 64); }
static void cpu_release(void *p) { free(p); }
static int cpu_copy(void *dst, const void *src, size_t n) {
  memcpy(dst, src, n);
  return 0;
}
static int cpu_fill(void *dst, int byte, size_t n) {
  memset(dst, byte, n);
  return 0;
}
static void *cpu_stream(void) { return NULL; }

static double started_us;
static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}
static int cpu_timer_start(void) {
  started_us = now_us();
  return 0;
}
static double cpu_timer_stop_us(void) { return now_us() - started_us; }
static int cpu_sync(void) { return 0; }
static int cpu_stream_new(void **out) {
  *out = NULL;
  return 0;
}
static int cpu_stream_sync(void *stream) {
  (void)stream;
  return 0;
}
static void cpu_stream_free(void *stream) { (void)stream; }
static int cpu_mem_info(size_t *free_bytes, size_t *total_bytes) {
  (void)free_bytes;
  (void)total_bytes;
  return -1;
}

const devmem devmem_cpu = {
    .name = "host",
    .device_type = kDLCPU,
    .device_id = 0,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .upload = cpu_copy,
    .download = cpu_copy,
    .fill = cpu_fill,
    .copy = cpu_copy,
    .stream = cpu_stream,
    .timer_start = cpu_timer_start,
    .timer_stop_us = cpu_timer_stop_us,
    .sync = cpu_sync,
    .stream_new = cpu_stream_new,
    .stream_sync = cpu_stream_sync,
    .stream_free = cpu_stream_free,
    .mem_info = cpu_mem_info,
    .capture_begin = NULL,
    .capture_end = NULL,
    .replay = NULL,
};
