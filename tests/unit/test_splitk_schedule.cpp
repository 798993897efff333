// The split-K decode schedule (compiler/splitk_schedule): every visible key of every unit is
// covered exactly once, no CTA gets more than its share, the counters and bounds hold, and the
// layout refuses what it cannot hold.
#include "compiler/splitk_schedule.hpp"
#include "params_decode.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace flashjit {
namespace {

struct Decoded {
  fj_decode_header header;
  std::vector<int32_t> slot_begin;
  std::vector<fj_decode_work> work;
  std::vector<fj_decode_merge> merges;
  std::vector<int32_t> state_merge;    // [max_states] (fused merge)
  std::vector<int32_t> merge_counters; // [grid] (fused merge)
};

Decoded decode(const SplitKLayout &layout, const std::vector<char> &buffer) {
  Decoded d;
  d.header = *reinterpret_cast<const fj_decode_header *>(buffer.data() + layout.header_offset);
  const auto *slots = reinterpret_cast<const int32_t *>(buffer.data() + layout.slot_offset);
  d.slot_begin.assign(slots, slots + layout.grid + 1);
  const auto *work = reinterpret_cast<const fj_decode_work *>(buffer.data() + layout.work_offset);
  d.work.assign(work, work + d.header.num_work);
  const auto *merges = reinterpret_cast<const fj_decode_merge *>(buffer.data() + layout.merge_offset);
  d.merges.assign(merges, merges + d.header.num_merges);
  const auto *state_merge = reinterpret_cast<const int32_t *>(buffer.data() + layout.state_merge_offset);
  d.state_merge.assign(state_merge, state_merge + layout.max_states);
  const auto *counters = reinterpret_cast<const int32_t *>(buffer.data() + layout.merge_counter_offset);
  d.merge_counters.assign(counters, counters + layout.grid);
  return d;
}

// A schedule written into a host buffer sized by the shape's layout.
struct Written {
  SplitKLayout layout;
  std::vector<char> buffer;
  SplitKSchedule schedule;
};

// Lays out `shape` and writes the schedule of `problem` into a buffer pre-filled with `fill`.
::testing::AssertionResult write_schedule(const SplitKShape &shape, const SplitKProblem &problem, Written *out,
                                          char fill = 0) {
  std::string error;
  if (!splitk_layout(shape, &out->layout, &error))
    return ::testing::AssertionFailure() << "layout: " << error;
  out->buffer.assign(out->layout.int_bytes, fill);
  if (!splitk_schedule(shape, out->layout, problem, out->buffer.data(), out->buffer.size(), &out->schedule, &error))
    return ::testing::AssertionFailure() << "schedule: " << error;
  return ::testing::AssertionSuccess();
}

// The longest CTA run of a schedule.
struct Runs {
  int64_t keys = 0, tiles = 0; // the most keys / tile iterations in one CTA's run
};

SplitKProblem problem_of(const std::vector<int32_t> &lens, int q_len, int window_left) {
  SplitKProblem problem;
  problem.seqlens_k = lens.data();
  problem.batch = static_cast<int>(lens.size());
  problem.q_len = q_len;
  problem.window_left = window_left;
  return problem;
}

// Checks every invariant the kernels rely on; returns the longest runs.
Runs check_schedule(const SplitKShape &shape, const std::vector<int32_t> &lens, int q_len, int window_left,
                    SplitKSchedule *schedule_out = nullptr) {
  const SplitKProblem problem = problem_of(lens, q_len, window_left);
  constexpr char kGarbage = 0x5A; // the schedule must write every byte the kernels read
  Written written;
  EXPECT_TRUE(write_schedule(shape, problem, &written, kGarbage));
  const SplitKLayout &layout = written.layout;
  const SplitKSchedule &schedule = written.schedule;
  if (schedule_out != nullptr)
    *schedule_out = schedule;
  const Decoded d = decode(layout, written.buffer);

  EXPECT_EQ(d.header.num_work, schedule.num_work);
  EXPECT_LE(d.header.num_work, layout.max_work);
  EXPECT_LE(d.header.num_states, layout.max_states);
  EXPECT_LE(d.header.num_merges, layout.grid);
  EXPECT_EQ(d.slot_begin.front(), 0);
  EXPECT_EQ(d.slot_begin.back(), d.header.num_work);
  for (int c = 0; c < layout.grid; ++c)
    EXPECT_LE(d.slot_begin[c], d.slot_begin[c + 1]);

  // Coverage: for every unit, its pieces cover [lo, hi) exactly once, in order, cut on the granule.
  const int units = problem.batch * shape.heads_kv * shape.m_blocks;
  std::vector<std::vector<fj_decode_work>> pieces(units);
  std::vector<int> unit_lo(units), unit_hi(units);
  int64_t total_keys = 0, total_tiles = 0;
  for (const fj_decode_work &w : d.work) {
    EXPECT_GE(w.unit, 0);
    EXPECT_LT(w.unit, units);
    EXPECT_LE(w.kv_begin, w.kv_end);
    if (w.unit >= 0 && w.unit < units)
      pieces[w.unit].push_back(w);
  }
  std::vector<int> state_used(d.header.num_states, 0);
  for (int u = 0; u < units; ++u) {
    const int b = u / (shape.heads_kv * shape.m_blocks);
    splitk_visible_keys(lens[b], q_len, window_left, &unit_lo[u], &unit_hi[u]);
    total_keys += unit_hi[u] - unit_lo[u];
    total_tiles += (unit_hi[u] - unit_lo[u] + shape.block_n - 1) / shape.block_n;
    EXPECT_FALSE(pieces[u].empty()) << "unit " << u << " has no piece (its O would never be written)";
    if (pieces[u].empty())
      continue;
    int key = unit_lo[u];
    for (const fj_decode_work &w : pieces[u]) {
      EXPECT_EQ(w.kv_begin, key) << "unit " << u;
      EXPECT_EQ((w.kv_begin - unit_lo[u]) % shape.split_granule, 0) << "cuts fall on the granule";
      key = w.kv_end;
    }
    EXPECT_EQ(key, unit_hi[u]) << "unit " << u;
    if (pieces[u].size() == 1) {
      EXPECT_LT(pieces[u][0].state, 0) << "a whole unit writes O directly";
    } else {
      for (const fj_decode_work &w : pieces[u]) {
        EXPECT_LT(w.kv_begin, w.kv_end) << "a split unit has no empty piece (unit " << u << ")";
        EXPECT_GE(w.state, 0);
        EXPECT_LT(w.state, d.header.num_states);
        if (w.state >= 0 && w.state < d.header.num_states)
          ++state_used[w.state];
      }
    }
  }
  EXPECT_EQ(total_keys, schedule.total_keys);
  EXPECT_EQ(total_tiles, schedule.total_tiles);
  for (int used : state_used)
    EXPECT_EQ(used, 1) << "each partial state slot belongs to exactly one piece";

  // Merges: exactly the split units, with their contiguous state ranges.
  int split_units = 0;
  for (int u = 0; u < units; ++u)
    split_units += pieces[u].size() > 1;
  EXPECT_EQ(d.header.num_merges, split_units);
  for (const fj_decode_merge &m : d.merges) {
    EXPECT_GT(m.count, 1);
    const auto &ps = pieces[m.unit];
    EXPECT_EQ(static_cast<int>(ps.size()), m.count);
    if (static_cast<int>(ps.size()) != m.count)
      continue;
    for (int i = 0; i < m.count; ++i)
      EXPECT_EQ(ps[i].state, m.first_state + i);
  }

  // Fused merge: every state maps to the merge whose range holds it, unused slots to -1, and every
  // counter starts at zero.
  for (int state = 0; state < layout.max_states; ++state) {
    const int m = d.state_merge[state];
    if (state >= d.header.num_states) {
      EXPECT_EQ(m, -1) << "state slot " << state << " is unused";
      continue;
    }
    EXPECT_GE(m, 0) << "state " << state;
    EXPECT_LT(m, d.header.num_merges) << "state " << state;
    if (m < 0 || m >= d.header.num_merges)
      continue;
    EXPECT_GE(state, d.merges[m].first_state);
    EXPECT_LT(state, d.merges[m].first_state + d.merges[m].count);
  }
  for (int32_t counter : d.merge_counters)
    EXPECT_EQ(counter, 0);

  // Runs: within both budgets (keys plus the piece charges, tiles), at most
  // fj_decode_states_per_cta split pieces (only the first and the last), and no piece shorter
  // than min_tiles_per_cta cut off the end of a run that already had keys.
  Runs largest;
  const int64_t min_piece = int64_t{shape.min_tiles_per_cta} * shape.block_n;
  for (int c = 0; c < layout.grid; ++c) {
    int64_t keys = 0, tiles = 0, charged = 0;
    int keyed = 0, states = 0;
    for (int i = d.slot_begin[c]; i < d.slot_begin[c + 1]; ++i) {
      const fj_decode_work &w = d.work[i];
      const int64_t n = w.kv_end - w.kv_begin;
      if (n > 0 && keyed++ > 0)
        charged += shape.piece_cost_keys;
      if (w.state >= 0) {
        ++states;
        EXPECT_TRUE(i == d.slot_begin[c] || i == d.slot_begin[c + 1] - 1) << "CTA " << c << ": split piece " << i;
        const bool cut_off_the_end = w.kv_end < unit_hi[w.unit];
        if (cut_off_the_end && keys > 0) {
          EXPECT_GE(n, min_piece) << "CTA " << c << ": a short piece cut off the end of a run with work";
        }
      }
      keys += n;
      tiles += (n + shape.block_n - 1) / shape.block_n;
    }
    EXPECT_LE(states, fj_decode_states_per_cta) << "CTA " << c;
    if (schedule.whole_units)
      EXPECT_LE(keys, schedule.run_limit) << "CTA " << c; // whole units are not charged per piece
    else
      EXPECT_LE(keys + charged, schedule.run_limit) << "CTA " << c;
    EXPECT_LE(tiles, schedule.run_tile_limit) << "CTA " << c;
    largest.keys = std::max(largest.keys, keys);
    largest.tiles = std::max(largest.tiles, tiles);
  }
  EXPECT_EQ(largest.keys, schedule.keys_per_cta);
  EXPECT_EQ(largest.tiles, schedule.tiles_per_cta);
  if (schedule.whole_units) {
    // Nothing split, and the longest run within the excess the shape allows over the balanced share.
    EXPECT_EQ(split_units, 0);
    EXPECT_EQ(d.header.num_states, 0);
    EXPECT_GE(units, layout.grid) << "whole units only when every CTA can hold one";
    const int64_t balanced = std::max<int64_t>((total_tiles + layout.grid - 1) / layout.grid, 1);
    EXPECT_LE(schedule.run_tile_limit, balanced * (100 + shape.whole_units_max_excess_pct) / 100);
    return largest;
  }
  // The budgets start at the shares and grow only a little past them.
  const int64_t tile_share = std::max<int64_t>((total_tiles + layout.grid - 1) / layout.grid, shape.min_tiles_per_cta);
  // (+1: a cut on a granule that does not divide block_n may leave part of a tile unused.)
  EXPECT_LE(schedule.run_tile_limit, tile_share + shape.min_tiles_per_cta + 1)
      << "granule " << shape.split_granule << " cost " << shape.piece_cost_keys << " min " << shape.min_tiles_per_cta
      << " grid " << layout.grid << " units " << units << " keys " << total_keys << " tiles " << total_tiles;
  const int64_t key_share = std::max<int64_t>((total_keys + layout.grid - 1) / layout.grid, min_piece);
  EXPECT_LE(schedule.run_limit, std::max<int64_t>(key_share, schedule.run_tile_limit * shape.block_n) +
                                    (schedule.run_tile_limit - 1) * shape.piece_cost_keys + shape.split_granule);
  return largest;
}

// The tile-balanced schedule of runs 1-9: whole tiles from each unit's first key, no piece charge.
SplitKShape tile_balanced(SplitKShape shape) {
  shape.split_granule = shape.block_n;
  shape.piece_cost_keys = 0;
  return shape;
}

SplitKShape h200_shape(int batch, int heads_kv = 8) {
  SplitKShape shape;
  shape.num_sms = 132;
  shape.ctas_per_sm = 2;
  shape.block_m = 16;
  shape.block_n = 64;
  shape.m_blocks = 1;
  shape.head_dim_v = 128;
  shape.heads_kv = heads_kv;
  shape.max_batch = batch;
  shape.key_balance_min_run_tiles = 0; // the tests below pin the key-balanced partition itself
  shape.whole_units_max_excess_pct = -1;
  return shape;
}

// The four TARGETS shapes (Hkv 8, block_n 64, 264 CTAs). Tile-balanced runs are quantized to whole
// tiles: ceil(4096 / 264) = 16 tiles of 1024 keys at 1 x 32768 against a share of 992.97 keys.
// Balanced by keys (no piece charge) the longest run is the share rounded up, within 0.1%; with the
// default charge it holds at most the tile schedule's keys and never more tile iterations.
TEST(SplitKSchedule, TargetShapesAreBalancedByKeys) {
  struct Shape {
    int batch, len;
    int64_t tile_keys, tiles; // tile-balanced: keys and tiles of the longest run
    int64_t key_keys;         // by keys, no piece charge: keys of the longest run
  };
  const Shape shapes[] = {
      {1, 32768, 1024, 16, 993}, {8, 8192, 2048, 32, 1987}, {64, 4096, 8000, 125, 7952}, {1, 131072, 4032, 63, 3972}};
  for (const Shape &s : shapes) {
    const std::string what = std::to_string(s.batch) + "x" + std::to_string(s.len);
    const std::vector<int32_t> lens(s.batch, s.len);
    const SplitKShape by_keys = h200_shape(s.batch);
    const int64_t total_keys = int64_t{s.batch} * 8 * s.len;
    const int64_t share = (total_keys + 263) / 264;

    const Runs tiled = check_schedule(tile_balanced(by_keys), lens, 1, -1);
    EXPECT_EQ(tiled.keys, s.tile_keys) << what;
    EXPECT_EQ(tiled.tiles, s.tiles) << what;
    EXPECT_EQ(s.tiles, (total_keys / 64 + 263) / 264) << what;

    SplitKShape no_charge = by_keys;
    no_charge.piece_cost_keys = 0;
    const Runs keys = check_schedule(no_charge, lens, 1, -1);
    EXPECT_EQ(keys.keys, s.key_keys) << what;
    EXPECT_LE(keys.keys, share + share / 512) << what; // 0.2%
    EXPECT_EQ(keys.tiles, s.tiles) << what << ": no run iterates more tiles than the tile schedule's";

    SplitKSchedule schedule;
    const Runs charged = check_schedule(by_keys, lens, 1, -1, &schedule);
    EXPECT_LE(charged.keys, tiled.keys) << what;
    EXPECT_EQ(charged.tiles, s.tiles) << what;
    EXPECT_LE(charged.keys, keys.keys + by_keys.piece_cost_keys) << what;
    if (s.batch == 1) { // 8 units, each ending where a run does: the budget is the share itself
      EXPECT_EQ(schedule.run_limit, share) << what;
    }
  }
}

// The default shape balances by keys only where the tile-balanced run is long (key_balance_min_run_tiles,
// measured on the H200): whole tiles at 1 x 32768 and 8 x 8192 (16 / 32 tiles per run), keys at
// 64 x 4096 and 1 x 131072 (125 / 63).
TEST(SplitKSchedule, DefaultBalancesByKeysOnlyLongRuns) {
  struct Shape {
    int batch, len;
    bool by_keys;
    int64_t longest_keys;
  };
  for (const Shape &s : {Shape{1, 32768, false, 1024}, Shape{8, 8192, false, 2048}, Shape{64, 4096, true, 8000},
                         Shape{1, 131072, true, 3972}}) {
    SplitKShape shape = h200_shape(s.batch);
    shape.key_balance_min_run_tiles = SplitKShape{}.key_balance_min_run_tiles;
    SplitKSchedule schedule;
    const Runs runs = check_schedule(s.by_keys ? shape : tile_balanced(shape), std::vector<int32_t>(s.batch, s.len), 1,
                                     -1, &schedule);
    EXPECT_EQ(schedule.by_keys, s.by_keys) << s.batch << "x" << s.len;
    EXPECT_EQ(runs.keys, s.longest_keys) << s.batch << "x" << s.len;
    // The default shape itself gives the same partition.
    SplitKProblem problem;
    problem.batch = s.batch;
    problem.seqlen_k = s.len;
    problem.q_len = 1;
    Written written;
    ASSERT_TRUE(write_schedule(shape, problem, &written));
    const SplitKSchedule &by_default = written.schedule;
    EXPECT_EQ(by_default.by_keys, s.by_keys);
    EXPECT_EQ(by_default.keys_per_cta, s.longest_keys) << s.batch << "x" << s.len;
    EXPECT_EQ(by_default.num_work, schedule.num_work);
  }
}

// Pieces start and end mid-tile and mid-page: the kernels must take any kv_begin.
TEST(SplitKSchedule, PiecesStartMidTileAndMidPage) {
  const std::vector<int32_t> lens = {32768};
  const SplitKShape shape = h200_shape(1);
  SplitKProblem problem;
  problem.seqlens_k = lens.data();
  problem.batch = 1;
  Written written;
  ASSERT_TRUE(write_schedule(shape, problem, &written));
  const Decoded d = decode(written.layout, written.buffer);
  int mid_tile = 0, mid_page16 = 0, mid_page48 = 0;
  for (const fj_decode_work &w : d.work) {
    mid_tile += w.kv_begin % 64 != 0;
    mid_page16 += w.kv_begin % 16 != 0;
    mid_page48 += w.kv_begin % 48 != 0;
  }
  EXPECT_GT(mid_tile, 100);
  EXPECT_GT(mid_page16, 100);
  EXPECT_GT(mid_page48, 100);
}

// The tile-balanced schedule stays reachable (split_granule = block_n, no charge): every piece
// starts on a tile boundary of its unit and runs are whole tiles.
TEST(SplitKSchedule, TileBalancedScheduleIsReachable) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 30; ++trial) {
    const int batch = 1 + rng() % 20;
    std::vector<int32_t> lens(batch);
    for (int32_t &len : lens)
      len = static_cast<int32_t>(rng() % 9000);
    SplitKShape shape = tile_balanced(h200_shape(batch, 1 + rng() % 8));
    shape.num_sms = 1 + rng() % 40;
    SplitKSchedule schedule;
    const Runs runs = check_schedule(shape, lens, 1, -1, &schedule);
    EXPECT_EQ(schedule.run_limit, schedule.run_tile_limit * shape.block_n);
    EXPECT_LE(runs.tiles, schedule.run_tile_limit);
  }
}

