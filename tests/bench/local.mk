# SPDX-License-Identifier: MIT
# tests/bench/: pmla-bench, the main job (a program, not a timed test), and
# tests/info/: pmla-info, what the registry finds. Both are installed, need
# no Check, and find plugins as any host does (the registry's search path).
bin_PROGRAMS += tests/bench/pmla-bench
tests_bench_pmla_bench_SOURCES = tests/bench/bench.c tests/reference.c tests/reference.h \
	tests/test_config.c tests/test_config.h \
	tests/devmem.h tests/devmem_cpu.c $(DEVMEM_GPU_SOURCE)
tests_bench_pmla_bench_CPPFLAGS = $(AM_CPPFLAGS) $(GPU_CPPFLAGS) -I$(top_srcdir)/tests
tests_bench_pmla_bench_LDADD = abi/libpmla-registry.la $(GPU_LIBS) $(PTHREAD_LIBS) $(LIBM)

bin_PROGRAMS += tests/info/pmla-info
tests_info_pmla_info_SOURCES = tests/info/info.c tests/test_config.c tests/test_config.h
tests_info_pmla_info_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/tests
tests_info_pmla_info_LDADD = abi/libpmla-registry.la $(LIBM)

# Plugins whose "pmla-cpu" accepts every call and writes nothing (idle:
# pmla-bench --check must fail it, check-tools.sh) or exits in decode
# (exiting: pmla-conformance must fail it, check-harness.sh). Kept out of
# tests/.libs, whose plugins the registry tests and the fuzzer take as they
# find them.
if PMLA_TESTS
check_LTLIBRARIES += tests/bench/mock_idle.la tests/bench/mock_exiting.la
tests_bench_mock_idle_la_SOURCES = tests/mock_plugin.c
tests_bench_mock_idle_la_CPPFLAGS = $(MOCK_CPPFLAGS) -DMOCK_KIND=14
tests_bench_mock_idle_la_LDFLAGS = -module -avoid-version -shared -rpath $(abs_builddir)/tests/bench
tests_bench_mock_exiting_la_SOURCES = tests/mock_plugin.c
tests_bench_mock_exiting_la_CPPFLAGS = $(MOCK_CPPFLAGS) -DMOCK_KIND=15
tests_bench_mock_exiting_la_LDFLAGS = $(tests_bench_mock_idle_la_LDFLAGS)
endif
