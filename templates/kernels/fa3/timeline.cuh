// Timeline of one CTA's walk (kTimeline, a diagnostic tuning, kernel suffix `.tl`): the SM's cycle
// counter at fixed points of each consumer warpgroup's key-loop steps and of the producer's K/V loads,
// for CTA kTimelineCta, in the module global fj_fa3_timeline. One clock for the whole SM, so the
// warpgroups' points compare directly. Every launch overwrites the points; `flashjit bench --timeline`
// reads the last launch's back (Runtime::read_kernel_global) and bench/timeline.py reads them.
// NVRTC defines FJ_FA3_TIMELINE for such a kernel only (nvrtc_options): other kernels have no global
// and no code from here. No call or printf: a call in the kernel serializes every wgmma (C7510).
#pragma once

#include "prim/timer.cuh"
#include "prim/types.cuh"

namespace fj::fa3 {

// The points of a consumer step (a row per key block, in walk order, and one for a tile's last PV).
enum TimelineEvent : int {
  kMarkKWait = 0,    // the step begins (its K wait; V's for a tile's last row)
  kMarkTurn = 1,     // its pingpong turn taken
  kMarkIssued = 2,   // its GEMMs issued, the turn handed on
  kMarkSReady = 3,   // S ready (the wgmma wait)
  kMarkSoftmax = 4,  // the softmax done
  kMarkPvDone = 5,   // the previous block's PV complete
  kMarkEpilogue = 6, // a tile's last row: its epilogue done
  kMarkKind = 7,     // the row's kind (TimelineRow), not a time
  kTimelineEvents = 8,
};
// The producer's row of ring position b: its four points.
enum TimelineLoad : int { kMarkKStart = 0, kMarkKIssued = 1, kMarkVStart = 2, kMarkVIssued = 3 };
enum TimelineRow : int { kRowStep = 1, kRowFirst = 2, kRowLast = 3, kRowProducer = 4 };

constexpr int kTimelineCta = 0;
constexpr int kTimelineRows = 256;     // rows recorded per warpgroup
constexpr int kTimelineWarpgroups = 4; // up to three consumers, then the producer (its slot: kConsumerWarpgroups)

} // namespace fj::fa3

#ifdef FJ_FA3_TIMELINE
extern "C" { // a definition with C linkage: the host looks it up by this name
__device__ fj::u64 fj_fa3_timeline[fj::fa3::kTimelineWarpgroups][fj::fa3::kTimelineRows][fj::fa3::kTimelineEvents];
}
#endif

namespace fj::fa3 {

template <class C> struct Timeline {
#ifdef FJ_FA3_TIMELINE
  static_assert(C::kTimeline, "FJ_FA3_TIMELINE comes with kTimeline");
#else
  static_assert(!C::kTimeline, "kTimeline needs FJ_FA3_TIMELINE (nvrtc_options)");
#endif
  int slot;        // consumer warpgroup index, or C::kConsumerWarpgroups for the producer
  mutable int row; // the current row; from kTimelineRows on (a thread that does not record) nothing is stored

  // The recording thread: in CTA kTimelineCta, a warpgroup's first. One live register for both.
  __device__ __forceinline__ static int first_row(bool recording) {
    return recording ? -1 : kTimelineRows;
  }

  __device__ __forceinline__ void store(int at_row, int event, u64 value) const {
#ifdef FJ_FA3_TIMELINE
    if (at_row >= 0 && at_row < kTimelineRows)
      fj_fa3_timeline[slot][at_row][event] = value;
#endif
  }
  // A consumer's next row.
  __device__ __forceinline__ void begin_row(TimelineRow kind) const {
    if constexpr (C::kTimeline)
      store(++row, kMarkKind, kind);
  }
  __device__ __forceinline__ void mark(TimelineEvent event) const {
    if constexpr (C::kTimeline)
      store(row, event, clock_cycles());
  }
  // The producer's rows follow its ring position (`row` only says whether this thread records).
  __device__ __forceinline__ void mark_load(int block_index, TimelineLoad event) const {
    if constexpr (C::kTimeline)
      if (row < kTimelineRows) {
        store(block_index, event, clock_cycles());
        store(block_index, kMarkKind, kRowProducer);
      }
  }
};

} // namespace fj::fa3
