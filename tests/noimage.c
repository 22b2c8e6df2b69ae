/* SPDX-License-Identifier: MIT */
/* noimage.c - a GPU the build has no kernels for is refused: init_builder
 * of the GPU backend answers PMLA_ERR_NO_DEVICE, leaves *out as it was, and
 * says which device, that the plugin's kernels cannot run on it and how to
 * rebuild; nothing is left behind, so the next init_builder on the same
 * device (the kernels found) makes a builder that works.
 *
 *   noimage [PLUGIN.so]     env: PMLA_CONFORMANCE_PLUGIN
 *
 * The runtime's answer is simulated: this program defines the runtime's
 * function-attribute query (cudaFuncGetAttributes, hipFuncGetAttributes),
 * exported (-export-dynamic), so the plugin's calls resolve here; while
 * `no_image` is set it answers the runtime's "no kernel image for this
 * device" (209 on both platforms), else it forwards to the runtime library
 * the plugin loaded. Exit 0 pass, 1 fail, 77 skip (no GPU backend in the
 * plugin, no GPU, or a runtime linked so that its calls do not reach
 * here), 99 hard error. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pmla.h"
#include "pmla_registry.h"
#include "test_config.h"

#ifndef PMLA_TEST_DEFAULT_PLUGIN
#define PMLA_TEST_DEFAULT_PLUGIN "plugin/.libs/pmla.so"
#endif

/* cudaErrorNoKernelImageForDevice, hipErrorNoBinaryForGpu */
#define NO_IMAGE 209

static int no_image, asked;

/* the loaded runtime library's path (the first object whose name holds
 * `part`), for dlsym: it was loaded with the plugin, outside the global
 * scope that RTLD_NEXT searches */
struct find {
  const char *part;
  char path[4096];
};
static int find_lib(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  struct find *f = data;
  if (info->dlpi_name && strstr(info->dlpi_name, f->part)) {
    snprintf(f->path, sizeof f->path, "%s", info->dlpi_name);
    return 1;
  }
  return 0;
}
typedef int (*attr_fn)(void *attr, const void *func);
/* the query `name` of runtime `lib`; *next caches the runtime's own */
static int query(const char *lib, const char *name, attr_fn *next, void *attr,
                 const void *func) {
  asked++;
  if (no_image)
    return NO_IMAGE;
  if (!*next) {
    struct find f = {lib, ""};
    dl_iterate_phdr(find_lib, &f);
    void *h = f.path[0] ? dlopen(f.path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    *next = h ? (attr_fn)dlsym(h, name) : NULL;
    if (!*next) {
      fprintf(stderr, "noimage: %s not found in a loaded %s\n", name, lib);
      exit(99);
    }
  }
  return (*next)(attr, func);
}
int cudaFuncGetAttributes(void *attr, const void *func);
int cudaFuncGetAttributes(void *attr, const void *func) {
  static attr_fn next;
  return query("libcudart", "cudaFuncGetAttributes", &next, attr, func);
}
int hipFuncGetAttributes(void *attr, const void *func);
int hipFuncGetAttributes(void *attr, const void *func) {
  static attr_fn next;
  return query("libamdhip64", "hipFuncGetAttributes", &next, attr, func);
}

static int failures;
__attribute__((format(printf, 1, 2))) static void fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("FAIL: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  failures++;
}

int main(int argc, char **argv) {
  const char *plugin = test_plugin(argc, argv, PMLA_TEST_DEFAULT_PLUGIN, "noimage");
  if (!plugin)
    return 99;
  pmla_registry *reg = NULL;
  if (pmla_registry_open(plugin, &reg) != PMLA_OK)
    return 99;
  const pmla_backend *be = pmla_registry_find(reg, "pmla");
  if (!be) {
    printf("SKIP: noimage: %s has no GPU backend\n", plugin);
    pmla_registry_close(reg);
    return 77;
  }
  const pmla_builder_config cfg = test_config(16, 64, 4, 1, 0, 0);
  /* the kernels found: a builder, and the query reached this program */
  pmla_builder *b = NULL;
  pmla_status st = be->init_builder(&cfg, &b);
  if (st != PMLA_OK) {
    printf("SKIP: noimage: the GPU backend makes no builder here (%s)\n", be->last_error(NULL));
    pmla_registry_close(reg);
    return 77;
  }
  be->destroy_builder(b);
  if (asked == 0) {
    printf("SKIP: noimage: the plugin's runtime calls do not reach this program\n");
    pmla_registry_close(reg);
    return 77;
  }
  /* no kernels for the device: refused, named, nothing made */
  no_image = 1;
  pmla_builder *const poison = (pmla_builder *)&failures; /* must come back as it was */
  b = poison;
  st = be->init_builder(&cfg, &b);
  const char *msg = be->last_error(NULL);
  if (st != PMLA_ERR_NO_DEVICE || b != poison)
    fail("init_builder without kernels for the device: status %d, *out %p (want %d, %p kept)",
         (int)st, (void *)b, (int)PMLA_ERR_NO_DEVICE, (void *)poison);
  if (!msg || !strstr(msg, "device 0") || !strstr(msg, "cannot run this plugin's kernels") ||
      !strstr(msg, "rebuild"))
    fail("the refusal does not name the device, the cause and the fix: \"%s\"",
         msg ? msg : "(null)");
  else
    printf("ok: refused: %s\n", msg);
  /* the kernels found again: the next builder on the device works */
  no_image = 0;
  b = NULL;
  st = be->init_builder(&cfg, &b);
  if (st != PMLA_OK || !b) {
    fail("init_builder after a refusal: status %d (%s)", (int)st, be->last_error(NULL));
  } else {
    pmla_builder_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    uint32_t flags = 1;
    if (be->query_builder(b, &info) != PMLA_OK || info.cu_count == 0 ||
        be->check_device_error(b, &flags) != PMLA_OK || flags != 0)
      fail("the builder made after a refusal: query %u units, device error flags 0x%x (%s)",
           info.cu_count, flags, be->last_error(b));
    else
      printf("ok: a builder after the refusal (%u units)\n", info.cu_count);
    be->destroy_builder(b);
  }
  pmla_registry_close(reg);
  if (failures)
    return 1;
  printf("PASS: a device without the build's kernels is refused, and nothing is left behind\n");
  return 0;
}
