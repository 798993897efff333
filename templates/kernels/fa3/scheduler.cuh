// Persistent tile scheduler of the fa3 kernel. The grid is sized to the SM count; the walkers are
// CTAs, or CTA pairs (clusters of C::kClusterM along x) that share every K/V block. In wave k walker
// w takes work unit k * walkers + w on even waves and k * walkers + (walkers - 1 - w) on odd ones
// (a snake), so with units sorted by cost every walker gets a mix of heavy and light ones. A unit is
// kClusterM adjacent m-blocks of one (batch, head); the CTA of rank r in its cluster takes m-block
// unit * kClusterM + r. Producer and consumers walk the same sequence and decode the same tile: no
// hand-off needed. Order: sections of `heads_per_section` (batch, head) pairs whose K/V fit in L2;
// inside a section the m-block is the slow index, and under causal masking it runs from the last
// (heaviest: sees the most keys) to the first.
#pragma once

#include "kernels/fa3/smem.cuh"
#include "params_fa3.h"
#include "prim/atomic.cuh"
#include "prim/cluster.cuh"
#include "prim/mbarrier.cuh"
#include "prim/st_shared.cuh"
#include "prim/types.cuh"

namespace fj::fa3 {

// Walkers per wave: the clusters of the grid (CTAs without clusters).
template <class C> __device__ __forceinline__ int walkers() {
  if constexpr (C::kClusterM == 1)
    return static_cast<int>(gridDim.x);
  else
    return static_cast<int>(cluster_count_x());
}

// This CTA's rank in its cluster.
template <class C> __device__ __forceinline__ int pair_rank() {
  if constexpr (C::kClusterM == 1)
    return 0;
  else
    return static_cast<int>(cluster_ctarank());
}

// This CTA's walker: its cluster (its own index without clusters).
template <class C> __device__ __forceinline__ int walker_index() {
  return C::kClusterM == 1 ? static_cast<int>(blockIdx.x) : static_cast<int>(cluster_id_x());
}

// Work unit of wave `wave` for this CTA's walker (may be >= num_tiles on the last wave).
template <class C> __device__ __forceinline__ int snake_tile(int wave) {
  const int walker = walker_index<C>();
  const int lane_in_wave = (wave & 1) ? walkers<C>() - 1 - walker : walker;
  return wave * walkers<C>() + lane_in_wave;
}

// kDynamicTiles: tiles handed out as CTAs finish, not by the snake. Walker w starts on tile w; its
// producer takes each further tile from a counter in the workspace (walkers + the counter's old
// value), one tile ahead of its loads, and hands every tile to its consumers through a ring of
// kTileSlots indices in shared memory (a full and an empty mbarrier per slot); an index past the
// last tile ends both walks. So a walker that drew light tiles takes more of them, whatever the
// order: a causal walk can keep its L2 sections small (few pairs' K/V live at once) without the
// snake's imbalance. Counting: the walkers whose first tile exists each draw until they get an
// index past the end, so the counter's draws number num_tiles in all, whatever the grid; the one
// that draws num_tiles - 1 is the last and sets it back to zero for the next launch. Without a
// counter (no workspace) the producer hands out the snake's tiles through the same ring.
template <class C> struct TileFeed {
  const fj_fa3_params &params;
  const Smem<C> &smem;

  // Producer: the walk's first tile.
  __device__ __forceinline__ int first() const { return walker_index<C>(); }

  // Producer: the tile after the k-th one (k counted from 0), num_tiles when the walk is over.
  __device__ __forceinline__ int after(int k) const {
    if (params.tile_counter == nullptr)
      return (k + 1) * walkers<C>() < params.num_tiles ? min(snake_tile<C>(k + 1), params.num_tiles) : params.num_tiles;
    const int drawn = atom_add_relaxed_gpu_s32(params.tile_counter, 1);
    if (drawn == params.num_tiles - 1)
      st_relaxed_gpu_s32(params.tile_counter, 0);
    return min(walkers<C>() + drawn, params.num_tiles);
  }

  // Producer: the k-th tile goes to the consumers once they have read the slot's previous index.
  __device__ __forceinline__ void publish(int k, int index) const {
    const int slot = k % C::kTileSlots;
    mbarrier_wait_parity(smem.tile_empty(slot), static_cast<u32>(((k / C::kTileSlots) & 1) ^ 1));
    st_shared_b32(smem.tile_index(slot), static_cast<u32>(index));
    mbarrier_arrive(smem.tile_full(slot));
  }

  // Consumers (every thread): the k-th tile's index; the slot is free again once all have read it.
  __device__ __forceinline__ int receive(int k) const {
    const int slot = k % C::kTileSlots;
    mbarrier_wait_parity(smem.tile_full(slot), static_cast<u32>((k / C::kTileSlots) & 1));
    const int index = static_cast<int>(ld_shared_b32(smem.tile_index(slot)));
    mbarrier_arrive(smem.tile_empty(slot));
    return index;
  }
};

// Units walked whole, wave by wave: all of them, or (kTailSplit) those before the tail.
template <class C> __device__ __forceinline__ int whole_units(const fj_fa3_params &params) {
  if constexpr (C::kTailSplit)
    return params.tail_units > 0 ? params.tail_first_unit : params.num_tiles;
  else
    return params.num_tiles;
}

struct Tile {
  int batch, head, kv_head, m_block;
  int seqlen_q, seqlen_k;
  int q_row0, k_row0; // first row of this sequence in the TMA row coordinate (varlen: packed; paged K/V: 0)
  int batch_coord;    // TMA batch coordinate of Q/O and unpaged K/V (0 for varlen: one packed "batch")
  int n_min, n_max;   // KV blocks [n_min, n_max) hold a visible key; walked from n_max - 1 down
  bool has_rows;      // m_block starts inside the sequence, or its pair partner needs this CTA's
                      // K/V loads and releases (then its Q rows are TMA's zeros past the end and
                      // its O store is clipped)
};

// Key columns visible from query row `row` lie in [row + offset - left, row + offset + right].
struct Window {
  int offset; // seqlen_k - seqlen_q (bottom-right alignment)
  int left, right;
  bool has_left, has_right;
};

template <class C>
__device__ __forceinline__ Window make_window(const fj_attention_params &p, int seqlen_q, int seqlen_k) {
  Window w;
  w.offset = seqlen_k - seqlen_q;
  w.has_right = C::kCausal || (C::kLocal && p.window_right >= 0);
  w.right = C::kCausal ? 0 : p.window_right; // causal = window (left, 0)
  w.has_left = C::kLocal && p.window_left >= 0;
  w.left = p.window_left;
  return w;
}

template <class C> __device__ __forceinline__ Tile decode_tile(const fj_fa3_params &params, int index) {
  const fj_attention_params &p = params.base;
  const int m_blocks = p.num_m_blocks;
  const int m_units = (m_blocks + C::kClusterM - 1) / C::kClusterM;
  const int pairs = p.batch * p.heads_q;
  const int section_pairs = params.heads_per_section;
  const int section = index / (m_units * section_pairs);
  const int rest = index - section * m_units * section_pairs;
  const int pairs_here = min(section_pairs, pairs - section * section_pairs);
  const int m_order = rest / pairs_here;
  const int pair = section * section_pairs + (rest - m_order * pairs_here);

  Tile t;
  t.batch = pair / p.heads_q;
  t.head = pair - t.batch * p.heads_q;
  t.kv_head = t.head / p.group;
  t.m_block = (C::kCausal ? m_units - 1 - m_order : m_order) * C::kClusterM + pair_rank<C>();
  if constexpr (C::kVarlen) {
    t.q_row0 = p.maybe_cu_seqlens_q[t.batch];
    t.seqlen_q = p.maybe_cu_seqlens_q[t.batch + 1] - t.q_row0;
    t.batch_coord = 0;
  } else {
    t.q_row0 = 0;
    t.seqlen_q = p.seqlen_q;
    t.batch_coord = t.batch;
  }
  if constexpr (C::kPageSize > 0) { // keys through the block table, rows counted from the sequence's first
    t.k_row0 = 0;
    t.seqlen_k = p.maybe_seqlens_k[t.batch];
  } else if constexpr (C::kVarlen) {
    t.k_row0 = p.maybe_cu_seqlens_k[t.batch];
    t.seqlen_k = p.maybe_cu_seqlens_k[t.batch + 1] - t.k_row0;
  } else {
    t.k_row0 = 0;
    t.seqlen_k = p.seqlen_k;
  }
  const int row_lo = t.m_block * C::kBlockM;
  t.has_rows = C::kClusterM > 1 || row_lo < t.seqlen_q;
  const int row_hi = min(row_lo + C::kBlockM, t.seqlen_q) - 1;
  const Window w = make_window<C>(p, t.seqlen_q, t.seqlen_k);
  t.n_max = (t.seqlen_k + C::kBlockN - 1) / C::kBlockN;
  t.n_min = 0;
  if (w.has_right) {
    const int last_col = row_hi + w.offset + w.right; // highest visible column of the tile
    t.n_max = min(t.n_max, last_col < 0 ? 0 : last_col / C::kBlockN + 1);
  }
  if (w.has_left) {
    const int first_col = row_lo + w.offset - w.left;
    t.n_min = first_col <= 0 ? 0 : first_col / C::kBlockN;
  }
  return t;
}

// Tail split (kTailSplit): the tail's units laid end to end are one run of key blocks, cut into
// equal shares, one per walker: this walker's share is blocks [lo, hi) of that run. Producer and
// consumers take the same pieces in the same order.
struct TailShare {
  int lo, hi;
  int first_unit, last_unit; // tail units (relative to tail_first_unit) this share touches
};

template <class C> __device__ __forceinline__ TailShare tail_share(const fj_fa3_params &params) {
  TailShare share{0, 0, 0, -1}; // no tail: no pieces
  if (params.tail_units > 0) {
    const int blocks = params.tail_units * params.tail_blocks_per_unit;
    share.lo = min(walker_index<C>() * params.tail_blocks_per_walker, blocks);
    share.hi = min(share.lo + params.tail_blocks_per_walker, blocks);
    share.first_unit = share.lo / params.tail_blocks_per_unit;
    share.last_unit = share.hi > share.lo ? (share.hi - 1) / params.tail_blocks_per_unit : share.first_unit - 1;
  }
  return share;
}

// Where a piece of a unit stops short of the whole: the walker boundary that cuts it (walker w's
// share starts at boundary w) and the side of it this piece lies on. boundary < 0: the whole unit.
struct TailCut {
  int boundary;
  int side; // 0: the piece ends at the boundary, 1: it starts there
};

// The piece of tail unit `u` in `share`: the unit's key blocks cut to the share.
__device__ __forceinline__ void cut_to_share(const fj_fa3_params &params, const TailShare &share, int u, Tile *t) {
  const int unit_lo = u * params.tail_blocks_per_unit;
  t->n_min = max(share.lo, unit_lo) - unit_lo;
  t->n_max = min(share.hi, unit_lo + params.tail_blocks_per_unit) - unit_lo;
}

// The cut of tile t, from its key blocks alone: every unit of a split walk sees all
// tail_blocks_per_unit of them (the planner allows the split only then), so a tile that starts
// past block 0 is a piece that starts at this walker's boundary, and one that stops short of the
// last block ends at the next walker's. Shares are at least one unit long: one side at most.
// Deriving it keeps nothing more live across the tile.
template <class C> __device__ __forceinline__ TailCut tail_cut(const fj_fa3_params &params, const Tile &t) {
  if (t.n_min > 0)
    return TailCut{walker_index<C>(), 1};
  if (t.n_max < params.tail_blocks_per_unit)
    return TailCut{walker_index<C>() + 1, 0};
  return TailCut{-1, 0};
}

// kTailSplit: the whole walk as one sequence of items, the waves over whole units and then this
// walker's tail pieces, so that producer and consumers each inline their tile code once (two
// copies of the consumer's key loop spill). Each item is decoded from the parameters alone: no
// walk state stays live across a tile.
template <class C> __device__ __forceinline__ int whole_waves(const fj_fa3_params &params) {
  return (whole_units<C>(params) + walkers<C>() - 1) / walkers<C>();
}

template <class C> __device__ __forceinline__ int walk_items(const fj_fa3_params &params) {
  const TailShare share = tail_share<C>(params);
  return whole_waves<C>(params) + share.last_unit - share.first_unit + 1;
}

// Item k: a whole unit's tile (false when that wave has none for this walker) or a tail piece.
// One decode_tile call site for both kinds: each inlined copy costs its integer divisions.
template <class C> __device__ __forceinline__ bool walk_item(const fj_fa3_params &params, int k, Tile *t) {
  const int waves = whole_waves<C>(params);
  const bool whole = k < waves;
  const int index = whole ? snake_tile<C>(k) : params.tail_first_unit + tail_share<C>(params).first_unit + k - waves;
  if (whole && index >= whole_units<C>(params))
    return false;
  *t = decode_tile<C>(params, index);
  if (!whole) // the share again, from the parameters: nothing stays live across the decode
    cut_to_share(params, tail_share<C>(params), index - params.tail_first_unit, t);
  return true;
}

// True when some element of block n may be invisible to some row of the tile: the seqlen_k
// tail, the causal / window diagonal. Only these blocks pay for the element mask.
template <class C> __device__ __forceinline__ bool block_needs_mask(const Tile &t, const Window &w, int n) {
  const int col_lo = n * C::kBlockN;
  const int col_hi = col_lo + C::kBlockN - 1;
  const int row_lo = t.m_block * C::kBlockM;
  const int row_hi = row_lo + C::kBlockM - 1;
  bool mask = col_hi >= t.seqlen_k;
  if (w.has_right)
    mask = mask || col_hi > row_lo + w.offset + w.right;
  if (w.has_left)
    mask = mask || col_lo < row_hi + w.offset - w.left;
  return mask;
}

} // namespace fj::fa3
