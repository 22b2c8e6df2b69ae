/* SPDX-License-Identifier: MIT */
/* workers.c - a generation-counted dispatch: the caller bumps `generation`
 * and broadcasts; each worker runs the job once per generation and the last
 * one to finish wakes the caller. In a process forked after the start the
 * threads stayed behind in the parent: there the caller runs every index
 * itself. */
#include "workers.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

struct pmla_workers {
  pthread_mutex_t lock;
  pthread_cond_t wake, done;
  uint64_t generation;
  uint32_t count, running, started;
  int stopping;
  pmla_job_fn job;
  void *arg;
  pthread_t *threads;
  pid_t pid; /* the process whose threads these are */
};

typedef struct {
  pmla_workers *w;
  uint32_t index;
} worker_arg;

static void *worker_main(void *p) {
  worker_arg a = *(worker_arg *)p;
  free(p);
  pmla_workers *w = a.w;
  uint64_t seen = 0;
  pthread_mutex_lock(&w->lock);
  for (;;) {
    while (!w->stopping && w->generation == seen)
      pthread_cond_wait(&w->wake, &w->lock);
    if (w->stopping)
      break;
    seen = w->generation;
    pmla_job_fn job = w->job;
    void *arg = w->arg;
    pthread_mutex_unlock(&w->lock);
    job(arg, a.index);
    pthread_mutex_lock(&w->lock);
    if (--w->running == 0)
      pthread_cond_signal(&w->done);
  }
  pthread_mutex_unlock(&w->lock);
  return NULL;
}

pmla_workers *pmla_workers_start(uint32_t count) {
  pmla_workers *w = calloc(1, sizeof *w);
  if (!w)
    return NULL;
  w->threads = calloc(count, sizeof *w->threads);
  /* each failure undoes what was made before it, in reverse */
  if (!w->threads || pthread_mutex_init(&w->lock, NULL))
    goto no_lock;
  if (pthread_cond_init(&w->wake, NULL))
    goto no_wake;
  if (pthread_cond_init(&w->done, NULL))
    goto no_done;
  w->count = count;
  w->pid = getpid();
  for (uint32_t i = 0; i < count; i++) {
    worker_arg *a = malloc(sizeof *a);
    if (!a || (a->w = w, a->index = i, pthread_create(&w->threads[i], NULL, worker_main, a))) {
      free(a);
      pmla_workers_stop(w);
      return NULL;
    }
    w->started++;
  }
  return w;
no_done:
  pthread_cond_destroy(&w->wake);
no_wake:
  pthread_mutex_destroy(&w->lock);
no_lock:
  free(w->threads);
  free(w);
  return NULL;
}

void pmla_workers_stop(pmla_workers *w) {
  if (!w)
    return;
  if (getpid() != w->pid) { /* forked: no thread of ours to stop or join here */
    free(w->threads);
    free(w);
    return;
  }
  pthread_mutex_lock(&w->lock);
  w->stopping = 1;
  pthread_cond_broadcast(&w->wake);
  pthread_mutex_unlock(&w->lock);
  for (uint32_t i = 0; i < w->started; i++)
    pthread_join(w->threads[i], NULL);
  pthread_cond_destroy(&w->wake);
  pthread_cond_destroy(&w->done);
  pthread_mutex_destroy(&w->lock);
  free(w->threads);
  free(w);
}

void pmla_workers_run(pmla_workers *w, pmla_job_fn job, void *arg) {
  if (getpid() != w->pid) { /* forked: the jobs are independent, so one thread runs them all */
    for (uint32_t i = 0; i < w->count; i++)
      job(arg, i);
    return;
  }
  pthread_mutex_lock(&w->lock);
  w->job = job;
  w->arg = arg;
  w->running = w->count;
  w->generation++;
  pthread_cond_broadcast(&w->wake);
  while (w->running > 0)
    pthread_cond_wait(&w->done, &w->lock);
  pthread_mutex_unlock(&w->lock);
}
