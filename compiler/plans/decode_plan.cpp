// Plans of the split-K decode kernel (templates/kernels/decode_splitk.cuh) and of the standalone
// merge of partial states (templates/kernels/combine.cuh).
//
// Decode reads every KV byte once and does little math per byte, so the plan is about keeping
// enough bytes in flight per SM (Little's law: ~4.5 TB/s x ~1 us of latency over 132 SMs is about
// 35 KB per SM at the very least; we aim for 128 KB). The knobs are the ring depth (stages) and
// how many CTAs share an SM; two or more CTAs also hide one CTA's pipeline refill between pieces.
#include "compiler/plans/decode_plan.hpp"
#include "compiler/planner.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace flashjit {
namespace {

constexpr int kWarpSize = 32;
constexpr int kMmaM = 16;
constexpr int kMmaK = 16;
constexpr int kElemBytes = 2;
constexpr int kChunkElems = 8; // one 16-byte copy
constexpr int kWarpKeys = 16;  // keys per warp per tile: one P.V k step
constexpr int kMaxWarpKeys = 64;
constexpr int kMaxHeadDim = 256;
constexpr int kMaxQLen = 16;
constexpr int kMaxPageSize = 512;
// O accumulators per thread are kMTiles * head_dim_v / 2 floats; beyond 64 of them (with S, the
// softmax state and the copy addresses) ptxas starts to spill, so larger M takes more m blocks.
constexpr int kMaxAccumulatorFloats = 64;
constexpr int kMaxMTiles = 4;
constexpr int kInFlightTargetBytes = 128 * 1024;
constexpr int kMinStages = 2;
constexpr int kPreferredMinStages = 3;
constexpr int kMaxStages = 6;
constexpr int kMaxCtasPerSm = 4;
constexpr int kSmemReservedPerCta = 1024; // the driver keeps 1 KB of every CTA's shared memory
constexpr int kSmemAlign = 128;
constexpr int kMergePadFloats = 4; // merge rows are padded so the 8 rows of a fragment spread over banks
constexpr int kStatsPerRow = 2;    // (max, sum)
constexpr int kRowAddrsPerRow = 2; // paged: a K and a V address per tile row and stage
constexpr int kCombineThreads = 128;
constexpr int kCombineGridPerSm = 2;
// K/V copies with an L2 evict-first policy and a 128-byte L2 prefetch (kKvL2Hints) from this arch
// on: measured on the H200 (+2..6% contiguous, paged unchanged within noise; perf-notes, decode
// "Session 4").
// Not measured on sm_80, which keeps plain copies.
constexpr int kKvL2HintsMinArch = 90;
// Merge of split units inside the decode grid (kFusedMerge: arrival counters, the last CTA of a
// unit merges it), so a step is one launch instead of two: one launch is ~3.5 us of host time on
// the H200 machine (issue 4). GPU time: within -0.4..+0.6% of the two-launch step (-2.5% at
// 1x131072) in session 3's same-lease A/B (perf-notes "Session 3" and "Session 5" of the decode
// notes). Both backends render it.
constexpr int kFusedMergeDefault = 1;
// K/V tiles by TMA (kTmaKv) from this arch on: boxes of one 64-column panel with the 128-byte
// swizzle, credited to one mbarrier per stage, in place of every thread's 16-byte cp.async copies.
// Measured on the H200 (docs/perf-notes.md, decode "Session 17", runs 21-21e): +3.5..4.7% TB/s
// contiguous, +2..4.4% paged (page 16) against the cp.async kernel of the same tiles.
constexpr int kTmaKvMinArch = 90;
constexpr int kTmaPanelCols = 64;       // 128 bytes of 16-bit elements: the swizzle span
constexpr int kTmaMaxBoxRows = 256;     // TMA's limit on a box dimension
constexpr int kTmaPagedBoxRows = 16;    // paged: a box is 16 keys of one page
constexpr int kSwizzleAtomBytes = 1024; // 8 swizzled 128-byte rows: a box starts on one
constexpr int kMbarrierBytes = 8;
// Wide key blocks (KernelSpec::key_block): 4 warps x 32 keys, so 128-key tiles, which the ring
// sizing below gives one CTA per SM at d128. Half the CTAs make half the partial states per split
// unit, and a short, deeply split step ends with a shorter merge (1x32768: 16 states against 33).
// Measured on the H200 against the 64-key tiles (harness run 24c; perf-notes decode "Session 20"),
// contiguous / page 16 / page 64: 1x16384 +5.9 / +4.1 / +6.4%, 1x32768 +3.5 / +1.7 / +5.0%, 1x49152
// +3.0 / +0.1 / +2.3%, 1x65536 +2.1 / -1.8 / +1.8%, 1x131072 -0.2 / -4.4 / -1.7%. So
// decode_key_block_for takes them up to 2^18 keys x KV heads (1x32768 with 8 KV heads), where every
// layout gains and page 16 stays within 5% of contiguous. Measured with TMA tiles, d128 and one m16
// tile of query rows only, so the wide block needs those.
constexpr int kWideKeyBlock = 128;
constexpr int kWideKeyBlockWarps = 4;
constexpr int kWideKeyBlockMaxHeadDim = 128;
constexpr int64_t kWideKeyBlockMaxKeyHeads = int64_t(1) << 18;

int align_up(int value, int alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// Shared memory of one SM available to resident CTAs.
int smem_per_sm(const Arch &arch) {
  constexpr int kKiB = 1024;
  switch (arch.sm) {
  case 80: return 164 * kKiB;
  case 86:
  case 89: return 100 * kKiB;
  default: return 228 * kKiB;
  }
}

// A row of `elems` 16-bit values, padded so its length in 16-byte units is odd: the 8 row
// addresses of one ldmatrix then fall into 8 different bank groups.
int padded_row(int elems) {
  int units = elems / kChunkElems;
  if (units % 2 == 0)
    ++units;
  return units * kChunkElems;
}

bool fail(std::string *why_not, std::string message) {
  *why_not = std::move(message);
  return false;
}

} // namespace

// Boxes are whole 64-column panels, so both head dims must be multiples of 64; paged boxes are 16
// keys of one page, so pieces must start on multiples of 16 keys, which a sliding window's first
// visible key does not.
std::string_view tma_kv_unsupported(const KernelSpec &spec, flashjit_backend backend, int block_n) {
  if (spec.arch.sm < kTmaKvMinArch)
    return "TMA needs sm_90 or later";
  if (backend == FLASHJIT_BACKEND_MLIR)
    return "the MLIR backend renders cp.async tiles only";
  if (spec.align_bytes < 16)
    return "rows are not 16-byte aligned";
  if (spec.head_dim_qk % kTmaPanelCols != 0 || spec.head_dim_v % kTmaPanelCols != 0)
    return "head dims are not multiples of 64 (whole 128-byte panels)";
  if (spec.page_size == 0 && block_n > kTmaMaxBoxRows)
    return "a tile of more than 256 keys is more than one box";
  if (spec.page_size > 0 && spec.page_size % kTmaPagedBoxRows != 0)
    return "the page size is not a multiple of 16 keys";
  if (spec.page_size > 0 && spec.local)
    return "a sliding window starts pieces off the 16-key boxes of a page";
  return "";
}

int decode_wide_key_block(const KernelSpec &spec, flashjit_backend backend) {
  if (spec.op != Op::decode || spec.head_dim_qk > kWideKeyBlockMaxHeadDim ||
      spec.head_dim_v > kWideKeyBlockMaxHeadDim || spec.gqa_group * spec.q_len > kMmaM)
    return 0;
  return tma_kv_unsupported(spec, backend, kWideKeyBlock).empty() ? kWideKeyBlock : 0;
}

int decode_key_block_for(const KernelSpec &spec, int64_t key_heads, flashjit_backend backend) {
  if (key_heads <= 0 || key_heads > kWideKeyBlockMaxKeyHeads)
    return 0;
  return decode_wide_key_block(spec, backend);
}

bool plan_decode(const KernelSpec &spec, Plan *plan, std::string *why_not, flashjit_backend backend) {
  return plan_decode_tuned(spec, DecodeTuning{}, plan, why_not, backend);
}

bool plan_decode_tuned(const KernelSpec &spec, const DecodeTuning &tuning, Plan *plan, std::string *why_not,
                       flashjit_backend backend) {
  if (spec.op != Op::decode)
    return fail(why_not, "not a decode spec");
  if (spec.arch.sm < 80)
    return fail(why_not, "decode_splitk needs sm_80 or later (mma.sync bf16, cp.async)");
  for (int dim : {spec.head_dim_qk, spec.head_dim_v})
    if (dim <= 0 || dim % kChunkElems != 0 || dim > kMaxHeadDim)
      return fail(why_not, "head dims must be multiples of 8 up to 256 (got " + std::to_string(dim) + ")");
  if (spec.q_len < 1 || spec.q_len > kMaxQLen)
    return fail(why_not, "decode_splitk handles q_len 1..16 (got " + std::to_string(spec.q_len) + ")");
  if (spec.gqa_group < 1)
    return fail(why_not, "gqa_group must be at least 1");
  if (spec.varlen)
    return fail(why_not, "decode_splitk takes KV lengths from seqlens_k, not cu_seqlens (varlen)");
  if (spec.page_size < 0 || spec.page_size > kMaxPageSize)
    return fail(why_not, "page size must be 0 (contiguous) or 1..512");
  if (tuning.fused_merge < -1 || tuning.fused_merge > 1)
    return fail(why_not, "fused_merge must be -1 (the planner's choice), 0 or 1");
  if (tuning.warps != 0 && tuning.warps != 2 && tuning.warps != 4 && tuning.warps != 8)
    return fail(why_not, "warps must be 0 (the planner's choice), 2, 4 or 8");
  if (tuning.warp_keys < 0 || tuning.warp_keys % kMmaK != 0 || tuning.warp_keys > kMaxWarpKeys)
    return fail(why_not, "warp_keys must be 0 (the planner's choice) or a multiple of 16 up to 64");
  if (tuning.tma_kv < -1 || tuning.tma_kv > 1)
    return fail(why_not, "tma_kv must be -1 (the planner's choice), 0 or 1");
  if (spec.key_block != 0 && spec.key_block != kWideKeyBlock)
    return fail(why_not, "decode key_block must be 0 (the planner's tiles) or " + std::to_string(kWideKeyBlock) +
                             " (got " + std::to_string(spec.key_block) + ")");
  // A tuning's warps and keys per warp win over the spec's key block (A/B builds).
  const bool wide = spec.key_block == kWideKeyBlock && tuning.warps == 0 && tuning.warp_keys == 0;
  const int warp_keys = tuning.warp_keys > 0 ? tuning.warp_keys : wide ? kWideKeyBlock / kWideKeyBlockWarps : kWarpKeys;

  const int rows = spec.gqa_group * spec.q_len;
  const int qk_mma = align_up(spec.head_dim_qk, kMmaK);
  const int row_qk = padded_row(qk_mma);
  const int row_v = padded_row(spec.head_dim_v);
  const int mtiles_cap = std::clamp(kMaxAccumulatorFloats * 2 / spec.head_dim_v, 1, kMaxMTiles);
  const int mtiles = std::min((rows + kMmaM - 1) / kMmaM, mtiles_cap);
  const int block_m = mtiles * kMmaM;
  const int m_blocks = (rows + block_m - 1) / block_m;

  // Try 4 warps, then 2 (small shared memory with head dim 256); per warp count, the most CTAs per
  // SM whose ring reaches the in-flight target with >= 3 stages, else the most bytes in flight.
  const int sm_capacity = smem_per_sm(spec.arch);
  const int block_limit = max_shared_bytes_per_block(spec.arch);
  struct Choice {
    int warps = 0, ctas = 0, stages = 0, smem = 0;
    long in_flight = 0;
    int offset_kv = 0, stage_bytes = 0, v_in_stage = 0, offset_stats = 0, merge_row = 0, offset_pages = 0;
    bool tma = false;
  } best;
  bool found_target = false;
  const std::vector<int> warp_counts = tuning.warps > 0 ? std::vector<int>{tuning.warps}
                                       : wide           ? std::vector<int>{kWideKeyBlockWarps}
                                                        : std::vector<int>{4, 2};
  for (int warps : warp_counts) {
    const int block_n = warps * warp_keys;
    const std::string_view no_tma = tma_kv_unsupported(spec, backend, block_n);
    if (tuning.tma_kv == 1 && !no_tma.empty())
      return fail(why_not, "TMA tiles (tma_kv = 1) cannot run this spec: " + std::string(no_tma));
    const bool tma = tuning.tma_kv != 0 && no_tma.empty();
    // TMA tiles: the ring's stages and V halves start on swizzle atoms (the kernel rounds its
    // block's base up to one: kSwizzleAtomBytes of slack), and the stage barriers take the region
    // of the cp.async kernel's paged row addresses.
    const int ring_align = tma ? kSwizzleAtomBytes : kSmemAlign;
    const int q_bytes = align_up(block_m * row_qk * kElemBytes, ring_align);
    const int k_bytes = align_up(block_n * row_qk * kElemBytes, ring_align);
    const int v_bytes = align_up(block_n * row_v * kElemBytes, ring_align);
    const int stage_bytes = k_bytes + v_bytes;
    const int merge_row = spec.head_dim_v + kMergePadFloats;
    const int merge_bytes = align_up(warps * block_m * merge_row * int(sizeof(float)), kSmemAlign);
    const int stats_bytes = align_up(warps * block_m * kStatsPerRow * int(sizeof(float)), kSmemAlign);
    // Paged KV with cp.async tiles: per stage, the global address of every K and V row of its tile
    // (kernels/decode/smem.cuh's row-address ring), after the stats.
    const int ring_stage_bytes = spec.page_size > 0 && !tma ? block_n * kRowAddrsPerRow * int(sizeof(uint64_t)) : 0;
    const int tma_bytes = tma ? align_up(kMaxStages * kMbarrierBytes, kSmemAlign) + kSwizzleAtomBytes : 0;
    for (int ctas = kMaxCtasPerSm; ctas >= 1; --ctas) {
      const int per_cta = std::min(sm_capacity / ctas - kSmemReservedPerCta, block_limit);
      const int room = per_cta - q_bytes - stats_bytes - tma_bytes;
      if (room <= 0)
        continue;
      const int stages = std::min(room / (stage_bytes + ring_stage_bytes), kMaxStages);
      if (stages < kMinStages ||
          std::max(stages * stage_bytes, merge_bytes) + align_up(stages * ring_stage_bytes, kSmemAlign) > room)
        continue;
      const long in_flight = long(ctas) * (stages - 1) * stage_bytes;
      const bool meets = stages >= kPreferredMinStages && in_flight >= kInFlightTargetBytes;
      const bool better = meets ? !found_target : (!found_target && in_flight > best.in_flight);
      if (better) {
        best = {warps, ctas, stages, 0, in_flight, q_bytes, stage_bytes, k_bytes, 0, merge_row, 0, tma};
        best.offset_stats = q_bytes + std::max(stages * stage_bytes, merge_bytes);
        best.offset_pages = best.offset_stats + stats_bytes;
        best.smem = best.offset_pages + align_up(stages * ring_stage_bytes, kSmemAlign) + tma_bytes;
        found_target = meets;
      }
    }
    if (best.warps != 0)
      break;
  }
  if (best.warps == 0)
    return fail(why_not, "head dims " + std::to_string(spec.head_dim_qk) + "/" + std::to_string(spec.head_dim_v) +
                             " do not fit a two-stage ring in shared memory on " + spec.arch.name());

  Plan p;
  p.variant = Variant::decode_splitk;
  p.entry = "fj_decode_splitk";
  p.block_m = block_m;
  p.block_n = best.warps * warp_keys;
  p.stages = best.stages;
  p.threads = best.warps * kWarpSize;
  p.smem_bytes = best.smem;
  p.persistent = true; // grid = SMs x kCtasPerSm, fixed; the work list says what each CTA does
  p.add("kBlockM", block_m);
  p.add("kBlockN", p.block_n);
  p.add("kWarpN", warp_keys);
  p.add("kStages", best.stages);
  p.add("kMTiles", mtiles);
  p.add("kMBlocks", m_blocks);
  p.add("kCtasPerSm", best.ctas);
  p.add("kHeadDimQKMma", qk_mma);
  p.add("kSmemRowQK", row_qk);
  p.add("kSmemRowV", row_v);
  p.add("kSmemOffsetQ", 0);
  p.add("kSmemOffsetKV", best.offset_kv);
  p.add("kSmemStageBytes", best.stage_bytes);
  p.add("kSmemOffsetVInStage", best.v_in_stage);
  p.add("kSmemOffsetStats", best.offset_stats);
  p.add("kSmemOffsetPages", best.offset_pages);
  p.add("kMergeRowFloats", best.merge_row);
  p.add("kKvL2Hints", spec.arch.sm >= kKvL2HintsMinArch ? 1 : 0);
  p.add("kCombineThreads", kCombineThreads);
  p.add("kCombineGridPerSm", kCombineGridPerSm);
  p.add("kFusedMerge", tuning.fused_merge >= 0 ? tuning.fused_merge : kFusedMergeDefault);
  p.add_bool("kTmaKv", best.tma);
  // Keys per TMA box: a whole tile over contiguous KV, 16 keys of one page over pages (and so the
  // schedule's cut granule, runtime/decode.cpp).
  p.add("kTmaBoxRows", spec.page_size > 0 ? kTmaPagedBoxRows : p.block_n);
  *plan = p;
  return true;
}

bool plan_combine(const KernelSpec &spec, Plan *plan, std::string *why_not) {
  if (spec.op != Op::combine)
    return fail(why_not, "not a combine spec");
  if (spec.arch.sm < 80)
    return fail(why_not, "combine needs sm_80 or later");
  if (spec.head_dim_v <= 0 || spec.head_dim_v % kChunkElems != 0 || spec.head_dim_v > kMaxHeadDim)
    return fail(why_not, "head_dim_v must be a multiple of 8 up to 256");
  Plan p;
  p.variant = Variant::combine;
  p.entry = "fj_combine";
  p.threads = kCombineThreads;
  p.smem_bytes = 0;
  // One warp per row, grid-stride: any grid is correct; SMs x kCombineGridPerSm CTAs fill the GPU.
  p.add("kCombineThreads", kCombineThreads);
  p.add("kCombineGridPerSm", kCombineGridPerSm);
  *plan = p;
  return true;
}

} // namespace flashjit
