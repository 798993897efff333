#include "runtime/tma_desc.hpp"

#include "compiler/plans/fa3_plan.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <numeric>
#include <utility>
#include <vector>

namespace flashjit {
namespace {

static_assert(sizeof(fj_tensor_map) == sizeof(CUtensorMap), "fj_tensor_map must hold a CUtensorMap");
// The device needs 64-byte aligned maps (CUDA 13 declares CUtensorMap with 128; 64 suffices).
constexpr size_t kTensorMapAlign = 64;
static_assert(alignof(fj_tensor_map) >= kTensorMapAlign, "tensor maps must be 64-byte aligned");

constexpr int kElemBytes = 2;             // fp16 / bf16
constexpr int kMapRank = 4;               // fa3 {dim, tokens, heads, batch}; decode {dim, heads, keys, batch or pages}
constexpr uint32_t kDecodePanelCols = 64; // one 128-byte swizzle span of 16-bit elements
constexpr uint64_t kTmaAddressAlign = 16;
constexpr uint64_t kTmaStrideAlign = 16;
// Share of L2 a section's K/V may fill: FA-3 uses 32 MB on a 50 MB L2. Causal and windowed walks.
constexpr double kL2SectionShare = 0.6;
// Unmasked walks: sections of about 8 MiB of K/V on the H200's 50 MiB L2. Against 0.6, run 41f-g
// (H200, bf16, three alternated rounds): d128 S4096 +0.9% (8 -> 4 pairs; 2, 3 and 6 the same), d96
// S4096 +1.6%, d80 S4096 +1.2%, S1024 d64 +1.0%, d96 +1.2%, d128 +1.6%, d192 +1.9%, d256 +1.5%; d64,
// d192 and d256 S4096 and d80 S1024 even (docs/perf-notes.md, session 40).
constexpr double kL2UnmaskedSectionShare = 0.16;
// Causal walks by pair count (kCausalSections 0): one heaviest-first section while every wave holds at
// least this many tiles of each (batch, head) pair, else L2 sections. Measured (run 28d): 8-16 pairs
// on 132 walkers (S16384) run 1.14-1.6x faster in one section, 64 (d128 S4096) 2% slower.
constexpr int kCausalOneSectionTilesPerPair = 4;
// Where no L2 section of a whole number of waves fits, the section the model of the walk prefers
// (fa3_causal_walk_balance) if it is this even, else one section. Measured (run 29b, bf16, one section
// -> the model's section): d192 S2048 486 -> 572 (22 pairs, 0.970 in the model), d256 S2048 509 -> 608
// (11, 0.978), d128 S3072 581 -> 618 (22, 0.984), d192 S4096 625 -> 656 (11, 0.963); sections the
// model puts at 0.90-0.91 lost 6-7% to a whole-wave section (d128 S4096), at 0.61-0.82 30%.
// Not for long sequences: d64 and d96 S8192 (43 m-blocks) lost 2.5% and 5% to one section with the
// model's sections (run 29c: 17 pairs at 0.968, 1 pair at 0.956), where d96 S3072 gained 2-3% with 29
// pairs at 0.951. And where the whole-wave section is less even than this, the model's if it is more
// even: d192 S1024 (33 pairs at 0.872, the model's 44 at 0.968) 423 -> 449 TFLOP/s (run 29c).
constexpr double kMinModelSectionBalance = 0.95;
constexpr int kMaxMBlocksModelSection = 32;
// Tail split: cut tiles only when the longest walk shrinks by at least this many key blocks and
// by at least 1/kTailMinSavedShareInverse of it (fa3_fill_tail).
constexpr int64_t kTailMinSavedBlocks = kFa3TailMinSavedBlocks;
constexpr int64_t kTailMinSavedShareInverse = 50;

bool fail(std::string *why_not, const std::string &reason) {
  if (why_not)
    *why_not = reason;
  return false;
}

// What a map loads and how it fills L2: the element type and the bytes promoted per miss.
struct MapFormat {
  CUtensorMapDataType type;
  CUtensorMapL2promotion promotion;
};

// A 4-D map with the 128-byte swizzle: `dims` innermost first (dims[0] contiguous elements),
// `strides` in elements for dims[1..3], box `box`. A dimension of one index may have any stride (a
// caller's zero stride there is replaced; TMA wants multiples of 16 bytes).
bool swizzled_map(const char *name, const void *ptr, const cuuint64_t (&dims)[kMapRank],
                  const int64_t (&strides)[kMapRank - 1], const cuuint32_t (&box)[kMapRank], const MapFormat &format,
                  TensorMapArgs *out, std::string *why_not) {
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  if (address % kTmaAddressAlign != 0)
    return fail(why_not, std::string(name) + ": base pointer is not 16-byte aligned (TMA)");
  cuuint64_t stride_bytes[kMapRank - 1];
  for (int i = 0; i < kMapRank - 1; ++i) {
    stride_bytes[i] = static_cast<uint64_t>(strides[i]) * kElemBytes;
    if (dims[i + 1] == 1 && stride_bytes[i] == 0)
      stride_bytes[i] = kTmaStrideAlign;
    if (stride_bytes[i] % kTmaStrideAlign != 0 || stride_bytes[i] == 0)
      return fail(why_not, std::string(name) + ": strides must be non-zero multiples of 16 bytes (TMA)");
  }
  out->data_type = format.type;
  out->rank = kMapRank;
  out->global_address = const_cast<void *>(ptr);
  std::copy(dims, dims + kMapRank, out->dims);
  std::copy(stride_bytes, stride_bytes + kMapRank - 1, out->strides);
  std::copy(box, box + kMapRank, out->box);
  std::fill(out->element_strides, out->element_strides + kMapRank, 1);
  out->interleave = CU_TENSOR_MAP_INTERLEAVE_NONE;
  out->swizzle = CU_TENSOR_MAP_SWIZZLE_128B;
  out->l2_promotion = format.promotion;
  out->oob_fill = CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE; // zeros: padded QK columns contribute 0
  return true;
}

// One fa3 operand, {dim, tokens, heads, batch}: rows of `dim` contiguous elements, `rows` tokens per
// sequence (or the packed total).
bool operand_map(const char *name, const fj_tensor_ref &ref, int dim, uint64_t rows, uint64_t heads, uint64_t batch,
                 bool varlen, uint32_t box_cols, uint32_t box_rows, const MapFormat &format, TensorMapArgs *out,
                 std::string *why_not) {
  const int64_t batch_stride = varlen ? ref.row_stride * static_cast<int64_t>(rows) : ref.batch_stride;
  return swizzled_map(name, ref.ptr, {static_cast<cuuint64_t>(dim), rows, heads, varlen ? 1 : batch},
                      {ref.row_stride, ref.head_stride, batch_stride}, {box_cols, box_rows, 1, 1}, format, out,
                      why_not);
}

// A plan's kTmaL2PromotionBytes as the driver's enum (0: none; the planner allows 0, 64, 128, 256).
CUtensorMapL2promotion l2_promotion(int64_t bytes) {
  switch (bytes) {
  case 0: return CU_TENSOR_MAP_L2_PROMOTION_NONE;
  case 64: return CU_TENSOR_MAP_L2_PROMOTION_L2_64B;
  case 128: return CU_TENSOR_MAP_L2_PROMOTION_L2_128B;
  default: return CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
  }
}

CUtensorMapDataType map_type(const KernelSpec &spec) {
  return spec.dtype == FLASHJIT_FP16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
}

bool encode_all(TensorMapEncodeTiledFn encode,
                std::initializer_list<std::pair<const TensorMapArgs *, fj_tensor_map *>> all, std::string *why_not) {
  for (const auto &[args, dst] : all) {
    const CUresult result = encode(reinterpret_cast<CUtensorMap *>(dst), args->data_type, args->rank,
                                   args->global_address, args->dims, args->strides, args->box, args->element_strides,
                                   args->interleave, args->swizzle, args->l2_promotion, args->oob_fill);
    if (result != CUDA_SUCCESS)
      return fail(why_not, "cuTensorMapEncodeTiled failed with CUresult " + std::to_string(static_cast<int>(result)));
  }
  return true;
}

} // namespace

bool fa3_tensor_map_args(const KernelSpec &spec, const Plan &plan, const fj_attention_params &p, int total_k,
                         int num_pages, Fa3TensorMaps *maps, std::string *why_not) {
  const MapFormat format{map_type(spec), l2_promotion(plan.constant("kTmaL2PromotionBytes"))};
  const auto box_cols = static_cast<uint32_t>(plan.constant("kPanelCols"));
  const auto box_rows_q = static_cast<uint32_t>(plan.constant("kTmaBoxRows"));
  const uint64_t q_rows = spec.varlen ? p.total_q : p.seqlen_q;
  if (!operand_map("q", p.q, spec.head_dim_qk, q_rows, p.heads_q, p.batch, spec.varlen, box_cols, box_rows_q, format,
                   &maps->q, why_not) ||
      !operand_map("o", p.o, spec.head_dim_v, q_rows, p.heads_q, p.batch, spec.varlen, box_cols, box_rows_q, format,
                   &maps->o, why_not))
    return false;
  if (plan.constant("kPagedGather", 0) != 0) {
    maps->has_kv = false;
    return true;
  }
  if (spec.page_size != 0) {
    // Pages {dim, page_size, heads_kv, num_pages}: a box is kPagedBoxRows keys of one page; its page
    // comes from the block table in the kernel (the batch stride is the stride between pages).
    if (num_pages < 1)
      return fail(why_not, "paged KV: num_pages must be >= 1");
    const auto box_rows = static_cast<uint32_t>(plan.constant("kPagedBoxRows"));
    const auto page_rows = static_cast<uint64_t>(spec.page_size);
    const auto pages = static_cast<uint64_t>(num_pages);
    return operand_map("k", p.k, spec.head_dim_qk, page_rows, p.heads_kv, pages, false, box_cols, box_rows, format,
                       &maps->k, why_not) &&
           operand_map("v", p.v, spec.head_dim_v, page_rows, p.heads_kv, pages, false, box_cols, box_rows, format,
                       &maps->v, why_not);
  }
  // A CTA of a pair loads (and multicasts) its share of each K/V block's rows.
  const auto box_rows_kv = static_cast<uint32_t>(plan.constant("kKVRowsPerCta", plan.block_n));
  const uint64_t k_rows = spec.varlen ? total_k : p.seqlen_k;
  return operand_map("k", p.k, spec.head_dim_qk, k_rows, p.heads_kv, p.batch, spec.varlen, box_cols, box_rows_kv,
                     format, &maps->k, why_not) &&
         operand_map("v", p.v, spec.head_dim_v, k_rows, p.heads_kv, p.batch, spec.varlen, box_cols, box_rows_kv, format,
                     &maps->v, why_not);
}

bool fa3_encode_tensor_maps(const KernelSpec &spec, const Plan &plan, int total_k, int num_pages,
                            TensorMapEncodeTiledFn encode, fj_fa3_params *params, std::string *why_not) {
  Fa3TensorMaps maps;
  if (!fa3_tensor_map_args(spec, plan, params->base, total_k, num_pages, &maps, why_not))
    return false;
  if (!maps.has_kv)
    return encode_all(encode, {{&maps.q, &params->tma_q}, {&maps.o, &params->tma_o}}, why_not);
  return encode_all(
      encode,
      {{&maps.q, &params->tma_q}, {&maps.k, &params->tma_k}, {&maps.v, &params->tma_v}, {&maps.o, &params->tma_o}},
      why_not);
}

bool decode_kv_tensor_map_args(const KernelSpec &spec, const Plan &plan, const fj_attention_params &p, int num_pages,
                               DecodeKvTensorMaps *maps, std::string *why_not) {
  const bool paged = spec.page_size > 0;
  const auto box_rows = static_cast<uint32_t>(plan.constant("kTmaBoxRows"));
  // Contiguous: a sequence's keys, then the batch; paged: a page's keys, then the pages.
  const uint64_t rows = paged ? p.paged.page_size : p.seqlen_k;
  const uint64_t outer = paged ? num_pages : p.batch;
  // The K/V stream is read once: 128-byte promotion, as the cp.async tiles' prefetch (256 bytes
  // measured 5-9% slower, docs/perf-notes.md run 22d).
  const MapFormat format{map_type(spec), CU_TENSOR_MAP_L2_PROMOTION_L2_128B};
  const auto map = [&](const char *name, const fj_tensor_ref &ref, int dim, int64_t outer_stride, TensorMapArgs *out) {
    return swizzled_map(name, ref.ptr, {static_cast<cuuint64_t>(dim), static_cast<cuuint64_t>(p.heads_kv), rows, outer},
                        {ref.head_stride, ref.row_stride, outer_stride}, {kDecodePanelCols, 1, box_rows, 1}, format,
                        out, why_not);
  };
  return map("k", p.k, spec.head_dim_qk, paged ? p.paged.page_stride_k : p.k.batch_stride, &maps->k) &&
         map("v", p.v, spec.head_dim_v, paged ? p.paged.page_stride_v : p.v.batch_stride, &maps->v);
}

bool decode_encode_tensor_maps(const KernelSpec &spec, const Plan &plan, int num_pages, TensorMapEncodeTiledFn encode,
                               fj_decode_tma_params *params, std::string *why_not) {
  DecodeKvTensorMaps maps;
  return decode_kv_tensor_map_args(spec, plan, params->base.attn, num_pages, &maps, why_not) &&
         encode_all(encode, {{&maps.k, &params->k_map}, {&maps.v, &params->v_map}}, why_not);
}

namespace {

// Pairs whose K/V fit in the L2 share (at most all of them).
int l2_section_pairs(int pairs, double pair_bytes, int l2_bytes) {
  return static_cast<int>(std::min<double>(pairs, kL2SectionShare * l2_bytes / pair_bytes));
}

// Causal tiles in L2 sections: each section runs heaviest m-block first, and the snake (a walker takes
// lane w of even waves and lane walkers - 1 - w of odd ones) evens the walkers' loads only if the
// sections' cost profile repeats in step with the waves. A section of s pairs is s * m_blocks tiles;
// when that is close to but not a multiple of the wave, the profile drifts against the waves and the
// same walkers take the heavy tiles wave after wave: at d128 S1024 (sections of 32 pairs, 256 tiles
// on 132 walkers) the SMs were busy 77% of the kernel's time against cuDNN's 92% (Nsight Compute, run
// 28f), where a model of the walk gives 0.71 of even. So the largest section of a whole number of
// waves that fits in L2 (33 pairs there: 0.99 in the model). Measured (run 28g, bf16): causal S1024
// d128 411 -> 481, d256 367 -> 468, d80 315 -> 369 TFLOP/s; S2048/S4096 even. 0 where no whole wave
// fits.
int causal_section_of_whole_waves(int m_blocks, int walkers, int fits) {
  const int step = walkers / std::gcd(walkers, std::max(m_blocks, 1)); // pairs per whole number of waves
  return step <= fits ? fits / step * step : 0;
}

// The L2 section the model of the walk prefers (fa3_causal_walk_balance): of the sizes up to the
// largest that fits (`fits`), the best balanced, the larger of equals. Each size costs the model
// O(sections * m_blocks + waves); past kModelTileBudget tiles in all, the sizes are taken at a stride.
struct ModelSection {
  int pairs = 1;
  double balance = 0;
};
constexpr int64_t kModelTileBudget = int64_t{1} << 20;
constexpr double kModelBalanceTie = 1e-3;

ModelSection causal_section_by_model(const Plan &plan, int walkers, int fits, const fj_fa3_params &params) {
  fits = std::max(fits, 1);
  const int64_t tiles = std::max<int64_t>(params.num_tiles, 1);
  const int stride = static_cast<int>(std::max<int64_t>(1, (fits * tiles + kModelTileBudget - 1) / kModelTileBudget));
  fj_fa3_params trial = params; // the candidates' section sizes, tried on a copy
  ModelSection best;
  for (int s = fits; s >= 1; s -= stride) {
    trial.heads_per_section = s;
    if (const double balance = fa3_causal_walk_balance(plan, trial, walkers); balance > best.balance + kModelBalanceTie)
      best = ModelSection{s, balance};
  }
  return best;
}

// Pairs per section of a causal walk (kCausalSections, compiler/plans/fa3_plan.cpp): `power_of_two`
// is the unmasked walk's L2 section, `fits` the most pairs whose K/V fit the L2 share. The model runs
// on a launch-cache miss, which an engine takes layer after layer (new tensors, same shape), so each
// thread keeps its last few answers by shape.
struct CausalSectionKey {
  int64_t rule, forced, drawn;
  int walkers, fits, power_of_two, pairs, m_blocks, block_m, block_n, seqlen_q, seqlen_k;
  bool operator==(const CausalSectionKey &) const = default;
};
constexpr size_t kCausalSectionMemo = 8;
thread_local std::array<std::pair<CausalSectionKey, int>, kCausalSectionMemo> causal_section_memo{};
thread_local size_t causal_section_memo_next = 0;

int causal_section(const Plan &plan, int walkers, int fits, int power_of_two, bool tiles_drawn,
                   const fj_fa3_params &params) {
  const fj_attention_params &p = params.base;
  const int pairs = p.batch * p.heads_q, m_blocks = p.num_m_blocks;
  const int64_t rule = plan.constant("kCausalSections", 0);
  const int64_t forced = plan.constant("kCausalSectionPairs", 0); // Fa3Tuning::causal_section_pairs
  // kDynamicTiles' walks; short ones may have a size of their own (kDrawnSectionPairsShortWalk).
  const int64_t drawn_pairs = plan.constant("kDrawnSectionPairs", 0);
  const bool short_walk = m_blocks <= plan.constant("kMaxMBlocksShortDrawnWalk", 0);
  const int64_t drawn = !tiles_drawn ? 0
                        : short_walk ? plan.constant("kDrawnSectionPairsShortWalk", drawn_pairs)
                                     : drawn_pairs;
  const CausalSectionKey key{rule,  forced,   drawn,        walkers,      fits,       power_of_two,
                             pairs, m_blocks, plan.block_m, plan.block_n, p.seqlen_q, p.seqlen_k};
  for (const auto &[k, section] : causal_section_memo)
    if (section > 0 && k == key)
      return section;
  const bool one_section_by_pairs = int64_t{pairs} * kCausalOneSectionTilesPerPair <= walkers;
  int section = power_of_two;
  if (forced > 0)
    section = static_cast<int>(std::min<int64_t>(forced, pairs));
  else if (drawn > 0)
    section = static_cast<int>(std::min<int64_t>(drawn, pairs));
  else if (rule == 1 || ((rule == 0 || rule == 3) && one_section_by_pairs))
    section = pairs;
  else if (rule == 3 && power_of_two < pairs)
    section = causal_section_by_model(plan, walkers, fits, params).pairs;
  else if (power_of_two < pairs) {
    if (const int whole_waves = causal_section_of_whole_waves(m_blocks, walkers, fits); whole_waves > 0) {
      section = whole_waves;
      fj_fa3_params trial = params;
      trial.heads_per_section = whole_waves;
      if (const double even = fa3_causal_walk_balance(plan, trial, walkers);
          rule == 0 && even < kMinModelSectionBalance)
        if (const ModelSection model = causal_section_by_model(plan, walkers, fits, params); model.balance > even)
          section = model.pairs;
    } else if (rule == 0) {
      const ModelSection model = causal_section_by_model(plan, walkers, fits, params);
      section = model.balance >= kMinModelSectionBalance && m_blocks <= kMaxMBlocksModelSection ? model.pairs : pairs;
    } // rule 2: the power-of-two section
  }
  causal_section_memo[causal_section_memo_next++ % kCausalSectionMemo] = {key, section};
  return section;
}

} // namespace

double fa3_causal_walk_balance(const Plan &plan, const fj_fa3_params &params, int walkers) {
  const fj_attention_params &p = params.base;
  const int m_blocks = std::max(p.num_m_blocks, 1), pairs = p.batch * p.heads_q;
  const int section_pairs = std::max(params.heads_per_section, 1), block_n = std::max(plan.block_n, 1);
  const int key_blocks = (p.seqlen_k + block_n - 1) / block_n;
  walkers = std::max(walkers, 1);
  // The tiles of one (section, m-block) share a cost and lie on consecutive lanes: add it to each
  // run of lanes (split where a wave ends; odd waves run the snake backwards) through a difference
  // array, so the model costs O(sections * m_blocks + waves), not O(tiles).
  std::vector<double> step(walkers + 1, 0.0);
  auto add_run = [&](int wave, int lane, int count, double cost) {
    const int first = wave % 2 == 0 ? lane : walkers - lane - count;
    step[first] += cost;
    step[first + count] -= cost;
  };
  int64_t index = 0;
  const int64_t tiles = params.num_tiles;
  for (int section_start = 0; section_start < pairs && index < tiles; section_start += section_pairs) {
    const int pairs_here = std::min(section_pairs, pairs - section_start);
    for (int m_order = 0; m_order < m_blocks && index < tiles; ++m_order) {
      const int m_block = m_blocks - 1 - m_order;
      const int row_hi = std::min((m_block + 1) * plan.block_m, p.seqlen_q) - 1;
      const int last_col = row_hi + p.seqlen_k - p.seqlen_q;
      const double cost = (last_col < 0 ? 0 : std::min(key_blocks, last_col / block_n + 1)) + 1.0;
      for (int64_t left = std::min<int64_t>(pairs_here, tiles - index); left > 0;) {
        const int wave = static_cast<int>(index / walkers), lane = static_cast<int>(index % walkers);
        const int count = static_cast<int>(std::min<int64_t>(left, walkers - lane));
        add_run(wave, lane, count, cost);
        index += count;
        left -= count;
      }
    }
  }
  double running = 0, total = 0, top = 0;
  for (int w = 0; w < walkers; ++w) {
    running += step[w];
    total += running;
    top = std::max(top, running);
  }
  return top > 0 ? total / walkers / top : 1.0;
}

int fa3_fill_schedule(const KernelSpec &spec, const Plan &plan, int num_sms, int l2_bytes, fj_fa3_params *params,
                      int resident_clusters, bool tiles_drawn) {
  fj_attention_params &p = params->base;
  const int m_blocks = (p.seqlen_q + plan.block_m - 1) / plan.block_m; // varlen: seqlen_q is the max
  const int pairs = p.batch * p.heads_q;
  const int cluster = std::max(plan.cluster_m, 1);
  p.num_m_blocks = m_blocks;
  // Work units: `cluster` adjacent m-blocks of one (batch, head), one per CTA of a cluster.
  params->num_tiles = (m_blocks + cluster - 1) / cluster * pairs;
  // K+V bytes of one (batch, head) pair; query heads of a GQA group share theirs.
  const double pair_bytes = static_cast<double>(std::max(p.seqlen_k, 1)) * (spec.head_dim_qk + spec.head_dim_v) *
                            kElemBytes / std::max(p.group, 1);
  int walkers = num_sms / cluster;
  if (resident_clusters > 0)
    walkers = std::min(walkers, resident_clusters);
  walkers = std::max(1, std::min(walkers, params->num_tiles));
  const bool masked = spec.causal || spec.local;
  const double section_budget = (masked ? kL2SectionShare : kL2UnmaskedSectionShare) * l2_bytes;
  int section = 1;
  while (section * 2 <= pairs && (section * 2) * pair_bytes <= section_budget)
    section *= 2;
  if (const int64_t forced = plan.constant("kSectionPairs", 0); forced > 0) // Fa3Tuning::section_pairs (an A/B)
    section = static_cast<int>(std::min<int64_t>(forced, pairs));
  // Causal: one section where each wave holds several tiles of every pair, so the whole grid runs
  // heaviest-first (m-block descending) and CTAs of a pair walk the same KV blocks in near lock-step,
  // which keeps them in L2 anyway (kCausalSections, compiler/plans/fa3_plan.cpp).
  if (spec.causal)
    section =
        causal_section(plan, walkers, l2_section_pairs(pairs, pair_bytes, l2_bytes), section, tiles_drawn, *params);
  params->heads_per_section = std::max(section, 1);
  fa3_fill_tail(plan, walkers, params);
  return cluster * walkers;
}

void fa3_fill_tail(const Plan &plan, int walkers, fj_fa3_params *params) {
  params->tail_first_unit = params->tail_units = params->tail_blocks_per_walker = params->tail_blocks_per_unit = 0;
  if (plan.constant("kTailSplit", 0) == 0)
    return;
  // Units of equal cost (the planner allows the split only then): full waves stay whole; the last
  // full wave and the partial one (walkers + rest units) are cut evenly by key blocks. Then every
  // walker's share is at least one unit, so a unit is cut at most once, between two walkers.
  const int units = params->num_tiles;
  const int full_waves = units / walkers;
  const int rest = units % walkers;
  if (full_waves == 0 || rest == 0)
    return; // nothing to even out, or fewer units than walkers (a unit would be cut twice)
  const int blocks_per_unit = (params->base.seqlen_k + plan.block_n - 1) / plan.block_n;
  if (blocks_per_unit == 0)
    return; // no keys: every tile is written empty
  const int64_t tail_units = walkers + rest;
  const int64_t blocks_per_walker = (tail_units * blocks_per_unit + walkers - 1) / walkers;
  // A cut tile costs a state store, an arrival and a merge: worth it only when the longest walk
  // shrinks by enough (session 10: d128 S1024 saves 3 of 128 blocks and runs 4.4% slower; the rows
  // that gain save 12-24 of 400-700).
  const int64_t whole_walk = static_cast<int64_t>(full_waves + 1) * blocks_per_unit;
  const int64_t saved = 2 * blocks_per_unit - blocks_per_walker;
  if (saved < kTailMinSavedBlocks || saved * kTailMinSavedShareInverse < whole_walk)
    return;
  params->tail_first_unit = (full_waves - 1) * walkers;
  params->tail_units = static_cast<int>(tail_units);
  params->tail_blocks_per_unit = blocks_per_unit;
  params->tail_blocks_per_walker = static_cast<int>(blocks_per_walker);
}

Fa3WorkspaceLayout fa3_workspace_layout(const Plan &plan, int walkers) {
  Fa3WorkspaceLayout layout;
  if (plan.constant("kDynamicTiles", 0) != 0) { // the planner never pairs it with the tail split
    layout.counter_bytes = layout.partials_offset = layout.total_bytes = sizeof(fj_i32);
    return layout;
  }
  if (plan.constant("kTailSplit", 0) == 0)
    return layout;
  constexpr size_t kAlign = 256;
  const size_t cluster = std::max(plan.cluster_m, 1);
  const size_t counter_bytes = static_cast<size_t>(walkers) * cluster * sizeof(fj_i32);
  layout.partials_offset = (counter_bytes + kAlign - 1) / kAlign * kAlign;
  layout.counter_bytes = counter_bytes;
  layout.total_bytes =
      layout.partials_offset + static_cast<size_t>(walkers) * static_cast<size_t>(plan.constant("kTailPieces")) *
                                   cluster * static_cast<size_t>(plan.constant("kTailSlotFloats")) * sizeof(float);
  return layout;
}

} // namespace flashjit
