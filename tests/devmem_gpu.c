/* SPDX-License-Identifier: MIT */
/* devmem_gpu.c - GPU memory, a stream and event timing through the CUDA
 * runtime (NVIDIA) or HIP (AMD), for tests and the benchmark. */
#include <stddef.h>
#include <stdio.h>

#include "devmem.h"

#if defined(PMLA_GPU_NVIDIA)
#include <cuda_runtime_api.h>
#define rt(x) cuda##x
#define RT_OK cudaSuccess
#define H2D cudaMemcpyHostToDevice
#define D2H cudaMemcpyDeviceToHost
#define D2D cudaMemcpyDeviceToDevice
typedef cudaStream_t rt_stream;
typedef cudaEvent_t rt_event;
typedef cudaGraph_t rt_graph;
typedef cudaGraphExec_t rt_graph_exec;
#define CAPTURE_MODE cudaStreamCaptureModeThreadLocal
#define DEVICE_TYPE kDLCUDA
#define NAME "cuda device 0"
#else
#include <hip/hip_runtime_api.h>
#define rt(x) hip##x
#define RT_OK hipSuccess
#define H2D hipMemcpyHostToDevice
#define D2H hipMemcpyDeviceToHost
#define D2D hipMemcpyDeviceToDevice
typedef hipStream_t rt_stream;
typedef hipEvent_t rt_event;
typedef hipGraph_t rt_graph;
typedef hipGraphExec_t rt_graph_exec;
#define CAPTURE_MODE hipStreamCaptureModeThreadLocal
#define DEVICE_TYPE kDLROCM
#define NAME "rocm device 0"
#endif

static rt_stream stream;
static rt_event ev_start, ev_stop;

static void *gpu_alloc(size_t bytes) {
  void *p = NULL;
  return rt(Malloc)(&p, bytes ? bytes : 4) == RT_OK ? p : NULL;
}
static void gpu_release(void *p) {
  if (p)
    rt(Free)(p);
}
static int gpu_upload(void *dst, const void *src, size_t n) {
  return rt(Memcpy)(dst, src, n, H2D) != RT_OK;
}
static int gpu_download(void *dst, const void *src, size_t n) {
  return rt(StreamSynchronize)(stream) != RT_OK || rt(Memcpy)(dst, src, n, D2H) != RT_OK;
}
static int gpu_fill(void *dst, int byte, size_t n) {
  return rt(MemsetAsync)(dst, byte, n, stream) != RT_OK;
}
static int gpu_copy(void *dst, const void *src, size_t n) {
  return rt(MemcpyAsync)(dst, src, n, D2D, stream) != RT_OK;
}
static void *gpu_stream(void) { return (void *)stream; }
static int gpu_timer_start(void) { return rt(EventRecord)(ev_start, stream) != RT_OK; }
static double gpu_timer_stop_us(void) {
  float ms = -1.f;
  if (rt(EventRecord)(ev_stop, stream) != RT_OK || rt(EventSynchronize)(ev_stop) != RT_OK ||
      rt(EventElapsedTime)(&ms, ev_start, ev_stop) != RT_OK)
    return -1.0;
  return (double)ms * 1e3;
}
static int gpu_sync(void) { return rt(StreamSynchronize)(stream) != RT_OK; }
static int gpu_mem_info(size_t *free_bytes, size_t *total_bytes) {
  return rt(MemGetInfo)(free_bytes, total_bytes) != RT_OK ? -1 : 0;
}

static rt_graph graph;
static rt_graph_exec graph_exec;
static int gpu_capture_begin(void) { return rt(StreamBeginCapture)(stream, CAPTURE_MODE) != RT_OK; }
static int gpu_capture_end(void) {
  rt_graph captured = NULL;
  /* End the capture before touching the previous graph: destroying one
   * while this thread captures would invalidate the capture. */
  int e = (int)rt(StreamEndCapture)(stream, &captured);
  if (e != (int)RT_OK) {
    fprintf(stderr, "devmem: stream capture failed: %s\n", rt(GetErrorString)(e));
    rt(GetLastError)();
    return 1;
  }
  if (graph_exec)
    rt(GraphExecDestroy)(graph_exec);
  if (graph)
    rt(GraphDestroy)(graph);
  graph = captured;
  graph_exec = NULL;
#if defined(PMLA_GPU_NVIDIA)
  return cudaGraphInstantiate(&graph_exec, graph, 0) != RT_OK;
#else /* HIP 5.2 keeps the CUDA 11 signature */
  return hipGraphInstantiate(&graph_exec, graph, NULL, NULL, 0) != RT_OK;
#endif
}
static int gpu_replay(void) { return rt(GraphLaunch)(graph_exec, stream) != RT_OK; }

static const devmem provider = {
    .name = NAME,
    .device_type = DEVICE_TYPE,
    .device_id = 0,
    .alloc = gpu_alloc,
    .release = gpu_release,
    .upload = gpu_upload,
    .download = gpu_download,
    .fill = gpu_fill,
    .copy = gpu_copy,
    .stream = gpu_stream,
    .timer_start = gpu_timer_start,
    .timer_stop_us = gpu_timer_stop_us,
    .sync = gpu_sync,
    .mem_info = gpu_mem_info,
    .capture_begin = gpu_capture_begin,
    .capture_end = gpu_capture_end,
    .replay = gpu_replay,
};

const devmem *devmem_gpu(const char **why) {
  static int state; /* 0 untried, 1 ready, -1 failed */
  static const char *reason;
  if (!state) {
    int n = 0;
    if (rt(GetDeviceCount)(&n) != RT_OK || n == 0)
      reason = "no GPU device present";
    else if (rt(SetDevice)(0) != RT_OK || rt(StreamCreate)(&stream) != RT_OK ||
             rt(EventCreate)(&ev_start) != RT_OK || rt(EventCreate)(&ev_stop) != RT_OK)
      reason = "cannot create a stream and events on device 0";
    state = reason ? -1 : 1;
  }
  if (state < 0) {
    if (why)
      *why = reason;
    return NULL;
  }
  return &provider;
}
