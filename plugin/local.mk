# plugin/: the dlopen-able module; exports only pmla_plugin_entry.
plugin_LTLIBRARIES += plugin/pmla.la
plugin_pmla_la_SOURCES = plugin/entry.c plugin/backends.h \
	plugin/builder.h plugin/builder.c \
	plugin/workers.h plugin/workers.c \
	plugin/backend_cpu.c plugin/backend_gpu_none.c
plugin_pmla_la_CFLAGS = $(AM_CFLAGS) $(VISIBILITY_CFLAGS)
plugin_pmla_la_LDFLAGS = -module -avoid-version -shared -no-undefined \
	-export-symbols-regex '^pmla_plugin_entry$$'
plugin_pmla_la_LIBADD = kernels/libpmla-kernels.la $(PTHREAD_LIBS) $(LIBM)
