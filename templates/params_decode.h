// Parameter block of the split-K decode kernel and its combine, shared byte for byte by the host
// (compiler/splitk_schedule, runtime/) and the device templates. Plain C, fixed-width fields.
//
// Plan once, run many: the host schedule (compiler/splitk_schedule.hpp) writes a work list into
// the integer region of a caller-provided workspace; both kernels read it through the pointers
// below, so the launch grids never change with the sequence lengths (CUDA-graph friendly).
#pragma once

#include "kernel_params.h"

// One unit of decode work: keys [kv_begin, kv_end) of one (sequence, kv head, m block).
// Four int32 so a CTA fetches it with one 16-byte load.
typedef struct fj_decode_work {
  fj_i32 unit;     // (batch * heads_kv + head_kv) * m_blocks + m_block
  fj_i32 kv_begin; // first key (absolute position in the sequence)
  fj_i32 kv_end;   // one past the last key; kv_begin == kv_end: the unit sees no key
  fj_i32 state;    // < 0: the unit is not split, write O directly; else its partial state slot
} fj_decode_work;

// One unit whose keys were split: its partial states are [first_state, first_state + count).
typedef struct fj_decode_merge {
  fj_i32 unit;
  fj_i32 first_state;
  fj_i32 count;
  fj_i32 pad_;
} fj_decode_merge;

// Counters at the start of the integer region, written by the host schedule.
typedef struct fj_decode_header {
  fj_i32 num_work;
  fj_i32 num_merges;
  fj_i32 num_states;
  fj_i32 pad_;
} fj_decode_header;

// The fused merge's arrays follow merges[grid] in the integer region, where the device finds them
// from `merges` and the grid size alone (fj_decode_params keeps its layout):
//   state_merge[fj_decode_states_per_cta * grid] at merges + grid: the merge of each partial state
//     (-1 for slots no state uses this step);
//   merge_counters[grid] at state_merge + that count rounded up to fj_decode_i32_per_16_bytes:
//     arrivals per merge, zero between launches (the host writes zeros; the merging CTA puts its
//     counter back to zero).
enum {
  fj_decode_states_per_cta = 2,  // a CTA's run holds at most two pieces of split units
  fj_decode_i32_per_16_bytes = 4 // the integer region's arrays start 16-byte aligned
};

typedef struct fj_decode_params {
  // q/k/v/o, lse, seqlens, paged KV, heads, window, scale, softcap; `maybe_partial_o/lse` point at
  // the float region of the workspace: [states, block_m, head_dim_v] and [states, block_m].
  fj_attention_params attn;
  const fj_decode_header *header;
  const fj_i32 *slot_begin;      // [grid + 1]: CTA c runs work[slot_begin[c] .. slot_begin[c + 1])
  const fj_decode_work *work;    // [max_work]
  const fj_decode_merge *merges; // [grid]: at most one split unit ends in each CTA's range (then
                                 // state_merge and merge_counters, above)
  fj_i32 m_blocks;               // query tiles per (sequence, kv head)
  fj_i32 pad_;
} fj_decode_params;

// The parameter block of plans with TMA tiles (plan constant kTmaKv): the decode parameters, then
// K's and V's tensor maps. 4-D, innermost first: {dim, heads_kv, keys, batch} over contiguous KV,
// {dim, heads_kv, page_size, num_pages} over pages; boxes of one 64-column panel x kTmaBoxRows keys
// with the 128-byte swizzle (runtime/tma_desc.cpp encodes them).
typedef struct fj_decode_tma_params {
  fj_decode_params base;
  fj_tensor_map k_map;
  fj_tensor_map v_map;
} fj_decode_tma_params;
