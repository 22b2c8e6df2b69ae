/* SPDX-License-Identifier: MIT */
/* mock_plugin.c - tiny plugins built only for the registry tests. Compiled
 * once per MOCK_KIND:
 *   1 wrong major    speaks 2.0 only                      backend "mock-wrong-major"
 *   2 old minor      speaks 1.0 only                      backend "mock-old-minor"
 *   3 new minor      speaks 1.0 .. 1.2                    backend "mock-new-minor"
 *   4 short vtable   backend struct_size < 1.0 vtable     backend "mock-short"
 *   5 dup a          backends "mock-dup" (a) and "pmla-cpu" (mock)
 *   6 dup b          backend "mock-dup" (b)
 *   7 unterminated message  refuses every host; its message fills all the
 *                    bytes of pmla_negotiation.message with '#', no NUL
 *   8 no descriptor  answers PMLA_OK with the version but a NULL plugin
 *   9 null backends  descriptor lists 2 backends, backends array NULL
 *  10 unnamed        backends: NULL, one with a NULL name, one named "",
 *                    "mock-no-decode" (decode NULL), then "mock-named"
 *  11 dup within     "mock-twice" (first) and "mock-twice" (second)
 *  12 huge count     backend_count UINT32_MAX, array of one "mock-huge"
 *  13 no backends    a valid descriptor that lists none
 *  14 idle           speaks 1.0 .. 1.1, backend "pmla-cpu" whose every call
 *                    succeeds and whose decode writes nothing (pmla-bench's
 *                    --check must fail it, also beside the real pmla-cpu)
 *  15 exiting        as 14, but decode calls exit(0) (pmla-conformance must
 *                    fail a test whose process ends that way)
 *  16 odd backends   speaks 1.0 .. 1.1; backends: one with a 300-byte name,
 *                    "mock-other-major" (abi_version 2.0),
 *                    "mock-older-backend" (1.0), then "mock-odd" (1.1),
 *                    whose description is Latin-1, not UTF-8
 * Other kinds' backends refuse to build anything (PMLA_ERR_UNSUPPORTED):
 * only their names and descriptions are looked at. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
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
/* one member short: ends before copy_buffer, the 1.0 vtable's last */
#define MOCK_BACKEND_SIZE offsetof(pmla_backend, copy_buffer)
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
#elif MOCK_KIND == 7
#define MOCK_MIN PMLA_VERSION(1, 0)
#define MOCK_MAX PMLA_VERSION(1, 0)
#define MOCK_NAME "mock-unterminated"
#define MOCK_UNTERMINATED_MESSAGE 1
#elif MOCK_KIND == 8
#define MOCK_MIN PMLA_VERSION(1, 0)
#define MOCK_MAX PMLA_VERSION(1, 0)
#define MOCK_NAME "mock-no-descriptor"
#define MOCK_NO_DESCRIPTOR 1
#elif MOCK_KIND == 9
#define MOCK_MIN PMLA_VERSION(1, 0)
#define MOCK_MAX PMLA_VERSION(1, 0)
#define MOCK_NAME "mock-null-backends"
#define MOCK_NULL_BACKENDS 1
#define MOCK_BACKEND_COUNT 2u
#elif MOCK_KIND == 10
#define MOCK_MIN PMLA_VERSION(1, 0)
#define MOCK_MAX PMLA_VERSION(1, 0)
#define MOCK_NAME "mock-named"
#define MOCK_UNNAMED 1
#elif MOCK_KIND == 11
#define MOCK_MIN PMLA_VERSION(1, 0)
#define MOCK_MAX PMLA_VERSION(1, 0)
#define MOCK_NAME "mock-twice"
#define MOCK_DESC "first"
#define MOCK_TWICE 1
#elif MOCK_KIND == 12
#define MOCK_MIN PMLA_VERSION(1, 0)
#define MOCK_MAX PMLA_VERSION(1, 0)
#define MOCK_NAME "mock-huge"
#define MOCK_BACKEND_COUNT UINT32_MAX
#elif MOCK_KIND == 13
#define MOCK_MIN PMLA_VERSION(1, 0)
#define MOCK_MAX PMLA_VERSION(1, 0)
#define MOCK_NAME "mock-empty"
#define MOCK_BACKEND_COUNT 0u
#elif MOCK_KIND == 14
#define MOCK_MIN PMLA_VERSION(1, 0)
#define MOCK_MAX PMLA_VERSION(1, 1)
#define MOCK_NAME "pmla-cpu"
#define MOCK_DESC "idle: every call succeeds, decode writes nothing"
#define MOCK_IDLE 1
#elif MOCK_KIND == 15
#define MOCK_MIN PMLA_VERSION(1, 0)
#define MOCK_MAX PMLA_VERSION(1, 1)
#define MOCK_NAME "pmla-cpu"
#define MOCK_DESC "exiting: decode calls exit(0)"
#define MOCK_IDLE 1
#define MOCK_EXIT_IN_DECODE 1
#elif MOCK_KIND == 16
#define MOCK_MIN PMLA_VERSION(1, 0)
#define MOCK_MAX PMLA_VERSION(1, 1)
#define MOCK_NAME "mock-odd"
#define MOCK_DESC "odd: Ger\xe4te (Latin-1)"
#define MOCK_ODD 1
#else
#error "unknown MOCK_KIND"
#endif

