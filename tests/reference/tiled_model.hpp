// A CPU model of the kernels' tiled algorithm, checked against the float64 reference so that the
// pieces the kernels mirror are known to be right before any GPU runs them:
//   - which key blocks a query tile visits (block skipping for causal / sliding window),
//   - which blocks need the per-element mask,
//   - online softmax over key blocks (running max and sum, rescale, fully masked blocks and rows),
//   - split-K: how key blocks are divided among splits, partial (O, LSE) states and their merge,
//   - the paged gather through a block table,
//   - split-K decode as decode_splitk.cuh runs a schedule: pieces of (sequence, kv head, m block)
//     units that start at any key, their tiles counted from that key.
// Layouts are those of reference.hpp.
#pragma once

#include "tests/reference/reference.hpp"

#include <span>
#include <vector>

namespace flashjit::ref {

struct TileShape {
  int block_m = 64; // query rows per tile
  int block_n = 64; // key rows per block
};

// Half-open range of block indices [begin, end).
struct BlockRange {
  int begin = 0;
  int end = 0;
  bool empty() const { return begin >= end; }
  int size() const { return empty() ? 0 : end - begin; }
  bool operator==(const BlockRange &) const = default;
};

// ceil(length / block): blocks covering `length` rows.
int num_blocks(int length, int block);

// Key blocks query tile `m_block` must visit: exactly the blocks holding at least one key visible to
// at least one of its rows (< seqlen_q). Empty when no row of the tile sees any key. The visible keys
// of a row are one interval whose ends never decrease with the row, so the first row fixes the start
// and the last row the end:
//   diagonal(i) = i + seqlen_k - seqlen_q
//   first key   = window_left >= 0 ? max(0, diagonal(first row) - window_left) : 0
//   end key     = min(seqlen_k, causal ? diagonal(last row) + 1, window_right >= 0 ? diagonal(last row) + window_right
//   + 1) blocks      = [first key / block_n, ceil(end key / block_n))
BlockRange key_block_range(const Mask &mask, int m_block, TileShape tile, int seqlen_q, int seqlen_k);

// False when every key slot of block (m_block, n_block) is visible to every row (< seqlen_q) of the
// tile, so the kernel may skip the per-element mask there; true for blocks that straddle seqlen_k,
// the causal diagonal or a window edge.
bool block_needs_mask(const Mask &mask, int m_block, int n_block, TileShape tile, int seqlen_q, int seqlen_k);

// Split-K: the key blocks of a sequence, [0, num_key_blocks), are cut into `num_splits` equal runs of
// ceil(num_key_blocks / num_splits) blocks; split `split` visits its run intersected with `tile_range`.
// A split may be empty; it then contributes O = 0 and LSE = -inf.
BlockRange split_block_range(BlockRange tile_range, int num_key_blocks, int num_splits, int split);

enum class Accum { fp32, fp64 };

struct TiledOptions {
  TileShape tile;
  Accum accum = Accum::fp32; // fp32 models the kernels; fp64 isolates the algorithm from rounding
};

// A partial attention state, one row per (query token, query head) in token-major order
// (row = token * heads_q + head), as the combine kernel sees them. O is normalized by the state's own
// softmax sum; LSE is the natural log of that sum (with the max added back), -inf when the state saw no key.
struct State {
  int rows = 0;
  int head_dim_v = 0;
  std::vector<double> o;   // [rows, head_dim_v]
  std::vector<double> lse; // [rows]
};

// Where K/V rows come from: the packed contiguous layout, or pages through a block table.
class KvView {
public:
  static KvView contiguous(const Problem &problem, std::span<const float> k, std::span<const float> v);
  static KvView paged(const PagedKv &paged); // `paged` must outlive the view

  const float *k_row(int seq, int key, int head_kv) const;
  const float *v_row(int seq, int key, int head_kv) const;

private:
  std::span<const float> k_, v_;
  std::vector<int32_t> cu_seqlens_k_;
  int heads_kv_ = 0, head_dim_qk_ = 0, head_dim_v_ = 0;
  const PagedKv *paged_ = nullptr;
};

// One split's partial state (split 0 of 1 is the whole attention).
State tiled_partial(const Problem &problem, std::span<const float> q, const KvView &kv, const TiledOptions &options,
                    int split = 0, int num_splits = 1);

// Merges any number of states of the same shape: LSE = log(sum_i exp(LSE_i)), O = sum_i exp(LSE_i - LSE) O_i.
// States with LSE = -inf carry no weight (their O is ignored, even NaN); a row where all are -inf
// gets O = 0 and LSE = -inf. `accum` picks the arithmetic (the combine kernel uses fp32).
State merge_states(std::span<const State> states, Accum accum = Accum::fp32);

// Converts a full state to the reference's Output layout (LSE becomes [heads_q, total_q]).
Output to_output(const Problem &problem, const State &state);

// Conveniences: the whole attention through the tiled model, contiguous or paged KV.
Output tiled_attention(const Problem &problem, std::span<const float> q, std::span<const float> k,
                       std::span<const float> v, const TiledOptions &options);
Output tiled_attention_paged(const Problem &problem, std::span<const float> q, const PagedKv &paged,
                             const TiledOptions &options);
// Split-K end to end: every split's partial state, then their merge.
Output tiled_attention_splitk(const Problem &problem, std::span<const float> q, const KvView &kv,
                              const TiledOptions &options, int num_splits);

// Split-K decode as decode_splitk.cuh runs it. A unit is (sequence, kv head, m block): the query
// heads of one kv head packed as rows (row = token * group + head in group), m block m holding rows
// [m * block_m, (m + 1) * block_m) (tile.block_m). A piece is keys [kv_begin, kv_end) of a unit,
// visited in tiles of tile.block_n keys from kv_begin (the last one partial), every key masked by
// the piece's end and by its row's causal / window range; kv_begin need not sit on a tile or a
// page boundary. Unit numbering is (sequence * heads_kv + kv head) * m_blocks + m block.
struct DecodePiece {
  int unit = 0;
  int kv_begin = 0;
  int kv_end = 0;
};

// One piece's partial state, over every row of the problem (rows of other units: O = 0, LSE = -inf).
State decode_piece(const Problem &problem, std::span<const float> q, const KvView &kv, const TiledOptions &options,
                   int m_blocks, const DecodePiece &piece);

// A whole schedule: a unit with one piece keeps its state (the kernel's direct write of O), a unit
// with several merges their states (merge_states, as the fused merge and fj_decode_combine do).
Output tiled_decode_splitk(const Problem &problem, std::span<const float> q, const KvView &kv,
                           const TiledOptions &options, int m_blocks, std::span<const DecodePiece> pieces);

} // namespace flashjit::ref
