# SPDX-License-Identifier: MIT
# tests/: pmla-conformance (installed: the black-box suite any plugin must
# pass), pmla-unit (the white-box tests of this plugin's planner), the
# no-allocation check, and mock plugins built only for the registry tests.
# Paths are relative to the top directory (non-recursive build).
# configure --disable-tests builds none of them (and needs no Check).
# Installed programs know only installed paths: make check points them at
# the build tree through the environment (AM_TESTS_ENVIRONMENT below).

if PMLA_TESTS

# Sources both Check programs share: harness, configs, memory providers, the
# schedule layout checker and the named decode cases.
TEST_HARNESS_SOURCES = tests/harness.c tests/harness.h tests/test_config.c tests/test_config.h \
	tests/devmem.h tests/devmem_cpu.c $(DEVMEM_GPU_SOURCE) \
	tests/schedule.c tests/schedule.h tests/cases.c tests/cases.h
TEST_LDADD = abi/libpmla-registry.la $(CHECK_LIBS) $(GPU_LIBS) $(DL_LIBS) $(PTHREAD_LIBS) $(LIBM)

# ---- pmla-conformance: installed, and run by make check on the in-tree plugin.
# Black box: it sees abi/ and tests/ only. Its flags are AM_CPPFLAGS without
# -I kernels, so an include of a kernels/ header does not compile.
bin_PROGRAMS += tests/pmla-conformance
tests_pmla_conformance_SOURCES = tests/conformance.c $(TEST_HARNESS_SOURCES) \
	tests/reference.c tests/reference.h \
	tests/t_abi.c tests/t_builder.c tests/t_args.c tests/t_devinput.c tests/t_schedule.c tests/t_numerics.c tests/t_fp8.c tests/t_invariance.c \
	tests/t_threads.c tests/t_gpu.c
tests_pmla_conformance_CPPFLAGS = -D_POSIX_C_SOURCE=200809L -I$(top_builddir) \
	-I$(top_srcdir)/abi -I$(top_srcdir)/tests $(GPU_CPPFLAGS) \
	-DPMLA_TEST_DEFAULT_PLUGIN='"$(plugindir)/pmla.so"'
tests_pmla_conformance_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_pmla_conformance_LDADD = $(TEST_LDADD)

# ---- pmla-unit: white box, not installed: the shared planner called
# directly, and this plugin's schedules against its exact output.
check_PROGRAMS += tests/pmla-unit
tests_pmla_unit_SOURCES = tests/unit.c $(TEST_HARNESS_SOURCES) \
	tests/t_planner.c tests/t_plan_exact.c tests/t_plan_invariant.c
tests_pmla_unit_CPPFLAGS = $(AM_CPPFLAGS) $(GPU_CPPFLAGS) -I$(top_srcdir)/kernels \
	-I$(top_srcdir)/tests
tests_pmla_unit_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_pmla_unit_LDADD = $(TEST_LDADD)

# ---- noalloc: interposes malloc & co, so it is its own program (no Check)
check_PROGRAMS += tests/noalloc
tests_noalloc_SOURCES = tests/noalloc.c tests/interpose.h tests/test_config.c tests/test_config.h
tests_noalloc_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/abi -I$(top_srcdir)/tests \
	-DPMLA_TEST_DEFAULT_PLUGIN='"$(abs_top_builddir)/plugin/.libs/pmla.so"'
tests_noalloc_LDADD = abi/libpmla-registry.la $(LIBM)
tests_noalloc_LDFLAGS = -export-dynamic

# ---- noimage: a GPU the build has no kernels for is refused; it defines
# the runtime's function-attribute query, so it is its own program (no Check)
check_PROGRAMS += tests/noimage
tests_noimage_SOURCES = tests/noimage.c tests/test_config.c tests/test_config.h
tests_noimage_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/abi -I$(top_srcdir)/tests \
	-DPMLA_TEST_DEFAULT_PLUGIN='"$(abs_top_builddir)/plugin/.libs/pmla.so"'
tests_noimage_LDADD = abi/libpmla-registry.la $(DL_LIBS) $(LIBM)
tests_noimage_LDFLAGS = -export-dynamic

# ---- cgroup: a container's memory limit heeded; it defines fopen, so it is
# its own program (no Check)
check_PROGRAMS += tests/cgroup
tests_cgroup_SOURCES = tests/cgroup.c tests/interpose.h tests/test_config.c tests/test_config.h
tests_cgroup_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/abi -I$(top_srcdir)/tests \
	-DPMLA_TEST_DEFAULT_PLUGIN='"$(abs_top_builddir)/plugin/.libs/pmla.so"'
