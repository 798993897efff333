// Compile-time shape of the split-K decode kernel (kernels/decode_splitk.cuh): `Cfg`, the rendered
// KernelConfig every part reads; the 16-byte copy shape (the MMA's is prim/mma.cuh's); Traits, the tiling
// the plan implies, with the static_asserts that check the plan's layout; and TmaTile, the swizzled
// layout of K/V tiles loaded by TMA (kTmaKv). The other parts build on these.
#pragma once

#include "prim/cp_async.cuh"
#include "prim/mma.cuh"
#include "prim/types.cuh"
#include "prim/warp.cuh"

namespace fj::decode {

using Cfg = KernelConfig;

// One 16-byte copy of 16-bit elements (the MMA's m16n8k16 shape is prim/mma.cuh's).
constexpr int kElemBytes = 2;
constexpr int kChunkElems = kCpAsyncBytes / kElemBytes;
// Rows of a C fragment a thread owns per m tile: g and g + 8.
constexpr int kRowsPerThreadTile = 2;
constexpr int kHalfTile = 8;

struct Traits {
  static constexpr int kWarps = Cfg::kThreads / kWarpSize;
  static constexpr int kMTiles = Cfg::kBlockM / kMmaM;
  static constexpr int kNTilesS = Cfg::kWarpN / kMmaN;  // S columns (keys) per warp, in n8 tiles
  static constexpr int kKStepsPV = Cfg::kWarpN / kMmaK; // P.V k steps per warp
  static constexpr int kKStepsQK = Cfg::kHeadDimQKMma / kMmaK;
  static constexpr int kNTilesO = Cfg::kHeadDimV / kMmaN; // O columns in n8 tiles
  static constexpr int kChunksQK = Cfg::kHeadDimQK / kChunkElems;
  static constexpr int kChunksV = Cfg::kHeadDimV / kChunkElems;
  static constexpr int kRows = Cfg::kGqaGroup * Cfg::kQLen; // packed query rows of a unit
  static constexpr bool kPaged = Cfg::kPageSize > 0;
  static constexpr int kRowAddrsPerStage = 2 * Cfg::kBlockN; // paged: a K and a V address per tile row

  static_assert(Cfg::kThreads % kWarpSize == 0, "whole warps");
  static_assert(Cfg::kBlockM % kMmaM == 0 && Cfg::kBlockM == Cfg::kMTiles * kMmaM, "block_m");
  static_assert(Cfg::kBlockN == Cfg::kWarpN * kWarps, "each warp owns kWarpN keys of a tile");
  static_assert(Cfg::kWarpN % kMmaK == 0, "a warp's keys are whole P.V k steps");
  static_assert(Cfg::kHeadDimQK % kChunkElems == 0 && Cfg::kHeadDimV % kChunkElems == 0, "dims % 8");
  static_assert(Cfg::kHeadDimQKMma % kMmaK == 0 && Cfg::kHeadDimQKMma >= Cfg::kHeadDimQK, "qk pad");
  static_assert(Cfg::kSmemRowQK >= Cfg::kHeadDimQKMma && Cfg::kSmemRowV >= Cfg::kHeadDimV, "smem rows");
  static_assert(Cfg::kMBlocks * Cfg::kBlockM >= kRows, "m blocks cover the packed rows");
  static_assert(Cfg::kStages >= 2, "a ring needs two stages");
  static_assert(Cfg::kSmemOffsetKV + Cfg::kStages * Cfg::kSmemStageBytes <= Cfg::kSmemOffsetStats, "ring fits");
  static_assert(Cfg::kSmemOffsetKV + kWarps * Cfg::kBlockM * Cfg::kMergeRowFloats * (int)sizeof(float) <=
                    Cfg::kSmemOffsetStats,
                "the merge scratch fits in the ring it aliases");
  static_assert(Cfg::kSmemOffsetStats + kWarps * Cfg::kBlockM * 2 * (int)sizeof(float) <= Cfg::kSmemOffsetPages,
                "stats fit");
  static_assert(!kPaged || Cfg::kTmaKv ||
                    Cfg::kSmemOffsetPages + Cfg::kStages * kRowAddrsPerStage * (int)sizeof(void *) <= Cfg::kSmemBytes,
                "row addresses fit");
};

// TMA tiles (plan constant kTmaKv): K/V tiles land by TMA, 64-column boxes with the 128-byte
// swizzle (a whole tile over contiguous KV, kTmaBoxRows keys of one page over pages), credited to one
// mbarrier per stage, instead of 16-byte cp.async copies by every thread. The tensor maps follow
// the parameter block (fj_decode_tma_params). Measured in docs/perf-notes.md (decode, runs 21-21e).
constexpr bool kTmaKv = Cfg::kTmaKv;

struct TmaTile {
  static constexpr int kSwizzleBytes = 128; // one swizzled panel row
  static constexpr int kSwizzleRows = 8;    // the XOR pattern's period, in rows
  static constexpr int kChunkBytes = 16;    // the unit the pattern permutes
  static constexpr int kPanelCols = kSwizzleBytes / kElemBytes;
  static constexpr int kPanelBytes = Cfg::kBlockN * kSwizzleBytes;
  static constexpr int kPanelsQK = Cfg::kHeadDimQK / kPanelCols;
  static constexpr int kPanelsV = Cfg::kHeadDimV / kPanelCols;
  static constexpr int kAtomBytes = kSwizzleRows * kSwizzleBytes; // swizzled boxes start on one
  // Paged KV: a box is kTmaBoxRows keys of one page (pieces start on multiples of it, and page sizes
  // are multiples of it), so a tile is kGroups boxes per panel; contiguous: one box of kBlockN.
  static constexpr int kBoxRows = Cfg::kTmaBoxRows;
  static constexpr int kGroups = Cfg::kBlockN / kBoxRows;
  static constexpr int kMbarrierBytes = 8;
  static constexpr u32 kGroupTxBytes = (kPanelsQK + kPanelsV) * kBoxRows * kSwizzleBytes; // K and V of a group

