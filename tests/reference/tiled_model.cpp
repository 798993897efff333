#include "tests/reference/tiled_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace flashjit::ref {

namespace {

void require(bool condition, const char *message) {
  if (!condition)
    throw std::invalid_argument(message);
}

template <typename Real> constexpr Real kNegInfOf = -std::numeric_limits<Real>::infinity();

// The running state of one query row during the online softmax.
template <typename Real> struct RowState {
  Real max = kNegInfOf<Real>; // running max of the logits seen so far
  Real sum = 0;               // sum of exp(logit - max)
  std::vector<Real> acc;      // sum of exp(logit - max) * V
};

// The scaled (and soft-capped) logit of one query row against one key row.
template <typename Real> Real scaled_logit(const float *q_row, const float *k_row, int dqk, Real scale, Real softcap) {
  Real dot = 0;
  for (int d = 0; d < dqk; ++d)
    dot += Real(q_row[d]) * Real(k_row[d]);
  return softcap > 0 ? softcap * std::tanh(dot * scale / softcap) : dot * scale;
}

// Online softmax: raises the row's running max to cover `block_max`, rescales what was accumulated
// under the old one, and accumulates the block's keys key0, key0 + 1, ... (-inf logits: skipped).
template <typename Real>
void absorb_block(RowState<Real> &row, const std::vector<Real> &logits, Real block_max, const KvView &kv, int seq,
                  int key0, int head_kv, int dv) {
  const Real new_max = std::max(row.max, block_max);
  // While every key so far is masked the max is -inf; subtracting it would give NaN (-inf - -inf),
  // so use 0: every exp() is then exp(-inf) = 0 and nothing is accumulated.
  const Real reference = new_max == kNegInfOf<Real> ? Real(0) : new_max;
  const Real correction = std::exp(row.max - reference);
  row.sum *= correction;
  for (Real &a : row.acc)
    a *= correction;
  for (size_t c = 0; c < logits.size(); ++c) {
    const Real p = std::exp(logits[c] - reference);
    if (p == Real(0))
      continue; // masked slot: its V row may lie past seqlen_k and must not be read
    row.sum += p;
    const float *v_row = kv.v_row(seq, key0 + int(c), head_kv);
    for (int d = 0; d < dv; ++d)
      row.acc[d] += p * Real(v_row[d]);
  }
  row.max = new_max;
}

// Attention of one (sequence, head, query tile) over the key blocks in `blocks`, written into `state`.
template <typename Real>
void tile_attention(const Problem &problem, std::span<const float> q, const KvView &kv, TileShape tile, int seq,
                    int q_begin, int head, int m_block, BlockRange blocks, State &state) {
  const int sq = problem.seqlens_q[seq], sk = problem.seqlens_k[seq];
  const int dqk = problem.head_dim_qk, dv = problem.head_dim_v;
  const int head_kv = problem.kv_head(head);
  const Mask mask = problem.mask();
  const Real scale = Real(problem.softmax_scale());
  const Real softcap = Real(problem.softcap);
  const int row_begin = m_block * tile.block_m;
  const int rows = std::min(tile.block_m, sq - row_begin);

  std::vector<RowState<Real>> row_states(rows);
  for (auto &row : row_states)
    row.acc.assign(dv, Real(0));
  std::vector<Real> logits(tile.block_n);
  for (int n_block = blocks.begin; n_block < blocks.end; ++n_block) {
    const int key_begin = n_block * tile.block_n;
    const bool masked = block_needs_mask(mask, m_block, n_block, tile, sq, sk);
    for (int r = 0; r < rows; ++r) {
      const int i = row_begin + r;
      const float *q_row = &q[(size_t(q_begin + i) * problem.heads_q + head) * dqk];
      // S = Q K^T for the whole block; masked slots (and slots past seqlen_k) become -inf.
      Real block_max = kNegInfOf<Real>;
      for (int c = 0; c < tile.block_n; ++c) {
        const int j = key_begin + c;
        if (masked && !is_visible(mask, i, j, sq, sk)) {
          logits[c] = kNegInfOf<Real>;
          continue;
        }
        logits[c] = scaled_logit(q_row, kv.k_row(seq, j, head_kv), dqk, scale, softcap);
        block_max = std::max(block_max, logits[c]);
      }
      absorb_block(row_states[r], logits, block_max, kv, seq, key_begin, head_kv, dv);
    }
  }
  for (int r = 0; r < rows; ++r) {
    const RowState<Real> &row = row_states[r];
    const size_t out_row = size_t(q_begin + row_begin + r) * problem.heads_q + head;
    if (row.sum == Real(0)) { // no visible key in this tile's range: O = 0, LSE = -inf
      std::fill_n(&state.o[out_row * dv], dv, 0.0);
      state.lse[out_row] = -std::numeric_limits<double>::infinity();
      continue;
    }
    const Real inverse = Real(1) / row.sum;
    for (int d = 0; d < dv; ++d)
      state.o[out_row * dv + d] = double(row.acc[d] * inverse);
    state.lse[out_row] = double(row.max + std::log(row.sum));
  }
}

template <typename Real>
State partial_attention(const Problem &problem, std::span<const float> q, const KvView &kv, const TiledOptions &options,
                        int split, int num_splits) {
  const TileShape tile = options.tile;
  const auto cu_q = problem.cu_seqlens_q();
  State state;
  state.rows = problem.total_q() * problem.heads_q;
  state.head_dim_v = problem.head_dim_v;
  state.o.assign(size_t(state.rows) * state.head_dim_v, 0.0);
  state.lse.assign(state.rows, -std::numeric_limits<double>::infinity());
  for (int b = 0; b < problem.batch; ++b) {
    const int sq = problem.seqlens_q[b], sk = problem.seqlens_k[b];
    for (int head = 0; head < problem.heads_q; ++head)
      for (int m_block = 0; m_block < num_blocks(sq, tile.block_m); ++m_block) {
        const BlockRange tile_range = key_block_range(problem.mask(), m_block, tile, sq, sk);
        const BlockRange blocks = split_block_range(tile_range, num_blocks(sk, tile.block_n), num_splits, split);
        tile_attention<Real>(problem, q, kv, tile, b, cu_q[b], head, m_block, blocks, state);
      }
  }
  return state;
}

template <typename Real> State merge(std::span<const State> states) {
  require(!states.empty(), "merge_states needs at least one state");
  State out;
  out.rows = states.front().rows;
  out.head_dim_v = states.front().head_dim_v;
  for (const State &state : states)
    require(state.rows == out.rows && state.head_dim_v == out.head_dim_v, "merge_states: states differ in shape");
  const int dv = out.head_dim_v;
  out.o.assign(size_t(out.rows) * dv, 0.0);
  out.lse.assign(out.rows, -std::numeric_limits<double>::infinity());
  std::vector<Real> acc(dv);
  for (int r = 0; r < out.rows; ++r) {
    Real max_lse = kNegInfOf<Real>;
    for (const State &state : states)
      max_lse = std::max(max_lse, Real(state.lse[r]));
    if (max_lse == kNegInfOf<Real>)
      continue; // no state saw a key: O = 0, LSE = -inf
    Real sum = 0;
    for (const State &state : states)
      sum += std::exp(Real(state.lse[r]) - max_lse);
    const Real lse = max_lse + std::log(sum);
    std::fill(acc.begin(), acc.end(), Real(0));
    for (const State &state : states) {
      if (Real(state.lse[r]) == kNegInfOf<Real>)
        continue; // weight 0; skipping also keeps an uninitialized (NaN) O out of the sum
      const Real weight = std::exp(Real(state.lse[r]) - lse);
      for (int d = 0; d < dv; ++d)
        acc[d] += weight * Real(state.o[size_t(r) * dv + d]);
    }
    for (int d = 0; d < dv; ++d)
      out.o[size_t(r) * dv + d] = double(acc[d]);
    out.lse[r] = double(lse);
  }
  return out;
}

// decode_piece: the rows of one unit over one piece's keys, in tiles from the piece's first key.
template <typename Real>
State piece_attention(const Problem &problem, std::span<const float> q, const KvView &kv, TileShape tile, int m_blocks,
                      const DecodePiece &piece) {
  const int group = problem.group();
  const int m_block = piece.unit % m_blocks;
  const int head_kv = (piece.unit / m_blocks) % problem.heads_kv;
  const int seq = piece.unit / m_blocks / problem.heads_kv;
  require(seq < problem.batch, "decode_piece: unit out of range");
  const int sq = problem.seqlens_q[seq], sk = problem.seqlens_k[seq];
  require(piece.kv_begin >= 0 && piece.kv_begin <= piece.kv_end && piece.kv_end <= sk,
          "decode_piece: keys outside the sequence");
  const int dqk = problem.head_dim_qk, dv = problem.head_dim_v;
  const Mask mask = problem.mask();
  const Real scale = Real(problem.softmax_scale());
  const Real softcap = Real(problem.softcap);
  const int q_begin = problem.cu_seqlens_q()[seq];

  State state;
  state.rows = problem.total_q() * problem.heads_q;
  state.head_dim_v = dv;
  state.o.assign(size_t(state.rows) * dv, 0.0);
  state.lse.assign(state.rows, -std::numeric_limits<double>::infinity());
  const int first_row = m_block * tile.block_m;
  const int last_row = std::min(group * sq, first_row + tile.block_m);
  const int tiles = num_blocks(piece.kv_end - piece.kv_begin, tile.block_n);
  std::vector<Real> logits(tile.block_n);
  for (int packed = first_row; packed < last_row; ++packed) {
    const int token = packed / group, head = head_kv * group + packed % group;
    const float *q_row = &q[(size_t(q_begin + token) * problem.heads_q + head) * dqk];
    RowState<Real> row;
    row.acc.assign(dv, Real(0));
    for (int t = 0; t < tiles; ++t) {
      const int key0 = piece.kv_begin + t * tile.block_n;
      Real tile_max = kNegInfOf<Real>;
      for (int c = 0; c < tile.block_n; ++c) {
        const int j = key0 + c;
        if (j >= piece.kv_end || !is_visible(mask, token, j, sq, sk)) {
          logits[c] = kNegInfOf<Real>; // past the piece, or masked: never read
          continue;
        }
        logits[c] = scaled_logit(q_row, kv.k_row(seq, j, head_kv), dqk, scale, softcap);
        tile_max = std::max(tile_max, logits[c]);
      }
      absorb_block(row, logits, tile_max, kv, seq, key0, head_kv, dv);
    }
    if (row.sum == Real(0))
      continue; // no visible key in this piece: O = 0, LSE = -inf
    const size_t out_row = size_t(q_begin + token) * problem.heads_q + head;
    for (int d = 0; d < dv; ++d)
      state.o[out_row * dv + d] = double(row.acc[d] / row.sum);
    state.lse[out_row] = double(row.max + std::log(row.sum));
  }
  return state;
}

} // namespace

