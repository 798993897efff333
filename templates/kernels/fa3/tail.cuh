// Tail split of the fa3 kernel (kTailSplit): a tile cut at a walker boundary is computed in two
// pieces by two walkers. Each piece leaves its state in the workspace as its key loop left it:
// per consumer thread, the O accumulators and its rows' running max and row-sum share. The CTA
// whose piece completes the count folds the other state into its registers and runs the ordinary
// epilogue on the result, so O and LSE are written as for a whole tile. Arrival as in the decode's fused
// merge (prim/atomic.cuh): every thread's stores, a release fence, a barrier of the consumer
// warpgroups, one atomic; the completing side acquires and reads the other side's state through L2,
// and resets the count, so the counters need zeroing only once per workspace (runtime/workspace_ledger).
#pragma once

#include "kernels/fa3/epilogue.cuh"
#include "kernels/fa3/scheduler.cuh"
#include "kernels/fa3/softmax.cuh"
#include "prim/atomic.cuh"
#include "prim/ld_global.cuh"
#include "prim/math.cuh"
#include "prim/mbarrier.cuh"
#include "prim/named_barrier.cuh"
#include "prim/types.cuh"
#include "prim/warp.cuh"

namespace fj::fa3 {

template <class C> struct TailMerge {
  // Per consumer thread: its O accumulators, then its rows' running max and row-sum share.
  static constexpr int kFloatsPerThread = C::kHeadDimV / 2 + 2 * kRowsPerThread;
  static constexpr int kMaxAt = C::kHeadDimV / 2;
  static constexpr int kSumAt = kMaxAt + kRowsPerThread;
  static constexpr u32 kConsumerThreads = C::kConsumerWarpgroups * kWarpgroupThreads;
  static_assert(C::kTailSlotFloats == C::kConsumerWarpgroups * kWarpgroupThreads * kFloatsPerThread,
                "the planner sizes a slot for every consumer thread's state");

  const fj_fa3_params &params;
  const Smem<C> &smem;
  int wg;
  int tid;

  // This thread's state in slot (boundary, side) of this CTA; value i lies at [i * kWarpgroupThreads]
  // (thread-minor: a warp's stores and loads of one value are contiguous, and the offsets fold
  // into the instructions).
  __device__ __forceinline__ float *state(const TailCut &cut, int side) const {
    const int slot = (cut.boundary * C::kTailPieces + side) * C::kClusterM + pair_rank<C>();
    return params.tail_partials + static_cast<fj_i64>(slot) * C::kTailSlotFloats +
           wg * kFloatsPerThread * kWarpgroupThreads + tid;
  }

  // Writes this piece's state as the key loop left it (O not normalized) and counts it; true on
  // the CTA whose piece completes the tile.
  __device__ __forceinline__ bool arrive(const TailCut &cut, const float (&o)[C::kHeadDimV / 2],
                                         const RowState<C> &st) const {
    float *mine = state(cut, cut.side);
#pragma unroll
    for (int i = 0; i < C::kHeadDimV / 2; ++i)
      mine[i * kWarpgroupThreads] = o[i];
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      mine[(kMaxAt + r) * kWarpgroupThreads] = st.max[r];
      mine[(kSumAt + r) * kWarpgroupThreads] = st.sum[r];
    }
    fence_acq_rel_gpu(); // release: this thread's state before the arrival below
    named_barrier_sync(C::kBarrierTail, kConsumerThreads);
    bool completes = false;
    if (wg == 0 && tid == 0) {
      i32 *counter = params.tail_counters + cut.boundary * C::kClusterM + pair_rank<C>();
      completes = atom_add_acq_rel_gpu_s32(counter, 1) == C::kTailPieces - 1;
      if (completes)
        st_relaxed_gpu_s32(counter, 0); // both pieces are in: the next launch finds the count at zero
    }
    // The barrier's answer is the same on every thread, but only the warp reduction makes that
    // visible to ptxas (prim/warp.cuh): the tile walk's early return then stays uniform.
    return redux_or_sync(named_barrier_red_or(C::kBarrierTail, kConsumerThreads, completes)) != 0;
  }

  // The two pieces' states folded into o and st, as the online softmax folds a key block: both
  // rescaled to the larger running max. Both are read back (this piece's too, rather than held in
  // registers across the arrival, which spills) and combined side 0 first, so the result does not
  // depend on which CTA merges. The epilogue then normalizes and writes the LSE as for a whole tile.
  __device__ __forceinline__ void merge(const TailCut &cut, float (&o)[C::kHeadDimV / 2], RowState<C> &st,
                                        float scale_log2) const {
    fence_acq_rel_gpu(); // acquire: the other piece's state
    const float *before = state(cut, 0);
    const float *after = state(cut, 1);
    float before_factor[kRowsPerThread], after_factor[kRowsPerThread];
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      const float before_max = __ldcg(before + (kMaxAt + r) * kWarpgroupThreads);
      const float after_max = __ldcg(after + (kMaxAt + r) * kWarpgroupThreads);
      const float top = max_f32(before_max, after_max);
      const bool any = top != neg_inf(); // neither piece saw a key: both sums stay 0
      before_factor[r] = any ? ex2_approx((before_max - top) * scale_log2) : 0.0f;
      after_factor[r] = any ? ex2_approx((after_max - top) * scale_log2) : 0.0f;
      st.sum[r] = __ldcg(before + (kSumAt + r) * kWarpgroupThreads) * before_factor[r] +
                  __ldcg(after + (kSumAt + r) * kWarpgroupThreads) * after_factor[r];
      st.max[r] = top;
    }
#pragma unroll
    for (int j = 0; j < C::kHeadDimV / kColsPerGroup; ++j)
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int i = j * kAccPerGroup + r * 2 + e;
          o[i] = __ldcg(before + i * kWarpgroupThreads) * before_factor[r] +
                 __ldcg(after + i * kWarpgroupThreads) * after_factor[r];
        }
  }

  // A cut tile's piece is done: leave its state; true when the other piece was already in, with o
  // and st then holding the whole tile for the epilogue. Otherwise only hand the Q/O region back
  // to the producer, as the epilogue would have (with kSeparateO it was released after the last QK).
  __device__ __forceinline__ bool finish(const TailCut &cut, float (&o)[C::kHeadDimV / 2], RowState<C> &st,
                                         float scale_log2) const {
    if (arrive(cut, o, st)) {
      merge(cut, o, st, scale_log2);
      return true;
    }
    if constexpr (!C::kSeparateO)
      if (tid == 0)
        mbarrier_arrive(smem.q_empty());
    return false;
  }
};

} // namespace fj::fa3
