# SPDX-License-Identifier: MIT
# examples/: a minimal host, built and run by make check against the in-tree
# CPU plugin, so the example README.md shows cannot rot.
check_PROGRAMS += examples/host
examples_host_SOURCES = examples/host.c
examples_host_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/abi
examples_host_LDADD = abi/libpmla-registry.la
TESTS += examples/check-host.sh
EXTRA_DIST += examples/check-host.sh
