// End of a piece of the split-K decode kernel and the merges of split units: finish_piece merges the
// warps through shared memory and writes O (or a partial state) and LSE; merge_unit merges a split
// unit's partial states (row merge of kernels/combine.cuh), run by fj_decode_combine or, with
// kFusedMerge, by the CTA whose arrival completes the unit's counter (arrive_and_maybe_merge).
#pragma once

#include "kernel_params.h"
#include "kernels/combine.cuh"
#include "kernels/decode/smem.cuh"
#include "kernels/decode/softmax.cuh"
#include "kernels/decode/timeline.cuh"
#include "kernels/decode/traits.cuh"
#include "kernels/decode/work.cuh"
#include "params_decode.h"
#include "prim/atomic.cuh"
#include "prim/ld_global.cuh"
#include "prim/math.cuh"
#include "prim/st_global.cuh"
#include "prim/timer.cuh"
#include "prim/types.cuh"
#include "prim/warp.cuh"

namespace fj::decode {

// ---- end of a piece: merge the warps, write O (or a partial state) and LSE -----------------------

constexpr int kStatsPerRow = 2; // (max, sum)

__device__ __forceinline__ fj_decode_merge load_merge(const fj_decode_merge *merge) {
  i32 raw[4]; // {unit, first_state, count, pad}: one 16-byte load
  ld_global_nc_v4_s32(raw, merge);
  return {raw[0], raw[1], raw[2], raw[3]};
}

// The output row of packed row `row` of unit `u`: O and (null without LSE) its LSE.
__device__ __forceinline__ u16 *merge_out_row(const fj_attention_params &a, const Unit &u, int row, float **lse) {
  const int packed = u.m_block * Cfg::kBlockM + row;
  const int token = packed / Cfg::kGqaGroup;
  const int head = u.head_kv * Cfg::kGqaGroup + packed % Cfg::kGqaGroup;
  *lse = a.maybe_lse == nullptr ? nullptr : a.maybe_lse + ((i64)u.batch * a.heads_q + head) * a.seqlen_q + token;
  return static_cast<u16 *>(const_cast<void *>(a.o.ptr)) + (i64)u.batch * a.o.batch_stride +
         (i64)token * a.o.row_stride + (i64)head * a.o.head_stride;
}

// Merges the partial states of one split unit into O (and LSE): warp w of `Warps` takes packed
// rows w, w + Warps, ... `Coherent`: the states were written by other CTAs of this grid (fused).
template <int Warps, bool Coherent>
__device__ __forceinline__ void merge_unit(const fj_decode_params &p, const fj_decode_merge &merge) {
  const fj_attention_params &a = p.attn;
  const fj_decode_work as_work{merge.unit, 0, 0, 0};
  const Unit u = decode_unit_rows(p, as_work);
  constexpr i64 kStateO = (i64)Cfg::kBlockM * Cfg::kHeadDimV;
  for (int row = warp_id(); row < u.rows_here; row += Warps) {
    float *lse;
    u16 *dst = merge_out_row(a, u, row, &lse);
#ifdef FJ_DECODE_MERGE_ONE_PASS // diagnostic builds only (bench/harness/decode gen's ONEPASS=1)
    merge_states_row_one_pass<Cfg::kDType, Cfg::kHeadDimV, Cfg::kAligned16, Coherent>(
#else
    merge_states_row<Cfg::kDType, Cfg::kHeadDimV, Cfg::kAligned16, Coherent>(
#endif
        a.maybe_partial_o + merge.first_state * kStateO + (i64)row * Cfg::kHeadDimV, kStateO,
        a.maybe_partial_lse + (i64)merge.first_state * Cfg::kBlockM + row, Cfg::kBlockM, merge.count, dst, lse);
  }
}

// The fused merge's arrays after merges[grid] (params_decode.h; compiler/splitk_schedule.cpp).
__device__ __forceinline__ const i32 *state_merge_array(const fj_decode_params &p) {
  return reinterpret_cast<const i32 *>(p.merges + gridDim.x);
}
__device__ __forceinline__ i32 *merge_counter_array(const fj_decode_params &p) {
  constexpr int kRound = fj_decode_i32_per_16_bytes;
  const int states = fj_decode_states_per_cta * (int)gridDim.x;
  return const_cast<i32 *>(state_merge_array(p)) + (states + kRound - 1) / kRound * kRound;
}

// The merge a split piece's partial state `state` belongs to (host-written: read while the piece's
// first tiles load, so the arrival at its end waits for no lookup).
struct PieceMerge {
  int index; // into merges[] and the merge counters
  fj_decode_merge merge;
};

__device__ __forceinline__ PieceMerge piece_merge(const fj_decode_params &p, int state) {
  PieceMerge m{0, {0, 0, 0, 0}};
  if constexpr (Cfg::kFusedMerge != 0)
    if (state >= 0) {
      m.index = ld_global_nc_s32(state_merge_array(p) + state);
      m.merge = load_merge(p.merges + m.index);
    }
  return m;
}

// Fused merge, called by every thread of a CTA once its partial state (of merge `pm`) is written. The
// barrier orders the CTA's state stores before thread 0's release (fence + acq_rel add) on the
// merge's counter; the arrival that completes the count acquires, so the other CTAs' states are
// visible to that CTA, which merges the unit (loads through L2: see ld_state_f32) and puts the
// counter back to zero for the next launch or graph replay (nothing else touches it in this grid:
// every arrival has happened). The counters are first touched after griddepcontrol.wait, so the
// previous step's grid, which used the same counters, has completed.
__device__ __forceinline__ void arrive_and_maybe_merge(const fj_decode_params &p, const PieceMerge &pm) {
  __syncthreads(); // every thread's partial-state stores, before thread 0's release below
  bool last = false;
  if (threadIdx.x == 0) {
    i32 *counter = merge_counter_array(p) + pm.index;
    fence_acq_rel_gpu();
    last = atom_add_acq_rel_gpu_s32(counter, 1) == pm.merge.count - 1;
    if (last)
      st_relaxed_gpu_s32(counter, 0);
  }
  if (!bar_red_or(last)) // uniform: thread 0's decision, to every thread
    return;
  fence_acq_rel_gpu(); // acquire for every thread: the states, after thread 0's acquire and the barrier
  FJ_DECODE_MARK(p, fj_mark_merge_start, global_timer_ns());
  merge_unit<Traits::kWarps, true>(p, pm.merge);
}

__device__ __forceinline__ void finish_piece(const fj_decode_params &p, const Unit &u, const Smem &smem, WarpState &st,
                                             const PieceMerge &pm) {
  const fj_attention_params &a = p.attn;
  const int lane = lane_id();
  const int group_row = lane / kQuadSize;
  const int quad_col = 2 * (lane % kQuadSize);
  float *stats = smem.stats();
  float *merge = smem.merge();
  float *warp_merge = merge + warp_id() * Cfg::kBlockM * Cfg::kMergeRowFloats;

  __syncthreads(); // every warp is done reading the ring, which `merge` aliases
#pragma unroll
  for (int m = 0; m < Traits::kMTiles; ++m) {
#pragma unroll
    for (int h = 0; h < kRowsPerThreadTile; ++h) {
      const int row = m * kMmaM + h * kHalfTile + group_row;
      const float sum = quad_reduce_sum(st.row_sum[m][h]);
      if (lane % kQuadSize == 0) {
        stats[(warp_id() * Cfg::kBlockM + row) * kStatsPerRow] = st.row_max[m][h];
        stats[(warp_id() * Cfg::kBlockM + row) * kStatsPerRow + 1] = sum;
      }
#pragma unroll
      for (int n = 0; n < Traits::kNTilesO; ++n) {
        float *dst = warp_merge + row * Cfg::kMergeRowFloats + n * kMmaN + quad_col;
        dst[0] = st.o[m][n][2 * h];
        dst[1] = st.o[m][n][2 * h + 1];
      }
    }
  }
  __syncthreads();

  // Threads sweep (row, 8-column chunk) pairs of the block; a row's weights are recomputed by each
  // of its chunks' threads (kWarps exponentials), cheaper than another barrier.
  constexpr int kChunksPerRow = Cfg::kHeadDimV / kMergeChunk;
  for (int c = (int)threadIdx.x; c < u.rows_here * kChunksPerRow; c += Cfg::kThreads) {
    const int row = c / kChunksPerRow;
    const int col = (c % kChunksPerRow) * kMergeChunk;
    float max_all = neg_inf();
#pragma unroll
    for (int w = 0; w < Traits::kWarps; ++w)
      max_all = max_f32(max_all, stats[(w * Cfg::kBlockM + row) * kStatsPerRow]);
    const bool empty = max_all == neg_inf();
    float weight[Traits::kWarps];
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < Traits::kWarps; ++w) {
      const float wmax = stats[(w * Cfg::kBlockM + row) * kStatsPerRow];
      weight[w] = empty ? 0.f : ex2_approx(wmax - max_all);
      total += weight[w] * stats[(w * Cfg::kBlockM + row) * kStatsPerRow + 1];
    }
    const float inv_total = total > 0.f ? rcp_approx(total) : 0.f;
    float out[kMergeChunk];
#pragma unroll
    for (int i = 0; i < kMergeChunk; ++i) {
      float acc = 0.f;
#pragma unroll
      for (int w = 0; w < Traits::kWarps; ++w)
        acc += weight[w] * merge[(w * Cfg::kBlockM + row) * Cfg::kMergeRowFloats + col + i];
      out[i] = acc * inv_total;
    }
    // Natural-log LSE of the row over this piece's keys: (max + log2 total) * ln 2.
    const float lse = total > 0.f ? (max_all + lg2_approx(total)) * kLn2 : neg_inf();

    const int packed = u.m_block * Cfg::kBlockM + row;
    if (u.state < 0) {
      const int token = packed / Cfg::kGqaGroup;
      const int head = u.head_kv * Cfg::kGqaGroup + packed % Cfg::kGqaGroup;
      u16 *dst = static_cast<u16 *>(const_cast<void *>(a.o.ptr)) + (i64)u.batch * a.o.batch_stride +
                 (i64)token * a.o.row_stride + (i64)head * a.o.head_stride + col;
      store_16bit<Cfg::kDType, Cfg::kAligned16>(dst, out);
      if (a.maybe_lse != nullptr && col == 0)
        st_global_f32(a.maybe_lse + ((i64)u.batch * a.heads_q + head) * a.seqlen_q + token, lse);
    } else {
      float *dst = a.maybe_partial_o + ((i64)u.state * Cfg::kBlockM + row) * Cfg::kHeadDimV + col;
#pragma unroll
      for (int h = 0; h < kMergeChunk / kF32PerVec; ++h) {
        const float v[kF32PerVec] = {out[h * kF32PerVec], out[h * kF32PerVec + 1], out[h * kF32PerVec + 2],
                                     out[h * kF32PerVec + 3]};
        st_global_v4_f32(dst + h * kF32PerVec, v);
      }
      if (col == 0)
        st_global_f32(a.maybe_partial_lse + (i64)u.state * Cfg::kBlockM + row, lse);
    }
  }
  FJ_DECODE_MARK(p, fj_mark_stored, global_timer_ns());
  if constexpr (Cfg::kFusedMerge != 0)
    if (u.state >= 0) // uniform over the CTA
      arrive_and_maybe_merge(p, pm);
  __syncthreads(); // the next piece's copies overwrite `merge` and `stats`
}

} // namespace fj::decode
