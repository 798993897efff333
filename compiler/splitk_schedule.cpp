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

} // namespace

bool splitk_layout(const SplitKShape &shape, SplitKLayout *layout, std::string *error) {
  if (shape.num_sms <= 0 || shape.ctas_per_sm <= 0)
    return fail(error, "splitk: num_sms and ctas_per_sm must be positive");
  if (shape.block_m <= 0 || shape.block_n <= 0 || shape.m_blocks <= 0 || shape.head_dim_v <= 0)
    return fail(error, "splitk: block_m, block_n, m_blocks and head_dim_v must be positive");
  if (shape.heads_kv <= 0 || shape.max_batch <= 0)
    return fail(error, "splitk: heads_kv and max_batch must be positive");
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
  const int m_blocks = problem.m_blocks > 0 ? problem.m_blocks : shape.m_blocks;

  // Tiles of every unit, in unit order (sequence, kv head, m block).
  const int units = problem.batch * shape.heads_kv * m_blocks;
  std::vector<int> unit_lo(units), unit_tiles(units);
  int64_t total = 0;
  for (int b = 0; b < problem.batch; ++b) {
    const int kv_len = problem.seqlens_k != nullptr ? problem.seqlens_k[b] : problem.seqlen_k;
    if (kv_len < 0)
      return fail(error, "splitk: seqlens_k[" + std::to_string(b) + "] is negative");
    int lo = 0, hi = 0;
    splitk_visible_keys(kv_len, problem.q_len, problem.window_left, &lo, &hi);
    const int tiles = static_cast<int>(ceil_div(hi - lo, shape.block_n));
    for (int u = b * shape.heads_kv * m_blocks; u < (b + 1) * shape.heads_kv * m_blocks; ++u) {
      unit_lo[u] = lo;
      unit_tiles[u] = tiles;
      total += tiles;
    }
  }

  std::memset(host_buffer, 0, layout.int_bytes);
  auto *bytes = static_cast<char *>(host_buffer);
  auto *header = reinterpret_cast<fj_decode_header *>(bytes + layout.header_offset);
  auto *slot_begin = reinterpret_cast<int32_t *>(bytes + layout.slot_offset);
  auto *work = reinterpret_cast<fj_decode_work *>(bytes + layout.work_offset);
  auto *merges = reinterpret_cast<fj_decode_merge *>(bytes + layout.merge_offset);
  // The merge counters stay zero (the memset): every launch counts from zero.
  auto *state_merge = reinterpret_cast<int32_t *>(bytes + layout.state_merge_offset);

  // Greedy fill of CTA runs of at most `per_cta` tiles. A unit that does not fit the current run is
  // split there, unless the piece left in the run would be shorter than min_tiles_per_cta and the
  // run already has work: then the unit starts the next run. Returns false when `grid` runs do not
  // suffice (the skipped capacity pushed work past the last CTA).
  int num_work = 0, num_states = 0, num_merges = 0;
  int64_t largest_run = 0;
  auto build = [&](int64_t per_cta) -> bool {
    int cta = 0;
    int64_t budget = per_cta, run = 0;
    num_work = num_states = num_merges = 0;
    largest_run = 0;
    slot_begin[0] = 0;
    auto next_cta = [&]() -> bool {
      if (cta + 1 >= layout.grid)
        return false;
      largest_run = std::max(largest_run, run);
      run = 0;
      ++cta;
      slot_begin[cta] = num_work;
      budget = per_cta;
      return true;
    };
    for (int u = 0; u < units; ++u) {
      const int first_piece = num_work;
      const int b = u / (shape.heads_kv * m_blocks);
      const int seq_len = problem.seqlens_k != nullptr ? problem.seqlens_k[b] : problem.seqlen_k;
      int64_t remaining = unit_tiles[u];
      int key = unit_lo[u];
      do {
        const bool tiny_piece = remaining > budget && budget < shape.min_tiles_per_cta && run > 0;
        if (((budget == 0 && remaining > 0) || tiny_piece) && !next_cta())
          return false;
        const int64_t take = std::min(remaining, budget);
        const int end = static_cast<int>(std::min<int64_t>(key + take * shape.block_n, seq_len));
        if (num_work >= layout.max_work)
          return false;
        work[num_work++] = fj_decode_work{u, key, end, -1};
        key = end;
        remaining -= take;
        budget -= take;
        run += take;
      } while (remaining > 0);
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
    largest_run = std::max(largest_run, run);
    for (int c = cta + 1; c <= layout.grid; ++c)
      slot_begin[c] = num_work;
    return true;
  };
  // The smallest run length that fits: ceil(total / grid) almost always does; each step up costs
  // one more tile on the critical path, so a linear search is also the balanced answer.
  int64_t per_cta = std::max<int64_t>({ceil_div(total, layout.grid), shape.min_tiles_per_cta, 1});
  while (!build(per_cta))
    ++per_cta;

  std::fill(state_merge + num_states, state_merge + layout.max_states, -1);
  header->num_work = num_work;
  header->num_merges = num_merges;
  header->num_states = num_states;
  if (out != nullptr) {
    out->num_work = num_work;
    out->num_merges = num_merges;
    out->num_states = num_states;
    out->total_tiles = total;
    out->tiles_per_cta = largest_run;
    out->run_limit = per_cta;
  }
  return true;
}

} // namespace flashjit
