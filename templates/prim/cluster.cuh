// Thread-block clusters (sm_90): CTAs of one cluster run at the same time on one GPC and can
// address each other's shared memory (the shared::cluster window). Used by the fa3 kernel to
// multicast each K/V block to both CTAs of a pair that works on the same (batch, head).
#pragma once

#include "prim/types.cuh"

namespace fj {

// mov.u32 %r, %cluster_ctarank / %clusterid.x / %nclusterid.x: this CTA's rank in its cluster, the
// cluster's index in the grid and the number of clusters (special registers, read where used).
__device__ __forceinline__ u32 cluster_ctarank() {
  u32 rank;
  asm("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}
__device__ __forceinline__ u32 cluster_id_x() {
  u32 id;
  asm("mov.u32 %0, %%clusterid.x;\n" : "=r"(id));
  return id;
}
__device__ __forceinline__ u32 cluster_count_x() {
  u32 count;
  asm("mov.u32 %0, %%nclusterid.x;\n" : "=r"(count));
  return count;
}

// barrier.cluster.arrive.release + barrier.cluster.wait.acquire: every thread of every CTA of the
// cluster; smem writes before it (mbarrier inits included) are visible to the cluster after it.
// Not .aligned: the producer warpgroup's threads reach it from diverged paths.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
}

// mapa.shared::cluster.u32 d, a, rank: the address of the same smem offset in CTA `rank`.
__device__ __forceinline__ u32 mapa_shared(u32 addr, u32 rank) {
  u32 mapped;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(mapped) : "r"(addr), "r"(rank));
  return mapped;
}

// mbarrier.arrive.shared::cluster.b64 _, [bar]: one arrival (default .release.cta) on a barrier that
// may live in another CTA of the cluster (a mapa address). A consumer's smem reads are wgmma's,
// complete before it arrives, and the partner's TMA overwrite is ordered by the barrier itself, so
// the cluster-scope release (which waits for this thread's outstanding memory traffic) is not needed.
__device__ __forceinline__ void mbarrier_arrive_cluster(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

} // namespace fj
