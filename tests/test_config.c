/* SPDX-License-Identifier: MIT */
/* test_config.c - see test_config.h. */
#include "test_config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *test_plugin(int argc, char **argv, const char *fallback, const char *program) {
  const char *env = getenv("PMLA_CONFORMANCE_PLUGIN");
  const char *plugin = argc > 1 ? argv[1] : env && *env ? env : fallback;
  if (access(plugin, R_OK) == 0)
    return plugin;
  fprintf(stderr, "%s: plugin %s not found\n", program, plugin);
  return NULL;
}

pmla_builder_config test_config(uint32_t heads, uint32_t page_size, uint32_t max_batch,
                                uint32_t max_q_len, uint32_t topk, uint32_t cu_count) {
  pmla_builder_config c;
  memset(&c, 0, sizeof c);
  c.struct_size = sizeof c;
  c.num_heads = heads;
  c.kv_lora_rank = 512;
  c.rope_dim = 64;
  c.q_dtype = c.kv_dtype = c.out_dtype = PMLA_DTYPE_BF16;
  c.page_size = page_size;
  c.max_batch = max_batch;
  c.max_q_len = max_q_len;
  c.topk = topk;
  c.softmax_scale = (float)(1.0 / sqrt(576.0));
  c.cu_count = cu_count;
  return c;
}

int64_t test_kv_row_bytes(uint32_t kv_dtype) {
  return kv_dtype == PMLA_DTYPE_FP8_E4M3    ? PMLA_KV_TOKEN_BYTES_FP8_E4M3
         : kv_dtype == PMLA_DTYPE_FP8_DS_MLA ? PMLA_KV_TOKEN_BYTES_FP8_DS_MLA
                                             : PMLA_KV_TOKEN_BYTES_BF16;
}

int64_t test_kv_width(uint32_t kv_dtype) {
  return kv_dtype == PMLA_DTYPE_FP8_DS_MLA ? PMLA_KV_TOKEN_BYTES_FP8_DS_MLA : 576;
}

uint64_t test_host_available_bytes(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f)
    return 0;
  char line[256];
  unsigned long long kb, sum = 0;
  int have = 0;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
      sum += kb;
      have = 1;
    } else if (sscanf(line, "SwapFree: %llu kB", &kb) == 1) {
      sum += kb;
    }
  }
  fclose(f);
  return have ? (uint64_t)sum * 1024 : 0;
}
