// The CPU model of the tiled algorithm against the float64 reference, and its block arithmetic
// (block ranges, mask predicate, split ranges) against brute force over every coordinate.
#include "tests/reference/tiled_model.hpp"

#include "compiler/splitk_schedule.hpp"
#include "params_decode.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace flashjit::ref {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kFp64Tolerance = 1e-12; // same math, different summation order
constexpr double kFp32Tolerance = 2e-5;  // fp32 accumulation over a few hundred keys

const Mask kMasks[] = {{},           {true, -1, -1}, {false, 3, 2}, {true, 5, -1}, {false, -1, 0}, {false, 0, 0},
                       {true, 0, 7}, {false, 11, -1}};
const TileShape kTiles[] = {{4, 4}, {5, 3}, {3, 8}, {1, 1}, {16, 7}, {8, 16}};

std::string mask_name(const Mask &mask) {
  return std::string(mask.causal ? "causal" : "full") + " window(" + std::to_string(mask.window_left) + "," +
         std::to_string(mask.window_right) + ")";
}

// ---------------------------------------------------------------------------------------------
// Block arithmetic, brute force over every (row, key)

TEST(TiledBlocks, KeyBlockRangeIsExactlyTheBlocksWithVisibleKeys) {
  for (const Mask &mask : kMasks)
    for (const TileShape tile : kTiles)
      for (int sq = 0; sq <= 19; sq += 1)
        for (int sk = 0; sk <= 23; sk += 2)
          for (int m_block = 0; m_block < num_blocks(sq, tile.block_m) + 1; ++m_block) {
            int first = std::numeric_limits<int>::max(), last = -1;
            for (int i = m_block * tile.block_m; i < std::min(sq, (m_block + 1) * tile.block_m); ++i)
              for (int j = 0; j < sk; ++j)
                if (is_visible(mask, i, j, sq, sk)) {
                  first = std::min(first, j / tile.block_n);
                  last = std::max(last, j / tile.block_n);
                }
            const BlockRange expected = last < 0 ? BlockRange{} : BlockRange{first, last + 1};
            const BlockRange range = key_block_range(mask, m_block, tile, sq, sk);
            ASSERT_EQ(range.empty(), expected.empty())
                << mask_name(mask) << " tile " << tile.block_m << "x" << tile.block_n << " sq " << sq << " sk " << sk
                << " m_block " << m_block;
            if (!expected.empty()) {
              ASSERT_EQ(range, expected) << mask_name(mask) << " tile " << tile.block_m << "x" << tile.block_n << " sq "
                                         << sq << " sk " << sk << " m_block " << m_block;
            }
          }
}

TEST(TiledBlocks, BlockNeedsMaskIsExact) {
  for (const Mask &mask : kMasks)
    for (const TileShape tile : kTiles)
      for (int sq = 1; sq <= 17; sq += 2)
        for (int sk = 1; sk <= 21; sk += 2)
          for (int m_block = 0; m_block < num_blocks(sq, tile.block_m); ++m_block)
            for (int n_block = 0; n_block < num_blocks(sk, tile.block_n); ++n_block) {
              bool all_visible = true;
              for (int i = m_block * tile.block_m; i < std::min(sq, (m_block + 1) * tile.block_m); ++i)
                for (int j = n_block * tile.block_n; j < (n_block + 1) * tile.block_n; ++j)
                  all_visible = all_visible && is_visible(mask, i, j, sq, sk);
              ASSERT_EQ(block_needs_mask(mask, m_block, n_block, tile, sq, sk), !all_visible)
                  << mask_name(mask) << " tile " << tile.block_m << "x" << tile.block_n << " sq " << sq << " sk " << sk
                  << " block " << m_block << "," << n_block;
            }
}

