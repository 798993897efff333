// Online softmax on a wgmma accumulator tile (64 x kBlockN per warpgroup). Each thread holds two
// rows (lane/4 and lane/4 + 8 of its warp's 16) and, per 8-column group j, columns
// 8j + 2(lane%4) + {0, 1}: s[4j + 0..1] belong to row 0, s[4j + 2..3] to row 1. A row is spread
// over the 4 lanes of a quad, so the row max needs two xor-shuffles; the row sum stays
// per-thread until the epilogue. Logits stay raw (unscaled) so exp2 is one FFMA + MUFU:
// p = 2^(s * scale_log2 - m * scale_log2).
#pragma once

#include "exp2_poly.h"
#include "kernels/fa3/scheduler.cuh"
#include "prim/math.cuh"
#include "prim/named_barrier.cuh"
#include "prim/types.cuh"
#include "prim/warp.cuh"

namespace fj::fa3 {

constexpr int kWarpgroupThreads = 128;
constexpr int kRowsPerThread = 2;
constexpr int kAccPerGroup = 4; // accumulator registers per 8-column group
constexpr int kColsPerGroup = 8;
constexpr int kRowHalf = 8; // second row of a thread is 8 rows below the first
// kLazyRescale: the running max moves only when a block raises it by more than this (exp2 units),
// so p = 2^(s*c - m*c) <= 2^8 = 256 (exact in fp32; a 16-bit P keeps its relative precision) and
// O and the sum keep their scale (factor exactly 1) for most blocks.
constexpr float kLazyRescaleLog2 = 8.0f;

// 2^x on the FMA/ALU pipes, for x <= 0 (or -inf), by the polynomial of exp2_poly.h. Used for a share
// of the exponentials (kExp2PolyEvery) so the MUFU unit, which otherwise limits small head dims, and
// the FMA pipe share the work.
__device__ __forceinline__ float exp2_poly3(float x) {
  using namespace fj_exp2_poly;
  x = max_f32(x, kMinExponent);
  const float rounded = x + kRoundMagic;
  const float f = x - (rounded - kRoundMagic);
  const float poly = ((kC3 * f + kC2) * f + kC1) * f + kC0;
  // The low mantissa bits of `rounded` hold j; shifted into the exponent field they give 2^j.
  const int exponent = (__float_as_int(rounded) << kMantissaBits) + (kExponentBias << kMantissaBits);
  return poly * __int_as_float(exponent);
}

// kLazyTopRounding: each of a quad's four lanes adds this share of the block's top rounding (they all
// compute the same one), so the epilogue's quad sum counts it once.
constexpr float kQuadShare = 0.25f;

template <class C> struct RowState {
  float max[kRowsPerThread]; // running max of raw (or soft-capped) logits; -inf before any key
  float sum[kRowsPerThread]; // this thread's share of sum(p), rescaled with the max
  // kLazyTopRounding: this thread's share of sum(round(p_top) - p_top) over the blocks, rescaled
  // with the max, where p_top is a block's largest p. O is normalized by sum + top_rounding, the
  // LSE by sum (see softmax_step).
  float top_rounding[kRowsPerThread];
  // kExpBeforeMax: the value O and the sum are relative to (the running max before the last block, or
  // -inf while the row has seen no key); otherwise they are relative to max.
  float ref[kRowsPerThread];

  // A tile's rows before its first key block.
  __device__ __forceinline__ void reset() {
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      max[r] = neg_inf();
      sum[r] = 0.0f;
      top_rounding[r] = 0.0f;
      ref[r] = neg_inf();
    }
  }

  // What O and the sum are relative to: LSE = reference * c + log2(sum).
  __device__ __forceinline__ float reference(int r) const {
    return C::kExpBeforeMax ? ref[r] : max[r];
  }
  __device__ __forceinline__ void set_reference(int r, float value) {
    if constexpr (C::kExpBeforeMax)
      ref[r] = value;
    max[r] = value;
  }
};