TEST(SplitKSchedule, RaggedLengthsAndEmptySequences) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 400; ++trial) {
    const int batch = 1 + rng() % 40;
    std::vector<int32_t> lens(batch);
    for (int32_t &len : lens) {
      const int kind = rng() % 6;
      len = kind == 0 ? 0 : kind == 1 ? 1 : static_cast<int32_t>(rng() % 20000);
    }
    SplitKShape shape = h200_shape(batch, 1 + rng() % 8);
    shape.m_blocks = 1 + rng() % 3;
    shape.num_sms = 1 + rng() % 140;
    shape.ctas_per_sm = 1 + rng() % 3;
    const int granules[] = {1, 1, 16, 48, 64};
    shape.split_granule = granules[rng() % 5];
    shape.piece_cost_keys = rng() % 2 == 0 ? 0 : static_cast<int>(rng() % 200);
    shape.min_tiles_per_cta = static_cast<int>(rng() % 6);
    const int q_len = 1 + rng() % 16;
    const int window = rng() % 3 == 0 ? static_cast<int>(rng() % 3000) : -1;
    check_schedule(shape, lens, q_len, window);
  }
}

TEST(SplitKSchedule, PieceCostScalesWithTheHeadDims) {
  EXPECT_EQ(splitk_piece_cost_keys(128, 128), SplitKShape{}.piece_cost_keys);
  EXPECT_EQ(splitk_piece_cost_keys(64, 64), 128);
  EXPECT_EQ(splitk_piece_cost_keys(256, 256), 32);
  EXPECT_EQ(splitk_piece_cost_keys(192, 128), 51);
}

