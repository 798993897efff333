// Consumer warpgroup of the fa3 kernel: 64 query rows of each tile. The main loop overlaps
// inside the warpgroup: block j's S = Q K_j^T is issued together with O += P_{j-1} V_{j-1}; the
// softmax of S_j runs while the PV GEMM is still on the tensor cores. With pingpong, the 2 or 3
// consumer warpgroups take turns issuing their GEMMs in a strict round robin (named barriers, one
// token), so the others' softmax hides under one warpgroup's GEMMs. P never leaves registers: the f32 S accumulator
// re-viewed as 16-bit pairs is the A fragment of the RS wgmma.
#pragma once

#include "kernels/fa3/epilogue.cuh"
#include "kernels/fa3/scheduler.cuh"
#include "kernels/fa3/smem.cuh"
#include "kernels/fa3/softmax.cuh"
#include "kernels/fa3/tail.cuh"
#include "kernels/fa3/timeline.cuh"
#include "prim/cluster.cuh"
#include "prim/ldmatrix.cuh"
#include "prim/mbarrier.cuh"
#include "prim/named_barrier.cuh"
#include "prim/wgmma.cuh"

namespace fj::fa3 {

constexpr int kKStepBytes = 32;         // 16 elements of a K-major row
constexpr int kKStepRows = 16;          // 16 rows of an MN-major operand (V)
constexpr int kSwizzleAtomBytes = 1024; // 8 rows x 128 B: stride between 8-row groups
constexpr int kFragsPerKStep = 4;       // A fragment registers per k-step

template <class C> struct Consumer {
  static constexpr bool kBf16 = C::kDType == kDTypeBf16;
  static constexpr int kKStepsPerPanel = C::kPanelCols / kKStepRows;
  using MmaQK = Wgmma<C::kBlockN, kBf16, 0>;   // B = K, K-major
  using MmaPV = Wgmma<C::kHeadDimV, kBf16, 1>; // B = V, MN-major (transposed)

  const fj_fa3_params &params;
  const Smem<C> &smem;
  int wg;  // consumer warpgroup index (0-based)
  int tid; // thread index inside the warpgroup
  // kQInRegisters: this thread's A fragments of Q, per k-step, loaded once per tile (first_block),
  // so every QK is an RS wgmma that reads only K from shared memory.
  mutable u32 q_frag[C::kQInRegisters ? C::kKStepsQK * kFragsPerKStep : 1];
  // kTimeline (diagnostic): this warpgroup's points, recorded by its first thread in CTA kTimelineCta.
  Timeline<C> timeline{wg, Timeline<C>::first_row(tid == 0 && blockIdx.x == kTimelineCta)};

  // Pingpong: wait for this warpgroup's turn / hand the turn on. A turn covers one phase of a key
  // block (kPingpongSoftmax): the GEMM issue (on the tensor cores), or the softmax (on MUFU).
  enum class Phase { kGemm, kSoftmax };
  template <Phase kPhase>
  static constexpr bool kTakesTurns = C::kPingpong &&
                                      (kPhase == Phase::kSoftmax) == static_cast<bool>(C::kPingpongSoftmax);
  static constexpr Phase kTurnPhase = C::kPingpongSoftmax ? Phase::kSoftmax : Phase::kGemm;
  template <Phase kPhase = Phase::kGemm> __device__ __forceinline__ void turn_wait() const {
    if constexpr (kTakesTurns<kPhase>)
      named_barrier_sync(C::kBarrierPingpong + wg, 2 * kWarpgroupThreads);
  }
  template <Phase kPhase = Phase::kGemm> __device__ __forceinline__ void turn_pass() const {
    if constexpr (kTakesTurns<kPhase>)
      named_barrier_arrive(C::kBarrierPingpong + (wg + 1) % C::kConsumerWarpgroups, 2 * kWarpgroupThreads);
  }

  __device__ __forceinline__ void release(u32 empty_bar) const {
    if (tid == 0)
      mbarrier_arrive(empty_bar); // one arrival per warpgroup (count = kConsumerWarpgroups)
  }

  // A K/V slot is written by the producers of every CTA of the pair: release it to each of them
  // (the empty barriers count kConsumerWarpgroups * kClusterM arrivals).
  __device__ __forceinline__ void release_kv(u32 empty_bar) const {
    release(empty_bar);
    if constexpr (C::kClusterM > 1)
      if (tid == 0)
        mbarrier_arrive_cluster(mapa_shared(empty_bar, pair_rank<C>() ^ 1));
  }

  // With a separate O region, Q is free once the tile's last QK (block n_min) has completed, so
  // the next tile's Q loads under the last PV and the epilogue; with Q in registers, once the
  // first QK (block n_max - 1) has read the fragments of every warp.
  __device__ __forceinline__ void release_q_after_qk(const Tile &t, int n) const {
    if constexpr (C::kSeparateO)
      if (n == (C::kQInRegisters ? t.n_max - 1 : t.n_min))
        release(smem.q_empty());
  }

  // Q's A fragments of this thread (kQInRegisters): ldmatrix from the 128-byte swizzled Q panels,
  // matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15) of the warp's 16 rows, row-half first.
  __device__ __forceinline__ void load_q_fragments() const {
    if constexpr (C::kQInRegisters) {
      constexpr int kRowsPerLaneGroup = 8; // lanes that address one 8x8 matrix
      const int lane = tid % kWarpSize;
      const int matrix = lane / kRowsPerLaneGroup;
      const int row =
          wg * kWgmmaM + (tid / kWarpSize) * kRowsPerWarp + (matrix % 2) * kRowsPerLaneGroup + lane % kRowsPerLaneGroup;
#pragma unroll
      for (int k = 0; k < C::kKStepsQK; ++k) {
        const int chunk = (k % kKStepsPerPanel) * (kKStepBytes / kChunkBytes) + matrix / 2;
        u32 out[kFragsPerKStep];
        ldmatrix_x4(out, swizzled_address<C>(smem.q_panel(k / kKStepsPerPanel), row, chunk));
#pragma unroll
        for (int i = 0; i < kFragsPerKStep; ++i)
          q_frag[k * kFragsPerKStep + i] = out[i];
      }
    }
  }

  // Descriptor of the operand at `address`, `offset` bytes past its GEMM's first (descriptor
  // `first`). kDescAdvance: one add to the first's address field on the uniform datapath, where
  // building it from the address takes an add, a shift, a mask and a move (profile of session 36,
  // perf-notes); else built from `address`, as the kernels measured before it were.
  __device__ __forceinline__ static u64 operand_desc(u64 first, u32 offset, u32 address, u32 lead_bytes) {
    if constexpr (C::kDescAdvance)
      return wgmma_desc_advance(first, offset);
    else
      return wgmma_desc(address, lead_bytes, kSwizzleAtomBytes, C::kWgmmaSwizzle);
  }

  // The first descriptors of a QK, from which its k-steps' are advanced or beside which they are built.
  struct QkFirst {
    u32 q_base;
    u64 q_first, k_first;
  };
  __device__ __forceinline__ QkFirst qk_first(int stage) const {
    // kQDescPerStep: an opaque copy of Q's base keeps the descriptors in the loop, rebuilt per step
    // on the uniform datapath (compiler/plans/fa3_plan.cpp says why).
    u32 q_base = smem.q_panel(0) + wg * kWgmmaM * C::kSwizzleBytes;
    if constexpr (C::kQDescPerStep)
      opaque_u32(q_base);
    return {q_base, wgmma_desc(q_base, kChunkBytes, kSwizzleAtomBytes, C::kWgmmaSwizzle),
            wgmma_desc(smem.k_panel(stage, 0), kChunkBytes, kSwizzleAtomBytes, C::kWgmmaSwizzle)};
  }

  __device__ __forceinline__ void issue_qk(float (&s)[C::kBlockN / 2], int stage, const QkFirst &first) const {
    const u32 q_base = first.q_base;
    const u64 q_first = first.q_first, k_first = first.k_first;
#pragma unroll
    for (int k = 0; k < C::kKStepsQK; ++k) {
      const int panel = k / kKStepsPerPanel;
      const u32 step = (k % kKStepsPerPanel) * kKStepBytes;
      // Q's descriptor before K's, as before the RS form existed: the SS kernels' SASS stays as
      // measured (the other order gives ptxas ~20 more UMOVs, never timed).
      u64 a = 0;
      if constexpr (!C::kQInRegisters) {
        const u32 panel_offset = smem.q_panel(panel) - smem.q_panel(0);
        a = operand_desc(q_first, panel_offset + step, q_base + panel_offset + step, kChunkBytes);
      }
      const u64 b = operand_desc(k_first, (smem.k_panel(stage, panel) - smem.k_panel(stage, 0)) + step,
                                 smem.k_panel(stage, panel) + step, kChunkBytes);
      if constexpr (C::kQInRegisters) {
        const u32 *frag = q_frag + k * kFragsPerKStep;
        MmaQK::rs(s, frag[0], frag[1], frag[2], frag[3], b, k > 0);
      } else {
        MmaQK::ss(s, a, b, k > 0);
      }
    }
    wgmma_commit_group();
  }

  __device__ __forceinline__ void issue_pv(float (&o)[C::kHeadDimV / 2], const u32 (&p)[C::kBlockN / 4],
                                           int stage) const {
    const u64 v_first = wgmma_desc(smem.v_stage(stage), C::kSmemPanelBytesKV, kSwizzleAtomBytes, C::kWgmmaSwizzle);
#pragma unroll
    for (int k = 0; k < C::kKStepsPV; ++k) {
      const u32 step = k * kKStepRows * C::kSwizzleBytes;
      const u64 b = operand_desc(v_first, step, smem.v_stage(stage) + step, C::kSmemPanelBytesKV);
      MmaPV::rs(o, p[k * kFragsPerKStep + 0], p[k * kFragsPerKStep + 1], p[k * kFragsPerKStep + 2],
                p[k * kFragsPerKStep + 3], b, 1);
    }
    wgmma_commit_group();
  }

  // S (f32, now holding p) -> 16-bit pairs: the accumulator layout of columns 16k..16k+15 is
  // exactly the m16n8k16 A fragment of k-step k.
  __device__ __forceinline__ static void to_fragments(const float (&s)[C::kBlockN / 2], u32 (&p)[C::kBlockN / 4]) {
#pragma unroll
    for (int i = 0; i < C::kBlockN / 4; ++i)
      p[i] = pack2_from_f32<C::kDType>(s[2 * i], s[2 * i + 1]);
  }

  __device__ __forceinline__ static void rescale_o(float (&o)[C::kHeadDimV / 2], const float (&scale)[kRowsPerThread]) {
    // Lazy rescale: most blocks leave every row's factor at exactly 1; the warp then skips the FMULs.
    if constexpr (C::kLazyRescale)
      if (!vote_any_sync(scale[0] != 1.0f || scale[1] != 1.0f))
        return;
#pragma unroll
    for (int j = 0; j < C::kHeadDimV / kColsPerGroup; ++j)
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) {
        o[j * kAccPerGroup + r * 2] *= scale[r];
        o[j * kAccPerGroup + r * 2 + 1] *= scale[r];
      }
  }

