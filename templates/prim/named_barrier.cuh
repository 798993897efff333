// Named barriers (bar.sync / bar.arrive, sm_70+): 16 per CTA, id 0 is __syncthreads. Used to
// synchronise a subset of warps (one warpgroup's epilogue) and to hand the tensor cores from one
// consumer warpgroup to the next (pingpong): one side syncs, the other only arrives.
#pragma once

#include "prim/types.cuh"

namespace fj {

// bar.sync id, count: waits until `count` threads (a multiple of 32) have arrived at barrier `id`.
__device__ __forceinline__ void named_barrier_sync(u32 id, u32 count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// bar.arrive id, count: counts this warp's arrival at barrier `id` without waiting.
__device__ __forceinline__ void named_barrier_arrive(u32 id, u32 count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// bar.red.or.pred p, id, count, q: bar.sync that also tells every participating thread whether
// any of them passed a true predicate (one thread's decision, broadcast without shared memory).
__device__ __forceinline__ bool named_barrier_red_or(u32 id, u32 count, bool predicate) {
  u32 out;
  asm volatile("{\n\t.reg .pred p, q;\n\tsetp.ne.u32 p, %3, 0;\n\tbar.red.or.pred q, %1, %2, p;\n\tselp.u32 %0, 1, 0, "
               "q;\n}"
               : "=r"(out)
               : "r"(id), "r"(count), "r"((u32)predicate)
               : "memory");
  return out != 0;
}

} // namespace fj
