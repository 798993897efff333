// Global-memory loads through the read-only (non-coherent) path: for data no thread of the grid
// writes while the kernel runs (work lists, block tables, KV lengths, partial states of an earlier
// launch). `.nc` lets L1 keep them, so the 16 threads that look up one page share one fetch.
// The asm is volatile so that loads written back to back stay back to back: the compiler would
// otherwise sink each next to its use and a batch of independent loads would go out one by one.
#pragma once

#include "prim/types.cuh"

namespace fj {

// ld.global.nc.s32 d, [a]
__device__ __forceinline__ i32 ld_global_nc_s32(const i32 *address) {
  i32 out;
  asm volatile("ld.global.nc.s32 %0, [%1];" : "=r"(out) : "l"(address));
  return out;
}

// ld.global.nc.v4.s32 {d0..d3}, [a] — a must be 16-byte aligned.
__device__ __forceinline__ void ld_global_nc_v4_s32(i32 (&out)[4], const void *address) {
  asm volatile("ld.global.nc.v4.s32 {%0, %1, %2, %3}, [%4];"
               : "=r"(out[0]), "=r"(out[1]), "=r"(out[2]), "=r"(out[3])
               : "l"(address));
}

// ld.global.nc.f32 d, [a]
__device__ __forceinline__ float ld_global_nc_f32(const float *address) {
  float out;
  asm volatile("ld.global.nc.f32 %0, [%1];" : "=f"(out) : "l"(address));
  return out;
}

// ld.global.nc.v4.f32 {d0..d3}, [a] — a must be 16-byte aligned.
__device__ __forceinline__ void ld_global_nc_v4_f32(float (&out)[4], const float *address) {
  asm volatile("ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(out[0]), "=f"(out[1]), "=f"(out[2]), "=f"(out[3])
               : "l"(address));
}

// ld.global.nc.u16 d, [a] — one 16-bit element, for rows that are only element-aligned.
__device__ __forceinline__ u16 ld_global_nc_u16(const void *address) {
  u16 out;
  asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(out) : "l"(address));
  return out;
}

// Coherent loads (L2 only, `.cg`): for data other CTAs of the running grid wrote, read after an
// acquire (the decode's fused merge reads the partial states of a split unit this way). `.nc`
// would be wrong there: the read-only path is not coherent with writes made during the grid, and
// an L1 line may still hold what an earlier read of the same line (another unit's state) saw.
// Volatile asm, like the loads above: they stay after the (volatile) acquire fence.

// ld.global.cg.f32 d, [a]
__device__ __forceinline__ float ld_global_cg_f32(const float *address) {
  float out;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(out) : "l"(address));
  return out;
}

// ld.global.cg.v4.f32 {d0..d3}, [a] — a must be 16-byte aligned.
__device__ __forceinline__ void ld_global_cg_v4_f32(float (&out)[4], const float *address) {
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(out[0]), "=f"(out[1]), "=f"(out[2]), "=f"(out[3])
               : "l"(address));
}

// prefetch.global.L1 [a] — brings a's line into L1, so later loads of it hit there.
__device__ __forceinline__ void prefetch_global_l1(const void *address) {
  asm volatile("prefetch.global.L1 [%0];" ::"l"(address));
}

} // namespace fj
