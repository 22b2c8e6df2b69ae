/* SPDX-License-Identifier: MIT */
/* devmem_gpu.c - GPU memory, a stream, event timing and a graph per device
 * through the CUDA runtime (NVIDIA) or HIP (AMD), for tests and the
 * benchmark. Every call runs inside a device scope: the provider's device
 * made current, the caller's current device restored after (devmem.h). */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "devmem.h"

#if defined(PMLA_GPU_NVIDIA)
#include <cuda.h>
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
#define PLATFORM "cuda"
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
#define PLATFORM "rocm"
#endif

typedef struct gpu {
  int id;
  int state; /* 0 untried, 1 ready, -1 failed (reason) */
  rt_stream stream;
  rt_event ev_start, ev_stop;
  rt_graph graph;
  rt_graph_exec graph_exec;
  char name[32], reason[128];
  devmem provider;
} gpu;

static gpu gpus[DEVMEM_MAX_GPUS];
static pthread_mutex_t create_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- the device scope ---- */
typedef struct scope {
  int previous, ok, switched;
} scope;

static scope enter(const gpu *g) {
  scope s = {0, 0, 0};
  s.ok = rt(GetDevice)(&s.previous) == RT_OK;
  if (s.ok && s.previous != g->id) /* setting the current device again costs a call */
    s.ok = s.switched = rt(SetDevice)(g->id) == RT_OK;
  return s;
}
/* Restores the caller's device; returns `failed`, or 1 when the scope was
 * not entered or restoring fails. */
static int leave(scope s, int failed) {
  if (s.switched && rt(SetDevice)(s.previous) != RT_OK)
    return 1;
  return failed || !s.ok;
}
/* Runs `call` (a runtime call) with g's device current: 0 ok, 1 failed. */
#define IN_DEVICE(g, call)                                                                 \
  do {                                                                                     \
    scope s_ = enter(g);                                                                   \
    int e_ = s_.ok ? (call) != RT_OK : 1;                                                  \
    return leave(s_, e_);                                                                  \
  } while (0)

/* ---- what every provider does, given its device ---- */
static void *gpu_alloc(gpu *g, size_t bytes) {
  void *p = NULL;
  scope s = enter(g);
  int e = s.ok ? rt(Malloc)(&p, bytes ? bytes : 4) != RT_OK : 1;
  return leave(s, e) ? NULL : p;
}
static void gpu_release(gpu *g, void *p) {
  if (!p)
    return;
  scope s = enter(g);
  if (s.ok)
    rt(Free)(p);
  leave(s, 0);
}
/* a copy from pageable memory may return before its DMA lands, ordered
 * only for blocking streams: waiting for it serves non-blocking ones too */