  struct Logits {
    float scale_log2, cap_pre, cap_post;
  };

  // Below a tile's last block only the causal diagonal or a window hides keys: the seqlen_k tail
  // lies in the last block (blocks are walked from n_max - 1 down; a tail piece that ends at a
  // walker boundary ends below it). So kUnmaskedKeyLoop drops the key loop's mask code.
  static_assert(!C::kUnmaskedKeyLoop || !(C::kCausal || C::kLocal), "the planner allows it without masking only");

  // The column groups of block n before the first that lies right of every row of this warp (past
  // the causal / window diagonal or seqlen_k), rounded up to whole skip chunks: the groups from there
  // on hold only -inf.
  __device__ __forceinline__ int live_groups(const Tile &t, const Window &w, int n) const {
    constexpr int kGroups = C::kBlockN / kColsPerGroup;
    constexpr int kChunkCols = C::kSkipChunkGroups * kColsPerGroup;
    const int warp_last_row = t.m_block * C::kBlockM + wg * kWgmmaM + (tid / kWarpSize + 1) * kRowsPerWarp - 1;
    int col_end = t.seqlen_k; // exclusive, for the warp's lowest row
    if (w.has_right)
      col_end = min(col_end, warp_last_row + w.offset + w.right + 1);
    const int live_cols = max(col_end - n * C::kBlockN, 0);
    return min((live_cols + kChunkCols - 1) / kChunkCols * C::kSkipChunkGroups, kGroups);
  }

