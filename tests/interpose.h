/* SPDX-License-Identifier: MIT */
/* interpose.h - what the programs that interpose malloc & co share
 * (tests/noalloc.c counts allocations, tests/inject/inject.c fails them):
 * glibc's own allocator entry points, which the interposed functions
 * forward to, and whether a sanitizer owns malloc. AddressSanitizer and
 * ThreadSanitizer do, and interposing it as well breaks both
 * (compile-time only: a build that only links a sanitizer is not
 * detected); the programs then skip. */
#ifndef PMLA_TESTS_INTERPOSE_H
#define PMLA_TESTS_INTERPOSE_H

#include <stddef.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define PMLA_TEST_UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define PMLA_TEST_UNDER_SANITIZER 1
#endif
#endif

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);

#endif
