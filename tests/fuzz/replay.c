/* SPDX-License-Identifier: MIT */
/* replay.c - runs the fuzz target (fuzz_pmla.c) once on each input file,
 * without libFuzzer, so that make check replays the seed corpus with any
 * compiler. A broken promise aborts, as it does under the fuzzer.
 *
 *   fuzz-replay [FILE|DIR]...      default: the source tree's tests/fuzz/corpus */
#define _DEFAULT_SOURCE
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef PMLA_FUZZ_CORPUS
#define PMLA_FUZZ_CORPUS "tests/fuzz/corpus"
#endif

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "fuzz-replay: cannot open %s\n", path);
    return -1;
  }
  static uint8_t buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  printf("replay %s (%zu bytes)\n", path, n);
  fflush(stdout);
  LLVMFuzzerTestOneInput(buf, n);
  return 0;
}

/* Replays a file, or every file of a directory in name order; returns the
 * number of inputs, -1 when a path cannot be read. */
static int replay(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) {
    fprintf(stderr, "fuzz-replay: %s not found\n", path);
    return -1;
  }
  if (!S_ISDIR(st.st_mode))
    return replay_file(path) == 0 ? 1 : -1;
  struct dirent **names;
  int n = scandir(path, &names, NULL, alphasort), count = 0;
  if (n < 0)
    return -1;
  for (int i = 0; i < n; i++) {
    char file[4096];
    snprintf(file, sizeof file, "%s/%s", path, names[i]->d_name);
    if (names[i]->d_name[0] != '.' && stat(file, &st) == 0 && S_ISREG(st.st_mode) &&
        replay_file(file) == 0)
      count++;
    free(names[i]);
  }
  free(names);
  return count;
}

int main(int argc, char **argv) {
  LLVMFuzzerInitialize(&argc, &argv);
  int total = 0;
  for (int i = 1; i < argc || (i == 1 && argc == 1); i++) {
    int n = replay(argc > 1 ? argv[i] : PMLA_FUZZ_CORPUS);
    if (n < 0)
      return 99;
    total += n;
  }
  if (!total) {
    fprintf(stderr, "fuzz-replay: no inputs\n");
    return 99;
  }
  printf("%d passed, 0 failed\n", total);
  return 0;
}