// Sets invisible logits to -inf. `row0` is the thread's first row in the sequence, `col0` the
// column of s[0] (block start + 2 * (lane % 4)).
template <class C>
__device__ __forceinline__ void apply_mask(float (&s)[C::kBlockN / 2], int row0, int col0, const Tile &t,
                                           const Window &w) {
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const int row = row0 + r * kRowHalf;
    int col_end = t.seqlen_k; // exclusive
    if (w.has_right)
      col_end = min(col_end, row + w.offset + w.right + 1);
    const int col_begin = w.has_left ? row + w.offset - w.left : 0;
#pragma unroll
    for (int j = 0; j < C::kBlockN / kColsPerGroup; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = col0 + j * kColsPerGroup + e;
        if (col >= col_end || col < col_begin)
          s[j * kAccPerGroup + r * 2 + e] = neg_inf();
      }
  }
}

// Soft cap in the raw-logit domain: s' = (cap / scale) * tanh(s * scale / cap), so that
// s' * scale = cap * tanh(s * scale / cap), the capped logit.
template <class C> __device__ __forceinline__ void apply_softcap(float (&s)[C::kBlockN / 2], float pre, float post) {
#pragma unroll
  for (int i = 0; i < C::kBlockN / 2; ++i)
    s[i] = post * tanh_fast(s[i] * pre);
}

// Folds partials into partials[0] (and returns it) as a tree, pairs at width 1, 2, 4, ...: the dependent
// chain is log2(kN) long. kN is a power of two.
template <int kN, class Op> __device__ __forceinline__ float tree_fold(float (&partials)[kN], Op op) {
#pragma unroll
  for (int width = 1; width < kN; width *= 2)
#pragma unroll
    for (int i = 0; i + width < kN; i += 2 * width)
      partials[i] = op(partials[i], partials[i + width]);
  return partials[0];
}
__device__ __forceinline__ float add_f32(float a, float b) {
  return a + b;
}

// The exponent of p = 2^((s - max) * scale_log2), bias = -max * scale_log2: one FFMA, or
// (kExpSubtractFirst) an FADD and an FMUL, which ptxas spreads between the MUFU ops.
template <class C> __device__ __forceinline__ float exponent(float s, float max, float scale_log2, float bias) {
  if constexpr (C::kExpSubtractFirst)
    return (s - max) * scale_log2;
  else
    return s * scale_log2 + bias; // contracted to one FFMA
}

// The forms of kSkipMaskedGroups: the prologue block's column groups that the mask hides from every
// row of a warp are skipped in chunks of kSkipChunkGroups (the plan's), one warp-uniform branch
// per chunk and row (kSkipMaskedBranch), or the block's softmax is compiled twice, over all of its
// columns and over the first half only, and one warp-uniform branch takes the half form where the
// mask hides the second half from the whole warp (kSkipMaskedHalf: each form is one straight block
// that ptxas schedules as a whole). A predicate on each exponential is no third form: ptxas
// if-converts `@p ex2` into an unconditional MUFU.EX2 and an FSEL.
constexpr int kSkipMaskedBranch = 1;
constexpr int kSkipMaskedHalf = 2;