  static_assert(!kTmaKv || Cfg::kAligned16, "TMA tiles: 16-byte aligned rows");
  static_assert(!kTmaKv || Cfg::kBlockN % kBoxRows == 0, "TMA tiles: a tile is whole boxes");
  static_assert(!kTmaKv || Traits::kPaged || kBoxRows == Cfg::kBlockN, "TMA tiles: one box per contiguous tile");
  static_assert(!kTmaKv || !Traits::kPaged || (Cfg::kPageSize % kBoxRows == 0 && kGroups <= kWarpSize),
                "TMA tiles: page sizes of whole boxes");
  static_assert(!kTmaKv || (Cfg::kHeadDimQK % kPanelCols == 0 && Cfg::kHeadDimV % kPanelCols == 0 &&
                            Cfg::kHeadDimQKMma == Cfg::kHeadDimQK),
                "TMA tiles: head dims of whole 64-column panels");
  static_assert(!kTmaKv || (Cfg::kSmemOffsetKV % kAtomBytes == 0 && Cfg::kSmemStageBytes % kAtomBytes == 0 &&
                            Cfg::kSmemOffsetVInStage % kAtomBytes == 0),
                "TMA tiles: stages on the swizzle atom");
  static_assert(!kTmaKv || (kPanelsQK * kPanelBytes <= Cfg::kSmemOffsetVInStage &&
                            kPanelsV * kPanelBytes <= Cfg::kSmemStageBytes - Cfg::kSmemOffsetVInStage),
                "TMA tiles fit the stage");
  static_assert(!kTmaKv || Cfg::kSmemOffsetPages + Cfg::kStages * kMbarrierBytes + kAtomBytes <= Cfg::kSmemBytes,
                "TMA tiles: the stage barriers and the base's rounding fit");

  // Byte offset of (row, col) in a tile of kBlockN-row panels: chunk c of row r sits at c ^ (r % 8).
  __device__ static u32 offset(int row, int col) {
    const int panel = col / kPanelCols;
    const int chunk = (col % kPanelCols) / kChunkElems;
    return (u32)(panel * kPanelBytes + row * kSwizzleBytes + (chunk ^ (row % kSwizzleRows)) * kChunkBytes);
  }
};

} // namespace fj::decode