TEST(SplitKSchedule, TinyProblemIsNotSplit) {
  // Three tiles per unit, min 4 tiles per CTA: nothing is worth splitting.
  const std::vector<int32_t> lens = {150, 1, 0};
  const SplitKShape shape = h200_shape(3, 2);
  check_schedule(shape, lens, 1, -1);
  SplitKProblem problem;
  problem.seqlens_k = lens.data();
  problem.batch = 3;
  Written written;
  ASSERT_TRUE(write_schedule(shape, problem, &written));
  EXPECT_EQ(written.schedule.num_merges, 0);
  EXPECT_EQ(written.schedule.num_work, 6);
}

TEST(SplitKSchedule, FewerMBlocksThanCompiled) {
  // q_len below the compiled maximum: only the m blocks with real rows become units.
  SplitKShape shape = h200_shape(4, 2);
  shape.m_blocks = 4;
  SplitKLayout layout;
  std::string error;
  ASSERT_TRUE(splitk_layout(shape, &layout, &error));
  std::vector<int32_t> lens = {5000, 7, 0, 300};
  SplitKProblem problem;
  problem.seqlens_k = lens.data();
  problem.batch = 4;
  problem.m_blocks = 1;
  std::vector<char> buffer(layout.int_bytes);
  SplitKSchedule schedule;
  ASSERT_TRUE(splitk_schedule(shape, layout, problem, buffer.data(), buffer.size(), &schedule, &error)) << error;
  const Decoded d = decode(layout, buffer);
  std::vector<int> seen(4 * 2, 0);
  for (const fj_decode_work &w : d.work) {
    ASSERT_GE(w.unit, 0);
    ASSERT_LT(w.unit, 4 * 2);
    seen[w.unit] = 1;
  }
  for (int s : seen)
    EXPECT_EQ(s, 1);
  problem.m_blocks = 5; // more than the workspace was sized for
  EXPECT_FALSE(splitk_schedule(shape, layout, problem, buffer.data(), buffer.size(), nullptr, &error));
}