  // The soft cap, then the mask where block n needs one (kMayMask false: every key of it is
  // visible); true where it was masked.
  template <bool kMayMask>
  __device__ __forceinline__ bool cap_and_mask(float (&s)[C::kBlockN / 2], const Logits &lg, const Tile &t,
                                               const Window &w, int n) const {
    if constexpr (C::kSoftcap)
      apply_softcap<C>(s, lg.cap_pre, lg.cap_post);
    if (!kMayMask || !block_needs_mask<C>(t, w, n))
      return false;
    const int row0 =
        t.m_block * C::kBlockM + wg * kWgmmaM + (tid / kWarpSize) * kRowsPerWarp + (tid % kWarpSize) / kQuadLanes;
    const int col0 = n * C::kBlockN + 2 * (tid % kQuadLanes);
    apply_mask<C>(s, row0, col0, t, w);
    return true;
  }

  // kExpBeforeMax: a key-loop block's softmax whose exponentials do not wait for the block's max
  // (softmax_step_before_max). Where the block raised a row's max too far, the warpgroup computes S
  // again from the K slot (and Q) it still holds and takes the eager step: rare (a tile's first
  // block is eager), and it keeps every p within the 16-bit P's range.
  __device__ __forceinline__ void softmax_before_max(float (&s)[C::kBlockN / 2], RowState<C> &st,
                                                     float (&scale)[kRowsPerThread], const Logits &lg, const Tile &t,
                                                     const Window &w, int n, const RingSlot<C> &cur) const {
    cap_and_mask<!C::kUnmaskedKeyLoop>(s, lg, t, w, n);
    if (softmax_step_before_max<C>(s, st, lg.scale_log2, scale, C::kBarrierVote + wg)) {
      timeline.mark(kMarkSoftmax);
      return;
    }
    wgmma_fence();
    issue_qk(s, cur.stage, qk_first(cur.stage));
    wgmma_wait_group<0>(); // the PV in flight too
    wgmma_fence_operand(s);
    softmax<!C::kUnmaskedKeyLoop>(s, st, scale, lg, t, w, n);
  }

