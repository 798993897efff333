// Compile-time shape of the FlashAttention-2 prefill kernel (kernels/fa2_prefill.cuh): `Cfg`, the
// rendered KernelConfig every part reads; the 16-byte chunk shape (the MMA's is prim/mma.cuh's); the
// fragment counts and schedule constants the plan implies (kSubBlocks, kMBlocks, kFoldScale, kRing,
// kPrologueBlocks, kGroupsInFlight), with the static_asserts that check the plan's layout; and
// kPageRows. The other parts build on these.
#pragma once

#include "prim/cp_async.cuh"
#include "prim/mma.cuh"
#include "prim/warp.cuh"

namespace fj::fa2 {

using Cfg = KernelConfig;

// How a 16-bit row splits into 16-byte chunks, and ldmatrix's half of an MMA's reduction.
constexpr int kHalfMmaK = kMmaK / 2; // ldmatrix matrices are 8 columns wide
constexpr int kElemBytes = 2;
constexpr int kChunkElems = kCpAsyncBytes / kElemBytes;

constexpr int kChunksQK = Cfg::kHeadDimQK / kChunkElems; // 16-byte chunks per Q/K row
constexpr int kChunksV = Cfg::kHeadDimV / kChunkElems;   // per V/O row
// The ring schedule runs the math of a key block in sub-blocks of kSubBlockN keys, each a whole
// QK -> softmax -> PV step, in a loop that is not unrolled, so a thread holds the S accumulators
// of one sub-block only; the copies and the barrier stay per kBlockN keys. The planner uses one
// step per block (kSubBlockN = kBlockN): several steps were measured slower than one step of the
// same keys (perf-notes "fa2: key blocks past the budget"); Fa2Tuning::sub_block_n sets it.
constexpr int kSubBlocks = Cfg::kBlockN / Cfg::kSubBlockN;
constexpr int kTilesN = Cfg::kSubBlockN / kMmaN;     // S fragments per warp row block
constexpr int kTilesDV = Cfg::kHeadDimV / kMmaN;     // O fragments (exactly head_dim_v)
constexpr int kStepsQK = Cfg::kHeadDimQKPad / kMmaK; // k-steps of Q K^T (zero-padded)
constexpr int kStepsPV = Cfg::kSubBlockN / kMmaK;    // k-steps of P V per sub-block
constexpr int kMBlocks = Cfg::kRowsPerWarp / kMmaM;  // m16 row blocks per warp (1 or 2)
// The scale goes into the exponent, exp2(s * scale_log2 - max * scale_log2) as one FFMA, instead
// of a separate multiply of every logit (the max commutes with a positive scale). A softcap needs
// the scaled logit for its tanh, so it keeps the pass. Only the 32-row schedule folds for now: the
// 16-row one keeps its GPU-verified arithmetic bit for bit until the new path has been measured.
constexpr bool kFoldScale = kMBlocks > 1 && !Cfg::kSoftcap;
// Ring schedule with kStages >= 2, else the interleaved single-buffer one (see the top of
// kernels/fa2_prefill.cuh).
constexpr bool kRing = Cfg::kStages >= 2;
// Blocks loaded before the loop: the ring keeps kStages - 1 blocks ahead of the one in use.
constexpr int kPrologueBlocks = kRing ? Cfg::kStages - 1 : 1;
// Groups still allowed in flight once the K (or V) block about to be used has landed: the ring
// waits for K_j and V_j together behind kStages - 2 younger blocks; the single-buffer schedule
// waits for K_j behind V_j, and for V_j behind the refill of K.
constexpr int kGroupsInFlight = kRing ? 2 * (Cfg::kStages - 2) : 1;

static_assert(Cfg::kRowsPerWarp % kMmaM == 0 && kMBlocks >= 1 && kMBlocks <= 2, "one or two m16 blocks per warp");
static_assert(Cfg::kWarps * kWarpSize == Cfg::kThreads && Cfg::kWarps * Cfg::kRowsPerWarp == Cfg::kBlockM);
static_assert(Cfg::kSubBlockN % kMmaK == 0, "sub-blocks are whole k-steps of P V");
static_assert(Cfg::kBlockN % Cfg::kSubBlockN == 0 && (kRing || kSubBlocks == 1),
              "sub-blocks tile the key block; the single-buffer schedule has one");
static_assert(Cfg::kHeadDimQK % kChunkElems == 0 && Cfg::kHeadDimV % kChunkElems == 0);
static_assert(Cfg::kHeadDimQKPad % kMmaK == 0 && Cfg::kHeadDimQKPad >= Cfg::kHeadDimQK &&
              Cfg::kHeadDimQKPad - Cfg::kHeadDimQK < kMmaK);
static_assert(Cfg::kSmemStrideQ >= Cfg::kHeadDimQKPad && Cfg::kSmemStrideK >= Cfg::kHeadDimQKPad &&
              Cfg::kSmemStrideV >= Cfg::kHeadDimV && Cfg::kSmemStrideO >= Cfg::kHeadDimV);
static_assert(Cfg::kSmemStrideQ % kChunkElems == 0 && Cfg::kSmemStrideK % kChunkElems == 0 &&
              Cfg::kSmemStrideV % kChunkElems == 0 && Cfg::kSmemStrideO % kChunkElems == 0);
static_assert(Cfg::kHeadDimQKPad == Cfg::kHeadDimQK || Cfg::kHeadDimQKPad - Cfg::kHeadDimQK == kChunkElems,
              "the K-dim padding is at most one chunk");
static_assert(Cfg::kStages >= 1 && Cfg::kPageSize >= 0);

// Page size as a divisor that is never 0 (contiguous KV never divides by it; the branch is only
// discarded, not skipped, outside a template).
constexpr int kPageRows = Cfg::kPageSize > 0 ? Cfg::kPageSize : 1;

} // namespace fj::fa2