TEST(SplitKSchedule, WindowSkipsKeysNobodySees) {
  int lo = -1, hi = -1;
  splitk_visible_keys(1000, 4, 100, &lo, &hi);
  EXPECT_EQ(lo, 1000 - 4 - 100);
  EXPECT_EQ(hi, 1000);
  splitk_visible_keys(50, 1, 100, &lo, &hi);
  EXPECT_EQ(lo, 0);
  splitk_visible_keys(0, 1, -1, &lo, &hi);
  EXPECT_EQ(lo, 0);
  EXPECT_EQ(hi, 0);
}

TEST(SplitKSchedule, GridAndWorkspaceDoNotDependOnLengths) {
  const SplitKShape shape = h200_shape(16);
  SplitKLayout a, b;
  std::string error;
  ASSERT_TRUE(splitk_layout(shape, &a, &error));
  ASSERT_TRUE(splitk_layout(shape, &b, &error));
  EXPECT_EQ(a.grid, 264);
  EXPECT_EQ(a.total_bytes, b.total_bytes);
  EXPECT_EQ(a.partial_o_offset % 256, 0u);
  EXPECT_EQ(a.work_offset % 16, 0u);
  EXPECT_GE(a.total_bytes, a.partial_o_offset + sizeof(float) * a.max_states * 16 * 128);
}

