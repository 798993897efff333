// FlashAttention-3-class forward kernel for Hopper (sm_90a), rendered with a KernelConfig from
// compiler/plans/fa3_plan.cpp. Roles: warpgroup 0 = producer (one thread issues TMA for Q, K, V
// into a kStages ring guarded by mbarriers; one warp with paged KV, the warpgroup when it gathers pages by cp.async),
// warpgroups 1..kConsumerWarpgroups = consumers (wgmma S = QK^T from smem, online softmax, O += PV with P in registers,
// epilogue). setmaxnreg moves registers from the producer to the consumers. Persistent: one CTA per SM walks the tiles;
// with kClusterM = 2 the grid is launched in CTA pairs that share (multicast) every K/V block.
#pragma once

#include "kernels/fa3/consumer.cuh"
#include "kernels/fa3/producer.cuh"
#include "kernels/fa3/smem.cuh"
#include "params_fa3.h"
#include "prim/cluster.cuh"
#include "prim/fence.cuh"
#include "prim/griddep.cuh"
#include "prim/mbarrier.cuh"
#include "prim/setmaxnreg.cuh"
#include "prim/tma.cuh"
#include "prim/types.cuh"

extern "C" __global__ void __launch_bounds__(KernelConfig::kThreads, 1)
    fj_fa3_prefill(const __grid_constant__ fj_fa3_params params) {
  using C = KernelConfig;
  using namespace fj;
  using namespace fj::fa3;
  static_assert(C::kThreads == kWarpgroupThreads * (1 + C::kConsumerWarpgroups), "one producer warpgroup");
  static_assert(C::kBlockM == kWgmmaM * C::kConsumerWarpgroups, "64 rows per consumer warpgroup");
  static_assert(C::kClusterM == 1 || C::kClusterM == 2, "single CTAs or CTA pairs");
  static_assert(C::kKVRowsPerCta * C::kClusterM == C::kBlockN, "each CTA of a pair loads its share of a block");

  extern __shared__ u8 smem_raw[];
  const u32 raw = cvta_to_shared_u32(smem_raw);
  const Smem<C> smem{(raw + C::kSmemAlign - 1) & ~static_cast<u32>(C::kSmemAlign - 1)};

  // Broadcast from lane 0 so the compiler knows the role is warp-uniform (otherwise ptxas treats
  // the wgmma code as divergent and serializes it, warning C7520).
  const int warpgroup = __shfl_sync(kFullMask, static_cast<int>(threadIdx.x / kWarpgroupThreads), 0);
  if (threadIdx.x == 0) {
    mbarrier_init(smem.q_full(), 1);
    mbarrier_init(smem.q_empty(), C::kConsumerWarpgroups);
    for (int stage = 0; stage < C::kStages; ++stage) {
      // Completed by the producer's expect_tx (TMA), or by each gathering thread's arrival.
      constexpr unsigned kFullArrivals = Producer<C>::kGather ? Producer<C>::kThreads : 1;
      mbarrier_init(smem.k_full(stage), kFullArrivals);
      mbarrier_init(smem.k_empty(stage), C::kConsumerWarpgroups * C::kClusterM);
      mbarrier_init(smem.v_full(stage), kFullArrivals);
      mbarrier_init(smem.v_empty(stage), C::kConsumerWarpgroups * C::kClusterM);
    }
    if constexpr (Producer<C>::kPagedBoxes)
      mbarrier_init(smem.v_landed(), 1);
    for (int slot = 0; slot < C::kTileSlots; ++slot) { // kDynamicTiles: the producer fills, every consumer reads
      mbarrier_init(smem.tile_full(slot), 1);
      mbarrier_init(smem.tile_empty(slot), C::kConsumerWarpgroups * kWarpgroupThreads);
    }
    fence_mbarrier_init();
    tma_prefetch_descriptor(&params.tma_q);
    if constexpr (!Producer<C>::kGather) { // a gather has no K/V maps
      tma_prefetch_descriptor(&params.tma_k);
      tma_prefetch_descriptor(&params.tma_v);
    }
    tma_prefetch_descriptor(&params.tma_o);
  }
  // The partner's producer multicasts into this CTA's ring and its consumers arrive on this CTA's
  // empty barriers: both CTAs' barriers must be initialized first.
  if constexpr (C::kClusterM > 1)
    cluster_sync();
  else
    __syncthreads();
  if constexpr (C::kProgrammaticLaunch) {
    // Launched as a programmatic dependent: the prologue above touched shared memory and the
    // parameters only, so it ran while the previous grid drained. Its memory is ours from here on;
    // the next grid may take this one's SMs as they free up.
    griddepcontrol_wait();
    if (threadIdx.x == 0)
      griddepcontrol_launch_dependents();
  }

  if (warpgroup == 0) {
    setmaxnreg_dec<C::kRegsProducer>();
    if (threadIdx.x < Producer<C>::kThreads) {
      Producer<C> producer{params, smem};
      producer.run();
    }
  } else {
    setmaxnreg_inc<C::kRegsConsumer>();
    Consumer<C> consumer{params, smem, warpgroup - 1, static_cast<int>(threadIdx.x % kWarpgroupThreads)};
    consumer.run();
  }
  // Neither CTA of a pair may exit while the other can still arrive on its barriers.
  if constexpr (C::kClusterM > 1)
    cluster_sync();
}
