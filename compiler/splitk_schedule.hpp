// Host plan of the split-K decode (FlashInfer's plan/run split, FlashDecoding's work partition).
//
// Plan once, run many: `splitk_layout` fixes, from quantities known up front (SM count, the
// kernel plan, the largest batch), the launch grid and the workspace size; `splitk_schedule` then
// turns the KV lengths of one step into a work list, written into a host buffer that the caller
// copies to the start of the device workspace. The grid never depends on the lengths, so the
// launches can be captured in a CUDA graph and replayed after each re-schedule.
//
// Partition (stream-K over keys): units are (sequence, kv head, m block), laid out in that order,
// each with the keys some query row can see. The CTAs of the grid take contiguous runs of that key
// sequence under two budgets: at most `run_limit` keys and at most `run_tile_limit` tile iterations
// (a piece of n keys is ceil(n / block_n) of them, counted from its own first key). The tile budget
// starts at the tile-balanced schedule's, ceil(total tiles / grid) (at least min_tiles_per_cta),
// the key budget at the balanced share, ceil(total keys / grid) (rounded up to split_granule, at
// least min_tiles_per_cta tiles); both grow only as far as the rules below need:
//   - a unit that straddles a run's end is cut there into pieces that write partial (O, LSE)
//     states; cuts fall on multiples of split_granule keys from the unit's first visible key, and a
//     piece that does not end its unit is shortened to whole tiles when the run's tile budget is the
//     tighter one;
//   - a piece shorter than min_tiles_per_cta tiles is not cut off the end of a run that has work
//     (the unit moves to the next run);
//   - every piece with keys after a run's first is charged piece_cost_keys against the run's key
//     budget (the time a CTA spends between two pieces);
//   - a unit inside one run writes O directly.
// Every visible key of every unit is covered exactly once; at most grid - 1 units are split, a run
// holds at most fj_decode_states_per_cta split pieces (its first and its last), so at most
// 2 * grid states exist. split_granule = block_n with piece_cost_keys = 0 gives the tile-balanced
// schedule of runs 1-9.
//
// Whole units instead (SplitKShape::whole_units_max_excess_pct): with at least as many units as CTAs,
// runs of whole units, when the longest of them stays within the allowance over the balanced share
// of tiles; dealt position-major across the runs (whole_units_dealt). Nothing is split, so nothing
// is merged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace flashjit {

// What fixes the grid and the workspace: known before the first step.
struct SplitKShape {
  int num_sms = 0;
  int ctas_per_sm = 1; // plan constant kCtasPerSm (CTAs that share an SM)
  int block_m = 16;    // plan constant kBlockM (rows of a partial state)
  int block_n = 64;    // plan constant kBlockN (keys per tile)
  int m_blocks = 1;    // plan constant kMBlocks
  int head_dim_v = 128;
  int heads_kv = 1;
  int max_batch = 1;         // the largest batch any later schedule may use
  int min_tiles_per_cta = 4; // do not split below this many tiles per CTA (the combine costs more)
  // Keys between two cut points of a unit (see the partition above). 1: runs balanced to the key,
  // the default (splitk_schedule.cpp says why no coarser granule pays); block_n: the old
  // tile-balanced runs, kept so one process can time both.
  int split_granule = 1;
  // Keys' worth of time a CTA loses when its run moves to another piece (splitk_schedule.cpp), charged
  // against the key budget of every piece after a run's first. The default is one 64-key tile of a
  // 16-bit d128 KV (32 KB, ~2.5 us per CTA at 3.5 TB/s over 264 CTAs, about the gap it stands for);
  // splitk_piece_cost_keys scales it to other head dims. 0 with split_granule = block_n: the
  // schedule of runs 1-9.
  int piece_cost_keys = 64;
  // Runs balanced by keys (split_granule, piece_cost_keys) only when the tile-balanced run would hold
  // at least this many tiles; shorter runs use whole tiles and no charge (splitk_schedule.cpp says
  // why). 0: always by keys.
  int key_balance_min_run_tiles = 48;
  // Whole units: when there are at least as many units as CTAs, runs take whole units (no piece,
  // no partial state, no merge) if the longest such run holds at most this many percent more tile
  // iterations than the balanced share, ceil(total tiles / grid). < 0: never. Measured on the H200
  // at 64 x 4096 (+2.4% tiles per run): whole units +0.4% contiguous, +1.0% page 16, +1.3% page 64
  // (docs/perf-notes.md, session 11); a larger allowance would let the longest run cost more than
  // the merges it saves.
  int whole_units_max_excess_pct = 3;
  // Whole units dealt position-major: run r takes units r, r + R, r + 2R, ... (R runs, the count
  // next-fit needs), so the CTAs that stream at the same time read every KV head of the same
  // sequences, whose token-major rows share their memory; only when no run then exceeds next-fit's
  // longest. Measured on the H200 (docs/perf-notes.md, session 13): +0.2..0.8% at 64 x 4096 and
  // 128 x 2048. false: next-fit's order (run r holds units 2r and 2r + 1 at 64 x 4096).
  bool whole_units_dealt = true;
};