// The fused merge's arrays: where params_decode.h says the device finds them (right after
// merges[grid]; the counters after the state map rounded up to 16 bytes), aligned, inside the
// integer region, and not overlapping.
TEST(SplitKSchedule, FusedMergeArraysAreWhereTheDeviceLooks) {
  for (int num_sms : {1, 3, 132}) {
    SplitKShape shape = h200_shape(5);
    shape.num_sms = num_sms;
    for (int ctas : {1, 2, 3}) {
      shape.ctas_per_sm = ctas;
      SplitKLayout l;
      std::string error;
      ASSERT_TRUE(splitk_layout(shape, &l, &error)) << error;
      EXPECT_EQ(l.max_states, fj_decode_states_per_cta * l.grid);
      EXPECT_EQ(l.state_merge_offset, l.merge_offset + sizeof(fj_decode_merge) * l.grid);
      const int padded =
          (l.max_states + fj_decode_i32_per_16_bytes - 1) / fj_decode_i32_per_16_bytes * fj_decode_i32_per_16_bytes;
      EXPECT_EQ(l.merge_counter_offset, l.state_merge_offset + sizeof(int32_t) * padded);
      EXPECT_EQ(l.state_merge_offset % 16, 0u);
      EXPECT_EQ(l.merge_counter_offset % 16, 0u);
      EXPECT_LE(l.merge_counter_offset + sizeof(int32_t) * l.grid, l.int_bytes);
      EXPECT_LE(l.int_bytes, l.partial_lse_offset);
    }
  }
}