#ifndef MOCK_BACKEND_SIZE
#define MOCK_BACKEND_SIZE sizeof(pmla_backend)
#endif
#ifndef MOCK_DESC
#define MOCK_DESC "mock backend for the conformance suite"
#endif

#ifdef MOCK_IDLE
#define MOCK_STEP PMLA_OK /* every builder call succeeds, doing nothing */
static char idle_builder;
#else
#define MOCK_STEP PMLA_ERR_BAD_STATE
#endif

static pmla_status mock_init(const pmla_builder_config *config, pmla_builder **out) {
  (void)config;
#ifdef MOCK_IDLE
  *out = (pmla_builder *)(void *)&idle_builder;
  return PMLA_OK;
#else
  (void)out;
  return PMLA_ERR_UNSUPPORTED;
#endif
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
  return MOCK_STEP;
}
static pmla_status mock_build_sparse(pmla_builder *b, const pmla_sparse_batch *batch) {
  (void)b;
  (void)batch;
  return MOCK_STEP;
}
static pmla_status mock_decode(pmla_builder *b, const pmla_decode_args *args) {
  (void)b;
  (void)args;
#ifdef MOCK_EXIT_IN_DECODE
  exit(0);
#endif
  return MOCK_STEP;
}
static const char *mock_last_error(const pmla_builder *b) {
  (void)b;
  return "mock backend: builds nothing";
}
static pmla_status mock_check(pmla_builder *b, uint32_t *flags) {
  (void)b;
  if (flags)
    *flags = 0;
  return MOCK_STEP;
}
static pmla_status mock_copy(pmla_builder *b, pmla_buffer which, void *dst, uint64_t bytes) {
  (void)b;
  (void)which;
  (void)dst;
  (void)bytes;
  return PMLA_ERR_BAD_STATE;
}

#define MOCK_VTABLE(name, desc)                                                            \
  {MOCK_BACKEND_SIZE, MOCK_MAX,          (name),          (desc),           mock_init,         \
   mock_destroy,      mock_query,        mock_build_decode, mock_build_sparse, mock_decode,     \
   mock_last_error,   mock_check,        mock_copy}

static const pmla_backend mock_backend = MOCK_VTABLE(MOCK_NAME, MOCK_DESC);

