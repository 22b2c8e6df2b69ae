# SPDX-License-Identifier: MIT
# tests/bench/: pmla-bench, the main job (a program, not a timed test).
bin_PROGRAMS += tests/bench/pmla-bench
tests_bench_pmla_bench_SOURCES = tests/bench/bench.c tests/reference.c tests/reference.h \
	tests/test_config.c tests/test_config.h \
	tests/devmem.h tests/devmem_cpu.c $(DEVMEM_GPU_SOURCE)
tests_bench_pmla_bench_CPPFLAGS = $(AM_CPPFLAGS) $(GPU_CPPFLAGS) -I$(top_srcdir)/tests \
	-DPMLA_BENCH_DEFAULT_PLUGIN='"$(abs_top_builddir)/plugin/.libs/pmla.so:$(plugindir)/pmla.so"'
tests_bench_pmla_bench_LDADD = abi/libpmla-registry.la $(GPU_LIBS) $(LIBM)