// A unit split over CTAs has all of its states mapped to its merge; unsplit units have no state.
TEST(SplitKSchedule, StateMapOfOneLongSequence) {
  SplitKShape shape = h200_shape(2, 1);
  shape.num_sms = 4;
  shape.ctas_per_sm = 1;
  const std::vector<int32_t> lens = {64 * 40, 64};
  check_schedule(shape, lens, 1, -1);
  SplitKProblem problem;
  problem.seqlens_k = lens.data();
  problem.batch = 2;
  Written written;
  ASSERT_TRUE(write_schedule(shape, problem, &written));
  const Decoded d = decode(written.layout, written.buffer);
  ASSERT_EQ(d.header.num_merges, 1);
  EXPECT_EQ(d.merges[0].unit, 0);
  EXPECT_EQ(d.header.num_states, d.merges[0].count);
  for (int s = 0; s < d.header.num_states; ++s)
    EXPECT_EQ(d.state_merge[s], 0);
  for (const fj_decode_work &w : d.work) {
    if (w.unit == 1) {
      EXPECT_LT(w.state, 0);
    }
  }
}

TEST(SplitKSchedule, RefusesWhatItCannotHold) {
  const SplitKShape shape = h200_shape(2);
  SplitKLayout layout;
  std::string error;
  ASSERT_TRUE(splitk_layout(shape, &layout, &error));
  std::vector<int32_t> lens = {10, 20, 30};
  SplitKProblem problem;
  problem.seqlens_k = lens.data();
  problem.batch = 3; // > max_batch
  std::vector<char> buffer(layout.int_bytes);
  EXPECT_FALSE(splitk_schedule(shape, layout, problem, buffer.data(), buffer.size(), nullptr, &error));
  EXPECT_NE(error.find("max_batch"), std::string::npos);
  problem.batch = 2;
  EXPECT_FALSE(splitk_schedule(shape, layout, problem, buffer.data(), buffer.size() - 1, nullptr, &error));
  EXPECT_NE(error.find("needed"), std::string::npos);
  lens[1] = -5;
  EXPECT_FALSE(splitk_schedule(shape, layout, problem, buffer.data(), buffer.size(), nullptr, &error));
  SplitKShape bad = shape;
  bad.num_sms = 0;
  EXPECT_FALSE(splitk_layout(bad, &layout, &error));
}

