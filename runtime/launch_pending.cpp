// Launchers of variants whose planners still decline every spec in this build (see
// compiler/plans/*_plan.cpp): reaching one means the planner and the launcher disagree.
#include "runtime/launch.hpp"

namespace flashjit {

Status launch_decode(const KernelRecord &kernel, const NormalizedProblem &, const LaunchContext &, CUstream) {
  return Status::error(FLASHJIT_INTERNAL, kernel.name + ": the decode launcher is not part of this build");
}

} // namespace flashjit