TEST(TiledBlocks, SplitRangesPartitionTheTileRange) {
  for (int num_key_blocks = 0; num_key_blocks <= 13; ++num_key_blocks)
    for (int begin = 0; begin <= num_key_blocks; ++begin)
      for (int end = begin; end <= num_key_blocks; ++end)
        for (int num_splits = 1; num_splits <= 9; ++num_splits) {
          std::vector<int> covered(num_key_blocks, 0);
          int previous_end = 0;
          for (int split = 0; split < num_splits; ++split) {
            const BlockRange range = split_block_range({begin, end}, num_key_blocks, num_splits, split);
            if (range.empty())
              continue;
            ASSERT_GE(range.begin, previous_end) << "splits must be ordered and disjoint";
            previous_end = range.end;
            for (int n = range.begin; n < range.end; ++n)
              ++covered[n];
          }
          for (int n = 0; n < num_key_blocks; ++n)
            ASSERT_EQ(covered[n], (n >= begin && n < end) ? 1 : 0)
                << "blocks " << num_key_blocks << " tile [" << begin << "," << end << ") splits " << num_splits;
        }
}

// ---------------------------------------------------------------------------------------------
// The online softmax model against the float64 reference

std::vector<Problem> model_problems() {
  std::vector<Problem> problems;
  auto add = [&](Problem p) { problems.push_back(std::move(p)); };
  add(Problem::dense(2, 37, 53, 2, 2, 32, 16));
  {
    Problem p = Problem::dense(1, 29, 71, 4, 1, 24, 40); // sq < sk, MQA
    p.causal = true;
    add(p);
  }
  {
    Problem p = Problem::dense(1, 45, 19, 6, 2, 16, 16); // sq > sk: rows with no key
    p.causal = true;
    add(p);
  }
  {
    Problem p = Problem::dense(2, 41, 41, 7, 1, 16, 8);
    p.window_left = 9;
    p.window_right = 4;
    add(p);
  }
  {
    Problem p = Problem::dense(1, 23, 60, 8, 1, 16, 16);
    p.causal = true;
    p.window_left = 13;
    p.softcap = 5;
    add(p);
  }
  {
    Problem p;
    p.batch = 5;
    p.seqlens_q = {13, 1, 0, 6, 20};
    p.seqlens_k = {30, 1, 9, 0, 11};
    p.heads_q = 4;
    p.heads_kv = 2;
    p.head_dim_qk = 16;
    p.head_dim_v = 24;
    p.causal = true;
    add(p);
  }
  return problems;
}

void expect_close(const Output &ours, const Output &ref, double tolerance, const std::string &what) {
  ASSERT_EQ(ours.o.size(), ref.o.size()) << what;
  EXPECT_LE(max_abs_diff(ours.o, ref.o), tolerance) << what;
  EXPECT_LE(max_abs_diff(ours.lse, ref.lse), tolerance) << what; // also: -inf exactly where ref has -inf
}

TEST(TiledModel, MatchesReferenceForTilesNotDividingTheLengths) {
  uint64_t seed = 1000;
  for (const Problem &problem : model_problems()) {
    const Inputs in = random_inputs(problem, Dtype::bf16, ++seed);
    const Output ref = attention_f64(problem, in.q, in.k, in.v);
    for (const TileShape tile : {TileShape{16, 7}, TileShape{64, 48}, TileShape{5, 3}, TileShape{128, 128}}) {
      const std::string what =
          problem.describe() + " tile " + std::to_string(tile.block_m) + "x" + std::to_string(tile.block_n);
      expect_close(tiled_attention(problem, in.q, in.k, in.v, {tile, Accum::fp64}), ref, kFp64Tolerance,
                   what + " fp64");
      expect_close(tiled_attention(problem, in.q, in.k, in.v, {tile, Accum::fp32}), ref, kFp32Tolerance,
                   what + " fp32");
    }
  }
}

