/* SPDX-License-Identifier: MIT */
/* entry.c - the plugin's one exported symbol: version negotiation and the
 * plugin descriptor listing its backends. */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "backends.h"

#define PMLA_EXPORT __attribute__((visibility("default")))

static const pmla_backend *const backends[] = {&pmla_gpu_backend, &pmla_cpu_backend};

static const pmla_plugin plugin = {
    .struct_size = sizeof(pmla_plugin),
    .abi_version = PMLA_ABI_VERSION,
    .name = "pmla",
    .version = PACKAGE_VERSION,
    .backend_count = sizeof backends / sizeof backends[0],
    .backends = backends,
};

/* The 1.0 prefix every host writes, up to and including `message`. */
#define NEGOTIATION_PREFIX (offsetof(pmla_negotiation, message) + sizeof(((pmla_negotiation *)0)->message))

PMLA_EXPORT pmla_status pmla_plugin_entry(pmla_negotiation *n);

PMLA_EXPORT pmla_status pmla_plugin_entry(pmla_negotiation *n) {
  if (!n)
    return PMLA_ERR_INVALID_ARGUMENT;
  if (n->struct_size < NEGOTIATION_PREFIX)
    return PMLA_ERR_STRUCT_SIZE; /* too small to hold even the message */
  n->plugin = NULL;
  n->agreed_version = 0;
  n->message[0] = '\0';
  uint32_t lo = n->host_min_version, hi = n->host_max_version;
  /* We implement 1.0 .. 1.PMLA_ABI_MINOR; answer the highest inside [lo, hi]. */
  uint32_t ours = PMLA_ABI_VERSION, best = 0;
  if (lo <= hi) {
    if (hi >= ours && lo <= ours)
      best = ours;
    else if (PMLA_VERSION_MAJOR(hi) == PMLA_ABI_MAJOR && hi < ours && hi >= lo)
      best = hi; /* an older 1.x host: speak its minor */
  }
  if (!best) {
    snprintf(n->message, sizeof n->message,
             "pmla %s implements ABI %u.0..%u.%u; the host offered %u.%u..%u.%u", PACKAGE_VERSION,
             (unsigned)PMLA_ABI_MAJOR, (unsigned)PMLA_ABI_MAJOR, (unsigned)PMLA_ABI_MINOR,
             PMLA_VERSION_MAJOR(lo),
             PMLA_VERSION_MINOR(lo), PMLA_VERSION_MAJOR(hi), PMLA_VERSION_MINOR(hi));
    return PMLA_ERR_VERSION;
  }
  n->agreed_version = best;
  n->plugin = &plugin;
  return PMLA_OK;
}