// Whole units: at 64 x 4096 (512 units of 64 tiles, 264 CTAs) two units per run, 128 tiles against a
// balanced share of 125 (+2.4%): nothing split, nothing merged, 256 CTAs with work.
TEST(SplitKSchedule, WholeUnitsWhenEveryCtaHoldsOne) {
  SplitKShape shape = h200_shape(64);
  shape.whole_units_max_excess_pct = 5;
  SplitKSchedule schedule;
  const Runs runs = check_schedule(shape, std::vector<int32_t>(64, 4096), 1, -1, &schedule);
  EXPECT_TRUE(schedule.whole_units);
  EXPECT_EQ(schedule.num_merges, 0);
  EXPECT_EQ(schedule.num_work, 512);
  EXPECT_EQ(runs.tiles, 128);
  EXPECT_EQ(runs.keys, 2 * 4096);

  // A tighter allowance than the 2.4% it needs: the split schedule.
  shape.whole_units_max_excess_pct = 2;
  check_schedule(shape, std::vector<int32_t>(64, 4096), 1, -1, &schedule);
  EXPECT_FALSE(schedule.whole_units);
  EXPECT_GT(schedule.num_merges, 0);
}

// check_schedule's summary and longest runs for q_len 1 without a window, and the partition, decoded.
struct Checked {
  Runs runs;
  SplitKSchedule schedule;
  Decoded d;
};
Checked check_and_decode(const SplitKShape &shape, const std::vector<int32_t> &lens) {
  Checked c;
  c.runs = check_schedule(shape, lens, 1, -1, &c.schedule);
  Written w;
  EXPECT_TRUE(write_schedule(shape, problem_of(lens, 1, -1), &w));
  c.d = decode(w.layout, w.buffer);
  return c;
}

// Dealt whole units (whole_units_dealt, the default): run r holds units r and r + 256 at 64 x 4096,
// so the runs' first units are units 0-255, every KV head of sequences 0-31; the same run lengths as
// next-fit, whose order (units 2r, 2r + 1) stays reachable.
TEST(SplitKSchedule, DealtWholeUnitsTakeConsecutiveUnitsFirst) {
  SplitKShape shape = h200_shape(64);
  shape.whole_units_max_excess_pct = 5;
  ASSERT_TRUE(shape.whole_units_dealt);
  const std::vector<int32_t> lens(64, 4096);
  for (const bool dealt : {true, false}) {
    shape.whole_units_dealt = dealt;
    const Checked c = check_and_decode(shape, lens);
    EXPECT_TRUE(c.schedule.whole_units);
    EXPECT_EQ(c.runs.tiles, 128);
    const Decoded &d = c.d;
    for (int r = 0; r < 256; ++r) {
      ASSERT_EQ(d.slot_begin[r + 1] - d.slot_begin[r], 2) << "run " << r;
      EXPECT_EQ(d.work[d.slot_begin[r]].unit, dealt ? r : 2 * r);
      EXPECT_EQ(d.work[d.slot_begin[r] + 1].unit, dealt ? r + 256 : 2 * r + 1);
    }
  }
}

