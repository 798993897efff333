// Launching a loaded kernel for a validated problem: one function per variant (grid, params).
// None allocates, synchronizes or reads device memory, so each can be captured in a CUDA graph.
#pragma once

#include "runtime/kernel_store.hpp"
#include "runtime/params.hpp"
#include "runtime/problem.hpp"

#include "params_fa3.h"

namespace flashjit {

// problem.workspace (split-K decode, fa3 tail split) must start on this boundary (flashjit.h).
constexpr size_t kWorkspaceAlignment = 256;

struct LaunchContext {
  int sm_count = 0; // of the current device, for persistent grids and split counts
  int l2_bytes = 0;
};

// What launch_fa2 launches: the parameter block and the grid made from the problem (exposed so the
// host-overhead benchmark's raw-launch floor launches exactly the runtime's configuration).
struct Fa2Launch {
  fj_attention_params params;
  Dim3 grid, block;
  int smem_bytes = 0;
};
Fa2Launch fa2_launch(const KernelRecord &kernel, const NormalizedProblem &problem);

// What launch_fa3 launches: the parameter block (TMA maps encoded, or taken from the per-thread cache of
// encoded blocks) and the persistent grid; an error when TMA cannot address the layout.
struct Fa3Launch {
  fj_fa3_params params;
  Dim3 grid, block, cluster;
  int smem_bytes = 0;
  // Tail split: the bytes of arrival counters at params.tail_counters; dynamic tiles: the counter at
  // params.tile_counter. They must be zero when the kernel starts (it leaves them zero; Runtime zeroes
  // them once per workspace). 0: none this launch; tail_unused / dynamic_unused then say whether the
  // plan wanted them and had no workspace.
  size_t counter_bytes = 0;
  bool tail_unused = false;
  bool dynamic_unused = false;
  bool programmatic = false; // kProgrammaticLaunch: launched with programmatic stream serialization
};
Status fa3_launch(const KernelRecord &kernel, const NormalizedProblem &problem, const LaunchContext &ctx,
                  Fa3Launch *out);
Status launch_fa3(const KernelRecord &kernel, Fa3Launch &launch, CUstream stream);

Status launch_fa2(const KernelRecord &kernel, const NormalizedProblem &problem, const LaunchContext &ctx,
                  CUstream stream);
// fa3_launch, then the launch (the host benchmark's launch_fa3_hot; no workspace counters zeroed).
Status launch_fa3(const KernelRecord &kernel, const NormalizedProblem &problem, const LaunchContext &ctx,
                  CUstream stream);

} // namespace flashjit