// One online-softmax step: updates the row max, returns the factor the old O and sum must be
// multiplied by, turns s into p = exp2((s - max) * scale_log2) and adds it to the row sum. Column
// groups from `live_groups` (a multiple of kSkipChunkGroups, kSkipMaskedBranch) or kLiveGroups
// on hold only -inf for every row of the warp: their p is 0, set without an exponential (ex2(-inf)
// is +0, and max ignores -inf, so the result is the same bit for bit).
template <class C, int kLiveGroups = C::kBlockN / kColsPerGroup>
__device__ __forceinline__ void softmax_step(float (&s)[C::kBlockN / 2], RowState<C> &st, float scale_log2,
                                             float (&rescale)[kRowsPerThread],
                                             int live_groups = C::kBlockN / kColsPerGroup) {
  static_assert(kLiveGroups >= 1 && kLiveGroups <= C::kBlockN / kColsPerGroup, "a count of the block's groups");
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    // kRowMaxPartials running maxima over interleaved column groups, combined by a tree: the
    // dependent FMNMX chain before the exponentials is kBlockN / 8 / kRowMaxPartials long, not
    // kBlockN / 8 (max is exact in any order, so the result does not change).
    constexpr int kPartials = C::kRowMaxPartials <= kLiveGroups ? C::kRowMaxPartials : 1;
    static_assert(kPartials >= 1 && (kPartials & (kPartials - 1)) == 0 && kPartials <= C::kBlockN / kColsPerGroup,
                  "a power of two no larger than the column groups");
    float partial[kPartials];
#pragma unroll
    for (int j = 0; j < kLiveGroups; ++j) {
      const float pair = max_f32(s[j * kAccPerGroup + r * 2], s[j * kAccPerGroup + r * 2 + 1]);
      partial[j % kPartials] = j < kPartials ? pair : max_f32(partial[j % kPartials], pair);
    }
    tree_fold<kPartials>(partial, max_f32);
    // This block's largest logit on its own (kLazyTopRounding), or folded with the running max.
    const float block_top = C::kLazyTopRounding ? quad_reduce_max(partial[0]) : partial[0];
    float block_max =
        C::kLazyTopRounding ? max_f32(st.max[r], block_top) : quad_reduce_max(max_f32(st.max[r], block_top));
    bool keep_max = false;
    if constexpr (C::kLazyRescale)
      keep_max = st.max[r] != neg_inf() && (block_max - st.max[r]) * scale_log2 <= kLazyRescaleLog2;
    if (keep_max)
      block_max = st.max[r];
    // A row that has seen no key keeps max = -inf; use 0 so that exp2 gives 0, not NaN.
    const float safe_max = block_max == neg_inf() ? 0.0f : block_max;
    const float bias = -safe_max * scale_log2;
    if constexpr (C::kLazyTopRounding) {
      // Under a kept (stale) max the block's top p is 2^d with 0 < d <= 8 where it raised the row's
      // max, and the 16-bit P fed to P.V rounds it by up to 2^-8; eager rescaling makes it exactly
      // 1. In a peaked row that one rounding is most of O's error, and the sum of the unrounded p
      // no longer matches the P that weighted V (run 29j's failure: 2.8x the naive error). Adding
      // round(p_top) - p_top to O's normalizer restores the match; it costs no exp2 of its own: the
      // one exp2 is the factor when the max moves (the top p is then 1, exact) and p_top when it stays.
      // p_top's argument is the same exponent() as its element's in the loop below (the same value
      // unless that column takes the exp2 polynomial, 7.5e-5 apart).
      const float power = ex2_approx(keep_max ? exponent<C>(block_top, safe_max, scale_log2, bias)
                                              : (st.max[r] - safe_max) * scale_log2);
      rescale[r] = keep_max ? 1.0f : power;
      const float top = keep_max ? power : 1.0f;
      st.top_rounding[r] = st.top_rounding[r] * rescale[r] + kQuadShare * (round_to_16bit<C::kDType>(top) - top);
    } else {
      rescale[r] = keep_max ? 1.0f : ex2_approx((st.reference(r) - safe_max) * scale_log2);
    }
    st.max[r] = block_max;
    if constexpr (C::kExpBeforeMax)
      st.ref[r] = block_max; // -inf while the row has seen no key (O and the sum are then 0)
    // kRowSumPartials running sums over interleaved logits, combined by a tree: the dependent FADD
    // chain is kBlockN / 4 / kRowSumPartials long (one chain keeps the sum's order of the MLIR form).
    constexpr int kSums = C::kRowSumPartials;
    static_assert(kSums >= 1 && (kSums & (kSums - 1)) == 0, "a power of two");
    float sums[kSums];
#pragma unroll
    for (int i = 0; i < kSums; ++i)
      sums[i] = 0.0f;
    constexpr int kGroups = C::kBlockN / kColsPerGroup;
    constexpr int kChunk = C::kSkipChunkGroups;
    static_assert(kGroups % kChunk == 0, "the plan's chunks tile the block");
    static_assert(kLiveGroups % kChunk == 0 || kLiveGroups == kGroups, "live groups end on a chunk");
#pragma unroll
    for (int chunk = 0; chunk < kGroups; chunk += kChunk) {
      if (chunk < kLiveGroups && chunk < live_groups) {
#pragma unroll
        for (int j = chunk; j < chunk + kChunk; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float &x = s[j * kAccPerGroup + r * 2 + e];
            const float arg = exponent<C>(x, safe_max, scale_log2, bias);
            constexpr int kEvery = C::kExp2PolyEvery;
            x = (kEvery > 0 && j % kEvery == kEvery - 1) ? exp2_poly3(arg) : ex2_approx(arg);
            sums[(2 * j + e) % kSums] += x;
          }
      } else {
#pragma unroll
        for (int j = chunk; j < chunk + kChunk; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            s[j * kAccPerGroup + r * 2 + e] = 0.0f;
      }
    }
    tree_fold<kSums>(sums, add_f32);
    st.sum[r] = st.sum[r] * rescale[r] + sums[0];
  }
}