int num_blocks(int length, int block) {
  return length <= 0 ? 0 : (length + block - 1) / block;
}

BlockRange key_block_range(const Mask &mask, int m_block, TileShape tile, int seqlen_q, int seqlen_k) {
  const int first_row = m_block * tile.block_m;
  if (first_row >= seqlen_q || seqlen_k <= 0)
    return {};
  const int last_row = std::min(seqlen_q, first_row + tile.block_m) - 1;
  const int64_t offset = int64_t(seqlen_k) - seqlen_q; // bottom-right alignment
  const int64_t first_diagonal = first_row + offset, last_diagonal = last_row + offset;
  int64_t key_begin = 0, key_end = seqlen_k;
  if (mask.window_left >= 0)
    key_begin = std::max<int64_t>(0, first_diagonal - mask.window_left);
  if (mask.causal)
    key_end = std::min<int64_t>(key_end, last_diagonal + 1);
  if (mask.window_right >= 0)
    key_end = std::min<int64_t>(key_end, last_diagonal + mask.window_right + 1);
  if (key_begin >= key_end)
    return {};
  return {int(key_begin / tile.block_n), num_blocks(int(key_end), tile.block_n)};
}

bool block_needs_mask(const Mask &mask, int m_block, int n_block, TileShape tile, int seqlen_q, int seqlen_k) {
  const int first_row = m_block * tile.block_m;
  const int last_row = std::min(seqlen_q, first_row + tile.block_m) - 1;
  const int64_t first_key = int64_t(n_block) * tile.block_n, last_key = first_key + tile.block_n - 1;
  if (last_key >= seqlen_k) // the block straddles (or lies past) the end of the keys
    return true;
  const int64_t offset = int64_t(seqlen_k) - seqlen_q;
  const int64_t first_diagonal = first_row + offset, last_diagonal = last_row + offset;
  // The tightest constraints come from the first row (upper edges) and the last row (lower edge).
  if (mask.causal && last_key > first_diagonal)
    return true;
  if (mask.window_right >= 0 && last_key > first_diagonal + mask.window_right)
    return true;
  if (mask.window_left >= 0 && first_key < last_diagonal - mask.window_left)
    return true;
  return false;
}