  // Mask / soft cap / online softmax of the block in s (kMayMask false: every key of it is visible;
  // kSkipMasked, a form of kSkipMaskedGroups or 0: no exponentials for the warp's column groups that
  // the mask hides entirely, the tile's prologue block).
  template <bool kMayMask = true, int kSkipMasked = 0>
  __device__ __forceinline__ void softmax(float (&s)[C::kBlockN / 2], RowState<C> &st, float (&scale)[kRowsPerThread],
                                          const Logits &lg, const Tile &t, const Window &w, int n) const {
    int live = C::kBlockN / kColsPerGroup;
    if (cap_and_mask<kMayMask>(s, lg, t, w, n) && kSkipMasked != 0)
      live = live_groups(t, w, n);
    turn_wait<Phase::kSoftmax>();
    constexpr int kGroups = C::kBlockN / kColsPerGroup;
    constexpr int kHalf = kGroups / 2;
    static_assert(kSkipMasked != kSkipMaskedHalf || kHalf % C::kSkipChunkGroups == 0,
                  "halves of whole skip chunks (the planner refuses other key blocks)");
    if constexpr (kSkipMasked == kSkipMaskedHalf) {
      if (live <= kHalf)
        softmax_step<C, kHalf>(s, st, lg.scale_log2, scale);
      else
        softmax_step<C>(s, st, lg.scale_log2, scale);
    } else {
      softmax_step<C>(s, st, lg.scale_log2, scale, kSkipMasked == kSkipMaskedBranch ? live : kGroups);
    }
    turn_pass<Phase::kSoftmax>();
    timeline.mark(kMarkSoftmax);
  }