TEST(TiledModel, Fp32PassesTheRule) {
  const Problem problem = model_problems()[1];
  const Inputs in = random_inputs(problem, Dtype::bf16, 1100);
  const Output ref = attention_f64(problem, in.q, in.k, in.v);
  const Output naive = attention_lowprec(problem, in.q, in.k, in.v, Dtype::bf16);
  const Output model = tiled_attention(problem, in.q, in.k, in.v, {{64, 64}, Accum::fp32});
  const std::vector<float> o(model.o.begin(), model.o.end()), lse(model.lse.begin(), model.lse.end());
  const CheckResult o_check = check_output(o, ref.o, naive.o);
  EXPECT_TRUE(o_check.pass) << o_check.summary;
  const CheckResult lse_check = check_lse(lse, ref.lse, naive.lse);
  EXPECT_TRUE(lse_check.pass) << lse_check.summary;
}

// Logits that grow along the keys far past fp32's exp range: only a correct running-max rescale
// keeps the fp32 model finite and right.
TEST(TiledModel, OnlineRescaleWithGrowingLogits) {
  constexpr int kSeqK = 300, kDim = 16;
  Problem problem = Problem::dense(1, 3, kSeqK, 1, 1, kDim, kDim);
  problem.scale = 1;
  Inputs in = random_inputs(problem, Dtype::bf16, 1200);
  std::fill(in.q.begin(), in.q.end(), 1.0f);
  for (int j = 0; j < kSeqK; ++j) // logit(j) = j / 2 + noise, up to ~150 > log(FLT_MAX) ~ 88.7
    for (int c = 0; c < kDim; ++c)
      in.k[j * kDim + c] = round_to(Dtype::bf16, float(j) / (2 * kDim) + in.k[j * kDim + c] / 64);
  const Output ref = attention_f64(problem, in.q, in.k, in.v);
  ASSERT_GT(*std::max_element(ref.lse.begin(), ref.lse.end()), 100.0);
  const Output model = tiled_attention(problem, in.q, in.k, in.v, {{2, 32}, Accum::fp32});
  // LSE is ~150 here, so its fp32 rounding alone is ~1e-5.
  EXPECT_LE(max_abs_diff(model.o, ref.o), kFp32Tolerance);
  EXPECT_LE(max_abs_diff(model.lse, ref.lse), 1e-4);
}

// ---------------------------------------------------------------------------------------------
// Split-K and the merge of partial states

TEST(TiledModel, SplitKWithOneToSevenSplitsMatchesReference) {
  uint64_t seed = 1300;
  for (const Problem &problem : model_problems()) {
    const Inputs in = random_inputs(problem, Dtype::fp16, ++seed);
    const Output ref = attention_f64(problem, in.q, in.k, in.v);
    const KvView kv = KvView::contiguous(problem, in.k, in.v);
    for (int num_splits = 1; num_splits <= 7; ++num_splits) {
      const std::string what = problem.describe() + " splits " + std::to_string(num_splits);
      // Block 16 leaves some splits empty for the short sequences: their states are all -inf.
      expect_close(tiled_attention_splitk(problem, in.q, kv, {{16, 16}, Accum::fp64}, num_splits), ref, kFp64Tolerance,
                   what + " fp64");
      expect_close(tiled_attention_splitk(problem, in.q, kv, {{16, 16}, Accum::fp32}, num_splits), ref, kFp32Tolerance,
                   what + " fp32");
    }
  }
}

State state_of(int rows, int dv, std::initializer_list<double> lse, double o_value) {
  State state{rows, dv, std::vector<double>(size_t(rows) * dv, o_value), lse};
  return state;
}

TEST(TiledModel, MergeIsRobustToMinusInf) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // Row 0: one real state among empty ones whose O is garbage (NaN): the real one comes back unchanged.
  // Row 1: every state empty: O = 0, LSE = -inf.
  const std::vector<State> states = {state_of(2, 3, {-kInf, -kInf}, nan), state_of(2, 3, {1.5, -kInf}, 0.25),
                                     state_of(2, 3, {-kInf, -kInf}, nan)};
  for (Accum accum : {Accum::fp32, Accum::fp64}) {
    const State merged = merge_states(states, accum);
    EXPECT_EQ(merged.lse[0], 1.5);
    EXPECT_EQ(merged.lse[1], -kInf);
    for (int d = 0; d < 3; ++d) {
      EXPECT_EQ(merged.o[d], 0.25);
      EXPECT_EQ(merged.o[3 + d], 0.0);
    }
  }
}

