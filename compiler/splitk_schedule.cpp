#include "compiler/splitk_schedule.hpp"

#include "params_decode.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace flashjit {
namespace {

// Device loads of the work list are 16-byte vectors; partial states are read as float4 rows.
constexpr size_t kIntAlign = 16;
// The device's view of the fused merge's arrays (params_decode.h) is this layout's: merges[grid]
// ends 16-byte aligned, and the counters start at the state map's end rounded up to 16 bytes.
static_assert(sizeof(fj_decode_merge) == kIntAlign && kIntAlign == fj_decode_i32_per_16_bytes * sizeof(int32_t),
              "params_decode.h derives state_merge and merge_counters from this alignment");
constexpr size_t kFloatAlign = 256;

size_t align_up(size_t value, size_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

bool fail(std::string *error, std::string message) {
  if (error != nullptr)
    *error = std::move(message);
  return false;
}

// The partition's knobs (splitk_layout and splitk_schedule both refuse a shape with bad ones).
bool partition_knobs_valid(const SplitKShape &shape, std::string *error) {
  if (shape.split_granule <= 0 || shape.min_tiles_per_cta < 0 || shape.piece_cost_keys < 0)
    return fail(error, "splitk: split_granule must be positive, min_tiles_per_cta and piece_cost_keys not negative");
  return true;
}

} // namespace

bool splitk_layout(const SplitKShape &shape, SplitKLayout *layout, std::string *error) {
  if (shape.num_sms <= 0 || shape.ctas_per_sm <= 0)
    return fail(error, "splitk: num_sms and ctas_per_sm must be positive");
  if (shape.block_m <= 0 || shape.block_n <= 0 || shape.m_blocks <= 0 || shape.head_dim_v <= 0)
    return fail(error, "splitk: block_m, block_n, m_blocks and head_dim_v must be positive");
  if (shape.heads_kv <= 0 || shape.max_batch <= 0)
    return fail(error, "splitk: heads_kv and max_batch must be positive");
  if (!partition_knobs_valid(shape, error))
    return false;
  SplitKLayout l;
  l.grid = shape.num_sms * shape.ctas_per_sm;
  const int64_t units = int64_t{shape.max_batch} * shape.heads_kv * shape.m_blocks;
  // Each CTA boundary cuts at most one unit into one more piece.
  l.max_work = static_cast<int>(units + l.grid);
  // A CTA's run holds at most two pieces of split units: its first and its last.
  l.max_states = fj_decode_states_per_cta * l.grid;
  l.header_offset = 0;
  l.slot_offset = align_up(sizeof(fj_decode_header), kIntAlign);
  l.work_offset = align_up(l.slot_offset + sizeof(int32_t) * (l.grid + 1), kIntAlign);
  l.merge_offset = align_up(l.work_offset + sizeof(fj_decode_work) * l.max_work, kIntAlign);
  // The device finds these two from `merges` and the grid (params_decode.h): keep them right
  // after merges[grid], in this order.
  l.state_merge_offset = align_up(l.merge_offset + sizeof(fj_decode_merge) * l.grid, kIntAlign);
  l.merge_counter_offset = align_up(l.state_merge_offset + sizeof(int32_t) * l.max_states, kIntAlign);
  l.int_bytes = align_up(l.merge_counter_offset + sizeof(int32_t) * l.grid, kIntAlign);
  l.partial_lse_offset = align_up(l.int_bytes, kFloatAlign);
  const size_t state_rows = size_t(l.max_states) * shape.block_m;
  l.partial_o_offset = align_up(l.partial_lse_offset + sizeof(float) * state_rows, kFloatAlign);
  l.total_bytes = align_up(l.partial_o_offset + sizeof(float) * state_rows * shape.head_dim_v, kFloatAlign);
  *layout = l;
  return true;
}

int splitk_piece_cost_keys(int head_dim_qk, int head_dim_v, bool paged_tma) {
  constexpr int kPieceCostBytes = 32 * 1024; // K + V of one 64-key tile at d128, 16-bit
  // Paged TMA tiles: a CTA's second piece cost ~10 us at 1 x 131072 (its first tiles wait on
  // table reads and 16-key boxes), ~300 keys of d128; a 320-key charge took that shape from 3.91
  // to 4.04 TB/s (docs/perf-notes.md, decode run 21e).
  constexpr int kPagedTmaCostFactor = 5;
  constexpr int kElemBytes = 2;
  const int key_bytes = (head_dim_qk + head_dim_v) * kElemBytes;
  const int keys = key_bytes > 0 ? std::max(1, kPieceCostBytes / key_bytes) : 1;
  return paged_tma ? keys * kPagedTmaCostFactor : keys;
}

void splitk_visible_keys(int kv_len, int q_len, int window_left, int *lo, int *hi) {
  // The last query token sees up to the last key (causal or not, whatever the right window);
  // the first token's left window edge is the earliest key anyone sees.
  *hi = kv_len;
  *lo = window_left >= 0 ? std::max(0, kv_len - q_len - window_left) : 0;
}

bool splitk_schedule(const SplitKShape &shape, const SplitKLayout &layout, const SplitKProblem &problem,
                     void *host_buffer, size_t host_bytes, SplitKSchedule *out, std::string *error) {
  if (host_buffer == nullptr || host_bytes < layout.int_bytes)
    return fail(error, "splitk: the schedule buffer holds " + std::to_string(host_bytes) + " bytes, " +
                           std::to_string(layout.int_bytes) + " needed (see splitk_layout)");
  if (problem.batch < 0 || problem.batch > shape.max_batch)
    return fail(error, "splitk: batch " + std::to_string(problem.batch) + " exceeds the workspace's max_batch " +
                           std::to_string(shape.max_batch));
  if (problem.q_len <= 0)
    return fail(error, "splitk: q_len must be positive");
  if (problem.m_blocks < 0 || problem.m_blocks > shape.m_blocks)
    return fail(error, "splitk: m_blocks must be in [0, shape.m_blocks]");
  if (!partition_knobs_valid(shape, error))
    return false;
  const int m_blocks = problem.m_blocks > 0 ? problem.m_blocks : shape.m_blocks;
  const int64_t block_n = shape.block_n;

  // Visible keys [lo, hi) of every unit, in unit order (sequence, kv head, m block).
  const int units = problem.batch * shape.heads_kv * m_blocks;
  std::vector<int> unit_lo(units), unit_hi(units);
  int64_t total_keys = 0, total_tiles = 0;
  for (int b = 0; b < problem.batch; ++b) {
    const int kv_len = problem.seqlens_k != nullptr ? problem.seqlens_k[b] : problem.seqlen_k;
    if (kv_len < 0)
      return fail(error, "splitk: seqlens_k[" + std::to_string(b) + "] is negative");
    int lo = 0, hi = 0;
    splitk_visible_keys(kv_len, problem.q_len, problem.window_left, &lo, &hi);
    for (int u = b * shape.heads_kv * m_blocks; u < (b + 1) * shape.heads_kv * m_blocks; ++u) {
      unit_lo[u] = lo;
      unit_hi[u] = hi;
      total_keys += hi - lo;
      total_tiles += ceil_div(hi - lo, block_n);
    }
  }
  // Key balance only for long runs (measured on the H200, docs/perf-notes.md "decode session 6"):
  // at 16 and 32 tiles per run it was 2% and 5-7% slower than whole tiles (the same tile iterations
  // per run, and 8-64 more pieces whose gaps and merge states cost more than the keys they even
  // out), at 63 it was 2-4% faster, at 125 the same. Shorter runs keep the tile-balanced schedule.
  const int64_t tile_share = ceil_div(total_tiles, layout.grid); // tile iterations of a balanced run
  const bool by_keys = tile_share >= shape.key_balance_min_run_tiles;
  const int64_t granule = by_keys ? shape.split_granule : block_n;
  const int64_t piece_cost_keys = by_keys ? shape.piece_cost_keys : 0;
  int64_t total_granules = 0;
  for (int u = 0; u < units; ++u)
    total_granules += ceil_div(unit_hi[u] - unit_lo[u], granule);

  std::memset(host_buffer, 0, layout.int_bytes);
  auto *bytes = static_cast<char *>(host_buffer);
  auto *header = reinterpret_cast<fj_decode_header *>(bytes + layout.header_offset);
  auto *slot_begin = reinterpret_cast<int32_t *>(bytes + layout.slot_offset);
  auto *work = reinterpret_cast<fj_decode_work *>(bytes + layout.work_offset);
  auto *merges = reinterpret_cast<fj_decode_merge *>(bytes + layout.merge_offset);
  // The merge counters stay zero (the memset): every launch counts from zero.
  auto *state_merge = reinterpret_cast<int32_t *>(bytes + layout.state_merge_offset);

  // Whole units (shape.whole_units_max_excess_pct): next-fit of whole units into runs of at most
  // `tile_limit` tile iterations, in unit order. Nothing is split, so no CTA stores a partial state
  // or merges: at 64 x 4096 (512 units, 264 CTAs) the split schedule cuts about half the units.
  // Next-fit needs no more runs for a larger limit, so the smallest limit that fits is bisected.
  int num_work = 0, num_states = 0, num_merges = 0;
  int64_t largest_keys = 0, largest_tiles = 0;
  int whole_runs = 0; // runs of the partition build_whole made last
  auto build_whole = [&](int64_t tile_limit) -> bool {
    int cta = 0;
    int64_t run_tiles = 0, run_keys = 0;
    num_work = num_states = num_merges = 0;
    largest_keys = largest_tiles = 0;
    slot_begin[0] = 0;
    for (int u = 0; u < units; ++u) {
      const int64_t tiles = ceil_div(unit_hi[u] - unit_lo[u], block_n);
      if (run_tiles + tiles > tile_limit && slot_begin[cta] < num_work) {
        if (++cta >= layout.grid)
          return false;
        slot_begin[cta] = num_work;
        run_tiles = run_keys = 0;
      }
      if (tiles > tile_limit || num_work >= layout.max_work)
        return false;
      work[num_work++] = fj_decode_work{u, unit_lo[u], unit_hi[u], -1};
      run_tiles += tiles;
      run_keys += unit_hi[u] - unit_lo[u];
      largest_tiles = std::max(largest_tiles, run_tiles);
      largest_keys = std::max(largest_keys, run_keys);
    }
    for (int c = cta + 1; c <= layout.grid; ++c)
      slot_begin[c] = num_work;
    whole_runs = cta + 1;
    return true;
  };
  // Re-deals a whole-unit partition of `runs` runs position-major (whole_units_dealt): run r takes
  // units r, r + runs, ... when no run then holds more than `tile_limit` tile iterations (with
  // ragged lengths it may; next-fit's partition stays).
  auto deal_whole = [&](int runs, int64_t tile_limit) {
    std::vector<int64_t> run_tiles(runs, 0), run_keys(runs, 0);
    for (int u = 0; u < units; ++u) {
      run_tiles[u % runs] += ceil_div(unit_hi[u] - unit_lo[u], block_n);
      run_keys[u % runs] += unit_hi[u] - unit_lo[u];
    }
    if (*std::max_element(run_tiles.begin(), run_tiles.end()) > tile_limit)
      return;
    largest_tiles = *std::max_element(run_tiles.begin(), run_tiles.end());
    largest_keys = *std::max_element(run_keys.begin(), run_keys.end());
    num_work = 0;
    for (int r = 0; r < runs; ++r) {
      slot_begin[r] = num_work;
      for (int u = r; u < units; u += runs)
        work[num_work++] = fj_decode_work{u, unit_lo[u], unit_hi[u], -1};
    }
    for (int c = runs; c <= layout.grid; ++c)
      slot_begin[c] = num_work;
  };
  // The header, the unused state slots and the summary, for the partition the buffer holds.
  auto finish = [&](int64_t run_limit, int64_t run_tile_limit, bool balanced_by_keys, bool whole_units) {
    std::fill(state_merge + num_states, state_merge + layout.max_states, -1);
    header->num_work = num_work;
    header->num_merges = num_merges;
    header->num_states = num_states;
    if (out != nullptr) {
      *out = SplitKSchedule{};
      out->num_work = num_work;
      out->num_merges = num_merges;
      out->num_states = num_states;
      out->total_keys = total_keys;
      out->total_tiles = total_tiles;
      out->keys_per_cta = largest_keys;
      out->tiles_per_cta = largest_tiles;
      out->run_limit = run_limit;
      out->run_tile_limit = run_tile_limit;
      out->by_keys = balanced_by_keys;
      out->whole_units = whole_units;
    }
    return true;
  };
  const int64_t balanced_tiles = std::max<int64_t>(tile_share, 1);
  if (shape.whole_units_max_excess_pct >= 0 && units >= layout.grid) {
    const int64_t most = balanced_tiles * (100 + shape.whole_units_max_excess_pct) / 100;
    if (build_whole(most)) {
      int64_t fits = most, too_small = balanced_tiles - 1;
      while (fits - too_small > 1) {
        const int64_t mid = too_small + (fits - too_small) / 2;
        (build_whole(mid) ? fits : too_small) = mid;
      }
      build_whole(fits); // the buffer holds the last partition built: make it the one that fits
      if (shape.whole_units_dealt)
        deal_whole(whole_runs, fits);
      return finish(largest_keys, fits, false, true);
    }
  }

  // Greedy fill of CTA runs of at most `limit` keys and `tile_limit` tile iterations. A
  // unit that does not fit what is left of the current run is cut there, at the longest multiple of
  // the granule both budgets allow, unless that piece would be shorter than min_tiles_per_cta tiles
  // and the run already has work: then the unit starts the next run. Returns false when `grid` runs
  // do not suffice (the skipped capacity pushed work past the last CTA).
  //
  // Why two budgets: a piece of n keys costs ceil(n / block_n) iterations whatever its n (a partial
  // tile reads only its valid rows from HBM but issues the zero-filling copies and the MMAs of a
  // whole tile). The key budget balances the bytes; the tile budget, ceil(total tiles / grid) like
  // the tile-balanced schedule's run, keeps every CTA within that schedule's iterations, so a CTA
  // whose run holds the end of one unit and the start of another does not pay one more partial
  // tile than that schedule's longest run.
  //
  // Piece cost: every piece after a run's first is charged piece_cost_keys against the key budget,
  // because a CTA streams nothing between two pieces: the partial state's stores, the fused merge's
  // fence and arrival atomic (L2 round trips), the next piece's block-table lookups and its first
  // tile's HBM latency before the ring streams again (kernels/decode/piece.cuh run_piece, merge.cuh finish_piece).
  // Without the charge a run holding the end of one unit and the start of the next carries that
  // gap on top of the balanced share and becomes the critical path (8 x 8192: 56 such runs).
  //
  // The granule (default 1 key), derived: each key is a K and a V row read by its own 16-byte copies
  // (contiguous rows are head_dim * 2 bytes apart from any other head's; paged rows find their page
  // one row at a time, kernels/decode/copies.cuh KvSource), so a cut between any two keys moves no extra
  // bytes and no extra page lookups, and the tile iterations of a run are bounded by the tile budget
  // for any granule. A granule of g keys only adds up to g - 1 keys to the longest run (16 keys: 1008
  // instead of 993 keys per CTA at 1 x 32768).
  int64_t unplaced = 0; // keys a failed build left without a run
  auto build = [&](int64_t limit, int64_t tile_limit) -> bool {
    const int64_t min_piece = int64_t{shape.min_tiles_per_cta} * block_n;
    int cta = 0, run_pieces = 0;
    int64_t keys_left = limit, tiles_left = tile_limit, run_keys = 0, run_tiles = 0, placed = 0;
    num_work = num_states = num_merges = 0;
    largest_keys = largest_tiles = 0;
    slot_begin[0] = 0;
    auto next_cta = [&]() -> bool {
      if (cta + 1 >= layout.grid) {
        unplaced = total_keys - placed;
        return false;
      }
      largest_keys = std::max(largest_keys, run_keys);
      largest_tiles = std::max(largest_tiles, run_tiles);
      run_keys = run_tiles = 0;
      run_pieces = 0;
      ++cta;
      slot_begin[cta] = num_work;
      keys_left = limit;
      tiles_left = tile_limit;
      return true;
    };
    for (int u = 0; u < units; ++u) {
      const int first_piece = num_work;
      int key = unit_lo[u];
      do {
        const int64_t remaining = unit_hi[u] - key;
        // A run's first piece is every run's cost; an empty unit only writes zeros.
        const int64_t charge = run_pieces > 0 && remaining > 0 ? piece_cost_keys : 0;
        int64_t take = remaining;
        if (remaining + charge > keys_left || ceil_div(remaining, block_n) > tiles_left) {
          take = std::min(keys_left - charge, tiles_left * block_n) / granule * granule;
          if (take <= 0 || (take < min_piece && run_keys > 0)) {
            if (!next_cta())
              return false;
            continue;
          }
        }
        if (num_work >= layout.max_work)
          return false;
        const int end = key + static_cast<int>(take);
        work[num_work++] = fj_decode_work{u, key, end, -1};
        key = end;
        run_pieces += take > 0;
        keys_left -= take + charge;
        tiles_left -= ceil_div(take, block_n);
        run_keys += take;
        run_tiles += ceil_div(take, block_n);
        placed += take;
      } while (key < unit_hi[u]);
      const int pieces = num_work - first_piece;
      if (pieces > 1) {
        if (num_states + pieces > layout.max_states || num_merges >= layout.grid)
          return false;
        merges[num_merges] = fj_decode_merge{u, num_states, pieces, 0};
        for (int i = first_piece; i < num_work; ++i) {
          state_merge[num_states] = num_merges;
          work[i].state = num_states++;
        }
        ++num_merges;
      }
    }
    largest_keys = std::max(largest_keys, run_keys);
    largest_tiles = std::max(largest_tiles, run_tiles);
    for (int c = cta + 1; c <= layout.grid; ++c)
      slot_begin[c] = num_work;
    return true;
  };

  // The smallest budgets that fit. Tiles: from the fewest per run that can hold every unit's tiles,
  // ceil(total tiles / grid), up one at a time. Keys, for each tile budget: from the balanced share
  // (or the keys below which that tile budget could not be used); when skipped capacity or piece
  // charges need more, the limit jumps by the keys a failed build left over, spread over the grid
  // (at least doubling the step after each failure), until it fits; bisection within the last jump
  // then comes down to within 1/1024 of the smallest limit (0.1% of the longest run; each build
  // costs ~5 us at 512 units). The key budget stops mattering at `cap` (every run full of tiles, each
  // piece charged): a tile budget that does not fit there is one too small. With granule block_n
  // and no piece cost, limit = cap = tiles * block_n: the tile-balanced schedule's linear search.
  auto round_up = [&](int64_t keys) { return ceil_div(keys, granule) * granule; };
  const int64_t share = std::max<int64_t>(ceil_div(total_granules, layout.grid) * granule, 1);
  const int64_t min_piece = int64_t{shape.min_tiles_per_cta} * block_n;
  int64_t limit = 0, tile_limit = 0, built = -1; // built: the limit whose partition the buffer holds (-1: none fits)
  auto try_build = [&](int64_t keys, int64_t tiles) {
    built = build(keys, tiles) ? keys : -1;
    return built >= 0;
  };
  for (int64_t tiles = std::max<int64_t>({tile_share, shape.min_tiles_per_cta, 1});; ++tiles) {
    tile_limit = tiles;
    const int64_t cap = round_up(tiles * block_n + (tiles - 1) * piece_cost_keys);
    limit = std::min(cap, round_up(std::max({share, min_piece, (tiles - 1) * block_n + 1})));
    if (try_build(limit, tiles))
      break;
    int64_t too_small = limit;
    for (int64_t min_step = granule; limit < cap && built < 0; min_step *= 2) {
      too_small = limit;
      limit = std::min(cap, limit + std::max(min_step, round_up(ceil_div(unplaced, layout.grid))));
      try_build(limit, tiles);
    }
    if (built < 0)
      continue;
    while (limit - too_small > std::max(granule, limit / 1024)) {
      const int64_t mid = too_small + (limit - too_small) / granule / 2 * granule;
      (try_build(mid, tiles) ? limit : too_small) = mid;
    }
    if (built != limit)
      try_build(limit, tiles); // the buffer holds the last partition built: make it the one that fits
    break;
  }

  return finish(limit, tile_limit, by_keys, false);
}

} // namespace flashjit
