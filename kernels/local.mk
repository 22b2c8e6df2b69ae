# kernels/: the shared planner and all compute; knows nothing of the ABI.
noinst_LTLIBRARIES += kernels/libpmla-kernels.la
kernels_libpmla_kernels_la_SOURCES = kernels/planner.h kernels/bf16.h \
	kernels/mla_cpu.h kernels/mla_cpu.c
kernels_libpmla_kernels_la_CFLAGS = $(AM_CFLAGS) -O3 $(VISIBILITY_CFLAGS)
kernels_libpmla_kernels_la_LIBADD = $(LIBM)