TEST(TiledModel, MergeMatchesOneStateOverAllKeysAndIsAssociative) {
  Problem problem = Problem::dense(1, 9, 40, 2, 1, 16, 16);
  problem.causal = true;
  const Inputs in = random_inputs(problem, Dtype::bf16, 1400);
  const KvView kv = KvView::contiguous(problem, in.k, in.v);
  const TiledOptions options{{4, 8}, Accum::fp64};
  constexpr int kSplits = 5;
  std::vector<State> parts;
  for (int split = 0; split < kSplits; ++split)
    parts.push_back(tiled_partial(problem, in.q, kv, options, split, kSplits));
  const State all = merge_states(parts, Accum::fp64);
  const State whole = tiled_partial(problem, in.q, kv, options);
  EXPECT_LE(max_abs_diff(all.o, whole.o), kFp64Tolerance);
  EXPECT_LE(max_abs_diff(all.lse, whole.lse), kFp64Tolerance);
  // Merge in two stages (as a ring / context-parallel reduction would) and in reverse order.
  const std::vector<State> head(parts.begin(), parts.begin() + 2), tail(parts.begin() + 2, parts.end());
  const std::vector<State> staged = {merge_states(tail, Accum::fp64), merge_states(head, Accum::fp64)};
  const State two_stage = merge_states(staged, Accum::fp64);
  EXPECT_LE(max_abs_diff(two_stage.o, whole.o), kFp64Tolerance);
  EXPECT_LE(max_abs_diff(two_stage.lse, whole.lse), kFp64Tolerance);
  // A single state merges to itself.
  const State single = merge_states(std::span<const State>(&whole, 1), Accum::fp64);
  EXPECT_LE(max_abs_diff(single.o, whole.o), kFp64Tolerance);
}

// ---------------------------------------------------------------------------------------------
// Paged KV through the block table

TEST(TiledModel, PagedEqualsContiguous) {
  Problem problem;
  problem.batch = 4;
  problem.seqlens_q = {7, 1, 3, 2};
  problem.seqlens_k = {45, 1, 0, 17};
  problem.heads_q = 6;
  problem.heads_kv = 2;
  problem.head_dim_qk = 16;
  problem.head_dim_v = 16;
  problem.causal = true;
  const Inputs in = random_inputs(problem, Dtype::bf16, 1500);
  const TiledOptions options{{8, 16}, Accum::fp32};
  const Output contiguous = tiled_attention(problem, in.q, in.k, in.v, options);
  ASSERT_LE(max_abs_diff(contiguous.o, attention_f64(problem, in.q, in.k, in.v).o), kFp32Tolerance);
  for (int page_size : {1, 16, 7}) {
    // NaN garbage: any read of a slot that holds no key would surface in the output.
    const PagedKv paged = make_paged_kv(problem, in.k, in.v, page_size, 1600 + page_size, PageGarbage::nan);
    const Output out = tiled_attention_paged(problem, in.q, paged, options);
    EXPECT_EQ(out.o, contiguous.o) << "page size " << page_size; // same arithmetic, bit for bit
    EXPECT_EQ(out.lse, contiguous.lse) << "page size " << page_size;
    const Output split = tiled_attention_splitk(problem, in.q, KvView::paged(paged), options, 3);
    EXPECT_LE(max_abs_diff(split.o, contiguous.o), kFp32Tolerance) << "page size " << page_size;
  }
}

