/* SPDX-License-Identifier: MIT */
/* devmem_nogpu.c - devmem_gpu() in a build without GPU support. */
#include "devmem.h"

const devmem *devmem_gpu(const char **why) {
  if (why)
    *why = "the tests were built without GPU support (configure --with-hip=nvidia|amd)";
  return NULL;
}