BlockRange split_block_range(BlockRange tile_range, int num_key_blocks, int num_splits, int split) {
  require(num_splits >= 1 && split >= 0 && split < num_splits, "split_block_range: bad split index");
  const int per_split = num_blocks(num_key_blocks, num_splits);
  const BlockRange run{split * per_split, std::min(num_key_blocks, (split + 1) * per_split)};
  const BlockRange out{std::max(tile_range.begin, run.begin), std::min(tile_range.end, run.end)};
  return out.empty() ? BlockRange{} : out;
}

KvView KvView::contiguous(const Problem &problem, std::span<const float> k, std::span<const float> v) {
  require(k.size() == problem.k_size() && v.size() == problem.v_size(), "KvView: k/v sizes do not match the problem");
  KvView view;
  view.k_ = k;
  view.v_ = v;
  view.cu_seqlens_k_ = problem.cu_seqlens_k();
  view.heads_kv_ = problem.heads_kv;
  view.head_dim_qk_ = problem.head_dim_qk;
  view.head_dim_v_ = problem.head_dim_v;
  return view;
}

KvView KvView::paged(const PagedKv &paged) {
  KvView view;
  view.paged_ = &paged;
  return view;
}

const float *KvView::k_row(int seq, int key, int head_kv) const {
  if (paged_)
    return paged_->k_row(seq, key, head_kv);
  return &k_[(size_t(cu_seqlens_k_[seq] + key) * heads_kv_ + head_kv) * head_dim_qk_];
}

