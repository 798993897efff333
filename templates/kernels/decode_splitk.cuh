// FlashDecoding: split-K attention for short queries (q_len 1..16) over a long, optionally paged,
// KV cache. Entries: `fj_decode_splitk` (the keys) and `fj_decode_combine` (merge of split units).
//
// Work: one unit is (sequence, kv head, m block). The query heads that share the kv head are packed
// into the M dimension (row = token * group + head_in_group), so every KV byte is read once per
// unit. The host schedule (compiler/splitk_schedule) cuts the units' keys into pieces and gives each
// CTA of the fixed grid a balanced, contiguous run of pieces. A piece that is a whole unit writes O
// directly; the pieces of a split unit write (O, LSE) partial states. With kFusedMerge the CTA that
// writes a unit's last outstanding state merges them in the same grid (an arrival counter per split
// unit; see arrive_and_maybe_merge), so a step is one launch; without it fj_decode_combine merges
// them in a second launch. Both run merge_unit: the same arithmetic in the same order.
//
// Inside a CTA: a kStages-deep ring of kBlockN-key tiles (K and V), loaded by TMA (kTmaKv, sm_90:
// one mbarrier per stage) or by every thread's cp.async copies. The warps split each
// tile's keys (kWarpN each), run an online softmax over their own keys with mma.sync m16n8k16, and
// are merged through shared memory at the end of the piece (Q's A fragments, at head dims up to 128,
// stay in registers for the whole piece: kHoldQ). Decode is bound by KV bandwidth, so the
// design is about bytes in flight: the plan sizes stages x CTAs per SM for that. With kKvL2Hints
// (sm_90) the K/V copies carry an L2 evict-first policy (the stream is read once; the work list,
// tables and partial states stay in L2 across launches) and a 128-byte L2 prefetch.
//
// Launch (sm_90): the runtime launches fj_decode_splitk with programmatic stream serialization
// (PDL) (and the combine, when the merge is not fused). The decode reads only the host-written work
// list before griddepcontrol.wait, so its launch and work-list latency overlap the previous kernel
// of the stream (the previous step's combine or, fused, the previous step's decode; both let it in
// early with griddepcontrol.launch_dependents).
#pragma once

#include "kernel_params.h"
#include "params_decode.h"
#include "prim/fence.cuh"
#include "prim/griddep.cuh"
#include "prim/mbarrier.cuh"
#include "prim/timer.cuh"
#include "prim/types.cuh"
#include "prim/warp.cuh"

// The parts, in the order they build on each other (kernels/decode/, each including what it uses):
// the timeline hook; traits and shared memory; the unit of work; global -> shared copies; the warps'
// softmax and GEMMs; the end of a piece and the merges; one piece.
// clang-format off
#include "kernels/decode/timeline.cuh"
#include "kernels/decode/traits.cuh"
#include "kernels/decode/smem.cuh"
#include "kernels/decode/work.cuh"
#include "kernels/decode/copies.cuh"
#include "kernels/decode/softmax.cuh"
#include "kernels/decode/merge.cuh"
#include "kernels/decode/piece.cuh"
// clang-format on

namespace fj::decode {

// The kernel's parameter block: fj_decode_params, followed by the K/V tensor maps with TMA tiles.
template <bool kWithMaps> struct EntryParams { using type = fj_decode_params; };
template <> struct EntryParams<true> { using type = fj_decode_tma_params; };
__device__ __forceinline__ const fj_decode_params &decode_params(const fj_decode_params &p) {
  return p;
}
__device__ __forceinline__ const fj_decode_params &decode_params(const fj_decode_tma_params &e) {
  return e.base;
}
__device__ __forceinline__ const fj_tensor_map *kv_maps(const fj_decode_params &) {
  return nullptr;
}
__device__ __forceinline__ const fj_tensor_map *kv_maps(const fj_decode_tma_params &e) {
  return &e.k_map;
}
} // namespace fj::decode

