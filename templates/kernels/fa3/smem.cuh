// Shared-memory map of the fa3 kernel: every offset comes from the plan (KernelConfig); this file
// only turns them into 32-bit shared addresses. Tiles are 1024-byte aligned (128B swizzle atom).
#pragma once

#include "prim/types.cuh"

namespace fj::fa3 {

template <class C> struct Smem {
  // mbarriers, 8 bytes each, at kSmemOffsetBarriers: Q full/empty, then per stage K full, K
  // empty, V full, V empty; then (paged KV) the producer's own barrier for a V block it completes;
  // then (kDynamicTiles) a full and an empty barrier per slot of the tile ring and the slots' tile
  // indices, 4 bytes each.
  static constexpr u32 kBarrierBytes = 8;
  static constexpr u32 kQFull = 0;
  static constexpr u32 kQEmpty = 1;
  static constexpr u32 kKFull = 2;
  static constexpr u32 kKEmpty = kKFull + C::kStages;
  static constexpr u32 kVFull = kKEmpty + C::kStages;
  static constexpr u32 kVEmpty = kVFull + C::kStages;
  static constexpr u32 kVLanded = kVEmpty + C::kStages;
  static constexpr u32 kTileFull = kVLanded + 1;
  static constexpr u32 kTileEmpty = kTileFull + C::kTileSlots;
  static constexpr u32 kTileIndexBytes = 4;
  static constexpr u32 kTileIndices = kTileEmpty + C::kTileSlots; // in barrier units; the indices follow
  static_assert(C::kSmemOffsetBarriers + kTileIndices * kBarrierBytes +
                        (C::kDynamicTiles ? C::kTileSlots * kTileIndexBytes : 0) + C::kSmemAlign <=
                    C::kSmemBytes,
                "the barriers fit their region");

  u32 base; // aligned to C::kSmemAlign

  __device__ __forceinline__ u32 barrier(u32 index) const {
    return base + C::kSmemOffsetBarriers + index * kBarrierBytes;
  }
  __device__ __forceinline__ u32 q_full() const { return barrier(kQFull); }
  __device__ __forceinline__ u32 q_empty() const { return barrier(kQEmpty); }
  __device__ __forceinline__ u32 k_full(int stage) const { return barrier(kKFull + stage); }
  __device__ __forceinline__ u32 k_empty(int stage) const { return barrier(kKEmpty + stage); }
  __device__ __forceinline__ u32 v_full(int stage) const { return barrier(kVFull + stage); }
  __device__ __forceinline__ u32 v_empty(int stage) const { return barrier(kVEmpty + stage); }
  __device__ __forceinline__ u32 v_landed() const { return barrier(kVLanded); }
  __device__ __forceinline__ u32 tile_full(int slot) const { return barrier(kTileFull + slot); }
  __device__ __forceinline__ u32 tile_empty(int slot) const { return barrier(kTileEmpty + slot); }
  __device__ __forceinline__ u32 tile_index(int slot) const { return barrier(kTileIndices) + slot * kTileIndexBytes; }

  // Q and O: panel-major, kBlockM rows. O either has its own region (kSeparateO) or reuses Q's
  // panels once the tile's last QK has run (kSmemOffsetO == kSmemOffsetQ).
  __device__ __forceinline__ u32 q_panel(int panel) const {
    return base + C::kSmemOffsetQ + panel * C::kSmemPanelBytesQ;
  }
  __device__ __forceinline__ u32 o_panel(int panel) const {
    return base + C::kSmemOffsetO + panel * C::kSmemPanelBytesQ;
  }
  __device__ __forceinline__ u32 k_panel(int stage, int panel) const {
    return base + C::kSmemOffsetK + stage * C::kSmemStageBytesK + panel * C::kSmemPanelBytesKV;
  }
  __device__ __forceinline__ u32 v_stage(int stage) const {
    return base + C::kSmemOffsetV + stage * C::kSmemStageBytesV;
  }
};

// Address of 16-byte chunk `chunk` of row `row` in the panel at `panel`, laid out as TMA's 128-byte
// swizzle writes it and wgmma reads it: the chunk index is XORed with the row's place in its 8-row
// atom (the panel starts on an atom).
constexpr int kSwizzleChunkBytes = 16;
template <class C> constexpr int kSwizzleAtomRows = C::kSwizzleBytes / kSwizzleChunkBytes; // rows of one atom

template <class C> __device__ __forceinline__ u32 swizzled_address(u32 panel, int row, int chunk) {
  return panel + row * C::kSwizzleBytes + ((chunk ^ (row % kSwizzleAtomRows<C>)) * kSwizzleChunkBytes);
}

// Position of the ring slot used by the i-th KV block a CTA processes (same sequence on both
// sides): the stage, and the parity of the phase in which that slot is filled.
template <class C> struct RingSlot {
  int stage;
  u32 phase;
  __device__ __forceinline__ static RingSlot at(int block_index) {
    return {block_index % C::kStages, static_cast<u32>((block_index / C::kStages) & 1)};
  }
};

} // namespace fj::fa3
