// Proxy and initialization fences (sm_90). The async proxy (TMA, wgmma) does not see generic
// shared-memory writes, nor freshly initialized mbarriers, without these.
#pragma once

#include "prim/types.cuh"

namespace fj {

// fence.proxy.async.shared::cta: generic-proxy smem writes (st.shared, stmatrix) become visible
// to the async proxy (TMA store, wgmma) of this CTA. Each writing thread fences, then a barrier.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// fence.mbarrier_init.release.cluster: makes mbarrier.init visible to the async proxy (TMA
// complete_tx) before any copy is armed against the barrier.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

} // namespace fj