  // The next tile this walker has work in, from wave `wave` on (tiles without rows are skipped;
  // tiles whose rows see no key get O = 0 / LSE = -inf here). False when the walk is over.
  __device__ __forceinline__ bool next_tile(int &wave, Tile &t) const {
    for (; wave * walkers<C>() < params.num_tiles; ++wave) {
      const int index = snake_tile<C>(wave);
      if (index >= params.num_tiles)
        continue;
      t = decode_tile<C>(params, index);
      if (!t.has_rows)
        continue;
      if (t.n_max <= t.n_min) {
        epilogue_of().write_empty(t);
        continue;
      }
      return true;
    }
    return false;
  }

  __device__ __forceinline__ Epilogue<C> epilogue_of() const {
    return Epilogue<C>{params, smem, wg, tid};
  }

  __device__ __forceinline__ static void start_tile(RowState<C> &st, float (&o)[C::kHeadDimV / 2]) {
    st.reset();
#pragma unroll
    for (int i = 0; i < C::kHeadDimV / 2; ++i)
      o[i] = 0.0f;
  }

  // One step of the key loop: the QK of the block in `cur` issued with the PV of the block in `prev`
  // (one turn), returning once S is ready and the K slot released; the PV may still run. A tile's
  // first block has no PV before it (with_pv false). Each case fences and issues its own QK: with one
  // QK before a branch around the PV, ptxas serializes every wgmma of the pingpong kernels (run 23a);
  // with the fence before the branch, it injects fences of its own (ptxas info C7519).
  __device__ __forceinline__ void issue_step(float (&s)[C::kBlockN / 2], float (&o)[C::kHeadDimV / 2],
                                             const u32 (&frag)[C::kBlockN / 4], const float (&scale)[kRowsPerThread],
                                             const RingSlot<C> &cur, const RingSlot<C> &prev, bool with_pv) const {
    // kEarlyQkDesc: the QK's first descriptors before the K wait, where ptxas keeps them; written after
    // it, they land behind the turn's barrier, between the hand-off and the warpgroup's first wgmma.
    timeline.begin_row(with_pv ? kRowStep : kRowFirst);
    timeline.mark(kMarkKWait);
    QkFirst first{};
    if constexpr (C::kEarlyQkDesc)
      first = qk_first(cur.stage);
    mbarrier_wait_parity(smem.k_full(cur.stage), cur.phase);
    turn_wait();
    timeline.mark(kMarkTurn);
    if constexpr (!C::kEarlyQkDesc)
      first = qk_first(cur.stage);
    if (with_pv) {
      wgmma_fence();
      issue_qk(s, cur.stage, first);
      // kTurnOverQk: the turn is handed on after the QK, so the other warpgroup's QK may reach the
      // tensor cores before this one's PV; FA-3's turn holds both GEMMs.
      if constexpr (C::kTurnOverQk)
        turn_pass();
      // kSBeforePv: the wgmma queue holds about eight, so issuing the PV's blocks until most of the QK
      // has run; awaiting S first lets the softmax start when the QK ends (the PV then starts a little late).
      if constexpr (C::kSBeforePv)
        wgmma_wait_group<0>();
      if constexpr (C::kRescaleBeforePv)
        rescale_o(o, scale); // FMULs under the QK GEMM instead of after the PV wait
      mbarrier_wait_parity(smem.v_full(prev.stage), prev.phase);
      wgmma_fence(); // the V wait sits between the two GEMMs: re-fence the PV operands
      issue_pv(o, frag, prev.stage);
      if constexpr (!C::kTurnOverQk)
        turn_pass();
      timeline.mark(kMarkIssued);
      if constexpr (!C::kSBeforePv)
        wgmma_wait_group<1>(); // S ready; the PV may still run
    } else {
      wgmma_fence();
      issue_qk(s, cur.stage, first);
      turn_pass();
      timeline.mark(kMarkIssued);
      wgmma_wait_group<0>();
    }
    timeline.mark(kMarkSReady);
    wgmma_fence_operand(s);
    // kExpBeforeMax: a key-loop step keeps its K slot until its softmax has checked the block's max.
    if (!C::kExpBeforeMax || !with_pv)
      release_kv(smem.k_empty(cur.stage));
  }

