/* SPDX-License-Identifier: MIT */
/* test_config.h - the DeepSeek MLA builder config every test program starts from
 * (512 latent + 64 rope dims, bf16, scale 576^-0.5, device 0). */
#ifndef PMLA_TEST_CONFIG_H
#define PMLA_TEST_CONFIG_H

#include "pmla.h"

pmla_builder_config test_config(uint32_t heads, uint32_t page_size, uint32_t max_batch,
                                uint32_t max_q_len, uint32_t topk, uint32_t cu_count);

#endif
