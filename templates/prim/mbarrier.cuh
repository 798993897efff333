// mbarrier (sm_90): shared-memory transaction barriers that pair TMA copies with their consumers.
// Addresses are 32-bit shared-window addresses. A barrier's phase flips when its pending arrival
// count and its expected transaction bytes both reach zero; waiters name the phase by its parity.
#pragma once

#include "prim/types.cuh"

namespace fj {

// mbarrier.init.shared::cta.b64 [bar], count: `count` arrivals complete one phase.
__device__ __forceinline__ void mbarrier_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar], bytes: one arrival plus `bytes` of TMA
// traffic that must land before the phase completes (armed by the producer before the copy).
__device__ __forceinline__ void mbarrier_arrive_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// mbarrier.arrive.shared::cta.b64 _, [bar]: one arrival (release semantics at CTA scope).
__device__ __forceinline__ void mbarrier_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// mbarrier.try_wait.parity.shared::cta.b64 p, [bar], parity: true once the phase with this
// parity has completed (a fresh barrier counts the phase of parity 1 as completed).
__device__ __forceinline__ bool mbarrier_try_wait_parity(u32 bar, u32 parity) {
  u32 done;
  asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(done)
               : "r"(bar), "r"(parity)
               : "memory");
  return done != 0;
}

// mbarrier.test_wait.parity.shared::cta.b64 p, [bar], parity: as try_wait, but answers at once
// (never suspends), for a thread that has other work before it would block.
__device__ __forceinline__ bool mbarrier_test_wait_parity(u32 bar, u32 parity) {
  u32 done;
  asm volatile("{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(done)
               : "r"(bar), "r"(parity)
               : "memory");
  return done != 0;
}

// Spins on try_wait (which itself suspends for a hardware-chosen time) until the phase completes.
__device__ __forceinline__ void mbarrier_wait_parity(u32 bar, u32 parity) {
  while (!mbarrier_try_wait_parity(bar, parity)) {
  }
}

} // namespace fj
