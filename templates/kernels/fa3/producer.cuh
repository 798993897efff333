// Producer of the fa3 kernel: one thread of warpgroup 0 issues every TMA load. Per tile it loads
// the first K block, then Q (once the previous tile's epilogue has released the Q/O region),
// then V of that block, then K and V of each further block, each into the next ring slot after
// the consumers released it. The other warps of the warpgroup exit after setmaxnreg.
#pragma once

#include "kernels/fa3/scheduler.cuh"
#include "kernels/fa3/smem.cuh"
#include "prim/mbarrier.cuh"
#include "prim/tma.cuh"

namespace fj::fa3 {

template <class C> struct Producer {
  const fj_fa3_params &params;
  const Smem<C> &smem;
  u64 keep_policy;  // K, V: re-read by every m-block of the head
  u64 stream_policy; // Q: read once

  __device__ __forceinline__ void load_kv(const fj_tensor_map &map, u32 full_bar, u32 empty_bar, u32 phase, u32 tx_bytes,
                                          u32 dst, int panels, int col_step, const Tile &t, int n) {
    mbarrier_wait_parity(empty_bar, phase ^ 1);
    mbarrier_arrive_expect_tx(full_bar, tx_bytes);
    for (int panel = 0; panel < panels; ++panel)
      tma_load_4d(dst + panel * C::kSmemPanelBytesKV, &map, full_bar, panel * col_step, t.k_row0 + n * C::kBlockN,
                  t.kv_head, t.batch_coord, keep_policy);
  }

  __device__ __forceinline__ void load_k(const Tile &t, int n, int block_index) {
    const RingSlot<C> slot = RingSlot<C>::at(block_index);
    load_kv(params.tma_k, smem.k_full(slot.stage), smem.k_empty(slot.stage), slot.phase, C::kTxBytesK,
            smem.k_panel(slot.stage, 0), C::kPanelsQK, C::kPanelCols, t, n);
  }

  __device__ __forceinline__ void load_v(const Tile &t, int n, int block_index) {
    const RingSlot<C> slot = RingSlot<C>::at(block_index);
    load_kv(params.tma_v, smem.v_full(slot.stage), smem.v_empty(slot.stage), slot.phase, C::kTxBytesV,
            smem.v_stage(slot.stage), C::kPanelsV, C::kPanelCols, t, n);
  }

  __device__ __forceinline__ void load_q(const Tile &t, u32 tile_parity) {
    constexpr int kBoxesPerPanel = C::kBlockM / C::kTmaBoxRows;
    mbarrier_wait_parity(smem.q_empty(), tile_parity ^ 1);
    mbarrier_arrive_expect_tx(smem.q_full(), C::kTxBytesQ);
    const int row = t.q_row0 + t.m_block * C::kBlockM;
    for (int panel = 0; panel < C::kPanelsQK; ++panel)
      for (int box = 0; box < kBoxesPerPanel; ++box)
        tma_load_4d(smem.q_panel(panel) + box * C::kTmaBoxRows * C::kSwizzleBytes, &params.tma_q, smem.q_full(),
                    panel * C::kPanelCols, row + box * C::kTmaBoxRows, t.head, t.batch_coord, stream_policy);
  }

  __device__ void run() {
    int block_index = 0; // KV blocks issued by this CTA so far (ring position)
    u32 tile_parity = 0; // flips per tile that loads Q
    for (int wave = 0, index = snake_tile(0); wave * (int)gridDim.x < params.num_tiles; index = snake_tile(++wave)) {
      if (index >= params.num_tiles)
        continue;
      const Tile t = decode_tile<C>(params, index);
      if (!t.has_rows || t.n_max <= t.n_min)
        continue; // the consumers write O = 0 / LSE = -inf without touching smem
      int n = t.n_max - 1;
      load_k(t, n, block_index);
      load_q(t, tile_parity);
      load_v(t, n, block_index);
      ++block_index;
      for (--n; n >= t.n_min; --n, ++block_index) {
        load_k(t, n, block_index);
        load_v(t, n, block_index);
      }
      tile_parity ^= 1;
    }
  }
};

} // namespace fj::fa3
