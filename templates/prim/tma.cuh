// TMA (cp.async.bulk.tensor, sm_90): tile copies between global memory, described by a
// CUtensorMap passed as a __grid_constant__ kernel parameter, and shared memory. Coordinates
// are element indices, innermost first; out-of-bounds elements are zero-filled on load and
// clipped on store.
#pragma once

#include "prim/types.cuh"

namespace fj {

// prefetch.tensormap [map]: pulls the 128-byte descriptor into the cache ahead of first use.
__device__ __forceinline__ void tma_prefetch_descriptor(const void *map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}

// createpolicy.fractional.L2::evict_last.b64: an L2 policy for data many CTAs re-read (K, V).
__device__ __forceinline__ u64 l2_policy_evict_last() {
  u64 policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// createpolicy.fractional.L2::evict_first.b64: an L2 policy for data read once (Q).
__device__ __forceinline__ u64 l2_policy_evict_first() {
  u64 policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint
//   [dst], [map, {c0, c1, c2, c3}], [bar], policy: a 4-D box lands in smem and its byte count is
//   credited to `bar` (armed beforehand with mbarrier_arrive_expect_tx).
__device__ __forceinline__ void tma_load_4d(u32 dst, const void *map, u32 bar, int c0, int c1, int c2, int c3,
                                            u64 policy) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
               " [%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n" ::"r"(dst),
               "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar), "l"(policy)
               : "memory");
}

// cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster
//   .L2::cache_hint [dst], [map, {c0, c1, c2, c3}], [bar], mask, policy: one box read once from L2
//   lands at offset `dst` of every CTA in `cta_mask` and is credited to `bar` at the same offset in each.
__device__ __forceinline__ void tma_load_4d_multicast(u32 dst, const void *map, u32 bar, int c0, int c1, int c2, int c3,
                                                      u16 cta_mask, u64 policy) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
               ".L2::cache_hint [%0], [%1, {%2, %3, %4, %5}], [%6], %7, %8;\n" ::"r"(dst),
               "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar), "h"(cta_mask), "l"(policy)
               : "memory");
}

// cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [map, {c0, c1, c2, c3}], [src]:
// stores a 4-D box from smem (write with fence_proxy_async_shared first); bounds are clipped.
__device__ __forceinline__ void tma_store_4d(const void *map, u32 src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(map),
               "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
               : "memory");
}

// cp.async.bulk.commit_group: closes the bulk stores issued so far by this thread into a group.
__device__ __forceinline__ void tma_store_commit_group() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// cp.async.bulk.wait_group.read N: the source smem of all but N groups may be overwritten.
template <int kPending> __device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}

// cp.async.bulk.wait_group N: all but N groups have completed their global writes.
template <int kPending> __device__ __forceinline__ void tma_store_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}

} // namespace fj
