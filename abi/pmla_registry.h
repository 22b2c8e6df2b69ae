/* SPDX-License-Identifier: MIT */
/* pmla_registry.h - host-side plugin registry (link -lpmla-registry).
 *
 * Scans a colon-separated search path: the PMLA_PLUGIN_PATH environment
 * variable first (it overrides the program's choice, as LD_LIBRARY_PATH
 * does), then the search_path argument; when neither names a path, the
 * directory `make install` put the plugins in (pmla_registry_plugindir()).
 * Each entry is a plugin file or a directory whose *.so files are taken in
 * name order (a bare file name is the one in the current directory). Each
 * regular file that is a whole shared library (its loadable segments inside
 * the file: a copy still being written is skipped, not mapped) is
 * dlopen'ed with RTLD_NOW|RTLD_LOCAL and negotiated; its backends are
 * indexed by name. A file or directory reached twice (a repeated entry, a
 * link) is read once.
 * A name seen twice (in two files, or twice in one plugin) resolves to the
 * first on the path. Files that are not plugins, speak no common version or
 * hand out a malformed descriptor (none at all, a truncated one, a NULL
 * backends array, more than PMLA_REGISTRY_MAX_BACKENDS backends) are skipped;
 * a backend that is NULL, has no name (or one longer than
 * PMLA_REGISTRY_MAX_NAME), carries a truncated vtable or implements another
 * major version is skipped alone. A backend is indexed at the lower of the
 * plugin's agreed version and its own abi_version. Each is described in
 * pmla_registry_diagnostics() (at most 64 KiB; a last line counts the lines
 * past that); none crashes the host or makes it read past what the plugin
 * handed out.
 * A registry is not thread-safe to open/close; lookups are read-only.
 */
#ifndef PMLA_REGISTRY_H
#define PMLA_REGISTRY_H

#include "pmla.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PMLA_PLUGIN_PATH_ENV "PMLA_PLUGIN_PATH"

/* The most backends one plugin descriptor may list. A plugin whose
 * backend_count is larger is refused whole, before its backends array is
 * read, so a count that was never set cannot walk the host off its end.
 * A registry also holds at most this many backends in all. */
#define PMLA_REGISTRY_MAX_BACKENDS 4096u
/* The longest backend name the registry reads, in bytes: a longer name, or
 * one without a NUL that near its start, skips the backend. */
#define PMLA_REGISTRY_MAX_NAME 256u

typedef struct pmla_registry pmla_registry;

/* search_path may be NULL. Fails only when out is NULL
 * (PMLA_ERR_INVALID_ARGUMENT) or on allocation failure; an empty registry is
 * a valid answer. */
pmla_status pmla_registry_open(const char *search_path, pmla_registry **out);
/* NULL-safe; dlcloses the plugins, so destroy their builders first. */
void pmla_registry_close(pmla_registry *registry);

size_t pmla_registry_count(const pmla_registry *registry);
const pmla_backend *pmla_registry_backend(const pmla_registry *registry, size_t index);
/* The file a backend came from, and the version agreed with it. */
const char *pmla_registry_backend_path(const pmla_registry *registry, size_t index);
uint32_t pmla_registry_backend_version(const pmla_registry *registry, size_t index);
const pmla_backend *pmla_registry_find(const pmla_registry *registry, const char *name);
/* One line per place searched ("searched directory D (from ...)"), skipped
 * file ("skipped F: why") or shadowed name, in the order they were met;
 * control characters (a newline in a file or backend name) read as '?'. */
const char *pmla_registry_diagnostics(const pmla_registry *registry);
/* The path actually scanned, entries joined with ':'; "" when none. */
const char *pmla_registry_search_path(const pmla_registry *registry);
/* The configured plugin directory searched when no path is named. */
const char *pmla_registry_plugindir(void);

/* Negotiates with one already-opened entry point. Exposed for tests and for
 * hosts with their own loader. PMLA_ERR_INVALID_ARGUMENT when entry, plugin
 * or agreed is NULL; else returns the plugin's refusal as it gave it,
 * PMLA_ERR_VERSION when it agreed a version outside min..max, and
 * PMLA_ERR_INTERNAL when it answered PMLA_OK without a descriptor. message
 * (may be NULL) receives the plugin's message, read no further than its
 * fixed array and marked when the plugin left it without a NUL, or why the
 * answer was refused; *plugin and *agreed are written only on PMLA_OK. */
pmla_status pmla_negotiate(pmla_entry_fn entry, uint32_t min_version, uint32_t max_version,
                           const pmla_plugin **plugin, uint32_t *agreed, char *message,
                           size_t message_size);

const char *pmla_status_name(pmla_status status);

#ifdef __cplusplus
}
#endif
#endif
