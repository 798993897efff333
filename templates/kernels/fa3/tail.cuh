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
  // The state moves as float4s: a quarter of the loads and stores (and of the compile time they
  // cost) of scalar ones. Per consumer thread: one float4 per 8-column group of its O accumulators
  // (kMaxAt is a multiple of 4: head_dim_v is a multiple of 8), one for its rows' running max and
  // row-sum share, and (kLazyTopRounding) one for its rows' top-rounding shares.
  static constexpr int kVecFloats = 4;
  static constexpr int kTopRoundingFloats = C::kLazyTopRounding ? kVecFloats : 0;
  static constexpr int kFloatsPerThread = C::kHeadDimV / 2 + 2 * kRowsPerThread + kTopRoundingFloats;
  static constexpr int kMaxAt = C::kHeadDimV / 2;
  static constexpr u32 kConsumerThreads = C::kConsumerWarpgroups * kWarpgroupThreads;
  static_assert(C::kTailSlotFloats == C::kConsumerWarpgroups * kWarpgroupThreads * kFloatsPerThread,
                "the planner sizes a slot for every consumer thread's state");
  static constexpr int kVecsPerThread = kFloatsPerThread / kVecFloats;
  static constexpr int kStateVec = kMaxAt / kVecFloats;
  static_assert(kMaxAt % kVecFloats == 0 && 2 * kRowsPerThread == kVecFloats && kAccPerGroup == kVecFloats,
                "one float4 per 8-column group of O, one for the rows' max and sum");

  const fj_fa3_params &params;
  const Smem<C> &smem;
  int wg;
  int tid;

  // This thread's state in slot (boundary, side) of this CTA; float4 v lies at [v * kWarpgroupThreads]
  // (thread-minor: a warp's stores and loads of one float4 are contiguous, and the offsets fold
  // into the instructions).
  __device__ __forceinline__ float4 *state(const TailCut &cut, int side) const {
    const int slot = (cut.boundary * C::kTailPieces + side) * C::kClusterM + pair_rank<C>();
    return reinterpret_cast<float4 *>(params.tail_partials + static_cast<fj_i64>(slot) * C::kTailSlotFloats) +
           wg * kVecsPerThread * kWarpgroupThreads + tid;
  }

  // Writes this piece's state as the key loop left it (O not normalized) and counts it; true on
  // the CTA whose piece completes the tile.
  __device__ __forceinline__ bool arrive(const TailCut &cut, const float (&o)[C::kHeadDimV / 2],
                                         const RowState<C> &st) const {
    float4 *mine = state(cut, cut.side);
#pragma unroll
    for (int v = 0; v < kStateVec; ++v)
      mine[v * kWarpgroupThreads] =
          make_float4(o[kVecFloats * v], o[kVecFloats * v + 1], o[kVecFloats * v + 2], o[kVecFloats * v + 3]);
    mine[kStateVec * kWarpgroupThreads] = make_float4(st.reference(0), st.reference(1), st.sum[0], st.sum[1]);
    if constexpr (C::kLazyTopRounding)
      mine[(kStateVec + 1) * kWarpgroupThreads] = make_float4(st.top_rounding[0], st.top_rounding[1], 0.0f, 0.0f);
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
  // rescaled to the larger reference (running max). Both are read back (this piece's too, rather than held in
  // registers across the arrival, which spills) and combined side 0 first, so the result does not
  // depend on which CTA merges. The epilogue then normalizes and writes the LSE as for a whole tile.
  __device__ __forceinline__ void merge(const TailCut &cut, float (&o)[C::kHeadDimV / 2], RowState<C> &st,
                                        float scale_log2) const {
    fence_acq_rel_gpu(); // acquire: the other piece's state
    const float4 *before = state(cut, 0);
    const float4 *after = state(cut, 1);
    const float4 before_rows = __ldcg(before + kStateVec * kWarpgroupThreads);
    const float4 after_rows = __ldcg(after + kStateVec * kWarpgroupThreads);
    const float before_max[kRowsPerThread] = {before_rows.x, before_rows.y};
    const float after_max[kRowsPerThread] = {after_rows.x, after_rows.y};
    const float before_sum[kRowsPerThread] = {before_rows.z, before_rows.w};
    const float after_sum[kRowsPerThread] = {after_rows.z, after_rows.w};
    float before_factor[kRowsPerThread], after_factor[kRowsPerThread];
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      const float top = max_f32(before_max[r], after_max[r]);
      const bool any = top != neg_inf(); // neither piece saw a key: both sums stay 0
      before_factor[r] = any ? ex2_approx((before_max[r] - top) * scale_log2) : 0.0f;
      after_factor[r] = any ? ex2_approx((after_max[r] - top) * scale_log2) : 0.0f;
      st.sum[r] = before_sum[r] * before_factor[r] + after_sum[r] * after_factor[r];
      st.set_reference(r, top);
    }
    if constexpr (C::kLazyTopRounding) {
      const float4 before_top = __ldcg(before + (kStateVec + 1) * kWarpgroupThreads);
      const float4 after_top = __ldcg(after + (kStateVec + 1) * kWarpgroupThreads);
      st.top_rounding[0] = before_top.x * before_factor[0] + after_top.x * after_factor[0];
      st.top_rounding[1] = before_top.y * before_factor[1] + after_top.y * after_factor[1];
    }
    // Float4 v of O holds one 8-column group: rows 0 and 1 of this thread, two columns each.
#pragma unroll
    for (int v = 0; v < kStateVec; ++v) {
      const float4 b = __ldcg(before + v * kWarpgroupThreads);
      const float4 a = __ldcg(after + v * kWarpgroupThreads);
      o[kVecFloats * v] = b.x * before_factor[0] + a.x * after_factor[0];
      o[kVecFloats * v + 1] = b.y * before_factor[0] + a.y * after_factor[0];
      o[kVecFloats * v + 2] = b.z * before_factor[1] + a.z * after_factor[1];
      o[kVecFloats * v + 3] = b.w * before_factor[1] + a.w * after_factor[1];
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