  // The step's PV has completed: O and the P fragments are free again, the V slot released.
  __device__ __forceinline__ void finish_step(float (&o)[C::kHeadDimV / 2], u32 (&frag)[C::kBlockN / 4],
                                              const RingSlot<C> &prev) const {
    wgmma_wait_group<0>();
    wgmma_fence_operand(o);
    wgmma_fence_operand(frag);
    release_kv(smem.v_empty(prev.stage));
    timeline.mark(kMarkPvDone);
  }

  // Blocks n_max - 2 .. n_min of tile t: block j's QK issued with the PV of block j + 1. On entry
  // s/frag hold block n_max - 1's P and `cur` its slot; on exit frag holds block n_min's P (PV not
  // issued yet) and `cur` its slot.
  __device__ __forceinline__ void key_blocks(float (&s)[C::kBlockN / 2], u32 (&frag)[C::kBlockN / 4],
                                             float (&o)[C::kHeadDimV / 2], RowState<C> &st,
                                             float (&scale)[kRowsPerThread], const Logits &lg, const Tile &t,
                                             const Window &w, RingSlot<C> &cur, int &block_index) const {
    for (int n = t.n_max - 2; n >= t.n_min; --n) {
      const RingSlot<C> prev = cur;
      cur = RingSlot<C>::at(++block_index);
      issue_step(s, o, frag, scale, cur, prev, true);
      if constexpr (C::kExpBeforeMax) {
        softmax_before_max(s, st, scale, lg, t, w, n, cur);
        release_kv(smem.k_empty(cur.stage));
        release_q_after_qk(t, n);
      } else {
        release_q_after_qk(t, n);
        softmax<!C::kUnmaskedKeyLoop>(s, st, scale, lg, t, w, n);
      }
      finish_step(o, frag, prev);
      if constexpr (!C::kRescaleBeforePv)
        rescale_o(o, scale);
      to_fragments(s, frag);
    }
  }

  // Prologue of tile t: S for its last (possibly partial / diagonal) block, alone on the tensor cores.
  __device__ __forceinline__ void first_block(float (&s)[C::kBlockN / 2], u32 (&frag)[C::kBlockN / 4],
                                              float (&o)[C::kHeadDimV / 2], RowState<C> &st,
                                              float (&scale)[kRowsPerThread], const Logits &lg, const Tile &t,
                                              const Window &w, const RingSlot<C> &cur, u32 tile_parity) const {
    const int n = t.n_max - 1;
    mbarrier_wait_parity(smem.q_full(), tile_parity);
    load_q_fragments();
    issue_step(s, o, frag, scale, cur, cur, false);
    release_q_after_qk(t, n);
    softmax<true, C::kSkipMaskedGroups>(s, st, scale, lg, t, w, n);
    to_fragments(s, frag);
  }

  // Every block of tile t in one loop (kFirstBlockInLoop): the prologue's block is the loop's first
  // step, which issues no PV, so the softmax is compiled once instead of twice (cold compile time:
  // docs/perf-notes.md, session 19). On entry `cur` is the tile's first slot; on exit
  // frag holds block n_min's P (PV not issued yet) and `cur` its slot.
  __device__ __forceinline__ void key_loop(float (&s)[C::kBlockN / 2], u32 (&frag)[C::kBlockN / 4],
                                           float (&o)[C::kHeadDimV / 2], RowState<C> &st,
                                           float (&scale)[kRowsPerThread], const Logits &lg, const Tile &t,
                                           const Window &w, RingSlot<C> &cur, int &block_index, u32 tile_parity) const {
    mbarrier_wait_parity(smem.q_full(), tile_parity);
    load_q_fragments();
    for (int n = t.n_max - 1; n >= t.n_min; --n) {
      const bool first = n == t.n_max - 1;
      const RingSlot<C> prev = cur;
      if (!first)
        cur = RingSlot<C>::at(++block_index);
      issue_step(s, o, frag, scale, cur, prev, !first);
      release_q_after_qk(t, n);
      softmax(s, st, scale, lg, t, w, n);
      // Behind the branch: the first step's rescale, run unconditionally, cost d192/d256 0.7-2.1%
      // (run 23e), though it made the pingpong kernels' loss smaller (run 23d).
      if (!first) {
        finish_step(o, frag, prev);
        if constexpr (!C::kRescaleBeforePv)
          rescale_o(o, scale);
      }
      to_fragments(s, frag);
    }
  }

