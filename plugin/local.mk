# SPDX-License-Identifier: MIT
# plugin/: the dlopen-able module; exports only pmla_plugin_entry.
plugin_LTLIBRARIES += plugin/pmla.la
plugin_pmla_la_SOURCES = plugin/entry.c plugin/backends.h \
	plugin/builder.h plugin/builder.c \
	plugin/workers.h plugin/workers.c \
	plugin/host_memory.h plugin/host_memory.c \
	plugin/backend_cpu.c
plugin_pmla_la_CPPFLAGS = $(AM_CPPFLAGS) $(GPU_CPPFLAGS)
plugin_pmla_la_CFLAGS = $(AM_CFLAGS) $(VISIBILITY_CFLAGS)
plugin_pmla_la_LDFLAGS = -module -avoid-version -shared -no-undefined \
	-export-symbols-regex '^pmla_plugin_entry$$'
plugin_pmla_la_LIBADD = kernels/libpmla-kernels.la $(PTHREAD_LIBS) $(LIBM)
if PMLA_GPU
# never unmapped by dlclose: a plugin unloaded and loaded again in a CUDA
# process crashed or hung its next init_builder (docs/robustness.md)
plugin_pmla_la_LDFLAGS += -Wl,-z,nodelete
plugin_pmla_la_SOURCES += plugin/backend_gpu.c plugin/gpu_runtime.h
plugin_pmla_la_LIBADD += $(PMLA_HIP_OBJS) $(GPU_LIBS)
EXTRA_plugin_pmla_la_DEPENDENCIES = $(PMLA_HIP_OBJS)
else
plugin_pmla_la_SOURCES += plugin/backend_gpu_none.c
endif