// A block table that points at the wrong page must be caught (the paged tests can fail).
TEST(TiledModel, PagedWithWrongTableDiffers) {
  Problem problem = Problem::dense(1, 4, 32, 1, 1, 16, 16);
  const Inputs in = random_inputs(problem, Dtype::bf16, 1700);
  PagedKv paged = make_paged_kv(problem, in.k, in.v, 8, 1701);
  paged.block_table[1] = paged.block_table[0]; // keys 8..15 replaced by a copy of keys 0..7
  const Output out = tiled_attention_paged(problem, in.q, paged, {{4, 8}, Accum::fp64});
  EXPECT_GT(max_abs_diff(out.o, attention_f64(problem, in.q, in.k, in.v).o), 1e-3);
}

// ---------------------------------------------------------------------------------------------
// Split-K decode over the schedules of compiler/splitk_schedule

// The work list of one step, as the kernels read it.
std::vector<DecodePiece> schedule_pieces(const flashjit::SplitKShape &shape, const Problem &problem) {
  flashjit::SplitKLayout layout;
  std::string error;
  EXPECT_TRUE(flashjit::splitk_layout(shape, &layout, &error)) << error;
  std::vector<char> buffer(layout.int_bytes);
  flashjit::SplitKProblem step;
  step.seqlens_k = problem.seqlens_k.data();
  step.batch = problem.batch;
  step.q_len = problem.seqlens_q[0];
  step.window_left = problem.window_left;
  EXPECT_TRUE(flashjit::splitk_schedule(shape, layout, step, buffer.data(), buffer.size(), nullptr, &error)) << error;
  const auto &header = *reinterpret_cast<const fj_decode_header *>(buffer.data() + layout.header_offset);
  const auto *work = reinterpret_cast<const fj_decode_work *>(buffer.data() + layout.work_offset);
  std::vector<DecodePiece> pieces;
  for (int i = 0; i < header.num_work; ++i)
    pieces.push_back({work[i].unit, work[i].kv_begin, work[i].kv_end});
  return pieces;
}

