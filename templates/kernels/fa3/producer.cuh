// Producer of the fa3 kernel: one thread of warpgroup 0 issues every TMA load. Per tile it loads
// the first K block, then Q (once the previous tile's epilogue has released the Q/O region),
// then V of that block, then K and V of each further block, each into the next ring slot after
// the consumers released it. With CTA pairs (kClusterM = 2) each producer loads its half of the
// rows of every K/V block and multicasts it to both CTAs; each CTA's full barrier expects the whole
// block, and its empty barrier counts the releases of both CTAs' consumers, so neither producer
// overwrites a slot the other CTA still reads. The other threads of the warpgroup go to the
// kernel's end after setmaxnreg.
//
// Paged KV (kPageSize > 0): the whole first warp produces. Lane b loads box b of each K/V block,
// kPagedBoxRows keys of one page (its page looked up in the block table before the wait for the
// slot), every panel; boxes past the sequence's end are not loaded. Where a block ends inside it, V's
// rows past the end hold whatever the cache holds there (NaN * 0 = NaN in PV, though P is 0): that
// V lands on the warp's own barrier (v_landed); once the next K is issued (the tile's next block's,
// or for a one-block tile the next tile's first), the warp waits for it, zeroes those rows, and
// only then completes the full barrier the consumers wait on. K's rows past the end are masked to
// -inf by the select. The lanes reconverge after every wait (__syncwarp): lanes without a box
// would otherwise wait on a barrier's parity on their own and could fall a phase behind.
//
// Paged KV gathered (kPagedGather: pages that boxes of whole swizzle atoms cannot tile, e.g. a
// key per page): the whole warpgroup produces. Each thread copies one 16-byte chunk of a row per
// pass with cp.async, its page looked up per row; rows past the sequence's end and columns past
// the head dim land as zeros (source size 0), so no V row needs zeroing afterwards. cp.async
// writes through the generic proxy and cannot arrive on the barrier after a proxy fence by itself:
// a K or V block is published once kGatherGroupsInFlight newer ones are issued (its copies waited
// for, fenced, then each thread arrives on the full barrier), so with kStages ring slots the copies
// of up to kStages - 1 blocks are in flight while slots are free. Before a wait
// that would block (a slot, or Q's region, still in use), the pending blocks are published first:
// the consumers may need it to get there (the step that frees the slot waited for starts with the
// QK of the K block issued last). kGatherNoincArrive (an A/B) publishes as FA-3's non-TMA paged path
// counts (there with the plain form and an ordinary arrive): each thread's copies of a block arrive
// on its full barrier when they land (cp.async.mbarrier.arrive.noinc), with no wait in the producer
// and no proxy fence.
#pragma once

#include "kernels/fa3/scheduler.cuh"
#include "kernels/fa3/smem.cuh"
#include "kernels/fa3/timeline.cuh"
#include "prim/address.cuh"
#include "prim/cp_async.cuh"
#include "prim/fence.cuh"
#include "prim/ld_global.cuh"
#include "prim/mbarrier.cuh"
#include "prim/st_shared.cuh"
#include "prim/tma.cuh"
#include "prim/types.cuh"
#include "prim/warp.cuh"

