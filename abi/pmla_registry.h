/* SPDX-License-Identifier: MIT */
/* pmla_registry.h - host-side plugin registry (link -lpmla-registry).
 *
 * Scans a colon-separated search path (the explicit argument first, then the
 * PMLA_PLUGIN_PATH environment variable). Each entry is a plugin file or a
 * directory whose *.so files are taken in name order. Each file is dlopen'ed
 * with RTLD_NOW|RTLD_LOCAL and negotiated; its backends are indexed by name.
 * A name seen twice resolves to the first on the path. Files that are not
 * plugins, speak no common version or carry a truncated vtable are skipped
 * and described in pmla_registry_diagnostics(); they never crash the host.
 * A registry is not thread-safe to open/close; lookups are read-only.
 */
#ifndef PMLA_REGISTRY_H
#define PMLA_REGISTRY_H

#include "pmla.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PMLA_PLUGIN_PATH_ENV "PMLA_PLUGIN_PATH"

typedef struct pmla_registry pmla_registry;

/* search_path may be NULL. Fails only on allocation failure; an empty
 * registry is a valid answer. */
pmla_status pmla_registry_open(const char *search_path, pmla_registry **out);
/* NULL-safe; dlcloses the plugins, so destroy their builders first. */
void pmla_registry_close(pmla_registry *registry);

size_t pmla_registry_count(const pmla_registry *registry);
const pmla_backend *pmla_registry_backend(const pmla_registry *registry, size_t index);
/* The file a backend came from, and the version agreed with it. */
const char *pmla_registry_backend_path(const pmla_registry *registry, size_t index);
uint32_t pmla_registry_backend_version(const pmla_registry *registry, size_t index);
const pmla_backend *pmla_registry_find(const pmla_registry *registry, const char *name);
/* One line per skipped file or shadowed name; "" when none. */
const char *pmla_registry_diagnostics(const pmla_registry *registry);

/* Negotiates with one already-opened entry point. Exposed for tests and for
 * hosts with their own loader. */
pmla_status pmla_negotiate(pmla_entry_fn entry, uint32_t min_version, uint32_t max_version,
                           const pmla_plugin **plugin, uint32_t *agreed, char *message,
                           size_t message_size);

const char *pmla_status_name(pmla_status status);

#ifdef __cplusplus
}
#endif
#endif