static int gpu_upload(gpu *g, void *dst, const void *src, size_t n) {
  scope s = enter(g);
  int e = !s.ok || rt(Memcpy)(dst, src, n, H2D) != RT_OK || rt(StreamSynchronize)(0) != RT_OK;
  return leave(s, e);
}
static int gpu_download(gpu *g, void *dst, const void *src, size_t n) {
  scope s = enter(g);
  int e = !s.ok || rt(StreamSynchronize)(g->stream) != RT_OK ||
          rt(Memcpy)(dst, src, n, D2H) != RT_OK;
  return leave(s, e);
}
static int gpu_fill(gpu *g, void *dst, int byte, size_t n) {
  IN_DEVICE(g, rt(MemsetAsync)(dst, byte, n, g->stream));
}
static int gpu_copy(gpu *g, void *dst, const void *src, size_t n) {
  IN_DEVICE(g, rt(MemcpyAsync)(dst, src, n, D2D, g->stream));
}
static int gpu_timer_start(gpu *g) { IN_DEVICE(g, rt(EventRecord)(g->ev_start, g->stream)); }
static double gpu_timer_stop_us(gpu *g) {
  float ms = -1.f;
  scope s = enter(g);
  int e = !s.ok || rt(EventRecord)(g->ev_stop, g->stream) != RT_OK ||
          rt(EventSynchronize)(g->ev_stop) != RT_OK ||
          rt(EventElapsedTime)(&ms, g->ev_start, g->ev_stop) != RT_OK;
  return leave(s, e) ? -1.0 : (double)ms * 1e3;
}
static int gpu_sync(gpu *g) { IN_DEVICE(g, rt(StreamSynchronize)(g->stream)); }
/* non-blocking: nothing on the legacy default stream orders it */
static int gpu_stream_new(gpu *g, void **out) {
  rt_stream st = NULL;
  scope s = enter(g);
  int e = s.ok ? rt(StreamCreateWithFlags)(&st, rt(StreamNonBlocking)) != RT_OK : 1;
  *out = (void *)st;
  return leave(s, e);
}
static int gpu_stream_sync(gpu *g, void *st) { IN_DEVICE(g, rt(StreamSynchronize)((rt_stream)st)); }
static void gpu_stream_free(gpu *g, void *st) {
  scope s = enter(g);
  if (s.ok && st)
    rt(StreamDestroy)((rt_stream)st);
  leave(s, 0);
}
static int gpu_mem_info(gpu *g, size_t *free_bytes, size_t *total_bytes) {
  scope s = enter(g);
  int e = !s.ok || rt(MemGetInfo)(free_bytes, total_bytes) != RT_OK;
  return leave(s, e) ? -1 : 0;
}
static int gpu_capture_begin(gpu *g) {
  IN_DEVICE(g, rt(StreamBeginCapture)(g->stream, CAPTURE_MODE));
}
static int gpu_capture_end(gpu *g) {
  rt_graph captured = NULL;
  scope s = enter(g);
  if (!s.ok)
    return leave(s, 1);
  /* End the capture before touching the previous graph: destroying one
   * while this thread captures would invalidate the capture. */
  int e = (int)rt(StreamEndCapture)(g->stream, &captured);
  if (e != (int)RT_OK) {
    fprintf(stderr, "devmem: stream capture on %s failed: %s\n", g->name,
            rt(GetErrorString)(e));
    rt(GetLastError)();
    return leave(s, 1);
  }
  if (g->graph_exec)
    rt(GraphExecDestroy)(g->graph_exec);
  if (g->graph)
    rt(GraphDestroy)(g->graph);
  g->graph = captured;
  g->graph_exec = NULL;
#if defined(PMLA_GPU_NVIDIA)
  e = cudaGraphInstantiate(&g->graph_exec, g->graph, 0) != RT_OK;
#else /* HIP 5.2 keeps the CUDA 11 signature */
  e = hipGraphInstantiate(&g->graph_exec, g->graph, NULL, NULL, 0) != RT_OK;
#endif
  return leave(s, e);
}
static int gpu_replay(gpu *g) { IN_DEVICE(g, rt(GraphLaunch)(g->graph_exec, g->stream)); }

/* ---- one table of entry points per device: devmem's calls take no
 * context, so device i's entries are thunks bound to gpus[i] ---- */
#define THUNKS(i)                                                                                 \
  static void *alloc_##i(size_t n) { return gpu_alloc(&gpus[i], n); }                             \
  static void release_##i(void *p) { gpu_release(&gpus[i], p); }                                  \
  static int upload_##i(void *d, const void *s, size_t n) {                                       \
    return gpu_upload(&gpus[i], d, s, n);                                                         \
  }                                                                                               \
  static int download_##i(void *d, const void *s, size_t n) {                                     \
    return gpu_download(&gpus[i], d, s, n);                                                       \
  }                                                                                               \
  static int fill_##i(void *d, int b, size_t n) { return gpu_fill(&gpus[i], d, b, n); }           \
  static int copy_##i(void *d, const void *s, size_t n) { return gpu_copy(&gpus[i], d, s, n); }   \
  static void *stream_##i(void) { return (void *)gpus[i].stream; }                                \
  static int timer_start_##i(void) { return gpu_timer_start(&gpus[i]); }                          \
  static double timer_stop_us_##i(void) { return gpu_timer_stop_us(&gpus[i]); }                   \
  static int sync_##i(void) { return gpu_sync(&gpus[i]); }                                        \
  static int mem_info_##i(size_t *f, size_t *t) { return gpu_mem_info(&gpus[i], f, t); }          \
  static int stream_new_##i(void **o) { return gpu_stream_new(&gpus[i], o); }                     \
  static int stream_sync_##i(void *st) { return gpu_stream_sync(&gpus[i], st); }                  \
  static void stream_free_##i(void *st) { gpu_stream_free(&gpus[i], st); }                        \
  static int capture_begin_##i(void) { return gpu_capture_begin(&gpus[i]); }                      \
  static int capture_end_##i(void) { return gpu_capture_end(&gpus[i]); }                          \
  static int replay_##i(void) { return gpu_replay(&gpus[i]); }
