# SPDX-License-Identifier: MIT
# tests/fuzz/: a libFuzzer target over pmla's validation surface, driven
# through the registry and pmla.h like a host (fuzz_pmla.c says what it
# checks). make check replays the seed corpus with any compiler
# (fuzz-replay); make fuzz runs libFuzzer, in a tree configured with clang
# (SRC: the source tree; the ignore list keeps the compute kernels from
# steering the fuzzer, see tests/fuzz/coverage-ignore.txt):
#   SRC/configure --with-hip=no CC=clang \
#     CFLAGS="-g -O1 -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all
#             -fsanitize-coverage-ignorelist=SRC/tests/fuzz/coverage-ignore.txt" \
#     LDFLAGS="-fsanitize=address,undefined"
#   make fuzz [FUZZ_TIME=60] [FUZZ_ARGS=...]
# A finding stops the run (make fails) and leaves its input in
# tests/fuzz/artifacts/ of the build tree; replay it with
#   tests/fuzz/fuzz_pmla tests/fuzz/artifacts/crash-...
# (PMLA_FUZZ_TRACE=1 prints each call). Once mended, such an input joins
# tests/fuzz/corpus/ as regress-NAME.
FUZZ_DEFINES = -DPMLA_FUZZ_PLUGIN='"$(abs_top_builddir)/plugin/.libs/pmla.so"' \
	-DPMLA_FUZZ_MOCK_DIR='"$(abs_top_builddir)/tests/.libs"'
FUZZ_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/abi $(FUZZ_DEFINES)

# make check: the target without libFuzzer, over the seed corpus (valid
# sessions written by seeds.py, and regress-*: inputs that made an earlier
# pmla misbehave)
check_PROGRAMS += tests/fuzz/fuzz-replay
tests_fuzz_fuzz_replay_SOURCES = tests/fuzz/replay.c tests/fuzz/fuzz_pmla.c
tests_fuzz_fuzz_replay_CPPFLAGS = $(FUZZ_CPPFLAGS) \
	-DPMLA_FUZZ_CORPUS='"$(abs_top_srcdir)/tests/fuzz/corpus"'
tests_fuzz_fuzz_replay_LDADD = abi/libpmla-registry.la $(DL_LIBS) $(LIBM)
TESTS += tests/fuzz/fuzz-replay

# make fuzz: the libFuzzer binary, built only on demand
EXTRA_PROGRAMS = tests/fuzz/fuzz_pmla
tests_fuzz_fuzz_pmla_SOURCES = tests/fuzz/fuzz_pmla.c
tests_fuzz_fuzz_pmla_CPPFLAGS = $(FUZZ_CPPFLAGS)
FUZZ_SANITIZE = -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
tests_fuzz_fuzz_pmla_CFLAGS = $(AM_CFLAGS) $(FUZZ_SANITIZE)
tests_fuzz_fuzz_pmla_LDFLAGS = $(FUZZ_SANITIZE)
tests_fuzz_fuzz_pmla_LDADD = abi/libpmla-registry.la $(DL_LIBS) $(LIBM)

EXTRA_DIST += tests/fuzz/corpus tests/fuzz/seeds.py tests/fuzz/coverage-ignore.txt

FUZZ_TIME = 60
FUZZ_ARGS =
fuzz:
	@case "`$(CC) --version 2>/dev/null`" in *clang*) ;; *) \
	  echo "make fuzz needs a tree configured with clang and the sanitizers, e.g.:"; \
	  echo "  $(abs_top_srcdir)/configure --with-hip=no CC=clang \\"; \
	  echo "    CFLAGS=\"-g -O1 -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all \\"; \
	  echo "      -fsanitize-coverage-ignorelist=$(abs_top_srcdir)/tests/fuzz/coverage-ignore.txt\" \\"; \
	  echo "    LDFLAGS=\"-fsanitize=address,undefined\""; \
	  echo "(Debian: apt-get install clang libclang-rt-14-dev)"; exit 1 ;; esac
	@case "$(CFLAGS)" in *fuzzer-no-link*) ;; *) \
	  echo "make fuzz: warning: CFLAGS lack -fsanitize=fuzzer-no-link,address,undefined:"; \
	  echo "  the plugin is neither coverage-guided nor checked by the sanitizers" ;; esac
	$(MAKE) $(AM_MAKEFLAGS) plugin/pmla.la $(check_LTLIBRARIES) tests/fuzz/fuzz_pmla$(EXEEXT)
	@$(MKDIR_P) tests/fuzz/work tests/fuzz/artifacts
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	tests/fuzz/fuzz_pmla$(EXEEXT) -max_total_time=$(FUZZ_TIME) -timeout=30 \
	  -print_final_stats=1 -artifact_prefix=tests/fuzz/artifacts/ $(FUZZ_ARGS) \
	  tests/fuzz/work $(srcdir)/tests/fuzz/corpus
.PHONY: fuzz
clean-local: clean-fuzz
clean-fuzz:
	-rm -rf tests/fuzz/work tests/fuzz/artifacts
.PHONY: clean-fuzz