// kExpBeforeMax: the step of a key-loop block (after the tile's first) whose exponentials do not
// wait for the block's max. p = 2^((s - ref) * c) against ref, the running max before the block (0
// while the row has seen no key); the block's max is computed beside them and checked afterwards.
// O and the sum are kept relative to ref (st.ref), so O's factor, 2^((old ref - ref) * c), is known
// before S arrives. Exact while the block raises no row's max by more than C::kExpJumpLog2 (then
// every p <= 2^kExpJumpLog2, inside the 16-bit P's range and far from fp32's) and no row meets its
// first keys in it; false, with the state untouched, where one did: the caller recomputes S and
// takes softmax_step, against the new max.
// The answer is the warpgroup's (a vote on its barrier `vote_barrier`), since the QK is recomputed
// by the whole warpgroup.
template <class C>
__device__ __forceinline__ bool softmax_step_before_max(float (&s)[C::kBlockN / 2], RowState<C> &st, float scale_log2,
                                                        float (&rescale)[kRowsPerThread], u32 vote_barrier) {
  static_assert(!C::kLazyRescale && C::kExp2PolyEvery == 0, "eager rescaling on MUFU only (the planner's rule)");
  constexpr int kGroups = C::kBlockN / kColsPerGroup;
  constexpr int kPartials = C::kRowMaxPartials;
  constexpr int kSums = C::kRowSumPartials;
  float ref[kRowsPerThread], block_max[kRowsPerThread], row_sum[kRowsPerThread];
  bool within = true;
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    ref[r] = st.max[r] == neg_inf() ? 0.0f : st.max[r];
    const float bias = -ref[r] * scale_log2;
    float partial[kPartials];
    float sums[kSums];
#pragma unroll
    for (int i = 0; i < kSums; ++i)
      sums[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
      const float pair = max_f32(s[j * kAccPerGroup + r * 2], s[j * kAccPerGroup + r * 2 + 1]);
      partial[j % kPartials] = j < kPartials ? pair : max_f32(partial[j % kPartials], pair);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float &x = s[j * kAccPerGroup + r * 2 + e];
        x = ex2_approx(exponent<C>(x, ref[r], scale_log2, bias));
        sums[(2 * j + e) % kSums] += x;
      }
    }
    tree_fold<kPartials>(partial, max_f32);
    row_sum[r] = tree_fold<kSums>(sums, add_f32);
    block_max[r] = quad_reduce_max(max_f32(st.max[r], partial[0]));
    // A row that meets its first keys here took 0 for a reference, which may lie far above them (p
    // underflows): it takes the recompute. One that still has no key passes (its p are all 0). The
    // sum's test (false only for NaN) ties the vote to the exponentials: without it ptxas may issue
    // the vote's barrier, and so wait, before them.
    const bool first_keys = st.max[r] == neg_inf() && block_max[r] != neg_inf();
    within = within && !first_keys && (block_max[r] - ref[r]) * scale_log2 <= C::kExpJumpLog2 && row_sum[r] >= 0.0f;
  }
  // The barrier's answer is the same on every thread; the warp reduction makes that visible to
  // ptxas (prim/warp.cuh), so the recompute's wgmma stays warp-uniform.
  if (redux_or_sync(named_barrier_red_or(vote_barrier, kWarpgroupThreads, !within)) != 0)
    return false;
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    rescale[r] = ex2_approx((st.ref[r] - ref[r]) * scale_log2);
    st.sum[r] = st.sum[r] * rescale[r] + row_sum[r];
    st.ref[r] = block_max[r] == neg_inf() ? neg_inf() : ref[r]; // as softmax_step leaves it
    st.max[r] = block_max[r];
  }
  return true;
}

} // namespace fj::fa3
