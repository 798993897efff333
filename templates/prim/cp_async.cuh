// Asynchronous global -> shared copies (sm_80+), tracked in per-thread commit groups.
#pragma once

#include "prim/types.cuh"

namespace fj {

// Bytes moved by one cp.async.cg (the only size .cg allows; it bypasses L1).
constexpr int kCpAsyncBytes = 16;

// cp.async.cg.shared.global [dst], [src], 16, src_size — copies src_size (0 or 16) bytes and
// zero-fills the rest, so a row past the end of a sequence lands as zeros without a branch.
__device__ __forceinline__ void cp_async_cg_16(u32 smem_addr, const void *global, int src_size) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr), "l"(global), "r"(src_size) : "memory");
}

// cp.async.commit_group — closes the group of copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit_group() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}

// cp.async.wait_group N — waits until at most N of this thread's groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// cp.async.mbarrier.arrive.noinc.shared::cta.b64 [bar] — the barrier at shared address `bar` counts
// one arrival of this thread once all of its earlier copies have landed; .noinc: that arrival is one
// of the barrier's expected count (no wait in the thread, no extra arrive).
__device__ __forceinline__ void cp_async_mbarrier_arrive_noinc(u32 bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

// cp.async.wait_all — waits for every copy this thread issued.
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;" ::: "memory");
}

} // namespace fj