const float *KvView::v_row(int seq, int key, int head_kv) const {
  if (paged_)
    return paged_->v_row(seq, key, head_kv);
  return &v_[(size_t(cu_seqlens_k_[seq] + key) * heads_kv_ + head_kv) * head_dim_v_];
}

State tiled_partial(const Problem &problem, std::span<const float> q, const KvView &kv, const TiledOptions &options,
                    int split, int num_splits) {
  problem.validate();
  require(q.size() == problem.q_size(), "tiled_partial: q size does not match the problem");
  require(options.tile.block_m >= 1 && options.tile.block_n >= 1, "tiled_partial: tile sizes must be >= 1");
  return options.accum == Accum::fp64 ? partial_attention<double>(problem, q, kv, options, split, num_splits)
                                      : partial_attention<float>(problem, q, kv, options, split, num_splits);
}

State merge_states(std::span<const State> states, Accum accum) {
  return accum == Accum::fp64 ? merge<double>(states) : merge<float>(states);
}

Output to_output(const Problem &problem, const State &state) {
  const int total_q = problem.total_q();
  require(state.rows == total_q * problem.heads_q && state.head_dim_v == problem.head_dim_v,
          "to_output: state shape does not match the problem");
  Output out;
  out.o = state.o; // already [total_q, heads_q, head_dim_v]
  out.lse.resize(state.lse.size());
  for (int token = 0; token < total_q; ++token)
    for (int head = 0; head < problem.heads_q; ++head)
      out.lse[size_t(head) * total_q + token] = state.lse[size_t(token) * problem.heads_q + head];
  return out;
}

