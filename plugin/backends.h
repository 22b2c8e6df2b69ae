/* SPDX-License-Identifier: MIT */
/* backends.h - the backends this plugin carries. */
#ifndef PMLA_PLUGIN_BACKENDS_H
#define PMLA_PLUGIN_BACKENDS_H

#include "pmla.h"

extern const pmla_backend pmla_cpu_backend; /* "pmla-cpu" */
extern const pmla_backend pmla_gpu_backend; /* "pmla" */

#endif
