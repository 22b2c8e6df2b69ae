/* SPDX-License-Identifier: MIT */
/* mock_links_plugin.c - a library that defines no pmla_plugin_entry but links
 * a plugin (mock_old_minor): dlsym on its handle still finds the plugin's
 * entry point among its dependencies, and the registry must not take this
 * library for that plugin. */
int pmla_mock_links_plugin(void);
__attribute__((visibility("default"))) int pmla_mock_links_plugin(void) { return 1; }