// kCtasPerSm CTAs share an SM (the plan sized their rings for it); the bound keeps ptxas inside the
// register budget that allows it.
extern "C" __global__ void __launch_bounds__(KernelConfig::kThreads, KernelConfig::kCtasPerSm)
    fj_decode_splitk(const __grid_constant__ fj::decode::EntryParams<fj::decode::kTmaKv>::type entry) {
  const fj_decode_params &p = fj::decode::decode_params(entry);
  const fj_tensor_map *kv_maps = fj::decode::kv_maps(entry);
  extern __shared__ __align__(128) char smem_raw[];
  // TMA tiles: the swizzle atoms need the map's offsets from a 1024-byte boundary (the plan leaves
  // that much room); other builds take the block as it comes.
  const fj::u32 smem_pad =
      fj::decode::kTmaKv ? (0u - fj::cvta_to_shared_u32(smem_raw)) % fj::decode::TmaTile::kAtomBytes : 0u;
  const fj::decode::Smem smem{smem_raw + smem_pad};
  FJ_DECODE_MARK(p, fj_mark_entry, fj::global_timer_ns());
  // The next grid of the stream (the combine, or with kFusedMerge the next step's decode) may get
  // resident now and wait (PDL).
  if constexpr (KernelConfig::kArch >= 90)
    fj::griddepcontrol_launch_dependents();
  const int first = p.slot_begin[blockIdx.x];
  const int last = p.slot_begin[blockIdx.x + 1];
  if (first == last) // no work: this CTA touches no memory, so it need not wait (PDL) either
    return;
  // The work list is the host's (no kernel writes it): read before the wait. Q, K, V, lengths and
  // tables may come from the previous kernel of the stream: read after it, as are the partial
  // states, O and (kFusedMerge) the merge counters, which the previous step's grid also writes.
  // The wait is conditional on the loaded entry only so that its load issues before the wait
  // (ptxas sinks an unconditional one below it); an entry always has kv_begin <= kv_end.
  const fj_decode_work first_work = fj::decode::load_work(p.work + first);
  if constexpr (KernelConfig::kArch >= 90)
    if (first_work.kv_begin <= first_work.kv_end)
      fj::griddepcontrol_wait();
  FJ_DECODE_MARK(p, fj_mark_waited, fj::global_timer_ns());
  fj::u32 phase_bits = 0; // TMA tiles
  if constexpr (fj::decode::kTmaKv) {
    if (threadIdx.x == 0) {
      for (int stage = 0; stage < KernelConfig::kStages; ++stage)
        fj::mbarrier_init(smem.full_bar(stage), 1);
      fj::fence_mbarrier_init();
    }
    __syncthreads();
  }
  for (int i = first; i < last; ++i) {
    const fj::decode::Unit u = fj::decode::decode_unit(p, i == first ? first_work : fj::decode::load_work(p.work + i));
    fj::decode::run_piece(p, u, smem, i == first, kv_maps, phase_bits);
  }
  FJ_DECODE_MARK(p, fj_mark_exit, fj::global_timer_ns());
  FJ_DECODE_MARK(p, fj_mark_sm_pieces, fj::sm_id() | (unsigned long long)(last - first) << 32);
}

// Merges the partial states of split units: CTA x handles merges[x] (the grid is fixed; CTAs past
// header->num_merges return). One warp per packed row. Launched right after fj_decode_splitk when
// its plan does not fuse the merge (kFusedMerge 0), on sm_90 with programmatic stream
// serialization (PDL) so its launch hides behind the decode. Min blocks 1: see fj_combine.
extern "C" __global__ void __launch_bounds__(KernelConfig::kCombineThreads, 1)
    fj_decode_combine(const __grid_constant__ fj_decode_params p) {
  if constexpr (KernelConfig::kArch >= 90) {
    // The next step's decode (PDL) may get resident now; it waits for this grid before touching
    // anything this grid reads or writes.
    fj::griddepcontrol_launch_dependents();
    fj::griddepcontrol_wait(); // launched with PDL: wait for the decode grid's partials
  }
  if ((int)blockIdx.x >= p.header->num_merges)
    return;
  constexpr int kWarps = KernelConfig::kCombineThreads / fj::kWarpSize;
  fj::decode::merge_unit<kWarps, false>(p, fj::decode::load_merge(p.merges + blockIdx.x));
}