namespace fj::fa3 {

template <class C> struct Producer {
  const fj_fa3_params &params;
  const Smem<C> &smem;
  // L2 policies are made where they are used (one createpolicy each): the producer runs on
  // kRegsProducer registers, and two live 64-bit policies across the tile loop spill there.

  static constexpr u16 kPairMask = static_cast<u16>((1u << C::kClusterM) - 1); // multicast to every CTA of the pair
  static constexpr bool kPaged = C::kPageSize > 0;
  static constexpr bool kGather = kPaged && C::kPagedGather;
  static constexpr bool kPagedBoxes = kPaged && !kGather;
  static constexpr bool kGatherNoinc = kGather && C::kGatherNoincArrive;
  // One thread issues every TMA; paged boxes take a lane each, a gather the whole warpgroup.
  static constexpr unsigned kThreads = kGather ? kWarpgroupThreads : kPaged ? kWarpSize : 1;
  static_assert(!kPaged || (C::kClusterM == 1 && !C::kTailSplit),
                "paged KV: single CTAs; only a tile's first block can end inside it");
  static_assert(!kPagedBoxes || (C::kBlockN % C::kPagedBoxRows == 0 && C::kPageSize % C::kPagedBoxRows == 0 &&
                                 C::kBlockN / C::kPagedBoxRows <= kWarpSize),
                "paged KV boxes: blocks and pages of whole boxes, one lane per box");
  static_assert(!kPagedBoxes || C::kPagedBoxRows * C::kSwizzleBytes % C::kSmemAlign == 0,
                "paged KV boxes: boxes start on a swizzle atom");
  static_assert(!kGather || C::kStages >= 2, "gather: a slot's release never waits for the latest block");
  static_assert(!C::kDynamicTiles || (kThreads == 1 && C::kClusterM == 1 && !C::kTailSplit),
                "dynamic tiles: one producing thread draws and publishes them, for single CTAs walking whole tiles");
  // Gather: groups a publish leaves in flight. The ring holds kStages - 1 blocks past the one the
  // consumers read, two groups (K, V) each; the newest of those may still be copying.
  static constexpr int kGatherGroupsInFlight = 2 * (C::kStages - 1) - 1;
  static constexpr int kGatherChunksPerRow = C::kSwizzleBytes / kCpAsyncBytes;
  static constexpr int kGatherRowsPerPass = kThreads / kGatherChunksPerRow;
  static constexpr int kElemBytes = static_cast<int>(sizeof(u16));
  static constexpr int kElemsPerChunk = kCpAsyncBytes / kElemBytes;
  static constexpr int kL1LineBytes = 128;
  static constexpr int kPagesPerLine = kL1LineBytes / static_cast<int>(sizeof(i32)); // block-table entries
  static constexpr int kZeroChunkBytes = 16;                                         // one st.shared.v4
  static constexpr int kZeroChunksPerRow = C::kSwizzleBytes / kZeroChunkBytes;

  u32 landed_parity = 0;             // paged KV: phase of the v_landed barrier the producer waits for next
  int deferred_v_valid = C::kBlockN; // paged KV: a one-block tile's V still to finish (kBlockN: none)
  int deferred_v_block = 0;          // and its block index
  // Gather: copy groups (one per K or V block: group 2b is K of ring position b, 2b + 1 its V)
  // published to the consumers so far. How many are issued comes from the caller (the ring
  // position): one more live register in the producer's 24 costs the gather's pass five
  // instructions (the block table's address, rematerialized).
  int gather_published = 0;
  // kTimeline (diagnostic): the K/V loads' points, recorded by the issuing thread in CTA kTimelineCta.
  Timeline<C> timeline{C::kConsumerWarpgroups, Timeline<C>::first_row(threadIdx.x == 0 && blockIdx.x == kTimelineCta)};

  __device__ __forceinline__ u32 gathered_full(int group) const {
    const RingSlot<C> slot = RingSlot<C>::at(group / 2);
    return group % 2 == 0 ? smem.k_full(slot.stage) : smem.v_full(slot.stage);
  }

  // Gather: publishes groups up to `last` (exclusive), at most `max_groups` of them, once at most
  // `in_flight` newer ones are still copying. A bounded, unrolled loop: an open one costs the
  // gather's pass three instructions in the producer's registers.
  template <int in_flight, int max_groups> __device__ __forceinline__ void publish_gathered(int last) {
    if (gather_published >= last)
      return;
    cp_async_wait_group<in_flight>();
    fence_proxy_async_shared(); // the copies, before the consumers' wgmma reads them
#pragma unroll
    for (int i = 0; i < max_groups; ++i)
      if (gather_published + i < last)
        mbarrier_arrive(gathered_full(gather_published + i));
    gather_published = last;
  }

  // Gather: after group `group` is committed, every group but the latest kGatherGroupsInFlight:
  // one more than the call before (none after a publish_all_gathered).
  __device__ __forceinline__ void publish_gathered_behind(int group) {
    publish_gathered<kGatherGroupsInFlight, 1>(group + 1 - kGatherGroupsInFlight);
  }

  // Gather: every group issued (`issued` of them; at most kGatherGroupsInFlight unpublished, as
  // each issue is followed by publish_gathered_behind), before a wait that would block and at the end.
  __device__ __forceinline__ void publish_all_gathered(int issued) {
    publish_gathered<0, kGatherGroupsInFlight>(issued);
  }

  // Waits for the phase of `bar` with parity `parity`; a gather first publishes the `issued` groups
  // if the wait would block.
  __device__ __forceinline__ void wait_for_room(u32 bar, u32 parity, int issued) {
    if (kGather && !kGatherNoinc && !mbarrier_test_wait_parity(bar, parity))
      publish_all_gathered(issued);
    mbarrier_wait_parity(bar, parity);
  }

  // Gather: block n of tile t through the block table by cp.async (see the file comment).
  __device__ __forceinline__ void gather_kv(const fj_tensor_ref &ref, i64 page_stride, int dim, int group,
                                            u32 empty_bar, u32 phase, u32 dst, int panels, const Tile &t, int n) {
    const fj_paged_kv &paged = params.base.paged;
    const int thread = static_cast<int>(threadIdx.x);
    const int chunk = thread % kGatherChunksPerRow;
    const i32 *pages = paged.block_table + static_cast<i64>(t.batch) * paged.max_pages_per_seq;
    const u8 *head =
        static_cast<const u8 *>(ref.ptr) + (t.kv_head * ref.head_stride + chunk * kElemsPerChunk) * kElemBytes;
    // The block's page numbers into L1 while the slot is still being read: the loop below then
    // looks each up at L1 latency, one row a pass (unrolled, the addresses would not fit the
    // producer's registers).
    const int first_page = n * C::kBlockN / C::kPageSize;
    const int last_page = (min((n + 1) * C::kBlockN, t.seqlen_k) - 1) / C::kPageSize;
    if (first_page + thread * kPagesPerLine <= last_page + kPagesPerLine - 1)
      prefetch_global_l1(pages + min(first_page + thread * kPagesPerLine, last_page));
    wait_for_room(empty_bar, phase ^ 1, group);
    const i64 page_bytes = page_stride * kElemBytes;
    const i64 row_bytes = ref.row_stride * kElemBytes;
    if (fits_i32(page_bytes) && fits_i32(row_bytes))
      gather_rows<i32>(head, static_cast<i32>(page_bytes), static_cast<i32>(row_bytes), pages, chunk, dim, dst, panels,
                       t, n);
    else
      gather_rows<i64>(head, page_bytes, row_bytes, pages, chunk, dim, dst, panels, t, n);
    cp_async_commit_group();
  }

  // Gather: the copies of block n's rows, `chunk` of each row a thread. A thread's rows lie whole
  // swizzle atoms apart, so its chunk's place in the atom, and the XOR of the swizzle, stay the
  // same from pass to pass. Stride is i32 wherever the byte strides fit one (a row's address is then
  // one IMAD.WIDE from its page number; 64-bit strides cost four).
  template <class Stride>
  __device__ __forceinline__ void gather_rows(const u8 *head, Stride page_bytes, Stride row_bytes, const i32 *pages,
                                              int chunk, int dim, u32 dst, int panels, const Tile &t, int n) {
    static_assert(kGatherRowsPerPass % kSwizzleAtomRows<C> == 0,
                  "gather: a thread's rows keep their place in the atom");
    const int first_row = static_cast<int>(threadIdx.x) / kGatherChunksPerRow;
    const int block_end = (n + 1) * C::kBlockN;
    u32 dst_chunk = swizzled_address<C>(dst, first_row, chunk);
#pragma unroll 1
    for (int key = n * C::kBlockN + first_row; key < block_end;
         key += kGatherRowsPerPass, dst_chunk += kGatherRowsPerPass * C::kSwizzleBytes) {
      const bool in_sequence = key < t.seqlen_k;
      // Past the end: page 0, whose rows are a valid address for the copies that read nothing.
      // Unsigned, the divisions by the page size are a multiply and a shift; the index back in an int
      // lets the compiler step the table's address from pass to pass.
      const u32 slot = static_cast<u32>(key);
      const i32 page = in_sequence ? ld_global_nc_s32(pages + static_cast<i32>(slot / C::kPageSize)) : 0;
      const u8 *src = advance_to_paged_row<C::kPageSize>(head, page, slot, page_bytes, row_bytes);
      for (int panel = 0; panel < panels; ++panel) {
        const bool copy = in_sequence && panel * C::kPanelCols + chunk * kElemsPerChunk < dim;
        cp_async_cg_16(dst_chunk + panel * C::kSmemPanelBytesKV, src + panel * C::kPanelCols * kElemBytes,
                       copy ? kCpAsyncBytes : 0);
      }
    }
  }

  __device__ __forceinline__ void load_kv(const fj_tensor_map &map, u32 full_bar, u32 empty_bar, u32 phase,
                                          u32 tx_bytes, u32 dst, int panels, int col_step, const Tile &t, int n) {
    mbarrier_wait_parity(empty_bar, phase ^ 1);
    mbarrier_arrive_expect_tx(full_bar, tx_bytes); // the whole block: this CTA's rows and the partner's
    const int rank_rows = pair_rank<C>() * C::kKVRowsPerCta;
    const int row = t.k_row0 + n * C::kBlockN + rank_rows;
    const u32 dst_rows = dst + rank_rows * C::kSwizzleBytes;
    const u64 keep_policy = l2_policy_evict_last(); // K, V: re-read by every m-block of the head
    for (int panel = 0; panel < panels; ++panel) {
      if constexpr (C::kClusterM == 1)
        tma_load_4d(dst_rows + panel * C::kSmemPanelBytesKV, &map, full_bar, panel * col_step, row, t.kv_head,
                    t.batch_coord, keep_policy);
      else
        tma_load_4d_multicast(dst_rows + panel * C::kSmemPanelBytesKV, &map, full_bar, panel * col_step, row, t.kv_head,
                              t.batch_coord, kPairMask, keep_policy);
    }
  }

  // Paged KV: block n of tile t through the block table, by the whole warp (see the file comment).
  // V of a block that ends inside it lands on v_landed; finish_first_v completes it.
  __device__ __forceinline__ void load_kv_paged(const fj_tensor_map &map, u32 full_bar, u32 empty_bar, u32 phase,
                                                u32 dst, int panels, const Tile &t, int n, bool is_v) {
    const fj_paged_kv &paged = params.base.paged;
    const int lane = lane_id();
    const int key0 = n * C::kBlockN;
    const int valid = min(C::kBlockN, t.seqlen_k - key0);
    const int boxes = (valid + C::kPagedBoxRows - 1) / C::kPagedBoxRows;
    const int key = key0 + lane * C::kPagedBoxRows;
    const i32 page =
        lane < boxes ? ld_global_nc_s32(paged.block_table + (i64)t.batch * paged.max_pages_per_seq + key / C::kPageSize)
                     : 0;
    const u32 landing_bar = is_v && valid < C::kBlockN ? smem.v_landed() : full_bar;
    mbarrier_wait_parity(empty_bar, phase ^ 1);
    __syncwarp(); // no lane runs a phase ahead: a lane left behind would wait on an aliased parity
    if (lane == 0)
      mbarrier_arrive_expect_tx(landing_bar, boxes * panels * C::kPagedBoxRows * C::kSwizzleBytes);
    if (lane < boxes) {
      const u64 keep_policy = l2_policy_evict_last(); // K, V: re-read by every m-block of the head
      const u32 dst_box = dst + lane * C::kPagedBoxRows * C::kSwizzleBytes;
      for (int panel = 0; panel < panels; ++panel)
        tma_load_4d(dst_box + panel * C::kSmemPanelBytesKV, &map, landing_bar, panel * C::kPanelCols,
                    key % C::kPageSize, t.kv_head, page, keep_policy);
    }
  }

  // Paged KV: V of a tile's first block (the sequence's last, the only one that can end inside it;
  // `valid` keys of it, issued as the CTA's block `block_index`), once landed: the rows past the end
  // zeroed, then the consumers' full barrier completed (no bytes). Called after the next K is
  // issued (this tile's second block's, or for a one-block tile the next tile's first), so that
  // load does not queue behind the wait.
  __device__ __forceinline__ void finish_first_v(int valid, int block_index) {
    if (valid >= C::kBlockN)
      return; // landed on the full barrier itself
    const RingSlot<C> slot = RingSlot<C>::at(block_index);
    const int lane = lane_id();
    mbarrier_wait_parity(smem.v_landed(), landed_parity);
    landed_parity ^= 1;
    const u32 zeros[4] = {0, 0, 0, 0};
    const u32 rows_past = smem.v_stage(slot.stage) + valid * C::kSwizzleBytes;
    const int chunks = (C::kBlockN - valid) * kZeroChunksPerRow;
    for (int panel = 0; panel < C::kPanelsV; ++panel)
      for (int c = lane; c < chunks; c += kWarpSize)
        st_shared_v4_b32(rows_past + panel * C::kSmemPanelBytesKV + c * kZeroChunkBytes, zeros);
    fence_proxy_async_shared(); // the zeros, before the consumers' wgmma reads them
    __syncwarp();
    if (lane == 0)
      mbarrier_arrive(smem.v_full(slot.stage));
  }

  __device__ __forceinline__ void load_k(const Tile &t, int n, int block_index) {
    const RingSlot<C> slot = RingSlot<C>::at(block_index);
    if constexpr (kGather) {
      gather_kv(params.base.k, params.base.paged.page_stride_k, C::kHeadDimQK, 2 * block_index,
                smem.k_empty(slot.stage), slot.phase, smem.k_panel(slot.stage, 0), C::kPanelsQK, t, n);
      if constexpr (kGatherNoinc)
        cp_async_mbarrier_arrive_noinc(smem.k_full(slot.stage));
      else
        publish_gathered_behind(2 * block_index);
    } else if constexpr (kPaged)
      load_kv_paged(params.tma_k, smem.k_full(slot.stage), smem.k_empty(slot.stage), slot.phase,
                    smem.k_panel(slot.stage, 0), C::kPanelsQK, t, n, false);
    else {
      timeline.mark_load(block_index, kMarkKStart);
      load_kv(params.tma_k, smem.k_full(slot.stage), smem.k_empty(slot.stage), slot.phase, C::kTxBytesK,
              smem.k_panel(slot.stage, 0), C::kPanelsQK, C::kPanelCols, t, n);
      timeline.mark_load(block_index, kMarkKIssued);
    }
  }

  __device__ __forceinline__ void load_v(const Tile &t, int n, int block_index) {
    const RingSlot<C> slot = RingSlot<C>::at(block_index);
    if constexpr (kGather) {
      gather_kv(params.base.v, params.base.paged.page_stride_v, C::kHeadDimV, 2 * block_index + 1,
                smem.v_empty(slot.stage), slot.phase, smem.v_stage(slot.stage), C::kPanelsV, t, n);
      if constexpr (kGatherNoinc)
        cp_async_mbarrier_arrive_noinc(smem.v_full(slot.stage));
      else
        publish_gathered_behind(2 * block_index + 1);
    } else if constexpr (kPaged)
      load_kv_paged(params.tma_v, smem.v_full(slot.stage), smem.v_empty(slot.stage), slot.phase,
                    smem.v_stage(slot.stage), C::kPanelsV, t, n, true);
    else {
      timeline.mark_load(block_index, kMarkVStart);
      load_kv(params.tma_v, smem.v_full(slot.stage), smem.v_empty(slot.stage), slot.phase, C::kTxBytesV,
              smem.v_stage(slot.stage), C::kPanelsV, C::kPanelCols, t, n);
      timeline.mark_load(block_index, kMarkVIssued);
    }
  }

  // `block_index`: the ring position of the tile's first block, whose K is issued.
  __device__ __forceinline__ void load_q(const Tile &t, u32 tile_parity, int block_index) {
    constexpr int kBoxesPerPanel = C::kBlockM / C::kTmaBoxRows;
    wait_for_room(smem.q_empty(), tile_parity ^ 1, 2 * block_index + 1);
    if constexpr (kPagedBoxes)
      __syncwarp(); // as after a slot's wait: no lane left a phase behind
    if (kThreads > 1 && threadIdx.x != 0)
      return; // one thread loads Q
    mbarrier_arrive_expect_tx(smem.q_full(), C::kTxBytesQ);
    const int row = t.q_row0 + t.m_block * C::kBlockM;
    const u64 stream_policy = l2_policy_evict_first(); // Q: read once
    for (int panel = 0; panel < C::kPanelsQK; ++panel)
      for (int box = 0; box < kBoxesPerPanel; ++box)
        tma_load_4d(smem.q_panel(panel) + box * C::kTmaBoxRows * C::kSwizzleBytes, &params.tma_q, smem.q_full(),
                    panel * C::kPanelCols, row + box * C::kTmaBoxRows, t.head, t.batch_coord, stream_policy);
  }

  // Q and the K/V blocks [n_min, n_max) of tile t, from the last block down.
  __device__ __forceinline__ void load_tile(const Tile &t, int &block_index, u32 &tile_parity) {
    if (!t.has_rows || t.n_max <= t.n_min)
      return; // the consumers write O = 0 / LSE = -inf without touching smem
    int n = t.n_max - 1;
    const int first_block_index = block_index;
    const int first_valid = t.seqlen_k - n * C::kBlockN; // keys of the first block (paged KV)
    load_k(t, n, block_index);
    if constexpr (kPagedBoxes)
      finish_deferred_v(); // the previous one-block tile's V, now that this K is on its way
    load_q(t, tile_parity, block_index);
    load_v(t, n, block_index);
    ++block_index;
    for (--n; n >= t.n_min; --n, ++block_index) {
      load_k(t, n, block_index);
      if (kPagedBoxes && n == t.n_max - 2)
        finish_first_v(first_valid, first_block_index);
      load_v(t, n, block_index);
    }
    if (kPagedBoxes && t.n_min == t.n_max - 1) { // a one-block tile: no K of its own to issue first
      deferred_v_valid = first_valid;
      deferred_v_block = first_block_index;
    }
    tile_parity ^= 1;
  }

  // Paged KV: finishes a one-block tile's V left for the next tile's first K (or the walk's end).
  __device__ __forceinline__ void finish_deferred_v() {
    finish_first_v(deferred_v_valid, deferred_v_block);
    deferred_v_valid = C::kBlockN;
  }

  __device__ void run() {
    int block_index = 0; // KV blocks issued by this CTA so far (ring position)
    u32 tile_parity = 0; // flips per tile that loads Q
    if constexpr (C::kDynamicTiles) {
      const TileFeed<C> feed{params, smem};
      for (int k = 0, index = feed.first();; ++k) {
        const bool last = index >= params.num_tiles;
        const int next = last ? index : feed.after(k); // drawn before this tile's loads, used after them
        feed.publish(k, last ? params.num_tiles : index);
        if (last)
          break;
        load_tile(decode_tile<C>(params, index), block_index, tile_parity);
        index = next;
      }
    } else if constexpr (C::kTailSplit) {
      const int items = walk_items<C>(params);
      for (int k = 0; k < items; ++k) {
        Tile t;
        if (walk_item<C>(params, k, &t))
          load_tile(t, block_index, tile_parity);
      }
    } else {
      for (int wave = 0, index = snake_tile<C>(0); wave * walkers<C>() < params.num_tiles;
           index = snake_tile<C>(++wave))
        if (index < params.num_tiles)
          load_tile(decode_tile<C>(params, index), block_index, tile_parity);
    }
    if constexpr (kGatherNoinc)
      cp_async_wait_all(); // no thread leaves with copies in flight
    else if constexpr (kGather)
      publish_all_gathered(2 * block_index);
    if constexpr (kPagedBoxes)
      finish_deferred_v();
  }
};

} // namespace fj::fa3