  // Tile t's last PV, alone on the tensor cores, then its epilogue (a cut tile's piece: its part
  // of the tail merge instead).
  __device__ __forceinline__ void last_block(float (&o)[C::kHeadDimV / 2], const u32 (&frag)[C::kBlockN / 4],
                                             RowState<C> &st, const float (&scale)[kRowsPerThread], const Logits &lg,
                                             const Tile &t, const RingSlot<C> &cur) const {
    if constexpr (C::kRescaleBeforePv)
      rescale_o(o, scale);
    timeline.begin_row(kRowLast);
    timeline.mark(kMarkKWait);
    mbarrier_wait_parity(smem.v_full(cur.stage), cur.phase);
    turn_wait();
    timeline.mark(kMarkTurn);
    wgmma_fence();
    issue_pv(o, frag, cur.stage);
    turn_pass();
    timeline.mark(kMarkIssued);
    wgmma_wait_group<0>();
    wgmma_fence_operand(o);
    release_kv(smem.v_empty(cur.stage));
    timeline.mark(kMarkPvDone);
    if constexpr (C::kTailSplit)
      if (const TailCut cut = tail_cut<C>(params, t);
          cut.boundary >= 0 && !TailMerge<C>{params, smem, wg, tid}.finish(cut, o, st, lg.scale_log2))
        return;                                 // the other piece of this tile writes it
    epilogue_of().run(t, o, st, lg.scale_log2); // one call site: a second copy of the epilogue spills
    timeline.mark(kMarkEpilogue);
  }

  // Prologue, key loop, last PV and epilogue of tile t (or of a piece of it, kTailSplit).
  __device__ __forceinline__ void run_tile(const Tile &t, const Logits &lg, float (&s)[C::kBlockN / 2],
                                           u32 (&frag)[C::kBlockN / 4], float (&o)[C::kHeadDimV / 2], int &block_index,
                                           u32 &tile_parity) const {
    if (!t.has_rows)
      return;
    if (t.n_max <= t.n_min) {
      epilogue_of().write_empty(t);
      return;
    }
    const Window w = make_window<C>(params.base, t.seqlen_q, t.seqlen_k);
    RowState<C> st;
    float scale[kRowsPerThread];
    start_tile(st, o);
    RingSlot<C> cur = RingSlot<C>::at(block_index);
    if constexpr (C::kFirstBlockInLoop) {
      key_loop(s, frag, o, st, scale, lg, t, w, cur, block_index, tile_parity);
    } else {
      first_block(s, frag, o, st, scale, lg, t, w, cur, tile_parity);
      key_blocks(s, frag, o, st, scale, lg, t, w, cur, block_index);
    }
    last_block(o, frag, st, scale, lg, t, cur);
    ++block_index;
    tile_parity ^= 1;
  }

  // One tile at a time (the walk before kCrossTileOverlap): the tiles the producer hands out
  // (kDynamicTiles), or whole units wave by wave, then (kTailSplit) this walker's share of the
  // tail, piece by piece.
  __device__ __forceinline__ void run_tiles(const Logits &lg, float (&s)[C::kBlockN / 2], u32 (&frag)[C::kBlockN / 4],
                                            float (&o)[C::kHeadDimV / 2]) const {
    int block_index = 0;
    u32 tile_parity = 0;
    if constexpr (C::kDynamicTiles) {
      const TileFeed<C> feed{params, smem};
      for (int k = 0, index = feed.receive(0); index < params.num_tiles; index = feed.receive(++k))
        run_tile(decode_tile<C>(params, index), lg, s, frag, o, block_index, tile_parity);
    } else if constexpr (C::kTailSplit) {
      const int items = walk_items<C>(params);
      for (int k = 0; k < items; ++k) {
        Tile t;
        if (walk_item<C>(params, k, &t))
          run_tile(t, lg, s, frag, o, block_index, tile_parity);
      }
    } else {
      for (int wave = 0, index = snake_tile<C>(0); wave * walkers<C>() < params.num_tiles;
           index = snake_tile<C>(++wave))
        if (index < params.num_tiles)
          run_tile(decode_tile<C>(params, index), lg, s, frag, o, block_index, tile_parity);
    }
  }

