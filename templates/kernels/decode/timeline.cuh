// Timeline hook of the split-K decode kernel (kernels/decode_splitk.cuh): the event slots and
// FJ_DECODE_MARK, which is empty unless FJ_DECODE_TIMELINE is defined. A header of its own so that
// the entries and the parts that mark a point (merge.cuh, piece.cuh) all include it.
#pragma once

// Diagnostic builds only (FJ_DECODE_TIMELINE defined before this header; bench/harness/decode):
// thread 0 of every CTA writes %globaltimer at fixed points of its run into
// fj_decode_timeline[step % kTimelineSteps][blockIdx.x], `step` from fj_decode_params.pad_.
// The points of a CTA's run a timeline build records, in the order of its slots.
enum fj_decode_timeline_event {
  fj_mark_entry,       // kernel entry
  fj_mark_waited,      // after griddepcontrol.wait
  fj_mark_first_tile,  // the CTA's first tile landed
  fj_mark_loop_end,    // a piece's key loop done
  fj_mark_stored,      // a piece's partial state (or O) stored
  fj_mark_merge_start, // this CTA merges a split unit (fused merge)
  fj_mark_exit,        // all pieces done
  fj_mark_sm_pieces,   // %smid | pieces << 32 (not a time)
};
#ifdef FJ_DECODE_TIMELINE
enum { fj_decode_timeline_steps = 8, fj_decode_timeline_ctas = 1024, fj_decode_timeline_events = 8 };
extern "C" {
__device__ unsigned long long fj_decode_timeline[fj_decode_timeline_steps][fj_decode_timeline_ctas]
                                                [fj_decode_timeline_events];
}
#define FJ_DECODE_MARK(params, event, value)                                                                           \
  do {                                                                                                                 \
    if (threadIdx.x == 0 && blockIdx.x < fj_decode_timeline_ctas)                                                      \
      fj_decode_timeline[(unsigned)(params).pad_ % fj_decode_timeline_steps][blockIdx.x][event] = (value);             \
  } while (0)
#else
#define FJ_DECODE_MARK(params, event, value)                                                                           \
  do {                                                                                                                 \
  } while (0)
#endif
