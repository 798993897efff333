// Grid-scope arrival counting (the decode's fused merge: the last CTA to finish one of a split
// unit's pieces merges the unit). A CTA's writes are ordered before its arrival by a CTA barrier
// and a release by the arriving thread; the arrival that completes the count acquires, so every
// write made before any other arrival is visible to it (PTX memory model: release / acquire
// patterns at gpu scope, cumulative through the barrier).
#pragma once

#include "prim/types.cuh"

namespace fj {

// fence.acq_rel.gpu — a release fence before a later arrival, an acquire fence after an earlier one.
__device__ __forceinline__ void fence_acq_rel_gpu() {
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
}

// atom.acq_rel.gpu.global.add.s32 d, [a], b — d receives the value before the add.
__device__ __forceinline__ i32 atom_add_acq_rel_gpu_s32(i32 *address, i32 value) {
  i32 old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(address), "r"(value) : "memory");
  return old;
}

// atom.relaxed.gpu.global.add.s32 d, [a], b — a counter with no data behind it (d: the value before).
__device__ __forceinline__ i32 atom_add_relaxed_gpu_s32(i32 *address, i32 value) {
  i32 old;
  asm volatile("atom.relaxed.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(address), "r"(value) : "memory");
  return old;
}

// st.relaxed.gpu.global.s32 [a], b
__device__ __forceinline__ void st_relaxed_gpu_s32(i32 *address, i32 value) {
  asm volatile("st.relaxed.gpu.global.s32 [%0], %1;" ::"l"(address), "r"(value) : "memory");
}

// bar.red.or.pred p, 0, q — a CTA barrier (barrier 0, every thread) that also tells every thread
// whether any thread's predicate was true: one thread's decision, broadcast without shared memory.
__device__ __forceinline__ bool bar_red_or(bool predicate) {
  u32 out;
  asm volatile("{\n\t.reg .pred p, q;\n\tsetp.ne.u32 p, %1, 0;\n\tbar.red.or.pred q, 0, p;\n\tselp.u32 %0, 1, 0, q;\n}"
               : "=r"(out)
               : "r"((u32)predicate)
               : "memory");
  return out != 0;
}

} // namespace fj
