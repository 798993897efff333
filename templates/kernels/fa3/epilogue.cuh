// Epilogue of the fa3 kernel, per consumer warpgroup (64 rows): normalize O, write the LSE from
// registers, stage O through smem (stmatrix into 128B-swizzled O panels: its own region with
// kSeparateO, else the Q panels, which are dead after the tile's last QK), then either one TMA
// store per 64-column panel (rows outside the tensor are clipped) or, for a varlen tile whose
// rows run past its sequence, predicated 16-byte stores (the packed tensor's next rows belong to
// another sequence). Without kSeparateO the Q/O region is then released to the producer; with it,
// the consumer released Q after the last QK and the next epilogue waits for this store's read.
#pragma once

#include "kernels/fa3/smem.cuh"
#include "kernels/fa3/softmax.cuh"
#include "prim/fence.cuh"
#include "prim/mbarrier.cuh"
#include "prim/named_barrier.cuh"
#include "prim/st_global.cuh"
#include "prim/tma.cuh"
#include "prim/types.cuh"

namespace fj::fa3 {

constexpr int kWgmmaM = 64; // rows per consumer warpgroup
constexpr int kRowsPerWarp = 16;
constexpr int kChunkBytes = 16; // one swizzle chunk = 8 16-bit values
constexpr int kChunkElems = 8;
constexpr int kQuadLanes = 4;

// stmatrix.sync.aligned.m8n8.x4.shared.b16 [addr], {r0, r1, r2, r3}: four 8x8 matrices; lanes
// 8i..8i+7 give the row addresses of matrix i, register i holds this lane's pair of matrix i.
// (Belongs with ldmatrix in prim/ldmatrix.cuh; kept here because that file is fa2's.)
__device__ __forceinline__ void stmatrix_x4(u32 addr, u32 r0, u32 r1, u32 r2, u32 r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

// stmatrix.sync.aligned.m8n8.x2.shared.b16 [addr], {r0, r1}: lanes 0..15 give the addresses.
__device__ __forceinline__ void stmatrix_x2(u32 addr, u32 r0, u32 r1) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.shared.b16 [%0], {%1, %2};\n" ::"r"(addr), "r"(r0), "r"(r1) : "memory");
}

// ld.shared.v4.b32 {d0..d3}, [addr]: one 16-byte chunk of the staged O tile.
__device__ __forceinline__ void ld_shared_v4_b32(u32 (&out)[4], u32 addr) {
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(out[0]), "=r"(out[1]), "=r"(out[2]), "=r"(out[3])
               : "r"(addr));
}

// Address of (row, 16-byte chunk) in a panel-major 128B-swizzled tile of kBlockM-row panels.
template <class C> __device__ __forceinline__ u32 swizzled_chunk(const Smem<C> &smem, int row, int col) {
  const int panel = col / C::kPanelCols;
  const int chunk = (col % C::kPanelCols) / kChunkElems;
  return swizzled_address<C>(smem.o_panel(panel), row, chunk);
}