// Ragged units whose deal would overfill a run keep next-fit's partition: tiles 3, 1, 3, 1 on two
// CTAs are runs {3, 1} and {3, 1} (4 tiles each); dealt, one run would hold 6.
TEST(SplitKSchedule, DealtWholeUnitsNeverLengthenTheLongestRun) {
  SplitKShape shape = h200_shape(4, 1);
  shape.num_sms = 2;
  shape.ctas_per_sm = 1;
  shape.whole_units_max_excess_pct = 100;
  const Checked c = check_and_decode(shape, {3 * 64, 64, 3 * 64, 64});
  EXPECT_TRUE(c.schedule.whole_units);
  EXPECT_EQ(c.runs.tiles, 4);
  ASSERT_EQ(c.d.work.size(), 4u);
  for (int u = 0; u < 4; ++u)
    EXPECT_EQ(c.d.work[u].unit, u);
}

// The runtime's default shape takes whole units at 64 x 4096 and splits at the other TARGETS shapes.
TEST(SplitKSchedule, DefaultShapeTakesWholeUnitsOnlyAt64x4096) {
  const struct {
    int batch, len;
    bool whole;
  } shapes[] = {{1, 32768, false}, {8, 8192, false}, {64, 4096, true}, {1, 131072, false}};
  for (const auto &s : shapes) {
    SplitKShape shape = h200_shape(s.batch);
    shape.whole_units_max_excess_pct = SplitKShape{}.whole_units_max_excess_pct;
    shape.key_balance_min_run_tiles = SplitKShape{}.key_balance_min_run_tiles;
    SplitKSchedule schedule;
    check_schedule(shape, std::vector<int32_t>(s.batch, s.len), 1, -1, &schedule);
    EXPECT_EQ(schedule.whole_units, s.whole) << s.batch << "x" << s.len;
  }
}

// Fewer units than CTAs (1 x 32768: 8 units), or whole units that would leave the runs uneven
// (38 sequences: 304 units on 264 CTAs, two units in some runs against a share of 1.15), split.
TEST(SplitKSchedule, WholeUnitsOnlyWhenTheRunsStayEven) {
  SplitKShape shape = h200_shape(38);
  shape.whole_units_max_excess_pct = 10;
  SplitKSchedule schedule;
  check_schedule(shape, std::vector<int32_t>(1, 32768), 1, -1, &schedule);
  EXPECT_FALSE(schedule.whole_units);
  check_schedule(shape, std::vector<int32_t>(38, 4096), 1, -1, &schedule);
  EXPECT_FALSE(schedule.whole_units);
}

// Varlen batches with empty and one-key sequences, windows and q_len 4: every key exactly once, each
// unit in one piece, the longest run within the allowance.
TEST(SplitKSchedule, WholeUnitsCoverVarlenBatches) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 40; ++trial) {
    const int batch = 40 + static_cast<int>(rng() % 60);
    std::vector<int32_t> lens(batch);
    for (int32_t &len : lens)
      len = rng() % 7 == 0 ? static_cast<int32_t>(rng() % 2) : static_cast<int32_t>(1 + rng() % 5000);
    SplitKShape shape = h200_shape(batch);
    shape.whole_units_max_excess_pct = 100;
    shape.m_blocks = 1 + trial % 2; // units are (sequence, kv head, m block)
    const int q_len = trial % 2 == 0 ? 1 : 4;
    const int window = trial % 3 == 0 ? 700 : -1;
    SplitKSchedule schedule;
    check_schedule(shape, lens, q_len, window, &schedule);
    EXPECT_EQ(schedule.whole_units, batch * 8 * shape.m_blocks >= 264) << "trial " << trial;
  }
}

} // namespace
} // namespace flashjit
