/* SPDX-License-Identifier: MIT */
/* mock_plugin.c - tiny plugins built only for the registry tests. Compiled
 * once per MOCK_KIND:
 *   1 wrong major    speaks 2.0 only                      backend "mock-wrong-major"
 *   2 old minor      speaks 1.0 only                      backend "mock-old-minor"
 *   3 new minor      speaks 1.0 .. 1.2                    backend "mock-new-minor"
 *   4 short vtable   backend struct_size < 1.0 vtable     backend "mock-short"
 *   5 dup a          backends "mock-dup" (a) and "pmla-cpu" (mock)
 *   6 dup b          backend "mock-dup" (b)
 * Its backends refuse to build anything (PMLA_ERR_UNSUPPORTED): only their
 * names and descriptions are looked at. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "pmla.h"

#ifndef MOCK_KIND
#error "define MOCK_KIND"
#endif

#if MOCK_KIND == 1
#define MOCK_MIN PMLA_VERSION(2, 0)
#define MOCK_MAX PMLA_VERSION(2, 0)
#define MOCK_NAME "mock-wrong-major"
#elif MOCK_KIND == 2
#define MOCK_MIN PMLA_VERSION(1, 0)
#define MOCK_MAX PMLA_VERSION(1, 0)
#define MOCK_NAME "mock-old-minor"
#elif MOCK_KIND == 3
#define MOCK_MIN PMLA_VERSION(1, 0)
#define MOCK_MAX PMLA_VERSION(1, 2)
#define MOCK_NAME "mock-new-minor"
#elif MOCK_KIND == 4
#define MOCK_MIN PMLA_VERSION(1, 0)
#define MOCK_MAX PMLA_VERSION(1, 0)
#define MOCK_NAME "mock-short"
/* ends before check_device_error and copy_buffer */
#define MOCK_BACKEND_SIZE offsetof(pmla_backend, check_device_error)
#elif MOCK_KIND == 5
#define MOCK_MIN PMLA_VERSION(1, 0)
#define MOCK_MAX PMLA_VERSION(1, 0)
#define MOCK_NAME "mock-dup"
#define MOCK_DESC "dup-a"
#define MOCK_SECOND_NAME "pmla-cpu"
#elif MOCK_KIND == 6
#define MOCK_MIN PMLA_VERSION(1, 0)
#define MOCK_MAX PMLA_VERSION(1, 0)
#define MOCK_NAME "mock-dup"
#define MOCK_DESC "dup-b"
#else
#error "unknown MOCK_KIND"
#endif

#ifndef MOCK_BACKEND_SIZE
#define MOCK_BACKEND_SIZE sizeof(pmla_backend)
#endif
#ifndef MOCK_DESC
#define MOCK_DESC "mock backend for the conformance suite"
#endif

static pmla_status mock_init(const pmla_builder_config *config, pmla_builder **out) {
  (void)config;
  (void)out;
  return PMLA_ERR_UNSUPPORTED;
}
static void mock_destroy(pmla_builder *b) { (void)b; }
static pmla_status mock_query(const pmla_builder *b, pmla_builder_info *info) {
  (void)b;
  (void)info;
  return PMLA_ERR_BAD_STATE;
}
static pmla_status mock_build_decode(pmla_builder *b, const pmla_decode_batch *batch) {
  (void)b;
  (void)batch;
  return PMLA_ERR_BAD_STATE;
}
static pmla_status mock_build_sparse(pmla_builder *b, const pmla_sparse_batch *batch) {
  (void)b;
  (void)batch;
  return PMLA_ERR_BAD_STATE;
}
static pmla_status mock_decode(pmla_builder *b, const pmla_decode_args *args) {
  (void)b;
  (void)args;
  return PMLA_ERR_BAD_STATE;
}
static const char *mock_last_error(const pmla_builder *b) {
  (void)b;
  return "mock backend: builds nothing";
}
static pmla_status mock_check(pmla_builder *b, uint32_t *flags) {
  (void)b;
  if (flags)
    *flags = 0;
  return PMLA_ERR_BAD_STATE;
}
static pmla_status mock_copy(pmla_builder *b, pmla_buffer which, void *dst, uint64_t bytes) {
  (void)b;
  (void)which;
  (void)dst;
  (void)bytes;
  return PMLA_ERR_BAD_STATE;
}

static const pmla_backend mock_backend = {
    MOCK_BACKEND_SIZE, MOCK_MAX,          MOCK_NAME,         MOCK_DESC,     mock_init,
    mock_destroy,      mock_query,        mock_build_decode, mock_build_sparse,
    mock_decode,       mock_last_error,   mock_check,        mock_copy};

#ifdef MOCK_SECOND_NAME
static const pmla_backend mock_second = {
    MOCK_BACKEND_SIZE, MOCK_MAX,          MOCK_SECOND_NAME,  "mock shadowing backend",
    mock_init,         mock_destroy,      mock_query,        mock_build_decode,
    mock_build_sparse, mock_decode,       mock_last_error,   mock_check,
    mock_copy};
static const pmla_backend *const mock_backends[] = {&mock_backend, &mock_second};
#else
static const pmla_backend *const mock_backends[] = {&mock_backend};
#endif

static const pmla_plugin mock_plugin = {sizeof(pmla_plugin), MOCK_MAX, "mock-" MOCK_NAME,
                                        "0.0-test",
                                        (uint32_t)(sizeof mock_backends / sizeof mock_backends[0]),
                                        0, mock_backends};

__attribute__((visibility("default"))) pmla_status pmla_plugin_entry(pmla_negotiation *n) {
  if (!n)
    return PMLA_ERR_INVALID_ARGUMENT;
  if (n->struct_size < offsetof(pmla_negotiation, message) + sizeof n->message)
    return PMLA_ERR_STRUCT_SIZE;
  uint32_t lo = n->host_min_version > MOCK_MIN ? n->host_min_version : MOCK_MIN;
  uint32_t hi = n->host_max_version < MOCK_MAX ? n->host_max_version : MOCK_MAX;
  if (lo > hi) {
    snprintf(n->message, sizeof n->message,
             "mock plugin speaks %u.%u..%u.%u; host offered %u.%u..%u.%u",
             PMLA_VERSION_MAJOR(MOCK_MIN), PMLA_VERSION_MINOR(MOCK_MIN),
             PMLA_VERSION_MAJOR(MOCK_MAX), PMLA_VERSION_MINOR(MOCK_MAX),
             PMLA_VERSION_MAJOR(n->host_min_version), PMLA_VERSION_MINOR(n->host_min_version),
             PMLA_VERSION_MAJOR(n->host_max_version), PMLA_VERSION_MINOR(n->host_max_version));
    return PMLA_ERR_VERSION;
  }
  n->agreed_version = hi;
  n->plugin = &mock_plugin;
  n->message[0] = '\0';
  return PMLA_OK;
}
