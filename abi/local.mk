# SPDX-License-Identifier: MIT
# abi/: the public headers and the host-side registry library.
pmlaincludedir = $(includedir)/pmla
pmlainclude_HEADERS = abi/pmla.h abi/pmla_registry.h

lib_LTLIBRARIES += abi/libpmla-registry.la
abi_libpmla_registry_la_SOURCES = abi/registry.c
abi_libpmla_registry_la_LIBADD = $(DL_LIBS)
abi_libpmla_registry_la_LDFLAGS = -version-info 0:0:0
# With no path named, the registry searches the directory plugins install to.
abi_libpmla_registry_la_CPPFLAGS = $(AM_CPPFLAGS) -DPMLA_PLUGINDIR='"$(plugindir)"'