tests_cgroup_LDADD = abi/libpmla-registry.la $(DL_LIBS) $(LIBM)
tests_cgroup_LDFLAGS = -export-dynamic

TESTS += tests/pmla-conformance tests/pmla-unit tests/noalloc tests/noimage tests/cgroup

# ---- plan-emu: the GPU metadata kernel's source run on the CPU (its
# work-group as contexts of one thread) against the host planner, so CI,
# which has no GPU, checks the device planner's logic
check_PROGRAMS += tests/plan-emu
tests_plan_emu_SOURCES = tests/plan_emu.cc
tests_plan_emu_CPPFLAGS = -I$(top_srcdir)/kernels -I$(top_srcdir)/kernels/gpu
tests_plan_emu_CXXFLAGS = -std=c++17 -Wall -Wextra -Wno-unknown-pragmas
TESTS += tests/plan-emu

# ---- pmla-multigpu: builders on two GPUs (threads, graphs, tensor parallel
# processes); built with the GPU backend, run by hand on a GPU machine (see
# its header), not in TESTS: CI has no GPU
if PMLA_GPU
check_PROGRAMS += tests/pmla-multigpu
tests_pmla_multigpu_SOURCES = tests/multigpu.c tests/reference.c tests/reference.h \
	tests/test_config.c tests/test_config.h tests/devmem.h $(DEVMEM_GPU_SOURCE)
tests_pmla_multigpu_CPPFLAGS = $(AM_CPPFLAGS) $(GPU_CPPFLAGS) -I$(top_srcdir)/tests
tests_pmla_multigpu_LDADD = abi/libpmla-registry.la $(GPU_LIBS) $(PTHREAD_LIBS) $(LIBM)
endif

# ---- mock plugins (never installed; -rpath makes libtool build real .so)
MOCK_LDFLAGS = -module -avoid-version -shared -rpath $(abs_builddir)/tests
MOCK_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/abi
check_LTLIBRARIES += tests/mock_wrong_major.la tests/mock_old_minor.la \
	tests/mock_new_minor.la tests/mock_short_vtable.la \
	tests/mock_dup_a.la tests/mock_dup_b.la tests/mock_not_plugin.la \
	tests/mock_unterminated_message.la tests/mock_null_plugin.la \
	tests/mock_null_backends.la tests/mock_unnamed_backends.la \
	tests/mock_dup_within.la tests/mock_huge_count.la tests/mock_links_plugin.la \
	tests/mock_no_backends.la tests/mock_odd_backends.la

