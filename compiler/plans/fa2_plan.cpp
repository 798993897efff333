// Planner for the FlashAttention-2 prefill kernel (templates/kernels/fa2_prefill.cuh).
//
// Tiles: every warp owns kRowsPerWarp query rows, 16 (one m16 mma.sync fragment, the default) or
// 32 (two, Fa2Tuning::rows_per_warp), so kThreads = 32 * kBlockM / kRowsPerWarp.
// Shared memory holds Q (reused as the O staging tile) plus kStages buffers each of K and V:
//   bytes = kBlockM * max(strideQ, strideO) * 2 + kStages * kBlockN * (strideK + strideV) * 2
// where a row stride is the row's 16-byte chunk count made odd (one chunk of padding when even),
// so the 8 rows read by one ldmatrix phase fall in 8 different bank groups. The first candidate
// (largest tiles first) that fits max_shared_bytes_per_block(arch) wins.
#include "compiler/plans/fa2_plan.hpp"
#include "compiler/planner.hpp"

#include <algorithm>
#include <array>
#include <string>

namespace flashjit {
namespace {

constexpr int kMinArch = 80; // mma.sync m16n8k16 bf16, cp.async, ldmatrix
constexpr int kDimAlign = 8; // head dims are whole 16-byte chunks of 16-bit values
constexpr int kMaxHeadDim = 256;
constexpr int kMmaK = 16;            // Q K^T reduces over head_dim_qk in steps of 16 (zero-padded)
constexpr int kRowsPerWarp = 16;     // default: one m16 fragment per warp
constexpr int kWideRowsPerWarp = 32; // two m16 fragments per warp (Fa2Tuning::rows_per_warp)
constexpr int kWarpThreads = 32;
constexpr int kElemBytes = 2;
constexpr int kChunkElems = 8; // 16 bytes
constexpr int kChunkBytes = kChunkElems * kElemBytes;
constexpr int kSmallHeadDim = 64;
constexpr int kMediumHeadDim = 128;

struct Tiles {
  int block_m, block_n, stages;
  int sub_block_n = 0; // 0: block_n (one QK -> softmax -> PV step per key block)
};

// Candidates per padded head dim, preferred first. Register budget per thread (fp32 accumulators):
// O = head_dim_v / 2, S = block_n / 2, P = block_n / 4; block_n = 128 only up to head dim 128
// (d=128 uses ~235 registers, no spills). Measured on H200, d=128 bf16 non-causal S=4096:
// block_n 128 = 238 TFLOP/s, 64 = 212 (two stages) / 222 (one stage); 128 needs sm_90's smem.
constexpr std::array<Tiles, 4> kSmallTiles{{{128, 128, 2}, {128, 64, 2}, {128, 64, 1}, {64, 64, 1}}};
constexpr std::array<Tiles, 6> kMediumTiles{
    {{128, 128, 2}, {128, 64, 2}, {128, 64, 1}, {64, 64, 2}, {64, 64, 1}, {64, 32, 1}}};
constexpr std::array<Tiles, 6> kLargeTiles{
    {{128, 64, 2}, {128, 64, 1}, {64, 64, 1}, {64, 32, 2}, {64, 32, 1}, {64, 16, 1}}};

// 32 rows per warp: a thread holds O = head_dim_v and S = block_n fp32 accumulators (twice the
// 16-row counts) plus the P fragments, addresses and tile bounds, at the edge of 255 registers.
// head_dim_v + block_n <= kWideRegBudget is the widest rule under which ptxas spills nothing for any
// head dim <= 128 on sm_80/86/89/90a, fp16/bf16, causal or not (NVRTC sweeps, perf-notes "fa2: 32
// rows per warp"): d64 -> 128x80, d80 -> 128x64, d96 -> 128x48, d112/d128 -> 128x32. Above head dim
// 128 the O accumulators alone crowd the register file and every tile spills: keep 16 rows there.
constexpr int kWideRegBudget = 144;
constexpr int kWideMaxBlockN = 128;
constexpr int kWideMinBlockN = 32;
constexpr int kFeaturedWideMaxHeadDim = 112;
constexpr int kWideBlockM = 128;
constexpr int kWideSmallBlockM = 64;
constexpr int kWideCandidates = 5;

// Wider key blocks where they fit 255 registers without spilling (NVRTC and MLIR sweeps, perf-notes
// "fa2: key blocks past the budget"): on sm_90a, for specs with no window, softcap, varlen, paging
// or unaligned rows. Each of those adds live state, and with any of them these tiles spill. Causal
// d128 at 128x64 fits NVRTC's build and not the MLIR one (4-36 bytes of spills), so the plan of that
// spec depends on the backend that renders it. Measured on the H200 against the budget's tile:
// d64 128x128 vs 128x80 and d128 128x64 vs 128x32.
struct WideBlock {
  int head_dim, block_n;
  bool causal_fits_nvrtc, causal_fits_mlir;
};
constexpr int kWideBlockArch = 90;
constexpr std::array<WideBlock, 2> kPlainSm90WideBlocks{{{64, 128, true, true}, {128, 64, true, false}}};

bool plain(const KernelSpec &spec) {
  return !spec.local && !spec.softcap && !spec.varlen && spec.page_size == 0 && spec.align_bytes >= kChunkBytes;
}

bool causal_fits(const WideBlock &wide, flashjit_backend backend) {
  return backend == FLASHJIT_BACKEND_MLIR ? wide.causal_fits_mlir : wide.causal_fits_nvrtc;
}

// The budget's key block, or the measured wider one for a plain spec on sm_90a.
int wide_block_n(const KernelSpec &spec, flashjit_backend backend) {
  if (spec.arch.sm == kWideBlockArch && plain(spec) && spec.head_dim_qk == spec.head_dim_v)
    for (const WideBlock &wide : kPlainSm90WideBlocks)
      if (wide.head_dim == spec.head_dim_v && (!spec.causal || causal_fits(wide, backend)))
        return wide.block_n;
  return std::clamp((kWideRegBudget - spec.head_dim_v) / kMmaK * kMmaK, kWideMinBlockN, kWideMaxBlockN);
}

// Candidates for 32 rows per warp, preferred first: the widest key block within the register
// budget, two stages, then one, then 64-row tiles, then the smallest key block. One QK -> softmax ->
// PV step per block (Fa2Tuning::sub_block_n splits a block into several; measured slower than one
// step of the same keys, see perf-notes "fa2: key blocks past the budget").
std::array<Tiles, kWideCandidates> wide_tiles(const KernelSpec &spec, flashjit_backend backend) {
  const int block_n = wide_block_n(spec, backend);
  return {{{kWideBlockM, block_n, 2},
           {kWideBlockM, block_n, 1},
           {kWideSmallBlockM, block_n, 2},
           {kWideSmallBlockM, block_n, 1},
           {kWideSmallBlockM, kMmaK, 1}}};
}

int round_up(int value, int multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// Row stride in elements: an odd number of 16-byte chunks, at least `cols` wide.
int smem_stride(int cols) {
  int chunks = cols / kChunkElems;
  if (chunks % 2 == 0)
    ++chunks;
  return chunks * kChunkElems;
}

struct Layout {
  int stride_q, stride_k, stride_v, stride_o;
  int offset_q, offset_k, offset_v, offset_o;
  int bytes;
};

Layout layout_for(const Tiles &tiles, int head_dim_qk_pad, int head_dim_v) {
  Layout l{};
  l.stride_q = smem_stride(head_dim_qk_pad);
  l.stride_k = smem_stride(head_dim_qk_pad);
  l.stride_v = smem_stride(head_dim_v);
  l.stride_o = smem_stride(head_dim_v);
  // O is staged where Q was: Q is dead once the last key block has been multiplied.
  const int q_bytes = tiles.block_m * std::max(l.stride_q, l.stride_o) * kElemBytes;
  const int k_bytes = tiles.stages * tiles.block_n * l.stride_k * kElemBytes;
  const int v_bytes = tiles.stages * tiles.block_n * l.stride_v * kElemBytes;
  l.offset_q = 0;
  l.offset_o = 0;
  l.offset_k = q_bytes;
  l.offset_v = q_bytes + k_bytes;
  l.bytes = q_bytes + k_bytes + v_bytes;
  return l;
}

bool valid_head_dim(int dim) {
  return dim >= kDimAlign && dim <= kMaxHeadDim && dim % kDimAlign == 0;
}

bool valid_tuning(const Fa2Tuning &tuning, int rows_per_warp, std::string *why_not) {
  if (rows_per_warp != kRowsPerWarp && rows_per_warp != kWideRowsPerWarp) {
    *why_not = "fa2 rows_per_warp must be 16 or 32, got " + std::to_string(rows_per_warp);
    return false;
  }
  if (tuning.block_m < 0 || tuning.block_m % rows_per_warp != 0) {
    *why_not = "fa2 block_m must be a multiple of rows_per_warp, got " + std::to_string(tuning.block_m);
    return false;
  }
  if (tuning.block_n < 0 || tuning.block_n % kMmaK != 0) {
    *why_not = "fa2 block_n must be a multiple of 16, got " + std::to_string(tuning.block_n);
    return false;
  }
  if (tuning.sub_block_n < 0 || tuning.sub_block_n % kMmaK != 0) {
    *why_not = "fa2 sub_block_n must be a multiple of 16, got " + std::to_string(tuning.sub_block_n);
    return false;
  }
  if (tuning.stages < 0) {
    *why_not = "fa2 stages must be positive, got " + std::to_string(tuning.stages);
    return false;
  }
  return true;
}

// Tiles from the candidate table of the head-dim class, each field the tuning sets overriding the
// candidate's; the first result that fits the shared memory wins.
template <std::size_t N>
bool pick(const std::array<Tiles, N> &candidates, const Fa2Tuning &tuning, int head_dim_qk_pad, int head_dim_v,
          int max_smem, Tiles *tiles, Layout *layout) {
  for (Tiles candidate : candidates) {
    if (tuning.block_m > 0)
      candidate.block_m = tuning.block_m;
    if (tuning.block_n > 0) {
      candidate.block_n = tuning.block_n;
      candidate.sub_block_n = 0; // one step per tuned block unless sub_block_n says otherwise
    }
    if (tuning.stages > 0)
      candidate.stages = tuning.stages;
    if (tuning.sub_block_n > 0) {
      if (candidate.block_n % tuning.sub_block_n != 0)
        continue;
      candidate.sub_block_n = tuning.sub_block_n;
    }
    // The single-buffer schedule refills K between QK and PV: one step per block.
    if (candidate.sub_block_n <= 0 || candidate.stages < 2)
      candidate.sub_block_n = candidate.block_n;
    const Layout l = layout_for(candidate, head_dim_qk_pad, head_dim_v);
    if (l.bytes <= max_smem) {
      *tiles = candidate;
      *layout = l;
      return true;
    }
  }
  return false;
}

} // namespace

bool plan_fa2(const KernelSpec &spec, Plan *plan, std::string *why_not, flashjit_backend backend) {
  return plan_fa2_tuned(spec, Fa2Tuning{}, plan, why_not, backend);
}

bool plan_fa2_tuned(const KernelSpec &spec, const Fa2Tuning &tuning, Plan *plan, std::string *why_not,
                    flashjit_backend backend) {
  if (spec.op != Op::prefill) {
    *why_not = std::string("fa2 runs prefill only, not ") + op_name(spec.op);
    return false;
  }
  if (spec.arch.sm < kMinArch) {
    *why_not = "fa2 needs sm_80 or newer (mma.sync bf16, cp.async), got " + spec.arch.name();
    return false;
  }
  if (!valid_head_dim(spec.head_dim_qk) || !valid_head_dim(spec.head_dim_v)) {
    *why_not = "fa2 supports head dims that are multiples of 8 from 8 to 256, got " + std::to_string(spec.head_dim_qk) +
               "/" + std::to_string(spec.head_dim_v);
    return false;
  }
  if (spec.gqa_group != 0 || spec.q_len != 0) {
    *why_not = "fa2 does not pack query heads (gqa_group / q_len are decode-only)";
    return false;
  }
  if (spec.page_size < 0) {
    *why_not = "negative page size";
    return false;
  }

  const int head_dim_qk_pad = round_up(spec.head_dim_qk, kMmaK);
  const int head_dim_max = std::max(head_dim_qk_pad, spec.head_dim_v);
  // 32 rows per warp up to head dim 128; a window, softcap, varlen, paging or unaligned rows add live
  // state that spills at 120 and 128 (NVRTC sweeps), so those keep 16 rows from there.
  const int wide_max_dim = plain(spec) ? kMediumHeadDim : kFeaturedWideMaxHeadDim;
  const int default_rows = head_dim_max <= wide_max_dim ? kWideRowsPerWarp : kRowsPerWarp;
  const int rows_per_warp = tuning.rows_per_warp > 0 ? tuning.rows_per_warp : default_rows;
  if (!valid_tuning(tuning, rows_per_warp, why_not))
    return false;

  const int max_smem = max_shared_bytes_per_block(spec.arch);
  const bool wide = rows_per_warp == kWideRowsPerWarp;
  Tiles tiles{};
  Layout layout{};
  bool found = false;
  if (wide)
    found = pick(wide_tiles(spec, backend), tuning, head_dim_qk_pad, spec.head_dim_v, max_smem, &tiles, &layout);
  else if (head_dim_max <= kSmallHeadDim)
    found = pick(kSmallTiles, tuning, head_dim_qk_pad, spec.head_dim_v, max_smem, &tiles, &layout);
  else if (head_dim_max <= kMediumHeadDim)
    found = pick(kMediumTiles, tuning, head_dim_qk_pad, spec.head_dim_v, max_smem, &tiles, &layout);
  else
    found = pick(kLargeTiles, tuning, head_dim_qk_pad, spec.head_dim_v, max_smem, &tiles, &layout);
  if (!found) {
    *why_not = "no fa2 tile fits " + std::to_string(max_smem) + " bytes of shared memory";
    return false;
  }

  const int warps = tiles.block_m / rows_per_warp;
  *plan = Plan{};
  plan->variant = Variant::fa2;
  plan->entry = "fj_fa2_prefill";
  plan->block_m = tiles.block_m;
  plan->block_n = tiles.block_n;
  plan->stages = tiles.stages;
  plan->threads = warps * kWarpThreads;
  plan->smem_bytes = layout.bytes;
  plan->add("kBlockM", tiles.block_m);
  plan->add("kBlockN", tiles.block_n);
  plan->add("kStages", tiles.stages);
  plan->add("kSubBlockN", tiles.sub_block_n);
  plan->add("kWarps", warps);
  plan->add("kRowsPerWarp", rows_per_warp);
  plan->add("kHeadDimQKPad", head_dim_qk_pad);
  plan->add("kSmemStrideQ", layout.stride_q);
  plan->add("kSmemStrideK", layout.stride_k);
  plan->add("kSmemStrideV", layout.stride_v);
  plan->add("kSmemStrideO", layout.stride_o);
  plan->add("kSmemOffsetQ", layout.offset_q);
  plan->add("kSmemOffsetK", layout.offset_k);
  plan->add("kSmemOffsetV", layout.offset_v);
  plan->add("kSmemOffsetO", layout.offset_o);
  return true;
}

} // namespace flashjit
