/* SPDX-License-Identifier: MIT */
/* host.c - one dense decode step on pmla-cpu. host [PLUGIN_PATH] ($PMLA_PLUGIN_PATH first)
 * exits 0 only when every call succeeds and the output is finite. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <pmla_registry.h>

enum { B = 2, H = 16, PAGE = 64, PAGES = 2, D = 576, DV = 512 };
static uint16_t q[B][H][D], kv[B * PAGES][PAGE][D], out[B][H][DV]; /* bf16 bits */
static int32_t qo_indptr[] = {0, 1, 2}, kv_lens[] = {100, 128}, table[B][PAGES] = {{3, 0}, {1, 2}};

static DLTensor tensor(void *data, uint8_t code, int ndim, int64_t *shape) {
  return (DLTensor){.data = data, .device = {kDLCPU, 0}, .ndim = ndim,
                    .dtype = {code, code == kDLBfloat ? 16 : 32, 1}, .shape = shape};
}
static float f32(uint16_t bits) {
  uint32_t u = (uint32_t)bits << 16;
  float f;
  return memcpy(&f, &u, 4), f;
}

/* b stays NULL if init_builder fails: last_error(NULL) then gives its message */
#define CALL(expr) do { pmla_status st = (expr); if (st != PMLA_OK) { fprintf(stderr, \
  "%s: %s: %s\n", #expr, pmla_status_name(st), be->last_error(b)); goto done; } } while (0)

int main(int argc, char **argv) {
  pmla_registry *reg = NULL; /* dlopens the plugins on the path, negotiates the ABI */
  pmla_builder *b = NULL;
  int bad = 1;
  if (pmla_registry_open(argc > 1 ? argv[1] : NULL, &reg) != PMLA_OK) return 1;
  const pmla_backend *be = pmla_registry_find(reg, "pmla-cpu");
  if (!be) { fprintf(stderr, "no pmla-cpu:\n%s", pmla_registry_diagnostics(reg)); goto done; }
  for (size_t i = 0; i < sizeof q / 2; i++) (&q[0][0][0])[i] = 0x3f00 + i % 97;  /* 0.5..0.87 */
  for (size_t i = 0; i < sizeof kv / 2; i++) (&kv[0][0][0])[i] = 0xbe80 + i % 89; /* -0.25..-0.42 */

  pmla_builder_config cfg = {.struct_size = sizeof cfg, .num_heads = H, .kv_lora_rank = DV,
      .rope_dim = D - DV, .q_dtype = PMLA_DTYPE_BF16, .kv_dtype = PMLA_DTYPE_BF16,
      .out_dtype = PMLA_DTYPE_BF16, .page_size = PAGE, .max_batch = B, .max_q_len = 1,
      .softmax_scale = 1.0f / 24.0f}; /* 576^-0.5 */
  CALL(be->init_builder(&cfg, &b)); /* once: validates, allocates everything */
  int64_t s_ind[] = {B + 1}, s_len[] = {B}, s_tab[] = {B, PAGES}, s_q[] = {B, H, D},
          s_kv[] = {B * PAGES, PAGE, D}, s_out[] = {B, H, DV};
  DLTensor ind = tensor(qo_indptr, kDLInt, 1, s_ind), len = tensor(kv_lens, kDLInt, 1, s_len),
           tab = tensor(table, kDLInt, 2, s_tab), tq = tensor(q, kDLBfloat, 3, s_q),
           tkv = tensor(kv, kDLBfloat, 3, s_kv), tout = tensor(out, kDLBfloat, 3, s_out);
  pmla_decode_batch step = {.struct_size = sizeof step, .kv_layout = PMLA_KV_BLOCK_TABLE,
      .qo_indptr = &ind, .block_table = &tab, .kv_lens = &len};
  CALL(be->build_decode(b, &step)); /* per step: fills the schedule, allocates nothing */
  pmla_decode_args layer = {.struct_size = sizeof layer, .q = &tq, .kv_cache = &tkv, .out = &tout};
  CALL(be->decode(b, &layer)); /* per layer */

  bad = 0;
  for (size_t i = 0; i < sizeof out / 2; i++) bad |= !isfinite(f32((&out[0][0][0])[i]));
  printf("%s: out[0][0][0..2] = %.4f %.4f %.4f%s\n", be->name, f32(out[0][0][0]),
         f32(out[0][0][1]), f32(out[0][0][2]), bad ? " NOT FINITE" : "");
done:
  if (be) be->destroy_builder(b);
  pmla_registry_close(reg);
  return bad;
}