Output tiled_attention(const Problem &problem, std::span<const float> q, std::span<const float> k,
                       std::span<const float> v, const TiledOptions &options) {
  return to_output(problem, tiled_partial(problem, q, KvView::contiguous(problem, k, v), options));
}

Output tiled_attention_paged(const Problem &problem, std::span<const float> q, const PagedKv &paged,
                             const TiledOptions &options) {
  return to_output(problem, tiled_partial(problem, q, KvView::paged(paged), options));
}

Output tiled_attention_splitk(const Problem &problem, std::span<const float> q, const KvView &kv,
                              const TiledOptions &options, int num_splits) {
  std::vector<State> partials;
  for (int split = 0; split < num_splits; ++split)
    partials.push_back(tiled_partial(problem, q, kv, options, split, num_splits));
  return to_output(problem, merge_states(partials, options.accum));
}

State decode_piece(const Problem &problem, std::span<const float> q, const KvView &kv, const TiledOptions &options,
                   int m_blocks, const DecodePiece &piece) {
  problem.validate();
  require(q.size() == problem.q_size(), "decode_piece: q size does not match the problem");
  require(options.tile.block_m >= 1 && options.tile.block_n >= 1 && m_blocks >= 1, "decode_piece: bad tile shape");
  for (int b = 0; b < problem.batch; ++b)
    require(problem.seqlens_q[b] == problem.seqlens_q[0], "decode_piece: every sequence has the same query length");
  return options.accum == Accum::fp64 ? piece_attention<double>(problem, q, kv, options.tile, m_blocks, piece)
                                      : piece_attention<float>(problem, q, kv, options.tile, m_blocks, piece);
}

Output tiled_decode_splitk(const Problem &problem, std::span<const float> q, const KvView &kv,
                           const TiledOptions &options, int m_blocks, std::span<const DecodePiece> pieces) {
  std::vector<std::vector<State>> states(size_t(problem.batch) * problem.heads_kv * m_blocks);
  for (const DecodePiece &piece : pieces) {
    require(piece.unit >= 0 && size_t(piece.unit) < states.size(), "tiled_decode_splitk: unit out of range");
    states[piece.unit].push_back(decode_piece(problem, q, kv, options, m_blocks, piece));
  }
  State out;
  out.rows = problem.total_q() * problem.heads_q;
  out.head_dim_v = problem.head_dim_v;
  out.o.assign(size_t(out.rows) * out.head_dim_v, 0.0);
  out.lse.assign(out.rows, -std::numeric_limits<double>::infinity());
  for (const std::vector<State> &unit : states) {
    if (unit.empty())
      continue;
    const State merged = unit.size() == 1 ? unit.front() : merge_states(unit, options.accum);
    // Each state holds only its unit's rows; every other row is -inf with O = 0 in all of them.
    for (int r = 0; r < out.rows; ++r) {
      if (merged.lse[r] == -std::numeric_limits<double>::infinity())
        continue;
      out.lse[r] = merged.lse[r];
      std::copy_n(&merged.o[size_t(r) * out.head_dim_v], out.head_dim_v, &out.o[size_t(r) * out.head_dim_v]);
    }
  }
  return to_output(problem, out);
}

} // namespace flashjit::ref
