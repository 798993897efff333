// Split-K decode on the host side: the workspace layout, the schedule made from the KV lengths
// (plan), and the launch that replays it: one (the decode merges its split units itself, plan
// constant kFusedMerge) or two (decode pieces, then fj_decode_combine).
#pragma once

#include "compiler/splitk_schedule.hpp"
#include "runtime/launch.hpp"

namespace flashjit {

// What plan() leaves behind for forward(): the schedule lives in the workspace, these host facts
// say how to launch it.
struct DecodeSchedule {
  KernelSpec spec;
  int batch = 0;
  SplitKShape shape;
  SplitKLayout layout;
  SplitKSchedule schedule;
  // From the plan, read once here rather than on every launch.
  bool fused_merge = false;     // kFusedMerge: one launch per step
  unsigned combine_threads = 0; // kCombineThreads of fj_decode_combine (unfused plans)
  bool tma_kv = false;          // kTmaKv: the K/V tensor maps follow the decode's parameters
};

// The shape and workspace layout of `kernel` (a decode_splitk record) for this problem.
Status decode_layout(const KernelRecord &kernel, const NormalizedProblem &problem, const LaunchContext &ctx,
                     SplitKShape *shape, SplitKLayout *layout);

// Computes the schedule from the host lengths and copies it into problem.p.workspace (synchronous).
Status plan_decode_schedule(const KernelRecord &kernel, const NormalizedProblem &problem, const LaunchContext &ctx,
                            DecodeSchedule *out);

Status launch_decode(const KernelRecord &kernel, const NormalizedProblem &problem, const DecodeSchedule &schedule,
                     CUstream stream);

} // namespace flashjit
