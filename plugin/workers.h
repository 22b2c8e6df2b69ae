/* SPDX-License-Identifier: MIT */
/* workers.h - persistent worker threads for the CPU backend: started once
 * at init, each runs job(arg, index) when dispatched; the caller waits for
 * all. Dispatch allocates nothing. */
#ifndef PMLA_WORKERS_H
#define PMLA_WORKERS_H

#include <stdint.h>

typedef struct pmla_workers pmla_workers;
typedef void (*pmla_job_fn)(void *arg, uint32_t index);

/* Returns NULL when threads or memory cannot be had. */
pmla_workers *pmla_workers_start(uint32_t count);
void pmla_workers_stop(pmla_workers *w); /* NULL-safe; joins (in a forked child: frees) */
/* Runs job on every worker (index 0..count-1) and returns when all finished;
 * in a child forked after pmla_workers_start, on the calling thread, index by
 * index (the jobs of one run must not wait for each other). */
void pmla_workers_run(pmla_workers *w, pmla_job_fn job, void *arg);

#endif
