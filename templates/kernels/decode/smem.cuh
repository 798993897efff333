// Shared-memory map of the split-K decode kernel: Q, the kStages K/V ring, the paged row-address
// ring (TMA tiles: the stage barriers in its place), the per-warp stats and the merge scratch that
// aliases the ring. Every offset comes from the plan (KernelConfig).
#pragma once

#include "kernels/decode/traits.cuh"
#include "prim/types.cuh"

namespace fj::decode {

// ---- shared memory -------------------------------------------------------------------------------

struct Smem {
  char *base;
  __device__ u16 *q() const { return reinterpret_cast<u16 *>(base + Cfg::kSmemOffsetQ); }
  __device__ u16 *k(int stage) const {
    return reinterpret_cast<u16 *>(base + Cfg::kSmemOffsetKV + stage * Cfg::kSmemStageBytes);
  }
  __device__ u16 *v(int stage) const {
    return reinterpret_cast<u16 *>(base + Cfg::kSmemOffsetKV + stage * Cfg::kSmemStageBytes + Cfg::kSmemOffsetVInStage);
  }
  // Paged KV: global address of every K row of the tile in `stage`, then of every V row.
  __device__ const u16 **row_addrs(int stage) const {
    return reinterpret_cast<const u16 **>(base + Cfg::kSmemOffsetPages) + stage * Traits::kRowAddrsPerStage;
  }
  // TMA tiles: the full barrier of `stage`, where cp.async tiles keep their paged row addresses.
  __device__ u32 full_bar(int stage) const {
    return cvta_to_shared_u32(base + Cfg::kSmemOffsetPages) + stage * TmaTile::kMbarrierBytes;
  }
  // Per-warp (max, sum) of every row, for the cross-warp merge.
  __device__ float *stats() const { return reinterpret_cast<float *>(base + Cfg::kSmemOffsetStats); }
  // Per-warp unnormalized O rows; aliases the KV ring, which is idle once a piece is done.
  __device__ float *merge() const { return reinterpret_cast<float *>(base + Cfg::kSmemOffsetKV); }
};

} // namespace fj::decode