// Schedules balanced by keys cut units mid-tile and mid-page; the model runs every piece from its own
// first key (tiles counted from there, pages looked up per key) and merges the split units. Against
// float64, contiguous and paged (page sizes 1, 16, 48, shuffled block tables, NaN in every slot that
// holds no key); paged equals contiguous bit for bit. The tile-balanced schedule runs too.
TEST(TiledDecode, KeyBalancedSchedulesMatchReference) {
  struct Case {
    std::vector<int> lens;
    int q_len, heads_q, heads_kv;
    bool causal;
    int window_left;
    float softcap;
  };
  const Case cases[] = {
      {{1000, 37, 0, 1, 129, 700}, 1, 8, 2, false, -1, 0}, // GQA 4, lengths 0 and 1
      {{513, 2000, 64}, 4, 8, 2, true, -1, 0},             // q_len 4, causal
      {{900, 333}, 3, 6, 1, true, 100, 0},                 // GQA 6, causal + sliding window
      {{1500}, 1, 2, 2, false, -1, 20},                    // MHA, softcap
      {{777, 778}, 16, 8, 1, true, -1, 0},                 // 128 packed rows: 8 m blocks
  };
  constexpr int kBlockM = 16, kBlockN = 64;
  int pieces_mid_tile = 0, pieces_mid_page = 0;
  uint64_t seed = 1800;
  for (const Case &c : cases) {
    Problem problem;
    problem.batch = static_cast<int>(c.lens.size());
    problem.seqlens_q.assign(problem.batch, c.q_len);
    problem.seqlens_k = c.lens;
    problem.heads_q = c.heads_q;
    problem.heads_kv = c.heads_kv;
    problem.head_dim_qk = 16;
    problem.head_dim_v = 24;
    problem.causal = c.causal;
    problem.window_left = c.window_left;
    problem.softcap = c.softcap;
    const Inputs in = random_inputs(problem, Dtype::bf16, ++seed);
    const Output ref = attention_f64(problem, in.q, in.k, in.v);
    const int m_blocks = (problem.group() * c.q_len + kBlockM - 1) / kBlockM;

    flashjit::SplitKShape shape;
    shape.num_sms = 7;
    shape.ctas_per_sm = 1;
    shape.block_m = kBlockM;
    shape.block_n = kBlockN;
    shape.m_blocks = m_blocks;
    shape.head_dim_v = problem.head_dim_v;
    shape.heads_kv = problem.heads_kv;
    shape.max_batch = problem.batch;
    shape.min_tiles_per_cta = 1;
    shape.key_balance_min_run_tiles = 0; // the short runs here would take whole tiles by default
    flashjit::SplitKShape tiled = shape;
    tiled.split_granule = kBlockN;
    tiled.piece_cost_keys = 0;
    for (const flashjit::SplitKShape &schedule_shape : {shape, tiled}) {
      const std::vector<DecodePiece> pieces = schedule_pieces(schedule_shape, problem);
      const std::string what = problem.describe() + (schedule_shape.split_granule == 1 ? " by keys" : " by tiles");
      for (const DecodePiece &piece : pieces) {
        pieces_mid_tile += piece.kv_begin % kBlockN != 0;
        pieces_mid_page += piece.kv_begin % 16 != 0 && piece.kv_begin % 48 != 0;
      }
      const KvView contiguous = KvView::contiguous(problem, in.k, in.v);
      const TiledOptions fp64{{kBlockM, kBlockN}, Accum::fp64}, fp32{{kBlockM, kBlockN}, Accum::fp32};
      expect_close(tiled_decode_splitk(problem, in.q, contiguous, fp64, m_blocks, pieces), ref, kFp64Tolerance,
                   what + " fp64");
      const Output model = tiled_decode_splitk(problem, in.q, contiguous, fp32, m_blocks, pieces);
      expect_close(model, ref, kFp32Tolerance, what + " fp32");
      for (int page_size : {1, 16, 48}) {
        const PagedKv paged = make_paged_kv(problem, in.k, in.v, page_size, seed * 7 + page_size, PageGarbage::nan);
        const Output out = tiled_decode_splitk(problem, in.q, KvView::paged(paged), fp32, m_blocks, pieces);
        EXPECT_EQ(out.o, model.o) << what << " page " << page_size;
        EXPECT_EQ(out.lse, model.lse) << what << " page " << page_size;
      }
    }
  }
  EXPECT_GT(pieces_mid_tile, 10) << "the schedules must cut units mid-tile for this test to mean anything";
  EXPECT_GT(pieces_mid_page, 10);
}

// A piece's tiles start at its own first key: a piece [37, 170) is 3 tiles of 64 (37, 101, 165),
// and splitting a unit anywhere changes nothing but rounding.
TEST(TiledDecode, PiecesFromAnyKeyMergeToTheWholeUnit) {
  Problem problem = Problem::dense(1, 2, 300, 4, 1, 16, 16);
  problem.causal = true;
  const Inputs in = random_inputs(problem, Dtype::fp16, 1900);
  const Output ref = attention_f64(problem, in.q, in.k, in.v);
  const KvView kv = KvView::contiguous(problem, in.k, in.v);
  const TiledOptions options{{16, 64}, Accum::fp64};
  for (int cut : {1, 37, 63, 64, 65, 170, 299}) {
    const std::vector<DecodePiece> pieces = {{0, 0, cut}, {0, cut, 300}};
    expect_close(tiled_decode_splitk(problem, in.q, kv, options, 1, pieces), ref, kFp64Tolerance,
                 "cut at " + std::to_string(cut));
  }
  const std::vector<DecodePiece> three = {{0, 0, 37}, {0, 37, 170}, {0, 170, 300}};
  expect_close(tiled_decode_splitk(problem, in.q, kv, options, 1, three), ref, kFp64Tolerance, "three pieces");
}

} // namespace
} // namespace flashjit::ref
