/* SPDX-License-Identifier: MIT */
/* test_config.h - the DeepSeek MLA builder config every test program starts from
 * (512 latent + 64 rope dims, bf16, scale 576^-0.5, device 0). */
#ifndef PMLA_TEST_CONFIG_H
#define PMLA_TEST_CONFIG_H

#include "pmla.h"

pmla_builder_config test_config(uint32_t heads, uint32_t page_size, uint32_t max_batch,
                                uint32_t max_q_len, uint32_t topk, uint32_t cu_count);

/* A KV cache of this pmla_dtype: bytes per token (1152, 576, 656) and the
 * width of its last dimension (576 values; 656 bytes for fp8_ds_mla). */
int64_t test_kv_row_bytes(uint32_t kv_dtype);
int64_t test_kv_width(uint32_t kv_dtype);

/* The plugin a standalone test program runs against: argv[1], else
 * $PMLA_CONFORMANCE_PLUGIN, else `fallback`; NULL, after saying so as
 * `program`, when that file cannot be read. */
const char *test_plugin(int argc, char **argv, const char *fallback, const char *program);

/* Host memory a program may still take: MemAvailable + SwapFree of
 * /proc/meminfo, in bytes; 0 where that cannot be read. */
uint64_t test_host_available_bytes(void);

#endif
