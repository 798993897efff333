// One piece of the split-K decode kernel: run_piece streams the piece's K/V tiles through the
// kStages ring (cp.async copies or TMA tiles), runs each warp's online softmax over its keys of every
// tile and ends with finish_piece.
#pragma once

#include "kernel_params.h"
#include "kernels/decode/copies.cuh"
#include "kernels/decode/merge.cuh"
#include "kernels/decode/smem.cuh"
#include "kernels/decode/softmax.cuh"
#include "kernels/decode/timeline.cuh"
#include "kernels/decode/traits.cuh"
#include "kernels/decode/work.cuh"
#include "params_decode.h"
#include "prim/cp_async.cuh"
#include "prim/fence.cuh"
#include "prim/mbarrier.cuh"
#include "prim/timer.cuh"
#include "prim/types.cuh"
#include "prim/warp.cuh"

namespace fj::decode {

// ---- one piece -----------------------------------------------------------------------------------

// TMA tiles: the V rows of a tile at or past the piece's end are zeroed once the tile has landed.
// P is 0 there, but rows past the sequence are not ours to trust (NaN * 0 = NaN); the cp.async
// copies zero-fill them instead. Each writer fences before the TMA overwrites the stage.
__device__ __forceinline__ void zero_v_rows_past(const Smem &smem, int stage, int rows_valid) {
  constexpr int kChunksPerRow = TmaTile::kPanelsV * TmaTile::kSwizzleBytes / TmaTile::kChunkBytes;
  constexpr int kChunksPerPanelRow = TmaTile::kSwizzleBytes / TmaTile::kChunkBytes;
  char *v = reinterpret_cast<char *>(smem.v(stage));
  for (int c = (int)threadIdx.x; c < (Cfg::kBlockN - rows_valid) * kChunksPerRow; c += Cfg::kThreads) {
    const int row = rows_valid + c / kChunksPerRow;
    const int panel = (c % kChunksPerRow) / kChunksPerPanelRow;
    const int chunk = c % kChunksPerPanelRow;
    *reinterpret_cast<uint4 *>(v + panel * TmaTile::kPanelBytes + row * TmaTile::kSwizzleBytes +
                               chunk * TmaTile::kChunkBytes) = make_uint4(0, 0, 0, 0);
  }
  fence_proxy_async_shared();
}

// `first`: the CTA's first piece (timeline builds mark its first tile). TMA tiles: `kv_maps` are the
// K and V tensor maps, bit s of `phase_bits` the parity stage s's barrier completes next.
__device__ __forceinline__ void run_piece(const fj_decode_params &p, const Unit &u, const Smem &smem, bool first,
                                          const fj_tensor_map *kv_maps, u32 &phase_bits) {
  const fj_attention_params &a = p.attn;
  KvSource src = kv_source(a, u);
  src.maps = kv_maps;
  if constexpr (kTmaKv) { // the previous piece's merge scratch (generic stores) before the TMA writes
    fence_proxy_async_shared();
    __syncthreads();
  }
  zero_qk_padding(smem); // the previous piece's merge scratch may have covered the K padding
  const int num_tiles = (u.kv_end - u.kv_begin + Cfg::kBlockN - 1) / Cfg::kBlockN;

  // Prologue: pages of tiles 0 .. kStages-1 (their lookups go out together), then Q and the
  // first kStages - 1 tiles, one commit group per tile.
  if constexpr (Traits::kPaged && !kTmaKv) {
    i32 first_pages[Cfg::kStages];
#pragma unroll
    for (int t = 0; t < Cfg::kStages; ++t)
      first_pages[t] = src.lookup(t);
#pragma unroll
    for (int t = 0; t < Cfg::kStages; ++t)
      src.store_row_addrs(smem, t, first_pages[t]);
    __syncthreads();
  }
  load_q(a, u, smem);
  // TMA tiles, paged: the pages of the first kStages - 1 tiles are looked up together, so their
  // table reads overlap instead of each delaying its tile's loads.
  i32 first_group_pages[Cfg::kStages - 1] = {};
  if constexpr (kTmaKv && Traits::kPaged)
#pragma unroll
    for (int t = 0; t < Cfg::kStages - 1; ++t)
      first_group_pages[t] = src.group_page(t);
#pragma unroll
  for (int t = 0; t < Cfg::kStages - 1; ++t) {
    if (t < num_tiles)
      src.issue(smem, t, first_group_pages[t]);
    cp_async_commit_group(); // one group per tile, empty or not, keeps the wait count uniform
  }
  // Paged: cp.async copies, the page of this thread's row of tile kStages (stored at step 0, read
  // by the copies at step 1); TMA tiles, the page of its row group of tile kStages - 1.
  i32 next_page = kTmaKv ? src.group_page(Cfg::kStages - 1) : src.lookup(Cfg::kStages);
  const PieceMerge pm = piece_merge(p, u.state);

  RowRange ranges[Traits::kMTiles][kRowsPerThreadTile];
#pragma unroll
  for (int m = 0; m < Traits::kMTiles; ++m)
#pragma unroll
    for (int h = 0; h < kRowsPerThreadTile; ++h)
      ranges[m][h] = row_range(a, u, m * kMmaM + h * kHalfTile + lane_id() / kQuadSize);

  WarpState st;
  st.reset();
  QFragments q_held; // kHoldQ only
  for (int t = 0; t < num_tiles; ++t) {
    if constexpr (kTmaKv) {
      if (t == 0)
        cp_async_wait_all(); // Q, the only cp.async copies
      const int stage = t % Cfg::kStages;
      mbarrier_wait_parity(smem.full_bar(stage), (phase_bits >> stage) & 1u);
      phase_bits ^= 1u << stage;
      const int rows_valid = u.kv_end - (u.kv_begin + t * Cfg::kBlockN);
      if (rows_valid < Cfg::kBlockN)
        zero_v_rows_past(smem, stage, rows_valid);
    } else {
      cp_async_wait_group<Cfg::kStages - 2>(); // tile t (and Q) has landed for this thread
    }
    __syncthreads(); // ... and for every thread; stage t-1 is free again
#ifdef FJ_DECODE_TIMELINE
    if (first && t == 0)
      FJ_DECODE_MARK(p, fj_mark_first_tile, global_timer_ns());
#endif
    const int ahead = t + Cfg::kStages - 1;
    if (ahead < num_tiles)
      src.issue(smem, ahead, next_page);
    cp_async_commit_group();
    if constexpr (kTmaKv && Traits::kPaged) {
      if (ahead + 1 < num_tiles)
        next_page = src.group_page(ahead + 1);
    } else if constexpr (Traits::kPaged) {
      // Slot (t + kStages) % kStages is tile t's, whose copies went out kStages - 1 steps ago.
      if (ahead + 1 < num_tiles) {
        src.store_row_addrs(smem, ahead + 1, next_page);
        next_page = src.lookup(ahead + 2);
      }
    }

    const int stage = t % Cfg::kStages;
    const int tile_key = u.kv_begin + t * Cfg::kBlockN;
    float s[Traits::kMTiles][Traits::kNTilesS][4];
    if constexpr (kHoldQ) {
      if (t == 0) // Q landed with tile 0's group
#pragma unroll
        for (int ks = 0; ks < Traits::kKStepsQK; ++ks)
          load_q_fragments(smem, ks, q_held[ks]);
      qk_gemm(smem, stage, s, [&](int ks, u32(&a)[Traits::kMTiles][4]) {
#pragma unroll
        for (int m = 0; m < Traits::kMTiles; ++m)
#pragma unroll
          for (int i = 0; i < 4; ++i)
            a[m][i] = q_held[ks][m][i];
      });
    } else {
      qk_gemm(smem, stage, s, [&](int ks, u32(&a)[Traits::kMTiles][4]) { load_q_fragments(smem, ks, a); });
    }
    online_softmax(a, s, ranges, tile_key, st);
    pv_gemm(smem, stage, s, st);
  }
  cp_async_wait_all(); // only empty groups remain, or Q when the piece has no tile
  FJ_DECODE_MARK(p, fj_mark_loop_end, global_timer_ns());
  finish_piece(p, u, smem, st, pm);
}

} // namespace fj::decode
