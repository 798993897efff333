// Host-only tests of the fa3 TMA descriptor arguments, persistent schedule and plan, and of the
// decode kernel's K/V maps (no GPU).
#include "compiler/planner.hpp"
#include "compiler/plans/fa3_plan.hpp"
#include "runtime/tma_desc.hpp"
#include "tests/compile/compile_matrix.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

namespace flashjit {
namespace {

constexpr int kElem = 2;
constexpr int kSwizzleAtom = 1024;

KernelSpec fa3_spec(int dqk, int dv, bool causal = false, bool varlen = false) {
  KernelSpec spec;
  spec.arch = Arch{90, true};
  spec.dtype = FLASHJIT_BF16;
  spec.head_dim_qk = dqk;
  spec.head_dim_v = dv;
  spec.causal = causal;
  spec.varlen = varlen;
  return spec;
}

Plan fa3_plan(const KernelSpec &spec) {
  Plan plan;
  std::string why;
  EXPECT_TRUE(plan_fa3(spec, &plan, &why)) << why;
  return plan;
}

// The planner's tile walked in the snake's fixed order: causal plans draw their tiles by default
// (kDynamicTiles), and the snake's section rules below are for the fixed order.
Fa3Tuning snake_tuning() {
  Fa3Tuning tuning;
  tuning.dynamic_tiles = 0;
  return tuning;
}
Plan fa3_snake_plan(const KernelSpec &spec) {
  Plan plan;
  std::string why;
  EXPECT_TRUE(plan_fa3_tuned(spec, snake_tuning(), &plan, &why)) << why;
  return plan;
}

// Contiguous [batch, tokens, heads, dim] operands at 16-byte aligned fake addresses.
fj_attention_params batch_params(int batch, int sq, int sk, int hq, int hkv, int dqk, int dv) {
  fj_attention_params p;
  std::memset(&p, 0, sizeof p);
  p.q = {reinterpret_cast<const void *>(0x10000), (fj_i64)sq * hq * dqk, (fj_i64)hq * dqk, dqk};
  p.k = {reinterpret_cast<const void *>(0x20000), (fj_i64)sk * hkv * dqk, (fj_i64)hkv * dqk, dqk};
  p.v = {reinterpret_cast<const void *>(0x30000), (fj_i64)sk * hkv * dv, (fj_i64)hkv * dv, dv};
  p.o = {reinterpret_cast<const void *>(0x40000), (fj_i64)sq * hq * dv, (fj_i64)hq * dv, dv};
  p.batch = batch;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.heads_q = hq;
  p.heads_kv = hkv;
  p.group = hq / hkv;
  return p;
}

TEST(Fa3TmaDesc, BatchModeD128) {
  const KernelSpec spec = fa3_spec(128, 128);
  const Plan plan = fa3_plan(spec);
  const fj_attention_params p = batch_params(2, 1000, 777, 8, 2, 128, 128);
  Fa3TensorMaps maps;
  std::string why;
  ASSERT_TRUE(fa3_tensor_map_args(spec, plan, p, 0, 0, &maps, &why)) << why;
  EXPECT_EQ(maps.q.rank, 4u);
  EXPECT_EQ(maps.q.data_type, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16);
  EXPECT_EQ(maps.q.dims[0], 128u);
  EXPECT_EQ(maps.q.dims[1], 1000u);
  EXPECT_EQ(maps.q.dims[2], 8u);
  EXPECT_EQ(maps.q.dims[3], 2u);
  EXPECT_EQ(maps.q.strides[0], 8u * 128 * kElem);
  EXPECT_EQ(maps.q.strides[1], 128u * kElem);
  EXPECT_EQ(maps.q.strides[2], 1000u * 8 * 128 * kElem);
  EXPECT_EQ(maps.q.box[0], 64u); // one 128-byte swizzle panel
  EXPECT_EQ(maps.q.box[1], static_cast<uint32_t>(plan.constant("kTmaBoxRows")));
  EXPECT_EQ(maps.q.box[2], 1u);
  EXPECT_EQ(maps.q.swizzle, CU_TENSOR_MAP_SWIZZLE_128B);
  EXPECT_EQ(maps.q.oob_fill, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  EXPECT_EQ(maps.k.dims[1], 777u);
  EXPECT_EQ(maps.k.dims[2], 2u);
  // d128 non-causal runs in CTA pairs: each CTA loads (and multicasts) half of a K/V block's rows.
  ASSERT_EQ(plan.cluster_m, 2);
  EXPECT_EQ(maps.k.box[1], static_cast<uint32_t>(plan.block_n / 2));
  EXPECT_EQ(maps.v.box[1], static_cast<uint32_t>(plan.block_n / 2));
  const KernelSpec causal = fa3_spec(128, 128, true);
  Fa3TensorMaps causal_maps;
  ASSERT_TRUE(fa3_tensor_map_args(causal, fa3_plan(causal), p, 0, 0, &causal_maps, &why)) << why;
  EXPECT_EQ(causal_maps.k.box[1], static_cast<uint32_t>(fa3_plan(causal).block_n));
  EXPECT_EQ(maps.o.dims[1], 1000u);
  EXPECT_EQ(maps.o.global_address, p.o.ptr);
  for (const TensorMapArgs *m : {&maps.q, &maps.k, &maps.v, &maps.o})
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(m->element_strides[i], 1u);
}

TEST(Fa3TmaDesc, OddHeadDimKeepsRealExtentAndDifferentV) {
  // qk 192 / v 128: each map carries its own real extent.
  const KernelSpec spec = fa3_spec(192, 128);
  const Plan plan = fa3_plan(spec);
  fj_attention_params p = batch_params(1, 64, 64, 4, 4, 192, 128);
  Fa3TensorMaps maps;
  ASSERT_TRUE(fa3_tensor_map_args(spec, plan, p, 0, 0, &maps, nullptr));
  EXPECT_EQ(maps.q.dims[0], 192u);
  EXPECT_EQ(maps.k.dims[0], 192u);
  EXPECT_EQ(maps.v.dims[0], 128u);
  EXPECT_EQ(maps.o.dims[0], 128u);

  // d80: the box is a whole 64-column panel; columns past 80 are out of bounds -> zero-filled.
  const KernelSpec spec80 = fa3_spec(80, 80);
  const Plan plan80 = fa3_plan(spec80);
  p = batch_params(1, 64, 64, 4, 4, 80, 80);
  ASSERT_TRUE(fa3_tensor_map_args(spec80, plan80, p, 0, 0, &maps, nullptr));
  EXPECT_EQ(maps.q.dims[0], 80u);
  EXPECT_EQ(maps.q.box[0], 64u);
  EXPECT_EQ(plan80.constant("kPanelsQK"), 2);
  EXPECT_EQ(plan80.constant("kKStepsQK"), 5); // the reduction pads only to 80 = 5 x 16
}

TEST(Fa3TmaDesc, VarlenUsesPackedRows) {
  const KernelSpec spec = fa3_spec(64, 64, false, true);
  const Plan plan = fa3_plan(spec);
  fj_attention_params p = batch_params(3, 300, 400, 4, 1, 64, 64);
  p.total_q = 555;
  Fa3TensorMaps maps;
  ASSERT_TRUE(fa3_tensor_map_args(spec, plan, p, 999, 0, &maps, nullptr));
  EXPECT_EQ(maps.q.dims[1], 555u);
  EXPECT_EQ(maps.q.dims[3], 1u);
  EXPECT_EQ(maps.k.dims[1], 999u);
  EXPECT_EQ(maps.k.dims[2], 1u);
  EXPECT_EQ(maps.v.dims[3], 1u);
  EXPECT_EQ(maps.o.dims[1], 555u);
}

// Paged K/V (tuning paged=1): {dim, page_size, heads_kv, num_pages} with the page stride as the outer
// stride, in either page layout ([page, key, head, dim] or FlashInfer's [page, head, key, dim]),
// boxes of kPagedBoxRows keys; Q and O keep their batch (or packed) maps.
TEST(Fa3TmaDesc, PagedKvMapsSpanThePages) {
  KernelSpec spec = fa3_spec(128, 128, true);
  spec.page_size = 64;
  Fa3Tuning paged;
  paged.paged = 1;
  Plan plan;
  std::string why;
  ASSERT_TRUE(plan_fa3_tuned(spec, paged, &plan, &why)) << why;
  const int box_rows = static_cast<int>(plan.constant("kPagedBoxRows"));
  ASSERT_GE(box_rows, 8);
  constexpr int kPages = 37, kHeadsKv = 2, kDim = 128;
  fj_attention_params p = batch_params(2, 300, 700, 8, kHeadsKv, kDim, kDim);
  for (bool head_major : {false, true}) {
    const fj_i64 key_stride = head_major ? kDim : kHeadsKv * kDim;
    const fj_i64 head_stride = head_major ? 64 * kDim : kDim;
    for (fj_tensor_ref *ref : {&p.k, &p.v})
      *ref = {ref->ptr, (fj_i64)64 * kHeadsKv * kDim, key_stride, head_stride}; // {ptr, page, key, head}
    Fa3TensorMaps maps;
    ASSERT_TRUE(fa3_tensor_map_args(spec, plan, p, 0, kPages, &maps, &why)) << why;
    for (const TensorMapArgs *m : {&maps.k, &maps.v}) {
      EXPECT_EQ(m->dims[0], 128u);
      EXPECT_EQ(m->dims[1], 64u);
      EXPECT_EQ(m->dims[2], 2u);
      EXPECT_EQ(m->dims[3], static_cast<cuuint64_t>(kPages));
      EXPECT_EQ(m->strides[0], static_cast<cuuint64_t>(key_stride * kElem));
      EXPECT_EQ(m->strides[1], static_cast<cuuint64_t>(head_stride * kElem));
      EXPECT_EQ(m->strides[2], static_cast<cuuint64_t>(64 * kHeadsKv * kDim * kElem));
      EXPECT_EQ(m->box[0], 64u);
      EXPECT_EQ(m->box[1], static_cast<cuuint32_t>(box_rows));
      EXPECT_EQ(m->swizzle, CU_TENSOR_MAP_SWIZZLE_128B);
    }
    EXPECT_EQ(maps.q.dims[1], 300u);
    EXPECT_EQ(maps.q.dims[3], 2u);
  }
  Fa3TensorMaps maps;
  EXPECT_FALSE(fa3_tensor_map_args(spec, plan, p, 0, 0, &maps, &why));
  EXPECT_NE(why.find("num_pages"), std::string::npos) << why;
}

// The maps' L2 promotion is the plan's (kTmaL2PromotionBytes, Fa3Tuning::l2_promotion); a value
// that is not one of the driver's sizes is refused by the planner.
TEST(Fa3TmaDesc, L2PromotionFollowsThePlan) {
  const KernelSpec spec = fa3_spec(128, 128);
  const fj_attention_params p = batch_params(1, 256, 256, 2, 2, 128, 128);
  Fa3TensorMaps maps;
  std::string why;
  ASSERT_TRUE(fa3_tensor_map_args(spec, fa3_plan(spec), p, 0, 0, &maps, &why)) << why;
  EXPECT_EQ(maps.k.l2_promotion, CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
  for (const auto &[bytes, promotion] :
       {std::pair{0, CU_TENSOR_MAP_L2_PROMOTION_NONE}, std::pair{64, CU_TENSOR_MAP_L2_PROMOTION_L2_64B},
        std::pair{128, CU_TENSOR_MAP_L2_PROMOTION_L2_128B}}) {
    Fa3Tuning tuning;
    tuning.l2_promotion = bytes;
    Plan plan;
    ASSERT_TRUE(plan_fa3_tuned(spec, tuning, &plan, &why)) << why;
    ASSERT_TRUE(fa3_tensor_map_args(spec, plan, p, 0, 0, &maps, &why)) << why;
    for (const TensorMapArgs *map : {&maps.q, &maps.k, &maps.v, &maps.o})
      EXPECT_EQ(map->l2_promotion, promotion) << bytes;
  }
  Fa3Tuning bad;
  bad.l2_promotion = 32;
  Plan plan;
  EXPECT_FALSE(plan_fa3_tuned(spec, bad, &plan, &why));
  EXPECT_NE(why.find("l2_promotion"), std::string::npos) << why;
}

TEST(Fa3TmaDesc, RejectsUnalignedLayouts) {
  const KernelSpec spec = fa3_spec(128, 128);
  const Plan plan = fa3_plan(spec);
  fj_attention_params p = batch_params(1, 64, 64, 1, 1, 128, 128);
  Fa3TensorMaps maps;
  std::string why;
  p.k.row_stride = 130; // 260 bytes: not a multiple of 16
  EXPECT_FALSE(fa3_tensor_map_args(spec, plan, p, 0, 0, &maps, &why));
  EXPECT_NE(why.find("k:"), std::string::npos);
  p = batch_params(1, 64, 64, 1, 1, 128, 128);
  p.v.ptr = reinterpret_cast<const void *>(0x30008);
  EXPECT_FALSE(fa3_tensor_map_args(spec, plan, p, 0, 0, &maps, &why));
  EXPECT_NE(why.find("v:"), std::string::npos);
}

std::vector<TensorMapArgs> g_encoded;
CUresult fake_encode(CUtensorMap *, CUtensorMapDataType type, cuuint32_t rank, void *address, const cuuint64_t *dims,
                     const cuuint64_t *strides, const cuuint32_t *box, const cuuint32_t *, CUtensorMapInterleave,
                     CUtensorMapSwizzle swizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  TensorMapArgs a;
  a.data_type = type;
  a.rank = rank;
  a.global_address = address;
  std::copy(dims, dims + rank, a.dims);
  std::copy(strides, strides + rank - 1, a.strides);
  std::copy(box, box + rank, a.box);
  a.swizzle = swizzle;
  g_encoded.push_back(a);
  return CUDA_SUCCESS;
}
CUresult failing_encode(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *, const cuuint64_t *,
                        const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                        CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  return CUDA_ERROR_INVALID_VALUE;
}

TEST(Fa3TmaDesc, EncodesFourMapsThroughTheDriverPointer) {
  const KernelSpec spec = fa3_spec(128, 128);
  const Plan plan = fa3_plan(spec);
  fj_fa3_params params;
  std::memset(&params, 0, sizeof params);
  params.base = batch_params(1, 128, 128, 2, 2, 128, 128);
  g_encoded.clear();
  std::string why;
  ASSERT_TRUE(fa3_encode_tensor_maps(spec, plan, 0, 0, fake_encode, &params, &why)) << why;
  ASSERT_EQ(g_encoded.size(), 4u);
  EXPECT_EQ(g_encoded[0].global_address, params.base.q.ptr);
  EXPECT_EQ(g_encoded[3].global_address, params.base.o.ptr);
  EXPECT_FALSE(fa3_encode_tensor_maps(spec, plan, 0, 0, failing_encode, &params, &why));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(&params.tma_q) % 64, 0u);
}

// A paged gather (pages of one key) reads K/V by cp.async: Q's and O's maps only; K's and V's
// stay as they were (the kernel does not touch them).
TEST(Fa3TmaDesc, GatheredPagesEncodeOnlyQAndO) {
  KernelSpec spec = fa3_spec(128, 128, true);
  spec.page_size = 1;
  Fa3Tuning paged;
  paged.paged = 1;
  Plan plan;
  std::string why;
  ASSERT_TRUE(plan_fa3_tuned(spec, paged, &plan, &why)) << why;
  ASSERT_EQ(plan.constant("kPagedGather"), 1);
  fj_fa3_params params;
  std::memset(&params, 0, sizeof params);
  params.base = batch_params(2, 300, 700, 8, 2, 128, 128);
  std::memset(&params.tma_k, 0xab, sizeof params.tma_k);
  const fj_tensor_map untouched = params.tma_k;
  Fa3TensorMaps maps;
  ASSERT_TRUE(fa3_tensor_map_args(spec, plan, params.base, 0, 5, &maps, &why)) << why;
  EXPECT_FALSE(maps.has_kv);
  g_encoded.clear();
  ASSERT_TRUE(fa3_encode_tensor_maps(spec, plan, 0, 5, fake_encode, &params, &why)) << why;
  ASSERT_EQ(g_encoded.size(), 2u);
  EXPECT_EQ(g_encoded[0].global_address, params.base.q.ptr);
  EXPECT_EQ(g_encoded[1].global_address, params.base.o.ptr);
  EXPECT_EQ(std::memcmp(&params.tma_k, &untouched, sizeof untouched), 0);
}

// A decode spec on sm_90a: GQA 4, one query token.
KernelSpec decode_tma_spec(int dqk, int dv, int page_size) {
  KernelSpec spec = testing::decode_spec(Arch{90, true}, dqk, FLASHJIT_BF16, 4, 1, page_size);
  spec.head_dim_v = dv;
  return spec;
}

Plan decode_tma_plan(const KernelSpec &spec) {
  Plan plan;
  std::string why;
  EXPECT_TRUE(plan_decode(spec, &plan, &why)) << why;
  EXPECT_EQ(plan.constant("kTmaKv"), 1) << kernel_name(spec, plan);
  return plan;
}

// Contiguous: {dim, heads_kv, keys, batch}, a whole tile per box, the caller's strides in bytes
// (head-major K here, token-major V: the map follows either).
TEST(DecodeTmaDesc, ContiguousMapsFollowTheStrides) {
  const KernelSpec spec = decode_tma_spec(192, 128, 0);
  const Plan plan = decode_tma_plan(spec);
  fj_attention_params p = batch_params(3, 1, 1000, 8, 2, 192, 128);
  p.k.head_stride = 1000 * 192; // [batch, heads, keys, dim]
  p.k.row_stride = 192;
  p.k.batch_stride = 2 * 1000 * 192;
  DecodeKvTensorMaps maps;
  std::string why;
  ASSERT_TRUE(decode_kv_tensor_map_args(spec, plan, p, 0, &maps, &why)) << why;
  const cuuint64_t k_dims[] = {192, 2, 1000, 3}, v_dims[] = {128, 2, 1000, 3};
  const cuuint64_t k_strides[] = {1000u * 192 * kElem, 192u * kElem, 2u * 1000 * 192 * kElem};
  const cuuint64_t v_strides[] = {128u * kElem, 2u * 128 * kElem, 1000u * 2 * 128 * kElem};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(maps.k.dims[i], k_dims[i]) << i;
    EXPECT_EQ(maps.v.dims[i], v_dims[i]) << i;
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(maps.k.strides[i], k_strides[i]) << i;
    EXPECT_EQ(maps.v.strides[i], v_strides[i]) << i;
  }
  const cuuint32_t box[] = {64, 1, static_cast<cuuint32_t>(plan.block_n), 1};
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(maps.k.box[i], box[i]) << i;
  EXPECT_EQ(maps.k.swizzle, CU_TENSOR_MAP_SWIZZLE_128B);
  EXPECT_EQ(maps.v.data_type, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16);
}

// Paged: {dim, heads_kv, page_size, num_pages} with the page strides, 16-key boxes; a batch of one
// may carry a zero batch stride, which TMA would refuse, and a misaligned pool is named.
TEST(DecodeTmaDesc, PagedMapsAddressPages) {
  const KernelSpec spec = decode_tma_spec(128, 128, 64);
  const Plan plan = decode_tma_plan(spec);
  fj_attention_params p = batch_params(1, 1, 64, 32, 8, 128, 128);
  p.paged.page_size = 64;
  p.paged.page_stride_k = p.paged.page_stride_v = 64 * 8 * 128;
  DecodeKvTensorMaps maps;
  std::string why;
  ASSERT_TRUE(decode_kv_tensor_map_args(spec, plan, p, 500, &maps, &why)) << why;
  EXPECT_EQ(maps.k.dims[2], 64u);
  EXPECT_EQ(maps.k.dims[3], 500u);
  EXPECT_EQ(maps.k.strides[2], 64u * 8 * 128 * kElem);
  EXPECT_EQ(maps.v.box[2], 16u);
  EXPECT_EQ(plan.constant("kTmaBoxRows"), 16);

  const KernelSpec contiguous = decode_tma_spec(128, 128, 0);
  fj_attention_params one = batch_params(1, 1, 4096, 32, 8, 128, 128);
  one.k.batch_stride = one.v.batch_stride = 0;
  ASSERT_TRUE(decode_kv_tensor_map_args(contiguous, decode_tma_plan(contiguous), one, 0, &maps, &why)) << why;
  EXPECT_EQ(maps.k.strides[2] % 16, 0u);
  EXPECT_NE(maps.k.strides[2], 0u);

  p.v.ptr = reinterpret_cast<const void *>(0x30008);
  EXPECT_FALSE(decode_kv_tensor_map_args(spec, plan, p, 500, &maps, &why));
  EXPECT_NE(why.find("v:"), std::string::npos) << why;
}

TEST(DecodeTmaDesc, EncodesBothMapsAfterTheParameters) {
  const KernelSpec spec = decode_tma_spec(128, 128, 16);
  const Plan plan = decode_tma_plan(spec);
  fj_decode_tma_params params;
  std::memset(&params, 0, sizeof params);
  params.base.attn = batch_params(2, 1, 64, 8, 2, 128, 128);
  params.base.attn.paged.page_size = 16;
  params.base.attn.paged.page_stride_k = params.base.attn.paged.page_stride_v = 16 * 2 * 128;
  g_encoded.clear();
  std::string why;
  ASSERT_TRUE(decode_encode_tensor_maps(spec, plan, 40, fake_encode, &params, &why)) << why;
  ASSERT_EQ(g_encoded.size(), 2u);
  EXPECT_EQ(g_encoded[0].global_address, params.base.attn.k.ptr);
  EXPECT_EQ(g_encoded[1].global_address, params.base.attn.v.ptr);
  EXPECT_EQ(g_encoded[1].dims[3], 40u);
  EXPECT_FALSE(decode_encode_tensor_maps(spec, plan, 40, failing_encode, &params, &why));
  // The kernel reads the maps right after fj_decode_params, 64-byte aligned.
  EXPECT_EQ(offsetof(fj_decode_tma_params, k_map) % 64, 0u);
  EXPECT_EQ(offsetof(fj_decode_tma_params, k_map), (sizeof(fj_decode_params) + 63) / 64 * 64);
}

TEST(Fa3Schedule, TilesSectionsAndGrid) {
  const KernelSpec spec = fa3_spec(128, 128);
  const Plan plan = fa3_plan(spec);
  fj_fa3_params params;
  std::memset(&params, 0, sizeof params);
  params.base = batch_params(4, 4096, 4096, 16, 16, 128, 128);
  const int grid = fa3_fill_schedule(spec, plan, 132, 50 * 1024 * 1024, &params);
  EXPECT_EQ(params.base.num_m_blocks, 32);
  // CTA pairs: a work unit is two m-blocks, the grid 66 clusters of 2.
  ASSERT_EQ(plan.cluster_m, 2);
  EXPECT_EQ(params.num_tiles, 16 * 64);
  EXPECT_EQ(grid, 132);
  params.base = batch_params(1, 1100, 1100, 3, 1, 128, 128); // 9 m-blocks: the last pair has one CTA of rows
  EXPECT_EQ(fa3_fill_schedule(spec, plan, 133, 50 * 1024 * 1024, &params), 2 * 15); // 5 units x 3 heads
  EXPECT_EQ(params.num_tiles, 15);
  params.base = batch_params(4, 4096, 4096, 16, 16, 128, 128);
  EXPECT_EQ(fa3_fill_schedule(spec, plan, 133, 50 * 1024 * 1024, &params), 132) << "whole clusters only";
  EXPECT_EQ(fa3_fill_schedule(spec, plan, 132, 50 * 1024 * 1024, &params, 60), 120) << "only resident clusters";
  EXPECT_EQ(fa3_fill_schedule(spec, plan, 132, 50 * 1024 * 1024, &params, 80), 132);
  // 4096 x 256 x 2 B = 2 MiB per head: unmasked, a power-of-two section within 16% of L2 (8 MiB).
  EXPECT_EQ(params.heads_per_section, 4);
  params.base = batch_params(16, 1024, 1024, 16, 16, 128, 128); // 0.5 MiB per head
  fa3_fill_schedule(spec, plan, 132, 50 * 1024 * 1024, &params);
  EXPECT_EQ(params.heads_per_section, 16);
  KernelSpec windowed = spec;
  windowed.local = true; // masked walks keep sections within 60% of L2 (30 MiB: 32 pairs of 0.5 MiB)
  fa3_fill_schedule(windowed, fa3_plan(windowed), 132, 50 * 1024 * 1024, &params);
  EXPECT_EQ(params.heads_per_section, 32);
  params.base = batch_params(4, 4096, 4096, 16, 16, 128, 128);
  const KernelSpec causal = fa3_spec(128, 128, true);
  fa3_fill_schedule(causal, fa3_snake_plan(causal), 132, 50 * 1024 * 1024, &params);
  EXPECT_EQ(params.heads_per_section, 14); // causal, 64 pairs: L2 sections, the model's (CausalSectionsByRule)
  fa3_fill_schedule(causal, fa3_plan(causal), 132, 50 * 1024 * 1024, &params);
  EXPECT_EQ(params.heads_per_section, 16) << "drawn tiles (the default): sections of 16 pairs";
  params.base = batch_params(1, 100, 100, 1, 1, 128, 128);
  EXPECT_EQ(fa3_fill_schedule(spec, plan, 132, 50 * 1024 * 1024, &params), 2) << "one pair";
  EXPECT_EQ(fa3_fill_schedule(causal, fa3_plan(causal), 132, 50 * 1024 * 1024, &params), 1);
  EXPECT_EQ(params.heads_per_section, 1) << "no more pairs than there are";
}

// Causal walk orders (kCausalSections, FLASHJIT_FA3_TUNING=causal_sections): 0 (the default) one
// heaviest-first section over every (batch, head) pair where each wave holds four tiles or more of
// every pair, else L2 sections; 1 one section always; 2 L2 sections always. Causal L2 sections hold a
// whole number of waves of tiles where that fits in L2 (else a power of two of pairs, as unmasked
// tiles). Unmasked plans carry no rule.
TEST(Fa3Schedule, CausalSectionsByRule) {
  const KernelSpec causal = fa3_spec(128, 128, true);
  EXPECT_EQ(fa3_plan(fa3_spec(128, 128)).constant("kCausalSections", -1), -1);
  EXPECT_EQ(fa3_snake_plan(causal).constant("kCausalSections", -1), 0);
  struct Case {
    int rule, batch, seqlen, heads;
    int heads_per_section;
  };
  // M = 192, 132 walkers (causal: single CTAs). 1024 keys: 512 KiB of K/V per pair, 60 fit in 60% of
  // 50 MiB; 6 m-blocks, so 22 pairs are a whole wave: 44 (rule 2), less even than 0.95 in the model,
  // which prefers 33 (rule 0). 4096 keys: 2 MiB, 15 fit; 22 m-blocks, 6
  // pairs a wave: 12, which the model of the walk puts below 0.95 of even, so rule 0 takes the model's
  // 14. 16384 keys: 8 MiB, 3 fit; 86 m-blocks need 66 pairs: no whole wave fits, so one section under
  // rule 0 and two pairs (a power of two) under rule 2.
  for (const Case &c :
       {Case{0, 16, 1024, 16, 33}, Case{1, 16, 1024, 16, 256}, Case{2, 16, 1024, 16, 44}, Case{0, 1, 16384, 16, 16},
        Case{1, 1, 16384, 16, 16}, Case{2, 1, 16384, 16, 2}, Case{0, 1, 16384, 33, 33}, Case{0, 1, 16384, 34, 34},
        Case{0, 4, 4096, 16, 14}, Case{2, 4, 4096, 16, 12}, Case{1, 4, 4096, 16, 64}, Case{0, 2, 1024, 16, 32}}) {
    Fa3Tuning tuning = snake_tuning();
    tuning.causal_sections = c.rule;
    Plan plan;
    std::string why;
    ASSERT_TRUE(plan_fa3_tuned(causal, tuning, &plan, &why)) << why;
    EXPECT_EQ(plan.constant("kCausalSections"), c.rule);
    const bool named = kernel_name(causal, plan).find(".cs" + std::to_string(c.rule)) != std::string::npos;
    EXPECT_EQ(named, c.rule != 0) << kernel_name(causal, plan) << ": kernels that walk differently differ in name";
    fj_fa3_params params;
    std::memset(&params, 0, sizeof params);
    params.base = batch_params(c.batch, c.seqlen, c.seqlen, c.heads, c.heads, 128, 128);
    fa3_fill_schedule(causal, plan, 132, 50 * 1024 * 1024, &params);
    EXPECT_EQ(params.heads_per_section, c.heads_per_section)
        << "rule " << c.rule << ", " << c.batch << " x " << c.heads << " pairs of " << c.seqlen << " keys";
  }
  Fa3Tuning bad;
  bad.causal_sections = 4;
  Plan plan;
  std::string why;
  EXPECT_FALSE(plan_fa3_tuned(causal, bad, &plan, &why));
  EXPECT_NE(why.find("causal_sections"), std::string::npos) << why;
}

// The model of the walk adds each (section, m-block)'s cost to runs of lanes; tile by tile, as the
// scheduler walks them (templates/kernels/fa3/scheduler.cuh decode_tile, snake_tile), it must give the
// same loads, for sections that do and do not divide the pairs and waves that end mid-section.
TEST(Fa3Schedule, CausalWalkModelMatchesTheTileByTileWalk) {
  struct Shape {
    int d, batch, heads, seqlen_q, seqlen_k, section, walkers;
  };
  for (const Shape &c : {Shape{128, 4, 16, 4096, 4096, 14, 132}, Shape{192, 3, 11, 2048, 2048, 7, 132},
                         Shape{64, 2, 5, 1000, 1300, 3, 17}, Shape{256, 1, 3, 700, 500, 1, 5},
                         Shape{96, 16, 21, 1024, 1024, 336, 132}}) {
    const KernelSpec spec = fa3_spec(c.d, c.d, true);
    const Plan plan = fa3_plan(spec);
    fj_fa3_params params;
    std::memset(&params, 0, sizeof params);
    params.base = batch_params(c.batch, c.seqlen_q, c.seqlen_k, c.heads, c.heads, c.d, c.d);
    const int walkers = fa3_fill_schedule(spec, plan, c.walkers, 60 * 1024 * 1024, &params);
    params.heads_per_section = c.section;
    const int m_blocks = params.base.num_m_blocks, pairs = c.batch * c.heads;
    const int key_blocks = (c.seqlen_k + plan.block_n - 1) / plan.block_n;
    std::vector<double> load(walkers, 0.0);
    for (int index = 0; index < params.num_tiles; ++index) {
      const int wave = index / walkers, lane = index % walkers;
      const int section = index / (m_blocks * c.section);
      const int rest = index - section * m_blocks * c.section;
      const int pairs_here = std::min(c.section, pairs - section * c.section);
      const int m_block = m_blocks - 1 - rest / pairs_here;
      const int last_col = std::min((m_block + 1) * plan.block_m, c.seqlen_q) - 1 + c.seqlen_k - c.seqlen_q;
      load[wave % 2 == 0 ? lane : walkers - 1 - lane] +=
          (last_col < 0 ? 0 : std::min(key_blocks, last_col / plan.block_n + 1)) + 1.0;
    }
    double total = 0, top = 0;
    for (double l : load) {
      total += l;
      top = std::max(top, l);
    }
    EXPECT_NEAR(fa3_causal_walk_balance(plan, params, walkers), total / walkers / top, 1e-12)
        << "d" << c.d << " " << c.batch << "x" << c.heads << " S" << c.seqlen_q << "/" << c.seqlen_k << ", sections of "
        << c.section << " on " << walkers;
  }
}

// Causal L2 sections of a whole number of waves even the walkers' loads in the model of the walk
// (fa3_causal_walk_balance), where the
// power-of-two sections of run 28e left them at 0.62-0.85 of even (the SMs idled 23-31% in Nsight
// Compute, run 28f; whole waves gained 17-28% at d128/d256 S1024, run 28g). B*S = 16384, heads*d = 2048,
// the short causal tile (two warpgroups, 128-key blocks) at d64/d128 and d256's tile; an L2 of 60 MiB
// holds a whole wave (33 pairs) of d256's 1 MiB pairs.
TEST(Fa3Schedule, CausalSectionsEvenTheWalkersLoads) {
  struct Shape {
    int d, heads, power_of_two_section;
  };
  for (const Shape &c : {Shape{128, 16, 32}, Shape{64, 32, 64}, Shape{256, 8, 16}}) {
    KernelSpec spec = fa3_spec(c.d, c.d, true);
    spec.key_block = fa3_key_block_for(spec, 1024, 1024);
    const Plan plan = fa3_snake_plan(spec);
    fj_fa3_params params;
    std::memset(&params, 0, sizeof params);
    params.base = batch_params(16, 1024, 1024, c.heads, c.heads, c.d, c.d);
    const int walkers = fa3_fill_schedule(spec, plan, 132, 60 * 1024 * 1024, &params);
    ASSERT_EQ(walkers, 132);
    EXPECT_EQ(params.heads_per_section % 33, 0) << "d" << c.d << ": 8 m-blocks, a wave of 132 tiles";
    EXPECT_GT(fa3_causal_walk_balance(plan, params, walkers), 0.9)
        << "d" << c.d << ", sections of " << params.heads_per_section;
    const double whole_waves = fa3_causal_walk_balance(plan, params, walkers);
    params.heads_per_section = c.power_of_two_section;
    EXPECT_LT(fa3_causal_walk_balance(plan, params, walkers), 0.9) << "d" << c.d << ": the model must tell them apart";
    // causal_sections=3 (a tuning): the size the model prefers, no worse in the model than whole waves.
    Fa3Tuning by_model = snake_tuning();
    by_model.causal_sections = 3;
    Plan model_plan;
    std::string why;
    ASSERT_TRUE(plan_fa3_tuned(spec, by_model, &model_plan, &why)) << why;
    fa3_fill_schedule(spec, model_plan, 132, 60 * 1024 * 1024, &params);
    EXPECT_GE(fa3_causal_walk_balance(model_plan, params, walkers), whole_waves) << "d" << c.d;
  }
}

// Where no whole wave of pairs fits in L2 (d192 S4096: 3 MiB pairs, 32 m-blocks; d256 S2048: 2 MiB, 16
// m-blocks), the default walks the L2 section the model prefers (11 pairs for both, >= 0.95 of even),
// where power-of-two L2 sections (kCausalSections 2) would leave the walkers at 0.57-0.64 of it. Long
// sequences walk one section even where the model finds an even one (d64 S8192: 43 m-blocks, 17 pairs
// at 0.968 lost 2.5% to one section, run 29c); a forced size (causal_section_pairs) wins over every rule.
TEST(Fa3Schedule, CausalWalksWithoutAWholeWaveInL2TakeTheModelsSection) {
  struct Shape {
    int d, seqlen, heads, rule, section_pairs;
    bool one_section;
  };
  for (const Shape &c :
       {Shape{192, 4096, 11, 0, 0, false}, Shape{256, 2048, 8, 0, 0, false}, Shape{192, 4096, 11, 2, 0, false},
        Shape{256, 2048, 8, 2, 0, false}, Shape{192, 2048, 11, 0, 0, false}, Shape{64, 8192, 32, 0, 0, true},
        Shape{192, 4096, 11, 0, 7, false}}) {
    const KernelSpec spec = fa3_spec(c.d, c.d, true);
    const int batch = 16384 / c.seqlen;
    const std::string where = "d" + std::to_string(c.d) + " S" + std::to_string(c.seqlen) + " rule " +
                              std::to_string(c.rule) + " forced " + std::to_string(c.section_pairs);
    Fa3Tuning tuning = snake_tuning();
    tuning.causal_sections = c.rule;
    tuning.causal_section_pairs = c.section_pairs;
    Plan plan;
    std::string why;
    ASSERT_TRUE(plan_fa3_tuned(spec, tuning, &plan, &why)) << why;
    fj_fa3_params params;
    std::memset(&params, 0, sizeof params);
    params.base = batch_params(batch, c.seqlen, c.seqlen, c.heads, c.heads, c.d, c.d);
    const int walkers = fa3_fill_schedule(spec, plan, 132, 60 * 1024 * 1024, &params);
    const double balance = fa3_causal_walk_balance(plan, params, walkers);
    const int pairs = batch * c.heads;
    const double pair_bytes = double(c.seqlen) * 2 * c.d * 2;
    if (c.section_pairs > 0) {
      EXPECT_EQ(params.heads_per_section, c.section_pairs) << where;
      EXPECT_NE(kernel_name(spec, plan).find(".sp" + std::to_string(c.section_pairs)), std::string::npos) << where;
    } else if (c.one_section) {
      EXPECT_EQ(params.heads_per_section, pairs) << where;
    } else if (c.rule == 0) {
      EXPECT_LT(params.heads_per_section, pairs) << where;
      EXPECT_LE(params.heads_per_section * pair_bytes, 0.6 * 60 * 1024 * 1024) << where << ": fits in L2";
      EXPECT_GE(balance, 0.95) << where << ", sections of " << params.heads_per_section;
    } else {
      EXPECT_LT(params.heads_per_section, pairs) << where;
      EXPECT_LT(balance, 0.7) << where << ", sections of " << params.heads_per_section;
    }
  }
  // The model's answer does not depend on what this thread asked before (its memo).
  const KernelSpec spec = fa3_spec(192, 192, true);
  const Plan plan = fa3_snake_plan(spec);
  int first = 0;
  for (int round = 0; round < 12; ++round) {
    fj_fa3_params params;
    std::memset(&params, 0, sizeof params);
    const int seqlen = round % 2 == 0 ? 4096 : 2048 + 128 * round;
    params.base = batch_params(16384 / seqlen, seqlen, seqlen, 11, 11, 192, 192);
    fa3_fill_schedule(spec, plan, 132, 60 * 1024 * 1024, &params);
    if (round == 0) {
      first = params.heads_per_section;
    } else if (round % 2 == 0) {
      EXPECT_EQ(params.heads_per_section, first) << "round " << round;
    }
  }
}

// The tail split's walk, as templates/kernels/fa3/scheduler.cuh takes it (tail_share, cut_to_share,
// tail_cut): walker w owns blocks [w * B, (w + 1) * B) of the tail's units laid end to end.
struct TailPieceCheck {
  int walker, unit, n_min, n_max, boundary, side;
};
std::vector<TailPieceCheck> tail_pieces(const fj_fa3_params &params, int walkers) {
  std::vector<TailPieceCheck> pieces;
  const int n = params.tail_blocks_per_unit, blocks = params.tail_units * n;
  for (int w = 0; w < walkers; ++w) {
    const int lo = std::min(w * params.tail_blocks_per_walker, blocks);
    const int hi = std::min(lo + params.tail_blocks_per_walker, blocks);
    for (int u = lo / n; hi > lo && u <= (hi - 1) / n; ++u) {
      const int n_min = std::max(lo, u * n) - u * n, n_max = std::min(hi, u * n + n) - u * n;
      const int boundary = n_min > 0 ? w : n_max < n ? w + 1 : -1;
      pieces.push_back({w, u, n_min, n_max, boundary, n_min > 0 ? 1 : 0});
    }
  }
  return pieces;
}

// Every key block of the tail is walked once; a unit is cut at most once, into the two sides of one
// walker boundary, each boundary inside the workspace's slots; no walker holds more than its share.
void expect_tail_covers(const fj_fa3_params &params, int walkers) {
  SCOPED_TRACE("units " + std::to_string(params.num_tiles) + ", walkers " + std::to_string(walkers));
  ASSERT_GT(params.tail_units, 0);
  ASSERT_GE(params.tail_blocks_per_walker, params.tail_blocks_per_unit) << "shares of at least one unit";
  EXPECT_EQ(params.tail_first_unit + params.tail_units, params.num_tiles);
  EXPECT_EQ(params.tail_first_unit % walkers, 0) << "whole waves before the tail";
  std::vector<std::vector<int>> blocks(params.tail_units, std::vector<int>(params.tail_blocks_per_unit, 0));
  std::map<std::pair<int, int>, int> sides;
  std::vector<int> per_walker(walkers, 0);
  for (const TailPieceCheck &p : tail_pieces(params, walkers)) {
    for (int b = p.n_min; b < p.n_max; ++b)
      ++blocks[p.unit][b];
    per_walker[p.walker] += p.n_max - p.n_min;
    if (p.boundary >= 0) {
      EXPECT_GE(p.boundary, 1);
      EXPECT_LT(p.boundary, walkers) << "slots per walker boundary";
      ++sides[{p.boundary, p.side}];
      EXPECT_TRUE(p.n_min == 0 || p.n_max == params.tail_blocks_per_unit) << "cut on one side only";
    }
  }
  for (const auto &unit : blocks)
    for (int count : unit)
      EXPECT_EQ(count, 1);
  for (const auto &[key, count] : sides) {
    EXPECT_EQ(count, 1) << "boundary " << key.first << " side " << key.second;
    EXPECT_EQ(sides.count({key.first, key.second ^ 1}), 1u) << "a cut has both sides";
  }
  EXPECT_LE(*std::max_element(per_walker.begin(), per_walker.end()), params.tail_blocks_per_walker);
}

TEST(Fa3Schedule, TailSplitCutsTheLastWavesEvenlyByKeys) {
  Fa3Tuning tuning;
  tuning.tail_split = 1;
  for (int d : {64, 128, 256}) {
    const KernelSpec spec = fa3_spec(d, d);
    Plan plan;
    std::string why;
    ASSERT_TRUE(plan_fa3_tuned(spec, tuning, &plan, &why)) << why;
    ASSERT_EQ(plan.constant("kTailSplit"), 1);
    // compare.py's rows (B * S = 16384, heads * d = 2048) and an awkward one.
    for (auto [b, s, h] : {std::tuple{4, 4096, 2048 / d}, std::tuple{16, 1024, 2048 / d}, std::tuple{3, 1000, 7}}) {
      fj_fa3_params params;
      std::memset(&params, 0, sizeof params);
      params.base = batch_params(b, s, s, h, h, d, d);
      const int grid = fa3_fill_schedule(spec, plan, 132, 50 * 1024 * 1024, &params);
      const int walkers = grid / plan.cluster_m;
      if (params.num_tiles % walkers == 0 || params.num_tiles < walkers) {
        EXPECT_EQ(params.tail_units, 0) << "nothing to even out";
        continue;
      }
      // Cut only when the longest walk shrinks by at least 8 blocks and 2% of it.
      const int units_per_walk = params.num_tiles / walkers + 1, unit_blocks = (s + plan.block_n - 1) / plan.block_n;
      const int even_share = ((walkers + params.num_tiles % walkers) * unit_blocks + walkers - 1) / walkers;
      const int saved = 2 * unit_blocks - even_share;
      if (saved < 8 || saved * 50 < units_per_walk * unit_blocks) {
        EXPECT_EQ(params.tail_units, 0) << "d" << d << " S" << s << ": saves " << saved << " blocks";
        continue;
      }
      EXPECT_EQ(params.tail_blocks_per_unit, unit_blocks);
      expect_tail_covers(params, walkers);
      // The longest walker: today a whole extra unit; split, about the average.
      const double average = double(params.num_tiles) * params.tail_blocks_per_unit / walkers;
      const int full_waves = params.num_tiles / walkers;
      const int longest = (full_waves - 1) * params.tail_blocks_per_unit + params.tail_blocks_per_walker;
      EXPECT_LT(longest, average + 1.0) << "d" << d << " S" << s;
      EXPECT_GT((full_waves + 1) * params.tail_blocks_per_unit, longest);
    }
  }
  // d128 S4096 (compare.py's row): 1024 pair units over 66 walkers, 26 blocks each: the longest
  // walker has 14 * 26 + 40 = 404 blocks instead of 16 * 26 = 416.
  const KernelSpec spec = fa3_spec(128, 128);
  Plan plan;
  std::string why;
  ASSERT_TRUE(plan_fa3_tuned(spec, tuning, &plan, &why)) << why;
  fj_fa3_params params;
  std::memset(&params, 0, sizeof params);
  params.base = batch_params(4, 4096, 4096, 16, 16, 128, 128);
  fa3_fill_schedule(spec, plan, 132, 50 * 1024 * 1024, &params);
  EXPECT_EQ(params.tail_first_unit, 14 * 66);
  EXPECT_EQ(params.tail_units, 66 + 34);
  EXPECT_EQ(params.tail_blocks_per_walker, 40);
  // d128 S1024 (16 x 1024, 8 blocks per unit): the split would save 3 of 128 blocks (measured 4.4%
  // slower in session 10): whole tiles.
  params.base = batch_params(16, 1024, 1024, 16, 16, 128, 128);
  fa3_fill_schedule(spec, plan, 132, 50 * 1024 * 1024, &params);
  EXPECT_EQ(params.tail_units, 0);
  // The workspace: a counter and two slots per walker and CTA of a pair.
  const Fa3WorkspaceLayout layout = fa3_workspace_layout(plan, 66);
  EXPECT_EQ(layout.counter_bytes, 66u * 2 * 4);
  EXPECT_EQ(layout.partials_offset % 256, 0u);
  EXPECT_EQ(layout.total_bytes, layout.partials_offset + 66u * 2 * 2 * plan.constant("kTailSlotFloats") * 4);
  EXPECT_EQ(fa3_workspace_layout(fa3_plan(fa3_spec(256, 256)), 66).total_bytes, 0u) << "no split, no workspace";
}

// Dynamic tiles (the default for causal walks): one counter at the workspace's start, causal walks in
// L2 sections of 16 pairs, 32 up to d64 and above d192 in walks of up to 8 m-blocks (drawing evens the
// load, so the sections follow L2 alone).
TEST(Fa3Schedule, DrawnTilesTakeACounterAndSectionsOfSixteenPairs) {
  Plan drawn, snake;
  std::string why;
  const KernelSpec causal = fa3_spec(192, 192, true);
  ASSERT_TRUE(plan_fa3(causal, &drawn, &why)) << why;
  ASSERT_TRUE(plan_fa3_tuned(causal, snake_tuning(), &snake, &why)) << why;
  ASSERT_EQ(drawn.constant("kDynamicTiles"), 1);
  EXPECT_EQ(drawn.constant("kDrawnSectionPairs"), 16);
  EXPECT_EQ(snake.constant("kDrawnSectionPairs", 0), 0);
  const Fa3WorkspaceLayout layout = fa3_workspace_layout(drawn, 132);
  EXPECT_EQ(layout.counter_bytes, sizeof(fj_i32));
  EXPECT_EQ(layout.total_bytes, sizeof(fj_i32));
  EXPECT_EQ(fa3_workspace_layout(snake, 132).total_bytes, 0u) << "the snake needs no workspace";
  fj_fa3_params params;
  std::memset(&params, 0, sizeof params);
  params.base = batch_params(16, 1024, 1024, 11, 11, 192, 192); // compare.py's d192 S1024 row
  EXPECT_EQ(fa3_fill_schedule(causal, drawn, 132, 50 * 1024 * 1024, &params), 132);
  EXPECT_EQ(params.heads_per_section, 16);
  EXPECT_EQ(params.num_tiles, 16 * 11 * 8);
  fa3_fill_schedule(causal, snake, 132, 50 * 1024 * 1024, &params);
  const int snake_section = params.heads_per_section;
  EXPECT_NE(snake_section, 16) << "the snake's sections are sized for its balance";
  fa3_fill_schedule(causal, drawn, 132, 50 * 1024 * 1024, &params, 0, false);
  EXPECT_EQ(params.heads_per_section, snake_section) << "without its counter a drawn walk is the snake's";
  const KernelSpec small = fa3_spec(64, 64, true);
  ASSERT_TRUE(plan_fa3(small, &drawn, &why)) << why;
  params.base = batch_params(16, 1024, 1024, 32, 32, 64, 64); // compare.py's d64 S1024 row
  fa3_fill_schedule(small, drawn, 132, 50 * 1024 * 1024, &params);
  EXPECT_EQ(params.heads_per_section, 32);
  const KernelSpec large = fa3_spec(256, 256, true);
  ASSERT_TRUE(plan_fa3(large, &drawn, &why)) << why;
  params.base = batch_params(16, 1024, 1024, 8, 8, 256, 256); // compare.py's d256 S1024 row
  fa3_fill_schedule(large, drawn, 132, 50 * 1024 * 1024, &params);
  EXPECT_EQ(params.heads_per_section, 32);
  params.base = batch_params(4, 4096, 4096, 8, 8, 256, 256); // 32 m-blocks a pair: a long walk
  fa3_fill_schedule(large, drawn, 132, 50 * 1024 * 1024, &params);
  EXPECT_EQ(params.heads_per_section, 16);
  Fa3Tuning forced;
  forced.causal_section_pairs = 8; // an A/B's forced size wins
  ASSERT_TRUE(plan_fa3_tuned(causal, forced, &drawn, &why)) << why;
  ASSERT_EQ(drawn.constant("kDynamicTiles"), 1);
  params.base = batch_params(16, 1024, 1024, 11, 11, 192, 192);
  fa3_fill_schedule(causal, drawn, 132, 50 * 1024 * 1024, &params);
  EXPECT_EQ(params.heads_per_section, 8);
}

// The shapes of the GPU test PrefillTailSplitGpu (tests/gpu/test_prefill_gpu.cpp) do cut tiles:
// with the rule above a shape with few key blocks would walk whole tiles and test nothing.
TEST(Fa3Schedule, TheTailSplitGpuTestShapesCutTiles) {
  struct Shape {
    int batch, seqlen_q, seqlen_k, heads_q, heads_kv, d;
  };
  Fa3Tuning tuning;
  tuning.tail_split = 1;
  for (const Shape &c :
       {Shape{2, 400, 2048, 27, 27, 64}, Shape{2, 900, 2000, 16, 16, 80}, Shape{1, 1000, 2600, 40, 8, 128},
        Shape{2, 600, 2000, 25, 25, 192}, Shape{1, 700, 1600, 24, 24, 256}, Shape{1, 1000, 2600, 40, 8, 104},
        Shape{2, 900, 2000, 16, 16, 72}}) {
    KernelSpec spec = fa3_spec(c.d, c.d);
    spec.key_block = fa3_key_block_for(spec, c.seqlen_q, c.seqlen_k);
    Plan plan;
    std::string why;
    ASSERT_TRUE(plan_fa3_tuned(spec, tuning, &plan, &why)) << why;
    fj_fa3_params params;
    std::memset(&params, 0, sizeof params);
    params.base = batch_params(c.batch, c.seqlen_q, c.seqlen_k, c.heads_q, c.heads_kv, c.d, c.d);
    const int walkers = fa3_fill_schedule(spec, plan, 132, 50 * 1024 * 1024, &params) / plan.cluster_m;
    ASSERT_GT(params.tail_units, 0) << "d" << c.d;
    expect_tail_covers(params, walkers);
    EXPECT_NE(params.tail_blocks_per_walker % params.tail_blocks_per_unit, 0)
        << "d" << c.d << ": shares of whole units cut nothing";
  }
}

TEST(Fa3Plan, EveryHeadDimFitsAndIsAligned) {
  for (int dqk = 8; dqk <= 256; dqk += 8)
    for (int dv : {dqk, 128, 64})
      for (bool causal : {false, true}) {
        const KernelSpec spec = fa3_spec(dqk, dv, causal);
        Plan plan;
        std::string why;
        ASSERT_TRUE(plan_fa3(spec, &plan, &why)) << dqk << "/" << dv << ": " << why;
        EXPECT_EQ(plan.variant, Variant::fa3);
        EXPECT_EQ(plan.entry, "fj_fa3_prefill");
        EXPECT_LE(plan.smem_bytes, max_shared_bytes_per_block(spec.arch));
        EXPECT_EQ(plan.block_n % 16, 0);
        EXPECT_LE(plan.block_n, 256);
        EXPECT_EQ(plan.constant("kKStepsQK"), (dqk + 15) / 16);
        EXPECT_EQ(plan.constant("kKStepsPV"), plan.block_n / 16);
        for (const char *offset :
             {"kSmemOffsetQ", "kSmemOffsetK", "kSmemOffsetV", "kSmemStageBytesK", "kSmemStageBytesV"})
          EXPECT_EQ(plan.constant(offset) % kSwizzleAtom, 0) << offset;
        EXPECT_EQ(plan.threads, 128 * (1 + plan.consumer_warpgroups));
        EXPECT_EQ(plan.constant("kRegsProducer") + plan.consumer_warpgroups * plan.constant("kRegsConsumer") <= 512,
                  true);
      }
  Plan plan;
  std::string why;
  KernelSpec bad = fa3_spec(128, 128);
  bad.arch = Arch{80, false};
  EXPECT_FALSE(plan_fa3(bad, &plan, &why));
  bad = fa3_spec(128, 128);
  bad.align_bytes = 2;
  EXPECT_FALSE(plan_fa3(bad, &plan, &why));
}

} // namespace
} // namespace flashjit