template <class C> struct Epilogue {
  const fj_fa3_params &params;
  const Smem<C> &smem;
  int wg;  // consumer warpgroup index
  int tid; // thread index inside the warpgroup

  __device__ __forceinline__ int warp() const { return tid / kWarpSize; }
  __device__ __forceinline__ int lane() const { return tid % kWarpSize; }

  __device__ __forceinline__ char *o_row_ptr(const Tile &t, int row_in_seq) const {
    const fj_tensor_ref &o = params.base.o;
    const fj_i64 elem = (C::kVarlen ? 0 : (fj_i64)t.batch * o.batch_stride) +
                        (fj_i64)(t.q_row0 + row_in_seq) * o.row_stride + (fj_i64)t.head * o.head_stride;
    return (char *)o.ptr + elem * sizeof(u16);
  }

  __device__ __forceinline__ void write_lse(const Tile &t, int row_in_seq, float lse) const {
    float *out = params.base.maybe_lse;
    if (out == nullptr || row_in_seq >= t.seqlen_q)
      return;
    const fj_attention_params &p = params.base;
    const fj_i64 index = C::kVarlen ? (fj_i64)t.head * p.total_q + t.q_row0 + row_in_seq
                                    : ((fj_i64)t.batch * p.heads_q + t.head) * p.seqlen_q + row_in_seq;
    out[index] = lse;
  }

  // A tile none of whose rows sees a key: O = 0, LSE = -inf, straight to global memory.
  __device__ void write_empty(const Tile &t) const {
    constexpr int kChunks = C::kHeadDimV / kChunkElems;
    const int row_base = t.m_block * C::kBlockM + wg * kWgmmaM;
    for (int i = tid; i < kWgmmaM * kChunks; i += kWarpgroupThreads) {
      const int row = row_base + i / kChunks;
      if (row < t.seqlen_q) {
        const u32 zero[4] = {0, 0, 0, 0};
        st_global_v4_b32(o_row_ptr(t, row) + (i % kChunks) * kChunkBytes, zero);
      }
    }
    for (int i = tid; i < kWgmmaM; i += kWarpgroupThreads)
      write_lse(t, row_base + i, neg_inf());
  }

  // O accumulators -> 16-bit, into this warpgroup's rows of the swizzled Q/O panels.
  __device__ __forceinline__ void stage_o(const float (&o)[C::kHeadDimV / 2]) const {
    constexpr int kGroups = C::kHeadDimV / kColsPerGroup;
    const int lane_row = lane() % kChunkElems;
    const int matrix = lane() / kChunkElems;
    const int row_base = wg * kWgmmaM + warp() * kRowsPerWarp + lane_row;
#pragma unroll
    for (int j = 0; j + 1 < kGroups; j += 2) {
      const int row = row_base + (matrix & 1) * kRowHalf;
      const int col = (j + (matrix >> 1)) * kColsPerGroup;
      stmatrix_x4(swizzled_chunk<C>(smem, row, col),
                  pack2_from_f32<C::kDType>(o[j * kAccPerGroup + 0], o[j * kAccPerGroup + 1]),
                  pack2_from_f32<C::kDType>(o[j * kAccPerGroup + 2], o[j * kAccPerGroup + 3]),
                  pack2_from_f32<C::kDType>(o[j * kAccPerGroup + 4], o[j * kAccPerGroup + 5]),
                  pack2_from_f32<C::kDType>(o[j * kAccPerGroup + 6], o[j * kAccPerGroup + 7]));
    }
    if constexpr (kGroups % 2 == 1) {
      constexpr int j = kGroups - 1;
      const int row = row_base + (matrix & 1) * kRowHalf;
      stmatrix_x2(swizzled_chunk<C>(smem, row, j * kColsPerGroup),
                  pack2_from_f32<C::kDType>(o[j * kAccPerGroup + 0], o[j * kAccPerGroup + 1]),
                  pack2_from_f32<C::kDType>(o[j * kAccPerGroup + 2], o[j * kAccPerGroup + 3]));
    }
  }

  __device__ void run(const Tile &t, float (&o)[C::kHeadDimV / 2], const RowState<C> &st, float scale_log2) const {
    // Finish the row sums across the quad, normalize, and write the LSE (natural log).
    const int row0 = t.m_block * C::kBlockM + wg * kWgmmaM + warp() * kRowsPerWarp + lane() / kQuadLanes;
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      const float sum = quad_reduce_sum(st.sum[r]);
      // kLazyTopRounding: O by the sum of the P that weighted V, the LSE by the exact sum.
      const float normalizer = C::kLazyTopRounding ? quad_reduce_sum(st.sum[r] + st.top_rounding[r]) : sum;
      const float inv = normalizer > 0.0f ? rcp_approx(normalizer) : 0.0f;
#pragma unroll
      for (int j = 0; j < C::kHeadDimV / kColsPerGroup; ++j) {
        o[j * kAccPerGroup + r * 2] *= inv;
        o[j * kAccPerGroup + r * 2 + 1] *= inv;
      }
      if (lane() % kQuadLanes == 0)
        write_lse(t, row0 + r * kRowHalf,
                  sum > 0.0f ? (st.reference(r) * scale_log2 + lg2_approx(sum)) * kLn2 : neg_inf());
    }

    const u32 epilogue_barrier = C::kBarrierEpilogue + wg;
    if constexpr (C::kSeparateO) {
      // The previous tile's TMA store must have read the O panels before they are overwritten.
      if (tid == 0)
        tma_store_wait_read<0>();
      named_barrier_sync(epilogue_barrier, kWarpgroupThreads);
    }
    stage_o(o);
    const int wg_row = t.m_block * C::kBlockM + wg * kWgmmaM; // first row of this warpgroup
    const bool tma_store = !C::kVarlen || wg_row + kWgmmaM <= t.seqlen_q;
    if (tma_store) {
      fence_proxy_async_shared(); // stmatrix writes -> visible to the TMA engine
      named_barrier_sync(epilogue_barrier, kWarpgroupThreads);
      if (tid == 0) {
        for (int panel = 0; panel < C::kPanelsV; ++panel)
          tma_store_4d(&params.tma_o, smem.o_panel(panel) + wg * kWgmmaM * C::kSwizzleBytes, panel * C::kPanelCols,
                       t.q_row0 + wg_row, t.head, t.batch_coord);
        tma_store_commit_group();
        if constexpr (!C::kSeparateO) {
          tma_store_wait_read<0>(); // smem may be overwritten by the next Q once read
          mbarrier_arrive(smem.q_empty());
        }
      }
    } else {
      named_barrier_sync(epilogue_barrier, kWarpgroupThreads);
      constexpr int kChunks = C::kHeadDimV / kChunkElems;
      for (int i = tid; i < kWgmmaM * kChunks; i += kWarpgroupThreads) {
        const int row = i / kChunks;
        const int chunk = i % kChunks;
        if (wg_row + row < t.seqlen_q) {
          u32 v[4];
          ld_shared_v4_b32(v, swizzled_chunk<C>(smem, wg * kWgmmaM + row, chunk * kChunkElems));
          st_global_v4_b32(o_row_ptr(t, wg_row + row) + chunk * kChunkBytes, v);
        }
      }
      if constexpr (!C::kSeparateO) {
        fence_proxy_async_shared(); // our generic accesses before the next Q's TMA overwrite
        named_barrier_sync(epilogue_barrier, kWarpgroupThreads); // all smem reads done
        if (tid == 0)
          mbarrier_arrive(smem.q_empty());
      }
    }
  }
};

} // namespace fj::fa3
