# SPDX-License-Identifier: MIT
# tests/inject/: allocation and thread-start failures injected at every
# point of init_builder and of a whole decode cycle on pmla-cpu (inject.c).
# It interposes malloc & co and pthread_create / _mutex_init / _cond_init, so
# it is its own program (no Check, like tests/noalloc); it skips under ASan
# and TSan.
check_PROGRAMS += tests/inject/inject
tests_inject_inject_SOURCES = tests/inject/inject.c tests/interpose.h tests/test_config.c \
	tests/test_config.h
tests_inject_inject_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/abi -I$(top_srcdir)/tests \
	-DPMLA_TEST_DEFAULT_PLUGIN='"$(abs_top_builddir)/plugin/.libs/pmla.so"'
tests_inject_inject_LDADD = abi/libpmla-registry.la $(DL_LIBS) $(PTHREAD_LIBS) $(LIBM)
tests_inject_inject_LDFLAGS = -export-dynamic
TESTS += tests/inject/inject
