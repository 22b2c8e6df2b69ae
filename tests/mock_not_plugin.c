/* SPDX-License-Identifier: MIT */
/* mock_not_plugin.c - a perfectly good shared object that is not a plugin
 * (no pmla_plugin_entry); the registry must skip it with a diagnostic. */
int pmla_mock_not_a_plugin(int x);
int pmla_mock_not_a_plugin(int x) { return x + 1; }
