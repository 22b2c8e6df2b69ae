/* SPDX-License-Identifier: MIT */
/* devmem_nogpu.c - the GPU half of devmem.h in a build without GPU support. */
#include "devmem.h"

static const char *const no_gpu =
    "the tests were built without GPU support (configure --with-hip=nvidia|amd)";

int devmem_gpu_count(void) { return 0; }

const devmem *devmem_gpu_on(int device, const char **why) {
  (void)device;
  if (why)
    *why = no_gpu;
  return NULL;
}

const devmem *devmem_gpu(const char **why) { return devmem_gpu_on(0, why); }

int devmem_gpu_current(void) { return -1; }

int devmem_gpu_has_context(void) { return -1; }

int devmem_gpu_set_current(int device) {
  (void)device;
  return -1;
}

int devmem_gpu_reset(int device) {
  (void)device;
  return -1;
}