  // One stream of key blocks across tiles (kCrossTileOverlap).
  __device__ __forceinline__ void run_tile_stream(const Logits &lg, float (&s)[C::kBlockN / 2],
                                                  u32 (&frag)[C::kBlockN / 4], float (&o)[C::kHeadDimV / 2]) const {
    const fj_attention_params &p = params.base;
    RowState<C> st;
    float scale[kRowsPerThread];
    int block_index = 0;
    u32 tile_parity = 0;
    int wave = 0;
    Tile t;
    if (!next_tile(wave, t))
      return;
    // One stream of key blocks across tiles: every step issues the QK of the next block, which
    // at a tile boundary is the next tile's first, with the PV of the previous block, so the
    // tensor cores do not wait for an epilogue and a lone prologue GEMM at every tile; a tile's
    // epilogue runs under the next tile's first QK and softmax. Needs the O region apart from
    // Q's: the next Q has loaded under this tile's last blocks.
    static_assert(!C::kCrossTileOverlap || C::kSeparateO, "the next tile's Q loads while this O is staged");
    Window w = make_window<C>(p, t.seqlen_q, t.seqlen_k);
    start_tile(st, o);
    RingSlot<C> cur = RingSlot<C>::at(block_index);
    first_block(s, frag, o, st, scale, lg, t, w, cur, tile_parity);
    int n = t.n_max - 1; // the block whose P is in frag
    while (true) {
      Tile next_t = t;
      int next_n = n - 1;
      const bool boundary = next_n < t.n_min;
      if (boundary) {
        ++wave;
        if (!next_tile(wave, next_t))
          break;
        next_n = next_t.n_max - 1;
        tile_parity ^= 1;
        mbarrier_wait_parity(smem.q_full(), tile_parity);
      }
      const RingSlot<C> prev = cur;
      cur = RingSlot<C>::at(++block_index);
      issue_step(s, o, frag, scale, cur, prev, true);
      release_q_after_qk(next_t, next_n);
      RowState<C> done = st; // at a boundary: t's row state, for its epilogue
      if (boundary) {
        w = make_window<C>(p, next_t.seqlen_q, next_t.seqlen_k);
        st.reset();
      }
      softmax(s, st, scale, lg, next_t, w, next_n);
      finish_step(o, frag, prev);
      if (boundary) {
        epilogue_of().run(t, o, done, lg.scale_log2);
#pragma unroll
        for (int i = 0; i < C::kHeadDimV / 2; ++i)
          o[i] = 0.0f; // the next tile's O starts empty (its first factor then multiplies zeros)
      } else if constexpr (!C::kRescaleBeforePv) {
        rescale_o(o, scale);
      }
      to_fragments(s, frag);
      t = next_t;
      n = next_n;
    }
    last_block(o, frag, st, scale, lg, t, cur);
  }

  __device__ void run() {
    const fj_attention_params &p = params.base;
    Logits lg;
    lg.scale_log2 = p.scale_log2;
    lg.cap_pre = p.scale * p.softcap_inv;
    lg.cap_post = C::kSoftcap ? p.softcap / p.scale : 0.0f;

    float s[C::kBlockN / 2];
    u32 frag[C::kBlockN / 4];
    float o[C::kHeadDimV / 2];

    if constexpr (C::kPingpong)
      if (wg == C::kConsumerWarpgroups - 1)
        turn_pass<kTurnPhase>(); // one turn token, starting at warpgroup 0: strict round robin
    if constexpr (C::kCrossTileOverlap)
      run_tile_stream(lg, s, frag, o);
    else
      run_tiles(lg, s, frag, o);
    if constexpr (C::kPingpong)
      if (wg == 0)
        turn_wait<kTurnPhase>(); // absorb the last warpgroup's last hand-over so the barrier ends balanced
    if (tid == 0)
      tma_store_wait<0>(); // O stores complete before the CTA retires
  }
};

} // namespace fj::fa3