// piece_cost_keys for 16-bit K/V of these head dims: the keys that move 32 KB per CTA, five times
// that for paged KV with TMA tiles (plan constant kTmaKv), whose extra pieces cost more.
int splitk_piece_cost_keys(int head_dim_qk, int head_dim_v, bool paged_tma = false);

// Byte offsets in the workspace. The integer region [0, int_bytes) is what the host schedule
// writes (the merge counters as zeros: copying a schedule in also resets them); the float region
// (partial states) is device-only scratch.
struct SplitKLayout {
  int grid = 0; // CTAs of fj_decode_splitk and of fj_decode_combine
  int max_work = 0;
  int max_states = 0;
  size_t header_offset = 0; // fj_decode_header
  size_t slot_offset = 0;   // int32 [grid + 1]
  size_t work_offset = 0;   // fj_decode_work [max_work]
  size_t merge_offset = 0;  // fj_decode_merge [grid]
  // The fused merge (params_decode.h): right after merges[grid], where the device finds them.
  size_t state_merge_offset = 0;   // int32 [max_states]: merge of each state, -1 if unused
  size_t merge_counter_offset = 0; // int32 [grid]: arrivals per merge, zero between launches
  size_t int_bytes = 0;
  size_t partial_lse_offset = 0; // float [max_states, block_m]
  size_t partial_o_offset = 0;   // float [max_states, block_m, head_dim_v]
  size_t total_bytes = 0;        // the workspace size to allocate
};

// The launch-invariant layout; false (and why) if the shape is invalid.
bool splitk_layout(const SplitKShape &shape, SplitKLayout *layout, std::string *error);

// One step's lengths.
struct SplitKProblem {
  const int32_t *seqlens_k = nullptr; // host [batch]; null: every sequence has `seqlen_k` keys
  int seqlen_k = 0;
  int batch = 0;
  int q_len = 1;        // query tokens per sequence (runtime seqlen_q)
  int window_left = -1; // < 0: unbounded; keys before (kv_len - q_len - window_left) are skipped
  // m blocks that hold real rows this step: ceil(group * q_len / block_m) when q_len is below the
  // compiled maximum (0: shape.m_blocks). fj_decode_params.m_blocks must get the same value.
  int m_blocks = 0;
};

struct SplitKSchedule {
  int num_work = 0;
  int num_merges = 0; // split units: fj_decode_combine has work only when this is > 0
  int num_states = 0;
  int64_t total_keys = 0;     // visible keys of all units
  int64_t total_tiles = 0;    // sum over units of ceil(visible keys / block_n)
  int64_t keys_per_cta = 0;   // the most keys any CTA's run got
  int64_t tiles_per_cta = 0;  // the most tile iterations any CTA's run got (its pieces' tiles)
  int64_t run_limit = 0;      // the key budget of a run the partition was built with (keys + piece charges)
  int64_t run_tile_limit = 0; // the tile budget of a run (>= tiles_per_cta)
  bool by_keys = false;       // runs balanced by keys (else by whole tiles, see key_balance_min_run_tiles)
  bool whole_units = false;   // runs of whole units (whole_units_max_excess_pct): nothing split
};

// Keys [*lo, *hi) that some query row of a sequence of `kv_len` keys can see.
void splitk_visible_keys(int kv_len, int q_len, int window_left, int *lo, int *hi);

// Writes the integer region (layout.int_bytes bytes) into `host_buffer`. False, with a message,
// when the buffer is too small, the batch exceeds the shape, or a length is negative.
bool splitk_schedule(const SplitKShape &shape, const SplitKLayout &layout, const SplitKProblem &problem,
                     void *host_buffer, size_t host_bytes, SplitKSchedule *out, std::string *error);

} // namespace flashjit
