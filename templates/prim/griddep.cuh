// Programmatic dependent launch (sm_90+): a grid launched with the programmatic-stream-serialization
// attribute may start before the grid it depends on has finished; these order the two.
// Without that launch attribute both are no-ops, so a kernel can always contain them.
#pragma once

namespace fj {

// griddepcontrol.launch_dependents — lets the dependent grid be scheduled now (its CTAs then
// sleep in griddepcontrol.wait), so its launch latency hides behind this grid's work.
__device__ __forceinline__ void griddepcontrol_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// griddepcontrol.wait — blocks until every prerequisite grid has completed and its memory
// operations are visible to this grid.
__device__ __forceinline__ void griddepcontrol_wait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

} // namespace fj