#define TABLE(i)                                                                                  \
  {.device_type = DEVICE_TYPE, .device_id = i, .alloc = alloc_##i, .release = release_##i,        \
   .upload = upload_##i, .download = download_##i, .fill = fill_##i, .copy = copy_##i,            \
   .stream = stream_##i, .timer_start = timer_start_##i, .timer_stop_us = timer_stop_us_##i,      \
   .sync = sync_##i, .mem_info = mem_info_##i, .stream_new = stream_new_##i,                      \
   .stream_sync = stream_sync_##i, .stream_free = stream_free_##i,                                \
   .capture_begin = capture_begin_##i,                                                            \
   .capture_end = capture_end_##i, .replay = replay_##i},
#define EACH_GPU(X)                                                                        \
  X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)

EACH_GPU(THUNKS)
static const devmem tables[DEVMEM_MAX_GPUS] = {EACH_GPU(TABLE)};
_Static_assert(DEVMEM_MAX_GPUS == 16, "EACH_GPU lists DEVMEM_MAX_GPUS devices");

/* ---- the public calls ---- */
int devmem_gpu_count(void) {
  int n = 0;
  return rt(GetDeviceCount)(&n) == RT_OK ? n : 0;
}

static void create(gpu *g, int device) {
  int n = devmem_gpu_count();
  g->id = device;
  snprintf(g->name, sizeof g->name, PLATFORM " device %d", device);
  if (n == 0) {
    snprintf(g->reason, sizeof g->reason, "no GPU device present");
  } else if (device >= n) {
    snprintf(g->reason, sizeof g->reason, "no GPU device %d (devices present: 0..%d)", device,
             n - 1);
  } else {
    scope s = enter(g);
    int e = !s.ok || rt(StreamCreate)(&g->stream) != RT_OK ||
            rt(EventCreate)(&g->ev_start) != RT_OK || rt(EventCreate)(&g->ev_stop) != RT_OK;
    if (leave(s, e))
      snprintf(g->reason, sizeof g->reason, "cannot create a stream and events on device %d",
               device);
  }
  g->provider = tables[device];
  g->provider.name = g->name;
  g->state = g->reason[0] ? -1 : 1;
}

const devmem *devmem_gpu_on(int device, const char **why) {
  if (device < 0 || device >= DEVMEM_MAX_GPUS) {
    if (why)
      *why = device < 0 ? "a negative GPU device number"
                        : "a GPU device number past 15 (DEVMEM_MAX_GPUS in tests/devmem.h)";
    return NULL;
  }
  gpu *g = &gpus[device];
  pthread_mutex_lock(&create_lock);
  if (!g->state)
    create(g, device);
  pthread_mutex_unlock(&create_lock);
  if (g->state < 0) {
    if (why)
      *why = g->reason;
    return NULL;
  }
  return &g->provider;
}

const devmem *devmem_gpu(const char **why) { return devmem_gpu_on(0, why); }

int devmem_gpu_current(void) {
  int d = -1;
  return rt(GetDevice)(&d) == RT_OK ? d : -1;
}

int devmem_gpu_set_current(int device) { return rt(SetDevice)(device) != RT_OK; }

int devmem_gpu_has_context(void) {
#if defined(PMLA_GPU_NVIDIA)
  void *get = NULL;
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get, 4000, cudaEnableDefault, &q) !=
          cudaSuccess ||
      q != cudaDriverEntryPointSuccess)
    return -1;
  CUresult (*ctx_get)(CUcontext *);
  memcpy(&ctx_get, &get, sizeof get);
  CUcontext c = NULL;
  return ctx_get(&c) == CUDA_SUCCESS ? c != NULL : -1;
#else
  return -1;
#endif
}

int devmem_gpu_reset(int device) {
  const devmem *m = devmem_gpu_on(device, NULL);
  if (!m)
    return -1;
  gpu *g = &gpus[device];
  pthread_mutex_lock(&create_lock);
  scope s = enter(g);
  /* the reset destroys the stream, events and graph with the context */
  int e = !s.ok || rt(DeviceReset)() != RT_OK;
  g->graph = NULL;
  g->graph_exec = NULL;
  g->stream = NULL;
  g->ev_start = g->ev_stop = NULL;
  e = e || rt(StreamCreate)(&g->stream) != RT_OK || rt(EventCreate)(&g->ev_start) != RT_OK ||
      rt(EventCreate)(&g->ev_stop) != RT_OK;
  e = leave(s, e);
  if (e) {
    snprintf(g->reason, sizeof g->reason, "device %d: reset, then no stream and events", device);
    g->state = -1;
  }
  pthread_mutex_unlock(&create_lock);
  return e;
}