#if defined(MOCK_SECOND_NAME)
static const pmla_backend mock_second = MOCK_VTABLE(MOCK_SECOND_NAME, "mock shadowing backend");
static const pmla_backend *const mock_backends[] = {&mock_backend, &mock_second};
#elif defined(MOCK_UNNAMED)
static const pmla_backend mock_no_name = MOCK_VTABLE(NULL, "backend without a name");
static const pmla_backend mock_empty_name = MOCK_VTABLE("", "backend with an empty name");
static const pmla_backend mock_no_decode = {
    MOCK_BACKEND_SIZE, MOCK_MAX,        "mock-no-decode", "backend whose decode is NULL",
    mock_init,         mock_destroy,    mock_query,       mock_build_decode,
    mock_build_sparse, NULL,            mock_last_error,  mock_check,
    mock_copy};
static const pmla_backend *const mock_backends[] = {NULL, &mock_no_name, &mock_empty_name,
                                                    &mock_no_decode, &mock_backend};
#elif defined(MOCK_ODD)
/* a name of 300 bytes; a backend of another major; one of an older minor */
#define MOCK_X10 "xxxxxxxxxx"
#define MOCK_X50 MOCK_X10 MOCK_X10 MOCK_X10 MOCK_X10 MOCK_X10
#define MOCK_X100 MOCK_X50 MOCK_X50
static const pmla_backend mock_long_name = MOCK_VTABLE(MOCK_X100 MOCK_X100 MOCK_X100, "long name");
static const pmla_backend mock_other_major = {
    MOCK_BACKEND_SIZE, PMLA_VERSION(2, 0), "mock-other-major", "a backend of ABI 2.0",
    mock_init,         mock_destroy,       mock_query,         mock_build_decode,
    mock_build_sparse, mock_decode,        mock_last_error,    mock_check,
    mock_copy};
static const pmla_backend mock_older = {
    MOCK_BACKEND_SIZE, PMLA_VERSION(1, 0), "mock-older-backend", "a backend of ABI 1.0",
    mock_init,         mock_destroy,       mock_query,           mock_build_decode,
    mock_build_sparse, mock_decode,        mock_last_error,      mock_check,
    mock_copy};
static const pmla_backend *const mock_backends[] = {&mock_long_name, &mock_other_major,
                                                    &mock_older, &mock_backend};
#elif defined(MOCK_TWICE)
static const pmla_backend mock_twice = MOCK_VTABLE(MOCK_NAME, "second");
static const pmla_backend *const mock_backends[] = {&mock_backend, &mock_twice};
#else
static const pmla_backend *const mock_backends[] = {&mock_backend};
#endif

#ifndef MOCK_BACKEND_COUNT
#define MOCK_BACKEND_COUNT (uint32_t)(sizeof mock_backends / sizeof mock_backends[0])
#endif
#ifdef MOCK_NULL_BACKENDS
#define MOCK_BACKENDS NULL
#else
#define MOCK_BACKENDS mock_backends
#endif

static const pmla_plugin mock_plugin = {sizeof(pmla_plugin), MOCK_MAX,           "mock-" MOCK_NAME,
                                        "0.0-test",          MOCK_BACKEND_COUNT, 0,
                                        MOCK_BACKENDS};

pmla_status pmla_plugin_entry(pmla_negotiation *n);
__attribute__((visibility("default"))) pmla_status pmla_plugin_entry(pmla_negotiation *n) {
  if (!n)
    return PMLA_ERR_INVALID_ARGUMENT;
  if (n->struct_size < offsetof(pmla_negotiation, message) + sizeof n->message)
    return PMLA_ERR_STRUCT_SIZE;
#ifdef MOCK_UNTERMINATED_MESSAGE
  memset(n->message, '#', sizeof n->message); /* every byte, no terminator */
  return PMLA_ERR_VERSION;
#endif
#ifdef MOCK_NULL_BACKENDS
  (void)mock_backends; /* built, but the descriptor does not point at it */
#endif
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
#ifdef MOCK_NO_DESCRIPTOR
  (void)mock_plugin;
  n->plugin = NULL;
#else
  n->plugin = &mock_plugin;
#endif
  n->message[0] = '\0';
  return PMLA_OK;
}
