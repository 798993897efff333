// The global nanosecond timer (%globaltimer) and the SM's cycle counter (%clock64), for timelines of one
// launch (diagnostic builds).
#pragma once

#include "prim/types.cuh"

namespace fj {

__device__ __forceinline__ u64 global_timer_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// mov.u64 d, %clock64 — the SM's cycle counter: one clock for every warp of a CTA.
__device__ __forceinline__ u64 clock_cycles() {
  u64 t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t));
  return t;
}

__device__ __forceinline__ u32 sm_id() {
  u32 id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}

} // namespace fj