tests_mock_wrong_major_la_SOURCES = tests/mock_plugin.c
tests_mock_wrong_major_la_CPPFLAGS = $(MOCK_CPPFLAGS) -DMOCK_KIND=1
tests_mock_wrong_major_la_LDFLAGS = $(MOCK_LDFLAGS)
tests_mock_old_minor_la_SOURCES = tests/mock_plugin.c
tests_mock_old_minor_la_CPPFLAGS = $(MOCK_CPPFLAGS) -DMOCK_KIND=2
tests_mock_old_minor_la_LDFLAGS = $(MOCK_LDFLAGS)
tests_mock_new_minor_la_SOURCES = tests/mock_plugin.c
tests_mock_new_minor_la_CPPFLAGS = $(MOCK_CPPFLAGS) -DMOCK_KIND=3
tests_mock_new_minor_la_LDFLAGS = $(MOCK_LDFLAGS)
tests_mock_short_vtable_la_SOURCES = tests/mock_plugin.c
tests_mock_short_vtable_la_CPPFLAGS = $(MOCK_CPPFLAGS) -DMOCK_KIND=4
tests_mock_short_vtable_la_LDFLAGS = $(MOCK_LDFLAGS)
tests_mock_dup_a_la_SOURCES = tests/mock_plugin.c
tests_mock_dup_a_la_CPPFLAGS = $(MOCK_CPPFLAGS) -DMOCK_KIND=5
tests_mock_dup_a_la_LDFLAGS = $(MOCK_LDFLAGS)
tests_mock_dup_b_la_SOURCES = tests/mock_plugin.c
tests_mock_dup_b_la_CPPFLAGS = $(MOCK_CPPFLAGS) -DMOCK_KIND=6
tests_mock_dup_b_la_LDFLAGS = $(MOCK_LDFLAGS)
tests_mock_unterminated_message_la_SOURCES = tests/mock_plugin.c
tests_mock_unterminated_message_la_CPPFLAGS = $(MOCK_CPPFLAGS) -DMOCK_KIND=7
tests_mock_unterminated_message_la_LDFLAGS = $(MOCK_LDFLAGS)
tests_mock_null_plugin_la_SOURCES = tests/mock_plugin.c
tests_mock_null_plugin_la_CPPFLAGS = $(MOCK_CPPFLAGS) -DMOCK_KIND=8
tests_mock_null_plugin_la_LDFLAGS = $(MOCK_LDFLAGS)
tests_mock_null_backends_la_SOURCES = tests/mock_plugin.c
tests_mock_null_backends_la_CPPFLAGS = $(MOCK_CPPFLAGS) -DMOCK_KIND=9
tests_mock_null_backends_la_LDFLAGS = $(MOCK_LDFLAGS)
tests_mock_unnamed_backends_la_SOURCES = tests/mock_plugin.c
tests_mock_unnamed_backends_la_CPPFLAGS = $(MOCK_CPPFLAGS) -DMOCK_KIND=10
tests_mock_unnamed_backends_la_LDFLAGS = $(MOCK_LDFLAGS)
tests_mock_dup_within_la_SOURCES = tests/mock_plugin.c
tests_mock_dup_within_la_CPPFLAGS = $(MOCK_CPPFLAGS) -DMOCK_KIND=11
tests_mock_dup_within_la_LDFLAGS = $(MOCK_LDFLAGS)
tests_mock_huge_count_la_SOURCES = tests/mock_plugin.c
tests_mock_huge_count_la_CPPFLAGS = $(MOCK_CPPFLAGS) -DMOCK_KIND=12
tests_mock_huge_count_la_LDFLAGS = $(MOCK_LDFLAGS)
tests_mock_no_backends_la_SOURCES = tests/mock_plugin.c
tests_mock_no_backends_la_CPPFLAGS = $(MOCK_CPPFLAGS) -DMOCK_KIND=13
tests_mock_no_backends_la_LDFLAGS = $(MOCK_LDFLAGS)
tests_mock_odd_backends_la_SOURCES = tests/mock_plugin.c
tests_mock_odd_backends_la_CPPFLAGS = $(MOCK_CPPFLAGS) -DMOCK_KIND=16
tests_mock_odd_backends_la_LDFLAGS = $(MOCK_LDFLAGS)
tests_mock_not_plugin_la_SOURCES = tests/mock_not_plugin.c
tests_mock_not_plugin_la_LDFLAGS = $(MOCK_LDFLAGS)
# links mock_old_minor (found beside it through $ORIGIN) and defines no entry
tests_mock_links_plugin_la_SOURCES = tests/mock_links_plugin.c
tests_mock_links_plugin_la_LDFLAGS = $(MOCK_LDFLAGS) -Wl,-rpath,'$$ORIGIN' \
	-Wl,--no-as-needed,$(abs_builddir)/tests/.libs/mock_old_minor.so
EXTRA_tests_mock_links_plugin_la_DEPENDENCIES = tests/mock_old_minor.la

# ---- the CPU-only plugin's dependencies (skips for GPU builds)
TESTS += tests/check-needed.sh
# ---- pmla-info and pmla-bench as a user meets them (argument errors)
TESTS += tests/info/check-tools.sh
# ---- pmla-conformance's exit status: what a run that proves nothing says
TESTS += tests/check-harness.sh
endif
EXTRA_DIST += tests/check-needed.sh tests/info/check-tools.sh tests/check-harness.sh

# The build tree, for make check (a variable already set wins).
AM_TESTS_ENVIRONMENT = GPU_PLATFORM='$(GPU_PLATFORM)'; \
	PMLA_TEST_PLUGIN='$(abs_top_builddir)/plugin/.libs/pmla.so'; \
	PMLA_TEST_MOCK_DIR='$(abs_top_builddir)/tests/.libs'; \
	: "$${PMLA_CONFORMANCE_PLUGIN:=$$PMLA_TEST_PLUGIN}" "$${PMLA_UNIT_PLUGIN:=$$PMLA_TEST_PLUGIN}" \
	  "$${PMLA_CONFORMANCE_MOCK_DIR:=$$PMLA_TEST_MOCK_DIR}"; \
	export GPU_PLATFORM PMLA_TEST_PLUGIN PMLA_TEST_MOCK_DIR PMLA_CONFORMANCE_PLUGIN \
	  PMLA_UNIT_PLUGIN PMLA_CONFORMANCE_MOCK_DIR;
