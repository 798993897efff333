// cp.async with L2 controls (sm_80+): a cache policy from createpolicy (prim/tma.cuh) and an L2
// prefetch size. For streams read once, such as the decode's K/V cache.
#pragma once

#include "prim/types.cuh"

namespace fj {

// cp.async.cg.shared.global.L2::cache_hint.L2::128B [dst], [src], 16, src_size, policy — as
// cp_async_cg_16 (zero-fills past src_size), with the L2 policy `policy`; L2 also fetches the whole
// aligned 128-byte block around the chunk from DRAM in one request.
__device__ __forceinline__ void cp_async_cg_16_l2_hint_128b(u32 smem_addr, const void *global, int src_size,
                                                            u64 policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::128B [%0], [%1], 16, %2, %3;" ::"r"(smem_addr),
               "l"(global), "r"(src_size), "l"(policy)
               : "memory");
}

} // namespace fj
