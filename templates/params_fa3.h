// Parameter block of the FlashAttention-3 kernel (fj_fa3_prefill), shared byte for byte by the
// host (runtime/) and the device template. Plain C; passed by value as `const __grid_constant__`
// so the tensor maps live in parameter space, where cp.async.bulk.tensor can read them.
#pragma once

#include "kernel_params.h"

typedef struct fj_fa3_params {
  fj_attention_params base;
  // 4-D maps, innermost first: {dim, tokens, heads, batch}; varlen uses {dim, total, heads, 1}.
  fj_tensor_map tma_q;
  fj_tensor_map tma_k;
  fj_tensor_map tma_v;
  fj_tensor_map tma_o;
  // Persistent schedule (runtime/tma_desc.cpp fills these): tiles = batch * heads_q * m_blocks,
  // walked in sections of `heads_per_section` (batch, head) pairs so a section's K/V stays in L2.
  fj_i32 num_tiles;
  fj_i32 heads_per_section;
  // Tail split (kTailSplit): work units [tail_first_unit, tail_first_unit + tail_units) are walked
  // as one run of tail_units * tail_blocks_per_unit key blocks, cut into tail_blocks_per_walker per
  // walker; a unit cut at a walker boundary is finished by whichever of its two walkers is second.
  // tail_units = 0 (no workspace, or nothing to even out) walks every unit whole.
  fj_i32 tail_first_unit;
  fj_i32 tail_units;
  fj_i32 tail_blocks_per_walker;
  fj_i32 tail_blocks_per_unit;
  float *tail_partials;  // [walker boundary][side][CTA of the pair][kTailSlotFloats]: partial O, LSE
  fj_i32 *tail_counters; // [walker boundary][CTA of the pair]: pieces written (zero at launch, left zero)
  // kDynamicTiles: tiles drawn past the first wave (zero at launch, left zero); null: the snake's tiles.
  fj_i32 *tile_counter;
} fj_fa3_params;
